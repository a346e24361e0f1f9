//! The Slack surface: `POST /slack/commands`, `/slack/interactions`, `/slack/events`, and the
//! middleware that verifies every one of them before anything is parsed.
//!
//! Handlers acknowledge within Slack's 3 s: quick answers go inline, anything that touches E2B
//! answers "Working on it…" and finishes in a spawned task that posts to the `response_url`.
//! Nothing here may run before [`verify_request`] has accepted the raw body.
use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::AppState;
use super::error::ApiError;
use crate::slack::client::ResponsePayload;
use crate::slack::command::SandboxCommand;
use crate::slack::execute::{self, Context};
use crate::slack::payload::{self, Action, CommandForm, EventEnvelope, Interaction, SlackRetry};
use crate::slack::render::{
    ApprovalNeededParams, FailureParams, HelpParams, Message, ProblemParams, WorkingParams,
};
use crate::slack::signature::{self, SIGNATURE_HEADER, TIMESTAMP_HEADER};

/// Largest body accepted on a Slack route. Slack's own payloads are far smaller.
pub const SLACK_BODY_MAX_BYTES: usize = 64 * 1024;

fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

fn unix_now() -> i64 {
    chrono::Utc::now().timestamp()
}

/// Enforces the body limit, answers bare `ssl_check` probes, verifies the signature and
/// records Slack's retry headers; only then does the handler see the request.
pub async fn verify_request(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let declared = header_str(request.headers(), header::CONTENT_LENGTH.as_str())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > SLACK_BODY_MAX_BYTES as u64) {
        return Err(ApiError::TooLarge {
            limit: SLACK_BODY_MAX_BYTES,
        });
    }
    let (mut parts, body) = request.into_parts();
    // The limit is enforced while reading too: Content-Length may be absent (chunked) or lie.
    let bytes = read_limited(body, SLACK_BODY_MAX_BYTES).await?;
    let is_form = header_str(&parts.headers, header::CONTENT_TYPE.as_str())
        .is_some_and(|v| v.starts_with("application/x-www-form-urlencoded"));
    if is_form && payload::is_ssl_check(&bytes) {
        return Ok(StatusCode::OK.into_response());
    }
    let secret = state
        .settings
        .slack
        .signing_secret
        .as_ref()
        .ok_or(signature::SignatureError::NoSecret)?;
    signature::verify(
        secret,
        header_str(&parts.headers, TIMESTAMP_HEADER),
        header_str(&parts.headers, SIGNATURE_HEADER),
        &bytes,
        unix_now(),
    )?;
    parts.extensions.insert(SlackRetry {
        num: header_str(&parts.headers, "x-slack-retry-num").and_then(|v| v.parse().ok()),
        reason: header_str(&parts.headers, "x-slack-retry-reason").map(str::to_owned),
    });
    Ok(next
        .run(Request::from_parts(parts, Body::from(bytes)))
        .await)
}

/// Reads a body, stopping as soon as it passes `limit` bytes.
async fn read_limited(body: Body, limit: usize) -> Result<Bytes, ApiError> {
    use futures::StreamExt;
    let mut stream = body.into_data_stream();
    let mut buf = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| ApiError::BodyRead(e.to_string()))?;
        if buf.len() + chunk.len() > limit {
            return Err(ApiError::TooLarge { limit });
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(Bytes::from(buf))
}

/// An immediate slash-command answer, visible to the invoker only.
fn inline(message: Message) -> Response {
    Json(json!({ "response_type": "ephemeral", "text": message.text, "blocks": message.blocks }))
        .into_response()
}

/// `POST /slack/commands`.
pub async fn command(State(state): State<AppState>, body: Bytes) -> Result<Response, ApiError> {
    let form = CommandForm::parse(&body)?;
    let templates = &state.templates;
    let cmd = SandboxCommand::parse(&form.text);
    tracing::info!(user = %form.user_id, channel = %form.channel_id, command = ?cmd, "slash command");
    let message = match &cmd {
        SandboxCommand::Help => templates.render_or_plain(&HelpParams {
            command: form.command.clone(),
        }),
        SandboxCommand::Invalid { problem } => templates.render_or_plain(&ProblemParams {
            command: form.command.clone(),
            problem: problem.clone(),
        }),
        // Destructive commands never run directly; the approvals issue replaces these two arms
        // with opening an approval case.
        SandboxCommand::Kill { id } => templates.render_or_plain(&ApprovalNeededParams {
            action: "kill".into(),
            target: id.to_string(),
        }),
        SandboxCommand::DeleteTemplate { id } => templates.render_or_plain(&ApprovalNeededParams {
            action: "delete-template".into(),
            target: id.to_string(),
        }),
        _ => return Ok(defer(&state, cmd, &form)),
    };
    Ok(inline(message))
}

