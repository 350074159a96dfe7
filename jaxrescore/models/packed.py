"""Teacher forcing of many rows as ONE tree: a context (BOS, a prompt) and shared prefixes
computed once.

A full forward (``score_frontier``) forwards ``[BOS] + prompt + row`` for every row: with a chat
prompt of 17 tokens and answers of 8, two thirds of its positions recompute the same prompt, and
rows that begin alike (names sharing their first letters, answers sharing their first words)
recompute their shared prefixes. A network with a packed forward (``(params, tokens int32[1, P],
positions int32[1, P], visible bool[1, P, P]) -> logits``: the library's TransformerLM, its int8
twin and :func:`~jaxrescore.models.from_pretrained` models) packs the rows as a tree instead: one
sequence holds ``[BOS] + prompt`` and then the last token of each distinct prefix of the rows,
once, at its position in the row; each token attends to the context, to its own ancestors and to
itself. It is still one full teacher-forcing forward, with no cache: each row reads what a
forward of ``prompt + row`` on its own computes (to float rounding), and the answer check of a
proof (:mod:`jaxrescore.rescore.scored`) compares the cached path against it.

:class:`PackedFrontier` is the mixin such a model inherits: ``score_frontier`` packs whenever it
scores whole rows (no ``skip``), ``score_frontier_after(prompt, ...)`` packs rows after one
prompt (a :class:`~jaxrescore.models.prompt.PromptedModel` calls it), and ``full_positions`` /
``packed_positions`` count what it computes.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxrescore.models.checks import check_nan, check_tokens
from jaxrescore.models.mesh import mesh_context
from jaxrescore.models.scores import FrontierScores, assemble, clipped_log_softmax
from jaxrescore.sequences import as_sequence_batch
from jaxrescore.typing import ArrayLike, Sequences

# The longest packed sequence: rows are packed in groups whose context and rows fit in it (a
# row longer than that alone gets a group of its own). Attention costs the square of it.
PACK_TOKENS = 1024


def _bucket(n: int, least: int = 8) -> int:
    """The power of two (>= ``least``) at or above ``n``: one compiled shape per bucket."""
    return max(least, 1 << max(0, int(n) - 1).bit_length())


def _coarse(n: int, least: int) -> int:
    """``least`` times the power of FOUR at or above ``n``: the packed sequence's length and its
    rows, so a search's packed forwards (16 to 1,024 tokens) take few shapes, each a compile."""
    size = least
    while size < n:
        size *= 4
    return size


@partial(jax.jit, static_argnums=(0, 7, 8))
def _packed_stats(packed, params, tokens, positions, visible, at, targets, top_m, eos, paths=None):
    """One packed forward's per-position arrays, read at ``at int32[N, W]`` (indices into the
    packed sequence): steps float32[N, W], top-m float32/int32[N, W, m], eos float32[N, W]; and
    given ``paths int32[N, S]``, the rows' key/value caches (see :func:`packed_frontier`)."""
    out = packed(params, tokens[None], positions[None], visible[None], *(() if paths is None else (paths,)))
    logits, cache = (out, None) if paths is None else out
    lp = clipped_log_softmax(logits)[0]
    steps = lp[at, targets]
    v = lp.shape[-1]
    if top_m >= v:  # the whole row, in id order as the row forward gives it: no sort needed
        top_lps = jnp.pad(lp, ((0, 0), (0, top_m - v)), constant_values=-jnp.inf)
        top_ids = jnp.broadcast_to(jnp.pad(jnp.arange(v), (0, top_m - v)), top_lps.shape)
    else:
        top_lps, top_ids = jax.lax.top_k(lp, top_m)
    eos_lps = jnp.zeros_like(steps) if eos is None else lp[at, eos]
    return (steps, top_lps[at], top_ids[at].astype(jnp.int32), eos_lps), cache


def _groups(rows: list, context: int) -> list[list[int]]:
    """Indices of the rows with a position (the others need no forward) in packed groups of at
    most :data:`PACK_TOKENS` tokens when no prefix were shared (a row feeds ``len - 1`` tokens
    after the ``context``; a longer row gets a group of its own)."""
    groups, size = [[]], context
    for i, row in enumerate(rows):
        if not row:
            continue
        feed = len(row) - 1
        if groups[-1] and size + feed > PACK_TOKENS:
            groups.append([])
            size = context
        groups[-1].append(i)
        size += feed
    return [g for g in groups if g]


