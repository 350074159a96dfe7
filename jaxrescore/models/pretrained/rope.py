"""Rotary position settings of a Llama-family checkpoint: read from either config spelling, refused
when the forward could not compute them, turned into frequencies.

Two spellings exist. transformers 4.x writes a top-level ``rope_theta`` and an optional
``rope_scaling`` object; transformers 5 writes ONE object, ``rope_parameters`` (``{"rope_theta":
500000.0, "rope_type": "llama3", "factor": 8.0, ...}``), and no top-level keys. Reading only the old
keys silently runs theta = 10,000 on a version-5 folder (tens of nats off per row while greedy
text still looks plausible), so :func:`rope_settings` reads ``rope_parameters`` first, then the
old keys (with transformers' own priority: a value inside ``rope_parameters`` wins), and refuses
anything it would otherwise ignore: an unknown ``rope_type``, a key of the type's object it does
not implement, per-layer-type (nested) parameters, partial rotary dimensions, or a theta that the
two spellings give differently.

Types (the frequencies transformers' ``ROPE_INIT_FUNCTIONS`` computes; the tests hold numbers
read from transformers 5.25):

- ``default``: ``theta ** (-2i / Dh)``;
- ``linear``: every frequency divided by ``factor``;
- ``llama3``: Llama 3.1's wavelength-dependent scaling (``factor``, ``low_freq_factor``,
  ``high_freq_factor``, ``original_max_position_embeddings``);
- ``yarn``: the YaRN ramp between interpolated and extrapolated frequencies (``beta_fast``,
  ``beta_slow``, ``truncate``) and its attention factor, which scales cos and sin (so every
  attention logit by its square);
- ``dynamic``: dynamic NTK changes the base only for sequences longer than
  ``max_position_embeddings``; the model's ``max_len`` never exceeds that context, so inside it
  the frequencies are the default ones and the type loads as ``default``.

:class:`~jaxrescore.models.pretrained.network.DecoderSpec` holds the result as ``rope_theta`` and
``rope_scaling``: None or a sorted tuple of ``(key, value)`` pairs with every number resolved
(defaults filled in), so the spec stays hashable and a jit static argument.
"""

from __future__ import annotations

import math

import numpy as np

# rope_type -> the keys of its object the forward implements (besides rope_type/type/rope_theta).
KEYS_OF_TYPE = {
    "default": (),
    "dynamic": ("factor", "original_max_position_embeddings"),
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "yarn": ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "truncate",
             "attention_factor", "mscale", "mscale_all_dim"),
}
ROPE_TYPES = tuple(KEYS_OF_TYPE)
# Keys every spelling may carry that change nothing here (rope_theta is read separately; a
# partial_rotary_factor of exactly 1 is the full head).
_COMMON = ("rope_type", "type", "rope_theta", "partial_rotary_factor")
DEFAULT_THETA = 10000.0


def _number(value, key: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"config.json: {where}[{key!r}] must be a finite number, got {value!r}")
    return float(value)


def _parameters(config: dict) -> tuple[dict | None, str]:
    """The rotary object and the name it was read under (``rope_parameters`` first)."""
    found = {}
    for name in ("rope_parameters", "rope_scaling"):
        value = config.get(name)
        if value is None or value == {}:
            continue
        if not isinstance(value, dict):
            raise ValueError(f"config.json: {name} must be null or an object, got {value!r}")
        if any(isinstance(v, dict) for v in value.values()):
            raise ValueError(
                f"config.json: {name} holds per-layer-type objects ({sorted(value)}); rotary settings "
                "that differ between layers are not supported"
            )
        found[name] = value
    if len(found) == 2:
        new, old = ({k: v for k, v in found[n].items() if k != "rope_theta"} for n in found)
        if new != old:  # transformers 5 would take rope_scaling, 4.x never reads rope_parameters
            raise ValueError(
                "config.json: rope_parameters and rope_scaling disagree; which one the checkpoint "
                "was trained with is ambiguous"
            )
    name = next(iter(found), "rope_parameters")
    return found.get(name), name


def _theta(config: dict, params: dict | None, where: str) -> float:
    top = config.get("rope_theta")
    inner = None if params is None else params.get("rope_theta")
    if top is not None and inner is not None and float(top) != float(inner):
        raise ValueError(
            f"config.json: rope_theta={top!r} and {where}['rope_theta']={inner!r} disagree; "
            "which one the checkpoint was trained with is ambiguous"
        )
    value = inner if inner is not None else top
    if value is None:
        return DEFAULT_THETA
    theta = _number(value, "rope_theta", where)
    if theta <= 1.0:
        raise ValueError(f"config.json: rope_theta must be > 1, got {value!r}")
    return theta


