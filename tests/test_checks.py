"""The one validator family (jaxrescore/_checks.py): one rule for integers everywhere."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from jaxrescore._checks import check_bool, check_choice, check_float, check_int


@pytest.mark.parametrize("value", [4, np.int64(4), np.uint8(4), 4.0, np.float32(4.0), jnp.int32(4), np.array(4)])
def test_integers_and_integral_floats_are_accepted(value):
    assert check_int(value, "k", minimum=1) == 4 and type(check_int(value, "k")) is int


@pytest.mark.parametrize("value", [True, np.bool_(False), 2.7, math.nan, math.inf, "4", None, [4], np.array([4])])
def test_everything_else_is_refused_by_name(value):
    with pytest.raises(ValueError, match=r"^k must be an integer >= 1, got "):
        check_int(value, "k", minimum=1)


def test_ranges_and_none():
    assert check_int(None, "window", allow_none=True) is None
    with pytest.raises(ValueError, match=r"eos must be None or an integer in \[0, 3\), got 3"):
        check_int(3, "eos", maximum=3, allow_none=True)
    with pytest.raises(ValueError, match="start must be an integer >= 0, got -1"):
        check_int(-1.0, "start")


def test_floats_bools_choices():
    assert check_float(1, "gap", minimum=0.0) == 1.0
    for bad in (True, math.nan, -0.5, "1", math.inf):
        with pytest.raises(ValueError, match=r"^gap must be a finite number >= 0 \(nats\)"):
            check_float(bad, "gap", minimum=0.0, unit="nats")
    assert check_float(math.inf, "x", finite=False) == math.inf
    assert check_bool(np.bool_(True), "prove") is True
    with pytest.raises(ValueError, match="prove must be True or False, got 1"):
        check_bool(1, "prove")
    assert check_choice("fast", "mode", ("fast", "exact")) == "fast"
    with pytest.raises(ValueError, match="mode must be one of 'fast', 'exact'; got 1"):
        check_choice(1, "mode", ("fast", "exact"))
