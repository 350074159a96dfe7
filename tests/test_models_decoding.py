"""Incremental decoding (key/value caches): cached rows equal full forwards to float32 noise, and
level-by-level callers pay one token position per prefix whose parent's cache is held."""

import collections
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrescore.baselines.best_first import best_first_top_k
from jaxrescore.index.seek import SeekIndex
from jaxrescore.models import CallableModel, DecodingSession, decoding_session
from jaxrescore.models.apply_fn import from_apply_fn
from jaxrescore.models.int8 import quantize_int8
from jaxrescore.models.ngram import NGramLM
from jaxrescore.models.transformer import TransformerConfig, TransformerLM
from jaxrescore.models.base import Structure
from jaxrescore.rescore.speculate import greedy_complete
from jaxrescore.sequences import bucket_size
from model_checks import check_protocol

ATOL = 1e-5


def tiny(**kw):
    cfg = dict(vocab_size=6, d_model=32, n_layers=2, n_heads=2, max_len=12, eos=0)
    cfg.update(kw)
    return TransformerLM(TransformerConfig(**cfg), seed=3)


def levels(session, model, rng, n=24, depth=6):
    """Expand ``n`` random paths level by level through ``session``; compare every level with
    the model's own full forward."""
    v = model.vocab_size
    paths = rng.integers(1, v, size=(n, depth)).astype(np.int32)
    for d in range(depth + 1):
        lens = np.full(n, d, np.int32)
        got = session.next_logprobs(paths[:, : max(d, 1)], lens)
        want = model.next_logprobs(paths[:, : max(d, 1)], lens)
        assert got.dtype == np.float32 and got.shape == want.shape
        np.testing.assert_allclose(got, want, atol=ATOL)
        assert (got <= 0).all()


@pytest.mark.parametrize("positions,eos", [("learned", 0), ("sinusoidal", None)])
def test_cached_rows_equal_full_forwards(positions, eos):
    m = tiny(positions=positions, eos=eos)
    session = decoding_session(m)
    assert isinstance(session, DecodingSession)
    levels(session, m, np.random.default_rng(0))
    # level d > 1 extended every row from its parent: one position each
    assert session.extended == 24 * 5
    assert session.positions == 24 * 6


def test_mixed_lengths_prefill_and_eviction():
    m = tiny()
    rng = np.random.default_rng(1)
    pre = rng.integers(1, 6, size=(40, 9)).astype(np.int32)
    lens = rng.integers(0, 10, size=40).astype(np.int32)
    for max_bytes in (0, 1 << 14, None):  # nothing held, a few slabs held, the default
        s = decoding_session(m, max_bytes=max_bytes)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            np.testing.assert_allclose(s.next_logprobs(pre, lens), m.next_logprobs(pre, lens), atol=ATOL)
        # a budget too small for one call's caches says so; none (0) and the default do not
        assert len(caught) == (max_bytes == 1 << 14)
        child = np.concatenate([pre, rng.integers(1, 6, size=(40, 1)).astype(np.int32)], axis=1)
        clens = np.minimum(lens + 1, 10).astype(np.int32)
        np.testing.assert_allclose(s.next_logprobs(child, clens), m.next_logprobs(child, clens), atol=ATOL)
        assert s.nbytes <= s.max_bytes
        if max_bytes == 0:
            assert s.extended == 0
        if max_bytes is None:
            assert s.extended == int(np.count_nonzero((lens >= 1) & (lens < 10)))


def test_new_weights_drop_the_caches():
    m = tiny()
    s = decoding_session(m)
    pre = np.array([[1, 2, 3]], np.int32)
    s.next_logprobs(pre, [2])
    m.params = jax.tree.map(lambda x: x * 1.3, m.params)
    np.testing.assert_allclose(s.next_logprobs(pre, [3]), m.next_logprobs(pre, [3]), atol=ATOL)
    assert s.extended == 0


