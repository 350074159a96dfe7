"""save_model / load_model: a model's weights in one checksummed ``.npz`` file.

Format (version 2), a plain numpy ``.npz`` archive (readable with ``np.load`` alone):

- ``__meta__``: a JSON string ``{"format": "jaxrescore-model", "version": 2, "kind": ...,
  "config": {...}, "vocabulary": [...] or null, "checksum": ...}``; ``kind`` is
  ``"TransformerLM"``, ``"Int8TransformerLM"`` (config: the TransformerConfig fields, and for
  the twin its ``activations``, ``"float"`` when absent: files written before W8A8 twins),
  ``"NGramLM"`` (config: ``order``, ``vocab_size``, ``eos``, ``max_len``, ``discounts``) or
  ``"ApplyFnLM"``, the weights of an adapter model (``from_nnx``, ``from_linen``,
  ``from_equinox``, ``from_apply_fn``; config: ``source``, the adapter, ``"nnx"``,
  ``"linen"``, ``"equinox"`` or ``"apply_fn"``; ``forward``, its forward's name, e.g.
  ``"nnx:MyLM"``; ``vocab_size``, ``eos``, ``max_len``, ``bos_id``);
  ``vocabulary`` is the model's token strings (see :func:`~jaxrescore.models.vocabulary.check_vocabulary`)
  when it carries them; ``checksum`` is a SHA-256 over the rest of the header and every array
  (name, dtype, shape and bytes);
- one array per weight, named by its path in the weights tree joined with ``/`` (bfloat16 weights,
  ``param_dtype="bfloat16"``, as their uint16 bit patterns)
  (e.g. ``blocks/0/qkv/kernel``; an int8 twin stores ``.../kernel/q`` int8 and
  ``.../kernel/scale`` float32); an NGramLM stores its sparse tables, ``levels/<k>/keys``
  (int64), ``gamma`` (float64), ``ptr`` (int64), ``tok`` (int32) and ``val`` (float64) for each
  context length ``k`` (see :class:`~jaxrescore.models.ngram.NGramLevel`); files written before
  sparse tables hold ``table`` (float32[R, V]) and ``keys/<k>`` and still load (converted);
  an adapter model stores each leaf of its ``params`` as ``params/<path>`` (e.g.
  ``params/blocks/0/kernel``; ``params`` alone for a single-array ``params``) and each leaf of
  the state its forward holds fixed as ``state/<path>`` (from_nnx: every variable that is not an
  ``nnx.Param``, e.g. ``state/norm/mean``, RNG keys as their ``jax.random.key_data``; from_linen:
  the collections other than ``params``, e.g. ``state/batch_stats/...``).

Writes are atomic and leave nothing behind on failure: a temporary file in the destination
folder, flushed and fsynced, then ``os.replace``; the temporary file is removed if anything fails.
The same bytes are written for the same model (numpy's zip entries carry a fixed date).

Loading rebuilds the model from the stored config and checks the checksum and every weight's name,
shape and dtype against it. An adapter model's architecture is code, not data: the caller builds
the model again and passes it as ``like`` (``load_model(path, like=from_nnx(MyLM(...), ...))``);
the file's support (``vocab_size``, ``eos``, ``max_len``, ``bos_id``) and adapter kind must
equal ``like``'s, every stored array's name, shape and dtype those of ``like.params`` and of
``like``'s fixed state; the result is a copy of ``like`` holding the stored weights and fixed state
(``like`` is left unchanged).

Anything wrong with a file — not an archive, flipped bytes, a missing or malformed header, an
unknown kind or version, a bad config, mismatched weights — raises ONE :class:`ModelFileError` (a
ValueError) naming the file and what is wrong, so a file never half-loads into the wrong
architecture. A missing file raises FileNotFoundError naming it.

Version 1 files (no checksum, no vocabulary; the zip's own CRC-32 still catches flipped weight
bytes) are still read: the demo's shipped weights are one.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import Mesh

from jaxrescore.files import checksum as _checksum
from jaxrescore.files import not_this_kind, write_npz_atomic
from jaxrescore.models.adapters import fixed_state, with_fixed_state
from jaxrescore.models.apply_fn import ApplyFnLM
from jaxrescore.models.base import AutoregressiveEnumerable
from jaxrescore.models.mesh import check_mesh, to_host
from jaxrescore.models.int8 import Int8TransformerLM, quantize_int8
from jaxrescore.models.ngram import NGramLevel, NGramLM
from jaxrescore.models.transformer import TransformerConfig, TransformerLM
from jaxrescore.models.vocabulary import check_vocabulary
from jaxrescore.typing import PathLike

FORMAT = "jaxrescore-model"
VERSION = 2
READS = (1, 2)  # versions load_model reads
META = "__meta__"
ADAPTER = "ApplyFnLM"  # the kind of an adapter model's file: weights only, architecture from ``like``
KINDS = ("TransformerLM", "Int8TransformerLM", "NGramLM", ADAPTER)
SUPPORT = ("vocab_size", "eos", "max_len", "bos_id")  # what an adapter file and ``like`` share


class ModelFileError(ValueError):
    """A model file that cannot be loaded; the message names the file and what is wrong."""


def _leaf_name(path) -> str:
    parts = []
    for k in path:
        name = getattr(k, "key", getattr(k, "name", getattr(k, "idx", None)))
        if name != "value":  # nnx Variable wrappers add a '.value' level
            parts.append(str(name))
    return "/".join(parts)


def _named_leaves(params) -> dict[str, np.ndarray]:
    flat, _ = jax.tree_util.tree_flatten_with_path(params)
    return {_leaf_name(p): _storable(to_host(x)) for p, x in flat}


def _storable(a: np.ndarray) -> np.ndarray:
    """``a`` as numpy's .npz keeps it: bfloat16 (which numpy stores as opaque 2-byte records) as
    its uint16 bit pattern; the config's ``param_dtype`` says how to read it back."""
    return a.view(np.uint16) if a.dtype.name == "bfloat16" else a


