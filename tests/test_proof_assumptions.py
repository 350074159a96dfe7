"""The proof's assumptions about the target (jaxrescore.rescore.frontier), each checked at query
time: what the library can see break one must never end in ``proven=True``."""

import itertools

import numpy as np
import pytest

from brute import TableModel, as_model
from jaxrescore import RescoredIndex, SeekIndex
from jaxrescore.models.callable import CallableModel
from jaxrescore.models.base import Structure
from jaxrescore.rescore.frontier import complete, view_lengths


def _table(vocab, seed):
    rng = np.random.default_rng(seed)
    rows = {}

    def fn(prefix):
        if prefix not in rows:
            x = 2.0 * rng.standard_normal(vocab)
            rows[prefix] = x - np.log(np.exp(x).sum())
        return np.arange(vocab), rows[prefix]

    return fn


def test_views_cut_at_max_len_vocabulary_and_first_eos():
    tokens = np.array([[0, 1, 2, 1], [3, 0, 0, -1], [1, 2, 0, -1], [0, 0, 0, 0]])
    lengths = np.array([4, 3, 3, 4])
    s = Structure(vocab_size=3, eos=2, max_len=3)
    cut = view_lengths(tokens, lengths, s)
    assert cut.tolist() == [3, 0, 2, 3]
    assert complete(tokens, cut, s).tolist() == [True, False, True, False]
    fixed = Structure(vocab_size=None, eos=None, max_len=3)
    cut = view_lengths(tokens, lengths, fixed)
    assert cut.tolist() == [3, 3, 3, 3] and complete(tokens, cut, fixed).all()


def test_noise_a_query_can_see_refuses_the_proof():
    """A per-prefix target whose tables move by 0.05 nats between calls (far beyond its 1e-6
    tolerance). A search never recomputes a scored prefix, so the noise it can see is a node's
    fetched full row against the top-m of its forward (top_m < V): it stops unproven, saying
    why; the same target without the noise is proven."""
    vocab, max_len = 4, 3
    base = _table(vocab, 1)
    rng = np.random.default_rng(2)

    def noisy(prefix):
        toks, lps = base(prefix)
        x = lps + 0.05 * rng.standard_normal(vocab)
        return toks, x - np.log(np.exp(x).sum())

    target = CallableModel(noisy, vocab_size=vocab, max_len=max_len)
    draft = CallableModel(lambda p: (np.arange(vocab), np.full(vocab, -np.log(vocab))), vocab_size=vocab, max_len=max_len)
    r = RescoredIndex(SeekIndex(draft), target, rerank_window=0, top_m=2).top_k(3, prove=True)
    assert r.rounds == 2 and r.proven is False and "moved by" in r.proof_reason
    quiet = CallableModel(base, vocab_size=vocab, max_len=max_len)
    assert RescoredIndex(SeekIndex(draft), quiet, rerank_window=0, top_m=2).top_k(3, prove=True).proven is True


def _foreign_target(alter, vocab=3, length=2, seeds=(5, 6), **options):
    """A foreign target (a table over ``vocab`` tokens, ``length`` long) whose ``score_frontier``
    answers are ``alter``-ed (``alter(FrontierScores) -> FrontierScores``), and a RescoredIndex
    over it (``options``: its own; by default a window of 2 and top-2)."""
    target = as_model(TableModel(vocab, length, seeds[0]))

    class Foreign:
        vocab_size, eos, max_len = vocab, None, length

        def next_logprobs(self, prefixes, lengths):
            return target.next_logprobs(prefixes, lengths)

        def score_sequences(self, seqs):
            return target.score_sequences(seqs)

        def score_frontier(self, seqs, *, top_m):
            return alter(target.score_frontier(seqs, top_m=top_m))

    return RescoredIndex(SeekIndex(as_model(TableModel(vocab, length, seeds[1]))), Foreign(),
                         **{"rerank_window": 2, "top_m": 2, **options})


