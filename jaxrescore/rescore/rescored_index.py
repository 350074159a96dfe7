"""RescoredIndex: draft-ordered, target-scored enumeration with window reranking (the spec's shell).

A thin class in the style of flax nnx's ``Optimizer``: it holds the draft index, the target and a
:class:`~jaxrescore.rescore.core.GapCarry`, validates arguments, and stores what the pure pieces
return: :mod:`~jaxrescore.rescore.run` pulls and searches, :mod:`~jaxrescore.rescore.answer` runs
the jitted core and the proof check. With a target that gives next-token distributions (every
model of :mod:`jaxrescore.models`), every result says whether its answer is *proven* the target's
exact top-k, with no assumption; ``prove=True`` searches until it is.
"""

from __future__ import annotations

import functools
import math
import threading
from typing import Any, Sequence

import numpy as np

from jaxrescore._checks import check_bool, check_int
from jaxrescore.models.lockstep import run
from jaxrescore.models.scores import DEFAULT_TOP_M, check_top_m
from jaxrescore.rescore.answer import decide_proofs, item_texts, results, run_core
from jaxrescore.rescore.constrained import constrained_index
from jaxrescore.rescore.core import GapCarry
from jaxrescore.rescore.draft import DraftView, SpeculativeDraft
from jaxrescore.rescore.processes import agree, model_identity, query_arguments
from jaxrescore.rescore.proof import Proof
from jaxrescore.rescore.queries import DEFAULT_MAX_ROUNDS, Query, make_mode, make_queries, require_gap
from jaxrescore.rescore.result import RescoreResult
from jaxrescore.rescore.run import run_queries
from jaxrescore.rescore.scored import ScoredSet
from jaxrescore.rescore.search import SEARCH_WIDTH
from jaxrescore.rescore.speculate import Completer, Speculation, completion_model
from jaxrescore.rescore.target import as_scorer, draft_scorer, draft_scores, target_structure


