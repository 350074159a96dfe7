"""Rescoring: the pure core (``core``) and the RescoredIndex shell over it (``index``)."""

from jaxrescore.rescore.core import GapCarry, RescoreOutput, init_carry, rescore, rescore_sweep
from jaxrescore.rescore.gap import GapEstimate, TopGapEstimate, estimate_gap, estimate_top_gap
from jaxrescore.rescore.index import RescoredIndex, RescoreResult
from jaxrescore.rescore.many import rescore_many

__all__ = ["GapCarry", "GapEstimate", "RescoreOutput", "RescoreResult", "RescoredIndex", "init_carry", "rescore", "rescore_many", "rescore_sweep", "TopGapEstimate", "estimate_gap", "estimate_top_gap"]
