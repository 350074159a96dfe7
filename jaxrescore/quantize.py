"""Quantizer: per-step fine buckets and their sound best-case edges.

A draft index orders sequences by *fine bucket*, the sum of per-step buckets

    sb(lp) = floor(max(0, -lp / ln 2) * scale + TOL),   scale = oversample / bin_width_bits,

so its order is exact only up to one bucket. What a certificate may rely on is the bucket's
*best-case edge*: from ``floor(x + TOL) <= x + TOL`` every sequence of at most ``n`` steps whose
fine bucket is ``FB`` or deeper has

    log_prob <= -(FB - n * TOL) / scale * ln 2.

That edge is looser than the score of any sequence in the bucket, never tighter. All arithmetic
here is float64/int64 on the host: the index sums the very values returned by :meth:`step_buckets`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

LN2 = math.log(2.0)
# Absorbs float noise so that a step of exactly k/scale bits lands in bucket k, not k-1.
TOL = 1e-9


@dataclass(frozen=True)
class Quantizer:
    """Fine-bucket quantizer of log-probabilities.

    Args:
      bin_width_bits: width of one coarse bin in bits; finite and > 0.
      oversample: fine buckets per coarse bin; an integer >= 1.
    """

    bin_width_bits: float = 1.0
    oversample: int = 8

    def __post_init__(self):
        bw = self.bin_width_bits
        if isinstance(bw, bool) or not isinstance(bw, (int, float, np.integer, np.floating)):
            raise TypeError(f"bin_width_bits must be a positive finite number, got {bw!r}")
        if not (math.isfinite(float(bw)) and float(bw) > 0):
            raise ValueError(f"bin_width_bits must be a positive finite number, got {bw!r}")
        ov = self.oversample
        if isinstance(ov, bool) or not isinstance(ov, (int, np.integer)) or ov < 1:
            raise ValueError(f"oversample must be an integer >= 1, got {ov!r}")
        object.__setattr__(self, "bin_width_bits", float(bw))
        object.__setattr__(self, "oversample", int(ov))

    @property
    def scale(self) -> float:
        """Fine buckets per bit."""
        return self.oversample / self.bin_width_bits

    def step_buckets(self, log_probs) -> np.ndarray:
        """Per-step fine buckets: ``int64[...]`` from log-probs ``float[...]``.

        Positive log-probs (float noise) count as 0; ``-inf`` maps to a huge sentinel bucket so it
        never fits a finite budget.
        """
        lp = np.asarray(log_probs, dtype=np.float64)
        bits = np.maximum(0.0, -lp / LN2)
        with np.errstate(invalid="ignore", over="ignore"):
            raw = np.floor(bits * self.scale + TOL)
        return np.where(np.isfinite(raw), raw, np.iinfo(np.int64).max // 4).astype(np.int64)

    def fine_bucket(self, log_prob) -> np.ndarray:
        """The bucket of a total log-prob taken as ONE step: ``int64[...]``.

        A sum of ``n`` per-step floors is at least ``fine_bucket(total) - (n - 1)``, which is what a
        conservative bound over a foreign index uses.
        """
        return self.step_buckets(log_prob)

    def edge(self, fine_bucket, max_steps) -> np.ndarray:
        """Best-case edge ``float64[...]``: an upper bound on the log-prob of every sequence of at
        most ``max_steps`` steps whose fine bucket is ``fine_bucket`` or deeper. Never above 0."""
        fb = np.asarray(fine_bucket, dtype=np.float64)
        n = np.asarray(max_steps, dtype=np.float64)
        return np.minimum(0.0, -(fb - n * TOL) / self.scale * LN2)

    def budget(self, bits: float) -> int:
        """The deepest fine bucket inside a budget of ``bits`` bits."""
        return int(math.floor(float(bits) * self.scale + TOL))
