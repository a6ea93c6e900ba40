//! `out[T, N] = x[T, K] · W[N, K]ᵀ` over stored weights, parallel over the rows of `W`.
//!
//! Q4_0, Q4_1 and Q8_0 weights use the integer kernels of [`super::dot`] on activations
//! quantized once per input ([`QActs`]); other types (F32, F16, BF16, Q4_K, Q6_K) convert one
//! weight row at a time to f32 and take f32 dot products. Rows are split between threads, never
//! the reduction, so results do not depend on the thread count or the batch.

use rayon::prelude::*;

use super::dot;
use super::isa::Isa;
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
pub fn matmul(isa: Isa, w: &Tensor, input: &Input<'_>, out: &mut [f32]) {
    let n = w.rows();
    let t_count = input.rows;
    assert_eq!(w.row_len(), input.k, "matmul {}: K mismatch", w.name());
    assert!(out.len() >= t_count * n);
    let ptr = OutPtr(out.as_mut_ptr());
    let tasks = n.div_ceil(ROWS_PER_TASK);
    let int = dot::has_int_kernel(w.dtype());
    if int {
        assert!(
            input.q.is_some(),
            "matmul {}: quantized activations missing",
            w.name()
        );
    }
    let qrows: Option<Vec<_>> = input
        .q
        .filter(|_| int)
        .map(|q| (0..t_count).map(|t| q.row(t)).collect());
    (0..tasks)
        .into_par_iter()
        .for_each_init(Vec::new, |scratch: &mut Vec<f32>, task| {
            scratch.resize(t_count + input.k.max(dot::scratch_len(input.k)), 0.0);
            let (res, scratch) = scratch.split_at_mut(t_count);
            let r0 = task * ROWS_PER_TASK;
            let r1 = (r0 + ROWS_PER_TASK).min(n);
            if let Some(rows) = qrows.as_deref() {
                for r in r0..r1 {
                    dot::dot_row(isa, w.dtype(), w.row_bytes_of(r), rows, res, scratch);
                    for (t, v) in res.iter().enumerate() {
                        // SAFETY: row r belongs to this task only; t < t_count.
                        unsafe { *ptr.get().add(t * n + r) = *v };
                    }
                }
            } else {
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
        });
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
            matmul(crate::backend::cpu::isa::detect(), &w, &input, &mut out);
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
