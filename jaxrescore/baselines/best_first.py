"""Exact best-first search over one model: the baseline that needs no draft.

Every prefix's log-prob bounds all its completions (later steps cost >= 0 nats), so expanding
prefixes best first and stopping when the ``k``-th best complete sequence found scores at least
as high as every unexpanded prefix gives the model's exact top-k. Batched: each call expands the
``batch`` best open prefixes in ONE ``next_logprobs`` call, so the cost is ``calls`` sequential
model calls and ``forwards`` prefix rows, what the speculative search is measured against.

A model that decodes incrementally (see :mod:`jaxrescore.models.decoding`) expands through one
:class:`~jaxrescore.models.decoding.DecodingSession` for the whole search: every expanded prefix's
parent was expanded before, so (while its cache is held) a row costs one token position.
"""

from __future__ import annotations

import heapq
from typing import NamedTuple

import numpy as np

from jaxrescore._checks import check_int
from jaxrescore.models.decoding import incremental


class BestFirstResult(NamedTuple):
    """``items``: the top-k ``(sequence, log_prob)`` pairs, best first (log-probs summed from the
    model's ``next_logprobs`` rows, float64); ``forwards``: prefix rows evaluated; ``calls``:
    batched model calls."""

    items: list
    forwards: int
    calls: int


def best_first_top_k(model, k: int, *, batch: int | None = None) -> BestFirstResult:
    """The exact top-``k`` sequences of ``model`` by batched best-first search.

    Args:
      model: an AutoregressiveEnumerable (``vocab_size``, ``eos``, ``max_len``, batched
        ``next_logprobs``).
      k: sequences to find, an integer >= 1.
      batch: prefixes expanded per call (default ``k``): larger means fewer sequential calls and
        more rows evaluated beyond what the proof needs.
    """
    k = check_int(k, "k", minimum=1)
    batch = k if batch is None else check_int(batch, "batch", minimum=1)
    model = incremental(model)
    eos, max_len = model.eos, int(model.max_len)
    open_ = [(-0.0, ())]  # (negated log-prob, prefix): a max-heap by log-prob
    best: list = []  # min-heap of (log_prob, sequence): the k best complete sequences so far
    forwards = calls = 0
    while open_:
        kth = best[0][0] if len(best) >= k else -np.inf
        if -open_[0][0] <= kth:
            break  # no open prefix can beat the k-th best complete sequence
        take = [heapq.heappop(open_) for _ in range(min(batch, len(open_)))]
        take = [(s, p) for s, p in take if -s > kth]
        prefixes = [p for _, p in take]
        rows = _rows(model, prefixes)
        forwards += len(prefixes)
        calls += 1
        for (neg, prefix), row in zip(take, rows):
            _expand(prefix, -neg, row, eos, max_len, k, best, open_)
    items = sorted(((s, lp) for lp, s in best), key=lambda x: -x[1])
    return BestFirstResult(items, forwards, calls)


def _rows(model, prefixes: list) -> np.ndarray:
    width = max(1, max(len(p) for p in prefixes))
    toks = np.zeros((len(prefixes), width), np.int32)
    for i, p in enumerate(prefixes):
        toks[i, : len(p)] = p
    lens = np.array([len(p) for p in prefixes], np.int32)
    return np.minimum(np.asarray(model.next_logprobs(toks, lens), np.float64), 0.0)


def _expand(prefix, score, row, eos, max_len, k, best, open_) -> None:
    """Children of ``prefix``: complete ones into ``best`` (kept to k), live ones onto ``open_``."""
    n = len(prefix) + 1
    tokens = np.arange(row.size)
    if eos is not None and n == max_len:
        tokens = tokens[tokens == eos]  # only eos leads into the support at the last position
    for t in tokens[np.isfinite(row[tokens])]:
        lp = score + float(row[t])
        seq = prefix + (int(t),)
        if (eos is not None and t == eos) or (eos is None and n == max_len):
            if len(best) < k:
                heapq.heappush(best, (lp, seq))
            elif lp > best[0][0]:
                heapq.heapreplace(best, (lp, seq))
        elif len(best) < k or lp > best[0][0]:
            heapq.heappush(open_, (-lp, seq))
