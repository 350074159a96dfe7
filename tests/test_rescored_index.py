"""RescoredIndex against brute force: every sentence of the spec's contract on listable models."""

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from brute import BruteIndex, TableModel, true_excess, true_gap, true_top_scores
from jaxrescore import Quantizer, RescoredIndex, RescoreResult
from jaxrescore.rescore.answer import TRACE_COUNTS


class Spy:
    """A bare-callable target that records its calls."""

    def __init__(self, model):
        self.model, self.calls = model, []

    def __call__(self, seqs):
        self.calls.append(list(seqs))
        return self.model(seqs)


def pair(seed, *, vocab=3, max_len=4, eos=None, noise=0.4):
    draft = TableModel(vocab, max_len, seed, eos=eos)
    target = TableModel(vocab, max_len, seed + 1000, eos=eos, base=draft, noise=noise)
    return draft, target


def assert_is_true_slice(result, target, support, start, k):
    want = true_top_scores(target, support, start, k)
    got = [lp for _, lp in result.items]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


# --- the contract, sentence by sentence -------------------------------------------------------


def test_every_returned_log_prob_is_the_targets_exact_score_in_target_order():
    draft, target = pair(1)
    result = RescoredIndex(BruteIndex(draft), target, rerank_window=5).top_k(6)
    assert len(result.items) == 6
    for seq, lp in result.items:
        assert lp == target.log_prob(seq)
    lps = [lp for _, lp in result.items]
    assert lps == sorted(lps, reverse=True)


def test_top_k_pulls_k_plus_window_and_makes_one_target_call():
    draft, target = pair(2)
    spy, index = Spy(target), BruteIndex(draft)
    rescored = RescoredIndex(index, spy, rerank_window=7)
    result = rescored.top_k(5)
    assert len(spy.calls) == 1 and spy.calls[0] == [index.rows[i][1] for i in range(12)]
    pulled = sorted(target(spy.calls[0]), reverse=True)[:5]
    assert [lp for _, lp in result.items] == pulled
    assert (rescored.target_calls, rescored.target_sequences) == (1, 12)
    assert list(result.draft_ranks) == [spy.calls[0].index(s) for s, _ in result.items]


def test_slice_is_the_target_reranked_window_of_the_pulled_head():
    draft, target = pair(3)
    spy, index = Spy(target), BruteIndex(draft)
    result = RescoredIndex(index, spy, rerank_window=4).slice(3, 5)
    pulled = spy.calls[0]
    assert len(pulled) == 12
    assert [lp for _, lp in result.items] == sorted(target(pulled), reverse=True)[3:8]


def test_exact_when_no_unpulled_sequence_outscores_the_returned_ones():
    draft, target = pair(4)
    support = draft.support()
    result = RescoredIndex(BruteIndex(draft), target, rerank_window=len(support)).top_k(10)
    assert_is_true_slice(result, target, support, 0, 10)


def test_certified_is_none_without_gap_and_gap_is_still_reported():
    draft, target = pair(5)
    result = RescoredIndex(BruteIndex(draft), target, rerank_window=3).top_k(4)
    assert result.certified is None and result.bound is None and result.gap > 0
    assert "not attempted" in result.reason


def test_no_quantizer_means_false_not_true():
    draft, target = pair(6)
    index = BruteIndex(draft, with_bound=False)
    del index.quantizer
    result = RescoredIndex(index, target, rerank_window=5, assumed_gap=10.0).top_k(3)
    assert result.certified is False and result.bound is None and "quantizer" in result.reason


def test_mxr_080_0233_unpulled_item_in_the_edge_bucket_with_higher_score():
    # Two sequences in one fine bucket, the better one ranked later (ties are lexicographic).
    q = Quantizer(1.0, 8)

    class Index:
        quantizer = q
        rows = [((0,), -0.10), ((1,), -0.90), ((2,), -0.87)]  # -0.90 and -0.87 share bucket 10

        def unrank(self, i):
            if i >= len(self.rows):
                raise IndexError(i)
            return self.rows[i]

        def bucket_bound(self, n):
            return -math.inf if n >= len(self.rows) else float(q.edge(q.fine_bucket(self.rows[n][1]), 1))

    assert q.fine_bucket(-0.90) == q.fine_bucket(-0.87) == 10
    target = lambda seqs: [dict(Index.rows)[s] for s in seqs]  # noqa: E731 (target == draft)
    result = RescoredIndex(Index(), target, rerank_window=0, assumed_gap=0.0).top_k(2)
    assert [s for s, _ in result.items] == [(0,), (1,)]
    # The edge item's own score (-0.90) would "clear" itself; the sound bucket edge does not.
    assert result.certified is False and result.bound > -0.87


