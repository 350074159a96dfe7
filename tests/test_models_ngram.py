import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxrescore.models.ngram import NGramLM
from model_checks import check_protocol


def corpus(n=300, seed=0, v=4, eos=0, max_len=5):
    rng = np.random.default_rng(seed)
    return [
        tuple(int(t) for t in rng.integers(1, v, size=rng.integers(0, max_len))) + (eos,)
        for _ in range(n)
    ]


@pytest.mark.parametrize("order", [1, 2, 3, 4])
def test_protocol_eos(order):
    seqs = corpus()
    m = NGramLM.fit(seqs, order=order, vocab_size=4, eos=0, discount=None)
    assert m.max_len == 5
    check_protocol(m, seqs[:12], atol=1e-5)


def test_protocol_fixed_length():
    rng = np.random.default_rng(1)
    seqs = [tuple(int(t) for t in rng.integers(0, 3, size=4)) for _ in range(100)]
    m = NGramLM.fit(seqs, order=3, vocab_size=3)
    assert m.eos is None and m.max_len == 4
    check_protocol(m, seqs[:10], atol=1e-5)
    # a fixed-length model is a distribution over all V**max_len sequences
    support = list(itertools.product(range(3), repeat=4))
    assert math.isclose(np.exp(m.score_sequences(support)).sum(), 1.0, rel_tol=1e-5)


def test_kneser_ney_by_hand():
    # bigram KN on "ab", "b" (V=3: a=1, b=2, eos=0; BOS=3), D=0.5
    m = NGramLM.fit([(1, 2, 0), (2, 0)], order=2, vocab_size=3, eos=0, discount=0.5)
    # unigram continuation counts: a <- {BOS}, b <- {a, BOS}, eos <- {b}; total 4, 3 types
    uni = np.array([1 - 0.5, 1 - 0.5, 2 - 0.5]) / 4 + 0.5 * 3 / 4 / 3
    ctx_b = np.array([2 - 0.5, 0, 0]) / 2 + 0.5 * 1 / 2 * uni  # after b: eos twice
    got = np.exp(m.next_logprobs(np.array([[1, 2]]), np.array([2])))[0]
    np.testing.assert_allclose(got, ctx_b, rtol=1e-5)
    after_a = np.array([0, 0, 1 - 0.5]) / 1 + 0.5 * 1 / 1 * uni
    got = np.exp(m.next_logprobs(np.array([[1]]), np.array([1])))[0]
    np.testing.assert_allclose(got, after_a, rtol=1e-5)
    # a context never seen (eos was never followed) backs off to the unigram
    got = np.exp(m.next_logprobs(np.array([[0]]), np.array([1])))[0]
    np.testing.assert_allclose(got, uni, rtol=1e-5)


def test_weights_equal_repetition():
    seqs = corpus(50, seed=3)
    w = np.arange(1, 51) % 4
    rep = [s for s, k in zip(seqs, w) for _ in range(k)]
    a = NGramLM.fit(seqs, order=3, vocab_size=4, eos=0, weights=w)
    b = NGramLM.fit(rep, order=3, vocab_size=4, eos=0)
    np.testing.assert_allclose(a.score_sequences(seqs), b.score_sequences(seqs), atol=1e-5)


def test_bad_input():
    with pytest.raises(ValueError, match="does not end with eos"):
        NGramLM.fit([(1, 2)], vocab_size=4, eos=0)
    with pytest.raises(ValueError, match="before its end"):
        NGramLM.fit([(1, 0, 2, 0)], vocab_size=4, eos=0)
    with pytest.raises(ValueError, match="fixed-length"):
        NGramLM.fit([(1, 2), (1,)], vocab_size=4)
    with pytest.raises(ValueError, match="tokens must lie"):
        NGramLM.fit([(1, 7, 0)], vocab_size=4, eos=0)
    with pytest.raises(ValueError, match="weights"):
        NGramLM.fit([(1, 0)], vocab_size=4, eos=0, weights=[-1.0])
    m = NGramLM.fit(corpus(), vocab_size=4, eos=0)
    with pytest.raises(ValueError, match="prefix lengths"):
        m.next_logprobs(np.zeros((1, 5), np.int32), np.array([5]))
    assert m.score_sequences([(1, 1, 1, 1, 1, 0)])[0] == -np.inf  # past max_len: outside the support
    # a prompt may hold eos (a chat turn ends with it): it is context, the next row the base's
    prompted = m.with_prompt([1, 0])
    np.testing.assert_allclose(
        prompted.next_logprobs(np.zeros((1, 3), np.int32), np.array([0])),
        m.next_logprobs(np.array([[1, 0, 0, 0]], np.int32), np.array([2])),
    )


