//! The default model against reference results computed by independent implementations
//! (`tests/reference/make_reference.py`: token ids from Hugging Face `tokenizers` configured
//! like SmolLM2's tokenizer.json; logits from `transformers` in float32 on the same GGUF).

mod support;

use serde_json::Value;
use slotlight_engine::model::loader::Model;

/// Largest allowed difference between our logits and the reference's, on the reference's top
/// five and the 16 fixed ids, at every compared position. The CPU kernels quantize each matmul
/// input to 8 bits per block of 32 (llama.cpp's choice, for its integer dot products); that
/// costs up to about 1.3 logits at the worst of 1,225 compared values (0.012 with the earlier
/// 16-bit activations), and about 0.18 on average.
const LOGIT_TOLERANCE: f32 = 1.5;
/// Largest allowed mean difference over all compared logits.
const MEAN_TOLERANCE: f64 = 0.25;
/// Top-1 must agree wherever the reference's top-2 gap exceeds this: stricter than the worst
/// single error, since errors that large are rare and rarely fall on the top two at once.
const TOP1_GAP: f64 = 0.5;

fn reference() -> Value {
    let text = std::fs::read_to_string(support::fixtures().join("smollm2_reference.json"))
        .expect("fixture");
    serde_json::from_str(&text).expect("json")
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
    for p in r["prompts"].as_array().expect("prompts") {
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
    for p in r["prompts"].as_array().expect("prompts") {
        let kind = p["kind"].as_str().expect("kind");
        let mut seq = ids(&p["prompt_token_ids"]);
        seq.extend(ids(&p["greedy_token_ids"]));
        let mut backend = support::cpu_backend(&model, seq.len());
        let logits = support::all_logits(&mut backend, &seq);
        for pos in p["positions"].as_array().expect("positions") {
            let at = usize::try_from(pos["pos"].as_u64().expect("pos")).expect("pos");
            let row = &logits[at * vocab..(at + 1) * vocab];
            let gap = pos["top2_gap"].as_f64().expect("gap");
            let want = u32::try_from(pos["argmax"].as_u64().expect("argmax")).expect("id");
            if gap > TOP1_GAP {
                if support::argmax(row) != want {
                    flips.push(format!("{kind}: top-1 at position {at} (reference gap {gap})"));
                }
                top1_checked += 1;
            }
            for t in pos["top5"].as_array().expect("top5") {
                let id = usize::try_from(t[0].as_u64().expect("id")).expect("id");
                #[allow(clippy::cast_possible_truncation)]
                let want = t[1].as_f64().expect("logit") as f32;
                let err = (row[id] - want).abs();
                worst = worst.max(err);
                sum_err += f64::from(err);
                compared += 1;
            }
        }
        for d in p["logit_details"].as_array().expect("details") {
            let at = usize::try_from(d["pos"].as_u64().expect("pos")).expect("pos");
            let row = &logits[at * vocab..(at + 1) * vocab];
            for pair in d["logits"].as_array().expect("logits") {
                let id = usize::try_from(pair[0].as_u64().expect("id")).expect("id");
                #[allow(clippy::cast_possible_truncation)]
                let want = pair[1].as_f64().expect("logit") as f32;
                let err = (row[id] - want).abs();
                worst = worst.max(err);
                sum_err += f64::from(err);
                compared += 1;
            }
        }
    }
    eprintln!(
        "compared {compared} logits, worst error {worst:.4}, mean {:.4} (tolerance {LOGIT_TOLERANCE}); \
         top-1 checked at {top1_checked} positions where the reference's gap exceeds {TOP1_GAP}",
        sum_err / f64::from(compared)
    );
    assert!(flips.is_empty(), "top-1 differs: {flips:#?}");
    let mean = sum_err / f64::from(compared);
    assert!(
        mean <= MEAN_TOLERANCE,
        "mean logit error {mean} exceeds {MEAN_TOLERANCE}"
    );
    assert!(
        worst <= LOGIT_TOLERANCE,
        "worst logit error {worst} exceeds {LOGIT_TOLERANCE}"
    );
}
