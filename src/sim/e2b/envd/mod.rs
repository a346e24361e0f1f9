//! envd as the simulator serves it on its second port, reached the way `E2B_SANDBOX_URL` reaches
//! it: every request names its sandbox in `E2b-Sandbox-Id` and the port in `E2b-Sandbox-Port`.
//!
//! The gate plays E2B's proxy (502 `The sandbox was not found` for an unknown, killed or paused
//! sandbox, 502 for a port other than envd's) and then envd's own check of `X-Access-Token`.
//! Behind it, on the sandbox's scratch directory and (with `--exec local`) local processes:
//! `process.Process` (`process.rs`: Start, Connect, List, SendInput, CloseStdin, SendSignal),
//! `filesystem.Filesystem` (`filesystem.rs`: Stat, ListDir, MakeDir, Move, Remove, the watchers),
//! `/files` and `/envs` (`files.rs`), all speaking Connect as connect-go does (`rpc.rs`). An RPC
//! this envd does not serve answers `unimplemented`, never a plain 404 a client would read as
//! "no such file". Layering inside: `rpc` imports no sibling, the services import `rpc`.
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;
use subtle::ConstantTimeEq;

use self::rpc::{Code, RpcError};
use super::exec;
use super::model::SandboxState;
use super::{Sim, now_ms};

mod files;
mod filesystem;
mod process;
mod rpc;

/// The port envd listens on inside every sandbox; the proxy refuses any other.
pub(crate) const ENVD_PORT: u16 = 49983;
/// Largest upload accepted (the envd client caps downloads at 64 MiB too).
const MAX_UPLOAD_BYTES: usize = 64 * 1024 * 1024;
/// How often the sampler reads `/proc` while processes run.
const SAMPLE_EVERY: Duration = Duration::from_secs(1);
/// A paused sandbox with auto-resume that traffic wakes runs at least this long (E2B's default).
const TRAFFIC_RESUME_SECS: i64 = 300;

/// The sandbox a request was routed to (its short id), set by the gate.
#[derive(Clone)]
struct Target(String);

pub(crate) fn router(sim: Arc<Sim>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/envs", get(files::envs))
        .route("/files", get(files::download).post(files::upload))
        .route("/process.Process/Start", post(process::start))
        .route("/process.Process/Connect", post(process::connect))
        .route("/process.Process/List", post(process::list))
        .route("/process.Process/SendInput", post(process::send_input))
        .route("/process.Process/CloseStdin", post(process::close_stdin))
        .route("/process.Process/SendSignal", post(process::send_signal))
        .route("/filesystem.Filesystem/Stat", post(filesystem::stat))
        .route("/filesystem.Filesystem/ListDir", post(filesystem::list_dir))
        .route("/filesystem.Filesystem/MakeDir", post(filesystem::make_dir))
        .route("/filesystem.Filesystem/Move", post(filesystem::move_entry))
        .route("/filesystem.Filesystem/Remove", post(filesystem::remove))
        .route(
            "/filesystem.Filesystem/WatchDir",
            post(filesystem::watch_dir),
        )
        .route(
            "/filesystem.Filesystem/CreateWatcher",
            post(filesystem::create_watcher),
        )
        .route(
            "/filesystem.Filesystem/GetWatcherEvents",
            post(filesystem::get_watcher_events),
        )
        .route(
            "/filesystem.Filesystem/RemoveWatcher",
            post(filesystem::remove_watcher),
        )
        .fallback(fallback)
        .layer(DefaultBodyLimit::max(MAX_UPLOAD_BYTES))
        // A layer, not a route layer: the fallback is behind the proxy and the token check too.
        .layer(middleware::from_fn_with_state(sim.clone(), gate))
        .with_state(sim)
}

/// envd's error body: `{"message", "code"}`.
fn envd_error(status: StatusCode, message: impl Into<String>) -> Response {
    let body = json!({ "message": message.into(), "code": status.as_u16() });
    (status, Json(body)).into_response()
}

