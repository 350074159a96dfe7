"""ScoredSet: the sequences a query has had the target score, with what the proof needs of them.

One query (or one search) keeps every sequence the target scored in one ScoredSet, so a later
round scores only NEW sequences: one batched target call per :meth:`ScoredSet.add`. With a
target that has ``score_frontier`` the same call returns each position's top-m next-token
log-probs (see :mod:`jaxrescore.models.scores`); the set turns them into the padded
:class:`~jaxrescore.rescore.frontier.ScoredArrays` the frontier bound is computed from.

Rows sent to the target are the sequences as the target reads them (their views, see
:func:`~jaxrescore.rescore.frontier.view_lengths`: cut at the target's ``max_len``, before a token
outside its vocabulary and after the first ``eos``): those are exactly the positions whose prefixes
a support sequence can share, and every model can evaluate them. A sequence outside the target's
support scores ``-inf``; the trie of the proof is built from the views.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from jaxrescore.models.base import Structure
from jaxrescore.models.decoding import proof_session
from jaxrescore.models.mesh import to_host
from jaxrescore.models.scores import DEFAULT_TOP_M, FrontierScores, score_tolerance
from jaxrescore.rescore.appended import AppendedRows
from jaxrescore.rescore.assumptions import check_rows, position_top_max
from jaxrescore.rescore.frontier import ScoredArrays, _gap, complete
from jaxrescore.rescore.growing import GrowingFrontier
from jaxrescore.rescore.proof import kth_best, open_floor
from jaxrescore.rescore.reuse import KnownPrefixes, Reused, assemble, nothing_known, pad_fresh, plan, shift_left
from jaxrescore.rescore.target import forward_rows, target_structure
from jaxrescore.sequences import from_tuples

# the fields of ScoredArrays with one entry per scored row (the fetched rows' fields are not)
_ROW_FIELDS = ("tokens", "lengths", "whole", "steps", "top_lps", "top_ids", "eos_lps", "top_max")


def checked_scores(raw: Any, seqs: list, tolerance: float = 0.0) -> np.ndarray:
    """Validate a target's answer for ``seqs``: ``float64[len(seqs)]``, real numbers, no NaN, no
    +inf, none above ``tolerance`` (a log-prob is <= 0; float noise within the target's
    tolerance is clipped to 0)."""
    arr = to_host(raw)
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


def frontier_scores(model: Any, rows: list, top_m: int, prompts: list | None = None) -> FrontierScores:
    """``model.score_frontier`` of the views ``rows``, each after its prompt (whose steps are
    skipped) when ``prompts`` are given. Every row is non-empty: callers forward only views with
    a position the scored set does not hold."""
    if prompts is None:
        return model.score_frontier(rows, top_m=top_m)
    seqs = from_tuples([tuple(p) + r for p, r in zip(prompts, rows)])
    return model.score_frontier(seqs, top_m=top_m, skip=np.array([len(p) for p in prompts], np.int32))


def checked_frontier(fs: FrontierScores, seqs: list, ok: np.ndarray, tolerance: float) -> np.ndarray:
    """The scores ``float64[N]`` of ``seqs`` from their views' forward ``fs`` (``-inf`` where
    ``ok`` is False: outside the support), checked like :func:`checked_scores` and against the
    proof's assumption that a score is the sum of its steps (within ``tolerance``)."""
    scores = checked_scores(fs.scores, seqs, tolerance)
    sums = to_host(fs.steps, np.float64).sum(axis=1)
    with np.errstate(invalid="ignore"):
        off = ok & np.isfinite(scores) & ~(np.abs(scores - sums) <= tolerance)
    if off.any():
        i = int(np.argmax(off))
        raise ValueError(
            f"target.score_frontier scored sequence {seqs[i]} {scores[i]!r} but its steps sum to "
            f"{sums[i]!r}: a score must be the sum of its step log-probs (within the target's "
            f"score_tolerance {tolerance:g})"
        )
    return np.where(ok, scores, -np.inf)


