"""Held key/value row caches, pooled by shape: ONE device array per cache shape, rows in slots.

A decoding session extends rows from the caches of prefixes it computed in MANY earlier calls: a
best-first search's batch of 100 prefixes pops children of dozens of earlier calls. Held as one
array per call, those rows needed one device call per source array (measured on the real-text
workload: best-first's 68 batches of 100 rows ran 3,498 device calls, 76% of its wall time); in
a pool, one gather serves any mix of them, so a batch is one call per fed width.

A pool's leaves have a leading row axis of ``capacity`` rows (a power of two, grown 4x when full);
rows are written in place (the old array donated) and freed slots are reused. On a mesh the pool
keeps the row sharding of the caches it was made from.

Where the device is the host's own memory (the CPU backend, no mesh) nothing is copied in: a
call's caches are kept as they came out of it (numpy views of the call's own output buffers, one
*block* per call, whose rows a session drops together), and a gather reads rows from any mix of
blocks with numpy. No program is compiled per pool capacity and batch size (on the real-text
workload those were 55 of the 95 XLA programs a first proven top-25 compiled), and no row is
written twice: copying every call's rows into one array took 7-10% of a text proof's wall.
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
# A host slot is ``block * BLOCK_SLOTS + row``: a call's rows are far fewer.
BLOCK_SLOTS = 1 << 32


@partial(jax.jit, donate_argnums=0)
def _store(pool, idx, rows):
    """``pool`` with ``rows[i]`` written at slot ``idx[i]`` (an index past the pool: dropped)."""
    return jax.tree.map(lambda p, r: p.at[idx].set(r.astype(p.dtype), mode="drop"), pool, rows)


@partial(jax.jit, static_argnums=1)
def _grown(pool, capacity: int):
    """``pool``'s rows in a pool of ``capacity`` rows (the rest zeros)."""
    return jax.tree.map(lambda p: jnp.zeros((capacity,) + p.shape[1:], p.dtype).at[: p.shape[0]].set(p), pool)


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
        self.host = host  # a call's rows kept as host blocks (see the module docstring)
        # device: key -> [pool pytree, capacity, free slots (list, ascending pops)]
        # host: key -> [{block id: (leaves, bytes)}, next block id]
        self._pools: dict = {}

    def clear(self) -> None:
        self._pools.clear()

    def row_bytes(self, key: tuple) -> int:
        """Bytes one row of pool ``key`` takes."""
        return int(sum(int(np.prod(shape)) * np.dtype(dtype).itemsize for shape, dtype in key[2]))

    def store(self, key: tuple, cache: PyTree, m: int, max_rows: int) -> np.ndarray:
        """Keep the first ``m`` rows of ``cache`` (its leaves' leading axis: rows) in pool
        ``key`` (:func:`pool_key`) and return their slots. On the host: the cache itself, as a
        block (its padding rows too, :meth:`block_bytes`, unless they are more than a quarter
        of it: then a copy of its ``m`` rows). On a device: written into free slots,
        the pool grown when it has too few (four-fold, not past the power of two covering
        ``max_rows`` unless the held rows need it)."""
        if self.host:
            held = self._pools.setdefault(key, [{}, 0])
            block = held[1]
            leaves = [np.asarray(x) for x in jax.tree.leaves(cache)]  # views: nothing copied
            if leaves[0].shape[0] - m > leaves[0].shape[0] // 4:  # mostly padding: its rows alone
                leaves = [x[:m].copy() for x in leaves]
            held[0][block] = (leaves, sum(x.nbytes for x in leaves))
            held[1] += 1
            return block * BLOCK_SLOTS + np.arange(m, dtype=np.int64)
        rows = jax.tree.leaves(cache)[0].shape[0]
        held = self._pools.get(key)
        if held is None:  # the pool starts as this cache, its padding rows free
            capacity = max(bucket_size(rows, 1), min(MIN_POOL_ROWS, bucket_size(max_rows, 1)))
            held = self._pools[key] = [_grown(cache, capacity), capacity, list(range(capacity - 1, m - 1, -1))]
            return np.arange(m, dtype=np.int64)
        if len(held[2]) < m:  # grown four-fold (each growth copies the whole pool), to the cap
            capacity = bucket_size(held[1] - len(held[2]) + m, min(GROWTH * held[1], bucket_size(max_rows, 1)))
            held[0] = _grown(held[0], capacity)
            held[2] = list(range(capacity - 1, held[1] - 1, -1)) + held[2]
            held[1] = capacity
        slots = np.array([held[2].pop() for _ in range(m)], np.int64)
        idx = np.full(rows, held[1], np.int32)  # padding rows: past the pool, dropped
        idx[:m] = slots
        held[0] = _store(held[0], self._put(idx), cache)
        return slots

    def block_bytes(self, key: tuple, slots: np.ndarray) -> int:
        """Bytes that keeping ``slots`` (one :meth:`store`'s) holds: on the host their whole
        block, padding rows included; on a device their rows."""
        if self.host:
            return self._pools[key][0][int(slots[0]) // BLOCK_SLOTS][1] if len(slots) else 0
        return len(slots) * self.row_bytes(key)

    def take(self, key: tuple, slots: np.ndarray) -> PyTree:
        """The rows ``slots`` (int[B], padding rows any held slot) of pool ``key``."""
        if not self.host:
            return _take(self._pools[key][0], self._put(np.asarray(slots, np.int32)))
        blocks = self._pools[key][0]
        slots = np.asarray(slots, np.int64)
        block, row = slots // BLOCK_SLOTS, slots % BLOCK_SLOTS
        ids = np.unique(block)
        first = blocks[int(ids[0])][0]
        if ids.size == 1:
            leaves = [x[row] for x in first]
        else:
            leaves = [np.empty((slots.size,) + x.shape[1:], x.dtype) for x in first]
            for b in ids.tolist():
                at = np.flatnonzero(block == b)
                for out, x in zip(leaves, blocks[b][0]):
                    out[at] = x[row[at]]
        return jax.tree.unflatten(key[1], leaves)

    def free(self, key: tuple, slots) -> None:
        """Give slots back (device: their rows are overwritten by later stores; host: their
        blocks are dropped, every row of a block being freed together)."""
        held = self._pools.get(key)
        if held is None:
            return
        if self.host:
            for b in {int(s) // BLOCK_SLOTS for s in slots}:
                held[0].pop(b, None)
        else:
            held[2].extend(int(s) for s in slots)

    def capacity_bytes(self) -> int:
        """Bytes the pools take (held rows and free slots; the host's blocks)."""
        if self.host:
            return sum(b for held in self._pools.values() for _, b in held[0].values())
        return sum(held[1] * self.row_bytes(key) for key, held in self._pools.items())

    def __repr__(self) -> str:
        return f"CachePools({len(self._pools)} pools, {self.capacity_bytes():,} bytes)"
