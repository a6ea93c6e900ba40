#!/usr/bin/env python3
"""Writes a `qwen3moe` GGUF of Qwen3-30B-A3B's shape with random weights and the default model's
tokenizer: the mixture-of-experts counterpart of the shared `shaped-model.py` (issue 38), so decode
speed can be compared with llama.cpp at the size agents run. The text it generates is noise; its
cost per token is the real shape's.

    python scripts/shaped-moe.py OUT.gguf [--layers N] [--tokenizer-from FILE.gguf]

Shape (Qwen3-30B-A3B): 2048 hidden, 48 layers, 32 query heads and 4 KV heads of 128, 128 experts of
768 hidden units, 8 per token, q/k norms. `--layers` keeps the first N layers (every layer costs the
same, so a quarter of the depth decodes four times as fast and fits a small machine's disk: at
12 layers the file is about 4 GB in Q8_0). The vocabulary is the tokenizer's (SmolLM2's 49,152).
The matrices are written as Q8_0 with random codes and scales (no float copy is ever made);
requantize with llama.cpp's `llama-quantize --allow-requantize OUT.gguf OUT-Q4_K_M.gguf Q4_K_M`.
Needs `pip install gguf numpy`.
"""
import argparse
import subprocess
import sys

import numpy as np
import gguf

HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM = 2048, 48, 32, 4, 128
EXPERTS, USED, EXPERT_FFN = 128, 8, 768


def copy_tokenizer(src, w):
    """Copies `src`'s tokenizer.* metadata into `w`; returns the vocabulary size."""
    r = gguf.GGUFReader(src)
    vocab = None
    for name, f in r.fields.items():
        if not name.startswith("tokenizer."):
            continue
        t = f.types[0]
        if t == gguf.GGUFValueType.ARRAY:
            if f.types[1] == gguf.GGUFValueType.STRING:
                vals = [bytes(f.parts[i]).decode("utf-8", "surrogateescape") for i in f.data]
            else:
                vals = [f.parts[i].tolist()[0] for i in f.data]
            w.add_array(name, vals)
            if name == "tokenizer.ggml.tokens":
                vocab = len(vals)
        elif t == gguf.GGUFValueType.STRING:
            w.add_string(name, bytes(f.parts[f.data[0]]).decode("utf-8"))
        else:
            v = f.parts[f.data[0]].tolist()[0]
            {gguf.GGUFValueType.UINT32: w.add_uint32, gguf.GGUFValueType.INT32: w.add_int32,
             gguf.GGUFValueType.BOOL: w.add_bool, gguf.GGUFValueType.FLOAT32: w.add_float32,
             gguf.GGUFValueType.UINT64: w.add_uint64}.get(t, w.add_uint32)(name, v)
    if vocab is None:
        sys.exit("no tokenizer.ggml.tokens in " + src)
    return vocab


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=LAYERS)
    ap.add_argument("--tokenizer-from", help="a GGUF whose tokenizer.* metadata is copied")
    a = ap.parse_args()
    src = a.tokenizer_from or subprocess.run(
        ["target/release/slotlight-engine", "fetch-model"], capture_output=True, text=True, check=True
    ).stdout.strip()
    arch = "qwen3moe"
    w = gguf.GGUFWriter(a.out, arch)
    vocab = copy_tokenizer(src, w)
    h, L = HIDDEN, a.layers
    w.add_name(f"shaped-qwen3-30b-a3b-{L}-layers-random")
    w.add_context_length(8192)
    w.add_embedding_length(h)
    w.add_block_count(L)
    w.add_feed_forward_length(6144)
    w.add_expert_feed_forward_length(EXPERT_FFN)
    w.add_expert_count(EXPERTS)
    w.add_expert_used_count(USED)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_vocab_size(vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    rng = np.random.default_rng(0)

    def q8(*shape):
        """Random Q8_0 blocks of a matrix `shape` (outermost first): f16 scale, 32 int8 codes."""
        rows = int(np.prod(shape[:-1]))
        blocks = rows * shape[-1] // 32
        d = np.full((blocks, 1), 0.02 / 64, np.float16).view(np.uint8)
        qs = rng.integers(-127, 128, size=(blocks, 32), dtype=np.int8).view(np.uint8)
        raw = np.concatenate([d, qs], axis=1).reshape(*shape[:-1], shape[-1] // 32 * 34)
        return raw

    def add_q8(name, *shape):
        w.add_tensor(name, q8(*shape), raw_dtype=gguf.GGMLQuantizationType.Q8_0)

    ones = lambda n: np.ones(n, np.float32)
    add_q8("token_embd.weight", vocab, h)
    for i in range(L):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", ones(h))
        add_q8(p + "attn_q.weight", HEADS * HEAD_DIM, h)
        add_q8(p + "attn_k.weight", KV_HEADS * HEAD_DIM, h)
        add_q8(p + "attn_v.weight", KV_HEADS * HEAD_DIM, h)
        w.add_tensor(p + "attn_q_norm.weight", ones(HEAD_DIM))
        w.add_tensor(p + "attn_k_norm.weight", ones(HEAD_DIM))
        add_q8(p + "attn_output.weight", h, HEADS * HEAD_DIM)
        w.add_tensor(p + "ffn_norm.weight", ones(h))
        w.add_tensor(p + "ffn_gate_inp.weight",
                     (rng.standard_normal((EXPERTS, h), dtype=np.float32) * 0.02))
        add_q8(p + "ffn_gate_exps.weight", EXPERTS, EXPERT_FFN, h)
        add_q8(p + "ffn_up_exps.weight", EXPERTS, EXPERT_FFN, h)
        add_q8(p + "ffn_down_exps.weight", EXPERTS, h, EXPERT_FFN)
    w.add_tensor("output_norm.weight", ones(h))
    add_q8("output.weight", vocab, h)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(a.out)


if __name__ == "__main__":
    main()
