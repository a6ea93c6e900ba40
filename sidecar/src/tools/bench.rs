//! `slotlight-sidecar bench`: OTLP/gRPC ingest speed, memory and view latency.
//!
//! Starts a sidecar as a child process (this same binary, `--worker-threads N`, optionally
//! pinned with `taskset`), so its RSS and CPU time are its own; drives it with engine-shaped
//! export requests encoded once and replayed with fresh request ids each cycle; and measures,
//! with decode-window probes, how long a window takes to show up in `/v1/slots` (watched over
//! `/v1/slots/stream`). Prints figures; asserts nothing.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use prost::Message;
use tokio::sync::watch;

use crate::base::config::BenchArgs;
use crate::receiver::raw::RawExporter;
use crate::tools::synth;

/// Why the benchmark could not run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// Starting or talking to the child failed.
    #[error("{0}")]
    Setup(String),
}

fn setup<E: std::fmt::Display>(what: &str) -> impl FnOnce(E) -> BenchError + '_ {
    move |e| BenchError::Setup(format!("{what}: {e}"))
}

const MARKER: &[u8] = b"bench-c";
const CYCLE_DIGITS: usize = 8;

/// A set of pre-encoded export requests whose request ids carry an 8-digit cycle number,
/// patched in place before each replay (same length, so the protobuf stays valid).
struct Workload {
    batches: Vec<(Vec<u8>, Vec<usize>, u64)>,
}

impl Workload {
    fn new(instance: &str, args: &BenchArgs, base_ns: i64) -> Self {
        let per_req = args.windows + 4;
        let batch = args.batch_spans.max(per_req);
        let reqs_per_batch = (batch / per_req).max(1);
        let n_batches = 48;
        let mut batches = Vec::with_capacity(n_batches);
        let mut seed = 0u64;
        for b in 0..n_batches {
            let mut spans = Vec::with_capacity(reqs_per_batch * per_req);
            for _ in 0..reqs_per_batch {
                seed += 1;
                let slots = i64::try_from(args.slots.max(1)).unwrap_or(8);
                let place = i64::try_from(seed).map_or(None, |s| {
                    let k = s % (slots + 1);
                    (k < slots).then_some(k)
                });
                let id = format!("bench-c{}-r{seed:08}", "0".repeat(CYCLE_DIGITS));
                let start = base_ns + i64::try_from(seed).unwrap_or(0) * 1_000_000;
                spans.extend(synth::whole_request(
                    &id,
                    seed,
                    start,
                    place,
                    args.windows,
                    10,
                ));
            }
            let n = spans.len() as u64;
            let bytes = synth::export(instance, spans).encode_to_vec();
            let offsets = find_all(&bytes, MARKER)
                .into_iter()
                .map(|o| o + MARKER.len())
                .collect();
            batches.push((bytes, offsets, n));
            let _ = b;
        }
        Workload { batches }
    }

    fn spans_per_cycle(&self) -> u64 {
        self.batches.iter().map(|b| b.2).sum()
    }

    /// Batch `i` of cycle `cycle`, and its span count.
    fn get(&mut self, i: usize, cycle: u64) -> (Bytes, u64) {
        let digits = format!("{:0width$x}", cycle % (1 << 32), width = CYCLE_DIGITS);
        let (bytes, offsets, n) = &mut self.batches[i];
        for &o in offsets.iter() {
            bytes[o..o + CYCLE_DIGITS].copy_from_slice(digits.as_bytes());
        }
        (Bytes::copy_from_slice(bytes), *n)
    }
}

fn find_all(hay: &[u8], needle: &[u8]) -> Vec<usize> {
    hay.windows(needle.len())
        .enumerate()
        .filter(|(_, w)| *w == needle)
        .map(|(i, _)| i)
        .collect()
}

struct ChildSidecar {
    child: Child,
    grpc: SocketAddr,
    views: SocketAddr,
}

