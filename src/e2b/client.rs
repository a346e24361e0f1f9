//! `E2bClient` itself: its settings, and the one path every call takes (build, send, retry, map
//! errors, decode, follow pages).
//!
//! The actions live beside it as `impl E2bClient` blocks grouped by what they serve:
//! `sandboxes.rs`, `snapshots.rs` (with templates) and `metrics.rs`. Each builds the exact path,
//! query and body the OpenAPI spec asks for, sends it through [`E2bClient::send`] (which owns
//! retries, see `retry.rs`) and decodes the answer into `model.rs` types. Lists follow
//! `X-Next-Token` under a [`PageGuard`], so they always end.
//!
//! This module must not decide policy (who may kill what) and must never log, print or return the
//! API key: it lives in a `SecretString` and in a header marked sensitive.
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderValue};
use reqwest::{Method, StatusCode};
use secrecy::{ExposeSecret, SecretString};
use serde::de::DeserializeOwned;

use super::E2bSettings;
use super::error::{self, E2bError};
use super::metrics::DEFAULT_METRICS_CONCURRENCY;
use super::paging::{DEFAULT_MAX_PAGES, Listing, Page, PageGuard, PageStep};
use super::retry::{self, AttemptOutcome, Replay, RetryDecision, RetryPolicy};
use crate::ids::SandboxId;

/// Largest page E2B serves.
pub const MAX_PAGE_LIMIT: u32 = 100;
/// Largest E2B answer read; a bigger one (a broken proxy, a runaway listing) is refused with
/// [`E2bError::TooLarge`] rather than held in memory.
pub const MAX_RESPONSE_BYTES: usize = 32 * 1024 * 1024;
/// Most of an answer's announced length reserved before its bytes arrive; beyond it the body
/// grows as they come.
const PREALLOCATE_MAX_BYTES: u64 = 1024 * 1024;
/// Connection set-up gets its own, shorter timeout so a dead host fails fast.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The E2B control-plane client. Cheap to clone; clones share the connection pool and call count.
#[derive(Clone)]
pub struct E2bClient {
    http: reqwest::Client,
    base_url: String,
    api_key: SecretString,
    team_id: Option<String>,
    retry: RetryPolicy,
    pub(super) metrics_concurrency: usize,
    pub(super) max_pages: u32,
    max_response_bytes: usize,
    calls: Arc<AtomicU64>,
    /// What this E2B has for create and connect ([`ROUTES_UNKNOWN`], [`ROUTES_V2`] or
    /// [`ROUTES_V1_ONLY`]), learned from its first answers and shared by clones.
    routes: Arc<AtomicU8>,
}

/// Not known yet: the next create or connect tries v2 and learns from the answer.
const ROUTES_UNKNOWN: u8 = 0;
/// The v2 routes answered: a 404 from them is about the sandbox or template, not the route.
const ROUTES_V2: u8 = 1;
/// An older E2B without the v2 routes: create and connect go to v1 directly.
const ROUTES_V1_ONLY: u8 = 2;

/// Written by hand so the key can never appear, whatever fields are added later.
impl fmt::Debug for E2bClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("E2bClient")
            .field("base_url", &self.base_url)
            .field("api_key", &"[redacted]")
            .field("team_id", &self.team_id)
            .field("retry", &self.retry)
            .field("metrics_concurrency", &self.metrics_concurrency)
            .field("max_pages", &self.max_pages)
            .finish()
    }
}

/// The operations, named as the simulator counts them; each knows how safe a replay is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Op {
    Create,
    List,
    Get,
    Kill,
    Pause,
    Resume,
    Connect,
    Timeout,
    Refresh,
    Logs,
    Metrics,
    MetricsMany,
    TeamMetrics,
    TeamMetricsMax,
    Snapshot,
    Snapshots,
    Templates,
    Template,
    DeleteTemplate,
    Events,
    /// `GET /events/webhooks`.
    Webhooks,
    /// `POST /events/webhooks`.
    RegisterWebhook,
    /// `DELETE /events/webhooks/{id}`.
    DeleteWebhook,
}

