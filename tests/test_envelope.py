"""AREnvelopeIndex: exact against SeekIndex on prefix-independent models, brute force on tiny
context-dependent ones, deep ranks on V=64 L=8, persistence, argument errors, and composition with
RescoredIndex (never certified under a gap except on true exhaustion). Models are numpy (no compiles)."""

import itertools
import math
import warnings

import numpy as np
import pytest

import jaxrescore
from jaxrescore import AREnvelopeIndex, RescoredIndex
from jaxrescore.index.envelope import index as env_mod
from jaxrescore.index.envelope import io as envelope_io
from jaxrescore.index.seek import SeekIndex
from jaxrescore.models.callable import CallableModel


def _log_softmax(x, axis=-1):
    m = x.max(axis=axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=axis, keepdims=True))


def iid_model(vocab, length, *, eos=None, seed=0, probs=None):
    """Every next-token row is the same, whatever the prefix."""
    if probs is None:
        row = _log_softmax(np.random.default_rng(seed).normal(size=vocab) * 1.5)
    else:
        row = np.log(np.asarray(probs, np.float64))
    row = row.astype(np.float32)

    def fn(prefixes, lengths):
        return np.tile(row, (prefixes.shape[0], 1))

    return CallableModel(fn, vocab_size=vocab, max_len=length, eos=eos, batched=True)


def ctx_model(vocab, length, *, eos=None, seed=0, peaked=0.3, sparse=False, cut=False, counter=None):
    """Rows depend on the position and the last two tokens (some contexts sharply peaked). A
    terminating model is forced to eos at max_len - 1 unless ``cut``; ``sparse`` zeroes a third of
    every row."""
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(length, vocab + 1, vocab)) * 1.5
    b = rng.normal(size=(length, vocab + 1, vocab))
    sharp = rng.random((length, vocab + 1)) < peaked

    def fn(prefixes, lengths):
        if counter is not None:
            counter.append(prefixes.shape)
        n = prefixes.shape[0]
        i = np.arange(n)
        last = np.where(lengths > 0, prefixes[i, np.maximum(lengths - 1, 0)], vocab)
        prev = np.where(lengths > 1, prefixes[i, np.maximum(lengths - 2, 0)], vocab)
        pos = np.minimum(lengths, length - 1)
        logits = a[pos, last] + b[pos, prev]
        logits = np.where(sharp[pos, last][:, None], 4 * logits, logits)
        if sparse:
            off = (np.arange(vocab)[None, :] + last[:, None] + pos[:, None]) % 3 == 0
            logits = np.where(off, -np.inf, logits)
        if eos is not None and not cut:
            end = lengths == length - 1
            logits[end] = -np.inf
            logits[end, eos] = 0.0
        return _log_softmax(logits).astype(np.float32)

    return CallableModel(fn, vocab_size=vocab, max_len=length, eos=eos, batched=True)


def support(model):
    v, length, eos = model.vocab_size, model.max_len, model.eos
    if eos is None:
        return list(itertools.product(range(v), repeat=length))
    body = [t for t in range(v) if t != eos]
    return [s + (eos,) for n in range(length) for s in itertools.product(body, repeat=n)]


def exact_lp(model, seq):
    """The draft log-prob as both indexes report it: float64 sum of the clipped float32 steps."""
    n = len(seq)
    pre = np.zeros((n, max(n, 1)), np.int32)
    for j in range(n):
        pre[j, :j] = seq[:j]
    rows = model.next_logprobs(pre, np.arange(n, dtype=np.int32))
    total = 0.0
    for j, t in enumerate(seq):
        total += min(float(rows[j, t]), 0.0)
    return total


def everything(index):
    return index.unrank_batch(np.arange(len(index)))


IID = [  # (vocab, max_len, eos, probs)
    (4, 5, None, None),
    (3, 6, None, None),
    (4, 5, 0, None),
    (5, 4, 2, [0.5, 0.25, 0.125, 0.0625, 0.0625]),  # bucket edges and ties
]


