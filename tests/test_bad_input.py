"""Issue 10, items 9-11: long sequences score -inf, bad input is refused by name and changes
nothing, model files are checksummed and fail in one clear error naming the file.

Each test is a regression test of one row of docs/bad_input.md (the README links it).
"""

import json
import math
import os
import zipfile

import numpy as np
import pytest

from brute import TableModel, as_model
from jaxrescore import CallableModel, NGramLM, RescoredIndex, SeekIndex, TransformerConfig, TransformerLM
from jaxrescore.models import from_apply_fn, load_model, quantize_int8, sample_sequences, save_model
from jaxrescore.rescore import estimate_gap, estimate_top_gap
from jaxrescore.models.checked import CheckedModel, checked_model, model_rows
from jaxrescore.models.checkpoint import ModelFileError
from jaxrescore.rescore.speculate import completion_model
from jaxrescore.sequences import SequenceBatch, as_sequence_batch, checked_batch, from_tuples


def tiny_transformer(max_len=4, eos=3, seed=0):
    cfg = TransformerConfig(vocab_size=4, d_model=8, n_layers=1, n_heads=2, max_len=max_len, eos=eos)
    return TransformerLM(cfg, seed=seed)


def ngram(max_len=4):
    seqs = [(0, 1, 3), (1, 3), (2, 2, 0, 3), (3,)]
    return NGramLM.fit(seqs, order=2, vocab_size=4, eos=3, max_len=max_len)


# ---- item 9: a sequence longer than max_len is outside the support: -inf, not an error --------


def _models():
    t = tiny_transformer()
    table = TableModel(4, 4, 0, eos=3)
    return {
        "transformer": t,
        "int8": quantize_int8(t),
        "ngram": ngram(),
        "apply_fn": from_apply_fn(t.apply, t.params, vocab_size=4, bos_id=4, max_len=4, eos=3),
        "callable": as_model(table),
        "callable_batched": as_model(table, batched=True),
    }


@pytest.mark.parametrize("name", list(_models()))
def test_long_sequences_score_minus_inf(name):
    model = _models()[name]
    short = [(0, 1, 3), (2, 3), (3,)]
    long = [(0, 1, 2, 0, 3), (1,) * 9 + (3,)]
    alone = model.score_sequences(short)
    mixed = model.score_sequences([long[0], short[0], long[1], short[1], short[2]])
    assert np.isneginf(mixed[[0, 2]]).all()
    np.testing.assert_allclose(mixed[[1, 3, 4]], alone, atol=1e-5)
    # skip and prompts go through the same rule
    assert np.isneginf(model.score_sequences(long, skip=[1, 1])).all()
    prompted = model.with_prompt((0,))
    assert np.isneginf(prompted.score_sequences([(1, 2, 0, 3)]))[0]  # 1 + 4 tokens > max_len
    # a long row still has its tokens checked: a bad id is bad input, not "outside the support"
    if name not in ("callable", "callable_batched"):
        with pytest.raises(ValueError, match="tokens must lie"):
            model.score_sequences([(0, 1, 2, 7, 3)])


def _brute_top(target, k):
    import itertools

    body = [t for t in range(target.vocab_size) if t != target.eos]
    support = [b + (target.eos,) for n in range(target.max_len) for b in itertools.product(body, repeat=n)]
    scores = target.score_sequences(support)
    return np.sort(scores)[::-1][:k]


@pytest.mark.parametrize("target_len, draft_len", [(3, 5), (5, 3)])
def test_target_and_draft_of_different_lengths_prove_the_right_answer(target_len, draft_len):
    """A target shorter than its draft scores the draft's long candidates -inf; a target longer
    than its draft gets its completions continued by the target past the draft's max_len."""
    target = tiny_transformer(max_len=target_len, seed=1)
    target.params = __import__("jax").tree.map(lambda x: 3.0 * x, target.params)  # separated scores
    draft = tiny_transformer(max_len=draft_len, seed=2)
    for k, window in ((3, 0), (6, 4)):
        r = RescoredIndex(SeekIndex(draft), target, rerank_window=window).top_k(k, prove=True)
        assert r.proven is True, r.proof_reason
        assert all(len(s) <= target_len and s[-1] == 3 for s, _ in r.items)
        np.testing.assert_allclose([lp for _, lp in r.items], _brute_top(target, k), atol=1e-4)


