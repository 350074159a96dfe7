"""jaxrescore: speculative enumeration in JAX.

A cheap draft model builds the enumeration index; the expensive target scores only the candidates
a query returns, in one batched teacher-forcing forward; a certificate says when the answer is
provably the target's true top-k under an assumed draft/target gap.
"""

from jaxrescore.index import SeekIndex
from jaxrescore.quantize import Quantizer
from jaxrescore.rescore import GapCarry, RescoredIndex, RescoreResult, init_carry, rescore, rescore_many
from jaxrescore.sequences import SequenceBatch

__all__ = [
    "GapCarry",
    "Quantizer",
    "RescoreResult",
    "RescoredIndex",
    "SeekIndex",
    "SequenceBatch",
    "init_carry",
    "rescore",
    "rescore_many",
]
__version__ = "0.1.0"
