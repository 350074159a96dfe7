"""The frontier bound: a proof of top-k from the target's own next-token distributions.

Let P be the scored sequences and T the trie of their prefixes (the root is the empty prefix, or
the prompt of a prompted target). Any sequence u of the target's support that is not in P leaves T
at a node p (a prefix of a scored sequence) through a token t with p+t not in T. Every later step
of u has log-prob <= 0, so::

    target(u) <= target(p) + log p_target(t | p).

The *frontier bound* F is the max of that right-hand side over every exit (p, t) that can still
reach the support. If the worst returned target score clears F by the target's score tolerance,
no unpulled sequence can displace a returned item: the answer is the target's exact top-k (or
slice), with no assumption about the draft.

Which exits count (the target's support decides, never the draft's):

- a node is *live* when a support sequence can extend it: shorter than ``max_len`` and, for a
  terminating target, free of ``eos``; complete sequences and prefixes past ``eos`` have no exits;
- at a live node of length ``max_len - 1`` of a terminating target only ``eos`` leads into the
  support, so only the eos exit counts there; everywhere else every token not already a child is
  an exit (``eos`` included: ``p + eos`` is itself a complete sequence);
- the forward gives, per position, the top-m log-probs with ids: non-child tokens among them are
  exits with exact values, and every token outside them has log-prob <= the smallest of them, one
  "rest" exit (token -1) with that value (unless ``m >= V``). A node whose full row was fetched
  has exact exits for every token instead;
- a live node with no distribution at all (a leaf that is not a complete sequence, e.g. a pulled
  sequence cut before a token outside the target's vocabulary) gets a rest exit worth
  ``target(p)`` itself;
- a node that is itself a complete sequence of the target's support but was never scored AS
  itself (a longer draft sequence the target reads only up to its ``max_len`` or its first
  ``eos``) is an exit too: token :data:`COMPLETE`, worth ``target(p)``.

The trie is built from each scored sequence AS THE TARGET READS IT (its *view*: cut at the
target's ``max_len``, after its first ``eos``, and before its first token outside the target's
vocabulary), never from the draft's sequences: the draft's tokens past a cut are no prefixes of
the target's support.

The assumptions, all of them, about the target (checked at query time by
:mod:`jaxrescore.rescore.assumptions` and :func:`frontier`, or refused; a search's scored set runs
the row checks on each block of rows once, as it adds it):

1. its support is :class:`~jaxrescore.models.base.Structure`: token ids in ``[0, vocab_size)`` (``None``: not known,
   e.g. an inferred vocabulary, then every node keeps its rest exit), sequences of exactly
   ``max_len`` tokens (no ``eos``) or ending at their first ``eos`` within ``max_len``;
2. a sequence's score is the sum of its step log-probs, and each step read from a position's
   distribution is ``<= 0`` (clipped: a log-softmax can return ``+1e-7``);
3. the m values named at a position are its m largest: every other token has log-prob at most
   the smallest of them (read as the minimum, so their order is not assumed);
4. one prefix's numbers agree between forwards within the target's ``score_tolerance``: where
   the scored set holds the same prefix more than once (two scored sequences sharing it, two
   rounds, a fetched full row), the largest difference seen is :attr:`Frontier.moved`, and a
   proof needs it within the tolerance (the search stops with the reason otherwise);
5. for a target that decodes incrementally, the numbers read from its cached path (a
   :class:`~jaxrescore.models.decoding.DecodingSession` over held key/value caches, see
   :mod:`jaxrescore.rescore.reuse`) are within ``score_tolerance`` of its full forward
   (``score_frontier`` of the row): every exit's value from the full forward is at most its
   cached value plus the tolerance, and so is every scored sequence's score. The verdict compares
   the worst returned score, which is ALWAYS its full forward's, with the best exit bound, read
   from cached rows: ``worst_full >= bound_cached + tolerance >= bound_full`` is the proof.
   Checked at query time where a full forward exists: before a verdict or a returned score rests
   on them, the answer's cached rows and every cached row within the tolerance below its worst
   score are forwarded in full (:meth:`~jaxrescore.rescore.scored.ScoredSet.unchecked`; their
   scores become the full forward's), topped up with the best other cached rows until as many
   rows as the answer holds have been checked (a search's first call is the full forward itself
   where the target packs rows, see :meth:`~jaxrescore.models.decoding.DecodingSession.packed_force`,
   so an answer may hold few cached rows while the bound rests on cached exits). The largest
   disagreement with their cached numbers (node scores along them, each position's largest named
   log-prob and eos log-prob) is :attr:`~jaxrescore.rescore.scored.ScoredSet.drift`; a proof
   needs it within the tolerance. Exits at nodes on no checked row are not forwarded again:
   their drift is assumed no larger than the sample's.

It is ONE fixed-shape algorithm over the padded scored set (:func:`frontier_values`), written
over an array namespace: numpy on the host (a search's rounds: no compile, numpy's fast sort) and
``jax.numpy`` under ``jax.jit`` and ``jax.vmap`` (:func:`frontier_bound`: a sweep's queries in
one call). The trie is the sorted views' longest common prefixes; each node's exits are read at
its first occurrence in sorted order, so nothing loops per node in Python.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxrescore.models.base import Structure
from jaxrescore.rescore.assumptions import check_rows, check_structure, top_max_of

REST = -1
"""Token id of an exit standing for every token outside a node's known top-m."""
COMPLETE = -2
"""Token id of an exit that is its node itself: a complete support sequence never scored as such."""


