"""quantize_int8: an int8 twin of a model that is cheaper to store AND to run, and its deviation.

Every 2-D weight is stored as int8 with float32 per-output-channel scales (symmetric, ``q =
round(w / s)``, ``s = max|w| / 127`` per channel): a Linear kernel ``[in, out]`` per output column,
an embedding table per row (token). Biases and LayerNorm parameters stay as they were.

TransformerLM twins run their own network (:class:`QLinear`, :class:`QEmbed` in place of the
float layers; the weights stay int8 in memory, nothing is dequantised whole per call):

- ``activations="int8"`` (the default): each dense layer quantises its input per token (symmetric,
  ``max|x| / 127``) and multiplies int8 by int8 with int32 accumulation (``lax.dot_general`` with
  ``preferred_element_type=int32``, which XLA lowers to integer GEMMs on CPU and GPU), then
  rescales: W8A8;
- ``activations="float"``: weight-only, each layer multiplies by its dequantised kernel (the
  scores of the previous twin).

Measured side by side in ``benchmarks/bench_int8.py`` (BENCHMARKS.md); ``max_step_deviation``
measures what either costs in accuracy.

Any ``from_apply_fn`` model: every floating leaf of its params pytree with at least 2 axes is
quantised (one scale per entry of its last axis) and dequantised inside the jit before
``apply_fn`` runs: the twin stores 4x less, its forward is the original's (a user's function
cannot be given integer matmuls from outside).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from functools import partial
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from jaxrescore._checks import check_choice
from jaxrescore.models.apply_fn import ApplyFnLM
from jaxrescore.models.base import AutoregressiveEnumerable
from jaxrescore.models.batching import param_bytes
from jaxrescore.models.jax_lm import JaxLM
from jaxrescore.models.packed import PackedFrontier
from jaxrescore.models.generate import sample_sequences
from jaxrescore.models.mesh import to_host
from jaxrescore.models.transformer import (
    TransformerApply,
    TransformerConfig,
    TransformerLM,
    TransformerModule,
)
from jaxrescore.typing import PyTree, Sequences

ACTIVATIONS = ("int8", "float")


class QTensor(NamedTuple):
    """An int8 weight ``q`` and its float32 ``scale`` (broadcastable to ``q``)."""

    q: jax.Array
    scale: jax.Array


def _is_q(x) -> bool:
    return isinstance(x, QTensor)


def _quantize(w: np.ndarray, axis) -> QTensor:
    """Symmetric int8 of ``w`` with one float32 scale per slice along the reduced ``axis``."""
    w = np.asarray(w, np.float32)  # on the host: eager per-leaf JAX ops would each compile
    amax = np.max(np.abs(w), axis=axis, keepdims=True)
    scale = np.where(amax > 0, amax / 127.0, 1.0).astype(np.float32)
    q = np.clip(np.round(w / scale), -127, 127).astype(np.int8)
    return QTensor(jnp.asarray(q), jnp.asarray(scale))


def _quantize_leaf(path, w):
    name = str(getattr(path[-2], "key", "")) if len(path) >= 2 else ""
    if np.ndim(w) != 2 or name not in ("kernel", "embedding"):
        return w
    return _quantize(w, 0 if name == "kernel" else 1)  # reduce over inputs: per output channel


def dequantize(qparams: PyTree) -> PyTree:
    """The float32 weights tree of an int8 weights tree."""
    return jax.tree.map(
        lambda x: x.q.astype(jnp.float32) * x.scale if _is_q(x) else x, qparams, is_leaf=_is_q
    )


class QLinear(nnx.Module):
    """A dense layer with an int8 kernel (``kernel``: a :class:`QTensor`, scales ``[1, out]``)."""

    def __init__(self, in_features: int, out_features: int, *, dtype=None, param_dtype=jnp.float32,
                 rngs: nnx.Rngs, activations: str = "int8"):
        self.kernel = nnx.Param(QTensor(jnp.zeros((in_features, out_features), jnp.int8),
                                        jnp.ones((1, out_features), jnp.float32)))
        self.bias = nnx.Param(jnp.zeros((out_features,), param_dtype))
        self.dtype = dtype
        self.activations = activations

    def __call__(self, x):
        q, scale = self.kernel.get_value()
        dtype = self.dtype or x.dtype
        if self.activations == "int8":
            # per-token symmetric int8 of the input, integer GEMM, int32 accumulation
            xf = x.astype(jnp.float32)
            amax = jnp.max(jnp.abs(xf), axis=-1, keepdims=True)
            sx = jnp.where(amax > 0, amax / 127.0, 1.0)
            xq = jnp.clip(jnp.round(xf / sx), -127, 127).astype(jnp.int8)
            acc = jax.lax.dot_general(xq, q, (((x.ndim - 1,), (0,)), ((), ())), preferred_element_type=jnp.int32)
            y = acc.astype(jnp.float32) * sx * scale[0]
        else:
            y = jnp.dot(x.astype(jnp.float32), q.astype(jnp.float32) * scale)
        return (y + self.bias[...].astype(jnp.float32)).astype(dtype)


class QEmbed(nnx.Module):
    """An embedding table of int8 rows with one float32 scale per row (token)."""

    def __init__(self, num_embeddings: int, features: int, *, dtype=None, param_dtype=jnp.float32,
                 rngs: nnx.Rngs):
        self.embedding = nnx.Param(QTensor(jnp.zeros((num_embeddings, features), jnp.int8),
                                           jnp.ones((num_embeddings, 1), jnp.float32)))
        self.dtype = dtype or jnp.float32

    def __call__(self, tokens):
        q, scale = self.embedding.get_value()
        return (q[tokens].astype(jnp.float32) * scale[tokens]).astype(self.dtype)

    def table(self):
        q, scale = self.embedding.get_value()
        return (q.astype(jnp.float32) * scale).astype(self.dtype)


@functools.lru_cache(maxsize=16)
def _twin_graph(config: TransformerConfig, activations: str):
    """The graph definition of ``config``'s int8 network."""
    linear = partial(QLinear, activations=activations)
    return nnx.split(nnx.eval_shape(lambda: TransformerModule(config, nnx.Rngs(0), linear=linear, embed=QEmbed)))[0]


