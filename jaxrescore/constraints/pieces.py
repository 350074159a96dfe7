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
text only together with its neighbours). That a run of tokens decodes to its pieces one after
another is checked on random runs when the pieces are read (:func:`check_pieces`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

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
        pieces = TokenPieces(first, list(first))
    else:
        lead = decode([ref])
        rest = []
        for t in range(vocab):
            both = decode([ref, t]) if t != eos else ""
            rest.append(_text(both[len(lead):]) if t != eos and both.startswith(lead) else None)
        pieces = TokenPieces(first, rest)
    check_pieces(pieces, decode)
    return pieces


def check_pieces(pieces: TokenPieces, decode, samples: int = 256, seed: int = 0) -> None:
    """The assumption a regex proof rests on, checked on ``samples`` random runs of 2-5 text
    tokens: the codec decodes each run to its pieces' concatenation. ValueError otherwise (a
    tokenizer that rewrites text across tokens, e.g. one cleaning up spaces before punctuation:
    a regex over it would read other text than the answer decodes to)."""
    text = [t for t, p in enumerate(pieces.first) if p is not None and pieces.rest[t] is not None]
    if len(text) < 2:
        return
    rng = np.random.default_rng(seed)
    for _ in range(samples):
        run = rng.choice(text, size=int(rng.integers(2, 6))).tolist()
        want = pieces.first[run[0]] + "".join(pieces.rest[t] for t in run[1:])
        got = str(decode(run))
        if got != want:
            raise ValueError(
                f"the model's tokenizer decodes tokens {run} to {got!r}, not to their texts one after "
                f"another ({want!r}): a Regex cannot read its text token by token"
            )


def _text(piece: str) -> str | None:
    return piece if piece and REPLACEMENT not in piece else None


def _reference(first: list) -> int | None:
    """A token whose text is one ASCII letter (the neighbour ``rest`` pieces are read after)."""
    for t, piece in enumerate(first):
        if piece is not None and len(piece) == 1 and piece.isascii() and piece.isalpha():
            return t
    return None
