//! What the person at the terminal reads: `steward check`, config errors, logs, help text and the
//! `steward e2b` summaries, run as the built binary against the simulators.
use std::process::{Output, Stdio};

use clap::CommandFactory;
use sandbox_steward::cli::Cli;
use sandbox_steward::sim::e2b::{SimOptions, SimServer};
use sandbox_steward::sim::slack::{SlackSim, SlackSimOptions};
use serde_json::{Value, json};

const KEY: &str = "e2b_0123456789abcdef";

/// Runs `steward ARGS` with exactly `env` (plus PATH) in an empty directory, no terminal anywhere.
async fn steward(args: &[&str], env: &[(&str, &str)]) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_steward"));
    cmd.args(args)
        .current_dir(dir.path())
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().await.expect("steward runs")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

async fn e2b_sim() -> SimServer {
    SimServer::start(SimOptions {
        api_key: Some(KEY.to_owned()),
        ..SimOptions::default()
    })
    .await
    .expect("E2B simulator starts")
}

/// A port nothing listens on: bound, read, and let go.
fn dead_url() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    format!("http://{}", listener.local_addr().unwrap())
}

fn policy_file(dir: &tempfile::TempDir, text: &str) -> String {
    let path = dir.path().join("steward.toml");
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

/// The lines of one group ("OK", "Warnings", "Problems") of `steward check`'s report, and its
/// last line, so the snapshots hold no port or prefix.
fn check_group(report: &str, title: &str) -> String {
    let mut lines = report
        .lines()
        .skip_while(|l| !l.starts_with(&format!("{title} (")));
    let mut out: Vec<&str> = lines.next().into_iter().collect();
    out.extend(lines.take_while(|l| l.starts_with("  ")));
    out.join("\n")
}

#[tokio::test]
async fn steward_check_warns_about_nobody_to_kill_no_approvals_channel_and_unreachable_services() {
    let e2b = e2b_sim().await;
    let slack = SlackSim::start(SlackSimOptions {
        users: vec![("U01ALICE".into(), Some("alice".into()))],
        ..SlackSimOptions::default()
    })
    .await
    .unwrap();
    let redis = crate::common::DurableRedis::start();
    let dir = tempfile::tempdir().unwrap();
    let base = |e2b_url: String, slack_url: String, policy: String| {
        vec![
            ("E2B_API_URL".to_owned(), e2b_url),
            ("E2B_API_KEY".to_owned(), KEY.to_owned()),
            ("E2B_PROJECT_ID".to_owned(), e2b.team_id().to_owned()),
            ("SLACK_API_URL".to_owned(), slack_url),
            ("SLACK_BOT_TOKEN".to_owned(), "xoxb-check".to_owned()),
            ("SLACK_SIGNING_SECRET".to_owned(), "secret".to_owned()),
            ("STEWARD_LISTEN".to_owned(), "127.0.0.1:3999".to_owned()),
            ("STEWARD_CONFIG".to_owned(), policy),
            ("REDIS_URL".to_owned(), redis.url()),
            ("RUST_LOG".to_owned(), "off".to_owned()),
        ]
    };
    let run = |env: Vec<(String, String)>| async move {
        let pairs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        steward(&["check"], &pairs).await
    };

    // Everything set and reachable, approvers and channels configured: nothing but ok.
    let good = policy_file(
        &dir,
        "[channels]\napprovals = \"C0APPROVALS\"\nhygiene = \"C0HYGIENE\"\n[approvals.approvers]\nkill = { users = [\"U01ALICE\"] }\n",
    );
    let out = run(base(e2b.base_url(), slack.api_url(), good)).await;
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    assert!(
        stdout(&out).ends_with("checks passed: start Steward with `steward serve`.\n"),
        "{}",
        stdout(&out)
    );

    // Reachable, but nobody may kill, cards have no channel of their own and no sweep is
    // scheduled: warnings, exit 1.
    let bare = policy_file(&dir, "");
    let out = run(base(e2b.base_url(), slack.api_url(), bare.clone())).await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let said = stdout(&out);
    insta::assert_snapshot!(check_group(&said, "Warnings"), @r#"
    Warnings (3):
      [policy] [channels] approvals is not set in steward.toml: case cards go to whichever channel the command came from. Fix: set `approvals = "C…"` under [channels] in steward.toml.
      [policy] scheduled sweeps are off: no hygiene channel is set, so idle sandboxes are only found by a `/sandbox sweep` or `steward sweep`. Fix: set `hygiene = "C…"` under [channels] in steward.toml.
      [policy] nobody may choose Kill: [approvals.approvers] kill is empty in steward.toml, so kill cases would be posted that nobody can decide. Fix: add `kill = { users = ["U…"] }` under [approvals.approvers] in steward.toml.
    "#);
    assert!(
        said.ends_with("3 warnings, no problems: `steward serve` runs, but read them above.\n"),
        "{said}"
    );
    assert!(!said.contains("Problems"), "{said}");

    // Neither service answers: each is named with its URL, and check fails.
    let (dead_e2b, dead_slack) = (dead_url(), format!("{}/api", dead_url()));
    let out = run(base(dead_e2b.clone(), dead_slack.clone(), bare)).await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let said = stdout(&out)
        .replace(&dead_e2b, "E2B_URL")
        .replace(&dead_slack, "SLACK_URL");
    insta::assert_snapshot!(check_group(&said, "Problems"), @r"
    Problems (2):
      [e2b] E2B is unreachable: nothing answers at E2B_URL (connection refused). Fix: check E2B_API_URL and that this machine can reach it.
      [slack] Slack is unreachable: nothing answers at SLACK_URL (connection refused). Fix: check SLACK_API_URL and that this machine can reach it.
    ");
    assert!(
        said.ends_with(
            "2 problems and 3 warnings: Steward will not work as configured until they are fixed.\n"
        ),
        "{said}"
    );
}

/// Socket Mode: the app token is tried with `apps.connections.open` (never with the token in
/// what is printed), and no signing secret is asked for, since nothing arrives over HTTP.
#[tokio::test]
async fn steward_check_in_socket_mode_tries_the_app_token_and_needs_no_signing_secret() {
    const APP_TOKEN: &str = "xapp-1-A0CHECK-right-token";
    let e2b = e2b_sim().await;
    let slack = SlackSim::start(SlackSimOptions {
        app_token: Some(APP_TOKEN.to_owned().into()),
        ..SlackSimOptions::default()
    })
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let policy = policy_file(
        &dir,
        "[channels]\napprovals = \"C0APPROVALS\"\n[approvals.approvers]\nkill = { users = [\"U01ALICE\"] }\n",
    );
    let (e2b_url, slack_url) = (e2b.base_url(), slack.api_url());
    let with_token = |token: &'static str| {
        [
            ("E2B_API_URL", e2b_url.as_str()),
            ("E2B_API_KEY", KEY),
            ("E2B_PROJECT_ID", e2b.team_id()),
            ("SLACK_API_URL", slack_url.as_str()),
            ("SLACK_BOT_TOKEN", "xoxb-check"),
            ("SLACK_APP_TOKEN", token),
            ("STEWARD_LISTEN", "127.0.0.1:3999"),
            ("STEWARD_CONFIG", policy.as_str()),
            ("RUST_LOG", "off"),
        ]
    };
    let out = steward(&["check"], &with_token(APP_TOKEN)).await;
    let said = stdout(&out);
    assert!(
        said.contains("  [slack] Slack accepts SLACK_APP_TOKEN: Socket Mode is on for this app.\n"),
        "{said}{}",
        stderr(&out)
    );
    assert!(!said.contains("SLACK_SIGNING_SECRET"), "{said}");

    let wrong = "xapp-1-A0CHECK-wrong-token";
    let out = steward(&["check"], &with_token(wrong)).await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let said = format!("{}{}", stdout(&out), stderr(&out));
    assert!(!said.contains(wrong), "the token was printed: {said}");
    assert!(
        said.contains("  [slack] Slack refused SLACK_APP_TOKEN (invalid_auth): it must be an app-level token (xapp-…) of this app with the connections:write scope, and Socket Mode must be enabled for the app.\n"),
        "{said}"
    );
}

#[tokio::test]
async fn config_errors_are_one_sentence_once_naming_the_file_and_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = policy_file(&dir, "[approvals]\ntwo_person = false\n");
    let out = steward(&["check"], &[("STEWARD_CONFIG", &path)]).await;
    assert_eq!(out.status.code(), Some(2));
    let said = stderr(&out).replace(&path, "FILE");
    insta::assert_snapshot!(said, @"error: FILE: line 2: `two_person` is not a setting of [approvals]; the settings there are `decide_within`, `two_person_rule`, `min_timeout`, `restore_window`, `restored_timeout`, `approvers`.");
    assert!(stdout(&out).is_empty());

    let missing = dir.path().join("nope.toml").display().to_string();
    let out = steward(&["serve"], &[("STEWARD_CONFIG", &missing)]).await;
    assert_eq!(out.status.code(), Some(2));
    let said = stderr(&out).replace(&missing, "FILE");
    insta::assert_snapshot!(said, @"error: could not read the policy file FILE: it does not exist (STEWARD_CONFIG names it).");
}

#[tokio::test]
async fn a_template_override_that_breaks_a_card_is_a_problem_for_check_and_stops_serve() {
    let dir = tempfile::tempdir().unwrap();
    // Valid minijinja, but a section whose text is a number is not Block Kit: only rendering finds it.
    std::fs::write(
        dir.path().join("case_card.json.j2"),
        r#"{"text": "{{ headline }}", "blocks": [{"type": "section", "text": 42}]}"#,
    )
    .unwrap();
    let templates = dir.path().display().to_string();
    let env = [("STEWARD_TEMPLATES", templates.as_str())];

    let out = steward(&["check"], &env).await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let said = stdout(&out).replace(&templates, "DIR");
    let line = said
        .lines()
        .find(|l| l.starts_with("  [templates] STEWARD_TEMPLATES"))
        .unwrap_or_else(|| panic!("no template problem: {said}"));
    insta::assert_snapshot!(line, @r#"  [templates] STEWARD_TEMPLATES (DIR): template case_card.json.j2 produced block 0, which is not valid Block Kit: {"text":42,"type":"section"}; `steward serve` will not start with it. Fix: fix that template, or remove it to use the embedded one."#);

    let out = steward(&["serve"], &env).await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let said = stderr(&out);
    assert!(said.contains("case_card.json.j2"), "{said}");
    assert!(!said.contains("listening"), "{said}");
}

#[tokio::test]
async fn logs_are_plain_uncoloured_text_or_json_lines_and_never_debug_dumps() {
    let dead = dead_url();
    let env = [
        ("E2B_API_URL", dead.as_str()),
        ("E2B_API_KEY", KEY),
        ("RUST_LOG", "info"),
    ];
    // Retries of a refused connection log warnings inside the listing's span.
    let out = steward(&["e2b", "list", "--state", "running"], &env).await;
    let said = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains(" WARN "), "{said}");
    assert!(!said.contains('\u{1b}'), "colour codes in a pipe: {said}");
    assert!(!said.contains("ListQuery"), "a Debug dump: {said}");
    assert!(said.contains("state=\"running\""), "{said}");
    let last = said.lines().last().unwrap();
    assert!(
        last.starts_with("Could not reach E2B") && last.ends_with('.'),
        "{last}"
    );

    // Coloured only on a terminal: NO_COLOR wins even there, so the pipe stays plain too.
    let mut with_no_color = env.to_vec();
    with_no_color.push(("NO_COLOR", "1"));
    let out = steward(&["e2b", "list"], &with_no_color).await;
    assert!(!stderr(&out).contains('\u{1b}'));

    // JSON for log shippers, by flag or by environment: every log line is one JSON object.
    for (args, extra) in [
        (&["--log-format", "json", "e2b", "list"][..], None),
        (&["e2b", "list"][..], Some(("STEWARD_LOG_FORMAT", "json"))),
    ] {
        let mut env = env.to_vec();
        env.extend(extra);
        let out = steward(args, &env).await;
        let said = stderr(&out);
        let logs: Vec<Value> = said
            .lines()
            .filter(|l| l.starts_with('{'))
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect();
        assert!(!logs.is_empty(), "{args:?}: {said}");
        assert!(logs.iter().any(|l| l["level"] == "WARN"), "{said}");
        assert!(!said.contains("ListQuery"), "{said}");
    }
}

/// Walks the whole command tree; `sim slack`'s arguments belong to the simulator's own help.
#[test]
fn every_argument_and_option_has_help_text_and_page_caps_only_on_listings() {
    fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>, capped: &mut Vec<String>) {
        let path = format!("{path} {}", cmd.get_name());
        for arg in cmd.get_arguments() {
            let id = arg.get_id().as_str();
            if matches!(id, "help" | "version") || arg.is_hide_set() {
                continue;
            }
            if arg.get_help().is_none() && arg.get_long_help().is_none() {
                missing.push(format!("{path} {id}"));
            }
            if id == "max_pages" {
                capped.push(path.trim().to_owned());
            }
        }
        for sub in cmd.get_subcommands() {
            walk(sub, &path, missing, capped);
        }
    }
    let (mut missing, mut capped) = (Vec::new(), Vec::new());
    walk(&Cli::command(), "", &mut missing, &mut capped);
    missing.retain(|m| !m.starts_with(" steward sim slack"));
    assert!(missing.is_empty(), "no help text: {missing:#?}");
    assert_eq!(
        capped,
        [
            "steward e2b list",
            "steward e2b metrics-many",
            "steward e2b snapshots",
            "steward e2b templates",
        ]
    );
}

