//! Changes to a sandbox's life: `/sandbox timeout`, `/sandbox resume [timeout=…]` and
//! `/sandbox refresh`.
//!
//! A timeout ends a sandbox when it runs out, so shortening one is a kill with a delay. The rules,
//! each read against a fresh E2B read of the sandbox (its state and `end_at`):
//!
//! - Extending is free: a `timeout` whose new end (now + the duration) is no sooner than the
//!   sandbox's current `end_at`, and every `refresh` (E2B's refreshes only ever extend), may be
//!   asked by whoever may run `/sandbox` commands.
//! - A `timeout` whose new end is sooner than the current `end_at` is a shortening:
//!   - while the sandbox has an open case (whatever it asks), nobody may shorten it, not even a
//!     kill approver: that case is the one place its end is decided, so the command is refused
//!     with a sentence naming the case;
//!   - a new timeout below `[approvals] min_timeout` always opens a case, even for a kill
//!     approver: it ends the sandbox before anyone could notice, so the two-person rule applies
//!     as it does to `/sandbox kill`;
//!   - otherwise someone allowed to choose Kill (`[approvals.approvers] kill`) shortens it at
//!     once: that is a decision they may make alone, since the sandbox still runs for at least
//!     `min_timeout` and anyone may extend it meanwhile. It is audited as a kill approver's
//!     shortening, with the end it had before;
//!   - anyone else gets a case whose recommended option, "Shorten to …", sets that timeout once
//!     someone allowed to kill chooses it (the two-person rule applies: the requester cannot);
//!     E2B hears nothing until then.
//! - A paused sandbox has no timeout running (E2B refuses to set one), so a `timeout` on it is
//!   refused with a sentence. It has no end at all until it is resumed: a `resume` gives it one,
//!   `timeout=…` from now. That is how a paused sandbox is used, so it needs no kill permission,
//!   but a resume timeout below the floor is refused, and so is any resume while the sandbox has
//!   an open case (resuming would put an end on a sandbox people are deciding about).
//!
//! Every request and its outcome are audited, and the request is audited before anything else,
//! so when Redis is down E2B hears nothing. This file must not kill anything: a kill, or a
//! shortening someone may not make alone, only ever happens through a case.
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::Services;
use super::request::{self, CaseRequest};
use crate::cases::{DecisionOption, Subject, may_decide};
use crate::e2b::{E2bError, SandboxState};
use crate::execute::{self, Context, sentence};
use crate::ids::{SandboxId, SlackUserId};
use crate::slack::format::{human_duration, typed_duration, when};
use crate::slack::render::{FailureParams, Message};
use crate::store::{Actor, AuditEvent, StoreError};

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

/// What a new timeout would do to a sandbox, judged from a fresh read of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeoutEffect {
    /// It would end no sooner than it does now: an extension, free for anyone.
    Extends,
    /// It would end sooner. `below_floor`: the new timeout is under `[approvals] min_timeout`.
    Shortens { below_floor: bool },
    /// It is paused: E2B's timeout does not apply until it is resumed.
    Paused,
}

/// What a timeout of `duration` from `now` does to a sandbox in `state` that would otherwise
/// end at `end_at`. Pure, so the rule is tested without E2B.
pub fn timeout_effect(
    duration: Duration,
    floor: Duration,
    state: SandboxState,
    end_at: DateTime<Utc>,
    now: DateTime<Utc>,
) -> TimeoutEffect {
    if state != SandboxState::Running {
        return TimeoutEffect::Paused;
    }
    let new_end = chrono::Duration::from_std(duration)
        .ok()
        .and_then(|d| now.checked_add_signed(d))
        .unwrap_or(DateTime::<Utc>::MAX_UTC);
    if new_end >= end_at {
        TimeoutEffect::Extends
    } else {
        TimeoutEffect::Shortens {
            below_floor: duration < floor,
        }
    }
}

