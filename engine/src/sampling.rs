//! Token sampling: penalties, temperature, top-k, top-p (nucleus), min-p, and a seeded draw.
//!
//! One [`Sampler`] per request. It owns its random numbers ([`PositionRng`]: keyed by the
//! request's `seed`, or by process entropy when there is none) and the token counts the
//! penalties need, so a request's output depends only on its own parameters and logits:
//! same seed and same logits give the same tokens. The random number of output position `i` is
//! a pure function of the seed and `i`, never of how many numbers earlier steps took, so a
//! token comes out the same whether its position was decoded plainly or verified in a draft,
//! and whatever the batch, the load or the draft lengths were.
//!
//! Order of operations in [`Sampler::sample`] (the Hugging Face `generate` order):
//! 1. repetition penalty (HF/CTRL: a positive logit is divided by the penalty, a negative one
//!    multiplied) on every token seen in the prompt or generated so far;
//! 2. presence and frequency penalties (OpenAI: `logit -= count * frequency + presence`) on
//!    generated tokens only;
//! 3. greedy (`temperature == 0`): argmax, ties to the lowest id; otherwise
//! 4. temperature, top-k, top-p, min-p, then one draw from what is left, renormalised.
//!
//! [`Sampler::verify`] decides on a draft token (speculative decoding) by making the very draw
//! [`Sampler::sample`] makes at that position (same steps, same random number) and taking the
//! draft exactly when it is the token drawn; otherwise the token drawn replaces it. Greedy, that
//! is "taken when it is the argmax". A draft from the prompt or a prediction is one token with
//! certainty, so this is exact speculative sampling: the draft is taken with its probability
//! `p(d)`, and every token keeps the probability a plain draw gives it, because it *is* the
//! plain draw.
//!
//! The vocabulary is large (49,152 for SmolLM2), so a step must not sort it: weights come from
//! one vectorisable pass (a polynomial `exp`); filtered draws collect only the tokens above a
//! weight threshold that provably keeps every survivor (usually a few dozen), top-k uses partial
//! selection on those, top-p sorts only the logarithmic weight bucket where its cut falls; the
//! unfiltered draw scans chunk sums. Buffers are reused from step to step, so sampling does not
//! allocate after the first token. About 20 µs per greedy step and 80–120 µs per sampled step
//! over 49,152 logits on one core of the development machine.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};

use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};

/// Highest temperature accepted (OpenAI allows 2; we allow more for experiments).
pub const MAX_TEMPERATURE: f32 = 5.0;

/// A sampling parameter outside its accepted range. A caller error (HTTP 422-style).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SamplingError {
    /// `param` was `value`, outside `expected` (a human-readable range).
    #[error("{param} must be {expected}, got {value}")]
    OutOfRange {
        /// The parameter's name as the API spells it (`temperature`, `top_p`, ...).
        param: &'static str,
        /// The value received.
        value: f32,
        /// The accepted range, in words.
        expected: &'static str,
    },
}

impl SamplingError {
    /// A stable label for metrics and error bodies.
    pub fn error_type(&self) -> &'static str {
        slotlight_otel::attr::value::ERROR_VALIDATION
    }
}

/// How to pick the next token. Validate with [`SamplingParams::validate`] before use; a
/// [`Sampler`] built from unvalidated values never panics but clamps them to something sane.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature; `0` means greedy (argmax).
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; `0` turns it off.
    pub top_k: usize,
    /// Nucleus sampling: keep the smallest set of most likely tokens whose probability mass
    /// reaches `top_p`; `1` turns it off.
    pub top_p: f32,
    /// Drop tokens whose probability is below `min_p` times the most likely one's; `0` is off.
    pub min_p: f32,
    /// OpenAI presence penalty: subtracted once from the logit of every token generated so far.
    pub presence_penalty: f32,
    /// OpenAI frequency penalty: subtracted from a token's logit once per time it was generated.
    pub frequency_penalty: f32,
    /// HF/CTRL repetition penalty over prompt and generated tokens; `1` turns it off.
    pub repetition_penalty: f32,
    /// Seed of the request's random numbers (one per output position, see [`PositionRng`]);
    /// `None` draws one from process entropy.
    pub seed: Option<u64>,
    /// OpenAI `logit_bias`: added to a token's logit before anything else (-100 bans a token,
    /// +100 all but forces it).
    pub logit_bias: Vec<(u32, f32)>,
}

impl Default for SamplingParams {
    /// OpenAI's defaults: temperature 1, no truncation, no penalties, no seed.
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_penalty: 1.0,
            seed: None,
            logit_bias: Vec::new(),
        }
    }
}

impl SamplingParams {
    /// Greedy decoding: always the most likely token (no randomness at all).
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            ..Self::default()
        }
    }

    /// Whether these parameters always pick the argmax.
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0 || self.top_k == 1
    }

    /// Checks every value is in range: temperature in `0..=5`, `top_p` in `(0, 1]`, `min_p` in
    /// `[0, 1]`, presence and frequency penalties in `-2..=2`, repetition penalty in `(0, 10]`.
    /// NaN is always refused.
    pub fn validate(&self) -> Result<(), SamplingError> {
        fn check(
            param: &'static str,
            value: f32,
            ok: bool,
            expected: &'static str,
        ) -> Result<(), SamplingError> {
            if ok && value.is_finite() {
                Ok(())
            } else {
                Err(SamplingError::OutOfRange {
                    param,
                    value,
                    expected,
                })
            }
        }
        let t = self.temperature;
        check(
            "temperature",
            t,
            (0.0..=MAX_TEMPERATURE).contains(&t),
            "between 0 and 5",
        )?;
        let p = self.top_p;
        check(
            "top_p",
            p,
            p > 0.0 && p <= 1.0,
            "greater than 0 and at most 1",
        )?;
        let m = self.min_p;
        check("min_p", m, (0.0..=1.0).contains(&m), "between 0 and 1")?;
        let pp = self.presence_penalty;
        check(
            "presence_penalty",
            pp,
            (-2.0..=2.0).contains(&pp),
            "between -2 and 2",
        )?;
        let fp = self.frequency_penalty;
        check(
            "frequency_penalty",
            fp,
            (-2.0..=2.0).contains(&fp),
            "between -2 and 2",
        )?;
        let rp = self.repetition_penalty;
        check(
            "repetition_penalty",
            rp,
            rp > 0.0 && rp <= 10.0,
            "greater than 0 and at most 10",
        )?;
        for &(_, b) in &self.logit_bias {
            check(
                "logit_bias",
                b,
                (-100.0..=100.0).contains(&b),
                "between -100 and 100",
            )?;
        }
        Ok(())
    }
}

