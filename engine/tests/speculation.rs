//! Speculative decoding on the real models (SmolLM2-135M, the default, and Gemma 3 270M when
//! fetched): drafts from the prompt and reply (prompt lookup) and from a prediction are
//! verified exactly, so greedy output is the same tokens with drafts and without, alone and in
//! batch slots (each sequence its own draft, beside the others' plain decodes), across a move
//! from the solo path into a slot, after a preemption, under a grammar, with stop strings,
//! logprobs and `n`; and the positions of rejected draft tokens never reach the prefix cache.
//! Seeded sampling gives the same tokens with drafts and without, at any batch size and under
//! load.
//!
//! Regression tests for issue 33 ("Agents rewrite what they read"), items 1 and 2.

mod support;

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use slotlight_engine::chat_template::{ChatMessage, Role};
use slotlight_engine::constraint::{Compiler, GrammarSpec};
use slotlight_engine::model::loader::Model;
use slotlight_engine::prompt::PromptBuilder;
use slotlight_engine::runtime::{self, RuntimeConfig};
use slotlight_engine::sampling::SamplingParams;
use slotlight_engine::scheduler::{
    Completion, EngineHandle, Event, FinishReason, GenerateRequest, SchedulerConfig,
};
use slotlight_engine::speculation::{SpeculationConfig, SpeculationMode};
use slotlight_engine::stop::StopMatcher;
use slotlight_engine::timing::{LegEnd, PathKind};

/// The code file of the benchmark, cut to its first 45 lines (a rename of a function that
/// appears twice in them).
fn code_excerpt() -> String {
    include_str!("../../tests/bench/speculative/inventory.py")
        .lines()
        .take(45)
        .collect::<Vec<_>>()
        .join("\n")
}

fn default_model() -> Option<&'static Model> {
    static MODEL: OnceLock<Option<Model>> = OnceLock::new();
    MODEL
        .get_or_init(|| support::default_model().map(|p| Model::load(&p).expect("load")))
        .as_ref()
}

fn gemma_model() -> Option<&'static Model> {
    static MODEL: OnceLock<Option<Model>> = OnceLock::new();
    MODEL
        .get_or_init(|| {
            let p: PathBuf = std::env::var_os("SLOTLIGHT_GEMMA_MODEL")
                .map(PathBuf::from)
                .unwrap_or_else(|| slotlight_engine::known_models::GEMMA3_270M.path());
            if !p.exists() {
                if std::env::var("SLOTLIGHT_REQUIRE_MODEL").is_ok_and(|v| v == "1") {
                    panic!("Gemma 3 270M is required but missing at {}", p.display());
                }
                eprintln!("skipping Gemma 3 270M: not at {}", p.display());
                return None;
            }
            Some(Model::load(&p).expect("load Gemma 3 270M"))
        })
        .as_ref()
}

/// Drafts from the prompt and reply, at most `k` tokens each.
fn ngram(k: usize) -> SpeculationConfig {
    SpeculationConfig {
        max_tokens: k,
        ..SpeculationConfig::default()
    }
}

/// No drafts at all, a prediction included.
fn none() -> SpeculationConfig {
    SpeculationConfig {
        max_tokens: 0,
        ..SpeculationConfig::off()
    }
}

fn engine(model: &Model, spec: SpeculationConfig, batch: usize, kv_tokens: usize) -> EngineHandle {
    engine_ctx(model, spec, batch, kv_tokens, 2048)
}

/// An engine whose context (and least KV cache) is `ctx` positions.
fn engine_ctx(
    model: &Model,
    spec: SpeculationConfig,
    batch: usize,
    kv_tokens: usize,
    ctx: usize,
) -> EngineHandle {
    let rc = RuntimeConfig {
        threads: Some(2),
        ctx_size: ctx,
        kv_tokens,
        block_size: 16,
    };
    let sched = SchedulerConfig {
        batch,
        max_queue: 32,
        prefill_chunk: 256,
        mixed_prefill_chunk: 32,
        speculation: spec,
        ..SchedulerConfig::default()
    };
    let backends = runtime::build_backends_for(
        model,
        &runtime::parse_devices("cpu").expect("cpu"),
        &rc,
        Some(&sched),
    )
    .expect("backend");
    EngineHandle::start(backends, Arc::clone(&model.tokenizer), sched)
}

