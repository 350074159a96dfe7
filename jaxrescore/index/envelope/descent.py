"""The descent of :class:`~jaxrescore.index.envelope.AREnvelopeIndex`: how a prefix hands its ranks
to its children (host numpy, one prefix at a time, vectorised over its buckets and ranks).

A prefix's *demand* ``float64[M]`` says how many ranks of each sequence bucket ``B`` it was given; it
is a function of the prefix alone, so every rank that passes a prefix sees the same split and
distinct ranks stay distinct. ``Split`` splits a demand among children, ``LeafSplit`` matches it to
leaves, ``SubtreeSplit`` to the exact completions of children one step from the leaves (lookahead).
``ix`` is always the AREnvelopeIndex being descended (not imported: it imports this module).
"""

from __future__ import annotations

import bisect

import numpy as np

from jaxrescore.quantize import Quantizer

SLACK_REACH = 64  # buckets past a prefix's deepest rank where overflowing ranks may still land


def step_buckets(q: Quantizer, lp: np.ndarray) -> np.ndarray:
    """Step buckets int64[...] of finite clipped log-probs (floored at -1e15 nats: no int64 overflow)."""
    return q.step_buckets(np.maximum(lp, -1e15))


def _cost(row: np.ndarray) -> np.ndarray:
    """Keys ordering float32 log-probs likeliest first, as SeekIndex orders siblings."""
    neg = np.maximum(-np.asarray(row, np.float32), np.float32(0)) + np.float32(0)
    return neg.view(np.uint32).astype(np.int64)


def children_of(ix, d: int, row: np.ndarray):
    """The children of a depth-``d`` prefix with next-token row ``row: float32[V]``: tokens int64[n]
    likeliest first (ties by token id, SeekIndex's order), clipped log-probs float64[n], leaf bool[n]."""
    last = d == ix.max_len - 1
    lp = np.minimum(row.astype(np.float64), 0.0)
    ok = np.isfinite(lp)
    if ix.eos is not None and last:
        ok &= np.arange(lp.size) == ix.eos  # only eos fits at max_len (SeekIndex's length cut)
    tok = np.flatnonzero(ok)
    tok = tok[np.lexsort((tok, _cost(row[tok])))]
    return tok, lp[tok], np.full(tok.size, last) if ix.eos is None else tok == ix.eos


