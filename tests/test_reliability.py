"""Regression tests of the rescoring layer's reliability defects (issue 10): positive float-noise
steps, memory that follows the answer rather than k, a gap the library's own observations refute,
and an index shared between threads."""

import math
import threading

import numpy as np
import pytest

from brute import TableModel, as_model, true_excess
from jaxrescore import CallableModel, RescoredIndex, SeekIndex
from jaxrescore.rescore import core


def test_positive_noise_steps_one_convention_for_every_path():
    """The issue's repro: a per-prefix table with log-probs up to 1e-5 above 0, the same model as
    draft and target, window 0, gap 0. Every path clips steps to 0, so the index, the target's
    scores and the answer agree, and what is certified is the true top-1."""
    ln2 = math.log(2)

    def fn(prefix):
        if prefix == ():
            return np.array([1, 2]), np.array([-ln2, -ln2 + 5e-6])
        if prefix == (1,):
            return np.array([0]), np.array([1e-5])
        return np.array([0]), np.array([0.0])

    model = CallableModel(fn, vocab_size=3, max_len=2)
    support = [(1, 0), (2, 0)]
    truth = model.score_sequences(support)
    assert truth.max() <= 0.0
    ri = RescoredIndex(SeekIndex(model), model, rerank_window=0, assumed_gap=0.0)
    r = ri.top_k(1)
    assert r.items[0][1] == pytest.approx(truth.max(), abs=0) and r.items[0][0] == support[int(np.argmax(truth))]
    assert r.certified is True and r.proven is True


def test_huge_k_costs_what_the_answer_costs():
    model = as_model(TableModel(3, 3, 0))
    ri = RescoredIndex(SeekIndex(model), model, rerank_window=0, assumed_gap=0.0)
    before = core.jax.config.jax_enable_x64
    for k in (2**26, 10**9, 2**31, 2**62):
        r = ri.top_k(k)
        assert len(r.items) == 27 and r.certified is True and r.proven is True
        assert "exhausted" in r.reason
    assert core.jax.config.jax_enable_x64 == before
    r = ri.slice(2**40, 3)
    assert r.items == [] and r.certified is True  # nothing exists at those ranks: exhausted


@pytest.mark.parametrize("seed, eos", [(0, None), (1, 2), (2, None), (3, 2)])
def test_a_refuted_gap_never_certifies(seed, eos):
    target = TableModel(3, 4, seed, eos=eos, temperature=2.0)
    draft = TableModel(3, 4, seed + 9, eos=eos, base=target, noise=1.0)
    excess = true_excess(draft, target, target.support())
    t_model, d_model = as_model(target), as_model(draft)
    refuted = 0
    for window in (0, 3, 10, 40):
        ri = RescoredIndex(SeekIndex(d_model), t_model, rerank_window=window, assumed_gap=excess / 4)
        r = ri.top_k(3)
        if "exhausted" in r.reason:
            assert r.certified is True  # the whole draft support was rescored: no gap needed
        elif r.excess > excess / 4 + 1e-3:
            refuted += 1
            assert r.certified is False and "refuted" in r.reason
    assert refuted  # some window sees a pair that breaks the gap without exhausting the draft


def test_a_rescored_index_shared_between_threads():
    target = TableModel(3, 5, 5, eos=2, temperature=2.0)
    draft = TableModel(3, 5, 6, eos=2, base=target, noise=0.5)
    t_model, d_model = as_model(target), as_model(draft)
    ks = [1, 2, 3, 5, 8, 13] * 3
    alone = {k: RescoredIndex(SeekIndex(d_model), t_model, rerank_window=2).top_k(k, prove=k % 2 == 1) for k in set(ks)}
    shared = RescoredIndex(SeekIndex(d_model, initial_bits=0.5), t_model, rerank_window=2)
    results, errors = {}, []

    def work(i, k):
        try:
            results[i] = shared.top_k(k, prove=k % 2 == 1)
        except Exception as err:  # pragma: no cover - reported below
            errors.append(err)

    threads = [threading.Thread(target=work, args=(i, k)) for i, k in enumerate(ks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for i, k in enumerate(ks):
        assert results[i].items == alone[k].items and results[i].proven == alone[k].proven
    assert shared.target_calls == sum(r.rounds for r in results.values())
