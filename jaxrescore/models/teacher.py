"""Teacher forcing over held key/value caches: what :meth:`DecodingSession.teacher_force
<jaxrescore.models.decoding.DecodingSession.teacher_force>` plans, reduces on device and
assembles (the session itself runs the calls and holds the caches).

Positions follow :class:`~jaxrescore.models.scores.FrontierScores`: position ``j`` of a row is
the next-token distribution after ``row[:j]`` (position 0: after the context, BOS and a prompt).
Output position ``j >= 1`` needs ``row[j - 1]`` fed on top of the keys and values of
``row[:j - 1]``, so a row whose positions from ``known`` on are asked for feeds its FED PREFIX
``row[:len - 1]`` from index ``max(known, 1) - 1`` (or from a shorter held prefix).

Sharing within one call (:func:`share_feeds`): a row whose fed prefix is a prefix of (or equal
to) another row's is not fed at all; its distributions are the longer row's at the same
positions, and only its last step (whose token the longer row need not share) is read as one
extra log-prob of the longer row's outputs. Two rows that share a new prefix and then diverge
each feed the shared part (a later call finds it held).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxrescore.models.checks import check_tokens
from jaxrescore.models.scores import FULL_ROWS_MAX_VOCAB, FrontierScores, host_top_m
from jaxrescore.sequences import SequenceBatch, as_sequence_batch, ragged_positions


class TeacherForced(NamedTuple):
    """What :meth:`DecodingSession.teacher_force` returns.

    Attributes:
      frontier: :class:`~jaxrescore.models.scores.FrontierScores` of positions ``known[i] ..
        len(rows[i]) - 1``, LEFT-aligned (entry ``w`` of row ``i`` is position ``known[i] + w``;
        ``W = max(len(rows[i]) - known[i])``): ``steps`` float64[N, W] (``log p(row[j] |
        row[:j])``, clipped <= 0, 0 past the row), ``top_lps`` float32[N, W, m] / ``top_ids``
        int32[N, W, m] (as the model's own ``score_frontier``: descending, or the whole row in
        any order when ``m >= V <= 256``; -inf / 0 past the row), ``eos_lps`` float32[N, W]
        (-inf without an eos, and past the row), ``scores`` float64[N] the sum of ``steps``.
      positions: token positions this call computed (also added to ``session.positions``).
    """

    frontier: FrontierScores
    positions: int


def check_teacher_rows(rows, known, vocab_size: int, max_len: int) -> tuple[SequenceBatch, np.ndarray]:
    """``rows`` as a checked batch (tokens in ``[0, vocab_size)``, lengths <= ``max_len``) and
    ``known`` as int64[N] with ``0 <= known[i] <= len(rows[i])``; ValueError naming ``known``."""
    batch = as_sequence_batch(rows)
    check_tokens(batch, vocab_size, max_len, what="rows")
    raw = np.asarray(known)
    if raw.size and raw.dtype.kind not in "iu":
        raise ValueError(f"known must be integers (positions the caller has per row), got dtype {raw.dtype}")
    known = raw.astype(np.int64).reshape(-1) if raw.ndim <= 1 else raw.astype(np.int64)
    if known.shape != (batch.size,):
        raise ValueError(f"known must have shape ({batch.size},) (one per row), got {raw.shape}")
    bad = np.flatnonzero((known < 0) | (known > batch.lengths))
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"known[{i}] = {int(known[i])} must lie in [0, len(rows[{i}]) = {int(batch.lengths[i])}]")
    return batch, known


def share_feeds(toks: np.ndarray, lens: np.ndarray, need: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Which rows feed, and which are derived from them (see the module docstring).

    Args:
      toks, lens: the rows (int32[N, T], int[N]); row ``i``'s fed prefix is ``toks[i, :lens[i] - 1]``.
      need: int[N], the fed index row ``i`` must feed from (its first computed position minus
        one), or -1 for a row with nothing to compute.

    Returns:
      ``reps`` int[R], the rows that feed (longest first); ``owner`` int[N], the index into
      ``reps`` whose outputs row ``i`` reads (-1: nothing to compute); ``need_of`` int[R], the
      fed index each rep must feed from (the least of its readers').
    """
    owner = np.full(lens.shape, -1, np.int64)
    covered: dict[bytes, int] = {}
    reps: list[int] = []
    for i in sorted(np.flatnonzero(need >= 0).tolist(), key=lambda i: -int(lens[i])):
        fed = np.ascontiguousarray(toks[i, : lens[i] - 1], np.int32)
        at = covered.get(fed.tobytes())
        if at is None:
            at = len(reps)
            reps.append(i)
            for n in range(fed.size, 0, -1):
                if covered.setdefault(fed[:n].tobytes(), at) != at:
                    break  # a longer rep already covers this prefix and all shorter ones
        owner[i] = at
    need_of = np.full(len(reps), np.iinfo(np.int64).max, np.int64)
    np.minimum.at(need_of, owner[owner >= 0], need[owner >= 0])
    return np.asarray(reps, np.int64), owner, need_of


