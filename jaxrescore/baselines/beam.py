"""Batched beam search: the baseline users reach for, with its cost and no guarantee.

Beam search keeps the ``B`` best live prefixes per step; a prefix that takes ``eos`` moves to a
pool of finished hypotheses, of which the ``B`` best are kept. It stops when no live prefix can
beat the ``B``-th best finished hypothesis (every later step costs >= 0 nats, so this stop loses
nothing the beam still holds) or at ``max_len``. Scores are plain log-probs (no length penalty):
the quantity the library's exact searches rank by.

What it returns is never wrong but may be incomplete: every item is a sequence of the support
with its model log-prob (float64 sum of the model's float32 step log-probs, as
``score_sequences`` sums them), best first; but a sequence whose prefix fell out of the beam is
never found, so the items need not be the model's top-B (recall < 1). With ``B`` at least the
support's size nothing ever falls out and the answer is exact (at depth ``d`` there are at most as
many live prefixes as support sequences: each live prefix has a completion of its own).

Two paths, one algorithm:

- **jitted** (t5x-style, for a :class:`~jaxrescore.models.jax_lm.JaxLM` such as a TransformerLM,
  or a prompt of one): the beams live on the device as padded arrays ``int32[B, max_len]``; one
  ``jax.jit`` step takes ``model.apply`` as a static argument and ``model.params`` as an argument
  (never closed over), runs the forward over the bucketed width, selects the new beams with
  ``lax.top_k`` and merges the finished pool, all on device. Only two scalars per step come back
  to decide whether to stop. No KV cache: each step re-runs the forward over the whole prefix.
- **generic** (any model with batched ``next_logprobs``): the same selection in numpy, one
  ``next_logprobs`` call per step for the live beams.

Ties between equal scores go to the lower flat index (beam-major, then token id) on both paths,
as ``lax.top_k`` breaks them, so the two agree item for item on the same rows.

Cost (:class:`BeamResult`): ``calls`` sequential model calls (one per step), ``rows`` live beams
evaluated, ``positions`` the token positions those forwards compute without a KV cache
(``len(prompt) + n + 1`` for a live prefix of ``n`` tokens: BOS and prompt included, as the
benchmarks count them); a KV cache would cost one position per row.
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxrescore._checks import check_bool, check_int
from jaxrescore.models.base import AutoregressiveEnumerable
from jaxrescore.typing import Tokens
from jaxrescore.sequences import bucket_size


class BeamResult(NamedTuple):
    """The outcome of :func:`beam_search`.

    Attributes:
      items: up to ``B`` finished ``(sequence, log_prob)`` pairs, best first: continuations of
        the prompt (``eos`` last for a terminating model), log-probs conditional on the prompt,
        float64.
      calls: sequential model calls (decode steps).
      rows: live beams evaluated, over all steps.
      positions: token positions those forwards compute without a KV cache.
      stopped_early: True when the search stopped because no live beam could beat the ``B``-th
        finished hypothesis; False when it ran to ``max_len`` or out of live beams.
    """

    items: list
    calls: int
    rows: int
    positions: int
    stopped_early: bool


def _unprompted(model):
    """``(base, prompt)``: a prompted model's base and prompt, or ``(model, ())``."""
    base, prompt = getattr(model, "base", None), getattr(model, "prompt", None)
    if base is not None and prompt is not None:
        return base, tuple(int(t) for t in prompt)
    return model, ()


def beam_search(
    model: AutoregressiveEnumerable, beam_width: int, *, prompt: Tokens = (), jit: bool | None = None
) -> BeamResult:
    """The ``beam_width`` best finished sequences beam search finds (see the module docstring).

    Args:
      model: an AutoregressiveEnumerable (``vocab_size``, ``eos``, ``max_len``, batched
        ``next_logprobs``); a JaxLM (TransformerLM, int8 twin, ``from_apply_fn``) or a prompt of
        one (``model.with_prompt(p)``) takes the jitted path.
      beam_width: B, live prefixes kept per step and finished hypotheses returned, an integer >= 1.
      prompt: token ids to condition on (continuations are returned, scored given the prompt).
      jit: True forces the jitted path (TypeError when the model is not a JAX model), False the
        generic one; None picks the jitted path whenever it applies.
    """
    from jaxrescore.models.jax_lm import JaxLM
    from jaxrescore.models.prompt import check_prompt

    beam_width = check_int(beam_width, "beam_width", minimum=1)
    if jit is not None:
        jit = check_bool(jit, "jit")
    base, own = _unprompted(model)
    jittable = isinstance(base, JaxLM)
    if jit and not jittable:
        raise TypeError(
            f"jit=True needs a JAX model (a JaxLM such as TransformerLM, or a prompt of one), got "
            f"{type(base).__name__}"
        )
    more = check_prompt(model, prompt)  # validated against the (prompted) model's own support
    if jittable and jit is not False:
        # the continuation's cap is the given model's (a prompt's max_new_tokens), not the base's
        return _jitted(base, own + more, beam_width, int(model.max_len) - len(more))
    if more:
        model = model.with_prompt(more)
    return _generic(model, beam_width)