impl Drop for ChildSidecar {
    fn drop(&mut self) {
        // The child we started, by its own handle.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_child(args: &BenchArgs, turns_db: &str) -> Result<ChildSidecar, BenchError> {
    let exe = std::env::current_exe().map_err(setup("current_exe"))?;
    let mut cmd = match args.pin_cpu {
        Some(cpu) if Command::new("taskset").arg("-V").output().is_ok() => {
            let mut c = Command::new("taskset");
            c.arg("-c").arg(cpu.to_string()).arg(&exe);
            c
        }
        _ => Command::new(&exe),
    };
    cmd.args([
        "--otlp-grpc",
        "127.0.0.1:0",
        "--otlp-http",
        "127.0.0.1:0",
        "--listen",
        "127.0.0.1:0",
        "--worker-threads",
        &args.sidecar_threads.max(1).to_string(),
        "--turns-db",
        turns_db,
    ])
    .env("RUST_LOG", "warn")
    .env_remove("SLOTLIGHT_SIDECAR_TOKEN")
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(setup("spawning the sidecar"))?;
    let stderr = child
        .stderr
        .take()
        .ok_or_else(|| BenchError::Setup("no stderr".into()))?;
    let mut lines = BufReader::new(stderr).lines();
    let mut found = None;
    for line in lines.by_ref() {
        let line = line.map_err(setup("reading the sidecar's stderr"))?;
        if line.contains("listening otlp_grpc=") {
            found = Some(line);
            break;
        }
        eprintln!("[sidecar] {line}");
    }
    let line =
        found.ok_or_else(|| BenchError::Setup("the sidecar exited before listening".into()))?;
    std::thread::spawn(move || {
        for l in lines.map_while(Result::ok) {
            eprintln!("[sidecar] {l}");
        }
    });
    let addr = |key: &str| -> Result<SocketAddr, BenchError> {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(key))
            .and_then(|a| a.parse().ok())
            .ok_or_else(|| BenchError::Setup(format!("no {key} in {line:?}")))
    };
    Ok(ChildSidecar {
        grpc: addr("otlp_grpc=")?,
        views: addr("views=")?,
        child,
    })
}

/// `(rss_kib, cpu_ticks)` of a process, from /proc (Linux).
fn proc_stats(pid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the ")" that ends the command name: state is field 3, utime 14, stime 15.
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some((rss, utime + stime))
}

/// Linux's USER_HZ (the unit of /proc CPU times), 100 on every mainstream architecture.
const TICKS_PER_S: f64 = 100.0;

fn channel(addr: SocketAddr) -> Result<tonic::transport::Channel, BenchError> {
    Ok(
        tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .map_err(setup("endpoint"))?
            .tcp_nodelay(true)
            .connect_lazy(),
    )
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // an index into a slice
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn summarize(name: &str, v: &mut [f64]) {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        println!("  {name}: no samples");
        return;
    }
    println!(
        "  {name}: n={} p50={:.1} ms p90={:.1} ms p99={:.1} ms max={:.1} ms",
        v.len(),
        percentile(v, 0.5),
        percentile(v, 0.9),
        percentile(v, 0.99),
        v[v.len() - 1]
    );
}

/// Follows `/v1/slots/stream` and publishes the probe row's latest token count.
async fn watch_probe(views: SocketAddr, probe_instance: String, tx: watch::Sender<i64>) {
    let client = reqwest::Client::new();
    let Ok(mut resp) = client
        .get(format!("http://{views}/v1/slots/stream"))
        .send()
        .await
    else {
        return;
    };
    let mut buf = Vec::new();
    while let Ok(Some(chunk)) = resp.chunk().await {
        buf.extend_from_slice(&chunk);
        while let Some(end) = find_all(&buf, b"\n\n").first().copied() {
            let event: Vec<u8> = buf.drain(..end + 2).collect();
            let text = String::from_utf8_lossy(&event);
            for data in text.lines().filter_map(|l| l.strip_prefix("data:")) {
                let Ok(v) = serde_json::from_str::<serde_json::Value>(data.trim()) else {
                    continue;
                };
                let tokens = v["instances"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|i| i["instance"] == probe_instance.as_str())
                    .flat_map(|i| i["slots"].as_array().into_iter().flatten())
                    .filter_map(|r| r["tokens_generated"].as_i64())
                    .max();
                if let Some(t) = tokens {
                    tx.send_if_modified(|cur| {
                        let changed = *cur != t;
                        *cur = t;
                        changed
                    });
                }
            }
        }
    }
}

