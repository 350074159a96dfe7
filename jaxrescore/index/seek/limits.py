"""The size limits of a SeekIndex: what it counts, the check before each allocation, the messages.

``max_bytes`` and ``max_nodes`` cap the index's size, counted as ``NODE_BYTES`` per prefix-tree
node plus ``4 * V`` bytes per kept whole row (a sparse row: 8 bytes per kept cell and 12 more;
rows yet to come are charged what is certain of them). A pass checks them before each admission
of children and as each model call's rows arrive (see the package docstring, "Limits").
"""

from __future__ import annotations

from jaxrescore.index.seek.settings import SeekSettings, sparse_rows, vocab
from jaxrescore.index.seek.state import SeekState, size, truncated

# Bytes charged per prefix-tree node: 37 of node columns (parent, token, depth, fb, lp, step,
# terminal), 24 of the sorted sequence arrays (id, bucket, log-prob) and 8 of an expanded node's
# next bucket beyond the budget (RowChunk.nxt), rounded up.
NODE_BYTES = 72
# The least bytes of a kept sparse row: its CSR offset (8) and its bound on the cells left out (4).
SPARSE_ROW_BYTES = 12
# Ranks at or beyond this never fit any index (int64 positions).
MAX_RANK = 1 << 62


class IndexLimitError(ValueError):
    """A SeekIndex deepening would pass ``max_nodes`` or ``max_bytes``.

    Raised before the allocation that would pass the limit (or as soon as the cells kept by a
    model call's rows pass it); the pass is undone whole, so the index stays consistent and keeps
    answering within what it holds. Growth by count (``ensure_count``, ``slice``, ``threshold``)
    keeps the passes that fitted before it; a one-pass request leaves the index as it was. The
    message names the request, the limit, the size needed and what the index holds."""

    # The last consistent state before the pass that failed (the growth functions set it; a shell
    # that keeps the passes that fitted stores it).
    kept: SeekState | None = None
    # Which limit: "max_nodes", "max_bytes", or "max_rows" (a query's cap on model rows).
    limit: str = ""


def show(n: int) -> str:
    """An int for a message: exact with thousands separators, or a power of two past 60 digits
    (Python refuses to print ints past 4,300 digits)."""
    return f"{n:,}" if n.bit_length() <= 200 else f"about {'-' if n < 0 else ''}2**{n.bit_length() - 1}"


def mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:,.1f} MiB" if nbytes < 2**50 else f"{nbytes:.3g} bytes"


def dense_row_bytes(cfg: SeekSettings, state: SeekState) -> int:
    """Bytes of one kept whole row (the widest seen, or the model's vocabulary)."""
    return 4 * max(vocab(cfg), state.width, 1)


def rows_bytes(cfg: SeekSettings, state: SeekState) -> int:
    """Bytes of the kept rows: whole rows at :func:`dense_row_bytes`, sparse ones as stored."""
    dense = sum(c.size for c in state.chunks if not c.sparse)
    return dense * dense_row_bytes(cfg, state) + sum(c.nbytes for c in state.chunks if c.sparse)


def row_bytes(cfg: SeekSettings, state: SeekState) -> int:
    """Bytes charged for one row still to come, before it is computed: a whole row, or (sparse
    rows) the least a sparse row takes (``SPARSE_ROW_BYTES``): what is certain, not a guess. The
    cells it keeps are counted once it is stored (each model call's rows are checked as they come)."""
    return dense_row_bytes(cfg, state) if not sparse_rows(cfg) else SPARSE_ROW_BYTES


def nbytes(cfg: SeekSettings, state: SeekState) -> int:
    """The index's size as ``max_bytes`` counts it."""
    return state.nodes.n * NODE_BYTES + rows_bytes(cfg, state)


def capacity(cfg: SeekSettings) -> int:
    """The most sequences any deepening of this index could ever hold (one node each)."""
    cap = cfg.max_bytes // NODE_BYTES
    return cap if cfg.max_nodes is None else min(cap, cfg.max_nodes)


def check_room(cfg: SeekSettings, state: SeekState, new_nodes: int, new_live: int, owed: int, request: str,
               budget: int) -> None:
    """Raise IndexLimitError if adding ``new_nodes`` nodes, ``new_live`` of them to be expanded,
    would pass a limit; ``owed``: rows still owed to live nodes admitted earlier in the pass to
    ``budget`` that serves the public call ``request``."""
    nodes = state.nodes.n + new_nodes
    rows = state.n_rows + owed + new_live
    need = nodes * NODE_BYTES + rows_bytes(cfg, state) + (owed + new_live) * row_bytes(cfg, state)
    if cfg.max_nodes is not None and nodes > cfg.max_nodes:
        which, limit = "max_nodes", f"max_nodes={cfg.max_nodes:,}"
    elif need > cfg.max_bytes:
        which, limit = "max_bytes", f"max_bytes={cfg.max_bytes:,} ({mib(cfg.max_bytes)})"
    elif cfg.max_rows is not None and rows > cfg.max_rows:
        which, limit = "max_rows", f"max_rows={cfg.max_rows:,} model rows"
    else:
        return
    kind = "whole" if not sparse_rows(cfg) else "sparse"
    err = IndexLimitError(
        f"{request}: deepening to {budget / cfg.quantizer.scale:g} bits needs at least "
        f"{nodes:,} prefix-tree nodes and {rows:,} {kind} next-token rows, {mib(need)}, over {limit}; "
        "the pass was stopped there (before allocating more) and undone."
    )
    err.limit = which
    raise err


def advice(cfg: SeekSettings, state: SeekState) -> str:
    """What a limit error ends with: what the index holds, and what to change."""
    bits = max(state.budget, 0) / cfg.quantizer.scale
    return (
        f"The index holds {size(state):,} sequences within {bits:g} bits "
        f"({state.nodes.n:,} nodes, {mib(nbytes(cfg, state))}) and keeps answering within them. Ask for "
        "fewer sequences or bits, raise max_bytes/max_nodes, or pass branch_cap to keep fewer "
        "children per prefix."
    )


def capacity_message(cfg: SeekSettings, state: SeekState, what: str) -> str:
    """Why a rank that no deepening could reach fails: the support ends first, or the limits."""
    if not truncated(state):
        return beyond_message(cfg, state, what)
    return (
        f"{what} is beyond what this index can ever hold: at most {capacity(cfg):,} sequences fit "
        f"max_bytes={cfg.max_bytes:,}"
        + ("" if cfg.max_nodes is None else f"/max_nodes={cfg.max_nodes:,}")
        + f" ({NODE_BYTES} bytes a node); it holds {size(state):,} now"
    )


def beyond_message(cfg: SeekSettings, state: SeekState, what: str) -> str:
    why = "the support is exhausted" if not truncated(state) else f"max_depth_bits={cfg.max_depth_bits:g} was reached"
    return f"{what} is beyond the {size(state)} sequences indexed ({why})"
