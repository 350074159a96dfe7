"""from_nnx: a flax nnx module with Dropout and BatchNorm scores as the module does in eval mode,
trains through train_lm (nnx.Param state only: RNG and batch-stat state held fixed), hands its
weights back with nnx.update, saves and loads into a fresh module (save_model / load_model(like=))
and proves the same top-k after the round trip. Also the adapter-file errors and the old route's
(nnx.split + from_apply_fn) message."""

import itertools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from flax import nnx
from model_checks import check_cached_rows

from jaxrescore import RescoredIndex, SeekIndex
from jaxrescore.models import (
    NGramLM,
    TransformerConfig,
    TransformerLM,
    from_apply_fn,
    from_linen,
    from_nnx,
    load_model,
    quantize_int8,
    save_model,
    train_lm,
)
from jaxrescore.models.checkpoint import ModelFileError

V, D, MAX_LEN, EOS = 6, 8, 4, 0
BOS = V  # an extra embedding row
KW = dict(vocab_size=V, bos_id=BOS, max_len=MAX_LEN, eos=EOS)


class NnxLM(nnx.Module):
    """Batched causal LM: tokens int32[B, T] -> logits float[B, T, V]; a running mean of
    embeddings, BatchNorm over features, Dropout, a dense head."""

    def __init__(self, rngs: nnx.Rngs, dim: int = D):
        self.embed = nnx.Embed(V + 1, dim, rngs=rngs)
        self.norm = nnx.BatchNorm(dim, momentum=0.5, rngs=rngs)
        self.drop = nnx.Dropout(0.5, rngs=rngs)
        self.head = nnx.Linear(dim, V, rngs=rngs)

    def __call__(self, tokens, scale: float = 1.0):
        h = self.embed(tokens)
        h = jnp.cumsum(h, axis=1) / jnp.arange(1, tokens.shape[1] + 1, dtype=jnp.float32)[:, None]
        return scale * self.head(self.drop(jnp.tanh(self.norm(h))))


def nnx_model(seed=0):
    """A module in TRAIN mode whose batch statistics moved away from their initial values (so
    eval mode and train mode really differ)."""
    model = NnxLM(nnx.Rngs(seed))
    warm = jnp.asarray(np.random.default_rng(seed).integers(0, V + 1, size=(16, MAX_LEN)), jnp.int32)
    model(warm)  # train mode: updates the running mean / var, consumes a dropout key
    assert not np.allclose(model.norm.mean[...], 0.0)
    return model


def support():
    body = [s for n in range(MAX_LEN) for s in itertools.product(range(1, V), repeat=n)]
    return [tuple(s) + (EOS,) for s in body]


