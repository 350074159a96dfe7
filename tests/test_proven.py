"""The assumption-free proof (``proven``) and the speculative exact search, against brute force.

Every model here is small enough to list its whole support, so "the target's exact top-k" is a
sorted list. Drafts range from good to adversarial (every preference reversed); the proof must
never hold on a wrong answer, and ``prove=True`` must always reach one on these supports.
"""

import math

import numpy as np
import pytest

from brute import BruteIndex, TableModel, as_model, keep_only_exits, reversed_pair
from jaxrescore import RescoredIndex, SeekIndex, rescore_many
from jaxrescore.rescore import frontier as frontier_mod
from jaxrescore.rescore.growing import GrowingFrontier

TIE_TOL = 1e-9


def draft_for(target, kind, seed):
    """A draft table for ``target``: 'good' (small noise), 'noisy', 'useless' (independent),
    'adversarial' (preferences reversed)."""
    if kind == "adversarial":
        return reversed_pair(target, seed)
    if kind == "useless":
        return TableModel(target.vocab_size, target.max_len, seed, eos=target.eos)
    noise = {"good": 0.1, "noisy": 1.0}[kind]
    return TableModel(target.vocab_size, target.max_len, seed, eos=target.eos, base=target, noise=noise)


def is_exact_slice(result, target, start, k):
    """Tie-aware: the returned scores are the true ranks ``[start, start + k)`` and every item is
    a distinct support sequence with the score the target gives it (the target model's own
    float32 rows, summed in float64, over its whole support)."""
    support = target.support()
    truth = dict(zip(support, as_model(target).score_sequences(support)))
    want = sorted(truth.values(), reverse=True)[start : start + k]
    got = [lp for _, lp in result.items]
    if len(got) != len(want) or len({s for s, _ in result.items}) != len(got):
        return False
    if any(s not in truth or abs(truth[s] - lp) > TIE_TOL for s, lp in result.items):
        return False
    return bool(np.all(np.abs(np.array(got) - np.array(want)) <= TIE_TOL))


CASES = [
    (vocab, max_len, eos, kind, seed)
    for seed in range(3)
    for vocab, max_len, eos in ((3, 4, None), (4, 3, None), (3, 5, 2), (4, 4, 0))
    for kind in ("good", "noisy", "useless", "adversarial")
]


def battery(cases, *, windows=(0, 3), slices=((0, 1), (0, 4), (2, 3)), top_m=32, index="seek", branch=1):
    """Run plain and proving queries; returns (wrong proofs, unproven searches, queries)."""
    wrong, unproven, n = [], [], 0
    for vocab, max_len, eos, kind, seed in cases:
        target = TableModel(vocab, max_len, 100 + seed, eos=eos, temperature=2.0)
        draft = draft_for(target, kind, 200 + seed)
        t_model, d_model = as_model(target), as_model(draft)
        for window in windows:
            for start, k in slices:
                idx = SeekIndex(d_model) if index == "seek" else BruteIndex(draft, budget_bits=6)
                ri = RescoredIndex(idx, t_model, rerank_window=window, top_m=top_m, draft_model=d_model,
                                   completion_branch=branch)
                for prove in (False, True):
                    r = ri.slice(start, k, prove=prove)
                    n += 1
                    if r.proven and not is_exact_slice(r, target, start, k):
                        wrong.append((vocab, max_len, eos, kind, seed, window, start, k, prove))
                    if prove and not r.proven:
                        unproven.append((vocab, max_len, eos, kind, seed, window, start, k, r.proof_reason))
    return wrong, unproven, n


def test_proof_never_wrong_and_search_always_proves():
    wrong, unproven, n = battery(CASES)
    assert n == len(CASES) * 2 * 3 * 2
    assert wrong == []
    assert unproven == []


def test_narrow_top_m_fetches_rows_and_still_proves():
    """top_m=1 leaves almost every exit a "rest" exit: the search fetches full rows for them."""
    cases = [c for c in CASES if c[4] == 0 and c[3] in ("noisy", "adversarial")]
    wrong, unproven, _ = battery(cases, windows=(1,), slices=((0, 3), (1, 2)), top_m=1)
    assert wrong == [] and unproven == []


def test_small_best_first_completions_prove_too():
    cases = [c for c in CASES if c[4] == 2 and c[3] in ("useless", "adversarial")]
    wrong, unproven, _ = battery(cases, windows=(0,), slices=((0, 3),), branch=3)
    assert wrong == [] and unproven == []


