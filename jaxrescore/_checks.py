"""One validator family for every public argument: one rule per kind of value.

The rule for integers is decided here, once: an integer argument accepts a Python or numpy
integer, a 0-d integer array (``jnp.int32(4)``) and an integral finite float (``4.0``, as JSON
and numpy arithmetic produce); it refuses bools (``True`` is not a count), fractional floats
(``2.7`` is never silently cut to 2), NaN/inf, strings and everything else. Every error is a
``ValueError`` naming the argument, the value received and what is accepted; nothing here
mutates anything, so a call that fails on its arguments leaves every object as it was.
"""

from __future__ import annotations

import math
import numbers
import operator
from typing import Any

import numpy as np

__all__ = ["check_int", "check_float", "check_bool", "check_choice"]


def _accepted_int(minimum: int | None, maximum: int | None, allow_none: bool) -> str:
    if minimum is not None and maximum is not None:
        where = f"an integer in [{minimum}, {maximum})"
    elif minimum is not None:
        where = f"an integer >= {minimum}"
    elif maximum is not None:
        where = f"an integer < {maximum}"
    else:
        where = "an integer"
    return ("None or " if allow_none else "") + where


def _as_integer(value: Any) -> int | None:
    """``value`` as an int under the one rule, or None where the rule refuses it."""
    if isinstance(value, (bool, np.bool_)):
        return None
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        x = float(value)
        return int(x) if math.isfinite(x) and x == math.floor(x) else None
    dtype = getattr(value, "dtype", None)
    if dtype is not None and getattr(value, "shape", None) == () and np.dtype(dtype).kind in "iuf":
        if np.dtype(dtype).kind == "f":
            return _as_integer(float(value))
        return operator.index(value)
    return None


def check_int(
    value: Any,
    name: str,
    *,
    minimum: int | None = 0,
    maximum: int | None = None,
    allow_none: bool = False,
) -> int | None:
    """``value`` as an ``int`` in ``[minimum, maximum)`` (either end None: open).

    Accepted: see the module docstring (integers, 0-d integer arrays, integral floats);
    ``None`` only with ``allow_none``. ValueError naming ``name`` otherwise."""
    if value is None and allow_none:
        return None
    accepted = _accepted_int(minimum, maximum, allow_none)
    n = _as_integer(value)
    if n is None:
        raise ValueError(f"{name} must be {accepted}, got {value!r} ({type(value).__name__})")
    if (minimum is not None and n < minimum) or (maximum is not None and n >= maximum):
        raise ValueError(f"{name} must be {accepted}, got {n}")
    return n


def check_float(
    value: Any,
    name: str,
    *,
    minimum: float = -math.inf,
    maximum: float = math.inf,
    allow_none: bool = False,
    finite: bool = True,
    unit: str = "",
) -> float | None:
    """``value`` as a ``float`` in ``[minimum, maximum]``: a real number (or 0-d real array),
    never a bool; finite unless ``finite=False`` (NaN is always refused). ``unit`` is named in the
    error (e.g. ``"nats"``)."""
    if value is None and allow_none:
        return None
    kind = "a finite number" if finite else "a number"
    if minimum > -math.inf and maximum < math.inf:
        kind += f" in [{minimum:g}, {maximum:g}]"
    elif minimum > -math.inf:
        kind += f" >= {minimum:g}"
    elif maximum < math.inf:
        kind += f" <= {maximum:g}"
    accepted = ("None or " if allow_none else "") + kind + (f" ({unit})" if unit else "")
    real = isinstance(value, numbers.Real) or (
        getattr(value, "shape", None) == () and np.dtype(getattr(value, "dtype", object)).kind in "iuf"
    )
    if isinstance(value, (bool, np.bool_)) or not real:
        raise ValueError(f"{name} must be {accepted}, got {value!r} ({type(value).__name__})")
    x = float(value)
    if math.isnan(x) or (finite and not math.isfinite(x)) or not minimum <= x <= maximum:
        raise ValueError(f"{name} must be {accepted}, got {value!r}")
    return x


def check_bool(value: Any, name: str) -> bool:
    """``value`` as a ``bool``: only ``True``/``False`` (numpy bools included); ``1`` or ``"yes"``
    are refused so a misplaced positional argument is caught."""
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be True or False, got {value!r} ({type(value).__name__})")
    return bool(value)


def check_choice(value: Any, name: str, choices: tuple) -> Any:
    """``value`` if it is one of ``choices`` (compared with ``==``, bools never equal to ints)."""
    for choice in choices:
        if type(value) is type(choice) and value == choice:
            return choice
    listed = ", ".join(repr(c) for c in choices)
    raise ValueError(f"{name} must be one of {listed}; got {value!r}")
