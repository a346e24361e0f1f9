//! What the end of a push test does, over HTTP: signed pushes to a Steward whose E2B simulator
//! runs the suite locally against a real Git repository on disk. A failing suite becomes an
//! alert that is a case (Keep for debugging / Snapshot for repro / Kill) with the whole output
//! in its thread; a pass posts nothing, kills its sandbox and says "fixed in" under the last
//! failure; a run that could not happen gets the error alert naming the step.
use std::time::Duration;

use reqwest::StatusCode;
use sandbox_steward::cases::{CaseState, DecisionOption};
use sandbox_steward::ids::{RunId, SandboxId};
use sandbox_steward::runs::Run;
use sandbox_steward::sim::slack::Recorded;
use sandbox_steward::slack::payload::case_option_action_id;
use serde_json::Value;

use crate::common::{TestApp, eventually, free_port, visible_text, wait_until};
use crate::github::{
    TOKEN, commit, make_repo, push, push_body, redis_dump, runner, spawn, spawn_with,
};

const ENG: &str = "C0ENG";

async fn start(app: &TestApp, delivery: &str, sha: &str, files: &[&str]) -> RunId {
    start_on(app, "main", delivery, sha, files).await
}

async fn start_on(app: &TestApp, branch: &str, delivery: &str, sha: &str, files: &[&str]) -> RunId {
    let git_ref = format!("refs/heads/{branch}");
    let resp = push(app, delivery, &push_body(&git_ref, sha, files)).await;
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    let started: Value = resp.json().await.unwrap();
    RunId::parse(started["run"].as_str().unwrap()).unwrap()
}

/// Waits until the run has ended and been handed over (its alert, if any, is then posted).
async fn handed_over(app: &TestApp, id: &RunId) -> Run {
    let run = runner(app).wait(id, Duration::from_secs(60)).await.unwrap();
    eventually("the run is handed over", || async {
        runner(app).get(id).await.unwrap().handed_over
    })
    .await;
    let _ = run;
    runner(app).get(id).await.unwrap()
}

/// Top-level posts to the engineering channel (not thread replies, not updates).
fn alerts(app: &TestApp) -> Vec<Recorded> {
    app.slack
        .messages()
        .into_iter()
        .filter(|m| m.method == "chat.postMessage" && m.channel.as_deref() == Some(ENG))
        .filter(|m| m.thread_ts.is_none())
        .collect()
}

/// The text a post shows, its red-bar attachment included.
fn shown(rec: &Recorded) -> String {
    let mut text = visible_text(rec);
    if let Some(attachments) = &rec.attachments {
        text.push('\n');
        text.push_str(&attachments.to_string());
    }
    text
}

fn buttons(rec: &Recorded) -> Vec<(String, Option<String>)> {
    let attachments = rec.attachments.clone().unwrap_or(Value::Null);
    let mut found = Vec::new();
    for bar in attachments.as_array().into_iter().flatten() {
        for block in bar["blocks"].as_array().into_iter().flatten() {
            if block["type"] == "actions" {
                for b in block["elements"].as_array().into_iter().flatten() {
                    found.push((
                        b["text"]["text"].as_str().unwrap().to_owned(),
                        b["style"].as_str().map(str::to_owned),
                    ));
                }
            }
        }
    }
    found
}

async fn sandbox_exists(app: &TestApp, id: &SandboxId) -> bool {
    let e2b = app.state.e2b.clone().unwrap();
    match e2b.get_sandbox(id).await {
        Ok(detail) => detail.state.as_str() != "killed",
        Err(_) => false,
    }
}

