"""One call for the common case: ``jaxrescore.top_k(target, draft, k, prompt=...)``.

In the spirit of ``generate``: give the two models, ``k`` and optionally a prompt (token ids or
text) or a list of prompts; get proven results. It builds what one would build by hand — a
:class:`~jaxrescore.index.SeekIndex` over the draft (prompted), a
:class:`~jaxrescore.rescore.RescoredIndex` per prompt — and for several prompts scores them all
with ONE target call per round (:func:`~jaxrescore.rescore.rescore_many`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxrescore.index import SeekIndex
from jaxrescore.models.scores import DEFAULT_TOP_M
from jaxrescore.models.text import encode_prompt
from jaxrescore.rescore.queries import DEFAULT_MAX_ROUNDS
from jaxrescore.rescore.rescored_index import RescoredIndex
from jaxrescore.rescore.many import rescore_many
from jaxrescore.rescore.result import RescoreResult


def top_k(
    target: Any,
    draft: Any,
    k: int,
    *,
    prompt: Any = None,
    prove: bool = True,
    until_certified: bool = False,
    rerank_window: int = 64,
    assumed_gap: float | None = None,
    max_rounds: int = DEFAULT_MAX_ROUNDS,
    max_sequences: int | None = None,
    top_m: int = DEFAULT_TOP_M,
    index_options: dict | None = None,
) -> RescoreResult | list[RescoreResult]:
    """The target's ``k`` most probable sequences (continuations of ``prompt``), proven by default.

    Args:
      target: the expensive model (any model of :mod:`jaxrescore.models`).
      draft: the cheap model that orders the search (an index is built over it for each prompt),
        or a ready draft index (then without ``prompt``: an index is built for one prompt).
      k: items per prompt, an integer >= 1.
      prompt: None (sequences from the start), token ids, text (for models with a vocabulary or
        a tokenizer, see :mod:`jaxrescore.models.text`), or a list of prompts — then a list of
        results, one per prompt, scored together in one target call per round.
      prove: run the speculative exact search until the answer is proven (``result.proven``).
      until_certified: grow each draft pull until the gap certificate holds (needs
        ``assumed_gap``), as in :meth:`~jaxrescore.rescore.RescoredIndex.top_k`.
      rerank_window, assumed_gap, top_m: as in :class:`~jaxrescore.rescore.RescoredIndex`.
      max_rounds, max_sequences: the search's budgets, as in
        :meth:`~jaxrescore.rescore.RescoredIndex.top_k` (per prompt).
      index_options: keyword arguments for each :class:`~jaxrescore.index.SeekIndex` (e.g.
        ``{"max_bytes": 1 << 30}``).

    Returns:
      A :class:`~jaxrescore.rescore.RescoreResult` (``texts`` filled when the target has a
      vocabulary or a tokenizer), or a list of them for a list of prompts.
    """
    prompts, many = _prompts(target, prompt)
    options = dict(index_options or {})
    if not callable(getattr(draft, "next_logprobs", None)):
        if not callable(getattr(draft, "unrank", None)):
            raise TypeError(
                f"draft must be a model (next_logprobs) or a draft index (unrank), got {type(draft).__name__}"
            )
        if many or prompts != [None] or options:
            raise ValueError(
                "draft is a ready index, built for one prompt: pass the draft MODEL to use prompt= "
                "or index_options="
            )
    indexes = []
    for p in prompts:
        d, t = (draft, target) if p is None else (draft.with_prompt(p), target.with_prompt(p))
        index = d if callable(getattr(d, "unrank", None)) else SeekIndex(d, **options)
        indexes.append(RescoredIndex(index, t, rerank_window=rerank_window, assumed_gap=assumed_gap, top_m=top_m))
    search = dict(prove=prove, until_certified=until_certified, max_rounds=max_rounds, max_sequences=max_sequences)
    if not many:
        return indexes[0].top_k(k, **search)
    return rescore_many(indexes, k, **search)


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
