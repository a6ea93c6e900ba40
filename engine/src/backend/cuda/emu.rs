//! A host emulator of the kernels, so the whole GPU code path (weight packing, step metadata,
//! every kernel's indexing and reductions, the GEMM path's bookkeeping, graph replay) is tested
//! against the CPU backend on machines without a GPU.
//!
//! The generated kernel source ([`super::kernels::Target::Host`]) is compiled with the host's
//! C++ compiler (`$CXX`, else `c++`) into a shared library together with a small runtime: each
//! block runs its threads as cooperative fibers on one OS thread, `__syncthreads` and warp
//! shuffles are barriers between them, and `__shared__` arrays are statics (one block runs at a
//! time). Device addresses are host addresses. Everything runs under one process-wide lock.
//!
//! It checks logic, not speed or the GPU's memory model; races that a real GPU could expose
//! (a missing barrier between warps) may go unnoticed when fibers happen to run in order.

use std::collections::HashMap;
use std::ffi::c_void;
use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use half::f16;

use super::gpu::{Arg, Gemm, Gpu, GpuError, Launch};
use super::kernels::{self, KernelConfig, Target};

type LaunchFn = unsafe extern "C" fn(i32, u32, u32, u32, u32, *mut *mut c_void);
type ArgcFn = unsafe extern "C" fn(i32) -> i32;

/// Serializes all emulated launches (the runtime and the kernels' shared arrays are global).
static EMU_LOCK: Mutex<()> = Mutex::new(());

/// Libraries already built in this process, by source hash.
fn cache() -> &'static Mutex<HashMap<u64, Arc<libloading::Library>>> {
    static C: OnceLock<Mutex<HashMap<u64, Arc<libloading::Library>>>> = OnceLock::new();
    C.get_or_init(|| Mutex::new(HashMap::new()))
}

const RUNTIME_H: &str = r#"
#pragma once
float emu_shfl_xor(float v, int mask);
float emu_shfl(float v, int src);
void emu_syncthreads();
int emu_thread_x();
int emu_block_x();
int emu_block_y();
typedef void (*emu_entry_t)(void**);
void emu_run(emu_entry_t e, unsigned gx, unsigned gy, unsigned gz, unsigned bdim, void** params);
"#;

const RUNTIME_CPP: &str = r#"
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include "emu_runtime.h"

namespace {
constexpr int kMaxThreads = 1024;
constexpr unsigned long kStack = 64 * 1024;
struct Fiber { void* sp; char* stack; bool done; };
Fiber g_f[kMaxThreads];
void* g_main_sp = nullptr;
int g_n = 0, g_cur = 0, g_live = 0;
unsigned g_bx = 0, g_by = 0;
emu_entry_t g_entry = nullptr;
void** g_params = nullptr;
int g_arrived = 0;
unsigned g_gen = 0;
int g_warrived[kMaxThreads / 32];
unsigned g_wgen[kMaxThreads / 32];
int g_wlive[kMaxThreads / 32];
float g_slot[kMaxThreads];
}

extern "C" void emu_switch(void** save_sp, void* load_sp);
#if defined(__x86_64__)
asm(R"(
.text
.globl emu_switch
.hidden emu_switch
.type emu_switch, @function
emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
.size emu_switch, .-emu_switch
)");
#else
#error "the kernel emulator's context switch is written for x86-64"
#endif

static void switch_to(int j) {
  int from = g_cur;
  g_cur = j;
  emu_switch(&g_f[from].sp, g_f[j].sp);
}

static void yield_next() {
  for (int i = 1; i < g_n; ++i) {
    int j = (g_cur + i) % g_n;
    if (!g_f[j].done) { switch_to(j); return; }
  }
  std::fprintf(stderr, "emulator: deadlock (a barrier no other thread can reach)\n");
  std::abort();
}

