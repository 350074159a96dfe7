"""Shared helpers of the benchmark scripts: timing, counting proxies, machine facts, the reference
library's availability, and markdown tables.

Every ``benchmarks/bench_*.py`` exposes ``run(quick=False, out_dir=None) -> str``: it measures,
and returns its BENCHMARKS.md section (heading, the command, the setup, the table, what it says).
``benchmarks/run.py`` runs them all and writes the file.
"""

from __future__ import annotations

import gc
import importlib.util
import os
import platform
import statistics
import time


def timed(fn, repeats: int = 3):
    """``(last result, median seconds)`` of ``repeats`` calls after one warm-up call (which pays
    the compiles), each timed by :func:`clock`."""
    fn()
    times, out = [], None
    for _ in range(max(1, repeats)):
        out, seconds = clock(fn)
        times.append(seconds)
    return out, statistics.median(times)


def clock(fn, *args):
    """``(fn(*args), seconds)`` with Python's garbage collector paused during the call, as
    ``timeit`` does, so a collection of garbage left by earlier work never lands in a timed call."""
    gc.disable()
    try:
        t = time.perf_counter()
        out = fn(*args)
        return out, time.perf_counter() - t
    finally:
        gc.enable()


def run_child(code: str, timeout: float, error_chars: int = 160) -> dict:
    """Run ``code`` in a fresh CPU-only Python process (so its peak RSS is its own) and parse the
    JSON object it prints last; ``{"error": ...}`` if it fails or runs past ``timeout`` seconds."""
    import json
    import subprocess
    import sys

    env = dict(os.environ, JAX_PLATFORMS="cpu")
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"over {timeout:.0f} s"}
    if proc.returncode:
        last = (proc.stderr.strip().splitlines() or ["failed"])[-1]
        return {"error": last[:error_chars]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def have_mixle() -> bool:
    """Whether the reference library (the ``bench`` extra, ``mixle==0.8.2``) is installed."""
    return importlib.util.find_spec("mixle") is not None


MIXLE_MISSING = (
    "_Not measured in this run: the reference library is not installed "
    '(`python3 -m pip install -e ".[bench]"`)._'
)


def reference_note(quick: bool) -> str:
    """Why a section has no reference-library columns (empty when it has them)."""
    if have_mixle() and not quick:
        return ""
    return "\n_Reference library rows skipped in a --quick run._\n" if have_mixle() else "\n" + MIXLE_MISSING + "\n"


def machine() -> str:
    """One line: CPU cores, memory, Python, JAX and its backend."""
    import jax

    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
        mem_text = f"{mem:.0f} GiB"
    except (ValueError, OSError, AttributeError):
        mem_text = "unknown memory"
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (
        f"{os.cpu_count()} CPU cores ({platform.machine()}), {mem_text}, load average {load:.1f} at "
        f"start; Python {platform.python_version()}, jax {jax.__version__} on "
        f"{jax.default_backend()} ({jax.devices()[0].device_kind})"
    )


def table(header: list[str], rows: list[list], align: str | None = None) -> str:
    """A markdown table; ``align`` is one character per column, ``l`` or ``r`` (default: first
    left, rest right)."""
    align = align or "l" + "r" * (len(header) - 1)
    sep = ["---:" if a == "r" else "---" for a in align]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(sep) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def section(title: str, command: str, body: str) -> str:
    """A BENCHMARKS.md section: heading, the command that regenerates it, then ``body``."""
    return f"## {title}\n\n```bash\n{command}\n```\n\n{body.strip()}\n"


class Counting:
    """Delegates to a model, counting the rows and token positions its forwards compute: a row of
    n tokens (after the prompt) costs len(prompt) + n + 1 positions (BOS included, no KV cache)."""

    def __init__(self, model):
        self.model = model
        self.vocab_size, self.eos, self.max_len = model.vocab_size, model.eos, model.max_len
        self.score_tolerance = getattr(model, "score_tolerance", None)
        self.extra = len(getattr(model, "prompt", ())) + 1
        self.rows = self.positions = self.calls = 0

    def _count(self, lengths):
        self.calls += 1
        self.rows += len(lengths)
        self.positions += int(sum(int(n) + self.extra for n in lengths))

    def next_logprobs(self, prefixes, lengths):
        self._count(lengths)
        return self.model.next_logprobs(prefixes, lengths)

    def score_frontier(self, seqs, **kw):
        self._count([len(s) for s in seqs])
        return self.model.score_frontier(seqs, **kw)

    def score_sequences(self, seqs, **kw):
        self._count([len(s) for s in seqs])
        return self.model.score_sequences(seqs, **kw)


def standalone(doc: str, run, argv=None) -> int:
    """A section run alone (``python3 benchmarks/bench_x.py [--quick]``): print what ``run``
    returns; the module's docstring's first line is the help."""
    import argparse

    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    print(run(quick=args.quick))
    return 0
