//! Building backends from a model and a device list (`cpu`, `cpu,cpu`, `cuda:0`, `auto`).

use std::sync::Arc;

use crate::backend::Backend;
use crate::backend::cpu::CpuBackend;
use crate::model::config::ModelConfig;
use crate::model::loader::Model;
use crate::scheduler::SchedulerConfig;

/// One device group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    /// Run on the CPU backend.
    Cpu,
    /// A CUDA GPU by ordinal.
    Cuda(usize),
}

/// Why a device list is unusable.
#[derive(Debug, Clone, thiserror::Error)]
pub enum DeviceError {
    /// The text does not parse.
    #[error("invalid --device {0:?}: expected cpu, cpu,cpu, cuda, cuda:N, cuda:N,M or auto")]
    Parse(String),
    /// CUDA cannot be used here.
    #[error("--device {device}: {reason}")]
    Unavailable {
        /// The device asked for.
        device: String,
        /// Why the device cannot be used (shown to the user).
        reason: String,
    },
}

/// Parses `--device`: `cpu`, `cpu,cpu` (several CPU groups), `cuda`, `cuda:N`, `cuda:0,1,2`
/// (one group per GPU), or `auto` (a GPU when one is usable, else the CPU).
pub fn parse_devices(spec: &str) -> Result<Vec<Device>, DeviceError> {
    let bad = || DeviceError::Parse(spec.to_string());
    let spec = spec.trim();
    if spec == "auto" {
        return Ok(vec![if crate::backend::cuda::probe(0).is_ok() {
            Device::Cuda(0)
        } else {
            Device::Cpu
        }]);
    }
    if let Some(rest) = spec.strip_prefix("cuda") {
        let list = match rest.strip_prefix(':') {
            Some(l) => l,
            None if rest.is_empty() => "0",
            None => return Err(bad()),
        };
        return list
            .split(',')
            .map(|n| {
                n.trim()
                    .parse::<usize>()
                    .map(Device::Cuda)
                    .map_err(|_| bad())
            })
            .collect();
    }
    let parts: Vec<&str> = spec.split(',').map(str::trim).collect();
    if parts.is_empty() || parts.len() > 64 || parts.iter().any(|p| *p != "cpu") {
        return Err(bad());
    }
    Ok(vec![Device::Cpu; parts.len()])
}

/// Sizes of the runtime.
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// Compute threads for all CPU groups together (`None`: all cores).
    pub threads: Option<usize>,
    /// Context length (capped by the model's).
    pub ctx_size: usize,
    /// KV cache positions per group.
    pub kv_tokens: usize,
    /// Positions per KV block.
    pub block_size: usize,
}

/// Positions per KV block, as the serving commands build their caches.
pub const KV_BLOCK_SIZE: usize = 16;

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            threads: None,
            ctx_size: 4096,
            kv_tokens: 8192,
            block_size: KV_BLOCK_SIZE,
        }
    }
}

/// Window-pool blocks for a group of `full_blocks` full-pool blocks that runs `sched`: enough
/// for every batch slot's window plus one step's prefill chunks, and the windows kept for live
/// sessions ([`SessionWindows::room`](crate::scheduler::SessionWindows)), so that the window pool never
/// runs out before the full pool (never more than the full pool, which bounds it anyway: a
/// sequence holds a window block only where it holds a full one). `None` for a model without
/// sliding-window layers.
///
/// A sequence at `next` holds the blocks from the one holding `B + 1 - window` (`B`, the last
/// block boundary at or before `next`) to the one holding its chunk's last position:
/// `ceil((window - 1) / block_size) + 1` blocks for a decode row (and one per `block_size`
/// tokens of a draft being verified beyond it), and one per `block_size` tokens of prefill
/// chunk (plus one) beyond.
pub fn window_pool_blocks(
    cfg: &ModelConfig,
    block_size: usize,
    full_blocks: usize,
    sched: &SchedulerConfig,
) -> Option<usize> {
    let window = cfg.family.sliding_window.as_ref()?.window;
    let bs = block_size.max(1);
    let chunk = sched.prefill_chunk.max(sched.mixed_prefill_chunk);
    // A draft's verification reaches past the decode row by the draft's length.
    let draft = sched.speculation.max_tokens.div_ceil(bs);
    let per_slot = window.saturating_sub(1).div_ceil(bs) + 2 + draft;
    // A window kept for a session: the blocks before a block boundary that a resume there reads.
    let kept = window.saturating_sub(1).div_ceil(bs) + 1;
    let bound =
        sched.batch.max(1) * per_slot + chunk.div_ceil(bs) + sched.session_windows.room * kept;
    Some(bound.min(full_blocks))
}

