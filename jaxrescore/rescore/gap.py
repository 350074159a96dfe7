"""estimate_gap: the observed draft/target score gap, to choose an ``assumed_gap``.

This is an ESTIMATE from a finite sample, never a proof: a certificate that uses an
``assumed_gap`` is only as good as the assumption, and a sequence outside the sample can have a
larger gap. Pick ``assumed_gap`` with a margin above ``max_gap``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from jaxrescore._checks import check_int
from jaxrescore.models.base import AutoregressiveEnumerable
from jaxrescore.models.checked import checked_model
from jaxrescore.models.generate import sample_sequences
from jaxrescore.sequences import as_sequence_batch
from jaxrescore.typing import Sequences


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


def estimate_gap(
    draft: AutoregressiveEnumerable,
    target: AutoregressiveEnumerable,
    sequences: Sequences | None = None,
    *,
    n: int = 256,
    seed: int = 0,
) -> GapEstimate:
    """Measure ``|target - draft|`` sequence scores on ``sequences``, or on ``n`` sequences
    sampled ancestrally from ``target`` (see :func:`~jaxrescore.models.generate.sample_sequences`).

    Args:
      draft, target: models of the protocol with the same ``vocab_size`` and ``eos``.
      sequences: optional SequenceBatch or list of token sequences in both supports.
      n, seed: sample size and seed when ``sequences`` is None.
    """
    draft, target = checked_model(draft, "draft"), checked_model(target, "target")
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


class TopGapEstimate(NamedTuple):
    """The observed draft/target gap where a top-k answer can come from — an estimate, not a bound.

    Attributes:
      excess: max observed ``target - draft`` (nats, floored at 0) over the region: the one side of
        the gap a certificate relies on (a draft over-rating junk does no harm).
      two_sided: max observed ``|target - draft|`` over the region.
      region_lp: the lowest target log-prob the region covers: the ``k``-th best measured target
        score minus ``region_margin``.
      n_region: distinct sequences measured inside the region.
      n_distinct: distinct sequences the target scored (candidates and samples together): the
        estimate's one-off cost, and how much it saw.
      n_samples, n_candidates: ancestral samples drawn from the target, candidates given.
    """

    excess: float
    two_sided: float
    region_lp: float
    n_region: int
    n_distinct: int
    n_samples: int
    n_candidates: int


def estimate_top_gap(
    draft: AutoregressiveEnumerable,
    target: AutoregressiveEnumerable,
    k: int,
    candidates: Sequences = (),
    *,
    n_samples: int = 1024,
    region_margin: float = 1.0,
    seed: int = 0,
) -> TopGapEstimate:
    """The one-sided gap ``target - draft`` observed on the sequences a top-``k`` answer can come from.

    Why only there: the certificate needs ``target(u) - draft(u) <= assumed_gap`` only for
    sequences ``u`` rated at least as high as the worst returned item, whose log-prob is at least
    ``t_k``, the ``k``-th best target score among the measured sequences. So this measures the gap
    on the measured sequences with target log-prob ``>= t_k - region_margin``, drawn from
    ``candidates`` (e.g. a corpus's commonest sequences) and ``n_samples`` ancestral samples from
    the target. A finite sample: an ESTIMATE, never a bound (``RescoredIndex.top_k(k,
    prove=True)`` needs no gap at all).

    Args:
      draft, target: models with the same ``vocab_size`` and ``eos``.
      k: the answer size the gap is for, an integer >= 1.
      candidates: token sequences in both supports (may be empty).
      n_samples: target samples, an integer >= 1.
      region_margin: nats below ``t_k`` the region reaches, finite and >= 0.
      seed: sampling seed.
    """
    draft, target = checked_model(draft, "draft"), checked_model(target, "target")
    if draft.vocab_size != target.vocab_size or draft.eos != target.eos:
        raise ValueError(
            f"draft (vocab_size={draft.vocab_size}, eos={draft.eos}) and target "
            f"(vocab_size={target.vocab_size}, eos={target.eos}) must share vocab_size and eos"
        )
    k, n_samples = check_int(k, "k", minimum=1), check_int(n_samples, "n_samples", minimum=1)
    if isinstance(region_margin, bool) or not (
        isinstance(region_margin, (int, float)) and np.isfinite(region_margin) and region_margin >= 0
    ):
        raise ValueError(f"region_margin must be a finite number >= 0 (nats), got {region_margin!r}")
    candidates = list(candidates)
    candidates = as_sequence_batch(candidates).to_tuples() if candidates else []
    samples = sample_sequences(target, n_samples, seed=seed).to_tuples()
    seqs = sorted(set(candidates) | set(samples))
    t = np.asarray(target.score_sequences(seqs), np.float64)
    d = np.asarray(draft.score_sequences(seqs), np.float64)
    finite = np.isfinite(t)
    region = float(np.sort(t[finite])[::-1][min(k, int(finite.sum())) - 1]) - region_margin
    keep = finite & (t >= region)
    diff = np.where(np.isfinite(d[keep]), t[keep] - d[keep], np.inf)
    return TopGapEstimate(
        excess=float(max(diff.max(initial=0.0), 0.0)),
        two_sided=float(np.abs(diff).max(initial=0.0)),
        region_lp=region,
        n_region=int(keep.sum()),
        n_distinct=len(seqs),
        n_samples=int(n_samples),
        n_candidates=len(set(candidates)),
    )
