"""The library's other searches against brute force: the gap-certified ``until_certified`` growth,
exact best-first search over one model, and the top-of-distribution gap estimate."""

import heapq

import numpy as np
import pytest

from brute import BruteIndex, TableModel, as_model, true_excess
from jaxrescore import RescoredIndex, SeekIndex
from jaxrescore.baselines.best_first import best_first_top_k
from jaxrescore.rescore import estimate_top_gap


def pair(seed, vocab=3, max_len=5, eos=2, noise=0.3):
    target = TableModel(vocab, max_len, seed, eos=eos, temperature=2.0)
    draft = TableModel(vocab, max_len, seed + 50, eos=eos, base=target, noise=noise)
    return draft, target


@pytest.mark.parametrize("seed, eos", [(0, 2), (1, None), (2, 0), (3, 2)])
def test_until_certified_grows_until_a_true_gap_certifies(seed, eos):
    draft, target = pair(seed, max_len=5 if eos is not None else 4, eos=eos)
    gap = true_excess(draft, target, target.support()) + 1e-3
    t_model = as_model(target)
    ri = RescoredIndex(SeekIndex(as_model(draft)), t_model, rerank_window=0, assumed_gap=gap)
    plain = ri.top_k(4)
    grown = RescoredIndex(SeekIndex(as_model(draft)), t_model, rerank_window=0, assumed_gap=gap)
    scored = []
    real = t_model.score_frontier
    t_model.score_frontier = lambda seqs, **kw: scored.extend(map(tuple, seqs)) or real(seqs, **kw)
    r = grown.top_k(4, until_certified=True)
    assert r.certified is True, r.reason
    want = sorted(t_model.score_sequences(target.support()), reverse=True)[:4]
    np.testing.assert_allclose([lp for _, lp in r.items], want, atol=1e-9)
    if plain.certified is False:
        assert r.rounds >= 2
    # every round scored only new sequences, in one call at most (a sequence whose every
    # position the set already holds needs no forward)
    assert len(scored) == len(set(scored)) <= grown.target_sequences
    assert grown.target_calls <= r.rounds


def test_until_certified_stops_on_a_refuted_gap_and_needs_a_gap():
    draft, target = pair(5, noise=1.5)
    ri = RescoredIndex(SeekIndex(as_model(draft)), as_model(target), rerank_window=2, assumed_gap=0.0)
    r = ri.top_k(3, until_certified=True)
    assert r.certified is False and "refuted" in r.reason and r.rounds == 1
    with pytest.raises(ValueError, match="assumed_gap"):
        RescoredIndex(SeekIndex(as_model(draft)), as_model(target)).top_k(3, until_certified=True)


def test_until_certified_without_bucket_bound_stays_one_round():
    draft, target = pair(6)
    idx = BruteIndex(draft, with_bound=False)
    ri = RescoredIndex(idx, as_model(target), rerank_window=0, assumed_gap=5.0)
    r = ri.top_k(2, until_certified=True)
    assert r.rounds == 1 and ri.target_calls == 1


