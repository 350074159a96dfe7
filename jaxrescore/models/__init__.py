"""Models implementing the AutoregressiveEnumerable protocol."""

from jaxrescore.models.base import AutoregressiveEnumerable

__all__ = ["AutoregressiveEnumerable"]
