//! The `steward` binary: parse the command line, set up logging, run.
use std::process::ExitCode;

use clap::Parser;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = sandbox_steward::cli::Cli::parse();
    sandbox_steward::telemetry::init("info");
    match sandbox_steward::cli::run(cli).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}
