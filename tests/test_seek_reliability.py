"""SeekIndex reliability (issue 10, items 2, 5, 6, 7, 8): bucket range, threads, limits, growth, saving.

Every rule is checked against brute force on tiny models whose support can be listed, or against an
exact count (flat drafts whose tables depend only on the depth).
"""

import itertools
import json
import math
import pickle
import threading
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxrescore.index.seek import io as seek_io
from jaxrescore.index.seek import build, limits
from jaxrescore.index.seek import IndexLimitError, SeekIndex
from jaxrescore.models.callable import CallableModel
from jaxrescore.quantize import (
    MAX_BUDGET_BITS,
    MAX_SCALE,
    MAX_STEP_BITS,
    MIN_SCALE,
    NO_BUCKET,
    Quantizer,
)

F32_MIN = float(np.finfo(np.float32).min)


def _log_softmax(x, axis=-1):
    x = x - x.max(axis=axis, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=axis, keepdims=True))


class TableFn:
    """A picklable batched next-token function: ``table[depth, previous token (V = start)]``.

    ``masks`` puts huge-negative (or -inf) log-probs in some cells after normalising (their
    probability is 0 in float arithmetic, so the rows stay distributions)."""

    def __init__(self, vocab, length, seed, *, scale=1.5, masks=(), depth_only=False):
        rng = np.random.default_rng(seed)
        logits = rng.normal(size=(length, vocab + 1, vocab)) * scale
        if depth_only:  # every prefix of one depth has the same table: a "flat" draft family
            logits[:] = logits[:, :1]
        for value in masks:
            cells = rng.random(logits.shape) < 0.15
            cells[..., 0] = False  # keep every row's token 0 possible
            logits[cells] = -np.inf  # normalise over the rest, then put the mask value in
            table = _log_softmax(logits)
            table[cells] = value
            logits = np.where(np.isfinite(logits), table, -np.inf)
        table = _log_softmax(logits) if not masks else table
        self.table = table.astype(np.float32)
        self.vocab, self.length = vocab, length

    def __call__(self, prefixes, lengths):
        prefixes, lengths = np.asarray(prefixes), np.asarray(lengths)
        prev = prefixes[np.arange(lengths.size), np.maximum(lengths - 1, 0)]
        prev = np.where(lengths > 0, prev, self.vocab)
        return self.table[np.minimum(lengths, self.length - 1), prev]

    def steps(self, seq):
        """float32 per-step log-probs of ``seq`` (what the index sees)."""
        out, prev = [], self.vocab
        for j, tok in enumerate(seq):
            out.append(float(self.table[min(j, self.length - 1), prev, tok]))
            prev = tok
        return np.array(out)


class DepthFn:
    """A picklable batched flat draft: one near-uniform table per depth, whatever the prefix (so
    wide, long models cost ``length * vocab`` floats)."""

    def __init__(self, vocab, length, *, noise=0.01, seed=0):
        logits = np.random.default_rng(seed).normal(size=(length, vocab)) * noise
        self.table = _log_softmax(logits).astype(np.float32)
        self.length = length

    def __call__(self, prefixes, lengths):
        return self.table[np.minimum(np.asarray(lengths), self.length - 1)]


def table_model(vocab, length, seed, *, eos=None, **kw):
    return CallableModel(TableFn(vocab, length, seed, **kw), vocab_size=vocab, max_len=length, eos=eos, batched=True)


def brute(model, quantizer):
    """The support in index order: list of (seq, fb, lp), sorted by (bucket, depth-first order)."""
    fn, v, length, eos = model.fn, model.vocab_size, model.max_len, model.eos
    if eos is None:
        cands = itertools.product(range(v), repeat=length)
    else:
        body = [t for t in range(v) if t != eos]
        cands = (b + (eos,) for n in range(length) for b in itertools.product(body, repeat=n))
    rows = []
    for s in cands:
        steps = np.minimum(fn.steps(s), 0.0)
        if not np.isfinite(steps).all():
            continue
        fb = sum(quantizer.step_buckets(steps).tolist())
        lp = 0.0
        for x in steps:  # the index's summation order
            lp += float(x)
        rows.append((fb, tuple((-float(x), t) for x, t in zip(steps, s)), s, lp))
    rows.sort(key=lambda r: (r[0], r[1]))
    return [(s, fb, lp) for fb, _, s, lp in rows]


