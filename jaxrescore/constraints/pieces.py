"""Each token's text, as a token-level automaton needs it.

A regex constrains the decoded text of the generated tokens. Tokenizers decode a token
differently at the start of a text and after other tokens (a word vocabulary puts a space between
words, a SentencePiece ``"▁the"`` loses its space only at the start), so every token has two
pieces: ``first[t]``, its text when it is the first generated token (``decode([t])``), and
``rest[t]``, the text it adds after another token (``decode([x, t])`` minus ``decode([x])`` for a
plain reference token ``x``). Their concatenation is the decoded text for byte-level BPE
(GPT-2, Llama 3, SmolLM2), SentencePiece, and the character and word vocabularies of
:mod:`jaxrescore.models.vocabulary`.

A token without text of its own gets no piece (None) and is never allowed by a regex: one that
decodes to nothing (a special token) or to U+FFFD (a part of a multi-byte character, which is
text only together with its neighbours).
"""

from __future__ import annotations

from typing import Any

from jaxrescore.models.text import codec_of

REPLACEMENT = "\ufffd"


class TokenPieces:
    """``first`` and ``rest``: a piece (str) or None per token id (see the module docstring)."""

    def __init__(self, first: list, rest: list):
        self.first, self.rest = first, rest


def token_pieces(model: Any) -> TokenPieces:
    """The pieces of every token of ``model``'s vocabulary, from its codec (a tokenizer or a
    vocabulary, see :func:`~jaxrescore.models.text.codec_of`); ValueError when it has neither."""
    codec = codec_of(model)
    if codec is None:
        raise ValueError(
            "a Regex (or OneOf over texts) needs a model with a vocabulary or a tokenizer "
            "(model.with_tokenizer(tok), or save_model(..., vocabulary=...)); OneOf also takes token tuples"
        )
    vocab = int(model.vocab_size)
    eos = model.eos

    decode = codec.decode  # eos is never decoded here: it is no generated token
    first = [_text(decode([t])) if t != eos else None for t in range(vocab)]
    ref = _reference(first)
    if ref is None:
        return TokenPieces(first, list(first))
    lead = decode([ref])
    rest = []
    for t in range(vocab):
        both = decode([ref, t]) if t != eos else ""
        rest.append(_text(both[len(lead):]) if t != eos and both.startswith(lead) else None)
    return TokenPieces(first, rest)


def _text(piece: str) -> str | None:
    return piece if piece and REPLACEMENT not in piece else None


def _reference(first: list) -> int | None:
    """A token whose text is one ASCII letter (the neighbour ``rest`` pieces are read after)."""
    for t, piece in enumerate(first):
        if piece is not None and len(piece) == 1 and piece.isascii() and piece.isalpha():
            return t
    return None
