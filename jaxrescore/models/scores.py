"""What an assumption-free proof needs from a target's teacher-forcing forward.

The forward that scores a batch of sequences computes the model's full next-token distribution
before every step of every row. A proof of top-k (``jaxrescore.rescore.frontier``) needs, at each
of those positions, only a few numbers: the ``m`` largest next-token log-probs with their token ids
and the log-prob of ``eos``. Models reduce to those ON DEVICE in the same call that produces the
scores, so a query stays one batched call and no ``float[N, W, V]`` block ever reaches the host.

Conventions shared by every model (one convention for every path):

- every step log-prob is clipped to ``<= 0`` (a log_softmax can return ``+1e-7``), in scores, in
  ``next_logprobs`` rows and in the top-m values alike, so "every later step costs >= 0 nats" holds
  exactly for the numbers the proof reads;
- ``score_tolerance`` (nats) is how far one model's score of the same sequence can move between
  two forwards (batch composition, padding, the prefix path against teacher forcing). Certificates
  and proofs only pass with that much to spare. Measured on CPU for a float32 TransformerLM: 1.4e-4
  nats with batch composition, 1.75e-4 between the index path and teacher forcing; bf16 paths
  differ by ~0.05 nats. A TransformerLM with ``dtype="bfloat16"`` (d_model 128, 2 layers, logits
  doubled, 300 sequences of up to 14 tokens; attention kept in float32): 0.054 nats a sequence
  with batch composition, 0.056 between the index path and teacher forcing, 0.061 a step between
  a full-forward row and teacher forcing and 0.088 a step for a cached (incremental) row; its
  float32 twin: 1e-6 and 1.1e-5. Hence 0.1 for every 16-bit compute dtype, and a 16-bit
  prompted model's own ``next_logprobs`` (where a proof's fetched rows come from) is a full
  forward, not the cached path.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxrescore._checks import check_int
from jaxrescore.models.checks import check_tokens
from jaxrescore.sequences import SequenceBatch, as_sequence_batch
from jaxrescore.typing import ArrayLike, Sequences

# Default number of top next-token log-probs a forward keeps per position. 64 rather than 32: on
# the wide workload (V = 309) fewer "rest" exits stay open, so a proof fetches fewer full rows
# (one target call each round it does): the student proof at k = 100 took 21 calls with 32 and
# 17 with 64 or 128 (the wide workload's three prompts, benchmarks/bench_proof_compute.py's policy runs), at half the memory of 128.
DEFAULT_TOP_M = 64
# Up to this vocabulary, a forward asked for top_m >= V ships whole rows (unordered) instead.
FULL_ROWS_MAX_VOCAB = 256
# Score tolerances (nats), see the module docstring. float32 covers the measured 1.75e-4 with a
# 5x margin; a table model (per-prefix function, n-gram lookup) returns the same float32 row for a
# prefix in every batch, so only float64 summation order is left.
FLOAT32_TOLERANCE = 1e-3
BFLOAT16_TOLERANCE = 0.1
TABLE_TOLERANCE = 1e-6


def clipped_log_softmax(logits: jax.Array) -> jax.Array:
    """float32 log-softmax over the last axis, clipped to <= 0 (float noise can put a dominant
    entry at +1e-7): how every device path turns logits into log-probs."""
    return jnp.minimum(jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1), 0.0)


def score_tolerance(model) -> float:
    """The model's ``score_tolerance`` in nats, or :data:`FLOAT32_TOLERANCE` when it declares none
    (a bare scoring function, a foreign model)."""
    value = getattr(model, "score_tolerance", None)
    return FLOAT32_TOLERANCE if value is None else float(value)


class FrontierScores(NamedTuple):
    """Scores plus the per-position reductions a proof reads, from ONE forward.

    Position ``j`` of row ``i`` is the distribution before the row's scored step ``j`` (after a
    ``skip``, the first scored step is position 0). Entries at positions ``>= lengths[i] - skip[i]``
    are meaningless.

    Attributes:
      scores: float64[N], the sequences' log-probs (the sum of ``steps``).
      steps: float64[N, W], each scored step's log-prob (clipped to <= 0), 0 at padding.
      top_lps: float32[N, W, m], the ``m`` largest next-token log-probs, descending (clipped);
        when ``m`` covers the whole vocabulary they are the whole row, in any order.
      top_ids: int32[N, W, m], their token ids.
      eos_lps: float32[N, W], the log-prob of ``eos`` at each position (-inf without an eos).
    """

    scores: np.ndarray
    steps: np.ndarray
    top_lps: np.ndarray
    top_ids: np.ndarray
    eos_lps: np.ndarray


def skip_mask(batch: SequenceBatch, skip, width: int) -> np.ndarray:
    """bool[N, width]: the steps counted in a score (real, and not among the first ``skip[i]``)."""
    n = batch.size
    cols = np.arange(width)[None, :]
    mask = cols < batch.lengths[:, None]
    if skip is not None:
        raw = np.asarray(skip)
        if raw.size and raw.dtype.kind not in "iu":
            raise ValueError(f"skip must be integers (steps to leave out per row), got dtype {raw.dtype}")
        skip = raw.astype(np.int64).reshape(-1)
        if skip.shape != (n,):
            raise ValueError(f"skip must have shape ({n},), got {skip.shape}")
        if skip.size and skip.min() < 0:
            raise ValueError(f"skip must be non-negative, got min {int(skip.min())}")
        mask &= cols >= skip[:, None]
    return mask


def check_top_m(top_m) -> int:
    """``top_m`` as an int >= 1."""
    return check_int(top_m, "top_m", minimum=1)


def shift_left(arr: np.ndarray, skip: np.ndarray, fill) -> np.ndarray:
    """``out[i, j] = arr[i, j + skip[i]]`` (``fill`` past the end); any trailing axes ride along."""
    n, w = arr.shape[:2]
    src = np.arange(w)[None, :] + skip[:, None]
    inside = src < w
    idx = np.minimum(src, w - 1).reshape((n, w) + (1,) * (arr.ndim - 2))
    out = np.take_along_axis(arr, idx, axis=1)
    return np.where(inside.reshape(idx.shape), out, fill)


def drop_leading(fs: FrontierScores, by: np.ndarray) -> FrontierScores:
    """``fs`` of whole rows with row ``i``'s first ``by[i]`` positions dropped (left-aligned),
    each score the sum of the steps left: a prompt's positions taken off rows forwarded with
    their prompt."""
    by = np.asarray(by, np.int64)
    steps = shift_left(np.asarray(fs.steps), by, 0.0)
    rest = (shift_left(np.asarray(a), by, f) for a, f in zip(fs[2:], (-np.inf, 0, -np.inf)))
    return FrontierScores(np.asarray(steps, np.float64).sum(axis=1), steps, *rest)


def assemble(batch: SequenceBatch, skip, steps, top_lps, top_ids, eos_lps) -> FrontierScores:
    """Mask, sum and align (by ``skip``) one forward's per-position arrays.

    Args:
      batch: the scored rows.
      skip: None or int[N]: leading steps of each row left out of its score (a prompt).
      steps: float[N, W] log-prob of each row's token at each position.
      top_lps, top_ids: float[N, W, m] / int[N, W, m] the per-position top-m.
      eos_lps: float[N, W] or None (no eos).
    """
    n, w = steps.shape[:2]
    mask = skip_mask(batch, skip, w)
    steps = np.where(mask, np.minimum(steps.astype(np.float64), 0.0), 0.0)
    top_lps = np.minimum(np.asarray(top_lps, np.float32), 0.0)
    top_ids = np.asarray(top_ids, np.int32)
    eos = np.full((n, w), -np.inf, np.float32) if eos_lps is None else np.minimum(np.asarray(eos_lps, np.float32), 0.0)
    scores = steps.sum(axis=1)
    if skip is not None:
        s = np.asarray(skip, np.int64).reshape(-1)
        steps = shift_left(steps, s, 0.0)
        top_lps = shift_left(top_lps, s, -np.inf).astype(np.float32)
        top_ids = shift_left(top_ids, s, 0).astype(np.int32)
        eos = shift_left(eos, s, -np.inf).astype(np.float32)
    return FrontierScores(scores, steps, top_lps, top_ids, eos)


def host_top_m(rows: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``m`` largest entries of each row of ``rows: float[B, V]`` and their ids: descending
    when ``m < V``; the whole row (padded with ``-inf`` / id 0 to ``m``), unordered, otherwise —
    a proof needs no order among a whole row. NaN is never in a model row (checked)."""
    b, v = rows.shape
    if m >= v:
        vals = np.full((b, m), -np.inf, np.float32)
        vals[:, :v] = rows
        ids = np.zeros((b, m), np.int32)
        ids[:, :v] = np.arange(v)
        return vals, ids
    part = np.argpartition(rows, v - m, axis=1)[:, v - m :]  # O(V) per row, then sort only the m kept
    ids = np.take_along_axis(part, np.argsort(-np.take_along_axis(rows, part, axis=1), axis=1), axis=1)
    vals = np.take_along_axis(rows, ids, axis=1).astype(np.float32)
    ids = ids.astype(np.int32)
    ids[vals == -np.inf] = 0
    return vals, ids


