//! Run cases over HTTP: `approvals::run_case::open_run_case` (what a finished run hands its
//! sandbox to) posts the run card in the fake Slack, signed clicks decide it, and the worker
//! carries the decision out against the E2B simulator; `[runs] on_finish` decides by policy.
//! Real Redis, a fresh key prefix per test.

use std::time::Duration;

use crate::common::{TestApp, TestAppOptions, eventually, hook, spawn_app_with, visible_text};
use sandbox_steward::approvals::run_case::{RunCaseSettings, open_run_case};
use sandbox_steward::approvals::worker::expire_once;
use sandbox_steward::cases::{
    Case, CaseState, Decider, DecisionOption, RunOutcome, RunProfile, RunReport,
};
use sandbox_steward::e2b::SandboxState;
use sandbox_steward::ids::{CaseId, RunId, SandboxId, SlackChannelId};
use sandbox_steward::runs::OnFinish;
use sandbox_steward::store::Actor;
use serde_json::{Value, json};

const APPROVALS: &str = "C0APPROVALS";
const RUNS: &str = "C0RUNS";

/// U0002 may kill; anyone may pause (and so Snapshot and keep, and Keep running).
fn options() -> TestAppOptions {
    TestAppOptions {
        sandboxes: 0,
        policy: Some(format!(
            r#"
[channels]
approvals = "{APPROVALS}"
[approvals]
two_person_rule = true
[approvals.approvers]
kill = {{ users = ["U0002"] }}
pause = {{ anyone = true }}
leave = {{ anyone = true }}
"#
        )),
        ..TestAppOptions::default()
    }
}

fn settings() -> RunCaseSettings {
    RunCaseSettings {
        channel: Some(SlackChannelId::parse(RUNS).unwrap()),
        keep_running_for: Duration::from_secs(3600),
        decide_within: Duration::from_secs(4 * 3600),
    }
}

fn sandbox(id: &str) -> SandboxId {
    SandboxId::parse(id).unwrap()
}

/// A run's sandbox, as the run left it: running, with five minutes of E2B timeout left.
async fn seed_run_sandbox(app: &TestApp, id: &str) {
    let now = chrono::Utc::now();
    app.seed_sandbox(json!({
        "sandboxID": id,
        "templateID": "base",
        "state": "running",
        "startedAt": (now - chrono::Duration::minutes(3)).to_rfc3339(),
        "endAt": (now + chrono::Duration::minutes(5)).to_rfc3339(),
        "metadata": {"steward.purpose": "run", "steward.requester": "ci-bot"},
    }))
    .await;
}

fn report(outcome: RunOutcome, exit_code: Option<i32>, tail: &[&str]) -> RunReport {
    RunReport {
        run_id: RunId::parse(format!("run_{}", hook())).unwrap(),
        requester: "ci-bot".into(),
        command: "python check.py".into(),
        template: "base".into(),
        exit_code,
        duration_ms: 42_000,
        outcome,
        output_tail: tail.iter().map(|l| (*l).to_owned()).collect(),
        output_bytes: 2048,
        output_truncated: false,
        profile: Some(RunProfile {
            samples: 8,
            cpu_p95_pct: 60.0,
            cpu_max_pct: 93.0,
            peak_memory_bytes: 256 * 1024 * 1024,
            disk_growth_bytes: 4 * 1024 * 1024,
        }),
    }
}

async fn open(app: &TestApp, id: &str, report: RunReport, on_finish: OnFinish) -> Case {
    open_run_case(
        &app.state.services(),
        &sandbox(id),
        report,
        on_finish,
        &settings(),
        chrono::Utc::now(),
    )
    .await
    .unwrap()
}

fn card_message(app: &TestApp, case: &Case) -> sandbox_steward::sim::slack::Recorded {
    let card = case.card.as_ref().expect("the case has a card");
    app.slack
        .message(card.channel.as_str(), &card.ts)
        .expect("the card exists in Slack")
}

async fn card_text(app: &TestApp, id: &CaseId) -> String {
    let case = app.state.store.get_case(id).await.unwrap();
    visible_text(&card_message(app, &case))
}

