//! The E2B side of a decision: the job handler every replica's worker runs, the expiry pass
//! that closes cases nobody decided, and the reconcile pass that re-queues decided work whose
//! job was lost (a replica died between recording a decision and queueing it).
//!
//! Before any destructive call the subject is read again: gone means "already gone", changed
//! means "ask again" (the case goes back to Pending with a refreshed card). Snapshot-then-kill
//! kills only after E2B lists the new snapshot. Every E2B call made for a case is audited.
//! This file must not decide who may do what: it only runs what the store says was decided.
use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::{Services, audit, evidence, refresh_card};
use crate::cases::{Case, CaseState, Step, StepOutcome, StepRecord, Subject};
use crate::e2b::{E2bClient, E2bError, SandboxState};
use crate::ids::CaseId;
use crate::jobs::{self, Job, JobError, StepFailure, StepLog, WorkerConfig};
use crate::store::{Actor, ClaimedJob, StoreError, Unfinished};

/// Deliveries of one job after which a transient E2B failure fails the case (with Retry)
/// instead of waiting for another attempt.
pub const MAX_TRANSIENT_DELIVERIES: u64 = 3;

/// How long a decided case may go without a running job before the reconcile pass queues
/// another. Queueing normally follows the decision within milliseconds; the margin also covers
/// a job waiting its turn behind a busy queue, whose duplicate would be harmless but noisy.
pub const RECONCILE_GRACE: Duration = Duration::from_secs(2 * 60);

/// How the background loops of one replica run.
#[derive(Debug, Clone)]
pub struct LoopSettings {
    /// Start the queue worker (off only in tests that play a worker by hand).
    pub worker_enabled: bool,
    pub worker: WorkerConfig,
    /// How often to look for cases past their deadline and for decided work without a job.
    pub expire_every: Duration,
}

impl LoopSettings {
    /// Defaults with a consumer name unique to this process.
    pub fn new() -> Self {
        let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "steward".into());
        let consumer = format!(
            "{host}-{}-{}",
            std::process::id(),
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        );
        Self {
            worker_enabled: true,
            worker: WorkerConfig::new(consumer),
            expire_every: Duration::from_secs(30),
        }
    }
}

impl Default for LoopSettings {
    fn default() -> Self {
        Self::new()
    }
}

fn worker_actor() -> Actor {
    Actor::Steward {
        part: "worker".into(),
    }
}

/// Audits one E2B call made for `case` and passes its result through.
async fn audited<T>(
    svc: &Services,
    case: &Case,
    call: &str,
    result: Result<T, E2bError>,
    describe: impl FnOnce(&T) -> String,
) -> Result<T, E2bError> {
    let outcome = match &result {
        Ok(value) => describe(value),
        Err(e) => format!("error: {e}"),
    };
    audit(
        &svc.store,
        case,
        worker_actor(),
        &format!("e2b:{call}"),
        &outcome,
    )
    .await;
    result
}

/// A failed E2B call as a step failure: transient ones are retried by a later delivery until
/// [`MAX_TRANSIENT_DELIVERIES`], then they fail the case like any other error.
fn failure(e: E2bError, deliveries: u64) -> StepFailure {
    if e.is_transient() && deliveries < MAX_TRANSIENT_DELIVERIES {
        StepFailure::Transient(e.to_string())
    } else {
        StepFailure::Permanent(e.to_string())
    }
}

