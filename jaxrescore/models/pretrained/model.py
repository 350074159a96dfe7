"""from_pretrained: a local Hugging Face checkpoint folder, or a GGUF file, as a JAX model with the
full interface.

``from_pretrained(directory)`` reads ``config.json``, the safetensors weights and
``tokenizer.json`` of a GPT-2-family or Llama-family checkpoint and returns a
:class:`PretrainedLM`: a :class:`~jaxrescore.models.JaxLM` (teacher-forcing scores, frontier
statistics, ``next_logprobs``, prompts, meshes with replicated or split weights, bf16) whose
incremental forward keeps key/value caches (the prompt's held once, each row its own positions;
see :mod:`jaxrescore.models.decoding`), whose int8 twin is ``quantize_int8(model)``, and which
reads and writes text with the checkpoint's tokenizer (``model.with_prompt("some text")``,
``result.texts``).

``from_pretrained("model.gguf")`` reads llama.cpp's one-file format instead (architectures
``llama``, ``qwen2``, ``gpt2``; float, 8-, 5- and 4-bit and K-quant tensors dequantised on the host
to ``dtype``; the tokenizer rebuilt from the metadata): the same network as the Hugging Face folder
the file was converted from (see :mod:`jaxrescore.models.pretrained.gguf` and
:mod:`~jaxrescore.models.pretrained.gguf_tokenizer`).

Sequences and BOS. A sequence is the tokens AFTER a conditioning first position that the model
feeds itself (``bos_id``, never part of a sequence or a prompt) and ends with ``eos``:

- GPT-2 family: position 0 is ``<|endoftext|>`` (config ``bos_token_id``, 50256), as Hugging Face
  ``generate`` starts unconditional text, and ``eos`` is the same token: a sequence is one
  document, ``"Hello world<|endoftext|>"``;
- Llama family: position 0 is ``bos_token_id`` (``<s>``, ``<|begin_of_text|>``), as its tokenizer
  prepends it; ``eos`` is ``eos_token_id`` (the first one when the config lists several, e.g.
  Llama 3's ``[128001, 128008, 128009]``: pass ``eos=`` to pick another). A config without a BOS
  id (some Qwen configs) conditions on its eos id.
- GGUF files: ``tokenizer.ggml.bos_token_id`` and ``eos_token_id``. Position 0 is fed even when
  ``tokenizer.ggml.add_bos_token`` is false (SmolLM2, Qwen2: llama.cpp then starts without it),
  as it is for the same model's folder: pass ``bos_id=`` another id to condition on that.

The tokenizer encodes text WITHOUT special tokens (the BOS above is the model's, so it is never
doubled) and decodes with them (a result's text shows exactly what was scored, its final eos
left out). Nothing here downloads: the folder or file is where the user keeps the checkpoint
(e.g. one written by ``huggingface-cli download gpt2 --local-dir ./gpt2`` or ``save_pretrained``).
"""

from __future__ import annotations

import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from jaxrescore.models.base import check_int
from jaxrescore.models.decoding import Decoder
from jaxrescore.models.scores import BFLOAT16_TOLERANCE, FLOAT32_TOLERANCE
from jaxrescore.models.int8 import _quantize, dequantize
from jaxrescore.models.jax_lm import JaxLM
from jaxrescore.models.mesh import check_mesh, to_host
from jaxrescore.models.pretrained import gpt2, llama
from jaxrescore.models.pretrained.files import check_directory, read_config, read_tensors, read_tokenizer
from jaxrescore.models.pretrained.gguf import config_of, open_gguf, tensors_of
from jaxrescore.models.pretrained.gguf_tokenizer import tokenizer_from_metadata
from jaxrescore.models.pretrained.network import (
    DecoderSpec,
    NetworkApply,
    NetworkDecode,
    NetworkPacked,
    empty_context,
)
from jaxrescore.models.packed import PackedFrontier
from jaxrescore.models.transformer import FLOAT_DTYPES, _float_dtype_name

# model_type in config.json -> the family module that reads it.
FAMILY_OF = {"gpt2": gpt2, "llama": llama, "mistral": llama, "qwen2": llama}


class _FromConfig:
    def __repr__(self) -> str:
        return "<from config.json>"


FROM_CONFIG: Any = _FromConfig()

# The int8 twin quantises these weights (matrices: per output column; tables: per row).
_MATRICES = ("q", "k", "v", "o", "gate", "up", "down")