def test_bound_is_the_bucket_edge_never_the_edge_items_score():
    draft, target = pair(7)
    index = BruteIndex(draft)
    result = RescoredIndex(index, target, rerank_window=2, assumed_gap=0.0).top_k(3)
    edge_lp = index.rows[4][2]
    assert result.bound is not None and result.bound >= index.rows[5][2] and result.bound >= edge_lp


def test_short_result_certifies_on_true_exhaustion_only():
    draft, target = pair(8, vocab=2, max_len=2)
    gap = true_excess(draft, target, draft.support())  # exhaustion leans on a true gap too
    full = RescoredIndex(BruteIndex(draft), target, rerank_window=0, assumed_gap=gap).top_k(10)
    assert len(full.items) == 4 and full.certified is True and full.bound is None
    assert "exhausted" in full.reason
    truncated = BruteIndex(draft, budget_bits=1.0)
    assert truncated.truncated and 0 < len(truncated) < 4
    short = RescoredIndex(truncated, target, rerank_window=0, assumed_gap=gap).top_k(10)
    assert len(short.items) == len(truncated) and short.certified is False


def test_running_out_is_exhaustion_only_with_an_explicit_report():
    draft, target = pair(9, vocab=2, max_len=2)
    gap = true_excess(draft, target, draft.support())
    index = BruteIndex(draft, with_bound=False, batch=False)
    result = RescoredIndex(index, target, rerank_window=5, assumed_gap=gap).top_k(2)
    assert result.certified is True and len(result.items) == 2 and "truncated=False" in result.reason
    refuted = RescoredIndex(index, target, rerank_window=5, assumed_gap=0.0).top_k(2)
    assert refuted.certified is False and "refuted" in refuted.reason  # exhaustion needs the gap too
    del index.truncated, index.dropped_upper  # e.g. an approximate index stopping at an estimate
    result = RescoredIndex(index, target, rerank_window=5, assumed_gap=gap).top_k(2)
    assert result.certified is False and "not proven exhaustion" in result.reason


def test_an_index_that_repeats_sequences_never_certifies():
    draft, target = pair(19, vocab=2, max_len=2)
    index = BruteIndex(draft)
    index.rows = [index.rows[0]] * 3 + index.rows  # the best sequence three extra times
    result = RescoredIndex(index, target, rerank_window=10, assumed_gap=5.0).top_k(3)
    seqs = [s for s, _ in result.items]
    assert len(set(seqs)) == 3 and result.certified is False and "more than once" in result.reason


def test_foreign_index_rules():
    draft, target = pair(10)
    support = draft.support()
    gap = true_gap(draft, target, support)
    foreign = BruteIndex(draft, with_bound=False)
    result = RescoredIndex(foreign, target, rerank_window=60, assumed_gap=gap).top_k(3)
    assert result.bound is not None and "foreign" in result.reason
    if result.certified:
        assert_is_true_slice(result, target, support, 0, 3)
    foreign.dropped_upper = 3
    assert RescoredIndex(foreign, target, rerank_window=60, assumed_gap=gap).top_k(3).certified is False
    del foreign.truncated
    foreign.dropped_upper = 0
    result = RescoredIndex(foreign, target, rerank_window=60, assumed_gap=gap).top_k(3)
    assert result.certified is False and "truncated" in result.reason


def test_foreign_bound_covers_per_step_floor_slack():
    # The reference rule bounds by the bucket of the edge item's TOTAL score; the index orders by
    # the SUM of per-step buckets, which can be up to (steps - 1) smaller. Ours must cover that.
    q = Quantizer(1.0, 1)
    draft, _ = pair(11, vocab=3, max_len=3)
    index = BruteIndex(draft, q, with_bound=False)
    for n in range(1, len(index)):
        b = RescoredIndex(index, draft, rerank_window=0, assumed_gap=0.0).draft.bound(n, _pull(index, n))
        assert all(row[2] <= b.value for row in index.rows[n:])


def _pull(index, n):
    from jaxrescore.rescore.draft import DraftView

    return DraftView(index).pull(n)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    eos=st.booleans(),
    k=st.integers(1, 6),
    start=st.integers(0, 3),
    window=st.integers(0, 40),
    noise=st.sampled_from([0.0, 0.2, 0.8]),
    budget=st.sampled_from([None, 4.0, 7.0]),
    bound_kind=st.sampled_from(["bucket_bound", "foreign"]),
    one_sided=st.booleans(),
)
def test_certified_is_never_wrong(seed, eos, k, start, window, noise, budget, bound_kind, one_sided):
    draft, target = pair(seed, vocab=3, max_len=4, eos=2 if eos else None, noise=noise)
    support = draft.support()
    # The certificate needs only target - draft <= gap (see rescore.core); test that claim too.
    gap = true_excess(draft, target, support) if one_sided else true_gap(draft, target, support)
    index = BruteIndex(draft, budget_bits=budget, with_bound=bound_kind == "bucket_bound")
    result = RescoredIndex(index, target, rerank_window=window, assumed_gap=gap).slice(start, k)
    if result.certified:
        assert_is_true_slice(result, target, support, start, k)


