"""StepDecode: a user's flax-decoding-style step as the incremental forward of
:mod:`jaxrescore.models.decoding` (the ``Decoder.fn`` contract), for
:func:`jaxrescore.models.from_apply_fn` models with ``init_cache``/``step``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import jax
import jax.numpy as jnp


def _where_rows(keep, new, old):
    """``new`` where ``keep[b]``, else ``old``, row by row over every leaf."""
    return jax.tree.map(lambda a, b: jnp.where(keep.reshape((-1,) + (1,) * (a.ndim - 1)), a, b), new, old)


@dataclass(frozen=True)
class StepDecode:
    """Hashable incremental forward from a user's flax-decoding-style step (see
    :func:`jaxrescore.models.from_apply_fn`): ``step(params, cache, tokens int32[B, 1],
    positions int32[B]) -> (logits[B, 1, V], cache)``, one token per row at absolute position
    ``positions[b]`` (BOS at 0). Row caches are the user's own pytrees (leading axis: rows);
    the context is one row's cache without that axis, and fresh rows start as copies of it. ``W`` new tokens run as a
    ``lax.scan`` of the step inside one call; a row's cache stops at its own last token
    (``last[b]``, or ``max(last[b])`` for a 2-D ``last``: a step may be any function of the
    cache, e.g. a running sum, not only a write, so a row cache is valid for its whole row only).
    A 1-D ``last`` keeps one running row per row; a 2-D one collects every step's logits."""

    step: Callable

    def __call__(self, params, tokens, start, last, ctx, ctx_len, cache, s_out):
        b, w = tokens.shape
        every = last.ndim == 2
        if cache is None:
            cache = jax.tree.map(lambda c: jnp.broadcast_to(c, (b,) + c.shape), ctx)
        if w == 1:
            logits, cache = self.step(params, cache, tokens, ctx_len + start)
            return (jnp.take_along_axis(logits, last[..., None], axis=1) if every else logits[:, 0]), cache
        stop = last.max(axis=1) if every else last

        def one(carry, j):
            cache, out = carry
            logits, new = self.step(params, cache, jax.lax.dynamic_slice_in_dim(tokens, j, 1, 1), ctx_len + start + j)
            row = logits[:, 0].astype(jnp.float32)
            if not every:
                out = jnp.where((j == last)[:, None], row, out)
            return (_where_rows(j <= stop, new, cache), out), (row if every else None)

        v = jax.eval_shape(self.step, params, cache, tokens[:, :1], start)[0].shape[-1]
        (cache, out), rows = jax.lax.scan(one, (cache, jnp.zeros((b, v), jnp.float32)), jnp.arange(w))
        if every:
            out = jnp.take_along_axis(jnp.swapaxes(rows, 0, 1), last[..., None], axis=1)
        return out, cache
