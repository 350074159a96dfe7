"""ScoredSet: the sequences a query has had the target score, with what the proof needs of them.

One query (or one search) keeps every sequence the target scored in one ScoredSet, so a later
round scores only NEW sequences: one batched target call per :meth:`ScoredSet.add`. With a
target that has ``score_frontier`` the same call returns each position's top-m next-token
log-probs (see :mod:`jaxrescore.models.frontier`); the set turns them into the padded
:class:`~jaxrescore.rescore.frontier.ScoredArrays` the frontier bound is computed from.

Rows sent to the target are the sequences cut at the target's ``max_len`` and after their first
``eos``: those are exactly the positions whose prefixes a support sequence can share, and every
model can evaluate them. A sequence outside the target's support scores ``-inf``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from jaxrescore.models.frontier import DEFAULT_TOP_M, FrontierScores, score_tolerance
from jaxrescore.rescore.frontier import ScoredArrays, Structure
from jaxrescore.sequences import from_tuples


def target_structure(target: Any) -> Structure | None:
    """The target's support as a :class:`Structure`, or None when it does not say (a bare
    scoring function)."""
    try:
        return Structure(int(target.vocab_size), None if target.eos is None else int(target.eos), int(target.max_len))
    except (AttributeError, TypeError, ValueError):
        return None


def checked_scores(raw: Any, seqs: list, tolerance: float = 0.0) -> np.ndarray:
    """Validate a target's answer for ``seqs``: ``float64[len(seqs)]``, real numbers, no NaN, no
    +inf, none above ``tolerance`` (a log-prob is <= 0; float noise within the target's
    tolerance is clipped to 0)."""
    arr = np.asarray(raw)
    if arr.dtype.kind != "f":
        raise ValueError(
            f"target returned scores of dtype {arr.dtype}; expected float log-probs (<= 0 or -inf)"
        )
    scores = arr.astype(np.float64)
    if scores.size != len(seqs) or scores.ndim > 1 and scores.shape[0] != len(seqs):
        raise ValueError(f"target returned {scores.size} scores of shape {scores.shape} for {len(seqs)} sequences")
    scores = scores.reshape(len(seqs))
    bad = np.flatnonzero(np.isnan(scores) | (scores > tolerance))
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"target returned {scores[i]} for sequence {seqs[i]} ({bad.size} invalid scores in all); "
            "a log-prob must be a number <= 0 or -inf"
        )
    return np.minimum(scores, 0.0)


def forward_rows(seqs: list, structure: Structure) -> tuple[list, np.ndarray]:
    """The rows to score (each sequence cut at ``max_len`` and after its first ``eos``) and
    ``bool[N]``: whether each sequence is in the target's support."""
    rows, ok = [], np.zeros(len(seqs), bool)
    for i, s in enumerate(seqs):
        cut = s[: structure.max_len]
        if structure.eos is not None and structure.eos in cut:
            cut = cut[: cut.index(structure.eos) + 1]
        rows.append(cut)
        if structure.eos is None:
            ok[i] = len(s) == structure.max_len
        else:
            ok[i] = len(cut) == len(s) and len(s) > 0 and s[-1] == structure.eos
    return rows, ok


