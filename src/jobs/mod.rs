//! The durable work queue's mechanics: what a job is, the worker loop that claims, runs and
//! acknowledges jobs, takes over jobs whose worker died, and [`execute_decision`], which runs a
//! decided case's plan step by step so that a replacement worker resumes after the last
//! finished step (no second snapshot, no lost kill).
//!
//! This module knows no E2B and no Slack: the work of one step is a closure the caller passes
//! in. It must not hold a job forever: a handler that cannot finish returns an error and the job
//! is either left for another attempt or acknowledged, never silently dropped.
use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::cases::{
    self, Case, CaseState, Event, Evidence, Step, StepOutcome, StepRecord, TransitionError,
};
use crate::ids::CaseId;
use crate::store::{ClaimedJob, Job, JobId, Lane, Store, StoreError, Updated};
use tokio_util::sync::CancellationToken;

/// How long one worker's hold on a case's execution lasts unless renewed; it is renewed before
/// each step and every third of this during a long one, so a dead worker's case is taken over
/// about this long after it died.
pub const EXECUTION_LEASE: Duration = Duration::from_secs(60);
/// Transient failures (E2B briefly unavailable) of one step in one attempt after which the
/// case fails (with Retry) instead of waiting for another delivery. Deliveries that found
/// another worker holding the case, or that lost the lease, do not count: only failed steps do.
pub const MAX_TRANSIENT_FAILURES: u32 = 3;
/// Pause after a store error before the worker loop tries again.
pub const ERROR_BACKOFF: Duration = Duration::from_secs(1);

/// Why a handler did not finish a job.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JobError {
    /// Worth trying again later (E2B or Redis briefly unavailable, another worker busy with
    /// the case): the job is not acknowledged and will be reclaimed.
    #[error("will retry: {0}")]
    Transient(String),
    /// Trying again will not help (the handler has recorded the failure): the job is
    /// acknowledged.
    #[error("gave up: {0}")]
    Permanent(String),
    /// This replica is stopping and has left the rest of the work for another one: the job is
    /// handed back at once ([`Store::hand_back`]), not left to go stale.
    #[error("handed back: {0}")]
    HandBack(String),
}

impl From<StoreError> for JobError {
    fn from(e: StoreError) -> Self {
        match e {
            // An unconfirmed write is re-read on the next delivery.
            StoreError::Unavailable(_) | StoreError::Conflict(_) | StoreError::Unconfirmed(_) => {
                JobError::Transient(e.to_string())
            }
            _ => JobError::Permanent(e.to_string()),
        }
    }
}

/// The step log of one case's execution: the steps finished so far, first record of a step wins.
#[derive(Debug, Clone)]
pub struct StepLog {
    store: Store,
    case: CaseId,
}

impl StepLog {
    pub fn new(store: Store, case: CaseId) -> Self {
        Self { store, case }
    }

    /// The finished steps, in plan order.
    pub async fn done(&self) -> Result<Vec<StepRecord>, StoreError> {
        self.store.steps_done(&self.case).await
    }

    /// Records a finished step and returns the record that is kept: if another worker
    /// recorded the same step first, theirs.
    pub async fn record(
        &self,
        step: Step,
        outcome: StepOutcome,
        now: DateTime<Utc>,
    ) -> Result<StepRecord, StoreError> {
        let record = StepRecord {
            step,
            outcome,
            at: now,
        };
        if self.store.mark_step_done(&self.case, &record).await? {
            return Ok(record);
        }
        let done = self.done().await?;
        done.into_iter()
            .find(|r| r.step == step)
            .ok_or_else(|| StoreError::Corrupt(format!("step log of {} lost a step", self.case)))
    }
}

/// What one step of a plan came to, as reported by the caller's step closure.
#[derive(Debug, Clone, PartialEq)]
pub enum StepFailure {
    /// Try again later; finished steps are kept.
    Transient(String),
    /// The case fails with this error; a person may Retry.
    Permanent(String),
    /// The subject changed since the card was posted: ask people again.
    EvidenceChanged {
        evidence: Box<Evidence>,
        note: String,
        decide_by: DateTime<Utc>,
    },
}