def _all(index):
    return index.unrank_batch(np.arange(len(index)))


def _check_against_brute(index, full):
    """The index holds exactly the in-budget support, in order; its bound covers the rest; it
    reports truncation whenever something is missing."""
    seqs, lps = _all(index)
    inside = [r for r in full if r[1] <= index.state.budget]
    assert seqs == [s for s, _, _ in inside]
    assert lps.tolist() == [lp for _, _, lp in inside]
    ranked = {s: i for i, s in enumerate(seqs)}
    for n in range(len(index) + 1):
        beyond = [lp for s, _, lp in full if ranked.get(s, n) >= n]
        # the declared support ends at max_len; with length_cuts the bound also covers what an
        # eos model would continue past it
        bound = index.bucket_bound(n, length_cuts=False)
        assert index.bucket_bound(n) >= bound
        assert bound >= max(beyond) if beyond else bound == -math.inf
    if len(seqs) < len(full):
        assert index.truncated and not index.exhausted


# -- item 2: bucket range, saturation, no overflow ---------------------------------------------------


def test_step_buckets_saturate_finite_steps_and_never_overflow():
    q = Quantizer(1.0, 8)
    lps = np.array([0.0, 1e-7, -math.log(2), -5e17, -1e30, F32_MIN, -1.7e308, -np.inf])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "invalid value encountered in cast"
        sb = q.step_buckets(lps)
    assert sb.tolist()[:3] == [0, 0, 8]
    assert (sb[3:7] == q.max_step_bucket).all() and q.max_step_bucket == 8 * 2**30
    assert sb[7] == NO_BUCKET and sb[3:7].max() < NO_BUCKET
    # sums of many saturated steps stay below NO_BUCKET (and int64)
    assert int(np.full(4096, q.max_step_bucket, np.int64).sum()) < NO_BUCKET
    # saturation keeps the edge sound: a saturated bucket's edge is above the step's log-prob
    for lp in lps[3:7]:
        assert lp <= q.edge(q.step_buckets(lp), 1) < 0
    with pytest.raises(ValueError, match="NaN"):
        q.step_buckets([0.0, np.nan])


@pytest.mark.parametrize("scale", [MIN_SCALE, 1.0, 8.0, MAX_SCALE])
def test_a_saturated_step_never_fits_any_budget(scale):
    q = Quantizer(1.0 / scale, 1)
    assert q.scale == pytest.approx(scale)
    assert q.max_step_bucket > q.budget(MAX_BUDGET_BITS)
    assert q.budget(MAX_BUDGET_BITS) + q.max_step_bucket < NO_BUCKET
    assert q.max_step_bucket == math.floor(MAX_STEP_BITS * q.scale + 1e-9)


def test_quantizer_and_index_arguments_name_what_is_wrong():
    for kwargs, name in [
        ({"bin_width_bits": 1e-300}, "bin_width_bits"),
        ({"bin_width_bits": 1e300}, "bin_width_bits"),
        ({"oversample": 10**9}, "oversample"),
    ]:
        with pytest.raises(ValueError, match=name):
            Quantizer(**kwargs)
    model = table_model(3, 2, 0)
    for kwargs, name in [
        ({"bin_width_bits": 1e-300}, "bin_width_bits"),
        ({"max_depth_bits": 1e300}, "max_depth_bits"),
        ({"max_depth_bits": MAX_BUDGET_BITS * 2}, "max_depth_bits"),
        ({"max_bytes": 0}, "max_bytes"),
        ({"max_bytes": "1GB"}, "max_bytes"),
        ({"max_bytes": True}, "max_bytes"),
        ({"max_nodes": -1}, "max_nodes"),
        ({"max_nodes": 2.5}, "max_nodes"),
    ]:
        with pytest.raises(ValueError, match=name):
            SeekIndex(model, progress=False, **kwargs)
    index = SeekIndex(model, progress=False)
    with pytest.raises(ValueError, match="bits"):
        index.ensure_bits(math.inf)
    with pytest.raises(ValueError, match="token id"):
        index.rank_bracket((2**40, 0))
    with pytest.raises(ValueError, match="ranks must be integers"):
        index.unrank_batch(np.array([0.5]))


