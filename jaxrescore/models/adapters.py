"""Adapters for models written with flax.nnx, flax.linen and equinox: :func:`from_nnx`,
:func:`from_linen`, :func:`from_equinox`.

All three build the library's :class:`~jaxrescore.models.ApplyFnLM` through
:func:`~jaxrescore.models.from_apply_fn`. What the library trains (``train_lm``, ``distill``) and
places on a mesh is ``ApplyFnLM.params``:

- nnx: the module's ``nnx.Param`` state (``nnx.split(model, nnx.Param, ...)``), taken from a copy
  of the module in eval mode (``Dropout`` deterministic, ``BatchNorm`` on its running averages).
  Every other state (batch statistics, RNG keys and counts, custom variables) is held fixed by the
  forward, never trained;
- linen: ``variables["params"]``. Other collections (``batch_stats``, constants) are held fixed by
  the forward (they are not weights a gradient step should move) and handed back unchanged;
- equinox: the array leaves of the model (``eqx.partition(model, eqx.is_array)``); everything else
  (activation functions, static fields, sizes) is the static part.

The forward is one hashable callable per model holding the static part only, never the weights
(``params`` are an argument of every jit, so trained weights are always used). Two adapters of
the same architecture compare equal, so they share compiles too.

Handing trained weights back: ``nnx.update(module, lm.params)`` writes them into the user's nnx
module (:meth:`ApplyFnLM.to_nnx` builds a new one), :meth:`ApplyFnLM.to_linen_variables` returns a
variables dict of the structure that was given, :meth:`ApplyFnLM.to_equinox` the equinox model with
the new arrays. ``save_model`` stores any adapter's ``params`` and the state its forward holds
fixed (:func:`fixed_state`); ``load_model(path, like=...)`` reads them back into a copy of a model
the user builds again from the same architecture (:func:`with_fixed_state`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
from flax import linen as nn
from flax import nnx
from flax.core import FrozenDict, freeze
from jax.sharding import Mesh

from jaxrescore.models.apply_fn import ApplyFnLM, from_apply_fn
from jaxrescore.models.base import check_int
from jaxrescore.models.int8 import DequantizedApply, DequantizedStep
from jaxrescore.models.linen_decode import decode_module_of, linen_cache_pair
from jaxrescore.typing import PyTree

__all__ = ["from_equinox", "from_linen", "from_nnx"]


def _hashable_or_none(key):
    """``key`` if it can be hashed (structural equality of two adapters), else None (identity)."""
    try:
        hash(key)
    except TypeError:
        return None
    return key


class _Structural:
    """Equal, with equal hashes, when the structural keys are equal (two adapters of one
    architecture then share jit caches, which key on the static ``apply``); compared by identity
    when the key cannot be hashed (e.g. a module field holding a dict)."""

    _key: Any = None
    _hash: int | None = None

    def __eq__(self, other):
        if self is other:
            return True
        if type(self) is not type(other) or self._key is None or other._key is None:
            return False
        try:
            return bool(self._key == other._key)
        except Exception:  # a field whose == is not a bool (an array): fall back to identity
            return False

    def __hash__(self):
        # jit hashes its static arguments on every call; a key holding a module or a GraphDef
        # walks its whole structure, so hash once (the key never changes after __init__)
        if self._hash is None:
            self._hash = id(self) if self._key is None else hash(self._key)
        return self._hash


class LinenApply(_Structural):
    """Hashable forward of a flax.linen module: ``(params, tokens int32[B, T]) -> logits[B, T, V]``
    as ``module.apply({"params": params, **state}, tokens, method=method, **kwargs)``."""

    source_kind = "linen"

    def __init__(self, module: nn.Module, method, kwargs: Mapping, variables: Mapping):
        self.module, self.method, self.kwargs = module, method, dict(kwargs)
        # The non-"params" collections, held fixed; the container type is kept for the hand-back.
        self.state = {k: v for k, v in variables.items() if k != "params"}
        self.order = tuple(variables.keys())
        self.frozen = isinstance(variables, FrozenDict)
        state_key = tuple((k, id(v)) for k, v in self.state.items())  # arrays: by identity
        self._key = _hashable_or_none(
            (module, method, tuple(sorted(self.kwargs.items())), state_key)
        )
        self.__name__ = f"linen:{type(module).__name__}"

    def variables(self, params: PyTree) -> Mapping:
        """The variables dict ``module.apply`` takes, with ``params`` as its ``"params"``."""
        out = {k: params if k == "params" else self.state[k] for k in self.order}
        return freeze(out) if self.frozen else out

    rebuild = variables

    @property
    def fixed_state(self) -> dict:
        """The collections held fixed (every one but ``"params"``), a dict by name."""
        return self.state

    def with_fixed_state(self, state: Mapping) -> LinenApply:
        """The same forward holding ``state`` (a dict like :attr:`fixed_state`) instead."""
        variables = {k: None if k == "params" else state[k] for k in self.order}
        return LinenApply(self.module, self.method, self.kwargs, freeze(variables) if self.frozen else variables)

    def __call__(self, params, tokens):
        return self.module.apply(self.variables(params), tokens, method=self.method, **self.kwargs)


class EquinoxApply(_Structural):
    """Hashable forward of an equinox model: ``(params, tokens int32[B, T]) -> logits[B, T, V]``
    where ``model = eqx.combine(params, static)`` is called on the batch (``batched=True``) or
    vmapped over its rows (each call sees one ``int32[T]`` sequence)."""

    source_kind = "equinox"

    def __init__(self, static: PyTree, batched: bool, kwargs: Mapping):
        self.static, self.batched, self.kwargs = static, batched, dict(kwargs)
        leaves, treedef = jax.tree.flatten(static)
        self._key = _hashable_or_none(
            (treedef, tuple(leaves), batched, tuple(sorted(self.kwargs.items())))
        )
        self.__name__ = f"equinox:{type(static).__name__}"

    def rebuild(self, params: PyTree) -> Any:
        """The equinox model with ``params``' arrays."""
        import equinox as eqx

        return eqx.combine(params, self.static)

    def __call__(self, params, tokens):
        model = self.rebuild(params)
        if self.batched:
            return model(tokens, **self.kwargs)
        return jax.vmap(lambda row: model(row, **self.kwargs))(tokens)


