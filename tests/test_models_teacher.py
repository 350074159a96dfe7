"""DecodingSession.teacher_force: teacher forcing over held key/value caches (a radix cache over
every prefix fed) equals the model's own score_frontier at the same positions, and computes
exactly the token positions it must (a held prefix is never recomputed)."""

import warnings

import numpy as np
import pytest

from jaxrescore.models import decoding_session, from_pretrained
from jaxrescore.models.apply_fn import from_apply_fn
from jaxrescore.models.transformer import TransformerConfig, TransformerLM
from test_models_decoding import V as MEAN_V, mean_apply, mean_init_cache, mean_params, mean_step

TOL = 1e-4


def tiny(**kw):
    cfg = dict(vocab_size=6, d_model=16, n_layers=2, n_heads=2, max_len=12, eos=0)
    cfg.update(kw)
    return TransformerLM(TransformerConfig(**cfg), seed=5)


def check(model, session, rows, known, top_m):
    """``session.teacher_force`` against ``model.score_frontier`` position by position; returns
    the positions the call computed."""
    got, positions = session.teacher_force(rows, known, top_m)
    want = model.score_frontier(rows, top_m=top_m)
    n, w = len(rows), max([len(r) - k for r, k in zip(rows, known)], default=0)
    assert got.steps.shape == (n, w) and got.steps.dtype == np.float64
    assert got.top_lps.shape[:2] == (n, w) and got.top_ids.dtype == np.int32 and got.eos_lps.dtype == np.float32
    for i, (row, k) in enumerate(zip(rows, known)):
        new = slice(k, len(row))
        np.testing.assert_allclose(got.steps[i, : len(row) - k], want.steps[i, new], atol=TOL)
        assert (got.steps[i, len(row) - k :] == 0).all()
        np.testing.assert_allclose(got.eos_lps[i, : len(row) - k], want.eos_lps[i, new], atol=TOL)
        np.testing.assert_allclose(got.top_lps[i, : len(row) - k], want.top_lps[i, new], atol=TOL)
        vals = want.top_lps[i, new]
        # ids agree wherever the value is not within float noise of a neighbour
        apart = np.ones(vals.shape, bool)
        if vals.shape[-1] > 1:
            gap = np.abs(np.diff(vals, axis=-1)) > 1e-4
            apart[..., :-1] &= gap
            apart[..., 1:] &= gap
        assert (got.top_ids[i, : len(row) - k][apart] == want.top_ids[i, new][apart]).all()
        assert got.scores[i] == pytest.approx(want.steps[i, new].sum(), abs=TOL * max(len(row), 1))
    return positions


def random_rows(rng, n, vocab, max_len, eos):
    out = []
    for _ in range(n):
        body = tuple(int(t) for t in rng.integers(1, vocab, size=int(rng.integers(1, max_len))))
        out.append(body + ((eos,) if eos is not None else ()))
    return out


@pytest.mark.parametrize("eos,prompt", [(0, ()), (None, (2, 3, 1, 4))])
def test_matches_score_frontier_over_rounds(eos, prompt):
    base = tiny(eos=eos)
    model = base.with_prompt(prompt) if prompt else base
    session = decoding_session(model)
    rng = np.random.default_rng(0)
    rows = random_rows(rng, 10, 6, model.max_len - 2, eos)
    top_m = 3 if eos is not None else 6  # a device top-m, and whole rows (m >= V = 6)
    fed = {r[:-1] for r in rows}
    leaves = [f for f in fed if not any(g != f and g[: len(f)] == f for g in fed)]
    # fed from the context, each distinct fed prefix once (one that is a prefix of another is read off it)
    assert check(model, session, rows, [0] * len(rows), top_m) == sum(len(f) for f in leaves)
    # a second round extends held fed prefixes by two tokens each: one position per new token
    longer = [f + (int(rng.integers(1, 6)), 1, rows[0][-1]) for f in leaves]
    assert check(model, session, longer, [len(f) + 1 for f in leaves], top_m) == 2 * len(leaves)


