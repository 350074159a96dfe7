"""The constraints a proven search can be asked under: length, regex, choices, and their ``&``.

Each constrains the GENERATED tokens (a prompted model's continuation), ``eos`` excluded, and
compiles for one model to a :class:`~jaxrescore.constraints.automaton.TokenAutomaton`:

- ``Length(min_tokens=None, max_tokens=None)``: how many tokens are generated;
- ``Regex(pattern)``: the decoded text of the generated tokens FULLY matches ``pattern`` (Python
  regex syntax without backreferences or lookarounds: literals, classes, ``.``, ``|``, groups,
  ``* + ? {m,n}``); needs a model with a vocabulary or a tokenizer, and reads each token's text
  as :mod:`jaxrescore.constraints.pieces` does (tokens without text of their own never match);
- ``OneOf(choices)``: the generated tokens are one of ``choices``, given as texts (the decoded
  text equals one of them, however it is tokenized: a regex of the escaped texts) or as token
  tuples (exactly those tokens);
- ``a & b``: both.
"""

from __future__ import annotations

import functools
import re
from typing import Any, Sequence

import numpy as np

from jaxrescore._checks import check_int
from jaxrescore.constraints.automaton import TokenAutomaton, build, intersect
from jaxrescore.constraints.pieces import TokenPieces, token_pieces


class Constraint:
    """A constraint on the generated tokens (see the module docstring); ``a & b`` combines."""

    def automaton(self, model: Any) -> TokenAutomaton:
        """The constraint over ``model``'s token ids (its ``vocab_size`` and ``eos``)."""
        raise NotImplementedError

    def __and__(self, other: "Constraint") -> "Constraint":
        if not isinstance(other, Constraint):
            return NotImplemented
        return AllOf(self, other)


def _support(model: Any) -> tuple[int, int | None]:
    return int(model.vocab_size), (None if model.eos is None else int(model.eos))


class Length(Constraint):
    """Between ``min_tokens`` and ``max_tokens`` generated tokens, ``eos`` excluded (None: no
    bound on that side)."""

    def __init__(self, min_tokens: int | None = None, max_tokens: int | None = None):
        self.min_tokens = check_int(min_tokens, "min_tokens", minimum=0, allow_none=True)
        self.max_tokens = check_int(max_tokens, "max_tokens", minimum=0, allow_none=True)
        if self.min_tokens is not None and self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens={self.min_tokens} is above max_tokens={self.max_tokens}")

    def __repr__(self) -> str:
        return f"Length(min_tokens={self.min_tokens}, max_tokens={self.max_tokens})"

    def automaton(self, model: Any) -> TokenAutomaton:
        vocab, eos = _support(model)
        low = self.min_tokens or 0
        # states count tokens: up to max_tokens, or saturating at min_tokens without a maximum
        top = self.max_tokens if self.max_tokens is not None else low
        count = np.arange(top + 1)
        after = count + 1 if self.max_tokens is not None else np.minimum(count + 1, top)
        after = np.where(after <= top, after, -1)
        return build(np.repeat(after[:, None], vocab, axis=1), count >= low, 0, eos)


class Regex(Constraint):
    """The decoded text of the generated tokens fully matches ``pattern`` (see the module
    docstring for the syntax and how token texts are read)."""

    def __init__(self, pattern: str):
        if not isinstance(pattern, str):
            raise TypeError(f"pattern must be a str, got {type(pattern).__name__}")
        self.pattern = pattern
        self._fsm = _char_automaton(pattern)

    def __repr__(self) -> str:
        return f"Regex({self.pattern!r})"

    def automaton(self, model: Any) -> TokenAutomaton:
        vocab, eos = _support(model)
        return _token_automaton(self._fsm, token_pieces(model), vocab, eos)

    def matches(self, text: str) -> bool:
        """Whether ``text`` fully matches the pattern (Python's ``re``)."""
        return re.fullmatch(self.pattern, text, flags=re.DOTALL) is not None


