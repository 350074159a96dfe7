"""Draft indexes: random access by rank into a model's support."""

# beam_search and BeamResult live in jaxrescore.baselines; this namespace keeps naming them.
from jaxrescore.baselines.beam import BeamResult, beam_search
from jaxrescore.index.envelope import AREnvelopeIndex
from jaxrescore.index.seek import IndexLimitError, SeekIndex, SeekState

__all__ = ["AREnvelopeIndex", "BeamResult", "IndexLimitError", "SeekIndex", "SeekState", "beam_search"]
