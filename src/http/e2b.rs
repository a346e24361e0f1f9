//! `POST /e2b/webhook`: E2B's sandbox lifecycle webhook. The body is read with a bound
//! ([`E2B_EVENT_MAX_BYTES`]) and its `e2b-signature` checked against every configured secret
//! (`E2B_WEBHOOK_SECRET`, comma-separated while one is rotated) before anything is parsed. An
//! event already seen (E2B retries a delivery, so the same event id arrives twice, late, or out of
//! order) is answered 200 and changes nothing. The answer comes at once: what the event does to
//! cases and cards happens afterwards in a tracked task, so E2B's delivery timeout never fires
//! on Steward's work. When that work fails, the event's mark is forgotten, so the poller's next
//! read of E2B's events API does it again (E2B does not deliver an event again once answered 200).
//!
//! Answers: 200 `{"ok":true}` (or `"duplicate":true`); 401 mis-signed or unsigned; 400 not an
//! event; 413 over the cap; 404 when no secret is configured (the route is off); 503 when Redis
//! cannot say whether the event is new (E2B retries).
use std::time::Duration;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::{AppState, header_str};
use crate::approvals::outside::{self, Applied, Taken};
use crate::lifecycle::{self, LifecycleEvent};
use crate::telemetry::WarnGate;

/// An E2B lifecycle event is a few hundred bytes; metadata makes it larger, never this large.
pub const E2B_EVENT_MAX_BYTES: usize = 64 * 1024;

static MIS_SIGNED: WarnGate = WarnGate::new(Duration::from_secs(10));

fn refuse(status: StatusCode, sentence: impl Into<String>) -> Response {
    (status, Json(json!({"ok": false, "error": sentence.into()}))).into_response()
}

fn too_large() -> Response {
    crate::metrics::e2b_event("unknown", "refused");
    refuse(
        StatusCode::PAYLOAD_TOO_LARGE,
        "The body is over 64 KiB, far more than an E2B lifecycle event, so it was not read.",
    )
}

async fn read_limited(body: Body) -> Result<Bytes, Response> {
    axum::body::to_bytes(body, E2B_EVENT_MAX_BYTES)
        .await
        .map_err(|_| too_large())
}

/// `POST /e2b/webhook`.
pub async fn webhook(State(state): State<AppState>, request: Request) -> Response {
    let secrets = &state.settings.e2b_webhook_secrets;
    if secrets.is_empty() {
        return refuse(
            StatusCode::NOT_FOUND,
            "E2B webhooks are not configured here: set E2B_WEBHOOK_SECRET to the signature secret of the registration.",
        );
    }
    let (parts, body) = request.into_parts();
    let declared =
        header_str(&parts.headers, &header::CONTENT_LENGTH).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > E2B_EVENT_MAX_BYTES as u64) {
        return too_large();
    }
    let body = match read_limited(body).await {
        Ok(body) => body,
        Err(refused) => return refused,
    };
    if !lifecycle::verify(secrets, &body, header_str(&parts.headers, "e2b-signature")) {
        if let Some(quiet) = MIS_SIGNED.warn_now() {
            tracing::warn!(
                refused_quietly_before = quiet,
                "E2B webhook refused: the e2b-signature does not match any configured secret (further refusals within 10 s are logged at debug)"
            );
        } else {
            tracing::debug!("E2B webhook refused: bad signature");
        }
        crate::metrics::e2b_event("unknown", "refused");
        return refuse(
            StatusCode::UNAUTHORIZED,
            "The e2b-signature header does not match this body under any configured secret.",
        );
    }
    let event = match LifecycleEvent::parse(&body) {
        Ok(event) => event,
        Err(e) => {
            crate::metrics::e2b_event("unknown", "refused");
            return refuse(StatusCode::BAD_REQUEST, e.to_string());
        }
    };
    match outside::take(&state.store, !state.watch.is_empty(), &event).await {
        Ok(Taken::ToApply) => {}
        Ok(Taken::Recorded) => {
            // No case and no rule: recording the sandbox's history was the whole work.
            crate::metrics::e2b_event(event.kind.as_str(), Applied::NoCase.as_str());
            tracing::debug!(event = %event.id, kind = event.kind.as_str(), sandbox = %event.sandbox, "E2B lifecycle event recorded (no case)");
            return ok();
        }
        Ok(Taken::Repeat) => {
            tracing::debug!(event = %event.id, "E2B event already handled");
            crate::metrics::e2b_event(event.kind.as_str(), "duplicate");
            return json_text(r#"{"ok":true,"duplicate":true}"#);
        }
        Err(e) => {
            tracing::warn!(error = %e, "E2B webhook: the store could not say whether the event is new");
            return refuse(
                StatusCode::SERVICE_UNAVAILABLE,
                "Steward cannot reach its store right now; E2B will deliver the event again.",
            );
        }
    }
    let svc = state.services();
    state.tasks.spawn(async move {
        let now = chrono::Utc::now();
        match outside::apply_event(&svc, &event, now).await {
            Ok(applied) => {
                crate::metrics::e2b_event(event.kind.as_str(), applied.as_str());
                tracing::info!(event = %event.id, kind = event.kind.as_str(), sandbox = %event.sandbox, ?applied, "E2B lifecycle event handled");
            }
            Err(e) => {
                crate::metrics::e2b_event(event.kind.as_str(), "failed");
                tracing::warn!(event = %event.id, error = %e, "E2B lifecycle event not handled; the poller's next read will handle it (E2B does not deliver it again after a 200)");
                outside::forget(&svc.store, &event).await;
            }
        }
    });
    ok()
}

/// 200 `{"ok":true}`, written without building JSON: E2B's deliveries are the hot path here.
fn ok() -> Response {
    json_text(r#"{"ok":true}"#)
}

fn json_text(text: &'static str) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], text).into_response()
}
