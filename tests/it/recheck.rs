//! The worker's re-checks and retries over HTTP: before every destructive step (first run and
//! every retry) the sandbox is read again with a fresh metrics sample, a template's users are
//! read from complete listings only, answers lost after E2B acted (a 502 after the change) do
//! not make Steward act twice or report a failure, and transient failures are counted per case
//! and step rather than per delivery. Real Redis, the E2B simulator and the fake Slack.

use sandbox_steward::store::Lane;
use std::time::Duration;

use crate::common::{
    PATIENCE, TestApp, TestAppOptions, case_id_in, eventually, hook, spawn_app_with, visible_text,
};
use sandbox_steward::approvals::evidence;
use sandbox_steward::approvals::worker::{
    RECONCILE_GRACE, handle_job, reconcile_once, snapshot_name,
};
use sandbox_steward::cases::{CaseState, Event, StepOutcome};
use sandbox_steward::e2b::{E2bError, PagingStop};
use sandbox_steward::ids::{CaseId, SandboxId, TemplateId};
use sandbox_steward::jobs::execution_lease;
use sandbox_steward::sim::slack::Recorded;
use sandbox_steward::store::Updated;
use serde_json::{Value, json};

const APPROVALS: &str = "C0APPROVALS";

/// U0001 asks (every command comes from U0001); U0002 may kill and delete templates.
fn options() -> TestAppOptions {
    let policy = format!(
        r#"
[channels]
approvals = "{APPROVALS}"
[approvals]
two_person_rule = true
[approvals.approvers]
kill = {{ users = ["U0002"] }}
delete_template = {{ users = ["U0002"] }}
pause = {{ anyone = true }}
leave = {{ anyone = true }}
keep = {{ anyone = true }}
"#
    );
    TestAppOptions {
        sandboxes: 0,
        policy: Some(policy),
        // A job left for a retry comes back quickly.
        stale_after: Duration::from_millis(300),
        ..TestAppOptions::default()
    }
}

/// Seeds a sandbox that has been running (or was paused) for an hour with an idle CPU, so
/// its card shows it idle and a metrics sample exists.
async fn seed_idle(app: &TestApp, id: &str, template: &str, state: &str) -> Value {
    let started = chrono::Utc::now() - chrono::Duration::hours(1);
    let mut body = json!({"sandboxID": id, "templateID": template, "state": state,
        "profile": "idle", "startedAt": started});
    if state == "paused" {
        body["endAt"] = json!(chrono::Utc::now() - chrono::Duration::minutes(10));
    }
    app.seed_sandbox(body).await
}

/// Runs `/sandbox <text>` and returns the deferred answer.
async fn command(app: &TestApp, text: &str) -> Recorded {
    let name = hook();
    app.post_command_to(text, &name).await;
    app.wait_for_hook(&name).await
}

async fn open_case(app: &TestApp, text: &str) -> CaseId {
    let reply = visible_text(&command(app, text).await);
    assert!(reply.contains("Opened case"), "{reply}");
    case_id_in(&reply)
}

async fn card_text(app: &TestApp, case: &CaseId) -> String {
    let card = app.state.store.get_case(case).await.unwrap().card.unwrap();
    let message = app.slack.message(card.channel.as_str(), &card.ts).unwrap();
    visible_text(&message)
}

async fn state_of(app: &TestApp, case: &CaseId) -> CaseState {
    app.state.store.get_case(case).await.unwrap().state
}

async fn click(app: &TestApp, case: &CaseId, action_id: &str) {
    let resp = app
        .click_case(case, action_id, "U0002", &hook(), &hook())
        .await;
    assert_eq!(resp.status(), 200);
}

async fn calls(app: &TestApp, op: &str) -> u64 {
    app.e2b.hooks().calls_of(op).await.unwrap()
}

async fn sandbox_exists(app: &TestApp, id: &str) -> bool {
    let e2b = app.state.e2b.as_ref().unwrap();
    e2b.get_sandbox(&SandboxId::parse(id).unwrap())
        .await
        .is_ok()
}

