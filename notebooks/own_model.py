# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% tags=["skip-execution"]
# Install jaxrescore (not on PyPI). Set JAXRESCORE_SOURCE to ONE of:
#  - the wheel: in a checkout run `python -m pip install build && python -m build --wheel`, then
#    upload dist/jaxrescore-0.1.0-py3-none-any.whl to this session's files (in Colab: the folder
#    icon, then upload) and keep the name below;
#  - a git URL of a copy you can reach, e.g. "git+https://github.com/<owner>/jaxrescore.git"
#    (append "@<tag or commit>" to pin a version).
# The cell is skipped when the notebooks are tested; in a checkout, `pip install -e .` instead.
JAXRESCORE_SOURCE = "jaxrescore-0.1.0-py3-none-any.whl"
# %pip install {JAXRESCORE_SOURCE}

# %% [markdown]
# # Your own model: a flax LM, an n-gram draft, the proven top continuations of a prompt
#
# The [quickstart](quickstart.ipynb) used the demo's shipped models. Here everything is yours:
#
# 1. a small **flax linen** language model, wrapped by `from_apply_fn` (any JAX function
#    `apply_fn(params, tokens) -> logits` works the same way: a hand-written LM, a Hugging Face
#    Flax model's `__call__`),
# 2. trained for a few hundred steps with `train_lm` (optax adamw),
# 3. a character **n-gram draft** fitted on the same corpus with `NGramLM.fit`,
# 4. the **proven** top-10 continuations of a prompt: `model.with_prompt(...)` on both models,
#    `RescoredIndex(...).top_k(10, prove=True)`.
#
# The corpus is the US first names shipped with the package (characters `a`-`z` are tokens 0-25,
# end-of-name is token 26); swap in your own token sequences.

# %%
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

from jaxrescore import NGramLM, RescoredIndex, SeekIndex, from_apply_fn, train_lm
from jaxrescore.data import EOS, VOCAB_SIZE, decode, encode, load_names
from jaxrescore.baselines.best_first import best_first_top_k

# %% [markdown]
# ## 1. The corpus
# The 20,000 commonest names, each weighted by its birth count (so the models learn how often
# people are given each name, not just which names exist). Every sequence ends with `EOS`.

# %%
names = load_names()[:20_000]
corpus = [encode(name) for name, _ in names]
counts = np.array([count for _, count in names], np.float64)
MAX_LEN = max(len(seq) for seq in corpus)  # the longest name plus its EOS
print(f"{len(corpus)} names, vocabulary {VOCAB_SIZE} (EOS = {EOS}), max_len {MAX_LEN}")
print("encode('maria') =", encode("maria"))

# %% [markdown]
# ## 2. A flax linen LM through `from_apply_fn`
# `from_apply_fn` needs a pure causal function `apply_fn(params, tokens int32[B, T]) ->
# logits[B, T, V]` where `tokens[:, 0]` is a BOS id and position `j` predicts the sequence's token
# `j`. Here BOS is an extra embedding row (id `VOCAB_SIZE`). One transformer block, 32 wide.

# %%
class TinyLM(nn.Module):
    vocab_size: int
    max_len: int
    width: int = 32
    heads: int = 4

    @nn.compact
    def __call__(self, tokens):
        steps = tokens.shape[1]
        x = nn.Embed(self.vocab_size + 1, self.width)(tokens)  # + 1: the BOS row
        x = x + nn.Embed(self.max_len, self.width)(jnp.arange(steps))[None]
        causal = nn.make_causal_mask(tokens)
        h = nn.LayerNorm()(x)
        x = x + nn.MultiHeadDotProductAttention(num_heads=self.heads)(h, h, mask=causal)
        h = nn.LayerNorm()(x)
        x = x + nn.Dense(self.width)(nn.gelu(nn.Dense(4 * self.width)(h)))
        return nn.Dense(self.vocab_size)(nn.LayerNorm()(x))


module = TinyLM(vocab_size=VOCAB_SIZE, max_len=MAX_LEN)
params = jax.jit(module.init)(jax.random.PRNGKey(0), jnp.zeros((1, MAX_LEN), jnp.int32))  # one compile


def apply_fn(params, tokens):  # ONE function object per model: jaxrescore reuses its compiles
    return module.apply(params, tokens)


target = from_apply_fn(apply_fn, params, vocab_size=VOCAB_SIZE, bos_id=VOCAB_SIZE, max_len=MAX_LEN, eos=EOS)
n_params = sum(leaf.size for leaf in jax.tree_util.tree_leaves(params))
print(target, f"{n_params} parameters")

