"""The proof verdict: is a slice of the scored set the target's exact answer? Decided in one
place, from the frontier bound (:mod:`jaxrescore.rescore.frontier`) and the slice's worst score.

A slice ``[start, start + k)`` of the first ``n`` scored sequences is *proven* when ``start >=
0``, the target's numbers for one prefix agree between forwards within its ``score_tolerance``
(assumption 4), its cached numbers agree with its full forward within the tolerance wherever a
full forward checked them, and every scored sequence the slice's worst score does not clear by
the tolerance has been checked (assumption 5: the answer's scores are its full forward's), and
the worst returned score clears the frontier bound by the tolerance (or no exit is left: the rows
are the target's whole support).

:func:`check_proof` decides one slice on the host (a search's stop test, with the exits it opens
next); :func:`proof_verdict` is the same decision as a pure function of arrays, and
:func:`check_proofs` decides many queries of one scored set at once (a sweep: one frontier per
distinct row count). The frontier itself is one fixed-shape function: the host runs it with numpy
(no compile), and :func:`~jaxrescore.rescore.frontier.frontier_bound` is the same function under
``jax.jit``, to ``vmap`` over queries or scored sets inside a user's own jitted code.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np

from jaxrescore.rescore.assumptions import check_structure
from jaxrescore.rescore.frontier import (
    Frontier,
    ScoredArrays,
    clears,
    frontier,
    frontier_values,
    structure_numbers,
)
from jaxrescore.sequences import bucket_size
from jaxrescore.typing import ArrayLike


class Proof(NamedTuple):
    """A frontier verdict: ``proven`` (None: the target gives no distributions), the frontier
    bound (None when unavailable) and why."""

    proven: bool | None
    frontier_bound: float | None
    reason: str


NO_DISTRIBUTIONS = Proof(None, None, "the target gives no next-token distributions (no score_frontier)")


def kth_best(scores: np.ndarray, rank: int) -> float:
    """The score at 0-based target ``rank`` among ``scores`` (-inf when there are fewer)."""
    if rank < 0:
        return np.inf
    if scores.size <= rank:
        return -np.inf
    return float(-np.partition(-scores, rank)[rank])


def open_floor(worst: float, tolerance: float) -> float:
    """A score below every exit that ``worst`` could fail to clear (see :func:`clears`, whose
    float64 slack this exceeds), so exits below it can be left out: ``-inf`` unless finite."""
    if not np.isfinite(worst):
        return -np.inf
    return worst - tolerance - 1e-9 * (1.0 + abs(worst) + tolerance)


def proof_verdict(worst: ArrayLike, start: ArrayLike, bound: ArrayLike, moved: ArrayLike, tolerance: ArrayLike,
                  xp: Any = jnp) -> ArrayLike:
    """The verdict as arrays (jit- and vmap-safe with ``xp=jax.numpy``): bool, see the module
    docstring. ``worst`` is the slice's worst target score, ``-inf`` when it holds fewer than k."""
    return (start >= 0) & (moved <= tolerance) & clears(worst, bound, tolerance, xp)


def slice_worst(log_probs: ArrayLike, mask: ArrayLike, k: ArrayLike, xp: Any = jnp) -> ArrayLike:
    """The worst score of a core output's slice (``log_probs``, ``mask``: float[k_max],
    bool[k_max]), ``-inf`` when it holds fewer than ``k`` items (pure with ``xp=jax.numpy``)."""
    full = xp.sum(mask) >= k
    return xp.where(full, xp.min(xp.where(mask, log_probs, xp.inf)), -xp.inf)


def explain(proven: bool, bound: float, moved: float, worst: float, n: int, start: int, k: int,
            tolerance: float) -> Proof:
    """The :class:`Proof` of a decided verdict, with the reason in words."""
    if start < 0:
        return Proof(False, bound, "a negative start asks for ranks that do not exist")
    if not moved <= tolerance:
        return Proof(False, bound, (
            f"the target's numbers for one prefix moved by {moved:.6g} nats between forwards, "
            f"more than its score tolerance {tolerance:g}: no proof rests on them (raise the "
            "target's score_tolerance if that noise is expected)"))
    if bound == -np.inf:
        return Proof(proven, bound, f"the {n} scored sequences are the target's whole support")
    if worst == -np.inf:
        return Proof(proven, bound, f"fewer than start + k = {start + k} scored sequences are in the target's support")
    verb = "clears" if proven else "does not clear"
    return Proof(proven, bound, (
        f"worst returned target log-prob {worst:.6g} {verb} the frontier bound {bound:.6g} + the "
        f"target's score tolerance {tolerance:g}"))


