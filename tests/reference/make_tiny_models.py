#!/usr/bin/env python3
"""Tiny random models (Hugging Face folders + GGUF files) with reference logits.

Usage:
    python tests/reference/make_tiny_models.py [--out engine/tests/fixtures/tiny] [--only qwen3,gemma3,gemma2]

--only regenerates just the named models and merges them into the existing manifest (the
other files stay byte for byte as they are).

Everything is seeded, so a rerun rewrites the same model files (the logits may differ in the
last bits across machines / library versions).

What produces what:
  * tokenizer.json: HF `tokenizers` BpeTrainer (byte-level BPE, vocab 300) on CORPUS.
  * model weights: torch.manual_seed-ed random tensors, rounded to the dtype of the safetensors
    file ("canonical" weights: the exact values in the HF folder, also written to the F32 GGUF).
  * config.json / model.safetensors: written here in the classic Hugging Face layout
    (rope_theta + rope_scaling), then reloaded with transformers to compute the references.
  * GGUF files: the `gguf` package's GGUFWriter with llama.cpp's tensor names and metadata keys;
    Q8_0 / Q4_0 / Q4_1 via gguf.quants.quantize, Q4_K / Q6_K via kquants.py (gguf.quants has
    no encoder for them).
  * reference logits: transformers, float32, eager attention, CPU, over INPUT_IDS (24 tokens):
      - HF folders and F32 GGUFs: the HF folder loaded with from_pretrained (canonical weights).
      - F16 / quantized GGUFs: the GGUF read back with GGUFReader, every tensor dequantized with
        gguf.quants.dequantize, Q/K un-permuted (llama arch), loaded into the same transformers
        model class, run in float32.
"""

import argparse
import copy
import hashlib
import json
import math
import os
import shutil
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kquants import quantize_q4_k, quantize_q6_k  # noqa: E402

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DEFAULT_OUT = os.path.join(REPO_ROOT, "engine", "tests", "fixtures", "tiny")

SEQ_LEN = 24
N_GREEDY = 8
VOCAB_SIZE = 280
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
BOS, EOS, PAD = "<|endoftext|>", "<|im_end|>", "<|endoftext|>"
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "A tiny model for testing the slotlight inference engine.",
    "Hello world! Hello there, how are you today?",
    "def add(a, b):\n    return a + b\n",
    "The numbers 1, 2, 3 and 42 are small; 1000 is larger.",
    "Rotary position embeddings rotate query and key vectors.",
    "user: what is the capital of France? assistant: Paris is the capital of France.",
    "the the the and and and of of to to in in is is it it",
]
INPUT_TEXT = ("<|im_start|>user\nThe quick brown fox jumps over the lazy dog. Hello world, 42!<|im_end|>\n"
              "<|im_start|>assistant\n")
TOKENIZER_CASES = ["", "Hello world", " the quick", "a   123", "\n\n", "def f(x):\n    return x",
                   "<|im_start|>user\nhi<|im_end|>", "Café 東京 🍕", "the lazy dog jumps"]
CHAT_EXAMPLE = [{"role": "system", "content": "You are tiny."}, {"role": "user", "content": "Hello world"}]

BASE = dict(hidden=64, n_layer=2, n_head=4, n_head_kv=2, head_dim=16, ffn=128, max_pos=256)

