"""Duck-typed models: the checks a model not built by this library passes where it enters.

Anything with ``vocab_size``, ``eos``, ``max_len`` and ``next_logprobs(prefixes, lengths)`` can
drive a draft index, a completion in the speculative search, a sampler or a gap estimate. Our own
models construct (or, for :class:`~jaxrescore.models.callable.CallableModel`, validate) their
rows themselves; a foreign object's rows are checked on the way in, because a wrong row is silent
otherwise: probabilities instead of log-probs, ``+inf``, NaN or an extra column would be summed
into draft scores and bounds.

What is refused, with a ValueError naming the argument:

- attributes: ``vocab_size``/``max_len`` not integers >= 1 (bools and floats such as ``2.7``
  included), ``eos`` not None or an integer in ``[0, vocab_size)``;
- rows: a shape other than ``[B, vocab_size]``, a non-float dtype, NaN, an entry above
  ``SIGN_TOL`` (probabilities, ``+inf``), or a row whose ``logsumexp`` is more than ``NORM_TOL``
  from 0 (the rules of :mod:`jaxrescore.models.callable`);
- scores (``score_sequences``): a non-float dtype, a shape other than ``[N]``, NaN or an entry
  above ``SIGN_TOL``.

The row check is three vectorised passes over the ``[B, V]`` block (max, exp, a row-sum matvec),
small next to any forward that produced it. Float noise up to ``SIGN_TOL`` above 0 is clipped to 0,
the convention of every model.
"""

from __future__ import annotations

import numpy as np

from jaxrescore.models.base import check_support
from jaxrescore.models.checks import is_float_dtype
from jaxrescore.models.callable import SIGN_TOL, _check_rows
from jaxrescore.models.mesh import to_host
from jaxrescore.sequences import checked_batch


def own_rows(model, method: str = "next_logprobs") -> bool:
    """Whether ``model``'s ``method`` (``next_logprobs``, or another row method such as
    ``next_logprobs_above``) is this package's own (so its rows need no check): its class's method
    is defined in :mod:`jaxrescore.models`, and for a prompted model its base's is too. A subclass
    that overrides it is a foreign model. A model that checks its base's rows itself before
    reading them (:class:`~jaxrescore.constraints.ConstrainedModel`, whose rows are masked and so
    no longer sum to 1) answers for its own."""
    fn = getattr(type(model), method, None)
    if getattr(fn, "checks_base_rows", False):
        return True
    if not getattr(fn, "__module__", "").startswith("jaxrescore.models."):
        return False
    base = getattr(model, "base", None)
    return base is None or own_rows(base, method)


def check_protocol(model, what: str = "model") -> tuple[int, int | None, int]:
    """``(vocab_size, eos, max_len)`` of a model, checked (see the module docstring); TypeError
    when an attribute or ``next_logprobs`` is missing."""
    for attr in ("vocab_size", "eos", "max_len", "next_logprobs"):
        if not hasattr(model, attr):
            raise TypeError(
                f"{what} must implement AutoregressiveEnumerable (vocab_size, eos, max_len, "
                f"next_logprobs(prefixes, lengths)); {type(model).__name__} has no {attr!r}"
            )
    if not callable(model.next_logprobs):
        raise TypeError(f"{what}.next_logprobs must be callable, got {type(model.next_logprobs).__name__}")
    return check_support(model.vocab_size, model.eos, model.max_len, what)


def check_rows(rows, prefixes: np.ndarray, lengths: np.ndarray, vocab_size: int, what: str = "model") -> np.ndarray:
    """A duck model's answer to ``next_logprobs(prefixes, lengths)`` as validated float32 rows
    ``[B, vocab_size]``, clipped to <= 0 (see the module docstring).

    Args:
      rows: what the model returned.
      prefixes: int32[B, T] and ``lengths`` int32[B]: what it was asked (named in errors).
      vocab_size: V, the width every row must have.
    """
    arr = to_host(rows)
    want = (prefixes.shape[0], int(vocab_size))
    if arr.shape != want:
        raise ValueError(
            f"{what}.next_logprobs returned shape {arr.shape} for {want[0]} prefixes; expected "
            f"[B, vocab_size] = {want} (one log-prob per token id)"
        )
    if not is_float_dtype(arr.dtype):  # bfloat16 rows are float rows too
        raise ValueError(f"{what}.next_logprobs returned dtype {arr.dtype}; expected float log-probs")
    arr = arr.astype(np.float32, copy=False)
    try:
        _check_rows(arr, lambda b: tuple(int(t) for t in prefixes[b, : lengths[b]]))
    except ValueError as err:
        raise ValueError(f"{what}.next_logprobs: {err} (expected log-probs, not probabilities)") from None
    return np.minimum(arr, np.float32(0.0))


def model_rows(model, prefixes, lengths, what: str = "model") -> np.ndarray:
    """``model.next_logprobs(prefixes, lengths)``, checked when the model is not one of ours: the
    one call where a duck-typed model's rows enter the library. Returns float32[B, V]."""
    rows = model.next_logprobs(prefixes, lengths)
    if own_rows(model):
        return to_host(rows)
    batch = checked_batch(prefixes, lengths, what="prefixes")
    return check_rows(rows, batch.tokens, batch.lengths, model.vocab_size, what)