fn chat(model: &Model, text: &str) -> Vec<u32> {
    PromptBuilder::new(model)
        .chat(&[ChatMessage::new(Role::User, text.to_string())])
        .expect("prompt")
        .1
}

fn greedy(prompt: Vec<u32>, max_tokens: usize) -> GenerateRequest {
    GenerateRequest {
        sampling: SamplingParams::greedy(),
        ..GenerateRequest::new("spec", prompt, max_tokens)
    }
}

/// Every event of a request until its completion.
fn collect(mut rx: tokio::sync::mpsc::UnboundedReceiver<Event>) -> (Vec<Event>, Completion) {
    let mut events = Vec::new();
    while let Some(ev) = rx.blocking_recv() {
        if let Event::Done(c) = ev {
            return (events, *c);
        }
        events.push(ev);
    }
    panic!("no completion");
}

fn run(e: &EngineHandle, req: GenerateRequest) -> Completion {
    collect(e.submit(req).expect("submit")).1
}

/// The counts of a finished choice agree with each other: every token came from the prefill
/// or a decode step, drafts never take more than they offer, and every taken draft token is a
/// generated token.
fn check_counts(c: &Completion) {
    let t = &c.timings;
    let d = t.drafts;
    assert!(d.accepted_tokens <= d.drafted_tokens, "{d:?}");
    assert!(
        d.drafts <= t.decode_steps,
        "{d:?} in {} steps",
        t.decode_steps
    );
    let prefill_tokens = t.generated_tokens as u64 - t.decode_tokens;
    assert!(
        prefill_tokens <= t.prefills.len() as u64,
        "every token a prefill made has its prefill: {prefill_tokens} tokens, {} prefills",
        t.prefills.len()
    );
    // A verification step yields the draft tokens taken and at most one more.
    assert!(
        t.decode_tokens <= t.decode_steps + d.accepted_tokens as u64,
        "{} decode tokens from {} steps and {} taken draft tokens",
        t.decode_tokens,
        t.decode_steps,
        d.accepted_tokens
    );
    let legs: (usize, usize) = t.legs.iter().fold((0, 0), |(a, b), l| {
        (a + l.drafted_tokens, b + l.accepted_tokens)
    });
    assert_eq!(
        legs,
        (d.drafted_tokens, d.accepted_tokens),
        "the legs add up"
    );
}

/// The prompts: two the reply copies from, one it does not.
fn prompts(model: &Model) -> Vec<(&'static str, Vec<u32>, usize)> {
    vec![
        (
            "rename",
            chat(
                model,
                &format!(
                    "Rename the function compute_totals to sum_movements in this Python code. Reply with the whole code and nothing else.\n\n```python\n{}\n```",
                    code_excerpt()
                ),
            ),
            160,
        ),
        (
            "quote",
            chat(
                model,
                "Repeat this sentence exactly, in quotation marks: \"The keepers wound the clockwork that turned the lens, trimmed the wicks, and polished the glass every morning.\"",
            ),
            48,
        ),
        (
            "free-form",
            chat(model, "Write a short poem about the sea at night."),
            64,
        ),
    ]
}

/// One request of the comparisons with and without drafts: a prompt of [`prompts`] with one
/// way of sampling, and its reply decoded plainly, alone.
struct Case {
    name: String,
    /// Whether the reply copies from the prompt (so drafts are taken).
    grounded: bool,
    req: GenerateRequest,
    want: Completion,
}