class StepScored:
    """``score_sequences`` and ``score_frontier`` of a model that implements
    ``step_logprobs(seqs) -> (batch, float32[N, W])`` (scores are masked float64 sums of those)
    and ``frontier_stats(seqs, top_m) -> (batch, steps, top_lps, top_ids, eos_lps)``, plus the
    protocol attributes ``vocab_size``, ``eos`` and ``max_len``."""

    # Nats a score may move between forwards (see the module docstring).
    score_tolerance = FLOAT32_TOLERANCE

    def score_sequences(self, seqs: Sequences, *, skip: ArrayLike | None = None) -> np.ndarray:
        """``float64[N]`` log-probs of whole sequences, EOS step included, padding masked.

        A sequence longer than ``max_len`` lies outside the support and scores ``-inf`` (a target
        shorter than its draft is asked about the draft's long sequences); it costs no forward.
        Shorter rows are scored as given (the sum of their steps: a prefix's log-prob).

        Args:
          seqs: a SequenceBatch, or a list of token sequences (tokens in ``[0, vocab_size)``).
          skip: optional int32[N]; the first ``skip[i]`` steps of row ``i`` are left out of its
            sum (a conditioning prompt), so several prompts' candidates share one call.
        """
        batch = as_sequence_batch(seqs)
        long = batch.lengths > self.max_len
        if long.any():
            check_tokens(batch, self.vocab_size, None)
            # Long rows ride along as empty rows (no steps) and are set to -inf below.
            batch = SequenceBatch(batch.tokens, np.where(long, 0, batch.lengths).astype(np.int32))
        batch, lps = self.step_logprobs(batch)
        mask = skip_mask(batch, skip, lps.shape[1])
        scores = np.where(mask, lps.astype(np.float64), 0.0).sum(axis=1)
        scores[long] = -np.inf
        return scores

    def score_frontier(self, seqs: Sequences, *, top_m: int, skip: ArrayLike | None = None) -> FrontierScores:
        """:meth:`score_sequences` plus each position's top-``top_m`` next-token log-probs and eos
        log-prob, all from ONE forward (see :class:`FrontierScores`). Every row must fit in
        ``max_len`` (a position past it has no distribution; callers cut rows there, as
        :mod:`jaxrescore.rescore.scored` does), else ValueError.

        Args:
          seqs: a SequenceBatch or a list of token sequences.
          top_m: how many of the likeliest next tokens to keep per position (capped at V).
          skip: optional int32[N], as in :meth:`score_sequences`; positions are then counted
            from the first scored step.
        """
        top_m = min(check_top_m(top_m), self.vocab_size)
        batch, steps, top_lps, top_ids, eos_lps = self.frontier_stats(seqs, top_m)
        return assemble(batch, skip, steps, top_lps, top_ids, None if self.eos is None else eos_lps)
