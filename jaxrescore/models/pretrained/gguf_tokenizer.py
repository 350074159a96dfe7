"""The tokenizer of a GGUF file, rebuilt from its metadata as a ``tokenizers.Tokenizer``.

A GGUF file stores the vocabulary (``tokenizer.ggml.tokens``, ids by position), each token's type
(``tokenizer.ggml.token_type``: 1 normal, 3 control, 4 user-defined, ...), the BPE merges
(``tokenizer.ggml.merges``, ``"a b"`` strings, best first) and the NAME of the pre-tokenizer
(``tokenizer.ggml.pre``) that llama.cpp's converter recognised in the original ``tokenizer.json``,
not the pre-tokenizer itself. :func:`tokenizer_from_metadata` rebuilds byte-level BPE
(``tokenizer.ggml.model == "gpt2"``) with the pre-tokenizer the original ``tokenizer.json`` of
that family has, for the names whose original is known here:

==========================  ===================================================================
``tokenizer.ggml.pre``      splitting (then GPT-2's byte-to-unicode mapping)
==========================  ===================================================================
``gpt-2``                   GPT-2's regex (``ByteLevel(use_regex=True)``)
``smollm``, ``starcoder``   every digit alone, then GPT-2's regex (llama.cpp: ``\\p{N}`` first)
``llama-bpe``, ``llama3``,  Llama 3's regex (digits in runs of up to three), whole-word lookup
``llama-v3``                before the merges (``ignore_merges``, as llama.cpp and Llama 3's
                            ``tokenizer.json`` do)
``qwen2``                   NFC, then Qwen2's regex (single digits)
==========================  ===================================================================

Any other name (or none) is refused: llama.cpp would fall back to a generic regex that splits many
texts differently, and a wrong split silently changes every score. SentencePiece vocabularies
(``tokenizer.ggml.model == "llama"``: Llama 2, TinyLlama, Mistral v0.1) are refused too: pass
``tokenizer=False`` (ids only) or a tokenizer of one's own to ``from_pretrained``.

Control tokens (``<|im_start|>``, ``<|endoftext|>``) become special added tokens and user-defined
ones plain added tokens, so either encodes as one id wherever it appears in the text, as llama.cpp
and the original tokenizer encode it. BOS is never added here: the model feeds its own at position
0 (see :mod:`jaxrescore.models.pretrained.model`), whatever ``tokenizer.ggml.add_bos_token`` says.
"""

from __future__ import annotations

from jaxrescore.models.pretrained.files import HFTokenizer, _need

CONTROL, USER_DEFINED = 3, 4

# llama.cpp's regex for the gpt2 family is the one ByteLevel(use_regex=True) applies; these are the
# Split patterns of the original tokenizer.json files (llama.cpp spells (?i:'s|...) out by case).
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# tokenizer.ggml.pre -> (how text is split, BPE ignore_merges)
PRE_TOKENIZERS = {
    "gpt-2": ("gpt2", False),
    "smollm": ("digits", False),
    "starcoder": ("digits", False),
    "llama-bpe": ("llama3", True),
    "llama3": ("llama3", True),
    "llama-v3": ("llama3", True),
    "qwen2": ("qwen2", False),
}


def _pre_tokenizer(tokenizers, kind: str):
    pre = tokenizers.pre_tokenizers
    if kind == "gpt2":
        return pre.ByteLevel(add_prefix_space=False, use_regex=True)
    if kind == "digits":
        return pre.Sequence([pre.Digits(individual_digits=True), pre.ByteLevel(add_prefix_space=False, use_regex=True)])
    split = LLAMA3_SPLIT if kind == "llama3" else QWEN2_SPLIT
    return pre.Sequence([
        pre.Split(tokenizers.Regex(split), behavior="isolated"),
        pre.ByteLevel(add_prefix_space=False, use_regex=False),
    ])


