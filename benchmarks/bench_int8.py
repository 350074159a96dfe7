"""The int8 twin against its target, side by side in one run: storage, teacher-forcing time,
incremental next-token rows, and the per-step deviation that buys.

Twins of the same float32 TransformerLM:
- "dequantise per call": int8 weights dequantised whole inside every forward (the twin before
  this benchmark; reproduced as ``quantize_int8`` of a ``from_apply_fn`` model of the same network);
- "int8 weights" (``activations="float"``): int8 layers, each kernel dequantised where it is used;
- "int8 W8A8" (the default): per-token int8 activations, int8 x int8 matmuls accumulated in int32.

Times are the best of ``repeats`` rounds, the models measured in turn within each round (so a
load spike on the shared machine hits all of them), after a warm-up call that compiles.

    python3 benchmarks/bench_int8.py [--quick]
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np
from common import section, table

from jaxrescore.models import decoding_session, from_apply_fn, max_step_deviation
from jaxrescore.models.int8 import quantize_int8
from jaxrescore.models.transformer import TransformerConfig, TransformerLM

COMMAND = "python3 benchmarks/run.py --only int8"


def nbytes(model) -> int:
    return int(sum(np.asarray(x).nbytes for x in jax.tree.leaves(model.params)))


def best_of(fns: dict, repeats: int) -> dict:
    """The best seconds of each ``fns[name]()`` over ``repeats`` interleaved rounds."""
    for fn in fns.values():
        fn()  # compiles
    best = {name: float("inf") for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t)
    return best


def measure(cfg: TransformerConfig, n_seqs: int, n_rows: int, repeats: int):
    target = TransformerLM(cfg, seed=0)
    v, t = cfg.vocab_size, cfg.max_len
    models = {
        "float32 target": target,
        "int8, dequantise per call": quantize_int8(
            from_apply_fn(target.apply, target.params, vocab_size=v, bos_id=v, max_len=t, eos=cfg.eos)),
        "int8 weights": quantize_int8(target, activations="float"),
        "int8 W8A8": quantize_int8(target),
    }
    rng = np.random.default_rng(0)
    seqs = [tuple(int(x) for x in rng.integers(1, v, size=t - 1)) + (0,) for _ in range(n_seqs)]
    score = best_of({k: (lambda m=m: m.score_sequences(seqs)) for k, m in models.items()}, repeats)
    # incremental rows: children of held parents (one position each), as a SeekIndex level costs
    pre = rng.integers(1, v, size=(n_rows, 8)).astype(np.int32)
    rows = {}
    for name, m in models.items():
        s = decoding_session(m)
        if s is None:
            continue
        s.next_logprobs(pre, np.full(n_rows, 7, np.int32))
        rows[name] = lambda s=s: s.next_logprobs(pre, np.full(n_rows, 8, np.int32))
    step = best_of(rows, repeats)
    out, ratios = [], {}
    base_s, base_r = score["float32 target"], step["float32 target"]
    for name, m in models.items():
        dev = 0.0 if m is target else max_step_deviation(target, m, seqs[:64])
        r = step.get(name)
        ratios[name] = (base_s / score[name], None if r is None else base_r / r, dev)
        out.append([
            name, f"{nbytes(m) / 2**20:.2f} MiB", f"{score[name] * 1e3:.0f} ms", f"{base_s / score[name]:.2f}x",
            "n/a (full forwards)" if r is None else f"{r / n_rows * 1e6:.1f} us",
            "" if r is None else f"{base_r / r:.2f}x", f"{dev:.3f}",
        ])
    return out, ratios


def _span(values, fmt="{:.2f}") -> str:
    lo, hi = min(values), max(values)
    return fmt.format(lo) if fmt.format(lo) == fmt.format(hi) else f"{fmt.format(lo)}-{fmt.format(hi)}"


def _summary(names, ratios) -> str:
    """'What it says', from this run's figures."""
    w8a8 = [ratios[n]["int8 W8A8"] for n in names]
    per_shape = ", ".join(f"{r[0]:.2f}x at {n}" for n, r in zip(names, w8a8))
    rows = [r[1] for r in w8a8 if r[1] is not None]
    weight_only = [ratios[n][m][0] for n in names for m in ("int8 weights", "int8, dequantise per call")]
    dev = lambda m: _span([ratios[n][m][2] for n in names])  # noqa: E731
    return (
        f"What it says: against its float32 target, the W8A8 twin's teacher forcing ran {per_shape} as fast"
        + (f" (cached next-token rows: {_span(rows)}x)" if rows else "")
        + f"; the weight-only twins ran at {_span(weight_only)}x, since every "
        "forward turns int8 weights back into float32 ones. W8A8 moved a step's log-prob by up to "
        f"{dev('int8 W8A8')} nats here (random weights) against {dev('int8 weights')} for weight-only: "
        "a draft's deviation, measured by `max_step_deviation`, never the target's. An accelerator "
        "with int8 matrix units may gain more; not measured here (no accelerator was lent to this task)."
    )


def run(quick: bool = False, out_dir: str | None = None) -> str:
    repeats = 2 if quick else 3
    shapes = [
        ("demo size", TransformerConfig(vocab_size=28, d_model=128, n_layers=4, n_heads=4, max_len=16, eos=0), 1024),
        ("d_model 512", TransformerConfig(vocab_size=1024, d_model=512, n_layers=4, n_heads=8, max_len=32, eos=0), 256),
        ("d_model 1024", TransformerConfig(vocab_size=4096, d_model=1024, n_layers=2, n_heads=8, max_len=32, eos=0), 128),
    ]
    if quick:
        shapes = [(n, c, 64) for n, c, _ in shapes[:2]]
    parts, ratios, n_rows = [], {}, 256 if not quick else 32
    for name, cfg, n in shapes:
        rows, ratios[name] = measure(cfg, n, n_rows, repeats)
        head = (f"**{name}**: V={cfg.vocab_size}, d_model {cfg.d_model}, {cfg.n_layers} layers, d_ff "
                f"{cfg.ff_width}, {n} sequences of {cfg.max_len} tokens scored per call")
        parts.append(head + "\n\n" + table(
            ["model", "weights", "score_sequences", "speed-up", "cached next-token row", "speed-up",
             "max step deviation (nats)"], rows))
    body = f"""
Twins of one float32 TransformerLM (random weights): "dequantise per call" is the int8 twin as it
was (int8 weights, the whole tree dequantised inside every forward, then the float network);
"int8 weights" is `quantize_int8(model, activations="float")` (int8 layers, each kernel
dequantised where it is used); "int8 W8A8" is `quantize_int8(model)`, the default (each dense
layer quantises its input per token and multiplies int8 by int8 with int32 accumulation). Times
are the best of {repeats} interleaved rounds after a compiling warm-up: one `score_sequences` call
over the batch (teacher forcing) and, per row, a `DecodingSession` call expanding {n_rows} children of
held parents (one token position each). Deviation: `max_step_deviation` over 64 of the sequences.

{chr(10).join(p + chr(10) for p in parts)}
{_summary([n for n, _, _ in shapes], ratios)}
"""
    return section("The int8 twin: storage, speed and deviation against its target", COMMAND, body)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    print(run(quick=args.quick))
