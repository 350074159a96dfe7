"""The AutoregressiveEnumerable protocol: what a draft index and the rescoring layer need of a model.

A model assigns every token sequence a log-probability that factorises over next-token steps.
``eos is None`` means fixed length: the support is every sequence of exactly ``max_len`` tokens.
Otherwise the model terminates: the support is every sequence that ends with ``eos`` (the EOS
step counted in its score) with at most ``max_len`` tokens, EOS included.
"""

from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

import numpy as np

from jaxrescore._checks import check_int
from jaxrescore.sequences import SequenceBatch


@runtime_checkable
class AutoregressiveEnumerable(Protocol):
    """Structural protocol of an enumerable autoregressive model.

    Attributes:
      vocab_size: V, the number of token ids ``0..V-1``.
      eos: the end-of-sequence token id, or None for fixed-length models.
      max_len: the longest sequence in the support (EOS included).
    """

    vocab_size: int
    eos: int | None
    max_len: int

    def next_logprobs(self, prefixes: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """Next-token log-probs ``float32[B, V]`` (log-softmax rows) after each prefix.

        Args:
          prefixes: int32[B, T], row ``b`` holds a prefix in its first ``lengths[b]`` positions.
          lengths: int32[B].
        """
        ...

    def score_sequences(self, seqs: SequenceBatch | Sequence[Sequence[int]]) -> np.ndarray:
        """Log-probs ``float[N]`` of whole sequences: one teacher-forcing forward, EOS step
        included, padding masked. ``seqs`` is a SequenceBatch or a list of token sequences."""
        ...


def is_float_dtype(dtype) -> bool:
    """Whether ``dtype`` is a floating dtype: numpy's, or one of JAX's ``ml_dtypes`` (bfloat16,
    float8 variants), which numpy files under kind ``'V'``."""
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return True
    try:
        import ml_dtypes

        ml_dtypes.finfo(dtype)
    except (ImportError, ValueError, TypeError):
        return False
    return True


def check_support(vocab_size, eos, max_len, what: str = "model") -> tuple[int, int | None, int]:
    """The protocol attributes ``(vocab_size, eos, max_len)`` checked: ``vocab_size`` and
    ``max_len`` integers >= 1, ``eos`` None or an integer in ``[0, vocab_size)``; a ValueError
    naming ``what.<attribute>`` otherwise."""
    v = check_int(vocab_size, f"{what}.vocab_size", minimum=1)
    e = check_int(eos, f"{what}.eos", minimum=0, maximum=v, allow_none=True)
    n = check_int(max_len, f"{what}.max_len", minimum=1)
    return v, e, n


def check_weights(weights, n: int) -> np.ndarray:
    """``weights`` as float64[n]: finite, non-negative, not all zero (None: all ones)."""
    if weights is None:
        return np.ones(n)
    raw = np.asarray(weights)
    if raw.dtype.kind not in "iuf":
        raise ValueError(f"weights must be {n} finite non-negative numbers, got dtype {raw.dtype}")
    w = raw.astype(np.float64).reshape(-1)
    if w.shape != (n,) or not np.all(np.isfinite(w)) or w.min(initial=0) < 0 or w.sum() <= 0:
        raise ValueError(
            f"weights must be {n} finite non-negative numbers, not all zero; got shape {raw.shape}"
        )
    return w


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


def encode_text(text: str, vocabulary: tuple[str, ...], eos: int | None) -> tuple[int, ...]:
    """The inverse of :func:`decode_tokens` (``eos`` appended when the model has one): characters
    for a character vocabulary, else whitespace-separated token strings. ValueError naming the
    first unknown token."""
    index = {w: i for i, w in enumerate(vocabulary) if i != eos}
    parts = list(text) if is_character_vocabulary(vocabulary, eos) else text.split()
    unknown = [p for p in parts if p not in index]
    if unknown:
        raise ValueError(f"{text!r} has token {unknown[0]!r}, which is not in the model's vocabulary")
    return tuple(index[p] for p in parts) + (() if eos is None else (eos,))