def test_prompt_cache_is_computed_once_and_rows_match():
    m = tiny(max_len=40)
    prompt = tuple(int(t) for t in np.random.default_rng(2).integers(1, 6, size=20))
    pm = m.with_prompt(prompt)
    pre = np.array([[1, 2, 3], [4, 5, 1]], np.int32)
    for n in range(4):
        lens = np.full(2, n, np.int32)
        full = np.concatenate([np.tile(prompt, (2, 1)), pre], axis=1).astype(np.int32)
        np.testing.assert_allclose(pm.next_logprobs(pre, lens), m.next_logprobs(full, lens + 20), atol=ATOL)
    ctx = pm._decode_context
    pm.next_logprobs(pre, [1, 2])
    assert pm._decode_context is ctx  # the prompt's cache is reused, not recomputed
    s = decoding_session(pm)
    levels(s, pm, np.random.default_rng(3), n=8, depth=4)
    assert s.positions == 8 * 4  # continuation positions only: the prompt was paid once
    check_protocol(pm.base, [(1, 2, 0), (3, 0), (4, 4, 5, 0), (0,)])


def test_int8_twin_decodes_incrementally():
    q = quantize_int8(tiny())
    levels(decoding_session(q), q, np.random.default_rng(4), n=8, depth=4)


def test_models_without_an_incremental_forward():
    ng = NGramLM.fit([(1, 2, 0), (2, 0)], order=2, vocab_size=3, eos=0, max_len=4)
    assert decoding_session(ng) is None
    cm = CallableModel(lambda p: ([0, 1], [np.log(0.5)] * 2), vocab_size=2, max_len=3, eos=0)
    assert decoding_session(cm) is None
    with pytest.raises(TypeError, match="incremental"):
        DecodingSession(ng)


V, D = 4, 8


def mean_apply(params, tokens):
    """A causal LM as one function: running mean of embeddings, then a linear head."""
    x = params["emb"][tokens]
    t = tokens.shape[1]
    h = jnp.cumsum(x, axis=1) / jnp.arange(1, t + 1, dtype=jnp.float32)[None, :, None]
    return jnp.tanh(h) @ params["out"] + params["bias"]


def mean_init_cache(batch, max_length):
    return {"sum": jnp.zeros((batch, D))}


def mean_step(params, cache, tokens, positions):
    """The same model one token at a time: the cache is the running sum (not a per-position
    store), so a step is any function of the cache."""
    s = cache["sum"] + params["emb"][tokens[:, 0]]
    h = s / (positions[:, None] + 1.0)
    return (jnp.tanh(h) @ params["out"] + params["bias"])[:, None], {"sum": s}


def mean_params():
    k1, k2 = jax.random.split(jax.random.PRNGKey(0))
    return {"emb": jax.random.normal(k1, (V + 1, D)), "out": jax.random.normal(k2, (D, V)), "bias": jnp.zeros(V)}


def test_apply_fn_with_a_cache_step():
    m = from_apply_fn(mean_apply, mean_params(), vocab_size=V, bos_id=V, max_len=8, eos=0,
                      init_cache=mean_init_cache, step=mean_step)
    s = decoding_session(m)
    levels(s, m, np.random.default_rng(5), n=10, depth=6)
    assert s.extended == 10 * 5
    rng = np.random.default_rng(6)
    pre = rng.integers(1, V, size=(20, 6)).astype(np.int32)
    lens = rng.integers(0, 7, size=20).astype(np.int32)
    np.testing.assert_allclose(decoding_session(m).next_logprobs(pre, lens), m.next_logprobs(pre, lens), atol=ATOL)
    check_protocol(m, [(1, 2, 0), (3, 0), (1, 3, 3, 2, 0)])
    plain = from_apply_fn(mean_apply, mean_params(), vocab_size=V, bos_id=V, max_len=8, eos=0)
    assert decoding_session(plain) is None


def test_apply_fn_cache_pair_is_checked():
    kw = dict(vocab_size=V, bos_id=V, max_len=8, eos=0)
    with pytest.raises(ValueError, match="pair"):
        from_apply_fn(mean_apply, mean_params(), init_cache=mean_init_cache, **kw)
    with pytest.raises(ValueError, match="leading axis"):
        from_apply_fn(mean_apply, mean_params(), init_cache=lambda b, n: {"sum": jnp.zeros(D)}, step=mean_step, **kw)
    bad_step = lambda p, c, t, pos: (mean_step(p, c, t, pos)[0][:, 0], c)  # noqa: E731
    with pytest.raises(ValueError, match="logits of shape"):
        from_apply_fn(mean_apply, mean_params(), init_cache=mean_init_cache, step=bad_step, **kw)


def rows_only(model):
    """The model's next_logprobs without its incremental forward."""
    return CallableModel(model.next_logprobs, vocab_size=model.vocab_size, max_len=model.max_len,
                         eos=model.eos, batched=True)


