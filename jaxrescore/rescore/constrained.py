"""A query under a constraint: the same index's models, both restricted to what it accepts.

``RescoredIndex.top_k(k, constraint=c)`` (and ``slice``, ``sweep``) asks a fresh index over the
constrained models (:class:`~jaxrescore.constraints.ConstrainedModel`): the target restricted to
``c`` (so ``proven`` means the exact top-k among the sequences ``c`` accepts), and as draft the
index's completion model restricted to ``c``, speculating from the root
(:class:`~jaxrescore.rescore.draft.SpeculativeDraft`). The index's own draft order is not reused:
it ranks sequences the constraint refuses. Such an index certifies nothing against an
``assumed_gap`` (a speculating draft gives no bound); proofs need none.
"""

from __future__ import annotations

from typing import Any

from jaxrescore.constraints import Constraint, constrain, constrain_draft
from jaxrescore.rescore.draft import SpeculativeDraft


def constrained_index(index: Any, constraint: Constraint) -> Any:
    """A new index of ``index``'s type and settings over its models restricted to ``constraint``
    (see the module docstring)."""
    if not isinstance(constraint, Constraint):
        raise TypeError(
            "constraint must be a jaxrescore.constraints constraint (Length, Regex, OneOf, or their &), "
            f"got {type(constraint).__name__}"
        )
    if not callable(getattr(index.target, "next_logprobs", None)):
        raise TypeError("constraint= needs a target model (next_logprobs), not a bare scoring function")
    target = constrain(index.target, constraint)
    draft = constrain_draft(index.draft_model if index.draft_model is not None else index.target, target)
    return type(index)(SpeculativeDraft(draft), target, rerank_window=index.rerank_window,
                       assumed_gap=index.assumed_gap, top_m=index.top_m, completion_branch=index.completion_branch,
                       search_width=index.search_width, adaptive_width=index.adaptive_width)