class Int8TransformerLM(PackedFrontier, JaxLM):
    """The int8 twin of a TransformerLM (build with :func:`quantize_int8`); same protocol,
    not trainable. ``params`` is the weights tree with :class:`QTensor` leaves; ``activations``
    says how its dense layers multiply (see the module docstring)."""

    trainable = False

    def __init__(
        self, config: TransformerConfig, qparams: PyTree, *, activations: str = "int8", mesh: Mesh | None = None
    ):
        activations = check_choice(activations, "activations", ACTIVATIONS)
        self.config = config
        self.activations = activations
        super().__init__(
            TransformerApply(_twin_graph(config, activations)), qparams, vocab_size=config.vocab_size,
            eos=config.eos, max_len=config.max_len, bos_id=config.vocab_size, mesh=mesh,
        )

    def __repr__(self) -> str:
        c = self.config
        return (f"Int8TransformerLM(V={c.vocab_size}, d_model={c.d_model}, n_layers={c.n_layers}, "
                f"activations={self.activations!r})")

    # Both read only ``config`` and ``apply.graphdef``, so the float model's definitions serve: the
    # compute dtype's tolerance, and key/value caches over this (int8) network.
    score_tolerance = TransformerLM.score_tolerance
    decoder = TransformerLM.decoder
    packed_forward = TransformerLM.packed_forward

    @property
    def nbytes(self) -> int:
        return param_bytes(self.params)


@dataclass(frozen=True)
class DequantizedApply:
    """Hashable ``apply_fn`` of an int8 pytree: dequantise, then the user's function."""

    apply_fn: Callable

    def __call__(self, qparams, tokens, *args):
        return self.apply_fn(dequantize(qparams), tokens, *args)