# ---- item 10: duck-typed models are checked where they enter -----------------------------------


class Duck:
    """A duck-typed model: any object with the protocol attributes and next_logprobs."""

    def __init__(self, rows, vocab_size=3, eos=None, max_len=2):
        self.rows, self.vocab_size, self.eos, self.max_len = rows, vocab_size, eos, max_len

    def next_logprobs(self, prefixes, lengths):
        return self.rows(np.asarray(prefixes).shape[0])

    def score_sequences(self, seqs):
        return np.full(len(seqs), -1.0)


GOOD = np.log(np.float32([0.5, 0.25, 0.25]))


@pytest.mark.parametrize(
    "rows, match",
    [
        (lambda b: np.tile(np.exp(GOOD), (b, 1)), "> 0 .*not probabilities"),
        (lambda b: np.tile(np.float32([np.inf, -1, -1]), (b, 1)), "> 0"),
        (lambda b: np.tile(np.float32([np.nan, -1, -1]), (b, 1)), "NaN"),
        (lambda b: np.tile(np.float32([-1, -1, -1]), (b, 1)), "not a distribution"),
        (lambda b: np.tile(np.append(GOOD, -np.inf), (b, 1)), "shape .*vocab_size"),
        (lambda b: np.tile(GOOD[:2], (b, 1)), "shape"),
        (lambda b: np.zeros((b, 3), np.int32), "dtype"),
        (lambda b: np.tile(GOOD, (b + 1, 1)), "shape"),
    ],
)
def test_bad_duck_rows_are_refused_by_name(rows, match):
    duck = Duck(rows)
    prefixes, lengths = np.zeros((2, 1), np.int32), np.array([0, 1], np.int32)
    with pytest.raises(ValueError, match=f"duck.next_logprobs.*{match}"):
        model_rows(duck, prefixes, lengths, "duck")
    # the same check wherever a duck model enters: the search's completion model, sampling
    draft = completion_model(None, duck, as_model(TableModel(3, 2, 0)))
    assert isinstance(draft, CheckedModel)
    with pytest.raises(ValueError, match="draft_model.next_logprobs"):
        draft.next_logprobs(prefixes, lengths)
    with pytest.raises(ValueError, match="model.next_logprobs"):
        sample_sequences(duck, 3)


def test_good_duck_rows_pass_and_are_clipped():
    noisy = GOOD.copy()
    noisy[0] = np.float32(2e-6)  # float noise above 0 (still a distribution within NORM_TOL)
    noisy[1:] = np.log(np.float32(1e-8))
    duck = Duck(lambda b: np.tile(noisy, (b, 1)))
    rows = model_rows(duck, np.zeros((2, 1), np.int32), np.array([0, 1], np.int32), "duck")
    assert rows.dtype == np.float32 and rows.max() == 0.0
    assert sample_sequences(duck, 4).tokens.shape == (4, 2)


@pytest.mark.parametrize(
    "attrs, match",
    [
        (dict(eos=3), "duck.eos must be None or an integer in \\[0, 3\\), got 3"),
        (dict(eos=True), "duck.eos .*bool"),
        (dict(max_len=2.7), "duck.max_len must be an integer >= 1, got 2.7"),
        (dict(vocab_size=0), "duck.vocab_size"),
        (dict(vocab_size=3.5), "duck.vocab_size"),
    ],
)
def test_bad_duck_attributes_are_refused_by_name(attrs, match):
    duck = Duck(lambda b: np.tile(GOOD, (b, 1)), **attrs)
    with pytest.raises(ValueError, match=match):
        checked_model(duck, "duck")
    with pytest.raises(ValueError, match=match.replace("duck", "draft_model")):
        completion_model(None, duck, None)


