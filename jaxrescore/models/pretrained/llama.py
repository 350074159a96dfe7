"""The Llama family (Llama 2/3, TinyLlama, SmolLM, Mistral, Qwen2/2.5): config and tensors to a
network.

Checkpoint layout (``LlamaForCausalLM`` and its kin): keys with or without the ``model.`` prefix,
``embed_tokens.weight [V, d]``, per layer ``layers.{i}.input_layernorm``,
``self_attn.{q,k,v,o}_proj`` (torch Linear weights ``[out, in]``, transposed here; k/v have
``num_key_value_heads * head_dim`` rows; optional biases, as Qwen2 has on q/k/v),
``post_attention_layernorm``, ``mlp.{gate,up,down}_proj``, then ``norm``; ``lm_head.weight
[V, d]`` unless ``tie_word_embeddings``. ``rotary_emb.inv_freq`` buffers are skipped (the
frequencies come from the config: ``rope_parameters`` as transformers 5 writes it, or 4.x's
``rope_theta`` and ``rope_scaling``; see :mod:`~jaxrescore.models.pretrained.rope`).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from jaxrescore.models.pretrained.files import TensorTable, as_dtype
from jaxrescore.models.pretrained.network import DecoderSpec
from jaxrescore.models.pretrained.rope import rope_settings


def spec_of(config: dict, dtype: str) -> DecoderSpec:
    """The :class:`DecoderSpec` of a Llama-family ``config.json`` (ValueError for what it cannot
    run)."""
    act = config.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"config.json: hidden_act={act!r}; the Llama family runs 'silu' (SwiGLU)")
    theta, scaling = rope_settings(config)
    d, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
    kv = int(config.get("num_key_value_heads") or heads)
    if heads % kv:
        raise ValueError(
            f"config.json: num_attention_heads={heads} must be a multiple of num_key_value_heads={kv}"
        )
    return DecoderSpec(
        family="llama",
        vocab_size=int(config["vocab_size"]),
        d_model=d,
        n_layers=int(config["num_hidden_layers"]),
        n_heads=heads,
        n_kv_heads=kv,
        head_dim=int(config.get("head_dim") or d // heads),
        d_ff=int(config["intermediate_size"]),
        max_positions=int(config["max_position_embeddings"]),
        norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        activation="silu",
        rope_theta=theta,
        rope_scaling=scaling,
        tied=bool(config.get("tie_word_embeddings", False)),
        dtype=dtype,
    )


def params_of(spec: DecoderSpec, tensors: Mapping[str, np.ndarray], dtype) -> dict:
    """The network's weights dict (see :mod:`~jaxrescore.models.pretrained.network`) from the
    checkpoint's tensors, cast to ``dtype`` on the host."""
    table = TensorTable(tensors, "model.", ignored=r"rotary_emb\.inv_freq$")
    d, f, n = spec.d_model, spec.d_ff, spec.n_layers
    q_out, kv_out = spec.n_heads * spec.head_dim, spec.n_kv_heads * spec.head_dim
    cast = lambda x: as_dtype(x, dtype)  # noqa: E731

    def stack(name, shape, transpose=True):
        return table.stack([f"layers.{i}.{name}" for i in range(n)], shape, dtype, transpose=transpose)

    linears = {
        "q": ("self_attn.q_proj", q_out, d), "k": ("self_attn.k_proj", kv_out, d),
        "v": ("self_attn.v_proj", kv_out, d), "o": ("self_attn.o_proj", d, q_out),
        "gate": ("mlp.gate_proj", f, d), "up": ("mlp.up_proj", f, d), "down": ("mlp.down_proj", d, f),
    }
    layers = {
        "norm1_scale": stack("input_layernorm.weight", (d,), False),
        "norm2_scale": stack("post_attention_layernorm.weight", (d,), False),
    }
    for short, (name, out, inp) in linears.items():
        layers[short] = stack(f"{name}.weight", (out, inp))
        if f"layers.0.{name}.bias" in table:  # Qwen2's q/k/v biases, attention_bias, mlp_bias
            layers[f"{short}_b"] = stack(f"{name}.bias", (out,), False)
    params = {
        "embed": cast(table.get("embed_tokens.weight", (spec.vocab_size, d))),
        "norm_f": {"scale": cast(table.get("norm.weight", (d,)))},
        "layers": layers,
    }
    head = table.output_head(spec.vocab_size, d, spec.tied)
    if head is not None:
        params["head"] = cast(head)
    table.check_used("Llama-family")
    return params
