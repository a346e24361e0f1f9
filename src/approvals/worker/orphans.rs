//! The orphan reconciler: every sandbox Steward created for a run is accounted for, whatever
//! crashed when. [`orphans_once`] lists the sandboxes carrying Steward's run metadata
//! (`steward.run`) and, for each that has no open case and never had one, looks at its run:
//!
//! - the run is still queued or running (or its lease is held), or ended less than
//!   [`OrphanSettings::grace`] ago (its hand-over may be under way): left alone;
//! - the run ended but its sandbox was never handed over (a replica died between the end and
//!   the hand-over, or gave up): the run's job is queued again, so the engine hands it over as it
//!   would have, through the same code: a run case that asks (or `[runs] on_finish`), a push
//!   test's outcome, or, for a run that failed before its command started, a kill by
//!   [`super::super::run_case::UNSTARTED_RULE`];
//! - the run's record is gone (it is kept a week), or the run used another sandbox: nothing of
//!   the run can be shown or asked about, so the sandbox is ended by [`ORPHAN_RULE`] through a
//!   run case decided Kill by rule, which the worker carries out after its re-check.
//!
//! A sandbox restored from a case's snapshot (`steward.restored_from`) carries the original's
//! metadata but belongs to whoever restored it: never touched. Every sandbox acted on is audited
//! (`orphan`, by `Steward { part: "orphans" }`) with what was done and why, and marked in the
//! store for [`ACTED_MARK_TTL`] so it is acted on once across replicas and passes. One replica
//! runs the pass at a time (the `orphans` lease). This file must not call a destructive E2B
//! endpoint: a kill only ever happens through a case the worker executes.
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::super::run_case::{self, ORPHAN_RULE, RunCaseSettings};
use super::super::{ApprovalError, Services};
use super::restore::RESTORED_FROM;
use crate::cases::{RunOutcome, RunReport, Subject};
use crate::e2b::{E2bError, ListQuery, ListedSandbox, StateFilter};
use crate::ids::{CaseId, RunId, SandboxId};
use crate::runs::engine::{REQUESTER_METADATA_KEY, RUN_METADATA_KEY, run_lease};
use crate::runs::{Run, RunError, Runner};
use crate::store::{Actor, AuditEvent, Job, StoreError};

/// How often the pass runs by default.
pub const ORPHANS_EVERY: Duration = Duration::from_secs(5 * 60);
/// How long after its run ended (or its sandbox started) a sandbox is left to the normal
/// hand-over before the pass looks at it.
pub const ORPHAN_GRACE: Duration = Duration::from_secs(10 * 60);
/// The lease that makes one replica at a time run the pass.
pub const ORPHANS_LEASE: &str = "orphans";
/// How long a sandbox acted on is remembered, so no pass acts on it twice.
pub const ACTED_MARK_TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// What the pass runs with.
#[derive(Clone)]
pub struct OrphanSettings {
    /// Reads run records.
    pub runner: Runner,
    /// Where the case of a sandbox ended by rule goes (the run case's settings).
    pub run_cases: RunCaseSettings,
    /// See [`ORPHAN_GRACE`].
    pub grace: Duration,
    /// This replica's name, as the holder of [`ORPHANS_LEASE`].
    pub holder: String,
}

/// What the pass did to one sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OrphanAction {
    /// Its run ended without a hand-over: the run's job was queued again to hand it over.
    HandedOver { run: RunId },
    /// Ended by [`ORPHAN_RULE`] through this case (decided Kill by rule, queued for the worker).
    Ended { case: CaseId, why: String },
}

/// One pass's findings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OrphanReport {
    /// False when another replica holds the lease: this replica looked at nothing.
    pub ran: bool,
    /// Sandboxes with Steward's run metadata that E2B listed.
    pub listed: usize,
    pub acted: Vec<(SandboxId, OrphanAction)>,
}

/// Why a pass stopped.
#[derive(Debug, thiserror::Error)]
pub enum OrphanError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("E2B: {0}")]
    E2b(#[from] E2bError),
    #[error("run records: {0}")]
    Runs(String),
}

fn orphans_actor() -> Actor {
    Actor::Steward {
        part: "orphans".into(),
    }
}

/// Whether this replica may run the pass now: it takes the lease, or renews it if it holds it.
async fn lead(
    svc: &Services,
    settings: &OrphanSettings,
    ttl: Duration,
) -> Result<bool, StoreError> {
    if svc
        .store
        .acquire_lease(ORPHANS_LEASE, &settings.holder, ttl)
        .await?
    {
        return Ok(true);
    }
    svc.store
        .renew_lease(ORPHANS_LEASE, &settings.holder, ttl)
        .await
}

