//! Bearer tokens for the agent API and the MCP endpoint: who is calling, what they may do, and
//! how often.
//!
//! A presented token is hashed (SHA-256) and compared in constant time with every stored hash,
//! so neither the match nor its position leaks through timing; the token itself is never
//! logged, stored or echoed. The rate limit is a token bucket per token name, in memory per
//! replica. [`authorize`] checks a route's action from the allow list before the body is read, so a
//! token without it never makes Steward read (or hold) a large body. [`Caller::sees`] is the
//! tenancy rule: a token reads the runs and cases it made, and every one only with `read_all`.
//! This module must not read request bodies: it runs before anything is parsed.
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{FromRequestParts, Request, State};
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::ApiFailure;
use crate::config::{ApiAction, ApiConfig, ApiRate};
use crate::telemetry::WarnGate;

/// Requests over their token's rate are logged at `info` at most once every 10 s: the rate
/// bounds what a token may do, not how often it may be told no.
static OVER_RATE: WarnGate = WarnGate::new(Duration::from_secs(10));

/// The authenticated caller of one request: a token's name and what it may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// `[api.tokens.NAME]`: the requester on cards and in the audit log.
    pub name: String,
    allow: Vec<ApiAction>,
}

impl Caller {
    pub fn new(name: impl Into<String>, allow: Vec<ApiAction>) -> Self {
        Self {
            name: name.into(),
            allow,
        }
    }

    /// `Ok` when this token may do `action`; else a 403 naming the action.
    pub fn require(&self, action: ApiAction) -> Result<(), ApiFailure> {
        if self.allow.contains(&action) {
            Ok(())
        } else {
            Err(ApiFailure::forbidden(format!(
                "The token `{}` is not allowed to `{}`; add it to `allow` under [api.tokens.{}] in steward.toml",
                self.name,
                action.as_str(),
                self.name
            )))
        }
    }
}

impl Caller {
    /// Whether this token's allow list has `action`.
    pub fn may(&self, action: ApiAction) -> bool {
        self.allow.contains(&action)
    }

    /// Whether this token may read what `owner` made (a run's requester, a case's agent opener):
    /// its own, or anybody's with `read_all`. Callers refuse the rest as not found, so a token
    /// cannot even learn that another tenant's run or case exists.
    pub fn sees(&self, owner: Option<&str>) -> bool {
        owner == Some(self.name.as_str()) || self.may(ApiAction::ReadAll)
    }

    /// `Ok` when this token may do any of `actions` (reading a run needs `run` or `read`).
    pub fn require_any(&self, actions: &[ApiAction]) -> Result<(), ApiFailure> {
        if let [action] = actions {
            return self.require(*action);
        }
        if actions.iter().any(|a| self.allow.contains(a)) {
            return Ok(());
        }
        let names: Vec<String> = actions
            .iter()
            .map(|a| format!("`{}`", a.as_str()))
            .collect();
        Err(ApiFailure::forbidden(format!(
            "The token `{}` is not allowed to do this: it needs {} under [api.tokens.{}] in steward.toml",
            self.name,
            names.join(" or "),
            self.name
        )))
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = ApiFailure;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiFailure> {
        // Set by `authenticate`; a route without it is a wiring mistake, refused rather than
        // served anonymously.
        parts
            .extensions
            .get::<Caller>()
            .cloned()
            .ok_or_else(|| ApiFailure::unauthorized("This route needs a bearer token"))
    }
}

struct Entry {
    hash: [u8; 32],
    name: String,
}

/// The tokens of `[api.tokens]` and each name's rate bucket.
pub struct Tokens {
    entries: Vec<Entry>,
    names: HashMap<String, (Vec<ApiAction>, ApiRate)>,
    buckets: Mutex<HashMap<String, Bucket>>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut names: Vec<&String> = self.names.keys().collect();
        names.sort();
        f.debug_struct("Tokens").field("names", &names).finish()
    }
}

impl Tokens {
    pub fn from_config(config: &ApiConfig) -> Arc<Self> {
        let mut entries = Vec::new();
        let mut names = HashMap::new();
        for (name, token) in &config.tokens {
            for hash in &token.sha256 {
                entries.push(Entry {
                    hash: *hash,
                    name: name.clone(),
                });
            }
            names.insert(name.clone(), (token.allow.clone(), token.rate));
        }
        Arc::new(Self {
            entries,
            names,
            buckets: Mutex::new(HashMap::new()),
        })
    }

    /// The caller presenting `header` (`Authorization: Bearer <token>`), or a 401 that says why
    /// without repeating what was sent.
    pub fn authenticate(&self, header: Option<&str>) -> Result<Caller, ApiFailure> {
        let Some(header) = header else {
            return Err(ApiFailure::unauthorized(
                "Send an API token as `Authorization: Bearer <token>`",
            ));
        };
        let token = header
            .strip_prefix("Bearer ")
            .or_else(|| header.strip_prefix("bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| {
                ApiFailure::unauthorized("The Authorization header must be `Bearer <token>`")
            })?;
        let presented: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        // Compare with every entry, whatever matched, so timing says nothing about which.
        let mut found: Option<&str> = None;
        for entry in &self.entries {
            if bool::from(entry.hash.ct_eq(&presented)) {
                found = Some(&entry.name);
            }
        }
        let name = found.ok_or_else(|| {
            ApiFailure::unauthorized(
                "The API token is not one Steward knows (it may have been rotated out)",
            )
        })?;
        let (allow, _) = &self.names[name];
        Ok(Caller::new(name, allow.clone()))
    }

