//! `/sandbox kill` and `/sandbox delete-template`: a person asks, Steward opens a case; and the
//! same request made by an agent ([`request_by_agent`]), answered as data rather than a message.
//!
//! The database is asked first (an open case for the subject, which also proves Redis
//! answers), so that when Redis is down nothing at all is sent to E2B. Only then is the
//! evidence read from E2B and the card posted. A `/sandbox timeout` that would shorten a
//! sandbox's life asks through here too ([`request_shorten`]). This file must not call a
//! destructive endpoint.
use chrono::{DateTime, Utc};

use super::card::{CaseOpenedParams, message_link};
use super::{ApprovalError, CardTarget, Services, evidence, open_built_case, post_card};
use crate::cases::{Case, CaseDraft, DecisionOption, Evidence, Opener, Recommendation, Subject};
use crate::e2b::{E2bClient, E2bError};
use crate::execute::sentence;
use crate::ids::{SandboxId, SlackChannelId, SlackUserId, TemplateId};
use crate::slack::render::{FailureParams, MentionFailureParams, Message, Mrkdwn};
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

/// What came of asking for a case, before it is worded for a Slack user or an agent.
enum Asked {
    /// The case (new, or the open one for the subject), its card posted.
    Case { case: Case, existing: bool },
    /// An open case whose card another request is posting at this moment.
    BeingPosted(Case),
}

/// Why no case came of asking, before it is worded.
enum AskError {
    StoreUnavailable,
    /// The check for an open case failed for another reason than Redis being down.
    StoreCheck(StoreError),
    E2bNotConfigured,
    NotFound,
    E2b(E2bError),
    /// The case exists but its card could not be posted (or the store refused it).
    Post(ApprovalError),
}

/// What a request asks the case to decide.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Question {
    /// The subject's default options: a kill (or a template delete).
    End,
    /// A shorter life: the timeout "Shorten" sets, with the kill options beside it.
    Shorten(std::time::Duration),
}

/// Opens (or points at) the case for `subject`, reading its evidence from E2B: the one path
/// behind `/sandbox kill`, `delete-template`, a shortening `/sandbox timeout` and an agent's
/// request, so each opens the same case with the same evidence, recommendation, options,
/// deadline and card.
async fn ask(
    svc: &Services,
    subject: Subject,
    opener: Opener,
    reason: Option<String>,
    question: Question,
    target: CardTarget,
    now: DateTime<Utc>,
) -> Result<Asked, AskError> {
    // Redis first: when it is down, E2B hears nothing.
    match svc.store.case_for_subject(&subject).await {
        Ok(Some(existing)) if existing.card.is_some() => {
            return Ok(Asked::Case {
                case: existing,
                existing: true,
            });
        }
        // Its card was never posted (Slack refused, or the app was not in the channel yet):
        // asking again posts it now rather than pointing at nothing.
        Ok(Some(existing)) => {
            return match post_card(&svc.store, &svc.slack, &svc.templates, &existing, &target).await
            {
                Ok(Some(case)) => Ok(Asked::Case {
                    case,
                    existing: true,
                }),
                Ok(None) => Ok(Asked::BeingPosted(existing)),
                Err(e) => Err(AskError::Post(e)),
            };
        }
        Ok(None) => {}
        Err(e @ StoreError::Unavailable(_)) => {
            tracing::warn!(error = %e, "no case opened: Redis unavailable");
            return Err(AskError::StoreUnavailable);
        }
        Err(e) => return Err(AskError::StoreCheck(e)),
    }
    let Some(e2b) = &svc.e2b else {
        return Err(AskError::E2bNotConfigured);
    };
    let evidence = match read_evidence(e2b, &subject).await {
        Ok(evidence) => evidence,
        Err(E2bError::NotFound { .. }) => return Err(AskError::NotFound),
        Err(e) => return Err(AskError::E2b(e)),
    };
    let (recommendation, options) = match question {
        Question::End => (requested_recommendation(&subject, &opener), None),
        Question::Shorten(to) => (
            Recommendation {
                option: DecisionOption::Shorten,
                reason: format!(
                    "it is what was asked: once chosen, E2B ends the sandbox {} later unless someone extends it",
                    crate::slack::format::human_duration(to)
                ),
            },
            Some(DecisionOption::SHORTEN.to_vec()),
        ),
    };
    let draft = CaseDraft {
        recommendation,
        subject,
        evidence,
        options,
        opener,
        reason: reason.unwrap_or_else(|| super::card::NO_REASON.into()),
        decide_by: svc.policy.decide_by(now),
    };
    let mut case = draft.into_case(now).map_err(|e| AskError::Post(e.into()))?;
    if let Question::Shorten(to) = question {
        case.shorten_to_secs = Some(to.as_secs());
    }
    match open_built_case(&svc.store, &svc.slack, &svc.templates, case, target).await {
        Ok(Opened::Created(case)) => Ok(Asked::Case {
            case,
            existing: false,
        }),
        Ok(Opened::Existing(case)) => Ok(Asked::Case {
            case,
            existing: true,
        }),
        Err(e) => Err(AskError::Post(e)),
    }
}

