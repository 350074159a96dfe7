"""What one query asks, checked: the slice, the window, the gap, the flags and the budgets.

Every entry point (``top_k``, ``slice``, ``sweep``, ``rescore_many``, ``jaxrescore.top_k``) takes
the same keywords and checks them here, with the one validator family of :mod:`jaxrescore._checks`.
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

from jaxrescore._checks import check_bool, check_float, check_int

DEFAULT_MAX_ROUNDS = 32
# A search's default budget of target sequences grows with the answer: 65,536, or 1,024 per item
# asked (start + k), whichever is larger, so a larger k is never held to a small k's budget.
DEFAULT_MAX_SEQUENCES = 1 << 16
SEQUENCES_PER_ITEM = 1024


# The rerank window a query that does not prove pulls when none is given.
DEFAULT_RERANK_WINDOW = 64


class Query(NamedTuple):
    """One slice ``[start, start + k)`` over a pulled head of ``start + k + window`` draft
    candidates (``window`` None: :data:`DEFAULT_RERANK_WINDOW`, or none for a proving query),
    certified under ``gap`` (None: certification not asked)."""

    start: int
    k: int
    window: int | None
    gap: float | None

    @property
    def extent(self) -> int:
        return self.start + self.k + (DEFAULT_RERANK_WINDOW if self.window is None else self.window)


def require_gap(value: Any, name: str = "assumed_gap") -> float | None:
    """None, or a finite number of nats >= 0."""
    return check_float(value, name, minimum=0.0, allow_none=True, unit="nats")


def make_query(start: Any, k: Any, window: Any, gap: Any) -> Query:
    """A :class:`Query` of checked arguments (ValueError naming the one that is not)."""
    return Query(
        check_int(start, "start", minimum=0),
        check_int(k, "k", minimum=1),
        check_int(window, "rerank_window", minimum=0, allow_none=True),
        require_gap(gap),
    )


def make_queries(starts: Any, ks: Any, windows: Any, gaps: Any, window: int, gap: float | None) -> list[Query]:
    """The queries of a sweep: ``starts[q]``, ``ks[q]`` with ``windows[q]`` and ``gaps[q]``
    (default ``window`` and ``gap`` for every query), all checked."""
    try:
        starts, ks = list(starts), list(ks)
        windows = [window] * len(starts) if windows is None else list(windows)
        gaps = [gap] * len(starts) if gaps is None else list(gaps)
    except TypeError as err:
        raise ValueError(f"sweep needs sequences of starts and ks (and windows, gaps): {err}") from None
    if not starts or not len(starts) == len(ks) == len(windows) == len(gaps):
        raise ValueError(
            "sweep needs non-empty starts and ks (and rerank_windows, assumed_gaps when given) of "
            f"one length, got lengths {len(starts)}, {len(ks)}, {len(windows)}, {len(gaps)}"
        )
    return [make_query(*q) for q in zip(starts, ks, windows, gaps)]


class SearchBudget(NamedTuple):
    """Limits of one search, every piece of its work included: scoring rounds (target calls
    that score sequences), target sequences (and fetched next-token rows) in all, which also cap
    the draft index's model rows grown for the search's first pull, and optionally seconds of
    wall time (checked before each round; ``started`` is the ``time.monotonic()`` the query
    began at)."""

    max_rounds: int
    max_sequences: int
    max_seconds: float | None = None
    started: float = 0.0

    def out_of_time(self) -> bool:
        """Whether ``max_seconds`` have passed since the query began."""
        return self.max_seconds is not None and time.monotonic() - self.started >= self.max_seconds


def search_budget(max_rounds: Any, max_sequences: Any, start: int, k: int, max_seconds: Any = None) -> SearchBudget:
    """The budget of one search: ``max_rounds`` >= 1, ``max_sequences`` >= 1 or None (then
    :data:`DEFAULT_MAX_SEQUENCES` or :data:`SEQUENCES_PER_ITEM` per item asked, the larger), and
    ``max_seconds`` > 0 or None (no time limit); the clock starts now."""
    rounds = check_int(max_rounds, "max_rounds", minimum=1)
    seconds = check_float(max_seconds, "max_seconds", minimum=0.0, allow_none=True, unit="seconds")
    if seconds is not None and seconds <= 0:
        raise ValueError(f"max_seconds must be > 0 seconds or None, got {max_seconds!r}")
    if max_sequences is None:
        sequences = max(DEFAULT_MAX_SEQUENCES, SEQUENCES_PER_ITEM * (start + k))
    else:
        sequences = check_int(max_sequences, "max_sequences", minimum=1)
    return SearchBudget(rounds, sequences, seconds, time.monotonic())


class Mode(NamedTuple):
    """How far a query goes beyond its head: ``prove`` (search until proven),
    ``until_certified`` (grow the pull until certified) and the search's budget."""

    prove: bool
    until_certified: bool
    budget: SearchBudget

    def pull_size(self, queries: list[Query]) -> int:
        """Draft candidates the first pull of a call asking ``queries`` lists: the widest
        ``start + k + window``, where a proving call's default window is none. A proof's search
        opens whatever the proof needs, so a window only adds rows to score (names top-25: 752
        target positions with a window of 64, 463 without, on the same day's code)."""
        if self.prove:
            return max(q.start + q.k + (q.window or 0) for q in queries)
        return max(q.extent for q in queries)


def make_mode(prove: Any, until_certified: Any, max_rounds: Any, max_sequences: Any,
              queries: list[Query], max_seconds: Any = None) -> Mode:
    """The checked :class:`Mode` of a call asking ``queries`` (the budget scales with the widest)."""
    prove = check_bool(prove, "prove")
    until_certified = check_bool(until_certified, "until_certified")
    widest = max(q.start + q.k for q in queries)
    budget = search_budget(max_rounds, max_sequences, 0, widest, max_seconds)
    if until_certified and all(q.gap is None for q in queries):
        raise ValueError("until_certified=True needs an assumed_gap (the certificate is gap-based)")
    return Mode(prove, until_certified, budget)
