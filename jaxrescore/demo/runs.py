"""The demo's library queries, one each: the proven top-k, the spec's gap-certified top-k and the
exact best-first baseline, each returned as plain data with its cost."""

from __future__ import annotations

import math
from typing import Any

from jaxrescore.demo.defaults import FIRST_WINDOW, PROVE_WINDOW
from jaxrescore.index import SeekIndex
from jaxrescore.baselines.best_first import best_first_top_k
from jaxrescore.rescore import RescoredIndex


def draft_index(draft: Any, progress: bool) -> SeekIndex:
    """The draft's SeekIndex; its first build shows a progress bar when ``progress``, later
    deepenings only when they run long (so short passes do not print empty bars)."""
    index = SeekIndex(draft, progress=progress)
    index.progress = None if progress else False
    return index


def finite_or_none(value: float | None) -> float | None:
    """``value``, or None for None, NaN and infinities (JSON has no infinities)."""
    return value if value is not None and math.isfinite(value) else None


def same_answer(a: list, b: list) -> bool:
    """Whether two lists of sequences are the same, in order."""
    return [tuple(x) for x in a] == [tuple(x) for x in b]


def proven_top_k(index: SeekIndex, target: Any, k: int, window: int | None) -> dict:
    """The proven top-``k``: ``RescoredIndex(index, target).top_k(k, prove=True)`` and its cost;
    ``window`` None: :data:`~jaxrescore.demo.defaults.PROVE_WINDOW`."""
    rescored = RescoredIndex(index, target, rerank_window=PROVE_WINDOW if window is None else window)
    result = rescored.top_k(k, prove=True)
    return {
        "result": result,
        "proven": result.proven,
        "frontier_bound": finite_or_none(result.frontier_bound),
        "proof_reason": result.proof_reason,
        "rounds": result.rounds,
        "window": rescored.rerank_window,
        "target_calls": rescored.target_calls,
        "target_sequences": rescored.target_sequences,
    }


def certified_top_k(index: SeekIndex, target: Any, k: int, window: int | None, gap: float) -> dict:
    """The spec's gap-certified top-``k``: with ``window=None`` a
    :data:`~jaxrescore.demo.defaults.FIRST_WINDOW` query grown until certified
    (``until_certified``), else one query with that window."""
    rescored = RescoredIndex(index, target, rerank_window=FIRST_WINDOW if window is None else window, assumed_gap=gap)
    result = rescored.top_k(k, until_certified=window is None)
    return {
        "result": result,
        "certified": result.certified,
        "worst_log_prob": result.items[-1][1] if result.items else None,
        "bound": result.bound,
        "gap": result.gap,
        "excess": finite_or_none(result.excess),
        "gap_refuted": result.gap_refuted,
        "reason": result.reason,
        "assumed_gap": gap,
        "window": rescored.rerank_window,
        "rounds": result.rounds,
        "target_calls": rescored.target_calls,
        "target_sequences": rescored.target_sequences,
    }


def best_first_cost(target: Any, k: int) -> dict:
    """What the exact answer costs without a draft: batched best-first search over the target."""
    found = best_first_top_k(target, k)
    return {"forwards": found.forwards, "calls": found.calls, "items": [s for s, _ in found.items]}