MODELS = [
    dict(name="llama", hf_arch="LlamaForCausalLM", model_type="llama", gguf_arch="llama", seed=1,
         tie=False, rope_theta=10000.0, rms_eps=1e-5, st_dtype="f32", bias=False,
         gguf_types=["F32", "F16", "Q8_0", "Q4_0", "Q4_1"], **BASE),
    dict(name="llama3", hf_arch="LlamaForCausalLM", model_type="llama", gguf_arch="llama", seed=2,
         tie=True, rope_theta=500000.0, rms_eps=1e-5, st_dtype="bf16", bias=False,
         rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                       "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
         gguf_types=["F32"], **BASE),
    dict(name="qwen2", hf_arch="Qwen2ForCausalLM", model_type="qwen2", gguf_arch="qwen2", seed=3,
         tie=True, rope_theta=1000000.0, rms_eps=1e-6, st_dtype="f16", bias=True,
         gguf_types=["F32"], **BASE),
    # Qwen3: per-head RMSNorm on q and k, no bias.
    dict(name="qwen3", hf_arch="Qwen3ForCausalLM", model_type="qwen3", gguf_arch="qwen3", seed=6,
         tie=True, rope_theta=1000000.0, rms_eps=1e-6, st_dtype="f32", bias=False, qk_norm=True,
         gguf_types=["F32"], **BASE),
    # Gemma 3: GeGLU, four norms per block (stored as w for x * (1 + w); the GGUF holds 1 + w),
    # QK norm, sqrt(hidden)-scaled embeddings, a sliding window of 8 on layer 0 (local RoPE base
    # 10000) and a global layer 1; the 24-token input crosses the window.
    dict(name="gemma3", hf_arch="Gemma3ForCausalLM", model_type="gemma3_text", gguf_arch="gemma3", seed=7,
         tie=True, rope_theta=1000000.0, rms_eps=1e-6, st_dtype="f32", bias=False, qk_norm=True,
         sliding_window=8, gguf_types=["F32"], **BASE),
    # Gemma 2: as Gemma 3 without QK norm, with soft-capped attention scores (2.0, small enough to
    # bite on these tiny logits) and logits (10.0), one RoPE base, layer 0 local (window 8).
    dict(name="gemma2", hf_arch="Gemma2ForCausalLM", model_type="gemma2", gguf_arch="gemma2", seed=8,
         tie=True, rope_theta=10000.0, rms_eps=1e-6, st_dtype="f32", bias=False, qk_norm=False,
         sliding_window=8, attn_softcap=2.0, final_softcap=10.0, gguf_types=["F32"], **BASE),
    dict(name="mistral", hf_arch="MistralForCausalLM", model_type="mistral", gguf_arch="llama", seed=4,
         tie=True, rope_theta=1000000.0, rms_eps=1e-5, st_dtype="f32", bias=False,
         gguf_types=["F32"], **BASE),
    # K-quants need rows that are a multiple of 256 values: hidden 256, ffn 256, one layer, GGUF only,
    # one file mixing Q4_K and Q6_K the way llama.cpp's Q4_K_M does for a tied one-layer model.
    dict(name="llama_k256", hf_arch="LlamaForCausalLM", model_type="llama", gguf_arch="llama", seed=5,
         tie=True, rope_theta=10000.0, rms_eps=1e-5, st_dtype="f32", bias=False, no_hf_folder=True,
         gguf_types=["Q4_K_M"],
         hidden=256, n_layer=1, n_head=4, n_head_kv=2, head_dim=64, ffn=256, max_pos=256),
]


# --------------------------------------------------------------------------------------------
# tokenizer

def train_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    tok.post_processor = processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, min_frequency=1, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    for i, s in enumerate(SPECIALS):
        assert tok.token_to_id(s) == i
    return tok


def tokenizer_vocab(tok):
    """(tokens by id, merges as 'a b', token types) like llama.cpp's gpt2 vocab export."""
    data = json.loads(tok.to_str())
    vocab = data["model"]["vocab"]
    tokens = [None] * len(vocab)
    for t, i in vocab.items():
        tokens[i] = t
    assert all(t is not None for t in tokens)
    merges = [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]]
    special = {a["content"] for a in data["added_tokens"] if a["special"]}
    types = [3 if t in special else 1 for t in tokens]  # CONTROL / NORMAL
    return tokens, merges, types


def render_chat(messages, add_generation_prompt):
    import jinja2.sandbox
    from jinja2.ext import loopcontrols

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    return env.from_string(CHATML).render(messages=messages, add_generation_prompt=add_generation_prompt,
                                          bos_token=BOS, eos_token=EOS)


# --------------------------------------------------------------------------------------------
# model

