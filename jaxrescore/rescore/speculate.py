"""Speculation: the draft proposes the paths a proving search asks the target to verify.

:func:`completion_model` picks the model that completes exit prefixes (the draft's, checked where
it enters, continued by the target past a shorter ``max_len``); :func:`greedy_complete` completes
a batch of prefixes with it, one model call per step. None of it touches soundness: the target
scores every speculated sequence and the proof reads only the target's numbers.
"""

from __future__ import annotations

import inspect
from typing import Any, NamedTuple

import numpy as np

from jaxrescore.models.callable import CallableModel
from jaxrescore.models.checked import ContinuedModel, checked_model
from jaxrescore.models.decoding import incremental
from jaxrescore.models.lockstep import Steps, run
from jaxrescore.models.mesh import to_host
from jaxrescore.models.base import Structure
from jaxrescore.sequences import from_tuples


def completion_model(draft_index: Any, draft_model: Any, target: Any):
    """The model that completes exit prefixes: ``draft_model`` if given, else the draft index's
    own model when it has the batched protocol (``next_logprobs(prefixes, lengths)``) or the
    reference library's per-prefix form (wrapped in a CallableModel), else None.

    A model that is not one of this library's is checked where it enters (its protocol
    attributes now, every row block it returns later; see :mod:`jaxrescore.models.checked`),
    so a bad ``draft_model`` raises a ValueError naming it here. A model shorter than a target
    that has ``next_logprobs`` is continued by the target past its ``max_len`` (completions are
    speculation only: the target scores every one)."""
    what = "draft_model" if draft_model is not None else "draft_index.model"
    model = draft_model if draft_model is not None else getattr(draft_index, "model", None)
    fn = getattr(model, "next_logprobs", None)
    if model is None or not callable(fn):
        if draft_model is not None:
            raise TypeError(
                f"draft_model must have next_logprobs(prefixes, lengths) (or the per-prefix "
                f"next_logprobs(prefix)), got {type(draft_model).__name__}"
            )
        return None
    try:
        arity = len([p for p in inspect.signature(fn).parameters.values() if p.default is p.empty])
    except (TypeError, ValueError):
        arity = 2
    if arity >= 2 and hasattr(model, "vocab_size") and hasattr(model, "max_len"):
        model = checked_model(model, what)
    elif arity == 1:
        max_len = getattr(model, "max_len", None) or getattr(target, "max_len")
        model = CallableModel(fn, max_len=max_len, eos=getattr(model, "eos", None))
    else:
        return None
    target_len = getattr(target, "max_len", None)
    if (
        isinstance(target_len, int)
        and callable(getattr(target, "next_logprobs", None))
        and int(model.max_len) < target_len
    ):
        model = ContinuedModel(model, target)
    return model


class Speculation(NamedTuple):
    """Speculated paths, with what the draft expects of them (see :func:`speculate`).

    Attributes:
      rows: int32[N, L] padded paths (each a prefix it was asked to complete, then its tokens);
      lengths: int64[N]; ``starts``: int64[N] the prefix's length; ``values``: float64[N] the
        prefix's exact target log-prob (0 when none was given);
      trace: float64[N, L], the estimate after each token from ``starts`` on (the value plus the
        model's log-probs of the tokens added; an ``eos`` forced at ``max_len - 1``, or after an
        estimate already below the floor, adds nothing; a token outside a narrower model's rows,
        such as the target's ``eos`` when the draft's vocabulary lacks it, has ``-inf``: the
        model gives no estimate for it), ``+inf`` before;
      natural: bool[N], a path the model ended itself (it chose ``eos``; a fixed-length target's
        full row), not one closed at ``max_len - 1`` or below a floor.
    """

    rows: np.ndarray
    lengths: np.ndarray
    starts: np.ndarray
    values: np.ndarray
    trace: np.ndarray
    natural: np.ndarray
    origin: np.ndarray

    def of_prefixes(self, n: int) -> "Speculation":
        """The paths of the first ``n`` prefixes only (forks included)."""
        keep = self.origin < n
        return Speculation(*(a[keep] for a in self))

    def sequences(self) -> list:
        """The paths as tuples, each once, in order."""
        return list(dict.fromkeys(tuple(r[:n].tolist()) for r, n in zip(self.rows, self.lengths)))

    def estimates(self) -> np.ndarray:
        """float64[N]: the draft's estimate of each path a model ended itself (a complete
        sequence's expected target log-prob), ``-inf`` for the others."""
        last = self.trace[np.arange(self.lengths.size), np.maximum(self.lengths - 1, 0)]
        return np.where(self.natural & (self.lengths > self.starts), last, -np.inf)

    def aimed(self, aim: float, eos: int | None) -> list:
        """The paths of prefixes worth at least ``aim``, each cut (and closed with ``eos``) before
        the first token that takes its estimate below ``aim``, as tuples, each once. Without an
        ``eos`` (a fixed-length target) a path is not cut."""
        keep = np.flatnonzero(~(self.values < aim))  # a NaN value is kept
        rows, lengths = self.rows[keep], self.lengths[keep]
        if eos is not None and keep.size:
            cols = np.arange(rows.shape[1])[None, :]
            below = (cols >= self.starts[keep][:, None]) & (cols < lengths[:, None]) & (self.trace[keep] < aim)
            cut = np.flatnonzero(below.any(axis=1))
            at = np.argmax(below[cut], axis=1)  # the first token taking the estimate below aim
            rows = rows.copy()
            rows[cut, at] = eos
            lengths = lengths.copy()
            lengths[cut] = at + 1
        return list(dict.fromkeys(tuple(r[:n]) for r, n in zip(rows.tolist(), lengths.tolist())))


