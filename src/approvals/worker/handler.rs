//! The job handler: runs one decided case's plan against E2B ([`handle_job`]) and shows the
//! result on the card.
//!
//! Before the first step and before every kill, shortening or template delete (retries included) the
//! subject is re-checked against what people decided on ([`recheck`]): a sandbox with a fresh
//! metrics read, a template from complete listings of its users. Gone means "already gone",
//! changed means "ask again" (the case goes back to Pending with a refreshed card).
//! Snapshot-then-kill kills only after E2B lists the new snapshot, which is named after the
//! decision so a retry after a lost answer adopts it rather than taking another. Every E2B call
//! made for a case is audited.
//! This file must not decide who may do what: it only runs what the store says was decided.
use chrono::{DateTime, Utc};

use crate::approvals::list::reading::Readings;
use crate::approvals::{Services, audit, evidence, refresh_card};
use crate::cases::{
    Case, CaseState, Decider, DecisionOption, Event, Evidence, Step, StepOutcome, StepRecord,
    Subject, recheck,
};
use crate::e2b::{E2bClient, E2bError, SandboxDetail, SandboxMetric, SandboxState, SnapshotInfo};
use crate::ids::{CaseId, SandboxId, TemplateId};
use crate::jobs::{self, JobError, StepFailure};
use crate::store::{Actor, ClaimedJob, Updated};

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
/// counts them, see [`jobs::MAX_TRANSIENT_FAILURES`]); the rest fail the case.
fn failure(e: E2bError) -> StepFailure {
    if e.is_transient() {
        StepFailure::Transient(e.to_string())
    } else {
        StepFailure::Permanent(e.to_string())
    }
}