def hf_config(spec, vocab, bos_id, eos_id):
    torch_dtype = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}[spec["st_dtype"]]
    cfg = {
        "architectures": [spec["hf_arch"]],
        "model_type": spec["model_type"],
        "vocab_size": vocab,
        "hidden_size": spec["hidden"],
        "intermediate_size": spec["ffn"],
        "num_hidden_layers": spec["n_layer"],
        "num_attention_heads": spec["n_head"],
        "num_key_value_heads": spec["n_head_kv"],
        "head_dim": spec["head_dim"],
        "hidden_act": "silu",
        "max_position_embeddings": spec["max_pos"],
        "rms_norm_eps": spec["rms_eps"],
        "rope_theta": spec["rope_theta"],
        "rope_scaling": spec.get("rope_scaling"),
        "tie_word_embeddings": spec["tie"],
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "torch_dtype": torch_dtype,
        "use_cache": True,
    }
    if spec["model_type"] == "llama":
        cfg.update({"attention_bias": False, "mlp_bias": False, "pretraining_tp": 1})
    if spec["model_type"] == "mistral":
        cfg["sliding_window"] = None
    if spec["model_type"] in ("qwen2", "qwen3"):
        cfg.update({"use_sliding_window": False, "sliding_window": None, "max_window_layers": spec["n_layer"]})
    if spec["model_type"] == "qwen3":
        cfg["attention_bias"] = False
    if spec["model_type"] in ("gemma3_text", "gemma2"):
        del cfg["hidden_act"]
        cfg.update({
            "hidden_activation": "gelu_pytorch_tanh",
            "query_pre_attn_scalar": spec["head_dim"],  # GGUF cannot say otherwise: llama.cpp uses head_dim
            "sliding_window": spec["sliding_window"],
            "layer_types": ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(spec["n_layer"])],
            "attn_logit_softcapping": spec.get("attn_softcap"),
            "final_logit_softcapping": spec.get("final_softcap"),
            "pad_token_id": 0,
        })
        if spec["model_type"] == "gemma3_text":
            cfg["rope_local_base_freq"] = 10000.0
    return cfg


def config_object(cfg):
    from transformers import AutoConfig

    d = copy.deepcopy(cfg)  # transformers edits rope_scaling in place
    model_type = d.pop("model_type")
    return AutoConfig.for_model(model_type, **d)


def build_model(cfg, attn="eager"):
    import torch
    from transformers import AutoModelForCausalLM

    config = config_object(cfg)
    config._attn_implementation = attn
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn, dtype=torch.float32)
    return model.eval()


def canonical_weights(spec, model):
    """Seeded random weights, rounded to the safetensors dtype; returns {hf_name: float32 np}."""
    import torch

    gen = torch.Generator().manual_seed(spec["seed"])
    st_torch = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[spec["st_dtype"]]
    out = {}
    for name, p in model.named_parameters():
        shape = tuple(p.shape)
        if name.endswith("norm.weight"):
            w = 1.0 + 0.2 * torch.randn(shape, generator=gen)
        elif name.endswith(".bias"):
            w = 0.2 * torch.randn(shape, generator=gen)
        elif "embed_tokens" in name:
            # tied: the same matrix makes the logits, keep them O(3) (std 3 / sqrt(hidden))
            w = torch.randn(shape, generator=gen) * (3.0 / math.sqrt(shape[1]) if spec["tie"] else 1.0)
        elif name == "lm_head.weight":
            w = torch.randn(shape, generator=gen) * (2.0 / math.sqrt(shape[1]))
        else:  # linear [out, in]
            gain = 1.5 if (".q_proj." in name or ".k_proj." in name) else 1.0
            w = torch.randn(shape, generator=gen) * (gain / math.sqrt(shape[1]))
        out[name] = w.to(st_torch).to(torch.float32).numpy()
    return out


def load_weights(model, weights):
    import torch

    sd = {k: torch.from_numpy(np.array(v, dtype=np.float32)) for k, v in weights.items()}
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [m for m in missing if not (m == "lm_head.weight" and model.config.tie_word_embeddings)]
    assert not missing and not unexpected, (missing, unexpected)
    if model.config.tie_word_embeddings:
        model.tie_weights()
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    return model


def run_logits(model, ids):
    import torch

    with torch.no_grad():
        return model(input_ids=torch.tensor([ids], dtype=torch.long), use_cache=False).logits[0].float().numpy()


def greedy(model, ids, n):
    seq = list(ids)
    for _ in range(n):
        seq.append(int(np.argmax(run_logits(model, seq)[-1])))
    return seq[len(ids):]


# --------------------------------------------------------------------------------------------
# GGUF

