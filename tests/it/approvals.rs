//! Approval cases over HTTP: slash commands open cases, signed clicks and modal submissions
//! decide them, workers in one or two running replicas carry them out against the E2B
//! simulator, and the fake Slack shows what people would see. Real Redis, a fresh key prefix
//! per test.

use sandbox_steward::store::Lane;
use std::time::Duration;

use crate::common::{
    TestApp, TestAppOptions, case_id_in, eventually, free_port, hook, spawn_app_with, visible_text,
    wait_until,
};
use sandbox_steward::approvals::worker::{RECONCILE_GRACE, expire_once, reconcile_once};
use sandbox_steward::cases::{CaseState, Event, Step, StepOutcome, Subject};
use sandbox_steward::ids::{CaseId, SandboxId, TemplateId};
use sandbox_steward::jobs::StepLog;
use sandbox_steward::sim::slack::Recorded;
use sandbox_steward::store::{Store, Updated};
use serde_json::{Value, json};

const APPROVALS: &str = "C0APPROVALS";

/// U0001 asks (every command comes from U0001); U0002 and members of S0KILLERS may kill.
fn policy(extra: &str) -> String {
    format!(
        r#"
[channels]
approvals = "{APPROVALS}"
[approvals]
two_person_rule = true
{extra}
[approvals.approvers]
kill = {{ users = ["U0002"], groups = ["S0KILLERS"] }}
delete_template = {{ users = ["U0002"] }}
pause = {{ anyone = true }}
leave = {{ anyone = true }}
keep = {{ anyone = true }}
"#
    )
}

fn options(extra: &str) -> TestAppOptions {
    TestAppOptions {
        sandboxes: 0,
        policy: Some(policy(extra)),
        ..TestAppOptions::default()
    }
}

async fn seed(app: &TestApp, id: &str, template: &str) {
    app.seed_sandbox(json!({"sandboxID": id, "templateID": template, "state": "running"}))
        .await;
}

/// Runs `/sandbox <text>` and returns the ack and the deferred answer.
async fn command(app: &TestApp, text: &str) -> (Value, Recorded) {
    let name = hook();
    let ack: Value = app.post_command_to(text, &name).await.json().await.unwrap();
    (ack, app.wait_for_hook(&name).await)
}

/// `/sandbox kill <sandbox>`: the case it opened.
async fn open_kill_case(app: &TestApp, sandbox: &str) -> CaseId {
    let (ack, reply) = command(app, &format!("kill {sandbox} finished with it")).await;
    assert!(
        crate::common::visible_json_text(&ack).contains("Opening a case"),
        "{ack}"
    );
    let text = visible_text(&reply);
    assert!(text.contains("Opened case"), "{text}");
    case_id_in(&text)
}

/// The card's current text in the fake Slack.
async fn card_text(app: &TestApp, case: &CaseId) -> String {
    let stored = app.state.store.get_case(case).await.unwrap();
    let card = stored.card.expect("the case has a card");
    let message = app
        .slack
        .message(card.channel.as_str(), &card.ts)
        .expect("the card exists in Slack");
    visible_text(&message)
}

async fn card_blocks(app: &TestApp, case: &CaseId) -> Value {
    let card = app.state.store.get_case(case).await.unwrap().card.unwrap();
    let message = app.slack.message(card.channel.as_str(), &card.ts).unwrap();
    message.blocks.unwrap_or(Value::Null)
}

async fn state_of(app: &TestApp, case: &CaseId) -> CaseState {
    app.state.store.get_case(case).await.unwrap().state
}

/// A signed click on a case card's button; replies go to `hooks/<reply_hook>`.
async fn click(
    app: &TestApp,
    case: &CaseId,
    action_id: &str,
    user: &str,
    reply_hook: &str,
) -> reqwest::Response {
    click_with_ts(app, case, action_id, user, reply_hook, &hook()).await
}

async fn click_with_ts(
    app: &TestApp,
    case: &CaseId,
    action_id: &str,
    user: &str,
    reply_hook: &str,
    action_ts: &str,
) -> reqwest::Response {
    let resp = app
        .click_case(case, action_id, user, reply_hook, action_ts)
        .await;
    assert_eq!(resp.status(), 200);
    resp
}

async fn sandbox_exists(app: &TestApp, id: &str) -> bool {
    let e2b = app.state.e2b.as_ref().unwrap();
    e2b.get_sandbox(&SandboxId::parse(id).unwrap())
        .await
        .is_ok()
}

async fn calls(app: &TestApp, op: &str) -> u64 {
    app.e2b_calls().await.get(op).copied().unwrap_or(0)
}

async fn audit_actions(app: &TestApp, case: &CaseId) -> Vec<String> {
    app.state
        .store
        .audit_for_case(case)
        .await
        .unwrap()
        .into_iter()
        .map(|e| format!("{} {}", e.action, e.outcome))
        .collect()
}

async fn wait_done(app: &TestApp, case: &CaseId) {
    eventually("the case finishes", || async {
        matches!(state_of(app, case).await, CaseState::Done { .. })
    })
    .await;
    eventually("the card says done", || async {
        card_text(app, case).await.contains(":white_check_mark:")
    })
    .await;
}

