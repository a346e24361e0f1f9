//! The `steward` command line: one clap tree, dispatched in one `match`.
//!
//! Each subcommand's work lives in its own module; this file only parses and routes.
use std::process::ExitCode;

use clap::{Parser, Subcommand};

pub mod audit;
mod check;
pub mod demo;
pub mod e2b;
pub mod healthcheck;
mod mcp;
pub mod run;
pub mod sweep;
mod table;
mod visible;

#[derive(Debug, Parser)]
#[command(
    name = "steward",
    version,
    about = "A human in the loop for an E2B sandbox fleet"
)]
pub struct Cli {
    /// Logs on stderr as plain `text` or `json` lines for log shippers (`RUST_LOG` filters both).
    /// Given before the command: `steward --log-format json serve`.
    #[arg(
        long,
        value_enum,
        env = "STEWARD_LOG_FORMAT",
        default_value = "text",
        hide_possible_values = true
    )]
    pub log_format: crate::telemetry::LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the Slack app (commands, interactions, events) and its workers.
    Serve,
    /// The whole product on this machine with no account: simulated E2B and Slack (a page at
    /// http://127.0.0.1:3000) and Steward, opening on a sweep, a governed run and a push test.
    Demo(demo::DemoArgs),
    /// Run a local simulator of E2B or Slack.
    #[command(subcommand)]
    Sim(SimCommand),
    /// Call the E2B API directly.
    E2b(e2b::E2bArgs),
    /// Run one hygiene sweep now: a dry run (opens nothing, posts nothing) unless `--live`.
    Sweep(sweep::SweepArgs),
    /// Say what works, what is risky and what stops Steward, one line each with its fix: settings,
    /// Redis and its persistence, E2B, Slack, every channel and approver `steward.toml` names.
    /// Exits 0 when all is fine, 1 with warnings, 2 with a problem.
    Check(check::CheckArgs),
    /// Read the audit log of approval cases.
    Audit(audit::AuditArgs),
    /// Serve Steward's MCP tools on stdin/stdout for a local agent, through the HTTP API of the
    /// Steward at `STEWARD_URL` with the token in `STEWARD_API_TOKEN`.
    Mcp,
    /// Run a command in a fresh sandbox through the Steward at `STEWARD_URL` (token in
    /// `STEWARD_API_TOKEN`), streaming its output here. Exits with the command's exit code,
    /// 124 when Steward stopped it at its timeout, 1 when the run failed.
    Run(run::RunArgs),
    /// Ask the Steward on `STEWARD_LISTEN` whether it is alive (`GET /healthz`): exit 0 if it
    /// is, 1 if not. The container image's HEALTHCHECK.
    Healthcheck(healthcheck::HealthcheckArgs),
}

#[derive(Debug, Subcommand)]
pub enum SimCommand {
    /// An HTTP server on 127.0.0.1 that behaves like E2B's control-plane API and envd.
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
    /// with `POST /_sim/faults`. It answers Slack's errors from what it holds: add channels with
    /// `POST /_sim/channels` (`{"id", "name", "bot_member"}`), put the bot in one with
    /// `POST /_sim/channels/<id>/invite`, limit a method with `POST /_sim/rate_limits`.
    Slack(crate::sim::slack::SlackSimOptions),
}

impl Cli {
    /// The log level when `RUST_LOG` is unset: `check`'s report is what it prints, so its
    /// logs (an E2B retry, a Slack rate limit) stay quiet unless they are errors.
    pub fn default_log_filter(&self) -> &'static str {
        match self.command {
            Command::Check(_) => "error",
            _ => "info",
        }
    }
}

/// Runs the parsed command line.
pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Serve => crate::startup::serve_from_env().await,
        Command::Demo(args) => demo::run(args).await,
        Command::Sim(SimCommand::E2b(opts)) => crate::sim::e2b::run_cli(opts).await,
        Command::Sim(SimCommand::Slack(opts)) => crate::sim::slack::run_cli(opts).await,
        Command::E2b(args) => e2b::run(args).await,
        Command::Sweep(args) => sweep::run(args).await,
        Command::Check(args) => check::run(args).await,
        Command::Audit(args) => audit::run(args).await,
        Command::Mcp => mcp::run().await,
        Command::Run(args) => run::run(args).await,
        Command::Healthcheck(args) => healthcheck::run(args).await,
    }
}

/// `text` as a sentence for the terminal: it ends with a period (or `?`/`!`) exactly once. An
/// error may quote E2B or a Steward server, so its control characters are made visible.
pub fn sentence(text: &str) -> String {
    let text = visible::visible(text.trim_end(), visible::Layout::Keep);
    let text = text.as_str();
    if text.ends_with(['.', '?', '!']) {
        text.to_owned()
    } else {
        format!("{text}.")
    }
}
