"""estimate_gap: the observed draft/target score gap, to choose an ``assumed_gap``.

This is an ESTIMATE from a finite sample, never a proof: a certificate that uses an
``assumed_gap`` is only as good as the assumption, and a sequence outside the sample can have a
larger gap. Pick ``assumed_gap`` with a margin above ``max_gap``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from jaxrescore.models.sampling import sample_sequences
from jaxrescore.sequences import as_sequence_batch


class GapEstimate(NamedTuple):
    """Observed ``|target_lp - draft_lp|`` (nats) over a sample — an estimate, not a bound.

    Attributes:
      max_gap: the largest observed gap.
      mean_gap: the mean observed gap.
      n_sequences: how many sequences were compared.
    """

    max_gap: float
    mean_gap: float
    n_sequences: int


def estimate_gap(draft, target, sequences=None, *, n: int = 256, seed: int = 0) -> GapEstimate:
    """Measure ``|target - draft|`` sequence scores on ``sequences``, or on ``n`` sequences
    sampled ancestrally from ``target`` (see :func:`~jaxrescore.models.sampling.sample_sequences`).

    Args:
      draft, target: models of the protocol with the same ``vocab_size`` and ``eos``.
      sequences: optional SequenceBatch or list of token sequences in both supports.
      n, seed: sample size and seed when ``sequences`` is None.
    """
    if draft.vocab_size != target.vocab_size or draft.eos != target.eos:
        raise ValueError(
            f"draft (vocab_size={draft.vocab_size}, eos={draft.eos}) and target "
            f"(vocab_size={target.vocab_size}, eos={target.eos}) must share vocab_size and eos"
        )
    if sequences is None:
        if draft.max_len < target.max_len:
            raise ValueError(
                f"draft.max_len={draft.max_len} < target.max_len={target.max_len}: samples from "
                f"the target may not lie in the draft's support; pass sequences explicitly"
            )
        batch = sample_sequences(target, n, seed=seed)
    else:
        batch = as_sequence_batch(sequences)
        if batch.size == 0:
            raise ValueError("sequences is empty; the gap needs at least one sequence")
    gap = np.abs(target.score_sequences(batch) - draft.score_sequences(batch))
    return GapEstimate(float(gap.max()), float(gap.mean()), int(batch.size))
