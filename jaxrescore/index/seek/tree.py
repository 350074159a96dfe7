"""Reading the prefix tree: the tokens of nodes, a sequence's node, and the keys siblings sort by."""

from __future__ import annotations

import numpy as np

from jaxrescore.index.seek.state import Nodes, trimmed


def decode_fixed(nodes: Nodes, ids: np.ndarray, depth: int) -> np.ndarray:
    """Tokens int32[b, depth] of nodes ``ids`` that all sit at ``depth``."""
    out = np.zeros((ids.size, depth), np.int32)
    cur = ids
    for j in range(depth - 1, -1, -1):
        out[:, j] = nodes.token[cur]
        cur = nodes.parent[cur]
    return out


def fixed_prefixes(nodes: Nodes, ids: np.ndarray, depth: int) -> np.ndarray:
    """int32[b, max(depth, 1)]: the prefixes of nodes ``ids`` (all of length ``depth``)."""
    prefixes = np.zeros((ids.size, max(depth, 1)), np.int32)
    prefixes[:, :depth] = decode_fixed(nodes, ids, depth)
    return prefixes


def decode(nodes: Nodes, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Tokens int32[N, T] and lengths int32[N] of nodes ``ids: int[N]`` (any depths), vectorised."""
    lens = nodes.depth[ids]
    out = np.zeros((ids.size, int(lens.max(initial=0))), np.int32)
    cur = np.array(ids, np.int64)
    for _ in range(out.shape[1]):
        d = nodes.depth[cur]
        live = np.flatnonzero(d > 0)
        if live.size == 0:
            break
        c = cur[live]
        out[live, d[live] - 1] = nodes.token[c]
        cur[live] = nodes.parent[c]
    return out, lens


def find(nodes: Nodes, seq: tuple[int, ...]) -> int | None:
    """The node id of an indexed sequence, or None."""
    nd = trimmed(nodes)
    cur = 0
    for tok in seq:
        hit = np.flatnonzero((nd.parent == cur) & (nd.token == tok))
        if hit.size == 0:
            return None
        cur = int(hit[0])
    return cur if nd.terminal[cur] else None


def cost(step: np.ndarray) -> np.ndarray:
    """int64 keys ordering float32 log-probs ``step`` from likeliest (clipped to <= 0) down: a
    float32 >= 0 orders like its uint32 bits (+0.0 folds -0.0 into 0)."""
    neg = np.maximum(-np.asarray(step, np.float32), np.float32(0)) + np.float32(0)
    return neg.view(np.uint32).astype(np.int64)


def sort_keys(*keys: np.ndarray) -> np.ndarray:
    """The permutation sorting by ``keys`` (non-negative ints, most significant first).

    Packed into one int64 when their bit widths fit, which the stable sort does fast (nodes are
    created nearly in order); np.lexsort otherwise."""
    widths = [max(int(k.max(initial=0)), 1).bit_length() for k in keys]
    if sum(widths) > 62:
        return np.lexsort(keys[::-1])
    packed = np.zeros(keys[0].size, np.int64)
    for k, w in zip(keys, widths):
        packed = (packed << w) | k.astype(np.int64)
    return np.argsort(packed, kind="stable")


def small_values(a: np.ndarray) -> list:
    """The distinct values of ``a`` (small non-negative ints: depths), ascending: a bincount, not
    numpy's hashing ``unique`` (measured slower by far on these)."""
    return np.flatnonzero(np.bincount(a)).tolist() if a.size else []