class PretrainedLM(PackedFrontier, JaxLM):
    """A GPT-2- or Llama-family network as an enumerable model (build with
    :func:`from_pretrained`; see the module docstring).

    Attributes:
      spec: the :class:`~jaxrescore.models.pretrained.network.DecoderSpec` (family, widths, dtype).
      params: the weights dict (see :mod:`jaxrescore.models.pretrained.network`).
      config: the checkpoint's ``config.json`` as a dict (for a GGUF file: its metadata's
        scalars, e.g. ``general.architecture``, ``llama.context_length``).
      directory: the folder (or GGUF file) it was read from.
      tokenizer: the checkpoint's tokenizer (an ``HFTokenizer``) or None.
    """

    def __init__(
        self,
        spec: DecoderSpec,
        params: dict,
        *,
        eos: int | None,
        bos_id: int,
        max_len: int,
        mesh: Mesh | None = None,
        quantized: bool = False,
        config: dict | None = None,
        directory: str | None = None,
    ):
        prepare = dequantize if quantized else None
        super().__init__(
            NetworkApply(spec, prepare), params, vocab_size=spec.vocab_size, eos=eos, max_len=max_len,
            bos_id=bos_id, mesh=mesh,
        )
        self.spec = spec
        self.quantized = quantized
        self.trainable = not quantized
        self.config = dict(config or {})
        self.directory = directory

    def __repr__(self) -> str:
        s = self.spec
        kind = f"{s.family}{' int8' if self.quantized else ''}"
        return (
            f"PretrainedLM({kind}, V={s.vocab_size}, d_model={s.d_model}, n_layers={s.n_layers}, "
            f"max_len={self.max_len}, eos={self.eos}, dtype={s.dtype})"
        )

    @property
    def score_tolerance(self) -> float:
        """Nats a score may move between forwards: 1e-3 in float32, 0.1 in a 16-bit dtype (see
        :mod:`jaxrescore.models.scores`)."""
        return BFLOAT16_TOLERANCE if jnp.dtype(self.spec.dtype).itemsize < 4 else FLOAT32_TOLERANCE

    @property
    def n_params(self) -> int:
        return int(sum(np.size(x) for x in jax.tree.leaves(self.params)))

    def decoder(self) -> Decoder:
        """The incremental forward (shared context cache, per-row caches of the row's own
        positions) used by :class:`~jaxrescore.models.decoding.DecodingSession`."""
        held = self.__dict__.get("_decoder")
        prepare = self._prepare()
        if held is None or held[0] is not self.apply or held[1] is not prepare:
            spec = self.spec
            dec = Decoder(NetworkDecode(spec, prepare), lambda: empty_context(spec), prefix_reuse=True,
                          zeros_fresh=True)
            held = (self.apply, prepare, dec)
            self._decoder = held
        return held[2]

    def _holds_float(self) -> bool:
        """Whether the calls read float32 weights dequantised once and held (see
        :meth:`_device_params`): the int8 twin's, on CPU, off a mesh."""
        return self.quantized and self.mesh is None and jax.default_backend() == "cpu"

    def _prepare(self):
        """What the decoder and the packed forward apply to :meth:`_device_params` inside the jit:
        nothing where those are float32 already (held dequantised): the twin's calls are then the
        float target's own programs, and a shape one of them compiled is not compiled again for
        the other (~0.9 s a program for SmolLM2-135M); else ``dequantize``."""
        return None if self._holds_float() else self.apply.prepare

    def _device_params(self):
        """The weights a call reads. The int8 twin's on CPU are dequantised once and held (float32
        next to the int8): XLA's CPU backend has no int8 matmul, and dequantising inside every
        call made each of SmolLM2-135M's draft calls ~5x slower than the float target's (43 s
        against 8 s for the same 26-call best-first, measured); elsewhere they stay int8 and
        are dequantised inside the jit."""
        if not self._holds_float():
            return super()._device_params()
        held = self.__dict__.get("_dequantized")
        if held is None or held[0] is not self.params:
            held = (self.params, jax.jit(dequantize)(self.params))
            self._dequantized = held
        return held[1]

    def packed_forward(self) -> NetworkPacked:
        """The packed forward of full forwards (see :mod:`jaxrescore.models.packed`)."""
        return NetworkPacked(self.spec, self._prepare())

    def int8_twin(self, *, activations: str = "int8") -> PretrainedLM:
        """The weight-only int8 twin (what :func:`~jaxrescore.models.quantize_int8` returns for
        this model): every projection matrix int8 with one float32 scale per output column and
        layer, the embedding (and an untied head) per row/column; norms, biases and GPT-2's
        position table stay as they are. Off CPU the weights are dequantised inside the jit, so
        the twin stores ~4x less; on CPU once, and held (see ``_device_params``). It runs the
        float network (``activations`` is accepted for ``quantize_int8``'s signature; integer
        matmuls are the TransformerLM twin's)."""
        if self.quantized:
            raise TypeError("this model is already an int8 twin")
        p = jax.tree.map(to_host, self.params)
        q = dict(p)
        q["embed"] = _quantize(p["embed"], -1)
        if "head" in p:
            q["head"] = _quantize(p["head"], -2)
        q["layers"] = {k: _quantize(v, -2) if k in _MATRICES else v for k, v in p["layers"].items()}
        q = jax.tree.map(jnp.asarray, q)
        twin = PretrainedLM(
            self.spec, q, eos=self.eos, bos_id=self.bos_id, max_len=self.max_len, mesh=self.mesh,
            quantized=True, config=self.config, directory=self.directory,
        )
        twin.shard_params = self.shard_params
        twin.tokenizer = self.tokenizer
        return twin


