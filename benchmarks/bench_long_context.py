"""Pretrained-shaped models at their real context: cached next-token rows after long prompts, and
what a proven top-k round costs with GPT-2 as the target and distilgpt2 as its draft.

Models: checkpoints with random weights written in the exact Hugging Face layout (config.json and
model.safetensors as ``save_pretrained`` leaves them: GPT-2's Conv1D weights [in, out], GPT-2
initialisation, std 0.02) and loaded with ``from_pretrained``, as a user loads ``./gpt2``. Full
run: GPT-2 small (12 layers, d_model 768, 12 heads, V = 50,257, context 1024) and a
distilgpt2-shaped draft (6 layers, the same widths); ``--quick``: 2-layer, d_model 64, V = 512
stand-ins at context 128.

1. Next-token rows after a 4- to 1,000-token prompt (a row extends its held parent by one token;
   the prompt's keys and values are held once by the prompted model, shared by every row), against
   a full forward of prompt + prefix for one row; the prompt's setup (one prefill call); the bytes
   of cache a session holds per row.
2. What a round of ``top_k(target, draft, k, prompt=...)`` asks of each model after a 16-token
   prompt: one teacher-forcing call over the pulled window, and cached next-token rows (CPU; no
   accelerator was lent).

    python3 benchmarks/bench_long_context.py [--quick]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import tempfile
import time

import jax
import numpy as np
from common import section, table, timed

from jaxrescore.models import decoding_session, from_pretrained
from jaxrescore.models.decoding import default_cache_bytes

COMMAND = "python3 benchmarks/run.py --only long_context"

FULL = dict(n_layer=12, n_embd=768, n_head=12, n_positions=1024, vocab_size=50257)
QUICK = dict(n_layer=2, n_embd=64, n_head=4, n_positions=128, vocab_size=512)


def gpt2_tensors(shape: dict, seed: int) -> dict:
    """A random GPT2LMHeadModel's tensors (the hub's key names, Conv1D weights [in, out]): GPT-2's
    initialisation (std 0.02), except the tied embedding (std 0.15), so that rows spread about
    as unevenly as a trained model's instead of almost evenly over the vocabulary."""
    rng = np.random.default_rng(seed)
    d, v, p = shape["n_embd"], shape["vocab_size"], shape["n_positions"]

    def w(*dims):
        return (rng.standard_normal(dims, np.float32) * 0.02).astype(np.float32)

    ones, zeros = (lambda n: np.ones(n, np.float32)), (lambda n: np.zeros(n, np.float32))
    t = {"wte.weight": w(v, d) * 7.5, "wpe.weight": w(p, d) / 2, "ln_f.weight": ones(d), "ln_f.bias": zeros(d)}
    for i in range(shape["n_layer"]):
        h = f"h.{i}."
        t.update({
            h + "ln_1.weight": ones(d), h + "ln_1.bias": zeros(d), h + "ln_2.weight": ones(d), h + "ln_2.bias": zeros(d),
            h + "attn.c_attn.weight": w(d, 3 * d), h + "attn.c_attn.bias": zeros(3 * d),
            h + "attn.c_proj.weight": w(d, d), h + "attn.c_proj.bias": zeros(d),
            h + "mlp.c_fc.weight": w(d, 4 * d), h + "mlp.c_fc.bias": zeros(4 * d),
            h + "mlp.c_proj.weight": w(4 * d, d), h + "mlp.c_proj.bias": zeros(d),
        })
    return t