/// Appends an audit event about a timeout change (no case involved).
async fn append_change(
    svc: &Services,
    user: &SlackUserId,
    id: &SandboxId,
    action: &str,
    outcome: String,
) -> Result<(), StoreError> {
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
    user: &SlackUserId,
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

const REDIS_DOWN: &str = "Steward can't reach its database (Redis), so the change could not be recorded and nothing was sent to E2B. Try again in a minute.";

/// The open case of sandbox `id`, if any; `Err` is the sentence to answer with.
async fn open_case_of(
    svc: &Services,
    id: &SandboxId,
) -> Result<Option<crate::cases::Case>, String> {
    match svc
        .store
        .case_for_subject(&Subject::Sandbox(id.clone()))
        .await
    {
        Ok(case) => Ok(case),
        Err(StoreError::Unavailable(_)) => Err(REDIS_DOWN.into()),
        Err(e) => Err(format!(
            "Steward could not check for an open case of `{id}` ({e}), so nothing was changed."
        )),
    }
}

/// Whether `user` may choose Kill (`[approvals.approvers] kill`, user groups asked of Slack).
/// They act on their own request here, so the two-person rule is not theirs to pass: the
/// callers only ask this for a shortening that leaves the sandbox at least the floor.
async fn may_kill(svc: &Services, user: &SlackUserId) -> bool {
    let rule = svc.policy.approvers.rule_for(DecisionOption::Kill);
    let groups = super::decide::groups_in_rule(svc, rule, user).await;
    may_decide(&svc.policy, user, &groups, DecisionOption::Kill, None).is_ok()
}

/// Runs a timeout, resume or refresh command for `req.user` under the rules of this module.
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
        return failure(REDIS_DOWN.into());
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
            match open_case_of(svc, &id).await {
                Ok(None) => {}
                Ok(Some(case)) => {
                    audit_change(
                        svc,
                        &req.user,
                        &id,
                        "resume",
                        format!("refused: case {} is open", case.id),
                    )
                    .await;
                    return failure(format!(
                        "`{id}` has an open case, `{}`: resuming it would give it an end while people decide about it, so nothing was changed. Decide the case on its card first (Leave it, if it should stay), then resume it.",
                        case.id
                    ));
                }
                Err(sentence) => return failure(sentence),
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
            timeout(svc, &ctx, req, id, duration, now).await
        }
    }
}