def test_fit_is_vectorised_at_scale():
    rng = np.random.default_rng(0)
    lens = rng.integers(2, 10, size=100_000)
    toks = np.zeros((lens.size, 10), np.int32)
    toks[:, :9] = rng.integers(1, 28, size=(lens.size, 9))
    toks[np.arange(lens.size), lens - 1] = 0
    toks[np.arange(10)[None, :] >= lens[:, None]] = 0
    from jaxrescore.sequences import SequenceBatch

    m = NGramLM.fit(SequenceBatch(toks, lens.astype(np.int32)), order=4, vocab_size=28, eos=0)
    assert m.max_len == 9
    assert np.all(np.isfinite(m.score_sequences(SequenceBatch(toks[:300], lens[:300].astype(np.int32)))))


@settings(max_examples=25, deadline=None)
@given(
    data=st.lists(st.lists(st.integers(0, 2), min_size=3, max_size=3), min_size=1, max_size=30),
    weights=st.lists(st.integers(0, 5), min_size=30, max_size=30),
    order=st.integers(1, 4),
    discount=st.one_of(st.none(), st.floats(0.05, 1.0)),
)
def test_fixed_length_support_sums_to_one(data, weights, order, discount):
    """Every context's row is a distribution, for any corpus, weights, order and discount."""
    w = np.array(weights[: len(data)], float)
    w[0] += 1  # not all zero
    m = NGramLM.fit(data, order=order, vocab_size=3, weights=w, discount=discount)
    support = list(itertools.product(range(3), repeat=3))
    scores = m.score_sequences(support)
    assert np.all(np.isfinite(scores))
    assert math.isclose(np.exp(scores).sum(), 1.0, rel_tol=1e-5)


def test_sparse_tables_scale_with_distinct_ngrams_not_vocabulary():
    # V=50,257 (a GPT-2-sized vocabulary), order 8: memory is the distinct n-grams
    rng = np.random.default_rng(0)
    v = 50257
    seqs = [tuple(int(t) for t in rng.zipf(1.3, size=rng.integers(3, 30)) % (v - 1) + 1) + (0,) for _ in range(400)]
    tokens = sum(len(s) for s in seqs)
    m = NGramLM.fit(seqs, order=8, vocab_size=v, eos=0, discount=None)
    assert m.n_terms <= 8 * tokens and m.nbytes < 64 * 8 * tokens + 8 * v + 4096
    rows = m.next_logprobs(np.array([list(seqs[0][:5]), [1, 2, 3, 4, 5]], np.int32), [5, 3])
    assert rows.shape == (2, v)
    np.testing.assert_allclose(np.logaddexp.reduce(rows.astype(np.float64), axis=1), 0.0, atol=1e-5)
    check_protocol(m, seqs[:6], atol=1e-5)
    with pytest.raises(ValueError, match="order"):
        NGramLM.fit(seqs, order=17, vocab_size=v, eos=0)


def test_dense_model_files_still_load(tmp_path):
    import json

    from jaxrescore.models.checkpoint import FORMAT, META, _checksum, load_model, save_model

    # an order-2 model over V=3 in the dense format files had before sparse tables
    rows = np.log(np.array([[0.2, 0.5, 0.3], [0.6, 0.3, 0.1], [0.1, 0.1, 0.8], [0.3, 0.3, 0.4]], np.float32))
    arrays = {"table": rows, "keys/0": np.array([0], np.int64), "keys/1": np.array([0, 2, 3], np.int64)}
    meta = {"format": FORMAT, "version": 2, "kind": "NGramLM", "vocabulary": None,
            "config": {"order": 2, "vocab_size": 3, "eos": 0, "max_len": 4, "discounts": [0.75, 0.75]}}
    meta["checksum"] = _checksum(meta, arrays)
    np.savez(tmp_path / "old.npz", **{META: np.array(json.dumps(meta))}, **arrays)
    m = load_model(tmp_path / "old.npz")
    pre = np.array([[0], [1], [2], [0]], np.int32)
    got = m.next_logprobs(pre, [1, 1, 1, 0])  # contexts 0, 1 (unseen: backs off), 2, BOS (=3)
    np.testing.assert_allclose(got, rows[[1, 0, 2, 3]], atol=1e-6)
    save_model(m, tmp_path / "new.npz")
    np.testing.assert_array_equal(load_model(tmp_path / "new.npz").next_logprobs(pre, [1, 1, 1, 0]), got)


