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
:func:`check_assumptions` and :func:`frontier`, or refused):

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
   proof needs it within the tolerance (the search stops with the reason otherwise).

All of it is host numpy in float64 over the padded scored set: the trie is the sorted views'
longest common prefixes, so nothing loops per node in Python.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from jaxrescore.models.base import Structure

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
    its view, :func:`view_lengths`).

    Attributes:
      tokens: int64[N, L], the views, padded with -1.
      lengths: int64[N], the views' lengths: positions ``< lengths[i]`` of row ``i`` have a
        distribution (the forward row was the view).
      whole: bool[N], whether scored sequence ``i`` is its view (its score is the view's score;
        otherwise the sequence scored -inf and its view, if complete, is an unscored exit).
      steps: float64[N, W], per-step target log-probs (<= 0), ``W >= L``.
      top_lps: float32[N, W, m], top_ids: int32[N, W, m], eos_lps: float32[N, W]: per position.
      rows: dict mapping a prefix (tuple) to its fetched full next-token row float32[V].
    """

    tokens: np.ndarray
    lengths: np.ndarray
    whole: np.ndarray
    steps: np.ndarray
    top_lps: np.ndarray
    top_ids: np.ndarray
    eos_lps: np.ndarray
    rows: dict


class Exits(NamedTuple):
    """Exits from the trie: the prefix is ``tokens[seq[e], :depth[e]]``, the token ``token[e]``
    (:data:`REST` for "any token outside the known top-m"), and ``value[e]`` bounds the target
    score of every support sequence leaving the trie there (float64)."""

    seq: np.ndarray
    depth: np.ndarray
    token: np.ndarray
    value: np.ndarray


class Trie(NamedTuple):
    """The prefix trie of a scored set.

    Attributes:
      node_of: int64[N, L + 1], the node id of ``tokens[i, :d]`` (-1 where ``d > lengths[i]``).
      first: int64[K, 2], each node's first occurrence ``(row, depth)``.
      child_keys: int64[C], sorted ``node * base + token`` of every (node, child token) pair.
      child_nodes: int64[C], the child node of each pair.
      only_child: int64[K], the token of a node's one child; -1 when it has none, -2 when more
        (most nodes of a large scored set have one child: a lookup then is one compare).
      base: the key base (larger than every token id).
    """

    node_of: np.ndarray
    first: np.ndarray
    child_keys: np.ndarray
    child_nodes: np.ndarray
    only_child: np.ndarray
    base: int


def build_trie(tokens: np.ndarray, lengths: np.ndarray, base: int) -> Trie:
    """The trie of ``tokens: int64[N, L]`` (rows padded with -1) of lengths ``int64[N]``."""
    n, width = tokens.shape
    depth = np.arange(width + 1)[None, :]
    if n == 0:
        none = np.zeros(0, np.int64)
        return Trie(np.zeros((0, width + 1), np.int64), np.zeros((0, 2), np.int64), none, none, none, base)
    order = np.lexsort(tokens.T[::-1]) if width else np.arange(n)
    srt, lens = tokens[order], lengths[order]
    # lcp[i]: common prefix of sorted rows i-1 and i (0 for the first row).
    same = np.cumprod(srt[1:] == srt[:-1], axis=1).sum(axis=1) if width else np.zeros(n - 1, np.int64)
    lcp = np.concatenate([[0], np.minimum(same, np.minimum(lens[1:], lens[:-1]))])
    real = depth <= lens[:, None]
    new = real & ((np.arange(n)[:, None] == 0) | (depth > lcp[:, None]))
    ids = np.cumsum(new.reshape(-1)).reshape(new.shape) - 1
    # A non-new real entry belongs to the node of the row above (its prefix is shared): ids grow
    # down every column, so a running max carries each node's id down to its later rows.
    node_sorted = np.maximum.accumulate(np.where(new, ids, -1), axis=0)
    node_sorted = np.where(real, node_sorted, -1)
    node_of = np.empty_like(node_sorted)
    node_of[order] = node_sorted
    rows, depths = np.nonzero(new)
    first = np.stack([order[rows], depths], axis=1)
    # (node, child token) pairs: every real step of every row.
    has_child = depth[:, :-1] < lengths[:, None]
    child_keys, at = np.unique(node_of[:, :-1][has_child] * base + tokens[has_child], return_index=True)
    child_nodes = node_of[:, 1:][has_child][at]
    parent, tok = np.divmod(child_keys, base)
    count = np.bincount(parent, minlength=first.shape[0])
    only_child = np.where(count == 0, -1, -2)
    one = count[parent] == 1
    only_child[parent[one]] = tok[one]
    return Trie(node_of, first, child_keys, child_nodes, only_child, base)


def _is_child(trie: Trie, nodes: np.ndarray, toks: np.ndarray) -> np.ndarray:
    """bool[...]: whether ``nodes + toks`` is in the trie (same shapes): a compare where the
    node has at most one child, a search of ``child_keys`` where it has more."""
    only = trie.only_child[nodes]
    out = (only >= 0) & (toks == only)
    many = only == -2
    if many.any():
        keys = nodes[many] * trie.base + toks[many]
        pos = np.minimum(np.searchsorted(trie.child_keys, keys), trie.child_keys.size - 1)
        out[many] = trie.child_keys[pos] == keys
    return out


def _node(trie: Trie, prefix: tuple) -> int:
    """The node of ``prefix`` (-1 when it is not in the trie), walked from the root (node 0)."""
    node = 0
    for t in prefix:
        key = node * trie.base + int(t)
        pos = int(np.searchsorted(trie.child_keys, key))
        if not 0 <= t < trie.base or pos == trie.child_keys.size or trie.child_keys[pos] != key:
            return -1
        node = int(trie.child_nodes[pos])
    return node


def node_scores(s: ScoredArrays, trie: Trie) -> tuple[np.ndarray, float]:
    """``(score float64[K], moved)``: each node's target score (the largest of its occurrences,
    so the bound is the looser one) and the largest difference between two forwards' numbers for
    one prefix that the scored set shows (its score, its distribution's largest log-prob, its
    eos log-prob, a fetched full row's largest log-prob; see assumption 4 of the module
    docstring)."""
    n_nodes = trie.first.shape[0]
    width = trie.node_of.shape[1]
    cum = np.concatenate([np.zeros((s.tokens.shape[0], 1)), np.cumsum(s.steps, axis=1)], axis=1)[:, :width]
    at = trie.node_of >= 0  # every (row, depth) with depth <= the row's length
    score, moved = _spread(trie.node_of[at], cum[at], n_nodes)
    d = np.arange(width)[None, :]
    has = at & (d < s.lengths[:, None])  # positions with a distribution
    nodes = trie.node_of[has]
    if nodes.size:
        rows, depths = np.nonzero(has)
        top = s.top_lps[rows, depths].max(axis=1).astype(np.float64)
        for values in (top, s.eos_lps[rows, depths].astype(np.float64)):
            moved = max(moved, _spread(nodes, values, n_nodes)[1])
        if s.rows:
            best = np.full(n_nodes, -np.inf)
            np.maximum.at(best, nodes, top)
            has = np.zeros(n_nodes, bool)
            has[nodes] = True
            for prefix, row in s.rows.items():
                v = _node(trie, prefix)
                if v >= 0 and has[v]:
                    moved = max(moved, float(_gap(best[v], np.max(row, initial=-np.inf))))
    return score, moved


def _spread(nodes: np.ndarray, values: np.ndarray, n_nodes: int) -> tuple[np.ndarray, float]:
    """Per node, the largest of ``values`` (float64[K], -inf where none) and the largest
    difference within one node (``inf`` when one occurrence is -inf and another is not)."""
    hi = np.full(n_nodes, -np.inf)
    lo = np.full(n_nodes, np.inf)
    np.maximum.at(hi, nodes, values)
    np.minimum.at(lo, nodes, values)
    seen = np.isfinite(lo) | (hi > -np.inf)
    if not seen.any():
        return hi, 0.0
    return hi, float(np.max(_gap(hi[seen], lo[seen])))


def _gap(a, b):
    """``|a - b|`` where two -inf agree (0) and -inf against a number is ``inf``."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    with np.errstate(invalid="ignore"):
        return np.where(a == b, 0.0, np.abs(a - b))


