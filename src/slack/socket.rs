//! Socket Mode: Slack delivers slash commands, interactions and events over a WebSocket the app
//! opens (`apps.connections.open` with the app-level token, then the URL it answers), instead of
//! POSTing them to a public URL. [`SocketClient::run`] holds one connection per replica: it reads
//! `hello`, hands each envelope to the [`Handler`] it was given and sends back the ack (with the
//! handler's immediate reply as its `payload` when the envelope accepts one) on the socket the
//! envelope came from.
//!
//! Slack's `disconnect` says why: `warning` (a refresh is coming) changes nothing, the connection
//! keeps serving; `refresh_requested` (and any other reason) retires it, which stops reading it,
//! writes the acks its envelopes still owe and closes it, while the next connection is opened at
//! once (after a backoff when `too_many_websockets` or when connections keep ending early);
//! `link_disabled` (Socket Mode turned off for the app) retires it for good: no connection is
//! opened again and [`SocketStatus`] says `disabled`. A socket that drops, goes silent or does
//! not say `hello` within [`HELLO_WITHIN`] is opened again after a jittered exponential
//! [`Backoff`] that a healthy connection resets.
//!
//! An ack whose socket is gone is not written anywhere else: Slack did not see it, so it delivers
//! the envelope again (with `retry_attempt`), and the handler must make a redelivery harmless
//! (it does: `http::socket`). This module knows Socket Mode's wire format and connection rules
//! only: it must not know what an envelope asks for, nor import `http`, `store` or `approvals`;
//! the app token and the socket URL (its ticket) never appear in logs, errors or `Debug`.
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::{SinkExt, StreamExt};
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;
use tokio::net::TcpStream;
use tokio::sync::{Semaphore, mpsc};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::telemetry::WarnGate;

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
/// A new socket that has not said `hello` by then is dropped and opened again.
const HELLO_WITHIN: Duration = Duration::from_secs(10);
/// Envelopes handled at once per replica; one read past that is left unacked (Slack delivers it
/// again a few seconds later), so the socket keeps being read and its acks keep being written.
const MAX_IN_FLIGHT: usize = 256;
/// How long a retired connection (and every connection at shutdown) waits for the acks its
/// envelopes still owe before it closes: handlers answer within Slack's 3 s.
const ACK_GRACE: Duration = Duration::from_secs(3);
/// How long a closing connection waits for Slack's answer to its close frame.
const CLOSE_WAIT: Duration = Duration::from_secs(1);
/// Largest WebSocket message (and frame) read from Slack. An envelope carries one request's
/// payload, which is refused above 64 KiB as over HTTP, so this only bounds what one read may
/// hold in memory: a larger message drops the connection (with a warning), and Slack's
/// redeliveries of it meet the same until it gives up.
pub const MESSAGE_MAX_BYTES: usize = 1024 * 1024;
/// Longest Slack error code repeated in a message (codes are short; anything longer is cut).
const ERROR_CODE_MAX_CHARS: usize = 64;
/// The longest `Retry-After` honoured; a larger one (a broken proxy) waits this long instead.
const RETRY_AFTER_MAX: Duration = Duration::from_secs(300);

/// Slack's `apps.connections.open` errors that no retry can fix: the token is wrong, revoked, of
/// the wrong kind or lacks `connections:write`, or its workspace or owner is gone.
const REFUSALS: &[&str] = &[
    "not_authed",
    "invalid_auth",
    "not_allowed_token_type",
    "account_inactive",
    "token_revoked",
    "token_expired",
    "missing_scope",
    "no_permission",
    "team_disabled",
    "user_removed_from_team",
];

/// The `disconnect` reason Slack sends seconds before it refreshes a connection.
const WARNING: &str = "warning";
/// The `disconnect` reason Slack sends when Socket Mode is turned off for the app.
const LINK_DISABLED: &str = "link_disabled";
/// The `disconnect` reason Slack sends when the app holds too many connections.
const TOO_MANY_WEBSOCKETS: &str = "too_many_websockets";

/// Why no Socket Mode URL was had.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// Slack refused the token: retrying will not help, an operator must fix the setting.
    #[error(
        "Slack refused SLACK_APP_TOKEN ({code}): it must be an app-level token (xapp-…) of this app with the connections:write scope, and Socket Mode must be enabled for the app"
    )]
    Refused { code: String },
    /// Slack answered 429 (or `ratelimited`): try again, no sooner than `retry_after`.
    #[error("Slack rate-limited apps.connections.open{}", retry_after_words(.retry_after))]
    RateLimited { retry_after: Option<Duration> },
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
    /// The payload's JSON as it came, parsed only by the handler that reads it.
    #[serde(default)]
    pub payload: Option<Box<RawValue>>,
    /// Whether the ack may carry a `payload` (the immediate reply).
    #[serde(default)]
    pub accepts_response_payload: bool,
    /// 0 on the first delivery; Slack counts up when it delivers an unacked envelope again.
    #[serde(default)]
    pub retry_attempt: u32,
    #[serde(default)]
    pub retry_reason: String,
    /// When the frame was read: the ack's deadline counts from here.
    #[serde(skip, default = "Instant::now")]
    pub read_at: Instant,
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
    /// A payload that could not be read, or whose handler refused it, failed, or did not answer
    /// in time (acked without a reply).
    Refused,
    /// A type Steward does not act on.
    Ignored,
    /// Read while [`MAX_IN_FLIGHT`] envelopes were being handled: left unacked, so Slack
    /// delivers it again.
    Shed,
}

impl Outcome {
    pub fn label(self) -> &'static str {
        match self {
            Self::Handled => "handled",
            Self::Duplicate => "duplicate",
            Self::Refused => "refused",
            Self::Ignored => "ignored",
            Self::Shed => "shed",
        }
    }
}

