"""Exact best-first search over one model: the baseline that needs no draft.

Every prefix's log-prob bounds all its completions (later steps cost >= 0 nats), so expanding
prefixes best first and stopping when the ``k``-th best complete sequence found scores at least
as high as every unexpanded prefix gives the model's exact top-k. Batched: each call expands the
``batch`` best open prefixes in ONE ``next_logprobs`` call, so the cost is ``calls`` sequential
model calls and ``forwards`` prefix rows, what the speculative search is measured against.

A model that decodes incrementally (see :mod:`jaxrescore.models.decoding`) expands through one
:class:`~jaxrescore.models.decoding.DecodingSession` for the whole search: every expanded prefix's
parent was expanded before, so (while its cache is held) a row costs one token position.

The host work per expanded row is a few numpy passes over it, not one step per token: a child at
or below the k-th best complete score is dropped (that score only rises, so it could never be
expanded), the others are sorted once and enter the open heap one at a time (a child's next
sibling is pushed when it pops). Prefixes pop in the order a heap of every child would give, so
the expanded prefixes, ``forwards`` and ``calls`` are those of pushing every child.
"""

from __future__ import annotations

import heapq
import time
from typing import NamedTuple

import numpy as np

from jaxrescore._checks import check_float, check_int
from jaxrescore.models.decoding import incremental
from jaxrescore.models.lockstep import run


class BestFirstResult(NamedTuple):
    """``items``: the top-k ``(sequence, log_prob)`` pairs, best first (log-probs summed from the
    model's ``next_logprobs`` rows, float64); ``forwards``: prefix rows evaluated; ``calls``:
    batched model calls; ``exact``: False when ``max_forwards`` or ``max_seconds`` stopped the
    search with a prefix still open that could beat the k-th item (the items are then the best
    complete sequences found, possibly fewer than k)."""

    items: list
    forwards: int
    calls: int
    exact: bool = True


def best_first_top_k(model, k: int, *, batch: int | None = None, max_forwards: int | None = None,
                     max_seconds: float | None = None) -> BestFirstResult:
    """The exact top-``k`` sequences of ``model`` by batched best-first search.

    Ties: open prefixes of equal log-prob expand in Python's tuple order; a complete sequence
    displaces the worst one held only when strictly better (of equal worst ones, the smallest
    tuple goes first); equally scored items come out in no promised order.

    Args:
      model: an AutoregressiveEnumerable (``vocab_size``, ``eos``, ``max_len``, batched
        ``next_logprobs``).
      k: sequences to find, an integer >= 1.
      batch: prefixes expanded per call (default ``k``): larger means fewer sequential calls and
        more rows evaluated beyond what the proof needs.
      max_forwards: stop before a call that would take the prefix rows evaluated past it (None:
        no limit); the result is then not ``exact``.
      max_seconds: stop before a call once that many seconds have passed (None: no limit); the
        result is then not ``exact``.
    """
    k = check_int(k, "k", minimum=1)
    batch = k if batch is None else check_int(batch, "batch", minimum=1)
    limit = None if max_forwards is None else check_int(max_forwards, "max_forwards", minimum=1)
    seconds = check_float(max_seconds, "max_seconds", minimum=0.0, allow_none=True, unit="seconds")
    model = incremental(model)
    return run(best_first_steps(k, model.eos, int(model.max_len), batch, limit, seconds), model.next_logprobs)


