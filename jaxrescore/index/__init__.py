"""Draft indexes: random access by rank into a model's support."""

from jaxrescore.index.envelope import AREnvelopeIndex
from jaxrescore.index.seek import IndexLimitError, SeekIndex, SeekState

__all__ = ["AREnvelopeIndex", "IndexLimitError", "SeekIndex", "SeekState"]
