"""Cold start: what a new process pays before its first answer.

Each figure comes from fresh subprocesses (median of ``repeats``): ``import jaxrescore``; ``jaxrescore
--help``; the first proven ``top_k(25)`` on the names models in a process (models loaded first,
its compiles counted with ``jax_log_compiles``), with and without a warm persistent compilation
cache; and ``jaxrescore demo --json`` on an empty cache and again on the cache the first run left.

    python3 benchmarks/bench_cold.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from common import section, table

COMMAND = "python3 benchmarks/run.py --only cold"

FIRST_QUERY = r"""
import json, logging, time
import jax
compiles = []
class Count(logging.Handler):
    def emit(self, record):
        if "Finished XLA compilation" in record.getMessage() or "Compiling" in record.getMessage():
            compiles.append(record.getMessage())
jax.config.update("jax_log_compiles", True)
logging.getLogger("jax").addHandler(Count())
logging.getLogger("jax").setLevel(logging.DEBUG)
import jaxrescore
if __import__("os").environ.get("BENCH_CACHE"):
    jaxrescore.enable_compilation_cache(__import__("os").environ["BENCH_CACHE"])
from jaxrescore.data.names_models import names_draft, names_target
target, draft = names_target(), names_draft()
index = jaxrescore.SeekIndex(draft, progress=False)
n0 = len(compiles)
t = time.perf_counter()
r = jaxrescore.RescoredIndex(index, target, rerank_window=32).top_k(25, prove=True)
print(json.dumps({"seconds": time.perf_counter() - t, "compiles": len(compiles) - n0, "proven": r.proven}))
"""


def _python(code: str, env: dict) -> tuple[float, str]:
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    if proc.returncode:
        raise RuntimeError(proc.stderr[-2000:])
    return time.perf_counter() - t, proc.stdout


def _cli(args: list, env: dict) -> float:
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "jaxrescore", *args], capture_output=True, text=True, env=env, timeout=600)
    if proc.returncode:
        raise RuntimeError(proc.stderr[-2000:])
    return time.perf_counter() - t


def run(quick: bool = False, out_dir=None) -> str:
    repeats = 1 if quick else 3
    base = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
    base.update(JAX_PLATFORMS="cpu")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(base, XDG_CACHE_HOME=os.path.join(tmp, "none"))
        imports = [_python("import jaxrescore", env)[0] for _ in range(repeats)]
        rows.append(["`python -c 'import jaxrescore'`", f"{statistics.median(imports):.2f} s", ""])
        helps = [_cli(["--help"], env) for _ in range(repeats)]
        rows.append(["`jaxrescore --help`", f"{statistics.median(helps):.2f} s", ""])
        for label, cache in (("no cache", ""), ("warm cache", os.path.join(tmp, "cache"))):
            e = dict(env, BENCH_CACHE=cache)
            if cache:
                _python(FIRST_QUERY, e)  # fills the cache
            outs = [json.loads(_python(FIRST_QUERY, e)[1].strip().splitlines()[-1]) for _ in range(repeats)]
            secs = statistics.median(o["seconds"] for o in outs)
            rows.append([f"first proven `top_k(25)` in a process ({label})", f"{secs:.2f} s",
                         f"{outs[0]['compiles']} XLA compiles"])
        if not quick:
            demo_env = dict(base, XDG_CACHE_HOME=os.path.join(tmp, "demo"))
            rows.append(["`jaxrescore demo --json`, empty cache", f"{_cli(['demo', '--json'], demo_env):.1f} s", ""])
            warm = [_cli(["demo", "--json"], demo_env) for _ in range(repeats)]
            rows.append(["`jaxrescore demo --json`, warm cache", f"{statistics.median(warm):.1f} s", ""])
    text = f"""
Fresh subprocesses, median of {repeats}; compiles counted with `jax_log_compiles`. The first query
builds the draft index first (not timed) and then runs the proven search; "warm cache" is a
process that called `jaxrescore.enable_compilation_cache()` on a cache an earlier process
filled (the `jaxrescore` command always does).

{table(["what", "wall time", "notes"], rows, "lrl")}
"""
    return section("Cold start", COMMAND, text)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    print(run(ap.parse_args().quick))


if __name__ == "__main__":
    main()