def test_issue_repro_a_huge_negative_root_step_is_not_exhaustion():
    # fixed-length V=2, max_len=1, root log-probs [0, -5e17]: step bucket 5.8e18 used to read as
    # "no bucket", so the index claimed exhaustion and count(-1e30) said 1 with nothing cut
    model = CallableModel(lambda p: (np.array([0, 1]), np.array([0.0, -5e17])), vocab_size=2, max_len=1)
    index = SeekIndex(model, progress=False)
    assert len(index) == 1 and index.truncated and not index.exhausted
    bound = index.bucket_bound(1)
    assert -5e17 <= bound < -1e8  # covers (1,), whose score is -5e17
    # the threshold lies beyond max_depth_bits: count counts the indexed, and the bracket says so
    assert index.count(-1e30) == 1 and index.count_bracket(-1e30) == (1, math.inf)
    assert index.rank_bracket((1,)) == (1, math.inf)
    assert index.rank_bracket((0,)) == (0, 0)
    # the rescoring layer must then not certify a one-item answer to top_k(2)
    from jaxrescore.rescore.rescored_index import RescoredIndex

    result = RescoredIndex(index, model, rerank_window=0, assumed_gap=0.0).top_k(2)
    assert len(result.items) == 1 and result.certified is not True


@pytest.mark.parametrize("mask", [-1e30, F32_MIN, -5e17, -1e12, -np.inf], ids=str)
@pytest.mark.parametrize("eos", [None, 0])
def test_logit_masks_keep_order_bounds_and_brackets_right(mask, eos):
    model = table_model(3, 4, 11, eos=eos, masks=(mask,))
    index = SeekIndex(model, initial_bits=1.0, max_depth_bits=200.0, progress=False)
    full = brute(model, index.quantizer)
    masked = [r for r in full if r[2] < -1e6]
    assert bool(masked) == (mask != -np.inf)  # -inf cells are outside the support
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        while True:
            _check_against_brute(index, full)
            before = len(index)
            index.ensure_count(len(index) + 1)
            if len(index) == before:
                break
        _check_against_brute(index, full)
        seqs, _ = _all(index)
        # every reachable sequence is held; the masked ones stay cut (truncated) but bounded
        assert seqs == [s for s, _, lp in full if lp > -1e6]
        if masked:
            # (an eos model also cuts prefixes at max_len: its bound without those is the masks')
            assert index.truncated and -1e30 < index.bucket_bound(len(index), length_cuts=False) < -1e8
        elif eos is None:
            assert index.exhausted
        for pos, (s, _, _) in enumerate(full):
            lo, hi = index.rank_bracket(s)
            assert lo <= pos <= hi  # never an empty bracket such as (0, -1)
        for t in (-0.5, -2.0, -5.0):
            truth = sum(1 for _, _, lp in full if lp >= t)
            assert index.count(t) == truth
            lo, hi = index.count_bracket(t)
            assert lo <= truth <= hi


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    vocab=st.integers(2, 4),
    length=st.integers(1, 3),
    terminating=st.booleans(),
    cap=st.sampled_from([None, 1, 2]),
    masks=st.lists(st.sampled_from([-1e30, F32_MIN, -5e17, -3e9, -np.inf]), max_size=2),
    quant=st.sampled_from([(1.0, 8), (0.5, 3), (2.0, 1), (0.25, 2)]),
    bits=st.floats(0.0, 40.0),
)
def test_bounds_with_huge_negative_steps_against_brute_force(seed, vocab, length, terminating, cap, masks, quant,
                                                             bits):
    eos = 0 if terminating else None
    model = table_model(vocab, length, seed, eos=eos, masks=tuple(masks))
    index = SeekIndex(model, branch_cap=cap, bin_width_bits=quant[0], oversample=quant[1], initial_bits=bits,
                      max_depth_bits=max(bits, 40.0), progress=False)
    full = brute(model, index.quantizer)
    seqs, _ = _all(index)
    assert len(set(seqs)) == len(seqs) and set(seqs) <= {s for s, _, _ in full}
    ranked = {s: i for i, s in enumerate(seqs)}
    for n in range(len(index) + 1):
        beyond = [lp for s, _, lp in full if ranked.get(s, n) >= n]
        bound = index.bucket_bound(n, length_cuts=False)  # the declared support ends at max_len
        assert index.bucket_bound(n) >= bound
        assert bound >= max(beyond) if beyond else bound == -math.inf
    if not index.truncated:
        assert len(seqs) == len(full)  # exhaustion is only ever reported when true