/// Re-reads a sandbox before a destructive step. `Ok(None)`: it is gone.
async fn reread_sandbox(
    svc: &Services,
    e2b: &E2bClient,
    case: &Case,
    id: &crate::ids::SandboxId,
) -> Result<Option<crate::cases::Evidence>, E2bError> {
    let read = e2b.get_sandbox(id).await;
    match audited(svc, case, "get_sandbox", read, |d| format!("{}", d.state)).await {
        Ok(detail) => Ok(Some(evidence::from_detail(&detail, None))),
        Err(E2bError::NotFound { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Runs one step of `case`'s plan. `done` are the steps already finished.
async fn run_step(
    svc: &Services,
    case: &Case,
    step: Step,
    done: &[StepRecord],
    deliveries: u64,
) -> Result<StepOutcome, StepFailure> {
    let Some(e2b) = svc.e2b.as_ref() else {
        return Err(StepFailure::Permanent(
            "E2B is not configured (E2B_API_KEY is not set)".into(),
        ));
    };
    let fail = |e| failure(e, deliveries);
    match (&case.subject, step) {
        (Subject::Sandbox(id), Step::Snapshot | Step::Kill | Step::Pause) => {
            let Some(current) = reread_sandbox(svc, e2b, case, id).await.map_err(fail)? else {
                return Ok(StepOutcome::AlreadyGone);
            };
            // Only the first step compares evidence: later ones follow our own snapshot,
            // which may itself have changed the sandbox's state.
            if done.is_empty()
                && let Some(change) = case
                    .evidence
                    .staleness(&evidence::comparable(&case.evidence, current.clone()))
            {
                return Err(StepFailure::EvidenceChanged {
                    evidence: Box::new(current),
                    note: format!(
                        "Asked again: {change} since the card was posted, so nothing was done."
                    ),
                    decide_by: svc.policy.decide_by(Utc::now()),
                });
            }
            match step {
                Step::Snapshot => {
                    let made = e2b.create_snapshot(id, None).await;
                    let info = audited(svc, case, "create_snapshot", made, |s| {
                        format!("snapshot {}", s.snapshot_id)
                    })
                    .await;
                    match info {
                        Ok(info) => Ok(StepOutcome::SnapshotCreated {
                            snapshot_id: info.snapshot_id,
                        }),
                        Err(E2bError::NotFound { .. }) => Ok(StepOutcome::AlreadyGone),
                        Err(e) => Err(fail(e)),
                    }
                }
                Step::Kill => {
                    let killed = e2b.kill_sandbox(id).await;
                    match audited(svc, case, "kill_sandbox", killed, |_| "ok".into()).await {
                        Ok(()) => Ok(StepOutcome::Killed),
                        Err(E2bError::NotFound { .. }) => Ok(StepOutcome::AlreadyGone),
                        Err(e) => Err(fail(e)),
                    }
                }
                _ => {
                    if current.state.as_deref() == Some(SandboxState::Paused.as_str()) {
                        return Ok(StepOutcome::AlreadyPaused);
                    }
                    let paused = e2b.pause_sandbox(id).await;
                    match audited(svc, case, "pause_sandbox", paused, |_| "ok".into()).await {
                        Ok(()) => Ok(StepOutcome::Paused),
                        Err(E2bError::Conflict { .. }) => Ok(StepOutcome::AlreadyPaused),
                        Err(E2bError::NotFound { .. }) => Ok(StepOutcome::AlreadyGone),
                        Err(e) => Err(fail(e)),
                    }
                }
            }
        }
        (Subject::Sandbox(id), Step::VerifySnapshot) => {
            let Some(snapshot_id) = done.iter().find_map(|r| match &r.outcome {
                StepOutcome::SnapshotCreated { snapshot_id } => Some(snapshot_id.clone()),
                _ => None,
            }) else {
                return Err(StepFailure::Permanent(
                    "no snapshot was recorded, so there is nothing to verify".into(),
                ));
            };
            let listed = e2b.list_snapshots(Some(id)).await;
            let listed = audited(svc, case, "list_snapshots", listed, |l| {
                format!("{} snapshot(s)", l.items.len())
            })
            .await
            .map_err(fail)?;
            if listed.items.iter().any(|s| s.snapshot_id == snapshot_id) {
                Ok(StepOutcome::SnapshotVerified { snapshot_id })
            } else {
                Err(StepFailure::Permanent(format!(
                    "snapshot {snapshot_id} does not appear in E2B's snapshot list, so the sandbox was not killed"
                )))
            }
        }
        (Subject::Template(id), Step::DeleteTemplate) => {
            let read = e2b.get_template(id).await;
            match audited(svc, case, "get_template", read, |_| "found".into()).await {
                Ok(_) => {}
                Err(E2bError::NotFound { .. }) => return Ok(StepOutcome::AlreadyGone),
                Err(e) => return Err(fail(e)),
            }
            let users = evidence::template_sandboxes(e2b, id).await;
            let users = audited(svc, case, "list_sandboxes", users, |u| {
                format!("{} sandbox(es) use it", u.len())
            })
            .await
            .map_err(fail)?;
            let before = case
                .evidence
                .template_usage
                .as_ref()
                .map(|u| u.sandboxes.len())
                .unwrap_or(0);
            if users.len() != before {
                let mut current = case.evidence.clone();
                let mut usage = current.template_usage.clone().unwrap_or_default();
                usage.sandboxes = users;
                current.template_usage = Some(usage);
                return Err(StepFailure::EvidenceChanged {
                    note: format!(
                        "Asked again: {} sandbox(es) use the template now, not {before}, so nothing was done.",
                        current
                            .template_usage
                            .as_ref()
                            .map(|u| u.sandboxes.len())
                            .unwrap_or(0)
                    ),
                    evidence: Box::new(current),
                    decide_by: svc.policy.decide_by(Utc::now()),
                });
            }
            let deleted = e2b.delete_template(id).await;
            match audited(svc, case, "delete_template", deleted, |_| "ok".into()).await {
                Ok(()) => Ok(StepOutcome::TemplateDeleted),
                Err(E2bError::NotFound { .. }) => Ok(StepOutcome::AlreadyGone),
                Err(e) => Err(fail(e)),
            }
        }
        (subject, step) => Err(StepFailure::Permanent(format!(
            "step {} does not apply to {subject}",
            step.as_str()
        ))),
    }
}

/// Runs one queued decision to its end and shows the result on the card.
pub async fn handle_job(
    svc: &Services,
    claimed: ClaimedJob,
    _log: StepLog,
) -> Result<(), JobError> {
    let case_id = claimed.job.case_id().clone();
    let before = svc.store.get_case(&case_id).await?;
    let deliveries = claimed.deliveries;
    let result = jobs::execute_decision(&svc.store, &case_id, |step, done| {
        let svc = svc.clone();
        let case = before.clone();
        async move { run_step(&svc, &case, step, &done, deliveries).await }
    })
    .await;
    if matches!(result, Err(JobError::Transient(_))) {
        return result.map(|_| ());
    }
    let after = match svc.store.get_case(&case_id).await {
        Ok(case) => case,
        Err(e) => {
            tracing::error!(case = %case_id, error = %e, "could not read the case after its job");
            return result.map(|_| ());
        }
    };
    // A duplicate job finds the case already finished: nothing new to show.
    if after.version != before.version {
        let (action, outcome) = match &after.state {
            CaseState::Done { .. } => ("finish", "done".to_owned()),
            CaseState::Failed { error, .. } => ("fail", error.clone()),
            CaseState::Pending => (
                "ask_again",
                after
                    .notes
                    .last()
                    .map(|n| n.text.clone())
                    .unwrap_or_default(),
            ),
            other => ("stop", other.name().to_owned()),
        };
        audit(&svc.store, &after, worker_actor(), action, &outcome).await;
        refresh_card(&svc.slack, &svc.templates, &after).await;
    }
    result.map(|_| ())
}

/// Runs this replica's queue worker until `shutdown`.
pub async fn run_worker(svc: Services, config: WorkerConfig, shutdown: impl Future<Output = ()>) {
    let store = svc.store.clone();
    let handler = move |claimed: ClaimedJob, log: StepLog| {
        let svc = svc.clone();
        async move { handle_job(&svc, claimed, log).await }
    };
    jobs::run_worker(store, config, handler, shutdown).await;
}

/// One expiry pass: expires every pending case past its deadline (each by exactly one
/// replica) and rewrites their cards. Returns the cases this pass expired.
pub async fn expire_once(svc: &Services, now: DateTime<Utc>) -> Result<Vec<Case>, StoreError> {
    let expired = svc.store.expire_due(now).await?;
    for case in &expired {
        audit(
            &svc.store,
            case,
            Actor::Steward {
                part: "expiry".into(),
            },
            "expire",
            &format!("no decision by {}: no action was taken", case.decide_by),
        )
        .await;
        refresh_card(&svc.slack, &svc.templates, case).await;
    }
    Ok(expired)
}

/// One reconcile pass: queues a job again for every case that entered Decided more than
/// [`RECONCILE_GRACE`] before `now`, is still Decided or Executing, and that no worker is
/// running (its execution lease is free). Returns the cases it re-queued.
///
/// Every replica runs this; the case's index time moves to `now` when it is re-queued, so one
/// replica queues it, at most once per grace period. A job that was not lost after all (still queued, or pending with a
/// dead worker) meets its duplicate in [`jobs::execute_decision`], which runs a case on one
/// worker at a time and resumes after the last finished step, so nothing runs twice.
pub async fn reconcile_once(svc: &Services, now: DateTime<Utc>) -> Result<Vec<CaseId>, StoreError> {
    let grace = chrono::Duration::from_std(RECONCILE_GRACE).unwrap_or(chrono::Duration::MAX);
    let mut requeued = Vec::new();
    for Unfinished { case, since } in svc.store.unfinished_decided(now - grace).await? {
        let (CaseState::Decided {
            decision, attempt, ..
        }
        | CaseState::Executing {
            decision, attempt, ..
        }) = &case.state
        else {
            continue;
        };
        if svc
            .store
            .lease_held(&jobs::execution_lease(&case.id))
            .await?
        {
            continue;
        }
        // Moving the case's index time to `now` both picks one replica to queue it and gives
        // the new job a fresh grace period.
        if !svc.store.postpone_decided(&case.id, since, now).await? {
            continue;
        }
        let job = Job::RunDecision {
            case_id: case.id.clone(),
            option: decision.option,
            attempt: *attempt,
        };
        svc.store.enqueue(&job).await?;
        tracing::warn!(case = %case.id, state = case.state.name(), "re-queued decided work whose job was lost");
        audit(
            &svc.store,
            &case,
            Actor::Steward {
                part: "reconcile".into(),
            },
            "requeue",
            "re-queued after a lost job",
        )
        .await;
        requeued.push(case.id.clone());
    }
    Ok(requeued)
}

/// Runs [`expire_once`] and [`reconcile_once`] every `every` until `shutdown`.
pub async fn run_expiry(svc: Services, every: Duration, shutdown: impl Future<Output = ()>) {
    tokio::pin!(shutdown);
    loop {
        if let Err(e) = expire_once(&svc, Utc::now()).await {
            tracing::warn!(error = %e, "expiry pass failed");
        }
        if let Err(e) = reconcile_once(&svc, Utc::now()).await {
            tracing::warn!(error = %e, "reconcile pass failed");
        }
        super::repair::repair_cards(&svc).await;
        tokio::select! {
            () = &mut shutdown => break,
            () = tokio::time::sleep(every) => {}
        }
    }
}