/// A handler's answer to one envelope: what the ack carries, and what happened.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The immediate reply's JSON (`None`: a bare ack), written into the ack as it is.
    pub payload: Option<Box<RawValue>>,
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

/// Any frame's fields, read in one pass: the payload is kept as its JSON text, never built
/// into a `Value`.
#[derive(Deserialize)]
struct Incoming {
    #[serde(rename = "type")]
    kind: Option<String>,
    #[serde(default)]
    reason: Option<Value>,
    #[serde(default)]
    envelope_id: Option<String>,
    #[serde(default)]
    payload: Option<Box<RawValue>>,
    #[serde(default)]
    accepts_response_payload: bool,
    #[serde(default)]
    retry_attempt: u32,
    #[serde(default)]
    retry_reason: String,
}

impl Frame {
    fn parse(text: &str) -> Self {
        let read_at = Instant::now();
        let Ok(frame) = serde_json::from_str::<Incoming>(text) else {
            return Self::Unknown;
        };
        match (frame.kind, frame.envelope_id) {
            (Some(kind), _) if kind == "hello" => Self::Hello,
            (Some(kind), _) if kind == "disconnect" => Self::Disconnect {
                reason: frame
                    .reason
                    .as_ref()
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .chars()
                    .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .take(ERROR_CODE_MAX_CHARS)
                    .collect(),
            },
            (Some(kind), Some(envelope_id)) => Self::Envelope(Envelope {
                envelope_id,
                kind,
                payload: frame.payload,
                accepts_response_payload: frame.accepts_response_payload,
                retry_attempt: frame.retry_attempt,
                retry_reason: frame.retry_reason,
                read_at,
            }),
            _ => Self::Unknown,
        }
    }
}

/// An ack waiting to be written.
#[derive(Debug, Clone, Serialize)]
struct Ack {
    envelope_id: String,
    /// The handler's JSON, written as it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    payload: Option<Box<RawValue>>,
}

impl Ack {
    fn to_text(&self) -> String {
        serde_json::to_string(self).expect("a string and raw JSON always serialize")
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

/// What to do after a connection ended or an attempt failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Retry {
    /// Slack's routine refresh of a connection: at once, unless connections keep ending early.
    Refresh,
    /// Always after the backoff (a drop, a failed open, `too_many_websockets`).
    Backoff,
    /// After the backoff, and no sooner than Slack's `Retry-After`.
    NotBefore(Duration),
    /// The token is refused: an operator must act, so only at the longest backoff.
    Slowest,
}

impl Retry {
    /// The wait before the next attempt, given the `failures` in a row so far (which it counts
    /// up, after resetting them when the connection that ended was `healthy`).
    fn delay(self, backoff: &Backoff, failures: &mut u32, healthy: bool) -> Duration {
        if healthy {
            *failures = 0;
        }
        let delay = match self {
            Self::Refresh if *failures == 0 => Duration::ZERO,
            Self::Refresh | Self::Backoff => backoff.delay(*failures),
            Self::NotBefore(at_least) => backoff.delay(*failures).max(at_least),
            Self::Slowest => backoff.delay(u32::MAX),
        };
        *failures = failures.saturating_add(1);
        delay
    }
}

/// What a `disconnect` asks of the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Disconnect {
    /// `warning`: Slack will refresh the connection soon; it keeps serving until then.
    KeepServing,
    /// `link_disabled`: Socket Mode is off for the app; no connection is opened again.
    Stop,
    /// Anything else: retire this connection and open another.
    Reconnect(Retry),
}

impl Disconnect {
    fn from_reason(reason: &str) -> Self {
        match reason {
            WARNING => Self::KeepServing,
            LINK_DISABLED => Self::Stop,
            // Opening another at once would only meet the same limit.
            TOO_MANY_WEBSOCKETS => Self::Reconnect(Retry::Backoff),
            _ => Self::Reconnect(Retry::Refresh),
        }
    }
}

/// What a replica's connection is doing, for `/readyz`, tests and logs: a cheap handle.
#[derive(Debug, Clone, Default)]
pub struct SocketStatus(Arc<StatusInner>);

#[derive(Debug, Default)]
struct StatusInner {
    connected: AtomicBool,
    refused: AtomicBool,
    disabled: AtomicBool,
    connections: AtomicU64,
    envelopes: AtomicU64,
}

/// The state of a replica's Socket Mode connection, as `/readyz` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SocketState {
    /// A connection is open and said `hello`.
    Connected,
    /// A connection is being opened or reopened.
    Connecting,
    /// Slack refuses the app token (revoked, say); attempts go on at the longest backoff.
    Refused,
    /// Slack turned Socket Mode off for the app (`link_disabled`): no connection is opened
    /// again, and Slack sends its requests to the app's HTTP request URLs.
    Disabled,
}

impl SocketState {
    pub fn label(self) -> &'static str {
        match self {
            Self::Connected => "ok",
            Self::Connecting => "connecting",
            Self::Refused => "refused",
            Self::Disabled => "disabled",
        }
    }
}

impl SocketStatus {
    /// Whether a connection is open and said `hello`.
    pub fn connected(&self) -> bool {
        self.0.connected.load(Ordering::SeqCst)
    }

