//! E2B's lifecycle events, simulated: the events API (`GET /events/sandboxes`,
//! `GET /events/sandboxes/{id}`), webhook registrations (`/events/webhooks`) and signed webhook
//! deliveries, with injectable delivery faults under `/_sim/webhooks/faults`.
//!
//! Shapes follow E2B's docs ("Sandbox → Lifecycle events API" and "… webhooks"): an event is
//! `{version: "v1", id, type, eventData, sandboxBuildId, sandboxExecutionId, sandboxId,
//! sandboxTeamId, sandboxTemplateId, timestamp}`, `eventData` carries `sandbox_metadata` and, on
//! `updated`, `set_timeout`. Paging is by `offset` and `limit` (1 to 100, default 10), newest first
//! unless `orderAsc=true`. A delivery is one event, POSTed with `e2b-webhook-id`, `e2b-delivery-id`
//! (one per attempt), `e2b-signature-version: v1` and `e2b-signature`: SHA-256 over the secret
//! followed by the raw body, URL-safe base64 without padding, as the docs' verification snippets
//! compute it. A delivery that does not get a 2xx within [`DELIVERY_TIMEOUT`] is tried again up to
//! three times, [`DEFAULT_RETRY_INTERVAL`] apart (tests shorten it), then dropped for good.
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::Deserialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::lifecycle::{Event, Kind};
use super::series::Ms;
use super::wire::{ApiError, parse_body, rfc3339_secs};
use super::{Sim, now_ms};

type Reply = Result<Response, ApiError>;

/// E2B retries a failed delivery about 10 s later, up to three times.
pub(crate) const DEFAULT_RETRY_INTERVAL: Duration = Duration::from_secs(10);
const RETRIES: u32 = 3;
/// How long a receiver has to answer one delivery.
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the deliverer looks for events even when nothing woke it (TTL expiries happen
/// without a request).
const TICK: Duration = Duration::from_millis(250);

/// One registration.
#[derive(Clone)]
pub(crate) struct Webhook {
    pub id: String,
    pub name: String,
    pub url: String,
    pub enabled: bool,
    pub events: Vec<Kind>,
    pub secret: String,
    pub created_at: Ms,
}

impl Webhook {
    fn json(&self, team_id: &str) -> Value {
        json!({
            "id": self.id,
            "teamID": team_id,
            "name": self.name,
            "createdAt": rfc3339_secs(self.created_at / 1000),
            "enabled": self.enabled,
            "url": self.url,
            "events": self.events.iter().map(|k| k.as_str()).collect::<Vec<_>>(),
        })
    }
}

/// Faults the next deliveries suffer (`POST /_sim/webhooks/faults`).
#[derive(Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DeliveryFaults {
    /// The next N events are never delivered (as when every retry failed).
    #[serde(default)]
    pub drop: u32,
    /// The next N events are delivered twice (a retry after a lost answer).
    #[serde(default)]
    pub duplicate: u32,
    /// The next N events wait `delay_ms` before their first attempt, so later events overtake
    /// them.
    #[serde(default)]
    pub delay: u32,
    #[serde(default)]
    pub delay_ms: u64,
    /// Time between attempts of a failed delivery (default 10 s).
    pub retry_interval_ms: Option<u64>,
}

/// One attempt, as `GET /_sim/webhooks/deliveries` lists them.
#[derive(Clone)]
pub(crate) struct Attempt {
    pub webhook: String,
    pub event_id: String,
    pub event_type: &'static str,
    pub sandbox_id: String,
    pub delivery_id: String,
    pub attempt: u32,
    /// The receiver's status, or `dropped` / `transport` / `timeout`.
    pub outcome: String,
}

/// The webhook side of the simulator.
#[derive(Default)]
pub(crate) struct Hooks {
    pub registrations: BTreeMap<String, Webhook>,
    pub faults: DeliveryFaults,
    pub attempts: Vec<Attempt>,
    /// The last event sequence handed to deliveries.
    pub cursor: u64,
}