def test_battery_certifies_a_useful_share():
    certified = wrong = 0
    for seed in range(40):
        draft, target = pair(seed, noise=0.1)
        support = draft.support()
        gap = true_gap(draft, target, support)
        result = RescoredIndex(BruteIndex(draft), target, rerank_window=30, assumed_gap=gap).top_k(3)
        certified += bool(result.certified)
        if result.certified:
            wrong += true_top_scores(target, support, 0, 3) != [lp for _, lp in result.items]
    assert wrong == 0 and certified >= 10


# --- validation and failure atomicity ----------------------------------------------------------


@pytest.mark.parametrize("window", [-1, -0.5, 2.5, "5", True, float("nan")])
def test_bad_rerank_window(window):
    draft, target = pair(12)
    with pytest.raises(ValueError, match="rerank_window"):
        RescoredIndex(BruteIndex(draft), target, rerank_window=window)


@pytest.mark.parametrize("gap", [-0.1, float("nan"), float("inf"), "1", True])
def test_bad_assumed_gap(gap):
    draft, target = pair(12)
    with pytest.raises(ValueError, match="assumed_gap"):
        RescoredIndex(BruteIndex(draft), target, assumed_gap=gap)


def test_bad_k_and_start():
    draft, target = pair(12)
    rescored = RescoredIndex(BruteIndex(draft), target)
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="k must"):
            rescored.top_k(bad)
    for bad in (-1, 0.5, None):
        with pytest.raises(ValueError, match="start must"):
            rescored.slice(bad, 2)
    assert len(rescored.top_k(4.0).items) == 4


def test_bad_target_and_index_types():
    draft, _ = pair(12)
    with pytest.raises(TypeError, match="target"):
        RescoredIndex(BruteIndex(draft), 3.0)
    with pytest.raises(TypeError, match="draft_index"):
        RescoredIndex(object(), draft)


@pytest.mark.parametrize(
    "bad_target, match",
    [
        (lambda seqs: [0.0] * (len(seqs) - 1), "scores"),
        (lambda seqs: [float("nan")] + [-1.0] * (len(seqs) - 1), "nan"),
        (lambda seqs: [float("inf")] * len(seqs), "inf"),
        (lambda seqs: [5.0] * len(seqs), "<= 0"),
        (lambda seqs: [-1 - 0j] * len(seqs), "dtype complex"),
        (lambda seqs: [-1] * len(seqs), "dtype int"),
    ],
)
def test_bad_target_output_errors_and_leaves_state_unchanged(bad_target, match):
    draft, target = pair(13)
    state = {"ok": True}

    def flaky(seqs):
        return target(seqs) if state["ok"] else bad_target(seqs)

    rescored = RescoredIndex(BruteIndex(draft), flaky, rerank_window=3)
    rescored.top_k(2)
    before = rescored.carry
    state["ok"] = False
    with pytest.raises(ValueError, match=match):
        rescored.top_k(5)
    assert rescored.carry == before


def test_minus_inf_target_scores_are_valid_but_never_answers():
    """-inf is a valid score (outside the target's support); such sequences are never returned,
    so a pull with too few supported sequences gives a short, uncertified result."""
    draft, target = pair(14)
    off = {BruteIndex(draft).rows[i][1] for i in (0, 2, 4)}  # three of the pulled seven
    rescored = RescoredIndex(
        BruteIndex(draft), lambda s: [-math.inf if x in off else target.log_prob(x) for x in s],
        rerank_window=2, assumed_gap=50.0,
    )
    pulled = [row[1] for row in BruteIndex(draft).rows[:7]]
    result = rescored.top_k(5)
    finite = [s for s in pulled if s not in off]
    assert len(result.items) == min(5, len(finite)) and all(lp > -math.inf for _, lp in result.items)
    assert not {s for s, _ in result.items} & off
    assert len(result.items) == 4 and result.certified is False


def test_model_target_with_score_sequences():
    draft, target = pair(15)

    class Model:
        def score_sequences(self, seqs):
            return np.array(target(seqs))

    result = RescoredIndex(BruteIndex(draft), Model(), rerank_window=3).top_k(2)
    assert all(lp == target.log_prob(s) for s, lp in result.items)