    /// What the connection is doing.
    pub fn state(&self) -> SocketState {
        if self.0.disabled.load(Ordering::SeqCst) {
            SocketState::Disabled
        } else if self.connected() {
            SocketState::Connected
        } else if self.0.refused.load(Ordering::SeqCst) {
            SocketState::Refused
        } else {
            SocketState::Connecting
        }
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

/// The words after "rate-limited" in [`OpenError::RateLimited`]'s message.
fn retry_after_words(retry_after: &Option<Duration>) -> String {
    match retry_after {
        Some(after) => format!(" (retry after {} s)", after.as_secs()),
        None => String::new(),
    }
}

/// `Retry-After` in seconds, capped at [`RETRY_AFTER_MAX`].
fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    super::client::retry_after(headers).map(|wait| wait.min(RETRY_AFTER_MAX))
}

/// A WebSocket to Slack.
type Socket = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// Opens the WebSocket at `url`: `wss://` from Slack (TLS with the system's roots), `ws://`
/// from the simulator.
async fn connect_socket(url: &str) -> Result<Socket, tokio_tungstenite::tungstenite::Error> {
    // No Nagle: an ack is a small write that must not wait for the previous one's TCP ack.
    tokio_tungstenite::connect_async_with_config(url, Some(socket_config()), true)
        .await
        .map(|(socket, _)| socket)
}

/// The WebSocket's limits: at most [`MESSAGE_MAX_BYTES`] a message or frame.
fn socket_config() -> WebSocketConfig {
    WebSocketConfig::default()
        .max_message_size(Some(MESSAGE_MAX_BYTES))
        .max_frame_size(Some(MESSAGE_MAX_BYTES))
}

/// Why an attempt at a connection failed.
#[derive(Debug)]
enum Failed {
    Open(OpenError),
    /// The URL did not answer as a WebSocket.
    Connect,
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

    /// `apps.connections.open`: a one-use WebSocket URL. Each call is counted in
    /// `steward_slack_api_calls_total` (`ok`, `api_error`, `rate_limited`, `transport`,
    /// `refused`).
    pub async fn open(&self) -> Result<String, OpenError> {
        let (outcome, opened) = self.call_open().await;
        crate::metrics::slack_api_call("apps.connections.open", outcome);
        opened
    }

    /// One `apps.connections.open` call: its metrics outcome and its result.
    async fn call_open(&self) -> (&'static str, Result<String, OpenError>) {
        #[derive(Deserialize)]
        struct Opened {
            ok: bool,
            #[serde(default)]
            url: Option<String>,
            #[serde(default)]
            error: Option<String>,
        }
        let endpoint = format!("{}/apps.connections.open", self.api_url);
        let sent = self
            .http
            .post(&endpoint)
            .bearer_auth(self.token.expose_secret())
            .send()
            .await;
        let resp = match sent {
            Ok(resp) => resp,
            Err(e) => {
                let e = OpenError::Unavailable(format!(
                    "Slack at {} did not answer: {}",
                    self.api_url,
                    e.without_url()
                ));
                return ("transport", Err(e));
            }
        };
        let status = resp.status();
        if status == reqwest::StatusCode::TOO_MANY_REQUESTS {
            let retry_after = retry_after(resp.headers());
            return ("rate_limited", Err(OpenError::RateLimited { retry_after }));
        }
        if !status.is_success() {
            let e = OpenError::Unavailable(format!(
                "Slack answered apps.connections.open with HTTP {status}"
            ));
            return ("api_error", Err(e));
        }
        let opened: Opened = match resp.json().await {
            Ok(opened) => opened,
            Err(e) => {
                let outcome = if e.is_decode() {
                    "api_error"
                } else {
                    "transport"
                };
                let e = OpenError::Unavailable(format!(
                    "apps.connections.open answered unreadably: {}",
                    e.without_url()
                ));
                return (outcome, Err(e));
            }
        };
        match (opened.ok, opened.url, opened.error) {
            (true, Some(url), _) if url.starts_with("wss://") || url.starts_with("ws://") => {
                ("ok", Ok(url))
            }
            (true, _, _) => (
                "api_error",
                Err(OpenError::Unavailable(
                    "apps.connections.open answered ok without a WebSocket URL".into(),
                )),
            ),
            (false, _, error) => {
                let code: String = error
                    .unwrap_or_default()
                    .chars()
                    .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .take(ERROR_CODE_MAX_CHARS)
                    .collect();
                if REFUSALS.contains(&code.as_str()) {
                    ("refused", Err(OpenError::Refused { code }))
                } else if code == "ratelimited" {
                    let e = OpenError::RateLimited { retry_after: None };
                    ("rate_limited", Err(e))
                } else {
                    let e = OpenError::Unavailable(format!("apps.connections.open failed: {code}"));
                    ("api_error", Err(e))
                }
            }
        }
    }

