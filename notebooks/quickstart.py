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
# # jaxrescore quickstart: the likeliest US first names, proven
#
# **Speculative enumeration**: a cheap *draft* model (here a character 6-gram fitted in a second)
# builds the enumeration index; the expensive *target* (a small character transformer shipped with
# the package) scores only the candidates a query returns, in one batched teacher-forcing forward.
#
# That forward computes the target's full next-token distribution at every position of every
# scored sequence, and those distributions bound every sequence that was NOT scored. So the answer
# can be **proven** the target's exact top-k with no assumption at all: `top_k(k, prove=True)`.
# The spec's older certificate (`certified`) needs an assumed draft/target gap; we show it too.

# %%
import time

import matplotlib.pyplot as plt
import numpy as np

from jaxrescore import RescoredIndex, SeekIndex
from jaxrescore.data import decode, encode, load_names, name_ranks
from jaxrescore.data.names_models import names_draft, names_target
from jaxrescore.baselines.best_first import best_first_top_k
from jaxrescore.rescore import estimate_top_gap

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
draft = names_draft()  # interpolated Kneser-Ney character 6-gram, weighted by birth count
target = names_target()  # the shipped TransformerLM
print(f"draft {draft!r}\ntarget {target!r} ({target.n_params} parameters); {time.perf_counter() - t0:.1f} s")

# %% [markdown]
# ## 2. The proven top-25
# Build the draft's SeekIndex, wrap it with the target and ask for the top 25 with `prove=True`.
# The search scores the draft's head, finds the *exits* of the scored prefix tree whose bound
# (`target(prefix) + log p(token | prefix)`) could still beat the answer, lets the draft complete
# them, and scores only the new sequences, one batched call per round, until the bound is cleared.

# %%
K = 25
index = SeekIndex(draft, progress=False)
rescored = RescoredIndex(index, target, rerank_window=32)
result = rescored.top_k(K, prove=True)
print(f"{'rank':>4}  {'name':<14}{'target lp':>10}{'draft lp':>10}{'birth rank':>11}")
for i, ((seq, lp), dlp) in enumerate(zip(result.items, result.draft_log_probs), 1):
    name = decode(seq)
    print(f"{i:>4}  {name:<14}{lp:>10.3f}{dlp:>10.3f}{ranks.get(name, '-'):>11}")
print("proven:", result.proven, "-", result.proof_reason)
print(f"target: {result.rounds} rounds, {rescored.target_calls} batched calls, "
      f"{rescored.target_sequences} sequences scored; draft index: {index.forwards} n-gram prefix forwards")

# %% [markdown]
# What would the exact answer cost without a draft? A batched best-first search over the target
# expands prefixes best first, one target call per batch of prefixes.

# %%
exact = best_first_top_k(target, K)
print(f"best-first: {exact.forwards} prefix forwards in {exact.calls} sequential target calls;",
      "same answer:", [s for s, _ in exact.items] == [s for s, _ in result.items])

# %% [markdown]
# ## 3. Draft vs target
# Each point is one of the 2,000 commonest names. The proven answers are red; every sequence the
# search did not score lies below the frontier bound (dashed). Near the head the two models agree
# closely: that is what lets a 6-gram speculate paths for a transformer.

# %%
head = [encode(n) for n, _ in names[:2000]]
t_lp = target.score_sequences(head)
d_lp = draft.score_sequences(head)
answers = {seq for seq, _ in result.items}
is_answer = np.array([seq in answers for seq in head])
fig, ax = plt.subplots(figsize=(5.5, 5))
ax.scatter(d_lp[~is_answer], t_lp[~is_answer], s=4, alpha=0.4, label="2,000 commonest names")
ax.scatter(d_lp[is_answer], t_lp[is_answer], s=14, color="red", label="proven top-25")
lims = np.array([min(d_lp.min(), t_lp.min()), 0.0])
ax.plot(lims, lims, "k:", lw=1, label="target = draft")
ax.axhline(result.frontier_bound, color="gray", ls="--", lw=1, label="frontier bound")
ax.set_xlabel("draft log-prob (6-gram, nats)")
ax.set_ylabel("target log-prob (transformer, nats)")
ax.legend(loc="lower right", fontsize=8)
plt.show()

# %% [markdown]
# ## 4. Recall and cost against the first window
# `rerank_window` is how many draft candidates beyond k the first round scores. A plain query
# (one call, no search) finds most of the answer and proves it once the window is wide enough;
# `prove=True` always proves it, and the window only moves its cost.

