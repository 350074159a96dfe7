"""jaxrescore.top_k for real LMs: a network draft that speculates from the root (no index),
draft=None, max_new_tokens, budgets that bound every piece of a query's work (the draft index's
growth included) and the terminal's status line. Every proven answer is checked against the
target's whole support, listed."""

import itertools
import math
import time

import numpy as np
import pytest

import jaxrescore
from jaxrescore.index import SeekIndex
from jaxrescore.models import CallableModel
from jaxrescore.models.transformer import TransformerConfig, TransformerLM
from jaxrescore.rescore import RescoredIndex, progress
from jaxrescore.rescore.draft import SpeculativeDraft
from jaxrescore.rescore.queries import search_budget
from jaxrescore.rescore.seed import seed_of


def lm(seed: int, eos, max_len: int = 4, vocab: int = 4) -> TransformerLM:
    return TransformerLM(TransformerConfig(vocab_size=vocab, d_model=32, n_layers=1, n_heads=2, max_len=max_len,
                                           eos=eos), seed=seed)


def support(vocab: int, eos, length: int) -> list:
    """Every sequence of at most ``length`` tokens (ending with ``eos``, none before) or, without
    eos, of exactly ``length`` tokens."""
    if eos is None:
        return list(itertools.product(range(vocab), repeat=length))
    body = [t for t in range(vocab) if t != eos]
    return [tuple(p) + (eos,) for n in range(length) for p in itertools.product(body, repeat=n)]


def exact_top(model, k: int, length: int) -> list:
    seqs = support(model.vocab_size, model.eos, length)
    scores = np.asarray(model.score_sequences(seqs), np.float64)
    order = np.argsort(-scores, kind="stable")[:k]
    return [(seqs[i], scores[i]) for i in order]


def assert_exact(result, truth) -> None:
    assert result.proven, result.proof_reason
    np.testing.assert_allclose([lp for _, lp in result.items], [lp for _, lp in truth], atol=1e-4)
    assert [s for s, _ in result.items] == [s for s, _ in truth]


@pytest.mark.parametrize("eos", [0, None])
@pytest.mark.parametrize("prompt", [None, (2,)])
def test_a_network_draft_speculates_from_the_root_and_proves_the_exact_top_k(eos, prompt):
    target, draft = lm(3, eos), lm(11, eos)
    model = target if prompt is None else target.with_prompt(prompt)
    truth = exact_top(model, 5, model.max_len)
    result = jaxrescore.top_k(target, draft, 5, prompt=prompt)
    assert_exact(result, truth)
    # no index: nothing is ranked by it; the draft scored only its own top-5 (the search's first
    # sequences, see rescore.seed) and was never asked to re-score what the search found
    assert all(d is None for d in result.draft_ranks)
    d_model = draft if prompt is None else draft.with_prompt(prompt)
    own = dict(exact_top(d_model, 5, d_model.max_len))
    lps = np.asarray(result.draft_log_probs, np.float64)
    for (seq, _), lp in zip(result.items, lps):
        assert np.isnan(lp) if seq not in own else abs(lp - own[seq]) < 1e-4
    # the SeekIndex route gives the same answer
    assert_exact(jaxrescore.top_k(target, draft, 5, prompt=prompt, index="seek"), truth)


@pytest.mark.parametrize("eos", [0, None])
def test_max_new_tokens_caps_the_support_and_no_draft_lets_the_target_speculate(eos):
    target, draft = lm(5, eos, max_len=5), lm(6, eos, max_len=5)
    capped = target.with_prompt((1,), max_new_tokens=2)
    assert capped.max_len == 2
    truth = exact_top(capped, 4, 2)
    assert_exact(jaxrescore.top_k(target, draft, 4, prompt=(1,), max_new_tokens=2), truth)
    assert_exact(jaxrescore.top_k(target, None, 4, prompt=(1,), max_new_tokens=2), truth)
    assert_exact(jaxrescore.top_k(target, None, 4, max_new_tokens=3), exact_top(target.with_prompt((), max_new_tokens=3), 4, 3))
    with pytest.raises(ValueError, match="max_new_tokens"):
        jaxrescore.top_k(target, draft, 4, max_new_tokens=0)
    with pytest.raises(ValueError, match="index"):
        jaxrescore.top_k(target, draft, 4, index="fast")


def test_a_speculating_search_starts_from_the_drafts_own_top_k():
    """The draft's exact top-k by best-first (its rows only) are the first sequences scored, and
    its k-th score the aim (rescore.seed); its rows are bounded by the budget."""
    target, draft = lm(3, 0, max_len=5), lm(11, 0, max_len=5)
    index = RescoredIndex(SpeculativeDraft(draft), target)
    seed = seed_of(index, 4, search_budget(8, None, 0, 4))
    truth = exact_top(draft, 4, 5)
    assert seed.seqs == [s for s, _ in truth]
    np.testing.assert_allclose(seed.draft_lps, [lp for _, lp in truth], atol=1e-5)
    assert seed.aim == seed.draft_lps[-1]
    rows = []
    counted = CallableModel(lambda p, n: rows.append(len(n)) or draft.next_logprobs(p, n), vocab_size=4,
                            max_len=5, eos=0, batched=True)
    small = seed_of(RescoredIndex(SpeculativeDraft(counted), target), 4, search_budget(8, 3, 0, 4))
    assert sum(rows) <= 3 and len(small.seqs) < 4 and small.aim == -math.inf
    # no draft (the target speculates): its own best-first would be the whole search, uncounted
    assert seed_of(RescoredIndex(SpeculativeDraft(target), target), 4, search_budget(8, None, 0, 4)).seqs == []
    # an index that lists sequences is not seeded
    assert seed_of(RescoredIndex(SeekIndex(draft, progress=False), target), 4, search_budget(8, None, 0, 4)).seqs == []


