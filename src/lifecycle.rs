//! E2B's sandbox lifecycle events, as Steward receives them: the event's shape, and the check of
//! a webhook delivery's `e2b-signature`.
//!
//! E2B signs a delivery with SHA-256 over the webhook's signature secret followed by the raw
//! body, URL-safe base64 without `=` padding (E2B docs, "Sandbox → Lifecycle events webhooks →
//! Webhook verification"; `e2b-signature-version` is `v1`). The signature covers no timestamp,
//! so a replayed delivery verifies: replays are refused by the event `id` (see `http/e2b.rs`),
//! never by the signature alone. The payload's `version` is `v1` in E2B's docs (a note of ours
//! said `v2`; the docs win), and `eventData` may be `null`.
use std::collections::BTreeMap;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::{DateTime, Utc};
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::ids::SandboxId;

/// A lifecycle event type Steward knows; others are accepted and recorded as `Other`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    Created,
    Updated,
    Paused,
    Resumed,
    Killed,
    Other,
}

impl EventKind {
    fn parse(text: &str) -> Self {
        match text {
            "sandbox.lifecycle.created" => Self::Created,
            "sandbox.lifecycle.updated" => Self::Updated,
            "sandbox.lifecycle.paused" => Self::Paused,
            "sandbox.lifecycle.resumed" => Self::Resumed,
            "sandbox.lifecycle.killed" => Self::Killed,
            _ => Self::Other,
        }
    }

    /// The short name metrics and the audit log use.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Created => "created",
            Self::Updated => "updated",
            Self::Paused => "paused",
            Self::Resumed => "resumed",
            Self::Killed => "killed",
            Self::Other => "other",
        }
    }
}

/// One lifecycle event.
#[derive(Debug, Clone, PartialEq)]
pub struct LifecycleEvent {
    /// Unique per event: deliveries of the same event carry the same id.
    pub id: String,
    pub kind: EventKind,
    /// The type as E2B wrote it.
    pub type_name: String,
    pub sandbox: SandboxId,
    pub template_id: Option<String>,
    pub at: DateTime<Utc>,
    pub metadata: BTreeMap<String, String>,
    /// `updated`: the sandbox's new end.
    pub set_timeout: Option<DateTime<Utc>>,
}

/// Why a body is not an event Steward can use.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct BadEvent(pub String);

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Wire {
    id: String,
    #[serde(rename = "type")]
    kind: String,
    sandbox_id: String,
    #[serde(default)]
    sandbox_template_id: Option<String>,
    timestamp: DateTime<Utc>,
    #[serde(default)]
    event_data: Option<WireData>,
}

#[derive(Deserialize, Default)]
struct WireData {
    #[serde(default)]
    sandbox_metadata: Option<BTreeMap<String, String>>,
    #[serde(default)]
    set_timeout: Option<DateTime<Utc>>,
}

/// How long an event id is remembered as handled: E2B keeps events 7 days, so neither a late
/// delivery nor the poller's catch-up brings one back after its mark is gone.
pub const DEDUPE_TTL: std::time::Duration = std::time::Duration::from_secs(8 * 24 * 3600);

/// The longest event id or sandbox id Steward accepts (E2B's are UUIDs and 20-character ids).
const MAX_ID_LEN: usize = 128;

impl LifecycleEvent {
    /// Parses one event as E2B sends it (a webhook body, or one entry of the events API).
    pub fn parse(body: &[u8]) -> Result<Self, BadEvent> {
        let wire: Wire = serde_json::from_slice(body)
            .map_err(|e| BadEvent(format!("the body is not an E2B lifecycle event: {e}")))?;
        Self::from_wire(wire)
    }

    /// One entry of the events API's list.
    pub fn from_value(value: serde_json::Value) -> Result<Self, BadEvent> {
        let wire: Wire = serde_json::from_value(value)
            .map_err(|e| BadEvent(format!("not an E2B lifecycle event: {e}")))?;
        Self::from_wire(wire)
    }

