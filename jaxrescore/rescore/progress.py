"""What a long query is doing, on a terminal: one status line on stderr.

:func:`jaxrescore.quick.top_k` runs its search inside :func:`reporting`; the search calls
:func:`report` before each round's target call ("round 3: scoring 24 new sequences; compiling
(41 XLA programs so far)"); the line is shown again after each compile. Nothing is written unless
stderr is a terminal (``JAXRESCORE_PROGRESS=1`` forces it on, ``0`` off) and the call has run for
a second, so a quick
query and a script writing to a file print nothing; the line is cleared when the call returns.
Compiles are counted with ``jax.monitoring`` (one listener, registered on first use).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import sys
import time

import jax

PROGRESS_ENV = "JAXRESCORE_PROGRESS"
# Seconds a call runs before its status line appears.
QUIET_SECONDS = 1.0

_compiles = 0
_listening = False
_active: contextvars.ContextVar = contextvars.ContextVar("jaxrescore_progress", default=None)


def _count(event: str, duration: float, **kwargs) -> None:
    global _compiles
    if event == "/jax/core/compile/backend_compile_duration":
        _compiles += 1
        status = _active.get()
        if status is not None:  # a compile is a wait of its own: say so as it happens
            status.show(status.text)


def compiles() -> int:
    """XLA programs compiled in this process since :func:`reporting` was first entered."""
    return _compiles


def _enabled() -> bool:
    env = os.environ.get(PROGRESS_ENV)
    if env is not None:
        return env not in ("", "0", "false", "no")
    return bool(getattr(sys.stderr, "isatty", lambda: False)())


class _Status:
    def __init__(self):
        self.started = time.monotonic()
        self.compiled = _compiles
        self.shown = False
        self.text = "starting"

    def show(self, text: str) -> None:
        self.text = text
        if time.monotonic() - self.started < QUIET_SECONDS:
            return
        new = _compiles - self.compiled
        tail = f"; compiling ({new} XLA programs so far)" if new else ""
        sys.stderr.write(f"\r\033[Kjaxrescore: {text}{tail}")
        sys.stderr.flush()
        self.shown = True

    def clear(self) -> None:
        if self.shown:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


@contextlib.contextmanager
def reporting():
    """Show :func:`report`'s lines on stderr while the block runs (when enabled, see the module
    docstring)."""
    global _listening
    if not _enabled():
        yield
        return
    if not _listening:
        jax.monitoring.register_event_duration_secs_listener(_count)
        _listening = True
    status = _Status()
    token = _active.set(status)
    try:
        yield
    finally:
        _active.reset(token)
        status.clear()


def report(text: str) -> None:
    """Say what the current query is doing (a no-op outside :func:`reporting`)."""
    status = _active.get()
    if status is not None:
        status.show(text)
