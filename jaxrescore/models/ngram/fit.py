"""Fitting an interpolated Kneser-Ney n-gram model (Chen & Goodman) from a corpus.

For a context ``h`` of ``k`` tokens:

    P_k(w | h) = max(c_k(h w) - D_k, 0) / c_k(h .)  +  gamma(h) * P_{k-1}(w | h'),

where ``h'`` drops the oldest token of ``h``, ``gamma(h)`` is the mass the discounts freed
(``D_k * N1+(h .) / c_k(h .)`` when every count is at least ``D_k``), ``c_{order-1}`` are the
(weighted) n-gram counts and lower orders use continuation counts (the number of distinct tokens
seen to the left). ``P_{-1}`` is uniform over the ``V`` tokens, so every log-prob is finite. A
context never seen at order ``k`` backs off to ``P_{k-1}``. Contexts are left-padded with a BOS
symbol (id ``V``), so sequence starts are their own contexts. Counting is vectorised numpy: a few
sorts per order.
"""

from __future__ import annotations

import numpy as np

from jaxrescore._checks import check_float, check_int
from jaxrescore.models.checks import check_eos_terminated, check_tokens, check_weights
from jaxrescore.models.ngram.tables import NGramLevel
from jaxrescore.sequences import SequenceBatch, as_sequence_batch

# The longest n-gram order fit accepts.
MAX_ORDER = 16


def _discount(counts: np.ndarray, discount) -> float:
    if discount is not None:
        return float(discount)
    # Ney's estimate D = n1 / (n1 + 2 n2) from the counts-of-counts of this order.
    n1 = np.count_nonzero(np.isclose(counts, 1.0))
    n2 = np.count_nonzero(np.isclose(counts, 2.0))
    return n1 / (n1 + 2 * n2) if n1 and n2 else 0.75


def fit_levels(batch: SequenceBatch, w: np.ndarray, order: int, v: int, discount: float | None) -> tuple[list, list]:
    """The levels and per-order discounts of a checked corpus (see :func:`check_corpus`):
    ``batch`` of ``N`` sequences with weights ``w: float64[N]``, ``v`` tokens."""
    k_top = order - 1
    n, t = batch.tokens.shape
    padded = np.full((n, k_top + t), v, np.int64)
    padded[:, k_top:] = np.where(batch.mask, batch.tokens, 0)
    width = padded.shape[1]
    cols = np.arange(width)[None, :]
    valid = cols < (k_top + batch.lengths)[:, None]
    real = valid & (cols >= k_top) & (w[:, None] > 0)

    # Window ids: a window of length j ending at a cell is (its suffix window of length j-1,
    # its oldest token); ids number the distinct keys in sorted order, so ids stay small.
    wid = [np.zeros((n, width), np.int64)]  # length 0: the one empty window
    suffix, oldest = [None], [None]
    for j in range(1, order + 1):
        ids = np.full((n, width), -1, np.int64)
        cells = valid & (cols >= j - 1)
        r, c = np.nonzero(cells)
        key = wid[j - 1][r, c] * (v + 1) + padded[r, c - j + 1]
        uniq, inv = np.unique(key, return_inverse=True)
        ids[r, c] = inv
        wid.append(ids)
        suffix.append(uniq // (v + 1))
        oldest.append(uniq % (v + 1))

    # n-grams ending at real cells (the top order), then continuation counts below.
    r, c = np.nonzero(real)
    grams, first, inv = np.unique(wid[order][r, c], return_index=True, return_inverse=True)
    counts = np.bincount(inv.reshape(-1), w[r])
    ctx_of = wid[order - 1][r[first], c[first] - 1]  # the n-gram's first n-1 tokens
    word = padded[r[first], c[first]]
    per_len = [None] * order  # per context length k: (ctx window ids, words, counts)
    per_len[k_top] = (ctx_of, word, counts, grams)
    # every window's context and last token, from one occurrence (for the lower orders)
    for k in range(k_top - 1, -1, -1):
        up_grams = per_len[k + 1][3]
        lower, cont = np.unique(suffix[k + 2][up_grams], return_counts=True)
        j = k + 1  # the lower n-grams are windows of length j
        rr, cc = np.nonzero(wid[j] >= 0)
        ids = wid[j][rr, cc]
        pick = np.full(suffix[j].size, -1, np.int64)
        pick[ids] = np.arange(ids.size)  # one occurrence per window id
        at = pick[lower]
        ctx = wid[j - 1][rr[at], cc[at] - 1] if j > 1 else np.zeros(lower.size, np.int64)
        per_len[k] = (ctx, padded[rr[at], cc[at]], cont.astype(np.float64), lower)

    levels, discounts = [], []
    prev_ctx = None  # window ids (length k-1) of the previous level's contexts, sorted
    for k in range(order):
        ctx_w, words, cnt, _ = per_len[k]
        d = _discount(cnt, discount)
        uctx, cinv = np.unique(ctx_w, return_inverse=True)
        total = np.bincount(cinv, cnt, minlength=uctx.size)
        kept = np.maximum(cnt - d, 0.0) / total[cinv]
        gamma = 1.0 - np.bincount(cinv, kept, minlength=uctx.size)
        order_terms = np.lexsort((words, cinv))
        keep = order_terms[kept[order_terms] > 0]
        ptr = np.zeros(uctx.size + 1, np.int64)
        np.cumsum(np.bincount(cinv[keep], minlength=uctx.size), out=ptr[1:])
        if k == 0:
            keys = np.zeros(1, np.int64)
        else:
            # a seen context's suffix is a seen context one order down (it has a continuation)
            sidx = np.searchsorted(prev_ctx, suffix[k][uctx])
            keys = sidx * (v + 1) + oldest[k][uctx]
        levels.append(NGramLevel(keys, gamma, ptr, words[keep].astype(np.int32), kept[keep]))
        discounts.append(d)
        prev_ctx = uctx
    return levels, discounts


def check_corpus(sequences, order, vocab_size, eos, max_len, discount, weights):
    """``fit``'s arguments checked: ``(batch, weights float64[N], order, vocab_size, eos,
    max_len)``, the corpus a batch in the support and ``max_len`` by default the longest sequence;
    ValueError naming the argument."""
    order = check_int(order, "order", minimum=1, maximum=MAX_ORDER + 1)
    vocab_size = check_int(vocab_size, "vocab_size", minimum=1)
    eos = check_int(eos, "eos", minimum=0, maximum=vocab_size, allow_none=True)
    max_len = check_int(max_len, "max_len", minimum=1, allow_none=True)
    # D = 0 would leave no back-off mass: unseen n-grams would get probability 0
    if check_float(discount, "discount", minimum=0.0, maximum=1.0, allow_none=True) == 0.0:
        raise ValueError("discount must be a number in (0, 1] or None, got 0")
    batch = as_sequence_batch(sequences)
    if batch.size == 0:
        raise ValueError("sequences is empty; fitting needs at least one sequence")
    longest = int(batch.lengths.max())
    max_len = longest if max_len is None else max_len
    check_tokens(batch, vocab_size, max_len, what="sequences")
    if eos is None:
        wrong = np.flatnonzero(batch.lengths != max_len)
        if wrong.size:
            raise ValueError(
                f"sequences[{wrong[0]}] has length {batch.lengths[wrong[0]]}; a fixed-length model "
                f"(eos=None) needs every sequence to have max_len={max_len} tokens"
            )
    else:
        check_eos_terminated(batch, eos, "sequences")
    return batch, check_weights(weights, batch.size), order, vocab_size, eos, max_len