class Completer:
    """Speculation over an index's completion model (``model``: the draft's, or the target's
    without one) through ONE decoding session for the index's life when it decodes
    incrementally: a round extends the rows earlier rounds speculated instead of recomputing every
    exit prefix from the prompt (the session drops its caches itself when the weights change).
    ``structure()``: the target's :class:`Structure` now (an inferred vocabulary grows);
    ``branch``: see :func:`speculate`."""

    def __init__(self, model, structure, branch: int = 1):
        self.model, self._structure, self._branch = model, structure, branch
        self._session = None

    def session(self):
        """The model as an incremental session, made at the first call."""
        if self._session is None:
            self._session = incremental(self.model)
        return self._session

    def rows(self, prefixes: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """The model's next-token rows, through :meth:`session`."""
        return self.session().next_logprobs(prefixes, lengths)

    def steps(self, prefixes: list, values=None, floor: float = -np.inf) -> Steps:
        """:func:`speculate`'s paths from ``prefixes`` as a generator of the model's calls (see
        :mod:`jaxrescore.models.lockstep`; :meth:`rows` answers them alone)."""
        structure = self._structure()
        limit = min(structure.max_len, int(getattr(self.model, "max_len", structure.max_len)))
        return speculate_steps(prefixes, structure, limit, self._branch, values, floor)

    @property
    def positions(self) -> int | None:
        """Token positions the session computed so far; None when the model is not decoded
        incrementally (its positions are not counted)."""
        if self._session is None:
            return 0
        return getattr(self._session, "positions", None) if self._session is not self.model else None


def greedy_complete(model, prefixes: list, structure: Structure, branch: int = 1, values=None, floor: float = -np.inf) -> list:
    """The paths of :func:`speculate` as tuples, each once, in order."""
    return speculate(model, prefixes, structure, branch, values, floor).sequences()


def speculate(model, prefixes: list, structure: Structure, branch: int = 1, values=None,
              floor: float = -np.inf) -> Speculation:
    """Complete each prefix into a sequence of the target's support by taking the model's likeliest
    next token (batched over prefixes, one model call per step). With ``branch > 1`` the first
    step after each prefix forks into the model's ``branch`` likeliest tokens, each then completed
    greedily (a small best-first: more speculated paths per round). A terminating target's rows
    end with ``eos`` (forced at ``max_len - 1``), a fixed-length target's at ``max_len`` tokens.
    A model that decodes incrementally extends every row by one cached token position per step
    (:mod:`jaxrescore.models.decoding`).

    Speculation stops where it can no longer matter: with ``values`` (float64[P], each prefix's
    exact target log-prob) and a finite ``floor``, a row of a terminating target is closed with
    ``eos`` instead of taking a token that would bring its estimate (its prefix's value plus the
    model's log-probs of the tokens it added) below ``floor`` (and a fork below it is not made).
    That sequence is in the support and its forward gives the target's distribution after the
    last speculated token: the node becomes a live prefix with exact exits, and no node the draft
    already expects below the answer is computed.

    Returns the paths as a :class:`Speculation`: the prefixes' rows first, in order, then the
    forks, with the model's estimate after each token."""
    model = incremental(model)
    limit = min(structure.max_len, int(getattr(model, "max_len", structure.max_len)))
    return run(speculate_steps(prefixes, structure, limit, branch, values, floor), model.next_logprobs)


def speculate_steps(prefixes: list, structure: Structure, limit: int, branch: int = 1, values=None,
                    floor: float = -np.inf) -> Steps:
    """:func:`speculate` as a generator of its model calls (see :mod:`jaxrescore.models.lockstep`):
    it yields ``(prefixes, lengths)`` and is sent the model's rows; ``limit``: the longest prefix
    the model can extend is ``limit - 1`` (its ``max_len``, at most the structure's)."""
    eos, max_len = structure.eos, structure.max_len
    # the columns a row must have: the target's tokens, eos included (it closes paths)
    need = max(structure.vocab_size or 0, 0 if eos is None else eos + 1)
    # rows: int32[N, max_len] padded sequences and their lengths, grown one column per step
    batch = from_tuples(prefixes)
    lens = batch.lengths.astype(np.int64)
    rows = np.zeros((batch.size, max(max_len, batch.tokens.shape[1])), np.int32)
    rows[:, : batch.tokens.shape[1]] = batch.tokens  # padded with 0
    value = np.zeros(batch.size) if values is None else np.asarray(values, np.float64).reshape(batch.size).copy()
    est, starts = value.copy(), lens.copy()
    trace = np.full(rows.shape, np.inf)
    natural = np.zeros(batch.size, bool)
    origin = np.arange(batch.size)
    first = True
    while True:
        alive = lens < max_len
        if eos is not None:  # a row that ended with eos is complete
            alive &= ~((lens > 0) & (rows[np.arange(lens.size), np.maximum(lens - 1, 0)] == eos))
        else:  # a fixed-length target's full row is as the model made it
            natural |= ~alive & (lens > starts)
        if eos is not None:  # the last position (or a prefix below floor): only eos, closing it
            at_end = alive & ((lens == max_len - 1) | (est < floor))
            rows[at_end, lens[at_end]] = eos
            trace[at_end, lens[at_end]] = est[at_end]
            lens[at_end] += 1
            alive &= ~at_end
        idx = np.flatnonzero(alive)
        if idx.size == 0:
            return Speculation(rows, lens, starts, value, trace, natural, origin)
        if lens[idx].max() >= limit:
            raise ValueError(
                f"the completion model (max_len={limit}) cannot extend a prefix to the target's "
                f"max_len={max_len}; pass draft_model= a model as long as the target"
            )
        width = max(1, int(lens[idx].max()))
        # float32 rows stay float32 (a float64 copy of every [B, V] row was most of this loop's
        # time): an estimate adds the chosen entries to float64 sums, exactly as their copies
        lp = to_host((yield rows[idx, :width], lens[idx].astype(np.int32)))
        if lp.dtype not in (np.float32, np.float64):
            lp = lp.astype(np.float64)
        if lp.size and np.isnan(lp.max()):  # one pass (max propagates NaN); a copy only if needed
            lp = np.where(np.isnan(lp), -np.inf, lp)
        if structure.vocab_size is not None and lp.shape[1] > structure.vocab_size:
            lp = np.array(lp)  # the device's rows are read-only
            lp[:, structure.vocab_size :] = -np.inf  # a token the target does not have ends no path
        if lp.shape[1] < need:  # a narrower draft gives the target's extra tokens (eos among them)
            lp = np.pad(lp, ((0, 0), (0, need - lp.shape[1])), constant_values=-np.inf)  # no estimate
        if first and branch > 1:
            order = np.argsort(-lp, axis=1, kind="stable")[:, :branch]
            # forks: each alive row's 2nd..branch-th likeliest finite tokens whose estimate stays
            # at or above the floor, as new rows at the end
            fork_lp = np.take_along_axis(lp, order[:, 1:], axis=1)
            j, c = np.nonzero(np.isfinite(fork_lp) & (est[idx][:, None] + fork_lp >= floor))
            forks = rows[idx[j]]
            forks[np.arange(j.size), lens[idx[j]]] = order[j, c + 1]
            best = order[:, 0]
        else:
            j, forks, best = np.zeros(0, np.int64), rows[:0], np.argmax(lp, axis=1)  # first max, as the stable sort
        if eos is not None:  # a token that takes the estimate below the floor is not speculated:
            below = est[idx] + lp[np.arange(idx.size), best] < floor  # the path ends here instead
            natural[idx] = ~below & (best == eos)
            best = np.where(below, eos, best)
        rows[idx, lens[idx]] = best
        fork_lens = lens[idx[j]] + 1
        fork_est = est[idx[j]] + lp[j, order[j, c + 1]] if j.size else est[:0]
        fork_trace = trace[idx[j]]
        fork_trace[np.arange(j.size), lens[idx[j]]] = fork_est
        est[idx] += lp[np.arange(idx.size), best]
        trace[idx, lens[idx]] = est[idx]
        lens[idx] += 1
        rows, lens = np.concatenate([rows, forks]), np.concatenate([lens, fork_lens])
        est, trace = np.concatenate([est, fork_est]), np.concatenate([trace, fork_trace])
        starts, value = np.concatenate([starts, starts[idx[j]]]), np.concatenate([value, value[idx[j]]])
        origin = np.concatenate([origin, origin[idx[j]]])
        natural = np.concatenate([natural, order[j, c + 1] == eos if j.size and eos is not None else np.zeros(j.size, bool)])
        first = False