def test_duck_scores_are_checked_by_gap_estimates():
    table = TableModel(3, 2, 0)
    good = as_model(table)
    duck = Duck(lambda b: np.tile(GOOD, (b, 1)))
    duck.score_sequences = lambda seqs: np.full(len(seqs), 5.0)  # +5: not a log-prob
    with pytest.raises(ValueError, match="draft.score_sequences returned 5.0"):
        estimate_gap(duck, good, [(0, 1), (1, 1)])
    duck.score_sequences = lambda seqs: np.zeros(len(seqs), np.int64)
    with pytest.raises(ValueError, match="target.score_sequences returned dtype int64"):
        estimate_top_gap(good, duck, 1, n_samples=2)


def test_our_own_models_are_not_wrapped():
    for model in _models().values():
        assert checked_model(model) is model
    inferred = CallableModel(lambda p: [(0, 0.0)], max_len=2)  # vocabulary inferred: starts at 0
    assert checked_model(inferred) is inferred

    class Sub(CallableModel):  # a subclass overriding next_logprobs is a foreign model
        def next_logprobs(self, prefixes, lengths):
            return np.ones((np.shape(prefixes)[0], 3), np.float32)

    sub = Sub(lambda p: [(0, 0.0)], vocab_size=3, max_len=2)
    with pytest.raises(ValueError, match="> 0"):
        checked_model(sub).next_logprobs(np.zeros((1, 1), np.int32), np.zeros(1, np.int32))


@pytest.mark.parametrize(
    "seqs",
    [[(0.0, 1.0)], [(1, 2.5)], [(True, False)], [(1, 2), (True, 3)], [(1,), (np.bool_(True),)],
     [(1, 2), [3, 4.0]], np.zeros((2, 2)), np.zeros((2, 2), bool)],
)
def test_float_and_bool_tokens_are_refused_not_cast(seqs):
    with pytest.raises(TypeError, match="integer"):
        as_sequence_batch(seqs)
    with pytest.raises(TypeError, match="integer"):
        as_model(TableModel(3, 2, 0)).score_sequences(seqs)


