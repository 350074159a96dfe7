"""SeekIndex: random access by rank into a model's support, in exact quantized order.

Order. Sequences are ordered by *structural fine bucket* (the sum of the per-step buckets of
:class:`~jaxrescore.quantize.Quantizer`) ascending. Within one bucket the order is the depth-first
order that tries likelier tokens first: sequences compare step by step, a step ranking before
another when its log-prob is higher, equal log-probs by token id (the reference library's order).
The draft log-prob an index reports is the float64 sum of the model's per-step log-probs, each
clipped to ``<= 0`` first (so float noise cannot break the bucket bound).

Build. The index holds the prefix tree of every sequence within a bit budget. It is built level by
level: all live prefixes of one depth go to ``model.next_logprobs`` in chunks of ``chunk_rows``
(shapes padded to powers of two), the children whose cumulative bucket stays within the budget form
the next depth. The next-token rows of expanded prefixes are kept, so deepening to a larger budget
reads the newly admitted children off them and pays forwards only for prefixes it has never seen.
Each kept row also remembers its smallest child bucket beyond the budget built (the unexpanded
frontier, :attr:`RowChunk.nxt`): a deepening from budget ``b`` to ``b'`` reads only the rows with
a child in ``(b, b']``, so its cost follows the nodes it admits, not the rows kept. After each
build one vectorised pass per depth sorts siblings, counts the sequences below every prefix (the
count DP, bottom-up) and gives each sequence its depth-first position (top-down); the sequences are
then sorted by (bucket, position). Counts are int64: every counted sequence is one node the index
holds within ``max_bytes``, so no count can come near 2**63.

Growth. :meth:`SeekIndex.ensure_count` grows by measurement, never by a guess: it deepens pass by
pass, each pass at most to the next whole bit beyond the budget built (``GROWTH_STEP_BITS``), less
(down to a quarter bit, ``MAX_SUBSTEPS``) when the growth the last pass measured reaches ``n``
sooner, straight to the first bucket holding a child when that is further, and stops as soon as
the index HOLDS ``n`` sequences. Each pass admits, best-first in the index's order, exactly the prefixes between the two
budgets. So the index ends at a budget no larger than the smallest whole-bit budget (counted from
the one built at the call) whose sequences number ``n`` or more: it holds no more sequences, and
expands no prefix, that a one-bit-at-a-time growth would not; the overshoot is at most the last
bit's worth.
Nothing is predicted, so nothing is refused on a prediction: the limits stop a pass only on what it
is about to allocate.

Rows. A wide vocabulary (``row_storage="auto"``: V > ``DENSE_ROW_VOCAB``; or ``"sparse"``) keeps
each expanded prefix's row sparse (:mod:`jaxrescore.index.rows`): the cells whose child could enter
within ``KEEP_MARGIN_BITS`` beyond the budget, and a bound on the rest. Memory
then grows with the sequences indexed, not with V. The bound keeps the frontier (and so
``bucket_bound``) sound, and a deepening whose budget reaches a row's bound runs the model on that
prefix again before admitting its children (counted in ``forwards``). A table model of this
package that offers ``next_logprobs_above(prefixes, lengths, thresholds)``
(:class:`~jaxrescore.models.NGramLM`, prompted or not) hands over the kept cells and a bound itself, so no
``V``-wide row is ever built (except where ``branch_cap`` or the ``max_len`` cut needs one, and
the root's).

Limits. ``max_bytes`` (default :func:`default_max_bytes`) and ``max_nodes`` cap the index's size,
counted as ``NODE_BYTES`` per prefix-tree node plus ``4 * V`` bytes per kept whole row (a sparse
row: 8 bytes per kept cell and 12 more; rows yet to come are charged the average so far). They are
enforced on what is actually built: every admission of children, and every sparse row run again,
is checked against them before it is allocated (the children admitted, and the rows their
expansion will need). A pass that would pass a limit is undone whole, so the index stays
consistent: a budget-complete prefix tree. Growth by count (``ensure_count``, ``slice``,
``threshold``) then retries with smaller steps down to one bucket, KEEPS every pass that fitted and
raises :class:`IndexLimitError` (a ValueError) naming the request, the limit, the size and what the
index now holds; the index keeps answering from it. A one-pass request (``ensure_bits``, ``count``,
``count_bracket``, ``rank_bracket``, the constructor) leaves the index as it was. Transient memory
during a build can reach about twice ``max_bytes`` (sorting, merging row chunks), so set it to
about half of what may be used.

Soundness. :meth:`SeekIndex.bucket_bound` bounds the draft log-prob of every sequence ranked ``>= n``
or never indexed. A prefix's bucket lower-bounds the bucket of all its completions, so the index
tracks the smallest bucket of everything it cut: children beyond the budget (recomputed at every
build), children dropped by ``branch_cap`` and, for a terminating model, prefixes cut at ``max_len``
(permanent). A terminating model's mass beyond ``max_len`` is treated like any other cut: it keeps
``truncated`` True and stays under the bound, as a target model may continue where the draft stops.
A finite step deeper than ``quantize.MAX_STEP_BITS`` (a logit mask such as ``-1e30``) saturates at a
bucket no budget reaches (``max_depth_bits <= quantize.MAX_BUDGET_BITS``): such children are never
indexed, stay cut (``truncated`` True, never "exhausted") and are covered by the bound, which the
smaller, saturated bucket only loosens. Only ``-inf`` steps are outside the support.

Threads. Every public method and property takes the index's re-entrant lock, so one index may be
shared by threads (deepening by one waits for another's); the lock is left out of pickles.
"""

from __future__ import annotations

import contextlib
import functools
import math
import numbers
import os
import threading

import numpy as np
from tqdm.auto import tqdm

from jaxrescore.index.rows import RowChunk
from jaxrescore.models.base import AutoregressiveEnumerable
from jaxrescore.models.checked import check_protocol, model_rows, own_rows
from jaxrescore.quantize import LN2, MAX_BUDGET_BITS, NO_BUCKET, TOL, Quantizer
from jaxrescore.sequences import bucket_size
from jaxrescore.typing import ArrayLike, PathLike, Tokens

# Seconds a build must run before its progress bar appears (progress=None).
PROGRESS_DELAY_S = 1.0
# Bytes charged per prefix-tree node: 37 of node columns (parent, token, depth, fb, lp, step,
# terminal), 24 of the sorted sequence arrays (id, bucket, log-prob) and 8 of an expanded node's
# next bucket beyond the budget (RowChunk.nxt), rounded up.
NODE_BYTES = 72
# Cells of kept next-token rows examined at once: bounds the temporaries of a scan (~40 B a cell).
CELL_BLOCK = 1 << 20
# Cells (prefixes x V) of whole rows one model call may return: bounds a call at a wide vocabulary.
ROW_CELLS = 1 << 24
# Growth by count deepens to the next multiple of this many bits per pass: the index then ends at
# most one step's worth of sequences past what was asked. Passes cost what they admit (the kept
# rows remember their frontier), so small steps are cheap; a whole bit is the reference grid.
GROWTH_STEP_BITS = 1.0
# ... and a pass goes a smaller part of a step (at least 1 / MAX_SUBSTEPS of it) when the growth
# measured by the last pass says n is reached sooner.
MAX_SUBSTEPS = 4
# Ranks at or beyond this never fit any index (int64 positions).
_MAX_RANK = 1 << 62
# row_storage="auto" keeps whole rows up to this vocabulary, sparse rows beyond (see rows.py).
DENSE_ROW_VOCAB = 1024
# A sparse row keeps the cells whose child could enter within this many bits beyond the budget
# built: a deepening within that margin needs no new forward. A fixed margin, not one growing
# with the budget: half the budget kept thousands of cells a row at V=50,257 (an order-5 n-gram
# draft's index passed 3.3 GB of RSS before 100,000 sequences), for deepenings of a few bits.
KEEP_MARGIN_BITS = 8.0
ROW_STORAGE = ("auto", "dense", "sparse")
# Kept row chunks of one kind (whole or sparse) left unmerged after a pass (see _compact_rows).
COMPACT_CHUNKS = 16
# The least bytes of a kept sparse row: its CSR offset (8) and its bound on the cells left out (4).
SPARSE_ROW_BYTES = 12


