"""Quantizer bucket rule and edges; SequenceBatch packing."""

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxrescore.quantize import Quantizer
from jaxrescore.sequences import SequenceBatch, as_sequence_batch, bucket_size, from_tuples


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), "1", True])
def test_quantizer_rejects_bad_bin_width(bad):
    with pytest.raises((ValueError, TypeError), match="bin_width_bits"):
        Quantizer(bin_width_bits=bad)


@pytest.mark.parametrize("bad", [0, 2.5, True, "8"])
def test_quantizer_rejects_bad_oversample(bad):
    with pytest.raises(ValueError, match="oversample"):
        Quantizer(oversample=bad)


def test_exact_bucket_boundaries_and_positive_noise():
    q = Quantizer(1.0, 8)
    # exactly 1 bit is bucket 8, not 7, despite float noise in -log(0.5)/ln2
    assert q.step_buckets(math.log(0.5)) == 8
    assert q.step_buckets([1e-7, 0.0]).tolist() == [0, 0]
    assert q.step_buckets(-np.inf) > 10**15


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(st.floats(-12, 0, allow_nan=False), min_size=1, max_size=6),
    bw=st.sampled_from([0.25, 0.5, 1.0, 2.0]),
    ov=st.integers(1, 16),
)
def test_edge_bounds_every_sequence_in_the_bucket_or_deeper(steps, bw, ov):
    q = Quantizer(bw, ov)
    lps = np.array(steps)
    fb = int(q.step_buckets(lps).sum())
    # the edge of the sequence's own bucket, and of any shallower one, bounds it
    for shallower in (fb, fb - 1, max(fb - 3, 0)):
        assert lps.sum() <= q.edge(shallower, len(steps))
    assert q.edge(fb, len(steps)) <= 0


def test_fine_bucket_of_total_minus_steps_lower_bounds_structural_bucket():
    q = Quantizer(1.0, 1)
    rng = np.random.default_rng(0)
    for _ in range(2000):
        lps = -rng.exponential(1.0, rng.integers(1, 6))
        assert q.step_buckets(lps).sum() >= q.fine_bucket(lps.sum()) - (lps.size - 1)


def test_bucket_size_is_power_of_two():
    assert [bucket_size(n) for n in (0, 1, 8, 9, 100)] == [8, 8, 8, 16, 128]
    assert bucket_size(3, minimum=1) == 4


def test_a_batch_of_mixed_int_sequences_packs_as_each_one_alone():
    """from_tuples converts plain int sequences in one pass: tuples, lists, numpy rows and numpy
    scalars, empty rows, the largest int32 token; the result equals packing each row alone."""
    seqs = [(1, 2, 3), [], np.array([4, 5], np.int64), [np.int32(6)], (2**31 - 1,), (0,) * 5]
    batch = from_tuples(seqs)
    assert batch.lengths.dtype == np.int32 and batch.lengths.tolist() == [3, 0, 2, 1, 1, 5]
    for i, s in enumerate(seqs):
        alone = from_tuples([s], length=batch.tokens.shape[1])
        np.testing.assert_array_equal(alone.tokens[0], batch.tokens[i])
    assert batch.to_tuples() == [tuple(int(t) for t in s) for s in seqs]
    assert from_tuples([]).tokens.shape == (0, 1)
    with pytest.raises(ValueError, match="sequence 2 has a token outside"):
        from_tuples([(1,), (2,), (2**31,)])


def test_sequence_batch_round_trip_and_padding():
    seqs = [(1, 2, 3), (), (4,)]
    batch = from_tuples(seqs)
    assert batch.tokens.shape == (3, 3) and batch.lengths.tolist() == [3, 0, 1]
    assert batch.to_tuples() == seqs
    padded = batch.bucketed()
    assert padded.tokens.shape == (8, 8) and padded.to_tuples()[:3] == seqs
    assert padded.mask.sum() == 4
    with pytest.raises(ValueError, match="shrink"):
        padded.pad(rows=2)
    with pytest.raises(ValueError, match="token outside"):
        from_tuples([(1, -2)])
    assert as_sequence_batch(batch).to_tuples() == seqs
    assert as_sequence_batch(np.array([[1, 2], [3, 4]])).to_tuples() == [(1, 2), (3, 4)]
    with pytest.raises(ValueError, match="lengths"):
        as_sequence_batch(SequenceBatch(np.zeros((2, 3), np.int32), np.array([1, 5], np.int32)))
    assert list(itertools.chain(*from_tuples([(7,)], length=4).tokens.tolist())) == [7, 0, 0, 0]


def test_quantizer_and_from_tuples_follow_the_one_integer_rule():
    """jaxrescore._checks: an integral float is an integer, a fractional one or a bool is not."""
    assert Quantizer(oversample=4.0).oversample == 4 and isinstance(Quantizer(oversample=4.0).oversample, int)
    assert from_tuples([(1, 2)], length=4.0).tokens.shape == (1, 4)
    with pytest.raises(ValueError, match="bits"):
        Quantizer().budget(float("nan"))
