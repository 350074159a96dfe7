"""The n-gram tables: an interpolated Kneser-Ney model's state, a NamedTuple of arrays.

Memory is linear in the distinct n-grams, not in contexts x V. Per context length ``k``: the seen
contexts (sorted int64 keys ``index of the context's suffix one order down * (V + 1) + its oldest
token``, so no key grows with the order: orders up to ``MAX_ORDER`` at any V), each context's
``gamma`` and, in CSR form, its discounted n-gram terms ``max(c - D, 0) / c(h .)`` (token ids and
float64 values); plus the order-0 row ``P_0`` as one dense ``float64[V]``. A model file stores the
levels (see :mod:`jaxrescore.models.checkpoint`); everything else is derived from them.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np


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


class NGramTables(NamedTuple):
    """The levels and what lookups derive from them once (see :mod:`jaxrescore.models.ngram.lookup`).

    Attributes:
      levels: one :class:`NGramLevel` per context length ``0..order-1``.
      base_row: float64[V], ``P_0`` (the unigram level with its uniform back-off).
      log_base: float32[V], ``log P_0``: the untouched cells of a row add to it.
      base_order: int64[V], tokens by ``P_0``, likeliest first.
      base_neg: float64[V], ``-P_0`` in that order (ascending: a searchsorted finds how many
        tokens have ``P_0 >= x``).
      offsets: int64[order], the first row of each level in the dense cache.
      ekeys: per level, int64[E] the entry key ``context * V + token`` of every term, sorted (CSR
        order): one searchsorted per step.
    """

    levels: tuple
    base_row: np.ndarray
    log_base: np.ndarray
    base_order: np.ndarray
    base_neg: np.ndarray
    offsets: np.ndarray
    ekeys: tuple

    @property
    def order(self) -> int:
        return len(self.levels)

    @property
    def vocab_size(self) -> int:
        return int(self.base_row.shape[0])

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
        """Bytes of the levels, the entry keys and the dense order-0 row."""
        return int(sum(lv.nbytes for lv in self.levels) + sum(k.nbytes for k in self.ekeys) + self.base_row.nbytes)


def build_tables(levels: Sequence, order: int, vocab_size: int) -> NGramTables:
    """The tables of ``order`` levels (each an :class:`NGramLevel` or its five arrays) over
    ``vocab_size`` tokens, their shapes and token ids checked (ValueError)."""
    levels = tuple(NGramLevel(*(np.asarray(a) for a in lv)) for lv in levels)
    if len(levels) != order or levels[0].keys.size != 1:
        raise ValueError(
            f"levels must hold {order} NGramLevel (context lengths 0..order-1), the first with the "
            f"one empty context; got {len(levels)}"
        )
    for k, lv in enumerate(levels):
        c = lv.keys.size
        if lv.gamma.shape != (c,) or lv.ptr.shape != (c + 1,) or lv.tok.shape != lv.val.shape or (
            c and int(lv.ptr[-1]) != lv.tok.size
        ):
            raise ValueError(f"levels[{k}] has inconsistent shapes")
        if lv.tok.size and (lv.tok.min() < 0 or lv.tok.max() >= vocab_size):
            raise ValueError(f"levels[{k}] has token ids outside [0, {vocab_size})")
    base = np.full(vocab_size, levels[0].gamma[0] / vocab_size)
    lv0 = levels[0]
    base[lv0.tok[lv0.ptr[0] : lv0.ptr[1]]] += lv0.val[lv0.ptr[0] : lv0.ptr[1]]
    with np.errstate(divide="ignore"):
        log_base = np.log(base).astype(np.float32)
    base_order = np.argsort(-base, kind="stable")
    return NGramTables(
        levels=levels,
        base_row=base,
        log_base=log_base,
        base_order=base_order,
        base_neg=-base[base_order],
        offsets=np.cumsum([0] + [lv.keys.size for lv in levels])[:-1],
        ekeys=tuple(
            np.repeat(np.arange(lv.keys.size, dtype=np.int64), np.diff(lv.ptr)) * vocab_size + lv.tok
            for lv in levels
        ),
    )


def levels_from_dense(table, context_keys: Sequence, order: int, v: int) -> list:
    """The levels of a dense table (the storage of model files written before sparse tables):
    ``table`` float32[R, V] full log-prob rows of every seen context of every order, and per
    context length ``k`` its sorted base-``(V + 1)`` keys (oldest token most significant)."""
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
    return levels
