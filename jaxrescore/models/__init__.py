"""Models implementing the AutoregressiveEnumerable protocol."""

from jaxrescore.models.adapters import from_equinox, from_linen, from_nnx
from jaxrescore.models.apply_fn import ApplyFnLM, from_apply_fn
from jaxrescore.models.base import AutoregressiveEnumerable
from jaxrescore.models.callable import CallableModel
from jaxrescore.models.checkpoint import load_model, save_model
from jaxrescore.models.decoding import DecodingSession, decoding_session
from jaxrescore.models.int8 import Int8TransformerLM, max_step_deviation, quantize_int8
from jaxrescore.models.jax_lm import JaxLM
from jaxrescore.models.ngram import NGramLM
from jaxrescore.models.pretrained import PretrainedLM, from_pretrained
from jaxrescore.models.prompt import PromptedModel
from jaxrescore.models.generate import sample_sequences
from jaxrescore.models.training import distill, train_lm
from jaxrescore.models.transformer import TransformerConfig, TransformerLM

__all__ = [
    "ApplyFnLM",
    "AutoregressiveEnumerable",
    "CallableModel",
    "DecodingSession",
    "Int8TransformerLM",
    "JaxLM",
    "NGramLM",
    "PretrainedLM",
    "PromptedModel",
    "TransformerConfig",
    "TransformerLM",
    "decoding_session",
    "distill",
    "from_apply_fn",
    "from_equinox",
    "from_linen",
    "from_nnx",
    "from_pretrained",
    "load_model",
    "max_step_deviation",
    "quantize_int8",
    "sample_sequences",
    "save_model",
    "train_lm",
]
