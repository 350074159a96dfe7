"""from_pretrained: tiny random checkpoints written in the exact Hugging Face layout (key names,
shapes, dtypes, safetensors files, config.json fields, tokenizer.json) load and match an
independent numpy forward; prompts and results are text; proofs run through them; a 4-device
mesh with split weights gives the same answers.
"""

import json
import os
import subprocess
import sys
import textwrap

import jax
import ml_dtypes
import numpy as np
import pytest

safetensors_numpy = pytest.importorskip("safetensors.numpy")
tokenizers = pytest.importorskip("tokenizers")

import jaxrescore  # noqa: E402
from jaxrescore.models import PretrainedLM, decoding_session, from_pretrained, quantize_int8
from jaxrescore.models.int8 import dequantize  # noqa: E402

WORDS = ["the", "a", "cat", "dog", "sat", "ran", "on", "mat", "and", "big", "small", "red", "blue", "is", "here"]
GPT2_EOS = 15  # <|endoftext|>, the last id, as 50256 is GPT-2's


# ---- writing checkpoints as Hugging Face does ----------------------------------------------------


def _gpt2_config(n_layer: int, d: int = 16, heads: int = 2, positions: int = 8) -> dict:
    """config.json as GPT2Config.save_pretrained writes it (every field, nulls included)."""
    return {
        "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1,
        "bos_token_id": GPT2_EOS, "embd_pdrop": 0.1, "eos_token_id": GPT2_EOS, "initializer_range": 0.02,
        "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": positions, "n_embd": d, "n_head": heads,
        "n_inner": None, "n_layer": n_layer, "n_positions": positions, "reorder_and_upcast_attn": False,
        "resid_pdrop": 0.1, "scale_attn_by_inverse_layer_idx": False, "scale_attn_weights": True,
        "summary_activation": None, "summary_first_dropout": 0.1, "summary_proj_to_labels": True,
        "summary_type": "cls_index", "summary_use_proj": True, "torch_dtype": "float32",
        "transformers_version": "4.46.3", "use_cache": True, "vocab_size": 16,
    }


def _gpt2_tensors(cfg: dict, seed: int, layers_from: dict | None = None) -> dict:
    """GPT2LMHeadModel's tensors (no prefix; Conv1D weights [in, out]), random; ``layers_from``:
    reuse another checkpoint's embeddings and first layers (a distilled student's start)."""
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
    if layers_from is not None:
        t.update({k: layers_from[k] for k in t if k in layers_from})
    return t


def _llama_config(n_layers: int, tied: bool, dtype: str = "float32") -> dict:
    """config.json as LlamaConfig.save_pretrained writes it."""
    return {
        "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 1, "eos_token_id": 2, "head_dim": 8, "hidden_act": "silu", "hidden_size": 32,
        "initializer_range": 0.02, "intermediate_size": 48, "max_position_embeddings": 8, "mlp_bias": False,
        "model_type": "llama", "num_attention_heads": 4, "num_hidden_layers": n_layers, "num_key_value_heads": 2,
        "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 500000.0,
        "tie_word_embeddings": tied, "torch_dtype": dtype, "transformers_version": "4.46.3", "use_cache": True,
        "vocab_size": 18,
    }


