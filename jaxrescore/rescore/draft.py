"""A view of any duck-typed draft index: pulling its head and bounding what lies beyond it.

What is trusted, in order (DESIGN.md §4):

1. ``bucket_bound(n)`` (our :class:`~jaxrescore.index.SeekIndex`): the index's own sound upper bound
   on the draft score of every sequence ranked ``>= n`` or never indexed; ``-inf`` means none exists.
2. Running out (``unrank`` raising IndexError, or ``len()`` below the extent after
   ``ensure_count``) is exhaustion only when the index reports ``truncated is False`` and
   ``dropped_upper == 0``: an approximate index (the reference library's envelope index) stops at
   an estimated size without either report, so running out proves nothing there.
3. A foreign index with only a ``.quantizer`` (e.g. the reference library's SeekIndex) is trusted as
   ordered by structural fine bucket (the sum of per-step buckets, ``TOL = 1e-9``) only if it
   reports ``truncated`` and ``dropped_upper`` and ``dropped_upper == 0``. Every sequence ranked
   after the edge item then has a structural bucket at least the edge item's, which is at least
   ``fine_bucket(edge lp) - max_len`` (a sum of ``n`` per-step floors is at least the floor of the
   sum minus ``n - 1``, and ``n <= max_len + 1`` in case ``max_len`` leaves out the EOS step).
   The reference library's own rule, the bucket of the edge item's TOTAL score, misses exactly
   that per-step slack; its model's ``structural_fine_bucket`` is also the bucket of the total
   (not the per-step sum its index orders by), so it is not trusted either.
4. An index that declares ``exact_order = False`` (our AREnvelopeIndex: its rank order is only an
   estimate) offers no bound, whatever else it reports; running out is exhaustion there only when
   it reports ``truncated is False``.
5. Anything else (no quantizer, no truncation report, dropped sequences, a sequence returned twice)
   offers no bound: NaN, and certification answers False with the reason.
"""

from __future__ import annotations

import inspect
import math
from typing import Any, NamedTuple

import numpy as np

from jaxrescore.quantize import Quantizer

# Steps assumed for a foreign index whose model does not say its max_len: the bound it gives is
# then too loose to certify anything, which is the honest answer.
_UNKNOWN_MAX_STEPS = 1 << 20


class DraftPull(NamedTuple):
    """The draft head of one query.

    Attributes:
      seqs: the pulled sequences as tuples of ints, in draft rank order.
      draft_lps: float64[P], their draft log-probs as the index reported them.
      ran_out: True when the index held fewer sequences than asked for.
      repeated: True when the index returned some sequence more than once (only the first
        occurrence is kept): it is then no exact enumeration and no bound is trusted.
    """

    seqs: list
    draft_lps: np.ndarray
    ran_out: bool
    repeated: bool = False


class DraftBound(NamedTuple):
    """A bound on every sequence beyond a pull: ``value`` is -inf (none exists), a finite float,
    or NaN (no sound bound); ``why`` says where it came from."""

    value: float
    why: str


def _as_tuple(seq) -> tuple:
    if type(seq) is tuple:  # the common case (our SeekIndex): already a tuple, skip the copy
        return seq
    return tuple(int(x) for x in np.asarray(seq).reshape(-1))


