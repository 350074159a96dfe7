"""Incremental decoding: next-token rows that reuse the key/value caches of their parents.

``model.next_logprobs(prefixes, lengths)`` of a JAX model runs the whole prefix (and a prompt)
through the network for every row. A caller that expands prefixes level by level (a SeekIndex
build, a best-first search, a greedy completion) asks next for the CHILDREN of the prefixes it
just expanded: with the parents' key/value caches kept, a child costs one token position.

:class:`DecodingSession` is that caller-held state, explicit and disposable (no model keeps hidden
caches): ``session.next_logprobs(prefixes, lengths)`` answers like the model and

- a row of length 0 is the context's own row (BOS and, for a prompted model, the prompt: its
  cache is computed ONCE per ``with_prompt`` and kept on the prompted model);
- a row whose parent (the prefix without its last token) this session computed before, and still
  holds, costs one token position: the parent's cache rows are gathered and one step appends;
- any other row is prefilled from the context (one call, every position of the prefix; a model
  whose step takes one token at a time runs a step per position);
- every row computed keeps its cache (keyed by its tokens) until the session's ``max_bytes`` is
  passed; then the oldest calls' caches are dropped first (a level-by-level caller no longer
  needs them), and a child of a dropped parent is prefilled.

Shapes. Rows per call are padded to powers of two (at least ``min_rows``); a row cache holds the
continuation only, ``S`` positions with ``S`` a power of two (>= 8) covering the longest row, so a
level of any depth reuses one of a few compiled shapes; the shared context is one ``C``-position
array, ``C`` a power of two. Rows agree with the full forward to float32 noise (summation order):
tests/test_models_decoding.py checks it.

Models. :class:`~jaxrescore.models.transformer.TransformerLM` and its int8 twin decode with a
shared context (the prompt's keys and values are never copied per row). ``from_apply_fn(...,
init_cache=..., step=...)`` takes a user's cache-aware step in the style of flax decoding
(see :func:`jaxrescore.models.from_apply_fn`); its caches are per row, at full length.
:func:`decoding_session` returns None for a model without an incremental forward (an n-gram is a
table lookup, a callable has no cache); callers then use the model itself.
"""

from __future__ import annotations

import collections
import os
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxrescore.models.checks import check_nan, check_prefixes
from jaxrescore.models.mesh import mesh_context
from jaxrescore.models.scores import clipped_log_softmax as _log_softmax
from jaxrescore.sequences import bucket_size
from jaxrescore.typing import ArrayLike, PyTree

# Smallest power-of-two length of a row cache and of a prefill block.
MIN_CACHE_LEN = 8