#[tokio::test]
async fn metrics_summarise_snapshots_show_their_source_and_unknown_ids_are_not_found() {
    let e2b = e2b_sim().await;
    let hooks = e2b.hooks();
    let seeded = hooks
        .seed(json!({
            "templateID": "base",
            "state": "running",
            "startedAt": (chrono::Utc::now() - chrono::Duration::hours(2)).to_rfc3339(),
        }))
        .await
        .unwrap();
    let id = seeded["sandboxID"].as_str().unwrap().to_owned();
    let env = [
        ("E2B_API_URL", e2b.base_url()),
        ("E2B_API_KEY", KEY.to_owned()),
        ("E2B_PROJECT_ID", e2b.team_id().to_owned()),
    ];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();

    // A summary line and min/avg/max per resource, not every raw sample.
    let out = steward(&["e2b", "metrics", &id], &env).await;
    let said = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let lines: Vec<&str> = said.lines().collect();
    assert!(
        lines[0].contains(" samples from ") || lines[0].contains(" sample from "),
        "{said}"
    );
    assert!(lines[0].ends_with("--all prints every sample."), "{said}");
    assert!(
        lines[1].split_whitespace().eq(["MIN", "AVG", "MAX"]),
        "{said}"
    );
    assert_eq!(lines.len(), 5, "{said}");
    let all = steward(&["e2b", "metrics", &id, "--all"], &env).await;
    assert!(stdout(&all).starts_with("TIME"), "{}", stdout(&all));

    // `--max-pages` is refused where it means nothing.
    let out = steward(&["e2b", "get", &id, "--max-pages", "3"], &env).await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));

    // An id E2B does not know is "not found", not "no samples yet".
    let out = steward(&["e2b", "metrics-many", &id, "nosuchsandbox"], &env).await;
    let said = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let unknown = said
        .lines()
        .find(|l| l.starts_with("nosuchsandbox"))
        .unwrap();
    assert!(unknown.ends_with("not found"), "{said}");
    assert!(
        !said
            .lines()
            .any(|l| l.starts_with(&id) && l.ends_with("not found")),
        "{said}"
    );

    // A snapshot without a name says so, with the sandbox it was taken of and when.
    let out = steward(&["e2b", "snapshot", &id], &env).await;
    let said = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        said.lines()
            .any(|l| l.starts_with("names") && l.ends_with("(no name)")),
        "{said}"
    );
    assert!(
        said.lines()
            .any(|l| l.starts_with("of sandbox") && l.ends_with(&id)),
        "{said}"
    );
    assert!(said.lines().any(|l| l.starts_with("taken")), "{said}");
    let out = steward(&["e2b", "snapshots", "--sandbox", &id], &env).await;
    let said = stdout(&out);
    assert!(
        said.lines().next().unwrap().contains("OF SANDBOX"),
        "{said}"
    );
    assert!(said.contains("(no name)"), "{said}");
    assert!(said.trim_end().ends_with("1 item in 1 page."), "{said}");
}

#[tokio::test]
async fn a_malformed_id_is_refused_with_a_sentence_that_ends_with_a_period() {
    let out = steward(
        &["e2b", "get", "not an id!"],
        &[("E2B_API_URL", &dead_url()), ("E2B_API_KEY", "e2b_x")],
    )
    .await;
    assert!(!out.status.success());
    let err = stderr(&out);
    let line = err
        .lines()
        .find(|l| l.contains("is not valid"))
        .unwrap_or_default();
    assert!(
        line.ends_with("it has characters other than letters, digits, '-' and '_'."),
        "{err}"
    );
}
