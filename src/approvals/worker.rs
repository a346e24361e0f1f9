//! The E2B side of a decision: the job handler every replica's worker runs, the expiry pass
//! that closes cases nobody decided, and the reconcile pass that re-queues decided work whose
//! job was lost (a replica died between recording a decision and queueing it).
//!
//! Before the first step and before every kill or template delete (retries included) the
//! subject is re-checked against what people decided on ([`recheck`]): a sandbox with a fresh
//! metrics read, a template from complete listings of its users. Gone means "already gone",
//! changed means "ask again" (the case goes back to Pending with a refreshed card).
//! Snapshot-then-kill kills only after E2B lists the new snapshot, which is named after the
//! decision so a retry after a lost answer adopts it rather than taking another. Every E2B call
//! made for a case is audited.
//! This file must not decide who may do what: it only runs what the store says was decided.
use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::{Services, audit, evidence, refresh_card};
use crate::cases::{Case, CaseState, Evidence, Step, StepOutcome, StepRecord, Subject, recheck};
use crate::e2b::{E2bClient, E2bError, SandboxDetail, SandboxMetric, SandboxState, SnapshotInfo};
use crate::ids::{CaseId, SandboxId, TemplateId};
use crate::jobs::{self, JobError, StepFailure, StepLog, WorkerConfig};
use crate::store::Job;
use crate::store::{Actor, ClaimedJob, StoreError, Unfinished};

pub use crate::jobs::MAX_TRANSIENT_FAILURES;

/// How long a job left for a transient retry may take to come back before the reconcile pass
/// treats it as lost. The job stays unacknowledged in the queue and is taken over once it has
/// sat for the worker's `stale_after`; this is several of those.
pub const TRANSIENT_RETRY_WAIT: Duration = Duration::from_secs(15 * 60);

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

/// A failed E2B call as a step failure: transient ones are left for a later delivery (the job
/// counts them, see [`MAX_TRANSIENT_FAILURES`]); the rest fail the case.
fn failure(e: E2bError) -> StepFailure {
    if e.is_transient() {
        StepFailure::Transient(e.to_string())
    } else {
        StepFailure::Permanent(e.to_string())
    }
}

/// "Asked again" with the fresh evidence: the case goes back to people.
fn ask_again(svc: &Services, evidence: Evidence, change: &str, done: &str) -> StepFailure {
    StepFailure::EvidenceChanged {
        evidence: Box::new(evidence),
        note: format!("Asked again: {change} since the decision, so {done}."),
        decide_by: svc.policy.decide_by(Utc::now()),
    }
}

