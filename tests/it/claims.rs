//! Tests for claims of README.md and docs/ that had none: each test names the claim it holds the code to.
use sandbox_steward::store::Lane;
use std::process::Output;

use sandbox_steward::cases::CaseState;
use sandbox_steward::ids::CaseId;
use serde_json::json;

use crate::common::{
    TestApp, TestAppOptions, case_id_in, spawn_app_with, visible_text, wait_until,
};

const APPROVALS: &str = "C0APPROVALS";

/// Cards go to one channel; anyone may pause, U0002 may kill.
fn approvals_app() -> TestAppOptions {
    TestAppOptions {
        sandboxes: 0,
        policy: Some(format!(
            "[channels]\napprovals = \"{APPROVALS}\"\n[approvals.approvers]\nkill = {{ users = [\"U0002\"] }}\npause = {{ anyone = true }}\n"
        )),
        ..TestAppOptions::default()
    }
}

/// `/sandbox kill <sandbox>` from U0001: the case it opened.
async fn open_kill_case(app: &TestApp, sandbox: &str) -> CaseId {
    let hook = format!("h{}", uuid::Uuid::new_v4().simple());
    let resp = app
        .post_command_to(&format!("kill {sandbox} done with it"), &hook)
        .await;
    assert_eq!(resp.status(), 200);
    let text = visible_text(&app.wait_for_hook(&hook).await);
    case_id_in(&text)
}

/// A signed click on `action_id` of the case's card by `user`.
async fn click(app: &TestApp, case: &CaseId, action_id: &str, user: &str) {
    let card = app.state.store.get_case(case).await.unwrap().card.unwrap();
    let payload = json!({
        "type": "block_actions",
        "user": {"id": user},
        "trigger_id": format!("trigger-{}", uuid::Uuid::new_v4().simple()),
        "response_url": app.slack.response_url("clicks"),
        "container": {"type": "message", "channel_id": card.channel.as_str(), "message_ts": card.ts},
        "channel": {"id": card.channel.as_str()},
        "actions": [{"action_id": action_id, "block_id": "b", "value": case.as_str(),
                     "action_ts": uuid::Uuid::new_v4().simple().to_string()}],
    });
    assert_eq!(app.post_interaction(&payload).await.status(), 200);
}

/// The case's card as the fake Slack shows it now.
async fn card_text(app: &TestApp, case: &CaseId) -> String {
    let card = app.state.store.get_case(case).await.unwrap().card.unwrap();
    app.slack
        .message(card.channel.as_str(), &card.ts)
        .map(|m| visible_text(&m))
        .unwrap_or_default()
}

/// Runs `steward <args>` with exactly `env` (plus PATH) in an empty directory.
async fn steward(args: &[&str], env: &[(&str, &str)]) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_steward"));
    cmd.args(args)
        .current_dir(dir.path())
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().await.expect("steward runs")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// docs/configuration.md: "Every setting has a default, so Steward runs with no file at all, and
/// `steward check` tells you what is missing."
#[tokio::test]
async fn steward_check_says_what_is_missing_and_passes_when_nothing_is() {
    let out = steward(&["check"], &[]).await;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let said = text(&out);
    for name in [
        "E2B_API_KEY",
        "E2B_PROJECT_ID",
        "SLACK_BOT_TOKEN",
        "SLACK_SIGNING_SECRET",
    ] {
        let line = said
            .lines()
            .find(|l| l.starts_with(&format!("  [settings] {name}")));
        assert!(line.is_some_and(|l| l.contains("is not set")), "{said}");
    }

    // Complete means reachable too: check calls both simulators, and reads a policy with a
    // channel and someone who may kill (without them it warns; see check.rs).
    let e2b = sandbox_steward::sim::e2b::SimServer::start(sandbox_steward::sim::e2b::SimOptions {
        api_key: Some("e2b_secret_value_1234".into()),
        ..Default::default()
    })
    .await
    .unwrap();
    let slack = sandbox_steward::sim::slack::SlackSim::start(
        sandbox_steward::sim::slack::SlackSimOptions {
            users: vec![("U0002".into(), None)],
            ..Default::default()
        },
    )
    .await
    .unwrap();
    // Complete means durable too: a Redis that keeps its data on disk.
    let redis = crate::common::DurableRedis::start();
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("steward.toml");
    std::fs::write(
        &policy,
        "[channels]\napprovals = \"C0APPROVALS\"\nhygiene = \"C0HYGIENE\"\n[approvals.approvers]\nkill = { users = [\"U0002\"] }\n",
    )
    .unwrap();
    let (e2b_url, slack_url, policy) = (
        e2b.base_url(),
        slack.api_url(),
        policy.display().to_string(),
    );
    let out = steward(
        &["check"],
        &[
            ("E2B_API_URL", &e2b_url),
            ("E2B_API_KEY", "e2b_secret_value_1234"),
            ("E2B_PROJECT_ID", e2b.team_id()),
            ("REDIS_URL", &redis.url()),
            ("SLACK_API_URL", &slack_url),
            ("SLACK_BOT_TOKEN", "xoxb-secret-token"),
            ("SLACK_SIGNING_SECRET", "signing-secret-value"),
            ("STEWARD_LISTEN", "127.0.0.1:3999"),
            ("STEWARD_CONFIG", &policy),
        ],
    )
    .await;
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    assert!(said.contains("checks passed"), "{said}");
    for secret in [
        "e2b_secret_value_1234",
        "xoxb-secret-token",
        "signing-secret-value",
    ] {
        assert!(!said.contains(secret), "{said}");
    }
}

