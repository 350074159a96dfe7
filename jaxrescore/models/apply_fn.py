"""from_apply_fn: any JAX language-model function as an enumerable model."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from jaxrescore.models.base import check_int
from jaxrescore.models.frontier import BFLOAT16_TOLERANCE, FLOAT32_TOLERANCE
from jaxrescore.models.jax_lm import JaxLM
from jaxrescore.typing import PyTree


class ApplyFnLM(JaxLM):
    """A model given as ``apply_fn(params, tokens int32[B, T]) -> logits[B, T, V]`` (see
    :func:`from_apply_fn`). ``params`` can be replaced (or trained with ``train_lm``)."""

    def __repr__(self) -> str:
        name = getattr(self.apply, "__name__", type(self.apply).__name__)
        return f"ApplyFnLM({name}, V={self.vocab_size}, max_len={self.max_len}, eos={self.eos})"


def from_apply_fn(
    apply_fn: Callable[[PyTree, jax.Array], jax.Array],
    params: PyTree,
    *,
    vocab_size: int,
    bos_id: int,
    max_len: int,
    eos: int | None = None,
    mesh: Mesh | None = None,
) -> ApplyFnLM:
    """Wrap a JAX LM function as an AutoregressiveEnumerable.

    Args:
      apply_fn: pure, causal ``(params, tokens int32[B, T]) -> logits float[B, T, V]``, where
        ``tokens[:, 0] == bos_id`` and position ``j``'s logits predict the sequence's token ``j``.
        It is jitted with ``params`` as an argument (hashable; keep one function object per model
        to reuse compiles).
      params: its weights pytree.
      vocab_size: V (logits' last axis).
      bos_id: the id fed at position 0 (e.g. V for an extra embedding row).
      max_len: the longest sequence in the support, EOS included.
      eos: end-of-sequence id, or None for fixed-length sequences of ``max_len`` tokens.
      mesh: optional ``jax.sharding.Mesh``: data-parallel forwards.

    The model's ``score_tolerance`` follows the logits' dtype: 1e-3 nats for float32, 0.1 for a
    16-bit float (see :mod:`jaxrescore.models.frontier`).
    """
    if not callable(apply_fn):
        raise TypeError(f"apply_fn must be callable, got {type(apply_fn).__name__}")
    vocab_size = check_int(vocab_size, "vocab_size", minimum=1)
    max_len = check_int(max_len, "max_len", minimum=1)
    bos_id = check_int(bos_id, "bos_id", minimum=0)
    eos = check_int(eos, "eos", minimum=0, maximum=vocab_size, allow_none=True)
    probe = jax.ShapeDtypeStruct((1, 2), np.int32)
    out = jax.eval_shape(apply_fn, params, probe)
    if getattr(out, "shape", None) != (1, 2, vocab_size):
        raise ValueError(
            f"apply_fn(params, int32[1, 2]) must return logits of shape (1, 2, {vocab_size}), "
            f"got {getattr(out, 'shape', type(out).__name__)}"
        )
    model = ApplyFnLM(
        apply_fn, params, vocab_size=vocab_size, eos=eos, max_len=max_len, bos_id=bos_id, mesh=mesh
    )
    # Logits computed in a 16-bit float move by ~0.05 nats between forwards (measured for bf16):
    # the proof and the certificate need that much to spare.
    if jnp.dtype(out.dtype).itemsize < 4:
        model.score_tolerance = BFLOAT16_TOLERANCE
    else:
        model.score_tolerance = FLOAT32_TOLERANCE
    return model