def best_first_steps(k: int, eos: int | None, max_len: int, batch: int, max_forwards: int | None = None,
                     max_seconds: float | None = None):
    """:func:`best_first_top_k` of a model of ``eos`` and ``max_len`` (arguments checked) as a
    generator of its calls (see :mod:`jaxrescore.models.lockstep`): it yields ``(prefixes
    int32[B, T], lengths int32[B])``, is sent the model's rows ``float[B, V]`` and returns the
    :class:`BestFirstResult`."""
    deadline = None if max_seconds is None else time.monotonic() + max_seconds
    # (negated log-prob, prefix, its _Children, its index there): a max-heap by log-prob holding
    # each expanded row's best child not yet popped (the next one is pushed when it pops).
    open_: list = [(-0.0, (), None, 0)]
    best: list = []  # min-heap of (log_prob, sequence): the k best complete sequences so far
    forwards = calls = 0
    exact = True
    while open_:
        kth = best[0][0] if len(best) >= k else -np.inf
        if -open_[0][0] <= kth:
            break  # no open prefix can beat the k-th best complete sequence
        if max_forwards is not None and forwards >= max_forwards or deadline is not None and time.monotonic() >= deadline:
            exact = False
            break
        take = _pop(open_, batch, kth)
        if max_forwards is not None and forwards + len(take) > max_forwards:
            take, exact = take[: max_forwards - forwards], False  # the rest popped is dropped: not exact
        rows = np.minimum(np.asarray((yield _request([p for _, p in take])), np.float64), 0.0)
        forwards += len(take)
        calls += 1
        for (score, prefix), row in zip(take, rows):
            _expand(prefix, score, row, eos, max_len, k, best, open_)
    items = sorted(((s, lp) for lp, s in best), key=lambda x: -x[1])
    return BestFirstResult(items, forwards, calls, exact)


class _Children(NamedTuple):
    """One expanded row's live children that may still matter, best first (ties by token):
    ``tokens[int]``, ``log_probs[float64]`` (the prefix's score included)."""

    prefix: tuple
    tokens: np.ndarray
    log_probs: np.ndarray


def _push(open_: list, kids: _Children, i: int) -> None:
    heapq.heappush(open_, (-float(kids.log_probs[i]), kids.prefix + (int(kids.tokens[i]),), kids, i))


def _pop(open_: list, batch: int, kth: float) -> list:
    """Up to ``batch`` ``(log_prob, prefix)`` pairs above ``kth``, best first: each popped child
    pushes its next sibling first, so the order is the one of a heap holding every child."""
    take = []
    while open_ and len(take) < batch and -open_[0][0] > kth:
        neg, prefix, kids, i = heapq.heappop(open_)
        if kids is not None and i + 1 < kids.tokens.size:
            _push(open_, kids, i + 1)
        take.append((-neg, prefix))
    return take


def _request(prefixes: list) -> tuple:
    """``(int32[B, T] padded prefixes, int32[B] lengths)``."""
    width = max(1, max(len(p) for p in prefixes))
    toks = np.zeros((len(prefixes), width), np.int32)
    for i, p in enumerate(prefixes):
        toks[i, : len(p)] = p
    return toks, np.array([len(p) for p in prefixes], np.int32)


def _expand(prefix, score, row, eos, max_len, k, best, open_) -> None:
    """Children of ``prefix``: complete ones into ``best`` (kept to k), live ones that beat its
    k-th score onto ``open_`` (lazily, best first)."""
    n = len(prefix) + 1
    lps = score + row
    finite = np.isfinite(row)
    if eos is None:
        complete = finite if n == max_len else np.zeros_like(finite)
    else:
        complete = np.zeros_like(finite)
        complete[eos] = finite[eos]
    _offer(best, k, prefix, lps, np.flatnonzero(complete))
    if n == max_len:
        return  # every child at the last position is complete or out of the support
    kth = best[0][0] if len(best) >= k else -np.inf
    # A child at or below the k-th best complete score is never expanded: that score only rises.
    tokens = np.flatnonzero(finite & ~complete & (lps > kth))
    if tokens.size:
        order = np.argsort(-lps[tokens], kind="stable")  # stable: ties by token, as tuples compare
        _push(open_, _Children(prefix, tokens[order], lps[tokens][order]), 0)


def _offer(best: list, k: int, prefix: tuple, lps: np.ndarray, tokens: np.ndarray) -> None:
    """``prefix + (t,)`` for each of ``tokens`` (ascending) into ``best``: pushed while it holds
    fewer than ``k``, then replacing its worst when strictly better: the heap operations of
    offering every token one at a time, so ties resolve (and tied items come out) as they would.
    Only a token above the worst after the fill can change the heap."""
    fill = min(k - len(best), tokens.size)
    for t in tokens[:fill]:
        heapq.heappush(best, (float(lps[t]), prefix + (int(t),)))
    rest = tokens[fill:]
    if rest.size:
        rest = rest[lps[rest] > best[0][0]]
    for t in rest:
        if lps[t] > best[0][0]:
            heapq.heapreplace(best, (float(lps[t]), prefix + (int(t),)))
