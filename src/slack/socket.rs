//! Socket Mode: Slack delivers slash commands, interactions and events over a WebSocket the app
//! opens (`apps.connections.open` with the app-level token, then the URL it answers), instead of
//! POSTing them to a public URL. [`SocketClient::run`] holds one connection per replica: it reads
//! `hello`, hands each envelope to the [`Handler`] it was given and sends back the ack (with the
//! handler's immediate reply as its `payload` when the envelope accepts one), and opens a new
//! connection when Slack sends `disconnect` or the socket drops, after a jittered exponential
//! [`Backoff`] that a healthy connection resets.
//!
//! An ack that could not be written because the socket went away is kept and written on the next
//! connection; Slack delivers an envelope that was not acked again (with `retry_attempt`), so the
//! handler must make a redelivery harmless (it does: `http::socket`). This module knows Socket
//! Mode's wire format and connection rules only: it must not know what an envelope asks for, nor
//! import `http`, `store` or `approvals`; the app token never appears in logs, errors or `Debug`.
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::{SinkExt, StreamExt};
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::{Semaphore, mpsc};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Socket Mode's settings, plain data: `config` reads `SLACK_APP_TOKEN`.
#[derive(Debug, Clone)]
pub struct SocketSettings {
    /// The app-level token (`xapp-…`) with `connections:write`.
    pub app_token: SecretString,
}

/// How long one `apps.connections.open` call may take.
const OPEN_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a ping goes out on an open connection.
const PING_EVERY: Duration = Duration::from_secs(30);
/// A connection silent this long (no frame, not even a pong) is taken for dead.
const SILENT_FOR: Duration = Duration::from_secs(90);
/// Envelopes handled at once per replica; past that the socket is read no further until one ends.
const MAX_IN_FLIGHT: usize = 256;
/// At shutdown, how long envelopes already being handled get to have their acks written.
const ACK_GRACE: Duration = Duration::from_secs(3);
/// Longest Slack error code repeated in a message (codes are short; anything longer is cut).
const ERROR_CODE_MAX_CHARS: usize = 64;

/// Slack's `apps.connections.open` errors that no retry can fix: the token is wrong, revoked, of
/// the wrong kind, or lacks `connections:write`.
const REFUSALS: &[&str] = &[
    "not_authed",
    "invalid_auth",
    "not_allowed_token_type",
    "account_inactive",
    "token_revoked",
    "token_expired",
    "missing_scope",
    "no_permission",
];

/// Why no Socket Mode URL was had.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// Slack refused the token: retrying will not help, an operator must fix the setting.
    #[error(
        "Slack refused SLACK_APP_TOKEN ({code}): it must be an app-level token (xapp-…) of this app with the connections:write scope, and Socket Mode must be enabled for the app"
    )]
    Refused { code: String },
    /// Slack could not be reached or answered with a passing error; trying again may work.
    #[error("could not open a Socket Mode connection: {0}")]
    Unavailable(String),
}

/// One envelope, as Slack sends it.
#[derive(Debug, Clone, Deserialize)]
pub struct Envelope {
    pub envelope_id: String,
    /// `slash_commands`, `interactive` or `events_api`.
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub payload: Value,
    /// Whether the ack may carry a `payload` (the immediate reply).
    #[serde(default)]
    pub accepts_response_payload: bool,
    /// 0 on the first delivery; Slack counts up when it delivers an unacked envelope again.
    #[serde(default)]
    pub retry_attempt: u32,
    #[serde(default)]
    pub retry_reason: String,
}

impl Envelope {
    /// The envelope's type as a metrics label (a fixed set).
    pub fn kind_label(&self) -> &'static str {
        match self.kind.as_str() {
            "slash_commands" => "slash_commands",
            "interactive" => "interactive",
            "events_api" => "events_api",
            _ => "other",
        }
    }
}

/// What became of an envelope (a metrics label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Handed to its handler and answered.
    Handled,
    /// A delivery of an envelope already handled: acked, not handled again.
    Duplicate,
    /// A payload that could not be read, or that its handler refused.
    Refused,
    /// A type Steward does not act on.
    Ignored,
}

impl Outcome {
    pub fn label(self) -> &'static str {
        match self {
            Self::Handled => "handled",
            Self::Duplicate => "duplicate",
            Self::Refused => "refused",
            Self::Ignored => "ignored",
        }
    }
}

/// A handler's answer to one envelope: what the ack carries, and what happened.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The immediate reply (`None`: a bare ack).
    pub payload: Option<Value>,
    pub outcome: Outcome,
}

impl Answer {
    pub fn bare(outcome: Outcome) -> Self {
        Self {
            payload: None,
            outcome,
        }
    }
}

