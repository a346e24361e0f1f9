//! `steward run`: runs a command in a fresh sandbox through a Steward's HTTP API
//! (`STEWARD_URL`, `STEWARD_API_TOKEN`), streams its output to this terminal as it arrives, then
//! prints one line with the outcome and the run case's state.
//!
//! Exit status: the command's own exit code when it ended by itself; 124 when Steward stopped it
//! at its timeout (like `timeout(1)`); 1 when the run failed (sandbox or Steward trouble) or
//! could not be started (missing settings included). Like every API client, it decides nothing: the server checks the
//! token and the limits.
//!
//! The output is the sandbox's, so it is foreign text: on a terminal its control characters are
//! made visible as `cat -v` shows them (an escape sequence could otherwise write the clipboard,
//! retitle the window or clear the screen), unless `--raw`; to a pipe or a file it is copied byte
//! for byte, for the scripts that read it. The lines on stderr are always made visible.
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use base64::Engine;
use clap::Args;
use reqwest::Method;
use serde_json::{Value, json};

use super::visible::{self, Layout};
use crate::mcp::client::ApiClient;

/// Exit status when Steward stopped the command at its timeout.
pub const EXIT_TIMED_OUT: u8 = 124;
/// How long one output read waits for new bytes.
const OUTPUT_WAIT: &str = "20s";
/// How often a queued run is asked where it waits.
const QUEUE_POLL: Duration = Duration::from_secs(1);
/// A run next in line is said to wait once it has waited this long.
const WORKER_PATIENCE: Duration = Duration::from_secs(2);
/// How long to wait for the run case after the run ended (it is opened right after).
const CASE_PATIENCE: Duration = Duration::from_secs(10);

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The E2B template id or alias to start the sandbox from.
    #[arg(long)]
    pub template: String,
    /// A local file to upload first, as `LOCAL` (placed under its file name in the working
    /// directory) or `LOCAL:REMOTE`. Repeat for more files.
    #[arg(long = "file", value_name = "PATH")]
    pub files: Vec<String>,
    /// An environment variable for the command, `K=V`. Repeat for more.
    #[arg(long = "env", value_name = "K=V")]
    pub env: Vec<String>,
    /// The working directory in the sandbox (absolute).
    #[arg(long)]
    pub cwd: Option<String>,
    /// How long the command may run, e.g. `90s` or `10m` (the server's policy caps it).
    #[arg(long)]
    pub timeout: Option<String>,
    /// Copy the output to the terminal byte for byte, escape sequences included. By default a
    /// terminal sees its control characters made visible (`^[` for ESC, as `cat -v` shows them);
    /// output to a pipe or file is always byte for byte.
    #[arg(long)]
    pub raw: bool,
    /// The command line to run, after `--`.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

pub async fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    let client = match ApiClient::from_env() {
        Ok(client) => client,
        Err(problem) => {
            eprintln!("{}", super::sentence(&problem));
            return Ok(ExitCode::from(1));
        }
    };
    let request = match build_request(&args) {
        Ok(request) => request,
        Err(problem) => {
            eprintln!("{}", super::sentence(&format!("{problem:#}")));
            return Ok(ExitCode::from(1));
        }
    };
    let run = match client
        .json(Method::POST, "/runs", &[], Some(&request))
        .await
    {
        Ok(run) => run,
        Err(failure) => {
            eprintln!("{}", super::sentence(&failure.to_string()));
            return Ok(ExitCode::from(1));
        }
    };
    let id = run["id"].as_str().unwrap_or_default().to_owned();
    eprintln!(
        "{}",
        visible::cell(&format!("Run {id} queued (template {}).", args.template))
    );
    wait_for_worker(&client, &id, run).await?;
    let shown = if args.raw || !std::io::stdout().is_terminal() {
        Shown::Raw
    } else {
        Shown::Visible
    };
    stream_output(&client, &id, shown).await?;
    let run = final_run(&client, &id).await?;
    eprintln!("{}", visible::cell(&outcome_line(&client, &run).await));
    Ok(ExitCode::from(exit_status(&run)))
}