/// Per-token bookkeeping for the penalties.
#[derive(Clone, Copy, Debug, Default)]
struct Seen {
    /// Times the token was generated (presence/frequency penalties).
    generated: u32,
    /// Whether the token occurs in the prompt (repetition penalty only).
    in_prompt: bool,
}

/// One surviving token during a filtered draw: its id and its weight, the unnormalised
/// probability `exp((logit - max) / temperature)`, so the most likely token has weight 1.
#[derive(Clone, Copy, Debug)]
struct Cand {
    id: u32,
    w: f32,
}

/// Descending by weight, ties to the lower id: a total order, so partial selection is
/// deterministic and the result never depends on the order the sort visits elements in.
fn by_weight_desc(a: &Cand, b: &Cand) -> std::cmp::Ordering {
    b.w.total_cmp(&a.w).then(a.id.cmp(&b.id))
}

/// Tokens per chunk of the dense draw (chunk sums let the draw skip to the right chunk).
const CHUNK: usize = 512;

/// Picks tokens for one request. See the module docs for the order of operations.
#[derive(Clone, Debug)]
pub struct Sampler {
    params: SamplingParams,
    rng: PositionRng,
    /// Output position of the next token: tokens generated (drawn or accepted) so far.
    position: u64,
    seen: HashMap<u32, Seen>,
    // Scratch buffers, reused across steps so `sample` does not allocate after the first.
    weights: Vec<f32>,
    chunk_sums: Vec<f64>,
    cands: Vec<Cand>,
    buckets: Vec<f64>,
}

/// What [`Sampler::verify`] decided on a draft token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// The token generated: the draft token when it was taken, else the sampler's own choice.
    pub token: u32,
    /// Whether the draft token was taken.
    pub accepted: bool,
}

impl Sampler {
    /// Builds the sampler for a request. `prompt_tokens` feed the repetition penalty (they are
    /// only recorded when that penalty is on).
    pub fn new(params: SamplingParams, prompt_tokens: &[u32]) -> Self {
        let rng = PositionRng::new(params.seed.unwrap_or_else(entropy_seed));
        let mut seen = HashMap::new();
        if params.repetition_penalty != 1.0 {
            for &t in prompt_tokens {
                seen.entry(t).or_insert(Seen::default()).in_prompt = true;
            }
        }
        Self {
            params,
            rng,
            position: 0,
            seen,
            weights: Vec::new(),
            chunk_sums: Vec::new(),
            cands: Vec::new(),
            buckets: Vec::new(),
        }
    }

    /// The parameters this sampler was built with.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Picks the next token from `logits` (one per vocabulary entry) and records it as
    /// generated. The penalties are applied to `logits` in place. Never panics: NaN logits are
    /// ignored, a `+inf` logit wins outright, `-inf` means "never", and an empty slice yields
    /// token 0.
    pub fn sample(&mut self, logits: &mut [f32]) -> u32 {
        for &(id, bias) in &self.params.logit_bias {
            if let Some(l) = logits.get_mut(id as usize) {
                *l += bias;
            }
        }
        self.apply_penalties(logits);
        let t = self.params.temperature;
        let token = if self.params.is_greedy() || t.is_nan() || t <= 0.0 {
            argmax(logits).0
        } else {
            let u = self.rng.uniform(self.position);
            self.draw(logits, u)
        };
        self.accept(token);
        token
    }

    /// Decides on the draft token `draft` from `logits` (the model's logits at its position)
    /// and records the token generated: the token is exactly the one [`Sampler::sample`] would
    /// give here (same steps, same random number of this position), and the draft is taken
    /// when it is that token. Greedy, that is the argmax; sampled, it keeps the distribution a
    /// plain draw has (see the module docs).
    pub fn verify(&mut self, logits: &mut [f32], draft: u32) -> Verdict {
        let token = self.sample(logits);
        Verdict {
            token,
            accepted: token == draft,
        }
    }

    /// Records `token` as generated without sampling it (forced or prefilled tokens), so the
    /// penalties see it and it takes its output position. [`Sampler::sample`] calls this
    /// itself.
    pub fn accept(&mut self, token: u32) {
        let e = self.seen.entry(token).or_default();
        e.generated = e.generated.saturating_add(1);
        self.position += 1;
    }

    fn apply_penalties(&self, logits: &mut [f32]) {
        let p = &self.params;
        let rep = p.repetition_penalty;
        let rep_on = rep != 1.0 && rep > 0.0 && rep.is_finite();
        let openai_on = p.presence_penalty != 0.0 || p.frequency_penalty != 0.0;
        if !rep_on && !openai_on {
            return;
        }
        for (&token, seen) in &self.seen {
            let Some(logit) = logits.get_mut(token as usize) else {
                continue;
            };
            if rep_on {
                *logit = if *logit > 0.0 {
                    *logit / rep
                } else {
                    *logit * rep
                };
            }
            if openai_on && seen.generated > 0 {
                #[allow(clippy::cast_precision_loss)] // counts are far below 2^24
                let count = seen.generated as f32;
                *logit -= count * p.frequency_penalty + p.presence_penalty;
            }
        }
    }

    /// Temperature, top-k, top-p, min-p, then the draw of the uniform number `u` in `[0, 1)`.
    fn draw(&mut self, logits: &[f32], u: f64) -> u32 {
        let (best, max) = argmax(logits);
        if !max.is_finite() {
            // +inf wins outright; all -inf/NaN leaves nothing to draw from.
            return best;
        }
        let inv_t = 1.0 / self.params.temperature.min(MAX_TEMPERATURE * 100.0);
        // One vectorisable pass: weights relative to the maximum, which gets exactly 1.
        self.weights.clear();
        self.weights.resize(logits.len(), 0.0);
        for (w, &l) in self.weights.iter_mut().zip(logits) {
            *w = fast_exp((l - max) * inv_t);
        }

        let n = logits.len();
        let k = self.params.top_k;
        let top_p = self.params.top_p;
        let min_p = self.params.min_p;
        let use_k = k > 0 && k < n;
        let use_p = top_p < 1.0;
        let use_min_p = min_p > 0.0 && min_p.is_finite();
        if !use_k && !use_p && !use_min_p {
            return self.draw_dense(best, u);
        }

        // Collect candidates above a weight threshold, lowering it until the set provably
        // holds every survivor: the k-th largest weight for top-k, the nucleus for top-p.
        // Language models put their mass in a few dozen tokens, so the first threshold
        // (2^-8 of the most likely token's probability) nearly always suffices and a step
        // touches the vocabulary only in branch-predictable, vectorisable passes.
        let min_w = if use_min_p { min_p.min(1.0) } else { 0.0 };
        let p_target = (use_p && !use_k).then(|| {
            let total: f64 = self
                .weights
                .chunks(CHUNK)
                .map(|c| f64::from(sum_f32(c)))
                .sum();
            f64::from(top_p.max(0.0)) * total
        });
        let cands = &mut self.cands;
        for threshold in [1.0 / 256.0, 1.0 / 65_536.0, 0.0] {
            let exhaustive = threshold <= min_w;
            let threshold = f32::max(threshold, min_w);
            cands.clear();
            for (i, &w) in self.weights.iter().enumerate() {
                if w >= threshold && w > 0.0 {
                    cands.push(Cand {
                        id: index_u32(i),
                        w,
                    });
                }
            }
            let enough = exhaustive
                || (use_k && cands.len() >= k)
                || p_target.is_some_and(|t| cands.iter().map(|c| f64::from(c.w)).sum::<f64>() >= t)
                || (!use_k && p_target.is_none());
            if enough {
                break;
            }
        }
        if use_k && k < cands.len() {
            cands.select_nth_unstable_by(k - 1, by_weight_desc);
            cands.truncate(k);
        }
        if use_p && cands.len() > 1 {
            // With top-k, top-p applies to the k survivors, renormalised.
            let target = p_target.unwrap_or_else(|| {
                f64::from(top_p.max(0.0)) * cands.iter().map(|c| f64::from(c.w)).sum::<f64>()
            });
            nucleus(cands, target, &mut self.buckets);
        }
        if use_min_p {
            // p_i >= min_p * p_max  <=>  w_i >= min_p, as the maximum has weight 1 (and always
            // survives top-k and top-p).
            let threshold = min_p.min(1.0);
            cands.retain(|c| c.w >= threshold);
        }

        let total: f64 = cands.iter().map(|c| f64::from(c.w)).sum();
        let target = u * total;
        let mut acc = 0.0;
        for c in cands.iter() {
            acc += f64::from(c.w);
            if acc > target {
                return c.id;
            }
        }
        // Only reachable through rounding: fall back to the most likely token.
        best
    }

