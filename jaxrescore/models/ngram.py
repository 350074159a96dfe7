"""NGramLM: an interpolated Kneser-Ney n-gram model with batched, vectorised lookups.

Smoothing (Chen & Goodman's interpolated Kneser-Ney), for a context ``h`` of ``k`` tokens:

    P_k(w | h) = max(c_k(h w) - D_k, 0) / c_k(h .)  +  gamma(h) * P_{k-1}(w | h'),

where ``h'`` drops the oldest token of ``h``, ``gamma(h)`` is the mass the discounts freed
(``D_k * N1+(h .) / c_k(h .)`` when every count is at least ``D_k``), ``c_{order-1}`` are the
(weighted) n-gram counts and lower orders use continuation counts (the number of distinct tokens
seen to the left). ``P_{-1}`` is uniform over the ``V`` tokens, so every log-prob is finite. A
context never seen at order ``k`` backs off to ``P_{k-1}``. Contexts are left-padded with a BOS
symbol (id ``V``), so sequence starts are their own contexts.

Storage: one float32 table ``[R, V]`` (a JAX array) of full next-token log-prob rows, one row per
context seen at any order (R = contexts of all orders; memory ``R * V * 4`` bytes), plus sorted
int64 context keys per order on the host. A lookup finds, for every query at once, the longest
seen suffix of its context by ``np.searchsorted``, then gathers rows on the device.
"""

from __future__ import annotations

import numbers
from functools import partial
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from jaxrescore.models.base import check_int, check_support, check_weights
from jaxrescore.models.frontier import TABLE_TOLERANCE
from jaxrescore.models.jax_lm import DeviceBatched, check_eos_terminated, check_mesh, check_prefixes, check_tokens
from jaxrescore.sequences import SequenceBatch, as_sequence_batch, bucket_size
from jaxrescore.typing import ArrayLike, Sequences


@jax.jit
def _gather_steps(table, rows, targets):
    """float32[N, T]: ``table[rows, targets]``."""
    return table[rows, targets]


@jax.jit
def _gather_rows(table, rows):
    """float32[..., V]: ``table[rows]``."""
    return table[rows]


@partial(jax.jit, static_argnums=1)
def _table_top_m(table, m):
    """Each table row's ``m`` largest log-probs float32[R, m] and their ids int32[R, m]."""
    vals, ids = jax.lax.top_k(table, m)
    return vals, ids.astype(jnp.int32)


def _encode(windows: np.ndarray, base: int) -> np.ndarray:
    """int64 keys of token windows ``[..., k]`` in base ``base`` (oldest token most significant)."""
    key = np.zeros(windows.shape[:-1], np.int64)
    for j in range(windows.shape[-1]):
        key = key * base + windows[..., j]
    return key


def _discount(counts: np.ndarray, discount) -> float:
    if discount is not None:
        return float(discount)
    # Ney's estimate D = n1 / (n1 + 2 n2) from the counts-of-counts of this order.
    n1 = np.count_nonzero(np.isclose(counts, 1.0))
    n2 = np.count_nonzero(np.isclose(counts, 2.0))
    return n1 / (n1 + 2 * n2) if n1 and n2 else 0.75


