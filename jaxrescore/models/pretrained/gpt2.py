"""The GPT-2 family (gpt2, distilgpt2, gpt2-medium/large/xl): config and tensors to a network.

Checkpoint layout (``GPT2LMHeadModel``): keys with or without the ``transformer.`` prefix,
``wte.weight [V, d]``, ``wpe.weight [P, d]``, per layer ``h.{i}.ln_1``, ``attn.c_attn`` (Conv1D:
weight ``[d, 3d]`` stored ``[in, out]``, queries then keys then values), ``attn.c_proj``,
``ln_2``, ``mlp.c_fc``, ``mlp.c_proj``, then ``ln_f``; the output head is ``wte`` (tied) unless
``tie_word_embeddings`` is false and ``lm_head.weight [V, d]`` is there. The causal-mask buffers
older files carry (``attn.bias``, ``attn.masked_bias``) are skipped.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from jaxrescore.models.pretrained.files import TensorTable, as_dtype
from jaxrescore.models.pretrained.network import DecoderSpec

ACTIVATIONS = ("gelu_new", "gelu")


def spec_of(config: dict, dtype: str) -> DecoderSpec:
    """The :class:`DecoderSpec` of a GPT-2 ``config.json`` (ValueError for what it cannot run)."""
    if config.get("scale_attn_by_inverse_layer_idx"):
        raise ValueError("config.json: scale_attn_by_inverse_layer_idx=true is not supported")
    if config.get("scale_attn_weights", True) is False:
        raise ValueError("config.json: scale_attn_weights=false is not supported")
    act = config.get("activation_function", "gelu_new")
    if act not in ACTIVATIONS:
        raise ValueError(f"config.json: activation_function={act!r}; supported: {ACTIVATIONS}")
    d, heads = int(config["n_embd"]), int(config["n_head"])
    return DecoderSpec(
        family="gpt2",
        vocab_size=int(config["vocab_size"]),
        d_model=d,
        n_layers=int(config["n_layer"]),
        n_heads=heads,
        n_kv_heads=heads,
        head_dim=d // heads,
        d_ff=int(config.get("n_inner") or 4 * d),
        max_positions=int(config.get("n_positions") or config["n_ctx"]),
        norm_eps=float(config.get("layer_norm_epsilon", 1e-5)),
        activation=act,
        tied=bool(config.get("tie_word_embeddings", True)),
        dtype=dtype,
    )


def params_of(spec: DecoderSpec, tensors: Mapping[str, np.ndarray], dtype) -> dict:
    """The network's weights dict (see :mod:`~jaxrescore.models.pretrained.network`) from the
    checkpoint's tensors, cast to ``dtype`` on the host."""
    table = TensorTable(tensors, "transformer.", ignored=r"(^|\.)attn\.(bias|masked_bias)$")
    d, f = spec.d_model, spec.d_ff
    cast = lambda x: as_dtype(x, dtype)  # noqa: E731

    def stack(name, shape, columns=None):
        keys = [f"h.{i}.{name}" for i in range(spec.n_layers)]
        return table.stack(keys, shape, dtype, columns=columns)

    # c_attn holds queries, then keys, then values: each read into its own array (slices of
    # one stacked array would keep the whole of it alive, or copy it once more)
    thirds = {"q": slice(0, d), "k": slice(d, 2 * d), "v": slice(2 * d, 3 * d)}
    layers = {
        "norm1_scale": stack("ln_1.weight", (d,)),
        "norm1_bias": stack("ln_1.bias", (d,)),
        "o": stack("attn.c_proj.weight", (d, d)),
        "o_b": stack("attn.c_proj.bias", (d,)),
        "norm2_scale": stack("ln_2.weight", (d,)),
        "norm2_bias": stack("ln_2.bias", (d,)),
        "up": stack("mlp.c_fc.weight", (d, f)),
        "up_b": stack("mlp.c_fc.bias", (f,)),
        "down": stack("mlp.c_proj.weight", (f, d)),
        "down_b": stack("mlp.c_proj.bias", (d,)),
    }
    for name, cols in thirds.items():
        layers[name] = stack("attn.c_attn.weight", (d, 3 * d), cols)
        layers[f"{name}_b"] = stack("attn.c_attn.bias", (3 * d,), cols)
    params = {
        "embed": cast(table.get("wte.weight", (spec.vocab_size, d))),
        "pos": cast(table.get("wpe.weight", (spec.max_positions, d))),
        "norm_f": {"scale": cast(table.get("ln_f.weight", (d,))), "bias": cast(table.get("ln_f.bias", (d,)))},
        "layers": layers,
    }
    head = table.output_head(spec.vocab_size, d, spec.tied)
    if head is not None:
        params["head"] = cast(head)
    table.check_used("GPT-2")
    return params
