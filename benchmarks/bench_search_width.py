"""The proving search's width policy: sequential target calls against token positions.

The wide workload's shipped models (benchmarks/wide.py: a 309-word vocabulary, the word-level
target, the distilled student and the 3-gram draft), every benchmark prompt, k = 10, 25 and 100.
Each proof is ``RescoredIndex(SeekIndex(draft.with_prompt(p)), target.with_prompt(p),
search_width=w).top_k(k, prove=True)`` — the API as a user calls it, one draft index per prompt
and draft, grown by the queries themselves — for widths ``w`` of 2, 8 and 32 and ``None`` (every
open exit every round, the search before this policy). The baseline is the exact best-first
search through a KV-cached decoding session, batch k: every prefix whose target score clears the
answer is expanded by either method, so its positions are the floor.

Positions are what the target computed: a proof's full forwards count every row's prompt and
prefix (``result.positions``); cached best-first counts one position per expanded prefix.

    python3 benchmarks/bench_search_width.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402
import wide  # noqa: E402
from common import machine, section, table  # noqa: E402

from jaxrescore import RescoredIndex, SeekIndex  # noqa: E402
from jaxrescore.baselines.best_first import best_first_top_k  # noqa: E402
from jaxrescore.models.decoding import decoding_session  # noqa: E402

COMMAND = "python3 benchmarks/run.py --only search_width"
WIDTHS = (2, 8, 32, None)
WINDOW = 32
TIE = 1e-3  # the float32 target's score tolerance: answers equal up to it at every rank


def _label(width) -> str:
    return "all open exits" if width is None else f"{width}k, doubling"


def measure(prompts, ks, widths, names=("student", "3-gram"), log=print) -> list[dict]:
    """One record per (prompt, k, draft, width), plus the best-first baseline's per (prompt, k)."""
    target, student, _ = wide.load_or_train(wide.FULL, os.path.join(HERE, "figures"))
    drafts = {"student": student, "3-gram": wide.fit_draft(wide.FULL)}
    drafts = {n: drafts[n] for n in names}
    lang = wide.language()
    records = []
    for text in prompts:
        p = lang.encode(text)
        t_p = target.with_prompt(p)
        indexes = {name: SeekIndex(d.with_prompt(p), progress=False) for name, d in drafts.items()}
        for k in ks:
            session = decoding_session(t_p)
            exact = best_first_top_k(session, k, batch=k)
            base = dict(prompt=text, k=k, calls=exact.calls, positions=session.positions)
            records.append(dict(base, method="best-first, KV cache"))
            answer = np.array([lp for _, lp in exact.items])
            for name, index in indexes.items():
                for w in widths:
                    t0 = time.perf_counter()
                    ri = RescoredIndex(index, t_p, rerank_window=WINDOW, search_width=w)
                    r = ri.top_k(k, prove=True)
                    got = np.array([lp for _, lp in r.items])
                    # Tie-aware: near-ties may swap between two forwards' float noise.
                    ok = bool(r.proven) and got.shape == answer.shape and bool(np.all(np.abs(got - answer) <= TIE))
                    records.append(dict(prompt=text, k=k, method=f"prove, {name}", draft=name, width=w,
                                        calls=ri.target_calls, positions=r.positions, ok=ok,
                                        seconds=time.perf_counter() - t0, base=base))
                    log(f"search_width: {text!r} k={k} {name} {_label(w)}: {ri.target_calls} calls, "
                        f"{r.positions:,} positions, proven and exact: {ok}")
    return records


def summary(records, ks, widths) -> tuple[list, dict]:
    """Rows per (draft, width, k) summed over prompts, and the plot's points."""
    rows, points = [], {}
    for draft in ("student", "3-gram"):
        for w in widths:
            for k in ks:
                mine = [r for r in records if r.get("draft") == draft and r.get("width", 0) == w and r["k"] == k]
                if not mine:
                    continue
                pos = sum(r["positions"] for r in mine)
                base_pos = sum(r["base"]["positions"] for r in mine)
                calls = sum(r["calls"] for r in mine)
                base_calls = sum(r["base"]["calls"] for r in mine)
                ok = sum(r["ok"] for r in mine)
                rows.append([draft, _label(w), k, f"{calls} / {base_calls}", f"{base_calls / calls:.1f}x",
                             f"{pos:,} / {base_pos:,}", f"{pos / base_pos:.1f}x", f"{ok}/{len(mine)}",
                             f"{sum(r['seconds'] for r in mine):.1f} s"])
                points.setdefault((draft, k), []).append((base_calls / calls, pos / base_pos, _label(w)))
    return rows, points


def plot(points, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, draft in zip(axes, ("student", "3-gram")):
        for (d, k), pts in sorted(points.items()):
            if d != draft:
                continue
            xs, ys, labels = zip(*pts)
            ax.plot(xs, ys, "o-", label=f"k = {k}")
            for x, y, lab in zip(xs, ys, labels):
                ax.annotate(lab.split(",")[0], (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
        ax.set_title(f"{draft} draft")
        ax.set_xlabel("best-first's calls / the proof's calls (higher: fewer sequential calls)")
        ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
        ax.legend()
    axes[0].set_ylabel("the proof's positions / KV-cached best-first's")
    fig.suptitle("Proving search width: calls against positions (wide workload, prompts summed)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(quick: bool = False, out_dir=None) -> str:
    prompts = wide.PROMPTS[:1] if quick else wide.PROMPTS
    ks = (10,) if quick else (10, 25, 100)
    widths = (8, None) if quick else WIDTHS
    names = ("3-gram",) if quick else ("student", "3-gram")  # quick: no transformer draft index
    started = time.perf_counter()
    records = measure(prompts, ks, widths, names, log=lambda m: print(m, file=sys.stderr))
    rows, points = summary(records, ks, widths)
    fig_dir = out_dir or os.path.join(HERE, "figures")
    os.makedirs(fig_dir, exist_ok=True)
    plot(points, os.path.join(fig_dir, "search_width.png"))
    default = [r for r in rows if r[1] == _label(8)]
    body = f"""
Machine: {machine()}. {len(records)} searches and baselines in {time.perf_counter() - started:.0f} s.

The proving search opens, in its first round, at most `search_width * k` of the open exits (the
best by bound), and twice as many each later round; a terminating target's speculated path is
closed with eos once its draft estimate falls below the current answer. Per draft, width and k,
summed over the prompts {", ".join(repr(p) for p in prompts)}: sequential target calls (the proof's
/ best-first's, and how many times fewer the proof makes), token positions (the proof's full
forwards / KV-cached best-first's), how many answers were proven with best-first's scores at every
rank (within the target's 1e-3 tolerance: near-ties may swap), and the proofs' wall time (draft index growth included the first time a prompt's index is used).

{table(["draft", "width", "k", "calls", "fewer calls", "positions", "positions ratio", "proven, = best-first", "time"], rows)}

![search width](figures/search_width.png)

The default (`search_width=8`): {"; ".join(f"{r[0]} k={r[2]}: {r[4]} fewer calls at {r[6]} the positions" for r in default)}.
Unlike units are not mixed: both columns count token positions. The proof's are full forwards
(every scored row from the prompt on), cached best-first's one position per expanded prefix.
"""
    return section("Proving search width: calls against positions", COMMAND, body)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    print(run(quick=ap.parse_args().quick))
