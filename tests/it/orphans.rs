//! The orphan reconciler over real sockets (the app, the E2B simulator, the fake Slack, Redis):
//! a sandbox carrying Steward's run metadata whose run record is gone, or whose run ended
//! without a hand-over, is ended (by rule, through a case the worker carries out) or handed over
//! again, once, and audited; a running run's sandbox, one with an open case, a restored copy and
//! a young one are left alone; two replicas act once.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sandbox_steward::approvals::run_case::{ORPHAN_RULE, RunCaseSettings, UNSTARTED_RULE};
use sandbox_steward::approvals::worker::orphans::{
    ORPHAN_GRACE, OrphanAction, OrphanSettings, orphans_once,
};
use sandbox_steward::cases::{CaseState, Decider, Subject};
use sandbox_steward::ids::{RunId, SandboxId, SlackChannelId};
use sandbox_steward::runs::{Run, RunPhase, RunProcess, RunStatus};
use serde_json::json;

use crate::common::{
    TestApp, TestAppOptions, case_id_in, eventually, hook, spawn_app_with, visible_text, wait_until,
};

const RUNS: &str = "C0RUNS";
const LEASE: Duration = Duration::from_secs(60);

fn options() -> TestAppOptions {
    TestAppOptions {
        sandboxes: 0,
        policy: Some(format!(
            "[channels]\napprovals = \"C0APPROVALS\"\nruns = \"{RUNS}\"\n\
             [approvals.approvers]\nkill = {{ users = [\"U0002\"] }}\n"
        )),
        ..TestAppOptions::default()
    }
}

fn settings(app: &TestApp, holder: &str) -> OrphanSettings {
    OrphanSettings {
        runner: app.state.runs.clone().expect("runs are configured"),
        run_cases: RunCaseSettings {
            channel: Some(SlackChannelId::parse(RUNS).unwrap()),
            keep_running_for: Duration::from_secs(3600),
            decide_within: Duration::from_secs(3600),
        },
        grace: ORPHAN_GRACE,
        holder: holder.into(),
    }
}

fn an_hour_ago() -> DateTime<Utc> {
    Utc::now() - chrono::Duration::hours(1)
}

/// A sandbox Steward created for `run` an hour ago (idle, so a kill's re-check lets it go).
async fn seed(app: &TestApp, id: &str, metadata: serde_json::Value, started: DateTime<Utc>) {
    app.seed_sandbox(
        json!({"sandboxID": id, "templateID": "base", "state": "running",
        "profile": "idle", "metadata": metadata,
        "startedAt": started.to_rfc3339(),
        "endAt": (Utc::now() + chrono::Duration::hours(5)).to_rfc3339()}),
    )
    .await;
}

fn run_metadata(run: &str) -> serde_json::Value {
    json!({"steward.run": run, "steward.requester": "agent-a", "steward.purpose": "run"})
}

/// Stores a run record as the engine would have left it.
async fn store_run(
    app: &TestApp,
    id: &str,
    status: RunStatus,
    sandbox: &str,
    command_started: bool,
) -> RunId {
    let run_id = RunId::parse(id).unwrap();
    let ended = status.is_terminal();
    let run = Run {
        id: run_id.clone(),
        requester: "agent-a".into(),
        template: "base".into(),
        command: "python train.py".into(),
        files: Vec::new(),
        cwd: None,
        timeout_secs: 600,
        status,
        sandbox_id: Some(SandboxId::parse(sandbox).unwrap()),
        created_at: an_hour_ago(),
        started_at: Some(an_hour_ago()),
        finished_at: ended.then(an_hour_ago),
        exit_code: (status == RunStatus::Finished).then_some(0),
        outcome: None,
        duration_ms: ended.then_some(1_000),
        output_bytes: 0,
        output_truncated: false,
        profile: None,
        logs_tail: Vec::new(),
        error: (status == RunStatus::Failed).then(|| "the upload failed".into()),
        case_id: None,
        handed_over: false,
        worker: None,
        process: command_started.then_some(RunProcess {
            phase: RunPhase::Command,
            pid: 7,
        }),
        reattached: 0,
    };
    let json = serde_json::to_string(&run).unwrap();
    app.state
        .store
        .create_run(&run_id, &json, "[]")
        .await
        .unwrap();
    run_id
}

async fn kills(app: &TestApp) -> u64 {
    app.e2b_calls().await.get("kill").copied().unwrap_or(0)
}