def _llama_tensors(cfg: dict, seed: int, layers_from: dict | None = None) -> dict:
    """LlamaForCausalLM's tensors (``model.`` prefix, torch Linear weights [out, in]), random;
    ``layers_from``: reuse another checkpoint's embeddings and first layers."""
    rng = np.random.default_rng(seed)
    d, v, f = cfg["hidden_size"], cfg["vocab_size"], cfg["intermediate_size"]
    hd, h, kv = cfg["head_dim"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    w = lambda *shape: (rng.standard_normal(shape) * 0.3).astype(np.float32)  # noqa: E731
    t = {"model.embed_tokens.weight": w(v, d) * 3, "model.norm.weight": 1 + w(d) / 4}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t.update({
            p + "input_layernorm.weight": 1 + w(d) / 4, p + "post_attention_layernorm.weight": 1 + w(d) / 4,
            p + "self_attn.q_proj.weight": w(h * hd, d), p + "self_attn.k_proj.weight": w(kv * hd, d),
            p + "self_attn.v_proj.weight": w(kv * hd, d), p + "self_attn.o_proj.weight": w(d, h * hd),
            p + "mlp.gate_proj.weight": w(f, d), p + "mlp.up_proj.weight": w(f, d), p + "mlp.down_proj.weight": w(d, f),
        })
    if layers_from is not None:
        t.update({k: layers_from[k] for k in t if k in layers_from})
    if not cfg["tie_word_embeddings"]:  # a head of its own, near the embedding (as trained ones are)
        t["lm_head.weight"] = t["model.embed_tokens.weight"] + w(v, d)
    return t


def _gpt2_tokenizer():
    vocab = {word: i for i, word in enumerate(WORDS)} | {"<|endoftext|>": GPT2_EOS}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<|endoftext|>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["<|endoftext|>"])
    return tok


def _llama_tokenizer():
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2} | {word: i + 3 for i, word in enumerate(WORDS)}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    # as Llama's tokenizer.json: "<s>" prepended to every encoding with special tokens
    tok.post_processor = tokenizers.processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return tok