/// A person's request from Slack, answered as a Slack message.
async fn request(
    svc: &Services,
    req: CaseRequest,
    subject: Subject,
    question: Question,
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
    let card_channel = target.channel.clone();
    let opener = Opener::Person {
        user: req.user.clone(),
    };
    match ask(svc, subject, opener, req.reason, question, target, now).await {
        Ok(Asked::Case { case, existing }) => opened_message(svc, &case, existing),
        Ok(Asked::BeingPosted(case)) => failure(
            svc,
            format!(
                "The card of case `{}` is being posted right now; it will appear in a moment.",
                case.id
            ),
        ),
        Err(AskError::StoreUnavailable) => failure(
            svc,
            "Steward can't reach its database (Redis), so no case was opened and nothing was sent to E2B. Try again in a minute.".into(),
        ),
        Err(AskError::StoreCheck(e)) => {
            failure(svc, format!("Steward could not check for open cases: {e}."))
        }
        Err(AskError::E2bNotConfigured) => failure(
            svc,
            "E2B is not configured (E2B_API_KEY is not set), so no case was opened.".into(),
        ),
        Err(AskError::NotFound) => {
            failure(svc, format!("{what} was not found, so no case was opened."))
        }
        Err(AskError::E2b(e)) => failure(svc, sentence(&what, &e)),
        Err(AskError::Post(e)) => post_failure(svc, e, &card_channel).await,
    }
}

/// The sentence for a case whose card could not be posted to `channel`; asking again posts it.
async fn post_failure(svc: &Services, e: ApprovalError, channel: &SlackChannelId) -> Message {
    match e {
        ApprovalError::Slack(e) if is_not_in_channel(&e) => {
            svc.templates.render_or_plain(&MentionFailureParams {
                sentence: invite_advice(svc, channel, &e).await,
            })
        }
        e @ ApprovalError::Slack(_) => {
            failure(svc, format!("{e} Ask again and Steward will post it."))
        }
        e => failure(svc, e.to_string()),
    }
}

/// For how long after Steward told someone to invite it to a channel it does not tell again:
/// a second card refused there soon after (someone asking again before the invite, another
/// person's request) only says the card is still waiting, instead of repeating the advice.
pub const INVITE_ADVICE_EVERY: std::time::Duration = std::time::Duration::from_secs(60 * 60);

