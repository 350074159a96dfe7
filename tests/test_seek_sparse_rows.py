"""Sparse kept rows (row_storage="sparse", what a wide vocabulary gets by default): the index holds
the same sequences in the same order with the same bounds as with whole rows, against brute force,
through deepening (rows computed again when a budget reaches their bound), branch_cap, eos models,
logit masks and save/load; memory grows with the sequences, not with V."""

import functools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxrescore.index.seek import build, expand, rows
from jaxrescore.index.seek import SeekIndex
from jaxrescore.models.ngram import NGramLM
from test_seek_reliability import F32_MIN, _all, _check_against_brute, brute, table_model


def check(index, full, capped):
    """Sound against brute force (with branch_cap: the bounds; without: exactly the in-budget
    support in order)."""
    if not capped:
        _check_against_brute(index, full)
        return
    seqs, _ = _all(index)
    assert len(set(seqs)) == len(seqs) and set(seqs) <= {s for s, _, _ in full}
    ranked = {s: i for i, s in enumerate(seqs)}
    for n in range(len(index) + 1):
        beyond = [lp for s, _, lp in full if ranked.get(s, n) >= n]
        bound = index.bucket_bound(n, length_cuts=False)
        assert bound >= max(beyond) if beyond else bound == -math.inf


def state(index):
    seqs, lps = _all(index)
    return (seqs, lps.tolist(), index.truncated, index.dropped_upper,
            [index.bucket_bound(n) for n in range(len(index) + 1)],
            [index.bucket_bound(n, length_cuts=False) for n in range(len(index) + 1)])


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    seed=st.integers(0, 10**6),
    vocab=st.integers(2, 5),
    length=st.integers(1, 4),
    terminating=st.booleans(),
    cap=st.sampled_from([None, 1, 2]),
    masks=st.lists(st.sampled_from([-1e30, F32_MIN, -3e9, -np.inf]), max_size=1),
    quant=st.sampled_from([(1.0, 8), (0.5, 3), (2.0, 1)]),
    steps=st.lists(st.floats(0.0, 30.0), min_size=1, max_size=3),
)
def test_sparse_rows_match_whole_rows_and_brute_force(seed, vocab, length, terminating, cap, masks, quant, steps):
    eos = 0 if terminating else None
    model = table_model(vocab, length, seed, eos=eos, masks=tuple(masks))
    kw = dict(branch_cap=cap, bin_width_bits=quant[0], oversample=quant[1], max_depth_bits=40.0, progress=False)
    sparse = SeekIndex(model, initial_bits=steps[0], row_storage="sparse", **kw)
    dense = SeekIndex(model, initial_bits=steps[0], row_storage="dense", **kw)
    full = brute(model, sparse.quantizer)
    for bits in steps[1:] + [40.0]:
        assert state(sparse) == state(dense)
        check(sparse, full, cap is not None)
        sparse.ensure_bits(bits)
        dense.ensure_bits(bits)
    assert state(sparse) == state(dense)


def test_deepening_past_the_kept_margin_runs_the_model_again(monkeypatch, tmp_path):
    monkeypatch.setattr(expand, "KEEP_MARGIN_BITS", 0.5)  # keep almost nothing beyond the budget
    model = table_model(6, 5, 3, eos=0)
    sparse = SeekIndex(model, initial_bits=2.0, max_depth_bits=60.0, row_storage="sparse", progress=False)
    dense = SeekIndex(model, initial_bits=2.0, max_depth_bits=60.0, row_storage="dense", progress=False)
    full = brute(model, sparse.quantizer)
    for bits in (3.0, 5.0, 9.0, 14.0, 20.0):
        sparse.ensure_bits(bits)
        dense.ensure_bits(bits)
        assert state(sparse) == state(dense)
        _check_against_brute(sparse, full)
    assert sparse.forwards > dense.forwards  # left-out cells were needed: prefixes ran again
    sparse.save(tmp_path / "s.npz")
    back = SeekIndex.load(tmp_path / "s.npz", model, decode_cache_bytes=0)
    assert state(back) == state(sparse)
    assert (back.row_storage, back.decode_cache_bytes) == ("sparse", 0)  # V=6 would be "auto": dense
    for index in (back, sparse):  # growth by count (its predictions read the kept rows)
        index.ensure_count(3000)
        _check_against_brute(index, full)
    assert state(back) == state(sparse)