def rope_settings(config: dict) -> tuple[float, tuple | None]:
    """``(rope_theta, rope_scaling)`` of a Llama-family ``config.json`` (see the module
    docstring); ValueError naming the key for anything the forward would not compute."""
    params, where = _parameters(config)
    theta = _theta(config, params, where)
    partial = config.get("partial_rotary_factor", (params or {}).get("partial_rotary_factor", 1.0))
    if partial is not None and float(partial) != 1.0:
        raise ValueError(
            f"config.json: partial_rotary_factor={partial!r}; only full-head rotary embeddings (1.0) "
            "are supported"
        )
    if params is None:
        return theta, None
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in KEYS_OF_TYPE:
        raise ValueError(f"config.json: {where} rope_type {kind!r} is not supported; supported: {ROPE_TYPES}")
    unknown = sorted(set(params) - set(_COMMON) - set(KEYS_OF_TYPE[kind]))
    if unknown:
        raise ValueError(
            f"config.json: {where} of rope_type {kind!r} has keys {unknown} that are not implemented "
            f"(known for {kind!r}: {list(KEYS_OF_TYPE[kind])}); refusing rather than computing other numbers"
        )
    if kind in ("default", "dynamic"):
        return theta, None
    return theta, _resolved(kind, params, config, where)


def _resolved(kind: str, params: dict, config: dict, where: str) -> tuple:
    """Every number the type's frequencies need, defaults filled in as transformers fills them."""
    original = config.get("original_max_position_embeddings",
                          params.get("original_max_position_embeddings", config.get("max_position_embeddings")))
    params = dict(params)
    if kind == "yarn" and params.get("factor") is None and original and config.get("max_position_embeddings"):
        params["factor"] = config["max_position_embeddings"] / original  # as transformers 5 fills it
    needed = {"linear": ("factor",), "llama3": KEYS_OF_TYPE["llama3"][:3], "yarn": ("factor",)}[kind]
    missing = [k for k in needed if params.get(k) is None]
    if missing:
        raise ValueError(f"config.json: {where} of rope_type {kind!r} needs {missing}")
    out = {"rope_type": kind, "factor": _number(params["factor"], "factor", where)}
    if kind == "linear":
        return tuple(sorted(out.items()))
    if original is None:
        raise ValueError(f"config.json: {where} of rope_type {kind!r} needs original_max_position_embeddings")
    out["original_max_position_embeddings"] = _number(original, "original_max_position_embeddings", where)
    if kind == "llama3":
        for key in ("low_freq_factor", "high_freq_factor"):
            out[key] = _number(params[key], key, where)
        if out["high_freq_factor"] <= out["low_freq_factor"]:
            raise ValueError(f"config.json: {where} needs high_freq_factor > low_freq_factor")
        return tuple(sorted(out.items()))
    out["beta_fast"] = _number(params.get("beta_fast") or 32.0, "beta_fast", where)
    out["beta_slow"] = _number(params.get("beta_slow") or 1.0, "beta_slow", where)
    out["truncate"] = 1.0 if params.get("truncate", True) else 0.0
    out["attention_factor"] = _yarn_attention_factor(params, out["factor"], where)
    return tuple(sorted(out.items()))


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn_attention_factor(params: dict, factor: float, where: str) -> float:
    if params.get("attention_factor") is not None:
        return _number(params["attention_factor"], "attention_factor", where)
    mscale, all_dim = params.get("mscale"), params.get("mscale_all_dim")
    if mscale and all_dim:
        return _yarn_mscale(factor, float(mscale)) / _yarn_mscale(factor, float(all_dim))
    return _yarn_mscale(factor)


def inverse_frequencies(theta: float, head_dim: int, scaling: tuple | None) -> np.ndarray:
    """float64[Dh/2]: the rotary frequencies of ``rope_settings``' result."""
    inv = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    s = dict(scaling or ())
    kind = s.get("rope_type")
    if kind == "linear":
        return inv / s["factor"]
    if kind == "llama3":
        factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
        old = s["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        smooth = (old / wavelen - low) / (high - low)
        mid = (1 - smooth) * inv / factor + smooth * inv
        return np.where(wavelen > old / low, inv / factor, np.where(wavelen < old / high, inv, mid))
    if kind == "yarn":
        return _yarn_frequencies(inv, theta, head_dim, s)
    return inv


def _yarn_frequencies(inv: np.ndarray, theta: float, head_dim: int, s: dict) -> np.ndarray:
    def correction_dim(rotations: float) -> float:
        old = s["original_max_position_embeddings"]
        return head_dim * math.log(old / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(s["beta_fast"]), correction_dim(s["beta_slow"])
    if s["truncate"]:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = np.clip((np.arange(head_dim // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
    extrapolate = 1.0 - ramp
    return inv / s["factor"] * (1 - extrapolate) + inv * extrapolate


def attention_factor(scaling: tuple | None) -> float:
    """The factor cos and sin are multiplied by (YaRN's; 1 for every other type)."""
    return float(dict(scaling or ()).get("attention_factor", 1.0))
