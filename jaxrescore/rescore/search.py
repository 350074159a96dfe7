"""Speculative exact search: grow a scored set until the frontier bound proves the answer.

Each round (see DESIGN.md §4b):

1. the frontier of the scored set gives every exit (p, t) with its bound ``target(p) + log
   p_target(t | p)``; the exits whose bound does not clear the current answer's worst score by
   the target's tolerance are *open*;
2. open exits whose token the forward's top-m does not name get their node's full target row
   (one batched ``next_logprobs`` call), which turns them into named exits;
3. the DRAFT completes the best open exits' prefixes ``p + t`` greedily (batched across exits,
   one draft call per step) — the draft speculates paths. A round opens at most a width of
   exits, the best by bound (``search_width`` times k at first, doubling every round), and a
   path of a terminating target stops where its estimate (the exit's exact value plus the draft's
   log-probs after it) falls below the current worst answer: it is closed with ``eos``, so its
   forward still gives the target's distribution after its last token and the node becomes a
   live prefix with exact exits (see :func:`greedy_complete`);
4. the target scores only the new sequences in ONE batched teacher-forcing call, which verifies
   every position of every speculated path at once (speculative decoding's trick, applied to
   exact search), and the loop repeats.

None of this policy touches soundness: the proof is the frontier bound over whatever was scored.
A new node's exits are worth at most its parent exit's bound, and every round adds a node per
opened exit, so the loop ends on any finite support; ``max_rounds`` and ``max_sequences`` bound
it in practice. The answer is then proven, or returned with the reason it is not.
"""

from __future__ import annotations

import inspect
import math
from typing import Any, NamedTuple

import numpy as np

from jaxrescore.models.base import Structure
from jaxrescore.rescore.frontier import COMPLETE, REST, Frontier, clears, frontier
from jaxrescore.rescore.scored import ScoredSet
from jaxrescore.sequences import from_tuples


class Proof(NamedTuple):
    """A frontier verdict: ``proven`` (None: the target gives no distributions), the frontier
    bound (None when unavailable), the worst returned score it was checked against, and why."""

    proven: bool | None
    frontier_bound: float | None
    reason: str


def kth_best(scores: np.ndarray, rank: int) -> float:
    """The score at 0-based target ``rank`` among ``scores`` (-inf when there are fewer)."""
    if rank < 0:
        return np.inf
    if scores.size <= rank:
        return -np.inf
    return float(-np.partition(-scores, rank)[rank])


def check_proof(scored: ScoredSet, n: int, start: int, k: int, front: Frontier | None = None) -> tuple[Proof, Frontier | None]:
    """Whether the target's top ``[start, start + k)`` among the first ``n`` scored sequences is
    its exact answer over the whole support."""
    if not scored.proves:
        return Proof(None, None, "the target gives no next-token distributions (no score_frontier)"), None
    worst = kth_best(scored.target_lps[:n], start + k - 1)
    if front is None:
        front = frontier(scored.arrays(n), scored.structure, floor=_open_floor(worst, scored.tolerance))
    if start < 0:
        return Proof(False, front.bound, "a negative start asks for ranks that do not exist"), front
    bound = front.bound
    if not front.moved <= scored.tolerance:
        return Proof(False, bound, (
            f"the target's numbers for one prefix moved by {front.moved:.6g} nats between forwards, "
            f"more than its score tolerance {scored.tolerance:g}: no proof rests on them (raise the "
            "target's score_tolerance if that noise is expected)")), front
    if bound == -np.inf:
        return Proof(True, bound, f"the {n} scored sequences are the target's whole support"), front
    if worst == -np.inf:
        return Proof(False, bound, f"fewer than start + k = {start + k} scored sequences are in the target's support"), front
    ok = clears(worst, bound, scored.tolerance)
    verb = "clears" if ok else "does not clear"
    return Proof(
        ok,
        bound,
        f"worst returned target log-prob {worst:.6g} {verb} the frontier bound {bound:.6g} + the "
        f"target's score tolerance {scored.tolerance:g}",
    ), front