def test_any_draft_index_even_without_a_model_or_bound():
    """A foreign index whose model cannot complete prefixes: the search completes with the
    target itself, and the proof does not depend on the index's order or bound."""
    cases = [c for c in CASES if c[4] == 1]
    wrong, unproven, _ = battery(cases, windows=(2,), slices=((0, 3),), index="brute")
    assert wrong == [] and unproven == []


@pytest.mark.parametrize(
    "name, keep",
    [
        ("drop the root's exits", lambda ex, st: ex.depth > 0),
        ("drop eos exits", lambda ex, st: ex.token != st.eos),
        ("drop rest exits", lambda ex, st: ex.token != frontier_mod.REST),
        ("drop named exits", lambda ex, st: (ex.token < 0) | (ex.token == st.eos)),
    ],
)
def test_unsound_variants_are_caught(monkeypatch, name, keep):
    keep_only_exits(monkeypatch, keep)
    cases = [c for c in CASES if c[2] is not None or name != "drop eos exits"]
    top_m = 1 if name == "drop rest exits" else 32
    wrong, _, _ = battery(cases, windows=(0,), slices=((0, 1), (0, 4)), top_m=top_m)
    assert wrong, f"the battery did not catch the unsound variant: {name}"


def test_plain_query_reports_frontier_at_no_extra_call():
    target = TableModel(3, 4, 7, eos=None)
    draft = draft_for(target, "good", 8)
    ri = RescoredIndex(SeekIndex(as_model(draft)), as_model(target), rerank_window=200)
    r = ri.top_k(3)
    assert ri.target_calls == 1 and r.rounds == 1
    # The window covers the whole support (81 sequences): the bound is -inf, the proof exact.
    assert r.proven is True and r.frontier_bound == -math.inf and is_exact_slice(r, target, 0, 3)


def test_bare_callable_target_gives_proven_none():
    target = TableModel(3, 3, 1)
    ri = RescoredIndex(SeekIndex(as_model(draft_for(target, "good", 2))), target, rerank_window=2)
    r = ri.top_k(2)
    assert r.proven is None and r.frontier_bound is None and "no score_frontier" in r.proof_reason
    r = ri.top_k(2, prove=True)
    assert r.proven is None


def test_budgets_stop_the_search_with_a_reason():
    target = TableModel(4, 4, 3, temperature=0.5)
    draft = draft_for(target, "adversarial", 4)
    ri = RescoredIndex(SeekIndex(as_model(draft)), as_model(target), rerank_window=0)
    r = ri.top_k(3, prove=True, max_rounds=1)
    assert r.proven is False and "max_rounds=1" in r.proof_reason and r.rounds == 1
    r = ri.top_k(3, prove=True, max_sequences=5)
    assert r.proven is False and "max_sequences=5" in r.proof_reason
    with pytest.raises(ValueError, match="max_rounds"):
        ri.top_k(3, prove=True, max_rounds=0)
    # The budget counts every row the target evaluates, fetched next-token rows included
    # (top_m=1 makes the search fetch full rows for its "rest" exits).
    for budget in (5, 12, 30):
        narrow = RescoredIndex(SeekIndex(as_model(draft)), as_model(target), rerank_window=0, top_m=1)
        r = narrow.top_k(3, prove=True, max_sequences=budget)
        assert narrow.target_sequences <= budget and (r.proven or f"max_sequences={budget}" in r.proof_reason)
    with pytest.raises(ValueError, match="prove"):
        ri.top_k(3, prove="yes")


def test_search_counts_its_cost_and_scores_only_new_sequences():
    target = TableModel(3, 5, 11, eos=2, temperature=2.0)
    draft = draft_for(target, "noisy", 12)
    t_model = as_model(target)
    seen = []
    real = type(t_model).score_frontier

    def spy(self, seqs, **kw):
        seen.append([tuple(s) for s in seqs])
        return real(self, seqs, **kw)

    ri = RescoredIndex(SeekIndex(as_model(draft)), t_model, rerank_window=1)
    type(t_model).score_frontier = spy
    try:
        r = ri.top_k(4, prove=True)
    finally:
        type(t_model).score_frontier = real
    flat = [s for call in seen for s in call]
    assert len(flat) == len(set(flat)), "a sequence was scored twice"
    assert r.proven and is_exact_slice(r, target, 0, 4)
    assert r.rounds == len(seen) and ri.target_calls >= r.rounds
    assert ri.target_sequences == len(flat)
    assert all(rank is None or rank >= 0 for rank in r.draft_ranks)


