"""Calibration of :class:`~jaxrescore.index.envelope.AREnvelopeIndex`: the per-depth envelope.

Per depth ``d``, the fine-bucket histograms of the next-token rows of typical length-``d`` contexts
are averaged into one envelope (continuing tokens and eos apart); depth 0 is the real root row.
Contexts are ancestral samples conditioned on not stopping (a context must reach depth ``d``;
identical contexts are forwarded once and weighted by how often they were drawn), or the prefixes of
a corpus. Every depth is one batched forward over its distinct contexts.
"""

from __future__ import annotations

import numpy as np
from tqdm.auto import tqdm

from jaxrescore.index.envelope.descent import step_buckets

CHECK_ROWS = 32  # calibration rows kept for the file's load check (jaxrescore.index.envelope.io)
PROGRESS_DELAY_S = 1.0  # seconds a calibration runs before its progress bar appears (progress=None)


class EnvelopeCalibration:
    """Mixin: builds ``_body``, ``_eosh`` (float64[L, M]), ``_n_body``, ``_n_eos`` (float64[L]),
    ``_root_row`` and ``_checks`` on an AREnvelopeIndex (uses its ``_fetch``)."""

    def _corpus_arg(self, seqs) -> list[tuple[int, ...]]:
        try:
            out = [tuple(int(t) for t in s) for s in seqs]
        except (TypeError, ValueError):
            raise ValueError("calibration_sequences must be a list of token-id sequences") from None
        if not out:
            raise ValueError("calibration_sequences must not be empty")
        for s in out:
            if not 1 <= len(s) <= self.max_len or min(s) < 0 or max(s) >= self.vocab_size:
                raise ValueError(
                    f"calibration_sequences must hold 1..{self.max_len} token ids in [0, {self.vocab_size}), "
                    f"got {s}"
                )
        return out

    def _calibrate(self, corpus) -> None:
        """Envelope per depth: ``_body[d]`` (continuing tokens) and ``_eosh[d]`` (eos), float64[M]
        bucket histograms averaged over the contexts; ``_n_body``/``_n_eos``: their average sizes."""
        L, M = self.max_len, self._M
        self._body, self._eosh = np.zeros((L, M)), np.zeros((L, M))
        self._n_body, self._n_eos = np.zeros(L), np.zeros(L)
        self._checks: list[tuple[np.ndarray, np.ndarray]] = []
        with tqdm(unit="rows", desc="AREnvelopeIndex calibration", disable=self.progress is False,
                  delay=0 if self.progress else PROGRESS_DELAY_S, leave=False) as bar:
            root = self._fetch(np.zeros((1, 0), np.int32), np.zeros(1, np.int32), bar)
            self._root_row = root[0]
            self._accumulate(0, np.zeros((1, 0), np.int32), root, np.ones(1))
            if corpus is not None:
                self._calibrate_corpus(corpus, bar)
            else:
                self._calibrate_samples(root, bar)

    def _calibrate_samples(self, root: np.ndarray, bar) -> None:
        rng = np.random.default_rng(self.seed)
        n = self.n_paths
        paths = np.zeros((n, self.max_len), np.int32)
        rows, inv = root, np.zeros(n, np.int64)
        for d in range(1, self.max_len):
            p = np.exp(rows[inv].astype(np.float64))
            if self.eos is not None:
                p[:, self.eos] = 0.0  # a context must reach depth d: sample it given no stop
            cdf = np.cumsum(p, axis=1)
            alive = cdf[:, -1] > 0
            if not alive.any():
                return  # no context continues: deeper envelopes stay empty
            tok = (cdf < (rng.random(n) * cdf[:, -1])[:, None]).sum(axis=1)
            tok = np.minimum(tok, p.shape[1] - 1)
            stuck = np.flatnonzero(~alive)  # a context with no continuation: restart from a live one
            src = np.flatnonzero(alive)[rng.integers(0, alive.sum(), stuck.size)]
            paths[stuck], tok[stuck] = paths[src], tok[src]
            paths[:, d - 1] = tok
            uniq, inv, counts = np.unique(paths[:, :d], axis=0, return_inverse=True, return_counts=True)
            inv = inv.reshape(-1)
            rows = self._fetch(uniq, np.full(uniq.shape[0], d, np.int32), bar)
            self._accumulate(d, uniq, rows, counts)

    def _calibrate_corpus(self, corpus, bar) -> None:
        for d in range(1, self.max_len):
            ctx = [s[:d] for s in corpus if len(s) >= d and (self.eos is None or self.eos not in s[:d])]
            if not ctx:  # no sequence reaches depth d: reuse the envelope above
                self._body[d], self._eosh[d] = self._body[d - 1], self._eosh[d - 1]
                self._n_body[d], self._n_eos[d] = self._n_body[d - 1], self._n_eos[d - 1]
                continue
            uniq, counts = np.unique(np.array(ctx, np.int32).reshape(len(ctx), d), axis=0, return_counts=True)
            self._accumulate(d, uniq, self._fetch(uniq, np.full(uniq.shape[0], d, np.int32), bar), counts)

    def _accumulate(self, d: int, prefixes: np.ndarray, rows: np.ndarray, counts: np.ndarray) -> None:
        """Depth ``d``'s envelope from the rows float32[u, V] of ``u`` distinct contexts seen
        ``counts`` times each (integer weights, divided once: identical rows average exactly)."""
        M, total = self._M, float(counts.sum())
        finite = np.isfinite(rows)
        is_eos = np.zeros(rows.shape[1], bool)
        if self.eos is not None and self.eos < rows.shape[1]:
            is_eos[self.eos] = True
        sb = np.minimum(step_buckets(self.quantizer, np.where(finite, rows, 0.0).astype(np.float64)), M)
        w = np.broadcast_to(counts.astype(np.float64)[:, None], rows.shape)
        for mask, hist, size in ((finite & ~is_eos, self._body, self._n_body), (finite & is_eos, self._eosh, self._n_eos)):
            hist[d] = np.bincount(sb[mask], weights=w[mask], minlength=M + 1)[:M] / total
            size[d] = float(w[mask].sum()) / total
        per_depth = max(1, CHECK_ROWS // self.max_len)
        for i in range(min(per_depth, rows.shape[0])):
            self._checks.append((prefixes[i].astype(np.int32), rows[i]))
