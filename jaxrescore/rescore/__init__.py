"""Rescoring: the pure core (``core``, ``frontier``, ``proof``) and the RescoredIndex shell over it."""

from jaxrescore.rescore.core import GapCarry, RescoreOutput, init_carry, merge_carries, rescore, rescore_sweep, update_carry
from jaxrescore.rescore.core import rescore as rescore_batch
from jaxrescore.rescore.frontier import ScoredArrays, frontier_bound
from jaxrescore.rescore.gap import GapEstimate, TopGapEstimate, estimate_gap, estimate_top_gap
from jaxrescore.rescore.many import rescore_many
from jaxrescore.rescore.proof import proof_verdict, slice_worst
from jaxrescore.rescore.rescored_index import RescoredIndex
from jaxrescore.rescore.result import RescoreResult

__all__ = [
    "GapCarry", "GapEstimate", "RescoreOutput", "RescoreResult", "RescoredIndex", "ScoredArrays", "frontier_bound", "init_carry",
    "merge_carries", "proof_verdict", "rescore", "rescore_batch", "rescore_many", "rescore_sweep", "slice_worst",
    "update_carry", "TopGapEstimate", "estimate_gap", "estimate_top_gap",
]
