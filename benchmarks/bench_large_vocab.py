"""A GPT-2-sized vocabulary: sparse n-gram tables and a SeekIndex whose memory follows the sequences.

V = 50,257. The corpus is generated deterministically (no download): sentences of geometric
length (mean 18 tokens, at most 60, then EOS) over Zipf-distributed token ids (exponent 1.1), where
each token prefers 8 successors of its own (60% of steps follow one of them, the rest are drawn
from the Zipf unigram) — word-like statistics: a heavy head, a long tail, local structure. On it:
``NGramLM.fit`` at orders 3, 5 and 8 (fit time, the model's bytes), then a ``SeekIndex`` over the
order-5 model grown to the requested number of sequences (``ensure_count``), with the sparse rows
a wide vocabulary keeps by default; and the one-line recipe's draft side with a prompt: a fresh
``SeekIndex`` over the order-5 model prompted with a corpus sentence's first 5 tokens, asked for
the first k + window = 57 sequences (``ensure_count(57)``, what ``top_k(25)`` with a 32-sequence
window pulls first). Each measurement runs in a FRESH subprocess, so its peak RSS (the
whole process: Python, numpy, JAX) is its own. ``whole rows`` is what the index would have held
storing a float32[V] row per expanded prefix (the storage before sparse rows).

    python3 benchmarks/bench_large_vocab.py [--quick] [--out DIR]
"""

from __future__ import annotations

import argparse
import os

import numpy as np

from common import run_child, section, table

COMMAND = "python3 benchmarks/run.py --only large_vocab"
HERE = os.path.dirname(os.path.abspath(__file__))
VOCAB = 50257
EOS = 0
LIMIT_BYTES = 4 << 30  # issue 13: the draft and its index in under 4 GB
PROMPT_TOKENS = 5  # issue 20: a prompted draft's first k + window sequences, in seconds
PROMPTED_COUNT = 57


