//! Restore: a sandbox killed by Snapshot, then kill is started again from its snapshot, with the
//! original metadata (plus `steward.restored_from = <case id>`), once per request. A delivery
//! after a crash first adopts the sandbox an earlier one created (found by that metadata), so a
//! request never starts two sandboxes. Creating a sandbox is not destructive: no re-check.
use chrono::Utc;

use super::super::{Services, audit, refresh_card};
use crate::cases::Event;
use crate::e2b::{E2bError, ListQuery, NewSandbox, StateFilter};
use crate::ids::{CaseId, SandboxId};
use crate::jobs::JobError;
use crate::store::{Actor, ClaimedJob, Job, StoreError, Updated};

/// The metadata key that ties a restored sandbox to its case.
pub const RESTORED_FROM: &str = "steward.restored_from";

fn worker() -> Actor {
    Actor::Steward {
        part: "worker".into(),
    }
}

/// Handles `Job::Restore`.
pub async fn handle_restore(svc: &Services, claimed: ClaimedJob) -> Result<(), JobError> {
    let case_id = match &claimed.job {
        Job::Restore { case_id } => case_id.clone(),
        _ => return Err(JobError::Permanent("not a restore job".into())),
    };
    let case_id = &case_id;
    let case = match svc.store.get_case(case_id).await {
        Ok(case) => case,
        Err(StoreError::NotFound(_)) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    let Some(restore) = &case.restore else {
        return Ok(());
    };
    let Some(request) = &restore.request else {
        return Ok(());
    };
    // Done, or failed for good: nothing left to do for this request.
    if request.sandbox.is_some() || request.error.is_some() {
        return Ok(());
    }
    let Some(e2b) = &svc.e2b else {
        let error = "E2B is not configured (E2B_API_KEY is not set)".to_owned();
        return failed(svc, case_id, error).await;
    };
    let adopted = match earlier_restore(e2b, case_id).await {
        Ok(found) => found,
        Err(e) if e.is_transient() => return Err(JobError::Transient(e.to_string())),
        Err(_) => None,
    };
    let sandbox = match adopted {
        Some(id) => id,
        None => {
            let mut req = NewSandbox::new(restore.snapshot.clone());
            req.metadata = case.evidence.metadata.clone();
            req.metadata
                .insert(RESTORED_FROM.into(), case_id.to_string());
            match e2b.create_sandbox(&req).await {
                Ok(created) => created.sandbox_id,
                Err(e) if e.is_transient() => return Err(JobError::Transient(e.to_string())),
                Err(e) => {
                    let error =
                        crate::execute::sentence(&format!("Snapshot {}", restore.snapshot), &e);
                    return failed(svc, case_id, error).await;
                }
            }
        }
    };
    let outcome = format!(
        "restored as sandbox {sandbox} from snapshot {}",
        restore.snapshot
    );
    record(svc, case_id, Event::Restored { sandbox }, outcome).await
}

/// A sandbox an earlier delivery of this request started, if any.
async fn earlier_restore(
    e2b: &crate::e2b::E2bClient,
    case_id: &CaseId,
) -> Result<Option<SandboxId>, E2bError> {
    let query = ListQuery {
        state: StateFilter::Both,
        metadata: vec![(RESTORED_FROM.into(), case_id.to_string())],
        ..ListQuery::default()
    };
    let listed = e2b.list_sandboxes(&query).await?;
    Ok(listed.items.into_iter().next().map(|s| s.sandbox_id))
}

async fn failed(svc: &Services, case_id: &CaseId, error: String) -> Result<(), JobError> {
    let outcome = format!("failed: {error}");
    record(svc, case_id, Event::RestoreFailed { error }, outcome).await
}

/// Records how the restore went, audits it and updates the card.
async fn record(
    svc: &Services,
    case_id: &CaseId,
    event: Event,
    outcome: String,
) -> Result<(), JobError> {
    match svc.store.apply_event(case_id, event, Utc::now()).await? {
        Updated::Applied(case) => {
            audit(&svc.store, &case, worker(), "restore", &outcome).await;
            refresh_card(&svc.store, &svc.slack, &svc.templates, &case).await;
        }
        // Another delivery recorded it first.
        Updated::Rejected { .. } => {}
    }
    Ok(())
}

/// Closes every restore window that ended by `now`: the card drops its Restore button and says
/// the snapshot stays. Safe on every replica at once (one close wins; the rest are rejected).
pub async fn close_due_windows(
    svc: &Services,
    now: chrono::DateTime<Utc>,
) -> Result<usize, StoreError> {
    let mut closed = 0;
    for id in svc.store.restore_due(now).await? {
        match svc.store.apply_event(&id, Event::CloseRestore, now).await {
            Ok(Updated::Applied(case)) => {
                closed += 1;
                let snapshot = case
                    .restore
                    .as_ref()
                    .map(|r| r.snapshot.to_string())
                    .unwrap_or_default();
                let outcome = format!("window closed; snapshot {snapshot} stays");
                audit(&svc.store, &case, worker(), "restore", &outcome).await;
                refresh_card(&svc.store, &svc.slack, &svc.templates, &case).await;
            }
            Ok(Updated::Rejected { .. }) | Err(StoreError::NotFound(_)) => {}
            Err(e) => return Err(e),
        }
        svc.store.unwatch_restore(&id).await?;
    }
    Ok(closed)
}
