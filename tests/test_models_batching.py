"""Issue 24: the minimum padded batch of a device call follows the model's size
(``padded_min_rows``), or ``min_rows`` when a user sets it."""

import jax.numpy as jnp
import numpy as np
import pytest

from jaxrescore.models import TransformerConfig, TransformerLM, from_apply_fn
from jaxrescore.models.batching import MAX_MIN_ROWS, PADDING_BYTES, padded_min_rows, param_bytes

MIB = 1 << 20


def test_rule_keeps_32_for_small_models_and_one_row_for_large():
    assert padded_min_rows(0) == padded_min_rows(4 * MIB) == MAX_MIN_ROWS == 32
    assert padded_min_rows(4 * MIB + 1) == 16
    assert padded_min_rows(16 * MIB) == 8
    assert padded_min_rows(64 * MIB) == 2
    assert padded_min_rows(64 * MIB + 1) == padded_min_rows(97 * MIB) == padded_min_rows(10_000 * MIB) == 1
    sizes = np.linspace(0, 200 * MIB, 401).astype(int)
    rows = [padded_min_rows(b) for b in sizes]
    assert all(r & (r - 1) == 0 for r in rows), "powers of two"
    assert rows == sorted(rows, reverse=True), "never more rows for more weights"
    assert all(r * b <= PADDING_BYTES for r, b in zip(rows, sizes) if r > 1)


def test_small_transformer_pads_to_32():
    cfg = TransformerConfig(vocab_size=8, d_model=32, n_layers=1, n_heads=2, max_len=6, eos=0)
    model = TransformerLM(cfg, seed=0)
    assert param_bytes(model.params) < 4 * MIB
    assert [model._rows_bucket(n) for n in (1, 8, 33)] == [32, 32, 64]


def _wide_model(weight_bytes: int):
    """A model whose weights hold ``weight_bytes`` (one big unused array plus a logits table)."""
    table = jnp.asarray(np.random.default_rng(0).normal(size=(5, 4)), jnp.float32)
    params = {"table": table, "ballast": jnp.zeros(weight_bytes // 4, jnp.float32)}

    def apply(p, tokens):
        return p["table"][tokens] + 0.0 * p["ballast"][0]

    return from_apply_fn(apply, params, vocab_size=4, bos_id=4, max_len=5, eos=3)


def test_large_model_pads_by_its_weights_and_scores_the_same():
    model = _wide_model(40 * MIB)  # 128 MiB / 40 MiB: 3 rows of padding budget -> 2
    assert [model._rows_bucket(n) for n in (1, 2, 3, 8)] == [2, 2, 4, 8]
    seqs = [(1, 3), (2, 2, 3), (0, 1, 2, 3)]
    lean = model.score_sequences(seqs)
    model.min_rows = 32  # the old rule: every call padded to 32 rows
    assert model._rows_bucket(1) == 32
    np.testing.assert_allclose(model.score_sequences(seqs), lean, atol=1e-6)


def test_min_rows_setting_overrides_the_rule_and_is_checked():
    model = _wide_model(40 * MIB)
    model.min_rows = 1
    assert model._rows_bucket(3) == 4
    model.min_rows = 0
    with pytest.raises(ValueError, match="min_rows"):
        model.score_sequences([(1, 3)])


def test_rule_follows_new_weights():
    model = _wide_model(40 * MIB)
    assert model._rows_bucket(1) == 2
    model.params = {"table": model.params["table"], "ballast": jnp.zeros(1, jnp.float32)}
    assert model._rows_bucket(1) == 32
