//! The `steward` binary: parse the command line, set up logging, run.
use std::process::ExitCode;

use clap::Parser;

/// mimalloc instead of the system allocator: a Slack request allocates and frees many small
/// buffers (headers, forms, JSON), and glibc's malloc was a sixth of the request path's CPU.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = sandbox_steward::cli::Cli::parse();
    sandbox_steward::telemetry::init_as(cli.default_log_filter(), cli.log_format);
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