    /// One attempt at a connection, after `delay`: `url` when an
    /// [`SocketClient::open`] was already made, else a new `apps.connections.open`.
    async fn attempt(
        &self,
        delay: Duration,
        url: Option<Result<String, OpenError>>,
    ) -> Result<Socket, Failed> {
        tokio::time::sleep(delay).await;
        let url = match url {
            Some(url) => url,
            None => self.open().await,
        }
        .map_err(Failed::Open)?;
        self.status.0.refused.store(false, Ordering::SeqCst);
        match tokio::time::timeout(OPEN_TIMEOUT, connect_socket(&url)).await {
            Ok(Ok(socket)) => Ok(socket),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "could not connect to Slack's Socket Mode URL");
                Err(Failed::Connect)
            }
            Err(_) => {
                tracing::warn!("Slack's Socket Mode URL did not answer in time");
                Err(Failed::Connect)
            }
        }
    }

    /// Says why an attempt failed: the reconnect reason (a metrics label) and when to retry.
    fn failed(&self, failed: Failed) -> (&'static str, Retry) {
        let refused = matches!(failed, Failed::Open(OpenError::Refused { .. }));
        self.status.0.refused.store(refused, Ordering::SeqCst);
        match failed {
            Failed::Open(e @ OpenError::Refused { .. }) => {
                // Said loudly every time: nothing works until an operator fixes it.
                tracing::error!(error = %e, retry_in_secs = self.backoff.max.as_secs(), "Socket Mode cannot connect");
                ("refused", Retry::Slowest)
            }
            Failed::Open(e @ OpenError::RateLimited { retry_after }) => {
                tracing::warn!(error = %e, "Socket Mode: no connection yet");
                (
                    "open_failed",
                    Retry::NotBefore(retry_after.unwrap_or_default()),
                )
            }
            Failed::Open(e) => {
                tracing::warn!(error = %e, "Socket Mode: no connection yet");
                ("open_failed", Retry::Backoff)
            }
            Failed::Connect => ("connect_failed", Retry::Backoff),
        }
    }

    /// Holds a connection until `shutdown` completes: connects with `first` (the result of an
    /// [`SocketClient::open`] already made), serves the connection, and opens another when it
    /// ends (see the module's doc). On shutdown every connection stops reading, writes the acks
    /// of envelopes already being handled (for up to [`ACK_GRACE`]) and closes.
    pub async fn run(
        self,
        handler: Handler,
        first: Result<String, OpenError>,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) {
        let stop = CancellationToken::new();
        let stopping = stop.clone();
        tokio::spawn(async move {
            shutdown.await;
            stopping.cancel();
        });
        let shared = Arc::new(Shared {
            handler,
            permits: Arc::new(Semaphore::new(MAX_IN_FLIGHT)),
            status: self.status.clone(),
            stop: stop.clone(),
        });
        let links = TaskTracker::new();
        let (events_tx, mut events) = mpsc::unbounded_channel();
        let mut current: Option<Current> = None;
        let mut last_link: u64 = 0;
        let mut failures: u32 = 0;
        let mut attempt: Option<BoxFuture<'_, Result<Socket, Failed>>> =
            Some(Box::pin(self.attempt(Duration::ZERO, Some(first))));
        loop {
            // Set when this turn ends a connection or an attempt: the reconnect reason (a
            // metrics label), when to retry, and whether the connection had been healthy.
            let mut next: Option<(&'static str, Retry, bool)> = None;
            tokio::select! {
                () = stop.cancelled() => break,
                Some(event) = events.recv() => match event {
                    LinkEvent::Hello { link } => {
                        if let Some(c) = current.as_mut().filter(|c| c.link == link) {
                            c.hello_at = Some(Instant::now());
                            self.status.0.connected.store(true, Ordering::SeqCst);
                            self.status.0.connections.fetch_add(1, Ordering::SeqCst);
                            tracing::info!("Socket Mode connected");
                        }
                    }
                    LinkEvent::Disconnect { link, reason } => {
                        if current.as_ref().is_some_and(|c| c.link == link) {
                            next = self.disconnected(&mut current, &reason);
                            if self.status.0.disabled.load(Ordering::SeqCst) {
                                attempt = None;
                            }
                        }
                    }
                    LinkEvent::Dropped { link } => {
                        if let Some(c) = current.take_if(|c| c.link == link) {
                            self.status.0.connected.store(false, Ordering::SeqCst);
                            tracing::warn!("the Socket Mode connection dropped; connecting again");
                            next = Some(("dropped", Retry::Backoff, c.healthy(&self.backoff)));
                        }
                    }
                },
                connected = async { attempt.as_mut().expect("guarded by is_some").await }, if attempt.is_some() => {
                    attempt = None;
                    match connected {
                        Ok(socket) => {
                            last_link += 1;
                            let retire = CancellationToken::new();
                            links.spawn(serve_link(
                                socket,
                                last_link,
                                shared.clone(),
                                events_tx.clone(),
                                retire.clone(),
                            ));
                            current = Some(Current { link: last_link, hello_at: None, retire });
                        }
                        Err(failed) => {
                            let (reason, retry) = self.failed(failed);
                            next = Some((reason, retry, false));
                        }
                    }
                }
            }
            if let Some((reason, retry, healthy)) = next {
                crate::metrics::slack_socket_reconnect(reason);
                let delay = retry.delay(&self.backoff, &mut failures, healthy);
                attempt = Some(Box::pin(self.attempt(delay, None)));
            }
        }
        self.status.0.connected.store(false, Ordering::SeqCst);
        links.close();
        let _ = tokio::time::timeout(ACK_GRACE + CLOSE_WAIT, links.wait()).await;
        tracing::info!("Socket Mode client stopped");
    }

    /// Slack sent `disconnect` with `reason` on the current connection: keeps serving on it
    /// (`warning`), or retires it, for good (`link_disabled`) or to open another (what `next`
    /// in [`SocketClient::run`] is then).
    fn disconnected(
        &self,
        current: &mut Option<Current>,
        reason: &str,
    ) -> Option<(&'static str, Retry, bool)> {
        let plan = Disconnect::from_reason(reason);
        if plan == Disconnect::KeepServing {
            // Routine: Slack refreshes every connection every few hours.
            tracing::debug!(
                reason,
                "Slack will refresh the Socket Mode connection soon; serving on it until then"
            );
            return None;
        }
        let retired = current.take()?;
        // It stops reading, writes the acks its envelopes still owe and closes.
        retired.retire.cancel();
        self.status.0.connected.store(false, Ordering::SeqCst);
        match plan {
            Disconnect::Stop => {
                self.status.0.disabled.store(true, Ordering::SeqCst);
                tracing::error!(
                    reason,
                    "Slack turned Socket Mode off for this app: Steward will not connect again and now expects Slack's requests at its HTTP request URLs (POST /slack/commands, /slack/interactions, /slack/events, which need SLACK_SIGNING_SECRET); restart it once Socket Mode is on again"
                );
                None
            }
            Disconnect::Reconnect(retry) => {
                if retry == Retry::Refresh {
                    tracing::debug!(reason, "Slack asked for a new Socket Mode connection");
                } else {
                    tracing::warn!(
                        reason,
                        "Slack closed the Socket Mode connection; connecting again after a backoff"
                    );
                }
                Some(("disconnect", retry, retired.healthy(&self.backoff)))
            }
            Disconnect::KeepServing => None,
        }
    }
}

