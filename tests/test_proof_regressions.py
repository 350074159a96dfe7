"""Issue 19's repros: inputs a real user reaches on which ``proven`` or ``certified`` lied, and a
proving search that stalled on a support small enough to list.

Each model is tiny, so the target's exact answer is a sorted list of its whole support (the
brute-force oracle); the general forms live in the property battery (tests/test_battery.py).
"""

import itertools
import math

import numpy as np

from brute import TableModel, as_model
from jaxrescore import CallableModel, RescoredIndex, SeekIndex

TIE_TOL = 1e-9


def support_scores(model, vocab: int, max_len: int) -> dict:
    """Every sequence of 1..max_len tokens below ``vocab`` with a finite score under ``model``
    (its own ``score_sequences``): the model's whole support, by brute force."""
    seqs = [s for n in range(1, max_len + 1) for s in itertools.product(range(vocab), repeat=n)]
    scores = np.asarray(model.score_sequences(seqs), np.float64)
    return {s: float(v) for s, v in zip(seqs, scores) if v > -math.inf}


def assert_exact(result, truth: dict, start: int, k: int, what: str) -> None:
    """Tie-aware: the items are distinct support sequences with their true scores, and the scores
    are the true ranks ``[start, start + k)``."""
    want = sorted(truth.values(), reverse=True)[start : start + k]
    got = [lp for _, lp in result.items]
    assert len({tuple(s) for s, _ in result.items}) == len(got), f"{what}: duplicate items {result.items}"
    for s, lp in result.items:
        assert tuple(s) in truth and abs(truth[tuple(s)] - lp) <= TIE_TOL, f"{what}: item {s} scores {lp}"
    assert len(got) == len(want) and all(abs(a - b) <= TIE_TOL for a, b in zip(got, want)), (
        f"{what}: got {got}, the target's exact slice is {want} (proven={result.proven}: "
        f"{result.proof_reason!r}; certified={result.certified}: {result.reason!r})"
    )


def assert_top1_proven(make, truth: dict, windows, what: str) -> None:
    """For each window and both query kinds, ``make(window)`` (a fresh RescoredIndex) answers a
    proven top-1 only when it is the exact one, and ``prove=True`` always proves (``what``: the
    support, for the message)."""
    for window in windows:
        for prove in (False, True):
            r = make(window).top_k(1, prove=prove)
            where = f"window={window} prove={prove}"
            if r.proven:
                assert_exact(r, truth, 0, 1, where)
            if prove:
                assert r.proven is True, f"{where}: {what} was not proven: {r.proof_reason}"


def table_fn(rows: dict, vocab: int):
    """A per-prefix function over ``rows`` (prefix -> log-prob row); unlisted prefixes uniform."""
    def fn(prefix):
        row = rows.get(tuple(prefix), np.full(vocab, -math.log(vocab)))
        return np.arange(vocab), np.asarray(row, np.float64)
    return fn


# ---- 1. drafts longer than the target, or running past its eos ----------------------------------


def test_fixed_length_target_shorter_than_its_draft():
    """Issue 19 item 1: a pulled length-3 sequence is scored as its length-2 cut (-inf), but the
    cut itself, a complete target sequence, was neither scored nor bounded: proven on a wrong
    answer."""
    V = 3
    target = CallableModel(lambda p: (np.arange(V), np.log([0.9, 0.05, 0.05])), vocab_size=V, max_len=2)
    draft = CallableModel(lambda p: (np.arange(V), np.log([0.6, 0.3, 0.1])), vocab_size=V, max_len=3)
    truth = support_scores(target, V, 2)
    assert_top1_proven(lambda w: RescoredIndex(SeekIndex(draft, progress=False), target, rerank_window=w),
                       truth, (0, 2, 30), "a 9-sequence support")


def test_eos_target_under_a_fixed_length_draft_that_places_eos_mid_sequence():
    """Issue 19 item 1, the eos analogue: the target (eos=2, max_len 3) reads a draft sequence
    such as (0, 2, 1) as (0, 2); that complete target sequence must be scored or bounded."""
    target = TableModel(3, 3, 0, eos=2, temperature=2.0)
    draft = TableModel(3, 3, 1000, eos=None, temperature=2.0)
    t_model, d_model = as_model(target), as_model(draft)
    truth = support_scores(t_model, 3, 3)
    assert len(truth) == 7
    assert_top1_proven(lambda w: RescoredIndex(SeekIndex(d_model, progress=False), t_model, rerank_window=w),
                       truth, (0, 1, 2, 30), "a 7-sequence support")


# ---- 2. an inferred vocabulary with top_m < V ---------------------------------------------------