def _dtype_name(dtype, config: dict) -> str:
    if dtype is None:
        return "float32"
    if isinstance(dtype, str) and dtype == "auto":
        stored = config.get("torch_dtype") or config.get("dtype")
        return stored if stored in FLOAT_DTYPES else "float32"
    return _float_dtype_name(dtype, "dtype")


def _token_id(value, name: str) -> int | None:
    """A config token id (an int, a list of ints: the first, or null)."""
    if isinstance(value, list):
        value = value[0] if value else None
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"config.json: {name} must be an integer or a list of integers, got {value!r}")
    return value


def _is_gguf(directory: Any) -> bool:
    if not isinstance(directory, (str, os.PathLike)):
        return False
    path = os.fspath(directory)
    return isinstance(path, str) and path.lower().endswith(".gguf") and not os.path.isdir(path)


def from_pretrained(
    directory: Any,
    *,
    dtype: Any = None,
    mesh: Mesh | None = None,
    shard_params: bool = False,
    max_len: int | None = None,
    eos: Any = FROM_CONFIG,
    bos_id: Any = FROM_CONFIG,
    tokenizer: Any = True,
) -> PretrainedLM:
    """Load a local Hugging Face checkpoint folder, or a GGUF file, of the GPT-2 or Llama family
    (see the module docstring for what a sequence is and where BOS comes from).

    Args:
      directory: the folder holding ``config.json``, ``model.safetensors`` (or shards listed by
        ``model.safetensors.index.json``) and, optionally, ``tokenizer.json``: ``model_type``
        ``gpt2``, ``llama``, ``mistral`` or ``qwen2``. Or a path ending ``.gguf``: one llama.cpp
        file (``general.architecture`` ``llama``, ``qwen2`` or ``gpt2``; tensor types F32, F16,
        BF16, Q8_0, Q5_0/1, Q4_0/1 and the K-quants Q2_K..Q6_K), whose hyperparameters, BOS/EOS
        ids and tokenizer come from its metadata (see :mod:`~jaxrescore.models.pretrained.gguf`).
      dtype: the weights' and compute dtype: None (float32, whatever the file stores: exact
        scores, the library's default; a GGUF file's quantised weights are dequantised to it),
        ``"bfloat16"``/``"float16"`` (half the memory; the model's ``score_tolerance`` becomes
        0.1 nats), or ``"auto"`` (the config's ``torch_dtype``; a GGUF file's float16 or bfloat16
        when ``general.file_type`` says it holds those, else float32). Norms, attention softmax
        and log-probs run in float32 either way.
      mesh: optional ``jax.sharding.Mesh``: forwards shard the batch over it (see
        :meth:`~jaxrescore.models.JaxLM.with_mesh`).
      shard_params: with ``mesh``, split every weight over the mesh's devices (a model larger
        than one device) instead of replicating it; weights go from the host straight to their
        shards.
      max_len: the longest sequence in the support, eos included (default and maximum: the
        config's context length, ``n_positions`` / ``max_position_embeddings`` /
        ``{arch}.context_length``, or a Mistral ``sliding_window`` when shorter: longer contexts
        would attend differently).
      eos: the end-of-sequence id (default: the config's ``eos_token_id``, a GGUF file's
        ``tokenizer.ggml.eos_token_id``); None for fixed-length sequences of ``max_len`` tokens.
      bos_id: the id fed at position 0 (default: the config's ``bos_token_id``, a GGUF file's
        ``tokenizer.ggml.bos_token_id``, else the eos id).
      tokenizer: True (read ``tokenizer.json`` when the folder has one; rebuild a GGUF file's
        from its metadata: byte-level BPE, see
        :mod:`~jaxrescore.models.pretrained.gguf_tokenizer`), False (ids only), or a tokenizer
        object of one's own (``encode``/``decode``, see ``with_tokenizer``).

    Returns:
      A :class:`PretrainedLM` (``config``: the ``config.json`` dict, or a GGUF file's metadata
      scalars; ``directory``: the folder or file).
    """
    options = dict(dtype=dtype, mesh=mesh, shard_params=shard_params, max_len=max_len, eos=eos, bos_id=bos_id)
    if _is_gguf(directory):
        path = os.fspath(directory)
        with open_gguf(path) as source:
            config = config_of(source)
            return _load(
                path, config, lambda: tensors_of(source, config), tokenizer,
                lambda: tokenizer_from_metadata(source.metadata, path), source.scalars(), **options,
            )
    path = check_directory(directory)
    config = read_config(path)
    return _load(path, config, lambda: read_tensors(path), tokenizer, lambda: read_tokenizer(path), config, **options)


