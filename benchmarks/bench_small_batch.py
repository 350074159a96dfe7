"""Small batches: the cost per token of a TransformerLM call of 1, 8 and 32 sequences, with every
call padded to at least 32 rows (the rule before issue 24) and with the minimum that follows the
model's size (``jaxrescore.models.batching.padded_min_rows``).

    python3 benchmarks/bench_small_batch.py [--quick]
"""

from __future__ import annotations

import argparse

import numpy as np
from common import section, table, timed

from jaxrescore.models.batching import MAX_MIN_ROWS, param_bytes, padded_min_rows
from jaxrescore.models.transformer import TransformerConfig, TransformerLM

LENGTH = 32  # tokens a sequence
BATCHES = (1, 8, 32)


def measure(d_model: int, layers: int, heads: int, repeats: int) -> list:
    """Table rows ``[model, weights, batch, rows before, us/token before, rows after, us/token
    after, ratio]`` of one model."""
    cfg = TransformerConfig(vocab_size=64, d_model=d_model, n_layers=layers, n_heads=heads, d_ff=4 * d_model,
                            max_len=LENGTH, eos=None)
    model = TransformerLM(cfg, seed=0)
    weights = param_bytes(model.params)
    rng = np.random.default_rng(0)
    rows = []
    for batch in BATCHES:
        seqs = [tuple(int(t) for t in rng.integers(0, 64, size=LENGTH)) for _ in range(batch)]
        per_token = {}
        for label, min_rows in (("before", MAX_MIN_ROWS), ("after", None)):
            model.min_rows = min_rows
            _, seconds = timed(lambda: model.score_sequences(seqs), repeats)
            per_token[label] = (model._rows_bucket(batch), seconds / (batch * LENGTH) * 1e6)
        (rb, tb), (ra, ta) = per_token["before"], per_token["after"]
        rows.append([f"d_model {d_model}, {layers} layers", f"{weights / 2**20:.1f} MiB", batch,
                     rb, f"{tb:,.1f}", ra, f"{ta:,.1f}", f"{tb / ta:.1f}x"])
    return rows


def run(quick: bool = False, out_dir=None) -> str:
    repeats = 3 if quick else 7
    models = [(128, 2, 4)] + ([] if quick else [(512, 8, 8)])
    rows = [r for m in models for r in measure(*m, repeats)]
    small = padded_min_rows(0)
    text = f"""
Random sequences of {LENGTH} tokens (V=64, fixed length) scored by one `score_sequences` call,
median of {repeats} after a warm-up call that compiles; microseconds per scored token. "before":
every call padded to at least {MAX_MIN_ROWS} rows; "after": padded to the next power of two from
`padded_min_rows(weight bytes)` ({small} rows up to 4 MiB of weights, halving with each doubling,
1 row above 64 MiB). A small model keeps {small} (one compile covers every small call; its rows
cost little, and its two columns differ by timing noise only); a large one no longer computes
32 rows for a batch of 8.

{table(["model", "weights", "batch", "rows before", "us/token before", "rows after", "us/token after", "before/after"], rows, "lrrrrrrr")}
"""
    return section("Small batches: the minimum padded batch follows the model's size",
                   "python3 benchmarks/run.py --only small_batch", text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    print(run(ap.parse_args().quick))


if __name__ == "__main__":
    main()
