#!/usr/bin/env python3
"""Sanity check of the committed fixtures with an independent numpy forward pass.

Usage:
    python tests/reference/check_fixtures.py [PATH/TO/SmolLM2-135M-Instruct.Q4_1.gguf]

(SmolLM2 path optional, or SLOTLIGHT_MODEL; without it only the tiny models are checked.)

* Every tiny GGUF is read with gguf.GGUFReader, dequantized with gguf.quants.dequantize and run
  through the numpy llama forward below (float64), using the file's own convention: llama arch =
  rotate adjacent pairs on the permuted Q/K, divide theta_i by rope_freqs.weight[i] when present;
  qwen2 arch = rotate (i, i + head_dim/2). The result must match the reference logits written by
  transformers. It is also run with the *wrong* convention to show the fixtures tell them apart.
* Every tiny HF folder is run the same way from model.safetensors + config.json (HF = half-split).
* transformers' own GGUF loader is tried on each tiny GGUF (report only).
* SmolLM2: the numpy forward over prompt + greedy continuation of each prompt (dequantized
  Q4_1/Q8_0 weights) must reproduce the JSON's top5 / detail logits.
Exit status 1 if a required check fails.
"""

import json
import math
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FIX = os.path.join(REPO_ROOT, "engine", "tests", "fixtures")
TINY = os.path.join(FIX, "tiny")
TOL_TINY = 2e-4
TOL_SMOLLM = 2e-3

failures = []


def check(ok, msg):
    print(("ok    " if ok else "FAIL  ") + msg)
    if not ok:
        failures.append(msg)


# --------------------------------------------------------------------------------------------
# numpy forward

def rms_norm(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def rope(x, pos, base, style, factors=None):
    """x: [T, H, D]. style 'interleaved' (pairs 2i, 2i+1) or 'neox' (pairs i, i + D/2)."""
    d = x.shape[-1]
    inv = base ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    if factors is not None:
        inv = inv / factors
    ang = pos[:, None] * inv[None, :]  # [T, D/2]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    if style == "interleaved":
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = a * cos - b * sin
        out[..., 1::2] = a * sin + b * cos
    else:
        a, b = x[..., : d // 2], x[..., d // 2:]
        out = np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)
    return out


def forward(t, cfg, ids, style, use_factors=True):
    """t: llama.cpp-named float arrays [out, in]; cfg: dims."""
    n_head, n_kv, hd = cfg["n_head"], cfg["n_head_kv"], cfg["head_dim"]
    eps, base = cfg["rms_eps"], cfg["rope_theta"]
    factors = t.get("rope_freqs.weight") if use_factors else None
    T = len(ids)
    pos = np.arange(T, dtype=np.float64)
    x = t["token_embd.weight"][ids].astype(np.float64)
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for i in range(cfg["n_layer"]):
        b = f"blk.{i}."
        h = rms_norm(x, t[b + "attn_norm.weight"], eps)
        q = h @ t[b + "attn_q.weight"].T
        k = h @ t[b + "attn_k.weight"].T
        v = h @ t[b + "attn_v.weight"].T
        if b + "attn_q.bias" in t:
            q, k, v = q + t[b + "attn_q.bias"], k + t[b + "attn_k.bias"], v + t[b + "attn_v.bias"]
        q = rope(q.reshape(T, n_head, hd), pos, base, style, factors)
        k = rope(k.reshape(T, n_kv, hd), pos, base, style, factors)
        v = v.reshape(T, n_kv, hd)
        rep = n_head // n_kv
        k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)  # head h uses kv head h // rep
        s = np.einsum("thd,shd->hts", q, k) / math.sqrt(hd) + mask
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        o = np.einsum("hts,shd->thd", s, v).reshape(T, n_head * hd)
        x = x + o @ t[b + "attn_output.weight"].T
        h = rms_norm(x, t[b + "ffn_norm.weight"], eps)
        g = h @ t[b + "ffn_gate.weight"].T
        u = h @ t[b + "ffn_up.weight"].T
        x = x + ((g / (1 + np.exp(-g))) * u) @ t[b + "ffn_down.weight"].T
    x = rms_norm(x, t["output_norm.weight"], eps)
    out = t.get("output.weight", t["token_embd.weight"])
    return x @ out.T