# ---- the generic path (numpy selection, any model) ---------------------------------------------


def _top(scores: np.ndarray, n: int) -> np.ndarray:
    """Flat indices of the ``n`` largest finite entries, best first, ties to the lower index
    (``lax.top_k``'s rule)."""
    flat = scores.reshape(-1)
    if flat.size > n:
        # argpartition picks a superset of ties arbitrarily: keep every entry >= the n-th value,
        # then a stable sort restores the lower-index rule among equals.
        kth = np.partition(flat, flat.size - n)[flat.size - n]
        cand = np.flatnonzero(flat >= kth)
    else:
        cand = np.arange(flat.size)
    order = cand[np.argsort(-flat[cand], kind="stable")][:n]
    return order[np.isfinite(flat[order])]


def _generic(model, beam: int) -> BeamResult:
    from jaxrescore.models.checked import checked_model, model_rows

    model = checked_model(model, "model")
    v, eos, max_len = int(model.vocab_size), model.eos, int(model.max_len)
    extra = len(getattr(model, "prompt", ())) + 1
    alive = np.zeros((1, 0), np.int64)  # live prefixes [A, j]
    alive_lp = np.zeros(1)
    fin: list = []  # (log_prob, flat order key, sequence); kept to the B best
    calls = rows = positions = 0
    stopped = False
    for j in range(max_len):
        a = alive.shape[0]
        toks = np.zeros((a, max(j, 1)), np.int32)
        toks[:, :j] = alive
        lp = np.minimum(np.asarray(model_rows(model, toks, np.full(a, j, np.int32), "model"), np.float64), 0.0)
        calls, rows, positions = calls + 1, rows + a, positions + a * (j + extra)
        cand = alive_lp[:, None] + lp
        last = j == max_len - 1
        if eos is not None:
            ends = cand[:, eos]
            for b in np.flatnonzero(np.isfinite(ends)):
                fin.append((float(ends[b]), b * v + eos, tuple(int(t) for t in alive[b]) + (eos,)))
            cand[:, eos] = -np.inf
        elif last:
            for i in _top(cand, beam):
                b, t = divmod(int(i), v)
                fin.append((float(cand[b, t]), int(i), tuple(int(x) for x in alive[b]) + (t,)))
        # Keep the B best finished: score descending, then the earlier step, then flat index
        # (the jitted merge keeps the old pool ahead of new arrivals on ties).
        fin = sorted(fin, key=lambda f: -f[0])[:beam]
        if last:
            break
        keep = _top(cand, beam)
        if keep.size == 0:
            break
        b, t = np.divmod(keep, v)
        alive = np.concatenate([alive[b], t[:, None]], axis=1)
        alive_lp = cand[b, t]
        if eos is not None and len(fin) >= beam and alive_lp.max() <= fin[-1][0]:
            stopped = True
            break
    items = [(seq, lp) for lp, _, seq in fin]
    return BeamResult(items, calls, rows, positions, stopped)


# ---- the jitted path (t5x-style, state on device) ----------------------------------------------


class _State(NamedTuple):
    """Device arrays of one search; B beams, L = max continuation length, W = base max_len."""

    inputs: jax.Array  # int32[B, W]: BOS, prompt, continuation so far (the forward's input)
    cont: jax.Array  # int32[B, L]: the continuation tokens of each live beam
    steps: jax.Array  # float32[B, L]: their step log-probs
    alive_lp: jax.Array  # float32[B]: live beams' scores, -inf = dead
    fin_cont: jax.Array  # int32[B, L]: finished hypotheses
    fin_steps: jax.Array  # float32[B, L]
    fin_lp: jax.Array  # float32[B], -inf = empty slot
    fin_len: jax.Array  # int32[B]


