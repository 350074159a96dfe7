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
After each build one vectorised pass per depth sorts siblings, counts the sequences below every
prefix (the count DP, bottom-up) and gives each sequence its depth-first position (top-down); the
sequences are then sorted by (bucket, position). Counts are int64: every counted sequence is one
cell of a forward the index paid for, so no count can come near 2**63 and no float mode is needed.

Soundness. :meth:`SeekIndex.bucket_bound` bounds the draft log-prob of every sequence ranked ``>= n``
or never indexed. A prefix's bucket lower-bounds the bucket of all its completions, so the index
tracks the smallest bucket of everything it cut: children beyond the budget (recomputed at every
build), children dropped by ``branch_cap`` and, for a terminating model, prefixes cut at ``max_len``
(permanent). A terminating model's mass beyond ``max_len`` is treated like any other cut: it keeps
``truncated`` True and stays under the bound, as a target model may continue where the draft stops.
"""

from __future__ import annotations

import math
import numbers

import numpy as np
from tqdm.auto import tqdm

from jaxrescore.quantize import LN2, TOL, Quantizer
from jaxrescore.sequences import bucket_size

# Bucket value of "nothing": larger than any reachable bucket, small enough never to overflow a sum.
NO_BUCKET = np.iinfo(np.int64).max // 4
# Seconds a build must run before its progress bar appears (progress=None).
PROGRESS_DELAY_S = 1.0


def _int_arg(value, name: str, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or int(value) < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _bits_arg(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number of bits >= 0, got {value!r}")
    return float(value)


class _Nodes:
    """Columnar, append-only store of prefix-tree nodes; node 0 is the root (the empty prefix).

    Columns: parent int64, token int32, depth int32, fb int64 (cumulative fine bucket), lp float64
    (cumulative clipped log-prob), step float32 (the model's own log-prob of the last token),
    terminal bool (the node is a complete sequence of the support).
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
      max_depth_bits: the largest bit budget the index ever deepens to.
      initial_bits: the budget built by the constructor.
      progress: tqdm bar over model rows: None shows it once a build runs over a second, True
        always, False never.
      chunk_rows: prefixes per ``next_logprobs`` call.

    Counters: ``forwards`` (model rows evaluated, padding excluded), ``builds`` (build passes).

    Memory: about 40 bytes per prefix-tree node plus the kept next-token row of every expanded
    prefix, ``4 * V`` bytes each (what lets deepening skip forwards already paid for).
    """

    def __init__(
        self,
        model,
        *,
        bin_width_bits: float = 1.0,
        oversample: int = 8,
        branch_cap: int | None = None,
        max_depth_bits: float = 64.0,
        initial_bits: float = 8.0,
        progress: bool | None = None,
        chunk_rows: int = 4096,
    ):
        self._setup(
            model, Quantizer(bin_width_bits, oversample), branch_cap, max_depth_bits, progress, chunk_rows
        )
        self.ensure_bits(min(_bits_arg(initial_bits, "initial_bits"), self.max_depth_bits))

    def _setup(self, model, quantizer, branch_cap, max_depth_bits, progress, chunk_rows):
        for attr in ("vocab_size", "eos", "max_len", "next_logprobs"):
            if not hasattr(model, attr):
                raise TypeError(
                    f"model must implement AutoregressiveEnumerable (vocab_size, eos, max_len, "
                    f"next_logprobs); {type(model).__name__} has no {attr!r}"
                )
        self.model = model
        self.max_len = _int_arg(model.max_len, "model.max_len", minimum=1)
        self.eos = None if model.eos is None else _int_arg(model.eos, "model.eos", minimum=0)
        self.quantizer = quantizer
        self.branch_cap = None if branch_cap is None else _int_arg(branch_cap, "branch_cap", minimum=1)
        self.max_depth_bits = _bits_arg(max_depth_bits, "max_depth_bits")
        if progress not in (None, True, False):
            raise ValueError(f"progress must be None, True or False, got {progress!r}")
        self.progress = progress
        self.chunk_rows = _int_arg(chunk_rows, "chunk_rows", minimum=1)
        self.forwards = 0
        self.builds = 0
        self._nodes = _Nodes()
        self._budget = -1  # deepest fine bucket admitted; -1 = nothing built yet
        self._row_ids: list[np.ndarray] = []  # expanded nodes, chunk by chunk
        self._rows: list[np.ndarray] = []  # their next-token rows float32[b, V], cut cells at -inf
        self._frontier_min = NO_BUCKET  # smallest bucket of a child beyond the budget
        self._cut_min = NO_BUCKET  # smallest bucket of a child dropped for good by branch_cap
        self._length_cut_min = NO_BUCKET  # smallest bucket of a terminating prefix cut at max_len
        self._dropped = 0  # upper bound on support sequences below branch_cap drops
        self._root_row: np.ndarray | None = None
        self._rank()

    # -- state ---------------------------------------------------------------------------------------

    def __len__(self) -> int:
        """Sequences currently indexed."""
        return int(self._seq_id.size)

    @property
    def built_bits(self) -> float:
        """The bit budget built so far."""
        return max(self._budget, 0) / self.quantizer.scale

    @property
    def truncated(self) -> bool:
        """True while some sequence of the support may be missing: children beyond the budget,
        ``branch_cap`` drops, or prefixes of a terminating model cut at ``max_len``."""
        return min(self._frontier_min, self._cut_min, self._length_cut_min) < NO_BUCKET

    @property
    def exhausted(self) -> bool:
        """True iff the index provably holds the whole support (nothing was ever cut)."""
        return not self.truncated

    @property
    def dropped_upper(self) -> int | float:
        """Upper bound on support sequences permanently dropped by ``branch_cap`` (0 without it):
        each dropped prefix counts every structurally possible completion. ``inf`` when drops exist
        and the model's vocabulary is inferred (it may still grow)."""
        if self._dropped and getattr(self.model, "vocab_inferred", False):
            return math.inf
        return self._dropped

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

    # -- building ------------------------------------------------------------------------------------

    def ensure_bits(self, bits: float) -> "SeekIndex":
        """Deepen until every sequence within ``bits`` bits (capped at ``max_depth_bits``) is held."""
        bits = min(_bits_arg(bits, "bits"), self.max_depth_bits)
        self._ensure_budget(self.quantizer.budget(bits))
        return self

    def ensure_count(self, n: int) -> "SeekIndex":
        """Deepen (geometrically, at most doubling the budget per pass) until ``len(self) >= n``,
        the support is exhausted or ``max_depth_bits`` is reached."""
        n = _int_arg(n, "n", minimum=0)
        max_budget = self.quantizer.budget(self.max_depth_bits)
        while len(self) < n and self._frontier_min < NO_BUCKET and self._budget < max_budget:
            self._ensure_budget(min(self._next_budget(n), max_budget))
        return self

    def _ensure_budget(self, budget: int) -> None:
        if budget <= self._budget:
            return
        if self._budget >= 0 and self._frontier_min > budget:
            self._budget = budget  # nothing new fits: no pass needed
            return
        self._grow(budget)

    def _next_budget(self, n: int) -> int:
        """A budget expected to hold ``n`` sequences, from the count growth seen so far."""
        b, have = self._budget, len(self)
        step_cap = max(b, self.quantizer.oversample)
        if have == 0:
            step = step_cap
        else:
            half = int(np.searchsorted(self._seq_fb, b // 2, side="right"))
            rate = math.log2(have / max(half, 1)) / max(b - b // 2, 1)  # log2(count) per bucket
            step = math.ceil(1.25 * math.log2(max(n, 1) / have) / max(rate, 1e-3)) + 1
            step = min(max(step, 1), step_cap)
        return max(b + step, self._frontier_min)

    def _grow(self, budget: int) -> None:
        """One build pass, all or nothing: a model error midway leaves the index as it was."""
        saved = (
            self._nodes.n, len(self._rows), self._cut_min, self._length_cut_min, self._dropped, self.forwards,
            self._root_row,
        )
        try:
            self._grow_pass(budget)
        except BaseException:
            n_nodes, n_rows, self._cut_min, self._length_cut_min, self._dropped, self.forwards, self._root_row = saved
            self._nodes.n = n_nodes
            del self._rows[n_rows:], self._row_ids[n_rows:]
            raise
        self._consolidate_rows()
        self._rank()

    def _grow_pass(self, budget: int) -> None:
        """Admit every child with bucket in (old budget, budget], level by level."""
        old = self._budget
        pending: list[list[np.ndarray]] = [[] for _ in range(self.max_len + 1)]
        if old < 0:
            pending[0].append(np.zeros(1, np.int64))
        frontier = NO_BUCKET
        for ids, rows in zip(self._row_ids, self._rows):
            frontier = min(frontier, self._admit(ids, rows, old, budget, pending))
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
                for lo in range(0, todo.size, self.chunk_rows):
                    ids = todo[lo : lo + self.chunk_rows]
                    rows = self._cut(ids, depth, self._forward(ids, depth))
                    self._row_ids.append(ids)
                    self._rows.append(rows)
                    frontier = min(frontier, self._admit(ids, rows, -1, budget, pending))
                    bar.update(ids.size)
                    bar.set_postfix(depth=depth, bits=f"{budget / self.quantizer.scale:g}", refresh=False)
        self._frontier_min = frontier
        self._budget = budget
        self.builds += 1

    def _step_buckets(self, rows: np.ndarray) -> np.ndarray:
        """Per-step buckets int64[...] of model log-probs ``rows`` (float32), clipped to <= 0."""
        return self.quantizer.step_buckets(np.minimum(rows.astype(np.float64), 0.0))

    def _admit(self, ids, rows, lo: int, hi: int, pending) -> int:
        """Append the children of nodes ``ids`` (next-token rows ``rows: float32[b, V]``) whose
        bucket lies in ``(lo, hi]``, in row-major order (by parent, then token); queue the live ones
        in ``pending`` by depth. Returns the smallest bucket of a finite child beyond ``hi``.

        Only cells that can fit are bucketed exactly: a step fits a remaining budget ``R`` only if
        its log-prob exceeds ``-(R + 1) / scale * ln 2``, so a float32 compare against a slightly
        lower threshold (for ``R + 1``, to see the first bucket beyond too) picks the candidates.
        When no candidate lands in bucket ``hi + 1``, the best cell left out gives the frontier."""
        nd = self._nodes
        parent_fb = nd.fb[ids]
        thr = -(hi - parent_fb + 2.0) / self.quantizer.scale * LN2
        thr = np.nextafter((thr - 1e-6 * (1.0 + np.abs(thr))).astype(np.float32), np.float32(-np.inf))
        cand = rows >= thr[:, None]
        r, tok = np.divmod(np.flatnonzero(cand), rows.shape[1])
        raw = rows[r, tok]
        fb = parent_fb[r] + self._step_buckets(raw)
        over = fb > hi
        frontier = int(fb[over].min()) if over.any() else NO_BUCKET
        if frontier > hi + 1:  # the first bucket beyond is empty here: look at the rest
            best_out = np.where(cand, np.float32(-np.inf), rows).max(axis=1)
            out = np.isfinite(best_out)
            if out.any():
                frontier = min(frontier, int((parent_fb[out] + self._step_buckets(best_out[out])).min()))
        keep = ~over & (fb > lo)
        if not keep.any():
            return frontier
        r, tok, raw, fb = r[keep], tok[keep], raw[keep], fb[keep]
        # siblings in index order (likelier first, then token): a one-pass build then creates
        # every depth already sorted, and _rank's sorts find their input in order
        order = _sort_keys(r, _cost(raw), tok)
        r, tok, raw, fb = r[order], tok[order], raw[order], fb[order]
        parent = ids[r]
        depth = nd.depth[parent] + 1
        terminal = depth == self.max_len if self.eos is None else tok == self.eos
        new = nd.add(
            parent=parent,
            token=tok,
            depth=depth,
            fb=fb,
            lp=nd.lp[parent] + np.minimum(raw.astype(np.float64), 0.0),
            step=raw,
            terminal=terminal,
        )
        live = ~terminal
        d0 = int(depth[0])
        if (depth == d0).all():
            if live.any():
                pending[d0].append(new[live])
        else:
            for d in np.unique(depth[live]):
                pending[int(d)].append(new[live & (depth == d)])
        return frontier

    def _forward(self, ids: np.ndarray, depth: int) -> np.ndarray:
        """The model's next-token rows float32[b, V] for the prefixes of nodes ``ids`` (all of
        length ``depth``), in one padded call."""
        b = ids.size
        prefixes = np.zeros((bucket_size(b), bucket_size(max(depth, 1))), np.int32)
        prefixes[:b, :depth] = self._decode_fixed(ids, depth)
        lengths = np.zeros(prefixes.shape[0], np.int32)
        lengths[:b] = depth
        rows = np.asarray(self.model.next_logprobs(prefixes, lengths))
        if rows.ndim != 2 or rows.shape[0] != prefixes.shape[0]:
            raise ValueError(
                f"model.next_logprobs returned shape {rows.shape} for {prefixes.shape[0]} prefixes; "
                "expected [B, V]"
            )
        rows = rows[:b].astype(np.float32)
        if np.isnan(rows.max(initial=-np.inf)):
            raise ValueError("model.next_logprobs returned NaN log-probs")
        self.forwards += b
        if depth == 0 and self._root_row is None:
            self._root_row = rows[0].copy()
        return rows

    def _cut(self, ids: np.ndarray, depth: int, rows: np.ndarray) -> np.ndarray:
        """Apply ``branch_cap`` and the ``max_len`` cut of a terminating model to fresh rows: the cut
        cells become -inf (so deepening never admits them) and their buckets feed ``_cut_min``
        (branch_cap) and ``_length_cut_min`` (max_len)."""
        width = rows.shape[1]
        capped = self.branch_cap is not None and width > self.branch_cap
        at_max_len = self.eos is not None and depth + 1 == self.max_len
        if not (capped or at_max_len):
            return rows
        finite = np.isfinite(rows)
        cut = np.zeros_like(finite)
        at_limit = np.zeros_like(finite)
        if capped:
            order = np.argsort(-rows, axis=1, kind="stable")[:, self.branch_cap :]
            dropped = np.zeros_like(finite)
            np.put_along_axis(dropped, order, True, axis=1)
            dropped &= finite
            self._dropped += self._completions(depth + 1, dropped, width)
            cut |= dropped
        if at_max_len:
            at_limit = finite & ~cut
            if self.eos < width:
                at_limit[:, self.eos] = False
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

    def _completions(self, depth: int, dropped: np.ndarray, width: int) -> int:
        """Support sequences structurally possible below the dropped children (at ``depth``)."""
        rest = self.max_len - depth
        if self.eos is None:
            return int(dropped.sum()) * width**rest
        n_eos = int(dropped[:, self.eos].sum()) if self.eos < width else 0
        n_other = int(dropped.sum()) - n_eos
        return n_eos + n_other * sum((width - 1) ** j for j in range(rest))

    def _consolidate_rows(self) -> None:
        """Merge the kept row chunks into one block (padded to the widest with -inf)."""
        if len(self._rows) <= 1:
            return
        width = max(r.shape[1] for r in self._rows)
        self._rows = [np.concatenate([_pad_width(r, width) for r in self._rows])]
        self._row_ids = [np.concatenate(self._row_ids)]

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
        if arr.size and not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(f"ranks must be integers, got dtype {arr.dtype}")
        arr = arr.astype(np.int64).reshape(-1)
        if arr.size and arr.min() < 0:
            raise IndexError(f"ranks must be >= 0, got {int(arr.min())}")
        if arr.size:
            self.ensure_count(int(arr.max()) + 1)
            if arr.max() >= len(self):
                raise IndexError(self._beyond_message(f"rank {int(arr.max())}"))
        return arr

    def _beyond_message(self, what: str) -> str:
        why = "the support is exhausted" if self.exhausted else f"max_depth_bits={self.max_depth_bits:g} was reached"
        return f"{what} is beyond the {len(self)} sequences indexed ({why})"

    def unrank_batch(self, ranks) -> tuple[list[tuple[int, ...]], np.ndarray]:
        """The sequences at ``ranks: int[N]`` and their draft log-probs ``float64[N]`` (deepens as
        needed; IndexError for a rank beyond what exists within ``max_depth_bits``)."""
        arr = self._ranks_arg(ranks)
        ids = self._seq_id[arr]
        toks, lens = self.decode(ids)
        rows = toks.tolist()
        return [tuple(row[:n]) for row, n in zip(rows, lens.tolist())], self._seq_lp[arr].copy()

    def unrank(self, i: int) -> tuple[tuple[int, ...], float]:
        """The sequence at rank ``i`` (0-based) and its draft log-prob."""
        if isinstance(i, bool) or not isinstance(i, numbers.Integral):
            raise ValueError(f"rank must be an integer, got {i!r}")
        if i < 0:
            raise IndexError(f"rank must be >= 0, got {i}")
        seqs, lps = self.unrank_batch(np.array([i], np.int64))
        return seqs[0], float(lps[0])

    def slice(self, start: int, k: int) -> list[tuple[tuple[int, ...], float]]:
        """Up to ``k`` ``(sequence, draft log-prob)`` pairs from rank ``start`` on (fewer only where
        the index runs out)."""
        start = _int_arg(start, "start", minimum=0)
        k = _int_arg(k, "k", minimum=0)
        self.ensure_count(start + k)
        stop = min(start + k, len(self))
        if stop <= start:
            return []
        seqs, lps = self.unrank_batch(np.arange(start, stop))
        return list(zip(seqs, lps.tolist()))

    def _bucket_range(self, min_log_prob: float) -> tuple[int, int]:
        """Buckets ``(sure, possible)``: every sequence with bucket <= ``sure`` has draft log-prob
        >= ``min_log_prob``; every sequence with log-prob >= it has bucket <= ``possible``."""
        x = -min_log_prob / LN2 * self.quantizer.scale
        # sum of floors > bits*scale - steps, and <= bits*scale + steps*TOL
        return math.floor(x) - self.max_len - 1, math.floor(x + self.max_len * TOL)

    def _threshold_arg(self, min_log_prob) -> float:
        if isinstance(min_log_prob, bool) or not isinstance(min_log_prob, numbers.Real) or math.isnan(min_log_prob):
            raise ValueError(f"min_log_prob must be a number, got {min_log_prob!r}")
        if min_log_prob == -math.inf:
            raise ValueError("min_log_prob must be finite (-inf would ask for the whole support)")
        return float(min_log_prob)

    def count(self, min_log_prob: float) -> int:
        """The number of sequences whose draft log-prob is ``>= min_log_prob``, exact: the index is
        deepened to cover the threshold and the few buckets where bucket and score disagree are
        resolved sequence by sequence. Exact over the support unless ``branch_cap`` dropped or
        ``max_depth_bits`` stopped short of the threshold; then it counts the indexed sequences
        (see :meth:`count_bracket`)."""
        t = self._threshold_arg(min_log_prob)
        if t > 0:
            return 0
        sure, possible = self._bucket_range(t)
        self._ensure_budget(min(possible, self.quantizer.budget(self.max_depth_bits)))
        lo = int(np.searchsorted(self._seq_fb, sure, side="right"))
        hi = int(np.searchsorted(self._seq_fb, possible, side="right"))
        return lo + int(np.count_nonzero(self._seq_lp[lo:hi] >= t))

    def count_bracket(self, min_log_prob: float) -> tuple[int, int | float]:
        """A sound ``(lo, hi)`` on the number of support sequences with draft log-prob
        ``>= min_log_prob``, from the bucket histogram alone (plus ``dropped_upper`` where drops
        could reach the threshold; ``hi`` is ``inf`` when ``max_depth_bits`` stops the budget short)."""
        t = self._threshold_arg(min_log_prob)
        if t > 0:
            return 0, 0
        sure, possible = self._bucket_range(t)
        self._ensure_budget(min(possible, self.quantizer.budget(self.max_depth_bits)))
        lo = int(np.searchsorted(self._seq_fb, sure, side="right"))
        hi: int | float = int(np.searchsorted(self._seq_fb, possible, side="right"))
        if self._cut_min <= possible:
            hi += self.dropped_upper
        if self._frontier_min <= possible:
            hi = math.inf
        return lo, hi

    def threshold(self, rank: int) -> float:
        """The ``rank``-th largest draft log-prob (1-based) over the support: ``count(threshold(r))
        >= r``. Exact unless ``branch_cap``/``max_depth_bits`` cut sequences near it."""
        rank = _int_arg(rank, "rank", minimum=1)
        self.ensure_count(rank)
        if len(self) < rank:
            raise IndexError(self._beyond_message(f"threshold rank {rank} (1-based)"))
        v = float(-np.partition(-self._seq_lp, rank - 1)[rank - 1])
        # once every sequence scoring >= v is indexed, the rank-th largest indexed score is exact
        _, possible = self._bucket_range(v)
        self._ensure_budget(min(possible, self.quantizer.budget(self.max_depth_bits)))
        return float(-np.partition(-self._seq_lp, rank - 1)[rank - 1])

    def _structural(self, seq) -> tuple[tuple[int, ...], int]:
        """``(seq, bucket)`` of a support sequence, from one model call; ValueError outside it."""
        try:
            seq = tuple(int(t) for t in seq)
        except (TypeError, ValueError):
            raise ValueError(f"seq must be a sequence of token ids, got {seq!r}") from None
        n = len(seq)
        if self.eos is None:
            ok = n == self.max_len
        else:
            ok = 1 <= n <= self.max_len and seq[-1] == self.eos and self.eos not in seq[:-1]
        if not ok or min(seq, default=0) < 0:
            raise ValueError(f"seq {seq} is not in the model's support (length/eos rule)")
        prefixes = np.zeros((bucket_size(n), bucket_size(n)), np.int32)
        for j in range(n):
            prefixes[j, :j] = seq[:j]
        lengths = np.zeros(prefixes.shape[0], np.int32)
        lengths[:n] = np.arange(n)
        rows = np.asarray(self.model.next_logprobs(prefixes, lengths))[:n]
        self.forwards += n
        toks = np.asarray(seq)
        inside = toks < rows.shape[1]
        lps = np.full(n, -np.inf)
        lps[inside] = rows[np.flatnonzero(inside), toks[inside]]
        if not np.isfinite(lps).all():
            raise ValueError(f"seq {seq} has probability 0 under the model")
        return seq, int(self.quantizer.step_buckets(np.minimum(lps, 0.0)).sum())

    def rank_bracket(self, seq) -> tuple[int, int | float]:
        """``(lo, hi)`` containing the position of ``seq`` in the index order; ``lo == hi`` when it
        is indexed. For a sequence dropped by ``branch_cap`` or beyond ``max_depth_bits`` the bracket
        spans its bucket plus what was cut (``hi`` may be ``inf``)."""
        seq, fb = self._structural(seq)
        self._ensure_budget(min(fb, self.quantizer.budget(self.max_depth_bits)))
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

    def save(self, path) -> None:
        """Write the index to ``path`` atomically (see :mod:`jaxrescore.index.io`)."""
        from jaxrescore.index.io import save_index

        save_index(self, path)

    @classmethod
    def load(cls, path, model, *, progress: bool | None = None, chunk_rows: int = 4096) -> "SeekIndex":
        """Read an index saved by :meth:`save` for ``model``; ValueError for a corrupted, truncated,
        foreign-version or mismatched (model vocabulary/eos/max_len/first table) file."""
        from jaxrescore.index.io import load_index

        return load_index(cls, path, model, progress=progress, chunk_rows=chunk_rows)


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


def _pad_width(rows: np.ndarray, width: int) -> np.ndarray:
    if rows.shape[1] == width:
        return rows
    out = np.full((rows.shape[0], width), -np.inf, np.float32)
    out[:, : rows.shape[1]] = rows
    return out
