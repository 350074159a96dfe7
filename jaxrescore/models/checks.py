"""Checks of what models are given and what they return: token batches and prefixes against a
model's support, eos-terminated corpora, sequence weights, dtypes, and NaN log-probs."""

from __future__ import annotations

import numpy as np

from jaxrescore.sequences import SequenceBatch, checked_batch


def check_tokens(batch: SequenceBatch, vocab_size: int, max_len: int | None, what: str = "seqs") -> None:
    """ValueError unless every real token lies in ``[0, vocab_size)`` and every length <= max_len
    (``max_len=None``: any length)."""
    if max_len is not None and batch.size and int(batch.lengths.max()) > max_len:
        i = int(np.argmax(batch.lengths))
        raise ValueError(
            f"{what}[{i}] has length {int(batch.lengths[i])} > max_len={max_len}"
        )
    real = batch.mask
    bad = real & ((batch.tokens < 0) | (batch.tokens >= vocab_size))
    if bad.any():
        i, j = (int(x) for x in np.argwhere(bad)[0])
        raise ValueError(
            f"{what}[{i}] has token {int(batch.tokens[i, j])} at position {j}; "
            f"tokens must lie in [0, {vocab_size})"
        )


def check_prefixes(prefixes, lengths, vocab_size: int, max_len: int) -> SequenceBatch:
    """The ``next_logprobs`` arguments as a checked SequenceBatch: ``prefixes: int32[B, T]``,
    ``lengths: int32[B]`` each in ``[0, max_len - 1]``, tokens in ``[0, vocab_size)``."""
    batch = checked_batch(prefixes, np.asarray(lengths).reshape(-1), what="prefixes")
    lengths = batch.lengths
    if lengths.size and lengths.max() >= max_len:
        raise ValueError(
            f"prefix lengths must lie in [0, {max_len - 1}] (max_len={max_len}), "
            f"got range [{int(lengths.min())}, {int(lengths.max())}]"
        )
    check_tokens(batch, vocab_size, max_len, what="prefixes")
    return batch


def check_eos_terminated(batch: SequenceBatch, eos: int, what: str) -> None:
    """ValueError unless every row ends with ``eos`` and has no earlier ``eos``."""
    n = batch.size
    last = batch.tokens[np.arange(n), np.maximum(batch.lengths - 1, 0)]
    bad = np.flatnonzero((batch.lengths == 0) | (last != eos))
    if bad.size:
        raise ValueError(f"{what}[{bad[0]}] does not end with eos={eos}; every sequence must")
    early = batch.mask & (batch.tokens == eos)
    early[np.arange(n), batch.lengths - 1] = False
    bad = np.flatnonzero(early.any(axis=1))
    if bad.size:
        raise ValueError(f"{what}[{bad[0]}] contains eos={eos} before its end")


def check_nan(model, values: np.ndarray, lengths: np.ndarray | None, what: str) -> None:
    """ValueError when ``values`` (float[N, W, ...] per position, or float[N, ...] per row when
    ``lengths`` is None) hold a NaN at a real position: NaN or +inf logits (a log_softmax of them
    is NaN). Normalisation needs no check: every row is ``log_softmax`` of the model's logits, a
    distribution by construction (logits scaled by 0.5 are a different distribution, a
    temperature, not an error). A host pass over arrays that reached the host anyway."""
    bad = np.isnan(values)
    if bad.ndim > (1 if lengths is None else 2):
        bad = bad.reshape(bad.shape[: 1 if lengths is None else 2] + (-1,)).any(axis=-1)
    if lengths is not None:
        bad &= np.arange(bad.shape[1])[None, :] < np.asarray(lengths)[:, None]
    if bad.any():
        where = np.argwhere(bad)[0]
        at = f"row {int(where[0])}" if lengths is None else f"sequence {int(where[0])}, position {int(where[1])}"
        raise ValueError(
            f"{type(model).__name__}.{what} produced NaN log-probs at {at} ({int(bad.sum())} in all): "
            "its logits hold NaN or +inf"
        )


def is_float_dtype(dtype) -> bool:
    """Whether ``dtype`` is a floating dtype: numpy's, or one of JAX's ``ml_dtypes`` (bfloat16,
    float8 variants), which numpy files under kind ``'V'``."""
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return True
    try:
        import ml_dtypes

        ml_dtypes.finfo(dtype)
    except (ImportError, ValueError, TypeError):
        return False
    return True


def check_weights(weights, n: int) -> np.ndarray:
    """``weights`` as float64[n]: finite, non-negative, not all zero (None: all ones)."""
    if weights is None:
        return np.ones(n)
    raw = np.asarray(weights)
    if raw.dtype.kind not in "iuf":
        raise ValueError(f"weights must be {n} finite non-negative numbers, got dtype {raw.dtype}")
    w = raw.astype(np.float64).reshape(-1)
    if w.shape != (n,) or not np.all(np.isfinite(w)) or w.min(initial=0) < 0 or w.sum() <= 0:
        raise ValueError(
            f"weights must be {n} finite non-negative numbers, not all zero; got shape {raw.shape}"
        )
    return w