/// docs/configuration.md: a bad setting "stops Steward at start with a sentence"; a duration too long for a
/// date (`decide_within = "100000y"`) is one, never a panic.
#[tokio::test]
async fn steward_check_refuses_a_duration_that_overflows_a_date_with_a_sentence() {
    for (toml, name) in [
        (
            "[approvals]\ndecide_within = \"100000y\"\n",
            "decide_within",
        ),
        ("[hygiene]\ndecide_within = \"100000y\"\n", "decide_within"),
        ("[hygiene.idle]\nidle_window = \"100000y\"\n", "idle_window"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("steward.toml");
        std::fs::write(&path, toml).unwrap();
        let path = path.display().to_string();
        for args in [&["check"][..], &["serve"][..]] {
            let out = steward(
                args,
                &[("STEWARD_CONFIG", &path), ("STEWARD_LISTEN", "127.0.0.1:0")],
            )
            .await;
            let said = text(&out);
            assert!(!out.status.success(), "{args:?} {toml}: {said}");
            assert!(
                said.contains("longer than 100 years"),
                "{args:?} {toml}: {said}"
            );
            assert!(said.contains(name), "{args:?} {toml}: {said}");
            assert!(!said.contains("panicked"), "{args:?} {toml}: {said}");
        }
    }
    // Edge limits are checked the same way.
    let out = steward(&["check"], &[("STEWARD_BODY_TIMEOUT", "0s")]).await;
    let said = text(&out);
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("STEWARD_BODY_TIMEOUT"), "{said}");
}

/// docs/approvals.md: "**Pause** of an already paused sandbox counts as done ("already paused")."
#[tokio::test]
async fn pause_of_an_already_paused_sandbox_counts_as_done() {
    let app = spawn_app_with(approvals_app()).await;
    app.seed_sandbox(json!({"sandboxID": "sleepy1", "templateID": "base", "state": "paused"}))
        .await;
    let case = open_kill_case(&app, "sleepy1").await;
    click(&app, &case, "case_pause", "U0003").await;

    wait_until("the case is done", || async {
        let state = app.state.store.get_case(&case).await.unwrap().state;
        matches!(state, CaseState::Done { .. }).then_some(())
    })
    .await;
    let card = wait_until("the card says it was already paused", || async {
        let text = card_text(&app, &case).await;
        text.contains("already paused").then_some(text)
    })
    .await;
    assert!(card.contains(":white_check_mark:"), "{card}");
    let calls = app.e2b_calls().await;
    assert_eq!(calls.get("pause").copied().unwrap_or(0), 0, "{calls:?}");
    assert_eq!(calls.get("kill").copied().unwrap_or(0), 0, "{calls:?}");
}

/// docs/operations.md: a dead replica's job is taken over once its worker has stopped touching it for
/// `stale_after` (20 s), and not before the case's execution lease it held has run out (60 s,
/// renewed during long steps), and resumes without a second kill.
#[tokio::test]
async fn a_dead_workers_job_is_taken_over_once_stale_but_not_while_it_holds_the_execution_lease() {
    use sandbox_steward::approvals::worker::handle_job;
    use sandbox_steward::jobs::{
        EXECUTION_LEASE, WorkOutcome, WorkerConfig, execution_lease, reclaim_once,
    };
    use sandbox_steward::store::ClaimedJob;
    use std::time::Duration;

    assert_eq!(WorkerConfig::new("w").stale_after, Duration::from_secs(20));
    assert_eq!(EXECUTION_LEASE, Duration::from_secs(60));

    // This replica records decisions but runs no worker: the test plays the dying one.
    let app = spawn_app_with(TestAppOptions {
        worker: false,
        ..approvals_app()
    })
    .await;
    app.seed_sandbox(json!({"sandboxID": "victim9", "templateID": "base", "state": "running"}))
        .await;
    let case = open_kill_case(&app, "victim9").await;
    click(&app, &case, "case_snapshot_then_kill", "U0002").await;

    // The dying worker claims the job and takes the case's execution lease, then dies.
    let store = app.state.store.clone();
    let claimed = wait_until("the decision is queued", || async {
        store
            .claim(Lane::Decisions, "dying-worker", Duration::ZERO)
            .await
            .unwrap()
    })
    .await;
    assert_eq!(claimed.job.case_id(), Some(&case));
    let lease = execution_lease(&case);
    assert!(
        store
            .acquire_lease(&lease, "dying-worker", EXECUTION_LEASE)
            .await
            .unwrap()
    );
    drop(claimed);

    let svc = app.state.services();
    let handler = |claimed: ClaimedJob| {
        let svc = svc.clone();
        async move { handle_job(&svc, claimed).await }
    };
    let mut taker = WorkerConfig::new("taker");
    taker.stale_after = Duration::from_millis(100);
    let take_over = || async {
        let outcomes = reclaim_once(&store, &taker, &handler).await.unwrap();
        (!outcomes.is_empty()).then_some(outcomes)
    };

    // Stale, so another worker takes the job; the lease still holds, so it leaves it.
    let first = wait_until("the job goes stale", take_over).await;
    assert!(
        matches!(&first[..], [WorkOutcome::LeftForRetry { error, .. }] if error.contains("another worker")),
        "{first:?}"
    );
    let calls = app.e2b_calls().await;
    assert_eq!(calls.get("snapshot").copied().unwrap_or(0), 0, "{calls:?}");
    assert_eq!(calls.get("kill").copied().unwrap_or(0), 0, "{calls:?}");

    // The dead worker's lease ends: the next takeover carries the kill out, once.
    assert!(store.release_lease(&lease, "dying-worker").await.unwrap());
    let second = wait_until("the job is taken over again", take_over).await;
    assert!(
        matches!(&second[..], [WorkOutcome::Finished(_)]),
        "{second:?}"
    );
    let state = app.state.store.get_case(&case).await.unwrap().state;
    assert!(matches!(state, CaseState::Done { .. }), "{state:?}");
    let calls = app.e2b_calls().await;
    assert_eq!(calls.get("snapshot").copied().unwrap_or(0), 1, "{calls:?}");
    assert_eq!(calls.get("kill").copied().unwrap_or(0), 1, "{calls:?}");
}