/// Acknowledges now and finishes the command in a background task via the response_url.
fn defer(state: &AppState, cmd: SandboxCommand, form: &CommandForm) -> Response {
    if let Err(e) = state.slack.check_response_url(&form.response_url) {
        tracing::warn!(error = %e, "slash command with an unusable response_url");
        return inline(state.templates.render_or_plain(&FailureParams {
            sentence: "Slack sent this command without a usable reply address, so Steward cannot answer it.".into(),
        }));
    }
    let working = state.templates.render_or_plain(&WorkingParams {
        command: form.command.clone(),
        input: form.text.trim().to_owned(),
    });
    let state = state.clone();
    let response_url = form.response_url.clone();
    let text = form.text.trim().to_owned();
    tokio::spawn(async move {
        let ctx = Context {
            e2b: state.e2b.as_ref(),
            templates: &state.templates,
            now: chrono::Utc::now(),
        };
        let message = execute::run(&ctx, &cmd, &text).await;
        if let Err(e) = state
            .slack
            .respond(&response_url, &ResponsePayload::ephemeral(message))
            .await
        {
            tracing::error!(error = %e, "could not deliver a command result to Slack");
        }
    });
    inline(working)
}

/// `POST /slack/interactions`: verified, parsed, acknowledged with an empty 200; the work
/// happens afterwards.
pub async fn interaction(State(state): State<AppState>, body: Bytes) -> Result<Response, ApiError> {
    let interaction = Interaction::parse(&body)?;
    if interaction.kind != "block_actions" {
        tracing::debug!(kind = %interaction.kind, "ignoring interaction");
        return Ok(StatusCode::OK.into_response());
    }
    for block_action in &interaction.actions {
        match Action::from_block_action(block_action) {
            Action::ListNextPage(cursor) => next_page(&state, &interaction, cursor),
            Action::CaseOption { .. } | Action::CaseRetry { .. } | Action::Unknown { .. } => {
                let action_id = &block_action.action_id;
                tracing::info!(%action_id, user = %interaction.user.id, "no handler for this action");
            }
        }
    }
    Ok(StatusCode::OK.into_response())
}

fn next_page(state: &AppState, interaction: &Interaction, cursor: payload::ListCursor) {
    let Some(response_url) = interaction.response_url.clone() else {
        tracing::warn!("next-page click without a response_url");
        return;
    };
    if let Err(e) = state.slack.check_response_url(&response_url) {
        tracing::warn!(error = %e, "next-page click with an unusable response_url");
        return;
    }
    let state = state.clone();
    tokio::spawn(async move {
        let ctx = Context {
            e2b: state.e2b.as_ref(),
            templates: &state.templates,
            now: chrono::Utc::now(),
        };
        // The cursor carries the original arguments, parsed again exactly as typed.
        let message = match SandboxCommand::parse(&cursor.args) {
            SandboxCommand::List(args) => {
                match execute::list_page(
                    &ctx,
                    &args,
                    &cursor.args,
                    Some(&cursor.next_token),
                    cursor.page,
                )
                .await
                {
                    Ok(m) => m,
                    Err((subject, e)) => state.templates.render_or_plain(&FailureParams {
                        sentence: execute::sentence(&subject, &e),
                    }),
                }
            }
            _ => state.templates.render_or_plain(&FailureParams {
                sentence: "This button is out of date; run `/sandbox list` again.".into(),
            }),
        };
        if let Err(e) = state
            .slack
            .respond(&response_url, &ResponsePayload::replacing(message))
            .await
        {
            tracing::error!(error = %e, "could not deliver the next page to Slack");
        }
    });
}

/// `POST /slack/events`: answers `url_verification`; every other event is acknowledged and
/// ignored for now.
pub async fn event(
    axum::Extension(retry): axum::Extension<SlackRetry>,
    body: Bytes,
) -> Result<Response, ApiError> {
    match EventEnvelope::parse(&body)? {
        EventEnvelope::UrlVerification { challenge } => {
            Ok(Json(json!({ "challenge": challenge })).into_response())
        }
        EventEnvelope::EventCallback { event_id } => {
            tracing::debug!(?event_id, retry_num = ?retry.num, retry_reason = ?retry.reason, "event ignored");
            Ok(StatusCode::OK.into_response())
        }
        EventEnvelope::Other => Ok(StatusCode::OK.into_response()),
    }
}