/// The name of the lease a worker holds while it runs `case_id`'s steps.
pub fn execution_lease(case_id: &CaseId) -> String {
    format!("execute:{case_id}")
}

/// Runs a decided case's remaining steps with `run_step(step, steps_done_so_far)`.
///
/// A step that fails transiently is counted on the case ([`Case::retrying`]) and left for a
/// later delivery, until it has failed [`MAX_TRANSIENT_FAILURES`] times in this attempt: then
/// the case fails (a person may Retry).
///
/// Holds the case's execution lease while running, so two workers never run the same case at
/// once; resumes after the last step in the store's step log; mirrors each step into the case
/// (`Executing{steps}`), and ends the case `Done`, `Failed` or (stale evidence) `Pending`.
/// A case that is not Decided or Executing is returned unchanged: the job was a duplicate.
/// A duplicate that finds the case Decided or Executing with the lease free resumes it; the
/// step log (first record of a step wins) keeps it from repeating a finished step, and the
/// lease is renewed before every step so a worker that outlived its lease stops there.
pub async fn execute_decision<F, Fut>(
    store: &Store,
    case_id: &CaseId,
    run_step: F,
) -> Result<Case, JobError>
where
    F: FnMut(Step, Vec<StepRecord>) -> Fut,
    Fut: Future<Output = Result<StepOutcome, StepFailure>>,
{
    execute_decision_leased(store, case_id, EXECUTION_LEASE, None, run_step).await
}

/// [`execute_decision`] holding the case's execution lease for `lease` at a time (renewed before
/// every step). A list's items use a short one, so a replica that dies mid-list hands its
/// sandboxes over quickly; their steps are short. Once `draining` is cancelled (this replica
/// is stopping), the step in flight finishes and the next is left to another replica
/// ([`JobError::HandBack`]): the step log makes it resume right after the last finished step.
pub async fn execute_decision_leased<F, Fut>(
    store: &Store,
    case_id: &CaseId,
    lease_ttl: Duration,
    draining: Option<&CancellationToken>,
    mut run_step: F,
) -> Result<Case, JobError>
where
    F: FnMut(Step, Vec<StepRecord>) -> Fut,
    Fut: Future<Output = Result<StepOutcome, StepFailure>>,
{
    let lease = execution_lease(case_id);
    let holder = uuid::Uuid::new_v4().to_string();
    if !store.acquire_lease(&lease, &holder, lease_ttl).await? {
        return Err(JobError::Transient(format!(
            "another worker is running case {case_id}"
        )));
    }
    let held = Held {
        lease: &lease,
        holder: &holder,
        ttl: lease_ttl,
        draining,
    };
    let result =
        execute_holding_lease(store, case_id, held, MAX_TRANSIENT_FAILURES, &mut run_step).await;
    // A failed release only delays a takeover until the lease expires.
    if let Err(e) = store.release_lease(&lease, &holder).await {
        tracing::warn!(case = %case_id, error = %e, "could not release the execution lease");
    }
    result
}

/// The execution lease this worker holds, and whether its replica is stopping.
#[derive(Clone, Copy)]
struct Held<'a> {
    lease: &'a str,
    holder: &'a str,
    ttl: Duration,
    draining: Option<&'a CancellationToken>,
}

