"""jaxrescore: speculative enumeration in JAX.

A cheap draft model builds the enumeration index; the expensive target scores only the candidates
a query returns, in one batched teacher-forcing forward; a certificate says when the answer is
provably the target's true top-k under an assumed draft/target gap.
"""

from jaxrescore.compilation_cache import enable_compilation_cache
from jaxrescore.index import AREnvelopeIndex, SeekIndex
from jaxrescore.models import (
    CallableModel,
    NGramLM,
    TransformerConfig,
    TransformerLM,
    distill,
    estimate_gap,
    from_apply_fn,
    load_model,
    quantize_int8,
    save_model,
    train_lm,
)
from jaxrescore.quantize import Quantizer
# The pure core stays at ``jaxrescore.rescore.rescore``: re-exporting the function here would
# shadow the ``jaxrescore.rescore`` subpackage.
from jaxrescore.rescore import GapCarry, RescoredIndex, RescoreResult, init_carry, rescore_many
from jaxrescore.sequences import SequenceBatch

__all__ = [
    "AREnvelopeIndex",
    "CallableModel",
    "GapCarry",
    "NGramLM",
    "Quantizer",
    "RescoreResult",
    "RescoredIndex",
    "SeekIndex",
    "SequenceBatch",
    "TransformerConfig",
    "TransformerLM",
    "distill",
    "enable_compilation_cache",
    "estimate_gap",
    "from_apply_fn",
    "init_carry",
    "load_model",
    "quantize_int8",
    "rescore_many",
    "save_model",
    "train_lm",
]
__version__ = "0.1.0"
