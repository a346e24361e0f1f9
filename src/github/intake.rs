//! Carries out what a push decides: remember the delivery (a redelivery does nothing), audit
//! the decision, queue the push (`queue`: a newer push of a branch drops its older one still
//! waiting and stops its running one), and start what the caps allow: submit the run, record
//! its `PushTest` and make it the branch's latest run. Fast: the run itself is the durable
//! job's. [`run_ended`] frees a run's slot and starts the next pushes waiting.
use chrono::Utc;

use super::event::PushEvent;
use super::plan::{self, Decision};
use super::queue::{self, Admission, AdmissionLock, PushPoint, Running, Waiting};
use super::rules::GithubSettings;
use crate::ids::RunId;
use crate::runs::{RunError, Runner};
use crate::store::{Actor, AuditEvent, Store, StoreError};

/// The audit actor of every GitHub decision.
pub const AUDIT_PART: &str = "github";

/// What came of a push.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Nothing runs; the sentence says why (also the audit outcome).
    Ignored(String),
    /// This delivery was handled before.
    AlreadyHandled,
    /// A replay or a push older than the branch's newest one: nothing runs, nothing is
    /// superseded; the sentence says why (also the audit outcome).
    Refused(String),
    /// A run was queued; `supersedes` is the branch's previous run, if any.
    Started {
        run: RunId,
        supersedes: Option<RunId>,
    },
    /// The caps are reached: the push waits, `position` in line (from 1); it starts when a
    /// run ends.
    Waiting { position: usize },
}

/// Why a push could not be acted on. Nothing was started, and the delivery is forgotten so
/// GitHub's redelivery tries again.
#[derive(Debug, thiserror::Error)]
pub enum IntakeError {
    #[error(
        "E2B is not configured on this Steward (E2B_API_KEY is not set), so pushes cannot be tested."
    )]
    NoRunner,
    #[error("{0}")]
    Run(#[from] RunError),
    /// The configuration changed while the push waited in the queue; the sentence says how.
    #[error("the configuration changed while the push waited, so it no longer runs ({0})")]
    NoLongerConfigured(String),
    #[error("Steward's database (Redis) failed, so the push was not acted on: {0}")]
    Store(#[from] StoreError),
    /// The GitHub App's installation token for the clone could not be had.
    #[error("{0}")]
    Credential(#[from] super::AppError),
    /// The run was submitted, but what links it to its push (the push-test record, the branch's
    /// latest run) could not be written. The delivery stays handled: a redelivery must not start
    /// a second run.
    #[error(
        "run {run} was started, but Steward could not record it as the branch's latest run ({error}), so a newer push may not supersede it"
    )]
    Unrecorded { run: RunId, error: StoreError },
}

async fn audit(store: &Store, repository: &str, outcome: String) {
    let event = AuditEvent {
        time: Utc::now(),
        case: None,
        subject: None,
        actor: Actor::Steward {
            part: AUDIT_PART.into(),
        },
        action: format!("push:{repository}"),
        outcome,
    };
    if let Err(e) = store.append_audit(&event).await {
        tracing::warn!(error = %e, "could not audit a GitHub push decision");
    }
}

/// Acts on one verified push delivery.
pub async fn handle_push(
    store: &Store,
    runner: Option<&Runner>,
    settings: &GithubSettings,
    delivery: &str,
    event: &PushEvent,
) -> Result<Outcome, IntakeError> {
    let repository = event.repository.full_name.clone();
    if !store.first_delivery(delivery).await? {
        audit(
            store,
            &repository,
            format!("already handled: delivery {delivery} came again"),
        )
        .await;
        return Ok(Outcome::AlreadyHandled);
    }
    let result = start(store, runner, settings, delivery, event).await;
    match &result {
        Ok(Outcome::Ignored(why) | Outcome::Refused(why)) => {
            audit(store, &repository, format!("{why} (delivery {delivery})")).await;
        }
        Ok(Outcome::Started { run, supersedes }) => {
            let mut outcome = format!(
                "started run {run} for {} at {}",
                event.branch().unwrap_or("?"),
                short(&event.after)
            );
            if let Some(older) = supersedes {
                outcome.push_str(&format!("; supersedes run {older}"));
            }
            audit(store, &repository, outcome).await;
        }
        Ok(Outcome::Waiting { position }) => {
            audit(
                store,
                &repository,
                format!(
                    "queued {} at {}: {position} in line for a push-test slot",
                    event.branch().unwrap_or("?"),
                    short(&event.after)
                ),
            )
            .await;
        }
        Ok(Outcome::AlreadyHandled) => {}
        Err(e @ IntakeError::Unrecorded { .. }) => {
            audit(store, &repository, format!("started, not recorded: {e}")).await;
        }
        Err(e) => {
            if let Err(forget) = store.forget_delivery(delivery).await {
                tracing::warn!(error = %forget, "could not forget a failed delivery; its redelivery will be ignored");
            }
            if let Err(forget) = store
                .forget_push_of_commit(&repository, &event.git_ref, &event.after)
                .await
            {
                tracing::warn!(error = %forget, "could not forget a failed push's commit mark; its redelivery will be refused");
            }
            audit(store, &repository, format!("not run: {e}")).await;
        }
    }
    result
}

