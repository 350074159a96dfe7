"""Teacher-forcing throughput of TransformerLM.score_sequences, side by side in one run:

- batched: one ``score_sequences`` call over all sequences (chunked, bucketed, jitted);
- loop: one ``score_sequences`` call per sequence (what a per-candidate scorer costs), with
  ``min_rows=1`` so each call computes one row (the loop's best case);
- peak: this machine's measured float32 matmul rate (a big jitted ``jnp.dot``), against which the
  batched forward's FLOP rate is reported as a utilisation.

FLOPs count the matmuls of the padded forward (projections, attention scores and values, MLP, the
output head): ``2 * m * n * k`` per ``[m, k] @ [k, n]``.

    python benchmarks/bench_throughput.py [--n 4096] [--layers 2 4] [--loop 200] [--chunk-rows 0 256]
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=4096, help="sequences per batched call")
    ap.add_argument("--loop", type=int, default=200, help="sequences scored one call each")
    ap.add_argument("--layers", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--max-len", type=int, default=16)
    ap.add_argument("--chunk-rows", type=int, nargs="+", default=[0, 256, 4096],
                    help="rows per device call; 0 = the model's automatic chunking")
    ap.add_argument("--peak-n", type=int, nargs="+", default=[256, 512, 1024, 2048])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()

    peak, peak_n = matmul_peak(args.peak_n, args.repeats)
    print(f"device: {jax.devices()[0].device_kind} x{len(jax.devices())}, jax {jax.__version__}")
    print(f"matmul peak (best float32 jnp.dot, at {peak_n}^2): {peak / 1e9:.1f} GFLOP/s\n")
    print("| layers | params | chunk_rows | batched seq/s | loop seq/s | speed-up | GFLOP/s | of peak |")
    print("|---|---|---|---|---|---|---|---|")
    seqs = corpus(args.n, 28, args.max_len)
    for layers in args.layers:
        cfg = TransformerConfig(
            vocab_size=28, d_model=args.d_model, n_layers=layers, n_heads=4,
            max_len=args.max_len, eos=0,
        )
        model = TransformerLM(cfg, seed=0)
        few = seqs[: args.loop]
        model.min_rows = 1  # the loop's best case: no padding rows around a single sequence
        t_loop = best_time(lambda: [model.score_sequences([s]) for s in few], 1)
        loop_rate = len(few) / t_loop
        del model.min_rows
        for chunk in args.chunk_rows:
            model.chunk_rows = chunk or None
            width = model.length_bucket(args.max_len)
            step = model._chunk(width)
            t = best_time(lambda: model.score_sequences(seqs), args.repeats)
            rows = sum(model._rows_bucket(min(step, args.n - s)) for s in range(0, args.n, step))
            flops = forward_flops(cfg, rows, width)
            label = f"{step} (auto)" if not chunk else str(chunk)
            print(
                f"| {layers} | {model.n_params:,} | {label} | {args.n / t:,.0f} | {loop_rate:,.0f} "
                f"| {args.n / t / loop_rate:,.0f}x | {flops / t / 1e9:.1f} | {flops / t / peak:.1%} |"
            )


if __name__ == "__main__":
    main()