# %% [markdown]
# ## 3. Train it with `train_lm`
# Maximum likelihood with optax adamw; `train_lm` updates `target.params` in place and returns
# each step's mean per-token loss (nats). 300 steps take seconds on a CPU: enough for a model with
# a real opinion about names, far from the quality of the demo's shipped target (7,000 steps).

# %%
t0 = time.perf_counter()
losses = train_lm(target, corpus, weights=counts, steps=300, batch_size=128, lr=1e-2, progress=False)
print(f"300 steps in {time.perf_counter() - t0:.1f} s; loss {losses[:20].mean():.3f} -> {losses[-20:].mean():.3f} nats/token")
fig, ax = plt.subplots(figsize=(5.5, 3))
ax.plot(losses, lw=1, label="batch loss")
ax.plot(np.convolve(losses, np.ones(20) / 20, mode="valid"), lw=2, label="20-step mean")
ax.set_xlabel("training step")
ax.set_ylabel("loss (nats per token)")
ax.legend()
plt.show()

# %% [markdown]
# ## 4. A draft: a character n-gram
# The draft only has to be cheap and roughly right: it builds the index that proposes candidates.
# `NGramLM.fit` counts a corpus in a second (interpolated Kneser-Ney). A distilled student
# (`jaxrescore.distill(student, teacher, sequences, steps=...)`) or an int8 twin
# (`quantize_int8`) are the other usual drafts.

# %%
draft = NGramLM.fit(corpus, order=4, vocab_size=VOCAB_SIZE, eos=EOS, max_len=MAX_LEN, weights=counts)
print(draft)

# %% [markdown]
# ## 5. The proven top-10 continuations of a prompt
# `with_prompt(tokens)` turns a model into the model of continuations of `tokens`: its support is
# every continuation, scored as `log p(continuation | prompt)`. Index the prompted draft, rescore
# with the prompted target, and ask for the top 10 with `prove=True`.

# %%
prompt = encode("ma")[:-1]  # the characters of "ma", without EOS
draft_ma = draft.with_prompt(prompt)
target_ma = target.with_prompt(prompt)

index = SeekIndex(draft_ma, progress=False)
rescored = RescoredIndex(index, target_ma, rerank_window=16)
result = rescored.top_k(10, prove=True)
print(f"{'rank':>4}  {'name':<10}{'p(name | ma)':>13}{'target lp':>11}{'draft lp':>10}")
for i, ((seq, lp), dlp) in enumerate(zip(result.items, result.draft_log_probs), 1):
    print(f"{i:>4}  {'ma' + decode(seq):<10}{np.exp(lp):>13.4f}{lp:>11.3f}{dlp:>10.3f}")
print("proven:", result.proven, "-", result.proof_reason)
print(f"cost: {result.rounds} rounds, {rescored.target_calls} batched target calls, "
      f"{rescored.target_sequences} sequences scored by the target")

# %% [markdown]
# `proven: True` means these are the target's exact 10 likeliest continuations of "ma" among
# every continuation the model allows (`target_ma.max_len` more tokens at most, EOS included), up
# to the model's float noise (`target.score_tolerance`). An exact best-first search over the
# target alone finds the same list, with one sequential target call per batch of prefixes:

# %%
exact = best_first_top_k(target_ma, 10)
same = [s for s, _ in exact.items] == [s for s, _ in result.items]
print(f"best-first: {exact.forwards} prefix forwards in {exact.calls} sequential calls; same answer: {same}")

# %% [markdown]
# ## 6. What the draft got right
# Each answer's target log-prob against its draft log-prob. The draft does not have to agree with
# the target: it only proposes, and the proof checks the target's own bound.

# %%
t_lp = np.array([lp for _, lp in result.items])
d_lp = np.array(result.draft_log_probs)
labels = ["ma" + decode(seq) for seq, _ in result.items]
fig, ax = plt.subplots(figsize=(5.5, 4.5))
ax.scatter(d_lp, t_lp, color="tab:red", label="proven top-10 (target order)")
for x, y, label in zip(d_lp, t_lp, labels):
    ax.annotate(label, (x, y), textcoords="offset points", xytext=(4, 2), fontsize=8)
lims = [min(d_lp.min(), t_lp.min()) - 0.3, max(d_lp.max(), t_lp.max()) + 0.3]
ax.plot(lims, lims, "k:", lw=1, label="target = draft")
ax.axhline(result.frontier_bound, color="gray", ls="--", lw=1, label="frontier bound (unscored below)")
ax.set_xlabel("draft log p(name | ma), 4-gram (nats)")
ax.set_ylabel("target log p(name | ma), flax LM (nats)")
ax.legend(loc="lower right", fontsize=8)
plt.show()
