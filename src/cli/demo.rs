//! `steward demo`: starts [`crate::demo`], prints where to look and three things to try, and
//! stops everything on Ctrl-C or SIGTERM. This file parses and prints; the demo is `demo`.
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
    print!("{}", banner(&handle));
    crate::startup::shutdown_signal().await;
    println!("Stopping the demo...");
    handle.stop().await?;
    println!("Stopped; the scratch directory is gone.");
    Ok(ExitCode::SUCCESS)
}

/// What the terminal shows once everything is up.
pub fn banner(h: &DemoHandle) -> String {
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
    line("  Three things to try:".to_owned());
    line(format!(
        "  1. As {} ({}), type `/sandbox list`, then `/sandbox get <id>` for one of them.",
        REQUESTER.name, REQUESTER.label
    ));
    line(format!(
        "  2. In #hygiene, open a case in the digest's thread and, as {} ({}), click Snapshot, then kill.",
        APPROVER.name, APPROVER.label
    ));
    line(format!(
        "  3. As {} ({}), click Kill on another case: Steward refuses and changes nothing.",
        NON_APPROVER.name, NON_APPROVER.label
    ));
    line(String::new());
    line(format!(
        "  Steward: {}   E2B simulator: {}   store: {}",
        h.steward_url, h.e2b_url, h.store
    ));
    line(format!(
        "  Try the agent API too: STEWARD_URL={} STEWARD_API_TOKEN={} steward run --template base -- echo hi",
        h.steward_url,
        h.agent_token()
    ));
    line("  Ctrl-C stops everything.".to_owned());
    out
}
