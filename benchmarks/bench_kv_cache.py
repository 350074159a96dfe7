"""Incremental decoding (key/value caches) against full forwards, side by side in one run.

1. Next-token rows after a prompt of 4 to 512 tokens, 64 rows of 4-token continuations:
   - full forward: ``model.next_logprobs(prompt + prefix)`` (what every row cost before caches);
   - prompt cache: ``model.with_prompt(prompt).next_logprobs(prefix)`` (the prompt's keys and
     values computed once per prompted model; each row prefills its own 4 tokens);
   - prompt + parent caches: a DecodingSession that expanded the rows' parents before (what a
     SeekIndex build or a best-first search does level by level): one position per row.
2. SeekIndex builds over a TransformerLM draft (the demo's shipped names model, and a random
   model, its output head made 4x sharper, under a 64-token prompt), with the session (the default) and with
   ``decode_cache_bytes=0`` (every row a full forward): rows, token positions, build time.

    python3 benchmarks/bench_kv_cache.py [--quick]
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np
from common import section, table, timed

from jaxrescore.index.seek import SeekIndex
from jaxrescore.models.decoding import decoding_session
from jaxrescore.models.transformer import TransformerConfig, TransformerLM

COMMAND = "python3 benchmarks/run.py --only kv_cache"


def prompt_rows(prompt_lens, d_model, layers, rows, repeats):
    """Table rows of part 1."""
    longest = max(prompt_lens)
    cfg = TransformerConfig(vocab_size=256, d_model=d_model, n_layers=layers, n_heads=4,
                            max_len=longest + 16, eos=0)
    model = TransformerLM(cfg, seed=0)
    rng = np.random.default_rng(0)
    cont = rng.integers(1, 256, size=(rows, 4)).astype(np.int32)
    out = []
    for p in prompt_lens:
        prompt = tuple(int(t) for t in rng.integers(1, 256, size=p))
        full = np.concatenate([np.tile(prompt, (rows, 1)), cont], axis=1).astype(np.int32)
        lens = np.full(rows, p + 4, np.int32)
        want, t_full = timed(lambda: model.next_logprobs(full, lens), repeats)
        pm = model.with_prompt(prompt)
        t0 = time.perf_counter()
        pm.next_logprobs(cont[:1], [0])  # computes the prompt's cache (and compiles its shape)
        t_ctx_cold = time.perf_counter() - t0
        del pm._decode_context
        t0 = time.perf_counter()
        pm.next_logprobs(cont[:1], [0])
        t_ctx = time.perf_counter() - t0
        got, t_prefill = timed(lambda: pm.next_logprobs(cont, np.full(rows, 4, np.int32)), repeats)
        session = decoding_session(pm)
        for n in range(1, 4):
            session.next_logprobs(cont, np.full(rows, n, np.int32))
        before = session.positions
        ext, t_ext = timed(lambda: session.next_logprobs(cont, np.full(rows, 4, np.int32)), repeats)
        per_call = (session.positions - before) / (repeats + 1) / rows
        err = max(float(np.abs(got - want).max()), float(np.abs(ext - want).max()))
        out.append([
            p, f"{t_full / rows * 1e3:.3f}", f"{p + 5}", f"{t_prefill / rows * 1e3:.3f}",
            f"{t_ext / rows * 1e3:.3f}", f"{per_call:g}", f"{t_full / t_ext:.0f}x",
            f"{t_ctx * 1e3:.1f} ({t_ctx_cold * 1e3:.0f} cold)", f"{err:.1e}",
        ])
    return cfg, out


def build(model, bits, cache_bytes):
    t = time.perf_counter()
    index = SeekIndex(model, initial_bits=bits, max_depth_bits=bits, progress=False,
                      decode_cache_bytes=cache_bytes)
    return index, time.perf_counter() - t


# A build whose warm-up took over this many seconds is timed once more, not ``repeats`` times.
SLOW_BUILD_S = 5.0


def seek_rows(cases, repeats):
    """Table rows of part 2: each case built cached and uncached (best of ``repeats`` after a
    warm-up build that pays the compiles; one after it when the warm-up took over
    ``SLOW_BUILD_S``)."""
    out = []
    for name, model, bits in cases:
        res = {}
        for label, cache in (("full forwards", 0), ("KV cache", None)):
            _, warm = build(model, bits, cache)  # warm-up: compiles
            best = None
            for _ in range(1 if warm > SLOW_BUILD_S else repeats):
                index, secs = build(model, bits, cache)
                best = secs if best is None else min(best, secs)
            res[label] = (index, best)
        plain_idx, plain_t = res["full forwards"]
        for label, (index, secs) in res.items():
            same = [s for s, _ in index.slice(0, len(index))] == [s for s, _ in plain_idx.slice(0, len(plain_idx))]
            out.append([
                name, f"{bits:g}", label, f"{len(index):,}", f"{index.forwards:,}", f"{index.positions:,}",
                f"{index.positions / max(index.forwards - 1, 1):.2f}", f"{secs:.2f} s",
                f"{plain_t / secs:.1f}x", "yes" if same else "no",
            ])
    return out


def run(quick: bool = False, out_dir: str | None = None) -> str:
    from jaxrescore.data.names_models import names_target

    repeats = 1 if quick else 3
    prompt_lens = [4, 64] if quick else [4, 16, 64, 128, 256, 512]
    d_model, layers, rows = (64, 2, 32) if quick else (128, 4, 64)
    cfg, rows1 = prompt_rows(prompt_lens, d_model, layers, rows, repeats)
    names = names_target()
    rng = np.random.default_rng(1)
    rand = TransformerLM(TransformerConfig(vocab_size=28, d_model=128, n_layers=4, n_heads=4, max_len=96, eos=0), seed=1)
    # random weights give nearly uniform rows; a 4x sharper head gives a draft-like spread
    rand.params = jax.tree_util.tree_map_with_path(
        lambda path, x: x * 4 if "head" in jax.tree_util.keystr(path) else x, rand.params
    )
    prompt = tuple(int(t) for t in rng.integers(1, 28, size=64))
    cases = [("names target", names, 10 if quick else 16),
             ("random, 64-token prompt", rand.with_prompt(prompt), 8 if quick else 12)]
    rows2 = seek_rows(cases, repeats)
    t1 = table(
        ["prompt tokens", "full forward ms/row", "positions/row", "prompt cache ms/row",
         "prompt + parent caches ms/row", "positions/row (cached)", "full / cached", "prompt cache ms (once)",
         "max row difference"],
        rows1,
    )
    t2 = table(
        ["draft", "bits", "rows computed by", "sequences", "rows (forwards)", "token positions",
         "positions per new prefix", "build", "speed-up", "same order"],
        rows2, "lrlrrrrrrl",
    )
    body = f"""