def test_a_score_that_is_not_the_sum_of_its_steps_is_refused():
    ri = _foreign_target(lambda fs: fs._replace(scores=fs.scores + 0.5 * (fs.scores > -np.inf)))
    with pytest.raises(ValueError, match="sum of its step log-probs"):
        ri.top_k(2)


def test_a_top_m_token_outside_the_vocabulary_is_refused():
    def wide(fs):
        ids = fs.top_ids.copy()
        ids[:, 0, 0] = 7
        return fs._replace(top_ids=ids)

    with pytest.raises(ValueError, match="outside its vocabulary"):
        _foreign_target(wide).top_k(2)


def test_the_rest_bound_does_not_rely_on_the_top_m_order():
    """A foreign forward naming its top-m in ascending order: the "rest" bound reads the smallest
    named value wherever it stands, and the proof stays exact."""
    def ascending(fs):
        order = np.argsort(fs.top_lps, axis=2, kind="stable")
        return fs._replace(top_lps=np.take_along_axis(fs.top_lps, order, axis=2),
                           top_ids=np.take_along_axis(fs.top_ids, order, axis=2))

    t = as_model(TableModel(3, 2, 5))
    support = list(itertools.product(range(3), repeat=2))
    truth = sorted(t.score_sequences(support).tolist(), reverse=True)[:2]
    for window in (0, 2):
        ri = _foreign_target(ascending)
        ri.rerank_window = window
        r = ri.top_k(2, prove=True)
        assert r.proven is True and np.allclose([lp for _, lp in r.items], truth, atol=1e-9)


@pytest.mark.parametrize("prove", [False, True])
def test_a_draft_with_a_larger_vocabulary_proves_over_the_target_support(prove):
    """Draft tokens the target does not have: their sequences are outside its support, never
    answers, and the proof covers the target's own support."""
    target_fn, draft_fn = _table(3, 10), _table(5, 11)
    target = CallableModel(target_fn, vocab_size=3, max_len=3)
    draft = CallableModel(draft_fn, vocab_size=5, max_len=3)
    support = list(itertools.product(range(3), repeat=3))
    truth = sorted(target.score_sequences(support).tolist(), reverse=True)[:4]
    r = RescoredIndex(SeekIndex(draft), target, rerank_window=3, top_m=2).top_k(4, prove=prove)
    assert all(max(s) < 3 for s, _ in r.items)
    if prove:
        assert r.proven is True
    if r.proven:
        assert np.allclose([lp for _, lp in r.items], truth, atol=1e-9)


def test_a_prompt_on_an_inferred_vocabulary_before_its_first_call():
    fn = _table(4, 12)
    target = CallableModel(fn, max_len=3)
    draft = CallableModel(fn, max_len=3)
    r = RescoredIndex(SeekIndex(draft.with_prompt([2])), target.with_prompt([2])).top_k(3, prove=True)
    assert r.proven is True and target.vocab_size == 4
    with pytest.raises(ValueError, match="prompt tokens"):
        CallableModel(fn, max_len=3).with_prompt([-1])


@pytest.mark.parametrize("bad", ["nan", "positive"])
def test_a_later_rounds_bad_top_m_is_refused(bad):
    """The scored set checks each block of rows once, as it is added (the frontier of later
    rounds then trusts them): a top-m log-prob that is NaN or above 0 in a LATER round's forward
    is still refused, and the same search without it proves."""
    calls = []

    def later(fs):
        calls.append(len(calls))
        if len(calls) < 2 or bad is None:
            return fs
        top = np.array(fs.top_lps)
        top[:, :, -1] = np.nan if bad == "nan" else 1e-3
        return fs._replace(top_lps=top)

    def search():
        calls.clear()
        return _foreign_target(later, vocab=4, length=3, seeds=(11, 12), rerank_window=1).top_k(12, prove=True)

    with pytest.raises(ValueError, match="top-m log-prob that is NaN or above 0"):
        search()
    assert len(calls) >= 2
    bad = None
    r = search()
    assert r.proven is True and r.rounds >= 2