def node_exits(s: ScoredArrays, trie: Trie, structure: Structure, floor: float = -np.inf, score=None) -> Exits:
    """The exits of the trie with their bounds (see the module docstring), from each node's
    ``score: float64[K]`` (:func:`node_scores`, computed when not given): every one worth at
    least ``floor``, and the best one (so their max is the frontier bound) when all are below.
    Exits worth ``-inf`` bound nothing and are left out."""
    n_nodes = trie.first.shape[0]
    if n_nodes == 0:  # nothing scored: the root alone, live
        return _root_exits(s, structure)
    if score is None:
        score = node_scores(s, trie)[0]
    nodes_d, occ_d = _occurrences(trie, s.lengths)
    live = _live(trie, s.tokens, structure)
    fetched = np.zeros(n_nodes, bool)
    at = [_node(trie, p) for p in s.rows]
    fetched[[v for v in at if v >= 0]] = True
    fetched &= live
    with_dist = np.zeros(n_nodes, bool)
    with_dist[nodes_d] = True
    top = live[nodes_d] & ~fetched[nodes_d]
    blind = np.flatnonzero(live & ~fetched & ~with_dist)
    unscored = np.flatnonzero(_unscored_complete(s, trie, structure))
    parts = [
        _top_m_exits(s, trie, structure, nodes_d[top], occ_d[top], score, floor),
        _row_exits(s, trie, structure, np.flatnonzero(fetched), score),
        # Live nodes without a distribution: everything below them is bounded by their score.
        Exits(trie.first[blind, 0], trie.first[blind, 1], np.full(blind.size, REST), score[blind]),
        Exits(trie.first[unscored, 0], trie.first[unscored, 1], np.full(unscored.size, COMPLETE), score[unscored]),
    ]
    ex = _concat(parts)
    ex = Exits(*(a[ex.value > -np.inf] for a in ex))
    return _at_least(ex, floor)


