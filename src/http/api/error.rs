//! `ApiFailure`: how the agent API (`/api/v1`, `/mcp`) says no.
//!
//! Every refusal is `{"error":{"code","message","field"?}}` with a one-sentence message the agent's
//! operator can act on. axum's own rejections (JSON, query, path, body limit) are mapped here, so
//! no handler ever answers with axum's plain-text errors, and [`JsonErrorsLayer`] rewrites what
//! the router itself answers under `/api/v1` without a body (405, the request timeout's 408) into
//! the same JSON. Nothing here may echo a token or a database's own error text: a failure the
//! caller cannot act on is logged in full and answered with a sentence ([`ApiFailure::failed`]).
//! Refusals that cost a caller nothing to repeat (a missing or unknown token) are logged through
//! a [`WarnGate`], so a flood of them is a line every 10 s, not a line each.
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Json;
use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::telemetry::WarnGate;

/// Unauthenticated refusals (401) are logged at `warn` at most once every 10 s, the rest at
/// `debug`: anybody can send them, as fast as they like.
static UNAUTHENTICATED: WarnGate = WarnGate::new(Duration::from_secs(10));

/// A refused or failed API request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiFailure {
    pub status: StatusCode,
    /// Stable, machine-readable: `unauthorized`, `forbidden`, `not_found`, `method_not_allowed`,
    /// `conflict`, `too_large`, `invalid`, `rate_limited`, `unavailable`, `upstream`, `timeout`,
    /// `internal`.
    pub code: &'static str,
    /// One sentence.
    pub message: String,
    /// The request field to fix (422 and 413).
    pub field: Option<String>,
    /// Seconds to wait before asking again (429, and a 503 for want of body budget).
    pub retry_after: Option<Duration>,
}

impl ApiFailure {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: end_sentence(message.into()),
            field: None,
            retry_after: None,
        }
    }

    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
    }

    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "forbidden", message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    /// 409: the request clashes with what is there already (nothing was done).
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "conflict", message)
    }

    /// This answer with `Retry-After` (whole seconds, at least 1).
    pub fn retry_after(self, wait: Duration) -> Self {
        Self {
            retry_after: Some(Duration::from_secs(wait.as_secs().max(1))),
            ..self
        }
    }

    /// 422 naming `field`.
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: Some(field.into()),
            ..Self::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid", message)
        }
    }

    /// 413, naming `field` when one part of the request is over its limit.
    pub fn too_large(field: Option<String>, message: impl Into<String>) -> Self {
        Self {
            field,
            ..Self::new(StatusCode::PAYLOAD_TOO_LARGE, "too_large", message)
        }
    }

    pub fn rate_limited(retry_after: Duration) -> Self {
        let secs = retry_after.as_secs().max(1);
        Self {
            retry_after: Some(Duration::from_secs(secs)),
            ..Self::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limited",
                format!("This token has used its request budget; try again in {secs} s"),
            )
        }
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message)
    }

    /// Redis is unreachable (or its answer was lost): true of reads and writes alike, since a
    /// write that cannot reach Redis starts nothing.
    pub fn store_unavailable() -> Self {
        Self::unavailable(
            "Steward can't reach its database (Redis); nothing was started or changed. Try again in a minute",
        )
    }

    /// E2B (or another service Steward relies on) failed; the message says how.
    pub fn upstream(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_GATEWAY, "upstream", message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
    }

    /// A 500 for a failure the caller cannot act on (the database refused a command, stored data
    /// did not decode): `detail` (which may quote the database) goes to the log only, and the
    /// answer says `what` failed in a sentence.
    pub fn failed(what: &str, detail: &dyn std::fmt::Display) -> Self {
        tracing::error!(%detail, "API request failed: {what}");
        Self::internal(format!(
            "{what} failed inside Steward; the reason is in Steward's log. Try again, and tell Steward's operator if it keeps failing"
        ))
    }

    /// The JSON body, as the API sends it.
    pub fn body(&self) -> serde_json::Value {
        let mut error = json!({ "code": self.code, "message": self.message });
        if let Some(field) = &self.field {
            error["field"] = json!(field);
        }
        json!({ "error": error })
    }
}

impl std::fmt::Display for ApiFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl IntoResponse for ApiFailure {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            tracing::error!(code = self.code, message = %self.message, "API request failed");
        } else if self.status == StatusCode::UNAUTHORIZED {
            if let Some(quiet) = UNAUTHENTICATED.warn_now() {
                tracing::warn!(
                    code = self.code,
                    message = %self.message,
                    refused_quietly_before = quiet,
                    "API request refused: no valid token (further ones within 10 s are logged at debug)"
                );
            } else {
                tracing::debug!(code = self.code, "API request refused: no valid token");
            }
        } else if self.status == StatusCode::TOO_MANY_REQUESTS {
            // `authenticate` has logged it, through its own gate.
            tracing::debug!(code = self.code, "API request refused");
        } else {
            tracing::info!(
                status = self.status.as_u16(),
                code = self.code,
                "API request refused"
            );
        }
        let mut response = (self.status, Json(self.body())).into_response();
        let headers = response.headers_mut();
        if self.status == StatusCode::UNAUTHORIZED {
            headers.insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"steward\""),
            );
        }
        if let Some(wait) = self.retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(wait.as_secs()));
        }
        response
    }
}

