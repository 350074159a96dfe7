"""AppendedRows (jaxrescore.rescore.appended): the rows appended, in order, read-only, across
growth of the buffers."""

import numpy as np
import pytest

from jaxrescore.rescore.appended import AppendedRows


def test_views_are_the_blocks_concatenated_across_growth():
    rng = np.random.default_rng(0)
    rows = AppendedRows(((3,), (), (3, 2)), (np.int64, bool, np.float32), (-1, False, -np.inf))
    blocks = []
    for n, w in ((0, 3), (5, 3), (64, 1), (1, 0), (130, 3), (7, 2), (600, 3)):  # narrower blocks filled
        block = (rng.integers(-5, 5, (n, w)), rng.random(n) < 0.5, rng.standard_normal((n, w, 2)).astype(np.float32))
        rows.append(block)
        block = (np.pad(block[0], ((0, 0), (0, 3 - w)), constant_values=-1), block[1],
                 np.pad(block[2], ((0, 0), (0, 3 - w), (0, 0)), constant_values=-np.inf))
        blocks.append(block)
        view = rows.view()
        assert rows.rows == sum(len(b[0]) for b in blocks)
        for c, col in enumerate(view):
            want = np.concatenate([b[c] for b in blocks])
            assert col.dtype == want.dtype and np.array_equal(col, want)
    with pytest.raises(ValueError):
        view[0][0, 0] = 1  # a view is read-only: rows once written never change
