"""The pure core: ordering, slicing, certificate rules and the vmapped sweep."""

import math

import jax
import numpy as np
import pytest

from jaxrescore.rescore.core import init_carry, rescore, rescore_sweep, update_carry

NAN = float("nan")


def run(target, draft=None, valid=None, edges=None, start=0, k=2, gap=NAN, k_max=4, carry=None):
    n = len(target)
    target = np.asarray(target, np.float32)
    draft = target if draft is None else np.asarray(draft, np.float32)
    valid = np.ones(n, bool) if valid is None else np.asarray(valid)
    edges = np.full(n, NAN, np.float32) if edges is None else np.asarray(edges, np.float32)
    return rescore(target, draft, valid, edges, start, k, np.float32(gap), carry or init_carry(), k_max=k_max)


def test_orders_by_target_ties_by_draft_rank_invalid_last():
    out, _ = run([-3.0, -1.0, -1.0, -np.inf, 5.0], valid=[1, 1, 1, 1, 0], k=4)
    assert out.perm[:3].tolist() == [1, 2, 0]
    assert out.log_probs[:3].tolist() == [-1.0, -1.0, -3.0]
    # -inf (outside the target's support) is never an answer: the slice is short.
    assert out.log_probs[3] == -np.inf and out.mask.tolist() == [True, True, True, False]


def test_slice_and_mask_past_the_valid_rows():
    out, _ = run([-1.0, -2.0, -3.0, -4.0], valid=[1, 1, 1, 0], start=1, k=3)
    assert out.perm[:2].tolist() == [1, 2]
    assert out.mask.tolist() == [True, True, False, False]
    assert np.isneginf(out.log_probs[2:]).all()


def test_certificate_none_without_gap_and_bound_nan():
    out, _ = run([-1.0, -2.0, -3.0], edges=[NAN, NAN, -5.0])
    assert int(out.certified) == -1 and np.isnan(out.bound)


def test_certificate_true_when_worst_clears_bound_plus_gap():
    out, _ = run([-1.0, -2.0, -3.0], edges=[NAN, NAN, -5.0], gap=2.5)
    assert int(out.certified) == 1 and out.bound == -5.0


def test_certificate_false_when_not_cleared_or_no_bound():
    out, _ = run([-1.0, -2.0, -3.0], edges=[NAN, NAN, -5.0], gap=3.5)
    assert int(out.certified) == 0
    out, _ = run([-1.0, -2.0, -3.0], gap=0.0)
    assert int(out.certified) == 0 and np.isnan(out.bound)


def test_equality_at_the_margin_never_certifies_through_rounding():
    # worst == bound + gap exactly in real numbers would pass; in float32 the margin refuses a
    # comparison that rounding could have tipped.
    out, _ = run([-1.0, -2.0], edges=[NAN, -2.1], gap=0.1, k=2)
    assert int(out.certified) == 0


def test_short_result_certifies_only_on_exhaustion():
    out, _ = run([-1.0, -2.0, 0.0, 0.0], valid=[1, 1, 0, 0], edges=[NAN, -np.inf, NAN, NAN], k=3, gap=0.0)
    assert int(out.certified) == 1 and np.isnan(out.bound)
    out, _ = run([-1.0, -2.0, 0.0, 0.0], valid=[1, 1, 0, 0], edges=[NAN, -50.0, NAN, NAN], k=3, gap=0.0)
    assert int(out.certified) == 0


def test_minus_inf_target_is_a_score_not_a_proof():
    out, _ = run([-1.0, -np.inf, -np.inf], edges=[NAN, NAN, -9.0], valid=[1, 1, 1], k=2, gap=0.0)
    assert out.log_probs[1] == -np.inf and int(out.certified) == 0


def test_empty_pull_uses_edge_zero():
    out, _ = run([0.0, 0.0], valid=[0, 0], edges=[-np.inf, NAN], k=1, gap=1.0)
    assert int(out.certified) == 1 and not out.mask.any()
    out, _ = run([0.0, 0.0], valid=[0, 0], edges=[NAN, NAN], k=1, gap=1.0)
    assert int(out.certified) == 0