class NnxApply(_Structural):
    """Hashable forward of a flax.nnx module in eval mode: ``(params, tokens int32[B, T]) ->
    logits[B, T, V]`` as ``nnx.merge(graphdef, params, state, copy=True)(tokens, **kwargs)`` (or
    its ``method``). ``graphdef`` is the eval-mode module's structure, ``params`` its
    ``nnx.Param`` state, ``state`` everything else, held fixed: every call merges fresh copies of
    the variables, so whatever the module writes while it runs is dropped."""

    source_kind = "nnx"

    def __init__(self, graphdef: nnx.GraphDef, state: nnx.State, method: str | None, kwargs: Mapping,
                 name: str):
        self.graphdef, self.state, self.method, self.kwargs = graphdef, state, method, dict(kwargs)
        state_key = tuple(id(x) for x in jax.tree.leaves(state))  # arrays: by identity
        self._key = _hashable_or_none((graphdef, method, tuple(sorted(self.kwargs.items())), state_key))
        self._name = name
        self.__name__ = f"nnx:{name}"

    @property
    def fixed_state(self) -> nnx.State:
        """The variables held fixed (every one that is not an ``nnx.Param``)."""
        return self.state

    def with_fixed_state(self, state: nnx.State) -> NnxApply:
        """The same forward holding ``state`` (an ``nnx.State`` like :attr:`fixed_state`) instead."""
        return NnxApply(self.graphdef, state, self.method, self.kwargs, self._name)

    def rebuild(self, params: PyTree) -> nnx.Module:
        """A new module (eval mode) with ``params`` as its ``nnx.Param`` state and copies of the
        held state."""
        return nnx.merge(self.graphdef, params, self.state, copy=True)

    def __call__(self, params, tokens):
        module = self.rebuild(params)
        call = module if self.method is None else getattr(module, self.method)
        return call(tokens, **self.kwargs)


class SourceStep(_Structural):
    """A user's cache-aware ``step(source, cache, tokens, positions)`` given the source object
    (nnx: the module; linen: the variables dict; equinox: the model) instead of the library's
    ``params``."""

    def __init__(self, step: Callable, apply: NnxApply | LinenApply | EquinoxApply):
        self.step, self.apply = step, apply
        self._key = _hashable_or_none((step, apply))

    def __call__(self, params, cache, tokens, positions):
        return self.step(self.apply.rebuild(params), cache, tokens, positions)


