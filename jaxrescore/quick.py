"""One call for the common case: ``jaxrescore.top_k(target, draft, k, prompt=...)``.

In the spirit of ``generate``: give the two models, ``k`` and optionally a prompt (token ids or
text) or a list of prompts; get proven results. It builds what one would build by hand — a
:class:`~jaxrescore.index.SeekIndex` over the draft (prompted), a
:class:`~jaxrescore.rescore.RescoredIndex` per prompt — and for several prompts scores them all
with ONE target call per round (:func:`~jaxrescore.rescore.rescore_many`).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from jaxrescore._checks import check_choice
from jaxrescore.constraints import Constraint, constrain, constrain_draft
from jaxrescore.index import SeekIndex
from jaxrescore.models.jax_lm import JaxLM
from jaxrescore.models.scores import DEFAULT_TOP_M
from jaxrescore.models.text import encode_prompt
from jaxrescore.rescore.queries import DEFAULT_MAX_ROUNDS
from jaxrescore.rescore.rescored_index import RescoredIndex
from jaxrescore.rescore.draft import SpeculativeDraft
from jaxrescore.rescore.many import rescore_many
from jaxrescore.rescore.progress import reporting
from jaxrescore.rescore.result import RescoreResult


def top_k(
    target: Any,
    draft: Any,
    k: int,
    *,
    prompt: Any = None,
    prove: bool = True,
    until_certified: bool = False,
    rerank_window: int | None = None,
    assumed_gap: float | None = None,
    max_rounds: int = DEFAULT_MAX_ROUNDS,
    max_sequences: int | None = None,
    max_seconds: float | None = None,
    max_new_tokens: int | None = None,
    top_m: int = DEFAULT_TOP_M,
    index: str = "auto",
    index_options: dict | None = None,
    constraint: Constraint | None = None,
) -> RescoreResult | list[RescoreResult]:
    """The target's ``k`` most probable sequences (continuations of ``prompt``), proven by default.

    Args:
      target: the expensive model (any model of :mod:`jaxrescore.models`).
      draft: the cheap model that orders the search (an index is built over it for each prompt,
        see ``index``), a ready draft index (then without ``prompt``), or None: the target
        speculates its own paths (no draft model: every speculated token is a target row).
      k: items per prompt, an integer >= 1.
      prompt: None (sequences from the start), token ids, text (for models with a vocabulary or
        a tokenizer, see :mod:`jaxrescore.models.text`), or a list of prompts — then a list of
        results, one per prompt, scored together in one target call per round.
      prove: run the speculative exact search until the answer is proven (``result.proven``).
      until_certified: grow each draft pull until the gap certificate holds (needs
        ``assumed_gap``), as in :meth:`~jaxrescore.rescore.RescoredIndex.top_k`.
      rerank_window, assumed_gap, top_m: as in :class:`~jaxrescore.rescore.RescoredIndex`.
      max_rounds, max_sequences, max_seconds: the search's budgets, as in
        :meth:`~jaxrescore.rescore.RescoredIndex.top_k` (per prompt; ``max_seconds`` for the
        whole call). They bound all of a query's work, the draft index's growth included; a
        query stopped by one returns ``proven=False`` with a reason naming it.
      max_new_tokens: sequences (continuations) of at most this many tokens, ``eos`` included
        (``generate``'s length cap); None: up to the models' ``max_len``.
      index: how the draft orders the search. ``"seek"``: a :class:`~jaxrescore.index.SeekIndex`
        over the draft (its exact quantized order; the first round scores its head of k, plus
        ``rerank_window`` if given); ``"none"``: no index, the draft model speculates every path from
        the root (:class:`~jaxrescore.rescore.draft.SpeculativeDraft`); ``"auto"`` (default):
        ``"none"`` for a proof (no ``assumed_gap``) with a network draft, whose every index row
        is a forward (on SmolLM2-135M's chat answers the index grew past 1,500 rows without
        serving one query; BENCHMARKS.md, "A real pretrained LM"), else ``"seek"`` (an n-gram's
        or a table's rows cost microseconds, and its head makes the first round count).
      index_options: keyword arguments for each :class:`~jaxrescore.index.SeekIndex` (e.g.
        ``{"max_bytes": 1 << 30}``).
      constraint: None, or a :mod:`jaxrescore.constraints` constraint on the generated tokens
        (``Length``, ``Regex``, ``OneOf``, combined with ``&``): the answer is then the target's
        top-k among the sequences that satisfy it (proven: exactly those), and the draft indexes
        and speculates only such sequences. Several prompts are then searched one by one.

    A terminal (stderr) shows what a long call is doing: the draft index's build, then each
    round of the search and the programs compiled so far.

    Returns:
      A :class:`~jaxrescore.rescore.RescoreResult` (``texts`` filled when the target has a
      vocabulary or a tokenizer), or a list of them for a list of prompts.
    """
    prompts, many = _prompts(target, prompt)
    options = dict(index_options or {})
    index = check_choice(index, "index", INDEX_CHOICES)
    if draft is not None and not callable(getattr(draft, "next_logprobs", None)):
        if not callable(getattr(draft, "unrank", None)):
            raise TypeError(
                f"draft must be a model (next_logprobs), a draft index (unrank) or None, got {type(draft).__name__}"
            )
        if many or prompts != [None] or options or max_new_tokens is not None or constraint is not None:
            raise ValueError(
                "draft is a ready index, built for one prompt: pass the draft MODEL to use prompt=, "
                "max_new_tokens=, index_options= or constraint="
            )
    speculate_only = draft is None or index == "none" or (
        index == "auto" and prove and not until_certified and assumed_gap is None and _is_network(draft))
    indexes = []
    for p in prompts:
        t, d = _constrained(target, draft, constraint, p, max_new_tokens)
        if callable(getattr(d, "unrank", None)):
            draft_index = d
        elif speculate_only:
            draft_index = SpeculativeDraft(d)
        else:
            draft_index = SeekIndex(d, **options)
        indexes.append(RescoredIndex(draft_index, t, rerank_window=rerank_window, assumed_gap=assumed_gap,
                                     top_m=top_m))
    search = dict(prove=prove, until_certified=until_certified, max_rounds=max_rounds, max_sequences=max_sequences,
                  max_seconds=max_seconds)
    with reporting():
        if not many:
            return indexes[0].top_k(k, **search)
        if constraint is not None:  # constrained targets share no base model to score jointly
            return _one_by_one(indexes, k, search)
        return rescore_many(indexes, k, **search)


INDEX_CHOICES = ("auto", "seek", "none")


def _conditioned(model: Any, prompt, max_new_tokens: int | None) -> Any:
    """``model`` over the continuations of ``prompt`` (None: from the start) of at most
    ``max_new_tokens`` tokens; a ready index (``unrank``) as it is."""
    if callable(getattr(model, "unrank", None)) and not callable(getattr(model, "next_logprobs", None)):
        return model
    if prompt is None and max_new_tokens is None:
        return model
    return model.with_prompt(() if prompt is None else prompt, max_new_tokens=max_new_tokens)


def _one_by_one(indexes: list, k: int, search: dict) -> list[RescoreResult]:
    """Each index's query in turn, ``max_seconds`` (when given) shared by all of them."""
    limit = search["max_seconds"]
    start = time.monotonic()
    out = []
    for ri in indexes:
        left = None if limit is None else max(limit - (time.monotonic() - start), 1e-9)
        out.append(ri.top_k(k, **{**search, "max_seconds": left}))
    return out


def _constrained(target: Any, draft: Any, constraint, prompt, max_new_tokens) -> tuple[Any, Any]:
    """``(target, draft)`` over the continuations of ``prompt``, under ``constraint`` when one is
    given (the draft reuses the target's automaton when their tokens agree)."""
    t = _conditioned(target, prompt, max_new_tokens)
    d = None if draft is None else _conditioned(draft, prompt, max_new_tokens)
    if constraint is not None:
        t = constrain(t, constraint)
        d = None if d is None else constrain_draft(d, t)
    return t, t if d is None else d


def _is_network(model: Any) -> bool:
    """Whether every next-token row of ``model`` is a network forward (a JAX model, or a prompted
    one), not a table lookup (an n-gram, a callable)."""
    return isinstance(getattr(model, "base", model), JaxLM)


def _prompts(target: Any, prompt: Any) -> tuple[list, bool]:
    """``(prompts, many)``: each prompt as token ids (None for no prompt), and whether a list of
    prompts was given."""
    if prompt is None:
        return [None], False
    if isinstance(prompt, str):
        return [encode_prompt(target, prompt)], False
    try:
        parts = list(prompt)
    except TypeError:
        raise TypeError(
            f"prompt must be None, token ids, text or a list of prompts, got {type(prompt).__name__}"
        ) from None
    if all(isinstance(t, (int, np.integer)) and not isinstance(t, bool) for t in parts):
        return [tuple(int(t) for t in parts)], False
    if not parts or any(isinstance(p, (int, np.integer, bool)) for p in parts):
        raise TypeError("prompt must be token ids or a list of prompts (each text or token ids), not a mix")
    return [encode_prompt(target, p) for p in parts], True
