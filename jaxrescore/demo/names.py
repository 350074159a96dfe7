"""The names demo, end to end: the PROVEN top-k US first names under the shipped character
transformer (target), found through a character n-gram (draft), beside what an exact best-first
search over the target costs and the spec's gap-certified query.

The gap certificate needs an assumed gap ``G``; it only has to hold where an answer can come from:
if every sequence with target log-prob ``>= tau`` has ``target - draft <= G``, and the worst
returned score ``w`` satisfies ``w >= tau`` and ``w >= bound + G``, no unpulled sequence can beat
``w``. The default ``G`` is the one-sided gap observed on measured sequences above ``tau``
(``estimate_top_gap``) plus a margin, and the demo reports whether ``w >= tau``. It is an
estimate from a finite sample: the output always says so.
"""

from __future__ import annotations

import os
import re
import time
from typing import Callable

from jaxrescore.constraints import ConstrainedModel, Regex, constrain_draft
from jaxrescore.data.names import decode, encode, load_names, name_ranks
from jaxrescore.data.names_models import names_draft, names_target
from jaxrescore.demo.args import check_flag, check_prefix, check_query, load_model_file
from jaxrescore.demo.defaults import DEFAULT_K, GAP_MARGIN, GAP_REGION_MARGIN, GAP_SAMPLES, GAP_TOP_NAMES
from jaxrescore.demo.report import gap_source
from jaxrescore.demo.runs import best_first_cost, certified_top_k, draft_index, finite_or_none, proven_top_k, same_answer
from jaxrescore.rescore import estimate_top_gap


