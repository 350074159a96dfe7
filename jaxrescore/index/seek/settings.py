"""SeekSettings: what a SeekIndex is built with, checked once, and what follows from it.

The settings never change while the index grows (a shell may replace its limits or its progress
bar between calls); everything that does change lives in :class:`~jaxrescore.index.seek.state.SeekState`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from jaxrescore._checks import check_bool, check_choice, check_float, check_int
from jaxrescore.models.cache_sizes import memory_share
from jaxrescore.models.checked import check_protocol
from jaxrescore.quantize import MAX_BUDGET_BITS, Quantizer

# row_storage="auto" keeps whole rows up to this vocabulary, sparse rows beyond (see rows.py).
DENSE_ROW_VOCAB = 1024
ROW_STORAGE = ("auto", "dense", "sparse")


def default_max_bytes() -> int:
    """The default ``max_bytes``: 2 GiB, or an eighth of the machine's physical memory when that is
    less (but at least 64 MiB). With the transient peak of a build (about twice the limit) that
    keeps an index well inside the memory of a laptop or a notebook runtime."""
    return memory_share(2 << 30, 8)


class SeekSettings(NamedTuple):
    """The settings of one index (see :class:`~jaxrescore.index.seek.index.SeekIndex` for each).

    Attributes:
      model: the draft, an AutoregressiveEnumerable.
      quantizer: the fine buckets the order is made of.
      max_len, eos: the model's, checked.
      branch_cap: children kept per prefix (None: all).
      max_depth_bits: the largest bit budget the index deepens to.
      progress: the build's progress bar (None: after a second).
      chunk_rows: prefixes per model call.
      max_nodes, max_bytes: the size limits (max_nodes None: none besides max_bytes).
      decode_cache_bytes: key/value cache bytes of an incremental model (None: its default).
      row_storage: ``"auto"``, ``"dense"`` or ``"sparse"``.
    """

    model: Any
    quantizer: Quantizer
    max_len: int
    eos: int | None
    branch_cap: int | None
    max_depth_bits: float
    progress: bool | None
    chunk_rows: int
    max_nodes: int | None
    max_bytes: int
    decode_cache_bytes: int | None
    row_storage: str
    # Model rows the index may have evaluated in all (None: no cap). Set only for one growth by
    # count (SeekIndex.ensure_count(n, max_rows=...)): a query's budget, never stored.
    max_rows: int | None = None


class _AtLeastOneToken:
    """A model's protocol attributes as :func:`check_protocol` sees them while its vocabulary is
    still being inferred (``vocab_size`` 0 until a row names a token)."""

    def __init__(self, model):
        self.vocab_size = max(int(model.vocab_size), 1 if model.eos is None else int(model.eos) + 1)
        self.eos, self.max_len, self.next_logprobs = model.eos, model.max_len, model.next_logprobs


def make_settings(model, quantizer: Quantizer, *, branch_cap=None, max_depth_bits=64.0, progress=None,
                  chunk_rows=4096, max_nodes=None, max_bytes=None, decode_cache_bytes=None,
                  row_storage="auto") -> SeekSettings:
    """Checked settings (ValueError naming the argument, TypeError for a model that is not one)."""
    decode_cache_bytes = check_int(decode_cache_bytes, "decode_cache_bytes", minimum=0, allow_none=True)
    row_storage = check_choice(row_storage, "row_storage", ROW_STORAGE)
    # Attributes checked now (eos < vocab_size included); a duck-typed model's rows are checked on
    # every call (jaxrescore.models.checked.model_rows). An inferred vocabulary (CallableModel
    # without vocab_size) starts at 0 and grows; its rows are validated by the model itself.
    check_protocol(_AtLeastOneToken(model) if getattr(model, "vocab_inferred", False) else model, "model")
    eos = None if model.eos is None else check_int(model.eos, "model.eos", minimum=0)
    return SeekSettings(
        model=model,
        quantizer=quantizer,
        max_len=check_int(model.max_len, "model.max_len", minimum=1),
        eos=eos,
        branch_cap=check_int(branch_cap, "branch_cap", minimum=1, allow_none=True),
        max_depth_bits=check_float(max_depth_bits, "max_depth_bits", minimum=0.0, maximum=MAX_BUDGET_BITS,
                                   unit="bits"),
        progress=check_progress(progress),
        chunk_rows=check_int(chunk_rows, "chunk_rows", minimum=1),
        max_nodes=check_int(max_nodes, "max_nodes", minimum=1, allow_none=True),
        max_bytes=check_max_bytes(max_bytes),
        decode_cache_bytes=decode_cache_bytes,
        row_storage=row_storage,
    )


def check_progress(progress) -> bool | None:
    return None if progress is None else check_bool(progress, "progress")


def check_max_bytes(max_bytes) -> int:
    """``max_bytes`` checked; None means :func:`default_max_bytes`."""
    limit = check_int(max_bytes, "max_bytes", minimum=1, allow_none=True)
    return default_max_bytes() if limit is None else limit


def vocab(cfg: SeekSettings) -> int:
    """The model's vocabulary now (an inferred one grows)."""
    return int(cfg.model.vocab_size)


def sparse_rows(cfg: SeekSettings) -> bool:
    """Whether expanded prefixes keep sparse rows (see "Rows" in the package docstring)."""
    if cfg.row_storage == "auto":
        return vocab(cfg) > DENSE_ROW_VOCAB
    return cfg.row_storage == "sparse"


def max_budget(cfg: SeekSettings) -> int:
    """The deepest fine bucket the index may ever admit (``max_depth_bits``)."""
    return cfg.quantizer.budget(cfg.max_depth_bits)