/// What the client calls for each envelope. It must answer within Slack's 3 s (slow work goes
/// on elsewhere) and make a second delivery of the same envelope harmless.
pub type Handler = Arc<dyn Fn(Envelope) -> BoxFuture<'static, Answer> + Send + Sync>;

/// One frame read from the socket.
#[derive(Debug, Clone)]
enum Frame {
    Hello,
    Disconnect {
        reason: String,
    },
    Envelope(Envelope),
    /// Not JSON, or a type this client does not know.
    Unknown,
}

impl Frame {
    fn parse(text: &str) -> Self {
        let Ok(value) = serde_json::from_str::<Value>(text) else {
            return Self::Unknown;
        };
        match value.get("type").and_then(Value::as_str) {
            Some("hello") => Self::Hello,
            Some("disconnect") => Self::Disconnect {
                reason: value
                    .get("reason")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .chars()
                    .take(ERROR_CODE_MAX_CHARS)
                    .collect(),
            },
            Some(_) if value.get("envelope_id").is_some() => {
                serde_json::from_value(value).map_or(Self::Unknown, Self::Envelope)
            }
            _ => Self::Unknown,
        }
    }
}

/// An ack waiting to be written.
#[derive(Debug, Clone)]
struct Ack {
    envelope_id: String,
    payload: Option<Value>,
}

impl Ack {
    fn to_text(&self) -> String {
        match &self.payload {
            Some(payload) => json!({"envelope_id": self.envelope_id, "payload": payload}),
            None => json!({"envelope_id": self.envelope_id}),
        }
        .to_string()
    }
}

/// The wait before connecting again: exponential from `first`, capped at `max`, jittered
/// (somewhere in the upper half, so replicas dropped together do not return together), and
/// back to `first` after a connection that stayed up `healthy_after`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub first: Duration,
    pub max: Duration,
    pub healthy_after: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            first: Duration::from_millis(500),
            max: Duration::from_secs(30),
            healthy_after: Duration::from_secs(30),
        }
    }
}

impl Backoff {
    /// The longest wait after `failures` failed or short-lived connections in a row.
    pub fn ceiling(&self, failures: u32) -> Duration {
        let factor = 1u32.checked_shl(failures.min(20)).unwrap_or(u32::MAX);
        self.first.saturating_mul(factor).min(self.max)
    }

    /// The wait after `failures` in a row: between half the ceiling and the ceiling.
    pub fn delay(&self, failures: u32) -> Duration {
        let ceiling = self.ceiling(failures);
        let half = ceiling / 2;
        let spread = u64::try_from((ceiling - half).as_millis()).unwrap_or(u64::MAX);
        half + Duration::from_millis(rand::random_range(0..=spread))
    }
}

/// What a replica's connection is doing, for tests and logs: a cheap handle.
#[derive(Debug, Clone, Default)]
pub struct SocketStatus(Arc<StatusInner>);

#[derive(Debug, Default)]
struct StatusInner {
    connected: AtomicBool,
    connections: AtomicU64,
    envelopes: AtomicU64,
}

impl SocketStatus {
    /// Whether a connection is open and said `hello`.
    pub fn connected(&self) -> bool {
        self.0.connected.load(Ordering::SeqCst)
    }

    /// Connections that said `hello` since start.
    pub fn connections(&self) -> u64 {
        self.0.connections.load(Ordering::SeqCst)
    }

    /// Envelopes read since start (redeliveries included).
    pub fn envelopes(&self) -> u64 {
        self.0.envelopes.load(Ordering::SeqCst)
    }
}

/// How one connection ended.
#[derive(Debug)]
enum Ended {
    /// Shutdown: closed on purpose.
    Stopped,
    /// Slack sent `disconnect`.
    Disconnect { reason: String, healthy: bool },
    /// The socket closed or failed.
    Dropped { healthy: bool },
    /// No connection was made (`reason`: a metrics label).
    NotConnected { reason: &'static str },
}

/// The Socket Mode client of one replica.
pub struct SocketClient {
    http: reqwest::Client,
    api_url: String,
    token: SecretString,
    backoff: Backoff,
    status: SocketStatus,
}

impl std::fmt::Debug for SocketClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SocketClient")
            .field("api_url", &self.api_url)
            .field("backoff", &self.backoff)
            .finish_non_exhaustive()
    }
}