    /// The draw of `u` over the whole vocabulary from `self.weights`: chunk sums first, so the
    /// draw scans one chunk instead of the whole vocabulary.
    fn draw_dense(&mut self, best: u32, u: f64) -> u32 {
        self.chunk_sums.clear();
        self.chunk_sums
            .extend(self.weights.chunks(CHUNK).map(|c| f64::from(sum_f32(c))));
        let total: f64 = self.chunk_sums.iter().sum();
        let target = u * total;
        let mut acc = 0.0;
        for (ci, &cs) in self.chunk_sums.iter().enumerate() {
            if acc + cs > target {
                let chunk = &self.weights[ci * CHUNK..((ci + 1) * CHUNK).min(self.weights.len())];
                let mut inner = acc;
                let mut last_positive = None;
                for (j, &w) in chunk.iter().enumerate() {
                    if w > 0.0 {
                        last_positive = Some(j);
                    }
                    inner += f64::from(w);
                    if inner > target && w > 0.0 {
                        return index_u32(ci * CHUNK + j);
                    }
                }
                // Rounding between the chunk's sum and its elements: take its last candidate.
                if let Some(j) = last_positive {
                    return index_u32(ci * CHUNK + j);
                }
            }
            acc += cs;
        }
        best
    }
}

/// The log-probabilities of one generated token: its own and the most likely alternatives.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprobs {
    /// The generated token.
    pub id: u32,
    /// The token's log-probability under the model.
    pub logprob: f32,
    /// The `top` most likely tokens with their log-probabilities, most likely first (ties to
    /// the lower id).
    pub top: Vec<(u32, f32)>,
}

/// Log-probabilities from the model's raw `logits`: the log-softmax of the whole distribution,
/// before penalties, `logit_bias`, temperature, top-k/top-p/min-p and grammar masks (what vLLM
/// calls raw logprobs). Returns the entry of `chosen` and the `top` most likely tokens. NaN
/// logits count as impossible.
pub fn logprobs(logits: &[f32], chosen: u32, top: usize) -> TokenLogprobs {
    let max = max_f32(logits);
    let lse = if max.is_finite() {
        let total: f64 = logits
            .chunks(CHUNK)
            .map(|c| {
                let mut acc = [0.0f32; LANES];
                for (i, &l) in c.iter().enumerate() {
                    acc[i % LANES] += fast_exp(l - max);
                }
                f64::from(acc.iter().sum::<f32>())
            })
            .sum();
        f64::from(max) + total.ln()
    } else {
        f64::from(max)
    };
    #[allow(clippy::cast_possible_truncation)] // log-probabilities fit f32
    let lp = |l: f32| {
        if l.is_nan() {
            f32::NEG_INFINITY
        } else {
            (f64::from(l) - lse) as f32
        }
    };
    let logprob = logits
        .get(chosen as usize)
        .map_or(f32::NEG_INFINITY, |&l| lp(l));
    // The `top` largest by a single pass keeping a small sorted list.
    let mut best: Vec<(u32, f32)> = Vec::with_capacity(top + 1);
    if top > 0 {
        for (i, &l) in logits.iter().enumerate() {
            if l.is_nan() {
                continue;
            }
            if best.len() == top && best.last().is_some_and(|&(_, b)| l <= b) {
                continue;
            }
            let pos = best.partition_point(|&(_, b)| b >= l);
            best.insert(pos, (index_u32(i), l));
            best.truncate(top);
        }
    }
    TokenLogprobs {
        id: chosen,
        logprob,
        top: best.into_iter().map(|(id, l)| (id, lp(l))).collect(),
    }
}

#[allow(clippy::cast_possible_truncation)] // vocabularies are far below 2^32
fn index_u32(i: usize) -> u32 {
    i as u32
}

/// `exp(x)` for `x <= 0` (as used here: logits minus their maximum), relative error below 1e-5;
/// exactly 1 at 0, exactly 0 below -87 and for NaN. Branch-free, call-free and without
/// float-to-int conversions so the weight loop vectorises: `f32::exp` is a libm call per
/// element, several times slower over 49,152 logits.
#[inline(always)]
fn fast_exp(x: f32) -> f32 {
    // exp(x) = 2^n * e^g with n = round(x / ln 2) and g = x - n ln 2 in [-ln2/2, ln2/2].
    const ROUND: f32 = 12_582_912.0; // 1.5 * 2^23: adding it rounds to an integer
    let ok = x >= -87.0; // false for NaN and -inf
    let x = if ok { x } else { -87.0 };
    let t = x * std::f32::consts::LOG2_E;
    let r = t + ROUND; // n sits in the low mantissa bits of r
    let n = r - ROUND;
    let g = (t - n) * std::f32::consts::LN_2;
    let p = 1.0
        + g * (1.0
            + g * (0.5
                + g * (1.0 / 6.0 + g * (1.0 / 24.0 + g * (1.0 / 120.0 + g * (1.0 / 720.0))))));
    // 2^n from the low bits of r: (n + 127) << 23, n in [-126, 0].
    let scale = f32::from_bits(r.to_bits().wrapping_add(127) << 23);
    if ok { p * scale } else { 0.0 }
}

