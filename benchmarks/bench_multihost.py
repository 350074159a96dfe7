"""Several processes, one mesh: the 8-prompt proof on 1 process against 2 processes.

JAX's multi-controller runtime on one machine: ``processes`` Python processes on localhost, each
calling ``jax.distributed.initialize`` with gloo CPU collectives and ``devices`` forced CPU devices,
form one global mesh. Every process runs the same program (:func:`workload`): it fits the draft,
builds the draft indexes, places the target on the global mesh with its weights split, and runs a
proven ``top_k``, a proven ``jaxrescore.top_k`` over 8 prompts (``rescore_many``: one target call
per round for all of them) and a proven ``sweep``; each writes every answer and its timings as
JSON. :func:`launch` starts the processes (tests/test_multihost.py uses it to check that the
processes agree bit for bit, and with the single process's answers up to float noise).

    python3 benchmarks/bench_multihost.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

from common import section, table

COMMAND = "python3 benchmarks/run.py --only multihost"

# The 8 prompts of the many-prompt proof on the names models (which read text), and its k.
PROMPTS = ["a", "b", "ch", "da", "el", "jo", "ma", "ro"]
K = 25
# k of the tiny random workload (quick runs, tests/test_multihost.py).
TINY_K = 4


def free_port() -> int:
    """A TCP port nothing on localhost listens on now (for the coordinator)."""
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def launch(processes: int, devices: int, model: str, timeout: float = 300, runs: int = 2) -> list[dict]:
    """Run :func:`workload` on ``processes`` local processes with ``devices`` CPU devices each
    (one process: no ``jax.distributed``); every process's JSON answer, in process order.

    Args:
      processes, devices: the global mesh has ``processes * devices`` devices.
      model: ``"tiny"`` (a random 1-layer TransformerLM target and a bigram draft: seconds) or
        ``"names"`` (the shipped names models of ``jaxrescore demo``).
      runs: how many times the 8-prompt proof runs (2: a first and an "again" time; a test that
        only compares answers needs 1).
    """
    port = free_port()
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={devices}").strip()
    with tempfile.TemporaryDirectory() as tmp:
        outs = [os.path.join(tmp, f"{i}.json") for i in range(processes)]
        procs = [
            subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--worker", str(i), str(processes), str(port), model, out,
                 str(runs)],
                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            )
            for i, out in enumerate(outs)
        ]
        logs = []
        try:
            for p in procs:
                logs.append(p.communicate(timeout=timeout)[0])
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        for i, (p, log) in enumerate(zip(procs, logs)):
            if p.returncode:
                raise RuntimeError(f"process {i} of {processes} failed ({p.returncode}):\n{log[-3000:]}")
        answers = []
        for out in outs:
            with open(out) as f:
                answers.append(json.load(f))
        return answers


def _models(model: str):
    """``(target, draft, prompts, k)`` of a workload."""
    import numpy as np

    if model == "names":
        from jaxrescore.data.names_models import names_draft, names_target

        return names_target(), names_draft(), PROMPTS, K
    from jaxrescore.models import NGramLM, TransformerConfig, TransformerLM

    rng = np.random.default_rng(0)
    seqs = [tuple(int(t) for t in rng.integers(1, 6, size=rng.integers(0, 6))) + (0,) for _ in range(80)]
    target = TransformerLM(TransformerConfig(vocab_size=6, d_model=32, n_layers=1, n_heads=2, max_len=8, eos=0), seed=0)
    draft = NGramLM.fit(seqs, order=2, vocab_size=6, eos=0, max_len=8)
    return target, draft, [[1], [2], [3], [4], [5], [1, 2], [2, 3], [3, 4]], TINY_K


def workload(model: str, runs: int = 2) -> dict:
    """What every process runs (see the module docstring): answers as ``RescoreResult.to_dict``
    and wall times in seconds. With more than one device the target's weights are split: over all
    4 devices of a ``("data",)`` mesh for ``top_k``, over the ``model`` axis of a 2 x 2
    ``("data", "model")`` mesh (the batch over ``data``) for the prompts and the sweep."""
    import jax

    import jaxrescore as jr

    times = {}
    start = time.perf_counter()
    target, draft, prompts, k = _models(model)
    n = len(jax.devices())
    flat = grid = target
    if n > 1:
        flat = target.with_mesh(jax.make_mesh((n,), ("data",)), shard_params=True)
        grid = target.with_mesh(jax.make_mesh((n // 2, 2), ("data", "model")), shard_params=True)
    times["setup"] = time.perf_counter() - start
    split = [_split(t) for t in (flat, grid) if t.mesh is not None]
    start = time.perf_counter()
    index = jr.SeekIndex(draft, progress=False)
    times["index"] = time.perf_counter() - start
    many = None
    for run in ("first", "again")[:runs]:  # the first pays the compiles, the second reuses them
        start = time.perf_counter()
        many = jr.top_k(grid, draft, k, prompt=prompts, index_options={"progress": False})
        times[f"many_{run}"] = time.perf_counter() - start
    top = jr.RescoredIndex(index, flat).top_k(8, prove=True)
    sweep = jr.RescoredIndex(index, grid).sweep([0, 2, 4], [4, 4, 4], prove=True)
    return {
        "devices": n,
        "processes": jax.process_count(),
        "weights_split": split,
        "top_k": top.to_dict(),
        "many": [r.to_dict() for r in many],
        "sweep": [r.to_dict() for r in sweep],
        "seconds": times,
    }


def _split(model) -> bool:
    """Whether ``model``'s placed weights span every device of the mesh and some are split."""
    import jax

    leaves = jax.tree.leaves(model._device_params())
    return all(len(x.sharding.device_set) == model.mesh.devices.size for x in leaves) and any(
        not x.sharding.is_fully_replicated for x in leaves)