# %%
windows = [0, 4, 16, 64, 256]
reference = {seq for seq, _ in result.items}
plain, cost, rounds = [], [], []
for w in windows:
    r = RescoredIndex(index, target, rerank_window=w).top_k(K)
    plain.append((len(reference & {s for s, _ in r.items}) / K, bool(r.proven)))
    searching = RescoredIndex(index, target, rerank_window=w)
    assert searching.top_k(K, prove=True).proven
    cost.append(searching.target_sequences)
    rounds.append(searching.target_calls)
fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.2))
pos = np.arange(len(windows))
left.plot(pos, [r for r, _ in plain], "o-", label="plain query: recall of the proven top-25")
proven_at = [i for i, (_, p) in enumerate(plain) if p]
left.scatter(proven_at, [1.04] * len(proven_at), marker="*", s=120, color="green", label="plain query proven")
left.set_xticks(pos, [str(w) for w in windows])
left.set_xlabel("rerank window")
left.set_ylabel("recall")
left.set_ylim(0, 1.12)
left.legend(loc="lower right", fontsize=8)
right.bar(pos, cost, color="tab:orange", label="target sequences (prove=True)")
for i, c in enumerate(rounds):
    right.annotate(f"{c} call(s)", (pos[i], cost[i]), ha="center", va="bottom", fontsize=8)
right.set_xticks(pos, [str(w) for w in windows])
right.set_xlabel("rerank window")
right.set_ylabel("sequences scored")
right.legend(loc="upper left", fontsize=8)
plt.show()

# %% [markdown]
# ## 5. The gap-certified query (the spec's certificate)
# `certified` needs an assumed bound on `target - draft`. Only sequences the target rates at least
# as high as the answers matter, so `estimate_top_gap` *measures* it there (the commonest names
# plus samples from the target); we add a margin. It is an estimate, not a proof, and the library
# refuses to certify when its own observations contradict it.

# %%
common = [encode(n) for n, _ in names[:4096]]
estimate = estimate_top_gap(draft, target, K, common)
gap = estimate.excess + 1.0
print(f"observed max target - draft {estimate.excess:.3f} nats over {estimate.n_region} sequences "
      f"(of {estimate.n_distinct} scored); assumed gap {gap:.3f} nats")
certifier = RescoredIndex(index, target, rerank_window=64, assumed_gap=gap)
cert = certifier.top_k(K, until_certified=True)
print("certified:", cert.certified, "-", cert.reason)
print(f"cost: {cert.rounds} rounds, {certifier.target_sequences} sequences; same answer as the proof:",
      [s for s, _ in cert.items] == [s for s, _ in result.items])

# %% [markdown]
# The certificate's geometry on the same 2,000 names: the draft index bounds the draft score of
# everything it did not pull (`cert.bound`, green); the assumption puts every name below the
# `target = draft + gap` line (the shaded band is what it rules out); so nothing unpulled can score
# above `bound + gap` (purple), and the answers clear it.

# %%
fig, ax = plt.subplots(figsize=(5.5, 5))
ax.scatter(d_lp[~is_answer], t_lp[~is_answer], s=4, alpha=0.4, label="2,000 commonest names")
ax.scatter(d_lp[is_answer], t_lp[is_answer], s=14, color="red", label="certified top-25")
xs = np.array([min(d_lp.min(), t_lp.min()), 0.0])
ax.plot(xs, xs + gap, color="tab:purple", lw=1, label=f"target = draft + gap ({gap:.2f} nats)")
ax.fill_between(xs, xs + gap, 0.0, color="tab:purple", alpha=0.08, label="ruled out by the assumed gap")
ax.axvline(cert.bound, color="tab:green", ls="--", lw=1, label="bound: unpulled draft scores lie left")
ax.axhline(cert.bound + gap, color="tab:purple", ls=":", lw=1.2, label="bound + gap: the certificate's bar")
ax.set_xlim(xs[0], 0.0)
ax.set_ylim(xs[0], 0.0)
ax.set_xlabel("draft log-prob (6-gram, nats)")
ax.set_ylabel("target log-prob (transformer, nats)")
ax.legend(loc="lower right", fontsize=7)
plt.show()

