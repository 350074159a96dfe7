"""The next-token rows a SeekIndex keeps of the prefixes it expanded: dense, or sparse with a bound.

A deepening reads the children a larger budget admits off these rows instead of running the model
again. A row can be kept whole (``float32[V]``, cells cut by ``branch_cap`` or ``max_len`` at
``-inf``): 4 V bytes, 200 KB at V=50,257. Or sparse: only the cells whose child could enter
within a margin beyond the budget (token ids and log-probs, CSR over the chunk's rows), plus
``rest``, a bound on the log-prob of every finite cell left out (the largest of them when the
index cut a whole row; a model's own bound when it gave the sparse row itself; ``-inf`` when none
was left out). A cell left out has log-prob ``<= rest``, so its child's bucket is at least the
parent's plus the step bucket of ``rest``: that bounds what the index cut (its frontier) as a
whole row would, and says when a deeper budget could admit a left-out child, which makes the
index run the model on that prefix again (``SeekIndex`` re-expands it) before admitting
anything from it.
"""

from __future__ import annotations

import numpy as np

# Cells of whole rows sparsified at once (about 2 MB of float32: stays in cache).
SPARSIFY_CELLS = 1 << 19
# Kept row chunks of one kind (whole or sparse) left unmerged after a pass (see compact).
COMPACT_CHUNKS = 16