def test_seek_index_build_costs_one_position_per_prefix():
    m = tiny(max_len=8, d_model=16)
    cached = SeekIndex(m, initial_bits=10, max_depth_bits=10, progress=False)
    plain = SeekIndex(m, initial_bits=10, max_depth_bits=10, progress=False, decode_cache_bytes=0)
    assert len(cached) == len(plain) > 50 and cached.forwards == plain.forwards
    # every row but the root's extended a held parent: one position each
    assert cached.positions == cached.forwards - 1 < plain.positions
    a, b = cached.slice(0, len(cached)), plain.slice(0, len(plain))
    assert {s for s, _ in a} == {s for s, _ in b}
    np.testing.assert_allclose(sorted(lp for _, lp in a), sorted(lp for _, lp in b), atol=1e-4)
    # deepening reuses the caches held from the first pass
    cached.ensure_bits(12)
    assert cached.positions == cached.forwards - 1


def test_best_first_and_greedy_completion_over_cached_rows():
    m = tiny(max_len=7, vocab_size=5)
    got = best_first_top_k(m, 5)
    want = best_first_top_k(rows_only(m), 5)
    assert [s for s, _ in got.items] == [s for s, _ in want.items]
    np.testing.assert_allclose([lp for _, lp in got.items], [lp for _, lp in want.items], atol=1e-4)
    assert got.forwards == want.forwards
    structure = Structure(vocab_size=m.vocab_size, eos=m.eos, max_len=m.max_len)
    prefixes = [(1,), (2, 3), (4, 4, 1), ()]
    assert greedy_complete(m, prefixes, structure, branch=2) == greedy_complete(rows_only(m), prefixes, structure, branch=2)


# ---- caches sized by what a row adds; a budget too small says so once; prefill in one call ------


def test_row_cache_bytes_follow_the_row_not_the_context():
    """A row holds keys and values of its OWN positions, whatever the prompt (held once, on the
    prompted model): 8 positions at max_len 512 with or without a 300-token prompt; a model of
    short rows (max_len 16) keeps its rows at 16 positions, the power of two covering them."""
    held = []
    for max_len, prompt in ((16, ()), (512, ()), (512, tuple(range(1, 6)) * 60)):
        m = tiny(max_len=max_len, vocab_size=6, d_model=16)
        model = m.with_prompt(prompt) if prompt else m
        s = decoding_session(model)
        paths = np.random.default_rng(7).integers(1, 6, size=(8, 3)).astype(np.int32)
        for d in (1, 2, 3):
            s.next_logprobs(paths[:, :d], np.full(8, d, np.int32))
        assert s.held_rows == 24  # the padding rows of each call (to 32) are not held
        held.append(s.bytes_per_row)
    # 2 (keys, values) x 2 layers x positions x d_model 16 x 4 bytes
    assert held == [2 * 2 * 16 * 16 * 4] + [2 * 2 * 8 * 16 * 4] * 2


def test_a_budget_too_small_for_one_call_warns_once():
    m = tiny()
    s = decoding_session(m, max_bytes=4096)
    paths = np.random.default_rng(8).integers(1, 6, size=(20, 5)).astype(np.int32)
    with pytest.warns(UserWarning, match=r"need [\d,]+ bytes .* max_bytes=4,096") as caught:
        for d in range(1, 6):
            rows = s.next_logprobs(paths[:, :d], np.full(20, d, np.int32))
            np.testing.assert_allclose(rows, m.next_logprobs(paths[:, :d], np.full(20, d, np.int32)), atol=ATOL)
    assert len([w for w in caught if "DecodingSession" in str(w.message)]) == 1
    assert s.extended == 0 and s.nbytes <= 4096


def test_default_budget_env_variable(monkeypatch):
    from jaxrescore.models.decoding import CACHE_BYTES_ENV, default_cache_bytes

    monkeypatch.setenv(CACHE_BYTES_ENV, "12345")
    assert decoding_session(tiny()).max_bytes == default_cache_bytes() == 12345
    monkeypatch.setenv(CACHE_BYTES_ENV, "lots")
    with pytest.raises(ValueError, match=CACHE_BYTES_ENV):
        default_cache_bytes()