def view_lengths(tokens: np.ndarray, lengths: np.ndarray, structure: Structure) -> np.ndarray:
    """int64[N]: how much of each padded sequence ``tokens: int[N, T]`` (``lengths: int[N]``) the
    target reads, its *view*: cut at ``max_len``, before its first token outside ``[0,
    vocab_size)`` and after its first ``eos``."""
    n, width = tokens.shape
    cut = np.minimum(np.asarray(lengths, np.int64), structure.max_len)
    if width == 0 or n == 0:
        return cut
    cols = np.arange(width)[None, :]
    inside = cols < cut[:, None]
    bad = inside & (tokens < 0)
    if structure.vocab_size is not None:
        bad |= inside & (tokens >= structure.vocab_size)
    cut = np.where(bad.any(axis=1), np.argmax(bad, axis=1), cut)
    if structure.eos is not None:
        at = (cols < cut[:, None]) & (tokens == structure.eos)
        cut = np.where(at.any(axis=1), np.argmax(at, axis=1) + 1, cut)
    return cut


def complete(tokens: np.ndarray, lengths: np.ndarray, structure: Structure) -> np.ndarray:
    """bool[N]: whether each padded view (``tokens: int[N, T]``, ``lengths: int[N]``, as
    :func:`view_lengths` cuts them) is a whole sequence of the target's support."""
    lengths = np.asarray(lengths, np.int64)
    if structure.eos is None:
        return lengths == structure.max_len
    last = tokens[np.arange(lengths.size), np.maximum(lengths - 1, 0)] if tokens.shape[1] else np.zeros(0)
    return (lengths > 0) & (last == structure.eos)


class ScoredArrays(NamedTuple):
    """The scored set as padded arrays (row ``i`` is scored sequence ``i`` as the target reads it:
    its view, :func:`view_lengths`); a pytree, so a batch of them (a leading query axis) vmaps.

    Attributes:
      tokens: int[N, L], the views, padded with -1 (``L >= 1``).
      lengths: int[N], the views' lengths: positions ``< lengths[i]`` of row ``i`` have a
        distribution (the forward row was the view).
      whole: bool[N], whether scored sequence ``i`` is its view (its score is the view's score;
        otherwise the sequence scored -inf and its view, if complete, is an unscored exit).
      steps: float64[N, L], per-step target log-probs (<= 0; 0 past a row's length).
      top_lps: float32[N, L, m], top_ids: int32[N, L, m], eos_lps: float32[N, L]: per position.
      row_prefixes: int[R, L], prefixes whose full next-token row was fetched (padded with -1).
      row_lengths: int[R], their lengths (-1: a padding row).
      row_values: float32[R, V], the fetched rows.
      top_max: float32[N, L] or None: ``top_lps.max(axis=2)`` (NaN where any is), kept by a
        scored set that grows round by round so its frontier does not reduce every row's
        ``[L, m]`` names again each round; None: computed from ``top_lps`` where it is read.
    """

    tokens: Any
    lengths: Any
    whole: Any
    steps: Any
    top_lps: Any
    top_ids: Any
    eos_lps: Any
    row_prefixes: Any
    row_lengths: Any
    row_values: Any
    top_max: Any = None


