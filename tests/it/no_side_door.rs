//! Nothing irreversible without a decision: a timeout short enough to end a sandbox opens a
//! case instead of ending it, a resume with such a timeout is refused, live sweeps are
//! policy, and `steward sweep` at the terminal is a dry run unless `--live`.

use crate::common::{TestAppOptions, redis_url, spawn_app_with, visible_text};
use chrono::Utc;
use sandbox_steward::cases::Subject;
use sandbox_steward::ids::SandboxId;
use serde_json::{Value, json};

const APPROVALS: &str = "C0APPROVALS";
const HYGIENE: &str = "C0HYGIENE";

/// Only U0002 may kill or start a live sweep; every command comes from U0001.
fn policy() -> String {
    format!(
        r#"
[channels]
approvals = "{APPROVALS}"
hygiene = "{HYGIENE}"
[approvals.approvers]
kill = {{ users = ["U0002"] }}
sweep = {{ users = ["U0002"] }}
"#
    )
}

fn options() -> TestAppOptions {
    TestAppOptions {
        sandboxes: 0,
        policy: Some(policy()),
        ..TestAppOptions::default()
    }
}

/// A running sandbox with ten hours to live.
fn running(id: &str) -> Value {
    let now = Utc::now();
    json!({"sandboxID": id, "templateID": "base", "state": "running",
        "startedAt": (now - chrono::Duration::hours(1)).to_rfc3339(),
        "endAt": (now + chrono::Duration::hours(10)).to_rfc3339()})
}

async fn calls(app: &crate::common::TestApp, op: &str) -> u64 {
    app.e2b_calls().await.get(op).copied().unwrap_or(0)
}