def _inner(apply):
    """The adapter's forward inside an int8 twin's dequantising wrapper (or ``apply`` itself)."""
    while isinstance(apply, DequantizedApply):
        apply = apply.apply_fn
    return apply


def fixed_state(model: ApplyFnLM) -> PyTree:
    """The state an adapter model's forward holds fixed beside its ``params`` (part of what it
    computes, never trained): for :func:`from_nnx`, every variable that is not an ``nnx.Param``
    (batch statistics, RNG keys and counts); for :func:`from_linen`, the collections other than
    ``"params"``; None for every other forward (its ``params`` are all it holds)."""
    return getattr(_inner(model.apply), "fixed_state", None)


def with_fixed_state(model: ApplyFnLM, state: PyTree) -> ApplyFnLM:
    """A copy of ``model`` (same ``params``, mesh, cache pair) whose forward holds ``state`` (of
    :func:`fixed_state`'s structure) instead; an int8 twin's wrappers are rebuilt around it."""

    def swap(apply):
        if isinstance(apply, DequantizedApply):
            return DequantizedApply(swap(apply.apply_fn))
        return apply.with_fixed_state(state)

    def swap_step(step):
        if isinstance(step, DequantizedStep):
            return DequantizedStep(swap_step(step.step))
        if isinstance(step, SourceStep):
            return SourceStep(step.step, swap(step.apply))
        return step

    if fixed_state(model) is None:
        raise TypeError(f"{model!r} holds no fixed state (built by neither from_nnx nor from_linen)")
    other = model.with_mesh(model.mesh, shard_params=model.shard_params)
    other.apply = swap(model.apply)
    other.step = None if model.step is None else swap_step(model.step)
    return other


def _check_kwargs(kwargs, name: str) -> dict:
    if kwargs is None:
        return {}
    if not isinstance(kwargs, Mapping) or not all(isinstance(k, str) for k in kwargs):
        raise TypeError(f"{name} must be a mapping of keyword names to values, got {type(kwargs).__name__}")
    return dict(kwargs)


def _probe(apply, params, shape: tuple, vocab_size: int, what: str, hint: str = "") -> None:
    """Trace ``apply`` once (abstractly) on a batch int32[1, 2]; a ValueError naming the user's
    own call (``what``, which sees tokens of ``shape``: (1, 2), or (2,) per sequence) when it
    raises or returns other than logits float[*shape, vocab_size]. from_apply_fn checks the same
    shape again, but could only name its wrapper."""
    try:
        out = jax.eval_shape(apply, params, jax.ShapeDtypeStruct((1, 2), np.int32))
    except Exception as e:  # the user's code raised while tracing: say which call it was
        raise ValueError(f"{what} on tokens int32{list(shape)} failed: {type(e).__name__}: {e}{hint}") from e
    want = (1, 2, vocab_size)
    if getattr(out, "shape", None) != want:
        got = getattr(out, "shape", type(out).__name__)
        if not isinstance(got, str) and shape == (2,):
            got = tuple(got)[1:]  # report the per-sequence call's own shape
        raise ValueError(
            f"{what} must return logits of shape {tuple(shape) + (vocab_size,)} "
            f"(vocab_size={vocab_size}), got {got}{hint}"
        )


def _check_step(step) -> None:
    # Wrapped in SourceStep, a non-callable would look callable to from_apply_fn, which checks
    # the rest (the pair's presence, init_cache, the shapes).
    if step is not None and not callable(step):
        raise TypeError(f"step must be callable, got {type(step).__name__}")