def test_positions_counted_are_exactly_what_is_fed():
    m = tiny()
    s = decoding_session(m)
    assert check(m, s, [(1, 2, 3, 4, 5)], [0], 3) == 4  # feeds (1, 2, 3, 4); position 0 is free
    # extends the held (1, 2, 3, 4) by 3 tokens, known = held length + 1: feeds (5, 1)
    assert check(m, s, [(1, 2, 3, 4, 5, 1, 0)], [5], 3) == 2
    # every prefix of a fed row is held: (1, 2) serves a row diverging after it
    assert check(m, s, [(1, 2, 5, 5)], [3], 3) == 1
    # (1, 4) is not held: the row continues from (1,) and computes one extra position
    assert check(m, s, [(1, 4, 4, 4)], [3], 3) == 2
    # nothing new: known == len costs nothing; position 0 alone is the context's row
    assert check(m, s, [(1, 2, 3), (4,), ()], [3, 0, 0], 3) == 0
    assert check(m, s, [(3, 3)], [0], 3) == 1
    empty = s.teacher_force([], [], 3)
    assert empty.positions == 0 and empty.frontier.steps.shape == (0, 0)
    # rows whose fed prefix is a prefix of another's in the same call are not fed again
    fresh = decoding_session(m)
    rows = [(2, 2, 2, 2, 0), (2, 2, 2, 1), (2, 2, 0), (2, 2, 2, 2, 0), (2, 5, 1)]
    assert check(m, fresh, rows, [0, 0, 1, 2, 0], 3) == 4 + 2
    assert fresh.positions == 6
    # next_logprobs reads the radix too: (2, 2, 2, 2) is held, so its child costs one position
    before = fresh.positions
    got = fresh.next_logprobs(np.array([[2, 2, 2, 2, 1]], np.int32), [5])
    np.testing.assert_allclose(got, m.next_logprobs(np.array([[2, 2, 2, 2, 1]], np.int32), [5]), atol=1e-5)
    assert fresh.positions - before == 1


@pytest.mark.parametrize("family,prompt", [("transformer", ()), ("transformer", (2, 3, 1)), ("gpt2", (3,)),
                                            ("llama", ())])
def test_packed_force_is_the_full_forward_and_holds_caches_to_extend(family, prompt, tmp_path):
    """A session's first rows by ONE packed full forward: the numbers are ``score_frontier``'s,
    the positions the packed sequence's (the context and each distinct prefix once), and the
    caches it holds serve later rows exactly as a feed's would (one position per new token)."""
    if family == "transformer":
        base = tiny()
    else:
        pytest.importorskip("safetensors.numpy")
        pytest.importorskip("tokenizers")
        from test_models_pretrained import write_gpt2_pair, write_llama_pair

        base = from_pretrained((write_gpt2_pair if family == "gpt2" else write_llama_pair)(tmp_path)[0])
    model = base.with_prompt(prompt) if prompt else base
    eos, v = model.eos, min(model.vocab_size, 6)
    rows = random_rows(np.random.default_rng(4), 12, v, min(model.max_len, 8) - 1, eos)
    rows += [rows[0][:1] + (eos,), ()]  # a shared prefix; an empty row
    session = decoding_session(model)
    got, positions = session.packed_force(rows, 4)
    want = model.score_frontier(rows, top_m=4)
    np.testing.assert_allclose(got.scores, want.scores, atol=1e-5)
    np.testing.assert_allclose(got.top_lps, want.top_lps, atol=1e-5)
    distinct = {r[:j] for r in rows for j in range(1, len(r))}
    assert positions == session.positions == len(prompt) + 1 + len(distinct)
    assert positions < sum(len(r) for r in rows)
    for fed in sorted({r[:-1] for r in rows if len(r) > 1}):  # each held: one new position
        assert check(model, session, [fed + (1, eos)], [len(fed) + 1], 4) == 1


def test_packed_force_declines_when_feeding_computes_less():
    """A long prompt again for a few short rows costs more than feeding them over the held
    context: packed_force returns None (the caller feeds them), and a session without a packed
    forward (a user's step model) always does."""
    model = tiny().with_prompt((1, 2, 3, 4, 5, 1, 2, 3))
    assert decoding_session(model).packed_force([(1, 2, 0), (2, 0)], 3) is None  # 9 + 3 > 2 * 3
    m = from_apply_fn(mean_apply, mean_params(), vocab_size=MEAN_V, bos_id=MEAN_V, max_len=8, eos=0,
                      init_cache=mean_init_cache, step=mean_step)
    assert decoding_session(m).packed_force([(1, 2, 3, 0)], 3) is None