# Up to this vocabulary, a call on the CPU backend ships its whole rows and the host picks the
# top-m (numpy's argpartition): XLA's CPU top_k sorts each row. Measured on 2,048 rows, top-64:
# V = 309 35 ms on device against 11 ms on the host, V = 3,002 79 ms against 55 ms (the copy
# included), V = 49,152 (128 rows) 17 ms against 45 ms.
HOST_TOP_M_MAX_VOCAB = 4096


@dataclass(frozen=True)
class FrontierReduce:
    """The on-device reduction of a teacher-forced call's rows ``lp float32[B, W, V]`` (already
    clipped log-softmax), hashable (a static argument): ``(steps float32[B, W] at ``targets``,
    extra log-probs ``lp[qrow, qcol, qtok]`` float32[Q], top log-probs float32[B, W, m], their
    ids int32[B, W, m] (the whole row and zeros when ``full``), eos log-probs float32[B, W])``.
    With ``host``, the device ships whole rows and :meth:`on_host` picks their top-m."""

    top_m: int
    eos: int | None
    full: bool
    host: bool = False

    def __call__(self, lp, targets, qrow, qcol, qtok):
        steps = jnp.take_along_axis(lp, targets[..., None], axis=-1)[..., 0]
        extra = lp[qrow, qcol, qtok]
        eos_lps = jnp.zeros_like(steps) if self.eos is None else lp[..., self.eos]
        if self.full or self.host:
            return steps, extra, lp, jnp.zeros((1,), jnp.int32), eos_lps
        top_lps, top_ids = jax.lax.top_k(lp, self.top_m)
        return steps, extra, top_lps, top_ids.astype(jnp.int32), eos_lps

    def on_host(self, out: tuple, fed: np.ndarray) -> tuple:
        """``out`` (a call's results on the host) with the top-m picked here when the device
        shipped whole rows for it (``host``), as ``lax.top_k`` would (descending; ties may name
        other ids of the same value), at the positions read: the first ``fed[r]`` of call row
        ``r`` (``fed: int[R]``, the call's real rows); the others keep no names (``-inf``)."""
        if not self.host:
            return out
        steps, extra, lp, _, eos_lps = out
        rows, w = fed.size, lp.shape[1]
        r, c = np.nonzero(np.arange(w)[None, :] < fed[:, None])  # a call's width pads most rows
        vals, ids = host_top_m(lp[r, c], self.top_m)
        top_lps = np.full((rows, w, vals.shape[1]), -np.inf, np.float32)
        top_ids = np.zeros((rows, w, vals.shape[1]), np.int32)
        top_lps[r, c], top_ids[r, c] = vals, ids
        return steps, extra, top_lps, top_ids, eos_lps