def test_gap_is_a_running_max_over_everything_rescored():
    draft, target = pair(16, noise=0.5)
    index = BruteIndex(draft)
    rescored = RescoredIndex(index, target, rerank_window=0)
    g1 = rescored.top_k(1).gap
    g2 = rescored.top_k(40).gap
    pulled = [index.rows[i][1] for i in range(40)]
    assert g1 <= g2 and math.isclose(g2, true_gap(draft, target, pulled), rel_tol=1e-12)
    assert math.isclose(rescored.excess, true_excess(draft, target, pulled), rel_tol=1e-12)
    assert rescored.top_k(1).gap == g2
    assert isinstance(rescored.unrank(3), RescoreResult)


# --- sweep -------------------------------------------------------------------------------------


def test_sweep_equals_fresh_indexes_with_one_pull_and_one_call():
    draft, target = pair(17, noise=0.3)
    gap = true_gap(draft, target, draft.support())
    starts, ks = [0, 2, 5, 0, 1], [3, 4, 2, 6, 1]
    windows, gaps = [0, 5, 30, 12, 3], [gap, None, gap, 0.0, gap * 2]
    index, spy = BruteIndex(draft), Spy(target)
    results = RescoredIndex(index, spy, rerank_window=9).sweep(starts, ks, windows, gaps)
    assert len(spy.calls) == 1 and index.unrank_calls == 1
    widest = max(s + k + w for s, k, w in zip(starts, ks, windows))
    for s, k, w, g, got in zip(starts, ks, windows, gaps, results):
        # The evidence rule: each query decides on everything the sweep's one call scored, i.e.
        # as a fresh index asked after the sweep's widest pull.
        fresh = RescoredIndex(BruteIndex(draft), target, rerank_window=w, assumed_gap=g)
        fresh.slice(0, widest - w)
        # Costs differ by design: a swept result reports its whole call's positions.
        assert dataclasses.replace(got, positions=0) == dataclasses.replace(fresh.slice(s, k), positions=0)


def test_sweep_never_certifies_against_a_sequence_scored_in_its_own_call():
    """A narrow query whose own rows agree with the gap, swept with a wider query whose rows
    refute it: one call, one verdict on the gap."""
    draft, target = pair(17, noise=0.3)
    index = BruteIndex(draft)
    rows = [index.rows[i][1] for i in range(40)]
    narrow = true_excess(draft, target, rows[:2])
    wide = true_excess(draft, target, rows)
    assert wide > narrow + 1e-3
    gap = (narrow + wide) / 2
    alone = RescoredIndex(BruteIndex(draft), target, rerank_window=1, assumed_gap=gap).slice(0, 1)
    swept = RescoredIndex(BruteIndex(draft), target, rerank_window=1, assumed_gap=gap).sweep([0, 0], [1, 1], [1, 39])
    assert swept[0].excess == swept[1].excess == wide and swept[0].certified is False
    assert "refuted" in swept[0].reason and alone.excess == narrow


def test_sweep_validates_lengths():
    draft, target = pair(17)
    rescored = RescoredIndex(BruteIndex(draft), target)
    with pytest.raises(ValueError, match="one length"):
        rescored.sweep([0, 1], [1])
    with pytest.raises(ValueError, match="rerank_window"):
        rescored.sweep([0], [1], [-2])


def test_sweep_over_windows_does_not_recompile_per_window():
    draft, target = pair(18)
    rescored = RescoredIndex(BruteIndex(draft), target, assumed_gap=0.5)
    rescored.sweep([0] * 4, [5] * 4, [0, 1, 2, 3])
    before = TRACE_COUNTS["rescore_sweep"]
    for base in range(0, 48, 4):
        rescored.sweep([0] * 4, [5] * 4, [base + 40, base + 41, base + 42, base + 43])
    for w in range(40, 56):
        RescoredIndex(BruteIndex(draft), target, rerank_window=w, assumed_gap=0.5).top_k(5)
    # Pulls of 45..98 rows bucket to 64 and 128 rows: at most one new trace per row bucket and
    # query-count bucket, not one per window.
    assert TRACE_COUNTS["rescore_sweep"] - before <= 4


def test_gap_refuted_is_the_certificates_own_evidence():
    """``gap_refuted`` is the core's decision (excess above the gap by more than the target's
    tolerance), None without a gap; a refuted gap never certifies."""
    from brute import TableModel, as_model
    from jaxrescore import SeekIndex

    target = TableModel(4, 3, 1, eos=0, temperature=2.0)
    draft = as_model(TableModel(4, 3, 2, eos=0))  # independent: target - draft is large somewhere
    for gap, refuted in ((0.0, True), (50.0, False), (None, None)):
        r = RescoredIndex(SeekIndex(draft), as_model(target), rerank_window=20, assumed_gap=gap).top_k(3)
        assert r.gap_refuted is refuted
        if refuted:
            assert r.certified is False and "refuted" in r.reason
        if gap is not None:
            assert r.gap_refuted == (r.excess > gap + as_model(target).score_tolerance)
