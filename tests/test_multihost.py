"""Several processes, one mesh: two processes on localhost (gloo CPU collectives, 2 forced devices
each, one 4-device global mesh) return the same answers bit for bit on every process, and the
answers of one process with 4 devices up to float noise: a proven top-k over a ``("data",)`` mesh with the target's weights split over
all 4 devices, a proven ``jaxrescore.top_k`` over 8 prompts (``rescore_many``) and a proven sweep
over a 2 x 2 ``("data", "model")`` mesh (weights split over ``model``, the batch over ``data``).

The processes run benchmarks/bench_multihost.py's workload (the tiny random models).

Faults (issue 36): processes that ask different queries, or one process asking one more, or a
lost peer, fail fast with a clear error on each process (jaxrescore.rescore.processes) instead of
hanging in the runtime's collectives until it aborts the job.
"""

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import jax
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


def gloo_available() -> bool:
    """Whether the installed jaxlib has gloo CPU collectives (what joins processes on CPU)."""
    try:
        from jax._src.lib import _jax
    except ImportError:
        return False
    return hasattr(_jax, "make_gloo_tcp_collectives")


needs_gloo = pytest.mark.skipif(not gloo_available(), reason="the installed jaxlib has no gloo CPU collectives "
                                f"(jaxlib {jax.__version__}): processes cannot form one CPU mesh")


@pytest.mark.slow
@needs_gloo
def test_two_processes_answer_as_one(monkeypatch):
    from bench_multihost import launch

    # the processes share the suite's persistent compile cache (conftest.py)
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", jax.config.jax_compilation_cache_dir)
    monkeypatch.setenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")

    alone = launch(1, 4, "tiny", runs=1)[0]  # answers only: no second, timing run
    pair = launch(2, 2, "tiny", runs=1)
    assert alone["processes"] == 1 and alone["devices"] == 4
    assert alone["weights_split"] == [True, True]
    assert all(r["proven"] for r in [alone["top_k"], *alone["many"], *alone["sweep"]])
    assert len(alone["many"]) == 8 and len(alone["top_k"]["items"]) == 8
    assert max(r["rounds"] for r in alone["many"]) > 1  # the search went past its first round
    for process, answer in enumerate(pair):
        assert answer["processes"] == 2 and answer["devices"] == 4
        assert answer["weights_split"] == [True, True], process
        for what in ("top_k", "many", "sweep"):
            # to_dict holds every item, score, proof verdict, bound and reason: the processes
            # agree bit for bit (every decision is the same on each), and with one process up to
            # float noise (a search's cached forwards run in other batch compositions there)
            assert answer[what] == pair[0][what], (process, what)
            same_up_to_noise(answer[what], alone[what], (process, what))