#[tokio::test]
async fn a_failing_suite_is_an_alert_case_with_the_failing_lines_and_the_whole_output_in_its_thread()
 {
    let dir = tempfile::tempdir().unwrap();
    let (origin, _) = make_repo(dir.path());
    let failing = commit(&origin, "fail");
    let app = spawn(&origin).await;
    let id = start(&app, "d-fail", &failing, &["fail"]).await;
    let run = handed_over(&app, &id).await;
    assert_eq!(run.exit_code, Some(1), "{run:?}");
    let sandbox = run.sandbox_id.clone().unwrap();

    let alert = wait_until("the alert", || async { alerts(&app).into_iter().next() }).await;
    let text = shown(&alert);
    // Where, who, what ran, and the failing lines; the red bar marks a test failure.
    assert!(
        text.contains(":x: *Tests failed* in `acme/api` on `main`"),
        "{text}"
    );
    assert!(text.contains(&failing[..7]), "{text}");
    assert!(text.contains("Fix the parser"), "{text}");
    assert!(
        text.contains("<@U0ALICE>") && text.contains("<@U0BOB>"),
        "{text}"
    );
    assert!(text.contains("*Exit code* 1"), "{text}");
    assert!(
        text.contains("FAILED tests/test_parser.py::test_parse_nested"),
        "{text}"
    );
    assert!(
        text.contains("AssertionError: assert [1, [2]] == [1, [2, 3]]"),
        "{text}"
    );
    assert!(
        !text.contains("collecting tests/test_3.py"),
        "noise stays out: {text}"
    );
    assert_eq!(alert.attachments.as_ref().unwrap()[0]["color"], "danger");
    // The recommended option leads and is green; Kill is red.
    assert_eq!(
        buttons(&alert),
        [
            ("Keep for debugging".to_owned(), Some("primary".to_owned())),
            ("Snapshot for repro".to_owned(), None),
            ("Kill".to_owned(), Some("danger".to_owned())),
        ]
    );
    assert!(text.contains("left to its E2B timeout"), "{text}");

    // The whole output, noise included, in the alert's thread.
    let ts = alert.ts.clone().unwrap();
    let shared = wait_until("the output file", || async {
        app.slack
            .messages()
            .into_iter()
            .find(|m| m.method == "files.completeUploadExternal")
    })
    .await;
    assert_eq!(shared.thread_ts.as_deref(), Some(ts.as_str()));
    let file_id = shared.body["files"][0]["id"].as_str().unwrap().to_owned();
    let file = app.slack.file(&file_id).unwrap();
    let bytes = String::from_utf8(file.bytes.unwrap()).unwrap();
    assert!(bytes.contains("collecting tests/test_3.py ok"), "{bytes}");
    assert!(bytes.contains("1 failed, 150 passed"), "{bytes}");

    // The sandbox waits for a person.
    assert!(sandbox_exists(&app, &sandbox).await);
    let case_id = run.case_id.clone().expect("the alert is a case");
    let before = app
        .state
        .e2b
        .clone()
        .unwrap()
        .get_sandbox(&sandbox)
        .await
        .unwrap()
        .end_at;
    let click = app
        .click_case(
            &case_id,
            &case_option_action_id(DecisionOption::KeepRunning),
            "U0DEV",
            "keep",
            "1.1",
        )
        .await;
    assert_eq!(click.status(), StatusCode::OK);
    eventually("the case is done", || async {
        matches!(
            app.state.store.get_case(&case_id).await.unwrap().state,
            CaseState::Done { .. }
        )
    })
    .await;
    let after = app
        .state
        .e2b
        .clone()
        .unwrap()
        .get_sandbox(&sandbox)
        .await
        .unwrap()
        .end_at;
    assert!(
        after > before,
        "the timeout was extended: {before} -> {after}"
    );
    let card = wait_until("the alert shows the decision", || async {
        let now = app.slack.message(ENG, &ts)?;
        shown(&now)
            .contains(&format!("`e2b sandbox connect {sandbox}`"))
            .then_some(now)
    })
    .await;
    let text = shown(&card);
    assert!(text.contains("chose *Keep for debugging*"), "{text}");
    assert!(
        text.contains(":x: *Tests failed*"),
        "the alert stays an alert: {text}"
    );
    assert!(buttons(&card).is_empty(), "{card:?}");

    // The token shows up nowhere Steward wrote.
    let posted = format!("{:?}", app.slack.messages());
    assert!(!posted.contains(TOKEN), "{posted}");
    assert!(!bytes.contains(TOKEN));
    assert!(!redis_dump(&app).contains(TOKEN));
}

