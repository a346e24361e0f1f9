//! Timeouts that shorten a sandbox's life: `/sandbox timeout` and `/sandbox resume timeout=…`.
//!
//! A timeout ends a sandbox when it runs out, so one that would end a running sandbox sooner
//! than `[approvals] min_timeout` is a kill in disguise. Such a `timeout` opens a kill case
//! instead (the card says what was asked); a `resume` with such a timeout is refused with a
//! sentence. Extending a sandbox's life (and `refresh`) is always allowed, and every timeout
//! change is audited.
//! This file must not kill anything: a kill only ever happens through a case.
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::Services;
use super::request::{self, CaseRequest};
use crate::cases::Subject;
use crate::e2b::{E2bError, SandboxState};
use crate::execute::{self, Context, sentence};
use crate::ids::SandboxId;
use crate::slack::format::{human_duration, typed_duration};
use crate::slack::render::{FailureParams, Message};
use crate::store::{Actor, AuditEvent};

/// What a lifetime command asked for.
#[derive(Debug, Clone)]
pub enum LifetimeChange {
    /// `/sandbox timeout <id> <duration>`.
    Timeout { id: SandboxId, duration: Duration },
    /// `/sandbox resume <id> [timeout=…]`.
    Resume {
        id: SandboxId,
        timeout: Option<Duration>,
    },
    /// `/sandbox refresh <id> <duration>`: free, since it never ends a sandbox sooner, but
    /// audited like every other timeout change.
    Refresh { id: SandboxId, duration: Duration },
}

/// Whether a new end `duration` from `now` shortens a sandbox that would otherwise end at
/// `end_at` below the floor. Pure, so the rule is tested without E2B.
pub fn needs_a_case(
    duration: Duration,
    floor: Duration,
    state: SandboxState,
    end_at: DateTime<Utc>,
    now: DateTime<Utc>,
) -> bool {
    if duration >= floor {
        return false;
    }
    let new_end = now + chrono::Duration::from_std(duration).unwrap_or_default();
    // Extending a running sandbox is always allowed, even by less than the floor.
    !(state == SandboxState::Running && new_end >= end_at)
}

/// Appends an audit event about a timeout change (no case involved).
async fn append_change(
    svc: &Services,
    user: &crate::ids::SlackUserId,
    id: &SandboxId,
    action: &str,
    outcome: String,
) -> Result<(), crate::store::StoreError> {
    let event = AuditEvent {
        time: Utc::now(),
        case: None,
        subject: Some(Subject::Sandbox(id.clone())),
        actor: Actor::Person { user: user.clone() },
        action: action.to_owned(),
        outcome,
    };
    svc.store.append_audit(&event).await
}

/// Audits the outcome of a change. A failed append is logged, not raised: the change has
/// already happened (its request was audited) and must still be reported to the person.
async fn audit_change(
    svc: &Services,
    user: &crate::ids::SlackUserId,
    id: &SandboxId,
    action: &str,
    outcome: String,
) {
    if let Err(e) = append_change(svc, user, id, action, outcome).await {
        tracing::error!(sandbox = %id, action, error = %e, "could not write the audit log");
    }
}

/// What the change asks for, in the words of the audit log.
fn asked(change: &LifetimeChange) -> (&'static str, &SandboxId, String) {
    match change {
        LifetimeChange::Timeout { id, duration } => (
            "timeout",
            id,
            format!("asked: {}", human_duration(*duration)),
        ),
        LifetimeChange::Resume { id, timeout } => (
            "resume",
            id,
            match timeout {
                Some(t) => format!("asked: timeout {}", human_duration(*t)),
                None => "asked: default timeout".to_owned(),
            },
        ),
        LifetimeChange::Refresh { id, duration } => (
            "refresh",
            id,
            format!("asked: {}", human_duration(*duration)),
        ),
    }
}

