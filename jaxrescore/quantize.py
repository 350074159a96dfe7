"""Quantizer: per-step fine buckets and their sound best-case edges.

A draft index orders sequences by *fine bucket*, the sum of per-step buckets

    sb(lp) = floor(min(max(0, -lp / ln 2), MAX_STEP_BITS) * scale + TOL),
    scale = oversample / bin_width_bits,

so its order is exact only up to one bucket. What a certificate may rely on is the bucket's
*best-case edge*: from ``sb(lp) <= -lp / ln 2 * scale + TOL`` every sequence of at most ``n`` steps
whose fine bucket is ``FB`` or deeper has

    log_prob <= -(FB - n * TOL) / scale * ln 2.

That edge is looser than the score of any sequence in the bucket, never tighter.

Range. Buckets are int64, so every value is kept far from overflow:

* a finite step deeper than ``MAX_STEP_BITS`` bits (a logit mask such as ``-1e30`` or the float32
  minimum) *saturates* at the bucket of ``MAX_STEP_BITS``. That only lowers its bucket, which
  loosens the edge above, so the bound stays sound; an index whose budget never reaches that
  bucket (``budget`` accepts at most ``MAX_BUDGET_BITS = MAX_STEP_BITS / 2``) never holds such a
  step and keeps reporting it as cut (truncated), however improbable;
* ``-inf`` (probability 0) maps to ``NO_BUCKET``, which no finite step reaches;
* ``scale`` lies in ``[MIN_SCALE, MAX_SCALE]``, so a step bucket is at most ``2**50`` and a budget
  at most ``2**49``: a bucket sum of one budget plus one step, or of up to 2**12 saturated steps,
  stays below ``NO_BUCKET`` (and far below ``2**63``).

All arithmetic here is float64/int64 on the host: the index sums the very values returned by
:meth:`Quantizer.step_buckets`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from jaxrescore._checks import check_float, check_int

LN2 = math.log(2.0)
# Absorbs float noise so that a step of exactly k/scale bits lands in bucket k, not k-1.
TOL = 1e-9
# Bucket of a step of probability 0 (-inf): above every finite step's bucket, small enough that a
# sum of a few of them does not overflow int64.
NO_BUCKET = int(np.iinfo(np.int64).max // 4)
# Finite steps deeper than this many bits saturate here (a sound, looser bucket; see the docstring).
MAX_STEP_BITS = float(2**30)
# The deepest bit budget :meth:`Quantizer.budget` accepts: a saturated step never fits it.
MAX_BUDGET_BITS = MAX_STEP_BITS / 2
# Fine buckets per bit allowed (oversample / bin_width_bits).
MIN_SCALE = 2.0**-20
MAX_SCALE = 2.0**20


@dataclass(frozen=True)
class Quantizer:
    """Fine-bucket quantizer of log-probabilities.

    Args:
      bin_width_bits: width of one coarse bin in bits; finite and > 0, and such that
        ``oversample / bin_width_bits`` lies in ``[MIN_SCALE, MAX_SCALE] = [2**-20, 2**20]``.
      oversample: fine buckets per coarse bin; an integer in ``[1, 2**20]``.
    """

    bin_width_bits: float = 1.0
    oversample: int = 8

    def __post_init__(self):
        bw = check_float(self.bin_width_bits, "bin_width_bits", minimum=0.0)
        ov = check_int(self.oversample, "oversample", minimum=1, maximum=2**20 + 1)
        # A zero width gives infinitely many buckets per bit: refused by the scale range below.
        scale = ov / bw if bw > 0 else math.inf
        if not MIN_SCALE <= scale <= MAX_SCALE:
            raise ValueError(
                f"bin_width_bits={bw!r} with oversample={ov} gives {scale:.3g} fine buckets per bit; "
                f"oversample / bin_width_bits must lie in [2**-20, 2**20], i.e. bin_width_bits in "
                f"[{ov / MAX_SCALE:.3g}, {ov / MIN_SCALE:.3g}] for this oversample"
            )
        object.__setattr__(self, "bin_width_bits", bw)
        object.__setattr__(self, "oversample", ov)

    @property
    def scale(self) -> float:
        """Fine buckets per bit."""
        return self.oversample / self.bin_width_bits

    @property
    def max_step_bucket(self) -> int:
        """The bucket every finite step of ``MAX_STEP_BITS`` bits or deeper saturates at."""
        return int(math.floor(MAX_STEP_BITS * self.scale + TOL))

    def step_buckets(self, log_probs: ArrayLike) -> np.ndarray:
        """Per-step fine buckets: ``int64[...]`` from log-probs ``float[...]``.

        Positive log-probs (float noise) count as 0; finite steps deeper than ``MAX_STEP_BITS``
        saturate at :attr:`max_step_bucket` (sound: a smaller bucket has a looser edge); ``-inf``
        maps to ``NO_BUCKET`` so it never fits a budget. NaN raises ValueError.
        """
        lp = np.asarray(log_probs, dtype=np.float64)
        if np.isnan(lp).any():
            raise ValueError("log_probs contain NaN: a step bucket needs a log-prob in [-inf, 0]")
        impossible = lp == -np.inf
        # clamp far below the saturation point first, so no division overflows (-1.7e308 / ln 2)
        deep = np.maximum(lp, -2.0 * MAX_STEP_BITS * LN2)
        bits = np.minimum(np.maximum(0.0, -deep / LN2), MAX_STEP_BITS)
        raw = np.floor(bits * self.scale + TOL).astype(np.int64)
        return np.where(impossible, np.int64(NO_BUCKET), raw)

    def fine_bucket(self, log_prob: ArrayLike) -> np.ndarray:
        """The bucket of a total log-prob taken as ONE step: ``int64[...]``.

        A sum of ``n`` per-step floors is at least ``fine_bucket(total) - (n - 1)``, which is what a
        conservative bound over a foreign index uses (saturation keeps that true: it only lowers
        the bucket of the total).
        """
        return self.step_buckets(log_prob)

    def edge(self, fine_bucket: ArrayLike, max_steps: ArrayLike) -> np.ndarray:
        """Best-case edge ``float64[...]``: an upper bound on the log-prob of every sequence of at
        most ``max_steps`` steps whose fine bucket is ``fine_bucket`` or deeper. Never above 0."""
        fb = np.asarray(fine_bucket, dtype=np.float64)
        n = np.asarray(max_steps, dtype=np.float64)
        return np.minimum(0.0, -(fb - n * TOL) / self.scale * LN2)

    def budget(self, bits: float) -> int:
        """The deepest fine bucket inside a budget of ``bits`` bits, for ``0 <= bits <=
        MAX_BUDGET_BITS`` (ValueError otherwise)."""
        bits = check_float(bits, "bits", minimum=0.0, maximum=MAX_BUDGET_BITS)
        return int(math.floor(bits * self.scale + TOL))