def test_prompted_models_and_rescore_many():
    target = TableModel(3, 5, 21, eos=2, temperature=2.0)
    draft = draft_for(target, "noisy", 22)
    t_model, d_model = as_model(target), as_model(draft)
    prompts = [(0,), (1, 0), ()]
    fresh = [
        RescoredIndex(SeekIndex(d_model.with_prompt(p)), t_model.with_prompt(p), rerank_window=2) for p in prompts
    ]
    joint = rescore_many(fresh, 2)
    for p, r, ri in zip(prompts, joint, fresh):
        conts = [s[len(p):] for s in target.support() if s[: len(p)] == p and len(s) > len(p)]
        want = sorted((target.log_prob(p + c) for c in conts), reverse=True)
        assert ri.target_calls == 1 and r.proven is not None
        alone = RescoredIndex(SeekIndex(d_model.with_prompt(p)), t_model.with_prompt(p), rerank_window=2).top_k(2, prove=True)
        assert alone.proven is True
        prefix_lp = float(np.sum(target.step_lps(p))) if p else 0.0
        got = [lp + prefix_lp for _, lp in alone.items]
        np.testing.assert_allclose(got, want[:2], atol=1e-9)
        if r.proven:
            np.testing.assert_allclose([lp + prefix_lp for _, lp in r.items], want[:2], atol=1e-9)


def test_proof_holds_over_a_reference_style_foreign_index():
    """A foreign index (quantizer + truncation reports, no bucket_bound, a per-prefix model):
    the proof needs none of it."""
    target = TableModel(3, 4, 31, temperature=2.0)
    draft = draft_for(target, "noisy", 32)
    idx = BruteIndex(draft, with_bound=False)
    ri = RescoredIndex(idx, as_model(target), rerank_window=0, assumed_gap=0.5)
    r = ri.top_k(3, prove=True)
    assert r.proven is True and is_exact_slice(r, target, 0, 3)


def test_transformer_target_with_int8_and_ngram_drafts():
    """A real JAX target (on-device top-m reduction) proven against brute force over its whole
    support, through an int8-twin draft and an n-gram draft fitted on its samples."""
    import itertools

    from jaxrescore import NGramLM, TransformerConfig, TransformerLM, quantize_int8
    from jaxrescore.models.generate import sample_sequences

    cfg = TransformerConfig(vocab_size=4, d_model=16, n_layers=1, n_heads=2, max_len=4, eos=0)
    target = TransformerLM(cfg, seed=3)
    # Sharpen the untrained model so answers are separated by more than its tolerance.
    target.params = __import__("jax").tree.map(lambda x: x * 3.0, target.params)
    support = [b + (0,) for n in range(4) for b in itertools.product(range(1, 4), repeat=n)]
    truth = np.sort(target.score_sequences(support))[::-1]
    ngram = NGramLM.fit(sample_sequences(target, 200, seed=0), order=2, vocab_size=4, eos=0, max_len=4)
    for draft in (quantize_int8(target), ngram):
        for k in (1, 6):
            ri = RescoredIndex(SeekIndex(draft), target, rerank_window=1)
            r = ri.top_k(k, prove=True)
            assert r.proven is True, r.proof_reason
            assert all(s in support for s, _ in r.items)
            np.testing.assert_allclose([lp for _, lp in r.items], truth[:k], atol=1e-4)
            assert ri.target_calls == r.rounds


def test_rescore_many_searches_every_prompt_with_one_call_per_round():
    target = TableModel(3, 5, 41, eos=2, temperature=2.0)
    draft = draft_for(target, "useless", 42)
    t_model, d_model = as_model(target), as_model(draft)
    prompts = [(0,), (1, 0), (), (1,)]
    calls = []
    real = type(t_model).score_frontier

    def spy(self, seqs, **kw):
        calls.append(len(seqs))
        return real(self, seqs, **kw)

    joint = [RescoredIndex(SeekIndex(d_model.with_prompt(p)), t_model.with_prompt(p), rerank_window=0) for p in prompts]
    type(t_model).score_frontier = spy
    try:
        results = rescore_many(joint, 3, prove=True)
    finally:
        type(t_model).score_frontier = real
    assert len(calls) == max(r.rounds for r in results)
    for p, r in zip(prompts, results):
        alone = RescoredIndex(SeekIndex(d_model.with_prompt(p)), t_model.with_prompt(p), rerank_window=0).top_k(3, prove=True)
        assert r.proven is True and alone.proven is True
        np.testing.assert_allclose([lp for _, lp in r.items], [lp for _, lp in alone.items], atol=1e-9)


