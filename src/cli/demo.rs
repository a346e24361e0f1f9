//! `steward demo`: starts [`crate::demo`], prints where to look and three things to try, and
//! stops everything on Ctrl-C or SIGTERM. This file parses and prints; the demo is `demo`.
use std::ffi::OsStr;
use std::path::Path;
use std::process::ExitCode;

use secrecy::SecretString;

use crate::demo::{self, APPROVER, DemoHandle, DemoOptions, NON_APPROVER, REQUESTER};

#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Port of the page (the Slack simulator) on 127.0.0.1.
    #[arg(long, default_value_t = demo::DEFAULT_PORT)]
    pub port: u16,
    /// Keep Steward's state in this Redis (under a fresh key prefix) instead of the embedded
    /// in-memory store. Without it (and without REDIS_URL) the demo needs no Redis.
    #[arg(long, env = "REDIS_URL", hide_env_values = true)]
    pub redis: Option<String>,
    /// Slack's traffic reaches Steward over the Slack simulator's Socket Mode WebSocket (with a
    /// made-up app token) instead of over HTTP to a request URL.
    #[arg(long)]
    pub socket_mode: bool,
}

pub async fn run(args: DemoArgs) -> anyhow::Result<ExitCode> {
    println!("Starting the demo: the E2B simulator, the Slack simulator and Steward...");
    let starting = demo::start(DemoOptions {
        port: args.port,
        redis_url: args.redis.map(SecretString::from),
        opening: true,
        scratch_in: None,
        socket_mode: args.socket_mode,
    });
    // Ctrl-C while starting drops what was started: the simulators stop their processes and the
    // scratch directory goes.
    let handle = tokio::select! {
        started = starting => started?,
        () = crate::startup::shutdown_signal() => {
            println!("Stopped before the demo was up.");
            return Ok(ExitCode::from(130));
        }
    };
    print!("{}", banner(&handle, &this_program()));
    crate::startup::shutdown_signal().await;
    println!("Stopping the demo...");
    handle.stop().await?;
    println!("Stopped; the scratch directory is gone.");
    Ok(ExitCode::SUCCESS)
}

/// How to type this very binary in this terminal (see [`program_name`]).
fn this_program() -> String {
    let cwd = std::env::current_dir().unwrap_or_default();
    match std::env::current_exe() {
        Ok(exe) => program_name(&exe, std::env::var_os("PATH").as_deref(), &cwd),
        Err(_) => "steward".to_owned(),
    }
}

/// How a person types the binary at `exe` in a shell whose `PATH` is `path` and whose working
/// directory is `cwd`: `steward` when that name on `PATH` is this binary (after `cargo install`),
/// else its path, relative when it is under `cwd` (`./target/release/steward` after
/// `cargo run --release -- demo` in a fresh clone), quoted when the shell would split it.
pub fn program_name(exe: &Path, path: Option<&OsStr>, cwd: &Path) -> String {
    let same = |a: &Path, b: &Path| match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    let on_path = path
        .map(std::env::split_paths)
        .into_iter()
        .flatten()
        .map(|dir| dir.join("steward"))
        .find(|candidate| candidate.is_file());
    if on_path.is_some_and(|found| same(&found, exe)) {
        return "steward".to_owned();
    }
    let shown = match exe.strip_prefix(cwd) {
        Ok(relative) => Path::new(".").join(relative),
        Err(_) => exe.to_owned(),
    };
    let shown = shown.display().to_string();
    if shown
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "/._-+@%:,".contains(c))
    {
        shown
    } else {
        format!("'{}'", shown.replace('\'', r"'\''"))
    }
}

/// The shell commands the banner prints, each runnable as printed with `program` as the binary.
pub fn commands(h: &DemoHandle, program: &str) -> Vec<String> {
    vec![format!(
        "STEWARD_URL={} STEWARD_API_TOKEN={} {program} run --template base -- echo hi",
        h.steward_url,
        h.agent_token()
    )]
}