# -- item 5: threads ----------------------------------------------------------------------------------


def test_one_index_shared_by_threads_matches_a_single_threaded_reference():
    model = table_model(4, 6, 3)
    ref = SeekIndex(model, initial_bits=1.0, max_depth_bits=60.0, progress=False).ensure_count(10**9)
    full, full_lps = _all(ref)
    shared = SeekIndex(model, initial_bits=1.0, max_depth_bits=60.0, progress=False, chunk_rows=8)
    barrier = threading.Barrier(4)
    results, errors = {}, []

    def work(k):
        try:
            barrier.wait()
            out = []
            for r in range(k, len(full), 41):  # each thread asks for ranks deeper than the others'
                out.append((r, shared.unrank(r), shared.count(-3.0 - k), shared.bucket_bound(r) >= full_lps[r]))
                if r % 3 == 0:
                    out.append((r, tuple(shared.slice(r, 2)[0]), shared.count(-3.0 - k), True))
            results[k] = out
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for k, out in results.items():
        for r, (seq, lp), count, bounded in out:
            assert seq == full[r] and lp == full_lps[r] and bounded
            assert count == ref.count(-3.0 - k)
    shared.ensure_count(10**9)
    seqs, lps = _all(shared)
    assert seqs == full and lps.tolist() == full_lps.tolist() and len(set(seqs)) == len(seqs)
    assert shared.forwards == ref.forwards  # every prefix forwarded once, however the passes went


def test_pickled_index_gets_its_own_lock_and_keeps_working():
    model = table_model(3, 4, 5)
    index = SeekIndex(model, initial_bits=4.0, progress=False)
    copy = pickle.loads(pickle.dumps(index))
    assert copy._lock is not index._lock
    assert _all(copy)[0] == _all(index)[0]
    copy.ensure_count(10**9)
    index.ensure_count(10**9)
    assert _all(copy)[0] == _all(index)[0] and copy.exhausted


# -- item 6: limits -----------------------------------------------------------------------------------


def _state(index):
    return (_all(index)[0], index.forwards, index.builds, index.state.budget, index.state.nodes.n, index.state.n_rows,
            index.nbytes, index.truncated, [index.bucket_bound(n) for n in range(len(index) + 1)])


def test_a_one_pass_request_over_max_bytes_leaves_the_index_as_it_was():
    model = table_model(5, 5, 7)
    index = SeekIndex(model, initial_bits=4.0, max_depth_bits=60.0, progress=False, max_bytes=20_000)
    before = _state(index)
    with pytest.raises(IndexLimitError, match=r"ensure_bits\(bits=40\).*max_bytes=20,000.*stopped there"):
        index.ensure_bits(40)
    assert _state(index) == before
    assert index.unrank(0) == SeekIndex(model, initial_bits=4.0, progress=False).unrank(0)
    index.max_bytes = 10**9  # the limit is a plain attribute: raise it and go on
    index.ensure_count(3000)
    assert len(index) >= 3000