async fn exists(app: &TestApp, id: &str) -> bool {
    let e2b = app.state.e2b.as_ref().unwrap();
    e2b.get_sandbox(&SandboxId::parse(id).unwrap())
        .await
        .is_ok()
}

async fn audit_of(app: &TestApp, id: &str) -> Vec<String> {
    let subject = Subject::Sandbox(SandboxId::parse(id).unwrap());
    app.state
        .store
        .audit_for_subject(&subject)
        .await
        .unwrap()
        .into_iter()
        .map(|e| format!("{} {}", e.action, e.outcome))
        .collect()
}

#[tokio::test]
async fn a_sandbox_whose_run_record_is_gone_is_killed_by_rule_once_and_audited() {
    let app = spawn_app_with(options()).await;
    seed(&app, "orphan1", run_metadata("run_gone1"), an_hour_ago()).await;
    let svc = app.state.services();
    let orphans = settings(&app, "replica-a");

    let report = orphans_once(&svc, &orphans, LEASE, Utc::now())
        .await
        .unwrap();
    assert!(report.ran);
    assert_eq!(report.listed, 1);
    let [(sandbox, OrphanAction::Ended { case, why })] = report.acted.as_slice() else {
        panic!("{report:?}")
    };
    assert_eq!(sandbox.as_str(), "orphan1");
    assert!(why.contains("record of run `run_gone1` is gone"), "{why}");
    eventually("the worker kills it", || async {
        !exists(&app, "orphan1").await
    })
    .await;
    let stored = app.state.store.get_case(case).await.unwrap();
    assert_eq!(
        stored.state.decision().unwrap().by,
        Decider::Policy {
            policy: ORPHAN_RULE.into()
        }
    );
    eventually("the case is done", || async {
        matches!(
            app.state.store.get_case(case).await.unwrap().state,
            CaseState::Done { .. }
        )
    })
    .await;
    // A second pass finds nothing left to do.
    let again = orphans_once(&svc, &orphans, LEASE, Utc::now())
        .await
        .unwrap();
    assert!(again.acted.is_empty(), "{again:?}");
    assert_eq!(kills(&app).await, 1);
    let audit = audit_of(&app, "orphan1").await;
    assert!(
        audit.iter().any(|a| a.starts_with(&format!(
            "orphan ended by rule ({ORPHAN_RULE}) through case {case}: the record of run `run_gone1` is gone"
        ))),
        "{audit:?}"
    );
}

#[tokio::test]
async fn a_run_that_ended_without_a_hand_over_is_handed_over_again() {
    let app = spawn_app_with(options()).await;
    let svc = app.state.services();
    let runs = app.state.runs.clone().unwrap();
    // Failed at its upload (its command never started): its sandbox is killed by rule.
    seed(
        &app,
        "orphan2",
        run_metadata("run_unstarted2"),
        an_hour_ago(),
    )
    .await;
    let unstarted = store_run(&app, "run_unstarted2", RunStatus::Failed, "orphan2", false).await;
    // Finished (exit 0) but never handed over: a run case asks people, nothing is killed.
    seed(
        &app,
        "orphan3",
        run_metadata("run_finished3"),
        an_hour_ago(),
    )
    .await;
    let finished = store_run(&app, "run_finished3", RunStatus::Finished, "orphan3", true).await;

    let report = orphans_once(&svc, &settings(&app, "replica-a"), LEASE, Utc::now())
        .await
        .unwrap();
    let mut acted = report.acted.clone();
    acted.sort_by(|a, b| a.0.as_str().cmp(b.0.as_str()));
    assert_eq!(
        acted,
        vec![
            (
                SandboxId::parse("orphan2").unwrap(),
                OrphanAction::HandedOver {
                    run: unstarted.clone()
                }
            ),
            (
                SandboxId::parse("orphan3").unwrap(),
                OrphanAction::HandedOver {
                    run: finished.clone()
                }
            ),
        ]
    );
    eventually("the unstarted run's sandbox is killed", || async {
        !exists(&app, "orphan2").await
    })
    .await;
    let case2 = runs.get(&unstarted).await.unwrap().case_id.unwrap();
    assert_eq!(
        app.state
            .store
            .get_case(&case2)
            .await
            .unwrap()
            .state
            .decision()
            .unwrap()
            .by,
        Decider::Policy {
            policy: UNSTARTED_RULE.into()
        }
    );
    let case3 = wait_until("the finished run's case", || async {
        runs.get(&finished).await.unwrap().case_id
    })
    .await;
    assert_eq!(
        app.state.store.get_case(&case3).await.unwrap().state,
        CaseState::Pending,
        "people are asked"
    );
    app.wait_for_message("the run card in the runs channel", |m| {
        m.channel.as_deref() == Some(RUNS) && visible_text(m).contains(finished.as_str())
    })
    .await;
    assert!(exists(&app, "orphan3").await);
    assert_eq!(kills(&app).await, 1);
    let again = orphans_once(&svc, &settings(&app, "replica-a"), LEASE, Utc::now())
        .await
        .unwrap();
    assert!(again.acted.is_empty(), "{again:?}");
    let audit = audit_of(&app, "orphan3").await;
    assert!(
        audit.iter().any(|a| a.starts_with(&format!(
            "orphan run {finished} ended but its sandbox was never handed over"
        ))),
        "{audit:?}"
    );
}

