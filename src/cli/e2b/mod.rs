//! `steward e2b <action>`: every E2B control-plane action from the terminal.
//!
//! Output is an aligned table by default and the model types as JSON with `--json`. Failures print
//! as one plain sentence and exit with status 1. `kill` and `delete-template` cannot be undone, so
//! without `--yes` they make the person at the terminal type the id back; with no terminal they
//! refuse and send nothing.
//!
//! This file holds the clap tree, the argument parsers and the one dispatch (where the
//! confirmation happens); each action group lives in its own file: `sandboxes`, `snapshots`
//! (with templates) and `team`, printing through `output`. None of them talks HTTP itself (that is
//! `crate::e2b`) or prints secrets (the model types never serialize access tokens).
use std::io::{BufRead, IsTerminal, Write};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use chrono::{DateTime, Utc};

use crate::config::ProcessEnv;
use crate::duration::parse as parse_duration;
use crate::e2b::E2bClient;

mod output;
mod sandboxes;
mod snapshots;
mod team;
mod webhooks;

pub use sandboxes::{SandboxAction, StateArg};
pub use snapshots::SnapshotAction;
pub use team::{MaxArg, TeamAction};
pub use webhooks::WebhookAction;

#[derive(Debug, clap::Args)]
pub struct E2bArgs {
    /// Print JSON (the API's own field names) instead of tables.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub action: Action,
}

/// Every action, by group; the groups are flattened, so `steward e2b kill` is one word as before.
#[derive(Debug, clap::Subcommand)]
pub enum Action {
    #[command(flatten)]
    Sandbox(SandboxAction),
    #[command(flatten)]
    Team(TeamAction),
    #[command(flatten)]
    Snapshot(SnapshotAction),
    /// E2B's lifecycle webhook registrations: register, list, delete.
    #[command(subcommand)]
    Webhooks(WebhookAction),
}

// The parsers' errors end with a period: clap prints them as the end of its sentence.
fn parse_dur(value: &str) -> Result<Duration, String> {
    parse_duration("duration", value).map_err(|e| crate::cli::sentence(&e.to_string()))
}

fn parse_pair(value: &str) -> Result<(String, String), String> {
    match value.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_owned(), v.to_owned())),
        _ => Err(format!("{value:?} is not KEY=VALUE.")),
    }
}

fn parse_cursor(value: &str) -> Result<DateTime<Utc>, String> {
    if let Ok(ms) = value.trim().parse::<i64>() {
        return DateTime::from_timestamp_millis(ms).ok_or_else(|| format!("{ms} is out of range."));
    }
    DateTime::parse_from_rfc3339(value.trim())
        .map(|t| t.with_timezone(&Utc))
        .map_err(|_| format!("{value:?} is neither milliseconds since 1970 nor an RFC 3339 time."))
}

/// The time `d` ago, for metrics windows.
fn ago(d: Duration) -> DateTime<Utc> {
    Utc::now() - chrono::Duration::from_std(d).unwrap_or(chrono::Duration::zero())
}

/// Runs one action. Every failure prints as a sentence on stderr and exits 1.
pub async fn run(args: E2bArgs) -> anyhow::Result<ExitCode> {
    match execute(args).await {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(e) => {
            eprintln!("{}", crate::cli::sentence(&format!("{e:#}")));
            Ok(ExitCode::from(1))
        }
    }
}

async fn execute(args: E2bArgs) -> anyhow::Result<()> {
    // Irreversible actions are confirmed before anything else, so a refusal sends nothing.
    match &args.action {
        Action::Sandbox(SandboxAction::Kill { id, yes }) => {
            confirm("kill sandbox", id.as_str(), *yes)?
        }
        Action::Snapshot(SnapshotAction::DeleteTemplate { id, yes }) => {
            confirm("delete template", id.as_str(), *yes)?
        }
        _ => {}
    }
    let settings = crate::config::e2b_settings(&ProcessEnv)?;
    let mut client = E2bClient::new(&settings)?;
    if let Some(pages) = max_pages(&args.action) {
        client = client.with_max_pages(pages);
    }
    let out = output::Output { json: args.json };
    match args.action {
        Action::Sandbox(action) => sandboxes::run(action, &client, &out).await,
        Action::Team(action) => team::run(action, &client, &out).await,
        Action::Snapshot(action) => snapshots::run(action, &client, &out).await,
        Action::Webhooks(action) => webhooks::run(action, &client, &out).await,
    }
}

/// The page cap of a listing action; only listings take `--max-pages`.
fn max_pages(action: &Action) -> Option<u32> {
    match action {
        Action::Sandbox(SandboxAction::List { max_pages, .. })
        | Action::Sandbox(SandboxAction::MetricsMany { max_pages, .. })
        | Action::Snapshot(SnapshotAction::Snapshots { max_pages, .. })
        | Action::Snapshot(SnapshotAction::Templates { max_pages }) => *max_pages,
        _ => None,
    }
}

/// Asks the person at the terminal to type `id` back; refuses when there is no terminal.
fn confirm(what: &str, id: &str, yes: bool) -> anyhow::Result<()> {
    if yes {
        return Ok(());
    }
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        bail!(
            "Refusing to {what} {id}: it cannot be undone, there is no terminal to confirm on, and --yes was not given. Nothing was sent."
        );
    }
    let mut err = std::io::stderr();
    write!(
        err,
        "This will {what} {id} and cannot be undone. Type the id to confirm: "
    )?;
    err.flush()?;
    let mut typed = String::new();
    stdin
        .lock()
        .read_line(&mut typed)
        .context("could not read the confirmation")?;
    if typed.trim() != id {
        return Err(anyhow!(
            "Not done: what you typed does not match {id}. Nothing was sent."
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Wrapper {
        #[command(flatten)]
        args: E2bArgs,
    }

    fn parse(argv: &[&str]) -> Result<E2bArgs, clap::Error> {
        let mut full = vec!["steward"];
        full.extend_from_slice(argv);
        Wrapper::try_parse_from(full).map(|w| w.args)
    }

    #[test]
    fn list_flags_parse_with_repeated_metadata_and_global_json() {
        let args = parse(&[
            "list",
            "--state",
            "paused",
            "--metadata",
            "user=abc",
            "--metadata",
            "app=a=b",
            "--json",
            "--all-pages",
            "false",
        ])
        .unwrap();
        assert!(args.json);
        let Action::Sandbox(SandboxAction::List {
            metadata,
            all_pages,
            ..
        }) = args.action
        else {
            panic!("expected list");
        };
        assert_eq!(
            metadata,
            vec![("user".into(), "abc".into()), ("app".into(), "a=b".into())]
        );
        assert!(!all_pages);
    }

    #[test]
    fn bad_ids_durations_and_pairs_are_refused_by_the_parser() {
        assert!(parse(&["get", "a/b"]).is_err());
        assert!(parse(&["timeout", "sbx1", "soon"]).is_err());
        assert!(parse(&["list", "--metadata", "novalue"]).is_err());
        assert!(parse(&["metrics-many"]).is_err());
        assert!(parse(&["metrics-many", "--all"]).is_ok());
    }

    #[test]
    fn log_cursors_accept_milliseconds_or_rfc3339() {
        assert_eq!(
            parse_cursor("1700000000000").unwrap(),
            DateTime::from_timestamp(1_700_000_000, 0).unwrap()
        );
        assert_eq!(
            parse_cursor("2023-11-14T22:13:20Z").unwrap(),
            DateTime::from_timestamp(1_700_000_000, 0).unwrap()
        );
        assert!(parse_cursor("yesterday").is_err());
    }
}
