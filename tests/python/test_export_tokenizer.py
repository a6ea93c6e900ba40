"""`slotlight-engine export-tokenizer`, as a router loads it: the folder it writes loads with
`transformers`' `AutoTokenizer` (as llm-d's precise prefix-cache scorer loads a local
tokenizer), and the tokens it gives for a chat (`apply_chat_template`) and for a completion
prompt are exactly the tokens the engine itself computes (`/tokenize`, and the render API a
router may ask instead), so the router's block keys and the engine's prefix cache describe the
same tokens."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from procs import EngineProcess, binary, default_model, require_model

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

CHATS = [
    [{"role": "user", "content": "Hello there, what is 2+2?"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a colour."}],
    [
        {"role": "user", "content": "Write a haiku about rust."},
        {"role": "assistant", "content": "Iron wakes in rain,\nred bloom on the garden gate."},
        {"role": "user", "content": "Now one about 🦀 crabs — in français, s'il vous plaît."},
    ],
    [{"role": "user", "content": "  spaces  \n\ttabs and <|im_end|> typed by a user"}],
]
PROMPTS = ["Once upon a time", " leading space", "émoji 🙂 中文\nnew line", "a1234b  x"]


# The default model (ChatML, no BOS) and, when fetched, Gemma 3 270M (its own template, BOS
# added by encoding): `slotlight-engine fetch-model gemma3-270m`.
GEMMA = default_model().parent / "gemma-3-270m-q4_k_m.gguf"


@pytest.fixture(scope="module", params=["default", "gemma3-270m"])
def model(request) -> Path:
    if request.param == "default":
        require_model()
        return default_model()
    if not GEMMA.exists():
        pytest.skip("Gemma 3 270M is not fetched (`slotlight-engine fetch-model gemma3-270m`)")
    return GEMMA


@pytest.fixture(scope="module")
def exported(tmp_path_factory, model):
    out = tmp_path_factory.mktemp("tokenizers") / "slotlight" / "tokenizer.json"
    engine_bin = binary("slotlight-engine", "SLOTLIGHT_ENGINE_BIN")
    r = subprocess.run([str(engine_bin), "export-tokenizer", "--model", str(model), "--out", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert (out.parent / "tokenizer_config.json").exists()
    return transformers.AutoTokenizer.from_pretrained(str(out.parent))


@pytest.fixture(scope="module")
def engine(model):
    e = EngineProcess(model=model)
    yield e
    e.close()


def ids(x) -> list[int]:
    """`apply_chat_template` answers a list, or a BatchEncoding in some versions."""
    return list(x["input_ids"] if hasattr(x, "keys") else x)


@pytest.mark.parametrize("chat", CHATS, ids=range(len(CHATS)))
def test_a_chat_tokenizes_as_the_engine_tokenizes_it(exported, engine, chat):
    theirs = ids(exported.apply_chat_template(chat, add_generation_prompt=True, tokenize=True))
    status, ours = engine.post("/tokenize", {"messages": chat})
    assert status == 200, ours
    assert theirs == ours["tokens"]
    # A router that asks the engine's render API instead (llm-d's token producer) gets the
    # same tokens for the whole chat body.
    status, rendered = engine.post("/v1/chat/completions/render", {"messages": chat, "max_tokens": 8, "stream": True})
    assert status == 200, rendered
    assert rendered["token_ids"] == theirs
    # The same holds for a conversation the engine continues without a generation prompt.
    theirs = ids(exported.apply_chat_template(chat, add_generation_prompt=False, tokenize=True))
    status, ours = engine.post("/tokenize", {"messages": chat, "add_generation_prompt": False})
    assert status == 200, ours
    assert theirs == ours["tokens"]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_a_completion_prompt_tokenizes_as_the_engine_tokenizes_it(exported, engine, prompt):
    for special in (True, False):
        theirs = exported(prompt, add_special_tokens=special)["input_ids"]
        status, ours = engine.post("/tokenize", {"prompt": prompt, "add_special_tokens": special})
        assert status == 200, ours
        assert theirs == ours["tokens"], special
    status, rendered = engine.post("/v1/completions/render", {"prompt": prompt, "max_tokens": 8})
    assert status == 200, rendered
    assert rendered[0]["token_ids"] == exported(prompt)["input_ids"]


def test_decoding_gives_the_same_text(exported, engine):
    assert exported.eos_token and exported.bos_token
    chat = CHATS[1]
    toks = ids(exported.apply_chat_template(chat, add_generation_prompt=True, tokenize=True))
    status, back = engine.post("/detokenize", {"tokens": toks})
    assert status == 200, back
    # `/detokenize` keeps special tokens, as vLLM's does.
    assert exported.decode(toks, skip_special_tokens=False) == back["prompt"]
