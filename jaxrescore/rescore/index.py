"""RescoredIndex: draft-ordered, target-scored enumeration with window reranking (the spec's shell).

A thin class in the style of flax nnx's ``Optimizer``: it holds the draft index, the target and a
:class:`~jaxrescore.rescore.core.GapCarry`, validates arguments, pulls candidates, makes ONE batched
target call per query (or per sweep) and hands the arrays to the pure core.
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import jax
import numpy as np

from jaxrescore.rescore.core import CERT_NONE, CERT_TRUE, GapCarry, rescore_sweep
from jaxrescore.rescore.draft import DraftBound, DraftPull, DraftView
from jaxrescore.sequences import bucket_size

# Incremented whenever the jitted sweep is traced: tests assert that sweeps over many windows,
# ks and starts reuse a handful of compiled shapes.
TRACE_COUNTS: collections.Counter = collections.Counter()


def _traced_sweep(*args, k_max):
    TRACE_COUNTS["rescore_sweep"] += 1
    return rescore_sweep(*args, k_max=k_max)


_jit_sweep = jax.jit(_traced_sweep, static_argnames="k_max")


def require_int(value: Any, name: str, *, minimum: int) -> int:
    """An exact integer ``>= minimum`` (integral floats such as ``4.0`` accepted; bools refused)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if isinstance(value, (float, np.floating)) and not (math.isfinite(value) and value == math.floor(value)):
        raise ValueError(f"{name} must be a whole number >= {minimum}, got {value!r}")
    if int(value) < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def require_gap(value: Any, name: str = "assumed_gap") -> float | None:
    """None, or a finite non-negative float."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name} must be None or a finite number >= 0 (nats), got {value!r}")
    gap = float(value)
    if not math.isfinite(gap) or gap < 0:
        raise ValueError(f"{name} must be None or a finite number >= 0 (nats), got {value!r}")
    return gap


@dataclass(frozen=True)
class RescoreResult:
    """Outcome of a :class:`RescoredIndex` query: target-exact items plus an explicit certificate.

    ``top_k``/``slice`` are speculative: the items are always target-exact and target-ordered, but
    completeness is proven only when ``certified is True`` — check that, not ``items`` alone.

    Attributes:
      items: ``(sequence, target_log_prob)`` pairs, target-exact, sorted by target score (ties by
        draft rank).
      certified: None when no ``assumed_gap`` was supplied (certification never attempted); True
        only when the draft support was exhausted or the returned set's worst target score
        provably clears ``bound + assumed_gap`` (every unpulled sequence is then below it); False
        when certification was requested but not proven (no sound bound, a short result from a
        draft that is not exhausted, or the bound did not clear the gap).
      bound: the certified upper bound on any unpulled candidate's draft log-prob that the
        certificate was checked against, or None when no bound applies: nothing was left
        unpulled (the draft support was exhausted), no ``assumed_gap`` was supplied, or the draft
        index could not supply a sound bound.
      gap: running max observed ``|target_lp - draft_lp|`` over everything rescored on this index
        so far, including this query: a diagnostic, never a certificate.
      reason: why ``certified`` is what it is, in words.
      excess: running max observed ``target_lp - draft_lp`` (the side of the gap the certificate
        relies on: a target scoring far ABOVE its draft is what could hide a sequence; a draft
        over-scoring junk cannot); -inf before any finite pair.
      draft_log_probs: the draft's log-prob of each item, aligned with ``items``.
      draft_ranks: the draft rank of each item, aligned with ``items`` (its position in the pulled
        head; an index that repeats a sequence has the repeats dropped and never certifies).
    """

    items: list
    certified: bool | None
    bound: float | None
    gap: float
    reason: str = ""
    excess: float = -math.inf
    draft_log_probs: tuple = field(default=())
    draft_ranks: tuple = field(default=())


class _Query:
    __slots__ = ("start", "k", "window", "gap")

    def __init__(self, start, k, window, gap):
        self.start = require_int(start, "start", minimum=0)
        self.k = require_int(k, "k", minimum=1)
        self.window = require_int(window, "rerank_window", minimum=0)
        self.gap = require_gap(gap)

    @property
    def extent(self) -> int:
        return self.start + self.k + self.window


def as_scorer(target: Any):
    """The batch scorer of a target: its ``score_sequences`` method, or the callable itself."""
    method = getattr(target, "score_sequences", None)
    if callable(method):
        return method
    if callable(target):
        return target
    raise TypeError(
        "target must have a score_sequences(seqs) method or be a callable [seqs] -> log_probs, "
        f"got {type(target).__name__}"
    )


def checked_scores(raw: Any, seqs: list) -> np.ndarray:
    """Validate a target's answer for ``seqs``: ``float64[len(seqs)]``, no NaN, no +inf."""
    scores = np.asarray(raw, dtype=np.float64)
    if scores.size != len(seqs) or scores.ndim > 1 and scores.shape[0] != len(seqs):
        raise ValueError(f"target returned {scores.size} scores of shape {scores.shape} for {len(seqs)} sequences")
    scores = scores.reshape(len(seqs))
    bad = np.flatnonzero(np.isnan(scores) | (scores == np.inf))
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"target returned {scores[i]} for sequence {seqs[i]} ({bad.size} invalid scores in all); "
            "a log-prob must be a number <= 0 or -inf"
        )
    return scores