def default_cache_bytes() -> int:
    """The default ``max_bytes`` of a session: 1 GiB, or a sixteenth of physical memory if less
    (at least 64 MiB)."""
    cap = 1 << 30
    try:
        phys = int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return cap
    return int(min(cap, max(phys // 16, 64 << 20)))


class Context(NamedTuple):
    """A decoding context: the cache of BOS and a prompt, its length and its own next-token row."""

    cache: PyTree
    length: int
    row: np.ndarray  # float32[V], log-probs after the context


@partial(jax.jit, static_argnums=(0, 8))
def _decode(fn, params, tokens, start, last, ctx, ctx_len, cache, s_out):
    """One incremental call: log-softmax rows float32[B, V] (clipped <= 0) and the new caches."""
    logits, cache = fn(params, tokens, start, last, ctx, ctx_len, cache, s_out)
    return _log_softmax(logits), cache


@jax.jit
def _select(hit, new, old):
    """``new`` where ``hit[b]``, else ``old``, row by row over every leaf."""
    return jax.tree.map(lambda a, b: jnp.where(hit.reshape((-1,) + (1,) * (a.ndim - 1)), a, b), new, old)


@jax.jit
def _gather(cache, idx):
    """Rows ``idx`` of every cache leaf (leading axis: rows)."""
    return jax.tree.map(lambda x: x[idx], cache)


@dataclass(frozen=True)
class StepDecode:
    """Hashable incremental forward from a user's flax-decoding-style pair (see
    :func:`jaxrescore.models.from_apply_fn`): ``step(params, cache, tokens int32[B, 1],
    positions int32[B]) -> (logits[B, 1, V], cache)``, one token per row at absolute position
    ``positions[b]`` (BOS at 0). Row caches are the user's own pytrees (leading axis: rows);
    fresh rows start as copies of the one-row context cache."""

    step: Callable

    def __call__(self, params, tokens, start, last, ctx, ctx_len, cache, s_out):
        if cache is None:
            b = tokens.shape[0]
            cache = jax.tree.map(lambda c: jnp.broadcast_to(c, (b,) + c.shape[1:]), ctx)
        logits, cache = self.step(params, cache, tokens[:, :1], ctx_len + start)
        return logits[:, 0], cache


@dataclass(frozen=True)
class Decoder:
    """A model's incremental forward, for :class:`DecodingSession`.

    Attributes:
      fn: hashable pure ``fn(params, tokens[B, W], start[B], last[B], ctx, ctx_len, cache, s_out)
        -> (logits[B, V], cache)``; ``cache=None`` starts fresh rows from the context.
      multi_token: whether ``fn`` takes ``W > 1`` new tokens per row (else prefills step by step).
      empty_context: the context cache before any token (a pytree of arrays).
      context_len: the positions a context cache can hold (None: grows, powers of two).
    """

    fn: Callable
    multi_token: bool
    empty_context: Callable[[], PyTree]
    context_len: int | None = None


def _split_prompt(model):
    """``(base, prompt)``: the JAX model under a (possibly nested) prompted model."""
    prompt = tuple(getattr(model, "prompt", ()))
    base = getattr(model, "base", None) if prompt or hasattr(model, "prompt") else None
    return (base, prompt) if base is not None else (model, ())


def model_decoder(model) -> Decoder | None:
    """The incremental forward of ``model`` (a JAX model, or a prompted one), or None."""
    base, _ = _split_prompt(model)
    make = getattr(base, "decoder", None)
    return make() if callable(make) else None


def decoding_context(model) -> Context:
    """The context of ``model`` (BOS plus a prompted model's prompt): computed once per weights
    object and kept on the (prompted) model. Counted in nothing: it is paid once."""
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
    if dec.multi_token:
        c = bucket_size(n, MIN_CACHE_LEN)
        block = np.zeros((1, c), np.int32)
        block[0, :n] = toks
        rows, cache = _decode(
            dec.fn, params, block, np.zeros(1, np.int32), np.array([n - 1], np.int32),
            dec.empty_context(), np.int32(0), None, c,
        )
        ctx = jax.tree.map(lambda x: x[0], cache)  # one row: the shared context
    else:
        ctx = dec.empty_context()  # a one-row cache the step extends position by position
        rows = None
        for j in range(n):
            rows, ctx = _decode(
                dec.fn, params, toks[None, j : j + 1], np.full(1, j, np.int32), np.zeros(1, np.int32),
                None, np.int32(0), ctx, 0,
            )
    out = Context(ctx, n, np.asarray(rows)[0].astype(np.float32))
    model._decode_context = (params, out)
    return out


class DecodingSession:
    """``next_logprobs`` of a JAX model that reuses the caches of the prefixes it computed (see
    the module docstring). Build with :func:`decoding_session`.

    Attributes:
      model: the model answered for (a JAX model or a prompted one).
      vocab_size, eos, max_len: the model's.
      max_bytes: the most bytes of row caches held; the oldest are dropped past it (0: none kept).
      positions: token positions computed (each cached row 1, each prefilled row its length).
      rows: rows answered; ``extended``: rows answered from a held parent cache; ``calls``:
        device calls made.
      nbytes: bytes of row caches held now.
    """

    def __init__(self, model: Any, *, max_bytes: int | None = None):
        dec = model_decoder(model)
        if dec is None:
            raise TypeError(f"{type(model).__name__} has no incremental forward (see decoding_session)")
        self.model = model
        self._base, self._prompt = _split_prompt(model)
        self._dec = dec
        self.vocab_size, self.eos, self.max_len = int(model.vocab_size), model.eos, int(model.max_len)
        self.max_bytes = default_cache_bytes() if max_bytes is None else int(max_bytes)
        self.positions = self.rows = self.extended = self.calls = 0
        self.nbytes = 0
        self._where: dict[bytes, tuple[int, int]] = {}  # prefix key -> (slab id, row)
        self._slabs: collections.OrderedDict = collections.OrderedDict()  # id -> (cache, s, nbytes, keys)
        self._next_id = 0
        self._params = None

    def __repr__(self) -> str:
        return f"DecodingSession({self.model!r}, held={len(self._where)} prefixes, {self.nbytes:,} bytes)"

    @property
    def score_tolerance(self):
        return getattr(self.model, "score_tolerance", None)

    def clear(self) -> None:
        """Drop every held cache."""
        self._where.clear()
        self._slabs.clear()
        self.nbytes = 0

    def next_logprobs(self, prefixes: ArrayLike, lengths: ArrayLike) -> np.ndarray:
        """``float32[B, V]``: log-softmax next-token rows after each prefix, as the model's own
        ``next_logprobs`` (to float32 noise), reusing held parent caches.

        Args:
          prefixes: int32[B, T]; row ``b`` holds a prefix in its first ``lengths[b]`` positions.
          lengths: int32[B], each in ``[0, max_len - 1]``.
        """
        batch = check_prefixes(prefixes, lengths, self.vocab_size, self.max_len)
        with mesh_context(self._base.mesh):
            return self._rows(batch)

    def _rows(self, batch) -> np.ndarray:
        toks, lens = batch
        n = batch.size
        out = np.empty((n, self.vocab_size), np.float32)
        if n == 0:
            return out
        base = self._base
        params = base._device_params()
        if self._params is not params:  # new weights: held caches are stale
            self.clear()
            self._params = params
        ctx = decoding_context(self.model)
        self.rows += n
        zero = lens == 0
        out[zero] = ctx.row
        keys = _keys(toks, lens)
        parents = _keys(toks, np.maximum(lens - 1, 0))
        fresh, by_slab, prefill = [], collections.defaultdict(list), []
        for i in np.flatnonzero(~zero).tolist():
            if lens[i] == 1:
                fresh.append(i)
                continue
            at = self._where.get(parents[i])
            if at is None:
                prefill.append(i)
            else:
                by_slab[at[0]].append((i, at[1]))
        pending = []  # (batch rows, device rows)
        step_rows = base._chunk(MIN_CACHE_LEN)
        if fresh:
            for lo in range(0, len(fresh), step_rows):
                idx = np.asarray(fresh[lo : lo + step_rows])
                pending.append(self._extend(idx, toks, lens, ctx, params, None, 0, keys))
        for slab_id, members in by_slab.items():
            cache, s_in = self._slabs[slab_id][:2]
            for lo in range(0, len(members), step_rows):
                part = members[lo : lo + step_rows]
                idx = np.asarray([i for i, _ in part])
                rows_in = np.asarray([r for _, r in part], np.int32)
                pending.append(self._extend(idx, toks, lens, ctx, params, (cache, rows_in), s_in, keys))
        if prefill:
            pending += self._prefill(np.asarray(prefill), toks, lens, ctx, params, keys)
        for idx, rows in pending:
            out[idx] = np.asarray(rows)[: idx.size]
        self._evict()
        check_nan(self.model, out, None, "next_logprobs (incremental)")
        return out

    # -- calls ------------------------------------------------------------------------------------

    def _pad_rows(self, m: int) -> int:
        return self._base._rows_bucket(m)

    def _extend(self, idx, toks, lens, ctx, params, parent, s_in, keys):
        """Rows ``idx`` one position past their parents (held caches, or the context when
        ``parent`` is None)."""
        m = idx.size
        b = self._pad_rows(m)
        put = self._base._put
        tokens = np.zeros((b, 1), np.int32)
        start = np.zeros(b, np.int32)
        tokens[:m, 0] = toks[idx, lens[idx] - 1]
        start[:m] = lens[idx] - 1
        s_out = max(s_in, bucket_size(int(lens[idx].max()), MIN_CACHE_LEN))
        cache = None
        if parent is not None:
            pidx = np.zeros(b, np.int32)
            pidx[:m] = parent[1]
            cache = _gather(parent[0], put(pidx))
        rows, new = _decode(
            self._dec.fn, params, put(tokens), put(start), put(np.zeros(b, np.int32)), ctx.cache,
            np.int32(ctx.length), cache, s_out,
        )
        self.calls += 1
        self.positions += m
        self.extended += m if parent is not None else 0
        self._hold(new, s_out, [keys[i] for i in idx.tolist()])
        return idx, rows

    def _prefill(self, idx, toks, lens, ctx, params, keys):
        """Rows ``idx`` computed from the context: every position of each prefix."""
        out = []
        put = self._base._put
        longest = int(lens[idx].max())
        w = bucket_size(longest, MIN_CACHE_LEN)
        per = self._base._chunk(w) if self._dec.multi_token else self._base._chunk(MIN_CACHE_LEN)
        for lo in range(0, idx.size, per):
            part = idx[lo : lo + per]
            m = part.size
            b = self._pad_rows(m)
            block = np.zeros((b, w), np.int32)
            width = min(w, toks.shape[1])
            block[:m, :width] = np.where(np.arange(width)[None, :] < lens[part][:, None], toks[part, :width], 0)
            last = np.zeros(b, np.int32)
            last[:m] = lens[part] - 1
            self.positions += int(lens[part].sum())
            if self._dec.multi_token:
                rows, new = _decode(
                    self._dec.fn, params, put(block), put(np.zeros(b, np.int32)), put(last), ctx.cache,
                    np.int32(ctx.length), None, w,
                )
                self.calls += 1
            else:  # one position per call; each row's answer is read at its own last position
                cache = rows = new = None
                for j in range(int(lens[part].max())):
                    rows_j, cache = _decode(
                        self._dec.fn, params, put(block[:, j : j + 1]), put(np.full(b, j, np.int32)),
                        put(np.zeros(b, np.int32)), ctx.cache, np.int32(ctx.length), cache, w,
                    )
                    self.calls += 1
                    if rows is None:
                        rows, new = rows_j, cache
                    else:  # a row's cache is the one after its own last token (a step may be
                        # any function of the cache, e.g. a running sum, not only a write)
                        rows, new = _select(put(last == j), (rows_j, cache), (rows, new))
            self._hold(new, w, [keys[i] for i in part.tolist()])
            out.append((part, rows))
        return out

    # -- the held caches --------------------------------------------------------------------------

    def _hold(self, cache, s: int, keys: list) -> None:
        if self.max_bytes <= 0:
            return
        nbytes = int(sum(x.nbytes for x in jax.tree.leaves(cache)))
        slab = self._next_id
        self._next_id += 1
        self._slabs[slab] = (cache, s, nbytes, keys)
        self.nbytes += nbytes
        for row, key in enumerate(keys):
            self._where[key] = (slab, row)

    def _evict(self) -> None:
        """Drop the oldest calls' caches while more than ``max_bytes`` are held."""
        while self.nbytes > self.max_bytes and self._slabs:
            slab, (_, _, nbytes, keys) = self._slabs.popitem(last=False)
            self.nbytes -= nbytes
            for key in keys:
                if self._where.get(key, (None,))[0] == slab:
                    del self._where[key]


def _keys(toks: np.ndarray, lens: np.ndarray) -> list:
    """Hashable keys (the bytes of the int32 tokens) of each row's first ``lens[b]`` tokens."""
    out: list = [b""] * toks.shape[0]
    for length in np.unique(lens).tolist():
        if length == 0:
            continue
        idx = np.flatnonzero(lens == length)
        block = np.ascontiguousarray(toks[idx, :length], dtype=np.int32)
        raw = block.view(np.dtype((np.void, 4 * length))).ravel().tolist()
        for i, key in zip(idx.tolist(), raw):
            out[i] = key
    return out


def decoding_session(model: Any, *, max_bytes: int | None = None) -> DecodingSession | None:
    """A :class:`DecodingSession` over ``model`` when it decodes incrementally (a TransformerLM,
    its int8 twin, a ``from_apply_fn`` model given ``init_cache``/``step``, or a prompted
    model of one), else None.

    Args:
      model: any model.
      max_bytes: the most bytes of row caches to hold (None: :func:`default_cache_bytes`).
    """
    try:
        if model_decoder(model) is None:
            return None
    except Exception:  # a foreign object that merely has a "decoder" attribute
        return None
    return DecodingSession(model, max_bytes=max_bytes)


def incremental(model: Any, *, max_bytes: int | None = None) -> Any:
    """A fresh :class:`DecodingSession` over ``model`` when it has one, else ``model`` itself:
    what a level-by-level caller expands with."""
    session = decoding_session(model, max_bytes=max_bytes)
    return model if session is None else session
