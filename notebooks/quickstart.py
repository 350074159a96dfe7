# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% tags=["skip-execution"]
# %pip install jaxrescore

# %% [markdown]
# # jaxrescore quickstart: the likeliest US first names, certified
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/jaxrescore/jaxrescore/blob/main/notebooks/quickstart.ipynb)
#
# **Speculative enumeration**: a cheap *draft* model (here a character 6-gram fitted in a second)
# builds the enumeration index; the expensive *target* (a small character transformer shipped with
# the package) scores only the candidates a query returns, in one batched teacher-forcing forward.
# A certificate says when the answer is provably the target's true top-k, under an assumed bound on
# the draft/target gap.

# %%
import time

import matplotlib.pyplot as plt
import numpy as np

from jaxrescore import RescoredIndex, SeekIndex
from jaxrescore.data import decode, encode, load_names, name_ranks
from jaxrescore.demo import assumed_gap_from, estimate_region_gap, fit_draft, load_target

# %% [markdown]
# ## 1. Data and models
# US Social Security Administration first names (public domain), with birth counts 1880-2017.
# Characters a-z are tokens 0-25, end-of-name is token 26.

# %%
names = load_names()
ranks = name_ranks()
print(len(names), "names; the commonest:", names[:5])
print("encode('mary') =", encode("mary"))

t0 = time.perf_counter()
draft = fit_draft()  # interpolated Kneser-Ney character 6-gram, weighted by birth count
target = load_target()  # the shipped TransformerLM
print(f"draft {draft!r}\ntarget {target!r} ({target.n_params} parameters); {time.perf_counter() - t0:.1f} s")

# %% [markdown]
# ## 2. The assumed gap
# Certification needs an assumed bound on |target - draft|. Only sequences the target rates at
# least as high as the answers matter, so we *measure* the gap there (the commonest names plus
# samples from the target) and add a margin. It is an estimate, not a proof: say so when you use it.

# %%
K = 25
common = [encode(n) for n, _ in names[:4096]]
estimate = estimate_region_gap(draft, target, common, K)
gap, gap_source = assumed_gap_from(estimate)
print(f"assumed gap {gap:.3f} nats: {gap_source}")

# %% [markdown]
# ## 3. The demo, step by step
# Build the draft's SeekIndex (exact quantized order, sound bucket bounds), wrap it with the target,
# and ask for the top 25.

# %%
index = SeekIndex(draft, progress=False)
rescored = RescoredIndex(index, target, rerank_window=1024, assumed_gap=gap)
result = rescored.top_k(K)
print(f"{'rank':>4}  {'name':<14}{'target lp':>10}{'draft lp':>10}{'birth rank':>11}")
for i, ((seq, lp), dlp) in enumerate(zip(result.items, result.draft_log_probs), 1):
    name = decode(seq)
    print(f"{i:>4}  {name:<14}{lp:>10.3f}{dlp:>10.3f}{ranks.get(name, '-'):>11}")
print("certified:", result.certified, "-", result.reason)
print(f"target: {rescored.target_calls} call, {rescored.target_sequences} sequences scored;"
      f" draft index: {index.forwards} n-gram prefix forwards")

# %% [markdown]
# ## 4. Draft vs target
# Each point is one of the 2,000 commonest names. Near the head the two models agree closely: that
# is what lets a 6-gram order the search for a transformer.

# %%
head = [encode(n) for n, _ in names[:2000]]
t_lp = target.score_sequences(head)
d_lp = draft.score_sequences(head)
fig, ax = plt.subplots(figsize=(5, 5))
ax.scatter(d_lp, t_lp, s=4, alpha=0.5)
lims = [min(d_lp.min(), t_lp.min()), 0]
ax.plot(lims, lims, "k--", lw=1, label="target = draft")
ax.set_xlabel("draft log-prob (6-gram)")
ax.set_ylabel("target log-prob (transformer)")
ax.set_title("2,000 commonest names")
ax.legend()
plt.show()

# %% [markdown]
# ## 5. Recall and certification against the window
# The reference answer is the certified top-25 above. Small windows already find most of it; the
# certificate only appears once the window pushes the draft's bound far enough below the answers.

# %%
reference = {seq for seq, _ in result.items}
windows = [0, 4, 16, 64, 256, 1024]
results = [RescoredIndex(index, target, rerank_window=w, assumed_gap=gap).top_k(K) for w in windows]
recall = [len(reference & {seq for seq, _ in r.items}) / K for r in results]
certified = np.array([bool(r.certified) for r in results])
fig, ax = plt.subplots(figsize=(6, 3.5))
pos = np.arange(len(windows))
ax.plot(pos, recall, "o-", label="recall of the certified top-25")
ax.scatter(pos[certified], [1.04] * sum(certified), marker="*", s=120, color="green", label="certified")
ax.set_xticks(pos, [str(w) for w in windows])
ax.set_xlabel("rerank window")
ax.set_ylim(0, 1.12)
ax.legend(loc="lower right")
plt.show()
print({w: bool(c) for w, c in zip(windows, certified)})

# %% [markdown]
# ## 6. A vmapped sweep
# `sweep` answers many queries (different windows, gaps, slices) with ONE pull from the draft
# index, ONE target call and ONE vmapped rescoring call.

# %%
gaps = [0.5 * gap, gap, 2 * gap]
grid = [(w, g) for g in gaps for w in windows]
swept = rescored.sweep([0] * len(grid), [K] * len(grid),
                       rerank_windows=[w for w, _ in grid], assumed_gaps=[g for _, g in grid])
table = np.array([bool(r.certified) for r in swept]).reshape(len(gaps), len(windows))
fig, ax = plt.subplots(figsize=(6, 2.5))
ax.imshow(table, cmap="Greens", vmin=0, vmax=1, aspect="auto")
ax.set_xticks(range(len(windows)), [str(w) for w in windows])
ax.set_yticks(range(len(gaps)), [f"{g:.2f}" for g in gaps])
ax.set_xlabel("rerank window")
ax.set_ylabel("assumed gap (nats)")
ax.set_title("certified (green) for each (window, gap)")
plt.show()
loop = RescoredIndex(index, target, rerank_window=256, assumed_gap=gap).top_k(K)
same = swept[grid.index((256, gap))]
assert [s for s, _ in same.items] == [s for s, _ in loop.items] and same.certified == loop.certified
print("the sweep's (256, gap) query equals a fresh top_k:", same.certified)
