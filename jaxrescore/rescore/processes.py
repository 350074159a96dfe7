"""Several processes, one query: every process of a multi-process run must ask the same thing.

On JAX's multi-controller runtime (``jax.distributed.initialize``, see docs/multihost.md) every
target forward over a global mesh is a collective: each process must make the same device calls
in the same order, or the others wait inside the runtime until it aborts the job (a process
making one query more than the others hung both for minutes, then ended them with SIGABRT; two
processes asking different ``k`` met only JAX's generic shape check). So each query first checks,
with ONE exchange through the distributed runtime's key-value store, that every process asks it:

- each process writes a short fingerprint of the query's arguments (the entry point, ``k``,
  ``start``, windows, gaps, budgets, the search settings, the prompts, and the models' identity:
  structure, type, weight shapes and dtypes, mesh) under the query's number, and reads every
  other process's for the same number;
- a fingerprint that differs raises ``ValueError`` on every process, naming each argument
  that differs and its value on each process;
- a process that does not write its fingerprint within the timeout (a lost or killed peer, or a
  peer that makes no such query: one process asked one more) raises ``TimeoutError`` on the
  waiting process, naming the peer, the query and the timeout.

The timeout is :data:`TIMEOUT_ENV` (``JAXRESCORE_PROCESS_TIMEOUT``, seconds; default
:data:`DEFAULT_TIMEOUT`), below JAX's default heartbeat timeout (100 s), so a peer lost before a
query gives this error rather than the runtime's abort. Raise it when processes legitimately reach
a query further apart (uneven host work before it). One process (no ``jax.distributed``) checks
nothing and exchanges nothing.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import threading
import time
from typing import Any, Callable

import jax

# The environment variable that sets how long a query waits for the other processes (seconds).
TIMEOUT_ENV = "JAXRESCORE_PROCESS_TIMEOUT"
DEFAULT_TIMEOUT = 60.0
# Key-value store prefix of the fingerprints (one key per process and query number).
KEY_PREFIX = "jaxrescore/query"
# A fingerprint's values longer than this are shown by digest in errors.
SHOWN_CHARS = 80

_numbers = itertools.count()
_lock = threading.Lock()


def process_timeout() -> float:
    """Seconds a query waits for every other process to ask it (:data:`TIMEOUT_ENV`, else
    :data:`DEFAULT_TIMEOUT`); ValueError naming the variable when it is not a positive number."""
    raw = os.environ.get(TIMEOUT_ENV)
    if raw is None or raw.strip() == "":
        return DEFAULT_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{TIMEOUT_ENV}={raw!r}: expected a positive number of seconds")
    return value


def _client():
    """The distributed runtime's client, or None on one process (read first: it starts no
    backend)."""
    from jax._src import distributed  # the key-value store has no public API yet

    client = distributed.global_state.client
    return client if client is not None and jax.process_count() > 1 else None


def model_identity(model: Any) -> dict:
    """What identifies a model across processes without reading its weights (they may be split
    over other processes' devices): type, support, prompt, score tolerance, the shapes and dtypes
    of its weights and its mesh."""
    out = {"type": type(model).__name__}
    for name in ("vocab_size", "eos", "max_len", "score_tolerance"):
        value = getattr(model, name, None)
        if isinstance(value, (int, float, str, type(None))):
            out[name] = value
    prompt = getattr(model, "prompt", None)
    if prompt is not None:
        out["prompt"] = [int(t) for t in prompt]
    base = getattr(model, "base", model)
    params = getattr(base, "params", None)
    if params is not None:
        try:
            leaves = jax.tree.leaves(params)
            out["weights"] = _digest([[list(getattr(x, "shape", ())), str(getattr(x, "dtype", type(x).__name__))]
                                      for x in leaves])
        except Exception:  # a foreign object's params: its identity is its other fields
            pass
    mesh = getattr(base, "mesh", None)
    if mesh is not None:
        out["mesh"] = {str(k): int(v) for k, v in dict(mesh.shape).items()}
    return out


def query_arguments(queries: list, mode: Any) -> dict:
    """The arguments of a call of ``queries`` (:class:`~jaxrescore.rescore.queries.Query`) in
    ``mode`` (:class:`~jaxrescore.rescore.queries.Mode`), by name: one value each for one
    query, a list for a sweep."""
    fields = {"start": [q.start for q in queries], "k": [q.k for q in queries],
              "rerank_window": [q.window for q in queries], "assumed_gap": [q.gap for q in queries]}
    out = {name: values[0] if len(values) == 1 else values for name, values in fields.items()}
    out.update(prove=mode.prove, until_certified=mode.until_certified, max_rounds=mode.budget.max_rounds,
               max_sequences=mode.budget.max_sequences)
    if mode.budget.max_seconds is not None and jax.process_count() > 1:
        raise ValueError(
            "max_seconds cannot bound a query that several processes run together: each would stop "
            "at its own time and wait for the others; use max_rounds / max_sequences"
        )
    return out


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=repr).encode()).hexdigest()[:16]


def _canonical(value: Any) -> Any:
    """``value`` as JSON-ready data (tuples as lists, numpy scalars as numbers)."""
    return json.loads(json.dumps(value, sort_keys=True, default=lambda x: x.item() if hasattr(x, "item") else repr(x)))


def agree(what: str, arguments: Callable[[], dict], timeout: float | None = None) -> None:
    """Check that every process asks the query ``what`` with ``arguments()`` (a dict of named,
    JSON-able values, computed only on several processes; see the module docstring). Nothing on
    one process.

    Raises:
      ValueError: another process asks something else (each differing argument is named).
      TimeoutError: a process did not ask within ``timeout`` seconds (default
        :func:`process_timeout`).
    """
    client = _client()
    if client is None:
        return
    wait = process_timeout() if timeout is None else float(timeout)
    mine = _flat(_canonical({"query": what, **arguments()}))
    me, count = jax.process_index(), jax.process_count()
    with _lock:
        number = next(_numbers)
    client.key_value_set(f"{KEY_PREFIX}/{number}/{me}", json.dumps(mine, sort_keys=True), allow_overwrite=True)
    deadline = time.monotonic() + wait
    theirs = {}
    for other in range(count):
        if other == me:
            continue
        left = max(1, int(1000 * (deadline - time.monotonic())))
        try:
            theirs[other] = json.loads(client.blocking_key_value_get(f"{KEY_PREFIX}/{number}/{other}", left))
        except Exception as err:  # the runtime's DEADLINE_EXCEEDED (or a lost connection)
            raise TimeoutError(
                f"process {me} waited {wait:g} s for process {other} to ask query #{number} ({what}) "
                f"and it did not: every process of a multi-process run must make the same queries in the "
                f"same order, so a process that makes one query more than the others, or a lost peer "
                f"(crashed, killed), stops here. Set {TIMEOUT_ENV} (seconds) higher when the processes "
                f"reach a query further apart ({type(err).__name__}: {str(err).splitlines()[0][:200]})"
            ) from None
    if number:  # every process wrote this number, so each has read the last one: drop mine
        client.key_value_delete(f"{KEY_PREFIX}/{number - 1}/{me}")
    differ = _differences(me, mine, theirs)
    if differ:
        raise ValueError(
            f"the processes of this multi-process run ask different queries (query #{number}): "
            + "; ".join(differ)
            + ". Every process must ask the same queries with the same arguments, in the same order "
            "(see docs/multihost.md)"
        )


def _flat(fingerprint: dict) -> dict:
    """Nested dicts' entries as ``outer.inner`` arguments (``target.prompt``), so an error names
    the one that differs."""
    out = {}
    for name, value in fingerprint.items():
        if isinstance(value, dict):
            out.update({f"{name}.{k}": v for k, v in _flat(value).items()})
        else:
            out[name] = value
    return out


def _differences(me: int, mine: dict, theirs: dict) -> list[str]:
    """Each argument whose value differs between this process and another, in words."""
    out = []
    for name in sorted(set(mine).union(*theirs.values())):
        values = {me: mine.get(name)}
        values.update({p: t.get(name) for p, t in theirs.items()})
        if any(v != values[me] for v in values.values()):
            shown = ", ".join(f"{_shown(v)} on process {p}" for p, v in sorted(values.items()))
            out.append(f"argument {name!r} is {shown}")
    return out


def _shown(value: Any) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= SHOWN_CHARS else f"<{len(text)} characters, digest {_digest(value)}>"
