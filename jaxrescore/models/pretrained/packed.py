"""Teacher forcing of many rows after ONE prompt, the prompt computed once.

A prompted model's full forward (``score_frontier`` of continuations, see
:mod:`jaxrescore.models.prompt`) forwards ``prompt + row`` for every row: with a chat prompt of 17
tokens and answers of 8, two thirds of its positions recompute the same prompt. This network
packs the rows instead: one sequence holds ``[BOS] + prompt`` (segment 0) and then each row's
tokens (segment ``i + 1``, at positions ``len(prompt) + 1 + j``), and every token attends,
causally, to its own segment and to the prompt (:func:`~jaxrescore.models.pretrained.network.forward`
with ``positions`` and ``segments``). It is still one full teacher-forcing forward, with no
cache: each row reads exactly what a forward of ``prompt + row`` on its own computes, and the
answer check of a proof (:mod:`jaxrescore.rescore.scored`) compares the cached path against it.
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
def _packed_stats(packed, params, tokens, positions, segments, at, targets, top_m, eos):
    """One packed forward's per-position arrays, read at ``at int32[N, W]`` (indices into the
    packed sequence): steps float32[N, W], top-m float32/int32[N, W, m], eos float32[N, W]."""
    lp = clipped_log_softmax(packed(params, tokens[None], positions[None], segments[None]))[0]
    steps = lp[at, targets]
    top_lps, top_ids = jax.lax.top_k(lp, top_m)
    eos_lps = jnp.zeros_like(steps) if eos is None else lp[at, eos]
    return steps, top_lps[at], top_ids[at].astype(jnp.int32), eos_lps


def _groups(lengths: np.ndarray, context: int) -> list[list[int]]:
    """Row indices in packed groups of at most :data:`PACK_TOKENS` tokens (a row feeds
    ``length - 1`` tokens after the ``context``)."""
    groups, size = [[]], context
    for i, n in enumerate(lengths.tolist()):
        feed = max(int(n) - 1, 0)
        if groups[-1] and size + feed > PACK_TOKENS:
            groups.append([])
            size = context
        groups[-1].append(i)
        size += feed
    return groups


def packed_positions(prompt_length: int, lengths) -> int:
    """Token positions :func:`packed_frontier` computes for rows of ``lengths``: the prompt once
    per packed group, then each row's own positions."""
    lengths = np.asarray(lengths, np.int64).reshape(-1)
    return len(_groups(lengths, prompt_length + 1)) * prompt_length + int(lengths.sum())


def packed_frontier(model, packed, prompt: tuple, seqs, top_m: int) -> FrontierScores:
    """``model.score_frontier(prompt + c, skip=len(prompt))`` of the continuations ``seqs`` (see
    :class:`~jaxrescore.models.scores.FrontierScores`), by packed forwards of ``packed``.

    Args:
      model: the network's model (``vocab_size``, ``eos``, ``max_len``, ``bos_id``, device params).
      packed: its :class:`~jaxrescore.models.pretrained.network.NetworkPacked`.
      prompt: the context's tokens.
      seqs: the continuations (a SequenceBatch or token lists), each within ``max_len - len(prompt)``.
      top_m: the per-position top-m (capped at V).
    """
    batch = as_sequence_batch(seqs)
    p = len(prompt)
    check_tokens(batch, model.vocab_size, model.max_len - p)
    top_m = min(int(top_m), model.vocab_size)
    n, width = batch.size, _bucket(int(batch.lengths.max(initial=1)))
    steps = np.zeros((n, width), np.float32)
    top_lps = np.full((n, width, top_m), -np.inf, np.float32)
    top_ids = np.zeros((n, width, top_m), np.int32)
    eos_lps = np.full((n, width), -np.inf, np.float32)
    context = np.array((model.bos_id,) + tuple(prompt), np.int32)
    with mesh_context(model.mesh):
        params = model._device_params()
        for group in _groups(batch.lengths, p + 1):
            out = _forward_group(model, packed, params, context, batch, group, width, top_m)
            for a, part in zip((steps, top_lps, top_ids, eos_lps), out):
                a[group] = part
    check_nan(model, steps, batch.lengths, "score_frontier")
    check_nan(model, top_lps, batch.lengths, "score_frontier")
    return assemble(batch, None, steps, top_lps, top_ids, None if model.eos is None else eos_lps)


def _forward_group(model, packed, params, context, batch, group: list[int], width: int, top_m: int):
    """The packed forward of the rows ``group``: their arrays ``[len(group), width, ...]``."""
    feeds = [batch.tokens[i, : max(int(batch.lengths[i]) - 1, 0)] for i in group]
    size = _bucket(len(context) + sum(f.size for f in feeds), 16)
    tokens = np.zeros(size, np.int32)
    positions = np.zeros(size, np.int32)
    segments = np.full(size, -1, np.int32)  # padding: a segment of its own, seen by nothing real
    c = len(context)
    tokens[:c], positions[:c], segments[:c] = context, np.arange(c), 0
    rows = _bucket(len(group), 1)
    at = np.zeros((rows, width), np.int32)
    targets = np.zeros((rows, width), np.int32)
    end = c
    for r, (i, feed) in enumerate(zip(group, feeds)):
        tokens[end : end + feed.size] = feed
        positions[end : end + feed.size] = c + np.arange(feed.size)
        segments[end : end + feed.size] = r + 1
        n = int(batch.lengths[i])
        at[r, :n] = np.concatenate([[c - 1], end + np.arange(feed.size)])[:n]  # after prompt + row[:j]
        targets[r, :n] = batch.tokens[i, :n]
        end += feed.size
    put = jnp.asarray
    out = _packed_stats(packed, params, put(tokens), put(positions), put(segments), put(at), put(targets),
                        top_m, model.eos)
    return tuple(np.asarray(jax.device_get(a))[: len(group)] for a in out)
