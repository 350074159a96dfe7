"""Queries over a SeekState: by rank, by threshold, by sequence, and the sound bound.

Each query that may deepen takes the state and returns the state it leaves (deepened as needed)
with its answer; one that fails raises and leaves the caller the state it started from (a
growth by count that hit a limit hands the passes that fitted on ``IndexLimitError.kept``).
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from jaxrescore._checks import check_float
from jaxrescore.index.seek.expand import Session
from jaxrescore.index.seek.growth import deepen_for_count, deepen_to
from jaxrescore.index.seek.limits import MAX_RANK, beyond_message, capacity, capacity_message, show
from jaxrescore.index.seek.settings import SeekSettings, max_budget
from jaxrescore.index.seek.state import SeekState, size, truncated
from jaxrescore.index.seek.tree import decode, find
from jaxrescore.index.support import support_sequence
from jaxrescore.models.checked import model_rows
from jaxrescore.quantize import LN2, NO_BUCKET, TOL
from jaxrescore.sequences import bucket_size


def dropped_upper(cfg: SeekSettings, state: SeekState) -> int | float:
    """The bound on sequences dropped by ``branch_cap``; ``inf`` when drops exist and the model's
    vocabulary is inferred (it may still grow)."""
    if state.dropped and getattr(cfg.model, "vocab_inferred", False):
        return math.inf
    return state.dropped


def bucket_bound(cfg: SeekSettings, state: SeekState, n: int, length_cuts: bool) -> float:
    """A sound upper bound on the draft log-prob of every support sequence ranked ``>= n`` or not
    indexed: the best-case edge of the smallest bucket among item ``n`` and every cut prefix."""
    fb = min(state.frontier_min, state.cut_min)
    if length_cuts:
        fb = min(fb, state.length_cut_min)
    if n < size(state):
        fb = min(fb, int(state.seq_fb[n]))
    if fb >= NO_BUCKET:
        return -math.inf
    return float(cfg.quantizer.edge(fb, cfg.max_len))


# -- by rank ------------------------------------------------------------------------------------------


def ranks(cfg: SeekSettings, state: SeekState, session: Session, ranks) -> tuple[SeekState, np.ndarray]:
    """``ranks`` checked as int64[N], the index deepened to hold them all: IndexError for a rank
    beyond what exists within ``max_depth_bits`` or beyond what could ever fit the limits."""
    arr = np.asarray(ranks)
    if arr.size and arr.dtype == object:  # Python ints beyond int64
        vals = arr.reshape(-1).tolist()
        if all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in vals):
            if min(vals) < 0:
                raise IndexError(f"ranks must be >= 0, got {show(min(vals))}")
            raise IndexError(capacity_message(cfg, state, f"rank {show(max(vals))}"))
    if arr.size and (arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer)):
        raise ValueError(f"ranks must be integers, got dtype {arr.dtype}")
    if arr.size and arr.dtype == np.uint64 and int(arr.max()) >= MAX_RANK:
        raise IndexError(capacity_message(cfg, state, f"rank {show(int(arr.max()))}"))
    arr = arr.astype(np.int64).reshape(-1)
    if arr.size and arr.min() < 0:
        raise IndexError(f"ranks must be >= 0, got {int(arr.min())}")
    if arr.size:
        top = int(arr.max())
        if top >= size(state) and truncated(state) and top >= min(capacity(cfg), MAX_RANK):
            raise IndexError(capacity_message(cfg, state, f"rank {show(top)}"))
        state = deepen_for_count(cfg, state, session, top + 1, f"rank {show(top)}")
        if top >= size(state):
            raise IndexError(beyond_message(cfg, state, f"rank {show(top)}"))
    return state, arr


def sequences_at(state: SeekState, arr: np.ndarray) -> tuple[list[tuple[int, ...]], np.ndarray]:
    """The sequences at held ranks ``arr: int64[N]`` and their draft log-probs float64[N]."""
    toks, lens = decode(state.nodes, state.seq_id[arr])
    rows = toks.tolist()
    return [tuple(row[:n]) for row, n in zip(rows, lens.tolist())], state.seq_lp[arr].copy()


# -- by threshold -------------------------------------------------------------------------------------


def check_threshold(min_log_prob) -> float:
    """``min_log_prob`` as a float: a number, never NaN, never ``-inf``."""
    t = check_float(min_log_prob, "min_log_prob", finite=False)
    if t == -math.inf:
        raise ValueError("min_log_prob must be finite (-inf would ask for the whole support)")
    return t


def bucket_range(cfg: SeekSettings, min_log_prob: float) -> tuple[int, int]:
    """Buckets ``(sure, possible)``: every sequence with bucket <= ``sure`` has draft log-prob
    >= ``min_log_prob``; every sequence with log-prob >= it has bucket <= ``possible``.
    Both are clamped to ``[-1, NO_BUCKET]`` (a threshold beyond every budget stays beyond)."""
    x = min(-min_log_prob / LN2 * cfg.quantizer.scale, float(NO_BUCKET))
    # sum of floors > bits*scale - steps, and <= bits*scale + steps*TOL
    sure = max(-1, min(math.floor(x) - cfg.max_len - 1, NO_BUCKET))
    possible = max(-1, min(math.floor(x + cfg.max_len * TOL), NO_BUCKET))
    return sure, possible


def count(cfg: SeekSettings, state: SeekState, session: Session, t: float, request: str) -> tuple[SeekState, int]:
    """The number of sequences with draft log-prob ``>= t`` (see ``SeekIndex.count``)."""
    if t > 0:
        return state, 0
    sure, possible = bucket_range(cfg, t)
    state = deepen_to(cfg, state, session, min(possible, max_budget(cfg)), request)
    lo = int(np.searchsorted(state.seq_fb, sure, side="right"))
    hi = int(np.searchsorted(state.seq_fb, possible, side="right"))
    return state, lo + int(np.count_nonzero(state.seq_lp[lo:hi] >= t))


def count_bracket(cfg: SeekSettings, state: SeekState, session: Session, t: float,
                  request: str) -> tuple[SeekState, tuple[int, int | float]]:
    """A sound ``(lo, hi)`` on the sequences with draft log-prob ``>= t`` from the histogram alone."""
    if t > 0:
        return state, (0, 0)
    sure, possible = bucket_range(cfg, t)
    state = deepen_to(cfg, state, session, min(possible, max_budget(cfg)), request)
    lo = int(np.searchsorted(state.seq_fb, sure, side="right"))
    hi: int | float = int(np.searchsorted(state.seq_fb, possible, side="right"))
    if state.cut_min <= possible:
        hi += dropped_upper(cfg, state)
    if state.frontier_min <= possible:
        hi = math.inf
    return state, (lo, hi)


def threshold(cfg: SeekSettings, state: SeekState, session: Session, rank: int) -> tuple[SeekState, float]:
    """The ``rank``-th largest draft log-prob (1-based, ``rank >= 1``) over the support."""
    request = f"threshold(rank={show(rank)})"
    if rank > min(capacity(cfg), MAX_RANK) and rank > size(state) and truncated(state):
        raise IndexError(capacity_message(cfg, state, f"threshold rank {show(rank)} (1-based)"))
    state = deepen_for_count(cfg, state, session, rank, request)
    if size(state) < rank:
        raise IndexError(beyond_message(cfg, state, f"threshold rank {show(rank)} (1-based)"))
    v = float(-np.partition(-state.seq_lp, rank - 1)[rank - 1])
    # once every sequence scoring >= v is indexed, the rank-th largest indexed score is exact
    _, possible = bucket_range(cfg, v)
    state = deepen_to(cfg, state, session, min(possible, max_budget(cfg)), request)
    return state, float(-np.partition(-state.seq_lp, rank - 1)[rank - 1])


# -- by sequence --------------------------------------------------------------------------------------


def structural(cfg: SeekSettings, state: SeekState, seq) -> tuple[SeekState, tuple[int, ...], int]:
    """``(state, seq, bucket)`` of a support sequence, from one model call (counted); ValueError
    outside the support. The bucket is summed exactly (Python ints) and clamped below ``NO_BUCKET``."""
    seq = support_sequence(seq, cfg.eos, cfg.max_len)
    n = len(seq)
    if min(seq, default=0) < 0 or max(seq, default=0) >= 2**31 - 1:
        raise ValueError(f"seq {seq} has a token id outside [0, 2**31 - 1)")
    prefixes = np.zeros((bucket_size(n), bucket_size(n)), np.int32)
    for j in range(n):
        prefixes[j, :j] = seq[:j]
    lengths = np.zeros(prefixes.shape[0], np.int32)
    lengths[:n] = np.arange(n)
    rows = np.asarray(model_rows(cfg.model, prefixes, lengths))[:n]
    state = state._replace(forwards=state.forwards + n)
    toks = np.asarray(seq, np.int64)
    inside = toks < rows.shape[1]
    lps = np.full(n, -np.inf)
    lps[inside] = rows[np.flatnonzero(inside), toks[inside]]
    if not np.isfinite(lps).all():
        raise ValueError(f"seq {seq} has probability 0 under the model")
    total = sum(cfg.quantizer.step_buckets(np.minimum(lps, 0.0)).tolist())
    return state, seq, min(total, NO_BUCKET - 1)


def rank_bracket(cfg: SeekSettings, state: SeekState, session: Session, seq: tuple[int, ...],
                 fb: int) -> tuple[SeekState, tuple[int, int | float]]:
    """``(lo, hi)`` containing the position of support sequence ``seq`` of bucket ``fb`` (see
    :func:`structural`) in the index order; ``lo == hi`` when it is indexed."""
    state = deepen_to(cfg, state, session, min(fb, max_budget(cfg)), "rank_bracket(seq)")
    node = find(state.nodes, seq)
    if node is not None:
        pos = int(np.flatnonzero(state.seq_id == node)[0])
        return state, (pos, pos)
    lo = int(np.searchsorted(state.seq_fb, fb, side="left"))
    if fb > state.budget:
        return state, (lo, math.inf)
    hi = int(np.searchsorted(state.seq_fb, fb, side="right")) - 1 + dropped_upper(cfg, state)
    return state, (lo, hi)