#[tokio::test]
async fn running_runs_open_cases_restored_copies_and_young_sandboxes_are_left_alone() {
    let app = spawn_app_with(options()).await;
    let svc = app.state.services();
    // Still running.
    seed(&app, "busy4", run_metadata("run_running4"), an_hour_ago()).await;
    store_run(&app, "run_running4", RunStatus::Running, "busy4", true).await;
    // Its record is gone, but someone opened a case about it.
    seed(&app, "cased5", run_metadata("run_gone5"), an_hour_ago()).await;
    let opened = hook();
    app.post_command_to("kill cased5 looks abandoned", &opened)
        .await;
    let case5 = case_id_in(&visible_text(&app.wait_for_hook(&opened).await));
    // Restored from a case's snapshot: the original's metadata, someone else's sandbox now.
    let mut restored = run_metadata("run_gone6");
    restored["steward.restored_from"] = json!("case_x");
    seed(&app, "restored6", restored, an_hour_ago()).await;
    // Started a minute ago: its run may still be creating it.
    seed(
        &app,
        "young7",
        run_metadata("run_gone7"),
        Utc::now() - chrono::Duration::minutes(1),
    )
    .await;
    // Not Steward's at all.
    app.seed_sandbox(
        json!({"sandboxID": "other8", "templateID": "base", "state": "running",
        "startedAt": an_hour_ago().to_rfc3339()}),
    )
    .await;

    let report = orphans_once(&svc, &settings(&app, "replica-a"), LEASE, Utc::now())
        .await
        .unwrap();
    assert!(report.ran);
    assert_eq!(report.listed, 3, "{report:?}");
    assert!(report.acted.is_empty(), "{report:?}");
    for id in ["busy4", "cased5", "restored6", "young7", "other8"] {
        assert!(exists(&app, id).await, "{id}");
        assert!(
            audit_of(&app, id)
                .await
                .iter()
                .all(|a| !a.starts_with("orphan")),
            "{id}"
        );
    }
    assert_eq!(
        app.state.store.get_case(&case5).await.unwrap().state,
        CaseState::Pending
    );
    assert_eq!(kills(&app).await, 0);
}

#[tokio::test]
async fn two_replicas_act_on_an_orphan_once() {
    let first = spawn_app_with(options()).await;
    let second = first.spawn_peer(options()).await;
    seed(&first, "orphan9", run_metadata("run_gone9"), an_hour_ago()).await;
    let (a, b) = (first.state.services(), second.state.services());
    let (sa, sb) = (
        settings(&first, "replica-a"),
        settings(&second, "replica-b"),
    );
    let (ra, rb) = tokio::join!(
        orphans_once(&a, &sa, LEASE, Utc::now()),
        orphans_once(&b, &sb, LEASE, Utc::now()),
    );
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    assert_eq!(
        [ra.ran, rb.ran].iter().filter(|r| **r).count(),
        1,
        "one replica leads: {ra:?} {rb:?}"
    );
    assert_eq!(ra.acted.len() + rb.acted.len(), 1);
    eventually("the orphan is killed", || async {
        !exists(&first, "orphan9").await
    })
    .await;
    // The lead stays with its holder; the other replica's next pass is still a no-op.
    let later = orphans_once(&b, &sb, LEASE, Utc::now()).await.unwrap();
    let leader_again = orphans_once(&a, &sa, LEASE, Utc::now()).await.unwrap();
    assert!(later.acted.is_empty() && leader_again.acted.is_empty());
    assert_eq!(kills(&first).await, 1);
    let orphan_lines = audit_of(&first, "orphan9")
        .await
        .into_iter()
        .filter(|a| a.starts_with("orphan "))
        .count();
    assert_eq!(orphan_lines, 1);
}
