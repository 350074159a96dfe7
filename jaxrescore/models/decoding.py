"""Incremental decoding: next-token rows that reuse the key/value caches of their ancestors.

``model.next_logprobs(prefixes, lengths)`` of a JAX model runs the whole prefix (and a prompt)
through the network for every row. A caller that expands prefixes level by level (a SeekIndex
build, a best-first search, a greedy completion) asks next for the CHILDREN of the prefixes it
just expanded: with the parents' key/value caches kept, a child costs one token position.

:class:`DecodingSession` is that caller-held state, explicit and disposable (no model keeps hidden
caches): ``session.next_logprobs(prefixes, lengths)`` answers like the model and

- a row of length 0 is the context's own row (BOS and, for a prompted model, the prompt: its
  cache is computed ONCE per ``with_prompt``, in one call, and kept on the prompted model);
- a row whose parent (the prefix without its last token) this session computed before, and still
  holds, costs one token position: the parent's cache rows are gathered and one step appends;
- a row whose parent is not held but a shorter ancestor is (a caller that skipped levels, a
  teacher-forced continuation of a computed prefix) runs its remaining tokens in ONE call on top
  of the ancestor's cache; any other row runs every token of its prefix in one call on top of
  the context (multi-token prefill);
- every row computed keeps its cache (keyed by its tokens) until the session's ``max_bytes`` is
  passed; then the oldest calls' caches are dropped first (a level-by-level caller no longer
  needs them). When a call's own caches do not fit in ``max_bytes`` the session says so ONCE (a
  ``UserWarning`` naming the bytes needed and the knob) instead of silently recomputing every
  child from the context.

Teacher forcing. ``session.teacher_force(rows, known, top_m)`` returns the ``score_frontier``
numbers (steps, top-m, eos) of each row's positions from ``known[i]`` on, reduced on device from
ONE multi-token call per group of rows (the decoder returns logits at every fed position for a
2-D ``last``; on the CPU backend a small vocabulary's rows come whole and the host picks their
top-m, see :data:`~jaxrescore.models.teacher.HOST_TOP_M_MAX_VOCAB`); each row feeds only what no held prefix covers, and afterwards every prefix of
what it fed is held (a radix cache over the scored trie; a user's step model keys whole fed
prefixes only). See :mod:`jaxrescore.models.teacher` for what one call shares.
``session.packed_force(rows, top_m)`` is a first call's alternative for the library's networks:
the full forward itself, packed as one tree (:mod:`jaxrescore.models.packed`; numbers that need
no check), which also yields the rows' caches for later calls to extend.

Shapes and bytes. Rows per call are padded to ``min_rows`` times a power of four up to 256 rows,
a power of two above (at least :data:`ONE_TOKEN_ROWS` in a call of one token per row); fed widths
are powers of four; the held rows live in one pool per cache shape
(:mod:`jaxrescore.models.cache_pool`), so a call extends rows held by any earlier calls with one
gather. The SHARED context (the prompt's keys and
values) is one ``C``-position array, ``C`` = 8 times a power of four, held once by the prompted
model and never copied per row; a row cache of the library's networks (TransformerLM, its int8
twin, from_pretrained) covers the row's OWN positions only, ``S`` of them with ``S`` 8 times a
power of four (capped at the power of two covering the model's ``max_len``) covering the
longest row, so a
row of a 1024-context GPT-2-small-shaped model holds ``2 * 12 layers * S * 768 * 4`` bytes
(590 KB at ``S = 8``) whatever the prompt's length and thousands fit in the default budget.
Prefill blocks are powers of two, so a level of any depth reuses one of a few compiled shapes.
Rows agree with the full forward to float32 noise (summation order): tests/test_models_decoding.py
checks it.

Models. :class:`~jaxrescore.models.transformer.TransformerLM`, its int8 twin and
:func:`~jaxrescore.models.from_pretrained` models decode with a shared context as above.
``from_apply_fn(..., init_cache=..., step=...)`` (and ``from_linen`` of a module using flax's
``decode=True`` attention, which needs no step of one's own) take a step in the style of flax
decoding (see :func:`jaxrescore.models.from_apply_fn`): its caches are the user's, per row, at
full length (the prompt copied into each), and a prefill of ``W`` tokens runs the step ``W``
times inside one compiled call. :func:`decoding_session` returns None for a model without an
incremental forward (an n-gram is a table lookup, a callable has no cache); callers then use the
model itself.
"""