/// One pass at `now` (see the module doc). `lease` is how long this replica keeps the lead.
pub async fn orphans_once(
    svc: &Services,
    settings: &OrphanSettings,
    lease: Duration,
    now: DateTime<Utc>,
) -> Result<OrphanReport, OrphanError> {
    let mut report = OrphanReport::default();
    let Some(e2b) = &svc.e2b else {
        return Ok(report);
    };
    if !lead(svc, settings, lease).await? {
        return Ok(report);
    }
    report.ran = true;
    let query = ListQuery {
        state: StateFilter::Both,
        ..ListQuery::default()
    };
    let listed = e2b.list_sandboxes(&query).await?;
    let ours: Vec<ListedSandbox> = listed
        .items
        .into_iter()
        .filter(|s| {
            s.metadata.contains_key(RUN_METADATA_KEY) && !s.metadata.contains_key(RESTORED_FROM)
        })
        .collect();
    report.listed = ours.len();
    for sandbox in ours {
        // A replica that starts stopping finishes the sandbox in hand, not the list.
        if svc.draining.is_cancelled() {
            break;
        }
        if let Some(action) = judge(svc, settings, &sandbox, now).await? {
            report.acted.push((sandbox.sandbox_id.clone(), action));
        }
    }
    Ok(report)
}

/// `now - d`, clamped.
fn before(now: DateTime<Utc>, d: Duration) -> DateTime<Utc> {
    chrono::Duration::from_std(d)
        .ok()
        .and_then(|d| now.checked_sub_signed(d))
        .unwrap_or(DateTime::<Utc>::MIN_UTC)
}

/// Looks at one sandbox carrying `steward.run`; acts on it if it is an orphan.
async fn judge(
    svc: &Services,
    settings: &OrphanSettings,
    sandbox: &ListedSandbox,
    now: DateTime<Utc>,
) -> Result<Option<OrphanAction>, OrphanError> {
    let id = &sandbox.sandbox_id;
    let subject = Subject::Sandbox(id.clone());
    let settled = before(now, settings.grace);
    // Too young to judge: its run may still be creating it or handing it over.
    if sandbox.started_at > settled {
        return Ok(None);
    }
    if svc.store.case_for_subject(&subject).await?.is_some() {
        return Ok(None);
    }
    // A sandbox that ever had a case was handed over, and people (or a policy) decided what
    // became of it: kept, left, paused. Its run record may be gone since.
    let history = svc.store.audit_for_subject(&subject).await?;
    if history.iter().any(|e| e.case.is_some()) {
        return Ok(None);
    }
    let run_text = sandbox
        .metadata
        .get(RUN_METADATA_KEY)
        .cloned()
        .unwrap_or_default();
    let run = match RunId::parse(run_text.clone()) {
        Ok(run_id) => match settings.runner.get(&run_id).await {
            Ok(run) => Some(run),
            Err(RunError::NotFound(_)) => None,
            Err(e) => return Err(OrphanError::Runs(e.to_string())),
        },
        Err(_) => None,
    };
    let why = match &run {
        Some(run) => {
            if !run.status.is_terminal()
                || svc.store.lease_held(&run_lease(&run.id)).await?
                || run.finished_at.is_some_and(|at| at > settled)
            {
                return Ok(None);
            }
            match &run.sandbox_id {
                Some(used) if used != id => format!(
                    "run {} used sandbox {used}, not this one, so nothing of the run is here to decide on",
                    run.id
                ),
                _ if run.handed_over => return Ok(None),
                _ => return hand_over_again(svc, id, run).await,
            }
        }
        None => format!(
            "the record of run `{run_text}` is gone, so nothing of the run can be shown or decided on"
        ),
    };
    if !first_time(svc, id).await? {
        return Ok(None);
    }
    let report = orphan_report(sandbox, run.as_ref(), &run_text);
    let case = match run_case::end_run_sandbox_by_rule(
        svc,
        id,
        report,
        ORPHAN_RULE,
        &settings.run_cases,
        now,
    )
    .await
    {
        Ok(case) => case,
        // Gone meanwhile: nothing left to end.
        Err(ApprovalError::Gone(_)) => return Ok(None),
        Err(e) => {
            forget(svc, id).await;
            tracing::warn!(sandbox = %id, error = %e, "could not end an orphaned sandbox; the next pass tries again");
            return Ok(None);
        }
    };
    audit(
        svc,
        id,
        Some(case.id.clone()),
        format!(
            "ended by rule ({ORPHAN_RULE}) through case {}: {why}",
            case.id
        ),
    )
    .await;
    Ok(Some(OrphanAction::Ended { case: case.id, why }))
}

