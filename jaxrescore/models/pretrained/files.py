"""Reading a local Hugging Face checkpoint directory: ``config.json``, safetensors weights (one
file, or shards listed by ``model.safetensors.index.json``) and ``tokenizer.json``.

Nothing here downloads: a directory is read where the user keeps it. Tensors are read with
safetensors' numpy API (bfloat16 arrives as ``ml_dtypes.bfloat16``, which JAX reads as is).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

INDEX_FILE = "model.safetensors.index.json"


def _need(module: str):
    try:
        return __import__(module, fromlist=["_"])
    except ImportError:
        raise ImportError(
            f"from_pretrained needs the {module!r} package: pip install {module.split('.')[0]} "
            "(or the hf extra: pip install -e '.[hf]' in a checkout)"
        ) from None


def check_directory(directory: Any) -> str:
    """``directory`` as a path string; TypeError for a non-path, ValueError when it is not a
    directory holding ``config.json`` (a ``.gguf`` file takes another route: see ``model.py``)."""
    if not isinstance(directory, (str, os.PathLike)):
        raise TypeError(
            f"directory must be a path (str or os.PathLike) to a checkpoint folder or a .gguf file, "
            f"got {type(directory).__name__}"
        )
    path = os.fspath(directory)
    if not os.path.isdir(path):
        raise ValueError(
            f"directory={path!r} is not a directory; from_pretrained reads a local checkpoint folder "
            "(config.json, *.safetensors, tokenizer.json) or a local file whose name ends in .gguf, "
            "and downloads nothing"
        )
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise ValueError(f"directory={path!r} has no config.json: not a Hugging Face checkpoint folder")
    return path


def read_config(path: str) -> dict:
    """The parsed ``config.json`` of the checkpoint folder ``path``."""
    with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    if not isinstance(config, dict):
        raise ValueError(f"{path}/config.json must hold a JSON object, got {type(config).__name__}")
    return config


def weight_files(path: str) -> list[str]:
    """The safetensors files of the folder: the shards named by ``model.safetensors.index.json``
    when there is one, else every ``*.safetensors`` file (usually ``model.safetensors``)."""
    index = os.path.join(path, INDEX_FILE)
    if os.path.isfile(index):
        with open(index, encoding="utf-8") as f:
            weight_map = json.load(f).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ValueError(f"{index} has no weight_map")
        files = sorted(set(weight_map.values()))
        missing = [name for name in files if not os.path.isfile(os.path.join(path, name))]
        if missing:
            raise ValueError(f"{index} names shards that are not in {path!r}: {missing[:3]}")
        return [os.path.join(path, name) for name in files]
    files = sorted(name for name in os.listdir(path) if name.endswith(".safetensors"))
    if not files:
        raise ValueError(
            f"{path!r} holds no *.safetensors weights (pytorch_model.bin is not read: convert it "
            "with safetensors, or save the model with safe_serialization=True)"
        )
    return [os.path.join(path, name) for name in files]


class LazyTensors(Mapping):
    """The tensors of the folder's safetensors files by checkpoint key, each read from its file
    when asked for (a numpy array), so loading holds one layer's worth of extra copies, not a
    second whole model.

    Each read opens its file and closes it again: safetensors maps the file into memory, and
    every page a read touches stays resident (counted in the process's RSS) while a mapping is
    open, so handles held for the whole load made its peak the weights plus the whole file."""

    def __init__(self, files: list[str]):
        self._api = _need("safetensors")
        self._files = files
        self._where: dict[str, int] = {}
        for i, name in enumerate(files):
            with self._api.safe_open(name, framework="np") as handle:
                keys = list(handle.keys())
            for key in keys:
                if key in self._where:
                    first = files[self._where[key]]
                    raise ValueError(f"tensor {key!r} appears in two weight files: {first}, {files[i]}")
                self._where[key] = i

    def __getitem__(self, key: str) -> np.ndarray:
        with self._api.safe_open(self._files[self._where[key]], framework="np") as handle:
            return handle.get_tensor(key)

    def __iter__(self):
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)


def read_tensors(path: str) -> LazyTensors:
    """Every tensor of the folder's safetensors files, by checkpoint key (read on access)."""
    return LazyTensors(weight_files(path))


class TensorTable:
    """Checkpoint tensors read by name, with the key prefixes real checkpoints carry removed and
    every shape checked; :meth:`check_used` refuses tensors no name asked for (a checkpoint of
    another architecture must not load as garbage).

    Args:
      tensors: key -> array, as read from the files (read when asked for).
      prefix: the model's own prefix (``"transformer."``, ``"model."``), dropped where present.
      ignored: a regex of keys that are buffers, not weights (GPT-2's causal-mask ``attn.bias``).
    """

    def __init__(self, tensors: Mapping[str, np.ndarray], prefix: str, ignored: str | None = None):
        self._tensors = tensors
        self._keys = {}  # name without the prefix -> checkpoint key
        for key in tensors:
            if ignored is None or not re.search(ignored, key):
                self._keys[key[len(prefix):] if key.startswith(prefix) else key] = key
        self._used: set[str] = set()

    def __contains__(self, key: str) -> bool:
        return key in self._keys

    def get(self, key: str, shape: tuple[int, ...]) -> np.ndarray:
        """The tensor ``key`` (ValueError when absent or not of ``shape``)."""
        if key not in self._keys:
            raise ValueError(f"the checkpoint has no tensor {key!r} (expected shape {shape})")
        value = self._tensors[self._keys[key]]
        if tuple(value.shape) != tuple(shape):
            raise ValueError(
                f"checkpoint tensor {key!r} has shape {tuple(value.shape)}; config.json implies {tuple(shape)}"
            )
        self._used.add(key)
        return value

    def stack(self, keys: list[str], shape: tuple[int, ...], dtype, *, transpose: bool = False,
              columns: slice | None = None) -> np.ndarray:
        """``dtype[L, ...]``: the tensors ``keys`` (each of ``shape``, checked), transposed and
        cut to ``columns`` of the last axis when asked, on a new leading axis. The result is
        allocated once and filled one tensor at a time, so no list of L parts (a second copy of
        the weights) lives beside it."""
        out = None
        for i, key in enumerate(keys):
            part = self.get(key, shape)
            part = part.T if transpose else part
            part = part if columns is None else part[..., columns]
            if out is None:
                out = np.empty((len(keys),) + part.shape, dtype)
            out[i] = part
            del part
        return out

    def output_head(self, vocab_size: int, d_model: int, tied: bool) -> np.ndarray | None:
        """The separate output head ``float[d, V]`` (``lm_head.weight`` transposed), or None for
        a tied one (an ``lm_head.weight`` a tied checkpoint carries anyway is checked, then
        unused: it is the embedding)."""
        if "lm_head.weight" in self:
            head = self.get("lm_head.weight", (vocab_size, d_model))
            return None if tied else head.T
        if not tied:
            raise ValueError("config.json says tie_word_embeddings=false but the checkpoint has no lm_head.weight")
        return None

    def check_used(self, what: str) -> None:
        left = sorted(set(self._keys) - self._used)
        if left:
            raise ValueError(
                f"the checkpoint holds {len(left)} tensors a {what} model does not use, e.g. {left[:4]}: "
                "is config.json's model_type right?"
            )


class HFTokenizer:
    """A ``tokenizers.Tokenizer`` as the model's text codec: ``encode`` adds no special tokens
    (the model feeds its own BOS at position 0, so a Llama tokenizer's ``<s>`` is not doubled),
    ``decode`` keeps them (a result's text shows exactly the tokens scored).

    Attributes:
      tokenizer: the ``tokenizers.Tokenizer``.
    """

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)

    def __repr__(self) -> str:
        return f"HFTokenizer(vocab_size={self.tokenizer.get_vocab_size()})"


def read_tokenizer(path: str) -> HFTokenizer | None:
    """The folder's ``tokenizer.json`` as an :class:`HFTokenizer`, or None without one."""
    name = os.path.join(path, "tokenizer.json")
    if not os.path.isfile(name):
        return None
    tokenizers = _need("tokenizers")
    return HFTokenizer(tokenizers.Tokenizer.from_file(name))


def as_dtype(value: np.ndarray, dtype) -> np.ndarray:
    """``value`` cast on the host to ``dtype`` (a numpy or ml_dtypes dtype), C-contiguous."""
    return np.ascontiguousarray(np.asarray(value).astype(dtype, copy=False))
