"""Several prompts' rows on ONE decoding session over their shared base model.

A prompted model's own :class:`~jaxrescore.models.decoding.DecodingSession` holds the prompt as
its shared context and the continuations' caches per row. Queries of several prompts of one base
proven together (:func:`~jaxrescore.rescore.rescore_many`) instead feed ``prompt + row`` to one
session over the base (empty context): one device call serves every prompt's rows, the prompt's
own positions are computed once (then held like any prefix), and each prompt's numbers are what
its own session gives. :func:`force_after` teacher-forces such rows; :class:`PromptView` is one
prompt's session on the shared one.
"""

from __future__ import annotations

import numpy as np

from jaxrescore.models.decoding import DecodingSession
from jaxrescore.models.scores import drop_leading
from jaxrescore.models.teacher import TeacherForced
from jaxrescore.typing import ArrayLike, Sequences


def force_after(session: DecodingSession, prompts: list, rows: list, known: ArrayLike, top_m: int,
                packed: bool = False) -> TeacherForced | None:
    """The continuations ``rows`` (token tuples), each after its prompt ``prompts[i]``, teacher
    forced from their positions ``known`` on over ``session`` (a session over the prompts' shared
    BASE model, with an empty context): the numbers each prompted model's own session gives
    (left-aligned from ``known``, each score the sum of its own steps). ``packed``: the first
    call, packed as one tree (:meth:`DecodingSession.packed_force`: a full forward's numbers),
    or None where the session declines to pack; else fed over held caches. Afterwards every
    prefix ``prompt + row[:j]`` fed is held, for any prompt's later calls."""
    lead = np.array([len(p) for p in prompts], np.int64)
    whole = [tuple(p) + tuple(r) for p, r in zip(prompts, rows)]
    known = lead + np.asarray(known, np.int64).reshape(len(rows))
    if packed:
        out = session.packed_force(whole, top_m)
        return None if out is None else TeacherForced(drop_leading(out.frontier, known), out.positions)
    out = session.teacher_force(whole, known, top_m)
    return TeacherForced(drop_leading(out.frontier, np.zeros(len(rows), np.int64)), out.positions)


class PromptView:
    """The decoding session of a prompted model ``base.with_prompt(prompt)`` that runs on the
    base model's ``session`` (rows ``prompt + row``, see :func:`force_after`): several prompts'
    queries proven in one call (:mod:`jaxrescore.rescore.many`) hold their caches in one session,
    and each prompt's own calls (fetched rows, grown pulls) extend them too. ``positions`` and
    ``row_positions`` are the shared session's."""

    def __init__(self, session: DecodingSession, prompt: tuple):
        self.session, self.prompt = session, tuple(int(t) for t in prompt)
        self.vocab_size, self.eos = session.vocab_size, session.eos
        self.max_len = session.max_len - len(self.prompt)

    @property
    def positions(self) -> int:
        return self.session.positions

    @property
    def row_positions(self) -> np.ndarray:
        return self.session.row_positions

    def next_logprobs(self, prefixes: ArrayLike, lengths: ArrayLike) -> np.ndarray:
        """As :meth:`DecodingSession.next_logprobs` of the prompted model."""
        toks = np.asarray(prefixes, np.int32)
        n = len(self.prompt)
        whole = np.zeros((toks.shape[0], n + toks.shape[1]), np.int32)
        whole[:, :n], whole[:, n:] = self.prompt, toks
        return self.session.next_logprobs(whole, np.asarray(lengths, np.int32) + n)

    def teacher_force(self, rows: Sequences, known: ArrayLike, top_m: int) -> TeacherForced:
        """As :meth:`DecodingSession.teacher_force` of the prompted model."""
        rows = [tuple(r) for r in rows]
        return force_after(self.session, [self.prompt] * len(rows), rows, known, top_m)

    def packed_force(self, rows: Sequences, top_m: int) -> TeacherForced | None:
        """As :meth:`DecodingSession.packed_force` of the prompted model (None: feed them)."""
        rows = [tuple(r) for r in rows]
        return force_after(self.session, [self.prompt] * len(rows), rows, np.zeros(len(rows)), top_m, True)