def _open_floor(worst: float, tolerance: float) -> float:
    """A score below every exit that ``worst`` could fail to clear (see :func:`clears`, whose
    float64 slack this exceeds), so exits below it can be left out: ``-inf`` unless finite."""
    if not np.isfinite(worst):
        return -np.inf
    return worst - tolerance - 1e-9 * (1.0 + abs(worst) + tolerance)


def completion_model(draft_index: Any, draft_model: Any, target: Any):
    """The model that completes exit prefixes: ``draft_model`` if given, else the draft index's
    own model when it has the batched protocol (``next_logprobs(prefixes, lengths)``) or the
    reference library's per-prefix form (wrapped in a CallableModel), else None.

    A model that is not one of this library's is checked where it enters (its protocol
    attributes now, every row block it returns later; see :mod:`jaxrescore.models.checked`),
    so a bad ``draft_model`` raises a ValueError naming it here. A model shorter than a target
    that has ``next_logprobs`` is continued by the target past its ``max_len`` (completions are
    speculation only: the target scores every one)."""
    from jaxrescore.models.checked import ContinuedModel, checked_model

    what = "draft_model" if draft_model is not None else "draft_index.model"
    model = draft_model if draft_model is not None else getattr(draft_index, "model", None)
    fn = getattr(model, "next_logprobs", None)
    if model is None or not callable(fn):
        if draft_model is not None:
            raise TypeError(
                f"draft_model must have next_logprobs(prefixes, lengths) (or the per-prefix "
                f"next_logprobs(prefix)), got {type(draft_model).__name__}"
            )
        return None
    try:
        arity = len([p for p in inspect.signature(fn).parameters.values() if p.default is p.empty])
    except (TypeError, ValueError):
        arity = 2
    if arity >= 2 and hasattr(model, "vocab_size") and hasattr(model, "max_len"):
        model = checked_model(model, what)
    elif arity == 1:
        from jaxrescore.models.callable import CallableModel

        max_len = getattr(model, "max_len", None) or getattr(target, "max_len")
        model = CallableModel(fn, max_len=max_len, eos=getattr(model, "eos", None))
    else:
        return None
    target_len = getattr(target, "max_len", None)
    if (
        isinstance(target_len, int)
        and callable(getattr(target, "next_logprobs", None))
        and int(model.max_len) < target_len
    ):
        model = ContinuedModel(model, target)
    return model


