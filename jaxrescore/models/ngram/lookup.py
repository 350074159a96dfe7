"""Lookups in the n-gram tables: pure functions of an :class:`NGramTables`.

A query resolves the longest seen suffix of its context order by order (``np.searchsorted``), then
sums the chain ``P = sum_k coef_k * terms_k + coef_0 * P_0`` (``coef`` the product of the gammas
above): a step's probability from a few lookups, a whole row as ``P_0`` scaled plus the sparse
terms scattered in. A cell no seen n-gram touches is ``float32(log coef_0) + float32(log P_0)``
(one add per cell of a row); a touched cell is summed in float64 and its ``log`` taken, then
float32, clipped to <= 0 — the same formula for a row and for a step, so they agree bit for bit.

``dense`` arguments are the model's cache of every seen context's row (:func:`dense_table`, None
when there is none): with it a lookup is one gather.
"""

from __future__ import annotations

import numpy as np

from jaxrescore.models.ngram.tables import NGramTables
from jaxrescore.models.scores import host_top_m
from jaxrescore.sequences import SequenceBatch

# Cells (rows x V) of dense float64 rows built at once: bounds the temporaries of a row query.
ROW_CELLS = 1 << 22
# Candidate cells of sparse row queries (next_logprobs_above) handled at once: bounds temporaries.
CANDIDATE_CELLS = 1 << 21
# Up to this many cells (contexts x V), the full float32 row of every seen context is also
# materialised once (a cache, like the dense tables of old): a lookup is then one gather.
DENSE_CELLS = 1 << 24


def _logs(p: np.ndarray) -> np.ndarray:
    """float32 ``log p`` of float64 probabilities, clipped to <= 0 (``-inf`` for 0)."""
    with np.errstate(divide="ignore"):
        return np.minimum(np.log(p), 0.0).astype(np.float32)


def _untouched_logs(coef0: np.ndarray, log_base: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """float32 ``log(coef0 * P_0)`` as ``float32(log coef0) + float32(log P_0)`` (broadcast): the
    cells no seen n-gram touches, one float32 add each (both terms are <= 0, so is the sum)."""
    with np.errstate(divide="ignore"):
        return np.add(np.log(coef0).astype(np.float32), log_base, out=out)


def _count_at_least(vals: np.ndarray, start: np.ndarray, stop: np.ndarray, x: np.ndarray) -> np.ndarray:
    """int64[b]: how many of ``vals[start[i]:stop[i]]`` (each run descending) are ``>= x[i]``: a
    binary search of every run at once."""
    lo, hi = start.copy(), stop.copy()
    while True:
        act = np.flatnonzero(lo < hi)
        if act.size == 0:
            return lo - start
        mid = (lo[act] + hi[act]) // 2
        ge = vals[mid] >= x[act]
        lo[act[ge]] = mid[ge] + 1
        hi[act[~ge]] = mid[~ge]


def _log_upper(p: np.ndarray) -> np.ndarray:
    """float32[b], at least every float32 log-prob this model computes for a probability up to
    ``p`` (float64 >= 0; its own rounding included): ``-inf`` for 0, clipped to <= 0."""
    with np.errstate(divide="ignore"):
        lg = np.log(p)
    up = lg.astype(np.float32)
    f = np.isfinite(lg)
    up[f] = np.nextafter((lg[f] + 1e-6 * (1.0 + np.abs(lg[f]))).astype(np.float32), np.float32(np.inf))
    return np.minimum(up, np.float32(0.0))


def _ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``concatenate([arange(s, s + c) for s, c in zip(starts, counts)])``, vectorised."""
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    offsets = np.cumsum(counts) - counts
    return np.repeat(starts - offsets, counts) + np.arange(total)


def context_chains(t: NGramTables, windows: np.ndarray) -> np.ndarray:
    """int64[M, order]: for context windows ``int64[M, order-1]`` (oldest first, BOS-padded),
    the index of the seen context of each length ``0..order-1`` (-1 past the longest seen)."""
    m = windows.shape[0]
    v1 = t.vocab_size + 1
    k_top = t.order - 1
    chain = np.full((m, t.order), -1, np.int64)
    chain[:, 0] = 0
    cur = np.zeros(m, np.int64)
    alive = np.ones(m, bool)
    for k in range(1, t.order):
        keys = t.levels[k].keys
        if not alive.any() or keys.size == 0:
            break
        q = cur * v1 + windows[:, k_top - k]
        idx = np.minimum(np.searchsorted(keys, q), keys.size - 1)
        alive &= keys[idx] == q
        cur = np.where(alive, idx, 0)
        chain[alive, k] = idx[alive]
    return chain

def dense_table(t: NGramTables) -> np.ndarray | None:
    """float32[contexts, V]: every seen context's row, in the order of ``t.offsets`` (None past
    ``DENSE_CELLS``): a cache the model builds once, after which a lookup is one gather."""
    if t.n_contexts * t.vocab_size > DENSE_CELLS:
        return None
    chains, prev = [], None
    for k, lv in enumerate(t.levels):
        ch = np.full((lv.keys.size, t.order), -1, np.int64)
        ch[:, k] = np.arange(lv.keys.size)
        if k:
            ch[:, :k] = prev[lv.keys // (t.vocab_size + 1), :k]
        chains.append(ch)
        prev = ch
    return sparse_rows(t, np.concatenate(chains))

def row_ids(t: NGramTables, chain: np.ndarray) -> np.ndarray:
    """int64[M]: the dense-table row of each context chain (its longest seen context)."""
    depth = (chain >= 0).sum(axis=1) - 1
    return t.offsets[depth] + chain[np.arange(chain.shape[0]), depth]

def coefs(t: NGramTables, chain: np.ndarray) -> np.ndarray:
    """float64[M, order]: the weight of each level's terms (0 past the longest seen); the
    base row's weight is column 0."""
    coef = np.zeros(chain.shape, np.float64)
    running = np.ones(chain.shape[0])
    for k in range(t.order - 1, -1, -1):
        seen = chain[:, k] >= 0
        coef[:, k] = np.where(seen, running, 0.0)
        if k > 0:
            g = t.levels[k].gamma[np.where(seen, chain[:, k], 0)]
            running = np.where(seen, running * g, running)
    return coef