#[tokio::test]
async fn a_pass_posts_nothing_kills_its_sandbox_and_says_fixed_under_the_last_failure() {
    let dir = tempfile::tempdir().unwrap();
    let (origin, _) = make_repo(dir.path());
    let failing = commit(&origin, "fail");
    let app = spawn(&origin).await;
    let first = start(&app, "d-red", &failing, &["fail"]).await;
    handed_over(&app, &first).await;
    let alert = wait_until("the alert", || async { alerts(&app).into_iter().next() }).await;

    // The fix: the failing marker goes.
    std::fs::remove_file(std::path::Path::new(&origin).join("fail")).unwrap();
    let fixed = {
        let out = std::process::Command::new("git")
            .args(["-c", "user.name=T", "-c", "user.email=t@example.com"])
            .args(["commit", "-q", "-am", "Fix nested lists"])
            .current_dir(&origin)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let out = std::process::Command::new("git")
            .args(["rev-parse", "HEAD"])
            .current_dir(&origin)
            .output()
            .unwrap();
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    };
    let second = start(&app, "d-green", &fixed, &["fail"]).await;
    let run = handed_over(&app, &second).await;
    assert_eq!(run.exit_code, Some(0), "{run:?}");
    let sandbox = run.sandbox_id.clone().unwrap();

    // Killed by the push rule, through a case and the worker, with nothing posted for it.
    eventually("the passing run's sandbox is killed", || async {
        !sandbox_exists(&app, &sandbox).await
    })
    .await;
    let reply = wait_until("fixed in, in the alert's thread", || async {
        app.slack.messages().into_iter().find(|m| {
            m.method == "chat.postMessage"
                && m.thread_ts == alert.ts
                && visible_text(m).contains("Fixed in")
        })
    })
    .await;
    let text = visible_text(&reply);
    assert!(text.contains(&fixed[..7]), "{text}");
    assert_eq!(alerts(&app).len(), 1, "a pass posts no alert of its own");
    let case = app
        .state
        .store
        .get_case(run.case_id.as_ref().unwrap())
        .await
        .unwrap();
    assert!(case.card.is_none(), "the kill case has no card");
    let audit: Vec<String> = app
        .state
        .store
        .audit_since(chrono::Utc::now() - chrono::Duration::hours(1))
        .await
        .unwrap()
        .into_iter()
        .map(|e| format!("{} {}", e.action, e.outcome))
        .collect();
    assert!(
        audit.iter().any(|a| a.starts_with(&format!(
            "run run {second} finished with exit code 0 after "
        ))),
        "the audit records the run with its duration: {audit:#?}"
    );
    assert!(
        audit
            .iter()
            .any(|a| a.starts_with("decide:kill kill by policy (push tests")),
        "{audit:#?}"
    );
}

#[tokio::test]
async fn a_commit_that_cannot_be_cloned_gets_the_error_alert_naming_the_step() {
    let dir = tempfile::tempdir().unwrap();
    let (origin, _) = make_repo(dir.path());
    let app = spawn(&origin).await;
    let id = start(&app, "d-missing", &"e".repeat(40), &["a"]).await;
    let run = handed_over(&app, &id).await;
    let sandbox = run.sandbox_id.clone().unwrap();
    let alert = wait_until("the error alert", || async {
        alerts(&app).into_iter().next()
    })
    .await;
    let text = shown(&alert);
    assert!(
        text.contains(":warning: *Push test could not run*"),
        "{text}"
    );
    assert!(text.contains("*Step* Cloning the commit"), "{text}");
    assert!(
        text.contains("git could not fetch the pushed commit"),
        "{text}"
    );
    assert!(
        !text.contains(":x:") && !text.contains("Tests failed"),
        "{text}"
    );
    assert!(alert.attachments.is_none(), "no red bar: {alert:?}");
    eventually("the clone's sandbox is killed", || async {
        !sandbox_exists(&app, &sandbox).await
    })
    .await;
}

/// A suite that prints far more than a run keeps and fails at the very end.
const LONG_FAILING_SH: &str = r#"echo "tests ran at $(git rev-parse HEAD)"
i=0
while [ $i -lt 4000 ]; do
  echo "collecting tests/test_$i.py ok ......................................................"
  i=$((i+1))
