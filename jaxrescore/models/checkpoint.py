"""save_model / load_model: TransformerLM weights in one ``.npz`` file.

Format (version 1), a plain numpy ``.npz`` archive (readable with ``np.load`` alone):

- ``__meta__``: a JSON string ``{"format": "jaxrescore-model", "version": 1, "kind": ...,
  "config": {TransformerConfig fields}}``; ``kind`` is ``"TransformerLM"`` or
  ``"Int8TransformerLM"``;
- one array per weight, named by its path in the weights tree joined with ``/``
  (e.g. ``blocks/0/qkv/kernel``; an int8 twin stores ``.../kernel/q`` int8 and
  ``.../kernel/scale`` float32).

Writes are atomic (a temporary file in the same folder, then ``os.replace``). Loading rebuilds the
model from the stored config and checks every weight's name, shape and dtype against it, raising
ValueError on any difference, so a file never half-loads into the wrong architecture.
"""

from __future__ import annotations

import json
import zipfile
import os
import tempfile

import jax
import numpy as np

from jaxrescore.models.int8 import Int8TransformerLM, quantize_int8
from jaxrescore.models.transformer import TransformerConfig, TransformerLM

FORMAT = "jaxrescore-model"
VERSION = 1
META = "__meta__"


def _leaf_name(path) -> str:
    parts = []
    for k in path:
        name = getattr(k, "key", getattr(k, "name", getattr(k, "idx", None)))
        if name != "value":  # nnx Variable wrappers add a '.value' level
            parts.append(str(name))
    return "/".join(parts)


def _named_leaves(params) -> dict[str, np.ndarray]:
    flat, _ = jax.tree_util.tree_flatten_with_path(params)
    return {_leaf_name(p): np.asarray(x) for p, x in flat}


def _template(kind: str, config: TransformerConfig):
    if kind == "TransformerLM":
        return TransformerLM(config)
    return quantize_int8(TransformerLM(config))


def save_model(model, path) -> None:
    """Write ``model`` (a TransformerLM or its int8 twin) to ``path`` (see the module docstring)."""
    if not isinstance(model, (TransformerLM, Int8TransformerLM)):
        raise TypeError(
            f"save_model saves TransformerLM or Int8TransformerLM, got {type(model).__name__}"
        )
    meta = {"format": FORMAT, "version": VERSION, "kind": type(model).__name__,
            "config": model.config.to_dict()}
    arrays = _named_leaves(model.params)
    arrays[META] = np.array(json.dumps(meta))
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".npz", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def load_model(path, *, mesh=None):
    """Read a model written by :func:`save_model`; ``mesh`` as in the model constructors."""
    path = os.fspath(path)
    try:
        archive = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        if isinstance(e, FileNotFoundError):
            raise
        raise ValueError(f"{path!r} is not a jaxrescore model file (not a readable .npz archive)") from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise ValueError(f"{path!r} is not a jaxrescore model file (a bare array, not an .npz archive)")
    with archive as data:
        if META not in data.files:
            raise ValueError(f"{path!r} is not a jaxrescore model file (no {META} entry)")
        meta = json.loads(str(data[META]))
        if meta.get("format") != FORMAT or meta.get("version") != VERSION:
            raise ValueError(
                f"{path!r} has format {meta.get('format')!r} version {meta.get('version')!r}; "
                f"this library reads {FORMAT!r} version {VERSION}"
            )
        kind = meta.get("kind")
        if kind not in ("TransformerLM", "Int8TransformerLM"):
            raise ValueError(f"{path!r} holds an unknown model kind {kind!r}")
        try:
            config = TransformerConfig(**meta["config"])
        except TypeError as e:
            raise ValueError(f"{path!r} has an invalid config {meta['config']!r}: {e}") from None
        stored = {k: data[k] for k in data.files if k != META}
    model = _template(kind, config).with_mesh(mesh)
    flat, treedef = jax.tree_util.tree_flatten_with_path(model.params)
    names = [_leaf_name(p) for p, _ in flat]
    missing = sorted(set(names) - set(stored))
    extra = sorted(set(stored) - set(names))
    if missing or extra:
        raise ValueError(
            f"{path!r} does not match its config: missing weights {missing}, unexpected {extra}"
        )
    leaves = []
    for name, (_, want) in zip(names, flat):
        got = stored[name]
        if got.shape != want.shape or got.dtype != want.dtype:
            raise ValueError(
                f"{path!r}: weight {name!r} has shape {got.shape} dtype {got.dtype}, the config "
                f"needs {want.shape} {want.dtype}"
            )
        leaves.append(got)
    model.params = jax.tree_util.tree_unflatten(treedef, [jax.numpy.asarray(x) for x in leaves])
    return model
