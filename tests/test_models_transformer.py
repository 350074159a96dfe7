import jax
import numpy as np
import pytest

from jaxrescore.models.transformer import TransformerConfig, TransformerLM
from model_checks import check_protocol


def tiny(**kw):
    cfg = dict(vocab_size=5, d_model=32, n_layers=1, n_heads=2, max_len=6, eos=0)
    cfg.update(kw)
    return TransformerLM(TransformerConfig(**cfg), seed=0)


def eos_corpus(n=20, seed=0):
    rng = np.random.default_rng(seed)
    return [tuple(int(t) for t in rng.integers(1, 5, size=rng.integers(0, 6))) + (0,) for _ in range(n)]


@pytest.mark.parametrize("positions", ["learned", "sinusoidal"])
def test_protocol_eos(positions):
    check_protocol(tiny(positions=positions, n_layers=2 if positions == "learned" else 1), eos_corpus())


def test_protocol_fixed_length():
    rng = np.random.default_rng(1)
    seqs = [tuple(int(t) for t in rng.integers(0, 5, size=6)) for _ in range(12)]
    check_protocol(tiny(eos=None), seqs)


def test_chunking_matches_single_batch():
    m = tiny()
    seqs = eos_corpus(40, seed=2)
    whole = m.score_sequences(seqs)
    m.chunk_rows = 8
    np.testing.assert_allclose(m.score_sequences(seqs), whole, atol=1e-5)


def test_new_weights_are_used():
    m = tiny()
    seqs = eos_corpus(5)
    before = m.score_sequences(seqs)
    m.params = jax.tree.map(lambda x: x * 1.5, m.params)
    after = m.score_sequences(seqs)
    assert np.abs(after - before).max() > 1e-3
    fresh = tiny()
    fresh.params = m.params
    np.testing.assert_allclose(fresh.score_sequences(seqs), after, atol=1e-6)


def test_float32_and_bos_row():
    m = tiny()
    assert all(x.dtype == np.float32 for x in jax.tree.leaves(m.params))
    assert m.bos_id == 5 and m.module().embed.embedding.shape == (6, 32)


def test_bad_config_and_input():
    with pytest.raises(ValueError, match="divisible"):
        TransformerConfig(vocab_size=5, d_model=30, n_heads=4)
    with pytest.raises(ValueError, match="eos"):
        TransformerConfig(vocab_size=5, eos=5)
    with pytest.raises(TypeError, match="TransformerConfig"):
        TransformerLM({"vocab_size": 5})
    m = tiny()
    with pytest.raises(ValueError, match="tokens must lie"):
        m.score_sequences([(1, 9, 0)])
    # Longer than max_len: outside the support, -inf (issue 10 item 9); still range-checked.
    got = m.score_sequences([(1,) * 7, (1, 0)])
    assert got[0] == -np.inf and np.isfinite(got[1])
    with pytest.raises(ValueError, match="tokens must lie"):
        m.score_sequences([(1,) * 6 + (9,)])
    with pytest.raises(ValueError, match="max_len"):
        m.score_frontier([(1,) * 7], top_m=2)  # score_frontier keeps its contract: rows fit
    with pytest.raises(ValueError, match="skip"):
        m.score_sequences([(1, 0)], skip=[1, 2])
    with pytest.raises(TypeError, match="mesh"):
        m.with_mesh("cpu")