@pytest.mark.parametrize("seed, vocab, max_len, eos", [(0, 3, 4, None), (1, 4, 3, None), (2, 3, 5, 2), (3, 4, 4, 0)])
@pytest.mark.parametrize("batch", [1, 3, 50])
def test_best_first_is_exact(seed, vocab, max_len, eos, batch):
    table = TableModel(vocab, max_len, seed, eos=eos, temperature=2.0)
    model = as_model(table)
    support = table.support()
    truth = sorted(model.score_sequences(support), reverse=True)
    for k in (1, 5, len(support)):
        found = best_first_top_k(model, k, batch=batch)
        assert len(found.items) == k and len({s for s, _ in found.items}) == k
        np.testing.assert_allclose([lp for _, lp in found.items], truth[:k], atol=1e-9)
        assert all(s in set(support) for s, _ in found.items)
        assert found.forwards >= found.calls >= 1 and found.exact
        # a cap on rows: never more rows than it allows; exact only when the search ended anyway
        for cap in (1, 2, found.forwards - 1, found.forwards):
            if cap < 1:
                continue
            capped = best_first_top_k(model, k, batch=batch, max_forwards=cap)
            assert capped.forwards <= cap and capped.exact == (capped.forwards == found.forwards)
            if capped.exact:
                assert capped.items == found.items
            got = [lp for _, lp in capped.items]  # real sequences, each scored as the model scores it
            np.testing.assert_allclose(got, model.score_sequences([s for s, _ in capped.items]), atol=1e-9)
    with pytest.raises(ValueError, match="batch"):
        best_first_top_k(model, 2, batch=0)
    with pytest.raises(ValueError, match="max_forwards"):
        best_first_top_k(model, 2, max_forwards=0)
    timed_out = best_first_top_k(model, 2, max_seconds=0)  # stops before its first call
    assert (timed_out.forwards, timed_out.exact, timed_out.items) == (0, False, [])
    assert best_first_top_k(model, 2, max_seconds=60).exact
    with pytest.raises(ValueError, match="max_seconds"):
        best_first_top_k(model, 2, max_seconds=-1)


def _tied(table, seed):
    """``table`` with many exact ties: every row of one depth is the same row of integer logits
    (so sequences whose steps have equal log-probs tie exactly), some tokens impossible."""
    rng = np.random.default_rng(seed)
    logits = rng.integers(0, 2, (table.max_len, table.vocab_size)).astype(float)
    rows = logits - np.logaddexp.reduce(logits, axis=1, keepdims=True)
    for p, row in table.steps.items():
        row[:] = rows[len(p)]
        if rng.random() < 0.2:
            row[rng.integers(row.size)] = -np.inf
            row -= np.logaddexp.reduce(row)
    return table


def _eager_best_first(model, k, batch):
    """Best-first with every finite child pushed onto one heap (the search before lazy pushing,
    one token at a time): ``(items, forwards, calls)`` that ``best_first_top_k`` must reproduce
    exactly, the order of tied items included."""
    eos, max_len = model.eos, model.max_len
    open_, best, forwards, calls = [(-0.0, ())], [], 0, 0
    while open_:
        kth = best[0][0] if len(best) >= k else -np.inf
        if -open_[0][0] <= kth:
            break
        take = [heapq.heappop(open_) for _ in range(min(batch, len(open_)))]
        take = [(-s, p) for s, p in take if -s > kth]
        toks = np.zeros((len(take), max(1, max(len(p) for _, p in take))), np.int32)
        for i, (_, p) in enumerate(take):
            toks[i, : len(p)] = p
        lens = np.array([len(p) for _, p in take], np.int32)
        rows = np.minimum(np.asarray(model.next_logprobs(toks, lens), np.float64), 0.0)
        forwards, calls = forwards + len(take), calls + 1
        for (score, p), row in zip(take, rows):
            for t in range(row.size):
                last = len(p) + 1 == max_len
                if not np.isfinite(row[t]) or (eos is not None and last and t != eos):
                    continue
                lp, seq = score + float(row[t]), p + (t,)
                if t == eos or (eos is None and last):
                    if len(best) < k:
                        heapq.heappush(best, (lp, seq))
                    elif lp > best[0][0]:
                        heapq.heapreplace(best, (lp, seq))
                elif len(best) < k or lp > best[0][0]:
                    heapq.heappush(open_, (-lp, seq))
    return sorted(((s, lp) for lp, s in best), key=lambda x: -x[1]), forwards, calls


