"""Proven top-k under constraints (jaxrescore.constraints), against brute force.

Every model here lists its whole support; the oracle filters it by the constraint's own meaning
(generated tokens, eos excluded: their count, their decoded text against Python's ``re``, the
choices) and sorts. A constrained proof must never hold on a wrong answer.
"""

import math
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import jaxrescore
from brute import TableModel, as_model, reversed_pair
from jaxrescore import RescoredIndex, SeekIndex
from jaxrescore.baselines.best_first import best_first_top_k
from jaxrescore.constraints import AllOf, ConstrainedModel, Length, OneOf, Regex
from jaxrescore.constraints.automaton import run

CHARS = ("$", "m", "a", "x", "b")  # token 0 is eos where a model has one
TOL = 1e-5


def char_model(table: TableModel):
    m = as_model(table)
    m.vocabulary = CHARS[: table.vocab_size]
    return m


def generated(seq, eos):
    return tuple(seq[:-1]) if eos is not None and seq and seq[-1] == eos else tuple(seq)


def oracle(table: TableModel, accepts, k: int, prompt=()):
    """The constrained top-k of ``table`` (continuations of ``prompt``), best first."""
    found = []
    for seq in table.support():
        if tuple(seq[: len(prompt)]) != tuple(prompt):
            continue
        cont = tuple(seq[len(prompt):])
        if accepts(generated(cont, table.eos)):
            lp = table.log_prob(seq) - sum(table.steps[tuple(seq[:i])][t] for i, t in enumerate(prompt))
            found.append((cont, lp))
    return sorted(found, key=lambda x: -x[1])[:k]


def same_answer(result, want) -> bool:
    got = [(tuple(s), lp) for s, lp in result.items]
    if len(got) != len(want) or len({s for s, _ in got}) != len(got):
        return False
    return all(abs(a[1] - b[1]) <= TOL for a, b in zip(got, want))


def text_of(toks):
    return "".join(CHARS[t] for t in toks)


KINDS = [
    (Regex("m[a-z]*"), lambda g: re.fullmatch("m[a-z]*", text_of(g)) is not None),
    (Regex("(ma|x)b?"), lambda g: re.fullmatch("(ma|x)b?", text_of(g)) is not None),
    (Length(2, 3), lambda g: 2 <= len(g) <= 3),
    (Length(min_tokens=3), lambda g: len(g) >= 3),
    (Length(max_tokens=1), lambda g: len(g) <= 1),
    (Length(min_tokens=10), lambda g: False),  # an empty constrained support
    (OneOf(["ma", "xb", "bbb"]), lambda g: text_of(g) in ("ma", "xb", "bbb")),
    (OneOf([(1, 3), (3,), (1, 1, 1)]), lambda g: g in [(1, 3), (3,), (1, 1, 1)]),
    (Length(1, 3) & Regex("[^a]*"), lambda g: 1 <= len(g) <= 3 and "a" not in text_of(g)),
    (Regex("[mab]*") & OneOf([(1, 2), (3, 3), (2,)]) & Length(min_tokens=1), lambda g: g in [(1, 2), (2,)]),
]


@pytest.mark.parametrize("eos, vocab, max_len, top_m", [(0, 5, 5, 64), (None, 4, 4, 64), (4, 5, 4, 64),
                                                        (0, 5, 5, 2), (None, 4, 4, 2), (4, 5, 4, 2),
                                                        (0, 5, 5, 3), (4, 5, 4, 4)])
def test_proven_constrained_top_k_is_the_oracles(eos, vocab, max_len, top_m):
    """top_m < V: each position's named tokens are re-read under the constraint (refused ones
    dropped, the bound on the unnamed kept, full rows read where no allowed one stays named)."""
    wrong = []
    for seed in range(2):
        table = TableModel(vocab, max_len, seed, eos=eos, temperature=2.0)
        drafts = {"noisy": char_model(TableModel(vocab, max_len, 9 + seed, eos=eos, base=table, noise=1.0)),
                  "adversarial": char_model(reversed_pair(table, 7 + seed)), "none": None}
        target = char_model(table)
        for name, draft in drafts.items():
            for constraint, accepts in KINDS:
                for prompt, index in (((), "auto"), ((1,), "seek" if draft is not None else "none")):
                    r = jaxrescore.top_k(target, draft, 4, constraint=constraint, prompt=prompt or None, index=index,
                                         top_m=top_m)
                    want = oracle(table, accepts, 4, prompt)
                    if not (r.proven and same_answer(r, want)):
                        wrong.append((seed, name, constraint, prompt, r.proven, r.proof_reason, r.items, want))
    assert not wrong, wrong[:3]


def test_a_constrained_model_takes_a_prompt_and_constrains_what_follows_it():
    table = TableModel(5, 5, 6, eos=0, temperature=2.0)
    constraint, accepts = KINDS[0]
    model = ConstrainedModel(char_model(table), constraint).with_prompt("x")
    r = jaxrescore.top_k(model, None, 3)
    assert r.proven and same_answer(r, oracle(table, accepts, 3, prompt=(3,)))


