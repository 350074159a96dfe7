"""Training JAX-backed models with optax: maximum likelihood (:func:`train_lm`) and distillation
(:func:`distill`).

Both work on any :class:`~jaxrescore.models.jax_lm.JaxLM` (a TransformerLM, or a model wrapped by
``from_apply_fn``): the step is a ``jax.jit`` of a function of ``(params, opt_state, batch)``
closing only over the model's pure ``apply`` and the optimizer, never over weights (cached per
``apply``, loss and hyperparameters). With a mesh (``model.with_mesh(mesh, shard_params=...)``)
the weights and the optimizer state stay replicated or split as the model keeps them and every
batch is split over the mesh's devices (rows padded with mask 0 to a multiple of them). Batches have
one fixed shape (the corpus' longest sequence, bucketed), so a run compiles once. At the end the
model's ``params`` are replaced, so every later score uses the new weights.

Sequences must lie in the model's support (what is trained is what is scored): with ``eos``, each
ends with ``eos``; without it, each has exactly ``max_len`` tokens. ``weights`` (e.g. name
frequencies) make batches draw sequence ``i`` with probability ``weights[i] / sum(weights)``.
"""

from __future__ import annotations

import functools
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax
from tqdm.auto import tqdm

from jaxrescore._checks import check_bool, check_float, check_int
from jaxrescore.models.base import AutoregressiveEnumerable
from jaxrescore.models.checked import checked_model
from jaxrescore.models.checks import check_eos_terminated, check_tokens, check_weights
from jaxrescore.models.jax_lm import JaxLM
from jaxrescore.models.mesh import batch_devices, mesh_context, to_host
from jaxrescore.sequences import SequenceBatch, as_sequence_batch
from jaxrescore.typing import ArrayLike, Sequences


def _check_model(model, name: str) -> None:
    if not isinstance(model, JaxLM) or not model.trainable:
        raise TypeError(
            f"{name} must be a trainable JAX model (TransformerLM or from_apply_fn), "
            f"got {type(model).__name__}"
        )
    # A gradient needs float leaves: an RNG key or a counter in the weights (a flax nnx module
    # split whole) would fail inside jax.grad with a message naming neither.
    for path, leaf in jax.tree_util.tree_flatten_with_path(model.params)[0]:
        dtype = getattr(leaf, "dtype", None)
        if dtype is None:  # a Python number (jax.grad takes a float)
            dtype = np.result_type(leaf) if isinstance(leaf, (int, float, complex)) else np.dtype(object)
        if not jnp.issubdtype(dtype, jnp.inexact):
            where = jax.tree_util.keystr(path) or "the root"
            raise TypeError(
                f"{name}.params holds a {dtype} leaf at {where}; only float weights "
                "can be trained (a flax nnx module: wrap it with from_nnx, which trains its nnx.Param "
                "state and holds RNG and batch-stat state fixed)"
            )


def _check_lr(lr):
    """A positive float, or an optax schedule (a callable ``step -> lr``) passed through."""
    if callable(lr):
        return lr
    value = check_float(lr, "lr", minimum=0.0)
    if value == 0.0:  # trains nothing
        raise ValueError("lr must be a positive finite float or an optax schedule, got 0")
    return value


def training_corpus(model, sequences, weights) -> tuple[SequenceBatch, np.ndarray]:
    """The corpus as a batch checked against ``model``'s support, and sampling probabilities."""
    batch = as_sequence_batch(sequences)
    if batch.size == 0:
        raise ValueError("sequences is empty; training needs at least one sequence")
    check_tokens(batch, model.vocab_size, model.max_len, what="sequences")
    if model.eos is None:
        wrong = np.flatnonzero(batch.lengths != model.max_len)
        if wrong.size:
            raise ValueError(
                f"sequences[{wrong[0]}] has length {batch.lengths[wrong[0]]}; a fixed-length model "
                f"needs every sequence to have max_len={model.max_len} tokens"
            )
    else:
        check_eos_terminated(batch, model.eos, "sequences")
    w = check_weights(weights, batch.size)
    return batch, w / w.sum()


def _logprobs(apply, dropout, params, inputs, key):
    logits = apply(params, inputs, key) if dropout else apply(params, inputs)
    return jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)