#[tokio::test]
async fn a_kill_command_opens_a_card_and_an_approved_kill_kills_the_sandbox() {
    let app = spawn_app_with(options("")).await;
    seed(&app, "victim1", "base").await;
    let case = open_kill_case(&app, "victim1").await;

    let blocks = card_blocks(&app, &case).await;
    let text = card_text(&app, &case).await;
    assert!(
        text.contains("victim1") && text.contains("finished with it"),
        "{text}"
    );
    let buttons: Vec<Value> = blocks
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["type"] == "actions")
        .flat_map(|b| b["elements"].as_array().unwrap().clone())
        .collect();
    let labels: Vec<&str> = buttons
        .iter()
        .map(|b| b["text"]["text"].as_str().unwrap())
        .collect();
    assert_eq!(labels, ["Snapshot, then kill", "Kill", "Pause", "Leave it"]);
    assert_eq!(buttons[0]["style"], "primary");
    assert_eq!(buttons[1]["style"], "danger");
    assert!(buttons[1]["confirm"].to_string().contains("victim1"));
    assert!(
        sandbox_exists(&app, "victim1").await,
        "nothing is killed by asking"
    );

    let before = app.modals_opened().len();
    click(&app, &case, "case_kill", "U0002", &hook()).await;
    let view = app.opened_modal(before).await;
    assert!(view.to_string().contains("Reason"), "{view}");
    assert_eq!(
        state_of(&app, &case).await,
        CaseState::Pending,
        "the modal decides, not the click"
    );
    let answer = app
        .submit_reason(&view, "U0002", "it is broken beyond repair", None)
        .await;
    assert_eq!(answer, Value::Null, "the modal closes");

    wait_done(&app, &case).await;
    assert!(!sandbox_exists(&app, "victim1").await);
    assert_eq!(calls(&app, "kill").await, 1);
    assert_eq!(calls(&app, "snapshot").await, 0);
    let text = card_text(&app, &case).await;
    assert!(
        text.contains("<@U0002> chose *Kill* (`it is broken beyond repair`)"),
        "{text}"
    );
    assert!(
        !card_blocks(&app, &case)
            .await
            .to_string()
            .contains("\"actions\"")
    );
}

#[tokio::test]
async fn snapshot_then_kill_verifies_the_snapshot_before_it_kills() {
    let app = spawn_app_with(options("")).await;
    seed(&app, "victim2", "base").await;
    let case = open_kill_case(&app, "victim2").await;
    click(&app, &case, "case_snapshot_then_kill", "U0002", &hook()).await;
    wait_done(&app, &case).await;

    let actions = audit_actions(&app, &case).await;
    let position = |prefix: &str| {
        actions
            .iter()
            .position(|a| a.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix} in {actions:?}"))
    };
    assert!(position("e2b:create_snapshot") < position("e2b:list_snapshots"));
    assert!(position("e2b:list_snapshots") < position("e2b:kill_sandbox"));
    assert_eq!(calls(&app, "snapshot").await, 1);
    assert_eq!(calls(&app, "kill").await, 1);
    assert!(!sandbox_exists(&app, "victim2").await);

    let CaseState::Done { steps, .. } = state_of(&app, &case).await else {
        panic!("not done")
    };
    let StepOutcome::SnapshotCreated { snapshot_id, .. } = &steps[0].outcome else {
        panic!("{steps:?}")
    };
    let snapshots = app
        .state
        .e2b
        .as_ref()
        .unwrap()
        .list_snapshots(None)
        .await
        .unwrap();
    assert!(
        snapshots
            .items
            .iter()
            .any(|s| &s.snapshot_id == snapshot_id)
    );
    let text = card_text(&app, &case).await;
    assert!(
        text.contains(&format!("steward e2b create {snapshot_id}")),
        "{text}"
    );
}

#[tokio::test]
async fn a_non_approvers_click_changes_nothing_and_is_audited() {
    let app = spawn_app_with(options("")).await;
    seed(&app, "victim3", "base").await;
    let case = open_kill_case(&app, "victim3").await;
    let reply = hook();
    click(&app, &case, "case_snapshot_then_kill", "U0003", &reply).await;
    let answer = app.wait_for_hook(&reply).await;
    // One sentence, said once (no "not an approver for …: You are not one of the approvers …").
    assert_eq!(
        answer.text.as_deref(),
        Some("You are not an approver for “Snapshot, then kill”, so nothing was changed.")
    );
    assert_eq!(
        app.slack.hook_posts(&reply)[0].response_type.as_deref(),
        Some("ephemeral")
    );
    assert_eq!(state_of(&app, &case).await, CaseState::Pending);
    assert!(sandbox_exists(&app, "victim3").await);
    assert_eq!(calls(&app, "snapshot").await + calls(&app, "kill").await, 0);
    let actions = audit_actions(&app, &case).await;
    assert!(
        actions
            .iter()
            .any(|a| a.starts_with("decide:snapshot_then_kill refused")),
        "{actions:?}"
    );
    assert!(
        card_text(&app, &case)
            .await
            .contains("Waiting for a decision")
    );
}

#[tokio::test]
async fn the_two_person_rule_stops_the_requester_but_not_a_group_member() {
    let app = spawn_app_with(TestAppOptions {
        sandboxes: 0,
        policy: Some(policy("").replace(
            r#"users = ["U0002"], groups"#,
            r#"users = ["U0001", "U0002"], groups"#,
        )),
        ..TestAppOptions::default()
    })
    .await;
    app.slack.add_usergroup("S0KILLERS", &["U0042"]);
    seed(&app, "victim4", "base").await;
    let case = open_kill_case(&app, "victim4").await;

    let reply = hook();
    click(&app, &case, "case_snapshot_then_kill", "U0001", &reply).await;
    let answer = visible_text(&app.wait_for_hook(&reply).await);
    // An approver blocked by the two-person rule is told that, not that they are no approver.
    assert!(
        answer.contains("You are an approver, but you asked for this case"),
        "{answer}"
    );
    assert!(!answer.contains("not an approver"), "{answer}");
    assert_eq!(state_of(&app, &case).await, CaseState::Pending);

    click(&app, &case, "case_snapshot_then_kill", "U0042", &hook()).await;
    wait_done(&app, &case).await;
    assert!(card_text(&app, &case).await.contains("<@U0042> chose"));
}

