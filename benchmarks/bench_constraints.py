"""Constrained proofs: the proven top-k among the names a constraint accepts, against best-first.

    python3 benchmarks/bench_constraints.py [--quick]
    python3 benchmarks/run.py --only constraints

The names workload (the demo's models: the shipped character transformer as target, the
character 6-gram as draft). Each query is what a user writes,
``jaxrescore.top_k(target, draft, k, constraint=c)`` (defaults otherwise), against an exact
best-first search over the constrained target, ``best_first_top_k(ConstrainedModel(target, c),
k)`` (KV cache, batch k: it prunes by the constraint), in one process, warm (a first query of each
kind compiled the programs both use; the timed query is the second). Positions: token positions
the target computed (the proof's include the full forwards that check its answer:
``result.check_positions``); best-first's expansions are one cached position each.
"""

from __future__ import annotations

import sys
import time

from common import machine, section, standalone, table  # noqa: E402

COMMAND = "python3 benchmarks/run.py --only constraints"
# (shown, expression): the four kinds, as a user writes them.
CONSTRAINTS = [
    ('Regex("ma[a-z]*a")', lambda c: c.Regex("ma[a-z]*a")),
    ("Length(min_tokens=8)", lambda c: c.Length(min_tokens=8)),
    ('Length(4, 6) & Regex("[a-m]+")', lambda c: c.Length(4, 6) & c.Regex("[a-m]+")),
    ('OneOf(["anna", "maria", "zzz", "john"])', lambda c: c.OneOf(["anna", "maria", "zzz", "john"])),
]


def _run_one(target, draft, constraint, k):
    import jaxrescore
    from jaxrescore.baselines.best_first import best_first_top_k
    from jaxrescore.constraints import ConstrainedModel

    t = time.perf_counter()
    r = jaxrescore.top_k(target, draft, k, constraint=constraint)
    proof_wall = time.perf_counter() - t
    t = time.perf_counter()
    bf = best_first_top_k(ConstrainedModel(target, constraint), k)
    bf_wall = time.perf_counter() - t
    same = [tuple(s) for s, _ in r.items] == [tuple(s) for s, _ in bf.items]
    return r, proof_wall, bf, bf_wall, same


def run(quick: bool = False, out_dir: str | None = None) -> str:
    import jaxrescore.constraints as c
    from jaxrescore.data.names_models import names_draft, names_target

    target, draft = names_target(), names_draft()
    ks = (10,) if quick else (10, 25)
    kinds = CONSTRAINTS[:2] if quick else CONSTRAINTS
    rows, answers = [], []
    for shown, make in kinds:
        for k in ks:
            _run_one(target, draft, make(c), k)  # compiles what both searches use
            r, pw, bf, bw, same = _run_one(target, draft, make(c), k)
            rows.append([f"`{shown}`", k, "yes" if r.proven else f"NO: {r.proof_reason}", "yes" if same else "NO",
                         len(r.items), f"{r.positions:,}", f"{r.positions - r.check_positions:,}", f"{bf.forwards:,}",
                         f"{r.positions / max(bf.forwards, 1):.2f}x", r.rounds, bf.calls, f"{pw:.2f}", f"{bw:.2f}"])
            if k == ks[0]:
                answers.append((shown, r.texts[:5]))
    head = ["constraint", "k", "proven", "= best-first", "items", "positions (proof)", "of them searching",
            "expansions (best-first)", "ratio", "calls (proof)", "calls (best-first)", "wall s (proof)",
            "wall s (best-first)"]
    lines = [
        f"Machine: {machine()}. Names workload (the demo's target and 6-gram draft), warm. Proof: "
        "`jaxrescore.top_k(target, draft, k, constraint=c)`; best-first: "
        "`best_first_top_k(ConstrainedModel(target, c), k)`.",
        "",
        table(head, rows, "lrllrrrrrrrrr"),
        "",
        "The first five proven answers (k = 10):",
        "",
    ] + [f"- `{shown}`: {', '.join(texts)}" for shown, texts in answers]
    return section("Constrained proofs: names under length, regex and choices", COMMAND, "\n".join(lines))


if __name__ == "__main__":
    sys.exit(standalone(__doc__, run))
