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
compiles. Batch rows are chunked (see ``DeviceBatched.chunk_tokens``) and padded to powers of two;
lengths are padded to powers of two capped at ``max_len``, so a sweep of queries sees only a few
shapes.

Right padding plus the causal mask is the padding mask: a real position only attends to earlier
positions, all real, so padding can never change a real position's output.

Meshes: with ``mesh`` (a ``jax.sharding.Mesh``, hand-built or from ``jax.make_mesh``, whatever
its axis types) the batch axis of every forward is sharded over all mesh axes and ``params`` are
replicated, or, with ``shard_params=True`` (see :meth:`DeviceBatched.with_mesh`), each weight is
split over all devices along its largest evenly divisible axis (a model larger than one device's
memory; XLA gathers what each layer needs). Forwards run on the mesh's devices with every axis
``Auto`` (the library's jitted functions place their own arrays; an ``Explicit`` mesh's typed
sharding is the user's, outside them), so ``jax.make_mesh``'s explicit axes and a hand-built mesh
give the same results as one device, to float noise.
"""

from __future__ import annotations

import contextlib
import copy
from functools import partial
from typing import Callable, Self

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from jaxrescore.models.base import check_int, check_support
from jaxrescore.models.scores import FULL_ROWS_MAX_VOCAB, FLOAT32_TOLERANCE, FrontierScores, assemble, check_top_m, skip_mask
from jaxrescore.models.prompt import PromptableMixin
from jaxrescore.sequences import SequenceBatch, as_sequence_batch, bucket_size, checked_batch
from jaxrescore.typing import ArrayLike, PyTree, Sequences


def _log_softmax(logits):
    """float32 log-softmax clipped to <= 0 (float noise can put a dominant entry at +1e-7)."""
    return jnp.minimum(jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1), 0.0)


@partial(jax.jit, static_argnums=0)
def _step_logprobs(apply, params, inputs, targets):
    """float32[B, T]: log p(targets[b, j] | inputs[b, :j+1])."""
    lp = _log_softmax(apply(params, inputs))
    return jnp.take_along_axis(lp, targets[..., None], axis=-1)[..., 0]


@partial(jax.jit, static_argnums=(0, 4, 5))
def _frontier_stats(apply, params, inputs, targets, top_m, eos):
    """One forward's steps float32[B, T], top-m log-probs float32[B, T, m] and ids int32[B, T, m],
    and eos log-probs float32[B, T] (zeros when ``eos`` is None; the caller ignores them)."""
    lp = _log_softmax(apply(params, inputs))
    steps = jnp.take_along_axis(lp, targets[..., None], axis=-1)[..., 0]
    top_lps, top_ids = jax.lax.top_k(lp, top_m)
    eos_lps = jnp.zeros_like(steps) if eos is None else lp[..., eos]
    return steps, top_lps, top_ids.astype(jnp.int32), eos_lps


@partial(jax.jit, static_argnums=(0, 4))
def _frontier_rows(apply, params, inputs, targets, eos):
    """Like :func:`_frontier_stats` with the WHOLE row per position (float32[B, T, V]) instead of
    a top-m: for a small vocabulary, shipping the rows costs less than a device sort of them."""
    lp = _log_softmax(apply(params, inputs))
    steps = jnp.take_along_axis(lp, targets[..., None], axis=-1)[..., 0]
    eos_lps = jnp.zeros_like(steps) if eos is None else lp[..., eos]
    return steps, lp, eos_lps


@partial(jax.jit, static_argnums=0)
def _last_logprobs(apply, params, inputs, last):
    """float32[B, V]: the log-softmax row at position ``last[b]`` of each row."""
    logits = apply(params, inputs)
    row = jnp.take_along_axis(logits, last[:, None, None], axis=1)[:, 0]
    return _log_softmax(row)


@partial(jax.jit, static_argnums=0)
def _all_logprobs(apply, params, inputs):
    """float32[B, T, V]: every position's next-token log-probs."""
    return _log_softmax(apply(params, inputs))


def check_nan(model, values: np.ndarray, lengths: np.ndarray | None, what: str) -> None:
    """ValueError when ``values`` (float[N, W, ...] per position, or float[N, ...] per row when
    ``lengths`` is None) hold a NaN at a real position: NaN or +inf logits (a log_softmax of them
    is NaN). Normalisation needs no check: every row is ``log_softmax`` of the model's logits, a
    distribution by construction (logits scaled by 0.5 are a different distribution, a
    temperature, not an error). A host pass over arrays that reached the host anyway."""
    bad = np.isnan(values)
    if bad.ndim > (1 if lengths is None else 2):
        bad = bad.reshape(bad.shape[: 1 if lengths is None else 2] + (-1,)).any(axis=-1)
    if lengths is not None:
        bad &= np.arange(bad.shape[1])[None, :] < np.asarray(lengths)[:, None]
    if bad.any():
        where = np.argwhere(bad)[0]
        at = f"row {int(where[0])}" if lengths is None else f"sequence {int(where[0])}, position {int(where[1])}"
        raise ValueError(
            f"{type(model).__name__}.{what} produced NaN log-probs at {at} ({int(bad.sum())} in all): "
            "its logits hold NaN or +inf"
        )


def check_mesh(mesh) -> Mesh | None:
    if mesh is not None and not isinstance(mesh, Mesh):
        raise TypeError(f"mesh must be a jax.sharding.Mesh or None, got {type(mesh).__name__}")
    return mesh


def auto_mesh(mesh: Mesh) -> Mesh:
    """``mesh`` with every axis ``Auto`` (same devices and axis names): what the library's jitted
    functions run on. A ``jax.make_mesh`` mesh has ``Explicit`` axes, under which indexing a
    replicated table by a sharded batch needs an explicit output sharding (ShardingTypeError)."""
    types = getattr(mesh, "axis_types", None)
    if types is None or all(t == AxisType.Auto for t in types):
        return mesh
    return Mesh(mesh.devices, mesh.axis_names, axis_types=(AxisType.Auto,) * len(mesh.axis_names))


def mesh_context(mesh: Mesh | None):
    """The context the library's device calls run in: ``jax.set_mesh`` of the ``Auto`` version of
    ``mesh`` (so a user's own ``jax.set_mesh`` of an explicit mesh around the call does not leak
    into them), or nothing without a mesh."""
    return contextlib.nullcontext() if mesh is None else jax.set_mesh(auto_mesh(mesh))


def param_spec(shape: tuple, devices: int, axes: tuple) -> PartitionSpec:
    """How one weight of ``shape`` is split over ``devices`` devices: along its largest axis whose
    size ``devices`` divides (over all mesh ``axes``), replicated when none does."""
    best = None
    for i, n in enumerate(shape):
        if n % devices == 0 and n >= devices and (best is None or n > shape[best]):
            best = i
    if best is None:
        return PartitionSpec()
    return PartitionSpec(*([None] * best + [axes]))


def place_params(params, mesh: Mesh, shard: bool):
    """``params`` on ``mesh``'s devices: replicated, or split leaf by leaf (:func:`param_spec`)."""
    mesh = auto_mesh(mesh)
    if not shard:
        return jax.device_put(params, NamedSharding(mesh, PartitionSpec()))
    n = mesh.devices.size

    def put(x):
        return jax.device_put(x, NamedSharding(mesh, param_spec(tuple(np.shape(x)), n, tuple(mesh.axis_names))))

    return jax.tree.map(put, params)


def check_tokens(batch: SequenceBatch, vocab_size: int, max_len: int | None, what: str = "seqs") -> None:
    """ValueError unless every real token lies in ``[0, vocab_size)`` and every length <= max_len
    (``max_len=None``: any length)."""
    if max_len is not None and batch.size and int(batch.lengths.max()) > max_len:
        i = int(np.argmax(batch.lengths))
        raise ValueError(
            f"{what}[{i}] has length {int(batch.lengths[i])} > max_len={max_len}"
        )
    real = batch.mask
    bad = real & ((batch.tokens < 0) | (batch.tokens >= vocab_size))
    if bad.any():
        i, j = (int(x) for x in np.argwhere(bad)[0])
        raise ValueError(
            f"{what}[{i}] has token {int(batch.tokens[i, j])} at position {j}; "
            f"tokens must lie in [0, {vocab_size})"
        )


def check_prefixes(prefixes, lengths, vocab_size: int, max_len: int) -> SequenceBatch:
    """The ``next_logprobs`` arguments as a checked SequenceBatch: ``prefixes: int32[B, T]``,
    ``lengths: int32[B]`` each in ``[0, max_len - 1]``, tokens in ``[0, vocab_size)``."""
    batch = checked_batch(prefixes, np.asarray(lengths).reshape(-1), what="prefixes")
    lengths = batch.lengths
    if lengths.size and lengths.max() >= max_len:
        raise ValueError(
            f"prefix lengths must lie in [0, {max_len - 1}] (max_len={max_len}), "
            f"got range [{int(lengths.min())}, {int(lengths.max())}]"
        )
    check_tokens(batch, vocab_size, max_len, what="prefixes")
    return batch


def check_eos_terminated(batch: SequenceBatch, eos: int, what: str) -> None:
    """ValueError unless every row ends with ``eos`` and has no earlier ``eos``."""
    n = batch.size
    last = batch.tokens[np.arange(n), np.maximum(batch.lengths - 1, 0)]
    bad = np.flatnonzero((batch.lengths == 0) | (last != eos))
    if bad.size:
        raise ValueError(f"{what}[{bad[0]}] does not end with eos={eos}; every sequence must")
    early = batch.mask & (batch.tokens == eos)
    early[np.arange(n), batch.lengths - 1] = False
    bad = np.flatnonzero(early.any(axis=1))
    if bad.size:
        raise ValueError(f"{what}[{bad[0]}] contains eos={eos} before its end")


class DeviceBatched(PromptableMixin):
    """Host-side batching shared by device-backed models: row chunks of about ``chunk_tokens``
    tokens per device (or exactly ``chunk_rows`` rows when that is set), padded to power-of-two
    row counts of at least ``min_rows`` (and a multiple of the mesh size), and, with a ``mesh``,
    the batch axis sharded over all mesh axes while ``params`` are replicated once per weights
    object. All chunks are dispatched before the first result is read, so the host pads chunk
    ``i + 1`` while the device computes chunk ``i``.

    Subclasses set ``params`` (the pytree every device call receives) and ``mesh`` and implement
    ``step_logprobs(seqs) -> (batch, float32[N, W])`` (scores are masked float64 sums of those) and
    ``frontier_stats(seqs, top_m) -> (batch, steps, top_lps, top_ids, eos_lps)``.
    """

    # Nats a score may move between forwards (see jaxrescore.models.scores).
    score_tolerance = FLOAT32_TOLERANCE
    # Token strings (token id i reads as vocabulary[i]) when the model carries them (set by
    # load_model from the file, or by the user; see jaxrescore.models.vocabulary.check_vocabulary).
    vocabulary: tuple[str, ...] | None = None

    # Tokens per device per call. On CPU a chunk whose activations stay in cache is ~3x faster
    # than a 256-row chunk (benchmarks/bench_throughput.py); accelerators want big chunks.
    chunk_tokens: int | None = None  # None: 2048 on CPU, 65536 on accelerators
    chunk_rows: int | None = None  # set to fix the rows per call instead
    # Small calls are padded to at least this many rows: a few wasted rows cost far less than
    # a compile per distinct small batch size.
    min_rows = 32

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
        log-prob, all from ONE forward, reduced on device (see
        :class:`~jaxrescore.models.scores.FrontierScores`). Every row must fit in ``max_len``
        (a position past it has no distribution; callers cut rows there, as
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

    # Whether the weights are split over the mesh's devices (see with_mesh) or replicated.
    shard_params = False

    def with_mesh(self, mesh: Mesh | None, *, shard_params: bool = False) -> Self:
        """A copy sharing the weights whose forwards shard the batch axis over ``mesh``
        (``None``: single device).

        Args:
          mesh: a ``jax.sharding.Mesh`` (hand-built, or ``jax.make_mesh``'s with explicit axis
            types) or None.
          shard_params: split every weight over all of the mesh's devices along its largest
            evenly divisible axis (a model larger than one device) instead of replicating it.
        """
        if not isinstance(shard_params, (bool, np.bool_)):
            raise ValueError(f"shard_params must be True or False, got {shard_params!r}")
        other = copy.copy(self)
        other.mesh = check_mesh(mesh)
        other.shard_params = bool(shard_params) and mesh is not None
        other._placed = None
        other.__dict__.pop("_decode_context", None)
        return other

    def _device_params(self):
        if self.mesh is None:
            return self.params
        cached = getattr(self, "_placed", None)
        if (
            cached is None or cached[0] is not self.params or cached[1] is not self.mesh
            or cached[3] != self.shard_params
        ):
            cached = (self.params, self.mesh, place_params(self.params, self.mesh, self.shard_params),
                      self.shard_params)
            self._placed = cached
        return cached[2]

    def _chunk(self, width: int) -> int:
        """Rows per device call for rows of ``width`` tokens: a power of two >= ``min_rows``."""
        if self.chunk_rows is not None:
            return check_int(self.chunk_rows, "chunk_rows", minimum=1)
        tokens = check_int(self.chunk_tokens, "chunk_tokens", minimum=1, allow_none=True)
        tokens = tokens or (2048 if jax.default_backend() == "cpu" else 65536)
        devices = 1 if self.mesh is None else self.mesh.devices.size
        rows = max(tokens * devices // max(width, 1), self.min_rows)
        return 1 << (rows.bit_length() - 1)

    def _rows_bucket(self, n: int) -> int:
        rows = bucket_size(n, self.min_rows)
        if self.mesh is not None:
            d = self.mesh.devices.size
            rows = -(-rows // d) * d
        return rows

    def _put(self, x: np.ndarray):
        """``x`` with its leading (batch) axis split over all mesh axes (unchanged without one)."""
        if self.mesh is None:
            return x
        mesh = auto_mesh(self.mesh)
        return jax.device_put(x, NamedSharding(mesh, PartitionSpec(mesh.axis_names)))

    def _chunked(self, fn, *arrays: np.ndarray):
        """``fn(params, *row_chunks)`` over row chunks padded to bucketed row counts; the
        results' first ``n`` rows concatenated on the host (per output when ``fn`` returns a
        tuple of arrays)."""
        with mesh_context(self.mesh):
            return self._chunked_on_mesh(fn, *arrays)

    def _chunked_on_mesh(self, fn, *arrays: np.ndarray):
        n = arrays[0].shape[0]
        params = self._device_params()
        step = self._chunk(arrays[0].shape[1] if arrays[0].ndim > 1 else 1)
        outs = []
        for start in range(0, n, step):
            part = [a[start : start + step] for a in arrays]
            m = part[0].shape[0]
            rows = self._rows_bucket(m)
            padded = [np.concatenate([p, np.zeros((rows - m,) + p.shape[1:], p.dtype)]) for p in part]
            outs.append((fn(params, *(self._put(p) for p in padded)), m))
        if isinstance(outs[0][0], tuple):
            return tuple(np.concatenate([np.asarray(out[i])[:m] for out, m in outs]) for i in range(len(outs[0][0])))
        return np.concatenate([np.asarray(out)[:m] for out, m in outs])


class JaxLM(DeviceBatched):
    """Base of JAX-backed models (see the module docstring).

    Attributes:
      vocab_size: V (output ids ``0..V-1``).
      eos: end-of-sequence id or None (fixed length).
      max_len: the longest sequence in the support, EOS included.
      bos_id: the id fed at position 0 (may be ``>= V``, e.g. an extra embedding row).
      apply: the hashable pure forward ``(params, tokens) -> logits``.
      params: the weights pytree passed to ``apply`` (assign a new one to update the model).
      mesh: optional ``jax.sharding.Mesh`` for data-parallel forwards (see :meth:`with_mesh`).
      chunk_tokens, chunk_rows: how big one device call is (see :class:`DeviceBatched`).
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
        return min(bucket_size(max(length, 1), 8), self.max_len)

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