/// Sends probe windows (token count = probe number) and records how long each takes to
/// appear in the slot view.
async fn probe(
    grpc: SocketAddr,
    instance: String,
    mut seen: watch::Receiver<i64>,
    interval: Duration,
    stop: Arc<AtomicBool>,
    first: i64,
) -> Result<(Vec<f64>, i64), BenchError> {
    let mut exp = RawExporter::new(channel(grpc)?, false);
    let mut lat = Vec::new();
    let mut n = first;
    let start = crate::base::vocab::unix_now_ns();
    let mut req = synth::Request::new("probe", 42, start);
    req.first_token_ns = Some(start);
    let leg = req.leg(0, Some(0), start, 0);
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let now = crate::base::vocab::unix_now_ns();
        let span = req.decode(&leg, now - 1_000_000, now, 1, n);
        let body = Bytes::from(synth::export(&instance, vec![span]).encode_to_vec());
        let t0 = Instant::now();
        exp.export(body).await.map_err(setup("probe export"))?;
        let ok = matches!(
            tokio::time::timeout(Duration::from_secs(5), seen.wait_for(|v| *v >= n)).await,
            Ok(Ok(_))
        );
        if ok {
            lat.push(t0.elapsed().as_secs_f64() * 1e3);
        } else {
            println!("  probe {n} not seen within 5 s");
        }
        tokio::time::sleep(interval).await;
    }
    Ok((lat, n))
}

/// A scratch directory for the child's turn store, removed when the benchmark ends.
struct ScratchDir(std::path::PathBuf);

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Rows in the turn store at `path` (read-only), or why they could not be counted.
fn stored_turns(path: &str) -> Result<i64, rusqlite::Error> {
    let c =
        rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    c.query_row("SELECT count(*) FROM turns", [], |r| r.get(0))
}

