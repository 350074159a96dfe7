"""SeekIndex against brute force on tiny fixed-length and eos models (every sequence listed)."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxrescore.index.seek import io as seek_io
from jaxrescore.index.seek import SeekIndex
from jaxrescore.quantize import Quantizer
from seek_oracle import make_model, oracle, step_lps

CONFIGS = [  # (vocab, max_len, eos, style, seed)
    (3, 5, None, "softmax", 0),
    (4, 4, None, "edge", 1),
    (5, 3, None, "peaked", 2),
    (4, 5, 0, "softmax", 3),
    (5, 4, 2, "edge", 4),
    (3, 5, 1, "peaked", 5),
]
QUANTIZERS = [(1.0, 8), (1.0, 1), (0.5, 3)]


def _ids(cfg):
    v, length, eos, style, seed = cfg
    return f"V{v}L{length}{'' if eos is None else f'eos{eos}'}-{style}-{seed}"


def _all(index):
    seqs, lps = index.unrank_batch(np.arange(len(index)))
    return seqs, lps


@pytest.mark.parametrize("cfg", CONFIGS, ids=_ids)
@pytest.mark.parametrize("quant", QUANTIZERS, ids=str)
def test_order_counts_and_bounds_match_brute_force(cfg, quant):
    v, length, eos, style, seed = cfg
    model = make_model(v, length, seed, eos=eos, style=style)
    index = SeekIndex(model, bin_width_bits=quant[0], oversample=quant[1], initial_bits=1.0,
                      max_depth_bits=400.0, progress=False)
    full = oracle(model, index.quantizer)
    while True:
        budget = index.state.budget
        inside = [r for r in full if r[1] <= budget]
        seqs, lps = _all(index)
        # exactly the in-budget support, each once, in (bucket, dfs) order, with exact draft scores
        assert seqs == [s for s, _, _ in inside]
        assert lps.tolist() == [lp for _, _, lp in inside]
        assert len(set(seqs)) == len(seqs)
        ranked = {s: i for i, s in enumerate(seqs)}
        for n in range(len(index) + 1):
            bound = index.bucket_bound(n)
            beyond = [lp for s, _, lp in full if ranked.get(s, n) >= n]
            if beyond:
                assert bound >= max(beyond)
            else:
                assert bound == -math.inf
        assert index.truncated == (len(inside) < len(full))
        if not index.truncated:
            break
        index.ensure_count(len(index) + 1)
    assert index.exhausted and len(index) == len(full)
    with pytest.raises(IndexError):
        index.unrank(len(full))


@pytest.mark.parametrize("cfg", CONFIGS, ids=_ids)
def test_count_threshold_and_rank_bracket_are_exact(cfg):
    v, length, eos, style, seed = cfg
    model = make_model(v, length, seed, eos=eos, style=style)
    index = SeekIndex(model, initial_bits=1.0, max_depth_bits=400.0, progress=False)
    full = oracle(model, index.quantizer)
    scores = np.array([lp for _, _, lp in full])
    cuts = np.unique(np.concatenate([scores, np.nextafter(scores, 0), np.nextafter(scores, -np.inf),
                                     [-0.0, -1e-12, -0.5, -math.log(2), -3.3, -7.0]]))
    for t in cuts:
        truth = int(np.count_nonzero(scores >= t))
        assert index.count(float(t)) == truth
        lo, hi = index.count_bracket(float(t))
        assert lo <= truth <= hi
    assert index.count(0.5) == 0
    desc = np.sort(scores)[::-1]
    for r in range(1, len(full) + 1, max(1, len(full) // 40)):
        th = index.threshold(r)
        assert th == desc[r - 1]
        assert index.count(th) >= r
    index.ensure_count(10**9)
    for pos, (s, _, _) in enumerate(full):
        assert index.rank_bracket(s) == (pos, pos)
    with pytest.raises(ValueError, match="not in the model's support"):
        index.rank_bracket((0,) * (length + 1))


def test_first_build_sizes_and_partial_bracket():
    model = make_model(5, 4, 7, style="softmax")
    index = SeekIndex(model, initial_bits=3.0, max_depth_bits=3.0, progress=False)
    full = oracle(model, index.quantizer)
    assert index.truncated and not index.exhausted
    assert len(index) == sum(1 for r in full if r[1] <= index.state.budget) < len(full)
    # beyond max_depth_bits: ranks raise, the bracket of an unindexed sequence is open-ended
    with pytest.raises(IndexError, match="max_depth_bits"):
        index.unrank(len(full) - 1)
    last = full[-1]
    lo, hi = index.rank_bracket(last[0])
    assert lo == len(index) and hi == math.inf
    assert index.count_bracket(last[2])[1] == math.inf
    assert index.bucket_bound(len(index)) >= max(lp for _, fb, lp in full if fb > index.state.budget)


def test_deepening_reuses_forwards():
    model = make_model(4, 5, 11, style="softmax")
    step = SeekIndex(model, initial_bits=1.0, max_depth_bits=12.0, progress=False)
    for bits in (2.0, 3.5, 5.0, 8.0, 12.0):
        step.ensure_bits(bits)
    direct = SeekIndex(model, initial_bits=12.0, max_depth_bits=12.0, progress=False)
    assert step.builds > direct.builds == 1
    assert step.forwards == direct.forwards  # every prefix forwarded once, whatever the path
    assert _all(step)[0] == _all(direct)[0]
    before = step.forwards
    step.ensure_bits(12.0)
    step.unrank(0)
    step.count(-1.0)
    assert step.forwards == before  # queries inside the built budget pay nothing


@pytest.mark.parametrize("eos", [None, 1])
@pytest.mark.parametrize("cap", [1, 2])
def test_branch_cap_drops_are_counted_and_bounded(eos, cap):
    model = make_model(4, 4, 21 + cap, eos=eos, style="edge")
    index = SeekIndex(model, branch_cap=cap, initial_bits=2.0, max_depth_bits=400.0, progress=False)
    index.ensure_count(10**9)
    full = oracle(model, index.quantizer)
    seqs, _ = _all(index)

    def kept(seq):  # every step among the top-cap of its context (likelier first, ties by token)
        for j in range(len(seq)):
            lp = model.fn.table(tuple(seq[:j])).astype(np.float64)
            order = sorted(range(len(lp)), key=lambda t: (-lp[t], t))
            if seq[j] not in order[:cap]:
                return False
        return True

    assert seqs == [s for s, _, _ in full if kept(s)]
    missing = [r for r in full if not kept(r[0])]
    assert missing and index.truncated and not index.exhausted
    assert len(missing) <= index.dropped_upper
    ranked = {s: i for i, s in enumerate(seqs)}
    for n in range(len(index) + 1):
        worst = max(lp for s, _, lp in full if ranked.get(s, n) >= n)
        assert index.bucket_bound(n) >= worst
    for s, fb, _ in missing:
        true_pos = [r[0] for r in full].index(s)
        lo, hi = index.rank_bracket(s)
        assert lo <= true_pos <= hi


def test_branch_cap_with_inferred_vocab_reports_infinite_drops():
    from jaxrescore.models.callable import CallableModel

    fn = make_model(4, 3, 5).fn
    index = SeekIndex(CallableModel(fn, max_len=3), branch_cap=2, initial_bits=30.0, progress=False)
    assert index.dropped_upper == math.inf


@pytest.mark.parametrize("eos", [None, 0])
def test_batched_model_gives_the_same_index(eos):
    a = SeekIndex(make_model(4, 4, 3, eos=eos), initial_bits=9.0, progress=False, chunk_rows=5)
    b = SeekIndex(make_model(4, 4, 3, eos=eos, batched=True), initial_bits=9.0, progress=False)
    assert _all(a)[0] == _all(b)[0]
    assert _all(a)[1].tolist() == _all(b)[1].tolist()
    assert a.forwards == b.forwards


def test_max_len_cut_of_a_terminating_model_is_covered():
    # the eos model of seek_oracle forces eos at max_len; shorten max_len to cut real mass
    from jaxrescore.models.callable import CallableModel

    fn = make_model(3, 5, 9, eos=0).fn
    short = CallableModel(fn, vocab_size=3, max_len=3, eos=0)
    index = SeekIndex(short, initial_bits=60.0, max_depth_bits=60.0, progress=False)
    assert index.truncated and not index.exhausted
    assert index.bucket_bound(len(index)) > -math.inf
    # every length-4 continuation the draft cut is below the bound
    for body in [(1, 2, 1), (2, 2, 2), (1, 1, 1)]:
        seq = body + (0,)
        lp = float(np.minimum(step_lps(make_model(3, 5, 9, eos=0), seq), 0).sum())
        assert index.bucket_bound(len(index)) >= lp


def test_save_load_round_trip_and_deepening(tmp_path):
    model = make_model(4, 5, 13, eos=3)
    index = SeekIndex(model, branch_cap=3, initial_bits=4.0, max_depth_bits=40.0, progress=False)
    path = tmp_path / "idx.npz"
    index.save(path)
    assert [p.name for p in tmp_path.iterdir()] == ["idx.npz"]  # no temp file left behind
    loaded = SeekIndex.load(path, model)
    assert _all(loaded)[0] == _all(index)[0]
    assert loaded.dropped_upper == index.dropped_upper and loaded.forwards == index.forwards
    assert [loaded.bucket_bound(n) for n in range(len(index) + 1)] == [
        index.bucket_bound(n) for n in range(len(index) + 1)]
    index.ensure_bits(20.0)
    loaded.ensure_bits(20.0)
    assert _all(loaded)[0] == _all(index)[0]
    assert loaded.forwards == index.forwards  # the kept rows travelled with the file


def _saved(tmp_path, model=None):
    model = model or make_model(4, 4, 17)
    path = tmp_path / "idx.npz"
    SeekIndex(model, initial_bits=6.0, progress=False).save(path)
    return path, model


def test_a_model_that_only_agrees_at_the_root_is_refused(tmp_path):
    from jaxrescore.models.callable import CallableModel

    path, model = _saved(tmp_path)
    other = make_model(4, 4, 99)

    def mixed(prefix):  # model's root table, another model's tables below it
        return model.fn(prefix) if len(prefix) == 0 else other.fn(prefix)

    with pytest.raises(ValueError, match="different model"):
        SeekIndex.load(path, CallableModel(mixed, vocab_size=4, max_len=4))
    assert len(SeekIndex.load(path, model)) > 0


def test_corrupted_file_is_refused(tmp_path):
    path, model = _saved(tmp_path)
    data = bytearray(path.read_bytes())
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(flipped))
    with pytest.raises(ValueError, match="corrupted|checksum"):
        SeekIndex.load(path, model)
    path.write_bytes(bytes(data[: len(data) // 3]))
    with pytest.raises(ValueError, match="not a readable SeekIndex"):
        SeekIndex.load(path, model)
    path.write_bytes(b"hello")
    with pytest.raises(ValueError, match="not a readable SeekIndex"):
        SeekIndex.load(path, model)
    with pytest.raises(FileNotFoundError):
        SeekIndex.load(tmp_path / "missing.npz", model)


def test_tampered_array_fails_the_checksum(tmp_path):
    path, model = _saved(tmp_path)
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["node_fb"] = arrays["node_fb"] + 1
    np.savez(path, **arrays)
    with pytest.raises(ValueError, match="checksum"):
        SeekIndex.load(path, model)


def test_other_version_is_refused(tmp_path, monkeypatch):
    path, model = _saved(tmp_path)
    monkeypatch.setattr(seek_io, "VERSION", seek_io.VERSION + 1)
    with pytest.raises(ValueError, match="version"):
        SeekIndex.load(path, model)


@pytest.mark.parametrize(
    "other, what",
    [
        (lambda: make_model(4, 4, 18), "different model"),
        (lambda: make_model(4, 5, 17), "max_len"),
        (lambda: make_model(4, 4, 17, eos=1), "eos"),
        (lambda: make_model(5, 4, 17), "vocab_size"),
    ],
)
def test_mismatched_model_is_refused(tmp_path, other, what):
    path, _ = _saved(tmp_path)
    with pytest.raises(ValueError, match=what):
        SeekIndex.load(path, other())


def test_argument_validation():
    model = make_model(3, 3, 0)
    for kwargs, match in [
        ({"branch_cap": 0}, "branch_cap"),
        ({"max_depth_bits": -1.0}, "max_depth_bits"),
        ({"initial_bits": float("nan")}, "initial_bits"),
        ({"progress": "yes"}, "progress"),
        ({"oversample": 0}, "oversample"),
        ({"chunk_rows": 0}, "chunk_rows"),
    ]:
        with pytest.raises(ValueError, match=match):
            SeekIndex(model, **kwargs)
    with pytest.raises(TypeError, match="next_logprobs"):
        SeekIndex(object())
    index = SeekIndex(model, progress=False)
    with pytest.raises(IndexError):
        index.unrank(-1)
    with pytest.raises(ValueError, match="rank"):
        index.unrank(1.5)
    with pytest.raises(ValueError, match="min_log_prob"):
        index.count(float("nan"))
    with pytest.raises(ValueError, match="rank"):
        index.threshold(0)
    with pytest.raises(ValueError, match="n must be"):
        index.bucket_bound(-1)
    assert index.slice(0, 0) == []
    index.ensure_count(10**9)
    assert index.exhausted and len(index) == 27
    assert index.slice(25, 5) == index.slice(25, 2) and len(index.slice(25, 5)) == 2


def test_progress_bar_can_be_forced(capsys):
    index = SeekIndex(make_model(3, 4, 1), initial_bits=20.0, progress=True)
    assert "SeekIndex build" in capsys.readouterr().err
    assert len(index) == 81


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    vocab=st.integers(2, 4),
    length=st.integers(1, 4),
    terminating=st.booleans(),
    cap=st.sampled_from([None, 1, 2]),
    bits=st.floats(0.0, 12.0),
    oversample=st.integers(1, 8),
)
def test_bucket_bound_is_never_violated(seed, vocab, length, terminating, cap, bits, oversample):
    eos = 0 if terminating else None
    model = make_model(vocab, length, seed, eos=eos, style="edge" if seed % 2 else "softmax")
    index = SeekIndex(model, branch_cap=cap, oversample=oversample, initial_bits=bits,
                      max_depth_bits=bits, progress=False)
    full = oracle(model, Quantizer(1.0, oversample))
    seqs, _ = _all(index)
    ranked = {s: i for i, s in enumerate(seqs)}
    for n in range(len(index) + 1):
        beyond = [lp for s, _, lp in full if ranked.get(s, n) >= n]
        bound = index.bucket_bound(n)
        assert bound >= max(beyond) if beyond else bound == -math.inf
    assert len(index) <= len(full)


def test_integral_floats_are_counts_as_everywhere():
    """The library's one integer rule (jaxrescore._checks): 4.0 is the count 4; 2.5, True and NaN
    are refused, naming the argument."""
    index = SeekIndex(make_model(3, 3, 0), progress=False)
    assert index.slice(0, 4.0) == index.slice(0, 4) and len(index.slice(0, 4)) == 4
    assert index.slice(2.0, 3) == index.slice(2, 3)
    assert index.unrank(5.0) == index.unrank(5) and index.threshold(3.0) == index.threshold(3)
    assert index.ensure_count(np.float32(20.0)) is index and len(index) >= 20
    assert SeekIndex(make_model(3, 3, 0), chunk_rows=2.0, branch_cap=2.0, progress=False).branch_cap == 2
    for bad, name in [((0, 2.5), "k"), ((True, 2), "start"), ((0, float("nan")), "k")]:
        with pytest.raises(ValueError, match=name):
            index.slice(*bad)


def test_a_model_error_midway_leaves_the_index_unchanged():
    from jaxrescore.models.callable import CallableModel

    good = make_model(4, 4, 31).fn
    broken = {"on": False}

    def fn(prefix):
        if broken["on"] and len(prefix) == 3:
            return [(0, 0.5)]
        return good(prefix)

    index = SeekIndex(CallableModel(fn, vocab_size=4, max_len=4), initial_bits=3.0, chunk_rows=2,
                      progress=False)
    before = (_all(index)[0], index.forwards, index.builds, index.state.budget, index.state.nodes.n)
    broken["on"] = True
    with pytest.raises(ValueError, match="log-probs must be <= 0"):
        index.ensure_bits(30.0)
    assert (_all(index)[0], index.forwards, index.builds, index.state.budget, index.state.nodes.n) == before
    broken["on"] = False
    index.ensure_bits(30.0)
    fresh = SeekIndex(make_model(4, 4, 31), initial_bits=30.0, progress=False)
    assert _all(index)[0] == _all(fresh)[0] and index.forwards == fresh.forwards


def test_save_load_with_an_inferred_vocabulary(tmp_path):
    from jaxrescore.models.callable import CallableModel

    fn = make_model(4, 3, 41, style="edge").fn  # tables leave tokens out: rows of varying width
    index = SeekIndex(CallableModel(fn, max_len=3), initial_bits=3.0, progress=False)
    index.save(tmp_path / "i.npz")
    fresh = CallableModel(fn, max_len=3)
    loaded = SeekIndex.load(tmp_path / "i.npz", fresh)
    assert _all(loaded)[0] == _all(index)[0]
    index.ensure_count(10**6)
    loaded.ensure_count(10**6)
    assert _all(loaded)[0] == _all(index)[0] and loaded.exhausted
