"""Text in and out: a model's vocabulary or tokenizer as one codec.

A model reads text in one of two ways, looked up in this order by :func:`codec_of`:

* a **tokenizer** set with ``model.with_tokenizer(tok)``: any object with ``encode(text)`` and
  ``decode(ids)`` — a Hugging Face ``tokenizers.Tokenizer`` (whose ``encode`` returns an object
  with ``.ids``), a ``transformers`` tokenizer (a list of ids), a sentencepiece processor, or two
  functions of one's own in a small class;
* a **vocabulary**, the model's token strings (``vocabulary[i]`` is token ``i``; stored by
  ``save_model(..., vocabulary=...)``): characters are written without spaces, words with single
  spaces (see :func:`~jaxrescore.models.vocabulary.decode_tokens`).

Encoding never appends ``eos`` (text in is a prompt: a finished sequence has no continuations);
decoding leaves a trailing ``eos`` out.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from jaxrescore.models.vocabulary import check_vocabulary, decode_tokens, text_ids


class TextCodec:
    """Text to token ids and back for one model (see the module docstring).

    Args:
      encode: ``encode(text: str) -> sequence of int``.
      decode: ``decode(ids: list[int]) -> str``.
      eos: the model's end-of-sequence id (left out of what is decoded), or None.
    """

    def __init__(self, encode, decode, eos: int | None):
        self._encode, self._decode, self.eos = encode, decode, eos

    def encode(self, text: str) -> tuple[int, ...]:
        """The token ids of ``text`` (no ``eos`` appended)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        raw = self._encode(text)
        ids = getattr(raw, "ids", raw)  # tokenizers.Encoding carries its ids in .ids
        try:
            arr = np.asarray(list(ids))
        except TypeError:
            raise TypeError(f"the tokenizer's encode returned {type(raw).__name__}; expected token ids") from None
        if arr.size and arr.dtype.kind not in "iu":
            raise TypeError(f"the tokenizer's encode returned {arr.dtype} values; expected integer token ids")
        return tuple(int(t) for t in arr.reshape(-1))

    def decode(self, tokens) -> str:
        """``tokens`` as text, a trailing ``eos`` left out."""
        toks = [int(t) for t in tokens]
        if self.eos is not None and toks and toks[-1] == self.eos:
            toks = toks[:-1]
        return str(self._decode(toks))


def vocabulary_codec(vocabulary, vocab_size: int, eos: int | None) -> TextCodec:
    """The codec of a vocabulary of token strings (checked, one per token id)."""
    if isinstance(vocabulary, tuple) and all(isinstance(w, str) for w in vocabulary):
        return _held_codec(vocabulary, vocab_size, eos)  # a model's own: checked once, not per query
    return _codec(vocabulary, vocab_size, eos)


def _codec(vocabulary, vocab_size: int, eos: int | None) -> TextCodec:
    words = check_vocabulary(vocabulary, vocab_size)
    return TextCodec(lambda text: text_ids(text, words, eos), lambda ids: decode_tokens(ids, words, eos), eos)


# A query writes its answer's texts with its target's codec; checking a 3,210-word vocabulary takes
# ~2 ms (a 32-prompt proof checked it 32 times).
_held_codec = functools.lru_cache(maxsize=16)(_codec)


def check_tokenizer(tokenizer: Any) -> Any:
    """``tokenizer`` itself when it has callable ``encode`` and ``decode``; TypeError otherwise."""
    if not (callable(getattr(tokenizer, "encode", None)) and callable(getattr(tokenizer, "decode", None))):
        raise TypeError(
            "tokenizer must have encode(text) -> ids and decode(ids) -> text (e.g. a tokenizers.Tokenizer), "
            f"got {type(tokenizer).__name__}"
        )
    return tokenizer


def codec_of(model: Any) -> TextCodec | None:
    """The model's codec: its tokenizer, else its vocabulary, looked up on the model and on the
    models it wraps (a prompted model's base, a checked model's model); None when it has neither."""
    eos = getattr(model, "eos", None)
    seen = model
    while seen is not None:
        tok = getattr(seen, "tokenizer", None)
        if tok is not None:
            return TextCodec(tok.encode, tok.decode, eos)
        vocabulary = getattr(seen, "vocabulary", None)
        if vocabulary is not None:
            return vocabulary_codec(vocabulary, int(seen.vocab_size), None if seen.eos is None else int(seen.eos))
        seen = getattr(seen, "base", None) or getattr(seen, "model", None)
    return None


def encode_prompt(model: Any, prompt: Any) -> Any:
    """A prompt as given, or ``prompt`` encoded with the model's codec when it is text.

    A text whose first token is the model's ``bos_id`` (a chat template written out, e.g.
    SmolLM2's ``"<|im_start|>user\n..."`` with ``<|im_start|>`` as BOS) drops that token: the
    model feeds ``bos_id`` at position 0 itself, so the text conditions exactly as written
    instead of on a doubled BOS."""
    if not isinstance(prompt, str):
        return prompt
    codec = codec_of(model)
    if codec is None:
        raise ValueError(
            "a text prompt needs a model with a vocabulary or a tokenizer (model.with_tokenizer(tok), "
            "or save_model(..., vocabulary=...)); pass token ids instead"
        )
    ids = tuple(codec.encode(prompt))
    bos = getattr(model, "bos_id", None)
    if ids and bos is not None and ids[0] == bos and not getattr(model, "prompt", ()):
        return ids[1:]
    return ids
