//! `steward check` tells the truth: one test per finding, each run as the built binary against the
//! simulators and a Redis of its own, reading what a person (or a script, with `--json`) reads.
//!
//! The baseline is a setup where everything is fine (an append-only Redis, a key and team E2B
//! knows, a bot token Slack takes, channels the bot is in, approvers Slack knows, a hygiene
//! channel); each test breaks one thing and looks for its line and its exit status.
use std::process::{Output, Stdio};

use sandbox_steward::sim::e2b::{SimOptions, SimServer};
use sandbox_steward::sim::slack::{SimChannel, SlackSim, SlackSimOptions, UserGroup};
use serde_json::Value;

use crate::common::{DurableRedis, E2B_KEY, ThrowawayRedis, free_port};

const BOT_TOKEN: &str = "xoxb-check-bot-token-41f2";
const ALICE: &str = "U01ALICE";
const SRE: &str = "S0SRE";

/// A policy that lacks nothing: cards, sweeps and runs each have a channel, and a user and a
/// group may kill.
const GOOD_POLICY: &str = r#"
[channels]
approvals = "C0APPROVALS"
hygiene = "C0HYGIENE"
runs = "C0RUNS"

[approvals.approvers]
kill = { users = ["U01ALICE"], groups = ["S0SRE"] }
"#;

/// The simulators and a durable Redis, all fine.
struct World {
    e2b: SimServer,
    slack: SlackSim,
    redis: DurableRedis,
    dir: tempfile::TempDir,
}

fn channel(id: &str, name: &str) -> SimChannel {
    SimChannel {
        id: id.into(),
        name: name.into(),
    }
}

/// Everything fine, except what `tweak` changes in the Slack simulator's options.
async fn world_with(tweak: impl FnOnce(&mut SlackSimOptions)) -> World {
    let e2b = SimServer::start(SimOptions {
        api_key: Some(E2B_KEY.to_owned()),
        ..SimOptions::default()
    })
    .await
    .unwrap();
    let mut options = SlackSimOptions {
        bot_token: Some(BOT_TOKEN.to_owned().into()),
        users: vec![
            (ALICE.into(), Some("alice".into())),
            ("U02BOB".into(), None),
        ],
        groups: vec![UserGroup {
            id: SRE.into(),
            users: vec!["U02BOB".into()],
        }],
        channels: vec![
            channel("C0APPROVALS", "approvals"),
            channel("C0HYGIENE", "hygiene"),
            channel("C0RUNS", "runs"),
        ],
        only_listed_channels: true,
        ..SlackSimOptions::default()
    };
    tweak(&mut options);
    let slack = SlackSim::start(options).await.unwrap();
    World {
        e2b,
        slack,
        redis: DurableRedis::start(),
        dir: tempfile::tempdir().unwrap(),
    }
}

async fn world() -> World {
    world_with(|_| {}).await
}

