//! End-to-end test support: the engine and the sidecar as real processes on loopback.
//!
//! The Rust tests in `tests/tests/` drive the binaries built by `cargo build --workspace`; the
//! Python tests in `tests/python/` do the same with real clients (the `openai` SDK, the
//! OpenTelemetry SDK, Prometheus). `scripts/test.sh` runs both.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A binary of the workspace, from `$CARGO_TARGET_DIR` (or `target/`) in the debug profile.
pub fn binary(name: &str) -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("..")
                .join("target")
        });
    target.join("debug").join(name)
}

/// A child process stopped (by its own PID) when dropped.
pub struct Proc {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Proc {
    /// Starts `bin args…`, reading its stderr; returns once a line matches `ready`, along with
    /// that line.
    pub fn start(bin: &PathBuf, args: &[String], ready: &str) -> Result<(Self, String), String> {
        let mut child = Command::new(bin)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("{}: {e}", bin.display()))?;
        let stderr = child.stderr.take().ok_or("no stderr")?;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut seen = String::new();
        while Instant::now() < deadline {
            match rx.recv_timeout(Duration::from_millis(100)) {
                Ok(line) => {
                    if line.contains(ready) {
                        return Ok((Self { child, lines: rx }, line));
                    }
                    seen.push_str(&line);
                    seen.push('\n');
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if let Ok(Some(status)) = child.try_wait() {
                        return Err(format!(
                            "{} exited ({status}) before ready:\n{seen}",
                            bin.display()
                        ));
                    }
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
        let _ = child.kill();
        Err(format!(
            "{} never printed {ready:?}:\n{seen}",
            bin.display()
        ))
    }

    /// Log lines printed since start (non-blocking).
    pub fn drain(&self) -> Vec<String> {
        self.lines.try_iter().collect()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        // SIGTERM first so both binaries get to drain and flush.
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `key=value` pairs of a log line.
pub fn fields(line: &str) -> std::collections::HashMap<String, String> {
    line.split_whitespace()
        .filter_map(|w| w.split_once('='))
        .map(|(k, v)| (k.to_string(), v.trim_matches('"').to_string()))
        .collect()
}
