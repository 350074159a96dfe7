"""Rescoring several indexes' queries in ONE target call (e.g. one index per prompt)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from jaxrescore.rescore.index import RescoredIndex, RescoreResult, _Query, as_scorer, checked_scores
from jaxrescore.sequences import from_tuples


def _joint_scorer(indexes: Sequence[RescoredIndex]):
    """One scorer for every index's candidates: the shared target itself, or the shared base of
    prompted targets (``.base`` and ``.prompt``), scoring ``prompt + continuation`` with the prompt's
    steps skipped."""
    targets = [ri.target for ri in indexes]
    if all(t is targets[0] for t in targets):
        score = as_scorer(targets[0])
        return lambda parts: score([s for part in parts for s in part])
    bases = [getattr(t, "base", None) for t in targets]
    if bases[0] is None or any(b is not bases[0] or not hasattr(t, "prompt") for b, t in zip(bases, targets)):
        raise ValueError(
            "rescore_many needs indexes whose targets are one and the same model, or prompted "
            "models (with_prompt) of one and the same base model"
        )
    base = bases[0]

    def score(parts):
        seqs = [tuple(t.prompt) + s for t, part in zip(targets, parts) for s in part]
        skip = np.concatenate([np.full(len(part), len(t.prompt), np.int32) for t, part in zip(targets, parts)])
        return base.score_sequences(from_tuples(seqs), skip=skip)

    return score


def rescore_many(indexes: Sequence[RescoredIndex], k: int) -> list[RescoreResult]:
    """``[ri.top_k(k) for ri in indexes]`` with ONE batched target call for all of them.

    Each index pulls its own ``k + rerank_window`` head and keeps its own window, gap and carry; the
    candidates of all indexes are scored together. Every index's ``target_calls`` counts the call.

    Args:
      indexes: RescoredIndex objects sharing a target, or whose targets are prompts of one base.
      k: the number of items per index, an integer >= 1.
    """
    indexes = list(indexes)
    if not indexes or not all(isinstance(ri, RescoredIndex) for ri in indexes):
        raise ValueError("indexes must be a non-empty sequence of RescoredIndex objects")
    queries = [[_Query(0, k, ri.rerank_window, ri.assumed_gap)] for ri in indexes]
    score = _joint_scorer(indexes)
    prepared = [ri._prepare(q) for ri, q in zip(indexes, queries)]
    parts = [pull.seqs for pull, _ in prepared]
    flat = [s for part in parts for s in part]
    scores = checked_scores(score(parts), flat) if flat else np.zeros(0)
    splits = np.cumsum([len(p) for p in parts])[:-1]
    return [
        ri._finish(q, pull, part_scores, bounds)[0]
        for ri, q, (pull, bounds), part_scores in zip(indexes, queries, prepared, np.split(scores, splits))
    ]