def cell_logprobs(
    t: NGramTables, chain: np.ndarray, words: np.ndarray, coef: np.ndarray | None = None, dense: np.ndarray | None = None
) -> np.ndarray:
    """float32[M]: ``log P(words[i] | context i)``, each cell as :func:`sparse_rows` computes it
    (``coef``: the chains' :func:`coefs`, when known)."""
    if dense is not None:
        return dense[row_ids(t, chain), words]
    coef = coefs(t, chain) if coef is None else coef
    p = coef[:, 0] * t.base_row[words]
    touched = np.zeros(words.size, bool)
    v = t.vocab_size
    for k in range(1, t.order):
        seen = np.flatnonzero(chain[:, k] >= 0)
        ek = t.ekeys[k]
        if seen.size == 0 or ek.size == 0:
            continue
        q = chain[seen, k] * v + words[seen]
        idx = np.minimum(np.searchsorted(ek, q), ek.size - 1)
        hit = ek[idx] == q
        p[seen[hit]] += coef[seen[hit], k] * t.levels[k].val[idx[hit]]
        touched[seen[hit]] = True
    out = _untouched_logs(coef[:, 0], t.log_base[words])
    out[touched] = _logs(p[touched])
    return out

def row_logprobs(t: NGramTables, chain: np.ndarray, dense: np.ndarray | None = None) -> np.ndarray:
    """float32[M, V]: log-prob rows of the contexts ``chain``."""
    if dense is not None:
        return dense[row_ids(t, chain)]
    # Prefixes that back off to the same seen context share a row: build each one once.
    uniq, inv = np.unique(chain, axis=0, return_inverse=True)
    if uniq.shape[0] == chain.shape[0]:
        return sparse_rows(t, chain)
    return sparse_rows(t, uniq)[inv.reshape(-1)]

def touched(t: NGramTables, chain: np.ndarray, coef: np.ndarray, p: np.ndarray) -> np.ndarray:
    """Sum the cells of rows ``chain`` that some seen n-gram touches into the scratch ``p``
    (float64, flat ``row * V + token``), in the order :func:`cell_logprobs` sums them (base, then
    level by level), so a row and a step agree bit for bit. Returns their flat keys (int64[E];
    a cell recurs once per level that touches it). Cost: the touched cells, never ``V``."""
    v = t.vocab_size
    keys, adds = [], []
    for k in range(1, t.order):
        seen = np.flatnonzero(chain[:, k] >= 0)
        if seen.size == 0:
            continue
        lv = t.levels[k]
        start, stop = lv.ptr[chain[seen, k]], lv.ptr[chain[seen, k] + 1]
        idx = _ranges(start, stop - start)
        who = np.repeat(seen, stop - start)
        cells = who * v + lv.tok[idx]
        p[cells] = coef[who, 0] * t.base_row[lv.tok[idx]]
        keys.append(cells)
        adds.append(coef[who, k] * lv.val[idx])
    for cells, add in zip(keys, adds):  # level order, as _probs adds them; one term per cell a level
        p[cells] += add
    return np.concatenate(keys) if keys else np.zeros(0, np.int64)