async fn audit(app: &TestApp, case: &CaseId) -> Vec<String> {
    app.state
        .store
        .audit_for_case(case)
        .await
        .unwrap()
        .into_iter()
        .map(|e| format!("{} {}", e.action, e.outcome))
        .collect()
}

async fn wait_for_state(app: &TestApp, case: &CaseId, name: &str) -> CaseState {
    let reached = crate::common::poll_for(PATIENCE, || async {
        let state = state_of(app, case).await;
        (state.name() == name).then_some(state)
    })
    .await;
    match reached {
        Some(state) => state,
        None => panic!(
            "the case never became {name}: {:?}\naudit: {:#?}",
            state_of(app, case).await,
            audit(app, case).await
        ),
    }
}

async fn wait_asked_again(app: &TestApp, case: &CaseId) -> String {
    wait_for_state(app, case, "pending").await;
    eventually("the card asks again", || async {
        card_text(app, case).await.contains("Asked again")
    })
    .await;
    card_text(app, case).await
}

// ---- answers lost after E2B acted ----

#[tokio::test]
async fn a_snapshot_that_succeeded_but_answered_502_is_not_taken_twice() {
    let app = spawn_app_with(options()).await;
    seed_idle(&app, "lost1", "base", "running").await;
    let case = open_case(&app, "kill lost1 done with it").await;
    app.e2b
        .hooks()
        .fault_after("snapshot", 502, 1)
        .await
        .unwrap();
    click(&app, &case, "case_snapshot_then_kill").await;

    let CaseState::Done { steps, .. } = wait_for_state(&app, &case, "done").await else {
        unreachable!()
    };
    assert_eq!(calls(&app, "snapshot").await, 1, "no second snapshot");
    assert_eq!(app.e2b.hooks().state().await.unwrap()["snapshots"], 1);
    assert!(!sandbox_exists(&app, "lost1").await);
    let StepOutcome::SnapshotCreated { snapshot_id, .. } = &steps[0].outcome else {
        panic!("{steps:?}")
    };
    assert_eq!(steps.last().unwrap().outcome, StepOutcome::Killed);
    let listed = app
        .state
        .e2b
        .as_ref()
        .unwrap()
        .list_snapshots(None)
        .await
        .unwrap();
    assert!(listed.items.iter().any(|s| &s.snapshot_id == snapshot_id));
}

#[tokio::test]
async fn a_kill_that_happened_but_answered_502_is_done_not_failed() {
    let app = spawn_app_with(options()).await;
    seed_idle(&app, "lost2", "base", "running").await;
    let case = open_case(&app, "kill lost2 done with it").await;
    // Both of the client's attempts answer 502: the first killed it, the second found nothing.
    app.e2b.hooks().fault_after("kill", 502, 2).await.unwrap();
    click(&app, &case, "case_snapshot_then_kill").await;

    let CaseState::Done { steps, .. } = wait_for_state(&app, &case, "done").await else {
        unreachable!()
    };
    assert_eq!(
        steps.last().unwrap().outcome,
        StepOutcome::Killed,
        "the lost answer's kill is what ended it"
    );
    assert!(!sandbox_exists(&app, "lost2").await);
    assert!(
        !audit(&app, &case)
            .await
            .iter()
            .any(|a| a.starts_with("fail")),
        "never reported failed"
    );
    eventually("the card says done", || async {
        card_text(&app, &case).await.contains(":white_check_mark:")
    })
    .await;
}

#[tokio::test]
async fn a_worker_that_died_after_its_snapshot_call_is_taken_over_without_a_second_snapshot() {
    // This replica records the decision; the test plays its worker, which dies mid-step.
    let first = spawn_app_with(TestAppOptions {
        worker: false,
        ..options()
    })
    .await;
    seed_idle(&first, "lost3", "base", "running").await;
    let case = open_case(&first, "kill lost3 done with it").await;
    click(&first, &case, "case_snapshot_then_kill").await;
    let claimed = claim(&first, "dying").await;
    let store = &first.state.store;
    assert!(matches!(
        store
            .apply_event(&case, Event::StartExecuting, chrono::Utc::now())
            .await
            .unwrap(),
        Updated::Applied(_)
    ));
    // E2B takes the snapshot; the worker dies before it hears the answer or records the step.
    let decided = store.get_case(&case).await.unwrap();
    first
        .state
        .e2b
        .as_ref()
        .unwrap()
        .create_snapshot(
            &SandboxId::parse("lost3").unwrap(),
            Some(&snapshot_name(&decided)),
        )
        .await
        .unwrap();
    drop(claimed);

    let _second = first.spawn_peer(options()).await;
    wait_for_state(&first, &case, "done").await;
    assert_eq!(calls(&first, "snapshot").await, 1, "no second snapshot");
    assert_eq!(first.e2b.hooks().state().await.unwrap()["snapshots"], 1);
    assert!(!sandbox_exists(&first, "lost3").await);
}

