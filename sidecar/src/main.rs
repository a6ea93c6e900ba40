//! The `slotlight-sidecar` command line.

use anyhow::Context;
use clap::Parser;
use slotlight_sidecar::config::{Cli, Command};

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
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
            rt.block_on(slotlight_sidecar::bench::run(args))?;
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
        let sidecar = slotlight_sidecar::start(cfg).await?;
        // The start-up line goes to stderr: stdout carries one JSON line per finished request.
        eprintln!("{}", sidecar.startup_line());
        wait_for_signal().await;
        tracing::info!("shutting down");
        sidecar.shutdown().await;
        Ok(())
    })
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
