"""The AutoregressiveEnumerable protocol: what a draft index and the rescoring layer need of a model.

A model assigns every token sequence a log-probability that factorises over next-token steps.
``eos is None`` means fixed length: the support is every sequence of exactly ``max_len`` tokens.
Otherwise the model terminates: the support is every sequence that ends with ``eos`` (the EOS
step counted in its score) with at most ``max_len`` tokens, EOS included.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np


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

    def score_sequences(self, seqs) -> np.ndarray:
        """Log-probs ``float[N]`` of whole sequences: one teacher-forcing forward, EOS step
        included, padding masked. ``seqs`` is a SequenceBatch or a list of token sequences."""
        ...
