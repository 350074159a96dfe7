"""One call of a :class:`~jaxrescore.rescore.rescored_index.RescoredIndex`: pull the widest head
once, score it in ONE target call, search further when asked (``until_certified`` grows the pull,
``prove`` completes the frontier's open exits), then decide every query at once.

A proving or growing call searches for its *cover*: the top ``max(start + k)`` under the largest
gap asked. A proof of the cover proves every slice inside it (each slice's worst score is at
least the cover's), and a cover certified under the largest gap certifies every query under its
own; each query is still decided on its own numbers.
"""

from __future__ import annotations

import numpy as np

from jaxrescore.rescore.answer import run_core
from jaxrescore.rescore.proof import slice_worst
from jaxrescore.rescore.queries import Mode, Query
from jaxrescore.rescore.search import first_width, grow_until_certified, prove_search
from jaxrescore.rescore.seed import first_rows


def run_queries(index, queries: list[Query], mode: Mode) -> list:
    """The results of ``queries`` on ``index`` (a RescoredIndex, whose lock the caller holds)."""
    draft, budget = index.draft, mode.budget
    searching = mode.prove or mode.until_certified
    size = mode.pull_size(queries)
    # A search's first pull grows the draft index by at most max_sequences model rows: the
    # budget bounds the draft's work too (a search goes on from what the index holds).
    pull = draft.pull(min(size, budget.max_sequences), max_rows=budget.max_sequences) if searching \
        else draft.pull(size)
    cover = Query(0, max(q.start + q.k for q in queries), 0, None)
    first = first_rows(index, pull, cover.k, budget, mode.prove)  # a draft listing nothing: its top-k
    scored = index.new_scored_set()
    # A query that does not search returns from this call alone: its rows are teacher-forced
    # whole by the target's own forward (the spec's one batched forward: exact scores, no
    # cached numbers to check); a search's first call feeds the caches its later rounds extend.
    scored.add(first.seqs, first.draft_lps, first.ranks, full=not searching)
    gaps = [q.gap for q in queries if q.gap is not None]
    if not searching:
        rows = [min(q.extent, len(pull.seqs)) for q in queries]
        bounds = {r: draft.bound(r, pull) for r, q in zip(rows, queries) if q.gap is not None}
        return index.answer(queries, scored, rows, bounds)
    cover = cover._replace(gap=max(gaps) if gaps else None)
    rounds = 1 if first.seqs else 0  # an empty pull made no call
    if mode.until_certified:
        pull, rounds = grow_until_certified(cover, draft, pull, scored, budget, certificate_probe(index, cover))
        if not mode.prove and scored.check(cover.k - 1):  # the answer's cached rows: a full forward
            rounds += 1
    # Everything the draft ranks after the head is bounded by the head's bound, so it bounds
    # every sequence left unscored however far the search went.
    head = draft.bound(len(pull.seqs), pull) if gaps else None
    proofs = None
    if mode.prove:
        # A found sequence's draft score is an observation of the gap: computed for every one
        # when a query assumes a gap, else only for what the answer returns (draft forwards
        # the verdict never reads were 15% of a text proof's wall, measured).
        state = prove_search(scored, 0, cover.k, index.completer.steps, index.completer.rows,
                             index.draft_scores if gaps else None, budget,
                             first_width(index.search_width, cover.k), rounds, index.adaptive_width, first.aim)
        scored.answer_drafts(cover.k - 1)
        rounds = state.rounds
        # One query's slice has the cover's worst rank: the search's last verdict is its own.
        proofs = [state.proof] if len(queries) == 1 else None
    n = len(scored)
    return index.answer(queries, scored, [n] * len(queries), {n: head}, proofs, rounds)


def certificate_probe(index, cover: Query):
    """``decide(scored, bound) -> (certified, why, worst)``: the core's certificate for the cover
    over every scored row (a probe: the index's carry is not updated)."""

    def decide(scored, bound):
        n = len(scored)
        out, _ = run_core([cover], scored, [n], {n: bound}, index.carry)
        return int(out.certified[0]), int(out.why[0]), float(slice_worst(out.log_probs[0], out.mask[0], cover.k, np))

    return decide