def test_rows_continue_from_a_held_ancestor_in_one_call():
    """Teacher forcing from a cached prefix: rows whose parent is not held but an ancestor is run
    their remaining tokens in one call on top of it, equal to the full forward and to the
    level-by-level rows."""
    m = tiny(max_len=20)
    rng = np.random.default_rng(9)
    paths = rng.integers(1, 6, size=(12, 9)).astype(np.int32)
    s = decoding_session(m)
    s.next_logprobs(paths[:, :2], np.full(12, 2, np.int32))
    lens = rng.integers(3, 10, size=12).astype(np.int32)
    calls, positions = s.calls, s.positions
    np.testing.assert_allclose(s.next_logprobs(paths, lens), m.next_logprobs(paths, lens), atol=ATOL)
    # one call per power of two of tokens the rows add, not a call per token
    assert s.calls == calls + len({bucket_size(int(n) - 2, 1) for n in lens}) and s.extended == 12
    assert s.positions - positions == int((lens - 2).sum())
    step_by_step = decoding_session(m)
    for d in range(1, 10):
        step_by_step.next_logprobs(paths[:, :d], np.full(12, d, np.int32))
    np.testing.assert_allclose(step_by_step.next_logprobs(paths, lens), s.next_logprobs(paths, lens), atol=ATOL)


def test_a_step_model_prefills_a_prompt_in_one_call(monkeypatch):
    """A from_apply_fn step runs a W-token prefill as a scan inside ONE compiled call (a prompt
    used to cost a call per token); its rows equal the step-by-step session's and the full
    forward's."""
    from jaxrescore.models import decoder, decoding

    m = from_apply_fn(mean_apply, mean_params(), vocab_size=V, bos_id=V, max_len=64, eos=0,
                      init_cache=mean_init_cache, step=mean_step)
    prompt = tuple(int(t) for t in np.random.default_rng(10).integers(1, V, size=40))
    pm = m.with_prompt(prompt)
    calls = []
    real = decoding._decode
    for module in (decoder, decoding):  # the context's call, the session's calls
        monkeypatch.setattr(module, "_decode", lambda *a: calls.append(a[2].shape) or real(*a))
    pre = np.random.default_rng(11).integers(1, V, size=(6, 7)).astype(np.int32)
    lens = np.array([0, 1, 3, 5, 7, 7], np.int32)
    full = np.concatenate([np.tile(prompt, (6, 1)), pre], axis=1).astype(np.int32)
    np.testing.assert_allclose(pm.next_logprobs(pre, lens), m.next_logprobs(full, lens + 40), atol=ATOL)
    # the prompt in one call (41 positions in a context of 8 * 4**2), then one call per power of
    # four of tokens the rows add (1, 3 -> 4, 5 and 7 -> 16), not a call per token
    assert calls == [(1, 128), (32, 1), (32, 4), (32, 16)]
    s = decoding_session(pm)
    for d in range(1, 8):
        s.next_logprobs(pre[:, :d], np.full(6, d, np.int32))
    np.testing.assert_allclose(s.next_logprobs(pre, lens), pm.next_logprobs(pre, lens), atol=ATOL)