/// `(action_id, style)` of the card's buttons, in order.
fn buttons(app: &TestApp, case: &Case) -> Vec<(String, Option<String>)> {
    let blocks = card_message(app, case).blocks.unwrap_or(Value::Null);
    blocks
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["type"] == "actions")
        .flat_map(|b| b["elements"].as_array().unwrap().clone())
        .map(|b| {
            (
                b["action_id"].as_str().unwrap().to_owned(),
                b["style"].as_str().map(str::to_owned),
            )
        })
        .collect()
}

async fn click(app: &TestApp, case: &CaseId, action_id: &str, user: &str) {
    let resp = app
        .click_case(case, action_id, user, &hook(), &hook())
        .await;
    assert_eq!(resp.status(), 200);
}

async fn wait_done(app: &TestApp, case: &CaseId) -> Case {
    eventually("the case is done", || async {
        matches!(
            app.state.store.get_case(case).await.unwrap().state,
            CaseState::Done { .. }
        )
    })
    .await;
    app.state.store.get_case(case).await.unwrap()
}

async fn calls(app: &TestApp, op: &str) -> u64 {
    app.e2b_calls().await.get(op).copied().unwrap_or(0)
}

async fn state_in_e2b(app: &TestApp, id: &str) -> Option<SandboxState> {
    let e2b = app.state.e2b.as_ref().unwrap();
    e2b.get_sandbox(&sandbox(id)).await.ok().map(|d| d.state)
}

#[tokio::test]
async fn a_failed_run_card_recommends_snapshot_and_keep_first_and_that_click_snapshots_then_pauses()
{
    let app = spawn_app_with(options()).await;
    seed_run_sandbox(&app, "runbox1").await;
    let case = open(
        &app,
        "runbox1",
        report(
            RunOutcome::ExitedNonZero,
            Some(1),
            &["collecting…", "AssertionError: expected 3, got 4"],
        ),
        OnFinish::Ask,
    )
    .await;
    assert_eq!(case.card.as_ref().unwrap().channel.as_str(), RUNS);
    let text = visible_text(&card_message(&app, &case));
    assert!(
        text.contains("Agent *ci-bot* ran `python check.py` on template `base`."),
        "{text}"
    );
    assert!(text.contains("Exited with code 1 after 42 s."), "{text}");
    assert!(
        text.contains("AssertionError: expected 3, got 4```"),
        "{text}"
    );
    assert!(text.contains("p95 60 % · max 93 %"), "{text}");
    assert_eq!(
        buttons(&app, &case),
        [
            ("case_snapshot_and_keep".into(), Some("primary".into())),
            ("case_snapshot_then_kill".into(), None),
            ("case_kill".into(), Some("danger".into())),
            ("case_keep_running".into(), None),
        ]
    );
    assert_eq!(
        calls(&app, "snapshot").await + calls(&app, "pause").await,
        0
    );

    click(&app, &case.id, "case_snapshot_and_keep", "U0007").await;
    let done = wait_done(&app, &case.id).await;
    assert_eq!(calls(&app, "snapshot").await, 1);
    assert_eq!(calls(&app, "kill").await, 0);
    assert_eq!(
        state_in_e2b(&app, "runbox1").await,
        Some(SandboxState::Paused)
    );
    assert!(done.evidence.run.is_some(), "the run stays on the case");
    eventually("the card says it was paused after its snapshot", || async {
        let text = card_text(&app, &case.id).await;
        text.contains("Sandbox runbox1 paused, snapshot kept") && text.contains("Paused.")
    })
    .await;
}