@pytest.mark.parametrize("limit", ["max_bytes", "max_nodes"])
def test_growth_by_count_stops_before_allocating_and_keeps_what_fitted(monkeypatch, limit):
    model = table_model(5, 5, 8)
    value = 40_000 if limit == "max_bytes" else 500
    index = SeekIndex(model, initial_bits=3.0, max_depth_bits=60.0, progress=False, **{limit: value})
    sizes = []
    real_add = build.add_nodes

    def add(nodes, **values):  # record the size the index reaches after every allocation
        nodes, ids = real_add(nodes, **values)
        sizes.append((nodes.n, nodes.n * limits.NODE_BYTES))
        return nodes, ids

    monkeypatch.setattr(build, "add_nodes", add)
    before = len(index)
    with pytest.raises(IndexLimitError, match=rf"ensure_count\(n=3,000\).*{limit}=.*The index holds"):
        index.ensure_count(3000)
    assert sizes and max(n if limit == "max_nodes" else b for n, b in sizes) <= value
    # the passes that fitted are kept: a budget-complete index, as a fresh one of that budget
    assert before < len(index) < 3000
    fresh = SeekIndex(model, initial_bits=index.built_bits, progress=False)
    assert _all(index)[0] == _all(fresh)[0]
    assert [index.bucket_bound(n) for n in range(len(index) + 1)] == [
        fresh.bucket_bound(n) for n in range(len(index) + 1)]
    assert index.count(-1.0) == SeekIndex(model, initial_bits=20.0, progress=False).count(-1.0)


def test_the_constructor_names_initial_bits_when_the_first_build_does_not_fit():
    with pytest.raises(IndexLimitError, match=r"initial_bits=30.0.*max_nodes=50"):
        SeekIndex(table_model(5, 5, 9), initial_bits=30.0, max_nodes=50, progress=False)


def _flat(vocab, length):
    return CallableModel(DepthFn(vocab, length), vocab_size=vocab, max_len=length, batched=True)


def test_a_flat_wide_draft_stops_at_the_limit_with_a_clear_message():
    # 2,048 tokens of 11 bits each: the 4.2M prefixes of two tokens are over 8 MiB at once
    model = _flat(2048, 3)
    index = SeekIndex(model, progress=False, max_bytes=8 << 20)
    before = _state(index)
    for call, args, pattern in [
        (index.ensure_bits, (1000,), r"ensure_bits\(bits=1000\)"),
        (index.count, (-20.0,), r"count\(min_log_prob=-20.0\)"),
    ]:
        with pytest.raises(IndexLimitError, match=pattern) as err:
            call(*args)
        assert "max_bytes" in str(err.value) and "raise max_bytes" in str(err.value)
        assert _state(index) == before  # one-pass requests leave the index as it was
    for n in (10, 2**40):
        with pytest.raises(IndexLimitError, match=rf"ensure_count\(n={n:,}\).*max_bytes=8,388,608"):
            index.ensure_count(n)
        # the root's 2,048 children were built and kept (a pass that fitted); the next is refused
        assert len(index) == 0 and index.state.nodes.n == 2049 and index.nbytes <= 8 << 20
    assert index.truncated and index.bucket_bound(0) <= index.quantizer.edge(index.state.budget + 1, 3)


def test_a_first_build_over_the_limit_stops_before_expanding():
    with pytest.raises(IndexLimitError, match=r"initial_bits=1000.*max_bytes=33,554,432"):
        SeekIndex(_flat(4096, 3), initial_bits=1000, max_depth_bits=1000, max_bytes=32 << 20, progress=False)


