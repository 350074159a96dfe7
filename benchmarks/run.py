"""Regenerate every benchmark table and plot, and write BENCHMARKS.md.

    python3 benchmarks/run.py                 # everything (~17 minutes on 2 cores): BENCHMARKS.md
                                              # at the repository root, plots in benchmarks/figures/
    python3 benchmarks/run.py --quick --out DIR   # a smoke run of every section, written to DIR
                                                  # (without --out: a new temporary folder)
    python3 benchmarks/run.py --only latency,proven   # re-measure some sections, replacing them
                                                      # in the existing BENCHMARKS.md

Each section runs in its own fresh process (so one section's compiles or memory never flatter or
burden the next) and returns its markdown; the reference library's rows need the ``bench`` extra
(``python3 -m pip install -e ".[bench]"``) and are skipped, with a note, without it or in
``--quick`` runs.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

# (name, module): the order of BENCHMARKS.md.
SECTIONS = [
    ("proven", "bench_proven"),
    ("wide", "bench_wide"),
    ("proof_compute", "bench_proof_compute"),
    ("many_prompts", "bench_many_prompts"),
    ("latency", "bench_latency"),
    ("throughput", "bench_throughput"),
    ("small_batch", "bench_small_batch"),
    ("kv_cache", "bench_kv_cache"),
    ("long_context", "bench_long_context"),
    ("int8", "bench_int8"),
    ("seek_index", "bench_seek_index"),
    ("seek_memory", "bench_seek_memory"),
    ("large_vocab", "bench_large_vocab"),
    ("envelope", "bench_envelope"),
    ("certificate", "bench_certificate"),
    ("cold", "bench_cold"),
    ("multihost", "bench_multihost"),
    ("pretrained", "bench_pretrained"),
    ("real_lm", "bench_real_lm"),
    ("constraints", "bench_constraints"),
]

HEADER = """# Benchmarks

Every figure here was measured side by side in one run of `{command}` ({when}, {seconds:.0f} s in
all) on this machine: {machine}. Each section ran in a fresh process and names the command that
re-measures it alone. Timings live here, never in tests. The reference library's rows need the
`bench` extra: `python3 -m pip install -e ".[bench]"`.

"""


def available(module: str) -> bool:
    return os.path.exists(os.path.join(HERE, module + ".py"))


def worker(module: str, quick: bool, fig_dir: str, out_file: str) -> None:
    """Run one section in this process and write its markdown to ``out_file``."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    mod = importlib.import_module(module)
    text = mod.run(quick=quick, out_dir=fig_dir)
    with open(out_file, "w") as f:
        f.write(text)


def run_section(module: str, quick: bool, fig_dir: str, timeout: float) -> str:
    with tempfile.NamedTemporaryFile("r", suffix=".md", delete=False) as tmp:
        path = tmp.name
    try:
        args = [sys.executable, os.path.abspath(__file__), "--worker", module, "--figures", fig_dir, "--section-out", path]
        proc = subprocess.run(args + (["--quick"] if quick else []), capture_output=True, text=True, timeout=timeout,
                              env=dict(os.environ, JAX_PLATFORMS="cpu"))
        if proc.returncode:
            raise RuntimeError(f"section {module} failed:\n{proc.stderr[-3000:]}")
        with open(path) as f:
            return f.read()
    finally:
        os.unlink(path)


def _split(markdown: str) -> dict:
    """Sections of a BENCHMARKS.md by their ``## `` heading (text before the first: key '')."""
    parts = re.split(r"(?m)^(?=## )", markdown)
    out = {}
    for part in parts:
        heading = part.splitlines()[0] if part.startswith("## ") else ""
        out[heading] = part
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run: small sizes, no reference rows; written to --out, else to a new "
                         "temporary folder (never over the repository's figures)")
    ap.add_argument("--out", default=None,
                    help="folder for BENCHMARKS.md and the plots (default: the repository; with --quick a "
                         "new temporary folder)")
    ap.add_argument("--only", default="", help="comma-separated sections: " + ", ".join(n for n, _ in SECTIONS))
    ap.add_argument("--timeout", type=float, default=1800, help="seconds allowed to one section")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--figures", help=argparse.SUPPRESS)
    ap.add_argument("--section-out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.worker, args.quick, args.figures, args.section_out)
        return 0
    names = dict(SECTIONS)
    only = [n for n in args.only.split(",") if n]
    unknown = [n for n in only if n not in names]
    if unknown:
        ap.error(f"--only: unknown sections {unknown}; choose from {list(names)}")
    if args.quick and not args.out:  # smoke-run figures must never replace the committed ones
        args.out = tempfile.mkdtemp(prefix="jaxrescore-bench-quick-")
        print(f"--quick without --out: writing to {args.out}", file=sys.stderr)
    out_dir = os.path.abspath(args.out) if args.out else ROOT
    fig_dir = os.path.join(out_dir, "figures") if args.out else os.path.join(HERE, "figures")
    os.makedirs(fig_dir, exist_ok=True)
    md_path = os.path.join(out_dir, "BENCHMARKS.md")
    chosen = [(n, m) for n, m in SECTIONS if (not only or n in only) and available(m)]
    start = time.perf_counter()
    texts = []
    for name, module in chosen:
        t = time.perf_counter()
        text = run_section(module, args.quick, fig_dir, args.timeout)
        # Plots are linked relative to BENCHMARKS.md.
        texts.append(text.replace(fig_dir, os.path.relpath(fig_dir, out_dir)))
        print(f"{name}: {time.perf_counter() - t:.0f} s", file=sys.stderr)
    seconds = time.perf_counter() - start
    from common import machine

    command = "python3 benchmarks/run.py" + (" --quick" if args.quick else "") + (f" --only {args.only}" if only else "")
    header = HEADER.format(command=command, when=datetime.date.today().isoformat(), seconds=seconds, machine=machine())
    if only and os.path.exists(md_path):
        old = _split(open(md_path).read())
        for text in texts:
            old[text.splitlines()[0]] = text + "\n"
        body = "".join(v for k, v in old.items() if k)
        header = old.get("", header).rstrip() + f"\n\nSections re-measured on {datetime.date.today()}: {args.only}.\n\n"
    else:
        body = "\n".join(texts)
    tmp = md_path + ".tmp"
    with open(tmp, "w") as f:
        f.write(header + body)
    os.replace(tmp, md_path)
    print(f"wrote {md_path} in {seconds:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
