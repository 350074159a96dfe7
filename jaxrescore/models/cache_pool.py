"""Held key/value row caches, pooled by shape: ONE device array per cache shape, rows in slots.

A decoding session extends rows from the caches of prefixes it computed in MANY earlier calls: a
best-first search's batch of 100 prefixes pops children of dozens of earlier calls. Held as one
array per call, those rows needed one device call per source array (measured on the real-text
workload: best-first's 68 batches of 100 rows ran 3,498 device calls, 76% of its wall time); in
a pool, one gather serves any mix of them, so a batch is one call per fed width.

A pool's leaves have a leading row axis of ``capacity`` rows (a power of two, grown 4x when full);
rows are written in place (the old array donated) and freed slots are reused. On a mesh the pool
keeps the row sharding of the caches it was made from.

Where the device is the host's own memory (the CPU backend, no mesh) a pool is a numpy array: its
gather and scatter are numpy's, so no program is compiled per pool capacity and batch size (on
the real-text workload those were 55 of the 95 XLA programs a first proven top-25 compiled).
"""

from __future__ import annotations

from functools import partial
import jax
import jax.numpy as jnp
import numpy as np

from jaxrescore.sequences import bucket_size
from jaxrescore.typing import PyTree

# The smallest pool: rows of a first call and a few more without a regrow (and its compile).
MIN_POOL_ROWS = 64
GROWTH = 4
# The CPU backend takes a numpy argument without copying it only when its data start on a
# 64-byte boundary; numpy's own allocations start 16 bytes past one. Measured (jax 0.10.2, 2
# cores): a 2,048-row gather of the real-text target's caches (four 33.5 MB leaves) copied on
# each decode call took 17 ms per leaf, 0.05 ms aligned.
DEVICE_ALIGN = 64


@partial(jax.jit, donate_argnums=0)
def _store(pool, idx, rows):
    """``pool`` with ``rows[i]`` written at slot ``idx[i]`` (an index past the pool: dropped)."""
    return jax.tree.map(lambda p, r: p.at[idx].set(r.astype(p.dtype), mode="drop"), pool, rows)


@partial(jax.jit, static_argnums=1)
def _grown(pool, capacity: int):
    """``pool``'s rows in a pool of ``capacity`` rows (the rest zeros)."""
    return jax.tree.map(lambda p: jnp.zeros((capacity,) + p.shape[1:], p.dtype).at[: p.shape[0]].set(p), pool)


def _grown_host(pool, capacity: int):
    """:func:`_grown` of a host pool (numpy leaves)."""
    def grow(p):
        out = np.zeros((capacity,) + p.shape[1:], p.dtype)
        out[: p.shape[0]] = np.asarray(p)
        return out

    return jax.tree.map(grow, pool)


def aligned_empty(shape: tuple, dtype) -> np.ndarray:
    """An uninitialised numpy array whose data start on a :data:`DEVICE_ALIGN`-byte boundary (a
    host-memory device reads it in place)."""
    dtype = np.dtype(dtype)
    size = int(np.prod(shape)) * dtype.itemsize
    raw = np.empty(size + DEVICE_ALIGN, np.uint8)
    skip = -raw.ctypes.data % DEVICE_ALIGN
    return raw[skip : skip + size].view(dtype).reshape(shape)


def _take_host(pool: np.ndarray, slots: np.ndarray) -> np.ndarray:
    """Rows ``slots`` of a host pool's leaf, gathered into an aligned array (see
    :data:`DEVICE_ALIGN`): the decode call that reads them does not copy them again."""
    out = aligned_empty((slots.size,) + pool.shape[1:], pool.dtype)
    return np.take(pool, slots, axis=0, out=out, mode="clip")  # "raise" would copy via a buffer


@jax.jit
def _take(pool, idx):
    """Rows ``idx`` of every leaf (leading axis: rows)."""
    return jax.tree.map(lambda x: x[idx], pool)