def test_eviction_under_a_tiny_budget_stays_correct():
    m = tiny()
    s = decoding_session(m, max_bytes=1 << 12)
    rng = np.random.default_rng(1)
    rows = random_rows(rng, 12, 6, 9, 0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        check(m, s, rows, [0] * 12, 3)
        longer = [r[:-1] + (2, 0) for r in rows]
        check(m, s, longer, [len(r) - 1 for r in rows], 3)
    assert s.nbytes <= s.max_bytes


def test_bad_known_is_refused():
    s = decoding_session(tiny())
    for known in ([-1, 0], [0, 3], [0], [[0, 0]], [0.5, 0]):
        with pytest.raises(ValueError, match="known"):
            s.teacher_force([(1, 2), (3, 0)], known, 3)


def test_gpt2_matches_score_frontier(tmp_path):
    pytest.importorskip("safetensors.numpy")
    pytest.importorskip("tokenizers")
    from test_models_pretrained import GPT2_EOS, write_gpt2_pair

    model = from_pretrained(write_gpt2_pair(tmp_path)[0])
    s = decoding_session(model)
    rows = random_rows(np.random.default_rng(2), 8, GPT2_EOS, 6, GPT2_EOS)
    check(model, s, rows, [0] * len(rows), 4)
    longer = [r[:-1] + (3, GPT2_EOS) for r in rows if len(r) < 7]
    assert check(model, s, longer, [len(r) for r in rows if len(r) < 7], 16) == len(longer)


def test_a_step_model_keys_only_whole_fed_prefixes():
    """A user's step cache may be any function of its row (here a running sum): a row continues
    only from a held WHOLE fed prefix, never from a shorter prefix of a held row."""
    m = from_apply_fn(mean_apply, mean_params(), vocab_size=MEAN_V, bos_id=MEAN_V, max_len=8, eos=0,
                      init_cache=mean_init_cache, step=mean_step)
    s = decoding_session(m)
    assert check(m, s, [(1, 2, 3, 0), (2, 1, 0)], [0, 0], 2) == 3 + 2
    assert check(m, s, [(1, 2, 3, 1, 0)], [4], 2) == 1  # (1, 2, 3) held: feeds (1,)
    assert check(m, s, [(1, 2, 2, 0)], [3], 4) == 3  # (1, 2) is not held by itself: from the context


def test_the_host_top_m_names_each_read_positions_largest_values():
    """On the CPU backend teacher forcing ships whole rows and the host picks the top-m
    (FrontierReduce.on_host): at each position a row fed, the m largest values (descending) with
    ids naming them, ties included; positions past a row's fed tokens are never read and name
    nothing."""
    from jaxrescore.models.scores import host_top_m
    from jaxrescore.models.teacher import FrontierReduce

    rng = np.random.default_rng(3)
    lp = np.round(rng.standard_normal((5, 4, 9)), 1).astype(np.float32)  # rounded: many ties
    lp[0, 0, :] = -np.inf
    fed = np.array([4, 1, 0, 3, 2])
    reduce = FrontierReduce(top_m=3, eos=None, full=False, host=True)
    steps, extra, eos_lps = np.zeros((5, 4)), np.zeros(2), np.zeros((5, 4))
    out = reduce.on_host((steps, extra, lp, np.zeros(1, np.int32), eos_lps), fed)
    assert out[0] is steps and out[1] is extra and out[4] is eos_lps
    top_lps, top_ids = out[2], out[3]
    for r in range(5):
        for c in range(4):
            if c >= fed[r]:
                assert np.all(top_lps[r, c] == -np.inf)
                continue
            want = np.sort(lp[r, c])[::-1][:3]
            np.testing.assert_array_equal(top_lps[r, c], want)
            np.testing.assert_array_equal(lp[r, c][top_ids[r, c]], want)
            named = top_ids[r, c][np.isfinite(want)].tolist()  # -inf names id 0 (padding)
            assert len(set(named)) == len(named)
    vals, ids = host_top_m(lp[1, :1], 12)  # m >= V: the whole row, padded
    assert vals.shape == (1, 12) and np.array_equal(vals[0, :9], lp[1, 0]) and np.all(vals[0, 9:] == -np.inf)
