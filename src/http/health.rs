//! `GET /healthz` (the process is alive) and `GET /readyz` (configuration is complete and
//! Redis answers).
//!
//! Readiness inspects settings and pings Redis (cheap, ours); it must not call Slack or E2B, so
//! probes never spend their rate limits.
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde_json::{Value, json};

use super::AppState;

pub async fn healthz() -> Json<Value> {
    Json(json!({ "status": "alive" }))
}

/// Ready when Slack can reach this replica, it can post, E2B is configured and Redis answers.
/// Over HTTP, Slack's requests need `SLACK_SIGNING_SECRET`; in Socket Mode they arrive on the
/// connection `SLACK_APP_TOKEN` opened, so the secret is not needed and the check is that the
/// connection is up (`slack_socket`: `ok`, or `connecting` while it is opened or reopened).
pub async fn readyz(State(state): State<AppState>) -> (StatusCode, Json<Value>) {
    let s = &state.settings;
    let slack_inbound = match &state.socket {
        None => (
            "slack_signing_secret",
            "SLACK_SIGNING_SECRET",
            s.slack.signing_secret.is_some(),
        ),
        Some(socket) => ("slack_socket", "SLACK_APP_TOKEN", socket.connected()),
    };
    let checks = [
        slack_inbound,
        (
            "slack_bot_token",
            "SLACK_BOT_TOKEN",
            s.slack.bot_token.is_some(),
        ),
        (
            "e2b_api_key",
            "E2B_API_KEY",
            s.e2b.api_key.is_some() && state.e2b.is_some(),
        ),
        ("redis", "REDIS_URL", state.store.ping().await.is_ok()),
    ];
    let report: serde_json::Map<String, Value> = checks
        .iter()
        .map(|(name, _, ok)| {
            (
                name.to_string(),
                json!(match (*ok, *name) {
                    (true, _) => "ok",
                    (false, "redis") => "unreachable",
                    (false, "slack_socket") => "connecting",
                    (false, _) => "missing",
                }),
            )
        })
        .collect();
    let missing: Vec<&str> = checks.iter().filter(|c| !c.2).map(|c| c.1).collect();
    let status = if missing.is_empty() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        status,
        Json(json!({ "ready": missing.is_empty(), "checks": report, "missing": missing })),
    )
}