/// What to do about a card Slack refused because Steward is not in `channel`: the first time
/// within [`INVITE_ADVICE_EVERY`] (across replicas, through the store), how to invite it; after
/// that, that the card still waits for the invite.
async fn invite_advice(
    svc: &Services,
    channel: &SlackChannelId,
    e: &crate::slack::client::SlackError,
) -> Mrkdwn {
    let key = format!("invite-advice:{channel}");
    // Redis not answering: better to give the advice again than to say nothing useful.
    let first = svc
        .store
        .first_time(&key, INVITE_ADVICE_EVERY)
        .await
        .unwrap_or(true);
    let here = || Mrkdwn::channel(channel.as_str());
    if !first {
        return Mrkdwn::text("The case card is still waiting: Steward is not in ")
            .and(here())
            .and(Mrkdwn::text(
                " yet. Ask again once it has been invited there.",
            ));
    }
    let not_found =
        matches!(e, crate::slack::client::SlackError::Api { code } if code == "channel_not_found");
    if not_found {
        // Slack says `channel_not_found` for a private channel the app is not in, too.
        Mrkdwn::text(&format!(
            "Slack cannot find the channel `{channel}` for Steward, so the case card was not posted. If it is a private channel, type `/invite @Steward` in it, then ask again and the card will be posted; if not, set [channels] approvals in steward.toml to a channel that exists."
        ))
    } else {
        Mrkdwn::text("Steward is not in ")
            .and(here())
            .and(Mrkdwn::text(
                ", so the case card could not be posted there. Type `/invite @Steward` in ",
            ))
            .and(here())
            .and(Mrkdwn::text(
                ", then ask again and the card will be posted.",
            ))
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
    request(svc, req, Subject::Sandbox(id), Question::End, now).await
}

/// A `/sandbox timeout` that would end a sandbox sooner, from someone who may not kill: a case
/// whose recommended option, Shorten, sets the timeout `to` (from when it is carried out) once
/// someone allowed to kill chooses it. `req.reason` says what was asked.
pub async fn request_shorten(
    svc: &Services,
    req: CaseRequest,
    id: SandboxId,
    to: std::time::Duration,
    now: DateTime<Utc>,
) -> Message {
    request(svc, req, Subject::Sandbox(id), Question::Shorten(to), now).await
}

/// `/sandbox delete-template <id> [reason]`.
pub async fn request_delete_template(
    svc: &Services,
    req: CaseRequest,
    id: TemplateId,
    now: DateTime<Utc>,
) -> Message {
    request(svc, req, Subject::Template(id), Question::End, now).await
}

/// A gated action an agent asks for (through the API or MCP). A person decides it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentAction {
    KillSandbox(SandboxId),
    DeleteTemplate(TemplateId),
}

impl AgentAction {
    fn subject(self) -> Subject {
        match self {
            AgentAction::KillSandbox(id) => Subject::Sandbox(id),
            AgentAction::DeleteTemplate(id) => Subject::Template(id),
        }
    }
}

/// The case an agent's request opened, or the open case that already covered it.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentRequested {
    pub case: Case,
    /// An open case for the same subject already existed; nothing new was opened. Its card
    /// may still be on its way when another request is posting it at this moment.
    pub existing: bool,
}

/// Why an agent's request opened no case. `Display` is one sentence for the agent's operator.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AgentRequestError {
    #[error(
        "Steward can't reach its database (Redis), so no case was opened and nothing was sent to E2B. Try again in a minute."
    )]
    StoreUnavailable,
    #[error("E2B is not configured (E2B_API_KEY is not set), so no case was opened.")]
    E2bNotConfigured,
    /// Cards have nowhere to go: an agent types in no channel, so `[channels] approvals` must
    /// name one. Checked before anything else, so nothing was read or written.
    #[error(
        "No approvals channel is configured ([channels] approvals in steward.toml), so no case was opened."
    )]
    NoApprovalsChannel,
    /// What was not found, e.g. `Sandbox sbx1`.
    #[error("{0} was not found, so no case was opened.")]
    NotFound(String),
    /// E2B could not be read; the sentence says why. No case was opened.
    #[error("{0} No case was opened.")]
    E2b(String),
    /// The case was opened (or found) but its card could not be posted; asking again posts it.
    #[error(
        "The case was opened but its card could not be posted to Slack ({0}). Ask again and Steward will post it."
    )]
    Slack(String),
    /// The database refused or lost the write.
    #[error("Steward could not open the case: {0}.")]
    Store(String),
}

