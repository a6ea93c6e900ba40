//! Our tokenizers against llama.cpp's own tokenizer tests: llama.cpp ships vocabulary-only
//! GGUFs (`models/ggml-vocab-NAME.gguf`) with inputs (`.inp`, cases separated by
//! `__ggml_vocab_test__` lines) and the ids its tokenizer gives them (`.out`, one line per case,
//! no BOS, special tokens not parsed). Point `SLOTLIGHT_LLAMACPP_VOCABS` at such a `models/`
//! folder to run it; skipped when unset (the files are llama.cpp's, not ours to ship).

use std::path::Path;

use slotlight_engine::model::gguf::GgufFile;
use slotlight_engine::model::loader::gguf_tokenizer;

/// Vocabularies whose pre-tokenizer we claim to implement exactly.
const MUST_MATCH: &[&str] = &["gpt-2", "llama-bpe", "qwen2", "llama-spm"];

fn cases(dir: &Path, name: &str) -> Option<Vec<(String, Vec<u32>)>> {
    let base = dir.join(format!("ggml-vocab-{name}.gguf"));
    let inp = std::fs::read_to_string(base.with_extension("gguf.inp")).ok()?;
    let out = std::fs::read_to_string(base.with_extension("gguf.out")).ok()?;
    let texts: Vec<&str> = inp.split("\n__ggml_vocab_test__\n").collect();
    let ids: Vec<Vec<u32>> = out
        .lines()
        .map(|l| {
            l.split_whitespace()
                .map(|t| t.parse().expect("id"))
                .collect()
        })
        .collect();
    assert_eq!(
        texts.len(),
        ids.len() + 1,
        "{name}: one empty tail after the last separator"
    );
    Some(texts.into_iter().map(str::to_owned).zip(ids).collect())
}

#[test]
fn pre_tokenizers_equal_llama_cpp_on_its_own_tests() {
    let Some(dir) = std::env::var_os("SLOTLIGHT_LLAMACPP_VOCABS") else {
        eprintln!("skipping: SLOTLIGHT_LLAMACPP_VOCABS is not set");
        return;
    };
    let dir = Path::new(&dir);
    let mut failures = Vec::new();
    for name in MUST_MATCH {
        let path = dir.join(format!("ggml-vocab-{name}.gguf"));
        let Some(cases) = cases(dir, name) else {
            failures.push(format!("{name}: no test files in {}", dir.display()));
            continue;
        };
        let g = GgufFile::open(&path).expect("open vocab");
        let tok = gguf_tokenizer(&g, &path).expect("tokenizer");
        let mut bad = 0;
        for (text, want) in &cases {
            let got = tok.encode_with(text, false, false).expect("encode");
            if &got != want {
                bad += 1;
                if bad <= 5 {
                    failures.push(format!(
                        "{name}: {text:?}\n  ours      {got:?}\n  llama.cpp {want:?}"
                    ));
                }
            }
        }
        eprintln!("{name}: {}/{} cases equal", cases.len() - bad, cases.len());
        if bad > 0 {
            failures.push(format!("{name}: {bad} of {} cases differ", cases.len()));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