def _prefixes(rows: list) -> dict:
    """Every prefix ``row[:j]`` (``j < len(row)``) of ``rows`` once, in first-seen order, mapped
    to its index among them: the positions a packed forward computes after its context."""
    seen: dict = {}
    for row in rows:
        for j in range(len(row)):
            seen.setdefault(row[:j], len(seen))
    return seen


def packed_positions(prompt_length: int, rows: list) -> int:
    """Token positions :func:`packed_frontier` computes for the continuations ``rows``: per
    packed group, the prompt once and each distinct prefix of its rows once."""
    return int(packed_row_positions(prompt_length, rows).sum())


def packed_row_positions(prompt_length: int, rows: list) -> np.ndarray:
    """int64[N]: :func:`packed_positions` per row: each distinct prefix to the first row of its
    group that has it, the group's context (BOS and the prompt) to the group's first row."""
    rows = [tuple(r) for r in rows]
    out = np.zeros(len(rows), np.int64)
    for g in _groups(rows, prompt_length + 1):
        out[g[0]] += prompt_length + 1
        seen = {()}
        for i in g:
            new = {rows[i][:j] for j in range(1, len(rows[i]))} - seen
            out[i] += len(new)
            seen |= new
    return out


def packed_frontier(model, packed, prompt: tuple, seqs, top_m: int, keep: KeepCaches | None = None) -> FrontierScores:
    """``model.score_frontier(prompt + c, skip=len(prompt))`` of the continuations ``seqs`` (see
    :class:`~jaxrescore.models.scores.FrontierScores`), by packed forwards of ``packed``: the
    rows of a group as one tree after one copy of the prompt, each distinct prefix computed once.

    Args:
      model: the network's model (``vocab_size``, ``eos``, ``max_len``, ``bos_id``, ``mesh``,
        ``_device_params()``).
      packed: its hashable packed forward ``(params, tokens, positions, visible[, paths])``.
      prompt: the context's tokens.
      seqs: the continuations (a SequenceBatch or token lists), each within ``max_len - len(prompt)``.
      top_m: the per-position top-m (capped at V).
      keep: optional :class:`KeepCaches`: each group's rows' key/value caches go to it, row
        ``r``'s position ``j`` holding its token ``j``'s (every token but its last: what a
        decoder's teacher forcing of the row from its context holds).
    """
    batch = as_sequence_batch(seqs)
    check_tokens(batch, model.vocab_size, model.max_len - len(prompt))
    top_m = min(int(top_m), model.vocab_size)
    # widths as the row forward's: a power of two, capped where the support ends (computed at the
    # power of two, so a prompt's length makes no shape of its own)
    n, wide = batch.size, _bucket(int(batch.lengths.max(initial=1)))
    width = max(1, min(wide, model.max_len - len(prompt)))
    steps = np.zeros((n, width), np.float32)
    top_lps = np.full((n, width, top_m), -np.inf, np.float32)
    top_ids = np.zeros((n, width, top_m), np.int32)
    eos_lps = np.full((n, width), -np.inf, np.float32)
    rows = batch.to_tuples()
    context = np.array((model.bos_id,) + tuple(prompt), np.int32)
    with mesh_context(model.mesh):
        params = model._device_params()
        for group in _groups(rows, len(context)):
            part = [rows[i] for i in group]
            out, cache = _forward_group(packed, params, context, part, wide, top_m, model.eos, keep)
            for a, got in zip((steps, top_lps, top_ids, eos_lps), out):
                a[group] = got[:, :width]
            if keep is not None:
                keep.hold(group, cache)
    check_nan(model, steps, batch.lengths, "score_frontier")
    check_nan(model, top_lps, batch.lengths, "score_frontier")
    return assemble(batch, None, steps, top_lps, top_ids, None if model.eos is None else eos_lps)


class KeepCaches(NamedTuple):
    """Where a packed forward's row caches go (a decoding session's, see
    :meth:`~jaxrescore.models.decoding.DecodingSession.packed_force`): ``length(n)``, the cache
    length of rows feeding ``n`` tokens; ``hold(group, cache)``, the rows ``group`` (indices into
    the scored rows) and their device caches, padded to a power of two of rows."""

    length: Callable[[int], int]
    hold: Callable[[list, Any], None]