def _to_device(params: dict) -> None:
    """Move a nested dict of host arrays to the default device IN PLACE, one leaf at a time: each
    host array is dropped as soon as its device copy exists, so loading peaks at the weights plus
    one array, not two whole copies (``jax.device_put`` of the whole tree would hold both)."""
    for key, value in params.items():
        if isinstance(value, dict):
            _to_device(value)
        else:
            params[key] = jax.device_put(value).block_until_ready()
            del value


def _load(
    path, config, tensors, tokenizer, own_tokenizer, shown, *, dtype, mesh, shard_params, max_len, eos, bos_id
) -> PretrainedLM:
    """The model of ``config`` with weights from ``tensors()`` (a name -> array mapping) and
    ``tokenizer`` (True: ``own_tokenizer()``, the checkpoint's); ``shown`` becomes its ``config``
    attribute."""
    model_type = config.get("model_type")
    family = FAMILY_OF.get(model_type)
    if family is None:
        raise ValueError(
            f"config.json: model_type={model_type!r} is not supported; from_pretrained reads "
            f"{sorted(FAMILY_OF)} (the GPT-2 and Llama families)"
        )
    spec = family.spec_of(config, _dtype_name(dtype, config))
    mesh = check_mesh(mesh)
    if not isinstance(shard_params, (bool, np.bool_)):
        raise ValueError(f"shard_params must be True or False, got {shard_params!r}")
    context = spec.max_positions
    window = config.get("sliding_window")
    if window and config.get("use_sliding_window", model_type == "mistral"):
        context = min(context, int(window))
    max_len = context if max_len is None else check_int(max_len, "max_len", minimum=1, maximum=context + 1)
    vocab = spec.vocab_size
    if eos is FROM_CONFIG:
        eos = _token_id(config.get("eos_token_id"), "eos_token_id")
    eos = check_int(eos, "eos", minimum=0, maximum=vocab, allow_none=True)
    if bos_id is FROM_CONFIG:
        bos_id = _token_id(config.get("bos_token_id"), "bos_token_id")
        bos_id = eos if bos_id is None else bos_id
        if bos_id is None:
            raise ValueError("the checkpoint names neither a bos_token_id nor an eos_token_id: pass bos_id=")
    bos_id = check_int(bos_id, "bos_id", minimum=0, maximum=vocab)
    if tokenizer is True:
        tok = own_tokenizer()
    elif tokenizer is False or tokenizer is None:
        tok = None
    else:
        tok = tokenizer
    params = family.params_of(spec, tensors(), jnp.dtype(spec.dtype))
    if mesh is None:
        _to_device(params)
    model = PretrainedLM(
        spec, params, eos=eos, bos_id=bos_id, max_len=max_len, mesh=mesh, config=shown, directory=path
    )
    model.shard_params = bool(shard_params) and mesh is not None
    return model if tok is None else model.with_tokenizer(tok)
