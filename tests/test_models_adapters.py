"""from_linen / from_equinox: the adapted models score exactly what the source objects compute,
prove top-k answers over their whole (listed) support, train through the library, and hand the
trained weights back as a source object whose outputs equal the library model's."""

import itertools
import sys
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from flax import nnx
from flax.core import FrozenDict, freeze
from model_checks import check_cached_rows

from jaxrescore import RescoredIndex, SeekIndex, from_equinox, from_linen
from jaxrescore.models import NGramLM, from_apply_fn, train_lm

eqx = pytest.importorskip("equinox")

V, D, MAX_LEN, EOS = 8, 8, 4, 0
BOS = V  # an extra embedding row
KW = dict(vocab_size=V, bos_id=BOS, max_len=MAX_LEN, eos=EOS)


# ---- the source models: embeddings, a causal running mean, a dense head ------------------------


def running_mean(x):
    """float[..., T, D] -> the causal mean over positions 0..j at each j."""
    t = x.shape[-2]
    return jnp.cumsum(x, axis=-2) / jnp.arange(1, t + 1, dtype=jnp.float32)[:, None]


class LinenLM(nn.Module):
    """Batched causal LM: tokens int32[B, T] -> logits float[B, T, V]. A fixed 'consts'
    collection (not a weight) shifts the logits."""

    vocab: int = V
    dim: int = D

    def setup(self):
        self.embed = nn.Embed(self.vocab + 1, self.dim)
        self.hidden = nn.Dense(self.dim)
        self.head = nn.Dense(self.vocab)
        self.dropout = nn.Dropout(0.5)
        self.shift = self.variable("consts", "shift", lambda: jnp.linspace(-0.5, 0.5, self.vocab))

    def __call__(self, tokens, deterministic: bool = True):
        h = running_mean(self.embed(tokens))
        h = self.dropout(h, deterministic=deterministic)  # apply_kwargs choose deterministic
        return self.head(jnp.tanh(self.hidden(h)) + h) + self.shift.value

    def tempered(self, tokens):
        return 0.5 * self(tokens)


def linen_model(seed=0):
    module = LinenLM()
    # jitted: eager init would compile every op on its own
    variables = jax.jit(module.init)(jax.random.PRNGKey(seed), jnp.zeros((1, MAX_LEN), jnp.int32))
    assert set(variables) == {"params", "consts"}
    return module, variables


class EqxLM(eqx.Module):
    """Per-sequence causal LM: tokens int32[T] -> logits float[T, V]."""

    embed: eqx.nn.Embedding
    head: eqx.nn.Linear
    act: Callable = eqx.field(static=True)

    def __init__(self, key, dim=D):
        k1, k2 = jax.random.split(key)
        self.embed = eqx.nn.Embedding(V + 1, dim, key=k1)
        self.head = eqx.nn.Linear(dim, V, key=k2)
        self.act = jnp.tanh

    def __call__(self, tokens):
        h = running_mean(jax.vmap(self.embed)(tokens))
        return jax.vmap(self.head)(self.act(h))


def eqx_model(seed, dim=D):
    return eqx.filter_jit(EqxLM)(jax.random.PRNGKey(seed), dim)  # one compile, not one per op


class BatchedEqxLM(eqx.Module):
    """The same model taking a batch int32[B, T]."""

    inner: EqxLM

    def __call__(self, tokens):
        return jax.vmap(self.inner)(tokens)


# ---- the truth: direct computations with the source objects ------------------------------------


def support():
    """Every sequence of the support: up to MAX_LEN - 1 non-eos tokens, then eos (400 of them)."""
    out = []
    for n in range(MAX_LEN):
        out += [tuple(p) + (EOS,) for p in itertools.product(range(1, V), repeat=n)]
    return out