/// Lanes of the reductions below: independent accumulators let the compiler vectorise (it may
/// not reorder a single chain of float operations).
const LANES: usize = 16;

/// The largest value, ignoring NaN (-inf when there is none).
fn max_f32(v: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    let mut chunks = v.chunks_exact(LANES);
    for c in &mut chunks {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a = a.max(x);
        }
    }
    let rest = chunks
        .remainder()
        .iter()
        .copied()
        .fold(f32::NEG_INFINITY, f32::max);
    acc.into_iter().fold(rest, f32::max)
}

/// The sum, accumulated in `LANES` partial sums.
fn sum_f32(v: &[f32]) -> f32 {
    let mut acc = [0.0f32; LANES];
    let mut chunks = v.chunks_exact(LANES);
    for c in &mut chunks {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a += x;
        }
    }
    chunks.remainder().iter().sum::<f32>() + acc.iter().sum::<f32>()
}

/// Index of the first element equal to `target`, testing whole chunks at a time.
fn first_eq(v: &[f32], target: f32) -> Option<usize> {
    for (ci, c) in v.chunks(LANES).enumerate() {
        if c.iter().fold(false, |any, &x| any | (x == target)) {
            return c.iter().position(|&x| x == target).map(|j| ci * LANES + j);
        }
    }
    None
}

/// Keeps the smallest set of most likely candidates whose mass reaches `target` (inclusive, as
/// llama.cpp does), without sorting them all: the mass of each weight bucket is summed, the
/// buckets are walked from the top to the one where the mass crosses `target`, and only that
/// bucket is sorted. Keeps everything when the mass never reaches `target` (rounding).
fn nucleus(cands: &mut Vec<Cand>, target: f64, buckets: &mut Vec<f64>) {
    if cands.len() <= 64 {
        cands.sort_unstable_by(by_weight_desc);
        let mut acc = 0.0;
        for i in 0..cands.len() {
            acc += f64::from(cands[i].w);
            if acc >= target {
                cands.truncate(i + 1);
                return;
            }
        }
        return;
    }
    buckets.clear();
    buckets.resize(N_BUCKETS, 0.0);
    for c in cands.iter() {
        buckets[bucket(c.w)] += f64::from(c.w);
    }
    let mut above = 0.0; // mass of the buckets above the boundary
    let mut boundary = None;
    for b in (0..N_BUCKETS).rev() {
        if above + buckets[b] >= target {
            boundary = Some(b);
            break;
        }
        above += buckets[b];
    }
    let Some(boundary) = boundary else {
        return;
    };
    cands.retain(|c| bucket(c.w) >= boundary);
    // Partition: tokens of higher buckets first (all kept), the boundary bucket after.
    let mut mid = 0;
    for i in 0..cands.len() {
        if bucket(cands[i].w) > boundary {
            cands.swap(i, mid);
            mid += 1;
        }
    }
    cands[mid..].sort_unstable_by(by_weight_desc);
    let mut acc = above;
    for i in mid..cands.len() {
        acc += f64::from(cands[i].w);
        if acc >= target {
            cands.truncate(i + 1);
            return;
        }
    }
}

/// Weight buckets: a positive float's bits order like the float, so `bits >> BUCKET_SHIFT`
/// (the exponent and top 4 mantissa bits: 1/16-octave buckets) is monotone in the weight.
const BUCKET_SHIFT: u32 = 19;

/// Number of buckets for weights in `[0, 1]`.
const N_BUCKETS: usize = (0x3F80_0000 >> BUCKET_SHIFT) + 1; // 1.0f32.to_bits() == 0x3F80_0000

/// The bucket of a weight in `[0, 1]` (NaN never reaches here: `fast_exp` returns 0 for it).
#[inline(always)]
fn bucket(w: f32) -> usize {
    ((w.to_bits() >> BUCKET_SHIFT) as usize).min(N_BUCKETS - 1)
}

/// Index and value of the largest logit, ties to the lowest index; NaN is ignored. Index 0
/// (value -inf) when there is nothing else. Two simple passes, both vectorisable.
fn argmax(logits: &[f32]) -> (u32, f32) {
    let max = max_f32(logits);
    let best = first_eq(logits, max).unwrap_or(0);
    (index_u32(best), max)
}

/// A request's random numbers, one per output position: ChaCha8 keyed by the seed, the output
/// position as its stream (nonce), the position's number the first 64 bits of that stream. A
/// counter-based generator: the number of position `i` is a pure function of the seed and `i`,
/// so it is the same however many numbers were asked for before, in whatever order, and a
/// draft's verification draws with the very number plain decoding uses at that position. The
/// key comes from the seed through `rand_core`'s `seed_from_u64` (PCG32 expansion), so seed
/// `s + 1` (the next choice of `n`) is a key of its own, not `s` shifted by one position.
#[derive(Clone, Debug)]
pub struct PositionRng {
    key: [u8; 32],
}

impl PositionRng {
    /// The numbers of `seed`.
    pub fn new(seed: u64) -> Self {
        Self {
            key: ChaCha8Rng::seed_from_u64(seed).get_seed(),
        }
    }

    /// The uniform number in `[0, 1)` (53 random bits) of output position `position`.
    pub fn uniform(&self, position: u64) -> f64 {
        let mut stream = ChaCha8Rng::from_seed(self.key);
        stream.set_stream(position);
        uniform(&mut stream)
    }
}

/// A uniform draw in `[0, 1)` with 53 random bits.
fn uniform(rng: &mut ChaCha8Rng) -> f64 {
    /// 2^-53: one unit in the last place of a 53-bit fraction.
    const ULP: f64 = 1.0 / 9_007_199_254_740_992.0;
    #[allow(clippy::cast_precision_loss)] // 53-bit integers are exact in f64
    let x = (rng.next_u64() >> 11) as f64;
    x * ULP
}

/// A seed for requests without one: std's `RandomState` keys come from the operating system's
/// random source (and differ per instance); the clock is mixed in for good measure.
fn entropy_seed() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    h.write_u128(nanos);
    h.finish()
}

#[cfg(test)]
// Test data: small counts and indices, exact in every cast.
#[allow(clippy::cast_possible_truncation, clippy::cast_precision_loss)]
mod tests {
    use super::*;

    fn params(temperature: f32) -> SamplingParams {
        SamplingParams {
            temperature,
            seed: Some(42),
            ..SamplingParams::default()
        }
    }

    /// Logits whose softmax is exactly `probs`.
    fn logits_of(probs: &[f32]) -> Vec<f32> {
        probs.iter().map(|p| p.ln()).collect()
    }