def _array(metadata: dict, key: str, where: str) -> list:
    value = metadata.get(key)
    if not isinstance(value, list):
        raise ValueError(f"{where}: the GGUF metadata has no {key!r} array, so no tokenizer can be rebuilt; "
                         "pass tokenizer=False")
    return value


def tokenizer_from_metadata(metadata: dict, where: str = "the GGUF file") -> HFTokenizer | None:
    """The GGUF metadata's tokenizer as an :class:`~jaxrescore.models.pretrained.files.HFTokenizer`
    (see the module docstring for what is rebuilt and what is refused with a ValueError), or None
    when the metadata describes none (no ``tokenizer.ggml.model``).

    Args:
      metadata: the file's metadata (``tokenizer.ggml.*`` keys; arrays as lists).
      where: the file, named in errors.
    """
    model = metadata.get("tokenizer.ggml.model")
    if model is None:
        return None
    tokenizers = _need("tokenizers")
    if model != "gpt2":
        what = "a SentencePiece vocabulary" if model == "llama" else "a tokenizer"
        raise ValueError(
            f"{where}: tokenizer.ggml.model={model!r} is {what} that from_pretrained does not rebuild "
            "(it rebuilds byte-level BPE, 'gpt2'); pass tokenizer=False for ids only, or tokenizer=<an "
            "object with encode/decode>"
        )
    pre = metadata.get("tokenizer.ggml.pre")
    if pre not in PRE_TOKENIZERS:
        raise ValueError(
            f"{where}: tokenizer.ggml.pre={pre!r} names a pre-tokenizer from_pretrained does not know "
            f"(known: {sorted(PRE_TOKENIZERS)}); a guessed one would split text differently from the "
            "model's own tokenizer. Pass tokenizer=False, or tokenizer=<an object with encode/decode>"
        )
    tokens = _array(metadata, "tokenizer.ggml.tokens", where)
    merges = _array(metadata, "tokenizer.ggml.merges", where)
    types = metadata.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    if len(types) != len(tokens):
        raise ValueError(f"{where}: {len(types)} token types for {len(tokens)} tokens")
    vocab = {token: i for i, token in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise ValueError(f"{where}: tokenizer.ggml.tokens lists a token twice; a vocabulary maps each token to one id")
    pairs = []
    for merge in merges:
        pair = tuple(merge.split(" "))
        if len(pair) != 2:
            raise ValueError(f"{where}: tokenizer.ggml.merges entry {merge!r} is not two tokens separated by a space")
        pairs.append(pair)
    kind, ignore_merges = PRE_TOKENIZERS[pre]
    options = {"ignore_merges": True} if ignore_merges else {}
    try:
        bpe = tokenizers.models.BPE(vocab, pairs, **options)
    except TypeError:  # tokenizers before 0.19 has no ignore_merges
        raise ImportError(f"{where}: tokenizer.ggml.pre={pre!r} needs tokenizers>=0.19 (BPE ignore_merges)") from None
    tok = tokenizers.Tokenizer(bpe)
    if kind == "qwen2":  # Qwen2's tokenizer.json composes characters first
        tok.normalizer = tokenizers.normalizers.NFC()
    tok.pre_tokenizer = _pre_tokenizer(tokenizers, kind)
    tok.decoder = tokenizers.decoders.ByteLevel()
    added = tokenizers.AddedToken
    # Added tokens take the ids they have in the vocabulary (their text is a vocabulary key).
    tok.add_special_tokens([added(t, special=True, normalized=False)
                            for t, k in zip(tokens, types) if k == CONTROL and t])
    tok.add_tokens([added(t, special=False, normalized=False)
                    for t, k in zip(tokens, types) if k == USER_DEFINED and t])
    if tok.get_vocab_size() != len(tokens):
        raise ValueError(f"{where}: the rebuilt tokenizer has {tok.get_vocab_size()} ids for {len(tokens)} tokens")
    return HFTokenizer(tok)
