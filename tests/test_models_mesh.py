"""Meshes: forwards, decoding, index builds and training over 4 CPU devices match one device, for a
hand-built Mesh and ``jax.make_mesh`` (explicit axis types), with replicated or split weights.

Runs in a subprocess because the host device count is fixed when JAX starts.
"""

import os
import subprocess
import sys
import textwrap

import jax
import pytest

SCRIPT = textwrap.dedent(
    """
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, PartitionSpec

    from jaxrescore.index.seek import SeekIndex
    from jaxrescore.models import CallableModel, decoding_session, distill, train_lm
    from jaxrescore.models.apply_fn import from_apply_fn
    from jaxrescore.models.int8 import quantize_int8
    from jaxrescore.models.ngram import NGramLM
    from jaxrescore.models.transformer import TransformerConfig, TransformerLM

    assert len(jax.devices()) == 4, jax.devices()
    meshes = {
        "hand-built": Mesh(np.array(jax.devices()), ("data",)),
        "make_mesh": jax.make_mesh((4,), ("data",)),
        "make_mesh 2x2": jax.make_mesh((2, 2), ("data", "model")),
    }
    assert "Explicit" in str(meshes["make_mesh"].axis_types)
    rng = np.random.default_rng(0)
    seqs = [tuple(int(t) for t in rng.integers(1, 5, size=rng.integers(0, 7))) + (0,)
            for _ in range(70)]
    cfg = TransformerConfig(vocab_size=5, d_model=32, n_layers=1, n_heads=2, max_len=8, eos=0)
    tf = TransformerLM(cfg, seed=0)
    ng = NGramLM.fit(seqs, order=3, vocab_size=5, eos=0, max_len=8)
    fn = jax.jit(lambda p, n: tf.next_logprobs(np.asarray(p), np.asarray(n)))
    singles = {
        "transformer": tf,
        "int8": quantize_int8(tf),
        "ngram": ng,
        "apply_fn": from_apply_fn(tf.apply, tf.params, vocab_size=5, bos_id=5, max_len=8, eos=0),
        "prompted": tf.with_prompt([1, 2]),
        "callable": CallableModel(lambda p, n: tf.next_logprobs(np.asarray(p), np.asarray(n)),
                                  vocab_size=5, max_len=8, eos=0, batched=True),
    }
    prefixes = np.array([list(s[:3]) + [0] * (3 - len(s[:3])) for s in seqs], np.int32)
    lengths = np.array([min(len(s) - 1, 3) for s in seqs], np.int32)
    short = [s[:5] for s in seqs if len(s) <= 6]
    # every model on a hand-built mesh with replicated weights; jax.make_mesh's explicit axis
    # types with one JAX model and the table model; the JAX models with split weights on a
    # ("data", "model") grid (tests/test_multihost.py proves over split weights across processes)
    plan = [("hand-built", False, list(singles)), ("make_mesh", False, ["transformer", "ngram"]),
            ("make_mesh 2x2", True, ["transformer", "int8", "prompted"])]
    for mname, shard, names in plan:
        mesh = meshes[mname]
        if True:
            for name in names:
                single = singles[name]
                sharded = single.with_mesh(mesh, shard_params=shard)
                assert sharded.mesh is mesh
                sharded.chunk_rows = 32  # several chunks, each split over the 4 devices
                what = f"{name} on {mname}, shard_params={shard}"
                np.testing.assert_allclose(sharded.next_logprobs(prefixes, lengths),
                                           single.next_logprobs(prefixes, lengths), atol=1e-5,
                                           err_msg=what)
                if name == "callable":
                    continue
                data = short if name == "prompted" else seqs
                np.testing.assert_allclose(sharded.score_sequences(data), single.score_sequences(data),
                                           atol=1e-5, err_msg=what)
                session = decoding_session(sharded)
                if session is not None and name in ("transformer", "prompted"):
                    for d in range(4):
                        np.testing.assert_allclose(
                            session.next_logprobs(prefixes, np.minimum(lengths, d)),
                            single.next_logprobs(prefixes, np.minimum(lengths, d)), atol=1e-5,
                            err_msg=what + " (decoding)")
        # the forward really runs on all four devices; split weights are split
        for split_them in (False, True):
            placed = jax.tree.leaves(tf.with_mesh(mesh, shard_params=split_them)._device_params())
            assert all(len(x.sharding.device_set) == 4 for x in placed)
            split = [x for x in placed if not x.sharding.is_fully_replicated]
            assert bool(split) == split_them, (mname, split_them)
    # a "model" axis holds the split weights (replicated over "data"), "data" the batch
    grid = tf.with_mesh(meshes["make_mesh 2x2"], shard_params=True)
    specs = [x.sharding.spec for x in jax.tree.leaves(grid._device_params())]
    parts = {p[0] if isinstance(p, tuple) and len(p) == 1 else p for spec in specs for p in spec}
    assert parts == {None, "model"}, specs
    assert grid._put(np.zeros((4, 3), np.int32)).sharding.spec == PartitionSpec(("data",))
    # an index over a split model, built under the user's own explicit mesh context
    mesh = meshes["make_mesh"]
    with jax.set_mesh(mesh):
        a = SeekIndex(tf.with_mesh(mesh, shard_params=True), initial_bits=6, progress=False)
    b = SeekIndex(tf, initial_bits=6, progress=False)
    assert [s for s, _ in a.slice(0, len(a))] == [s for s, _ in b.slice(0, len(b))]
    # training on a mesh (split weights) follows the single-device run
    data = [s for s in seqs]
    one = TransformerLM(cfg, seed=0)
    many = TransformerLM(cfg, seed=0).with_mesh(meshes["make_mesh 2x2"], shard_params=True)
    l1 = train_lm(one, data, steps=8, batch_size=18, progress=False)
    l4 = train_lm(many, data, steps=8, batch_size=18, progress=False)
    np.testing.assert_allclose(l4, l1, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(many.score_sequences(data), one.score_sequences(data), atol=1e-4)
    assert not all(x.sharding.is_fully_replicated for x in jax.tree.leaves(many.params))
    k1 = distill(one, ng, data, steps=4, batch_size=16, progress=False)
    k4 = distill(many, ng, data, steps=4, batch_size=16, progress=False)
    np.testing.assert_allclose(k4, k1, rtol=1e-4, atol=1e-5)
    print("MESH OK")
    """
)


