"""rescore_many: several prompts' queries in ONE target call, equal to querying each alone."""

import itertools

import numpy as np
import pytest

from jaxrescore.models.ngram import NGramLM
from jaxrescore.rescore import RescoredIndex
from jaxrescore.rescore.many import rescore_many

EOS = 3


class ListIndex:
    """Continuations of a prompt in draft order (exhaustive, so certificates are decidable)."""

    def __init__(self, draft, max_len):
        seqs = [body + (EOS,) for n in range(max_len) for body in itertools.product(range(3), repeat=n)]
        lps = draft.score_sequences(seqs)
        order = np.argsort(-lps, kind="stable")
        self.rows = [(seqs[i], float(lps[i])) for i in order]

    def unrank(self, i):
        if i >= len(self.rows):
            raise IndexError(i)
        return self.rows[i]


@pytest.fixture(scope="module")
def models():
    rng = np.random.default_rng(0)
    corpus = [tuple(rng.integers(0, 3, rng.integers(0, 5))) + (EOS,) for _ in range(300)]
    draft = NGramLM.fit(corpus, order=2, vocab_size=4, eos=EOS, max_len=6)
    target = NGramLM.fit(corpus, order=3, vocab_size=4, eos=EOS, max_len=6)
    return draft, target


def test_one_call_for_all_prompts_and_same_results(models, monkeypatch):
    draft, target = models
    prompts = [(0,), (1, 2), ()]

    def make():
        return [
            RescoredIndex(ListIndex(draft.with_prompt(p), 6 - len(p)), target.with_prompt(p), rerank_window=4, assumed_gap=None)
            for p in prompts
        ]

    alone = [ri.top_k(3) for ri in make()]
    calls = []
    real = {name: getattr(type(target), name) for name in ("score_sequences", "score_frontier")}

    def spy(name):
        def call(self, seqs, **kw):
            calls.append(kw.get("skip"))
            return real[name](self, seqs, **kw)

        return call

    fresh = make()
    for name in real:
        monkeypatch.setattr(type(target), name, spy(name))
    together = rescore_many(fresh, 3)
    assert len(calls) == 1 and sorted(set(np.asarray(calls[0]).tolist())) == [0, 1, 2]
    for a, b in zip(alone, together):
        assert [s for s, _ in a.items] == [s for s, _ in b.items]
        np.testing.assert_allclose([lp for _, lp in a.items], [lp for _, lp in b.items], rtol=0, atol=1e-5)
        assert a.certified == b.certified
        assert a.proven == b.proven and a.frontier_bound == pytest.approx(b.frontier_bound, abs=1e-5)


def test_shared_target_object(models):
    draft, target = models
    idx = [RescoredIndex(ListIndex(draft, 6), target, rerank_window=w) for w in (0, 5)]
    results = rescore_many(idx, 2)
    assert [len(r.items) for r in results] == [2, 2]
    assert all(ri.target_calls == 1 for ri in idx)


def test_rejects_unrelated_targets(models):
    draft, target = models
    idx = [RescoredIndex(ListIndex(draft, 6), target), RescoredIndex(ListIndex(draft, 6), draft)]
    with pytest.raises(ValueError, match="one and the same"):
        rescore_many(idx, 2)
    with pytest.raises(ValueError, match="non-empty"):
        rescore_many([], 2)


def test_rescore_many_takes_the_query_keywords_of_slice():
    """``start`` and ``until_certified`` mean what they mean in ``slice``: each index's result
    equals its own query asked alone (same items, same verdicts)."""
    import jaxrescore.rescore as rs
    from brute import TableModel, as_model
    from jaxrescore import RescoredIndex, SeekIndex

    target = TableModel(4, 4, 21, eos=0, temperature=2.0)
    drafts = [TableModel(4, 4, s, eos=0, base=target, noise=0.3) for s in (5, 6)]

    t_model = as_model(target)

    def indexes():
        return [RescoredIndex(SeekIndex(as_model(d)), t_model, rerank_window=2, assumed_gap=1.0) for d in drafts]

    for kw in (dict(start=2, prove=True), dict(start=1, until_certified=True)):
        joint = rs.rescore_many(indexes(), 3, **kw)
        assert all(r.proven for r in joint) or not kw.get("prove")
        start = kw.pop("start")
        alone = [ri.slice(start, 3, **kw) for ri in indexes()]
        for a, b in zip(joint, alone):
            assert [s for s, _ in a.items] == [s for s, _ in b.items]
            assert (a.proven, a.certified) == (b.proven, b.certified)
    with pytest.raises(ValueError, match="until_certified=True needs an assumed_gap"):
        rs.rescore_many([RescoredIndex(SeekIndex(as_model(drafts[0])), t_model)], 2, until_certified=True)


