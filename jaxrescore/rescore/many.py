"""Rescoring several indexes' queries in ONE target call (e.g. one index per prompt)."""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import numpy as np

from jaxrescore.models.cache_sizes import shared_cache_bytes
from jaxrescore.models.decoding import proof_session
from jaxrescore.models.lockstep import JointRows, run_jointly
from jaxrescore.models.packed import packed_row_positions
from jaxrescore.models.prompt_session import PromptView, force_after
from jaxrescore.models.scores import FrontierScores, drop_leading
from jaxrescore.rescore.processes import agree, query_arguments
from jaxrescore.rescore.progress import report
from jaxrescore.rescore.queries import DEFAULT_MAX_ROUNDS, Query, SearchBudget, make_mode, make_query
from jaxrescore.rescore.rescored_index import RescoredIndex
from jaxrescore.rescore.result import RescoreResult
from jaxrescore.rescore.scored import ScoredSet, checked_frontier, checked_scores, frontier_scores
from jaxrescore.rescore.reuse import pad_fresh, shift_left
from jaxrescore.rescore.run import certificate_probe
from jaxrescore.rescore.search import Round, SearchState, first_width, grow_until_certified, round_steps
from jaxrescore.rescore.seed import first_rows_steps
from jaxrescore.rescore.target import as_scorer, forward_rows
from jaxrescore.sequences import from_tuples


class Joint(NamedTuple):
    """What scores several indexes' rows in one call: the joint ``model`` (see :func:`joint`),
    each index's ``prompts``, and ``session``: a decoding session over the model (held for the
    whole query) when every set teacher-forces over key/value caches, else None (full forwards)."""

    model: Any
    prompts: list
    session: Any = None

    def of(self, live: list) -> "Joint":
        """The joint scorer of the indexes ``live`` (positions in the original list)."""
        return self._replace(prompts=[self.prompts[i] for i in live])


def joint(indexes: Sequence[RescoredIndex], sets: list[ScoredSet]) -> Joint:
    """The :class:`Joint` of ``indexes``: their shared target (prompts all empty) or the shared
    base of their prompted targets (``.base`` and ``.prompt``), which scores ``prompt +
    continuation`` with the prompt's steps skipped; with a session over it when every set
    decodes over held caches (``sets``: the indexes' scored sets)."""
    targets = [ri.target for ri in indexes]
    if all(t is targets[0] for t in targets):
        model, prompts = targets[0], [()] * len(targets)
    else:
        bases = [getattr(t, "base", None) for t in targets]
        # a constrained target's numbers are not its base's: it never shares the base's call
        masked = any(getattr(t, "constraint", None) is not None for t in targets)
        if masked or bases[0] is None or any(b is not bases[0] or not hasattr(t, "prompt") for b, t in zip(bases, targets)):
            raise ValueError(
                "rescore_many needs indexes whose targets are one and the same model, or prompted "
                "models (with_prompt) of one and the same base model (not constrained ones: query "
                "those one by one)"
            )
        model, prompts = bases[0], [tuple(t.prompt) for t in targets]
    session = proof_session(model, max_bytes=shared_cache_bytes(len(prompts))) if all(s.proves and s.decodes for s in sets) else None
    if session is not None:  # each set's own calls (fetched rows, grown pulls) extend the same caches
        for s, prompt in zip(sets, prompts):
            s.decode_over(PromptView(session, prompt))
    return Joint(model, prompts, session)