static void trampoline() {
  g_entry(g_params);
  const int me = g_cur, w = me >> 5;
  g_f[me].done = true;
  g_live--;
  g_wlive[w]--;
  if (g_arrived > 0 && g_arrived == g_live) { g_arrived = 0; g_gen++; }
  if (g_warrived[w] > 0 && g_warrived[w] == g_wlive[w]) { g_warrived[w] = 0; g_wgen[w]++; }
  for (int i = 1; i < g_n; ++i) {
    int j = (me + i) % g_n;
    if (!g_f[j].done) switch_to(j); /* never comes back */
  }
  void* dead;
  emu_switch(&dead, g_main_sp);
}

static void init_fiber(Fiber& f) {
  if (!f.stack) f.stack = static_cast<char*>(std::malloc(kStack));
  std::uintptr_t top = (reinterpret_cast<std::uintptr_t>(f.stack) + kStack) & ~std::uintptr_t(15);
  void** sp = reinterpret_cast<void**>(top);
  *--sp = nullptr;
  *--sp = reinterpret_cast<void*>(&trampoline);
  for (int i = 0; i < 6; ++i) *--sp = nullptr;
  f.sp = sp;
  f.done = false;
}

void emu_syncthreads() {
  const unsigned gen = g_gen;
  if (++g_arrived == g_live) { g_arrived = 0; g_gen++; return; }
  while (g_gen == gen) yield_next();
}

static void warp_barrier() {
  const int w = g_cur >> 5;
  const unsigned gen = g_wgen[w];
  if (++g_warrived[w] == g_wlive[w]) { g_warrived[w] = 0; g_wgen[w]++; return; }
  while (g_wgen[w] == gen) yield_next();
}

float emu_shfl_xor(float v, int mask) {
  const int t = g_cur;
  g_slot[t] = v;
  warp_barrier();
  const float r = g_slot[(t & ~31) | ((t & 31) ^ (mask & 31))];
  warp_barrier();
  return r;
}

float emu_shfl(float v, int src) {
  const int t = g_cur;
  g_slot[t] = v;
  warp_barrier();
  const float r = g_slot[(t & ~31) | (src & 31)];
  warp_barrier();
  return r;
}

int emu_thread_x() { return g_cur; }
int emu_block_x() { return (int)g_bx; }
int emu_block_y() { return (int)g_by; }

void emu_run(emu_entry_t e, unsigned gx, unsigned gy, unsigned gz, unsigned bdim, void** params) {
  if (bdim == 0 || bdim > (unsigned)kMaxThreads || bdim % 32 != 0) {
    std::fprintf(stderr, "emulator: unsupported block size %u\n", bdim);
    std::abort();
  }
  g_entry = e;
  g_params = params;
  g_n = (int)bdim;
  for (unsigned bz = 0; bz < gz; ++bz)
    for (unsigned by = 0; by < gy; ++by)
      for (unsigned bx = 0; bx < gx; ++bx) {
        g_bx = bx; g_by = by;
        for (int i = 0; i < g_n; ++i) init_fiber(g_f[i]);
        g_live = g_n; g_arrived = 0;
        for (int w = 0; w < g_n / 32; ++w) { g_wlive[w] = 32; g_warrived[w] = 0; }
        g_cur = 0;
        emu_switch(&g_main_sp, g_f[0].sp);
      }
}
"#;

