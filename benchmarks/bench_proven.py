"""Proven top-k on the names models: the speculative exact search against the ways to get the same
answer without a draft, and against the spec's gap-certified query.

Methods, all on the shipped character transformer (target) and the character 6-gram (draft):

* ``prove``: ``RescoredIndex(SeekIndex(draft), target, rerank_window=W).top_k(k, prove=True)``;
* ``best-first``: exact batched best-first search over the target, ``batch`` prefixes per call
  (``jaxrescore.index.best_first``; prefix forwards re-run the whole prefix: no KV cache yet);
* ``certified``: the gap-certified query grown until certified, with the demo's estimated gap.

Columns: sequential target calls, target rows (sequences teacher-forced, or prefixes expanded),
target token positions (what the forwards actually compute: a teacher-forced sequence of n tokens
is n + 1 positions with BOS; a prefix of n tokens is n + 1 positions without a KV cache and 1 with
one), whether the answer is proven / certified and equals best-first's, and the wall time (median
of ``--repeats`` runs after one warm-up, compiles excluded).

    python3 benchmarks/bench_proven.py [--repeats 3] [--windows 0,8,16,32,64]

``--windows`` adds the proof's cost against its first rerank window (top-25), which chose the
demo's default window.
"""

from __future__ import annotations

import argparse
import statistics
import time

from jaxrescore import RescoredIndex, SeekIndex
from jaxrescore.data.names import encode, load_names
from jaxrescore.demo import GAP_MARGIN, fit_draft, load_target
from jaxrescore.index.best_first import best_first_top_k
from jaxrescore.models import estimate_top_gap


class Counting:
    """Delegates to a model, counting the rows and token positions its forwards compute: a row of
    n tokens (after the prompt) costs len(prompt) + n + 1 positions (BOS included, no KV cache)."""

    def __init__(self, model):
        self.model = model
        self.vocab_size, self.eos, self.max_len = model.vocab_size, model.eos, model.max_len
        self.score_tolerance = getattr(model, "score_tolerance", None)
        self.extra = len(getattr(model, "prompt", ())) + 1
        self.rows = self.positions = 0

    def _count(self, lengths):
        self.rows += len(lengths)
        self.positions += int(sum(int(n) + self.extra for n in lengths))

    def next_logprobs(self, prefixes, lengths):
        self._count(lengths)
        return self.model.next_logprobs(prefixes, lengths)

    def score_frontier(self, seqs, **kw):
        self._count([len(s) for s in seqs])
        return self.model.score_frontier(seqs, **kw)

    def score_sequences(self, seqs, **kw):
        self._count([len(s) for s in seqs])
        return self.model.score_sequences(seqs, **kw)


def timed(fn, repeats):
    fn()  # warm-up: compiles every shape the run needs
    times, out = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return out, statistics.median(times)


def run(k, prefix, window, repeats):
    """Rows ``(method, calls, rows, positions, verdict, seconds, answer)`` for one query."""
    target, draft = load_target(), fit_draft()
    if prefix:
        p = encode(prefix, eos=False)
        target, draft = target.with_prompt(p), draft.with_prompt(p)
    index = SeekIndex(draft, progress=False).ensure_count(20000)  # the draft's cost is paid once
    rows = []

    def prove():
        counted = Counting(target)
        ri = RescoredIndex(index, counted, rerank_window=window, draft_model=draft)
        return ri.top_k(k, prove=True), ri, counted

    (r, ri, counted), t = timed(prove, repeats)
    rows.append((f"prove (window {window})", ri.target_calls, counted.rows, counted.positions, r.proven, t,
                 [s for s, _ in r.items]))
    for batch in (k, 4 * k):
        def best_first():
            counted = Counting(target)
            return best_first_top_k(counted, k, batch=batch), counted

        (found, counted), t = timed(best_first, repeats)
        rows.append((f"best-first (batch {batch})", found.calls, counted.rows, counted.positions, True, t,
                     [s for s, _ in found.items]))
    common = [encode(n[len(prefix):]) for n, _ in load_names() if n.startswith(prefix)][:4096]
    gap = estimate_top_gap(draft, target, k, common).excess + GAP_MARGIN

    def certify():
        counted = Counting(target)
        rc = RescoredIndex(index, counted, rerank_window=64, assumed_gap=gap)
        return rc.top_k(k, until_certified=True), rc, counted

    (c, rc, counted), t = timed(certify, repeats)
    rows.append((f"certified (gap {gap:.2f})", rc.target_calls, counted.rows, counted.positions, c.certified, t,
                 [s for s, _ in c.items]))
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--windows", default="", help="comma-separated windows for the window sweep")
    args = ap.parse_args()
    if args.windows:
        window_sweep([int(w) for w in args.windows.split(",")])
    print("| query | method | target calls | target rows | token positions | verdict | = best-first | time |")
    print("|---|---|---:|---:|---:|---|---|---:|")
    for k, prefix, window in ((25, "", 32), (100, "", 32), (25, "ma", 32)):
        rows = run(k, prefix, window, args.repeats)
        reference = rows[1][6]
        label = f"top-{k}" + (f" of '{prefix}...'" if prefix else "")
        for name, calls, n, positions, verdict, t, answer in rows:
            print(f"| {label} | {name} | {calls} | {n} | {positions} | {verdict} | {answer == reference} | {t * 1e3:.0f} ms |")


def window_sweep(windows, k=25):
    target, draft = load_target(), fit_draft()
    index = SeekIndex(draft, progress=False).ensure_count(20000)
    print(f"| first window | target calls | target sequences (top-{k}, prove=True) |")
    print("|---:|---:|---:|")
    for w in windows:
        ri = RescoredIndex(index, target, rerank_window=w)
        assert ri.top_k(k, prove=True).proven
        print(f"| {w} | {ri.target_calls} | {ri.target_sequences} |")
    print()


if __name__ == "__main__":
    main()