@pytest.mark.parametrize(
    "cfg, quant",
    [(IID[0], (1.0, 8)), (IID[0], (0.5, 3)), (IID[1], (1.0, 1)), (IID[2], (1.0, 8)), (IID[3], (1.0, 8)),
     (IID[3], (0.5, 3))],
    ids=lambda c: str(c),
)
def test_prefix_independent_model_is_exactly_seek_index(cfg, quant):
    vocab, length, eos, probs = cfg
    model = iid_model(vocab, length, eos=eos, probs=probs)
    seek = SeekIndex(model, bin_width_bits=quant[0], oversample=quant[1], initial_bits=400.0,
                     max_depth_bits=400.0, progress=False)
    env = AREnvelopeIndex(model, bin_width_bits=quant[0], oversample=quant[1], max_depth_bits=400.0,
                          n_paths=8, progress=False)
    assert len(env) == len(seek) == len(support(model))
    assert env.total == len(seek)
    seek_seqs, seek_lps = everything(seek)
    env_seqs, env_lps = everything(env)
    assert env_seqs == seek_seqs and env_lps.tolist() == seek_lps.tolist()
    assert env.collisions == 0
    scores = np.sort(seek_lps)[::-1]
    picks = np.linspace(0, scores.size - 1, 12).astype(int)
    for t in np.unique(np.r_[scores[picks], np.nextafter(scores[picks], 0), -1e-9, -2.5, -0.0]):
        assert env.count(float(t)) == seek.count(float(t))
    for r in np.unique(np.linspace(1, len(seek), 15).astype(int)):
        assert env.threshold(int(r)) == seek.threshold(int(r)) == scores[r - 1]
    for pos in np.linspace(0, len(seek) - 1, 10).astype(int):
        assert env.rank_bracket(seek_seqs[pos]) == (pos, pos)
    assert env.slice(3, 5) == seek.slice(3, 5)


@pytest.mark.parametrize("eos", [None, 1])
def test_tiny_context_model_ranks_its_whole_support_once(eos):
    model = ctx_model(4, 5, eos=eos, seed=3, peaked=0.4)
    env = AREnvelopeIndex(model, max_depth_bits=400.0, n_paths=16, progress=False)
    full = support(model)
    assert env.truncated and len(env) == len(full)
    seqs, lps = everything(env)
    assert sorted(seqs) == sorted(full)  # a permutation of the support: nothing twice, nothing missed
    assert env.collisions == 0 and not env.truncated and env.exhausted
    for i in range(0, len(seqs), 17):
        assert lps[i] == exact_lp(model, seqs[i])
        assert env.rank_bracket(seqs[i]) == (i, i)  # rank_bracket inverts unrank
        assert env.unrank(i) == (seqs[i], lps[i])


def test_a_terminating_model_that_continues_past_max_len_stays_truncated():
    model = ctx_model(4, 4, eos=0, seed=5, cut=True)  # non-eos tokens stay possible at max_len - 1
    env = AREnvelopeIndex(model, max_depth_bits=400.0, n_paths=8, progress=False)
    seqs, _ = everything(env)
    assert len(set(seqs)) == len(seqs) == len(support(model))
    assert all(s[-1] == 0 and 0 not in s[:-1] for s in seqs)
    assert env.truncated  # sequences longer than max_len exist: not the whole support


@pytest.fixture(scope="module")
def deep():
    model = ctx_model(64, 8, seed=11, peaked=0.3)
    return model, AREnvelopeIndex(model, progress=False)