/// Runs the benchmark and prints its figures.
pub async fn run(args: BenchArgs) -> Result<(), BenchError> {
    let (turns_db, _scratch) = match &args.turns_db {
        Some(p) => (p.clone(), None),
        None => {
            let dir = std::env::temp_dir().join(format!(
                "slotlight-bench-{}-{}",
                std::process::id(),
                crate::base::vocab::unix_now_ns()
            ));
            std::fs::create_dir_all(&dir).map_err(setup("creating the scratch directory"))?;
            let db = dir.join("turns.db").display().to_string();
            (db, Some(ScratchDir(dir)))
        }
    };
    let sc = start_child(&args, &turns_db)?;
    let pid = sc.child.id();
    println!(
        "slotlight-sidecar bench: child pid {pid}, {} worker thread(s){}, {} s of load, {} connection(s), {}-span exports, --turns-db {turns_db}",
        args.sidecar_threads,
        args.pin_cpu
            .map(|c| format!(", pinned to CPU {c}"))
            .unwrap_or_default(),
        args.duration_s,
        args.connections,
        args.batch_spans
    );
    let base = crate::base::vocab::unix_now_ns();
    let mut workloads: Vec<Workload> = (0..args.connections.max(1))
        .map(|c| Workload::new(&format!("bench-engine-{c}"), &args, base))
        .collect();
    println!(
        "  workload: {} spans per replay cycle per connection ({} decode windows per request)",
        workloads[0].spans_per_cycle(),
        args.windows
    );

    // View latency at idle.
    let probe_instance = "bench-probe".to_string();
    let (seen_tx, seen_rx) = watch::channel(0i64);
    let watcher = tokio::spawn(watch_probe(sc.views, probe_instance.clone(), seen_tx));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stop_idle = Arc::new(AtomicBool::new(false));
    let idle = tokio::spawn(probe(
        sc.grpc,
        probe_instance.clone(),
        seen_rx.clone(),
        Duration::from_millis(args.probe_interval_ms),
        stop_idle.clone(),
        0,
    ));
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop_idle.store(true, Ordering::Relaxed);
    let (mut idle_lat, last_probe) = idle.await.map_err(setup("idle probe"))??;

    let (rss0, cpu0) = proc_stats(pid).unwrap_or_default();
    println!("  RSS at start of load: {:.1} MiB", kib_mib(rss0));

    // Sustained load.
    let stop = Arc::new(AtomicBool::new(false));
    let accepted = Arc::new(AtomicU64::new(0));
    let retries = Arc::new(AtomicU64::new(0));
    let mut senders = Vec::new();
    for mut w in workloads.drain(..) {
        let mut exp = RawExporter::new(channel(sc.grpc)?, false);
        let (stop, accepted, retries) = (stop.clone(), accepted.clone(), retries.clone());
        senders.push(tokio::spawn(async move {
            let mut cycle = 0u64;
            'outer: while !stop.load(Ordering::Relaxed) {
                cycle += 1;
                for i in 0..w.batches.len() {
                    if stop.load(Ordering::Relaxed) {
                        break 'outer;
                    }
                    let (body, n) = w.get(i, cycle);
                    loop {
                        match exp.export(body.clone()).await {
                            Ok(r) => {
                                let rej = r.partial_success.map_or(0, |p| p.rejected_spans);
                                accepted.fetch_add(
                                    n.saturating_sub(u64::try_from(rej).unwrap_or(0)),
                                    Ordering::Relaxed,
                                );
                                break;
                            }
                            Err(s) if s.code() == tonic::Code::Unavailable => {
                                retries.fetch_add(1, Ordering::Relaxed);
                                tokio::time::sleep(Duration::from_millis(2)).await;
                            }
                            Err(s) => return Err(format!("export failed: {s}")),
                        }
                    }
                }
            }
            Ok(())
        }));
    }
    let stop_probe = Arc::new(AtomicBool::new(false));
    let loaded_probe = tokio::spawn(probe(
        sc.grpc,
        probe_instance,
        seen_rx,
        Duration::from_millis(args.probe_interval_ms),
        stop_probe.clone(),
        last_probe,
    ));

    let t0 = Instant::now();
    let mut rss_max = rss0;
    let mut last = (Instant::now(), 0u64);
    let report_every = Duration::from_secs(5.min(args.duration_s.max(1)));
    while t0.elapsed() < Duration::from_secs(args.duration_s) {
        tokio::time::sleep(report_every).await;
        let now = Instant::now();
        let a = accepted.load(Ordering::Relaxed);
        let (rss, cpu) = proc_stats(pid).unwrap_or_default();
        rss_max = rss_max.max(rss);
        let dt = now.duration_since(last.0).as_secs_f64();
        #[allow(clippy::cast_precision_loss)] // counts for a printout
        let rate = (a - last.1) as f64 / dt;
        #[allow(clippy::cast_precision_loss)]
        let cpu_s = (cpu - cpu0) as f64 / TICKS_PER_S;
        println!(
            "  t={:>4.0}s  {:>9.0} spans/s  RSS {:>6.1} MiB  sidecar CPU {:>6.1} s",
            t0.elapsed().as_secs_f64(),
            rate,
            kib_mib(rss),
            cpu_s
        );
        last = (now, a);
    }
    stop.store(true, Ordering::Relaxed);
    let wall = t0.elapsed().as_secs_f64();
    let total = accepted.load(Ordering::Relaxed);
    for s in senders {
        match s.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => println!("  sender: {e}"),
            Err(e) => println!("  sender task: {e}"),
        }
    }
    let (rss1, cpu1) = proc_stats(pid).unwrap_or_default();
    stop_probe.store(true, Ordering::Relaxed);
    let (mut load_lat, _) = loaded_probe.await.map_err(setup("probe"))??;
    watcher.abort();

    #[allow(clippy::cast_precision_loss)] // counts for a printout
    let (total_f, cpu_s) = (total as f64, (cpu1 - cpu0) as f64 / TICKS_PER_S);
    println!("results:");
    println!(
        "  ingest: {total} engine spans accepted in {wall:.1} s = {:.0} spans/s (wall)",
        total_f / wall
    );
    println!(
        "  sidecar CPU: {cpu_s:.1} s = {:.2} cores busy; {:.0} spans per CPU-second",
        cpu_s / wall,
        if cpu_s > 0.0 {
            total_f / cpu_s
        } else {
            f64::NAN
        }
    );
    println!(
        "  retries after UNAVAILABLE (queue full): {}",
        retries.load(Ordering::Relaxed)
    );
    println!(
        "  RSS: start {:.1} MiB, end {:.1} MiB, max {:.1} MiB",
        kib_mib(rss0),
        kib_mib(rss1),
        kib_mib(rss_max.max(rss1))
    );
    println!("  decode window → visible in /v1/slots (export sent → seen on /v1/slots/stream):");
    summarize("idle", &mut idle_lat);
    summarize("under load", &mut load_lat);
    if args.show_counters {
        let text = reqwest::get(format!("http://{}/metrics", sc.views))
            .await
            .map_err(setup("metrics"))?
            .text()
            .await
            .map_err(setup("metrics"))?;
        println!("sidecar counters:");
        for l in text.lines().filter(|l| l.starts_with("slotlight_sidecar_")) {
            println!("  {l}");
        }
    }
    if let Some(path) = &args.dump_metrics {
        dump_metrics(sc.views, path).await?;
    }
    if turns_db != ":memory:" {
        // The writer commits within milliseconds; give it a moment after the last export.
        tokio::time::sleep(Duration::from_millis(500)).await;
        match stored_turns(&turns_db) {
            Ok(n) => println!("  turns stored: {n}"),
            Err(e) => println!("  turns stored: unknown ({e})"),
        }
    }
    drop(sc);
    Ok(())
}