impl From<JsonRejection> for ApiFailure {
    fn from(rejection: JsonRejection) -> Self {
        match rejection {
            JsonRejection::JsonDataError(e) => {
                let (field, problem) = split_serde_path(&e.body_text());
                Self::invalid(field, format!("The request body does not fit: {problem}"))
            }
            JsonRejection::JsonSyntaxError(e) => {
                let (_, problem) = split_serde_path(&e.body_text());
                Self::invalid(
                    "body",
                    format!("The request body is not valid JSON: {problem}"),
                )
            }
            JsonRejection::MissingJsonContentType(_) => Self::invalid(
                "content-type",
                "Send the body as JSON with `Content-Type: application/json`",
            ),
            JsonRejection::BytesRejection(ref e) if body_timed_out(e) => {
                body_failure(StatusCode::REQUEST_TIMEOUT, "")
            }
            JsonRejection::BytesRejection(e) => body_failure(e.status(), &e.body_text()),
            other => body_failure(other.status(), &other.body_text()),
        }
    }
}

/// Whether the body read failed because the edge's body deadline (`STEWARD_BODY_TIMEOUT`) passed.
fn body_timed_out(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(error);
    while let Some(e) = cause {
        if e.is::<tower_http::timeout::TimeoutError>() {
            return true;
        }
        cause = e.source();
    }
    false
}

/// A body that could not be read: too large (413), too slow (408), or cut off (400).
fn body_failure(status: StatusCode, text: &str) -> ApiFailure {
    match status {
        StatusCode::PAYLOAD_TOO_LARGE => ApiFailure::too_large(
            None,
            format!(
                "The request body is larger than {} MiB, the most Steward accepts",
                MAX_BODY_BYTES / (1024 * 1024)
            ),
        ),
        StatusCode::REQUEST_TIMEOUT => ApiFailure::new(
            StatusCode::REQUEST_TIMEOUT,
            "timeout",
            "The request body did not arrive in time",
        ),
        _ => ApiFailure::new(
            StatusCode::BAD_REQUEST,
            "invalid",
            format!("The request body could not be read: {text}"),
        ),
    }
}

impl From<QueryRejection> for ApiFailure {
    fn from(rejection: QueryRejection) -> Self {
        let (field, problem) = split_serde_path(&rejection.body_text());
        let field = if field == "body" {
            "query".into()
        } else {
            field
        };
        Self::invalid(field, format!("The query string does not fit: {problem}"))
    }
}

impl From<PathRejection> for ApiFailure {
    fn from(rejection: PathRejection) -> Self {
        Self::invalid(
            "path",
            format!("The path does not fit: {}", rejection.body_text()),
        )
    }
}

/// Rewrites an error the router answered under `/api/v1` without the API's JSON (a 405, the
/// request timeout's 408, anything else a layer made) into the documented
/// `{"error":{"code","message"}}`, keeping its status and headers such as `Allow`. Every other
/// path passes through untouched; the check is one prefix test, so the Slack routes pay nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct JsonErrorsLayer;

impl<S> tower::Layer<S> for JsonErrorsLayer {
    type Service = JsonErrors<S>;

    fn layer(&self, inner: S) -> JsonErrors<S> {
        JsonErrors { inner }
    }
}

/// See [`JsonErrorsLayer`].
#[derive(Debug, Clone)]
pub struct JsonErrors<S> {
    inner: S,
}

/// The path prefix of the agent API.
const API_PREFIX: &str = "/api/v1";

impl<S, B> tower::Service<axum::http::Request<B>> for JsonErrors<S>
where
    S: tower::Service<axum::http::Request<B>, Response = Response>,
{
    type Response = Response;
    type Error = S::Error;
    type Future = JsonErrorsFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: axum::http::Request<B>) -> Self::Future {
        let path = request.uri().path();
        let api =
            (path == API_PREFIX || path.starts_with("/api/v1/")).then(|| request.method().clone());
        JsonErrorsFuture {
            inner: self.inner.call(request),
            api,
        }
    }
}

pin_project_lite::pin_project! {
    /// The inner answer, rewritten by [`as_api_error`] for an `/api/v1` request.
    pub struct JsonErrorsFuture<F> {
        #[pin]
        inner: F,
        api: Option<Method>,
    }
}