done
echo "FAILED tests/test_end.py::test_the_very_end - AssertionError: the real failure"
exit 1
"#;

#[tokio::test]
async fn a_failure_at_the_end_of_a_long_output_is_read_from_the_real_end_and_the_file_keeps_both_ends()
 {
    let dir = tempfile::tempdir().unwrap();
    let (origin, _) = make_repo(dir.path());
    std::fs::write(
        std::path::Path::new(&origin).join("check.sh"),
        LONG_FAILING_SH,
    )
    .unwrap();
    let added = std::process::Command::new("git")
        .args(["add", "check.sh"])
        .current_dir(&origin)
        .status()
        .unwrap();
    assert!(added.success());
    let sha = commit(&origin, "long");
    // 64 KiB of each end are kept; the suite prints about 330 KiB.
    let app = spawn_with(&origin, "[runs]\noutput_cap_bytes = 65536\n").await;
    let id = start(&app, "d-long", &sha, &["long"]).await;
    let run = handed_over(&app, &id).await;
    assert_eq!(run.exit_code, Some(1), "{run:?}");
    assert!(
        run.output_truncated && run.output_bytes > 300_000,
        "{run:?}"
    );

    let alert = wait_until("the alert", || async { alerts(&app).into_iter().next() }).await;
    let text = shown(&alert);
    assert!(
        text.contains("FAILED tests/test_end.py::test_the_very_end"),
        "the failing line at the real end is on the alert: {text}"
    );
    assert!(
        text.contains("the file in the thread keeps its first 64 KiB and its last 64 KiB"),
        "the alert says what the file holds: {text}"
    );
    assert!(!text.contains("Full output"), "{text}");

    let shared = wait_until("the output file", || async {
        app.slack
            .messages()
            .into_iter()
            .find(|m| m.method == "files.completeUploadExternal")
    })
    .await;
    let file_id = shared.body["files"][0]["id"].as_str().unwrap().to_owned();
    let file = String::from_utf8(app.slack.file(&file_id).unwrap().bytes.unwrap()).unwrap();
    let head = &file[..file.len().min(300)];
    assert!(
        file.starts_with("token: unset") && head.contains(&format!("tests ran at {sha}")),
        "the file starts where the output started: {head}"
    );
    assert!(
        file.contains("left out here by Steward"),
        "the gap is marked"
    );
    assert!(
        file.trim_end().ends_with(
            "FAILED tests/test_end.py::test_the_very_end - AssertionError: the real failure"
        ),
        "the file ends where the output ended"
    );
    let note = shared.text.clone().unwrap_or_default();
    assert!(
        note.contains("more than Steward keeps of a run's output"),
        "{note}"
    );
}

#[tokio::test]
async fn a_missing_template_gets_the_error_alert_for_starting_the_sandbox() {
    let dir = tempfile::tempdir().unwrap();
    let (origin, sha) = make_repo(dir.path());
    let app = spawn(&origin).await;
    // The `legacy` entry's template no longer exists in E2B.
    let id = start_on(&app, "legacy", "d-template", &sha, &["a"]).await;
    let run = handed_over(&app, &id).await;
    assert!(run.sandbox_id.is_none(), "{run:?}");
    let alert = wait_until("the error alert", || async {
        alerts(&app).into_iter().next()
    })
    .await;
    let text = shown(&alert);
    assert!(text.contains("*Step* Starting the sandbox"), "{text}");
    assert!(text.contains("retired-template"), "{text}");
    assert!(!text.contains("Tests failed"), "{text}");
}

#[tokio::test]
async fn a_superseded_run_posts_nothing_and_its_sandbox_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    let (origin, quick) = make_repo(dir.path());
    let slow = commit(&origin, "slow");
    let app = spawn(&origin).await;
    let older = start(&app, "d-slow", &slow, &["slow"]).await;
    eventually("the older suite runs", || async {
        crate::github::output_of(&app, &older)
            .await
            .contains("started-slow")
    })
    .await;
    let newer = start(&app, "d-quick", &quick, &["check.sh"]).await;
    let stopped = handed_over(&app, &older).await;
    let sandbox = stopped.sandbox_id.clone().unwrap();
    eventually("the superseded run's sandbox is killed", || async {
        !sandbox_exists(&app, &sandbox).await
    })
    .await;
    let done = handed_over(&app, &newer).await;
    assert_eq!(done.exit_code, Some(0));
    assert!(alerts(&app).is_empty(), "{:?}", alerts(&app));
}

