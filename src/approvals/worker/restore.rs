//! Restore: a sandbox killed by Snapshot, then kill is started again from its snapshot, with the
//! original metadata (plus `steward.restored_from = <case id>`), once per request. A delivery
//! after a crash first adopts the sandbox an earlier one created (found by that metadata), so a
//! request never starts two sandboxes. Creating a sandbox is not destructive: no re-check.
//! The restored sandbox gets [`restore_timeout`]: `[approvals] restored_timeout`, or the life
//! the original had left when it was snapshotted if that was longer (E2B's default of five
//! minutes would end it before anyone connected). [`keep_restored_longer`] is the card's Keep
//! longer: the same timeout again from now, never a shorter one.
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::super::{Services, audit, refresh_card};
use crate::cases::{Case, Event};
use crate::e2b::{E2bError, ListQuery, NewSandbox, SandboxState, StateFilter};
use crate::ids::{CaseId, SandboxId, SlackUserId};
use crate::jobs::JobError;
use crate::slack::format::{human_duration, when};
use crate::store::{Actor, AuditEvent, ClaimedJob, Job, StoreError, Updated};

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
    let timeout = restore_timeout(svc.policy.restored_timeout, restore.life_left_secs);
    let (sandbox, ends_at) = match adopted {
        Some(found) => found,
        None => {
            let mut req = NewSandbox::new(restore.snapshot.clone());
            req.metadata = case.evidence.metadata.clone();
            req.metadata
                .insert(RESTORED_FROM.into(), case_id.to_string());
            req.timeout = Some(timeout);
            let asked_at = Utc::now();
            match e2b.create_sandbox(&req).await {
                Ok(created) => (created.sandbox_id, ends_after(asked_at, timeout)),
                Err(e) if e.is_transient() => return Err(JobError::Transient(e.to_string())),
                Err(e) => {
                    let error =
                        crate::execute::sentence(&format!("Snapshot {}", restore.snapshot), &e);
                    return failed(svc, case_id, error).await;
                }
            }
        }
    };
    // E2B caps a sandbox's life, so the card says the end E2B reports when it can be read.
    let ends_at = match e2b.get_sandbox(&sandbox).await {
        Ok(detail) => Some(detail.end_at),
        Err(_) => ends_at,
    };
    let outcome = format!(
        "restored as sandbox {sandbox} from snapshot {}; it runs until {} (timeout {})",
        restore.snapshot,
        ends_at.map_or_else(|| "an end E2B did not say".to_owned(), when),
        human_duration(timeout),
    );
    record(svc, case_id, Event::Restored { sandbox, ends_at }, outcome).await
}

/// The timeout a restored sandbox is started with: `[approvals] restored_timeout`, or what
/// the original had left when it was snapshotted (`life_left_secs`) when that is longer.
pub fn restore_timeout(restored_timeout: Duration, life_left_secs: Option<u64>) -> Duration {
    life_left_secs
        .map(Duration::from_secs)
        .map_or(restored_timeout, |left| left.max(restored_timeout))
}

/// `at` plus `timeout`, clamped to a far but valid time.
fn ends_after(at: DateTime<Utc>, timeout: Duration) -> Option<DateTime<Utc>> {
    chrono::Duration::from_std(timeout)
        .ok()
        .and_then(|d| at.checked_add_signed(d))
}

