//! The few device operations the backend needs, behind a trait: the real GPU through cudarc
//! ([`CudaGpu`]), or the host emulator used by tests ([`super::emu::EmuGpu`]).
//!
//! Buffers are raw device addresses (`u64`) owned by the implementation; kernel arguments are
//! passed the way `cuLaunchKernel` takes them (one pointer per argument).

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Arc;
use std::time::Duration;

use cudarc::cublas::CudaBlas;
use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaGraph, CudaSlice, CudaStream, DevicePtr,
};

use super::kernels::{KernelConfig, Target};

/// A device failure, as text.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct GpuError(pub String);

impl GpuError {
    fn of(what: &str, e: impl std::fmt::Display) -> Self {
        GpuError(format!("{what}: {e}"))
    }
}

/// A kernel argument.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Arg {
    /// A device address (0 for a null pointer).
    Ptr(u64),
    /// A 32-bit integer.
    I32(i32),
    /// A 32-bit float.
    F32(f32),
}

impl Arg {
    /// The argument's bytes in an 8-byte slot (little-endian: a 4-byte value sits in the low
    /// half, which is what the kernel reads through the slot's address).
    pub fn slot(self) -> u64 {
        match self {
            Arg::Ptr(p) => p,
            Arg::I32(v) => u64::from(v.cast_unsigned()),
            Arg::F32(f) => u64::from(f.to_bits()),
        }
    }
}

/// A launch: kernel index (into the names given to [`Gpu::load`]), grid and block.
#[derive(Debug, Clone, Copy)]
pub struct Launch {
    /// Kernel index.
    pub kernel: usize,
    /// Grid size: thread blocks in x, y, z.
    pub grid: (u32, u32, u32),
    /// Threads per block.
    pub block: (u32, u32, u32),
}

/// `C[n × m] (+)= A[m × k] · B[n × k]ᵀ` in row-major terms, with f16 `A` (weights) and `B`
/// (activations) and f32 `C`: one row of `C` per token. Leading dimensions are row strides.
#[derive(Debug, Clone, Copy)]
pub struct Gemm {
    /// Output features (weight rows).
    pub m: usize,
    /// Tokens: the rows of `B` and `C`.
    pub n: usize,
    /// Reduction length.
    pub k: usize,
    /// Weights, f16 `[m, k]`.
    pub a: u64,
    /// Activations, f16 `[n, ldb]`.
    pub b: u64,
    /// Row stride of `b` in elements.
    pub ldb: usize,
    /// Output, f32 `[n, ldc]`.
    pub c: u64,
    /// Row stride of `c` in elements.
    pub ldc: usize,
    /// Add to `c` (true) or overwrite it.
    pub accumulate: bool,
}

/// What the backend needs from a device.
pub trait Gpu: Send {
    /// A one-line description of the device.
    fn describe(&self) -> String;
    /// Compiles the kernels for `kc` and resolves `names` (launches refer to their index).
    fn load(&mut self, kc: &KernelConfig, names: &[String]) -> Result<(), GpuError>;
    /// A zeroed allocation of `bytes` (at least 256-byte aligned).
    fn alloc(&mut self, bytes: usize) -> Result<u64, GpuError>;
    /// Frees an allocation.
    fn free(&mut self, ptr: u64);
    /// Copies host bytes to `dst` (ordered on the device's queue; `src` may be reused at once).
    fn upload(&mut self, dst: u64, src: &[u8]) -> Result<(), GpuError>;
    /// Copies `dst.len()` floats from `src` once all queued work is done.
    fn download(&mut self, dst: &mut [f32], src: u64) -> Result<(), GpuError>;
    /// Queues a kernel.
    fn launch(&mut self, l: Launch, args: &[Arg]) -> Result<(), GpuError>;
    /// Whether [`Gpu::gemm`] is available.
    fn has_gemm(&self) -> bool;
    /// Queues a GEMM.
    fn gemm(&mut self, g: &Gemm) -> Result<(), GpuError>;
    /// Marks the start of the timed region.
    fn timer_start(&mut self) -> Result<(), GpuError>;
    /// Marks its end.
    fn timer_stop(&mut self) -> Result<(), GpuError>;
    /// Waits for the queue and returns the time between the marks.
    fn timer_read(&mut self) -> Result<Duration, GpuError>;
    /// Starts recording launches into a graph instead of running them.
    fn capture_begin(&mut self) -> Result<(), GpuError> {
        Err(GpuError("graphs are not supported on this device".into()))
    }
    /// Ends recording; the graph replaces any earlier one.
    fn capture_end(&mut self) -> Result<(), GpuError> {
        Err(GpuError("graphs are not supported on this device".into()))
    }
    /// Queues the recorded graph.
    fn graph_launch(&mut self) -> Result<(), GpuError> {
        Err(GpuError("no graph".into()))
    }
}