impl World {
    /// The environment of a fine setup with `policy` as steward.toml.
    fn env(&self, policy: &str) -> Vec<(String, String)> {
        let path = self.dir.path().join("steward.toml");
        std::fs::write(&path, policy).unwrap();
        [
            ("E2B_API_URL", self.e2b.base_url()),
            ("E2B_API_KEY", E2B_KEY.to_owned()),
            ("E2B_PROJECT_ID", self.e2b.team_id().to_owned()),
            ("SLACK_API_URL", self.slack.api_url()),
            ("SLACK_BOT_TOKEN", BOT_TOKEN.to_owned()),
            ("SLACK_SIGNING_SECRET", "check-signing-secret".to_owned()),
            ("STEWARD_LISTEN", "127.0.0.1:3999".to_owned()),
            ("STEWARD_CONFIG", path.display().to_string()),
            ("REDIS_URL", self.redis.url()),
            ("STEWARD_REDIS_PREFIX", crate::common::unique_prefix()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    }
}

/// Replaces (or adds) `name` in `env`.
fn set(env: &mut Vec<(String, String)>, name: &str, value: &str) {
    env.retain(|(k, _)| k != name);
    env.push((name.to_owned(), value.to_owned()));
}

/// Runs `steward check ARGS` with exactly `env` (plus PATH; no RUST_LOG, so the default log
/// level is what a person gets) in an empty directory.
async fn check(env: &[(String, String)], args: &[&str]) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_steward"));
    cmd.arg("check")
        .args(args)
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

fn both(out: &Output) -> String {
    format!("{}{}", stdout(out), String::from_utf8_lossy(&out.stderr))
}

/// The lines under `title` ("OK", "Warnings", "Problems") in the report.
fn group(report: &str, title: &str) -> Vec<String> {
    let mut lines = report
        .lines()
        .skip_while(|l| !l.starts_with(&format!("{title} (")));
    let Some(_header) = lines.next() else {
        return Vec::new();
    };
    lines
        .take_while(|l| l.starts_with("  "))
        .map(|l| l.trim().to_owned())
        .collect()
}

/// The one line of `title` in `area` containing `text`; fails the test naming the report.
fn line_in(report: &str, title: &str, area: &str, text: &str) -> String {
    let found: Vec<String> = group(report, title)
        .into_iter()
        .filter(|l| l.starts_with(&format!("[{area}] ")) && l.contains(text))
        .collect();
    assert_eq!(
        found.len(),
        1,
        "one {title} line in [{area}] with {text:?}:\n{report}"
    );
    found[0].clone()
}

/// The findings of `--json`, after checking every one has exactly the four fields.
fn findings(out: &Output) -> Vec<Value> {
    let parsed: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("--json prints JSON ({e}): {}", both(out)));
    let list = parsed.as_array().expect("an array").clone();
    for f in &list {
        let obj = f.as_object().expect("each finding is an object");
        let mut keys: Vec<&str> = obj.keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(keys, ["area", "fix", "level", "message"], "{f}");
        assert!(
            ["ok", "warning", "problem"].contains(&f["level"].as_str().unwrap()),
            "{f}"
        );
        assert!(
            f["message"].as_str().is_some_and(|m| m.ends_with('.')),
            "{f}"
        );
        assert!(f["fix"].is_null() || f["fix"].is_string(), "{f}");
    }
    list
}

#[tokio::test]
async fn steward_check_with_everything_fine_says_so_and_exits_0_with_nothing_on_stderr() {
    let w = world().await;
    // An E2B hiccup the client retries (and would log at WARN) is no part of the report.
    w.e2b.hooks().fault(Some("list"), 503, 1, 0).await.unwrap();
    let out = check(&w.env(GOOD_POLICY), &[]).await;
    let report = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{}", both(&out));
    assert!(out.stderr.is_empty(), "logs mixed in: {}", both(&out));
    assert!(group(&report, "Warnings").is_empty(), "{report}");
    assert!(group(&report, "Problems").is_empty(), "{report}");
    for (area, text) in [
        ("redis", "Redis answers at REDIS_URL"),
        ("redis", "append-only file"),
        ("e2b", "accepts E2B_API_KEY"),
        ("e2b", "E2B knows team"),
        ("slack", "the bot is @steward in the Simulated workspace"),
        (
            "channels",
            "#approvals (C0APPROVALS, [channels] approvals): the bot is in it",
        ),
        ("channels", "#hygiene (C0HYGIENE, [channels] hygiene)"),
        ("channels", "#runs (C0RUNS, [channels] runs)"),
        (
            "approvers",
            "U01ALICE (@alice, [approvals.approvers] kill) is a member",
        ),
        (
            "approvers",
            "user group S0SRE ([approvals.approvers] kill) has 1 member",
        ),
        ("policy", "scheduled sweeps are on"),
    ] {
        line_in(&report, "OK", area, text);
    }
    let last = report.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("All ") && last.contains("checks passed"),
        "{report}"
    );
    // The secrets and Redis's address never show.
    for secret in [E2B_KEY, BOT_TOKEN, "check-signing-secret", &w.redis.url()] {
        assert!(!both(&out).contains(secret), "{secret} shown: {report}");
    }
}