/// The connection being served, as [`SocketClient::run`] sees it.
struct Current {
    link: u64,
    hello_at: Option<Instant>,
    /// Cancelled to retire the connection: it stops reading, writes its acks and closes.
    retire: CancellationToken,
}

impl Current {
    /// Whether it stayed up long enough to reset the backoff.
    fn healthy(&self, backoff: &Backoff) -> bool {
        self.hello_at
            .is_some_and(|t| t.elapsed() >= backoff.healthy_after)
    }
}

/// What a connection's task tells [`SocketClient::run`].
#[derive(Debug)]
enum LinkEvent {
    Hello {
        link: u64,
    },
    Disconnect {
        link: u64,
        reason: String,
    },
    /// The socket closed, failed or went silent without being retired.
    Dropped {
        link: u64,
    },
}

/// What every connection's task shares.
struct Shared {
    handler: Handler,
    /// Envelopes being handled, across connections, at most [`MAX_IN_FLIGHT`].
    permits: Arc<Semaphore>,
    status: SocketStatus,
    stop: CancellationToken,
}

/// Serves one socket until it drops, is retired or the client stops. Its envelopes' acks are
/// written on it; once retired (or stopping) it reads no more, writes the acks still owed (up
/// to [`ACK_GRACE`]) and closes with a close frame. When it drops, the acks it still owes are
/// lost, and Slack delivers their envelopes again.
async fn serve_link<S>(
    socket: WebSocketStream<S>,
    link: u64,
    shared: Arc<Shared>,
    events: mpsc::UnboundedSender<LinkEvent>,
    retire: CancellationToken,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let (mut sink, mut stream) = socket.split();
    let (acks, mut owed) = mpsc::unbounded_channel::<Ack>();
    let mut last_heard = Instant::now();
    let mut ping = tokio::time::interval_at(Instant::now() + PING_EVERY, PING_EVERY);
    let hello_by = tokio::time::sleep(HELLO_WITHIN);
    tokio::pin!(hello_by);
    let mut said_hello = false;
    let dropped = loop {
        tokio::select! {
            () = retire.cancelled() => break false,
            () = &mut hello_by, if !said_hello => {
                tracing::warn!(
                    within_s = HELLO_WITHIN.as_secs(),
                    "the Socket Mode connection never said hello; connecting again"
                );
                break true;
            }
            () = shared.stop.cancelled() => break false,
            Some(ack) = owed.recv() => {
                if write_acks(&mut sink, ack, &mut owed).await.is_err() {
                    break true;
                }
            }
            frame = stream.next() => {
                last_heard = Instant::now();
                match frame {
                    Some(Ok(Message::Text(text))) => match Frame::parse(text.as_str()) {
                        Frame::Hello => {
                            said_hello = true;
                            let _ = events.send(LinkEvent::Hello { link });
                        }
                        Frame::Disconnect { reason } => {
                            let _ = events.send(LinkEvent::Disconnect { link, reason });
                        }
                        Frame::Envelope(envelope) => dispatch(&shared, envelope, &acks),
                        Frame::Unknown => tracing::debug!("Socket Mode: a frame of no known type"),
                    },
                    Some(Err(WsError::Capacity(e))) => {
                        tracing::warn!(
                            error = %e,
                            max_bytes = MESSAGE_MAX_BYTES,
                            "Slack sent a Socket Mode message too large to read; connecting again"
                        );
                        break true;
                    }
                    Some(Ok(Message::Close(_))) | Some(Err(_)) | None => break true,
                    Some(Ok(_)) => {}
                }
            }
            _ = ping.tick() => {
                if last_heard.elapsed() > SILENT_FOR {
                    tracing::warn!("the Socket Mode connection went silent");
                    break true;
                }
                if sink.send(Message::Ping(Default::default())).await.is_err() {
                    break true;
                }
            }
        }
    };
    // From here the envelopes still being handled hold the only senders: once they have all
    // answered, `owed` ends.
    drop(acks);
    if dropped {
        let _ = events.send(LinkEvent::Dropped { link });
        owed.close();
        while let Ok(ack) = owed.try_recv() {
            ack_lost(&ack);
        }
        return;
    }
    let _ = tokio::time::timeout(ACK_GRACE, async {
        while let Some(ack) = owed.recv().await {
            if sink.send(Message::text(ack.to_text())).await.is_err() {
                ack_lost(&ack);
                return;
            }
        }
    })
    .await;
    let _ = tokio::time::timeout(CLOSE_WAIT, async {
        let _ = sink.close().await;
        while let Some(Ok(_)) = stream.next().await {}
    })
    .await;
}

/// Acks written before one flush: under load many are owed at once, and one write for them all
/// is one system call instead of one each.
const ACKS_PER_WRITE: usize = 64;

/// Writes `first` and the acks already owed after it (up to [`ACKS_PER_WRITE`]), then flushes
/// once. On a write error every ack of the batch is reported lost: none is known to have left.
async fn write_acks<K>(
    sink: &mut K,
    first: Ack,
    owed: &mut mpsc::UnboundedReceiver<Ack>,
) -> Result<(), ()>
where
    K: futures::Sink<Message> + Unpin,
{
    let mut batch = vec![first];
    while batch.len() < ACKS_PER_WRITE {
        match owed.try_recv() {
            Ok(ack) => batch.push(ack),
            Err(_) => break,
        }
    }
    let mut written = true;
    for ack in &batch {
        written = sink.feed(Message::text(ack.to_text())).await.is_ok();
        if !written {
            break;
        }
    }
    if !written || sink.flush().await.is_err() {
        batch.iter().for_each(ack_lost);
        return Err(());
    }
    Ok(())
}