def worker(process: int, processes: int, port: int, model: str, out: str, runs: int = 2) -> None:
    """One process of :func:`launch`: join the others (gloo collectives), run, write JSON."""
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if processes > 1:
        jax.distributed.initialize(coordinator_address=f"localhost:{port}", num_processes=processes,
                                   process_id=process)
    answer = workload(model, runs)
    with open(out, "w") as f:
        json.dump(answer, f)


HEADER = ["processes", "devices", "draft index (each process)", "8-prompt proof, first", "again", "rounds", "proven",
          "items as 1 device", "every process the same", "process wall"]


def run(quick: bool = False, out_dir=None) -> str:
    model = "tiny" if quick else "names"
    rows, alone = [], None
    for processes, devices in ((1, 1), (1, 4), (2, 2)):
        start = time.perf_counter()
        answers = launch(processes, devices, model, timeout=900)
        wall = time.perf_counter() - start
        found = [[seq for seq, _ in r["items"]] for r in answers[0]["many"]]
        alone = alone or found
        same = all(a["many"] == answers[0]["many"] for a in answers)
        rounds = max(r["rounds"] for r in answers[0]["many"])
        secs = [max(a["seconds"][key] for a in answers) for key in ("index", "many_first", "many_again")]
        rows.append([processes, processes * devices, f"{secs[0]:.2f} s", f"{secs[1]:.2f} s", f"{secs[2]:.2f} s",
                     rounds, all(r["proven"] for r in answers[0]["many"]), found == alone, same, f"{wall:.0f} s"])
    if model == "names":
        what = f"the names models of `jaxrescore demo`, k = {K}, prompts {', '.join(repr(p) for p in PROMPTS)}"
    else:
        what = f"tiny random models (a --quick run), k = {TINY_K}"
    text = f"""
The 8-prompt proof: `jaxrescore.top_k(target, draft, k, prompt=[8 prompts])` (`rescore_many`: one
target call per round for all prompts, until every prompt is proven), the process's first query,
on {what}.
One process with 1 device (no mesh) and with 4 forced CPU devices, against 2 processes of 2 devices
each joined by `jax.distributed.initialize` (gloo CPU collectives): one 4-device global mesh, the
target's weights split over its `model` axis and the batch over `data`. Times are the slowest
process's; "first" pays the compiles, "again" reruns the whole call (new indexes, warm compiles);
"process wall" is the launch to the last exit (imports, the draft fit, the other queries).

**This machine has 2 cores**: the two processes share them, and 4 forced devices are 4 threads on
those 2 cores, so the 2-process rows measure what the multi-controller runtime costs (gloo
collectives over localhost TCP, every process repeating the host-side search), not a speed-up; on a
pod each process has its own host and accelerators.

{table(HEADER, rows, "rrrrrrlllr")}

Every process builds the draft index itself (host work, the same on each; no broadcast needed) and
runs the same search; only the target's forwards are split over the processes' devices.
"""
    return section("Several processes, one mesh: the 8-prompt proof on 1 process against 2", COMMAND, text)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--worker", nargs=6, metavar=("PROCESS", "PROCESSES", "PORT", "MODEL", "OUT", "RUNS"))
    args = ap.parse_args()
    if args.worker:
        process, processes, port, model, out, runs = args.worker
        worker(int(process), int(processes), int(port), model, out, int(runs))
        return
    print(run(args.quick))


if __name__ == "__main__":
    main()