#[tokio::test]
async fn steward_check_json_is_an_array_of_level_area_message_fix_with_the_same_exit_status() {
    let w = world().await;
    let out = check(&w.env(GOOD_POLICY), &["--json"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", both(&out));
    let list = findings(&out);
    assert!(list.len() >= 10, "{list:?}");
    assert!(
        list.iter()
            .all(|f| f["level"] == "ok" && f["fix"].is_null()),
        "{list:?}"
    );

    // A warning and a problem: the fix is a sentence, and the worst decides the exit status.
    let mut env = w.env("[channels]\napprovals = \"C0APPROVALS\"\nhygiene = \"C0HYGIENE\"\n");
    set(&mut env, "E2B_API_KEY", "e2b_wrong_key");
    let out = check(&env, &["--json"]).await;
    assert_eq!(out.status.code(), Some(2), "{}", both(&out));
    let list = findings(&out);
    let kill = list
        .iter()
        .find(|f| {
            f["level"] == "warning"
                && f["message"]
                    .as_str()
                    .unwrap()
                    .contains("nobody may choose Kill")
        })
        .unwrap_or_else(|| panic!("{list:?}"));
    assert_eq!(kill["area"], "policy");
    assert!(
        kill["fix"]
            .as_str()
            .unwrap()
            .contains("[approvals.approvers]"),
        "{kill}"
    );
    let e2b = list
        .iter()
        .find(|f| f["level"] == "problem" && f["area"] == "e2b")
        .unwrap_or_else(|| panic!("{list:?}"));
    assert!(
        e2b["fix"].as_str().unwrap().contains("E2B_API_KEY"),
        "{e2b}"
    );
    assert!(!stdout(&out).contains("e2b_wrong_key"), "{}", stdout(&out));
}

#[tokio::test]
async fn steward_check_names_a_redis_that_does_not_answer_as_a_problem() {
    let w = world().await;
    let mut env = w.env(GOOD_POLICY);
    set(
        &mut env,
        "REDIS_URL",
        &format!("redis://127.0.0.1:{}", free_port()),
    );
    let out = check(&env, &[]).await;
    let report = stdout(&out);
    assert_eq!(out.status.code(), Some(2), "{}", both(&out));
    let line = line_in(
        &report,
        "Problems",
        "redis",
        "Redis (REDIS_URL) does not answer",
    );
    assert!(
        line.contains("Fix: start Redis, or point REDIS_URL at one"),
        "{line}"
    );
    assert!(!report.contains("Redis answers"), "{report}");
    assert!(!report.contains("checks passed"), "{report}");
}

#[tokio::test]
async fn steward_check_warns_about_a_redis_that_keeps_nothing_on_disk() {
    let w = world().await;
    let volatile = ThrowawayRedis::start();
    let mut env = w.env(GOOD_POLICY);
    set(&mut env, "REDIS_URL", &volatile.url());
    let out = check(&env, &[]).await;
    let report = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{}", both(&out));
    let line = line_in(&report, "Warnings", "redis", "Redis keeps nothing on disk");
    assert!(
        line.contains("Fix: run Redis with `appendonly yes`"),
        "{line}"
    );
    assert_eq!(group(&report, "Warnings").len(), 1, "{report}");
    assert!(
        report.ends_with("1 warning, no problems: `steward serve` runs, but read it above.\n"),
        "{report}"
    );
}

#[tokio::test]
async fn steward_check_names_an_e2b_key_e2b_refuses_and_a_team_it_does_not_know() {
    let w = world().await;
    let mut env = w.env(GOOD_POLICY);
    set(&mut env, "E2B_API_KEY", "e2b_not_the_key_0000");
    let out = check(&env, &[]).await;
    let report = stdout(&out);
    assert_eq!(out.status.code(), Some(2), "{}", both(&out));
    let line = line_in(&report, "Problems", "e2b", "refused E2B_API_KEY (401)");
    assert!(line.contains("Fix: copy a current key"), "{line}");
    assert!(!both(&out).contains("e2b_not_the_key_0000"), "{report}");

    let mut env = w.env(GOOD_POLICY);
    set(&mut env, "E2B_PROJECT_ID", "team-somebody-else");
    let out = check(&env, &[]).await;
    let report = stdout(&out);
    assert_eq!(out.status.code(), Some(2), "{}", both(&out));
    line_in(&report, "OK", "e2b", "accepts E2B_API_KEY");
    let line = line_in(
        &report,
        "Problems",
        "e2b",
        "does not know team `team-somebody-else`",
    );
    assert!(line.contains("Fix: set E2B_PROJECT_ID"), "{line}");
}

#[tokio::test]
async fn steward_check_names_a_slack_token_slack_refuses_without_printing_it() {
    let w = world().await;
    let mut env = w.env(GOOD_POLICY);
    set(&mut env, "SLACK_BOT_TOKEN", "xoxb-not-this-apps-token");
    let out = check(&env, &[]).await;
    let report = stdout(&out);
    assert_eq!(out.status.code(), Some(2), "{}", both(&out));
    let line = line_in(
        &report,
        "Problems",
        "slack",
        "Slack refused SLACK_BOT_TOKEN (invalid_auth)",
    );
    assert!(line.contains("Bot User OAuth Token"), "{line}");
    assert!(!both(&out).contains("xoxb-not-this-apps-token"), "{report}");
    // Nothing is said about channels or approvers a refused token could not look at.
    assert!(
        group(&report, "OK")
            .iter()
            .all(|l| !l.starts_with("[channels]")),
        "{report}"
    );
}

#[tokio::test]
async fn steward_check_names_the_invite_to_type_in_a_channel_the_bot_is_not_in() {
    let w = world_with(|o| {
        o.channels.retain(|c| c.id != "C0RUNS");
        o.channels_without_bot.push(channel("C0RUNS", "runs"));
    })
    .await;
    let out = check(&w.env(GOOD_POLICY), &[]).await;
    let report = stdout(&out);
    assert_eq!(out.status.code(), Some(2), "{}", both(&out));
    let line = line_in(
        &report,
        "Problems",
        "channels",
        "the bot is not in #runs (C0RUNS)",
    );
    assert!(line.contains("named by [channels] runs"), "{line}");
    assert!(
        line.ends_with("Fix: type `/invite @steward` in #runs."),
        "{line}"
    );
    line_in(
        &report,
        "OK",
        "channels",
        "#approvals (C0APPROVALS, [channels] approvals)",
    );

    // A channel id Slack does not know at all.
    let policy = GOOD_POLICY.replace("C0RUNS", "C0NOSUCH");
    let out = check(&w.env(&policy), &[]).await;
    let report = stdout(&out);
    assert_eq!(out.status.code(), Some(2), "{}", both(&out));
    let line = line_in(
        &report,
        "Problems",
        "channels",
        "Slack knows no channel C0NOSUCH ([channels] runs)",
    );
    assert!(line.contains("bottom of About"), "{line}");
}

#[tokio::test]
async fn steward_check_names_an_approver_user_or_group_slack_does_not_know() {
    let w = world().await;
    let policy = r#"
[channels]
approvals = "C0APPROVALS"
hygiene = "C0HYGIENE"

[approvals.approvers]
kill = { users = ["U01ALICE", "U09GHOST"], groups = ["S0SRE", "S0NOSUCH"] }
pause = { users = ["U09GHOST"] }
"#;
    let out = check(&w.env(policy), &[]).await;
    let report = stdout(&out);
    assert_eq!(out.status.code(), Some(2), "{}", both(&out));
    let user = line_in(
        &report,
        "Problems",
        "approvers",
        "Slack knows no user U09GHOST ([approvals.approvers] kill, pause)",
    );
    assert!(user.contains("Copy member ID"), "{user}");
    let group_line = line_in(
        &report,
        "Problems",
        "approvers",
        "Slack knows no user group S0NOSUCH ([approvals.approvers] kill)",
    );
    assert!(group_line.contains("paid Slack plan"), "{group_line}");
    line_in(
        &report,
        "OK",
        "approvers",
        "U01ALICE (@alice, [approvals.approvers] kill)",
    );
    line_in(&report, "OK", "approvers", "user group S0SRE");
    assert_eq!(group(&report, "Problems").len(), 2, "{report}");
}

#[tokio::test]
async fn steward_check_warns_when_nobody_may_kill() {
    let w = world().await;
    let policy = "[channels]\napprovals = \"C0APPROVALS\"\nhygiene = \"C0HYGIENE\"\n";
    let out = check(&w.env(policy), &[]).await;
    let report = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{}", both(&out));
    let line = line_in(&report, "Warnings", "policy", "nobody may choose Kill");
    assert!(
        line.contains("Fix: add `kill = { users = [\"U…\"] }`"),
        "{line}"
    );
    assert_eq!(group(&report, "Warnings").len(), 1, "{report}");
}

#[tokio::test]
async fn steward_check_warns_that_scheduled_sweeps_are_off_without_a_hygiene_channel() {
    let w = world().await;
    let policy = GOOD_POLICY.replace("hygiene = \"C0HYGIENE\"\n", "");
    let out = check(&w.env(&policy), &[]).await;
    let report = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{}", both(&out));
    let line = line_in(&report, "Warnings", "policy", "scheduled sweeps are off");
    assert!(
        line.contains("Fix: set `hygiene = \"C…\"` under [channels]"),
        "{line}"
    );
    assert!(!report.contains("scheduled sweeps are on"), "{report}");
    assert_eq!(group(&report, "Warnings").len(), 1, "{report}");
}

#[tokio::test]
async fn steward_check_calls_push_tests_without_a_webhook_secret_a_problem() {
    let w = world().await;
    let policy = format!(
        "{GOOD_POLICY}\n[[push_tests]]\nrepository = \"acme/api\"\ntemplate = \"base\"\ncommand = \"make test\"\nchannel = \"C0RUNS\"\n"
    );
    let out = check(&w.env(&policy), &[]).await;
    let report = stdout(&out);
    assert_eq!(out.status.code(), Some(2), "{}", both(&out));
    let line = line_in(
        &report,
        "Problems",
        "github",
        "no GitHub webhook secret is set",
    );
    assert!(line.contains("Fix: set GITHUB_WEBHOOK_SECRET"), "{line}");

    // With the secret: fine, and the secret is not printed.
    let mut env = w.env(&policy);
    set(&mut env, "GITHUB_WEBHOOK_SECRET", "gh-webhook-secret-77");
    let out = check(&env, &[]).await;
    let report = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{}", both(&out));
    line_in(&report, "OK", "github", "GitHub webhook secret");
    assert!(!both(&out).contains("gh-webhook-secret-77"), "{report}");
}

/// The keys serde knows under `[table]` (empty for the top level), from the error it gives for
/// one it does not: "unknown field `…`, expected one of `a`, `b`".
fn known_keys(table: &str) -> Vec<String> {
    use sandbox_steward::config::Policy;
    let text = if table.is_empty() {
        "zz_not_a_key = 1\n".to_owned()
    } else {
        format!("[{table}]\nzz_not_a_key = 1\n")
    };
    let error = Policy::parse(&text)
        .expect_err("an unknown key is refused")
        .to_string();
    let expected = error
        .split("expected one of ")
        .nth(1)
        .or_else(|| error.split("expected ").nth(1))
        .unwrap_or_else(|| panic!("[{table}]: {error}"));
    expected
        .lines()
        .next()
        .unwrap_or_default()
        .replace("` or `", "`, `")
        .split(", ")
        .map(|k| k.trim().trim_matches('`').to_owned())
        .filter(|k| !k.is_empty())
        .collect()
}

/// steward.example.toml is what an adopter copies: it must load with the real loader, and name
/// (set, or commented with its value) every section and every key of the sections the loader
/// knows, so nothing they could set is a guess.
#[test]
fn the_example_policy_loads_and_names_every_section_and_key() {
    use sandbox_steward::config::Policy;
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("steward.example.toml");
    let policy = Policy::load(&path, true).expect("steward.example.toml loads");
    let text = std::fs::read_to_string(&path).unwrap();
    // Safe defaults: sweeps are on, someone may kill, and nobody is let in by a guess.
    assert!(policy.sweep().unwrap().1.is_some(), "sweeps are on");
    assert!(
        !policy.approvals.approvers.kill.users.is_empty(),
        "someone may kill"
    );
    assert!(policy.approvals.two_person_rule);
    assert!(policy.push_tests.is_empty(), "push tests are opt-in");
    // Placeholders are marked, so nobody mistakes one for a real id.
    for line in text.lines().filter(|l| l.contains("0CHANGEME")) {
        assert!(
            line.trim_start().starts_with('#') || line.contains("# CHANGEME"),
            "a placeholder that is set says CHANGEME in its comment: {line}"
        );
    }
    let top = known_keys("");
    assert!(top.len() >= 8, "{top:?}");
    for section in &top {
        assert!(
            text.contains(&format!("[{section}")) || text.contains(&format!("[[{section}]]")),
            "steward.example.toml has no [{section}]"
        );
    }
    for table in [
        "channels",
        "approvals",
        "approvals.approvers",
        "hygiene",
        "hygiene.idle",
        "limits",
        "workers",
        "runs",
        "github",
    ] {
        for key in known_keys(table) {
            // `decide_within` is in several tables; any mention will do for it.
            let named = text.lines().any(|l| {
                l.trim_start_matches(['#', ' '])
                    .starts_with(&format!("{key} ="))
            });
            let section = text.contains(&format!("[{table}.{key}"));
            assert!(
                named || section,
                "steward.example.toml does not name [{table}] {key}"
            );
        }
    }
}

#[tokio::test]
async fn steward_check_says_how_e2b_lifecycle_events_reach_this_deployment() {
    let w = world().await;
    let mut env = w.env(GOOD_POLICY);
    let out = check(&env, &[]).await;
    let report = stdout(&out);
    line_in(&report, "OK", "events", "events arrive by polling");

    // A secret but no registration: a warning naming the command that registers one.
    set(&mut env, "E2B_WEBHOOK_SECRET", "whsec-check-test");
    let out = check(&env, &[]).await;
    let report = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{}", both(&out));
    let line = line_in(&report, "Warnings", "events", "no E2B webhook registration");
    assert!(line.contains("steward e2b webhooks register"), "{line}");
    assert!(!both(&out).contains("whsec-check-test"), "{report}");

    // Registered: fine.
    let r = reqwest::Client::new()
        .post(format!("{}/events/webhooks", w.e2b.base_url()))
        .header("X-API-Key", E2B_KEY)
        .json(&serde_json::json!({
            "name": "steward", "url": "https://steward.example.com/e2b/webhook",
            "signatureSecret": "whsec-check-test",
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let out = check(&env, &[]).await;
    let report = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{}", both(&out));
    line_in(
        &report,
        "OK",
        "events",
        "E2B delivers lifecycle events to https://steward.example.com/e2b/webhook",
    );

    // Where this deployment is reached, when it says: a registration elsewhere is a warning.
    set(&mut env, "STEWARD_PUBLIC_URL", "https://other.example.com/");
    let out = check(&env, &[]).await;
    assert_eq!(out.status.code(), Some(1), "{}", both(&out));
    let line = line_in(
        &stdout(&out),
        "Warnings",
        "events",
        "not to this deployment (https://other.example.com/e2b/webhook",
    );
    assert!(line.contains("steward e2b webhooks register"), "{line}");
    set(
        &mut env,
        "STEWARD_PUBLIC_URL",
        "https://steward.example.com",
    );
    let out = check(&env, &[]).await;
    assert_eq!(out.status.code(), Some(0), "{}", both(&out));
    line_in(
        &stdout(&out),
        "OK",
        "events",
        "E2B delivers lifecycle events to this deployment (https://steward.example.com/e2b/webhook)",
    );
    env.retain(|(k, _)| k != "STEWARD_PUBLIC_URL");

    // Registered but the secret missing here: every delivery would be refused.
    env.retain(|(k, _)| k != "E2B_WEBHOOK_SECRET");
    let out = check(&env, &[]).await;
    assert_eq!(out.status.code(), Some(2), "{}", both(&out));
    line_in(
        &stdout(&out),
        "Problems",
        "events",
        "E2B_WEBHOOK_SECRET is not set here",
    );
}
