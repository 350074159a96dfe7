"""Meshes: how the library's device calls run over a ``jax.sharding.Mesh``.

With a mesh, the batch axis of every forward is sharded over all mesh axes and the weights are
replicated, or split leaf by leaf over all devices (a model larger than one device's memory; XLA
gathers what each layer needs). Device calls run under the mesh with every axis ``Auto`` (the
library's jitted functions place their own arrays; an ``Explicit`` mesh's typed sharding is the
user's, outside them), so ``jax.make_mesh``'s explicit axes and a hand-built mesh give the same
results as one device, to float noise.
"""

from __future__ import annotations

import contextlib
import copy

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from jaxrescore._checks import check_bool


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


def shard_batch(x: np.ndarray, mesh: Mesh | None):
    """``x`` with its leading (batch) axis split over all mesh axes (unchanged without a mesh)."""
    if mesh is None:
        return x
    mesh = auto_mesh(mesh)
    return jax.device_put(x, NamedSharding(mesh, PartitionSpec(mesh.axis_names)))


def with_recorded_mesh(model, mesh: Mesh | None, shard_params):
    """A shallow copy of ``model`` with ``mesh`` (checked) as its ``mesh``: ``with_mesh`` of a
    model without weights to place (``shard_params`` is checked for a uniform interface)."""
    check_bool(shard_params, "shard_params")
    other = copy.copy(model)
    other.mesh = check_mesh(mesh)
    return other