#[tokio::test]
async fn over_the_cap_pushes_wait_in_order_and_a_newer_push_drops_its_branchs_waiting_one() {
    let dir = tempfile::tempdir().unwrap();
    let (origin, quick) = make_repo(dir.path());
    let slow = commit(&origin, "slow");
    // A second quick commit, beside `slow` (not on top of it, so it does not hang).
    let git = |args: &[&str]| {
        let ok = std::process::Command::new("git")
            .args(args)
            .current_dir(&origin)
            .status()
            .unwrap();
        assert!(ok.success(), "git {args:?}");
    };
    git(&["checkout", "-q", "-b", "release", &quick]);
    let quick_too = commit(&origin, "b");
    git(&["checkout", "-q", "main"]);
    let app = crate::github::spawn_with(&origin, "[github]\nmax_runs_per_repository = 1\n").await;
    let hanging = start(&app, "d-hang", &slow, &["slow"]).await;
    eventually("the hanging suite runs", || async {
        crate::github::output_of(&app, &hanging)
            .await
            .contains("started-slow")
    })
    .await;

    // The repository's one slot is taken: two pushes to release/1 wait, the older is dropped.
    let queued = |delivery: &'static str, sha: String| {
        let app = &app;
        async move {
            let resp = push(
                app,
                delivery,
                &push_body("refs/heads/release/1", &sha, &["a"]),
            )
            .await;
            assert_eq!(resp.status(), StatusCode::ACCEPTED);
            let v: Value = resp.json().await.unwrap();
            assert!(v["run"].is_null(), "{v}");
            v["queued"].as_u64().unwrap()
        }
    };
    assert_eq!(queued("d-rel-1", quick.clone()).await, 1);
    assert_eq!(
        queued("d-rel-2", quick_too.clone()).await,
        1,
        "the older one was dropped"
    );
    let audit = crate::github::audit_outcomes(&app).await;
    assert!(
        audit
            .iter()
            .any(|o| o.starts_with("dropped the queued push of release/1")),
        "{audit:?}"
    );
    assert_eq!(
        crate::github::creates(&app).await,
        1,
        "nothing else started"
    );

    // A newer push to main stops the hanging run; it waits behind release/1's.
    let resp = push(
        &app,
        "d-main-2",
        &push_body("refs/heads/main", &quick, &["a"]),
    )
    .await;
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["queued"], 2, "{v}");

    // As each run ends, the next starts, in the order the pushes came.
    let started = wait_until("both waiting pushes ran", || async {
        let runs: Vec<String> = crate::github::audit_outcomes(&app)
            .await
            .into_iter()
            .filter(|o| o.contains("in the queue") && o.starts_with("started run"))
            .collect();
        (runs.len() == 2).then_some(runs)
    })
    .await;
    assert!(started[0].contains("for release/1"), "{started:?}");
    assert!(started[1].contains("for main"), "{started:?}");
    // "started run" is audited when the run is submitted; its sandbox is created after that.
    let creates = wait_until("the third sandbox is created", || async {
        let n = crate::github::creates(&app).await;
        (n >= 3).then_some(n)
    })
    .await;
    assert_eq!(creates, 3);
    let stopped = runner(&app).get(&hanging).await.unwrap();
    assert_eq!(stopped.error, Some(format!("superseded by {quick}")));
}