def read_gguf(path):
    import gguf

    reader = gguf.GGUFReader(path)
    tensors = {}
    for ten in reader.tensors:
        shape = tuple(int(s) for s in reversed(ten.shape))
        tensors[ten.name] = np.asarray(gguf.quants.dequantize(ten.data, ten.tensor_type), np.float32).reshape(shape)
    meta = {k: f.contents() for k, f in reader.fields.items()
            if not k.startswith("tokenizer.ggml.") and not k.startswith("GGUF.")}
    return tensors, meta


def gguf_cfg(meta):
    a = meta["general.architecture"]
    n_head = int(meta[f"{a}.attention.head_count"])
    n_embd = int(meta[f"{a}.embedding_length"])
    return {
        "arch": a, "n_layer": int(meta[f"{a}.block_count"]), "n_head": n_head,
        "n_head_kv": int(meta[f"{a}.attention.head_count_kv"]),
        "head_dim": int(meta.get(f"{a}.rope.dimension_count", n_embd // n_head)),
        "rms_eps": float(meta[f"{a}.attention.layer_norm_rms_epsilon"]),
        "rope_theta": float(meta[f"{a}.rope.freq_base"]),
    }


def hf_folder_tensors(folder):
    """HF safetensors -> llama.cpp names, *without* the Q/K permutation (HF = neox rotation)."""
    import torch
    from safetensors.torch import load_file

    cfg = json.load(open(os.path.join(folder, "config.json")))
    sd = {k: v.float().numpy() for k, v in load_file(os.path.join(folder, "model.safetensors")).items()}
    t = {"token_embd.weight": sd["model.embed_tokens.weight"], "output_norm.weight": sd["model.norm.weight"]}
    if "lm_head.weight" in sd and not cfg.get("tie_word_embeddings"):
        t["output.weight"] = sd["lm_head.weight"]
    names = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
             "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
             "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
             "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
             "self_attn.v_proj.bias": "attn_v.bias", "mlp.gate_proj.weight": "ffn_gate.weight",
             "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight"}
    for k, v in sd.items():
        if k.startswith("model.layers."):
            _, _, i, rest = k.split(".", 3)
            t[f"blk.{i}.{names[rest]}"] = v
    rs = cfg.get("rope_scaling")
    if rs and rs.get("rope_type") == "llama3":
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from make_tiny_models import llama3_rope_factors

        t["rope_freqs.weight"] = llama3_rope_factors({"rope_scaling": rs, "head_dim": cfg["head_dim"],
                                                      "rope_theta": cfg["rope_theta"]})
    hcfg = {"n_layer": cfg["num_hidden_layers"], "n_head": cfg["num_attention_heads"],
            "n_head_kv": cfg["num_key_value_heads"], "head_dim": cfg["head_dim"],
            "rms_eps": cfg["rms_norm_eps"], "rope_theta": cfg["rope_theta"]}
    return t, hcfg


# --------------------------------------------------------------------------------------------

def check_tiny():
    man = json.load(open(os.path.join(TINY, "manifest.json")))
    ids = man["input_ids"]
    for model in man["models"]:
        if model["gguf_arch"] not in ("llama", "qwen2"):
            # The numpy forward here is the Llama block only; Qwen 3 and Gemma are checked
            # against transformers by make_tiny_models.py itself and by engine/tests/tiny_models.rs.
            print(f"skip tiny {model['name']}: no numpy forward for {model['gguf_arch']}")
            continue
        for f in model["files"]:
            ref = man["references"][f["reference"]]
            want = np.fromfile(os.path.join(TINY, ref["file"]), dtype="<f4").reshape(ref["shape"])
            path = os.path.join(TINY, f["path"])
            if f["format"] == "gguf":
                t, meta = read_gguf(path)
                cfg = gguf_cfg(meta)
                style = "interleaved" if cfg["arch"] == "llama" else "neox"
                wrong = "neox" if style == "interleaved" else "interleaved"
            else:
                t, cfg = hf_folder_tensors(path)
                style, wrong = "neox", "interleaved"
            got = forward(t, cfg, ids, style)
            d = float(np.abs(got - want).max())
            check(d < TOL_TINY, f"tiny {f['path']:28s} numpy ({style}) vs reference {f['reference']}: max abs diff {d:.2e}")
            same_argmax = bool((got.argmax(-1) == want.argmax(-1)).all())
            check(same_argmax, f"tiny {f['path']:28s} argmax agrees at all {len(ids)} positions")
            dw = float(np.abs(forward(t, cfg, ids, wrong) - want).max())
            check(dw > 0.05, f"tiny {f['path']:28s} wrong rope style ({wrong}) differs by {dw:.3f}")
            if "rope_freqs.weight" in t:
                dn = float(np.abs(forward(t, cfg, ids, style, use_factors=False) - want).max())
                check(dn > 0.05, f"tiny {f['path']:28s} ignoring llama3 rope factors differs by {dn:.3f}")


def transformers_gguf_loader_report():
    """transformers' own GGUF loading of the tiny GGUFs (informational)."""
    import torch
    from transformers import AutoModelForCausalLM

    man = json.load(open(os.path.join(TINY, "manifest.json")))
    ids = torch.tensor([man["input_ids"]])
    lines = []
    for model in man["models"]:
        for f in model["files"]:
            if f["format"] != "gguf":
                continue
            ref = man["references"][f["reference"]]
            want = np.fromfile(os.path.join(TINY, ref["file"]), dtype="<f4").reshape(ref["shape"])
            try:
                m = AutoModelForCausalLM.from_pretrained(TINY, gguf_file=f["path"], dtype=torch.float32).eval()
                with torch.no_grad():
                    got = m(input_ids=ids).logits[0].numpy()
                lines.append(f"{f['path']}: max abs diff {float(np.abs(got - want).max()):.2e}")
            except Exception as e:  # informational only
                lines.append(f"{f['path']}: transformers failed: {type(e).__name__}: {str(e)[:120]}")
    print("transformers GGUF loader on the tiny GGUFs (informational):")
    for ln in lines:
        print("      " + ln)


def check_smollm(path):
    ref = json.load(open(os.path.join(FIX, "smollm2_reference.json")))
    t, meta = read_gguf(path)
    cfg = gguf_cfg(meta)
    for p in ref["prompts"] + ref.get("long_prompts", []):
        seq = p["prompt_token_ids"] + p["greedy_token_ids"]
        got = forward(t, cfg, seq, "interleaved").astype(np.float64)
        worst = 0.0
        argmax_ok = True
        for pos in p["positions"]:
            row = got[pos["pos"]]
            for tid, lg in pos["top5"]:
                worst = max(worst, abs(row[tid] - lg))
            argmax_ok &= int(row.argmax()) == pos["argmax"] or pos["top2_gap"] < 1e-3
        for det in p["logit_details"]:
            row = got[det["pos"]]
            for tid, lg in det["logits"]:
                worst = max(worst, abs(row[tid] - lg))
            worst = max(worst, abs(row.mean() - det["mean"]), abs(row.std() - det["std"]))
        check(worst < TOL_SMOLLM, f"smollm2 {p['kind']:8s} numpy forward vs transformers logits: max abs diff {worst:.2e}")
        check(argmax_ok, f"smollm2 {p['kind']:8s} numpy argmax = transformers argmax at every position")


def main():
    check_tiny()
    try:
        transformers_gguf_loader_report()
    except ImportError as e:
        print(f"skip transformers report: {e}")
    model = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("SLOTLIGHT_MODEL")
    if model:
        check_smollm(model)
    else:
        print("skip smollm2 (no model path)")
    print(f"{len(failures)} failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
