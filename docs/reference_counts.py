"""Exact counts and thresholds, measured against the reference library (docs/porting.md).

    python3 docs/reference_counts.py      # needs the bench extra: mixle==0.8.2

On random bigram models small enough to list every sequence's score, compare each library's
``SeekIndex.threshold(rank)`` with the true rank-th largest log-prob, and ``SeekIndex.count(t)``
with the true number of sequences scoring >= t (t set midway between two distinct scores).
"""

from __future__ import annotations

import itertools

import numpy as np
from mixle.enumeration import AutoregressiveEnumerable
from mixle.enumeration import SeekIndex as ReferenceSeekIndex

from jaxrescore import CallableModel, SeekIndex

V, L, MODELS = 5, 4, 20
RANKS = (1, 3, 10, 30, 100)
CUTS = (5, 20, 60, 120, 199)  # thresholds between the scores ranked i+1 and i+2
TOL = 1e-5  # float32 tables (ours) against float64 sums


def bigram(logits):
    def next_logprobs(prefix):
        row = logits[prefix[-1] if prefix else 0]
        return np.arange(V), row - np.logaddexp.reduce(row)

    return next_logprobs


def main() -> None:
    wrong = {"reference": [0, 0], "jaxrescore": [0, 0]}
    n_ranks = n_counts = 0
    for seed in range(MODELS):
        fn = bigram(1.5 * np.random.default_rng(seed).normal(size=(V, V)))
        indexes = {
            "reference": ReferenceSeekIndex(AutoregressiveEnumerable(fn, max_len=L)),
            "jaxrescore": SeekIndex(CallableModel(fn, vocab_size=V, max_len=L), progress=False),
        }
        support = itertools.product(range(V), repeat=L)
        scores = np.sort([sum(fn(s[:j])[1][s[j]] for j in range(L)) for s in support])[::-1]
        for rank in RANKS:
            n_ranks += 1
            for name, index in indexes.items():
                wrong[name][0] += abs(index.threshold(rank) - scores[rank - 1]) > TOL
        for i in CUTS:
            if scores[i] - scores[i + 1] <= 1e-4:
                continue  # too close to call in float32
            t = float(scores[i] + scores[i + 1]) / 2
            n_counts += 1
            for name, index in indexes.items():
                wrong[name][1] += int(index.count(t)) != i + 1
    for name, (thresholds, counts) in wrong.items():
        print(f"{name:>10}: threshold wrong for {thresholds} of {n_ranks} ranks, "
              f"count wrong for {counts} of {n_counts} thresholds")


if __name__ == "__main__":
    main()