/// Builds one backend per device, the KV pools sized for the default scheduler settings
/// ([`build_backends_for`]).
pub fn build_backends(
    model: &Model,
    devices: &[Device],
    rc: &RuntimeConfig,
) -> Result<Vec<Box<dyn Backend>>, DeviceError> {
    build_backends_for(model, devices, rc, Some(&SchedulerConfig::default()))
}

/// Builds one backend per device. With `sched`, a model with sliding-window layers keeps their
/// KV in a window pool sized for it ([`window_pool_blocks`]), on the CPU and on CUDA alike;
/// without (a caller that drives the backend itself, with one block table), every layer keeps
/// its KV whole.
pub fn build_backends_for(
    model: &Model,
    devices: &[Device],
    rc: &RuntimeConfig,
    sched: Option<&SchedulerConfig>,
) -> Result<Vec<Box<dyn Backend>>, DeviceError> {
    let mut cfg = model.config.clone();
    cfg.context = cfg.context.min(rc.ctx_size.max(1));
    // One sequence must always fit, whatever else the cache holds.
    let blocks = rc.kv_tokens.max(cfg.context).div_ceil(rc.block_size) + 1;
    let total = rc
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);
    let cpu_groups = devices.iter().filter(|d| **d == Device::Cpu).count().max(1);
    let mut out: Vec<Box<dyn Backend>> = Vec::new();
    // Packed once, shared by every CPU group.
    let cpu_weights = devices.contains(&Device::Cpu).then(|| {
        Arc::new(crate::backend::cpu::weights::CpuWeights::new(Arc::clone(
            &model.weights,
        )))
    });
    for d in devices {
        match *d {
            Device::Cpu => {
                let threads = (total / cpu_groups).max(1);
                let pool = crate::backend::cpu::pool::ComputePool::new(threads);
                let weights = cpu_weights
                    .clone()
                    .ok_or_else(|| DeviceError::Parse("cpu".into()))?;
                out.push(Box::new(CpuBackend::with_layout(
                    cfg.clone(),
                    weights,
                    rc.block_size,
                    blocks,
                    sched.and_then(|s| window_pool_blocks(&cfg, rc.block_size, blocks, s)),
                    Arc::new(pool),
                )));
            }
            Device::Cuda(n) => {
                // One replica per GPU: each ordinal gets its own context, weights and KV cache.
                let backend = crate::backend::cuda::CudaBackend::new(
                    cfg.clone(),
                    Arc::clone(&model.weights),
                    n,
                    rc.block_size,
                    blocks,
                    sched.and_then(|s| window_pool_blocks(&cfg, rc.block_size, blocks, s)),
                    crate::backend::cuda::CudaOptions::from_env(),
                )
                .map_err(|e| DeviceError::Unavailable {
                    device: format!("cuda:{n}"),
                    reason: e.to_string(),
                })?;
                out.push(Box::new(backend));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_lists_parse() {
        assert_eq!(parse_devices("cpu").ok(), Some(vec![Device::Cpu]));
        assert_eq!(
            parse_devices("cpu,cpu").ok(),
            Some(vec![Device::Cpu, Device::Cpu])
        );
        assert_eq!(parse_devices("cuda").ok(), Some(vec![Device::Cuda(0)]));
        assert_eq!(
            parse_devices("cuda:0,1,2").ok(),
            Some(vec![Device::Cuda(0), Device::Cuda(1), Device::Cuda(2)])
        );
        for bad in ["", "gpu", "cuda:x", "cudax", "cpu,gpu"] {
            assert!(parse_devices(bad).is_err(), "{bad}");
        }
    }
}