async fn audit_outcomes(app: &crate::common::TestApp, id: &str) -> Vec<String> {
    let subject = Subject::Sandbox(SandboxId::parse(id).unwrap());
    app.state
        .store
        .audit_since(Utc::now() - chrono::Duration::hours(1))
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.subject.as_ref() == Some(&subject))
        .map(|e| format!("{} {}", e.action, e.outcome))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_approvers_one_second_timeout_leaves_the_sandbox_alive_and_opens_a_kill_case() {
    let app = spawn_app_with(options()).await;
    app.seed_sandbox(running("short1")).await;

    let reply = app.run_deferred("timeout short1 1s").await;

    let text = visible_text(&reply);
    assert!(text.contains("Opened case"), "{text}");
    assert_eq!(calls(&app, "timeout").await, 0, "E2B heard no timeout");
    assert_eq!(calls(&app, "kill").await, 0);
    let e2b = app.state.e2b.as_ref().unwrap();
    let detail = e2b
        .get_sandbox(&SandboxId::parse("short1").unwrap())
        .await
        .expect("the sandbox is still there");
    assert!(detail.end_at > Utc::now() + chrono::Duration::hours(9));
    // The card says what was asked.
    let subject = Subject::Sandbox(SandboxId::parse("short1").unwrap());
    let case = app
        .state
        .store
        .case_for_subject(&subject)
        .await
        .unwrap()
        .expect("a kill case is open");
    let card = case.card.expect("the card was posted");
    assert_eq!(card.channel.as_str(), APPROVALS);
    let shown = visible_text(&app.slack.message(APPROVALS, &card.ts).unwrap());
    assert!(shown.contains("/sandbox timeout short1 1s"), "{shown}");
    let audit = audit_outcomes(&app, "short1").await;
    assert!(
        audit.iter().any(|a| a.starts_with("timeout refused")),
        "{audit:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_that_extends_the_sandbox_is_set_and_audited() {
    let app = spawn_app_with(options()).await;
    app.seed_sandbox(running("long1")).await;

    // Ten hours left: twenty is an extension, which anyone may ask for. (A shorter one is a
    // kill with a delay: `shortening.rs` covers it.)
    let reply = app.run_deferred("timeout long1 20h").await;

    let text = visible_text(&reply);
    assert!(text.contains("will now end in 20 h"), "{text}");
    assert_eq!(calls(&app, "timeout").await, 1);
    let audit = audit_outcomes(&app, "long1").await;
    assert!(
        audit.iter().any(|a| a.starts_with("timeout set to 20 h")),
        "{audit:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_refresh_stays_free_and_is_audited() {
    let app = spawn_app_with(options()).await;
    app.seed_sandbox(running("fresh1")).await;

    let reply = app.run_deferred("refresh fresh1 30s").await;

    let text = visible_text(&reply);
    assert!(text.contains("Refreshed `fresh1`"), "{text}");
    assert_eq!(calls(&app, "refresh").await, 1);
    let audit = audit_outcomes(&app, "fresh1").await;
    assert!(
        audit.iter().any(|a| a.starts_with("refresh kept alive")),
        "{audit:?}"
    );
    // People read it back in Slack.
    app.post_command_to("history fresh1", "history").await;
    let history = visible_text(&app.wait_for_hook("history").await);
    assert!(
        history.contains("refresh: `kept alive for 30 s`"),
        "{history}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_with_a_timeout_below_the_floor_is_refused_and_changes_nothing() {
    let app = spawn_app_with(options()).await;
    let now = Utc::now();
    app.seed_sandbox(
        json!({"sandboxID": "napper1", "templateID": "base", "state": "paused",
        "startedAt": (now - chrono::Duration::hours(3)).to_rfc3339(),
        "endAt": (now - chrono::Duration::hours(1)).to_rfc3339()}),
    )
    .await;

    let reply = app.run_deferred("resume napper1 timeout=5s").await;

    let text = visible_text(&reply);
    assert!(text.contains("without a decision"), "{text}");
    assert_eq!(calls(&app, "resume").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_sweep_from_someone_not_allowed_is_refused_and_posts_nothing() {
    let app = spawn_app_with(options()).await;
    app.seed_sandbox(running("idle1")).await;

    let resp = app.post_command_to("sweep", "live").await;
    assert_eq!(resp.status(), 200);
    let answer = app.wait_for_hook("live").await;

    let text = visible_text(&answer);
    assert!(text.contains("may not start a live sweep"), "{text}");
    let posted: Vec<_> = app
        .slack
        .messages()
        .into_iter()
        .filter(|m| m.method == "chat.postMessage")
        .collect();
    assert!(posted.is_empty(), "{posted:#?}");
    assert_eq!(calls(&app, "list").await, 0, "the fleet was not even read");
    // The refused attempt is on the record.
    let audit = app
        .state
        .store
        .audit_since(Utc::now() - chrono::Duration::minutes(5))
        .await
        .unwrap();
    assert!(
        audit
            .iter()
            .any(|e| e.action == "sweep:live" && e.outcome.starts_with("refused")),
        "{audit:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steward_sweep_at_the_terminal_is_a_dry_run_unless_live_is_given() {
    let app = spawn_app_with(TestAppOptions {
        worker: false,
        ..options()
    })
    .await;
    let now = Utc::now();
    app.seed_sandbox(
        json!({"sandboxID": "old1", "templateID": "python", "state": "paused",
        "startedAt": (now - chrono::Duration::days(40)).to_rfc3339(),
        "endAt": (now - chrono::Duration::days(40) + chrono::Duration::hours(3)).to_rfc3339(),
        "diskSizeMB": 100, "profile": "idle"}),
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("steward.toml");
    std::fs::write(&config, policy()).unwrap();
    let sweep = |args: &'static [&'static str]| {
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_steward"));
        cmd.args(args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("E2B_API_URL", app.e2b.base_url())
            .env("E2B_API_KEY", crate::common::E2B_KEY)
            .env("E2B_PROJECT_ID", app.e2b.team_id())
            .env("REDIS_URL", redis_url())
            .env("STEWARD_REDIS_PREFIX", &app.redis_prefix)
            .env("SLACK_API_URL", app.slack.api_url())
            .env("SLACK_BOT_TOKEN", crate::common::BOT_TOKEN)
            .env("STEWARD_CONFIG", &config);
        cmd
    };

    let out = sweep(&["sweep", "--json"]).output().await.unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["mode"], "dry_run");
    assert_eq!(report["counts"]["idle"], 1);
    assert!(app.slack.messages().is_empty(), "a dry run posts nothing");

    let out = sweep(&["sweep", "--live", "--json"])
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["mode"], "live");
    crate::common::wait_until("the digest posted", || async {
        app.slack
            .messages()
            .iter()
            .any(|m| m.channel.as_deref() == Some(HYGIENE))
            .then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_change_that_cannot_be_audited_is_not_made() {
    let app = spawn_app_with(TestAppOptions {
        // Nothing listens there: Redis is down for this replica.
        redis_url: Some("redis://127.0.0.1:1".into()),
        ..options()
    })
    .await;
    app.seed_sandbox(running("unrecorded1")).await;

    let reply = app.run_deferred("timeout unrecorded1 30m").await;

    let text = visible_text(&reply);
    assert!(text.contains("can't reach its database"), "{text}");
    let calls = app.e2b_calls().await;
    assert!(calls.values().all(|n| *n == 0), "E2B saw {calls:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_timeout_on_an_unknown_sandbox_opens_no_case_and_says_so() {
    let app = spawn_app_with(options()).await;

    let reply = app.run_deferred("timeout nosuch1 1s").await;

    let text = visible_text(&reply);
    assert!(text.contains("not found"), "{text}");
    let subject = Subject::Sandbox(SandboxId::parse("nosuch1").unwrap());
    assert!(
        app.state
            .store
            .case_for_subject(&subject)
            .await
            .unwrap()
            .is_none(),
        "no case for a sandbox E2B does not know"
    );
    assert_eq!(calls(&app, "timeout").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_e2b_keeps_rate_limiting_is_answered_with_a_sentence() {
    let app = spawn_app_with(options()).await;
    app.seed_sandbox(running("busy429")).await;
    app.e2b
        .hooks()
        .fault(Some("timeout"), 429, 100, 0)
        .await
        .unwrap();

    let reply = app.run_deferred("timeout busy429 20h").await;

    let text = visible_text(&reply);
    assert!(text.to_lowercase().contains("rate"), "{text}");
    assert!(!text.contains('{'), "a sentence, not JSON: {text}");
    let e2b = app.state.e2b.as_ref().unwrap();
    let detail = e2b
        .get_sandbox(&SandboxId::parse("busy429").unwrap())
        .await
        .unwrap();
    assert!(
        detail.end_at > Utc::now() + chrono::Duration::hours(9),
        "the timeout did not change"
    );
}
