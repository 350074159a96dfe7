"""The cache step of a flax.linen module that decodes with flax's own cache (``decode=True``).

A linen language model written the flax way has a ``decode: bool`` field: with ``decode=True``
its ``nn.MultiHeadDotProductAttention`` layers (and, often, its position embedding) keep keys,
values and a ``cache_index`` counter in a ``"cache"`` collection, and ``module.apply(variables,
tokens int32[B, 1], mutable=["cache"])`` runs one new token per call. :func:`linen_cache_pair`
turns such a decode-mode module into the ``(init_cache, step)`` pair of
:func:`~jaxrescore.models.from_apply_fn`, so ``from_linen`` decodes incrementally without a
hand-written step.

flax's cache advances every row together (``cache_index`` is one scalar per layer), while the
library's rows sit at different positions. So each row keeps a cache of its own (flax's batch
axis of 1, under a leading row axis), the step is vmapped over rows, and before each token every
integer scalar of a row's cache (flax's ``cache_index`` counters) is set to that row's position.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from jaxrescore.typing import PyTree


def _at_position(cache: PyTree, position) -> PyTree:
    """``cache`` with every integer scalar leaf (a ``cache_index``) set to ``position``."""

    def put(x):
        if jnp.ndim(x) == 0 and jnp.issubdtype(jnp.result_type(x), jnp.integer):
            return jnp.asarray(position, jnp.result_type(x))
        return x

    return jax.tree.map(put, cache)


@dataclass(frozen=True)
class LinenCacheInit:
    """``init_cache(batch, max_length)``: zeros of the decode module's ``"cache"`` collection for
    one row of ``max_length`` positions, stacked ``batch`` times on a leading row axis."""

    module: nn.Module
    method: Any
    kwargs: tuple

    def __call__(self, batch: int, max_length: int) -> PyTree:
        tokens = jax.ShapeDtypeStruct((1, max_length), np.int32)
        shapes = jax.eval_shape(
            lambda t: self.module.init(jax.random.PRNGKey(0), t, method=self.method, **dict(self.kwargs)), tokens
        )
        if "cache" not in shapes:
            raise ValueError(
                f"{type(self.module).__name__}(decode=True).init made no 'cache' collection: its attention "
                "does not use flax's decode cache (nn.MultiHeadDotProductAttention(decode=True)); pass "
                "init_cache= and step= instead, or decode_module=False for full forwards"
            )
        return jax.tree.map(lambda s: jnp.zeros((batch,) + s.shape, s.dtype), shapes["cache"])


@dataclass(frozen=True)
class LinenCacheStep:
    """``step(variables, cache, tokens int32[B, 1], positions int32[B]) -> (logits[B, 1, V],
    cache)`` of a decode-mode module, one flax cache per row (see the module docstring);
    ``variables`` is the full variables dict (``"params"`` and the fixed collections)."""

    module: nn.Module
    method: Any
    kwargs: tuple

    def __call__(self, variables: Mapping, cache: PyTree, tokens, positions):
        def one(row_cache, token, position):
            logits, out = self.module.apply(
                {**variables, "cache": _at_position(row_cache, position)}, token[None], method=self.method,
                mutable=["cache"], **dict(self.kwargs),
            )
            return logits[0], out["cache"]

        return jax.vmap(one)(cache, tokens, positions)


def decode_module_of(module: nn.Module, decode_module: Any) -> nn.Module | None:
    """The module that decodes: ``decode_module`` when it is a linen module, None when it is
    False, and for None (the default) ``module.clone(decode=True)`` when ``module`` has a
    ``decode`` field (the flax convention), else None."""
    if decode_module is False:
        return None
    if decode_module is None:
        has_field = "decode" in getattr(module, "__dataclass_fields__", {})
        return module.clone(decode=True) if has_field and getattr(module, "decode") is False else None
    if not isinstance(decode_module, nn.Module):
        raise TypeError(
            f"decode_module must be a flax.linen Module (the model built with decode=True), None or False, "
            f"got {type(decode_module).__name__}"
        )
    return decode_module


def linen_cache_pair(decode_module: nn.Module, method: Any, kwargs: Mapping) -> tuple[Callable, Callable]:
    """``(init_cache, step)`` of a decode-mode linen module (``step`` takes the variables dict)."""
    frozen = tuple(sorted(kwargs.items()))
    return LinenCacheInit(decode_module, method, frozen), LinenCacheStep(decode_module, method, frozen)
