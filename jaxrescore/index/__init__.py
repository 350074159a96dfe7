"""Draft indexes: random access by rank into a model's support."""

from jaxrescore.index.beam import BeamResult, beam_search
from jaxrescore.index.envelope import AREnvelopeIndex
from jaxrescore.index.seek import SeekIndex

__all__ = ["AREnvelopeIndex", "BeamResult", "SeekIndex", "beam_search"]
