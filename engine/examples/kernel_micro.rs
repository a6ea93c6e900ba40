//! Times named weight matrices' matmuls — a kernel micro-benchmark.
//!
//! `kernel_micro MODEL.gguf TENSOR...`; env `T` (threads, default 1) and `P` (tokens per call,
//! default 1: decode; 64 or more: the prefill shape). Prints time per call, weight bytes read
//! per second and integer multiply-adds per second.
use std::time::Instant;

use slotlight_engine::backend::cpu::matmul::{Input, Weight, matmul};
use slotlight_engine::backend::cpu::{isa, quant::QActs};
use slotlight_engine::model::gguf::GgufFile;

/// CPU time of every thread of this process so far, in seconds (from `/proc`), so that figures
/// hold on a busy machine; `None` where `/proc` lacks it.
fn cpu_seconds() -> Option<f64> {
    let mut ns = 0u64;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let stat = std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok()?;
        ns += stat.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(ns as f64 / 1e9)
}

fn main() {
    let path = std::env::args().nth(1).expect("model path");
    let g = GgufFile::open(std::path::Path::new(&path)).expect("gguf");
    let threads: usize = std::env::var("T")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let pool = slotlight_engine::backend::cpu::pool::ComputePool::new(threads);
    let names: Vec<String> = std::env::args().skip(2).collect();
    let tokens: usize = std::env::var("P")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    {
        for name in &names {
            let t = g.tensor(name).expect("tensor");
            let w = Weight::new(&[&t]).expect("weight");
            let k = w.k();
            let x: Vec<f32> = (0..k * tokens).map(|i| (i as f32 * 0.37).sin()).collect();
            let mut qa = QActs::default();
            qa.quantize(&pool, isa::detect(), &x, tokens, k);
            let mut out = vec![0.0; w.rows() * tokens];
            let input = Input {
                x: &x,
                q: Some(&qa),
                rows: tokens,
                k,
            };
            let n: u32 = std::env::var("N")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(300);
            matmul(&pool, isa::detect(), &w, &input, &mut out);
            let t = Instant::now();
            let c0 = cpu_seconds();
            for _ in 0..n {
                matmul(&pool, isa::detect(), &w, &input, &mut out);
            }
            let wall = t.elapsed().as_secs_f64() / f64::from(n);
            // CPU time per call per thread where known (the wall time on a busy machine
            // counts other processes' turns too).
            let dt = match (c0, cpu_seconds()) {
                (Some(a), Some(b)) => (b - a) / f64::from(n) / threads as f64,
                _ => wall,
            };
            let blocks = (w.rows() * k / 32) as f64;
            println!(
                "{name} ({:?}, {tokens} tokens): {:.1} us/call, {:.2} GB/s, {:.2} ns/block, {:.1} GMAC/s",
                isa::detect(),
                dt * 1e6,
                w.bytes() as f64 / dt / 1e9,
                dt * 1e9 / blocks,
                blocks * 32.0 * tokens as f64 / dt / 1e9
            );
        }
    }
}
