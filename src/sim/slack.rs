//! The Slack Web API simulator served by `steward sim slack`.
use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct SlackSimOptions {}

pub async fn run_cli(_opts: SlackSimOptions) -> anyhow::Result<ExitCode> {
    anyhow::bail!("not built yet")
}
