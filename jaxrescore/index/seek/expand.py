"""Expanding prefixes: the model's next-token rows of a batch of nodes, cut and kept.

A row comes whole from ``next_logprobs`` (padded power-of-two calls, through the model's
decoding session when it decodes incrementally), or sparse from a table model's own
``next_logprobs_above``; ``branch_cap`` and the ``max_len`` cut of a terminating model are applied
to whole rows (cut cells become ``-inf`` and feed the bound's ``cut_min`` / ``length_cut_min``);
the row is then kept whole or sparse (see "Rows" in the package docstring).
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from jaxrescore.index.seek.counts import add_upper, completions
from jaxrescore.index.seek.rows import RowChunk
from jaxrescore.index.seek.settings import SeekSettings, sparse_rows, vocab
from jaxrescore.index.seek.state import SeekState
from jaxrescore.index.seek.tree import decode_fixed, fixed_prefixes
from jaxrescore.models.checked import model_rows, own_rows
from jaxrescore.models.prompt import PromptedModel, prepend
from jaxrescore.quantize import LN2, NO_BUCKET
from jaxrescore.sequences import bucket_size

# Cells (prefixes x V) of whole rows one model call may return: bounds a call at a wide vocabulary.
ROW_CELLS = 1 << 24
# A sparse row keeps the cells whose child could enter within this many bits beyond the budget
# built: a deepening within that margin needs no new forward. A fixed margin, not one growing
# with the budget: half the budget kept thousands of cells a row at V=50,257 (an order-5 n-gram
# draft's index passed 3.3 GB of RSS before 100,000 sequences), for deepenings of a few bits.
KEEP_MARGIN_BITS = 8.0

# The model's DecodingSession, or None: a shell hands its own (built on first use, kept across passes).
Session = Callable[[], object]


def step_buckets(cfg: SeekSettings, rows: np.ndarray) -> np.ndarray:
    """Per-step buckets int64[...] of model log-probs ``rows`` (float32), clipped to <= 0."""
    return cfg.quantizer.step_buckets(np.minimum(rows.astype(np.float64), 0.0))


def threshold(cfg: SeekSettings, parent_fb: np.ndarray, hi: int) -> np.ndarray:
    """float32[b]: a log-prob below which no step fits a child bucket ``<= hi + 1``.

    A step fits a remaining budget ``R`` only if its log-prob exceeds ``-(R + 1) / scale * ln 2``;
    the threshold for ``R + 1`` (to see the first bucket beyond too), lowered a little more
    against float32 rounding, keeps every such cell (and a few more, bucketed exactly later)."""
    thr = -(hi - parent_fb + 2.0) / cfg.quantizer.scale * LN2
    return np.nextafter((thr - 1e-6 * (1.0 + np.abs(thr))).astype(np.float32), np.float32(-np.inf))


def keep_threshold(cfg: SeekSettings, state: SeekState, ids: np.ndarray, budget: int) -> np.ndarray:
    """float32[b]: the cells a sparse row of nodes ``ids`` keeps in a build up to ``budget``
    (those a deepening within ``KEEP_MARGIN_BITS`` beyond it could admit)."""
    keep_hi = budget + math.ceil(KEEP_MARGIN_BITS * cfg.quantizer.scale)
    return threshold(cfg, state.nodes.fb[ids], keep_hi)


def rows_above(cfg: SeekSettings):
    """The model's own ``next_logprobs_above`` (a table model of this package), or for a
    prompted one (:class:`~jaxrescore.models.prompt.PromptedModel` itself, over such a base)
    its base's with the prompt put before every prefix: the rows ``PromptedModel.next_logprobs``
    computes, as that is one call of the base on the same tokens. None otherwise."""
    model = cfg.model
    if own_rows(model, "next_logprobs_above"):
        return model.next_logprobs_above
    base = getattr(model, "base", None)
    if type(model) is not PromptedModel or base is None or not own_rows(base, "next_logprobs_above"):
        return None
    if getattr(base, "prompt", None) is not None or callable(getattr(base, "decode_step", None)):
        return None  # a base that is itself prompted, or decodes incrementally: its own rows

    def above(prefixes, lengths, thresholds):
        toks, lens = prepend(model.prompt, np.asarray(prefixes, np.int32), np.asarray(lengths, np.int32))
        return base.next_logprobs_above(toks, lens, thresholds)

    return above


def above_rows(cfg: SeekSettings, depth: int) -> bool:
    """Whether the rows of prefixes of length ``depth`` come sparse from the model itself
    (``next_logprobs_above``: a table model that never builds ``V`` cells), not as whole rows
    sparsified here: sparse storage, one of this package's models, and no cut at this depth
    (cuts need whole rows; the root's row is kept whole)."""
    if depth == 0 or not sparse_rows(cfg) or rows_above(cfg) is None:
        return False
    capped = cfg.branch_cap is not None and cfg.branch_cap < vocab(cfg)
    return not capped and not (cfg.eos is not None and depth + 1 == cfg.max_len)


def rows_per_call(cfg: SeekSettings, state: SeekState, depth: int) -> int:
    """Prefixes per model call: ``chunk_rows``, fewer for whole rows of a wide vocabulary (a
    call's whole rows stay within ``ROW_CELLS`` cells)."""
    if above_rows(cfg, depth):
        return cfg.chunk_rows
    return max(1, min(cfg.chunk_rows, ROW_CELLS // max(vocab(cfg), state.width, 1)))


def expand(cfg: SeekSettings, state: SeekState, session: Session, ids: np.ndarray, depth: int,
           budget: int) -> tuple[SeekState, RowChunk]:
    """Run the model on the prefixes of nodes ``ids`` (all of length ``depth``) and keep their
    rows (after the cuts) for a build up to ``budget``: the state holding them, and the chunk."""
    if not above_rows(cfg, depth):
        state, rows = forward(cfg, state, session, ids, depth)
        state, rows = cut(cfg, state, ids, depth, rows)
        return keep(cfg, state, ids, rows, budget)
    state, chunk = expand_above(cfg, state, ids, depth, budget)
    return store(state, chunk, vocab(cfg)), chunk


def expand_above(cfg: SeekSettings, state: SeekState, ids: np.ndarray, depth: int,
                 budget: int) -> tuple[SeekState, RowChunk]:
    """The sparse rows the model gives itself (``next_logprobs_above``) for the prefixes of
    nodes ``ids``: the cells a build up to ``budget`` keeps, and the bound on the rest (not stored)."""
    ptr, tok, val, rest = rows_above(cfg)(
        fixed_prefixes(state.nodes, ids, depth), np.full(ids.size, depth, np.int32),
        keep_threshold(cfg, state, ids, budget),
    )
    return count_rows(cfg, state, ids.size, depth), RowChunk(ids, ptr=ptr, tok=tok, val=val, rest=rest)


def keep(cfg: SeekSettings, state: SeekState, ids: np.ndarray, rows: np.ndarray,
         budget: int) -> tuple[SeekState, RowChunk]:
    """Store fresh rows (after the cuts): whole, or sparse with a bound on the rest."""
    if sparse_rows(cfg):
        chunk = RowChunk.sparsify(ids, rows, keep_threshold(cfg, state, ids, budget))
    else:
        chunk = RowChunk(ids, dense=rows)
    return store(state, chunk, rows.shape[1]), chunk


def store(state: SeekState, chunk: RowChunk, width: int) -> SeekState:
    """``state`` with a chunk of kept rows added (whole rows ``width`` wide, or sparse ones of
    that vocabulary)."""
    return state._replace(chunks=state.chunks + (chunk,), n_rows=state.n_rows + chunk.size,
                          width=max(state.width, width))


def forward(cfg: SeekSettings, state: SeekState, session: Session, ids: np.ndarray,
            depth: int) -> tuple[SeekState, np.ndarray]:
    """The model's next-token rows float32[b, V] for the prefixes of nodes ``ids`` (all of
    length ``depth``), in one padded call, and the state counting them."""
    b = ids.size
    decoding = session()
    if decoding is not None:  # parents' caches held: one token position per row
        before = decoding.positions
        rows = decoding.next_logprobs(fixed_prefixes(state.nodes, ids, depth), np.full(b, depth, np.int32))
        state = state._replace(positions=state.positions + decoding.positions - before,
                               forwards=state.forwards + b)
        return _with_root_row(state, depth, rows), rows
    prefixes = np.zeros((bucket_size(b), bucket_size(max(depth, 1))), np.int32)
    prefixes[:b, :depth] = decode_fixed(state.nodes, ids, depth)
    lengths = np.zeros(prefixes.shape[0], np.int32)
    lengths[:b] = depth
    rows = np.asarray(model_rows(cfg.model, prefixes, lengths))
    if rows.ndim != 2 or rows.shape[0] != prefixes.shape[0]:
        raise ValueError(
            f"model.next_logprobs returned shape {rows.shape} for {prefixes.shape[0]} prefixes; expected [B, V]"
        )
    rows = rows[:b].astype(np.float32)
    if np.isnan(rows.max(initial=-np.inf)):
        raise ValueError("model.next_logprobs returned NaN log-probs")
    return _with_root_row(count_rows(cfg, state, b, depth), depth, rows), rows


def _with_root_row(state: SeekState, depth: int, rows: np.ndarray) -> SeekState:
    """The first next-token row is kept once (the file's model check)."""
    if depth == 0 and state.root_row is None:
        return state._replace(root_row=rows[0].copy())
    return state


def count_rows(cfg: SeekSettings, state: SeekState, b: int, depth: int) -> SeekState:
    """``state`` counting ``b`` model rows of full forwards over prefixes of length ``depth``."""
    prompt = len(getattr(cfg.model, "prompt", ()) or ())
    return state._replace(forwards=state.forwards + b, positions=state.positions + b * (depth + 1 + prompt))


def cut(cfg: SeekSettings, state: SeekState, ids: np.ndarray, depth: int, rows: np.ndarray,
        count: bool = True) -> tuple[SeekState, np.ndarray]:
    """Apply ``branch_cap`` and the ``max_len`` cut of a terminating model to fresh rows: the cut
    cells become -inf (so deepening never admits them) and their buckets feed ``cut_min``
    (branch_cap) and ``length_cut_min`` (max_len); ``count=False`` (rows computed again)
    only cuts, as those cells were counted the first time."""
    width = rows.shape[1]
    capped = cfg.branch_cap is not None and width > cfg.branch_cap
    at_max_len = cfg.eos is not None and depth + 1 == cfg.max_len
    if not (capped or at_max_len):
        return state, rows
    finite = np.isfinite(rows)
    cells = np.zeros_like(finite)
    # a non-eos child at max_len has only completions longer than max_len: a length cut, even
    # when branch_cap would drop it too (so bucket_bound(length_cuts=False) can leave it out)
    at_limit = finite.copy() if at_max_len else np.zeros_like(finite)
    if at_max_len and cfg.eos < width:
        at_limit[:, cfg.eos] = False
    if capped:
        order = np.argsort(-rows, axis=1, kind="stable")[:, cfg.branch_cap :]
        dropped = np.zeros_like(finite)
        np.put_along_axis(dropped, order, True, axis=1)
        dropped &= finite & ~at_limit
        if count:
            more = completions(cfg.max_len, cfg.eos, depth + 1, dropped, width)
            state = state._replace(dropped=add_upper(state.dropped, more))
        cells |= dropped
    if count:
        state = state._replace(
            cut_min=min(state.cut_min, _min_bucket(cfg, state, ids, rows, cells)),
            length_cut_min=min(state.length_cut_min, _min_bucket(cfg, state, ids, rows, at_limit)),
        )
    cells |= at_limit
    return state, (np.where(cells, np.float32(-np.inf), rows) if cells.any() else rows)


def _min_bucket(cfg: SeekSettings, state: SeekState, ids: np.ndarray, rows: np.ndarray, cells: np.ndarray) -> int:
    """The smallest cumulative bucket of the children ``cells: bool[b, V]`` (NO_BUCKET if none)."""
    if not cells.any():
        return NO_BUCKET
    r, tok = np.nonzero(cells)
    return int((state.nodes.fb[ids][r] + step_buckets(cfg, rows[r, tok])).min())