def check_scores(scores, n: int, what: str = "model") -> np.ndarray:
    """A duck model's ``score_sequences`` answer for ``n`` sequences as float64[n], clipped to <= 0
    (float noise up to ``SIGN_TOL``); ValueError for anything else."""
    arr = to_host(scores)
    if not is_float_dtype(arr.dtype):
        raise ValueError(f"{what}.score_sequences returned dtype {arr.dtype}; expected float log-probs")
    if arr.shape != (n,):
        raise ValueError(f"{what}.score_sequences returned shape {arr.shape} for {n} sequences; expected ({n},)")
    bad = np.flatnonzero(~(arr <= SIGN_TOL) & ~np.isneginf(arr))
    if bad.size:
        raise ValueError(
            f"{what}.score_sequences returned {float(arr[bad[0]])!r} for sequence {int(bad[0])}; a log-prob "
            "must be a number <= 0 or -inf"
        )
    return np.minimum(arr.astype(np.float64), 0.0)


class CheckedModel:
    """A duck-typed model whose every ``next_logprobs`` block and ``score_sequences`` answer is
    checked (see the module docstring); everything else is the wrapped model's.

    Attributes:
      model: the wrapped model.
      what: how errors name it (e.g. ``"draft_model"``).
    """

    def __init__(self, model, what: str = "model"):
        check_protocol(model, what)
        self.model = model
        self.what = what

    def __repr__(self) -> str:
        return f"CheckedModel({self.model!r})"

    @property
    def vocab_size(self) -> int:
        return check_support(self.model.vocab_size, self.model.eos, self.model.max_len, self.what)[0]

    @property
    def eos(self) -> int | None:
        return check_support(self.model.vocab_size, self.model.eos, self.model.max_len, self.what)[1]

    @property
    def max_len(self) -> int:
        return check_support(self.model.vocab_size, self.model.eos, self.model.max_len, self.what)[2]

    def next_logprobs(self, prefixes, lengths) -> np.ndarray:
        """``float32[B, V]`` checked rows of the wrapped model (see :func:`model_rows`)."""
        return model_rows(self.model, prefixes, lengths, self.what)

    def score_sequences(self, seqs, **kwargs) -> np.ndarray:
        """``float64[N]`` checked scores of the wrapped model's ``score_sequences``."""
        n = len(seqs) if not hasattr(seqs, "lengths") else int(np.shape(seqs.lengths)[0])
        return check_scores(self.model.score_sequences(seqs, **kwargs), n, self.what)

    def __getattr__(self, name):
        # Only reached for attributes this class does not define (score_frontier, with_prompt...).
        if name == "model":  # not yet set: avoid recursing during construction or unpickling
            raise AttributeError(name)
        return getattr(self.model, name)


def checked_model(model, what: str = "model"):
    """``model`` itself when it is one of ours (its protocol attributes still checked), else a
    :class:`CheckedModel` around it."""
    if isinstance(model, CheckedModel) or own_rows(model):
        # An inferred vocabulary (CallableModel without vocab_size) starts at 0 and grows.
        if not getattr(model, "vocab_inferred", False):
            check_protocol(model, what)
        return model
    return CheckedModel(model, what)


class ContinuedModel:
    """A draft shorter than the target, continued by the target: the next-token rows of prefixes
    the draft can extend (length ``< draft.max_len``) come from the draft, the rest from the
    target. Only used to SPECULATE completions (the speculative search's greedy completion),
    so it needs no score: every completed sequence is scored by the target itself.

    Attributes:
      draft, target: the two models; ``vocab_size``, ``eos`` and ``max_len`` are the target's
        (a draft row of another width is cut or padded with -inf to it: tokens the target does
        not have are no completions).
    """

    def __init__(self, draft, target):
        self.draft, self.target = draft, target
        self.eos = target.eos
        self.max_len = int(target.max_len)

    @property
    def vocab_size(self) -> int:
        return int(self.target.vocab_size)

    def __repr__(self) -> str:
        return f"ContinuedModel(draft={self.draft!r}, target={self.target!r})"

    def next_logprobs(self, prefixes, lengths) -> np.ndarray:
        """``float32[B, V]``: draft rows where the draft reaches, target rows beyond."""
        batch = checked_batch(prefixes, lengths, what="prefixes")
        short = batch.lengths < int(self.draft.max_len)
        out = np.full((batch.size, self.vocab_size), -np.inf, np.float32)
        for which, model in ((short, self.draft), (~short, self.target)):
            if which.any():
                idx = np.flatnonzero(which)
                rows = to_host(model.next_logprobs(batch.tokens[idx], batch.lengths[idx]), np.float32)
                if rows.ndim != 2 or rows.shape[0] != idx.size:
                    raise ValueError(
                        f"{type(model).__name__}.next_logprobs returned shape {rows.shape} for {idx.size} prefixes"
                    )
                width = min(rows.shape[1], self.vocab_size)
                out[idx, :width] = rows[:, :width]
        return out