def permute_qk(w, n_head):
    """llama.cpp convert_hf_to_gguf's Q/K permutation for the llama arch (HF half-split -> interleaved):
    inside each head, output row 2i <- HF row i, row 2i+1 <- HF row i + head_dim/2."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute_qk(w, n_head):
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama3_rope_factors(spec):
    """llama.cpp's rope_freqs.weight for rope_type llama3: theta_i is divided by factor_i."""
    rs = spec["rope_scaling"]
    dim = spec["head_dim"]
    base = spec["rope_theta"]
    factor, lo, hi, old = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"], rs["original_max_position_embeddings"]
    low_wl, high_wl = old / lo, old / hi
    freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    out = []
    for f in freqs:
        wl = 2 * math.pi / f
        if wl < high_wl:
            out.append(1.0)
        elif wl > low_wl:
            out.append(factor)
        else:
            smooth = (old / wl - lo) / (hi - lo)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


GEMMA_NORMS = [("attn_norm", "input_layernorm"), ("post_attention_norm", "post_attention_layernorm"),
               ("ffn_norm", "pre_feedforward_layernorm"), ("post_ffw_norm", "post_feedforward_layernorm")]


def gguf_tensors(spec, weights):
    """HF names -> llama.cpp names (+ permutation). Returns list of (name, float32 array [out, in])."""
    if spec["gguf_arch"] in ("gemma3", "gemma2"):
        return gemma3_gguf_tensors(spec, weights)
    permute = spec["gguf_arch"] == "llama"
    out = [("token_embd.weight", weights["model.embed_tokens.weight"])]
    for i in range(spec["n_layer"]):
        p = f"model.layers.{i}."
        q = weights[p + "self_attn.q_proj.weight"]
        k = weights[p + "self_attn.k_proj.weight"]
        if permute:
            q = permute_qk(q, spec["n_head"])
            k = permute_qk(k, spec["n_head_kv"])
        b = f"blk.{i}."
        out += [
            (b + "attn_norm.weight", weights[p + "input_layernorm.weight"]),
            (b + "attn_q.weight", q),
            (b + "attn_k.weight", k),
            (b + "attn_v.weight", weights[p + "self_attn.v_proj.weight"]),
            (b + "attn_output.weight", weights[p + "self_attn.o_proj.weight"]),
            (b + "ffn_norm.weight", weights[p + "post_attention_layernorm.weight"]),
            (b + "ffn_gate.weight", weights[p + "mlp.gate_proj.weight"]),
            (b + "ffn_up.weight", weights[p + "mlp.up_proj.weight"]),
            (b + "ffn_down.weight", weights[p + "mlp.down_proj.weight"]),
        ]
        if spec.get("qk_norm"):
            out += [(b + "attn_q_norm.weight", weights[p + "self_attn.q_norm.weight"]),
                    (b + "attn_k_norm.weight", weights[p + "self_attn.k_norm.weight"])]
        if spec["bias"]:
            assert not permute  # a llama-arch bias would be permuted like its weight
            out += [(b + "attn_q.bias", weights[p + "self_attn.q_proj.bias"]),
                    (b + "attn_k.bias", weights[p + "self_attn.k_proj.bias"]),
                    (b + "attn_v.bias", weights[p + "self_attn.v_proj.bias"])]
    out.append(("output_norm.weight", weights["model.norm.weight"]))
    if not spec["tie"]:
        out.append(("output.weight", weights["lm_head.weight"]))
    if spec.get("rope_scaling"):
        out.insert(0, ("rope_freqs.weight", llama3_rope_factors(spec)))
    return out


def gemma3_gguf_tensors(spec, weights):
    """llama.cpp's Gemma 2/3 converters: every norm weight + 1, no permutation, tied output
    (Gemma 2 has no q/k norms)."""
    one = lambda a: (a + np.float32(1.0)).astype(np.float32)  # noqa: E731
    out = [("token_embd.weight", weights["model.embed_tokens.weight"])]
    for i in range(spec["n_layer"]):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        out += [(b + g + ".weight", one(weights[p + h + ".weight"])) for g, h in GEMMA_NORMS]
        out += [
            (b + "attn_q.weight", weights[p + "self_attn.q_proj.weight"]),
            (b + "attn_k.weight", weights[p + "self_attn.k_proj.weight"]),
            (b + "attn_v.weight", weights[p + "self_attn.v_proj.weight"]),
        ]
        if spec.get("qk_norm"):
            out += [(b + "attn_q_norm.weight", one(weights[p + "self_attn.q_norm.weight"])),
                    (b + "attn_k_norm.weight", one(weights[p + "self_attn.k_norm.weight"]))]
        out += [
            (b + "attn_output.weight", weights[p + "self_attn.o_proj.weight"]),
            (b + "ffn_gate.weight", weights[p + "mlp.gate_proj.weight"]),
            (b + "ffn_up.weight", weights[p + "mlp.up_proj.weight"]),
            (b + "ffn_down.weight", weights[p + "mlp.down_proj.weight"]),
        ]
    out.append(("output_norm.weight", one(weights["model.norm.weight"])))
    return out


