"""AREnvelopeIndex: approximate random access by rank, far deeper than any exact index can list
(:mod:`~jaxrescore.index.envelope.index` the index, :mod:`~jaxrescore.index.envelope.calibration`
the per-depth envelope, :mod:`~jaxrescore.index.envelope.descent` how ranks are dealt to children,
:mod:`~jaxrescore.index.envelope.io` its file)."""

from jaxrescore.index.envelope.index import AREnvelopeIndex

__all__ = ["AREnvelopeIndex"]