def _nll_loss(apply, dropout, params, key, inputs, targets, mask):
    """Mean per-token negative log-likelihood of ``targets``."""
    lp = _logprobs(apply, dropout, params, inputs, key)
    nll = -jnp.take_along_axis(lp, targets[..., None], axis=-1)[..., 0]
    return (nll * mask).sum() / mask.sum()


def _kl_loss(apply, dropout, params, key, inputs, teacher_lp, mask):
    """Mean per-position KL(teacher || student)."""
    lp = _logprobs(apply, dropout, params, inputs, key)
    p = jnp.exp(teacher_lp)
    kl = jnp.where(p > 0, p * (teacher_lp - lp), 0.0).sum(axis=-1)
    return (kl * mask).sum() / mask.sum()


@functools.lru_cache(maxsize=32)
def _train_step(loss, apply, dropout: bool, lr, weight_decay: float):
    """A jitted adamw step for ``loss``; cached so repeated runs of one model reuse the compile.
    It closes over the pure ``apply`` and the optimizer only: weights are arguments."""
    opt = optax.adamw(lr, weight_decay=weight_decay)

    @jax.jit
    def step(params, opt_state, key, *batch):
        value, grads = jax.value_and_grad(partial(loss, apply, dropout))(params, key, *batch)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    return opt, step


def _run(model, loss, batches, steps, lr, weight_decay, seed, progress, desc):
    """Optimise ``model.params`` on ``loss`` over ``batches(i)``; returns float32[steps] losses.
    With a mesh the weights stay where the model keeps them (replicated or split, see
    ``JaxLM.with_mesh``) and every batch is split over the mesh's devices."""
    with mesh_context(model.mesh):
        return _run_on_mesh(model, loss, batches, steps, lr, weight_decay, seed, progress, desc)


