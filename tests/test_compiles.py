"""Few shapes: a fresh process's first proven top-25 compiles a handful of XLA programs and a
second prompt almost none (counted with ``jax.monitoring``'s backend-compile events, in a
process of its own so that no other test's compiles count)."""

import json
import subprocess
import sys

SCRIPT = r"""
import json, jax
count = [0]
def listen(event, duration, **kw):
    if event == "/jax/core/compile/backend_compile_duration":
        count[0] += 1
jax.monitoring.register_event_duration_secs_listener(listen)
import jaxrescore
from jaxrescore.data.names_models import names_draft, names_target
target, draft = names_target(), names_draft()
out = []
for prompt in ("ma", "jo", "el"):
    before = count[0]
    r = jaxrescore.top_k(target, draft, 25, prompt=prompt)
    out.append([count[0] - before, r.proven])
print(json.dumps(out))
"""


def test_a_first_proof_compiles_few_programs_and_a_new_prompt_almost_none():
    got = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=600, check=True)
    (first, p1), (second, p2), (third, p3) = json.loads(got.stdout.strip().splitlines()[-1])
    assert p1 and p2 and p3
    assert first <= 24, first
    assert second <= 4 and third <= 4, (second, third)


def test_a_terminal_hears_about_compiles(monkeypatch, capsys):
    """With progress forced on, a query that compiles says "compiling" on stderr while it runs."""
    import jax
    import numpy as np

    from jaxrescore.rescore import progress

    monkeypatch.setenv(progress.PROGRESS_ENV, "1")
    monkeypatch.setattr(progress, "QUIET_SECONDS", 0.0)
    with progress.reporting():
        progress.report("round 1")
        jax.jit(lambda x: x * 3 + 1)(np.arange(7.0))  # a new program: one compile
    err = capsys.readouterr().err
    assert "compiling (1 XLA programs so far)" in err and "round 1" in err