@dataclass(frozen=True)
class DequantizedStep:
    """The cache-aware ``step`` of an int8 pytree (see :func:`jaxrescore.models.from_apply_fn`)."""

    step: Callable

    def __call__(self, qparams, cache, tokens, positions):
        return self.step(dequantize(qparams), cache, tokens, positions)


def _quantize_pytree(params: PyTree) -> PyTree:
    def leaf(x):
        if np.ndim(x) >= 2 and jnp.issubdtype(jnp.result_type(x), jnp.floating):
            return _quantize(to_host(x, np.float32), tuple(range(np.ndim(x) - 1)))
        return x

    return jax.tree.map(leaf, params)


def quantize_int8(model: TransformerLM | ApplyFnLM, *, activations: str = "int8") -> Int8TransformerLM | ApplyFnLM:
    """The int8 weight-quantised twin of ``model`` (see the module docstring).

    Args:
      model: a TransformerLM (its twin runs int8 layers), any ``from_apply_fn`` model (its twin
        stores int8 weights and dequantises them inside the jit), or a model with an
        ``int8_twin`` method (``from_pretrained``'s: its twin is weight-only int8).
      activations: for a TransformerLM, ``"int8"`` (W8A8 integer matmuls, the default) or
        ``"float"`` (weight-only); ignored for an apply-fn model.
    """
    activations = check_choice(activations, "activations", ACTIVATIONS)
    if isinstance(model, TransformerLM):
        qparams = jax.tree_util.tree_map_with_path(_quantize_leaf, model.params)
        return Int8TransformerLM(model.config, qparams, activations=activations, mesh=model.mesh)
    if isinstance(model, ApplyFnLM) and not isinstance(model.apply, DequantizedApply):
        twin = ApplyFnLM(
            DequantizedApply(model.apply), _quantize_pytree(model.params), vocab_size=model.vocab_size,
            eos=model.eos, max_len=model.max_len, bos_id=model.bos_id, mesh=model.mesh,
        )
        twin.trainable = False
        twin.score_tolerance = model.score_tolerance
        if model.step is not None:
            twin.init_cache, twin.step = model.init_cache, DequantizedStep(model.step)
        return twin
    make_twin = getattr(model, "int8_twin", None)  # a model that knows its own twin (from_pretrained's)
    if callable(make_twin) and isinstance(model, JaxLM):
        return make_twin(activations=activations)
    raise TypeError(
        f"quantize_int8 needs a TransformerLM or a from_apply_fn model (not already quantised), "
        f"got {type(model).__name__}"
    )


def max_step_deviation(
    reference: AutoregressiveEnumerable,
    other: AutoregressiveEnumerable,
    sequences: Sequences | None = None,
    *,
    n: int = 256,
    seed: int = 0,
) -> float:
    """The measured max per-step ``|log p_other - log p_reference|`` (nats) over every real step
    (EOS included) of ``sequences``, or of ``n`` sequences sampled from ``reference``.

    A measurement on a sample, not a bound. Both models need ``step_logprobs`` (the JAX models
    and NGramLM have it) and the same vocabulary.
    """
    for name, model in (("reference", reference), ("other", other)):
        if not callable(getattr(model, "step_logprobs", None)):
            raise TypeError(
                f"{name} must have step_logprobs (a JAX model or NGramLM), got {type(model).__name__}"
            )
    if reference.vocab_size != other.vocab_size or reference.eos != other.eos:
        raise ValueError(
            f"reference (vocab_size={reference.vocab_size}, eos={reference.eos}) and other "
            f"(vocab_size={other.vocab_size}, eos={other.eos}) must share vocab_size and eos"
        )
    seqs = sample_sequences(reference, n, seed=seed) if sequences is None else sequences
    batch, a = reference.step_logprobs(seqs)
    _, b = other.step_logprobs(batch)
    w = min(a.shape[1], b.shape[1])
    mask = np.arange(w)[None, :] < batch.lengths[:, None]  # both widths cover every length
    diff = np.abs(a[:, :w].astype(np.float64) - b[:, :w].astype(np.float64))
    return float(np.where(mask, diff, 0.0).max(initial=0.0))
