"""from_apply_fn: any JAX language-model function as an enumerable model."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from jaxrescore.models.base import check_int
from jaxrescore.models.decoding import Decoder
from jaxrescore.models.step_decode import StepDecode
from jaxrescore.models.scores import BFLOAT16_TOLERANCE, FLOAT32_TOLERANCE
from jaxrescore.models.jax_lm import JaxLM
from jaxrescore.typing import PyTree


class ApplyFnLM(JaxLM):
    """A model given as ``apply_fn(params, tokens int32[B, T]) -> logits[B, T, V]`` (see
    :func:`from_apply_fn`, :func:`~jaxrescore.models.from_nnx`,
    :func:`~jaxrescore.models.from_linen` or :func:`~jaxrescore.models.from_equinox`). ``params``
    can be replaced (or trained with ``train_lm``); ``nnx.update(module, lm.params)``,
    :meth:`to_nnx`, :meth:`to_linen_variables` and :meth:`to_equinox` hand them back to the
    adapted model's library. ``save_model`` writes ``params``;
    ``load_model(path, like=model)`` reads them into a copy of ``model``.

    Attributes:
      init_cache, step: the optional cache-aware pair of :func:`from_apply_fn` (None without).
    """

    init_cache: Callable[[int, int], PyTree] | None = None
    step: Callable[..., tuple[jax.Array, PyTree]] | None = None

    def decoder(self) -> Decoder | None:
        """The incremental forward built from ``init_cache``/``step`` (None without them)."""
        if self.step is None:
            return None
        held = self.__dict__.get("_decoder")
        if held is None or held[0] is not self.step or held[1] is not self.init_cache:
            init, length = self.init_cache, self.max_len
            dec = Decoder(StepDecode(self.step), lambda: jax.tree.map(lambda x: x[0], init(1, length)))
            held = (self.step, self.init_cache, dec)
            self._decoder = held
        return held[2]

    def to_nnx(self) -> Any:
        """The trained weights handed back to flax.nnx: for a model built by
        :func:`~jaxrescore.models.from_nnx`, a NEW module of the adapted one's class, in eval
        mode, with ``self.params`` (the current weights, e.g. after ``train_lm``) as its
        ``nnx.Param`` state and copies of the fixed state; calling it gives this model's logits.
        To update your own module instead: ``nnx.update(module, lm.params)``. TypeError for a
        model built otherwise."""
        return self._source("nnx", "to_nnx", "from_nnx")

    def to_linen_variables(self) -> Mapping[str, Any]:
        """The trained weights handed back to flax.linen: for a model built by
        :func:`~jaxrescore.models.from_linen`, the variables dict with ``self.params`` (the
        current weights, e.g. after ``train_lm``) as its ``"params"`` and the other collections
        as given, in the structure given (dict or FrozenDict). ``module.apply`` of it gives this
        model's logits. TypeError for a model built otherwise."""
        return self._source("linen", "to_linen_variables", "from_linen")

    def to_equinox(self) -> Any:
        """The trained weights handed back to equinox: for a model built by
        :func:`~jaxrescore.models.from_equinox`, the equinox model with ``self.params`` (the
        current weights, e.g. after ``train_lm``) in place of its arrays
        (``eqx.combine(params, static)``). TypeError for a model built otherwise."""
        return self._source("equinox", "to_equinox", "from_equinox")

    def _source(self, kind: str, method: str, builder: str):
        # The adapters' forwards know how to rebuild the user's object from params.
        if getattr(self.apply, "source_kind", None) != kind:
            name = getattr(self.apply, "__name__", type(self.apply).__name__)
            raise TypeError(f"{method}() needs a model built by {builder}; this one's forward is {name}")
        return self.apply.rebuild(self.params)

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
    init_cache: Callable[[int, int], PyTree] | None = None,
    step: Callable[..., tuple[jax.Array, PyTree]] | None = None,
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
      init_cache: optional, with ``step``: ``init_cache(batch_size, max_length) -> cache``, an
        empty key/value cache (a pytree; EVERY leaf has leading axis ``batch_size``) for
        positions ``0 .. max_length - 1`` (BOS at 0); called with ``max_length = max_len``.
      step: optional, with ``init_cache``, in the style of flax decoding: ``step(params, cache,
        tokens int32[B, 1], positions int32[B]) -> (logits[B, 1, V], cache)`` runs ONE new token
        per row at absolute position ``positions[b]`` (rows may be at different positions) and
        returns its logits and the cache with that position added. It must equal ``apply_fn``
        at that position given the earlier tokens. With the pair, level-by-level callers (a
        SeekIndex build, best-first search, greedy completion) and prompted models decode
        incrementally (see :mod:`jaxrescore.models.decoding`); without it every row is a full
        forward. ``score_sequences``/``score_frontier`` always use ``apply_fn``.

    The model's ``score_tolerance`` follows the logits' dtype: 1e-3 nats for float32, 0.1 for a
    16-bit float (see :mod:`jaxrescore.models.scores`).
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
    if (init_cache is None) != (step is None):
        raise ValueError("init_cache and step come as a pair: pass both or neither")
    if step is not None:
        if not callable(init_cache) or not callable(step):
            raise TypeError("init_cache and step must be callable")
        _check_step(init_cache, step, params, vocab_size, max_len)
    model = ApplyFnLM(
        apply_fn, params, vocab_size=vocab_size, eos=eos, max_len=max_len, bos_id=bos_id, mesh=mesh
    )
    model.init_cache, model.step = init_cache, step
    # Logits computed in a 16-bit float move by ~0.05 nats between forwards (measured for bf16):
    # the proof and the certificate need that much to spare.
    if jnp.dtype(out.dtype).itemsize < 4:
        model.score_tolerance = BFLOAT16_TOLERANCE
    else:
        model.score_tolerance = FLOAT32_TOLERANCE
    return model


def _check_step(init_cache, step, params, vocab_size: int, max_len: int) -> None:
    """ValueError unless the cache pair has the shapes :func:`from_apply_fn` documents."""
    cache = jax.eval_shape(lambda: init_cache(2, max_len))
    leaves = jax.tree.leaves(cache)
    if not leaves or any(getattr(x, "shape", ())[:1] != (2,) for x in leaves):
        raise ValueError(
            "init_cache(batch_size, max_length) must return a pytree of arrays whose every leaf has "
            f"leading axis batch_size; init_cache(2, {max_len}) gave "
            f"{jax.tree.map(lambda x: getattr(x, 'shape', None), cache)}"
        )
    tok = jax.ShapeDtypeStruct((2, 1), np.int32)
    pos = jax.ShapeDtypeStruct((2,), np.int32)
    logits, new = jax.eval_shape(step, params, cache, tok, pos)
    if getattr(logits, "shape", None) != (2, 1, vocab_size):
        raise ValueError(
            f"step(params, cache, int32[2, 1], int32[2]) must return (logits of shape (2, 1, {vocab_size}), "
            f"cache), got logits of shape {getattr(logits, 'shape', type(logits).__name__)}"
        )
    if jax.tree.structure(new) != jax.tree.structure(cache) or any(
        a.shape != b.shape for a, b in zip(jax.tree.leaves(new), leaves)
    ):
        raise ValueError("step must return a cache of the same structure and shapes as init_cache's")