def _forward_group(packed, params, context: np.ndarray, rows: list, width: int, top_m: int, eos,
                   keep: KeepCaches | None = None):
    """The packed forward of ``rows`` (non-empty token tuples): their arrays ``[len(rows), width,
    ...]``, and with ``keep`` their caches (else None). The sequence holds the context, then each
    distinct prefix's last token once (at its position in the row), which sees the context and
    its own ancestors."""
    c = len(context)
    prefixes = _prefixes(rows)  # prefix -> its index; () is the context's last token
    size = _coarse(c + len(prefixes) - 1, 16)
    tokens = np.zeros(size, np.int32)
    positions = np.zeros(size, np.int32)
    visible = np.eye(size, dtype=bool)  # padding sees itself only (never an empty softmax)
    tokens[:c], positions[:c] = context, np.arange(c)
    visible[:c, :c] = True  # the context, causally (the forward's causal mask)
    where = {}
    for prefix in prefixes:  # first-seen order: a prefix's parent comes before it
        if not prefix:
            where[prefix] = c - 1
            continue
        q, parent = c + len(where) - 1, where[prefix[:-1]]
        tokens[q], positions[q] = prefix[-1], c + len(prefix) - 1
        visible[q] = visible[parent]
        visible[q, q] = True
        where[prefix] = q
    rows_b = _coarse(len(rows), 2)
    at = np.zeros((rows_b, width), np.int32)
    targets = np.zeros((rows_b, width), np.int32)
    for r, row in enumerate(rows):
        at[r, : len(row)] = [where[row[:j]] for j in range(len(row))]  # after prompt + row[:j]
        targets[r, : len(row)] = row
    paths = None
    if keep is not None:  # token j of a row is the last token of its prefix row[:j + 1]
        fed = max(len(row) for row in rows) - 1
        paths = np.zeros((rows_b, keep.length(max(fed, 1))), np.int32)
        paths[:, : max(width - 1, 0)] = at[:, 1:][:, : paths.shape[1]]
    put = jax.device_put  # (jnp.asarray compiles a program per new shape)
    out, cache = _packed_stats(packed, params, put(tokens), put(positions), put(visible), put(at), put(targets),
                               top_m, eos, None if paths is None else put(paths))
    return tuple(np.asarray(jax.device_get(a))[: len(rows)] for a in out), cache


class PackedFrontier:
    """Full forwards by packed trees, for a model whose ``packed_forward()`` returns its hashable
    packed forward (see the module docstring). Not on a mesh, whose batch axis shards rows: there
    every method falls back to one row per sequence."""

    @property
    def packs_prompt(self) -> bool:
        """Whether full forwards pack rows (after one prompt, see :meth:`score_frontier_after`)."""
        return self.mesh is None

    def score_frontier(self, seqs: Sequences, *, top_m: int, skip: ArrayLike | None = None) -> FrontierScores:
        """As the protocol's ``score_frontier``; whole rows (no ``skip``) are packed as a tree,
        each distinct prefix computed once (the same numbers to float rounding)."""
        if skip is None and self.packs_prompt:
            return self.score_frontier_after((), seqs, top_m=top_m)
        return super().score_frontier(seqs, top_m=top_m, skip=skip)

    def score_frontier_after(self, prompt: tuple, seqs: Sequences, *, top_m: int) -> FrontierScores:
        """``score_frontier(prompt + c, skip=len(prompt))`` of continuations ``seqs``, the prompt
        and every shared prefix computed once per packed forward."""
        return packed_frontier(self, self.packed_forward(), tuple(prompt), seqs, top_m)

    def packed_positions(self, prompt_length: int, rows: list) -> int:
        """Token positions :meth:`score_frontier_after` computes for the continuations ``rows``."""
        return packed_positions(prompt_length, rows)

    def full_positions(self, rows: list) -> int:
        """Token positions :meth:`score_frontier` of the whole rows ``rows`` computes."""
        if self.packs_prompt:
            return packed_positions(0, rows)
        return sum(len(r) for r in rows)
