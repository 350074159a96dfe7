"""Several processes, one mesh: two processes on localhost (gloo CPU collectives, 2 forced devices
each, one 4-device global mesh) return the same answers bit for bit on every process, and the
answers of one process with 4 devices up to float noise: a proven top-k over a ``("data",)`` mesh with the target's weights split over
all 4 devices, a proven ``jaxrescore.top_k`` over 8 prompts (``rescore_many``) and a proven sweep
over a 2 x 2 ``("data", "model")`` mesh (weights split over ``model``, the batch over ``data``).

The processes run benchmarks/bench_multihost.py's workload (the tiny random models).
"""

import sys
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


@pytest.mark.slow
@pytest.mark.skipif(not gloo_available(), reason="the installed jaxlib has no gloo CPU collectives "
                    f"(jaxlib {jax.__version__}): processes cannot form one CPU mesh")
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
