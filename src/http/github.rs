//! `POST /github/webhook`: GitHub's push webhook. The body is read with a bound (25 MiB,
//! GitHub's own cap) and verified against every configured secret before anything is parsed;
//! the answer comes within GitHub's 10 seconds because the run itself is a durable job.
//! Answers: `ping` 200 with GitHub's zen; `push` 202 with the run started, 204 when nothing runs
//! (audited), 200 for a delivery already handled; other events 204; unsigned or mis-signed 401;
//! too large 413; a body that does not fit in the body budget (`STEWARD_BODY_BUDGET`, shared with
//! the agent API) 503 with `Retry-After`. A refused request changes nothing, and no secret is
//! logged or echoed. Anybody can send a mis-signed request, so those are logged through a
//! [`WarnGate`]: a flood is one warning every 10 s with the count, not a line each.
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::api::budget::{self, BodyBudget};
use super::{AppState, header_str};
use crate::github::intake::{self, IntakeError, Outcome};
use crate::runs::RunError;
use crate::telemetry::WarnGate;

/// Mis-signed deliveries are logged at `warn` at most once every 10 s, the others at `debug`.
static MIS_SIGNED: WarnGate = WarnGate::new(Duration::from_secs(10));

/// GitHub caps webhook payloads at 25 MiB.
pub const GITHUB_BODY_MAX_BYTES: usize = 25 * 1024 * 1024;

/// A refusal: `{"ok": false, "error": sentence}`.
fn refuse(status: StatusCode, sentence: impl Into<String>) -> Response {
    (status, Json(json!({"ok": false, "error": sentence.into()}))).into_response()
}

fn too_large() -> Response {
    refuse(
        StatusCode::PAYLOAD_TOO_LARGE,
        "The payload is over 25 MiB, GitHub's own limit, so it was not read.",
    )
}

/// Reads at most `limit` bytes; `None` when the body is longer.
async fn read_limited(body: Body, limit: usize) -> Result<Option<Vec<u8>>, Response> {
    use futures::StreamExt;
    let mut stream = body.into_data_stream();
    let mut buf = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|_| {
            refuse(
                StatusCode::BAD_REQUEST,
                "The request body could not be read.",
            )
        })?;
        if buf.len() + chunk.len() > limit {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(Some(buf))
}

/// Middleware of `POST /github/webhook`: counts the body against the budget as it arrives, and
/// answers 503 with `Retry-After` when it did not fit (GitHub shows it on the delivery, which can
/// be redelivered).
pub async fn limit_body(
    State(budget): State<Arc<BodyBudget>>,
    request: Request,
    next: Next,
) -> Response {
    let (request, held) = budget.wrap(request);
    let response = next.run(request).await;
    if held.refused() {
        budget::log_refusal("github", &budget);
        let mut refused = refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            "Steward is holding as many request bodies in memory as its budget allows (STEWARD_BODY_BUDGET), so this delivery was not read. Redeliver it in a few seconds.",
        );
        refused.headers_mut().insert(
            header::RETRY_AFTER,
            HeaderValue::from(budget::RETRY_AFTER.as_secs()),
        );
        return refused;
    }
    response
}

/// `POST /github/webhook`.
pub async fn webhook(State(state): State<AppState>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let declared =
        header_str(&parts.headers, &header::CONTENT_LENGTH).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > GITHUB_BODY_MAX_BYTES as u64) {
        return too_large();
    }
    let body = match read_limited(body, GITHUB_BODY_MAX_BYTES).await {
        Ok(Some(body)) => body,
        Ok(None) => return too_large(),
        Err(refused) => return refused,
    };
    let github = &state.settings.github;
    if let Err(e) = crate::github::verify(
        &github.webhook_secrets,
        header_str(&parts.headers, "x-hub-signature-256"),
        &body,
    ) {
        if let Some(quiet) = MIS_SIGNED.warn_now() {
            tracing::warn!(
                reason = %e,
                refused_quietly_before = quiet,
                "GitHub webhook refused (further refusals within 10 s are logged at debug)"
            );
        } else {
            tracing::debug!(reason = %e, "GitHub webhook refused");
        }
        return refuse(StatusCode::UNAUTHORIZED, e.to_string());
    }
    let event = header_str(&parts.headers, "x-github-event").unwrap_or("");
    match event {
        "ping" => {
            let zen = serde_json::from_slice::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| v.get("zen").and_then(|z| z.as_str()).map(str::to_owned))
                .unwrap_or_default();
            (StatusCode::OK, Json(json!({"ok": true, "zen": zen}))).into_response()
        }
        "push" => push(&state, &parts.headers, &body).await,
        _ => StatusCode::NO_CONTENT.into_response(),
    }
}

async fn push(state: &AppState, headers: &HeaderMap, body: &[u8]) -> Response {
    let Some(delivery) = header_str(headers, "x-github-delivery")
        .map(str::trim)
        .filter(|d| !d.is_empty() && d.len() <= 100)
    else {
        return refuse(
            StatusCode::BAD_REQUEST,
            "The push has no X-GitHub-Delivery header, so it cannot be processed exactly once.",
        );
    };
    let event = match crate::github::parse_push(body) {
        Ok(event) => event,
        Err(sentence) => return refuse(StatusCode::BAD_REQUEST, sentence),
    };
    let outcome = intake::handle_push(
        &state.store,
        state.runs.as_ref(),
        &state.settings.github,
        delivery,
        &event,
    )
    .await;
    match outcome {
        Ok(Outcome::Ignored(why)) => {
            tracing::info!(repository = %event.repository.full_name, %why, "push ignored");
            StatusCode::NO_CONTENT.into_response()
        }
        Ok(Outcome::Refused(why)) => (
            StatusCode::OK,
            Json(json!({"ok": false, "refused": why})),
        )
            .into_response(),
        Ok(Outcome::AlreadyHandled) => (
            StatusCode::OK,
            Json(json!({"ok": true, "message": "already handled"})),
        )
            .into_response(),
        Ok(Outcome::Started { run, supersedes }) => (
            StatusCode::ACCEPTED,
            Json(json!({"ok": true, "run": run, "supersedes": supersedes})),
        )
            .into_response(),
        Ok(Outcome::Waiting { position }) => (
            StatusCode::ACCEPTED,
            Json(json!({
                "ok": true,
                "queued": position,
                "message": format!("queued: {position} in line for a push-test slot ([github] max_runs, max_runs_per_repository)"),
            })),
        )
            .into_response(),
        // Started, so GitHub must not deliver it again; the warning says what is missing.
        Err(ref e @ IntakeError::Unrecorded { ref run, .. }) => {
            tracing::error!(repository = %event.repository.full_name, error = %e, "push run not recorded");
            (
                StatusCode::ACCEPTED,
                Json(json!({"ok": true, "run": run, "warning": e.to_string()})),
            )
                .into_response()
        }
        Err(e) => {
            tracing::warn!(repository = %event.repository.full_name, error = %e, "push not acted on");
            let status = match &e {
                IntakeError::Run(RunError::Input(_)) => StatusCode::UNPROCESSABLE_ENTITY,
                _ => StatusCode::SERVICE_UNAVAILABLE,
            };
            refuse(status, e.to_string())
        }
    }
}
