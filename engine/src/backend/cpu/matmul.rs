//! `out[T, N] = x[T, K] · W[N, K]ᵀ`, parallel over groups of rows of `W` (and over tokens for
//! long inputs).
//!
//! Block-quantized weights (every GGUF block type) are repacked at load ([`PackedMatrix`]) and
//! use the integer kernels of [`super::gemm`] on activations quantized once per input
//! ([`QActs`]); float weights (F32, F16, BF16) convert one weight row at a time to f32 and take
//! f32 dot products. Rows are split between threads, never the reduction, so results do not depend on
//! the thread count or the batch.

use super::gemm::{self, MAX_TOKENS};
use super::isa::Isa;
use super::packed::{GROUP, PackedMatrix};
use super::pool::{ComputePool, share};
use super::quant::{QActs, QK, QRow};
use crate::model::weights::{Tensor, dequantize};

/// A weight matrix as the CPU backend holds it.
#[derive(Debug)]
pub enum Weight {
    /// Repacked for the integer kernels.
    Packed(PackedMatrix),
    /// Read in place from the model file (types without integer kernels).
    Plain(Tensor),
}

impl Weight {
    /// `tensors` stacked by rows, packed when their type has integer kernels; `None` when they
    /// can be neither packed together nor used as one plain tensor.
    pub fn new(tensors: &[&Tensor]) -> Option<Self> {
        if let Some(p) = PackedMatrix::pack(tensors) {
            return Some(Self::Packed(p));
        }
        match tensors {
            [t] => Some(Self::Plain((*t).clone())),
            _ => None,
        }
    }

    /// Output rows.
    pub fn rows(&self) -> usize {
        match self {
            Self::Packed(p) => p.rows(),
            Self::Plain(t) => t.rows(),
        }
    }

    /// Row length.
    pub fn k(&self) -> usize {
        match self {
            Self::Packed(p) => p.k(),
            Self::Plain(t) => t.row_len(),
        }
    }

    /// Whether the input must be quantized ([`QActs`]).
    pub fn needs_quantized(&self) -> bool {
        matches!(self, Self::Packed(_))
    }

    /// Bytes one pass over the matrix reads.
    pub fn bytes(&self) -> usize {
        match self {
            Self::Packed(p) => p.bytes(),
            Self::Plain(t) => t.bytes().len(),
        }
    }
}

/// A matmul input: f32 activations, with their quantized form when a packed weight needs it.
pub struct Input<'a> {
    /// `rows * k` activations.
    pub x: &'a [f32],
    /// The same activations quantized (required for packed weights).
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
// SAFETY: each task writes a disjoint set of output elements (its own rows and tokens).
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

/// Tokens per task: the activations a task streams for each weight group stay in L2.
const TOKENS_PER_TASK: usize = 64;

/// Plain rows per task.
const PLAIN_ROWS_PER_TASK: usize = 16;