#[tokio::test]
async fn keep_running_extends_the_sandboxs_e2b_timeout_to_the_configured_time() {
    let app = spawn_app_with(options()).await;
    seed_run_sandbox(&app, "runbox2").await;
    let case = open(
        &app,
        "runbox2",
        report(RunOutcome::Succeeded, Some(0), &["all good"]),
        OnFinish::Ask,
    )
    .await;
    let text = visible_text(&card_message(&app, &case));
    assert!(text.contains("Keep running for 1 h"), "{text}");
    let before = app
        .state
        .e2b
        .as_ref()
        .unwrap()
        .get_sandbox(&sandbox("runbox2"))
        .await
        .unwrap()
        .end_at;

    click(&app, &case.id, "case_keep_running", "U0007").await;
    wait_done(&app, &case.id).await;
    let after = app
        .state
        .e2b
        .as_ref()
        .unwrap()
        .get_sandbox(&sandbox("runbox2"))
        .await
        .unwrap();
    assert_eq!(after.state, SandboxState::Running);
    assert!(
        after.end_at > before + chrono::Duration::minutes(50),
        "{before} -> {}",
        after.end_at
    );
    assert_eq!(calls(&app, "timeout").await, 1);
    assert_eq!(calls(&app, "kill").await + calls(&app, "pause").await, 0);
    eventually("the card says until when it runs", || async {
        card_text(&app, &case.id)
            .await
            .contains("E2B timeout extended: it runs until")
    })
    .await;
}

#[tokio::test]
async fn a_run_that_failed_before_finishing_recommends_kill_and_an_approvers_kill_ends_the_sandbox()
{
    let app = spawn_app_with(options()).await;
    seed_run_sandbox(&app, "runbox3").await;
    let case = open(
        &app,
        "runbox3",
        report(
            RunOutcome::Failed,
            None,
            &["envd: the sandbox is gone or paused"],
        ),
        OnFinish::Ask,
    )
    .await;
    // Recommended, so first; still red, so a kill never looks like the safe choice.
    assert_eq!(
        buttons(&app, &case)[0],
        ("case_kill".into(), Some("danger".into()))
    );
    // Not an approver: nothing changes.
    click(&app, &case.id, "case_kill", "U0007").await;
    click(&app, &case.id, "case_kill", "U0002").await;
    let view = app.opened_modal(0).await;
    app.submit_reason(&view, "U0002", "nothing to keep", None)
        .await;
    let done = wait_done(&app, &case.id).await;
    assert_eq!(done.state.decision().unwrap().by.as_str(), "U0002");
    assert_eq!(state_in_e2b(&app, "runbox3").await, None);
    assert_eq!(calls(&app, "kill").await, 1);
    assert_eq!(calls(&app, "snapshot").await, 0);
}

#[tokio::test]
async fn kill_on_success_kills_a_succeeded_runs_sandbox_through_the_worker_and_names_the_policy() {
    let app = spawn_app_with(options()).await;
    seed_run_sandbox(&app, "runbox4").await;
    let case = open(
        &app,
        "runbox4",
        report(RunOutcome::Succeeded, Some(0), &["done"]),
        OnFinish::KillOnSuccess,
    )
    .await;
    let done = wait_done(&app, &case.id).await;
    assert_eq!(
        done.state.decision().unwrap().by,
        Decider::Policy {
            policy: "[runs] on_finish = kill_on_success".into()
        }
    );
    assert_eq!(state_in_e2b(&app, "runbox4").await, None);
    // The worker re-checked the sandbox before the kill, as for a person's decision.
    assert!(calls(&app, "get").await >= 2, "{:?}", app.e2b_calls().await);
    assert_eq!(calls(&app, "kill").await, 1);
    eventually("the card names the policy", || async {
        card_text(&app, &case.id)
            .await
            .contains("Killed by policy ([runs] on_finish = kill_on_success).")
    })
    .await;
    assert!(buttons(&app, &app.state.store.get_case(&case.id).await.unwrap()).is_empty());
    let audit = app.state.store.audit_for_case(&case.id).await.unwrap();
    let decided = audit
        .iter()
        .find(|e| e.action == "decide:kill")
        .expect("the policy decision is audited");
    assert_eq!(
        decided.actor,
        Actor::Steward {
            part: "runs policy".into()
        }
    );
    assert!(
        decided
            .outcome
            .contains("[runs] on_finish = kill_on_success"),
        "{}",
        decided.outcome
    );

    // A run that did not succeed is asked about, kill_on_success or not.
    seed_run_sandbox(&app, "runbox5").await;
    let asked = open(
        &app,
        "runbox5",
        report(RunOutcome::ExitedNonZero, Some(2), &["boom"]),
        OnFinish::KillOnSuccess,
    )
    .await;
    assert_eq!(asked.state, CaseState::Pending);
    assert_eq!(buttons(&app, &asked).len(), 4);
}

