//! Times one weight matrix's matmul at batch 1 (in cache and streamed) — a kernel micro-benchmark.
use std::time::Instant;

use slotlight_engine::backend::cpu::matmul::{Input, Weight, matmul};
use slotlight_engine::backend::cpu::{isa, quant::QActs};
use slotlight_engine::model::gguf::GgufFile;

fn main() {
    let path = std::env::args().nth(1).expect("model path");
    let g = GgufFile::open(std::path::Path::new(&path)).expect("gguf");
    let threads: usize = std::env::var("T")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let pool = slotlight_engine::backend::cpu::pool::ComputePool::new(threads);
    let names: Vec<String> = std::env::args().skip(2).collect();
    {
        for name in &names {
            let t = g.tensor(name).expect("tensor");
            let w = Weight::new(&[&t]).expect("weight");
            let k = w.k();
            let x: Vec<f32> = (0..k).map(|i| (i as f32 * 0.37).sin()).collect();
            let mut qa = QActs::default();
            qa.quantize(&pool, isa::detect(), &x, 1, k);
            let mut out = vec![0.0; w.rows()];
            let input = Input {
                x: &x,
                q: Some(&qa),
                rows: 1,
                k,
            };
            let n = 300;
            let t = Instant::now();
            for _ in 0..n {
                matmul(&pool, isa::detect(), &w, &input, &mut out);
            }
            let dt = t.elapsed().as_secs_f64() / f64::from(n);
            let blocks = (w.rows() * k / 32) as f64;
            println!(
                "{name}: {:.1} us/call, {:.2} GB/s, {:.2} ns/block",
                dt * 1e6,
                w.bytes() as f64 / dt / 1e9,
                dt * 1e9 / blocks
            );
        }
    }
}