class Split:
    """How one prefix (depth ``d``, bucket ``fb``) hands its ranks, ``demand: float64[M]`` per
    bucket, to its children (see the module docstring).

    Children (the finite tokens of ``row``) are sorted likeliest first; runs of one bucket and one
    kind (leaf or not) form groups, which share estimates. Per bucket, ranks first fill the groups'
    estimated slots in order (natural); a group never keeps more than its capacity (later ranks are
    trimmed). The rest -- ranks beyond the estimates, and trimmed ones -- overflow: in rank order
    they take the free estimated slots in bucket order (so they land near their own bucket), then
    the groups' spare capacity, first group first. Inside a group each bucket's ranks are dealt to
    its children in order, remainders rotating so that no child gets more than its share.
    Everything is computed only on the buckets that hold ranks or estimated completions.
    """

    def __init__(self, ix, d: int, row: np.ndarray, demand: np.ndarray, fb: int, extra=()):
        M = ix._M
        self.tok, self.steps, self.leaf = children_of(ix, d, row)
        self.n, self.size = self.tok.size, M
        self.cfb = fb + step_buckets(ix.quantizer, self.steps)
        if self.n == 0 or self.leaf.all():
            return  # nothing to split, or a LeafSplit takes over
        key = np.minimum(self.cfb, M)
        brk = np.ones(self.n, bool)
        brk[1:] = (key[1:] != key[:-1]) | (self.leaf[1:] != self.leaf[:-1])
        gs = np.flatnonzero(brk)
        nxt = ix._suffix[d + 1]
        self.gs, gleaf, gkey = gs, self.leaf[gs], key[gs]
        self.m = np.diff(np.append(gs, self.n)).astype(np.float64)
        self.grp = np.repeat(np.arange(gs.size), self.m.astype(np.int64))
        kap = np.where(gleaf, 1.0, ix._caps[min(d + 1, ix.max_len)])
        narrow = np.unique(np.concatenate([np.flatnonzero(demand > 0), np.asarray(extra, np.int64),
                                           gkey[gleaf & (gkey < M)]]))
        self._fit(narrow, demand, gkey, gleaf, nxt, kap)
        if self.cum_o[-1] > 0 and nxt.any():
            # ranks overflow: free estimated slots in later buckets may take them, so look there too
            lo = min(int(gkey[~gleaf].min()) + int(np.flatnonzero(nxt)[0]), M)
            hi = min(int(narrow.max(initial=lo)) + SLACK_REACH, M)
            wide = np.union1d(narrow, np.arange(lo, max(hi, lo)))
            if wide.size > narrow.size:
                self._fit(wide, demand, gkey, gleaf, nxt, kap)

    def _fit(self, cols, demand, gkey, gleaf, nxt, kap):
        """The split on bucket columns ``cols`` (exact as long as no rank overflows or ``cols``
        holds every bucket a free slot may be taken at)."""
        M = self.size
        self.cols, self.col = cols, np.full(M, -1, np.int64)
        self.col[cols] = np.arange(cols.size)
        dem = demand[cols]
        rel = cols[None, :] - gkey[:, None]
        w = (rel == 0).astype(np.float64)
        inner = ~gleaf  # a continuing child's completions: the next suffix table, shifted
        w[inner] = np.where(rel[inner] >= 0, nxt[np.clip(rel[inner], 0, M - 1)], 0.0)
        m = self.m[:, None]
        raw = np.cumsum(w * m, axis=0)
        cw = np.floor(raw + 0.5)  # estimated slots, cumulative over groups
        # the ranks of a bucket go to the groups in proportion to their estimates there
        scale = np.where(raw[-1] > 0, dem / np.where(raw[-1] > 0, raw[-1], 1.0), 0.0)
        bd = np.minimum(np.floor(raw * scale + 0.5), dem[None, :])
        self.bd = np.vstack([np.zeros((1, cols.size)), bd])  # natural ranks before group g
        nat = np.diff(self.bd, axis=0)
        cap = m[:, 0] * kap
        cn = np.cumsum(nat, axis=1)
        self.kept = np.clip(cap[:, None] - (cn - nat), 0.0, nat)  # a full group keeps its earliest
        self.trc = np.vstack([np.zeros((1, cols.size)), np.cumsum(nat - self.kept, axis=0)])
        over = dem - bd[-1] + self.trc[-1]  # overflow per bucket: trimmed ranks, then excess
        self.cum_o = np.cumsum(over)
        self.prev_o = self.cum_o - over
        room = cap - self.kept.sum(axis=1)
        total_o = self.cum_o[-1]
        if total_o == 0:  # nothing overflows: no free slot or spare capacity is taken
            self.avc = np.zeros((gkey.size + 1, cols.size))
            self.cum_s = self.prev_s = self.cum_f = self.prev_f = np.zeros(cols.size)
            self.S, self.used = 0.0, np.zeros_like(self.kept)
            self.fcs = np.cumsum(np.floor(room))
            gd = self.kept
        else:
            slack = np.maximum(np.diff(cw, axis=0, prepend=0.0) - nat, 0.0)
            cs = np.cumsum(slack, axis=1)
            avail = np.clip(room[:, None] - (cs - slack), 0.0, slack)
            self.avc = np.vstack([np.zeros((1, cols.size)), np.cumsum(avail, axis=0)])  # free slots before g
            self.cum_s = np.cumsum(self.avc[-1])
            self.prev_s = self.cum_s - self.avc[-1]
            self.S = min(total_o, self.cum_s[-1])  # overflow ranks that take a free slot
            self.used = np.clip(total_o - self.prev_s[None, :] - self.avc[:-1], 0.0, avail)
            self.fcs = np.cumsum(np.floor(room - self.used.sum(axis=1)))  # spare, first group first
            self.cum_f = np.maximum(self.cum_o - self.S, 0.0)
            self.prev_f = np.maximum(self.prev_o - self.S, 0.0)
            lo = np.concatenate([[0.0], self.fcs[:-1]])[:, None]
            with np.errstate(invalid="ignore"):
                late = np.clip(self.cum_f, lo, self.fcs[:, None]) - np.clip(self.prev_f, lo, self.fcs[:, None])
            gd = self.kept + self.used + np.where(np.isfinite(lo), late, 0.0)
        self.q = np.floor(gd / m)
        self.r = np.clip(gd - self.q * m, 0.0, m - 1)
        self.rot = np.mod(np.cumsum(self.r, axis=1) - self.r, m)  # remainders rotate over buckets

    def _before(self, g, k, j):
        """Ranks of group ``g`` at column ``k`` dealt to its children before child ``j``."""
        q, r, rot, m = self.q[g, k], self.r[g, k], self.rot[g, k], self.m[g]
        wrap = np.maximum(rot + r - m, 0.0)
        return j * q + np.minimum(j, wrap) + np.clip(j - rot, 0.0, np.minimum(r, m - rot))

    def _deal(self, g, k, u):
        """Child within group ``g`` (0-based) holding its ``u``-th rank at column ``k``, and the
        rank's offset in that child (binary search over the monotone ``_before``)."""
        lo, hi = np.zeros(u.shape), self.m[g] - 1
        while (lo < hi).any():
            mid = np.floor((lo + hi + 1) / 2)
            ok = self._before(g, k, mid) <= u
            lo, hi = np.where(ok, mid, lo), np.where(ok, hi, mid - 1)
        return lo, u - self._before(g, k, lo)

    def route(self, b: np.ndarray, o: np.ndarray):
        """Ranks ``(bucket b, offset o)`` of this prefix -> child int64[Q], the rank's bucket label
        and offset in the child, and collided bool[Q] (no slot was left: one was shared)."""
        k = self.col[b]
        in_nat = o < self.bd[-1, k]
        g = np.minimum((self.bd[1:, k] <= o[None, :]).sum(axis=0), self.gs.size - 1)
        p = o - self.bd[g, k]
        natural = in_nat & (p < self.kept[g, k])
        idx = np.where(in_nat, self.trc[g, k] + p - self.kept[g, k], self.trc[-1, k] + o - self.bd[-1, k])
        at = self.prev_o[k] + idx  # position in the overflow stream
        matched = ~natural & (at < self.S)
        ks = np.minimum(np.searchsorted(self.cum_s, at, side="right"), self.cols.size - 1)
        ws = at - self.prev_s[ks]
        gs_ = np.minimum((self.avc[1:, ks] <= ws[None, :]).sum(axis=0), self.gs.size - 1)
        late = at - self.S
        gf = np.minimum(np.searchsorted(self.fcs, late, side="right"), self.gs.size - 1)
        collided = ~natural & ~matched & (late >= self.fcs[-1])
        lo = np.where(gf > 0, self.fcs[np.maximum(gf - 1, 0)], 0.0)
        u_late = self.kept[gf, k] + self.used[gf, k] + late - np.maximum(lo, self.prev_f[k])
        g_out = np.where(natural, g, np.where(matched, gs_, np.where(collided, self.gs.size - 1, gf)))
        k_out = np.where(matched, ks, k)
        u = np.where(natural, p, np.where(matched, self.kept[gs_, ks] + ws - self.avc[gs_, ks],
                                          np.where(collided, 0.0, u_late)))
        j, oc = self._deal(g_out, k_out, u)
        return self.gs[g_out] + j.astype(np.int64), self.cols[k_out], oc, collided

    def child_demand(self, c: int) -> np.ndarray:
        """The ranks child ``c`` receives per bucket, float64[M]."""
        g, j = self.grp[c], c - self.gs[self.grp[c]]
        ks = np.arange(self.cols.size)
        got = self._before(g, ks, j + 1.0) - self._before(g, ks, float(j))
        out = np.zeros(self.size)
        out[self.cols] = got
        return out

    def invert(self, c: int, b: int, oc: float):
        """``(bucket, offset)`` at this prefix of the rank child ``c`` holds at ``(b, oc)``, or None."""
        g, k = self.grp[c], int(self.col[b])
        u = float(self._before(g, k, float(c - self.gs[g]))) + oc
        kept, used = self.kept[g, k], self.used[g, k]
        if u < kept:
            return b, float(self.bd[g, k] + u)
        if u < kept + used:
            at = self.prev_s[k] + self.avc[g, k] + (u - kept)
        else:
            lo = self.fcs[g - 1] if g > 0 else 0.0
            late = max(lo, self.prev_f[k]) + (u - kept - used)
            if not late < min(self.fcs[g], self.cum_f[k]):
                return None
            at = late + self.S
        k0 = int(np.searchsorted(self.cum_o, at, side="right"))
        if k0 >= self.cols.size:
            return None
        idx = at - self.prev_o[k0]
        if idx >= self.trc[-1, k0]:
            return int(self.cols[k0]), float(self.bd[-1, k0] + idx - self.trc[-1, k0])
        g0 = int(np.searchsorted(self.trc[:, k0], idx, side="right")) - 1
        return int(self.cols[k0]), float(self.bd[g0, k0] + self.kept[g0, k0] + idx - self.trc[g0, k0])