def hf_from_gguf_tensors(spec, tensors):
    """Inverse of gguf_tensors (used with dequantized tensors)."""
    if spec["gguf_arch"] in ("gemma3", "gemma2"):
        w = {"model.embed_tokens.weight": tensors["token_embd.weight"],
             "model.norm.weight": tensors["output_norm.weight"] - 1}
        for i in range(spec["n_layer"]):
            p, b = f"model.layers.{i}.", f"blk.{i}."
            for g, h in GEMMA_NORMS:
                w[p + h + ".weight"] = tensors[b + g + ".weight"] - 1
            for s_, t in (("q_proj", "attn_q"), ("k_proj", "attn_k"), ("v_proj", "attn_v"), ("o_proj", "attn_output")):
                w[p + f"self_attn.{s_}.weight"] = tensors[b + t + ".weight"]
            if spec.get("qk_norm"):
                w[p + "self_attn.q_norm.weight"] = tensors[b + "attn_q_norm.weight"] - 1
                w[p + "self_attn.k_norm.weight"] = tensors[b + "attn_k_norm.weight"] - 1
            for s_, t in (("gate_proj", "ffn_gate"), ("up_proj", "ffn_up"), ("down_proj", "ffn_down")):
                w[p + f"mlp.{s_}.weight"] = tensors[b + t + ".weight"]
        return w
    permute = spec["gguf_arch"] == "llama"
    w = {"model.embed_tokens.weight": tensors["token_embd.weight"], "model.norm.weight": tensors["output_norm.weight"]}
    if "output.weight" in tensors:
        w["lm_head.weight"] = tensors["output.weight"]
    for i in range(spec["n_layer"]):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        q, k = tensors[b + "attn_q.weight"], tensors[b + "attn_k.weight"]
        if permute:
            q, k = unpermute_qk(q, spec["n_head"]), unpermute_qk(k, spec["n_head_kv"])
        w.update({
            p + "input_layernorm.weight": tensors[b + "attn_norm.weight"],
            p + "self_attn.q_proj.weight": q,
            p + "self_attn.k_proj.weight": k,
            p + "self_attn.v_proj.weight": tensors[b + "attn_v.weight"],
            p + "self_attn.o_proj.weight": tensors[b + "attn_output.weight"],
            p + "post_attention_layernorm.weight": tensors[b + "ffn_norm.weight"],
            p + "mlp.gate_proj.weight": tensors[b + "ffn_gate.weight"],
            p + "mlp.up_proj.weight": tensors[b + "ffn_up.weight"],
            p + "mlp.down_proj.weight": tensors[b + "ffn_down.weight"],
        })
        if spec.get("qk_norm"):
            w[p + "self_attn.q_norm.weight"] = tensors[b + "attn_q_norm.weight"]
            w[p + "self_attn.k_norm.weight"] = tensors[b + "attn_k_norm.weight"]
        if spec["bias"]:
            for s in "qkv":
                w[p + f"self_attn.{s}_proj.bias"] = tensors[b + f"attn_{s}.bias"]
    return w


FILE_TYPES = {"F32": "ALL_F32", "F16": "MOSTLY_F16", "Q8_0": "MOSTLY_Q8_0", "Q4_0": "MOSTLY_Q4_0",
              "Q4_1": "MOSTLY_Q4_1", "Q4_K_M": "MOSTLY_Q4_K_M"}


def tensor_type_for(name, file_type):
    """Per-tensor type. 1-D tensors stay F32. Q4_K_M: like llama.cpp's llama_tensor_get_type for a
    one-layer tied model: Q6_K for token_embd (it is also the output), attn_v and ffn_down, Q4_K otherwise."""
    if file_type != "Q4_K_M":
        return file_type
    if name == "token_embd.weight" or name.endswith("attn_v.weight") or name.endswith("ffn_down.weight"):
        return "Q6_K"
    return "Q4_K"