def pool_key(cache: PyTree, length: int) -> tuple:
    """The pool a cache's rows go to: its row-cache length, tree and per-row leaf shapes."""
    leaves, tree = jax.tree.flatten(cache)
    return (int(length), tree, tuple((x.shape[1:], str(x.dtype)) for x in leaves))


class CachePools:
    """Every pool of one session (see the module docstring)."""

    def __init__(self, put, host: bool = False):
        self._put = put  # host index array -> device (split over a mesh's batch axis)
        self.host = host  # pools as numpy arrays (see the module docstring)
        self._pools: dict = {}  # key -> [pool pytree, capacity, free slots (list, ascending pops)]

    def clear(self) -> None:
        self._pools.clear()

    def row_bytes(self, key: tuple) -> int:
        """Bytes one row of pool ``key`` takes."""
        return int(sum(int(np.prod(shape)) * np.dtype(dtype).itemsize for shape, dtype in key[2]))

    def store(self, key: tuple, cache: PyTree, m: int, max_rows: int) -> np.ndarray:
        """Write the first ``m`` rows of ``cache`` (its leaves' leading axis: rows) into pool
        ``key`` (:func:`pool_key`): free slots, the pool grown when it has too few (four-fold, not
        past the power of two covering ``max_rows`` unless the held rows need it); returns them."""
        rows = jax.tree.leaves(cache)[0].shape[0]
        held = self._pools.get(key)
        if held is None:  # the pool starts as this cache, its padding rows free
            # a host pool is made at its cap at once: numpy's zeros are pages the system backs
            # only when written, so a large pool costs nothing until filled, and never regrows
            least = bucket_size(max_rows, 1) if self.host else min(MIN_POOL_ROWS, bucket_size(max_rows, 1))
            capacity = max(bucket_size(rows, 1), least)
            pool = _grown_host(cache, capacity) if self.host else _grown(cache, capacity)
            held = self._pools[key] = [pool, capacity, list(range(capacity - 1, m - 1, -1))]
            return np.arange(m, dtype=np.int64)
        if len(held[2]) < m:  # grown four-fold (each growth copies the whole pool), to the cap
            capacity = bucket_size(held[1] - len(held[2]) + m, min(GROWTH * held[1], bucket_size(max_rows, 1)))
            held[0] = _grown_host(held[0], capacity) if self.host else _grown(held[0], capacity)
            held[2] = list(range(capacity - 1, held[1] - 1, -1)) + held[2]
            held[1] = capacity
        slots = np.array([held[2].pop() for _ in range(m)], np.int64)
        if self.host:
            for p, r in zip(jax.tree.leaves(held[0]), jax.tree.leaves(cache)):
                p[slots] = np.asarray(r)[:m]
            return slots
        idx = np.full(rows, held[1], np.int32)  # padding rows: past the pool, dropped
        idx[:m] = slots
        held[0] = _store(held[0], self._put(idx), cache)
        return slots

    def take(self, key: tuple, slots: np.ndarray) -> PyTree:
        """The rows ``slots`` (int32[B], padding rows any held slot) of pool ``key``."""
        if self.host:
            slots = np.asarray(slots, np.int64)
            return jax.tree.map(lambda p: _take_host(p, slots), self._pools[key][0])
        return _take(self._pools[key][0], self._put(np.asarray(slots, np.int32)))

    def free(self, key: tuple, slots) -> None:
        """Give slots back (their rows are overwritten by later stores)."""
        held = self._pools.get(key)
        if held is not None:
            held[2].extend(int(s) for s in slots)

    def capacity_bytes(self) -> int:
        """Bytes the pools take on the device (held rows and free slots)."""
        return sum(held[1] * self.row_bytes(key) for key, held in self._pools.items())

    def __repr__(self) -> str:
        return f"CachePools({len(self._pools)} pools, {self.capacity_bytes():,} bytes)"