def _placed_batch(model, arrays):
    """The batch arrays split over the model's mesh, rows padded (mask 0) to a multiple of its
    batch devices (:func:`~jaxrescore.models.mesh.batch_devices`); unchanged without a mesh."""
    if model.mesh is None:
        return arrays
    d = batch_devices(model.mesh)
    n = arrays[0].shape[0]
    rows = -(-n // d) * d
    out = []
    for a in arrays:
        if rows != n:
            a = np.concatenate([a, np.zeros((rows - n,) + a.shape[1:], a.dtype)])
        out.append(model._put(a))
    return tuple(out)


def _run_on_mesh(model, loss, batches, steps, lr, weight_decay, seed, progress, desc):
    opt, step = _train_step(loss, model.apply, bool(model.uses_dropout), lr, weight_decay)
    params = model._device_params()
    opt_state = opt.init(params)
    key = jax.random.PRNGKey(seed)
    losses = []
    bar = tqdm(range(steps), desc=desc, disable=not progress)
    for i in bar:
        key, sub = jax.random.split(key)
        params, opt_state, value = step(params, opt_state, sub, *_placed_batch(model, batches(i)))
        losses.append(value)
        if progress and (i % 25 == 0 or i == steps - 1):
            bar.set_postfix(loss=f"{float(to_host(value)):.4f}")
    model.params = params
    return np.array([to_host(v) for v in losses], np.float32)


def _sampler(model, batch, probs, batch_size, seed):
    """``i -> (inputs, targets, mask)`` for step ``i``: fixed-shape batches drawn by ``probs``."""
    width = model.length_bucket(int(batch.lengths.max()))
    inputs, targets = model.teacher_inputs(batch, width)
    mask = np.arange(width)[None, :] < batch.lengths[:, None]
    rng = np.random.default_rng(seed)

    def draw(_):
        idx = rng.choice(batch.size, size=batch_size, p=probs)
        return idx, inputs[idx], targets[idx], mask[idx].astype(np.float32)

    return draw


def train_lm(
    model: JaxLM,
    sequences: Sequences,
    *,
    weights: ArrayLike | None = None,
    steps: int,
    batch_size: int = 64,
    lr: float | optax.Schedule = 3e-3,
    weight_decay: float = 0.01,
    seed: int = 0,
    progress: bool = True,
) -> np.ndarray:
    """Maximum-likelihood training (adamw), updating ``model.params`` in place.

    Args:
      model: a JaxLM (TransformerLM, or a ``from_apply_fn`` model).
      sequences: the corpus (SequenceBatch or list of token sequences) in the model's support.
      weights: optional non-negative float[N]: batches draw sequences in proportion to them.
      steps, batch_size: optimisation steps and sequences per step.
      lr, weight_decay: adamw parameters; ``lr`` may be an optax schedule
        (e.g. ``optax.cosine_decay_schedule(3e-3, steps)``).
      seed: batch sampling and dropout seed.
      progress: show a tqdm bar with the running loss.

    Returns:
      float32[steps]: the mean per-token negative log-likelihood (nats) of each step's batch.
    """
    _check_model(model, "model")
    steps = check_int(steps, "steps", minimum=1)
    batch_size = check_int(batch_size, "batch_size", minimum=1)
    seed = check_int(seed, "seed", minimum=0)
    check_bool(progress, "progress")
    lr, weight_decay = _check_lr(lr), check_float(weight_decay, "weight_decay", minimum=0.0)
    batch, probs = training_corpus(model, sequences, weights)
    draw = _sampler(model, batch, probs, batch_size, seed)
    return _run(
        model, _nll_loss, lambda i: draw(i)[1:], steps, lr, weight_decay, seed, progress, "train_lm"
    )


def teacher_tables(teacher, batch: SequenceBatch, width: int) -> np.ndarray:
    """float32[N, width, V]: the teacher's next-token log-probs before each position (rows past
    a sequence's end are padding). Uses ``teacher.position_logprobs`` when the model has it (one
    forward), else one batched ``next_logprobs`` call per position."""
    n, v = batch.size, teacher.vocab_size
    out = np.zeros((n, width, v), np.float32)
    if hasattr(teacher, "position_logprobs"):
        _, tables = teacher.position_logprobs(batch)
        w = min(width, tables.shape[1])
        out[:, :w] = tables[:, :w]
        return out
    for j in range(int(batch.lengths.max())):
        rows = np.flatnonzero(batch.lengths > j)
        prefixes = np.zeros((rows.size, max(j, 1)), np.int32)
        prefixes[:, :j] = batch.tokens[rows, :j]
        out[rows, j] = teacher.next_logprobs(prefixes, np.full(rows.size, j, np.int32))
    return out


def distill(
    student: JaxLM,
    teacher: AutoregressiveEnumerable,
    sequences: Sequences,
    *,
    weights: ArrayLike | None = None,
    steps: int,
    batch_size: int = 64,
    lr: float | optax.Schedule = 3e-3,
    weight_decay: float = 0.01,
    seed: int = 0,
    progress: bool = True,
) -> np.ndarray:
    """Distillation: minimise KL(teacher || student) of the next-token distributions at every
    position of the given sequences, updating ``student.params`` in place.

    Args:
      student: a JaxLM (TransformerLM, or a ``from_apply_fn`` model) to train.
      teacher: any model of the protocol with the same ``vocab_size`` and ``eos`` (a
        ``position_logprobs`` method makes it one forward per batch).
      sequences: the contexts to match on (in the student's support); ``weights`` as in
        :func:`train_lm`.
      steps, batch_size, lr, weight_decay, seed, progress: as in :func:`train_lm`.

    Returns:
      float32[steps]: each step's mean per-position KL (nats).
    """
    _check_model(student, "student")
    teacher = checked_model(teacher, "teacher")  # a duck teacher's rows are checked as they arrive
    if teacher.vocab_size != student.vocab_size or teacher.eos != student.eos:
        raise ValueError(
            f"teacher (vocab_size={teacher.vocab_size}, eos={teacher.eos}) and student "
            f"(vocab_size={student.vocab_size}, eos={student.eos}) must share vocab_size and eos"
        )
    steps = check_int(steps, "steps", minimum=1)
    batch_size = check_int(batch_size, "batch_size", minimum=1)
    seed = check_int(seed, "seed", minimum=0)
    check_bool(progress, "progress")
    lr, weight_decay = _check_lr(lr), check_float(weight_decay, "weight_decay", minimum=0.0)
    batch, probs = training_corpus(student, sequences, weights)
    draw = _sampler(student, batch, probs, batch_size, seed)
    width = student.length_bucket(int(batch.lengths.max()))

    def batches(i):
        idx, inputs, _, mask = draw(i)
        sub = SequenceBatch(batch.tokens[idx], batch.lengths[idx])
        return inputs, teacher_tables(teacher, sub, width), mask
    return _run(student, _kl_loss, batches, steps, lr, weight_decay, seed, progress, "distill")