def from_nnx(
    model: nnx.Module,
    *,
    vocab_size: int,
    bos_id: int,
    max_len: int,
    eos: int | None = None,
    mesh: Mesh | None = None,
    method: str | None = None,
    call_kwargs: Mapping[str, Any] | None = None,
    init_cache: Callable[[int, int], PyTree] | None = None,
    step: Callable[..., tuple[jax.Array, PyTree]] | None = None,
) -> ApplyFnLM:
    """A flax.nnx language model as an enumerable, trainable :class:`~jaxrescore.models.ApplyFnLM`.

    ``model(tokens int32[B, T], **call_kwargs)`` (or ``getattr(model, method)(...)``) must return
    causal logits ``float[B, T, V]`` where ``tokens[:, 0] == bos_id`` and position ``j``'s logits
    predict the sequence's token ``j`` (as for :func:`~jaxrescore.models.from_apply_fn`).

    The adapter works on a copy of ``model`` in eval mode (``model.eval()``: every ``Dropout`` is
    deterministic, every ``BatchNorm`` uses its running averages); ``model`` itself is left
    unchanged. Scoring and training are deterministic. The model's ``params`` are the
    ``nnx.Param`` state, an ``nnx.State`` (what ``train_lm``/``distill`` update); every other
    variable (``nnx.BatchStat``, the RNG keys and counts of ``nnx.Rngs``, custom variables) is held
    fixed, as the module had it, and what the module writes to it during a call is dropped. After
    training, ``nnx.update`` hands the weights back to your module; in eval mode it then computes
    the adapter's logits::

        lm = from_nnx(model, vocab_size=V, bos_id=V, max_len=16, eos=0)
        train_lm(lm, corpus, steps=200)
        nnx.update(model, lm.params)  # model.eval(); model(tokens) == lm's logits
        save_model(lm, "my_lm.npz")   # the weights; the architecture is your code:
        lm = load_model("my_lm.npz", like=from_nnx(MyLM(rngs=nnx.Rngs(0)), vocab_size=V, ...))

    Args:
      model: a ``flax.nnx.Module`` instance.
      vocab_size, bos_id, max_len, eos, mesh: the support and placement, as in
        :func:`~jaxrescore.models.from_apply_fn`.
      method: optional name of the module's method to call instead of ``__call__``.
      call_kwargs: optional keyword arguments of every call of the module.
      init_cache, step: optional cache-aware pair, as in :func:`~jaxrescore.models.from_apply_fn`,
        except that ``step`` receives the module (eval mode, with the current weights) in place of
        ``params``:
        ``step(module, cache, tokens int32[B, 1], positions int32[B]) -> (logits[B, 1, V], cache)``.

    Returns:
      An ApplyFnLM whose ``apply`` holds the module's structure and fixed state (never the
      weights): adapters of equal structures with the same fixed arrays share compiles.
      :meth:`~jaxrescore.models.ApplyFnLM.to_nnx` builds a new module holding its weights.
    """
    if isinstance(model, type):
        raise TypeError(f"model must be a flax.nnx Module instance, got the class {model.__name__}; "
                        f"pass {model.__name__}(..., rngs=nnx.Rngs(0))")
    if not isinstance(model, nnx.Module):
        hint = " (a flax.linen module: use from_linen(module, variables, ...))" if isinstance(model, nn.Module) else ""
        raise TypeError(f"model must be a flax.nnx Module, got {type(model).__name__}{hint}")
    if method is not None and not (isinstance(method, str) and callable(getattr(model, method, None))):
        raise ValueError(f"method must be None or the name of a method of {type(model).__name__}, got {method!r}")
    kwargs = _check_kwargs(call_kwargs, "call_kwargs")
    vocab_size = check_int(vocab_size, "vocab_size", minimum=1)  # the probe below needs it
    copy = nnx.clone(model)  # independent variables: later changes to model never reach the adapter
    copy.eval()
    graphdef, params, state = nnx.split(copy, nnx.Param, ...)
    apply = NnxApply(graphdef, state, method, kwargs, type(model).__name__)
    call = "model" + ("" if method is None else f".{method}") + ("(tokens, **call_kwargs)" if kwargs else "(tokens)")
    _probe(apply, params, (1, 2), vocab_size, call + " (eval mode)")
    _check_step(step)
    return from_apply_fn(
        apply, params, vocab_size=vocab_size, bos_id=bos_id, max_len=max_len, eos=eos, mesh=mesh,
        init_cache=init_cache, step=None if step is None else SourceStep(step, apply),
    )


