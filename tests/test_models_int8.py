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


@pytest.mark.parametrize("activations,limit", [("float", 0.05), ("int8", 0.1)])
def test_int8_twin_protocol_and_deviation(activations, limit):
    m = target()
    q = quantize_int8(m, activations=activations)
    assert q.activations == activations
    check_protocol(q, seqs())
    leaves = jax.tree.leaves(q.params, is_leaf=lambda x: isinstance(x, QTensor))
    kernels = [x for x in leaves if isinstance(x, QTensor)]
    assert kernels and all(k.q.dtype == np.int8 and k.scale.dtype == np.float32 for k in kernels)
    # per-output-channel: a kernel [in, out] has one scale per output column
    assert any(k.scale.shape == (1, k.q.shape[1]) for k in kernels)
    dev = max_step_deviation(m, q, seqs())
    assert 0.0 < dev < limit
    sampled = max_step_deviation(m, q, n=8, seed=1)
    assert 0.0 < sampled < limit
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

    for activations in ("int8", "float"):
        q = quantize_int8(target(), activations=activations)
        save_model(q, tmp_path / "q.npz")
        back = load_model(tmp_path / "q.npz")
        assert type(back).__name__ == "Int8TransformerLM" and back.activations == activations
        np.testing.assert_array_equal(back.score_sequences(seqs()), q.score_sequences(seqs()))
    with pytest.raises(TypeError, match="trainable"):
        train_lm(q, seqs(), steps=1, progress=False)
    with pytest.raises(TypeError, match="TransformerLM"):
        quantize_int8(q)
    with pytest.raises(ValueError, match="activations"):
        quantize_int8(target(), activations="int4")


def test_int8_twin_of_an_apply_fn_model():
    import jax.numpy as jnp

    from jaxrescore.models import decoding_session, from_apply_fn

    m = target()
    f = from_apply_fn(m.apply, m.params, vocab_size=5, bos_id=5, max_len=6, eos=0)
    q = quantize_int8(f)
    leaves = jax.tree.leaves(q.params, is_leaf=lambda x: isinstance(x, QTensor))
    assert any(isinstance(x, QTensor) and x.q.dtype == jnp.int8 for x in leaves)
    check_protocol(q, seqs())
    assert 0.0 < max_step_deviation(f, q, seqs()) < 0.05
    assert not q.trainable and decoding_session(q) is None

    def mean_apply(p, t):
        return jnp.cumsum(p["emb"][t], axis=1) @ p["out"]

    def step(p, cache, t, pos):
        s = cache["s"] + p["emb"][t[:, 0]]
        return (s @ p["out"])[:, None], {"s": s}

    params = {"emb": jnp.asarray(np.random.default_rng(0).normal(size=(6, 8)), jnp.float32),
              "out": jnp.asarray(np.random.default_rng(1).normal(size=(8, 5)), jnp.float32)}
    g = from_apply_fn(mean_apply, params, vocab_size=5, bos_id=5, max_len=6, eos=0,
                      init_cache=lambda b, n: {"s": jnp.zeros((b, 8))}, step=step)
    qg = quantize_int8(g)
    s = decoding_session(qg)
    pre = np.array([[1, 2, 3], [4, 4, 1]], np.int32)
    np.testing.assert_allclose(s.next_logprobs(pre, [3, 2]), qg.next_logprobs(pre, [3, 2]), atol=1e-5)