    fn from_wire(wire: Wire) -> Result<Self, BadEvent> {
        let valid_id = |s: &str| {
            !s.is_empty()
                && s.len() <= MAX_ID_LEN
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        };
        if !valid_id(&wire.id) {
            return Err(BadEvent("the event id is missing or malformed".into()));
        }
        let sandbox = SandboxId::parse(wire.sandbox_id.as_str())
            .map_err(|_| BadEvent("the sandboxId is missing or malformed".into()))?;
        let data = wire.event_data.unwrap_or_default();
        Ok(Self {
            id: wire.id,
            kind: EventKind::parse(&wire.kind),
            type_name: wire.kind,
            sandbox,
            template_id: wire.sandbox_template_id,
            at: wire.timestamp,
            metadata: data.sandbox_metadata.unwrap_or_default(),
            set_timeout: data.set_timeout,
        })
    }
}

/// The `e2b-signature` E2B sends for `body` under `secret`.
pub fn signature(secret: &SecretString, body: &[u8]) -> String {
    let mut hash = Sha256::new();
    hash.update(secret.expose_secret().as_bytes());
    hash.update(body);
    URL_SAFE_NO_PAD.encode(hash.finalize())
}

/// Whether `header` is the signature of `body` under one of `secrets` (several while one is
/// rotated). Every secret is compared, in constant time, whatever matched.
pub fn verify(secrets: &[SecretString], body: &[u8], header: Option<&str>) -> bool {
    let Some(given) = header.map(str::trim).filter(|h| !h.is_empty()) else {
        return false;
    };
    let mut ok = subtle::Choice::from(0u8);
    for secret in secrets {
        let expected = signature(secret, body);
        ok |= expected.as_bytes().ct_eq(given.as_bytes());
    }
    bool::from(ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signature_is_the_one_e2bs_docs_compute() {
        // base64.b64encode(sha256(("whsec" + '{"id":"1"}').encode()).digest()), then
        // + → -, / → _ and the padding stripped: E2B's Python verification snippet.
        let secret = SecretString::from("whsec".to_owned());
        let want = "0HMmEh8smpFRypn6_sPljS8jXORYhlduxd0vX8priUY";
        assert_eq!(signature(&secret, b"{\"id\":\"1\"}"), want);
        let other = SecretString::from("old".to_owned());
        assert!(verify(
            &[other.clone(), secret.clone()],
            b"{\"id\":\"1\"}",
            Some(want)
        ));
        assert!(!verify(&[other], b"{\"id\":\"1\"}", Some(want)));
        assert!(!verify(
            std::slice::from_ref(&secret),
            b"{\"id\":\"2\"}",
            Some(want)
        ));
        assert!(!verify(
            std::slice::from_ref(&secret),
            b"{\"id\":\"1\"}",
            None
        ));
        assert!(!verify(&[], b"{\"id\":\"1\"}", Some(want)));
    }

    #[test]
    fn an_event_parses_with_null_event_data_and_refuses_bad_ids() {
        let body = br#"{"version":"v1","id":"0568572b-a2ac","type":"sandbox.lifecycle.killed",
            "eventData":null,"sandboxBuildId":"b","sandboxExecutionId":"x","sandboxId":"iabc",
            "sandboxTeamId":"t","sandboxTemplateId":"base","timestamp":"2025-08-06T20:59:36Z"}"#;
        let e = LifecycleEvent::parse(body).unwrap();
        assert_eq!(e.kind, EventKind::Killed);
        assert_eq!(e.sandbox.as_str(), "iabc");
        assert!(e.metadata.is_empty());
        let bad = String::from_utf8_lossy(body).replace("iabc", "i abc/../x");
        assert!(LifecycleEvent::parse(bad.as_bytes()).is_err());
        assert!(LifecycleEvent::parse(b"[]").is_err());
    }
}
