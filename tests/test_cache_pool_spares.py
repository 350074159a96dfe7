"""Host pool memory outlives its session (jaxrescore.models.cache_pool.SpareBuffers): a cleared or
dropped session gives its pools' buffers back, the next session's pools are cut from them, and no
row a session did not write itself is ever read."""

import gc
import subprocess
import sys
import threading

import jax
import numpy as np

from jaxrescore.models import cache_pool, decoding_session
from jaxrescore.models.cache_pool import CachePools, SpareBuffers, pool_key
from jaxrescore.models.transformer import TransformerConfig, TransformerLM

ATOL = 1e-5


def _tiny():
    return TransformerLM(TransformerConfig(vocab_size=6, d_model=32, n_layers=2, n_heads=2, max_len=12, eos=0), seed=3)


def _levels(session, model, paths) -> None:
    """Expand ``paths`` level by level through ``session``, each level against the full forward."""
    n = paths.shape[0]
    for d in range(1, paths.shape[1] + 1):
        lens = np.full(n, d, np.int32)
        np.testing.assert_allclose(session.next_logprobs(paths[:, :d], lens),
                                   model.next_logprobs(paths[:, :d], lens), atol=ATOL)


def _buffers(session) -> list:
    return [b for held in session._pools._pools.values() for b in held[3]]


def test_a_session_reuses_a_dropped_ones_memory_and_reads_none_of_its_rows(monkeypatch):
    spare = SpareBuffers()
    monkeypatch.setattr(cache_pool, "SPARE", spare)
    m = _tiny()
    rng = np.random.default_rng(5)
    first = decoding_session(m)
    assert first._pools.host  # the CPU backend
    _levels(first, m, rng.integers(1, 6, size=(8, 4)).astype(np.int32))
    given = _buffers(first)
    assert given and all(touched > 0 for _, touched in given)
    first.clear()
    assert spare.nbytes == sum(touched for _, touched in given)
    for raw, _ in spare._spare:  # what a later session finds there: NaN in every float
        raw[:] = 0xFF
    second = decoding_session(m)
    _levels(second, m, rng.integers(1, 6, size=(8, 4)).astype(np.int32))
    assert {id(raw) for raw, _ in _buffers(second)} == {id(raw) for raw, _ in given}
    assert spare.nbytes == 0  # every spare in use
    del second
    gc.collect()  # a dropped session gives its memory back too
    assert spare.nbytes == sum(touched for _, touched in given)


def test_a_grown_host_pool_keeps_its_rows_and_gives_the_old_memory_back(monkeypatch):
    spare = SpareBuffers()
    monkeypatch.setattr(cache_pool, "SPARE", spare)
    rng = np.random.default_rng(8)
    cache = (rng.normal(size=(8, 2, 4, 3)).astype(np.float32),)
    more = (rng.normal(size=(16, 2, 4, 3)).astype(np.float32),)
    pools = CachePools(jax.device_put, host=True)
    key = pool_key(cache, 4)
    first = pools.store(key, cache, 8, 8)  # a pool of 8 rows, all held
    old = pools._pools[key][3][0][0]
    second = pools.store(key, more, 16, 8)  # the held rows need more: grown
    assert pools._pools[key][1] >= 24 and spare._spare[0][0] is old
    np.testing.assert_array_equal(pools.take(key, first)[0], cache[0])
    np.testing.assert_array_equal(pools.take(key, second)[0], more[0])


def test_spares_keep_the_most_written_within_their_budget(monkeypatch):
    assert 64 << 20 <= cache_pool.spare_bytes() <= 4 << 30
    monkeypatch.setattr(cache_pool, "spare_bytes", lambda: 1000)
    spare = SpareBuffers()
    bufs = [[np.empty(n, np.uint8), t] for n, t in ((2000, 700), (900, 400), (5000, 300), (300, 0))]
    spare.give(bufs)
    assert spare.nbytes == 1000  # 700 + 300: 400 would pass the budget; never-written memory is not kept
    assert [b[0].size for b in spare._spare] == [2000, 5000]  # smallest first
    got = spare.take(1500)  # the smallest spare that fits (alignment included)
    assert got[0] is bufs[0][0] and got[1] == 700
    fresh = spare.take(10_000)
    assert fresh[1] == 0 and fresh[0].size >= 10_000
    spare.release()
    assert spare.nbytes == 0


def test_a_session_dropped_while_the_spares_are_locked_does_not_deadlock():
    """The garbage collector may drop a session inside the spares' own locked section: giving
    back must not wait for the lock, and the buffers join the spares at the next use."""
    spare = SpareBuffers()
    buf = [np.empty(128, np.uint8), 64]

    def give_while_locked():
        with spare._lock:
            spare.give([buf])

    t = threading.Thread(target=give_while_locked, daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive()
    assert spare.nbytes == 64 and spare.take(32) is buf


EXIT_SCRIPT = r"""
import numpy as np
from jaxrescore.models import decoding_session
from jaxrescore.models.transformer import TransformerConfig, TransformerLM
m = TransformerLM(TransformerConfig(vocab_size=6, d_model=16, n_layers=1, n_heads=2, max_len=6, eos=0), seed=1)
HELD = decoding_session(m)
HELD.next_logprobs(np.ones((2, 2), np.int32), np.array([1, 2], np.int32))
print("held")
"""


def test_a_session_held_until_the_interpreter_exits_gives_nothing_back_and_prints_nothing():
    """Regression: a session alive at exit was dropped after the modules' globals were gone, and
    giving its memory back printed "Exception ignored in CachePools.__del__" on stderr."""
    got = subprocess.run([sys.executable, "-c", EXIT_SCRIPT], capture_output=True, text=True, timeout=300)
    assert got.returncode == 0 and got.stdout.strip() == "held", got.stderr
    assert "Exception ignored" not in got.stderr and "Traceback" not in got.stderr, got.stderr