/// The JSON of one event, as the API lists it and a webhook receives it.
pub(crate) fn event_json(event: &Event, team_id: &str) -> Value {
    let mut data = serde_json::Map::new();
    data.insert("sandbox_metadata".to_owned(), json!(event.metadata.clone()));
    if let Some(end) = event.set_timeout {
        data.insert("set_timeout".to_owned(), json!(rfc3339_secs(end / 1000)));
    }
    json!({
        "version": "v1",
        "id": event.id,
        "type": event.kind.as_str(),
        "eventData": data,
        "sandboxBuildId": event.build_id,
        "sandboxExecutionId": event.execution_id,
        "sandboxId": event.sandbox_id,
        "sandboxTeamId": team_id,
        "sandboxTemplateId": event.template_id,
        "timestamp": rfc3339_secs(event.at / 1000),
    })
}

/// `e2b-signature` for `body` under `secret`: SHA-256 over the secret then the body, URL-safe
/// base64 without padding.
pub fn signature(secret: &str, body: &[u8]) -> String {
    let mut hash = Sha256::new();
    hash.update(secret.as_bytes());
    hash.update(body);
    URL_SAFE_NO_PAD.encode(hash.finalize())
}

/// `offset`, `limit` and `orderAsc` from a query string, with E2B's bounds.
fn paging(raw: Option<&str>) -> Result<(usize, usize, bool), ApiError> {
    let (mut offset, mut limit, mut asc) = (0usize, 10usize, false);
    for pair in raw.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let bad = |what: &str| ApiError::bad_request(format!("invalid {key}: {what}"));
        match key {
            "offset" => {
                offset = value.parse().map_err(|_| bad("must be 0 or more"))?;
            }
            "limit" => {
                limit = value.parse().map_err(|_| bad("must be 1 to 100"))?;
                if !(1..=100).contains(&limit) {
                    return Err(bad("must be 1 to 100"));
                }
            }
            "orderAsc" => {
                asc = match value {
                    "true" => true,
                    "false" => false,
                    _ => return Err(bad("must be true or false")),
                };
            }
            _ => {}
        }
    }
    Ok((offset, limit, asc))
}

fn list_events(sim: &Sim, sandbox: Option<&str>, raw: Option<&str>) -> Reply {
    let (offset, limit, asc) = paging(raw)?;
    let world = sim.world(now_ms());
    let page: Vec<Value> = world
        .events
        .page(sandbox, asc, offset, limit)
        .into_iter()
        .map(|e| event_json(e, &world.team_id))
        .collect();
    Ok(Json(page).into_response())
}

pub(crate) async fn team_events(State(sim): State<Arc<Sim>>, RawQuery(raw): RawQuery) -> Reply {
    list_events(&sim, None, raw.as_deref())
}

pub(crate) async fn sandbox_events(
    State(sim): State<Arc<Sim>>,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
) -> Reply {
    let short = super::model::short_sandbox_id(&id).to_owned();
    list_events(&sim, Some(&short), raw.as_deref())
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Registration {
    name: Option<String>,
    url: Option<String>,
    enabled: Option<bool>,
    events: Option<Vec<String>>,
    signature_secret: Option<String>,
}

fn kinds(names: &[String]) -> Result<Vec<Kind>, ApiError> {
    names
        .iter()
        .map(|n| {
            Kind::parse(n).ok_or_else(|| ApiError::bad_request(format!("unknown event type {n:?}")))
        })
        .collect()
}

fn valid_url(url: &str) -> Result<(), ApiError> {
    if url.starts_with("https://") || url.starts_with("http://") {
        Ok(())
    } else {
        Err(ApiError::bad_request("url must be an http(s) URL"))
    }
}

pub(crate) async fn register(State(sim): State<Arc<Sim>>, body: Bytes) -> Reply {
    let req: Registration = parse_body(&body, true)?;
    let (Some(url), Some(secret)) = (req.url, req.signature_secret) else {
        return Err(ApiError::bad_request(
            "request body has an error: url and signatureSecret are required",
        ));
    };
    valid_url(&url)?;
    if secret.is_empty() {
        return Err(ApiError::bad_request("signatureSecret must not be empty"));
    }
    let events = match req.events {
        Some(names) if !names.is_empty() => kinds(&names)?,
        _ => Kind::ALL.to_vec(),
    };
    let (id, team) = {
        let mut world = sim.world(now_ms());
        (world.fresh_uuid(), world.team_id.clone())
    };
    let hook = Webhook {
        id: id.clone(),
        name: req.name.unwrap_or_default(),
        url,
        enabled: req.enabled.unwrap_or(true),
        events,
        secret,
        created_at: now_ms(),
    };
    let body = hook.json(&team);
    sim.hooks().registrations.insert(id, hook);
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

pub(crate) async fn list_webhooks(State(sim): State<Arc<Sim>>) -> Reply {
    let team = sim.team_id();
    let all: Vec<Value> = sim
        .hooks()
        .registrations
        .values()
        .map(|h| h.json(&team))
        .collect();
    Ok(Json(all).into_response())
}

fn webhook_not_found(id: &str) -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, format!("webhook {id} not found"))
}

