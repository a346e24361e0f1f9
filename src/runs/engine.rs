//! The run job: [`RunEngine::handle`] takes one `Job::Run` from the queue and carries the run
//! from Queued to its end, recording each step on the run as it happens: create the sandbox,
//! upload the files, start the command and stream its output into the store, stop it at its
//! timeout (SIGTERM, then SIGKILL), collect the sandbox's logs and resource profile, and hand
//! the sandbox over (see [`HandOver`]).
//!
//! While it runs, the worker holds the run's lease and renews it; a worker that loses it stops.
//! A delivery that finds the run started by someone else whose lease has expired (that replica
//! died) marks it Failed with the cause and hands its sandbox over, so a run is never "running"
//! forever and no sandbox is left without a decision. This file never posts to Slack and never
//! kills a sandbox: what happens to the sandbox is the hand-over's (a person's) business.
use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use secrecy::SecretString;
use tokio_util::sync::CancellationToken;

use super::model::{
    self, OnFinish, Run, RunPhase, RunPolicy, RunProcess, RunStatus, Sample, Scrubber,
};
use super::record::{self, RunInputs};
use crate::cases::{RunOutcome, RunReport, Subject};
use crate::e2b::{E2bClient, ListQuery, LogsDirection, LogsQuery, NewSandbox, StateFilter};
use crate::envd::{
    EnvdAddress, EnvdClient, EnvdError, EnvdVersion, ProcessEvent, ProcessSpec, ProcessStream,
    Signal,
};
use crate::ids::{CaseId, RunId, SandboxId, TemplateId};
use crate::jobs::JobError;
use crate::store::{Actor, AuditEvent, ClaimedJob, Job, Store, StoreError};

/// How long a worker's hold on a run lasts unless renewed.
pub const RUN_LEASE: Duration = Duration::from_secs(15);
/// Metadata keys every run's sandbox carries.
pub const RUN_METADATA_KEY: &str = "steward.run";
pub const REQUESTER_METADATA_KEY: &str = "steward.requester";
pub const PURPOSE_METADATA_KEY: &str = "steward.purpose";
/// The `steward.purpose` value of a run's sandbox: `steward e2b list --steward` and
/// `/sandbox list steward` filter on it.
pub const RUN_PURPOSE: &str = "run";
/// Set by a restore on the sandbox started from a case's snapshot (it keeps the original's
/// metadata), naming the case.
const RESTORED_FROM_KEY: &str = "steward.restored_from";

/// What a sandbox carrying Steward's run metadata is, in a few words for a list: the run and
/// who asked for it (a push test's requester is `github:<owner/name>`), or the case it was
/// restored by. `None` for a sandbox Steward did not create for a run.
pub fn describe_run_sandbox(
    metadata: &std::collections::BTreeMap<String, String>,
) -> Option<String> {
    let run = metadata.get(RUN_METADATA_KEY)?;
    let requester = metadata.get(REQUESTER_METADATA_KEY).map(String::as_str);
    let mut text = match requester.and_then(|r| r.strip_prefix("github:")) {
        Some(repository) => format!("push test of {repository}, run {run}"),
        None => format!("run {run} for {}", requester.unwrap_or("unknown")),
    };
    if let Some(case) = metadata.get(RESTORED_FROM_KEY) {
        text.push_str(&format!(", restored by case {case}"));
    }
    Some(text)
}
/// How many lines of output the hand-over's report carries.
pub const REPORT_OUTPUT_LINES: usize = 20;
/// How many lines of the sandbox's logs a run keeps.
pub const LOG_TAIL_LINES: u32 = 20;
/// Longest line kept in a tail.
const TAIL_LINE_CHARS: usize = 300;
/// Bytes of the end of the output kept in memory for the report's last lines.
const TAIL_BYTES: usize = 8 * 1024;
/// How long to wait for the process's end after SIGKILL before giving up on it.
const AFTER_KILL_WAIT: Duration = Duration::from_secs(10);
/// How often a running command's run is checked for a stop request (a superseded push test).
const STOP_CHECK_EVERY: Duration = Duration::from_secs(1);
/// Deliveries of a finished run's job after which a failing hand-over is given up (logged).
const MAX_HAND_OVER_DELIVERIES: u64 = 5;

/// What the hand-over of a run's sandbox gets: the sandbox (`None` when the run never got
/// one), the run's evidence, why it failed (when it did) and the policy.
#[derive(Debug, Clone)]
pub struct HandOverRequest {
    pub sandbox: Option<SandboxId>,
    pub report: RunReport,
    /// The run's error, when it failed (no sandbox, the sandbox died, superseded, ...).
    pub error: Option<String>,
    /// Whether the run's command ever started in the sandbox (a run that failed before it, at
    /// its upload or its setup, left nothing of its own there).
    pub command_started: bool,
    pub on_finish: OnFinish,
}

/// Why a hand-over did not happen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandOverError {
    /// Worth trying again on a later delivery (Slack, E2B or Redis briefly unavailable).
    #[error("{0}")]
    Retry(String),
    /// Trying again will not help (no channel configured, the sandbox is gone): the sandbox is
    /// left to its E2B timeout.
    #[error("{0}")]
    GiveUp(String),
}

type HandOverFuture = Pin<Box<dyn Future<Output = Result<Option<CaseId>, HandOverError>> + Send>>;
type HandOverFn = dyn Fn(HandOverRequest) -> HandOverFuture + Send + Sync;

/// Gives a finished run's sandbox to whoever decides its fate (the run case, opened by
/// `approvals`); startup passes it in, so this module imports nothing above it. `Ok(Some(id))`
/// names the case opened, `Ok(None)` means nothing was opened (nothing to ask), and
/// [`HandOverError::Retry`] is retried on a later delivery of the run's job.
#[derive(Clone)]
pub struct HandOver(Arc<HandOverFn>);

