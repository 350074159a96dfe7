"""The index order: the count DP over the prefix tree and the sequences sorted by (bucket, position).

Within one bucket sequences are in depth-first order, likelier steps first (equal log-probs by
token id); the count DP (bottom-up) gives each node the sequences below it, and a top-down pass
gives each sequence its depth-first position.
"""

from __future__ import annotations

import numpy as np

from jaxrescore.index.seek.state import SeekState, trimmed
from jaxrescore.index.seek.tree import cost, sort_keys


def rank(state: SeekState) -> SeekState:
    """``state`` with its sequences (``seq_id``, ``seq_fb``, ``seq_lp``) sorted by (bucket,
    depth-first position)."""
    nd = trimmed(state.nodes)
    depth, parent = nd.depth, nd.parent
    by_depth = np.argsort(depth, kind="stable")
    edges = np.searchsorted(depth[by_depth], np.arange(int(depth.max()) + 2))
    level_pos = np.zeros(nd.n, np.int64)
    levels = []
    step_cost = cost(nd.step)
    for d in range(len(edges) - 1):
        ids = by_depth[edges[d] : edges[d + 1]]
        if d > 0:  # siblings together (parent order), likelier first, then token id
            ids = ids[sort_keys(level_pos[parent[ids]], step_cost[ids], nd.token[ids])]
        level_pos[ids] = np.arange(ids.size)
        levels.append(ids)
    leaves = nd.terminal.astype(np.int64)  # sequences below each node, bottom-up
    for d in range(len(levels) - 1, 0, -1):
        ids = levels[d]
        up = np.bincount(level_pos[parent[ids]], weights=leaves[ids], minlength=levels[d - 1].size)
        leaves[levels[d - 1]] += up.astype(np.int64)
    first = np.zeros(nd.n, np.int64)  # sequences before each node's subtree, top-down
    for d in range(1, len(levels)):
        ids = levels[d]
        counts = leaves[ids]
        before = np.cumsum(counts) - counts
        par = parent[ids]
        starts = np.r_[True, par[1:] != par[:-1]]
        group_first = np.maximum.accumulate(np.where(starts, np.arange(ids.size), 0))
        first[ids] = first[par] + before - before[group_first]
    seq = np.flatnonzero(nd.terminal)
    dfs = np.empty_like(seq)
    dfs[first[seq]] = seq  # leaves' first positions are a permutation of 0..len-1
    fb = nd.fb[dfs]
    seq = dfs[np.argsort(fb.astype(np.int16) if fb.max(initial=0) < 2**15 else fb, kind="stable")]
    return state._replace(seq_id=seq, seq_fb=nd.fb[seq], seq_lp=nd.lp[seq])