/// Re-reads a sandbox before a step. `Ok(None)`: it is gone.
async fn reread_sandbox(
    svc: &Services,
    e2b: &E2bClient,
    case: &Case,
    id: &SandboxId,
) -> Result<Option<SandboxDetail>, E2bError> {
    let read = e2b.get_sandbox(id).await;
    match audited(svc, case, "get_sandbox", read, |d| format!("{}", d.state)).await {
        Ok(detail) => Ok(Some(detail)),
        Err(E2bError::NotFound { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// How far back the re-check reads metrics at least: E2B samples every few seconds, so a
/// decision taken a moment ago still gets a handful of samples.
const RECHECK_METRICS_WINDOW_SECS: i64 = 60;
/// How far back it reads at most, for a decision taken long ago.
const RECHECK_METRICS_MAX_SECS: i64 = 60 * 60;

/// Fresh metrics samples of a sandbox since the decision (at least the last minute). Empty when
/// E2B has none; a failed read is an error, so nothing is killed on a guess.
async fn fresh_metrics(
    svc: &Services,
    e2b: &E2bClient,
    case: &Case,
    id: &SandboxId,
) -> Result<Vec<SandboxMetric>, E2bError> {
    let now = Utc::now();
    let decided = case.state.decision().map_or(now, |d| d.at);
    let start = decided
        .min(now - chrono::Duration::seconds(RECHECK_METRICS_WINDOW_SECS))
        .max(now - chrono::Duration::seconds(RECHECK_METRICS_MAX_SECS));
    let read = e2b.sandbox_metrics(id, Some(start), Some(now)).await;
    audited(svc, case, "get_metrics", read, |samples| {
        match samples
            .iter()
            .map(|m| m.cpu_used_pct)
            .fold(None::<f64>, |a, c| Some(a.map_or(c, |a| a.max(c))))
        {
            Some(busiest) => format!("{} sample(s), cpu up to {busiest:.1} %", samples.len()),
            None => "no samples".into(),
        }
    })
    .await
}

/// The snapshot name this decision's snapshot is taken under, so a retry after an answer that
/// was lost (a 502 after E2B acted) finds it instead of taking a second one.
pub fn snapshot_name(case: &Case) -> String {
    let decided = case.state.decision().map_or(0, |d| d.at.timestamp());
    format!(
        "steward-{}-{decided}",
        case.id.as_str().replace('_', "-").to_lowercase()
    )
}

/// Whether E2B lists `info` under `name` (`team/name:tag`, or `name:tag`).
fn snapshot_named(info: &SnapshotInfo, name: &str) -> bool {
    info.names.iter().any(|full| {
        let untagged = full.split(':').next().unwrap_or(full);
        untagged.rsplit('/').next() == Some(name)
    })
}

/// The re-check before a step on a sandbox: the sandbox must still be there and, before the
/// first step and before every kill, look as it did when people decided (see
/// [`recheck::sandbox_changes`]). `Ok(None)`: it is gone.
async fn recheck_sandbox(
    svc: &Services,
    e2b: &E2bClient,
    case: &Case,
    id: &SandboxId,
    step: Step,
    done: &[StepRecord],
) -> Result<Option<Evidence>, StepFailure> {
    let Some(detail) = reread_sandbox(svc, e2b, case, id).await.map_err(failure)? else {
        return Ok(None);
    };
    if !done.is_empty() && step != Step::Kill {
        return Ok(Some(evidence::from_detail(&detail, None)));
    }
    let samples = if detail.state == SandboxState::Running {
        fresh_metrics(svc, e2b, case, id).await.map_err(failure)?
    } else {
        Vec::new()
    };
    let busiest = samples
        .iter()
        .map(|m| m.cpu_used_pct)
        .fold(None::<f64>, |a, c| Some(a.map_or(c, |a| a.max(c))));
    let current = evidence::from_detail(&detail, samples.iter().max_by_key(|m| m.timestamp_unix));
    let own_snapshot_at = done.iter().find_map(|r| match r.outcome {
        StepOutcome::SnapshotCreated { .. } => Some(r.at),
        _ => None,
    });
    let threshold = svc.busy_above.for_template(detail.template_id.as_str());
    let change = recheck::sandbox_changes(
        &case.evidence,
        &current,
        own_snapshot_at,
        busiest,
        threshold,
    );
    if let Some(change) = change {
        let done = match done.iter().find_map(|r| match &r.outcome {
            StepOutcome::SnapshotCreated { snapshot_id } => Some(snapshot_id),
            _ => None,
        }) {
            Some(snapshot) => format!("it was not killed (its snapshot {snapshot} is kept)"),
            None => "nothing was done".to_owned(),
        };
        return Err(ask_again(svc, current, &change, &done));
    }
    Ok(Some(current))
}

/// The snapshot an earlier attempt of this decision took although its answer was lost (a 502
/// after E2B acted), if E2B lists one under [`snapshot_name`].
async fn own_snapshot(
    svc: &Services,
    e2b: &E2bClient,
    case: &Case,
    id: &SandboxId,
) -> Result<Option<TemplateId>, StepFailure> {
    let name = snapshot_name(case);
    let listed = e2b.list_snapshots(Some(id)).await;
    let listed = audited(svc, case, "list_snapshots", listed, |l| {
        format!("{} snapshot(s)", l.items.len())
    })
    .await
    .map_err(failure)?;
    Ok(listed
        .items
        .into_iter()
        .find(|s| snapshot_named(s, &name))
        .map(|s| s.snapshot_id))
}

/// The Snapshot step's call, under this decision's snapshot name.
async fn take_snapshot(
    svc: &Services,
    e2b: &E2bClient,
    case: &Case,
    id: &SandboxId,
) -> Result<StepOutcome, StepFailure> {
    let made = e2b.create_snapshot(id, Some(&snapshot_name(case))).await;
    let info = audited(svc, case, "create_snapshot", made, |s| {
        format!("snapshot {}", s.snapshot_id)
    })
    .await;
    match info {
        Ok(info) => Ok(StepOutcome::SnapshotCreated {
            snapshot_id: info.snapshot_id,
        }),
        Err(E2bError::NotFound { .. }) => Ok(StepOutcome::AlreadyGone),
        Err(e) => Err(failure(e)),
    }
}

/// Runs one step of `case`'s plan. `done` are the steps already finished.
async fn run_step(
    svc: &Services,
    case: &Case,
    step: Step,
    done: &[StepRecord],
) -> Result<StepOutcome, StepFailure> {
    let Some(e2b) = svc.e2b.as_ref() else {
        return Err(StepFailure::Permanent(
            "E2B is not configured (E2B_API_KEY is not set)".into(),
        ));
    };
    match (&case.subject, step) {
        (Subject::Sandbox(id), Step::Snapshot | Step::Kill | Step::Pause) => {
            // An earlier delivery may have taken the snapshot without learning so: one that
            // failed transiently at this step, or a worker that died while executing.
            let snapshot_may_exist = matches!(case.state, CaseState::Executing { .. })
                || case
                    .retrying
                    .as_ref()
                    .is_some_and(|r| r.step == Step::Snapshot);
            if step == Step::Snapshot
                && snapshot_may_exist
                && let Some(snapshot_id) = own_snapshot(svc, e2b, case, id).await?
            {
                // Taken already: its answer was lost. (The brief pause of that snapshot also
                // makes the sandbox look restarted, which the kill's re-check allows for.)
                return Ok(StepOutcome::SnapshotCreated { snapshot_id });
            }
            let Some(current) = recheck_sandbox(svc, e2b, case, id, step, done).await? else {
                // Gone after a kill whose answer was lost (a 502 after E2B acted): that kill
                // did it, so the case is done, not "already gone" and not failed.
                let our_kill = step == Step::Kill
                    && case.retrying.as_ref().is_some_and(|r| r.step == Step::Kill);
                return Ok(if our_kill {
                    StepOutcome::Killed
                } else {
                    StepOutcome::AlreadyGone
                });
            };
            match step {
                Step::Snapshot => take_snapshot(svc, e2b, case, id).await,
                Step::Kill => {
                    let killed = e2b.kill_sandbox(id).await;
                    match audited(svc, case, "kill_sandbox", killed, |_| "ok".into()).await {
                        Ok(()) => Ok(StepOutcome::Killed),
                        Err(E2bError::NotFound { .. }) => Ok(StepOutcome::AlreadyGone),
                        Err(e) => Err(failure(e)),
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
                        Err(e) => Err(failure(e)),
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
            .map_err(failure)?;
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
                Err(e) => return Err(failure(e)),
            }
            let usage = evidence::template_usage(e2b, id).await;
            let usage = audited(svc, case, "list_template_users", usage, |u| {
                format!(
                    "{} sandbox(es), {} snapshot(s)",
                    u.sandboxes.len(),
                    u.snapshots
                )
            })
            .await
            .map_err(|e| match e {
                E2bError::Incomplete(stop) => StepFailure::Permanent(format!(
                    "Steward could not tell who uses the template ({stop}), so it was not deleted"
                )),
                e => failure(e),
            })?;
            let decided = case.evidence.template_usage.clone().unwrap_or_default();
            if let Some(change) = recheck::template_changes(&decided, &usage) {
                let mut current = case.evidence.clone();
                current.template_usage = Some(usage);
                return Err(ask_again(svc, current, &change, "nothing was done"));
            }
            let deleted = e2b.delete_template(id).await;
            match audited(svc, case, "delete_template", deleted, |_| "ok".into()).await {
                Ok(()) => Ok(StepOutcome::TemplateDeleted),
                Err(E2bError::NotFound { .. }) => Ok(StepOutcome::AlreadyGone),
                Err(e) => Err(failure(e)),
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
    let result = jobs::execute_decision(&svc.store, &case_id, |step, done| {
        let svc = svc.clone();
        let case = before.clone();
        async move { run_step(&svc, &case, step, &done).await }
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
    jobs::run_queue(store, config, handler, shutdown).await;
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
/// running (its execution lease is free) and whose job is not waiting out a transient failure
/// (within [`TRANSIENT_RETRY_WAIT`] of it). Returns the cases it re-queued.
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
        // A job left for a transient retry is still queued: it comes back by itself.
        let retry_wait =
            chrono::Duration::from_std(TRANSIENT_RETRY_WAIT).unwrap_or(chrono::Duration::MAX);
        if case
            .retrying
            .as_ref()
            .is_some_and(|r| r.attempt == *attempt && r.at > now - retry_wait)
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
