"""Padded arrays that grow by appended rows: a scored set's per-position arrays, round by round.

A proving search adds a block of rows each round and reads every row each round (the frontier,
the reuse plan). Concatenating every block again each round copied the whole ``[N, L, m]`` top-m
arrays each round (``N`` grows to thousands of rows of ``m = 64`` names per position); here each
append writes only its own rows into buffers that grow :data:`GROWTH`-fold when full, and a read
is a view of the rows written.
"""

from __future__ import annotations

import numpy as np


GROWTH = 8
"""How many times larger a full buffer is made: capacity never written costs no memory (the
system backs a large array's pages only when they are written), and each growth copies every
row written so far (doubling copied about as much as the appends wrote)."""


class AppendedRows:
    """Arrays of rows, one per column: ``shapes[c]`` trailing shape, ``dtypes[c]``, ``fills[c]``
    for the part of a row a narrower block does not cover. :meth:`append` writes a block of
    rows into every column; :meth:`view` gives the rows written, read-only (rows once written
    never change). Capacity not yet written is left uninitialised: no read reaches it."""

    def __init__(self, shapes: tuple, dtypes: tuple, fills: tuple):
        self._spec = list(zip(shapes, dtypes, fills))
        self._bufs = [np.empty((0,) + tuple(s), d) for s, d, _ in self._spec]
        self.rows = 0

    def append(self, columns: tuple) -> None:
        """Write ``columns`` (arrays of one row count, each of its column's trailing shape or
        narrower: the rest of its rows is that column's fill; a padded copy of a block cost as
        much as writing it)."""
        n = int(columns[0].shape[0])
        if self.rows + n > self._bufs[0].shape[0]:
            capacity = max(GROWTH * self._bufs[0].shape[0], self.rows + n, 64)
            grown = [np.empty((capacity,) + tuple(s), d) for s, d, _ in self._spec]
            for new, old in zip(grown, self._bufs):
                new[: self.rows] = old[: self.rows]
            self._bufs = grown
        for buf, col, (_, _, fill) in zip(self._bufs, columns, self._spec):
            rows = buf[self.rows : self.rows + n]
            if col.shape[1:] != rows.shape[1:]:
                rows[...] = fill
                rows = rows[(slice(None),) + tuple(slice(0, k) for k in col.shape[1:])]
            rows[...] = col
        self.rows += n

    def view(self) -> tuple:
        """The rows written, one read-only view per column."""
        out = []
        for buf in self._bufs:
            v = buf[: self.rows]
            v.flags.writeable = False
            out.append(v)
        return tuple(out)
