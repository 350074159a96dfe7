"""Where a proving search over a speculating draft begins: the draft's own top-k.

A :class:`~jaxrescore.rescore.draft.SpeculativeDraft` lists nothing up front. Started from the
draft's greedy path alone, a search does not know how good its answer will be: the worst answer
starts at ``-inf`` and climbs over rounds, every round opens the exits above the CURRENT worst,
and everything scored between that and the final worst is wasted (SmolLM2-135M-Instruct, "Name
a primary color.", k = 5, int8 twin: 305 of the 737 trie nodes the search computed lay below the
final worst; 13 when the final worst was known in advance). The draft's own exact top-k, found by
best-first search over the draft's rows (through the completion session, whose caches the
speculation then extends), gives both: its sequences are the first sequences the target scores
(k complete answers in one call: a finite worst from the start), and its k-th draft score is the
*aim* of the rounds after it (see :func:`~jaxrescore.rescore.search.round_steps`): the score the
answer is expected to reach.

Policy, not soundness: the target scores every seeded sequence and the proof reads only the
target's numbers. The draft's search is bounded (:func:`seed_rows`, and the query's
``max_seconds``); cut short, its best complete
sequences still seed the search and their k-th draft score (then below the draft's own k-th)
still aims it, only lower.
"""

from __future__ import annotations

import math
import time
from typing import NamedTuple

import numpy as np

from jaxrescore.baselines.best_first import best_first_steps
from jaxrescore.models.lockstep import Steps, run
from jaxrescore.rescore.draft import DraftPull, SpeculativeDraft
from jaxrescore.rescore.queries import SearchBudget

# The draft rows the seed's best-first search may evaluate, per item asked. A near-uniform draft
# would expand without end (every prefix above its k-th answer); a good one needs far fewer:
# SmolLM2-135M-Instruct's int8 twin, k = 5, expands as many rows as the target's own best-first
# (a few hundred).
SEED_ROWS_PER_ITEM = 128
# Prefixes expanded per draft call (at least k): a row of a 135M-parameter draft costs little next
# to reading its weights once per call, so a wider batch trades a few rows for far fewer calls
# (SmolLM2's int8 twin, k = 5: 376 rows in 26 calls; the target's best-first at batch 5 expands 360
# rows in 73).
SEED_BATCH = 16


class Seed(NamedTuple):
    """The draft's answer: ``seqs`` (best first, at most k), ``draft_lps`` float64[len(seqs)]
    their draft log-probs, and ``aim`` the k-th of them (``-inf`` with fewer than k)."""

    seqs: list
    draft_lps: np.ndarray
    aim: float


def seed_rows(k: int, max_sequences: int) -> int:
    """The most draft rows a seed for ``k`` items may evaluate: ``SEED_ROWS_PER_ITEM * k``, and
    never more than the query's ``max_sequences`` (the budget bounds the draft's work too)."""
    return max(1, min(SEED_ROWS_PER_ITEM * k, max_sequences))


NO_SEED = Seed([], np.zeros(0), -math.inf)


def seed_of(index, k: int, budget: SearchBudget) -> Seed:
    """The first sequences a proving search of ``index``'s top ``k`` scores (when its pull is
    empty) and the aim of its later rounds: the draft's top-k (best-first search over its rows,
    at most :func:`seed_rows` of them, within the query's seconds) when the index is a
    :class:`~jaxrescore.rescore.draft.SpeculativeDraft` over a draft other than the target, else
    :data:`NO_SEED`. They are not the index's ranks (it lists nothing, and bounds
    nothing: no certificate reads them as a draft head); their draft log-probs are the draft's
    own."""
    return run(seed_steps(index, k, budget), index.completer.rows)


def seed_steps(index, k: int, budget: SearchBudget) -> Steps:
    """:func:`seed_of` as a generator of the completion model's calls (see
    :mod:`jaxrescore.models.lockstep`)."""
    if not isinstance(index.draft_index, SpeculativeDraft) or budget.out_of_time():
        return NO_SEED
    if index.draft_index.model is index.target:  # no draft (the target speculates): its own
        return NO_SEED  # best-first would be the whole search, uncounted as target work
    left = None if budget.max_seconds is None else max(0.0, budget.max_seconds - (time.monotonic() - budget.started))
    # the draft's top-k by best-first search over the completion model, within the seed's rows
    model = index.completer.model
    found = yield from best_first_steps(k, model.eos, int(model.max_len), max(SEED_BATCH, k),
                                        seed_rows(k, budget.max_sequences), left)
    seqs = [tuple(int(t) for t in s) for s, _ in found.items]
    lps = np.array([lp for _, lp in found.items], np.float64)
    return Seed(seqs, lps, float(lps[k - 1]) if lps.size >= k else -math.inf)


class FirstRows(NamedTuple):
    """What a query's first call scores: ``seqs``, their ``draft_lps`` float64[N] and draft
    ``ranks`` int[N] (-1: not the index's), and the ``aim`` its search starts with."""

    seqs: list
    draft_lps: np.ndarray
    ranks: np.ndarray
    aim: float


def first_rows(index, pull: DraftPull, k: int, budget: SearchBudget, prove: bool) -> FirstRows:
    """The pulled head, or, for a proving search whose pull is empty, the draft's own top ``k``
    (:func:`seed_of`), unranked."""
    return run(first_rows_steps(index, pull, k, budget, prove), index.completer.rows)


def first_rows_steps(index, pull: DraftPull, k: int, budget: SearchBudget, prove: bool) -> Steps:
    """:func:`first_rows` as a generator of the completion model's calls (see
    :mod:`jaxrescore.models.lockstep`)."""
    seed = (yield from seed_steps(index, k, budget)) if prove and not pull.seqs else NO_SEED
    if seed.seqs:
        return FirstRows(seed.seqs, seed.draft_lps, np.full(len(seed.seqs), -1), seed.aim)
    return FirstRows(pull.seqs, pull.draft_lps, np.arange(len(pull.seqs)), -math.inf)
