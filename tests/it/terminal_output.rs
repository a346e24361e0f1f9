//! What a sandbox prints cannot command the operator's terminal: `steward run` and `steward e2b
//! logs` show escape sequences (a clipboard write, a window title, a screen clear) made visible
//! as `cat -v` shows them when stdout is a terminal, copy them byte for byte with `--raw` or to
//! a pipe, and a table cell (sandbox metadata) is never raw. The built binary runs on a real
//! pseudo-terminal (util-linux `script`) and through a pipe, against the simulators.
use std::process::Stdio;

use sandbox_steward::sim::e2b::{ExecMode, SimOptions, SimServer};
use serde_json::json;

use crate::api::{AGENT_TOKEN, api_policy};
use crate::common::{E2B_KEY, TestAppOptions, envd_client, seed_envd_sandbox, spawn_app_with};

/// What a hostile sandbox prints: an OSC 52 clipboard write, a window title, a screen clear and
/// the cursor sent home, between two words, as raw bytes.
const HOSTILE: &[u8] = b"before \x1b]52;c;ZXZpbA==\x07\x1b]0;owned\x07\x1b[2J\x1b[H after";
/// The same as `cat -v` shows it.
const SHOWN: &str = "before ^[]52;c;ZXZpbA==^G^[]0;owned^G^[[2J^[[H after";
const ESC: u8 = 0x1b;

