//! `steward e2b <action>`: every E2B action from the terminal.
use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct E2bArgs {}

pub async fn run(_args: E2bArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("not built yet")
}