from __future__ import annotations

import collections
import warnings
from typing import Any

import jax
import numpy as np

from jaxrescore.models.cache_pool import CachePools, pool_key
from jaxrescore.models.cache_sizes import (  # noqa: F401 (CACHE_BYTES_ENV: re-exported)
    BLOCK_POSITIONS, CACHE_BYTES_ENV, MIN_CACHE_LEN, ONE_TOKEN_ROWS, SHORT_ROWS_CACHE, coarse_size, default_cache_bytes,
)
from jaxrescore.models.checks import check_nan, check_prefixes
from jaxrescore.models.decoder import (  # noqa: F401 (Decoder, Context, model_decoder: re-exported)
    Context, Decoder, _decode, _split_prompt, decoding_context, model_decoder,
)
from jaxrescore.models.mesh import mesh_context, to_host
from jaxrescore.models.packed import KeepCaches, packed_frontier, packed_row_positions
from jaxrescore.models.scores import FLOAT32_TOLERANCE, check_top_m, score_tolerance
from jaxrescore.models.teacher import TeacherForced, TeacherOut, check_teacher_rows, frontier_reduce, share_feeds
from jaxrescore.sequences import bucket_size
from jaxrescore.typing import ArrayLike, Sequences

# (decoder, row-cache length, context shapes) -> the shapes of fresh row caches (see _fresh)
_FRESH_SHAPES: dict = {}
# Calls of up to this many rows pad to powers of four of rows (few shapes; padding a small call
# costs little), larger ones to powers of two (measured side by side on the grammar workload's
# proven top-100: powers of four throughout cost 9-13% of the proof's wall, this 6-8%, against
# powers of two; the first proven top-25 on real text compiles 22 programs against 25)
COARSE_ROWS = 256
# A call whose rows would be padded by more than this many positions (rows times fed width) is
# split into calls of the compiled shapes it fills (on CPU, where a padding position costs a real
# one's compute: the wide workload's proven top-100 computed 43,424 padded positions for 19,251
# real ones; an extra call costs about what 16-64 positions do)
SPLIT_POSITIONS = 64
# (that key, rows) -> those zeros on the device, the most recently used last (a few kept)
_FRESH_ZEROS: dict = {}