struct Ran {
    code: i32,
    stdout: Vec<u8>,
    stderr: String,
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

fn shell_quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

/// Runs the built `steward ARGS` with `env` added, its stdout a pipe.
async fn through_pipe(args: &[&str], env: &[(&str, &str)]) -> Ran {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_steward"))
        .args(args)
        .envs(env.iter().copied())
        .env("RUST_LOG", "error")
        .stdin(Stdio::null())
        .output()
        .await
        .expect("steward runs");
    Ran {
        code: out.status.code().unwrap_or(-1),
        stdout: out.stdout,
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Runs the built `steward ARGS` with `env` added on a pseudo-terminal (util-linux `script`):
/// stdout and stderr are the terminal, and `stdout` is everything the terminal was sent.
async fn at_terminal(args: &[&str], env: &[(&str, &str)]) -> Ran {
    let command = std::iter::once(env!("CARGO_BIN_EXE_steward"))
        .chain(args.iter().copied())
        .map(shell_quote)
        .collect::<Vec<_>>()
        .join(" ");
    let mut child = tokio::process::Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .envs(env.iter().copied())
        .env("RUST_LOG", "error")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("util-linux `script` is installed");
    // The terminal's input stays open (nothing is typed) until steward is done.
    let stdin = child.stdin.take();
    let out = tokio::time::timeout(std::time::Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("steward finished at the terminal")
        .unwrap();
    drop(stdin);
    Ran {
        code: out.status.code().unwrap_or(-1),
        stdout: out.stdout,
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steward_run_shows_a_sandboxs_escape_sequences_at_a_terminal_and_copies_them_to_a_pipe() {
    let app = spawn_app_with(TestAppOptions {
        policy: Some(api_policy()),
        exec_local: true,
        ..TestAppOptions::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("hostile.sh");
    // printf's octal escapes make the raw bytes inside the sandbox.
    std::fs::write(
        &script,
        r"printf 'before \033]52;c;ZXZpbA==\007\033]0;owned\007\033[2J\033[H after\n'",
    )
    .unwrap();
    let script = script.display().to_string();
    let args = |raw: bool| {
        let mut args = vec!["run", "--template", "base", "--file", script.as_str()];
        if raw {
            args.push("--raw");
        }
        args.extend(["--", "sh hostile.sh"]);
        args
    };
    let env = [
        ("STEWARD_URL", app.address.as_str()),
        ("STEWARD_API_TOKEN", AGENT_TOKEN),
    ];

    // At a terminal: every escape sequence is shown, none reaches the terminal.
    let shown = at_terminal(&args(false), &env).await;
    let text = String::from_utf8_lossy(&shown.stdout);
    assert_eq!(shown.code, 0, "{text}{}", shown.stderr);
    assert!(text.contains(SHOWN), "{text:?}");
    assert!(!shown.stdout.contains(&ESC), "{text:?}");
    assert!(!shown.stdout.contains(&0x07), "{text:?}");
    assert!(text.contains("finished: exit 0"), "{text:?}");

    // `--raw` at a terminal: the person asked for the bytes.
    let raw = at_terminal(&args(true), &env).await;
    assert_eq!(raw.code, 0, "{}", raw.stderr);
    assert!(
        contains(&raw.stdout, HOSTILE),
        "{:?}",
        String::from_utf8_lossy(&raw.stdout)
    );

    // To a pipe: byte for byte, as scripts expect.
    let piped = through_pipe(&args(false), &env).await;
    assert_eq!(piped.code, 0, "{}", piped.stderr);
    assert_eq!(piped.stdout, [HOSTILE, b"\n"].concat(), "{}", piped.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2b_logs_show_escape_sequences_at_a_terminal_and_metadata_cells_are_never_raw() {
    let sim = SimServer::start(SimOptions {
        sandboxes: 0,
        api_key: Some(E2B_KEY.to_owned()),
        exec: ExecMode::Local,
        ..SimOptions::default()
    })
    .await
    .expect("E2B simulator starts");
    let hostile = String::from_utf8(HOSTILE.to_vec()).unwrap();
    let (id, token) = seed_envd_sandbox(
        &sim,
        json!({"metadata": {"owner": format!("mallory\n{hostile}")}}),
    )
    .await;
    // The simulator logs each process's command line; this one carries the sequences as they
    // are, as a sandbox's own log line would.
    envd_client(&sim, &id, token.as_deref())
        .start(&sandbox_steward::envd::ProcessSpec::shell(format!(
            ": '{hostile}'"
        )))
        .await
        .expect("the process starts")
        .collect()
        .await
        .expect("the process ends");
    let base_url = sim.base_url();
    let env = [
        ("E2B_API_URL", base_url.as_str()),
        ("E2B_API_KEY", E2B_KEY),
        ("E2B_PROJECT_ID", sim.team_id()),
    ];
    let logs = ["e2b", "logs", id.as_str()];

    let shown = at_terminal(&logs, &env).await;
    let text = String::from_utf8_lossy(&shown.stdout);
    assert_eq!(shown.code, 0, "{text}");
    assert!(text.contains(SHOWN), "{text:?}");
    assert!(!shown.stdout.contains(&ESC), "{text:?}");

    let raw = at_terminal(&["e2b", "logs", id.as_str(), "--raw"], &env).await;
    assert!(
        contains(&raw.stdout, HOSTILE),
        "{:?}",
        String::from_utf8_lossy(&raw.stdout)
    );
    let piped = through_pipe(&logs, &env).await;
    assert_eq!(piped.code, 0, "{}", piped.stderr);
    assert!(
        contains(&piped.stdout, HOSTILE),
        "{:?}",
        String::from_utf8_lossy(&piped.stdout)
    );
    // JSON escapes them whatever stdout is, and still says the same.
    let json = through_pipe(&["e2b", "logs", id.as_str(), "--json"], &env).await;
    assert!(!json.stdout.contains(&ESC));
    let lines: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert!(
        lines.to_string().contains("\\u001b]52;c;ZXZpbA=="),
        "{lines}"
    );

    // A metadata value is a table cell: one line, shown, even through a pipe.
    for args in [["e2b", "list"].as_slice(), &["e2b", "get", id.as_str()]] {
        let listed = through_pipe(args, &env).await;
        let text = String::from_utf8_lossy(&listed.stdout);
        assert_eq!(listed.code, 0, "{}", listed.stderr);
        assert!(text.contains(&format!("mallory^J{SHOWN}")), "{text}");
        assert!(!listed.stdout.contains(&ESC), "{text:?}");
        let at_tty = at_terminal(args, &env).await;
        assert!(!at_tty.stdout.contains(&ESC));
    }
}