class RescoredIndex:
    """Draft-ordered, target-scored enumeration with window reranking and proofs.

    Args:
      draft_index: any index with ``unrank(i) -> (sequence, draft_log_prob)``; ``unrank_batch``,
        ``ensure_count`` and ``len()`` are used when present. Sound certification needs
        ``bucket_bound(n)`` (our SeekIndex) or a ``.quantizer`` with the truncation reports of
        :mod:`jaxrescore.rescore.draft`; without them queries work but never certify. Proofs
        need nothing of it: its order decides how fast they come.
      target: the expensive model (its ``score_frontier`` or ``score_sequences`` is used) or a
        bare callable ``[list of token tuples] -> log_probs`` (then ``proven`` is None). Its
        ``max_len``, when no larger than the draft's, skips prefixes a draft cut at ``max_len``.
      rerank_window: extra draft candidates pulled and reranked by target score; an integer >= 0,
        or None: 64, and none for a proving query (its search opens what the proof needs).
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
        exits (the best by bound); None opens every open exit every round (fewest rounds, most
        positions with a poor draft).
      adaptive_width: each later round's width follows how much of the last round's
        speculation landed at or above the worst answer (doubled when half of its new trie
        nodes did, halved, to k at least, when under a fourth did: a good draft is trusted wide,
        a poor one spends few positions below the answer); False doubles it every round.

    The certificate needs ``target(u) <= draft(u) + assumed_gap`` for every sequence ``u`` that
    scores above the worst returned item (``|target - draft| <= assumed_gap`` everywhere is the
    simple sufficient condition); ``proven`` needs nothing but the target's own forward.

    Thread safety: queries on one RescoredIndex run one at a time (a lock around the pull, the
    target call and the carry update): sharing it between threads is safe.
    """

    def __init__(self, draft_index: Any, target: Any, *, rerank_window: int | None = None, assumed_gap: float | None = None,
                 draft_model: Any = None, top_m: int = DEFAULT_TOP_M, completion_branch: int = 1,
                 search_width: int | None = SEARCH_WIDTH, adaptive_width: bool = True):
        self.rerank_window = check_int(rerank_window, "rerank_window", minimum=0, allow_none=True)
        self.assumed_gap = require_gap(assumed_gap)
        self.top_m = check_top_m(top_m)
        self.completion_branch = check_int(completion_branch, "completion_branch", minimum=1)
        self.search_width = check_int(search_width, "search_width", minimum=1, allow_none=True)
        self.adaptive_width = check_bool(adaptive_width, "adaptive_width")
        self.draft = DraftView(draft_index, target_max_len=getattr(target, "max_len", None))
        self._score = as_scorer(target)
        self.draft_index = draft_index
        self.target = target
        self.draft_model = completion_model(draft_index, draft_model, target)
        # A speculation-only draft is not asked to score what the search found: a whole draft
        # forward per round that no verdict reads (no gap can be certified over it); NaN instead.
        self._draft_scorer = None if isinstance(draft_index, SpeculativeDraft) else draft_scorer(
            draft_index, draft_model, self.draft_model)
        self._carry = GapCarry(0.0, -math.inf, 0, 0)
        self._positions = 0
        self.completer = Completer(self.draft_model if self.draft_model is not None else target,
                                   lambda: target_structure(self.target), self.completion_branch)
        self._lock = threading.RLock()

    def __repr__(self) -> str:
        return (
            f"RescoredIndex(draft_index={type(self.draft_index).__name__}, target={type(self.target).__name__}, "
            f"rerank_window={self.rerank_window}, assumed_gap={self.assumed_gap}, "
            f"target_calls={self.target_calls}, target_sequences={self.target_sequences})"
        )

    carry = property(lambda self: self._carry,
                     doc="The running diagnostics: the core's carry after the last call (host scalars).")

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

    def top_k(self, k: int, *, prove: bool = False, until_certified: bool = False,
              max_rounds: int = DEFAULT_MAX_ROUNDS, max_sequences: int | None = None,
              max_seconds: float | None = None, constraint: Any = None) -> RescoreResult:
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
            It also caps the model rows the draft index may grow by for the search's first pull
            (the search goes on from what the index then holds).
          max_seconds: wall-clock seconds allowed to a search (checked before each round), > 0,
            or None (default: no limit). Not with several processes (each would stop at its
            own time).
          constraint: None, or a :mod:`jaxrescore.constraints` constraint: the query then runs
            over both models restricted to it (see :mod:`jaxrescore.rescore.constrained`).

        A search that stops at a budget returns its answer so far with ``proven=False`` and a
        ``proof_reason`` naming the budget.
        """
        return self.slice(0, k, prove=prove, until_certified=until_certified, max_rounds=max_rounds,
                          max_sequences=max_sequences, max_seconds=max_seconds, constraint=constraint)

    def slice(self, start: int, k: int, *, prove: bool = False, until_certified: bool = False,
              max_rounds: int = DEFAULT_MAX_ROUNDS, max_sequences: int | None = None,
              max_seconds: float | None = None, constraint: Any = None) -> RescoreResult:
        """Target-reranked ``[start, start + k)`` slice of the pulled ``start + k + rerank_window``
        head; the verdicts cover whether an unpulled sequence could belong in or before it.
        ``prove``, ``until_certified``, the budgets and ``constraint`` are as in :meth:`top_k`."""
        return self.sweep([start], [k], prove=prove, until_certified=until_certified, max_rounds=max_rounds,
                          max_sequences=max_sequences, max_seconds=max_seconds, constraint=constraint)[0]

    def unrank(self, i: int) -> RescoreResult:
        """The target-reranked rank-``i`` item: ``slice(i, 1)``."""
        return self.slice(i, 1)

    def sweep(self, starts: Sequence[int], ks: Sequence[int], rerank_windows: Sequence[int] | None = None,
              assumed_gaps: Sequence[float | None] | None = None, *, prove: bool = False,
              until_certified: bool = False, max_rounds: int = DEFAULT_MAX_ROUNDS, max_sequences: int | None = None,
              max_seconds: float | None = None, constraint: Any = None) -> list[RescoreResult]:
        """Many queries at once: ONE pull of the largest extent, ONE target call, ONE vmapped core
        call and ONE vmapped proof check. Result ``q`` equals what a fresh index with window
        ``rerank_windows[q]`` (default this index's) and gap ``assumed_gaps[q]`` (default this
        index's) returns for ``slice(starts[q], ks[q])`` when asked after the sweep's widest pull:
        every query's ``gap``, ``excess`` and certificate see every sequence scored in the sweep's
        one call (and earlier on this index), so no query certifies against evidence that call
        holds. ``prove`` and ``until_certified`` search once for the widest query (every query
        then covers every sequence scored), with the budgets and ``constraint`` of :meth:`top_k`."""
        if constraint is not None:
            return constrained_index(self, constraint).sweep(
                starts, ks, rerank_windows, assumed_gaps, prove=prove, until_certified=until_certified,
                max_rounds=max_rounds, max_sequences=max_sequences, max_seconds=max_seconds)
        queries = make_queries(starts, ks, rerank_windows, assumed_gaps, self.rerank_window, self.assumed_gap)
        mode = make_mode(prove, until_certified, max_rounds, max_sequences, queries, max_seconds)
        # several processes (jax.distributed): each must ask this same query, checked first
        agree("RescoredIndex.sweep", lambda: {**query_arguments(queries, mode), "index": self.identity()})
        with self._lock:
            return run_queries(self, queries, mode)

    def identity(self) -> dict:
        """What every process of a multi-process run must agree on about this index (see
        :mod:`jaxrescore.rescore.processes`): its settings and the models' identity (type,
        support, prompt, weight shapes; never the weights)."""
        return {"top_m": self.top_m, "completion_branch": self.completion_branch, "search_width": self.search_width,
                "adaptive_width": self.adaptive_width, "target": model_identity(self.target),
                "draft_index": type(self.draft_index).__name__,
                "draft": model_identity(getattr(self.draft_index, "model", None) or self.draft_model)}

    # -- the building blocks a call (and rescore_many) is made of ----------------------------------

    def new_scored_set(self) -> ScoredSet:
        """An empty :class:`ScoredSet` for this index's target."""
        return ScoredSet(self.target, self._score, self.top_m, self.draft_scores)

    def answer(self, queries: list[Query], scored: ScoredSet, rows: list[int], bounds: dict,
               proofs: list[Proof] | None = None, rounds: int = 1) -> list[RescoreResult]:
        """Decide ``queries`` over ``scored`` (query ``i`` covers its first ``rows[i]`` rows) and
        store the carry the core returns; a failing decision leaves the index unchanged."""
        out, carry = run_core(queries, scored, rows, bounds, self._carry)
        if proofs is None:
            proofs = decide_proofs(queries, out, scored, rows)
        self._carry = carry
        self._positions += scored.positions
        return results(queries, out, scored, rows, bounds, proofs, rounds, functools.partial(item_texts, self.target))

    def complete(self, prefixes: list, values: np.ndarray | None = None, floor: float = -math.inf) -> list:
        """Speculated completions of exit prefixes (draft greedy; the target when no draft
        model), each stopped where its estimate falls below ``floor`` (see greedy_complete)."""
        return self.speculate(prefixes, values, floor).sequences()

    def speculate(self, prefixes: list, values: np.ndarray | None = None, floor: float = -math.inf) -> Speculation:
        """The speculated paths of :meth:`complete`, with the draft's estimates along them (see
        :func:`~jaxrescore.rescore.speculate.speculate`)."""
        return run(self.completer.steps(prefixes, values, floor), self.completer.rows)

    @property
    def draft_positions(self) -> int | None:
        """Token positions the completion model (the draft, or the target without one) computed
        speculating paths so far, when it decodes incrementally; else None."""
        return self.completer.positions

    def draft_scores(self, seqs: list) -> np.ndarray:
        """The draft's log-probs ``float64[N]`` of sequences the search found (see
        :func:`~jaxrescore.rescore.target.draft_scores`)."""
        return draft_scores(self._draft_scorer, seqs)
