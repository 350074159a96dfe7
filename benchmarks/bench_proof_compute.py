"""The proven search's compute against KV-cached best-first, on three workloads, and its policy.

Workloads (one run, side by side):

- ``wide``: the grammar workload (benchmarks/wide.py: 309 words, a word-level target, a distilled
  student and a 3-gram), prompts 'the dog', 'a tall woman', 'the kings', k = 10, 25, 100;
- ``names``: the shipped character models of ``jaxrescore demo`` (target and the 6-gram draft),
  k = 25, 100;
- ``text``: the real-text workload (benchmarks/text.py: clauses of CPython's own documentation,
  3,210 words, a word-level target, a distilled student and a 3-gram), prompts 'the' and
  'if the', k = 10, 25, 100, 300.

Each proof is ``RescoredIndex(SeekIndex(draft.with_prompt(p)), target.with_prompt(p),
draft_model=draft.with_prompt(p)).top_k(k, prove=True)`` with the library's defaults (the API as
a user calls it). The baseline is the exact best-first search
(``jaxrescore.baselines.best_first.best_first_top_k``, batch k) through a KV-cached decoding
session (its held caches pooled, so each batch of k prefixes is one device call per fed width
whatever calls computed their parents): every prefix whose target score clears the answer is
expanded by either method, so its positions are the floor. Positions are the token positions the
target computed (the proof's ``result.positions``: a first call that is the target's full forward
packed as one tree, the prompt again and each distinct prefix once, then what it fed over held
key/value caches, about one per new trie node, and the full forwards checking cached numbers;
best-first's session: one per expanded prefix, the prompt's cache not counted). Calls are
sequential target calls. Times: the fastest of three queries after a warm-up query on the same
draft index (its growth and the compiles are in the warm-up), best-first likewise, the three
rounds of every method interleaved; "target share" (of that fastest run): the part of the
proof's wall time spent in the target's calls (scoring, checks, fetched rows, waiting for the
device included), the rest being the draft's speculation, the frontier and the index. "Device
floor": the seconds the method's compiled model calls take (every incremental and packed forward,
of the target and of a student draft, each waited for), measured in one more query after the timed
ones, over best-first's time: no host-side saving brings the time ratio below it (for best-first,
the share of its own time its device calls take).

    python3 benchmarks/bench_proof_compute.py [--quick]
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import jax  # noqa: E402
import numpy as np  # noqa: E402
import text as text_workload  # noqa: E402
import wide  # noqa: E402
from bench_wide import default_cache  # noqa: E402
from common import clock, machine, section, table  # noqa: E402

from jaxrescore import RescoredIndex, SeekIndex  # noqa: E402
from jaxrescore.baselines.best_first import best_first_top_k  # noqa: E402
from jaxrescore.data.names_models import names_draft, names_target  # noqa: E402
from jaxrescore.models.decoding import decoding_session  # noqa: E402
from jaxrescore.rescore.scored import ScoredSet  # noqa: E402

COMMAND = "python3 benchmarks/run.py --only proof_compute"
# The real-text prompts measured (two of benchmarks/text.py's four: k = 300 on all four would take
# most of an hour on 2 cores).
TEXT_PROMPTS = ("the", "if the")
TIE = 1e-3  # the float32 target's score tolerance: answers equal up to it at every rank
REPS = 3  # timed runs of each method per (prompt, k), interleaved; the fastest is reported
# The policy sweep (wide workload): (label, search_width, adaptive)
POLICIES = (("2k, adaptive (default)", 2, True), ("8k, adaptive", 8, True), ("2k, doubling", 2, False),
            ("8k, doubling", 8, False), ("every open exit", None, False))


def _workloads(quick: bool) -> list[dict]:
    """Each workload: its target, drafts by name, prompts (token tuples with their text) and ks."""
    target, student, _ = wide.load_or_train(wide.FULL, os.path.join(HERE, "figures"))
    lang = wide.language()
    out = [dict(name="wide", target=target, drafts={"student": student, "3-gram": wide.fit_draft(wide.FULL)},
                prompts=[(t, lang.encode(t)) for t in (wide.PROMPTS[:1] if quick else wide.PROMPTS)],
                ks=(10,) if quick else (10, 25, 100))]
    out.append(dict(name="names", target=names_target(), drafts={"6-gram": names_draft()}, prompts=[("", ())],
                    ks=(25,) if quick else (25, 100)))
    if not quick:
        setup = text_workload.setups()["full"]
        t_target, t_student, _ = text_workload.load_or_train(setup, default_cache())
        out.append(dict(name="text", target=t_target,
                        drafts={"student": t_student, "3-gram": text_workload.fit_draft(setup)},
                        prompts=[(t, text_workload.encode(t)) for t in TEXT_PROMPTS],
                        ks=(10, 25, 100, 300)))
    return out


def _best_first(target, k):
    session = decoding_session(target)
    result = best_first_top_k(session, k, batch=k)
    return result, session.positions


def _prove(index, target, draft, k, **policy):
    """The proven top-k as a user asks it (the library's defaults unless ``policy`` says
    ``search_width``/``adaptive_width``), and its target calls."""
    ri = RescoredIndex(index, target, draft_model=draft, **policy)
    return ri.top_k(k, prove=True), ri.target_calls


class TargetClock:
    """Wall seconds spent inside the target's calls of proofs run while it is active (the
    scored set's scoring, full-forward checks and fetched rows: instrumentation only)."""

    METHODS = ("score", "check_forward", "_fetch")

    def __init__(self):
        self.seconds = 0.0

    def __enter__(self):
        self._saved = {m: getattr(ScoredSet, m) for m in self.METHODS}
        for name, fn in self._saved.items():
            setattr(ScoredSet, name, self._timed(fn))
        return self

    def __exit__(self, *exc):
        for name, fn in self._saved.items():
            setattr(ScoredSet, name, fn)

    def _timed(self, fn):
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t0
        return timed


