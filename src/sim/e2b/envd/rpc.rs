//! Connect's wire as envd's connect-go server speaks it, with the JSON codec the SDKs use.
//!
//! Unary calls take `application/json` and answer `200` with the message, or an error as Connect's
//! JSON error body (`{"code","message"}`) with the HTTP status the Connect protocol gives its code.
//! Server streams take one `application/connect+json` envelope and answer `200` with envelopes,
//! the last one flagged end-of-stream and holding `{}` or `{"error":{...}}`; an error before the
//! first message is such a stream too, as connect-go sends it. Another content type is `415`, as
//! connect-go answers a codec it does not serve. Requests are read as proto3 JSON readers read them
//! (camelCase or proto field names, unknown fields ignored, 32-bit numbers also as strings) and
//! answers are written as proto3 JSON writes them (zero values left out, 64-bit numbers as strings,
//! bytes as base64). This file writes frames independently of Steward's decoder, so the two check
//! each other.
use axum::Json;
use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
use serde_json::{Map, Value, json};

use super::super::exec::Selector;

pub(super) const CONNECT_JSON: &str = "application/connect+json";
const UNARY_JSON: &str = "application/json";
pub(super) const END_STREAM_FLAG: u8 = 0x02;

/// The Connect error codes envd answers with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Code {
    Unknown,
    InvalidArgument,
    NotFound,
    AlreadyExists,
    ResourceExhausted,
    FailedPrecondition,
    Unimplemented,
    Internal,
    Unavailable,
}