def log_softmax(logits):
    """float64 log-softmax over the last axis, on the host."""
    x = np.asarray(logits, np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def direct_scores(forward, seqs):
    """float64[N]: sum of log-softmax(forward([BOS] + seq)) at each real token."""
    toks = np.zeros((len(seqs), MAX_LEN), np.int32)
    for i, s in enumerate(seqs):
        toks[i, : len(s)] = s
    inputs = np.concatenate([np.full((len(seqs), 1), BOS, np.int32), toks[:, :-1]], axis=1)
    lp = log_softmax(forward(jnp.asarray(inputs)))
    steps = np.take_along_axis(lp, toks[..., None], axis=-1)[..., 0]
    mask = np.arange(MAX_LEN)[None, :] < np.array([len(s) for s in seqs])[:, None]
    return np.where(mask, steps, 0.0).sum(axis=1)


def direct_rows(forward, prefixes):
    """float[N, V]: the next-token log-probs after each prefix (one padded forward; causal)."""
    inputs = np.zeros((len(prefixes), MAX_LEN), np.int32)
    inputs[:, 0] = BOS
    for i, p in enumerate(prefixes):
        inputs[i, 1 : 1 + len(p)] = p
    logits = np.asarray(forward(jnp.asarray(inputs)))[np.arange(len(prefixes)), [len(p) for p in prefixes]]
    return log_softmax(logits)


def linen_forward(module, variables, **kw):
    return jax.jit(lambda toks: module.apply(variables, toks, **kw))  # one compile, not one per op


def eqx_forward(model):
    return jax.jit(lambda toks: jax.vmap(model)(toks))


PREFIXES = [(), (3,), (1, 2), (7, 7, 1)]


def check_matches(lm, forward, seqs):
    np.testing.assert_allclose(lm.score_sequences(seqs), direct_scores(forward, seqs), atol=1e-4)
    pre = np.zeros((len(PREFIXES), MAX_LEN - 1), np.int32)
    for i, p in enumerate(PREFIXES):
        pre[i, : len(p)] = p
    rows = lm.next_logprobs(pre, [len(p) for p in PREFIXES])
    np.testing.assert_allclose(rows, direct_rows(forward, PREFIXES), atol=1e-5)


# ---- scoring ----------------------------------------------------------------------------------


def test_linen_scores_equal_the_module():
    module, variables = linen_model()
    lm = from_linen(module, variables, **KW)
    check_matches(lm, linen_forward(module, variables), support())
    assert "linen:LinenLM" in repr(lm)
    # method= and apply_kwargs= reach module.apply
    tempered = from_linen(module, variables, method="tempered", **KW)
    check_matches(tempered, linen_forward(module, variables, method="tempered"), support()[::17])
    with pytest.raises(ValueError, match="dropout"):  # training mode needs a dropout rng
        from_linen(module, variables, apply_kwargs={"deterministic": False}, **KW)


@pytest.mark.parametrize("batched", [False, True])
def test_equinox_scores_equal_the_model(batched):
    model = eqx_model(1)
    lm = from_equinox(BatchedEqxLM(model) if batched else model, batched=batched, **KW)
    check_matches(lm, eqx_forward(model), support())


def test_proven_top_k_over_adapted_targets_is_the_brute_force_answer():
    seqs = support()
    module, variables = linen_model(2)
    targets = [from_linen(module, variables, **KW), from_equinox(eqx_model(3), **KW)]
    rng = np.random.default_rng(0)
    corpus = [seqs[i] for i in rng.integers(0, len(seqs), size=200)]
    draft = NGramLM.fit(corpus, order=2, vocab_size=V, eos=EOS, max_len=MAX_LEN)
    for target in targets:
        truth = np.sort(target.score_sequences(seqs))[::-1]
        result = RescoredIndex(SeekIndex(draft), target).top_k(5, prove=True)
        assert result.proven is True
        got = [lp for _, lp in result.items]
        np.testing.assert_allclose(got, truth[:5], atol=1e-6)
        assert len({s for s, _ in result.items}) == 5


# ---- training and handing the weights back -----------------------------------------------------


def corpus(n=64, seed=0):
    rng = np.random.default_rng(seed)
    return [tuple(int(t) for t in rng.integers(1, 3, size=rng.integers(0, MAX_LEN))) + (EOS,) for _ in range(n)]


def test_linen_training_hands_back_variables():
    module, variables = linen_model()
    lm = from_linen(module, variables, **KW)
    data = corpus()
    before = lm.score_sequences(data).mean()
    train_lm(lm, data, steps=15, batch_size=16, lr=3e-2, progress=False)
    assert lm.score_sequences(data).mean() > before
    back = lm.to_linen_variables()
    assert isinstance(back, dict) and list(back) == list(variables)
    assert jax.tree.structure(back) == jax.tree.structure(variables)
    moved = lambda a, b: bool(np.any(np.asarray(a) != np.asarray(b)))  # noqa: E731
    changed = jax.tree.map(moved, back["params"], variables["params"])
    assert all(jax.tree.leaves(changed))  # every weight moved
    assert back["consts"] is variables["consts"]  # the fixed collection is handed back as given
    check_matches(lm, linen_forward(module, back), support()[::7])
    # A FrozenDict comes back as a FrozenDict.
    frozen = from_linen(module, freeze(variables), **KW)
    assert isinstance(frozen.to_linen_variables(), FrozenDict)


def test_equinox_training_hands_back_the_model():
    model = eqx_model(4)
    lm = from_equinox(model, **KW)
    data = corpus(seed=1)
    before = lm.score_sequences(data).mean()
    train_lm(lm, data, steps=15, batch_size=16, lr=3e-2, progress=False)
    assert lm.score_sequences(data).mean() > before
    back = lm.to_equinox()
    assert isinstance(back, EqxLM) and back.act is jnp.tanh
    assert not np.allclose(back.embed.weight, model.embed.weight)
    assert not np.allclose(back.head.weight, model.head.weight)
    check_matches(lm, eqx_forward(back), support()[::7])
    # the original model is untouched and still scores as before
    np.testing.assert_allclose(from_equinox(model, **KW).score_sequences(data).mean(), before, atol=1e-5)


def test_one_forward_object_per_architecture_shares_compiles():
    a, b = eqx_model(0), eqx_model(1)
    la, lb = from_equinox(a, **KW), from_equinox(b, **KW)
    assert la.apply == lb.apply and hash(la.apply) == hash(lb.apply)  # weights are not in the key
    assert from_equinox(eqx_model(0, dim=4), **KW).apply != la.apply
    assert from_equinox(BatchedEqxLM(a), batched=True, **KW).apply != la.apply
    module, variables = linen_model()
    l1, l2 = from_linen(module, variables, **KW), from_linen(LinenLM(), linen_model(5)[1], **KW)
    assert l1.apply != l2.apply  # the fixed 'consts' arrays differ (held by identity)
    assert from_linen(module, variables, **KW).apply == l1.apply
    assert from_linen(module, variables, method="tempered", **KW).apply != l1.apply
    assert not any(isinstance(x, jax.Array) for x in jax.tree.leaves(la.apply.static))


# ---- incremental decoding through the adapters ------------------------------------------------


def eqx_init_cache(batch, max_length):
    return {"sum": jnp.zeros((batch, D))}


def eqx_step(model, cache, tokens, positions):
    """The EqxLM one token per row: the cache is the running sum of embeddings."""
    s = cache["sum"] + jax.vmap(model.embed)(tokens[:, 0])
    h = s / (positions[:, None] + 1.0)
    return jax.vmap(model.head)(model.act(h))[:, None], {"sum": s}


def test_cache_step_receives_the_source_object():
    check_cached_rows(from_equinox(eqx_model(2), init_cache=eqx_init_cache, step=eqx_step, **KW), V, MAX_LEN)


# ---- bad input --------------------------------------------------------------------------------


def test_bad_linen_input():
    module, variables = linen_model()
    with pytest.raises(TypeError, match="module must be a flax.linen Module instance.*LinenLM"):
        from_linen(LinenLM, variables, **KW)
    with pytest.raises(TypeError, match="module must be a flax.linen Module"):
        from_linen(lambda p, t: t, variables, **KW)
    with pytest.raises(TypeError, match="flax.nnx module: use from_nnx"):
        from_linen(nnx.Linear(2, 2, rngs=nnx.Rngs(0)), variables, **KW)
    with pytest.raises(TypeError, match="variables must be"):
        from_linen(module, [1, 2], **KW)
    with pytest.raises(ValueError, match="variables has no 'params'"):
        from_linen(module, variables["params"], **KW)
    with pytest.raises(ValueError, match=r"logits of shape \(1, 2, 9\)"):
        from_linen(module, variables, **{**KW, "vocab_size": V + 1})
    with pytest.raises(ValueError, match="vocab_size"):
        from_linen(module, variables, **{**KW, "vocab_size": 2.5})
    with pytest.raises(ValueError, match="method"):
        from_linen(module, variables, method="nope", **KW)
    with pytest.raises(TypeError, match="apply_kwargs"):
        from_linen(module, variables, apply_kwargs=[("deterministic", True)], **KW)
    with pytest.raises(ValueError, match="module.apply.*failed.*unexpected"):
        from_linen(module, variables, apply_kwargs={"unexpected": 1}, **KW)
    with pytest.raises(ValueError, match="eos"):
        from_linen(module, variables, **{**KW, "eos": V})
    with pytest.raises(TypeError, match="step must be callable"):
        from_linen(module, variables, init_cache=eqx_init_cache, step="x", **KW)
    with pytest.raises(TypeError, match="built by from_equinox"):
        from_linen(module, variables, **KW).to_equinox()


def test_bad_equinox_input(monkeypatch):
    model = eqx_model(0)
    with pytest.raises(TypeError, match="equinox Module instance"):
        from_equinox(EqxLM, **KW)
    with pytest.raises(TypeError, match="equinox Module"):
        from_equinox({"w": jnp.zeros(3)}, **KW)
    with pytest.raises(ValueError, match="batched must be"):
        from_equinox(model, batched="yes", **KW)
    with pytest.raises(TypeError, match="call_kwargs"):
        from_equinox(model, call_kwargs=["x"], **KW)
    with pytest.raises(ValueError, match="pass batched=False"):
        from_equinox(model, batched=True, **KW)  # a per-sequence model called on a batch
    with pytest.raises(ValueError, match="pass batched=True"):
        from_equinox(BatchedEqxLM(model), **KW)  # a batched model called per sequence
    with pytest.raises(ValueError, match=r"logits of shape \(2, 9\)"):
        from_equinox(model, **{**KW, "vocab_size": V + 1})
    with pytest.raises(TypeError, match="built by from_linen"):
        from_equinox(model, **KW).to_linen_variables()
    plain = from_apply_fn(lambda p, t: jnp.zeros(t.shape + (V,)) + p, jnp.zeros(()), **KW)
    with pytest.raises(TypeError, match="built by from_equinox"):
        plain.to_equinox()
    monkeypatch.setitem(sys.modules, "equinox", None)  # as if equinox were not installed
    with pytest.raises(ImportError, match="pip install equinox"):
        from_equinox(model, **KW)