/// A sandbox an earlier delivery of this request started, if any, and when it ends.
async fn earlier_restore(
    e2b: &crate::e2b::E2bClient,
    case_id: &CaseId,
) -> Result<Option<(SandboxId, Option<DateTime<Utc>>)>, E2bError> {
    let query = ListQuery {
        state: StateFilter::Both,
        metadata: vec![(RESTORED_FROM.into(), case_id.to_string())],
        ..ListQuery::default()
    };
    let listed = e2b.list_sandboxes(&query).await?;
    Ok(listed
        .items
        .into_iter()
        .next()
        .map(|s| (s.sandbox_id, Some(s.end_at))))
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

/// The card's Keep longer, for `user` (already allowed by the caller): the restored sandbox
/// ends `[approvals] restored_timeout` after the later of now and its current end. It only
/// ever extends. The ask is audited before E2B hears of it (so when Redis is down nothing is
/// changed), then what came of it; the card shows the new end. `Err` is the sentence for the
/// person who clicked.
pub async fn keep_restored_longer(
    svc: &Services,
    case: &Case,
    user: &SlackUserId,
) -> Result<(), String> {
    let Some(restore) = case.restore.as_ref().filter(|r| r.keep_longer_offered()) else {
        return Err(
            "This card has no restored sandbox to keep longer (its restore window may have closed), so nothing was changed."
                .into(),
        );
    };
    let Some(sandbox) = restore.restored().cloned() else {
        return Err("This card has no restored sandbox yet, so nothing was changed.".into());
    };
    let Some(e2b) = &svc.e2b else {
        return Err(
            "E2B is not configured (E2B_API_KEY is not set), so nothing was changed.".into(),
        );
    };
    let keep_for = svc.policy.restored_timeout;
    let log = |outcome: String| AuditEvent {
        time: Utc::now(),
        case: Some(case.id.clone()),
        subject: Some(case.subject.clone()),
        actor: Actor::Person { user: user.clone() },
        action: "keep_longer".into(),
        outcome,
    };
    if let Err(e) = svc
        .store
        .append_audit(&log(format!(
            "asked for {} more for sandbox {sandbox}",
            human_duration(keep_for)
        )))
        .await
    {
        tracing::warn!(case = %case.id, error = %e, "keep longer refused: the audit log cannot be written");
        return Err("Steward can't write its audit log (Redis), so nothing was changed. Try again in a minute.".into());
    }
    let done = |outcome: String| {
        let event = log(outcome);
        async move {
            if let Err(e) = svc.store.append_audit(&event).await {
                tracing::error!(case = ?event.case, error = %e, "could not write the audit log");
            }
        }
    };
    let detail = match e2b.get_sandbox(&sandbox).await {
        Ok(detail) => detail,
        Err(E2bError::NotFound { .. }) => {
            done("refused: the sandbox has ended".into()).await;
            return Err(format!(
                "Sandbox `{sandbox}` has already ended, so there is nothing to keep longer. Nothing was changed."
            ));
        }
        Err(e) => {
            done(format!("error: {e}")).await;
            return Err(crate::execute::sentence(&format!("Sandbox {sandbox}"), &e));
        }
    };
    if detail.state == SandboxState::Paused {
        done("refused: the sandbox is paused".into()).await;
        return Err(format!(
            "Sandbox `{sandbox}` is paused, so it has no timeout to extend; resume it with `/sandbox resume {sandbox}` first. Nothing was changed."
        ));
    }
    let now = Utc::now();
    let from = detail.end_at.max(now);
    let wanted = ends_after(from, keep_for).unwrap_or(DateTime::<Utc>::MAX_UTC);
    let timeout = (wanted - now).to_std().unwrap_or(keep_for);
    match e2b.set_timeout(&sandbox, timeout).await {
        Ok(()) => {}
        Err(e) => {
            done(format!("error: {e}")).await;
            return Err(crate::execute::sentence(&format!("Sandbox {sandbox}"), &e));
        }
    }
    // E2B caps a sandbox's life: the card says the end E2B reports, else the one asked for.
    let until = match e2b.get_sandbox(&sandbox).await {
        Ok(detail) => detail.end_at,
        Err(_) => wanted,
    };
    done(format!(
        "kept sandbox {sandbox} until {} (was {})",
        when(until),
        when(detail.end_at)
    ))
    .await;
    let event = Event::KeepRestoredLonger {
        by: user.clone(),
        until,
    };
    match svc.store.apply_event(&case.id, event, Utc::now()).await {
        Ok(Updated::Applied(case)) => {
            refresh_card(&svc.store, &svc.slack, &svc.templates, &case).await;
            Ok(())
        }
        // The window closed meanwhile: the sandbox runs longer all the same.
        Ok(Updated::Rejected { .. }) => Ok(()),
        Err(e) => {
            tracing::warn!(case = %case.id, error = %e, "kept a restored sandbox longer but could not record it on the case");
            Err(format!(
                "Sandbox `{sandbox}` now runs until {}, but Steward could not show it on the card ({e}).",
                when(until)
            ))
        }
    }
}