#[tokio::test]
async fn under_on_finish_keep_the_card_informs_and_the_case_is_left_to_the_e2b_timeout() {
    let app = spawn_app_with(options()).await;
    seed_run_sandbox(&app, "runbox6").await;
    let case = open(
        &app,
        "runbox6",
        report(RunOutcome::Succeeded, Some(0), &["ok"]),
        OnFinish::Keep,
    )
    .await;
    match &case.state {
        CaseState::Left { option, by, .. } => {
            assert_eq!(*option, DecisionOption::Leave);
            assert_eq!(by.as_str(), "[runs] on_finish = keep");
        }
        other => panic!("not left: {other:?}"),
    }
    let text = visible_text(&card_message(&app, &case));
    assert!(
        text.contains("Left to its E2B timeout by policy ([runs] on_finish = keep)."),
        "{text}"
    );
    assert!(text.contains("Agent *ci-bot* ran"), "{text}");
    assert!(buttons(&app, &case).is_empty());
    assert_eq!(
        state_in_e2b(&app, "runbox6").await,
        Some(SandboxState::Running)
    );
    assert_eq!(calls(&app, "kill").await + calls(&app, "pause").await, 0);
}

#[tokio::test]
async fn an_unanswered_run_case_expires_and_its_card_says_the_sandbox_is_left_to_its_e2b_timeout() {
    let app = spawn_app_with(options()).await;
    seed_run_sandbox(&app, "runbox7").await;
    let case = open(
        &app,
        "runbox7",
        report(RunOutcome::TimedOut, None, &["still going"]),
        OnFinish::Ask,
    )
    .await;
    let text = visible_text(&card_message(&app, &case));
    assert!(
        text.contains("unanswered, the sandbox is left to its E2B timeout"),
        "{text}"
    );
    // Handing the same run over again (a replica that took it over) finds the same case.
    let again = open(
        &app,
        "runbox7",
        case.evidence.run.clone().unwrap(),
        OnFinish::Ask,
    )
    .await;
    assert_eq!(again.id, case.id);
    let cards = app
        .slack
        .messages()
        .into_iter()
        .filter(|m| m.method == "chat.postMessage")
        .count();
    assert_eq!(cards, 1);

    let later = case.decide_by + chrono::Duration::seconds(1);
    let expired = expire_once(&app.state.services(), later).await.unwrap();
    assert!(expired.iter().any(|c| c.id == case.id));
    eventually(
        "the card says the sandbox is left to its E2B timeout",
        || async {
            let text = card_text(&app, &case.id).await;
            text.contains(": the sandbox is left to its E2B timeout.")
                && text.contains("no decision, left to its E2B timeout")
        },
    )
    .await;
    assert_eq!(
        state_in_e2b(&app, "runbox7").await,
        Some(SandboxState::Running)
    );
}

#[tokio::test]
async fn a_policy_kill_whose_card_slack_refused_still_runs_and_the_next_hand_over_posts_the_card() {
    let app = spawn_app_with(options()).await;
    seed_run_sandbox(&app, "runbox8").await;
    app.slack.add_fault(sandbox_steward::sim::slack::Fault {
        method: "chat.postMessage".into(),
        status: 200,
        retry_after_secs: None,
        count: 1,
        error: Some("not_in_channel".into()),
    });
    let run = report(RunOutcome::Succeeded, Some(0), &["done"]);
    let err = open_run_case(
        &app.state.services(),
        &sandbox("runbox8"),
        run.clone(),
        OnFinish::KillOnSuccess,
        &settings(),
        chrono::Utc::now(),
    )
    .await
    .unwrap_err();
    assert!(err.to_string().contains("could not be posted"), "{err}");
    let subject = sandbox_steward::cases::Subject::Sandbox(sandbox("runbox8"));
    // The case was recorded before the card failed, so it runs to its end without one.
    eventually("the policy's kill finishes without its card", || async {
        app.state
            .store
            .case_for_subject(&subject)
            .await
            .unwrap()
            .is_none()
    })
    .await;
    assert_eq!(state_in_e2b(&app, "runbox8").await, None);

    // The hand-over is tried again: the run's own (now finished) case gets its card, no second
    // case is opened and nothing more happens to the sandbox.
    let case = open_run_case(
        &app.state.services(),
        &sandbox("runbox8"),
        run,
        OnFinish::KillOnSuccess,
        &settings(),
        chrono::Utc::now(),
    )
    .await
    .unwrap();
    assert!(
        matches!(case.state, CaseState::Done { .. }),
        "{:?}",
        case.state
    );
    let text = visible_text(&card_message(&app, &case));
    assert!(
        text.contains("Killed by policy ([runs] on_finish = kill_on_success)."),
        "{text}"
    );
    assert_eq!(calls(&app, "kill").await, 1);
    let opened = app
        .state
        .store
        .audit_for_subject(&subject)
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.action == "open")
        .count();
    assert_eq!(opened, 1);
}