impl Op {
    pub(super) fn name(self) -> &'static str {
        match self {
            Op::Create => "create",
            Op::List => "list",
            Op::Get => "get",
            Op::Kill => "kill",
            Op::Pause => "pause",
            Op::Resume => "resume",
            Op::Connect => "connect",
            Op::Timeout => "timeout",
            Op::Refresh => "refresh",
            Op::Logs => "logs",
            Op::Metrics => "metrics",
            Op::MetricsMany => "metrics-many",
            Op::TeamMetrics => "team-metrics",
            Op::TeamMetricsMax => "team-metrics-max",
            Op::Snapshot => "snapshot",
            Op::Snapshots => "snapshots",
            Op::Templates => "templates",
            Op::Template => "template",
            Op::DeleteTemplate => "delete-template",
            Op::Events => "events",
            Op::Webhooks | Op::RegisterWebhook | Op::DeleteWebhook => "webhooks",
        }
    }

    fn method(self) -> Method {
        match self {
            Op::Kill | Op::DeleteTemplate | Op::DeleteWebhook => Method::DELETE,
            Op::Create
            | Op::Pause
            | Op::Resume
            | Op::Connect
            | Op::Timeout
            | Op::Refresh
            | Op::Snapshot
            | Op::RegisterWebhook => Method::POST,
            _ => Method::GET,
        }
    }

    fn replay(self) -> Replay {
        match self {
            Op::Create | Op::Resume | Op::Connect | Op::Snapshot => Replay::OnlyUnavailable,
            Op::Pause | Op::Timeout | Op::Refresh | Op::RegisterWebhook => Replay::Never,
            _ => Replay::Idempotent,
        }
    }
}

/// Percent-encodes everything but RFC 3986 unreserved characters, like `encodeURIComponent`
/// (so `/` and `:` in snapshot ids become `%2F` and `%3A`).
pub(super) fn encode_component(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for byte in value.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// The `metadata` filter value before query encoding, exactly as the official Python SDK builds
/// it: `urlencode({quote(k): quote(v)})`, so each key and value is encoded twice (`quote`
/// keeps `/`, which `urlencode` then encodes once). Query encoding adds a third level. E2B's
/// API decodes the query, then the whole value, splits at `&` and `=`, and decodes each part:
/// `{"owner": "zoë"}` becomes `metadata=owner%3Dzo%2525C3%2525AB` on the wire.
pub(super) fn metadata_filter(pairs: &[(String, String)]) -> String {
    pairs
        .iter()
        .map(|(k, v)| format!("{}={}", sdk_quote_twice(k), sdk_quote_twice(v)))
        .collect::<Vec<_>>()
        .join("&")
}

/// Python's `quote_plus(quote(text), safe="")`: unreserved bytes stay, `/` becomes `%2F`,
/// every other byte `%25XX`.
fn sdk_quote_twice(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 3);
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(byte as char);
        } else if byte == b'/' {
            out.push_str("%2F");
        } else {
            out.push_str(&format!("%25{byte:02X}"));
        }
    }
    out
}

/// A query string built in order, with full control over encoding.
#[derive(Debug, Default)]
pub(super) struct Query(Vec<String>);

impl Query {
    pub(super) fn push(&mut self, key: &str, value: impl AsRef<str>) -> &mut Self {
        self.0.push(format!(
            "{}={}",
            encode_component(key),
            encode_component(value.as_ref())
        ));
        self
    }

    pub(super) fn push_opt(&mut self, key: &str, value: Option<impl AsRef<str>>) -> &mut Self {
        if let Some(v) = value {
            self.push(key, v);
        }
        self
    }

