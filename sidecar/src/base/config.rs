//! Command line and configuration.

use std::net::SocketAddr;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::base::net::IpNet;

/// `slotlight-sidecar`: receives the engine's OTLP spans and serves live views of them.
#[derive(Debug, Parser)]
#[command(name = "slotlight-sidecar", version, about, long_about = None)]
#[command(args_conflicts_with_subcommands = true)]
pub struct Cli {
    /// A subcommand; without one the sidecar serves.
    #[command(subcommand)]
    pub command: Option<Command>,
    /// The options of the default command: receive, assemble, serve the views.
    #[command(flatten)]
    pub serve: Config,
}

/// What the binary does instead of serving, when a subcommand is given.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Measure OTLP/gRPC ingest speed, memory and view latency against a child sidecar.
    Bench(BenchArgs),
}

/// Everything the serving sidecar needs. Every address binds loopback unless told otherwise.
#[derive(Debug, Clone, Args)]
pub struct Config {
    /// OTLP/gRPC receiver address (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:4317")]
    pub otlp_grpc: SocketAddr,

    /// OTLP/HTTP receiver address (`POST /v1/traces`, protobuf or JSON).
    #[arg(long, default_value = "127.0.0.1:4318")]
    pub otlp_http: SocketAddr,

    /// Views address: `/`, `/v1/slots`, `/v1/turns`, `/metrics`.
    #[arg(long, default_value = "127.0.0.1:9464")]
    pub listen: SocketAddr,

    /// Also send everything received on to this OTLP endpoint. `http://host:port` posts
    /// OTLP/HTTP protobuf to `http://host:port/v1/traces` (a URL with a path is used as given);
    /// `grpc://host:port` uses OTLP/gRPC (plaintext). TLS upstreams are not built in: put a
    /// collector or a TLS proxy on loopback.
    #[arg(long, value_name = "URL")]
    pub forward_otlp: Option<String>,

    /// Export requests waiting to be forwarded; more are dropped and counted.
    #[arg(long, default_value_t = 256)]
    pub forward_queue: usize,

    /// Give up on one forwarded export after this long.
    #[arg(long, default_value_t = 5000, value_name = "MS")]
    pub forward_timeout_ms: u64,

    /// Bearer token required by `/v1/*` and `/metrics` (`Authorization: Bearer …` or `?token=`).
    #[arg(long, env = "SLOTLIGHT_SIDECAR_TOKEN", hide_env_values = true)]
    pub token: Option<String>,

    /// Accept OTLP only from these addresses or networks (`10.0.0.0/8,::1`); default: anyone
    /// who can reach the receivers (loopback only with the default addresses).
    #[arg(long, value_delimiter = ',', value_name = "CIDR")]
    pub allow_otlp_from: Vec<IpNet>,

    /// Largest OTLP payload after decompression, in bytes (bigger ones get 413).
    #[arg(long, default_value_t = 16 << 20, value_name = "BYTES")]
    pub max_body_bytes: usize,

    /// Spans waiting for the assembly task; more make the receivers answer 503 / UNAVAILABLE.
    #[arg(long, default_value_t = 262_144)]
    pub ingest_queue_spans: usize,

    /// Finished-request records kept in memory (a ring buffer): what `/v1/turns` lists with
    /// `--turns-db :memory:`.
    #[arg(long, default_value_t = 10_000)]
    pub turns: usize,

    /// SQLite file that keeps every turn record across restarts, read by `/v1/turns`
    /// (default `$XDG_STATE_HOME/slotlight/turns.db`, else `~/.local/state/slotlight/turns.db`).
    /// `:memory:` keeps no file: `/v1/turns` lists the in-memory ring (`--turns`).
    #[arg(long, value_name = "PATH")]
    pub turns_db: Option<String>,

    /// Stored turns older than this are deleted (`30d`, `12h`, `90m`, `45s`, or seconds).
    #[arg(long, default_value = "7d", value_parser = parse_age, value_name = "AGE")]
    pub turns_retention: Duration,

    /// At most this many turns are stored; the oldest beyond it are deleted.
    #[arg(long, default_value_t = 1_000_000, value_name = "COUNT")]
    pub turns_max: u64,

    /// Requests (traces) being assembled at once; beyond this the oldest is evicted.
    #[arg(long, default_value_t = 20_000)]
    pub max_traces: usize,

    /// A request with no new span for this long is evicted (its row is cleared).
    #[arg(long, default_value_t = 600, value_name = "SECONDS")]
    pub trace_ttl_s: u64,

    /// How long a finished request waits for leg spans still in flight before its record is
    /// written without them.
    #[arg(long, default_value_t = 2000, value_name = "MS")]
    pub legs_wait_ms: u64,

    /// An engine instance with nothing in flight is forgotten after this long.
    #[arg(long, default_value_t = 900, value_name = "SECONDS")]
    pub instance_ttl_s: u64,

    /// How long a session stays live after its last turn when the engine keeps no KV for it
    /// (otherwise it is live as long as the engine keeps its KV: the turn's
    /// `slotlight.session.kv_ttl_ms`); a session is observed in the session histograms once it
    /// is no longer live.
    #[arg(long, default_value_t = 300, value_name = "SECONDS")]
    pub session_idle_s: u64,

    /// Slot snapshots are published at most this often.
    #[arg(long, default_value_t = 50, value_name = "MS")]
    pub publish_interval_ms: u64,

    /// Label series kept for `traces_span_metrics_*`; spans beyond go to an `_overflow` series.
    #[arg(long, default_value_t = 2000)]
    pub max_span_metric_series: usize,

    /// Do not write one JSON line per finished request on stdout.
    #[arg(long)]
    pub no_turn_log: bool,

    /// Tokio worker threads (default: one per core).
    #[arg(long)]
    pub worker_threads: Option<usize>,
}