def test_carry_tracks_gap_over_finite_valid_pairs():
    carry = init_carry()
    _, carry = run([-1.0, -2.0, -np.inf, -1.0], draft=[-1.5, -2.0, -1.0, -9.0], valid=[1, 1, 1, 0], carry=carry)
    assert (float(carry.max_gap), int(carry.sequences), int(carry.calls)) == (0.5, 3, 1)
    assert float(carry.max_excess) == 0.5  # target -1.0 over draft -1.5
    out, carry = run([-1.0], draft=[-1.25], carry=carry, k=1)
    assert float(out.gap) == 0.5 and int(carry.calls) == 2 and int(carry.sequences) == 4
    _, below = run([-3.0], draft=[-1.0], k=1)
    assert float(below.max_gap) == 2.0 and float(below.max_excess) == -2.0


def test_nan_target_rows_are_never_returned_and_void_the_certificate():
    out, _ = run([NAN, -1.0, -2.0], k=3)
    assert out.perm[:2].tolist() == [1, 2] and out.mask.tolist()[:3] == [True, True, False]
    # the bound is read at the end of the pulled prefix, and an unscored row blocks certification
    out, _ = run([NAN, -2.0, -3.0, -4.0], edges=[-1.0, -6.0, -7.0, -20.0], k=2, gap=0.5)
    assert int(out.certified) == 0 and float(out.bound) == -20.0


def test_negative_start_never_duplicates_rows_or_certifies():
    out, _ = run([-1.0, -2.0, -3.0], edges=[NAN, NAN, -50.0], start=-1, k=2, gap=0.0)
    assert out.mask.tolist()[:2] == [False, True] and out.perm[1] == 0
    assert int(out.certified) == 0


def test_jitted_vmapped_sweep_equals_per_query_loop():
    rng = np.random.default_rng(0)
    n, q = 32, 12
    target = np.sort(rng.normal(-5, 2, n)).astype(np.float32)[::-1].copy()
    rng.shuffle(target[:20])
    draft = (target + rng.normal(0, 0.3, n)).astype(np.float32)
    edges = np.linspace(-3, -20, n).astype(np.float32)
    extents = rng.integers(1, n + 1, q)
    valid = np.arange(n)[None, :] < extents[:, None]
    starts = rng.integers(0, 6, q).astype(np.int32)
    ks = rng.integers(1, 9, q).astype(np.int32)
    gaps = np.where(rng.random(q) < 0.3, np.nan, rng.uniform(0, 3, q)).astype(np.float32)
    carry = init_carry()
    sweep = jax.jit(rescore_sweep, static_argnames="k_max")
    batched, batch_carry = sweep(target, draft, valid, edges, starts, ks, gaps, carry, k_max=8)
    # The evidence rule: every query decides against the carry of everything the sweep scored.
    evidence = update_carry(carry, target, draft, valid.any(axis=0))
    for name in ("max_gap", "max_excess"):
        np.testing.assert_array_equal(getattr(batch_carry, name), getattr(evidence, name))
    for i in range(q):
        single, _ = rescore(target, draft, valid[i], edges, starts[i], ks[i], gaps[i], evidence, k_max=8)
        for name in single._fields:
            np.testing.assert_array_equal(np.asarray(getattr(batched, name))[i], np.asarray(getattr(single, name)))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_core_runs_in_either_precision(dtype):
    with jax.enable_x64(dtype == np.float64):
        t = np.array([-1.0, -2.0, -3.0], dtype)
        out, carry = rescore(t, t, np.ones(3, bool), np.array([NAN, NAN, -4.0], dtype), 0, 2, dtype(0.5),
                             init_carry(dtype), k_max=2)
        assert out.log_probs.dtype == dtype and int(out.certified) == 1 and math.isclose(float(out.bound), -4.0)