/// Writes `/metrics` in both formats: `path` (Prometheus text) and `path.openmetrics`.
async fn dump_metrics(views: SocketAddr, path: &std::path::Path) -> Result<(), BenchError> {
    let client = reqwest::Client::new();
    let mut om = path.as_os_str().to_owned();
    om.push(".openmetrics");
    for (accept, out) in [
        ("text/plain", path.to_path_buf()),
        ("application/openmetrics-text; version=1.0.0", om.into()),
    ] {
        let text = client
            .get(format!("http://{views}/metrics"))
            .header("accept", accept)
            .send()
            .await
            .map_err(setup("metrics"))?
            .text()
            .await
            .map_err(setup("metrics"))?;
        std::fs::write(&out, text).map_err(setup("writing the metrics dump"))?;
        println!("metrics ({accept}) written to {}", out.display());
    }
    Ok(())
}

#[allow(clippy::cast_precision_loss)] // KiB for a printout
fn kib_mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn workload_patches_cycles_in_place() {
        let args =
            match crate::base::config::Cli::parse_from(["x", "bench", "--windows", "2"]).command {
                Some(crate::base::config::Command::Bench(b)) => b,
                None => panic!("bench args"),
            };
        let mut w = Workload::new("i", &args, 1_000);
        let (a, n) = w.get(0, 1);
        let (b, _) = w.get(0, 2);
        assert!(n > 0);
        assert_eq!(a.len(), b.len());
        assert_ne!(a, b);
        let mut batch = crate::metrics::spanmetrics::SpanBatch::default();
        let conv = crate::receiver::decode::convert(&b, &mut batch).expect("still valid protobuf");
        assert_eq!(conv.rejected_total(), 0);
        assert!(conv.spans[0].request_id.starts_with("bench-c00000002-"));
    }
}

/// Where the time of one span goes inside the sidecar (no network): run with
/// `cargo test --release -p slotlight-sidecar --lib -- --ignored span_cost --nocapture`.
#[cfg(test)]
mod breakdown {
    use super::*;
    use clap::Parser;

    #[test]
    #[ignore]
    fn span_cost() {
        let args = match crate::base::config::Cli::parse_from(["x", "bench"]).command {
            Some(crate::base::config::Command::Bench(b)) => b,
            None => panic!("bench args"),
        };
        let mut w = Workload::new("i", &args, 1_000);
        let metrics = crate::metrics::Metrics::new(100);
        let mut asm = crate::assembly::Assembler::new(Default::default());
        let mut out = crate::assembly::Outputs::default();
        let (mut t_read, mut t_merge, mut t_apply, mut t_turn) = (0.0, 0.0, 0.0, 0.0);
        let mut n = 0u64;
        for cycle in 1..40 {
            for i in 0..w.batches.len() {
                let (b, k) = w.get(i, cycle);
                n += k;
                let t = Instant::now();
                let mut batch = crate::metrics::spanmetrics::SpanBatch::default();
                let c = crate::receiver::decode::convert(&b, &mut batch).expect("decodes");
                t_read += t.elapsed().as_secs_f64();
                let t = Instant::now();
                metrics.merge_spans(batch);
                t_merge += t.elapsed().as_secs_f64();
                let t = Instant::now();
                asm.apply(c.spans, 0, &mut out);
                t_apply += t.elapsed().as_secs_f64();
                let t = Instant::now();
                for turn in out.turns.drain(..) {
                    metrics.observe_turn(&turn);
                    let _ = serde_json::to_vec(&turn);
                }
                t_turn += t.elapsed().as_secs_f64();
            }
        }
        #[allow(clippy::cast_precision_loss)]
        let per = |t: f64| t / n as f64 * 1e9;
        println!(
            "ns/span: read+validate {:.0}, spanmetrics merge {:.0}, assembly {:.0}, turns {:.0}",
            per(t_read),
            per(t_merge),
            per(t_apply),
            per(t_turn)
        );
    }
}