class Exits(NamedTuple):
    """Exits from the trie: the prefix is ``tokens[seq[e], :depth[e]]``, the token ``token[e]``
    (:data:`REST` for "any token outside the known top-m", :data:`COMPLETE` for the node
    itself), and ``value[e]`` bounds the target score of every support sequence leaving the trie
    there (float64)."""

    seq: np.ndarray
    depth: np.ndarray
    token: np.ndarray
    value: np.ndarray


class ExitValues(NamedTuple):
    """Every exit's bound as fixed-shape arrays in the SORTED row order ``perm`` (``-inf``: no
    exit there), from :func:`frontier_values`.

    Attributes:
      perm: int[N], sorted position -> scored row.
      node: int[N, L + 1], the trie node of each sorted row's prefix of each depth (-1: none).
      lengths: int[N], each sorted row's length (-1: not a row of the query).
      at_row, at_depth: int[K], the (sorted row, depth) where each node with a distribution has
        its exits read (its first occurrence with one; under JAX every position, K = N * L, the
        others holding -inf).
      top: float64[K, m], the top-m named exits there; ``top_ids`` int[K, m] their tokens.
      rest: float64[K], the exit standing for every token outside the top-m.
      eos: float64[K], the eos exit of a node one short of ``max_len``.
      blind: float64[N], a live leaf without any distribution: bounded by its own score.
      complete: float64[N], a whole support sequence the target scored only inside a longer one.
      rows: float64[R, V], exact exits of nodes whose full row was fetched.
      row_nodes: int[R], each fetched row's node (-1: not in the trie); ``row_at`` a sorted row
        holding it and ``row_depth`` its depth.
    """

    perm: Any
    node: Any
    lengths: Any
    at_row: Any
    at_depth: Any
    top: Any
    top_ids: Any
    rest: Any
    eos: Any
    blind: Any
    complete: Any
    rows: Any
    row_nodes: Any
    row_at: Any
    row_depth: Any


class _Ops(NamedTuple):
    """The few operations numpy and jax.numpy spell differently."""

    xp: Any
    sort_rows: Any  # (keys: list of int[N], primary first) -> int[N] permutation
    cummax0: Any  # running max down axis 0
    seg_max: Any  # (values, segment ids, n) -> per-segment max (-inf / lowest where empty)
    seg_min: Any
    fori: Any  # (n, body(i, carry) -> carry, carry) -> carry: a loop, one compiled body under JAX
    where_true: Any  # bool[N, L] -> (rows, depths, ok): the True cells (numpy), or every cell and the mask
    mark: Any  # (shape (K, m), rows int[E] (-1: none), hits bool[E, m]) -> bool[K, m]: hits OR'ed into their rows


def _np_fori(n, body, carry):
    for i in range(n):
        carry = body(i, carry)
    return carry


def _np_seg(op, fill):
    def seg(values, ids, n):
        out = np.full(n + 1, fill, dtype=np.result_type(values, np.float64) if fill in (np.inf, -np.inf) else values.dtype)
        op.at(out, np.asarray(ids).ravel(), np.asarray(values).ravel())
        return out[:n]

    return seg


def _np_mark(shape, rows, hits):
    out = np.zeros(shape, bool)
    e, col = np.nonzero(hits & (rows >= 0)[:, None])
    out[rows[e], col] = True
    return out


_NP = _Ops(
    np,
    lambda keys: np.lexsort(keys[::-1]),
    lambda a: np.maximum.accumulate(a, axis=0),
    _np_seg(np.maximum, -np.inf),
    _np_seg(np.minimum, np.inf),
    _np_fori,
    lambda mask: (*np.nonzero(mask), np.ones(int(mask.sum()), bool)),
    _np_mark,
)


def _jax_sort_rows(keys):
    n = keys[0].shape[0]
    return jax.lax.sort((*keys, jnp.arange(n)), num_keys=len(keys))[-1]


_JAX = _Ops(
    jnp,
    _jax_sort_rows,
    lambda a: jax.lax.cummax(a, axis=0),
    lambda v, ids, n: jax.ops.segment_max(v.ravel(), ids.ravel(), num_segments=n + 1)[:n],
    lambda v, ids, n: jax.ops.segment_min(v.ravel(), ids.ravel(), num_segments=n + 1)[:n],
    lambda n, body, carry: jax.lax.fori_loop(0, n, body, carry),
    lambda mask: (jnp.repeat(jnp.arange(mask.shape[0]), mask.shape[1]), jnp.tile(jnp.arange(mask.shape[1]), mask.shape[0]),
                  mask.reshape(-1)),
    lambda shape, rows, hits: jnp.zeros(shape, bool).at[jnp.where(rows >= 0, rows, shape[0])].max(hits, mode="drop"),
)


