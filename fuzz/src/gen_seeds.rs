//! Writes the seed corpus of every target into `corpus/<target>/` (small, committed):
//! `cargo run --release --features gen-seeds --bin gen-seeds` from `fuzz/`.

use std::io::Write;
use std::path::Path;

use prost::Message;
use slotlight_engine::model::testing::{GgufBuilder, TinyLlama};
use slotlight_engine::model::weights::DType;
use slotlight_sidecar::tools::synth;

fn put(target: &str, name: &str, bytes: &[u8]) {
    let dir = Path::new("corpus").join(target);
    std::fs::create_dir_all(&dir).expect("corpus dir");
    std::fs::write(dir.join(name), bytes).expect("write seed");
}

fn gz(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(data).expect("gzip");
    e.finish().expect("gzip")
}

fn main() {
    // Request bodies: chat and completions, stop lists, sampling values, unicode, parts.
    let requests = [
        r#"{"messages":[{"role":"user","content":"Hello"}]}"#,
        r#"{"model":"m","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"héllo 👋 <|im_end|> {{ x }}"}],"max_tokens":16,"temperature":0.7,"top_p":0.9,"top_k":40,"min_p":0.05,"repetition_penalty":1.1,"presence_penalty":0.5,"frequency_penalty":-0.5,"seed":-1,"stop":["\n\n","END","👋"],"stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true},"user":"u1","n":1}"#,
        r#"{"messages":[{"role":"developer","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},{"role":"assistant","content":null,"name":"x"},{"role":"tool","content":"r"}],"max_completion_tokens":1,"stop":"x"}"#,
        r#"{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}],"n":2,"max_tokens":0}"#,
        r#"{"prompt":"The sky is","max_tokens":8,"stop":["a","ab","abc"],"ignore_eos":true}"#,
        r#"{"prompt":["one"],"temperature":0}"#,
        r#"{"prompt":[1,2,3,4294967295],"max_tokens":1e400}"#,
        r#"{"prompt":"x","stop":["","y"],"top_p":-1,"temperature":"NaN"}"#,
    ];
    for (i, r) in requests.iter().enumerate() {
        put("request", &format!("seed{i}.json"), r.as_bytes());
    }

    // Responses bodies: strings and items, calls and outputs, reasoning, hosted tools.
    let responses = [
        r#"{"model":"m","input":"Hello","instructions":"Be brief.","max_output_tokens":16}"#,
        r#"{"input":[{"role":"developer","content":"a"},{"type":"message","role":"user","content":[{"type":"input_text","text":"b"}]},{"type":"reasoning","id":"rs_1","summary":[],"encrypted_content":"sl168690a"},{"type":"function_call","call_id":"call_1","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"call_1","output":[{"type":"input_text","text":"ok"}]}],"tools":[{"type":"function","name":"f","parameters":{"type":"object"}},{"type":"web_search"},{"type":"namespace","name":"n","tools":[]}],"tool_choice":{"type":"function","name":"f"},"parallel_tool_calls":true,"stream":true,"store":false,"include":["reasoning.encrypted_content"],"prompt_cache_key":"k","reasoning":{"effort":"low","summary":"auto"}}"#,
        r#"{"input":"x","text":{"format":{"type":"json_schema","name":"n","schema":{"type":"object"},"strict":true},"verbosity":"low"},"truncation":"auto","metadata":{"a":"b"},"prompt_cache_options":{"comparison_response_id":"resp_1","prewarm":true,"ttl":"30m"},"previous_response_id":"resp_0"}"#,
        r#"{"input":[{"type":"input_image"},{"role":"user","content":[{"type":"input_file"}]}],"conversation":{"id":"c"},"top_logprobs":21}"#,
    ];
    for (i, r) in responses.iter().enumerate() {
        put("responses", &format!("seed{i}.json"), r.as_bytes());
    }

    // Messages bodies: Claude Code's shape, blocks of every kind, tools, thinking, errors.
    let messages = [
        r##"{"model":"m","max_tokens":32000,"stream":true,"system":[{"type":"text","text":"billing"},{"type":"text","text":"You are an agent.","cache_control":{"type":"ephemeral"}}],"messages":[{"role":"user","content":[{"type":"text","text":"<system-reminder>r</system-reminder>"},{"type":"text","text":"Say hello.","cache_control":{"type":"ephemeral","ttl":"1h"}}]},{"role":"system","content":"# Environment"}],"tools":[{"name":"Bash","description":"Run","input_schema":{"type":"object","properties":{"command":{"type":"string"}}}},{"name":"Later","input_schema":{"type":"object"},"defer_loading":true}],"metadata":{"user_id":"{\"device_id\":\"d\",\"session_id\":\"s\"}"},"thinking":{"type":"adaptive","display":"omitted"},"context_management":{"edits":[{"type":"clear_thinking_20251015","keep":"all"}]},"output_config":{"effort":"high"}}"##,
        r##"{"max_tokens":8,"messages":[{"role":"user","content":"a"},{"role":"user","content":[{"type":"text","text":"b"}]},{"role":"assistant","content":[{"type":"thinking","thinking":"t","signature":"sl1.00"},{"type":"redacted_thinking","data":"x"},{"type":"text","text":"calling"},{"type":"tool_use","id":"toolu_1","name":"f","input":{"x":1}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":[{"type":"text","text":"42"},{"type":"tool_reference","tool_name":"g"}],"is_error":true},{"type":"text","text":"go on"}]}],"tools":[{"name":"f","input_schema":{"type":"object"}},{"type":"web_search_20250305","name":"web_search"}],"tool_choice":{"type":"tool","name":"f","disable_parallel_tool_use":true}}"##,
        r##"{"max_tokens":0,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AA=="}}]}],"stop_sequences":["\n\n","END"],"temperature":0.5,"top_p":0.9,"top_k":-1}"##,
        r##"{"max_tokens":4,"messages":[{"role":"user","content":"x"},{"role":"assistant","content":"The answer is ("}],"thinking":{"type":"enabled","budget_tokens":1024},"output_config":{"format":{"type":"json_schema","schema":{"type":"object"}}},"diagnostics":{"previous_message_id":"msg_1"}}"##,
        r##"{"messages":[{"role":"user","content":"count me"}],"compaction":{},"thread":{"type":"continue","previous_message_id":"msg_1"},"service_tier":"priority","unknown":1}"##,
    ];
    for (i, r) in messages.iter().enumerate() {
        put("messages", &format!("seed{i}.json"), r.as_bytes());
    }

    // GGUF: a whole tiny model (template, vocabulary, weights), and a few bare headers.
    let tiny = TinyLlama {
        hidden: 32,
        heads: 2,
        kv_heads: 1,
        ffn: 64,
        layers: 1,
        vocab: 40,
        context: 64,
        dtype: DType::Q4_0,
        ..TinyLlama::default()
    };
    put("gguf", "tiny-model.gguf", &tiny.gguf().bytes());
    let mut b = GgufBuilder::new();
    b.kv_str("general.architecture", "llama");
    b.kv_u32("general.alignment", 64);
    b.kv_str_array("tokenizer.ggml.tokens", &["a", "b", "ab"]);
    b.kv_str_array("tokenizer.ggml.merges", &["a b"]);
    b.tensor_f32("x", &[2, 2], &[1.0, 2.0, 3.0, 4.0]);
    put("gguf", "small.gguf", &b.bytes());
    let mut b = GgufBuilder::new();
    b.kv_str("tokenizer.ggml.model", "llama");
    b.kv_str_array(
        "tokenizer.ggml.tokens",
        &["<unk>", "<s>", "</s>", "▁a", "▁", "a"],
    );
    b.tensor_raw("q", &[32], 2, &[0u8; 18]);
    put("gguf", "spm.gguf", &b.bytes());

    // OTLP: whole engine requests on the solo path and in a slot, with several windows, plus
    // one whose parent ids point at each other (a cycle) and one with a duplicated span.
    let solo = synth::whole_request("req-solo", 1, 1_700_000_000_000_000_000, None, 2, 3);
    let slot = synth::whole_request("req-slot", 2, 1_700_000_000_100_000_000, Some(3), 3, 4);
    let mut cyclic = synth::whole_request("req-cyc", 3, 1_700_000_000_200_000_000, Some(1), 1, 2);
    let n = cyclic.len();
    for i in 0..n {
        let next = cyclic[(i + 1) % n].span_id.clone();
        cyclic[i].parent_span_id = next;
    }
    let mut dup = synth::whole_request("req-dup", 4, 1_700_000_000_300_000_000, Some(0), 1, 1);
    dup.extend(dup.clone());
    dup.reverse();
    let protos = [
        ("solo", synth::export("inst-a", solo)),
        ("slot", synth::export("inst-a", slot)),
        ("cyclic", synth::export("inst-b", cyclic)),
        ("dup-reversed", synth::export("inst-b", dup)),
    ];
    for (name, req) in &protos {
        let bytes = req.encode_to_vec();
        put("otlp_proto", &format!("{name}.pb"), &bytes);
        put(
            "otlp_json",
            &format!("{name}.json"),
            &serde_json::to_vec(req).expect("json"),
        );
        let mut g = 4096u16.to_le_bytes().to_vec();
        g.extend(gz(&bytes));
        put("gzip", &format!("{name}.gz"), &g);
    }
    // A small bomb: 1 MiB of zeros against a 4 KiB limit.
    let mut g = 4096u16.to_le_bytes().to_vec();
    g.extend(gz(&vec![0u8; 1 << 20]));
    put("gzip", "bomb.gz", &g);
}