def greedy_complete(model, prefixes: list, structure: Structure, branch: int = 1, values=None, floor: float = -np.inf) -> list:
    """Complete each prefix into a sequence of the target's support by taking the model's likeliest
    next token (batched over prefixes, one model call per step). With ``branch > 1`` the first
    step after each prefix forks into the model's ``branch`` likeliest tokens, each then completed
    greedily (a small best-first: more speculated paths per round). A terminating target's rows
    end with ``eos`` (forced at ``max_len - 1``), a fixed-length target's at ``max_len`` tokens.
    A model that decodes incrementally extends every row by one cached token position per step
    (:mod:`jaxrescore.models.decoding`).

    Speculation stops where it can no longer matter: with ``values`` (float64[P], each prefix's
    exact target log-prob) and a finite ``floor``, a row of a terminating target whose estimate
    (its prefix's value plus the model's log-probs of the tokens it added) falls below ``floor``
    is closed with ``eos`` at once. That sequence is in the support and its forward gives the
    target's distribution after the last speculated token: the node becomes a live prefix with
    exact exits instead of a long path far below the answer."""
    from jaxrescore.models.decoding import incremental

    model = incremental(model)
    eos, max_len = structure.eos, structure.max_len
    limit = min(max_len, int(getattr(model, "max_len", max_len)))
    # rows: int32[N, max_len] padded sequences and their lengths, grown one column per step
    batch = from_tuples(prefixes)
    lens = batch.lengths.astype(np.int64)
    rows = np.zeros((batch.size, max(max_len, batch.tokens.shape[1])), np.int32)
    rows[:, : batch.tokens.shape[1]] = batch.tokens  # padded with 0
    est = np.zeros(batch.size) if values is None else np.asarray(values, np.float64).reshape(batch.size).copy()
    first = True
    while True:
        alive = lens < max_len
        if eos is not None:  # a row that ended with eos is complete
            alive &= ~((lens > 0) & (rows[np.arange(lens.size), np.maximum(lens - 1, 0)] == eos))
        if eos is not None:  # the last position (or a path below floor): only eos, closing it
            at_end = alive & ((lens == max_len - 1) | (est < floor))
            rows[at_end, max_len - 1] = eos
            lens[at_end] += 1
            alive &= ~at_end
        idx = np.flatnonzero(alive)
        if idx.size == 0:
            return list(dict.fromkeys(tuple(r[:n].tolist()) for r, n in zip(rows, lens)))
        if lens[idx].max() >= limit:
            raise ValueError(
                f"the completion model (max_len={limit}) cannot extend a prefix to the target's "
                f"max_len={max_len}; pass draft_model= a model as long as the target"
            )
        width = max(1, int(lens[idx].max()))
        lp = np.asarray(model.next_logprobs(rows[idx, :width], lens[idx].astype(np.int32)), np.float64)
        lp = np.where(np.isnan(lp), -np.inf, lp)
        if structure.vocab_size is not None and lp.shape[1] > structure.vocab_size:
            lp[:, structure.vocab_size :] = -np.inf  # a token the target does not have ends no path
        if first and branch > 1:
            order = np.argsort(-lp, axis=1, kind="stable")[:, :branch]
            # forks: each alive row's 2nd..branch-th likeliest finite tokens, as new rows at the end
            j, c = np.nonzero(np.isfinite(np.take_along_axis(lp, order[:, 1:], axis=1)))
            forks = rows[idx[j]]
            forks[np.arange(j.size), lens[idx[j]]] = order[j, c + 1]
            best = order[:, 0]
        else:
            j, forks, best = np.zeros(0, np.int64), rows[:0], np.argmax(lp, axis=1)  # first max, as the stable sort
        rows[idx, lens[idx]] = best
        fork_lens = lens[idx[j]] + 1
        fork_est = est[idx[j]] + lp[j, order[j, c + 1]] if j.size else est[:0]
        est[idx] += lp[np.arange(idx.size), best]
        lens[idx] += 1
        rows, lens = np.concatenate([rows, forks]), np.concatenate([lens, fork_lens])
        est = np.concatenate([est, fork_est])
        first = False


class SearchBudget(NamedTuple):
    """Limits of one search: scoring rounds (target calls that score sequences) and target
    sequences in all."""

    max_rounds: int
    max_sequences: int


# The default first width, times k (RescoredIndex(search_width=...)); the width doubles every
# round, so a search needs a number of rounds logarithmic in the exits its proof needs, and at
# most about half of what it opens comes from its last round. The trade-off between calls and
# positions is measured in BENCHMARKS.md ("search width", benchmarks/bench_search_width.py).
SEARCH_WIDTH = 8


def first_width(search_width: int | None, k: int) -> float:
    """Exits the first round may open: ``search_width * k``, or every open exit (``inf``)."""
    return math.inf if search_width is None else float(search_width * k)


