"""dtypes: bfloat16 transformers (compute and weights), tolerances that follow the compute dtype,
bfloat16 rows from callables and duck-typed models, and NaN rows refused by the JAX models."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrescore import RescoredIndex, SeekIndex
from jaxrescore.models import CallableModel, NGramLM, from_apply_fn, load_model, save_model
from jaxrescore.models.transformer import TransformerConfig, TransformerLM
from model_checks import check_protocol


def bf16(**kw):
    cfg = dict(vocab_size=4, d_model=32, n_layers=1, n_heads=2, max_len=4, eos=0,
               dtype="bfloat16", param_dtype=jnp.bfloat16)
    cfg.update(kw)
    return TransformerLM(TransformerConfig(**cfg), seed=0)


def test_config_dtypes_are_checked_and_named():
    c = TransformerConfig(vocab_size=4, dtype=jnp.bfloat16, param_dtype=np.float16)
    assert (c.dtype, c.param_dtype) == ("bfloat16", "float16") and c.to_dict()["dtype"] == "bfloat16"
    assert TransformerConfig(vocab_size=4).dtype == "float32"
    for bad in ("float64", "int8", "nonsense", 3):
        with pytest.raises(ValueError, match="dtype"):
            TransformerConfig(vocab_size=4, dtype=bad)


def test_bfloat16_transformer(tmp_path):
    m = bf16()
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(m.params))
    assert m.score_tolerance == 0.1
    assert TransformerLM(TransformerConfig(vocab_size=4)).score_tolerance == 1e-3
    seqs = [(1, 2, 0), (3, 0), (1, 1, 1, 0), (2, 0), (0,)]
    check_protocol(m, seqs, atol=0.1)
    rows = m.next_logprobs(np.array([[1, 2]], np.int32), [2])
    assert rows.dtype == np.float32
    save_model(m, tmp_path / "m.npz")
    back = load_model(tmp_path / "m.npz")
    assert back.config.dtype == "bfloat16"
    np.testing.assert_array_equal(back.score_sequences(seqs), m.score_sequences(seqs))
    # weights in float32, compute in bfloat16
    mixed = bf16(param_dtype="float32")
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(mixed.params))
    assert mixed.score_tolerance == 0.1


def test_proof_over_a_bfloat16_target_holds_within_its_tolerance():
    target = bf16(vocab_size=3, max_len=4, d_model=16)
    target.params = jax.tree.map(lambda x: x * 3 if x.ndim == 2 else x, target.params)
    support = [s + (0,) for n in range(4) for s in itertools.product((1, 2), repeat=n)]
    truth = np.sort(target.score_sequences(support))[::-1]
    draft = NGramLM.fit(support, order=2, vocab_size=3, eos=0, max_len=4)
    for k in (1, 3, 6):
        res = RescoredIndex(SeekIndex(draft), target, rerank_window=2).top_k(k, prove=True)
        assert res.proven
        got = np.array([lp for _, lp in res.items])
        # the exact top-k up to the target's own noise (its score_tolerance)
        assert got.min() >= truth[k - 1] - 2 * target.score_tolerance


def table_fn(dtype):
    rng = np.random.default_rng(0)
    table = jax.nn.log_softmax(jnp.asarray(rng.normal(size=(6, 3)), jnp.float32)).astype(dtype)

    def fn(prefixes, lengths):
        last = np.where(lengths > 0, np.asarray(prefixes)[np.arange(len(lengths)), np.maximum(lengths - 1, 0)], 0)
        return table[last + 3 * (lengths > 0)]

    return fn


def test_callable_and_duck_models_accept_bfloat16_rows():
    m = CallableModel(table_fn(jnp.bfloat16), vocab_size=3, max_len=3, eos=0, batched=True)
    assert m.score_tolerance == 1e-3
    rows = m.next_logprobs(np.array([[1, 2]], np.int32), [2])
    assert rows.dtype == np.float32 and m.score_tolerance == 0.1  # 16-bit rows were seen
    assert len(SeekIndex(m, progress=False)) > 0

    class Duck:
        vocab_size, eos, max_len = 3, 0, 3
        next_logprobs = staticmethod(table_fn(jnp.bfloat16))

    assert len(SeekIndex(Duck(), progress=False)) > 0
    with pytest.raises(ValueError, match="dtype"):
        CallableModel(lambda p, n: np.zeros((len(n), 3), np.int32), vocab_size=3, max_len=3, batched=True).next_logprobs(
            np.zeros((1, 1), np.int32), [0])


def test_jax_models_refuse_nan_rows():
    def apply(p, t):
        x = p[t]
        return jnp.where(t[..., None] == 2, jnp.inf, x)  # +inf logits after token 2: NaN rows

    m = from_apply_fn(apply, jnp.zeros((5, 4)), vocab_size=4, bos_id=4, max_len=5, eos=0)
    np.testing.assert_allclose(m.score_sequences([(1, 0), (3, 1, 0)]), [2 * np.log(0.25), 3 * np.log(0.25)])
    with pytest.raises(ValueError, match="NaN log-probs at sequence 0, position 1"):
        m.score_sequences([(2, 1, 0)])
    with pytest.raises(ValueError, match="NaN"):
        m.next_logprobs(np.array([[1, 2]], np.int32), [2])
    with pytest.raises(ValueError, match="NaN"):
        m.score_frontier([(1, 2, 1, 0)], top_m=2)
    with pytest.raises(ValueError, match="NaN"):
        m.with_prompt([2]).next_logprobs(np.zeros((1, 1), np.int32), [0])
