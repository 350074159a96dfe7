"""Draw the concepts page's figure (docs/figures/concepts.png) from a real query.

    python3 docs/make_figures.py [OUT.png]

A bigram draft and a perturbed bigram target over 5 tokens and length 4: the whole support (625
sequences) can be listed, so the figure shows every sequence next to what one query saw. The query is
``RescoredIndex(SeekIndex(draft), target, rerank_window=32, assumed_gap=gap).top_k(5)`` with the
true one-sided gap; its ``bound``, ``frontier_bound`` and items are drawn as the library returns them.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from jaxrescore import CallableModel, RescoredIndex, SeekIndex  # noqa: E402

V, L, K, WINDOW = 5, 4, 5, 32
OUT = Path(__file__).resolve().parent / "figures" / "concepts.png"


def bigram(logits: np.ndarray):
    """A per-prefix next-token function: the row of the last token (token 0 at the start)."""

    def next_logprobs(prefix):
        row = logits[prefix[-1] if prefix else 0]
        return np.arange(V), row - np.logaddexp.reduce(row)

    return next_logprobs


def main(out: Path = OUT) -> Path:
    rng = np.random.default_rng(4)
    draft_logits = 1.2 * rng.normal(size=(V, V))
    target_logits = draft_logits + 0.35 * rng.normal(size=(V, V))
    draft = CallableModel(bigram(draft_logits), vocab_size=V, max_len=L)
    target = CallableModel(bigram(target_logits), vocab_size=V, max_len=L)

    support = list(itertools.product(range(V), repeat=L))
    t_all = np.asarray(target.score_sequences(support))
    d_all = np.asarray(draft.score_sequences(support))
    gap = float(np.max(t_all - d_all))  # the true one-sided gap: listable support only

    index = SeekIndex(draft, progress=False)
    rescored = RescoredIndex(index, target, rerank_window=WINDOW, assumed_gap=gap)
    result = rescored.top_k(K)
    assert result.proven and result.certified, (result.proof_reason, result.reason)
    scored = {seq for seq, _ in index.slice(0, K + WINDOW)}
    answers = {seq for seq, _ in result.items}
    kind = np.array([2 if s in answers else 1 if s in scored else 0 for s in support])
    worst = result.items[-1][1]

    fig, ax = plt.subplots(figsize=(7.5, 5.2))
    styles = [
        (0, dict(s=6, color="0.7", label=f"not scored ({np.sum(kind == 0)} sequences)")),
        (1, dict(s=14, color="tab:blue", label=f"scored by the target (draft head, k + window = {K + WINDOW})")),
        (2, dict(s=30, color="tab:red", marker="D", label=f"the answer: target top-{K}")),
    ]
    for value, style in styles:
        ax.scatter(d_all[kind == value], t_all[kind == value], zorder=2 + value, **style)
    lo = float(min(d_all.min(), t_all.min()))
    xs = np.array([lo, 0.0])
    ax.plot(xs, xs + gap, color="tab:purple", lw=1, label=f"target = draft + gap (assumed_gap = {gap:.2f})")
    ax.fill_between(xs, xs + gap, lo, color="tab:purple", alpha=0.06, zorder=0)
    ax.axvline(result.bound, color="tab:green", ls="--", lw=1.2,
               label=f"bound = {result.bound:.2f}: draft scores of all unpulled sequences lie left")
    ax.axhline(result.bound + gap, color="tab:purple", ls=":", lw=1.2,
               label=f"bound + gap = {result.bound + gap:.2f}: the certificate's bar")
    ax.axhline(result.frontier_bound, color="black", ls="--", lw=1.2,
               label=f"frontier bound = {result.frontier_bound:.2f}: the proof's bar (no assumption)")
    ax.axhline(worst, color="tab:red", lw=0.8, alpha=0.6, label=f"worst answer = {worst:.2f}")
    ax.set_xlim(lo - 0.3, 0.2)
    ax.set_ylim(lo - 0.3, 0.2)
    ax.set_xlabel("draft log-prob (nats): the order the draft index enumerates in")
    ax.set_ylabel("target log-prob (nats)")
    ax.set_title(f"One query, the whole support: proven={result.proven}, certified={result.certified}",
                 fontsize=10)
    ax.legend(loc="lower right", fontsize=7.2, framealpha=0.95)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


if __name__ == "__main__":
    print(main(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT))