def _match(unit_b: np.ndarray, comp_b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Match ranks (their buckets ``unit_b``, sorted) to completions (buckets ``comp_b``, sorted,
    ties in depth-first order): ``assign`` int64[U] (completion of each rank) and ``shared`` bool[U]
    (more ranks than completions: this one reuses a completion).

    Every completion used (U == N): in order, the least-distance matching. Fewer ranks: each takes
    a completion of its own bucket if one is free (in order), else the nearest free one."""
    units, n = unit_b.size, comp_b.size
    shared = np.arange(units) >= n
    if units >= n:
        return np.minimum(np.arange(units), max(n - 1, 0)), shared
    first = np.searchsorted(unit_b, unit_b, side="left")
    lo, hi = np.searchsorted(comp_b, unit_b, "left"), np.searchsorted(comp_b, unit_b, "right")
    same = np.arange(units) - first < hi - lo
    assign = np.full(units, -1, np.int64)
    assign[same] = (lo + np.arange(units) - first)[same]
    free = np.ones(n, bool)
    free[assign[same]] = False
    pool = np.flatnonzero(free)
    keys, ids = comp_b[pool].tolist(), pool.tolist()
    for u in np.flatnonzero(~same).tolist():
        b = int(unit_b[u])
        i = bisect.bisect_left(keys, b)
        if i == len(keys) or (i > 0 and b - keys[i - 1] <= keys[i] - b):
            i -= 1  # the nearer neighbour, the likelier on a tie
        assign[u] = ids[i]
        del keys[i], ids[i]
    return assign, shared


class _Matched:
    """The last step(s) of a descent, where a prefix's ranks (``demand``) are matched one to one to
    its completions ``comp_b`` (sorted buckets) by :func:`_match`."""

    def _setup(self, demand: np.ndarray, comp_b: np.ndarray) -> None:
        cols = np.flatnonzero(demand > 0)
        self.unit_b = np.repeat(cols, demand[cols].astype(np.int64))
        self.assign, self.shared = _match(self.unit_b, comp_b)

    def _which(self, b: np.ndarray, o: np.ndarray):
        if self.unit_b.size == 0:
            # a prefix promised no ranks still receives collided ones (a parent with no slot left
            # sends them to its last group; such a prefix may be one that can never end)
            return np.zeros(b.size, np.int64), np.ones(b.size, bool)
        u = np.searchsorted(self.unit_b, b, side="left") + o.astype(np.int64)
        bad = u >= self.unit_b.size
        u = np.minimum(u, self.unit_b.size - 1)
        return self.assign[u], bad | self.shared[u]

    def held(self, comp: int):
        """``(bucket, offset)`` of the rank completion ``comp`` holds, or None."""
        u = np.flatnonzero(self.assign == comp)
        if u.size == 0:
            return None
        b = int(self.unit_b[u[0]])
        return b, float(u[0] - np.searchsorted(self.unit_b, b, side="left"))


class LeafSplit(_Matched):
    """Every child is a leaf (one sequence each): ranks are matched to the children."""

    def __init__(self, sp: Split, demand: np.ndarray):
        self.tok, self.steps, self.n, self.leaf, self.cfb = sp.tok, sp.steps, sp.n, sp.leaf, sp.cfb
        self._setup(demand, self.cfb)  # children are sorted likeliest first: buckets ascending

    def route(self, b: np.ndarray, o: np.ndarray):
        child, collided = self._which(b, o)
        return child, b, np.zeros(b.size), collided


class SubtreeSplit(_Matched):
    """Lookahead, one step before the leaves: the rows of every child are known (``below:
    float32[n, V]``, in child order), so the prefix's ranks are matched to its real completions --
    its leaf children and its children's leaves -- by bucket, depth-first order on ties."""

    def __init__(self, ix, d: int, row: np.ndarray, demand: np.ndarray, fb: int,
                 below: np.ndarray):
        self.tok, self.steps, self.leaf = children_of(ix, d, row)
        self.n, self.size = self.tok.size, ix._M
        self.cfb = fb + step_buckets(ix.quantizer, self.steps)
        # every child's leaves at once: row-wise likeliest first (ties by token), possible ones first
        lp2 = np.minimum(below.astype(np.float64), 0.0)
        ok = np.isfinite(lp2)
        if ix.eos is not None:  # depth max_len - 1: only eos fits
            ok &= np.arange(lp2.shape[1])[None, :] == ix.eos
        ok[self.leaf] = False
        key = np.where(ok, _cost(below), np.int64(1) << 40) * lp2.shape[1] + np.arange(lp2.shape[1])
        srt = np.argsort(key, axis=1)
        self.kid_tok = srt
        self.kid_lp = np.take_along_axis(lp2, srt, axis=1)
        c2, l2 = np.nonzero(np.take_along_axis(ok, srt, axis=1))
        b2 = self.cfb[c2] + step_buckets(ix.quantizer, self.kid_lp[c2, l2])
        lc = np.flatnonzero(self.leaf)
        cc = np.concatenate([lc, c2]).astype(np.int64)
        ll = np.concatenate([np.full(lc.size, -1), l2]).astype(np.int64)
        bb = np.concatenate([self.cfb[lc], b2]).astype(np.int64)
        order = np.lexsort((ll, cc, bb))
        self.comp_c, self.comp_l, comp_b = cc[order], ll[order], bb[order]
        self.n_comp = comp_b.size
        if self.n_comp:
            self._setup(demand, comp_b)

    def route(self, b: np.ndarray, o: np.ndarray):
        """Ranks -> (child int64[Q], the child's leaf int64[Q] or -1 when the child is a leaf,
        collided bool[Q])."""
        comp, collided = self._which(b, o)
        return self.comp_c[comp], self.comp_l[comp], collided

    def completion(self, c: int, leaf: int) -> int:
        return int(np.flatnonzero((self.comp_c == c) & (self.comp_l == leaf))[0])