/// The run request: the command line quoted for bash, files read and base64-encoded.
fn build_request(args: &RunArgs) -> anyhow::Result<Value> {
    let mut files = Vec::new();
    for spec in &args.files {
        let (local, remote) = match spec.split_once(':') {
            Some((local, remote)) if !local.is_empty() && !remote.is_empty() => {
                (PathBuf::from(local), remote.to_owned())
            }
            _ => {
                let local = PathBuf::from(spec);
                let name = local
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .with_context(|| format!("--file {spec} names no file"))?;
                (local, name)
            }
        };
        let bytes = std::fs::read(&local)
            .with_context(|| format!("could not read --file {}", local.display()))?;
        files.push(json!({
            "path": remote,
            "content": base64::engine::general_purpose::STANDARD.encode(bytes),
        }));
    }
    let mut env = serde_json::Map::new();
    for pair in &args.env {
        let (k, v) = pair
            .split_once('=')
            .with_context(|| format!("--env {pair} must be K=V"))?;
        env.insert(k.to_owned(), json!(v));
    }
    let mut request = json!({
        "template": args.template,
        "command": shell_join(&args.command),
        "files": files,
        "env": env,
    });
    if let Some(cwd) = &args.cwd {
        request["cwd"] = json!(cwd);
    }
    if let Some(timeout) = &args.timeout {
        request["timeout"] = json!(timeout);
    }
    Ok(request)
}