def _unscored_complete(s: ScoredArrays, trie: Trie, structure: Structure) -> np.ndarray:
    """bool[K]: nodes that are whole support sequences but no scored sequence is that node itself
    (only longer draft sequences the target cut there)."""
    rows = np.arange(s.lengths.size)
    end = trie.node_of[rows, s.lengths]
    comp = complete(s.tokens, s.lengths, structure)
    out = np.zeros(trie.first.shape[0], bool)
    out[end[comp]] = True
    out[end[comp & s.whole]] = False
    return out


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
    row = s.rows.get(())
    if row is None:
        return Exits(np.array([-1]), np.array([0]), np.array([REST]), np.array([0.0]))
    toks = np.arange(np.asarray(row).size)
    if structure.eos is not None and structure.max_len == 1:
        toks = toks[toks == structure.eos]
    vals = np.minimum(np.asarray(row, np.float64)[toks], 0.0)
    keep = np.isfinite(vals)
    return _concat([Exits(np.full(int(keep.sum()), -1), np.zeros(int(keep.sum())), toks[keep], vals[keep])])


def _occurrences(trie: Trie, lengths: np.ndarray):
    """For each node that has a distribution, an occurrence ``(row, depth)`` with ``depth <
    lengths[row]``: returns ``(nodes int64[K'], occ int64[K', 2])``."""
    d = np.arange(trie.node_of.shape[1])[None, :]
    ok = (trie.node_of >= 0) & (d < lengths[:, None])
    rows, depths = np.nonzero(ok)
    nodes, idx = np.unique(trie.node_of[rows, depths], return_index=True)
    return nodes, np.stack([rows[idx], depths[idx]], axis=1)