impl SocketClient {
    /// A client calling `apps.connections.open` at `api_url` (the Web API base, as the bot's
    /// client uses).
    pub fn new(settings: &SocketSettings, api_url: &str) -> Result<Self, OpenError> {
        let http = reqwest::Client::builder()
            .timeout(OPEN_TIMEOUT)
            .build()
            .map_err(|e| OpenError::Unavailable(format!("could not build an HTTP client: {e}")))?;
        Ok(Self {
            http,
            api_url: api_url.trim_end_matches('/').to_owned(),
            token: settings.app_token.clone(),
            backoff: Backoff::default(),
            status: SocketStatus::default(),
        })
    }

    /// Replaces the reconnect backoff.
    pub fn with_backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// A handle on what the connection is doing.
    pub fn status(&self) -> SocketStatus {
        self.status.clone()
    }

    /// `apps.connections.open`: a one-use WebSocket URL.
    pub async fn open(&self) -> Result<String, OpenError> {
        #[derive(Deserialize)]
        struct Opened {
            ok: bool,
            #[serde(default)]
            url: Option<String>,
            #[serde(default)]
            error: Option<String>,
        }
        let endpoint = format!("{}/apps.connections.open", self.api_url);
        let resp = self
            .http
            .post(&endpoint)
            .bearer_auth(self.token.expose_secret())
            .send()
            .await
            .map_err(|e| {
                OpenError::Unavailable(format!("Slack at {} did not answer: {e}", self.api_url))
            })?;
        let status = resp.status();
        if !status.is_success() {
            return Err(OpenError::Unavailable(format!(
                "Slack answered apps.connections.open with HTTP {status}"
            )));
        }
        let opened: Opened = resp.json().await.map_err(|e| {
            OpenError::Unavailable(format!("apps.connections.open answered unreadably: {e}"))
        })?;
        match (opened.ok, opened.url, opened.error) {
            (true, Some(url), _) if url.starts_with("wss://") || url.starts_with("ws://") => {
                Ok(url)
            }
            (true, _, _) => Err(OpenError::Unavailable(
                "apps.connections.open answered ok without a WebSocket URL".into(),
            )),
            (false, _, error) => {
                let code: String = error
                    .unwrap_or_default()
                    .chars()
                    .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .take(ERROR_CODE_MAX_CHARS)
                    .collect();
                if REFUSALS.contains(&code.as_str()) {
                    Err(OpenError::Refused { code })
                } else {
                    Err(OpenError::Unavailable(format!(
                        "apps.connections.open failed: {code}"
                    )))
                }
            }
        }
    }

    /// Holds a connection until `shutdown` completes: opens one (with `first`, a URL from an
    /// [`SocketClient::open`] already made, when given), serves it, and opens another when it
    /// ends. On shutdown, acks of envelopes already being handled are written (for up to
    /// [`ACK_GRACE`]) before the socket is closed.
    pub async fn run(
        self,
        handler: Handler,
        first: Option<String>,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) {
        let stop = CancellationToken::new();
        let stopping = stop.clone();
        tokio::spawn(async move {
            shutdown.await;
            stopping.cancel();
        });
        let mut conn = Connection {
            handler,
            acks: mpsc::unbounded_channel(),
            handling: TaskTracker::new(),
            permits: Arc::new(Semaphore::new(MAX_IN_FLIGHT)),
            status: self.status.clone(),
            stop: stop.clone(),
            healthy_after: self.backoff.healthy_after,
        };
        let mut first = first;
        let mut failures: u32 = 0;
        loop {
            let attempt = async {
                let url = match first.take() {
                    Some(url) => url,
                    None => self.open().await.map_err(|e| {
                        if matches!(e, OpenError::Refused { .. }) {
                            // Said loudly every time: nothing works until an operator fixes it.
                            tracing::error!(error = %e, "Socket Mode cannot connect");
                            "refused"
                        } else {
                            tracing::warn!(error = %e, "Socket Mode: no connection yet");
                            "open_failed"
                        }
                    })?,
                };
                let connecting = tokio_tungstenite::connect_async(url.as_str());
                match tokio::time::timeout(OPEN_TIMEOUT, connecting).await {
                    Ok(Ok((ws, _))) => Ok(ws),
                    Ok(Err(e)) => {
                        tracing::warn!(error = %e, "could not connect to Slack's Socket Mode URL");
                        Err("connect_failed")
                    }
                    Err(_) => {
                        tracing::warn!("Slack's Socket Mode URL did not answer in time");
                        Err("connect_failed")
                    }
                }
            };
            let connected = tokio::select! {
                connected = attempt => connected,
                () = stop.cancelled() => break,
            };
            let ended = match connected {
                Ok(ws) => conn.serve(ws).await,
                Err(reason) => Ended::NotConnected { reason },
            };
            let (reason, healthy, at_once) = match ended {
                Ended::Stopped => break,
                Ended::Disconnect { reason, healthy } => {
                    tracing::info!(%reason, "Slack asked for a new Socket Mode connection");
                    // Slack's routine refresh: reconnect at once unless it keeps happening.
                    ("disconnect", healthy, true)
                }
                Ended::Dropped { healthy } => {
                    tracing::warn!("the Socket Mode connection dropped; connecting again");
                    ("dropped", healthy, false)
                }
                Ended::NotConnected { reason } => (reason, false, false),
            };
            if stop.is_cancelled() {
                break;
            }
            crate::metrics::slack_socket_reconnect(reason);
            if healthy {
                failures = 0;
            }
            let delay = if at_once && failures == 0 {
                Duration::ZERO
            } else {
                self.backoff.delay(failures)
            };
            failures = failures.saturating_add(1);
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                () = stop.cancelled() => break,
            }
        }
        conn.handling.close();
        let _ = tokio::time::timeout(ACK_GRACE, conn.handling.wait()).await;
        tracing::info!("Socket Mode client stopped");
    }
}