def test_huge_ranks_and_counts_name_their_argument_without_deepening():
    model = _flat(64, 6)
    index = SeekIndex(model, progress=False)
    before = _state(index)
    with pytest.raises(IndexError, match=r"rank 1,180,591,620,717,411,303,424 is beyond"):
        index.unrank(2**70)
    with pytest.raises(IndexError, match=r"rank 1,180,591,620,717,411,303,424 is beyond"):
        index.unrank_batch([2**70])
    with pytest.raises(IndexError, match=r"rank 9,223,372,036,854,775,813"):
        index.unrank_batch(np.array([2**63 + 5], np.uint64))
    with pytest.raises(IndexError, match=r"threshold rank about 2\*\*16609"):
        index.threshold(10**5000)
    assert _state(index) == before
    # growth by count builds what fits (here 1 MiB) and names the request it could not serve
    with pytest.raises(IndexLimitError, match=r"ensure_count\(n=about 2\*\*16609\).*max_bytes=1,048,576"):
        SeekIndex(model, progress=False, max_bytes=1 << 20).ensure_count(10**5000)
    # on a small support the same requests mean "all there is"
    small = SeekIndex(table_model(3, 3, 1), progress=False)
    small.ensure_count(2**40)
    assert small.exhausted and len(small) == 27 and small.slice(2**70, 3) == []
    with pytest.raises(IndexError, match="exhausted"):
        small.unrank(2**70)
    assert small.count(-1e300) == small.count(-1.7e308) == 27


def test_load_checks_the_limits_before_reading_the_arrays(tmp_path):
    model = table_model(4, 4, 2)
    index = SeekIndex(model, initial_bits=10.0, progress=False)
    path = tmp_path / "i.npz"
    index.save(path)
    with pytest.raises(IndexLimitError, match=r"max_bytes=1,000.*nothing was read"):
        SeekIndex.load(path, model, max_bytes=1000)
    with pytest.raises(IndexLimitError, match=r"max_nodes=3"):
        SeekIndex.load(path, model, max_nodes=3)
    with pytest.raises(ValueError, match="max_bytes"):
        SeekIndex.load(path, model, max_bytes=-5)
    loaded = SeekIndex.load(path, model, max_nodes=10**6, max_bytes=10**8)
    assert loaded.max_nodes == 10**6 and loaded.max_bytes == 10**8 and _all(loaded)[0] == _all(index)[0]


# -- item 7: growth (by measurement: tests/test_seek_growth.py) ---------------------------------------


def _flat_counts(model, quantizer, budget):
    """Exact support sizes within every budget ``0..budget`` of a depth-only table (convolution of
    the per-depth bucket histograms)."""
    fn = model.fn
    counts = np.zeros(budget + 1, dtype=object)
    counts[0] = 1
    for d in range(fn.length):
        sb = quantizer.step_buckets(np.minimum(fn.table[d].astype(np.float64), 0.0))
        step = np.bincount(sb[sb <= budget], minlength=budget + 1).astype(object)
        counts = np.convolve(counts, step)[: budget + 1]
    return np.cumsum(counts)


def test_issue_flat_draft_grows_to_what_is_needed_not_to_millions():
    # a flat draft, 1,010 sequences asked of a fresh index; an old policy went 8 -> 16 -> 25.75
    # bits (12M sequences) where about 18 bits sufficed
    model = _flat(27, 5)
    index = SeekIndex(model, progress=False)
    q = index.quantizer
    within = _flat_counts(model, q, q.budget(40.0))
    index.ensure_count(1010)
    whole_bit = min(b for b in (q.budget(x) for x in range(8, 41)) if within[b] >= 1010)
    assert len(index) == within[index.state.budget]  # the index is exactly that budget's support
    assert 1010 <= len(index) <= within[whole_bit]
    assert index.state.budget <= whole_bit


# -- item 8: saving huge dropped counts; format versions ----------------------------------------------


def test_save_of_a_wide_long_branch_cap_index(tmp_path):
    # 999 root children dropped, each with 1000**1499 completions: 4,500 digits, past Python's
    # int -> str limit, which used to make save() fail
    model = _flat(1000, 1500)
    index = SeekIndex(model, branch_cap=1, initial_bits=0.0, progress=False)
    assert index.dropped_upper == math.inf and f"{index.dropped_upper:g}" == "inf"
    index.save(tmp_path / "wide.npz")
    loaded = SeekIndex.load(tmp_path / "wide.npz", model)
    assert loaded.dropped_upper == math.inf
    assert loaded.count_bracket(-1.0)[1] == index.count_bracket(-1.0)[1]