// ---- re-check before every destructive step ----

#[tokio::test]
async fn a_sandbox_seen_idle_that_is_busy_again_is_not_touched_on_the_first_run() {
    let app = spawn_app_with(options()).await;
    seed_idle(&app, "busy1", "base", "running").await;
    let case = open_case(&app, "kill busy1 idle for ages").await;
    app.e2b
        .hooks()
        .change("busy1", json!({"profile": "busy"}))
        .await
        .unwrap();
    click(&app, &case, "case_snapshot_then_kill").await;
    let text = wait_asked_again(&app, &case).await;
    assert!(text.contains("CPU, above the idle threshold"), "{text}");
    assert_eq!(calls(&app, "snapshot").await + calls(&app, "kill").await, 0);
    assert!(sandbox_exists(&app, "busy1").await);
}

/// Snapshot-then-kill whose kill fails until the case is Failed; then `change` is made to
/// the sandbox and a person presses Retry: the kill's re-check must send the case back to
/// people with `expected` in the note, and kill nothing.
async fn a_retry_after_the_snapshot_rechecks(id: &str, start: &str, change: Value, expected: &str) {
    let app = spawn_app_with(options()).await;
    seed_idle(&app, id, "base", start).await;
    let case = open_case(&app, &format!("kill {id} not needed")).await;
    app.e2b_fault(json!({"op": "kill", "status": 500, "count": 1000}))
        .await;
    click(&app, &case, "case_snapshot_then_kill").await;
    wait_for_state(&app, &case, "failed").await;
    eventually("the card offers Retry", || async {
        let card = app.state.store.get_case(&case).await.unwrap().card.unwrap();
        let message = app.slack.message(card.channel.as_str(), &card.ts).unwrap();
        message
            .blocks
            .unwrap_or_default()
            .to_string()
            .contains("case_retry")
    })
    .await;
    app.e2b.hooks().clear_faults().await.unwrap();
    let kills = calls(&app, "kill").await;
    assert_eq!(calls(&app, "snapshot").await, 1);

    app.e2b.hooks().change(id, change).await.unwrap();
    click(&app, &case, "case_retry").await;
    let text = wait_asked_again(&app, &case).await;
    assert!(text.contains(expected), "{text}");
    assert!(text.contains("was not killed"), "{text}");
    assert_eq!(calls(&app, "kill").await, kills, "no kill after the change");
    assert_eq!(calls(&app, "snapshot").await, 1);
    assert!(sandbox_exists(&app, id).await);
}

#[tokio::test]
async fn a_retry_after_the_snapshot_does_not_kill_a_sandbox_that_became_busy() {
    a_retry_after_the_snapshot_rechecks(
        "retry1",
        "running",
        json!({"profile": "busy"}),
        "above the idle threshold",
    )
    .await;
}

#[tokio::test]
async fn a_retry_after_the_snapshot_does_not_kill_a_restarted_sandbox() {
    a_retry_after_the_snapshot_rechecks("retry2", "running", json!({"restart": true}), "restarted")
        .await;
}

#[tokio::test]
async fn a_retry_after_the_snapshot_does_not_kill_a_sandbox_whose_metadata_changed() {
    a_retry_after_the_snapshot_rechecks(
        "retry3",
        "running",
        json!({"metadata": {"steward.keep": "forever"}}),
        "metadata changed",
    )
    .await;
}

#[tokio::test]
async fn a_retry_after_the_snapshot_does_not_kill_a_resumed_sandbox() {
    a_retry_after_the_snapshot_rechecks(
        "retry4",
        "paused",
        json!({"state": "running"}),
        "from paused to running",
    )
    .await;
}

