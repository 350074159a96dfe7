"""TransformerLM: a flax nnx decoder-only transformer implementing the enumeration protocol.

BOS is an extra embedding row (id ``vocab_size``), so the output vocabulary stays ``V`` and BOS is
never predicted. The nnx module is split ONCE into a (hashable) graph definition and a weights
state; forwards are the plain ``jax.jit`` functions of :mod:`jaxrescore.models.jax_lm` with the
state as an argument, so replacing ``model.params`` (training, distillation) is immediately seen.
Everything is float32 unless the config says otherwise (``dtype``, ``param_dtype``: bfloat16 or
float16 compute or weights); rows and scores leave the device as float32 either way.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from flax import nnx

from jaxrescore._checks import check_choice, check_float, check_int
from jaxrescore.models.decoding import Decoder
from jaxrescore.models.scores import BFLOAT16_TOLERANCE, FLOAT32_TOLERANCE
from jaxrescore.models.jax_lm import JaxLM
from jaxrescore.models.packed import PackedFrontier


@dataclass(frozen=True)
class TransformerConfig:
    """Shape of a :class:`TransformerLM`.

    Attributes:
      vocab_size: V, output token ids ``0..V-1`` (BOS gets embedding row ``V``).
      d_model, n_layers, n_heads: width, depth and attention heads (``d_model % n_heads == 0``).
      d_ff: MLP hidden width (default ``4 * d_model``).
      max_len: the longest sequence in the support, EOS included (= the position table size).
      eos: end-of-sequence id, or None for fixed-length sequences of exactly ``max_len`` tokens.
      dropout: dropout rate used only by training (scoring is deterministic).
      positions: ``"learned"`` or ``"sinusoidal"``.
      dtype: the compute dtype, ``"float32"`` (default), ``"bfloat16"`` or ``"float16"`` (any
        spelling ``jnp.dtype`` reads; stored as its name). Attention softmaxes and the output
        log-softmax always run in float32. A 16-bit compute dtype makes the model's
        ``score_tolerance`` 0.1 nats (see :mod:`jaxrescore.models.scores`).
      param_dtype: the weights' dtype (same choices; default ``"float32"``).
    """

    vocab_size: int
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int | None = None
    max_len: int = 16
    eos: int | None = None
    dropout: float = 0.0
    positions: str = "learned"
    dtype: str = "float32"
    param_dtype: str = "float32"

    def __post_init__(self):
        for name in ("dtype", "param_dtype"):
            object.__setattr__(self, name, _float_dtype_name(getattr(self, name), f"TransformerConfig.{name}"))
        # bools are ints to Python, floats like 2.7 would be cut: refuse both (check_int).
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "max_len"):
            check_int(getattr(self, name), f"TransformerConfig.{name}", minimum=1)
        if self.d_model % self.n_heads:
            raise ValueError(
                f"TransformerConfig.d_model={self.d_model} must be divisible by n_heads={self.n_heads}"
            )
        check_int(self.d_ff, "TransformerConfig.d_ff", minimum=1, allow_none=True)
        check_int(self.eos, "TransformerConfig.eos", minimum=0, maximum=self.vocab_size, allow_none=True)
        # 1 would drop every activation in training
        if check_float(self.dropout, "TransformerConfig.dropout", minimum=0.0, maximum=1.0) == 1.0:
            raise ValueError("TransformerConfig.dropout must be a number in [0, 1), got 1.0")
        check_choice(self.positions, "TransformerConfig.positions", ("learned", "sinusoidal"))

    @property
    def compute_dtype(self):
        """``dtype`` as a ``jnp.dtype``."""
        return jnp.dtype(self.dtype)

    @property
    def ff_width(self) -> int:
        return self.d_ff if self.d_ff is not None else 4 * self.d_model

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


FLOAT_DTYPES = ("float32", "bfloat16", "float16")


def _float_dtype_name(value, what: str) -> str:
    """The canonical name of a float dtype a transformer computes in or stores weights as."""
    try:
        name = jnp.dtype(value).name
    except TypeError:
        name = None
    if name not in FLOAT_DTYPES:
        raise ValueError(
            f"{what} must be one of {', '.join(FLOAT_DTYPES)} (a name or a dtype), got {value!r}; "
            "float64 is refused: it is slow on every backend and JAX runs 32-bit by default"
        )
    return name


def _dropout(x, rate, key):
    if key is None or rate == 0.0:
        return x
    keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), 0.0)


def _table(embed) -> jax.Array:
    """The whole table of an embedding module (the int8 twin's ``QEmbed`` dequantises it)."""
    table = getattr(embed, "table", None)
    return table() if callable(table) else embed.embedding[...]


def sinusoidal_table(length: int, d: int) -> np.ndarray:
    """float32[length, d]: the fixed sin/cos position encodings."""
    pos = np.arange(length)[:, None]
    freq = np.exp(-math.log(10000.0) * (np.arange(0, d, 2) / d))[None, :]
    table = np.zeros((length, d), np.float32)
    table[:, 0::2] = np.sin(pos * freq)
    table[:, 1::2] = np.cos(pos * freq)[:, : d // 2]
    return table


class _Block(nnx.Module):
    """Pre-LayerNorm block: causal multi-head self-attention, then a GELU MLP."""

    def __init__(self, cfg: TransformerConfig, rngs: nnx.Rngs, linear=nnx.Linear):
        d = cfg.d_model
        self.n_heads = cfg.n_heads
        self.rate = cfg.dropout
        kw = dict(dtype=jnp.dtype(cfg.dtype), param_dtype=jnp.dtype(cfg.param_dtype), rngs=rngs)
        self.ln1 = nnx.LayerNorm(d, **kw)
        self.qkv = linear(d, 3 * d, **kw)
        self.out = linear(d, d, **kw)
        self.ln2 = nnx.LayerNorm(d, **kw)
        self.ff1 = linear(d, cfg.ff_width, **kw)
        self.ff2 = linear(cfg.ff_width, d, **kw)

    def __call__(self, x, key=None, visible=None, kv=None):
        """``visible``: see :meth:`TransformerModule.__call__`; ``kv``: a list the block appends
        its keys and values ``float[B, T, H, D/H]`` to (a packed forward's row caches)."""
        b, t, d = x.shape
        h = self.n_heads
        q, k, v = jnp.split(self.qkv(self.ln1(x)), 3, axis=-1)
        q, k, v = (a.reshape(b, t, h, d // h) for a in (q, k, v))
        if kv is not None:
            kv.append((k, v))
        # attention in float32 whatever the compute dtype (no-ops for a float32 model): the
        # cached path (jaxrescore.models.decoding) splits these sums, and 16-bit partial sums
        # would make the two paths differ by far more than their float32 noise
        att = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32) / math.sqrt(d // h)
        causal = jnp.tril(jnp.ones((t, t), bool))
        if visible is not None:  # a packed tree (see jaxrescore.models.packed): [B, 1, T, T]
            causal = (causal & visible)[:, None]
        att = jax.nn.softmax(jnp.where(causal, att, -jnp.inf), axis=-1)
        y = jnp.einsum("bhqk,bkhd->bqhd", att, v.astype(jnp.float32)).astype(x.dtype).reshape(b, t, d)
        k1, k2 = (None, None) if key is None else jax.random.split(key)
        x = x + _dropout(self.out(y), self.rate, k1)
        y = self.ff2(jax.nn.gelu(self.ff1(self.ln2(x))))
        return x + _dropout(y, self.rate, k2)

    def decode(self, x, start, ctx_k, ctx_v, ctx_len, row_k, row_v):
        """The block over new positions with cached keys and values (see
        :meth:`TransformerModule.decode`): ``x[B, W, d]`` at row positions ``start[b] + w``;
        returns the output and the row cache (``float[B, H, S, D/H]``) with the new keys and
        values written in."""
        b, w, d = x.shape
        h = self.n_heads
        q, k, v = jnp.split(self.qkv(self.ln1(x)), 3, axis=-1)
        q, k, v = (a.reshape(b, w, h, d // h) for a in (q, k, v))
        write = jax.vmap(lambda c, u, s: jax.lax.dynamic_update_slice(c, u.astype(c.dtype), (0, s, 0)))
        row_k, row_v = write(row_k, k.transpose(0, 2, 1, 3), start), write(row_v, v.transpose(0, 2, 1, 3), start)
        scale = math.sqrt(d // h)
        a_ctx = jnp.einsum("bqhd,hkd->bhqk", q, ctx_k, preferred_element_type=jnp.float32) / scale
        a_row = jnp.einsum("bqhd,bhkd->bhqk", q, row_k, preferred_element_type=jnp.float32) / scale
        ctx_ok = jnp.arange(ctx_k.shape[1]) < ctx_len  # shared positions written by the prefill
        qpos = start[:, None] + jnp.arange(w)[None, :]
        row_ok = jnp.arange(row_k.shape[2])[None, None, :] <= qpos[:, :, None]  # causal, own row
        a_ctx = jnp.where(ctx_ok[None, None, None, :], a_ctx, -jnp.inf)
        a_row = jnp.where(row_ok[:, None], a_row, -jnp.inf)
        att = jax.nn.softmax(jnp.concatenate([a_ctx, a_row], axis=-1), axis=-1)
        c = ctx_k.shape[1]
        y = jnp.einsum("bhqk,hkd->bqhd", att[..., :c], ctx_v.astype(jnp.float32)) + jnp.einsum(
            "bhqk,bhkd->bqhd", att[..., c:], row_v.astype(jnp.float32)
        )
        y = y.astype(x.dtype)
        x = x + self.out(y.reshape(b, w, d))
        return x + self.ff2(jax.nn.gelu(self.ff1(self.ln2(x)))), row_k, row_v


class TransformerModule(nnx.Module):
    """The nnx network: ``tokens int32[B, T]`` (BOS id ``V`` first) -> ``logits float32[B, T, V]``.
    ``linear`` and ``embed`` build its dense layers and tables (the int8 twin passes its own)."""

    def __init__(self, cfg: TransformerConfig, rngs: nnx.Rngs, linear=nnx.Linear, embed=nnx.Embed):
        self.rate = cfg.dropout
        self.max_len = cfg.max_len
        kw = dict(dtype=jnp.dtype(cfg.dtype), param_dtype=jnp.dtype(cfg.param_dtype), rngs=rngs)
        self.embed = embed(cfg.vocab_size + 1, cfg.d_model, **kw)
        # Sinusoidal tables are trace-time constants, so they never become trainable weights.
        self.pos = embed(cfg.max_len, cfg.d_model, **kw) if cfg.positions == "learned" else None
        self.blocks = nnx.List([_Block(cfg, rngs, linear) for _ in range(cfg.n_layers)])
        self.ln_f = nnx.LayerNorm(cfg.d_model, **kw)
        self.head = linear(cfg.d_model, cfg.vocab_size, **kw)

    def __call__(self, tokens, key=None, positions=None, visible=None, kv=None):
        """``positions int32[B, T]`` and ``visible bool[B, T, T]`` (both or neither) pack a tree
        of rows into each row of ``tokens`` (see :mod:`jaxrescore.models.packed`): token ``t``
        sits at position ``positions[b, t]`` and attends to ``visible[b, t]`` (its context,
        its ancestors and itself). ``kv``: a list each block appends its keys and values to."""
        t = tokens.shape[1]
        d = self.ln_f.num_features
        if positions is None:
            pos = _table(self.pos)[:t] if self.pos is not None else jnp.asarray(sinusoidal_table(t, d))
            pos = pos[None]
        else:
            table = _table(self.pos) if self.pos is not None else jnp.asarray(sinusoidal_table(self.max_len, d))
            pos = jnp.take(table, positions, axis=0, mode="clip")
        x = self.embed(tokens)
        x = x + pos.astype(x.dtype)
        n = len(self.blocks) + 1
        keys = [None] * n if key is None else jax.random.split(key, n)
        x = _dropout(x, self.rate, keys[0])
        for block, k in zip(self.blocks, keys[1:]):
            x = block(x, k, visible, kv)
        return self.head(self.ln_f(x))

    def decode(self, tokens, start, last, ctx, ctx_len, cache):
        """Incremental forward with key/value caches (no dropout).

        Args:
          tokens: int32[B, W], row ``b``'s new tokens at row positions ``start[b] + w``, i.e. at
            absolute positions ``ctx_len + start[b] + w`` (padding tokens past a row's end are
            harmless: they only write cache positions later writes overwrite and masks hide).
          start: int32[B], the positions already written in each row's cache.
          last: int32[B], which new position's logits to return, or int32[B, L]: several.
          ctx: per block ``(k, v)`` float[H, C, D/H]: the SHARED context (BOS and a prompt),
            positions ``< ctx_len`` valid.
          ctx_len: int32 scalar.
          cache: per block ``(k, v)`` float[B, H, S, D/H], ``S >= start + W``: heads before
            positions, so the attention's einsums read it in place (a ``[B, S, H, D/H]`` cache
            was transposed, i.e. copied, by each of them: a 2,048-row, one-token call of the
            real-text target at S = 32 took 103 ms on 2 CPU cores against 64 ms).

        Returns:
          logits float32[B, V] at new position ``last[b]`` (``[B, L, V]`` at ``last[b, l]`` for a
          2-D ``last``), and the updated row cache.
        """
        w = tokens.shape[1]
        pos = ctx_len + start[:, None] + jnp.arange(w)[None, :]
        if self.pos is not None:
            table = _table(self.pos)
        else:
            table = jnp.asarray(sinusoidal_table(self.max_len, self.ln_f.num_features))
        # positions past the table exist only for padding tokens: clip, never NaN
        x = self.embed(tokens)
        x = x + jnp.take(table, pos, axis=0, mode="clip").astype(x.dtype)
        out = []
        for block, (ck, cv), (rk, rv) in zip(self.blocks, ctx, cache):
            x, rk, rv = block.decode(x, start, ck, cv, ctx_len, rk, rv)
            out.append((rk, rv))
        every = last.ndim == 2  # teacher forcing: the logits of several new positions per row
        x = jnp.take_along_axis(x, (last if every else last[:, None])[..., None], axis=1)
        logits = self.head(self.ln_f(x))
        return (logits if every else logits[:, 0]), tuple(out)


@dataclass(frozen=True)
class TransformerApply:
    """Hashable pure forward ``(state, tokens[, key]) -> logits`` (equal graphs share compiles)."""

    graphdef: nnx.GraphDef

    def __hash__(self):
        # jit hashes this static argument on every call; hashing a GraphDef walks the whole
        # module structure (~0.7 ms for the demo model), so compute it once.
        cached = self.__dict__.get("_hash")
        if cached is None:
            cached = hash(self.graphdef)
            object.__setattr__(self, "_hash", cached)
        return cached

    def __call__(self, state, tokens, key=None):
        return nnx.merge(self.graphdef, state)(tokens, key)


@dataclass(frozen=True)
class TransformerPacked:
    """Hashable packed forward ``(state, tokens[1, P], positions, visible[, paths]) -> logits``
    of a :class:`TransformerModule` (see :mod:`jaxrescore.models.packed`); given ``paths
    int32[R, S]`` (packed indices), also the row caches of the decoder (per block ``(k, v)
    float[R, H, S, D/H]``) whose position ``j`` holds packed token ``paths[r, j]``'s."""

    graphdef: nnx.GraphDef

    __hash__ = TransformerApply.__hash__

    def __call__(self, state, tokens, positions, visible, paths=None):
        module = nnx.merge(self.graphdef, state)
        if paths is None:
            return module(tokens, None, positions, visible)
        kv: list = []
        logits = module(tokens, None, positions, visible, kv)
        return logits, tuple((k[0][paths].transpose(0, 2, 1, 3), v[0][paths].transpose(0, 2, 1, 3)) for k, v in kv)


@dataclass(frozen=True)
class TransformerDecode:
    """Hashable incremental forward of a :class:`TransformerModule` (see
    :meth:`TransformerModule.decode` and :mod:`jaxrescore.models.decoding`): ``prepare`` maps the
    stored weights to the network's (the int8 twin dequantises), ``cache=None`` starts fresh rows
    of ``s_out`` positions, a given cache is padded to ``s_out`` positions."""

    graphdef: nnx.GraphDef
    prepare: Callable | None = None

    def __hash__(self):
        cached = self.__dict__.get("_hash")
        if cached is None:
            cached = hash((self.graphdef, self.prepare))
            object.__setattr__(self, "_hash", cached)
        return cached

    def __call__(self, params, tokens, start, last, ctx, ctx_len, cache, s_out):
        state = params if self.prepare is None else self.prepare(params)
        module = nnx.merge(self.graphdef, state)
        if cache is None:
            b = tokens.shape[0]
            cache = tuple(
                (jnp.zeros((b, ck.shape[0], s_out, ck.shape[2]), ck.dtype),
                 jnp.zeros((b, cv.shape[0], s_out, cv.shape[2]), cv.dtype))
                for ck, cv in ctx
            )
        else:
            pad = lambda x: jnp.pad(x, ((0, 0), (0, 0), (0, s_out - x.shape[2]), (0, 0)))  # noqa: E731
            cache = jax.tree.map(pad, cache)
        return module.decode(tokens, start, last, ctx, ctx_len, cache)


def transformer_decoder(config: TransformerConfig, graphdef, prepare: Callable | None = None):
    """The :class:`~jaxrescore.models.decoding.Decoder` of a transformer network."""
    h, dh = config.n_heads, config.d_model // config.n_heads

    def empty_context():
        z = jnp.zeros((h, 1, dh), jnp.dtype(config.dtype))
        return tuple((z, z) for _ in range(config.n_layers))

    return Decoder(TransformerDecode(graphdef, prepare), empty_context, prefix_reuse=True, zeros_fresh=True)


@functools.lru_cache(maxsize=16)
def _graph(config: TransformerConfig):
    """The (hashable) graph definition and abstract weights of ``config``'s network."""
    return nnx.split(nnx.eval_shape(lambda: TransformerModule(config, nnx.Rngs(0))))


def init_weights(config: TransformerConfig, seed: int):
    """Initial weights, drawn on the host with numpy: eager or jitted JAX initialisation costs
    seconds of compiling on CPU, this costs milliseconds. Kernels and embeddings are normal with
    variance 1/fan_in (LeCun), LayerNorm scales one, biases zero."""
    rng = np.random.default_rng(seed)

    def fill(path, leaf):
        name = str(getattr(path[-2], "key", ""))
        if name in ("kernel", "embedding"):
            fan_in = leaf.shape[0] if name == "kernel" else leaf.shape[1]
            w = rng.standard_normal(leaf.shape) / np.sqrt(fan_in)
        elif name == "scale":
            w = np.ones(leaf.shape)
        else:
            w = np.zeros(leaf.shape)
        return jnp.asarray(w, leaf.dtype)

    graphdef, abstract = _graph(config)
    return graphdef, jax.tree_util.tree_map_with_path(fill, abstract)


class TransformerLM(PackedFrontier, JaxLM):
    """Decoder-only transformer LM (see the module docstring).

    Args:
      config: a :class:`TransformerConfig`.
      seed: initialisation seed.
      mesh: optional ``jax.sharding.Mesh``: shard the batch axis of forwards (data parallel).

    Attributes:
      config: the config.
      params: the weights state (an ``nnx.State``) passed to every jitted forward; assign a new
        state of the same structure to update the model.
    """

    def __init__(self, config: TransformerConfig, *, seed: int = 0, mesh: Mesh | None = None):
        if not isinstance(config, TransformerConfig):
            raise TypeError(f"config must be a TransformerConfig, got {type(config).__name__}")
        seed = check_int(seed, "seed", minimum=0)
        graphdef, state = init_weights(config, seed)
        self.config = config
        super().__init__(
            TransformerApply(graphdef),
            state,
            vocab_size=config.vocab_size,
            eos=config.eos,
            max_len=config.max_len,
            bos_id=config.vocab_size,
            mesh=mesh,
        )

    def __repr__(self) -> str:
        c = self.config
        return (
            f"TransformerLM(V={c.vocab_size}, d_model={c.d_model}, n_layers={c.n_layers}, "
            f"n_heads={c.n_heads}, max_len={c.max_len}, eos={c.eos})"
        )

    @property
    def score_tolerance(self) -> float:
        """Nats a score may move between forwards: 1e-3 in float32, 0.1 for a 16-bit compute
        dtype (see :mod:`jaxrescore.models.scores`)."""
        return BFLOAT16_TOLERANCE if jnp.dtype(self.config.dtype).itemsize < 4 else FLOAT32_TOLERANCE

    @property
    def uses_dropout(self) -> bool:
        return self.config.dropout > 0

    @property
    def n_params(self) -> int:
        return int(sum(np.size(x) for x in jax.tree.leaves(self.params)))

    def decoder(self) -> Decoder:
        """The incremental forward (key/value caches) used by
        :class:`~jaxrescore.models.decoding.DecodingSession`."""
        held = self.__dict__.get("_decoder")
        if held is None or held[0] is not self.apply.graphdef:
            held = (self.apply.graphdef, transformer_decoder(self.config, self.apply.graphdef))
            self._decoder = held
        return held[1]

    def packed_forward(self) -> TransformerPacked:
        """The packed forward of full forwards (see :mod:`jaxrescore.models.packed`)."""
        return TransformerPacked(self.apply.graphdef)

    def module(self) -> TransformerModule:
        """A fresh nnx module holding the current weights (for inspection or other nnx code)."""
        return nnx.merge(self.apply.graphdef, self.params)
