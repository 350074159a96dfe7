"""Padded arrays that grow by appended rows: a scored set's per-position arrays, round by round.

A proving search adds a block of rows each round and reads every row each round (the frontier,
the reuse plan). Concatenating every block again each round copied the whole ``[N, L, m]`` top-m
arrays each round (``N`` grows to thousands of rows of ``m = 64`` names per position); here each
append writes only its own rows into buffers that double when full, and a read is a view of the
rows written.
"""

from __future__ import annotations

import numpy as np


class AppendedRows:
    """Arrays of rows, one per column: ``shapes[c]`` trailing shape, ``dtypes[c]``. :meth:`append`
    writes a block of rows into every column; :meth:`view` gives the rows written, read-only
    (rows once written never change). Capacity not yet written is left uninitialised: no read
    reaches it (filling a grown ``[N, L, m]`` buffer was 2% of a wide proof)."""

    def __init__(self, shapes: tuple, dtypes: tuple):
        self._spec = list(zip(shapes, dtypes))
        self._bufs = [np.empty((0,) + tuple(s), d) for s, d in self._spec]
        self.rows = 0

    def append(self, columns: tuple) -> None:
        """Write ``columns`` (arrays of one row count, each of its column's trailing shape)."""
        n = int(columns[0].shape[0])
        if self.rows + n > self._bufs[0].shape[0]:
            capacity = max(2 * self._bufs[0].shape[0], self.rows + n, 64)
            grown = [np.empty((capacity,) + tuple(s), d) for s, d in self._spec]
            for new, old in zip(grown, self._bufs):
                new[: self.rows] = old[: self.rows]
            self._bufs = grown
        for buf, col in zip(self._bufs, columns):
            buf[self.rows : self.rows + n] = col
        self.rows += n

    def view(self) -> tuple:
        """The rows written, one read-only view per column."""
        out = []
        for buf in self._bufs:
            v = buf[: self.rows]
            v.flags.writeable = False
            out.append(v)
        return tuple(out)