class RowChunk:
    """The kept rows of the expanded nodes ``ids`` (int64[b]), one of two kinds.

    Attributes:
      ids: int64[b], the nodes.
      dense: float32[b, W] whole rows (cut cells ``-inf``), or None for a sparse chunk.
      ptr: int64[b + 1] CSR offsets (sparse), else None.
      tok: int32[E] token of each kept cell (sparse), else None.
      val: float32[E] its log-prob (sparse), else None.
      rest: float32[b] bound on every finite cell left out (sparse; ``-inf``: none), else None.
      nxt: int64[b], each row's smallest child bucket beyond the budget built (``NO_BUCKET``: none),
        or None while unknown (a loaded or re-run row). The owning index keeps it, so that a
        deepening reads only the rows with a child between the two budgets; a chunk is never
        changed in place once stored (:meth:`with_next` gives the updated one).
    """

    __slots__ = ("ids", "dense", "ptr", "tok", "val", "rest", "nxt")

    def __init__(self, ids, dense=None, ptr=None, tok=None, val=None, rest=None, nxt=None):
        self.ids = ids
        self.dense, self.ptr, self.tok, self.val, self.rest = dense, ptr, tok, val, rest
        self.nxt = nxt

    def with_next(self, nxt: np.ndarray | None) -> "RowChunk":
        """The same rows with ``nxt`` replaced (the arrays are shared, not copied)."""
        return RowChunk(self.ids, self.dense, self.ptr, self.tok, self.val, self.rest, nxt)

    @property
    def sparse(self) -> bool:
        return self.dense is None

    @property
    def size(self) -> int:
        return int(self.ids.size)

    @property
    def width(self) -> int:
        """The widest row (dense), or one past the largest kept token (sparse)."""
        if not self.sparse:
            return int(self.dense.shape[1])
        return int(self.tok.max()) + 1 if self.tok.size else 0

    @property
    def nbytes(self) -> int:
        arrays = (self.dense,) if not self.sparse else (self.ptr, self.tok, self.val, self.rest)
        return int(sum(a.nbytes for a in arrays))

    def rows_of_cells(self) -> np.ndarray:
        """int64[E]: the row of each kept cell (sparse)."""
        return np.repeat(np.arange(self.size, dtype=np.int64), np.diff(self.ptr))

    def part(self, s: int, e: int) -> "RowChunk":
        """Rows ``s:e``."""
        nxt = None if self.nxt is None else self.nxt[s:e]
        if not self.sparse:
            return RowChunk(self.ids[s:e], dense=self.dense[s:e], nxt=nxt)
        lo, hi = int(self.ptr[s]), int(self.ptr[e])
        return RowChunk(self.ids[s:e], ptr=self.ptr[s : e + 1] - lo, tok=self.tok[lo:hi], val=self.val[lo:hi],
                        rest=self.rest[s:e], nxt=nxt)

    def select(self, keep: np.ndarray) -> "RowChunk":
        """The rows where ``keep: bool[b]``."""
        nxt = None if self.nxt is None else self.nxt[keep]
        if not self.sparse:
            return RowChunk(self.ids[keep], dense=self.dense[keep], nxt=nxt)
        counts = np.diff(self.ptr)
        cells = np.repeat(keep, counts)
        ptr = np.zeros(int(keep.sum()) + 1, np.int64)
        np.cumsum(counts[keep], out=ptr[1:])
        return RowChunk(self.ids[keep], ptr=ptr, tok=self.tok[cells], val=self.val[cells], rest=self.rest[keep],
                        nxt=nxt)

    def cells(self, thr: np.ndarray):
        """``(rows, tokens, log-probs)`` of every kept cell with log-prob ``>= thr[row]``, row-major,
        and a function giving each row's largest log-prob BELOW its threshold (the cells left
        out included, through ``rest``): float32[b], ``-inf`` where there is none."""
        if not self.sparse:
            rows = self.dense
            cand = rows >= thr[:, None]
            r, tok = np.divmod(np.flatnonzero(cand), rows.shape[1])

            def below():
                return np.where(cand, np.float32(-np.inf), rows).max(axis=1, initial=-np.inf)

            return r, tok, rows[r, tok], below
        rr = self.rows_of_cells()
        cand = self.val >= thr[rr]

        def below():
            out = self.rest.astype(np.float32).copy()
            np.maximum.at(out, rr[~cand], self.val[~cand])
            return out

        return rr[cand], self.tok[cand].astype(np.int64), self.val[cand], below

    def all_cells(self):
        """``(rows, tokens, log-probs)`` of every kept finite cell (dense: every finite cell)."""
        return self.cells(np.full(self.size, -np.finfo(np.float32).max, np.float32))[:3]

    @staticmethod
    def sparsify(ids: np.ndarray, rows: np.ndarray, thr: np.ndarray) -> "RowChunk":
        """A sparse chunk of whole ``rows: float32[b, W]`` keeping each row's finite cells
        ``>= thr[row]``. Rows go in blocks of about ``SPARSIFY_CELLS`` cells, so each pass over a
        block (compare, nonzero, the max of the rest) runs in cache."""
        per = max(1, SPARSIFY_CELLS // max(rows.shape[1], 1))
        rs, toks, rests = [], [], []
        for lo in range(0, rows.shape[0], per):
            block = rows[lo : lo + per]
            keep = block >= thr[lo : lo + per, None]
            r, tok = np.nonzero(keep)
            fin = np.isfinite(block[r, tok])  # a -inf threshold keeps -inf cells: not children
            rs.append(r[fin] + lo)
            toks.append(tok[fin])
            block = np.where(keep, np.float32(-np.inf), block)
            rests.append(block.max(axis=1, initial=-np.inf))
        r, tok = (np.concatenate(rs), np.concatenate(toks)) if rs else (np.zeros(0, np.int64),) * 2
        ptr = np.zeros(rows.shape[0] + 1, np.int64)
        np.cumsum(np.bincount(r, minlength=rows.shape[0]), out=ptr[1:])
        rest = np.concatenate(rests).astype(np.float32) if rests else np.zeros(0, np.float32)
        return RowChunk(ids, ptr=ptr, tok=tok.astype(np.int32), val=rows[r, tok].astype(np.float32), rest=rest)

    @staticmethod
    def concat(chunks: list) -> "RowChunk":
        """One chunk of several of the same kind (dense rows padded to the widest with ``-inf``);
        ``nxt`` is kept when every chunk knows it."""
        ids = np.concatenate([c.ids for c in chunks])
        nxt = None if any(c.nxt is None for c in chunks) else np.concatenate([c.nxt for c in chunks])
        if not chunks[0].sparse:
            width = max(c.dense.shape[1] for c in chunks)
            return RowChunk(ids, dense=np.concatenate([_pad_width(c.dense, width) for c in chunks]), nxt=nxt)
        counts = np.concatenate([np.diff(c.ptr) for c in chunks])
        ptr = np.zeros(ids.size + 1, np.int64)
        np.cumsum(counts, out=ptr[1:])
        return RowChunk(ids, ptr=ptr, tok=np.concatenate([c.tok for c in chunks]),
                        val=np.concatenate([c.val for c in chunks]), rest=np.concatenate([c.rest for c in chunks]),
                        nxt=nxt)


def _pad_width(rows: np.ndarray, width: int) -> np.ndarray:
    if rows.shape[1] == width:
        return rows
    out = np.full((rows.shape[0], width), -np.inf, np.float32)
    out[:, : rows.shape[1]] = rows
    return out


def consolidate(chunks) -> tuple:
    """The chunks merged into one block per kind (whole rows padded to the widest)."""
    merged = []
    for sparse in (False, True):
        same = [c for c in chunks if c.sparse == sparse and c.size]
        if len(same) > 1:
            merged.append(RowChunk.concat(same))
        elif same:
            merged.append(same[0])
    return tuple(merged)


def compact(chunks) -> tuple:
    """The chunks of each kind merged once there are more than ``COMPACT_CHUNKS``: a chunk is
    merged into the one before it while that one is no larger (a binary counter), so a few dozen
    chunks stay and each row is copied a logarithmic number of times over the index's life, not
    once per pass."""
    merged = []
    for sparse in (False, True):
        same = [c for c in chunks if c.sparse == sparse and c.size]
        if len(same) <= COMPACT_CHUNKS:
            merged.extend(same)
            continue
        stack: list[RowChunk] = []
        for chunk in same:
            stack.append(chunk)
            while len(stack) > 1 and stack[-2].size <= stack[-1].size:
                top = stack.pop()
                stack[-1] = RowChunk.concat([stack[-1], top])
        merged.extend(stack)
    return tuple(merged)


def agree(kept: RowChunk, rows: np.ndarray) -> np.ndarray:
    """Fresh whole ``rows`` (float32[b, V]) of the prefixes of sparse ``kept``, made to agree with
    what the index already did with them: the kept cells keep their stored values (children may be
    in the index already) and every other cell stays within the stored bound ``rest`` (the frontier
    already claimed it). A model whose rows move with batch composition (float noise) could
    otherwise admit a child twice or put one below a budget already built, where it is never seen."""
    r, tok, val = kept.all_cells()
    rows = np.minimum(rows, kept.rest[:, None])
    rows[r, tok] = val
    return rows


def agree_sparse(kept: RowChunk, fresh: RowChunk) -> RowChunk:
    """:func:`agree` for sparse rows: the fresh sparse rows of the prefixes of ``kept`` (cells
    at or above a lower threshold than ``kept``'s), made to agree with what the index holds. The
    kept cells keep their stored values; every other fresh cell is clipped to the stored bound
    ``rest``, and so is the fresh bound (a bound on every cell left out either way)."""
    rk, tk, vk = kept.all_cells()
    rf = fresh.rows_of_cells()
    wide = max(kept.width, fresh.width, 1)
    stored = np.sort(rk * wide + tk)
    key = rf * wide + fresh.tok
    at = np.minimum(np.searchsorted(stored, key), max(stored.size - 1, 0))
    new = stored[at] != key if stored.size else np.ones(key.size, bool)
    rows = np.concatenate([rk, rf[new]])
    tok = np.concatenate([tk, fresh.tok[new].astype(np.int64)])
    val = np.concatenate([vk, np.minimum(fresh.val[new], kept.rest[rf[new]])])
    order = np.lexsort((tok, rows))
    ptr = np.zeros(kept.size + 1, np.int64)
    np.cumsum(np.bincount(rows, minlength=kept.size), out=ptr[1:])
    rest = np.minimum(fresh.rest, kept.rest).astype(np.float32)
    return RowChunk(kept.ids, ptr=ptr, tok=tok[order].astype(np.int32), val=val[order].astype(np.float32), rest=rest)