/// What a step's E2B call came to: `done` on success, "already gone" when E2B no longer knows
/// the subject, otherwise a [`failure`].
fn step_outcome<T>(
    result: Result<T, E2bError>,
    done: impl FnOnce(T) -> StepOutcome,
) -> Result<StepOutcome, StepFailure> {
    match result {
        Ok(value) => Ok(done(value)),
        Err(E2bError::NotFound { .. }) => Ok(StepOutcome::AlreadyGone),
        Err(e) => Err(failure(e)),
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

/// The highest CPU share among `samples`, if there are any.
fn busiest_cpu(samples: &[SandboxMetric]) -> Option<f64> {
    samples
        .iter()
        .map(|m| m.cpu_used_pct)
        .fold(None, |a, c| Some(a.map_or(c, |a: f64| a.max(c))))
}

/// Fresh metrics samples of a sandbox since the decision (at least the last minute; for a run
/// case, no earlier than the case). Empty when E2B has none; a failed read is an error, so
/// nothing is killed on a guess.
async fn fresh_metrics(
    svc: &Services,
    e2b: &E2bClient,
    case: &Case,
    id: &SandboxId,
) -> Result<Vec<SandboxMetric>, E2bError> {
    let now = Utc::now();
    let decided = case.state.decision().map_or(now, |d| d.at);
    let mut start = decided
        .min(now - chrono::Duration::seconds(RECHECK_METRICS_WINDOW_SECS))
        .max(now - chrono::Duration::seconds(RECHECK_METRICS_MAX_SECS));
    // A run case opens as its run ends: the run's own CPU is what people decided on, not a
    // sign that someone is using the sandbox again, so only samples since the case count.
    if case.evidence.run.is_some() {
        start = start.max(case.created_at);
    }
    let read = e2b.sandbox_metrics(id, Some(start), Some(now)).await;
    audited(
        svc,
        case,
        "get_metrics",
        read,
        |samples| match busiest_cpu(samples) {
            Some(busiest) => format!("{} sample(s), cpu up to {busiest:.1} %", samples.len()),
            None => "no samples".into(),
        },
    )
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

/// The snapshot an earlier step of this decision recorded taking, if any.
fn recorded_snapshot(done: &[StepRecord]) -> Option<&TemplateId> {
    done.iter().find_map(|r| match &r.outcome {
        StepOutcome::SnapshotCreated { snapshot_id, .. } => Some(snapshot_id),
        _ => None,
    })
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
/// [`recheck::sandbox_changes`]). `Ok(None)`: it is gone. Beside the fresh evidence, the end
/// E2B has set for it.
async fn recheck_sandbox(
    svc: &Services,
    e2b: &E2bClient,
    case: &Case,
    id: &SandboxId,
    step: Step,
    done: &[StepRecord],
    readings: Option<&Readings>,
) -> Result<Option<(Evidence, DateTime<Utc>)>, StepFailure> {
    // A list's item, before its first step: the batched reading taken moments ago, when it
    // shows the sandbox (otherwise it is read on its own below). Not for a run's case, whose
    // samples must not predate the case.
    let batched = match readings {
        Some(readings) if done.is_empty() && case.evidence.run.is_none() => {
            readings.take(id, case.evidence.started_at).await
        }
        _ => None,
    };
    let (detail, batched_samples) = match batched {
        Some(read) => {
            let outcome = format!(
                "{}{} (read {} ms before, with {} other(s) of its group)",
                read.listed.state,
                read.metric
                    .as_ref()
                    .map_or_else(String::new, |m| format!(", cpu {:.1} %", m.cpu_used_pct)),
                read.at.elapsed().as_millis(),
                read.batch.saturating_sub(1),
            );
            audit(
                &svc.store,
                case,
                worker_actor(),
                "e2b:read_sandboxes_page",
                &outcome,
            )
            .await;
            let detail = SandboxDetail {
                listed: read.listed,
                envd_access_token: None,
                allow_internet_access: None,
                domain: None,
                network: None,
                lifecycle: None,
            };
            (detail, Some(read.metric.into_iter().collect::<Vec<_>>()))
        }
        None => match reread_sandbox(svc, e2b, case, id).await.map_err(failure)? {
            Some(detail) => (detail, None),
            None => return Ok(None),
        },
    };
    let end_at = detail.end_at;
    if !done.is_empty() && step != Step::Kill {
        return Ok(Some((evidence::from_detail(&detail, None), end_at)));
    }
    // A worker that died mid-pause (the case was left Executing) may have paused it already:
    // paused is what was decided, not a change.
    if step == Step::Pause
        && detail.state == SandboxState::Paused
        && matches!(case.state, CaseState::Executing { .. })
    {
        return Ok(Some((evidence::from_detail(&detail, None), end_at)));
    }
    let samples = match batched_samples {
        Some(samples) => samples,
        None if detail.state == SandboxState::Running => {
            fresh_metrics(svc, e2b, case, id).await.map_err(failure)?
        }
        None => Vec::new(),
    };
    let busiest = busiest_cpu(&samples);
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
        let done = match recorded_snapshot(done) {
            Some(snapshot) => format!("it was not killed (its snapshot {snapshot} is kept)"),
            None => "nothing was done".to_owned(),
        };
        return Err(ask_again(svc, current, &change, &done));
    }
    Ok(Some((current, end_at)))
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
    Ok(list_snapshots(svc, e2b, case, id)
        .await?
        .into_iter()
        .find(|s| snapshot_named(s, &name))
        .map(|s| s.snapshot_id))
}

/// The snapshots E2B lists for sandbox `id`, audited.
async fn list_snapshots(
    svc: &Services,
    e2b: &E2bClient,
    case: &Case,
    id: &SandboxId,
) -> Result<Vec<SnapshotInfo>, StepFailure> {
    let listed = e2b.list_snapshots(Some(id)).await;
    let listed = audited(svc, case, "list_snapshots", listed, |l| {
        format!("{} snapshot(s)", l.items.len())
    })
    .await
    .map_err(failure)?;
    Ok(listed.items)
}

/// The Snapshot step's call, under this decision's snapshot name. `end_at` is when E2B would
/// have ended the sandbox (from the re-check just before): the life it had left is recorded
/// with the snapshot, so a restore gives it no less.
async fn take_snapshot(
    svc: &Services,
    e2b: &E2bClient,
    case: &Case,
    id: &SandboxId,
    end_at: DateTime<Utc>,
) -> Result<StepOutcome, StepFailure> {
    let made = e2b.create_snapshot(id, Some(&snapshot_name(case))).await;
    let info = audited(svc, case, "create_snapshot", made, |s| {
        format!("snapshot {}", s.snapshot_id)
    })
    .await;
    let life_left = (end_at - Utc::now()).num_seconds().max(0);
    step_outcome(info, |info| StepOutcome::SnapshotCreated {
        snapshot_id: info.snapshot_id,
        life_left_secs: u64::try_from(life_left).ok(),
    })
}

/// The Keep running step: sets the sandbox's E2B timeout to the case's `keep_running_for_secs`
/// from now, unless it already runs longer (a shorter timeout would end it sooner than people
/// chose to keep it). A paused sandbox has no timeout running, so it fails with a sentence.
async fn keep_running(
    svc: &Services,
    e2b: &E2bClient,
    case: &Case,
    id: &SandboxId,
) -> Result<StepOutcome, StepFailure> {
    let Some(secs) = case.keep_running_for_secs else {
        return Err(StepFailure::Permanent(
            "this case does not say how long to keep the sandbox running".into(),
        ));
    };
    let Some(detail) = reread_sandbox(svc, e2b, case, id).await.map_err(failure)? else {
        return Ok(StepOutcome::AlreadyGone);
    };
    if detail.state == SandboxState::Paused {
        return Err(StepFailure::Permanent(format!(
            "sandbox {id} is paused, so it has no timeout to extend; resume it with `/sandbox resume {id}` first"
        )));
    }
    let keep_for = std::time::Duration::from_secs(secs);
    let wanted = chrono::Duration::from_std(keep_for)
        .ok()
        .and_then(|d| Utc::now().checked_add_signed(d))
        .unwrap_or(DateTime::<Utc>::MAX_UTC);
    if detail.end_at >= wanted {
        return Ok(StepOutcome::KeptRunning {
            until: detail.end_at,
            extended: false,
        });
    }
    let set = e2b.set_timeout(id, keep_for).await;
    let set = audited(svc, case, "set_timeout", set, |()| {
        format!("asked to run until {wanted}")
    })
    .await;
    match set {
        Ok(()) => {}
        Err(E2bError::NotFound { .. }) => return Ok(StepOutcome::AlreadyGone),
        Err(e) => return Err(failure(e)),
    }
    // E2B caps a sandbox's whole life, so the end it set may be earlier than asked: the card
    // says the end E2B reports. Unread, it says the one asked for.
    let until = match reread_sandbox(svc, e2b, case, id).await {
        Ok(Some(detail)) => detail.end_at,
        _ => wanted,
    };
    Ok(StepOutcome::KeptRunning {
        until,
        extended: true,
    })
}

/// The Shorten step: after the re-check (the sandbox must look as it did when people decided,
/// as before a kill), sets its E2B timeout to the case's `shorten_to_secs` from now, unless it
/// already ends sooner (a longer timeout would extend it, which nobody asked for). A paused
/// sandbox has no timeout running, so it fails with a sentence.
async fn shorten(
    svc: &Services,
    e2b: &E2bClient,
    case: &Case,
    id: &SandboxId,
    done: &[StepRecord],
) -> Result<StepOutcome, StepFailure> {
    let Some(secs) = case.shorten_to_secs else {
        return Err(StepFailure::Permanent(
            "this case does not say how short the sandbox's timeout should be".into(),
        ));
    };
    let Some((current, _)) =
        recheck_sandbox(svc, e2b, case, id, Step::ShortenTimeout, done, None).await?
    else {
        return Ok(StepOutcome::AlreadyGone);
    };
    if current.state.as_deref() == Some(SandboxState::Paused.as_str()) {
        return Err(StepFailure::Permanent(format!(
            "sandbox {id} is paused, so it has no timeout to shorten; ask for a kill with `/sandbox kill {id}` instead"
        )));
    }
    let Some(detail) = reread_sandbox(svc, e2b, case, id).await.map_err(failure)? else {
        return Ok(StepOutcome::AlreadyGone);
    };
    let shorten_to = std::time::Duration::from_secs(secs);
    let wanted = chrono::Duration::from_std(shorten_to)
        .ok()
        .and_then(|d| Utc::now().checked_add_signed(d))
        .unwrap_or(DateTime::<Utc>::MAX_UTC);
    if detail.end_at <= wanted {
        return Ok(StepOutcome::Shortened {
            until: detail.end_at,
            shortened: false,
        });
    }
    let set = e2b.set_timeout(id, shorten_to).await;
    let set = audited(svc, case, "set_timeout", set, |()| {
        format!("asked to end at {wanted} (was {})", detail.end_at)
    })
    .await;
    match set {
        Ok(()) => Ok(StepOutcome::Shortened {
            until: wanted,
            shortened: true,
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
    readings: Option<&Readings>,
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
                return Ok(StepOutcome::SnapshotCreated {
                    snapshot_id,
                    life_left_secs: None,
                });
            }
            let Some((current, end_at)) =
                recheck_sandbox(svc, e2b, case, id, step, done, readings).await?
            else {
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
                Step::Snapshot => take_snapshot(svc, e2b, case, id, end_at).await,
                Step::Kill => {
                    let killed = e2b.kill_sandbox(id).await;
                    let killed = audited(svc, case, "kill_sandbox", killed, |_| "ok".into()).await;
                    step_outcome(killed, |()| StepOutcome::Killed)
                }
                _ => {
                    if current.state.as_deref() == Some(SandboxState::Paused.as_str()) {
                        return Ok(StepOutcome::AlreadyPaused);
                    }
                    let paused = e2b.pause_sandbox(id).await;
                    match audited(svc, case, "pause_sandbox", paused, |_| "ok".into()).await {
                        Err(E2bError::Conflict { .. }) => Ok(StepOutcome::AlreadyPaused),
                        paused => step_outcome(paused, |()| StepOutcome::Paused),
                    }
                }
            }
        }
        (Subject::Sandbox(id), Step::VerifySnapshot) => {
            let Some(snapshot_id) = recorded_snapshot(done).cloned() else {
                return Err(StepFailure::Permanent(
                    "no snapshot was recorded, so there is nothing to verify".into(),
                ));
            };
            let listed = list_snapshots(svc, e2b, case, id).await?;
            if listed.iter().any(|s| s.snapshot_id == snapshot_id) {
                Ok(StepOutcome::SnapshotVerified { snapshot_id })
            } else {
                Err(StepFailure::Permanent(format!(
                    "snapshot {snapshot_id} does not appear in E2B's snapshot list, so the sandbox was not killed"
                )))
            }
        }
        (Subject::Sandbox(id), Step::ExtendTimeout) => keep_running(svc, e2b, case, id).await,
        (Subject::Sandbox(id), Step::ShortenTimeout) => shorten(svc, e2b, case, id, done).await,
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
            let deleted = audited(svc, case, "delete_template", deleted, |_| "ok".into()).await;
            step_outcome(deleted, |()| StepOutcome::TemplateDeleted)
        }
        (subject, step) => Err(StepFailure::Permanent(format!(
            "step {} does not apply to {subject}",
            step.as_str()
        ))),
    }
}

/// After a Snapshot, then kill that killed the sandbox: its card offers Restore for
/// `[approvals] restore_window`, and the window is watched so it closes on time. A failure is
/// logged: the card then simply offers no Restore.
async fn offer_restore(svc: &Services, case: Case) -> Case {
    let CaseState::Done {
        decision,
        steps,
        at,
        ..
    } = &case.state
    else {
        return case;
    };
    let killed = steps.iter().any(|s| s.outcome == StepOutcome::Killed);
    let snapshot = steps.iter().find_map(|s| match &s.outcome {
        StepOutcome::SnapshotVerified { snapshot_id }
        | StepOutcome::SnapshotCreated { snapshot_id, .. } => Some(snapshot_id.clone()),
        _ => None,
    });
    let (DecisionOption::SnapshotThenKill, true, Some(snapshot), None) =
        (decision.option, killed, snapshot, &case.restore)
    else {
        return case;
    };
    let life_left_secs = steps.iter().find_map(|s| match &s.outcome {
        StepOutcome::SnapshotCreated { life_left_secs, .. } => *life_left_secs,
        _ => None,
    });
    let window = chrono::Duration::from_std(svc.policy.restore_window)
        .unwrap_or_else(|_| chrono::Duration::days(3650));
    let until = *at + window;
    let event = Event::OfferRestore {
        snapshot,
        until,
        life_left_secs,
    };
    match svc.store.apply_event(&case.id, event, Utc::now()).await {
        Ok(Updated::Applied(offered)) => {
            if let Err(e) = svc.store.watch_restore(&offered.id, until).await {
                tracing::warn!(case = %offered.id, error = %e, "could not watch the restore window; Restore stays on the card");
            }
            offered
        }
        Ok(Updated::Rejected { current, .. }) => current,
        Err(e) => {
            tracing::warn!(case = %case.id, error = %e, "could not offer Restore");
            case
        }
    }
}

/// Runs one queued decision to its end and shows the result on the card.
pub async fn handle_job(svc: &Services, claimed: ClaimedJob) -> Result<(), JobError> {
    let Some(case_id) = claimed.job.case_id().cloned() else {
        return Err(JobError::Permanent(format!(
            "job {} is not a decision; the run worker handles it",
            claimed.id
        )));
    };
    execute_case(svc, &case_id, jobs::EXECUTION_LEASE)
        .await
        .map(|_| ())
}

/// Runs a decided case's remaining steps (holding its execution lease `lease` at a time),
/// audits how it ended and shows it on its card. Returns the case as it ended. The queue's
/// decision jobs and a list's items both come through here.
pub async fn execute_case(
    svc: &Services,
    case_id: &CaseId,
    lease: std::time::Duration,
) -> Result<Case, JobError> {
    execute_case_reading(svc, case_id, lease, None).await
}

/// [`execute_case`] for a list's item: its first step's re-check uses `readings`, the batched
/// reading of its group, when that shows the sandbox and is fresh.
pub async fn execute_case_reading(
    svc: &Services,
    case_id: &CaseId,
    lease: std::time::Duration,
    readings: Option<&Readings>,
) -> Result<Case, JobError> {
    let before = svc.store.get_case(case_id).await?;
    let draining = Some(&svc.draining);
    let result =
        jobs::execute_decision_leased(&svc.store, case_id, lease, draining, |step, done| {
            let svc = svc.clone();
            let case = before.clone();
            async move { run_step(&svc, &case, step, &done, readings).await }
        })
        .await;
    if matches!(result, Err(JobError::Transient(_) | JobError::HandBack(_))) {
        return result;
    }
    let after = match svc.store.get_case(case_id).await {
        Ok(case) => case,
        Err(e) => {
            tracing::error!(case = %case_id, error = %e, "could not read the case after its job");
            return result;
        }
    };
    // A duplicate job finds the case already finished: nothing new to show.
    if after.version != before.version {
        let after = offer_restore(svc, after).await;
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
            CaseState::Left {
                by: Decider::Policy { .. },
                reason,
                ..
            } => ("skip", reason.clone().unwrap_or_default()),
            other => ("stop", other.name().to_owned()),
        };
        audit(&svc.store, &after, worker_actor(), action, &outcome).await;
        if after.card.is_some() {
            refresh_card(&svc.store, &svc.slack, &svc.templates, &after).await;
        } else if after.restore.is_some() {
            // A list's item has no card; its Restore button goes to the list's thread.
            crate::approvals::list::post_restore_card(svc, &after).await;
        }
        return Ok(after);
    }
    result
}
