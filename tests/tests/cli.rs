//! The `slotlight-engine` command line as users run it: `generate` (text and `--json`), and
//! bad input (missing, truncated or corrupt model files; a prompt longer than the context):
//! one clear error line naming the file or both numbers, a non-zero exit, never a panic.

use std::process::Command;

use serde_json::Value;
use slotlight_e2e::binary;

fn engine(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(binary("slotlight-engine"))
        .args(args)
        .output()
        .expect("run slotlight-engine");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn tiny() -> String {
    slotlight_engine::model::testing::TinyLlama::default()
        .write_temp()
        .to_string_lossy()
        .into_owned()
}

#[test]
fn generate_json_has_ids_text_and_timings() {
    let model = tiny();
    let (code, out, err) = engine(&[
        "generate",
        "--model",
        &model,
        "--prompt",
        "hello",
        "--max-tokens",
        "5",
        "--ignore-eos",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(out.trim()).expect("one JSON object");
    assert!(
        v["prompt_token_ids"]
            .as_array()
            .is_some_and(|a| !a.is_empty())
    );
    assert_eq!(v["token_ids"].as_array().map(Vec::len), Some(5));
    assert!(v["text"].is_string());
    assert_eq!(v["finish_reason"], "length");
    for k in ["prefill_ms", "decode_ms", "prefill_tps", "decode_tps"] {
        assert!(v["timings"][k].is_number(), "{k}: {v}");
    }
    // Streaming text mode, chat mode.
    let (code, out, err) = engine(&[
        "generate",
        "--model",
        &model,
        "--prompt",
        "hello",
        "--chat",
        "--max-tokens",
        "3",
        "--ignore-eos",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(!out.is_empty());
    // Same seed, same tokens.
    let run = |seed: &str| {
        let (_, out, _) = engine(&[
            "generate",
            "--model",
            &model,
            "--prompt",
            "abc",
            "--max-tokens",
            "8",
            "--temperature",
            "1.0",
            "--seed",
            seed,
            "--ignore-eos",
            "--json",
        ]);
        serde_json::from_str::<Value>(out.trim()).expect("json")["token_ids"].clone()
    };
    assert_eq!(run("7"), run("7"));
}

#[test]
fn bad_models_and_prompts_fail_with_one_clear_line() {
    let dir = slotlight_engine::model::testing::temp_dir("cli");
    let missing = dir.join("missing.gguf");
    let corrupt = dir.join("corrupt.gguf");
    std::fs::write(&corrupt, b"GGUF\x03\x00\x00\x00garbage").expect("write");
    let truncated = dir.join("truncated.gguf");
    let good = std::fs::read(tiny()).expect("tiny");
    std::fs::write(&truncated, &good[..good.len() / 3]).expect("write");
    for p in [&missing, &corrupt, &truncated] {
        let path = p.to_string_lossy();
        let (code, _, err) = engine(&["generate", "--model", &path, "--prompt", "x"]);
        assert_ne!(code, 0);
        assert!(!err.contains("panicked"), "{err}");
        let lines: Vec<&str> = err.lines().filter(|l| l.contains("error")).collect();
        assert_eq!(lines.len(), 1, "one error line: {err}");
        assert!(
            lines[0].contains(p.file_name().and_then(|n| n.to_str()).unwrap_or("")),
            "{err}"
        );
    }
    // A prompt longer than the context: both numbers.
    let model = tiny();
    let long = "a".repeat(400);
    let (code, _, err) = engine(&[
        "generate",
        "--model",
        &model,
        "--prompt",
        &long,
        "--ctx-size",
        "64",
    ]);
    assert_ne!(code, 0);
    assert!(err.contains("400") && err.contains("64"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    // --device cuda without CUDA: one line, no panic (or a GPU, where this build has one).
    let (code, _, err) = engine(&[
        "generate", "--model", &model, "--prompt", "x", "--device", "cuda:7",
    ]);
    assert_ne!(code, 0);
    assert!(err.contains("cuda") && !err.contains("panicked"), "{err}");
}

#[test]
fn bench_json_reports_weight_types_and_step_bytes() {
    use slotlight_engine::model::weights::DType;
    // The default tiny model (2 layers, tied, Q4_1 matrices, Q8_0 embedding, F32 norms) with
    // its keys and values in Q5_0.
    let mix = |name: &str, default: DType| {
        if name.contains("attn_k") || name.contains("attn_v") {
            DType::Q5_0
        } else {
            default
        }
    };
    let (_dir, path) = slotlight_engine::model::testing::TinyLlama::default()
        .gguf_typed(&mix, false)
        .write_temp();
    let model = path.to_string_lossy().into_owned();
    let (code, out, err) = engine(&[
        "bench",
        "--model",
        &model,
        "--prompt-tokens",
        "8",
        "--gen-tokens",
        "4",
        "--reps",
        "1",
        "--no-bandwidth",
        "--ctx-size",
        "64",
        "--threads",
        "2",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(out.trim()).expect("one JSON object");
    assert_eq!(
        v["weight_types"],
        serde_json::json!({"F32": 5, "Q4_1": 10, "Q5_0": 4, "Q8_0": 1}),
        "{v}"
    );
    // The matrices' bytes in the file: per layer q and o 2 560, k and v 1 408, gate, up and
    // down 5 120; the tied output (the embedding) 6 528. Kernel layouts may pad or repack.
    let file_bytes = 2.0 * (2.0 * 2560.0 + 2.0 * 1408.0 + 3.0 * 5120.0) + 6528.0;
    let step = v["bytes_per_decode_step"]
        .as_f64()
        .expect("bytes_per_decode_step");
    assert!(
        (0.5 * file_bytes..=2.0 * file_bytes).contains(&step),
        "{step} vs {file_bytes} in the file"
    );
    assert_eq!(v["weight_bytes_per_token"], v["bytes_per_decode_step"]);
}
