"""Pretrained checkpoints: :func:`from_pretrained` reads a local Hugging Face folder or a GGUF file
(GPT-2 and Llama families) into a :class:`PretrainedLM` (see
:mod:`jaxrescore.models.pretrained.model`)."""

from jaxrescore.models.pretrained.files import HFTokenizer
from jaxrescore.models.pretrained.model import PretrainedLM, from_pretrained
from jaxrescore.models.pretrained.network import DecoderSpec

__all__ = ["DecoderSpec", "HFTokenizer", "PretrainedLM", "from_pretrained"]
