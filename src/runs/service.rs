//! [`Runner`]: what the HTTP API, MCP and CLI call to start a run and follow it. `submit`
//! checks the request, stores the run and queues its job; nothing touches E2B here (the job
//! does, on whichever replica claims it), so a refused request or a database that cannot be
//! reached never leaves a sandbox behind.
//!
//! Which env values are secret: every variable named in `secret_env` (`[]` names none, on
//! purpose); when a request has no `secret_env`, every env value of at least
//! [`DEFAULT_SECRET_MIN_CHARS`] characters (a token or a password, not
//! `1` or `true`, whose scrubbing would only wreck the output). Their values are replaced by
//! `[scrubbed]` in the output; no env value and no file's content is ever in the run record.
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;

use super::model::{Run, RunInputError, RunPolicy, RunRequest, RunStatus};
use super::record::{self, RunInputs};
use crate::ids::RunId;
use crate::store::{Job, Store, StoreError};

/// The most output one [`Runner::output`] call returns.
pub const MAX_OUTPUT_READ_BYTES: u64 = 1024 * 1024;
/// How long [`Runner::wait`] and [`Runner::output_wait`] wait, at most, between two reads of the
/// run when no change wakes them (the default of `[runs] wake_fallback`): a change of the run
/// wakes them at once (see [`crate::store::RunWatch`]), so this only bounds what a lost
/// notification costs.
pub const WAKE_FALLBACK: Duration = Duration::from_secs(2);
/// When a request names no `secret_env`, env values at least this long are scrubbed.
pub const DEFAULT_SECRET_MIN_CHARS: usize = 8;
/// No run's output is this long (a Redis string holds at most 512 MiB), so an offset past it
/// reads nothing; offsets are cut to it so the store is never asked for a range it cannot
/// express (Redis takes signed 64-bit offsets).
const FURTHEST_OFFSET: u64 = 1 << 40;
/// How far back in the runs queue [`Runner::queue_position`] looks for a run.
pub const QUEUE_POSITION_UP_TO: u64 = 1000;

/// The names of `env` whose values are scrubbed from the output: `named` when the request has a
/// `secret_env` (even an empty one), else every variable whose value has at least
/// [`DEFAULT_SECRET_MIN_CHARS`] characters.
pub fn secret_names(
    env: &std::collections::BTreeMap<String, String>,
    named: Option<Vec<String>>,
) -> Vec<String> {
    if let Some(named) = named {
        return named;
    }
    env.iter()
        .filter(|(_, value)| value.chars().count() >= DEFAULT_SECRET_MIN_CHARS)
        .map(|(name, _)| name.clone())
        .collect()
}

/// Why a run could not be started or read. `Display` is a sentence for the caller.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The request broke a rule; the field is named. Nothing was stored.
    #[error("{0}")]
    Input(#[from] RunInputError),
    #[error("There is no run {0}.")]
    NotFound(RunId),
    /// Redis could not be reached: nothing was stored and no sandbox was created.
    #[error(
        "Steward can't reach its database (Redis), so nothing was started. Try again in a minute."
    )]
    StoreUnavailable(String),
    #[error("Steward's database failed: {0}")]
    Store(String),
}

impl From<StoreError> for RunError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Unavailable(reason) | StoreError::Unconfirmed(reason) => {
                RunError::StoreUnavailable(reason)
            }
            other => RunError::Store(other.to_string()),
        }
    }
}

/// A slice of a run's output, as it streams.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputChunk {
    /// stdout and stderr interleaved as they came.
    pub bytes: Vec<u8>,
    /// Where to continue reading from.
    pub next: u64,
    /// The run has ended and everything kept has been read.
    pub finished: bool,
    /// The run produced more than the cap; the rest was counted, not kept.
    pub truncated: bool,
}

/// Starts runs and reads them back. Cheap to clone; holds no secrets.
#[derive(Clone)]
pub struct Runner {
    store: Store,
    policy: Arc<RunPolicy>,
}

impl std::fmt::Debug for Runner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runner")
            .field("store", &self.store)
            .field("limits", &self.policy.limits)
            .finish_non_exhaustive()
    }
}

impl Runner {
    pub fn new(store: Store, policy: Arc<RunPolicy>) -> Self {
        Self { store, policy }
    }

    /// The `[runs]` policy runs are checked against.
    pub fn policy(&self) -> &RunPolicy {
        &self.policy
    }

