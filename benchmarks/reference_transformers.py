"""Hugging Face transformers' reading of a GGUF file, for ``bench_pretrained.py`` to compare against.

    /path/to/python-with-torch benchmarks/reference_transformers.py MODEL.gguf IN.json OUT.npz

Run with an interpreter that has torch, transformers and gguf (none is a jaxrescore dependency).
It loads the file with ``AutoTokenizer`` and ``AutoModelForCausalLM.from_pretrained(folder,
gguf_file=name)`` (transformers dequantises the weights and undoes llama.cpp's Q/K permutation
itself), casts the model to float64 (the dequantised weights are float32 numbers, so float64 gives
their exact network to ~1e-12 and any difference is the other side's), and for every text of
``IN.json`` (``{"texts": [...], "ids": [[...], ...], "bos": int}``: the ids are jaxrescore's
tokenization, so both sides score the same inputs) writes to ``OUT.npz``:

- ``hf_ids_{i}``: int64[T'], transformers' own tokenization of text i (no special tokens added);
- ``logprobs_{i}``: float64[T + 1, V], the next-token log-probs after ``[bos] + ids[:j]`` for
  j = 0..T.
"""

from __future__ import annotations

import json
import os
import sys

# The texts bench_pretrained.py scores: a chat turn as SmolLM2's template writes it, plain prose,
# and text with digits, punctuation and non-ASCII letters (20-60 tokens each).
TEXTS = [
    "<|im_start|>user\nWhat is the capital of France? Answer in one sentence.<|im_end|>\n"
    "<|im_start|>assistant\nThe capital of France is Paris.<|im_end|>\n",
    "The quick brown fox jumps over the lazy dog. Meanwhile, in a small village by the sea, the "
    "fishermen were preparing their boats for the morning tide.",
    "In 2023, the café sold 1,250 croissants at $3.75 each: that's $4,687.50 in total (déjà vu?).",
]


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    path, request, out = argv
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    with open(request, encoding="utf-8") as f:
        job = json.load(f)
    folder, name = os.path.dirname(os.path.abspath(path)), os.path.basename(path)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    model = model.to(torch.float64).eval()
    arrays = {}
    with torch.no_grad():
        for i, (text, ids) in enumerate(zip(job["texts"], job["ids"])):
            arrays[f"hf_ids_{i}"] = np.asarray(tokenizer(text, add_special_tokens=False)["input_ids"], np.int64)
            inputs = torch.tensor([[job["bos"]] + list(ids)], dtype=torch.long)
            logits = model(input_ids=inputs).logits[0]
            arrays[f"logprobs_{i}"] = torch.log_softmax(logits, dim=-1).numpy().astype(np.float64)
    np.savez(out, **arrays)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