/// What outlives one socket: the handler, acks not yet written, the envelopes being handled.
struct Connection {
    handler: Handler,
    acks: (mpsc::UnboundedSender<Ack>, mpsc::UnboundedReceiver<Ack>),
    handling: TaskTracker,
    permits: Arc<Semaphore>,
    status: SocketStatus,
    stop: CancellationToken,
    healthy_after: Duration,
}

impl Connection {
    /// Serves one socket until it ends.
    async fn serve<S>(&mut self, ws: tokio_tungstenite::WebSocketStream<S>) -> Ended
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    {
        let (mut sink, mut stream) = ws.split();
        let mut hello_at: Option<Instant> = None;
        let mut last_heard = Instant::now();
        let mut ping = tokio::time::interval_at(Instant::now() + PING_EVERY, PING_EVERY);
        let ended = loop {
            tokio::select! {
                () = self.stop.cancelled() => break Ended::Stopped,
                Some(ack) = self.acks.1.recv() => {
                    if sink.send(Message::text(ack.to_text())).await.is_err() {
                        // Written on the next connection instead.
                        let _ = self.acks.0.send(ack);
                        break Ended::Dropped { healthy: false };
                    }
                }
                frame = stream.next() => {
                    last_heard = Instant::now();
                    match frame {
                        Some(Ok(Message::Text(text))) => match Frame::parse(text.as_str()) {
                            Frame::Hello => {
                                hello_at = Some(Instant::now());
                                self.status.0.connected.store(true, Ordering::SeqCst);
                                self.status.0.connections.fetch_add(1, Ordering::SeqCst);
                                tracing::info!("Socket Mode connected");
                            }
                            Frame::Disconnect { reason } => {
                                break Ended::Disconnect { reason, healthy: false };
                            }
                            Frame::Envelope(envelope) => self.dispatch(envelope).await,
                            Frame::Unknown => tracing::debug!("Socket Mode: a frame of no known type"),
                        },
                        Some(Ok(Message::Close(_))) | Some(Err(_)) | None => {
                            break Ended::Dropped { healthy: false };
                        }
                        Some(Ok(_)) => {}
                    }
                }
                _ = ping.tick() => {
                    if last_heard.elapsed() > SILENT_FOR {
                        tracing::warn!("the Socket Mode connection went silent");
                        break Ended::Dropped { healthy: false };
                    }
                    if sink.send(Message::Ping(Default::default())).await.is_err() {
                        break Ended::Dropped { healthy: false };
                    }
                }
            }
        };
        self.status.0.connected.store(false, Ordering::SeqCst);
        let healthy = hello_at.is_some_and(|t| t.elapsed() >= self.healthy_after);
        match ended {
            Ended::Stopped => {
                self.flush_acks(&mut sink).await;
                let _ = sink.send(Message::Close(None)).await;
                let _ = sink.close().await;
                Ended::Stopped
            }
            Ended::Disconnect { reason, .. } => Ended::Disconnect { reason, healthy },
            Ended::Dropped { .. } => Ended::Dropped { healthy },
            other => other,
        }
    }

    /// At shutdown: writes the acks of envelopes still being handled, waiting up to [`ACK_GRACE`].
    async fn flush_acks<W>(&mut self, sink: &mut W)
    where
        W: futures::Sink<Message> + Unpin,
    {
        let handling = self.handling.clone();
        handling.close();
        let acks = &mut self.acks.1;
        let _ = tokio::time::timeout(ACK_GRACE, async {
            loop {
                tokio::select! {
                    Some(ack) = acks.recv() => {
                        if sink.send(Message::text(ack.to_text())).await.is_err() {
                            return;
                        }
                    }
                    () = handling.wait() => break,
                }
            }
            while let Ok(ack) = acks.try_recv() {
                if sink.send(Message::text(ack.to_text())).await.is_err() {
                    return;
                }
            }
        })
        .await;
    }

