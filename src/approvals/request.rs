//! `/sandbox kill` and `/sandbox delete-template`: a person asks, Steward opens a case.
//!
//! The database is asked first (an open case for the subject, which also proves Redis
//! answers), so that when Redis is down nothing at all is sent to E2B. Only then is the
//! evidence read from E2B and the card posted. This file must not call a destructive endpoint.
use chrono::{DateTime, Utc};

use super::card::{CaseOpenedParams, message_link};
use super::{ApprovalError, CardTarget, Services, evidence, open_case, post_card};
use crate::cases::{Case, CaseDraft, DecisionOption, Evidence, Opener, Recommendation, Subject};
use crate::e2b::{E2bClient, E2bError};
use crate::execute::sentence;
use crate::ids::{SandboxId, SlackChannelId, SlackUserId, TemplateId};
use crate::slack::render::{FailureParams, Message};
use crate::store::{Opened, StoreError};

/// Who asked, where, and why.
#[derive(Debug, Clone)]
pub struct CaseRequest {
    pub user: SlackUserId,
    /// The channel the command was typed in (used when no approvals channel is configured).
    pub channel: SlackChannelId,
    pub reason: Option<String>,
}

fn failure(svc: &Services, sentence: String) -> Message {
    svc.templates.render_or_plain(&FailureParams { sentence })
}

fn opened_message(svc: &Services, case: &Case, existing: bool) -> Message {
    svc.templates.render_or_plain(&CaseOpenedParams {
        existing,
        case_id: case.id.to_string(),
        subject: match &case.subject {
            Subject::Sandbox(id) => format!("sandbox `{id}`"),
            Subject::Template(id) => format!("template `{id}`"),
        },
        channel: case.card.as_ref().map(|c| c.channel.to_string()),
        link: case
            .card
            .as_ref()
            .map(|c| message_link(c.channel.as_str(), &c.ts)),
    })
}

/// Opens (or points at) the case for `subject`, reading its evidence from E2B.
async fn request(
    svc: &Services,
    req: CaseRequest,
    subject: Subject,
    now: DateTime<Utc>,
) -> Message {
    let what = match &subject {
        Subject::Sandbox(id) => format!("Sandbox `{id}`"),
        Subject::Template(id) => format!("Template `{id}`"),
    };
    let target = CardTarget {
        channel: svc.approvals_channel.clone().unwrap_or(req.channel.clone()),
        thread_ts: None,
    };
    // Redis first: when it is down, E2B hears nothing.
    match svc.store.case_for_subject(&subject).await {
        Ok(Some(existing)) if existing.card.is_some() => {
            return opened_message(svc, &existing, true);
        }
        // Its card was never posted (Slack refused, or the app was not in the channel yet):
        // asking again posts it now rather than pointing at nothing.
        Ok(Some(existing)) => {
            return match post_card(&svc.store, &svc.slack, &svc.templates, &existing, &target).await
            {
                Ok(Some(case)) => opened_message(svc, &case, true),
                Ok(None) => failure(
                    svc,
                    format!(
                        "The card of case `{}` is being posted right now; it will appear in a moment.",
                        existing.id
                    ),
                ),
                Err(e) => post_failure(svc, e),
            };
        }
        Ok(None) => {}
        Err(e @ StoreError::Unavailable(_)) => {
            tracing::warn!(error = %e, "no case opened: Redis unavailable");
            return failure(
                svc,
                "Steward can't reach its database (Redis), so no case was opened and nothing was sent to E2B. Try again in a minute.".into(),
            );
        }
        Err(e) => return failure(svc, format!("Steward could not check for open cases: {e}.")),
    }
    let Some(e2b) = &svc.e2b else {
        return failure(
            svc,
            "E2B is not configured (E2B_API_KEY is not set), so no case was opened.".into(),
        );
    };
    let evidence = match read_evidence(e2b, &subject).await {
        Ok(evidence) => evidence,
        Err(E2bError::NotFound { .. }) => {
            return failure(svc, format!("{what} was not found, so no case was opened."));
        }
        Err(e) => return failure(svc, sentence(&what, &e)),
    };
    let draft = CaseDraft {
        recommendation: person_recommendation(&subject),
        subject,
        evidence,
        options: None,
        opener: Opener::Person {
            user: req.user.clone(),
        },
        reason: req.reason.unwrap_or_else(|| "no reason given".into()),
        decide_by: svc.policy.decide_by(now),
    };
    match open_case(&svc.store, &svc.slack, &svc.templates, draft, target, now).await {
        Ok(Opened::Created(case)) => opened_message(svc, &case, false),
        Ok(Opened::Existing(case)) => opened_message(svc, &case, true),
        Err(e) => post_failure(svc, e),
    }
}

/// The sentence for a case whose card could not be posted; asking again posts it.
fn post_failure(svc: &Services, e: ApprovalError) -> Message {
    match e {
        ApprovalError::Slack(e) if is_not_in_channel(&e) => failure(
            svc,
            "Steward could not post the case card: invite the Steward app to the approvals channel, then ask again and the card will be posted.".into(),
        ),
        e @ ApprovalError::Slack(_) => failure(
            svc,
            format!("{e} Ask again and Steward will post it."),
        ),
        e => failure(svc, e.to_string()),
    }
}

fn is_not_in_channel(e: &crate::slack::client::SlackError) -> bool {
    matches!(e, crate::slack::client::SlackError::Api { code } if code == "not_in_channel" || code == "channel_not_found")
}

/// `/sandbox kill <id> [reason]`: a case to end a sandbox (snapshot first, recommended).
pub async fn request_kill(
    svc: &Services,
    req: CaseRequest,
    id: SandboxId,
    now: DateTime<Utc>,
) -> Message {
    request(svc, req, Subject::Sandbox(id), now).await
}

/// `/sandbox delete-template <id> [reason]`.
pub async fn request_delete_template(
    svc: &Services,
    req: CaseRequest,
    id: TemplateId,
    now: DateTime<Utc>,
) -> Message {
    request(svc, req, Subject::Template(id), now).await
}

/// What Steward recommends for a case a person asked for.
fn person_recommendation(subject: &Subject) -> Recommendation {
    match subject {
        Subject::Sandbox(_) => Recommendation {
            option: DecisionOption::SnapshotThenKill,
            reason: "a snapshot keeps its state in case someone needs it later".into(),
        },
        Subject::Template(_) => Recommendation {
            option: DecisionOption::DeleteTemplate,
            reason: "asked for by a person; check who still uses it first".into(),
        },
    }
}

/// Reads the evidence of `subject` from E2B.
async fn read_evidence(e2b: &E2bClient, subject: &Subject) -> Result<Evidence, E2bError> {
    match subject {
        Subject::Sandbox(id) => evidence::sandbox(e2b, id).await,
        Subject::Template(id) => evidence::template(e2b, id).await,
    }
}