def test_rank_10_to_the_12_on_v64_l8_has_its_exact_log_prob(deep):
    model, env = deep
    assert len(env) > 10**12 and env.total == 64.0**8
    before = env.forwards
    seq, lp = env.unrank(10**12)
    assert len(seq) == 8 and all(0 <= t < 64 for t in seq)
    assert env.forwards - before <= 8 + 64  # one row per depth, plus the children one step from the leaves
    assert lp == exact_lp(model, seq)
    assert lp == pytest.approx(float(model.score_sequences([seq])[0]), abs=1e-4)
    assert env.rank_bracket(seq) == (10**12, 10**12)
    assert env.unrank_batch([10**12, 10**12 + 1])[0][0] == seq
    assert 0 < env.count(-25.0) < len(env) and -25.0 > env.threshold(10**12) > -60.0


@pytest.mark.parametrize("start", [0, 10**9])
def test_a_window_of_1000_has_no_duplicates(deep, start):
    _, env = deep
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        window = env.slice(start, 1000)
    assert len(window) == 1000 and len({s for s, _ in window}) == 1000
    assert env.collisions == 0


def test_a_window_of_a_terminating_model_has_no_duplicates():
    model = ctx_model(20, 7, eos=3, seed=2)
    env = AREnvelopeIndex(model, progress=False)
    window = env.slice(10**5, 1000)
    assert len({s for s, _ in window}) == 1000
    assert all(s[-1] == 3 and 3 not in s[:-1] and len(s) <= 7 for s, _ in window)
    assert all(lp == exact_lp(model, s) for s, lp in window[::97])


def test_zero_probability_tokens_can_collide_and_are_reported():
    model = ctx_model(5, 5, seed=0, sparse=True)
    env = AREnvelopeIndex(model, max_depth_bits=400.0, n_paths=16, progress=False)
    with pytest.warns(RuntimeWarning, match=r"(\d+) distinct ranks gave (\d+) distinct sequences") as rec:
        seqs, lps = everything(env)
    asked, got = map(int, __import__("re").search(r"(\d+) distinct ranks gave (\d+)", str(rec[0].message)).groups())
    assert asked == len(seqs) and got == len(set(seqs)) < asked
    assert env.collisions >= asked - got
    assert all(np.isfinite(lps)) and env.truncated


def test_queries_agree_with_each_other():
    model = ctx_model(6, 5, seed=7)
    env = AREnvelopeIndex(model, max_depth_bits=40.0, progress=False)
    seqs, lps = env.unrank_batch([5, 0, 77, 5])
    assert seqs[0] == seqs[3] and env.unrank(77) == (seqs[2], lps[2])
    assert env.slice(77, 1) == [(seqs[2], lps[2])]
    n = len(env)
    assert len(env.slice(n - 3, 10)) == 3 and env.slice(n, 4) == [] and env.slice(0, 0) == []
    assert env.count(0.5) == 0 and env.count(0.0) <= 1
    for r in (1, 10, 500, n):  # both estimates, from the same ranked sequences
        assert env.count(env.threshold(r)) == pytest.approx(r, rel=0.5, abs=2)
    lo, hi = env.rank_bracket(seqs[2])
    assert lo <= 77 <= hi


def test_large_regions_use_the_closed_form_estimate(monkeypatch):
    model = iid_model(10, 6, seed=1)
    env = AREnvelopeIndex(model, max_depth_bits=200.0, n_paths=4, progress=False)
    exact = [env.count(t) for t in (-8.0, -12.0, -15.0)]
    monkeypatch.setattr(env_mod, "RESOLVE_LIMIT", 0)
    for t, want in zip((-8.0, -12.0, -15.0), exact):
        assert env.count(t) == pytest.approx(want, rel=0.25)
    th = env.threshold(1000)
    assert env.count(th) == pytest.approx(1000, rel=0.05)