Part 1: a TransformerLM with random weights (V=256, d_model {cfg.d_model}, {cfg.n_layers} layers,
{cfg.n_heads} heads, max_len {cfg.max_len}), {rows} rows of 4-token continuations per call; times are
the median of {repeats} after a warm-up call (compiles excluded), per row. "full forward" runs
prompt + prefix through the network for every row (the only path before caches); "prompt cache"
is `model.with_prompt(prompt).next_logprobs(prefix)` (each row prefills its 4 tokens on top of
the prompt's keys and values, computed once per prompted model); "prompt + parent caches" is a
`DecodingSession` that expanded the rows' parents before, as a SeekIndex build, a best-first search
and a greedy completion do: one token position per row. The last column is the largest difference
between the cached rows and the full forward's (float32 noise).

{t1}

Part 2: SeekIndex builds to a fixed bit budget (`SeekIndex(model, initial_bits=b,
max_depth_bits=b)`), with the default session (parents' caches held level to level) and with
`decode_cache_bytes=0` (every row a full forward of BOS, prompt and prefix); best of {repeats}
after a warm-up build (one after it where the warm-up took over {SLOW_BUILD_S:g} s). "positions per new prefix" is token positions / (rows - 1): the root row
comes with the context (BOS, or BOS and the prompt, computed once). "same order" compares the
two indexes' sequences, rank by rank.

{t2}

What it says: with caches a next-token row costs one token position whatever the prompt
(column "positions/row (cached)"; its time grows only with attention over the cached positions),
while a full forward's positions grow with the prompt; the SeekIndex builds' "positions per new
prefix" column gives what a build over a transformer draft computes. Correctness is in tests/test_models_decoding.py
(cached rows equal full forwards to float32 noise; builds, best-first and greedy completion match
the uncached paths).
"""
    return section("Incremental decoding: KV caches against full forwards", COMMAND, body)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    print(run(quick=args.quick))
