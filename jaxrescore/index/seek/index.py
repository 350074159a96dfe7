"""SeekIndex, the shell: checks arguments, holds the lock, runs the functions over the index's
state and stores the state they return, and converts answers to Python types.

The logic lives in functions over a :class:`~jaxrescore.index.seek.state.SeekState` (see the
package docstring, :mod:`jaxrescore.index.seek`); a call that fails stores nothing, so the index
keeps the state it had, except that growth by count keeps the passes that fitted before a limit.
"""

from __future__ import annotations

import functools
import threading

import numpy as np

from jaxrescore._checks import check_float, check_int
from jaxrescore.index.seek import growth, queries
from jaxrescore.index.seek.io import load_state, save_state
from jaxrescore.index.seek.limits import MAX_RANK, IndexLimitError, advice, capacity_message, nbytes, show
from jaxrescore.index.seek.settings import SeekSettings, check_max_bytes, check_progress, make_settings
from jaxrescore.index.seek.state import SeekState, empty_state, size, truncated
from jaxrescore.index.seek.tree import decode
from jaxrescore.models.base import AutoregressiveEnumerable
from jaxrescore.models.decoding import decoding_session
from jaxrescore.quantize import Quantizer
from jaxrescore.typing import ArrayLike, PathLike, Tokens


