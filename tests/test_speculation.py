"""The proving search's speculation policy (jaxrescore.rescore.speculate, search): what the draft
expects of a path, the aim a round cuts paths at, the rows a round fetches in its own call. None of
it touches soundness (the battery checks the verdicts); these pin the rules themselves."""

import math

import numpy as np
import pytest

from brute import TableModel, as_model
from jaxrescore.models.base import Structure
from jaxrescore.rescore.scored import ScoredSet
from jaxrescore.rescore.search import aim_of, rising, share_of
from jaxrescore.rescore.speculate import Speculation, speculate
from jaxrescore.rescore.target import as_scorer

EOS = 2


def table(seed=3, vocab=4, max_len=5):
    return TableModel(vocab, max_len, seed, eos=EOS, temperature=1.5)


def by_hand(t, prefix, value):
    """The greedy path after ``prefix`` and the estimate after each token it adds."""
    path, est, trace = list(prefix), value, []
    while not (path and path[-1] == EOS) and len(path) < t.max_len:
        if len(path) == t.max_len - 1:
            path.append(EOS)
            trace.append(est)
            break
        row = t.steps[tuple(path)]
        tok = int(np.argmax(row))
        est += row[tok]
        path.append(tok)
        trace.append(est)
    return tuple(path), trace


def test_speculation_traces_the_drafts_estimate_along_each_path():
    t = table()
    structure = Structure(vocab_size=4, eos=EOS, max_len=5)
    prefixes, values = [(), (1,), (0, 3)], np.array([0.0, -0.7, -2.5])
    spec = speculate(as_model(t, batched=True), prefixes, structure, values=values)
    assert list(spec.origin) == [0, 1, 2] and list(spec.starts) == [0, 1, 2]
    for i, (p, v) in enumerate(zip(prefixes, values)):
        path, trace = by_hand(t, p, v)
        n = int(spec.lengths[i])
        assert tuple(spec.rows[i, :n]) == path
        np.testing.assert_allclose(spec.trace[i, len(p) : n], trace)
        assert np.all(spec.trace[i, : len(p)] == np.inf)
        chose_eos = len(path) < t.max_len or t.steps[path[:-1]].argmax() == EOS
        assert spec.natural[i] == chose_eos
        assert spec.estimates()[i] == (pytest.approx(trace[-1]) if chose_eos else -np.inf)


def _spec(rows, starts, values, traces, eos=EOS):
    width = max(len(r) for r in rows)
    toks = np.zeros((len(rows), width), np.int32)
    trace = np.full((len(rows), width), np.inf)
    for i, (r, tr) in enumerate(zip(rows, traces)):
        toks[i, : len(r)] = r
        trace[i, starts[i] : len(r)] = tr
    n = len(rows)
    return Speculation(toks, np.array([len(r) for r in rows]), np.array(starts), np.array(values, float), trace,
                       np.ones(n, bool), np.arange(n))


def test_aimed_paths_are_cut_before_the_aim_and_closed_with_eos():
    spec = _spec([(1, 3, 3, 1, EOS), (0, 1, EOS), (3, EOS)], [1, 1, 1], [-1.0, -0.5, -4.0],
                 [[-1.5, -2.5, -3.5, -3.6], [-1.0, -1.2], [-4.2]])
    # path 0 keeps 1, 3 (estimate -1.5 >= -2) and is closed after them; path 1 stays whole;
    # path 2's prefix (3,) is worth -4 < -2: it waits
    assert spec.aimed(-2.0, EOS) == [(1, 3, EOS), (0, 1, EOS)]
    assert spec.aimed(-math.inf, EOS) == spec.sequences()
    # a path cut right after its prefix is the prefix closed with eos; without an eos none is cut
    assert spec.aimed(-1.2, EOS) == [(1, EOS), (0, 1, EOS)]
    assert spec.aimed(-2.0, None) == [(1, 3, 3, 1, EOS), (0, 1, EOS)]


def test_of_prefixes_keeps_the_forks_of_the_prefixes_kept():
    t = table(seed=8)
    structure = Structure(vocab_size=4, eos=EOS, max_len=5)
    spec = speculate(as_model(t, batched=True), [(0,), (1,), (3,)], structure, branch=2)
    kept = spec.of_prefixes(2)
    assert set(kept.origin.tolist()) <= {0, 1} and kept.origin.size == int((spec.origin < 2).sum())
    assert all(s[0] in (0, 1) for s in kept.sequences())


def scored_set(t):
    model = as_model(t, batched=True)
    return ScoredSet(model, as_scorer(model), 4)