def test_corpus_calibration():
    model = iid_model(4, 5, seed=2)
    seek = SeekIndex(model, initial_bits=300.0, max_depth_bits=300.0, progress=False)
    corpus = [(1, 2), (0, 3, 3, 1), (2,)]  # short: depths 4 reuse the envelope above
    env = AREnvelopeIndex(model, calibration_sequences=corpus, max_depth_bits=300.0, progress=False)
    assert env.calibrated_on == "sequences" and everything(env)[0] == everything(seek)[0]
    ctx = ctx_model(5, 4, eos=2, seed=1)
    corpus = [s for s, _ in AREnvelopeIndex(ctx, progress=False).slice(0, 40)]
    env = AREnvelopeIndex(ctx, calibration_sequences=corpus, max_depth_bits=300.0, progress=False)
    seqs, _ = everything(env)
    assert sorted(seqs) == sorted(support(ctx))


def test_calibration_and_queries_are_batched():
    calls = []
    model = ctx_model(8, 6, seed=4, counter=calls)
    env = AREnvelopeIndex(model, n_paths=64, progress=False)
    assert len(calls) == 6  # the root, then one call per depth for all 64 contexts
    assert all(b & (b - 1) == 0 and t & (t - 1) == 0 for b, t in calls)  # power-of-two shapes
    del calls[:]
    env.unrank_batch(np.arange(0, 5000, 25))
    assert len(calls) == 6  # one call per depth (the lookahead before the leaves reads the last one)
    rows = env.forwards
    del calls[:]
    env.lookahead = False
    env.unrank_batch(np.arange(5000, 10000, 25))
    assert len(calls) == 6 and env.forwards - rows < rows


def test_save_load_round_trip(tmp_path):
    model = ctx_model(6, 5, eos=1, seed=9)
    env = AREnvelopeIndex(model, n_paths=12, seed=3, progress=False)
    path = tmp_path / "env.npz"
    env.save(path)
    assert [p.name for p in tmp_path.iterdir()] == ["env.npz"]  # no temp file left behind
    loaded = AREnvelopeIndex.load(path, model)
    assert len(loaded) == len(env) and loaded.total == env.total and loaded.forwards == env.forwards
    ranks = np.r_[np.arange(50), np.arange(60, len(env), 7)]
    assert loaded.unrank_batch(ranks)[0] == env.unrank_batch(ranks)[0]
    assert (loaded.n_paths, loaded.seed, loaded.lookahead) == (12, 3, env.lookahead)


