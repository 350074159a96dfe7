"""AREnvelopeIndex: approximate random access by rank, far deeper than any exact index can list.

"Which sequence sits at rank 10**12?" or "how many sequences score above -30 nats?" in milliseconds,
where an exact index (SeekIndex) would list everything above. Returned sequences and log-probs are
exact model quantities (the float64 sum of the clipped float32 steps, as SeekIndex reports them);
only the rank coordinate is an estimate.

Envelope. Per depth ``d``, the fine-bucket histograms (the :class:`~jaxrescore.quantize.Quantizer`,
as SeekIndex) of the next-token rows of typical length-``d`` contexts -- ancestral samples
conditioned on not stopping, or the prefixes of ``calibration_sequences`` -- averaged into one
envelope; depth 0 is the real root row, so it is exact. Leaves (EOS, or any token at the last
position of a fixed-length model) are kept apart from tokens that continue. Suffix tables ``S_d[b]``
(estimated completions of a depth-``d`` prefix with bucket ``b``) come from one truncated float64
convolution per depth, for buckets up to ``max_depth_bits``.

Order. SeekIndex's: by sequence fine bucket ``B``, then depth first, likelier tokens first (ties by
token id). ``unrank`` descends the REAL model, one batched forward per depth for a whole batch of
ranks, carrying for each prefix its *demand*: how many ranks of each bucket ``B`` it was given
(float64[M], a function of the prefix alone, so every rank through a prefix sees the same split and
distinct ranks stay distinct). A prefix deals each bucket's ranks to its children in proportion to
their estimated completions there (``S_{d+1}[B - fb(child)]``; 1 at its own bucket for a leaf),
never more than a child's capacity (its completions: ``V**rest`` for a fully supported model, 1 for
a leaf); ranks no child can hold at their bucket take free estimated slots in later buckets, then
spare capacity (:mod:`jaxrescore.index.envelope.descent`). At the last step the ranks are matched
one to one to the real leaves by bucket; with ``lookahead`` the prefix one step before reads its
children's rows and matches its ranks to its real two-step completions. So a fully supported model
(no ``-inf`` log-prob: any softmax model) never gives two ranks the same sequence. A model with
zero-probability tokens can give a prefix more ranks than it has completions: those ranks are
counted in ``collisions`` and a RuntimeWarning says how many distinct sequences the query got.

Exactness. For a model whose next-token row does not depend on the prefix every estimate is the real
count, nothing overflows, and sequences, order, counts and thresholds are exactly SeekIndex's.

Soundness. The order is approximate, so there is no bucket bound (``bucket_bound is None``,
``exact_order = False``): RescoredIndex never certifies over it under an assumed gap. ``truncated``
turns False only after one query returned ``len(self)`` distinct sequences and that number equals
every structurally possible sequence: the index then provably holds the whole support.
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from jaxrescore._checks import check_bool, check_float, check_int
from jaxrescore.index.envelope.calibration import EnvelopeCalibration
from jaxrescore.index.envelope.descent import LeafSplit, Split, SubtreeSplit, children_of, step_buckets
from jaxrescore.index.envelope.io import load_envelope, save_envelope
from jaxrescore.index.support import support_sequence
from jaxrescore.models.base import AutoregressiveEnumerable
from jaxrescore.quantize import LN2, TOL, Quantizer
from jaxrescore.sequences import bucket_size
from jaxrescore.typing import ArrayLike, PathLike, Sequences, Tokens

MAX_RANK = 2**53  # ranks and demands are float64 integers on the host: exact below this
RESOLVE_LIMIT = 1 << 12  # ranks count/threshold read one by one; past it they estimate in closed form
LP_MEMO = 1 << 16  # log-probs of ranks remembered for count/threshold
LOOKAHEAD_VOCAB = 256  # lookahead=None: on up to this V (a prefix then matches up to V**2 completions)


def _to_float(n: int) -> float:
    return float(n) if n < 2**1000 else math.inf


def _irwin_hall(n: int, x: np.ndarray) -> np.ndarray:
    """CDF float64[...] at ``x`` of the sum of ``n`` independent uniforms on [0, 1) (normal past 12)."""
    x = np.clip(np.asarray(x, np.float64), 0.0, float(n))
    if n > 12:
        return 0.5 * (1.0 + np.vectorize(math.erf)((x - n / 2) / math.sqrt(n / 6)))
    k = np.arange(n + 1)
    terms = (-1.0) ** k * np.array([math.comb(n, i) for i in k]) * np.maximum(x[..., None] - k, 0.0) ** n
    return np.clip(terms.sum(axis=-1) / math.factorial(n), 0.0, 1.0)


class AREnvelopeIndex(EnvelopeCalibration):
    """Per-depth mean-field envelope index over an AutoregressiveEnumerable (see the module docstring).

    Args:
      model: vocab_size, eos, max_len, ``next_logprobs(prefixes int32[B, T], lengths int32[B])``.
      bin_width_bits, oversample: the :class:`~jaxrescore.quantize.Quantizer` (as SeekIndex's).
      n_paths: contexts sampled per depth for the envelope (more = a sharper envelope).
      seed: the sampling seed; the index is a deterministic function of it.
      calibration_sequences: typical token sequences (a corpus) whose prefixes calibrate the envelope
        instead of samples; a depth none of them reaches reuses the envelope of the depth above.
      max_depth_bits: the deepest sequence bucket ranked; ``len(self)`` counts the estimated
        sequences within it (at most 2**53, the float64 integers).
      progress: tqdm bar over calibration rows: None shows it once calibration runs over a second,
        True always, False never.
      chunk_rows: prefixes per ``next_logprobs`` call.
      lookahead: one step before the leaves, read the rows of every child of a prefix (one batched
        forward of up to V rows) and match its ranks to its real completions, not the envelope's:
        a smaller rank error for ``V`` more rows per such prefix. None: on when ``vocab_size <= 256``.

    Counters: ``forwards`` (model rows evaluated, padding excluded), ``collisions`` (ranks that found
    no slot of their own and reused a sequence; 0 for any fully supported model).
    """

    exact_order = False  # jaxrescore.rescore.draft: an approximate order offers no bound
    bucket_bound = None

    def __init__(self, model: AutoregressiveEnumerable, *, bin_width_bits: float = 1.0, oversample: int = 8,
                 n_paths: int = 64, seed: int = 0, calibration_sequences: Sequences | None = None,
                 max_depth_bits: float = 64.0,
                 progress: bool | None = None, chunk_rows: int = 4096, lookahead: bool | None = None):
        self._setup(model, Quantizer(bin_width_bits, oversample), max_depth_bits, progress, chunk_rows)
        self.lookahead = self.vocab_size <= LOOKAHEAD_VOCAB if lookahead is None else check_bool(lookahead, "lookahead")
        self.n_paths = check_int(n_paths, "n_paths", minimum=1)
        self.seed = check_int(seed, "seed", minimum=0)
        corpus = None if calibration_sequences is None else self._corpus_arg(calibration_sequences)
        self.calibrated_on = "samples" if corpus is None else "sequences"
        self._calibrate(corpus)
        self._build()

    @property
    def vocab_size(self) -> int:
        """V: the model's; with an inferred vocabulary its current size (it grows), at least 1
        (eos + 1 when the model has an eos)."""
        if self._vocab_inferred:
            return max(int(self.model.vocab_size), self._min_vocab)
        return self._vocab_size

    def _setup(self, model, quantizer, max_depth_bits, progress, chunk_rows):
        for attr in ("vocab_size", "eos", "max_len", "next_logprobs"):
            if not hasattr(model, attr):
                raise TypeError(
                    f"model must implement AutoregressiveEnumerable (vocab_size, eos, max_len, "
                    f"next_logprobs); {type(model).__name__} has no {attr!r}"
                )
        self.model = model
        self.max_len = check_int(model.max_len, "model.max_len", minimum=1)
        self.eos = None if model.eos is None else check_int(model.eos, "model.eos", minimum=0)
        # An inferred vocabulary (CallableModel without vocab_size) starts at 0 and grows as rows
        # name tokens (as SeekIndex accepts it): ``vocab_size`` then reads the model's current size
        # (at least one token, or eos + 1), and no structural count caps the ranks (the support is
        # unknown, so the index never reports itself exhausted).
        self._vocab_inferred = bool(getattr(model, "vocab_inferred", False))
        if self._vocab_inferred:
            self._min_vocab = 1 if self.eos is None else self.eos + 1
            check_int(model.vocab_size, "model.vocab_size", minimum=0)
        else:
            self._vocab_size = check_int(model.vocab_size, "model.vocab_size", minimum=1)
        self.quantizer = quantizer
        self.max_depth_bits = check_float(max_depth_bits, "max_depth_bits", minimum=0.0, unit="bits")
        self._M = quantizer.budget(self.max_depth_bits) + 1
        self.progress = None if progress is None else check_bool(progress, "progress")
        self.chunk_rows = check_int(chunk_rows, "chunk_rows", minimum=1)
        self.forwards = 0
        self.collisions = 0
        self._whole = False
        self.lookahead = False
        self._lp_memo: dict[int, float] = {}
        L, V = self.max_len, self.vocab_size
        # completions below a continuing prefix of length d: the most ranks it may ever be given
        if self._vocab_inferred:
            counts = [float("inf")] * (L + 1)
        elif self.eos is None:
            counts = [V ** (L - d) for d in range(L + 1)]
        else:
            counts = [sum((V - 1) ** j for j in range(L - d)) for d in range(L + 1)]
        self._structural = counts[0]
        self._structural_caps = np.array([_to_float(c) for c in counts])

    # -- model calls ---------------------------------------------------------------------------------

    def _fetch(self, prefixes: np.ndarray, lengths: np.ndarray, bar=None) -> np.ndarray:
        """Next-token rows float32[u, V] (clipped to <= 0) after ``prefixes: int32[u, T]`` of
        ``lengths: int32[u]``: padded power-of-two calls of ``chunk_rows`` prefixes."""
        out = []
        width = bucket_size(max(int(lengths.max(initial=0)), 1))
        for lo in range(0, lengths.size, self.chunk_rows):
            part, plen = prefixes[lo : lo + self.chunk_rows], lengths[lo : lo + self.chunk_rows]
            b = plen.size
            pre = np.zeros((bucket_size(b), width), np.int32)
            pre[:b, : part.shape[1]] = part
            lens = np.zeros(pre.shape[0], np.int32)
            lens[:b] = plen
            rows = np.asarray(self.model.next_logprobs(pre, lens))
            if rows.ndim != 2 or rows.shape[0] != pre.shape[0]:
                raise ValueError(
                    f"model.next_logprobs returned shape {rows.shape} for {pre.shape[0]} prefixes; expected [B, V]"
                )
            rows = rows[:b].astype(np.float32)
            if np.isnan(rows).any():
                raise ValueError("model.next_logprobs returned NaN log-probs")
            self.forwards += b
            if bar is not None:
                bar.update(b)
            out.append(np.minimum(rows, np.float32(0)))
        w = max(r.shape[1] for r in out)
        return np.concatenate([np.pad(r, ((0, 0), (0, w - r.shape[1])), constant_values=-np.inf) for r in out])

    def _build(self) -> None:
        """Suffix tables ``_suffix[d]: float64[M]`` and the rank space ``_cum`` (ranks in buckets
        <= b, float64[M]); ``_root_demand`` is its per-bucket difference."""
        L, M = self.max_len, self._M
        inner, leaf = self._body.copy(), self._eosh.copy()
        if self.eos is None:
            inner[L - 1], leaf[L - 1] = 0.0, self._body[L - 1]
        else:
            inner[L - 1] = 0.0  # only eos fits at max_len
        suffix = np.zeros((L, M))
        suffix[L - 1] = leaf[L - 1]
        for d in range(L - 2, -1, -1):
            suffix[d] = leaf[d] + np.convolve(inner[d], suffix[d + 1])[:M]
        self._suffix = suffix
        self._cum = np.floor(np.cumsum(suffix[0]) + 0.5)
        self._root_demand = np.diff(self._cum, prepend=0.0)
        n_inner, n_leaf = self._n_body.copy(), self._n_eos.copy()
        if self.eos is None:
            n_inner[L - 1], n_leaf[L - 1] = 0.0, self._n_body[L - 1]
        else:
            n_inner[L - 1] = 0.0
        est = np.zeros(L + 1)  # estimated completions below a continuing prefix of length d
        with np.errstate(over="ignore", invalid="ignore"):
            for d in range(L - 1, -1, -1):
                est[d] = n_leaf[d] + n_inner[d] * est[d + 1]
        self._total = float(est[0])
        # A child is never handed more ranks than its capacity: the structural count, or the
        # envelope's estimate where rows have zero-probability tokens (equal for full support).
        self._caps = np.minimum(self._structural_caps, np.maximum(np.floor(est * (1 + 1e-12) + 1e-9), 1.0))

    # -- state ---------------------------------------------------------------------------------------

    def __repr__(self) -> str:
        return (
            f"AREnvelopeIndex(model={type(self.model).__name__}, ranks={len(self):,} (estimated), "
            f"max_depth_bits={self.max_depth_bits:g}, n_paths={self.n_paths}, forwards={self.forwards:,})"
        )

    def __len__(self) -> int:
        """Ranks available: the estimated sequences within ``max_depth_bits`` (at most 2**53)."""
        return int(min(self._cum[-1], MAX_RANK))

    @property
    def total(self) -> float:
        """Estimated number of sequences in the whole support, any depth (exact for a model whose
        rows do not depend on the prefix; ``inf`` past the float64 range)."""
        return self._total

    @property
    def truncated(self) -> bool:
        """False only once the index has provably returned the whole support: one query gave
        ``len(self)`` distinct sequences and that is every structurally possible sequence."""
        return not self._whole

    @property
    def exhausted(self) -> bool:
        return self._whole

    # -- unrank: descend the real model --------------------------------------------------------------

    def _descend(self, ranks: np.ndarray):
        """Tokens int32[N, L], lengths int32[N], log-probs float64[N], collided bool[N], dead bool[N]
        (a prefix with no continuation was reached) of ``ranks: int64[N]`` (all in range), and
        whether a terminating model could continue past ``max_len`` at a prefix met (a length cut)."""
        n, L = ranks.size, self.max_len
        rk = ranks.astype(np.float64)
        b = np.searchsorted(self._cum, rk, side="right")
        o = rk - (self._cum - self._root_demand)[b]
        toks, lens = np.zeros((n, L), np.int32), np.zeros(n, np.int32)
        lps, coll, dead = np.zeros(n), np.zeros(n, bool), np.zeros(n, bool)
        node = np.zeros(n, np.int64)
        demands, fbs = [self._root_demand], [0]
        live, cut = np.arange(n), False
        for d in range(L):
            if live.size == 0:
                break
            live = live[np.argsort(node[live], kind="stable")]
            ids, starts = np.unique(node[live], return_index=True)
            rows = self._fetch(toks[live[starts], :d], np.full(ids.size, d, np.int32))
            ahead = self.lookahead and d == L - 2
            below = self._below(d, toks[live[starts], :d], rows) if ahead else None
            if self.eos is not None and d >= L - 2:
                last = rows if d == L - 1 else np.concatenate(below) if below else None
                cut = cut or bool(last is not None and np.isfinite(np.delete(last, self.eos, axis=1)).any())
            edges = np.append(starts, live.size)
            new_demands, new_fbs, new_live = [], [], []
            for i, k in enumerate(ids):
                qi = live[edges[i] : edges[i + 1]]
                if ahead:  # the last two steps at once, on real completions
                    sp = SubtreeSplit(self, d, rows[i], demands[k], fbs[k], below[i])
                    if sp.n_comp == 0:
                        dead[qi] = True
                        continue
                    child, leaf2, c = sp.route(b[qi], o[qi])
                    coll[qi] |= c
                    toks[qi, d], lps[qi] = sp.tok[child], lps[qi] + sp.steps[child]
                    lens[qi] = d + 1
                    two = np.flatnonzero(leaf2 >= 0)
                    q2, c2, l2 = qi[two], child[two], leaf2[two]
                    toks[q2, d + 1], lps[q2], lens[q2] = sp.kid_tok[c2, l2], lps[q2] + sp.kid_lp[c2, l2], d + 2
                    continue
                sp = Split(self, d, rows[i], demands[k], fbs[k], extra=np.unique(b[qi]))
                if sp.n == 0:
                    dead[qi] = True
                    continue
                if sp.leaf.all():
                    sp = LeafSplit(sp, demands[k])
                child, b[qi], o[qi], c = sp.route(b[qi], o[qi])
                coll[qi] |= c
                toks[qi, d] = sp.tok[child]
                lps[qi] += sp.steps[child]
                leaf = sp.leaf[child]
                lens[qi[leaf]] = d + 1
                cont, cch = qi[~leaf], child[~leaf]
                srt = np.argsort(cch, kind="stable")
                cont, cch = cont[srt], cch[srt]
                uc, ustart = np.unique(cch, return_index=True)
                for c_id, lo, hi in zip(uc.tolist(), ustart.tolist(), ustart[1:].tolist() + [cch.size]):
                    node[cont[lo:hi]] = len(new_demands)
                    new_demands.append(sp.child_demand(int(c_id)))
                    new_fbs.append(int(sp.cfb[c_id]))
                    new_live.append(cont[lo:hi])
            demands, fbs = new_demands, new_fbs
            live = np.concatenate(new_live) if new_live else np.zeros(0, np.int64)
        return toks, lens, lps, coll, dead, cut

    def _below(self, d: int, prefixes: np.ndarray, rows: np.ndarray) -> list[np.ndarray]:
        """The rows ``float32[n_i, V]`` of every child of each depth-``d`` prefix (``prefixes:
        int32[u, d]``, rows ``float32[u, V]``), children in order, ``-inf`` rows for leaf children:
        one batched forward."""
        inner = [~children_of(self, d, row)[2] for row in rows]
        tok = [children_of(self, d, row)[0] for row in rows]
        pre = [np.c_[np.repeat(p[None, :], k.sum(), axis=0), t[k]] for p, t, k in zip(prefixes, tok, inner)]
        flat = np.concatenate(pre).astype(np.int32) if pre else np.zeros((0, d + 1), np.int32)
        got = self._fetch(flat, np.full(flat.shape[0], d + 1, np.int32)) if flat.shape[0] else rows[:0]
        out, at = [], 0
        for t, k in zip(tok, inner):
            block = np.full((t.size, max(got.shape[1], rows.shape[1])), -np.inf, np.float32)
            block[k, : got.shape[1]] = got[at : at + int(k.sum())]
            at += int(k.sum())
            out.append(block)
        return out

    def _unrank(self, ranks: np.ndarray, *, warn: bool):
        """Sequences (tuples) and log-probs float64[N] of valid ``ranks: int64[N]``. A rank whose
        descent meets a prefix with no continuation takes a nearby rank's sequence (a collision):
        the first that finds one at distance 1, 3, 7, ... (earlier before later, clipped to the
        valid ranks; rank 0 itself may lead to a prefix that can never end)."""
        saved = (self.forwards, self.collisions)
        try:
            toks, lens, lps, coll, dead, cut = self._descend(ranks)
            pending, step, last = np.flatnonzero(dead), 1, len(self) - 1
            while pending.size:
                r = ranks[pending]
                if step > 1 and (r - step // 2 <= 0).all() and (r + step // 2 >= last).all():
                    raise RuntimeError(
                        "the envelope descent found no sequence: the model has prefixes with no "
                        f"continuation within max_len={self.max_len}"
                    )
                tries = np.concatenate([np.maximum(r - step, 0), np.minimum(r + step, last)])
                t2, l2, lp2, _, d2, _ = self._descend(tries)
                m = pending.size
                late = d2[:m] & ~d2[m:]  # the earlier rank died, the later one did not
                pick = np.where(late, np.arange(m) + m, np.arange(m))
                toks[pending], lens[pending], lps[pending] = t2[pick], l2[pick], lp2[pick]
                coll[pending] = True
                pending, step = pending[d2[:m] & d2[m:]], 2 * step + 1
        except BaseException:
            self.forwards, self.collisions = saved
            raise
        self.collisions += int(coll.sum())
        seqs = [tuple(row[:k]) for row, k in zip(toks.tolist(), lens.tolist())]
        if warn:
            distinct, asked = len(set(seqs)), np.unique(ranks).size
            if distinct < asked:
                warnings.warn(
                    f"AREnvelopeIndex: {asked} distinct ranks gave {distinct} distinct sequences (the "
                    "model has zero-probability tokens the envelope could not foresee)",
                    RuntimeWarning,
                    stacklevel=3,
                )
            if (not self._whole and not cut and distinct == asked == len(self) == self._structural
                    and ranks.min() == 0 and ranks.max() == asked - 1):
                self._whole = True  # every possible sequence, each once, none cut: the whole support
        return seqs, lps

    def _ranks_arg(self, ranks) -> np.ndarray:
        arr = np.asarray(ranks)
        if arr.size and not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(f"ranks must be integers, got dtype {arr.dtype}")
        arr = arr.astype(np.int64).reshape(-1)
        if arr.size and arr.min() < 0:
            raise IndexError(f"ranks must be >= 0, got {int(arr.min())}")
        if arr.size and arr.max() >= len(self):
            raise IndexError(
                f"rank {int(arr.max())} is beyond the {len(self)} sequences estimated within "
                f"max_depth_bits={self.max_depth_bits:g}"
            )
        return arr

    def unrank_batch(self, ranks: ArrayLike) -> tuple[list[tuple[int, ...]], np.ndarray]:
        """The sequences at ``ranks: int[N]`` (estimated ranks) and their exact log-probs
        ``float64[N]``; one batched forward per depth. IndexError beyond ``len(self)``."""
        arr = self._ranks_arg(ranks)
        if arr.size == 0:
            return [], np.zeros(0)
        return self._unrank(arr, warn=True)

    def unrank(self, i: int) -> tuple[tuple[int, ...], float]:
        """The sequence at (estimated) rank ``i``, 0-based, and its exact log-prob."""
        i = check_int(i, "rank", minimum=None)
        if i < 0:
            raise IndexError(f"rank must be >= 0, got {i}")
        seqs, lps = self.unrank_batch(np.array([i], np.int64))
        return seqs[0], float(lps[0])

    def slice(self, start: int, k: int) -> list[tuple[tuple[int, ...], float]]:
        """Up to ``k`` ``(sequence, log_prob)`` pairs from rank ``start`` on (fewer only where the
        ranks run out)."""
        start = check_int(start, "start", minimum=0)
        k = check_int(k, "k", minimum=0)
        stop = min(start + k, len(self))
        if stop <= start:
            return []
        seqs, lps = self.unrank_batch(np.arange(start, stop, dtype=np.int64))
        return list(zip(seqs, lps.tolist()))

    # -- counts and thresholds -----------------------------------------------------------------------

    def _before(self, b: int) -> float:
        """Ranks in buckets < b."""
        return float(self._cum[b - 1]) if b > 0 else 0.0

    def _region_lps(self, lo: float, hi: float) -> np.ndarray | None:
        """Log-probs of ranks ``[lo, hi)`` read one by one (remembered: neighbouring counts and
        thresholds share them), or None past ``RESOLVE_LIMIT`` of them."""
        if hi - lo > RESOLVE_LIMIT:
            return None
        ranks = np.arange(int(lo), int(hi), dtype=np.int64)
        missing = np.array([r for r in ranks.tolist() if r not in self._lp_memo], np.int64)
        if missing.size:
            if len(self._lp_memo) > LP_MEMO:
                self._lp_memo.clear()
            self._lp_memo.update(zip(missing.tolist(), self._unrank(missing, warn=False)[1].tolist()))
        return np.array([self._lp_memo[r] for r in ranks.tolist()])

    def _mean_field_count(self, x: float) -> float:
        """Ranks whose sequences are estimated to have ``-log2 p * scale <= x``: a sequence of ``n``
        steps in bucket ``b`` sits at ``b + F``, ``F`` the sum of its steps' fractional parts, taken
        as ``n = max_len`` independent uniforms (Irwin-Hall)."""
        return float(self._root_demand @ _irwin_hall(self.max_len, x - np.arange(self._M)))

    def _threshold_arg(self, t) -> float:
        t = check_float(t, "min_log_prob", finite=False)
        if t == -math.inf:
            raise ValueError("min_log_prob must be finite (-inf would ask for the whole support)")
        return float(t)

    def count(self, min_log_prob: float) -> int:
        """Estimated number of sequences with log-prob ``>= min_log_prob`` within ``max_depth_bits``.

        Buckets that surely clear the threshold count whole; the few where bucket and score disagree
        are read sequence by sequence when they hold at most ``RESOLVE_LIMIT`` ranks (exact for a
        model whose rows do not depend on the prefix, as SeekIndex.count), else estimated in
        closed form (``_mean_field_count``)."""
        t = self._threshold_arg(min_log_prob)
        if t > 0:
            return 0
        x = -t / LN2 * self.quantizer.scale
        # a sum of n per-step floors lies in (bits*scale - n, bits*scale + n*TOL]
        sure = min(math.floor(x) - self.max_len - 1, self._M - 1)
        possible = min(math.floor(x + self.max_len * TOL), self._M - 1)
        lo = self._cum[sure] if sure >= 0 else 0.0
        lps = self._region_lps(lo, self._cum[possible] if possible >= 0 else 0.0)
        if lps is None:
            return int(round(self._mean_field_count(x)))
        return int(lo) + int(np.count_nonzero(lps >= t))

    def threshold(self, rank: int) -> float:
        """Estimated ``rank``-th largest log-prob (1-based) within ``max_depth_bits``.

        It lies within ``max_len + 1`` buckets of the bucket of rank ``rank - 1`` (bucket and score
        differ by under a step per token), so it is the right order statistic of the ranks within
        ``2 * max_len + 2`` buckets of it: read one by one when they are at most ``RESOLVE_LIMIT``
        (exact for a model whose rows do not depend on the prefix), else the inverse of the
        closed-form estimate of :meth:`count`."""
        rank = check_int(rank, "rank", minimum=1)
        if rank > len(self):
            raise IndexError(f"threshold rank {rank} (1-based) is beyond the {len(self)} ranks estimated")
        b = int(np.searchsorted(self._cum, rank - 1, side="right"))
        span = 2 * self.max_len + 2
        lo = self._before(max(b - span, 0))
        lps = self._region_lps(lo, self._cum[min(b + span, self._M - 1)])
        if lps is not None:
            return float(np.sort(lps)[::-1][rank - int(lo) - 1])
        x_lo, x_hi = 0.0, float(self._M + self.max_len)
        for _ in range(60):  # bisection: the estimate is monotone in x
            mid = 0.5 * (x_lo + x_hi)
            x_lo, x_hi = (mid, x_hi) if self._mean_field_count(mid) < rank else (x_lo, mid)
        return -x_hi / self.quantizer.scale * LN2

    # -- rank of a given sequence --------------------------------------------------------------------

    def _seq_arg(self, seq) -> tuple[int, ...]:
        seq = support_sequence(seq, self.eos, self.max_len)
        if min(seq, default=0) < 0 or max(seq, default=0) >= self.vocab_size:
            raise ValueError(f"seq {seq} is not in the model's support (a token id outside [0, {self.vocab_size}))")
        return seq

    def rank_bracket(self, seq: Tokens) -> tuple[int, int | float]:
        """An ESTIMATE of the rank of ``seq``: ``(r, r)`` when the index places ``seq`` at rank ``r``
        (``unrank(r) == seq``; for a model whose rows do not depend on the prefix that is its exact
        SeekIndex rank), else the estimated rank span of its bucket (``(len, inf)`` beyond
        ``max_depth_bits``). One batched forward over its prefixes."""
        seq = self._seq_arg(seq)
        n = len(seq)
        pre = np.zeros((n, n), np.int32)
        for j in range(n):
            pre[j, :j] = seq[:j]
        rows = self._fetch(pre, np.arange(n, dtype=np.int32))
        steps = rows[np.arange(n), np.minimum(seq, rows.shape[1] - 1)].astype(np.float64)
        if np.any(np.asarray(seq) >= rows.shape[1]) or not np.isfinite(steps).all():
            raise ValueError(f"seq {seq} has probability 0 under the model")
        fb = int(step_buckets(self.quantizer, steps).sum())
        demand, at, path, pos = self._root_demand, 0, [], None
        for d in range(n):
            if self.lookahead and d == self.max_len - 2:
                below = self._below(d, np.array(seq[:d], np.int32).reshape(1, d), rows[d][None])[0]
                sp = SubtreeSplit(self, d, rows[d], demand, at, below)
                c = int(np.flatnonzero(sp.tok == seq[d])[0])
                leaf = -1 if sp.leaf[c] else int(np.flatnonzero(sp.kid_tok[c] == seq[d + 1])[0])
                pos = sp.held(sp.completion(c, leaf)) if sp.n_comp else None
                break
            sp = Split(self, d, rows[d], demand, at)
            c = int(np.flatnonzero(sp.tok == seq[d])[0])
            if sp.leaf.all():
                pos = LeafSplit(sp, demand).held(c)
                break
            path.append((sp, c))
            if sp.leaf[c]:
                held = np.flatnonzero(sp.child_demand(c) >= 1)
                pos = (int(held[0]), 0.0) if held.size else None
                pos = sp.invert(c, *pos) if pos is not None else None
                path.pop()
                break
            demand, at = sp.child_demand(c), int(sp.cfb[c])
        for sp, c in reversed(path):
            if pos is None:
                break
            pos = sp.invert(c, *pos)
        if pos is not None:
            r = int(self._before(pos[0]) + pos[1])
            return r, r
        if fb >= self._M:
            return len(self), math.inf
        lo = int(self._before(fb))
        return lo, max(lo, int(self._cum[fb]) - 1)

    # -- persistence ---------------------------------------------------------------------------------

    def save(self, path: PathLike) -> None:
        """Write the index to ``path`` atomically (see :mod:`jaxrescore.index.envelope.io`)."""
        save_envelope(self, path)

    @classmethod
    def load(
        cls, path: PathLike, model: AutoregressiveEnumerable, *, progress: bool | None = None, chunk_rows: int = 4096
    ) -> AREnvelopeIndex:
        """Read an index saved by :meth:`save` for ``model``. FileNotFoundError for a missing file;
        ValueError naming the file for an unreadable, truncated, foreign-format, other-version or
        tampered one, or one built for a model with another vocab_size/eos/max_len or other
        next-token rows at the stored calibration contexts (re-evaluated in one model call)."""
        return load_envelope(cls, path, model, progress=progress, chunk_rows=chunk_rows)