class DecodingSession:
    """``next_logprobs`` of a JAX model that reuses the caches of the prefixes it computed (see
    the module docstring). Build with :func:`decoding_session`.

    Attributes:
      model: the model answered for (a JAX model or a prompted one).
      vocab_size, eos, max_len: the model's.
      max_bytes: the most bytes of row caches held; the oldest are dropped past it (0: none kept,
        and no warning).
      positions: token positions computed (each row the tokens it added to the cache it started
        from: 1 for a row whose parent was held, its length for a row prefilled from the context).
      row_positions: int64[N], the positions the last :meth:`teacher_force` or
        :meth:`packed_force` computed for each of its rows (what a joint call of several
        queries charges each, see :mod:`jaxrescore.rescore.many`).
      rows: rows answered; ``extended``: rows answered (or teacher-forced rows fed) from a held
        parent or ancestor cache; ``calls``: device calls made. ``positions`` and ``calls``
        count :meth:`teacher_force` too.
      nbytes: bytes of row caches held now; ``held_rows``: rows they cover;
        :attr:`bytes_per_row`: their ratio. The shared context is not counted (held once, on the
        prompted model).
    """

    def __init__(self, model: Any, *, max_bytes: int | None = None):
        dec = model_decoder(model)
        if dec is None:
            raise TypeError(f"{type(model).__name__} has no incremental forward (see decoding_session)")
        self.model = model
        self._base, self._prompt = _split_prompt(model)
        self._dec = dec
        self.vocab_size, self.eos, self.max_len = int(model.vocab_size), model.eos, int(model.max_len)
        self.max_bytes = default_cache_bytes() if max_bytes is None else int(max_bytes)
        self.positions = self.rows = self.extended = self.calls = 0
        self.row_positions = np.zeros(0, np.int64)
        self.nbytes = self.held_rows = 0
        self._where: dict[bytes, tuple] = {}  # prefix key -> (pool key, slot)
        self._lengths: collections.Counter = collections.Counter()  # prefix length -> keys held
        self._pools = CachePools(self._base._put, host=self._base.mesh is None and jax.default_backend() == "cpu")
        # per hold, oldest first: (pool key, slots, [(prefix key, slot)], call number, rows, bytes)
        self._held: collections.deque = collections.deque()
        self._call = 0
        self._warned = False
        self._params = None

    def __repr__(self) -> str:
        return f"DecodingSession({self.model!r}, held={len(self._where)} prefixes, {self.nbytes:,} bytes)"

    @property
    def score_tolerance(self):
        return getattr(self.model, "score_tolerance", None)

    @property
    def bytes_per_row(self) -> float:
        """Bytes of row cache held per row held (0.0 when none is held)."""
        return self.nbytes / self.held_rows if self.held_rows else 0.0

    def clear(self) -> None:
        """Drop every held cache."""
        self._where.clear()
        self._lengths.clear()
        self._pools.clear()
        self._held.clear()
        self.nbytes = self.held_rows = 0

    def next_logprobs(self, prefixes: ArrayLike, lengths: ArrayLike) -> np.ndarray:
        """``float32[B, V]``: log-softmax next-token rows after each prefix, as the model's own
        ``next_logprobs`` (to float32 noise), reusing held parent and ancestor caches.

        Args:
          prefixes: int32[B, T]; row ``b`` holds a prefix in its first ``lengths[b]`` positions.
          lengths: int32[B], each in ``[0, max_len - 1]``.
        """
        batch = check_prefixes(prefixes, lengths, self.vocab_size, self.max_len)
        with mesh_context(self._base.mesh):
            return self._rows(batch)

    def teacher_force(self, rows: Sequences, known: ArrayLike, top_m: int) -> TeacherForced:
        """Teacher-force ``rows`` from their positions ``known`` on, over the held caches (a radix
        cache over every prefix computed; see :mod:`jaxrescore.models.teacher`): the
        ``score_frontier`` numbers of those positions, as the model's own (to float32 noise; a
        16-bit compute dtype's cached steps move up to ~0.09 nats, see
        :mod:`jaxrescore.models.scores`).

        Position ``j`` is the next-token distribution after ``row[:j]`` (position 0: after the
        context, BOS and a prompt, read from the context's own row at no cost). Row ``i`` feeds
        ``row[known[i] - 1 : len - 1]`` in one call on top of the held cache of
        ``row[:known[i] - 1]``, or of its longest held prefix (the extra positions are computed
        and counted), or of the context; a row with ``known[i] == len(rows[i])`` costs nothing.
        Afterwards every prefix of what a row fed is held (for a user's step model only the
        whole fed prefix: its cache need not serve a shorter one), for later calls and
        :meth:`next_logprobs` alike. Rows whose fed prefix is a prefix of another row's in the
        same call are read from that row's outputs, not fed.

        Args:
          rows: token sequences (for a prompted model, tokens after the prompt), each in the
            model's support: tokens in ``[0, V)``, length <= ``max_len``.
          known: int[N], ``0 <= known[i] <= len(rows[i])``: positions the caller already has.
          top_m: how many of the likeliest next tokens to keep per position (capped at V).

        Returns:
          :class:`~jaxrescore.models.teacher.TeacherForced`: ``(frontier, positions)``, the
          :class:`~jaxrescore.models.scores.FrontierScores` of positions ``known[i]`` on,
          left-aligned, and the token positions this call computed (added to ``positions``).
        """
        batch, known = check_teacher_rows(rows, known, self.vocab_size, self.max_len)
        reduce = frontier_reduce(min(check_top_m(top_m), self.vocab_size), self.vocab_size, self.eos,
                                 host=self._pools.host)  # the device is the host's memory
        out = TeacherOut(batch, known, reduce.top_m, self.eos)
        before = self.positions
        with mesh_context(self._base.mesh):
            params, ctx = self._begin()
            fed = self._teach(batch, known, reduce, out, params, ctx)
        self._evict()
        self.row_positions = fed
        frontier = out.result()
        for values in (frontier.steps, frontier.top_lps) if frontier.steps.size else ():
            check_nan(self.model, values, batch.lengths - known, "teacher_force")
        return TeacherForced(frontier, self.positions - before)

    def packed_force(self, rows: Sequences, top_m: int) -> TeacherForced | None:
        """``teacher_force(rows, zeros, top_m)`` by the model's own full forward, packed (see
        :mod:`jaxrescore.models.packed`): the context and each distinct prefix of the rows are
        computed once, and the numbers are the full forward's (``score_frontier``), not cached
        ones. The rows' key/value caches come out of the same forward and are held as
        :meth:`teacher_force` would hold them, for later calls to extend. The positions counted
        are the packed sequence's: the context (BOS and a prompt) again, and each distinct
        prefix once. None when the model has no packed forward (on a mesh, or not one of the
        library's networks), or when the packed sequence is more than twice what feeding the
        rows over the held context computes (each distinct fed prefix that no other extends:
        :meth:`teacher_force`'s cost; twice, as packing spares the full forward that would check
        those rows). A long prompt again for a few short rows is declined: a 3-token
        continuation of SmolLM2 cost 21 positions packed, 15 fed and checked. Then call
        :meth:`teacher_force`."""
        base, prompt = _split_prompt(self.model)
        if not getattr(base, "packs_prompt", False) or not callable(getattr(base, "packed_forward", None)):
            return None
        batch, _ = check_teacher_rows(rows, np.zeros(len(rows), np.int64), self.vocab_size, self.max_len)
        toks, lens = batch.tokens, batch.lengths.astype(np.int64)
        tuples = batch.to_tuples()
        per_row = packed_row_positions(len(prompt), tuples)
        positions = int(per_row.sum())
        fed = {r[:-1] for r in tuples if len(r) > 1}
        extended = {f[:j] for f in fed for j in range(1, len(f))}
        if positions > 2 * sum(len(f) for f in fed - extended):
            return None
        self._begin()

        def hold(group, cache):  # each row holds its fed tokens (all but its last), as a feed would
            fed = [max(int(lens[i]) - 1, 0) for i in group]
            self._hold(cache, len(group), self._cache_len(max(max(fed), 1)),
                       self._row_keys(toks, group, np.zeros(len(group), np.int64), fed))
            self.calls += 1

        frontier = packed_frontier(base, base.packed_forward(), prompt, batch, top_m, KeepCaches(self._cache_len, hold))
        self.positions += positions
        self._evict()
        self.row_positions = per_row
        return TeacherForced(frontier, positions)

    def _teach(self, batch, known, reduce, out, params, ctx) -> np.ndarray:
        """Fill ``out`` (see :meth:`teacher_force`): one call per held cache started from and
        power of two of fed tokens, chunked like :meth:`_extend`. Returns the positions each row
        fed (int64[N]; 0 for a row read from another's outputs)."""
        toks, lens = batch.tokens, batch.lengths.astype(np.int64)
        out.context(np.flatnonzero((known == 0) & (lens > 0)), ctx.row, reduce)
        first = np.maximum(known, 1)
        reps, owner, need = share_feeds(toks, lens, np.where(lens - 1 >= first, first - 1, -1))
        readers = collections.defaultdict(list)  # rep's row -> rows reading its outputs
        for i in np.flatnonzero(owner >= 0).tolist():
            readers[int(reps[owner[i]])].append(i)
        held = sorted(self._lengths, reverse=True)
        groups: dict = collections.defaultdict(list)
        for r, i in enumerate(reps.tolist()):
            pool, row, start = self._ancestor(toks[i], int(need[r]), held)
            groups[pool, coarse_size(int(lens[i]) - 1 - start)].append((i, row, start))
        extra_at: list = []  # per call: derived row -> index of its last step among the extras

        def extra(part, starts, b, w):
            targets = np.zeros((b, w), np.int32)
            cols = starts[:, None] + 1 + np.arange(w)[None, :]
            targets[: part.size] = np.where(cols < lens[part][:, None], toks[part[:, None], np.minimum(cols, toks.shape[1] - 1)], 0)
            derived = [(k, i) for k, rep in enumerate(part.tolist()) for i in readers[rep] if i != rep]
            q = np.zeros((3, max(b, bucket_size(len(derived), 1))), np.int32)  # few shapes: few compiles
            for n, (k, i) in enumerate(derived):
                q[:, n] = k, lens[i] - 2 - starts[k], toks[i, lens[i] - 1]
            extra_at.append({i: n for n, (_, i) in enumerate(derived)})
            return (self._base._put(targets), *q)  # the queries are not rows: replicated

        pending = [self._extend(pool, m, toks, lens - 1, ctx, params, reduce, extra) for (pool, _), m in groups.items()]
        fed = np.zeros(batch.size, np.int64)
        for (part, starts, dev), at in zip((c for calls in pending for c in calls), extra_at):
            fed[part] += lens[part] - 1 - starts
            host = reduce.on_host(tuple(to_host(x) for x in dev), lens[part] - 1 - starts)
            mine = [readers[rep] for rep in part.tolist()]  # each call row's readers
            k = np.repeat(np.arange(part.size), [len(r) for r in mine])
            out.fill([i for r in mine for i in r], k, starts[k], host, at)
        return fed

    def _begin(self):
        """``(params, context)`` of a new call; held caches of other weights are dropped."""
        params = self._base._device_params()
        if self._params is not params:  # new weights: held caches are stale
            self.clear()
            self._params = params
        ctx = decoding_context(self.model)
        self._call += 1
        return params, ctx

    def _rows(self, batch) -> np.ndarray:
        toks, lens = batch
        n = batch.size
        out = np.empty((n, self.vocab_size), np.float32)
        if n == 0:
            return out
        params, ctx = self._begin()
        self.rows += n
        zero = lens == 0
        out[zero] = ctx.row
        parents = _keys(toks, np.maximum(lens - 1, 0))
        held = sorted(self._lengths, reverse=True)
        # rows grouped by the held cache they start from (None: the context) and by how many
        # tokens they add (a power of two: one long row does not widen the others' calls)
        groups: dict = collections.defaultdict(list)
        for i in np.flatnonzero(~zero).tolist():
            at = self._where.get(parents[i])
            if at is not None:
                pool, row, start = at[0], at[1], int(lens[i]) - 1
            else:
                pool, row, start = self._ancestor(toks[i], int(lens[i]) - 2, held)
            groups[pool, coarse_size(int(lens[i]) - start)].append((i, row, start))
        pending = [self._extend(pool, members, toks, lens, ctx, params) for (pool, _), members in groups.items()]
        for calls in pending:
            for idx, _, rows in calls:
                out[idx] = to_host(rows)[: idx.size]
        self._evict()
        check_nan(self.model, out, None, "next_logprobs (incremental)")
        return out

    def _ancestor(self, tokens: np.ndarray, limit: int, held: list) -> tuple:
        """The held cache of the longest prefix of ``tokens`` of at most
        ``limit`` tokens (``held``: the lengths held, longest first) as ``(pool key, slot, length)``, or ``(None, 0, 0)``: the
        context."""
        prefix = np.ascontiguousarray(tokens[: max(limit, 0)], np.int32)
        for n in held:
            if n <= limit:
                at = self._where.get(prefix[:n].tobytes())
                if at is not None:
                    return at[0], at[1], n
        return None, 0, 0

    # -- calls ------------------------------------------------------------------------------------

    def _extend(self, pool, members, toks, ends, ctx, params, reduce=None, extra=None) -> list:
        """Rows ``members`` (``(batch row, slot, start)``) from the held caches in ``pool`` (the
        context when None): row ``i`` feeds ``toks[i, start:ends[i]]`` in one call (one position
        for a row whose parent is held). Returns ``(rows, starts, out)`` per call: ``out`` the
        log-softmax row after each row's last token, or with ``reduce`` (teacher forcing) its
        reduction of every fed position's row, given ``extra(rows, starts, B, W)`` (its device
        arguments)."""
        s_in = 0 if pool is None else pool[0]
        idx = np.asarray([i for i, _, _ in members])
        starts = np.asarray([s for _, _, s in members], np.int32)
        w = coarse_size(int((ends[idx] - starts).max()))
        per = self._base._chunk(w)
        put = self._base._put
        out = []
        for lo, m, b in self._row_calls(idx.size, per, w):
            part, part_start = idx[lo : lo + m], starts[lo : lo + m]
            fed = (ends[part] - part_start).astype(np.int32)
            block = np.zeros((b, w), np.int32)
            cols = part_start[:, None] + np.arange(w)[None, :]
            real = cols < ends[part][:, None]
            block[:m] = np.where(real, toks[part[:, None], np.minimum(cols, toks.shape[1] - 1)], 0)
            start = np.zeros(b, np.int32)
            start[:m] = part_start
            last = np.zeros((b,) if reduce is None else (b, w), np.int32)
            last[:m] = fed - 1 if reduce is None else np.minimum(np.arange(w)[None, :], fed[:, None] - 1)
            # every written position (padding ones too) must fit: a write past the end would be
            # moved back over real positions (dynamic_update_slice clamps its start)
            s_out = max(s_in, self._cache_len(int(part_start.max()) + w))
            cache = None
            if pool is not None:
                rows_in = np.full(b, members[lo][1], np.int64)  # padding rows: a held one
                rows_in[:m] = [r for _, r, _ in members[lo : lo + m]]
                cache = self._pools.take(pool, rows_in)
            elif self._pools.host and self._dec.zeros_fresh:  # one program for both kinds of rows
                cache = self._fresh(params, ctx, b, s_out)
            args = () if reduce is None else extra(part, part_start, b, w)
            rows, held = _decode(
                self._dec.fn, params, put(block), put(start), put(last), ctx.cache, np.int32(ctx.length),
                cache, s_out, reduce, args,
            )
            self.calls += 1
            self.positions += int(fed.sum())
            self.extended += m if pool is not None else 0
            self._hold(held, m, s_out, self._row_keys(toks, part, part_start, ends[part]))
            out.append((part, part_start, rows))
        return out

    def _fresh(self, params, ctx, b: int, s: int):
        """Zeros shaped as ``b`` fresh row caches of ``s`` positions (what the decoder makes of
        ``cache=None``; their shapes traced, nothing compiled), kept on the device for reuse."""
        key = (self._dec.fn, s, tuple((x.shape, str(x.dtype)) for x in jax.tree.leaves(ctx.cache)))
        shapes = _FRESH_SHAPES.get(key)
        if shapes is None:  # traced once per decoder and length in a process (a trace: ~50 ms)
            one = np.zeros((1, 1), np.int32)
            shapes = jax.eval_shape(lambda p, c: self._dec.fn(p, one, one[0], one[0], c, np.int32(0), None, s)[1],
                                    params, ctx.cache)
            if len(_FRESH_SHAPES) >= 256:
                _FRESH_SHAPES.clear()
            _FRESH_SHAPES[key] = shapes
        zeros = _FRESH_ZEROS.pop((key, b), None)  # put on the device once: the call never writes it
        if zeros is None:
            zeros = jax.device_put(jax.tree.map(lambda x: np.zeros((b,) + x.shape[1:], x.dtype), shapes))
            while len(_FRESH_ZEROS) >= 8:
                _FRESH_ZEROS.pop(next(iter(_FRESH_ZEROS)))
        _FRESH_ZEROS[key, b] = zeros
        return zeros

    def _row_calls(self, n: int, per: int, w: int) -> list:
        """``(first row, rows, padded rows)`` of each call feeding ``n`` rows of ``w`` tokens:
        ``per`` rows at most per call, and where padding the rest up to its shape would compute
        more than :data:`SPLIT_POSITIONS` padding positions, the largest shape it fills is split
        off as a call of its own (CPU only, where a padded position costs what a real one does;
        every call keeps one of :meth:`_call_rows`' shapes, so nothing new compiles)."""
        calls, lo = [], 0
        split = self._pools.host  # the CPU backend, no mesh
        while lo < n:
            m = min(per, n - lo)
            b = self._call_rows(m, per, w)
            if split and (b - m) * w > SPLIT_POSITIONS:
                fits = [c for c in self._row_shapes(per, w) if c <= m]
                if fits:
                    m = b = fits[-1]
            calls.append((lo, m, b))
            lo += m
        return calls

    def _row_shapes(self, per: int, w: int) -> list:
        """Every padded row count :meth:`_call_rows` gives calls of ``w`` tokens, ascending."""
        sizes, m = set(), 1
        while m <= per:
            sizes.add(self._call_rows(m, per, w))
            m *= 2
        return sorted(sizes)

    def _call_rows(self, m: int, per: int, w: int) -> int:
        """The padded rows of a call of ``m`` rows of ``w`` fed tokens (``per``: the most per
        call): up to :data:`COARSE_ROWS` rows a power of FOUR times the model's smallest bucket,
        so the calls of a search take few shapes (each a compile: a search's calls range over
        16-1024 rows), never past the bucket of ``per``; above it a power of two; at least
        :data:`ONE_TOKEN_ROWS` rows of one token, or one block of :data:`BLOCK_POSITIONS`
        positions."""
        bucket = self._base._rows_bucket
        coarse = min(bucket(coarse_size(m, bucket(1))), bucket(per)) if m <= COARSE_ROWS else bucket(m)
        return max(coarse, bucket(m), ONE_TOKEN_ROWS if w == 1 else BLOCK_POSITIONS // w, 1)

    def _cache_len(self, need: int) -> int:
        """The row-cache length of a call writing up to position ``need``. Short rows (a model
        whose rows and one padded block fit :data:`SHORT_ROWS_CACHE`) use the power of two
        covering the longest row, twice that only for a call whose padded block reaches past it
        (a wide block from the context); longer ones a coarse size (see
        ``cache_sizes.WIDTH_GROWTH``) no longer than the power of two covering the longest row.
        Never shorter than ``need``. (Cache length is most of a call's cost: on the real-text
        workload, 1,024 one-token rows of the target took 212 ms over 64 positions, 71 ms over
        32.)"""
        longest = bucket_size(int(self.model.max_len), MIN_CACHE_LEN)
        if 2 * longest <= SHORT_ROWS_CACHE and need <= 2 * longest:
            return longest if need <= longest else 2 * longest
        return max(bucket_size(need, MIN_CACHE_LEN), min(coarse_size(need, MIN_CACHE_LEN), longest))

    # -- the held caches --------------------------------------------------------------------------

    def _row_keys(self, toks: np.ndarray, rows, starts, ends) -> list:
        """Per row ``i`` of ``rows``, the keys a row cache holding ``toks[i, :ends]`` (fed from
        ``starts``) serves: every prefix of ``start + 1`` tokens or more when the decoder's
        caches serve prefixes (the shorter ones are its ancestor's), else the whole fed prefix
        alone. (One byte string per row, sliced: keys are the int32 tokens' bytes.)"""
        rows = np.asarray(rows, np.int64)
        if not rows.size:
            return []
        ends = np.asarray(ends, np.int64)
        lows = np.maximum(np.asarray(starts, np.int64) + 1 if self._dec.prefix_reuse else ends, 1)
        block = np.ascontiguousarray(toks[rows, : max(int(ends.max()), 1)], np.int32)
        return [[raw[: 4 * n] for n in range(lo, end + 1)]
                for raw, lo, end in zip(map(bytes, block), lows.tolist(), ends.tolist())]

    def _hold(self, cache, m: int, s: int, keys: list) -> None:
        """Keep the first ``m`` rows of ``cache`` (rows of ``s`` positions) in their pool (see
        :mod:`jaxrescore.models.cache_pool`); ``keys[r]``: the prefixes row ``r`` serves (the
        newest holder of a key wins). Nothing is dropped here: later groups of the same call
        read slots it planned to read (the call's end drops the oldest, :meth:`_evict`)."""
        if self.max_bytes <= 0 or not m:
            return
        pool = pool_key(cache, s)
        per_row = self._pools.row_bytes(pool)
        if m * per_row > self.max_bytes:
            self._warn(m * per_row)
            return
        slots = self._pools.store(pool, cache, m, self.max_bytes // per_row + m)
        # (key, where) pairs built once, the maps updated by C loops (a key per prefix fed: a
        # Python loop over them was a tenth of a proof's wall with the student draft)
        flat = [(key, at) for row_keys, at in zip(keys, ((pool, s) for s in slots.tolist())) for key in row_keys]
        self._held.append((pool, slots, flat, self._call, m, m * per_row))
        self.nbytes += m * per_row
        self.held_rows += m
        where = self._where
        self._lengths.update([len(key) // 4 for key in {key for key, _ in flat if key not in where}])
        where.update(flat)

    def _evict(self) -> None:
        """At a call's end: drop the oldest calls' caches while more than ``max_bytes`` are held
        (their slots are reused); warn (once) when that drops caches this very call made: its
        children will not find them."""
        while self._held and self.nbytes > self.max_bytes:
            pool, slots, keys, call, m, held = self._held.popleft()
            self.nbytes -= held
            self.held_rows -= m
            for key, at in keys:
                if self._where.get(key) == at:
                    del self._where[key]
                    self._lengths[len(key) // 4] -= 1
                    if not self._lengths[len(key) // 4]:
                        del self._lengths[len(key) // 4]
            self._pools.free(pool, slots)
            if call == self._call:
                self._warn(sum(h[5] for h in self._held if h[3] == self._call) + held)

    def _warn(self, needed: int) -> None:
        if self._warned:
            return
        self._warned = True
        warnings.warn(
            f"DecodingSession over {type(self.model).__name__}: one call's key/value caches need "
            f"{needed:,} bytes or more, more than max_bytes={self.max_bytes:,}; they are not kept, so "
            f"the next rows are computed from the context instead of their parents. Raise the budget: "
            f"decoding_session(model, max_bytes=...), SeekIndex(decode_cache_bytes=...) or "
            f"the environment variable {CACHE_BYTES_ENV}.",
            UserWarning,
            stacklevel=5,
        )


def _keys(toks: np.ndarray, lens: np.ndarray) -> list:
    """Hashable keys (the bytes of the int32 tokens) of each row's first ``lens[b]`` tokens."""
    out: list = [b""] * toks.shape[0]
    for length in np.unique(lens).tolist():
        if length == 0:
            continue
        idx = np.flatnonzero(lens == length)
        block = np.ascontiguousarray(toks[idx, :length], dtype=np.int32)
        raw = block.view(np.dtype((np.void, 4 * length))).ravel().tolist()
        for i, key in zip(idx.tolist(), raw):
            out[i] = key
    return out


def decoding_session(model: Any, *, max_bytes: int | None = None) -> DecodingSession | None:
    """A :class:`DecodingSession` over ``model`` when it decodes incrementally (a TransformerLM,
    its int8 twin, a ``from_apply_fn`` model given ``init_cache``/``step``, or a prompted
    model of one), else None.

    Args:
      model: any model.
      max_bytes: the most bytes of row caches to hold (None: :func:`default_cache_bytes`).
    """
    own = getattr(model, "decoding_session", None)
    if callable(own):  # a wrapper that reads its base's session its own way (a constrained model)
        return own(max_bytes=max_bytes)
    try:
        if model_decoder(model) is None:
            return None
    except Exception:  # a foreign object that merely has a "decoder" attribute
        return None
    return DecodingSession(model, max_bytes=max_bytes)


def proof_session(model: Any, *, max_bytes: int | None = None) -> DecodingSession | None:
    """:func:`decoding_session` for numbers a proof rests on: None unless ``model``'s
    ``score_tolerance`` is float32's or tighter. In a 16-bit compute dtype the cached path moves a
    row by up to ~0.09 nats a step (against 0.06 for a full forward; see
    :mod:`jaxrescore.models.scores`), too close to the 0.1-nat tolerance a proof is held to, so
    such a model's proofs run full forwards (no proof rests on cached rows alone: rescore.frontier)."""
    if score_tolerance(model) > FLOAT32_TOLERANCE:
        return None
    return decoding_session(model, max_bytes=max_bytes)


def incremental(model: Any, *, max_bytes: int | None = None) -> Any:
    """A fresh :class:`DecodingSession` over ``model`` when it has one, else ``model`` itself:
    what a level-by-level caller expands with."""
    session = decoding_session(model, max_bytes=max_bytes)
    return model if session is None else session