def make_corpus(n_tokens: int, vocab: int = VOCAB, seed: int = 0) -> list[tuple[int, ...]]:
    """About ``n_tokens`` tokens (EOS included) of sentences, as described in the module doc."""
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, vocab, dtype=np.float64) ** 1.1
    p /= p.sum()
    successors = rng.choice(vocab - 1, size=(vocab, 8), p=p) + 1
    lengths = np.minimum(rng.geometric(1 / 18, size=max(n_tokens // 10, 1)), 60)
    lengths = lengths[np.cumsum(lengths + 1) <= n_tokens]
    total = int(lengths.sum())
    draws = rng.choice(vocab - 1, size=total, p=p) + 1
    follow = rng.random(total) < 0.6
    pick = rng.integers(0, 8, size=total)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    follow[starts] = False
    toks = draws.copy()
    # A follower takes a successor of the token before it, which may itself be a follower: walk
    # each run of followers in order (vectorised over all runs at once, one step at a time).
    run_pos = np.flatnonzero(follow)
    while run_pos.size:
        prev_is_free = ~follow[run_pos - 1]
        ready = run_pos[prev_is_free]
        toks[ready] = successors[toks[ready - 1], pick[ready]]
        follow[ready] = False
        run_pos = run_pos[~prev_is_free]
    return [tuple(toks[s : s + n].tolist()) + (EOS,) for s, n in zip(starts.tolist(), lengths.tolist())]


CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, {here!r})
from bench_large_vocab import make_corpus, VOCAB, EOS
def peak():  # bytes (Linux reports KiB)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
from jaxrescore.models.ngram import NGramLM
from jaxrescore.index.seek import SeekIndex
corpus = make_corpus({tokens})
t = time.perf_counter()
draft = NGramLM.fit(corpus, order={order}, vocab_size=VOCAB, eos=EOS)
out = dict(fit=time.perf_counter() - t, model_bytes=draft.nbytes, n_terms=draft.n_terms,
           sentences=len(corpus), tokens=sum(map(len, corpus)), fit_peak=peak())
if {count}:
    t = time.perf_counter()
    index = SeekIndex(draft, progress=False)
    index.ensure_count({count})
    out.update(index_s=time.perf_counter() - t, n=len(index), index_bytes=index.nbytes, rows=index.forwards,
               whole_rows=index.forwards * 4 * VOCAB, peak=peak(), nodes=index.state.nodes.n)
    seqs, lps = index.unrank_batch([0, len(index) - 1])
    out.update(first=list(seqs[0]), first_lp=float(lps[0]), last_lp=float(lps[1]))
if {prompted}:
    prompt = next(s for s in corpus if len(s) > {prompt_tokens})[:{prompt_tokens}]
    t = time.perf_counter()
    index = SeekIndex(draft.with_prompt(prompt), progress=False)
    index.ensure_count({prompted})
    out.update(prompted_s=time.perf_counter() - t, prompted_n=len(index), prompted_rows=index.forwards,
               prompted_bytes=index.nbytes, prompted_bits=index.built_bits, prompted_peak=peak(),
               prompt=list(prompt))
print(json.dumps(out))
"""


def measure(tokens: int, order: int, count: int, timeout: float, prompted: int = 0) -> dict:
    return run_child(CHILD.format(here=HERE, tokens=tokens, order=order, count=count, prompted=prompted,
                                  prompt_tokens=PROMPT_TOKENS), timeout)


def _mib(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB" if n < 2**30 else f"{n / 2**30:.2f} GiB"


def run(quick: bool = False, out_dir=None) -> str:
    tokens = 100_000 if quick else 1_000_000
    count = 2_000 if quick else 100_000
    timeout = 300 if quick else 3000
    fits, index_row = [], None
    prompted = measure(tokens, 5, 0, timeout, prompted=PROMPTED_COUNT)
    for order in (3, 5, 8):
        r = measure(tokens, order, count if order == 5 else 0, timeout)
        if "error" in r:
            fits.append([order, r["error"], "", "", ""])
            continue
        fits.append([order, f"{r['fit']:.1f} s", f"{r['n_terms']:,}", _mib(r["model_bytes"]), _mib(r["fit_peak"])])
        if order == 5:
            index_row = r
    corpus = f"{tokens:,} tokens"
    if index_row:
        corpus = f"{index_row['tokens']:,} tokens in {index_row['sentences']:,} sentences"
    text = f"""
V = {VOCAB:,}; corpus: {corpus} (synthetic, see the module docstring of
`benchmarks/bench_large_vocab.py`). Peak RSS is the whole process's (Python, numpy and JAX
included), one fresh process per order.

{table(["order", "fit", "n-gram terms", "model bytes", "peak RSS"], fits)}
"""
    if index_row:
        r = index_row
        ok = "yes" if r["peak"] < LIMIT_BYTES else "NO"
        text += f"""
A `SeekIndex` over the order-5 draft, `ensure_count({count:,})` (defaults: sparse rows at this
vocabulary, `bin_width_bits=1`, `oversample=8`):

{table(["sequences", "build", "draft rows run", "prefix nodes", "index nbytes", "bytes / sequence", "whole rows would hold", "peak RSS", "under 4 GiB"],
       [[f"{r['n']:,}", f"{r['index_s']:.0f} s", f"{r['rows']:,}", f"{r['nodes']:,}", _mib(r["index_bytes"]),
         f"{r['index_bytes'] / max(r['n'], 1):,.0f}", _mib(r["whole_rows"]), _mib(r["peak"]), ok]])}

Each expanded prefix costs one next-token query of the n-gram model, which returns only the cells
the index keeps and a bound on the rest (`NGramLM.next_logprobs_above`: candidates read off the
unigram and each context's terms sorted by probability, never V cells). An EOS model's index
expands every prefix within its budget: {r['rows'] / max(r['n'], 1):.1f} rows per indexed sequence here.
"""
    if "error" in prompted:
        text += f"\nThe prompted order-5 draft's first {PROMPTED_COUNT} sequences: {prompted['error']}\n"
    else:
        r = prompted
        ok = "yes" if r["prompted_peak"] < LIMIT_BYTES else "NO"
        text += f"""
The one-line recipe's draft side with a prompt (issue 20): a fresh `SeekIndex(draft.with_prompt(p))`
(default arguments) over the order-5 draft, `p` the first {PROMPT_TOKENS} tokens of a corpus sentence,
`ensure_count({PROMPTED_COUNT})` (the first k + window sequences of `top_k(25)` with a 32-sequence
window), in its own fresh process. Growth by count deepens at most one whole bit a pass until the
index holds {PROMPTED_COUNT}; the prompted n-gram hands over sparse rows (no V-wide row but the root's):

{table(["sequences held", "built to", "time", "draft rows run", "index nbytes", "peak RSS", "under 4 GiB"],
       [[f"{r['prompted_n']:,}", f"{r['prompted_bits']:g} bits", f"{r['prompted_s']:.1f} s", f"{r['prompted_rows']:,}",
         f"{r['prompted_bytes'] / 2**10:,.0f} KiB", _mib(r["prompted_peak"]), ok]])}
"""
    return section("Large vocabulary: sparse n-gram tables and SeekIndex memory at V = 50,257", COMMAND, text)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    print(run(args.quick, args.out))


if __name__ == "__main__":
    main()
