"""NGramLM: an interpolated Kneser-Ney n-gram model stored as sparse back-off tables.

Smoothing (Chen & Goodman's interpolated Kneser-Ney), for a context ``h`` of ``k`` tokens:

    P_k(w | h) = max(c_k(h w) - D_k, 0) / c_k(h .)  +  gamma(h) * P_{k-1}(w | h'),

where ``h'`` drops the oldest token of ``h``, ``gamma(h)`` is the mass the discounts freed
(``D_k * N1+(h .) / c_k(h .)`` when every count is at least ``D_k``), ``c_{order-1}`` are the
(weighted) n-gram counts and lower orders use continuation counts (the number of distinct tokens
seen to the left). ``P_{-1}`` is uniform over the ``V`` tokens, so every log-prob is finite. A
context never seen at order ``k`` backs off to ``P_{k-1}``. Contexts are left-padded with a BOS
symbol (id ``V``), so sequence starts are their own contexts.

Storage: memory linear in the distinct n-grams, not in contexts x V. Per context length ``k``:
the seen contexts (sorted int64 keys ``index of the context's suffix one order down * (V + 1) +
its oldest token``, so no key grows with the order: orders up to ``MAX_ORDER`` at any V), each
context's ``gamma`` and, in CSR form, its discounted n-gram terms ``max(c - D, 0) / c(h .)``
(token ids and float64 values); plus the order-0 row ``P_0`` as one dense ``float64[V]``. A
query resolves the longest seen suffix of its context order by order (``np.searchsorted``),
then sums the chain ``P = sum_k coef_k * terms_k + coef_0 * P_0`` (``coef`` the product of the
gammas above): a step's probability from a few lookups, a whole row as ``P_0`` scaled plus the
sparse terms scattered in. A cell no seen n-gram touches is ``float32(log coef_0) +
float32(log P_0)`` (one add per cell of a row); a touched cell is summed in float64 and its
``log`` taken, then float32, clipped to <= 0 — the same formula for a row and for a step, so
they agree bit for bit. Everything runs on the host in numpy; with a mesh, lookups still run on
the host (a table model has no forward to split).
"""

from __future__ import annotations

import copy
import numbers
from typing import NamedTuple, Sequence

import numpy as np
from jax.sharding import Mesh

from jaxrescore._checks import check_bool, check_int
from jaxrescore.models.base import check_support
from jaxrescore.models.checks import check_eos_terminated, check_prefixes, check_tokens, check_weights
from jaxrescore.models.prompt import PromptableMixin
from jaxrescore.models.scores import TABLE_TOLERANCE, StepScored, host_top_m
from jaxrescore.models.mesh import check_mesh
from jaxrescore.sequences import SequenceBatch, as_sequence_batch, bucket_size
from jaxrescore.typing import ArrayLike, Sequences

# The longest n-gram order fit accepts.
MAX_ORDER = 16
# Cells (rows x V) of dense float64 rows built at once: bounds the temporaries of a row query.
ROW_CELLS = 1 << 22
# Candidate cells of sparse row queries (next_logprobs_above) handled at once: bounds temporaries.
CANDIDATE_CELLS = 1 << 21
# Up to this many cells (contexts x V), the full float32 row of every seen context is also
# materialised once (a cache, like the dense tables of old): a lookup is then one gather.
DENSE_CELLS = 1 << 24


class NGramLevel(NamedTuple):
    """The seen contexts of one length ``k`` (see the module docstring).

    Attributes:
      keys: int64[C] sorted context keys (``suffix index * (V + 1) + oldest token``; the one
        empty context of length 0 has key 0).
      gamma: float64[C], the back-off weight of each context.
      ptr: int64[C + 1], CSR offsets of each context's terms.
      tok: int32[E], the terms' tokens (ascending within a context).
      val: float64[E], the terms ``max(c(h w) - D, 0) / c(h .)``.
    """

    keys: np.ndarray
    gamma: np.ndarray
    ptr: np.ndarray
    tok: np.ndarray
    val: np.ndarray

    @property
    def nbytes(self) -> int:
        return int(sum(a.nbytes for a in self))


def _discount(counts: np.ndarray, discount) -> float:
    if discount is not None:
        return float(discount)
    # Ney's estimate D = n1 / (n1 + 2 n2) from the counts-of-counts of this order.
    n1 = np.count_nonzero(np.isclose(counts, 1.0))
    n2 = np.count_nonzero(np.isclose(counts, 2.0))
    return n1 / (n1 + 2 * n2) if n1 and n2 else 0.75


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