def _score_jointly(jt: Joint, sets: list[ScoredSet], parts: list[list], checks: list | None = None) -> list:
    """Every part's ``(scores, block, positions, exact)`` from ONE call of the joint model (see
    ``ScoredSet.score``), or with ``checks`` (per set, scored rows to check by a full forward in
    the same call) ``(that, checked)`` pairs, ``checked`` as ``ScoredSet.check_forward`` gives it."""
    if checks is not None:
        return list(zip(_score_jointly(jt, sets, parts), _check_jointly(jt, sets, checks)))
    model, prompts = jt.model, jt.prompts
    flat = [s for part in parts for s in part]
    sizes = [len(p) for p in parts]
    splits = np.cumsum(sizes)[:-1]
    proves = all(s.proves for s in sets) and callable(getattr(model, "score_frontier", None))
    if not proves:
        for s in sets:
            s.proves = False
        if all(p == () for p in prompts):
            raw = as_scorer(model)(flat)
        else:
            seqs = [pr + s for pr, part in zip(prompts, parts) for s in part]
            skip = np.repeat([len(pr) for pr in prompts], sizes).astype(np.int32)
            raw = model.score_sequences(from_tuples(seqs), skip=skip)
        tolerance = min(s.tolerance for s in sets)
        return [(sc, None, s.unpacked_positions(part), np.ones(len(part), bool))
                for sc, s, part in zip(np.split(checked_scores(raw, flat, tolerance), splits), sets, parts)]
    # Each set forwards only the views with a position it does not hold (rows wholly held, e.g.
    # p + eos after a scored p, need no forward).
    cut = [forward_rows(part, s.structure) for s, part in zip(sets, parts)]
    plans = [s.plan(rs) for s, (rs, _) in zip(sets, cut)]
    needs = [np.flatnonzero(p.known < np.array([len(r) for r in rs], np.int64)) for p, (rs, _) in zip(plans, cut)]
    rows = [rs[i] for (rs, _), need in zip(cut, needs) for i in need]
    known = np.array([k for p, need in zip(plans, needs) for k in p.known[need].tolist()], np.int64)
    owner = np.repeat(np.arange(len(sets)), [need.size for need in needs])
    fs, per_row, exact = _forward_jointly(jt, sets, rows, known, owner) if rows else (None, None, None)
    out, lo = [], 0
    for (rs, ok), s, part, p, need in zip(cut, sets, parts, plans, needs):
        fresh, hi = None, lo + need.size
        if need.size:
            block = FrontierScores(*(a[lo:hi] for a in fs))
            if exact is None:  # full forwards: whole rows, checked as they come
                checked_frontier(block, [part[i] for i in need], ok[need], s.tolerance)
                block = shift_left(block, p.known[need])
            fresh = pad_fresh(block, need, len(rs))
        full = s.completed(rs, p, fresh)
        if exact is None:
            row_exact, positions = s.exact_rows(p.known), s.unpacked_positions([rs[i] for i in need])
        else:
            row_exact = np.array([len(r) == 0 for r in rs], bool)
            row_exact[need] = exact[lo:hi]
            positions = int(per_row[lo:hi].sum())
        out.append((checked_frontier(full, part, ok, s.tolerance), (rs, full), positions, row_exact))
        lo = hi
    return out


def _forward_jointly(jt: Joint, sets: list[ScoredSet], rows: list, known: np.ndarray, owner: np.ndarray):
    """The views ``rows`` (of the sets ``owner``, each known up to ``known``) in one call:
    ``(FrontierScores, positions int64[N] or None, exact bool[N] or None)``. Without a session,
    full forwards of whole rows after their prompts (the prompt counted in each). With one,
    ``prompt + row`` over the joint session's held caches, as each set's own session would feed
    them (left-aligned from ``known``, each row charged what it fed): the first call of the
    query the full forward packed as one tree (exact numbers, see
    :meth:`~jaxrescore.models.decoding.DecodingSession.packed_force`), later ones cached
    numbers that the answer check reads again."""
    prompts = [jt.prompts[i] for i in owner.tolist()]
    if jt.session is None:
        return frontier_scores(jt.model, rows, sets[0].top_m, prompts), None, None
    first = not any(s.seqs for s in sets)
    out = force_after(jt.session, prompts, rows, known, sets[0].top_m, packed=True) if first else None
    exact = np.full(len(rows), out is not None)
    if out is None:
        out = force_after(jt.session, prompts, rows, known, sets[0].top_m)
    return out.frontier, jt.session.row_positions, exact


