"""The proof's assumptions about the target that its numbers can show broken, checked at query
time (:mod:`jaxrescore.rescore.frontier` lists every assumption a verdict makes): a support
structure that cannot be, a step or named log-prob above 0 or NaN, a named token outside the
vocabulary. A search's scored set checks each block of rows once, as it adds it (rows never
change); :func:`~jaxrescore.rescore.frontier.frontier` checks the structure every time and the
rows unless told they were checked. Also the per-position largest named log-prob that these
checks and the frontier both read.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxrescore.models.base import Structure

# the scored set's arrays, :class:`~jaxrescore.rescore.frontier.ScoredArrays` (which imports this
# module: named here only, never imported)
ScoredArrays = Any


def check_assumptions(s: ScoredArrays, structure: Structure) -> None:
    """Raise ValueError when the target's numbers break an assumption (see the module docstring)
    that can be seen in them: a step or a top-m log-prob above 0 or NaN, a top-m token id outside
    the vocabulary, an impossible support structure."""
    check_structure(structure)
    check_rows(s, structure)


def check_structure(structure: Structure) -> None:
    """Raise ValueError for an impossible support structure (see :func:`check_assumptions`)."""
    if not (isinstance(structure.max_len, (int, np.integer)) and structure.max_len >= 1):
        raise ValueError(f"the target's max_len must be an integer >= 1, got {structure.max_len!r}")
    vocab = structure.vocab_size
    if vocab is not None and vocab < 1:
        raise ValueError(f"the target's vocab_size must be >= 1 or unknown (None), got {vocab!r}")
    if structure.eos is not None and (structure.eos < 0 or vocab is not None and structure.eos >= vocab):
        raise ValueError(f"the target's eos={structure.eos} is not a token id in [0, {vocab})")


def check_rows(s: ScoredArrays, structure: Structure) -> None:
    """Raise ValueError when the rows of ``s`` break an assumption (see :func:`check_assumptions`;
    the structure itself is :func:`check_structure`'s)."""
    vocab = structure.vocab_size
    width = s.tokens.shape[1]
    real = np.arange(width)[None, :] < s.lengths[:, None]  # positions with a distribution
    # the [N, L, m] top-m arrays are reduced per position first (no masked copies of them):
    # their max is NaN where any is, and above 0 where any is
    top_lps = s.top_lps[:, :width]
    top_hi = top_max_of(s, np)[:, :width] if top_lps.shape[2] else np.zeros(real.shape)
    for name, arr in (("step", s.steps[:, :width]), ("top-m", top_hi), ("eos", s.eos_lps[:, :width])):
        if not np.all(np.where(real, arr <= 0.0, True)):  # NaN fails this too
            raise ValueError(
                f"the target's forward returned a {name} log-prob that is NaN or above 0 (after "
                "clipping): it breaks the proof's assumption that every step costs >= 0 nats"
            )
    if vocab is not None and s.top_ids.size:
        ids = s.top_ids[:, :width]
        outside = ((ids < 0) | (ids >= vocab)) & real[:, :, None]
        r, c, j = np.nonzero(outside) if outside.any() else (np.zeros(0, np.int64),) * 3
        named = np.isfinite(top_lps[r, c, j])  # padding among them (-inf): only named ones count
        if named.any():
            raise ValueError(
                f"the target's forward named token {int(ids[r, c, j][named][0])} among a position's "
                f"top-m, outside its vocabulary [0, {vocab})"
            )


def position_top_max(top_lps: np.ndarray) -> np.ndarray:
    """float32[N, L]: the largest named log-prob at each position of ``top_lps: float32[N, L,
    m]`` (NaN where any is; ``-inf`` for ``m = 0``), what
    :attr:`~jaxrescore.rescore.frontier.ScoredArrays.top_max` holds."""
    if top_lps.shape[2] == 0:
        return np.full(top_lps.shape[:2], -np.inf, np.float32)
    return np.max(top_lps, axis=2)


def top_max_of(s: ScoredArrays, xp=np):
    """``s.top_max``, or the same reduced from ``s.top_lps`` where ``s`` keeps none."""
    return xp.max(s.top_lps, axis=2) if s.top_max is None else s.top_max