/// E2B's proxy in front of envd, then envd's access-token check (not for `/health`).
async fn gate(State(sim): State<Arc<Sim>>, mut request: Request, next: Next) -> Response {
    let (raw_id, port) = {
        let header = |name: &str| {
            request
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(|v| v.trim().to_owned())
        };
        (header("e2b-sandbox-id"), header("e2b-sandbox-port"))
    };
    let Some(raw_id) = raw_id.filter(|id| !id.is_empty()) else {
        return envd_error(
            StatusCode::BAD_REQUEST,
            "the request has no E2b-Sandbox-Id header: this URL reaches sandboxes as E2B_SANDBOX_URL does, by header",
        );
    };
    let not_found = |id: &str| {
        let body = json!({ "sandboxId": id, "message": "The sandbox was not found", "code": 502 });
        (StatusCode::BAD_GATEWAY, Json(body)).into_response()
    };
    let (id, token) = {
        let now = now_ms();
        let mut world = sim.world(now);
        let (id, paused, auto_resume) = match world.live(&raw_id) {
            Ok(s) => (s.id.clone(), s.state == SandboxState::Paused, s.auto_resume),
            Err(_) => return not_found(&raw_id),
        };
        // Traffic resumes a paused sandbox only when it asked for auto-resume, as E2B's proxy does.
        if paused && (!auto_resume || world.resume(&id, now, TRAFFIC_RESUME_SECS).is_err()) {
            return not_found(&raw_id);
        }
        let token = world
            .live(&id)
            .ok()
            .and_then(|s| s.envd_access_token.clone());
        (id, token)
    };
    if let Some(port) = port
        && port.parse::<u16>().ok() != Some(ENVD_PORT)
    {
        let body = json!({
            "sandboxId": id,
            "message": "The sandbox is running but port is not open",
            "port": port,
            "code": 502,
        });
        return (StatusCode::BAD_GATEWAY, Json(body)).into_response();
    }
    if let Some(expected) = token
        && request.uri().path() != "/health"
    {
        let given = request.headers().get("x-access-token");
        let valid = given.is_some_and(|g| bool::from(g.as_bytes().ct_eq(expected.as_bytes())));
        if !valid {
            return envd_error(
                StatusCode::UNAUTHORIZED,
                "unauthorized access, please provide a valid access token or method signing if supported",
            );
        }
    }
    request.extensions_mut().insert(Target(id));
    next.run(request).await
}

async fn health() -> StatusCode {
    StatusCode::NO_CONTENT
}

/// A path this envd does not serve. An RPC path (`/<package>.<Service>/<Method>`) answers as
/// connect-go answers a method it lacks, `unimplemented` (an end-of-stream frame for a stream,
/// the JSON error body for a unary call), so a client never mistakes it for a missing file;
/// anything else is envd's plain 404.
async fn fallback(uri: Uri, headers: HeaderMap) -> Response {
    let path = uri.path();
    let procedure = path
        .strip_prefix('/')
        .and_then(|p| p.split_once('/'))
        .filter(|(service, method)| {
            service.contains('.') && !method.is_empty() && !method.contains('/')
        });
    let Some((service, method)) = procedure else {
        return envd_error(StatusCode::NOT_FOUND, "not found");
    };
    let error = RpcError::new(
        Code::Unimplemented,
        format!("{service}.{method} is not implemented by this simulator's envd"),
    );
    let streaming = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.trim().to_ascii_lowercase().starts_with(rpc::CONNECT_JSON));
    if streaming {
        error.into_stream()
    } else {
        error.into_response()
    }
}

/// The keepalive interval a stream's reader asked for in `Keepalive-Ping-Interval` (seconds).
fn keepalive(headers: &HeaderMap) -> Option<Duration> {
    headers
        .get("keepalive-ping-interval")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(|secs| Duration::from_secs(secs.max(1)))
}

/// The next keepalive tick, or never when the reader asked for none.
async fn tick(interval: &mut Option<tokio::time::Interval>) {
    match interval {
        Some(interval) => drop(interval.tick().await),
        None => std::future::pending().await,
    }
}

// ---- live metrics ----

/// Reads `/proc` every second while any sandbox has processes, for their live metrics.
pub(crate) async fn sample_forever(sim: Arc<Sim>) {
    let mut every = tokio::time::interval(SAMPLE_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let targets = sim.exec().sample_targets();
        if targets.is_empty() {
            continue;
        }
        let Ok(measured) = tokio::task::spawn_blocking(move || exec::measure(targets)).await else {
            continue;
        };
        let now = now_ms();
        let cpus: HashMap<String, u32> = {
            let world = sim.world(now);
            measured
                .iter()
                .filter_map(|m| {
                    world
                        .live(&m.sandbox)
                        .ok()
                        .map(|s| (m.sandbox.clone(), s.cpu_count))
                })
                .collect()
        };
        sim.exec()
            .record(measured, now, |id| cpus.get(id).copied().unwrap_or(1));
    }
}