#[tokio::test]
async fn keep_running_never_shortens_a_sandbox_that_already_runs_longer() {
    let app = spawn_app_with(options()).await;
    let now = chrono::Utc::now();
    app.seed_sandbox(json!({
        "sandboxID": "runbox9",
        "templateID": "base",
        "state": "running",
        "startedAt": (now - chrono::Duration::minutes(3)).to_rfc3339(),
        "endAt": (now + chrono::Duration::hours(3)).to_rfc3339(),
    }))
    .await;
    let case = open(
        &app,
        "runbox9",
        report(RunOutcome::Succeeded, Some(0), &["ok"]),
        OnFinish::Ask,
    )
    .await;
    click(&app, &case.id, "case_keep_running", "U0007").await;
    wait_done(&app, &case.id).await;
    assert_eq!(calls(&app, "timeout").await, 0);
    let end = app
        .state
        .e2b
        .as_ref()
        .unwrap()
        .get_sandbox(&sandbox("runbox9"))
        .await
        .unwrap()
        .end_at;
    assert!(end > now + chrono::Duration::minutes(170), "{end}");
    eventually("the card says it was left as it was", || async {
        card_text(&app, &case.id)
            .await
            .contains("later than asked, so it was left as it was")
    })
    .await;
}

#[tokio::test]
async fn keep_running_is_not_offered_for_a_paused_sandbox_and_fails_with_a_sentence_if_it_paused_later()
 {
    let app = spawn_app_with(options()).await;
    app.seed_sandbox(json!({"sandboxID": "runbox11", "templateID": "base", "state": "paused"}))
        .await;
    let paused = open(
        &app,
        "runbox11",
        report(
            RunOutcome::Failed,
            None,
            &["envd: the sandbox is gone or paused"],
        ),
        OnFinish::Ask,
    )
    .await;
    assert!(!paused.options.contains(&DecisionOption::KeepRunning));
    assert!(
        !buttons(&app, &paused)
            .iter()
            .any(|(id, _)| id == "case_keep_running")
    );

    // Paused after its card was posted: the click fails with a sentence.
    seed_run_sandbox(&app, "runbox10").await;
    let case = open(
        &app,
        "runbox10",
        report(RunOutcome::Failed, None, &["killed"]),
        OnFinish::Ask,
    )
    .await;
    app.e2b
        .hooks()
        .change("runbox10", json!({"state": "paused"}))
        .await
        .unwrap();
    click(&app, &case.id, "case_keep_running", "U0007").await;
    eventually("the case fails", || async {
        matches!(
            app.state.store.get_case(&case.id).await.unwrap().state,
            CaseState::Failed { .. }
        )
    })
    .await;
    eventually("the card says why", || async {
        card_text(&app, &case.id)
            .await
            .contains("is paused, so it has no timeout to extend")
    })
    .await;
    assert_eq!(
        calls(&app, "timeout").await + calls(&app, "resume").await,
        0
    );
    assert_eq!(
        state_in_e2b(&app, "runbox10").await,
        Some(SandboxState::Paused)
    );
}