/// A run that ended without handing its sandbox over: its job goes back on the queue, and the
/// engine hands it over as it would have.
async fn hand_over_again(
    svc: &Services,
    id: &SandboxId,
    run: &Run,
) -> Result<Option<OrphanAction>, OrphanError> {
    if !first_time(svc, id).await? {
        // Queued again by an earlier pass: the hand-over is that job's.
        return Ok(None);
    }
    let job = Job::Run {
        run_id: run.id.clone(),
    };
    if let Err(e) = svc.store.enqueue(&job).await {
        forget(svc, id).await;
        return Err(e.into());
    }
    audit(
        svc,
        id,
        None,
        format!(
            "run {} ended but its sandbox was never handed over; its hand-over was queued again (a run case, or the rule for its run, decides the sandbox)",
            run.id
        ),
    )
    .await;
    Ok(Some(OrphanAction::HandedOver {
        run: run.id.clone(),
    }))
}

/// What a run case ended by rule shows of the run: its record's, or what the sandbox's
/// metadata says when the record is gone.
fn orphan_report(sandbox: &ListedSandbox, run: Option<&Run>, run_text: &str) -> RunReport {
    let requester = sandbox
        .metadata
        .get(REQUESTER_METADATA_KEY)
        .cloned()
        .unwrap_or_else(|| "unknown".into());
    let run_id = run
        .map(|r| r.id.clone())
        .or_else(|| RunId::parse(run_text.to_owned()).ok())
        .unwrap_or_else(|| RunId::parse("run_unknown").expect("a valid run id"));
    RunReport {
        run_id,
        requester: run.map_or(requester, |r| r.requester.clone()),
        command: run.map_or_else(
            || "(unknown: the run's record is gone)".to_owned(),
            |r| r.command.clone(),
        ),
        template: sandbox.template_id.to_string(),
        exit_code: run.and_then(|r| r.exit_code),
        duration_ms: run.and_then(|r| r.duration_ms).unwrap_or(0),
        outcome: run.and_then(|r| r.outcome).unwrap_or(RunOutcome::Failed),
        output_tail: Vec::new(),
        output_bytes: 0,
        output_truncated: false,
        profile: None,
    }
}

fn mark(id: &SandboxId) -> String {
    format!("orphan:{id}")
}

async fn first_time(svc: &Services, id: &SandboxId) -> Result<bool, StoreError> {
    svc.store.first_time(&mark(id), ACTED_MARK_TTL).await
}

/// Forgets the mark of an action that did not happen, so the next pass tries again.
async fn forget(svc: &Services, id: &SandboxId) {
    if let Err(e) = svc.store.forget_first_time(&mark(id)).await {
        tracing::warn!(sandbox = %id, error = %e, "could not forget an orphan mark; the sandbox waits for it to expire");
    }
}

async fn audit(svc: &Services, id: &SandboxId, case: Option<CaseId>, outcome: String) {
    let event = AuditEvent {
        time: Utc::now(),
        case,
        subject: Some(Subject::Sandbox(id.clone())),
        actor: orphans_actor(),
        action: "orphan".into(),
        outcome,
    };
    if let Err(e) = svc.store.append_audit(&event).await {
        tracing::error!(sandbox = %id, error = %e, "could not write the audit log");
    }
}

/// Runs [`orphans_once`] every `every` until `shutdown` (the first pass after one period, so a
/// replica starting in a deploy does not race the hand-overs of the one it replaces).
pub async fn run_orphans(
    svc: Services,
    settings: OrphanSettings,
    every: Duration,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            () = tokio::time::sleep(every) => {}
        }
        // Not cut short by `shutdown`: a pass stops between sandboxes once the replica drains.
        match orphans_once(&svc, &settings, every * 2, Utc::now()).await {
            Ok(report) if !report.acted.is_empty() => {
                tracing::info!(
                    acted = report.acted.len(),
                    listed = report.listed,
                    "orphan pass acted on sandboxes"
                );
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "orphan pass failed; trying again later"),
        }
    }
}
