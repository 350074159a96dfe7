"""A model restricted to the sequences a constraint accepts: what a constrained proof runs on.

``ConstrainedModel(base, constraint)`` keeps the base's numbers on every allowed step and gives
every other step ``-inf``: its support is the base's sequences that satisfy the constraint, each
scored exactly as the base scores it (unnormalised: the allowed steps are not renormalised). Every
proof rule of :mod:`jaxrescore.rescore.frontier` then holds unchanged: a step still costs >= 0
nats, and a position's named top-m still bounds every token it does not name. So the proven top-k
of a constrained model IS the exact top-k among the base's sequences under the constraint, and a
draft wrapped the same way never speculates or indexes a path the constraint refuses.

Which steps are allowed, at position ``j`` of a sequence (``j`` tokens generated, state ``s`` of
the constraint's automaton after them):

- a token ``t != eos`` when ``next_state[s, t] >= 0`` and an accepted sequence still fits after
  it: ``j + 1 + steps_to_accept[next] (+ 1 for eos) <= max_len``;
- ``eos`` when ``s`` is accepting; for a fixed-length model (no eos) the last token must lead
  to an accepting state (the fit rule above with nothing left).

The base's per-position top-m is re-read under the constraint: refused tokens are dropped, and
when allowed tokens remain that the base did not name, one of them is named with the base's
smallest named value (every unnamed token is below it), so "every unnamed token is at most the
smallest named value" still holds.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxrescore.constraints.automaton import TokenAutomaton, run
from jaxrescore.constraints.kinds import Constraint
from jaxrescore.models.checked import model_rows
from jaxrescore.models.decoding import decoding_session
from jaxrescore.models.scores import FrontierScores, host_top_m, shift_left
from jaxrescore.models.teacher import TeacherForced
from jaxrescore.sequences import SequenceBatch, as_sequence_batch
from jaxrescore.typing import ArrayLike, Sequences

# Positions re-read per block when a named top-m needs an unnamed allowed token (bounds the
# bool[positions, V] block: 256 x 49,152 is 12 MiB).
_BLOCK = 256


class ConstrainedModel:
    """``base`` restricted to the sequences ``constraint`` accepts (see the module docstring).

    Args:
      base: any model (a prompted one constrains its continuations).
      constraint: a :class:`~jaxrescore.constraints.kinds.Constraint`.
      automaton: the constraint compiled for ``base`` (default: compiled now).
    """

    def __init__(self, base: Any, constraint: Constraint, automaton: TokenAutomaton | None = None):
        if not isinstance(constraint, Constraint):
            raise TypeError(
                f"constraint must be a jaxrescore.constraints constraint (Length, Regex, OneOf, or their &), "
                f"got {type(constraint).__name__}"
            )
        self.base = base
        self.constraint = constraint
        self.automaton = constraint.automaton(base) if automaton is None else automaton
        if self.automaton.next_state.shape[1] != int(base.vocab_size):
            raise ValueError(
                f"the constraint's automaton covers {self.automaton.next_state.shape[1]} tokens, the model "
                f"{int(base.vocab_size)}"
            )

    def __repr__(self) -> str:
        return f"ConstrainedModel(base={self.base!r}, constraint={self.constraint!r})"

    # Its rows are not the base's: no session over the base's caches answers for it unmasked
    # (decoding.model_decoder); decoding_session gives the masked one.
    incremental = False
    vocab_size = property(lambda self: int(self.base.vocab_size))
    eos = property(lambda self: self.base.eos)
    max_len = property(lambda self: int(self.base.max_len))
    prompt = property(lambda self: tuple(getattr(self.base, "prompt", ())), doc="The base's prompt (or ()).")
    score_tolerance = property(lambda self: getattr(self.base, "score_tolerance", None))
    vocabulary = property(lambda self: getattr(self.base, "vocabulary", None))
    tokenizer = property(lambda self: getattr(self.base, "tokenizer", None))

    def full_positions(self, rows: list) -> int:
        """Token positions a :meth:`score_frontier` of ``rows`` computes (its base's)."""
        own = getattr(self.base, "full_positions", None)
        return int(own(rows)) if callable(own) else sum(len(self.prompt) + len(r) for r in rows)

    def with_prompt(self, tokens, *, max_new_tokens: int | None = None) -> "ConstrainedModel":
        """The base's continuations of ``tokens`` (ids, or text) under the same constraint (it
        constrains what is generated after the prompt)."""
        return ConstrainedModel(self.base.with_prompt(tokens, max_new_tokens=max_new_tokens), self.constraint,
                                self.automaton)

    # -- which steps are allowed ---------------------------------------------------------------

    def _room(self, position):
        """Tokens an accepted sequence may still take after a token at ``position`` of the row as
        the base reads it (context included: ``max_len`` counts it), before its eos for a
        terminating model."""
        return self.max_len - np.asarray(position, np.int64) - 1 - (self.eos is not None)

    def allowed(self, states: np.ndarray, positions: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """bool[...]: whether ``tokens`` (broadcast against ``states``/``positions[...,None]``
        as the caller shapes them) are allowed in ``states`` (-1: none is) at ``positions``."""
        a = self.automaton
        s = np.asarray(states, np.int64)
        toks = np.asarray(tokens, np.int64)
        if a.empty:  # nothing is accepted: no step is allowed
            return np.zeros(np.broadcast_shapes(s.shape, toks.shape, np.shape(positions)), bool)
        live = s >= 0
        safe_s = np.maximum(s, 0)
        inside = (toks >= 0) & (toks < self.vocab_size)
        nxt = a.next_state[safe_s, np.clip(toks, 0, self.vocab_size - 1)].astype(np.int64)
        fits = a.steps_to_accept[np.maximum(nxt, 0)] <= self._room(positions)
        ok = live & inside & (nxt >= 0) & fits
        if self.eos is not None:
            ok |= live & (toks == self.eos) & a.accepting[safe_s]
        return ok

    def states(self, tokens: np.ndarray, lengths: np.ndarray, start_at=None, offset=None) -> np.ndarray:
        """int32[N, T + 1]: the automaton's state before each position (-1 once a refused step
        was taken), each row from ``start_at[i]`` (default 0: the tokens before it are context);
        ``offset[i]``: context the base reads before column 0 (default 0; it counts in ``max_len``)."""
        tokens = np.asarray(tokens, np.int64)
        lengths = np.asarray(lengths, np.int64)
        n, width = tokens.shape
        begin = np.zeros(n, np.int64) if start_at is None else np.asarray(start_at, np.int64)
        shift = np.zeros(n, np.int64) if offset is None else np.asarray(offset, np.int64)
        states = run(self.automaton, tokens, lengths, self.eos, begin).astype(np.int64)
        if width:
            cols = np.arange(width)[None, :]
            ok = self.allowed(states[:, :-1], cols + shift[:, None], tokens)
            real = (cols >= begin[:, None]) & (cols < lengths[:, None])
            # a refused step kills the row from there on
            dead = np.cumsum(real & ~ok, axis=1) > 0
            states[:, 1:] = np.where(dead, -1, states[:, 1:])
        return states

    def _row_mask(self, states: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """bool[B, V]: the allowed tokens after prefixes in ``states: int[B]`` at ``positions``."""
        return self.allowed(states[:, None], np.asarray(positions)[:, None], np.arange(self.vocab_size)[None, :])

    # -- the protocol ---------------------------------------------------------------------------

    def next_logprobs(self, prefixes: ArrayLike, lengths: ArrayLike) -> np.ndarray:
        """``float32[B, V]``: the base's rows with every refused token at ``-inf``.

        Args:
          prefixes: int32[B, T] (left-aligned), lengths: int32[B].
        """
        prefixes = np.asarray(prefixes, np.int32)
        lengths = np.asarray(lengths, np.int64).reshape(-1)
        rows = np.array(model_rows(self.base, prefixes, lengths.astype(np.int32), "constraint's base"), np.float32)
        states = self.states(prefixes, lengths)[np.arange(lengths.size), lengths]
        return np.where(self._row_mask(states, lengths), rows, -np.inf).astype(np.float32)

    next_logprobs.checks_base_rows = True  # see jaxrescore.models.checked.own_rows

    def score_sequences(self, seqs: Sequences, *, skip: ArrayLike | None = None) -> np.ndarray:
        """``float64[N]``: the base's scores, ``-inf`` for a sequence the constraint refuses
        (from the step after ``skip[i]`` leading tokens on: they are context)."""
        batch = as_sequence_batch(seqs)
        scores = np.array(self.base.score_sequences(batch, skip=skip) if skip is not None
                          else self.base.score_sequences(batch), np.float64)
        return np.where(self._accepted(batch, skip), scores, -np.inf)

    def _accepted(self, batch: SequenceBatch, skip) -> np.ndarray:
        """bool[N]: rows whose every step is allowed (a whole sequence's last one included)."""
        states = self.states(batch.tokens, batch.lengths, skip)
        return states[np.arange(batch.size), batch.lengths] >= 0

    def score_frontier(self, seqs: Sequences, *, top_m: int, skip: ArrayLike | None = None) -> FrontierScores:
        """The base's ``score_frontier`` re-read under the constraint (see the module docstring):
        refused steps ``-inf`` (so is their sequence's score), refused tokens out of each
        position's top-m, ``eos`` only where it is allowed."""
        batch = as_sequence_batch(seqs)
        fs = self.base.score_frontier(batch, top_m=top_m, **({} if skip is None else {"skip": skip}))
        begin = np.zeros(batch.size, np.int64) if skip is None else np.asarray(skip, np.int64).reshape(batch.size)
        # the constraint reads what follows a skipped prefix (context, e.g. a prompt's tokens)
        toks = shift_left(batch.tokens.astype(np.int64), begin, -1)

        def base_rows(rows, at):  # the base's rows after the first ``at`` tokens, context included
            return model_rows(self.base, batch.tokens[rows], at.astype(np.int32), "constraint's base")

        return self.reread(fs, toks, np.maximum(batch.lengths - begin, 0), np.zeros(batch.size, np.int64), base_rows,
                           begin)

    def reread(self, fs: FrontierScores, tokens: np.ndarray, lengths: np.ndarray, first: np.ndarray,
               base_rows, offset=None) -> FrontierScores:
        """``fs`` (the base's numbers of positions ``first[i] + w`` of rows ``tokens: int[N, T]``
        of ``lengths: int[N]``, left-aligned) under the constraint. ``offset[i]``: context the
        base read before ``tokens[i]`` (default 0). ``base_rows(rows, at)`` gives the base's full
        rows ``float32[P, V]`` after the first ``at[p]`` tokens of row ``rows[p]`` as the base
        reads it (see :meth:`_named`)."""
        n, w = fs.steps.shape
        tokens = np.asarray(tokens, np.int64)
        shift = np.zeros(n, np.int64) if offset is None else np.asarray(offset, np.int64).reshape(n)
        states = self.states(tokens, lengths, offset=shift)
        cols = np.asarray(first, np.int64)[:, None] + np.arange(w)[None, :]
        inside = cols < tokens.shape[1]
        pos = np.minimum(cols, max(tokens.shape[1] - 1, 0))
        at = np.where(inside, np.take_along_axis(states, np.minimum(cols, tokens.shape[1]), axis=1), -1)
        toks = np.where(inside, np.take_along_axis(tokens, pos, axis=1) if tokens.shape[1] else -1, -1)
        real = cols < np.asarray(lengths)[:, None]
        where = cols + shift[:, None]  # positions in the row as the base reads it
        step_ok = self.allowed(at, where, toks) | ~real
        steps = np.where(np.cumsum(~step_ok, axis=1) > 0, -np.inf, fs.steps)
        top_lps, top_ids = self._named(at, where, fs.top_lps, fs.top_ids, base_rows)
        eos_lps = fs.eos_lps
        if self.eos is not None:
            eos_lps = np.where(self.allowed(at, where, np.full_like(at, self.eos)), eos_lps, -np.inf).astype(np.float32)
        refused = states[np.arange(n), np.asarray(lengths)] < 0
        return FrontierScores(np.where(refused, -np.inf, fs.scores), steps, top_lps, top_ids, eos_lps)

    def decoding_session(self, *, max_bytes: int | None = None):
        """A :class:`ConstrainedSession` over the base's decoding session (its key/value caches),
        or None when the base decodes no rows incrementally."""
        inner = decoding_session(self.base, max_bytes=max_bytes)
        return None if inner is None else ConstrainedSession(self, inner)

    def _named(self, states, pos, top_lps, top_ids, base_rows):
        """Each position's top-m under the constraint (see the module docstring). A named value
        is always the token's exact log-prob (a search reads held steps from them), and the
        smallest one still bounds every unnamed allowed token: where refused tokens were dropped
        and an allowed one stays named, every dropped slot names the smallest allowed one again
        with the base's smallest named value (its first, exact entry is what a step reads; the
        others restore the bound);
        where none stays named, the position's full base row is read (``base_rows``) and its
        top-m allowed tokens named."""
        vals = np.asarray(top_lps, np.float32)
        ids = np.asarray(top_ids, np.int64)
        n, w, m = vals.shape
        ok = self.allowed(states[:, :, None], pos[:, :, None], ids) & np.isfinite(vals)
        out = np.where(ok, vals, -np.inf).astype(np.float32)
        out_ids = ids.copy()
        if m >= self.vocab_size:  # whole rows: nothing is unnamed
            return out, out_ids.astype(np.int32)
        floor = np.min(np.where(np.isfinite(vals), vals, np.inf), axis=2)  # the base's bound on the unnamed
        dropped = (~ok).any(axis=2) & np.isfinite(floor) & (states >= 0)
        kept = ok.any(axis=2)
        i, j = np.nonzero(dropped & kept)
        last = m - 1 - np.argmax(ok[i, j, ::-1], axis=1)  # the smallest allowed named entry
        # every dropped slot: the frontier reads the smallest of ALL m entries as the bound
        fill = ~ok[i, j]
        out[i, j] = np.where(fill, floor[i, j, None], out[i, j])
        out_ids[i, j] = np.where(fill, ids[i, j, last][:, None], out_ids[i, j])
        ii, jj = np.nonzero(dropped & ~kept)
        for lo in range(0, ii.size, _BLOCK):
            i, j = ii[lo:lo + _BLOCK], jj[lo:lo + _BLOCK]
            mask = self._row_mask(states[i, j], pos[i, j])  # eos too: an exit like any token
            some = mask.any(axis=1)
            i, j, mask = i[some], j[some], mask[some]
            if i.size:
                rows = np.where(mask, np.asarray(base_rows(i, pos[i, j]), np.float32), -np.inf)
                out[i, j], out_ids[i, j] = host_top_m(rows, m)
        order = np.argsort(-out, axis=2, kind="stable")  # descending, as a base names them
        return np.take_along_axis(out, order, axis=2), np.take_along_axis(out_ids, order, axis=2).astype(np.int32)


class ConstrainedSession:
    """A base model's :class:`~jaxrescore.models.decoding.DecodingSession` read under a
    constraint: the rows and teacher-forced numbers of :class:`ConstrainedModel` over held
    key/value caches. Counters and cache control (``positions``, ``calls``, ``clear``...) are
    the inner session's."""

    def __init__(self, model: ConstrainedModel, inner: Any):
        self.model, self.inner = model, inner
        self.vocab_size, self.eos, self.max_len = model.vocab_size, model.eos, model.max_len

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def next_logprobs(self, prefixes: ArrayLike, lengths: ArrayLike) -> np.ndarray:
        """``float32[B, V]``: the inner session's rows, refused tokens at ``-inf``."""
        prefixes = np.asarray(prefixes, np.int32)
        lengths = np.asarray(lengths, np.int64).reshape(-1)
        rows = np.asarray(self.inner.next_logprobs(prefixes, lengths), np.float32)
        states = self.model.states(prefixes, lengths)[np.arange(lengths.size), lengths]
        return np.where(self.model._row_mask(states, lengths), rows, -np.inf).astype(np.float32)

    def teacher_force(self, rows: Sequences, known: ArrayLike, top_m: int) -> TeacherForced:
        """The inner session's ``teacher_force`` re-read under the constraint."""
        out = self.inner.teacher_force(rows, known, top_m)
        batch = as_sequence_batch(rows)
        first = np.asarray(known, np.int64).reshape(batch.size)

        def base_rows(idx, cols):  # cached rows of the inner session (counted in its positions)
            return self.inner.next_logprobs(batch.tokens[idx], cols.astype(np.int32))

        return TeacherForced(self.model.reread(out.frontier, batch.tokens, batch.lengths, first, base_rows), out.positions)

    def packed_force(self, rows: Sequences, top_m: int) -> TeacherForced | None:
        """The inner session's ``packed_force`` (full-forward numbers) re-read under the
        constraint, whole rows the re-read needs from the base's full forward too; None where
        the inner session has none."""
        out = self.inner.packed_force(rows, top_m)
        if out is None:
            return None
        batch = as_sequence_batch(rows)

        def base_rows(idx, cols):
            return model_rows(self.model.base, batch.tokens[idx], cols.astype(np.int32), "constraint's base")

        zero = np.zeros(batch.size, np.int64)
        return TeacherForced(self.model.reread(out.frontier, batch.tokens, batch.lengths, zero, base_rows), out.positions)


def constrain_draft(draft: Any, target: ConstrainedModel) -> ConstrainedModel:
    """``draft`` under the constraint of ``target``, reusing its automaton when their tokens agree
    (the same vocabulary size and eos), else compiled for the draft."""
    same = int(draft.vocab_size) == target.vocab_size and draft.eos == target.eos
    return ConstrainedModel(draft, target.constraint, target.automaton if same else None)


def constrain(model: Any, constraint: Constraint | None, automaton: TokenAutomaton | None = None) -> Any:
    """``model`` under ``constraint`` (a :class:`ConstrainedModel`), or ``model`` itself for None."""
    if constraint is None:
        return model
    return ConstrainedModel(model, constraint, automaton)
