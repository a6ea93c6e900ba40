//! A small fork-join pool for the kernels: the caller and `threads - 1` workers share the
//! chunks of one section, claimed one at a time, then meet again.
//!
//! A decode step runs a few hundred short parallel sections (each matmul, each attention), so
//! the cost of one fork-join matters: workers spin briefly on a generation counter between
//! sections and park only after a stretch without work, so an idle engine burns no CPU.
//! Chunks are claimed dynamically, so a worker the OS has descheduled (another process on the
//! machine) delays a section by at most the chunk it holds, never by its whole share.
//! Measured on the default model: with rayon's pool, two threads ran a 1536×576 Q4_1 matmul
//! slower than one.

use std::cell::UnsafeCell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};

/// How long an idle worker spins before parking.
const SPIN: Duration = Duration::from_micros(200);

type Job = *const (dyn Fn(usize) + Sync);

struct Shared {
    /// The current section's closure, valid until every claimed chunk of it is finished.
    job: UnsafeCell<Option<Job>>,
    /// Chunks in the current section.
    chunks: AtomicUsize,
    /// `generation << 32 | next chunk to claim`, or `generation << 32 | CLOSED` while the
    /// owner sets a section up.
    word: AtomicU64,
    /// Chunks of the current section finished.
    finished: AtomicUsize,
    panicked: AtomicBool,
    shutdown: AtomicBool,
    parked: Vec<AtomicBool>,
}

// SAFETY: `job` is written only by the pool's owner between sections (when every claimed chunk
// is finished), and read by workers only after claiming a chunk of the section it belongs to.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

/// A fork-join pool of `threads` threads (the caller counts as one).
pub struct ComputePool {
    shared: Arc<Shared>,
    workers: Vec<(Thread, JoinHandle<()>)>,
    threads: usize,
}

impl std::fmt::Debug for ComputePool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ComputePool({} threads)", self.threads)
    }
}

/// The low half of [`Shared::word`] while a new section is being set up: no chunk of it can be
/// claimed yet, and no chunk of the previous one any more.
const CLOSED: u64 = 0xffff_ffff;

/// Claims the next chunk of generation `generation`, if any.
fn claim(s: &Shared, generation: u64) -> Option<usize> {
    loop {
        let w = s.word.load(Ordering::Acquire);
        if w >> 32 != generation {
            return None;
        }
        let idx = usize::try_from(w & 0xffff_ffff).unwrap_or(usize::MAX);
        if idx >= s.chunks.load(Ordering::Acquire) {
            return None;
        }
        if s.word
            .compare_exchange_weak(w, w + 1, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            return Some(idx);
        }
    }
}

/// Runs claimed chunks of `generation` until none are left.
fn work(s: &Shared, generation: u64) {
    while let Some(idx) = claim(s, generation) {
        // SAFETY: the job of this generation stays alive until this chunk is finished.
        let job = unsafe { *s.job.get() };
        if let Some(job) = job {
            // SAFETY: as above.
            let f = unsafe { &*job };
            if catch_unwind(AssertUnwindSafe(|| f(idx))).is_err() {
                s.panicked.store(true, Ordering::SeqCst);
            }
        }
        s.finished.fetch_add(1, Ordering::AcqRel);
    }
}

impl ComputePool {
    /// A pool of `threads` threads in all (at least 1).
    pub fn new(threads: usize) -> Self {
        let threads = threads.max(1);
        let shared = Arc::new(Shared {
            job: UnsafeCell::new(None),
            chunks: AtomicUsize::new(0),
            word: AtomicU64::new(0),
            finished: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
            parked: (1..threads).map(|_| AtomicBool::new(false)).collect(),
        });
        let workers = (1..threads)
            .map(|i| {
                let s = Arc::clone(&shared);
                let handle = std::thread::Builder::new()
                    .name(format!("slotlight-cpu-{i}"))
                    .spawn(move || worker(&s, i))
                    .expect("spawn compute thread");
                (handle.thread().clone(), handle)
            })
            .collect();
        Self {
            shared,
            workers,
            threads,
        }
    }

