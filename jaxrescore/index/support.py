"""The support's rule for one given sequence, as the draft indexes read a ``seq`` argument."""

from __future__ import annotations


def support_sequence(seq, eos: int | None, max_len: int) -> tuple[int, ...]:
    """``seq`` as a tuple of ints, checked against the length/eos rule of a model's support
    (length ``max_len`` without an eos; else 1 to ``max_len`` tokens, ``eos`` last and only there).
    ValueError naming ``seq`` otherwise; token ids are the caller's to check."""
    try:
        seq = tuple(int(t) for t in seq)
    except (TypeError, ValueError):
        raise ValueError(f"seq must be a sequence of token ids, got {seq!r}") from None
    n = len(seq)
    if eos is None:
        ok = n == max_len
    else:
        ok = 1 <= n <= max_len and seq[-1] == eos and eos not in seq[:-1]
    if not ok:
        raise ValueError(f"seq {seq} is not in the model's support (length/eos rule)")
    return seq