class ScoredSet:
    """Every sequence one query had the target score (see the module docstring).

    Args:
      target: the target model, or a bare callable ``[seqs] -> log_probs``.
      score: the target's batch scorer (``score_sequences`` or the callable).
      top_m: top next-token log-probs kept per position when the target has ``score_frontier``.

    Attributes:
      seqs: the scored sequences (tuples), in the order added.
      proves: whether the target gave distributions (``score_frontier``): only then is a frontier
        bound available.
      calls, sequences: target calls made and sequences (or prefix rows) evaluated by this set.
    """

    def __init__(self, target: Any, score, top_m: int = DEFAULT_TOP_M):
        self.target = target
        self._score = score
        self.top_m = top_m
        self.structure = target_structure(target)
        self.tolerance = score_tolerance(target)
        self.proves = callable(getattr(target, "score_frontier", None)) and self.structure is not None
        self.seqs: list = []
        self.where: dict = {}
        self.rows: dict = {}  # prefix -> fetched full next-token row
        self._target: list[np.ndarray] = []
        self._draft: list[np.ndarray] = []
        self._ranks: list[np.ndarray] = []
        self._blocks: list[tuple] = []  # per add: (rows, FrontierScores)
        self._adds: list[int] = []  # per add: its first sequence
        self._packed: list = []  # per add, built on demand: padded tokens and (width, _padded parts)
        self._cache: ScoredArrays | None = None
        self.calls = 0
        self.sequences = 0

    def __len__(self) -> int:
        return len(self.seqs)

    @property
    def target_lps(self) -> np.ndarray:
        return np.concatenate(self._target) if self._target else np.zeros(0)

    @property
    def draft_lps(self) -> np.ndarray:
        return np.concatenate(self._draft) if self._draft else np.zeros(0)

    @property
    def ranks(self) -> np.ndarray:
        """int64[N]: each sequence's draft rank, -1 for one found by the search."""
        return np.concatenate(self._ranks) if self._ranks else np.zeros(0, np.int64)

    def new(self, seqs: list) -> list:
        """The sequences of ``seqs`` not scored yet, each once, in order."""
        seen, out = set(self.where), []
        for s in seqs:
            if s not in seen:
                seen.add(s)
                out.append(s)
        return out

    def score(self, seqs: list):
        """Score ``seqs`` in ONE target call: ``(float64[N] scores, (rows, FrontierScores) or
        None)``. Does not add them (see :meth:`add`)."""
        if not self.proves:
            return checked_scores(self._score(seqs), seqs, self.tolerance), None
        rows, ok = forward_rows(seqs, self.structure)
        fs = self.target.score_frontier(rows, top_m=self.top_m)
        scores = checked_scores(fs.scores, seqs, self.tolerance)
        return np.where(ok, scores, -np.inf), (rows, fs)

    def add(self, seqs: list, draft_lps, ranks, *, scored=None) -> None:
        """Add sequences not scored yet (the caller passes only new ones), scoring them in one
        target call unless ``scored`` (from :meth:`score`, e.g. a call shared by several sets)
        is given; a failed call leaves the set unchanged."""
        if not seqs:
            return
        if scored is None:
            scored = self.score(seqs)
            self.calls += 1
        self.sequences += len(seqs)
        scores, block = scored
        self._adds.append(len(self.seqs))
        for i, s in enumerate(seqs, start=len(self.seqs)):
            self.where[s] = i
        self.seqs.extend(seqs)
        self._target.append(np.asarray(scores, np.float64))
        self._draft.append(np.asarray(draft_lps, np.float64).reshape(len(seqs)))
        self._ranks.append(np.asarray(ranks, np.int64).reshape(len(seqs)))
        if block is not None:
            self._blocks.append(block)
        self._cache = None

    def fetch_rows(self, prefixes: list) -> None:
        """Fetch the target's full next-token rows of ``prefixes`` in one call (for exits whose
        token the top-m does not name)."""
        prefixes = [p for p in dict.fromkeys(prefixes) if p not in self.rows]
        if not prefixes:
            return
        width = max(1, max(len(p) for p in prefixes))
        toks = np.zeros((len(prefixes), width), np.int32)
        for i, p in enumerate(prefixes):
            toks[i, : len(p)] = p
        lens = np.array([len(p) for p in prefixes], np.int32)
        rows = np.asarray(self.target.next_logprobs(toks, lens), np.float32)
        if rows.shape[0] != len(prefixes) or np.isnan(rows).any():
            raise ValueError(f"target.next_logprobs returned {rows.shape} rows (or NaN) for {len(prefixes)} prefixes")
        self.calls += 1
        self.sequences += len(prefixes)
        for p, r in zip(prefixes, rows):
            self.rows[p] = np.minimum(r, 0.0)
        self._cache = None

    def arrays(self, n: int | None = None) -> ScoredArrays:
        """The first ``n`` scored sequences (all by default) as padded arrays."""
        full = self._arrays()
        if n is None or n >= len(self.seqs):
            return full
        return ScoredArrays(*(a[:n] for a in full[:7]), full.rows)

    def _arrays(self) -> ScoredArrays:
        if self._cache is not None:
            return self._cache
        ends = self._adds[1:] + [len(self.seqs)]
        for i in range(len(self._packed), len(self._adds)):  # each add packed once, on demand
            batch = from_tuples(self.seqs[self._adds[i] : ends[i]])
            self._packed.append([np.where(batch.mask, batch.tokens, -1).astype(np.int64), batch.lengths, None])
        length = max([t.shape[1] for t, _, _ in self._packed] + [1])
        tokens = np.concatenate([np.zeros((0, length), np.int64)] + [
            np.pad(t, ((0, 0), (0, length - t.shape[1])), constant_values=-1) for t, _, _ in self._packed])
        lengths = np.concatenate([np.zeros(0, np.int64)] + [n.astype(np.int64) for _, n, _ in self._packed])
        width = max([b[1].steps.shape[1] for b in self._blocks] + [1])
        m = self._blocks[0][1].top_lps.shape[2] if self._blocks else 1
        parts = []
        for packed, (rows, fs) in zip(self._packed, self._blocks):
            if packed[2] is None or packed[2][0] != width:  # a wider later block re-pads the rest
                packed[2] = (width, _padded(rows, fs, width, m))
            parts.append(packed[2][1])
        cols = list(zip(*parts)) if parts else [[np.zeros(0, np.int64)], [np.zeros((0, width))],
                                                 [np.zeros((0, width, m), np.float32)],
                                                 [np.zeros((0, width, m), np.int32)],
                                                 [np.zeros((0, width), np.float32)]]
        known, steps, top_lps, top_ids, eos_lps = (np.concatenate(c) for c in cols)
        self._cache = ScoredArrays(tokens, lengths, known, steps, top_lps, top_ids, eos_lps, self.rows)
        return self._cache


def _padded(rows: list, fs: FrontierScores, width: int, m: int):
    """One block's arrays widened to ``width`` positions (padding: no distribution)."""
    n, w = fs.steps.shape
    pad = width - w
    known = np.array([len(r) for r in rows], np.int64)
    steps = np.pad(fs.steps, ((0, 0), (0, pad)))
    top_lps = np.pad(fs.top_lps, ((0, 0), (0, pad), (0, 0)), constant_values=-np.inf)
    top_ids = np.pad(fs.top_ids, ((0, 0), (0, pad), (0, 0)))
    eos_lps = np.pad(fs.eos_lps, ((0, 0), (0, pad)), constant_values=-np.inf)
    return known, steps, top_lps, top_ids, eos_lps


def nan_to_none(value: float) -> float | None:
    return None if value is None or math.isnan(value) else float(value)
