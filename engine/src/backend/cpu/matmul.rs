//! `out[T, N] = x[T, K] · W[N, K]ᵀ` over stored weights, parallel over the rows of `W`.
//!
//! Q4_0, Q4_1 and Q8_0 weights use the integer kernels of [`super::dot`] on activations
//! quantized once per input ([`QActs`]); other types (F32, F16, BF16, Q4_K, Q6_K) convert one
//! weight row at a time to f32 and take f32 dot products. Rows are split between threads, never
//! the reduction, so results do not depend on the thread count or the batch.

use super::dot;
use super::isa::Isa;
use super::pool::{ComputePool, share};
use super::quant::QActs;
use crate::model::weights::{Tensor, dequantize};

/// A matmul input: f32 activations, with their quantized form when a quantized weight needs it.
pub struct Input<'a> {
    /// `rows * k` activations.
    pub x: &'a [f32],
    /// The same activations quantized (required for weights with integer kernels).
    pub q: Option<&'a QActs>,
    /// Number of rows (tokens).
    pub rows: usize,
    /// Row length.
    pub k: usize,
}

#[derive(Clone, Copy)]
struct OutPtr(*mut f32);

impl OutPtr {
    /// The pointer (a method, so closures capture the whole `Send` wrapper).
    fn get(self) -> *mut f32 {
        self.0
    }
}
// SAFETY: each task writes a disjoint set of output elements (its own weight rows).
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

/// Weight rows per parallel task.
const ROWS_PER_TASK: usize = 16;

/// Whether `w` needs quantized activations.
pub fn needs_quantized(w: &Tensor) -> bool {
    dot::has_int_kernel(w.dtype())
}

/// `out[t * n + r] = Σ_k x[t * k + j] · w[r, j]`, where `n` is `w`'s row count.
pub fn matmul(pool: &ComputePool, isa: Isa, w: &Tensor, input: &Input<'_>, out: &mut [f32]) {
    matmul_many(pool, isa, &[w], input, &mut [out]);
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Several matmuls over the same input (Q, K and V; gate and up) in one parallel section, so
/// the threads meet once instead of once per matrix. Each thread takes a contiguous share of
/// the rows of all matrices together.
pub fn matmul_many(
    pool: &ComputePool,
    isa: Isa,
    ws: &[&Tensor],
    input: &Input<'_>,
    outs: &mut [&mut [f32]],
) {
    assert_eq!(ws.len(), outs.len());
    let t_count = input.rows;
    let mut tasks: Vec<(usize, usize, usize)> = Vec::new();
    let mut ptrs = Vec::with_capacity(ws.len());
    for (i, (w, out)) in ws.iter().zip(outs.iter_mut()).enumerate() {
        let n = w.rows();
        assert_eq!(w.row_len(), input.k, "matmul {}: K mismatch", w.name());
        assert!(out.len() >= t_count * n);
        if let Some(q) = input.q.filter(|_| needs_quantized(w)) {
            assert!(
                q.rows >= t_count && q.k == input.k,
                "matmul {}: quantized activations do not match",
                w.name()
            );
        }
        assert!(
            !needs_quantized(w) || input.q.is_some(),
            "matmul {}: quantized activations missing",
            w.name()
        );
        ptrs.push(OutPtr(out.as_mut_ptr()));
        tasks.extend(
            (0..n.div_ceil(ROWS_PER_TASK))
                .map(|c| (i, c * ROWS_PER_TASK, ((c + 1) * ROWS_PER_TASK).min(n))),
        );
    }
    let qrows: Option<Vec<_>> = input.q.map(|q| (0..t_count).map(|t| q.row(t)).collect());
    // About eight chunks per thread: small enough to balance, large enough that claiming is free.
    let chunks = tasks.len().min(pool.threads() * 8).max(1);
    let section = |chunk: usize| {
        let (a, b) = share(tasks.len(), chunk, chunks);
        SCRATCH.with_borrow_mut(|scratch| {
            scratch.resize(t_count + input.k.max(dot::scratch_len(input.k)), 0.0);
            let (res, scratch) = scratch.split_at_mut(t_count);
            for &(i, r0, r1) in &tasks[a..b] {
                let w = ws[i];
                let n = w.rows();
                let ptr = ptrs[i];
                match qrows.as_deref() {
                    Some(rows) if needs_quantized(w) => {
                        for r in r0..r1 {
                            dot::dot_row(isa, w.dtype(), w.row_bytes_of(r), rows, res, scratch);
                            for (t, v) in res.iter().enumerate() {
                                // SAFETY: row r of matrix i belongs to this thread only; t < t_count.
                                unsafe { *ptr.get().add(t * n + r) = *v };
                            }
                        }
                    }
                    _ => {
                        let row = &mut scratch[..input.k];
                        for r in r0..r1 {
                            dequantize(w.dtype(), w.row_bytes_of(r), row);
                            for t in 0..t_count {
                                let v = dot_f32(row, &input.x[t * input.k..(t + 1) * input.k]);
                                // SAFETY: as above.
                                unsafe { *ptr.get().add(t * n + r) = v };
                            }
                        }
                    }
                }
            }
        });
    };
    pool.run(chunks, &section);
}

/// f32 dot product with eight independent partial sums (vectorizes well).
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, ra) = a.as_chunks::<8>();
    let (cb, rb) = b.as_chunks::<8>();
    for (x, y) in ca.iter().zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut s: f32 = acc.iter().sum();
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::testing::{FixtureRng, GgufBuilder};
    use crate::model::weights::DType;

    #[test]
    fn matmul_matches_dequantized_reference_for_every_type() {
        let (n, k, t) = (40, 96, 7);
        for dtype in [
            DType::F32,
            DType::F16,
            DType::BF16,
            DType::Q8_0,
            DType::Q4_0,
            DType::Q4_1,
        ] {
            let mut rng = FixtureRng::new(3);
            let wf = rng.vec(n * k, 1.0);
            let mut b = GgufBuilder::new();
            b.tensor_quantized("w", &[n, k], dtype, &wf);
            let (_d, p) = b.write_temp();
            let g = crate::model::gguf::GgufFile::open(&p).expect("gguf");
            let w = g.tensor("w").expect("w");
            let wd = w.to_f32_vec();
            let x = rng.vec(t * k, 1.0);
            let mut qa = QActs::default();
            qa.quantize(&x, t, k);
            let input = Input {
                x: &x,
                q: Some(&qa),
                rows: t,
                k,
            };
            let mut out = vec![0.0; t * n];
            let pool = ComputePool::new(2);
            matmul(
                &pool,
                crate::backend::cpu::isa::detect(),
                &w,
                &input,
                &mut out,
            );
            for ti in 0..t {
                for r in 0..n {
                    let exact: f32 = (0..k).map(|j| wd[r * k + j] * x[ti * k + j]).sum();
                    let got = out[ti * n + r];
                    assert!(
                        (got - exact).abs() < 0.15,
                        "{dtype:?} t={ti} r={r}: {got} vs {exact}"
                    );
                }
            }
        }
    }
}