/// `words` as one bash command line: a lone word is taken as written (so `-- 'make && ls'`
/// works), several are each quoted when they need it.
fn shell_join(words: &[String]) -> String {
    if words.len() == 1 {
        return words[0].clone();
    }
    words
        .iter()
        .map(|w| {
            let plain = !w.is_empty()
                && w.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c));
            if plain {
                w.clone()
            } else {
                format!("'{}'", w.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// How the output reaches stdout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shown {
    /// Byte for byte: a pipe, a file, or `--raw`.
    Raw,
    /// Control characters visible, lines and tabs kept: a terminal.
    Visible,
}

/// While the run waits for a worker (every runs worker of every replica is busy), says where
/// it waits, again each time that changes: `Run run_x waits for a worker: 2 runs ahead of it.`
/// Returns once a worker has it.
async fn wait_for_worker(client: &ApiClient, id: &str, mut run: Value) -> anyhow::Result<()> {
    let mut said: Option<u64> = None;
    let started = tokio::time::Instant::now();
    while run["status"].as_str() == Some("queued") {
        let position = run["queue_position"].as_u64();
        // Next in line is said only once it has waited a while: usually a worker takes it at once.
        let worth_saying = match position {
            Some(1) => started.elapsed() >= WORKER_PATIENCE,
            Some(_) => true,
            None => false,
        };
        if worth_saying && position != said {
            eprintln!(
                "{}",
                visible::cell(&waiting_line(id, position.unwrap_or(1)))
            );
            said = position;
        }
        tokio::time::sleep(QUEUE_POLL).await;
        run = client
            .json(Method::GET, &format!("/runs/{id}"), &[], None)
            .await
            .map_err(|f| anyhow::anyhow!(super::sentence(&f.to_string())))?;
    }
    Ok(())
}

/// `Run run_x waits for a worker: 2 runs ahead of it.`
fn waiting_line(id: &str, position: u64) -> String {
    match position.saturating_sub(1) {
        0 => format!("Run {id} waits for a worker: it is next."),
        1 => format!("Run {id} waits for a worker: 1 run ahead of it."),
        ahead => format!("Run {id} waits for a worker: {ahead} runs ahead of it."),
    }
}

/// Copies the run's output to stdout as it arrives, until the run ended and all was read.
async fn stream_output(client: &ApiClient, id: &str, shown: Shown) -> anyhow::Result<()> {
    let mut from = 0u64;
    let mut visible = visible::Stream::new(Layout::Keep);
    loop {
        let chunk = client
            .output(id, from, Some(OUTPUT_WAIT))
            .await
            .map_err(|f| anyhow::anyhow!(super::sentence(&f.to_string())))?;
        let mut stdout = std::io::stdout().lock();
        match shown {
            Shown::Raw => stdout.write_all(&chunk.bytes)?,
            Shown::Visible => stdout.write_all(visible.push(&chunk.bytes).as_bytes())?,
        }
        from = chunk.next;
        if chunk.finished {
            if shown == Shown::Visible {
                stdout.write_all(visible.finish().as_bytes())?;
            }
            stdout.flush()?;
            return Ok(());
        }
        stdout.flush()?;
    }
}

/// The run once it ended, with its case id when one is opened soon after.
async fn final_run(client: &ApiClient, id: &str) -> anyhow::Result<Value> {
    let path = format!("/runs/{id}");
    let deadline = tokio::time::Instant::now() + CASE_PATIENCE;
    loop {
        let run = client
            .json(Method::GET, &path, &[("wait", "10s".to_owned())], None)
            .await
            .map_err(|f| anyhow::anyhow!(super::sentence(&f.to_string())))?;
        let ended = matches!(
            run["status"].as_str(),
            Some("finished" | "timed_out" | "failed")
        );
        let settled = ended && (run["case_id"].is_string() || run["handed_over"] == true);
        if settled || (ended && tokio::time::Instant::now() >= deadline) {
            return Ok(run);
        }
        if ended {
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

/// `Run run_x finished: exit 0 after 1.2 s. Sandbox sbx: run case case_y is pending.`
async fn outcome_line(client: &ApiClient, run: &Value) -> String {
    let id = run["id"].as_str().unwrap_or("?");
    let secs = run["duration_ms"].as_u64().map(|ms| ms as f64 / 1000.0);
    let took = secs.map(|s| format!(" after {s:.1} s")).unwrap_or_default();
    let what = match run["status"].as_str() {
        Some("finished") => format!(
            "finished: exit {}{took}",
            run["exit_code"].as_i64().unwrap_or_default()
        ),
        Some("timed_out") => format!("was stopped at its timeout{took}"),
        _ => format!(
            "failed: {}",
            run["error"].as_str().unwrap_or("no reason was given")
        ),
    };
    let sandbox = run["sandbox_id"].as_str();
    let case = match run["case_id"].as_str() {
        Some(case) => {
            let state = client
                .json(Method::GET, &format!("/cases/{case}"), &[], None)
                .await
                .ok()
                .and_then(|c| c["state"].as_str().map(str::to_owned));
            match state {
                Some(state) => format!(" Run case {case} is {state}."),
                None => format!(" Run case {case} decides its sandbox's fate."),
            }
        }
        None => match sandbox {
            Some(_) => {
                " No run case was opened (Steward's policy decides the sandbox's fate).".to_owned()
            }
            None => String::new(),
        },
    };
    let sandbox = sandbox
        .map(|s| format!(" Sandbox {s}."))
        .unwrap_or_default();
    format!("Run {id} {what}.{sandbox}{case}")
}

/// The command's exit code, 124 for a timeout, 1 for a failed run.
fn exit_status(run: &Value) -> u8 {
    match run["status"].as_str() {
        Some("finished") => run["exit_code"]
            .as_i64()
            .and_then(|c| u8::try_from(c).ok())
            .unwrap_or(1),
        Some("timed_out") => EXIT_TIMED_OUT,
        _ => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_quoted_for_bash_only_when_they_need_it() {
        let words = |w: &[&str]| w.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(shell_join(&words(&["make && ls"])), "make && ls");
        assert_eq!(
            shell_join(&words(&["python", "-c", "print('hi there')"])),
            r"python -c 'print('\''hi there'\'')'"
        );
        assert_eq!(shell_join(&words(&["ls", "-la", "/tmp"])), "ls -la /tmp");
    }

    #[test]
    fn a_waiting_run_says_how_many_runs_are_ahead_of_it() {
        assert_eq!(
            waiting_line("run_a", 1),
            "Run run_a waits for a worker: it is next."
        );
        assert_eq!(
            waiting_line("run_a", 2),
            "Run run_a waits for a worker: 1 run ahead of it."
        );
        assert_eq!(
            waiting_line("run_a", 4),
            "Run run_a waits for a worker: 3 runs ahead of it."
        );
    }

    #[test]
    fn the_exit_status_is_the_commands_or_124_or_1() {
        assert_eq!(
            exit_status(&json!({"status": "finished", "exit_code": 3})),
            3
        );
        assert_eq!(
            exit_status(&json!({"status": "finished", "exit_code": 0})),
            0
        );
        assert_eq!(exit_status(&json!({"status": "timed_out"})), 124);
        assert_eq!(exit_status(&json!({"status": "failed"})), 1);
    }
}