#[tokio::test]
async fn a_group_slack_cannot_list_counts_as_one_the_person_is_not_in() {
    let app = spawn_app_with(options("")).await;
    app.slack.add_usergroup("S0KILLERS", &["U0042"]);
    app.slack.add_fault(sandbox_steward::sim::slack::Fault {
        method: "usergroups.users.list".into(),
        status: 200,
        retry_after_secs: None,
        count: 1,
        error: Some("missing_scope".into()),
    });
    seed(&app, "victim12", "base").await;
    let case = open_kill_case(&app, "victim12").await;

    let reply = hook();
    click(&app, &case, "case_snapshot_then_kill", "U0042", &reply).await;
    let answer = visible_text(&app.wait_for_hook(&reply).await);
    assert!(answer.contains("not an approver"), "{answer}");
    assert_eq!(state_of(&app, &case).await, CaseState::Pending);
    assert_eq!(calls(&app, "snapshot").await + calls(&app, "kill").await, 0);

    // Once Slack lists the group again (a failure is not remembered), the member may decide.
    click(&app, &case, "case_snapshot_then_kill", "U0042", &hook()).await;
    wait_done(&app, &case).await;
}

#[tokio::test]
async fn fifty_concurrent_clicks_over_two_replicas_kill_exactly_once() {
    let extra = "";
    let text = policy(extra).replace(
        r#"kill = { users = ["U0002"], groups = ["S0KILLERS"] }"#,
        "kill = { anyone = true }",
    );
    let first = spawn_app_with(TestAppOptions {
        sandboxes: 0,
        policy: Some(text.clone()),
        ..TestAppOptions::default()
    })
    .await;
    let second = first
        .spawn_peer(TestAppOptions {
            sandboxes: 0,
            policy: Some(text),
            ..TestAppOptions::default()
        })
        .await;
    seed(&first, "victim5", "base").await;
    let case = open_kill_case(&first, "victim5").await;

    let hooks: Vec<String> = (0..50).map(|_| hook()).collect();
    let clicks = hooks.iter().enumerate().map(|(i, reply)| {
        let app = if i % 2 == 0 { &first } else { &second };
        let user = format!("U1{i:03}");
        let case = case.clone();
        async move { click(app, &case, "case_snapshot_then_kill", &user, reply).await }
    });
    futures::future::join_all(clicks).await;

    wait_done(&first, &case).await;
    eventually("49 people hear it was already decided", || async {
        hooks
            .iter()
            .filter(|h| {
                first
                    .slack
                    .hook_posts(h)
                    .iter()
                    .any(|r| visible_text(r).contains("Already decided by"))
            })
            .count()
            == 49
    })
    .await;
    assert_eq!(calls(&first, "kill").await, 1);
    assert_eq!(calls(&first, "snapshot").await, 1);
    let decided: Vec<String> = audit_actions(&first, &case)
        .await
        .into_iter()
        .filter(|a| a == "decide:snapshot_then_kill ok")
        .collect();
    assert_eq!(decided.len(), 1);
}

#[tokio::test]
async fn a_job_abandoned_after_its_snapshot_is_finished_by_another_replica_without_a_second_snapshot()
 {
    // The first replica records decisions but runs no worker: the test plays its dying worker.
    let first = spawn_app_with(TestAppOptions {
        worker: false,
        ..options("")
    })
    .await;
    seed(&first, "victim6", "base").await;
    let case = open_kill_case(&first, "victim6").await;
    click(&first, &case, "case_snapshot_then_kill", "U0002", &hook()).await;

    let store = Store::redis(&first.redis_url, &first.redis_prefix)
        .await
        .unwrap();
    let claimed = wait_until("the decision is queued", || async {
        store
            .claim(Lane::Decisions, "dying-worker", Duration::ZERO)
            .await
            .unwrap()
    })
    .await;
    assert_eq!(claimed.job.case_id(), Some(&case));
    // It takes the snapshot and records that step, then dies without acknowledging the job.
    let snapshot = first
        .state
        .e2b
        .as_ref()
        .unwrap()
        .create_snapshot(&SandboxId::parse("victim6").unwrap(), None)
        .await
        .unwrap();
    let now = chrono::Utc::now();
    assert!(matches!(
        store
            .apply_event(&case, Event::StartExecuting, now)
            .await
            .unwrap(),
        Updated::Applied(_)
    ));
    let outcome = StepOutcome::SnapshotCreated {
        snapshot_id: snapshot.snapshot_id.clone(),
        life_left_secs: None,
    };
    StepLog::new(store.clone(), case.clone())
        .record(Step::Snapshot, outcome.clone(), now)
        .await
        .unwrap();
    store
        .apply_event(
            &case,
            Event::StepDone {
                step: Step::Snapshot,
                outcome,
            },
            now,
        )
        .await
        .unwrap();
    drop(claimed);

    let _second = first
        .spawn_peer(TestAppOptions {
            stale_after: Duration::from_millis(300),
            ..options("")
        })
        .await;
    wait_done(&first, &case).await;
    assert_eq!(calls(&first, "snapshot").await, 1, "no second snapshot");
    assert_eq!(calls(&first, "kill").await, 1);
    let text = card_text(&first, &case).await;
    assert!(text.contains(snapshot.snapshot_id.as_str()), "{text}");
}

