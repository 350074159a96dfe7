"""Proven top-k under constraints: length, regex and choices (see :mod:`.kinds`).

``jaxrescore.top_k(target, draft, k, constraint=Regex("ma[a-z]*a"))`` returns, when
``result.proven``, the target's exact top-k among its sequences that satisfy the constraint,
scored as the target scores them (unnormalised log-probs, as without a constraint). It runs on
:class:`ConstrainedModel`: the target and the draft with every refused step at ``-inf``, so every
rule of the unconstrained proof holds as it is (see :mod:`.model`).
"""

from jaxrescore.constraints.automaton import TokenAutomaton
from jaxrescore.constraints.kinds import AllOf, Constraint, Length, OneOf, Regex
from jaxrescore.constraints.model import ConstrainedModel, constrain, constrain_draft

__all__ = ["AllOf", "ConstrainedModel", "Constraint", "Length", "OneOf", "Regex", "TokenAutomaton", "constrain",
           "constrain_draft"]
