"""Several searches' draft calls in lockstep: ONE model call per step for all of them.

A search that asks a model for next-token rows step by step (the draft's best-first seed,
:mod:`jaxrescore.rescore.seed`; speculation, :mod:`jaxrescore.rescore.speculate`; a proving
round, :func:`~jaxrescore.rescore.search.round_steps`; the exact best-first baseline,
:func:`~jaxrescore.baselines.best_first.best_first_steps`) is written as a generator of its calls:
it yields ``(prefixes int32[B, T], lengths int32[B])`` and is sent the model's rows
``float[B, V]`` back; what it returns is its result. :func:`run` drives one over a model.
:func:`run_jointly` drives many at once: each step, every search still running has asked for its
rows, and ONE call of a :class:`JointRows` answers them all.

Measured on the real-text workload (32 prompts, k = 10, the student draft): a loop of single
proofs makes ~2,800 draft calls of ~32 rows, each a few milliseconds of dispatch and cache copies
for a fraction of a millisecond of arithmetic; in lockstep, a call per step serves every prompt.
The draft's numbers only order the search (the target scores everything the proof reads), so a
search's result does not depend on whether it ran alone or in lockstep beyond the float noise of
another batch shape.
"""

from __future__ import annotations

from typing import Any, Callable, Generator, TypeVar

import numpy as np

from jaxrescore.models.cache_sizes import shared_cache_bytes
from jaxrescore.models.decoding import incremental
from jaxrescore.models.prompt import PromptedModel

T = TypeVar("T")
# A search's calls: yields (prefixes int32[B, T], lengths int32[B]), is sent float[B, V] rows.
Steps = Generator[tuple, Any, T]


def run(steps: Steps, next_logprobs: Callable) -> T:
    """The result of ``steps`` with every request answered by ``next_logprobs(prefixes, lengths)``."""
    try:
        request = next(steps)
        while True:
            request = steps.send(next_logprobs(*request))
    except StopIteration as done:
        return done.value


def run_jointly(steps: list, rows: "JointRows") -> list:
    """The results of every search in ``steps`` (generators, see the module docstring), each
    step's requests answered together by ONE ``rows(owners, requests)`` call."""
    out: list = [None] * len(steps)
    pending: dict = {}

    def advance(i: int, answer) -> None:
        try:
            pending[i] = next(steps[i]) if answer is None else steps[i].send(answer)
        except StopIteration as done:
            out[i] = done.value

    for i in range(len(steps)):
        advance(i, None)
    while pending:
        owners = list(pending)
        answers = rows(owners, [pending.pop(i) for i in owners])
        for i, answer in zip(owners, answers):
            advance(i, answer)
    return out


class JointRows:
    """Next-token rows of several models in ONE call per step: the models of several prompts of
    one base (``base.with_prompt(p)``, each as :class:`~jaxrescore.models.prompt.PromptedModel`)
    run ``prompt + prefix`` rows on one incremental session over the base (made at the first
    call; its caches held for every prompt, each prompt's positions computed once and then held
    like any prefix). Models that share no base are called one by one, each through
    ``sessions[i]()`` (its own incremental session).

    Args:
      models: each search's model (what its rows must equal).
      sessions: per model, a function giving the session its rows come from when called alone.
    """

    def __init__(self, models: list, sessions: list[Callable]):
        self._sessions = sessions
        bases = [m.base if type(m) is PromptedModel else None for m in models]
        shared = bases[0] is not None and all(b is bases[0] for b in bases)
        self._base = bases[0] if shared and len(models) > 1 else None
        self._prompts = [np.asarray(m.prompt, np.int32) for m in models] if self._base is not None else None
        self._session = None

    def __call__(self, owners: list[int], requests: list[tuple]) -> list[np.ndarray]:
        """Per owner, the rows of its request ``(prefixes int32[B, T], lengths int32[B])``."""
        if self._base is None:
            return [self._sessions[i]().next_logprobs(toks, lens) for i, (toks, lens) in zip(owners, requests)]
        if self._session is None:
            self._session = incremental(self._base, max_bytes=shared_cache_bytes(len(self._prompts)))
        prompts = [self._prompts[i] for i in owners]
        toks = [np.asarray(t, np.int32) for t, _ in requests]
        lens = [np.asarray(n, np.int32).reshape(-1) for _, n in requests]
        width = max(p.size + t.shape[1] for p, t in zip(prompts, toks))
        whole = np.zeros((sum(t.shape[0] for t in toks), width), np.int32)
        lo = 0
        for p, t in zip(prompts, toks):
            hi = lo + t.shape[0]
            whole[lo:hi, : p.size] = p
            whole[lo:hi, p.size : p.size + t.shape[1]] = t
            lo = hi
        out = np.asarray(self._session.next_logprobs(whole, np.concatenate([n + p.size for n, p in zip(lens, prompts)])))
        return np.split(out, np.cumsum([t.shape[0] for t in toks])[:-1])