def run_demo(
    *,
    k: int = DEFAULT_K,
    window: int | None = None,
    gap: float | None = None,
    prefix: str = "",
    regex: str | None = None,
    target_path: str | os.PathLike | None = None,
    progress: bool = True,
    measure_exact: bool = True,
    certify: bool = True,
    on_stage: Callable[[str], None] | None = None,
    on_answer: Callable[[dict], None] | None = None,
) -> dict:
    """The names demo, end to end: the PROVEN ``k`` likeliest names under the target, found through
    the n-gram draft's SeekIndex, next to what an exact best-first search over the target costs and
    to the spec's gap-certified query.

    Args:
      k: names to return.
      window: rerank window of both runs; None: ``PROVE_WINDOW`` for the proof, and a
        certificate-driven window for the gap run (see ``runs.certified_top_k``).
      gap: assumed max ``target - draft`` in nats for the gap run; None = estimated with
        ``estimate_top_gap`` plus ``GAP_MARGIN``.
      prefix: only names starting with it (both models are prompted with it; log-probs are then
        conditional on the prefix).
      regex: only names whose letters (after ``prefix``) fully match this regular expression: a
        :class:`~jaxrescore.constraints.Regex` constraint on both models, so the answer is
        PROVEN the target's top-k among the names that match (and best-first prunes by it
        too); the gap-certified query is then not run (its gap estimate samples the
        unconstrained models).
      target_path: target weights (default: the shipped ones).
      progress: show the draft index's progress bar.
      measure_exact: also run the exact best-first search over the target.
      certify: also run the gap-certified query.
      on_stage: called with a short description as each stage starts (the CLI shows it on a
        terminal, so a long run is never silent).
      on_answer: called with the answer part of the result (``items``, ``true_top_k_overlap``,
        the proof keys, ``k``, ``prefix``) as soon as it is proven, before the comparisons run
        (the CLI prints the table then).

    Returns:
      A JSON-ready dict: ``items`` (``text``, ``target_log_prob``, ``draft_log_prob``,
      ``birth_rank``: rank by birth count from 1 (the commonest), None for a string that is not a shipped name),
      ``true_top_k_overlap`` (how many items are among the ``k`` commonest names with the prefix),
      the proof (``proven``, ``frontier_bound``, ``proof_reason``, ``rounds``, ``window``,
      ``target_calls``, ``target_sequences``), ``exact_best_first`` (``forwards``, ``calls``,
      ``same_answer``) or None, ``gap_certified`` (``certified``, ``bound``, ``gap``, ``excess``,
      ``reason``, ``assumed_gap``, ``gap_source``, ``gap_region_lp``,
      ``gap_calibration_sequences``, ``gap_covers_answers``, ``window``, ``rounds``,
      ``target_calls``, ``target_sequences``, ``same_answer``) or None, ``draft_forwards``,
      ``seconds`` and the arguments.
    """
    k, window, gap = check_query(k, window, gap)
    prompt = check_prefix(prefix)
    progress, measure_exact = check_flag(progress, "progress"), check_flag(measure_exact, "measure_exact")
    certify = check_flag(certify, "certify") and regex is None
    constraint = None if regex is None else _regex(regex)
    stage = on_stage or (lambda text: None)
    start = time.perf_counter()
    stage("loading the target and fitting the draft")
    target = names_target() if target_path is None else load_model_file(target_path)
    draft = names_draft()
    if prompt:
        target, draft = target.with_prompt(prompt), draft.with_prompt(prompt)
    if constraint is not None:
        target = ConstrainedModel(target, constraint)
        draft = constrain_draft(draft, target)
    stage(f"building the draft index and proving the top {k}")
    index = draft_index(draft, progress)
    proof = proven_top_k(index, target, k, window)
    result = proof.pop("result")
    answer = [s for s, _ in result.items]
    ranks = name_ranks()
    texts = [prefix + decode(seq) for seq in answer]
    true_top = [n for n, _ in load_names() if n.startswith(prefix)
                and (regex is None or re.fullmatch(regex, n[len(prefix):]) is not None)][:k]
    out = {
        "items": [
            {"text": text, "target_log_prob": lp, "draft_log_prob": finite_or_none(dlp), "birth_rank": ranks.get(text)}
            for text, (_, lp), dlp in zip(texts, result.items, result.draft_log_probs)
        ],
        "true_top_k_overlap": len(set(true_top).intersection(texts)),
        **proof,
        "k": k,
        "prefix": prefix,
        "regex": regex,
    }
    if on_answer is not None:
        on_answer(dict(out))
    exact = None
    if measure_exact:
        stage("exact best-first search over the target, for comparison")
        exact = best_first_cost(target, k)
        exact["same_answer"] = same_answer(exact.pop("items"), answer)
    certified = None
    if certify:
        stage("running the gap-certified query" if gap is not None else "estimating the gap and running the gap-certified query")
        certified = _gap_run(index, draft, target, k, window, gap, prefix, answer)
    out.update(
        exact_best_first=exact,
        gap_certified=certified,
        draft_forwards=int(index.forwards),
        seconds=time.perf_counter() - start,
    )
    return out


def _regex(pattern) -> Regex:
    """``pattern`` as a Regex constraint; ValueError naming ``regex`` otherwise."""
    try:
        return Regex(pattern)
    except (TypeError, ValueError) as err:
        raise ValueError(f"regex: {err}") from None


def _gap_run(index, draft, target, k, window, gap, prefix, answer) -> dict:
    """The gap-certified query of :func:`run_demo`, with where its gap came from."""
    if gap is None:
        common = [encode(n[len(prefix):]) for n, _ in load_names() if n.startswith(prefix)]
        estimate = estimate_top_gap(draft, target, k, common[:GAP_TOP_NAMES], n_samples=GAP_SAMPLES, region_margin=GAP_REGION_MARGIN)
        gap, source = estimate.excess + GAP_MARGIN, gap_source(estimate)
        region, calibration = estimate.region_lp, estimate.n_distinct
    else:
        source, region, calibration = "given with --gap", None, 0
    out = certified_top_k(index, target, k, window, gap)
    result = out.pop("result")
    out.update(
        gap_source=source,
        gap_region_lp=region,
        gap_calibration_sequences=calibration,
        gap_covers_answers=None if region is None or not result.items else result.items[-1][1] >= region,
        same_answer=same_answer([s for s, _ in result.items], answer),
    )
    return out
