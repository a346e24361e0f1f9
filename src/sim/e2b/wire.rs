//! The simulator's side of the wire: E2B error bodies, query parsing, paging tokens, timestamps.
//!
//! Everything here mirrors the official spec (`shared/e2b/openapi.yml`) on its own terms; it must
//! not import Steward's E2B client, so the two implementations can catch each other's mistakes.
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::{DateTime, SecondsFormat, Utc};
use serde::de::DeserializeOwned;

use super::series::Ms;

/// An E2B-shaped failure: `{"code": <status>, "message": "...", "error_code"?: "..."}`.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{status}: {message}")]
pub(crate) struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub error_code: Option<String>,
    /// Sent as `Retry-After` (seconds); only 429s carry it.
    pub retry_after_secs: Option<u64>,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            error_code: None,
            retry_after_secs: None,
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, message)
    }

    /// E2B's wording for a sandbox that is neither running nor paused (or not the caller's).
    pub fn sandbox_not_found(id: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            format!("Sandbox \"{id}\" doesn't exist or you don't have access to it"),
        )
    }

    pub fn template_not_found(id: &str) -> Self {
        Self::new(StatusCode::NOT_FOUND, format!("Template {id} not found"))
    }

    pub fn invalid_token() -> Self {
        Self::bad_request("Invalid next token")
    }

    /// The spec validator's wording for a query value outside its enum.
    pub fn not_one_of(name: &str, value: &str, allowed: &[&str]) -> Self {
        let allowed: Vec<String> = allowed.iter().map(|a| format!("{a:?}")).collect();
        Self::bad_request(format!(
            "parameter \"{name}\" in query has an error: value {value:?} is not one of the allowed values [{}]",
            allowed.join(",")
        ))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = serde_json::json!({
            "code": self.status.as_u16(),
            "message": self.message,
        });
        if let Some(code) = &self.error_code {
            body["error_code"] = serde_json::Value::String(code.clone());
        }
        let mut response = (self.status, axum::Json(body)).into_response();
        if let Some(secs) = self.retry_after_secs {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

/// Query parameters in request order, each value percent-decoded once (as any server does).
pub(crate) struct Params(Vec<(String, String)>);

impl Params {
    pub fn parse(raw: Option<&str>) -> Self {
        let pairs = raw
            .map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect())
            .unwrap_or_default();
        Self(pairs)
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// An optional integer parameter within `min..=max`, with the validator's style of message.
    pub fn int(&self, name: &str, min: i64, max: i64) -> Result<Option<i64>, ApiError> {
        let Some(raw) = self.get(name) else {
            return Ok(None);
        };
        let value: i64 = raw.trim().parse().map_err(|_| {
            ApiError::bad_request(format!(
                "parameter \"{name}\" in query has an error: value {raw:?} is not an integer"
            ))
        })?;
        if value < min {
            return Err(ApiError::bad_request(format!(
                "parameter \"{name}\" in query has an error: number must be at least {min}"
            )));
        }
        if value > max {
            return Err(ApiError::bad_request(format!(
                "parameter \"{name}\" in query has an error: number must be at most {max}"
            )));
        }
        Ok(Some(value))
    }

    /// An optional parameter that must be one of `allowed`.
    pub fn one_of(&self, name: &str, allowed: &[&str]) -> Result<Option<&str>, ApiError> {
        match self.get(name) {
            Some(value) if !allowed.contains(&value) => {
                Err(ApiError::not_one_of(name, value, allowed))
            }
            value => Ok(value),
        }
    }

    /// The shared `limit` parameter of every paged list: 1..=100, default 100.
    pub fn page_limit(&self) -> Result<usize, ApiError> {
        Ok(self.int("limit", 1, 100)?.unwrap_or(100) as usize)
    }
}

/// Go's `url.QueryUnescape`: `+` is a space, `%XX` a byte, and a `%` not followed by two hex
/// digits is an error worded as Go words it. The bytes must be UTF-8 (metadata is JSON text).
pub(crate) fn query_unescape(s: &str) -> Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = bytes
                    .get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok());
                let value = hex
                    .filter(|h| h.bytes().all(|b| b.is_ascii_hexdigit()))
                    .and_then(|h| u8::from_str_radix(h, 16).ok());
                let Some(value) = value else {
                    let end = (i + 3).min(bytes.len());
                    let shown = String::from_utf8_lossy(&bytes[i..end]);
                    return Err(format!("invalid URL escape {shown:?}"));
                };
                out.push(value);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| "the unescaped text is not UTF-8".to_owned())
}