@pytest.mark.slow
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


def test_mesh_axes_by_name():
    """The batch is split over every axis but "model"; split weights over "model", or over every
    axis of a mesh without one; a padded call is a multiple of the batch's devices."""
    import numpy as np
    from jax.sharding import Mesh

    from jaxrescore.models.mesh import batch_axes, batch_devices, param_spec, weight_axes

    device = np.array(jax.devices()[:1])
    grid = Mesh(device.reshape(1, 1), ("data", "model"))
    flat = Mesh(device, ("data",))
    assert batch_axes(grid) == ("data",) and weight_axes(grid) == ("model",)
    assert batch_axes(flat) == ("data",) and weight_axes(flat) == ("data",)
    assert batch_axes(Mesh(device, ("model",))) == ()
    assert batch_devices(None) == 1 and batch_devices(grid) == 1
    assert param_spec((6, 32), 4, ("model",)) == jax.sharding.PartitionSpec(None, ("model",))
    assert param_spec((6, 3), 4, ("model",)) == jax.sharding.PartitionSpec()


def test_to_host_reads_local_and_host_values():
    """to_host: numpy in, numpy out (dtype as asked); a process-local device array read as is."""
    import jax.numpy as jnp
    import numpy as np

    from jaxrescore.models.mesh import to_host

    x = np.arange(6, dtype=np.int32).reshape(2, 3)
    np.testing.assert_array_equal(to_host(jnp.asarray(x)), x)
    assert to_host(x, np.float64).dtype == np.float64
    assert to_host([1.5, 2.0]).tolist() == [1.5, 2.0]