def test_joint_proofs_of_a_network_reuse_each_prompts_caches():
    """Prompts of one transformer proven jointly compute about what proving each alone computes
    (each prompt's rows extend their own held key/value caches, the first call packed), in fewer
    calls, with the same proven answers."""
    import jaxrescore
    from jaxrescore.data.names_models import names_draft, names_target

    target, draft = names_target(), names_draft()
    prompts = ["ma", "jo", "el", "da"]
    alone = [jaxrescore.top_k(target, draft, 5, prompt=p) for p in prompts]
    together = jaxrescore.top_k(target, draft, 5, prompt=prompts)
    for a, b in zip(alone, together):
        assert a.proven is True and b.proven is True
        assert [s for s, _ in a.items] == [s for s, _ in b.items]
        np.testing.assert_allclose([lp for _, lp in a.items], [lp for _, lp in b.items], rtol=0, atol=1e-4)
    mine, theirs = sum(r.positions for r in together), sum(r.positions for r in alone)
    assert mine <= 1.2 * theirs, (mine, theirs)
    assert max(r.rounds for r in together) < sum(r.rounds for r in alone)


def _true_top(target, prompt, k):
    """The exact top-``k`` scores of ``target.with_prompt(prompt)``: its whole support scored."""
    model = target.with_prompt(prompt)
    support = [body + (EOS,) for n in range(model.max_len) for body in itertools.product(range(3), repeat=n)]
    return np.sort(model.score_sequences(support))[::-1][:k]


@pytest.mark.parametrize("shared_base", [True, False])
def test_drafts_run_in_lockstep_one_call_per_step(models, monkeypatch, shared_base):
    """A joint proof over speculating drafts: the drafts' best-first seeds and speculation run in
    lockstep, ONE draft call per step serving every prompt still searching (prompts of one base
    share its call; drafts of different bases are called one by one), and every answer is proven
    and equal to the loop's and to brute force."""
    from jaxrescore.rescore.draft import SpeculativeDraft

    draft, target = models
    prompts = [(0,), (1, 2), (), (2,), (0, 0)]
    twins = [draft if shared_base else NGramLM.fit([(0, EOS), (1, 2, EOS)] * (i + 1), order=2, vocab_size=4, eos=EOS,
                                                   max_len=6) for i in range(len(prompts))]
    from jaxrescore.models.ngram import lookup

    rows_seen = []  # rows of each draft call (the draft's next_logprobs reads its tables once a call)
    real = lookup.prefix_chain

    def spy(tables, batch):
        if any(tables is d.tables for d in twins):
            rows_seen.append(batch.size)
        return real(tables, batch)

    monkeypatch.setattr(lookup, "prefix_chain", spy)

    def make():
        return [RescoredIndex(SpeculativeDraft(d.with_prompt(p)), target.with_prompt(p)) for d, p in zip(twins, prompts)]

    alone = [ri.top_k(4, prove=True) for ri in make()]
    loop = list(rows_seen)
    rows_seen.clear()
    joint = rescore_many(make(), 4, prove=True)
    for a, b, p in zip(alone, joint, prompts):
        truth = _true_top(target, p, 4)
        assert a.proven and b.proven
        np.testing.assert_allclose([lp for _, lp in b.items], truth, atol=1e-9)
        np.testing.assert_allclose([lp for _, lp in a.items], truth, atol=1e-9)
    if shared_base:  # one call per step for all: fewer, larger calls, the same rows about
        assert len(rows_seen) * 2 < len(loop) and max(rows_seen) > max(loop), (rows_seen, loop)
    else:  # each draft its own calls
        assert len(rows_seen) >= len(prompts)
