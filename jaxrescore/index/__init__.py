"""Draft indexes: random access by rank into a model's support."""

from jaxrescore.index.envelope import AREnvelopeIndex
from jaxrescore.index.seek import SeekIndex

__all__ = ["AREnvelopeIndex", "SeekIndex"]
