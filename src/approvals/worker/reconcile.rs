//! The reconcile pass: re-queues decided work whose job was lost (a replica died between
//! recording a decision and queueing it, or while running it). It must not run any step
//! itself: it only queues a job, which [`crate::jobs::execute_decision`] keeps from repeating
//! finished steps.
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::approvals::{Services, audit};
use crate::cases::CaseState;
use crate::ids::CaseId;
use crate::jobs;
use crate::store::{Actor, Job, StoreError, Unfinished};

/// How long a job left for a transient retry may take to come back before the reconcile pass
/// treats it as lost. The job stays unacknowledged in the queue and is taken over once it has
/// sat for the worker's `stale_after`; this is several of those.
pub const TRANSIENT_RETRY_WAIT: Duration = Duration::from_secs(15 * 60);

/// How long a decided case may go without a running job before the reconcile pass queues
/// another. Queueing normally follows the decision within milliseconds; the margin also covers
/// a job waiting its turn behind a busy queue, whose duplicate would be harmless but noisy.
pub const RECONCILE_GRACE: Duration = Duration::from_secs(2 * 60);

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
    crate::metrics::decisions_requeued(requeued.len());
    Ok(requeued)
}