impl Code {
    pub(super) fn name(self) -> &'static str {
        match self {
            Code::Unknown => "unknown",
            Code::InvalidArgument => "invalid_argument",
            Code::NotFound => "not_found",
            Code::AlreadyExists => "already_exists",
            Code::ResourceExhausted => "resource_exhausted",
            Code::FailedPrecondition => "failed_precondition",
            Code::Unimplemented => "unimplemented",
            Code::Internal => "internal",
            Code::Unavailable => "unavailable",
        }
    }

    /// The HTTP status of a unary error with this code (the Connect protocol's table).
    fn status(self) -> StatusCode {
        match self {
            Code::InvalidArgument | Code::FailedPrecondition => StatusCode::BAD_REQUEST,
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::AlreadyExists => StatusCode::CONFLICT,
            Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
            Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Code::Unknown | Code::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

/// A Connect error, answered as a unary error body or put in a stream's end-of-stream frame.
#[derive(Debug)]
pub(super) struct RpcError {
    pub code: Code,
    pub message: String,
}

impl RpcError {
    pub(super) fn new(code: Code, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    fn body(&self) -> Value {
        json!({ "code": self.code.name(), "message": self.message })
    }

    /// This error as the end of a stream that sent nothing before it.
    pub(super) fn into_stream(self) -> Response {
        stream_response(Body::from(end_frame(Some(&self))))
    }
}

impl IntoResponse for RpcError {
    fn into_response(self) -> Response {
        (self.code.status(), Json(self.body())).into_response()
    }
}

/// A unary answer: the message as JSON.
pub(super) fn answer(message: Value) -> Response {
    Json(message).into_response()
}

fn media_type(headers: &HeaderMap) -> String {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase()
}

/// Why a request's message could not be read, answered as connect-go answers it.
#[derive(Debug)]
pub(super) enum Unreadable {
    /// A content type without a codec here: 415, naming the one served.
    Media { accepts: &'static str, got: String },
    /// A unary message that is not JSON: the unary error body.
    Unary(RpcError),
    /// A stream's envelope or message that cannot be read: an end-of-stream error.
    Stream(RpcError),
}

impl IntoResponse for Unreadable {
    fn into_response(self) -> Response {
        match self {
            Unreadable::Media { accepts, got } => {
                let mut response = (
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    format!("this envd serves {accepts} with the JSON codec, not {got:?}"),
                )
                    .into_response();
                response
                    .headers_mut()
                    .insert("accept-post", HeaderValue::from_static(accepts));
                response
            }
            Unreadable::Unary(error) => error.into_response(),
            Unreadable::Stream(error) => error.into_stream(),
        }
    }
}

/// The request message of a unary call, as a JSON object.
pub(super) fn unary_request(
    headers: &HeaderMap,
    body: &[u8],
    what: &str,
) -> Result<Value, Unreadable> {
    let media = media_type(headers);
    if media != UNARY_JSON {
        return Err(Unreadable::Media {
            accepts: UNARY_JSON,
            got: media,
        });
    }
    parse_message(body, what).map_err(Unreadable::Unary)
}

/// The one request message of a server-streaming call, as a JSON object.
pub(super) fn stream_request(
    headers: &HeaderMap,
    body: &[u8],
    what: &str,
) -> Result<Value, Unreadable> {
    let media = media_type(headers);
    if media != CONNECT_JSON {
        return Err(Unreadable::Media {
            accepts: CONNECT_JSON,
            got: media,
        });
    }
    read_envelope(body)
        .map_err(|message| RpcError::new(Code::InvalidArgument, message))
        .and_then(|message| parse_message(message, what))
        .map_err(Unreadable::Stream)
}

fn parse_message(body: &[u8], what: &str) -> Result<Value, RpcError> {
    if body.is_empty() {
        return Err(RpcError::new(
            Code::InvalidArgument,
            format!("unmarshal into {what}: zero-length payload is not a valid JSON object"),
        ));
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(value @ Value::Object(_)) => Ok(value),
        Ok(_) => Err(RpcError::new(
            Code::InvalidArgument,
            format!("unmarshal into {what}: the message is not a JSON object"),
        )),
        Err(e) => Err(RpcError::new(
            Code::InvalidArgument,
            format!("unmarshal into {what}: {e}"),
        )),
    }
}

/// The one message of a Connect streaming request.
pub(super) fn read_envelope(body: &[u8]) -> Result<&[u8], String> {
    if body.len() < 5 {
        return Err("the request is not a Connect envelope".to_owned());
    }
    if body[0] & 0x01 != 0 {
        return Err("compressed requests are not supported".to_owned());
    }
    let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
    if body.len() - 5 != len {
        return Err(format!(
            "the envelope announces {len} bytes but carries {}",
            body.len() - 5
        ));
    }
    Ok(&body[5..])
}

/// One envelope: flags, big-endian length, JSON.
pub(super) fn frame(flags: u8, message: &Value) -> Bytes {
    let body = serde_json::to_vec(message).unwrap_or_else(|_| b"{}".to_vec());
    let mut out = Vec::with_capacity(5 + body.len());
    out.push(flags);
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&body);
    Bytes::from(out)
}

/// A stream's last frame: `{}`, or the error that ended it.
pub(super) fn end_frame(error: Option<&RpcError>) -> Bytes {
    let body = match error {
        Some(error) => json!({ "error": error.body() }),
        None => json!({}),
    };
    frame(END_STREAM_FLAG, &body)
}

pub(super) fn stream_response(body: Body) -> Response {
    let mut response = Response::new(body);
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(CONNECT_JSON));
    response
}

// ---- reading proto3 JSON ----

/// A field by its JSON name or its proto name (proto3 JSON readers accept both).
pub(super) fn field<'a>(message: &'a Value, json_name: &str, proto_name: &str) -> &'a Value {
    match &message[json_name] {
        Value::Null => &message[proto_name],
        found => found,
    }
}

pub(super) fn string(value: &Value) -> Option<&str> {
    value.as_str()
}

pub(super) fn boolean(value: &Value) -> bool {
    value.as_bool().unwrap_or(false)
}