@partial(jax.jit, static_argnums=(0, 1, 2, 3))
def _beam_step(apply, width, beam, eos, params, state: _State, pos, j, last):
    """One decode step: the forward over ``inputs[:, :width]`` (static width), next-token
    log-probs at position ``pos`` (= len(prompt) + j, traced), new beams and finished pool.
    ``last`` (traced bool): this is the last position, only ``eos`` (or, for a fixed-length
    model, any token) may end a sequence here and no beam stays alive."""
    logits = apply(params, state.inputs[:, :width])
    row = jax.lax.dynamic_index_in_dim(logits, pos, axis=1, keepdims=False).astype(jnp.float32)
    lp = jnp.minimum(jax.nn.log_softmax(row, axis=-1), 0.0)  # [B, V]
    v = lp.shape[1]
    cand = state.alive_lp[:, None] + lp
    if eos is None:
        # Fixed length: at the last position every candidate ends; elsewhere none does.
        ends = jnp.where(last, cand, -jnp.inf).reshape(-1)
        end_val, end_idx = jax.lax.top_k(ends, beam)
        end_beam, end_tok = end_idx // v, end_idx % v
        grow = jnp.where(last, -jnp.inf, cand)
    else:
        end_val = cand[:, eos]
        end_beam, end_tok = jnp.arange(beam), jnp.full(beam, eos, jnp.int32)
        grow = jnp.where(last, -jnp.inf, cand.at[:, eos].set(-jnp.inf))
    # New finished hypotheses from this step, merged with the pool (old pool first on ties).
    new_cont = state.cont[end_beam].at[:, j].set(end_tok.astype(jnp.int32))
    new_steps = state.steps[end_beam].at[:, j].set(lp[end_beam, end_tok])
    pool_lp = jnp.concatenate([state.fin_lp, end_val])
    keep_lp, keep = jax.lax.top_k(pool_lp, beam)
    fin_cont = jnp.concatenate([state.fin_cont, new_cont])[keep]
    fin_steps = jnp.concatenate([state.fin_steps, new_steps])[keep]
    fin_len = jnp.concatenate([state.fin_len, jnp.full(beam, j + 1, jnp.int32)])[keep]
    # The B best growing candidates become the live beams.
    alive_lp, idx = jax.lax.top_k(grow.reshape(-1), beam)
    b, t = idx // v, (idx % v).astype(jnp.int32)
    cont = state.cont[b].at[:, j].set(t)
    steps = state.steps[b].at[:, j].set(lp[b, t])
    # The token is the next forward's input at pos + 1; at the last position (pos + 1 == W) no
    # beam lives on and the write is dropped.
    inputs = state.inputs[b].at[:, pos + 1].set(t, mode="drop")
    new = _State(inputs, cont, steps, alive_lp, fin_cont, fin_steps, keep_lp, fin_len)
    return new, alive_lp.max(), keep_lp.min()


def _jitted(base, prompt: tuple, beam: int, length: int) -> BeamResult:
    """Beam search over ``base`` after ``prompt``, continuations of at most ``length`` tokens
    (eos included)."""
    eos, p = base.eos, len(prompt)
    w = p + length  # the columns a beam's input needs past BOS: the prompt and its continuation
    inputs = np.zeros((beam, w), np.int32)
    inputs[:, 0] = base.bos_id
    inputs[:, 1 : 1 + p] = prompt
    alive_lp = np.full(beam, -np.inf, np.float32)
    alive_lp[0] = 0.0  # one live beam: the empty continuation
    state = _State(
        jnp.asarray(inputs),
        jnp.zeros((beam, length), jnp.int32),
        jnp.zeros((beam, length), jnp.float32),
        jnp.asarray(alive_lp),
        jnp.zeros((beam, length), jnp.int32),
        jnp.zeros((beam, length), jnp.float32),
        jnp.full(beam, -jnp.inf, jnp.float32),
        jnp.zeros(beam, jnp.int32),
    )
    params = base._device_params() if hasattr(base, "_device_params") else base.params
    calls = rows = positions = 0
    live = 1
    stopped = False
    for j in range(length):
        pos = p + j  # the forward reads positions 0..pos (BOS, prompt, j tokens)
        width = min(bucket_size(pos + 1, 8), w)
        last = j == length - 1
        state, best_alive, worst_fin = _beam_step(
            base.apply, width, beam, eos, params, state, np.int32(pos), np.int32(j), np.bool_(last)
        )
        calls, rows, positions = calls + 1, rows + live, positions + live * (pos + 1)
        if last:
            break
        alive = np.asarray(state.alive_lp)
        live = int(np.isfinite(alive).sum())
        if live == 0:
            break
        if eos is not None and float(worst_fin) > -np.inf and float(best_alive) <= float(worst_fin):
            stopped = True
            break
    fin_lp = np.asarray(state.fin_lp)
    fin_cont, fin_steps, fin_len = (np.asarray(a) for a in (state.fin_cont, state.fin_steps, state.fin_len))
    items = []
    for i in np.flatnonzero(np.isfinite(fin_lp)):
        n = int(fin_len[i])
        # float64 sum of the float32 steps, as score_sequences sums them.
        items.append((tuple(int(t) for t in fin_cont[i, :n]), float(fin_steps[i, :n].astype(np.float64).sum())))
    items.sort(key=lambda it: -it[1])
    return BeamResult(items, calls, rows, positions, stopped)