def frontier_reduce(top_m: int, vocab_size: int, eos: int | None, host: bool = False) -> FrontierReduce:
    """The reduction ``score_frontier`` uses (see :mod:`jaxrescore.models.jax_lm`): whole rows
    for ``top_m >= V`` up to :data:`~jaxrescore.models.scores.FULL_ROWS_MAX_VOCAB`, else a top-m,
    picked on the host when ``host`` allows it (the CPU backend) and ``V`` is at most
    :data:`HOST_TOP_M_MAX_VOCAB`."""
    full = top_m >= vocab_size and vocab_size <= FULL_ROWS_MAX_VOCAB
    return FrontierReduce(top_m, eos, full, host and not full and vocab_size <= HOST_TOP_M_MAX_VOCAB)


class TeacherOut:
    """The result arrays being filled (see :class:`TeacherForced`), and the fill from one call."""

    def __init__(self, batch: SequenceBatch, known: np.ndarray, m: int, eos: int | None):
        n = batch.size
        self.lens, self.known, self.eos = batch.lengths.astype(np.int64), known, eos
        self.toks = batch.tokens
        w = int((self.lens - known).max(initial=0))
        self.steps = np.zeros((n, w), np.float64)
        self.top_lps = np.full((n, w, m), -np.inf, np.float32)
        self.top_ids = np.zeros((n, w, m), np.int32)
        self.eos_lps = np.full((n, w), -np.inf, np.float32)

    def context(self, rows: np.ndarray, row: np.ndarray, reduce: FrontierReduce) -> None:
        """Position 0 of ``rows`` (those with ``known == 0 < len``) from the context's ``row``."""
        if not rows.size:
            return
        vals, ids = host_top_m(row[None], reduce.top_m)
        self.steps[rows, 0] = row[self.toks[rows, 0]]
        self.top_lps[rows, 0], self.top_ids[rows, 0] = vals[0], ids[0]
        if self.eos is not None:
            self.eos_lps[rows, 0] = row[self.eos]

    def fill(self, readers, b: np.ndarray, start: np.ndarray, out, extra_at: dict) -> None:
        """Rows ``readers[k]`` read the outputs of call row ``b[k]`` fed from index ``start[k]``
        (``out``: the host arrays of :class:`FrontierReduce`); a reader's last step is
        ``out[1][extra_at[reader]]`` when it is listed there (a derived row). One gather per
        array over every (reader, position) pair: positions ``max(known, 1) - 1 .. len - 2`` of
        the reader, columns ``- start`` of its call row."""
        steps, extra, top_lps, top_ids, eos_lps = out
        readers = np.asarray(readers, np.int64)
        first = np.maximum(self.known[readers], 1)
        k, off = ragged_positions(self.lens[readers] - first)  # the positions each reader reads
        row, col = readers[k], (first - self.known[readers])[k] + off
        src_row, src_col = np.asarray(b, np.int64)[k], (first - 1 - np.asarray(start, np.int64))[k] + off
        self.steps[row, col] = steps[src_row, src_col]
        self.top_lps[row, col] = top_lps[src_row, src_col]
        full = top_ids.ndim == 1  # whole rows: the ids are the positions in the row
        self.top_ids[row, col] = np.arange(top_lps.shape[-1], dtype=np.int32) if full else top_ids[src_row, src_col]
        if self.eos is not None:
            self.eos_lps[row, col] = eos_lps[src_row, src_col]
        if extra_at:
            derived = np.fromiter(extra_at, np.int64, len(extra_at))
            self.steps[derived, self.lens[derived] - 1 - self.known[derived]] = extra[list(extra_at.values())]

    def result(self) -> FrontierScores:
        """The filled arrays as clipped, masked :class:`FrontierScores`."""
        inside = np.arange(self.steps.shape[1])[None, :] < (self.lens - self.known)[:, None]
        steps = np.where(inside, np.minimum(self.steps, 0.0), 0.0)
        top_lps = np.minimum(self.top_lps, 0.0)
        eos_lps = np.minimum(self.eos_lps, 0.0)
        return FrontierScores(steps.sum(axis=1), steps, top_lps, self.top_ids, eos_lps)