class RescoredIndex:
    """Draft-ordered, target-scored enumeration with window reranking.

    Args:
      draft_index: any index with ``unrank(i) -> (sequence, draft_log_prob)``; ``unrank_batch``,
        ``ensure_count`` and ``len()`` are used when present. Sound certification needs
        ``bucket_bound(n)`` (our SeekIndex) or a ``.quantizer`` with the truncation reports of
        :mod:`jaxrescore.rescore.draft`; without them queries work but never certify.
      target: the expensive model (its ``score_sequences`` batch scorer is used) or a bare callable
        ``[list of token tuples] -> log_probs``. Its ``max_len``, when it has one no larger than
        the draft's, tells the bound to skip the prefixes a terminating draft cut at ``max_len``
        (their completions are outside the target's support).
      rerank_window: extra draft candidates pulled and reranked by target score; an integer >= 0.
      assumed_gap: optional global bound on ``|target_lp - draft_lp|`` in nats, finite and >= 0.
        When supplied, results carry a real ``certified`` verdict; otherwise it is None.

    The certificate needs ``target(u) <= draft(u) + assumed_gap`` for every sequence ``u`` that
    scores above the worst returned item (``|target - draft| <= assumed_gap`` everywhere is the
    simple sufficient condition); in particular a sequence the draft gives -inf must have target
    -inf, since the draft index never enumerates it.
    """

    def __init__(self, draft_index: Any, target: Any, *, rerank_window: int = 64, assumed_gap: float | None = None):
        self.rerank_window = require_int(rerank_window, "rerank_window", minimum=0)
        self.assumed_gap = require_gap(assumed_gap)
        self._draft = DraftView(draft_index, target_max_len=getattr(target, "max_len", None))
        self._score = as_scorer(target)
        self.draft_index = draft_index
        self.target = target
        self._carry = GapCarry(0.0, -math.inf, 0, 0)

    @property
    def carry(self) -> GapCarry:
        """The running diagnostics (host scalars)."""
        return self._carry

    @property
    def gap(self) -> float:
        """Running max observed ``|target - draft|`` over everything rescored so far."""
        return float(self._carry.max_gap)

    @property
    def excess(self) -> float:
        """Running max observed ``target - draft`` over everything rescored so far."""
        return float(self._carry.max_excess)

    @property
    def target_calls(self) -> int:
        """Batched target calls made so far (one per query, sweep or rescore_many)."""
        return int(self._carry.calls)

    @property
    def target_sequences(self) -> int:
        """Sequences scored by the target so far."""
        return int(self._carry.sequences)

    def top_k(self, k: int) -> RescoreResult:
        """The ``k`` best sequences by TARGET score among the ``k + rerank_window`` draft head."""
        return self._run([_Query(0, k, self.rerank_window, self.assumed_gap)])[0]

    def slice(self, start: int, k: int) -> RescoreResult:
        """Target-reranked ``[start, start + k)`` slice of the pulled ``start + k + rerank_window``
        head; the certificate covers whether an unpulled sequence could belong in or before it."""
        return self._run([_Query(start, k, self.rerank_window, self.assumed_gap)])[0]

    def unrank(self, i: int) -> RescoreResult:
        """The target-reranked rank-``i`` item: ``slice(i, 1)``."""
        return self.slice(i, 1)

    def sweep(
        self,
        starts: Sequence[int],
        ks: Sequence[int],
        rerank_windows: Sequence[int] | None = None,
        assumed_gaps: Sequence[float | None] | None = None,
    ) -> list[RescoreResult]:
        """Many queries at once: ONE pull of the largest extent, ONE target call, ONE vmapped core
        call. Result ``q`` equals what a fresh index with window ``rerank_windows[q]`` (default this
        index's) and gap ``assumed_gaps[q]`` (default this index's) returns for
        ``slice(starts[q], ks[q])``, except that ``gap`` also counts earlier queries on this index."""
        starts, ks = list(starts), list(ks)
        windows = [self.rerank_window] * len(starts) if rerank_windows is None else list(rerank_windows)
        gaps = [self.assumed_gap] * len(starts) if assumed_gaps is None else list(assumed_gaps)
        if not starts or not len(starts) == len(ks) == len(windows) == len(gaps):
            raise ValueError(
                "sweep needs non-empty starts and ks (and rerank_windows, assumed_gaps when given) of "
                f"one length, got lengths {len(starts)}, {len(ks)}, {len(windows)}, {len(gaps)}"
            )
        return self._run([_Query(*q) for q in zip(starts, ks, windows, gaps)])

    def _run(self, queries: list[_Query]) -> list[RescoreResult]:
        pull, bounds = self._prepare(queries)
        scores = checked_scores(self._score(pull.seqs), pull.seqs) if pull.seqs else np.zeros(0)
        return self._finish(queries, pull, scores, bounds)

    def _prepare(self, queries: list[_Query]) -> tuple[DraftPull, dict]:
        """Pull the largest extent once and bound what lies beyond each query's pull."""
        pull = self._draft.pull(max(q.extent for q in queries))
        bounds = {}
        for q in queries:
            n = min(q.extent, len(pull.seqs))
            if q.gap is not None and n not in bounds:
                bounds[n] = self._draft.bound(n, pull)
        return pull, bounds

    def _finish(self, queries: list[_Query], pull: DraftPull, scores: np.ndarray, bounds: dict) -> list[RescoreResult]:
        """Run the core on validated target scores and only then update the carry."""
        out = self._core(queries, pull, scores, bounds)
        gaps = np.asarray(out.gap, np.float64)[: len(queries)]
        excess = np.asarray(out.excess, np.float64)[: len(queries)]
        self._carry = GapCarry(
            float(max(self._carry.max_gap, gaps.max())),
            float(max(self._carry.max_excess, excess.max())),
            self._carry.sequences + len(pull.seqs),
            self._carry.calls + (1 if pull.seqs else 0),
        )
        return [self._result(q, i, out, pull, scores, bounds) for i, q in enumerate(queries)]

    def _core(self, queries, pull: DraftPull, scores: np.ndarray, bounds: dict):
        """Pad to power-of-two shapes and run the jitted vmapped core in float64."""
        n_pulled = len(pull.seqs)
        rows, n_q = bucket_size(n_pulled, 8), bucket_size(len(queries), 1)
        k_max = bucket_size(max(q.k for q in queries), 8)
        target = np.full(rows, -np.inf)
        target[:n_pulled] = scores
        draft = np.full(rows, -np.inf)
        draft[:n_pulled] = pull.draft_lps
        edges = np.full(rows, np.nan)
        for n, b in bounds.items():
            edges[max(n - 1, 0)] = b.value
        valid = np.zeros((n_q, rows), bool)
        starts, ks, gaps = np.zeros(n_q, np.int32), np.ones(n_q, np.int32), np.full(n_q, np.nan)
        for i, q in enumerate(queries):
            valid[i, : min(q.extent, n_pulled)] = True
            starts[i], ks[i] = q.start, q.k
            gaps[i] = np.nan if q.gap is None else q.gap
        carry = GapCarry(np.float64(self._carry.max_gap), np.float64(self._carry.max_excess), np.int32(0), np.int32(0))
        with jax.enable_x64(True):
            out, _ = _jit_sweep(target, draft, valid, edges, starts, ks, gaps, carry, k_max=k_max)
            return jax.tree.map(np.asarray, out)

    def _result(self, q: _Query, i: int, out, pull: DraftPull, scores: np.ndarray, bounds: dict) -> RescoreResult:
        rows = np.asarray(out.perm[i])[np.asarray(out.mask[i])]
        items = [(pull.seqs[r], float(scores[r])) for r in rows]
        code = int(out.certified[i])
        bound = float(out.bound[i])
        n = min(q.extent, len(pull.seqs))
        return RescoreResult(
            items=items,
            certified=None if code == CERT_NONE else code == CERT_TRUE,
            bound=None if math.isnan(bound) else bound,
            gap=float(out.gap[i]),
            excess=float(out.excess[i]),
            reason=_reason(q, items, code, bounds.get(n), n),
            draft_log_probs=tuple(float(pull.draft_lps[r]) for r in rows),
            draft_ranks=tuple(int(r) for r in rows),
        )


def _reason(q: _Query, items: list, code: int, bound: DraftBound | None, n: int) -> str:
    """Why the certificate came out as it did, from the same facts the core decided on."""
    if code == CERT_NONE:
        return "no assumed_gap supplied: certification not attempted"
    assert bound is not None
    if bound.value == -math.inf:
        return f"draft support exhausted after {n} sequences: every draft sequence was rescored ({bound.why})"
    if math.isnan(bound.value):
        return f"no sound bound on unpulled sequences: {bound.why}"
    if len(items) < q.k:
        return f"only {len(items)} of k={q.k} items: the draft ran out, but it is not exhausted"
    worst = items[-1][1]
    need = bound.value + q.gap
    verb = "clears" if code == CERT_TRUE else "does not clear"
    return (
        f"worst returned target log-prob {worst:.6g} {verb} bound {bound.value:.6g} + assumed_gap "
        f"{q.gap:.6g} = {need:.6g} (bound from {bound.why})"
    )
