"""One switch for JAX's persistent compilation cache.

Every new array shape compiles (0.5-1.2 s on CPU for a transformer forward or the rescoring core);
the persistent cache keeps compiled programs on disk, so a new process loads them instead. A
library should not change global JAX configuration behind its user's back, so it is off until
called; the ``jaxrescore`` command turns it on.
"""

from __future__ import annotations

import os


def default_cache_dir() -> str:
    """``$XDG_CACHE_HOME/jaxrescore/jax`` (``~/.cache/jaxrescore/jax`` by default)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "jaxrescore", "jax")


def enable_compilation_cache(path: str | os.PathLike | None = None) -> str | None:
    """Persist compiled XLA programs across processes, including sub-second compiles (JAX skips
    those by default, and on CPU nearly all of ours are).

    Args:
      path: the cache directory (default :func:`default_cache_dir`). A cache directory the user
        already configured in JAX is kept, and returned.

    Returns:
      The directory in use, or None when it could not be created (compiles are then only slower).
    """
    import jax

    if jax.config.jax_compilation_cache_dir:
        return jax.config.jax_compilation_cache_dir
    path = os.fspath(path) if path is not None else default_cache_dir()
    try:
        os.makedirs(path, exist_ok=True)
    except OSError:
        return None
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    return path
