//! Cases for agents: `POST /api/v1/cases` asks for a gated action (a person decides it in Slack)
//! and `GET /api/v1/cases/{id}?wait=30s` reads where it stands, long-polling until it moves.
//!
//! An agent never decides: these routes open exactly the case `/sandbox kill` or
//! `delete-template` opens (`approvals::request::request_by_agent`) and read it back.
//!
//! A token reads only the cases it opened (the case's opener is the agent of that name: its own
//! kill or delete requests, and the run cases of its own runs), or every case with `read_all`.
//! Another's case is answered as not found; asking for a subject that already has an open case
//! someone else opened is a 409 that does not show that case.
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{ApiFailure, ApiJson, ApiPath, ApiQuery, Caller, wait_param};
use crate::approvals::request::{AgentAction, AgentRequestError, request_by_agent};
use crate::cases::{Case, CaseState, Opener, Subject};
use crate::config::ApiAction;
use crate::http::AppState;
use crate::ids::{CaseId, TemplateId};
use crate::store::StoreError;

/// How often a long-poll re-reads the case.
const POLL_EVERY: Duration = Duration::from_millis(250);

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WaitParams {
    /// `30s`: hold the answer until the case's state changes, at most this long.
    #[serde(default)]
    pub wait: Option<String>,
}

/// The case as an agent reads it: its state, the decision once made, and the result once
/// carried out.
pub fn view(case: &Case) -> Value {
    let decision = |d: &crate::cases::Decision| {
        json!({
            "option": d.option,
            "by": d.by,
            "at": d.at,
            "reason": d.reason,
        })
    };
    let (decision, result) = match &case.state {
        CaseState::Pending => (Value::Null, Value::Null),
        CaseState::Decided {
            decision: d, steps, ..
        }
        | CaseState::Executing {
            decision: d, steps, ..
        } => (decision(d), json!({ "steps": steps, "finished": false })),
        CaseState::Done {
            decision: d,
            steps,
            at,
        } => (
            decision(d),
            json!({ "steps": steps, "finished": true, "ok": true, "at": at }),
        ),
        CaseState::Failed {
            decision: d,
            steps,
            error,
            at,
            ..
        } => (
            decision(d),
            json!({ "steps": steps, "finished": true, "ok": false, "error": error, "at": at }),
        ),
        CaseState::Expired { at } => (
            Value::Null,
            json!({ "finished": true, "ok": false, "error": "nobody decided in time; nothing was done", "at": at }),
        ),
        CaseState::EndedOutside { what, at } => (
            Value::Null,
            json!({ "finished": true, "ok": false, "error": format!("{what}; nothing was done"), "at": at }),
        ),
        CaseState::Left {
            option,
            by,
            reason,
            until,
            at,
        } => (
            json!({ "option": option, "by": by, "at": at, "reason": reason, "until": until }),
            json!({ "finished": true, "ok": true, "at": at }),
        ),
    };
    json!({
        "id": case.id,
        "state": case.state.name(),
        "open": case.state.is_open(),
        "subject": case.subject,
        "reason": case.reason,
        "opener": case.opener,
        "recommendation": case.recommendation,
        "options": case.options,
        "decide_by": case.decide_by,
        "created_at": case.created_at,
        "decision": decision,
        "result": result,
    })
}

/// A store failure as the agent reads it (never with the database's own words).
pub(super) fn store_failure(what: &str, error: StoreError) -> ApiFailure {
    match error {
        StoreError::NotFound(_) => ApiFailure::not_found(format!("{what} was not found")),
        StoreError::Unavailable(_) | StoreError::Unconfirmed(_) => ApiFailure::store_unavailable(),
        other => ApiFailure::failed(&format!("Reading {what}"), &other),
    }
}

/// The agent that opened `case`, if an agent did.
fn agent_opener(case: &Case) -> Option<&str> {
    match &case.opener {
        Opener::Agent { name } => Some(name),
        _ => None,
    }
}

/// The actions that let a token read cases (which cases: see [`Caller::sees`]).
const READ_CASES: &[ApiAction] = &[ApiAction::Read, ApiAction::ReadAll];

