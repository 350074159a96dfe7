"""A constraint as arrays: a deterministic automaton over token ids.

Every constraint of :mod:`jaxrescore.constraints` compiles, for one model's vocabulary, to a
:class:`TokenAutomaton`: a start state, ``next_state[s, t]`` (the state after generated token
``t`` in state ``s``; -1: ``t`` is not allowed there) and the accepting states. A generated
sequence (``eos`` excluded) satisfies the constraint when every token is allowed in turn and the
last state is accepting; a terminating model may emit ``eos`` exactly in accepting states, so its
``eos`` column is always -1. Automata are *trimmed*: every state can still reach an accepting
one, so a token that leads nowhere is not allowed. ``steps_to_accept[s]`` is the fewest tokens
from ``s`` to an accepting state, which lets a model with a length cap refuse, as early as
possible, a token after which no accepted sequence fits.

Sizes: ``next_state`` is ``int32[S, V]`` (S states of a trimmed automaton, 4 bytes a cell: a
state over a 49,152-token vocabulary holds 192 KiB).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

UNREACHABLE = np.iinfo(np.int32).max


class TokenAutomaton(NamedTuple):
    """A deterministic automaton over token ids (see the module docstring).

    Attributes:
      next_state: int32[S, V], the state after each token (-1: not allowed).
      accepting: bool[S].
      start: the start state, an int in ``[0, S)``.
      steps_to_accept: int32[S], the fewest tokens from each state to an accepting one.
    """

    next_state: np.ndarray
    accepting: np.ndarray
    start: int
    steps_to_accept: np.ndarray

    @property
    def num_states(self) -> int:
        return int(self.accepting.size)

    @property
    def empty(self) -> bool:
        """Whether no sequence satisfies the automaton."""
        return self.num_states == 0


def build(next_state, accepting, start: int, eos: int | None) -> TokenAutomaton:
    """A trimmed :class:`TokenAutomaton` from raw tables: ``next_state: int[S, V]`` (-1: not
    allowed), ``accepting: bool[S]``; ``eos``'s column is cleared (it is never a generated
    token). States that cannot reach an accepting one, and those the start cannot reach, go."""
    nxt = np.array(next_state, np.int64, copy=True)
    acc = np.asarray(accepting, bool).copy()
    if eos is not None:
        nxt[:, eos] = -1
    dist = _steps_to_accept(nxt, acc)
    live = dist < UNREACHABLE
    nxt = np.where((nxt >= 0) & live[np.maximum(nxt, 0)], nxt, -1)
    reach = _reachable(nxt, start) & live if live[start] else np.zeros(acc.size, bool)
    keep = np.flatnonzero(reach)
    new_id = np.full(acc.size + 1, -1, np.int64)  # new_id[-1] maps "not allowed" to itself
    new_id[keep] = np.arange(keep.size)
    table = new_id[nxt[keep]].astype(np.int32)
    start_id = int(new_id[start]) if keep.size else 0
    return TokenAutomaton(table, acc[keep], start_id, dist[keep].astype(np.int32))


def empty_automaton(vocab_size: int) -> TokenAutomaton:
    """The automaton no sequence satisfies."""
    return TokenAutomaton(np.zeros((0, vocab_size), np.int32), np.zeros(0, bool), 0, np.zeros(0, np.int32))


def _steps_to_accept(nxt: np.ndarray, acc: np.ndarray) -> np.ndarray:
    """int64[S]: fewest tokens from each state to an accepting one (:data:`UNREACHABLE`: never);
    backward breadth-first over the distinct edges."""
    s = acc.size
    dist = np.where(acc, 0, UNREACHABLE).astype(np.int64)
    src, dst = _edges(nxt)
    frontier = acc.copy()
    d = 0
    while frontier.any():
        d += 1
        pred = np.zeros(s, bool)
        pred[src[frontier[dst]]] = True
        frontier = pred & (dist == UNREACHABLE)
        dist[frontier] = d
    return dist


def _reachable(nxt: np.ndarray, start: int) -> np.ndarray:
    """bool[S]: the states reachable from ``start``."""
    src, dst = _edges(nxt)
    seen = np.zeros(nxt.shape[0], bool)
    seen[start] = True
    frontier = seen.copy()
    while frontier.any():
        succ = np.zeros_like(seen)
        succ[dst[frontier[src]]] = True
        frontier = succ & ~seen
        seen |= succ
    return seen


def _edges(nxt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct (state, next state) pairs of a table."""
    s, t = np.nonzero(nxt >= 0)
    if not s.size:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    pairs = np.unique(s * nxt.shape[0] + nxt[s, t])
    return pairs // nxt.shape[0], pairs % nxt.shape[0]


def intersect(a: TokenAutomaton, b: TokenAutomaton, eos: int | None) -> TokenAutomaton:
    """The automaton of sequences both accept: the product over the state pairs reachable from
    the two starts (never all ``S_a * S_b``)."""
    vocab = a.next_state.shape[1]
    if a.empty or b.empty:
        return empty_automaton(vocab)
    width = b.num_states
    ids = {a.start * width + b.start: 0}  # pair key -> product state, in discovery order
    order = [a.start * width + b.start]
    rows = []
    for key in order:  # grows while it is walked: a breadth-first search
        na = a.next_state[key // width].astype(np.int64)
        nb = b.next_state[key % width].astype(np.int64)
        ok = (na >= 0) & (nb >= 0)
        uniq, inv = np.unique(na[ok] * width + nb[ok], return_inverse=True)
        for u in uniq.tolist():
            if u not in ids:
                ids[u] = len(order)
                order.append(u)
        row = np.full(vocab, -1, np.int64)
        row[ok] = np.array([ids[u] for u in uniq.tolist()], np.int64)[inv]
        rows.append(row)
    acc = np.array([bool(a.accepting[u // width] and b.accepting[u % width]) for u in order])
    return build(np.stack(rows), acc, 0, eos)


def run(automaton: TokenAutomaton, tokens: np.ndarray, lengths: np.ndarray, eos: int | None,
        start_at: np.ndarray | None = None) -> np.ndarray:
    """int32[N, T + 1]: the state before each position of each row (-1: a token before it was
    not allowed; ``eos`` leaves the state as it is, the caller decides whether it was allowed).

    Args:
      tokens: int[N, T], the rows (left-aligned).
      lengths: int[N].
      start_at: optional int[N]: the automaton starts at position ``start_at[i]`` of row ``i``
        (the tokens before it are context); states before it are the start state.
    """
    n, width = tokens.shape
    states = np.full((n, width + 1), -1, np.int32)
    if automaton.empty:
        return states
    begin = np.zeros(n, np.int64) if start_at is None else np.asarray(start_at, np.int64).reshape(n)
    cur = np.full(n, automaton.start, np.int64)
    states[:, 0] = cur
    table = automaton.next_state
    for j in range(width):
        tok = tokens[:, j].astype(np.int64)
        moving = (j >= begin) & (j < np.asarray(lengths)) & (cur >= 0)
        is_eos = (tok == eos) if eos is not None else np.zeros(n, bool)
        safe = np.clip(tok, 0, table.shape[1] - 1)
        step = np.where(is_eos, cur, table[np.maximum(cur, 0), safe])
        step = np.where((tok < 0) | (tok >= table.shape[1]), -1, step)
        cur = np.where(moving, step, cur)
        states[:, j + 1] = cur
    return states