/// Runs a timeout or resume command for `req.user`, opening a kill case when the change would
/// end the sandbox sooner than the floor.
pub async fn change_lifetime(
    svc: &Services,
    req: CaseRequest,
    change: LifetimeChange,
    now: DateTime<Utc>,
) -> Message {
    let floor = svc.policy.min_timeout;
    let ctx = Context {
        e2b: svc.e2b.as_ref(),
        templates: &svc.templates,
        now,
    };
    let failure = |sentence: String| svc.templates.render_or_plain(&FailureParams { sentence });
    // The request is audited before anything else: a change that cannot be recorded is not
    // made, and when Redis is down E2B hears nothing.
    let (action, id, what) = asked(&change);
    if let Err(e) = append_change(svc, &req.user, id, action, what).await {
        tracing::warn!(error = %e, "timeout change refused: the audit log cannot be written");
        return failure(
            "Steward can't reach its database (Redis), so the change could not be recorded and nothing was sent to E2B. Try again in a minute.".into(),
        );
    }
    match change {
        LifetimeChange::Refresh { id, duration } => {
            let outcome = execute::refresh(&ctx, &id, duration).await;
            let what = match &outcome {
                Ok(_) => format!("kept alive for {}", human_duration(duration)),
                Err((_, e)) => format!("error: {e}"),
            };
            audit_change(svc, &req.user, &id, "refresh", what).await;
            outcome.unwrap_or_else(|(subject, e)| failure(sentence(&subject, &e)))
        }
        LifetimeChange::Resume { id, timeout } => {
            if let Some(t) = timeout.filter(|t| *t < floor) {
                audit_change(
                    svc,
                    &req.user,
                    &id,
                    "resume",
                    format!("refused: timeout {} is below the floor", human_duration(t)),
                )
                .await;
                return failure(format!(
                    "A timeout of {} would end `{id}` without a decision (the floor is {}). Resume it with `timeout={}` or more, or ask for a kill with `/sandbox kill {id}`.",
                    human_duration(t),
                    human_duration(floor),
                    typed_duration(floor),
                ));
            }
            let outcome = execute::resume(&ctx, &id, timeout).await;
            let what = match &outcome {
                Ok(_) => "resumed".to_owned(),
                Err((_, e)) => format!("error: {e}"),
            };
            audit_change(svc, &req.user, &id, "resume", what).await;
            outcome.unwrap_or_else(|(subject, e)| failure(sentence(&subject, &e)))
        }
        LifetimeChange::Timeout { id, duration } => {
            let human = human_duration(duration);
            if duration < floor {
                let Some(e2b) = svc.e2b.as_ref() else {
                    return failure(sentence(
                        &format!("Sandbox `{id}`"),
                        &E2bError::NotConfigured("E2B_API_KEY is not set"),
                    ));
                };
                let detail = match e2b.get_sandbox(&id).await {
                    Ok(detail) => detail,
                    Err(e) => return failure(sentence(&format!("Sandbox `{id}`"), &e)),
                };
                if needs_a_case(duration, floor, detail.state, detail.end_at, now) {
                    audit_change(
                        svc,
                        &req.user,
                        &id,
                        "timeout",
                        format!("refused: {human} is below the floor; a kill case was asked for"),
                    )
                    .await;
                    let reason = format!(
                        "`/sandbox timeout {id} {}`: a timeout under {} ends the sandbox, so Steward asks first.",
                        typed_duration(duration),
                        human_duration(floor)
                    );
                    let req = CaseRequest {
                        reason: Some(reason),
                        ..req
                    };
                    return request::request_kill(svc, req, id, now).await;
                }
            }
            let outcome = execute::set_timeout(&ctx, &id, duration).await;
            let what = match &outcome {
                Ok(_) => format!("set to {human}"),
                Err((_, e)) => format!("error: {e}"),
            };
            audit_change(svc, &req.user, &id, "timeout", what).await;
            outcome.unwrap_or_else(|(subject, e)| failure(sentence(&subject, &e)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(secs, 0).unwrap()
    }

    #[test]
    fn only_a_shortening_below_the_floor_needs_a_case() {
        let floor = Duration::from_secs(600);
        let now = at(1_000);
        let running = SandboxState::Running;
        // At or above the floor: free.
        assert!(!needs_a_case(floor, floor, running, at(99_999), now));
        // Below the floor and sooner than it would end: a kill in disguise.
        assert!(needs_a_case(
            Duration::from_secs(1),
            floor,
            running,
            at(5_000),
            now
        ));
        // Below the floor but later than it would end anyway: an extension.
        assert!(!needs_a_case(
            Duration::from_secs(60),
            floor,
            running,
            at(1_030),
            now
        ));
        // A paused sandbox is not extended by a short timeout: ask.
        assert!(needs_a_case(
            Duration::from_secs(60),
            floor,
            SandboxState::Paused,
            at(500),
            now
        ));
    }
}