async fn execute_holding_lease<F, Fut>(
    store: &Store,
    case_id: &CaseId,
    held: Held<'_>,
    max_transient_failures: u32,
    run_step: &mut F,
) -> Result<Case, JobError>
where
    F: FnMut(Step, Vec<StepRecord>) -> Fut,
    Fut: Future<Output = Result<StepOutcome, StepFailure>>,
{
    let case = store.get_case(case_id).await?;
    if !matches!(
        case.state,
        CaseState::Decided { .. } | CaseState::Executing { .. }
    ) {
        return Ok(case);
    }
    let mut case = transition(store, case_id, Event::StartExecuting).await?;
    let log = StepLog::new(store.clone(), case_id.clone());
    // Steps the log has but the case does not (a worker died between the two writes).
    for record in log.done().await? {
        case = mirror_step(store, case_id, record).await?;
    }
    let Some(option) = case.state.decision().map(|d| d.option) else {
        return Ok(case);
    };
    loop {
        let done = log.done().await?;
        let Some(step) = cases::remaining_steps(option, &done).first().copied() else {
            break;
        };
        if held.draining.is_some_and(CancellationToken::is_cancelled) {
            return Err(JobError::HandBack(format!(
                "this replica is stopping; {} of case {case_id} is left to another replica",
                step.as_str()
            )));
        }
        // A worker whose lease ran out may have been replaced: running the step too could
        // do it twice.
        if !store.renew_lease(held.lease, held.holder, held.ttl).await? {
            return Err(JobError::Transient(format!(
                "lost the execution lease of case {case_id}"
            )));
        }
        let started = std::time::Instant::now();
        let result = {
            let work = run_step(step, done);
            tokio::pin!(work);
            let every = held.ttl / 3;
            let mut renew = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            renew.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    result = &mut work => break result,
                    _ = renew.tick() => {
                        // A step under way is not abandoned (its E2B call may have landed);
                        // the step log keeps a takeover from recording it twice.
                        match store.renew_lease(held.lease, held.holder, held.ttl).await {
                            Ok(true) => {}
                            Ok(false) => tracing::warn!(case = %case_id, step = step.as_str(), "lost the execution lease during a step"),
                            Err(error) => tracing::warn!(case = %case_id, %error, "could not renew the execution lease during a step"),
                        }
                    }
                }
            }
        };
        crate::metrics::job_step(step.as_str(), step_outcome(&result), started.elapsed());
        match result {
            Ok(outcome) => {
                let record = log.record(step, outcome, Utc::now()).await?;
                mirror_step(store, case_id, record).await?;
            }
            Err(StepFailure::Transient(reason)) => {
                // Counted on the case, per attempt and step: deliveries that found the case
                // busy with another worker, or a lost lease, are no failures of the step.
                let event = Event::TransientFailure {
                    step,
                    error: reason.clone(),
                };
                let case = transition(store, case_id, event).await?;
                let failures = case.retrying.as_ref().map_or(1, |r| r.failures);
                if failures < max_transient_failures {
                    return Err(JobError::Transient(reason));
                }
                let error = format!("{reason} (failed {failures} times in a row)");
                return Err(fail(store, case_id, error).await);
            }
            Err(StepFailure::Permanent(error)) => return Err(fail(store, case_id, error).await),
            Err(StepFailure::EvidenceChanged {
                evidence,
                note,
                decide_by,
            }) => {
                let event = Event::EvidenceChanged {
                    evidence,
                    note,
                    decide_by,
                };
                let case = transition(store, case_id, event).await?;
                store.clear_steps(case_id).await?;
                return Ok(case);
            }
        }
    }
    transition(store, case_id, Event::Finish).await
}

/// Applies `event` now; a refusal is permanent (the case moved somewhere this job can't follow).
async fn transition(store: &Store, case_id: &CaseId, event: Event) -> Result<Case, JobError> {
    match store.apply_event(case_id, event, Utc::now()).await? {
        Updated::Applied(case) => Ok(case),
        Updated::Rejected { current, error } => Err(refused(case_id, &current, &error)),
    }
}

/// Fails the case with `error` (a person may Retry); the job gives up either way.
async fn fail(store: &Store, case_id: &CaseId, error: String) -> JobError {
    let event = Event::Fail {
        error: error.clone(),
    };
    match transition(store, case_id, event).await {
        Ok(_) => JobError::Permanent(error),
        Err(e) => e,
    }
}

/// A transition the case refused: permanent, as the case moved somewhere this job can't follow.
fn refused(case_id: &CaseId, current: &Case, error: &TransitionError) -> JobError {
    JobError::Permanent(format!(
        "case {case_id} is {}: {error}",
        current.state.name()
    ))
}

/// Copies a step-log record into the case; one already there is fine.
async fn mirror_step(
    store: &Store,
    case_id: &CaseId,
    record: StepRecord,
) -> Result<Case, JobError> {
    let event = Event::StepDone {
        step: record.step,
        outcome: record.outcome,
    };
    match store.apply_event(case_id, event, record.at).await? {
        Updated::Applied(case) => Ok(case),
        Updated::Rejected {
            current,
            error: TransitionError::StepAlreadyRecorded { .. },
        } => Ok(current),
        Updated::Rejected { current, error } => Err(refused(case_id, &current, &error)),
    }
}