/// docs/operations.md: "Stopping a replica (SIGTERM, as in a rolling deploy) stops it taking new
/// work: … decided work finishes the step in flight and hands the rest back."
#[tokio::test]
async fn a_stopping_replica_drains_finishing_the_step_in_flight_and_handing_back_the_rest() {
    use sandbox_steward::cases::Step;
    // The first replica records decisions and runs no worker.
    let first = spawn_app_with(TestAppOptions {
        worker: false,
        ..approvals_app()
    })
    .await;
    // The second one works, reaching E2B through a front that holds its snapshot call.
    let front = crate::common::HoldingFront::start(&first.e2b.base_url(), |path| {
        path.starts_with("/sandboxes/") && path.ends_with("/snapshots")
    })
    .await;
    let worker = first
        .spawn_peer(TestAppOptions {
            env: vec![("E2B_API_URL".into(), front.url.clone())],
            ..approvals_app()
        })
        .await;
    let port = worker.port;
    first
        .seed_sandbox(json!({"sandboxID": "victim10", "templateID": "base", "state": "running"}))
        .await;
    let case = open_kill_case(&first, "victim10").await;
    click(&first, &case, "case_snapshot_then_kill", "U0002").await;
    wait_until("the worker is taking the snapshot", || async {
        (front.in_flight() == 1).then_some(())
    })
    .await;

    // SIGTERM, mid-step: the replica drains. It still answers HTTP, but says it is not ready,
    // so traffic goes elsewhere.
    let http = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{port}");
    let stopping = tokio::spawn(worker.shutdown());
    let ready = wait_until("the draining replica says it is not ready", || async {
        let resp = http.get(format!("{base}/readyz")).send().await.ok()?;
        (resp.status() == 503).then_some(resp)
    })
    .await;
    let body: serde_json::Value = ready.json().await.unwrap();
    assert_eq!(body["checks"]["replica"], "draining", "{body}");
    let alive = http.get(format!("{base}/healthz")).send().await.unwrap();
    assert_eq!(alive.status(), 200, "it still answers while it drains");
    assert!(
        !stopping.is_finished(),
        "the replica stopped while its worker was mid-step"
    );

    // The step completes and is recorded; the next one is handed back, not started, and the
    // replica stops.
    front.open();
    tokio::time::timeout(std::time::Duration::from_secs(20), stopping)
        .await
        .expect("the replica stops once its step is done")
        .unwrap();
    let store = &first.state.store;
    let steps = store.steps_done(&case).await.unwrap();
    assert_eq!(
        steps.iter().map(|r| r.step).collect::<Vec<_>>(),
        [Step::Snapshot],
        "the step in flight finished, nothing after it: {steps:?}"
    );
    assert_eq!(front.arrived(), 1, "one snapshot");
    let waiting = store
        .queue_stats(sandbox_steward::store::Lane::Decisions)
        .await
        .unwrap();
    assert_eq!(
        waiting.depth, 1,
        "the rest of the case waits for another replica"
    );

    // Another replica takes it and resumes after the snapshot: no second one, one kill.
    let next = first.spawn_peer(approvals_app()).await;
    wait_until("the case is done", || async {
        let case = store.get_case(&case).await.ok()?;
        (case.state.name() == "done").then_some(())
    })
    .await;
    let calls = next.e2b.hooks().calls().await.unwrap();
    assert_eq!(calls.get("snapshot").copied().unwrap_or(0), 1, "{calls:?}");
    assert_eq!(calls.get("kill").copied().unwrap_or(0), 1, "{calls:?}");
}