def test_token_batches_refuse_floats_wraparound_and_nesting():
    with pytest.raises(TypeError, match="prefixes lengths must be integers"):
        checked_batch(np.zeros((1, 2), np.int32), np.array([1.0]), what="prefixes")
    with pytest.raises(ValueError, match="outside \\[0, 2\\*\\*31\\)"):
        checked_batch(np.array([[2**32 + 1]], np.int64), np.array([1]))
    # padding may hold anything: only real tokens are checked
    batch = checked_batch(np.array([[1, 2**40]], np.int64), np.array([1]))
    assert batch.tokens.dtype == np.int32 and batch.tokens[0, 0] == 1
    with pytest.raises(ValueError, match="flat sequence"):
        from_tuples([[[1, 2]]])
    with pytest.raises(TypeError, match="got str"):
        as_sequence_batch("abc")
    with pytest.raises(ValueError, match="length must be None or an integer"):
        from_tuples([(1,)], length=2.5)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: TransformerConfig(vocab_size=4, eos=True), "TransformerConfig.eos .*bool"),
        (lambda: TransformerConfig(vocab_size=4, max_len=2.7), "TransformerConfig.max_len .*2.7"),
        (lambda: TransformerConfig(vocab_size=True), "TransformerConfig.vocab_size"),
        (lambda: TransformerConfig(vocab_size=4, d_ff=True), "TransformerConfig.d_ff"),
        (lambda: TransformerConfig(vocab_size=4, dropout=True), "TransformerConfig.dropout"),
        (lambda: TransformerConfig(vocab_size=4, positions=1), "TransformerConfig.positions"),
        (lambda: TransformerLM(TransformerConfig(vocab_size=4), seed=1.5), "seed"),
        (lambda: NGramLM.fit([(0, 1, 3)], vocab_size=4, eos=3, max_len=2.7), "max_len .*2.7"),
        (lambda: NGramLM.fit([(0, 1, 3)], vocab_size=4, eos=True), "eos .*bool"),
        (lambda: NGramLM.fit([(0, 1, 3)], vocab_size=4, eos=3.5), "eos .*float"),
        (lambda: NGramLM.fit([(0, 1, 3)], vocab_size=4, eos=3, order=True), "order"),
        (lambda: NGramLM.fit([(0, 1, 3)], vocab_size=4, eos=3, discount="0.5"), "discount"),
        (lambda: NGramLM.fit([(0, 1, 3)], vocab_size=4, eos=3, weights=["a"]), "weights"),
        (lambda: CallableModel(lambda p: [], max_len=2.7), "max_len .*2.7"),
        (lambda: CallableModel(lambda p: [], max_len=2, eos=True), "eos"),
        (lambda: CallableModel(lambda p: [], max_len=2, batched="yes"), "batched"),
        (lambda: from_apply_fn(lambda p, t: t, {}, vocab_size=3, bos_id=True, max_len=2), "bos_id"),
        (lambda: from_apply_fn(lambda p, t: t, {}, vocab_size=3, bos_id=3, max_len=2.7), "max_len"),
        (lambda: tiny_transformer().with_prompt("ab"), "prompt"),
        (lambda: tiny_transformer().with_prompt([1.0]), "prompt"),
        (lambda: tiny_transformer().score_sequences([(1, 3)], skip=[0.5]), "skip"),
        (lambda: sample_sequences(tiny_transformer(), 2, seed=-1), "seed"),
        (lambda: estimate_top_gap(ngram(), tiny_transformer(), 1, region_margin=True), "region_margin"),
    ],
)
def test_bad_arguments_name_themselves(make, match):
    with pytest.raises((ValueError, TypeError), match=match):
        make()


def test_failed_calls_leave_models_unchanged():
    calls = []

    def fn(prefix):
        calls.append(prefix)
        if prefix == (1,):
            return [(0, math.log(0.5)), (7, math.log(0.5))]
        if prefix == (2,):
            return [(0, 0.5)]  # a positive log-prob: refused
        return [(0, math.log(0.5)), (1, math.log(0.25)), (2, math.log(0.25))]

    model = CallableModel(fn, max_len=3)  # vocabulary inferred
    model.next_logprobs(np.zeros((1, 1), np.int32), np.zeros(1, np.int32))
    assert model.vocab_size == 3
    with pytest.raises(ValueError, match="> 0"):
        model.next_logprobs(np.array([[1], [2]], np.int32), np.array([1, 1], np.int32))
    assert model.vocab_size == 3  # the table of (1,) widened it, the failed call undid that

    t = tiny_transformer()
    before = [np.asarray(x).copy() for x in __import__("jax").tree.leaves(t.params)]
    from jaxrescore.models import train_lm

    with pytest.raises(ValueError, match="does not end with eos"):
        train_lm(t, [(1, 3), (1, 2)], steps=2, progress=False)
    after = __import__("jax").tree.leaves(t.params)
    assert all(np.array_equal(a, b) for a, b in zip(before, after))


# ---- item 11: model files --------------------------------------------------------------------


