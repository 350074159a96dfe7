"""The names demo: a shipped character transformer (target), an n-gram fitted at start-up (draft).

Everything the ``jaxrescore demo`` / ``enumerate`` / ``train`` commands do lives here as plain
functions returning plain data; :mod:`jaxrescore.cli` only parses arguments and prints. The
searches themselves live in the library (``RescoredIndex.top_k(k, prove=True)``,
``until_certified=True``, :func:`~jaxrescore.index.best_first.best_first_top_k`).

The demo leads with the PROVEN top-k: the target's exact answer, with no assumption, found by the
speculative exact search. Next to it, what the same answer costs an exact best-first search over
the target (no draft), and the spec's gap-certified query. That certificate needs an assumed gap
``G``; it only has to hold where an answer can come from: if every sequence with target log-prob
``>= tau`` has ``target - draft <= G``, and the worst returned score ``w`` satisfies ``w >= tau``
and ``w >= bound + G``, no unpulled sequence can beat ``w``. The default ``G`` is the one-sided gap
observed on measured sequences above ``tau`` (:func:`~jaxrescore.models.gap.estimate_top_gap`)
plus a margin, and the demo reports whether ``w >= tau``. It is an estimate from a finite sample:
the output always says so.
"""

from __future__ import annotations

import os
import textwrap
from importlib import resources
from pathlib import Path

import numpy as np

from jaxrescore.data.names import EOS, MAX_NAME_LEN, VOCAB_SIZE, encode, load_names

MAX_LEN = MAX_NAME_LEN + 1
"""Longest sequence of the demo models, EOS included."""
TARGET_FILE = "names_target.npz"
TRAIN_SEED = 0
TRAIN_STEPS = 7000
TRAIN_BATCH = 256
# Learning-rate phases (fraction of the steps, lr): a short constant-lr run per phase is a cheap
# step-decay schedule that train_lm's constant adamw supports as is.
TRAIN_PHASES = ((4 / 7, 3e-3), (2 / 7, 1e-3), (1 / 7, 3e-4))


def target_config():
    """The demo target's shape: 2 layers, d_model 64, 4 heads, 105k parameters."""
    from jaxrescore.models.transformer import TransformerConfig

    return TransformerConfig(
        vocab_size=VOCAB_SIZE, d_model=64, n_layers=2, n_heads=4, max_len=MAX_LEN, eos=EOS
    )


def name_corpus() -> tuple[list[tuple[int, ...]], np.ndarray]:
    """The shipped names as EOS-terminated token tuples and their birth counts ``float64[N]``."""
    names = load_names()
    return [encode(n) for n, _ in names], np.array([c for _, c in names], np.float64)


def shipped_target_path() -> Path:
    """Path of the shipped target weights inside the installed package."""
    return Path(str(resources.files("jaxrescore.data").joinpath(TARGET_FILE)))


def train_demo_target(
    out: str | os.PathLike | None = None,
    *,
    steps: int = TRAIN_STEPS,
    seed: int = TRAIN_SEED,
    progress: bool = True,
) -> Path:
    """Train the demo target from scratch and save it (``save_model`` format); returns the path.

    Batches sample names in proportion to birth count, so the model learns the distribution of
    first names of people born in the US 1880-2017. Deterministic for a given ``seed`` and
    ``steps`` on one platform.

    Args:
      out: where to write (default: the shipped weights file, overwritten atomically).
      steps: optimisation steps in all (batch 256, adamw, step-decayed learning rate).
      seed: initialisation and batch-sampling seed.
    """
    from jaxrescore.models.checkpoint import save_model
    from jaxrescore.models.training import train_lm
    from jaxrescore.models.transformer import TransformerLM

    if isinstance(steps, bool) or not isinstance(steps, int) or steps < len(TRAIN_PHASES):
        raise ValueError(f"steps must be an integer >= {len(TRAIN_PHASES)}, got {steps!r}")
    seqs, counts = name_corpus()
    model = TransformerLM(target_config(), seed=seed)
    done = 0
    for phase, (share, lr) in enumerate(TRAIN_PHASES):
        n = steps - done if phase == len(TRAIN_PHASES) - 1 else max(1, int(share * steps))
        train_lm(
            model, seqs, weights=counts, steps=n, batch_size=TRAIN_BATCH, lr=lr,
            seed=seed + phase, progress=progress,
        )
        done += n
    path = Path(out) if out is not None else shipped_target_path()
    save_model(model, path)
    return path