def _gap(xp, a, b):
    """``|a - b|`` where two equal values (two -inf included) differ by 0 and -inf against a
    number by ``inf``."""
    same = a == b
    return xp.where(same, 0.0, xp.abs(xp.where(same, 0.0, a) - xp.where(same, 0.0, b)))


def _lex_lower_bound(ops: "_Ops", rows, n_rows, keys):
    """For each key of ``keys: int[R, L]``, the first of the sorted ``rows: int[N, L]`` (the
    first ``n_rows`` count) that is ``>=`` it lexicographically (binary search, fixed steps)."""
    xp = ops.xp
    n = rows.shape[0]

    def step(_, bounds):
        lo, hi = bounds
        mid = (lo + hi) // 2
        row = rows[xp.clip(mid, 0, n - 1)]
        diff = row != keys
        first = xp.argmax(diff, axis=1)[:, None]
        less = xp.any(diff, axis=1) & (xp.take_along_axis(row, first, axis=1)[:, 0]
                                      < xp.take_along_axis(keys, first, axis=1)[:, 0])
        active = lo < hi
        return xp.where(active & less, mid + 1, lo), xp.where(active & ~less, mid, hi)

    start = (xp.zeros(keys.shape[0], dtype=np.int64), xp.zeros(keys.shape[0], dtype=np.int64) + n_rows)
    return ops.fori(max(1, int(math.ceil(math.log2(n + 1))) + 1), step, start)[0]