    /// Checks `req`, stores the run (Queued) and queues its job. `requester` is the API token's
    /// name (or `cli`). A refused request stores nothing.
    pub async fn submit(&self, requester: &str, req: RunRequest) -> Result<Run, RunError> {
        let requester = requester.trim();
        if requester.is_empty() {
            return Err(RunError::Input(RunInputError {
                field: "requester".into(),
                message: "is empty".into(),
                too_large: false,
            }));
        }
        let valid = req.validate(&self.policy.limits)?;
        let request = valid.request;
        let id = RunId::parse(format!("run_{}", uuid::Uuid::new_v4().simple()))
            .map_err(|e| RunError::Store(e.to_string()))?;
        let run = Run {
            id: id.clone(),
            requester: requester.to_owned(),
            template: request.template.trim().to_owned(),
            command: request.command,
            files: request
                .files
                .iter()
                .map(|f| (f.path.trim().to_owned(), f.content.len() as u64))
                .collect(),
            cwd: request.cwd,
            timeout_secs: valid.timeout.as_secs().max(1),
            status: RunStatus::Queued,
            sandbox_id: None,
            created_at: Utc::now(),
            started_at: None,
            finished_at: None,
            exit_code: None,
            outcome: None,
            duration_ms: None,
            output_bytes: 0,
            output_truncated: false,
            profile: None,
            logs_tail: Vec::new(),
            error: None,
            case_id: None,
            worker: None,
            handed_over: false,
            process: None,
            reattached: 0,
        };
        let inputs = RunInputs {
            files: request.files,
            secret_env: secret_names(&request.env, request.secret_env),
            env: request.env,
            setup: request.setup,
        };
        record::create(&self.store, &run, &inputs).await?;
        if let Err(e) = self.store.enqueue(&Job::Run { run_id: id.clone() }).await {
            // Without its job nobody would ever run it: say so on the record, if Redis lets us.
            let reason = format!("it could not be queued: {e}");
            let marked = record::update(&self.store, &id, |current| {
                (current.status == RunStatus::Queued).then(|| {
                    let mut next = current.clone();
                    next.status = RunStatus::Failed;
                    next.error = Some(reason.clone());
                    next.finished_at = Some(Utc::now());
                    next
                })
            })
            .await;
            if let Err(mark) = marked {
                tracing::error!(run = %id, error = %mark, "a run that could not be queued stays Queued");
            }
            // Its env values may be secrets: they must not outlive a run that will never start.
            if let Err(gone) = self.store.delete_run_files(&id).await {
                tracing::error!(run = %id, error = %gone, "the inputs of a run that could not be queued were not deleted");
            }
            return Err(e.into());
        }
        tracing::info!(run = %id, requester, template = %run.template, "run queued");
        Ok(run)
    }

    /// The run as stored now.
    pub async fn get(&self, id: &RunId) -> Result<Run, RunError> {
        record::load(&self.store, id)
            .await?
            .ok_or_else(|| RunError::NotFound(id.clone()))
    }

    /// Where a queued run waits for a runs worker: 1 when it is next, 2 with one run ahead of
    /// it, …; `None` once a worker has it (or it is further back than
    /// [`QUEUE_POSITION_UP_TO`], or not queued).
    pub async fn queue_position(&self, run: &Run) -> Result<Option<u64>, RunError> {
        if run.status != RunStatus::Queued {
            return Ok(None);
        }
        let job = Job::Run {
            run_id: run.id.clone(),
        };
        Ok(self
            .store
            .queue_position(&job, QUEUE_POSITION_UP_TO)
            .await?)
    }

    /// Returns once the run has ended, or when `up_to` has passed (the run as it is then).
    /// Woken by the run's changes, not by polling: see [`WAKE_FALLBACK`].
    pub async fn wait(&self, id: &RunId, up_to: Duration) -> Result<Run, RunError> {
        let deadline = tokio::time::Instant::now() + up_to;
        // Registered before the first read, so a change between the read and the wait wakes it.
        let mut watch = self.store.watch_run(id).await;
        loop {
            let run = self.get(id).await?;
            let now = tokio::time::Instant::now();
            if run.status.is_terminal() || now >= deadline {
                return Ok(run);
            }
            watch
                .changed(self.policy.wake_fallback.min(deadline - now))
                .await;
        }
    }

    /// The run's output from `from` as [`Runner::output`] reads it, waiting up to `up_to` for
    /// new bytes or the run's end when there are none yet. Woken by the run's changes, not by
    /// polling: see [`WAKE_FALLBACK`].
    pub async fn output_wait(
        &self,
        id: &RunId,
        from: u64,
        up_to: Duration,
    ) -> Result<OutputChunk, RunError> {
        let deadline = tokio::time::Instant::now() + up_to;
        let mut watch = if up_to.is_zero() {
            None
        } else {
            Some(self.store.watch_run(id).await)
        };
        loop {
            let chunk = self.output(id, from).await?;
            let now = tokio::time::Instant::now();
            let Some(watch) = watch.as_mut() else {
                return Ok(chunk);
            };
            if !chunk.bytes.is_empty() || chunk.finished || now >= deadline {
                return Ok(chunk);
            }
            watch
                .changed(self.policy.wake_fallback.min(deadline - now))
                .await;
        }
    }

    /// The run's kept output from byte `from` (at most [`MAX_OUTPUT_READ_BYTES`] at once).
    pub async fn output(&self, id: &RunId, from: u64) -> Result<OutputChunk, RunError> {
        // Read the run first: once it is terminal, every byte of its output is already stored.
        let run = self.get(id).await?;
        let from = from.min(FURTHEST_OFFSET);
        let (bytes, kept) = self
            .store
            .run_output(id, from, MAX_OUTPUT_READ_BYTES)
            .await?;
        let next = from.min(kept) + bytes.len() as u64;
        Ok(OutputChunk {
            finished: run.status.is_terminal() && next >= kept,
            truncated: run.output_truncated,
            next,
            bytes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_secrets_win_and_without_names_every_long_value_is_secret() {
        let env: std::collections::BTreeMap<String, String> = [
            ("TOKEN", "ghp_0123456789"),
            ("PASSWORD", "hunter22"),
            ("SHORT", "hunter2"),
            ("DEBUG", "1"),
            ("MODE", "release"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        assert_eq!(
            secret_names(&env, None),
            vec!["PASSWORD".to_owned(), "TOKEN".to_owned()]
        );
        assert_eq!(
            secret_names(&env, Some(vec!["DEBUG".into()])),
            vec!["DEBUG".to_owned()]
        );
        assert!(secret_names(&env, Some(Vec::new())).is_empty());
    }
}