/// The launch table appended to the kernels: `emu_launch_k(k, ...)` runs kernel `k` of `names`;
/// `emu_kernel_argc(k)` is how many parameters it takes (a launch with another count is refused
/// instead of reading past its argument array).
fn table(names: &[String]) -> String {
    let mut s = String::from(
        "\n#include <utility>\n\
         template <class... A, unsigned long... I>\n\
         static void emu_call_impl(void (*f)(A...), void** p, std::integer_sequence<unsigned long, I...>) {\n\
           f(*static_cast<A*>(p[I])...);\n\
         }\n\
         template <class... A>\n\
         static void emu_call(void (*f)(A...), void** p) {\n\
           emu_call_impl(f, p, std::make_integer_sequence<unsigned long, sizeof...(A)>{});\n\
         }\n\
         template <class... A>\n\
         static constexpr int emu_argc_of(void (*)(A...)) { return (int)sizeof...(A); }\n",
    );
    for (i, n) in names.iter().enumerate() {
        s.push_str(&format!(
            "static void emu_e{i}(void** p) {{ emu_call(&{n}, p); }}\n"
        ));
    }
    s.push_str("static emu_entry_t emu_table[] = {");
    for i in 0..names.len() {
        s.push_str(&format!("emu_e{i}, "));
    }
    s.push_str("};\nstatic const int emu_argc_table[] = {");
    for n in names {
        s.push_str(&format!("emu_argc_of(&{n}), "));
    }
    s.push_str(
        "};\n\
         extern \"C\" int emu_kernel_argc(int k) { return emu_argc_table[k]; }\n\
         extern \"C\" void emu_launch_k(int k, unsigned gx, unsigned gy, unsigned gz, unsigned bdim, void** params) {\n\
           emu_run(emu_table[k], gx, gy, gz, bdim, params);\n\
         }\n",
    );
    s
}

/// The C++ compiler the emulator uses: `$CXX`, else `c++` when it runs.
pub fn compiler() -> Option<PathBuf> {
    let c = std::env::var_os("CXX").map_or_else(|| PathBuf::from("c++"), PathBuf::from);
    Command::new(&c)
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|_| c)
}

/// Whether this machine can run the emulator (an x86-64 host with a C++ compiler).
pub fn available() -> bool {
    cfg!(target_arch = "x86_64") && compiler().is_some()
}