/// The request of `prompt` for `seed`: greedy for `None`, else sampled at temperature 0.8 with
/// that seed.
fn request(prompt: Vec<u32>, max_tokens: usize, seed: Option<u64>) -> GenerateRequest {
    match seed {
        None => greedy(prompt, max_tokens),
        Some(seed) => GenerateRequest {
            sampling: SamplingParams {
                temperature: 0.8,
                seed: Some(seed),
                ..SamplingParams::default()
            },
            ..GenerateRequest::new("seeded", prompt, max_tokens)
        },
    }
}

/// Each prompt's request for each of `seeds` (see [`request`]), with its reply decoded plainly
/// (`--speculative off`), one request at a time.
fn alone(model: &Model, seeds: &[Option<u64>]) -> Vec<Case> {
    let plain = engine(model, none(), 1, 8192);
    let mut out = Vec::new();
    for (name, prompt, max_tokens) in prompts(model) {
        for &seed in seeds {
            let req = request(prompt.clone(), max_tokens, seed);
            let want = run(&plain, req.clone());
            let name = format!("{name}, seed {seed:?}");
            assert_eq!(want.timings.drafts.drafts, 0, "{name}: no drafts when off");
            assert_eq!(want.speculation, SpeculationMode::Off);
            out.push(Case {
                grounded: !name.starts_with("free-form"),
                name,
                req,
                want,
            });
        }
    }
    out
}

/// The output with drafts from the prompt and reply, and with a prediction (the output itself
/// with a word changed, so that part of it is rejected), equals plain decoding's, token for
/// token, for each prompt and each of `seeds` (see [`request`]); and the grounded prompts do
/// take drafts, in fewer decode steps than tokens. Returns the cases.
fn same_with_drafts_and_without(model: &Model, seeds: &[Option<u64>]) -> Vec<Case> {
    let cases = alone(model, seeds);
    let drafting = engine(model, ngram(10), 1, 8192);
    let predicted = engine(model, none_but_predictions(), 1, 8192);
    for prompt in cases.chunk_by(|a, b| a.req.prompt == b.req.prompt) {
        // The grounded prompt's drafts over its seeds.
        let (mut taken, mut steps, mut tokens) = (0, 0, 0);
        for Case {
            name,
            grounded,
            req,
            want,
        } in prompt
        {
            let got = run(&drafting, req.clone());
            assert_eq!(got.tokens, want.tokens, "{name}: prompt-lookup drafts");
            assert_eq!(got.finish_reason, want.finish_reason, "{name}");
            assert_eq!(got.speculation, SpeculationMode::Ngram);
            check_counts(&got);
            if *grounded {
                taken += got.timings.drafts.accepted_tokens;
                steps += got.timings.decode_steps;
                tokens += got.timings.decode_tokens;
            }
            // A prediction: the reply with one token changed in its middle.
            let mut prediction = want.tokens.clone();
            let mid = prediction.len() / 2;
            prediction[mid] = prediction[mid].wrapping_add(1) % 1000;
            let got = run(
                &predicted,
                GenerateRequest {
                    prediction: Some(prediction),
                    ..req.clone()
                },
            );
            assert_eq!(got.tokens, want.tokens, "{name}: prediction drafts");
            assert_eq!(got.speculation, SpeculationMode::Prediction);
            check_counts(&got);
            let d = got.timings.drafts;
            assert!(
                d.accepted_tokens + 2 >= want.tokens.len() / 2,
                "{name}: the prediction's first half is taken: {d:?} of {} tokens",
                want.tokens.len()
            );
            if want.tokens.len() > 2 {
                assert!(
                    d.rejected_tokens() > 0,
                    "{name}: the edit is rejected: {d:?}"
                );
            }
        }
        if prompt[0].grounded {
            let name = &prompt[0].name;
            assert!(taken > 0, "{name}: drafts taken");
            assert!(steps < tokens, "{name}: {steps} steps for {tokens} tokens");
        }
    }
    cases
}

/// Greedy output is the same with drafts and without.
fn greedy_output_is_the_same_with_drafts_and_without(model: &Model) {
    same_with_drafts_and_without(model, &[None]);
}

