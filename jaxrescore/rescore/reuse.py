"""Reuse what a scored set holds: new rows' forwards computed only past their scored prefixes.

A proving search teacher-forces sequences that mostly extend prefixes it scored in earlier rounds
(an exit ``p + t`` and the draft's path after it). Every position of a scored row holds its node's
next-token distribution (top-m, eos) and the step into the next token, so a new row ``v`` needs
the target only AFTER its deepest known prefix:

- :class:`KnownPrefixes` maps every prefix whose distribution the set holds to ``(row,
  position)`` where it was computed; it is prefix-closed (a row registers each of its prefixes),
  so a row's deepest known prefix is found by bisection;
- positions ``<= i`` of ``v`` (``i``: its deepest known prefix ``v[:i]``) and steps ``< i`` are
  copied from the row holding ``v[:i]``; the step ``log p(v[i] | v[:i])`` is copied too when
  ``v[i]`` is named there (in the top-m, ``eos``, or a fetched full row) — a search's exit
  ``p + t`` always is — else position ``i`` is recomputed;
- only the rest is computed: by a :class:`~jaxrescore.models.decoding.DecodingSession`'s
  ``teacher_force`` on top of the key/value cache of the known prefix (one token position per new
  node), or, for a target without an incremental forward, by its full ``score_frontier`` of the
  rows that need anything (a row whose every position is known, e.g. ``p + eos`` after a scored
  ``p``, costs no forward at all).

Soundness: every number is the target's own, from one of its forwards (assumption 4 of
:mod:`jaxrescore.rescore.frontier`: one prefix's numbers agree between forwards within the
target's ``score_tolerance``; a recomputed position is compared with its first computation like
any repeated prefix). The cached path may drift from the full forward (accelerator matmuls, fused
attention), so no proof rests on it alone (assumption 5): the answer's rows, and the rows within
the tolerance below it, are checked by a full forward before a verdict or a returned score rests
on them (:meth:`~jaxrescore.rescore.scored.ScoredSet.unchecked`), and a disagreement beyond the
tolerance refuses the proof.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from jaxrescore.models import scores
from jaxrescore.models.scores import FrontierScores
from jaxrescore.rescore.frontier import ScoredArrays
from jaxrescore.sequences import ragged_positions


class KnownPrefixes:
    """Every prefix (a tuple of tokens, the view's) whose next-token distribution a scored set
    holds, with where: ``prefix -> row`` (its position in that row is its length).
    Prefix-closed by construction."""

    def __init__(self):
        self._at: dict[tuple, int] = {}

    def __len__(self) -> int:
        return len(self._at)

    def add(self, first_row: int, views: list) -> tuple[np.ndarray, np.ndarray]:
        """Register the views of rows ``first_row, first_row + 1, ...``: position ``j < len(v)``
        of each holds the distribution after ``v[:j]``. Each new prefix is registered once;
        returns where the new ones are, ``(rows int64[P], positions int64[P])``."""
        at, rows, positions = self._at, [], []
        for row, v in enumerate(views, start=first_row):
            for j in range(len(v) - 1, -1, -1):
                key = v[:j]
                if key in at:
                    break  # prefix-closed: every shorter prefix is registered too
                at[key] = row
                rows.append(row)
                positions.append(j)
        return np.array(rows, np.int64), np.array(positions, np.int64)

    def deepest(self, v: tuple) -> tuple[int, int]:
        """``(i, row)``: the longest prefix ``v[:i]`` (``i < len(v)``) whose distribution is
        held, and the row holding it (at position ``i``); ``(-1, -1)`` when none is."""
        at = self._at
        if not v or () not in at:
            return -1, -1
        lo, hi = 0, len(v) - 1  # v[:lo] is held; find the largest such lo <= hi
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if v[:mid] in at:
                lo = mid
            else:
                hi = mid - 1
        return lo, at[v[:lo]]


class Reused(NamedTuple):
    """What is known of new rows before any forward: ``known int64[N]`` positions (and steps)
    per row; each row's deepest held prefix's length ``depth`` and the row it is copied from
    (``src_row``, -1: none); the step out of that prefix where it is named there
    (``named_step``, NaN: not named, ``known`` stops before it)."""

    known: np.ndarray
    depth: np.ndarray
    src_row: np.ndarray
    named_step: np.ndarray


def plan(views: list, prefixes: KnownPrefixes, s: ScoredArrays, fetched: dict, eos: int | None) -> Reused:
    """How much of each new view is known (see the module docstring)."""
    out = nothing_known(len(views))
    found = [(r, *prefixes.deepest(v)) for r, v in enumerate(views)]
    found = [f for f in found if f[1] >= 0]
    if not found:
        return out
    r, depth, row = (np.array(col, np.int64) for col in zip(*found))
    token = np.array([views[a][d] for a, d in zip(r.tolist(), depth.tolist())], np.int64)
    step = _named_steps(s, row, depth, token, eos)
    for n in range(r.size) if fetched else ():  # a fetched full row names every token
        full_row = fetched.get(views[r[n]][: depth[n]])
        if full_row is not None and token[n] < full_row.size:
            step[n] = full_row[token[n]]
    out.depth[r], out.src_row[r], out.named_step[r] = depth, row, step
    out.known[r] = np.where(np.isnan(step), depth, depth + 1)
    return out


def nothing_known(n: int) -> Reused:
    """The plan of ``n`` rows of which nothing is held."""
    return Reused(np.zeros(n, np.int64), np.full(n, -1, np.int64), np.full(n, -1, np.int64), np.full(n, np.nan))


def _named_steps(s: ScoredArrays, row: np.ndarray, pos: np.ndarray, token: np.ndarray, eos: int | None) -> np.ndarray:
    """float64[R]: ``log p(token[i] | prefix)`` from the distribution the set holds at ``(row[i],
    pos[i])``: its eos log-prob for ``eos``, else the token's top-m entry, NaN where the top-m
    does not name it (a padding entry, id 0 at -inf, names nothing)."""
    hit = s.top_ids[row, pos] == token[:, None]
    value = s.top_lps[row, pos, np.argmax(hit, axis=1)].astype(np.float64)
    value = np.where(hit.any(axis=1) & (value > -np.inf), value, np.nan)
    if eos is not None:
        value = np.where(token == eos, s.eos_lps[row, pos], value)
    return value


def assemble(views: list, reused: Reused, s: ScoredArrays | None, fresh: FrontierScores | None) -> FrontierScores:
    """The full per-position arrays of the new ``views``: known positions copied from
    ``s`` (``reused``), the rest from ``fresh`` (positions ``known[i]..`` of row ``i``,
    left-aligned; None when nothing was computed). Scores are the sums of the steps. Each kind
    of copy is one gather over every row's positions."""
    n = len(views)
    m = max([a.top_lps.shape[2] for a in (s, fresh) if a is not None] + [1])
    lens = np.array([len(v) for v in views], np.int64)
    width = int(lens.max(initial=1))
    steps = np.zeros((n, width))
    top_lps = np.full((n, width, m), -np.inf, np.float32)
    top_ids = np.zeros((n, width, m), np.int32)
    eos_lps = np.full((n, width), -np.inf, np.float32)
    k, src, depth = reused.known, reused.src_row, reused.depth
    held = src >= 0
    if held.any():  # positions 0..depth of the source row are this row's own prefixes
        r, p = ragged_positions(np.where(held, depth, 0))  # the steps into them
        steps[r, p] = s.steps[src[r], p]
        r, p = ragged_positions(np.where(held, np.minimum(k, depth + 1), 0))  # their distributions
        top_lps[r, p] = _widen(s.top_lps[src[r], p], m)
        top_ids[r, p] = _widen(s.top_ids[src[r], p], m)
        eos_lps[r, p] = s.eos_lps[src[r], p]
        named = np.flatnonzero(held & (k > depth))  # the step out of the deepest held prefix
        steps[named, depth[named]] = reused.named_step[named]
    r, p = ragged_positions(lens - k)  # computed: fresh row r's positions 0.. are its k[r]..
    if r.size:
        steps[r, k[r] + p] = fresh.steps[r, p]
        top_lps[r, k[r] + p] = _widen(fresh.top_lps[r, p], m)
        top_ids[r, k[r] + p] = _widen(fresh.top_ids[r, p], m)
        eos_lps[r, k[r] + p] = fresh.eos_lps[r, p]
    return FrontierScores(steps.sum(axis=1), steps, top_lps, top_ids, eos_lps)


def _widen(named: np.ndarray, m: int) -> np.ndarray:
    """``named: [P, m0]`` top-m values or ids widened to ``m`` by repeating the last (smallest)
    one: what a narrower forward left unnamed stays bounded by its smallest named value."""
    return np.pad(named, ((0, 0), (0, m - named.shape[1])), mode="edge") if named.shape[1] < m else named


def pad_fresh(fs: FrontierScores, idx: np.ndarray, n: int) -> FrontierScores:
    """``fs`` of the rows ``idx`` of a batch of ``n`` placed at those rows (others empty)."""
    w, m = fs.top_lps.shape[1:]
    out = FrontierScores(np.zeros(n), np.zeros((n, w)), np.full((n, w, m), -np.inf, np.float32),
                         np.zeros((n, w, m), np.int32), np.full((n, w), -np.inf, np.float32))
    for full, part in zip(out, fs):
        full[idx] = part
    return out


def shift_left(fs: FrontierScores, by: np.ndarray) -> FrontierScores:
    """A full forward's arrays with row ``i``'s first ``by[i]`` positions dropped (left-aligned
    like a cached forward's)."""
    fills = (0.0, -np.inf, 0, -np.inf)
    return FrontierScores(fs.scores, *(scores.shift_left(a, by, f) for a, f in zip(fs[1:], fills)))