def test_inferred_vocabulary_target_with_default_top_m():
    """Issue 19 item 2: a per-prefix target without ``vocab_size`` (inferred) at V=40 with
    ``top_m=32`` (the default before it became 64). Token 39 is the root's 40th likeliest, but the step after it is certain,
    so (39, 0) is the target's best sequence; only the root's "rest" exit (every token outside
    its top 32) bounds it. The draft ranks it last."""
    V = 40
    root = -0.05 * np.arange(V)
    root = root - np.logaddexp.reduce(root)

    def target_fn(prefix):
        if prefix == ():
            return np.arange(V), root
        if prefix == (V - 1,):
            return np.array([0]), np.array([0.0])
        return np.arange(V), np.full(V, -math.log(V))

    def draft_fn(prefix):
        if prefix == ():
            return np.arange(V), root
        return np.arange(V), np.full(V, -math.log(V))

    draft = CallableModel(draft_fn, vocab_size=V, max_len=2)
    truth = support_scores(CallableModel(target_fn, vocab_size=V, max_len=2), V, 2)
    best = max(truth, key=truth.get)
    assert best == (V - 1, 0)
    # a fresh inferred-vocabulary target each time: none has seen a table before its query
    assert_top1_proven(
        lambda w: RescoredIndex(SeekIndex(draft, progress=False), CallableModel(target_fn, max_len=2), rerank_window=w,
                                top_m=32),
        truth, (0, 5), "a 1,600-sequence support")


# ---- 3. infinite excess refutes -----------------------------------------------------------------


def _outside_draft_pair():
    """V=3, length 2: the target's best root token 2 is one the draft rules out (-inf), so the
    draft's whole support (6 sequences) is exhausted by a wide pull while the target's best
    sequences lie outside it."""
    V = 3
    t_rows = {(): np.log([0.2, 0.2, 0.6])}
    d_rows = {(): np.array([math.log(0.5), math.log(0.5), -math.inf])}
    target = CallableModel(table_fn(t_rows, V), vocab_size=V, max_len=2)
    draft = CallableModel(table_fn(d_rows, V), vocab_size=V, max_len=2)
    return target, draft


def test_a_finite_target_score_outside_the_draft_support_refutes_any_gap():
    """Issue 19 item 3: ``prove=True`` scores sequences the draft gives -inf (target - draft =
    +inf). That refutes every assumed gap: neither that query nor a later one on the object may
    certify, and the reason must not claim an exhausted draft."""
    target, draft = _outside_draft_pair()
    truth = support_scores(target, 3, 2)
    ri = RescoredIndex(SeekIndex(draft, progress=False), target, rerank_window=10, assumed_gap=0.5)
    r = ri.top_k(1, prove=True)
    assert r.proven is True
    assert_exact(r, truth, 0, 1, "prove")
    outside = [s for s, _ in r.items if s[0] == 2]
    assert outside, r.items  # the search scored a sequence the draft rules out
    assert r.certified is not True, f"certified against its own evidence (+inf excess): {r.reason}"
    assert "every draft sequence was rescored" not in r.reason, r.reason
    assert "refut" in r.reason, r.reason
    assert ri.excess == math.inf, ri.excess
    # A later plain query on the same object: the draft is exhausted, its answer is wrong, and
    # the object's evidence refutes the gap.
    later = ri.top_k(1)
    assert later.certified is not True, f"certified a wrong answer against earlier evidence: {later.reason}"
    assert "refut" in later.reason, later.reason


# ---- 4. sweep: one target call, one body of evidence -------------------------------------------


def test_sweep_queries_refute_from_everything_the_call_scored():
    """Issue 19 item 4: in one sweep, a narrow query (window 0) would certify its head while a
    wider query of the SAME target call scored a sequence with target - draft = 3.7 > gap. The
    evidence rule: every query refutes from everything scored in that call (and earlier)."""
    V = 8
    d = np.log(np.array([0.9] + [0.1 / 7] * 7))
    t = np.log(np.array([0.3, 0.1 / 6, 0.1 / 6, 0.1 / 6, 0.1 / 6, 0.6, 0.1 / 6, 0.1 / 6]))
    target = CallableModel(table_fn({(): t}, V), vocab_size=V, max_len=1)
    draft = CallableModel(table_fn({(): d}, V), vocab_size=V, max_len=1)
    ri = RescoredIndex(SeekIndex(draft, progress=False), target, rerank_window=0)
    narrow, wide = ri.sweep([0, 0], [1, 1], [0, 7], [0.1, 0.1])
    assert wide.certified is False and wide.excess > 3.0, wide.reason
    assert narrow.items[0][0] == (0,)  # the wrong answer (the target's best is (5,))
    assert narrow.certified is not True, f"certified although the same call refutes the gap: {narrow.reason}"
    # After the sweep the object holds the refutation: a later query must not certify either.
    again = RescoredIndex(SeekIndex(draft, progress=False), target, rerank_window=0, assumed_gap=0.1)
    again.sweep([0], [1], [7], [0.1])
    assert again.top_k(1).certified is not True


