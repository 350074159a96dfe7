"""JaxLM: the shared host/device plumbing of every model that is a JAX logits function.

A subclass supplies ``apply(params, tokens: int32[B, T]) -> logits[B, T, V]`` (a hashable, pure
callable; ``tokens[:, 0]`` is the BOS id and position ``j`` predicts token ``j`` of the sequence)
and a ``params`` pytree. This class turns that into the AutoregressiveEnumerable protocol:

- ``score_sequences``: ONE teacher-forcing forward over ``[BOS] + tokens`` per chunk, per-step
  log-probs brought to the host and summed in float64 under the padding (and ``skip``) mask;
- ``next_logprobs``: the same forward over ``[BOS] + prefix``, log-softmax at the last real position;
- ``score_frontier``: ``score_sequences`` plus, from the same forward, each position's top-m
  next-token log-probs and eos log-prob, reduced on device (see :mod:`jaxrescore.models.scores`).

Every log-prob leaves the device clipped to ``<= 0`` (the convention of every model).

Device functions are module-level ``jax.jit``s taking ``params`` as an ARGUMENT and ``apply`` as a
static argument, so updated weights are always used and models with equal ``apply`` share
compiles. Batch rows are chunked and padded to powers of two (see :mod:`jaxrescore.models.batching`);
lengths are padded to powers of two capped at ``max_len``, so a sweep of queries sees only a few
shapes.

Right padding plus the causal mask is the padding mask: a real position only attends to earlier
positions, all real, so padding can never change a real position's output.

Meshes: with ``mesh`` (a ``jax.sharding.Mesh``) the batch axis of every forward is sharded over
all mesh axes and ``params`` are replicated or, with ``shard_params=True``, split over the
devices (see :mod:`jaxrescore.models.mesh` and ``with_mesh``).
"""

from __future__ import annotations

from functools import partial
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from jaxrescore._checks import check_int
from jaxrescore.models.base import check_support
from jaxrescore.models.batching import DeviceBatched, length_bucket
from jaxrescore.models.checks import check_nan, check_prefixes, check_tokens
from jaxrescore.models.mesh import check_mesh
from jaxrescore.models.prompt import PromptableMixin
from jaxrescore.models.scores import FULL_ROWS_MAX_VOCAB, StepScored, clipped_log_softmax
from jaxrescore.sequences import SequenceBatch, as_sequence_batch
from jaxrescore.typing import ArrayLike, PyTree, Sequences


@partial(jax.jit, static_argnums=0)
def _step_logprobs(apply, params, inputs, targets):
    """float32[B, T]: log p(targets[b, j] | inputs[b, :j+1])."""
    lp = clipped_log_softmax(apply(params, inputs))
    return jnp.take_along_axis(lp, targets[..., None], axis=-1)[..., 0]


@partial(jax.jit, static_argnums=(0, 4, 5))
def _frontier_stats(apply, params, inputs, targets, top_m, eos):
    """One forward's steps float32[B, T], top-m log-probs float32[B, T, m] and ids int32[B, T, m],
    and eos log-probs float32[B, T] (zeros when ``eos`` is None; the caller ignores them)."""
    lp = clipped_log_softmax(apply(params, inputs))
    steps = jnp.take_along_axis(lp, targets[..., None], axis=-1)[..., 0]
    top_lps, top_ids = jax.lax.top_k(lp, top_m)
    eos_lps = jnp.zeros_like(steps) if eos is None else lp[..., eos]
    return steps, top_lps, top_ids.astype(jnp.int32), eos_lps


@partial(jax.jit, static_argnums=(0, 4))
def _frontier_rows(apply, params, inputs, targets, eos):
    """Like :func:`_frontier_stats` with the WHOLE row per position (float32[B, T, V]) instead of
    a top-m: for a small vocabulary, shipping the rows costs less than a device sort of them."""
    lp = clipped_log_softmax(apply(params, inputs))
    steps = jnp.take_along_axis(lp, targets[..., None], axis=-1)[..., 0]
    eos_lps = jnp.zeros_like(steps) if eos is None else lp[..., eos]
    return steps, lp, eos_lps


@partial(jax.jit, static_argnums=0)
def _last_logprobs(apply, params, inputs, last):
    """float32[B, V]: the log-softmax row at position ``last[b]`` of each row."""
    logits = apply(params, inputs)
    row = jnp.take_along_axis(logits, last[:, None, None], axis=1)[:, 0]
    return clipped_log_softmax(row)


@partial(jax.jit, static_argnums=0)
def _all_logprobs(apply, params, inputs):
    """float32[B, T, V]: every position's next-token log-probs."""
    return clipped_log_softmax(apply(params, inputs))