def _source(model: ApplyFnLM) -> tuple[str, str]:
    """An adapter model's kind (``"nnx"``, ``"linen"``, ``"equinox"``; ``"apply_fn"`` for any
    other forward, an int8 twin's included) and its forward's name."""
    apply = model.apply
    return getattr(apply, "source_kind", "apply_fn"), getattr(apply, "__name__", type(apply).__name__)


def _is_key(leaf) -> bool:
    dtype = getattr(leaf, "dtype", None)
    return dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def _adapter_arrays(tree, prefix: str, what: str) -> dict[str, np.ndarray]:
    """``tree``'s leaves as ``<prefix>/<path>`` arrays (``prefix`` alone for a bare array), typed
    RNG keys as their key data; TypeError for a leaf that is not a numeric array (an object),
    ValueError when two paths would share a name (``what`` names the tree in messages)."""
    arrays = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        name = _leaf_name(path)
        key = f"{prefix}/{name}" if name else prefix
        try:
            a = to_host(jax.random.key_data(leaf) if _is_key(leaf) else leaf)
        except Exception:  # noqa: BLE001 - whatever an odd leaf makes numpy raise
            a = None
        if a is None or not (a.dtype.kind in "biufc" or a.dtype.name == "bfloat16"):
            raise TypeError(
                f"{what} holds a {getattr(leaf, 'dtype', type(leaf).__name__)} leaf at {name or 'the root'!r}; "
                "save_model stores numeric arrays only"
            )
        if key in arrays:
            raise ValueError(f"{what} has two leaves named {name!r}; save_model names arrays by their paths")
        arrays[key] = _storable(a)
    return arrays