impl HandOver {
    pub fn new<F, Fut>(hand_over: F) -> Self
    where
        F: Fn(HandOverRequest) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Option<CaseId>, HandOverError>> + Send + 'static,
    {
        Self(Arc::new(move |req| Box::pin(hand_over(req))))
    }

    /// Opens nothing: the sandbox is left to its E2B timeout (the run's timeout plus
    /// `sandbox_margin`). The run's end is still audited on the sandbox.
    pub fn leave_to_timeout() -> Self {
        Self::new(|_| async { Ok(None) })
    }

    async fn call(&self, req: HandOverRequest) -> Result<Option<CaseId>, HandOverError> {
        (self.0)(req).await
    }
}

impl std::fmt::Debug for HandOver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HandOver")
    }
}

/// Runs `Job::Run` jobs. Cheap to clone; holds no secrets of its own (the E2B client hides its
/// key, and envd tokens live only for one run).
#[derive(Clone, Debug)]
pub struct RunEngine {
    store: Store,
    e2b: E2bClient,
    policy: Arc<RunPolicy>,
    /// `E2B_SANDBOX_URL`, when envd is reached through one proxy URL.
    sandbox_url: Option<String>,
    /// This replica's worker name, written on the runs it executes.
    worker: String,
    hand_over: HandOver,
    lease: Duration,
    /// Cancelled when this replica's runs must move to another replica (near the end of its
    /// shutdown grace): the command keeps running in its sandbox, and the run's job is handed
    /// back so another replica re-attaches to it. Nothing is stopped or failed.
    move_runs: CancellationToken,
}

/// The name of the lease a worker holds while it runs `run_id`.
pub fn run_lease(run_id: &RunId) -> String {
    format!("run:{run_id}")
}

/// How the command ended, as the stream showed it.
struct Ended {
    exit_code: Option<i32>,
    timed_out: bool,
    /// Set when the run could not complete.
    error: Option<String>,
    tail: Vec<u8>,
    whole_tail: bool,
}

/// What the run's processes have produced so far (the setup's output and the command's are
/// one output).
#[derive(Default)]
struct Seen {
    /// The run was marked Running (at its first process's start).
    started: bool,
    /// The last [`TAIL_BYTES`] of the output.
    tail: VecDeque<u8>,
    produced: u64,
}

impl Seen {
    fn ended(&mut self, exit_code: Option<i32>, timed_out: bool, error: Option<String>) -> Ended {
        Ended {
            exit_code,
            timed_out,
            error,
            whole_tail: self.produced <= TAIL_BYTES as u64,
            tail: std::mem::take(&mut self.tail).into(),
        }
    }
}

/// Why a run stopped before its command ended.
enum Stop {
    /// This replica is stopping: the command keeps running and another replica re-attaches.
    Moved,
    /// The run failed for good; the sentence says why.
    Failed(String),
    /// Try the whole job again later (nothing irreversible happened yet).
    Retry(String),
    /// The store failed; the job is left for another delivery.
    Store(StoreError),
}

impl From<StoreError> for Stop {
    fn from(e: StoreError) -> Self {
        Stop::Store(e)
    }
}

/// An envd failure in words; a proxy 502 says the sandbox is gone or paused.
fn envd_sentence(e: &EnvdError) -> String {
    match e {
        EnvdError::SandboxUnavailable { .. } => {
            "the sandbox is gone or paused (E2B's proxy answered 502)".to_owned()
        }
        other => other.to_string(),
    }
}

impl RunEngine {
    pub fn new(
        store: Store,
        e2b: E2bClient,
        policy: Arc<RunPolicy>,
        sandbox_url: Option<String>,
        worker: impl Into<String>,
        hand_over: HandOver,
    ) -> Self {
        Self {
            store,
            e2b,
            policy,
            sandbox_url,
            worker: worker.into(),
            hand_over,
            lease: RUN_LEASE,
            move_runs: CancellationToken::new(),
        }
    }

    /// Ties running commands to this replica's shutdown: once `move_runs` is cancelled, a run
    /// stops following its command (which keeps running) and is handed to another replica.
    pub fn with_move_runs(mut self, move_runs: CancellationToken) -> Self {
        self.move_runs = move_runs;
        self
    }

