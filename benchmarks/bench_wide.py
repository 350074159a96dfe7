"""Top-k of a word-level transformer over continuations of several prompts (the wide workload of
``benchmarks/wide.py``): proven speculative search against the ways to get the same answer
without a draft, the gap-certified query, a SeekIndex over the target and beam search.

    python3 benchmarks/bench_wide.py [--quick] [--out DIR]

``--out DIR`` is where the trained target is cached (``DIR/wide_target.npz``; default
``$XDG_CACHE_HOME/jaxrescore/bench`` or ``~/.cache/jaxrescore/bench``), regenerated when missing.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import wide  # noqa: E402
from common import section, table  # noqa: E402

from jaxrescore import RescoredIndex, SeekIndex, rescore_many  # noqa: E402
from jaxrescore.index import beam_search  # noqa: E402
from jaxrescore.index.best_first import best_first_top_k  # noqa: E402
from jaxrescore.index.seek import IndexLimitError  # noqa: E402
from jaxrescore.models import estimate_top_gap  # noqa: E402
from jaxrescore.models.prompt import PromptedModel  # noqa: E402

COMMAND = "python3 benchmarks/bench_wide.py"
WINDOW = 32  # the proof's first rerank window (the names demo's default)
GAP_MARGIN = 1.0  # nats added to the estimated gap (as the names demo does)
TARGET_K = 25  # the k at which issue 12 states its targets


def default_cache() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "jaxrescore", "bench")


# ---- counting what the target computes ----------------------------------------------------------


def _lengths(seqs) -> np.ndarray:
    if hasattr(seqs, "lengths"):
        return np.asarray(seqs.lengths, np.int64).reshape(-1)
    return np.array([len(s) for s in seqs], np.int64)


class Counter:
    """Delegates to the UNPROMPTED target, counting its batched calls, rows and token positions.
    Prompt it with ``counter.with_prompt(p)``: the prompt is then inside every row it sees, so
    it is counted too. Positions are what a forward without a KV cache computes: a next-token
    row after ``n`` tokens costs ``n + 1`` (BOS included); teacher-forcing a sequence of ``n``
    tokens costs ``n`` (its inputs are BOS and the first ``n - 1`` tokens)."""

    def __init__(self, model):
        self.model = model
        self.vocab_size, self.eos, self.max_len = model.vocab_size, model.eos, model.max_len
        self.score_tolerance = model.score_tolerance
        self.reset()

    def reset(self) -> None:
        self.calls = self.rows = self.positions = 0

    def snapshot(self) -> tuple[int, int, int]:
        return self.calls, self.rows, self.positions

    def _count(self, lengths: np.ndarray, extra: int) -> None:
        self.calls += 1
        self.rows += int(lengths.size)
        self.positions += int(lengths.sum()) + extra * int(lengths.size)

    def next_logprobs(self, prefixes, lengths):
        self._count(np.asarray(lengths, np.int64).reshape(-1), 1)
        return self.model.next_logprobs(prefixes, lengths)

    def score_sequences(self, seqs, **kw):
        self._count(_lengths(seqs), 0)
        return self.model.score_sequences(seqs, **kw)

    def score_frontier(self, seqs, **kw):
        self._count(_lengths(seqs), 0)
        return self.model.score_frontier(seqs, **kw)

    def with_prompt(self, prompt) -> PromptedModel:
        return PromptedModel(self, prompt)


# ---- the methods --------------------------------------------------------------------------------

# Sequences the gap-certified query may pull while it grows (RescoredIndex's default is 65,536;
# growing the draft index that far over 309-word rows takes tens of seconds per query).
CERTIFY_CAP = 8192
QUICK_CERTIFY_CAP = 1024
SLOW = 2.0  # seconds: a method whose warm-up run took longer is timed once after it, not 3 times


def grow_index(model, n: int, index: SeekIndex | None = None) -> SeekIndex:
    """A SeekIndex over ``model`` (or ``index``, deepened further) holding >= ``n`` sequences,
    deepened one bit at a time from 8 bits: the smallest whole-bit budget that holds them.
    ``ensure_count(n)`` is not used: over these 309-word rows its size prediction either refuses
    (IndexLimitError: predicted 1.7e10 nodes for 20,000 sequences of the 3-gram) or overshoots
    (ensure_count(42) over the student built 197,166 sequences from 849,244 rows in 31 s)."""
    index = SeekIndex(model, progress=False) if index is None else index
    bits = max(8.0, index.built_bits)
    while len(index) < n:
        bits = float(np.floor(bits)) + 1.0
        index.ensure_bits(bits)
    return index


def target_index_costs(counter: Counter, prompt: tuple, ks) -> dict:
    """The exact-index cost: a SeekIndex over the target, grown one bit at a time; for each k,
    the target's (calls, rows, positions), the seconds spent and the first k items when it first
    holds k sequences (the same as a fresh ``grow_index(target, k)``: the steps are the same)."""
    out = {}
    index = SeekIndex(counter.with_prompt(prompt), progress=False)
    counter.reset()
    start = time.perf_counter()
    for k in sorted(ks):
        grow_index(index.model, k, index)
        out[k] = (counter.snapshot(), time.perf_counter() - start, [index.unrank(i) for i in range(k)])
    return out


def timed(fn, repeats: int, setup=None):
    """``(last result, median seconds, timed runs)`` of ``fn()`` (or ``fn(setup())``, ``setup``
    outside the timed region): one warm-up call (it pays the compiles), then ``repeats`` timed
    calls, or one when the warm-up took over ``SLOW`` seconds. ``repeats=0``: a single timed call
    and no warm-up (the --quick smoke run: compiles included)."""
    call = fn if setup is None else (lambda arg: fn(arg))
    prepare = (lambda: None) if setup is None else setup

    def once():
        arg = prepare()
        t = time.perf_counter()
        out = call() if setup is None else call(arg)
        return out, time.perf_counter() - t

    if repeats == 0:
        out, seconds = once()
        return out, seconds, 0
    runs = repeats if once()[1] <= SLOW else 1
    results = [once() for _ in range(runs)]
    return results[-1][0], statistics.median(t for _, t in results), runs


def counted(counter: Counter, fn):
    """Run ``fn`` with ``counter`` reset: ``(result, (calls, rows, positions))``."""
    counter.reset()
    out = fn()
    return out, counter.snapshot()


def measure_prompt(models, prompt: tuple, k: int, repeats: int, candidates: list, seek_costs: dict,
                   indexes: dict) -> tuple[list, dict]:
    """Every method on one prompt at one k: ``(rows, extras)``; ``rows[0]`` is best-first, the
    exact answer. A row is a dict: method, cost (calls, rows, positions), seconds, runs, answer
    (``(sequence, log_prob)`` pairs), verdict (True/False, "exact", "-" or "refused")."""
    target, counter = models["target"], models["counter"]
    t_p, c_p = target.with_prompt(prompt), counter.with_prompt(prompt)
    extras = {}
    rows = []

    clock = [time.perf_counter()]

    def log(what):
        now = time.perf_counter()
        print(f"wide:   top-{k} {what}: {now - clock[0]:.1f} s", file=sys.stderr)
        clock[0] = now

    def add(method, measured, answer, verdict, cost=None, **more):
        log(method)
        out, seconds, runs = measured
        rows.append(dict(method=method, cost=cost if cost is not None else out[1], seconds=seconds, runs=runs,
                         answer=answer, verdict=verdict, **more))

    m = timed(lambda: counted(counter, lambda: best_first_top_k(c_p, k, batch=k)), repeats)
    add(f"best-first (batch {k})", m, m[0][0].items, "exact")

    for name, draft in models["drafts"].items():
        d_p = draft.with_prompt(prompt)
        t0 = time.perf_counter()
        index = grow_index(d_p, k + WINDOW, indexes.get(name))
        indexes[name] = index
        extras[f"index {name}"] = (len(index), index.forwards, time.perf_counter() - t0)
        log(f"index, {name} draft")

        def prove():
            ri = RescoredIndex(index, c_p, rerank_window=WINDOW, draft_model=d_p)
            return ri.top_k(k, prove=True)

        m = timed(lambda: counted(counter, prove), repeats)
        add(f"prove, {name} draft", m, m[0][0].items, m[0][0].proven, reason=m[0][0].proof_reason)

        counter.reset()
        est = estimate_top_gap(d_p, c_p, k, candidates)
        gap = est.excess + GAP_MARGIN
        extras[f"gap {name}"] = (gap, counter.snapshot())
        log(f"gap estimate, {name} draft")

        def certify(ix):
            ri = RescoredIndex(ix, c_p, rerank_window=WINDOW, assumed_gap=gap)
            return ri.top_k(k, until_certified=True, max_sequences=CERTIFY_CAP if repeats else QUICK_CERTIFY_CAP)

        try:
            # The query deepens its draft index as it grows the pull: every run starts from a
            # copy of the index as the proof found it, and that growth is in its time.
            m = timed(lambda ix: counted(counter, lambda: certify(ix)), repeats, setup=lambda: copy.deepcopy(index))
            add(f"certified, {name} draft", m, m[0][0].items, m[0][0].certified, reason=m[0][0].reason, gap=gap)
        except IndexLimitError as err:
            rows.append(dict(method=f"certified, {name} draft", cost=counter.snapshot(), seconds=float("nan"),
                             runs=0, answer=None, verdict="refused", reason=str(err).split(";")[0], gap=gap))
            log(f"certified, {name} draft (refused)")

    cost, seconds, items = seek_costs[k]
    rows.append(dict(method="SeekIndex(target)", cost=cost, seconds=seconds, runs=-1, answer=items, verdict="-"))

    for beam in (k, 4 * k):
        m = timed(lambda: beam_search(t_p, beam), repeats)
        b = m[0]
        add(f"beam (B = {beam})", m, b.items[:k], "-", cost=(b.calls, b.rows, b.positions))
    return rows, extras


def recall(answer, exact, k: int) -> float:
    if answer is None:
        return float("nan")
    return len({s for s, _ in answer[:k]} & {s for s, _ in exact[:k]}) / k


def agrees(answer, exact, k: int) -> bool:
    """Same sequences as the exact answer, scores within 1e-3 nats (the target's tolerance)."""
    if answer is None or len(answer) < min(k, len(exact)):
        return False
    got = dict(answer[:k])
    return set(got) == {s for s, _ in exact[:k]} and all(abs(got[s] - lp) <= 1e-3 for s, lp in exact[:k])


def load_models(quick: bool, out_dir):
    setup = wide.QUICK if quick else wide.FULL
    folder = out_dir or default_cache()
    target, student, trained = wide.load_or_train(setup, folder)
    drafts = {f"{setup.draft_order}-gram": wide.fit_draft(setup), "student": student}
    return {"target": target, "drafts": drafts, "counter": Counter(target), "setup": setup, "folder": folder,
            "trained": trained}


def corpus_candidates(setup, prompt: tuple, limit: int = 4096) -> list:
    """The corpus's continuations of ``prompt``, commonest first (the gap estimate's candidates)."""
    counts: dict = {}
    p = len(prompt)
    for s in wide.corpus(setup.corpus_size):
        if s[:p] == prompt:
            counts[s[p:]] = counts.get(s[p:], 0) + 1
    return [c for c, _ in sorted(counts.items(), key=lambda x: (-x[1], x[0]))][:limit]


def joint_prove(models, draft, indexes: list, prompts: list, k: int, repeats: int):
    """``rescore_many(..., prove=True)``: every prompt's proof with one target call per round
    (``indexes``: each prompt's draft index, already holding k + WINDOW sequences)."""
    counter = models["counter"]

    def run():
        ris = [RescoredIndex(ix, counter.with_prompt(p), rerank_window=WINDOW, draft_model=draft.with_prompt(p))
               for ix, p in zip(indexes, prompts)]
        return rescore_many(ris, k, prove=True)

    return timed(lambda: counted(counter, run), repeats)


def fmt_time(seconds: float, runs) -> str:
    if seconds != seconds:
        return "-"
    text = f"{seconds * 1e3:.0f} ms" if seconds < 10 else f"{seconds:.1f} s"
    if min(runs) == 0:  # --quick: every time is one run with its compiles
        return text
    return text + ("" if min(runs) == 3 else " *" if min(runs) >= 1 else " †")


def run(quick: bool = False, out_dir=None) -> str:
    """Measure and return the BENCHMARKS.md section (see the module docstring)."""
    lang = wide.language()
    started = time.perf_counter()
    models = load_models(quick, out_dir)
    setup, target = models["setup"], models["target"]
    prompts_text = wide.PROMPTS[:1] if quick else wide.PROMPTS
    prompts = [lang.encode(p) for p in prompts_text]
    ks = (10,) if quick else (10, 25, 100)
    repeats = 0 if quick else 3
    nll = wide.heldout_nll({"target": target, **models["drafts"]}, n=500 if quick else 2000)

    summary, per_prompt, checks = [], [], []
    seek_costs, indexes = {}, {}
    for text, prompt in zip(prompts_text, prompts):
        seek_costs[prompt] = target_index_costs(models["counter"], prompt, ks)
        indexes[prompt] = {}
        print(f"wide: SeekIndex(target) of {text!r} grown ({time.perf_counter() - started:.0f} s)", file=sys.stderr)
    for k in ks:
        totals: dict = {}
        names: list = []

        def tally(name, cost, seconds, runs, rec, verdict, ok):
            if name not in totals:
                names.append(name)
                totals[name] = {"cost": [0, 0, 0], "seconds": 0.0, "runs": [], "recall": [], "verdicts": [],
                                "agree": []}
            t = totals[name]
            t["cost"] = [a + b for a, b in zip(t["cost"], cost)]
            t["seconds"] += seconds
            t["runs"].append(runs)
            t["recall"].append(rec)
            t["verdicts"].append(verdict)
            t["agree"].append(ok)

        for text, prompt in zip(prompts_text, prompts):
            rows, extras = measure_prompt(models, prompt, k, repeats, corpus_candidates(setup, prompt),
                                          seek_costs[prompt], indexes[prompt])
            exact = rows[0]["answer"]
            for row in rows:
                row["recall"] = recall(row["answer"], exact, k)
                row["agrees"] = agrees(row["answer"], exact, k)
                tally(row["method"], row["cost"], row["seconds"], row["runs"], row["recall"], row["verdict"],
                      row["agrees"])
                checks.append((k, text, row["method"], row["verdict"], row["agrees"]))
            per_prompt.append((k, text, rows, extras))
            print(f"wide: top-{k} of {text!r} measured ({time.perf_counter() - started:.0f} s)", file=sys.stderr)
        exacts = [pp[2][0]["answer"] for pp in per_prompt if pp[0] == k]
        for name, draft in models["drafts"].items():
            (results, cost), seconds, runs = joint_prove(models, draft, [indexes[p][name] for p in prompts], prompts,
                                                         k, repeats)
            label = f"prove jointly (rescore_many), {name} draft"
            for text, r, e in zip(prompts_text, results, exacts):
                ok = agrees(r.items, e, k)
                checks.append((k, text, label, r.proven, ok))
                tally(label, (0, 0, 0), 0.0, runs, recall(r.items, e, k), r.proven, ok)
            totals[label]["cost"] = list(cost)  # one call per round for all prompts: not a sum
            totals[label]["seconds"] = seconds
        order = [names[0]] + [n for n in names if n.startswith("prove")] + sorted(
            n for n in names if n.startswith("prove jointly")) + [n for n in names if n.startswith("certified")] + [
            n for n in names if n.startswith(("SeekIndex", "beam"))]
        order = list(dict.fromkeys(order))
        for name in order:
            t = totals[name]
            summary.append([f"top-{k}", name, t["cost"][0], t["cost"][1], t["cost"][2], _recall_text(t["recall"]),
                            _verdict_text(name, t["verdicts"]), fmt_time(t["seconds"], t["runs"])])
    seconds = time.perf_counter() - started
    return section(
        "Top-k on a wide workload: word-level transformer over continuations of several prompts",
        COMMAND + (" --quick" if quick else ""),
        _text(quick, models, prompts_text, repeats, nll, summary, per_prompt, checks, seconds),
    )


def _recall_text(values) -> str:
    vals = [v for v in values if v == v]
    if not vals:
        return "-"
    lo, hi = min(vals), max(vals)
    return f"{statistics.mean(vals):.2f}" + ("" if lo == hi else f" ({lo:.2f}-{hi:.2f})")


def _verdict_text(name: str, verdicts) -> str:
    if name.startswith("best-first"):
        return "exact"
    if all(v == "-" for v in verdicts):
        return "-"
    ok = sum(v is True for v in verdicts)
    refused = sum(v == "refused" for v in verdicts)
    return f"{ok}/{len(verdicts)}" + (f" ({refused} refused)" if refused else "")


def _cost_pair(row) -> str:
    return f"{row['cost'][0]} / {row['cost'][1]:,}"


def _text(quick, models, prompts_text, repeats, nll, summary, per_prompt, checks, seconds) -> str:
    setup, target, drafts = models["setup"], models["target"], models["drafts"]
    student = drafts["student"]
    lang = wide.language()
    trained = models["trained"]
    train_text = ", ".join(f"{role} trained in this run in {t:.0f} s" for role, t in trained.items()) or (
        "both loaded from the cache")
    wrong = [c for c in checks if c[3] is True and not c[4]]
    claims = sum(c[3] is True for c in checks)
    header = ["query", "method", "target calls", "target rows", "token positions", "recall@k", "proven / certified",
              "time"]
    draft_names = list(drafts)
    per_rows, ratios = [], {name: [] for name in draft_names}
    for k, text, rows, extras in per_prompt:
        by = {r["method"]: r for r in rows}
        bf = rows[0]
        line = [f"top-{k}", f"'{text}'", _cost_pair(bf)]
        for name in draft_names:
            pr = by[f"prove, {name} draft"]
            line.append(_cost_pair(pr) + ("" if pr["verdict"] is True else " (not proven)"))
            ratios[name].append((k, text, bf["cost"][0] / max(pr["cost"][0], 1), pr["cost"][1] / max(bf["cost"][1], 1)))
        line.append(", ".join(f"{extras[f'index {n}'][0]:,} / {extras[f'index {n}'][1]:,}" for n in draft_names))
        line.append(", ".join(f"{extras[f'gap {n}'][0]:.2f}" for n in draft_names))
        per_rows.append(line)
    runs_note = (f"median of {repeats} timed runs after a warm-up run (compiles excluded); `*`: a method "
                 f"whose warm-up took over {SLOW:.0f} s on some prompt was timed once after it there; `†`: one "
                 "run, compiles included (a few, next to seconds of forwards)") if not quick else (
                 "one run each, compiles included: a smoke run")
    body = f"""
The workload (`benchmarks/wide.py`): sentences of a fixed probabilistic grammar over
{lang.vocab_size} words (`SUBJ [ADV] VERB OBJ PREP POSS PLACE TIME <eos>`, optional adjectives and a
subject relative clause; the main verb agrees in number with the subject across the clause, the
possessive agrees with the subject 5-12 words back, the verb follows the subject's class and the
time word the verb; Zipfian word lists). Corpus: {setup.corpus_size:,} sentences drawn with a fixed
seed. Target: a word-level `TransformerLM` ({target.config.n_layers} layers, d_model
{target.config.d_model}, {target.n_params:,} parameters, max_len {target.max_len}) trained with
`train_lm` ({setup.steps} steps of {setup.batch_size} sentences). Drafts: an interpolated
Kneser-Ney {setup.draft_order}-gram (`NGramLM.fit` on the same corpus) and a student
`TransformerLM` ({student.config.n_layers} layer, d_model {student.config.d_model},
{student.n_params:,} parameters) `distill`ed from the target ({setup.distill_steps} steps); fixed seeds,
{train_text}. Held-out NLL per token: source {nll['source']:.3f}, target {nll['target']:.3f},
{", ".join(f"{n} {nll[n]:.3f}" for n in draft_names)} nats. Queries: the top-k continuations of
{len(prompts_text)} prompt{'s' if len(prompts_text) > 1 else ''}
({", ".join(repr(p) for p in prompts_text)}), summed over the prompts (calls too: one prompt
after another), except `rescore_many`, which proves every prompt at once with one target call per
round. Methods: best-first is `best_first_top_k` over the target, `batch = k` prefixes per call: the
exact answer every recall is measured against; `prove` is `RescoredIndex(SeekIndex(draft), target,
rerank_window={WINDOW}, draft_model=draft).top_k(k, prove=True)`; `certified` is
`top_k(k, until_certified=True)` under `assumed_gap = estimate_top_gap(draft, target, k, corpus
continuations).excess + {GAP_MARGIN}` (an assumption; the estimate's own target cost is not in the
table); `SeekIndex(target)` builds the target's own index until it holds k sequences (its first k,
in quantized order, are its answer); beam is `jaxrescore.index.beam_search` (jitted, t5x-style),
its best k finished hypotheses. Target rows are prefixes expanded or sequences teacher-forced (plus
full rows fetched); token positions are what those forwards compute without a KV cache (a prefix
of n tokens: n + 1 with BOS; teacher-forcing n tokens: n; prompts included; with a KV cache
best-first and beam would pay one position per row). Times: {runs_note}; draft indexes are built
beforehand (their cost is the draft's).

{table(header, summary, "llrrrrlr")}

Per prompt (calls / rows), with each draft index's size / draft rows and the assumed gaps:

{table(["query", "prompt", "best-first"] + [f"prove, {n} draft" for n in draft_names]
       + ["draft indexes (sequences / rows)", "assumed gaps"], per_rows, "llrrrll")}

Every answer that claims proven or certified was checked against best-first's ({claims} claims):
{"all agree" if not wrong else "DISAGREE: " + repr(wrong)}.
"""
    if not quick:
        body += _verdict(ratios)
    body += f"\nSection measured in {seconds:.0f} s.\n"
    return body


def _verdict(ratios) -> str:
    lines = []
    for name, items in ratios.items():
        at = [(t, c, r) for k, t, c, r in items if k == TARGET_K]
        if not at:
            continue
        calls_ok = all(c >= 3 for _, c, _ in at)
        rows_ok = all(r <= 1 for _, _, r in at)
        detail = "; ".join(f"'{t}' {c:.1f}x fewer calls, {r:.2f}x the rows" for t, c, r in at)
        lines.append(f"- {name} draft: calls target {'met on every prompt' if calls_ok else 'MISSED'}, rows "
                     f"target {'met on every prompt' if rows_ok else 'MISSED'} ({detail}).")
    return f"""
Issue 12's targets at k = {TARGET_K} (the proof with no more target rows than best-first's prefix
rows, and >= 3x fewer sequential target calls than batched best-first), per prompt:

""" + "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="k = 10, one prompt, a tiny target: a smoke run")
    ap.add_argument("--out", default=None, help=f"folder of the cached target (default {default_cache()})")
    args = ap.parse_args(argv)
    print(run(args.quick, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