    /// Draws `n` tokens from a fresh copy of `logits` each time; returns counts per token.
    fn histogram(sampler: &mut Sampler, logits: &[f32], n: usize) -> Vec<usize> {
        let mut counts = vec![0; logits.len()];
        for _ in 0..n {
            let mut l = logits.to_vec();
            counts[sampler.sample(&mut l) as usize] += 1;
        }
        counts
    }

    /// Pearson's chi-square of `counts` against probabilities `p` (cells with `p == 0` must be
    /// empty).
    fn chi_square(counts: &[usize], p: &[f64]) -> f64 {
        let n: usize = counts.iter().sum();
        let mut chi = 0.0;
        for (&c, &pi) in counts.iter().zip(p) {
            if pi == 0.0 {
                assert_eq!(c, 0, "a token of probability 0 was generated");
                continue;
            }
            let e = n as f64 * pi;
            chi += (c as f64 - e).powi(2) / e;
        }
        chi
    }

    /// Verifying a draft token keeps the distribution a plain draw has, whatever the draft: a
    /// chi-square test (fixed seeds, so it is deterministic) over 40,000 verdicts for each
    /// draft, on the dense path and on the filtered one. An acceptance rule biased either way
    /// (taking drafts too often, or too rarely) moves the draft's share and fails.
    #[test]
    fn verifying_a_draft_keeps_the_sampling_distribution() {
        let probs = [0.35f64, 0.25, 0.15, 0.12, 0.08, 0.05];
        let logits: Vec<f32> = probs.iter().map(|&p| p.ln() as f32).collect();
        let norm = |w: Vec<f64>| {
            let t: f64 = w.iter().sum();
            w.into_iter().map(|x| x / t).collect::<Vec<f64>>()
        };
        let cases = [
            (params(1.0), probs.to_vec()),
            (params(0.5), norm(probs.iter().map(|p| p * p).collect())),
            (
                SamplingParams {
                    top_k: 3,
                    ..params(1.0)
                },
                norm(vec![0.35, 0.25, 0.15, 0.0, 0.0, 0.0]),
            ),
        ];
        // Chi-square at 5 degrees of freedom: P(X > 20.52) = 0.001.
        const LIMIT: f64 = 20.52;
        let n = 40_000;
        for (ci, (p, want)) in cases.iter().enumerate() {
            for draft in [0u32, 2, 5] {
                let mut s = Sampler::new(
                    SamplingParams {
                        seed: Some(1000 + 10 * ci as u64 + u64::from(draft)),
                        ..p.clone()
                    },
                    &[],
                );
                let mut counts = vec![0usize; probs.len()];
                let mut taken = 0usize;
                for _ in 0..n {
                    let mut l = logits.clone();
                    let v = s.verify(&mut l, draft);
                    if v.accepted {
                        assert_eq!(v.token, draft);
                        taken += 1;
                    } else {
                        assert_ne!(v.token, draft, "a rejected draft is never the token");
                    }
                    counts[v.token as usize] += 1;
                }
                let chi = chi_square(&counts, want);
                assert!(
                    chi < LIMIT,
                    "case {ci}, draft {draft}: chi-square {chi:.1} for {counts:?} against {want:?}"
                );
                // Every time the draft comes out, it was taken.
                assert_eq!(taken, counts[draft as usize], "case {ci}, draft {draft}");
            }
        }
        // Plain draws from the same sampler settings give the same distribution (the test's
        // reference is right).
        let mut s = Sampler::new(params(1.0), &[]);
        let counts = histogram(&mut s, &logits, n);
        assert!(chi_square(&counts, &probs) < LIMIT, "{counts:?}");
    }

    /// The number of a position depends on the seed and the position only: asked for in any
    /// order, any number of times, from any copy, it is the same; positions, seeds and the
    /// next choice's seed (`seed + 1`) give numbers of their own, spread evenly over `[0, 1)`.
    #[test]
    fn a_positions_number_is_a_pure_function_of_seed_and_position() {
        let rng = PositionRng::new(42);
        let forward: Vec<f64> = (0..1000).map(|i| rng.uniform(i)).collect();
        let backward: Vec<f64> = (0..1000).rev().map(|i| rng.uniform(i)).collect();
        assert!(forward.iter().eq(backward.iter().rev()), "order");
        let again = PositionRng::new(42);
        assert_eq!(again.uniform(500), forward[500], "a fresh copy");
        assert_eq!(rng.uniform(u64::MAX), rng.uniform(u64::MAX));
        // Fixed values: the derivation is part of what a seed means (an upgrade of the
        // generator that changed them would change every seeded reply).
        assert_eq!(
            [forward[0], forward[1]].map(f64::to_bits),
            [0x3FE5_D217_F6A7_2BAB, 0x3FE6_EFF5_0C31_B93D],
            "{:?}",
            [forward[0], forward[1]]
        );
        let distinct: std::collections::HashSet<u64> =
            forward.iter().map(|x| x.to_bits()).collect();
        assert_eq!(
            distinct.len(),
            forward.len(),
            "every position its own number"
        );
        let other = PositionRng::new(43);
        assert!((0..1000).all(|i| other.uniform(i) != forward[i as usize]));
        // Choice 1 of `n` (seed + 1) is not choice 0 one position on.
        assert!((0..999).all(|i| other.uniform(i) != forward[i as usize + 1]));
        // Uniform: a chi-square over 20 bins of 20,000 positions (19 degrees of freedom:
        // P(X > 43.82) = 0.001), and every number in [0, 1).
        let mut counts = vec![0usize; 20];
        for i in 0..20_000 {
            let u = rng.uniform(i);
            assert!((0.0..1.0).contains(&u), "{u}");
            counts[(u * 20.0) as usize] += 1;
        }
        let chi = chi_square(&counts, &[0.05; 20]);
        assert!(chi < 43.82, "chi-square {chi:.1} for {counts:?}");
    }