# ---- models ------------------------------------------------------------------------------------

DRAFT_ORDER = 6
PROVE_WINDOW = 32
"""Draft candidates beyond k in the proving run's first round (measured on the names models:
fewer rounds than 0, fewer sequences than 64)."""
FIRST_WINDOW = 64
GAP_REGION_MARGIN = 1.0
GAP_TOP_NAMES = 4096
GAP_SAMPLES = 1024
GAP_MARGIN = 1.0


def fit_draft(order: int = DRAFT_ORDER):
    """The draft: an interpolated Kneser-Ney character n-gram fitted on the shipped names, each
    weighted by its birth count (normalised to mean 1, so the discount acts on a per-name scale).
    Fitting takes well under a second."""
    from jaxrescore.models.ngram import NGramLM

    seqs, counts = name_corpus()
    return NGramLM.fit(
        seqs, order=order, vocab_size=VOCAB_SIZE, eos=EOS, max_len=MAX_LEN,
        weights=counts * (len(counts) / counts.sum()),
    )


def load_target(path: str | os.PathLike | None = None):
    """The demo target (shipped weights by default), or any model saved with ``save_model``."""
    from jaxrescore.models.checkpoint import load_model

    path = shipped_target_path() if path is None else Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no model file at {str(path)!r}")
    try:
        return load_model(path)
    except ValueError as e:
        raise DemoArgumentError(str(e)) from None


class DemoArgumentError(ValueError):
    """A bad argument to a demo entry point (the CLI reports it in one line, exit status 2)."""


def check_prefix(prefix: str) -> tuple[int, ...]:
    """The prompt tokens of ``prefix`` (lowercase a-z, at most ``MAX_NAME_LEN - 1`` letters)."""
    if not isinstance(prefix, str):
        raise DemoArgumentError(f"prefix must be a str, got {type(prefix).__name__}")
    if prefix != prefix.strip() or not all("a" <= c <= "z" for c in prefix):
        raise DemoArgumentError(f"prefix must be lowercase letters a-z, got {prefix!r}")
    if len(prefix) >= MAX_NAME_LEN:
        raise DemoArgumentError(
            f"prefix must have at most {MAX_NAME_LEN - 1} letters (names have at most "
            f"{MAX_NAME_LEN}), got {len(prefix)}"
        )
    return encode(prefix, eos=False)


def gap_source(estimate, margin: float = GAP_MARGIN) -> str:
    """A sentence saying where an estimated ``assumed_gap`` came from."""
    return (
        f"assumed for sequences with target log-prob >= {estimate.region_lp:.3f} (the only ones "
        f"that could displace an answer): max target - draft = {estimate.excess:.3f} nats over "
        f"{estimate.n_region} such sequences (of {estimate.n_distinct} scored: the "
        f"{estimate.n_candidates} commonest names and {estimate.n_samples} target samples) "
        f"plus {margin:g} nat; an assumption, not a proof"
    )


# ---- queries -----------------------------------------------------------------------------------


def _draft_index(draft, progress: bool):
    """The draft's SeekIndex; its first build shows a progress bar when ``progress``, later
    deepenings only when they run long (so short passes do not print empty bars)."""
    from jaxrescore.index.seek import SeekIndex

    index = SeekIndex(draft, progress=progress or False)
    index.progress = None if progress else False
    return index


def _check_window(window) -> int | None:
    if window is None:
        return None
    if isinstance(window, bool) or not isinstance(window, int) or window < 0:
        raise DemoArgumentError(f"window must be None or an integer >= 0, got {window!r}")
    return window


def _check_k(k) -> int:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise DemoArgumentError(f"k must be a positive integer, got {k!r}")
    return k


def _check_gap(gap) -> float | None:
    if gap is None:
        return None
    if isinstance(gap, bool) or not isinstance(gap, (int, float)) or not 0 <= gap < float("inf"):
        raise DemoArgumentError(f"gap must be a finite number >= 0 (nats), got {gap!r}")
    return float(gap)