def test_rows_without_the_dense_cache_match_steps_and_share_backed_off_contexts(monkeypatch):
    """Past the dense cache (forced here), a row is built from the sparse levels: prefixes that
    back off to the same seen context get the same row (built once), every row agrees bit for
    bit with the per-step log-probs, and rows sum to one."""
    from jaxrescore.models.ngram import lookup

    monkeypatch.setattr(lookup, "DENSE_CELLS", 0)
    rng = np.random.default_rng(3)
    seqs = [tuple(int(t) for t in rng.integers(1, 40, size=rng.integers(1, 7))) + (0,) for _ in range(300)]
    m = NGramLM.fit(seqs, order=4, vocab_size=40, eos=0)
    assert m._dense_table() is None
    prefixes = [list(s[:-1]) for s in seqs[:50]] + [[39, 38, 37], [1, 38, 37], [39, 38, 37], []]
    width = max(map(len, prefixes)) or 1
    arr = np.zeros((len(prefixes), width), np.int32)
    for i, p in enumerate(prefixes):
        arr[i, : len(p)] = p
    lens = np.array([len(p) for p in prefixes], np.int32)
    rows = m.next_logprobs(arr, lens)
    np.testing.assert_allclose(np.logaddexp.reduce(rows.astype(np.float64), axis=1), 0.0, atol=1e-5)
    np.testing.assert_array_equal(rows[-4], rows[-2])  # the same prefix twice
    for i, p in enumerate(prefixes):
        alone = m.next_logprobs(arr[i : i + 1], lens[i : i + 1])[0]
        np.testing.assert_array_equal(rows[i], alone)  # a row does not depend on its batch
        full = [tuple(p) + (t,) for t in range(40) if len(p) + 1 < m.max_len or t == 0]
        _, steps = m.step_logprobs(full)
        np.testing.assert_array_equal(steps[:, len(p)], rows[i, [s[-1] for s in full]])


def _rows_above_cases(m, rng, n=60):
    """Prefixes and thresholds that probe every edge: a cell's exact value, -inf, 0, random."""
    lens = rng.integers(0, m.max_len, n).astype(np.int32)
    arr = rng.integers(0, m.vocab_size, (n, max(m.max_len - 1, 1))).astype(np.int32)
    rows = m.next_logprobs(arr, lens)
    thr = rows[np.arange(n), rng.integers(0, m.vocab_size, n)].copy()  # ties with a cell
    thr[::4] = rng.uniform(-12.0, 0.0, thr[::4].size)
    thr[1::7] = -np.inf  # every finite cell
    thr[2::9] = 0.0
    thr[3::11] = np.nextafter(thr[3::11], np.float32(0.0))  # just above a cell
    return arr, lens, rows, thr.astype(np.float32)


@pytest.mark.parametrize("dense_cache", [True, False])
def test_rows_above_a_threshold_are_the_sparsified_rows_bit_for_bit(monkeypatch, dense_cache):
    """next_logprobs_above (what a SeekIndex over a wide vocabulary asks a table model for) gives
    exactly the cells of next_logprobs at or above each threshold, and a bound on the ones left
    out (at least the largest, below the threshold), with or without the dense cache, for a
    fitted model and one of a dense table with zeros."""
    from jaxrescore.index.seek.rows import RowChunk
    from jaxrescore.models.ngram import lookup

    if not dense_cache:
        monkeypatch.setattr(lookup, "DENSE_CELLS", 0)
    rng = np.random.default_rng(5)
    seqs = [tuple(int(t) for t in rng.zipf(1.3, size=rng.integers(1, 7)) % 59 + 1) + (0,) for _ in range(400)]
    fitted = NGramLM.fit(seqs, order=4, vocab_size=60, eos=0)
    table = np.log(rng.dirichlet(np.full(5, 0.3), size=1 + 6)).astype(np.float32)
    table[table < -6] = -np.inf  # impossible tokens: -inf cells, and rows backed off nowhere
    table[:, 0] = np.maximum(table[:, 0], -3.0)
    table -= np.logaddexp.reduce(table, axis=1, keepdims=True)
    tabled = NGramLM.from_table(table, [np.zeros(1, np.int64), np.arange(6, dtype=np.int64)],
                                order=2, vocab_size=5, eos=0, max_len=6, discounts=[0.5, 0.5])
    for m in (fitted, tabled):
        arr, lens, rows, thr = _rows_above_cases(m, rng)
        want = RowChunk.sparsify(np.arange(len(lens)), rows, thr)
        ptr, tok, val, rest = m.next_logprobs_above(arr, lens, thr)
        for got, exp in ((ptr, want.ptr), (tok, want.tok), (val, want.val)):
            assert got.dtype == exp.dtype
            np.testing.assert_array_equal(got, exp)
        assert rest.dtype == np.float32 and (rest >= want.rest).all()  # bounds every cell left out
        assert (rest < thr)[np.isfinite(thr)].all()  # and never claims a cell the threshold keeps
        assert np.isneginf(rest[np.isneginf(thr)]).all()  # a -inf threshold keeps every finite cell
        with monkeypatch.context() as mp:  # rows in blocks of a few candidates: the same answer
            mp.setattr(lookup, "CANDIDATE_CELLS", 5)
            for got, exp in zip(m.next_logprobs_above(arr, lens, thr), (ptr, tok, val, rest)):
                np.testing.assert_array_equal(got, exp)
    with pytest.raises(ValueError, match="thresholds"):
        fitted.next_logprobs_above(arr[:2], lens[:2], np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="thresholds"):
        fitted.next_logprobs_above(arr[:2], lens[:2], np.array([0.0, np.nan], np.float32))
