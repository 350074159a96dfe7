"""Rotary settings of Llama-family configs: transformers 5's ``rope_parameters`` (no top-level
``rope_theta``) and 4.x's keys, every supported type against numbers from transformers itself,
and a refusal for what the forward would not compute."""

import functools

import numpy as np
import pytest

pytest.importorskip("safetensors")
tokenizers = pytest.importorskip("tokenizers")

from jaxrescore.models import from_pretrained  # noqa: E402
from jaxrescore.models.pretrained.rope import attention_factor, inverse_frequencies, rope_settings  # noqa: E402
from test_models_pretrained import (  # noqa: E402
    _check_against,
    _llama_config,
    _llama_tensors,
    _llama_tokenizer,
    _sequences,
    llama_reference,
    write_checkpoint,
)

# transformers 5.25's ROPE_INIT_FUNCTIONS on LlamaConfig(hidden_size=32, num_attention_heads=4,
# head_dim=16, max_position_embeddings=128, rope_parameters=...): (inv_freq, attention_factor).
TRANSFORMERS = {
    "yarn": (
        {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0, "original_max_position_embeddings": 64},
        [1.0, 0.11114246398210526, 0.007905694656074047, 0.0014058533124625683, 0.0002500000118743628,
         4.4456985051510856e-05, 7.905693564680405e-06, 1.405853367941745e-06],
        1.138629436111989,
    ),
    "yarn_mscale": (
        {"rope_type": "yarn", "rope_theta": 1e4, "factor": 8.0, "original_max_position_embeddings": 32,
         "beta_fast": 16, "beta_slow": 2, "mscale": 0.707, "mscale_all_dim": 1.0, "truncate": False},
        [1.0, 0.03952847048640251, 0.012500000186264515, 0.0039528473280370235, 0.0012499999720603228,
         0.00039528473280370235, 0.0001250000059371814, 3.9528473280370235e-05],
        0.9495608824621653,
    ),
    "linear": (
        {"rope_type": "linear", "rope_theta": 5e5, "factor": 2.0},
        [0.5, 0.0969613790512085, 0.01880301535129547, 0.00364633253775537, 0.000707106722984463,
         0.00013712409418076277, 2.6591478672344238e-05, 5.156692623131676e-06],
        1.0,
    ),
    "llama3": (
        {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0,
         "high_freq_factor": 4.0, "original_max_position_embeddings": 256},
        [1.0, 0.193922758102417, 0.010538230650126934, 0.0009115831344388425, 0.00017677668074611574,
         3.428102354519069e-05, 6.647869668086059e-06, 1.289173155782919e-06],
        1.0,
    ),
    "dynamic": (  # inside max_position_embeddings dynamic NTK is the default frequencies
        {"rope_type": "dynamic", "rope_theta": 5e5, "factor": 2.0},
        [1.0, 0.193922758102417, 0.03760603070259094, 0.00729266507551074, 0.001414213445968926,
         0.00027424818836152554, 5.3182957344688475e-05, 1.0313385246263351e-05],
        1.0,
    ),
}


@pytest.mark.parametrize("name", sorted(TRANSFORMERS))
def test_frequencies_equal_transformers(name):
    params, inv_freq, factor = TRANSFORMERS[name]
    config = {"max_position_embeddings": 128, "rope_parameters": dict(params)}
    theta, scaling = rope_settings(config)
    assert theta == params["rope_theta"]
    np.testing.assert_allclose(inverse_frequencies(theta, 16, scaling), inv_freq, rtol=2e-7, atol=0)
    assert attention_factor(scaling) == pytest.approx(factor, rel=1e-12)
    # 4.x spelling of the same settings: theta at the top level, the rest in rope_scaling
    old = {"max_position_embeddings": 128, "rope_theta": params["rope_theta"],
           "rope_scaling": {k: v for k, v in params.items() if k != "rope_theta"}}
    assert rope_settings(old) == (theta, scaling)


def _v5(cfg: dict, rope_parameters: dict) -> dict:
    """A config as transformers 5 writes it: no rope_theta / rope_scaling at the top level."""
    out = {k: v for k, v in cfg.items() if k not in ("rope_theta", "rope_scaling")}
    return dict(out, rope_parameters=rope_parameters, transformers_version="5.25.0")


@pytest.mark.parametrize("kind", ["default", "llama3", "yarn"])
def test_v5_configs_compute_the_checkpoints_numbers(tmp_path, kind):
    """theta 5e5 (default), Llama 3.1 scaling and YaRN read from rope_parameters alone: every
    position's log-probs equal a numpy forward with the same frequencies (read from the config
    here, from transformers' numbers for YaRN, whose cos and sin carry its attention factor)."""
    base = _llama_config(2, tied=False)
    if kind == "default":
        params, reference = {"rope_theta": 500000.0, "rope_type": "default"}, llama_reference
    elif kind == "llama3":
        params, reference = dict(TRANSFORMERS["llama3"][0]), llama_reference
    else:
        params, inv, factor = TRANSFORMERS["yarn"]
        base = dict(base, head_dim=16, num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128)
        reference = functools.partial(llama_reference, inv=np.array(inv), scale=factor)
    cfg = _v5(base, dict(params))
    tensors = _llama_tensors(cfg, seed=11)
    model = from_pretrained(write_checkpoint(tmp_path / kind, cfg, tensors, _llama_tokenizer()), max_len=8)
    assert model.spec.rope_theta == params["rope_theta"]
    seqs = _sequences(np.random.default_rng(12), 18, 2, 8, 8, low=3)
    _check_against(model, reference, tensors, cfg, seqs, 1)
    # the cached path (rows from held parents) computes the same rotary positions
    rows = model.with_prompt([3, 4, 5]).next_logprobs(np.array([[6, 7, 8]], np.int32), np.array([3], np.int32))
    np.testing.assert_allclose(rows[0], reference(tensors, cfg, (1, 3, 4, 5, 6, 7, 8))[-1], atol=2e-4, rtol=0)


@pytest.mark.parametrize(
    "change, match",
    [
        ({"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4, "factor": 2.0}}, "longrope"),
        ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0, "low_freq_factor": 1.0,
                              "high_freq_factor": 4.0, "original_max_position_embeddings": 8, "foo": 1}},
         r"\['foo'\]"),
        ({"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e4},
                              "sliding_attention": {"rope_type": "default", "rope_theta": 1e6}}}, "per-layer"),
        ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}},
         "partial_rotary_factor"),
        ({"rope_theta": 1e4, "rope_parameters": {"rope_type": "default", "rope_theta": 5e5}}, "disagree"),
        ({"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4}}, r"needs \['factor'\]"),
        ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4},
          "rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "disagree"),
    ],
)
def test_settings_the_forward_would_ignore_are_refused(tmp_path, change, match):
    cfg = dict(_v5(_llama_config(1, tied=True), {}), **change)
    path = write_checkpoint(tmp_path / "bad", cfg, _llama_tensors(cfg, seed=3), _llama_tokenizer())
    with pytest.raises(ValueError, match=match):
        from_pretrained(path)


def test_no_rotary_keys_at_all_is_theta_ten_thousand():
    assert rope_settings({"max_position_embeddings": 8}) == (10000.0, None)
    assert rope_settings({"rope_parameters": {"rope_type": "default"}, "rope_theta": 5e5}) == (5e5, None)
