"""Teacher-forcing throughput of TransformerLM.score_sequences, side by side in one run:

- batched: one ``score_sequences`` call over all sequences (chunked, bucketed, jitted);
- loop: one ``score_sequences`` call per sequence (what a per-candidate scorer costs), with
  ``min_rows=1`` so each call computes one row (the loop's best case);
- peak: this machine's measured float32 matmul rate (a big jitted ``jnp.dot``), against which the
  batched forward's FLOP rate is reported as a utilisation.

FLOPs count the matmuls of the padded forward (projections, attention scores and values, MLP, the
output head): ``2 * m * n * k`` per ``[m, k] @ [k, n]``.

    python3 benchmarks/bench_throughput.py [--quick]
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
from common import section, table

from jaxrescore.models.transformer import TransformerConfig, TransformerLM


def best_time(fn, repeats: int) -> float:
    """The fastest of ``repeats`` timed calls (after one warm-up call that compiles)."""
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def matmul_peak(sizes, repeats: int) -> tuple[float, int]:
    """The best measured float32 FLOP/s of a jitted ``[n, n] @ [n, n]`` over ``sizes``, and n."""
    dot = jax.jit(jnp.dot)
    best = (0.0, 0)
    for n in sizes:
        a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32)
        b = jax.random.normal(jax.random.PRNGKey(1), (n, n), jnp.float32)
        rate = 2 * n**3 / best_time(lambda: dot(a, b).block_until_ready(), repeats)
        best = max(best, (rate, n))
    return best


def forward_flops(cfg: TransformerConfig, rows: int, width: int) -> float:
    """Matmul FLOPs of one padded forward over ``rows`` x ``width`` tokens."""
    d, f, v, t = cfg.d_model, cfg.ff_width, cfg.vocab_size, width
    per_layer = 2 * t * d * 3 * d + 2 * 2 * t * t * d + 2 * t * d * d + 2 * 2 * t * d * f
    return rows * (cfg.n_layers * per_layer + 2 * t * d * v)


def corpus(n: int, vocab: int, max_len: int, seed: int = 0) -> list[tuple[int, ...]]:
    rng = np.random.default_rng(seed)
    lens = rng.integers(3, max_len, size=n)
    return [tuple(int(x) for x in rng.integers(1, vocab, size=k)) + (0,) for k in lens]


def measure(n, loop, layers_list, d_model, max_len, chunk_rows_list, peak_n, repeats):
    """``(peak FLOP/s, its n, table rows, best fraction of the peak)``."""
    peak, peak_n_best = matmul_peak(peak_n, repeats)
    best = 0.0  # the best fraction of the peak
    rows = []
    seqs = corpus(n, 28, max_len)
    for layers in layers_list:
        cfg = TransformerConfig(vocab_size=28, d_model=d_model, n_layers=layers, n_heads=4, max_len=max_len, eos=0)
        model = TransformerLM(cfg, seed=0)
        few = seqs[:loop]
        model.min_rows = 1  # the loop's best case: no padding rows around a single sequence
        t_loop = best_time(lambda: [model.score_sequences([s]) for s in few], 1)
        loop_rate = len(few) / t_loop
        del model.min_rows
        for chunk in chunk_rows_list:
            model.chunk_rows = chunk or None
            width = model.length_bucket(max_len)
            step = model._chunk(width)
            t = best_time(lambda: model.score_sequences(seqs), repeats)
            padded = sum(model._rows_bucket(min(step, n - s)) for s in range(0, n, step))
            flops = forward_flops(cfg, padded, width)
            label = f"{step} (auto)" if not chunk else str(chunk)
            rows.append([layers, f"{model.n_params:,}", label, f"{n / t:,.0f}", f"{loop_rate:,.0f}",
                         f"{n / t / loop_rate:,.0f}x", f"{flops / t / 1e9:.1f}", f"{flops / t / peak:.1%}"])
            best = max(best, flops / t / peak)
    return peak, peak_n_best, rows, best


def run(quick: bool = False, out_dir=None) -> str:
    n, loop, repeats = (512, 20, 2) if quick else (4096, 200, 5)
    layers, chunks, sizes = ([2], [0], [256, 512]) if quick else ([2, 4], [0, 256, 4096], [256, 512, 1024, 2048])
    peak, peak_n, rows, best = measure(n, loop, layers, 128, 16, chunks, sizes, repeats)
    text = f"""
Demo-size model (V=28, d_model 128, 4 heads, d_ff 512, max_len 16, eos), {n} random sequences of
4-16 tokens scored by `score_sequences`, best of {repeats}; "loop" scores {loop} of them with one call each
(with `min_rows=1`, so each call computes exactly one row: the loop's best case). GFLOP/s counts
the matmuls of the padded forward; "of peak" divides by the best float32 `jnp.dot` rate measured
in the same run ({peak / 1e9:.1f} GFLOP/s at {peak_n}²; on a shared machine the peak itself moves
between runs, so compare within a run).

{table(["layers", "params", "rows per call", "batched seq/s", "loop seq/s", "speed-up", "GFLOP/s", "of peak"], rows, "rrlrrrrr")}

The library's default device call is ~2048 tokens on CPU (128 rows of 16;
`DeviceBatched.chunk_tokens`: 2048 tokens per device on CPU, 65536 on accelerators; set
`chunk_tokens` or `chunk_rows` to override); the table's rows-per-call column shows where this
run's best rate fell.

Issue 12's target (teacher forcing at >= 60% of the measured matmul peak at its best batch):
{"met" if best >= 0.6 else "MISSED"}, {best:.1%}.
"""
    return section("TransformerLM teacher-forcing throughput (score_sequences)", "python3 benchmarks/run.py --only throughput", text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    print(run(ap.parse_args().quick))


if __name__ == "__main__":
    main()