// ---- templates: complete listings, compared as sets ----

#[tokio::test]
async fn a_template_whose_users_cannot_all_be_listed_is_not_deleted_or_counted_as_unused() {
    let app = spawn_app_with(options()).await;
    seed_idle(&app, "tuser1", "tplcut", "running").await;
    let case = open_case(&app, "delete-template tplcut old").await;
    app.e2b.hooks().paging("repeat").await.unwrap();
    click(&app, &case, "case_delete_template").await;
    let CaseState::Failed { error, .. } = wait_for_state(&app, &case, "failed").await else {
        unreachable!()
    };
    assert!(
        error.contains("could not tell who uses the template"),
        "{error}"
    );
    assert_eq!(calls(&app, "delete-template").await, 0);

    // Opening a case on an incomplete listing is refused rather than showing "0 sandboxes".
    seed_idle(&app, "tuser2", "tplcut2", "running").await;
    let reply = visible_text(&command(&app, "delete-template tplcut2 old").await);
    assert!(reply.contains("could not read all"), "{reply}");
    assert!(!reply.contains("Opened case"), "{reply}");
    let e2b = app.state.e2b.as_ref().unwrap();
    app.e2b.hooks().paging("normal").await.unwrap();
    for template in ["tplcut", "tplcut2"] {
        assert!(
            e2b.get_template(&TemplateId::parse(template).unwrap())
                .await
                .is_ok()
        );
    }
}

#[tokio::test]
async fn a_template_listing_stopped_at_the_page_cap_is_unknown_not_a_smaller_count() {
    let app = spawn_app_with(options()).await;
    seed_idle(&app, "capped1", "tplcap", "running").await;
    app.e2b.hooks().paging("endless").await.unwrap();
    let client = app.state.e2b.clone().unwrap().with_max_pages(3);
    let err = evidence::template_usage(&client, &TemplateId::parse("tplcap").unwrap())
        .await
        .unwrap_err();
    assert!(
        matches!(err, E2bError::Incomplete(PagingStop::PageCap(3))),
        "{err:?}"
    );
    assert!(err.to_string().contains("cap of 3 pages"), "{err}");
}

#[tokio::test]
async fn a_template_whose_user_was_swapped_for_another_is_asked_about_again() {
    let app = spawn_app_with(options()).await;
    seed_idle(&app, "swap1", "tplswap", "running").await;
    let case = open_case(&app, "delete-template tplswap old").await;
    let e2b = app.state.e2b.as_ref().unwrap();
    e2b.kill_sandbox(&SandboxId::parse("swap1").unwrap())
        .await
        .unwrap();
    seed_idle(&app, "swap2", "tplswap", "running").await;
    click(&app, &case, "case_delete_template").await;
    let text = wait_asked_again(&app, &case).await;
    assert!(text.contains("`swap2` now use it"), "{text}");
    assert_eq!(calls(&app, "delete-template").await, 0);
}

#[tokio::test]
async fn a_template_whose_sandboxes_gained_a_snapshot_is_asked_about_again() {
    let app = spawn_app_with(options()).await;
    seed_idle(&app, "snapuser1", "tplsnap", "running").await;
    let case = open_case(&app, "delete-template tplsnap old").await;
    let e2b = app.state.e2b.as_ref().unwrap();
    e2b.create_snapshot(&SandboxId::parse("snapuser1").unwrap(), None)
        .await
        .unwrap();
    click(&app, &case, "case_delete_template").await;
    let text = wait_asked_again(&app, &case).await;
    assert!(text.contains("1 snapshot(s), not 0"), "{text}");
    assert_eq!(calls(&app, "delete-template").await, 0);
}

// ---- honest retry counts ----

/// Waits until the decision is queued and claims it as `consumer`.
async fn claim(app: &TestApp, consumer: &str) -> sandbox_steward::store::ClaimedJob {
    crate::common::poll_until(PATIENCE, "the decision queued", || async {
        app.state
            .store
            .claim(Lane::Decisions, consumer, Duration::ZERO)
            .await
            .unwrap()
    })
    .await
}