def frontier_values(s: ScoredArrays, valid, vocab, eos, max_len, ops: _Ops = _NP):
    """``(bound, moved, ExitValues)`` of the rows ``valid: bool[N]`` of ``s`` (see the module
    docstring): ``bound`` the frontier bound (``-inf``: no exit, the rows are the target's whole
    support), ``moved`` the largest difference between two forwards' numbers for one prefix.

    ``vocab`` (-1: unknown), ``eos`` (-1: none) and ``max_len`` are the target's
    :class:`Structure` as numbers, so the same code runs with ``ops`` numpy's (host) or JAX's
    (traced: jit- and vmap-safe, fixed shapes, no branch on values; int64 needs ``jax_enable_x64``).
    """
    xp = ops.xp
    inf = xp.inf
    tokens = xp.where(valid[:, None], s.tokens, -1).astype(np.int64)
    lens = xp.where(valid, s.lengths, -1).astype(np.int64)
    n, width = tokens.shape
    m = s.top_ids.shape[2]
    # -- the trie: sort the views, a node is new where a row leaves its predecessor's prefix
    perm = ops.sort_rows([(~valid).astype(np.int64)] + [tokens[:, c] for c in range(width)])
    srt, sl = tokens[perm], lens[perm]
    same = xp.sum(xp.cumprod(srt[1:] == srt[:-1], axis=1), axis=1)
    lcp = xp.concatenate([xp.zeros(1, np.int64), xp.minimum(same, xp.minimum(sl[1:], sl[:-1]))])
    depth = xp.arange(width + 1)
    real = depth[None, :] <= sl[:, None]
    new = real & ((xp.arange(n)[:, None] == 0) | (depth[None, :] > lcp[:, None]))
    ids = xp.cumsum(new.reshape(-1)).reshape(new.shape) - 1
    node = xp.where(real, ops.cummax0(xp.where(new, ids, -1)), -1)  # ids grow down every column
    size = n * (width + 1)
    seg = xp.where(real, node, size)
    # -- node scores (the largest occurrence: the looser bound) and the noise seen between forwards
    steps = s.steps[perm][:, :width].astype(np.float64)
    cum = xp.concatenate([xp.zeros((n, 1)), xp.cumsum(steps, axis=1)], axis=1)
    score = ops.seg_max(cum, seg, size)
    low = ops.seg_min(cum, seg, size)
    moved = xp.max(xp.where(low < inf, _gap(xp, score, low), 0.0))
    dist = depth[None, :width] < sl[:, None]  # positions with a distribution
    dnode = node[:, :width]
    dseg = xp.where(dist, dnode, size)
    # the [N, L, m] top-m arrays are reduced before the sort's permutation and read again only
    # where exits are (a copy of them permuted was a fifth of a wide proof's frontier time)
    eos_lps = s.eos_lps[perm][:, :width].astype(np.float64)
    top_max = top_max_of(s, xp)[:, :width][perm].astype(np.float64)
    best_top = ops.seg_max(top_max, dseg, size)
    for values in (top_max, eos_lps):
        hi, lo = ops.seg_max(values, dseg, size), ops.seg_min(values, dseg, size)
        moved = xp.maximum(moved, xp.max(xp.where(lo < inf, _gap(xp, hi, lo), 0.0)))
    has_dist = ops.seg_max(dist.astype(np.float64), dseg, size) > 0
    # -- children: sorted (node, token) keys of every real step
    rows_v = s.row_values.astype(np.float64)
    top_id_max = xp.max(s.top_ids[:, :width]).astype(np.int64)
    base = xp.maximum(xp.maximum(xp.max(tokens) + 1, top_id_max + 1), xp.maximum(vocab, rows_v.shape[1]))
    base = xp.maximum(base, 1).astype(np.int64)
    big = np.iinfo(np.int64).max
    keys = xp.sort(xp.where(dist, dnode * base + srt[:, :width], big).reshape(-1))

    def is_child(nodes, toks):
        q = nodes * base + toks
        pos = xp.minimum(xp.searchsorted(keys, q), keys.shape[0] - 1)
        return (keys[pos] == q) & (nodes >= 0) & (toks >= 0)

    # -- fetched full rows: the node of each fetched prefix, found by binary search of the views
    rp = s.row_prefixes.astype(np.int64)
    rl = s.row_lengths.astype(np.int64)
    n_valid = xp.sum(valid.astype(np.int64))
    at = _lex_lower_bound(ops, srt, n_valid, rp)
    c = xp.clip(at, 0, n - 1)
    cols = xp.arange(width)[None, :]
    match = (rl >= 0) & (at < n_valid) & (sl[c] >= rl) & xp.all((srt[c] == rp) | (cols >= rl[:, None]), axis=1)
    row_node = xp.where(match, node[c, xp.clip(rl, 0, width)], -1)
    has_eos = xp.any((rp == eos) & (cols < rl[:, None]) & (eos >= 0), axis=1)
    row_live = match & (rl < max_len) & ~has_eos
    fetched = ops.seg_max(row_live.astype(np.float64), xp.where(row_live, row_node, size), size) > 0
    rows_v = xp.minimum(rows_v, 0.0)
    row_best = xp.max(rows_v, axis=1)
    moved = xp.maximum(moved, xp.max(xp.where(row_live & has_dist[row_node], _gap(xp, best_top[row_node], row_best), 0.0),
                                      initial=0.0))
    t = xp.arange(rows_v.shape[1])[None, :]
    row_last = (eos >= 0) & (rl == max_len - 1)
    row_ok = (row_live[:, None] & xp.isfinite(rows_v) & ~is_child(row_node[:, None] + 0 * t, t)
              & (~row_last[:, None] | (t == eos)))
    rows_exit = xp.where(row_ok, score[row_node][:, None] + rows_v, -inf)
    # -- top-m, rest and eos exits at each node's first occurrence with a distribution
    # a node's occurrences are adjacent in sorted order, those ending there (padding sorts first)
    # before those with a distribution: the first of the latter is where its exits are read
    after = xp.concatenate([xp.zeros((1, width), bool), dist[:-1] & (dnode[:-1] == dnode[1:])], axis=0)
    first = dist & ~after & ~fetched[dnode]
    at_row, at_depth, ok = ops.where_true(first)
    at_node = dnode[at_row, at_depth]
    # float32 values and int32 ids as stored: a float64 node score plus a float32 value is the
    # float64 sum, and the [K, m] copies cost as much as the exits' arithmetic
    at_seq = perm[at_row]
    nscore, vals, toks = score[at_node], s.top_lps[at_seq, at_depth], s.top_ids[at_seq, at_depth]
    last = (eos >= 0) & (at_depth == max_len - 1)
    named = ok[:, None] & ~_named_children(ops, node, new, srt, at_node, ok, toks) & xp.isfinite(vals) & ~last[:, None]
    top = xp.where(named, nscore[:, None] + vals, -inf)
    floor_m = xp.min(vals, axis=1)
    has_rest = (vocab < 0) | (m < vocab)
    rest = xp.where(ok & ~last & xp.isfinite(floor_m) & has_rest, nscore + floor_m, -inf)
    eos_lp = eos_lps[at_row, at_depth]
    eos_open = ok & last & xp.isfinite(eos_lp) & ~is_child(at_node, xp.zeros_like(at_node) + eos)
    eos_exit = xp.where(eos_open, nscore + eos_lp, -inf)
    # -- leaves: live ones without a distribution, complete ones never scored as themselves
    row_ids = xp.arange(n)
    leaf = node[row_ids, xp.clip(sl, 0, width)]
    tail = srt[row_ids, xp.clip(sl - 1, 0, width - 1)]
    done = (sl >= 0) & xp.where(eos >= 0, (sl > 0) & (tail == eos), sl == max_len)
    live_leaf = (sl >= 0) & (sl < max_len) & ~done
    blind = xp.where(live_leaf & ~has_dist[leaf] & ~fetched[leaf], score[leaf], -inf)
    whole = s.whole[perm]
    seen = ops.seg_max(done.astype(np.float64), xp.where(done, leaf, size), size) > 0
    as_itself = ops.seg_max((done & whole).astype(np.float64), xp.where(done & whole, leaf, size), size) > 0
    complete_exit = xp.where(done & seen[leaf] & ~as_itself[leaf], score[leaf], -inf)
    # -- nothing scored: the root's fetched row, or one rest exit worth 0
    root_row = (rl == 0)[:, None] & xp.isfinite(rows_v) & ((max_len != 1) | (eos < 0) | (t == eos))
    root = xp.where(xp.any(rl == 0), xp.max(xp.where(root_row, rows_v, -inf), initial=-inf), 0.0)
    root = xp.where(n_valid == 0, root, -inf)
    exits = ExitValues(perm, node, sl, at_row, at_depth, top, toks, rest, eos_exit, blind, complete_exit, rows_exit, row_node, c,
                       rl)
    bound = root
    for part in (top, rest, eos_exit, blind, complete_exit, rows_exit):
        bound = xp.maximum(bound, xp.max(part, initial=-inf))
    return bound, moved, exits