def test_model_files_round_trip_every_savable_kind(tmp_path):
    t = tiny_transformer()
    for name, model in (("t", t), ("q", quantize_int8(t)), ("n", ngram())):
        path = tmp_path / f"{name}.npz"
        save_model(model, path, vocabulary=["a", "b", "c", "<eos>"])
        back = load_model(path)
        assert type(back) is type(model) and back.vocabulary == ("a", "b", "c", "<eos>")
        seqs = [(0, 1, 3), (2, 3)]
        np.testing.assert_array_equal(back.score_sequences(seqs), model.score_sequences(seqs))
        save_model(model, tmp_path / "again.npz", vocabulary=["a", "b", "c", "<eos>"])
        assert (tmp_path / "again.npz").read_bytes() == path.read_bytes()  # same model, same bytes
    assert sorted(p.name for p in tmp_path.iterdir()) == ["again.npz", "n.npz", "q.npz", "t.npz"]
    with pytest.raises(ValueError, match="vocabulary must have one string per token id \\(4\\)"):
        save_model(t, tmp_path / "v.npz", vocabulary=["a"])


def _flip(src, dst, offset):
    data = bytearray(src.read_bytes())
    data[offset] ^= 0x55
    dst.write_bytes(bytes(data))


@pytest.mark.parametrize("which", ["v2", "shipped v1"])
def test_flipped_bytes_give_one_error_naming_the_file(tmp_path, which):
    from jaxrescore.data.names_models import shipped_target_path

    if which == "v2":
        src = tmp_path / "m.npz"
        save_model(tiny_transformer(), src)
    else:
        src = shipped_target_path()
    import jax

    want = [np.asarray(x) for x in jax.tree.leaves(load_model(src).params)]
    size = src.stat().st_size
    refused = 0
    for offset in range(0, size, max(1, size // 97)):
        bad = tmp_path / "flipped.npz"
        _flip(src, bad, offset)
        try:
            got = load_model(bad)
        except ModelFileError as err:
            assert "flipped.npz" in str(err)
            refused += 1
        else:  # a byte no content depends on (zip timestamps, flags): the same weights
            assert all(np.array_equal(a, np.asarray(b)) for a, b in zip(want, jax.tree.leaves(got.params)))
    assert refused >= 80


def test_bad_metadata_is_one_error_naming_the_file(tmp_path):
    path = tmp_path / "m.npz"
    save_model(tiny_transformer(), path)
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    meta = json.loads(str(arrays.pop("__meta__")))
    cases = {
        "noconfig": {k: v for k, v in meta.items() if k != "config"},
        "badversion": {**meta, "version": 99},
        "badkind": {**meta, "kind": "GPT"},
        "badconfig": {**meta, "config": {**meta["config"], "eos": True}},
        "extra": {**meta, "config": {**meta["config"], "bogus": 1}},
    }
    from jaxrescore.models.checkpoint import _checksum

    for name, m in cases.items():
        m = {**m, "checksum": None}
        m["checksum"] = _checksum(m, arrays)
        np.savez(tmp_path / f"{name}.npz", **arrays, __meta__=np.array(json.dumps(m)))
        with pytest.raises(ModelFileError, match=f"{name}.npz"):
            load_model(tmp_path / f"{name}.npz")
    np.savez(tmp_path / "notjson.npz", **arrays, __meta__=np.array("{not json"))
    with pytest.raises(ModelFileError, match="notjson.npz.*header"):
        load_model(tmp_path / "notjson.npz")
    with zipfile.ZipFile(tmp_path / "nometa.npz", "w") as z:
        z.writestr("x.npy", b"junk")
    with pytest.raises(ModelFileError, match="nometa.npz"):
        load_model(tmp_path / "nometa.npz")
    with pytest.raises(FileNotFoundError, match="absent.npz"):
        load_model(tmp_path / "absent.npz")
    with pytest.raises(ModelFileError, match="is a folder"):
        load_model(tmp_path)


def test_a_failed_write_leaves_nothing_and_fsyncs_before_rename(tmp_path, monkeypatch):
    path = tmp_path / "m.npz"
    model = tiny_transformer()
    save_model(model, path)
    good = path.read_bytes()
    real_savez = np.savez

    def failing_savez(f, **arrays):
        f.write(b"partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(np, "savez", failing_savez)
    with pytest.raises(OSError, match="cannot write model file .*m.npz.*No space left"):
        save_model(tiny_transformer(seed=5), path)
    assert [p.name for p in tmp_path.iterdir()] == ["m.npz"] and path.read_bytes() == good
    monkeypatch.setattr(np, "savez", real_savez)

    order = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (order.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda a, b: (order.append("replace"), real_replace(a, b))[1])
    save_model(model, path)
    assert order == ["fsync", "replace"]
    with pytest.raises(FileNotFoundError, match="no folder"):
        save_model(model, tmp_path / "nowhere" / "m.npz")
    with pytest.raises(TypeError, match="path must be a file path"):
        load_model(None)


def test_prompted_model_keeps_the_vocabulary(tmp_path):
    t = tiny_transformer()
    t.vocabulary = ("a", "b", "c", "<eos>")
    assert t.with_prompt((0,)).vocabulary == t.vocabulary


def test_sequence_batch_input_unchanged():
    toks = np.array([[1, 2, 3]], np.int64)
    lens = np.array([3])
    batch = as_sequence_batch(SequenceBatch(toks, lens))
    assert batch.tokens.dtype == np.int32 and toks.dtype == np.int64  # the caller's arrays untouched


# ---- issue 36 item 6: files follow the umask and say what they are ---------------------------


def test_saved_files_follow_the_umask(tmp_path):
    """A model, a SeekIndex and an AREnvelopeIndex file get ``0o666`` less the umask, like any
    new file (they were 0o600, the mode of mkstemp's temporary file), and no temporary is left."""
    from jaxrescore import AREnvelopeIndex

    model = ngram()
    old = os.umask(0o027)
    try:
        save_model(model, tmp_path / "m.npz")
        SeekIndex(model, progress=False).save(tmp_path / "s.npz")
        AREnvelopeIndex(model, progress=False).save(tmp_path / "e.npz")
    finally:
        os.umask(old)
    modes = {p.name: oct(p.stat().st_mode & 0o777) for p in tmp_path.iterdir()}
    assert modes == {"m.npz": "0o640", "s.npz": "0o640", "e.npz": "0o640"}, modes


def test_a_file_of_another_kind_is_named_as_such(tmp_path):
    """Each loader names a library file of another kind and what loads it, instead of calling it
    corrupted (``SeekIndex.load`` on a saved model said "corrupted or truncated")."""
    from jaxrescore import AREnvelopeIndex
    from jaxrescore.files import KINDS
    from jaxrescore.index.envelope import io as envelope_io
    from jaxrescore.index.seek import io as seek_io
    from jaxrescore.models import checkpoint

    assert set(KINDS) == {checkpoint.FORMAT, seek_io.FORMAT, envelope_io.FORMAT}
    model = ngram()
    save_model(model, tmp_path / "m.npz")
    SeekIndex(model, progress=False).save(tmp_path / "s.npz")
    AREnvelopeIndex(model, progress=False).save(tmp_path / "e.npz")
    cases = [
        (lambda: SeekIndex.load(tmp_path / "m.npz", model),
         "m.npz is a saved model, not a SeekIndex file: load it with jaxrescore.load_model"),
        (lambda: AREnvelopeIndex.load(tmp_path / "m.npz", model),
         "m.npz is a saved model, not an AREnvelopeIndex file: load it with jaxrescore.load_model"),
        (lambda: SeekIndex.load(tmp_path / "e.npz", model),
         "e.npz is an AREnvelopeIndex file, not a SeekIndex file: load it with AREnvelopeIndex.load"),
        (lambda: AREnvelopeIndex.load(tmp_path / "s.npz", model),
         "s.npz is a SeekIndex file, not an AREnvelopeIndex file: load it with SeekIndex.load"),
        (lambda: load_model(tmp_path / "s.npz"),
         "s.npz is a SeekIndex file, not a saved model: load it with SeekIndex.load"),
    ]
    for load, words in cases:
        with pytest.raises(ValueError) as err:
            load()
        assert words in str(err.value) and "corrupt" not in str(err.value), str(err.value)