def test_skipped_context_counts_in_max_len():
    """A fixed-length model scored with ``skip``: the constraint reads what follows the context,
    but a continuation still ends at the base's ``max_len`` (context included)."""
    table = TableModel(4, 4, 8)  # fixed length 4
    model = ConstrainedModel(char_model(table), Regex("mmmm"))
    seqs = [(3, 1, 1, 1)]  # after the context "x": "mmm", one "m" short, and nothing fits after it
    skip = np.array([1], np.int32)
    assert model.score_sequences(seqs, skip=skip)[0] == -math.inf
    fs = model.score_frontier(seqs, top_m=4, skip=skip)
    assert fs.scores[0] == -math.inf and fs.steps[0, 2] == -math.inf
    assert np.isfinite(model.score_sequences([(1, 1, 1, 1)]))[0]


def test_an_empty_constrained_support_is_proven_with_no_items():
    table = TableModel(4, 3, 0, eos=0)
    r = jaxrescore.top_k(char_model(table), None, 3, constraint=Length(min_tokens=5))
    assert r.proven is True and r.items == []


@given(seed=st.integers(0, 10_000), k=st.integers(1, 6), low=st.integers(0, 4), span=st.integers(0, 3),
       choices=st.lists(st.lists(st.integers(1, 3), min_size=0, max_size=3), min_size=1, max_size=5),
       top_m=st.sampled_from([1, 2, 3, 64]))
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_property_proven_implies_the_oracles_constrained_top_k(seed, k, low, span, choices, top_m):
    table = TableModel(4, 4, seed, eos=0, temperature=2.5)
    draft = char_model(TableModel(4, 4, seed + 1, eos=0, base=table, noise=1.5))
    tuples = [tuple(c) for c in choices]
    constraint = Length(low, low + span) & (OneOf(tuples) if seed % 2 else Regex("[ma]*x?"))
    r = jaxrescore.top_k(char_model(table), draft, k, constraint=constraint, top_m=top_m)

    def accepts(g):
        inside = low <= len(g) <= low + span
        return inside and (g in tuples if seed % 2 else re.fullmatch("[ma]*x?", text_of(g)) is not None)

    if r.proven:
        assert same_answer(r, oracle(table, accepts, k))


def test_rescored_index_top_k_slice_and_sweep_take_a_constraint():
    table = TableModel(5, 5, 3, eos=0, temperature=2.0)
    draft_table = TableModel(5, 5, 4, eos=0, base=table, noise=0.5)
    ri = RescoredIndex(SeekIndex(char_model(draft_table)), char_model(table))
    c, accepts = KINDS[0]
    want = oracle(table, accepts, 6)
    r = ri.top_k(3, prove=True, constraint=c)
    assert r.proven and same_answer(r, want[:3])
    s = ri.slice(2, 3, prove=True, constraint=c)
    assert s.proven and [lp for _, lp in s.items] == pytest.approx([lp for _, lp in want[2:5]], abs=TOL)
    swept = ri.sweep([0, 1], [2, 4], prove=True, constraint=c)
    assert all(q.proven for q in swept)
    assert [lp for _, lp in swept[1].items] == pytest.approx([lp for _, lp in want[1:5]], abs=TOL)
    plain = ri.top_k(3, prove=True)  # the index itself is left as it was
    assert plain.proven and same_answer(plain, oracle(table, lambda g: True, 3))


def test_rescore_many_never_scores_constrained_targets_through_their_shared_base():
    table = TableModel(5, 4, 1, eos=0)
    base = char_model(table)
    indexes = [RescoredIndex(SeekIndex(base), ConstrainedModel(base, c)) for c in (Regex("m.*"), Regex("x.*"))]
    with pytest.raises(ValueError, match="constrained"):
        jaxrescore.rescore_many(indexes, 2, prove=True)


class PieceTokenizer:
    """A tokenizer whose tokens are multi-character pieces (decode concatenates them)."""

    def __init__(self, pieces):
        self.pieces = pieces

    def encode(self, text):
        raise NotImplementedError("not needed: these tests pass token ids")

    def decode(self, ids):
        return "".join(self.pieces[i] for i in ids)


def test_regex_over_multi_character_tokens_straddling_the_pattern():
    pieces = ["<e>", "ma", "ar", "a", "m", "ia", "x"]  # eos 0 decodes to nothing here
    pieces[0] = ""
    table = TableModel(7, 4, 11, eos=0, temperature=1.5)
    target = as_model(table).with_tokenizer(PieceTokenizer(pieces))
    for pattern in ("ma[a-z]*a", "m(ar)*ia?", "a.*x"):
        r = jaxrescore.top_k(target, None, 5, constraint=Regex(pattern))
        want = oracle(table, lambda g: re.fullmatch(pattern, "".join(pieces[t] for t in g)) is not None, 5)
        assert r.proven and same_answer(r, want), pattern


class MergingTokenizer(PieceTokenizer):
    """Rewrites text across tokens (two "a" become one), as a space-cleaning tokenizer does."""

    def decode(self, ids):
        return super().decode(ids).replace("aa", "a")