def _check_jointly(jt: Joint, sets: list[ScoredSet], checks: list) -> list:
    """Per set, ``ScoredSet.check_forward`` of its rows ``checks[i]`` (or None), every set's
    from ONE full forward of the joint model."""
    model, prompts = jt.model, jt.prompts
    rows = []
    for s, c in zip(sets, checks):
        c = np.asarray(c, np.int64).reshape(-1)
        rows.append(c[~s.exact[c]])
    seqs = [s.seqs[j] for s, c in zip(sets, rows) for j in c.tolist()]
    if not seqs:
        return [None] * len(sets)
    mine = [p for p, c in zip(prompts, rows) for _ in range(c.size)]
    if getattr(model, "packs_prompt", False):  # one tree, each prompt once (as a set's own check)
        whole = [tuple(p) + s for p, s in zip(mine, seqs)]
        fs = drop_leading(model.score_frontier(from_tuples(whole), top_m=sets[0].top_m), [len(p) for p in mine])
        per_row = packed_row_positions(0, whole)
    else:
        fs = frontier_scores(model, seqs, sets[0].top_m, mine)
        per_row = np.array([len(p) + len(s) for p, s in zip(mine, seqs)], np.int64)
    out, lo = [], 0
    for c in rows:
        hi = lo + c.size
        out.append((c, FrontierScores(*(a[lo:hi] for a in fs)), int(per_row[lo:hi].sum())) if c.size else None)
        lo = hi
    return out


def rescore_many(
    indexes: Sequence[RescoredIndex],
    k: int,
    *,
    start: int = 0,
    prove: bool = False,
    until_certified: bool = False,
    max_rounds: int = DEFAULT_MAX_ROUNDS,
    max_sequences: int | None = None,
    max_seconds: float | None = None,
) -> list[RescoreResult]:
    """``[ri.slice(start, k, prove=prove, ...) for ri in indexes]`` with ONE batched target call
    per round for all of them.

    Each index pulls its own ``start + k + rerank_window`` head (``start + k`` when proving) and keeps its own window, gap and
    carry; the candidates of all indexes are scored together, and with targets that give next-token
    distributions every result carries its own ``proven`` verdict from that same call. With
    ``prove`` the speculative exact search runs for every index at once: each round, every index
    not yet proven adds its own completions and ONE call scores them all. ``until_certified`` grows
    each index's pull until its certificate holds (each growth is that index's own call). Every
    index's ``target_calls`` counts the calls it took part in.

    Args:
      indexes: RescoredIndex objects sharing a target, or whose targets are prompts of one base.
      k: the number of items per index, an integer >= 1.
      start, prove, until_certified, max_rounds, max_sequences, max_seconds: as in
        :meth:`RescoredIndex.slice` (budgets per index; the seconds for the whole call).
    """
    indexes = list(indexes)
    if not indexes or not all(isinstance(ri, RescoredIndex) for ri in indexes):
        raise ValueError("indexes must be a non-empty sequence of RescoredIndex objects")
    queries = [make_query(start, k, ri.rerank_window, ri.assumed_gap) for ri in indexes]
    mode = make_mode(prove, until_certified, max_rounds, max_sequences, queries, max_seconds)
    agree("rescore_many", lambda: {**query_arguments(queries, mode), "indexes": len(indexes),
                                   "prompts": [list(getattr(ri.target, "prompt", ()) or ()) for ri in indexes],
                                   "index": [ri.identity() for ri in indexes]})
    searching = mode.prove or mode.until_certified
    pulls = [ri.draft.pull(min(mode.pull_size([q]), mode.budget.max_sequences), max_rows=mode.budget.max_sequences)
             if searching else ri.draft.pull(q.extent) for ri, q in zip(indexes, queries)]
    # the drafts' calls (seeds, speculation) in lockstep: one call per step for every prompt
    drafts = JointRows([ri.completer.model for ri in indexes], [ri.completer.session for ri in indexes])
    firsts = run_jointly([first_rows_steps(ri, pull, q.start + q.k, mode.budget, mode.prove)  # a draft listing
                          for ri, q, pull in zip(indexes, queries, pulls)], drafts)  # nothing: its top-k
    sets = [ri.new_scored_set() for ri in indexes]
    parts = [first.seqs for first in firsts]
    jt = joint(indexes, sets)
    results = _score_jointly(jt, sets, parts) if any(parts) else [(np.zeros(0), None, 0)] * len(parts)
    for s, first, scored in zip(sets, firsts, results):
        s.add(first.seqs, first.draft_lps, first.ranks, scored=scored)
        s.calls = int(scored[2] > 0)  # it took part in the call when it forwarded a row
    covers = [Query(0, q.start + q.k, 0, q.gap) for q in queries]
    rounds = [1 if part else 0 for part in parts]  # an empty pull made no call
    if mode.until_certified:
        for i, (ri, cover) in enumerate(zip(indexes, covers)):
            if cover.gap is not None:
                pulls[i], rounds[i] = grow_until_certified(cover, ri.draft, pulls[i], sets[i], mode.budget,
                                                           certificate_probe(ri, cover))
            if not mode.prove and sets[i].check(cover.k - 1):  # the answer's cached rows: a full forward
                rounds[i] += 1
    states = _search_jointly(jt, drafts, indexes, sets, start + queries[0].k, mode.budget, rounds,
                             [first.aim for first in firsts]) if mode.prove else None
    out = []
    for i, (ri, q, pull, s) in enumerate(zip(indexes, queries, pulls, sets)):
        s.answer_drafts(q.start + q.k - 1)
        rows = [len(s)] if searching else [min(q.extent, len(pull.seqs))]
        bounds = {} if q.gap is None else {rows[0]: ri.draft.bound(len(pull.seqs), pull)}
        # the search's verdict is on the cover, whose worst rank is this slice's own
        proofs = None if states is None else [states[i].proof]
        out.append(ri.answer([q], s, rows, bounds, proofs, rounds[i] if states is None else states[i].rounds)[0])
    return out


