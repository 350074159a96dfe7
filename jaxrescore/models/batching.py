"""DeviceBatched: how a device-backed model cuts, pads and places the rows of one call.

Rows go to the device in chunks of about ``chunk_tokens`` tokens per device (or exactly
``chunk_rows`` rows when that is set), each padded to a power-of-two row count of at least the
model's minimum (and a multiple of the batch's mesh devices), so a sweep of queries sees only a few
shapes. With a ``mesh`` the batch axis is sharded over the mesh's batch axes (all but ``model``)
and ``params`` are placed once per weights object (see :mod:`jaxrescore.models.mesh`). All chunks
are dispatched before the first result is read, so the host pads chunk ``i + 1`` while the device
computes chunk ``i``.

The minimum padded batch follows the model's size (:func:`padded_min_rows`): a padding row costs
a forward through every weight, so the padding a call may add is bounded in weight bytes. A small
model pads small calls to 32 rows (a few wasted rows cost far less than a compile per distinct
small batch size); a larger one pads to fewer, down to the next power of two from 1 above 64 MiB
of weights (a batch of 8 no longer pays for 32 rows: ~4x the cost per token, BENCHMARKS.md
"Small batches"). ``min_rows`` set on a model overrides the rule.
"""

from __future__ import annotations

import copy
from typing import Self

import jax
import numpy as np
from jax.sharding import Mesh

from jaxrescore._checks import check_bool, check_int
from jaxrescore.models.mesh import batch_devices, check_mesh, mesh_context, place_params, shard_batch, to_host
from jaxrescore.sequences import bucket_size
from jaxrescore.typing import PyTree

# The most weight bytes the padding rows of one call may stream, in rows x weight bytes: models
# up to 4 MiB of weights pad to MAX_MIN_ROWS rows, each doubling of the weights halves that, and
# models above 64 MiB (d_model 512 with 8 layers is ~97 MiB) pad from one row.
PADDING_BYTES = 128 << 20
# The most rows a small call is padded to: fewer shapes, fewer compiles.
MAX_MIN_ROWS = 32


def param_bytes(params: PyTree) -> int:
    """Bytes of every array leaf of ``params`` (as stored: a bfloat16 weight counts 2 a value)."""
    return int(sum(np.size(x) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(params) if hasattr(x, "dtype")))


def padded_min_rows(weight_bytes: int) -> int:
    """The fewest rows a device call is padded to for a model of ``weight_bytes``: the largest
    power of two with ``rows * weight_bytes <= PADDING_BYTES``, between 1 and ``MAX_MIN_ROWS``."""
    rows = PADDING_BYTES // max(int(weight_bytes), 1)
    return 1 if rows < 1 else min(MAX_MIN_ROWS, 1 << (rows.bit_length() - 1))


def length_bucket(length: int, max_len: int) -> int:
    """The padded width of a call for sequences of up to ``length`` tokens: a power of two (>= 8)
    capped at ``max_len``."""
    return min(bucket_size(max(length, 1), 8), max_len)


class DeviceBatched:
    """Host-side batching of a device-backed model (see the module docstring).

    Subclasses set ``params`` (the pytree every device call receives) and ``mesh``.

    Attributes:
      chunk_tokens: tokens per device per call (None: 2048 on CPU, 65536 on accelerators).
      chunk_rows: rows per call instead, when set.
      min_rows: the fewest rows a call is padded to (None: by the weights' size, see
        :func:`padded_min_rows`).
      shard_params: whether the weights are split over the mesh (its ``model`` axis, or all its
        devices) or replicated.
    """

    # On CPU a chunk whose activations stay in cache is ~3x faster than a 256-row chunk
    # (benchmarks/bench_throughput.py); accelerators want big chunks.
    chunk_tokens: int | None = None
    chunk_rows: int | None = None
    min_rows: int | None = None
    shard_params = False

    def with_mesh(self, mesh: Mesh | None, *, shard_params: bool = False) -> Self:
        """A copy sharing the weights whose forwards shard the batch axis over ``mesh``
        (``None``: single device).

        Args:
          mesh: a ``jax.sharding.Mesh`` (hand-built, or ``jax.make_mesh``'s with explicit axis
            types) or None.
          shard_params: split every weight along its largest evenly divisible axis over the
            mesh's ``model`` axis (over all its devices when it has none): a model larger than
            one device. Otherwise each weight is replicated.
        """
        shard_params = check_bool(shard_params, "shard_params")
        other = copy.copy(self)
        other.mesh = check_mesh(mesh)
        other.shard_params = shard_params and mesh is not None
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

    def _min_rows(self) -> int:
        """``min_rows`` when set, else :func:`padded_min_rows` of the current weights."""
        if self.min_rows is not None:
            return check_int(self.min_rows, "min_rows", minimum=1)
        sized = getattr(self, "_sized", None)
        if sized is None or sized[0] is not self.params:
            sized = (self.params, padded_min_rows(param_bytes(self.params)))
            self._sized = sized
        return sized[1]

    def _chunk(self, width: int) -> int:
        """Rows per device call for rows of ``width`` tokens: a power of two >= the minimum."""
        if self.chunk_rows is not None:
            return check_int(self.chunk_rows, "chunk_rows", minimum=1)
        tokens = check_int(self.chunk_tokens, "chunk_tokens", minimum=1, allow_none=True)
        tokens = tokens or (2048 if jax.default_backend() == "cpu" else 65536)
        rows = max(tokens * batch_devices(self.mesh) // max(width, 1), self._min_rows())
        return 1 << (rows.bit_length() - 1)

    def _rows_bucket(self, n: int) -> int:
        """The padded row count of a call of ``n`` rows."""
        rows = bucket_size(n, self._min_rows())
        d = batch_devices(self.mesh)
        return -(-rows // d) * d

    def _put(self, x: np.ndarray):
        """``x`` with its leading (batch) axis split over the model's mesh (see
        :func:`~jaxrescore.models.mesh.shard_batch`)."""
        return shard_batch(x, self.mesh)

    def _chunked(self, fn, *arrays: np.ndarray):
        """``fn(params, *row_chunks)`` over row chunks padded to bucketed row counts; the
        results' first ``n`` rows concatenated on the host (per output when ``fn`` returns a
        tuple of arrays), read by :func:`~jaxrescore.models.mesh.to_host` (on every process)."""
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
            return tuple(np.concatenate([to_host(out[i])[:m] for out, m in outs]) for i in range(len(outs[0][0])))
        return np.concatenate([to_host(out)[:m] for out, m in outs])
