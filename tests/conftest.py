import os

# Tests compile many small functions; caching them across test processes (notebook kernels,
# CLI subprocesses) is only possible with the sub-second threshold lifted.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Compiling dominates the suite's time on CPU (most tests run small models once), and LLVM's
# optimisation passes are most of a compile: the tests check answers, not speed, so the CPU
# backend compiles without them (about 40% less CPU). Set before JAX starts; subprocesses (the
# mesh, multi-process, notebook and CLI tests) inherit it through the environment.
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0").strip()

import jax  # noqa: E402

jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update(
    "jax_compilation_cache_dir",
    os.environ.get("JAXRESCORE_TEST_CACHE", os.path.join(os.path.dirname(__file__), "..", ".jax_cache")),
)


def pytest_terminal_summary(terminalreporter):
    """Show what the reliability battery (tests/test_battery.py) tried: each of its tests records
    a ``battery`` user property, which also crosses from pytest-xdist workers."""
    lines = [
        value
        for reports in terminalreporter.stats.values()
        for report in reports
        for key, value in getattr(report, "user_properties", ())
        if key == "battery" and getattr(report, "when", "") == "teardown"
    ]
    if lines:
        terminalreporter.write_sep("-", "reliability battery")
        for line in sorted(set(lines)):
            terminalreporter.write_line(line)