# ---- 5. a proving search on a fully scored support never stalls ---------------------------------


def test_prove_reaches_a_proof_when_every_exit_is_minus_inf():
    """Issue 19 item 5: the target's support is the single sequence (0, 0); once it is scored
    every allowed exit is worth -inf, and the search must say so (proven) instead of stalling
    with "the search found nothing new"."""
    V = 3
    t_rows = {(): [0.0, -math.inf, -math.inf], (0,): [0.0, -math.inf, -math.inf],
              (1,): [-math.inf, -math.inf, 0.0], (2,): [-0.007, -math.inf, -4.957]}
    d_rows = {(): [-1.126, -3.143, -0.458], (0,): [-0.047, -4.384, -3.411], (1,): [-math.inf, -math.inf, 0.0],
              (2,): [-3.258, -0.659, -0.811]}
    def normalised(rows):
        return {p: np.asarray(r) - np.logaddexp.reduce(np.asarray(r)) for p, r in rows.items()}

    target = CallableModel(table_fn(normalised(t_rows), V), vocab_size=V, max_len=2)
    draft = CallableModel(table_fn(normalised(d_rows), V), vocab_size=V, max_len=2)
    truth = support_scores(target, V, 2)
    assert list(truth) == [(0, 0)]
    for window in (0, 1, 20):
        r = RescoredIndex(SeekIndex(draft, progress=False), target, rerank_window=window).top_k(1, prove=True)
        assert r.proven is True, f"window={window}: stalled: {r.proof_reason}"
        assert_exact(r, truth, 0, 1, f"window={window}")


def test_prove_reaches_a_proof_on_small_supports_with_minus_inf_steps():
    """Issue 19 item 5, the general form: random tiny targets with -inf entries (fixed-length and
    eos), drafts agreeing on half the rows; every proving search reaches the exact answer."""
    rng = np.random.default_rng(0)
    failures = []
    for seed in range(60):
        V, L = int(rng.integers(2, 4)), int(rng.integers(1, 4))
        eos = [None, 0, V - 1][int(rng.integers(0, 3))]
        if eos is not None and L < 2:
            continue
        target = TableModel(V, L, seed, eos=eos, temperature=2.0)
        for p in target.steps:
            row = target.steps[p].copy()
            drop = rng.random(V) < 0.4
            if (~drop).any():
                row[drop] = -np.inf
                row[~drop] -= np.logaddexp.reduce(row[~drop])
                target.steps[p] = row
        draft = TableModel(V, L, seed + 7, eos=eos)
        for p in draft.steps:
            if rng.random() < 0.5:
                draft.steps[p] = target.steps[p].copy()
        t_model, d_model = as_model(target), as_model(draft)
        truth = {s: v for s, v in zip(target.support(), t_model.score_sequences(target.support())) if v > -math.inf}
        for window in (0, 50):
            for k in (1, 3):
                if k > len(truth):
                    continue
                ri = RescoredIndex(SeekIndex(d_model, progress=False), t_model, rerank_window=window)
                r = ri.top_k(k, prove=True)
                if r.proven is not True:
                    failures.append((seed, V, L, eos, window, k, r.proof_reason))
                else:
                    assert_exact(r, truth, 0, k, f"seed {seed} window {window} k {k}")
    assert not failures, f"{len(failures)} searches did not prove, e.g. {failures[:3]}"


# ---- 6. a draft whose vocabulary lacks the target's eos (issue 36 item 1) -----------------------


def test_prove_with_a_draft_narrower_than_the_target_and_without_its_eos():
    """Issue 36 item 1: a 2-token draft (eos 1) against a 4-token target (eos 3). Speculation
    closes a path with the TARGET's eos and read that column from the draft's 2-wide rows
    (IndexError). A draft that cannot say eos (or tokens 2, 3) gives no estimate for them (-inf);
    the proof reads only the target's numbers, so every answer is proven and exact."""
    cases = 0
    for seed in range(12):
        draft = as_model(TableModel(2, 4, seed, eos=1))
        target = as_model(TableModel(4, 4, seed + 100, eos=3))
        truth = support_scores(target, 4, 4)
        for k in (1, 2, 3):
            for window in (0, 5):
                ri = RescoredIndex(SeekIndex(draft, progress=False), target, rerank_window=window)
                r = ri.top_k(k, prove=True)
                where = f"seed {seed} k {k} window {window}"
                assert r.proven is True, f"{where}: {r.proof_reason}"
                assert_exact(r, truth, 0, k, where)
                cases += 1
    assert cases == 72
