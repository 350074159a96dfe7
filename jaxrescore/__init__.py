"""jaxrescore: speculative enumeration in JAX.

A cheap draft model builds the enumeration index; the expensive target scores only the candidates
a query returns, in one batched teacher-forcing forward. Every answer says whether it is PROVEN
the target's exact top-k (no assumption: the target's own next-token distributions bound every
sequence it did not score; ``top_k(k, prove=True)`` searches until it is), and whether it is
certified under an assumed draft/target gap (the spec's certificate).

The names below load on first use (PEP 562), so ``import jaxrescore`` and the command line's
``--help`` do not pay for importing JAX and flax.
"""

from __future__ import annotations

import importlib
import importlib.util

from jaxrescore._version import package_version as _package_version

# name -> the module that defines it.
_EXPORTS = {
    "AREnvelopeIndex": "jaxrescore.index",
    "CallableModel": "jaxrescore.models",
    "GapCarry": "jaxrescore.rescore",
    "NGramLM": "jaxrescore.models",
    "Quantizer": "jaxrescore.quantize",
    "RescoreResult": "jaxrescore.rescore",
    "RescoredIndex": "jaxrescore.rescore",
    "SeekIndex": "jaxrescore.index",
    "SequenceBatch": "jaxrescore.sequences",
    "TransformerConfig": "jaxrescore.models",
    "TransformerLM": "jaxrescore.models",
    "distill": "jaxrescore.models",
    "enable_compilation_cache": "jaxrescore.compilation_cache",
    "estimate_gap": "jaxrescore.rescore",
    "estimate_top_gap": "jaxrescore.rescore",
    "from_apply_fn": "jaxrescore.models",
    "from_equinox": "jaxrescore.models",
    "from_linen": "jaxrescore.models",
    "from_nnx": "jaxrescore.models",
    "from_pretrained": "jaxrescore.models",
    "init_carry": "jaxrescore.rescore",
    "load_model": "jaxrescore.models",
    "quantize_int8": "jaxrescore.models",
    # The pure core (``jaxrescore.rescore.rescore``) is exported as ``rescore_batch``: the name
    # ``rescore`` here would shadow the ``jaxrescore.rescore`` subpackage.
    "frontier_bound": "jaxrescore.rescore",
    "proof_verdict": "jaxrescore.rescore",
    "rescore_batch": "jaxrescore.rescore",
    "rescore_many": "jaxrescore.rescore",
    "rescore_sweep": "jaxrescore.rescore",
    "save_model": "jaxrescore.models",
    "top_k": "jaxrescore.quick",
    "train_lm": "jaxrescore.models",
}

__all__ = sorted(_EXPORTS)

__version__ = _package_version()


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        # Submodules (``jaxrescore.rescore``, ``jaxrescore.models``...) load on first use too.
        if importlib.util.find_spec(f"{__name__}.{name}") is None:
            raise AttributeError(f"module 'jaxrescore' has no attribute {name!r}")
        return importlib.import_module(f"{__name__}.{name}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