def _named_children(ops: _Ops, node, new, srt, at_node, ok, toks):
    """bool[K, m]: which of the top-m tokens ``toks: int[K, m]`` named where node ``at_node[k]``
    reads its exits (``ok[k]``) are children of it in the trie. Each child node is met new once
    (``new[r, d + 1]``, its parent ``node[r, d]`` by token ``srt[r, d]``): its token is looked
    for among its parent's m names only (one comparison per child and name, where a search of
    every name among every child took 45% of the frontier's time)."""
    xp = ops.xp
    size = node.shape[0] * node.shape[1]
    cells, at = xp.arange(at_node.shape[0]), xp.where(ok, at_node, size)
    if xp is np:  # node -> the k where it reads its exits (-1: none; index ``size``: no node)
        named_at = np.full(size + 1, -1, np.int64)
        named_at[at] = cells
        named_at[size] = -1
    else:
        named_at = jnp.full(size + 1, -1, np.int64).at[at].set(cells).at[size].set(-1)
    row = named_at[xp.where(new[:, 1:], node[:, :-1], size).reshape(-1)]
    token = srt.reshape(-1)  # srt: int[N, L], the token from node[r, d] to node[r, d + 1]
    if xp is np:  # only the edges whose parent reads exits (numpy: nonzero; JAX: every cell, masked)
        keep = np.flatnonzero(row >= 0)
        row, token = row[keep], token[keep]
    hits = toks[xp.maximum(row, 0)] == token[:, None]
    return ops.mark(toks.shape, row, hits)


def structure_numbers(structure: Structure) -> tuple[int, int, int]:
    """``(vocab, eos, max_len)`` with -1 for an unknown vocabulary and for no eos."""
    vocab = -1 if structure.vocab_size is None else int(structure.vocab_size)
    return vocab, -1 if structure.eos is None else int(structure.eos), int(structure.max_len)


@jax.jit
def frontier_bound(s: ScoredArrays, valid, vocab, eos, max_len):
    """``(bound, moved)`` of :func:`frontier_values` under ``jax.jit`` (vmap it over a leading
    query axis of ``valid: bool[Q, N]``, or of ``s`` for different scored sets); run it with
    ``jax.enable_x64(True)``. It trusts its inputs: run
    :func:`~jaxrescore.rescore.assumptions.check_assumptions` on the arrays first (the host paths
    do), or a step above 0 or a top-m id outside the vocabulary goes unnoticed."""
    bound, moved, _ = frontier_values(s, valid, vocab, eos, max_len, _JAX)
    return bound, moved