    /// Hands `envelope` to the handler in a task of its own; its ack goes into the queue.
    async fn dispatch(&self, envelope: Envelope) {
        self.status.0.envelopes.fetch_add(1, Ordering::SeqCst);
        let Ok(permit) = self.permits.clone().acquire_owned().await else {
            return;
        };
        let handler = self.handler.clone();
        let acks = self.acks.0.clone();
        self.handling.spawn(async move {
            let _permit = permit;
            let kind = envelope.kind_label();
            let envelope_id = envelope.envelope_id.clone();
            let accepts_payload = envelope.accepts_response_payload;
            let answer = handler(envelope).await;
            crate::metrics::slack_socket_envelope(kind, answer.outcome.label());
            let payload = answer.payload.filter(|_| accepts_payload);
            let _ = acks.send(Ack {
                envelope_id,
                payload,
            });
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_told_apart_by_type() {
        assert!(matches!(
            Frame::parse(r#"{"type":"hello","num_connections":1}"#),
            Frame::Hello
        ));
        match Frame::parse(r#"{"type":"disconnect","reason":"refresh_requested"}"#) {
            Frame::Disconnect { reason } => assert_eq!(reason, "refresh_requested"),
            other => panic!("{other:?}"),
        }
        let text = r#"{"envelope_id":"e1","type":"slash_commands","payload":{"text":"help"},
                       "accepts_response_payload":true,"retry_attempt":2,"retry_reason":"timeout"}"#;
        match Frame::parse(text) {
            Frame::Envelope(e) => {
                assert_eq!(e.envelope_id, "e1");
                assert_eq!(e.kind_label(), "slash_commands");
                assert_eq!(e.retry_attempt, 2);
                assert!(e.accepts_response_payload);
                assert_eq!(e.payload["text"], "help");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(Frame::parse("not json"), Frame::Unknown));
        assert!(matches!(Frame::parse(r#"{"type":"x"}"#), Frame::Unknown));
        // An envelope of a type Steward does not know still parses (and is acked).
        match Frame::parse(r#"{"envelope_id":"e2","type":"future_type"}"#) {
            Frame::Envelope(e) => assert_eq!(e.kind_label(), "other"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_ack_carries_the_payload_only_when_there_is_one() {
        let bare = Ack {
            envelope_id: "e1".into(),
            payload: None,
        };
        assert_eq!(bare.to_text(), r#"{"envelope_id":"e1"}"#);
        let reply = Ack {
            envelope_id: "e1".into(),
            payload: Some(json!({"text": "hi"})),
        };
        let v: Value = serde_json::from_str(&reply.to_text()).unwrap();
        assert_eq!(v, json!({"envelope_id": "e1", "payload": {"text": "hi"}}));
    }

    #[test]
    fn the_backoff_doubles_up_to_its_cap_and_stays_in_the_upper_half() {
        let b = Backoff {
            first: Duration::from_millis(500),
            max: Duration::from_secs(30),
            healthy_after: Duration::from_secs(30),
        };
        assert_eq!(b.ceiling(0), Duration::from_millis(500));
        assert_eq!(b.ceiling(1), Duration::from_secs(1));
        assert_eq!(b.ceiling(3), Duration::from_secs(4));
        assert_eq!(b.ceiling(10), Duration::from_secs(30));
        assert_eq!(b.ceiling(u32::MAX), Duration::from_secs(30));
        for failures in [0, 1, 5, 40] {
            for _ in 0..50 {
                let d = b.delay(failures);
                let ceiling = b.ceiling(failures);
                assert!(d >= ceiling / 2 && d <= ceiling, "{d:?} for {failures}");
            }
        }
    }

    #[test]
    fn a_refused_token_is_named_by_slacks_code_and_never_shown() {
        let settings = SocketSettings {
            app_token: SecretString::from("xapp-1-SECRET-TOKEN".to_owned()),
        };
        let client = SocketClient::new(&settings, "http://127.0.0.1:9/api/").unwrap();
        let shown = format!("{client:?} {settings:?}");
        assert!(!shown.contains("SECRET"), "{shown}");
        assert_eq!(client.api_url, "http://127.0.0.1:9/api");
        let e = OpenError::Refused {
            code: "invalid_auth".into(),
        };
        assert!(
            e.to_string().contains("SLACK_APP_TOKEN (invalid_auth)"),
            "{e}"
        );
    }
}
