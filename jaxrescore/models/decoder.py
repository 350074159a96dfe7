"""A model's incremental forward (:class:`Decoder`) and its shared context.

The pieces :class:`~jaxrescore.models.decoding.DecodingSession` runs on: the decoder a JAX model
offers (``model.decoder()``), the one compiled call (``_decode``) every session call makes, and
the context (BOS and a prompted model's prompt) computed once per prompted model.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable, NamedTuple

import jax
import numpy as np

from jaxrescore.models.cache_sizes import MIN_CACHE_LEN, coarse_size
from jaxrescore.models.mesh import mesh_context, to_host
from jaxrescore.models.scores import clipped_log_softmax as _log_softmax
from jaxrescore.typing import PyTree


class Context(NamedTuple):
    """A decoding context: the cache of BOS and a prompt, its length and its own next-token row."""

    cache: PyTree
    length: int
    row: np.ndarray  # float32[V], log-probs after the context


@partial(jax.jit, static_argnums=(0, 8, 9))
def _decode(fn, params, tokens, start, last, ctx, ctx_len, cache, s_out, reduce, extra):
    """One incremental call: log-softmax rows (clipped <= 0; float32[B, V] for ``last[B]``,
    float32[B, L, V] for ``last[B, L]``), or ``reduce(rows, *extra)`` of them when ``reduce`` is
    given (a teacher-forced call's reduction, on device), and the new caches."""
    logits, cache = fn(params, tokens, start, last, ctx, ctx_len, cache, s_out)
    rows = _log_softmax(logits)
    return (rows if reduce is None else reduce(rows, *extra)), cache


@dataclass(frozen=True)
class Decoder:
    """A model's incremental forward, for :class:`DecodingSession`.

    Attributes:
      fn: hashable pure ``fn(params, tokens[B, W], start[B], last, ctx, ctx_len, cache, s_out)
        -> (logits, cache)``: ``W`` new tokens per row at row positions ``start[b] + w``
        (absolute ``ctx_len + start[b] + w``); logits ``[B, V]`` at new position ``last[b]`` for
        ``last: int32[B]``, or ``[B, L, V]`` at new positions ``last[b, l]`` for ``last:
        int32[B, L]`` (teacher forcing); ``cache=None`` starts fresh rows from the context; row
        caches cover ``s_out`` row positions (a per-row-position cache pads a given one to that
        length; a user's step keeps its own).
      empty_context: the context cache before any token (a pytree of arrays, no row axis).
      prefix_reuse: whether a row's cache also serves every PREFIX of its row (per-position keys
        and values under the causal mask ``arange(S) <= position``: positions past the prefix are
        ignored, then overwritten): the session then keys each of them (a radix cache). False
        for a user's step, whose cache may be any function of the row (a running sum).
      zeros_fresh: whether zeros are fresh rows (``cache=None``): the session then passes zeros
        for rows started from the context on the host (see :meth:`DecodingSession._fresh`), so
        one compiled program serves rows from the context and from held caches. False for a
        user's step, whose ``init_cache`` may be anything.
    """

    fn: Callable
    empty_context: Callable[[], PyTree]
    prefix_reuse: bool = False
    zeros_fresh: bool = False


def _split_prompt(model):
    """``(base, prompt)``: the JAX model under a (possibly nested) prompted model."""
    prompt = tuple(getattr(model, "prompt", ()))
    base = getattr(model, "base", None) if prompt or hasattr(model, "prompt") else None
    return (base, prompt) if base is not None else (model, ())


def model_decoder(model) -> Decoder | None:
    """The incremental forward of ``model`` (a JAX model, or a prompted one), or None; None too
    for a wrapper that declares ``incremental = False`` (its rows are not its base's: a
    :class:`~jaxrescore.constraints.ConstrainedModel`)."""
    if getattr(model, "incremental", True) is False:
        return None
    base, _ = _split_prompt(model)
    make = getattr(base, "decoder", None)
    return make() if callable(make) else None


def decoding_context(model) -> Context:
    """The context of ``model`` (BOS plus a prompted model's prompt): computed once per weights
    object, in ONE call whatever the prompt's length, and kept on the (prompted) model. Counted
    in nothing: it is paid once."""
    base, prompt = _split_prompt(model)
    with mesh_context(base.mesh):
        return _context(model, base, prompt)


def _context(model, base, prompt) -> Context:
    params = base._device_params()
    held = getattr(model, "_decode_context", None)
    if held is not None and held[0] is params:
        return held[1]
    dec = model_decoder(model)
    toks = np.asarray((base.bos_id,) + prompt, np.int32)
    n = toks.size
    c = coarse_size(n, MIN_CACHE_LEN)
    block = np.zeros((1, c), np.int32)
    block[0, :n] = toks
    rows, cache = _decode(
        dec.fn, params, block, np.zeros(1, np.int32), np.array([n - 1], np.int32),
        dec.empty_context(), np.int32(0), None, c, None, (),
    )
    out = Context(jax.tree.map(lambda x: x[0], cache), n, to_host(rows)[0].astype(np.float32))
    model._decode_context = (params, out)
    return out
