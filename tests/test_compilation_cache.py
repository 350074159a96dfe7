"""enable_compilation_cache: one documented switch, off until called (run in a fresh process)."""

import os
import subprocess
import sys

CODE = """
import jax, jax.numpy as jnp, jaxrescore
assert not jax.config.jax_compilation_cache_dir, "a library must not switch the cache on by itself"
path = jaxrescore.enable_compilation_cache()
assert path == jax.config.jax_compilation_cache_dir, path
jax.jit(lambda x: x * 2 + 1)(jnp.ones(3)).block_until_ready()
print(path)
"""


def test_enable_compilation_cache_in_a_fresh_process(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
    env.update(JAX_PLATFORMS="cpu", XDG_CACHE_HOME=str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    path = proc.stdout.strip().splitlines()[-1]
    assert path == str(tmp_path / "jaxrescore" / "jax")
    assert os.listdir(path), "nothing was written to the cache"
