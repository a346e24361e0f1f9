//! `GET /healthz` (the process is alive) and `GET /readyz` (configuration is complete, Redis
//! answers, and the replica is not draining after a stop signal).
//!
//! Readiness inspects settings and pings Redis (cheap, ours); it must not call Slack or E2B, so
//! probes never spend their rate limits.
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde_json::{Value, json};

use super::AppState;
use crate::slack::socket::SocketState;

pub async fn healthz() -> Json<Value> {
    Json(json!({ "status": "alive" }))
}

/// One line of the readiness report: its name, the variable that fixes it, what it says, and
/// whether it lets the replica be ready.
struct Check {
    name: &'static str,
    variable: &'static str,
    says: &'static str,
    ready: bool,
}

impl Check {
    /// A setting that is either there (`ok`) or not (`missing`).
    fn setting(name: &'static str, variable: &'static str, set: bool) -> Self {
        Self {
            name,
            variable,
            says: if set { "ok" } else { "missing" },
            ready: set,
        }
    }
}

/// Ready when Slack can reach this replica, it can post, E2B is configured and Redis answers.
/// Over HTTP, Slack's requests need `SLACK_SIGNING_SECRET`; in Socket Mode they arrive on the
/// connection `SLACK_APP_TOKEN` opened, so the secret is not needed and the check is that the
/// connection is up (`slack_socket`: `ok`; `connecting` while it is opened or reopened,
/// `refused` while Slack refuses the token: both not ready). Once Slack has turned Socket Mode
/// off for the app (`disabled`), its requests come over HTTP again, so readiness is the HTTP
/// one (the signing secret), reported beside `"slack_socket": "disabled"`.
pub async fn readyz(State(state): State<AppState>) -> (StatusCode, Json<Value>) {
    let s = &state.settings;
    let signing_secret = Check::setting(
        "slack_signing_secret",
        "SLACK_SIGNING_SECRET",
        s.slack.signing_secret.is_some(),
    );
    let mut checks = Vec::with_capacity(6);
    match state.socket.as_ref().map(|socket| socket.state()) {
        None => checks.push(signing_secret),
        Some(SocketState::Disabled) => {
            checks.push(Check {
                name: "slack_socket",
                variable: "SLACK_APP_TOKEN",
                says: SocketState::Disabled.label(),
                ready: true,
            });
            checks.push(signing_secret);
        }
        Some(socket) => checks.push(Check {
            name: "slack_socket",
            variable: "SLACK_APP_TOKEN",
            says: socket.label(),
            ready: socket == SocketState::Connected,
        }),
    }
    checks.push(Check::setting(
        "slack_bot_token",
        "SLACK_BOT_TOKEN",
        s.slack.bot_token.is_some(),
    ));
    checks.push(Check::setting(
        "e2b_api_key",
        "E2B_API_KEY",
        s.e2b.api_key.is_some() && state.e2b.is_some(),
    ));
    // A replica that is stopping finishes what it holds; new traffic should go elsewhere.
    let draining = state.draining.is_cancelled();
    checks.push(Check {
        name: "replica",
        // Nothing to set: the replica is on its way out.
        variable: "",
        says: if draining { "draining" } else { "ok" },
        ready: !draining,
    });
    let redis = state.store.ping().await.is_ok();
    checks.push(Check {
        name: "redis",
        variable: "REDIS_URL",
        says: if redis { "ok" } else { "unreachable" },
        ready: redis,
    });
    let report: serde_json::Map<String, Value> = checks
        .iter()
        .map(|c| (c.name.to_owned(), json!(c.says)))
        .collect();
    let missing: Vec<&str> = checks
        .iter()
        .filter(|c| !c.ready && !c.variable.is_empty())
        .map(|c| c.variable)
        .collect();
    let ready = checks.iter().all(|c| c.ready);
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        status,
        Json(json!({ "ready": ready, "checks": report, "missing": missing })),
    )
}