def encode_tensor(arr, type_name):
    """Returns (data, raw_dtype or None)."""
    from gguf import GGMLQuantizationType as T
    from gguf import quants

    if arr.ndim == 1 or type_name == "F32":
        return arr.astype(np.float32), None
    if type_name == "F16":
        return arr.astype(np.float16), None
    if type_name == "Q4_K":
        return quantize_q4_k(arr), T.Q4_K
    if type_name == "Q6_K":
        return quantize_q6_k(arr), T.Q6_K
    qt = getattr(T, type_name)
    return quants.quantize(arr.astype(np.float32), qt), qt


def write_gguf(path, spec, weights, type_name, tok_meta):
    import gguf

    arch = spec["gguf_arch"]
    w = gguf.GGUFWriter(path, arch)
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name(f"tiny-{spec['name']}")
    w.add_block_count(spec["n_layer"])
    w.add_context_length(spec["max_pos"])
    w.add_embedding_length(spec["hidden"])
    w.add_feed_forward_length(spec["ffn"])
    w.add_head_count(spec["n_head"])
    w.add_head_count_kv(spec["n_head_kv"])
    w.add_rope_freq_base(spec["rope_theta"])
    w.add_layer_norm_rms_eps(spec["rms_eps"])
    w.add_file_type(getattr(gguf.LlamaFileType, FILE_TYPES[type_name]))
    if arch == "llama":
        w.add_vocab_size(len(tok_meta["tokens"]))
    w.add_rope_dimension_count(spec["head_dim"])
    if spec["model_type"] in ("mistral", "qwen3", "gemma3_text", "gemma2"):  # converter writes head_dim
        w.add_key_length(spec["head_dim"])
        w.add_value_length(spec["head_dim"])
    if arch == "gemma3":
        w.add_sliding_window(spec["sliding_window"])
        # llama.cpp reads the period from this key (default 6): layer l is global when (l+1) % 2 == 0.
        w.add_uint32("gemma3.attention.sliding_window_pattern", 2)
    if arch == "gemma2":  # llama.cpp: every other layer local, layer 0 first
        w.add_sliding_window(spec["sliding_window"])
        w.add_attn_logit_softcapping(spec["attn_softcap"])
        w.add_final_logit_softcapping(spec["final_softcap"])
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tok_meta["tokens"])
    w.add_token_types(tok_meta["types"])
    w.add_token_merges(tok_meta["merges"])
    w.add_bos_token_id(tok_meta["bos_id"])
    w.add_eos_token_id(tok_meta["eos_id"])
    w.add_pad_token_id(tok_meta["pad_id"])
    w.add_add_bos_token(False)
    w.add_chat_template(CHATML)
    types, per_tensor = {}, {}
    for name, arr in gguf_tensors(spec, weights):
        data, raw = encode_tensor(arr, tensor_type_for(name, type_name))
        if raw is None:
            w.add_tensor(name, data)
            tn = "F16" if data.dtype == np.float16 else "F32"
        else:
            w.add_tensor(name, data, raw_dtype=raw)
            tn = raw.name
        types[tn] = types.get(tn, 0) + 1
        per_tensor[name] = tn
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return types, per_tensor


def read_gguf_dequantized(path):
    import gguf

    reader = gguf.GGUFReader(path)
    out = {}
    for t in reader.tensors:
        shape = tuple(int(x) for x in reversed(t.shape))
        out[t.name] = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(shape)
    return out


# --------------------------------------------------------------------------------------------

def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def save_logits(path, logits):
    arr = np.ascontiguousarray(logits, dtype="<f4")
    arr.tofile(path)
    return arr


