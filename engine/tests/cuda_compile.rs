//! Compiles every kernel with NVRTC for `sm_90` (Hopper: H100/H200) and assembles the PTX with
//! `ptxas -arch=sm_90 -v`, printing registers, shared memory and spills per kernel. No GPU is
//! needed: `scripts/cuda-compile-check.sh` installs NVRTC and ptxas from the 13.0 wheels and
//! sets `SLOTLIGHT_NVRTC_LIB_DIR` (and `LD_LIBRARY_PATH`) and `SLOTLIGHT_PTXAS`. Without
//! `SLOTLIGHT_NVRTC_LIB_DIR` the test skips with a message.
#![cfg(feature = "cuda")]

use std::collections::BTreeMap;
use std::process::Command;

use slotlight_engine::backend::cuda::gpu::compile_ptx;
use slotlight_engine::backend::cuda::kernels::KernelConfig;
use slotlight_engine::backend::cuda::layout::{self, WFormat};

/// ptxas's report for one kernel.
#[derive(Debug, Default, Clone)]
struct Report {
    registers: u32,
    smem: u32,
    spill_stores: u32,
    spill_loads: u32,
    stack: u32,
}

fn number_before(line: &str, word: &str) -> Option<u32> {
    let i = line.find(word)?;
    line[..i].split_whitespace().last()?.parse().ok()
}

fn parse(stderr: &str) -> BTreeMap<String, Report> {
    let mut out: BTreeMap<String, Report> = BTreeMap::new();
    let mut cur = String::new();
    for line in stderr.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            cur = rest.split('\'').next().unwrap_or("").to_string();
            out.entry(cur.clone()).or_default();
        } else if let Some(r) = out.get_mut(&cur) {
            if line.contains("spill stores") {
                r.stack = number_before(line, "bytes stack frame").unwrap_or(0);
                r.spill_stores = number_before(line, "bytes spill stores").unwrap_or(0);
                r.spill_loads = number_before(line, "bytes spill loads").unwrap_or(0);
            }
            if line.contains("Used") && line.contains("registers") {
                r.registers = number_before(line, "registers").unwrap_or(0);
                r.smem = number_before(line, "bytes smem").unwrap_or(0);
            }
        }
    }
    out
}

fn shape(
    hidden: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    ffn: usize,
    layers: usize,
    neox: bool,
) -> KernelConfig {
    KernelConfig {
        hidden,
        q_dim: heads * head_dim,
        kv_dim: kv_heads * head_dim,
        head_dim,
        heads,
        kv_heads,
        ffn,
        layers,
        block_size: 16,
        neox,
        att_warps: layout::attn_warps(heads / kv_heads, head_dim),
        formats: WFormat::ALL.to_vec(),
    }
}

#[test]
fn every_kernel_compiles_for_sm_90_and_assembles_without_spills() {
    let Some(lib_dir) = std::env::var_os("SLOTLIGHT_NVRTC_LIB_DIR") else {
        eprintln!(
            "skipping: SLOTLIGHT_NVRTC_LIB_DIR is not set (run scripts/cuda-compile-check.sh)"
        );
        return;
    };
    // SAFETY: only checks whether the library can be loaded; never panics.
    assert!(
        unsafe { cudarc::nvrtc::sys::is_culib_present() },
        "libnvrtc.so.13 is not loadable from LD_LIBRARY_PATH (SLOTLIGHT_NVRTC_LIB_DIR={})",
        lib_dir.to_string_lossy()
    );
    let ptxas = std::env::var_os("SLOTLIGHT_PTXAS");
    let shapes = [
        ("SmolLM2-135M", shape(576, 9, 3, 64, 1536, 30, false)),
        ("Llama-3-8B", shape(4096, 32, 8, 128, 14336, 32, false)),
        ("Qwen2-0.5B", shape(896, 14, 2, 64, 4864, 24, true)),
        ("Gemma-3-270M", shape(640, 4, 1, 256, 2048, 18, true)),
        ("Qwen3-0.6B", shape(1024, 16, 8, 128, 3072, 28, true)),
        ("tiny fixtures", shape(64, 4, 2, 16, 128, 2, true)),
    ];
    let dir = std::env::temp_dir().join(format!("slotlight-ptx-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let mut spilled = Vec::new();
    for (name, kc) in &shapes {
        let ptx = compile_ptx(kc, "sm_90").unwrap_or_else(|e| panic!("{name}: {e}"));
        let text = ptx.to_src();
        for k in kc.kernel_names() {
            assert!(
                text.contains(&format!(".entry {k}(")),
                "{name}: kernel {k} missing from the PTX"
            );
        }
        let Some(ptxas) = ptxas.as_ref() else {
            eprintln!(
                "{name}: NVRTC ok ({} kernels); SLOTLIGHT_PTXAS unset, not assembled",
                kc.kernel_names().len()
            );
            continue;
        };
        let file = dir.join(format!("{}.ptx", name.replace([' ', '.'], "_")));
        std::fs::write(&file, &text).expect("write ptx");
        let out = Command::new(ptxas)
            .args(["-arch=sm_90", "-v", "-o"])
            .arg(file.with_extension("cubin"))
            .arg(&file)
            .output()
            .expect("run ptxas");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{name}: ptxas failed:\n{stderr}");
        let reports = parse(&stderr);
        assert_eq!(reports.len(), kc.kernel_names().len(), "{name}: {stderr}");
        eprintln!(
            "\n{name} (hidden {}, head {} × group {}, ffn {}), sm_90:",
            kc.hidden,
            kc.head_dim,
            kc.group(),
            kc.ffn
        );
        eprintln!(
            "  {:<14} {:>5} {:>7} {:>6} {:>7} {:>7}",
            "kernel", "regs", "smem", "stack", "spill-st", "spill-ld"
        );
        for (k, r) in &reports {
            eprintln!(
                "  {k:<14} {:>5} {:>7} {:>6} {:>7} {:>7}",
                r.registers, r.smem, r.stack, r.spill_stores, r.spill_loads
            );
            if r.spill_stores > 0 || r.spill_loads > 0 {
                spilled.push(format!("{name}/{k}"));
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(spilled.is_empty(), "register spills: {spilled:?}");
}