def sparse_rows(t: NGramTables, chain: np.ndarray) -> np.ndarray:
    """:func:`row_logprobs` from the sparse levels, in blocks of ``ROW_CELLS`` cells.

    A cell no seen n-gram touches is ``P_0`` scaled: its log is ``log coef_0 + log P_0``, an
    add per cell (no ``log`` over ``V`` cells a row); the few touched cells come from
    :func:`touched`."""
    m, v = chain.shape[0], t.vocab_size
    out = np.empty((m, v), np.float32)
    per = max(1, ROW_CELLS // max(v, 1))
    p = np.empty(min(per, m) * v, np.float64)  # written (and read) only at touched cells
    for lo in range(0, m, per):
        ch = chain[lo : lo + per]
        coef = coefs(t, ch)
        block = out[lo : lo + per]
        _untouched_logs(coef[:, :1], t.log_base[None, :], out=block)
        keys = touched(t, ch, coef, p)
        block.reshape(-1)[keys] = _logs(p[keys])
    return out

def cells_above(t: NGramTables, chain: np.ndarray, thr: np.ndarray, by_value: list, dense: np.ndarray | None = None):
    """:meth:`~jaxrescore.models.NGramLM.next_logprobs_above` for context chains ``int64[M, order]``.

    A cell's probability is a sum of ``order`` components: ``coef_0 * P_0(t)`` and
    ``coef_k * term_k(t)`` per seen level. The candidates of a row are the tokens with some
    component at least ``cut = exp(threshold) / (2 * order)``: a prefix of the tokens sorted by
    ``P_0`` and of each level's terms sorted by value (:func:`terms_by_value`). Any other token has
    every component below ``cut``, so its probability is below ``left`` (the sum of each
    component's largest one left out) ``< exp(threshold) / 2``: it is never kept, and
    ``log left`` (rounded up) bounds it. Candidates get their exact log-probs from
    :func:`cell_logprobs`, the cells a row gives bit for bit. Cost per row: its candidates, never
    ``V`` and never the whole of a context's terms."""
    m, v = chain.shape[0], t.vocab_size
    coef = coefs(t, chain)
    cut = np.exp(thr.astype(np.float64)) / (2 * t.order)
    with np.errstate(divide="ignore", invalid="ignore"):
        x = np.where(coef > 0, cut[:, None] / coef, np.inf)  # per component: P_0 or term >= x
    # runs of candidates: (rows ascending, first index into source, how many, source tokens)
    n0 = np.searchsorted(t.base_neg, -x[:, 0], side="right")  # P_0 >= x, largest first
    runs = [(np.arange(m, dtype=np.int64), np.zeros(m, np.int64), n0, t.base_order)]
    left = coef[:, 0] * -t.base_neg[np.minimum(n0, v - 1)] * (n0 < v)
    for k in range(1, t.order):
        seen = np.flatnonzero(chain[:, k] >= 0)
        if seen.size == 0:
            continue
        tok_k, val_k = by_value[k]
        start, stop = t.levels[k].ptr[chain[seen, k]], t.levels[k].ptr[chain[seen, k] + 1]
        n = _count_at_least(val_k, start, stop, x[seen, k])
        runs.append((seen, start, n, tok_k))
        more = start + n < stop
        left[seen[more]] += coef[seen[more], k] * val_k[(start + n)[more]]
    rest = _log_upper(left)
    # blocks of rows holding about CANDIDATE_CELLS candidates (a shallow row of a deep budget
    # can take most of V), so the temporaries stay bounded
    per_row = sum(np.bincount(r, weights=c, minlength=m) for r, _, c, _ in runs)
    csum = np.cumsum(per_row)
    kept, lo = [], 0
    while lo < m:
        hi = max(lo + 1, int(np.searchsorted(csum, (csum[lo - 1] if lo else 0) + CANDIDATE_CELLS, side="right")))
        kept.append(block_above(t, chain, thr, coef, runs, rest, lo, min(hi, m), dense))
        lo = hi
    row, tok, val = (np.concatenate(parts) for parts in zip(*kept)) if kept else (np.zeros(0, np.int64),) * 3
    ptr = np.zeros(m + 1, np.int64)
    np.cumsum(np.bincount(row, minlength=m), out=ptr[1:])
    return ptr, tok.astype(np.int32), val.astype(np.float32), rest

def block_above(t: NGramTables, chain, thr, coef, runs, rest, lo: int, hi: int, dense: np.ndarray | None = None):
    """The kept cells ``(row, token, log-prob)`` of rows ``lo:hi`` (row-major, tokens
    ascending) from their candidate ``runs``; raises ``rest`` to the candidates left out."""
    v = t.vocab_size
    keys = []
    for rows, start, count, source in runs:
        a, b = np.searchsorted(rows, [lo, hi])
        keys.append(np.repeat(rows[a:b], count[a:b]) * v + source[_ranges(start[a:b], count[a:b])])
    keys = np.sort(np.concatenate(keys))
    keys = keys[np.concatenate([[True], keys[1:] != keys[:-1]])] if keys.size else keys  # (np.unique hashes: slower)
    row, tok = np.divmod(keys, v)
    val = cell_logprobs(t, chain[row], tok, coef[row], dense)
    above = val >= thr[row]
    np.maximum.at(rest, row[~above], val[~above])
    keep = above & np.isfinite(val)
    return row[keep], tok[keep], val[keep]

def terms_by_value(t: NGramTables) -> list:
    """Per context length ``k >= 1``: each context's terms by value, largest first, as
    ``(tok int32[E], val float64[E])`` in the level's CSR layout (the model builds it once)."""
    out = [None]
    for lv in t.levels[1:]:
        order = np.lexsort((-lv.val, np.repeat(np.arange(lv.keys.size), np.diff(lv.ptr))))
        out.append((lv.tok[order], lv.val[order]))
    return out

def context_windows(t: NGramTables, batch: SequenceBatch, width: int) -> np.ndarray:
    """int64[N, width, order-1]: the BOS-padded context before each of positions 0..width-1
    (padding tokens read as 0)."""
    k_top = t.order - 1
    padded = np.full((batch.size, k_top + width), t.vocab_size, np.int64)
    t = min(width, batch.tokens.shape[1])
    padded[:, k_top : k_top + t] = np.where(batch.mask[:, :t], batch.tokens[:, :t], 0)
    return np.lib.stride_tricks.sliding_window_view(padded, k_top, axis=1)[:, :width]

def position_chain(t: NGramTables, batch: SequenceBatch, width: int) -> np.ndarray:
    """int64[N, width, order]: the context chain before every position."""
    win = context_windows(t, batch, width)
    return context_chains(t, win.reshape(batch.size * width, t.order - 1)).reshape(batch.size, width, t.order)

def prefix_chain(t: NGramTables, batch: SequenceBatch) -> np.ndarray:
    """int64[B, order]: the context chain after each (checked) prefix."""
    prefixes, lengths = batch
    k_top = t.order - 1
    padded = np.full((batch.size, k_top + prefixes.shape[1]), t.vocab_size, np.int64)
    padded[:, k_top:] = np.where(batch.mask, prefixes, 0)
    window = np.take_along_axis(padded, lengths[:, None] + np.arange(k_top)[None, :], axis=1)
    return context_chains(t, window)


def position_targets(batch: SequenceBatch, width: int) -> np.ndarray:
    """int64[N, width]: each position's token (padding read as 0)."""
    targets = np.zeros((batch.size, width), np.int64)
    t = min(width, batch.tokens.shape[1])
    targets[:, :t] = np.where(batch.mask[:, :t], batch.tokens[:, :t], 0)
    return targets


def step_logprobs(t: NGramTables, batch: SequenceBatch, width: int, dense: np.ndarray | None) -> np.ndarray:
    """float32[N, width]: each token's log-prob given its prefix (padding entries meaningless)."""
    chain = position_chain(t, batch, width)
    lps = cell_logprobs(t, chain.reshape(-1, t.order), position_targets(batch, width).reshape(-1), dense=dense)
    return lps.reshape(batch.size, width)


def position_top_m(
    t: NGramTables, batch: SequenceBatch, width: int, top_m: int, eos: int | None, dense: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each position's top-m log-probs float32[N, width, m] and ids int32[N, width, m], and eos
    log-probs float32[N, width] (zeros without an eos): rows built at the real positions, in
    blocks of ``ROW_CELLS`` cells."""
    n = batch.size
    vals = np.full((n, width, top_m), -np.inf, np.float32)
    ids = np.zeros((n, width, top_m), np.int32)
    eos_lps = np.zeros((n, width), np.float32)
    if n == 0:
        return vals, ids, eos_lps
    chain = position_chain(t, batch, width)
    r, c = np.nonzero(np.arange(width)[None, :] < batch.lengths[:, None])
    per = max(1, ROW_CELLS // max(t.vocab_size, 1))
    for lo in range(0, r.size, per):
        rr, cc = r[lo : lo + per], c[lo : lo + per]
        rows = row_logprobs(t, chain[rr, cc], dense)
        vals[rr, cc], ids[rr, cc] = host_top_m(rows, top_m)
        if eos is not None:
            eos_lps[rr, cc] = rows[:, eos]
    return vals, ids, eos_lps