/// `GET /api/v1/cases/{id}?wait=30s`.
pub async fn get(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<String>,
    ApiQuery(params): ApiQuery<WaitParams>,
) -> Result<Json<Value>, ApiFailure> {
    caller.require_any(READ_CASES)?;
    let id = CaseId::parse(&id).map_err(|e| ApiFailure::invalid("case_id", e.to_string()))?;
    let wait = wait_param(params.wait.as_deref(), state.settings.edge.request_timeout)?;
    let what = format!("Case {id}");
    let first = state
        .store
        .get_case(&id)
        .await
        .map_err(|e| store_failure(&what, e))?;
    if !caller.sees(agent_opener(&first)) {
        tracing::info!(token = %caller.name, case = %id, "a token asked for a case it did not open");
        return Err(ApiFailure::not_found(format!("{what} was not found")));
    }
    let deadline = tokio::time::Instant::now() + wait;
    let mut case = first.clone();
    while case.state.name() == first.state.name() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(POLL_EVERY.min(deadline - tokio::time::Instant::now())).await;
        case = state
            .store
            .get_case(&id)
            .await
            .map_err(|e| store_failure(&what, e))?;
    }
    Ok(Json(view(&case)))
}

/// The longest reason an agent may give (it is shown on the card).
const MAX_REASON_CHARS: usize = 2000;

/// `POST /api/v1/cases`: what the agent asks a person to decide.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaseAsk {
    /// `kill_sandbox` or `delete_template`.
    pub action: String,
    #[serde(default)]
    pub sandbox_id: Option<String>,
    #[serde(default)]
    pub template_id: Option<String>,
    /// Why, in a sentence; shown on the card.
    #[serde(default)]
    pub reason: Option<String>,
}

/// `POST /api/v1/cases`: opens the case a person decides in Slack (201), or points at the open
/// case for the same subject (200). Nothing is killed or deleted here.
pub async fn ask(
    State(state): State<AppState>,
    caller: Caller,
    ApiJson(ask): ApiJson<CaseAsk>,
) -> Result<(StatusCode, Json<Value>), ApiFailure> {
    let required = |field: &str, value: Option<String>| {
        value
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
            .ok_or_else(|| {
                ApiFailure::invalid(field, format!("`{field}` is required for this action"))
            })
    };
    let action = match ask.action.trim() {
        "kill_sandbox" => {
            caller.require(ApiAction::RequestKill)?;
            let id = required("sandbox_id", ask.sandbox_id)?;
            AgentAction::KillSandbox(super::sandboxes::sandbox_id(&id)?)
        }
        "delete_template" => {
            caller.require(ApiAction::RequestDeleteTemplate)?;
            let id = required("template_id", ask.template_id)?;
            AgentAction::DeleteTemplate(
                TemplateId::parse(&id)
                    .map_err(|e| ApiFailure::invalid("template_id", e.to_string()))?,
            )
        }
        other => {
            return Err(ApiFailure::invalid(
                "action",
                format!("{other:?} is not an action; use kill_sandbox or delete_template"),
            ));
        }
    };
    if let Some(reason) = &ask.reason
        && reason.chars().count() > MAX_REASON_CHARS
    {
        return Err(ApiFailure::invalid(
            "reason",
            format!("`reason` is longer than {MAX_REASON_CHARS} characters"),
        ));
    }
    let asked = request_by_agent(
        &state.services(),
        &caller.name,
        action,
        ask.reason,
        chrono::Utc::now(),
    )
    .await
    .map_err(agent_failure)?;
    if asked.existing && !caller.sees(agent_opener(&asked.case)) {
        return Err(ApiFailure::conflict(format!(
            "{} already has an open case that someone else asked for, and a person decides it in Slack; nothing new was opened. This token reads only the cases it opened (reading others' needs `read_all`)",
            subject_name(&asked.case.subject)
        )));
    }
    let status = if asked.existing {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    let mut body = view(&asked.case);
    body["existing"] = json!(asked.existing);
    Ok((status, Json(body)))
}

/// `Sandbox sbx1`, `Template base`.
fn subject_name(subject: &Subject) -> String {
    match subject {
        Subject::Sandbox(id) => format!("Sandbox {id}"),
        Subject::Template(id) => format!("Template {id}"),
    }
}

fn agent_failure(error: AgentRequestError) -> ApiFailure {
    let sentence = error.to_string();
    match error {
        AgentRequestError::StoreUnavailable
        | AgentRequestError::E2bNotConfigured
        | AgentRequestError::NoApprovalsChannel => ApiFailure::unavailable(sentence),
        AgentRequestError::NotFound(_) => ApiFailure::not_found(sentence),
        AgentRequestError::E2b(_) | AgentRequestError::Slack(_) => ApiFailure::upstream(sentence),
        AgentRequestError::Store(detail) => ApiFailure::failed("Opening the case", &detail),
    }
}
