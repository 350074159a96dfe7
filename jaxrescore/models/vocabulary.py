"""A model's vocabulary: its token strings (token id ``i`` reads as ``vocabulary[i]``), how they
are checked, and text written with them (characters without spaces, words with single spaces)."""

from __future__ import annotations


def is_token_string(word) -> bool:
    """Whether ``word`` can be a vocabulary entry: a non-empty str without tabs or line breaks."""
    return isinstance(word, str) and bool(word) and not any(c in word for c in "\t\r\n")


def check_vocabulary(vocabulary, vocab_size: int) -> tuple[str, ...] | None:
    """A model's token strings checked: None, or ``vocab_size`` distinct non-empty strings without
    line breaks or tabs (token id ``i`` reads as ``vocabulary[i]``), as a tuple."""
    if vocabulary is None:
        return None
    if isinstance(vocabulary, (str, bytes)):
        raise ValueError(f"vocabulary must be a sequence of {vocab_size} token strings, got one string")
    try:
        words = tuple(vocabulary)
    except TypeError:
        raise ValueError(f"vocabulary must be a sequence of {vocab_size} token strings, got {type(vocabulary).__name__}") from None
    if len(words) != vocab_size:
        raise ValueError(f"vocabulary must have one string per token id ({vocab_size}), got {len(words)}")
    bad = [w for w in words if not is_token_string(w)]
    if bad:
        raise ValueError(f"vocabulary entries must be non-empty strings without tabs or line breaks, got {bad[:3]!r}")
    if len(set(words)) != len(words):
        dup = sorted({w for w in words if words.count(w) > 1})
        raise ValueError(f"vocabulary entries must be distinct, got duplicates {dup[:3]!r}")
    return words


def is_character_vocabulary(vocabulary: tuple[str, ...], eos: int | None) -> bool:
    """Whether every token but ``eos`` is one character: text is then written without spaces."""
    return all(len(w) == 1 for i, w in enumerate(vocabulary) if i != eos)


def decode_tokens(tokens, vocabulary: tuple[str, ...], eos: int | None) -> str:
    """A token sequence as text: each token's string (a trailing ``eos`` left out), joined without
    spaces for a character vocabulary, else with single spaces."""
    toks = [int(t) for t in tokens]
    if eos is not None and toks and toks[-1] == eos:
        toks = toks[:-1]
    sep = "" if is_character_vocabulary(vocabulary, eos) else " "
    return sep.join(vocabulary[t] for t in toks)


def text_ids(text: str, vocabulary: tuple[str, ...], eos: int | None) -> tuple[int, ...]:
    """The token ids of ``text`` (no ``eos`` appended; ``eos`` is never read from text):
    characters for a character vocabulary, else whitespace-separated token strings. ValueError
    naming the first unknown token."""
    index = {w: i for i, w in enumerate(vocabulary) if i != eos}
    parts = list(text) if is_character_vocabulary(vocabulary, eos) else text.split()
    unknown = [p for p in parts if p not in index]
    if unknown:
        raise ValueError(f"{text!r} has token {unknown[0]!r}, which is not in the model's vocabulary")
    return tuple(index[p] for p in parts)


def encode_text(text: str, vocabulary: tuple[str, ...], eos: int | None) -> tuple[int, ...]:
    """The inverse of :func:`decode_tokens`: :func:`text_ids` with ``eos`` appended when the model
    has one."""
    return text_ids(text, vocabulary, eos) + (() if eos is None else (eos,))