/// The `metadata` filter of `GET /v2/sandboxes`, decoded as E2B's API does (`parseFilters`):
/// the value (already query-decoded once) is unescaped whole, split at `&` and then `=`
/// (exactly one per pair), and each key and value unescaped again.
pub(crate) fn metadata_filter(value: &str) -> Result<Vec<(String, String)>, ApiError> {
    let invalid = |why: String| ApiError::bad_request(format!("Invalid metadata filter: {why}"));
    let query =
        query_unescape(value).map_err(|e| invalid(format!("error when unescaping query: {e}")))?;
    // A key given twice keeps its last value, as Go's map does.
    let mut pairs = std::collections::BTreeMap::new();
    for pair in query.split('&') {
        let parts: Vec<&str> = pair.split('=').collect();
        let [key, value] = parts[..] else {
            return Err(invalid("invalid key value pair in query".to_owned()));
        };
        let key =
            query_unescape(key).map_err(|e| invalid(format!("error when unescaping key: {e}")))?;
        let value = query_unescape(value)
            .map_err(|e| invalid(format!("error when unescaping value: {e}")))?;
        pairs.insert(key, value);
    }
    Ok(pairs.into_iter().collect())
}

/// Parses a JSON request body. An empty body is `T::default()` unless the spec marks it required.
pub(crate) fn parse_body<T: DeserializeOwned + Default>(
    body: &[u8],
    required: bool,
) -> Result<T, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        if required {
            return Err(ApiError::bad_request(
                "request body has an error: value is required but missing",
            ));
        }
        return Ok(T::default());
    }
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("request body has an error: {e}")))
}

pub(crate) fn encode_token(plain: &str) -> String {
    URL_SAFE_NO_PAD.encode(plain.as_bytes())
}

/// Decodes an opaque token; any garbage is E2B's 400 `Invalid next token`.
pub(crate) fn decode_token(token: &str) -> Result<String, ApiError> {
    let bytes = URL_SAFE_NO_PAD
        .decode(token.trim_end_matches('=').as_bytes())
        .map_err(|_| ApiError::invalid_token())?;
    String::from_utf8(bytes).map_err(|_| ApiError::invalid_token())
}

/// RFC 3339 with millisecond precision, as E2B renders sandbox times.
pub(crate) fn rfc3339_ms(ms: Ms) -> String {
    DateTime::<Utc>::from_timestamp_millis(ms)
        .unwrap_or_default()
        .to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// RFC 3339 with whole seconds, for metric timestamps.
pub(crate) fn rfc3339_secs(secs: i64) -> String {
    DateTime::<Utc>::from_timestamp(secs, 0)
        .unwrap_or_default()
        .to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// RFC 3339 with as many fractional digits as needed, as in E2B's paging tokens.
pub(crate) fn rfc3339_nano(ms: Ms) -> String {
    DateTime::<Utc>::from_timestamp_millis(ms)
        .unwrap_or_default()
        .to_rfc3339_opts(SecondsFormat::AutoSi, true)
}

pub(crate) fn parse_rfc3339_ms(value: &str) -> Option<Ms> {
    DateTime::parse_from_rfc3339(value.trim())
        .ok()
        .map(|t| t.timestamp_millis())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_and_garbage_is_an_invalid_token() {
        let token = encode_token("2026-01-02T03:04:05.123Z__iabc");
        assert_eq!(
            decode_token(&token).unwrap(),
            "2026-01-02T03:04:05.123Z__iabc"
        );
        assert_eq!(
            decode_token("%%%").unwrap_err().message,
            "Invalid next token"
        );
    }

    #[test]
    fn nano_timestamps_parse_back_to_the_same_millisecond() {
        let ms = 1_767_323_045_123;
        assert_eq!(parse_rfc3339_ms(&rfc3339_nano(ms)), Some(ms));
        assert_eq!(parse_rfc3339_ms(&rfc3339_ms(ms)), Some(ms));
    }

    #[test]
    fn metadata_filters_decode_as_e2b_decodes_them() {
        // What the SDK sends for {"owner": "zoë", "k": "a b&c=d"}, after the query's own decoding.
        let pairs = metadata_filter("owner=zo%25C3%25AB&k=a%2520b%2526c%253Dd").unwrap();
        assert_eq!(
            pairs,
            vec![
                ("k".to_owned(), "a b&c=d".to_owned()),
                ("owner".to_owned(), "zoë".to_owned())
            ]
        );
        assert_eq!(
            metadata_filter("a=b%2Fc&a=d").unwrap(),
            vec![("a".to_owned(), "d".to_owned())]
        );
        assert_eq!(
            metadata_filter("a=b%2Fc").unwrap(),
            vec![("a".to_owned(), "b/c".to_owned())]
        );
        for bad in ["", "a", "a=b=c", "%YY", "%25YY=a", "a=%25YY", "a=%"] {
            let err = metadata_filter(bad).unwrap_err();
            assert_eq!(err.status, StatusCode::BAD_REQUEST, "{bad}");
        }
        assert_eq!(
            metadata_filter("a=%25YY").unwrap_err().message,
            "Invalid metadata filter: error when unescaping value: invalid URL escape \"%YY\""
        );
    }

    #[test]
    fn limits_outside_the_spec_range_are_refused() {
        let params = Params::parse(Some("limit=101&x=a%20b"));
        assert!(params.page_limit().is_err());
        assert_eq!(params.get("x"), Some("a b"));
        assert_eq!(Params::parse(Some("limit=7")).page_limit().unwrap(), 7);
        assert!(Params::parse(Some("limit=0")).page_limit().is_err());
        assert_eq!(Params::parse(None).page_limit().unwrap(), 100);
    }
}
