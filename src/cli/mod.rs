//! The `steward` command line: one clap tree, dispatched in one `match`.
//!
//! Each subcommand's work lives in its own module; this file only parses and routes.
use std::process::ExitCode;

use clap::{Parser, Subcommand};

pub mod audit;
pub mod e2b;
pub mod sweep;
mod table;

#[derive(Debug, Parser)]
#[command(
    name = "steward",
    version,
    about = "A human in the loop for an E2B sandbox fleet"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the Slack app (commands, interactions, events) and its workers.
    Serve,
    /// Run a local simulator of E2B or Slack.
    #[command(subcommand)]
    Sim(SimCommand),
    /// Call the E2B API directly.
    E2b(e2b::E2bArgs),
    /// Run one hygiene sweep now: a dry run (opens nothing, posts nothing) unless `--live`.
    Sweep(sweep::SweepArgs),
    /// Say which settings are missing or invalid.
    Check,
    /// Read the audit log of approval cases.
    Audit(audit::AuditArgs),
}

#[derive(Debug, Subcommand)]
pub enum SimCommand {
    /// An HTTP server on 127.0.0.1 that behaves like E2B's control-plane API.
    E2b(crate::sim::e2b::SimOptions),
    /// An HTTP server on 127.0.0.1 that records what Steward posts to Slack.
    ///
    /// Point Steward at it with `SLACK_API_URL=http://<listen>/api`. It answers the Web API methods
    /// Steward calls and records every call in memory only (nothing is written to disk; it is gone
    /// when the simulator stops): read them with `GET /_sim/messages` (every call, in order) and
    /// `GET /_sim/messages/<channel>/<ts>` (a message as it reads now, after `chat.update`).
    /// Posts to `http://<listen>/hooks/<name>` stand in for response URLs and are recorded too.
    /// Seed users and user groups with `--users`, `--group` or `--seed`, or later with
    /// `POST /_sim/usergroups`, so approver groups can be tried without Slack; program failures
    /// with `POST /_sim/faults`.
    Slack(crate::sim::slack::SlackSimOptions),
}

/// Runs the parsed command line.
pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Serve => crate::startup::serve_from_env().await,
        Command::Sim(SimCommand::E2b(opts)) => crate::sim::e2b::run_cli(opts).await,
        Command::Sim(SimCommand::Slack(opts)) => crate::sim::slack::run_cli(opts).await,
        Command::E2b(args) => e2b::run(args).await,
        Command::Sweep(args) => sweep::run(args).await,
        Command::Check => check(),
        Command::Audit(args) => audit::run(args).await,
    }
}

fn check() -> anyhow::Result<ExitCode> {
    let settings = crate::config::Settings::load(&crate::config::ProcessEnv)?;
    let mut missing = Vec::new();
    if settings.e2b.api_key.is_none() {
        missing.push("E2B_API_KEY is not set: Steward cannot call E2B.");
    }
    if settings.e2b.team_id.is_none() {
        missing.push("E2B_PROJECT_ID (or E2B_TEAM_ID) is not set: team metrics are unavailable.");
    }
    if settings.slack.bot_token.is_none() {
        missing.push("SLACK_BOT_TOKEN is not set: Steward cannot post to Slack.");
    }
    if settings.slack.signing_secret.is_none() {
        missing.push("SLACK_SIGNING_SECRET is not set: every Slack request will be refused.");
    }
    if missing.is_empty() {
        println!(
            "Configuration is complete (listening on {}).",
            settings.listen
        );
        return Ok(ExitCode::SUCCESS);
    }
    for line in &missing {
        println!("{line}");
    }
    Ok(ExitCode::from(1))
}