/// A 32-bit unsigned number, written as a number or (as proto3 JSON allows) a string.
pub(super) fn uint32(value: &Value) -> Option<u32> {
    match value {
        Value::Number(n) => n.as_u64().and_then(|n| u32::try_from(n).ok()),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// `bytes`, which proto3 JSON writes as base64 (standard or URL-safe, padded or not).
pub(super) fn bytes(value: &Value) -> Result<Vec<u8>, String> {
    let Some(text) = value.as_str() else {
        return Ok(Vec::new());
    };
    STANDARD
        .decode(text)
        .or_else(|_| URL_SAFE.decode(text))
        .or_else(|_| STANDARD_NO_PAD.decode(text))
        .or_else(|_| URL_SAFE_NO_PAD.decode(text))
        .map_err(|e| format!("bytes are not base64: {e}"))
}

/// A `ProcessSelector`: by pid or by tag. envd answers a selector with neither `unimplemented`.
pub(super) fn selector(message: &Value) -> Result<Selector, RpcError> {
    let process = &message["process"];
    if let Some(pid) = uint32(&process["pid"]) {
        return Ok(Selector::Pid(pid));
    }
    if let Some(tag) = string(&process["tag"]) {
        return Ok(Selector::Tag(tag.to_owned()));
    }
    Err(RpcError::new(
        Code::Unimplemented,
        "invalid input type <nil>: the request names no process (give process.pid or process.tag)",
    ))
}

// ---- writing proto3 JSON ----

/// A message being written, leaving out zero values as proto3 JSON does.
#[derive(Default)]
pub(super) struct Message(Map<String, Value>);

impl Message {
    pub(super) fn new() -> Self {
        Self::default()
    }

    /// A plain string field: left out when empty.
    pub(super) fn string(mut self, name: &str, value: &str) -> Self {
        if !value.is_empty() {
            self.0.insert(name.to_owned(), json!(value));
        }
        self
    }

    /// An `optional` field: written whenever it is set, even when empty.
    pub(super) fn optional(mut self, name: &str, value: Option<&str>) -> Self {
        if let Some(value) = value {
            self.0.insert(name.to_owned(), json!(value));
        }
        self
    }

    pub(super) fn uint32(mut self, name: &str, value: u32) -> Self {
        if value != 0 {
            self.0.insert(name.to_owned(), json!(value));
        }
        self
    }

    pub(super) fn sint32(mut self, name: &str, value: i32) -> Self {
        if value != 0 {
            self.0.insert(name.to_owned(), json!(value));
        }
        self
    }

    /// A 64-bit number, which proto3 JSON writes as a string.
    pub(super) fn int64(mut self, name: &str, value: i64) -> Self {
        if value != 0 {
            self.0.insert(name.to_owned(), json!(value.to_string()));
        }
        self
    }

    pub(super) fn boolean(mut self, name: &str, value: bool) -> Self {
        if value {
            self.0.insert(name.to_owned(), json!(true));
        }
        self
    }

    /// Any other value (a message, a list, a map, an enum name): left out when null or empty.
    pub(super) fn value(mut self, name: &str, value: Value) -> Self {
        let empty = match &value {
            Value::Null => true,
            Value::Array(a) => a.is_empty(),
            Value::Object(o) => o.is_empty(),
            _ => false,
        };
        if !empty {
            self.0.insert(name.to_owned(), value);
        }
        self
    }

    /// A sub-message that is set, even when all its fields are zero (`{}`).
    pub(super) fn message(mut self, name: &str, value: Message) -> Self {
        self.0.insert(name.to_owned(), value.done());
        self
    }

    pub(super) fn done(self) -> Value {
        Value::Object(self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_carry_flags_and_a_big_endian_length() {
        let f = end_frame(None);
        assert_eq!(&f[..], &[2, 0, 0, 0, 2, b'{', b'}']);
        assert_eq!(read_envelope(&f).unwrap(), b"{}");
        assert!(read_envelope(&f[..6]).is_err());
        assert!(read_envelope(&[1, 0, 0, 0, 0]).is_err());
    }

    #[test]
    fn messages_leave_out_zero_values_and_write_64_bit_numbers_as_strings() {
        let written = Message::new()
            .string("name", "")
            .string("path", "/a")
            .int64("size", 0)
            .int64("big", 5)
            .uint32("mode", 0)
            .boolean("exited", false)
            .optional("error", Some(""))
            .value("entries", json!([]))
            .message("start", Message::new())
            .done();
        assert_eq!(
            written,
            json!({"path": "/a", "big": "5", "error": "", "start": {}})
        );
    }

    #[test]
    fn requests_read_either_field_name_and_numbers_as_strings() {
        let message = json!({"include_entry": true, "process": {"pid": "42"}});
        assert!(boolean(field(&message, "includeEntry", "include_entry")));
        assert_eq!(selector(&message).unwrap(), Selector::Pid(42));
        assert_eq!(
            selector(&json!({"process": {"tag": "web"}})).unwrap(),
            Selector::Tag("web".into())
        );
        assert_eq!(selector(&json!({})).unwrap_err().code, Code::Unimplemented);
        assert_eq!(bytes(&json!("aGk=")).unwrap(), b"hi");
        assert_eq!(bytes(&json!("aGk")).unwrap(), b"hi");
    }

    #[test]
    fn unary_errors_carry_connects_status_for_their_code() {
        let response = RpcError::new(Code::AlreadyExists, "x").into_response();
        assert_eq!(response.status(), StatusCode::CONFLICT);
        let response = RpcError::new(Code::Unimplemented, "x").into_response();
        assert_eq!(response.status(), StatusCode::NOT_IMPLEMENTED);
    }
}