def _search_jointly(jt: Joint, drafts: JointRows, indexes, sets: list[ScoredSet], k: int, budget: SearchBudget,
                    rounds: list[int], aims: list[float]) -> list[SearchState]:
    """The speculative exact search of every index's top ``k`` at once (``rounds``: scoring
    rounds each has made; ``aims``: each draft's expected worst answer, see
    :mod:`jaxrescore.rescore.seed`): per round, each unproven index's new sequences, scored
    together in ONE call, their speculation's draft calls in lockstep (one call of ``drafts`` per
    step). Returns each index's final search state."""
    states = [SearchState(None, r, first_width(ri.search_width, k), adaptive=ri.adaptive_width, aim=a)
              for ri, r, a in zip(indexes, rounds, aims)]
    while True:
        live = [i for i, state in enumerate(states) if not state.stopped]
        decided = run_jointly([round_steps(sets[i], 0, k, indexes[i].completer.steps, budget, states[i].rounds,
                                           states[i].width, states[i].adaptive, states[i].aim) for i in live], drafts)
        new = {}
        for i, r in zip(live, decided):
            if r.new is None:  # a stop on cached numbers: their full forward first, then decide again
                check = sets[i].unchecked(k - 1)
                r = Round(r.proof, [], states[i].width, (), check) if check.size else r
            states[i] = states[i]._replace(proof=r.proof, stopped=r.new is None)
            if r.new is not None:
                new[i] = r
        if not new:
            return states
        live = list(new)
        report(f"round {max(states[i].rounds for i in live) + 1}: scoring {sum(len(new[i].new) for i in live)} new "
               f"sequences for {len(live)} of {len(indexes)} prompts")
        scored = _score_jointly(jt.of(live), [sets[i] for i in live], [new[i].new for i in live],
                                [new[i].check for i in live])
        for i, (sc, checked) in zip(live, scored):
            r = new[i]
            draft_lps = indexes[i].draft_scores(r.new) if indexes[i].assumed_gap is not None else None  # see run.py
            fetched = sets[i].add(r.new, draft_lps, np.full(len(r.new), -1), scored=sc, fetch=r.fetch)
            sets[i].store_check(checked)
            sets[i].calls += int(sc[2] > 0 or fetched or checked is not None)
            states[i] = states[i]._replace(rounds=states[i].rounds + 1, width=r.width)