fn short(sha: &str) -> &str {
    &sha[..sha.len().min(12)]
}

async fn start(
    store: &Store,
    runner: Option<&Runner>,
    settings: &GithubSettings,
    delivery: &str,
    event: &PushEvent,
) -> Result<Outcome, IntakeError> {
    let branch = match plan::decide(&settings.push_tests, event) {
        Decision::Ignore(why) => return Ok(Outcome::Ignored(why)),
        Decision::Run { branch, .. } => branch,
    };
    let runner = runner.ok_or(IntakeError::NoRunner)?;
    let lock = AdmissionLock::take(store).await?;
    let result = enqueue(store, runner, settings, delivery, event, branch).await;
    lock.release(store).await;
    result
}

/// Queues the push and starts what the caps allow; holds the admission lease.
async fn enqueue(
    store: &Store,
    runner: &Runner,
    settings: &GithubSettings,
    delivery: &str,
    event: &PushEvent,
    branch: String,
) -> Result<Outcome, IntakeError> {
    let repository = event.repository.full_name.clone();
    let mut state = queue::load(store).await?;
    prune(runner, &mut state).await;
    // A replay of an old push, or a push older than the branch's newest, must not replace a
    // newer commit's run (nor drop its place in the queue).
    let seen = !store
        .first_push_of_commit(&repository, &event.git_ref, &event.after)
        .await?;
    let known = newest_known(store, &state, &repository, &branch).await?;
    if let Some(why) = queue::refuse_older(&PushPoint::of(event), known.as_ref(), seen) {
        tracing::warn!(%repository, %branch, %why, "push refused");
        return Ok(Outcome::Refused(why));
    }
    // An older push of this branch still waiting would test an outdated commit.
    let (older, rest): (Vec<Waiting>, Vec<Waiting>) = std::mem::take(&mut state.waiting)
        .into_iter()
        .partition(|w| w.repository.eq_ignore_ascii_case(&repository) && w.branch == branch);
    state.waiting = rest;
    for dropped in older {
        audit(
            store,
            &dropped.repository,
            format!(
                "dropped the queued push of {branch} at {}: superseded by {}",
                short(&dropped.event.after),
                short(&event.after)
            ),
        )
        .await;
    }
    // The branch's run still going tests an outdated commit too: it stops at its next check
    // (its sandbox goes to its hand-over, which kills it).
    if let Some(latest) = store.latest_push_run(&repository, &branch).await?
        && let Ok(run) = runner.get(&latest).await
        && !run.status.is_terminal()
    {
        store
            .request_run_stop(&latest, &format!("superseded by {}", event.after))
            .await?;
    }
    state.waiting.push(Waiting {
        delivery: delivery.to_owned(),
        repository: repository.clone(),
        branch,
        queued_at: Utc::now(),
        event: event.clone(),
    });
    let started = admit(store, runner, settings, &mut state).await;
    queue::save(store, &state).await?;
    let mut ours = None;
    for (waiting, result) in started {
        if waiting.delivery == delivery {
            ours = Some(result);
        } else {
            audit_start(store, &waiting, &result).await;
        }
    }
    match ours {
        Some(Ok((run, supersedes))) => Ok(Outcome::Started { run, supersedes }),
        Some(Err(e)) => Err(e),
        None => {
            let position = state
                .waiting
                .iter()
                .position(|w| w.delivery == delivery)
                .map_or(1, |i| i + 1);
            Ok(Outcome::Waiting { position })
        }
    }
}

/// The branch's newest push Steward knows of: the one waiting for a slot, else the one its
/// latest run tested.
async fn newest_known(
    store: &Store,
    state: &Admission,
    repository: &str,
    branch: &str,
) -> Result<Option<PushPoint>, StoreError> {
    if let Some(waiting) = state
        .waiting
        .iter()
        .rev()
        .find(|w| w.repository.eq_ignore_ascii_case(repository) && w.branch == branch)
    {
        return Ok(Some(PushPoint::of(&waiting.event)));
    }
    let Some(run) = store.latest_push_run(repository, branch).await? else {
        return Ok(None);
    };
    Ok(store.push_test_for_run(&run).await?.map(|test| PushPoint {
        before: test.before,
        after: test.after,
        committed_at: test.committed_at,
    }))
}

/// Drops the runs that ended from the running list (their hand-over may not have said so).
async fn prune(runner: &Runner, state: &mut Admission) {
    let mut keep = Vec::with_capacity(state.running.len());
    for r in std::mem::take(&mut state.running) {
        match runner.get(&r.run).await {
            Ok(run) if run.status.is_terminal() => {}
            Err(RunError::NotFound(_)) => {}
            // Running, or unknown for now (Redis hiccup): it keeps its slot.
            _ => keep.push(r),
        }
    }
    state.running = keep;
}

type Started = Result<(RunId, Option<RunId>), IntakeError>;