def test_damaged_or_foreign_files_are_refused(tmp_path, monkeypatch):
    model = ctx_model(5, 4, seed=1)
    path = tmp_path / "env.npz"
    AREnvelopeIndex(model, n_paths=8, progress=False).save(path)
    data = path.read_bytes()
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(flipped))
    with pytest.raises(ValueError, match="env.npz.*(corrupted|checksum)"):
        AREnvelopeIndex.load(path, model)
    path.write_bytes(data[: len(data) // 3])
    with pytest.raises(ValueError, match="env.npz is not a readable AREnvelopeIndex"):
        AREnvelopeIndex.load(path, model)
    with pytest.raises(FileNotFoundError, match="missing.npz"):
        AREnvelopeIndex.load(tmp_path / "missing.npz", model)
    path.write_bytes(data)
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    np.savez(path, **{**arrays, "body": arrays["body"] * 2})
    with pytest.raises(ValueError, match="env.npz failed its checksum"):
        AREnvelopeIndex.load(path, model)
    path.write_bytes(data)
    monkeypatch.setattr(envelope_io, "VERSION", envelope_io.VERSION + 1)
    with pytest.raises(ValueError, match="version"):
        AREnvelopeIndex.load(path, model)
    monkeypatch.undo()
    seek_path = tmp_path / "seek.npz"
    SeekIndex(model, initial_bits=4.0, progress=False).save(seek_path)
    with pytest.raises(ValueError, match="seek.npz is a SeekIndex file, not an AREnvelopeIndex file: load it with SeekIndex.load"):
        AREnvelopeIndex.load(seek_path, model)


@pytest.mark.parametrize(
    "other, what",
    [
        (lambda: ctx_model(5, 4, seed=2), "different model"),
        (lambda: ctx_model(5, 5, seed=1), "max_len"),
        (lambda: ctx_model(5, 4, eos=0, seed=1), "eos"),
        (lambda: ctx_model(6, 4, seed=1), "vocab_size"),
    ],
)
def test_a_mismatched_model_is_refused(tmp_path, other, what):
    path = tmp_path / "env.npz"
    AREnvelopeIndex(ctx_model(5, 4, seed=1), n_paths=8, progress=False).save(path)
    with pytest.raises(ValueError, match=f"env.npz.*{what}"):
        AREnvelopeIndex.load(path, other())


def test_bad_arguments_name_themselves():
    model = ctx_model(4, 4, seed=0)
    for kwargs, match in [
        ({"n_paths": 0}, "n_paths"),
        ({"n_paths": 2.5}, "n_paths"),
        ({"seed": -1}, "seed"),
        ({"max_depth_bits": float("inf")}, "max_depth_bits"),
        ({"progress": "yes"}, "progress"),
        ({"chunk_rows": 0}, "chunk_rows"),
        ({"oversample": 0}, "oversample"),
        ({"lookahead": 1}, "lookahead"),
        ({"calibration_sequences": []}, "calibration_sequences"),
        ({"calibration_sequences": [(0, 9)]}, "calibration_sequences"),
        ({"calibration_sequences": [(0, 1, 2, 3, 0)]}, "calibration_sequences"),
        ({"calibration_sequences": 5}, "calibration_sequences"),
    ]:
        with pytest.raises(ValueError, match=match):
            AREnvelopeIndex(model, **kwargs)
    with pytest.raises(TypeError, match="next_logprobs"):
        AREnvelopeIndex(object())
    env = AREnvelopeIndex(model, progress=False)
    with pytest.raises(IndexError, match=">= 0"):
        env.unrank(-1)
    with pytest.raises(ValueError, match="rank"):
        env.unrank(1.5)
    with pytest.raises(IndexError, match="beyond"):
        env.unrank(len(env))
    with pytest.raises(ValueError, match="ranks must be integers"):
        env.unrank_batch([0.5])
    with pytest.raises(ValueError, match="min_log_prob"):
        env.count(float("nan"))
    with pytest.raises(ValueError, match="min_log_prob"):
        env.count(-math.inf)
    with pytest.raises(ValueError, match="rank"):
        env.threshold(0)
    with pytest.raises(IndexError, match="beyond"):
        env.threshold(len(env) + 1)
    with pytest.raises(ValueError, match="start"):
        env.slice(-1, 2)
    with pytest.raises(ValueError, match="not in the model's support"):
        env.rank_bracket((0, 1, 2))
    with pytest.raises(ValueError, match="seq must be"):
        env.rank_bracket(None)


def test_a_failing_model_leaves_the_index_unchanged():
    good = ctx_model(5, 4, seed=6)
    broken = {"on": False}

    def fn(prefixes, lengths):
        if broken["on"] and (lengths == 3).any():
            raise RuntimeError("device lost")
        return good.fn(prefixes, lengths)

    env = AREnvelopeIndex(CallableModel(fn, vocab_size=5, max_len=4, batched=True), progress=False)
    before = (env.forwards, env.collisions, env.unrank_batch(np.arange(40))[0])
    broken["on"] = True
    with pytest.raises(RuntimeError, match="device lost"):
        env.unrank_batch(np.arange(40))
    broken["on"] = False
    assert (env.forwards - 0, env.collisions) == (before[0] + (env.forwards - before[0]), before[1])
    forwards = env.forwards
    broken["on"] = True
    with pytest.raises(RuntimeError):
        env.slice(0, 10)
    assert env.forwards == forwards
    broken["on"] = False
    assert env.unrank_batch(np.arange(40))[0] == before[2]


def test_progress_bar_can_be_forced(capsys):
    AREnvelopeIndex(ctx_model(4, 4, seed=0), progress=True)
    assert "AREnvelopeIndex calibration" in capsys.readouterr().err


def test_soundness_interface():
    env = AREnvelopeIndex(ctx_model(4, 4, seed=0), progress=False)
    assert env.exact_order is False and env.bucket_bound is None and not callable(env.bucket_bound)
    assert env.quantizer == jaxrescore.Quantizer(1.0, 8) and env.truncated
    assert "AREnvelopeIndex" in jaxrescore.__all__ and "AREnvelopeIndex" in jaxrescore.index.__all__


@pytest.mark.parametrize("window", [0, 3, 40])
def test_rescored_index_never_certifies_under_a_gap(window):
    draft = ctx_model(5, 4, seed=1)
    target = ctx_model(5, 4, seed=1, peaked=0.35)
    env = AREnvelopeIndex(draft, n_paths=8, progress=False)
    for gap in (0.0, 0.5, 10.0, 1e9):
        result = RescoredIndex(env, target, rerank_window=window, assumed_gap=gap).top_k(3)
        assert result.certified is False and "approximate" in result.reason
        assert len(result.items) == 3
        for seq, lp in result.items:
            assert lp == pytest.approx(float(target.score_sequences([seq])[0]), abs=1e-5)
    assert RescoredIndex(env, target, rerank_window=window).top_k(3).certified is None


def test_rescored_index_certifies_only_on_true_exhaustion():
    draft = ctx_model(3, 3, seed=4)
    target = ctx_model(3, 3, seed=4, peaked=0.6)
    env = AREnvelopeIndex(draft, max_depth_bits=400.0, n_paths=8, progress=False)
    assert len(env) == 27
    # Exhaustion of the draft's support leans on the gap too, so the gap must be true here.
    pairs = support(target)
    gap = float(max(0.0, (target.score_sequences(pairs) - draft.score_sequences(pairs)).max()))
    result = RescoredIndex(env, target, rerank_window=40, assumed_gap=gap).top_k(4)
    assert result.certified is True and not env.truncated
    truth = sorted(target.score_sequences(support(target)).tolist(), reverse=True)[:4]
    assert [lp for _, lp in result.items] == pytest.approx(truth, abs=1e-6)
    short = AREnvelopeIndex(draft, max_depth_bits=8.0, n_paths=8, progress=False)  # not all ranked
    result = RescoredIndex(short, target, rerank_window=40, assumed_gap=1e9).top_k(4)
    assert result.certified is False and short.truncated



# Terminating drafts (V=3, max_len 4, eos 0) some of whose prefixes can never end: eos has
# probability 0 after them up to max_len - 1, where only eos fits (issue 36 item 2).
TRAPS = {
    "a rank sent to a prefix promised none": {  # IndexError in descent._which (an empty assign)
        (): (1, 1, 1), (1,): (0, .87, .13), (1, 1): (0, .5, .5), (1, 2): (.31, .2, .49),
        (2, 1): (.24, .32, .44), (2, 2): (0, .96, .04), (1, 1, 1): (0, .04, .96),
        (1, 1, 2): (0, .89, .11), (2, 1, 1): (0, .5, .5), (2, 1, 2): (0, .5, .5),
        (2, 2, 2): (.05, .58, .37),
    },
    "rank 0 leads to a prefix that can never end": {  # RuntimeError: no earlier rank to take
        (): (0, .38, .62), (1,): (0, .5, .5), (2,): (.18, .55, .27), (1, 1): (0, .5, .5),
        (1, 2): (.92, .04, .04), (2, 1): (0, .5, .5), (2, 2): (.12, .34, .54),
        (1, 1, 1): (0, .96, .04), (1, 1, 2): (0, .29, .71), (1, 2, 1): (0, .5, .5),
        (1, 2, 2): (0, .5, .5), (2, 1, 1): (0, .5, .5), (2, 1, 2): (0, .5, .5),
    },
}


def table_model(probs: dict, vocab: int = 3, length: int = 4, eos: int = 0):
    """A batched model over ``probs`` (prefix -> next-token probabilities); unlisted prefixes uniform."""
    def fn(prefixes, lengths):
        rows = [probs.get(tuple(p[:n].tolist()), (1,) * vocab) for p, n in zip(prefixes, lengths)]
        with np.errstate(divide="ignore"):
            logs = np.log(np.asarray(rows, np.float64))
        return (logs - np.logaddexp.reduce(logs, axis=1, keepdims=True)).astype(np.float32)

    return CallableModel(fn, vocab_size=vocab, max_len=length, eos=eos, batched=True)


@pytest.mark.parametrize("trap", list(TRAPS))
def test_a_terminating_draft_with_prefixes_that_never_end(trap):
    """Issue 36 item 2: every rank of the envelope gives a sequence of the draft's support (one
    that meets a dead prefix takes a nearby rank's, reported as a collision) and a proving search
    over it against a uniform target returns the target's exact top-k (a plain query may answer
    fewer than k: the pulled window holds the collisions' repeats)."""
    draft = table_model(TRAPS[trap])
    target = table_model({})
    env = AREnvelopeIndex(draft, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # collisions are expected here
        seqs, lps = everything(env)
    assert len(seqs) == len(env) > 0
    for seq, lp in zip(seqs, lps):
        assert seq[-1] == 0 and 0 not in seq[:-1] and lp > -math.inf and lp == exact_lp(draft, seq)
    truth = sorted(target.score_sequences(support(target)).tolist(), reverse=True)
    for k in (1, 3, 6):
        for prove in (False, True):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                r = RescoredIndex(AREnvelopeIndex(draft, progress=False), target, rerank_window=5).top_k(k, prove=prove)
            assert len({s for s, _ in r.items}) == len(r.items) <= k  # collisions may leave fewer
            if prove:
                assert r.proven is True, r.proof_reason
                assert [lp for _, lp in r.items] == pytest.approx(truth[:k], abs=1e-6)

def per_prefix(vocab, *, eos=None, seed=0):
    """The reference library's form (one prefix in, (tokens, log-probs) out): a bigram."""
    logits = np.random.default_rng(seed).normal(size=(vocab, vocab))

    def fn(prefix):
        row = logits[prefix[-1] if prefix else 0]
        return np.arange(vocab), row - np.logaddexp.reduce(row)

    return fn


@pytest.mark.parametrize("eos", [None, 0])
def test_an_inferred_vocabulary_is_accepted_like_seek_index_does(tmp_path, eos):
    """CallableModel without vocab_size (issue 23 item 9): the index reads the model's growing
    vocabulary, ranks the same sequences as with a given one, never claims the whole support
    (it is unknown), and saves and loads against a fresh inferred model."""
    fn = per_prefix(4, seed=5)
    inferred = CallableModel(fn, max_len=5, eos=eos)
    assert inferred.vocab_inferred and inferred.vocab_size < 4
    env = AREnvelopeIndex(inferred, max_depth_bits=400.0, n_paths=16, progress=False)
    given = AREnvelopeIndex(CallableModel(fn, vocab_size=4, max_len=5, eos=eos), max_depth_bits=400.0,
                            n_paths=16, progress=False)
    assert env.vocab_size == 4 == inferred.vocab_size
    n = min(len(env), len(given), 200)
    seqs, lps = env.unrank_batch(np.arange(n))
    assert len(set(seqs)) == n and all(max(s) < 4 for s in seqs)
    assert seqs == given.unrank_batch(np.arange(n))[0]
    everything(env)
    assert not env.exhausted  # the support of an inferred vocabulary is unknown
    assert SeekIndex(CallableModel(fn, max_len=5, eos=eos), progress=False).unrank(0)[0] == seqs[0]
    env.save(tmp_path / "env.npz")
    loaded = AREnvelopeIndex.load(tmp_path / "env.npz", CallableModel(fn, max_len=5, eos=eos))
    assert loaded.unrank_batch(np.arange(n))[0] == seqs