def check_proof(scored, n: int, start: int, k: int) -> tuple[Proof, Frontier | None]:
    """Whether the target's top ``[start, start + k)`` among the first ``n`` sequences of
    ``scored`` (a :class:`~jaxrescore.rescore.scored.ScoredSet`) is its exact answer over the whole
    support, on the host; with the frontier (its exits: what a search opens next)."""
    if not scored.proves:
        return NO_DISTRIBUTIONS, None
    worst = kth_best(scored.target_lps[:n], start + k - 1)
    floor, growing = open_floor(worst, scored.tolerance), getattr(scored, "growing", None)
    if growing is not None and n == len(scored):  # recomputed only where the set grew (rescore.growing)
        front = growing(scored.arrays(n), scored.structure, floor)
    else:
        front = frontier(scored.arrays(n), scored.structure, floor=floor, rows_checked=True)
    proven = bool(proof_verdict(worst, start, front.bound, front.moved, scored.tolerance, np))
    proof = explain(proven, front.bound, front.moved, worst, n, start, k, scored.tolerance)
    return on_cache(proof, scored, n, start + k - 1), front


def on_cache(proof: Proof, scored, n: int, rank: int) -> Proof:
    """``proof`` of a slice of the first ``n`` rows of ``scored`` whose worst is at 0-based
    ``rank``, refused where it would rest on the target's cached numbers (assumption 5 of
    :mod:`jaxrescore.rescore.frontier`): when a full forward disagreed with them beyond the
    tolerance (:attr:`~jaxrescore.rescore.scored.ScoredSet.drift`), or when a row it rests on
    was never checked by one (:meth:`~jaxrescore.rescore.scored.ScoredSet.unchecked`)."""
    drift, tolerance = getattr(scored, "drift", 0.0), scored.tolerance
    if proof.proven is not None and rank >= 0 and not drift <= tolerance:
        return Proof(False, proof.frontier_bound, (
            f"the target's cached (incremental) forward disagrees with its full forward by {drift:.6g} "
            f"nats on sequence {scored.drift_at}, more than its score tolerance {tolerance:g}: no proof "
            "rests on the cached numbers (raise the target's score_tolerance if that noise is expected)"))
    if proof.proven and rank >= 0:
        unchecked = scored.unchecked(rank, n)
        if unchecked.size:
            return Proof(False, proof.frontier_bound, (
                f"{proof.reason}, but {unchecked.size} scored sequences it rests on hold cached "
                "(incremental) numbers that no full forward has checked"))
    return proof


def padded(s: ScoredArrays, rows: int, width: int) -> ScoredArrays:
    """``s`` padded on the host to ``rows`` sequences and ``width`` positions (and a power of two
    of fetched rows and of their width), so one compiled proof check serves many scored sets."""
    n, length = s.tokens.shape
    m = s.top_ids.shape[2]
    r, v = s.row_values.shape
    r_to, v_to = bucket_size(max(r, 1), 1), bucket_size(max(v, 1), 1)

    def pad(a, shape, fill):
        out = np.full(shape, fill, a.dtype)
        out[tuple(slice(0, d) for d in a.shape)] = a
        return out

    return ScoredArrays(
        pad(s.tokens, (rows, width), -1), pad(s.lengths, (rows,), 0), pad(s.whole, (rows,), False),
        pad(s.steps[:, :length], (rows, width), 0.0), pad(s.top_lps[:, :length], (rows, width, m), -np.inf),
        pad(s.top_ids[:, :length], (rows, width, m), 0), pad(s.eos_lps[:, :length], (rows, width), -np.inf),
        pad(s.row_prefixes, (r_to, width), -1), pad(s.row_lengths, (r_to,), -1),
        pad(s.row_values, (r_to, v_to), -np.inf),
        None if s.top_max is None else pad(s.top_max[:, :length], (rows, width), -np.inf),
    )


def frontier_bounds(scored, rows: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """``(bound float64[Q], moved float64[Q])``: the frontier of the first ``rows[q]`` sequences of
    ``scored`` for every ``q``, computed once per distinct row count (a proving sweep: once)."""
    check_structure(scored.structure)  # the rows: checked as the scored set added them
    numbers = structure_numbers(scored.structure)
    at = {}
    for r in sorted(set(rows)):
        head = scored.arrays(r)  # the query's own rows: work follows them, not the widest pull
        at[r] = frontier_values(head, np.ones(r, bool), *numbers)[:2] if r else frontier(head, scored.structure)[::2]
    return np.array([at[r][0] for r in rows], np.float64), np.array([at[r][1] for r in rows], np.float64)


def check_proofs(scored, rows: list[int], starts: list[int], ks: list[int], worsts: list[float]) -> list[Proof]:
    """The verdicts of many slices of one scored set (query ``q``: ``[starts[q], starts[q] +
    ks[q])`` of the first ``rows[q]`` sequences, whose worst score is ``worsts[q]``), decided
    together by :func:`proof_verdict` over the frontiers of :func:`frontier_bounds`."""
    if not scored.proves:
        return [NO_DISTRIBUTIONS] * len(rows)
    bounds, moved = frontier_bounds(scored, rows)
    verdicts = proof_verdict(np.asarray(worsts, np.float64), np.asarray(starts), bounds, moved, scored.tolerance, np)
    return [on_cache(explain(bool(ok), float(b), float(mv), float(w), r, s, k, scored.tolerance), scored, r, s + k - 1)
            for ok, b, mv, w, r, s, k in zip(np.atleast_1d(verdicts), bounds, moved, worsts, rows, starts, ks)]