/// Drafts from a prediction only (`--speculative off`).
fn none_but_predictions() -> SpeculationConfig {
    SpeculationConfig {
        max_tokens: 10,
        ..SpeculationConfig::off()
    }
}

#[test]
fn greedy_output_is_the_same_with_drafts_and_without_on_smollm2() {
    let Some(m) = default_model() else { return };
    greedy_output_is_the_same_with_drafts_and_without(m);
}

#[test]
fn greedy_output_is_the_same_with_drafts_and_without_on_gemma3() {
    let Some(m) = gemma_model() else { return };
    greedy_output_is_the_same_with_drafts_and_without(m);
}

/// Three requests in batch slots, each verifying its own drafts (one from a prediction, one
/// from its prompt, one free-form mostly decoding plainly) in the same steps; the first starts
/// alone on the solo path and moves into a slot when the others arrive, drafting in both legs.
/// Each output equals its plain output alone.
#[test]
fn each_slot_verifies_its_own_draft_and_drafts_survive_a_move() {
    let Some(m) = default_model() else { return };
    let plain = engine(m, none(), 1, 8192);
    let ps = prompts(m);
    let want: Vec<Completion> = ps
        .iter()
        .map(|(_, p, n)| run(&plain, greedy(p.clone(), *n)))
        .collect();
    let drafting = engine(m, ngram(8), 4, 8192);
    let mut first = drafting
        .submit(greedy(ps[0].1.clone(), ps[0].2))
        .expect("submit");
    // Wait for the first to take a draft on the solo path.
    let mut early = Vec::new();
    loop {
        let ev = first.blocking_recv().expect("event");
        let drafted = matches!(ev, Event::Token { draft: Some(_), .. });
        early.push(ev);
        if drafted {
            break;
        }
    }
    let others: Vec<_> = [
        GenerateRequest {
            prediction: Some(want[1].tokens.clone()),
            ..greedy(ps[1].1.clone(), ps[1].2)
        },
        greedy(ps[2].1.clone(), ps[2].2),
    ]
    .into_iter()
    .map(|r| drafting.submit(r).expect("submit"))
    .collect();
    let (_, a) = collect(first);
    let done: Vec<Completion> = others.into_iter().map(|rx| collect(rx).1).collect();
    assert_eq!(a.tokens, want[0].tokens, "the one that moved");
    for (i, c) in done.iter().enumerate() {
        assert_eq!(c.tokens, want[i + 1].tokens, "slot {}", i + 1);
        check_counts(c);
    }
    check_counts(&a);
    let legs = &a.timings.legs;
    assert!(legs.len() >= 2, "it moved: {legs:?}");
    assert_eq!(legs[0].path, PathKind::Solo);
    assert_eq!(legs[0].end_reason, Some(LegEnd::Moved));
    assert!(legs[0].drafted_tokens > 0, "drafts on the solo path");
    assert!(
        legs.iter()
            .any(|l| l.path == PathKind::Slot && l.drafted_tokens > 0),
        "drafts in a slot: {legs:?}"
    );
    assert!(done[0].timings.drafts.accepted_tokens > 0, "the prediction");
}

/// After a request whose drafts were partly rejected, a second request whose prompt is the
/// first's prompt and reply reuses the cached blocks, and its output equals an engine's that
/// computed everything afresh: no block of the prefix cache held a rejected token's KV.
#[test]
fn rejected_positions_never_reach_the_prefix_cache() {
    let Some(m) = default_model() else { return };
    let drafting = engine(m, ngram(8), 1, 8192);
    let (name, prompt, n) = prompts(m).remove(0);
    let first = run(&drafting, greedy(prompt.clone(), n));
    assert!(
        first.timings.drafts.rejected_tokens() > 0,
        "{name}: some drafts are rejected: {:?}",
        first.timings.drafts
    );
    let mut follow = prompt;
    follow.extend_from_slice(&first.tokens);
    let again = run(&drafting, greedy(follow.clone(), 24));
    assert!(
        again.timings.cached_tokens >= follow.len() - 32,
        "the reply's blocks were cached: {} of {}",
        again.timings.cached_tokens,
        follow.len()
    );
    let fresh = run(&engine(m, none(), 1, 8192), greedy(follow, 24));
    assert_eq!(again.tokens, fresh.tokens);
}