/// An agent named `agent` (its API token's name) asks for `action`: opens exactly the case
/// `/sandbox kill` or `delete-template` opens, with the agent as its opener (the card names
/// it; the audit records it). An agent is not a Slack user, so any approver may decide it.
pub async fn request_by_agent(
    svc: &Services,
    agent: &str,
    action: AgentAction,
    reason: Option<String>,
    now: DateTime<Utc>,
) -> Result<AgentRequested, AgentRequestError> {
    let Some(channel) = svc.approvals_channel.clone() else {
        return Err(AgentRequestError::NoApprovalsChannel);
    };
    let subject = action.subject();
    let what = match &subject {
        Subject::Sandbox(id) => format!("Sandbox {id}"),
        Subject::Template(id) => format!("Template {id}"),
    };
    let opener = Opener::Agent {
        name: agent.to_owned(),
    };
    let reason = reason
        .map(|r| r.trim().to_owned())
        .filter(|r| !r.is_empty());
    let target_channel = channel.clone();
    let target = CardTarget {
        channel,
        thread_ts: None,
    };
    match ask(svc, subject, opener, reason, Question::End, target, now).await {
        Ok(Asked::Case { case, existing }) => Ok(AgentRequested { case, existing }),
        Ok(Asked::BeingPosted(case)) => Ok(AgentRequested {
            case,
            existing: true,
        }),
        Err(AskError::StoreUnavailable) => Err(AgentRequestError::StoreUnavailable),
        Err(AskError::StoreCheck(e)) => Err(AgentRequestError::Store(e.to_string())),
        Err(AskError::E2bNotConfigured) => Err(AgentRequestError::E2bNotConfigured),
        Err(AskError::NotFound) => Err(AgentRequestError::NotFound(what)),
        Err(AskError::E2b(e)) => Err(AgentRequestError::E2b(sentence(&what, &e))),
        Err(AskError::Post(e)) => Err(match e {
            ApprovalError::StoreUnavailable(_) => AgentRequestError::StoreUnavailable,
            ApprovalError::Store(e) => AgentRequestError::Store(e.to_string()),
            ApprovalError::Slack(e) if is_not_in_channel(&e) => AgentRequestError::Slack(format!(
                "Steward is not in the approvals channel {}: someone must type `/invite @Steward` there",
                target_channel
            )),
            ApprovalError::Slack(e) => AgentRequestError::Slack(e.to_string()),
            ApprovalError::Render(e) => AgentRequestError::Slack(e),
            ApprovalError::Draft(e) => AgentRequestError::Store(e.to_string()),
            ApprovalError::NoChannel => AgentRequestError::NoApprovalsChannel,
            ApprovalError::E2bNotConfigured => AgentRequestError::E2bNotConfigured,
            ApprovalError::Gone(what) => AgentRequestError::NotFound(what),
            ApprovalError::E2b { sentence, .. } => AgentRequestError::E2b(sentence),
        }),
    }
}

/// What Steward recommends for a case a person or an agent asked for.
fn requested_recommendation(subject: &Subject, opener: &Opener) -> Recommendation {
    match subject {
        Subject::Sandbox(_) => Recommendation {
            option: DecisionOption::SnapshotThenKill,
            reason: "a snapshot keeps its state in case someone needs it later".into(),
        },
        Subject::Template(_) => Recommendation {
            option: DecisionOption::DeleteTemplate,
            reason: match opener {
                Opener::Agent { .. } => "asked for by an agent; check who still uses it first",
                _ => "asked for by a person; check who still uses it first",
            }
            .into(),
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
