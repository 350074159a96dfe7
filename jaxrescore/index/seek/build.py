"""One build pass: admit every child with bucket in (old budget, new budget], level by level.

The kept rows are read first (only those whose ``nxt`` says a child lies between the two budgets),
then the live prefixes admitted go to the model depth by depth in chunks, their rows kept and their
children admitted in turn. Every admission is checked against the limits before it is added
(:func:`~jaxrescore.index.seek.limits.check_room`). A pass returns the new state or raises; the
state it started from is untouched either way (the caller keeps it on failure).
"""

from __future__ import annotations

import numpy as np
from tqdm.auto import tqdm

from jaxrescore.index.seek import expand
from jaxrescore.index.seek.limits import check_room
from jaxrescore.index.seek.rows import RowChunk, agree, agree_sparse
from jaxrescore.index.seek.settings import SeekSettings, vocab
from jaxrescore.index.seek.state import SeekState, add_nodes
from jaxrescore.index.seek.tree import cost, small_values, sort_keys
from jaxrescore.quantize import NO_BUCKET

# Seconds a build must run before its progress bar appears (progress=None).
PROGRESS_DELAY_S = 1.0
# Cells of kept next-token rows examined at once: bounds the temporaries of a scan (~40 B a cell).
CELL_BLOCK = 1 << 20


class PassWork:
    """The work list of one pass (local to it): the live nodes admitted and not yet expanded, by
    depth, and how many rows they still owe (the limits charge them before they are computed)."""

    def __init__(self, max_len: int, budget: int, request: str):
        self.by_depth: list[list[np.ndarray]] = [[] for _ in range(max_len + 1)]
        self.owed = 0
        self.budget = budget
        self.request = request  # the public call the pass serves (for error messages)

    def check(self, cfg: SeekSettings, state: SeekState, new_nodes: int = 0, new_live: int = 0) -> None:
        check_room(cfg, state, new_nodes, new_live, self.owed, self.request, self.budget)


def grow_pass(cfg: SeekSettings, state: SeekState, session: expand.Session, budget: int,
              request: str) -> SeekState:
    """The state after admitting every child with bucket in ``(state.budget, budget]`` (not yet
    compacted or ranked)."""
    old = state.budget
    work = PassWork(cfg.max_len, budget, request)
    if old < 0:
        work.check(cfg, state, 0, 1)
        work.by_depth[0].append(np.zeros(1, np.int64))
        work.owed = 1
    state = refresh(cfg, state, session, budget, work)
    # the kept rows: only those with a child in (old, budget] are read (their ``nxt`` says so)
    frontier, kept = NO_BUCKET, []
    for chunk in state.chunks:
        nxt = chunk.nxt
        if nxt is not None:
            hit = nxt <= budget
            if not hit.any():
                kept.append(chunk)
                frontier = min(frontier, int(nxt.min(initial=NO_BUCKET)))
                continue
            nxt = nxt.copy()  # a stored chunk is never changed in place (older states share it)
            state, nxt[hit] = admit(cfg, state, chunk.select(hit) if not hit.all() else chunk, old, budget, work)
        else:
            state, nxt = admit(cfg, state, chunk, old, budget, work)
        kept.append(chunk.with_next(nxt))
        frontier = min(frontier, int(nxt.min(initial=NO_BUCKET)))
    state = state._replace(chunks=tuple(kept))
    with tqdm(
        unit="rows",
        desc="SeekIndex build",
        disable=cfg.progress is False,
        delay=0 if cfg.progress else PROGRESS_DELAY_S,
        leave=False,
    ) as bar:
        for depth in range(cfg.max_len):
            if not work.by_depth[depth]:
                continue
            todo = np.concatenate(work.by_depth[depth])
            work.by_depth[depth] = []
            per = expand.rows_per_call(cfg, state, depth)
            for lo in range(0, todo.size, per):
                ids = todo[lo : lo + per]
                state, chunk = expand.expand(cfg, state, session, ids, depth, budget)
                work.owed -= ids.size
                work.check(cfg, state)  # the cells the rows kept, now that they are known
                state, nxt = admit(cfg, state, chunk, -1, budget, work)
                # the fresh chunk (stored last) gets its frontier
                state = state._replace(chunks=state.chunks[:-1] + (chunk.with_next(nxt),))
                frontier = min(frontier, int(nxt.min(initial=NO_BUCKET)))
                bar.update(ids.size)
                bar.set_postfix(depth=depth, bits=f"{budget / cfg.quantizer.scale:g}", refresh=False)
    return state._replace(frontier_min=frontier, budget=budget, builds=state.builds + 1)


def refresh(cfg: SeekSettings, state: SeekState, session: expand.Session, budget: int,
            work: PassWork) -> SeekState:
    """Run the model again on every kept sparse row whose left-out cells could enter within
    ``budget`` (their bound ``rest`` says so), replacing those rows; nothing else changes."""
    redo, chunks = [], []
    for chunk in state.chunks:
        if chunk.sparse:
            finite = np.isfinite(chunk.rest)
            need = np.zeros(chunk.size, bool)
            if finite.any():
                sb = expand.step_buckets(cfg, chunk.rest[finite])
                need[finite] = state.nodes.fb[chunk.ids[finite]] + sb <= budget
            if need.any():
                redo.append(chunk.select(need))
                chunk = chunk.select(~need)
        chunks.append(chunk)
    if not redo:
        return state
    old = RowChunk.concat(redo)
    state = state._replace(chunks=tuple(c for c in chunks if c.size), n_rows=state.n_rows - old.size)
    depth = state.nodes.depth[old.ids]
    for d in small_values(depth):
        at = old.select(depth == d)
        per = expand.rows_per_call(cfg, state, d)
        for lo in range(0, at.size, per):
            part = at.part(lo, min(lo + per, at.size))
            if expand.above_rows(cfg, d):
                state, fresh = expand.expand_above(cfg, state, part.ids, d, budget)
                state = expand.store(state, agree_sparse(part, fresh), vocab(cfg))
            else:
                state, rows = expand.forward(cfg, state, session, part.ids, d)
                state, rows = expand.cut(cfg, state, part.ids, d, agree(part, rows), count=False)
                state, _ = expand.keep(cfg, state, part.ids, rows, budget)
            work.check(cfg, state)  # rows run again may keep more cells: checked as they come
    return state


