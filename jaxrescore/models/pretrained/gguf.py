"""Reading a GGUF file (llama.cpp's one-file checkpoint) as the config and tensors the GPT-2 and
Llama families build a network from.

A GGUF file is a header (``GGUF``, version 2 or 3, metadata ``key -> value``, one info record per
tensor: name, shape innermost dimension first, ggml type, offset) followed by the aligned tensor
data. :class:`GGUFFile` parses the header itself (a loop over ~100k vocabulary strings, over
20x faster than ``gguf.GGUFReader``'s) and maps the data; tensor payloads are dequantised on the
host with ``gguf.quants.dequantize`` (llama.cpp's own Python package), one tensor when asked.

What :func:`config_of` and :func:`tensors_of` produce is what ``config.json`` and the safetensors
files of the same model would give, so ``llama.spec_of`` / ``llama.params_of`` (and GPT-2's) build
the very ``DecoderSpec`` and weights a Hugging Face folder builds:

- names: ``token_embd``, ``blk.{i}.attn_q`` ... to ``model.embed_tokens``,
  ``model.layers.{i}.self_attn.q_proj`` ... (Llama, Qwen2) or ``wte``, ``h.{i}.attn.c_attn`` ...
  (GPT-2); shapes: ggml lists ``[in, out]`` innermost first, which is numpy's ``[out, in]``, a
  torch Linear's layout; GPT-2's Conv1D weights, which llama.cpp's converter transposed, are
  transposed back to ``[in, out]``;
- llama.cpp's converter permutes the rows of ``q_proj`` and ``k_proj`` (weights and biases) of
  the ``llama`` architecture from Hugging Face's ``rotate_half`` layout (a head's first half of
  dimensions, then its second) to interleaved pairs (its ``rope`` rotates adjacent dimensions);
  :func:`unpermute_rows` undoes it. ``qwen2`` files keep the ``rotate_half`` layout (llama.cpp runs
  them with NeoX rotary);
- ``output.weight`` absent means a tied head; an ``output.weight`` byte-identical to
  ``token_embd.weight`` (GPT-2 files carry the copy) is tied too;
- Llama 3.1/3.2 files store their rotary scaling as ``rope_freqs.weight`` (one divisor per
  frequency): read back as the ``llama3`` ``rope_scaling`` whose divisors equal them.

Anything the forward would ignore while it changes the numbers is refused with a ValueError naming
it: another architecture, a tensor type ``gguf.quants`` cannot dequantise, an ``{arch}.*`` key
this reader does not interpret (yarn or longrope scaling, logit soft-capping, experts, ...), a
tensor no weight takes. The tokenizer the metadata describes is rebuilt by
:mod:`jaxrescore.models.pretrained.gguf_tokenizer`.
"""

from __future__ import annotations

import math
import mmap
import os
import struct
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np

from jaxrescore.models.pretrained.files import _need

ARCHITECTURES = ("llama", "qwen2", "gpt2")
# Float types and the quantised ones gguf.quants dequantises (llama.cpp's K-quants included).
TENSOR_TYPES = (
    "F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
)
MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

# Metadata value types (GGUF spec): struct formats of the scalars; 8 is a string, 9 an array.
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9

# The {arch}.* keys whose meaning this reader implements (any other one is refused).
_KEYS = {
    "llama": {
        "context_length", "embedding_length", "block_count", "feed_forward_length", "vocab_size",
        "attention.head_count", "attention.head_count_kv", "attention.layer_norm_rms_epsilon",
        "attention.key_length", "attention.value_length", "rope.freq_base", "rope.dimension_count",
        "rope.scaling.type", "rope.scaling.factor", "rope.scaling.original_context_length",
        "rope.scaling.finetuned", "expert_count", "expert_used_count", "tensor_data_layout",
    },
    "gpt2": {
        "context_length", "embedding_length", "block_count", "feed_forward_length", "vocab_size",
        "attention.head_count", "attention.head_count_kv", "attention.layer_norm_epsilon",
    },
}
_KEYS["qwen2"] = _KEYS["llama"]


class TensorInfo(NamedTuple):
    """One tensor record of the header: ``shape`` in numpy order (outermost first), ``start`` the
    absolute byte offset of its data, ``nbytes`` its size on disk."""

    name: str
    type_name: str
    shape: tuple[int, ...]
    start: int
    nbytes: int


class _Truncated(Exception):
    pass