class NGramLM(StepScored, PromptableMixin):
    """Interpolated Kneser-Ney n-gram LM over sparse back-off tables (build with :meth:`fit`).

    Attributes:
      vocab_size, eos, max_len: the protocol attributes.
      order: n (contexts of ``order - 1`` tokens).
      discounts: ``D_k`` per context length ``k = 0..order-1``.
      levels: one :class:`NGramLevel` per context length ``0..order-1``.
      base_row: float64[V], ``P_0`` (the unigram level with its uniform back-off).
      mesh: optional ``jax.sharding.Mesh`` (recorded; lookups run on the host).
    """

    score_tolerance = TABLE_TOLERANCE  # a context's row is the same in every batch

    def __init__(
        self,
        levels: Sequence[NGramLevel],
        *,
        order: int,
        vocab_size: int,
        eos: int | None,
        max_len: int,
        discounts: Sequence[float],
        mesh: Mesh | None = None,
    ):
        self.order = check_int(order, "order", minimum=1)
        self.vocab_size, self.eos, self.max_len = check_support(vocab_size, eos, max_len, "NGramLM")
        levels = [NGramLevel(*(np.asarray(a) for a in lv)) for lv in levels]
        if len(levels) != self.order or levels[0].keys.size != 1:
            raise ValueError(
                f"levels must hold {self.order} NGramLevel (context lengths 0..order-1), the first with the "
                f"one empty context; got {len(levels)}"
            )
        for k, lv in enumerate(levels):
            c = lv.keys.size
            if lv.gamma.shape != (c,) or lv.ptr.shape != (c + 1,) or lv.tok.shape != lv.val.shape or (
                c and int(lv.ptr[-1]) != lv.tok.size
            ):
                raise ValueError(f"levels[{k}] has inconsistent shapes")
            if lv.tok.size and (lv.tok.min() < 0 or lv.tok.max() >= self.vocab_size):
                raise ValueError(f"levels[{k}] has token ids outside [0, {self.vocab_size})")
        self.levels = levels
        self.discounts = tuple(float(d) for d in discounts)
        self.mesh = check_mesh(mesh)
        base = np.full(self.vocab_size, levels[0].gamma[0] / self.vocab_size)
        lv0 = levels[0]
        base[lv0.tok[lv0.ptr[0] : lv0.ptr[1]]] += lv0.val[lv0.ptr[0] : lv0.ptr[1]]
        self.base_row = base
        with np.errstate(divide="ignore"):
            self._log_base = np.log(base).astype(np.float32)  # the untouched cells of a row add to it
        # tokens by P_0, likeliest first, and -P_0 in that order (ascending: searchsorted finds how
        # many have P_0 >= x); each level's terms by value come on first use (see _cells_above)
        self._base_order = np.argsort(-base, kind="stable")
        self._base_neg = -base[self._base_order]
        self._terms_by_value = None
        self._table = None  # the dense cache (see DENSE_CELLS), built on first use
        self._offsets = np.cumsum([0] + [lv.keys.size for lv in levels])[:-1]
        # the entry key ctx * V + tok of every term, sorted (CSR order): one searchsorted per step
        self._ekeys = [
            np.repeat(np.arange(lv.keys.size, dtype=np.int64), np.diff(lv.ptr)) * self.vocab_size + lv.tok
            for lv in levels
        ]

    def __repr__(self) -> str:
        return (
            f"NGramLM(order={self.order}, V={self.vocab_size}, eos={self.eos}, "
            f"max_len={self.max_len}, contexts={self.n_contexts}, terms={self.n_terms})"
        )

    def with_mesh(self, mesh: Mesh | None, *, shard_params: bool = False) -> "NGramLM":
        """A copy sharing the tables that records ``mesh`` (lookups still run on the host: a table
        model has no forward to split). ``shard_params`` is accepted for a uniform interface."""
        check_bool(shard_params, "shard_params")
        other = copy.copy(self)
        other.mesh = check_mesh(mesh)
        return other

    @property
    def n_contexts(self) -> int:
        """Seen contexts over all context lengths."""
        return int(sum(lv.keys.size for lv in self.levels))

    @property
    def n_terms(self) -> int:
        """Stored n-gram terms over all orders (what memory grows with)."""
        return int(sum(lv.tok.size for lv in self.levels))

    @property
    def nbytes(self) -> int:
        """Bytes of the tables (levels, the entry keys and the dense order-0 row)."""
        return int(sum(lv.nbytes for lv in self.levels) + sum(k.nbytes for k in self._ekeys) + self.base_row.nbytes)

    # ---- fitting ----------------------------------------------------------------------------

    @classmethod
    def fit(
        cls,
        sequences: Sequences,
        *,
        order: int = 3,
        vocab_size: int,
        eos: int | None = None,
        max_len: int | None = None,
        discount: float | None = 0.75,
        weights: ArrayLike | None = None,
        mesh: Mesh | None = None,
    ) -> "NGramLM":
        """Fit counts from a corpus (vectorised numpy: a few sorts per order).

        Args:
          sequences: the corpus, in the model's support: a SequenceBatch or list of token
            sequences; with ``eos`` every sequence ends with ``eos`` (and has no other eos);
            without it every sequence has exactly ``max_len`` tokens.
          order: n in ``[1, MAX_ORDER]`` (1 = unigram).
          vocab_size: V; tokens lie in ``[0, V)``.
          eos: end-of-sequence id, or None for fixed-length sequences.
          max_len: the longest sequence in the support (default: the longest in the corpus).
          discount: ``D`` in ``(0, 1]`` for every order, or None for Ney's per-order estimate
            ``n1 / (n1 + 2 n2)`` (meaningful for integer counts).
          weights: optional non-negative float[N]: how often each sequence occurs.
          mesh: optional ``jax.sharding.Mesh`` (recorded; lookups run on the host).
        """
        batch, w, max_len = _check_corpus(sequences, order, vocab_size, eos, max_len, discount, weights)
        v = vocab_size
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
        return cls(levels, order=order, vocab_size=v, eos=eos, max_len=max_len, discounts=discounts, mesh=mesh)

    @classmethod
    def from_table(
        cls,
        table: ArrayLike,
        context_keys: Sequence[ArrayLike],
        *,
        order: int,
        vocab_size: int,
        eos: int | None,
        max_len: int,
        discounts: Sequence[float],
        mesh: Mesh | None = None,
    ) -> "NGramLM":
        """The model of a dense table (the storage of model files written before sparse tables):
        ``table`` float32[R, V] full log-prob rows of every seen context of every order, and per
        context length ``k`` its sorted base-``(V + 1)`` keys (oldest token most significant)."""
        v = check_int(vocab_size, "vocab_size", minimum=1)
        order = check_int(order, "order", minimum=1)
        table = np.asarray(table, np.float32)
        old = [np.asarray(k, np.int64) for k in context_keys]
        if table.ndim != 2 or table.shape[1] != v or len(old) != order or sum(k.size for k in old) != table.shape[0]:
            raise ValueError(
                f"table must be float[R, vocab_size={v}] with one row per key of {order} key arrays, got "
                f"shape {table.shape} and {len(old)} arrays of {sum(k.size for k in old)} keys"
            )
        probs = np.exp(np.minimum(table.astype(np.float64), 0.0))
        offset, levels = 0, []
        pos = np.zeros(1, np.int64)  # old index -> new index of the contexts one length down
        for k, keys in enumerate(old):
            rows = probs[offset : offset + keys.size]
            offset += keys.size
            if k == 0:
                new_keys, perm = np.zeros(1, np.int64), np.zeros(1, np.int64)
            else:
                head = (v + 1) ** (k - 1)
                new_keys = pos[np.searchsorted(old[k - 1], keys % head)] * (v + 1) + keys // head
                perm = np.argsort(new_keys, kind="stable")
                new_keys = new_keys[perm]
            pos = np.empty_like(perm)
            pos[perm] = np.arange(perm.size)
            rows = rows[perm]
            nz = rows > 0
            ptr = np.zeros(keys.size + 1, np.int64)
            np.cumsum(nz.sum(axis=1), out=ptr[1:])
            r, tok = np.nonzero(nz)
            # a dense row is the whole distribution: nothing backs off (gamma 0)
            levels.append(NGramLevel(new_keys, np.zeros(keys.size), ptr, tok.astype(np.int32), rows[r, tok]))
        return cls(levels, order=order, vocab_size=v, eos=eos, max_len=max_len, discounts=discounts, mesh=mesh)

    # ---- lookups ----------------------------------------------------------------------------

    def _chain(self, windows: np.ndarray) -> np.ndarray:
        """int64[M, order]: for context windows ``int64[M, order-1]`` (oldest first, BOS-padded),
        the index of the seen context of each length ``0..order-1`` (-1 past the longest seen)."""
        m = windows.shape[0]
        v1 = self.vocab_size + 1
        k_top = self.order - 1
        chain = np.full((m, self.order), -1, np.int64)
        chain[:, 0] = 0
        cur = np.zeros(m, np.int64)
        alive = np.ones(m, bool)
        for k in range(1, self.order):
            keys = self.levels[k].keys
            if not alive.any() or keys.size == 0:
                break
            q = cur * v1 + windows[:, k_top - k]
            idx = np.minimum(np.searchsorted(keys, q), keys.size - 1)
            alive &= keys[idx] == q
            cur = np.where(alive, idx, 0)
            chain[alive, k] = idx[alive]
        return chain

    def _dense_table(self) -> np.ndarray | None:
        """float32[contexts, V]: every seen context's row (None past ``DENSE_CELLS``)."""
        if self._table is None:
            if self.n_contexts * self.vocab_size > DENSE_CELLS:
                return None
            chains, prev = [], None
            for k, lv in enumerate(self.levels):
                ch = np.full((lv.keys.size, self.order), -1, np.int64)
                ch[:, k] = np.arange(lv.keys.size)
                if k:
                    ch[:, :k] = prev[lv.keys // (self.vocab_size + 1), :k]
                chains.append(ch)
                prev = ch
            self._table = self._sparse_rows(np.concatenate(chains))
        return self._table

    def _row_ids(self, chain: np.ndarray) -> np.ndarray:
        """int64[M]: the dense-table row of each context chain (its longest seen context)."""
        depth = (chain >= 0).sum(axis=1) - 1
        return self._offsets[depth] + chain[np.arange(chain.shape[0]), depth]

    def _coefs(self, chain: np.ndarray) -> np.ndarray:
        """float64[M, order]: the weight of each level's terms (0 past the longest seen); the
        base row's weight is column 0."""
        coef = np.zeros(chain.shape, np.float64)
        running = np.ones(chain.shape[0])
        for k in range(self.order - 1, -1, -1):
            seen = chain[:, k] >= 0
            coef[:, k] = np.where(seen, running, 0.0)
            if k > 0:
                g = self.levels[k].gamma[np.where(seen, chain[:, k], 0)]
                running = np.where(seen, running * g, running)
        return coef

    def _probs(self, chain: np.ndarray, words: np.ndarray, coef: np.ndarray | None = None) -> np.ndarray:
        """float32[M]: ``log P(words[i] | context i)``, each cell as :meth:`_sparse_rows` computes it
        (``coef``: the chains' :meth:`_coefs`, when known)."""
        table = self._dense_table()
        if table is not None:
            return table[self._row_ids(chain), words]
        coef = self._coefs(chain) if coef is None else coef
        p = coef[:, 0] * self.base_row[words]
        touched = np.zeros(words.size, bool)
        v = self.vocab_size
        for k in range(1, self.order):
            seen = np.flatnonzero(chain[:, k] >= 0)
            ek = self._ekeys[k]
            if seen.size == 0 or ek.size == 0:
                continue
            q = chain[seen, k] * v + words[seen]
            idx = np.minimum(np.searchsorted(ek, q), ek.size - 1)
            hit = ek[idx] == q
            p[seen[hit]] += coef[seen[hit], k] * self.levels[k].val[idx[hit]]
            touched[seen[hit]] = True
        out = _untouched_logs(coef[:, 0], self._log_base[words])
        out[touched] = _logs(p[touched])
        return out

    def _dense(self, chain: np.ndarray) -> np.ndarray:
        """float32[M, V]: log-prob rows of the contexts ``chain``."""
        table = self._dense_table()
        if table is not None:
            return table[self._row_ids(chain)]
        # Prefixes that back off to the same seen context share a row: build each one once.
        uniq, inv = np.unique(chain, axis=0, return_inverse=True)
        if uniq.shape[0] == chain.shape[0]:
            return self._sparse_rows(chain)
        return self._sparse_rows(uniq)[inv.reshape(-1)]

    def _touched(self, chain: np.ndarray, coef: np.ndarray, p: np.ndarray) -> np.ndarray:
        """Sum the cells of rows ``chain`` that some seen n-gram touches into the scratch ``p``
        (float64, flat ``row * V + token``), in the order :meth:`_probs` sums them (base, then
        level by level), so a row and a step agree bit for bit. Returns their flat keys (int64[E];
        a cell recurs once per level that touches it). Cost: the touched cells, never ``V``."""
        v = self.vocab_size
        keys, adds = [], []
        for k in range(1, self.order):
            seen = np.flatnonzero(chain[:, k] >= 0)
            if seen.size == 0:
                continue
            lv = self.levels[k]
            start, stop = lv.ptr[chain[seen, k]], lv.ptr[chain[seen, k] + 1]
            idx = _ranges(start, stop - start)
            who = np.repeat(seen, stop - start)
            cells = who * v + lv.tok[idx]
            p[cells] = coef[who, 0] * self.base_row[lv.tok[idx]]
            keys.append(cells)
            adds.append(coef[who, k] * lv.val[idx])
        for cells, add in zip(keys, adds):  # level order, as _probs adds them; one term per cell a level
            p[cells] += add
        return np.concatenate(keys) if keys else np.zeros(0, np.int64)

    def _sparse_rows(self, chain: np.ndarray) -> np.ndarray:
        """:meth:`_dense` from the sparse levels, in blocks of ``ROW_CELLS`` cells.

        A cell no seen n-gram touches is ``P_0`` scaled: its log is ``log coef_0 + log P_0``, an
        add per cell (no ``log`` over ``V`` cells a row); the few touched cells come from
        :meth:`_touched`."""
        m, v = chain.shape[0], self.vocab_size
        out = np.empty((m, v), np.float32)
        per = max(1, ROW_CELLS // max(v, 1))
        p = np.empty(min(per, m) * v, np.float64)  # written (and read) only at touched cells
        for lo in range(0, m, per):
            ch = chain[lo : lo + per]
            coef = self._coefs(ch)
            block = out[lo : lo + per]
            _untouched_logs(coef[:, :1], self._log_base[None, :], out=block)
            keys = self._touched(ch, coef, p)
            block.reshape(-1)[keys] = _logs(p[keys])
        return out

    def _cells_above(self, chain: np.ndarray, thr: np.ndarray):
        """:meth:`next_logprobs_above` for context chains ``int64[M, order]``.

        A cell's probability is a sum of ``order`` components: ``coef_0 * P_0(t)`` and
        ``coef_k * term_k(t)`` per seen level. The candidates of a row are the tokens with some
        component at least ``cut = exp(threshold) / (2 * order)``: a prefix of the tokens sorted by
        ``P_0`` and of each level's terms sorted by value (:meth:`_by_value`). Any other token has
        every component below ``cut``, so its probability is below ``left`` (the sum of each
        component's largest one left out) ``< exp(threshold) / 2``: it is never kept, and
        ``log left`` (rounded up) bounds it. Candidates get their exact log-probs from
        :meth:`_probs`, the cells a row gives bit for bit. Cost per row: its candidates, never
        ``V`` and never the whole of a context's terms."""
        m, v = chain.shape[0], self.vocab_size
        coef = self._coefs(chain)
        cut = np.exp(thr.astype(np.float64)) / (2 * self.order)
        with np.errstate(divide="ignore", invalid="ignore"):
            x = np.where(coef > 0, cut[:, None] / coef, np.inf)  # per component: P_0 or term >= x
        # runs of candidates: (rows ascending, first index into source, how many, source tokens)
        n0 = np.searchsorted(self._base_neg, -x[:, 0], side="right")  # P_0 >= x, largest first
        runs = [(np.arange(m, dtype=np.int64), np.zeros(m, np.int64), n0, self._base_order)]
        left = coef[:, 0] * -self._base_neg[np.minimum(n0, v - 1)] * (n0 < v)
        by_value = self._by_value()
        for k in range(1, self.order):
            seen = np.flatnonzero(chain[:, k] >= 0)
            if seen.size == 0:
                continue
            tok_k, val_k = by_value[k]
            start, stop = self.levels[k].ptr[chain[seen, k]], self.levels[k].ptr[chain[seen, k] + 1]
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
            kept.append(self._block_above(chain, thr, coef, runs, rest, lo, min(hi, m)))
            lo = hi
        row, tok, val = (np.concatenate(parts) for parts in zip(*kept)) if kept else (np.zeros(0, np.int64),) * 3
        ptr = np.zeros(m + 1, np.int64)
        np.cumsum(np.bincount(row, minlength=m), out=ptr[1:])
        return ptr, tok.astype(np.int32), val.astype(np.float32), rest

    def _block_above(self, chain, thr, coef, runs, rest, lo: int, hi: int):
        """The kept cells ``(row, token, log-prob)`` of rows ``lo:hi`` (row-major, tokens
        ascending) from their candidate ``runs``; raises ``rest`` to the candidates left out."""
        v = self.vocab_size
        keys = []
        for rows, start, count, source in runs:
            a, b = np.searchsorted(rows, [lo, hi])
            keys.append(np.repeat(rows[a:b], count[a:b]) * v + source[_ranges(start[a:b], count[a:b])])
        keys = np.sort(np.concatenate(keys))
        keys = keys[np.concatenate([[True], keys[1:] != keys[:-1]])] if keys.size else keys  # (np.unique hashes: slower)
        row, tok = np.divmod(keys, v)
        val = self._probs(chain[row], tok, coef[row])
        above = val >= thr[row]
        np.maximum.at(rest, row[~above], val[~above])
        keep = above & np.isfinite(val)
        return row[keep], tok[keep], val[keep]

    def _by_value(self) -> list:
        """Per context length ``k >= 1``: each context's terms by value, largest first, as
        ``(tok int32[E], val float64[E])`` in the level's CSR layout (built once)."""
        if self._terms_by_value is None:
            out = [None]
            for lv in self.levels[1:]:
                order = np.lexsort((-lv.val, np.repeat(np.arange(lv.keys.size), np.diff(lv.ptr))))
                out.append((lv.tok[order], lv.val[order]))
            self._terms_by_value = out
        return self._terms_by_value

    def _windows(self, batch: SequenceBatch, width: int) -> np.ndarray:
        """int64[N, width, order-1]: the BOS-padded context before each of positions 0..width-1
        (padding tokens read as 0)."""
        k_top = self.order - 1
        padded = np.full((batch.size, k_top + width), self.vocab_size, np.int64)
        t = min(width, batch.tokens.shape[1])
        padded[:, k_top : k_top + t] = np.where(batch.mask[:, :t], batch.tokens[:, :t], 0)
        return np.lib.stride_tricks.sliding_window_view(padded, k_top, axis=1)[:, :width]

    def _width(self, length: int) -> int:
        return min(bucket_size(max(length, 1), 8), self.max_len)

    def _position_chain(self, batch: SequenceBatch, width: int) -> np.ndarray:
        """int64[N, width, order]: the context chain before every position."""
        win = self._windows(batch, width)
        return self._chain(win.reshape(batch.size * width, self.order - 1)).reshape(batch.size, width, self.order)

    def step_logprobs(self, seqs: Sequences) -> tuple[SequenceBatch, np.ndarray]:
        """The batch and ``float32[N, W]``: each token's log-prob given its prefix (padding
        entries meaningless)."""
        batch = as_sequence_batch(seqs)
        check_tokens(batch, self.vocab_size, self.max_len)
        width = self._width(int(batch.lengths.max(initial=0)))
        if batch.size == 0:
            return batch, np.zeros((0, width), np.float32)
        chain = self._position_chain(batch, width)
        targets = np.zeros((batch.size, width), np.int64)
        t = min(width, batch.tokens.shape[1])
        targets[:, :t] = np.where(batch.mask[:, :t], batch.tokens[:, :t], 0)
        lps = self._probs(chain.reshape(-1, self.order), targets.reshape(-1))
        return batch, lps.reshape(batch.size, width)

    def frontier_stats(
        self, seqs: Sequences, top_m: int
    ) -> tuple[SequenceBatch, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The batch, steps float32[N, W], each position's top-m log-probs float32[N, W, m] and
        ids int32[N, W, m], and eos log-probs float32[N, W]: rows built at the real positions."""
        batch, steps = self.step_logprobs(seqs)
        n, width = steps.shape
        vals = np.full((n, width, top_m), -np.inf, np.float32)
        ids = np.zeros((n, width, top_m), np.int32)
        eos_lps = np.zeros((n, width), np.float32)
        if n:
            chain = self._position_chain(batch, width)
            r, c = np.nonzero(np.arange(width)[None, :] < batch.lengths[:, None])
            per = max(1, ROW_CELLS // max(self.vocab_size, 1))
            for lo in range(0, r.size, per):
                rr, cc = r[lo : lo + per], c[lo : lo + per]
                rows = self._dense(chain[rr, cc])
                vals[rr, cc], ids[rr, cc] = host_top_m(rows, top_m)
                if self.eos is not None:
                    eos_lps[rr, cc] = rows[:, self.eos]
        return batch, steps, vals, ids, eos_lps

    def position_logprobs(self, seqs: Sequences) -> tuple[SequenceBatch, np.ndarray]:
        """The batch and ``float32[N, W, V]``: next-token log-probs before each position."""
        batch = as_sequence_batch(seqs)
        check_tokens(batch, self.vocab_size, self.max_len)
        width = self._width(int(batch.lengths.max(initial=0)))
        if batch.size == 0:
            return batch, np.zeros((0, width, self.vocab_size), np.float32)
        chain = self._position_chain(batch, width)
        return batch, self._dense(chain.reshape(-1, self.order)).reshape(batch.size, width, self.vocab_size)

    def next_logprobs(self, prefixes: ArrayLike, lengths: ArrayLike) -> np.ndarray:
        """``float32[B, V]`` log-prob rows after each prefix.

        Args:
          prefixes: int32[B, T], left-aligned prefixes.
          lengths: int32[B], each in ``[0, max_len - 1]``.
        """
        batch = check_prefixes(prefixes, lengths, self.vocab_size, self.max_len)
        if batch.size == 0:
            return np.zeros((0, self.vocab_size), np.float32)
        return self._dense(self._prefix_chain(batch))

    def next_logprobs_above(
        self, prefixes: ArrayLike, lengths: ArrayLike, thresholds: ArrayLike
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The cells of each :meth:`next_logprobs` row at or above a threshold, and a bound on the
        rest, without building the ``V``-wide rows (what a ``SeekIndex`` over a wide vocabulary
        keeps; see :mod:`jaxrescore.index.seek.rows`).

        Args:
          prefixes: int32[B, T], left-aligned prefixes.
          lengths: int32[B], each in ``[0, max_len - 1]``.
          thresholds: float32[B], one per row (``-inf`` keeps every finite cell).

        Returns:
          ``(ptr, tok, val, rest)``: row ``b``'s finite cells with log-prob ``>= thresholds[b]`` are
          ``tok[ptr[b]:ptr[b+1]]`` (int32, ascending) with log-probs ``val`` (float32, the values of
          :meth:`next_logprobs` bit for bit); ``rest: float32[B]`` bounds the log-prob of every
          finite cell left out (at least the largest of them, below the threshold; ``-inf`` when
          none is).
        """
        batch = check_prefixes(prefixes, lengths, self.vocab_size, self.max_len)
        thr = np.asarray(thresholds)
        if thr.shape != (batch.size,) or not np.issubdtype(thr.dtype, np.floating) or np.isnan(thr).any():
            raise ValueError(
                f"thresholds must be {batch.size} float log-probs (one per prefix, no NaN); got shape "
                f"{thr.shape}, dtype {thr.dtype}"
            )
        return self._cells_above(self._prefix_chain(batch), thr.astype(np.float32))

    def _prefix_chain(self, batch: SequenceBatch) -> np.ndarray:
        """int64[B, order]: the context chain after each (checked) prefix."""
        prefixes, lengths = batch
        k_top = self.order - 1
        padded = np.full((batch.size, k_top + prefixes.shape[1]), self.vocab_size, np.int64)
        padded[:, k_top:] = np.where(batch.mask, prefixes, 0)
        window = np.take_along_axis(padded, lengths[:, None] + np.arange(k_top)[None, :], axis=1)
        return self._chain(window)


def _check_corpus(sequences, order, vocab_size, eos, max_len, discount, weights):
    order = check_int(order, "order", minimum=1)
    vocab_size = check_int(vocab_size, "vocab_size", minimum=1)
    eos = check_int(eos, "eos", minimum=0, maximum=vocab_size, allow_none=True)
    max_len = check_int(max_len, "max_len", minimum=1, allow_none=True)
    if order > MAX_ORDER:
        raise ValueError(f"order must be an integer in [1, {MAX_ORDER}], got {order}")
    if discount is not None and (
        isinstance(discount, (bool, np.bool_))
        or not isinstance(discount, numbers.Real)
        or not 0.0 < float(discount) <= 1.0
    ):
        raise ValueError(f"discount must be a number in (0, 1] or None, got {discount!r}")
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
    return batch, check_weights(weights, batch.size), max_len