/// A KV cache too small for three long requests: the newest is preempted and re-prefills its
/// prompt and reply, drafting again afterwards; every output equals its plain one.
#[test]
fn drafts_survive_a_preemption() {
    let Some(m) = default_model() else { return };
    let ps: Vec<_> = prompts(m)
        .into_iter()
        .map(|(name, p, n)| (name, p, n.min(96)))
        .collect();
    let plain = engine(m, none(), 1, 8192);
    let want: Vec<Vec<u32>> = ps
        .iter()
        .map(|(_, p, n)| run(&plain, greedy(p.clone(), *n)).tokens)
        .collect();
    // Room for the three prompts, not for their replies too (one request always fits).
    let kv: usize = ps.iter().map(|(_, p, _)| p.len()).sum::<usize>() + 32;
    let longest = ps.iter().map(|(_, p, n)| p.len() + n).max().unwrap_or(0);
    assert!(longest < kv, "one request fits");
    let tight = engine_ctx(m, ngram(8), 3, kv, kv);
    let rxs: Vec<_> = ps
        .iter()
        .map(|(_, p, n)| tight.submit(greedy(p.clone(), *n)).expect("submit"))
        .collect();
    let done: Vec<Completion> = rxs.into_iter().map(|rx| collect(rx).1).collect();
    let preempted = done
        .iter()
        .filter(|c| {
            c.timings
                .legs
                .iter()
                .any(|l| l.end_reason == Some(LegEnd::Preempted))
        })
        .count();
    assert!(
        preempted > 0,
        "the cache ({kv} positions) was too small for all three: {:?}",
        done.iter()
            .map(|c| (
                c.timings.prompt_tokens,
                c.tokens.len(),
                c.timings.legs.len()
            ))
            .collect::<Vec<_>>()
    );
    for (i, c) in done.iter().enumerate() {
        assert_eq!(c.tokens, want[i], "request {i}");
        check_counts(c);
    }
}

/// A grammar, stop strings, logprobs and `n` keep working with drafts: the same tokens, the
/// same log-probabilities bit for bit, the same finish.
#[test]
fn constraints_stop_strings_logprobs_and_n_keep_working() {
    let Some(m) = default_model() else { return };
    let plain = engine(m, none(), 2, 8192);
    let drafting = engine(m, ngram(8), 2, 8192);
    let prompt = chat(
        m,
        "Repeat exactly: the red fox, the red fox, the red fox, the red fox, the red fox.",
    );
    let compiler = Compiler::new(Arc::clone(&m.tokenizer), m.config.vocab).expect("compiler");
    let grammar = compiler
        .compile(&GrammarSpec::Regex(
            "(the red fox, ){2,6}the red fox\\.".into(),
        ))
        .expect("grammar");
    let cases: Vec<(&str, GenerateRequest)> = vec![
        (
            "grammar",
            GenerateRequest {
                constraint: Some(grammar),
                ..greedy(prompt.clone(), 64)
            },
        ),
        (
            "stop",
            GenerateRequest {
                stop: StopMatcher::new(&["fox, the red".to_string()]).expect("stop"),
                ..greedy(prompt.clone(), 64)
            },
        ),
        (
            "logprobs",
            GenerateRequest {
                logprobs: Some(3),
                ..greedy(prompt.clone(), 40)
            },
        ),
    ];
    for (name, req) in cases {
        let (we, want) = collect(plain.submit(req.clone()).expect("submit"));
        let (ge, got) = collect(drafting.submit(req).expect("submit"));
        assert_eq!(got.tokens, want.tokens, "{name}");
        assert_eq!(got.finish_reason, want.finish_reason, "{name}");
        check_counts(&got);
        // Each token's id, log-probability bits and alternatives' (id, bits).
        type Bits = (u32, u32, Vec<(u32, u32)>);
        let lp = |evs: &[Event]| -> Vec<Bits> {
            evs.iter()
                .filter_map(|e| match e {
                    Event::Token {
                        logprobs: Some(l), ..
                    } => Some((
                        l.id,
                        l.logprob.to_bits(),
                        l.top.iter().map(|(t, p)| (*t, p.to_bits())).collect(),
                    )),
                    _ => None,
                })
                .collect()
        };
        assert_eq!(lp(&ge), lp(&we), "{name}: logprobs bit for bit");
        let text = |evs: &[Event]| -> String {
            evs.iter()
                .filter_map(|e| match e {
                    Event::Token { text, .. } => Some(text.as_str()),
                    _ => None,
                })
                .collect()
        };
        assert_eq!(text(&ge), text(&we), "{name}: the text sent");
        if name == "stop" {
            assert_eq!(got.finish_reason, FinishReason::Stop);
        }
        if name == "grammar" || name == "logprobs" {
            assert!(
                got.timings.drafts.accepted_tokens > 0,
                "{name}: drafts taken"
            );
        }
    }
    // `n` = 2: each choice drafts for itself; greedy, both equal the request alone.
    let alone = run(&plain, greedy(prompt.clone(), 40));
    let rxs = drafting
        .submit_choices(GenerateRequest {
            n: 2,
            ..greedy(prompt, 40)
        })
        .expect("submit");
    for rx in rxs {
        let (_, c) = collect(rx);
        assert_eq!(c.tokens, alone.tokens, "choice {}", c.choice);
        assert!(c.timings.drafts.accepted_tokens > 0, "choice {}", c.choice);
    }
}