    /// A verdict is the plain draw: a sampler verifying drafts (taken ones, refused ones, and
    /// plain steps between them) yields the very tokens a sampler only sampling yields from the
    /// same seed and logits, on the dense and the filtered paths and with penalties, and takes
    /// a draft exactly when it is that token. With drafts drawing numbers of their own (as
    /// rejection sampling did), the sequences part at the first verdict.
    #[test]
    fn verifying_draws_what_plain_sampling_draws() {
        let cases = [
            params(0.8),
            SamplingParams {
                top_p: 0.9,
                ..params(0.8)
            },
            SamplingParams {
                top_k: 20,
                min_p: 0.02,
                ..params(1.2)
            },
            SamplingParams {
                frequency_penalty: 0.5,
                repetition_penalty: 1.2,
                logit_bias: vec![(3, 2.0)],
                ..params(0.8)
            },
        ];
        let steps: Vec<Vec<f32>> = (0..120).map(|i| big_logits(4096, 100 + i)).collect();
        for (ci, p) in cases.iter().enumerate() {
            let mut plain = Sampler::new(p.clone(), &[1, 2, 3]);
            let want: Vec<u32> = steps.iter().map(|l| plain.sample(&mut l.clone())).collect();
            let mut drafted = Sampler::new(p.clone(), &[1, 2, 3]);
            let mut taken = 0;
            for (i, l) in steps.iter().enumerate() {
                let got = match i % 3 {
                    // A draft of the token plain sampling drew here: taken.
                    0 => drafted.verify(&mut l.clone(), want[i]),
                    // A draft of another token: refused, the plain draw comes instead.
                    1 => drafted.verify(&mut l.clone(), (want[i] + 1) % 4096),
                    _ => Verdict {
                        token: drafted.sample(&mut l.clone()),
                        accepted: false,
                    },
                };
                assert_eq!(got.token, want[i], "case {ci}, position {i}");
                assert_eq!(got.accepted, i % 3 == 0, "case {ci}, position {i}");
                taken += usize::from(got.accepted);
            }
            assert_eq!(taken, 40, "case {ci}");
        }
    }

    /// Greedy, a draft is taken exactly when it is the argmax, and the token is the argmax
    /// either way (what plain greedy decoding gives).
    #[test]
    fn a_greedy_verdict_is_the_argmax() {
        let logits = logits_of(&[0.1, 0.6, 0.3]);
        let mut s = Sampler::new(SamplingParams::greedy(), &[]);
        for (draft, accepted) in [(1, true), (0, false), (2, false), (7, false)] {
            let mut l = logits.clone();
            assert_eq!(
                s.verify(&mut l, draft),
                Verdict { token: 1, accepted },
                "draft {draft}"
            );
        }
    }

