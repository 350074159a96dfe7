import jax
import numpy as np
import pytest

from jaxrescore.models.checkpoint import load_model, save_model
from jaxrescore.models.int8 import QTensor, dequantize, max_step_deviation, quantize_int8
from jaxrescore.models.transformer import TransformerConfig, TransformerLM
from model_checks import check_protocol


def target():
    return TransformerLM(
        TransformerConfig(vocab_size=5, d_model=32, n_layers=1, n_heads=2, max_len=6, eos=0), seed=0
    )


def seqs(n=20):
    rng = np.random.default_rng(0)
    return [tuple(int(t) for t in rng.integers(1, 5, size=rng.integers(0, 6))) + (0,) for _ in range(n)]


def test_int8_twin_protocol_and_deviation():
    m = target()
    q = quantize_int8(m)
    check_protocol(q, seqs())
    leaves = jax.tree.leaves(q.params, is_leaf=lambda x: isinstance(x, QTensor))
    kernels = [x for x in leaves if isinstance(x, QTensor)]
    assert kernels and all(k.q.dtype == np.int8 and k.scale.dtype == np.float32 for k in kernels)
    # per-output-channel: a kernel [in, out] has one scale per output column
    assert any(k.scale.shape == (1, k.q.shape[1]) for k in kernels)
    dev = max_step_deviation(m, q, seqs())
    assert 0.0 < dev < 0.05
    sampled = max_step_deviation(m, q, n=8, seed=1)
    assert 0.0 < sampled < 0.05
    # the per-step deviation bounds the sequence-level one
    gap = np.abs(m.score_sequences(seqs()) - q.score_sequences(seqs()))
    assert gap.max() <= dev * 6 + 1e-6


def test_dequantized_weights_are_close():
    m = target()
    q = quantize_int8(m)
    for w, d in zip(jax.tree.leaves(m.params), jax.tree.leaves(dequantize(q.params))):
        assert w.shape == d.shape
        np.testing.assert_allclose(d, w, atol=float(np.abs(w).max()) / 127 + 1e-7)


def test_int8_save_load_and_not_trainable(tmp_path):
    from jaxrescore.models.training import train_lm

    q = quantize_int8(target())
    save_model(q, tmp_path / "q.npz")
    back = load_model(tmp_path / "q.npz")
    assert type(back).__name__ == "Int8TransformerLM"
    np.testing.assert_array_equal(back.score_sequences(seqs()), q.score_sequences(seqs()))
    with pytest.raises(TypeError, match="trainable"):
        train_lm(q, seqs(), steps=1, progress=False)
    with pytest.raises(TypeError, match="TransformerLM"):
        quantize_int8(q)