/// Seeds of the seeded tests.
const SEEDS: [Option<u64>; 2] = [Some(7), Some(1234)];

/// A seed means the same text: sampled at temperature 0.8, each prompt's reply is the same
/// tokens with drafts from the prompt and reply (`--speculative ngram`), with a prediction that
/// is partly wrong, and without drafts (`--speculative off`), because each output position's
/// random number depends on the seed and the position only, and a draft is verified with the
/// very draw plain decoding makes there. The grounded prompts do take drafts (their tokens are
/// verified, not decoded), and a different seed gives a different reply.
fn seeded_output_is_the_same_with_drafts_and_without(model: &Model) {
    let cases = same_with_drafts_and_without(model, &SEEDS);
    // The free-form prompt (a copied reply may well be the same whatever the seed).
    let poem: Vec<&Case> = cases.iter().filter(|c| !c.grounded).collect();
    assert_ne!(
        poem[0].want.tokens, poem[1].want.tokens,
        "{} and {}: two seeds, one reply",
        poem[0].name, poem[1].name
    );
}

#[test]
fn seeded_output_is_the_same_with_drafts_and_without_on_smollm2() {
    let Some(m) = default_model() else { return };
    seeded_output_is_the_same_with_drafts_and_without(m);
}

#[test]
fn seeded_output_is_the_same_with_drafts_and_without_on_gemma3() {
    let Some(m) = gemma_model() else { return };
    seeded_output_is_the_same_with_drafts_and_without(m);
}