impl<F, E> Future for JsonErrorsFuture<F>
where
    F: Future<Output = Result<Response, E>>,
{
    type Output = Result<Response, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let response = std::task::ready!(this.inner.poll(cx))?;
        Poll::Ready(Ok(match this.api.take() {
            Some(method) => as_api_error(response, &method),
            None => response,
        }))
    }
}

/// `response` as the API's JSON error when it is an error without a JSON body.
fn as_api_error(response: Response, method: &Method) -> Response {
    let status = response.status();
    let json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if json || !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    let failure = match status {
        StatusCode::METHOD_NOT_ALLOWED => {
            let allowed = response
                .headers()
                .get(header::ALLOW)
                .and_then(|v| v.to_str().ok())
                .filter(|v| !v.is_empty())
                .map(|v| format!("; it answers {v}"))
                .unwrap_or_default();
            ApiFailure::new(
                status,
                "method_not_allowed",
                format!("This API route does not answer {method}{allowed}"),
            )
        }
        StatusCode::REQUEST_TIMEOUT => ApiFailure::new(
            status,
            "timeout",
            "Steward did not finish this request within STEWARD_REQUEST_TIMEOUT and stopped it; read the run or case back before asking again",
        ),
        StatusCode::PAYLOAD_TOO_LARGE => body_failure(status, ""),
        StatusCode::SERVICE_UNAVAILABLE => {
            ApiFailure::unavailable("Steward cannot take this request now; try again in a minute")
        }
        other if other.is_server_error() => {
            ApiFailure::internal("Steward failed this request; the reason is in Steward's log")
        }
        other => ApiFailure::new(
            other,
            "invalid",
            format!(
                "Steward refused this request ({} {})",
                other.as_u16(),
                other.canonical_reason().unwrap_or("refused")
            ),
        ),
    };
    let (mut parts, _) = response.into_parts();
    let (rewritten, body) = failure.into_response().into_parts();
    // Keep what the original answer said beyond its body (`Allow`, `Retry-After`, ...).
    parts.headers.remove(header::CONTENT_LENGTH);
    for (name, value) in rewritten.headers {
        if let Some(name) = name {
            parts.headers.insert(name, value);
        }
    }
    Response::from_parts(parts, body)
}

/// `text` ending with exactly one full stop (or `?`/`!`).
fn end_sentence(text: String) -> String {
    let text = text.trim_end();
    if text.ends_with(['.', '?', '!']) {
        text.to_owned()
    } else {
        format!("{text}.")
    }
}

/// The largest request body the API reads (files travel base64 in the run request).
pub const MAX_BODY_BYTES: usize = 16 * 1024 * 1024;

/// Splits axum's "Failed to deserialize ...: files[0].path: missing field `x` at line 1 column 9"
/// into the field to fix and the problem. A problem at the top level names the field serde
/// mentions (`missing field `template``), else `body`.
fn split_serde_path(text: &str) -> (String, String) {
    let rest = text.split_once(": ").map(|(_, r)| r).unwrap_or(text).trim();
    let (path, problem) = match rest.split_once(": ") {
        Some((path, problem)) if !path.contains(' ') && path != "." => {
            (Some(path.to_owned()), problem.to_owned())
        }
        Some((".", problem)) => (None, problem.to_owned()),
        _ => (None, rest.to_owned()),
    };
    let field = path
        .or_else(|| quoted_field(&problem))
        .unwrap_or_else(|| "body".into());
    (field, problem)
}

/// The field in serde's "missing field `x`" or "unknown field `x`, expected ...".
fn quoted_field(problem: &str) -> Option<String> {
    let start = problem.find(" field `")? + " field `".len();
    let end = problem[start..].find('`')?;
    Some(problem[start..start + end].to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serde_paths_name_the_field_to_fix() {
        assert_eq!(
            split_serde_path(
                "Failed to deserialize the JSON body into the target type: files[0].path: invalid type: integer `3`, expected a string at line 1 column 40"
            ),
            (
                "files[0].path".into(),
                "invalid type: integer `3`, expected a string at line 1 column 40".into()
            )
        );
        assert_eq!(
            split_serde_path(
                "Failed to deserialize the JSON body into the target type: missing field `command` at line 1 column 20"
            )
            .0,
            "command"
        );
        assert_eq!(
            split_serde_path("Failed to parse the request body as JSON: EOF while parsing an object at line 1 column 9").0,
            "body"
        );
    }

    #[test]
    fn a_refusal_is_one_json_error_with_a_sentence() {
        let failure = ApiFailure::invalid("timeout", "is 2h; the limit is 1h");
        assert_eq!(
            failure.body(),
            json!({"error": {"code": "invalid", "message": "is 2h; the limit is 1h.", "field": "timeout"}})
        );
    }
}