def same_up_to_noise(a, b, where, atol=1e-5):
    """``a == b`` with floats equal within ``atol`` (strings, ints, bools and structure exact)."""
    if isinstance(a, float) and isinstance(b, float):
        assert a == b or abs(a - b) <= atol, (where, a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            same_up_to_noise(a[key], b[key], (where, key), atol)
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            same_up_to_noise(x, y, (where, i), atol)
    else:
        assert a == b, (where, a, b)


# One process of a faulty two-process run: a tiny target on a 2-device global mesh (one device per
# process, so every target forward is a collective), an n-gram draft; each query's outcome (items,
# or the error's type and message) goes to a JSON file. Scenario "differ": the processes ask
# different k, then different prompts, then process 0 asks one query more; "lost": process 1 dies
# before the first query.
FAULT_SCRIPT = textwrap.dedent(
    """
    import json, os, sys, time
    import jax
    process, port, scenario, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=f"localhost:{port}", num_processes=2, process_id=process)
    import jaxrescore as jr
    from jaxrescore.models import NGramLM, TransformerConfig, TransformerLM
    cfg = TransformerConfig(vocab_size=4, d_model=16, n_layers=1, n_heads=2, max_len=5, eos=0)
    target = TransformerLM(cfg, seed=0).with_mesh(jax.make_mesh((2,), ("data",)))
    draft = NGramLM.fit([(1, 2, 0), (2, 3, 0), (1, 0), (3, 3, 1, 0)], order=2, vocab_size=4, eos=0, max_len=5)
    index = jr.SeekIndex(draft, progress=False)
    log = {}

    def ask(name, query):
        start = time.perf_counter()
        try:
            log[name] = {"items": [list(s) for s, _ in query().items]}
        except (ValueError, TimeoutError) as err:
            log[name] = {"error": type(err).__name__, "message": str(err)}
        log[name]["seconds"] = time.perf_counter() - start

    if scenario == "lost" and process == 1:
        os._exit(9)  # killed before its first query
    ask("k", lambda: jr.RescoredIndex(index, target, rerank_window=2).top_k(5 + process, prove=True))
    if scenario == "differ":
        p = (1 + process,)
        ask("prompt", lambda: jr.RescoredIndex(jr.SeekIndex(draft.with_prompt(p), progress=False),
                                               target.with_prompt(p), rerank_window=2).top_k(2))
        if process == 0:
            os.environ["JAXRESCORE_PROCESS_TIMEOUT"] = "2"  # nothing to wait for: process 1 is done
            ask("extra", lambda: jr.RescoredIndex(index, target, rerank_window=2).top_k(2, prove=True))
    with open(out, "w") as f:
        json.dump(log, f)
    if scenario == "lost":
        os._exit(0)  # the runtime's shutdown would wait for the lost peer
    """
)


def run_faulty(scenario: str, wait: float, timeout: float = 60) -> tuple[list, list]:
    """Both processes' JSON logs of :data:`FAULT_SCRIPT` (None for a process that wrote none)
    and their output; ``wait``: JAXRESCORE_PROCESS_TIMEOUT, seconds."""
    from bench_multihost import free_port

    port = free_port()
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAXRESCORE_PROCESS_TIMEOUT=str(wait),
               JAX_COMPILATION_CACHE_DIR=jax.config.jax_compilation_cache_dir,
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=1").strip()
    with tempfile.TemporaryDirectory() as tmp:
        outs = [os.path.join(tmp, f"{i}.json") for i in range(2)]
        procs = [subprocess.Popen([sys.executable, "-c", FAULT_SCRIPT, str(i), str(port), scenario, out], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for i, out in enumerate(outs)]
        deadline = time.monotonic() + timeout
        try:
            logs = [p.communicate(timeout=max(1.0, deadline - time.monotonic()))[0] for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        answers = []
        for out, log in zip(outs, logs):
            if os.path.exists(out):
                with open(out) as f:
                    answers.append(json.load(f))
            else:
                answers.append(None)
        return answers, logs


@needs_gloo
def test_processes_that_ask_different_queries_fail_fast_with_the_argument_named():
    """k = 5 against k = 6, then two prompts: every process raises ValueError naming the argument
    (before any collective); then process 0 asks one query more: it raises TimeoutError after
    JAXRESCORE_PROCESS_TIMEOUT (2 s for that query; 30 s before it, which covers the processes'
    uneven start), and both processes exit normally. Before the check the runtime hung both
    processes for minutes, then aborted them."""
    start = time.monotonic()
    answers, logs = run_faulty("differ", wait=30)
    assert all(a is not None for a in answers), logs
    for process, a in enumerate(answers):
        assert a["k"]["error"] == "ValueError", a
        assert "argument 'k' is 5 on process 0, 6 on process 1" in a["k"]["message"]
        assert a["prompt"]["error"] == "ValueError" and "target.prompt' is [1] on process 0, [2] on process 1" in (
            a["prompt"]["message"])
    extra = answers[0]["extra"]
    assert extra["error"] == "TimeoutError" and "process 1" in extra["message"], extra
    assert "JAXRESCORE_PROCESS_TIMEOUT" in extra["message"] and 2 <= extra["seconds"] < 20
    assert "extra" not in answers[1]
    assert time.monotonic() - start < 60


@needs_gloo
def test_a_lost_peer_gives_a_timeout_error_not_an_abort():
    """Process 1 dies before its first query: process 0's query raises TimeoutError naming it
    after JAXRESCORE_PROCESS_TIMEOUT, where the runtime used to abort it (SIGABRT) after its
    heartbeat timeout."""
    answers, logs = run_faulty("lost", wait=3)
    assert answers[1] is None
    assert answers[0] is not None, logs
    lost = answers[0]["k"]
    assert lost["error"] == "TimeoutError" and "process 1" in lost["message"] and 3 <= lost["seconds"] < 20, lost


def test_one_process_exchanges_nothing_and_the_timeout_is_checked(monkeypatch):
    from jaxrescore.rescore import processes

    processes.agree("top_k", lambda: pytest.fail("a single process computed a fingerprint"))
    monkeypatch.setenv(processes.TIMEOUT_ENV, "2.5")
    assert processes.process_timeout() == 2.5
    monkeypatch.delenv(processes.TIMEOUT_ENV)
    assert processes.process_timeout() == processes.DEFAULT_TIMEOUT
    for bad in ("0", "-1", "soon", "nan"):
        monkeypatch.setenv(processes.TIMEOUT_ENV, bad)
        with pytest.raises(ValueError, match=processes.TIMEOUT_ENV):
            processes.process_timeout()
