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
A host pool's memory outlives its session: a cleared or dropped session gives its buffers to a
process-wide spare list (:class:`SpareBuffers`) that the next session's pools are cut from.
"""

from __future__ import annotations

import collections
import sys
import threading
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from jaxrescore.models.cache_sizes import memory_share
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


def _host_pool(cache, capacity: int, rows: int = 0) -> tuple:
    """``(pool, buffers)``: a host pool of ``capacity`` rows cut from :data:`SPARE`'s buffers (its
    rows uninitialised) holding ``cache``'s first ``rows`` rows (a grown pool's used rows)."""
    leaves, tree = jax.tree.flatten(cache)
    pool, buffers = [], []
    for leaf in leaves:
        shape = (capacity,) + leaf.shape[1:]
        buf = SPARE.take(_nbytes(shape, leaf.dtype))
        out = _aligned_view(buf[0], shape, leaf.dtype)
        out[:rows] = np.asarray(leaf)[:rows]
        buf[1] = max(buf[1], _nbytes((rows,) + leaf.shape[1:], leaf.dtype))
        pool.append(out)
        buffers.append(buf)
    return jax.tree.unflatten(tree, pool), buffers


def aligned_empty(shape: tuple, dtype) -> np.ndarray:
    """An uninitialised numpy array whose data start on a :data:`DEVICE_ALIGN`-byte boundary (a
    host-memory device reads it in place)."""
    return _aligned_view(_raw(_nbytes(shape, dtype)), shape, dtype)


def _nbytes(shape: tuple, dtype) -> int:
    return int(np.prod(shape)) * np.dtype(dtype).itemsize


def _raw(size: int) -> np.ndarray:
    """uint8[size + DEVICE_ALIGN]: room for an aligned array of ``size`` bytes."""
    return np.empty(size + DEVICE_ALIGN, np.uint8)


def _aligned_view(raw: np.ndarray, shape: tuple, dtype) -> np.ndarray:
    """The aligned array of ``shape`` at the start of ``raw`` (see :func:`_raw`)."""
    skip = -raw.ctypes.data % DEVICE_ALIGN
    return raw[skip : skip + _nbytes(shape, dtype)].view(dtype).reshape(shape)


def spare_bytes() -> int:
    """The most written memory :class:`SpareBuffers` keeps: 4 GiB, or an eighth of the machine's
    memory if less."""
    return memory_share(4 << 30, 8)


class SpareBuffers:
    """Host pool memory that sessions gave back, for the next pools (process-wide, thread-safe).

    Why: a session's host pools are written once per row, and the first write to each page of
    fresh memory costs a page fault. On a virtual machine the hypervisor also backs the page then,
    which costs more. Measured on the real-text workload (2 cores, a VM), the 32-prompt proof wrote
    0.92 GB of row caches per call: 1.35-1.44 s when every session's pools were fresh memory,
    0.16 s into memory written before (the device's work waited for apart).

    A buffer is ``uint8[n]`` of any size at least the pool's; ``touched`` is how many of its bytes
    were written (pools fill their slots from the lowest). Spares are kept while their touched
    bytes total at most :func:`spare_bytes`, the most written first (a 32-prompt proof with the
    student draft writes ~1.4 GB of pools, more than one session's default budget);
    :meth:`release` frees them.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._spare: list = []  # [raw uint8 buffer, touched bytes], smallest buffer first
        # given back, not yet sorted in: a deque's append needs no lock, so a session dropped by
        # the garbage collector inside a locked section gives its buffers back without deadlock
        self._given: collections.deque = collections.deque()

    def take(self, size: int) -> list:
        """``[raw, touched]``: the smallest spare of at least ``size`` bytes (+ the alignment's),
        else fresh memory (touched 0)."""
        with self._lock:
            self._sort_in()
            for i, (raw, _) in enumerate(self._spare):
                if raw.size >= size + DEVICE_ALIGN:
                    return self._spare.pop(i)
        return [_raw(size), 0]

    def give(self, buffers: list) -> None:
        """Keep ``buffers`` (``[raw, touched]`` each; none may be in use) for later pools."""
        self._given.extend(buffers)
        if self._lock.acquire(blocking=False):  # else the holder sorts them in
            try:
                self._sort_in()
            finally:
                self._lock.release()

    def _sort_in(self) -> None:
        """Move the given buffers to the spares, the most written first, within the budget (the
        rest are dropped: their memory is freed). Call with the lock held."""
        while self._given:
            self._spare.append(self._given.popleft())
        budget, total, kept = spare_bytes(), 0, []
        for b in sorted(self._spare, key=lambda b: -b[1]):
            if b[1] > 0 and total + b[1] <= budget:
                kept.append(b)
                total += b[1]
        self._spare = sorted(kept, key=lambda b: b[0].size)

    def release(self) -> None:
        """Free every spare buffer."""
        with self._lock:
            self._given.clear()
            self._spare = []

    @property
    def nbytes(self) -> int:
        """Written bytes the spares hold."""
        with self._lock:
            self._sort_in()
            return sum(b[1] for b in self._spare)


SPARE = SpareBuffers()


def _take_host(pool: np.ndarray, slots: np.ndarray) -> np.ndarray:
    """Rows ``slots`` of a host pool's leaf, gathered into an aligned array (see
    :data:`DEVICE_ALIGN`): the decode call that reads them does not copy them again."""
    out = aligned_empty((slots.size,) + pool.shape[1:], pool.dtype)
    return np.take(pool, slots, axis=0, out=out, mode="clip")  # "raise" would copy via a buffer


@jax.jit
def _take(pool, idx):
    """Rows ``idx`` of every leaf (leading axis: rows)."""
    return jax.tree.map(lambda x: x[idx], pool)


def _pop_slots(held: list, m: int) -> np.ndarray:
    """int64[m]: free slots of pool ``held`` (see :class:`CachePools`), the last freed first, then
    never-used ones in ascending order (so a pool fills from its lowest slots)."""
    freed = held[2]
    n = min(len(freed), m)
    reused = freed[len(freed) - n :][::-1]
    del freed[len(freed) - n :]
    fresh = np.arange(held[4], held[4] + m - n, dtype=np.int64)
    held[4] += m - n
    return np.concatenate([np.asarray(reused, np.int64), fresh])


def pool_key(cache: PyTree, length: int) -> tuple:
    """The pool a cache's rows go to: its row-cache length, tree and per-row leaf shapes."""
    leaves, tree = jax.tree.flatten(cache)
    return (int(length), tree, tuple((x.shape[1:], str(x.dtype)) for x in leaves))


class CachePools:
    """Every pool of one session (see the module docstring)."""

    def __init__(self, put, host: bool = False):
        self._put = put  # host index array -> device (split over a mesh's batch axis)
        self.host = host  # pools as numpy arrays (see the module docstring)
        # key -> [pool pytree, capacity, freed slots (reused last freed first), a host pool's
        # buffers ([raw, touched bytes] per leaf, see SpareBuffers) or None, the first slot never
        # used (slots past it are free: a list of them would hold every slot of a host pool made
        # at its cap, 33M of them for a user's step model with 32-byte rows, ~3 s to build)]
        self._pools: dict = {}

    def clear(self) -> None:
        """Drop every pool (a host pool's memory goes to :data:`SPARE`)."""
        pools, self._pools = self._pools, {}
        SPARE.give([b for held in pools.values() if held[3] for b in held[3]])

    def __del__(self, _exiting=sys.is_finalizing):  # (bound here: module globals go at exit)
        if getattr(self, "_pools", None) and not _exiting():
            self.clear()

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
            # a host pool is made at its cap at once: fresh memory is pages the system backs only
            # when written, so a large pool costs nothing until filled, and never regrows
            least = bucket_size(max_rows, 1) if self.host else min(MIN_POOL_ROWS, bucket_size(max_rows, 1))
            capacity = max(bucket_size(rows, 1), least)
            if not self.host:
                self._pools[key] = [_grown(cache, capacity), capacity, [], None, m]
                return np.arange(m, dtype=np.int64)
            # a host pool starts empty: the rows are written below, as into any pool
            pool, buffers = _host_pool(cache, capacity)
            held = self._pools[key] = [pool, capacity, [], buffers, 0]
        free = len(held[2]) + held[1] - held[4]
        if free < m:  # grown four-fold (each growth copies the whole pool), to the cap
            capacity = bucket_size(held[1] - free + m, min(GROWTH * held[1], bucket_size(max_rows, 1)))
            if self.host:
                pool, buffers = _host_pool(held[0], capacity, held[4])  # (slots past held[4]: never used)
                SPARE.give(held[3])
                held[0], held[3] = pool, buffers
            else:
                held[0] = _grown(held[0], capacity)
            held[1] = capacity
        slots = _pop_slots(held, m)
        if self.host:
            for p, r, buf in zip(jax.tree.leaves(held[0]), jax.tree.leaves(cache), held[3]):
                p[slots] = np.asarray(r)[:m]
                buf[1] = max(buf[1], held[4] * _nbytes(p.shape[1:], p.dtype))
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