    /// A shorter (or longer) run lease; tests shorten it so a takeover comes quickly.
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lease = lease.max(Duration::from_millis(300));
        self
    }

    /// The E2B client (tests adjust its retry policy).
    pub fn with_e2b(mut self, e2b: E2bClient) -> Self {
        self.e2b = e2b;
        self
    }

    pub fn worker(&self) -> &str {
        &self.worker
    }

    /// Handles one delivery of a `Job::Run`: runs it, takes over a run whose worker died, or
    /// finishes the hand-over of a run that ended.
    pub async fn handle(&self, claimed: ClaimedJob) -> Result<(), JobError> {
        let Job::Run { run_id } = &claimed.job else {
            return Err(JobError::Permanent(format!(
                "job {} is not a run; the decision worker handles it",
                claimed.id
            )));
        };
        let Some(run) = record::load(&self.store, run_id).await? else {
            return Err(JobError::Permanent(format!(
                "run {run_id} is no longer stored (it expired)"
            )));
        };
        if run.status.is_terminal() {
            return self.finish_hand_over(run, claimed.deliveries).await;
        }
        let lease = run_lease(run_id);
        if !self
            .store
            .acquire_lease(&lease, &self.worker, self.lease)
            .await?
        {
            return Err(JobError::Transient(format!(
                "another replica is running run {run_id}"
            )));
        }
        let result = self.handle_holding_lease(run_id, claimed.deliveries).await;
        // A release that fails only delays a takeover until the lease runs out.
        if let Err(e) = self.store.release_lease(&lease, &self.worker).await {
            tracing::warn!(run = %run_id, error = %e, "could not release the run lease");
        }
        result
    }

    async fn handle_holding_lease(&self, run_id: &RunId, deliveries: u64) -> Result<(), JobError> {
        // Read again under the lease: whoever wrote last held it.
        let run = record::load(&self.store, run_id)
            .await?
            .ok_or_else(|| JobError::Permanent(format!("run {run_id} is no longer stored")))?;
        match run.status {
            status if status.is_terminal() => self.finish_hand_over(run, deliveries).await,
            RunStatus::Queued => {
                let lease = run_lease(run_id);
                tokio::select! {
                    result = self.execute(run, deliveries) => result,
                    lost = self.keep_lease(&lease) => Err(lost),
                }
            }
            _ => {
                let lease = run_lease(run_id);
                tokio::select! {
                    result = self.take_over(run, deliveries) => result,
                    lost = self.keep_lease(&lease) => Err(lost),
                }
            }
        }
    }

    /// Renews the lease every third of its length; returns only when it was lost.
    async fn keep_lease(&self, lease: &str) -> JobError {
        loop {
            tokio::time::sleep(self.lease / 3).await;
            match self
                .store
                .renew_lease(lease, &self.worker, self.lease)
                .await
            {
                Ok(true) => {}
                Ok(false) => {
                    return JobError::Transient(format!(
                        "lost the lease {lease}; another replica takes the run over"
                    ));
                }
                Err(e) => {
                    tracing::warn!(lease, error = %e, "could not renew the run lease; trying again");
                }
            }
        }
    }

    /// Writes `change` into the run (if it still applies) and returns the stored run.
    async fn write(
        &self,
        id: &RunId,
        change: impl FnMut(&Run) -> Option<Run>,
    ) -> Result<Run, StoreError> {
        record::update(&self.store, id, change).await
    }

    /// Sets the status of a run that is not over yet.
    async fn step(
        &self,
        id: &RunId,
        status: RunStatus,
        also: impl Fn(&mut Run),
    ) -> Result<Run, StoreError> {
        self.write(id, |current| {
            (!current.status.is_terminal()).then(|| {
                let mut next = current.clone();
                next.status = status;
                also(&mut next);
                next
            })
        })
        .await
    }

    /// Carries a Queued run to its end.
    async fn execute(&self, run: Run, deliveries: u64) -> Result<(), JobError> {
        let id = run.id.clone();
        let worker = self.worker.clone();
        let run = self
            .step(&id, RunStatus::CreatingSandbox, |r| {
                r.worker = Some(worker.clone());
                r.error = None;
            })
            .await?;
        // A run asked to stop before it began (a newer push superseded it) gets no sandbox.
        if let Ok(Some(reason)) = self.store.run_stop_requested(&id).await {
            let ended = Ended {
                exit_code: None,
                timed_out: false,
                error: Some(reason),
                tail: Vec::new(),
                whole_tail: true,
            };
            return self.finish(&id, None, ended, deliveries).await;
        }
        let inputs = record::inputs(&self.store, &id).await?;
        let result = self.create_and_run(&run, inputs, deliveries).await;
        match result {
            Ok((sandbox, ended)) => self.finish(&id, Some(sandbox), ended, deliveries).await,
            Err((sandbox, Stop::Failed(error))) => {
                let ended = Ended {
                    exit_code: None,
                    timed_out: false,
                    error: Some(error),
                    tail: Vec::new(),
                    whole_tail: true,
                };
                self.finish(&id, sandbox, ended, deliveries).await
            }
            Err((_, Stop::Retry(reason))) => {
                // Nothing irreversible happened: back to Queued for the next delivery.
                let note = reason.clone();
                self.write(&id, |current| {
                    (current.status == RunStatus::CreatingSandbox).then(|| {
                        let mut next = current.clone();
                        next.status = RunStatus::Queued;
                        next.error = Some(format!("{note}; trying again"));
                        next
                    })
                })
                .await?;
                Err(JobError::Transient(reason))
            }
            Err((_, Stop::Store(e))) => Err(e.into()),
            Err((_, Stop::Moved)) => Err(JobError::HandBack(format!(
                "replica {} is stopping; run {id} keeps running and moves to another replica",
                self.worker
            ))),
        }
    }

    /// Creates (or adopts) the sandbox, uploads, runs. The sandbox is returned with any failure
    /// after it exists, so it is handed over.
    async fn create_and_run(
        &self,
        run: &Run,
        inputs: Option<RunInputs>,
        deliveries: u64,
    ) -> Result<(SandboxId, Ended), (Option<SandboxId>, Stop)> {
        let inputs = match inputs {
            Some(inputs) => inputs,
            None if run.files.is_empty() => RunInputs::default(),
            None => {
                return Err((
                    None,
                    Stop::Failed("its files are no longer stored, so it was not started".into()),
                ));
            }
        };
        let (sandbox_id, domain, token, version) = self
            .sandbox_for(run, deliveries)
            .await
            .map_err(|stop| (None, stop))?;
        let sandbox = Some(sandbox_id.clone());
        self.step(&run.id, RunStatus::UploadingFiles, |r| {
            r.sandbox_id = Some(sandbox_id.clone());
        })
        .await
        .map_err(|e| (sandbox.clone(), e.into()))?;
        let address =
            EnvdAddress::resolve(self.sandbox_url.as_deref(), &sandbox_id, domain.as_deref());
        let envd = EnvdClient::new(sandbox_id.clone(), address, token, version)
            .map_err(|e| (sandbox.clone(), Stop::Failed(envd_sentence(&e))))?;
        for file in &inputs.files {
            let path = match (&run.cwd, file.path.trim()) {
                (Some(cwd), path) if !path.starts_with('/') => {
                    format!("{}/{path}", cwd.trim_end_matches('/'))
                }
                (_, path) => path.to_owned(),
            };
            envd.upload(&path, file.content.clone())
                .await
                .map_err(|e| {
                    (
                        sandbox.clone(),
                        Stop::Failed(format!("uploading {path} failed: {}", envd_sentence(&e))),
                    )
                })?;
        }
        let ended = self
            .run_command(run, &envd, inputs)
            .await
            .map_err(|stop| (sandbox.clone(), stop))?;
        Ok((sandbox_id, ended))
    }

    /// The run's sandbox: one created by an earlier delivery whose answer was lost (found by
    /// its metadata), or a new one.
    async fn sandbox_for(
        &self,
        run: &Run,
        deliveries: u64,
    ) -> Result<(SandboxId, Option<String>, Option<SecretString>, EnvdVersion), Stop> {
        let timeout = Duration::from_secs(run.timeout_secs) + self.policy.limits.sandbox_margin;
        if deliveries > 1
            && let Some(found) = self.find_sandbox(&run.id).await
        {
            match self.e2b.connect_sandbox(&found, timeout).await {
                Ok(connected) => {
                    let s = connected.sandbox;
                    let version = EnvdVersion::announced(&s.envd_version);
                    return Ok((s.sandbox_id, s.domain, s.envd_access_token, version));
                }
                Err(e) => {
                    tracing::warn!(run = %run.id, sandbox = %found, error = %e, "could not adopt the sandbox an earlier attempt created");
                }
            }
        }
        let template =
            TemplateId::parse(&run.template).map_err(|e| Stop::Failed(format!("template: {e}")))?;
        let mut req = NewSandbox::new(template);
        req.timeout = Some(timeout);
        req.secure = Some(true);
        req.metadata = BTreeMap::from([
            (RUN_METADATA_KEY.to_owned(), run.id.to_string()),
            (REQUESTER_METADATA_KEY.to_owned(), run.requester.clone()),
            (PURPOSE_METADATA_KEY.to_owned(), RUN_PURPOSE.to_owned()),
        ]);
        match self.e2b.create_sandbox(&req).await {
            Ok(created) => Ok((
                created.sandbox_id,
                created.domain,
                created.envd_access_token,
                EnvdVersion::announced(&created.envd_version),
            )),
            Err(e) if e.is_transient() => Err(Stop::Retry(format!(
                "E2B could not create the sandbox yet: {e}"
            ))),
            Err(e) => Err(Stop::Failed(format!("E2B did not create the sandbox: {e}"))),
        }
    }

    /// The sandbox E2B lists with this run's metadata, if any (errors count as none).
    async fn find_sandbox(&self, id: &RunId) -> Option<SandboxId> {
        let query = ListQuery {
            state: StateFilter::Both,
            metadata: vec![(RUN_METADATA_KEY.to_owned(), id.to_string())],
            ..ListQuery::default()
        };
        match self.e2b.list_sandboxes(&query).await {
            Ok(listing) => listing.items.into_iter().next().map(|s| s.sandbox_id),
            Err(e) => {
                tracing::warn!(run = %id, error = %e, "could not look for the run's sandbox");
                None
            }
        }
    }

    /// Runs the setup step (if any), then the command, each streamed to its end within one
    /// deadline, the run's timeout. The setup is a process of its own that has ended before
    /// the command's process starts, so nothing of the command ever sees the setup's env.
    async fn run_command(
        &self,
        run: &Run,
        envd: &EnvdClient,
        inputs: RunInputs,
    ) -> Result<Ended, Stop> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(run.timeout_secs);
        let mut seen = Seen::default();
        let secrets = secret_values(&inputs);
        if let Some(setup) = inputs.setup {
            let mut spec = ProcessSpec::shell(setup.command);
            spec.envs = setup.env;
            spec.cwd = run.cwd.clone();
            let scrubber = Scrubber::new(secrets.clone());
            let ended = self
                .stream_process(
                    run,
                    envd,
                    (RunPhase::Setup, &spec),
                    scrubber,
                    deadline,
                    &mut seen,
                )
                .await?;
            if let Some(ended) = self.after_setup(ended)? {
                return Ok(ended);
            }
        }
        self.start_command(run, envd, inputs.env, secrets, deadline, &mut seen)
            .await
    }

    /// What follows the setup step: its end, when it did not succeed (the command never
    /// starts); a move, when this replica's runs must move now; else nothing (start the command).
    fn after_setup(&self, ended: Ended) -> Result<Option<Ended>, Stop> {
        let succeeded = ended.exit_code == Some(0) && ended.error.is_none() && !ended.timed_out;
        if !succeeded {
            return Ok(Some(ended));
        }
        // Moving now leaves the command for the replica that takes the run over.
        if self.move_runs.is_cancelled() {
            return Err(Stop::Moved);
        }
        Ok(None)
    }

    /// Starts the command with `env` and streams it to its end, scrubbing `secrets`.
    async fn start_command(
        &self,
        run: &Run,
        envd: &EnvdClient,
        env: BTreeMap<String, String>,
        secrets: Vec<String>,
        deadline: tokio::time::Instant,
        seen: &mut Seen,
    ) -> Result<Ended, Stop> {
        let mut spec = ProcessSpec::shell(run.command.clone());
        spec.envs = env;
        spec.cwd = run.cwd.clone();
        self.stream_process(
            run,
            envd,
            (RunPhase::Command, &spec),
            Scrubber::new(secrets),
            deadline,
            seen,
        )
        .await
    }

    /// Starts one process and streams it to its end (see [`RunEngine::follow`]).
    async fn stream_process(
        &self,
        run: &Run,
        envd: &EnvdClient,
        (phase, spec): (RunPhase, &ProcessSpec),
        scrubber: Scrubber,
        deadline: tokio::time::Instant,
        seen: &mut Seen,
    ) -> Result<Ended, Stop> {
        let stream = envd.start(spec).await.map_err(|e| {
            Stop::Failed(format!("the command did not start: {}", envd_sentence(&e)))
        })?;
        if !seen.started {
            seen.started = true;
            let started = Utc::now();
            self.step(&run.id, RunStatus::Running, |r| {
                r.started_at = Some(started)
            })
            .await?;
        }
        // Inputs have reached the sandbox: file contents and env values leave Redis now (the
        // setup's credential too), but for the values of secret variables, which a replica
        // that takes the run over still needs to scrub the rest of the output.
        if phase == RunPhase::Command {
            record::keep_only_secrets(&self.store, &run.id).await?;
        }
        self.follow(run, envd, phase, stream, scrubber, deadline, seen)
            .await
    }

    /// Streams a started (or re-attached) process to its end, stopping it at `deadline`
    /// (SIGTERM, then SIGKILL) or when the run is asked to stop; when this replica's runs must
    /// move, it stops following and leaves the process running ([`Stop::Moved`]).
    #[allow(clippy::too_many_arguments)]
    async fn follow(
        &self,
        run: &Run,
        envd: &EnvdClient,
        phase: RunPhase,
        mut stream: ProcessStream,
        mut scrubber: Scrubber,
        deadline: tokio::time::Instant,
        seen: &mut Seen,
    ) -> Result<Ended, Stop> {
        let limits = self.policy.limits;
        let cap = limits.output_cap_bytes as u64;
        let mut pid: Option<u32> = None;
        let mut term_at: Option<tokio::time::Instant> = None;
        let mut kill_at: Option<tokio::time::Instant> = None;
        let mut stop_check = tokio::time::interval(STOP_CHECK_EVERY);
        stop_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let alarm = match (term_at, kill_at) {
                (None, _) => deadline,
                (Some(term), None) => term + limits.kill_grace,
                (Some(_), Some(kill)) => kill + AFTER_KILL_WAIT,
            };
            tokio::select! {
                event = stream.next_event() => match event {
                    Ok(Some(ProcessEvent::Start { pid: p })) => {
                        pid = Some(p);
                        // Where the process is, for a replica that takes the run over.
                        let process = RunProcess { phase, pid: p };
                        self.write(&run.id, |current| {
                            (!current.status.is_terminal() && current.process != Some(process))
                                .then(|| {
                                    let mut next = current.clone();
                                    next.process = Some(process);
                                    next
                                })
                        })
                        .await?;
                    }
                    Ok(Some(ProcessEvent::Stdout(bytes) | ProcessEvent::Stderr(bytes) | ProcessEvent::Pty(bytes))) => {
                        // Secret values never reach the store, the tail or the report.
                        let bytes = scrubber.push(&bytes);
                        if let Err(e) = self.keep(&run.id, seen, &bytes, cap).await {
                            self.stop_process(envd, pid, Signal::Kill).await;
                            return Err(e);
                        }
                    }
                    Ok(Some(ProcessEvent::End(end))) => {
                        let timed_out = term_at.is_some();
                        // A process ended by a signal we did not send may have gone with its
                        // sandbox (killed or paused behind our back): that is no exit code.
                        if !timed_out && (end.exit_code != 0 || !end.exited) {
                            self.check_sandbox_still_there(envd.sandbox_id()).await?;
                        }
                        self.keep(&run.id, seen, &scrubber.finish(), cap).await?;
                        return Ok(seen.ended((!timed_out).then_some(end.exit_code), timed_out, None));
                    }
                    Ok(Some(ProcessEvent::Keepalive)) => {}
                    Ok(None) if term_at.is_some() => {
                        self.keep(&run.id, seen, &scrubber.finish(), cap).await?;
                        return Ok(seen.ended(None, true, None));
                    }
                    Ok(None) => {
                        return Err(Stop::Failed("envd ended the command's stream without saying how it ended".into()));
                    }
                    Err(e) => {
                        return Err(Stop::Failed(format!("the command's stream broke: {}", envd_sentence(&e))));
                    }
                },
                _ = stop_check.tick(), if term_at.is_none() => {
                    // Someone asked for this run to end (a newer push superseded it). A store
                    // that cannot be read now is asked again at the next tick.
                    if let Ok(Some(reason)) = self.store.run_stop_requested(&run.id).await {
                        tracing::info!(run = %run.id, %reason, "run asked to stop; stopping its command");
                        self.stop_process(envd, pid, Signal::Kill).await;
                        self.keep(&run.id, seen, &scrubber.finish(), cap).await?;
                        return Ok(seen.ended(None, false, Some(reason)));
                    }
                }
                () = self.move_runs.cancelled(), if term_at.is_none() => {
                    // The process keeps running; what the scrubber still holds back (a possible
                    // start of a secret) is dropped rather than stored unscrubbed.
                    tracing::info!(run = %run.id, pid = ?pid, "this replica is stopping: the command keeps running and the run moves to another replica");
                    return Err(Stop::Moved);
                }
                () = tokio::time::sleep_until(alarm) => {
                    match (term_at, kill_at) {
                        (None, _) => {
                            tracing::info!(run = %run.id, "run timed out; stopping it");
                            term_at = Some(tokio::time::Instant::now());
                            if limits.kill_grace.is_zero() {
                                self.stop_process(envd, pid, Signal::Kill).await;
                                kill_at = term_at;
                            } else {
                                self.stop_process(envd, pid, Signal::Term).await;
                            }
                        }
                        (Some(_), None) => {
                            self.stop_process(envd, pid, Signal::Kill).await;
                            kill_at = Some(tokio::time::Instant::now());
                        }
                        (Some(_), Some(_)) => {
                            // The process never reported its end; the sandbox's own timeout ends it.
                            self.keep(&run.id, seen, &scrubber.finish(), cap).await?;
                            return Ok(seen.ended(None, true, Some("the command did not end after SIGKILL".into())));
                        }
                    }
                }
            }
        }
    }

    /// Stores scrubbed output (the head up to the cap, the end in the store's tail) and keeps
    /// the end of it in memory for the report.
    async fn keep(&self, run: &RunId, seen: &mut Seen, bytes: &[u8], cap: u64) -> Result<(), Stop> {
        if bytes.is_empty() {
            return Ok(());
        }
        seen.produced += bytes.len() as u64;
        keep_tail(&mut seen.tail, bytes);
        self.store.append_run_output(run, bytes, cap).await?;
        Ok(())
    }

    /// Fails the run when E2B says its sandbox is gone or paused; any other answer lets the
    /// run's end stand.
    async fn check_sandbox_still_there(&self, sandbox: &SandboxId) -> Result<(), Stop> {
        let gone = match self.e2b.get_sandbox(sandbox).await {
            Err(crate::e2b::E2bError::NotFound { .. }) => true,
            Ok(detail) => detail.listed.state == crate::e2b::SandboxState::Paused,
            Err(_) => false,
        };
        if gone {
            Err(Stop::Failed(
                "the sandbox is gone or paused: it was killed, paused or timed out while the command ran".into(),
            ))
        } else {
            Ok(())
        }
    }

    /// Sends `signal` to the run's process, if its pid is known; a failure is logged (the
    /// sandbox's own timeout still ends it).
    async fn stop_process(&self, envd: &EnvdClient, pid: Option<u32>, signal: Signal) {
        let Some(pid) = pid else {
            tracing::warn!(sandbox = %envd.sandbox_id(), "no pid to signal yet");
            return;
        };
        if let Err(e) = envd.send_signal(pid, signal).await {
            tracing::warn!(sandbox = %envd.sandbox_id(), ?signal, error = %e, "could not signal the run's process");
        }
    }

    /// Records the end of the run with its evidence, then hands its sandbox over.
    async fn finish(
        &self,
        id: &RunId,
        sandbox: Option<SandboxId>,
        ended: Ended,
        deliveries: u64,
    ) -> Result<(), JobError> {
        let now = Utc::now();
        let output_tail = model::last_lines(
            &ended.tail,
            REPORT_OUTPUT_LINES,
            TAIL_LINE_CHARS,
            ended.whole_tail,
        );
        let failed = ended.error.is_some() && !ended.timed_out;
        let outcome = if failed {
            RunOutcome::Failed
        } else {
            model::outcome_of(ended.exit_code, ended.timed_out)
        };
        let status = match outcome {
            RunOutcome::TimedOut => RunStatus::TimedOut,
            RunOutcome::Failed => RunStatus::Failed,
            RunOutcome::Succeeded | RunOutcome::ExitedNonZero => RunStatus::Finished,
        };
        let written = self
            .write(id, |current| {
                (!current.status.is_terminal()).then(|| {
                    let mut next = current.clone();
                    next.status = status;
                    next.sandbox_id = sandbox.clone().or(next.sandbox_id.take());
                    next.exit_code = ended.exit_code;
                    next.outcome = Some(outcome);
                    next.finished_at = Some(now);
                    next.duration_ms = next.started_at.map(|s| millis_between(s, now));
                    next.error = ended.error.clone();
                    next
                })
            })
            .await?;
        if let Err(e) = self.store.delete_run_files(id).await {
            tracing::warn!(run = %id, error = %e, "could not delete the run's inputs");
        }
        tracing::info!(run = %id, status = ?written.status, exit_code = ?written.exit_code, "run ended");
        // The result is out; the evidence (logs, profile) follows before the hand-over, which
        // shows it to people.
        let written = match (&written.sandbox_id, written.finished_at == Some(now)) {
            (Some(sandbox), true) => {
                let (logs_tail, profile) = self.evidence(sandbox, written.started_at, now).await;
                self.write(id, |current| {
                    (current.profile.is_none() && current.logs_tail.is_empty()).then(|| {
                        let mut next = current.clone();
                        next.profile = profile.clone();
                        next.logs_tail = logs_tail.clone();
                        next
                    })
                })
                .await?
            }
            _ => written,
        };
        self.finish_hand_over_with_tail(written, output_tail, deliveries)
            .await
    }

    /// The sandbox's last log lines and the resource profile over the run; failures leave them
    /// empty (the run's result matters more than its evidence).
    async fn evidence(
        &self,
        sandbox: &SandboxId,
        from: Option<DateTime<Utc>>,
        to: DateTime<Utc>,
    ) -> (Vec<String>, Option<crate::cases::RunProfile>) {
        let query = LogsQuery {
            direction: Some(LogsDirection::Backward),
            limit: Some(LOG_TAIL_LINES),
            ..LogsQuery::default()
        };
        let logs = match self.e2b.sandbox_logs(sandbox, &query).await {
            Ok(mut entries) => {
                entries.sort_by_key(|e| e.timestamp);
                entries
                    .iter()
                    .map(|e| {
                        let line = format!("{} {}", e.level.as_str(), e.message);
                        line.chars().take(TAIL_LINE_CHARS).collect()
                    })
                    .collect()
            }
            Err(e) => {
                tracing::warn!(%sandbox, error = %e, "could not read the run's sandbox logs");
                Vec::new()
            }
        };
        // Whole seconds on E2B's side: widen the window so a short run still has its samples.
        let start = from.map(|f| f - chrono::Duration::seconds(1));
        let end = to + chrono::Duration::seconds(1);
        // No waiting for a sample a short run did not get: holding the worker for E2B's next
        // sample (5 s) capped a replica at 4 workers / 5 s = 0.8 runs a second (benches/runs.rs).
        // The run card says such a run was too short to measure.
        let metrics = self.e2b.sandbox_metrics(sandbox, start, Some(end)).await;
        let profile = match metrics {
            Ok(mut metrics) => {
                metrics.sort_by_key(|m| m.timestamp_unix);
                let samples: Vec<Sample> = metrics
                    .iter()
                    .map(|m| Sample {
                        cpu_pct: m.cpu_used_pct,
                        mem_bytes: u64::try_from(m.mem_used).unwrap_or(0),
                        disk_bytes: u64::try_from(m.disk_used).unwrap_or(0),
                    })
                    .collect();
                model::profile(&samples)
            }
            Err(e) => {
                tracing::warn!(%sandbox, error = %e, "could not read the run's sandbox metrics");
                None
            }
        };
        (logs, profile)
    }

    /// A run that was started by a worker whose lease ran out: that replica stopped. The run
    /// fails with the cause, keeps its output, and its sandbox (if any) is handed over.
    async fn take_over(&self, run: Run, deliveries: u64) -> Result<(), JobError> {
        // A run whose process is known is re-attached to: its command went on running in the
        // sandbox while the run changed replicas (a deploy handed it over, or its replica died).
        let mut why_not = None;
        if let (RunStatus::Running, Some(sandbox), Some(process)) =
            (run.status, run.sandbox_id.clone(), run.process)
        {
            match self.reattach(&run, &sandbox, process).await {
                Ok(ended) => return self.finish(&run.id, Some(sandbox), ended, deliveries).await,
                Err(Stop::Moved) => {
                    return Err(JobError::HandBack(format!(
                        "replica {} is stopping; run {} keeps running and moves to another replica",
                        self.worker, run.id
                    )));
                }
                Err(Stop::Store(e)) => return Err(e.into()),
                Err(Stop::Failed(why) | Stop::Retry(why)) => why_not = Some(why),
            }
        }
        self.fail_taken_over(run, why_not, deliveries).await
    }

    /// Follows the process of a run another replica was following (and then the command, when
    /// that was the setup step), from where the store's output ends. Output printed between
    /// the two replicas (well under a second when a deploy hands the run over) may be missing;
    /// the end of a process that exited meanwhile is still had from envd, which keeps it for a
    /// while (30 s), and from the simulator likewise.
    async fn reattach(
        &self,
        run: &Run,
        sandbox: &SandboxId,
        process: RunProcess,
    ) -> Result<Ended, Stop> {
        let detail = match self.e2b.get_sandbox(sandbox).await {
            Ok(detail) if detail.listed.state == crate::e2b::SandboxState::Running => detail,
            Ok(_) => return Err(Stop::Failed("its sandbox is paused".into())),
            Err(crate::e2b::E2bError::NotFound { .. }) => {
                return Err(Stop::Failed("its sandbox is gone".into()));
            }
            Err(e) => return Err(Stop::Failed(format!("E2B did not show its sandbox: {e}"))),
        };
        let address = EnvdAddress::resolve(
            self.sandbox_url.as_deref(),
            sandbox,
            detail.domain.as_deref(),
        );
        let envd = EnvdClient::new(
            sandbox.clone(),
            address,
            detail.envd_access_token.clone(),
            EnvdVersion::announced(&detail.listed.envd_version),
        )
        .map_err(|e| Stop::Failed(envd_sentence(&e)))?;
        let stream = envd.connect(process.pid).await.map_err(|e| {
            Stop::Failed(format!(
                "its process (pid {}) could not be re-attached to: {}",
                process.pid,
                envd_sentence(&e)
            ))
        })?;
        let worker = self.worker.clone();
        self.write(&run.id, |current| {
            (!current.status.is_terminal()).then(|| {
                let mut next = current.clone();
                next.reattached += 1;
                next.worker = Some(worker.clone());
                next
            })
        })
        .await?;
        tracing::info!(run = %run.id, pid = process.pid, phase = ?process.phase, "re-attached to a run's process");
        let inputs = record::inputs(&self.store, &run.id)
            .await?
            .unwrap_or_default();
        let secrets = secret_values(&inputs);
        let started = run.started_at.unwrap_or_else(Utc::now);
        let left = (started + chrono::Duration::seconds(run.timeout_secs as i64) - Utc::now())
            .to_std()
            .unwrap_or(Duration::ZERO);
        let deadline = tokio::time::Instant::now() + left;
        let mut seen = Seen {
            started: true,
            tail: self.output_tail(run).await.into(),
            produced: run.output_bytes,
        };
        let scrubber = Scrubber::new(secrets.clone());
        let ended = self
            .follow(
                run,
                &envd,
                process.phase,
                stream,
                scrubber,
                deadline,
                &mut seen,
            )
            .await?;
        match process.phase {
            RunPhase::Command => Ok(ended),
            RunPhase::Setup => {
                if let Some(ended) = self.after_setup(ended)? {
                    return Ok(ended);
                }
                self.start_command(run, &envd, inputs.env, secrets, deadline, &mut seen)
                    .await
            }
        }
    }

    /// A run that was started by a worker whose lease ran out (that replica stopped) and that
    /// could not be re-attached to: it fails with the cause (and `why_not`), keeps its output,
    /// and its sandbox (if any) is handed over.
    async fn fail_taken_over(
        &self,
        run: Run,
        why_not: Option<String>,
        deliveries: u64,
    ) -> Result<(), JobError> {
        let replica = run.worker.clone().unwrap_or_else(|| "unknown".to_owned());
        let mut sandbox = run.sandbox_id.clone();
        if sandbox.is_none() {
            // Created, but the replica stopped before it could record it.
            sandbox = self.find_sandbox(&run.id).await;
        }
        // Consumer names are unique per process: the same name means this replica lost track
        // of the run (its database failed mid-run), not that it stopped.
        let same = run.worker.as_deref() == Some(self.worker.as_str());
        let mut cause = match (same, sandbox.is_some()) {
            (true, _) => "Steward lost track of the run (its database did not answer) while it was running; its output up to then is kept".to_owned(),
            (false, true) => format!(
                "replica {replica} stopped while the run was running; its output up to then is kept"
            ),
            (false, false) => {
                format!("replica {replica} stopped before the run's sandbox was created")
            }
        };
        if let Some(why) = why_not {
            cause.push_str(&format!(", and {why}"));
        }
        tracing::warn!(run = %run.id, %replica, "taking over a run whose replica stopped");
        let ended = Ended {
            exit_code: None,
            timed_out: false,
            error: Some(cause),
            tail: self.output_tail(&run).await,
            whole_tail: false,
        };
        self.finish(&run.id, sandbox, ended, deliveries).await
    }

    /// The end of the kept output, for a run whose stream this replica did not see: the
    /// store's tail when the output outgrew its head, else the head's end.
    async fn output_tail(&self, run: &Run) -> Vec<u8> {
        if run.output_truncated
            && let Ok(tail) = self.store.run_output_tail(&run.id, TAIL_BYTES as u64).await
            && !tail.is_empty()
        {
            return tail;
        }
        let kept = match self.store.run_output(&run.id, 0, 0).await {
            Ok((_, kept)) => kept,
            Err(_) => return Vec::new(),
        };
        let from = kept.saturating_sub(TAIL_BYTES as u64);
        self.store
            .run_output(&run.id, from, TAIL_BYTES as u64)
            .await
            .map(|(bytes, _)| bytes)
            .unwrap_or_default()
    }

    /// A re-delivered job of a run that ended: hand over if that is still to do.
    async fn finish_hand_over(&self, run: Run, deliveries: u64) -> Result<(), JobError> {
        let tail = self.output_tail(&run).await;
        let lines = model::last_lines(&tail, REPORT_OUTPUT_LINES, TAIL_LINE_CHARS, false);
        self.finish_hand_over_with_tail(run, lines, deliveries)
            .await
    }

    async fn finish_hand_over_with_tail(
        &self,
        run: Run,
        output_tail: Vec<String>,
        deliveries: u64,
    ) -> Result<(), JobError> {
        if run.handed_over {
            return Ok(());
        }
        let report = RunReport {
            run_id: run.id.clone(),
            requester: run.requester.clone(),
            command: run.command.clone(),
            template: run.template.clone(),
            exit_code: run.exit_code,
            duration_ms: run.duration_ms.unwrap_or(0),
            outcome: run.outcome.unwrap_or(RunOutcome::Failed),
            output_tail,
            output_bytes: run.output_bytes,
            output_truncated: run.output_truncated,
            profile: run.profile.clone(),
        };
        let request = HandOverRequest {
            sandbox: run.sandbox_id.clone(),
            report,
            error: run.error.clone(),
            command_started: matches!(
                run.process,
                Some(RunProcess {
                    phase: RunPhase::Command,
                    ..
                })
            ),
            on_finish: self.policy.on_finish,
        };
        let case = match self.hand_over.call(request).await {
            Ok(case) => case,
            Err(HandOverError::Retry(error)) if deliveries < MAX_HAND_OVER_DELIVERIES => {
                tracing::warn!(run = %run.id, %error, "hand-over failed; it is retried");
                return Err(JobError::Transient(format!(
                    "the hand-over of run {} failed: {error}",
                    run.id
                )));
            }
            Err(error) => {
                tracing::error!(run = %run.id, %error, "hand-over failed for good; the sandbox is left to its E2B timeout");
                None
            }
        };
        let stored = self
            .write(&run.id, |current| {
                (!current.handed_over).then(|| {
                    let mut next = current.clone();
                    next.handed_over = true;
                    next.case_id = case.clone().or(next.case_id.take());
                    next
                })
            })
            .await?;
        self.audit_end(&stored).await;
        Ok(())
    }

    /// One audit line on the sandbox (none when the run got no sandbox): how the run ended,
    /// how long it took, and who decides what comes next.
    async fn audit_end(&self, run: &Run) {
        let how = match (run.status, run.exit_code) {
            (RunStatus::Finished, Some(code)) => format!("finished with exit code {code}"),
            (RunStatus::TimedOut, _) => "timed out".to_owned(),
            _ => format!(
                "failed: {}",
                run.error.as_deref().unwrap_or("no reason recorded")
            ),
        };
        let took = run
            .duration_ms
            .map(|ms| format!(" after {:.1} s", ms as f64 / 1000.0))
            .unwrap_or_default();
        let next = match (&run.case_id, &run.sandbox_id) {
            (Some(case), _) => format!("; sandbox handed over to case {case}"),
            (None, Some(_)) => "; sandbox left to its E2B timeout".to_owned(),
            (None, None) => "; it got no sandbox".to_owned(),
        };
        let event = AuditEvent {
            time: Utc::now(),
            case: run.case_id.clone(),
            subject: run.sandbox_id.clone().map(Subject::Sandbox),
            actor: Actor::Agent {
                name: run.requester.clone(),
            },
            action: "run".to_owned(),
            outcome: format!("run {} {how}{took}{next}", run.id),
        };
        if let Err(e) = self.store.append_audit(&event).await {
            tracing::error!(run = %run.id, error = %e, "could not write the run's audit event");
        }
    }
}

/// The values scrubbed from a run's output: its secret variables' and its setup step's.
fn secret_values(inputs: &RunInputs) -> Vec<String> {
    let of = |names: &[String], env: &BTreeMap<String, String>| -> Vec<String> {
        names
            .iter()
            .filter_map(|name| env.get(name).cloned())
            .collect()
    };
    let mut secrets = of(&inputs.secret_env, &inputs.env);
    if let Some(setup) = &inputs.setup {
        // Scrubbed from the command's output too: belt and braces, the command never had them.
        secrets.extend(of(&setup.secret_env, &setup.env));
    }
    secrets
}

/// Keeps the last [`TAIL_BYTES`] of the output.
fn keep_tail(tail: &mut VecDeque<u8>, bytes: &[u8]) {
    let bytes = &bytes[bytes.len().saturating_sub(TAIL_BYTES)..];
    let overflow = (tail.len() + bytes.len()).saturating_sub(TAIL_BYTES);
    tail.drain(..overflow.min(tail.len()));
    tail.extend(bytes);
}

fn millis_between(from: DateTime<Utc>, to: DateTime<Utc>) -> u64 {
    u64::try_from((to - from).num_milliseconds()).unwrap_or(0)
}