# %% [markdown]
# ## 6. A vmapped sweep
# `sweep` answers many queries (different windows, gaps, slices) with ONE pull from the draft
# index, ONE target call and ONE vmapped rescoring call; each result carries both verdicts. Here:
# 6 windows, up to 4,096 draft candidates, times the proof and 4 assumed gaps (half, once, twice
# and three times the estimate above). Each cell's number is its margin in nats: the worst
# returned target score minus the bar it must clear (`frontier_bound` for the proof, `bound + gap`
# for the certificate); a verdict holds where the margin is >= 0 (and, for the certificate, where
# nothing scored refutes the gap).

# %%
from matplotlib.colors import ListedColormap
from matplotlib.patches import Patch

sweep_windows = [0, 16, 64, 256, 1024, 4096]
gaps = [0.5 * gap, gap, 2 * gap, 3 * gap]
grid = [(w, g) for g in gaps for w in sweep_windows]
swept = certifier.sweep([0] * len(grid), [K] * len(grid),
                        rerank_windows=[w for w, _ in grid], assumed_gaps=[g for _, g in grid])
# Cell states: 0 holds (proven / certified), 1 bar not cleared, 2 gap refuted by a scored sequence.
state = np.zeros((1 + len(gaps), len(sweep_windows)), int)
margin = np.zeros(state.shape)
for j, w in enumerate(sweep_windows):
    r = swept[grid.index((w, gap))]
    state[0, j] = 0 if r.proven else 1
    margin[0, j] = r.items[-1][1] - r.frontier_bound
for (w, g), r in zip(grid, swept):
    i, j = 1 + gaps.index(g), sweep_windows.index(w)
    state[i, j] = 0 if r.certified else 2 if r.excess > g else 1
    margin[i, j] = r.items[-1][1] - (r.bound + g)
colours = ["#4caf50", "#e0e0e0", "#ef8a62"]
fig, ax = plt.subplots(figsize=(8, 3.4))
ax.imshow(state, cmap=ListedColormap(colours), vmin=-0.5, vmax=2.5, aspect="auto")
for (i, j), m in np.ndenumerate(margin):
    ax.annotate(f"{m:+.2f}", (j, i), ha="center", va="center", fontsize=8)
ax.axhline(0.5, color="white", lw=3)
ax.set_xticks(range(len(sweep_windows)), [str(w) for w in sweep_windows])
ax.set_yticks(range(1 + len(gaps)), ["proof (no gap)"] + [f"certificate, gap {g:.2f}" for g in gaps])
ax.set_xlabel("rerank window (draft candidates beyond k, one target call)")
ax.set_title(f"one sweep: {len(grid)} queries; the observed max target - draft is {swept[0].excess:.2f} nats",
             fontsize=9)
ax.legend(handles=[Patch(color=colours[0], label="proven / certified"),
                   Patch(color=colours[1], label="bar not cleared: widen the window"),
                   Patch(color=colours[2], label="assumed gap refuted by a scored sequence")],
          loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, title="margin (nats) in each cell",
          title_fontsize=8)
plt.show()
print(f"proof: proven from window {sweep_windows[int(np.argmin(state[0]))]} on, with no assumption;",
      f"certificate: {int((state[1:] == 0).sum())} of {state[1:].size} queries certified,",
      f"{int((state[1:] == 2).sum())} refuted")

# %% [markdown]
# The proof needs no assumption and holds once the window reaches a few hundred candidates. The
# certificate needs the assumed gap to be true: the widest pull scored a sequence whose target
# score exceeds its draft score by more than the estimate plus its margin (the estimate came from
# common names and target samples; the far tail of the pull holds rarer ones), so every query
# assuming a gap below that is refused, not certified wrongly. A larger assumed gap is safer but
# needs a lower bound, so a wider pull, before it certifies.

# %%
# One query of the sweep against the same query alone: the same answer and the same proof (the
# certificate may differ: the sweep's evidence about the gap includes its widest pull; the scores
# may differ by float noise, far below the target's score tolerance: the two calls batch the
# rows differently).
loop = RescoredIndex(index, target, rerank_window=256, assumed_gap=gap).top_k(K)
same = swept[grid.index((256, gap))]
equal = ([s for s, _ in same.items] == [s for s, _ in loop.items]
         and np.allclose([lp for _, lp in same.items], [lp for _, lp in loop.items], rtol=0, atol=1e-5)
         and same.proven == loop.proven)
print("the sweep's (window 256, gap) answer and proof equal a fresh top_k:", equal)
