"""Beam search (jaxrescore.baselines.beam_search) against brute force on tiny models.

Oracles: the whole support listed (``tests/brute.py``) and a plain-Python beam search with the
same rules and no early stop. What must hold: with B >= the support's size the answer is the exact
top-B; with a smaller B every item is a support sequence with its true score, best first (recall
may be < 1, and is on some of these models); the jitted and generic paths agree.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from brute import TableModel, as_model

from jaxrescore.baselines import beam_search
from jaxrescore.baselines.beam import BeamResult
from jaxrescore.models import TransformerConfig, TransformerLM


def exact(table: TableModel):
    """The whole support, best first."""
    return sorted(((s, table.log_prob(s)) for s in table.support()), key=lambda x: -x[1])


def reference_beam(table: TableModel, beam: int, prompt=()):
    """Plain beam search over a TableModel: B best live prefixes per step, eos moves a prefix to
    the finished pool (kept to B), runs to max_len (no early stop)."""
    v, eos, max_len = table.vocab_size, table.eos, table.max_len - len(prompt)
    alive, finished = [((), 0.0)], []
    for j in range(max_len):
        cands = []
        for prefix, lp in alive:
            row = np.minimum(table.steps[tuple(prompt) + prefix], 0.0)
            for t in range(v):
                cands.append((prefix + (t,), lp + float(row[t])))
        last = j == max_len - 1
        if eos is None:
            if last:
                finished = cands
                break
            grow = cands
        else:
            finished += [c for c in cands if c[0][-1] == eos]
            grow = [] if last else [c for c in cands if c[0][-1] != eos]
        finished = sorted(finished, key=lambda c: -c[1])[:beam]
        alive = sorted(grow, key=lambda c: -c[1])[:beam]
    return sorted(finished, key=lambda c: -c[1])[:beam]


def same(items, expected, tol=1e-5):
    assert [s for s, _ in items] == [s for s, _ in expected]
    np.testing.assert_allclose([lp for _, lp in items], [lp for _, lp in expected], atol=tol)


@pytest.mark.parametrize("eos", [None, 2])
@pytest.mark.parametrize("seed", range(4))
def test_generic_exact_when_beam_covers_support(seed, eos):
    table = TableModel(3, 4, seed, eos=eos)
    truth = exact(table)
    out = beam_search(as_model(table, batched=True), len(truth))
    assert isinstance(out, BeamResult)
    same(out.items, truth)
    # Nothing pruned: every live prefix was expanded once per step.
    prefixes = [p for p in table.steps if len(p) < table.max_len]
    assert out.rows == len(prefixes)
    assert out.positions == sum(len(p) + 1 for p in prefixes)
    assert out.calls == table.max_len


@pytest.mark.parametrize("eos", [None, 3])
def test_generic_small_beam_scores_true_and_recall_can_drop(eos):
    recalls = []
    for seed in range(12):
        table = TableModel(4, 4, seed, eos=eos, temperature=0.7)
        truth = exact(table)
        for beam in (1, 2, 4):
            out = beam_search(as_model(table, batched=True), beam)
            assert 1 <= len(out.items) <= beam
            lps = [lp for _, lp in out.items]
            assert lps == sorted(lps, reverse=True)
            for seq, lp in out.items:  # never a wrong score, never a sequence outside the support
                assert lp == pytest.approx(table.log_prob(seq), abs=1e-5)
            same(out.items, reference_beam(table, beam))
            top = {s for s, _ in truth[: len(out.items)]}
            recalls.append(len(top & {s for s, _ in out.items}) / len(out.items))
    assert min(recalls) < 1.0, "no model made beam search miss: the test cannot see recall"
    assert max(recalls) == 1.0


def test_generic_prompt_and_early_stop():
    table = TableModel(4, 6, 3, eos=0)
    for prefix, row in table.steps.items():  # eos made likely: the finished pool fills early
        boosted = row.copy()
        boosted[0] += 2.0
        table.steps[prefix] = boosted - np.logaddexp.reduce(boosted)
    prompt = (2, 1)
    model = as_model(table, batched=True)
    out = beam_search(model, 3, prompt=prompt)
    same(out.items, reference_beam(table, 3, prompt))
    assert out.stopped_early and out.calls < table.max_len - len(prompt)
    assert beam_search(model.with_prompt(prompt), 3).items == out.items
    # Exhaustive over the continuations: every continuation prefix evaluated once, each costing
    # the prompt, its own tokens and BOS.
    conts = [p[len(prompt):] for p in table.steps if p[: len(prompt)] == prompt and len(p) < table.max_len]
    full = beam_search(model, 4 ** 3, prompt=prompt)
    given = float(np.minimum(table.step_lps(prompt), 0.0).sum())
    truth = sorted(((c, table.log_prob(prompt + c) - given) for c in _continuations(table, prompt)), key=lambda x: -x[1])
    same(full.items, truth)
    assert full.rows == len(conts)
    assert full.positions == sum(len(prompt) + len(c) + 1 for c in conts)


def _continuations(table, prompt):
    body = [t for t in range(table.vocab_size) if t != table.eos]
    room = table.max_len - len(prompt)
    return [b + (table.eos,) for n in range(room) for b in itertools.product(body, repeat=n)]


@pytest.fixture(scope="module")
def tiny_lm():
    cfg = TransformerConfig(vocab_size=5, d_model=16, n_layers=1, n_heads=2, max_len=5, eos=4)
    return TransformerLM(cfg, seed=3)


def lm_support(lm):
    v, eos = lm.vocab_size, lm.eos
    body = [t for t in range(v) if t != eos]
    return [b + (eos,) for n in range(lm.max_len) for b in itertools.product(body, repeat=n)]


def test_jitted_exact_when_beam_covers_support(tiny_lm):
    support = lm_support(tiny_lm)  # 341 sequences
    scores = tiny_lm.score_sequences(support)
    order = np.argsort(-scores, kind="stable")
    out = beam_search(tiny_lm, 512, jit=True)
    assert len(out.items) == len(support)
    assert {s for s, _ in out.items} == set(support)
    got = dict(out.items)
    np.testing.assert_allclose([got[support[i]] for i in order], scores[order], atol=1e-4)
    np.testing.assert_allclose([lp for _, lp in out.items], scores[order], atol=1e-4)


def test_jitted_matches_generic(tiny_lm):
    for beam in (1, 3, 16):
        a = beam_search(tiny_lm, beam)
        b = beam_search(tiny_lm, beam, jit=False)
        same(a.items, b.items, tol=1e-4)
        assert (a.calls, a.rows, a.positions, a.stopped_early) == (b.calls, b.rows, b.positions, b.stopped_early)
        np.testing.assert_allclose(tiny_lm.score_sequences([s for s, _ in a.items]), [lp for _, lp in a.items],
                                   atol=1e-4)


def test_jitted_prompt(tiny_lm):
    prompt = (1, 2)
    a = beam_search(tiny_lm.with_prompt(prompt), 4)
    b = beam_search(tiny_lm, 4, prompt=prompt)
    c = beam_search(tiny_lm.with_prompt(prompt), 4, jit=False)
    d = beam_search(tiny_lm.with_prompt((1,)), 4, prompt=(2,))
    same(a.items, b.items, tol=1e-6)
    same(a.items, c.items, tol=1e-4)
    same(a.items, d.items, tol=1e-6)
    cond = tiny_lm.with_prompt(prompt).score_sequences([s for s, _ in a.items])
    np.testing.assert_allclose(cond, [lp for _, lp in a.items], atol=1e-4)
    assert all(len(s) <= tiny_lm.max_len - len(prompt) and s[-1] == tiny_lm.eos for s, _ in a.items)


def test_jitted_keeps_the_prompts_max_new_tokens(tiny_lm):
    """A prompt's max_new_tokens caps the jitted search as it caps the model (the base's max_len
    ran instead: thousands of steps on a real LM's 8,192-token context)."""
    capped = tiny_lm.with_prompt((1,), max_new_tokens=2)
    a, c = beam_search(capped, 4), beam_search(capped, 4, jit=False)
    same(a.items, c.items, tol=1e-4)
    assert a.calls <= 2 and all(len(s) <= 2 for s, _ in a.items)
    np.testing.assert_allclose(capped.score_sequences([s for s, _ in a.items]), [lp for _, lp in a.items], atol=1e-4)