def write_gpt2(path: str, shape: dict, tensors: dict) -> str:
    """A GPT-2 checkpoint folder (config.json, model.safetensors) as ``save_pretrained`` writes it."""
    from safetensors.numpy import save_file

    eos = shape["vocab_size"] - 1  # <|endoftext|>, the last id as 50256 is GPT-2's
    config = dict(shape, n_ctx=shape["n_positions"], model_type="gpt2", activation_function="gelu_new",
                  layer_norm_epsilon=1e-5, bos_token_id=eos, eos_token_id=eos, architectures=["GPT2LMHeadModel"])
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    save_file(tensors, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    return path


def prompt_rows(model, prompt_lens, rows, repeats):
    """Table rows of part 1, and the largest difference between cached and full-forward rows."""
    v = model.vocab_size
    one_row = copy.copy(model)
    one_row.min_rows = 1  # a full forward of ONE row, not a padded batch of them
    rng = np.random.default_rng(0)
    paths = rng.integers(0, v - 1, size=(rows, 4)).astype(np.int32)
    out, worst = [], 0.0
    for p in prompt_lens:
        prompt = tuple(int(t) for t in rng.integers(0, v - 1, size=p))
        pm = model.with_prompt(prompt)
        t0 = time.perf_counter()
        pm.next_logprobs(paths[:1], [0])  # the prompt's keys and values: one prefill call (compiles)
        cold = time.perf_counter() - t0
        del pm._decode_context
        t0 = time.perf_counter()
        pm.next_logprobs(paths[:1], [0])
        setup = time.perf_counter() - t0
        session = decoding_session(pm)
        for d in (1, 2, 3):
            session.next_logprobs(paths[:, :d], np.full(rows, d, np.int32))
        before = session.positions
        got, t_row = timed(lambda: session.next_logprobs(paths, np.full(rows, 4, np.int32)), repeats)
        per_row = (session.positions - before) / (repeats + 1) / rows
        full = np.concatenate([prompt, paths[0]])[None].astype(np.int32)
        want, t_full = timed(lambda: one_row.next_logprobs(full, [p + 4]), repeats)
        worst = max(worst, float(np.abs(got[0] - want[0]).max()))
        out.append([
            f"{p:,}", f"{setup * 1e3:,.0f} ms ({cold:.1f} s cold)", f"{t_full * 1e3:,.0f}", f"{t_row / rows * 1e3:.1f}",
            f"{per_row:g}", f"{t_full / (t_row / rows):.0f}x", f"{session.bytes_per_row / 2**10:,.0f} KiB",
            f"{default_cache_bytes() // session.bytes_per_row:,.0f}",
        ])
    return out, worst


def round_rows(models, pulled, length, rows, repeats):
    """Table rows of part 2: what one round of a proven query asks of each model after a
    16-token prompt."""
    out = []
    rng = np.random.default_rng(2)
    for name, model in models:
        v = model.vocab_size
        pm = model.with_prompt(tuple(int(t) for t in rng.integers(0, v - 1, size=16)))
        seqs = rng.integers(0, v - 1, size=(pulled, length)).astype(np.int32)
        _, t_score = timed(lambda: pm.score_sequences(seqs), repeats)
        paths = rng.integers(0, v - 1, size=(rows, 2)).astype(np.int32)
        session = decoding_session(pm)
        session.next_logprobs(paths[:, :1], np.ones(rows, np.int32))
        _, t_row = timed(lambda: session.next_logprobs(paths, np.full(rows, 2, np.int32)), repeats)
        out.append([name, f"{t_score:.2f} s", f"{t_score / pulled * 1e3:,.0f}", f"{t_row / rows * 1e3:.1f}"])
    return out


def run(quick: bool = False, out_dir: str | None = None) -> str:
    shape = QUICK if quick else FULL
    repeats = 1 if quick else 3
    prompt_lens = [4, 64, 100] if quick else [4, 64, 256, 1000]
    rows = 8 if quick else 32
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        tensors = gpt2_tensors(shape, seed=0)
        t_dir = write_gpt2(os.path.join(tmp, "gpt2"), shape, tensors)
        # distilgpt2 starts from every other layer of gpt2 (and its embeddings): so does the draft
        half = max(shape["n_layer"] // 2, 1)
        student = {k: v for k, v in tensors.items() if not k.startswith("h.")}
        for i in range(half):
            student.update({k.replace(f"h.{2 * i}.", f"h.{i}.", 1): v for k, v in tensors.items()
                            if k.startswith(f"h.{2 * i}.")})
        d_dir = write_gpt2(os.path.join(tmp, "distilgpt2"), dict(shape, n_layer=half), student)
        written = time.perf_counter() - t0
        t0 = time.perf_counter()
        target, draft = from_pretrained(t_dir), from_pretrained(d_dir)
        loaded = time.perf_counter() - t0
    rows1, worst = prompt_rows(target, prompt_lens, rows, repeats)
    pulled = 5 + 64  # k = 5 and the default rerank_window
    rows2 = round_rows([("target (gpt2 shape)", target), ("draft (distilgpt2 shape)", draft)], pulled, 16, rows,
                       repeats)
    s = target.spec
    t1 = table(
        ["prompt tokens", "prompt setup (one prefill call)", "full forward ms (1 row)", "cached row ms",
         "positions per cached row", "full / cached", "cache held per row", "rows the default budget holds"],
        rows1,
    )
    t2 = table(["model", f"score {pulled} sequences (one call)", "ms per sequence", "cached row ms"], rows2, "lrrr")
    body = f"""
A GPT-2 {"stand-in" if quick else "small"}-shaped target ({s.n_layers} layers, d_model {s.d_model},
{s.n_heads} heads, V = {s.vocab_size:,}, max_len {target.max_len}) and a {draft.spec.n_layers}-layer
draft (distilgpt2's shape and start: the target's embeddings and every other layer), random weights written as Hugging Face checkpoints
({written:.0f} s) and read by `from_pretrained` ({loaded:.1f} s for both); float32 on CPU (no
accelerator was lent to this run: {jax.devices()[0].device_kind}).

Part 1: {rows} rows of 4-token continuations after a prompt; a `DecodingSession` over
`target.with_prompt(prompt)` expanded the rows' parents first (levels 1-3), then level 4 is timed
(median of {repeats} after a warm-up call): each row extends its parent's cache by ONE token
position, attending to the prompt's keys and values held once by the prompted model. "full
forward" is `next_logprobs` of prompt + prefix for one row (padded to a power-of-two length, at
most max_len), what every row cost without the cache. "prompt setup" computes the prompt's keys and
values in one prefill call (the cold figure includes its compile). A row's cache covers its own
positions only, never the prompt's: 8 (a power of two) while the continuation may be long, and the
power of two covering the longest continuation once twice that fits 64 positions (after the
100-token prompt 28 tokens are left: 32 positions; 64 only for a call whose padded block reaches
past them). Cached rows match
the full forward to {worst:.1e} (float32 noise).

{t1}

Part 2: what a round of `top_k(target, draft, 5, prompt=...)` asks of each model after a
16-token prompt: the target scores the pulled window (k + rerank_window = {pulled} sequences, here
of 16 tokens) in one teacher-forcing call, and the speculated paths grow by cached next-token
rows ({rows} per call; the draft's rows build its index the same way). How many of each a round
needs depends on how far the draft's order is from the target's; with random weights the two
disagree far more than a trained distilgpt2 and gpt2 do, so a whole proven query is not timed
here (on 2 CPU cores it ran past the time this run could give it).

{t2}
"""
    return section("Pretrained-shaped models at long context", COMMAND, body)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    print(run(quick=parser.parse_args().quick))
