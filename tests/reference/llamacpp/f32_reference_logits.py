# Usage: f32_reference_logits.py FILE "[ids]" (needs the PyPI packages gguf and numpy).
"""Float32 reference for a llama-architecture GGUF: every tensor dequantized with gguf-py, the
forward pass in numpy. Prints the top-5 log-probabilities of the next token after the given ids."""
import sys, json, numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize
path, ids = sys.argv[1], json.loads(sys.argv[2])
r = GGUFReader(path)
T = {}
for t in r.tensors:
    a = dequantize(t.data, t.tensor_type).astype(np.float32)
    T[t.name] = a.reshape([int(x) for x in reversed(t.shape)]) if a.ndim == 1 and len(t.shape) > 1 else a
def kv(k):
    f = r.fields[k]; return f.parts[f.data[0]][0]
L = int(kv("llama.block_count")); H = int(kv("llama.attention.head_count")); KH = int(kv("llama.attention.head_count_kv"))
eps = float(kv("llama.attention.layer_norm_rms_epsilon")); base = float(kv("llama.rope.freq_base"))
emb = T["token_embd.weight"]; D = emb.shape[1]; hd = D // H
out = T.get("output.weight", emb)
def rms(x, w): return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w
n = len(ids); x = emb[ids].astype(np.float64)
pos = np.arange(n)[:, None]; inv = base ** (-np.arange(0, hd, 2) / hd); ang = pos * inv
cos, sin = np.cos(ang), np.sin(ang)
def rope(v):  # v: n, heads, hd ; interleaved pairs
    a, b = v[..., 0::2], v[..., 1::2]
    o = np.empty_like(v); o[..., 0::2] = a * cos[:, None] - b * sin[:, None]; o[..., 1::2] = a * sin[:, None] + b * cos[:, None]; return o
mask = np.triu(np.full((n, n), -np.inf), 1)
for l in range(L):
    p = f"blk.{l}."
    h = rms(x, T[p + "attn_norm.weight"])
    q = (h @ T[p + "attn_q.weight"].T).reshape(n, H, hd); k = (h @ T[p + "attn_k.weight"].T).reshape(n, KH, hd)
    v = (h @ T[p + "attn_v.weight"].T).reshape(n, KH, hd)
    q, k = rope(q), rope(k); g = H // KH
    k = np.repeat(k, g, axis=1); v = np.repeat(v, g, axis=1)
    s = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(hd) + mask
    s = np.exp(s - s.max(-1, keepdims=True)); s /= s.sum(-1, keepdims=True)
    a = np.einsum("hqk,khd->qhd", s, v).reshape(n, D)
    x = x + a @ T[p + "attn_output.weight"].T
    h = rms(x, T[p + "ffn_norm.weight"])
    gt = h @ T[p + "ffn_gate.weight"].T; up = h @ T[p + "ffn_up.weight"].T
    x = x + ((gt / (1 + np.exp(-gt))) * up) @ T[p + "ffn_down.weight"].T
z = rms(x[-1], T["output_norm.weight"]) @ out.T
lp = z - z.max() - np.log(np.exp(z - z.max()).sum())
top = np.argsort(-lp)[:5]
print(json.dumps({int(i): float(lp[i]) for i in top}))