def proven_top_k(index, target, k: int, window: int | None) -> dict:
    """The proven top-``k``: ``RescoredIndex(index, target).top_k(k, prove=True)`` and its cost."""
    from jaxrescore.rescore.index import RescoredIndex

    rescored = RescoredIndex(index, target, rerank_window=PROVE_WINDOW if window is None else window)
    result = rescored.top_k(k, prove=True)
    return {
        "result": result,
        "proven": result.proven,
        "frontier_bound": _finite_or_none(result.frontier_bound),
        "proof_reason": result.proof_reason,
        "rounds": result.rounds,
        "window": rescored.rerank_window,
        "target_calls": rescored.target_calls,
        "target_sequences": rescored.target_sequences,
    }


def certified_top_k(index, target, k: int, window: int | None, gap: float) -> dict:
    """The spec's gap-certified top-``k``: with ``window=None`` a :data:`FIRST_WINDOW` query grown
    until certified (``until_certified``), else one query with that window."""
    from jaxrescore.rescore.index import RescoredIndex

    rescored = RescoredIndex(index, target, rerank_window=FIRST_WINDOW if window is None else window, assumed_gap=gap)
    result = rescored.top_k(k, until_certified=window is None)
    return {
        "result": result,
        "certified": result.certified,
        "bound": result.bound,
        "gap": result.gap,
        "excess": _finite_or_none(result.excess),
        "reason": result.reason,
        "assumed_gap": gap,
        "window": rescored.rerank_window,
        "rounds": result.rounds,
        "target_calls": rescored.target_calls,
        "target_sequences": rescored.target_sequences,
    }


def best_first_cost(target, k: int) -> dict:
    """What the exact answer costs without a draft: batched best-first search over the target."""
    from jaxrescore.index.best_first import best_first_top_k

    found = best_first_top_k(target, k)
    return {"forwards": found.forwards, "calls": found.calls, "items": [s for s, _ in found.items]}


def _finite_or_none(value):
    return value if value is not None and np.isfinite(value) else None


def _same_answer(a: list, b: list) -> bool:
    return [tuple(x) for x in a] == [tuple(x) for x in b]


def run_demo(
    *,
    k: int = 25,
    window: int | None = None,
    gap: float | None = None,
    prefix: str = "",
    target_path: str | os.PathLike | None = None,
    progress: bool = True,
    measure_exact: bool = True,
    certify: bool = True,
) -> dict:
    """The names demo, end to end: the PROVEN ``k`` likeliest names under the target, found through
    the n-gram draft's SeekIndex, next to what an exact best-first search over the target costs and
    to the spec's gap-certified query.

    Args:
      k: names to return.
      window: rerank window of both runs; None: :data:`PROVE_WINDOW` for the proof, and a
        certificate-driven window for the gap run (see :func:`certified_top_k`).
      gap: assumed max ``target - draft`` in nats for the gap run; None = estimated with
        :func:`~jaxrescore.models.gap.estimate_top_gap` plus :data:`GAP_MARGIN`.
      prefix: only names starting with it (both models are prompted with it; log-probs are then
        conditional on the prefix).
      target_path: target weights (default: the shipped ones).
      progress: show the draft index's progress bar.
      measure_exact: also run the exact best-first search over the target.
      certify: also run the gap-certified query.

    Returns:
      A JSON-ready dict: ``items`` (``text``, ``target_log_prob``, ``draft_log_prob``,
      ``birth_rank``: rank by birth count, None for a string that is not a shipped name),
      ``true_top_k_overlap`` (how many items are among the ``k`` commonest names with the prefix),
      the proof (``proven``, ``frontier_bound``, ``proof_reason``, ``rounds``, ``window``,
      ``target_calls``, ``target_sequences``), ``exact_best_first`` (``forwards``, ``calls``,
      ``same_answer``) or None, ``gap_certified`` (``certified``, ``bound``, ``gap``, ``excess``,
      ``reason``, ``assumed_gap``, ``gap_source``, ``gap_region_lp``,
      ``gap_calibration_sequences``, ``gap_covers_answers``, ``window``, ``rounds``,
      ``target_calls``, ``target_sequences``, ``same_answer``) or None, ``draft_forwards``,
      ``seconds`` and the arguments.
    """
    import time

    from jaxrescore.data.names import decode, name_ranks

    k, window, gap = _check_k(k), _check_window(window), _check_gap(gap)
    prompt = check_prefix(prefix)
    start = time.perf_counter()
    target, draft = load_target(target_path), fit_draft()
    if prompt:
        target, draft = target.with_prompt(prompt), draft.with_prompt(prompt)
    index = _draft_index(draft, progress)
    proof = proven_top_k(index, target, k, window)
    result = proof.pop("result")
    answer = [s for s, _ in result.items]
    exact = best_first_cost(target, k) if measure_exact else None
    if exact is not None:
        exact["same_answer"] = _same_answer(exact.pop("items"), answer)
    certified = _gap_run(index, draft, target, k, window, gap, prefix, answer) if certify else None
    ranks = name_ranks()
    texts = [prefix + decode(seq) for seq in answer]
    true_top = [n for n, _ in load_names() if n.startswith(prefix)][:k]
    return {
        "items": [
            {"text": text, "target_log_prob": lp, "draft_log_prob": _finite_or_none(dlp), "birth_rank": ranks.get(text)}
            for text, (_, lp), dlp in zip(texts, result.items, result.draft_log_probs)
        ],
        "true_top_k_overlap": len(set(true_top).intersection(texts)),
        **proof,
        "exact_best_first": exact,
        "gap_certified": certified,
        "draft_forwards": int(index.forwards),
        "k": k,
        "prefix": prefix,
        "seconds": time.perf_counter() - start,
    }