class OneOf(Constraint):
    """The generated tokens are one of ``choices``: all texts, or all token tuples (see the
    module docstring)."""

    def __init__(self, choices: Sequence[Any]):
        if isinstance(choices, (str, bytes)):
            raise TypeError("choices must be a list of texts or of token tuples, not one str")
        items = list(choices)
        if not items:
            raise ValueError("choices must hold at least one choice")
        if all(isinstance(c, str) for c in items):
            self.texts: tuple | None = tuple(items)
            self.sequences: tuple | None = None
            self._regex = Regex("|".join(_escape(c) for c in items))
            return
        try:
            seqs = [tuple(int(t) for t in c) for c in items]
        except (TypeError, ValueError):
            raise TypeError("choices must be all texts or all sequences of integer token ids") from None
        if any(isinstance(c, str) for c in items):
            raise TypeError("choices must be all texts or all token tuples, not a mix")
        self.texts, self.sequences, self._regex = None, tuple(seqs), None

    def __repr__(self) -> str:
        return f"OneOf({list(self.texts if self.texts is not None else self.sequences)!r})"

    def automaton(self, model: Any) -> TokenAutomaton:
        if self._regex is not None:
            return self._regex.automaton(model)
        vocab, eos = _support(model)
        bad = [t for s in self.sequences for t in s if t < 0 or t >= vocab or t == eos]
        if bad:
            raise ValueError(f"choices hold token {bad[0]}, not a generated token of the model (ids in [0, {vocab}), eos excluded)")
        trie: dict = {(): 0}
        for seq in self.sequences:
            for n in range(1, len(seq) + 1):
                trie.setdefault(seq[:n], len(trie))
        table = np.full((len(trie), vocab), -1, np.int64)
        for node, i in trie.items():
            if node:
                table[trie[node[:-1]], node[-1]] = i
        acc = np.zeros(len(trie), bool)
        acc[[trie[s] for s in self.sequences]] = True
        return build(table, acc, 0, eos)


class AllOf(Constraint):
    """Every one of ``parts`` (what ``a & b`` builds)."""

    def __init__(self, *parts: Constraint):
        flat = []
        for p in parts:
            if not isinstance(p, Constraint):
                raise TypeError(f"AllOf takes constraints, got {type(p).__name__}")
            flat.extend(p.parts if isinstance(p, AllOf) else [p])
        if not flat:
            raise ValueError("AllOf needs at least one constraint")
        self.parts = tuple(flat)

    def __repr__(self) -> str:
        return " & ".join(repr(p) for p in self.parts)

    def automaton(self, model: Any) -> TokenAutomaton:
        _, eos = _support(model)
        return functools.reduce(lambda a, b: intersect(a, b, eos), (p.automaton(model) for p in self.parts))


# -- regex to a token automaton ---------------------------------------------------------------------

_SPECIAL = set(".^$*+?{}[]\\|()")


def _escape(text: str) -> str:
    """``text`` as a regex matching exactly it (only the metacharacters escaped: the regex
    parser reads no other escapes)."""
    return "".join("\\" + c if c in _SPECIAL else c for c in text)


def _char_automaton(pattern: str):
    """The pattern's character automaton (``interegular``'s FSM); ValueError naming the pattern
    when it does not parse or uses what an automaton cannot express."""
    import interegular  # noqa: PLC0415  (only constraints over text need it)

    try:
        return interegular.parse_pattern(pattern).to_fsm()
    except Exception as err:  # its parse errors have several types
        why = str(err) or type(err).__name__  # its InvalidSyntax carries no message
        raise ValueError(f"pattern {pattern!r} is not a regex a finite automaton can match ({why})") from None


def _walk(fsm, state, piece: str):
    """The character automaton's state after ``piece`` from ``state``, or None (dead)."""
    for ch in piece:
        state = fsm.map.get(state, {}).get(fsm.alphabet[ch])
        if state is None:
            return None
    return state


def _token_automaton(fsm, pieces: TokenPieces, vocab: int, eos: int | None) -> TokenAutomaton:
    """Token-level states are (character state, whether a token was generated): the first
    token reads its ``first`` piece, every later one its ``rest`` piece."""
    ids = {(fsm.initial, False): 0}
    order = [(fsm.initial, False)]
    rows = []
    for state, started in order:  # grows while it is walked: a breadth-first search
        texts = pieces.rest if started else pieces.first
        row = np.full(vocab, -1, np.int64)
        memo: dict = {}
        for t, piece in enumerate(texts):
            if piece is None:
                continue
            if piece not in memo:
                memo[piece] = _walk(fsm, state, piece)
            nxt = memo[piece]
            if nxt is None:
                continue
            key = (nxt, True)
            if key not in ids:
                ids[key] = len(order)
                order.append(key)
            row[t] = ids[key]
        rows.append(row)
    acc = np.array([s in fsm.finals for s, _ in order])
    return build(np.stack(rows), acc, 0, eos)