def from_linen(
    module: nn.Module,
    variables: Mapping[str, Any],
    *,
    vocab_size: int,
    bos_id: int,
    max_len: int,
    eos: int | None = None,
    mesh: Mesh | None = None,
    method: str | Callable | None = None,
    apply_kwargs: Mapping[str, Any] | None = None,
    init_cache: Callable[[int, int], PyTree] | None = None,
    step: Callable[..., tuple[jax.Array, PyTree]] | None = None,
    decode_module: nn.Module | bool | None = None,
) -> ApplyFnLM:
    """A flax.linen language model as an enumerable, trainable :class:`~jaxrescore.models.ApplyFnLM`.

    ``module.apply(variables, tokens int32[B, T], method=method, **apply_kwargs)`` must return
    causal logits ``float[B, T, V]`` where ``tokens[:, 0] == bos_id`` and position ``j``'s logits
    predict the sequence's token ``j`` (as for :func:`~jaxrescore.models.from_apply_fn`).

    The model's ``params`` are ``variables["params"]`` (what ``train_lm``/``distill`` update);
    other collections (``batch_stats``, ...) are held fixed. After training,
    ``lm.to_linen_variables()`` returns the variables dict with the new weights, in the structure
    given here (a ``FrozenDict`` stays one)::

        lm = from_linen(module, variables, vocab_size=V, bos_id=V, max_len=16, eos=0)
        train_lm(lm, corpus, steps=200)
        variables = lm.to_linen_variables()  # module.apply(variables, tokens) == lm's logits

    Args:
      module: a ``flax.linen.Module`` instance (the bound-free module, as used with ``init``).
      variables: its variables, as returned by ``module.init`` (a dict or FrozenDict holding
        ``"params"``).
      vocab_size, bos_id, max_len, eos, mesh: the support and placement, as in
        :func:`~jaxrescore.models.from_apply_fn`.
      method: optional method of the module to apply (a name or the unbound function), as in
        ``module.apply(..., method=...)``; None: ``__call__``.
      apply_kwargs: optional keyword arguments of every apply, e.g. ``{"deterministic": True}``
        for a module with dropout (the library scores and trains deterministically).
      init_cache, step: optional cache-aware pair, as in :func:`~jaxrescore.models.from_apply_fn`,
        except that ``step`` receives the variables dict (``{"params": params, ...}``, the other
        collections included) in place of ``params``:
        ``step(variables, cache, tokens int32[B, 1], positions int32[B]) -> (logits[B, 1, V], cache)``.
      decode_module: the model in decode mode, for a module whose attention uses flax's own cache
        (``nn.MultiHeadDotProductAttention(decode=True)``, a ``"cache"`` collection): then no
        ``init_cache``/``step`` are needed (see :mod:`jaxrescore.models.linen_decode`). None (the
        default): ``module.clone(decode=True)`` when ``module`` has a ``decode`` field (the flax
        convention), else none; False: no cache (full forwards). Ignored when ``step`` is given.

    Returns:
      An ApplyFnLM whose ``apply`` holds the module (never the weights): adapters of equal modules
      with equal ``method`` and ``apply_kwargs`` share compiles.
    """
    if isinstance(module, type) and issubclass(module, nn.Module):
        raise TypeError(f"module must be a flax.linen Module instance, got the class {module.__name__}; "
                        f"pass {module.__name__}(...)")
    if not isinstance(module, nn.Module):
        hint = ""
        if isinstance(module, nnx.Module):
            hint = " (a flax.nnx module: use from_nnx(module, vocab_size=..., bos_id=..., max_len=...))"
        raise TypeError(f"module must be a flax.linen Module, got {type(module).__name__}{hint}")
    if not isinstance(variables, Mapping):
        raise TypeError(
            f"variables must be the dict returned by module.init (holding 'params'), got {type(variables).__name__}"
        )
    if "params" not in variables:
        raise ValueError(
            f"variables has no 'params' collection (keys: {sorted(map(str, variables))}); pass the whole "
            "dict returned by module.init, or {'params': params} if you hold the parameters alone"
        )
    if method is not None and not callable(method) and not (
        isinstance(method, str) and callable(getattr(module, method, None))
    ):
        raise ValueError(f"method must be None, a method of {type(module).__name__} or its name, got {method!r}")
    kwargs = _check_kwargs(apply_kwargs, "apply_kwargs")
    vocab_size = check_int(vocab_size, "vocab_size", minimum=1)  # the probe below needs it
    apply = LinenApply(module, method, kwargs, variables)
    params = variables["params"]
    call = "module.apply(variables, tokens" + ("" if method is None else ", method=...") + (
        ", **apply_kwargs)" if kwargs else ")"
    )
    _probe(apply, params, (1, 2), vocab_size, call)
    _check_step(step)
    decoding = decode_module_of(module, decode_module)
    if decoding is not None and step is None and init_cache is None:
        init_cache, step = linen_cache_pair(decoding, method, kwargs)
    return from_apply_fn(
        apply, params, vocab_size=vocab_size, bos_id=bos_id, max_len=max_len, eos=eos, mesh=mesh,
        init_cache=init_cache, step=None if step is None else SourceStep(step, apply),
    )