def _contents(model) -> tuple[str, dict, dict]:
    """``(kind, config, arrays)`` of a savable model."""
    if isinstance(model, NGramLM):
        config = {"order": model.order, "vocab_size": model.vocab_size, "eos": model.eos,
                  "max_len": model.max_len, "discounts": list(model.discounts)}
        arrays = {}
        for k, level in enumerate(model.levels):
            for field, value in level._asdict().items():
                arrays[f"levels/{k}/{field}"] = np.asarray(value)
        return "NGramLM", config, arrays
    if isinstance(model, Int8TransformerLM):
        config = dict(model.config.to_dict(), activations=model.activations)
        return "Int8TransformerLM", config, _named_leaves(model.params)
    if isinstance(model, TransformerLM):
        return "TransformerLM", model.config.to_dict(), _named_leaves(model.params)
    if isinstance(model, ApplyFnLM):
        source, forward = _source(model)
        config = {"source": source, "forward": forward, **{f: getattr(model, f) for f in SUPPORT}}
        arrays = _adapter_arrays(model.params, "params", "model.params")
        arrays.update(_adapter_arrays(fixed_state(model), "state", "the model's fixed state"))
        return ADAPTER, config, arrays
    raise TypeError(
        f"save_model saves TransformerLM, Int8TransformerLM, NGramLM or an adapter model's weights "
        f"(from_nnx, from_linen, from_equinox, from_apply_fn), got {type(model).__name__}"
    )


def _check_path(path, what: str = "path") -> str:
    if isinstance(path, bool) or not isinstance(path, (str, bytes, os.PathLike)):
        raise TypeError(f"{what} must be a file path (str or os.PathLike), got {type(path).__name__}")
    return os.fsdecode(os.fspath(path))


def save_model(
    model: AutoregressiveEnumerable,
    path: PathLike,
    *,
    vocabulary: Sequence[str] | None = None,
) -> None:
    """Write ``model`` (a TransformerLM, its int8 twin, an NGramLM, or the weights of a model
    built by ``from_nnx``, ``from_linen``, ``from_equinox`` or ``from_apply_fn``) to ``path``
    (see the module docstring). An adapter model's file holds its ``params``, the state its
    forward holds fixed (batch statistics...) and its support, not its architecture: read it back
    with ``load_model(path, like=...)``.

    Args:
      model: the model.
      path: the file to write (its folder must exist); replaced atomically if it exists.
      vocabulary: the token strings to store (default: ``model.vocabulary`` when the model
        carries one), so tools such as ``jaxrescore enumerate`` print text instead of ids.
    """

    kind, config, arrays = _contents(model)
    path = _check_path(path)
    if vocabulary is None:
        vocabulary = getattr(model, "vocabulary", None)
    vocabulary = check_vocabulary(vocabulary, model.vocab_size)
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"cannot write model file {path!r}: no folder {folder!r}")
    if os.path.isdir(path):
        raise IsADirectoryError(f"cannot write model file {path!r}: it is a folder")
    meta = {"format": FORMAT, "version": VERSION, "kind": kind, "config": config,
            "vocabulary": None if vocabulary is None else list(vocabulary)}
    meta["checksum"] = _checksum(meta, arrays)
    if META in arrays:
        raise ValueError(f"a weight is named {META!r}, the header's name")
    try:
        write_npz_atomic(path, {META: np.array(json.dumps(meta)), **arrays}, prefix=".jaxrescore-model-")
    except OSError as err:
        raise type(err)(err.errno, f"cannot write model file {path!r}: {err.strerror or err}") from None


def is_archive(path: str) -> bool:
    """Whether the file at ``path`` starts like a zip (.npz) archive, as every model file does."""
    with open(path, "rb") as f:
        return f.read(4) in (b"PK\x03\x04", b"PK\x05\x06")