/// Maps a device's compute capability to the NVRTC architecture name.
pub fn arch_name(major: i32, minor: i32) -> &'static str {
    match (major, minor) {
        (7, 0) => "sm_70",
        (7, 5) => "sm_75",
        (8, 0) => "sm_80",
        (8, 6) => "sm_86",
        (8, 7) => "sm_87",
        (8, 9) => "sm_89",
        (9, 0) => "sm_90",
        (10, 0) => "sm_100",
        (10, 3) => "sm_103",
        (12, 0) => "sm_120",
        (12, 1) => "sm_121",
        // Unknown parts: PTX for the oldest supported architecture, JIT-compiled by the driver.
        _ => "compute_75",
    }
}

/// NVRTC-compiles `kc`'s kernels for `arch` (no GPU needed).
pub fn compile_ptx(kc: &KernelConfig, arch: &'static str) -> Result<cudarc::nvrtc::Ptx, GpuError> {
    let src = super::kernels::source(kc, Target::Cuda);
    let opts = cudarc::nvrtc::CompileOptions {
        arch: Some(arch),
        // Precise division, square root and transcendental functions: the CPU backend is the
        // reference, and the fast variants move logits by more than our tolerance allows.
        use_fast_math: Some(false),
        options: vec!["--std=c++17".into()],
        name: Some("slotlight_kernels.cu".into()),
        ..Default::default()
    };
    cudarc::nvrtc::compile_ptx_with_opts(&src, opts).map_err(|e| GpuError::of("NVRTC", e))
}

/// A CUDA graph, owned by the one thread that runs the backend.
struct Graph(CudaGraph);
// SAFETY: the graph is only created, launched and dropped by the thread currently running the
// backend (the backend is `Send`, not `Sync`, and every call first binds the context).
unsafe impl Send for Graph {}

/// A GPU through cudarc: one context, one stream, NVRTC-compiled kernels, cuBLAS when present.
pub struct CudaGpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    funcs: Vec<CudaFunction>,
    bufs: HashMap<u64, CudaSlice<u8>>,
    blas: Option<CudaBlas>,
    start: CudaEvent,
    stop: CudaEvent,
    graph: Option<Graph>,
    name: String,
    arch: &'static str,
    slots: Vec<u64>,
}

impl CudaGpu {
    /// Opens device `ordinal`. The caller has checked that the driver library is present and
    /// guards against cudarc's panics on missing symbols.
    pub fn open(ordinal: usize) -> Result<Self, GpuError> {
        let ctx = CudaContext::new(ordinal).map_err(|e| GpuError::of("CUDA context", e))?;
        // One stream does all the work: no cross-stream events needed (and graph capture
        // must not see any).
        // SAFETY: no allocation exists yet, and only `stream` ever touches this context's memory.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx
            .new_stream()
            .map_err(|e| GpuError::of("CUDA stream", e))?;
        let name = ctx.name().unwrap_or_else(|_| "unknown GPU".into());
        let (major, minor) = ctx
            .compute_capability()
            .map_err(|e| GpuError::of("compute capability", e))?;
        let timing = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        let start = ctx
            .new_event(timing)
            .map_err(|e| GpuError::of("event", e))?;
        let stop = ctx
            .new_event(timing)
            .map_err(|e| GpuError::of("event", e))?;
        // SAFETY: only checks whether the library can be loaded; never panics.
        let blas = if unsafe { cudarc::cublas::sys::is_culib_present() } {
            CudaBlas::new(Arc::clone(&stream)).ok()
        } else {
            None
        };
        Ok(Self {
            ctx,
            stream,
            funcs: Vec::new(),
            bufs: HashMap::new(),
            blas,
            start,
            stop,
            graph: None,
            name: format!("{name} (sm_{major}{minor})"),
            arch: arch_name(major, minor),
            slots: Vec::with_capacity(16),
        })
    }

    fn bind(&self) -> Result<(), GpuError> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| GpuError::of("bind context", e))
    }
}

impl Gpu for CudaGpu {
    fn describe(&self) -> String {
        format!(
            "{}, cuBLAS {}",
            self.name,
            if self.blas.is_some() { "on" } else { "absent" }
        )
    }

    fn load(&mut self, kc: &KernelConfig, names: &[String]) -> Result<(), GpuError> {
        self.bind()?;
        let ptx = compile_ptx(kc, self.arch)?;
        let module = self
            .ctx
            .load_module(ptx)
            .map_err(|e| GpuError::of("load module", e))?;
        self.funcs = names
            .iter()
            .map(|n| {
                module
                    .load_function(n)
                    .map_err(|e| GpuError::of(&format!("kernel {n}"), e))
            })
            .collect::<Result<_, _>>()?;
        Ok(())
    }

    fn alloc(&mut self, bytes: usize) -> Result<u64, GpuError> {
        self.bind()?;
        let s = self
            .stream
            .alloc_zeros::<u8>(bytes.max(1))
            .map_err(|e| GpuError::of(&format!("allocating {} MiB", bytes >> 20), e))?;
        let ptr = {
            let (ptr, _sync) = s.device_ptr(&self.stream);
            ptr
        };
        self.bufs.insert(ptr, s);
        Ok(ptr)
    }

    fn free(&mut self, ptr: u64) {
        if self.bind().is_ok() {
            self.bufs.remove(&ptr);
        }
    }

