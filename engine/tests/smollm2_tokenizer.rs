//! SmolLM2's tokenizer and chat template, loaded from the GGUF the way the engine loads them,
//! against the reference in `fixtures/smollm2_reference.json` (ids from Python `tokenizers`,
//! the prompt rendered by Jinja2 as `transformers` does).
//!
//! Needs the model file (`SLOTLIGHT_MODEL`, else the model cache). Without it the test prints a
//! note and passes, or fails under `SLOTLIGHT_REQUIRE_MODEL=1` (as in CI).

mod support;

use std::path::Path;

use anyhow::{Context, Result, ensure};
use serde_json::Value;
use slotlight_engine::chat_template::ChatMessage;
use slotlight_engine::model::loader::Model;
use slotlight_engine::tokenizer::Tokenizer;

fn reference() -> Result<Value> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/smollm2_reference.json");
    let text = std::fs::read_to_string(&path).context("reading the reference fixture")?;
    Ok(serde_json::from_str(&text)?)
}

fn ids(v: &Value) -> Result<Vec<u32>> {
    v.as_array()
        .context("expected an array of ids")?
        .iter()
        .map(|x| {
            x.as_u64()
                .and_then(|x| u32::try_from(x).ok())
                .context("expected a token id")
        })
        .collect()
}

fn text(v: &Value) -> Result<&str> {
    v.as_str().context("expected a string")
}

/// Streams `generated` after `context` and returns the concatenated deltas.
fn stream(tok: &Tokenizer, context: &[u32], generated: &[u32]) -> Result<String> {
    let mut d = tok.decoder_after(context);
    let mut out = String::new();
    for &id in generated {
        out.push_str(&d.push(id)?);
    }
    out.push_str(&d.flush());
    Ok(out)
}

#[test]
fn smollm2_tokenizer_and_template_match_the_reference() -> Result<()> {
    // The default model (`SLOTLIGHT_MODEL`, else the cache); a missing one fails the test
    // under `SLOTLIGHT_REQUIRE_MODEL=1` instead of skipping it.
    let Some(model_path) = support::default_model() else {
        return Ok(());
    };
    let model = Model::load(&model_path)?;
    let tok = &model.tokenizer;
    let r = reference()?;

    // Special ids and stop tokens.
    ensure!(
        tok.vocab_size() == 49_152,
        "vocabulary size {}",
        tok.vocab_size()
    );
    ensure!(tok.bos_id() == Some(1) && tok.eos_id() == Some(2));
    ensure!(!tok.add_bos(), "SmolLM2 adds no BOS");
    ensure!(
        tok.stop_token_ids() == [2, 0],
        "stop ids {:?}",
        tok.stop_token_ids()
    );
    for pair in r["special_tokens"].as_array().context("special_tokens")? {
        let id = u32::try_from(pair[0].as_u64().context("id")?)?;
        ensure!(tok.token_str(id).as_deref() == Some(text(&pair[1])?));
    }

    // Tokenizer cases: ids, decoding with and without special tokens, streaming.
    let cases = r["tokenizer_cases"].as_array().context("tokenizer_cases")?;
    ensure!(!cases.is_empty());
    for case in cases {
        let input = text(&case["text"])?;
        let want = ids(&case["ids"])?;
        let got = tok.encode(input, true)?;
        ensure!(got == want, "{input:?}: got {got:?}, want {want:?}");
        ensure!(
            tok.decode_with(&want, false)? == text(&case["decoded"])?,
            "{input:?}"
        );
        let plain = tok.decode(&want)?;
        ensure!(plain == text(&case["decoded_skip_special"])?, "{input:?}");
        ensure!(stream(tok, &[], &want)? == plain, "{input:?}: streaming");
    }

    // Prompts (prose, code, digits, unicode, chat) and their greedy continuations.
    for p in r["prompts"].as_array().context("prompts")? {
        let input = text(&p["text"])?;
        let prompt = ids(&p["prompt_token_ids"])?;
        ensure!(tok.encode(input, true)? == prompt, "prompt {:?}", p["kind"]);
        let greedy = ids(&p["greedy_token_ids"])?;
        ensure!(tok.decode_with(&greedy, false)? == text(&p["greedy_text"])?);
        let mut all = prompt.clone();
        all.extend(&greedy);
        let whole = tok.decode(&all)?;
        let before = tok.decode(&prompt)?;
        let added = whole.strip_prefix(before.as_str()).context("prefix")?;
        ensure!(
            stream(tok, &prompt, &greedy)? == added,
            "stream {:?}",
            p["kind"]
        );
    }

    // The chat template renders the reference prompt, which encodes to the reference ids.
    let chat = &r["chat"];
    let messages: Vec<ChatMessage> = serde_json::from_value(chat["messages"].clone())?;
    let template = model
        .chat_template
        .as_ref()
        .context("SmolLM2 ships a chat template")?;
    let add_generation_prompt = chat["add_generation_prompt"].as_bool().unwrap_or(true);
    let rendered = template.render(&messages, add_generation_prompt)?;
    ensure!(
        rendered == text(&chat["rendered"])?,
        "rendered {rendered:?}"
    );
    let chat_prompt = r["prompts"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["kind"] == "chat"))
        .context("a chat prompt")?;
    ensure!(tok.encode(&rendered, true)? == ids(&chat_prompt["prompt_token_ids"])?);
    Ok(())
}

/// `export-tokenizer` writes a `tokenizer.json` that a router loading it with the `tokenizers`
/// library encodes exactly as the engine does (the inference gateway's scorer hashes those ids).
#[test]
fn the_exported_tokenizer_json_encodes_as_the_engine_does() -> Result<()> {
    let Some(model_path) = support::default_model() else {
        return Ok(());
    };
    let dir = std::env::temp_dir().join(format!("slotlight-export-tok-{}", std::process::id()));
    let out = dir.join("slotlight/tokenizer.json");
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_slotlight-engine"))
        .arg("export-tokenizer")
        .arg("--model")
        .arg(&model_path)
        .arg("--out")
        .arg(&out)
        .stdout(std::process::Stdio::null())
        .status()?;
    ensure!(status.success(), "export-tokenizer failed: {status}");
    let exported = tokenizers::Tokenizer::from_file(&out).map_err(|e| anyhow::anyhow!("{e}"))?;
    std::fs::remove_dir_all(&dir).ok();
    let engine = Model::load_tokenizer(&model_path)?;
    let r = reference()?;
    let cases = r["tokenizer_cases"].as_array().context("tokenizer_cases")?;
    let prompts = r["prompts"].as_array().context("prompts")?;
    let texts = cases
        .iter()
        .map(|c| text(&c["text"]))
        .chain(prompts.iter().map(|p| text(&p["text"])))
        .collect::<Result<Vec<_>>>()?;
    ensure!(!texts.is_empty());
    for input in texts {
        let theirs = exported
            .encode(input, true)
            .map_err(|e| anyhow::anyhow!("{e}"))?
            .get_ids()
            .to_vec();
        ensure!(
            theirs == engine.encode(input, true)?,
            "{input:?}: the exported tokenizer encodes differently"
        );
    }
    Ok(())
}