def _gap_run(index, draft, target, k, window, gap, prefix, answer) -> dict:
    """The gap-certified query of :func:`run_demo`, with where its gap came from."""
    from jaxrescore.models.gap import estimate_top_gap

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
        same_answer=_same_answer([s for s, _ in result.items], answer),
    )
    return out


# ---- printing ----------------------------------------------------------------------------------


def _nats(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def _proof_lines(out: dict) -> list[str]:
    return [
        f"proven exact (no assumption): {out['proven']} — {out['proof_reason']}",
        f"target cost: {out['rounds']} scoring round(s), {out['target_calls']} batched call(s), "
        f"{out['target_sequences']} sequences scored by teacher forcing (window {out['window']})",
    ]


def _exact_lines(out: dict) -> list[str]:
    exact = out.get("exact_best_first")
    if not exact:
        return []
    same = "the same answer" if exact["same_answer"] else "A DIFFERENT answer"
    return [
        f"exact best-first search over the target: {exact['forwards']} prefix forwards in "
        f"{exact['calls']} batched calls ({same})"
    ]


def _certificate_lines(cert: dict | None) -> list[str]:
    if cert is None:
        return []
    lines = [
        f"gap-certified query (the spec's certificate): certified {cert['certified']} — {cert['reason']}",
        f"  assumed gap {cert['assumed_gap']:.3f} nats: {cert['gap_source']}",
        f"  observed over the rescored sequences: max |target - draft| {cert['gap']:.3f} nats, "
        f"max target - draft {_nats(cert['excess'])} nats",
        f"  cost: {cert['rounds']} round(s), {cert['target_calls']} call(s), "
        f"{cert['target_sequences']} sequences (window {cert['window']})"
        + ("" if cert["same_answer"] else "; its answer DIFFERS from the proven one"),
    ]
    if cert.get("gap_calibration_sequences"):
        lines.append(
            f"  gap calibration (one-off per model pair, not counted above): "
            f"{cert['gap_calibration_sequences']} sequences scored"
        )
    if cert.get("gap_covers_answers") is False:
        lines.append(
            "  WARNING: the answers fall below the region the gap was estimated on, so the "
            "certificate's assumption does not cover them"
        )
    return lines


def format_demo(out: dict) -> str:
    """The demo result as a text table plus proof, cost and certificate lines."""
    cond = f" starting with {out['prefix']!r}" if out["prefix"] else ""
    lines = _wrapped([
        f"top {out['k']} US first names{cond} under a character transformer (target), found through "
        f"a character {DRAFT_ORDER}-gram (draft)",
    ]) + [
        "log-probs in nats" + (", given the prefix" if out["prefix"] else ""),
        f"{'rank':>4}  {'name':<16}{'target lp':>10}{'draft lp':>10}  {'birth rank':>10}",
    ]
    for i, item in enumerate(out["items"], 1):
        rank = item["birth_rank"]
        lines.append(
            f"{i:>4}  {item['text']:<16}{item['target_log_prob']:>10.3f}"
            f"{_nats(item['draft_log_prob']):>10}  {rank if rank is not None else '-':>10}"
        )
    lines.append(
        f"{out['true_top_k_overlap']} of these are among the {out['k']} commonest names{cond} "
        "by birth count (SSA, 1880-2017)"
    )
    notes = _proof_lines(out) + _exact_lines(out) + _certificate_lines(out.get("gap_certified"))
    notes.append(
        f"draft index: {out['draft_forwards']} n-gram prefix forwards; "
        f"whole run (models, searches, gap estimate): {out['seconds']:.1f} s"
    )
    return "\n".join(lines + _wrapped(notes))


WIDTH = 100
"""Columns of the printed output."""


def _wrapped(lines: list[str]) -> list[str]:
    """Long lines folded to :data:`WIDTH` columns, continuation lines indented."""
    out = []
    for line in lines:
        indent = " " * (len(line) - len(line.lstrip()) + 4)
        out += textwrap.wrap(line, WIDTH, subsequent_indent=indent, break_on_hyphens=False) or [""]
    return out


# ---- your own models ---------------------------------------------------------------------------


def run_enumerate(
    *,
    target_path,
    draft_path,
    k: int = 25,
    window: int | None = None,
    gap: float | None = None,
    prompt: tuple[int, ...] = (),
    bits: float | None = None,
    progress: bool = True,
) -> dict:
    """The proven top-``k`` of a user's own saved target, found through their saved draft
    (``save_model`` files), plus the gap-certified query when ``gap`` is given.

    Args:
      target_path, draft_path: model files; both models must share ``vocab_size`` and ``eos``.
      k, window: as in :func:`run_demo`.
      gap: assumed max ``target - draft``; None = no gap-certified query (the proof needs none).
      prompt: token ids to condition both models on.
      bits: optional depth budget of the draft index to build up front.

    Returns:
      A JSON-ready dict: ``items`` (``tokens``, ``text``, ``target_log_prob``,
      ``draft_log_prob``), the proof keys of :func:`run_demo`, ``gap_certified`` (or None),
      ``draft_forwards``, ``seconds`` and the arguments.
    """
    import time

    k, window, gap = _check_k(k), _check_window(window), _check_gap(gap)
    start = time.perf_counter()
    if bits is not None and not 0 <= bits < float("inf"):
        raise DemoArgumentError(f"bits must be a finite number >= 0, got {bits!r}")
    target, draft = load_target(target_path), load_target(draft_path)
    if (target.vocab_size, target.eos) != (draft.vocab_size, draft.eos):
        raise DemoArgumentError(
            f"target (vocab_size={target.vocab_size}, eos={target.eos}) and draft "
            f"(vocab_size={draft.vocab_size}, eos={draft.eos}) must share vocab_size and eos"
        )
    if prompt:
        try:
            target, draft = target.with_prompt(prompt), draft.with_prompt(prompt)
        except ValueError as err:
            raise DemoArgumentError(f"prompt: {err}") from None
    index = _draft_index(draft, progress)
    if bits is not None:
        index.ensure_bits(bits)
    proof = proven_top_k(index, target, k, window)
    result = proof.pop("result")
    certified = None
    if gap is not None:
        certified = certified_top_k(index, target, k, window, gap)
        other = certified.pop("result")
        certified.update(
            gap_source="given with --gap",
            same_answer=_same_answer([s for s, _ in other.items], [s for s, _ in result.items]),
        )
    return {
        "items": [
            {"tokens": list(seq), "text": " ".join(map(str, seq)), "target_log_prob": lp,
             "draft_log_prob": _finite_or_none(dlp)}
            for (seq, lp), dlp in zip(result.items, result.draft_log_probs)
        ],
        **proof,
        "gap_certified": certified,
        "draft_forwards": int(index.forwards),
        "k": k,
        "prompt": list(prompt),
        "seconds": time.perf_counter() - start,
    }


def format_enumerate(out: dict) -> str:
    """The enumerate result as a text table plus proof, cost and certificate lines."""
    lines = ["log-probs in nats", f"{'rank':>4}  {'tokens':<40}{'target lp':>10}{'draft lp':>10}"]
    for i, item in enumerate(out["items"], 1):
        lines.append(
            f"{i:>4}  {item['text']:<40}{item['target_log_prob']:>10.3f}"
            f"{_nats(item['draft_log_prob']):>10}"
        )
    notes = _proof_lines(out) + _certificate_lines(out.get("gap_certified"))
    notes.append(f"draft index: {out['draft_forwards']} prefix forwards; whole run: {out['seconds']:.1f} s")
    return "\n".join(lines + _wrapped(notes))