class DraftView:
    """Uniform access to a draft index with ``unrank(i) -> (sequence, draft_log_prob)``.

    Args:
      index: the draft index.
      target_max_len: the target's ``max_len`` when it has one. When it is no larger than the
        index's own ``max_len``, sequences longer than that are outside the target's support, so
        the prefixes a terminating draft cut at ``max_len`` need no bound (``bucket_bound(n,
        length_cuts=False)``, where the index offers it).
    """

    def __init__(self, index: Any, target_max_len: int | None = None):
        if not callable(getattr(index, "unrank", None)):
            raise TypeError(
                f"draft_index must have a method unrank(i) -> (sequence, log_prob), got {type(index).__name__}"
            )
        self.index = index
        bucket_bound = getattr(index, "bucket_bound", None)
        index_max_len = getattr(index, "max_len", None)
        self._skip_length_cuts = (
            callable(bucket_bound)
            and "length_cuts" in inspect.signature(bucket_bound).parameters
            and target_max_len is not None
            and index_max_len is not None
            and int(target_max_len) <= int(index_max_len)
        )

    def pull(self, extent: int, max_rows: int | None = None) -> DraftPull:
        """The first ``extent`` sequences in draft order (fewer if the index runs out), each once.
        ``max_rows``: grow the index by at most that many model rows for it (an index whose
        ``ensure_count`` takes ``max_rows``, as our SeekIndex's does; others grow as they do):
        the pull is then what the index holds, possibly fewer than ``extent``."""
        seqs, lps, ran_out = self._raw_pull(extent, max_rows)
        first = {}
        for i, seq in enumerate(seqs):
            first.setdefault(seq, i)
        if len(first) == len(seqs):
            return DraftPull(seqs, lps, ran_out)
        keep = sorted(first.values())
        return DraftPull([seqs[i] for i in keep], lps[keep], ran_out, repeated=True)

    def _raw_pull(self, extent: int, max_rows: int | None = None) -> tuple[list, np.ndarray, bool]:
        idx = self.index
        ensure = getattr(idx, "ensure_count", None)
        if callable(ensure):
            if max_rows is not None and "max_rows" in inspect.signature(ensure).parameters:
                ensure(extent, max_rows=max_rows)
            else:
                ensure(extent)
        if callable(getattr(idx, "unrank_batch", None)) and hasattr(idx, "__len__"):
            n = min(extent, len(idx))
            seqs, lps = idx.unrank_batch(np.arange(n, dtype=np.int64)) if n else ([], [])
            return [_as_tuple(s) for s in seqs], np.asarray(lps, np.float64).reshape(n), n < extent
        seqs, lps = [], []
        for i in range(extent):
            try:
                seq, lp = idx.unrank(i)
            except IndexError:
                return seqs, np.asarray(lps, np.float64), True
            seqs.append(_as_tuple(seq))
            lps.append(float(lp))
        return seqs, np.asarray(lps, np.float64), False

    def pull_size(self, need: float, start: int, cap: int) -> int | None:
        """A pull size ``n`` in ``[start, cap]`` whose bound (``bucket_bound(n)``) is at most
        ``need``: the first found by growing ``n`` from ``start`` in 25% steps (at most 25% above
        the smallest), deepening the index as it goes. None when the index offers no
        ``bucket_bound``, or when even ``cap`` does not get there (the index was cut above
        ``need``, or ``cap`` is too small)."""
        idx = self.index
        if getattr(idx, "exact_order", True) is False or not callable(getattr(idx, "bucket_bound", None)):
            return None
        kwargs = {"length_cuts": False} if self._skip_length_cuts else {}
        n = start
        while n <= cap:
            if callable(getattr(idx, "ensure_count", None)):
                idx.ensure_count(n + 1)
            if float(idx.bucket_bound(n, **kwargs)) <= need:
                return n
            if hasattr(idx, "__len__") and len(idx) <= n:
                return None  # nothing more to pull: a cut prefix keeps the bound above need
            n = max(n + 1, int(n * 1.25))
        return None

    def bound(self, n: int, pull: DraftPull) -> DraftBound:
        """Sound upper bound on the draft score of every sequence not among the first ``n`` pulled."""
        idx = self.index
        if pull.repeated:
            return DraftBound(
                math.nan, "the draft index returned the same sequence more than once: not an exact enumeration"
            )
        if getattr(idx, "exact_order", True) is False:
            if pull.ran_out and n >= len(pull.seqs) and getattr(idx, "truncated", None) is False:
                return DraftBound(-math.inf, "the draft index ran out and reports truncated=False")
            return DraftBound(
                math.nan, "the draft index's order is approximate (exact_order=False): no sound bound"
            )
        if callable(getattr(idx, "bucket_bound", None)):
            kwargs = {"length_cuts": False} if self._skip_length_cuts else {}
            value = float(idx.bucket_bound(n, **kwargs))
            if math.isnan(value):
                return DraftBound(math.nan, "the draft index's bucket_bound returned NaN")
            return DraftBound(value, "the draft index's bucket_bound")
        dropped = float(getattr(idx, "dropped_upper", 0) or 0)
        if dropped != 0:
            return DraftBound(math.nan, f"the draft index dropped up to {dropped:g} sequences that no bound covers")
        if pull.ran_out and n >= len(pull.seqs):
            if getattr(idx, "truncated", None) is False and hasattr(idx, "dropped_upper"):
                return DraftBound(-math.inf, "the draft index ran out and reports truncated=False, dropped_upper=0")
            return DraftBound(
                math.nan,
                "the draft index ran out but does not report truncated=False and dropped_upper=0, so "
                "running out is not proven exhaustion",
            )
        quantizer = getattr(idx, "quantizer", None)
        if quantizer is None:
            return DraftBound(math.nan, "the draft index exposes no quantizer, so no sound bound exists")
        if not (hasattr(idx, "truncated") and hasattr(idx, "dropped_upper")):
            return DraftBound(
                math.nan,
                "the draft index reports no truncated/dropped_upper, so sequences it never ordered "
                "cannot be bounded",
            )
        try:
            q = Quantizer(quantizer.bin_width_bits, quantizer.oversample)
        except (AttributeError, TypeError, ValueError):
            return DraftBound(math.nan, "the draft index's quantizer has no usable bin_width_bits/oversample")
        model = getattr(idx, "model", None)
        # +1: a foreign model's max_len may leave out its EOS step.
        max_steps = getattr(model, "max_len", None)
        max_steps = _UNKNOWN_MAX_STEPS if max_steps is None else int(max_steps) + 1
        edge_lp = float(pull.draft_lps[n - 1])
        if not math.isfinite(edge_lp):
            return DraftBound(math.nan, "the edge item's draft score is not finite: no bucket to bound from")
        fb = int(q.fine_bucket(edge_lp)) - (max_steps - 1)
        return DraftBound(
            float(q.edge(max(fb, 0), max_steps)),
            "the edge item's fine bucket minus max_len (foreign index, trusted as bucket-ordered)",
        )