/// Starts the waiting pushes the caps allow, in order; moves them to `running`.
async fn admit(
    store: &Store,
    runner: &Runner,
    settings: &GithubSettings,
    state: &mut Admission,
) -> Vec<(Waiting, Started)> {
    let picks = queue::plan(state, settings.caps);
    let mut picked = Vec::with_capacity(picks.len());
    for i in picks.into_iter().rev() {
        picked.push(state.waiting.remove(i));
    }
    picked.reverse();
    let mut results = Vec::with_capacity(picked.len());
    for waiting in picked {
        let result = launch(store, runner, settings, &waiting).await;
        if let Ok((run, _)) | Err(IntakeError::Unrecorded { run, .. }) = &result {
            state.running.push(Running {
                run: run.clone(),
                repository: waiting.repository.clone(),
            });
        }
        results.push((waiting, result));
    }
    results
}

/// Submits the run of one waiting push and records it as its branch's latest.
async fn launch(
    store: &Store,
    runner: &Runner,
    settings: &GithubSettings,
    waiting: &Waiting,
) -> Started {
    let event = &waiting.event;
    let rule = match plan::decide(&settings.push_tests, event) {
        Decision::Run { rule, .. } => rule,
        // The configuration changed while it waited.
        Decision::Ignore(why) => {
            return Err(IntakeError::NoLongerConfigured(why));
        }
    };
    let token = clone_credential(settings, rule).await?;
    let request = plan::run_request(rule, event, token.as_ref());
    let requester = format!("github:{}", rule.repository);
    let run = runner.submit(&requester, request).await?;
    let unrecorded = |error| IntakeError::Unrecorded {
        run: run.id.clone(),
        error,
    };
    let test = plan::push_test(
        rule,
        event,
        &waiting.branch,
        run.id.clone(),
        &waiting.delivery,
    );
    store.record_push_test(&test).await.map_err(unrecorded)?;
    let supersedes = store
        .set_latest_push_run(&rule.repository, &waiting.branch, &run.id)
        .await
        .map_err(unrecorded)?;
    tracing::info!(run = %run.id, repository = %rule.repository, branch = %waiting.branch, "push test started");
    Ok((run.id, supersedes))
}

/// The credential the clone of `rule`'s repository gets: none for a local clone URL, else a
/// fresh installation token when a GitHub App is configured, else `GITHUB_TOKEN`.
async fn clone_credential(
    settings: &GithubSettings,
    rule: &super::PushTestRule,
) -> Result<Option<secrecy::SecretString>, IntakeError> {
    if plan::credential_host(&plan::clone_url(rule)).is_none() {
        return Ok(None);
    }
    match &settings.app {
        Some(app) => Ok(Some(app.installation_token(&rule.repository).await?)),
        None => Ok(settings.token.clone()),
    }
}

/// The audit line of a push that started (or failed to) after waiting in the queue.
async fn audit_start(store: &Store, waiting: &Waiting, result: &Started) {
    let waited = (Utc::now() - waiting.queued_at).num_seconds().max(0);
    let outcome = match result {
        Ok((run, _)) => format!(
            "started run {run} for {} at {} after {waited} s in the queue",
            waiting.branch,
            short(&waiting.event.after)
        ),
        Err(e) => format!("not run after {waited} s in the queue: {e}"),
    };
    audit(store, &waiting.repository, outcome).await;
}

/// A push-test run ended: frees its slot and starts the pushes waiting that now fit. Called by
/// the run's hand-over; a failure is only logged (the catch-up loop starts them later).
pub async fn run_ended(
    store: &Store,
    runner: &Runner,
    settings: &GithubSettings,
    run: &RunId,
) -> Result<(), StoreError> {
    admit_waiting(store, runner, settings, Some(run)).await
}

/// Starts the pushes waiting that fit, after dropping the runs that ended (and `ended`). Cheap
/// when nothing waits: one read, no lease.
async fn admit_waiting(
    store: &Store,
    runner: &Runner,
    settings: &GithubSettings,
    ended: Option<&RunId>,
) -> Result<(), StoreError> {
    if ended.is_none() && queue::load(store).await?.waiting.is_empty() {
        return Ok(());
    }
    let lock = AdmissionLock::take(store).await?;
    let result = async {
        let mut state = queue::load(store).await?;
        if let Some(run) = ended {
            state.running.retain(|r| &r.run != run);
        }
        prune(runner, &mut state).await;
        let started = admit(store, runner, settings, &mut state).await;
        queue::save(store, &state).await?;
        for (waiting, result) in &started {
            audit_start(store, waiting, result).await;
        }
        Ok(())
    }
    .await;
    lock.release(store).await;
    result
}

/// Every `every` until `shutdown`: starts waiting pushes whose slot was freed without a hand-over
/// saying so (a replica that died mid-run, a hand-over that could not reach Redis).
pub async fn run_catch_up(
    store: Store,
    runner: Runner,
    settings: std::sync::Arc<GithubSettings>,
    every: std::time::Duration,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            () = tokio::time::sleep(every) => {}
        }
        if let Err(e) = admit_waiting(&store, &runner, &settings, None).await {
            tracing::warn!(error = %e, "could not start the push tests waiting; trying again later");
        }
    }
}