def next_round(scored: ScoredSet, start: int, k: int, complete, budget: SearchBudget, rounds: int,
               width: float = math.inf):
    """``(proof, new, next_width)``: the verdict on ``scored`` now, the new sequences the next
    round should score (None when the search stops: proven, no proof possible, or the budget is
    spent), opening at most ``width`` exits (the best by bound), and the next round's width
    (twice this one). May fetch full target rows for "rest" exits (one call, counted by
    ``scored``).

    Args:
      scored: what the search has scored so far.
      start, k: the slice ``[start, start + k)`` to prove.
      complete: ``complete(prefixes, values, floor) -> sequences``, the speculated completions of
        exit prefixes (``values``: their exact target log-probs; a path whose estimate falls
        below ``floor``, the current worst answer, may stop early, see :func:`greedy_complete`).
      budget: the search's limits; ``rounds``: scoring rounds made so far.
      width: exits this round may open (see :func:`first_width`).
    """
    proof, front = check_proof(scored, len(scored), start, k)
    if proof.proven is not False or start < 0 or not front.moved <= scored.tolerance:
        return proof, None, width
    if rounds >= budget.max_rounds:
        return proof._replace(reason=f"{proof.reason}; stopped at max_rounds={budget.max_rounds}"), None, width
    # The budget counts everything the target evaluated: scored sequences and fetched rows.
    room = budget.max_sequences - scored.sequences
    spent = proof._replace(reason=f"{proof.reason}; stopped at max_sequences={budget.max_sequences}")
    if room <= 0:
        return spent, None, width
    opened = _open_prefixes(scored, front, start, k, fetch=room)
    if opened is None:  # full rows were fetched: recompute before completing
        proof, front = check_proof(scored, len(scored), start, k)
        if proof.proven is not False:
            return proof, None, width
        room = budget.max_sequences - scored.sequences
        if room <= 0:
            return proof._replace(reason=f"{proof.reason}; stopped at max_sequences={budget.max_sequences}"), None, width
        opened = _open_prefixes(scored, front, start, k, fetch=0)
    prefixes, values = opened
    worst = kth_best(scored.target_lps, start + k - 1)
    take = int(min(room, width))
    new = scored.new(complete(prefixes[:take], values[:take], _open_floor(worst, scored.tolerance)))[:room]
    if not new:
        return proof._replace(reason=f"{proof.reason}; the search found nothing new"), None, width
    return proof, new, 2 * width


def prove_search(scored: ScoredSet, start: int, k: int, complete, draft_scores, budget: SearchBudget,
                 width: float = math.inf):
    """Grow ``scored`` until the slice ``[start, start + k)`` is proven or the budget runs out,
    one batched target call per round (see :func:`next_round`); ``draft_scores(seqs) -> float[N]``
    gives the new sequences' draft log-probs (NaN when unknown); ``width``: the exits the first
    round may open (:func:`first_width`).

    Returns:
      ``(Proof, rounds)``: the final verdict and the scoring rounds made (the head's included).
    """
    rounds = 1
    while True:
        proof, new, width = next_round(scored, start, k, complete, budget, rounds, width)
        if new is None:
            return proof, rounds
        scored.add(new, draft_scores(new), np.full(len(new), -1))
        rounds += 1


def _open_prefixes(scored: ScoredSet, front: Frontier, start: int, k: int, *, fetch: int = 0):
    """``(prefixes, values float64[P])``: the ``p + t`` prefixes of the open exits and their
    exact target log-probs, likeliest first; or None after fetching the full rows of (at most
    ``fetch``, the likeliest) nodes whose open exit is a top-m "rest"."""
    worst = kth_best(scored.target_lps, start + k - 1)
    ex = front.exits
    is_open = ~clears(worst, ex.value, scored.tolerance)
    order = np.argsort(-ex.value[is_open], kind="stable")
    seq, depth, token = (a[is_open][order] for a in (ex.seq, ex.depth, ex.token))
    arrays = scored.arrays()

    def prefix(e):
        return tuple(int(t) for t in arrays.tokens[seq[e], : depth[e]]) if seq[e] >= 0 else ()

    rest = np.flatnonzero(token == REST)
    if fetch > 0 and rest.size:
        scored.fetch_rows(list(dict.fromkeys(prefix(e) for e in rest))[:fetch])
        return None
    # A COMPLETE exit is its prefix itself, a whole sequence: its completion is itself.
    named = np.flatnonzero(token != REST)
    value = ex.value[is_open][order]
    return [prefix(e) + ((int(token[e]),) if token[e] != COMPLETE else ()) for e in named], value[named]