def _live(trie: Trie, tokens: np.ndarray, structure: Structure) -> np.ndarray:
    """bool[K]: nodes a support sequence can still extend."""
    row, depth = trie.first[:, 0], trie.first[:, 1]
    live = depth < structure.max_len
    if structure.eos is not None:
        seen = np.cumsum(tokens == structure.eos, axis=1)
        seen = np.concatenate([np.zeros((tokens.shape[0], 1), seen.dtype), seen], axis=1)
        live &= seen[row, depth] == 0
    return live


def _prefix(s: ScoredArrays, trie: Trie, node: int) -> tuple:
    row, depth = trie.first[node]
    return tuple(int(t) for t in s.tokens[row, :depth])


def _top_m_exits(s, trie, structure, nodes, occ, prefix_score, floor=-np.inf) -> Exits:
    """Exits named by the top-m of nodes' distributions (those below ``floor`` left out but the
    best), each node's rest exit and the eos exits of nodes one short of ``max_len``."""
    rows, depths = occ[:, 0], occ[:, 1]
    vals = s.top_lps[rows, depths].astype(np.float64)  # [K, m]
    ids = s.top_ids[rows, depths].astype(np.int64)
    m = vals.shape[1]
    last = np.zeros(nodes.size, bool) if structure.eos is None else depths == structure.max_len - 1
    child = _is_child(trie, np.broadcast_to(nodes[:, None], ids.shape), ids)
    allowed = ~child & np.isfinite(vals) & ~last[:, None]
    if floor > -np.inf and allowed.any():
        worth = prefix_score[nodes][:, None] + vals
        best = np.unravel_index(np.argmax(np.where(allowed, worth, -np.inf)), worth.shape)
        kept = allowed & ~(worth < floor)
        kept[best] |= allowed[best]  # the best ALLOWED exit (never a child: all may be -inf)
        allowed = kept
    k_idx, j_idx = np.nonzero(allowed)
    seq = [trie.first[nodes[k_idx], 0]]
    dep = [depths[k_idx]]
    tok = [ids[k_idx, j_idx]]
    val = [prefix_score[nodes[k_idx]] + vals[k_idx, j_idx]]
    # Tokens outside the top-m: at most the smallest named value each (none when m covers a
    # KNOWN vocabulary; a whole row padded to m holds -inf, so it has none either).
    if structure.vocab_size is None or m < structure.vocab_size:
        low = vals.min(axis=1)
        rest = ~last & np.isfinite(low)
        seq.append(trie.first[nodes[rest], 0])
        dep.append(depths[rest])
        tok.append(np.full(int(rest.sum()), REST))
        val.append(prefix_score[nodes[rest]] + low[rest])
    if structure.eos is not None and last.any():
        eos_vals = s.eos_lps[rows[last], depths[last]].astype(np.float64)
        open_ = ~_is_child(trie, nodes[last], np.full(int(last.sum()), structure.eos)) & np.isfinite(eos_vals)
        seq.append(trie.first[nodes[last][open_], 0])
        dep.append(depths[last][open_])
        tok.append(np.full(int(open_.sum()), structure.eos))
        val.append(prefix_score[nodes[last][open_]] + eos_vals[open_])
    return _concat([Exits(*parts) for parts in zip(seq, dep, tok, val)])


def _row_exits(s, trie, structure, nodes, prefix_score) -> Exits:
    """Exact exits of nodes whose full next-token row was fetched."""
    parts = []
    for v in nodes:
        row = np.minimum(np.asarray(s.rows[_prefix(s, trie, v)], np.float64), 0.0)
        depth = int(trie.first[v, 1])
        toks = np.arange(row.size)
        if structure.eos is not None and depth == structure.max_len - 1:
            toks = toks[toks == structure.eos]
        toks = toks[~_is_child(trie, np.full(toks.size, v), toks) & np.isfinite(row[toks])]
        parts.append(Exits(np.full(toks.size, trie.first[v, 0]), np.full(toks.size, depth), toks, prefix_score[v] + row[toks]))
    return _concat(parts)


