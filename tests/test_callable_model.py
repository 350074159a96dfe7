"""CallableModel: both callable forms, vocabulary inference, scoring and table validation."""

import math

import numpy as np
import pytest

from jaxrescore.models.base import AutoregressiveEnumerable
from jaxrescore.models.callable import CallableModel
from model_checks import check_frontier
from seek_oracle import make_model

LP = np.log(np.array([0.5, 0.25, 0.25], np.float32))


def pairs_fn(prefix):
    return [(0, float(LP[0])), (1, float(LP[1])), (2, float(LP[2]))]


def arrays_fn(prefix):
    return np.array([2, 0, 1]), LP[[2, 0, 1]]


def rows(model, prefixes):
    t = max([len(p) for p in prefixes] + [1])
    toks = np.zeros((len(prefixes), t), np.int32)
    for i, p in enumerate(prefixes):
        toks[i, : len(p)] = p
    return model.next_logprobs(toks, np.array([len(p) for p in prefixes], np.int32))


def test_both_per_prefix_forms_and_the_protocol():
    a = CallableModel(pairs_fn, vocab_size=3, max_len=2)
    b = CallableModel(arrays_fn, vocab_size=3, max_len=2)
    assert isinstance(a, AutoregressiveEnumerable)
    ra, rb = rows(a, [(), (1,)]), rows(b, [(), (1,)])
    assert ra.dtype == np.float32 and ra.shape == (2, 3)
    np.testing.assert_array_equal(ra, rb)
    np.testing.assert_array_equal(ra[0], LP)


def test_missing_tokens_are_minus_inf_and_vocab_is_inferred():
    def fn(prefix):
        return [(0, 0.0)] if len(prefix) == 0 else [(0, math.log(0.5)), (4, math.log(0.5))]

    m = CallableModel(fn, max_len=2)
    assert m.vocab_inferred and m.vocab_size == 0
    r0 = rows(m, [()])
    assert r0.shape == (1, 1) and m.vocab_size == 1
    r1 = rows(m, [(0,)])
    assert m.vocab_size == 5 and r1.shape == (1, 5)
    assert np.isneginf(r1[0, [1, 2, 3]]).all()
    half = float(np.float32(math.log(0.5)))  # tables are float32, as a model on device gives them
    assert m.score_sequences([(0, 4), (0, 2), (0, 7)]).tolist() == [half, -math.inf, -math.inf]


def test_eos_vocab_starts_at_eos():
    m = CallableModel(pairs_fn, max_len=3, eos=6)
    assert m.vocab_size == 7


def test_score_sequences_sums_steps_and_enforces_the_support():
    m = make_model(4, 4, 0, eos=1)
    t = m.fn.table
    seq = (0, 2, 1)
    want = float(t(())[0]) + float(t((0,))[2]) + float(t((0, 2))[1])
    got = m.score_sequences([seq, (0, 2), (1, 1), (0, 2, 3, 3, 1), ()])
    assert got[0] == pytest.approx(want, abs=1e-12)
    assert np.isneginf(got[1:]).all()  # no eos / eos twice / too long / empty
    assert m.log_density(seq) == got[0]
    fixed = make_model(3, 2, 0)
    assert np.isneginf(fixed.score_sequences([(0,), (0, 1, 2)])).all()
    assert np.isfinite(fixed.score_sequences([(0, 1)])).all()


def test_batched_form_matches_per_prefix_and_scores_in_power_of_two_shapes():
    shapes = []
    per = make_model(4, 3, 5)

    def fn(prefixes, lengths):
        shapes.append(prefixes.shape)
        return np.stack([per.fn.table(tuple(p[:n].tolist())) for p, n in zip(prefixes, lengths)])

    bat = CallableModel(fn, vocab_size=4, max_len=3, batched=True)
    seqs = [(a, b, c) for a in range(4) for b in range(4) for c in range(3)]
    np.testing.assert_array_equal(bat.score_sequences(seqs), per.score_sequences(seqs))
    assert all(r & (r - 1) == 0 and t & (t - 1) == 0 for r, t in shapes)


def test_constructor_validation():
    with pytest.raises(ValueError, match="vocab_size is required"):
        CallableModel(lambda p, n: None, max_len=2, batched=True)
    with pytest.raises(ValueError, match="max_len"):
        CallableModel(pairs_fn, max_len=0)
    with pytest.raises(ValueError, match="eos"):
        CallableModel(pairs_fn, vocab_size=3, max_len=2, eos=3)
    with pytest.raises(ValueError, match="eos"):
        CallableModel(pairs_fn, max_len=2, eos=-1)
    with pytest.raises(TypeError, match="callable"):
        CallableModel(3, max_len=2)
    m = CallableModel(pairs_fn, vocab_size=3, max_len=2)
    with pytest.raises(ValueError, match="lengths"):
        m.next_logprobs(np.zeros((2, 2), np.int32), np.array([0, 3]))
    with pytest.raises(ValueError, match="shapes"):
        m.next_logprobs(np.zeros(2, np.int32), np.array([0, 0]))