def test_a_wide_vocabulary_keeps_sparse_rows_by_default():
    rng = np.random.default_rng(0)
    v = 5000
    seqs = [tuple(int(t) for t in rng.zipf(1.5, size=rng.integers(2, 8)) % (v - 1) + 1) + (0,) for _ in range(300)]
    draft = NGramLM.fit(seqs, order=3, vocab_size=v, eos=0)
    sparse = SeekIndex(draft, initial_bits=12.0, progress=False)
    assert all(c.sparse for c in sparse.state.chunks)
    dense = SeekIndex(draft, initial_bits=12.0, progress=False, row_storage="dense")
    assert state(sparse) == state(dense)
    assert sparse.nbytes * 20 < dense.nbytes
    sparse.ensure_count(2000)
    dense.ensure_count(2000)
    assert state(sparse) == state(dense)
    with pytest.raises(ValueError, match="row_storage"):
        SeekIndex(draft, row_storage="compact")


class NoisyTableFn:
    """A table draft whose rows move by up to ``noise`` nats from call to call (renormalised), as
    a float model's rows move with batch composition, only far more."""

    def __init__(self, vocab, length, seed, noise):
        from test_seek_reliability import TableFn

        self.inner, self.noise, self.calls = TableFn(vocab, length, seed), noise, 0

    def __call__(self, prefixes, lengths):
        rows = self.inner(prefixes, lengths).astype(np.float64)
        self.calls += 1
        rows = rows + np.random.default_rng(self.calls).uniform(-self.noise, self.noise, rows.shape)
        rows -= np.log(np.exp(rows).sum(axis=1, keepdims=True))
        return rows.astype(np.float32)


def test_rows_computed_again_agree_with_what_the_index_already_holds(monkeypatch):
    """A row run again for a deeper budget keeps its stored cells and its bound: a model whose
    rows move between calls neither duplicates a child nor hides one below a built budget."""
    from jaxrescore.models.callable import CallableModel

    monkeypatch.setattr(expand, "KEEP_MARGIN_BITS", 0.25)
    for seed in range(4):
        fn = NoisyTableFn(5, 5, seed, noise=0.3)
        model = CallableModel(fn, vocab_size=5, max_len=5, eos=0, batched=True)
        index = SeekIndex(model, initial_bits=1.0, bin_width_bits=0.25, oversample=1, max_depth_bits=60.0,
                          row_storage="sparse", progress=False)
        rows_before = index.forwards
        for bits in np.arange(1.5, 14.0, 0.5):
            index.ensure_bits(float(bits))
            seqs, lps = _all(index)
            assert len(set(seqs)) == len(seqs)
            assert np.all(np.diff(index.state.seq_fb) >= 0)
        index.ensure_bits(60.0)  # the whole support: 4**n bodies of n = 0..4 tokens, then eos
        seqs, _ = _all(index)
        assert len(seqs) == sum(4**n for n in range(5)) == len(set(seqs))
        assert index.bucket_bound(len(index), length_cuts=False) == -math.inf
        assert index.forwards > rows_before + len(index) // 2  # rows did run again