class JaxLM(DeviceBatched, StepScored, PromptableMixin):
    """Base of JAX-backed models (see the module docstring).

    Attributes:
      vocab_size: V (output ids ``0..V-1``).
      eos: end-of-sequence id or None (fixed length).
      max_len: the longest sequence in the support, EOS included.
      bos_id: the id fed at position 0 (may be ``>= V``, e.g. an extra embedding row).
      apply: the hashable pure forward ``(params, tokens) -> logits``.
      params: the weights pytree passed to ``apply`` (assign a new one to update the model).
      mesh: optional ``jax.sharding.Mesh`` for data-parallel forwards (see :meth:`with_mesh`).
      chunk_tokens, chunk_rows, min_rows: how big one device call is (see :class:`DeviceBatched`).
    """

    def __init__(
        self,
        apply: Callable[..., jax.Array],
        params: PyTree,
        *,
        vocab_size: int,
        eos: int | None,
        max_len: int,
        bos_id: int,
        mesh: Mesh | None = None,
    ):
        vocab_size, eos, max_len = check_support(vocab_size, eos, max_len, type(self).__name__)
        self.bos_id = check_int(bos_id, "bos_id", minimum=0)
        self.apply = apply
        self.params = params
        self.vocab_size, self.eos, self.max_len = vocab_size, eos, max_len
        self.mesh = check_mesh(mesh)
        self._placed = None  # (params object, mesh, replicated params)

    trainable = True  # whether train_lm / distill may update ``params``
    uses_dropout = False  # whether ``apply(params, tokens, key)`` applies dropout in training

    def length_bucket(self, length: int) -> int:
        """The padded width for sequences of up to ``length`` tokens: a power of two (>= 8)
        capped at ``max_len``."""
        return length_bucket(length, self.max_len)

    def teacher_inputs(self, batch: SequenceBatch, width: int) -> tuple[np.ndarray, np.ndarray]:
        """``([BOS] + tokens)[:, :width]`` and ``tokens[:, :width]``, both int32[N, width], with
        padding positions set to 0 (arbitrary padding ids could make NaN activations, and a NaN
        times a zero attention weight is still NaN)."""
        toks = np.zeros((batch.size, width), np.int32)
        t = min(width, batch.tokens.shape[1])
        toks[:, :t] = np.where(batch.mask[:, :t], batch.tokens[:, :t], 0)
        inputs = np.empty_like(toks)
        inputs[:, 0] = self.bos_id
        inputs[:, 1:] = toks[:, :-1]
        return inputs, toks

    # ---- protocol ---------------------------------------------------------------------------

    def step_logprobs(self, seqs: Sequences) -> tuple[SequenceBatch, np.ndarray]:
        """The batch and ``float32[N, W]``: log-prob of each token given its prefix (W >= the
        longest length; entries at padding positions are meaningless, mask them)."""
        batch = as_sequence_batch(seqs)
        check_tokens(batch, self.vocab_size, self.max_len)
        width = self.length_bucket(int(batch.lengths.max(initial=0)))
        if batch.size == 0:
            return batch, np.zeros((0, width), np.float32)
        inputs, targets = self.teacher_inputs(batch, width)
        lps = self._chunked(partial(_step_logprobs, self.apply), inputs, targets)
        check_nan(self, lps, batch.lengths, "score_sequences")
        return batch, lps

    def frontier_stats(
        self, seqs: Sequences, top_m: int
    ) -> tuple[SequenceBatch, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The batch, then from one forward: steps float32[N, W], top-m log-probs float32[N, W, m]
        and ids int32[N, W, m], eos log-probs float32[N, W] (see :meth:`score_frontier`)."""
        batch = as_sequence_batch(seqs)
        check_tokens(batch, self.vocab_size, self.max_len)
        width = self.length_bucket(int(batch.lengths.max(initial=0)))
        if batch.size == 0:
            z = np.zeros((0, width), np.float32)
            return batch, z, np.zeros((0, width, top_m), np.float32), np.zeros((0, width, top_m), np.int32), z
        inputs, targets = self.teacher_inputs(batch, width)
        apply, eos = self.apply, self.eos
        if top_m >= self.vocab_size and self.vocab_size <= FULL_ROWS_MAX_VOCAB:
            # lax.top_k over the whole row is a sort: on CPU it made the forward 1.6x slower at
            # V=28, while the rows themselves are small. A whole row needs no order.
            fn = lambda params, i, t: _frontier_rows(apply, params, i, t, eos)  # noqa: E731
            steps, rows, eos_lps = self._chunked(fn, inputs, targets)
            check_nan(self, rows, batch.lengths, "score_frontier")
            ids = np.broadcast_to(np.arange(self.vocab_size, dtype=np.int32), rows.shape)
            return batch, steps, rows, ids, eos_lps
        fn = lambda params, i, t: _frontier_stats(apply, params, i, t, top_m, eos)  # noqa: E731
        steps, top_lps, top_ids, eos_lps = self._chunked(fn, inputs, targets)
        check_nan(self, steps, batch.lengths, "score_frontier")
        check_nan(self, top_lps, batch.lengths, "score_frontier")
        return batch, steps, top_lps, top_ids, eos_lps

    def position_logprobs(self, seqs: Sequences) -> tuple[SequenceBatch, np.ndarray]:
        """The batch and ``float32[N, W, V]``: the next-token log-probs before each position
        (row ``j`` is ``log p(. | tokens[:j])``; rows at padding positions are meaningless)."""
        batch = as_sequence_batch(seqs)
        check_tokens(batch, self.vocab_size, self.max_len)
        width = self.length_bucket(int(batch.lengths.max(initial=0)))
        inputs, _ = self.teacher_inputs(batch, width)
        if batch.size == 0:
            return batch, np.zeros((0, width, self.vocab_size), np.float32)
        tables = self._chunked(partial(_all_logprobs, self.apply), inputs)
        check_nan(self, tables, batch.lengths, "position_logprobs")
        return batch, tables

    def next_logprobs(self, prefixes: ArrayLike, lengths: ArrayLike) -> np.ndarray:
        """``float32[B, V]``: log-softmax next-token rows after each prefix.

        Args:
          prefixes: int32[B, T]; row ``b`` holds a prefix in its first ``lengths[b]`` positions.
          lengths: int32[B], each in ``[0, max_len - 1]``.
        """
        batch = check_prefixes(prefixes, lengths, self.vocab_size, self.max_len)
        prefixes, lengths = batch
        if batch.size == 0:
            return np.zeros((0, self.vocab_size), np.float32)
        width = self.length_bucket(int(lengths.max()) + 1)
        inputs, _ = self.teacher_inputs(batch, width)
        rows = self._chunked(partial(_last_logprobs, self.apply), inputs, lengths)
        check_nan(self, rows, None, "next_logprobs")
        return rows
