"""The frontier of a scored set that grows round by round, recomputed only where it grew.

A proving search adds rows to its scored set every round and asks for the frontier again
(:func:`~jaxrescore.rescore.frontier.frontier`). Its last rounds add a handful of rows to
thousands (the real-text proof at k = 100: 81, 17, 6, 1 and 0 rows to 5,700), yet the whole
frontier was recomputed each time: about 50 ms a round on 2 CPU cores, most of those rounds' time.

The trie splits at the root: every node below it lies in the subtree of its first token, and
everything the frontier reads at such a node (its score over its occurrences, its distribution,
its children, the rows fetched there, the leaves under it) comes from rows and fetched rows that
begin with that token. So :class:`GrowingFrontier` keeps each first token's exits (those worth
at least the floor it was asked for, and its best) and recomputes, with the same
:func:`~jaxrescore.rescore.frontier.frontier_values` and
:func:`~jaxrescore.rescore.frontier.exit_list`, only the subtrees whose first token a new row or
a new fetched row has. The root's own exits (the first position's top-m, rest, eos, its fetched
row, empty views) depend on every subtree only through which first tokens exist and on the first
row in sorted order, so they are computed from one row per subtree cut to its first token, again
only when a new first token, a new row of the smallest one, an empty view or a root fetched row
comes (or from the whole set, when most of it is recomputed anyway). The bound, the exits and
their order are the whole computation's, exactly (tested on random growing sets,
tests/test_growing_frontier.py). ``moved`` (assumption 4 of
:mod:`jaxrescore.rescore.frontier`) is the largest difference between two forwards of one prefix
seen in ANY round: at least the whole computation's, so a proof is never let through on it.

It trusts that rows are only appended, never changed (the per-position arrays of a
:class:`~jaxrescore.rescore.scored.ScoredSet`; checks by a full forward change only scores,
which the frontier does not read) and that the rows were checked as they were added; it starts over
when the top-m width or the target's structure changes, or when given fewer rows.
"""

from __future__ import annotations

import collections

import numpy as np

from jaxrescore.models.base import Structure
from jaxrescore.rescore import frontier as fm
from jaxrescore.rescore.assumptions import check_structure, top_max_of
from jaxrescore.rescore.frontier import Exits, Frontier, ScoredArrays

_ROWS = ("tokens", "lengths", "whole", "steps", "top_lps", "top_ids", "eos_lps", "top_max")


