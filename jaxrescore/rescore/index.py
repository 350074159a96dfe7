"""RescoredIndex: draft-ordered, target-scored enumeration with window reranking (the spec's shell).

A thin class in the style of flax nnx's ``Optimizer``: it holds the draft index, the target and a
:class:`~jaxrescore.rescore.core.GapCarry`, validates arguments, pulls candidates, makes ONE batched
target call per query (or per sweep) and hands the arrays to the pure core. With a target that
gives next-token distributions (every model of :mod:`jaxrescore.models`), the same call also
yields the frontier bound (:mod:`jaxrescore.rescore.frontier`): every result says whether its
answer is *proven* the target's exact top-k, with no assumption. ``prove=True`` runs the
speculative exact search (:mod:`jaxrescore.rescore.search`) until it is.
"""

from __future__ import annotations

import collections
import math
import threading
from typing import Any, Sequence

import jax
import numpy as np

from jaxrescore._checks import check_float, check_int
from jaxrescore.models.scores import DEFAULT_TOP_M, check_top_m
from jaxrescore.rescore.core import CERT_NONE, CERT_TRUE, GapCarry, rescore_sweep
from jaxrescore.rescore.draft import DraftBound, DraftPull, DraftView
from jaxrescore.models.text import codec_of
from jaxrescore.rescore.result import RescoreResult
from jaxrescore.rescore.scored import ScoredSet, forward_rows, target_structure
from jaxrescore.rescore.search import (
    SEARCH_WIDTH,
    Proof,
    SearchBudget,
    check_proof,
    completion_model,
    first_width,
    greedy_complete,
    prove_search,
)
from jaxrescore.sequences import bucket_size

# Incremented whenever the jitted sweep is traced: tests assert that sweeps over many windows,
# ks and starts reuse a handful of compiled shapes.
TRACE_COUNTS: collections.Counter = collections.Counter()

DEFAULT_MAX_ROUNDS = 32
# A search's default budget of target sequences grows with the answer: 65,536, or 1,024 per item
# asked (start + k), whichever is larger, so a larger k is never held to a small k's budget.
DEFAULT_MAX_SEQUENCES = 1 << 16
SEQUENCES_PER_ITEM = 1024
# Minimum padded rows and output slots of the jitted core (see RescoredIndex._core).
MIN_CORE_ROWS = 1024
MIN_CORE_K = 32


def _traced_sweep(*args, k_max, tolerance, evidence):
    TRACE_COUNTS["rescore_sweep"] += 1
    return rescore_sweep(*args, k_max=k_max, tolerance=tolerance, evidence=evidence)


_jit_sweep = jax.jit(_traced_sweep, static_argnames="k_max")


def search_budget(max_rounds: Any, max_sequences: Any, start: int, k: int) -> SearchBudget:
    """The budget of one search: ``max_rounds`` >= 1, and ``max_sequences`` >= 1 or None (then
    :data:`DEFAULT_MAX_SEQUENCES` or :data:`SEQUENCES_PER_ITEM` per item asked, the larger)."""
    rounds = check_int(max_rounds, "max_rounds", minimum=1)
    if max_sequences is None:
        return SearchBudget(rounds, max(DEFAULT_MAX_SEQUENCES, SEQUENCES_PER_ITEM * (start + k)))
    return SearchBudget(rounds, check_int(max_sequences, "max_sequences", minimum=1))


def require_gap(value: Any, name: str = "assumed_gap") -> float | None:
    """None, or a finite number of nats >= 0."""
    return check_float(value, name, minimum=0.0, allow_none=True, unit="nats")


class _Query:
    __slots__ = ("start", "k", "window", "gap")

    def __init__(self, start, k, window, gap):
        self.start = check_int(start, "start", minimum=0)
        self.k = check_int(k, "k", minimum=1)
        self.window = check_int(window, "rerank_window", minimum=0)
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


