"""Many prompts in one call, and what a fresh process compiles.

Many prompts: ``jaxrescore.top_k(target, draft, k, prompt=[...32 prompts])`` (ONE call: every
prompt's proof searched jointly, one target call per round for all of them, each prompt's rows
extending its own key/value caches in one shared session) against a loop of
``jaxrescore.top_k(target, draft, k, prompt=p)``, on the real-text workload (benchmarks/text.py),
both drafts, k = 10. The prompts: the 32 commonest first two words of the training clauses of
more than 3 tokens. Both ways warm (each ran once before, so both have compiled their shapes),
timed twice in turn, the faster of each kept; token positions the target computed, sequential
target calls (the loop's summed, the joint call's rounds), answers proven and equal at every rank
(within 1e-3), wall time on 2 CPU cores.

Compiles: a fresh process loads the models, then runs three proven ``top_k(25)`` queries, one per
prompt ('the', 'if the', 'return the'), counting the XLA programs each compiles with
``jax.monitoring``'s backend-compile events.

``--quick``: the grammar workload's three prompts (benchmarks/wide.py) and the names models'
compiles (prompts 'ma', 'jo', 'el').

    python3 benchmarks/bench_many_prompts.py [--quick]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402
from common import clock, machine, section, table  # noqa: E402

import jaxrescore  # noqa: E402

COMMAND = "python3 benchmarks/run.py --only many_prompts"
K = 10
PROMPTS = 32
TIE = 1e-3

COMPILES = r"""
import json, os, sys
sys.path.insert(0, {here!r})
import jax
count = [0]
def listen(event, duration, **kw):
    if event == "/jax/core/compile/backend_compile_duration":
        count[0] += 1
jax.monitoring.register_event_duration_secs_listener(listen)
import jaxrescore
{load}
out = []
for prompt in {prompts!r}:
    before = count[0]
    r = jaxrescore.top_k(target, draft, 25, prompt=encode(prompt))
    out.append([prompt, count[0] - before, bool(r.proven)])
print(json.dumps(out))
"""

TEXT_LOAD = """
import text as T
from bench_wide import default_cache
setup = T.setups()["full"]
target, student, _ = T.load_or_train(setup, default_cache())
draft = student if {draft!r} == "student" else T.fit_draft(setup)
encode = T.encode
"""

NAMES_LOAD = """
from jaxrescore.data.names_models import names_draft, names_target
target, draft = names_target(), names_draft()
encode = lambda p: p
"""


def _workload(quick: bool) -> tuple:
    """``(name, target, drafts by name, prompts as token tuples, their texts)``."""
    if quick:
        import wide

        target, student, _ = wide.load_or_train(wide.FULL, os.path.join(HERE, "figures"))
        lang = wide.language()
        return "wide", target, {"student": student, "3-gram": wide.fit_draft(wide.FULL)}, \
            [lang.encode(p) for p in wide.PROMPTS], list(wide.PROMPTS)
    import text as T
    from bench_wide import default_cache

    setup = T.setups()["full"]
    target, student, _ = T.load_or_train(setup, default_cache())
    firsts = collections.Counter(c[:2] for c in T.split(False) if len(c) > 3)
    texts = [T.decode(p) for p, _ in firsts.most_common(PROMPTS)]
    return "text", target, {"student": student, "3-gram": T.fit_draft(setup)}, [T.encode(t) for t in texts], texts


def _equal(a, b) -> bool:
    x, y = np.array([lp for _, lp in a.items]), np.array([lp for _, lp in b.items])
    return bool(a.proven and b.proven and x.shape == y.shape and np.all(np.abs(x - y) <= TIE))


def measure(quick: bool, log=print) -> tuple[str, list]:
    name, target, drafts, prompts, _ = _workload(quick)
    rows = []
    for dname, draft in drafts.items():
        loop = lambda: [jaxrescore.top_k(target, draft, K, prompt=p) for p in prompts]  # noqa: E731
        joint = lambda: jaxrescore.top_k(target, draft, K, prompt=prompts)  # noqa: E731
        loop(), joint()  # warm-up: both compile their shapes
        # two rounds, loop then joint, each way's faster kept (this machine's load moves single
        # timings by up to 1.5x)
        (singles, t_loop), (together, t_joint) = clock(loop), clock(joint)
        t_loop, t_joint = min(t_loop, clock(loop)[1]), min(t_joint, clock(joint)[1])
        p_loop, p_joint = sum(r.positions for r in singles), sum(r.positions for r in together)
        c_loop, c_joint = sum(r.rounds for r in singles), max(r.rounds for r in together)
        ok = sum(_equal(a, b) for a, b in zip(singles, together))
        log(f"many_prompts: {name} {dname}: loop {t_loop:.2f} s {p_loop:,} positions {c_loop} calls; "
            f"joint {t_joint:.2f} s {p_joint:,} positions {c_joint} calls; equal {ok}/{len(prompts)}")
        rows.append([dname, "loop of single proofs", f"{c_loop:,}", f"{p_loop:,}", "1.00x", f"{len(prompts)}/{len(prompts)}",
                     f"{t_loop:.2f} s", "1.00x"])
        rows.append([dname, "one call, every prompt", f"{c_joint:,}", f"{p_joint:,}", f"{p_joint / p_loop:.2f}x",
                     f"{ok}/{len(prompts)}", f"{t_joint:.2f} s", f"{t_loop / t_joint:.2f}x"])
    return name, rows


def compiles(quick: bool, log=print) -> list:
    """One row per (draft, prompt): XLA programs a fresh process's query compiled."""
    setups = [("6-gram (names)", NAMES_LOAD, ("ma", "jo", "el"))] if quick else [
        (d, TEXT_LOAD.format(draft=d), ("the", "if the", "return the")) for d in ("student", "3-gram")]
    rows = []
    for dname, load, prompts in setups:
        code = COMPILES.format(here=HERE, load=load, prompts=prompts)
        t0 = time.perf_counter()
        got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=1800, check=True)
        seconds = time.perf_counter() - t0
        for i, (prompt, n, proven) in enumerate(json.loads(got.stdout.strip().splitlines()[-1])):
            rows.append([dname, ["first", "second", "third"][i], repr(prompt), n, proven])
        log(f"many_prompts compiles: {dname}: {[r[3] for r in rows[-len(prompts):]]} ({seconds:.0f} s)")
    return rows


def run(quick: bool = False, out_dir=None) -> str:
    started = time.perf_counter()
    log = lambda m: print(m, file=sys.stderr)  # noqa: E731
    name, rows = measure(quick, log)
    crows = compiles(quick, log)
    body = f"""
Machine: {machine()}. Measured in {time.perf_counter() - started:.0f} s.

{__doc__.split("in one call, and what a fresh process compiles.")[1].split("    python3")[0].strip()}

Workload: {name}, k = {K}, {"3" if quick else PROMPTS} prompts.

{table(["draft", "how", "target calls", "positions", "positions ratio", "proven, equal", "time", "speed-up"], rows)}

{table(["draft", "query in the process", "prompt", "XLA programs compiled", "proven"], crows)}
"""
    return section("Many prompts in one call, and compiles", COMMAND, body)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    print(run(quick=ap.parse_args().quick))
