"""quantize_int8: a TransformerLM twin with int8 weights, and its measured deviation.

Every 2-D weight is stored as int8 with float32 per-output-channel scales (symmetric, ``q =
round(w / s)``, ``s = max|w| / 127`` per channel): a Linear kernel ``[in, out]`` per output column,
an embedding table per row (token). Biases and LayerNorm parameters stay float32. The forward
dequantises inside the jit (``q * s`` in float32) and runs the same network, so the twin is a
cheap-to-store draft whose scores differ from the original by the measured deviation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from jaxrescore.models.base import AutoregressiveEnumerable
from jaxrescore.models.jax_lm import JaxLM
from jaxrescore.models.sampling import sample_sequences
from jaxrescore.models.decoding import Decoder
from jaxrescore.models.transformer import TransformerConfig, TransformerLM, transformer_decoder
from jaxrescore.typing import PyTree, Sequences


class QTensor(NamedTuple):
    """An int8 weight ``q`` and its float32 ``scale`` (broadcastable to ``q``)."""

    q: jax.Array
    scale: jax.Array


def _is_q(x) -> bool:
    return isinstance(x, QTensor)


def _quantize_leaf(path, w):
    name = str(getattr(path[-2], "key", "")) if len(path) >= 2 else ""
    if w.ndim != 2 or name not in ("kernel", "embedding"):
        return w
    # On the host in numpy: eager per-leaf JAX ops would each compile.
    w = np.asarray(w, np.float32)
    axis = 0 if name == "kernel" else 1  # reduce over inputs: one scale per output channel
    amax = np.max(np.abs(w), axis=axis, keepdims=True)
    scale = np.where(amax > 0, amax / 127.0, 1.0).astype(np.float32)
    q = np.clip(np.round(w / scale), -127, 127).astype(np.int8)
    return QTensor(jnp.asarray(q), jnp.asarray(scale))


def dequantize(qparams):
    """The float32 weights tree of an int8 weights tree."""
    return jax.tree.map(
        lambda x: x.q.astype(jnp.float32) * x.scale if _is_q(x) else x, qparams, is_leaf=_is_q
    )


@dataclass(frozen=True)
class Int8Apply:
    """Hashable forward ``(int8 state, tokens) -> logits``: dequantise, then the float network."""

    graphdef: nnx.GraphDef

    def __hash__(self):
        # jit hashes this static argument on every call; hashing a GraphDef walks the whole
        # module structure (~0.7 ms for the demo model), so compute it once.
        cached = self.__dict__.get("_hash")
        if cached is None:
            cached = hash(self.graphdef)
            object.__setattr__(self, "_hash", cached)
        return cached

    def __call__(self, qstate, tokens):
        return nnx.merge(self.graphdef, dequantize(qstate))(tokens)


class Int8TransformerLM(JaxLM):
    """The int8 twin of a TransformerLM (build with :func:`quantize_int8`); same protocol,
    not trainable. ``params`` is the weights tree with :class:`QTensor` leaves."""

    trainable = False

    def __init__(
        self, config: TransformerConfig, graphdef: nnx.GraphDef, qparams: PyTree, *, mesh: Mesh | None = None
    ):
        self.config = config
        super().__init__(
            Int8Apply(graphdef), qparams, vocab_size=config.vocab_size, eos=config.eos,
            max_len=config.max_len, bos_id=config.vocab_size, mesh=mesh,
        )

    def __repr__(self) -> str:
        c = self.config
        return f"Int8TransformerLM(V={c.vocab_size}, d_model={c.d_model}, n_layers={c.n_layers})"

    def decoder(self) -> Decoder:
        """The incremental forward (key/value caches, weights dequantised inside the jit) used by
        :class:`~jaxrescore.models.decoding.DecodingSession`."""
        held = self.__dict__.get("_decoder")
        if held is None or held[0] is not self.apply.graphdef:
            held = (self.apply.graphdef, transformer_decoder(self.config, self.apply.graphdef, dequantize))
            self._decoder = held
        return held[1]

    @property
    def nbytes(self) -> int:
        return int(sum(np.asarray(x).nbytes for x in jax.tree.leaves(self.params)))


def quantize_int8(model: TransformerLM) -> Int8TransformerLM:
    """The int8 weight-quantised twin of ``model`` (see the module docstring)."""
    if not isinstance(model, TransformerLM):
        raise TypeError(f"quantize_int8 needs a TransformerLM, got {type(model).__name__}")
    qparams = jax.tree_util.tree_map_with_path(_quantize_leaf, model.params)
    return Int8TransformerLM(model.config, model.apply.graphdef, qparams, mesh=model.mesh)


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
