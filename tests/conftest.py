import os

# Tests compile many small functions; caching them across test processes (notebook kernels,
# CLI subprocesses) is only possible with the sub-second threshold lifted.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update(
    "jax_compilation_cache_dir",
    os.environ.get("JAXRESCORE_TEST_CACHE", os.path.join(os.path.dirname(__file__), "..", ".jax_cache")),
)