def write_checkpoint(path, config: dict, tensors: dict, tokenizer, *, shards: int = 1, dtype=None) -> str:
    """A checkpoint folder as ``save_pretrained`` leaves it: config.json, model.safetensors (or
    ``shards`` files and model.safetensors.index.json), tokenizer.json."""
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
    if dtype is not None:
        tensors = {k: v.astype(dtype) for k, v in tensors.items()}
    keys = sorted(tensors)
    if shards == 1:
        safetensors_numpy.save_file(tensors, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    else:
        weight_map = {}
        for s, part in enumerate(np.array_split(np.array(keys), shards)):
            name = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
            safetensors_numpy.save_file({k: tensors[k] for k in part}, os.path.join(path, name),
                                        metadata={"format": "pt"})
            weight_map.update({k: name for k in part})
        total = int(sum(v.nbytes for v in tensors.values()))
        with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    tokenizer.save(os.path.join(path, "tokenizer.json"))
    return str(path)


def write_gpt2_pair(root) -> tuple[str, str, dict, dict]:
    """A 2-layer GPT-2 (keys as the hub's gpt2 file: no prefix, causal-mask buffers) and a
    1-layer student sharing its embeddings and first layer (keys with ``transformer.``, as
    distilgpt2 saved by current transformers), one tokenizer."""
    cfg_t, cfg_d = _gpt2_config(2), _gpt2_config(1)
    target = _gpt2_tensors(cfg_t, seed=0)
    draft = _gpt2_tensors(cfg_d, seed=1, layers_from=target)
    on_disk = dict(target)
    for i in range(2):  # the buffers older GPT-2 files carry
        on_disk[f"h.{i}.attn.bias"] = np.tril(np.ones((1, 1, 8, 8), np.float32))
        on_disk[f"h.{i}.attn.masked_bias"] = np.array(-1e4, np.float32)
    tok = _gpt2_tokenizer()
    t_dir = write_checkpoint(os.path.join(root, "gpt2"), cfg_t, on_disk, tok)
    d_dir = write_checkpoint(os.path.join(root, "distilgpt2"), cfg_d,
                             {"transformer." + k: v for k, v in draft.items()}, tok)
    return t_dir, d_dir, target, draft


def write_llama_pair(root) -> tuple[str, str, dict, dict]:
    """A 2-layer Llama (grouped KV heads, untied head, two shards) and a 1-layer bf16 student with
    a tied head, sharing its embeddings and first layer, one tokenizer."""
    cfg_t, cfg_d = _llama_config(2, tied=False), _llama_config(1, tied=True, dtype="bfloat16")
    target = _llama_tensors(cfg_t, seed=2)
    draft = _llama_tensors(cfg_d, seed=3, layers_from=target)
    draft = {k: v.astype(ml_dtypes.bfloat16) for k, v in draft.items()}
    tok = _llama_tokenizer()
    t_dir = write_checkpoint(os.path.join(root, "llama"), cfg_t, target, tok, shards=2)
    d_dir = write_checkpoint(os.path.join(root, "llama-small"), cfg_d, draft, tok)
    return t_dir, d_dir, target, draft


# ---- independent numpy forwards (float64) ----------------------------------------------------


def _log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _attention(q, k, v):
    """q[T, H, Dh], k/v[T, H, Dh] (heads already matched), causal."""
    s = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(q.shape[-1])
    s = np.where(np.tril(np.ones(s.shape[1:], bool)), s, -np.inf)
    a = np.exp(s - s.max(-1, keepdims=True))
    a /= a.sum(-1, keepdims=True)
    return np.einsum("hqk,khd->qhd", a, v).reshape(q.shape[0], -1)


def gpt2_reference(t: dict, cfg: dict, ids) -> np.ndarray:
    """float64[T, V] next-token log-probs of GPT-2 over ``ids`` (BOS first)."""
    g = {k: np.asarray(v, np.float64) for k, v in t.items()}
    ids = np.asarray(ids)
    n, heads = len(ids), cfg["n_head"]

    def ln(x, name):
        mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + cfg["layer_norm_epsilon"]) * g[name + ".weight"] + g[name + ".bias"]

    def gelu_new(x):
        return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))

    x = g["wte.weight"][ids] + g["wpe.weight"][:n]
    for i in range(cfg["n_layer"]):
        h = f"h.{i}."
        qkv = ln(x, h + "ln_1") @ g[h + "attn.c_attn.weight"] + g[h + "attn.c_attn.bias"]
        q, k, v = (a.reshape(n, heads, -1) for a in np.split(qkv, 3, axis=-1))
        x = x + _attention(q, k, v) @ g[h + "attn.c_proj.weight"] + g[h + "attn.c_proj.bias"]
        m = gelu_new(ln(x, h + "ln_2") @ g[h + "mlp.c_fc.weight"] + g[h + "mlp.c_fc.bias"])
        x = x + m @ g[h + "mlp.c_proj.weight"] + g[h + "mlp.c_proj.bias"]
    return _log_softmax(ln(x, "ln_f") @ g["wte.weight"].T)