#[tokio::test]
async fn a_case_nobody_decides_expires_once_and_says_no_action_was_taken() {
    let first = spawn_app_with(options(r#"decide_within = "1s""#)).await;
    let second = first.spawn_peer(options(r#"decide_within = "1s""#)).await;
    seed(&first, "victim7", "base").await;
    let case = open_kill_case(&first, "victim7").await;
    eventually("the card says it expired", || async {
        card_text(&first, &case)
            .await
            .contains("no action was taken")
    })
    .await;
    assert!(matches!(
        state_of(&first, &case).await,
        CaseState::Expired { .. }
    ));
    // More expiry passes, on both replicas, find nothing left to expire.
    for app in [&first, &second] {
        for _ in 0..2 {
            let again = expire_once(&app.state.services(), chrono::Utc::now())
                .await
                .unwrap();
            assert!(again.is_empty(), "{again:?}");
        }
    }
    crate::slack_signature::settled(&first).await;
    crate::slack_signature::settled(&second).await;
    let card = first
        .state
        .store
        .get_case(&case)
        .await
        .unwrap()
        .card
        .unwrap();
    let expiry_updates = first
        .slack
        .messages()
        .into_iter()
        .filter(|m| m.method == "chat.update" && m.ts.as_deref() == Some(card.ts.as_str()))
        .filter(|m| visible_text(m).contains("no action was taken"))
        .count();
    assert_eq!(expiry_updates, 1);
    let reply = hook();
    click(&second, &case, "case_snapshot_then_kill", "U0002", &reply).await;
    assert!(visible_text(&second.wait_for_hook(&reply).await).contains("expired"));
    assert!(sandbox_exists(&first, "victim7").await);
    assert_eq!(
        calls(&first, "kill").await + calls(&first, "snapshot").await,
        0
    );
}

/// A Leave keeps the sandbox out of sweeps until its date, so the date is capped by
/// `[hygiene] max_exclude_for` (here a week): a later one is refused next to the date picker
/// and the case stays open; no date at all lasts the cap, not for ever.
#[tokio::test]
async fn a_leave_dated_past_the_cap_is_refused_and_one_without_a_date_lasts_the_cap() {
    let app = spawn_app_with(options("[hygiene]\nmax_exclude_for = \"7d\"")).await;
    seed(&app, "keeper2", "base").await;
    let case = open_kill_case(&app, "keeper2").await;
    let before = app.modals_opened().len();
    click(&app, &case, "case_leave", "U0005", &hook()).await;
    let view = app.opened_modal(before).await;

    let refused = app
        .submit_reason(&view, "U0005", "keep it", Some("9999-12-31"))
        .await;
    assert_eq!(refused["response_action"], "errors", "{refused}");
    let latest = (chrono::Utc::now() + chrono::Duration::days(7))
        .format("%Y-%m-%d")
        .to_string();
    assert!(
        refused["errors"]["until"]
            .as_str()
            .unwrap_or_default()
            .contains(&format!("The latest date allowed is {latest}")),
        "{refused}"
    );
    assert_eq!(state_of(&app, &case).await, CaseState::Pending);

    let answer = app.submit_reason(&view, "U0005", "keep it", None).await;
    assert_eq!(answer, Value::Null);
    let CaseState::Left {
        until: Some(at), ..
    } = state_of(&app, &case).await
    else {
        panic!("not left until a date")
    };
    let week = chrono::Utc::now() + chrono::Duration::days(7);
    assert!(at <= week && at > week - chrono::Duration::hours(1), "{at}");
    eventually("the card says when Steward may ask again", || async {
        card_text(&app, &case)
            .await
            .contains(&format!("Steward may ask again after {latest}"))
    })
    .await;
}

#[tokio::test]
async fn leave_with_a_reason_closes_the_case_and_remembers_until_when() {
    let app = spawn_app_with(options("")).await;
    seed(&app, "keeper1", "base").await;
    let case = open_kill_case(&app, "keeper1").await;
    let before = app.modals_opened().len();
    click(&app, &case, "case_leave", "U0005", &hook()).await;
    let view = app.opened_modal(before).await;

    let refused = app.submit_reason(&view, "U0005", "   ", None).await;
    assert_eq!(refused["response_action"], "errors", "{refused}");
    assert_eq!(state_of(&app, &case).await, CaseState::Pending);

    let until = (chrono::Utc::now() + chrono::Duration::days(7))
        .format("%Y-%m-%d")
        .to_string();
    let answer = app
        .submit_reason(&view, "U0005", "demo on Friday", Some(&until))
        .await;
    assert_eq!(answer, Value::Null);
    let CaseState::Left {
        reason,
        until: Some(at),
        by,
        ..
    } = state_of(&app, &case).await
    else {
        panic!("not left")
    };
    assert_eq!(reason.as_deref(), Some("demo on Friday"));
    assert_eq!(by.as_str(), "U0005");
    assert_eq!(at.format("%Y-%m-%d").to_string(), until);
    eventually("the card says it was left", || async {
        let text = card_text(&app, &case).await;
        text.contains("demo on Friday") && text.contains(&until)
    })
    .await;
    assert!(sandbox_exists(&app, "keeper1").await);
    assert_eq!(calls(&app, "kill").await + calls(&app, "pause").await, 0);
}

#[tokio::test]
async fn with_redis_stopped_clicks_and_commands_get_a_clear_error_and_e2b_hears_nothing() {
    let redis = crate::common::ThrowawayRedis::start();
    let app = spawn_app_with(TestAppOptions {
        redis_url: Some(redis.url()),
        ..options("")
    })
    .await;
    seed(&app, "victim8", "base").await;
    seed(&app, "victim9", "base").await;
    let case = open_kill_case(&app, "victim8").await;
    drop(redis);
    app.e2b.hooks().reset_calls().await.unwrap();

    let reply = hook();
    click(&app, &case, "case_snapshot_then_kill", "U0002", &reply).await;
    let answer = visible_text(&app.wait_for_hook(&reply).await);
    assert!(
        answer.contains("can't reach its database (Redis)"),
        "{answer}"
    );
    let (_, reply) = command(&app, "kill victim9").await;
    let answer = visible_text(&reply);
    assert!(
        answer.contains("can't reach its database (Redis)"),
        "{answer}"
    );
    assert!(answer.contains("nothing was sent to E2B"), "{answer}");

    let ready = app.http.get(app.url("/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), 503);
    let body: Value = ready.json().await.unwrap();
    assert_eq!(body["checks"]["redis"], "unreachable");
    assert!(
        app.e2b_calls().await.values().all(|n| *n == 0),
        "{:?}",
        app.e2b_calls().await
    );
}

#[tokio::test]
async fn a_second_kill_for_the_same_sandbox_points_at_the_open_case() {
    let app = spawn_app_with(options("")).await;
    seed(&app, "victim10", "base").await;
    let case = open_kill_case(&app, "victim10").await;
    let (_, reply) = command(&app, "kill victim10 again please").await;
    let text = visible_text(&reply);
    assert!(text.contains("already has an open case"), "{text}");
    assert_eq!(case_id_in(&text), case);
    assert!(text.contains(APPROVALS), "{text}");
    let cards = app
        .slack
        .messages()
        .into_iter()
        .filter(|m| m.method == "chat.postMessage")
        .count();
    assert_eq!(cards, 1);
}

#[tokio::test]
async fn an_unknown_sandbox_gets_a_plain_sentence_and_no_case() {
    let app = spawn_app_with(options("")).await;
    let (_, reply) = command(&app, "kill nosuchbox").await;
    let text = visible_text(&reply);
    assert!(
        text.contains("was not found, so no case was opened"),
        "{text}"
    );
    let subject = Subject::Sandbox(SandboxId::parse("nosuchbox").unwrap());
    assert!(
        app.state
            .store
            .case_for_subject(&subject)
            .await
            .unwrap()
            .is_none()
    );
}

#[tokio::test]
async fn a_sandbox_that_changed_since_its_card_is_asked_about_again() {
    let app = spawn_app_with(options("")).await;
    seed(&app, "victim11", "base").await;
    let case = open_kill_case(&app, "victim11").await;
    app.state
        .e2b
        .as_ref()
        .unwrap()
        .pause_sandbox(&SandboxId::parse("victim11").unwrap())
        .await
        .unwrap();
    click(&app, &case, "case_snapshot_then_kill", "U0002", &hook()).await;
    eventually("the card asks again", || async {
        card_text(&app, &case).await.contains("Asked again")
    })
    .await;
    assert_eq!(state_of(&app, &case).await, CaseState::Pending);
    assert!(
        card_blocks(&app, &case)
            .await
            .to_string()
            .contains("case_snapshot_then_kill")
    );
    assert_eq!(calls(&app, "snapshot").await + calls(&app, "kill").await, 0);
    assert!(sandbox_exists(&app, "victim11").await);
}

#[tokio::test]
async fn a_template_case_counts_its_users_and_deletes_only_after_a_fresh_check() {
    let app = spawn_app_with(options("")).await;
    seed(&app, "user1", "oldtpl").await;
    let (_, reply) = command(&app, "delete-template oldtpl nobody needs it").await;
    let case = case_id_in(&visible_text(&reply));
    let blocks = card_blocks(&app, &case).await.to_string();
    assert!(
        blocks.contains("used by 1 sandbox and 0 snapshots."),
        "{blocks}"
    );

    // The sandbox goes away after the card was posted: the decision is asked again.
    let e2b = app.state.e2b.as_ref().unwrap();
    e2b.kill_sandbox(&SandboxId::parse("user1").unwrap())
        .await
        .unwrap();
    click(&app, &case, "case_delete_template", "U0002", &hook()).await;
    eventually("the card asks again", || async {
        card_text(&app, &case).await.contains("Asked again")
    })
    .await;
    assert_eq!(calls(&app, "delete-template").await, 0);

    click(&app, &case, "case_delete_template", "U0002", &hook()).await;
    wait_done(&app, &case).await;
    assert_eq!(calls(&app, "delete-template").await, 1);
    assert!(
        e2b.get_template(&TemplateId::parse("oldtpl").unwrap())
            .await
            .is_err()
    );
}

#[tokio::test]
async fn a_redelivered_click_is_acted_on_once() {
    let app = spawn_app_with(options("")).await;
    seed(&app, "victim12", "base").await;
    let case = open_kill_case(&app, "victim12").await;
    let ts = "1700000001.000200";
    click_with_ts(&app, &case, "case_pause", "U0002", &hook(), ts).await;
    click_with_ts(&app, &case, "case_pause", "U0002", &hook(), ts).await;
    wait_done(&app, &case).await;
    let decided = audit_actions(&app, &case)
        .await
        .into_iter()
        .filter(|a| a.starts_with("decide:"))
        .count();
    assert_eq!(decided, 1);
    assert_eq!(calls(&app, "pause").await, 1);
}

#[tokio::test]
async fn a_click_on_a_decided_case_names_the_decider_as_a_mention_slack_renders() {
    let app = spawn_app_with(options("")).await;
    seed(&app, "decided1", "base").await;
    let case = open_kill_case(&app, "decided1").await;
    click(&app, &case, "case_pause", "U0002", &hook()).await;
    wait_done(&app, &case).await;

    let late = hook();
    click(&app, &case, "case_pause", "U0003", &late).await;
    let reply = app.wait_for_hook(&late).await;
    let blocks = reply.blocks.clone().unwrap();
    assert_eq!(
        blocks[0]["text"]["text"],
        ":warning: Already decided by <@U0002>: Pause."
    );
    assert_eq!(
        reply.text.as_deref(),
        Some("Already decided by <@U0002>: Pause.")
    );
}

#[tokio::test]
async fn a_failed_kill_offers_retry_and_retry_finishes_it() {
    let app = spawn_app_with(TestAppOptions {
        stale_after: Duration::from_millis(300),
        ..options("")
    })
    .await;
    seed(&app, "victim13", "base").await;
    let case = open_kill_case(&app, "victim13").await;
    app.e2b_fault(json!({"op": "kill", "status": 500, "count": 100}))
        .await;
    click(&app, &case, "case_snapshot_then_kill", "U0002", &hook()).await;
    eventually("the case fails", || async {
        matches!(state_of(&app, &case).await, CaseState::Failed { .. })
    })
    .await;
    eventually("the card offers Retry", || async {
        card_blocks(&app, &case)
            .await
            .to_string()
            .contains("case_retry")
    })
    .await;
    assert!(sandbox_exists(&app, "victim13").await);
    app.e2b.hooks().clear_faults().await.unwrap();

    let reply = hook();
    click(&app, &case, "case_retry", "U0003", &reply).await;
    assert!(visible_text(&app.wait_for_hook(&reply).await).contains("not an approver"));
    click(&app, &case, "case_retry", "U0002", &hook()).await;
    wait_done(&app, &case).await;
    assert_eq!(
        calls(&app, "snapshot").await,
        1,
        "the retry resumes after the snapshot"
    );
    assert!(!sandbox_exists(&app, "victim13").await);
}

#[tokio::test]
async fn a_decision_whose_job_was_lost_is_requeued_by_the_reconcile_pass_and_kills_once() {
    // This replica records the decision but runs no worker: the test loses its job.
    let first = spawn_app_with(TestAppOptions {
        worker: false,
        ..options("")
    })
    .await;
    seed(&first, "victim15", "base").await;
    let case = open_kill_case(&first, "victim15").await;
    let before = first.modals_opened().len();
    click(&first, &case, "case_kill", "U0002", &hook()).await;
    let view = first.opened_modal(before).await;
    first
        .submit_reason(&view, "U0002", "it costs too much", None)
        .await;

    let store = &first.state.store;
    let queued = wait_until("the decision is queued", || async {
        store
            .claim(Lane::Decisions, "lost-worker", Duration::ZERO)
            .await
            .unwrap()
    })
    .await;
    assert_eq!(queued.job.case_id(), Some(&case));
    // Acknowledged without running: as if the replica died before queueing it.
    store.ack(&queued.id).await.unwrap();
    assert!(matches!(
        state_of(&first, &case).await,
        CaseState::Decided { .. }
    ));

    let svc = first.state.services();
    let now = chrono::Utc::now();
    assert!(
        reconcile_once(&svc, now).await.unwrap().is_empty(),
        "a fresh decision is left to its own job"
    );
    let grace = chrono::Duration::from_std(RECONCILE_GRACE).unwrap();
    let later = now + grace + chrono::Duration::seconds(1);
    // A worker holding the case's execution lease is still on it: leave it be.
    let lease = sandbox_steward::jobs::execution_lease(&case);
    let busy = Duration::from_secs(60);
    assert!(
        store
            .acquire_lease(&lease, "busy-worker", busy)
            .await
            .unwrap()
    );
    assert!(reconcile_once(&svc, later).await.unwrap().is_empty());
    assert!(store.release_lease(&lease, "busy-worker").await.unwrap());
    assert_eq!(
        reconcile_once(&svc, later).await.unwrap(),
        vec![case.clone()]
    );
    assert!(
        reconcile_once(&svc, later).await.unwrap().is_empty(),
        "re-queued once, not on every pass"
    );
    assert!(
        audit_actions(&first, &case)
            .await
            .contains(&"requeue re-queued after a lost job".to_owned())
    );
    assert!(sandbox_exists(&first, "victim15").await);

    // A replica with a worker picks the re-queued job up.
    let _second = first.spawn_peer(options("")).await;
    wait_done(&first, &case).await;
    assert!(!sandbox_exists(&first, "victim15").await);
    assert_eq!(calls(&first, "kill").await, 1);
    let much_later = later + grace * 10;
    assert!(
        reconcile_once(&svc, much_later).await.unwrap().is_empty(),
        "finished work is never queued again"
    );
    assert!(
        store
            .unfinished_decided(much_later)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(calls(&first, "kill").await, 1);
}

#[tokio::test]
async fn history_and_audit_export_show_the_timeline() {
    let app = spawn_app_with(options("")).await;
    seed(&app, "victim14", "base").await;
    let case = open_kill_case(&app, "victim14").await;
    click(&app, &case, "case_snapshot_then_kill", "U0002", &hook()).await;
    wait_done(&app, &case).await;

    for target in [case.to_string(), "victim14".to_owned()] {
        let (_, reply) = command(&app, &format!("history {target}")).await;
        let text = visible_text(&reply);
        let open = text.find(" open: ").unwrap_or_else(|| panic!("{text}"));
        let decide = text.find("decide:snapshot_then_kill: `ok`").unwrap();
        let kill = text.find("e2b:kill_sandbox: `ok`").unwrap();
        assert!(open < decide && decide < kill, "{text}");
        // People are mentions Slack renders; the case id is said once, not on every line.
        let blocks = reply.blocks.clone().unwrap().to_string();
        assert!(
            blocks.contains("<@U0002> decide:snapshot_then_kill: `ok`"),
            "{blocks}"
        );
        assert_eq!(blocks.matches(case.as_str()).count(), 1, "{blocks}");
    }

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_steward"))
        .args(["audit", "export", "--since", "1h"])
        .env("REDIS_URL", &app.redis_url)
        .env("STEWARD_REDIS_PREFIX", &app.redis_prefix)
        .env("STEWARD_CONFIG", "/dev/null")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(
        lines
            .iter()
            .any(|l| l["case"] == case.as_str() && l["action"] == "e2b:kill_sandbox")
    );
    assert!(
        lines
            .iter()
            .all(|l| l["time"].is_string() && l["actor"].is_object())
    );
}

#[tokio::test]
async fn steward_starts_while_redis_is_down_and_becomes_ready_when_it_comes_up() {
    // Reserve a port, release it, and point Steward at it before any Redis listens there.
    let port = free_port();
    let app = spawn_app_with(TestAppOptions {
        redis_url: Some(format!("redis://127.0.0.1:{port}")),
        ..options("")
    })
    .await;
    let health = app.http.get(app.url("/healthz")).send().await.unwrap();
    assert_eq!(health.status(), 200);
    let ready: Value = app
        .http
        .get(app.url("/readyz"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(ready["checks"]["redis"], "unreachable", "{ready}");

    let _redis = crate::common::ThrowawayRedis::start_on(port);
    eventually("readiness sees Redis", || async {
        app.http
            .get(app.url("/readyz"))
            .send()
            .await
            .unwrap()
            .status()
            == 200
    })
    .await;
    seed(&app, "late1", "base").await;
    let case = open_kill_case(&app, "late1").await;
    click(&app, &case, "case_pause", "U0002", &hook()).await;
    wait_done(&app, &case).await;
}

#[tokio::test]
async fn a_reason_form_is_answered_while_a_slow_slack_holds_up_the_decision() {
    let app = spawn_app_with(options("")).await;
    app.slack.add_usergroup("S0KILLERS", &["U0042"]);
    seed(&app, "slowpoke1", "base").await;
    let case = open_kill_case(&app, "slowpoke1").await;
    let before = app.modals_opened().len();
    // U0002 is an approver by name, so opening the form needs no group lookup; U0042, who
    // submits it, is one only through S0KILLERS, which Slack is about to be slow to list.
    click(&app, &case, "case_kill", "U0002", &hook()).await;
    let view = app.opened_modal(before).await;

    // Slack now rate-limits the approver-group lookup for longer than it waits for an answer.
    app.slack.add_fault(sandbox_steward::sim::slack::Fault {
        method: "usergroups.users.list".into(),
        status: 429,
        retry_after_secs: Some(5),
        count: 1,
        error: None,
    });
    let answer = app
        .submit_reason(&view, "U0042", "the load test is over", None)
        .await;
    assert_eq!(answer, Value::Null, "the form is closed");
    assert_eq!(
        state_of(&app, &case).await,
        CaseState::Pending,
        "the answer did not wait for the decision"
    );

    // The decision still completes once Slack answers.
    wait_done(&app, &case).await;
    assert!(!sandbox_exists(&app, "slowpoke1").await);
    assert_eq!(calls(&app, "kill").await, 1);
}

#[tokio::test]
async fn an_e2b_rate_limit_during_an_approved_kill_is_waited_out_and_the_kill_runs_once() {
    let app = spawn_app_with(TestAppOptions {
        stale_after: Duration::from_millis(300),
        ..options("")
    })
    .await;
    seed(&app, "throttled1", "base").await;
    let case = open_kill_case(&app, "throttled1").await;
    // E2B rate-limits the kill for longer than the client waits inline: the step is left for a
    // later delivery instead of failing the case.
    app.e2b_fault(json!({"op": "kill", "status": 429, "count": 1, "retry_after_secs": 2}))
        .await;
    click(&app, &case, "case_snapshot_then_kill", "U0002", &hook()).await;

    wait_done(&app, &case).await;
    assert!(!sandbox_exists(&app, "throttled1").await);
    assert_eq!(calls(&app, "snapshot").await, 1, "no second snapshot");
    assert_eq!(
        calls(&app, "kill").await,
        2,
        "one rate-limited attempt, then the kill"
    );
}

/// The Restore button's action ids on a case's card.
async fn has_restore_button(app: &TestApp, case: &CaseId) -> bool {
    card_blocks(app, case)
        .await
        .to_string()
        .contains("case_restore")
}

#[tokio::test]
async fn restore_brings_a_killed_sandbox_back_from_its_snapshot_once_with_its_metadata() {
    let app = spawn_app_with(options("")).await;
    app.seed_sandbox(
        json!({"sandboxID": "victim9", "templateID": "base", "state": "running",
                            "metadata": {"owner": "dana", "purpose": "eval"}}),
    )
    .await;
    let case = open_kill_case(&app, "victim9").await;
    click(&app, &case, "case_snapshot_then_kill", "U0002", &hook()).await;
    wait_done(&app, &case).await;
    assert!(!sandbox_exists(&app, "victim9").await);
    eventually("the card offers Restore", || async {
        has_restore_button(&app, &case).await
    })
    .await;
    let text = card_text(&app, &case).await;
    assert!(
        text.contains("Restore starts it again from the snapshot"),
        "{text}"
    );
    let creates_before = calls(&app, "create").await;

    // Two people click at once: one restore.
    let (a, b) = (hook(), hook());
    tokio::join!(
        click(&app, &case, "case_restore", "U0003", &a),
        click(&app, &case, "case_restore", "U0004", &b),
    );
    let restored = wait_until("the card names the restored sandbox", || async {
        let text = card_text(&app, &case).await;
        text.contains("restored it from the snapshot")
            .then_some(text)
    })
    .await;
    assert!(!has_restore_button(&app, &case).await, "{restored}");
    assert_eq!(calls(&app, "create").await, creates_before + 1);
    let stored = app.state.store.get_case(&case).await.unwrap();
    let restore = stored.restore.unwrap();
    let new_id = restore.request.unwrap().sandbox.unwrap();
    assert!(restored.contains(new_id.as_str()), "{restored}");
    let detail = app
        .state
        .e2b
        .as_ref()
        .unwrap()
        .get_sandbox(&new_id)
        .await
        .unwrap();
    // The simulator accepts a snapshot's name as a template (404 otherwise) and reports the
    // template the snapshot was taken from.
    assert_ne!(new_id.as_str(), "victim9");
    assert_eq!(
        detail.metadata.get("owner").map(String::as_str),
        Some("dana")
    );
    assert_eq!(
        detail.metadata.get("purpose").map(String::as_str),
        Some("eval")
    );
    assert_eq!(
        detail
            .metadata
            .get("steward.restored_from")
            .map(String::as_str),
        Some(case.as_str())
    );
    let actions = audit_actions(&app, &case).await;
    let from_snapshot = format!(
        "restored as sandbox {new_id} from snapshot {}",
        restore.snapshot
    );
    assert!(
        actions.iter().any(|a| a.contains(&from_snapshot)),
        "{actions:?}"
    );
}

#[tokio::test]
async fn after_the_restore_window_the_button_is_gone_and_the_snapshot_stays() {
    let app = spawn_app_with(TestAppOptions {
        expire_every: Duration::from_millis(100),
        ..options("restore_window = \"1s\"")
    })
    .await;
    seed(&app, "victim10", "base").await;
    let case = open_kill_case(&app, "victim10").await;
    click(&app, &case, "case_snapshot_then_kill", "U0002", &hook()).await;
    wait_done(&app, &case).await;
    let closed = wait_until("the window closes", || async {
        let text = card_text(&app, &case).await;
        text.contains("The restore window closed").then_some(text)
    })
    .await;
    assert!(!has_restore_button(&app, &case).await, "{closed}");
    assert!(
        closed.contains("stays until someone deletes it"),
        "{closed}"
    );
    // A late click (an old copy of the card) changes nothing.
    let reply = hook();
    click(&app, &case, "case_restore", "U0003", &reply).await;
    let answer = visible_text(&app.wait_for_hook(&reply).await);
    assert!(answer.contains("Restore is not offered"), "{answer}");
    let snapshot = app
        .state
        .store
        .get_case(&case)
        .await
        .unwrap()
        .restore
        .unwrap()
        .snapshot;
    let snapshots = app
        .state
        .e2b
        .as_ref()
        .unwrap()
        .list_snapshots(None)
        .await
        .unwrap();
    assert!(
        snapshots
            .items
            .iter()
            .any(|s| s.snapshot_id == snapshot || s.names.contains(&snapshot.to_string())),
        "{:?}",
        snapshots.items
    );
}

#[tokio::test]
async fn a_restore_e2b_refuses_says_why_and_offers_restore_again() {
    let app = spawn_app_with(options("")).await;
    seed(&app, "victim11", "base").await;
    let case = open_kill_case(&app, "victim11").await;
    click(&app, &case, "case_snapshot_then_kill", "U0002", &hook()).await;
    wait_done(&app, &case).await;
    eventually("the card offers Restore", || async {
        has_restore_button(&app, &case).await
    })
    .await;
    // Someone deleted the snapshot meanwhile: E2B answers 404 to the create.
    let snapshot = app
        .state
        .store
        .get_case(&case)
        .await
        .unwrap()
        .restore
        .unwrap()
        .snapshot;
    let e2b = app.state.e2b.as_ref().unwrap();
    e2b.delete_template(&snapshot).await.unwrap();
    let creates_before = calls(&app, "create").await;
    click(&app, &case, "case_restore", "U0003", &hook()).await;
    let text = wait_until("the card says the restore failed", || async {
        let text = card_text(&app, &case).await;
        text.contains("failed").then_some(text)
    })
    .await;
    assert!(
        text.contains("Restoring from the snapshot failed")
            && text.contains(&format!("steward e2b create {snapshot}")),
        "{text}"
    );
    assert!(
        has_restore_button(&app, &case).await,
        "Restore is offered again"
    );
    assert_eq!(calls(&app, "create").await, creates_before + 1);
    let actions = audit_actions(&app, &case).await;
    assert!(
        actions.iter().any(|a| a.starts_with("restore failed:")),
        "{actions:?}"
    );
}
