"""What the rescoring layer reads of the models: the target's scorer and support, the draft's
scores of sequences the search found.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxrescore.models.base import Structure
from jaxrescore.models.mesh import to_host
from jaxrescore.rescore.frontier import complete, view_lengths
from jaxrescore.sequences import from_tuples


def as_scorer(target: Any):
    """The batch scorer of a target: its ``score_sequences`` method, or the callable itself."""
    method = getattr(target, "score_sequences", None)
    if callable(method):
        return method
    if callable(target):
        return target
    raise TypeError(
        "target must have a score_sequences(seqs) method or be a callable [seqs] -> log_probs, "
        f"got {type(target).__name__}"
    )


def target_structure(target: Any) -> Structure | None:
    """The target's support as a :class:`Structure` read NOW (an inferred vocabulary grows with
    every call, so read it after the calls it must cover), or None when the target does not say
    (a bare scoring function). An inferred vocabulary is reported as unknown (``vocab_size
    None``), never as its current width."""
    try:
        vocab = None if getattr(target, "vocab_inferred", False) is True else int(target.vocab_size)
        return Structure(vocab, None if target.eos is None else int(target.eos), int(target.max_len))
    except (AttributeError, TypeError, ValueError):
        return None


def forward_rows(seqs: list, structure: Structure) -> tuple[list, np.ndarray]:
    """The rows to score (each sequence's view: what the target reads of it) and ``bool[N]``:
    whether each sequence is in the target's support (its own view, and complete)."""
    if not seqs:
        return [], np.zeros(0, bool)
    batch = from_tuples(seqs)
    tokens = np.where(batch.mask, batch.tokens, -1).astype(np.int64)
    cut = view_lengths(tokens, batch.lengths, structure)
    rows = [s if n == len(s) else s[:n] for s, n in zip(seqs, cut.tolist())]
    ok = (cut == batch.lengths) & complete(tokens, cut, structure)
    return rows, ok


def draft_scorer(draft_index: Any, draft_model: Any, completion: Any):
    """The model whose scores the draft index orders by, for scoring sequences it did not pull:
    the index's own ``.model``, else the ``draft_model`` given, else the completion model's draft
    (a draft continued by the target scores nothing of the target's). None when none can score."""
    from jaxrescore.models.checked import ContinuedModel

    for model in (getattr(draft_index, "model", None), draft_model, completion):
        if isinstance(model, ContinuedModel):
            model = model.draft
        if callable(getattr(model, "score_sequences", None)) and target_structure(model) is not None:
            return model
    return None


def draft_scores(model: Any, seqs: list) -> np.ndarray:
    """The draft ``model``'s log-probs ``float64[N]`` of sequences the search found: ``-inf`` for
    one outside its support (evidence against a gap, see :mod:`jaxrescore.rescore.core`), NaN
    where no draft model can say (``model`` None, or a foreign one that cannot score them)."""
    out = np.full(len(seqs), np.nan)
    structure = target_structure(model) if model is not None else None
    if structure is None:
        return out
    _, ok = forward_rows(seqs, structure)
    out[~ok] = -np.inf
    inside = np.flatnonzero(ok)
    if inside.size:
        try:
            out[inside] = np.minimum(to_host(model.score_sequences([seqs[i] for i in inside]), np.float64), 0.0)
        except (ValueError, TypeError):  # a foreign model that cannot score them: unknown
            pass
    return out