class _Cursor:
    """Reads little-endian header values from a buffer, raising ``_Truncated`` past its end."""

    def __init__(self, buf):
        self.buf, self.pos, self.size = buf, 0, len(buf)

    def take(self, n: int) -> int:
        start = self.pos
        if n < 0 or start + n > self.size:
            raise _Truncated
        self.pos = start + n
        return start

    def scalar(self, fmt: str):
        return struct.unpack_from(fmt, self.buf, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        n = self.scalar("<Q")
        start = self.take(n)
        return bytes(self.buf[start : start + n]).decode("utf-8")

    def value(self, vtype: int):
        if vtype == 6:  # float32: its shortest decimal, the config value it was written from (1e-05)
            return float(str(np.float32(self.scalar("<f"))))
        if vtype in _SCALARS:
            return self.scalar(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            itype, n = self.scalar("<I"), self.scalar("<Q")
            if itype in _SCALARS:  # numbers in one read, not one struct call each
                dtype = np.dtype(_SCALARS[itype].replace("?", "u1"))
                start = self.take(n * dtype.itemsize)
                values = np.frombuffer(self.buf, dtype, count=n, offset=start)
                return (values.astype(bool) if itype == 7 else values).tolist()
            if n * 8 > self.size - self.pos:  # every element needs 8 bytes at least
                raise _Truncated
            return [self.value(itype) for _ in range(n)]
        raise ValueError(f"unknown GGUF metadata value type {vtype}")


class GGUFFile:
    """An opened GGUF file: its metadata and tensor records, and each tensor dequantised on
    request (the data stays memory-mapped, read only where asked for).

    Args:
      path: the ``.gguf`` file (ValueError when it is not a readable, complete GGUF file).

    Attributes:
      path: the file's path.
      version: the GGUF version (2 or 3).
      metadata: every key -> value (arrays as lists, e.g. ``tokenizer.ggml.tokens``).
      tensors: tensor name -> :class:`TensorInfo`, in file order.
      architecture: ``general.architecture``.
    """

    def __init__(self, path: str):
        self.path = path
        gguf = _need("gguf")
        size = os.path.getsize(path)
        if size < 24:
            raise ValueError(f"{path!r} is {size} bytes long: not a GGUF file (truncated?)")
        with open(path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        if self._map[:4] != MAGIC:
            raise ValueError(f"{path!r} does not start with the GGUF magic bytes: not a GGUF file")
        try:
            self._read_header(_Cursor(self._map), gguf)
        except (_Truncated, struct.error):
            raise ValueError(
                f"{path!r} ends inside its GGUF header ({size} bytes): the file is truncated "
                "(an interrupted download?)"
            ) from None
        except UnicodeDecodeError:
            raise ValueError(f"{path!r}: a GGUF header string is not UTF-8: the file is corrupt") from None
        end = max((t.start + t.nbytes for t in self.tensors.values()), default=0)
        if end > size:
            raise ValueError(
                f"{path!r} is {size} bytes long but its tensors end at byte {end}: the file is "
                "truncated (an interrupted download?)"
            )
        self.architecture = self.metadata.get("general.architecture")

    def _read_header(self, cur: _Cursor, gguf) -> None:
        cur.take(4)
        version = cur.scalar("<I")
        if version & 0xFFFF == 0:
            raise ValueError(f"{self.path!r} is a big-endian GGUF file; only little-endian files are read")
        if version not in (2, 3):
            raise ValueError(f"{self.path!r} is GGUF version {version}; versions 2 and 3 are read")
        self.version = version
        n_tensors, n_keys = cur.scalar("<Q"), cur.scalar("<Q")
        self.metadata: dict[str, Any] = {}
        for _ in range(n_keys):
            key = cur.string()
            if key in self.metadata:
                raise ValueError(f"{self.path!r}: the GGUF metadata holds {key!r} twice: the file is corrupt")
            vtype = cur.scalar("<I")
            try:
                self.metadata[key] = cur.value(vtype)
            except ValueError as e:
                raise ValueError(f"{self.path!r}: metadata {key!r}: {e}: the file is corrupt") from None
        records = []
        for _ in range(n_tensors):
            name = cur.string()
            n_dims = cur.scalar("<I")
            if n_dims > 8:
                raise ValueError(f"{self.path!r}: tensor {name!r} has {n_dims} dimensions: the file is corrupt")
            dims = [cur.scalar("<Q") for _ in range(n_dims)]
            records.append((name, tuple(reversed(dims)), cur.scalar("<I"), cur.scalar("<Q")))
        align = self.metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if not isinstance(align, int) or align <= 0 or align & (align - 1):
            raise ValueError(f"{self.path!r}: general.alignment={align!r} is not a power of two")
        data_start = -(-cur.pos // align) * align
        self.tensors: dict[str, TensorInfo] = {}
        for name, shape, code, offset in records:
            try:
                kind = gguf.GGMLQuantizationType(code)
            except ValueError:
                raise ValueError(f"{self.path!r}: tensor {name!r} has unknown ggml type {code}") from None
            if name in self.tensors:
                raise ValueError(f"{self.path!r} holds tensor {name!r} twice")
            block, type_size = gguf.GGML_QUANT_SIZES[kind]
            if shape and shape[-1] % block:
                raise ValueError(f"{self.path!r}: tensor {name!r} of shape {shape} does not split into {kind.name} blocks")
            nbytes = math.prod(shape) // block * type_size
            self.tensors[name] = TensorInfo(name, kind.name, shape, data_start + offset, nbytes)

    def array(self, name: str) -> np.ndarray:
        """``float32`` of the tensor's numpy shape, dequantised (a copy: it outlives the file)."""
        gguf = _need("gguf")
        info = self.tensors[name]
        if info.type_name not in TENSOR_TYPES:
            raise ValueError(
                f"{self.path!r}: tensor {name!r} has ggml type {info.type_name}; supported: {TENSOR_TYPES}"
            )
        raw = np.frombuffer(self._map, np.uint8, count=info.nbytes, offset=info.start)
        if info.type_name == "F32":
            return raw.view("<f4").reshape(info.shape).copy()
        if info.type_name == "F16":
            return raw.view("<f2").reshape(info.shape).astype(np.float32)
        kind = gguf.GGMLQuantizationType[info.type_name]
        rows = raw.reshape(*info.shape[:-1], -1)  # each row's blocks, as gguf.quants reads them
        return np.asarray(gguf.quants.dequantize(rows, kind), np.float32).reshape(info.shape)

    def same_bytes(self, a: str, b: str) -> bool:
        """Whether tensors ``a`` and ``b`` are stored identically (type, shape and payload)."""
        ta, tb = self.tensors[a], self.tensors[b]
        if (ta.type_name, ta.shape) != (tb.type_name, tb.shape):
            return False
        chunk = 1 << 24  # compared a slice at a time: no second copy of an embedding table
        for i in range(0, ta.nbytes, chunk):
            n = min(chunk, ta.nbytes - i)
            if self._map[ta.start + i : ta.start + i + n] != self._map[tb.start + i : tb.start + i + n]:
                return False
        return True

    def scalars(self) -> dict:
        """The metadata without its arrays (the vocabulary, merges, ...): what ``config`` holds."""
        return {k: v for k, v in self.metadata.items() if not isinstance(v, list)}

    def close(self) -> None:
        try:
            self._map.close()
        except BufferError:  # a caller still holds a view: the map closes when it is dropped
            pass

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_gguf(path: str) -> GGUFFile:
    """The GGUF file at ``path`` (ValueError when it is not a file, or not a complete GGUF file)."""
    if not os.path.isfile(path):
        raise ValueError(f"{path!r} is not a file; from_pretrained reads a local .gguf file and downloads nothing")
    return GGUFFile(path)


# ---- hyperparameters -------------------------------------------------------------------------


def _hp(g: GGUFFile, key: str, default: Any = None, kind: type = int):
    """``{arch}.{key}`` as a scalar of ``kind`` (ValueError when absent without a default, or when
    it is a per-layer array, which the network cannot run)."""
    full = f"{g.architecture}.{key}"
    value = g.metadata.get(full, default)
    if value is None:
        raise ValueError(f"{g.path!r}: the GGUF metadata has no {full!r}")
    if isinstance(value, (list, str)) or (isinstance(value, float) and kind is int):
        raise ValueError(f"{g.path!r}: {full}={value!r}; a single number is supported")
    return kind(value)


def _check_keys(g: GGUFFile) -> None:
    arch = g.architecture
    known = _KEYS[arch]
    unknown = sorted(k for k in g.metadata if k.startswith(arch + ".") and k[len(arch) + 1 :] not in known)
    if unknown:
        raise ValueError(
            f"{g.path!r}: the GGUF metadata has {unknown[:4]}, which from_pretrained does not implement "
            f"(it would change the numbers); it reads {sorted(known)}"
        )
    if int(g.metadata.get("split.count", 1)) > 1:
        raise ValueError(
            f"{g.path!r} is one part of a split GGUF ({g.metadata['split.count']} files): merge them "
            "first (llama.cpp's gguf-split --merge)"
        )


def _rope_scaling(g: GGUFFile, head_dim: int, theta: float) -> dict | None:
    kind = g.metadata.get(f"{g.architecture}.rope.scaling.type", "none")
    if "rope_freqs.weight" in g.tensors:
        if kind != "none":
            raise ValueError(f"{g.path!r} has rope_freqs.weight and rope.scaling.type={kind!r}; one is read, not both")
        return _llama3_scaling(g, head_dim, theta)
    if kind == "none":
        return None
    if kind == "linear":
        return {"type": "linear", "factor": _hp(g, "rope.scaling.factor", kind=float)}
    raise ValueError(
        f"{g.path!r}: {g.architecture}.rope.scaling.type={kind!r} is not supported; supported: 'none', "
        "'linear' (and Llama 3's scaling stored as rope_freqs.weight)"
    )


def _llama3_scaling(g: GGUFFile, head_dim: int, theta: float) -> dict | None:
    """The ``llama3`` rope_scaling whose divisors are the file's ``rope_freqs.weight``.

    llama.cpp's converter computes them from the config's ``factor``, ``low_freq_factor``,
    ``high_freq_factor`` and ``original_max_position_embeddings``; every Llama 3.1/3.2 release
    uses 1, 4 and 8192 for the last three (only ``factor`` differs: 8 or 32), and the largest
    divisor is ``factor``. Those values are tried and kept only if they give back every divisor.
    """
    factors = g.array("rope_freqs.weight").astype(np.float64).reshape(-1)
    if factors.shape != (head_dim // 2,):
        raise ValueError(f"{g.path!r}: rope_freqs.weight has {factors.size} values; head_dim/2 = {head_dim // 2}")
    if np.all(factors == 1.0):
        return None
    old = float(g.metadata.get(f"{g.architecture}.rope.scaling.original_context_length", 8192))
    scaling = {"rope_type": "llama3", "factor": float(factors.max()), "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": old}
    inv = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen = 2 * math.pi / inv
    smooth = (old / wavelen - 1.0) / 3.0
    expect = np.where(wavelen < old / 4.0, 1.0, np.where(
        wavelen > old, scaling["factor"], 1.0 / ((1 - smooth) / scaling["factor"] + smooth)))
    if not np.allclose(factors, expect, rtol=1e-4, atol=0.0):
        raise ValueError(
            f"{g.path!r}: rope_freqs.weight is not Llama 3's rotary scaling with low_freq_factor=1, "
            f"high_freq_factor=4, original_max_position_embeddings={old:.0f}; other frequency "
            "divisors are not supported"
        )
    return scaling


def config_of(g: GGUFFile) -> dict:
    """The ``config.json`` of the same model, from the GGUF metadata: what ``spec_of`` of the
    family reads (``model_type`` ``"llama"``, ``"qwen2"`` or ``"gpt2"``), plus ``bos_token_id`` /
    ``eos_token_id`` from ``tokenizer.ggml.*`` and ``torch_dtype`` from ``general.file_type``
    (float16 or bfloat16 files; float32 otherwise)."""
    arch = g.architecture
    if arch not in ARCHITECTURES:
        raise ValueError(
            f"{g.path!r}: general.architecture={arch!r} is not supported; from_pretrained reads GGUF "
            f"architectures {list(ARCHITECTURES)}"
        )
    _check_keys(g)
    if _hp(g, "expert_count", 0) or _hp(g, "expert_used_count", 0):
        raise ValueError(f"{g.path!r}: a mixture of experts ({arch}.expert_count) is not supported")
    d, heads = _hp(g, "embedding_length"), _hp(g, "attention.head_count")
    kv = _hp(g, "attention.head_count_kv", heads)
    tokens = g.metadata.get("tokenizer.ggml.tokens")
    embed = g.tensors.get("token_embd.weight")
    rows = len(tokens) if isinstance(tokens, list) else embed.shape[0] if embed and embed.shape else None
    vocab = _hp(g, "vocab_size", rows)
    config: dict[str, Any] = {
        "model_type": arch,
        "vocab_size": vocab,
        "bos_token_id": g.metadata.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": g.metadata.get("tokenizer.ggml.eos_token_id"),
        "torch_dtype": {1: "float16", 32: "bfloat16"}.get(g.metadata.get("general.file_type"), "float32"),
    }
    if arch == "gpt2":
        if kv != heads:
            raise ValueError(f"{g.path!r}: gpt2.attention.head_count_kv={kv} differs from head_count={heads}")
        config.update({
            "n_embd": d, "n_head": heads, "n_layer": _hp(g, "block_count"),
            "n_positions": _hp(g, "context_length"), "n_inner": _hp(g, "feed_forward_length"),
            "layer_norm_epsilon": _hp(g, "attention.layer_norm_epsilon", kind=float),
            "activation_function": "gelu_new", "tie_word_embeddings": _tied(g),
        })
        return config
    head_dim = _hp(g, "attention.key_length", d // heads)
    if _hp(g, "attention.value_length", head_dim) != head_dim:
        raise ValueError(f"{g.path!r}: {arch}.attention.value_length differs from key_length: not supported")
    if _hp(g, "rope.dimension_count", head_dim) != head_dim:
        raise ValueError(
            f"{g.path!r}: {arch}.rope.dimension_count={_hp(g, 'rope.dimension_count')} rotates part of a "
            f"head of {head_dim} dimensions; only full rotary is supported"
        )
    theta = _hp(g, "rope.freq_base", 10000.0, kind=float)
    config.update({
        "hidden_size": d, "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": head_dim,
        "num_hidden_layers": _hp(g, "block_count"), "intermediate_size": _hp(g, "feed_forward_length"),
        "max_position_embeddings": _hp(g, "context_length"),
        "rms_norm_eps": _hp(g, "attention.layer_norm_rms_epsilon", kind=float),
        "rope_theta": theta, "rope_scaling": _rope_scaling(g, head_dim, theta), "hidden_act": "silu",
        "tie_word_embeddings": _tied(g),
    })
    return config


def _tied(g: GGUFFile) -> bool:
    return "output.weight" not in g.tensors or g.same_bytes("output.weight", "token_embd.weight")


# ---- tensors ---------------------------------------------------------------------------------


def unpermute_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's row permutation of a ``q_proj``/``k_proj`` weight ``float[H*Dh, d]`` (or
    bias ``float[H*Dh]``) with ``n_heads`` heads: its converter reshapes each head's rows as
    ``[2, Dh/2]`` (the two halves ``rotate_half`` pairs) and swaps to ``[Dh/2, 2]`` (pairs
    adjacent); this swaps back."""
    rows = w.shape[0]
    if rows % (2 * n_heads):
        raise ValueError(f"{rows} rows do not split into {n_heads} heads of an even width")
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# GGUF name -> (Hugging Face name, transform); "{i}" is the layer. Transforms: "T" transposes,
# "q"/"k" undo the row permutation with the query / key-value head count.
_LLAMA_NAMES = {
    "token_embd.weight": ("model.embed_tokens.weight", None),
    "output_norm.weight": ("model.norm.weight", None),
    "output.weight": ("lm_head.weight", None),
    "blk.{i}.attn_norm.weight": ("model.layers.{i}.input_layernorm.weight", None),
    "blk.{i}.ffn_norm.weight": ("model.layers.{i}.post_attention_layernorm.weight", None),
    "blk.{i}.attn_q.weight": ("model.layers.{i}.self_attn.q_proj.weight", "q"),
    "blk.{i}.attn_q.bias": ("model.layers.{i}.self_attn.q_proj.bias", "q"),
    "blk.{i}.attn_k.weight": ("model.layers.{i}.self_attn.k_proj.weight", "k"),
    "blk.{i}.attn_k.bias": ("model.layers.{i}.self_attn.k_proj.bias", "k"),
    "blk.{i}.attn_v.weight": ("model.layers.{i}.self_attn.v_proj.weight", None),
    "blk.{i}.attn_v.bias": ("model.layers.{i}.self_attn.v_proj.bias", None),
    "blk.{i}.attn_output.weight": ("model.layers.{i}.self_attn.o_proj.weight", None),
    "blk.{i}.attn_output.bias": ("model.layers.{i}.self_attn.o_proj.bias", None),
    "blk.{i}.ffn_gate.weight": ("model.layers.{i}.mlp.gate_proj.weight", None),
    "blk.{i}.ffn_gate.bias": ("model.layers.{i}.mlp.gate_proj.bias", None),
    "blk.{i}.ffn_up.weight": ("model.layers.{i}.mlp.up_proj.weight", None),
    "blk.{i}.ffn_up.bias": ("model.layers.{i}.mlp.up_proj.bias", None),
    "blk.{i}.ffn_down.weight": ("model.layers.{i}.mlp.down_proj.weight", None),
    "blk.{i}.ffn_down.bias": ("model.layers.{i}.mlp.down_proj.bias", None),
    # a rotary buffer some old files carry: the frequencies come from rope.freq_base
    "blk.{i}.attn_rot_embd": ("model.layers.{i}.self_attn.rotary_emb.inv_freq", None),
}
_GPT2_NAMES = {
    "token_embd.weight": ("wte.weight", None),
    "position_embd.weight": ("wpe.weight", None),
    "output_norm.weight": ("ln_f.weight", None),
    "output_norm.bias": ("ln_f.bias", None),
    "output.weight": ("lm_head.weight", None),
    "blk.{i}.attn_norm.weight": ("h.{i}.ln_1.weight", None),
    "blk.{i}.attn_norm.bias": ("h.{i}.ln_1.bias", None),
    "blk.{i}.attn_qkv.weight": ("h.{i}.attn.c_attn.weight", "T"),
    "blk.{i}.attn_qkv.bias": ("h.{i}.attn.c_attn.bias", None),
    "blk.{i}.attn_output.weight": ("h.{i}.attn.c_proj.weight", "T"),
    "blk.{i}.attn_output.bias": ("h.{i}.attn.c_proj.bias", None),
    "blk.{i}.ffn_norm.weight": ("h.{i}.ln_2.weight", None),
    "blk.{i}.ffn_norm.bias": ("h.{i}.ln_2.bias", None),
    "blk.{i}.ffn_up.weight": ("h.{i}.mlp.c_fc.weight", "T"),
    "blk.{i}.ffn_up.bias": ("h.{i}.mlp.c_fc.bias", None),
    "blk.{i}.ffn_down.weight": ("h.{i}.mlp.c_proj.weight", "T"),
    "blk.{i}.ffn_down.bias": ("h.{i}.mlp.c_proj.bias", None),
}


class GGUFTensors(Mapping):
    """The file's tensors under their Hugging Face names, each read and dequantised (float32,
    Hugging Face layout) when asked for: what ``params_of`` of the family reads."""

    def __init__(self, g: GGUFFile, sources: dict[str, tuple[str, Callable | None]]):
        self._g, self._sources = g, sources

    def __getitem__(self, key: str) -> np.ndarray:
        name, transform = self._sources[key]
        value = self._g.array(name)
        return value if transform is None else np.ascontiguousarray(transform(value))

    def __iter__(self):
        return iter(self._sources)

    def __len__(self) -> int:
        return len(self._sources)


def tensors_of(g: GGUFFile, config: dict) -> GGUFTensors:
    """The file's tensors as the family's ``params_of`` reads them (see the module docstring);
    ValueError for a tensor no weight takes or of a type that cannot be dequantised."""
    arch = config["model_type"]
    table = _GPT2_NAMES if arch == "gpt2" else _LLAMA_NAMES
    n_layers = config["n_layer"] if arch == "gpt2" else config["num_hidden_layers"]
    if arch == "llama":  # only the llama architecture was permuted (see unpermute_rows)
        heads = {"q": config["num_attention_heads"], "k": config["num_key_value_heads"]}
    else:
        heads = {"q": None, "k": None}
    transforms = {
        None: None, "T": lambda w: w.T,
        "q": None if heads["q"] is None else (lambda w: unpermute_rows(w, heads["q"])),
        "k": None if heads["k"] is None else (lambda w: unpermute_rows(w, heads["k"])),
    }
    names = {}
    for pattern, (hf, how) in table.items():
        for i in range(n_layers) if "{i}" in pattern else (0,):
            names[pattern.format(i=i)] = (hf.format(i=i), transforms[how])
    for name, info in g.tensors.items():
        if info.type_name not in TENSOR_TYPES:
            raise ValueError(
                f"{g.path!r}: tensor {name!r} has ggml type {info.type_name}; from_pretrained "
                f"dequantises {list(TENSOR_TYPES)}"
            )
    sources, unused = {}, []
    for name in g.tensors:
        if name == "rope_freqs.weight":  # read into config_of's rope_scaling
            continue
        if name == "output.weight" and config["tie_word_embeddings"]:  # token_embd's copy
            continue
        if name not in names:
            unused.append(name)
            continue
        hf, transform = names[name]
        sources[hf] = (name, transform)
    if unused:
        raise ValueError(
            f"{g.path!r} holds {len(unused)} tensors a {arch} network does not use, e.g. {unused[:4]}: "
            "they would be ignored, changing the numbers"
        )
    return GGUFTensors(g, sources)