class RescoredIndex:
    """Draft-ordered, target-scored enumeration with window reranking and proofs.

    Args:
      draft_index: any index with ``unrank(i) -> (sequence, draft_log_prob)``; ``unrank_batch``,
        ``ensure_count`` and ``len()`` are used when present. Sound certification needs
        ``bucket_bound(n)`` (our SeekIndex) or a ``.quantizer`` with the truncation reports of
        :mod:`jaxrescore.rescore.draft`; without them queries work but never certify. Proofs
        (``proven``) need nothing of it: its order only decides how fast they come.
      target: the expensive model (its ``score_frontier`` or ``score_sequences`` is used) or a
        bare callable ``[list of token tuples] -> log_probs`` (then ``proven`` is None). Its
        ``max_len``, when it has one no larger than the draft's, tells the bound to skip the
        prefixes a terminating draft cut at ``max_len``.
      rerank_window: extra draft candidates pulled and reranked by target score; an integer >= 0.
      assumed_gap: optional global bound on ``|target_lp - draft_lp|`` in nats, finite and >= 0.
        When supplied, results carry a real ``certified`` verdict; otherwise it is None.
      draft_model: the model ``prove=True`` completes exit prefixes with (default: the draft
        index's ``.model``; the reference library's per-prefix models are wrapped). Without one
        the search completes with the target itself, one target call per token.
      top_m: next-token log-probs kept per position of the target's forward for the frontier
        bound (more: fewer full-row fetches on a wide vocabulary, more memory).
      completion_branch: paths the search speculates per open exit: the draft's likeliest
        ``completion_branch`` tokens after the exit, each completed greedily (1: greedy only).
      search_width: the first round of a proving search opens at most ``search_width * k``
        exits (the best by bound), each later round twice as many as the last; None opens every
        open exit every round (fewest rounds, most positions with a poor draft).

    The certificate needs ``target(u) <= draft(u) + assumed_gap`` for every sequence ``u`` that
    scores above the worst returned item (``|target - draft| <= assumed_gap`` everywhere is the
    simple sufficient condition); ``proven`` needs nothing but the target's own forward.

    Thread safety: queries on one RescoredIndex run one at a time (a lock around the pull, the
    target call and the carry update); sharing the object between threads is safe.
    """

    def __init__(
        self,
        draft_index: Any,
        target: Any,
        *,
        rerank_window: int = 64,
        assumed_gap: float | None = None,
        draft_model: Any = None,
        top_m: int = DEFAULT_TOP_M,
        completion_branch: int = 1,
        search_width: int | None = SEARCH_WIDTH,
    ):
        self.rerank_window = check_int(rerank_window, "rerank_window", minimum=0)
        self.assumed_gap = require_gap(assumed_gap)
        self.top_m = check_top_m(top_m)
        self.completion_branch = check_int(completion_branch, "completion_branch", minimum=1)
        self.search_width = None if search_width is None else check_int(search_width, "search_width", minimum=1)
        self._draft = DraftView(draft_index, target_max_len=getattr(target, "max_len", None))
        self._score = as_scorer(target)
        self.draft_index = draft_index
        self.target = target
        self.draft_model = completion_model(draft_index, draft_model, target)
        self._draft_scorer = draft_scorer(draft_index, draft_model, self.draft_model)
        self._carry = GapCarry(0.0, -math.inf, 0, 0)
        self._positions = 0
        self._lock = threading.RLock()

    def __repr__(self) -> str:
        return (
            f"RescoredIndex(draft_index={type(self.draft_index).__name__}, target={type(self.target).__name__}, "
            f"rerank_window={self.rerank_window}, assumed_gap={self.assumed_gap}, "
            f"target_calls={self.target_calls}, target_sequences={self.target_sequences})"
        )

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
        """Batched target calls made so far (scoring rounds and full-row fetches)."""
        return int(self._carry.calls)

    @property
    def target_positions(self) -> int:
        """Token positions the target computed so far (every full forward counts its prompt)."""
        return self._positions

    @property
    def target_sequences(self) -> int:
        """Sequences (and fetched prefix rows) evaluated by the target so far."""
        return int(self._carry.sequences)

    def top_k(
        self,
        k: int,
        *,
        prove: bool = False,
        until_certified: bool = False,
        max_rounds: int = DEFAULT_MAX_ROUNDS,
        max_sequences: int | None = None,
    ) -> RescoreResult:
        """The ``k`` best sequences by TARGET score among the ``k + rerank_window`` draft head.

        Args:
          k: items to return, an integer >= 1.
          prove: run the speculative exact search until ``proven`` (see
            :mod:`jaxrescore.rescore.search`): needs no ``assumed_gap``, works over any draft index.
          until_certified: grow the draft pull until ``certified`` holds (needs ``assumed_gap``
            and a draft index with ``bucket_bound``); each growth scores only new sequences.
          max_rounds: scoring rounds (batched target calls) allowed to a search, >= 1.
          max_sequences: sequences (and fetched next-token rows) the target may evaluate in a
            search, >= 1; None (default): 65,536 or 1,024 per item asked, whichever is larger.
        """
        return self.slice(
            0, k, prove=prove, until_certified=until_certified, max_rounds=max_rounds, max_sequences=max_sequences
        )

    def slice(
        self,
        start: int,
        k: int,
        *,
        prove: bool = False,
        until_certified: bool = False,
        max_rounds: int = DEFAULT_MAX_ROUNDS,
        max_sequences: int | None = None,
    ) -> RescoreResult:
        """Target-reranked ``[start, start + k)`` slice of the pulled ``start + k + rerank_window``
        head; the verdicts cover whether an unpulled sequence could belong in or before it.
        ``prove``, ``until_certified`` and the budgets are as in :meth:`top_k`."""
        q = _Query(start, k, self.rerank_window, self.assumed_gap)
        budget = search_budget(max_rounds, max_sequences, q.start, q.k)
        for name, flag in (("prove", prove), ("until_certified", until_certified)):
            if not isinstance(flag, (bool, np.bool_)):
                raise ValueError(f"{name} must be True or False, got {flag!r}")
        if until_certified and q.gap is None:
            raise ValueError("until_certified=True needs an assumed_gap (the certificate is gap-based)")
        with self._lock:
            if not (prove or until_certified):
                return self._run([q])[0]
            return self._search(q, bool(prove), bool(until_certified), budget)

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
        ``slice(starts[q], ks[q])`` when asked after the sweep's widest pull: every query's
        ``gap``, ``excess`` and certificate see every sequence scored in the sweep's one call (and
        earlier on this index), so no query certifies against evidence that call holds."""
        try:
            starts, ks = list(starts), list(ks)
            windows = [self.rerank_window] * len(starts) if rerank_windows is None else list(rerank_windows)
            gaps = [self.assumed_gap] * len(starts) if assumed_gaps is None else list(assumed_gaps)
        except TypeError as err:
            raise ValueError(f"sweep needs sequences of starts and ks (and windows, gaps): {err}") from None
        if not starts or not len(starts) == len(ks) == len(windows) == len(gaps):
            raise ValueError(
                "sweep needs non-empty starts and ks (and rerank_windows, assumed_gaps when given) of "
                f"one length, got lengths {len(starts)}, {len(ks)}, {len(windows)}, {len(gaps)}"
            )
        queries = [_Query(*q) for q in zip(starts, ks, windows, gaps)]
        with self._lock:
            return self._run(queries)

    # -- one pull, one call ------------------------------------------------------------------------

    def new_scored_set(self) -> ScoredSet:
        """An empty :class:`ScoredSet` for this index's target."""
        return ScoredSet(self.target, self._score, self.top_m, self._draft_scores)

    def _run(self, queries: list[_Query]) -> list[RescoreResult]:
        pull, bounds = self._prepare(queries)
        scored = self.new_scored_set()
        scored.add(pull.seqs, pull.draft_lps, np.arange(len(pull.seqs)))
        return self._finish(queries, scored, bounds)

    def _prepare(self, queries: list[_Query]) -> tuple[DraftPull, dict]:
        """Pull the largest extent once and bound what lies beyond each query's pull."""
        pull = self._draft.pull(max(q.extent for q in queries))
        bounds = {}
        for q in queries:
            n = min(q.extent, len(pull.seqs))
            if q.gap is not None and bounds.get(n) is None:
                bounds[n] = self._draft.bound(n, pull)
        return pull, bounds

    def _finish(self, queries: list[_Query], scored: ScoredSet, bounds: dict, rows=None, proofs=None, rounds=1) -> list[RescoreResult]:
        """Run the core on the scored set (query ``i`` covers its first ``rows[i]`` rows, by
        default the pulled head ``min(extent, n)``) and only then update the carry."""
        n = len(scored)
        rows = [min(q.extent, n) for q in queries] if rows is None else rows
        out = self._core(queries, scored, rows, bounds)
        gaps = np.asarray(out.gap, np.float64)[: len(queries)]
        excess = np.asarray(out.excess, np.float64)[: len(queries)]
        self._carry = GapCarry(
            float(max(self._carry.max_gap, gaps.max())),
            float(max(self._carry.max_excess, excess.max())),
            self._carry.sequences + scored.sequences,
            self._carry.calls + scored.calls,
        )
        self._positions += scored.positions
        if proofs is None:
            fronts: dict = {}
            proofs = []
            for q, r in zip(queries, rows):
                proof, fronts[r] = check_proof(scored, r, q.start, q.k, fronts.get(r))
                proofs.append(proof)
        return [self._result(q, i, out, scored, rows[i], bounds, proofs[i], rounds) for i, q in enumerate(queries)]

    def _core(self, queries, scored: ScoredSet, rows: list, bounds: dict):
        """Pad to power-of-two shapes and run the jitted vmapped core in float64."""
        n = len(scored)
        ev_target, ev_draft = scored.evidence  # observations of the gap that are no answers
        # Every new shape compiles the core (0.6-1.2 s on CPU, measured), while running it on
        # 1024 rows costs ~0.6 ms: generous minimum buckets make most queries share one compile.
        size, n_q = bucket_size(n + ev_target.size, MIN_CORE_ROWS), bucket_size(len(queries), 1)
        # A query returns at most its rows: memory follows the answer, never a huge k. Clipping k
        # and start to n + 1 keeps every verdict (a k above the rows is short either way).
        k_max = bucket_size(max(min(q.k, r) for q, r in zip(queries, rows)), MIN_CORE_K)
        target = np.full(size, -np.inf)
        target[:n] = scored.target_lps
        draft = np.full(size, -np.inf)
        draft[:n] = scored.draft_lps
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
        carry = GapCarry(np.float64(self._carry.max_gap), np.float64(self._carry.max_excess), np.int32(0), np.int32(0))
        with jax.enable_x64(True):
            out, _ = _jit_sweep(
                target, draft, valid, edges, starts, ks, gaps, carry, k_max=k_max,
                tolerance=np.float64(scored.tolerance), evidence=evidence,
            )
            return jax.tree.map(np.asarray, out)

    def _result(self, q: _Query, i: int, out, scored: ScoredSet, n: int, bounds: dict, proof: Proof, rounds: int) -> RescoreResult:
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
            reason=_reason(q, items, code, bounds.get(n), n, float(out.excess[i]), scored.tolerance),
            draft_log_probs=tuple(float(draft[r]) for r in rows),
            draft_ranks=tuple(None if ranks[r] < 0 else int(ranks[r]) for r in rows),
            proven=proof.proven,
            frontier_bound=proof.frontier_bound,
            proof_reason=proof.reason,
            rounds=rounds,
            texts=self._texts(items),
            positions=scored.positions,
        )

    def _texts(self, items: list) -> list | None:
        """The items as text with the target's codec, each after its prompt (as a ``generate``
        returns it); None when the target has no codec."""
        codec = codec_of(self.target)
        prompt = tuple(getattr(self.target, "prompt", ()))
        return None if codec is None else [codec.decode(prompt + tuple(seq)) for seq, _ in items]

    # -- searches ----------------------------------------------------------------------------------

    def _search(self, q: _Query, prove: bool, until_certified: bool, budget: SearchBudget) -> RescoreResult:
        """One query that may score more than its head: ``until_certified`` grows the draft pull,
        ``prove`` completes the frontier's open exits; every round scores only new sequences."""
        scored = self.new_scored_set()
        pull = self._draft.pull(min(q.extent, budget.max_sequences))
        scored.add(pull.seqs, pull.draft_lps, np.arange(len(pull.seqs)))
        rounds = 1
        if until_certified:
            pull, rounds = self._grow_until_certified(q, pull, scored, budget)
        # Everything the draft ranks after the head is bounded by the head's bound, so it bounds
        # every sequence left unscored however far the search went.
        head_bound = self._draft.bound(len(pull.seqs), pull) if q.gap is not None else None
        proofs = None
        if prove:
            left = budget._replace(max_rounds=budget.max_rounds - rounds + 1)
            proof, more = prove_search(scored, q.start, q.k, self._complete, self._draft_scores, left,
                                       first_width(self.search_width, q.k))
            rounds += more - 1
            proofs = [proof]
        n = len(scored)
        return self._finish([q], scored, {n: head_bound}, rows=[n], proofs=proofs, rounds=rounds)[0]

    def _grow_until_certified(self, q: _Query, pull: DraftPull, scored: ScoredSet, budget: SearchBudget):
        """Grow the head until the gap certificate holds, the draft cannot help, the assumption
        is refuted, or the budget runs out: each round pulls to a size whose bound is low enough
        for the current worst score (a wider pull only raises the worst score, so one round
        usually suffices)."""
        rounds = 1
        while rounds < budget.max_rounds:
            n = len(scored)
            bound = self._draft.bound(len(pull.seqs), pull)
            out = self._core([q], scored, [n], {n: bound})
            worst = float(np.asarray(out.log_probs[0])[np.asarray(out.mask[0])].min(initial=np.inf))
            refuted = float(out.excess[0]) > q.gap + scored.tolerance
            full = int(np.asarray(out.mask[0]).sum()) >= q.k
            if int(out.certified[0]) != 0 or not math.isfinite(bound.value) or not full or refuted:
                break
            size = self._draft.pull_size(worst - q.gap - scored.tolerance, len(pull.seqs) + 1, budget.max_sequences)
            if size is None:
                break
            pull = self._draft.pull(size)
            new = scored.new(pull.seqs)
            where = {s: i for i, s in enumerate(pull.seqs)}
            scored.add(new, pull.draft_lps[[where[s] for s in new]], [where[s] for s in new])
            rounds += 1
        return pull, rounds

    def _complete(self, prefixes: list, values=None, floor: float = -math.inf) -> list:
        """Speculated completions of exit prefixes (draft greedy; the target when no draft
        model), each stopped where its estimate falls below ``floor`` (see greedy_complete)."""
        structure = target_structure(self.target)
        model = self.draft_model if self.draft_model is not None else self.target
        return greedy_complete(model, prefixes, structure, self.completion_branch, values, floor)

    def _draft_scores(self, seqs: list) -> np.ndarray:
        """The draft's log-probs ``float64[N]`` of sequences the search found: ``-inf`` for one
        outside the draft's support (evidence against a gap, see :mod:`jaxrescore.rescore.core`),
        NaN where no draft model can say."""
        model = self._draft_scorer
        out = np.full(len(seqs), np.nan)
        structure = target_structure(model) if model is not None else None
        if structure is None:
            return out
        _, ok = forward_rows(seqs, structure)
        out[~ok] = -np.inf
        inside = np.flatnonzero(ok)
        if inside.size:
            try:
                out[inside] = np.minimum(np.asarray(model.score_sequences([seqs[i] for i in inside]), np.float64), 0.0)
            except (ValueError, TypeError):  # a foreign model that cannot score them: unknown
                pass
        return out