@pytest.mark.parametrize(
    "table, match",
    [
        ([(0, float("nan")), (1, 0.0)], "NaN"),
        ([(0, 0.3), (1, -2.0)], "> 0"),
        ([(0, math.log(0.5)), (0, math.log(0.5))], "duplicate tokens \\[0\\]"),
        ([(0, math.log(0.5)), (1, math.log(0.3))], "not a distribution"),
        ([(0, -math.inf)], "every token log-prob -inf"),
        ([], "every token log-prob -inf"),
        ([(-1, 0.0)], "negative token"),
        ([(3, 0.0)], "outside \\[0, 3\\)"),
        ([(0.5, 0.0)], "non-integer tokens"),
        ((np.array([0, 1]), np.array([0.0])), "shapes"),
    ],
)
def test_bad_per_prefix_tables_are_named(table, match):
    m = CallableModel(lambda prefix: table, vocab_size=3, max_len=2)
    with pytest.raises(ValueError, match=match):
        rows(m, [(1,)])


def test_bad_return_type_is_a_type_error():
    m = CallableModel(lambda prefix: 3.0, vocab_size=3, max_len=2)
    with pytest.raises(TypeError, match="list of \\(token, log_prob\\) pairs"):
        rows(m, [()])


def test_error_names_the_prefix():
    m = CallableModel(lambda p: [(0, 0.5)] if p == (2, 1) else pairs_fn(p), vocab_size=3, max_len=3)
    rows(m, [(), (1,)])
    with pytest.raises(ValueError, match="\\(2, 1\\)"):
        rows(m, [(0,), (2, 1)])


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda b: np.zeros((b, 4), np.float32), "shape"),
        (lambda b: np.full((b, 3), np.nan, np.float32), "NaN"),
        (lambda b: np.tile(np.float32([0.1, -3, -3]), (b, 1)), "> 0"),
        (lambda b: np.full((b, 3), -0.1, np.float32), "not a distribution"),
        (lambda b: np.zeros((b, 3), np.int32), "dtype"),
    ],
)
def test_bad_batched_rows_are_named(make, match):
    m = CallableModel(lambda p, n: make(p.shape[0]), vocab_size=3, max_len=2, batched=True)
    with pytest.raises(ValueError, match=match):
        m.next_logprobs(np.zeros((4, 2), np.int32), np.zeros(4, np.int32))


def test_float_noise_is_tolerated():
    lp = np.log(np.float32([0.5, 0.5])) + np.float32(1e-7)
    m = CallableModel(lambda p: (np.array([0, 1]), lp), vocab_size=2, max_len=1)
    assert rows(m, [()]).shape == (1, 2)


def test_prompted_callable_scores_conditional_continuations():
    tables = {p: np.log([0.2, 0.5, 0.3]) if len(p) % 2 else np.log([0.4, 0.4, 0.2]) for p in
              [(), (1,), (2,), (1, 1), (1, 2), (2, 1), (2, 2)]}
    model = CallableModel(lambda p: (np.arange(3), tables[tuple(p)]), vocab_size=3, max_len=3, eos=0)
    prompted = model.with_prompt((1,))
    assert prompted.max_len == 2
    got = prompted.score_sequences([(0,), (2, 0)])
    first = float(np.float32(np.log(0.4)))  # the model's rows are float32
    want = [model.log_density((1, 0)) - first, model.log_density((1, 2, 0)) - first]
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert model.score_sequences([(1, 2, 0)], skip=[3])[0] == 0.0


@pytest.mark.parametrize("batched", [False, True])
def test_both_forms_pass_the_frontier_checks(batched):
    from brute import TableModel, as_model

    table = TableModel(4, 4, 3, eos=0, temperature=2.0)
    model = as_model(table, batched=batched)
    seqs = [s for s in table.support() if len(s) >= 2][:12]
    check_frontier(model, seqs, atol=1e-6)
    check_frontier(model, seqs, atol=1e-6, skip=[1] * len(seqs))
    check_frontier(model.with_prompt(seqs[0][:1]), [s[1:] for s in seqs if s[0] == seqs[0][0]], atol=1e-6)


def test_positive_noise_is_clipped_on_every_path():
    """A per-prefix table with steps up to SIGN_TOL above 0: rows, scores and the index agree."""

    def fn(prefix):
        if prefix == ():
            return np.array([1, 2]), np.array([-np.log(2), -np.log(2) + 5e-6])
        return np.array([0]), np.array([1e-5])

    m = CallableModel(fn, vocab_size=3, max_len=2)
    rows = m.next_logprobs(np.array([[1]], np.int32), np.array([1], np.int32))
    assert rows.max() <= 0.0
    assert m.score_sequences([(1, 0), (2, 0)]).max() <= 0.0
    fs = m.score_frontier([(1, 0)], top_m=2)
    assert fs.steps.max() <= 0.0 and fs.top_lps.max() <= 0.0
