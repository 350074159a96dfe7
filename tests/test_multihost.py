"""Several processes, one mesh: two processes on localhost (gloo CPU collectives, 2 forced devices
each, one 4-device global mesh) return, on every process, the answers of one process with 4
devices, bit for bit: a proven top-k over a ``("data",)`` mesh with the target's weights split over
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

    alone = launch(1, 4, "tiny")[0]
    pair = launch(2, 2, "tiny")
    assert alone["processes"] == 1 and alone["devices"] == 4
    assert alone["weights_split"] == [True, True]
    assert all(r["proven"] for r in [alone["top_k"], *alone["many"], *alone["sweep"]])
    assert len(alone["many"]) == 8 and len(alone["top_k"]["items"]) == 8
    assert max(r["rounds"] for r in alone["many"]) > 1  # the search went past its first round
    for process, answer in enumerate(pair):
        assert answer["processes"] == 2 and answer["devices"] == 4
        assert answer["weights_split"] == [True, True], process
        for what in ("top_k", "many", "sweep"):
            # to_dict holds every item, score, proof verdict, bound and reason: equal floats are
            # equal bits
            assert answer[what] == alone[what], (process, what)