    fn upload(&mut self, dst: u64, src: &[u8]) -> Result<(), GpuError> {
        self.bind()?;
        // SAFETY: `dst` is one of our allocations with room for `src` (the caller sizes it);
        // pageable `src` is staged before the call returns.
        unsafe { cudarc::driver::result::memcpy_htod_async(dst, src, self.stream.cu_stream()) }
            .map_err(|e| GpuError::of("upload", e))
    }

    fn download(&mut self, dst: &mut [f32], src: u64) -> Result<(), GpuError> {
        self.bind()?;
        // SAFETY: `src` holds at least `dst.len()` floats (the caller sizes it).
        unsafe { cudarc::driver::result::memcpy_dtoh_async(dst, src, self.stream.cu_stream()) }
            .map_err(|e| GpuError::of("download", e))?;
        self.stream
            .synchronize()
            .map_err(|e| GpuError::of("synchronize", e))
    }

    fn launch(&mut self, l: Launch, args: &[Arg]) -> Result<(), GpuError> {
        let f = self
            .funcs
            .get(l.kernel)
            .ok_or_else(|| GpuError(format!("no kernel {}", l.kernel)))?;
        self.slots.clear();
        self.slots.extend(args.iter().map(|a| a.slot()));
        let mut params: Vec<*mut c_void> = self
            .slots
            .iter_mut()
            .map(|s| std::ptr::from_mut(s).cast::<c_void>())
            .collect();
        // SAFETY: the arguments match the kernel's signature (the backend builds them from the
        // same table as the source), every pointer is a live allocation sized for the launch,
        // and `params` outlives the call (the driver copies the values at launch).
        unsafe {
            cudarc::driver::result::launch_kernel(
                f.cu_function(),
                l.grid,
                l.block,
                0,
                self.stream.cu_stream(),
                &mut params,
            )
        }
        .map_err(|e| GpuError::of("launch", e))
    }

    fn has_gemm(&self) -> bool {
        self.blas.is_some()
    }

    fn gemm(&mut self, g: &Gemm) -> Result<(), GpuError> {
        use cudarc::cublas::sys::{
            cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType,
        };
        let blas = self
            .blas
            .as_ref()
            .ok_or_else(|| GpuError("cuBLAS is not available".into()))?;
        let int = |v: usize| i32::try_from(v).map_err(|_| GpuError(format!("GEMM size {v}")));
        let (alpha, beta) = (1.0f32, if g.accumulate { 1.0f32 } else { 0.0 });
        // Column-major view: C (m × n, ldc) = Aᵀ (A is k × m, lda = k) · B (k × n, ldb).
        // SAFETY: the pointers are live allocations of the stated shapes (the backend sizes
        // them), alpha/beta are host scalars that outlive the call.
        unsafe {
            cudarc::cublas::result::gemm_ex(
                *blas.handle(),
                cublasOperation_t::CUBLAS_OP_T,
                cublasOperation_t::CUBLAS_OP_N,
                int(g.m)?,
                int(g.n)?,
                int(g.k)?,
                std::ptr::from_ref(&alpha).cast(),
                g.a as *const c_void,
                cudaDataType::CUDA_R_16F,
                int(g.k)?,
                g.b as *const c_void,
                cudaDataType::CUDA_R_16F,
                int(g.ldb)?,
                std::ptr::from_ref(&beta).cast(),
                g.c as *mut c_void,
                cudaDataType::CUDA_R_32F,
                int(g.ldc)?,
                cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| GpuError::of("cuBLAS GEMM", e))
    }

    fn timer_start(&mut self) -> Result<(), GpuError> {
        self.start
            .record(&self.stream)
            .map_err(|e| GpuError::of("event", e))
    }

    fn timer_stop(&mut self) -> Result<(), GpuError> {
        self.stop
            .record(&self.stream)
            .map_err(|e| GpuError::of("event", e))
    }

    fn timer_read(&mut self) -> Result<Duration, GpuError> {
        let ms = self
            .start
            .elapsed_ms(&self.stop)
            .map_err(|e| GpuError::of("event time", e))?;
        Ok(Duration::from_secs_f64(f64::from(ms.max(0.0)) / 1000.0))
    }

    fn capture_begin(&mut self) -> Result<(), GpuError> {
        self.graph = None;
        self.stream
            .begin_capture(
                cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
            .map_err(|e| GpuError::of("begin capture", e))
    }

    fn capture_end(&mut self) -> Result<(), GpuError> {
        let g = self
            .stream
            .end_capture(cudarc::driver::sys::CUgraphInstantiate_flags(0))
            .map_err(|e| GpuError::of("end capture", e))?
            .ok_or_else(|| GpuError("the capture recorded nothing".into()))?;
        self.graph = Some(Graph(g));
        Ok(())
    }

    fn graph_launch(&mut self) -> Result<(), GpuError> {
        let g = self
            .graph
            .as_ref()
            .ok_or_else(|| GpuError("no graph".into()))?;
        g.0.launch().map_err(|e| GpuError::of("graph launch", e))
    }
}

impl Drop for CudaGpu {
    fn drop(&mut self) {
        // Buffers free themselves (cudarc binds the context); drop the graph first.
        self.graph = None;
        let _ = self.stream.synchronize();
    }
}