/// `/sandbox timeout <id> <duration>` after its request was audited.
async fn timeout(
    svc: &Services,
    ctx: &Context<'_>,
    req: CaseRequest,
    id: SandboxId,
    duration: Duration,
    now: DateTime<Utc>,
) -> Message {
    let failure = |sentence: String| svc.templates.render_or_plain(&FailureParams { sentence });
    let human = human_duration(duration);
    let Some(e2b) = svc.e2b.as_ref() else {
        return failure(sentence(
            &format!("Sandbox `{id}`"),
            &E2bError::NotConfigured("E2B_API_KEY is not set"),
        ));
    };
    // A fresh read: whether this shortens the sandbox depends on the end it has now.
    let detail = match e2b.get_sandbox(&id).await {
        Ok(detail) => detail,
        Err(e) => return failure(sentence(&format!("Sandbox `{id}`"), &e)),
    };
    let was = format!("it was to end at {}", when(detail.end_at));
    let effect = timeout_effect(
        duration,
        svc.policy.min_timeout,
        detail.state,
        detail.end_at,
        now,
    );
    let below_floor = match effect {
        TimeoutEffect::Paused => {
            audit_change(
                svc,
                &req.user,
                &id,
                "timeout",
                "refused: the sandbox is paused".into(),
            )
            .await;
            return failure(format!(
                "`{id}` is paused, so it has no timeout to change and nothing was changed. Resume it with `/sandbox resume {id} timeout={}`, or ask for a kill with `/sandbox kill {id}`.",
                typed_duration(duration.max(svc.policy.min_timeout))
            ));
        }
        TimeoutEffect::Extends => {
            let outcome = execute::set_timeout(ctx, &id, duration).await;
            let what = match &outcome {
                Ok(_) => format!("set to {human} (an extension: {was})"),
                Err((_, e)) => format!("error: {e}"),
            };
            audit_change(svc, &req.user, &id, "timeout", what).await;
            return outcome.unwrap_or_else(|(subject, e)| failure(sentence(&subject, &e)));
        }
        TimeoutEffect::Shortens { below_floor } => below_floor,
    };
    // A shortening. An open case is the only place this sandbox's end is decided now.
    match open_case_of(svc, &id).await {
        Ok(None) => {}
        Ok(Some(case)) => {
            audit_change(
                svc,
                &req.user,
                &id,
                "timeout",
                format!(
                    "refused: {human} would shorten it while case {} is open",
                    case.id
                ),
            )
            .await;
            return failure(format!(
                "`{id}` has an open case, `{}`: while it is open, the sandbox's life can only be shortened through that case, so nothing was changed. Choose on its card (`/sandbox history {}` shows where it stands).",
                case.id, case.id
            ));
        }
        Err(sentence) => return failure(sentence),
    }
    if !below_floor && may_kill(svc, &req.user).await {
        let outcome = execute::set_timeout(ctx, &id, duration).await;
        let what = match &outcome {
            Ok(_) => format!("set to {human} (shortened by a kill approver: {was})"),
            Err((_, e)) => format!("error: {e}"),
        };
        audit_change(svc, &req.user, &id, "timeout", what).await;
        return outcome.unwrap_or_else(|(subject, e)| failure(sentence(&subject, &e)));
    }
    let why = if below_floor {
        format!(
            "a timeout under {} ends the sandbox before anyone could step in",
            human_duration(svc.policy.min_timeout)
        )
    } else {
        "a shorter life is a kill with a delay, and only someone allowed to kill may choose it"
            .to_owned()
    };
    audit_change(
        svc,
        &req.user,
        &id,
        "timeout",
        format!("refused: {human} would shorten it ({was}); a case was asked for"),
    )
    .await;
    let reason = format!(
        "`/sandbox timeout {id} {}`: {was}, so this ends it sooner; {why}, so Steward asks first.",
        typed_duration(duration),
    );
    let req = CaseRequest {
        reason: Some(reason),
        ..req
    };
    request::request_shorten(svc, req, id, duration, now).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(secs, 0).unwrap()
    }

    #[test]
    fn a_timeout_that_ends_a_running_sandbox_sooner_is_a_shortening_whatever_its_length() {
        let floor = Duration::from_secs(600);
        let now = at(1_000);
        let running = SandboxState::Running;
        // Ten hours left; ten minutes asked: at the floor, but sooner, so a shortening.
        assert_eq!(
            timeout_effect(floor, floor, running, at(37_000), now),
            TimeoutEffect::Shortens { below_floor: false }
        );
        // Below the floor and sooner than it would end.
        assert_eq!(
            timeout_effect(Duration::from_secs(1), floor, running, at(5_000), now),
            TimeoutEffect::Shortens { below_floor: true }
        );
        // Later than it would end anyway, even by less than the floor: an extension.
        assert_eq!(
            timeout_effect(Duration::from_secs(60), floor, running, at(1_030), now),
            TimeoutEffect::Extends
        );
        // Exactly the end it has: nothing sooner, so free.
        assert_eq!(
            timeout_effect(Duration::from_secs(4_000), floor, running, at(5_000), now),
            TimeoutEffect::Extends
        );
        // A paused sandbox has no timeout running.
        assert_eq!(
            timeout_effect(
                Duration::from_secs(60),
                floor,
                SandboxState::Paused,
                at(500),
                now
            ),
            TimeoutEffect::Paused
        );
    }
}