def llama_reference(t: dict, cfg: dict, ids, inv=None, scale: float = 1.0) -> np.ndarray:
    """float64[T, V] next-token log-probs of a Llama over ``ids`` (BOS first); ``inv`` (the
    rotary frequencies) and ``scale`` (cos and sin's factor) given, or from the config."""
    g = {k.removeprefix("model."): np.asarray(v.astype(np.float32), np.float64) for k, v in t.items()}
    ids = np.asarray(ids)
    n, heads, kv, hd = len(ids), cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]

    def rms(x, name):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + cfg["rms_norm_eps"]) * g[name + ".weight"]

    if inv is None:
        rp = cfg.get("rope_parameters") or {}  # transformers 5 spells it here, 4.x at the top level
        inv = rp.get("rope_theta", cfg.get("rope_theta")) ** (-np.arange(0, hd, 2) / hd)
        sc = rp if rp.get("rope_type") == "llama3" else cfg.get("rope_scaling")
        if sc:  # Llama 3.1's frequencies, as transformers' _compute_llama3_parameters
            old, factor = sc["original_max_position_embeddings"], sc["factor"]
            wavelen = 2 * np.pi / inv
            scaled = np.where(wavelen > old / sc["low_freq_factor"], inv / factor, inv)
            smooth = (old / wavelen - sc["low_freq_factor"]) / (sc["high_freq_factor"] - sc["low_freq_factor"])
            medium = ~(wavelen < old / sc["high_freq_factor"]) & ~(wavelen > old / sc["low_freq_factor"])
            inv = np.where(medium, (1 - smooth) * scaled / factor + smooth * scaled, scaled)
    ang = np.arange(n)[:, None] * np.asarray(inv)[None]
    cos = np.cos(np.concatenate([ang, ang], -1))[:, None] * scale
    sin = np.sin(np.concatenate([ang, ang], -1))[:, None] * scale

    def rope(x):
        return x * cos + np.concatenate([-x[..., hd // 2 :], x[..., : hd // 2]], -1) * sin

    x = g["embed_tokens.weight"][ids]
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}."
        def linear(name, h):
            return h @ g[name + ".weight"].T + g.get(name + ".bias", 0.0)

        h = rms(x, p + "input_layernorm")
        q = rope(linear(p + "self_attn.q_proj", h).reshape(n, heads, hd))
        k = rope(linear(p + "self_attn.k_proj", h).reshape(n, kv, hd))
        v = linear(p + "self_attn.v_proj", h).reshape(n, kv, hd)
        rep = heads // kv  # head j reads key/value head j // rep (repeat_kv)
        x = x + linear(p + "self_attn.o_proj", _attention(q, np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)))
        h = rms(x, p + "post_attention_layernorm")
        gate = h @ g[p + "mlp.gate_proj.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * (h @ g[p + "mlp.up_proj.weight"].T)) @ g[p + "mlp.down_proj.weight"].T
    head = g["lm_head.weight"] if "lm_head.weight" in g else g["embed_tokens.weight"]
    return _log_softmax(rms(x, "norm") @ head.T)


# ---- tests ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gpt2_pair(tmp_path_factory):
    return write_gpt2_pair(tmp_path_factory.mktemp("gpt2"))


@pytest.fixture(scope="module")
def llama_pair(tmp_path_factory):
    return write_llama_pair(tmp_path_factory.mktemp("llama"))


def _sequences(rng, vocab: int, eos: int, max_len: int, n: int, low: int = 0):
    out = []
    for _ in range(n):
        body = [int(x) for x in rng.integers(low, vocab, size=int(rng.integers(0, max_len)))]
        out.append(tuple(t for t in body if t != eos) + (eos,))
    return out


def _check_against(model, reference, tensors, cfg, seqs, bos, tol=2e-4, rtol=0.0):
    """Every position's next-token log-probs of ``model`` against the numpy ``reference``."""
    _, tables = model.position_logprobs(seqs)
    for i, s in enumerate(seqs):
        ref = reference(tensors, cfg, (bos,) + s[:-1])
        np.testing.assert_allclose(tables[i, : len(s)], ref, atol=tol, rtol=rtol)


def test_gpt2_loads_and_matches_numpy(gpt2_pair):
    t_dir, d_dir, target, draft = gpt2_pair
    model = from_pretrained(t_dir)
    assert (model.vocab_size, model.eos, model.bos_id, model.max_len) == (16, GPT2_EOS, GPT2_EOS, 8)
    assert model.spec.family == "gpt2" and model.spec.tied
    seqs = _sequences(np.random.default_rng(0), 16, GPT2_EOS, 8, 12)
    _check_against(model, gpt2_reference, target, _gpt2_config(2), seqs, GPT2_EOS)
    scores = model.score_sequences(seqs)  # sums of the same steps, in float64
    for s, score in zip(seqs, scores):
        ref = gpt2_reference(target, _gpt2_config(2), (GPT2_EOS,) + s[:-1])
        assert abs(score - sum(ref[j, t] for j, t in enumerate(s))) < 1e-4 * len(s)
    student = from_pretrained(d_dir)  # "transformer." keys
    _check_against(student, gpt2_reference, draft, _gpt2_config(1), seqs[:4], GPT2_EOS)
    # incremental rows (prefill, then one position from held parents) match the reference
    session = decoding_session(model)
    prefixes = np.array([[3, 4, 5, 0], [3, 4, 6, 0], [3, 4, 5, 7]], np.int32)
    for lengths in ([2, 2, 3], [3, 3, 4]):
        rows = session.next_logprobs(prefixes, np.array(lengths, np.int32))
        for b, n in enumerate(lengths):
            ref = gpt2_reference(target, _gpt2_config(2), (GPT2_EOS,) + tuple(int(x) for x in prefixes[b, :n]))
            np.testing.assert_allclose(rows[b], ref[-1], atol=2e-4, rtol=0)
    assert session.extended > 0


def test_llama_loads_and_matches_numpy(llama_pair):
    t_dir, d_dir, target, draft = llama_pair
    model = from_pretrained(t_dir)  # two shards, grouped KV heads, untied head
    assert (model.vocab_size, model.eos, model.bos_id, model.max_len) == (18, 2, 1, 8)
    assert not model.spec.tied and model.spec.n_kv_heads == 2
    rng = np.random.default_rng(1)
    seqs = _sequences(rng, 18, 2, 8, 12, low=3)
    _check_against(model, llama_reference, target, _llama_config(2, tied=False), seqs, 1)
    small = from_pretrained(d_dir)  # bf16 on disk, float32 compute: exact from the stored weights
    assert small.spec.tied and small.spec.dtype == "float32"
    _check_against(small, llama_reference, draft, _llama_config(1, tied=True), seqs[:4], 1)
    half = from_pretrained(d_dir, dtype="auto")  # bf16 compute (the config's torch_dtype): bf16 noise
    assert half.spec.dtype == "bfloat16" and half.score_tolerance == 0.1
    _check_against(half, llama_reference, draft, _llama_config(1, tied=True), seqs[:4], 1, tol=0.5, rtol=0.05)
    # a prompt's cache, then rows of continuations
    prompted = model.with_prompt("the cat sat")
    assert prompted.prompt == (3, 5, 7)  # the tokenizer's "<s>" is not doubled
    rows = prompted.next_logprobs(np.array([[0, 0], [6, 9]], np.int32), np.array([0, 2], np.int32))
    cfg = _llama_config(2, tied=False)
    np.testing.assert_allclose(rows[0], llama_reference(target, cfg, (1, 3, 5, 7))[-1], atol=2e-4, rtol=0)
    np.testing.assert_allclose(rows[1], llama_reference(target, cfg, (1, 3, 5, 7, 6, 9))[-1], atol=2e-4, rtol=0)


def test_llama_variants_biases_and_llama3_rope(tmp_path):
    """attention_bias (q/k/v/o biases, as Qwen2 has on q/k/v) and Llama 3.1's rope_scaling, with
    a frequency in each of its three regimes (kept, interpolated, divided)."""
    scaling = {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
               "original_max_position_embeddings": 256, "rope_type": "llama3"}
    cfg = dict(_llama_config(1, tied=True), attention_bias=True, rope_scaling=scaling)
    tensors = _llama_tensors(cfg, seed=4)
    rng = np.random.default_rng(5)
    for name in ("q", "k", "v", "o"):
        rows = tensors[f"model.layers.0.self_attn.{name}_proj.weight"].shape[0]
        tensors[f"model.layers.0.self_attn.{name}_proj.bias"] = rng.standard_normal(rows).astype(np.float32)
    model = from_pretrained(write_checkpoint(tmp_path / "llama3", cfg, tensors, _llama_tokenizer()))
    assert "q_b" in model.params["layers"] and model.spec.rope_scaling is not None
    seqs = _sequences(np.random.default_rng(6), 18, 2, 8, 6, low=3)
    _check_against(model, llama_reference, tensors, cfg, seqs, 1)
    qwen = dict(cfg, model_type="qwen2", rope_scaling=None, bos_token_id=None)
    qwen_model = from_pretrained(write_checkpoint(tmp_path / "qwen2", qwen, tensors, _llama_tokenizer()))
    assert qwen_model.spec.family == "llama" and qwen_model.bos_id == qwen_model.eos == 2  # no BOS: eos
    llama3_eos = dict(cfg, eos_token_id=[2, 4, 5])  # Llama 3 lists several: the first, or eos=
    path = write_checkpoint(tmp_path / "eos", llama3_eos, tensors, _llama_tokenizer())
    assert from_pretrained(path).eos == 2 and from_pretrained(path, eos=5).eos == 5
    mistral = dict(cfg, model_type="mistral", rope_scaling=None, sliding_window=6)
    path = write_checkpoint(tmp_path / "mistral", mistral, tensors, _llama_tokenizer())
    assert from_pretrained(path).max_len == 6  # past the window it would attend differently
    with pytest.raises(ValueError, match="max_len"):
        from_pretrained(path, max_len=7)
    unknown = dict(cfg, rope_scaling=dict(scaling, rope_type="longrope"))
    with pytest.raises(ValueError, match="longrope"):
        from_pretrained(write_checkpoint(tmp_path / "longrope", unknown, tensors, _llama_tokenizer()))


def test_int8_twin_and_options(gpt2_pair, llama_pair):
    t_dir = gpt2_pair[0]
    model = from_pretrained(t_dir, max_len=6, eos=3)
    assert (model.max_len, model.eos) == (6, 3)
    model = from_pretrained(llama_pair[0])
    twin = quantize_int8(model)
    assert twin.quantized and not twin.trainable and twin.tokenizer is not None
    nbytes = lambda m: sum(np.asarray(x).nbytes for x in jax.tree.leaves(m.params))  # noqa: E731
    assert nbytes(twin) < 0.4 * nbytes(model)
    seqs = [(3, 5, 6, 9, 2)] + _sequences(np.random.default_rng(2), 18, 2, 8, 7, low=3)
    batch, exact = model.position_logprobs(seqs)
    _, tables = twin.position_logprobs(seqs)
    # one scale per layer and output column; the twin computes the float network of its
    # dequantised weights, which stay near the originals (random weights magnify int8 noise:
    # logits here span ~30 nats)
    assert twin.params["layers"]["q"].scale.shape == (2, 1, 32) and twin.params["embed"].scale.shape == (18, 1)
    same = PretrainedLM(model.spec, dequantize(twin.params), eos=2, bos_id=1, max_len=8)
    np.testing.assert_allclose(tables, same.position_logprobs(seqs)[1], atol=2e-4, rtol=0)
    dev = np.abs(tables - exact)[:, : batch.mask.shape[1]][batch.mask]
    assert 0 < np.median(dev) < 0.3 and dev.max() < 3
    # the twin's cached rows (dequantised inside the incremental forward) equal its full forward
    rows = twin.with_prompt([3, 5]).next_logprobs(np.array([[6, 0], [6, 9]], np.int32), np.array([1, 2], np.int32))
    np.testing.assert_allclose(rows, tables[0, 3:5], atol=2e-4, rtol=0)
    # on CPU its weights are dequantised once, so its compiled calls are the float target's own
    cpu = jax.default_backend() == "cpu"
    assert (twin.decoder().fn == model.decoder().fn) == cpu
    assert (twin.packed_forward() == model.packed_forward()) == cpu
    assert from_pretrained(t_dir, tokenizer=False).tokenizer is None
    with pytest.raises(ValueError, match="max_len"):
        from_pretrained(t_dir, max_len=9)
    with pytest.raises(ValueError, match="directory"):
        from_pretrained(os.path.join(t_dir, "missing"))
    with pytest.raises(TypeError, match="directory"):
        from_pretrained(3)


def test_errors_name_the_checkpoint_problem(tmp_path):
    cfg = _gpt2_config(1)
    tensors = _gpt2_tensors(cfg, seed=0)
    bad = dict(tensors, **{"h.0.attn.c_attn.weight": tensors["h.0.attn.c_attn.weight"][:, :8]})
    with pytest.raises(ValueError, match=r"c_attn.weight.*\(16, 48\)"):
        from_pretrained(write_checkpoint(tmp_path / "shape", cfg, bad, _gpt2_tokenizer()))
    missing = {k: v for k, v in tensors.items() if k != "ln_f.bias"}
    with pytest.raises(ValueError, match="ln_f.bias"):
        from_pretrained(write_checkpoint(tmp_path / "missing", cfg, missing, _gpt2_tokenizer()))
    extra = dict(tensors, **{"h.0.mlp.extra.weight": np.zeros(3, np.float32)})
    with pytest.raises(ValueError, match="does not use"):
        from_pretrained(write_checkpoint(tmp_path / "extra", cfg, extra, _gpt2_tokenizer()))
    untied = dict(cfg, tie_word_embeddings=False)  # a separate head the file lacks
    with pytest.raises(ValueError, match="lm_head.weight"):
        from_pretrained(write_checkpoint(tmp_path / "untied", untied, tensors, _gpt2_tokenizer()))
    with_head = dict(tensors, **{"lm_head.weight": tensors["wte.weight"]})  # tied, saved anyway
    assert "head" not in from_pretrained(write_checkpoint(tmp_path / "head", cfg, with_head, _gpt2_tokenizer())).params
    with pytest.raises(ValueError, match="model_type"):
        from_pretrained(write_checkpoint(tmp_path / "bert", dict(cfg, model_type="bert"), tensors, _gpt2_tokenizer()))


def test_top_k_proves_through_gpt2_with_text(gpt2_pair):
    t_dir, d_dir, _, _ = gpt2_pair
    target, draft = from_pretrained(t_dir), from_pretrained(d_dir)
    result = jaxrescore.top_k(target, draft, 3, prompt="the cat")
    assert result.proven
    assert len(result.texts) == 3 and all(isinstance(t, str) for t in result.texts)
    # the proven answer is the target's: its exact scores, in order (the packed full forward's,
    # which sums in another order than a row forward: 4e-6 apart measured on one CPU)
    scores = target.with_prompt("the cat").score_sequences([s for s, _ in result.items])
    np.testing.assert_allclose([lp for _, lp in result.items], scores, atol=2e-5)
    prompt = target.tokenizer.encode("the cat")
    assert result.texts[0] == target.tokenizer.decode(tuple(prompt) + result.items[0][0][:-1])
    assert result.texts[0].startswith("the cat")


def test_top_k_proves_through_llama_with_text(llama_pair):
    t_dir, d_dir, _, _ = llama_pair
    result = jaxrescore.top_k(from_pretrained(t_dir), from_pretrained(d_dir), 3, prompt="a dog")
    assert result.proven and len(result.texts) == 3


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_packed_rows_after_one_prompt_equal_their_own_forwards(family, gpt2_pair, llama_pair, monkeypatch):
    """A prompted model's full forward packs its rows after ONE copy of the prompt: every
    number equals the forward of ``prompt + row`` on its own (rows of every length, an empty
    one, groups split by the packing cap), and it counts the prompt once per packed group."""
    from jaxrescore.models import packed

    t_dir = (gpt2_pair if family == "gpt2" else llama_pair)[0]
    model = from_pretrained(t_dir)
    eos, default = model.eos, packed.PACK_TOKENS
    rng = np.random.default_rng(3)
    for prompt in [(), (3,), (5, 1, 7)]:
        p_model = model.with_prompt(prompt)
        assert p_model.packs_prompt
        seqs = _sequences(rng, model.vocab_size, eos, p_model.max_len, 9) + [()]
        seqs += [seqs[0], seqs[0][:-1], seqs[0][:-1] + (eos,)]  # shared prefixes
        for cap in (default, 6):  # one group; several
            monkeypatch.setattr(packed, "PACK_TOKENS", cap)
            got = p_model.score_frontier(seqs, top_m=4)
            want = model.score_frontier([tuple(prompt) + s for s in seqs], top_m=4,
                                        skip=np.full(len(seqs), len(prompt), np.int32))
            w = got.steps.shape[1]
            np.testing.assert_allclose(got.scores, want.scores, atol=2e-5)
            for a, b in zip(got[1:], want[1:]):
                b = np.asarray(b)[:, :w]
                real = np.arange(w)[None, :] < np.array([len(x) for x in seqs])[:, None]
                np.testing.assert_allclose(np.where(real[..., None] if a.ndim == 3 else real, a, 0),
                                           np.where(real[..., None] if b.ndim == 3 else real, b, 0), atol=2e-5)
            groups = packed._groups(seqs, len(prompt) + 1)
            assert (len(groups) == 1) == (cap == default)
            distinct = sum(len({seqs[i][:j] for i in g for j in range(len(seqs[i]))}) for g in groups)
            assert p_model.full_positions(seqs) == len(groups) * len(prompt) + distinct
            if cap == default:  # shared prefixes are computed once
                assert distinct < sum(len(x) for x in seqs)


MESH_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import jax, numpy as np
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_compilation_cache_dir", sys.argv[2])
    import jaxrescore
    from jaxrescore.models import from_pretrained
    assert len(jax.devices()) == 4
    want = json.load(open(sys.argv[1]))
    mesh = jax.make_mesh((4,), ("data",))
    target = from_pretrained(want["gpt2"], mesh=mesh, shard_params=True)
    split = [x for x in jax.tree.leaves(target._device_params()) if not x.sharding.is_fully_replicated]
    assert split and all(len(x.sharding.device_set) == 4 for x in split)
    draft = from_pretrained(want["distilgpt2"], mesh=mesh, shard_params=True)  # its KV cache on the mesh
    got = jaxrescore.top_k(target, draft, 3, prompt="the cat")
    assert got.proven and got.texts == want["texts"], (got, want["texts"])
    assert [list(s) for s, _ in got.items] == [s for s, _ in want["items"]]
    np.testing.assert_allclose([lp for _, lp in got.items], [lp for _, lp in want["items"]], atol=1e-5)
    llama = from_pretrained(want["llama"], mesh=mesh, shard_params=True)  # grouped heads, split
    tables = llama.position_logprobs([tuple(s) for s in want["seqs"]])[1]
    np.testing.assert_allclose(tables, np.array(want["tables"]), atol=1e-4)
    print("ok")
    """
)


@pytest.mark.slow
def test_mesh_with_split_weights_gives_the_same_answers(gpt2_pair, llama_pair, tmp_path):
    """One device's answers (computed here, compiled by the tests above) against a 4-device mesh
    with every weight split over the devices (a subprocess: the device count is fixed when JAX
    starts)."""
    t_dir, d_dir, _, _ = gpt2_pair
    one = jaxrescore.top_k(from_pretrained(t_dir), from_pretrained(d_dir), 3, prompt="the cat")
    seqs = _sequences(np.random.default_rng(1), 18, 2, 8, 12, low=3)
    tables = from_pretrained(llama_pair[0]).position_logprobs(seqs)[1]
    want = {
        "gpt2": t_dir, "distilgpt2": d_dir, "llama": llama_pair[0], "texts": one.texts,
        "items": [[list(s), lp] for s, lp in one.items], "seqs": seqs, "tables": tables.tolist(),
    }
    (tmp_path / "want.json").write_text(json.dumps(want))
    flags = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4").strip()
    env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu")
    cache = jax.config.jax_compilation_cache_dir or str(tmp_path / "cache")
    out = subprocess.run([sys.executable, "-c", MESH_SCRIPT, str(tmp_path / "want.json"), cache], env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-3000:]