@pytest.mark.parametrize("cap", [None, 3])
def test_a_table_model_gives_its_sparse_rows_itself(monkeypatch, cap):
    """Over an NGramLM a sparse index asks the model for the kept cells (next_logprobs_above)
    instead of V-wide rows: same sequences, order and bounds as whole rows, through deepenings
    that run rows again (kept margin made tiny); cuts (branch_cap, the max_len depth) still
    take whole rows."""
    monkeypatch.setattr(expand, "KEEP_MARGIN_BITS", 0.5)
    calls = {"above": 0, "agree": 0}
    above, agree = NGramLM.next_logprobs_above, rows.agree_sparse

    @functools.wraps(above)  # still this package's method (a foreign one gets whole rows)
    def spy_above(self, *a):
        calls["above"] += 1
        return above(self, *a)

    def spy_agree(*a):
        calls["agree"] += 1
        return agree(*a)

    monkeypatch.setattr(NGramLM, "next_logprobs_above", spy_above)
    monkeypatch.setattr(build, "agree_sparse", spy_agree)
    rng = np.random.default_rng(4)
    v = 1500
    seqs = [tuple(int(t) for t in rng.zipf(1.4, size=rng.integers(1, 5)) % (v - 1) + 1) + (0,) for _ in range(400)]
    draft = NGramLM.fit(seqs, order=3, vocab_size=v, eos=0, max_len=6)
    kw = dict(initial_bits=6.0, branch_cap=cap, progress=False)
    sparse, dense = SeekIndex(draft, **kw), SeekIndex(draft, row_storage="dense", **kw)
    whole = SeekIndex(draft, **kw)  # sparse rows cut from whole rows here: the same kept cells
    assert sparse.row_storage == "auto" and all(c.sparse for c in sparse.state.chunks)

    def whole_rows(grow):  # ``whole`` grows without the model's own sparse rows
        with monkeypatch.context() as m:
            m.setattr(expand, "above_rows", lambda cfg, depth: False)
            grow()

    for bits in (8.0, 11.0, 13.0, 15.0):
        for index in (sparse, dense):
            index.ensure_bits(bits)
        whole_rows(lambda: whole.ensure_bits(bits))
        assert state(sparse) == state(dense) == state(whole)
    assert sparse.forwards > dense.forwards  # rows ran again
    assert calls["above"] > 0 if cap is None else calls["above"] == 0
    assert calls["agree"] > 0 if cap is None else calls["agree"] == 0
    sparse.ensure_count(4000)  # growth by count reads the kept rows' histograms: the same
    whole_rows(lambda: whole.ensure_count(4000))
    assert (len(sparse) >= 4000 or cap) and state(sparse) == state(whole)
    assert sparse.nbytes <= 1.05 * whole.nbytes  # the same kept cells (a looser bound may re-run a row)


def test_sparse_rows_computed_again_agree_cell_by_cell():
    """agree_sparse (a sparse row run again for a deeper budget): stored cells keep their stored
    values even where the fresh row moved or dropped them; new cells and the bound are clipped
    to the stored bound."""
    from jaxrescore.index.seek.rows import RowChunk

    f32 = lambda *x: np.array(x, np.float32)  # noqa: E731
    kept = RowChunk(np.array([7, 9]), ptr=np.array([0, 2, 3]), tok=np.array([1, 3, 0], np.int32),
                    val=f32(-1.0, -2.0, -0.5), rest=f32(-3.0, -4.0))
    fresh = RowChunk(np.array([7, 9]), ptr=np.array([0, 3, 5]), tok=np.array([1, 2, 4, 0, 2], np.int32),
                     val=f32(-1.1, -2.5, -3.5, -0.4, -3.0), rest=f32(-5.0, -3.5))
    got = rows.agree_sparse(kept, fresh)
    np.testing.assert_array_equal(got.ids, [7, 9])
    np.testing.assert_array_equal(got.ptr, [0, 4, 6])
    np.testing.assert_array_equal(got.tok, [1, 2, 3, 4, 0, 2])
    np.testing.assert_array_equal(got.val, f32(-1.0, -3.0, -2.0, -3.5, -0.5, -4.0))
    np.testing.assert_array_equal(got.rest, f32(-5.0, -4.0))