/// How a worker runs. `consumer` must be unique per worker (e.g. hostname + pid).
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    pub consumer: String,
    /// The lane this worker takes jobs from.
    pub lane: Lane,
    /// How long one claim waits for a job (also how long a stopping worker may take to notice).
    pub block: Duration,
    /// How often to look for jobs whose worker died.
    pub reclaim_every: Duration,
    /// How long a claimed job must go without a heartbeat before another worker takes it. A
    /// worker touches the job it is working on every quarter of this, so only a dead one's
    /// job goes stale, however long the work takes.
    pub stale_after: Duration,
}

impl WorkerConfig {
    pub fn new(consumer: impl Into<String>) -> Self {
        Self::for_lane(consumer, Lane::Decisions)
    }

    pub fn for_lane(consumer: impl Into<String>, lane: Lane) -> Self {
        Self {
            consumer: consumer.into(),
            lane,
            block: Duration::from_secs(2),
            reclaim_every: Duration::from_secs(5),
            stale_after: Duration::from_secs(20),
        }
    }

    fn heartbeat_every(&self) -> Duration {
        (self.stale_after / 4).max(Duration::from_millis(50))
    }
}

/// What happened to one job.
#[derive(Debug, Clone, PartialEq)]
pub enum WorkOutcome {
    /// There was no job to take.
    Idle,
    /// The handler finished; the job is acknowledged.
    Finished(JobId),
    /// The handler gave up; the job is acknowledged.
    GaveUp { id: JobId, error: String },
    /// The handler will be retried: the job stays pending for a reclaim.
    LeftForRetry { id: JobId, error: String },
    /// This replica is stopping: the job was queued again for another worker.
    HandedBack { id: JobId, to: JobId },
}

/// Runs `handler` on one claimed job, touching it while the handler works, and acknowledges it
/// unless the failure was transient; a job the handler hands back is queued again at once.
pub async fn run_job<H, Fut>(
    store: &Store,
    config: &WorkerConfig,
    claimed: ClaimedJob,
    handler: &H,
) -> Result<WorkOutcome, StoreError>
where
    H: Fn(ClaimedJob) -> Fut,
    Fut: Future<Output = Result<(), JobError>>,
{
    let id = claimed.id.clone();
    let job = claimed.job.clone();
    let kind = job_kind(&claimed.job);
    let started = std::time::Instant::now();
    let work = handler(claimed);
    tokio::pin!(work);
    let every = config.heartbeat_every();
    let mut beat = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let result = loop {
        tokio::select! {
            result = &mut work => break result,
            _ = beat.tick() => {
                // A missed heartbeat only risks a takeover, which leases make harmless.
                if let Err(error) = store.touch_job(&id, &config.consumer).await {
                    tracing::warn!(job = %id, %error, "could not touch the job being worked on");
                }
            }
        }
    };
    crate::metrics::job(kind, job_outcome(&result), started.elapsed());
    match result {
        Ok(()) => {
            store.ack(&id).await?;
            Ok(WorkOutcome::Finished(id))
        }
        Err(JobError::Permanent(error)) => {
            tracing::warn!(job = %id, %error, "job gave up");
            store.ack(&id).await?;
            Ok(WorkOutcome::GaveUp { id, error })
        }
        Err(JobError::Transient(error)) => {
            tracing::info!(job = %id, %error, "job left for a later retry");
            Ok(WorkOutcome::LeftForRetry { id, error })
        }
        Err(JobError::HandBack(why)) => hand_back(store, &id, &job, &why).await,
    }
}

/// Queues `job` again for another worker and acknowledges its claimed entry `id`.
async fn hand_back(
    store: &Store,
    id: &JobId,
    job: &Job,
    why: &str,
) -> Result<WorkOutcome, StoreError> {
    let to = store.hand_back(id, job).await?;
    tracing::info!(job = %id, to = %to, why, "job handed back for another replica");
    Ok(WorkOutcome::HandedBack { id: id.clone(), to })
}

/// The `kind` label of a job.
fn job_kind(job: &Job) -> &'static str {
    match job {
        Job::RunDecision { .. } => "decision",
        Job::Run { .. } => "run",
        Job::Restore { .. } => "restore",
    }
}

