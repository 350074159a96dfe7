import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrescore.models.apply_fn import from_apply_fn
from jaxrescore.models.training import train_lm
from model_checks import check_protocol

V, D = 4, 8


def apply_fn(params, tokens):
    """A causal LM defined only as a function: running mean of embeddings, then a linear head."""
    x = params["emb"][tokens]
    t = tokens.shape[1]
    h = jnp.cumsum(x, axis=1) / jnp.arange(1, t + 1, dtype=jnp.float32)[None, :, None]
    return jnp.tanh(h) @ params["out"] + params["bias"]


def init(seed=0):
    k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
    return {
        "emb": jax.random.normal(k1, (V + 1, D)),
        "out": jax.random.normal(k2, (D, V)),
        "bias": jnp.zeros(V),
    }


def seqs(n=16, seed=0):
    rng = np.random.default_rng(seed)
    return [tuple(int(t) for t in rng.integers(1, V, size=rng.integers(0, 5))) + (0,) for _ in range(n)]


def test_function_model_protocol():
    m = from_apply_fn(apply_fn, init(), vocab_size=V, bos_id=V, max_len=6, eos=0)
    check_protocol(m, seqs())


def test_function_model_fixed_length_and_training():
    rng = np.random.default_rng(0)
    data = [tuple(int(t) for t in rng.integers(0, 2, size=5)) for _ in range(64)]
    m = from_apply_fn(apply_fn, init(), vocab_size=V, bos_id=V, max_len=5)
    check_protocol(m, data[:10])
    before = m.score_sequences(data).mean()
    train_lm(m, data, steps=30, batch_size=16, lr=3e-2, progress=False)
    assert m.score_sequences(data).mean() > before  # new params are used by the scorer


def test_bad_apply_fn():
    with pytest.raises(ValueError, match="logits of shape"):
        from_apply_fn(apply_fn, init(), vocab_size=V + 1, bos_id=V, max_len=6)
    with pytest.raises(TypeError, match="callable"):
        from_apply_fn("f", init(), vocab_size=V, bos_id=V, max_len=6)
    with pytest.raises(ValueError, match="eos"):
        from_apply_fn(apply_fn, init(), vocab_size=V, bos_id=V, max_len=6, eos=V)


def test_score_tolerance_follows_the_logits_dtype():
    m32 = from_apply_fn(apply_fn, init(), vocab_size=V, bos_id=V, max_len=6, eos=0)
    m16 = from_apply_fn(
        lambda p, t: apply_fn(p, t).astype(jnp.bfloat16), init(), vocab_size=V, bos_id=V, max_len=6, eos=0
    )
    assert m32.score_tolerance == 1e-3 and m16.score_tolerance == 0.1
    fs = m16.score_frontier(seqs(4), top_m=2)
    assert np.isfinite(fs.scores).all() and (fs.top_lps <= 0).all()
