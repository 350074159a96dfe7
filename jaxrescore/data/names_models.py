"""The names demo's two models: the small character transformer shipped as weights (the target)
and a character n-gram fitted on the shipped names at start-up (the draft).

Both use the codec of :mod:`jaxrescore.data.names`: ``a..z`` are tokens ``0..25``, ``EOS = 26``;
sequences have at most :data:`MAX_LEN` tokens, EOS included.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import numpy as np

from jaxrescore.data.names import ALPHABET, EOS, MAX_NAME_LEN, VOCAB_SIZE, encode, load_names
from jaxrescore.models import NGramLM, TransformerConfig, TransformerLM, load_model

MAX_LEN = MAX_NAME_LEN + 1
"""Longest sequence of the names models, EOS included."""
TARGET_FILE = "names_target.npz"
"""The shipped target's file name inside ``jaxrescore/data``."""
DRAFT_ORDER = 6
"""The names draft's n-gram order."""


def names_target_config() -> TransformerConfig:
    """The names target's shape: 2 layers, d_model 64, 4 heads, 105k parameters."""
    return TransformerConfig(
        vocab_size=VOCAB_SIZE, d_model=64, n_layers=2, n_heads=4, max_len=MAX_LEN, eos=EOS
    )


def names_vocabulary() -> tuple[str, ...]:
    """The names models' token strings: ``a``..``z`` then ``<eos>``."""
    return tuple(ALPHABET) + ("<eos>",)


def names_corpus() -> tuple[list[tuple[int, ...]], np.ndarray]:
    """The shipped names as EOS-terminated token tuples and their birth counts ``float64[N]``."""
    names = load_names()
    return [encode(n) for n, _ in names], np.array([c for _, c in names], np.float64)


def shipped_target_path() -> Path:
    """Path of the shipped target weights inside the installed package."""
    return Path(str(resources.files("jaxrescore.data").joinpath(TARGET_FILE)))


def names_target() -> TransformerLM:
    """The shipped target: a :func:`names_target_config` transformer trained on the names
    (``jaxrescore train`` retrains it), stored with :func:`names_vocabulary`, so its sequences
    print as text."""
    return load_model(shipped_target_path())


def names_draft(order: int = DRAFT_ORDER) -> NGramLM:
    """The draft: an interpolated Kneser-Ney character n-gram of ``order`` fitted on the shipped
    names, each weighted by its birth count (normalised to mean 1, so the discount acts on a
    per-name scale). Fitting takes well under a second."""
    seqs, counts = names_corpus()
    return NGramLM.fit(
        seqs, order=order, vocab_size=VOCAB_SIZE, eos=EOS, max_len=MAX_LEN,
        weights=counts * (len(counts) / counts.sum()),
    )