/// What the terminal shows once everything is up; `program` is how to type this binary
/// ([`program_name`]).
pub fn banner(h: &DemoHandle, program: &str) -> String {
    let mut out = String::new();
    let mut line = |text: String| {
        out.push_str(&text);
        out.push('\n');
    };
    line(String::new());
    line(format!("  Open {}  (the demo's Slack)", h.slack_url));
    if h.socket_mode {
        line(
            "  Socket Mode: Slack's traffic reaches Steward over the simulator's WebSocket, no request URL."
                .to_owned(),
        );
    }
    line(String::new());
    match &h.opening.sweep {
        Some(s) if s.list.is_some() => line(format!(
            "  A sweep of the {}-sandbox fleet found {} idle: one list decision in #hygiene, \
             {} sandboxes in {} groups by owner.",
            s.fleet, s.idle, s.cases_opened, s.groups
        )),
        Some(s) => line(format!(
            "  A sweep of the {}-sandbox fleet found {} idle and opened {} cases in #hygiene.",
            s.fleet, s.idle, s.cases_opened
        )),
        None => line("  The opening sweep did not post (see below).".to_owned()),
    }
    if let Some(run) = &h.opening.run_id {
        line(format!(
            "  The agent's run {run} is running; its card appears in #runs when it ends."
        ));
    }
    if h.opening.push_status.is_some() {
        line("  A push to demo/checkout started its tests (they fail) for #engineering.".into());
    }
    for problem in &h.opening.problems {
        line(format!("  Note: {problem}."));
    }
    line(String::new());
    line("  Four things to try (pick the person under \"Acting as\"):".to_owned());
    line(format!(
        "  1. As {} ({}), type `/sandbox list`, then `/sandbox get <id>` for one of them.",
        REQUESTER.name, REQUESTER.label
    ));
    line(format!(
        "  2. In #hygiene, as {} ({}), click Approve group on a Pause group and watch its progress \
         (the demo's E2B refuses its first pause once, so click Retry failed); click Exclude… on \
         another, tick a sandbox or paste an id.",
        APPROVER.name, APPROVER.label
    ));
    line(format!(
        "  3. Click Review individually on a Snapshot, then kill group: its cards appear in the \
         digest's thread; as {}, click Snapshot, then kill on one.",
        APPROVER.name
    ));
    line(format!(
        "  4. As {} ({}), click Kill on another case: Steward refuses and changes nothing.",
        NON_APPROVER.name, NON_APPROVER.label
    ));
    line(String::new());
    line(format!(
        "  Steward: {}   E2B simulator: {}   store: {}",
        h.steward_url, h.e2b_url, h.store
    ));
    line("  Try the agent API too, in another terminal here:".to_owned());
    for command in commands(h, program) {
        line(format!("    {command}"));
    }
    line("  Ctrl-C stops everything.".to_owned());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_binary_is_named_as_the_shell_finds_it() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let release = root.join("clone/target/release");
        std::fs::create_dir_all(&release).unwrap();
        let exe = release.join("steward");
        std::fs::write(&exe, "").unwrap();
        let clone = root.join("clone");

        // A fresh clone after `cargo run --release -- demo`: no steward on PATH.
        let empty = std::env::join_paths([root.join("bin")]).unwrap();
        assert_eq!(
            program_name(&exe, Some(&empty), &clone),
            "./target/release/steward"
        );
        assert_eq!(program_name(&exe, None, &clone), "./target/release/steward");
        // Run from elsewhere: the whole path.
        assert_eq!(
            program_name(&exe, Some(&empty), &root.join("elsewhere")),
            exe.display().to_string()
        );
        // Another steward on PATH is not this one: still the path.
        let bin = root.join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::write(bin.join("steward"), "other").unwrap();
        assert_eq!(
            program_name(&exe, Some(&std::env::join_paths([&bin]).unwrap()), &clone),
            "./target/release/steward"
        );
        // After `cargo install`: this binary is the `steward` on PATH.
        let installed = std::env::join_paths([release.clone()]).unwrap();
        assert_eq!(program_name(&exe, Some(&installed), &clone), "steward");
        // A path the shell would split is quoted.
        let spaced = root.join("my clone/steward");
        assert_eq!(program_name(&spaced, None, &root), "'./my clone/steward'");
    }
}