impl Config {
    /// The defaults, with every listener on `127.0.0.1:0` (tests and benchmarks).
    pub fn ephemeral() -> Self {
        let mut cfg = Cli::parse_from(["slotlight-sidecar"]).serve;
        let any: SocketAddr = SocketAddr::from(([127, 0, 0, 1], 0));
        cfg.otlp_grpc = any;
        cfg.otlp_http = any;
        cfg.listen = any;
        cfg.no_turn_log = true;
        cfg.turns_db = Some(":memory:".into()); // never the user's state directory
        cfg.token = None; // not from the environment: tests set it when they mean to
        cfg
    }

    /// [`Self::legs_wait_ms`] as a duration.
    pub fn legs_wait(&self) -> Duration {
        Duration::from_millis(self.legs_wait_ms)
    }

    /// [`Self::session_idle_s`] in nanoseconds.
    pub fn session_idle_ns(&self) -> i64 {
        i64::try_from(Duration::from_secs(self.session_idle_s).as_nanos()).unwrap_or(i64::MAX)
    }

    /// [`Self::publish_interval_ms`] as a duration.
    pub fn publish_interval(&self) -> Duration {
        Duration::from_millis(self.publish_interval_ms.max(1))
    }
}

/// An age such as `30d`, `12h`, `90m`, `45s` or `3600` (seconds), for `--turns-retention`.
pub fn parse_age(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (digits, unit) = match s.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{s:?} is not an age such as 30d, 12h, 90m or 45s"))?;
    let unit_s = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(format!("{s:?}: the unit must be s, m, h or d")),
    };
    n.checked_mul(unit_s)
        .map(Duration::from_secs)
        .ok_or_else(|| format!("{s:?} is too long"))
}

/// `slotlight-sidecar bench`.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// Seconds of sustained load.
    #[arg(long, default_value_t = 60)]
    pub duration_s: u64,

    /// Concurrent gRPC connections of the load generator.
    #[arg(long, default_value_t = 2)]
    pub connections: usize,

    /// Spans per export request (the SDK's batch processor sends up to 512).
    #[arg(long, default_value_t = 512)]
    pub batch_spans: usize,

    /// Decode windows per synthetic request (each request also has a queue, a prefill, a leg
    /// and a root span).
    #[arg(long, default_value_t = 8)]
    pub windows: usize,

    /// Slots per synthetic engine instance.
    #[arg(long, default_value_t = 8)]
    pub slots: usize,

    /// Tokio worker threads of the sidecar under test.
    #[arg(long, default_value_t = 1)]
    pub sidecar_threads: usize,

    /// Pin the sidecar under test to this CPU with `taskset`, when `taskset` exists.
    #[arg(long)]
    pub pin_cpu: Option<usize>,

    /// Latency probes: one decode window every this many milliseconds.
    #[arg(long, default_value_t = 100)]
    pub probe_interval_ms: u64,

    /// Print the sidecar's own counters from `/metrics` at the end.
    #[arg(long)]
    pub show_counters: bool,

    /// The sidecar under test's `--turns-db`: `:memory:`, or a file (default: a fresh file in
    /// the system's temporary directory, removed at the end).
    #[arg(long, value_name = "PATH")]
    pub turns_db: Option<String>,

    /// At the end, write the whole `/metrics` answer to this file (Prometheus text 0.0.4) and
    /// to the same path with `.openmetrics` appended (OpenMetrics 1.0), to compare expositions.
    #[arg(long, value_name = "PATH")]
    pub dump_metrics: Option<std::path::PathBuf>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn defaults_bind_loopback() {
        let cli = Cli::parse_from(["slotlight-sidecar"]);
        assert!(cli.serve.otlp_grpc.ip().is_loopback());
        assert!(cli.serve.otlp_http.ip().is_loopback());
        assert!(cli.serve.listen.ip().is_loopback());
        assert_eq!(cli.serve.max_body_bytes, 16 << 20);
        assert_eq!(cli.serve.turns, 10_000);
    }

    #[test]
    fn turn_store_flags_parse() {
        let cli = Cli::parse_from([
            "slotlight-sidecar",
            "--turns-db",
            "/tmp/x.db",
            "--turns-retention",
            "12h",
            "--turns-max",
            "5",
        ]);
        assert_eq!(cli.serve.turns_db.as_deref(), Some("/tmp/x.db"));
        assert_eq!(cli.serve.turns_retention, Duration::from_secs(12 * 3600));
        assert_eq!(cli.serve.turns_max, 5);
        let d = Cli::parse_from(["slotlight-sidecar"]).serve;
        assert_eq!(d.turns_retention, Duration::from_secs(7 * 86_400));
        assert_eq!(
            d.turns_db, None,
            "absent: the XDG default, resolved at start"
        );
        assert_eq!(Config::ephemeral().turns_db.as_deref(), Some(":memory:"));
        assert_eq!(parse_age("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_age("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_age("2w").is_err());
        assert!(parse_age("h").is_err());
        assert!(parse_age("99999999999999999999d").is_err());
    }

    #[test]
    fn allow_list_parses() {
        let cli = Cli::parse_from([
            "slotlight-sidecar",
            "--allow-otlp-from",
            "10.0.0.0/8,::1",
            "--allow-otlp-from",
            "192.168.1.7",
        ]);
        assert_eq!(cli.serve.allow_otlp_from.len(), 3);
    }

    #[test]
    fn bench_subcommand_parses() {
        let cli = Cli::parse_from(["slotlight-sidecar", "bench", "--duration-s", "3"]);
        match cli.command {
            Some(Command::Bench(b)) => assert_eq!(b.duration_s, 3),
            None => panic!("bench not parsed"),
        }
    }
}
