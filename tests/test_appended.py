"""AppendedRows (jaxrescore.rescore.appended): the rows appended, in order, read-only, across
growth of the buffers."""

import numpy as np
import pytest

from jaxrescore.rescore.appended import AppendedRows


def test_views_are_the_blocks_concatenated_across_growth():
    rng = np.random.default_rng(0)
    rows = AppendedRows(((3,), (), (3, 2)), (np.int64, bool, np.float32))
    blocks = []
    for n in (0, 5, 64, 1, 130, 7):
        block = (rng.integers(-5, 5, (n, 3)), rng.random(n) < 0.5, rng.standard_normal((n, 3, 2)).astype(np.float32))
        rows.append(block)
        blocks.append(block)
        view = rows.view()
        assert rows.rows == sum(len(b[0]) for b in blocks)
        for c, col in enumerate(view):
            want = np.concatenate([b[c] for b in blocks])
            assert col.dtype == want.dtype and np.array_equal(col, want)
    with pytest.raises(ValueError):
        view[0][0, 0] = 1  # a view is read-only: rows once written never change
