"""The AutoregressiveEnumerable protocol: what a draft index and the rescoring layer need of a model.

A model assigns every token sequence a log-probability that factorises over next-token steps.
``eos is None`` means fixed length: the support is every sequence of exactly ``max_len`` tokens.
Otherwise the model terminates: the support is every sequence that ends with ``eos`` (the EOS
step counted in its score) with at most ``max_len`` tokens, EOS included.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol, Sequence, runtime_checkable

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


class Structure(NamedTuple):
    """A model's support as plain values: ``vocab_size`` (None: not known, e.g. inferred and still
    growing), ``eos`` (None = fixed length) and ``max_len`` (see the module docstring)."""

    vocab_size: int | None
    eos: int | None
    max_len: int


def check_support(vocab_size, eos, max_len, what: str = "model") -> tuple[int, int | None, int]:
    """The protocol attributes ``(vocab_size, eos, max_len)`` checked: ``vocab_size`` and
    ``max_len`` integers >= 1, ``eos`` None or an integer in ``[0, vocab_size)``; a ValueError
    naming ``what.<attribute>`` otherwise."""
    v = check_int(vocab_size, f"{what}.vocab_size", minimum=1)
    e = check_int(eos, f"{what}.eos", minimum=0, maximum=v, allow_none=True)
    n = check_int(max_len, f"{what}.max_len", minimum=1)
    return v, e, n
