"""From a scored set to results: the jitted core decides order and certificate, the proof check
decides ``proven``, and the host converts both to :class:`RescoreResult` objects.

The certificate is decided once, by :func:`jaxrescore.rescore.core.rescore_sweep`; its ``why``
code is what the reason text and the growing search read, never a second decision.
"""

from __future__ import annotations

import collections
import math
from typing import Any

import jax
import numpy as np

from jaxrescore.models.mesh import to_host
from jaxrescore.models.text import codec_of
from jaxrescore.rescore.core import (
    CERT_NONE,
    CERT_TRUE,
    WHY_EXHAUSTED,
    WHY_NO_BOUND,
    WHY_NOT_ASKED,
    WHY_REFUTED,
    WHY_SHORT,
    WHY_SHORT_OF,
    WHY_UNSCORED,
    GapCarry,
    RescoreOutput,
    rescore_sweep,
)
from jaxrescore.rescore.draft import DraftBound
from jaxrescore.rescore.proof import Proof, check_proof, check_proofs, slice_worst
from jaxrescore.rescore.queries import Query
from jaxrescore.rescore.result import RescoreResult
from jaxrescore.rescore.scored import ScoredSet
from jaxrescore.sequences import bucket_size

# Incremented whenever the jitted sweep is traced: tests assert that sweeps over many windows,
# ks and starts reuse a handful of compiled shapes.
TRACE_COUNTS: collections.Counter = collections.Counter()

# Minimum padded rows and output slots of the jitted core (see run_core).
MIN_CORE_ROWS = 1024
MIN_CORE_K = 32


def _traced_sweep(*args, k_max, tolerance, evidence, calls, sequences):
    TRACE_COUNTS["rescore_sweep"] += 1
    return rescore_sweep(*args, k_max=k_max, tolerance=tolerance, evidence=evidence, calls=calls, sequences=sequences)


_jit_sweep = jax.jit(_traced_sweep, static_argnames="k_max")


def run_core(queries: list[Query], scored: ScoredSet, rows: list[int], bounds: dict,
             carry: GapCarry) -> tuple[RescoreOutput, GapCarry]:
    """The core over ``scored`` (query ``i`` covers its first ``rows[i]`` rows; ``bounds[r]``
    bounds the draft score of what lies beyond ``r`` rows) with the carry before it: host arrays
    of the per-query outputs and the carry after the scored set's calls, padded to power-of-two
    shapes and run jitted and vmapped in float64."""
    n = len(scored)
    ev_target, ev_draft = scored.evidence  # observations of the gap that are no answers
    # Every new shape compiles the core (0.6-1.2 s on CPU, measured), while running it on
    # 1024 rows costs ~0.6 ms: generous minimum buckets make most queries share one compile.
    size, n_q = bucket_size(n + ev_target.size, MIN_CORE_ROWS), bucket_size(len(queries), 1)
    # A query returns at most its rows: memory follows the answer, never a huge k. Clipping k
    # and start to n + 1 keeps every verdict (a k above the rows is short either way).
    k_max = bucket_size(max(min(q.k, r) for q, r in zip(queries, rows)), MIN_CORE_K)
    target = np.full(size, -np.inf)
    draft = np.full(size, -np.inf)
    target[:n], draft[:n] = scored.target_lps, scored.draft_lps
    target[n : n + ev_target.size], draft[n : n + ev_target.size] = ev_target, ev_draft
    evidence = np.zeros(size, bool)
    evidence[n : n + ev_target.size] = True
    edges = np.full(size, np.nan)
    valid = np.zeros((n_q, size), bool)
    starts, ks, gaps = np.zeros(n_q, np.int32), np.ones(n_q, np.int32), np.full(n_q, np.nan)
    for i, (q, r) in enumerate(zip(queries, rows)):
        bound = bounds.get(r)
        if bound is not None:
            edges[max(r - 1, 0)] = bound.value
        valid[i, :r] = True
        starts[i], ks[i] = min(q.start, n + 1), min(q.k, n + 1)
        gaps[i] = np.nan if q.gap is None else q.gap
    with jax.enable_x64(True):
        start = GapCarry(np.float64(carry.max_gap), np.float64(carry.max_excess), np.int32(carry.sequences),
                         np.int32(carry.calls))
        out, after = _jit_sweep(
            target, draft, valid, edges, starts, ks, gaps, start, k_max=k_max,
            tolerance=np.float64(scored.tolerance), evidence=evidence, calls=np.int32(scored.calls),
            sequences=np.int32(scored.sequences),
        )
        return jax.tree.map(to_host, out), jax.tree.map(to_host, after)


