"""Speculative exact search: grow a scored set until the frontier bound proves the answer.

Each round (see DESIGN.md §4b):

1. the frontier of the scored set gives every exit (p, t) with its bound ``target(p) + log
   p_target(t | p)``; the exits whose bound does not clear the current answer's worst score by
   the target's tolerance are *open*;
2. open exits whose token the forward's top-m does not name ("rest" exits) get their node's full
   target row fetched in the same call as this round's sequences (one batched ``next_logprobs``,
   independent of the scoring), which turns them into named exits for the next round; a round
   with no other exit open fetches them in a call of its own first;
3. the DRAFT completes the best open exits' prefixes ``p + t`` greedily (batched across exits,
   one draft call per step) — the draft speculates paths. A round opens at most a width of
   exits, the best by bound: ``search_width`` times k at first, then adapted to how much of the
   last round's speculation landed (:func:`adapt_width`: the share of the trie nodes it computed
   that score at least the current worst answer; a good draft is trusted wider, a poor one
   narrower). A path of a terminating target takes no token that would bring its estimate (the
   exit's exact value plus the draft's log-probs after it) below the current worst answer: it is
   closed with ``eos`` there instead, so its forward still gives the target's distribution after
   its last speculated token and the node becomes a live prefix with exact exits (see
   :func:`~jaxrescore.rescore.speculate.speculate`). The worst answer lags the final one while
   the answer is being found, and everything scored between them is wasted, so the round aims
   higher (:func:`aim_of`): at the score the worst answer is expected to reach, counting the
   draft's estimates of the complete paths it speculated; exits below the aim wait and paths are
   cut where their estimate falls below it. With the adaptive width, two more rules: while the
   worst answer is still rising and the draft expects nothing above it, a round opens at most a
   quarter of the open exits (:func:`share_of`); with at most ``k / 8`` exits left, paths are
   speculated 2 nats below the answer (a path the draft undervalues is not extended one round
   per token);
4. the target scores only the new sequences in ONE batched call, and of them only the positions
   the scored set does not hold yet: over the key/value caches of their scored prefixes when the
   target decodes incrementally (:mod:`jaxrescore.rescore.reuse`), so every position of every
   speculated path is verified at once (speculative decoding's trick, applied to exact search)
   and a scored prefix is computed again only where the step out of it is not among the tokens
   its forward named; then the loop repeats.

A search over a draft index that lists nothing (a
:class:`~jaxrescore.rescore.draft.SpeculativeDraft`) begins with the draft's own top-k, found by
best-first over the draft's rows (:mod:`jaxrescore.rescore.seed`): k complete answers in the first
call, and the draft's k-th score as a floor under every round's aim (``predicted``) while
anything is open above it; once nothing is, the round aims as without it.

None of this policy touches soundness: the proof is the frontier bound over whatever was scored.
A new node's exits are worth at most its parent exit's bound, and every round adds a node per
opened exit or fetches a row (an aim above the worst answer comes from a path the round keeps
whole), so the loop ends on any finite support; ``max_rounds`` and ``max_sequences`` bound
it in practice. The answer is then proven, or returned with the reason it is not.
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple

import numpy as np

from jaxrescore.models.lockstep import Steps, run
from jaxrescore.rescore.core import CERT_FALSE, WHY_SHORT_OF
from jaxrescore.rescore.draft import DraftPull, DraftView
from jaxrescore.rescore.frontier import COMPLETE, REST, Frontier, clears
from jaxrescore.rescore.progress import report
from jaxrescore.rescore.proof import Proof, check_proof, kth_best, open_floor
from jaxrescore.rescore.queries import Query, SearchBudget
from jaxrescore.rescore.scored import ScoredSet
from jaxrescore.rescore.speculate import Speculation


# The default first width, times k (RescoredIndex(search_width=...)); later rounds adapt it
# (adapt_width). 2 rather than 8: on the wide workload (three prompts, k = 10 and 100) the 3-gram
# proof computed 2.2x / 3.0x best-first's positions starting at 2k against 2.3x / 4.9x at 8k,
# while the student's calls and positions hardly moved (16 / 17 calls against 15 / 17, 1.06x /
# 1.01x the positions). The trade-off is measured in BENCHMARKS.md ("Proof compute",
# benchmarks/bench_proof_compute.py).
SEARCH_WIDTH = 2
# The adaptive width (see adapt_width): the share of last round's new trie nodes that scored at
# least the current worst answer above which the width doubles, and below which it halves.
YIELD_WIDEN = 0.5
YIELD_NARROW = 0.25
# The adaptive policy's other two rules (see share_of and round_steps), measured on the real-text
# workload (benchmarks/text.py, student draft, prompts 'the' and 'if the' summed): opening at most
# a quarter of the open exits while the worst answer still rises and the draft expects nothing
# above it took k = 10 from 1.60x to 1.45x best-first's positions in the same calls (in every
# round it also took k = 300 from 1.46x to 1.32x, but the wide workload's student from 16 to 45
# calls at k = 10: its answer is settled by the first call and every round's exits are needed);
# with at most k / 8 exits open, speculating 2 nats below the answer took k = 300 from 22 to 19
# calls at no measurable cost in positions.
OPEN_SHARE = 0.25
TAIL_EXITS = 0.125
TAIL_MARGIN = 2.0


def first_width(search_width: int | None, k: int) -> float:
    """Exits the first round may open: ``search_width * k``, or every open exit (``inf``)."""
    return math.inf if search_width is None else float(search_width * k)


def rising(scored: ScoredSet, rank: int) -> bool:
    """Whether either of the last two adds to ``scored`` raised the score at ``rank`` (0-based),
    the worst answer, from a finite one: the answer is still being found (a first answer, e.g.
    the draft's head, may be the final one)."""
    starts = scored.add_starts[-2:]
    scores = scored.target_lps
    return any(-math.inf < kth_best(scores[:n], rank) < kth_best(scores[:m], rank)
               for n, m in zip(starts, starts[1:] + [scores.size]))


def share_of(n_open: int, k: int) -> float:
    """The most exits the adaptive policy opens in one round out of ``n_open``: a quarter of
    them (at least ``k``). The exits left are the ones closest to the current worst answer,
    which lags the final one; the best of them are opened first, and the rest wait for a worst
    the round may raise above them."""
    return float(max(k, math.ceil(OPEN_SHARE * n_open)))


def adapt_width(width: float, node_values: np.ndarray, worst: float, k: int) -> float:
    """This round's width from the last round's: doubled when at least half of the trie nodes
    the last round computed score at least the current worst answer (the draft's speculation is
    landing: trust it wider, fewer rounds), halved (to at least ``k``) when under a
    fourth do (the draft is guessing: fewer positions spent below the answer)."""
    if not math.isfinite(width) or not node_values.size or not math.isfinite(worst):
        return width
    landed = float(np.mean(node_values >= worst))
    if landed >= YIELD_WIDEN:
        return 2 * width
    if landed < YIELD_NARROW:
        return max(float(k), width / 2)
    return width


class Round(NamedTuple):
    """What :func:`round_steps` decided: the verdict now, the new sequences the next call scores
    (None: the search stops), the width after this round, the prefixes whose full target
    rows the same call fetches (their "rest" exits are open), and the scored rows the same call
    checks by a full forward (the current answer's cached rows, see :func:`ride_along`)."""

    proof: Proof
    new: list | None
    width: float
    fetch: list | tuple = ()
    check: Any = ()


def round_steps(scored: ScoredSet, start: int, k: int, complete, budget: SearchBudget, rounds: int,
                width: float = math.inf, adaptive: bool = True, predicted: float = -math.inf) -> Steps:
    """The next round (a :class:`Round`, returned by a generator of the completion model's calls,
    see :mod:`jaxrescore.models.lockstep`): the verdict on ``scored`` now, the new sequences the
    next call should score (None when the search stops: proven, no proof possible, or the
    budget is spent), opening at most ``width`` exits (the best by bound, see the module
    docstring), the next round's width, and the nodes whose full rows the same call fetches.
    When only "rest" exits are open, fetches their rows first (a call of its own, counted by
    ``scored``).

    Args:
      scored: what the search has scored so far.
      start, k: the slice ``[start, start + k)`` to prove.
      complete: ``complete(prefixes, values, floor)``: a generator of the model calls that
        speculate completions of exit prefixes, returning the :class:`Speculation` (``values``:
        their exact target log-probs; a path whose estimate falls below ``floor``, the current
        worst answer, may stop early, see :func:`~jaxrescore.rescore.speculate.speculate`).
      budget: the search's limits; ``rounds``: scoring rounds made so far.
      width: exits this round may open (see :func:`first_width`).
      predicted: the score the draft expects the answer's worst to reach (its own k-th best, see
        :mod:`jaxrescore.rescore.seed`; ``-inf``: none), a floor under the round's aim while
        anything is open above it.
    """
    if not len(scored) and scored.proves and rounds < budget.max_rounds and not budget.out_of_time():
        # nothing pulled (a draft that lists nothing up front): the draft speculates from the root
        seed = (yield from complete([()], np.zeros(1), -math.inf)).sequences()[: budget.max_sequences]
        return Round(Proof(False, None, "nothing scored yet"), seed, width)
    proof, front = check_proof(scored, len(scored), start, k)
    if proof.proven is not False or start < 0 or not front.moved <= scored.tolerance or not scored.drift <= scored.tolerance:
        return Round(proof, None, width)
    if clears(kth_best(scored.target_lps, start + k - 1), front.bound, scored.tolerance):
        return Round(proof, None, width)  # proven but for the full forward of cached rows (prove_search)
    if rounds >= budget.max_rounds:
        return Round(proof._replace(reason=f"{proof.reason}; stopped at max_rounds={budget.max_rounds}"), None, width)
    if budget.out_of_time():
        return Round(proof._replace(reason=f"{proof.reason}; stopped at max_seconds={budget.max_seconds:g}"), None, width)
    # The budget counts everything the target evaluated: scored sequences and fetched rows.
    room = budget.max_sequences - scored.sequences
    if room <= 0:
        return Round(proof._replace(reason=f"{proof.reason}; stopped at max_sequences={budget.max_sequences}"), None, width)
    # only the best exits a round can open become tuples: a poor draft's frontier over fetched
    # V-wide rows holds millions of open exits (SmolLM2 with a 10-layer self-draft: 6 GB of them)
    worst = kth_best(scored.target_lps, start + k - 1)
    adapted = adapt_width(width, scored.new_node_values(), worst, k) if adaptive else width
    prefixes, values, rest_values, n_open = _open_prefixes(scored, front, start, k, int(min(room, adapted)))
    rest = [p for p in rest_values if p not in scored.rows][:room]
    if not prefixes and rest:  # only "rest" exits are open: their rows first (a call of its own)
        if not scored.fetch_rows(rest):
            return Round(proof._replace(reason=f"{proof.reason}; the search found nothing new"), None, width)
        return (yield from round_steps(scored, start, k, complete, budget, rounds, width, adaptive, predicted))
    width = adapted
    take = int(min(room - len(rest), width))
    # few exits left (the answer is nearly settled): speculate below the answer too, so a path
    # the draft undervalues is not extended one round per token
    margin = TAIL_MARGIN if adaptive and n_open <= TAIL_EXITS * k else 0.0
    spec = yield from complete(prefixes[:take], values[:take], open_floor(worst, scored.tolerance) - margin)
    aim = base = worst - margin if margin else aim_of(scored, spec, start + k - 1, worst)
    if not margin:
        aim = max(aim, predicted)
    share = int(share_of(n_open, k))
    if adaptive and aim <= worst and take > share and rising(scored, start + k - 1):
        # the worst answer is still rising and the draft expects no completion above it: it
        # cannot tell which of the exits near the worst will matter (the aim needed the paths of
        # all ``take``; only the best ``share`` exits' are scored)
        spec = spec.of_prefixes(share)
    floor = open_floor(aim, scored.tolerance)
    new = scored.new(spec.aimed(floor, scored.structure.eos))[: max(room - len(rest), 0)]
    if not new and aim > base and all(rest_values[p] < floor for p in rest):
        # nothing open above the draft's aim (it overrated the answer): aim as without it
        aim, floor = base, open_floor(base, scored.tolerance)
        new = scored.new(spec.aimed(floor, scored.structure.eos))[: max(room - len(rest), 0)]
    if new or aim > base:  # rest rows below the aim wait, like named exits (a row is a whole V-wide forward)
        rest = [p for p in rest if rest_values[p] >= floor]
    if not new and not rest:
        return Round(proof._replace(reason=f"{proof.reason}; the search found nothing new"), None, width)
    # the answer's cached rows ride along once it has reached the aim: an answer the round is
    # expected to change would be checked again (a 3-token continuation of SmolLM2: 17 check
    # positions every round, 9 this way)
    check = ride_along(scored, start + k - 1) if aim <= worst + scored.tolerance else ()
    return Round(proof, new, width if adaptive else 2 * width, rest, check)


def ride_along(scored: ScoredSet, rank: int) -> np.ndarray:
    """The scored rows a round's call checks by a full forward besides its own sequences (see
    :meth:`~jaxrescore.rescore.scored.ScoredSet.unchecked`): the current answer's rows holding
    cached numbers, so that an answer the round does not change needs no call of its own.
    :func:`round_steps` sends them once the answer has reached the round's aim: on the quick
    proof_compute run (wide, k = 10) the 3-gram's proof took 8 calls and 1,243 positions this way,
    8 and 1,363 checking in every round, 9 and 1,323 checking only a settled answer, 9 and 1,253
    checking only at the end."""
    return scored.unchecked(rank)


def aim_of(scored: ScoredSet, spec: Speculation, rank: int, worst: float) -> float:
    """The score the answer's worst is expected to reach: the ``rank``-th best (0-based) of the
    scored sequences' exact scores and the draft's estimates of the speculated paths it ended
    itself that are not scored yet; never below ``worst``, the current one."""
    est = spec.estimates()
    fresh: dict = {}
    for i in np.flatnonzero(est > worst).tolist():
        seq = tuple(spec.rows[i, : spec.lengths[i]].tolist())
        if seq not in scored.where:
            fresh[seq] = est[i]
    if not fresh:
        return worst
    return max(worst, kth_best(np.concatenate([scored.target_lps, np.fromiter(fresh.values(), float)]), rank))


class SearchState(NamedTuple):
    """Where a proving search stands: the verdict on what it has scored (None before the first
    check), the scoring rounds made (the head's included), the exits the next round may open,
    and whether it has stopped (proven, no proof possible, or the budget spent)."""

    proof: Proof | None
    rounds: int
    width: float
    stopped: bool = False
    adaptive: bool = True
    aim: float = -math.inf


def search_step(state: SearchState, scored: ScoredSet, start: int, k: int, complete, rows, draft_scores,
                budget: SearchBudget) -> SearchState:
    """One round: decide (:func:`round_steps`, its model calls answered by ``rows(prefixes,
    lengths)``) and, unless the search stops, score the new sequences (and fetch the rows it asks
    for) in ONE target call (``scored`` grows; ``draft_scores(seqs) -> float[N]`` gives their
    draft log-probs, NaN when unknown; None: computed only where read, see
    :meth:`~jaxrescore.rescore.scored.ScoredSet.answer_drafts`)."""
    proof, new, width, fetch, check = run(round_steps(scored, start, k, complete, budget, state.rounds, state.width,
                                                      state.adaptive, state.aim), rows)
    if new is None:
        return state._replace(proof=proof, stopped=True)
    report(f"round {state.rounds + 1} of at most {budget.max_rounds}: scoring {len(new)} new sequences "
           f"({len(scored)} scored so far)")
    scored.add(new, None if draft_scores is None else draft_scores(new), np.full(len(new), -1), fetch=fetch,
               check=check)
    return state._replace(proof=proof, rounds=state.rounds + 1, width=width)


def prove_search(scored: ScoredSet, start: int, k: int, complete, rows, draft_scores, budget: SearchBudget,
                 width: float = math.inf, rounds: int = 1, adaptive: bool = True,
                 aim: float = -math.inf) -> SearchState:
    """Grow ``scored`` until the slice ``[start, start + k)`` is proven or the budget runs out
    (see :func:`search_step`); ``width``: the exits the first round may open
    (:func:`first_width`), adapted each round (:func:`adapt_width`) or, without ``adaptive``,
    doubled; ``rounds``: scoring rounds already made; ``aim``: the draft's expected worst
    answer (see :func:`round_steps`'s ``predicted``). A search that stops with its answer on
    cached numbers (:meth:`~jaxrescore.rescore.scored.ScoredSet.unchecked`) checks them by a full
    forward in a call of its own (whatever the budget: no verdict or returned score rests on
    them otherwise) and decides again. Returns the final state."""
    state = SearchState(None, rounds, width, adaptive=adaptive, aim=aim)
    while not state.stopped:
        state = search_step(state, scored, start, k, complete, rows, draft_scores, budget)
        if state.stopped and scored.check(start + k - 1):
            state = state._replace(rounds=state.rounds + 1, stopped=False)
    return state


def grow_until_certified(q: Query, draft: DraftView, pull: DraftPull, scored: ScoredSet,
                         budget: SearchBudget, decide: Callable) -> tuple[DraftPull, int]:
    """Grow the pulled head until the gap certificate can no longer improve: each round the core
    decides (``decide(scored, bound) -> (certified, why, worst)`` for ``q`` over every
    scored row) and, while it answers "does not clear", the head is pulled to a size whose bound
    is low enough for the current worst score (a wider pull only raises the worst score, so one
    round usually suffices). Returns the final pull and the scoring rounds made."""
    rounds = 1
    while rounds < budget.max_rounds and not budget.out_of_time():
        bound = draft.bound(len(pull.seqs), pull)
        code, why, worst = decide(scored, bound)
        if code != CERT_FALSE or why != WHY_SHORT_OF or not math.isfinite(bound.value):
            break  # certified, or a wider pull cannot help
        size = draft.pull_size(worst - q.gap - scored.tolerance, len(pull.seqs) + 1, budget.max_sequences)
        if size is None:
            break
        pull = draft.pull(size)
        new = scored.new(pull.seqs)
        where = {s: i for i, s in enumerate(pull.seqs)}
        scored.add(new, pull.draft_lps[[where[s] for s in new]], [where[s] for s in new],
                   check=ride_along(scored, q.start + q.k - 1))
        rounds += 1
    return pull, rounds


def _open_prefixes(scored: ScoredSet, front: Frontier, start: int, k: int, limit: int):
    """``(prefixes, values float64[P], rest, n_open)``: the ``p + t`` prefixes of the best
    ``limit`` open exits whose token is named and their exact target log-probs, likeliest first,
    the nodes ``p`` (likeliest first) whose open exit is a top-m "rest" (every token the forward
    did not name: only the node's full row resolves it), each mapped to that exit's bound, and
    how many named exits are open in all."""
    worst = kth_best(scored.target_lps, start + k - 1)
    ex = front.exits
    is_open = ~clears(worst, ex.value, scored.tolerance)
    order = np.argsort(-ex.value[is_open], kind="stable")
    seq, depth, token = (a[is_open][order] for a in (ex.seq, ex.depth, ex.token))
    tokens = scored.arrays().tokens

    def prefixes(at):  # the prefixes of exits ``at``: rows read as Python ints in one go
        rows = tokens[np.maximum(seq[at], 0)].tolist()
        return [tuple(row[:d]) if s >= 0 else () for row, d, s in zip(rows, depth[at].tolist(), seq[at].tolist())]

    value = ex.value[is_open][order]
    rest: dict = {}  # node -> its best open "rest" exit's value (the first seen: likeliest first)
    at_rest = np.flatnonzero(token == REST)
    for p, v in zip(prefixes(at_rest), value[at_rest].tolist()):
        rest.setdefault(p, v)
    # A COMPLETE exit is its prefix itself, a whole sequence: its completion is itself.
    named = np.flatnonzero(token != REST)
    best = named[: max(limit, 0)]
    return ([p + ((t,) if t != COMPLETE else ()) for p, t in zip(prefixes(best), token[best].tolist())],
            value[best], rest, named.size)