class GrowingFrontier:
    """:func:`~jaxrescore.rescore.frontier.frontier` of one growing scored set, round by round
    (see the module docstring). Call it with the set's arrays and a floor."""

    def __init__(self):
        self._reset(None, None)

    def _reset(self, m, structure: Structure | None) -> None:
        self._m, self.structure = m, structure
        self.numbers = None if structure is None else fm.structure_numbers(structure)
        self._rows = 0  # rows seen
        self._fetched: collections.Counter = collections.Counter()  # fetched prefixes seen
        self._groups: dict = {}  # first token -> (least value listed, best value)
        # every subtree's listed exits, by first token (``_owner``), each subtree's in listed order
        self._exits, self._owner = fm._concat([]), np.zeros(0, np.int64)
        self._root_exits: Exits | None = None  # the root's, while no row or fetched row changes them
        self._moved = 0.0

    def __call__(self, s: ScoredArrays, structure: Structure, floor: float = -np.inf) -> Frontier:
        """:func:`~jaxrescore.rescore.frontier.frontier` ``(s, structure, floor,
        rows_checked=True)``, where ``s`` holds the rows of the last call and more."""
        check_structure(structure)
        n = s.tokens.shape[0]
        if n == 0 or floor != floor or n < self._rows:  # the root alone; list everything; another set
            self._reset(None, None)
            return fm.frontier(s, structure, floor, rows_checked=True)
        if s.top_ids.shape[2] != self._m or structure != self.structure:  # an inferred vocabulary grew
            self._reset(s.top_ids.shape[2], structure)
        first = np.where(np.asarray(s.lengths) > 0, np.asarray(s.tokens)[:, 0], -1)
        fetched = collections.Counter(tuple(p[: int(q)]) for p, q in zip(np.asarray(s.row_prefixes).tolist(),
                                                                     s.row_lengths) if q >= 0)
        fetched, self._fetched = fetched - self._fetched, fetched  # the new ones (a prefix's again too)
        added = set(first[self._rows:].tolist())
        touched = (added | {p[0] for p in fetched if p}) - {-1}
        if -1 in added or () in fetched or (added - {-1}) - self._groups.keys() or \
                (self._groups and min(self._groups) in added):  # what the root's exits read changed
            self._root_exits = None
        self._rows = n
        present = set(first.tolist()) - {-1}
        if 2 * np.isin(first, np.fromiter(touched, np.int64)).sum() >= n:  # most of it: all of it, no copy
            touched = present
        root = self._grow(s, first, touched, floor, whole=touched == present)
        if root is None:
            root = self._root(s, first)
        bound = max([float(root.value.max(initial=-np.inf))] + [g[1] for g in self._groups.values()])
        least = min(floor, bound)
        stale = {t for t, g in self._groups.items() if g[0] > least}  # a floor that dropped: list lower
        self._grow(s, first, stale, least)
        keep = self._exits.value >= least
        exits = fm._concat([_above(root, least), Exits(*(a[keep] for a in self._exits))])
        return Frontier(bound, fm._at_least(exits, floor), max(self._moved, _root_moved(s, first)))

    def _grow(self, s: ScoredArrays, first: np.ndarray, touched: set, floor: float,
              whole: bool = False) -> Exits | None:
        """Recompute the subtrees of the first tokens ``touched``: their exits worth at least
        ``floor`` (and the best of each). ``whole``: every subtree (the whole set, not copied),
        which also gives the root's exits worth at least what this round lists: returned then
        (else None)."""
        if not touched:
            return None
        rows = np.arange(first.size) if whole else np.flatnonzero(np.isin(first, np.fromiter(touched, np.int64)))
        sub = s if whole else _take_rows(s, rows, lambda p, q: q > 0 and p[0] in touched)
        _, moved, values = fm.frontier_values(sub, np.ones(rows.size, bool), *self.numbers)
        self._moved = max(self._moved, float(moved))
        firsts = np.asarray(sub.tokens)[np.asarray(values.perm), 0]  # -1: an empty view
        ids, groups = np.unique(firsts, return_inverse=True)
        ex = fm.exit_list(values, self.structure, floor, groups=groups)
        below = ex.depth > 0  # the root's exits of part of the subtrees are not the root's
        root = Exits(*(a[~below] for a in ex)) if whole else None
        self._root_exits = None if whole else self._root_exits
        ex = Exits(rows[ex.seq[below]], ex.depth[below], ex.token[below], ex.value[below])
        ids = ids[ids >= 0]
        owner = np.asarray(s.tokens)[ex.seq, 0]
        best = np.full(ids.size, -np.inf)
        np.maximum.at(best, np.searchsorted(ids, owner), ex.value)
        self._groups.update((t, (min(floor, b), b)) for t, b in zip(ids.tolist(), best.tolist()))
        old = ~np.isin(self._owner, ids)
        owner = np.concatenate([self._owner[old], owner])
        order = np.argsort(owner, kind="stable")  # by first token, each subtree's in listed order
        self._exits = Exits(*(np.concatenate([a[old], b])[order] for a, b in zip(self._exits, ex)))
        self._owner = owner[order]
        return root

    def _root(self, s: ScoredArrays, first: np.ndarray) -> Exits:
        """The root's exits (every one): from one row per first token, each cut to that token
        (the subtree of the smallest from its first row in sorted order, whose distribution the
        root's exits read), the empty views and the root's fetched row."""
        if self._root_exits is not None:
            return self._root_exits
        tokens = np.asarray(s.tokens)
        live = np.flatnonzero(first >= 0)
        keys, at = np.unique(first[live], return_index=True)
        reps = live[at]
        if keys.size:  # the first row in sorted order: a lexsort of the smallest subtree's rows
            mine = live[first[live] == keys[0]]
            reps[0] = mine[np.lexsort(tokens[mine].T[::-1])[0]]
        rows = np.concatenate([np.flatnonzero(first < 0), reps])
        sub = _take_rows(s, rows, lambda p, q: q == 0, width=1)
        _, _, values = fm.frontier_values(sub, np.ones(rows.size, bool), *self.numbers)
        ex = fm.exit_list(values, self.structure)
        at_root = ex.depth == 0
        self._root_exits = Exits(rows[ex.seq[at_root]], ex.depth[at_root], ex.token[at_root], ex.value[at_root])
        return self._root_exits


def _take_rows(s: ScoredArrays, rows: np.ndarray, fetched, width: int | None = None) -> ScoredArrays:
    """The scored rows ``rows`` of ``s`` (their first ``width`` positions: a row longer is cut
    there) with the fetched rows ``fetched(prefix, length)`` keeps."""
    top_max = top_max_of(s)
    cols = {f: np.asarray(getattr(s, f) if f != "top_max" else top_max)[rows] for f in _ROWS}
    if width is not None:
        cols = {f: (a[:, :width] if a.ndim > 1 else a) for f, a in cols.items()}
        cols["lengths"] = np.minimum(cols["lengths"], width)
    prefixes, lengths = np.asarray(s.row_prefixes), np.asarray(s.row_lengths)
    keep = np.array([q >= 0 and fetched(p, q) for p, q in zip(prefixes.tolist(), lengths.tolist())], bool)
    keep = np.flatnonzero(keep) if keep.size else np.zeros(0, np.int64)
    row_prefixes = prefixes[keep] if width is None else prefixes[keep][:, :width]
    return ScoredArrays(**cols, row_prefixes=row_prefixes, row_lengths=lengths[keep],
                        row_values=np.asarray(s.row_values)[keep])


def _root_moved(s: ScoredArrays, first: np.ndarray) -> float:
    """The largest difference between the numbers of the root's occurrences (every row with a
    first position: its largest named and its eos log-probs) and between them and the root's
    fetched row."""
    live = first >= 0
    if not live.any():
        return 0.0
    top = np.asarray(top_max_of(s)[live, 0], np.float64)
    eos = np.asarray(s.eos_lps, np.float64)[live, 0]
    moved = max(float(fm._gap(np, v.max(), v.min())) for v in (top, eos))
    rows = np.minimum(np.asarray(s.row_values, np.float64)[np.asarray(s.row_lengths) == 0], 0.0)
    best = rows.max(axis=1, initial=-np.inf)  # each of the root's fetched rows
    return max(moved, float(fm._gap(np, top.max(), best).max(initial=0.0)))


def _above(ex: Exits, least: float) -> Exits:
    """The exits worth at least ``least`` (NaN never: no exit is listed with it)."""
    keep = ex.value >= least
    return Exits(*(a[keep] for a in ex))