def test_proof_over_the_envelope_index():
    """The envelope index's order is only approximate (never certifies), but the proof does not
    depend on the draft's order: it holds over the envelope too."""
    from jaxrescore import AREnvelopeIndex

    for eos, seed in ((None, 51), (2, 52)):
        target = TableModel(3, 4, seed, eos=eos, temperature=2.0)
        draft = draft_for(target, "noisy", seed + 1)
        env = AREnvelopeIndex(as_model(draft), n_paths=16, seed=0)
        ri = RescoredIndex(env, as_model(target), rerank_window=2, assumed_gap=100.0)
        for k in (1, 4):
            r = ri.top_k(k, prove=True)
            assert r.proven is True and is_exact_slice(r, target, 0, k), r.proof_reason
            plain = ri.top_k(k)
            assert plain.certified is not True or "exhausted" in plain.reason


def test_exits_listed_above_a_floor_are_the_whole_list_cut_at_it(monkeypatch):
    """The frontier lists only the exits worth at least the search's floor (and the best ones):
    exactly what cutting the whole list gives, on every frontier of proving searches over small
    supports (floors from -inf to above every exit, NaN lists everything)."""
    from jaxrescore.rescore import proof as proof_mod

    real, seen = frontier_mod.frontier, []

    def compare(s, structure, floor=-math.inf, **checked):
        got = real(s, structure, floor, **checked)
        if s.tokens.shape[0]:
            _, _, values = frontier_mod.frontier_values(s, np.ones(s.tokens.shape[0], bool),
                                                       *frontier_mod.structure_numbers(structure))
            for f in (floor, -math.inf, got.bound + 1.0, float("nan")):
                want = frontier_mod.exit_list(values, structure)
                want = frontier_mod._at_least(want, f) if f == f else want
                cut = frontier_mod.exit_list(values, structure, f)
                cut = frontier_mod._at_least(cut, f) if f == f else cut
                assert all(np.array_equal(a, b) for a, b in zip(cut, want)), f
            seen.append(floor)
        return got

    monkeypatch.setattr(proof_mod, "frontier", compare)
    # the searches' frontiers, round by round, are whole ones here (growing ones: the next test)
    monkeypatch.setattr(GrowingFrontier, "__call__", lambda self, s, structure, floor: compare(s, structure, floor))
    wrong, unproven, n = battery(CASES[::5], windows=(0,), slices=((0, 4),))
    assert not wrong and not unproven
    assert len(seen) > 20 and any(math.isfinite(f) for f in seen)


def test_searches_growing_frontiers_are_the_whole_ones(monkeypatch):
    """Every frontier a proving search computes round by round, only where its scored set grew
    (rescore/growing.py), is the whole computation's: the same bound, the same exits in the same
    order, and a ``moved`` at least its."""
    real, rounds = GrowingFrontier.__call__, []

    def compare(self, s, structure, floor=-math.inf):
        got = real(self, s, structure, floor)
        want = frontier_mod.frontier(s, structure, floor, rows_checked=True)
        assert got.bound == want.bound and got.moved >= want.moved
        assert all(np.array_equal(a, b) for a, b in zip(got.exits, want.exits))
        rounds.append(s.tokens.shape[0])
        return got

    monkeypatch.setattr(GrowingFrontier, "__call__", compare)
    wrong, unproven, n = battery(CASES[::3], windows=(0,), slices=((0, 4), (2, 3)))
    assert not wrong and not unproven
    assert len(rounds) > 40


def test_named_children_match_the_tries_edges(monkeypatch):
    """Which top-m names of a node are its children (they are no exits) is looked up per child
    edge, not per name: on every frontier of proving searches it equals the trie's own edges
    (every (node[r, d], token[r, d]) with a node at depth d + 1), read one by one."""
    real, calls = frontier_mod._named_children, []

    def compare(ops, node, new, srt, at_node, ok, toks):
        got = real(ops, node, new, srt, at_node, ok, toks)
        r, d = np.nonzero(node[:, 1:] >= 0)
        edges = set(zip(node[r, d].tolist(), srt[r, d].tolist()))
        want = np.array([[bool(ok[k]) and (int(at_node[k]), int(t)) in edges for t in toks[k]]
                         for k in range(toks.shape[0])], bool).reshape(toks.shape)
        assert np.array_equal(got & ok[:, None], want)
        calls.append(int(want.sum()))
        return got

    monkeypatch.setattr(frontier_mod, "_named_children", compare)
    wrong, unproven, _ = battery(CASES[::7], windows=(0,), slices=((0, 4),))
    assert not wrong and not unproven
    assert len(calls) > 10 and sum(calls) > 0
