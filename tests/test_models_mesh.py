"""Data parallelism: forwards sharded over a 4-device CPU mesh match the single-device result.

Runs in a subprocess because the host device count is fixed when JAX starts.
"""

import os
import subprocess
import sys
import textwrap

import jax

SCRIPT = textwrap.dedent(
    """
    import jax
    import numpy as np
    from jax.sharding import Mesh

    from jaxrescore.models.apply_fn import from_apply_fn
    from jaxrescore.models.int8 import quantize_int8
    from jaxrescore.models.ngram import NGramLM
    from jaxrescore.models.transformer import TransformerConfig, TransformerLM

    assert len(jax.devices()) == 4, jax.devices()
    mesh = Mesh(np.array(jax.devices()), ("data",))
    rng = np.random.default_rng(0)
    seqs = [tuple(int(t) for t in rng.integers(1, 5, size=rng.integers(0, 7))) + (0,)
            for _ in range(70)]
    cfg = TransformerConfig(vocab_size=5, d_model=32, n_layers=1, n_heads=2, max_len=8, eos=0)
    tf = TransformerLM(cfg, seed=0)
    models = {
        "transformer": (tf, TransformerLM(cfg, seed=0, mesh=mesh)),
        "int8": (quantize_int8(tf), quantize_int8(tf).with_mesh(mesh)),
        "ngram": (NGramLM.fit(seqs, order=3, vocab_size=5, eos=0, max_len=8),
                  NGramLM.fit(seqs, order=3, vocab_size=5, eos=0, max_len=8, mesh=mesh)),
        "apply_fn": (from_apply_fn(tf.apply, tf.params, vocab_size=5, bos_id=5, max_len=8, eos=0),
                     from_apply_fn(tf.apply, tf.params, vocab_size=5, bos_id=5, max_len=8, eos=0,
                                   mesh=mesh)),
    }
    prefixes = np.array([list(s[:3]) + [0] * (3 - len(s[:3])) for s in seqs], np.int32)
    lengths = np.array([min(len(s) - 1, 3) for s in seqs], np.int32)
    for name, (single, sharded) in models.items():
        sharded.chunk_rows = 32  # several chunks, each split over the 4 devices
        np.testing.assert_allclose(sharded.score_sequences(seqs), single.score_sequences(seqs),
                                   atol=1e-5, err_msg=name)
        np.testing.assert_allclose(sharded.next_logprobs(prefixes, lengths),
                                   single.next_logprobs(prefixes, lengths), atol=1e-5,
                                   err_msg=name)
    # the sharded forward really runs on all four devices
    params = models["transformer"][1]._device_params()
    assert len(jax.tree.leaves(params)[0].sharding.device_set) == 4
    print("MESH OK")
    """
)


def test_mesh_matches_single_device():
    env = dict(os.environ)
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4").strip()
    env["JAX_PLATFORMS"] = "cpu"
    # share the suite's persistent compile cache (conftest.py) with the subprocess
    env["JAX_COMPILATION_CACHE_DIR"] = jax.config.jax_compilation_cache_dir
    env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "MESH OK" in out.stdout