    /// Takes one request from `name`'s budget, or says how long to wait.
    pub fn admit(&self, name: &str, now: Instant) -> Result<(), Duration> {
        let Some((_, rate)) = self.names.get(name) else {
            return Ok(());
        };
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        let bucket = buckets
            .entry(name.to_owned())
            .or_insert_with(|| Bucket::full(*rate, now));
        bucket.take(*rate, now)
    }
}

/// A token bucket: `requests` at once, refilled evenly over `per`.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn full(rate: ApiRate, now: Instant) -> Self {
        Self {
            tokens: f64::from(rate.requests),
            at: now,
        }
    }

    fn take(&mut self, rate: ApiRate, now: Instant) -> Result<(), Duration> {
        let capacity = f64::from(rate.requests);
        let per_token = rate.per.as_secs_f64() / capacity;
        let refilled = now.saturating_duration_since(self.at).as_secs_f64() / per_token;
        self.tokens = (self.tokens + refilled).min(capacity);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - self.tokens) * per_token))
        }
    }
}

/// Middleware for every `/api/v1` and `/mcp` route: authenticates the bearer token, spends one
/// request of its budget, and hands the [`Caller`] to the handler. Runs before the body is read.
pub async fn authenticate(
    State(tokens): State<Arc<Tokens>>,
    mut request: Request,
    next: Next,
) -> Response {
    let header = request
        .headers()
        .get(AUTHORIZATION)
        .map(|v| v.to_str().unwrap_or(""));
    let caller = match tokens.authenticate(header) {
        Ok(caller) => caller,
        Err(failure) => return failure.into_response(),
    };
    if let Err(wait) = tokens.admit(&caller.name, Instant::now()) {
        if let Some(quiet) = OVER_RATE.warn_now() {
            tracing::info!(
                token = %caller.name,
                over_rate_quietly_before = quiet,
                "API request over the token's rate (further ones within 10 s are logged at debug)"
            );
        } else {
            tracing::debug!(token = %caller.name, "API request over the token's rate");
        }
        return ApiFailure::rate_limited(wait).into_response();
    }
    request.extensions_mut().insert(caller);
    next.run(request).await
}

/// Per-route middleware, inside [`authenticate`]: refuses (403) a token whose allow list has none
/// of the route's `actions`, before the body is read. The handler checks its exact action again
/// (a `POST /cases` names it in the body), which is also the check the MCP tools go through.
pub async fn authorize(
    State(actions): State<&'static [ApiAction]>,
    request: Request,
    next: Next,
) -> Response {
    let Some(caller) = request.extensions().get::<Caller>() else {
        return ApiFailure::unauthorized("This route needs a bearer token").into_response();
    };
    if let Err(refused) = caller.require_any(actions) {
        return refused.into_response();
    }
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(toml: &str) -> Arc<Tokens> {
        let policy = crate::config::Policy::parse(toml).unwrap();
        Tokens::from_config(&policy.api)
    }

    fn hash(token: &str) -> String {
        hex::encode(Sha256::digest(token.as_bytes()))
    }

    #[test]
    fn a_token_is_known_by_its_hash_and_rotation_keeps_both() {
        let t = tokens(&format!(
            "[api.tokens.ci]\nsha256 = [\"{}\", \"{}\"]\nallow = [\"read\"]\n",
            hash("old-token"),
            hash("new-token")
        ));
        assert_eq!(t.authenticate(Some("Bearer old-token")).unwrap().name, "ci");
        let caller = t.authenticate(Some("Bearer new-token")).unwrap();
        assert!(caller.require(ApiAction::Read).is_ok());
        let refused = caller.require(ApiAction::Run).unwrap_err();
        assert_eq!(refused.status, 403);
        assert!(refused.message.contains("`run`"), "{}", refused.message);
        for header in [
            None,
            Some("Bearer"),
            Some("Basic abc"),
            Some("Bearer other"),
        ] {
            let err = t.authenticate(header).unwrap_err();
            assert_eq!(err.status, 401);
        }
        assert!(!format!("{t:?}").contains(&hash("old-token")));
    }

    #[test]
    fn the_bucket_refuses_past_the_rate_and_refills() {
        let t = tokens(&format!(
            "[api.tokens.ci]\nsha256 = \"{}\"\nrate = \"2/min\"\n",
            hash("x")
        ));
        let start = Instant::now();
        assert!(t.admit("ci", start).is_ok());
        assert!(t.admit("ci", start).is_ok());
        let wait = t.admit("ci", start).unwrap_err();
        assert!(wait <= Duration::from_secs(30) && wait > Duration::from_secs(29));
        assert!(t.admit("ci", start + Duration::from_secs(30)).is_ok());
    }

    #[test]
    fn bad_token_settings_are_refused_with_a_sentence() {
        for (toml, expect) in [
            ("[api.tokens.ci]\nsha256 = \"abc\"\n", "64 hex digits"),
            ("[api.tokens.ci]\nsha256 = []\n", "at least one"),
            (
                &*format!(
                    "[api.tokens.ci]\nsha256 = \"{}\"\nrate = \"fast\"\n",
                    hash("x")
                ),
                "60/min",
            ),
            (
                &*format!(
                    "[api.tokens.ci]\nsha256 = \"{}\"\nallow = [\"kill\"]\n",
                    hash("x")
                ),
                "unknown variant",
            ),
            (
                &*format!(
                    "[api.tokens.a]\nsha256 = \"{h}\"\n[api.tokens.b]\nsha256 = \"{h}\"\n",
                    h = hash("x")
                ),
                "share a sha256",
            ),
        ] {
            let err = crate::config::Policy::parse(toml).unwrap_err().to_string();
            assert!(err.contains(expect), "{toml}: {err}");
        }
    }
}
