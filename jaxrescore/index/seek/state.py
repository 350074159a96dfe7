"""SeekState: everything a SeekIndex holds that changes as it grows, as arrays and plain values.

A call that fails keeps the state it started from: every function over the state returns a new
one (``state._replace``) and never changes a stored array in place, except the prefix-tree
buffers of :class:`Nodes`, which only ever gain rows beyond the ``n`` of every state that shares
them, so an older state reads them as it did.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from jaxrescore.quantize import NO_BUCKET

# The prefix tree's columns and their dtypes.
NODE_DTYPES = {
    "parent": np.int64,
    "token": np.int32,
    "depth": np.int32,
    "fb": np.int64,
    "lp": np.float64,
    "step": np.float32,
    "terminal": np.bool_,
}


class Nodes(NamedTuple):
    """The prefix tree, columnar; node 0 is the root (the empty prefix). Rows below ``n`` are the
    tree; the buffers may be longer (room to append).

    Attributes:
      parent: int64[C] parent node (-1 for the root).
      token: int32[C] the last token.
      depth: int32[C] the prefix length.
      fb: int64[C] the cumulative fine bucket.
      lp: float64[C] the cumulative clipped log-prob.
      step: float32[C] the model's own log-prob of the last token.
      terminal: bool[C] whether the node is a complete sequence of the support.
      n: the number of nodes.
    """

    parent: np.ndarray
    token: np.ndarray
    depth: np.ndarray
    fb: np.ndarray
    lp: np.ndarray
    step: np.ndarray
    terminal: np.ndarray
    n: int


def root_nodes() -> Nodes:
    """A tree of the root alone."""
    columns = {k: np.zeros(1, dt) for k, dt in NODE_DTYPES.items()}
    columns["parent"][0] = -1
    return Nodes(**columns, n=1)


def nodes_from_columns(columns: dict) -> Nodes:
    """A tree of the given columns (copied, in their dtypes), e.g. read from a file."""
    cols = {k: np.asarray(columns[k], dt).copy() for k, dt in NODE_DTYPES.items()}
    return Nodes(**cols, n=int(cols["parent"].shape[0]))


def add_nodes(nodes: Nodes, **values: np.ndarray) -> tuple[Nodes, np.ndarray]:
    """Append nodes (one array per column, equal lengths): the grown tree and their ids int64[K].
    Rows are written past ``nodes.n`` only (a larger buffer when full), so ``nodes`` stays valid."""
    k = len(values["parent"])
    n = nodes.n
    cols = {name: getattr(nodes, name) for name in NODE_DTYPES}
    if n + k > nodes.parent.shape[0]:
        cap = max(2 * nodes.parent.shape[0], n + k)
        for name, col in cols.items():
            grown = np.zeros(cap, col.dtype)
            grown[:n] = col[:n]
            cols[name] = grown
    for name, col in cols.items():
        col[n : n + k] = values[name]
    return Nodes(**cols, n=n + k), np.arange(n, n + k, dtype=np.int64)


def trimmed(nodes: Nodes) -> Nodes:
    """The same tree with every column cut to its ``n`` rows (views): what whole-column work reads."""
    return Nodes(*(getattr(nodes, name)[: nodes.n] for name in NODE_DTYPES), n=nodes.n)


def export_nodes(nodes: Nodes) -> dict:
    """The columns, ``n`` rows each, copied."""
    return {name: getattr(nodes, name)[: nodes.n].copy() for name in NODE_DTYPES}


class SeekState(NamedTuple):
    """Everything a SeekIndex holds that changes as it grows.

    Attributes:
      nodes: the prefix tree.
      budget: the deepest fine bucket admitted; -1 before the first build.
      chunks: the expanded nodes' next-token rows (cut cells at -inf), never changed once stored.
      n_rows: rows kept, over all chunks.
      width: the widest kept row (an inferred vocabulary grows).
      frontier_min: the smallest bucket of a child beyond the budget (``NO_BUCKET``: none).
      cut_min: the smallest bucket of a child dropped for good by ``branch_cap``.
      length_cut_min: the smallest bucket of a terminating prefix cut at ``max_len``.
      dropped: an upper bound on support sequences below ``branch_cap`` drops: an exact int below
        2**63, beyond that a float rounded up (inf if it overflows).
      root_row: float32[V], the model's first next-token row (None before it is computed).
      seq_id: int64[N] the indexed sequences' nodes, in index order.
      seq_fb: int64[N] their fine buckets.
      seq_lp: float64[N] their draft log-probs.
      forwards, builds, positions: the counters (model rows, build passes, token positions).
      measured: ``(budget, sequences)`` before the last pass (the growth it measured), or None.
    """

    nodes: Nodes
    budget: int
    chunks: tuple
    n_rows: int
    width: int
    frontier_min: int
    cut_min: int
    length_cut_min: int
    dropped: int | float
    root_row: np.ndarray | None
    seq_id: np.ndarray
    seq_fb: np.ndarray
    seq_lp: np.ndarray
    forwards: int
    builds: int
    positions: int
    measured: tuple | None


def empty_state() -> SeekState:
    """The state of an index before its first build: the root alone, nothing indexed."""
    return SeekState(
        nodes=root_nodes(),
        budget=-1,
        chunks=(),
        n_rows=0,
        width=0,
        frontier_min=NO_BUCKET,
        cut_min=NO_BUCKET,
        length_cut_min=NO_BUCKET,
        dropped=0,
        root_row=None,
        seq_id=np.zeros(0, np.int64),
        seq_fb=np.zeros(0, np.int64),
        seq_lp=np.zeros(0, np.float64),
        forwards=0,
        builds=0,
        positions=0,
        measured=None,
    )


def with_chunks(state: SeekState, chunks) -> SeekState:
    """``state`` holding the row chunks ``chunks`` (its row count and width follow)."""
    chunks = tuple(c for c in chunks if c.size)
    return state._replace(chunks=chunks, n_rows=int(sum(c.size for c in chunks)),
                          width=max([c.width for c in chunks], default=0))


def size(state: SeekState) -> int:
    """Sequences indexed."""
    return int(state.seq_id.size)


def truncated(state: SeekState) -> bool:
    """Whether some sequence of the support may be missing (anything cut, see the shell)."""
    return min(state.frontier_min, state.cut_min, state.length_cut_min) < NO_BUCKET