/// An ack whose socket went away: Slack did not see it and delivers the envelope again.
fn ack_lost(ack: &Ack) {
    tracing::info!(
        envelope_id = %ack.envelope_id,
        "the socket of a Socket Mode envelope closed before its ack was written; Slack delivers it again"
    );
}

/// Envelopes shed for want of a permit are logged at `warn` at most once every 10 s.
static SHEDDING: WarnGate = WarnGate::new(Duration::from_secs(10));

/// Hands `envelope` to the handler in a task of its own; its ack goes to `acks`, the queue of
/// the socket it came from. With [`MAX_IN_FLIGHT`] envelopes already being handled it is left
/// unacked (outcome `shed`) rather than waited for: Slack delivers it again, and meanwhile the
/// socket is still read and the acks owed are still written.
fn dispatch(shared: &Shared, envelope: Envelope, acks: &mpsc::UnboundedSender<Ack>) {
    shared.status.0.envelopes.fetch_add(1, Ordering::SeqCst);
    let Ok(permit) = shared.permits.clone().try_acquire_owned() else {
        crate::metrics::slack_socket_envelope(envelope.kind_label(), Outcome::Shed.label());
        if let Some(quiet) = SHEDDING.warn_now() {
            tracing::warn!(
                in_flight = MAX_IN_FLIGHT,
                shed_quietly_before = quiet,
                "too many Socket Mode envelopes being handled; one is left for Slack to deliver again (further ones within 10 s are logged at debug)"
            );
        } else {
            tracing::debug!(envelope_id = %envelope.envelope_id, "Socket Mode envelope shed");
        }
        return;
    };
    let handler = shared.handler.clone();
    let acks = acks.clone();
    tokio::spawn(async move {
        let _permit = permit;
        let kind = envelope.kind_label();
        let envelope_id = envelope.envelope_id.clone();
        let accepts_payload = envelope.accepts_response_payload;
        let answer = handler(envelope).await;
        crate::metrics::slack_socket_envelope(kind, answer.outcome.label());
        let payload = answer.payload.filter(|_| accepts_payload);
        if let Err(mpsc::error::SendError(ack)) = acks.send(Ack {
            envelope_id,
            payload,
        }) {
            ack_lost(&ack);
        }
    });
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn raw(value: Value) -> Box<RawValue> {
        serde_json::value::to_raw_value(&value).unwrap()
    }

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
                // Kept as its text, as it came.
                assert_eq!(e.payload.unwrap().get(), r#"{"text":"help"}"#);
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
            envelope_id: "e\"1".into(),
            payload: Some(RawValue::from_string(r#"{"text": "hi"}"#.to_owned()).unwrap()),
        };
        // The envelope id is escaped; the handler's JSON is written as it is.
        assert_eq!(
            reply.to_text(),
            r#"{"envelope_id":"e\"1","payload":{"text": "hi"}}"#
        );
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

    #[test]
    fn a_disconnect_is_acted_on_by_its_reason() {
        assert_eq!(Disconnect::from_reason("warning"), Disconnect::KeepServing);
        assert_eq!(Disconnect::from_reason("link_disabled"), Disconnect::Stop);
        assert_eq!(
            Disconnect::from_reason("too_many_websockets"),
            Disconnect::Reconnect(Retry::Backoff)
        );
        for reason in ["refresh_requested", "", "something_new"] {
            assert_eq!(
                Disconnect::from_reason(reason),
                Disconnect::Reconnect(Retry::Refresh),
                "{reason}"
            );
        }
    }

    #[test]
    fn only_a_refresh_after_a_healthy_connection_reconnects_at_once() {
        let b = Backoff::default();
        let mut failures = 0;
        assert_eq!(
            Retry::Refresh.delay(&b, &mut failures, false),
            Duration::ZERO
        );
        // A second refresh in a row, of a connection that did not last: backed off.
        assert!(Retry::Refresh.delay(&b, &mut failures, false) >= b.ceiling(1) / 2);
        // A healthy connection resets the count.
        assert_eq!(
            Retry::Refresh.delay(&b, &mut failures, true),
            Duration::ZERO
        );
        // too_many_websockets and drops always wait, even the first time.
        let mut failures = 0;
        assert!(Retry::Backoff.delay(&b, &mut failures, true) >= b.first / 2);
        // A 429's Retry-After is the least wait; a refused token waits the longest step.
        let mut failures = 0;
        let d = Retry::NotBefore(Duration::from_secs(7)).delay(&b, &mut failures, false);
        assert!(d >= Duration::from_secs(7), "{d:?}");
        let d = Retry::Slowest.delay(&b, &mut 0, false);
        assert!(d >= b.max / 2 && d <= b.max, "{d:?}");
    }

    #[test]
    fn the_status_says_disabled_refused_connected_or_connecting() {
        let status = SocketStatus::default();
        assert_eq!(status.state(), SocketState::Connecting);
        status.0.refused.store(true, Ordering::SeqCst);
        assert_eq!(status.state().label(), "refused");
        status.0.connected.store(true, Ordering::SeqCst);
        assert_eq!(status.state().label(), "ok");
        status.0.disabled.store(true, Ordering::SeqCst);
        assert_eq!(status.state().label(), "disabled");
    }

    /// One connection served by [`serve_link`] over an in-memory pipe: Slack's end of the
    /// socket, what the link tells the client, the envelopes its handler holds (each with the
    /// sender of its answer), the retire token and the link's task.
    struct Link {
        slack: WebSocketStream<tokio::io::DuplexStream>,
        events: mpsc::UnboundedReceiver<LinkEvent>,
        held: mpsc::UnboundedReceiver<(String, tokio::sync::oneshot::Sender<Answer>)>,
        retire: CancellationToken,
        task: tokio::task::JoinHandle<()>,
    }

    /// Serves a link whose handler holds each envelope until the test answers it, with `permits`
    /// envelopes in flight at most.
    async fn link(permits: usize) -> Link {
        use tokio_tungstenite::tungstenite::protocol::Role;
        let (ours, theirs) = tokio::io::duplex(64 * 1024);
        let (held_tx, held) = mpsc::unbounded_channel();
        let handler: Handler = Arc::new(move |envelope: Envelope| {
            let (tx, rx) = tokio::sync::oneshot::channel();
            let _ = held_tx.send((envelope.envelope_id, tx));
            Box::pin(async move { rx.await.unwrap_or(Answer::bare(Outcome::Refused)) })
        });
        let shared = Arc::new(Shared {
            handler,
            permits: Arc::new(Semaphore::new(permits)),
            status: SocketStatus::default(),
            stop: CancellationToken::new(),
        });
        let (events_tx, events) = mpsc::unbounded_channel();
        let retire = CancellationToken::new();
        let socket =
            WebSocketStream::from_raw_socket(ours, Role::Client, Some(socket_config())).await;
        let task = tokio::spawn(serve_link(socket, 1, shared, events_tx, retire.clone()));
        let slack = WebSocketStream::from_raw_socket(theirs, Role::Server, None).await;
        Link {
            slack,
            events,
            held,
            retire,
            task,
        }
    }

    fn envelope_text(id: &str) -> Message {
        Message::text(
            json!({"envelope_id": id, "type": "slash_commands", "payload": {"text": "help"},
                   "accepts_response_payload": true})
            .to_string(),
        )
    }

    /// The next text or close frame Slack's end reads (pings and pongs skipped).
    async fn next_frame(slack: &mut WebSocketStream<tokio::io::DuplexStream>) -> Option<Message> {
        let read = async {
            while let Some(frame) = slack.next().await {
                match frame {
                    Ok(m @ (Message::Text(_) | Message::Close(_))) => return Some(m),
                    Ok(_) => {}
                    Err(_) => return None,
                }
            }
            None
        };
        tokio::time::timeout(Duration::from_secs(10), read)
            .await
            .expect("a frame within 10 s")
    }

    /// The next frame Slack's end reads, which must be an ack: its JSON.
    async fn next_ack(slack: &mut WebSocketStream<tokio::io::DuplexStream>) -> Value {
        match next_frame(slack).await {
            Some(Message::Text(text)) => serde_json::from_str(text.as_str()).unwrap(),
            other => panic!("expected an ack, got {other:?}"),
        }
    }

    fn replied(text: &str) -> Answer {
        Answer {
            payload: Some(raw(json!({"text": text}))),
            outcome: Outcome::Handled,
        }
    }

    #[tokio::test]
    async fn a_retired_link_writes_the_ack_it_owes_and_then_closes() {
        let mut link = link(4).await;
        link.slack.send(envelope_text("e1")).await.unwrap();
        let (id, answer) = link.held.recv().await.unwrap();
        assert_eq!(id, "e1");
        // Retired while e1 is still being handled: the link stops reading and waits for it.
        link.retire.cancel();
        answer.send(replied("hi")).unwrap();
        assert_eq!(
            next_ack(&mut link.slack).await,
            json!({"envelope_id": "e1", "payload": {"text": "hi"}})
        );
        assert!(
            matches!(next_frame(&mut link.slack).await, Some(Message::Close(_))),
            "then a close frame"
        );
        drop(link.slack);
        link.task.await.unwrap();
        assert!(
            link.events.try_recv().is_err(),
            "a retired link is not reported as dropped"
        );
    }

    #[tokio::test]
    async fn a_message_over_the_limit_drops_the_link_before_it_is_handled() {
        let mut link = link(4).await;
        link.slack.send(envelope_text("small")).await.unwrap();
        let (id, answer) = link.held.recv().await.unwrap();
        assert_eq!(id, "small");
        answer.send(replied("hi")).unwrap();
        assert_eq!(next_ack(&mut link.slack).await["envelope_id"], "small");
        // One byte over: the frame is refused as it is read, so no handler sees it.
        let huge = format!(
            r#"{{"envelope_id": "huge", "type": "slash_commands", "payload": {{"text": "{}"}}}}"#,
            "x".repeat(MESSAGE_MAX_BYTES)
        );
        assert!(huge.len() > MESSAGE_MAX_BYTES);
        // The link may close before Slack's end has written the whole frame.
        let _ = link.slack.send(Message::text(huge)).await;
        link.task.await.unwrap();
        assert!(matches!(
            link.events.try_recv(),
            Ok(LinkEvent::Dropped { link: 1 })
        ));
        assert!(link.held.try_recv().is_err(), "no handler saw it");
    }

    #[tokio::test]
    async fn a_dropped_link_says_so_and_writes_nothing_more() {
        let mut link = link(4).await;
        link.slack.send(envelope_text("e1")).await.unwrap();
        let (_, answer) = link.held.recv().await.unwrap();
        drop(link.slack);
        match tokio::time::timeout(Duration::from_secs(10), link.events.recv()).await {
            Ok(Some(LinkEvent::Dropped { link: 1 })) => {}
            other => panic!("expected the drop to be reported, got {other:?}"),
        }
        // The handler's late answer has no socket to go to; the link has ended.
        let _ = answer.send(replied("late"));
        link.task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_socket_that_never_says_hello_is_dropped() {
        let start = Instant::now();
        let mut link = link(4).await;
        match link.events.recv().await {
            Some(LinkEvent::Dropped { link: 1 }) => {}
            other => panic!("expected a drop, got {other:?}"),
        }
        // On the paused clock: at the hello deadline, not at the first ping's silence check.
        assert_eq!(start.elapsed(), HELLO_WITHIN);
        link.task.await.unwrap();
        drop(link.slack);
    }

    #[tokio::test(start_paused = true)]
    async fn a_socket_that_said_hello_is_kept_past_the_hello_deadline() {
        let mut link = link(4).await;
        link.slack
            .send(Message::text(r#"{"type":"hello"}"#))
            .await
            .unwrap();
        assert!(matches!(
            link.events.recv().await,
            Some(LinkEvent::Hello { link: 1 })
        ));
        tokio::time::sleep(HELLO_WITHIN * 2).await;
        assert!(link.events.try_recv().is_err(), "still served");
        assert!(!link.task.is_finished());
        link.retire.cancel();
        link.task.await.unwrap();
    }

    #[tokio::test]
    async fn an_envelope_past_the_cap_is_left_unacked_and_the_link_keeps_serving() {
        let mut link = link(1).await;
        link.slack.send(envelope_text("e1")).await.unwrap();
        let (first, answer) = link.held.recv().await.unwrap();
        assert_eq!(first, "e1");
        // e1 holds the only permit: e2 is shed, not waited for, so e1's ack is written while
        // the link reads on.
        link.slack.send(envelope_text("e2")).await.unwrap();
        answer.send(replied("one")).unwrap();
        assert_eq!(next_ack(&mut link.slack).await["envelope_id"], "e1");
        link.slack.send(envelope_text("e3")).await.unwrap();
        let (next, answer) = link.held.recv().await.unwrap();
        assert_eq!(next, "e3", "e2 was never handed to the handler");
        answer.send(replied("three")).unwrap();
        assert_eq!(next_ack(&mut link.slack).await["envelope_id"], "e3");
        link.retire.cancel();
        link.task.await.unwrap();
    }

    /// A one-route Slack answering `apps.connections.open` with `status`, `headers` and `body`.
    async fn slack_answering(
        status: u16,
        headers: &'static [(&'static str, &'static str)],
        body: &'static str,
    ) -> String {
        use axum::http::StatusCode;
        let app = axum::Router::new().route(
            "/api/apps.connections.open",
            axum::routing::post(move || async move {
                let mut resp = axum::response::IntoResponse::into_response((
                    StatusCode::from_u16(status).unwrap(),
                    body,
                ));
                for (name, value) in headers {
                    resp.headers_mut()
                        .insert(*name, axum::http::HeaderValue::from_static(value));
                }
                resp
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/api", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        url
    }

    async fn open_against(
        status: u16,
        headers: &'static [(&'static str, &'static str)],
        body: &'static str,
    ) -> Result<String, OpenError> {
        let settings = SocketSettings {
            app_token: SecretString::from("xapp-1-SECRET-TOKEN".to_owned()),
        };
        let api = slack_answering(status, headers, body).await;
        SocketClient::new(&settings, &api).unwrap().open().await
    }

    #[tokio::test]
    async fn slacks_answers_to_open_are_told_apart() {
        for code in ["team_disabled", "user_removed_from_team", "token_revoked"] {
            let body: &'static str =
                Box::leak(format!(r#"{{"ok":false,"error":"{code}"}}"#).into_boxed_str());
            match open_against(200, &[], body).await {
                Err(OpenError::Refused { code: got }) => assert_eq!(got, code),
                other => panic!("{code}: {other:?}"),
            }
        }
        let limited = open_against(429, &[("retry-after", "7")], "{}").await;
        match limited {
            Err(OpenError::RateLimited { retry_after }) => {
                assert_eq!(retry_after, Some(Duration::from_secs(7)));
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            open_against(503, &[], "{}").await,
            Err(OpenError::Unavailable(_))
        ));
        let ok = open_against(
            200,
            &[],
            r#"{"ok":true,"url":"wss://example/link?ticket=t"}"#,
        );
        assert_eq!(ok.await.unwrap(), "wss://example/link?ticket=t");
    }

    /// Slack's socket URL is `wss://`: the client must speak TLS, not fail for want of it. A
    /// listener that takes the connection sees a TLS ClientHello (a handshake record, 0x16).
    #[tokio::test]
    async fn a_wss_url_is_connected_over_tls() {
        use tokio::io::AsyncReadExt;
        use tokio_tungstenite::tungstenite::Error;
        use tokio_tungstenite::tungstenite::error::UrlError;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let first_byte = tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut byte = [0u8; 1];
            conn.read_exact(&mut byte).await.map(|_| byte[0]).ok()
            // Dropping the connection ends the client's handshake with an error.
        });
        let url = format!("wss://127.0.0.1:{port}/link/?ticket=t");
        let err = connect_socket(&url).await.unwrap_err();
        assert!(
            !matches!(err, Error::Url(UrlError::TlsFeatureNotEnabled)),
            "TLS support is not compiled in: {err}"
        );
        assert!(matches!(err, Error::Io(_) | Error::Tls(_)), "{err:?}");
        assert_eq!(first_byte.await.unwrap(), Some(0x16), "a TLS ClientHello");
        // The listener is gone: an I/O error, as for any unreachable host.
        let closed = connect_socket(&url).await.unwrap_err();
        assert!(matches!(closed, Error::Io(_)), "{closed:?}");
    }
}