/// A seed means the same text under any load: the seeded requests of
/// [`seeded_output_is_the_same_with_drafts_and_without`] all at once, beside unseeded requests
/// sampled at temperature 1 (other traffic), in batch slots of 2 and 4, with drafts and
/// without; the first starts alone on the solo path and moves into a slot when the others
/// arrive. Each reply equals its plain reply alone.
#[test]
fn seeded_output_is_the_same_at_any_batch_size_and_under_load() {
    let Some(m) = default_model() else { return };
    let want = alone(m, &SEEDS);
    let load: Vec<GenerateRequest> = [
        "Tell me about lighthouses.",
        "List five fruits and their colours.",
    ]
    .iter()
    .map(|text| GenerateRequest {
        sampling: SamplingParams::default(),
        ..GenerateRequest::new("load", chat(m, text), 48)
    })
    .collect();
    for (spec, batch) in [(none(), 4), (ngram(8), 2), (ngram(8), 4)] {
        let label = format!("drafts up to {}, batch {batch}", spec.max_tokens);
        let e = engine(m, spec, batch, 16_384);
        // The first alone until its first token, then everything else at once.
        let mut first = e.submit(want[0].req.clone()).expect("submit");
        let mut early = Vec::new();
        while !matches!(early.last(), Some(Event::Token { .. })) {
            early.push(first.blocking_recv().expect("event"));
        }
        let rest: Vec<_> = want[1..]
            .iter()
            .map(|c| c.req.clone())
            .chain(load.iter().cloned())
            .map(|r| e.submit(r).expect("submit"))
            .collect();
        let (_, a) = collect(first);
        let done: Vec<Completion> = rest.into_iter().map(|rx| collect(rx).1).collect();
        for (w, c) in want.iter().zip(std::iter::once(&a).chain(&done)) {
            assert_eq!(c.tokens, w.want.tokens, "{}, {label}", w.name);
            assert_eq!(c.finish_reason, w.want.finish_reason, "{}, {label}", w.name);
            check_counts(c);
        }
        assert!(
            a.timings
                .legs
                .iter()
                .any(|l| l.end_reason == Some(LegEnd::Moved)),
            "{label}: the first moved from the solo path: {:?}",
            a.timings.legs
        );
    }
}

/// The CPU backend computes a verification chunk's rows as one-token steps do: each row's
/// logits equal, bit for bit, the logits of a step of that one token at that position (the
/// integer kernels keep each row's accumulators apart, and attention states merge in one
/// order), so `exact_rows` may say any length.
fn a_verification_chunk_gives_one_token_steps_logits(model: &Model) {
    use slotlight_engine::backend::{Backend, SeqChunk};
    let mut b = support::cpu_backend(model, 512);
    assert_eq!(b.exact_rows(), usize::MAX);
    let prompt = chat(model, "Count from one to ten.");
    let draft: Vec<u32> = prompt[prompt.len() - 12..].to_vec();
    let table: Vec<u32> = (0..u32::try_from(b.num_blocks()).expect("blocks")).collect();
    let prefill = |b: &mut dyn Backend| {
        let mut logits = Vec::new();
        b.forward(
            &[SeqChunk {
                tokens: &prompt,
                start_pos: 0,
                blocks: &table,
                all_logits: false,
                no_logits: false,
            }],
            &mut logits,
        )
        .expect("prefill");
    };
    prefill(&mut b);
    let mut steps = Vec::new();
    for (i, t) in draft.iter().enumerate() {
        b.forward(
            &[SeqChunk {
                tokens: std::slice::from_ref(t),
                start_pos: prompt.len() + i,
                blocks: &table,
                all_logits: false,
                no_logits: false,
            }],
            &mut steps,
        )
        .expect("step");
    }
    prefill(&mut b);
    let mut verified = Vec::new();
    b.forward(
        &[SeqChunk {
            tokens: &draft,
            start_pos: prompt.len(),
            blocks: &table,
            all_logits: true,
            no_logits: false,
        }],
        &mut verified,
    )
    .expect("verify");
    assert_eq!(verified.len(), steps.len());
    let vocab = model.config.vocab;
    let differ = verified
        .iter()
        .zip(&steps)
        .position(|(x, y)| x.to_bits() != y.to_bits());
    assert_eq!(
        differ.map(|i| i / vocab),
        None,
        "the first row that differs"
    );
}

#[test]
fn a_verification_chunk_gives_one_token_steps_logits_on_smollm2() {
    let Some(m) = default_model() else { return };
    a_verification_chunk_gives_one_token_steps_logits(m);
}

#[test]
fn a_verification_chunk_gives_one_token_steps_logits_on_gemma3() {
    let Some(m) = gemma_model() else { return };
    a_verification_chunk_gives_one_token_steps_logits(m);
}