ROPE_DOC = {
    "hf": "neox / half-split: rotate pairs (x[i], x[i + head_dim/2]), theta_i = pos * rope_theta^(-2i/head_dim)",
    "llama": ("normal / interleaved: GGUF Q and K rows were permuted by the converter (per head: row 2i <- HF row i, "
              "row 2i+1 <- HF row i + head_dim/2); rotate adjacent pairs (x[2i], x[2i+1])"),
    "qwen2": "neox / half-split: no permutation; rotate pairs (x[i], x[i + head_dim/2]) like HF",
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--only", default=None, help="comma-separated model names to (re)generate")
    args = ap.parse_args()
    only = set(args.only.split(",")) if args.only else None

    import gguf  # noqa: F401
    import safetensors
    import tokenizers
    import torch
    import transformers
    from importlib.metadata import version as pkg_version
    from safetensors.torch import save_file

    torch.set_num_threads(args.threads)
    out_dir = os.path.abspath(args.out)
    if only is None:
        if os.path.isdir(out_dir):
            shutil.rmtree(out_dir)
        os.makedirs(os.path.join(out_dir, "ref"))

    tok = train_tokenizer()
    tokens, merges, types = tokenizer_vocab(tok)
    vocab = len(tokens)
    bos_id, eos_id, pad_id = tok.token_to_id(BOS), tok.token_to_id(EOS), tok.token_to_id(PAD)
    tok_meta = {"tokens": tokens, "merges": merges, "types": types, "bos_id": bos_id, "eos_id": eos_id,
                "pad_id": pad_id}
    input_ids = tok.encode(INPUT_TEXT).ids
    assert len(input_ids) >= SEQ_LEN, len(input_ids)
    input_ids = input_ids[:SEQ_LEN]
    chat_text = render_chat(CHAT_EXAMPLE, True)

    manifest = {
        "generator": "tests/reference/make_tiny_models.py",
        "library_versions": {
            "python": sys.version.split()[0], "torch": torch.__version__,
            "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
            "gguf": pkg_version("gguf"), "safetensors": safetensors.__version__, "numpy": np.__version__,
        },
        "logits_format": ("little-endian float32, row-major [n_positions, vocab]; row t = logits after "
                          "input_ids[0..=t] (all positions of one forward pass, causal)"),
        "input_ids": input_ids,
        "input_text_prefix": tok.decode(input_ids, skip_special_tokens=False),
        "rope_conventions": ROPE_DOC,
        "tokenizer": {
            "vocab_size": vocab,
            "special_tokens": [[tok.token_to_id(s), s] for s in SPECIALS],
            "bos_token": BOS, "eos_token": EOS, "pad_token": PAD,
            "chat_template": CHATML,
            "chat_example": {"messages": CHAT_EXAMPLE, "add_generation_prompt": True, "rendered": chat_text,
                             "ids": tok.encode(chat_text).ids},
            "cases": [{"text": t, "ids": tok.encode(t).ids,
                       "decoded": tok.decode(tok.encode(t).ids, skip_special_tokens=False)}
                      for t in TOKENIZER_CASES],
        },
        "models": [],
        "references": {},
    }
    if only is not None:
        with open(os.path.join(out_dir, "manifest.json")) as f:
            old = json.load(f)
        assert old["input_ids"] == input_ids, "the tokenizer changed: regenerate everything"
        drop = {fe["reference"] for m in old["models"] if m["name"] in only for fe in m["files"]}
        manifest["models"] = [m for m in old["models"] if m["name"] not in only]
        manifest["references"] = {k: v for k, v in old["references"].items() if k not in drop}

    def add_reference(key, logits, model, source):
        path = os.path.join("ref", f"{key}.logits.bin")
        arr = save_logits(os.path.join(out_dir, path), logits)
        manifest["references"][key] = {
            "file": path, "shape": list(arr.shape), "dtype": "f32le", "source": source,
            "argmax": [int(i) for i in arr.argmax(axis=-1)],
            "max_abs_logit": round(float(np.abs(arr).max()), 6),
            "greedy_token_ids": greedy(model, input_ids, N_GREEDY),
        }
        return key

    for spec in MODELS:
        name = spec["name"]
        if only is not None and name not in only:
            continue
        if only is not None and os.path.isdir(os.path.join(out_dir, name)):
            shutil.rmtree(os.path.join(out_dir, name))
        print(f"== {name}", file=sys.stderr)
        cfg = hf_config(spec, vocab, bos_id, eos_id)
        model = build_model(cfg)
        weights = canonical_weights(spec, model)
        load_weights(model, weights)
        canonical_logits = run_logits(model, input_ids)
        entry = {
            "name": name, "hf_architecture": spec["hf_arch"], "model_type": spec["model_type"],
            "gguf_arch": spec["gguf_arch"],
            "dims": {k: spec[k] for k in ("hidden", "n_layer", "n_head", "n_head_kv", "head_dim", "ffn", "max_pos")},
            "vocab_size": vocab, "rope_theta": spec["rope_theta"], "rope_scaling": spec.get("rope_scaling"),
            "rms_eps": spec["rms_eps"], "tie_word_embeddings": spec["tie"], "attention_qkv_bias": spec["bias"],
            "seed": spec["seed"], "files": [],
        }
        canon_key = None
        if not spec.get("no_hf_folder"):
            folder = os.path.join(out_dir, name)
            os.makedirs(folder)
            with open(os.path.join(folder, "config.json"), "w") as f:
                json.dump(cfg, f, indent=2)
                f.write("\n")
            st_torch = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[spec["st_dtype"]]
            sd = {k: torch.from_numpy(v).to(st_torch).contiguous() for k, v in weights.items()
                  if not (spec["tie"] and k == "lm_head.weight")}
            save_file(sd, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
            tok.save(os.path.join(folder, "tokenizer.json"))
            with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
                json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS, "eos_token": EOS,
                           "pad_token": PAD, "unk_token": None, "add_bos_token": False, "add_eos_token": False,
                           "clean_up_tokenization_spaces": False, "model_max_length": spec["max_pos"],
                           "chat_template": CHATML}, f, indent=2, ensure_ascii=False)
                f.write("\n")
            # reference: reload the folder with transformers
            from transformers import AutoModelForCausalLM

            hf_model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
            hf_logits = run_logits(hf_model, input_ids)
            diff = float(np.abs(hf_logits - canonical_logits).max())
            assert diff < 1e-5, f"{name}: reloaded HF folder differs from in-memory model by {diff}"
            canon_key = add_reference(name, hf_logits, hf_model,
                                      "transformers float32 (eager attention), HF folder loaded with from_pretrained")
            entry["files"].append({
                "path": name + "/", "format": "hf_safetensors", "dtype": spec["st_dtype"],
                "rope_convention": "hf", "reference": canon_key, "reference_kind": "exact weights",
                "size_bytes": os.path.getsize(os.path.join(folder, "model.safetensors")),
            })
        for type_name in spec["gguf_types"]:
            fname = f"{name}.{type_name}.gguf"
            path = os.path.join(out_dir, fname)
            types, per_tensor = write_gguf(path, spec, weights, type_name, tok_meta)
            deq = read_gguf_dequantized(path)
            back = hf_from_gguf_tensors(spec, deq)
            if type_name == "F32":
                for k, v in weights.items():
                    if spec["tie"] and k == "lm_head.weight":
                        continue
                    if spec["gguf_arch"] in ("gemma3", "gemma2") and k.endswith("norm.weight"):
                        # stored as 1 + w (exactly what Gemma3RMSNorm computes); w back is inexact
                        assert np.array_equal(back[k] + 1, v + np.float32(1.0)), f"{fname}: {k}"
                        continue
                    assert np.array_equal(back[k], v), f"{fname}: {k} did not round-trip"
                if spec.get("rope_scaling"):
                    assert np.array_equal(deq["rope_freqs.weight"], llama3_rope_factors(spec))
            if type_name == "F32" and canon_key is not None:
                ref_key, kind = canon_key, "exact weights (same values as the HF folder)"
            else:
                qmodel = load_weights(build_model(cfg), back)
                qlogits = run_logits(qmodel, input_ids)
                ref_key = add_reference(
                    f"{name}.{type_name}", qlogits, qmodel,
                    "transformers float32 (eager attention) with weights dequantized from this GGUF by "
                    "gguf.quants.dequantize (Q/K un-permuted)")
                kind = "dequantized weights"
                rel = float(np.abs(qlogits - canonical_logits).max() / np.abs(canonical_logits).max())
                print(f"   {fname}: max |dequant - canonical| / max|logit| = {rel:.4f}", file=sys.stderr)
            entry["files"].append({
                "path": fname, "format": "gguf", "dtype": type_name, "gguf_arch": spec["gguf_arch"],
                "rope_convention": "llama" if spec["gguf_arch"] == "llama" else "qwen2",
                "qk_permuted": spec["gguf_arch"] == "llama",
                "rope_freqs_tensor": bool(spec.get("rope_scaling")),
                "tensor_types": types, "tensors": per_tensor, "reference": ref_key, "reference_kind": kind,
                "size_bytes": os.path.getsize(path), "sha256": sha256(path),
            })
        manifest["models"].append(entry)

    with open(os.path.join(out_dir, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1, ensure_ascii=False)
        f.write("\n")
    total = sum(os.path.getsize(os.path.join(dp, fn)) for dp, _, fns in os.walk(out_dir) for fn in fns)
    print(f"wrote {out_dir}: {total} bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
