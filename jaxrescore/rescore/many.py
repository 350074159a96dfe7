"""Rescoring several indexes' queries in ONE target call (e.g. one index per prompt)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from jaxrescore.models.frontier import FrontierScores
from jaxrescore.rescore.index import RescoredIndex, RescoreResult, _Query, as_scorer
from jaxrescore.rescore.scored import ScoredSet, checked_scores, forward_rows
from jaxrescore.sequences import from_tuples


def _joint(indexes: Sequence[RescoredIndex]):
    """``(model, prompts)``: one model scoring every index's candidates — the shared target
    (prompts all empty) or the shared base of prompted targets (``.base`` and ``.prompt``), which
    scores ``prompt + continuation`` with the prompt's steps skipped."""
    targets = [ri.target for ri in indexes]
    if all(t is targets[0] for t in targets):
        return targets[0], [()] * len(targets)
    bases = [getattr(t, "base", None) for t in targets]
    if bases[0] is None or any(b is not bases[0] or not hasattr(t, "prompt") for b, t in zip(bases, targets)):
        raise ValueError(
            "rescore_many needs indexes whose targets are one and the same model, or prompted "
            "models (with_prompt) of one and the same base model"
        )
    return bases[0], [tuple(t.prompt) for t in targets]


def _score_jointly(indexes, sets: list[ScoredSet], parts: list[list]) -> list:
    """Every part's ``(scores, block)`` from ONE call of the joint model (see ``ScoredSet.score``)."""
    model, prompts = _joint(indexes)
    flat = [s for part in parts for s in part]
    sizes = [len(p) for p in parts]
    splits = np.cumsum(sizes)[:-1]
    proves = all(s.proves for s in sets) and callable(getattr(model, "score_frontier", None))
    if not proves:
        for s in sets:
            s.proves = False
        if all(p == () for p in prompts):
            raw = as_scorer(model)(flat)
        else:
            seqs = [pr + s for pr, part in zip(prompts, parts) for s in part]
            skip = np.repeat([len(pr) for pr in prompts], sizes).astype(np.int32)
            raw = model.score_sequences(from_tuples(seqs), skip=skip)
        tolerance = min(s.tolerance for s in sets)
        return [(sc, None) for sc in np.split(checked_scores(raw, flat, tolerance), splits)]
    cut = [forward_rows(part, s.structure) for s, part in zip(sets, parts)]
    rows = [pr + r for pr, (rs, _) in zip(prompts, cut) for r in rs]
    skip = np.repeat([len(pr) for pr in prompts], sizes).astype(np.int32)
    fs = model.score_frontier(from_tuples(rows), top_m=sets[0].top_m, skip=skip)
    out = []
    for (rs, ok), s, lo, hi in zip(cut, sets, np.concatenate([[0], splits]), np.cumsum(sizes)):
        block = FrontierScores(*(a[lo:hi] for a in fs))
        scores = checked_scores(block.scores, parts[len(out)], s.tolerance)
        out.append((np.where(ok, scores, -np.inf), (rs, block)))
    return out


def rescore_many(indexes: Sequence[RescoredIndex], k: int) -> list[RescoreResult]:
    """``[ri.top_k(k) for ri in indexes]`` with ONE batched target call for all of them.

    Each index pulls its own ``k + rerank_window`` head and keeps its own window, gap and carry; the
    candidates of all indexes are scored together, and with targets that give next-token
    distributions every result carries its own ``proven`` verdict from that same call. Every
    index's ``target_calls`` counts the call.

    Args:
      indexes: RescoredIndex objects sharing a target, or whose targets are prompts of one base.
      k: the number of items per index, an integer >= 1.
    """
    indexes = list(indexes)
    if not indexes or not all(isinstance(ri, RescoredIndex) for ri in indexes):
        raise ValueError("indexes must be a non-empty sequence of RescoredIndex objects")
    queries = [[_Query(0, k, ri.rerank_window, ri.assumed_gap)] for ri in indexes]
    prepared = [ri._prepare(q) for ri, q in zip(indexes, queries)]
    sets = [ri.new_scored_set() for ri in indexes]
    parts = [pull.seqs for pull, _ in prepared]
    results = _score_jointly(indexes, sets, parts) if any(parts) else [(np.zeros(0), None)] * len(parts)
    out = []
    for ri, q, (pull, bounds), s, scored in zip(indexes, queries, prepared, sets, results):
        s.add(pull.seqs, pull.draft_lps, np.arange(len(pull.seqs)), scored=scored)
        s.calls = 1 if any(parts) else 0
        out.append(ri._finish(q, s, bounds)[0])
    return out
