"""SequenceBatch: padded token sequences with explicit lengths, and host-side helpers.

Padding and bucketing happen on the host with numpy so that device functions only ever see a few
power-of-two shapes (every new shape is a new compile).
"""

from __future__ import annotations

from typing import Iterable, NamedTuple, Sequence

import numpy as np

PAD_ID = 0


def bucket_size(n: int, minimum: int = 8) -> int:
    """The smallest power of two >= max(n, minimum)."""
    n = max(int(n), int(minimum), 1)
    return 1 << (n - 1).bit_length()


class SequenceBatch(NamedTuple):
    """A batch of token sequences (a JAX pytree, being a NamedTuple).

    Attributes:
      tokens: int32[N, T]; positions ``>= lengths[i]`` hold padding and must be ignored.
      lengths: int32[N]; the number of real tokens of each row (an EOS token, when the model
        has one, is a real token and counts).
    """

    tokens: np.ndarray
    lengths: np.ndarray

    @property
    def size(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def mask(self) -> np.ndarray:
        """bool[N, T]: True on real tokens."""
        t = self.tokens.shape[1]
        return np.arange(t)[None, :] < np.asarray(self.lengths)[:, None]

    def to_tuples(self) -> list[tuple[int, ...]]:
        toks = np.asarray(self.tokens)
        lens = np.asarray(self.lengths)
        return [tuple(int(x) for x in toks[i, : lens[i]]) for i in range(toks.shape[0])]

    def pad(self, rows: int | None = None, length: int | None = None) -> "SequenceBatch":
        """A copy padded (never truncated) to ``rows`` x ``length``; padding rows have length 0."""
        n, t = self.tokens.shape
        rows = n if rows is None else rows
        length = t if length is None else length
        if rows < n or length < t:
            raise ValueError(f"pad cannot shrink a batch of shape {(n, t)} to {(rows, length)}")
        toks = np.full((rows, length), PAD_ID, np.int32)
        toks[:n, :t] = self.tokens
        lens = np.zeros(rows, np.int32)
        lens[:n] = self.lengths
        return SequenceBatch(toks, lens)

    def bucketed(self, min_rows: int = 8, min_length: int = 8) -> "SequenceBatch":
        """Padded to power-of-two rows and length (see :func:`bucket_size`)."""
        n, t = self.tokens.shape
        return self.pad(bucket_size(n, min_rows), bucket_size(t, min_length))


def from_tuples(seqs: Iterable[Sequence[int]], *, length: int | None = None) -> SequenceBatch:
    """Pack token sequences into a :class:`SequenceBatch` of exactly ``len(seqs)`` rows.

    Args:
      seqs: sequences of non-negative ints.
      length: the padded length T (default: the longest sequence, at least 1).
    """
    rows = [np.asarray(s, dtype=np.int64).reshape(-1) for s in seqs]
    lens = np.array([r.size for r in rows], dtype=np.int32)
    t = int(lens.max(initial=0)) if length is None else int(length)
    t = max(t, 1)
    if lens.size and lens.max() > t:
        raise ValueError(f"length={length} is shorter than the longest sequence ({lens.max()})")
    toks = np.full((len(rows), t), PAD_ID, np.int32)
    for i, r in enumerate(rows):
        if r.size and (r.min() < 0 or r.max() > np.iinfo(np.int32).max):
            raise ValueError(f"sequence {i} has a token outside [0, 2**31): {r.tolist()}")
        toks[i, : r.size] = r
    return SequenceBatch(toks, lens)


def checked_batch(tokens, lengths, *, what: str = "seqs") -> SequenceBatch:
    """``tokens: int32[N, T]`` and ``lengths: int32[N]`` (each in ``[0, T]``) as a SequenceBatch of
    numpy arrays; a ValueError naming ``what`` otherwise."""
    toks = np.asarray(tokens)
    lens = np.asarray(lengths)
    if toks.ndim != 2 or lens.shape != (toks.shape[0],):
        raise ValueError(
            f"{what} must be tokens int32[N, T] with lengths int32[N], got shapes {toks.shape} and {lens.shape}"
        )
    if lens.size and (lens.min() < 0 or lens.max() > toks.shape[1]):
        raise ValueError(
            f"{what} lengths must lie in [0, {toks.shape[1]}], got range [{int(lens.min())}, {int(lens.max())}]"
        )
    return SequenceBatch(toks.astype(np.int32, copy=False), lens.astype(np.int32, copy=False))


def as_sequence_batch(seqs) -> SequenceBatch:
    """Accept a :class:`SequenceBatch`, a 2-D integer array (every row full length), or a list of
    token sequences, and return a :class:`SequenceBatch` with numpy int32 arrays."""
    if isinstance(seqs, SequenceBatch):
        return checked_batch(seqs.tokens, seqs.lengths, what="SequenceBatch")
    if isinstance(seqs, np.ndarray) and seqs.ndim == 2:
        return SequenceBatch(seqs.astype(np.int32), np.full(seqs.shape[0], seqs.shape[1], np.int32))
    return from_tuples(list(seqs))
