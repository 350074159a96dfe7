"""Teacher forcing of many rows after ONE prompt, the prompt and shared prefixes computed once.

A prompted model's full forward (``score_frontier`` of continuations, see
:mod:`jaxrescore.models.prompt`) forwards ``prompt + row`` for every row: with a chat prompt of 17
tokens and answers of 8, two thirds of its positions recompute the same prompt, and answers that
begin alike recompute their shared words. This network packs the rows as a tree instead: one
sequence holds ``[BOS] + prompt`` and then the last token of each distinct prefix of the rows,
once, at its position in the row; each token attends to the prompt, to its own ancestors and to
itself (:func:`~jaxrescore.models.pretrained.network.forward` with ``positions`` and ``visible``).
It is still one full teacher-forcing forward, with no cache: each row reads what a forward of
``prompt + row`` on its own computes (to float rounding), and the answer check of a proof
(:mod:`jaxrescore.rescore.scored`) compares the cached path against it.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from jaxrescore.models.checks import check_nan, check_tokens
from jaxrescore.models.mesh import mesh_context
from jaxrescore.models.scores import FrontierScores, assemble, clipped_log_softmax
from jaxrescore.sequences import as_sequence_batch

# The longest packed sequence: rows are packed in groups whose context and rows fit in it (a
# row longer than that alone gets a group of its own). Attention costs the square of it.
PACK_TOKENS = 1024


def _bucket(n: int, least: int = 8) -> int:
    """The power of two (>= ``least``) at or above ``n``: one compiled shape per bucket."""
    return max(least, 1 << max(0, int(n) - 1).bit_length())


@partial(jax.jit, static_argnums=(0, 7, 8))
def _packed_stats(packed, params, tokens, positions, visible, at, targets, top_m, eos):
    """One packed forward's per-position arrays, read at ``at int32[N, W]`` (indices into the
    packed sequence): steps float32[N, W], top-m float32/int32[N, W, m], eos float32[N, W]."""
    lp = clipped_log_softmax(packed(params, tokens[None], positions[None], visible[None]))[0]
    steps = lp[at, targets]
    top_lps, top_ids = jax.lax.top_k(lp, top_m)
    eos_lps = jnp.zeros_like(steps) if eos is None else lp[at, eos]
    return steps, top_lps[at], top_ids[at].astype(jnp.int32), eos_lps


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
    rows = [tuple(r) for r in rows]
    return sum(prompt_length + len(_prefixes([rows[i] for i in g])) for g in _groups(rows, prompt_length + 1))


def packed_frontier(model, packed, prompt: tuple, seqs, top_m: int) -> FrontierScores:
    """``model.score_frontier(prompt + c, skip=len(prompt))`` of the continuations ``seqs`` (see
    :class:`~jaxrescore.models.scores.FrontierScores`), by packed forwards of ``packed``: the
    rows of a group as one tree after one copy of the prompt, each distinct prefix computed once.

    Args:
      model: the network's model (``vocab_size``, ``eos``, ``max_len``, ``bos_id``, device params).
      packed: its :class:`~jaxrescore.models.pretrained.network.NetworkPacked`.
      prompt: the context's tokens.
      seqs: the continuations (a SequenceBatch or token lists), each within ``max_len - len(prompt)``.
      top_m: the per-position top-m (capped at V).
    """
    batch = as_sequence_batch(seqs)
    check_tokens(batch, model.vocab_size, model.max_len - len(prompt))
    top_m = min(int(top_m), model.vocab_size)
    n, width = batch.size, _bucket(int(batch.lengths.max(initial=1)))
    steps = np.zeros((n, width), np.float32)
    top_lps = np.full((n, width, top_m), -np.inf, np.float32)
    top_ids = np.zeros((n, width, top_m), np.int32)
    eos_lps = np.full((n, width), -np.inf, np.float32)
    rows = batch.to_tuples()
    context = np.array((model.bos_id,) + tuple(prompt), np.int32)
    with mesh_context(model.mesh):
        params = model._device_params()
        for group in _groups(rows, len(context)):
            out = _forward_group(packed, params, context, [rows[i] for i in group], width, top_m, model.eos)
            for a, part in zip((steps, top_lps, top_ids, eos_lps), out):
                a[group] = part
    check_nan(model, steps, batch.lengths, "score_frontier")
    check_nan(model, top_lps, batch.lengths, "score_frontier")
    return assemble(batch, None, steps, top_lps, top_ids, None if model.eos is None else eos_lps)


def _forward_group(packed, params, context: np.ndarray, rows: list, width: int, top_m: int, eos):
    """The packed forward of ``rows`` (non-empty token tuples): their arrays ``[len(rows), width,
    ...]``. The sequence holds the context, then each distinct prefix's last token once (at its
    position in the row), which sees the context and its own ancestors."""
    c = len(context)
    prefixes = _prefixes(rows)  # prefix -> its index; () is the context's last token
    size = _bucket(c + len(prefixes) - 1, 16)
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
    rows_b = _bucket(len(rows), 1)
    at = np.zeros((rows_b, width), np.int32)
    targets = np.zeros((rows_b, width), np.int32)
    for r, row in enumerate(rows):
        at[r, : len(row)] = [where[row[:j]] for j in range(len(row))]  # after prompt + row[:j]
        targets[r, : len(row)] = row
    put = jnp.asarray
    out = _packed_stats(packed, params, put(tokens), put(positions), put(visible), put(at), put(targets), top_m, eos)
    return tuple(np.asarray(jax.device_get(a))[: len(rows)] for a in out)
