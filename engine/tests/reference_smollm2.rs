//! The default model against reference results computed by independent implementations
//! (`tests/reference/make_reference.py`: token ids from Hugging Face `tokenizers` configured
//! like SmolLM2's tokenizer.json; logits from `transformers` in float32 on the same GGUF).
//! Five short prompts and one long-context case (~1,770 prompt tokens).

mod support;

use serde_json::Value;
use slotlight_engine::model::loader::Model;

/// Largest allowed difference between our logits and the reference's, on the reference's top
/// five and the 16 fixed ids, at every compared position. The CPU kernels quantize each matmul
/// input to 8 bits per block of 32 (llama.cpp's choice, for its integer dot products); that
/// costs up to about 1.3 logits at the worst of 1,225 compared values (0.012 with the earlier
/// 16-bit activations), and about 0.18 on average; the long-context case adds 245 values
/// (worst about 1.0, mean about 0.16).
const LOGIT_TOLERANCE: f32 = 1.5;
/// Largest allowed mean difference over all compared logits, and over the long case's alone.
const MEAN_TOLERANCE: f64 = 0.25;
/// Top-1 must agree wherever the reference's top-2 gap exceeds this: stricter than the worst
/// single error, since errors that large are rare and rarely fall on the top two at once.
const TOP1_GAP: f64 = 0.5;

fn reference() -> Value {
    let text = std::fs::read_to_string(support::fixtures().join("smollm2_reference.json"))
        .expect("fixture");
    serde_json::from_str(&text).expect("json")
}

/// The short prompts (`prompts`) followed by the long-context case (`long_prompts`: one prompt of
/// ~1,770 tokens, kept apart because the serving tests run every entry of `prompts` with a
/// 1,024-token context).
fn all_prompts(r: &Value) -> Vec<&Value> {
    let mut all: Vec<&Value> = r["prompts"].as_array().expect("prompts").iter().collect();
    let long = r["long_prompts"].as_array().expect("long_prompts");
    assert!(!long.is_empty(), "the long-context case is missing");
    all.extend(long);
    all
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| u32::try_from(x.as_u64().expect("id")).expect("u32"))
        .collect()
}

#[test]
fn tokenizer_matches_reference_ids() {
    let Some(path) = support::default_model() else {
        return;
    };
    let model = Model::load(&path).expect("load");
    let r = reference();
    let mut checked = 0;
    for case in r["tokenizer_cases"].as_array().expect("cases") {
        let text = case["text"].as_str().expect("text");
        let want = ids(&case["ids"]);
        let got = model.tokenizer.encode(text, true).expect("encode");
        assert_eq!(got, want, "token ids of {text:?}");
        let back = model.tokenizer.decode(&got).expect("decode");
        assert_eq!(
            back,
            case["decoded_skip_special"].as_str().expect("decoded"),
            "decode of {text:?}"
        );
        checked += 1;
    }
    for p in all_prompts(&r) {
        let text = p["text"].as_str().expect("text");
        assert_eq!(
            model.tokenizer.encode(text, true).expect("encode"),
            ids(&p["prompt_token_ids"]),
            "{}",
            p["kind"]
        );
        checked += 1;
    }
    assert!(checked >= 30);
}

#[test]
fn chat_template_matches_reference_rendering() {
    let Some(path) = support::default_model() else {
        return;
    };
    let model = Model::load(&path).expect("load");
    let r = reference();
    let msgs: Vec<slotlight_engine::chat_template::ChatMessage> =
        serde_json::from_value(r["chat"]["messages"].clone()).expect("messages");
    let tpl = model
        .chat_template
        .as_ref()
        .expect("the model has a template");
    assert_eq!(
        tpl.render(&msgs, true).expect("render"),
        r["chat"]["rendered"].as_str().expect("rendered")
    );
}

