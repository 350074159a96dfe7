"""Tiny random models and brute-force oracles for the SeekIndex tests (V**L small enough to list)."""

from __future__ import annotations

import itertools
import math

import numpy as np

from jaxrescore.models.callable import CallableModel
from jaxrescore.quantize import Quantizer

# Probabilities that put steps exactly on bucket edges (0.5 = 1 bit) or tie with each other.
EDGE_PROBS = np.array([0.5, 0.25, 0.125, 0.0625, 0.0625])


def random_table_fn(vocab: int, seed: int, *, eos: int | None = None, max_len: int, style: str = "softmax"):
    """A per-prefix fn with a deterministic random distribution for every prefix.

    style: "softmax" (random logits), "edge" (a permutation of dyadic probabilities: exact bucket
    edges and ties), "peaked" (one dominant token: a long tail of deep buckets).
    For a terminating model the last position forces eos, so the support is finite and complete.
    """
    cache: dict[tuple, np.ndarray] = {}

    def table(prefix: tuple) -> np.ndarray:
        if prefix not in cache:
            rng = np.random.default_rng([seed, len(prefix), *prefix])
            if style == "edge":
                probs = np.zeros(vocab)
                k = min(vocab, EDGE_PROBS.size)
                p = EDGE_PROBS[:k] / EDGE_PROBS[:k].sum()
                probs[rng.permutation(vocab)[:k]] = p
                lp = np.log(probs, where=probs > 0, out=np.full(vocab, -np.inf))
            else:
                logits = rng.normal(size=vocab) * (4.0 if style == "peaked" else 1.5)
                lp = logits - np.log(np.exp(logits - logits.max()).sum()) - logits.max()
            if eos is not None and len(prefix) == max_len - 1:
                lp = np.full(vocab, -np.inf)
                lp[eos] = 0.0
            cache[prefix] = lp.astype(np.float32)
        return cache[prefix]

    def fn(prefix: tuple):
        lp = table(prefix)
        keep = np.isfinite(lp)
        return np.flatnonzero(keep), lp[keep]

    fn.table = table
    return fn


def make_model(vocab: int, max_len: int, seed: int, *, eos: int | None = None, style: str = "softmax",
               batched: bool = False) -> CallableModel:
    fn = random_table_fn(vocab, seed, eos=eos, max_len=max_len, style=style)
    if not batched:
        return CallableModel(fn, vocab_size=vocab, max_len=max_len, eos=eos)

    def batched_fn(prefixes, lengths):
        return np.stack([fn.table(tuple(p[:n].tolist())) for p, n in zip(prefixes, lengths)])

    return CallableModel(batched_fn, vocab_size=vocab, max_len=max_len, eos=eos, batched=True)


def support(model: CallableModel):
    """Every sequence of the model's structural support with positive probability."""
    v, L, eos = model.vocab_size, model.max_len, model.eos
    if eos is None:
        cands = itertools.product(range(v), repeat=L)
    else:
        others = [t for t in range(v) if t != eos]
        cands = (body + (eos,) for n in range(L) for body in itertools.product(others, repeat=n))
    return [s for s in cands if math.isfinite(step_lps(model, s).sum())]


def step_lps(model: CallableModel, seq) -> np.ndarray:
    """float64[len(seq)]: the model's per-step log-probs (float32 values, as the index sees them)."""
    table = model.fn.table if not model.batched else None
    out = []
    for j, tok in enumerate(seq):
        prefix = tuple(seq[:j])
        lp = table(prefix) if table is not None else model.next_logprobs(
            np.array([list(prefix) + [0]]), np.array([j]))[0]
        out.append(float(lp[tok]))
    return np.array(out)


def oracle(model: CallableModel, quantizer: Quantizer):
    """Brute-force support in index order: list of (seq, fb, draft_lp), sorted by (bucket, dfs)."""
    rows = []
    for s in support(model):
        steps = np.minimum(step_lps(model, s), 0.0)
        fb = int(quantizer.step_buckets(steps).sum())
        lp = 0.0
        for x in steps:  # same summation order as the index
            lp += float(x)
        dfs = tuple((-float(x), t) for x, t in zip(steps, s))
        rows.append((fb, dfs, s, lp))
    rows.sort(key=lambda r: (r[0], r[1]))
    return [(s, fb, lp) for fb, _, s, lp in rows]
