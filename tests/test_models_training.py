import json

import numpy as np
import optax
import pytest

from jaxrescore.models.checkpoint import load_model, save_model
from jaxrescore.models.ngram import NGramLM
from jaxrescore.models.training import distill, train_lm
from jaxrescore.models.transformer import TransformerConfig, TransformerLM


def corpus(n, seed):
    """Deterministic-ish chains: a start token in {1, 2}, then t -> t % 4 + 1, then eos."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        s = [int(rng.integers(1, 3))]
        for _ in range(int(rng.integers(0, 6))):
            s.append(s[-1] % 4 + 1)
        out.append(tuple(s) + (0,))
    return out


def model(d=32, seed=0):
    return TransformerLM(
        TransformerConfig(vocab_size=5, d_model=d, n_layers=1, n_heads=2, max_len=8, eos=0), seed=seed
    )


def nll(m, seqs):
    return -m.score_sequences(seqs).sum() / sum(len(s) for s in seqs)


def mean_kl(teacher, student, seqs):
    batch, t = teacher.position_logprobs(seqs)
    _, s = student.position_logprobs(batch)
    kl = (np.exp(t) * (t - s)).sum(-1)
    mask = np.arange(kl.shape[1])[None, :] < batch.lengths[:, None]
    return float(kl[mask].mean())


def test_training_lowers_held_out_loss():
    m = model()
    held_out = corpus(100, seed=1)
    before = nll(m, held_out)
    schedule = optax.linear_schedule(3e-3, 1e-3, 80)
    log = train_lm(m, corpus(400, seed=0), steps=80, batch_size=32, lr=schedule, progress=False)
    assert log.shape == (80,) and log.dtype == np.float32
    assert log[-10:].mean() < log[:10].mean()
    assert nll(m, held_out) < 0.5 * before


def test_dropout_trains_and_scoring_stays_deterministic():
    m = TransformerLM(TransformerConfig(vocab_size=5, d_model=32, n_layers=1, n_heads=2, max_len=8,
                                        eos=0, dropout=0.2))
    assert m.uses_dropout
    log = train_lm(m, corpus(200, seed=0), steps=30, batch_size=32, lr=3e-3, progress=False)
    assert log[-5:].mean() < log[:5].mean()
    seqs = corpus(10, seed=1)
    np.testing.assert_array_equal(m.score_sequences(seqs), m.score_sequences(seqs))


def test_weights_steer_training():
    # Only chains starting with 2 carry weight: the model learns to start with 2.
    seqs = corpus(200, seed=0)
    w = [1.0 if s[0] == 2 else 0.0 for s in seqs]
    m = model()
    train_lm(m, seqs, weights=w, steps=40, batch_size=32, lr=3e-3, progress=False)
    first = np.exp(m.next_logprobs(np.zeros((1, 1), np.int32), np.array([0])))[0]
    assert first[2] > 0.8


def test_distilled_student_is_closer_to_teacher():
    seqs = corpus(300, seed=0)
    teacher = model()  # a random teacher is as good a target as a trained one
    student = model(d=16, seed=1)
    held_out = corpus(60, seed=2)
    before = mean_kl(teacher, student, held_out)
    log = distill(student, teacher, seqs, steps=40, batch_size=32, lr=3e-3, progress=False)
    assert log[-5:].mean() < log[:5].mean()
    assert mean_kl(teacher, student, held_out) < 0.3 * before


def test_distill_from_ngram_teacher_without_one_forward():
    seqs = corpus(200, seed=0)
    teacher = NGramLM.fit(seqs, order=3, vocab_size=5, eos=0, max_len=8)
    student = model(d=16, seed=1)
    before = mean_kl(teacher, student, seqs[:50])
    distill(student, teacher, seqs, steps=30, batch_size=32, lr=3e-3, progress=False)
    assert mean_kl(teacher, student, seqs[:50]) < before


def test_bad_training_input():
    m = model()
    with pytest.raises(ValueError, match="does not end with eos"):
        train_lm(m, [(1, 2)], steps=1, progress=False)
    with pytest.raises(ValueError, match="steps"):
        train_lm(m, [(1, 0)], steps=0, progress=False)
    with pytest.raises(ValueError, match="lr"):
        train_lm(m, [(1, 0)], steps=1, lr=-1.0, progress=False)
    with pytest.raises(TypeError, match="trainable"):
        train_lm(NGramLM.fit([(1, 0)], vocab_size=5, eos=0), [(1, 0)], steps=1, progress=False)
    with pytest.raises(ValueError, match="share vocab_size"):
        distill(m, NGramLM.fit([(1, 0)], vocab_size=6, eos=0), [(1, 0)], steps=1, progress=False)


def test_save_load_roundtrip(tmp_path):
    m = model()
    m.params = m.params  # the saved weights are whatever params currently holds
    path = tmp_path / "m.npz"
    save_model(m, path)
    back = load_model(path)
    assert back.config == m.config
    seqs = corpus(20, seed=3)
    np.testing.assert_array_equal(back.score_sequences(seqs), m.score_sequences(seqs))
    assert [p.name for p in tmp_path.iterdir()] == ["m.npz"]  # no temporary left behind


def _resave(path, arrays, meta):
    """Write a model file with edited contents and a checksum that matches them (so the check
    under test is the one that fires, not the checksum)."""
    from jaxrescore.models.checkpoint import _checksum

    meta = {**meta, "checksum": None}
    meta["checksum"] = _checksum(meta, arrays)
    np.savez(path, **arrays, __meta__=np.array(json.dumps(meta)))


def test_load_checks_config_and_shapes(tmp_path):
    from jaxrescore.models.checkpoint import ModelFileError

    path = tmp_path / "m.npz"
    save_model(model(), path)
    with np.load(path) as data:
        arrays = {k: data[k] for k in data.files}
    meta = json.loads(str(arrays.pop("__meta__")))

    _resave(tmp_path / "shape.npz", arrays, {**meta, "config": {**meta["config"], "d_model": 16}})
    with pytest.raises(ModelFileError, match="shape.npz.*has shape"):
        load_model(tmp_path / "shape.npz")

    edited = {**meta, "config": {**meta["config"], "d_model": 16}}
    np.savez(tmp_path / "tampered.npz", **arrays, __meta__=np.array(json.dumps(edited)))
    with pytest.raises(ModelFileError, match="tampered.npz.*checksum"):
        load_model(tmp_path / "tampered.npz")

    less = {k: v for k, v in arrays.items() if k != "head/bias"}
    _resave(tmp_path / "missing.npz", less, meta)
    with pytest.raises(ValueError, match="missing weights \\['head/bias'\\]"):
        load_model(tmp_path / "missing.npz")

    np.savez(tmp_path / "plain.npz", x=np.zeros(2))
    with pytest.raises(ValueError, match="plain.npz.*not a jaxrescore model"):
        load_model(tmp_path / "plain.npz")
    with pytest.raises(TypeError, match="save_model"):
        save_model(object(), tmp_path / "n.npz")