#[test]
fn logits_match_reference_with_teacher_forcing() {
    let Some(path) = support::default_model() else {
        return;
    };
    let model = Model::load(&path).expect("load");
    let r = reference();
    let vocab = model.config.vocab;
    let mut worst = 0f32;
    let mut compared = 0;
    let mut top1_checked = 0;
    let mut flips = Vec::new();
    let mut sum_err = 0f64;
    // The long case on its own: its errors are few next to the short prompts' and would vanish
    // in the overall mean.
    let (mut long_worst, mut long_sum, mut long_compared) = (0f32, 0f64, 0u32);
    for p in all_prompts(&r) {
        let kind = p["kind"].as_str().expect("kind");
        let mut seq = ids(&p["prompt_token_ids"]);
        seq.extend(ids(&p["greedy_token_ids"]));
        let mut backend = support::cpu_backend(&model, seq.len());
        let logits = support::all_logits(&mut backend, &seq);
        let (mut kind_worst, mut kind_sum, mut kind_compared) = (0f32, 0f64, 0u32);
        let mut compare = |row: &[f32], pair: &Value| {
            let id = usize::try_from(pair[0].as_u64().expect("id")).expect("id");
            #[allow(clippy::cast_possible_truncation)]
            let want = pair[1].as_f64().expect("logit") as f32;
            let err = (row[id] - want).abs();
            kind_worst = kind_worst.max(err);
            kind_sum += f64::from(err);
            kind_compared += 1;
        };
        for pos in p["positions"].as_array().expect("positions") {
            let at = usize::try_from(pos["pos"].as_u64().expect("pos")).expect("pos");
            let row = &logits[at * vocab..(at + 1) * vocab];
            let gap = pos["top2_gap"].as_f64().expect("gap");
            let want = u32::try_from(pos["argmax"].as_u64().expect("argmax")).expect("id");
            if gap > TOP1_GAP {
                if support::argmax(row) != want {
                    flips.push(format!(
                        "{kind}: top-1 at position {at} (reference gap {gap})"
                    ));
                }
                top1_checked += 1;
            }
            for t in pos["top5"].as_array().expect("top5") {
                compare(row, t);
            }
        }
        for d in p["logit_details"].as_array().expect("details") {
            let at = usize::try_from(d["pos"].as_u64().expect("pos")).expect("pos");
            let row = &logits[at * vocab..(at + 1) * vocab];
            for pair in d["logits"].as_array().expect("logits") {
                compare(row, pair);
            }
        }
        eprintln!(
            "{kind}: {} prompt tokens, worst error {kind_worst:.4} over {kind_compared} logits, mean {:.4}",
            seq.len() - p["greedy_token_ids"].as_array().expect("greedy").len(),
            kind_sum / f64::from(kind_compared)
        );
        if kind == "long" {
            long_worst = long_worst.max(kind_worst);
            long_sum += kind_sum;
            long_compared += kind_compared;
        }
        worst = worst.max(kind_worst);
        sum_err += kind_sum;
        compared += kind_compared;
    }
    eprintln!(
        "compared {compared} logits, worst error {worst:.4}, mean {:.4} (tolerance {LOGIT_TOLERANCE}); \
         top-1 checked at {top1_checked} positions where the reference's gap exceeds {TOP1_GAP}",
        sum_err / f64::from(compared)
    );
    let long_mean = long_sum / f64::from(long_compared);
    eprintln!(
        "long-context case: worst error {long_worst:.4} over {long_compared} logits, mean {long_mean:.4}"
    );
    assert!(flips.is_empty(), "top-1 differs: {flips:#?}");
    let mean = sum_err / f64::from(compared);
    assert!(
        mean <= MEAN_TOLERANCE,
        "mean logit error {mean} exceeds {MEAN_TOLERANCE}"
    );
    assert!(
        long_mean <= MEAN_TOLERANCE,
        "mean logit error {long_mean} of the long case exceeds {MEAN_TOLERANCE}"
    );
    assert!(
        worst <= LOGIT_TOLERANCE,
        "worst logit error {worst} exceeds {LOGIT_TOLERANCE}"
    );
}
