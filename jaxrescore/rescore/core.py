"""The rescoring core: pure, jit- and vmap-safe functions over padded arrays.

One pulled batch of ``N`` draft-ordered candidates (row ``j`` is the draft's rank ``j``) carries its
target scores, draft scores and a ``valid`` mask. :func:`rescore` orders the valid rows by target
score, cuts the ``[start, start + k)`` slice and decides the certificate; :class:`GapCarry` threads
the running diagnostics from call to call, in the style of optax states (``init_carry`` /
``rescore`` returning the new carry). A query's ``rerank_window`` is not an argument: it is the
length of the valid prefix, so queries with different windows over one pulled batch differ only in
their masks, and ``jax.vmap`` over a leading query axis runs a whole sweep in one call.

Certificate (see DESIGN.md §4): with ``n = sum(valid)`` rows pulled, ``edge_bounds[n - 1]`` bounds
the draft score of every sequence the pull did not include (``-inf``: nothing exists beyond the
pull; NaN: no sound bound). Then::

    certified = 1  iff  the slice holds k items and (edge == -inf or worst >= edge + assumed_gap)
                    or  the slice is short and edge == -inf (the draft support is exhausted)
    certified = 0  otherwise, and -1 when assumed_gap is NaN (certification not requested).

Only one side of the gap is used: an unpulled sequence ``u`` could displace a returned one only if
``target(u) > worst``, and then ``target(u) <= draft(u) + assumed_gap <= edge + assumed_gap <= worst``
is the contradiction. So what must hold is ``target(u) - draft(u) <= assumed_gap`` for every
sequence scoring above the worst returned one; ``|target - draft| <= assumed_gap`` everywhere is the
simple sufficient condition, and ``excess`` (the running max of ``target - draft``) is the side to
watch.

The comparison keeps ``tolerance`` (the target's own score noise, see
:mod:`jaxrescore.models.scores`) plus a few units in the last place of the operands, so neither
the target's float noise nor rounding to the working dtype can make it pass.

The library never certifies against its own evidence: when the running max observed ``target -
draft`` (the carry's ``max_excess``, this batch included) exceeds ``assumed_gap + tolerance``, the
assumption is refuted and ``certified`` is 0 — even when the draft support is exhausted, since a
sequence the draft rules out need not be ruled out by a target that breaks the gap. A sequence
with a finite target score that the draft rules out (draft ``-inf``) is evidence too: its excess
is ``+inf``, which refutes every gap. A draft score of NaN means "not known" (a sequence the
search found and the draft could not score) and is no evidence either way.

Evidence is per batch, not per query: :func:`rescore_sweep` refutes every query of a sweep from
EVERY row scored in its one target call (and the carry before it), so a narrow query never
certifies while a wider one scored in the same call holds a refuting sequence; each query then
equals a fresh index's answer to it, asked after the sweep's widest query.

Rows whose target score is ``-inf`` (outside the target's support) are never returned.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike, DTypeLike

CERT_NONE, CERT_FALSE, CERT_TRUE = -1, 0, 1
# Why the certificate came out as it did (RescoreOutput.why): the one decision, read by the
# shell's reason text and by the search that grows a pull until certified.
WHY_NOT_ASKED, WHY_NO_BOUND, WHY_UNSCORED, WHY_REFUTED, WHY_EXHAUSTED, WHY_SHORT, WHY_CLEARS, WHY_SHORT_OF = range(8)


class GapCarry(NamedTuple):
    """Running diagnostics threaded through :func:`rescore` (a pytree).

    Attributes:
      max_gap: float[], running max of ``|target - draft|`` over rescored pairs with a finite
        target score and a known draft score (``+inf`` when the draft gave such a pair ``-inf``).
      max_excess: float[], running max of ``target - draft`` over the same pairs (-inf before any):
        the one side of the gap the certificate relies on (see :func:`rescore`).
      sequences: int32[], sequences rescored so far.
      calls: int32[], batched target calls made so far.
    """

    max_gap: jax.Array
    max_excess: jax.Array
    sequences: jax.Array
    calls: jax.Array


def init_carry(dtype: DTypeLike = jnp.float32) -> GapCarry:
    """The carry of an index that has rescored nothing yet."""
    return GapCarry(
        jnp.zeros((), dtype), jnp.full((), -jnp.inf, dtype), jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32)
    )


class RescoreOutput(NamedTuple):
    """Result of one :func:`rescore` call (a pytree; add a leading axis under ``vmap``).

    Attributes:
      perm: int32[k_max], rows of the pulled batch in target-descending order (ties by draft rank);
        0 where ``mask`` is False.
      log_probs: float[k_max], target scores of those rows; -inf where ``mask`` is False.
      mask: bool[k_max], True on the returned items.
      certified: int8[], -1 (not requested), 0 (not proven) or 1 (proven complete).
      bound: float[], the draft bound the certificate was checked against; NaN where none applies
        (not requested, nothing left unpulled, or no sound bound).
      gap: float[], running max observed ``|target - draft|`` including this batch.
      excess: float[], running max observed ``target - draft`` including this batch.
      why: int8[], the reason of ``certified``, one of ``WHY_*``: not asked (no gap), no sound
        bound, a pulled row left unscored, the gap refuted by the evidence, the draft exhausted,
        the slice short of k, the worst score clears the bound + gap, or it does not.
      refuted: bool[], whether the evidence (``excess``) refutes ``assumed_gap`` by more than the
        tolerance, whatever else decided ``why`` (False when no gap was supplied).
    """

    perm: jax.Array
    log_probs: jax.Array
    mask: jax.Array
    certified: jax.Array
    bound: jax.Array
    gap: jax.Array
    excess: jax.Array
    why: jax.Array
    refuted: jax.Array


def target_order(target_lps: jax.Array, valid: jax.Array) -> jax.Array:
    """Rows ``int32[N]`` sorted by target score descending, ties by draft rank (row index), invalid
    rows last. A ``-inf`` target is a real (off-support) score and sorts after every finite one but
    before padding."""
    n = target_lps.shape[0]
    rows = jnp.arange(n, dtype=jnp.int32)
    invalid = (~valid).astype(jnp.int32)
    neg = jnp.where(valid, -target_lps, jnp.inf)
    _, _, order = jax.lax.sort((invalid, neg, rows), num_keys=3)
    return order


def _clears(worst, bound, assumed_gap, tolerance):
    """``worst >= bound + assumed_gap + tolerance`` with a rounding margin that only ever makes
    it harder."""
    eps = jnp.finfo(worst.dtype).eps
    margin = 8 * eps * (jnp.abs(worst) + jnp.abs(bound) + jnp.abs(assumed_gap))
    return worst - (bound + assumed_gap) >= margin + tolerance


def update_carry(carry: GapCarry, target_lps: ArrayLike, draft_lps: ArrayLike, valid: ArrayLike, calls: ArrayLike = 1,
                 sequences: ArrayLike | None = None) -> GapCarry:
    """The carry after rescoring the valid rows of one batch: every row with a finite target
    score and a known (non-NaN) draft score is evidence, ``+inf`` excess where the draft rules
    the sequence out. The batch took ``calls`` target calls (1: one teacher-forcing call) that
    evaluated ``sequences`` sequences and rows (None: the valid rows)."""
    finite = valid & jnp.isfinite(target_lps) & ~jnp.isnan(draft_lps)
    diffs = jnp.where(finite, target_lps - draft_lps, 0)
    dtype = carry.max_gap.dtype
    return GapCarry(
        max_gap=jnp.maximum(carry.max_gap, jnp.max(jnp.abs(diffs), initial=0).astype(dtype)),
        max_excess=jnp.maximum(carry.max_excess, jnp.max(jnp.where(finite, diffs, -jnp.inf), initial=-jnp.inf).astype(dtype)),
        sequences=carry.sequences + (jnp.sum(valid, dtype=jnp.int32) if sequences is None else sequences),
        calls=carry.calls + calls,
    )


def rescore(
    target_lps: ArrayLike,
    draft_lps: ArrayLike,
    valid: ArrayLike,
    edge_bounds: ArrayLike,
    start: ArrayLike,
    k: ArrayLike,
    assumed_gap: ArrayLike,
    carry: GapCarry,
    *,
    k_max: int,
    tolerance: ArrayLike = 0.0,
) -> tuple[RescoreOutput, GapCarry]:
    """Target-rerank one query over a pulled batch and decide its certificate.

    Args:
      target_lps: float[N], target scores of the pulled rows. A NaN row is never returned and
        makes the certificate 0 (the shell reports NaN from a target as an error before here).
      draft_lps: float[N], draft scores of the pulled rows.
      valid: bool[N], True on this query's pulled rows; must be a prefix (rows ``0..n-1``).
      edge_bounds: float[N], ``edge_bounds[j]`` = sound upper bound on the draft score of every
        sequence ranked after row ``j`` (``-inf``: none exists; NaN: no bound). Only
        ``edge_bounds[n - 1]`` is read, ``n = sum(valid)`` (``edge_bounds[0]`` when ``n == 0``).
      start: int[], first target rank returned, >= 0 (a negative start returns only the ranks >= 0
        of the slice and never certifies).
      k: int[], number of items asked for, ``>= 1``; ``k <= k_max``, or ``k_max`` covers every
        valid row (then the slice is short and never full).
      assumed_gap: float[], assumed bound on ``|target - draft|``; NaN = not supplied.
      carry: the :class:`GapCarry` before this call.
      k_max: static int, the output length.
      tolerance: float[], nats the target's scores may move between forwards; the certificate
        needs that much to spare, and observed excess beyond ``assumed_gap + tolerance`` refutes
        the assumption.

    Returns:
      ``(RescoreOutput, GapCarry)``.
    """
    target_lps = jnp.asarray(target_lps)
    pulled = jnp.asarray(valid, bool)
    n_pulled = jnp.sum(pulled, dtype=jnp.int32)
    scored = ~jnp.isnan(target_lps)
    rescored = pulled & scored
    # A -inf target score means "outside the target's support": never an answer.
    valid = rescored & (target_lps > -jnp.inf)
    n_rows = target_lps.shape[0]
    n_valid = jnp.sum(valid, dtype=jnp.int32)

    order = target_order(target_lps, valid)
    slots = jnp.arange(k_max, dtype=jnp.int32)
    ranks = start + slots
    mask = (slots < k) & (ranks >= 0) & (ranks < n_valid)
    perm = jnp.where(mask, order[jnp.clip(ranks, 0, n_rows - 1)], 0)
    log_probs = jnp.where(mask, target_lps[perm], -jnp.inf)

    worst = jnp.min(jnp.where(mask, log_probs, jnp.inf))
    # The bound covers what lies beyond the PULLED prefix; an unscored (NaN) pulled row is a
    # candidate nobody ranked, so no certificate can hold while one exists.
    edge = jnp.asarray(edge_bounds)[jnp.clip(n_pulled - 1, 0, n_rows - 1)]
    exhausted = edge == -jnp.inf
    has_bound = ~jnp.isnan(edge)
    full = (jnp.sum(mask) >= k) & (start >= 0)
    all_scored = ~jnp.any(pulled & ~scored)
    new_carry = update_carry(carry, target_lps, jnp.asarray(draft_lps), rescored)
    refuted = new_carry.max_excess > assumed_gap + tolerance
    cleared = full & has_bound & _clears(worst, edge, assumed_gap, tolerance)
    # Exhaustion of the DRAFT's support also leans on the gap (a sequence the draft rules out
    # must be ruled out by the target too), so a refuted gap voids it as well.
    proven = all_scored & ~refuted & (exhausted | cleared)
    requested = ~jnp.isnan(assumed_gap)
    certified = jnp.where(requested, proven.astype(jnp.int8), jnp.int8(CERT_NONE))
    bound = jnp.where(requested & has_bound & ~exhausted, edge, jnp.nan)

    why = jnp.select(
        [~requested, ~has_bound, ~all_scored, refuted, exhausted, ~full, cleared],
        [WHY_NOT_ASKED, WHY_NO_BOUND, WHY_UNSCORED, WHY_REFUTED, WHY_EXHAUSTED, WHY_SHORT, WHY_CLEARS],
        WHY_SHORT_OF,
    ).astype(jnp.int8)
    out = RescoreOutput(
        perm, log_probs, mask, certified, bound.astype(target_lps.dtype), new_carry.max_gap, new_carry.max_excess, why,
        requested & refuted,
    )
    return out, new_carry


def rescore_sweep(
    target_lps: ArrayLike,
    draft_lps: ArrayLike,
    valid: ArrayLike,
    edge_bounds: ArrayLike,
    starts: ArrayLike,
    ks: ArrayLike,
    assumed_gaps: ArrayLike,
    carry: GapCarry,
    *,
    k_max: int,
    tolerance: ArrayLike = 0.0,
    evidence: ArrayLike | None = None,
    calls: ArrayLike = 1,
    sequences: ArrayLike | None = None,
) -> tuple[RescoreOutput, GapCarry]:
    """:func:`rescore` vmapped over a leading query axis ``Q`` of ``valid [Q, N]``, ``starts``,
    ``ks`` and ``assumed_gaps [Q]``; the batch arrays, the carry and ``tolerance`` are shared.

    The evidence rule (see the module docstring): the carry is first updated ONCE with every row
    any query covers (one target call) and every row of ``evidence`` (bool[N], optional: pairs
    observed in the call that are no answer of any query), and every query decides against that
    carry, so query ``q`` equals :func:`rescore` of its own rows with the batch's carry. Returns
    the per-query outputs (leading axis ``Q``) and that one carry, which counts ``calls`` target
    calls and ``sequences`` evaluated (see :func:`update_carry`): a search's rounds and fetched
    rows, scored before this one decision."""
    target_lps, draft_lps = jnp.asarray(target_lps), jnp.asarray(draft_lps)
    covered = jnp.any(jnp.asarray(valid, bool), axis=0)
    if evidence is not None:
        covered |= jnp.asarray(evidence, bool)
    covered &= ~jnp.isnan(target_lps)
    batch_carry = update_carry(carry, target_lps, draft_lps, covered, calls, sequences)
    per_query = jax.vmap(
        lambda v, s, k, g: rescore(
            target_lps, draft_lps, v, edge_bounds, s, k, g, batch_carry, k_max=k_max, tolerance=tolerance
        )[0]
    )
    return per_query(valid, starts, ks, assumed_gaps), batch_carry


def merge_carries(a: GapCarry, b: GapCarry) -> GapCarry:
    """One carry for the evidence of two (e.g. two indexes' rescoring of one shared call, or
    shards of one batch): the larger gap and excess, the summed counters."""
    return GapCarry(
        jnp.maximum(a.max_gap, b.max_gap), jnp.maximum(a.max_excess, b.max_excess),
        a.sequences + b.sequences, a.calls + b.calls,
    )
