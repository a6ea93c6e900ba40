//! The `slotlight-sidecar` command line.

use std::io::IsTerminal;

use anyhow::Context;
use clap::Parser;
use slotlight_sidecar::base::config::{Cli, Command};

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        // Colour only on a terminal: a log file or collector would get raw escape codes.
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    match cli.command {
        Some(Command::Bench(args)) => {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .context("building the runtime")?;
            rt.block_on(slotlight_sidecar::tools::bench::run(args))?;
            Ok(())
        }
        None => serve(cli.serve),
    }
}

fn serve(cfg: slotlight_sidecar::Config) -> anyhow::Result<()> {
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = cfg.worker_threads {
        rt.worker_threads(n.max(1));
    }
    let rt = rt.enable_all().build().context("building the runtime")?;
    rt.block_on(async move {
        // Handlers first: whoever reads the start-up line may signal at once.
        let signals = Signals::install();
        let sidecar = slotlight_sidecar::start(cfg).await?;
        // The start-up line goes to stderr: stdout carries one JSON line per finished request.
        eprintln!("{}", sidecar.startup_line());
        signals.wait().await;
        tracing::info!("shutting down");
        sidecar.shutdown().await;
        Ok(())
    })
}

/// SIGINT and SIGTERM.
struct Signals {
    #[cfg(unix)]
    handlers: Option<(tokio::signal::unix::Signal, tokio::signal::unix::Signal)>,
}

impl Signals {
    fn install() -> Self {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            let handlers = signal(SignalKind::terminate())
                .and_then(|t| Ok((t, signal(SignalKind::interrupt())?)))
                .ok();
            Signals { handlers }
        }
        #[cfg(not(unix))]
        Signals {}
    }

    async fn wait(self) {
        #[cfg(unix)]
        if let Some((mut term, mut int)) = self.handlers {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            return;
        }
        let _ = tokio::signal::ctrl_c().await;
    }
}