def test_dropped_upper_past_int64_is_a_float_rounded_up(tmp_path):
    model = _flat(100, 12)
    index = SeekIndex(model, branch_cap=1, initial_bits=0.0, progress=False)
    exact = 99 * 100**11  # every dropped root child, times its completions
    assert isinstance(index.dropped_upper, float)
    assert exact <= index.dropped_upper <= exact * (1 + 1e-9)
    index.save(tmp_path / "f.npz")
    assert SeekIndex.load(tmp_path / "f.npz", model).dropped_upper == index.dropped_upper
    small = SeekIndex(_flat(100, 3), branch_cap=1, initial_bits=0.0, progress=False)
    assert small.dropped_upper == 99 * 100**2 and isinstance(small.dropped_upper, int)


def _rewrite(path, edit):
    """Rewrite an index file through ``edit(header, arrays)``, with a fresh checksum."""
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    header = json.loads(arrays.pop("header").tobytes().decode())
    header.pop("checksum")
    edit(header, arrays)
    header["checksum"] = seek_io._checksum(header, arrays)
    np.savez(path, header=np.frombuffer(json.dumps(header).encode(), np.uint8), **arrays)


def test_version_2_files_load_and_are_rechecked(tmp_path):
    model = table_model(4, 5, 12, eos=3)
    index = SeekIndex(model, branch_cap=3, initial_bits=5.0, max_depth_bits=40.0, progress=False)
    path = tmp_path / "v2.npz"
    index.save(path)

    def as_v2(header, arrays):
        header["version"] = 2
        header["frontier_min"] = NO_BUCKET  # a frontier the old overflow could hide
        header["dropped"] = str(int(index.state.dropped))

    _rewrite(path, as_v2)
    loaded = SeekIndex.load(path, model)
    assert loaded.state.frontier_min == index.state.frontier_min  # recomputed from the kept rows
    assert _all(loaded)[0] == _all(index)[0] and loaded.dropped_upper == index.dropped_upper
    assert [loaded.bucket_bound(n) for n in range(len(index) + 1)] == [
        index.bucket_bound(n) for n in range(len(index) + 1)]

    def overflowed(header, arrays):
        header["version"] = 2
        arrays["node_fb"] = arrays["node_fb"].copy()
        arrays["node_fb"][-1] = np.iinfo(np.int64).min + 5

    index.save(path)
    _rewrite(path, overflowed)
    with pytest.raises(ValueError, match="rebuild"):
        SeekIndex.load(path, model)
    index.save(path)
    _rewrite(path, lambda h, a: h.update(version=1))
    with pytest.raises(ValueError, match="version 1.*reads versions 2, 3, 4"):
        SeekIndex.load(path, model)


def test_duck_models_are_checked_where_they_enter():
    """A duck-typed model's attributes are checked at construction and its rows on every call."""

    class Duck:
        vocab_size, eos, max_len = 3, None, 2

        def __init__(self, rows):
            self.rows = rows

        def next_logprobs(self, prefixes, lengths):
            return self.rows(len(lengths))

    uniform = lambda b: np.log(np.full((b, 3), 1 / 3, np.float32))  # noqa: E731
    assert len(SeekIndex(Duck(uniform), progress=False)) == 9
    bad = {
        "probabilities": lambda b: np.full((b, 3), 1 / 3, np.float32),
        "+inf": lambda b: np.tile(np.array([np.inf, -1.0, -1.0], np.float32), (b, 1)),
        "extra column": lambda b: np.log(np.full((b, 4), 1 / 4, np.float32)),
    }
    for name, rows in bad.items():
        with pytest.raises(ValueError, match="model.next_logprobs"):
            SeekIndex(Duck(rows), progress=False)

    class BadEos(Duck):
        eos = 3

    with pytest.raises(ValueError, match="eos"):
        SeekIndex(BadEos(uniform), progress=False)