def default_max_bytes() -> int:
    """The default ``max_bytes``: 2 GiB, or an eighth of the machine's physical memory when that is
    less (but at least 64 MiB). With the transient peak of a build (about twice the limit) that
    keeps an index well inside the memory of a laptop or a notebook runtime."""
    cap = 2 << 30
    try:
        phys = int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return cap
    return int(min(cap, max(phys // 8, 64 << 20)))


class IndexLimitError(ValueError):
    """A SeekIndex deepening would pass ``max_nodes`` or ``max_bytes``.

    Raised before the allocation that would pass the limit (or as soon as the cells kept by a
    model call's rows pass it); the pass is undone whole, so the index stays consistent and keeps
    answering within what it holds. Growth by count (``ensure_count``, ``slice``, ``threshold``)
    keeps the passes that fitted before it; a one-pass request leaves the index as it was. The
    message names the request, the limit, the size needed and what the index holds."""


def _int_arg(value, name: str, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or int(value) < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _bits_arg(value, name: str, *, maximum: float = math.inf) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Real)
        or not math.isfinite(value)
        or not 0 <= value <= maximum
    ):
        accepted = "a finite number of bits >= 0" if maximum == math.inf else f"a number of bits in [0, {maximum:g}]"
        raise ValueError(f"{name} must be {accepted}, got {value!r}")
    return float(value)


def _limit_arg(value, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or int(value) < 1:
        raise ValueError(f"{name} must be None or an integer >= 1, got {value!r}")
    return int(value)


def _show(n: int) -> str:
    """An int for a message: exact with thousands separators, or a power of two past 60 digits
    (Python refuses to print ints past 4,300 digits)."""
    return f"{n:,}" if n.bit_length() <= 200 else f"about {'-' if n < 0 else ''}2**{n.bit_length() - 1}"


def _mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:,.1f} MiB" if nbytes < 2**50 else f"{nbytes:.3g} bytes"


def _locked(method):
    """Run ``method`` holding the index's re-entrant lock (see "Threads" in the module docstring)."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)

    return wrapper


class _Nodes:
    """Columnar, append-only store of prefix-tree nodes; node 0 is the root (the empty prefix).

    Columns: parent int64, token int32, depth int32, fb int64 (cumulative fine bucket), lp float64
    (cumulative clipped log-prob), step float32 (the model's own log-prob of the last token),
    terminal bool (the node is a complete sequence of the support). Rows below ``n`` are never
    written again, so truncating ``n`` undoes an append.
    """

    DTYPES = {
        "parent": np.int64,
        "token": np.int32,
        "depth": np.int32,
        "fb": np.int64,
        "lp": np.float64,
        "step": np.float32,
        "terminal": np.bool_,
    }

    def __init__(self, columns: dict | None = None):
        if columns is None:
            columns = {k: np.zeros(1, dt) for k, dt in self.DTYPES.items()}
            columns["parent"][0] = -1
        self.n = int(columns["parent"].shape[0])
        self.cols = {k: np.asarray(columns[k], dt).copy() for k, dt in self.DTYPES.items()}

    def __getattr__(self, name):
        cols = self.__dict__.get("cols")
        if cols is not None and name in cols:
            return cols[name][: self.n]
        raise AttributeError(name)

    def add(self, **values) -> np.ndarray:
        """Append nodes (one array per column, equal lengths); returns their ids int64[K]."""
        k = len(values["parent"])
        if self.n + k > self.cols["parent"].shape[0]:
            cap = max(2 * self.cols["parent"].shape[0], self.n + k)
            for name, col in self.cols.items():
                grown = np.zeros(cap, col.dtype)
                grown[: self.n] = col[: self.n]
                self.cols[name] = grown
        for name, col in self.cols.items():
            col[self.n : self.n + k] = values[name]
        ids = np.arange(self.n, self.n + k, dtype=np.int64)
        self.n += k
        return ids

    def export(self) -> dict:
        return {k: v[: self.n].copy() for k, v in self.cols.items()}


class SeekIndex:
    """Exact quantized-order index over an AutoregressiveEnumerable model (see the module docstring).

    Args:
      model: vocab_size, eos, max_len, ``next_logprobs(prefixes int32[B, T], lengths int32[B])``.
      bin_width_bits, oversample: the :class:`~jaxrescore.quantize.Quantizer`.
      branch_cap: keep at most this many children per prefix (the likeliest, ties by token id);
        the rest are dropped for good, counted in ``dropped_upper`` and covered by ``bucket_bound``.
      max_depth_bits: the largest bit budget the index ever deepens to; at most
        ``quantize.MAX_BUDGET_BITS`` (2**29).
      initial_bits: the budget built by the constructor.
      progress: tqdm bar over model rows: None shows it once a build runs over a second, True
        always, False never.
      chunk_rows: prefixes per ``next_logprobs`` call.
      max_nodes: the most prefix-tree nodes the index may hold (None: no node limit besides
        ``max_bytes``).
      max_bytes: the most bytes the index may hold, counted as ``NODE_BYTES`` (72) per node plus
        ``4 * V`` per kept next-token row; None means :func:`default_max_bytes` (2 GiB, or an
        eighth of physical memory if less). A pass that would pass either limit raises
        :class:`IndexLimitError` before allocating and is undone (growth by count keeps the
        passes that fitted before it).
      decode_cache_bytes: for a model that decodes incrementally (a TransformerLM, its int8 twin,
        a ``from_apply_fn`` model with a cache-aware step, or a prompted one), the most bytes of
        key/value caches kept between levels (see :mod:`jaxrescore.models.decoding`): a prefix
        whose parent's cache is held costs one token position. None: the session's default
        (1 GiB, or a sixteenth of physical memory if less); 0: every row is a full forward.
        Caches live on the model's device, outside ``max_bytes``.
      row_storage: ``"auto"`` (whole rows up to V = ``DENSE_ROW_VOCAB``, sparse beyond),
        ``"dense"`` or ``"sparse"``: how expanded prefixes' next-token rows are kept (see "Rows").

    Counters: ``forwards`` (model rows evaluated, padding excluded), ``builds`` (build passes),
    ``positions`` (token positions those rows cost: one per row whose parent's cache was held,
    else the prefix, its prompt and BOS).

    Memory: :attr:`nbytes` as counted above; a build's transient peak is up to about twice that.
    """

    def __init__(
        self,
        model: AutoregressiveEnumerable,
        *,
        bin_width_bits: float = 1.0,
        oversample: int = 8,
        branch_cap: int | None = None,
        max_depth_bits: float = 64.0,
        initial_bits: float = 8.0,
        progress: bool | None = None,
        chunk_rows: int = 4096,
        max_nodes: int | None = None,
        max_bytes: int | None = None,
        decode_cache_bytes: int | None = None,
        row_storage: str = "auto",
    ):
        self._setup(
            model,
            Quantizer(bin_width_bits, oversample),
            branch_cap,
            max_depth_bits,
            progress,
            chunk_rows,
            max_nodes=max_nodes,
            max_bytes=max_bytes,
            decode_cache_bytes=decode_cache_bytes,
            row_storage=row_storage,
        )
        initial = _bits_arg(initial_bits, "initial_bits")
        try:
            with self._lock:
                self._deepen_to(
                    self.quantizer.budget(min(initial, self.max_depth_bits)),
                    f"SeekIndex(initial_bits={initial_bits!r})",
                )
        except IndexLimitError as err:
            err.args = (
                f"{err.args[0]} Pass a smaller initial_bits, a larger max_bytes/max_nodes, or branch_cap to "
                "keep fewer children per prefix.",
            )
            raise

    def _setup(self, model, quantizer, branch_cap, max_depth_bits, progress, chunk_rows, *, max_nodes=None,
               max_bytes=None, decode_cache_bytes=None, row_storage="auto"):
        """The settings and the empty state, for a new index and a loaded one alike."""
        self.decode_cache_bytes = None if decode_cache_bytes is None else _int_arg(
            decode_cache_bytes, "decode_cache_bytes", minimum=0
        )
        if row_storage not in ROW_STORAGE:
            raise ValueError(f"row_storage must be one of {ROW_STORAGE}, got {row_storage!r}")
        self.row_storage = row_storage
        # Attributes checked now (eos < vocab_size included); a duck-typed model's rows are
        # checked on every call (jaxrescore.models.checked.model_rows).
        # An inferred vocabulary (CallableModel without vocab_size) starts at 0 and grows; its
        # rows are validated by the model itself (as jaxrescore.models.checked.checked_model does).
        if getattr(model, "vocab_inferred", False):
            check_protocol(_AtLeastOneToken(model), "model")
        else:
            check_protocol(model, "model")
        self.model = model
        self.max_len = _int_arg(model.max_len, "model.max_len", minimum=1)
        self.eos = None if model.eos is None else _int_arg(model.eos, "model.eos", minimum=0)
        self.quantizer = quantizer
        self.branch_cap = None if branch_cap is None else _int_arg(branch_cap, "branch_cap", minimum=1)
        self.max_depth_bits = _bits_arg(max_depth_bits, "max_depth_bits", maximum=MAX_BUDGET_BITS)
        if progress not in (None, True, False):
            raise ValueError(f"progress must be None, True or False, got {progress!r}")
        self.progress = progress
        self.chunk_rows = _int_arg(chunk_rows, "chunk_rows", minimum=1)
        self.max_nodes = _limit_arg(max_nodes, "max_nodes")
        limit = _limit_arg(max_bytes, "max_bytes")
        self.max_bytes = default_max_bytes() if limit is None else limit
        self._lock = threading.RLock()
        self.forwards = 0
        self.builds = 0
        self.positions = 0
        self._session = None  # the DecodingSession of incremental models (built on first use)
        self._nodes = _Nodes()
        self._budget = -1  # deepest fine bucket admitted; -1 = nothing built yet
        self._chunks: list[RowChunk] = []  # expanded nodes' next-token rows, cut cells at -inf
        self._n_rows = 0  # rows kept, over all chunks
        self._width = 0  # the widest kept row (an inferred vocabulary grows)
        self._pending = 0  # during a pass: live nodes admitted and not yet expanded (rows to come)
        self._request = ""  # during a deepening: the public call it serves (for error messages)
        self._frontier_min = NO_BUCKET  # smallest bucket of a child beyond the budget
        self._cut_min = NO_BUCKET  # smallest bucket of a child dropped for good by branch_cap
        self._length_cut_min = NO_BUCKET  # smallest bucket of a terminating prefix cut at max_len
        # upper bound on support sequences below branch_cap drops: an exact int below 2**63, beyond
        # that a float rounded up (inf if it overflows), so it always prints and saves
        self._dropped: int | float = 0
        self._root_row: np.ndarray | None = None
        self._rank()

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state.pop("_lock", None)  # a lock cannot be pickled; each copy gets its own
        state["_session"] = None  # device caches: rebuilt on demand
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.RLock()

    # -- state ---------------------------------------------------------------------------------------

    @_locked
    def __repr__(self) -> str:
        return (
            f"SeekIndex(model={type(self.model).__name__}, sequences={len(self):,}, "
            f"built_bits={self.built_bits:g}, truncated={self.truncated}, forwards={self.forwards:,})"
        )

    @_locked
    def __len__(self) -> int:
        """Sequences currently indexed."""
        return int(self._seq_id.size)

    @property
    @_locked
    def built_bits(self) -> float:
        """The bit budget built so far."""
        return max(self._budget, 0) / self.quantizer.scale

    @property
    @_locked
    def truncated(self) -> bool:
        """True while some sequence of the support may be missing: children beyond the budget
        (saturated, improbably deep steps included), ``branch_cap`` drops, or prefixes of a
        terminating model cut at ``max_len``."""
        return min(self._frontier_min, self._cut_min, self._length_cut_min) < NO_BUCKET

    @property
    def exhausted(self) -> bool:
        """True iff the index provably holds the whole support (nothing was ever cut)."""
        return not self.truncated

    @property
    @_locked
    def dropped_upper(self) -> int | float:
        """Upper bound on support sequences permanently dropped by ``branch_cap`` (0 without it):
        each dropped prefix counts every structurally possible completion. An exact int below
        2**63; beyond that a float rounded up (``inf`` past float range). ``inf`` also when drops
        exist and the model's vocabulary is inferred (it may still grow)."""
        if self._dropped and getattr(self.model, "vocab_inferred", False):
            return math.inf
        return self._dropped

    @property
    @_locked
    def nbytes(self) -> int:
        """The index's size as ``max_bytes`` counts it: ``NODE_BYTES`` per node plus ``4 * V`` per
        kept whole next-token row, and the bytes of the sparse rows."""
        return self._nodes.n * NODE_BYTES + self._rows_bytes()

    @_locked
    def bucket_bound(self, n: int, *, length_cuts: bool = True) -> float:
        """A sound upper bound on the draft log-prob of every support sequence ranked ``>= n`` or
        not indexed at all; ``-inf`` iff provably no such sequence exists.

        It is the best-case edge (``Quantizer.edge`` over ``max_len`` steps) of the smallest bucket
        among item ``n`` and every cut prefix; a prefix's bucket lower-bounds its completions'.

        Args:
          n: a rank >= 0.
          length_cuts: include the prefixes of a terminating model cut at ``max_len`` (their
            completions are longer than ``max_len``). False is sound only for a consumer whose own
            support ends at ``max_len`` too, e.g. a target with ``max_len`` no larger than this
            model's: RescoredIndex passes it then.
        """
        n = _int_arg(n, "n", minimum=0)
        fb = min(self._frontier_min, self._cut_min)
        if length_cuts:
            fb = min(fb, self._length_cut_min)
        if n < len(self):
            fb = min(fb, int(self._seq_fb[n]))
        if fb >= NO_BUCKET:
            return -math.inf
        return float(self.quantizer.edge(fb, self.max_len))

    # -- deepening -----------------------------------------------------------------------------------

    @property
    def _max_budget(self) -> int:
        return self.quantizer.budget(self.max_depth_bits)

    def _dense_row_bytes(self) -> int:
        """Bytes of one kept whole row (the widest seen, or the model's vocabulary)."""
        return 4 * max(int(self.model.vocab_size), self._width, 1)

    def _rows_bytes(self) -> int:
        """Bytes of the kept rows: whole rows at :meth:`_dense_row_bytes`, sparse ones as stored."""
        dense = sum(c.size for c in self._chunks if not c.sparse)
        return dense * self._dense_row_bytes() + sum(c.nbytes for c in self._chunks if c.sparse)

    def _row_bytes(self) -> int:
        """Bytes charged for one row still to come, before it is computed: a whole row, or (sparse
        rows) the least a sparse row takes (its offset and bound, ``SPARSE_ROW_BYTES``): what is
        certain, not a guess. The cells it keeps are counted once it is stored (each model call's
        rows are checked as they come)."""
        return self._dense_row_bytes() if not self._sparse_rows() else SPARSE_ROW_BYTES

    def _sparse_rows(self) -> bool:
        if self.row_storage == "auto":
            return int(self.model.vocab_size) > DENSE_ROW_VOCAB
        return self.row_storage == "sparse"

    def _capacity(self) -> int:
        """The most sequences any deepening of this index could ever hold (one node each)."""
        cap = self.max_bytes // NODE_BYTES
        return cap if self.max_nodes is None else min(cap, self.max_nodes)

    @_locked
    def ensure_bits(self, bits: float) -> "SeekIndex":
        """Deepen until every sequence within ``bits`` bits (capped at ``max_depth_bits``) is held.
        IndexLimitError if that would pass ``max_nodes``/``max_bytes`` (the index is unchanged)."""
        value = min(_bits_arg(bits, "bits"), self.max_depth_bits)
        with self._atomic():
            self._deepen_to(self.quantizer.budget(value), f"ensure_bits(bits={bits!r})")
        return self

    @_locked
    def ensure_count(self, n: int) -> "SeekIndex":
        """Deepen until ``len(self) >= n``, the support is exhausted or ``max_depth_bits`` is
        reached, at most one whole bit a pass (see "Growth" in the module docstring): the index
        ends at or below the smallest whole-bit budget that holds ``n``. IndexLimitError if a
        pass would pass ``max_nodes``/``max_bytes`` even one bucket deep; the passes that fitted
        are kept and the index keeps answering from them."""
        n = _int_arg(n, "n", minimum=0)
        with self._atomic(keep_limited=True):
            self._deepen_for_count(n, f"ensure_count(n={_show(n)})")
        return self

    def _deepen_to(self, budget: int, request: str) -> None:
        """Build to ``budget`` in one pass (no-op if built)."""
        if budget <= self._budget:
            return
        if self._budget >= 0 and self._frontier_min > budget:
            self._budget = budget  # nothing new fits: no pass needed
            return
        self._grow(budget, request)

    def _can_deepen(self, n: int) -> bool:
        return len(self) < n and self._frontier_min < NO_BUCKET and self._budget < self._max_budget

    def _deepen_for_count(self, n: int, request: str) -> None:
        """Deepen pass by pass until ``n`` sequences are held (or nothing more can be)."""
        n = min(n, _MAX_RANK)  # no index holds more: larger requests mean "as many as there are"
        while self._can_deepen(n):
            self._grow_fitting(self._next_step(n), request)

    def _next_step(self, n: int) -> int:
        """The budget of the next pass of growth by count towards ``n`` sequences: the next
        multiple of ``GROWTH_STEP_BITS`` beyond the budget built, or less when the growth MEASURED
        by the last pass reaches ``n`` sooner (never less than ``1 / MAX_SUBSTEPS`` of a step, so
        at most that many passes a step), or the first bucket holding a child when that is
        further (no empty passes); within ``max_depth_bits``. It never passes the next whole
        step, so the index ends at or below the whole-step budget that holds ``n``."""
        q, b = self.quantizer, self._budget
        step = max(GROWTH_STEP_BITS, 1.0 / q.scale)
        target = q.budget((math.floor(b / q.scale / step + 1e-9) + 1) * step)
        seen = getattr(self, "_measured", None)  # (budget, sequences) before the last pass
        if seen is not None and 0 < seen[1] < len(self) < n and seen[0] < b:
            per_bucket = math.log(len(self) / seen[1]) / (b - seen[0])
            reach = b + math.ceil(math.log(n / len(self)) / per_bucket)
            least = b + max(1, math.ceil(step * q.scale / MAX_SUBSTEPS))
            target = min(target, max(reach, least))
        return min(max(target, b + 1, self._frontier_min), self._max_budget)

    def _grow_fitting(self, target: int, request: str) -> None:
        """One pass to ``target``; if it would pass a limit, retry halfway back (never below the
        first bucket beyond the budget) before giving up."""
        while True:
            if self._frontier_min > target:
                self._budget = max(self._budget, target)
                return
            try:
                self._grow(target, request)
                return
            except IndexLimitError:
                smaller = max(self._frontier_min, (self._budget + target) // 2)
                if smaller >= target:
                    raise
                target = smaller

    def _advice(self) -> str:
        return (
            f"The index holds {len(self):,} sequences within {self.built_bits:g} bits "
            f"({self._nodes.n:,} nodes, {_mib(self.nbytes)}) and keeps answering within them. Ask for "
            "fewer sequences or bits, raise max_bytes/max_nodes, or pass branch_cap to keep fewer "
            "children per prefix."
        )

    def _check_room(self, new_nodes: int, new_live: int) -> None:
        """Raise IndexLimitError if adding ``new_nodes`` nodes, ``new_live`` of them to be expanded,
        would pass a limit (rows still owed to admitted live nodes included)."""
        nodes = self._nodes.n + new_nodes
        rows = self._n_rows + self._pending + new_live
        nbytes = nodes * NODE_BYTES + self._rows_bytes() + (self._pending + new_live) * self._row_bytes()
        if self.max_nodes is not None and nodes > self.max_nodes:
            limit = f"max_nodes={self.max_nodes:,}"
        elif nbytes > self.max_bytes:
            limit = f"max_bytes={self.max_bytes:,} ({_mib(self.max_bytes)})"
        else:
            return
        kind = "whole" if not self._sparse_rows() else "sparse"
        raise IndexLimitError(
            f"{self._request}: deepening to {self._pass_budget / self.quantizer.scale:g} bits needs at least "
            f"{nodes:,} prefix-tree nodes and {rows:,} {kind} next-token rows, {_mib(nbytes)}, over {limit}; "
            "the pass was stopped there (before allocating more) and undone."
        )

    # -- snapshots (a failed call leaves the index as it was) ----------------------------------------

    @contextlib.contextmanager
    def _atomic(self, keep_limited: bool = False):
        """Undo every pass of a public call that fails, and end a limit error with what is left.
        ``keep_limited``: on IndexLimitError keep the passes that fitted (each pass is undone
        whole on its own, so the index stays consistent)."""
        saved = self._snapshot()
        try:
            yield
        except BaseException as err:
            limited = isinstance(err, IndexLimitError)
            if not (keep_limited and limited):
                self._restore(saved)
            if limited and not getattr(err, "advised", False):
                err.args = (f"{err.args[0]} {self._advice()}",) + err.args[1:]
                err.advised = True
            raise

    def _snapshot(self) -> dict:
        names = ("_budget", "_frontier_min", "_cut_min", "_length_cut_min", "_dropped", "forwards", "builds", "positions",
                 "_root_row", "_seq_id", "_seq_fb", "_seq_lp", "_n_rows", "_width")
        state = {name: getattr(self, name) for name in names}
        state["_measured"] = getattr(self, "_measured", None)
        state["n_nodes"] = self._nodes.n
        state["_chunks"] = list(self._chunks)  # chunks are replaced, never changed in place
        return state

    def _restore(self, state: dict) -> None:
        state = dict(state)
        self._nodes.n = state.pop("n_nodes")
        self._pending = 0
        for name, value in state.items():
            setattr(self, name, value)

    # -- building ------------------------------------------------------------------------------------

    def _grow(self, budget: int, request: str) -> None:
        """One build pass, all or nothing: a model error or a limit midway leaves the index as it was."""
        saved = self._snapshot()
        self._request, self._pass_budget = request, budget
        before = (self._budget, len(self))
        try:
            self._grow_pass(budget)
            self._compact_rows()
            self._rank()
        except BaseException:
            self._restore(saved)
            raise
        self._measured = before  # with the index as built now: the growth measured by this pass

    def _grow_pass(self, budget: int) -> None:
        """Admit every child with bucket in (old budget, budget], level by level."""
        old = self._budget
        pending: list[list[np.ndarray]] = [[] for _ in range(self.max_len + 1)]
        self._pending = 0
        if old < 0:
            self._check_room(0, 1)
            pending[0].append(np.zeros(1, np.int64))
            self._pending = 1
        self._refresh(budget)
        # the kept rows: only those with a child in (old, budget] are read (their ``nxt`` says so)
        frontier, kept = NO_BUCKET, []
        for chunk in self._chunks:
            nxt = chunk.nxt
            if nxt is not None:
                hit = nxt <= budget
                if not hit.any():
                    kept.append(chunk)
                    frontier = min(frontier, int(nxt.min(initial=NO_BUCKET)))
                    continue
                nxt = nxt.copy()  # a stored chunk is never changed in place (snapshots share it)
                nxt[hit] = self._admit(chunk.select(hit) if not hit.all() else chunk, old, budget, pending)
            else:
                nxt = self._admit(chunk, old, budget, pending)
            kept.append(chunk.with_next(nxt))
            frontier = min(frontier, int(nxt.min(initial=NO_BUCKET)))
        self._chunks = kept
        with tqdm(
            unit="rows",
            desc="SeekIndex build",
            disable=self.progress is False,
            delay=0 if self.progress else PROGRESS_DELAY_S,
            leave=False,
        ) as bar:
            for depth in range(self.max_len):
                if not pending[depth]:
                    continue
                todo = np.concatenate(pending[depth])
                pending[depth] = []
                per = self._rows_per_call(depth)
                for lo in range(0, todo.size, per):
                    ids = todo[lo : lo + per]
                    chunk = self._expand(ids, depth, budget)
                    self._pending -= ids.size
                    self._check_room(0, 0)  # the cells the rows kept, now that they are known
                    chunk.nxt = self._admit(chunk, -1, budget, pending)  # a fresh chunk: set, not changed
                    frontier = min(frontier, int(chunk.nxt.min(initial=NO_BUCKET)))
                    bar.update(ids.size)
                    bar.set_postfix(depth=depth, bits=f"{budget / self.quantizer.scale:g}", refresh=False)
        self._frontier_min = frontier
        self._budget = budget
        self.builds += 1

    def _rows_per_call(self, depth: int) -> int:
        """Prefixes per model call: ``chunk_rows``, fewer for whole rows of a wide vocabulary (a
        call's whole rows stay within ``ROW_CELLS`` cells)."""
        if self._above_rows(depth):
            return self.chunk_rows
        return max(1, min(self.chunk_rows, ROW_CELLS // max(int(self.model.vocab_size), self._width, 1)))

    def _above_rows(self, depth: int) -> bool:
        """Whether the rows of prefixes of length ``depth`` come sparse from the model itself
        (``next_logprobs_above``: a table model that never builds ``V`` cells), not as whole rows
        sparsified here: sparse storage, one of this package's models, and no cut at this depth
        (cuts need whole rows; the root's row is kept whole)."""
        if depth == 0 or not self._sparse_rows() or self._rows_above() is None:
            return False
        capped = self.branch_cap is not None and self.branch_cap < int(self.model.vocab_size)
        return not capped and not (self.eos is not None and depth + 1 == self.max_len)

    def _expand(self, ids: np.ndarray, depth: int, budget: int) -> RowChunk:
        """Run the model on the prefixes of nodes ``ids`` (all of length ``depth``) and keep their
        rows (after the cuts) for a build up to ``budget``."""
        if not self._above_rows(depth):
            return self._keep(ids, self._cut(ids, depth, self._forward(ids, depth)), budget)
        return self._store(self._expand_above(ids, depth, budget), int(self.model.vocab_size))

    def _rows_above(self):
        """The model's own ``next_logprobs_above`` (a table model of this package), or for a
        prompted one (:class:`~jaxrescore.models.prompt.PromptedModel` itself, over such a base)
        its base's with the prompt put before every prefix: the rows ``PromptedModel.next_logprobs``
        computes, as that is one call of the base on the same tokens. None otherwise."""
        model = self.model
        if own_rows(model, "next_logprobs_above"):
            return model.next_logprobs_above
        from jaxrescore.models.prompt import PromptedModel, prepend

        base = getattr(model, "base", None)
        if type(model) is not PromptedModel or base is None or not own_rows(base, "next_logprobs_above"):
            return None
        if getattr(base, "prompt", None) is not None or callable(getattr(base, "decode_step", None)):
            return None  # a base that is itself prompted, or decodes incrementally: its own rows

        def above(prefixes, lengths, thresholds):
            toks, lens = prepend(model.prompt, np.asarray(prefixes, np.int32), np.asarray(lengths, np.int32))
            return base.next_logprobs_above(toks, lens, thresholds)

        return above

    def _expand_above(self, ids: np.ndarray, depth: int, budget: int) -> RowChunk:
        """The sparse rows the model gives itself (``next_logprobs_above``) for the prefixes of
        nodes ``ids``: the cells a build up to ``budget`` keeps, and the bound on the rest."""
        ptr, tok, val, rest = self._rows_above()(
            self._fixed_prefixes(ids, depth), np.full(ids.size, depth, np.int32), self._keep_threshold(ids, budget)
        )
        self._count_rows(ids.size, depth)
        return RowChunk(ids, ptr=ptr, tok=tok, val=val, rest=rest)

    def _keep_threshold(self, ids: np.ndarray, budget: int) -> np.ndarray:
        """float32[b]: the cells a sparse row of nodes ``ids`` keeps in a build up to ``budget``
        (those a deepening within ``KEEP_MARGIN_BITS`` beyond it could admit)."""
        keep_hi = budget + math.ceil(KEEP_MARGIN_BITS * self.quantizer.scale)
        return self._threshold(self._nodes.fb[ids], keep_hi)

    def _keep(self, ids: np.ndarray, rows: np.ndarray, budget: int) -> RowChunk:
        """Store fresh rows (after the cuts): whole, or sparse with a bound on the rest."""
        if self._sparse_rows():
            chunk = RowChunk.sparsify(ids, rows, self._keep_threshold(ids, budget))
        else:
            chunk = RowChunk(ids, dense=rows)
        return self._store(chunk, rows.shape[1])

    def _store(self, chunk: RowChunk, width: int) -> RowChunk:
        """Add a chunk of kept rows (whole rows ``width`` wide, or sparse ones of that vocabulary)."""
        self._chunks.append(chunk)
        self._n_rows += chunk.size
        self._width = max(self._width, width)
        return chunk

    def _refresh(self, budget: int) -> None:
        """Run the model again on every kept sparse row whose left-out cells could enter within
        ``budget`` (their bound ``rest`` says so), replacing those rows; nothing else changes."""
        redo, chunks = [], []
        for chunk in self._chunks:
            if chunk.sparse:
                finite = np.isfinite(chunk.rest)
                need = np.zeros(chunk.size, bool)
                if finite.any():
                    sb = self._step_buckets(chunk.rest[finite])
                    need[finite] = self._nodes.fb[chunk.ids[finite]] + sb <= budget
                if need.any():
                    redo.append(chunk.select(need))
                    chunk = chunk.select(~need)
            chunks.append(chunk)
        if not redo:
            return
        self._chunks = [c for c in chunks if c.size]
        old = RowChunk.concat(redo)
        self._n_rows -= old.size
        depth = self._nodes.depth[old.ids]
        for d in _small_values(depth):
            at = old.select(depth == d)
            per = self._rows_per_call(d)
            for lo in range(0, at.size, per):
                part = at.part(lo, min(lo + per, at.size))
                if self._above_rows(d):
                    fresh = self._expand_above(part.ids, d, budget)
                    self._store(_agree_sparse(part, fresh), int(self.model.vocab_size))
                else:
                    rows = _agree(part, self._forward(part.ids, d))
                    self._keep(part.ids, self._cut(part.ids, d, rows, count=False), budget)
                self._check_room(0, 0)  # rows run again may keep more cells: checked as they come

    def _step_buckets(self, rows: np.ndarray) -> np.ndarray:
        """Per-step buckets int64[...] of model log-probs ``rows`` (float32), clipped to <= 0."""
        return self.quantizer.step_buckets(np.minimum(rows.astype(np.float64), 0.0))

    def _threshold(self, parent_fb: np.ndarray, hi: int) -> np.ndarray:
        """float32[b]: a log-prob below which no step fits a child bucket ``<= hi + 1``.

        A step fits a remaining budget ``R`` only if its log-prob exceeds ``-(R + 1) / scale * ln 2``;
        the threshold for ``R + 1`` (to see the first bucket beyond too), lowered a little more
        against float32 rounding, keeps every such cell (and a few more, bucketed exactly later)."""
        thr = -(hi - parent_fb + 2.0) / self.quantizer.scale * LN2
        return np.nextafter((thr - 1e-6 * (1.0 + np.abs(thr))).astype(np.float32), np.float32(-np.inf))

    def _admit(self, chunk: RowChunk, lo: int, hi: int, pending) -> np.ndarray:
        """Append the children of the chunk's nodes whose bucket lies in ``(lo, hi]``, in row-major
        order (by parent, then token); queue the live ones in ``pending`` by depth. Returns each
        row's smallest bucket of a finite child beyond ``hi``, int64[b] (``NO_BUCKET``: none; a
        sparse row's left-out cells included, through its bound).

        Rows go in blocks of about ``CELL_BLOCK`` cells, so the temporaries stay small; each block's
        children are checked against the limits before they are added."""
        nxt = np.empty(chunk.size, np.int64)
        per = max(1, CELL_BLOCK // max(chunk.width if not chunk.sparse else 1, 1))
        for s in range(0, chunk.size, per):
            e = min(s + per, chunk.size)
            nxt[s:e] = self._admit_block(chunk.part(s, e), lo, hi, pending)
        return nxt

    def _admit_block(self, chunk: RowChunk, lo: int, hi: int, pending) -> np.ndarray:
        """:meth:`_admit` for one block. Only cells that can fit are bucketed exactly; a row with
        no candidate in bucket ``hi + 1`` gets its frontier from its best cell left out."""
        nd = self._nodes
        ids = chunk.ids
        parent_fb = nd.fb[ids]
        r, tok, raw, below = chunk.cells(self._threshold(parent_fb, hi))
        fb = parent_fb[r] + self._step_buckets(raw)
        over = fb > hi
        frontier = np.full(chunk.size, NO_BUCKET, np.int64)
        if over.any():  # cells come row-major: a per-row minimum by segments
            ro, fo = r[over], fb[over]
            starts = np.flatnonzero(np.r_[True, ro[1:] != ro[:-1]])
            frontier[ro[starts]] = np.minimum.reduceat(fo, starts)
        rest = frontier > hi + 1
        if rest.any():  # the first bucket beyond is empty in these rows: look at the cells left out
            best_out = below()
            out = rest & np.isfinite(best_out)
            if out.any():
                frontier[out] = np.minimum(frontier[out], parent_fb[out] + self._step_buckets(best_out[out]))
        keep = ~over & (fb > lo)
        if not keep.any():
            return frontier
        r, tok, raw, fb = r[keep], tok[keep], raw[keep], fb[keep]
        parent = ids[r]
        depth = nd.depth[parent] + 1
        terminal = depth == self.max_len if self.eos is None else tok == self.eos
        live = ~terminal
        self._check_room(int(r.size), int(np.count_nonzero(live)))
        # siblings in index order (likelier first, then token): a one-pass build then creates
        # every depth already sorted, and _rank's sorts find their input in order
        order = _sort_keys(r, _cost(raw), tok)
        parent, tok, raw, fb, depth, terminal, live = (
            parent[order], tok[order], raw[order], fb[order], depth[order], terminal[order], live[order]
        )
        new = nd.add(
            parent=parent,
            token=tok,
            depth=depth,
            fb=fb,
            lp=nd.lp[parent] + np.minimum(raw.astype(np.float64), 0.0),
            step=raw,
            terminal=terminal,
        )
        self._pending += int(np.count_nonzero(live))
        d0 = int(depth[0])
        if (depth == d0).all():
            if live.any():
                pending[d0].append(new[live])
        else:
            for d in _small_values(depth[live]):
                pending[int(d)].append(new[live & (depth == d)])
        return frontier

    def _forward(self, ids: np.ndarray, depth: int) -> np.ndarray:
        """The model's next-token rows float32[b, V] for the prefixes of nodes ``ids`` (all of
        length ``depth``), in one padded call."""
        b = ids.size
        session = self._decoding_session()
        if session is not None:  # parents' caches held: one token position per row
            before = session.positions
            rows = session.next_logprobs(self._fixed_prefixes(ids, depth), np.full(b, depth, np.int32))
            self.positions += session.positions - before
            self.forwards += b
            if depth == 0 and self._root_row is None:
                self._root_row = rows[0].copy()
            return rows
        prefixes = np.zeros((bucket_size(b), bucket_size(max(depth, 1))), np.int32)
        prefixes[:b, :depth] = self._decode_fixed(ids, depth)
        lengths = np.zeros(prefixes.shape[0], np.int32)
        lengths[:b] = depth
        rows = np.asarray(model_rows(self.model, prefixes, lengths))
        if rows.ndim != 2 or rows.shape[0] != prefixes.shape[0]:
            raise ValueError(
                f"model.next_logprobs returned shape {rows.shape} for {prefixes.shape[0]} prefixes; "
                "expected [B, V]"
            )
        rows = rows[:b].astype(np.float32)
        if np.isnan(rows.max(initial=-np.inf)):
            raise ValueError("model.next_logprobs returned NaN log-probs")
        self._count_rows(b, depth)
        if depth == 0 and self._root_row is None:
            self._root_row = rows[0].copy()
        return rows

    def _fixed_prefixes(self, ids: np.ndarray, depth: int) -> np.ndarray:
        """int32[b, max(depth, 1)]: the prefixes of nodes ``ids`` (all of length ``depth``)."""
        prefixes = np.zeros((ids.size, max(depth, 1)), np.int32)
        prefixes[:, :depth] = self._decode_fixed(ids, depth)
        return prefixes

    def _count_rows(self, b: int, depth: int) -> None:
        """Count ``b`` model rows of full forwards over prefixes of length ``depth``."""
        self.forwards += b
        self.positions += b * (depth + 1 + len(getattr(self.model, "prompt", ()) or ()))

    def _decoding_session(self):
        """The model's :class:`~jaxrescore.models.decoding.DecodingSession` (None when it has no
        incremental forward or ``decode_cache_bytes`` is 0), kept across passes."""
        if self.decode_cache_bytes == 0:
            return None
        held = self._session  # (model, session or None)
        if held is None or held[0] is not self.model:
            from jaxrescore.models.decoding import decoding_session

            held = (self.model, decoding_session(self.model, max_bytes=self.decode_cache_bytes))
            self._session = held
        return held[1]

    def _cut(self, ids: np.ndarray, depth: int, rows: np.ndarray, count: bool = True) -> np.ndarray:
        """Apply ``branch_cap`` and the ``max_len`` cut of a terminating model to fresh rows: the cut
        cells become -inf (so deepening never admits them) and their buckets feed ``_cut_min``
        (branch_cap) and ``_length_cut_min`` (max_len); ``count=False`` (rows computed again)
        only cuts, as those cells were counted the first time."""
        width = rows.shape[1]
        capped = self.branch_cap is not None and width > self.branch_cap
        at_max_len = self.eos is not None and depth + 1 == self.max_len
        if not (capped or at_max_len):
            return rows
        finite = np.isfinite(rows)
        cut = np.zeros_like(finite)
        # a non-eos child at max_len has only completions longer than max_len: a length cut, even
        # when branch_cap would drop it too (so bucket_bound(length_cuts=False) can leave it out)
        at_limit = finite.copy() if at_max_len else np.zeros_like(finite)
        if at_max_len and self.eos < width:
            at_limit[:, self.eos] = False
        if capped:
            order = np.argsort(-rows, axis=1, kind="stable")[:, self.branch_cap :]
            dropped = np.zeros_like(finite)
            np.put_along_axis(dropped, order, True, axis=1)
            dropped &= finite & ~at_limit
            if count:
                self._dropped = _add_upper(self._dropped, self._completions(depth + 1, dropped, width))
            cut |= dropped
        if count:
            self._cut_min = min(self._cut_min, self._min_bucket(ids, rows, cut))
            self._length_cut_min = min(self._length_cut_min, self._min_bucket(ids, rows, at_limit))
        cut |= at_limit
        return np.where(cut, np.float32(-np.inf), rows) if cut.any() else rows

    def _min_bucket(self, ids: np.ndarray, rows: np.ndarray, cells: np.ndarray) -> int:
        """The smallest cumulative bucket of the children ``cells: bool[b, V]`` (NO_BUCKET if none)."""
        if not cells.any():
            return NO_BUCKET
        r, tok = np.nonzero(cells)
        return int((self._nodes.fb[ids][r] + self._step_buckets(rows[r, tok])).min())

    def _completions(self, depth: int, dropped: np.ndarray, width: int) -> int | float:
        """An upper bound on the support sequences structurally possible below the dropped children
        (at ``depth``): exact while it stays below 2**63, else a float rounded up (inf past range)."""
        rest = self.max_len - depth
        if self.eos is None:
            n_eos, n_other, per_other = 0, int(dropped.sum()), _upper_pow(width, rest)
        else:
            n_eos = int(dropped[:, self.eos].sum()) if self.eos < width else 0
            n_other = int(dropped.sum()) - n_eos
            # sum_{j < rest} (width - 1)**j completions below a non-eos prefix
            per_other = _upper_geometric(width - 1, rest)
        return _add_upper(n_eos, _mul_upper(n_other, per_other))

    def _frontier_from_rows(self) -> int:
        """The smallest bucket of a finite child beyond the budget, recomputed from the kept rows
        (what the build passes track incrementally; used to re-check an older index file)."""
        frontier = NO_BUCKET
        for chunk in self._chunks:
            per = max(1, CELL_BLOCK // max(chunk.width, 1))
            for s in range(0, chunk.size, per):
                part = chunk.part(s, min(s + per, chunk.size))
                r, _, raw = part.all_cells()
                fb = self._nodes.fb[part.ids][r] + self._step_buckets(raw)
                beyond = fb[fb > self._budget]
                if beyond.size:
                    frontier = min(frontier, int(beyond.min()))
                if part.sparse and np.isfinite(part.rest).any():
                    fin = np.isfinite(part.rest)
                    frontier = min(frontier, int((self._nodes.fb[part.ids[fin]] + self._step_buckets(part.rest[fin])).min()))
        return frontier

    def _consolidate_rows(self) -> None:
        """Merge the kept row chunks into one block per kind (whole rows padded to the widest)."""
        merged = []
        for sparse in (False, True):
            same = [c for c in self._chunks if c.sparse == sparse and c.size]
            if len(same) > 1:
                merged.append(RowChunk.concat(same))
            elif same:
                merged.append(same[0])
        self._chunks = merged

    def _compact_rows(self) -> None:
        """Merge the kept row chunks of each kind once there are more than ``COMPACT_CHUNKS``:
        a chunk is merged into the one before it while that one is no larger (a binary counter),
        so a few dozen chunks stay and each row is copied a logarithmic number of times over the
        index's life, not once per pass."""
        merged = []
        for sparse in (False, True):
            same = [c for c in self._chunks if c.sparse == sparse and c.size]
            if len(same) <= COMPACT_CHUNKS:
                merged.extend(same)
                continue
            stack: list[RowChunk] = []
            for chunk in same:
                stack.append(chunk)
                while len(stack) > 1 and stack[-2].size <= stack[-1].size:
                    top = stack.pop()
                    stack[-1] = RowChunk.concat([stack[-1], top])
            merged.extend(stack)
        self._chunks = merged

    # -- the count DP and the order ------------------------------------------------------------------

    def _rank(self) -> None:
        """Sort the indexed sequences by (bucket, depth-first position)."""
        nd = self._nodes
        depth, parent = nd.depth, nd.parent
        by_depth = np.argsort(depth, kind="stable")
        edges = np.searchsorted(depth[by_depth], np.arange(int(depth.max()) + 2))
        level_pos = np.zeros(nd.n, np.int64)
        levels = []
        cost = _cost(nd.step)
        for d in range(len(edges) - 1):
            ids = by_depth[edges[d] : edges[d + 1]]
            if d > 0:  # siblings together (parent order), likelier first, then token id
                ids = ids[_sort_keys(level_pos[parent[ids]], cost[ids], nd.token[ids])]
            level_pos[ids] = np.arange(ids.size)
            levels.append(ids)
        leaves = nd.terminal.astype(np.int64)  # sequences below each node, bottom-up
        for d in range(len(levels) - 1, 0, -1):
            ids = levels[d]
            up = np.bincount(level_pos[parent[ids]], weights=leaves[ids], minlength=levels[d - 1].size)
            leaves[levels[d - 1]] += up.astype(np.int64)
        first = np.zeros(nd.n, np.int64)  # sequences before each node's subtree, top-down
        for d in range(1, len(levels)):
            ids = levels[d]
            counts = leaves[ids]
            before = np.cumsum(counts) - counts
            par = parent[ids]
            starts = np.r_[True, par[1:] != par[:-1]]
            group_first = np.maximum.accumulate(np.where(starts, np.arange(ids.size), 0))
            first[ids] = first[par] + before - before[group_first]
        seq = np.flatnonzero(nd.terminal)
        dfs = np.empty_like(seq)
        dfs[first[seq]] = seq  # leaves' first positions are a permutation of 0..len-1
        fb = nd.fb[dfs]
        seq = dfs[np.argsort(fb.astype(np.int16) if fb.max(initial=0) < 2**15 else fb, kind="stable")]
        self._seq_id = seq
        self._seq_fb = nd.fb[seq]
        self._seq_lp = nd.lp[seq]

    # -- queries -------------------------------------------------------------------------------------

    def _decode_fixed(self, ids: np.ndarray, depth: int) -> np.ndarray:
        """Tokens int32[b, depth] of nodes that all sit at ``depth``."""
        out = np.zeros((ids.size, depth), np.int32)
        cur = ids
        for j in range(depth - 1, -1, -1):
            out[:, j] = self._nodes.token[cur]
            cur = self._nodes.parent[cur]
        return out

    @_locked
    def decode(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Tokens int32[N, T] and lengths int32[N] of nodes ``ids`` (any depths), vectorised."""
        nd = self._nodes
        lens = nd.depth[ids]
        out = np.zeros((ids.size, int(lens.max(initial=0))), np.int32)
        cur = np.array(ids, np.int64)
        for _ in range(out.shape[1]):
            d = nd.depth[cur]
            live = np.flatnonzero(d > 0)
            if live.size == 0:
                break
            c = cur[live]
            out[live, d[live] - 1] = nd.token[c]
            cur[live] = nd.parent[c]
        return out, lens

    def _ranks_arg(self, ranks) -> np.ndarray:
        arr = np.asarray(ranks)
        if arr.size and arr.dtype == object:  # Python ints beyond int64
            vals = arr.reshape(-1).tolist()
            if all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in vals):
                if min(vals) < 0:
                    raise IndexError(f"ranks must be >= 0, got {_show(min(vals))}")
                raise IndexError(self._capacity_message(f"rank {_show(max(vals))}"))
        if arr.size and (arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer)):
            raise ValueError(f"ranks must be integers, got dtype {arr.dtype}")
        if arr.size and arr.dtype == np.uint64 and int(arr.max()) >= _MAX_RANK:
            raise IndexError(self._capacity_message(f"rank {_show(int(arr.max()))}"))
        arr = arr.astype(np.int64).reshape(-1)
        if arr.size and arr.min() < 0:
            raise IndexError(f"ranks must be >= 0, got {int(arr.min())}")
        if arr.size:
            top = int(arr.max())
            if top >= len(self) and not self.exhausted and top >= min(self._capacity(), _MAX_RANK):
                raise IndexError(self._capacity_message(f"rank {_show(top)}"))
            self._deepen_for_count(top + 1, f"rank {_show(top)}")
            if top >= len(self):
                raise IndexError(self._beyond_message(f"rank {_show(top)}"))
        return arr

    def _capacity_message(self, what: str) -> str:
        """Why a rank that no deepening could reach fails: the support ends first, or the limits."""
        if self.exhausted:
            return self._beyond_message(what)
        return (
            f"{what} is beyond what this index can ever hold: at most {self._capacity():,} sequences fit "
            f"max_bytes={self.max_bytes:,}"
            + ("" if self.max_nodes is None else f"/max_nodes={self.max_nodes:,}")
            + f" ({NODE_BYTES} bytes a node); it holds {len(self):,} now"
        )

    def _beyond_message(self, what: str) -> str:
        why = "the support is exhausted" if self.exhausted else f"max_depth_bits={self.max_depth_bits:g} was reached"
        return f"{what} is beyond the {len(self)} sequences indexed ({why})"

    @_locked
    def unrank_batch(self, ranks: ArrayLike) -> tuple[list[tuple[int, ...]], np.ndarray]:
        """The sequences at ``ranks: int[N]`` and their draft log-probs ``float64[N]`` (deepens as
        needed; IndexError for a rank beyond what exists within ``max_depth_bits`` or beyond what
        could ever fit ``max_bytes``; IndexLimitError if deepening to it would pass a limit)."""
        with self._atomic():
            arr = self._ranks_arg(ranks)
        ids = self._seq_id[arr]
        toks, lens = self.decode(ids)
        rows = toks.tolist()
        return [tuple(row[:n]) for row, n in zip(rows, lens.tolist())], self._seq_lp[arr].copy()

    @_locked
    def unrank(self, i: int) -> tuple[tuple[int, ...], float]:
        """The sequence at rank ``i`` (0-based) and its draft log-prob."""
        if isinstance(i, bool) or not isinstance(i, numbers.Integral):
            raise ValueError(f"rank must be an integer, got {i!r}")
        if i < 0:
            raise IndexError(f"rank must be >= 0, got {_show(i)}")
        if i >= _MAX_RANK:
            raise IndexError(self._capacity_message(f"rank {_show(i)}"))
        seqs, lps = self.unrank_batch(np.array([i], np.int64))
        return seqs[0], float(lps[0])

    @_locked
    def slice(self, start: int, k: int) -> list[tuple[tuple[int, ...], float]]:
        """Up to ``k`` ``(sequence, draft log-prob)`` pairs from rank ``start`` on (fewer only where
        the index runs out)."""
        start = _int_arg(start, "start", minimum=0)
        k = _int_arg(k, "k", minimum=0)
        if k == 0:
            return []
        with self._atomic(keep_limited=True):
            self._deepen_for_count(start + k, f"slice(start={_show(start)}, k={_show(k)})")
        stop = min(start + k, len(self))
        if stop <= start:
            return []
        seqs, lps = self.unrank_batch(np.arange(start, stop))
        return list(zip(seqs, lps.tolist()))

    def _bucket_range(self, min_log_prob: float) -> tuple[int, int]:
        """Buckets ``(sure, possible)``: every sequence with bucket <= ``sure`` has draft log-prob
        >= ``min_log_prob``; every sequence with log-prob >= it has bucket <= ``possible``.
        Both are clamped to ``[-1, NO_BUCKET]`` (a threshold beyond every budget stays beyond)."""
        x = min(-min_log_prob / LN2 * self.quantizer.scale, float(NO_BUCKET))
        # sum of floors > bits*scale - steps, and <= bits*scale + steps*TOL
        sure = max(-1, min(math.floor(x) - self.max_len - 1, NO_BUCKET))
        possible = max(-1, min(math.floor(x + self.max_len * TOL), NO_BUCKET))
        return sure, possible

    def _threshold_arg(self, min_log_prob) -> float:
        if isinstance(min_log_prob, bool) or not isinstance(min_log_prob, numbers.Real) or math.isnan(min_log_prob):
            raise ValueError(f"min_log_prob must be a number, got {min_log_prob!r}")
        if min_log_prob == -math.inf:
            raise ValueError("min_log_prob must be finite (-inf would ask for the whole support)")
        return float(min_log_prob)

    @_locked
    def count(self, min_log_prob: float) -> int:
        """The number of sequences whose draft log-prob is ``>= min_log_prob``, exact: the index is
        deepened to cover the threshold and the few buckets where bucket and score disagree are
        resolved sequence by sequence. Exact over the support unless ``branch_cap`` dropped or
        ``max_depth_bits`` stopped short of the threshold (steps saturated by the quantizer
        included); then it counts the indexed sequences (see :meth:`count_bracket`)."""
        t = self._threshold_arg(min_log_prob)
        if t > 0:
            return 0
        sure, possible = self._bucket_range(t)
        with self._atomic():
            self._deepen_to(min(possible, self._max_budget), f"count(min_log_prob={min_log_prob!r})")
        lo = int(np.searchsorted(self._seq_fb, sure, side="right"))
        hi = int(np.searchsorted(self._seq_fb, possible, side="right"))
        return lo + int(np.count_nonzero(self._seq_lp[lo:hi] >= t))

    @_locked
    def count_bracket(self, min_log_prob: float) -> tuple[int, int | float]:
        """A sound ``(lo, hi)`` on the number of support sequences with draft log-prob
        ``>= min_log_prob``, from the bucket histogram alone (plus ``dropped_upper`` where drops
        could reach the threshold; ``hi`` is ``inf`` when ``max_depth_bits`` stops the budget short)."""
        t = self._threshold_arg(min_log_prob)
        if t > 0:
            return 0, 0
        sure, possible = self._bucket_range(t)
        with self._atomic():
            self._deepen_to(min(possible, self._max_budget), f"count_bracket(min_log_prob={min_log_prob!r})")
        lo = int(np.searchsorted(self._seq_fb, sure, side="right"))
        hi: int | float = int(np.searchsorted(self._seq_fb, possible, side="right"))
        if self._cut_min <= possible:
            hi += self.dropped_upper
        if self._frontier_min <= possible:
            hi = math.inf
        return lo, hi

    @_locked
    def threshold(self, rank: int) -> float:
        """The ``rank``-th largest draft log-prob (1-based) over the support: ``count(threshold(r))
        >= r``. Exact unless ``branch_cap``/``max_depth_bits`` cut sequences near it."""
        rank = _int_arg(rank, "rank", minimum=1)
        request = f"threshold(rank={_show(rank)})"
        if rank > min(self._capacity(), _MAX_RANK) and rank > len(self) and not self.exhausted:
            raise IndexError(self._capacity_message(f"threshold rank {_show(rank)} (1-based)"))
        with self._atomic(keep_limited=True):
            self._deepen_for_count(rank, request)
            if len(self) < rank:
                raise IndexError(self._beyond_message(f"threshold rank {_show(rank)} (1-based)"))
            v = float(-np.partition(-self._seq_lp, rank - 1)[rank - 1])
            # once every sequence scoring >= v is indexed, the rank-th largest indexed score is exact
            _, possible = self._bucket_range(v)
            self._deepen_to(min(possible, self._max_budget), request)
        return float(-np.partition(-self._seq_lp, rank - 1)[rank - 1])

    def _structural(self, seq) -> tuple[tuple[int, ...], int]:
        """``(seq, bucket)`` of a support sequence, from one model call; ValueError outside it. The
        bucket is summed exactly (Python ints) and clamped below ``NO_BUCKET``."""
        try:
            seq = tuple(int(t) for t in seq)
        except (TypeError, ValueError):
            raise ValueError(f"seq must be a sequence of token ids, got {seq!r}") from None
        n = len(seq)
        if self.eos is None:
            ok = n == self.max_len
        else:
            ok = 1 <= n <= self.max_len and seq[-1] == self.eos and self.eos not in seq[:-1]
        if not ok:
            raise ValueError(f"seq {seq} is not in the model's support (length/eos rule)")
        if min(seq, default=0) < 0 or max(seq, default=0) >= 2**31 - 1:
            raise ValueError(f"seq {seq} has a token id outside [0, 2**31 - 1)")
        prefixes = np.zeros((bucket_size(n), bucket_size(n)), np.int32)
        for j in range(n):
            prefixes[j, :j] = seq[:j]
        lengths = np.zeros(prefixes.shape[0], np.int32)
        lengths[:n] = np.arange(n)
        rows = np.asarray(model_rows(self.model, prefixes, lengths))[:n]
        self.forwards += n
        toks = np.asarray(seq, np.int64)
        inside = toks < rows.shape[1]
        lps = np.full(n, -np.inf)
        lps[inside] = rows[np.flatnonzero(inside), toks[inside]]
        if not np.isfinite(lps).all():
            raise ValueError(f"seq {seq} has probability 0 under the model")
        total = sum(self.quantizer.step_buckets(np.minimum(lps, 0.0)).tolist())
        return seq, min(total, NO_BUCKET - 1)

    @_locked
    def rank_bracket(self, seq: Tokens) -> tuple[int, int | float]:
        """``(lo, hi)`` containing the position of ``seq`` in the index order; ``lo == hi`` when it
        is indexed. For a sequence dropped by ``branch_cap`` or beyond ``max_depth_bits`` the bracket
        spans its bucket plus what was cut (``hi`` may be ``inf``)."""
        seq, fb = self._structural(seq)
        with self._atomic():
            self._deepen_to(min(fb, self._max_budget), "rank_bracket(seq)")
        node = self._find(seq)
        if node is not None:
            pos = int(np.flatnonzero(self._seq_id == node)[0])
            return pos, pos
        lo = int(np.searchsorted(self._seq_fb, fb, side="left"))
        if fb > self._budget:
            return lo, math.inf
        hi = int(np.searchsorted(self._seq_fb, fb, side="right")) - 1 + self.dropped_upper
        return lo, hi

    def _find(self, seq: tuple[int, ...]) -> int | None:
        """The node id of an indexed sequence, or None."""
        nd = self._nodes
        cur = 0
        for tok in seq:
            hit = np.flatnonzero((nd.parent == cur) & (nd.token == tok))
            if hit.size == 0:
                return None
            cur = int(hit[0])
        return cur if nd.terminal[cur] else None

    # -- persistence ---------------------------------------------------------------------------------

    @_locked
    def save(self, path: PathLike) -> None:
        """Write the index to ``path`` atomically (see :mod:`jaxrescore.index.io`)."""
        from jaxrescore.index.io import save_index

        save_index(self, path)

    @classmethod
    def load(cls, path: PathLike, model: AutoregressiveEnumerable, *, progress: bool | None = None, chunk_rows: int = 4096,
             max_nodes: int | None = None, max_bytes: int | None = None,
             decode_cache_bytes: int | None = None) -> "SeekIndex":
        """Read an index saved by :meth:`save` for ``model``; ValueError for a corrupted, truncated,
        foreign-version or mismatched (model vocabulary/eos/max_len/first table) file, and
        IndexLimitError for one larger than ``max_bytes``/``max_nodes`` (checked before reading its
        arrays). The limits and ``decode_cache_bytes`` then apply to its deepening as in the
        constructor; ``row_storage`` is the saved index's."""
        from jaxrescore.index.io import load_index

        return load_index(cls, path, model, progress=progress, chunk_rows=chunk_rows, max_nodes=max_nodes,
                          max_bytes=max_bytes, decode_cache_bytes=decode_cache_bytes)


class _AtLeastOneToken:
    """A model's protocol attributes as :func:`check_protocol` sees them while its vocabulary is
    still being inferred (``vocab_size`` 0 until a row names a token)."""

    def __init__(self, model):
        self.vocab_size = max(int(model.vocab_size), 1 if model.eos is None else int(model.eos) + 1)
        self.eos, self.max_len, self.next_logprobs = model.eos, model.max_len, model.next_logprobs


def _cost(step: np.ndarray) -> np.ndarray:
    """int64 keys ordering float32 log-probs ``step`` from likeliest (clipped to <= 0) down: a
    float32 >= 0 orders like its uint32 bits (+0.0 folds -0.0 into 0)."""
    neg = np.maximum(-np.asarray(step, np.float32), np.float32(0)) + np.float32(0)
    return neg.view(np.uint32).astype(np.int64)


def _sort_keys(*keys: np.ndarray) -> np.ndarray:
    """The permutation sorting by ``keys`` (non-negative ints, most significant first).

    Packed into one int64 when their bit widths fit, which the stable sort does fast (nodes are
    created nearly in order); np.lexsort otherwise."""
    widths = [max(int(k.max(initial=0)), 1).bit_length() for k in keys]
    if sum(widths) > 62:
        return np.lexsort(keys[::-1])
    packed = np.zeros(keys[0].size, np.int64)
    for k, w in zip(keys, widths):
        packed = (packed << w) | k.astype(np.int64)
    return np.argsort(packed, kind="stable")


# -- upper bounds on huge counts (dropped_upper): exact ints below 2**63, floats rounded up beyond --

_EXACT = 1 << 63
_UP = 1.0 + 1e-12  # relative headroom that covers float rounding of the few operations below


def _as_upper(x: int) -> int | float:
    if x < _EXACT:
        return x
    try:
        return float(x) * _UP
    except OverflowError:
        return math.inf


def _upper_pow(base: int, k: int) -> int | float:
    if base <= 1 or k * math.log2(base) < 64:
        return _as_upper(base**k)
    lg = k * math.log2(base)
    return math.inf if lg >= 1023 else 2.0**lg * _UP


def _upper_geometric(base: int, k: int) -> int | float:
    """An upper bound on ``sum(base**j for j in range(k))``."""
    if k <= 0:
        return 0
    if base <= 1:
        return k if base == 1 else 1
    if k * math.log2(base) < 64:
        return _as_upper((base**k - 1) // (base - 1))
    lg = k * math.log2(base) - math.log2(base - 1)  # the sum is below base**k / (base - 1)
    return math.inf if lg >= 1023 else 2.0**lg * _UP


def _mul_upper(a: int, b: int | float) -> int | float:
    if a == 0 or b == 0:
        return 0
    if isinstance(b, int):
        return _as_upper(a * b)
    return float(a) * b * _UP


def _agree(kept: RowChunk, rows: np.ndarray) -> np.ndarray:
    """Fresh whole ``rows`` (float32[b, V]) of the prefixes of sparse ``kept``, made to agree with
    what the index already did with them: the kept cells keep their stored values (children may be
    in the index already) and every other cell stays within the stored bound ``rest`` (the frontier
    already claimed it). A model whose rows move with batch composition (float noise) could
    otherwise admit a child twice or put one below a budget already built, where it is never seen."""
    r, tok, val = kept.all_cells()
    rows = np.minimum(rows, kept.rest[:, None])
    rows[r, tok] = val
    return rows


def _small_values(a: np.ndarray) -> list:
    """The distinct values of ``a`` (small non-negative ints: depths), ascending: a bincount, not
    numpy's hashing ``unique`` (measured slower by far on these)."""
    return np.flatnonzero(np.bincount(a)).tolist() if a.size else []


def _agree_sparse(kept: RowChunk, fresh: RowChunk) -> RowChunk:
    """:func:`_agree` for sparse rows: the fresh sparse rows of the prefixes of ``kept`` (cells
    at or above a lower threshold than ``kept``'s), made to agree with what the index holds. The
    kept cells keep their stored values; every other fresh cell is clipped to the stored bound
    ``rest``, and so is the fresh bound (a bound on every cell left out either way)."""
    rk, tk, vk = kept.all_cells()
    rf = fresh.rows_of_cells()
    wide = max(kept.width, fresh.width, 1)
    stored = np.sort(rk * wide + tk)
    key = rf * wide + fresh.tok
    at = np.minimum(np.searchsorted(stored, key), max(stored.size - 1, 0))
    new = stored[at] != key if stored.size else np.ones(key.size, bool)
    rows = np.concatenate([rk, rf[new]])
    tok = np.concatenate([tk, fresh.tok[new].astype(np.int64)])
    val = np.concatenate([vk, np.minimum(fresh.val[new], kept.rest[rf[new]])])
    order = np.lexsort((tok, rows))
    ptr = np.zeros(kept.size + 1, np.int64)
    np.cumsum(np.bincount(rows, minlength=kept.size), out=ptr[1:])
    rest = np.minimum(fresh.rest, kept.rest).astype(np.float32)
    return RowChunk(kept.ids, ptr=ptr, tok=tok[order].astype(np.int32), val=val[order].astype(np.float32), rest=rest)


def _add_upper(a: int | float, b: int | float) -> int | float:
    if isinstance(a, int) and isinstance(b, int):
        return _as_upper(a + b)
    return (float(a) + float(b)) * _UP
