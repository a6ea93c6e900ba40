//! `slotlight-engine serve`: the OpenAI-compatible API.

use clap::Args;

use super::ModelArgs;

/// Arguments of `serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Model and device.
    #[command(flatten)]
    pub model: ModelArgs,
}

pub(super) fn run(_a: ServeArgs) -> anyhow::Result<()> {
    anyhow::bail!("serve is not built yet")
}