/// The `outcome` label of a job, as [`run_job`] treats it.
fn job_outcome(result: &Result<(), JobError>) -> &'static str {
    match result {
        Ok(()) => "finished",
        Err(JobError::Permanent(_)) => "gave_up",
        Err(JobError::Transient(_)) => "left_for_retry",
        Err(JobError::HandBack(_)) => "handed_back",
    }
}

/// The `outcome` label of one step.
fn step_outcome(result: &Result<StepOutcome, StepFailure>) -> &'static str {
    match result {
        Ok(_) => "done",
        Err(StepFailure::Transient(_)) => "transient",
        Err(StepFailure::Permanent(_)) => "permanent",
        Err(StepFailure::EvidenceChanged { .. }) => "evidence_changed",
    }
}

/// One pass: claim at most one new job of the worker's lane (waiting up to `block`) and run
/// it; once `draining` is cancelled, a job the claim still brings is handed back unstarted.
pub async fn work_once<H, Fut>(
    store: &Store,
    config: &WorkerConfig,
    handler: &H,
    draining: &CancellationToken,
) -> Result<WorkOutcome, StoreError>
where
    H: Fn(ClaimedJob) -> Fut,
    Fut: Future<Output = Result<(), JobError>>,
{
    match store
        .claim(config.lane, &config.consumer, config.block)
        .await?
    {
        None => Ok(WorkOutcome::Idle),
        Some(claimed) if draining.is_cancelled() => {
            hand_back(
                store,
                &claimed.id,
                &claimed.job,
                "claimed while this replica was stopping",
            )
            .await
        }
        Some(claimed) => run_job(store, config, claimed, handler).await,
    }
}

/// One pass: take over every job of the worker's lane idle for `stale_after` and run each.
pub async fn reclaim_once<H, Fut>(
    store: &Store,
    config: &WorkerConfig,
    handler: &H,
) -> Result<Vec<WorkOutcome>, StoreError>
where
    H: Fn(ClaimedJob) -> Fut,
    Fut: Future<Output = Result<(), JobError>>,
{
    let mut outcomes = Vec::new();
    for claimed in store
        .reclaim_stale(config.lane, &config.consumer, config.stale_after)
        .await?
    {
        tracing::info!(job = %claimed.id, deliveries = claimed.deliveries, "took over a stale job");
        outcomes.push(run_job(store, config, claimed, handler).await?);
    }
    Ok(outcomes)
}

/// Claims and runs jobs of the worker's lane until `draining` is cancelled, taking over stale
/// jobs every `reclaim_every`. Draining is noticed between passes: a running job sees it
/// through its handler (and finishes its step or hands the rest back), and a waiting claim runs
/// out its `block` first, because cancelling a claim mid-flight could strand a job that Redis
/// had already handed over; a job it still brings is handed back unstarted. To stop at once,
/// the caller drops (aborts) this future: the job being worked on stays claimed, stops being
/// touched and is taken over by another replica after `stale_after`.
pub async fn run_queue<H, Fut>(
    store: Store,
    config: WorkerConfig,
    handler: H,
    draining: CancellationToken,
) where
    H: Fn(ClaimedJob) -> Fut,
    Fut: Future<Output = Result<(), JobError>>,
{
    let mut next_reclaim = tokio::time::Instant::now();
    loop {
        if draining.is_cancelled() {
            break;
        }
        let mut pass = Ok(());
        if tokio::time::Instant::now() >= next_reclaim {
            next_reclaim = tokio::time::Instant::now() + config.reclaim_every;
            pass = reclaim_once(&store, &config, &handler).await.map(|_| ());
        }
        if pass.is_ok() && !draining.is_cancelled() {
            pass = work_once(&store, &config, &handler, &draining)
                .await
                .map(|_| ());
        }
        if let Err(error) = pass {
            tracing::warn!(%error, consumer = %config.consumer, "worker pass failed");
            tokio::select! {
                () = draining.cancelled() => break,
                () = tokio::time::sleep(ERROR_BACKOFF) => {}
            }
        }
    }
    tracing::info!(consumer = %config.consumer, lane = config.lane.as_str(), "worker stopped");
}