#[tokio::test]
async fn a_job_waiting_for_a_transient_retry_is_not_requeued_and_deletes_are_counted_honestly() {
    // This replica records the decision; the test runs the first delivery by hand.
    let first = spawn_app_with(TestAppOptions {
        worker: false,
        ..options()
    })
    .await;
    seed_idle(&first, "flaky1", "base", "running").await;
    let case = open_case(&first, "kill flaky1 not needed").await;
    first
        .e2b_fault(json!({"op": "kill", "status": 500, "count": 1000}))
        .await;
    click(&first, &case, "case_snapshot_then_kill").await;
    let svc = first.state.services();
    let claimed = claim(&first, "hand").await;
    let first_try = handle_job(&svc, claimed).await;
    assert!(first_try.is_err(), "the kill failed: {first_try:?}");
    let stored = first.state.store.get_case(&case).await.unwrap();
    assert_eq!(stored.state.name(), "executing");
    assert_eq!(stored.retrying.as_ref().map(|r| r.failures), Some(1));

    // Long after the decision, the job is still queued for its retry: reconcile leaves it.
    let later = chrono::Utc::now() + chrono::Duration::from_std(RECONCILE_GRACE).unwrap() * 2;
    assert!(reconcile_once(&svc, later).await.unwrap().is_empty());

    // A replica with a worker takes the job over and gives up after three failed deliveries.
    let _second = first.spawn_peer(options()).await;
    let CaseState::Failed { error, .. } = wait_for_state(&first, &case, "failed").await else {
        unreachable!()
    };
    assert!(error.contains("failed 3 times"), "{error}");
    // Three deliveries, each making the client's two attempts: six DELETE calls, no more.
    assert_eq!(calls(&first, "kill").await, 6);
    assert!(
        !audit(&first, &case)
            .await
            .iter()
            .any(|a| a.starts_with("requeue"))
    );
    assert!(sandbox_exists(&first, "flaky1").await);
}

#[tokio::test]
async fn deliveries_while_a_dead_workers_lease_held_do_not_count_as_failures() {
    let app = spawn_app_with(TestAppOptions {
        worker: false,
        ..options()
    })
    .await;
    seed_idle(&app, "leased1", "base", "running").await;
    let case = open_case(&app, "kill leased1 not needed").await;
    click(&app, &case, "case_snapshot_then_kill").await;
    let store = app.state.store.clone();
    let svc = app.state.services();
    let lease = execution_lease(&case);
    assert!(
        store
            .acquire_lease(&lease, "dead-worker", Duration::from_secs(60))
            .await
            .unwrap()
    );
    let mut job = claim(&app, "hand").await;
    // The dead worker's lease holds: every delivery finds the case busy and leaves it.
    for _ in 0..5 {
        assert!(handle_job(&svc, job).await.is_err());
        job = store
            .reclaim_stale(Lane::Decisions, "hand", Duration::ZERO)
            .await
            .unwrap()
            .pop()
            .expect("the job is still pending");
    }
    assert!(job.deliveries > 5, "{}", job.deliveries);
    assert_eq!(calls(&app, "kill").await + calls(&app, "snapshot").await, 0);

    // The lease runs out; the next delivery meets one transient E2B failure of the kill.
    assert!(store.release_lease(&lease, "dead-worker").await.unwrap());
    app.e2b_fault(json!({"op": "kill", "status": 500, "count": 2}))
        .await;
    assert!(handle_job(&svc, job).await.is_err());
    let stored = store.get_case(&case).await.unwrap();
    assert_eq!(
        stored.state.name(),
        "executing",
        "not failed: {:?}",
        stored.state
    );
    assert_eq!(stored.retrying.as_ref().map(|r| r.failures), Some(1));

    let job = store
        .reclaim_stale(Lane::Decisions, "hand", Duration::ZERO)
        .await
        .unwrap()
        .pop()
        .expect("the job is still pending");
    handle_job(&svc, job).await.unwrap();
    assert_eq!(state_of(&app, &case).await.name(), "done");
    assert_eq!(calls(&app, "kill").await, 3);
    assert!(!sandbox_exists(&app, "leased1").await);
}
