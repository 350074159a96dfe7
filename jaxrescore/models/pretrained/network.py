"""The decoder-only network of pretrained checkpoints, as pure JAX functions over a weights dict.

One pre-norm block serves both families; :class:`DecoderSpec` (hashable, static under ``jit``)
says which pieces it uses:

- GPT-2: learned positions added to the token embedding, LayerNorm (scale and bias), attention
  and MLP with biases, GELU MLP (``"gelu_new"``: the tanh form GPT-2 uses, or exact ``"gelu"``);
- Llama family: rotary positions on queries and keys (``rope_theta``; the ``rotate_half`` layout
  of Hugging Face checkpoints; ``linear``/``llama3``/``yarn`` scaling, see :mod:`.rope`), RMSNorm (scale
  only, ``eps`` inside the square root), SwiGLU MLP (``down(silu(gate(x)) * up(x))``), grouped
  key/value heads (``n_kv_heads`` divides ``n_heads``), optional biases (Qwen2's q/k/v).

Weights (see ``gpt2.py`` and ``llama.py`` for how checkpoint tensors map to them), every matrix
stored ``[in, out]`` so a layer is ``x @ w``, per-layer weights stacked on a leading ``L`` axis
(one ``lax.scan`` over layers: a 32-layer model compiles like a 1-layer one)::

    embed  float[V, d]            pos  float[P, d] (GPT-2 only)      head float[d, V] (untied only)
    norm_f {scale[d], bias[d]?}
    layers {norm1_scale[L, d], norm1_bias[L, d]?, norm2_scale, norm2_bias?,
            q[L, d, H*Dh], k[L, d, Hkv*Dh], v[L, d, Hkv*Dh], o[L, H*Dh, d], q_b?, k_b?, v_b?, o_b?,
            GPT-2: up[L, d, F], up_b?, down[L, F, d], down_b?;  Llama: gate, up [L, d, F], down}

Precision: weights and activations in the spec's compute ``dtype``; norms, attention logits and
softmax in float32 (as Hugging Face computes them), so a float32 model matches a float64 reference
to float32 noise and a bfloat16 model's attention does not drift with the context length.

Caches (see :mod:`jaxrescore.models.decoding`): a SHARED context ``{"k", "v": float[L, C, Hkv,
Dh]}`` (BOS and a prompt, positions ``< ctx_len``) and per-row caches ``{"k", "v": float[B, L,
S, Hkv, Dh]}`` covering each row's own positions only; keys are stored after the rotation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import jax
import jax.numpy as jnp
from jaxrescore.models.pretrained import rope as rotary

FAMILIES = ("gpt2", "llama")


@dataclass(frozen=True)
class DecoderSpec:
    """The static shape and kind of a pretrained decoder (hashable: a ``jit`` static argument).

    Attributes:
      family: ``"gpt2"`` or ``"llama"`` (see the module docstring).
      vocab_size: V, the embedding and output rows.
      d_model, n_layers, n_heads, n_kv_heads, head_dim: widths (``n_heads % n_kv_heads == 0``).
      d_ff: the MLP's hidden width.
      max_positions: the checkpoint's context length (GPT-2's position table size).
      norm_eps: the LayerNorm / RMSNorm epsilon.
      activation: ``"gelu_new"``, ``"gelu"`` (GPT-2) or ``"silu"`` (Llama's SwiGLU).
      rope_theta: the rotary base (Llama family; None for GPT-2).
      rope_scaling: None, or a sorted tuple of ``(key, value)`` pairs with every number the
        frequencies need (``rope_type`` ``"linear"``, ``"llama3"`` or ``"yarn"``; see
        :mod:`~jaxrescore.models.pretrained.rope`).
      tied: whether the output head is the embedding table (``x @ embed.T``).
      dtype: the compute dtype's name (``"float32"``, ``"bfloat16"``, ``"float16"``).
    """

    family: str
    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_ff: int
    max_positions: int
    norm_eps: float
    activation: str
    rope_theta: float | None = None
    rope_scaling: tuple | None = None
    tied: bool = True
    dtype: str = "float32"

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise ValueError(f"DecoderSpec.family must be one of {FAMILIES}, got {self.family!r}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"n_heads={self.n_heads} must be a multiple of n_kv_heads={self.n_kv_heads} (grouped heads)"
            )


# ---- pieces ----------------------------------------------------------------------------------


def _norm(spec: DecoderSpec, x, scale, bias):
    """LayerNorm (GPT-2) or RMSNorm (Llama) over the last axis, in float32, back to x's dtype."""
    h = x.astype(jnp.float32)
    if spec.family == "gpt2":
        h = h - h.mean(-1, keepdims=True)
    h = h * jax.lax.rsqrt(jnp.mean(h * h, -1, keepdims=True) + spec.norm_eps)
    h = h * scale.astype(jnp.float32)
    if bias is not None:
        h = h + bias.astype(jnp.float32)
    return h.astype(x.dtype)


def _dense(x, w, b=None):
    y = jnp.einsum("...i,io->...o", x, w.astype(x.dtype))
    return y if b is None else y + b.astype(y.dtype)


def _act(name: str, x):
    if name == "gelu_new":
        return jax.nn.gelu(x, approximate=True)
    if name == "gelu":
        return jax.nn.gelu(x, approximate=False)
    return jax.nn.silu(x)


def _mlp(spec: DecoderSpec, p, x):
    if spec.family == "gpt2":
        return _dense(_act(spec.activation, _dense(x, p["up"], p.get("up_b"))), p["down"], p.get("down_b"))
    gate = _act(spec.activation, _dense(x, p["gate"], p.get("gate_b")))
    return _dense(gate * _dense(x, p["up"], p.get("up_b")), p["down"], p.get("down_b"))


def _rope(spec: DecoderSpec, positions):
    """``(cos, sin)`` float32[..., 1, Dh] at integer ``positions[...]`` (the head axis broadcast),
    times the scaling's attention factor (YaRN's; 1 otherwise) as transformers applies it."""
    inv = jnp.asarray(rotary.inverse_frequencies(spec.rope_theta, spec.head_dim, spec.rope_scaling), jnp.float32)
    angles = positions.astype(jnp.float32)[..., None] * inv
    angles = jnp.concatenate([angles, angles], axis=-1)[..., None, :]
    factor = rotary.attention_factor(spec.rope_scaling)
    return jnp.cos(angles) * factor, jnp.sin(angles) * factor


def _rotate(x, cos, sin):
    """Rotary embedding of ``x[..., H, Dh]`` in the ``rotate_half`` layout, computed in float32."""
    h = x.astype(jnp.float32)
    half = h.shape[-1] // 2
    rotated = jnp.concatenate([-h[..., half:], h[..., :half]], axis=-1)
    return (h * cos + rotated * sin).astype(x.dtype)


def _project(spec: DecoderSpec, p, x, rope):
    """Queries float[B, W, Hkv, G, Dh], keys and values float[B, W, Hkv, Dh] of ``x[B, W, d]``."""
    b, w, _ = x.shape
    q = _dense(x, p["q"], p.get("q_b")).reshape(b, w, spec.n_heads, spec.head_dim)
    k = _dense(x, p["k"], p.get("k_b")).reshape(b, w, spec.n_kv_heads, spec.head_dim)
    v = _dense(x, p["v"], p.get("v_b")).reshape(b, w, spec.n_kv_heads, spec.head_dim)
    if rope is not None:
        q, k = _rotate(q, *rope), _rotate(k, *rope)
    q = q.reshape(b, w, spec.n_kv_heads, spec.n_heads // spec.n_kv_heads, spec.head_dim)
    return q, k, v


def _scores(q, k):
    """float32 attention logits: ``q[B, W, Hkv, G, Dh]`` against ``k[B, S, Hkv, Dh]`` ->
    ``[B, Hkv, G, W, S]`` (scaled by 1/sqrt(Dh))."""
    s = jnp.einsum("bwkgd,bskd->bkgws", q, k, preferred_element_type=jnp.float32)
    return s / math.sqrt(q.shape[-1])


def _mix(att, v):
    """``att[B, Hkv, G, W, S]`` times ``v[B, S, Hkv, Dh]`` -> float32[B, W, Hkv, G, Dh]."""
    return jnp.einsum("bkgws,bskd->bwkgd", att, v.astype(jnp.float32))


def _block(spec: DecoderSpec, p, x, attend):
    """One pre-norm block; ``attend(q, k, v) -> float32[B, W, Hkv, G, Dh]`` is the attention."""
    b, w, _ = x.shape
    y = attend(_norm(spec, x, p["norm1_scale"], p.get("norm1_bias")))
    y = y.astype(x.dtype).reshape(b, w, spec.n_heads * spec.head_dim)
    x = x + _dense(y, p["o"], p.get("o_b"))
    return x + _mlp(spec, p, _norm(spec, x, p["norm2_scale"], p.get("norm2_bias")))


def _embed(spec: DecoderSpec, params, tokens, positions):
    dtype = jnp.dtype(spec.dtype)
    x = jnp.take(params["embed"], tokens, axis=0).astype(dtype)
    if spec.family == "gpt2":  # positions past the table exist only for padding: clip, never NaN
        x = x + jnp.take(params["pos"], positions, axis=0, mode="clip").astype(dtype)
    return x


def _head(spec: DecoderSpec, params, x):
    x = _norm(spec, x, params["norm_f"]["scale"], params["norm_f"].get("bias"))
    if spec.tied:
        return jnp.einsum("...d,vd->...v", x, params["embed"].astype(x.dtype))
    return _dense(x, params["head"])


# ---- the two forwards ------------------------------------------------------------------------


def forward(spec: DecoderSpec, params, tokens, positions=None, visible=None, keep: bool = False):
    """Teacher forcing: ``tokens int32[B, T]`` (BOS first) -> logits ``[B, T, V]`` (compute dtype).

    ``positions`` (int32[B, T]) and ``visible`` (bool[B, T, T]), both or neither, pack a tree of
    rows into each row of ``tokens`` (see :mod:`jaxrescore.models.packed`): token
    ``t`` sits at ``positions[b, t]`` and attends to the tokens ``visible[b, t]`` (its context
    and ancestors, and itself). Each packed token's logits are then those of a forward of its
    own path on its own. ``keep``: return ``(logits, (keys, values))`` too, each
    ``float[L, B, T, Hkv, Dh]`` (a packed forward's row caches).
    """
    t = tokens.shape[1]
    if positions is None:
        positions = jnp.broadcast_to(jnp.arange(t), tokens.shape)
    rope = _rope(spec, positions) if spec.family == "llama" else None
    causal = jnp.tril(jnp.ones((t, t), bool))
    if visible is not None:  # [B, 1, 1, T, T]: broadcast over the heads of the scores
        causal = (causal & visible)[:, None, None]

    def layer(x, p):
        held = {}

        def attend(h):
            q, k, v = _project(spec, p, h, rope)
            held["kv"] = (k, v) if keep else None
            s = jnp.where(causal, _scores(q, k), -jnp.inf)
            return _mix(jax.nn.softmax(s, axis=-1), v)

        return _block(spec, p, x, attend), held["kv"]

    x, kv = jax.lax.scan(layer, _embed(spec, params, tokens, positions), params["layers"])
    return (_head(spec, params, x), kv) if keep else _head(spec, params, x)


def decode(spec: DecoderSpec, params, tokens, start, last, ctx, ctx_len, cache, s_out):
    """Incremental forward (the ``Decoder.fn`` contract of :mod:`jaxrescore.models.decoding`).

    Args:
      tokens: int32[B, W], row ``b``'s new tokens at row positions ``start[b] + w``, i.e. at
        absolute positions ``ctx_len + start[b] + w`` (padding tokens past a row's end only write
        cache positions that later writes overwrite and masks hide).
      start: int32[B], positions already in each row's cache. last: int32[B], which new
        position's logits to return, or int32[B, L]: several (teacher forcing).
      ctx: ``{"k", "v": float[L, C, Hkv, Dh]}``, the shared context, positions ``< ctx_len`` valid.
      cache: ``{"k", "v": float[B, L, S, Hkv, Dh]}`` (padded to ``s_out`` positions), or None:
        fresh rows of ``s_out`` positions.

    Returns:
      logits[B, V] at new position ``last[b]`` (``[B, L, V]`` at ``last[b, l]`` for a 2-D
      ``last``) and the row cache with the new keys and values.
    """
    b, w = tokens.shape
    if cache is None:
        shape = (b, spec.n_layers, s_out) + ctx["k"].shape[2:]
        cache = {"k": jnp.zeros(shape, ctx["k"].dtype), "v": jnp.zeros(shape, ctx["v"].dtype)}
    else:
        pad = ((0, 0), (0, 0), (0, s_out - cache["k"].shape[2]), (0, 0), (0, 0))
        cache = {n: jnp.pad(c, pad) for n, c in cache.items()}
    rel = start[:, None] + jnp.arange(w)[None, :]  # row positions of the new tokens
    positions = ctx_len + rel
    rope = _rope(spec, positions) if spec.family == "llama" else None
    ctx_ok = (jnp.arange(ctx["k"].shape[1]) < ctx_len)[None, None, None, None, :]
    row_ok = (jnp.arange(s_out)[None, None, :] <= rel[:, :, None])[:, None, None]  # causal, own row
    write = jax.vmap(lambda c, u, s: jax.lax.dynamic_update_slice(c, u.astype(c.dtype), (s, 0, 0)))

    def layer(x, xs):
        p, ck, cv, rk, rv = xs
        held = {}

        def attend(h):
            q, k, v = _project(spec, p, h, rope)
            held["k"], held["v"] = write(rk, k, start), write(rv, v, start)
            shared = jnp.einsum("bwkgd,skd->bkgws", q, ck, preferred_element_type=jnp.float32)
            a_ctx = jnp.where(ctx_ok, shared / math.sqrt(spec.head_dim), -jnp.inf)
            a_row = jnp.where(row_ok, _scores(q, held["k"]), -jnp.inf)
            att = jax.nn.softmax(jnp.concatenate([a_ctx, a_row], axis=-1), axis=-1)
            c = ck.shape[0]
            return jnp.einsum("bkgws,skd->bwkgd", att[..., :c], cv.astype(jnp.float32)) + _mix(
                att[..., c:], held["v"]
            )

        x = _block(spec, p, x, attend)
        return x, (held["k"], held["v"])

    rows = (jnp.swapaxes(cache["k"], 0, 1), jnp.swapaxes(cache["v"], 0, 1))
    xs = (params["layers"], ctx["k"], ctx["v"]) + rows
    x, (rk, rv) = jax.lax.scan(layer, _embed(spec, params, tokens, positions), xs)
    every = last.ndim == 2  # teacher forcing: the logits of several new positions per row
    x = jnp.take_along_axis(x, (last if every else last[:, None])[..., None], axis=1)
    logits = _head(spec, params, x)
    return (logits if every else logits[:, 0]), {"k": jnp.swapaxes(rk, 0, 1), "v": jnp.swapaxes(rv, 0, 1)}


def empty_context(spec: DecoderSpec) -> dict:
    """The context cache before any token: one masked position per layer."""
    z = jnp.zeros((spec.n_layers, 1, spec.n_kv_heads, spec.head_dim), jnp.dtype(spec.dtype))
    return {"k": z, "v": z}


@dataclass(frozen=True)
class NetworkApply:
    """Hashable ``apply(params, tokens) -> logits`` of a spec (a ``JaxLM.apply``); ``prepare``
    maps the stored weights to the network's (the int8 twin dequantises)."""

    spec: DecoderSpec
    prepare: Callable | None = None

    def __call__(self, params, tokens):
        return forward(self.spec, params if self.prepare is None else self.prepare(params), tokens)


@dataclass(frozen=True)
class NetworkDecode:
    """Hashable incremental forward of a spec (a ``Decoder.fn``; see :func:`decode`)."""

    spec: DecoderSpec
    prepare: Callable | None = None

    def __call__(self, params, tokens, start, last, ctx, ctx_len, cache, s_out):
        params = params if self.prepare is None else self.prepare(params)
        return decode(self.spec, params, tokens, start, last, ctx, ctx_len, cache, s_out)


@dataclass(frozen=True)
class NetworkPacked:
    """Hashable packed teacher forcing of a spec: ``(params, tokens[1, P], positions,
    visible[, paths]) -> logits`` (see :func:`forward`); given ``paths int32[R, S]`` (packed
    indices), also the row caches of :func:`decode` (``{"k", "v": float[R, L, S, Hkv, Dh]}``)
    whose position ``j`` holds packed token ``paths[r, j]``'s."""

    spec: DecoderSpec
    prepare: Callable | None = None

    def __call__(self, params, tokens, positions, visible, paths=None):
        params = params if self.prepare is None else self.prepare(params)
        if paths is None:
            return forward(self.spec, params, tokens, positions, visible)
        logits, (k, v) = forward(self.spec, params, tokens, positions, visible, keep=True)
        rows = lambda x: jnp.swapaxes(jnp.take(x[:, 0], paths, axis=1), 0, 1)  # noqa: E731
        return logits, {"k": rows(k), "v": rows(v)}
