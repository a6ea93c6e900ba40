//! The CUDA backend (cudarc; the driver, NVRTC and cuBLAS are loaded at run time, so this
//! compiles and its host-side tests run without CUDA).
//!
//! - [`layout`]: weight packing, the paged KV layout (the CPU's), launch shapes, step metadata.
//! - [`kernels`]: the CUDA C++ source, generated per model shape and compiled with NVRTC.
//! - [`gpu`]: the device operations behind a trait, and their cudarc implementation.
//! - [`backend`]: [`GpuBackend`], the [`crate::backend::Backend`] over any [`gpu::Gpu`].
//! - [`emu`]: a host emulator of the kernels (tests run the whole GPU code path on the CPU).
//!
//! `docs/gpu.md` explains the design and how to check it on a GPU.

pub mod backend;
pub mod emu;
pub mod gpu;
pub mod kernels;
pub mod layout;
pub mod lower;

use std::sync::Arc;

pub use self::backend::{CudaOptions, GpuBackend};
use self::gpu::CudaGpu;
use crate::model::config::ModelConfig;
use crate::model::llama::LlamaWeights;

/// The model on one CUDA GPU.
pub type CudaBackend = GpuBackend<CudaGpu>;

/// Why CUDA cannot be used.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct CudaUnavailable(pub String);

fn libraries_present() -> Result<(), CudaUnavailable> {
    // SAFETY: only checks whether the library can be loaded; never panics.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(CudaUnavailable(
            "no CUDA driver library (libcuda.so) found".into(),
        ));
    }
    // SAFETY: as above.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(CudaUnavailable(
            "no NVRTC library (libnvrtc.so.13) found: install the CUDA 13 toolkit or the \
             nvidia-cuda-nvrtc wheel and add its lib folder to LD_LIBRARY_PATH"
                .into(),
        ));
    }
    Ok(())
}

/// Checks that the CUDA driver and NVRTC libraries are present and device `ordinal` exists;
/// returns the device's name.
pub fn probe(ordinal: usize) -> Result<String, CudaUnavailable> {
    libraries_present()?;
    let ctx = std::panic::catch_unwind(|| cudarc::driver::CudaContext::new(ordinal))
        .map_err(|_| CudaUnavailable("the CUDA driver failed to initialize".into()))?
        .map_err(|e| CudaUnavailable(format!("cuda:{ordinal}: {e}")))?;
    let name = ctx.name().unwrap_or_else(|_| "unknown GPU".into());
    Ok(name)
}

impl GpuBackend<CudaGpu> {
    /// The model on GPU `ordinal`, with a KV cache of `kv_blocks` blocks of `block_size`
    /// positions (and, with `window_blocks`, a window pool of that many for the sliding-window
    /// layers: [`GpuBackend::with_layout`]). Fails with one line when CUDA is unusable (no library, no device, a model
    /// shape the kernels do not support, not enough memory); never panics.
    pub fn new(
        cfg: ModelConfig,
        weights: Arc<LlamaWeights>,
        ordinal: usize,
        block_size: usize,
        kv_blocks: usize,
        window_blocks: Option<usize>,
        opts: CudaOptions,
    ) -> Result<Self, CudaUnavailable> {
        libraries_present()?;
        let build = || {
            let gpu = CudaGpu::open(ordinal)?;
            GpuBackend::with_layout(
                gpu,
                cfg,
                &weights,
                block_size,
                kv_blocks,
                window_blocks,
                opts,
                format!("cuda:{ordinal}"),
            )
        };
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(build))
            .map_err(|_| {
                CudaUnavailable(
                    "the CUDA libraries failed to initialize (a required function is missing: \
                     check the driver and the CUDA 13 libraries)"
                        .into(),
                )
            })?
            .map_err(|e| CudaUnavailable(format!("cuda:{ordinal}: {e}")))
    }
}