@pytest.mark.parametrize("vocab, max_len, eos", [(3, 4, None), (4, 3, None), (3, 5, 2), (4, 4, 0)])
@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("prompt", [(), (1,)])
def test_best_first_is_exact_on_ties_and_prompts_and_expands_in_the_eager_order(vocab, max_len, eos, tied, prompt):
    table = TableModel(vocab, max_len, vocab + max_len, eos=eos, temperature=2.0)
    table = _tied(table, vocab) if tied else table
    model = as_model(table, batched=True)
    model = model.with_prompt(prompt) if prompt else model
    support = [s[len(prompt):] for s in table.support() if s[: len(prompt)] == prompt]
    scores = np.asarray(model.score_sequences(support))
    support, scores = [s for s, f in zip(support, np.isfinite(scores)) if f], scores[np.isfinite(scores)]
    truth = dict(zip(support, scores))
    for k in (1, 4, len(support)):
        for batch in (1, 3, 50):
            found = best_first_top_k(model, k, batch=batch)
            assert (found.items, found.forwards, found.calls) == _eager_best_first(model, k, batch)
            assert len({s for s, _ in found.items}) == k and all(s in truth for s, _ in found.items)
            np.testing.assert_allclose([lp for _, lp in found.items], np.sort(scores)[::-1][:k], atol=1e-9)
            np.testing.assert_allclose([lp for _, lp in found.items], [truth[s] for s, _ in found.items], atol=1e-9)


def test_estimate_top_gap_measures_the_region_of_the_answers():
    draft, target = pair(7, noise=0.8)
    d_model, t_model = as_model(draft), as_model(target)
    support = target.support()
    est = estimate_top_gap(d_model, t_model, 3, support, n_samples=16)
    t = np.asarray(t_model.score_sequences(support))
    d = np.asarray(d_model.score_sequences(support))
    region = np.sort(t)[::-1][2] - 1.0
    assert est.region_lp == pytest.approx(region)
    keep = t >= region
    assert est.n_region == keep.sum() and est.n_distinct == len(support)
    assert est.excess == pytest.approx(max((t - d)[keep].max(), 0.0))
    assert est.two_sided == pytest.approx(np.abs(t - d)[keep].max())
    with pytest.raises(ValueError, match="k must"):
        estimate_top_gap(d_model, t_model, 0)


def _greedy_by_hand(table, prefixes, eos, max_len, branch):
    """Greedy completion one row at a time (the specification of ``greedy_complete``): the
    likeliest token (the lowest id among ties), eos forced at max_len - 1, the first step forked
    into the ``branch`` likeliest finite tokens, new rows after the old; duplicates once."""
    rows, first = [list(p) for p in prefixes], True

    def done(r):
        return (eos is not None and r and r[-1] == eos) or len(r) >= max_len

    while True:
        alive = [i for i, r in enumerate(rows) if not done(r)]
        if not alive:
            return list(dict.fromkeys(tuple(r) for r in rows))
        for i in alive:
            if eos is not None and len(rows[i]) == max_len - 1:
                rows[i].append(eos)
                continue
            lp = table.steps[tuple(rows[i])]
            order = sorted(range(len(lp)), key=lambda t: (-lp[t], t))[: branch if first else 1]
            rows += [rows[i] + [t] for t in order[1:] if np.isfinite(lp[t])]
            rows[i].append(order[0])
        first = False


@pytest.mark.parametrize("eos, branch", [(None, 1), (None, 3), (2, 1), (2, 2), (0, 4)])
def test_greedy_completion_matches_the_one_row_at_a_time_rule(eos, branch):
    from jaxrescore.models.base import Structure
    from jaxrescore.rescore.speculate import greedy_complete

    rng = np.random.default_rng(branch)
    table = TableModel(4, 5, 11 + branch, eos=eos)
    for p, row in table.steps.items():  # ties and impossible tokens, as real rows have
        if rng.random() < 0.3:
            row[rng.integers(4)] = -np.inf
        if rng.random() < 0.3:
            row[:] = np.round(row, 0)
        row -= np.logaddexp.reduce(row)  # ties stay ties
    body = [t for t in range(4) if t != eos]
    prefixes = [()] + [tuple(rng.choice(body, size=n)) for n in rng.integers(0, 5, size=12)]
    if eos is not None:
        prefixes += [(body[0], eos), (eos,)]
    structure = Structure(vocab_size=4, eos=eos, max_len=5)
    got = greedy_complete(as_model(table, batched=True), prefixes, structure, branch=branch)
    assert got == _greedy_by_hand(table, prefixes, eos, 5, branch)
    assert greedy_complete(as_model(table, batched=True), [], structure, branch=branch) == []
