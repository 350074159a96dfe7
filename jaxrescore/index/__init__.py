"""Draft indexes: random access by rank into a model's support."""

from jaxrescore.index.beam import BeamResult, beam_search
from jaxrescore.index.envelope import AREnvelopeIndex
from jaxrescore.index.seek import IndexLimitError, SeekIndex

__all__ = ["AREnvelopeIndex", "BeamResult", "IndexLimitError", "SeekIndex", "beam_search"]
