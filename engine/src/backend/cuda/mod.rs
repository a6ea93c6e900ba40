//! The CUDA backend (cudarc; libraries loaded at run time). Work in progress: device probing.

/// Why CUDA cannot be used.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct CudaUnavailable(pub String);

/// Checks that the CUDA driver library is present and device `ordinal` exists.
pub fn probe(ordinal: usize) -> Result<String, CudaUnavailable> {
    // SAFETY: only checks whether the library can be loaded; never panics.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(CudaUnavailable(
            "no CUDA driver library (libcuda.so) found".into(),
        ));
    }
    let ctx = std::panic::catch_unwind(|| cudarc::driver::CudaContext::new(ordinal))
        .map_err(|_| CudaUnavailable("the CUDA driver failed to initialize".into()))?
        .map_err(|e| CudaUnavailable(format!("cuda:{ordinal}: {e}")))?;
    let name = ctx.name().unwrap_or_else(|_| "unknown GPU".into());
    Ok(name)
}
