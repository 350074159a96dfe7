"""Meshes: how the library's device calls run over a ``jax.sharding.Mesh``, on one process or many.

Axes by name. A mesh axis named ``model`` (:data:`MODEL_AXIS`) holds the weights: with
``shard_params=True`` each weight is split over it (a model larger than one device) and
replicated over the other axes. Every other axis (``data``) holds the batch: the rows of a forward
are split over them and replicated over ``model``. A mesh without a ``model`` axis splits the
batch over all its axes and, with ``shard_params=True``, each weight over all its devices (XLA
gathers what each layer needs).

Device calls run under the mesh with every axis ``Auto`` (the library's jitted functions place
their own arrays; an ``Explicit`` mesh's typed sharding is the user's, outside them), so
``jax.make_mesh``'s explicit axes and a hand-built mesh give the same results as one device, to
float noise.

Several processes (JAX's multi-controller runtime, ``jax.distributed.initialize``): a mesh may
span devices other processes own, so a device result may be a global array no process can read
alone. Every read of a device result goes through :func:`to_host`, which gathers such an array
onto every process; every process runs the same program on the same host arrays (the batch put
on the mesh by :func:`shard_batch` must be equal on all of them) and reads the same answers.
"""

from __future__ import annotations

import contextlib
import copy
import math

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from jaxrescore._checks import check_bool

# The mesh axis the weights are split over (with ``shard_params=True``); the batch is split over
# every other axis.
MODEL_AXIS = "model"


def check_mesh(mesh) -> Mesh | None:
    """``mesh`` when it is a ``jax.sharding.Mesh`` or None; TypeError otherwise."""
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


def weight_axes(mesh: Mesh) -> tuple[str, ...]:
    """The axes a split weight is split over: ``("model",)`` when the mesh names one, else all."""
    names = tuple(mesh.axis_names)
    return (MODEL_AXIS,) if MODEL_AXIS in names else names


def batch_axes(mesh: Mesh) -> tuple[str, ...]:
    """The axes a batch's rows are split over: every axis but ``model``."""
    return tuple(a for a in mesh.axis_names if a != MODEL_AXIS)


def batch_devices(mesh: Mesh | None) -> int:
    """How many ways a batch's rows are split (1 without a mesh): a call's padded row count is a
    multiple of it."""
    if mesh is None:
        return 1
    return math.prod(mesh.shape[a] for a in batch_axes(mesh))


def param_spec(shape: tuple, devices: int, axes: tuple) -> PartitionSpec:
    """How one weight of ``shape`` is split over the mesh ``axes`` (``devices`` devices in all):
    along its largest axis whose size ``devices`` divides, replicated when none does."""
    best = None
    for i, n in enumerate(shape):
        if n % devices == 0 and n >= devices and (best is None or n > shape[best]):
            best = i
    if best is None:
        return PartitionSpec()
    return PartitionSpec(*([None] * best + [axes]))


def place_params(params, mesh: Mesh, shard: bool):
    """``params`` on ``mesh``'s devices: replicated, or split leaf by leaf over the weight axes
    (:func:`weight_axes`, :func:`param_spec`) and replicated over the others."""
    mesh = auto_mesh(mesh)
    if not shard:
        return jax.device_put(params, NamedSharding(mesh, PartitionSpec()))
    axes = weight_axes(mesh)
    n = math.prod(mesh.shape[a] for a in axes)

    def put(x):
        return jax.device_put(x, NamedSharding(mesh, param_spec(tuple(np.shape(x)), n, axes)))

    return jax.tree.map(put, params)


def shard_batch(x: np.ndarray, mesh: Mesh | None):
    """``x`` with its leading (batch) axis split over the mesh's batch axes (:func:`batch_axes`;
    unchanged without a mesh). Its row count must be a multiple of :func:`batch_devices`; over
    several processes, ``x`` must be the same on each (each places its own devices' rows)."""
    if mesh is None:
        return x
    mesh = auto_mesh(mesh)
    axes = batch_axes(mesh)
    return jax.device_put(x, NamedSharding(mesh, PartitionSpec(axes if axes else None)))


def to_host(x, dtype=None) -> np.ndarray:
    """``x`` as a numpy array readable on this process: THE read of a device result.

    A global array (split over devices of other processes too) is gathered onto every process
    (a collective: every process must read it, in the same order); a replicated or process-local
    one is copied from a local device; anything else goes through ``np.asarray``.
    """
    if isinstance(x, jax.Array) and not x.is_fully_addressable and not x.is_fully_replicated:
        x = multihost_utils.process_allgather(x, tiled=True)
    return np.asarray(x, dtype)


def with_recorded_mesh(model, mesh: Mesh | None, shard_params):
    """A shallow copy of ``model`` with ``mesh`` (checked) as its ``mesh``: ``with_mesh`` of a
    model without weights to place (``shard_params`` is checked for a uniform interface)."""
    check_bool(shard_params, "shard_params")
    other = copy.copy(model)
    other.mesh = check_mesh(mesh)
    return other