    /// Deterministic pseudo-random logits for a big vocabulary.
    fn big_logits(n: usize, seed: u64) -> Vec<f32> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        (0..n)
            .map(|_| {
                // A skewed distribution like a language model's: most tokens far below a few.
                #[allow(clippy::cast_possible_truncation)]
                let u = uniform(&mut rng) as f32;
                -20.0 * u * u * u + 5.0 * u
            })
            .collect()
    }

    #[test]
    fn defaults_and_greedy() {
        let d = SamplingParams::default();
        assert_eq!(d.temperature, 1.0);
        assert_eq!(d.top_p, 1.0);
        assert!(!d.is_greedy());
        assert!(SamplingParams::greedy().is_greedy());
        assert!(d.validate().is_ok());
        assert!(SamplingParams::greedy().validate().is_ok());
    }

    #[test]
    fn validation_messages() {
        let bad = |f: fn(&mut SamplingParams)| {
            let mut p = SamplingParams::default();
            f(&mut p);
            p.validate().expect_err("out of range")
        };
        let e = bad(|p| p.temperature = 7.0);
        assert_eq!(e.to_string(), "temperature must be between 0 and 5, got 7");
        assert_eq!(e.error_type(), "validation");
        assert!(
            bad(|p| p.temperature = -0.5)
                .to_string()
                .contains("temperature")
        );
        assert!(
            bad(|p| p.temperature = f32::NAN)
                .to_string()
                .contains("NaN")
        );
        assert!(bad(|p| p.top_p = 0.0).to_string().contains("top_p"));
        assert!(bad(|p| p.top_p = 1.5).to_string().contains("top_p"));
        assert!(bad(|p| p.min_p = -0.1).to_string().contains("min_p"));
        assert!(
            bad(|p| p.presence_penalty = 2.5)
                .to_string()
                .contains("presence_penalty")
        );
        assert!(
            bad(|p| p.frequency_penalty = -3.0)
                .to_string()
                .contains("frequency_penalty")
        );
        assert!(
            bad(|p| p.repetition_penalty = 0.0)
                .to_string()
                .contains("repetition_penalty")
        );
        assert!(
            bad(|p| p.repetition_penalty = f32::INFINITY)
                .to_string()
                .contains("inf")
        );
    }

    #[test]
    fn greedy_is_argmax_with_ties_to_lowest_id() {
        let mut s = Sampler::new(SamplingParams::greedy(), &[]);
        assert_eq!(s.sample(&mut [0.1, 3.0, 3.0, -1.0]), 1);
        assert_eq!(s.sample(&mut [f32::NAN, 2.0, f32::NAN]), 1);
        assert_eq!(s.sample(&mut [5.0, 5.0]), 0);
        assert_eq!(s.sample(&mut []), 0);
        // top_k = 1 is greedy too, whatever the temperature.
        let mut s = Sampler::new(
            SamplingParams {
                top_k: 1,
                ..params(1.0)
            },
            &[],
        );
        for _ in 0..20 {
            assert_eq!(s.sample(&mut [1.0, 1.2, 1.1]), 1);
        }
    }

    #[test]
    fn degenerate_logits_do_not_panic() {
        let mut s = Sampler::new(params(1.0), &[]);
        assert_eq!(s.sample(&mut [f32::NEG_INFINITY, f32::INFINITY, 1.0]), 1);
        let t = s.sample(&mut [f32::NEG_INFINITY, f32::NEG_INFINITY]);
        assert!(t < 2);
        assert_eq!(s.sample(&mut [f32::NAN, f32::NAN, 0.0]), 2);
        assert_eq!(s.sample(&mut []), 0);
        // Tiny temperatures behave like greedy instead of overflowing.
        let mut s = Sampler::new(params(1e-30), &[]);
        assert_eq!(s.sample(&mut [1.0, 1.5, -3.0]), 1);
        // Unvalidated parameters are tolerated.
        let mut s = Sampler::new(
            SamplingParams {
                top_p: -1.0,
                min_p: 7.0,
                temperature: f32::NAN,
                ..params(1.0)
            },
            &[],
        );
        assert_eq!(s.sample(&mut [0.0, 2.0, 1.0]), 1);
    }

    #[test]
    fn same_seed_same_tokens() {
        let logits = big_logits(49_152, 7);
        let p = SamplingParams {
            temperature: 0.9,
            top_p: 0.95,
            seed: Some(1234),
            ..SamplingParams::default()
        };
        let run = |p: &SamplingParams| {
            let mut s = Sampler::new(p.clone(), &[]);
            (0..50)
                .map(|_| s.sample(&mut logits.clone()))
                .collect::<Vec<_>>()
        };
        let a = run(&p);
        assert_eq!(a, run(&p));
        let b = run(&SamplingParams {
            seed: Some(1235),
            ..p.clone()
        });
        assert_ne!(a, b, "a different seed should give a different sequence");
        // Unseeded samplers differ from each other (with overwhelming probability).
        let unseeded = SamplingParams { seed: None, ..p };
        assert_ne!(run(&unseeded), run(&unseeded));
    }

    #[test]
    fn temperature_one_follows_the_softmax() {
        let probs = [0.5, 0.3, 0.2];
        let mut s = Sampler::new(params(1.0), &[]);
        let n = 20_000;
        let h = histogram(&mut s, &logits_of(&probs), n);
        for (i, p) in probs.iter().enumerate() {
            #[allow(clippy::cast_precision_loss)]
            let f = h[i] as f32 / n as f32;
            assert!((f - p).abs() < 0.015, "token {i}: {f} vs {p}");
        }
    }

    #[test]
    fn temperature_sharpens_and_flattens() {
        let logits = logits_of(&[0.5, 0.3, 0.2]);
        let mut cold = Sampler::new(params(0.1), &[]);
        let h = histogram(&mut cold, &logits, 2000);
        // At T = 0.1 the weights are 1, 0.6^10 and 0.4^10: token 0 has p = 0.9939, so about 12
        // of 2,000 draws (sd 3.5) are another token; 40 would be eight sd out.
        assert!(h[0] > 1960, "{h:?}");
        let mut hot = Sampler::new(params(5.0), &[]);
        let h = histogram(&mut hot, &logits, 6000);
        // At T = 5 the distribution is close to uniform: every token above 25%.
        assert!(h.iter().all(|&c| c > 1500), "{h:?}");
    }

    #[test]
    fn top_k_restricts_the_support() {
        let probs = [0.05, 0.3, 0.1, 0.25, 0.2, 0.1];
        let mut s = Sampler::new(
            SamplingParams {
                top_k: 3,
                ..params(1.0)
            },
            &[],
        );
        let h = histogram(&mut s, &logits_of(&probs), 5000);
        assert_eq!(h[0] + h[2] + h[5], 0, "{h:?}");
        assert!(h[1] > 0 && h[3] > 0 && h[4] > 0, "{h:?}");
        // Renormalised over {1, 3, 4}: 0.3/0.75 = 0.4.
        assert!((h[1] as f32 / 5000.0 - 0.4).abs() < 0.03, "{h:?}");
    }

    #[test]
    fn top_p_restricts_the_support() {
        let probs = [0.15, 0.5, 0.05, 0.3];
        let mut s = Sampler::new(
            SamplingParams {
                top_p: 0.75,
                ..params(1.0)
            },
            &[],
        );
        let h = histogram(&mut s, &logits_of(&probs), 5000);
        assert_eq!(h[0] + h[2], 0, "{h:?}");
        assert!((h[1] as f32 / 5000.0 - 0.625).abs() < 0.03, "{h:?}");
        // The most likely token always survives, even when it alone exceeds top_p.
        let mut s = Sampler::new(
            SamplingParams {
                top_p: 0.1,
                ..params(1.0)
            },
            &[],
        );
        let h = histogram(&mut s, &logits_of(&probs), 500);
        assert_eq!(h[1], 500);
    }

    #[test]
    fn min_p_restricts_the_support() {
        let probs = [0.05, 0.5, 0.15, 0.3];
        let mut s = Sampler::new(
            SamplingParams {
                min_p: 0.2, // keeps p >= 0.1
                ..params(1.0)
            },
            &[],
        );
        let h = histogram(&mut s, &logits_of(&probs), 5000);
        assert_eq!(h[0], 0, "{h:?}");
        assert!(h[1] > 0 && h[2] > 0 && h[3] > 0, "{h:?}");
        // min_p applies to the tempered distribution: at T = 0.5 the ratios square, so
        // 0.15 / 0.5 = 0.3 becomes 0.09 < 0.2 and token 2 is dropped.
        let mut s = Sampler::new(
            SamplingParams {
                min_p: 0.2,
                ..params(0.5)
            },
            &[],
        );
        let h = histogram(&mut s, &logits_of(&probs), 3000);
        assert_eq!(h[0] + h[2], 0, "{h:?}");
    }

    /// The bucketed nucleus keeps exactly the set a full sort keeps, on realistic and on
    /// adversarial (flat, tied, tiny) distributions.
    #[test]
    fn nucleus_matches_a_full_sort() {
        let mut inputs: Vec<(String, Vec<f32>)> = (1..=4)
            .map(|seed| (format!("skewed {seed}"), big_logits(49_152, seed)))
            .collect();
        inputs.push(("flat".into(), vec![0.0; 5000]));
        inputs.push((
            "two levels".into(),
            (0..5000)
                .map(|i| if i % 7 == 0 { 0.0 } else { -1.0 })
                .collect(),
        ));
        inputs.push((
            "steep".into(),
            (0..3000).map(|i| -0.05 * i as f32).collect(),
        ));
        inputs.push(("small".into(), vec![-1.0, 0.0, -0.5, -3.0, -0.5]));
        for (name, logits) in &inputs {
            let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            for top_p in [0.2f32, 0.5, 0.9, 0.95, 0.999] {
                let mut cands: Vec<Cand> = logits
                    .iter()
                    .enumerate()
                    .map(|(i, &l)| Cand {
                        id: i as u32,
                        w: fast_exp(l - max),
                    })
                    .collect();
                let mut reference = cands.clone();
                let total: f64 = reference.iter().map(|c| f64::from(c.w)).sum();
                nucleus(&mut cands, f64::from(top_p) * total, &mut Vec::new());

                reference.sort_by(by_weight_desc);
                let mut acc = 0.0;
                let mut keep = reference.len();
                for (i, c) in reference.iter().enumerate() {
                    acc += f64::from(c.w);
                    if acc >= f64::from(top_p) * total {
                        keep = i + 1;
                        break;
                    }
                }
                let mut got: Vec<u32> = cands.iter().map(|c| c.id).collect();
                got.sort_unstable();
                let mut want: Vec<u32> = reference[..keep].iter().map(|c| c.id).collect();
                want.sort_unstable();
                assert_eq!(got, want, "{name}, top_p {top_p}");
            }
        }
    }

    #[test]
    fn fast_exp_is_accurate() {
        assert_eq!(fast_exp(0.0), 1.0);
        assert_eq!(fast_exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(fast_exp(f32::NAN), 0.0);
        assert_eq!(fast_exp(-100.0), 0.0);
        let mut x = 0.0f32;
        while x > -87.0 {
            let (got, want) = (fast_exp(x), x.exp());
            assert!(
                ((got - want) / want).abs() < 1e-5,
                "exp({x}) = {got}, want {want}"
            );
            x -= 0.0137;
        }
    }

    #[test]
    fn combined_filters_stay_in_the_reference_support() {
        let logits = big_logits(49_152, 11);
        let p = SamplingParams {
            temperature: 0.7,
            top_k: 40,
            top_p: 0.9,
            min_p: 0.05,
            seed: Some(5),
            ..SamplingParams::default()
        };
        // Reference support computed by brute force.
        let mut order: Vec<usize> = (0..logits.len()).collect();
        order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
        let top: Vec<usize> = order[..40].to_vec();
        let max = logits[top[0]];
        let w: Vec<f64> = top
            .iter()
            .map(|&i| f64::from(((logits[i] - max) / 0.7).exp()))
            .collect();
        let total: f64 = w.iter().sum();
        let mut acc = 0.0;
        let mut support = Vec::new();
        for (j, &i) in top.iter().enumerate() {
            acc += w[j];
            support.push(i);
            if acc >= 0.9 * total {
                break;
            }
        }
        support.retain(|&i| w[top.iter().position(|&x| x == i).unwrap_or(0)] >= 0.05);
        let mut s = Sampler::new(p, &[]);
        let mut hit = std::collections::HashSet::new();
        for _ in 0..3000 {
            let t = s.sample(&mut logits.clone()) as usize;
            assert!(support.contains(&t), "token {t} outside the support");
            hit.insert(t);
        }
        assert_eq!(hit.len(), support.len(), "every allowed token shows up");
    }

    #[test]
    fn presence_and_frequency_penalties() {
        // Greedy makes the effect visible: logits are re-created every step.
        let mut s = Sampler::new(
            SamplingParams {
                frequency_penalty: 0.3,
                ..SamplingParams::greedy()
            },
            &[0, 0, 0], // prompt tokens don't count for OpenAI penalties
        );
        let base = [1.0, 0.5, 0.0];
        let mut l = base;
        assert_eq!(s.sample(&mut l), 0); // 1.0 vs 0.5
        let mut l = base;
        assert_eq!(s.sample(&mut l), 0); // 0.7 vs 0.5
        assert!((l[0] - 0.7).abs() < 1e-6);
        let mut l = base;
        assert_eq!(s.sample(&mut l), 1); // 0.4 vs 0.5
        assert!((l[0] - 0.4).abs() < 1e-6);

        let mut s = Sampler::new(
            SamplingParams {
                presence_penalty: 1.0,
                ..SamplingParams::greedy()
            },
            &[],
        );
        s.accept(0);
        s.accept(0);
        let mut l = [1.0, 0.5, 0.0];
        assert_eq!(s.sample(&mut l), 1);
        assert_eq!(l, [0.0, 0.5, 0.0], "presence counts once, however often");
        // Negative penalties encourage repetition.
        let mut s = Sampler::new(
            SamplingParams {
                presence_penalty: -1.0,
                ..SamplingParams::greedy()
            },
            &[],
        );
        s.accept(2);
        assert_eq!(s.sample(&mut [1.0, 0.5, 0.2]), 2);
    }

    #[test]
    fn repetition_penalty_divides_positive_and_multiplies_negative() {
        let s = Sampler::new(
            SamplingParams {
                repetition_penalty: 2.0,
                ..SamplingParams::greedy()
            },
            &[0, 1, 1],
        );
        let mut l = [4.0, -1.0, 3.0, 99.0];
        s.apply_penalties(&mut l);
        assert_eq!(l, [2.0, -2.0, 3.0, 99.0]);
        // Ids beyond the logits are ignored.
        let mut s = s;
        s.accept(1000);
        let mut l = [4.0];
        s.apply_penalties(&mut l);
        assert_eq!(l, [2.0]);
    }

    #[test]
    fn penalties_off_leave_logits_untouched() {
        let mut s = Sampler::new(SamplingParams::greedy(), &[0, 1]);
        s.accept(0);
        let mut l = [1.0, 2.0];
        s.apply_penalties(&mut l);
        assert_eq!(l, [1.0, 2.0]);
        assert!(!s.seen.contains_key(&1), "prompt not recorded when unused");
    }

    /// Not a benchmark, a guard against accidental quadratic behaviour: 200 steps over a
    /// 49,152-token vocabulary with every filter on must finish quickly even in debug builds.
    #[test]
    fn logprobs_are_the_log_softmax_of_the_raw_logits() {
        let logits = [1.0f32, 3.0, 2.0, f32::NEG_INFINITY, 3.0];
        let lp = logprobs(&logits, 2, 3);
        let z: f64 = logits.iter().map(|&l| f64::from(l).exp()).sum();
        let want = |l: f32| (f64::from(l) - z.ln()) as f32;
        assert!((lp.logprob - want(2.0)).abs() < 1e-5, "{lp:?}");
        assert_eq!(lp.id, 2);
        let ids: Vec<u32> = lp.top.iter().map(|t| t.0).collect();
        assert_eq!(
            ids,
            vec![1, 4, 2],
            "most likely first, ties to the lower id"
        );
        for (id, l) in &lp.top {
            assert!((l - want(logits[*id as usize])).abs() < 1e-5);
        }
        let probs: f64 = logits.iter().map(|&l| f64::from(want(l)).exp()).sum();
        assert!((probs - 1.0).abs() < 1e-5);
        let none = logprobs(&logits, 3, 0);
        assert!(none.top.is_empty() && none.logprob == f32::NEG_INFINITY);
        // Penalties and bias never change logprobs: they are taken before sampling.
        let big = big_logits(49_152, 3);
        let lp = logprobs(&big, 7, 20);
        assert_eq!(lp.top.len(), 20);
        assert!(lp.top.windows(2).all(|w| w[0].1 >= w[1].1));
        assert_eq!(lp.top[0].0, argmax(&big).0);
    }

    #[test]
    fn logit_bias_bans_and_forces() {
        let logits = logits_of(&[0.5, 0.3, 0.2]);
        let mut p = SamplingParams::greedy();
        p.logit_bias = vec![(0, -100.0)];
        let mut s = Sampler::new(p.clone(), &[]);
        assert_eq!(s.sample(&mut logits.clone()), 1);
        p.logit_bias = vec![(2, 100.0), (99, 5.0)];
        let mut s = Sampler::new(p.clone(), &[]);
        assert_eq!(
            s.sample(&mut logits.clone()),
            2,
            "ids past the vocabulary are ignored"
        );
        p.logit_bias = vec![(0, 101.0)];
        assert!(p.validate().is_err());
    }

    #[test]
    fn big_vocabulary_is_fast_enough() {
        let logits = big_logits(49_152, 3);
        let mut s = Sampler::new(
            SamplingParams {
                temperature: 0.8,
                top_p: 0.95,
                min_p: 0.01,
                repetition_penalty: 1.1,
                frequency_penalty: 0.1,
                seed: Some(9),
                ..SamplingParams::default()
            },
            &(0..2000).collect::<Vec<u32>>(),
        );
        let start = std::time::Instant::now();
        let mut buf = logits.clone();
        for _ in 0..200 {
            buf.copy_from_slice(&logits);
            s.sample(&mut buf);
        }
        let elapsed = start.elapsed();
        assert!(elapsed.as_secs_f32() < 5.0, "{elapsed:?}");
    }
}