def _locked(method):
    """Run ``method`` holding the index's re-entrant lock (see "Threads" in the package docstring)."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)

    return wrapper


class SeekIndex:
    """Exact quantized-order index over an AutoregressiveEnumerable model (see the package
    docstring, :mod:`jaxrescore.index.seek`).

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
        ``4 * V`` per kept next-token row; None means
        :func:`~jaxrescore.index.seek.settings.default_max_bytes` (2 GiB, or an eighth of physical
        memory if less). A pass that would pass either limit raises
        :class:`~jaxrescore.index.IndexLimitError` before allocating and is undone
        (growth by count keeps the passes that fitted before it).
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
    The whole state is :attr:`state`, the settings :attr:`settings`.
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
        settings = make_settings(
            model, Quantizer(bin_width_bits, oversample), branch_cap=branch_cap, max_depth_bits=max_depth_bits,
            progress=progress, chunk_rows=chunk_rows, max_nodes=max_nodes, max_bytes=max_bytes,
            decode_cache_bytes=decode_cache_bytes, row_storage=row_storage,
        )
        initial = check_float(initial_bits, "initial_bits", minimum=0.0, unit="bits")
        self._start(settings, empty_state())
        budget = settings.quantizer.budget(min(initial, settings.max_depth_bits))
        try:
            self._state = growth.deepen_to(settings, self._state, self._session, budget,
                                           f"SeekIndex(initial_bits={initial_bits!r})")
        except IndexLimitError as err:
            err.kept = None
            err.args = (
                f"{err.args[0]} Pass a smaller initial_bits, a larger max_bytes/max_nodes, or branch_cap to "
                "keep fewer children per prefix.",
            )
            raise

    def _start(self, settings: SeekSettings, state: SeekState) -> None:
        self._settings, self._state = settings, state
        self._lock = threading.RLock()
        self._held = None  # (model, its DecodingSession or None), built on first use

    def _session(self):
        """The model's :class:`~jaxrescore.models.decoding.DecodingSession` (None when it has no
        incremental forward or ``decode_cache_bytes`` is 0), kept across passes."""
        cfg = self._settings
        if cfg.decode_cache_bytes == 0:
            return None
        if self._held is None or self._held[0] is not cfg.model:
            self._held = (cfg.model, decoding_session(cfg.model, max_bytes=cfg.decode_cache_bytes))
        return self._held[1]

    def _grow(self, fn, *args, keep_limited: bool = False) -> None:
        """Store the state ``fn(settings, state, session, *args)`` returns (see :meth:`_ask`)."""
        self._ask(lambda *a: (fn(*a), None), *args, keep_limited=keep_limited)

    def _ask(self, fn, *args, keep_limited: bool = False):
        """Run ``fn(settings, state, session, *args) -> (state, answer)``, store its state, return
        its answer. On failure nothing is stored, except with ``keep_limited`` the passes that
        fitted before a limit (``IndexLimitError.kept``); a limit error ends with what is left."""
        try:
            self._state, out = fn(self._settings, self._state, self._session, *args)
        except IndexLimitError as err:
            if keep_limited and err.kept is not None:
                self._state = err.kept
            err.kept = None
            err.args = (f"{err.args[0]} {advice(self._settings, self._state)}",) + err.args[1:]
            raise
        return out

    def __getstate__(self) -> dict:
        return {"settings": self._settings, "state": self._state}  # no lock, no device caches

    def __setstate__(self, saved: dict) -> None:
        self._start(saved["settings"], saved["state"])

    # -- settings and state --------------------------------------------------------------------------

    @property
    def settings(self) -> SeekSettings:
        """What the index is built with (a NamedTuple)."""
        return self._settings

    @property
    @_locked
    def state(self) -> SeekState:
        """Everything the index holds (a NamedTuple of arrays and plain values; never changed in
        place, so a state read here stays as it was)."""
        return self._state

    model = property(lambda self: self._settings.model, doc="The draft model.")
    quantizer = property(lambda self: self._settings.quantizer, doc="The fine buckets of the order.")
    max_len = property(lambda self: self._settings.max_len, doc="The model's max_len.")
    eos = property(lambda self: self._settings.eos, doc="The model's eos (None: fixed length).")
    branch_cap = property(lambda self: self._settings.branch_cap, doc="Children kept per prefix (None: all).")
    max_depth_bits = property(lambda self: self._settings.max_depth_bits, doc="The deepest budget, in bits.")
    chunk_rows = property(lambda self: self._settings.chunk_rows, doc="Prefixes per model call.")
    decode_cache_bytes = property(lambda self: self._settings.decode_cache_bytes,
                                  doc="Key/value cache bytes of an incremental model (None: its default).")
    row_storage = property(lambda self: self._settings.row_storage, doc='"auto", "dense" or "sparse".')
    forwards = property(lambda self: self._state.forwards, doc="Model rows evaluated (padding excluded).")
    builds = property(lambda self: self._state.builds, doc="Build passes.")
    positions = property(lambda self: self._state.positions, doc="Token positions the model rows cost.")

    @property
    def progress(self) -> bool | None:
        """The build's progress bar: None after a second, True always, False never (settable)."""
        return self._settings.progress

    @progress.setter
    @_locked
    def progress(self, value: bool | None) -> None:
        self._settings = self._settings._replace(progress=check_progress(value))

    @property
    def max_nodes(self) -> int | None:
        """The most prefix-tree nodes (None: no node limit); settable, e.g. raised to go on growing."""
        return self._settings.max_nodes

    @max_nodes.setter
    @_locked
    def max_nodes(self, value: int | None) -> None:
        self._settings = self._settings._replace(max_nodes=check_int(value, "max_nodes", minimum=1, allow_none=True))

    @property
    def max_bytes(self) -> int:
        """The most bytes the index may hold (None sets the default); settable."""
        return self._settings.max_bytes

    @max_bytes.setter
    @_locked
    def max_bytes(self, value: int | None) -> None:
        self._settings = self._settings._replace(max_bytes=check_max_bytes(value))

    @_locked
    def __repr__(self) -> str:
        return (
            f"SeekIndex(model={type(self.model).__name__}, sequences={len(self):,}, "
            f"built_bits={self.built_bits:g}, truncated={self.truncated}, forwards={self.forwards:,})"
        )

    @_locked
    def __len__(self) -> int:
        """Sequences currently indexed."""
        return size(self._state)

    @property
    @_locked
    def built_bits(self) -> float:
        """The bit budget built so far."""
        return max(self._state.budget, 0) / self.quantizer.scale

    @property
    @_locked
    def truncated(self) -> bool:
        """True while some sequence of the support may be missing: children beyond the budget
        (saturated, improbably deep steps included), ``branch_cap`` drops, or prefixes of a
        terminating model cut at ``max_len``."""
        return truncated(self._state)

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
        return queries.dropped_upper(self._settings, self._state)

    @property
    @_locked
    def nbytes(self) -> int:
        """The index's size as ``max_bytes`` counts it: ``NODE_BYTES`` per node plus ``4 * V`` per
        kept whole next-token row, and the bytes of the sparse rows."""
        return nbytes(self._settings, self._state)

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
        return queries.bucket_bound(self._settings, self._state, check_int(n, "n"), bool(length_cuts))

    # -- growth --------------------------------------------------------------------------------------

    @_locked
    def ensure_bits(self, bits: float) -> "SeekIndex":
        """Deepen until every sequence within ``bits`` bits (capped at ``max_depth_bits``) is held.
        IndexLimitError if that would pass ``max_nodes``/``max_bytes`` (the index is unchanged)."""
        value = min(check_float(bits, "bits", minimum=0.0, unit="bits"), self.max_depth_bits)
        self._grow(growth.deepen_to, self.quantizer.budget(value), f"ensure_bits(bits={bits!r})")
        return self

    @_locked
    def ensure_count(self, n: int, *, max_rows: int | None = None) -> "SeekIndex":
        """Deepen until ``len(self) >= n``, the support is exhausted or ``max_depth_bits`` is
        reached, at most one whole bit a pass (see "Growth" in the package docstring): the index
        ends at or below the smallest whole-bit budget that holds ``n``. IndexLimitError if a
        pass would pass ``max_nodes``/``max_bytes`` even one bucket deep; the passes that fitted
        are kept and the index keeps answering from them.

        ``max_rows``: evaluate at most this many more model rows (the draft's forwards); growth
        stops before a pass that would need more, with no error, and ``len(self)`` may stay
        below ``n`` (a query's budget: a proving search then goes on from what is held)."""
        n = check_int(n, "n")
        max_rows = check_int(max_rows, "max_rows", minimum=0, allow_none=True)
        self._grow(growth.deepen_for_count, n, f"ensure_count(n={show(n)})", max_rows, keep_limited=True)
        return self

    # -- queries -------------------------------------------------------------------------------------

    @_locked
    def decode(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Tokens int32[N, T] and lengths int32[N] of nodes ``ids`` (any depths), vectorised."""
        return decode(self._state.nodes, ids)

    @_locked
    def unrank_batch(self, ranks: ArrayLike) -> tuple[list[tuple[int, ...]], np.ndarray]:
        """The sequences at ``ranks: int[N]`` and their draft log-probs ``float64[N]`` (deepens as
        needed; IndexError for a rank beyond what exists within ``max_depth_bits`` or beyond what
        could ever fit ``max_bytes``; IndexLimitError if deepening to it would pass a limit)."""
        arr = self._ask(queries.ranks, ranks)
        return queries.sequences_at(self._state, arr)

    @_locked
    def unrank(self, i: int) -> tuple[tuple[int, ...], float]:
        """The sequence at rank ``i`` (0-based) and its draft log-prob."""
        i = check_int(i, "rank", minimum=None)
        if i < 0:
            raise IndexError(f"rank must be >= 0, got {show(i)}")
        if i >= MAX_RANK:
            raise IndexError(capacity_message(self._settings, self._state, f"rank {show(i)}"))
        seqs, lps = self.unrank_batch(np.array([i], np.int64))
        return seqs[0], float(lps[0])

    @_locked
    def slice(self, start: int, k: int) -> list[tuple[tuple[int, ...], float]]:
        """Up to ``k`` ``(sequence, draft log-prob)`` pairs from rank ``start`` on (fewer only where
        the index runs out)."""
        start, k = check_int(start, "start"), check_int(k, "k")
        if k == 0:
            return []
        self._grow(growth.deepen_for_count, start + k, f"slice(start={show(start)}, k={show(k)})", keep_limited=True)
        stop = min(start + k, len(self))
        if stop <= start:
            return []
        seqs, lps = self.unrank_batch(np.arange(start, stop))
        return list(zip(seqs, lps.tolist()))

    @_locked
    def count(self, min_log_prob: float) -> int:
        """The number of sequences whose draft log-prob is ``>= min_log_prob``, exact: the index is
        deepened to cover the threshold and the few buckets where bucket and score disagree are
        resolved sequence by sequence. Exact over the support unless ``branch_cap`` dropped or
        ``max_depth_bits`` stopped short of the threshold (steps saturated by the quantizer
        included); then it counts the indexed sequences (see :meth:`count_bracket`)."""
        t = queries.check_threshold(min_log_prob)
        return self._ask(queries.count, t, f"count(min_log_prob={min_log_prob!r})")

    @_locked
    def count_bracket(self, min_log_prob: float) -> tuple[int, int | float]:
        """A sound ``(lo, hi)`` on the number of support sequences with draft log-prob
        ``>= min_log_prob``, from the bucket histogram alone (plus ``dropped_upper`` where drops
        could reach the threshold; ``hi`` is ``inf`` when ``max_depth_bits`` stops the budget short)."""
        t = queries.check_threshold(min_log_prob)
        return self._ask(queries.count_bracket, t, f"count_bracket(min_log_prob={min_log_prob!r})")

    @_locked
    def threshold(self, rank: int) -> float:
        """The ``rank``-th largest draft log-prob (1-based) over the support: ``count(threshold(r))
        >= r``. Exact unless ``branch_cap``/``max_depth_bits`` cut sequences near it."""
        return self._ask(queries.threshold, check_int(rank, "rank", minimum=1), keep_limited=True)

    @_locked
    def rank_bracket(self, seq: Tokens) -> tuple[int, int | float]:
        """``(lo, hi)`` containing the position of ``seq`` in the index order; ``lo == hi`` when it
        is indexed. For a sequence dropped by ``branch_cap`` or beyond ``max_depth_bits`` the bracket
        spans its bucket plus what was cut (``hi`` may be ``inf``)."""
        self._state, seq, fb = queries.structural(self._settings, self._state, seq)
        return self._ask(queries.rank_bracket, seq, fb)

    # -- persistence ---------------------------------------------------------------------------------

    @_locked
    def save(self, path: PathLike) -> None:
        """Write the index to ``path`` atomically (see :mod:`jaxrescore.index.seek.io`)."""
        save_state(self._settings, self._state, path)

    @classmethod
    def load(cls, path: PathLike, model: AutoregressiveEnumerable, *, progress: bool | None = None, chunk_rows: int = 4096,
             max_nodes: int | None = None, max_bytes: int | None = None,
             decode_cache_bytes: int | None = None) -> "SeekIndex":
        """Read an index saved by :meth:`save` for ``model``; ValueError for a corrupted, truncated,
        foreign-version or mismatched (model vocabulary/eos/max_len/first table) file, and
        IndexLimitError for one larger than ``max_bytes``/``max_nodes`` (checked before reading its
        arrays). The limits and ``decode_cache_bytes`` then apply to its deepening as in the
        constructor; ``row_storage`` is the saved index's."""
        settings, state = load_state(path, model, progress=progress, chunk_rows=chunk_rows, max_nodes=max_nodes,
                                     max_bytes=max_bytes, decode_cache_bytes=decode_cache_bytes)
        index = cls.__new__(cls)
        index._start(settings, state)
        return index