/// `out[t * n + r] = Σ_j x[t * k + j] · w[r, j]`, where `n` is `w`'s row count.
pub fn matmul(pool: &ComputePool, isa: Isa, w: &Weight, input: &Input<'_>, out: &mut [f32]) {
    matmul_many(pool, isa, &[w], input, &mut [out]);
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// One unit of work: matrix `w`, its row groups (or plain rows) `r0..r1`, tokens `t0..t1`.
#[derive(Clone, Copy)]
struct Task {
    w: usize,
    r0: usize,
    r1: usize,
    t0: usize,
    t1: usize,
}

/// Several matmuls over the same input (Q, K and V; gate and up) in one parallel section, so
/// the threads meet once instead of once per matrix.
pub fn matmul_many(
    pool: &ComputePool,
    isa: Isa,
    ws: &[&Weight],
    input: &Input<'_>,
    outs: &mut [&mut [f32]],
) {
    assert_eq!(ws.len(), outs.len());
    let t_count = input.rows;
    let mut ptrs = Vec::with_capacity(ws.len());
    let units: usize = ws
        .iter()
        .map(|w| match w {
            Weight::Packed(p) => p.groups(),
            Weight::Plain(t) => t.rows().div_ceil(PLAIN_ROWS_PER_TASK),
        })
        .sum();
    let token_ranges = t_count.div_ceil(TOKENS_PER_TASK).max(1);
    // About eight tasks per thread: small enough to balance (a descheduled thread delays a
    // section by one task at most), large enough that claiming is free.
    let per_task = (units * token_ranges / (pool.threads() * 8)).clamp(1, 64);
    let mut tasks: Vec<Task> = Vec::new();
    for (i, (w, out)) in ws.iter().zip(outs.iter_mut()).enumerate() {
        assert_eq!(w.k(), input.k, "matmul: K mismatch");
        assert!(out.len() >= t_count * w.rows());
        if w.needs_quantized() {
            let q = input.q.expect("matmul: quantized activations missing");
            assert!(
                q.rows >= t_count && q.k == input.k,
                "matmul: quantized activations do not match"
            );
        }
        ptrs.push(OutPtr(out.as_mut_ptr()));
        let (n_units, unit_rows) = match w {
            Weight::Packed(p) => (p.groups(), 1),
            Weight::Plain(t) => (t.rows().div_ceil(PLAIN_ROWS_PER_TASK), PLAIN_ROWS_PER_TASK),
        };
        let rows = w.rows();
        for tr in 0..token_ranges {
            let (t0, t1) = share(t_count, tr, token_ranges);
            let mut u = 0;
            while u < n_units {
                let end = (u + per_task).min(n_units);
                let (r0, r1) = match w {
                    Weight::Packed(_) => (u, end),
                    Weight::Plain(_) => (u * unit_rows, (end * unit_rows).min(rows)),
                };
                tasks.push(Task {
                    w: i,
                    r0,
                    r1,
                    t0,
                    t1,
                });
                u = end;
            }
        }
    }
    let qrows: Option<Vec<QRow<'_>>> = input.q.map(|q| (0..t_count).map(|t| q.row(t)).collect());
    let run = |c: usize| {
        let task = tasks[c];
        let w = ws[task.w];
        let ptr = ptrs[task.w];
        match w {
            Weight::Packed(p) => {
                // Packed weights read the input's quantized rows (`input.q`); an input
                // without them gives the task an empty list.
                let rows = qrows.as_deref().unwrap_or(&[]);
                packed_task(isa, p, rows, &task, ptr);
            }
            Weight::Plain(t) => plain_task(t, input, &task, ptr),
        }
    };
    pool.run(tasks.len(), &run);
}

/// Row groups `r0..r1` of `p` for tokens `t0..t1`: a few tokens take each whole run of groups
/// in one kernel call; more tokens go group by group, each group's weights staying in L1 while
/// the tokens pass.
fn packed_task(isa: Isa, p: &PackedMatrix, rows: &[QRow<'_>], task: &Task, ptr: OutPtr) {
    let n = p.rows();
    let nb = p.k() / QK;
    // Groups whose eight rows are all real; a last partial group goes through a buffer.
    let full_end = task.r1.min(n / GROUP);
    let tokens = task.t1 - task.t0;
    let run = |g0: usize, g1: usize, t: usize, tn: usize| {
        if g1 > g0 {
            // SAFETY: rows g0·8..g1·8 of tokens t..t+tn belong to this task only, and the
            // output holds t_count × n floats.
            unsafe {
                gemm::group_dot(
                    isa,
                    p.format(),
                    p.groups_from(g0),
                    g1 - g0,
                    nb,
                    &rows[t..t + tn],
                    ptr.get().add(t * n + g0 * GROUP),
                    n,
                );
            }
        }
    };
    if tokens <= MAX_TOKENS {
        run(task.r0, full_end, task.t0, tokens);
    } else {
        for g in task.r0..full_end {
            let mut t = task.t0;
            while t < task.t1 {
                let tn = (task.t1 - t).min(MAX_TOKENS);
                run(g, g + 1, t, tn);
                t += tn;
            }
        }
    }
    for g in full_end.max(task.r0)..task.r1 {
        let mut t = task.t0;
        while t < task.t1 {
            let tn = (task.t1 - t).min(MAX_TOKENS);
            let mut tmp = [0f32; GROUP * MAX_TOKENS];
            // SAFETY: `tmp` holds tn × 8 floats.
            unsafe {
                gemm::group_dot(
                    isa,
                    p.format(),
                    p.group(g),
                    1,
                    nb,
                    &rows[t..t + tn],
                    tmp.as_mut_ptr(),
                    GROUP,
                );
            }
            for j in 0..tn {
                for i in 0..n - g * GROUP {
                    // SAFETY: as above; only the real rows are written.
                    unsafe { *ptr.get().add((t + j) * n + g * GROUP + i) = tmp[j * GROUP + i] };
                }
            }
            t += tn;
        }
    }
}

/// Plain rows `r0..r1` of `w` for tokens `t0..t1`: each row converted to f32 once.
fn plain_task(w: &Tensor, input: &Input<'_>, task: &Task, ptr: OutPtr) {
    let n = w.rows();
    let k = input.k;
    SCRATCH.with_borrow_mut(|row| {
        row.resize(k, 0.0);
        for r in task.r0..task.r1 {
            dequantize(w.dtype(), w.row_bytes_of(r), row);
            for t in task.t0..task.t1 {
                let v = dot_f32(row, &input.x[t * k..(t + 1) * k]);
                // SAFETY: row r of tokens t0..t1 belongs to this task only.
                unsafe { *ptr.get().add(t * n + r) = v };
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
    fn matmul_matches_dequantized_reference_for_every_type_and_isa() {
        let (n, t) = (43, 7);
        for dtype in DType::ALL {
            // Rows of whole blocks: two super-blocks for the K-quants, three blocks otherwise.
            let k = if dtype.block_elems() == 256 { 512 } else { 96 };
            let mut rng = FixtureRng::new(3);
            let wf = rng.vec(n * k, 1.0);
            let mut b = GgufBuilder::new();
            b.tensor_quantized("w", &[n, k], dtype, &wf);
            let (_d, p) = b.write_temp();
            let g = crate::model::gguf::GgufFile::open(&p).expect("gguf");
            let tensor = g.tensor("w").expect("w");
            let wd = tensor.to_f32_vec();
            let w = Weight::new(&[&tensor]).expect("weight");
            assert_eq!(w.needs_quantized(), dtype.is_quantized());
            let x = rng.vec(t * k, 1.0);
            let pool = ComputePool::new(2);
            for isa in Isa::available() {
                let mut qa = QActs::default();
                qa.quantize(&pool, isa, &x, t, k);
                let input = Input {
                    x: &x,
                    q: Some(&qa),
                    rows: t,
                    k,
                };
                let mut out = vec![f32::NAN; t * n];
                matmul(&pool, isa, &w, &input, &mut out);
                for ti in 0..t {
                    for r in 0..n {
                        let exact: f32 = (0..k).map(|j| wd[r * k + j] * x[ti * k + j]).sum();
                        let got = out[ti * n + r];
                        // The cost of 8-bit activations, growing as √k (0.15 at k = 96).
                        #[allow(clippy::cast_precision_loss)]
                        let tol = 0.15 * (k as f32 / 96.0).sqrt();
                        assert!(
                            (got - exact).abs() < tol,
                            "{isa:?} {dtype:?} t={ti} r={r}: {got} vs {exact}"
                        );
                    }
                }
            }
        }
    }
}