class Frontier(NamedTuple):
    """``bound``: the frontier bound F (float64; -inf when no exit exists, i.e. the scored set
    holds the target's whole support); ``exits``: the exits worth at least the floor asked for
    (and the best one), one per (node, token), for the search to expand; ``moved``: the largest
    difference between two forwards' numbers for one prefix (nats; a proof needs it within the
    target's ``score_tolerance``)."""

    bound: float
    exits: Exits
    moved: float = 0.0


def frontier(s: ScoredArrays, structure: Structure, floor: float = -np.inf, rows_checked: bool = False) -> Frontier:
    """The frontier bound of a scored set (every row) and its exits worth at least ``floor``, on
    the host (numpy). ``rows_checked``: every row of ``s`` already passed
    :func:`~jaxrescore.rescore.assumptions.check_rows` (a scored set checks each block of rows
    once, as it is added); the structure is checked here either way."""
    check_structure(structure)
    if not rows_checked:
        check_rows(s, structure)
    if s.tokens.shape[0] == 0:  # nothing scored: the root alone, live
        ex = _root_exits(s, structure)
        return Frontier(float(ex.value.max(initial=-np.inf)), _at_least(ex, floor), 0.0)
    valid = np.ones(s.tokens.shape[0], bool)
    bound, moved, values = frontier_values(s, valid, *structure_numbers(structure))
    return Frontier(float(bound), _at_least(exit_list(values, structure, floor), floor), float(moved))


def exit_list(v: ExitValues, structure: Structure, floor: float = -np.inf, groups=None) -> Exits:
    """Every exit of ``v`` (host arrays) as ``(scored row, depth, token, value)``, one per (node,
    token): the prefix is the scored row's first ``depth`` tokens. With a ``floor``, only those
    worth at least it and the best ones (what :func:`_at_least` keeps of the whole list: most
    exits lie below the worst answer, and listing them was a third of a text proof's frontier
    time). ``groups`` (int[N], a group id >= 0 per SORTED row): the best ones of each group
    instead; exits at depth 0 (the root) form a group of their own (see
    :mod:`jaxrescore.rescore.growing`)."""
    parts = []  # (sorted row, depth, token, node, value)
    node = v.node[v.at_row, v.at_depth]
    blind_depth = v.lengths  # blind and complete exits: at the end of their own row
    # (values, their sorted rows, their depths) of each kind of exit
    kinds = ((v.top, v.at_row, v.at_depth), (v.rest, v.at_row, v.at_depth), (v.eos, v.at_row, v.at_depth),
             (v.blind, np.arange(v.blind.size), blind_depth), (v.complete, np.arange(v.complete.size), blind_depth),
             (v.rows, v.row_at, v.row_depth))
    least = _least(kinds, floor, groups)
    k, j = np.nonzero(_listed(v.top, least[0]))
    parts.append((v.at_row[k], v.at_depth[k], v.top_ids[k, j], node[k], v.top[k, j]))
    for values, token, at in ((v.rest, REST, least[1]), (v.eos, structure.eos, least[2])):
        k = np.flatnonzero(_listed(values, at))
        parts.append((v.at_row[k], v.at_depth[k], np.full(k.size, token, np.int64), node[k], values[k]))
    for values, token, at in ((v.blind, REST, least[3]), (v.complete, COMPLETE, least[4])):
        i = np.flatnonzero(_listed(values, at))
        parts.append((i, v.lengths[i], np.full(i.size, token, np.int64), v.node[i, v.lengths[i]], values[i]))
    r, t = np.nonzero(_listed(v.rows, least[5]))
    parts.append((v.row_at[r], v.row_depth[r], t, v.row_nodes[r], v.rows[r, t]))
    rows, depth, token, node, value = (np.concatenate([np.asarray(p[f], dt) for p in parts])
                                       for f, dt in enumerate((np.int64,) * 4 + (np.float64,)))
    # one exit per (node, token): the same node is met in several rows (complete, blind leaves);
    # one int64 key per pair (tokens >= COMPLETE) is ~10x faster to unique than pairs of columns
    span = int(token.max(initial=0)) - COMPLETE + 1
    _, keep = np.unique(node * span + (token - COMPLETE), return_index=True)
    return Exits(np.asarray(v.perm)[rows[keep]], depth[keep], token[keep], value[keep])