def _read(path: str) -> tuple[dict, dict]:
    """The header and the arrays of a model file; ModelFileError for anything unreadable."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"no model file at {path!r}")
    if os.path.isdir(path):
        raise ModelFileError(f"{path!r} is a folder, not a jaxrescore model file")
    try:
        archive_ok = is_archive(path)
    except PermissionError:
        raise ModelFileError(f"{path!r} cannot be read: permission denied") from None
    if not archive_ok:  # refused in words before numpy, whose advice would be to allow pickles
        raise ModelFileError(
            f"{path!r} is not a jaxrescore model file: a model file is the .npz (zip) archive "
            "save_model writes, and this file does not start like one"
        )
    try:
        archive = np.load(path, allow_pickle=False)
    except Exception as e:  # noqa: BLE001 - whatever a damaged file makes numpy raise
        if isinstance(e, PermissionError):
            raise ModelFileError(f"{path!r} cannot be read: permission denied") from None
        raise ModelFileError(f"{path!r} is not a jaxrescore model file (not a readable .npz archive: {e})") from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise ModelFileError(f"{path!r} is not a jaxrescore model file (a bare array, not an .npz archive)")
    try:
        with archive as data:
            if META not in data.files:
                raise ModelFileError(
                    not_this_kind(path, FORMAT) or f"{path!r} is not a jaxrescore model file (no {META} entry)"
                )
            arrays = {k: data[k] for k in data.files}
    except ModelFileError:
        raise
    except Exception as e:  # noqa: BLE001
        # Flipped bytes inside an entry fail its CRC-32, its decompression or numpy's header
        # parsing (zipfile.BadZipFile, zlib.error, ValueError, tokenize errors, MemoryError...).
        raise ModelFileError(f"{path!r} is corrupted or truncated: {e}") from None
    try:
        meta = json.loads(str(arrays.pop(META)))
    except (ValueError, TypeError) as e:
        raise ModelFileError(f"{path!r} has an unreadable {META} header: {e}") from None
    if not isinstance(meta, dict):
        raise ModelFileError(f"{path!r} has a {META} header that is not a JSON object")
    return meta, arrays


def _check_meta(path: str, meta: dict, arrays: dict) -> tuple[str, dict]:
    if meta.get("format") != FORMAT or meta.get("version") not in READS:
        raise ModelFileError(
            f"{path!r} has format {meta.get('format')!r} version {meta.get('version')!r}; this "
            f"library reads {FORMAT!r} versions {', '.join(map(str, READS))}"
        )
    if meta["version"] >= 2 and meta.get("checksum") != _checksum(meta, arrays):
        raise ModelFileError(f"{path!r} is corrupted: its checksum does not match its contents")
    kind = meta.get("kind")
    if kind not in KINDS:
        raise ModelFileError(f"{path!r} holds an unknown model kind {kind!r} (known: {', '.join(KINDS)})")
    config = meta.get("config")
    if not isinstance(config, dict):
        raise ModelFileError(f"{path!r} has no model config in its {META} header (got {config!r})")
    return kind, config


def _restore_params(path: str, template, stored: dict, against: str = "its config"):
    """``stored`` arrays as ``template``'s tree (a weights pytree), every name, shape and dtype
    checked (``against``: what the file must match, for the messages); a typed RNG key leaf is
    read from its key data."""
    flat, treedef = jax.tree_util.tree_flatten_with_path(template)
    names = [_leaf_name(p) for p, _ in flat]
    missing = sorted(set(names) - set(stored))
    extra = sorted(set(stored) - set(names))
    if missing or extra:
        raise ModelFileError(f"{path!r} does not match {against}: missing weights {missing}, unexpected {extra}")
    leaves = []
    for name, (_, leaf) in zip(names, flat):
        got = stored[name]
        if _is_key(leaf):
            want = jax.eval_shape(jax.random.key_data, leaf)
            if got.shape != tuple(want.shape) or got.dtype != want.dtype:
                raise ModelFileError(
                    f"{path!r}: RNG key {name!r} has data of shape {got.shape} dtype {got.dtype}, {against} "
                    f"needs {tuple(want.shape)} {want.dtype}"
                )
            leaves.append(jax.random.wrap_key_data(got, impl=jax.random.key_impl(leaf)))
            continue
        want = leaf if hasattr(leaf, "dtype") and hasattr(leaf, "shape") else np.asarray(leaf)
        if want.dtype.name == "bfloat16" and got.dtype == np.uint16:
            got = got.view(want.dtype)
        if got.shape != tuple(want.shape) or got.dtype != want.dtype:
            raise ModelFileError(
                f"{path!r}: weight {name!r} has shape {got.shape} dtype {got.dtype}, {against} "
                f"needs {tuple(want.shape)} {want.dtype}"
            )
        leaves.append(jax.numpy.asarray(got))
    return jax.tree_util.tree_unflatten(treedef, leaves)


def _build(path: str, kind: str, config: dict, arrays: dict, mesh):
    if kind == "NGramLM":
        fields = {"order", "vocab_size", "eos", "max_len", "discounts"}
        if set(config) != fields:
            raise ModelFileError(f"{path!r}: an NGramLM config needs exactly {sorted(fields)}, got {sorted(config)}")
        order = config["order"] if isinstance(config["order"], int) and not isinstance(config["order"], bool) else 0
        if "table" in arrays:  # files written before sparse tables: dense rows, converted
            keys = [arrays.get(f"keys/{k}") for k in range(order)]
            if any(k is None for k in keys) or len(arrays) != len(keys) + 1:
                raise ModelFileError(f"{path!r} does not hold an NGramLM's table and keys/0..keys/{len(keys) - 1}")
            if arrays["table"].dtype != np.float32 or any(k.dtype != np.int64 or k.ndim != 1 for k in keys):
                raise ModelFileError(f"{path!r}: an NGramLM needs a float32 table and int64 key vectors")
            return NGramLM.from_table(arrays["table"], keys, mesh=mesh, **config)
        dtypes = {"keys": np.int64, "gamma": np.float64, "ptr": np.int64, "tok": np.int32, "val": np.float64}
        names = {f"levels/{k}/{f}" for k in range(order) for f in dtypes}
        if order < 1 or set(arrays) != names:
            raise ModelFileError(f"{path!r} does not hold an NGramLM's levels/0..{order - 1} tables")
        levels = []
        for k in range(order):
            got = {f: arrays[f"levels/{k}/{f}"] for f in dtypes}
            if any(a.dtype != dt or a.ndim != 1 for (f, a), dt in zip(got.items(), dtypes.values())):
                raise ModelFileError(f"{path!r}: NGramLM level {k} has arrays of the wrong dtype or shape")
            levels.append(NGramLevel(**got))
        return NGramLM(levels, mesh=mesh, **config)
    config = dict(config)
    # an int8 twin's file says how its layers multiply; files written before that are weight-only
    activations = config.pop("activations", "float") if kind == "Int8TransformerLM" else None
    config = TransformerConfig(**config)
    model = TransformerLM(config).with_mesh(mesh)
    if kind == "Int8TransformerLM":
        model = quantize_int8(model, activations=activations)
    model.params = _restore_params(path, model.params, arrays)
    return model


def _load_adapter(path: str, config: dict, arrays: dict, like: ApplyFnLM, mesh) -> ApplyFnLM:
    """A copy of ``like`` holding the file's weights and fixed state, after checking that the
    file was saved from a model built the same way (adapter kind, support, every array's name,
    shape and dtype)."""
    fields = {"source", "forward", *SUPPORT}
    if set(config) != fields:
        raise ModelFileError(f"{path!r}: an ApplyFnLM config needs exactly {sorted(fields)}, got {sorted(config)}")
    source, forward = _source(like)
    if config["source"] != source:
        raise ModelFileError(
            f"{path!r} holds the weights of a {config['source']} model ({config['forward']}); like is a "
            f"{source} model ({forward}): build like the way the saved model was built"
        )
    for field in SUPPORT:
        if config[field] != getattr(like, field):
            raise ModelFileError(
                f"{path!r} was saved from a model with {field}={config[field]!r}; like has "
                f"{field}={getattr(like, field)!r}"
            )
    stored = {"params": {}, "state": {}}
    for key, value in arrays.items():
        group, _, name = key.partition("/")  # "params" alone: the empty path of a bare array
        if group not in stored:
            raise ModelFileError(
                f"{path!r} holds an entry {key!r}; an ApplyFnLM file holds params/... and state/... only"
            )
        stored[group][name] = value
    params = _restore_params(path, like.params, stored["params"], against=f"like ({forward})")
    held = fixed_state(like)
    state = _restore_params(path, held, stored["state"], against=f"like's fixed state ({forward})")
    model = like if held is None else with_fixed_state(like, state)  # a copy
    if mesh is None:
        model = model.with_mesh(like.mesh, shard_params=like.shard_params)  # a copy
    else:
        model = model.with_mesh(mesh)
    model.params = params
    return model


def load_model(
    path: PathLike,
    *,
    mesh: Mesh | None = None,
    like: ApplyFnLM | None = None,
) -> TransformerLM | Int8TransformerLM | NGramLM | ApplyFnLM:
    """Read a model written by :func:`save_model` (see the module docstring for what is checked);
    ``mesh`` as in the model constructors. The model's ``vocabulary`` is the stored one (None
    when the file has none; for an adapter model: ``like.vocabulary``).

    Args:
      path: the file.
      mesh: optional ``jax.sharding.Mesh`` (None: single device, or for an adapter model
        ``like``'s placement).
      like: for a file holding an adapter model's weights (from ``from_nnx``, ``from_linen``,
        ``from_equinox``, ``from_apply_fn``; kind ``"ApplyFnLM"``), and only for one: a model
        built again the same way, e.g. ``from_nnx(MyLM(rngs=nnx.Rngs(0)), vocab_size=V,
        bos_id=V, max_len=16, eos=0)`` (its own weights do not matter). The result is a copy of
        ``like`` with the stored weights and fixed state; ``like`` is left unchanged. Hand them
        to your module with ``nnx.update(module, nnx.state(model.to_nnx()))`` (nnx: weights,
        batch statistics and RNG state), ``model.to_linen_variables()`` or ``model.to_equinox()``.

    Raises:
      FileNotFoundError: no file at ``path``.
      TypeError: ``like`` is not an ApplyFnLM.
      ValueError: an adapter model's file without ``like``, or ``like`` with another kind of file.
      ModelFileError: (a ValueError) anything wrong with the file, or a file that does not match
        ``like``, naming it.
    """
    path = _check_path(path)
    mesh = check_mesh(mesh)
    if like is not None and not isinstance(like, ApplyFnLM):
        raise TypeError(
            "like must be a model built by from_nnx, from_linen, from_equinox or from_apply_fn (an "
            f"ApplyFnLM), got {type(like).__name__}"
        )
    meta, arrays = _read(path)
    kind, config = _check_meta(path, meta, arrays)
    if kind == ADAPTER and like is None:
        raise ValueError(
            f"{path!r} holds the weights of an adapter model ({config.get('forward')}); its "
            "architecture is code, not in the file: load it in Python with like=, the model built "
            "again the same way, e.g. load_model(path, like=from_nnx(MyLM(rngs=nnx.Rngs(0)), "
            "vocab_size=..., bos_id=..., max_len=..., eos=...))"
        )
    if kind != ADAPTER and like is not None:
        raise ValueError(
            f"like is only for files of adapter models (from_nnx, from_linen, from_equinox, "
            f"from_apply_fn); {path!r} holds a {kind}, built from its stored config: call "
            "load_model(path) without like"
        )
    try:
        if kind == ADAPTER:
            model = _load_adapter(path, config, arrays, like, mesh)
        else:
            model = _build(path, kind, config, arrays, mesh)
        vocabulary = check_vocabulary(meta.get("vocabulary"), model.vocab_size)
    except ModelFileError:
        raise
    except (TypeError, ValueError, KeyError) as e:
        raise ModelFileError(f"{path!r} has an invalid {kind} config or vocabulary: {e}") from None
    if kind == ADAPTER and vocabulary is None:
        vocabulary = like.vocabulary
    model.vocabulary = vocabulary
    return model