def admit(cfg: SeekSettings, state: SeekState, chunk: RowChunk, lo: int, hi: int,
          work: PassWork) -> tuple[SeekState, np.ndarray]:
    """Append the children of the chunk's nodes whose bucket lies in ``(lo, hi]``, in row-major
    order (by parent, then token); queue the live ones in ``work`` by depth. Returns the state and
    each row's smallest bucket of a finite child beyond ``hi``, int64[b] (``NO_BUCKET``: none; a
    sparse row's left-out cells included, through its bound).

    Rows go in blocks of about ``CELL_BLOCK`` cells, so the temporaries stay small; each block's
    children are checked against the limits before they are added."""
    nxt = np.empty(chunk.size, np.int64)
    per = max(1, CELL_BLOCK // max(chunk.width if not chunk.sparse else 1, 1))
    for s in range(0, chunk.size, per):
        e = min(s + per, chunk.size)
        state, nxt[s:e] = _admit_block(cfg, state, chunk.part(s, e), lo, hi, work)
    return state, nxt


def _admit_block(cfg: SeekSettings, state: SeekState, chunk: RowChunk, lo: int, hi: int,
                 work: PassWork) -> tuple[SeekState, np.ndarray]:
    """:func:`admit` for one block. Only cells that can fit are bucketed exactly; a row with
    no candidate in bucket ``hi + 1`` gets its frontier from its best cell left out."""
    nd = state.nodes
    ids = chunk.ids
    parent_fb = nd.fb[ids]
    r, tok, raw, below = chunk.cells(expand.threshold(cfg, parent_fb, hi))
    fb = parent_fb[r] + expand.step_buckets(cfg, raw)
    over = fb > hi
    frontier = np.full(chunk.size, NO_BUCKET, np.int64)
    if over.any():  # cells come row-major: a per-row minimum by segments
        ro, fo = r[over], fb[over]
        starts = np.flatnonzero(np.r_[True, ro[1:] != ro[:-1]])
        frontier[ro[starts]] = np.minimum.reduceat(fo, starts)
    rest = frontier > hi + 1
    if rest.any():  # the first bucket beyond is empty in these rows: look at the cells left out
        best_out = below()
        out = rest & np.isfinite(best_out)
        if out.any():
            frontier[out] = np.minimum(frontier[out], parent_fb[out] + expand.step_buckets(cfg, best_out[out]))
    keep = ~over & (fb > lo)
    if not keep.any():
        return state, frontier
    r, tok, raw, fb = r[keep], tok[keep], raw[keep], fb[keep]
    parent = ids[r]
    depth = nd.depth[parent] + 1
    terminal = depth == cfg.max_len if cfg.eos is None else tok == cfg.eos
    live = ~terminal
    work.check(cfg, state, int(r.size), int(np.count_nonzero(live)))
    # siblings in index order (likelier first, then token): a one-pass build then creates
    # every depth already sorted, and the order's sorts find their input in order
    order = sort_keys(r, cost(raw), tok)
    parent, tok, raw, fb, depth, terminal, live = (
        parent[order], tok[order], raw[order], fb[order], depth[order], terminal[order], live[order]
    )
    nodes, new = add_nodes(
        nd,
        parent=parent,
        token=tok,
        depth=depth,
        fb=fb,
        lp=nd.lp[parent] + np.minimum(raw.astype(np.float64), 0.0),
        step=raw,
        terminal=terminal,
    )
    state = state._replace(nodes=nodes)
    work.owed += int(np.count_nonzero(live))
    d0 = int(depth[0])
    if (depth == d0).all():
        if live.any():
            work.by_depth[d0].append(new[live])
    else:
        for d in small_values(depth[live]):
            work.by_depth[int(d)].append(new[live & (depth == d)])
    return state, frontier


def frontier_from_rows(cfg: SeekSettings, state: SeekState) -> int:
    """The smallest bucket of a finite child beyond the budget, recomputed from the kept rows
    (what the build passes track incrementally; used to re-check an older index file)."""
    frontier = NO_BUCKET
    fb_of = state.nodes.fb
    for chunk in state.chunks:
        per = max(1, CELL_BLOCK // max(chunk.width, 1))
        for s in range(0, chunk.size, per):
            part = chunk.part(s, min(s + per, chunk.size))
            r, _, raw = part.all_cells()
            fb = fb_of[part.ids][r] + expand.step_buckets(cfg, raw)
            beyond = fb[fb > state.budget]
            if beyond.size:
                frontier = min(frontier, int(beyond.min()))
            if part.sparse and np.isfinite(part.rest).any():
                fin = np.isfinite(part.rest)
                frontier = min(frontier, int((fb_of[part.ids[fin]] + expand.step_buckets(cfg, part.rest[fin])).min()))
    return frontier
