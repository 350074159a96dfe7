"""Upper bounds on huge counts (``dropped_upper``): exact ints below 2**63, floats rounded up beyond.

A ``branch_cap`` drop counts every structurally possible completion of the dropped prefix, which
for a wide, long model is far past what an int prints (4,300 digits) or a file holds; these keep
the count exact while it is small and a sound float upper bound (``inf`` past float range) after.
"""

from __future__ import annotations

import math

import numpy as np

_EXACT = 1 << 63
_UP = 1.0 + 1e-12  # relative headroom that covers float rounding of the few operations below


def as_upper(x: int) -> int | float:
    """``x`` itself below 2**63, else a float at least as large (inf past float range)."""
    if x < _EXACT:
        return x
    try:
        return float(x) * _UP
    except OverflowError:
        return math.inf


def upper_pow(base: int, k: int) -> int | float:
    """An upper bound on ``base**k``."""
    if base <= 1 or k * math.log2(base) < 64:
        return as_upper(base**k)
    lg = k * math.log2(base)
    return math.inf if lg >= 1023 else 2.0**lg * _UP


def upper_geometric(base: int, k: int) -> int | float:
    """An upper bound on ``sum(base**j for j in range(k))``."""
    if k <= 0:
        return 0
    if base <= 1:
        return k if base == 1 else 1
    if k * math.log2(base) < 64:
        return as_upper((base**k - 1) // (base - 1))
    lg = k * math.log2(base) - math.log2(base - 1)  # the sum is below base**k / (base - 1)
    return math.inf if lg >= 1023 else 2.0**lg * _UP


def mul_upper(a: int, b: int | float) -> int | float:
    """An upper bound on ``a * b``."""
    if a == 0 or b == 0:
        return 0
    if isinstance(b, int):
        return as_upper(a * b)
    return float(a) * b * _UP


def add_upper(a: int | float, b: int | float) -> int | float:
    """An upper bound on ``a + b``."""
    if isinstance(a, int) and isinstance(b, int):
        return as_upper(a + b)
    return (float(a) + float(b)) * _UP


def completions(max_len: int, eos: int | None, depth: int, dropped: np.ndarray, width: int) -> int | float:
    """An upper bound on the support sequences structurally possible below the dropped children
    ``dropped: bool[b, width]`` at ``depth``: exact while it stays below 2**63, else a float
    rounded up (inf past range)."""
    rest = max_len - depth
    if eos is None:
        n_eos, n_other, per_other = 0, int(dropped.sum()), upper_pow(width, rest)
    else:
        n_eos = int(dropped[:, eos].sum()) if eos < width else 0
        n_other = int(dropped.sum()) - n_eos
        # sum_{j < rest} (width - 1)**j completions below a non-eos prefix
        per_other = upper_geometric(width - 1, rest)
    return add_upper(n_eos, mul_upper(n_other, per_other))