class Frontier(NamedTuple):
    """``bound``: the frontier bound F (float64; -inf when no exit exists, i.e. the scored set
    holds the target's whole support); ``exits``: every exit, for the search to expand;
    ``moved``: the largest difference between two forwards' numbers for one prefix (nats; a
    proof needs it within the target's ``score_tolerance``)."""

    bound: float
    exits: Exits
    moved: float = 0.0


def frontier(s: ScoredArrays, structure: Structure, floor: float = -np.inf) -> Frontier:
    """The frontier bound of a scored set and the exits it comes from: all of them count in the
    bound; ``exits`` keeps those worth at least ``floor`` (a search that could only open exits
    above some score leaves out the rest)."""
    check_assumptions(s, structure)
    vocab = 0 if structure.vocab_size is None else structure.vocab_size
    base = int(max(vocab, int(s.tokens.max(initial=-1)) + 1, int(s.top_ids.max(initial=-1)) + 1, 1))
    trie = build_trie(s.tokens, s.lengths, base)
    score, moved = node_scores(s, trie) if trie.first.shape[0] else (None, 0.0)
    exits = node_exits(s, trie, structure, floor, score)
    bound = float(exits.value.max()) if exits.value.size else -np.inf
    return Frontier(bound, exits, moved)


def check_assumptions(s: ScoredArrays, structure: Structure) -> None:
    """Raise ValueError when the target's numbers break an assumption of the module docstring
    that can be seen in them: a step or a top-m log-prob above 0 or NaN, a top-m token id outside
    the vocabulary, an impossible support structure."""
    if not (isinstance(structure.max_len, (int, np.integer)) and structure.max_len >= 1):
        raise ValueError(f"the target's max_len must be an integer >= 1, got {structure.max_len!r}")
    vocab = structure.vocab_size
    if vocab is not None and vocab < 1:
        raise ValueError(f"the target's vocab_size must be >= 1 or unknown (None), got {vocab!r}")
    if structure.eos is not None and (structure.eos < 0 or vocab is not None and structure.eos >= vocab):
        raise ValueError(f"the target's eos={structure.eos} is not a token id in [0, {vocab})")
    real = np.arange(s.steps.shape[1])[None, :] < s.lengths[:, None]  # positions with a distribution
    for name, arr in (("step", s.steps[real]), ("top-m", s.top_lps[real]), ("eos", s.eos_lps[real])):
        if arr.size and not np.all(arr <= 0.0):  # NaN fails this too
            raise ValueError(
                f"the target's forward returned a {name} log-prob that is NaN or above 0 (after "
                "clipping): it breaks the proof's assumption that every step costs >= 0 nats"
            )
    if vocab is not None and s.top_ids.size:
        ids = s.top_ids[real][np.isfinite(s.top_lps[real])]
        if ids.size and (int(ids.max()) >= vocab or int(ids.min()) < 0):
            raise ValueError(
                f"the target's forward named token {int(ids.max())} among a position's "
                f"top-m, outside its vocabulary [0, {vocab})"
            )


def clears(worst: float, bound, tolerance: float):
    """Whether ``worst`` provably beats everything below ``bound`` (a float or a float64 array):
    ``worst >= bound + tolerance`` with float64 rounding on top; a ``-inf`` bound (nothing
    left) always clears, a non-finite ``worst`` never clears a finite bound. The search opens
    exactly the exits this refuses, so it never stalls on an exit it could not close."""
    b = np.asarray(bound, np.float64)
    with np.errstate(invalid="ignore"):
        slack = 8 * np.finfo(np.float64).eps * (abs(worst) + np.abs(b))
        ok = (b == -np.inf) | (np.isfinite(worst) & (worst - b >= tolerance + slack))
    return bool(ok) if ok.ndim == 0 else ok
