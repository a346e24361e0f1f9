//! Socket Mode in the Slack simulator: `apps.connections.open` hands out a one-use WebSocket
//! URL; the socket says `hello`, delivers the envelopes it is asked to send
//! (`POST /_sim/socket/send`) round robin across the open connections, with
//! `accepts_response_payload` set as Slack sets it (true for slash commands and for
//! `view_submission` and `block_suggestion` interactions, false otherwise), reads acks
//! (`GET /_sim/socket/acks` lists them with their payloads and the connection they came on),
//! re-delivers an envelope not acked within [`REDELIVER_AFTER`] with `retry_attempt` (as Slack
//! does, up to [`MAX_RETRIES`] times). `POST /_sim/socket/drop` closes every socket, after a
//! `disconnect` envelope when asked (`{"disconnect": true}`, reason `refresh_requested`, or
//! `{"reason": …}`); for `warning` it sends the envelope and closes nothing, as Slack does.
//! `{"lose_next_ack": true}` closes nothing now: the socket the next ack of a pending envelope
//! arrives on is dropped before that ack is read, as when a connection dies with an ack in
//! flight, so the envelope is delivered again on another connection.
//! `POST /_sim/socket/outage` (`{"on": true}` / `{"on": false}`, optionally with Slack's
//! `error`) makes `apps.connections.open` fail until it is turned off, so a client's reconnects
//! fail as in an outage of Slack's (or as with a revoked token, or a rate limit).
//! `GET /_sim/socket/connections` says which connections are open and how many times
//! `apps.connections.open` was called.
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::extract::{Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures::{SinkExt, StreamExt};
use hyper_util::rt::TokioIo;
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;

use super::{Shared, api_error};

/// How long an envelope may go unacked before it is delivered again (Slack: a few seconds).
pub const REDELIVER_AFTER: Duration = Duration::from_secs(3);
/// How many times an unacked envelope is delivered again before the simulator gives up.
pub const MAX_RETRIES: u32 = 3;

const ENVELOPE_TYPES: [&str; 3] = ["slash_commands", "interactive", "events_api"];
/// The `disconnect` reasons `POST /_sim/socket/drop` sends (Slack's; `warning` closes nothing).
const DISCONNECT_REASONS: [&str; 4] = [
    "refresh_requested",
    "warning",
    "link_disabled",
    "too_many_websockets",
];
/// The `disconnect` reason Slack sends seconds before it refreshes a connection, leaving it open.
const WARNING: &str = "warning";
/// Longest `error` an outage may answer with.
const ERROR_CODE_MAX_CHARS: usize = 64;

/// What a connection's writer is told to do.
enum Outgoing {
    Text(String),
    Close,
}

struct Conn {
    id: u64,
    tx: mpsc::UnboundedSender<Outgoing>,
}

struct Pending {
    envelope: Value,
    attempts: u32,
}

#[derive(Default)]
struct HubState {
    tickets: HashSet<String>,
    conns: Vec<Conn>,
    next_conn: usize,
    next_id: u64,
    pending: HashMap<String, Pending>,
    acks: Vec<Value>,
    /// The page's actions waiting for their envelope's ack (its payload, if any).
    waiters: HashMap<String, oneshot::Sender<Option<Value>>>,
    /// While set, `apps.connections.open` fails (`POST /_sim/socket/outage`).
    outage: Option<Outage>,
    /// `apps.connections.open` calls answered, whatever the answer.
    opens: u64,
    /// Set by `POST /_sim/socket/drop` `{"lose_next_ack": true}`: the next ack of a pending
    /// envelope is not read, and its socket is dropped.
    lose_next_ack: bool,
    /// The envelopes whose ack was lost that way.
    lost_acks: Vec<String>,
}

/// How `apps.connections.open` fails during an outage.
#[derive(Clone)]
struct Outage {
    /// Slack's error code: `service_unavailable` is a 503, `ratelimited` a 429 with
    /// `Retry-After`, anything else `{"ok": false, "error"}` as Slack answers a refused token.
    error: String,
    retry_after_secs: u64,
}

/// Socket Mode's shared state: one-use tickets, open connections, unacked envelopes, acks.
pub(super) struct Hub {
    addr: SocketAddr,
    app_token: Option<SecretString>,
    state: Mutex<HubState>,
}

impl Hub {
    pub(super) fn new(addr: SocketAddr, app_token: Option<SecretString>) -> Self {
        Self {
            addr,
            app_token,
            state: Mutex::new(HubState::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HubState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Closes every socket (after a `disconnect` envelope when `disconnect`); how many.
    pub(super) fn close_all(&self, disconnect: bool) -> usize {
        self.disconnect_all(disconnect.then_some("refresh_requested"))
            .0
    }

    /// Sends every socket a `disconnect` envelope with `reason` (when there is one), and closes
    /// them unless the reason is `warning`: how many were closed, and how many told.
    fn disconnect_all(&self, reason: Option<&str>) -> (usize, usize) {
        let warning = reason == Some(WARNING);
        let conns: Vec<mpsc::UnboundedSender<Outgoing>> = {
            let mut state = self.lock();
            if warning {
                state.conns.iter().map(|c| c.tx.clone()).collect()
            } else {
                std::mem::take(&mut state.conns)
                    .into_iter()
                    .map(|c| c.tx)
                    .collect()
            }
        };
        let told = if reason.is_some() { conns.len() } else { 0 };
        for tx in &conns {
            if let Some(reason) = reason {
                let envelope = json!({
                    "type": "disconnect",
                    "reason": reason,
                    "debug_info": {"host": "applink-sim"},
                });
                let _ = tx.send(Outgoing::Text(envelope.to_string()));
            }
            if !warning {
                let _ = tx.send(Outgoing::Close);
            }
        }
        let closed = if warning { 0 } else { conns.len() };
        (closed, told)
    }

    /// Whether a Socket Mode connection is open: then the page's actions go over it, as Slack
    /// sends an app in Socket Mode everything over its sockets.
    pub(super) fn connected(&self) -> bool {
        !self.lock().conns.is_empty()
    }

    /// Sends `envelope` on the next connection in turn: that connection's id, or `None` when
    /// none is open.
    fn deliver(&self, envelope: &Value) -> Option<u64> {
        let mut state = self.lock();
        let text = envelope.to_string();
        while !state.conns.is_empty() {
            let index = state.next_conn % state.conns.len();
            state.next_conn = state.next_conn.wrapping_add(1);
            if state.conns[index]
                .tx
                .send(Outgoing::Text(text.clone()))
                .is_ok()
            {
                return Some(state.conns[index].id);
            }
            state.conns.remove(index);
        }
        None
    }
}

/// The Socket Mode routes (`/_sim/socket*`).
pub(super) fn routes() -> Router<Shared> {
    Router::new()
        .route("/_sim/socket", get(connect))
        .route("/_sim/socket/send", post(send))
        .route("/_sim/socket/acks", get(acks))
        .route("/_sim/socket/drop", post(drop_all))
        .route("/_sim/socket/outage", post(outage))
        .route("/_sim/socket/connections", get(connections))
}

/// `apps.connections.open`: an app-level token gets a one-use WebSocket URL. As Slack answers:
/// no token is `not_authed`, a bot or user token is `not_allowed_token_type`, and an `xapp-`
/// token other than `--app-token` is `invalid_auth`.
///
/// During an outage (`POST /_sim/socket/outage`) every call fails whatever the token, with the
/// outage's error (a 503 by default, as a Slack that is down would answer), and no ticket is
/// handed out. Every call is counted (`GET /_sim/socket/connections`).
pub(super) fn open(world: &Shared, headers: &HeaderMap) -> Response {
    let outage = {
        let mut state = world.socket.lock();
        state.opens += 1;
        state.outage.clone()
    };
    if let Some(outage) = outage {
        let body = Json(json!({"ok": false, "error": outage.error}));
        return match outage.error.as_str() {
            "service_unavailable" => (StatusCode::SERVICE_UNAVAILABLE, body).into_response(),
            "ratelimited" => (
                StatusCode::TOO_MANY_REQUESTS,
                [(header::RETRY_AFTER, outage.retry_after_secs.to_string())],
                body,
            )
                .into_response(),
            _ => body.into_response(),
        };
    }
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .unwrap_or("");
    if token.is_empty() {
        return api_error("not_authed");
    }
    if !token.starts_with("xapp-") {
        return api_error(if token.starts_with("xox") {
            "not_allowed_token_type"
        } else {
            "invalid_auth"
        });
    }
    let hub = &world.socket;
    if let Some(expected) = &hub.app_token
        && expected.expose_secret() != token
    {
        return api_error("invalid_auth");
    }
    let ticket = uuid::Uuid::new_v4().to_string();
    hub.lock().tickets.insert(ticket.clone());
    let url = format!("ws://{}/_sim/socket?ticket={ticket}", hub.addr);
    Json(json!({"ok": true, "url": url})).into_response()
}

/// `--app-token` must be an app-level token; the error never repeats it.
pub(super) fn check_app_token(token: &SecretString) -> Result<(), &'static str> {
    let token = token.expose_secret();
    if token.starts_with("xapp-") && token.len() > "xapp-".len() {
        Ok(())
    } else {
        Err("--app-token must be an app-level token (xapp-…)")
    }
}

#[derive(Deserialize)]
struct Ticket {
    ticket: Option<String>,
}

/// The WebSocket itself: a valid, unused ticket and a WebSocket upgrade request.
async fn connect(
    State(world): State<Shared>,
    Query(query): Query<Ticket>,
    mut request: Request,
) -> Response {
    let valid = query
        .ticket
        .is_some_and(|t| world.socket.lock().tickets.remove(&t));
    if !valid {
        return (
            StatusCode::UNAUTHORIZED,
            "unknown or used ticket: call apps.connections.open for a new URL",
        )
            .into_response();
    }
    let headers = request.headers();
    let is_upgrade = headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    let Some(key) = headers.get(header::SEC_WEBSOCKET_KEY) else {
        return (StatusCode::BAD_REQUEST, "expected a WebSocket upgrade").into_response();
    };
    if !is_upgrade {
        return (StatusCode::BAD_REQUEST, "expected a WebSocket upgrade").into_response();
    }
    let accept = derive_accept_key(key.as_bytes());
    let upgrade = hyper::upgrade::on(&mut request);
    tokio::spawn(async move {
        match upgrade.await {
            Ok(upgraded) => {
                let ws =
                    WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None)
                        .await;
                serve(world, ws).await;
            }
            Err(e) => tracing::debug!(error = %e, "socket mode upgrade failed"),
        }
    });
    let mut resp = StatusCode::SWITCHING_PROTOCOLS.into_response();
    let h = resp.headers_mut();
    h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    if let Ok(v) = HeaderValue::from_str(&accept) {
        h.insert(header::SEC_WEBSOCKET_ACCEPT, v);
    }
    resp
}

/// One connection: `hello` first, then envelopes out and acks in until either side closes.
async fn serve<S>(world: Shared, ws: WebSocketStream<S>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let (tx, mut rx) = mpsc::unbounded_channel();
    let id = {
        let mut state = world.socket.lock();
        state.next_id += 1;
        let id = state.next_id;
        let hello = json!({
            "type": "hello",
            "num_connections": state.conns.len() + 1,
            "debug_info": {"host": "applink-sim", "build_number": 1,
                           "approximate_connection_time": 18060},
            "connection_info": {"app_id": "A0SIMAPP"},
        });
        let _ = tx.send(Outgoing::Text(hello.to_string()));
        state.conns.push(Conn { id, tx });
        id
    };
    let (mut sink, mut stream) = ws.split();
    loop {
        tokio::select! {
            out = rx.recv() => match out {
                Some(Outgoing::Text(text)) => {
                    if sink.send(Message::text(text)).await.is_err() {
                        break;
                    }
                }
                Some(Outgoing::Close) | None => {
                    let _ = sink.send(Message::Close(None)).await;
                    break;
                }
            },
            incoming = stream.next() => match incoming {
                Some(Ok(Message::Text(text))) => {
                    if read_ack(&world, id, text.as_str()) == AckRead::Lost {
                        // Dropped without a close frame, as a connection that died.
                        break;
                    }
                }
                Some(Ok(Message::Ping(data))) => {
                    if sink.send(Message::Pong(data)).await.is_err() {
                        break;
                    }
                }
                Some(Ok(Message::Close(_))) | Some(Err(_)) | None => break,
                Some(Ok(_)) => {}
            },
        }
    }
    world.socket.lock().conns.retain(|c| c.id != id);
}

/// What became of a frame a connection read.
#[derive(Debug, PartialEq, Eq)]
enum AckRead {
    /// Recorded (or not an ack at all).
    Read,
    /// The ack `{"lose_next_ack": true}` armed the loss of: not read, its socket to be dropped.
    Lost,
}

/// An ack `{"envelope_id", "payload"?}` ends the envelope's redelivery and is recorded, with
/// the connection it came on and the envelope's `retry_attempt` when it was acked; while
/// `lose_next_ack` is armed, the ack of a pending envelope is lost instead (noted, not read:
/// the envelope stays pending).
fn read_ack(world: &Shared, connection: u64, text: &str) -> AckRead {
    let Ok(ack) = serde_json::from_str::<Value>(text) else {
        tracing::debug!("socket mode: a frame that is not JSON");
        return AckRead::Read;
    };
    let Some(id) = ack.get("envelope_id").and_then(Value::as_str) else {
        tracing::debug!("socket mode: a frame without envelope_id");
        return AckRead::Read;
    };
    let mut state = world.socket.lock();
    if state.lose_next_ack && state.pending.contains_key(id) {
        state.lose_next_ack = false;
        state.lost_acks.push(id.to_owned());
        return AckRead::Lost;
    }
    let attempt = state.pending.remove(id).map(|p| p.attempts);
    let known = attempt.is_some();
    let mut entry = json!({"envelope_id": id, "known": known, "connection": connection});
    if let Some(attempt) = attempt {
        entry["retry_attempt"] = json!(attempt);
    }
    if let Some(payload) = ack.get("payload") {
        entry["payload"] = payload.clone();
    }
    state.acks.push(entry);
    if let Some(waiter) = state.waiters.remove(id) {
        // The page's action that sent it may have stopped waiting.
        let _ = waiter.send(ack.get("payload").cloned());
    }
    AckRead::Read
}

#[derive(Deserialize)]
struct SendBody {
    #[serde(rename = "type")]
    kind: String,
    payload: Value,
}

/// Whether Slack lets the ack of an envelope carry a `payload`: a slash command's immediate
/// reply, a modal submission's `response_action`, a menu's options; never for a click or an
/// event.
fn accepts_response_payload(kind: &str, payload: &Value) -> bool {
    match kind {
        "slash_commands" => true,
        "interactive" => matches!(
            payload.get("type").and_then(Value::as_str),
            Some("view_submission" | "block_suggestion")
        ),
        _ => false,
    }
}

/// `POST /_sim/socket/send` `{"type", "payload"}`: wraps the payload in an envelope, delivers
/// it on the next connection and re-delivers it until acked. Answers the envelope id and the
/// connection it went to.
async fn send(State(world): State<Shared>, body: axum::body::Bytes) -> Response {
    let bad = |msg: &str| {
        (
            StatusCode::BAD_REQUEST,
            Json(json!({"ok": false, "error": msg})),
        )
    };
    let Ok(body) = serde_json::from_slice::<SendBody>(&body) else {
        return bad("expected {\"type\": ..., \"payload\": {...}}").into_response();
    };
    if !ENVELOPE_TYPES.contains(&body.kind.as_str()) {
        return bad("type must be slash_commands, interactive or events_api").into_response();
    }
    if !body.payload.is_object() {
        return bad("payload must be a JSON object").into_response();
    }
    match submit(&world, &body.kind, body.payload, None) {
        Some((envelope_id, connection)) => {
            Json(json!({"ok": true, "envelope_id": envelope_id, "connection": connection}))
                .into_response()
        }
        None => no_connection(),
    }
}

fn no_connection() -> Response {
    (
        StatusCode::CONFLICT,
        Json(json!({"ok": false, "error": "no_connection"})),
    )
        .into_response()
}

/// Wraps `payload` in an envelope of `kind`, delivers it on the next connection and re-delivers
/// it until acked; `waiter` (when given) gets the ack's payload. The envelope id and the
/// connection it went to, or `None` when no connection is open.
fn submit(
    world: &Shared,
    kind: &str,
    payload: Value,
    waiter: Option<oneshot::Sender<Option<Value>>>,
) -> Option<(String, u64)> {
    let envelope_id = uuid::Uuid::new_v4().to_string();
    let accepts_payload = accepts_response_payload(kind, &payload);
    let envelope = json!({
        "envelope_id": envelope_id,
        "type": kind,
        "payload": payload,
        "accepts_response_payload": accepts_payload,
        "retry_attempt": 0,
        "retry_reason": "",
    });
    {
        // Registered before delivery so an ack that races the response still finds it.
        let mut state = world.socket.lock();
        if state.conns.is_empty() {
            return None;
        }
        state.pending.insert(
            envelope_id.clone(),
            Pending {
                envelope: envelope.clone(),
                attempts: 0,
            },
        );
        if let Some(waiter) = waiter {
            state.waiters.insert(envelope_id.clone(), waiter);
        }
    }
    let Some(connection) = world.socket.deliver(&envelope) else {
        let mut state = world.socket.lock();
        state.pending.remove(&envelope_id);
        state.waiters.remove(&envelope_id);
        return None;
    };
    tokio::spawn(redeliver(Arc::clone(world), envelope_id.clone()));
    Some((envelope_id, connection))
}

/// Why the page's action did not get an answer over Socket Mode.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum PageSendError {
    /// No connection was open to deliver it on.
    NoConnection,
    /// Not acknowledged within [`REDELIVER_AFTER`] (Slack shows the person an error then).
    NoAck,
}

/// Delivers the page's action (`slash_commands` or `interactive`) as Slack does to an app in
/// Socket Mode, and waits up to [`REDELIVER_AFTER`] for its ack: the ack's payload (the
/// immediate reply), or `None` for a bare ack.
pub(super) async fn deliver_and_wait(
    world: &Shared,
    kind: &str,
    payload: Value,
) -> Result<Option<Value>, PageSendError> {
    let (tx, rx) = oneshot::channel();
    let (envelope_id, _) =
        submit(world, kind, payload, Some(tx)).ok_or(PageSendError::NoConnection)?;
    match tokio::time::timeout(REDELIVER_AFTER, rx).await {
        Ok(Ok(payload)) => Ok(payload),
        _ => {
            world.socket.lock().waiters.remove(&envelope_id);
            Err(PageSendError::NoAck)
        }
    }
}

/// Delivers the envelope again, with `retry_attempt` counting up, until it is acked.
async fn redeliver(world: Shared, envelope_id: String) {
    loop {
        tokio::time::sleep(REDELIVER_AFTER).await;
        let envelope = {
            let mut state = world.socket.lock();
            let Some(pending) = state.pending.get_mut(&envelope_id) else {
                return;
            };
            if pending.attempts >= MAX_RETRIES {
                state.pending.remove(&envelope_id);
                return;
            }
            pending.attempts += 1;
            pending.envelope["retry_attempt"] = json!(pending.attempts);
            pending.envelope["retry_reason"] = json!("timeout");
            pending.envelope.clone()
        };
        let _ = world.socket.deliver(&envelope);
    }
}

/// `GET /_sim/socket/acks`: every ack read, oldest first.
async fn acks(State(world): State<Shared>) -> Json<Value> {
    Json(Value::Array(world.socket.lock().acks.clone()))
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct DropBody {
    #[serde(default)]
    disconnect: bool,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    lose_next_ack: bool,
}

/// `POST /_sim/socket/drop` (`{"disconnect": true}` or `{"reason": …}` optional): closes every
/// socket, first sending a `disconnect` envelope when asked (reason `refresh_requested` unless
/// one of [`DISCONNECT_REASONS`] is named). A `warning` is sent and nothing is closed, as
/// Slack warns before it refreshes a connection. `{"lose_next_ack": true}` (alone) closes
/// nothing now and arms the loss of the next ack with its socket (see the module's doc).
async fn drop_all(State(world): State<Shared>, body: axum::body::Bytes) -> Response {
    let body = if body.is_empty() {
        DropBody::default()
    } else {
        match serde_json::from_slice::<DropBody>(&body) {
            Ok(b) => b,
            Err(_) => {
                return bad_body(
                    "expected {\"disconnect\": bool, \"reason\": string} or {\"lose_next_ack\": true}",
                );
            }
        }
    };
    if body.lose_next_ack {
        if body.disconnect || body.reason.is_some() {
            return bad_body("lose_next_ack closes nothing now: send it alone");
        }
        world.socket.lock().lose_next_ack = true;
        return Json(json!({"ok": true, "closed": 0, "disconnects": 0, "lose_next_ack": true}))
            .into_response();
    }
    let reason = match body.reason.as_deref() {
        Some(reason) if DISCONNECT_REASONS.contains(&reason) => Some(reason),
        Some(_) => {
            return bad_body(
                "reason must be refresh_requested, warning, link_disabled or too_many_websockets",
            );
        }
        None => body.disconnect.then_some("refresh_requested"),
    };
    let (closed, disconnects) = world.socket.disconnect_all(reason);
    Json(json!({"ok": true, "closed": closed, "disconnects": disconnects})).into_response()
}

fn bad_body(message: &str) -> Response {
    (
        StatusCode::BAD_REQUEST,
        Json(json!({"ok": false, "error": message})),
    )
        .into_response()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct OutageBody {
    on: bool,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    retry_after: Option<u64>,
}

/// `POST /_sim/socket/outage` `{"on": bool, "error"?, "retry_after"?}`: starts or ends an
/// outage of `apps.connections.open`, which then answers with `error` (default
/// `service_unavailable`, a 503; `ratelimited` is a 429 with `Retry-After: retry_after`, default
/// 1; any other code `{"ok": false, "error"}`, as for a revoked token). Open sockets stay open;
/// `drop` closes them.
async fn outage(State(world): State<Shared>, body: axum::body::Bytes) -> Response {
    const EXPECTED: &str =
        "expected {\"on\": bool, \"error\": a Slack error code, \"retry_after\": seconds}";
    let Ok(body) = serde_json::from_slice::<OutageBody>(&body) else {
        return bad_body(EXPECTED);
    };
    let error = body
        .error
        .unwrap_or_else(|| "service_unavailable".to_owned());
    let is_code = !error.is_empty()
        && error.len() <= ERROR_CODE_MAX_CHARS
        && error.chars().all(|c| c.is_ascii_lowercase() || c == '_');
    if !is_code || (body.retry_after.is_some() && error != "ratelimited") {
        return bad_body(EXPECTED);
    }
    world.socket.lock().outage = body.on.then(|| Outage {
        error: error.clone(),
        retry_after_secs: body.retry_after.unwrap_or(1),
    });
    let mut answer = json!({"ok": true, "outage": body.on});
    if body.on {
        answer["error"] = json!(error);
    }
    Json(answer).into_response()
}

/// `GET /_sim/socket/connections`: the ids of the open connections (as acks and sends name
/// them), how many times `apps.connections.open` was called, and the envelopes whose ack was
/// lost with its socket (`lose_next_ack`).
async fn connections(State(world): State<Shared>) -> Json<Value> {
    let state = world.socket.lock();
    let open: Vec<u64> = state.conns.iter().map(|c| c.id).collect();
    Json(json!({"open": open, "opens": state.opens, "lost_acks": state.lost_acks}))
}

#[cfg(test)]
mod tests {
    use secrecy::SecretString;

    use super::check_app_token;

    fn check(token: &str) -> Result<(), &'static str> {
        check_app_token(&SecretString::from(token.to_owned()))
    }

    #[test]
    fn the_app_token_option_takes_only_an_app_level_token_and_never_repeats_it() {
        let err = check("xoxb-SECRET123").unwrap_err();
        assert!(!err.contains("SECRET123"), "{err}");
        assert!(check("xapp-").is_err());
        assert!(check("").is_err());
        assert_eq!(check("xapp-1-A0SIM-1"), Ok(()));
    }
}