def test_rows_held_by_many_calls_extend_in_one_call_each_width():
    """Held caches are pooled by shape (jaxrescore.models.cache_pool): a batch whose parents
    were computed by 12 different calls is one device call, answers the model's own rows, and
    a budget that evicts reuses the freed slots (the pool stays within it)."""
    m = tiny()
    s = decoding_session(m)
    paths = np.random.default_rng(11).integers(1, 6, size=(12, 4)).astype(np.int32)
    for i in range(12):  # each parent by a call of its own, through its own ancestors
        for d in (1, 2, 3):
            s.next_logprobs(paths[i : i + 1, :d], [d])
    calls = s.calls
    rows = s.next_logprobs(paths, np.full(12, 4, np.int32))
    np.testing.assert_allclose(rows, m.next_logprobs(paths, np.full(12, 4, np.int32)), atol=ATOL)
    assert s.calls == calls + 1 and s.extended == 12 * 3
    per_row = s.bytes_per_row
    small = decoding_session(m, max_bytes=int(per_row * 40))
    for d in range(1, 5):
        for part in np.array_split(np.arange(12), 3):
            got = small.next_logprobs(paths[part, :d], np.full(part.size, d, np.int32))
            np.testing.assert_allclose(got, m.next_logprobs(paths[part, :d], np.full(part.size, d, np.int32)), atol=ATOL)
    assert small.nbytes <= small.max_bytes and small.extended == 12 * 3  # every parent was still held
    for session in (s, small):  # the held lengths count exactly the keys held, after evictions too
        assert session._lengths == collections.Counter(len(key) // 4 for key in session._where)
    assert small._pools.capacity_bytes() <= 64 * per_row  # the pool of 40 rows: 64 slots at most


def test_a_call_that_passes_the_budget_reads_the_parents_it_planned_to():
    """Regression: a call's first group (fresh rows from the context) passes the budget while a
    later group of the same call extends held parents. Dropping the oldest caches mid-call let
    the first group's rows overwrite the parents' slots (cached rows off by nats); they are
    dropped at the call's end, so every row still equals the model's own."""
    m = tiny()
    rng = np.random.default_rng(12)
    parents = rng.integers(1, 6, size=(8, 3)).astype(np.int32)
    s = decoding_session(m)
    s.next_logprobs(parents, np.full(8, 3, np.int32))
    s.max_bytes = int(s.bytes_per_row * 12)  # room for the parents and 4 rows more
    fresh = rng.integers(1, 6, size=(16, 4)).astype(np.int32)
    children = np.concatenate([parents, rng.integers(1, 6, size=(8, 1)).astype(np.int32)], axis=1)
    prefixes, lengths = np.concatenate([fresh, children]), np.full(24, 4, np.int32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        got = s.next_logprobs(prefixes, lengths)
    np.testing.assert_allclose(got, m.next_logprobs(prefixes, lengths), atol=ATOL)
    assert s.extended >= 8 and s.nbytes <= s.max_bytes  # the children (fresh rows may share prefixes too)


def test_host_pool_rows_are_gathered_aligned_for_the_device():
    """A CPU session's pooled rows reach the decode call in place: they are gathered into arrays
    starting on a 64-byte boundary (numpy's own start 16 bytes past one, and the CPU backend
    copies those on every call), with the pool's values, dtype and shape, for any rows."""
    from jaxrescore.models.cache_pool import DEVICE_ALIGN, CachePools, aligned_empty, pool_key

    for shape, dtype in (((3, 5), np.float32), ((7,), np.int8), ((2, 3, 4, 5), np.float64)):
        a = aligned_empty(shape, dtype)
        assert a.shape == shape and a.dtype == dtype and a.ctypes.data % DEVICE_ALIGN == 0
    rng = np.random.default_rng(3)
    cache = ((rng.normal(size=(8, 2, 4, 3)).astype(np.float32), rng.normal(size=(8, 2, 4, 3)).astype(np.float32)),)
    pools = CachePools(jax.device_put, host=True)
    key = pool_key(cache, 4)
    slots = pools.store(key, cache, 6, 64)
    for want in ([0, 5, 5, 2], [3], list(range(6))):
        got = pools.take(key, slots[want])
        for leaf, src in zip(jax.tree.leaves(got), jax.tree.leaves(cache)):
            assert leaf.ctypes.data % DEVICE_ALIGN == 0 and leaf.dtype == src.dtype
            np.testing.assert_array_equal(leaf, src[want])


def test_a_pool_of_tiny_rows_reuses_the_last_freed_slots_first_and_lists_no_free_slot():
    """A host pool is made at its cap: for a user's step model with 32-byte rows that is ~2**25
    slots, which a list of free slots took ~3 s to build and ~1 s to drop (every such session's
    first call). Never-used slots are a counter now; the order is unchanged: the last freed slot
    first, then the lowest never-used."""
    from jaxrescore.models.cache_pool import CachePools, pool_key

    cache = {"sum": np.arange(32, dtype=np.float32).reshape(4, 8)}
    for host in (True, False):
        pools = CachePools(jax.device_put, host=host)
        key = pool_key(cache, 1)
        first = pools.store(key, cache, 4, 1 << 25)
        assert first.tolist() == [0, 1, 2, 3] and len(pools._pools[key][2]) == 0
        pools.free(key, first[[1, 2]])
        again = pools.store(key, cache, 3, 1 << 25)
        assert again.tolist() == [2, 1, 4]
        got = np.asarray(pools.take(key, np.array([2, 1, 4, 0]))["sum"])
        np.testing.assert_array_equal(got, cache["sum"][[0, 1, 2, 0]])
    assert pools._pools[key][1] < 1 << 25  # a device pool grows as it fills
