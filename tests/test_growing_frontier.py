"""The growing frontier (rescore/growing.py) against the whole computation, round by round.

Random scored sets grow by appended rows and fetched rows, as a search's do; after every round
the growing frontier must give the whole frontier's bound and exits exactly (same exits, same
order, same rows named), and a ``moved`` at least the whole computation's (the largest seen in
any round, never more).
"""

import numpy as np
import pytest

from jaxrescore.models.base import Structure
from jaxrescore.rescore.frontier import ScoredArrays, frontier, view_lengths
from jaxrescore.rescore.growing import GrowingFrontier


def _rows(rng, n, vocab, max_len, eos):
    """Token rows sharing prefixes (few likely tokens), cut as the target reads them."""
    width = max_len + 1
    likely = rng.choice(vocab, size=min(3, vocab), replace=False)
    toks = np.where(rng.random((n, width)) < 0.7, rng.choice(likely, size=(n, width)), rng.integers(0, vocab, (n, width)))
    if eos is not None:
        toks[rng.random((n, width)) < 0.15] = eos
    lens = rng.integers(0, width + 1, n)
    lens[rng.random(n) < 0.05] = 0  # a few empty views
    structure = Structure(vocab, eos, max_len)
    views = view_lengths(toks, lens, structure)
    return np.where(np.arange(width)[None, :] < views[:, None], toks, -1), views


def _numbers(rng, tokens, lengths, vocab, m, noise):
    """Per-position numbers that are a function of the prefix (plus ``noise``, so two forwards
    of one prefix may differ), top-m names included."""
    n, width = tokens.shape
    steps = np.zeros((n, width))
    top_lps = np.full((n, width, m), -np.inf, np.float32)
    top_ids = np.zeros((n, width, m), np.int32)
    eos_lps = np.full((n, width), -np.inf, np.float32)
    for i in range(n):
        for j in range(int(lengths[i])):
            key = hash(tuple(tokens[i, :j].tolist())) % (2**32)
            local = np.random.default_rng(key)
            lp = np.log(local.dirichlet(np.ones(vocab)))
            lp = lp + noise * rng.standard_normal(vocab) if noise else lp
            lp = np.minimum(lp, 0.0)
            order = np.argsort(-lp)[:m]
            top_lps[i, j, : order.size], top_ids[i, j, : order.size] = lp[order], order
            steps[i, j] = lp[tokens[i, j]]
            eos_lps[i, j] = lp[-1]
    return steps, top_lps, top_ids, eos_lps


def _fetched(rng, tokens, lengths, vocab, count):
    """``count`` fetched rows at prefixes of the rows (the empty prefix among them)."""
    prefixes, lens, values = [], [], []
    for i in rng.integers(0, tokens.shape[0], count):
        q = int(rng.integers(0, int(lengths[i]) + 1))
        prefixes.append(tokens[i, :q].tolist() + [-1] * (tokens.shape[1] - q))
        lens.append(q)
        values.append(np.log(rng.dirichlet(np.ones(vocab))).astype(np.float32))
    width = tokens.shape[1]
    return (np.array(prefixes, np.int64).reshape(-1, width), np.array(lens, np.int64),
            np.array(values, np.float32).reshape(-1, vocab))


@pytest.mark.parametrize("seed", range(12))
def test_each_round_equals_the_whole_frontier(seed):
    rng = np.random.default_rng(seed)
    vocab, max_len = int(rng.integers(3, 7)), int(rng.integers(1, 6))
    eos = [None, vocab - 1][seed % 2]
    m = int(rng.integers(1, vocab + 1))
    structure = Structure(vocab, eos, max_len)
    n = 160
    tokens, lengths = _rows(rng, n, vocab, max_len, eos)
    steps, top_lps, top_ids, eos_lps = _numbers(rng, tokens, lengths, vocab, m, 0.02 if seed % 3 == 0 else 0.0)
    whole = rng.random(n) < 0.8
    fetched = _fetched(rng, tokens, lengths, vocab, 6)
    growing, seen_moved = GrowingFrontier(), 0.0
    ends = sorted(set(rng.integers(1, n, 5).tolist())) + [n, n]
    floor = -np.inf
    for r, end in enumerate(ends):
        width = max(int(lengths[:end].max()), 1)
        k = min(r, len(fetched[1]))
        s = ScoredArrays(tokens[:end, :width], lengths[:end], whole[:end], steps[:end, :width], top_lps[:end, :width],
                         top_ids[:end, :width], eos_lps[:end, :width], fetched[0][:k, :width], fetched[1][:k],
                         fetched[2][:k], top_lps[:end, :width].max(axis=2))
        # floors mostly rise, sometimes drop back, sometimes list everything
        floor = [-np.inf, floor + rng.uniform(0.0, 1.5) if floor > -np.inf else -4.0, floor - 1.0][r % 3]
        want, got = frontier(s, structure, floor, rows_checked=True), growing(s, structure, floor)
        seen_moved = max(seen_moved, want.moved)
        assert got.bound == want.bound
        for name, a, b in zip(want.exits._fields, want.exits, got.exits):
            assert np.array_equal(a, b), (seed, r, name, a, b)
        assert want.moved <= got.moved <= seen_moved


def test_a_new_structure_or_a_smaller_set_starts_over():
    rng = np.random.default_rng(3)
    tokens, lengths = _rows(rng, 40, 4, 3, 3)
    steps, top_lps, top_ids, eos_lps = _numbers(rng, tokens, lengths, 4, 2, 0.0)
    empty = (np.zeros((0, tokens.shape[1]), np.int64), np.zeros(0, np.int64), np.zeros((0, 4), np.float32))

    def arrays(end):
        return ScoredArrays(tokens[:end], lengths[:end], np.ones(end, bool), steps[:end], top_lps[:end],
                            top_ids[:end], eos_lps[:end], *empty, None)

    growing = GrowingFrontier()
    for end, structure in ((30, Structure(4, 3, 3)), (40, Structure(5, 3, 3)), (20, Structure(5, 3, 3))):
        want, got = frontier(arrays(end), structure, -1.0), growing(arrays(end), structure, -1.0)
        assert got.bound == want.bound
        for a, b in zip(want.exits, got.exits):
            assert np.array_equal(a, b)
