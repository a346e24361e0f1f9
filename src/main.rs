//! The `steward` binary: parse the command line, set up logging, run.
use std::process::ExitCode;

use clap::Parser;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = sandbox_steward::cli::Cli::parse();
    sandbox_steward::telemetry::init_as("info", cli.log_format);
    match sandbox_steward::cli::run(cli).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!(
                "error: {}",
                sandbox_steward::cli::sentence(&format!("{e:#}"))
            );
            ExitCode::from(2)
        }
    }
}