    /// An array in OpenAPI "form, explode false" style: elements encoded, commas literal.
    pub(super) fn push_list<S: AsRef<str>>(&mut self, key: &str, values: &[S]) -> &mut Self {
        let joined: Vec<String> = values
            .iter()
            .map(|v| encode_component(v.as_ref()))
            .collect();
        self.0
            .push(format!("{}={}", encode_component(key), joined.join(",")));
        self
    }

    fn suffix(&self) -> String {
        if self.0.is_empty() {
            String::new()
        } else {
            format!("?{}", self.0.join("&"))
        }
    }
}

/// One request to send, possibly several times.
pub(super) struct Call {
    op: Op,
    path: String,
    pub(super) query: Query,
    body: Option<Bytes>,
}

impl Call {
    pub(super) fn new(op: Op, path: String) -> Self {
        Self {
            op,
            path,
            query: Query::default(),
            body: None,
        }
    }

    pub(super) fn json(mut self, body: serde_json::Value) -> Self {
        self.body = Some(Bytes::from(body.to_string()));
        self
    }
}

/// A successful answer.
pub(super) struct Reply {
    pub(super) status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl Reply {
    pub(super) fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// Whole seconds for a JSON `int32` timeout; sub-second parts are dropped.
pub(super) fn secs_i32(d: Duration) -> u64 {
    d.as_secs().min(i32::MAX as u64)
}

pub(super) fn unix_secs(name: &str, t: DateTime<Utc>) -> Result<String, E2bError> {
    let secs = t.timestamp();
    if secs < 0 {
        return Err(E2bError::BadRequest {
            message: format!("{name} must not be before 1970"),
        });
    }
    Ok(secs.to_string())
}

impl E2bClient {
    /// Builds a client from settings. Fails with `NotConfigured` when the API key is missing.
    pub fn new(settings: &E2bSettings) -> Result<Self, E2bError> {
        let api_key = settings
            .api_key
            .clone()
            .ok_or(E2bError::NotConfigured("E2B_API_KEY is not set"))?;
        let mut key_header = HeaderValue::from_str(api_key.expose_secret()).map_err(|_| {
            E2bError::NotConfigured("E2B_API_KEY has characters not allowed in an HTTP header")
        })?;
        // Sensitive headers are hidden from reqwest's and hyper's own debug output.
        key_header.set_sensitive(true);
        let mut headers = HeaderMap::new();
        headers.insert("X-API-Key", key_header);
        let base_url = settings.api_url.trim_end_matches('/').to_owned();
        if !(base_url.starts_with("http://") || base_url.starts_with("https://")) {
            return Err(E2bError::NotConfigured(
                "E2B_API_URL must start with http:// or https://",
            ));
        }
        let http = reqwest::Client::builder()
            .default_headers(headers)
            .user_agent(concat!("sandbox-steward/", env!("CARGO_PKG_VERSION")))
            .timeout(settings.request_timeout)
            .connect_timeout(CONNECT_TIMEOUT.min(settings.request_timeout))
            .build()
            .map_err(|e| E2bError::Transport(format!("could not build the HTTP client: {e}")))?;
        Ok(Self {
            http,
            base_url,
            api_key,
            team_id: settings.team_id.clone().filter(|t| !t.trim().is_empty()),
            retry: RetryPolicy::default(),
            metrics_concurrency: DEFAULT_METRICS_CONCURRENCY,
            max_pages: DEFAULT_MAX_PAGES,
            max_response_bytes: MAX_RESPONSE_BYTES,
            calls: Arc::new(AtomicU64::new(0)),
            routes: Arc::new(AtomicU8::new(ROUTES_UNKNOWN)),
        })
    }

    /// Replaces the retry policy (tests shorten the delays).
    pub fn with_retry_policy(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }

    /// How many metrics batches may be in flight at once (at least 1).
    pub fn with_metrics_concurrency(mut self, n: usize) -> Self {
        self.metrics_concurrency = n.max(1);
        self
    }

    /// The page cap used when a query does not set its own (at least 1).
    pub fn with_max_pages(mut self, pages: u32) -> Self {
        self.max_pages = pages.max(1);
        self
    }

    /// The largest answer read (tests make it small); at least 1 KiB.
    pub fn with_max_response_bytes(mut self, bytes: usize) -> Self {
        self.max_response_bytes = bytes.max(1024);
        self
    }

    /// The team id used for team metrics, if configured.
    pub fn team_id(&self) -> Option<&str> {
        self.team_id.as_deref()
    }

    /// The base URL calls go to.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// HTTP requests sent so far, retries included.
    pub fn calls_made(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    fn scrub(&self, text: &str) -> String {
        error::scrub(text, self.api_key.expose_secret())
    }

    /// Whether this client has learned that E2B lacks the v2 create and connect routes.
    pub fn uses_v1_routes(&self) -> bool {
        self.routes.load(Ordering::Relaxed) == ROUTES_V1_ONLY
    }

    /// Sends a create or connect by E2B's v2 route, or by v1 where E2B does not have v2.
    ///
    /// While it is not known which this E2B has, a 405 from v2, or a 404 from v2 with no more
    /// than "not found" to say (not E2B's "Template … not found" or "Sandbox … doesn't exist")
    /// that v1 then answers with anything but 404, means an older E2B without v2: remembered for
    /// this client and its clones (said once, at info). A 404 naming what is missing is final, and
    /// so is every 404 once v2 has answered.
    pub(super) async fn send_v2_or_v1(&self, v2: &Call, v1: &Call) -> Result<Reply, E2bError> {
        if self.uses_v1_routes() {
            return self.send(v1).await;
        }
        let known_v2 = self.routes.load(Ordering::Relaxed) == ROUTES_V2;
        let pass: &[u16] = if known_v2 { &[] } else { &[404, 405] };
        let reply = self.send_passing(v2, pass).await?;
        if reply.status.is_success() {
            self.routes.store(ROUTES_V2, Ordering::Relaxed);
            return Ok(reply);
        }
        let route_missing = reply.status == StatusCode::METHOD_NOT_ALLOWED;
        if !route_missing && !says_only_not_found(&reply.body) {
            return Err(error::from_response(
                reply.status,
                &reply.headers,
                &reply.body,
                self.api_key.expose_secret(),
            ));
        }
        let fallback = self.send(v1).await;
        let v1_has_it = match &fallback {
            Ok(_) => true,
            Err(e) => e.status().is_some_and(|s| s != 404),
        };
        if (route_missing || v1_has_it)
            && self
                .routes
                .compare_exchange(
                    ROUTES_UNKNOWN,
                    ROUTES_V1_ONLY,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
        {
            tracing::info!(
                base_url = %self.base_url,
                v2_status = reply.status.as_u16(),
                "this E2B has no v2 create and connect routes (an older self-hosted E2B?): using the v1 routes from now on"
            );
        }
        fallback
    }

    /// Sends `call`, retrying as its operation allows. Returns only 2xx answers.
    pub(super) async fn send(&self, call: &Call) -> Result<Reply, E2bError> {
        self.send_passing(call, &[]).await
    }

    /// As [`E2bClient::send`], but answers with a status in `pass` come back as they are,
    /// neither retried nor turned into errors.
    async fn send_passing(&self, call: &Call, pass: &[u16]) -> Result<Reply, E2bError> {
        let url = format!("{}{}{}", self.base_url, call.path, call.query.suffix());
        let method = call.op.method();
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            self.calls.fetch_add(1, Ordering::Relaxed);
            let mut request = self.http.request(method.clone(), &url);
            if let Some(body) = &call.body {
                request = request
                    .header(CONTENT_TYPE, "application/json")
                    .body(body.clone());
            }
            let limit = self.max_response_bytes;
            let started = std::time::Instant::now();
            let result = async {
                let mut response = request.send().await?;
                let status = response.status();
                let headers = response.headers().clone();
                // The cap holds while reading too: Content-Length may be absent or lie.
                let announced = response.content_length();
                if announced.is_some_and(|n| n > limit as u64) {
                    return Ok(None);
                }
                // Sized once from Content-Length rather than doubled chunk by chunk (a sweep holds
                // dozens of metric windows at once), but only up to PREALLOCATE_MAX_BYTES: the
                // length is the server's word, and an answer that announces the cap and sends
                // nothing must not reserve it.
                let mut body = Vec::with_capacity(
                    announced.map_or(0, |n| n.min(PREALLOCATE_MAX_BYTES) as usize),
                );
                while let Some(chunk) = response.chunk().await? {
                    if body.len() + chunk.len() > limit {
                        return Ok(None);
                    }
                    body.extend_from_slice(&chunk);
                }
                Ok::<_, reqwest::Error>(Some(Reply {
                    status,
                    headers,
                    body: Bytes::from(body),
                }))
            }
            .await;
            crate::metrics::e2b_request(call.op.name(), attempt_status(&result), started.elapsed());
            let (outcome, err) = match result {
                // Asking again would get the same answer (and a mutation was delivered): give up.
                Ok(None) => {
                    tracing::warn!(op = call.op.name(), limit, "E2B answer over the size cap");
                    return Err(E2bError::TooLarge { limit });
                }
                Ok(Some(reply))
                    if reply.status.is_success() || pass.contains(&reply.status.as_u16()) =>
                {
                    return Ok(reply);
                }
                Ok(Some(reply)) => {
                    let err = error::from_response(
                        reply.status,
                        &reply.headers,
                        &reply.body,
                        self.api_key.expose_secret(),
                    );
                    let retry_after = match &err {
                        E2bError::RateLimited { retry_after, .. } => *retry_after,
                        _ => None,
                    };
                    let outcome = AttemptOutcome::Status {
                        status: reply.status.as_u16(),
                        retry_after,
                    };
                    (outcome, err)
                }
                Err(e) => {
                    let outcome = if e.is_connect() {
                        AttemptOutcome::NotConnected
                    } else {
                        AttemptOutcome::Interrupted
                    };
                    (outcome, E2bError::Transport(self.describe(&e)))
                }
            };
            match retry::decide(&self.retry, call.op.replay(), outcome, attempt) {
                RetryDecision::RetryAfter(delay) => {
                    crate::metrics::e2b_retry(call.op.name(), retry_reason(outcome), delay);
                    tracing::warn!(
                        op = call.op.name(),
                        attempt,
                        delay_ms = delay.as_millis() as u64,
                        error = %err,
                        "E2B call failed; retrying"
                    );
                    tokio::time::sleep(delay).await;
                }
                RetryDecision::GiveUp => {
                    tracing::debug!(op = call.op.name(), attempt, error = %err, "E2B call failed");
                    return Err(err);
                }
            }
        }
    }

    /// A transport error with its causes ("connection refused"), the key scrubbed out.
    fn describe(&self, e: &reqwest::Error) -> String {
        let mut text = if e.is_timeout() {
            "the request timed out".to_owned()
        } else {
            e.to_string()
        };
        let mut source = std::error::Error::source(e);
        while let Some(cause) = source {
            text.push_str(": ");
            text.push_str(&cause.to_string());
            source = cause.source();
        }
        self.scrub(&text)
    }

    pub(super) fn decode<T: DeserializeOwned>(&self, op: Op, reply: &Reply) -> Result<T, E2bError> {
        serde_json::from_slice(&reply.body)
            .map_err(|e| E2bError::Decode(self.scrub(&format!("the {} answer: {e}", op.name()))))
    }

    /// The path of one sandbox, its id encoded as one segment, then `rest`.
    pub(super) fn sandbox_path(id: &SandboxId, rest: &str) -> String {
        format!("/sandboxes/{}{rest}", encode_component(id.as_str()))
    }
    /// Follows pages until the server stops, a token repeats, or `cap` pages were read.
    pub(super) async fn collect_pages<T, F, Fut>(
        &self,
        op: Op,
        cap: u32,
        mut fetch: F,
    ) -> Result<Listing<T>, E2bError>
    where
        F: FnMut(Option<String>) -> Fut,
        Fut: std::future::Future<Output = Result<Page<T>, E2bError>>,
    {
        let mut guard = PageGuard::new(cap);
        let mut items = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let page = fetch(token.take()).await?;
            items.extend(page.items);
            match guard.after_page(page.next_token.as_deref()) {
                PageStep::Next(next) => token = Some(next),
                PageStep::Done => {
                    return Ok(Listing {
                        items,
                        pages: guard.pages(),
                        stopped: None,
                    });
                }
                PageStep::Stop(reason) => {
                    tracing::warn!(op = op.name(), pages = guard.pages(), %reason, "stopped paging");
                    return Ok(Listing {
                        items,
                        pages: guard.pages(),
                        stopped: Some(reason),
                    });
                }
            }
        }
    }

    /// One page of a listing whose answer is a bare JSON array.
    pub(super) async fn fetch_page<T: DeserializeOwned>(
        &self,
        op: Op,
        call: Call,
    ) -> Result<Page<T>, E2bError> {
        let reply = self.send(&call).await?;
        Ok(Page {
            items: self.decode(op, &reply)?,
            next_token: reply.header("x-next-token").map(str::to_owned),
            total_running: None,
        })
    }
}

impl E2bClient {
    /// What E2B says now of the sandboxes on one page of `GET /v2/sandboxes` (under `q`, from
    /// `next_token`): the page, and the latest metrics sample of its running sandboxes from one
    /// `GET /sandboxes/metrics` (a page holds at most 100, the most that call takes). Up to 100
    /// sandboxes' state and load in two calls, for re-checking many sandboxes just before acting
    /// on them (a list's approved group); a failed metrics read fails the whole reading, so
    /// nothing is acted on with a guess.
    #[tracing::instrument(skip(self, q))]
    pub async fn read_sandboxes_page(
        &self,
        q: &super::model::ListQuery,
        next_token: Option<&str>,
    ) -> Result<
        (
            Page<super::model::ListedSandbox>,
            std::collections::HashMap<SandboxId, super::model::SandboxMetric>,
        ),
        E2bError,
    > {
        let page = self.list_sandboxes_page(q, next_token).await?;
        let running: Vec<SandboxId> = page
            .items
            .iter()
            .filter(|s| s.state == super::model::SandboxState::Running)
            .map(|s| s.sandbox_id.clone())
            .collect();
        let metrics = if running.is_empty() {
            std::collections::HashMap::new()
        } else {
            self.metrics_many(&running).await?
        };
        Ok((page, metrics))
    }
}

/// Whether a 404's body says no more than that the route is not there (a server's generic
/// "Not found", "404 page not found", a spec validator's "no matching operation was found"),
/// rather than naming the sandbox or template that is missing.
fn says_only_not_found(body: &[u8]) -> bool {
    #[derive(serde::Deserialize)]
    struct Message {
        #[serde(default)]
        message: Option<String>,
    }
    let text = match serde_json::from_slice::<Message>(body) {
        Ok(parsed) => parsed.message.unwrap_or_default(),
        Err(_) => String::from_utf8_lossy(body).into_owned(),
    };
    let text = text.trim().trim_end_matches('.').to_ascii_lowercase();
    matches!(
        text.as_str(),
        "" | "not found"
            | "404 page not found"
            | "404 not found"
            | "no matching operation was found"
    )
}

/// The `status` label of one attempt: its HTTP status, `too_large`, or `transport`.
fn attempt_status(result: &Result<Option<Reply>, reqwest::Error>) -> &'static str {
    match result {
        Ok(Some(reply)) => crate::metrics::e2b_status(Some(reply.status.as_u16()), false),
        Ok(None) => crate::metrics::e2b_status(None, true),
        Err(_) => crate::metrics::e2b_status(None, false),
    }
}

/// The `reason` label of a retry.
fn retry_reason(outcome: AttemptOutcome) -> &'static str {
    match outcome {
        AttemptOutcome::Status { status: 429, .. } => "rate_limited",
        AttemptOutcome::Status { .. } => "status",
        AttemptOutcome::NotConnected => "not_connected",
        AttemptOutcome::Interrupted => "interrupted",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_filters_encode_as_e2b_expects() {
        let pairs = vec![
            ("user".to_owned(), "abc".to_owned()),
            ("app".to_owned(), "prod".to_owned()),
        ];
        let mut q = Query::default();
        q.push("metadata", metadata_filter(&pairs));
        assert_eq!(q.suffix(), "?metadata=user%3Dabc%26app%3Dprod");
    }

    #[test]
    fn metadata_is_encoded_as_the_python_sdk_encodes_it() {
        // urllib.parse.urlencode({quote("a&b"): quote("x=y z/ë")}) in e2b 2.63's paginator.
        let pairs = vec![("a&b".to_owned(), "x=y z/ë".to_owned())];
        assert_eq!(
            metadata_filter(&pairs),
            "a%2526b=x%253Dy%2520z%2F%25C3%25AB"
        );
        let mut q = Query::default();
        q.push("metadata", metadata_filter(&pairs));
        assert_eq!(
            q.suffix(),
            "?metadata=a%252526b%3Dx%25253Dy%252520z%252F%2525C3%2525AB"
        );
        let two = vec![
            ("owner".to_owned(), "zoë".to_owned()),
            ("k".to_owned(), "a b&c=d".to_owned()),
        ];
        assert_eq!(
            metadata_filter(&two),
            "owner=zo%25C3%25AB&k=a%2520b%2526c%253Dd"
        );
    }

    #[test]
    fn array_parameters_join_with_literal_commas() {
        let mut q = Query::default();
        q.push_list("state", &["running", "paused"]);
        q.push_opt("order", None::<&str>);
        q.push_opt("template", Some("base"));
        assert_eq!(q.suffix(), "?state=running,paused&template=base");
    }

    #[test]
    fn snapshot_ids_are_encoded_as_one_path_segment() {
        assert_eq!(
            encode_component("team-slug/my-snap:default"),
            "team-slug%2Fmy-snap%3Adefault"
        );
        assert_eq!(encode_component("abc_1-2.3~"), "abc_1-2.3~");
    }

    #[test]
    fn operations_are_classified_for_replay() {
        assert_eq!(Op::Kill.replay(), Replay::Idempotent);
        assert_eq!(Op::DeleteTemplate.replay(), Replay::Idempotent);
        assert_eq!(Op::List.replay(), Replay::Idempotent);
        assert_eq!(Op::Create.replay(), Replay::OnlyUnavailable);
        assert_eq!(Op::Snapshot.replay(), Replay::OnlyUnavailable);
        assert_eq!(Op::Pause.replay(), Replay::Never);
        assert_eq!(Op::Refresh.replay(), Replay::Never);
        assert_eq!(Op::Timeout.replay(), Replay::Never);
    }

    #[test]
    fn a_client_needs_a_key_and_never_shows_it() {
        let mut settings = E2bSettings::for_url("http://127.0.0.1:1", "e2b_0123456789abcdef");
        let client = E2bClient::new(&settings).unwrap();
        let shown = format!("{client:?}");
        assert!(!shown.contains("0123456789abcdef"), "{shown}");
        settings.api_key = None;
        assert_eq!(
            E2bClient::new(&settings).unwrap_err(),
            E2bError::NotConfigured("E2B_API_KEY is not set")
        );
    }
}