@pytest.mark.parametrize("seed", range(6))
def test_a_draft_that_overrates_its_answer_never_stops_a_proof(seed):
    """A draft whose own top-k the target scores far lower: its aim lies above every open exit,
    and the search goes on below it (every answer proven and exact)."""
    target = lm(seed, 0, max_len=5, vocab=5)

    def reversed_rows(prefixes, lengths):  # the target's rows turned upside down
        rows = -np.asarray(target.next_logprobs(prefixes, lengths), np.float64)
        return (rows - np.log(np.exp(rows).sum(-1, keepdims=True))).astype(np.float32)

    draft = CallableModel(reversed_rows, vocab_size=5, max_len=5, eos=0, batched=True)
    truth = exact_top(target, 6, 5)
    assert_exact(jaxrescore.top_k(target, draft, 6), truth)
    assert_exact(RescoredIndex(SpeculativeDraft(draft), target).top_k(6, prove=True), truth)


def test_budgets_end_the_search_with_the_budget_named():
    target, draft = lm(3, 0, max_len=6, vocab=6), lm(11, 0, max_len=6, vocab=6)
    r = jaxrescore.top_k(target, draft, 20, max_rounds=1)
    assert r.proven is False and "max_rounds=1" in r.proof_reason
    r = jaxrescore.top_k(target, draft, 20, max_seconds=1e-6)
    assert r.proven is False and "max_seconds=1e-06" in r.proof_reason
    with pytest.raises(ValueError, match="max_seconds"):
        jaxrescore.top_k(target, draft, 2, max_seconds=0)


def near_uniform(vocab: int, seed: int, max_len: int = 6) -> CallableModel:
    """A GPT-2-sized vocabulary with rows a hair from uniform (the worst case for any index:
    every prefix has ~V children of about the same probability)."""
    noise = np.random.default_rng(seed).normal(size=vocab).astype(np.float32) * 0.01

    def rows(prefixes, lengths):
        logits = noise[None, :] + 0.001 * np.asarray(lengths, np.float32)[:, None]
        return (logits - np.log(np.exp(logits).sum(-1, keepdims=True))).astype(np.float32)

    return CallableModel(rows, vocab_size=vocab, max_len=max_len, eos=0, batched=True)


def test_a_near_uniform_large_vocabulary_pair_stops_at_its_budget():
    """V = 50,257 and rows near uniform: the draft index alone would need billions of rows.
    Under a small budget the call returns, unproven, with the budget named, and the index grew
    by no more model rows than the budget allows."""
    target, draft = near_uniform(50257, 0), near_uniform(50257, 1)
    index = SeekIndex(draft, progress=False)
    before = index.forwards
    t = time.monotonic()
    r = jaxrescore.top_k(target, index, 5, max_rounds=2, max_sequences=256)
    assert time.monotonic() - t < 120  # not a timing claim: a build that ignored the budget ran for minutes
    assert r.proven is False and ("max_rounds=2" in r.proof_reason or "max_sequences=256" in r.proof_reason), r.proof_reason
    assert index.forwards - before <= 256
    r = jaxrescore.top_k(target, draft, 5, max_seconds=2.0, max_sequences=4096)
    assert r.proven is False and "max_" in r.proof_reason


def test_ensure_count_with_a_row_cap_stops_growth_without_error():
    draft = near_uniform(300, 2, max_len=4)
    index = SeekIndex(draft, progress=False, initial_bits=0.0)
    before = index.forwards
    index.ensure_count(10 ** 6, max_rows=50)
    assert index.forwards - before <= 50 and len(index) < 10 ** 6
    with pytest.raises(ValueError, match="max_rows"):
        index.ensure_count(10, max_rows=-1)


def test_a_terminal_shows_each_round(monkeypatch, capsys):
    monkeypatch.setenv(progress.PROGRESS_ENV, "1")
    monkeypatch.setattr(progress, "QUIET_SECONDS", 0.0)
    target, draft = lm(3, 0), lm(11, 0)
    jaxrescore.top_k(target, draft, 5)
    err = capsys.readouterr().err
    assert "jaxrescore: round 2 of at most" in err and err.endswith("\r\033[K")
    monkeypatch.setenv(progress.PROGRESS_ENV, "0")
    jaxrescore.top_k(target, draft, 5)
    assert capsys.readouterr().err == ""


def test_a_budget_stop_is_never_a_wrong_proof():
    """Whatever budget stops it, a search's verdict is True only on the exact answer."""
    target, draft = lm(7, 0, max_len=5), lm(8, 0, max_len=5)
    truth = exact_top(target, 6, 5)
    for rounds in range(1, 6):
        r = jaxrescore.top_k(target, draft, 6, max_rounds=rounds)
        if r.proven:
            assert_exact(r, truth)
        else:
            assert f"max_rounds={rounds}" in r.proof_reason
    assert math.isfinite(truth[-1][1])
