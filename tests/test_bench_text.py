"""The real-text workload (benchmarks/text.py): its clauses and vocabulary are what its docstring
says, and on its quick models a small proven query agrees with best-first."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
sys.path.insert(0, BENCH)

import text  # noqa: E402


def test_clauses_vocabulary_and_split():
    words = text.vocabulary()
    assert words[-2:] == (text.UNK, text.EOS) and len(set(words)) == len(words)
    assert 1_500 <= len(words) <= 4_000
    train, held = text.split(False), text.split(True)
    assert len(held) == -(-len(text.clauses()) // text.HELDOUT_EVERY) and len(train) + len(held) == len(text.clauses())
    eos = len(words) - 1
    for seqs in (train, held):
        assert all(2 < len(s) <= text.MAX_LEN and s[-1] == eos and eos not in s[:-1] for s in seqs)
    assert text.decode(text.encode("if the")) == "if the"
    assert text.encode("if the zzzqx") == text.encode("if the") + (len(words) - 2,)
    for prompt in text.PROMPTS:
        assert len(words) - 2 not in text.encode(prompt), prompt


def test_cut_drops_code_and_packs_clauses():
    doc = ("Return the value, or None if it is missing. Then stop.\n\n"
           "   >>> f(1)\n   2\n\n" + "Heading\n*******\n\n" + ", ".join(["one two three four five"] * 5) + ".")
    got = text.clauses_of(doc)
    assert got[:2] == [("return", "the", "value", "or", "none", "if", "it", "is", "missing"), ("then", "stop")]
    assert all(len(c) <= text.MAX_WORDS for c in got) and len(got) == 4  # 5 pieces of 5 words: 15 + 10


@pytest.mark.slow
def test_quick_models_prove_a_small_query():
    """About 30 s of CPU on a cold compile cache, most of it compiling (training, distilling, the
    proof over a 3,210-word vocabulary)."""
    from jaxrescore import RescoredIndex, SeekIndex
    from jaxrescore.baselines.best_first import best_first_top_k

    setup = text.setups()["quick"]
    target, student, _ = text.load_or_train(setup, None)
    nll = text.heldout_nll({"target": target, "student": student, "n-gram": text.fit_draft(setup)})
    assert all(np.isfinite(v) and 0 < v < np.log(len(text.vocabulary())) + 1 for v in nll.values()), nll
    prompt = text.encode(text.PROMPTS[1])
    t_p, d_p = target.with_prompt(prompt), student.with_prompt(prompt)
    exact = best_first_top_k(t_p, 5, batch=5).items
    got = RescoredIndex(SeekIndex(d_p, progress=False), t_p, rerank_window=32, draft_model=d_p).top_k(5, prove=True)
    assert got.proven
    assert [s for s, _ in got.items] == [s for s, _ in exact]
    np.testing.assert_allclose([lp for _, lp in got.items], [lp for _, lp in exact], atol=1e-3)