class ScoredSet:
    """Every sequence one query had the target score (see the module docstring).

    Args:
      target: the target model, or a bare callable ``[seqs] -> log_probs``.
      score: the target's batch scorer (``score_sequences`` or the callable).
      top_m: top next-token log-probs kept per position when the target has ``score_frontier``.
      draft_scores: ``draft_scores(seqs) -> float64[N]`` (NaN: unknown), the draft's scores of
        whole target sequences met only as views of longer sequences (see :attr:`evidence`).

    Attributes:
      seqs: the scored sequences (tuples), in the order added.
      proves: whether the target gave distributions (``score_frontier``): only then is a frontier
        bound available.
      calls, sequences: target calls made and sequences (or prefix rows) evaluated by this set.
      positions: token positions those calls computed: with a target that decodes
        incrementally, a first call that packs its rows (``packed_force``: the context and each
        distinct prefix once, full-forward numbers), then what was fed over held caches: one per
        new trie node, plus a new prefix
        shared by rows of one call once per row, plus a held position again where the step out
        of it is not among its named tokens (the prompt's cache, computed once per model, is not
        counted); otherwise a full forward per row that needs any new position (the prompt
        counted in each), a fetched row after ``n`` tokens ``n + 1``; a checked row (see
        :meth:`add`) its full forward's.
      drift: the largest disagreement (nats) measured between a checked row's cached numbers
        and its full forward (node scores along it, the largest named next-token log-prob and
        the eos log-prob at each position); ``drift_at`` the sequence where (None: none yet).
    """

    def __init__(self, target: Any, score, top_m: int = DEFAULT_TOP_M, draft_scores=None):
        self.target = target
        self._draft_scores = draft_scores
        self._evidence: list[tuple[np.ndarray, np.ndarray]] = []
        self._score = score
        self.top_m = top_m
        self.tolerance = score_tolerance(target)
        self.proves = callable(getattr(target, "score_frontier", None)) and self.structure is not None
        self.seqs: list = []
        self.where: dict = {}
        self.rows: dict = {}  # prefix -> fetched full next-token row
        self._target: list[np.ndarray] = []
        self._draft: list[np.ndarray] = []
        self._ranks: list[np.ndarray] = []
        self._exact: list[np.ndarray] = []  # per add: bool per row, numbers of a full forward
        self._blocks: list[tuple] = []  # per add: (rows, FrontierScores)
        self._adds: list[int] = []  # per add: its first sequence
        self._packed: list = []  # per add, built on demand: (padded tokens, lengths, whole)
        self._appended = None  # ((length, width, m), AppendedRows of the packed adds, adds in it)
        self._cache: ScoredArrays | None = None
        self.calls = 0
        self.sequences = 0
        self.positions = 0
        self.check_positions = 0  # of them, the full forwards that checked cached numbers
        self.checked_rows = 0  # rows whose cached numbers a full forward checked
        self._draft_pending: set = set()  # rows added without draft scores, not computed yet
        self._prompt = len(getattr(target, "prompt", ()) or ())
        self._known = KnownPrefixes()
        self._new_nodes = (np.zeros(0, np.int64), np.zeros(0, np.int64))  # the last add's
        # Teacher forcing on top of held key/value caches (None: full forwards; a 16-bit
        # target's proofs stay on full forwards, see proof_session), see reuse.py.
        self._session = proof_session(target) if self.proves else None
        self.drift = 0.0
        self.drift_at: tuple | None = None
        self.growing = GrowingFrontier()  # the frontier of this set's rows, round by round

    def __len__(self) -> int:
        return len(self.seqs)

    @property
    def structure(self) -> Structure | None:
        """The target's support, read now (see :func:`target_structure`)."""
        return target_structure(self.target)

    @property
    def decodes(self) -> bool:
        """Whether the set's rows are teacher-forced over held key/value caches (their cached
        numbers are checked by a full forward before an answer rests on them, see
        :meth:`unchecked`), not full forwards."""
        return self._session is not None

    def decode_over(self, session) -> None:
        """Decode over ``session`` from now on (a :class:`~jaxrescore.models.prompt_session.PromptView`
        of a joint call's session, see :mod:`jaxrescore.rescore.many`): its held caches serve this
        set's own calls. Only for a set that :attr:`decodes`, before its first add."""
        if self._session is None or self.seqs:
            raise ValueError("decode_over needs a set that decodes and holds no rows yet")
        self._session = session

    @property
    def add_starts(self) -> list[int]:
        """Per :meth:`add` that scored sequences, how many were scored before it."""
        return list(self._adds)

    @property
    def target_lps(self) -> np.ndarray:
        return np.concatenate(self._target) if self._target else np.zeros(0)

    @property
    def draft_lps(self) -> np.ndarray:
        return np.concatenate(self._draft) if self._draft else np.zeros(0)

    @property
    def evidence(self) -> tuple[np.ndarray, np.ndarray]:
        """``(target float64[E], draft float64[E])``: scores of whole target sequences the forward
        computed as the view of a longer scored sequence (a draft sequence past the target's
        ``max_len`` or ``eos``). They are no answers (never scored as themselves) but they are
        observations of the gap like any scored pair."""
        if not self._evidence:
            return np.zeros(0), np.zeros(0)
        return tuple(np.concatenate(c) for c in zip(*self._evidence))

    def _view_evidence(self, seqs: list, block) -> tuple[np.ndarray, np.ndarray] | None:
        """The evidence pairs of one scored block (see :attr:`evidence`), or None."""
        if block is None or self._draft_scores is None:
            return None
        rows, fs = block
        cut = [i for i, (r, q) in enumerate(zip(rows, seqs)) if len(r) != len(q) and len(r)]
        if not cut:
            return None
        views = [rows[i] for i in cut]
        batch = from_tuples(views)
        whole = complete(np.where(batch.mask, batch.tokens, -1), batch.lengths, self.structure)
        idx = [i for i, w in zip(cut, whole) if w]
        if not idx:
            return None
        target = np.minimum(np.asarray(fs.scores, np.float64)[idx], 0.0)
        return target, np.asarray(self._draft_scores([rows[i] for i in idx]), np.float64).reshape(len(idx))

    @property
    def exact(self) -> np.ndarray:
        """bool[N]: whether each scored sequence's numbers are a full forward's: teacher-forced
        whole by the target's ``score_frontier`` in one call, or checked by one (see :meth:`add`);
        every row of a target without an incremental forward (no cached path)."""
        return np.concatenate(self._exact) if self._exact else np.zeros(0, bool)

    def unchecked(self, rank: int, n: int | None = None) -> np.ndarray:
        """int64[U]: the rows among the first ``n`` (all by default) that a full forward must
        check before a verdict or a returned score may rest on them: not :attr:`exact`, with a
        finite score that the score at 0-based ``rank`` (the worst answer) does not clear by the
        tolerance (the answer itself and the rows just below it, which the full forward could
        lift into it), and the best other cached rows until ``rank + 1`` rows have been checked
        in all (the drift's sample, assumption 5 of :mod:`jaxrescore.rescore.frontier`). Empty
        for a target without an incremental forward."""
        if self._session is None or not self.seqs:
            return np.zeros(0, np.int64)
        scores = self.target_lps[:n]
        cached = ~self.exact[: scores.size] & np.isfinite(scores)
        floor = open_floor(kth_best(scores, rank), self.tolerance)
        near = cached & (scores >= floor)
        short = rank + 1 - self.checked_rows - int(near.sum())
        if short > 0 and (cached & ~near).any():
            # Rows of a packed first call hold full-forward numbers (see packed_force), so an
            # answer may hold few cached ones, while the bound may rest on cached exits: the
            # drift's sample is topped up to as many rows as the answer holds, the best cached.
            below = np.flatnonzero(cached & ~near)
            near[below[np.argsort(-scores[below], kind="stable")[:short]]] = True
        return np.flatnonzero(near)

    def answer_drafts(self, rank: int) -> None:
        """Compute the draft scores of the rows added without them (see :meth:`add`) that a
        returned slice whose worst is at 0-based ``rank`` may hold: every row the score at
        ``rank`` does not clear by the tolerance (one draft call; none when none is pending)."""
        if not self._draft_pending or self._draft_scores is None:
            return
        scores = self.target_lps
        floor = open_floor(kth_best(scores, rank), self.tolerance)
        rows = sorted(i for i in self._draft_pending if scores[i] >= floor)
        if not rows:
            return
        values = np.asarray(self._draft_scores([self.seqs[i] for i in rows]), np.float64).reshape(len(rows))
        starts = np.asarray(self._adds)
        for i, value in zip(rows, values.tolist()):
            a = int(np.searchsorted(starts, i, side="right")) - 1
            self._draft[a][i - starts[a]] = value
        self._draft_pending.difference_update(rows)

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

    def score(self, seqs: list, full: bool = False):
        """Score ``seqs`` in ONE target call: ``(float64[N] scores, (rows, FrontierScores) or
        None, positions, bool[N] exact)``, ``positions`` the token positions the target computed
        (only what the set does not hold already, see :mod:`jaxrescore.rescore.reuse`, unless
        ``full``: then every row is teacher-forced whole by the target's ``score_frontier``, as
        :attr:`exact` rows), ``exact`` as :attr:`exact`. Does not add them (see :meth:`add`)."""
        if not self.proves:
            scores = checked_scores(self._score(seqs), seqs, self.tolerance)
            return scores, None, self.unpacked_positions(seqs), np.ones(len(seqs), bool)
        rows, ok = forward_rows(seqs, self.structure)
        fs, positions, exact = self._forward(seqs, rows, ok, full)
        return checked_frontier(fs, seqs, ok, self.tolerance), (rows, fs), positions, exact

    def exact_rows(self, known: np.ndarray) -> np.ndarray:
        """bool[N]: which rows a call of full forwards makes :attr:`exact`, given what it knew of
        each (``known``: positions copied from held rows; those may be cached numbers)."""
        return np.ones(known.size, bool) if self._session is None else np.asarray(known) == 0

    def full_positions(self, rows: list) -> int:
        """Token positions full forwards of ``rows`` compute: the prompt counted in each, or
        once per call where the target packs rows after it (its ``full_positions``)."""
        own = getattr(self.target, "full_positions", None)
        if callable(own):
            return int(own(rows))
        return self.unpacked_positions(rows)

    def unpacked_positions(self, rows: list) -> int:
        """Token positions forwards of ``rows`` compute with the prompt in every row (a joint
        call of several prompts, see :mod:`jaxrescore.rescore.many`)."""
        return sum(self._prompt + len(r) for r in rows)

    def plan(self, rows: list) -> Reused:
        """How much of each view in ``rows`` the set already holds (see
        :func:`~jaxrescore.rescore.reuse.plan`)."""
        if not self.seqs:
            return nothing_known(len(rows))
        return plan(rows, self._known, self._arrays(), self.rows, self.structure.eos)

    def completed(self, rows: list, reused: Reused, fresh: FrontierScores | None) -> FrontierScores:
        """The views ``rows``' whole per-position arrays: what :meth:`plan` found held, the rest
        from ``fresh`` (left-aligned at each row's first unknown position)."""
        return assemble(rows, reused, self._arrays() if self.seqs else None, fresh)

    def _forward(self, seqs: list, rows: list, ok: np.ndarray, full: bool = False) -> tuple[FrontierScores, int, np.ndarray]:
        """The views ``rows`` (of ``seqs``; ``ok``: in the support) as per-position arrays,
        computing only what the set does not hold (all of every row when ``full``): on top of
        held key/value caches when the target decodes incrementally, else by full forwards of
        the rows that need any position, each checked as it comes (see
        :mod:`jaxrescore.rescore.reuse`); with the rows that are :attr:`exact`."""
        reused = nothing_known(len(rows)) if full else self.plan(rows)
        need = np.flatnonzero(reused.known < np.array([len(r) for r in rows], np.int64))
        fresh, positions = None, 0
        cached = self._session is not None and not full
        packed = None
        if need.size:
            part = [rows[i] for i in need]
            if cached and not self.seqs:  # a first call: full numbers, the caches from the same forward
                packed = getattr(self._session, "packed_force", lambda *_: None)(part, self.top_m)
            if packed is not None:
                fs, positions = packed
            elif cached:
                fs, positions = self._session.teacher_force(part, reused.known[need], self.top_m)
            else:
                fs = frontier_scores(self.target, part, self.top_m)
                checked_frontier(fs, [seqs[i] for i in need], ok[need], self.tolerance)
                fs, positions = shift_left(fs, reused.known[need]), self.full_positions(part)
            fresh = pad_fresh(fs, need, len(rows))
        lengths = np.array([len(r) for r in rows], np.int64)
        exact = np.ones(len(rows), bool) if packed is not None else lengths == 0 if cached else self.exact_rows(reused.known)
        return self.completed(rows, reused, fresh), positions, exact

    def add(self, seqs: list, draft_lps, ranks, *, scored=None, fetch: list = (), check=(),
            full: bool = False) -> bool:
        """Add sequences not scored yet (the caller passes only new ones), scoring them in one
        target call unless ``scored`` (from :meth:`score`, e.g. a call shared by several sets)
        is given, and in the same call (independent of the scoring, so not a call of its own)
        fetch the full next-token rows of the prefixes ``fetch`` (see :meth:`fetch_rows`) and
        check the scored rows ``check`` (indices; see :meth:`unchecked`) by a full forward
        (:meth:`check_forward`); ``full`` scores every new row by a full forward (see
        :meth:`score`). ``draft_lps`` None: the draft scores are computed only if read (see
        :meth:`answer_drafts`). A failed call leaves the set unchanged. Returns whether rows
        were fetched."""
        fetched = self._fetch(fetch)
        checked = self.check_forward(check)
        if scored is None:  # this set's own call: one, unless everything was known already
            ran = False
            if seqs:
                scored = self.score(seqs, full)
                ran = scored[1] is None or scored[2] > 0
            self.calls += int(ran or fetched is not None or checked is not None)
        if seqs:
            self._add_scored(seqs, draft_lps, ranks, scored)
        self._store_rows(fetched)
        self.store_check(checked)
        return fetched is not None

    def check(self, rank: int) -> bool:
        """Check the :meth:`unchecked` rows at ``rank`` by a full forward, in a call of their own
        (a search whose last call had nothing else to score); whether a call was made."""
        rows = self.unchecked(rank)
        if rows.size:
            self.add([], [], [], check=rows)
        return bool(rows.size)

    def check_forward(self, rows, model: Any = None, prompt: tuple = ()) -> tuple | None:
        """``(rows int64[C], FrontierScores, positions)``: the full forward (``score_frontier``)
        of the scored rows ``rows`` (indices) that are not :attr:`exact`, or None when there are
        none. Stores nothing (see :meth:`store_check`). ``model`` and ``prompt``: what forwards
        them when not the target itself (a joint call of several prompts' sets scores ``prompt +
        row`` on their shared base, see :mod:`jaxrescore.rescore.many`)."""
        rows = np.asarray(rows, np.int64).reshape(-1)
        if not rows.size:
            return None
        rows = rows[~self.exact[rows]]
        if not rows.size:
            return None
        seqs = [self.seqs[i] for i in rows.tolist()]
        if model is None:
            fs = frontier_scores(self.target, seqs, self.top_m)
        else:
            fs = frontier_scores(model, seqs, self.top_m, [prompt] * len(seqs))
        return rows, fs, self.full_positions(seqs)

    def store_check(self, checked: tuple | None) -> None:
        """Store a :meth:`check_forward`: the rows' scores become the full forward's, the rows
        :attr:`exact`, and :attr:`drift` the largest disagreement seen with their cached numbers."""
        if checked is None:
            return
        rows, fs, positions = checked
        seqs = [self.seqs[i] for i in rows.tolist()]
        scores = checked_frontier(fs, seqs, np.ones(len(seqs), bool), self.tolerance)
        off = cache_drift(self.arrays(), rows, fs)
        self.sequences += len(seqs)
        self.checked_rows += len(seqs)
        self.positions += positions
        self.check_positions += positions
        worst = int(np.argmax(off))
        if not off[worst] <= self.drift:  # NaN too
            self.drift, self.drift_at = float(off[worst]), seqs[worst]
        starts = np.asarray(self._adds)
        for i, score in zip(rows.tolist(), scores.tolist()):
            a = int(np.searchsorted(starts, i, side="right")) - 1
            self._target[a][i - starts[a]] = score
            self._exact[a][i - starts[a]] = True

    def _add_scored(self, seqs: list, draft_lps, ranks, scored) -> None:
        scores, block, positions = scored[:3]
        exact = scored[3] if len(scored) > 3 else np.full(len(seqs), self._session is None)
        evidence = self._view_evidence(seqs, block)  # before any change: it may raise
        self.sequences += len(seqs)
        self.positions += positions
        if evidence is not None:
            self._evidence.append(evidence)
        self._adds.append(len(self.seqs))
        for i, s in enumerate(seqs, start=len(self.seqs)):
            self.where[s] = i
        self.seqs.extend(seqs)
        self._target.append(np.array(scores, np.float64).reshape(len(seqs)))
        self._exact.append(np.array(exact, bool).reshape(len(seqs)))
        if draft_lps is None:  # computed when something reads them (answer_drafts)
            self._draft_pending.update(range(len(self.seqs) - len(seqs), len(self.seqs)))
            draft_lps = np.full(len(seqs), np.nan)
        self._draft.append(np.asarray(draft_lps, np.float64).reshape(len(seqs)))
        self._ranks.append(np.asarray(ranks, np.int64).reshape(len(seqs)))
        if block is not None:
            self._new_nodes = self._known.add(self._adds[-1], block[0])
            self._blocks.append(block)
        self._cache = None

    def new_node_values(self) -> np.ndarray:
        """float64[P]: the target log-probs of the prefixes the last add computed first (one per
        new trie node with a distribution): what its forward spent its positions on."""
        rows, positions = self._new_nodes
        if not rows.size:
            return np.zeros(0)
        steps = self.arrays().steps[rows]
        return np.where(np.arange(steps.shape[1])[None, :] < positions[:, None], steps, 0.0).sum(axis=1)

    def fetch_rows(self, prefixes: list) -> int:
        """Fetch the target's full next-token rows of ``prefixes`` in one call (for exits whose
        token the top-m does not name); returns how many were new."""
        fetched = self._fetch(prefixes)
        if fetched is not None:
            self.calls += 1
        self._store_rows(fetched)
        return 0 if fetched is None else len(fetched[0])

    def _fetch(self, prefixes) -> tuple | None:
        """``(prefixes, rows float32[R, V], positions)`` of the prefixes not fetched yet, from
        one ``next_logprobs`` call (over the held caches when the set has a session), or None
        when there are none. Stores nothing (see :meth:`_store_rows`)."""
        prefixes = [p for p in dict.fromkeys(prefixes) if p not in self.rows]
        if not prefixes:
            return None
        width = max(1, max(len(p) for p in prefixes))
        toks = np.zeros((len(prefixes), width), np.int32)
        for i, p in enumerate(prefixes):
            toks[i, : len(p)] = p
        lens = np.array([len(p) for p in prefixes], np.int32)
        model = self.target if self._session is None else self._session
        before = 0 if self._session is None else self._session.positions
        rows = np.asarray(model.next_logprobs(toks, lens), np.float32)
        if rows.shape[0] != len(prefixes) or np.isnan(rows).any():
            raise ValueError(f"target.next_logprobs returned {rows.shape} rows (or NaN) for {len(prefixes)} prefixes")
        if self._session is None:
            positions = sum(self._prompt + len(p) + 1 for p in prefixes)
        else:
            positions = self._session.positions - before
        return prefixes, np.minimum(rows, 0.0), positions

    def _store_rows(self, fetched: tuple | None) -> None:
        if fetched is None:
            return
        prefixes, rows, positions = fetched
        self.sequences += len(prefixes)
        self.positions += positions
        self.rows.update(zip(prefixes, rows))
        self._cache = None

    def arrays(self, n: int | None = None) -> ScoredArrays:
        """The first ``n`` scored sequences (all by default) as padded arrays."""
        full = self._arrays()
        if n is None or n >= len(self.seqs):
            return full
        return full._replace(**{f: getattr(full, f)[:n] for f in _ROW_FIELDS})

    def _arrays(self) -> ScoredArrays:
        if self._cache is not None:
            return self._cache
        ends = self._adds[1:] + [len(self.seqs)]
        for i in range(len(self._packed), len(self._adds)):  # each add packed once, on demand
            views = self._blocks[i][0]  # the rows the target read: the trie is built from them
            batch = from_tuples(views)
            whole = np.array([len(v) == len(q) for v, q in zip(views, self.seqs[self._adds[i] : ends[i]])], bool)
            self._packed.append((np.where(batch.mask, batch.tokens, -1).astype(np.int64), batch.lengths, whole))
        length = max([p[0].shape[1] for p in self._packed] + [1])
        width = max([b[1].steps.shape[1] for b in self._blocks] + [1])
        # a block of only empty views (or whole rows of a small vocabulary) may be narrower
        m = max([b[1].top_lps.shape[2] for b in self._blocks] + [1])
        if self._appended is None or self._appended[0] != (length, width, m):  # a wider block: all again
            spec = ((length,), (), (), (width,), (width, m), (width, m), (width,), (width,))
            dtypes = (np.int64, np.int64, bool, np.float64, np.float32, np.int32, np.float32, np.float32)
            # past a block's own width: padding tokens, no distribution (the fill of each column)
            fills = (-1, 0, False, 0.0, -np.inf, 0, -np.inf, -np.inf)
            self._appended = ((length, width, m), AppendedRows(spec, dtypes, fills), 0)
        key, rows, done = self._appended
        blocks = []
        for (toks, lens, whole), (_, fs) in zip(self._packed[done:], self._blocks[done:]):
            cols = (toks, lens, whole, *_named(fs, m))
            block = ScoredArrays(*cols, None, None, None, position_top_max(cols[4]))
            # each row is checked once, as it is appended (rows never change): the frontier of
            # every later round reads only checked rows (frontier(..., rows_checked=True))
            check_rows(block, self.structure)
            blocks.append(block)
        for block in blocks:  # all checked first: a refused block leaves the buffers as they were
            rows.append(tuple(getattr(block, f) for f in _ROW_FIELDS))
        self._appended = (key, rows, len(self._packed))
        view = rows.view()  # _ROW_FIELDS' order: the fetched rows' three fields go before top_max
        self._cache = ScoredArrays(*view[:7], *self._row_arrays(length), view[7])
        return self._cache

    def _row_arrays(self, length: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The fetched rows as ``(prefixes int64[R, length] padded with -1, lengths int64[R],
        values float32[R, V])``; a prefix longer than every view is in no trie and left out."""
        fetched = [(p, r) for p, r in self.rows.items() if len(p) <= length]
        width = max([r.size for _, r in fetched] + [1])
        prefixes = np.full((len(fetched), length), -1, np.int64)
        values = np.full((len(fetched), width), -np.inf, np.float32)
        for i, (p, r) in enumerate(fetched):
            prefixes[i, : len(p)] = p
            values[i, : r.size] = r
        return prefixes, np.array([len(p) for p, _ in fetched], np.int64), values


def cache_drift(s: ScoredArrays, rows: np.ndarray, fs: FrontierScores) -> np.ndarray:
    """float64[C]: how far the numbers ``s`` holds for the scored rows ``rows`` (perhaps cached)
    are from their full forward ``fs`` (whole rows, left-aligned): the largest difference over
    every position of a row between the node scores (sums of the steps so far, the row's own
    score at its end), the largest named next-token log-probs and the eos log-probs: the
    numbers the frontier reads at those nodes (as assumption 4 of
    :mod:`jaxrescore.rescore.frontier` compares two forwards of one prefix)."""
    width = min(fs.steps.shape[1], s.steps.shape[1])  # both cover every checked row
    lengths = np.asarray(s.lengths)[rows]
    real = np.arange(width)[None, :] < lengths[:, None]

    def held(a):
        return np.asarray(a)[rows, :width]

    parts = []
    full = FrontierScores(*(np.asarray(a)[:, :width] if np.ndim(a) > 1 else a for a in fs))
    for mine, theirs in ((np.cumsum(np.where(real, held(s.steps), 0.0), axis=1),
                          np.cumsum(np.where(real, np.asarray(full.steps, np.float64), 0.0), axis=1)),
                         (held(s.top_lps).max(axis=2), full.top_lps.max(axis=2)),
                         (held(s.eos_lps), full.eos_lps)):
        with np.errstate(invalid="ignore"):
            off = _gap(np, np.asarray(mine, np.float64), np.asarray(theirs, np.float64))
        parts.append(np.where(real, off, 0.0).max(axis=1, initial=0.0))
    return np.max(parts, axis=0)


def _named(fs: FrontierScores, m: int):
    """One block's per-position arrays with ``m`` named tokens (its positions as they are: the
    buffers pad a narrower block): a block naming fewer (an inferred vocabulary that grew, a
    block of empty views) repeats its last named token, so its smallest named value, which
    bounds every token it does not name, stays what its forward said."""
    if fs.top_lps.shape[2] == m:  # most blocks: nothing to copy
        return fs.steps, fs.top_lps, fs.top_ids, fs.eos_lps
    pad_m = ((0, 0), (0, 0), (0, m - fs.top_lps.shape[2]))
    return fs.steps, np.pad(fs.top_lps, pad_m, mode="edge"), np.pad(fs.top_ids, pad_m, mode="edge"), fs.eos_lps


def nan_to_none(value: float) -> float | None:
    return None if value is None or math.isnan(value) else float(value)