class SpeculativeDraft:
    """A draft index that lists nothing up front: a proving search over it starts from the root,
    and the draft MODEL speculates every path it scores (greedy completions of the frontier's
    exits; see :mod:`jaxrescore.rescore.search`). What :func:`jaxrescore.quick.top_k` uses for a
    network draft (an int8 twin, a student, the target itself), whose every row is a forward:
    an index listing ``k + rerank_window`` complete sequences in draft order would pay for
    every prefix above them, thousands of forwards on a chat model's answers, before the search
    begins. It offers no bound, so it never certifies; proofs need none. Nor is the draft asked
    to score the sequences the search finds (``draft_log_probs`` are NaN): a draft forward per
    round that no verdict reads.

    Attributes:
      model: the draft model (``next_logprobs``), which completes exit prefixes.
      max_len: the model's.
    """

    def __init__(self, model: Any):
        if not callable(getattr(model, "next_logprobs", None)):
            raise TypeError(f"SpeculativeDraft needs a model with next_logprobs, got {type(model).__name__}")
        self.model = model
        self.max_len = model.max_len

    def __repr__(self) -> str:
        return f"SpeculativeDraft({self.model!r})"

    def __len__(self) -> int:
        return 0

    def unrank(self, i: int):
        raise IndexError(f"rank {i}: a SpeculativeDraft lists no sequences (a proving search starts from the root)")