def test_jitted_fixed_length():
    cfg = TransformerConfig(vocab_size=4, d_model=16, n_layers=1, n_heads=2, max_len=3, eos=None)
    lm = TransformerLM(cfg, seed=5)
    support = list(itertools.product(range(4), repeat=3))
    scores = lm.score_sequences(support)
    out = beam_search(lm, 64)
    assert sorted(s for s, _ in out.items) == support
    np.testing.assert_allclose(sorted((lp for _, lp in out.items), reverse=True), np.sort(scores)[::-1], atol=1e-4)
    small, generic = beam_search(lm, 2), beam_search(lm, 2, jit=False)
    same(small.items, generic.items, tol=1e-4)
    assert all(len(s) == 3 for s, _ in small.items)


@pytest.mark.parametrize("bad", [0, -1, True, 2.5, "4", None])
def test_bad_beam_width(bad, tiny_lm):
    with pytest.raises(ValueError, match="beam_width"):
        beam_search(tiny_lm, bad)


def test_bad_arguments(tiny_lm):
    table = as_model(TableModel(3, 3, 0, eos=2), batched=True)
    with pytest.raises(TypeError, match="jit=True"):
        beam_search(table, 2, jit=True)
    with pytest.raises(ValueError, match="jit"):
        beam_search(tiny_lm, 2, jit="yes")
    # a prompt may hold eos (a chat prompt ends the user's turn with it): its continuations
    assert beam_search(tiny_lm, 2, prompt=(1, tiny_lm.eos))
    with pytest.raises(ValueError, match="max_len"):
        beam_search(tiny_lm, 2, prompt=(1, 1, 1, 1, 1))
    with pytest.raises(TypeError, match="prompt"):
        beam_search(tiny_lm, 2, prompt="ab")
