"""Type aliases of jaxrescore's public signatures (like ``jax.typing``: for annotations only).

Importing this module is cheap: it needs numpy and :mod:`jaxrescore.sequences`, not JAX.
"""

from __future__ import annotations

import os
from typing import Any, Sequence, TypeAlias, Union

import numpy as np
import numpy.typing as npt

from jaxrescore.sequences import SequenceBatch

__all__ = ["ArrayLike", "PathLike", "PyTree", "Sequences", "Tokens"]

ArrayLike: TypeAlias = npt.ArrayLike
"""Anything ``np.asarray`` takes: a numpy or JAX array, a nested list of numbers."""

Tokens: TypeAlias = Union[Sequence[int], np.ndarray]
"""One token sequence: a tuple or list of ints, or a 1-D integer array."""

Sequences: TypeAlias = Union[SequenceBatch, Sequence[Tokens]]
"""Several token sequences: a :class:`~jaxrescore.sequences.SequenceBatch` (padded ``tokens`` and
``lengths``) or a list of token sequences of any lengths."""

PathLike: TypeAlias = Union[str, os.PathLike[str]]
"""A file path: a string or a ``pathlib.Path``."""

PyTree: TypeAlias = Any
"""A JAX pytree, e.g. a model's parameters (nested dicts of arrays, an ``nnx.State``)."""