fn build(kc: &KernelConfig, names: &[String]) -> Result<Arc<libloading::Library>, GpuError> {
    let src = format!("{}{}", kernels::source(kc, Target::Host), table(names));
    let mut h = std::collections::hash_map::DefaultHasher::new();
    src.hash(&mut h);
    RUNTIME_CPP.hash(&mut h);
    let key = h.finish();
    let mut c = cache()
        .lock()
        .map_err(|_| GpuError("emulator cache poisoned".into()))?;
    if let Some(lib) = c.get(&key) {
        return Ok(Arc::clone(lib));
    }
    let cxx = compiler().ok_or_else(|| GpuError("no C++ compiler (set CXX)".into()))?;
    let dir = std::env::temp_dir().join(format!("slotlight-emu-{}-{key:016x}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| GpuError(format!("{}: {e}", dir.display())))?;
    let write = |name: &str, text: &str| -> Result<PathBuf, GpuError> {
        let p = dir.join(name);
        std::fs::write(&p, text).map_err(|e| GpuError(format!("{}: {e}", p.display())))?;
        Ok(p)
    };
    write("emu_runtime.h", RUNTIME_H)?;
    let k = write("kernels.cpp", &src)?;
    let r = write("runtime.cpp", RUNTIME_CPP)?;
    let so = dir.join("libslotlight_emu.so");
    let out = Command::new(&cxx)
        .args([
            "-O1",
            "-std=c++17",
            "-shared",
            "-fPIC",
            "-fno-strict-aliasing",
            "-w",
            "-o",
        ])
        .arg(&so)
        .arg(&k)
        .arg(&r)
        .output()
        .map_err(|e| GpuError(format!("running {}: {e}", cxx.display())))?;
    if !out.status.success() {
        return Err(GpuError(format!(
            "emulator build failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    // SAFETY: the library is ours, built just now; its initializers do nothing.
    let lib = unsafe { libloading::Library::new(&so) }
        .map_err(|e| GpuError(format!("loading {}: {e}", so.display())))?;
    let lib = Arc::new(lib);
    c.insert(key, Arc::clone(&lib));
    let _ = std::fs::remove_dir_all(&dir);
    Ok(lib)
}

/// The kernels on the host: a [`Gpu`] whose memory is host memory.
pub struct EmuGpu {
    lib: Option<Arc<libloading::Library>>,
    launch_fn: Option<LaunchFn>,
    argc_fn: Option<ArgcFn>,
    /// Kernel index given by the backend → index in the library's table.
    remap: Vec<i32>,
    bufs: HashMap<u64, Vec<u128>>,
    gemm: bool,
    started: Option<Instant>,
    elapsed: Duration,
    recording: Option<Vec<(Launch, Vec<Arg>)>>,
    graph: Option<Vec<(Launch, Vec<Arg>)>>,
    /// Launches run so far (tests check that a replayed graph ran).
    pub launches: u64,
    /// Graph replays so far.
    pub replays: u64,
}

impl EmuGpu {
    /// An emulated device; `gemm` makes the GEMM path available (computed on the host in f32
    /// from the same f16 inputs cuBLAS would get).
    pub fn new(gemm: bool) -> Self {
        Self {
            lib: None,
            launch_fn: None,
            argc_fn: None,
            remap: Vec::new(),
            bufs: HashMap::new(),
            gemm,
            started: None,
            elapsed: Duration::ZERO,
            recording: None,
            graph: None,
            launches: 0,
            replays: 0,
        }
    }

    fn run(&mut self, l: Launch, args: &[Arg]) -> Result<(), GpuError> {
        let f = self
            .launch_fn
            .ok_or_else(|| GpuError("kernels not loaded".into()))?;
        let k = *self
            .remap
            .get(l.kernel)
            .ok_or_else(|| GpuError(format!("no kernel {}", l.kernel)))?;
        let argc = self
            .argc_fn
            .ok_or_else(|| GpuError("kernels not loaded".into()))?;
        // SAFETY: `k` indexes the table (remapped from the names it was built from).
        let want = unsafe { argc(k) };
        if usize::try_from(want).ok() != Some(args.len()) {
            return Err(GpuError(format!(
                "kernel {} takes {want} arguments, launched with {}",
                l.kernel,
                args.len()
            )));
        }
        let mut slots: Vec<u64> = args.iter().map(|a| a.slot()).collect();
        let mut params: Vec<*mut c_void> = slots
            .iter_mut()
            .map(|s| std::ptr::from_mut(s).cast::<c_void>())
            .collect();
        if l.block.1 != 1 || l.block.2 != 1 {
            return Err(GpuError("the emulator runs one-dimensional blocks".into()));
        }
        let _g = EMU_LOCK
            .lock()
            .map_err(|_| GpuError("emulator lock poisoned".into()))?;
        // SAFETY: the arguments match the kernel's signature (built from the same table as the
        // source) and point at live host allocations of this emulator.
        unsafe {
            f(
                k,
                l.grid.0,
                l.grid.1,
                l.grid.2,
                l.block.0,
                params.as_mut_ptr(),
            );
        }
        self.launches += 1;
        Ok(())
    }

    fn check_range(&self, ptr: u64, bytes: usize) -> Result<(), GpuError> {
        let ok = self.bufs.iter().any(|(&p, v)| {
            ptr >= p
                && usize::try_from(ptr - p)
                    .is_ok_and(|off| off.saturating_add(bytes) <= v.len() * 16)
        });
        if ok {
            Ok(())
        } else {
            Err(GpuError(format!(
                "emulator: {bytes} bytes at {ptr:#x} are outside every allocation"
            )))
        }
    }
}

impl Gpu for EmuGpu {
    fn describe(&self) -> String {
        "kernel emulator (host)".into()
    }

    fn load(&mut self, kc: &KernelConfig, names: &[String]) -> Result<(), GpuError> {
        // Every format, so models of one shape share one build.
        let mut full = kc.clone();
        full.formats = super::layout::WFormat::ALL.to_vec();
        let all = full.kernel_names();
        self.remap = names
            .iter()
            .map(|n| {
                all.iter()
                    .position(|a| a == n)
                    .and_then(|i| i32::try_from(i).ok())
                    .ok_or_else(|| GpuError(format!("kernel {n} unknown")))
            })
            .collect::<Result<_, _>>()?;
        let lib = build(&full, &all)?;
        // SAFETY: `emu_launch_k` has exactly this signature in the generated table.
        let f: LaunchFn = unsafe {
            *lib.get::<LaunchFn>(b"emu_launch_k\0")
                .map_err(|e| GpuError(format!("emu_launch_k: {e}")))?
        };
        // SAFETY: `emu_kernel_argc` has exactly this signature in the generated table.
        let argc: ArgcFn = unsafe {
            *lib.get::<ArgcFn>(b"emu_kernel_argc\0")
                .map_err(|e| GpuError(format!("emu_kernel_argc: {e}")))?
        };
        self.launch_fn = Some(f);
        self.argc_fn = Some(argc);
        self.lib = Some(lib);
        Ok(())
    }

    fn alloc(&mut self, bytes: usize) -> Result<u64, GpuError> {
        let v = vec![0u128; bytes.div_ceil(16).max(1)];
        let p = v.as_ptr() as u64;
        self.bufs.insert(p, v);
        Ok(p)
    }

    fn free(&mut self, ptr: u64) {
        self.bufs.remove(&ptr);
    }

    fn upload(&mut self, dst: u64, src: &[u8]) -> Result<(), GpuError> {
        self.check_range(dst, src.len())?;
        // SAFETY: checked above: `dst` lies in one of our allocations with room for `src`.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst as *mut u8, src.len()) };
        Ok(())
    }

    fn download(&mut self, dst: &mut [f32], src: u64) -> Result<(), GpuError> {
        self.check_range(src, dst.len() * 4)?;
        // SAFETY: as above, for `dst.len()` floats at `src`.
        unsafe {
            std::ptr::copy_nonoverlapping(src as *const f32, dst.as_mut_ptr(), dst.len());
        }
        Ok(())
    }

    fn launch(&mut self, l: Launch, args: &[Arg]) -> Result<(), GpuError> {
        if let Some(rec) = self.recording.as_mut() {
            rec.push((l, args.to_vec()));
            return Ok(());
        }
        self.run(l, args)
    }

    fn has_gemm(&self) -> bool {
        self.gemm
    }

    fn gemm(&mut self, g: &Gemm) -> Result<(), GpuError> {
        if self.recording.is_some() {
            return Err(GpuError("GEMMs are not recorded in graphs".into()));
        }
        self.check_range(g.a, g.m * g.k * 2)?;
        self.check_range(g.b, ((g.n - 1) * g.ldb + g.k) * 2)?;
        self.check_range(g.c, ((g.n - 1) * g.ldc + g.m) * 4)?;
        let h = |p: u64, i: usize| {
            // SAFETY: index within the ranges checked above.
            f16::from_bits(unsafe { *(p as *const u16).add(i) }).to_f32()
        };
        for t in 0..g.n {
            for i in 0..g.m {
                let mut s = 0f32;
                for kk in 0..g.k {
                    s += h(g.a, i * g.k + kk) * h(g.b, t * g.ldb + kk);
                }
                // SAFETY: within the output range checked above.
                unsafe {
                    let c = (g.c as *mut f32).add(t * g.ldc + i);
                    *c = if g.accumulate { *c + s } else { s };
                }
            }
        }
        Ok(())
    }

    fn timer_start(&mut self) -> Result<(), GpuError> {
        self.started = Some(Instant::now());
        Ok(())
    }

    fn timer_stop(&mut self) -> Result<(), GpuError> {
        self.elapsed = self.started.map_or(Duration::ZERO, |s| s.elapsed());
        Ok(())
    }

    fn timer_read(&mut self) -> Result<Duration, GpuError> {
        Ok(self.elapsed)
    }

    fn capture_begin(&mut self) -> Result<(), GpuError> {
        self.graph = None;
        self.recording = Some(Vec::new());
        Ok(())
    }

    fn capture_end(&mut self) -> Result<(), GpuError> {
        self.graph = self.recording.take();
        Ok(())
    }

    fn graph_launch(&mut self) -> Result<(), GpuError> {
        let g = self
            .graph
            .take()
            .ok_or_else(|| GpuError("no graph".into()))?;
        let r = g.iter().try_for_each(|(l, a)| self.run(*l, a));
        self.graph = Some(g);
        self.replays += 1;
        r
    }
}
