"""Protocol checks shared by the model tests: each compares a model with its own next_logprobs."""

from __future__ import annotations

import numpy as np

from jaxrescore.sequences import SequenceBatch, from_tuples


def stepwise_scores(model, seqs) -> np.ndarray:
    """float64[N]: the sum over positions of ``next_logprobs`` rows (one batched call per step)."""
    seqs = [tuple(s) for s in seqs]
    width = max(len(s) for s in seqs)
    out = np.zeros(len(seqs))
    for j in range(width):
        rows = [i for i, s in enumerate(seqs) if len(s) > j]
        prefixes = from_tuples([seqs[i][:j] for i in rows], length=max(j, 1))
        lp = model.next_logprobs(prefixes.tokens, prefixes.lengths)
        out[rows] += lp[np.arange(len(rows)), [seqs[i][j] for i in rows]]
    return out


def check_protocol(model, seqs, *, atol=2e-4) -> None:
    """Scores equal stepwise sums, padding is invisible, rows normalise, skip and prompts agree."""
    seqs = [tuple(int(t) for t in s) for s in seqs]
    scores = model.score_sequences(seqs)
    assert scores.dtype == np.float64 and scores.shape == (len(seqs),)
    np.testing.assert_allclose(scores, stepwise_scores(model, seqs), atol=atol)

    # Padding: longer rows, extra empty rows, and each sequence alone.
    batch = from_tuples(seqs, length=model.max_len).pad(rows=len(seqs) + 5)
    np.testing.assert_allclose(model.score_sequences(batch)[: len(seqs)], scores, atol=atol)
    np.testing.assert_allclose(model.score_sequences(batch)[len(seqs):], 0.0)
    junk = SequenceBatch(np.where(batch.mask, batch.tokens, model.vocab_size + 7), batch.lengths)
    np.testing.assert_allclose(model.score_sequences(junk), model.score_sequences(batch), atol=1e-6)
    alone = np.array([model.score_sequences([s])[0] for s in seqs[:4]])
    np.testing.assert_allclose(alone, scores[:4], atol=atol)

    # Normalised rows after every prefix of the first sequence.
    s0 = seqs[0]
    pre = from_tuples([s0[:j] for j in range(len(s0))], length=max(len(s0), 1))
    lp = model.next_logprobs(pre.tokens, pre.lengths)
    assert lp.dtype == np.float32 and lp.shape == (len(s0), model.vocab_size)
    np.testing.assert_allclose(np.logaddexp.reduce(lp.astype(np.float64), axis=1), 0.0, atol=1e-5)

    # skip removes exactly the leading steps.
    lens = np.array([len(s) for s in seqs])
    skip = np.minimum(np.arange(len(seqs)) % 3, lens)
    heads = [s[:k] for s, k in zip(seqs, skip)]
    head_scores = np.array([stepwise_scores(model, [h])[0] if h else 0.0 for h in heads])
    np.testing.assert_allclose(model.score_sequences(seqs, skip=skip), scores - head_scores, atol=atol)

    # with_prompt: conditional scores and next-token rows.
    long = [s for s in seqs if len(s) >= 2]
    prompt, cont = long[0][:1], [s[1:] for s in long if s[:1] == long[0][:1]]
    pm = model.with_prompt(prompt)
    assert pm.max_len == model.max_len - 1 and pm.prompt == prompt and pm.base is model
    full = model.score_sequences([prompt + c for c in cont])
    np.testing.assert_allclose(
        pm.score_sequences(cont), full - stepwise_scores(model, [prompt])[0], atol=atol
    )
    np.testing.assert_allclose(pm.score_sequences(cont), stepwise_scores(pm, cont), atol=atol)
    p2 = SequenceBatch(np.array([[long[0][1]]], np.int32), np.array([1], np.int32))
    np.testing.assert_allclose(
        pm.next_logprobs(p2.tokens, p2.lengths),
        model.next_logprobs(np.array([list(long[0][:2])], np.int32), np.array([2], np.int32)),
        atol=1e-5,
    )

    check_frontier(model, seqs, atol=atol)
    check_frontier(pm, cont, atol=atol)
    check_frontier(model, seqs, atol=atol, skip=skip)


def check_frontier(model, seqs, *, atol=2e-4, skip=None, top_m=3) -> None:
    """``score_frontier`` equals ``score_sequences`` and, at every scored position, the top-m, the
    step and the eos entry of the model's own ``next_logprobs`` row (all clipped to <= 0)."""
    seqs = [tuple(int(t) for t in s) for s in seqs]
    fs = model.score_frontier(seqs, top_m=top_m, skip=skip)
    np.testing.assert_allclose(fs.scores, model.score_sequences(seqs, skip=skip), atol=atol)
    m = min(top_m, model.vocab_size)
    assert fs.top_lps.shape[2] >= m and fs.top_ids.dtype == np.int32
    assert (fs.top_lps <= 0).all() and (fs.steps <= 0).all()
    skip = np.zeros(len(seqs), int) if skip is None else np.asarray(skip)
    for i, s in enumerate(seqs):
        for j in range(len(s) - skip[i]):
            pre = s[: skip[i] + j]
            row = model.next_logprobs(np.array([list(pre) or [0]], np.int32), np.array([len(pre)], np.int32))[0]
            # Descending top-m, or (m covering the vocabulary) the whole row in any order.
            vals, ids = fs.top_lps[i, j], fs.top_ids[i, j]
            want = np.sort(row)[::-1][:m]
            np.testing.assert_allclose(np.sort(vals)[::-1][:m], want, atol=atol)
            if fs.top_lps.shape[2] < model.vocab_size:
                np.testing.assert_allclose(vals[:m], want, atol=atol)
            finite = np.isfinite(vals)
            np.testing.assert_allclose(row[ids[finite]], vals[finite], atol=atol)
            np.testing.assert_allclose(fs.steps[i, j], row[s[skip[i] + j]], atol=atol)
            if model.eos is not None:
                np.testing.assert_allclose(fs.eos_lps[i, j], row[model.eos], atol=atol)


def check_cached_rows(lm, vocab: int, max_len: int, rows: int = 12, seed: int = 3) -> None:
    """``lm`` decodes incrementally, and its cached rows equal its full-forward rows."""
    from jaxrescore.models.decoding import decoding_session

    rng = np.random.default_rng(seed)
    pre = rng.integers(1, vocab, size=(rows, max_len - 1)).astype(np.int32)
    lens = rng.integers(0, max_len, size=rows).astype(np.int32)
    session = decoding_session(lm)
    assert session is not None
    np.testing.assert_allclose(session.next_logprobs(pre, lens), lm.next_logprobs(pre, lens), atol=1e-5)