def test_the_aim_counts_the_drafts_estimates_of_new_complete_paths():
    t = table(seed=4)
    s = scored_set(t)
    support = t.support()
    s.add(support[:6], np.zeros(6), np.full(6, -1))
    worst = float(np.sort(s.target_lps)[::-1][2])  # k = 3
    old, new = support[0], (3, 3, EOS)
    assert new not in s.where
    spec = _spec([old, new], [len(old), 0], [0.0, 0.0], [[0.0] * len(old), [-0.01, -0.02, -0.03]])
    lps = np.append(s.target_lps, -0.03)
    assert aim_of(s, spec, 2, worst) == pytest.approx(float(np.sort(lps)[::-1][2]))
    # no estimate above the worst answer (or only of scored sequences): the aim is the worst
    low = _spec([new], [0], [0.0], [[-50.0, -60.0, -70.0]])
    assert aim_of(s, low, 2, worst) == worst
    again = _spec([old], [len(old)], [0.0], [[0.0] * len(old)])
    assert aim_of(s, again, 2, worst) == worst


def test_a_round_opens_a_quarter_of_the_open_exits_while_the_answer_still_rises():
    assert share_of(1000, 10) == 250 and share_of(12, 10) == 10
    t = table(seed=4)
    s = scored_set(t)
    model = as_model(t, batched=True)
    support = t.support()
    order = np.argsort(-np.asarray(model.score_sequences(support)), kind="stable")
    ranked = [support[i] for i in order]

    def add(seqs):
        s.add(seqs, np.zeros(len(seqs)), np.full(len(seqs), -1))

    add(ranked[-3:])  # the 3 worst: a first worst answer (k = 3)
    add(ranked[:3])  # the 3 best: it rose
    assert rising(s, 2)
    add(ranked[-6:-3])  # worse ones: the add before this one still raised it
    assert rising(s, 2)
    add(ranked[-9:-6])
    assert not rising(s, 2)


def test_rows_fetched_with_a_rounds_sequences_share_its_call():
    t = table(seed=6)
    s = scored_set(t)
    support = t.support()
    s.add(support[:3], np.zeros(3), np.full(3, -1))
    calls, seqs = s.calls, s.sequences
    node = (0,)
    assert s.add(support[3:5], np.zeros(2), np.full(2, -1), fetch=[node, ()])
    assert s.calls == calls + 1 and s.sequences == seqs + 2 + 2
    np.testing.assert_allclose(s.rows[node], t.steps[node], atol=1e-6)
    # rows already held are not fetched again; a fetch alone is a call of its own
    assert not s.add([], np.zeros(0), np.zeros(0, np.int64), fetch=[node])
    assert s.calls == calls + 1
    assert s.add([], np.zeros(0), np.zeros(0, np.int64), fetch=[(1,)]) and s.calls == calls + 2


def test_a_failed_round_fetches_nothing():
    t = table(seed=6)
    s = scored_set(t)
    s.add(t.support()[:2], np.zeros(2), np.full(2, -1))
    before = (dict(s.rows), s.calls, s.sequences, len(s))

    def broken(seqs, full=False):
        raise ValueError("the target failed")

    s.score = broken
    with pytest.raises(ValueError, match="failed"):
        s.add([(3, 3, EOS)], np.zeros(1), np.full(1, -1), fetch=[()])
    assert (dict(s.rows), s.calls, s.sequences, len(s)) == before


class _Rows:
    """A draft whose rows are read-only (as a device's are), one column wider than the target's
    vocabulary (its extra token the likeliest) and, with ``nan``, NaN at token 1."""

    vocab_size, max_len, eos = 5, 5, EOS

    def __init__(self, nan: bool):
        self.nan = nan

    def next_logprobs(self, prefixes, lengths):
        rows = np.log(np.tile(np.array([0.05, 0.3, 0.15, 0.1, 0.4]), (len(lengths), 1)))
        if self.nan:
            rows[:, 1] = np.nan
        rows.flags.writeable = False
        return rows


@pytest.mark.parametrize("nan", [True, False])
def test_speculation_reads_nan_as_never_and_ignores_tokens_the_target_lacks(nan):
    """A NaN entry is -inf (np.argmax would pick it), a token past the target's vocabulary ends no
    path, and the draft's rows are not written to (a device's rows are read-only)."""
    spec = speculate(_Rows(nan), [(), (0,)], Structure(vocab_size=4, eos=EOS, max_len=5), values=np.zeros(2))
    for i, start in enumerate((0, 1)):
        path = spec.rows[i, start : spec.lengths[i]]
        assert path.size and 4 not in path and path[-1] == EOS
        # of the tokens left eos is the likeliest, after token 1 when it is not NaN
        assert list(path) == ([EOS] if nan else [1, 1, 1, 1][: 4 - start] + [EOS])[: 5 - start]