pub(crate) async fn get_webhook(State(sim): State<Arc<Sim>>, Path(id): Path<String>) -> Reply {
    let team = sim.team_id();
    let hooks = sim.hooks();
    let hook = hooks
        .registrations
        .get(&id)
        .ok_or_else(|| webhook_not_found(&id))?;
    Ok(Json(hook.json(&team)).into_response())
}

pub(crate) async fn update_webhook(
    State(sim): State<Arc<Sim>>,
    Path(id): Path<String>,
    body: Bytes,
) -> Reply {
    let req: Registration = parse_body(&body, true)?;
    if let Some(url) = &req.url {
        valid_url(url)?;
    }
    let events = req.events.as_deref().map(kinds).transpose()?;
    let team = sim.team_id();
    let mut hooks = sim.hooks();
    let hook = hooks
        .registrations
        .get_mut(&id)
        .ok_or_else(|| webhook_not_found(&id))?;
    if let Some(name) = req.name {
        hook.name = name;
    }
    if let Some(url) = req.url {
        hook.url = url;
    }
    if let Some(enabled) = req.enabled {
        hook.enabled = enabled;
    }
    if let Some(events) = events {
        hook.events = events;
    }
    if let Some(secret) = req.signature_secret {
        hook.secret = secret;
    }
    Ok(Json(hook.json(&team)).into_response())
}

pub(crate) async fn delete_webhook(State(sim): State<Arc<Sim>>, Path(id): Path<String>) -> Reply {
    sim.hooks()
        .registrations
        .remove(&id)
        .ok_or_else(|| webhook_not_found(&id))?;
    Ok(StatusCode::OK.into_response())
}

// ---- test hooks ----

pub(crate) async fn set_faults(State(sim): State<Arc<Sim>>, body: Bytes) -> Reply {
    let faults: DeliveryFaults = parse_body(&body, true)?;
    sim.hooks().faults = faults;
    Ok(StatusCode::NO_CONTENT.into_response())
}

pub(crate) async fn deliveries(State(sim): State<Arc<Sim>>) -> Response {
    let attempts: Vec<Value> = sim
        .hooks()
        .attempts
        .iter()
        .map(|a| {
            json!({
                "webhook": a.webhook,
                "event_id": a.event_id,
                "type": a.event_type,
                "sandbox_id": a.sandbox_id,
                "delivery_id": a.delivery_id,
                "attempt": a.attempt,
                "outcome": a.outcome,
            })
        })
        .collect();
    Json(json!({ "attempts": attempts })).into_response()
}

// ---- delivery ----

/// What one event's deliveries need, taken out of the locks.
struct Outgoing {
    hook: Webhook,
    event_id: String,
    event_type: &'static str,
    sandbox_id: String,
    body: Vec<u8>,
    drop: bool,
    duplicate: bool,
    delay: Duration,
    retry_interval: Duration,
}

/// Hands every event recorded since the last call to the enabled registrations that asked for
/// its type, applying the queued faults.
fn take_outgoing(sim: &Sim) -> Vec<Outgoing> {
    let (events, team): (Vec<Event>, String) = {
        let world = sim.world(now_ms());
        let cursor = sim.hooks().cursor;
        let events: Vec<Event> = world.events.after(cursor).cloned().collect();
        (events, world.team_id.clone())
    };
    let mut hooks = sim.hooks();
    if let Some(last) = events.last() {
        hooks.cursor = last.seq;
    }
    let mut out = Vec::new();
    for event in &events {
        let targets: Vec<Webhook> = hooks
            .registrations
            .values()
            .filter(|h| h.enabled && h.events.contains(&event.kind))
            .cloned()
            .collect();
        if targets.is_empty() {
            continue;
        }
        let faults = &mut hooks.faults;
        let drop = take_one(&mut faults.drop);
        let duplicate = take_one(&mut faults.duplicate);
        let delay = if take_one(&mut faults.delay) {
            Duration::from_millis(faults.delay_ms)
        } else {
            Duration::ZERO
        };
        let retry_interval = faults
            .retry_interval_ms
            .map_or(DEFAULT_RETRY_INTERVAL, Duration::from_millis);
        let body = serde_json::to_vec(&event_json(event, &team)).unwrap_or_default();
        for hook in targets {
            out.push(Outgoing {
                hook,
                event_id: event.id.clone(),
                event_type: event.kind.as_str(),
                sandbox_id: event.sandbox_id.clone(),
                body: body.clone(),
                drop,
                duplicate,
                delay,
                retry_interval,
            });
        }
    }
    out
}