def test_a_tokenizer_that_rewrites_text_across_tokens_is_refused_for_a_regex():
    pieces = ["", "ma", "ar", "a", "m", "ia", "x"]
    model = as_model(TableModel(7, 3, 11, eos=0)).with_tokenizer(MergingTokenizer(pieces))
    with pytest.raises(ValueError, match="token by token"):
        Regex("ma[a-z]*a").automaton(model)
    assert not ConstrainedModel(model, OneOf([(1, 3)])).automaton.empty  # token choices read no text


def test_names_under_each_kind_equal_a_best_first_that_prunes_by_the_constraint():
    from jaxrescore.data.names_models import names_draft, names_target

    target, draft = names_target(), names_draft()
    for constraint in (Regex("ma[a-z]*a"), Length(min_tokens=8), Length(4, 6) & Regex("[a-m]+"),
                       OneOf(["anna", "maria", "zzz", "john"])):
        r = jaxrescore.top_k(target, draft, 10, constraint=constraint)
        bf = best_first_top_k(ConstrainedModel(target, constraint), 10)
        assert r.proven, (constraint, r.proof_reason)
        assert [s for s, _ in r.items] == [s for s, _ in bf.items], constraint
        assert [lp for _, lp in r.items] == pytest.approx([lp for _, lp in bf.items], abs=1e-3)
        for text in r.texts:
            assert isinstance(text, str)
    texts = jaxrescore.top_k(target, draft, 5, constraint=Regex("ma[a-z]*a")).texts
    assert all(re.fullmatch("ma[a-z]*a", t) for t in texts)


def test_automata_of_each_kind():
    class Model:
        vocab_size, eos, max_len, vocabulary = 5, 0, 6, CHARS

    a = Length(2, 3).automaton(Model)
    assert a.accepting.tolist() == [False, False, True, True] and a.steps_to_accept.tolist() == [2, 1, 0, 0]
    assert (a.next_state[:, 0] == -1).all()  # eos is never a generated token
    r = Regex("ma[a-z]*a").automaton(Model)
    states = run(r, np.array([[1, 2, 3, 2], [2, 1, 1, 1]]), np.array([4, 4]), 0)
    assert r.accepting[states[0, 4]] and (states[1, 1:] == -1).all()
    both = (Regex("ma[a-z]*a") & Length(max_tokens=2)).automaton(Model)
    assert both.empty  # "ma.*a" needs 3 tokens
    assert isinstance(Length(1) & Regex("m") & Length(max_tokens=4), AllOf)
    assert len((Length(1) & Regex("m") & Length(max_tokens=4)).parts) == 3


@pytest.mark.parametrize("make, error, words", [
    (lambda: Regex("(a"), ValueError, "pattern"),
    (lambda: Regex(3), TypeError, "pattern"),
    (lambda: Length(3, 2), ValueError, "min_tokens"),
    (lambda: Length(-1), ValueError, "min_tokens"),
    (lambda: OneOf([]), ValueError, "choices"),
    (lambda: OneOf("ab"), TypeError, "choices"),
    (lambda: OneOf(["a", (1,)]), TypeError, "choices"),
])
def test_bad_constraints_are_refused_with_the_argument_named(make, error, words):
    with pytest.raises(error, match=words):
        make()


def test_bad_uses_are_refused():
    table = TableModel(4, 3, 0, eos=0)
    plain = as_model(table)  # no vocabulary, no tokenizer
    with pytest.raises(ValueError, match="vocabulary or a tokenizer"):
        jaxrescore.top_k(plain, None, 2, constraint=Regex("a"))
    with pytest.raises(TypeError, match="constraint"):
        jaxrescore.top_k(plain, None, 2, constraint="a.*")
    with pytest.raises(ValueError, match="not a generated token"):
        jaxrescore.top_k(plain, None, 2, constraint=OneOf([(0, 1)]))  # 0 is eos
    index = SeekIndex(plain)
    with pytest.raises(ValueError, match="constraint="):
        jaxrescore.top_k(plain, index, 2, constraint=Length(1))


def test_constrained_scores_are_the_bases_and_refused_sequences_score_minus_inf():
    table = TableModel(5, 4, 2, eos=0)
    base = char_model(table)
    model = ConstrainedModel(base, Regex("m[a-z]*"))
    seqs = [(1, 2, 0), (2, 1, 0), (1, 0), (1, 1, 1, 0)]
    got = model.score_sequences(seqs)
    want = base.score_sequences(seqs)
    assert got[0] == pytest.approx(want[0]) and got[2] == pytest.approx(want[2]) and got[3] == pytest.approx(want[3])
    assert got[1] == -math.inf
    rows = model.next_logprobs(np.array([[0, 0], [1, 0]], np.int32), np.array([0, 1], np.int32))
    assert np.isfinite(rows[0]).tolist() == [False, True, False, False, False]  # only "m" starts
    assert np.isfinite(rows[1]).all()  # after "m": any letter, or the end
