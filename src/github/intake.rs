//! Carries out what a push decides: remember the delivery (a redelivery does nothing), audit
//! the decision, submit the run, record its [`PushTest`] and make it the branch's latest run
//! (which supersedes the one before). Fast: the run itself is the durable job's.
use chrono::Utc;

use super::event::PushEvent;
use super::plan::{self, Decision};
use super::rules::GithubSettings;
use crate::ids::RunId;
use crate::runs::{RunError, Runner};
use crate::store::{Actor, AuditEvent, PushTest, Store, StoreError};

/// The audit actor of every GitHub decision.
pub const AUDIT_PART: &str = "github";

/// What came of a push.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Nothing runs; the sentence says why (also the audit outcome).
    Ignored(String),
    /// This delivery was handled before.
    AlreadyHandled,
    /// A run was queued; `supersedes` is the branch's previous run, if any.
    Started {
        run: RunId,
        supersedes: Option<RunId>,
    },
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
    #[error("Steward's database (Redis) failed, so the push was not acted on: {0}")]
    Store(#[from] StoreError),
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
        Ok(Outcome::Ignored(why)) => audit(store, &repository, why.clone()).await,
        Ok(Outcome::Started { run, supersedes }) => {
            let mut outcome = format!(
                "started run {run} for {} at {}",
                event.branch().unwrap_or("?"),
                &event.after[..event.after.len().min(12)]
            );
            if let Some(older) = supersedes {
                outcome.push_str(&format!("; supersedes run {older}"));
            }
            audit(store, &repository, outcome).await;
        }
        Ok(Outcome::AlreadyHandled) => {}
        Err(e @ IntakeError::Unrecorded { .. }) => {
            audit(store, &repository, format!("started, not recorded: {e}")).await;
        }
        Err(e) => {
            if let Err(forget) = store.forget_delivery(delivery).await {
                tracing::warn!(error = %forget, "could not forget a failed delivery; its redelivery will be ignored");
            }
            audit(store, &repository, format!("not run: {e}")).await;
        }
    }
    result
}

async fn start(
    store: &Store,
    runner: Option<&Runner>,
    settings: &GithubSettings,
    delivery: &str,
    event: &PushEvent,
) -> Result<Outcome, IntakeError> {
    let (rule, branch) = match plan::decide(&settings.push_tests, event) {
        Decision::Ignore(why) => return Ok(Outcome::Ignored(why)),
        Decision::Run { rule, branch } => (rule, branch),
    };
    let runner = runner.ok_or(IntakeError::NoRunner)?;
    let request = plan::run_request(rule, event, settings.token.as_ref());
    let requester = format!("github:{}", rule.repository);
    let run = runner.submit(&requester, request).await?;
    let unrecorded = |error| IntakeError::Unrecorded {
        run: run.id.clone(),
        error,
    };
    let test = plan::push_test(rule, event, &branch, run.id.clone(), delivery);
    store.record_push_test(&test).await.map_err(unrecorded)?;
    let supersedes = store
        .set_latest_push_run(&rule.repository, &branch, &run.id)
        .await
        .map_err(unrecorded)?;
    if let Some(older) = &supersedes {
        // The older run stops at its next check (its sandbox goes to its hand-over).
        store
            .request_run_stop(older, &format!("superseded by {}", event.after))
            .await?;
    }
    tracing::info!(run = %run.id, repository = %rule.repository, branch, "push test queued");
    Ok(Outcome::Started {
        run: run.id,
        supersedes,
    })
}

/// Whether a newer push to the same branch has replaced `run`: the newer commit's sha, or
/// `None` while `run` is the branch's latest (or is no push test at all).
pub async fn superseded(store: &Store, run: &RunId) -> Result<Option<String>, StoreError> {
    let Some(test) = store.push_test_for_run(run).await? else {
        return Ok(None);
    };
    let Some(latest) = store
        .latest_push_run(&test.repository, &test.branch)
        .await?
    else {
        return Ok(None);
    };
    if &latest == run {
        return Ok(None);
    }
    let newer: Option<PushTest> = store.push_test_for_run(&latest).await?;
    Ok(Some(
        newer.map(|t| t.after).unwrap_or_else(|| latest.to_string()),
    ))
}