def sample(n, seed):
    """Sequences of 0..3 tokens, mostly 1s and 2s, ending with EOS."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        body = rng.choice([1, 2, 3], size=rng.integers(0, MAX_LEN), p=[0.6, 0.3, 0.1])
        out.append(tuple(int(t) for t in body) + (EOS,))
    return out


def module_scores(model, seqs):
    """float64[N]: log-probs of ``seqs`` by calling the nnx module itself (teacher forcing)."""
    tokens = np.zeros((len(seqs), MAX_LEN), np.int32)
    inputs = np.full((len(seqs), MAX_LEN), BOS, np.int32)
    for i, s in enumerate(seqs):
        tokens[i, : len(s)] = s
        inputs[i, 1 : len(s)] = s[:-1]
    lp = np.asarray(jax.nn.log_softmax(model(jnp.asarray(inputs)), axis=-1))
    steps = np.take_along_axis(lp, tokens[..., None], axis=-1)[..., 0]
    mask = np.arange(MAX_LEN)[None, :] < np.array([len(s) for s in seqs])[:, None]
    return np.where(mask, steps, 0.0).astype(np.float64).sum(axis=1)


def paths(state):
    return {jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(state)[0]}


def leaves(state):
    """The leaves of ``state`` as numpy arrays (typed RNG keys as their key data)."""
    def host(x):
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            x = jax.random.key_data(x)
        return np.asarray(x)

    return [host(x) for x in jax.tree.leaves(state)]


def test_scores_equal_the_module_in_eval_mode_and_leave_it_unchanged():
    model = nnx_model()
    before = leaves(nnx.state(model))
    lm = from_nnx(model, **KW)
    assert "nnx:NnxLM" in repr(lm)
    # the user's module is untouched: still in train mode, same state
    assert model.drop.deterministic is False and model.norm.use_running_average is False
    assert all(np.array_equal(a, b) for a, b in zip(before, leaves(nnx.state(model))))
    # params are the nnx.Param state only; batch stats and RNG state are held by the forward
    assert isinstance(lm.params, nnx.State)
    assert paths(lm.params) == paths(nnx.state(model, nnx.Param))
    held = paths(lm.apply.state)
    assert held == paths(nnx.split(model, nnx.Param, ...)[2])
    assert {"['norm']['mean'].value", "['drop']['rngs']['key'].value"} <= held
    seqs = support()
    scores = lm.score_sequences(seqs)
    evaluated = nnx.clone(model)
    evaluated.eval()
    np.testing.assert_allclose(scores, module_scores(evaluated, seqs), atol=1e-5)
    np.testing.assert_array_equal(lm.score_sequences(seqs), scores)  # deterministic: no dropout
    # method= and call_kwargs= reach the module
    hot = from_nnx(model, call_kwargs={"scale": 2.0}, **KW)
    assert hot.apply != lm.apply
    np.testing.assert_allclose(
        hot.score_sequences(seqs[:20]),
        module_scores(lambda t: evaluated(t, scale=2.0), seqs[:20]), atol=1e-5,
    )
    # two adapters of one module share the forward (and its compiles)
    again = from_nnx(model, **KW)
    assert again.apply == lm.apply and hash(again.apply) == hash(lm.apply)


def test_train_hand_back_save_load_and_prove(tmp_path):
    """The issue's workflow: from_nnx, train_lm, nnx.update, save_model, load_model(like=) into a
    fresh module, and a proven top-k with the loaded target equal to the one before saving."""
    model = nnx_model(1)
    lm = from_nnx(model, **KW)
    fixed = leaves(lm.apply.state)
    start = leaves(lm.params)
    train, held_out = sample(128, seed=2), sample(64, seed=3)
    before = lm.score_sequences(held_out).mean()
    losses = train_lm(lm, train, steps=40, batch_size=32, lr=3e-2, progress=False)
    assert losses[-5:].mean() < losses[:5].mean()
    assert lm.score_sequences(held_out).mean() > before + 0.3  # held-out log-likelihood up
    assert all(not np.allclose(a, b) for a, b in zip(start, leaves(lm.params)))  # every weight moved
    # batch statistics and RNG state held fixed
    assert all(np.array_equal(a, b) for a, b in zip(fixed, leaves(lm.apply.state)))

    # hand back: the user's module (eval mode) computes the adapter's log-probs
    seqs = support()
    trained = lm.score_sequences(seqs)
    nnx.update(model, lm.params)
    model.eval()
    np.testing.assert_allclose(module_scores(model, seqs), trained, atol=1e-5)
    np.testing.assert_allclose(module_scores(lm.to_nnx(), seqs), trained, atol=1e-5)

    draft = NGramLM.fit(sample(200, seed=4), order=2, vocab_size=V, eos=EOS, max_len=MAX_LEN)
    k = 5
    answer = RescoredIndex(SeekIndex(draft), lm).top_k(k, prove=True)
    assert answer.proven is True
    np.testing.assert_allclose([lp for _, lp in answer.items], np.sort(trained)[::-1][:k], atol=1e-6)

    path = tmp_path / "lm.npz"
    save_model(lm, path)
    assert [p.name for p in tmp_path.iterdir()] == ["lm.npz"]  # atomic: no temporary left

    fresh = NnxLM(nnx.Rngs(9))  # other weights, initial batch statistics, train mode
    like = from_nnx(fresh, **KW)
    like_arrays = leaves(like.params) + leaves(like.apply.state)
    loaded = load_model(path, like=like)
    assert loaded is not like  # like is left as it was
    assert all(np.array_equal(a, b) for a, b in zip(like_arrays, leaves(like.params) + leaves(like.apply.state)))
    # the stored batch statistics came back with the weights
    np.testing.assert_array_equal(loaded.score_sequences(seqs), trained)
    nnx.update(fresh, nnx.state(loaded.to_nnx()))
    fresh.eval()
    np.testing.assert_allclose(module_scores(fresh, seqs), trained, atol=1e-5)
    again = RescoredIndex(SeekIndex(draft), loaded).top_k(k, prove=True)
    assert again.proven is True and again.items == answer.items


# ---- incremental decoding, other adapters' files ---------------------------------------------


def init_cache(batch, max_length):
    return {"sum": jnp.zeros((batch, D))}


def step(module, cache, tokens, positions):
    """NnxLM one token per row (the module as from_nnx hands it: eval mode, current weights)."""
    s = cache["sum"] + module.embed(tokens[:, 0])
    h = s / (positions[:, None] + 1.0)
    return module.head(module.drop(jnp.tanh(module.norm(h))))[:, None], {"sum": s}


def test_cache_step_receives_the_module():
    check_cached_rows(from_nnx(nnx_model(2), init_cache=init_cache, step=step, **KW), V, MAX_LEN)


class LinenLM(nn.Module):
    """A linen LM with a fixed 'consts' collection shifting its logits."""

    @nn.compact
    def __call__(self, tokens):
        shift = self.variable("consts", "shift", lambda: jnp.zeros(V))
        h = jnp.cumsum(nn.Embed(V + 1, D)(tokens), axis=1)
        return nn.Dense(V)(jnp.tanh(h)) + shift.value


def test_save_load_other_adapters(tmp_path):
    seqs = support()[::5]
    # from_linen: the params and the fixed collections come back
    module = LinenLM()
    init = jax.jit(module.init)
    variables = init(jax.random.PRNGKey(0), jnp.zeros((1, MAX_LEN), jnp.int32))
    variables = {**variables, "consts": {"shift": jnp.linspace(-1.0, 1.0, V)}}
    lm = from_linen(module, variables, **KW)
    save_model(lm, tmp_path / "linen.npz", vocabulary=list("abcdef"))
    other = init(jax.random.PRNGKey(1), jnp.zeros((1, MAX_LEN), jnp.int32))
    loaded = load_model(tmp_path / "linen.npz", like=from_linen(module, other, **KW))
    back = loaded.to_linen_variables()
    assert jax.tree.all(jax.tree.map(np.array_equal, back, variables))
    assert loaded.vocabulary == tuple("abcdef")
    np.testing.assert_array_equal(loaded.score_sequences(seqs), lm.score_sequences(seqs))
    # from_apply_fn with a bare array as params
    plain = from_apply_fn(lambda w, t: jnp.zeros(t.shape + (V,)) + w, jnp.arange(V, dtype=jnp.float32), **KW)
    save_model(plain, tmp_path / "plain.npz")
    like = from_apply_fn(plain.apply, jnp.zeros(V, jnp.float32), **KW)
    np.testing.assert_array_equal(load_model(tmp_path / "plain.npz", like=like).params, plain.params)
    # an int8 twin of an nnx model: its fixed state (batch statistics) too
    twin = quantize_int8(from_nnx(nnx_model(3), **KW))
    save_model(twin, tmp_path / "twin.npz")
    loaded = load_model(tmp_path / "twin.npz", like=quantize_int8(from_nnx(NnxLM(nnx.Rngs(5)), **KW)))
    np.testing.assert_array_equal(loaded.score_sequences(seqs), twin.score_sequences(seqs))


# ---- bad input --------------------------------------------------------------------------------


def test_bad_nnx_input():
    model = nnx_model()
    with pytest.raises(TypeError, match="flax.nnx Module instance.*NnxLM"):
        from_nnx(NnxLM, **KW)
    with pytest.raises(TypeError, match="flax.nnx Module.*from_linen"):
        from_nnx(LinenLM(), **KW)
    with pytest.raises(TypeError, match="flax.nnx Module, got dict"):
        from_nnx({"w": jnp.zeros(3)}, **KW)
    with pytest.raises(ValueError, match="method must be"):
        from_nnx(model, method="nope", **KW)
    with pytest.raises(TypeError, match="call_kwargs"):
        from_nnx(model, call_kwargs=["scale"], **KW)
    with pytest.raises(ValueError, match=r"model\(tokens, \*\*call_kwargs\) \(eval mode\).*failed.*unexpected"):
        from_nnx(model, call_kwargs={"unexpected": 1}, **KW)
    with pytest.raises(ValueError, match=r"logits of shape \(1, 2, 7\)"):
        from_nnx(model, **{**KW, "vocab_size": V + 1})
    with pytest.raises(ValueError, match="eos"):
        from_nnx(model, **{**KW, "eos": V})
    with pytest.raises(TypeError, match="step must be callable"):
        from_nnx(model, init_cache=init_cache, step="x", **KW)
    with pytest.raises(TypeError, match="built by from_nnx"):
        from_apply_fn(lambda p, t: jnp.zeros(t.shape + (V,)) + p, jnp.zeros(()), **KW).to_nnx()
    # from_linen on an nnx module points at from_nnx
    with pytest.raises(TypeError, match="from_nnx"):
        from_linen(model, {"params": {}}, **KW)


def test_the_old_route_names_the_leaf_and_from_nnx():
    """nnx.split of the whole module + from_apply_fn puts RNG state into params: train_lm says
    so before any step (it used to fail inside jax.grad: 'got uint32')."""
    model = nnx_model()
    graphdef, state = nnx.split(model)
    lm = from_apply_fn(lambda s, t: nnx.merge(graphdef, s)(t), state, **KW)
    with pytest.raises(TypeError, match=r"uint32 leaf at \['drop'\]\['rngs'\]\['count'\].*from_nnx"):
        train_lm(lm, sample(8, seed=0), steps=1, progress=False)
    assert lm.params is state  # nothing changed


def test_adapter_file_errors(tmp_path):
    lm = from_nnx(nnx_model(), **KW)
    path = tmp_path / "lm.npz"
    save_model(lm, path)
    with pytest.raises(ValueError, match="adapter model \\(nnx:NnxLM\\).*like="):
        load_model(path)
    with pytest.raises(TypeError, match="like must be"):
        load_model(path, like=TransformerLM(TransformerConfig(vocab_size=V, d_model=8, n_layers=1, n_heads=2)))
    with pytest.raises(ModelFileError, match="max_len=4; like has max_len=5"):
        load_model(path, like=from_nnx(nnx_model(), **{**KW, "max_len": 5}))
    with pytest.raises(ModelFileError, match="lm.npz.*'embed/embedding' has shape.*like \\(nnx:NnxLM\\) needs"):
        load_model(path, like=from_nnx(NnxLM(nnx.Rngs(0), dim=4), **KW))
    module = LinenLM()
    variables = jax.jit(module.init)(jax.random.PRNGKey(0), jnp.zeros((1, MAX_LEN), jnp.int32))
    with pytest.raises(ModelFileError, match="nnx model \\(nnx:NnxLM\\); like is a linen model"):
        load_model(path, like=from_linen(module, variables, **KW))
    # a TransformerLM file is built from its config: like is refused
    t = TransformerLM(TransformerConfig(vocab_size=V, d_model=8, n_layers=1, n_heads=2, max_len=MAX_LEN, eos=EOS))
    save_model(t, tmp_path / "t.npz")
    with pytest.raises(ValueError, match="like is only for files of adapter models.*TransformerLM"):
        load_model(tmp_path / "t.npz", like=lm)
    # flipped weights fail the checksum
    with np.load(path) as data:
        arrays = {k: data[k] for k in data.files}
    arrays["params/head/bias"] = arrays["params/head/bias"] + 1.0
    np.savez(tmp_path / "tampered.npz", **arrays)
    with pytest.raises(ModelFileError, match="tampered.npz.*checksum"):
        load_model(tmp_path / "tampered.npz", like=lm)
    meta = json.loads(str(arrays["__meta__"]))
    assert meta["kind"] == "ApplyFnLM" and meta["config"]["source"] == "nnx"
    assert {"state/norm/mean", "state/norm/var", "state/drop/rngs/key"} <= set(arrays)