def exit_groups(groups: np.ndarray, rows, depth) -> np.ndarray:
    """int64: the group of each exit at sorted row ``rows`` and ``depth`` (``groups``: int[N],
    per sorted row, each >= 0); exits at the root (depth 0) in group ``groups.max() + 1``."""
    groups = np.asarray(groups, np.int64)
    return np.where(np.asarray(depth) > 0, groups[np.asarray(rows, np.int64)], groups.max(initial=-1) + 1)


def _least(kinds: tuple, floor: float, groups=None) -> list:
    """Per kind of exit (``(values, sorted rows, depths)``, a value per row of ``values``), the
    least value listed: ``floor``, or the best value where none reaches it, over all the exits
    or per group (``groups``: see :func:`exit_list`; then an array broadcast against
    ``values``); a NaN floor lists every exit."""
    if floor != floor:
        return [-np.inf] * len(kinds)
    best = [np.max(np.where(a > -np.inf, a, -np.inf), axis=tuple(range(1, a.ndim))) if a.size else np.zeros(0)
            for a, _, _ in kinds]  # per row of each kind (NaN: never listed)
    if groups is None:
        return [min(floor, max(float(b.max(initial=-np.inf)) for b in best))] * len(kinds)
    group = [exit_groups(groups, rows, depth) for _, rows, depth in kinds]
    top = np.full(int(max((g.max(initial=-1) for g in group), default=-1)) + 1, -np.inf)
    for b, g in zip(best, group):
        np.maximum.at(top, g, b)
    return [np.minimum(floor, top[g]).reshape((-1,) + (1,) * (a.ndim - 1)) for (a, _, _), g in zip(kinds, group)]


def _listed(values: np.ndarray, least) -> np.ndarray:
    """Which exit values are listed: finite above ``-inf`` and at least ``least``."""
    return (values > -np.inf) & (values >= least)


def _at_least(ex: Exits, floor: float) -> Exits:
    """The exits worth at least ``floor``, and the best one when none is (NaN values kept: a
    node whose own score is unknown never clears)."""
    if floor == -np.inf or ex.value.size == 0:
        return ex
    keep = ~(ex.value < floor)
    keep[np.argmax(np.where(np.isnan(ex.value), np.inf, ex.value))] = True
    return Exits(*(a[keep] for a in ex))


def _concat(parts) -> Exits:
    """One Exits of several (possibly none)."""
    dtypes = (np.int64, np.int64, np.int64, np.float64)
    return Exits(*(np.concatenate([np.zeros(0, dt)] + [np.asarray(p[f], dt) for p in parts]) for f, dt in enumerate(dtypes)))


def _root_exits(s: ScoredArrays, structure: Structure) -> Exits:
    """Exits of an empty scored set: every token from the fetched root row, or one rest exit."""
    at = np.flatnonzero(np.asarray(s.row_lengths) == 0)
    if at.size == 0:
        return Exits(np.array([-1]), np.array([0]), np.array([REST]), np.array([0.0]))
    row = np.asarray(s.row_values[at[0]], np.float64)
    toks = np.arange(row.size)
    if structure.eos is not None and structure.max_len == 1:
        toks = toks[toks == structure.eos]
    vals = np.minimum(row[toks], 0.0)
    keep = np.isfinite(vals)
    return _concat([Exits(np.full(int(keep.sum()), -1), np.zeros(int(keep.sum())), toks[keep], vals[keep])])


def clears(worst, bound, tolerance, xp=np):
    """Whether ``worst`` provably beats everything below ``bound`` (a float or a float64 array;
    traced with ``xp=jax.numpy``): ``worst >= bound + tolerance`` with float64 rounding on top; a
    ``-inf`` bound (nothing left) always clears, a non-finite ``worst`` never clears a finite
    bound. The search opens exactly the exits this refuses, so it never stalls on an exit it
    could not close."""
    b = xp.asarray(bound, np.float64)
    with np.errstate(invalid="ignore"):
        slack = 8 * np.finfo(np.float64).eps * (xp.abs(worst) + xp.abs(b))
        ok = (b == -np.inf) | (xp.isfinite(worst) & (worst - b >= tolerance + slack))
    return bool(ok) if xp is np and ok.ndim == 0 else ok