def decide_proofs(queries: list[Query], out: RescoreOutput, scored: ScoredSet, rows: list[int]) -> list[Proof]:
    """Every query's proof: one host check for a single query, one jitted vmapped check for many."""
    worsts = [float(slice_worst(out.log_probs[i], out.mask[i], q.k, np)) for i, q in enumerate(queries)]
    if len(queries) == 1:
        return [check_proof(scored, rows[0], queries[0].start, queries[0].k)[0]]
    return check_proofs(scored, rows, [q.start for q in queries], [q.k for q in queries], worsts)


def results(queries: list[Query], out: RescoreOutput, scored: ScoredSet, rows: list[int], bounds: dict,
            proofs: list[Proof], rounds: int, texts) -> list[RescoreResult]:
    """The :class:`RescoreResult` of every query (``texts(items) -> list | None`` decodes)."""
    return [_result(q, i, out, scored, rows[i], bounds, proofs[i], rounds, texts) for i, q in enumerate(queries)]


def _result(q: Query, i: int, out, scored: ScoredSet, n: int, bounds: dict, proof: Proof, rounds: int,
            texts) -> RescoreResult:
    rows = np.asarray(out.perm[i])[np.asarray(out.mask[i])]
    target, draft, ranks = scored.target_lps, scored.draft_lps, scored.ranks
    items = [(scored.seqs[r], float(target[r])) for r in rows]
    code = int(out.certified[i])
    bound = float(out.bound[i])
    return RescoreResult(
        items=items,
        certified=None if code == CERT_NONE else code == CERT_TRUE,
        bound=None if math.isnan(bound) else bound,
        gap=float(out.gap[i]),
        excess=float(out.excess[i]),
        reason=certificate_reason(q, items, int(out.why[i]), bounds.get(n), n, float(out.excess[i]), scored.tolerance),
        draft_log_probs=tuple(float(draft[r]) for r in rows),
        draft_ranks=tuple(None if ranks[r] < 0 else int(ranks[r]) for r in rows),
        proven=proof.proven,
        frontier_bound=proof.frontier_bound,
        proof_reason=proof.reason,
        rounds=rounds,
        texts=texts(items),
        positions=scored.positions,
        check_positions=scored.check_positions,
        gap_refuted=None if q.gap is None else bool(out.refuted[i]),
    )


def certificate_reason(q: Query, items: list, why: int, bound: DraftBound | None, n: int, excess: float,
                       tolerance: float) -> str:
    """The core's certificate decision (its ``why`` code) in words, with the numbers it read."""
    if why == WHY_NOT_ASKED:
        return "no assumed_gap supplied: certification not attempted"
    if why == WHY_NO_BOUND:
        return f"no sound bound on unpulled sequences: {bound.why if bound is not None else 'none given'}"
    if why == WHY_UNSCORED:
        return "a pulled candidate was left unscored: no certificate while one exists"
    if why == WHY_REFUTED:
        return (
            f"assumed_gap {q.gap:.6g} is refuted by the library's own observations: a "
            f"sequence the target scored (in this call or earlier on this index) has target - draft = "
            f"{excess:.6g} > assumed_gap + tolerance {tolerance:g}"
        )
    if why == WHY_EXHAUSTED:
        return (
            f"draft support exhausted: every sequence the draft index holds is among the {n} rescored "
            f"({bound.why}), and no rescored sequence refutes the gap"
        )
    if why == WHY_SHORT:
        return f"only {len(items)} of k={q.k} items: the draft ran out, but it is not exhausted"
    worst = items[-1][1]
    need = bound.value + q.gap + tolerance
    verb = "clears" if why != WHY_SHORT_OF else "does not clear"
    return (
        f"worst returned target log-prob {worst:.6g} {verb} bound {bound.value:.6g} + assumed_gap "
        f"{q.gap:.6g} + the target's score tolerance {tolerance:g} = {need:.6g} (bound from {bound.why})"
    )


def item_texts(target: Any, items: list) -> list | None:
    """The items as text with ``target``'s codec, each after its prompt (as a ``generate``
    returns it); None when the target has no codec."""
    codec = codec_of(target)
    prompt = tuple(getattr(target, "prompt", ()))
    return None if codec is None else [codec.decode(prompt + tuple(seq)) for seq, _ in items]