/// Kills the child process when the test ends, passing or not.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn the_token_is_in_no_log_line_of_a_steward_process_logging_at_debug() {
    use crate::common::{PrefixCleanup, TestAppOptions, app_env, redis_url, unique_prefix};
    use sandbox_steward::sim::e2b::{ExecMode, SimOptions, SimServer};
    use sandbox_steward::sim::slack::{SlackSim, SlackSimOptions};

    let dir = tempfile::tempdir().unwrap();
    let (origin, _) = make_repo(dir.path());
    let failing = commit(&origin, "fail");
    let slack = SlackSim::start(SlackSimOptions::default()).await.unwrap();
    let e2b = SimServer::start(SimOptions {
        sandboxes: 0,
        api_key: Some(crate::common::E2B_KEY.into()),
        exec: ExecMode::Local,
        ..SimOptions::default()
    })
    .await
    .unwrap();
    let cleanup = PrefixCleanup {
        url: redis_url(),
        prefix: unique_prefix(),
    };
    let opts = TestAppOptions {
        policy: Some(crate::github::policy(&origin)),
        env: vec![
            (
                "GITHUB_WEBHOOK_SECRET".into(),
                crate::github::OLD_SECRET.into(),
            ),
            ("GITHUB_TOKEN".into(), TOKEN.into()),
        ],
        ..TestAppOptions::default()
    };
    let port = free_port();
    let mut env = app_env(
        &slack,
        &e2b,
        &cleanup.url,
        &cleanup.prefix,
        &opts,
        dir.path(),
    );
    env.insert("STEWARD_LISTEN".into(), format!("127.0.0.1:{port}"));
    env.insert("RUST_LOG".into(), "debug".into());
    let log_path = dir.path().join("steward.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let _steward = KillOnDrop(
        std::process::Command::new(env!("CARGO_BIN_EXE_steward"))
            .arg("serve")
            .envs(&env)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let http = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{port}");
    eventually("steward serve answers", || async {
        http.get(format!("{base}/healthz"))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
    })
    .await;

    let body = push_body("refs/heads/main", &failing, &["fail"]).to_string();
    let resp = http
        .post(format!("{base}/github/webhook"))
        .header("content-type", "application/json")
        .header("x-github-event", "push")
        .header("x-github-delivery", "d-logs")
        .header(
            "x-hub-signature-256",
            sandbox_steward::github::signature::sign(crate::github::OLD_SECRET, body.as_bytes()),
        )
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    // The whole flow ran: the alert and its output file are in Slack.
    wait_until("the output file in the alert's thread", || async {
        slack
            .messages()
            .into_iter()
            .find(|m| m.method == "files.completeUploadExternal")
    })
    .await;
    let logs = std::fs::read_to_string(&log_path).unwrap();
    assert!(
        logs.contains("push test started"),
        "debug logs were written: {logs}"
    );
    assert!(!logs.contains(TOKEN), "the token is in the logs:\n{logs}");
    let posted = format!("{:?}", slack.messages());
    assert!(!posted.contains(TOKEN));
}

#[tokio::test]
async fn a_push_left_waiting_by_a_run_nobody_handed_over_starts_anyway() {
    use sandbox_steward::github::queue::{Admission, Running, Waiting};
    let dir = tempfile::tempdir().unwrap();
    let (origin, sha) = make_repo(dir.path());
    let app = crate::github::spawn_with(&origin, "[github]\nmax_runs_per_repository = 1\n").await;
    // The repository's slot is held by a run whose replica died before its hand-over: the run
    // record is gone, and nobody will say it ended.
    let event = serde_json::from_value(push_body("refs/heads/main", &sha, &["a"])).unwrap();
    let state = Admission {
        waiting: vec![Waiting {
            delivery: "d-stranded".into(),
            repository: crate::github::REPO.into(),
            branch: "main".into(),
            queued_at: chrono::Utc::now(),
            event,
        }],
        running: vec![Running {
            run: RunId::parse("run_lost").unwrap(),
            repository: crate::github::REPO.into(),
        }],
    };
    sandbox_steward::github::queue::save(&app.state.store, &state)
        .await
        .unwrap();
    let started = wait_until("the waiting push starts", || async {
        crate::github::audit_outcomes(&app)
            .await
            .into_iter()
            .find(|o| o.starts_with("started run") && o.contains("in the queue"))
    })
    .await;
    assert!(started.contains("for main"), "{started}");
    let left = sandbox_steward::github::queue::load(&app.state.store)
        .await
        .unwrap();
    assert!(left.waiting.is_empty());
    assert_eq!(left.running.len(), 1);
    assert_ne!(left.running[0].run.as_str(), "run_lost");
}
