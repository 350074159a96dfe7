"""Tiny models whose whole support can be listed, and brute-force draft indexes over them.

These are test oracles for the rescoring layer: they are written for obviousness, not speed.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from jaxrescore.quantize import Quantizer


def _log_softmax(x):
    x = x - x.max()
    return x - np.log(np.exp(x).sum())


class TableModel:
    """A random autoregressive model over ``vocab`` tokens; ``eos`` set = terminating.

    ``steps[prefix]`` is the float64 next-token log-prob row after ``prefix``.
    """

    def __init__(self, vocab, max_len, seed, *, eos=None, temperature=1.5, base=None, noise=0.0):
        rng = np.random.default_rng(seed)
        self.vocab_size, self.max_len, self.eos = vocab, max_len, eos
        self.steps = {}
        for prefix in self._prefixes():
            if base is not None:
                logits = base.steps[prefix] + noise * rng.standard_normal(vocab)
            else:
                logits = temperature * rng.standard_normal(vocab)
            self.steps[prefix] = _log_softmax(logits)

    def _prefixes(self):
        for n in range(self.max_len):
            for p in itertools.product(range(self.vocab_size), repeat=n):
                if self.eos is None or self.eos not in p:
                    yield p

    def support(self):
        """Every in-support sequence with its per-step log-probs."""
        if self.eos is None:
            return list(itertools.product(range(self.vocab_size), repeat=self.max_len))
        body_tokens = [t for t in range(self.vocab_size) if t != self.eos]
        return [
            body + (self.eos,)
            for n in range(1, self.max_len + 1)
            for body in itertools.product(body_tokens, repeat=n - 1)
        ]

    def step_lps(self, seq):
        return np.array([self.steps[seq[:i]][t] for i, t in enumerate(seq)])

    def log_prob(self, seq):
        seq = tuple(seq)
        if self.eos is None and len(seq) != self.max_len:
            return -math.inf
        if self.eos is not None and (not seq or seq[-1] != self.eos or self.eos in seq[:-1] or len(seq) > self.max_len):
            return -math.inf
        return float(np.minimum(self.step_lps(seq), 0.0).sum())

    def __call__(self, seqs):
        return [self.log_prob(s) for s in seqs]


class BruteIndex:
    """A draft index over a :class:`TableModel`: structural-bucket order, ties lexicographic.

    ``budget_bits`` truncates (only buckets within the budget are indexed, ``truncated`` reports
    it). ``bucket_bound`` is included only when ``with_bound``: without it the index has the
    reference library's shape (``quantizer``, ``truncated``, ``dropped_upper``, a ``model`` with
    ``max_len``). ``finite_only`` leaves out the sequences the model gives -inf.
    """

    def __init__(self, model, quantizer=None, *, budget_bits=None, with_bound=True, batch=True, finite_only=False):
        self.model = model
        self.quantizer = quantizer or Quantizer(1.0, 8)
        rows = []
        for seq in model.support():
            steps = np.minimum(model.step_lps(seq), 0.0)
            if finite_only and not np.isfinite(steps).all():
                continue  # an index lists what its model can produce: nothing of log-prob -inf
            bucket = int(self.quantizer.step_buckets(steps).sum())
            rows.append((bucket, seq, float(steps.sum())))
        rows.sort()
        self.budget = None if budget_bits is None else self.quantizer.budget(budget_bits)
        kept = [r for r in rows if self.budget is None or r[0] <= self.budget]
        self.truncated = len(kept) < len(rows)
        self.dropped_upper = 0
        self.rows = kept
        self.unrank_calls = 0
        if not with_bound:
            self.bucket_bound = None
        if not batch:
            self.unrank_batch = None

    def __len__(self):
        return len(self.rows)

    def unrank(self, i):
        self.unrank_calls += 1
        if i >= len(self.rows):
            raise IndexError(i)
        _, seq, lp = self.rows[i]
        return seq, lp

    def unrank_batch(self, ranks):
        self.unrank_calls += 1
        picked = [self.rows[int(r)] for r in ranks]
        return [r[1] for r in picked], np.array([r[2] for r in picked])

    def bucket_bound(self, n):
        fbs = [self.rows[n][0]] if n < len(self.rows) else []
        if self.truncated:
            fbs.append(self.budget + 1)
        if not fbs:
            return -math.inf
        return float(self.quantizer.edge(min(fbs), self.model.max_len))


def true_top_scores(target, support, start, k):
    """The target scores of target ranks ``[start, start + k)`` over the whole support."""
    scores = sorted(target(support), reverse=True)
    return scores[start : start + k]


def _diffs(draft, target, support):
    d, t = np.array(draft(support)), np.array(target(support))
    fin = np.isfinite(d) & np.isfinite(t)
    return (t - d)[fin]


def true_gap(draft, target, support):
    """max |target - draft| over the support."""
    return float(np.abs(_diffs(draft, target, support)).max())


def true_excess(draft, target, support):
    """max(target - draft, 0) over the support: the one-sided gap the certificate needs."""
    return float(max(_diffs(draft, target, support).max(), 0.0))


def as_model(table: TableModel, *, batched: bool = False, form: str = "exact"):
    """A :class:`TableModel` as a real model of the library (a CallableModel over its rows), so it
    has ``next_logprobs`` and ``score_frontier``; ``batched`` picks the batched form.

    ``form`` (per-prefix only) picks how the vocabulary is declared: ``"exact"`` (``vocab_size``
    is the table's), ``"wide"`` (``vocab_size`` one larger, the extra token given no mass) or
    ``"inferred"`` (no ``vocab_size``: the reference library's form; each table lists only its
    finite entries). A prefix the table does not hold (one that already left the support, e.g.
    through a token outside the table's vocabulary) gets a uniform row."""
    from jaxrescore.models.callable import CallableModel

    if form != "exact" and not batched:
        def sparse(prefix):
            row = table.steps.get(tuple(prefix))
            if row is None:
                row = np.full(table.vocab_size, -math.log(table.vocab_size))
            keep = np.flatnonzero(np.isfinite(row)) if form == "inferred" else np.arange(table.vocab_size)
            return keep, row[keep].astype(np.float32)

        vocab = None if form == "inferred" else table.vocab_size + 1
        return CallableModel(sparse, vocab_size=vocab, max_len=table.max_len, eos=table.eos)
    if not batched:
        def fn(prefix):
            row = table.steps.get(tuple(prefix))
            if row is None:  # a prefix that left the support (see above)
                row = np.full(table.vocab_size, -math.log(table.vocab_size))
            return np.arange(table.vocab_size), row.astype(np.float32)
    else:
        def fn(prefixes, lengths):
            rows = np.empty((len(lengths), table.vocab_size), np.float32)
            for b, n in enumerate(lengths):
                p = tuple(int(x) for x in prefixes[b, :n])
                rows[b] = table.steps[p] if p in table.steps else table.steps[()]
            return rows
    return CallableModel(fn, vocab_size=table.vocab_size, max_len=table.max_len, eos=table.eos, batched=batched)


def reversed_pair(table: TableModel, seed: int) -> TableModel:
    """An adversarial draft for ``table``: every next-token preference reversed."""
    out = TableModel(table.vocab_size, table.max_len, seed, eos=table.eos)
    for p, row in table.steps.items():
        x = -row
        out.steps[p] = x - np.logaddexp.reduce(x)
    return out


def keep_only_exits(monkeypatch, keep) -> None:
    """Make the host frontier UNSOUND on purpose: its bound counts only the exits ``keep(exits,
    structure) -> bool[E]`` keeps (a mutation the battery must catch)."""
    from jaxrescore.rescore import frontier as frontier_mod

    real_values, real_list = frontier_mod.frontier_values, frontier_mod.exit_list

    def listed(values, structure, floor=-np.inf, **options):
        ex = real_list(values, structure, floor, **options)
        return type(ex)(*(a[keep(ex, structure)] for a in ex))

    def mutated(s, valid, vocab, eos, max_len, ops=frontier_mod._NP):
        bound, moved, values = real_values(s, valid, vocab, eos, max_len, ops)
        structure = frontier_mod.Structure(None if vocab < 0 else vocab, None if eos < 0 else eos, max_len)
        return listed(values, structure).value.max(initial=-np.inf), moved, values

    monkeypatch.setattr(frontier_mod, "frontier_values", mutated)
    monkeypatch.setattr(frontier_mod, "exit_list", listed)
