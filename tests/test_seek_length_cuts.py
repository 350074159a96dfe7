"""Terminating drafts cut at max_len: bounds with and without those cuts, against brute force.

The models here put probability on continuing past ``max_len`` (unlike the seek oracle's, which
force EOS at the last step), so the index really does cut prefixes at ``max_len``.
"""

import math

import numpy as np
import pytest

from brute import TableModel, true_gap, true_top_scores
from jaxrescore import CallableModel, RescoredIndex, SeekIndex


def as_callable(table):
    return CallableModel(
        lambda p: (np.arange(table.vocab_size), table.steps[tuple(p)]),
        vocab_size=table.vocab_size, max_len=table.max_len, eos=table.eos,
    )


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("oversample", [1, 8])
def test_bounds_cover_the_declared_support_with_and_without_length_cuts(seed, oversample):
    table = TableModel(3, 4, seed, eos=0)
    draft = as_callable(table)
    support = table.support()
    scores = dict(zip(support, draft.score_sequences(support)))  # the index's own float32 steps
    index = SeekIndex(draft, oversample=oversample, initial_bits=1.0, max_depth_bits=200.0, progress=False)
    while True:
        seqs, _ = index.unrank_batch(np.arange(len(index)))
        ranked = {s: i for i, s in enumerate(seqs)}
        for n in range(len(index) + 1):
            beyond = [lp for s, lp in scores.items() if ranked.get(s, n) >= n]
            with_cuts, without = index.bucket_bound(n), index.bucket_bound(n, length_cuts=False)
            assert without <= with_cuts
            assert without >= max(beyond) if beyond else without == -math.inf
        if len(index) == len(support):
            break
        index.ensure_count(len(index) + 1)
    # every declared-support sequence is indexed, yet the max_len cuts keep the index truncated
    assert index.truncated and index.bucket_bound(len(index)) > -math.inf


@pytest.mark.parametrize("seed", range(8))
def test_rescored_index_certifies_by_exhaustion_when_the_target_stops_at_max_len(seed):
    draft_table = TableModel(3, 4, seed, eos=0)
    target = TableModel(3, 4, seed + 50, eos=0, base=draft_table, noise=0.3)  # a callable with max_len
    support = draft_table.support()
    index = SeekIndex(as_callable(draft_table), progress=False)
    gap = true_gap(draft_table, target, support) + 1e-6  # float32 rows in the index
    whole = RescoredIndex(index, target, rerank_window=len(support), assumed_gap=gap).top_k(5)
    assert whole.certified is True and whole.bound is None and "exhausted" in whole.reason
    # a bare function has no max_len: the cut prefixes must then stay covered
    bare = RescoredIndex(index, lambda s: target(s), rerank_window=len(support), assumed_gap=gap).top_k(5)
    assert bare.certified is not True or bare.bound is not None
    for window in (0, 2, 8, 20):
        for k in (1, 3):
            result = RescoredIndex(index, target, rerank_window=window, assumed_gap=gap).top_k(k)
            if result.certified:
                np.testing.assert_allclose(
                    [lp for _, lp in result.items], true_top_scores(target, support, 0, k), atol=1e-9
                )