class NGramLM(DeviceBatched):
    """Interpolated Kneser-Ney n-gram LM (build with :meth:`fit`).

    Attributes:
      vocab_size, eos, max_len: the protocol attributes.
      order: n (contexts of ``order - 1`` tokens).
      discounts: ``D_k`` per context length ``k = 0..order-1``.
      params: the float32 log-prob table ``[R, V]`` (a JAX array).
      mesh: optional ``jax.sharding.Mesh`` sharding the batch axis of lookups.
    """

    chunk_tokens = 1 << 20  # a gather has no activations to keep in cache: few big calls
    score_tolerance = TABLE_TOLERANCE  # a context's row is the same table row in every batch

    def __init__(
        self,
        table: ArrayLike,
        context_keys: Sequence[ArrayLike],
        *,
        order: int,
        vocab_size: int,
        eos: int | None,
        max_len: int,
        discounts: Sequence[float],
        mesh: Mesh | None = None,
    ):
        # log(p) of a float64 p that rounds above 1 is a hair above 0: clip (every model does).
        self.params = jnp.asarray(np.minimum(np.asarray(table, np.float32), 0.0))
        self._top_m = {}  # m -> host (values float32[R, m], ids int32[R, m])
        self._keys = [np.asarray(k, np.int64) for k in context_keys]
        self._offsets = np.cumsum([0] + [k.size for k in self._keys])[:-1]
        self.order = check_int(order, "order", minimum=1)
        self.vocab_size, self.eos, self.max_len = check_support(vocab_size, eos, max_len, "NGramLM")
        if self.params.ndim != 2 or self.params.shape[1] != self.vocab_size:
            raise ValueError(f"table must be float[R, vocab_size={self.vocab_size}], got shape {self.params.shape}")
        if len(self._keys) != self.order or sum(k.size for k in self._keys) != self.params.shape[0]:
            raise ValueError(
                f"context_keys must hold {self.order} arrays (one per order) with one key per table "
                f"row ({self.params.shape[0]}), got {len(self._keys)} arrays of {sum(k.size for k in self._keys)} keys"
            )
        self.discounts = tuple(float(d) for d in discounts)
        self.mesh = check_mesh(mesh)
        self._placed = None

    def __repr__(self) -> str:
        return (
            f"NGramLM(order={self.order}, V={self.vocab_size}, eos={self.eos}, "
            f"max_len={self.max_len}, contexts={int(self.params.shape[0])})"
        )

    # ---- fitting ----------------------------------------------------------------------------

    @classmethod
    def fit(
        cls,
        sequences: Sequences,
        *,
        order: int = 3,
        vocab_size: int,
        eos: int | None = None,
        max_len: int | None = None,
        discount: float | None = 0.75,
        weights: ArrayLike | None = None,
        mesh: Mesh | None = None,
    ) -> "NGramLM":
        """Fit counts from a corpus (vectorised numpy; 100k short sequences take about a second).

        Args:
          sequences: the corpus, in the model's support: a SequenceBatch or list of token
            sequences; with ``eos`` every sequence ends with ``eos`` (and has no other eos);
            without it every sequence has exactly ``max_len`` tokens.
          order: n >= 1 (1 = unigram).
          vocab_size: V; tokens lie in ``[0, V)``.
          eos: end-of-sequence id, or None for fixed-length sequences.
          max_len: the longest sequence in the support (default: the longest in the corpus).
          discount: ``D`` in ``(0, 1]`` for every order, or None for Ney's per-order estimate
            ``n1 / (n1 + 2 n2)`` (meaningful for integer counts).
          weights: optional non-negative float[N]: how often each sequence occurs.
          mesh: optional ``jax.sharding.Mesh`` for data-parallel lookups.
        """
        batch, w, max_len = _check_corpus(sequences, order, vocab_size, eos, max_len, discount, weights)
        base = vocab_size + 1
        k_top = order - 1
        # Every step's n-gram: the k_top tokens before it (BOS-padded) and the token itself.
        padded = np.full((batch.size, k_top + batch.tokens.shape[1]), vocab_size, np.int64)
        padded[:, k_top:] = batch.tokens
        windows = np.lib.stride_tricks.sliding_window_view(padded, order, axis=1)
        real = batch.mask & (w[:, None] > 0)
        grams, inverse = np.unique(_encode(windows[real], base), return_inverse=True)
        counts = np.bincount(inverse.reshape(-1), np.broadcast_to(w[:, None], real.shape)[real])

        levels = [None] * order  # per context length k: (n-gram keys, counts)
        levels[k_top] = (grams, counts)
        for k in range(k_top - 1, -1, -1):
            # Continuation counts: distinct left extensions of each shorter n-gram type.
            shorter, cont = np.unique(levels[k + 1][0] % base ** (k + 1), return_counts=True)
            levels[k] = (shorter, cont.astype(np.float64))

        tables, keys, discounts = [], [], []
        lower = np.full((1, vocab_size), 1.0 / vocab_size)
        lower_keys = np.zeros(1, np.int64)
        for k in range(order):
            grams, counts = levels[k]
            d = _discount(counts, discount)
            ctx, ctx_idx = np.unique(grams // base, return_inverse=True)
            total = np.bincount(ctx_idx, counts, minlength=ctx.size)
            kept = np.maximum(counts - d, 0.0) / total[ctx_idx]
            rows = np.zeros((ctx.size, vocab_size))
            rows[ctx_idx, grams % base] = kept
            gamma = 1.0 - np.bincount(ctx_idx, kept, minlength=ctx.size)
            # A seen context's suffix is always seen one order down (it has a continuation).
            suffix = np.searchsorted(lower_keys, ctx % base ** (k - 1) if k else np.zeros_like(ctx))
            rows += gamma[:, None] * lower[suffix]
            tables.append(rows)
            keys.append(ctx)
            discounts.append(d)
            lower, lower_keys = rows, ctx
        table = np.log(np.concatenate(tables)).astype(np.float32)
        return cls(
            table, keys, order=order, vocab_size=vocab_size, eos=eos, max_len=max_len,
            discounts=discounts, mesh=mesh,
        )

    # ---- lookups ----------------------------------------------------------------------------

    def _rows(self, windows: np.ndarray) -> np.ndarray:
        """int32[...] table rows for context windows ``int64[..., order-1]`` (BOS-padded):
        the row of the longest suffix seen in training."""
        base = self.vocab_size + 1
        k_top = self.order - 1
        rows = np.full(windows.shape[:-1], -1, np.int64)
        for k in range(k_top, -1, -1):
            keys = self._keys[k]
            q = _encode(windows[..., k_top - k :], base)
            idx = np.minimum(np.searchsorted(keys, q), keys.size - 1)
            hit = (keys[idx] == q) & (rows < 0)
            rows[hit] = self._offsets[k] + idx[hit]
        return rows.astype(np.int32)

    def _windows(self, batch: SequenceBatch, width: int) -> np.ndarray:
        """int64[N, width, order-1]: the BOS-padded context before each of positions 0..width-1
        (padding tokens read as 0)."""
        k_top = self.order - 1
        padded = np.full((batch.size, k_top + width), self.vocab_size, np.int64)
        t = min(width, batch.tokens.shape[1])
        padded[:, k_top : k_top + t] = np.where(batch.mask[:, :t], batch.tokens[:, :t], 0)
        return np.lib.stride_tricks.sliding_window_view(padded, k_top, axis=1)[:, :width]

    def _width(self, length: int) -> int:
        return min(bucket_size(max(length, 1), 8), self.max_len)

    def step_logprobs(self, seqs: Sequences) -> tuple[SequenceBatch, np.ndarray]:
        """The batch and ``float32[N, W]``: each token's log-prob given its prefix (padding
        entries meaningless)."""
        batch = as_sequence_batch(seqs)
        check_tokens(batch, self.vocab_size, self.max_len)
        width = self._width(int(batch.lengths.max(initial=0)))
        if batch.size == 0:
            return batch, np.zeros((0, width), np.float32)
        rows = self._rows(self._windows(batch, width))
        targets = np.zeros((batch.size, width), np.int32)
        t = min(width, batch.tokens.shape[1])
        targets[:, :t] = np.where(batch.mask[:, :t], batch.tokens[:, :t], 0)
        return batch, self._chunked(_gather_steps, rows, targets)

    def frontier_stats(
        self, seqs: Sequences, top_m: int
    ) -> tuple[SequenceBatch, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The batch, steps float32[N, W], each position's top-m log-probs float32[N, W, m] and
        ids int32[N, W, m], and eos log-probs float32[N, W]: table lookups, the top-m of each table
        row computed once per ``top_m``."""
        batch, steps = self.step_logprobs(seqs)
        width = steps.shape[1]
        rows = self._rows(self._windows(batch, width)) if batch.size else np.zeros((0, width), np.int32)
        if top_m not in self._top_m:
            vals, ids = _table_top_m(self.params, top_m)
            self._top_m[top_m] = (np.asarray(vals), np.asarray(ids))
        vals, ids = self._top_m[top_m]
        eos = np.zeros((batch.size, width), np.int32) + (0 if self.eos is None else self.eos)
        eos_lps = self._chunked(_gather_steps, rows, eos) if batch.size else np.zeros((0, width), np.float32)
        return batch, steps, vals[rows], ids[rows], eos_lps

    def position_logprobs(self, seqs: Sequences) -> tuple[SequenceBatch, np.ndarray]:
        """The batch and ``float32[N, W, V]``: next-token log-probs before each position."""
        batch = as_sequence_batch(seqs)
        check_tokens(batch, self.vocab_size, self.max_len)
        width = self._width(int(batch.lengths.max(initial=0)))
        if batch.size == 0:
            return batch, np.zeros((0, width, self.vocab_size), np.float32)
        return batch, self._chunked(_gather_rows, self._rows(self._windows(batch, width)))

    def next_logprobs(self, prefixes: ArrayLike, lengths: ArrayLike) -> np.ndarray:
        """``float32[B, V]`` log-prob rows after each prefix.

        Args:
          prefixes: int32[B, T], left-aligned prefixes.
          lengths: int32[B], each in ``[0, max_len - 1]``.
        """
        batch = check_prefixes(prefixes, lengths, self.vocab_size, self.max_len)
        prefixes, lengths = batch
        if batch.size == 0:
            return np.zeros((0, self.vocab_size), np.float32)
        k_top = self.order - 1
        padded = np.full((batch.size, k_top + prefixes.shape[1]), self.vocab_size, np.int64)
        padded[:, k_top:] = np.where(batch.mask, prefixes, 0)
        window = np.take_along_axis(padded, lengths[:, None] + np.arange(k_top)[None, :], axis=1)
        return self._chunked(_gather_rows, self._rows(window))


def _check_corpus(sequences, order, vocab_size, eos, max_len, discount, weights):
    order = check_int(order, "order", minimum=1)
    vocab_size = check_int(vocab_size, "vocab_size", minimum=1)
    eos = check_int(eos, "eos", minimum=0, maximum=vocab_size, allow_none=True)
    max_len = check_int(max_len, "max_len", minimum=1, allow_none=True)
    if (vocab_size + 1) ** order >= 2**62:
        raise ValueError(
            f"(vocab_size + 1) ** order = {vocab_size + 1}**{order} overflows the int64 context keys"
        )
    if discount is not None and (
        isinstance(discount, (bool, np.bool_))
        or not isinstance(discount, numbers.Real)
        or not 0.0 < float(discount) <= 1.0
    ):
        raise ValueError(f"discount must be a number in (0, 1] or None, got {discount!r}")
    batch = as_sequence_batch(sequences)
    if batch.size == 0:
        raise ValueError("sequences is empty; fitting needs at least one sequence")
    longest = int(batch.lengths.max())
    max_len = longest if max_len is None else max_len
    check_tokens(batch, vocab_size, max_len, what="sequences")
    if eos is None:
        wrong = np.flatnonzero(batch.lengths != max_len)
        if wrong.size:
            raise ValueError(
                f"sequences[{wrong[0]}] has length {batch.lengths[wrong[0]]}; a fixed-length model "
                f"(eos=None) needs every sequence to have max_len={max_len} tokens"
            )
    else:
        check_eos_terminated(batch, eos, "sequences")
    return batch, check_weights(weights, batch.size), max_len