class DeviceClock:
    """Seconds the compiled model calls made while it is active take, each waited for (the
    incremental decode and the packed full forward: instrumentation only, it serialises the
    host's work with the device's)."""

    CALLS = (("jaxrescore.models.decoding", "_decode"), ("jaxrescore.models.packed", "_packed_stats"))

    def __init__(self):
        self.seconds = 0.0

    def __enter__(self):
        modules = [(importlib.import_module(m), name) for m, name in self.CALLS]
        self._saved = [(mod, name, getattr(mod, name)) for mod, name in modules]
        for mod, name, fn in self._saved:
            setattr(mod, name, self._waited(fn))
        return self

    def __exit__(self, *exc):
        for mod, name, fn in self._saved:
            setattr(mod, name, fn)

    def _waited(self, fn):
        def waited(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return jax.block_until_ready(fn(*args, **kwargs))
            finally:
                self.seconds += time.perf_counter() - t0
        return waited


def _device_seconds(fn, *args) -> float:
    with DeviceClock() as device:
        fn(*args)
    return device.seconds


def _equal(result, exact) -> bool:
    got = np.array([lp for _, lp in result.items])
    want = np.array([lp for _, lp in exact.items])
    return bool(result.proven) and got.shape == want.shape and bool(np.all(np.abs(got - want) <= TIE))


def measure(workloads, log=print) -> list[dict]:
    """One record per (workload, prompt, k, method)."""
    records = []
    for w in workloads:
        for label, p in w["prompts"]:
            t_p = w["target"].with_prompt(p) if p else w["target"]
            drafts = {n: (d.with_prompt(p) if p else d) for n, d in w["drafts"].items()}
            indexes = {n: SeekIndex(d, progress=False) for n, d in drafts.items()}
            for k in w["ks"]:
                _best_first(t_p, k)  # warm-up: compiles
                for name, index in indexes.items():
                    _prove(index, t_p, drafts[name], k)  # warm-up: the index grows, compiles
                # REPS rounds, best-first and each proof in turn, each method's fastest kept (with
                # its target share): this machine's load moves single timings by up to 1.5x
                runs: dict = {}
                for _ in range(REPS):
                    (exact, bf_pos), bf_time = clock(_best_first, t_p, k)
                    runs.setdefault("best-first", []).append((bf_time, 0.0, (exact, bf_pos)))
                    for name, index in indexes.items():
                        with TargetClock() as target_clock:
                            out, seconds = clock(_prove, index, t_p, drafts[name], k)
                        runs.setdefault(name, []).append((seconds, target_clock.seconds, out))
                bf_time, _, (exact, bf_pos) = min(runs["best-first"], key=lambda run: run[0])
                base = dict(workload=w["name"], prompt=label, k=k)
                records.append(dict(base, method="best-first, KV cache", calls=exact.calls, positions=bf_pos,
                                    ok=True, seconds=bf_time, device_seconds=_device_seconds(_best_first, t_p, k)))
                for name in indexes:
                    seconds, target_seconds, (r, calls) = min(runs[name], key=lambda run: run[0])
                    ok = _equal(r, exact)
                    device = _device_seconds(_prove, indexes[name], t_p, drafts[name], k)
                    records.append(dict(base, method=f"prove, {name}", calls=calls, positions=r.positions, ok=ok,
                                        seconds=seconds, target_seconds=target_seconds, device_seconds=device))
                    log(f"proof_compute: {w['name']} {label!r} k={k} {name}: {calls} calls / {exact.calls}, "
                        f"{r.positions:,} positions / {bf_pos:,}, proven and exact: {ok}, {seconds:.2f} s / {bf_time:.2f} s "
                        f"(target {target_seconds / seconds:.0%}, device {device:.2f} s)")
    return records


def sweep(workload, log=print) -> list[dict]:
    """The width policies on one workload: one record per (draft, policy, prompt, k)."""
    records = []
    for label, p in workload["prompts"]:
        t_p = workload["target"].with_prompt(p)
        for k in workload["ks"]:
            exact, bf_pos = _best_first(t_p, k)
            for name, d in workload["drafts"].items():
                d_p = d.with_prompt(p)
                index = SeekIndex(d_p, progress=False)
                for policy, width, adaptive in POLICIES:
                    r, calls = _prove(index, t_p, d_p, k, search_width=width, adaptive_width=adaptive)
                    records.append(dict(draft=name, policy=policy, k=k, calls=calls, positions=r.positions,
                                        ok=_equal(r, exact), base_calls=exact.calls, base_positions=bf_pos))
                    log(f"proof_compute sweep: {label!r} k={k} {name} {policy}: {calls} calls, {r.positions:,} positions")
    return records


def _sum(records, key):
    return sum(r[key] for r in records)


def main_rows(records) -> list[list]:
    """Per workload, k and draft, summed over prompts: the proof against best-first."""
    rows = []
    keys = sorted({(r["workload"], r["k"]) for r in records}, key=lambda x: (["wide", "names", "text"].index(x[0]), x[1]))
    for wl, k in keys:
        base = [r for r in records if r["workload"] == wl and r["k"] == k and r["method"] == "best-first, KV cache"]
        methods = sorted({r["method"] for r in records if r["workload"] == wl and r["method"] != base[0]["method"]})
        b_calls, b_pos, b_time = _sum(base, "calls"), _sum(base, "positions"), _sum(base, "seconds")
        rows.append([wl, k, "best-first, KV cache (batch k)", f"{b_calls:,}", "1", f"{b_pos:,}", "1.00x",
                     f"{len(base)}/{len(base)}", f"{b_time:.2f} s", "1.00x", "100%",
                     f"{_sum(base, 'device_seconds') / b_time:.2f}x"])
        for m in methods:
            mine = [r for r in records if r["workload"] == wl and r["k"] == k and r["method"] == m]
            calls, pos, secs = _sum(mine, "calls"), _sum(mine, "positions"), _sum(mine, "seconds")
            rows.append([wl, k, m, f"{calls:,}", f"1/{b_calls / calls:.1f}", f"{pos:,}", f"{pos / b_pos:.2f}x",
                         f"{sum(r['ok'] for r in mine)}/{len(mine)}", f"{secs:.2f} s", f"{secs / b_time:.2f}x",
                         f"{_sum(mine, 'target_seconds') / secs:.0%}", f"{_sum(mine, 'device_seconds') / b_time:.2f}x"])
    return rows


def sweep_rows(records) -> tuple[list, dict]:
    rows, points = [], {}
    for draft in sorted({r["draft"] for r in records}, reverse=True):
        for policy, _, _ in POLICIES:
            for k in sorted({r["k"] for r in records}):
                mine = [r for r in records if r["draft"] == draft and r["policy"] == policy and r["k"] == k]
                calls, pos = _sum(mine, "calls"), _sum(mine, "positions")
                b_calls, b_pos = _sum(mine, "base_calls"), _sum(mine, "base_positions")
                rows.append([draft, policy, k, f"{calls} / {b_calls}", f"1/{b_calls / calls:.1f}",
                             f"{pos:,} / {b_pos:,}", f"{pos / b_pos:.2f}x", f"{sum(r['ok'] for r in mine)}/{len(mine)}"])
                points.setdefault((draft, k), []).append((calls / b_calls, pos / b_pos, policy))
    return rows, points


def plot(points, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drafts = sorted({d for d, _ in points}, reverse=True)
    fig, axes = plt.subplots(1, len(drafts), figsize=(5 * len(drafts), 4), sharey=True, squeeze=False)
    for ax, draft in zip(axes[0], drafts):
        for (d, k), pts in sorted(points.items()):
            if d != draft:
                continue
            xs, ys, labels = zip(*pts)
            ax.plot(xs, ys, "o", label=f"k = {k}")
            for x, y, lab in zip(xs, ys, labels):
                ax.annotate(lab.split(" (")[0], (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
        ax.set_title(f"{draft} draft")
        ax.set_xlabel("the proof's calls / best-first's (lower: fewer sequential calls)")
        ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
        ax.legend()
    axes[0][0].set_ylabel("the proof's positions / KV-cached best-first's")
    fig.suptitle("Proving search policy: calls against positions (wide workload, prompts summed)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(quick: bool = False, out_dir=None) -> str:
    started = time.perf_counter()
    log = lambda m: print(m, file=sys.stderr)  # noqa: E731
    workloads = _workloads(quick)
    records = measure(workloads, log)
    wide_w = dict(workloads[0], ks=(10,) if quick else (10, 100))
    sweep_records = sweep(wide_w, log)
    srows, points = sweep_rows(sweep_records)
    fig_dir = out_dir or os.path.join(HERE, "figures")
    os.makedirs(fig_dir, exist_ok=True)
    plot(points, os.path.join(fig_dir, "proof_policy.png"))
    body = f"""
Machine: {machine()}. Measured in {time.perf_counter() - started:.0f} s.

{__doc__.split("Workloads (one run, side by side):")[1].split("    python3")[0].strip()}

Summed over each workload's prompts (names: no prompt): sequential target calls (and the share of
best-first's), token positions (and the ratio to best-first's), answers proven and equal to
best-first's at every rank (within the target's 1e-3 tolerance), and wall time on 2 CPU cores.

{table(["workload", "k", "method", "calls", "of best-first's", "positions", "positions ratio", "proven, = best-first", "time",
        "time ratio", "target share", "device floor"], main_rows(records))}

The policy (wide workload, k = 10 and 100, prompts summed): the first round opens at most
`search_width * k` of the open exits (the best by bound); "adaptive" (the default) doubles the
width when at least half of the trie nodes the last round computed scored at least the current
worst answer, halves it (to k at least) under a fourth, else keeps it, and besides opens at most a
quarter of the open exits while the worst answer is still rising and the draft expects nothing
above it, and speculates 2 nats below the answer once at most k / 8 exits are left; "doubling"
doubles every round; "every open exit" opens all of them every round. Every policy aims at the
answer's expected worst score (the draft's estimates of the complete paths it speculated): exits
below the aim wait, paths are cut where their estimate falls below it.

{table(["draft", "policy", "k", "calls", "of best-first's", "positions", "positions ratio", "proven, = best-first"], srows)}

![proof policy](figures/proof_policy.png)
"""
    return section("Proof compute: the proven search against KV-cached best-first", COMMAND, body)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    print(run(quick=ap.parse_args().quick))