def from_equinox(
    model: Any,
    *,
    vocab_size: int,
    bos_id: int,
    max_len: int,
    eos: int | None = None,
    mesh: Mesh | None = None,
    batched: bool = False,
    call_kwargs: Mapping[str, Any] | None = None,
    init_cache: Callable[[int, int], PyTree] | None = None,
    step: Callable[..., tuple[jax.Array, PyTree]] | None = None,
) -> ApplyFnLM:
    """An equinox language model as an enumerable, trainable :class:`~jaxrescore.models.ApplyFnLM`.

    By default (``batched=False``), as equinox models are usually written, ``model(tokens
    int32[T]) -> logits float[T, V]`` scores ONE sequence and the library vmaps it over the batch;
    with ``batched=True``, ``model(tokens int32[B, T]) -> logits float[B, T, V]``. Either way
    ``tokens[0] == bos_id`` and position ``j``'s logits predict the sequence's token ``j``
    (causal, as for :func:`~jaxrescore.models.from_apply_fn`).

    The model's ``params`` are its array leaves (``eqx.partition(model, eqx.is_array)``; what
    ``train_lm``/``distill`` update, so every array leaf must be a float weight to train); the
    rest is closed over by the forward. After training, ``lm.to_equinox()`` is the model with the
    new weights (``eqx.combine(lm.params, static)``)::

        lm = from_equinox(model, vocab_size=V, bos_id=V, max_len=16, eos=0)
        train_lm(lm, corpus, steps=200)
        model = lm.to_equinox()  # jax.vmap(model)(tokens) == lm's logits

    A model with dropout should be given in inference mode (``eqx.nn.inference_mode(model)``):
    the library scores and trains deterministically.

    Args:
      model: an ``equinox.Module`` instance.
      vocab_size, bos_id, max_len, eos, mesh: the support and placement, as in
        :func:`~jaxrescore.models.from_apply_fn`.
      batched: whether ``model`` takes a batch ``int32[B, T]`` (True) or one sequence
        ``int32[T]`` (False, the default: vmapped by the library).
      call_kwargs: optional keyword arguments of every call of ``model``.
      init_cache, step: optional cache-aware pair, as in :func:`~jaxrescore.models.from_apply_fn`,
        except that ``step`` receives the equinox model in place of ``params``:
        ``step(model, cache, tokens int32[B, 1], positions int32[B]) -> (logits[B, 1, V], cache)``
        (batched over rows, whatever ``batched`` says).

    Returns:
      An ApplyFnLM whose ``apply`` holds the static part only (never the weights): adapters of
      equal architectures share compiles.

    Raises:
      ImportError: equinox is not installed (it is not a dependency of jaxrescore).
    """
    try:
        import equinox as eqx
    except ImportError as e:
        raise ImportError(
            "from_equinox needs equinox, which jaxrescore does not install: pip install equinox"
        ) from e
    if isinstance(model, type):
        raise TypeError(f"model must be an equinox Module instance, got the class {model.__name__}")
    if not isinstance(model, eqx.Module):
        raise TypeError(f"model must be an equinox Module, got {type(model).__name__}")
    if not isinstance(batched, (bool, np.bool_)):
        raise ValueError(f"batched must be True or False, got {batched!r}")
    kwargs = _check_kwargs(call_kwargs, "call_kwargs")
    vocab_size = check_int(vocab_size, "vocab_size", minimum=1)  # the probe below needs it
    params, static = eqx.partition(model, eqx.is_array)
    apply = EquinoxApply(static, bool(batched), kwargs)
    if batched:
        call, shape = "model(tokens int32[B, T])", (1, 2)
        hint = "; if model takes one sequence int32[T], pass batched=False"
    else:
        call, shape = "model(tokens int32[T]) (one sequence; vmapped)", (2,)
        hint = "; if model takes a batch int32[B, T], pass batched=True"
    _probe(apply, params, shape, vocab_size, call, hint)
    _check_step(step)
    return from_apply_fn(
        apply, params, vocab_size=vocab_size, bos_id=bos_id, max_len=max_len, eos=eos, mesh=mesh,
        init_cache=init_cache, step=None if step is None else SourceStep(step, apply),
    )