fn take_one(n: &mut u32) -> bool {
    if *n > 0 {
        *n -= 1;
        true
    } else {
        false
    }
}

/// Delivers events to the registered webhooks until the simulator stops.
pub(crate) async fn deliver_forever(sim: Arc<Sim>) {
    let http = reqwest::Client::builder()
        .timeout(DELIVERY_TIMEOUT)
        .build()
        .unwrap_or_default();
    loop {
        tokio::select! {
            () = sim.events_changed.notified() => {}
            () = tokio::time::sleep(TICK) => {}
        }
        for outgoing in take_outgoing(&sim) {
            tokio::spawn(deliver(sim.clone(), http.clone(), outgoing));
        }
    }
}

async fn deliver(sim: Arc<Sim>, http: reqwest::Client, out: Outgoing) {
    let record = |attempt: u32, delivery_id: &str, outcome: String| {
        sim.hooks().attempts.push(Attempt {
            webhook: out.hook.id.clone(),
            event_id: out.event_id.clone(),
            event_type: out.event_type,
            sandbox_id: out.sandbox_id.clone(),
            delivery_id: delivery_id.to_owned(),
            attempt,
            outcome,
        });
    };
    if out.drop {
        record(0, "", "dropped".to_owned());
        return;
    }
    if !out.delay.is_zero() {
        tokio::time::sleep(out.delay).await;
    }
    let signature = signature(&out.hook.secret, &out.body);
    let copies = if out.duplicate { 2 } else { 1 };
    for _ in 0..copies {
        for attempt in 1..=RETRIES + 1 {
            let delivery_id = uuid::Uuid::new_v4().to_string();
            let sent = http
                .post(&out.hook.url)
                .header("content-type", "application/json")
                .header("e2b-webhook-id", &out.hook.id)
                .header("e2b-delivery-id", &delivery_id)
                .header("e2b-signature-version", "v1")
                .header("e2b-signature", &signature)
                .body(out.body.clone())
                .send()
                .await;
            let (ok, outcome) = match sent {
                Ok(r) => (r.status().is_success(), r.status().as_u16().to_string()),
                Err(e) if e.is_timeout() => (false, "timeout".to_owned()),
                Err(_) => (false, "transport".to_owned()),
            };
            record(attempt, &delivery_id, outcome);
            if ok {
                break;
            }
            if attempt <= RETRIES {
                tokio::time::sleep(out.retry_interval).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signature_matches_e2bs_verification_snippet() {
        // Python, from E2B's docs: base64.b64encode(sha256((secret + payload).encode()).digest())
        // with + → -, / → _ and the = padding stripped.
        // The vector was computed with exactly that snippet; it has a `_`, so the alphabet is
        // the URL-safe one.
        assert_eq!(
            signature("whsec", b"{\"id\":\"1\"}"),
            "0HMmEh8smpFRypn6_sPljS8jXORYhlduxd0vX8priUY"
        );
        assert_ne!(signature("s", b"x"), signature("t", b"x"));
    }

    #[test]
    fn paging_keeps_e2bs_bounds() {
        assert_eq!(paging(None).unwrap(), (0, 10, false));
        assert_eq!(
            paging(Some("offset=5&limit=100&orderAsc=true")).unwrap(),
            (5, 100, true)
        );
        assert!(paging(Some("limit=0")).is_err());
        assert!(paging(Some("limit=101")).is_err());
        assert!(paging(Some("offset=-1")).is_err());
        assert!(paging(Some("orderAsc=yes")).is_err());
    }
}