def draft_scorer(draft_index: Any, draft_model: Any, completion: Any):
    """The model whose scores the draft index orders by, for scoring sequences it did not pull:
    the index's own ``.model``, else the ``draft_model`` given, else the completion model's draft
    (a draft continued by the target scores nothing of the target's). None when none can score."""
    from jaxrescore.models.checked import ContinuedModel

    for model in (getattr(draft_index, "model", None), draft_model, completion):
        if isinstance(model, ContinuedModel):
            model = model.draft
        if callable(getattr(model, "score_sequences", None)) and target_structure(model) is not None:
            return model
    return None


def _reason(q: _Query, items: list, code: int, bound: DraftBound | None, n: int, excess: float, tolerance: float) -> str:
    """Why the certificate came out as it did, from the same facts the core decided on."""
    if code == CERT_NONE:
        return "no assumed_gap supplied: certification not attempted"
    assert bound is not None
    if math.isnan(bound.value):
        return f"no sound bound on unpulled sequences: {bound.why}"
    if excess > q.gap + tolerance:
        return (
            f"assumed_gap {q.gap:.6g} is refuted by the library's own observations: a "
            f"sequence the target scored (in this call or earlier on this index) has target - draft = "
            f"{excess:.6g} > assumed_gap + tolerance {tolerance:g}"
        )
    if bound.value == -math.inf:
        return (
            f"draft support exhausted: every sequence the draft index holds is among the {n} rescored "
            f"({bound.why}), and no rescored sequence refutes the gap"
        )
    if len(items) < q.k:
        return f"only {len(items)} of k={q.k} items: the draft ran out, but it is not exhausted"
    worst = items[-1][1]
    need = bound.value + q.gap + tolerance
    verb = "clears" if code == CERT_TRUE else "does not clear"
    return (
        f"worst returned target log-prob {worst:.6g} {verb} bound {bound.value:.6g} + assumed_gap "
        f"{q.gap:.6g} + the target's score tolerance {tolerance:g} = {need:.6g} (bound from {bound.why})"
    )