    /// Threads in all, the caller included.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Runs `f(chunk)` for every chunk in `0..chunks`, spread over the pool's threads (the
    /// caller takes part), and returns when all are done. A panic in any chunk is re-raised.
    pub fn run(&self, chunks: usize, f: &(dyn Fn(usize) + Sync)) {
        if chunks == 0 {
            return;
        }
        if self.threads == 1 || chunks == 1 {
            for c in 0..chunks {
                f(c);
            }
            return;
        }
        let s = &*self.shared;
        assert!(chunks < 1 << 31, "too many chunks");
        // Close the previous section first: a worker that read its word before this store and
        // the new chunk count after the stores below would otherwise claim a chunk of the old
        // generation with the new count, run the new job with it and count it as finished,
        // so that this call could return while a chunk still runs (and its closure's borrows
        // end). Once closed, such a claim fails (the word changed), and workers wait for the
        // section to open.
        let generation = (s.word.load(Ordering::Acquire) >> 32) + 1;
        s.word.store(generation << 32 | CLOSED, Ordering::SeqCst);
        // SAFETY: every chunk of the previous section is finished, so no one reads `job` now;
        // the pointer stays valid until this function returns, after every chunk is finished.
        unsafe {
            let job: Job =
                std::mem::transmute::<&(dyn Fn(usize) + Sync), &'static (dyn Fn(usize) + Sync)>(f);
            *s.job.get() = Some(job);
        }
        s.chunks.store(chunks, Ordering::Release);
        s.finished.store(0, Ordering::Release);
        s.word.store(generation << 32, Ordering::SeqCst);
        for (i, (t, _)) in self.workers.iter().enumerate() {
            if s.parked[i].load(Ordering::SeqCst) {
                t.unpark();
            }
        }
        work(s, generation);
        let mut spins = 0u32;
        while s.finished.load(Ordering::Acquire) < chunks {
            spins = spins.wrapping_add(1);
            if spins < 2048 {
                std::hint::spin_loop();
            } else {
                // A worker holding a chunk may be descheduled: let it run.
                std::thread::yield_now();
            }
        }
        if s.panicked.swap(false, Ordering::SeqCst) {
            panic!("a compute chunk panicked");
        }
    }
}

fn worker(s: &Shared, i: usize) {
    let mut seen = 0u64;
    loop {
        let mut idle_since: Option<Instant> = None;
        loop {
            let w = s.word.load(Ordering::Acquire);
            let g = w >> 32;
            if g != seen && w & CLOSED != CLOSED {
                seen = g;
                break;
            }
            if s.shutdown.load(Ordering::Relaxed) {
                return;
            }
            let since = *idle_since.get_or_insert_with(Instant::now);
            if since.elapsed() < SPIN {
                for _ in 0..64 {
                    std::hint::spin_loop();
                }
                continue;
            }
            s.parked[i - 1].store(true, Ordering::SeqCst);
            if s.word.load(Ordering::SeqCst) >> 32 == seen && !s.shutdown.load(Ordering::SeqCst) {
                std::thread::park();
            }
            s.parked[i - 1].store(false, Ordering::SeqCst);
            idle_since = None;
        }
        work(s, seen);
    }
}

impl Drop for ComputePool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        for (t, _) in &self.workers {
            t.unpark();
        }
        for (_, h) in self.workers.drain(..) {
            let _ = h.join();
        }
    }
}

/// The range `[start, end)` of chunk `c` when `n` items are cut into `chunks` chunks.
pub fn share(n: usize, c: usize, chunks: usize) -> (usize, usize) {
    (n * c / chunks, n * (c + 1) / chunks)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_chunk_runs_exactly_once() {
        let pool = ComputePool::new(3);
        for n in [1, 2, 5, 64, 300] {
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            pool.run(n, &|c| {
                hits[c].fetch_add(1, Ordering::Relaxed);
            });
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1), "n={n}");
        }
        // After a pause long enough for workers to park, sections still run.
        std::thread::sleep(Duration::from_millis(5));
        let sum = AtomicUsize::new(0);
        pool.run(4, &|c| {
            sum.fetch_add(c + 1, Ordering::Relaxed);
        });
        assert_eq!(sum.load(Ordering::Relaxed), 10);
    }

    /// Many short sections whose chunk counts grow and shrink: every chunk of each runs once
    /// and has finished when `run` returns (a worker's late claim of a finished section with
    /// the next one's count ran a chunk twice and let `run` return before its last chunk
    /// ended; engine tests crashed on it).
    #[test]
    fn back_to_back_sections_of_changing_size_each_run_exactly_once() {
        let pool = ComputePool::new(2);
        for i in 0..100_000usize {
            let n = 2 + i % 7;
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            pool.run(n, &|c| {
                hits[c].fetch_add(1, Ordering::Relaxed);
            });
            assert!(
                hits.iter().all(|h| h.load(Ordering::Relaxed) == 1),
                "section {i} of {n} chunks"
            );
        }
    }

    #[test]
    fn shares_cover_everything_once() {
        for n in [0, 1, 7, 100] {
            let mut covered = 0;
            for t in 0..3 {
                let (a, b) = share(n, t, 3);
                covered += b - a;
            }
            assert_eq!(covered, n);
        }
    }

    #[test]
    fn a_panicking_chunk_is_reported_and_the_pool_survives() {
        let pool = ComputePool::new(2);
        let r = catch_unwind(AssertUnwindSafe(|| {
            pool.run(8, &|c| assert!(c != 5, "chunk fails"))
        }));
        assert!(r.is_err());
        let ok = AtomicUsize::new(0);
        pool.run(8, &|_| {
            ok.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(ok.load(Ordering::Relaxed), 8);
    }
}
