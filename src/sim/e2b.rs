//! The E2B simulator served by `steward sim e2b`.
use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct SimOptions {}

pub async fn run_cli(_opts: SimOptions) -> anyhow::Result<ExitCode> {
    anyhow::bail!("not built yet")
}
