//! The E2B simulator's lifecycle events over real sockets: every change it makes is an event in
//! `GET /events/sandboxes` (E2B's paging: `offset`, `limit` 1–100, newest first unless
//! `orderAsc=true`), registrations under `/events/webhooks`, and signed deliveries to a real
//! receiver, with the faults a receiver must survive: dropped, duplicated and delayed deliveries.
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use reqwest::Client;
use sandbox_steward::sim::e2b::{SimOptions, SimServer};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::common::poll_until;

const PATIENCE: Duration = Duration::from_secs(20);

async fn sim() -> SimServer {
    SimServer::start(SimOptions {
        sandboxes: 3,
        ..SimOptions::default()
    })
    .await
    .expect("the simulator starts")
}

async fn create(http: &Client, sim: &SimServer, owner: &str) -> String {
    let created: Value = http
        .post(format!("{}/sandboxes", sim.base_url()))
        .json(&json!({"templateID": "base", "timeout": 300, "metadata": {"owner": owner}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    created["sandboxID"].as_str().expect("an id").to_owned()
}

async fn events(http: &Client, url: &str) -> (StatusCode, Value) {
    let r = http.get(url).send().await.unwrap();
    let status = r.status();
    (status, r.json().await.unwrap_or(Value::Null))
}

fn types(page: &Value) -> Vec<String> {
    page.as_array()
        .expect("a list")
        .iter()
        .map(|e| e["type"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn every_change_is_an_event_listed_with_e2bs_paging() {
    let sim = sim().await;
    let http = Client::new();
    let base = sim.base_url();
    let (_, before) = events(&http, &format!("{base}/events/sandboxes")).await;
    assert_eq!(before, json!([]), "the seeded fleet predates the log");

    let id = create(&http, &sim, "dana").await;
    let ok = |r: reqwest::Response| assert!(r.status().is_success(), "{}", r.status());
    ok(http
        .post(format!("{base}/sandboxes/{id}/timeout"))
        .json(&json!({"timeout": 600}))
        .send()
        .await
        .unwrap());
    ok(http
        .post(format!("{base}/sandboxes/{id}/pause"))
        .send()
        .await
        .unwrap());
    ok(http
        .post(format!("{base}/sandboxes/{id}/resume"))
        .json(&json!({"timeout": 60}))
        .send()
        .await
        .unwrap());
    ok(http
        .delete(format!("{base}/sandboxes/{id}"))
        .send()
        .await
        .unwrap());
    let other = create(&http, &sim, "erin").await;

    let (status, newest) = events(&http, &format!("{base}/events/sandboxes")).await;
    assert_eq!(status, 200);
    assert_eq!(
        types(&newest),
        [
            "sandbox.lifecycle.created",
            "sandbox.lifecycle.killed",
            "sandbox.lifecycle.resumed",
            "sandbox.lifecycle.paused",
            "sandbox.lifecycle.updated",
            "sandbox.lifecycle.created",
        ],
        "newest first"
    );
    let first = &newest[5];
    assert_eq!(first["version"], "v1");
    assert_eq!(first["sandboxId"], id.as_str());
    assert_eq!(first["eventData"]["sandbox_metadata"]["owner"], "dana");
    for key in [
        "id",
        "sandboxBuildId",
        "sandboxExecutionId",
        "sandboxTeamId",
        "sandboxTemplateId",
        "timestamp",
    ] {
        assert!(first[key].is_string(), "{key} in {first}");
    }
    assert!(
        newest[4]["eventData"]["set_timeout"].is_string(),
        "an update says the new end: {}",
        newest[4]
    );
    assert_eq!(newest[0]["sandboxId"], other.as_str());

    let (_, page) = events(
        &http,
        &format!("{base}/events/sandboxes?orderAsc=true&offset=1&limit=2"),
    )
    .await;
    assert_eq!(
        types(&page),
        ["sandbox.lifecycle.updated", "sandbox.lifecycle.paused"]
    );
    let (_, one) = events(&http, &format!("{base}/events/sandboxes/{other}")).await;
    assert_eq!(types(&one), ["sandbox.lifecycle.created"]);
    for bad in ["limit=0", "limit=101", "offset=-1", "orderAsc=maybe"] {
        let (status, body) = events(&http, &format!("{base}/events/sandboxes?{bad}")).await;
        assert_eq!(status, 400, "{bad}: {body}");
    }
    // A sandbox ended by its timeout is an event too, without anyone calling the API.
    let short = create(&http, &sim, "frank").await;
    ok(http
        .post(format!("{base}/sandboxes/{short}/timeout"))
        .json(&json!({"timeout": 1}))
        .send()
        .await
        .unwrap());
    poll_until(PATIENCE, "the timeout's kill is an event", || {
        let (http, url) = (http.clone(), format!("{base}/events/sandboxes/{short}"));
        async move {
            let (_, page) = events(&http, &url).await;
            types(&page)
                .first()
                .is_some_and(|t| t == "sandbox.lifecycle.killed")
                .then_some(())
        }
    })
    .await;
}

/// A webhook receiver on a free port: every request's headers and body, answering `status`.
struct Receiver {
    url: String,
    got: Arc<Mutex<Vec<(HeaderMap, Bytes)>>>,
    status: Arc<Mutex<u16>>,
}

async fn receiver() -> Receiver {
    let got: Arc<Mutex<Vec<(HeaderMap, Bytes)>>> = Arc::default();
    let status = Arc::new(Mutex::new(200u16));
    let (g, s) = (got.clone(), status.clone());
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |headers: HeaderMap, body: Bytes| {
            let (g, s) = (g.clone(), s.clone());
            async move {
                g.lock().unwrap().push((headers, body));
                StatusCode::from_u16(*s.lock().unwrap()).unwrap()
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app).await });
    Receiver {
        url: format!("http://127.0.0.1:{port}/hook"),
        got,
        status,
    }
}

impl Receiver {
    fn bodies(&self) -> Vec<Value> {
        self.got
            .lock()
            .unwrap()
            .iter()
            .map(|(_, b)| serde_json::from_slice(b).unwrap())
            .collect()
    }
}

fn expected_signature(secret: &str, body: &[u8]) -> String {
    let mut hash = Sha256::new();
    hash.update(secret.as_bytes());
    hash.update(body);
    URL_SAFE_NO_PAD.encode(hash.finalize())
}

#[tokio::test]
async fn registered_webhooks_get_signed_deliveries_and_the_faults_a_receiver_must_survive() {
    let sim = sim().await;
    let http = Client::new();
    let base = sim.base_url();
    let rx = receiver().await;
    let secret = "whsec-sim-events-test";
    let created = http
        .post(format!("{base}/events/webhooks"))
        .json(&json!({
            "name": "steward", "url": rx.url, "enabled": true,
            "events": ["sandbox.lifecycle.created", "sandbox.lifecycle.killed"],
            "signatureSecret": secret,
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    let hook: Value = created.json().await.unwrap();
    let hook_id = hook["id"].as_str().unwrap().to_owned();
    assert!(
        hook.get("signatureSecret").is_none(),
        "the secret is never read back"
    );
    let listed: Value = http
        .get(format!("{base}/events/webhooks"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(listed[0]["id"], hook_id.as_str());
    assert!(!listed.to_string().contains(secret));

    // A plain delivery: signed as E2B's docs verify it, with E2B's headers.
    let id = create(&http, &sim, "dana").await;
    poll_until(PATIENCE, "the creation is delivered", || async {
        (!rx.bodies().is_empty()).then_some(())
    })
    .await;
    {
        let got = rx.got.lock().unwrap();
        let (headers, body) = &got[0];
        assert_eq!(headers["e2b-signature-version"], "v1");
        assert_eq!(headers["e2b-webhook-id"], hook_id.as_str());
        assert!(headers.contains_key("e2b-delivery-id"));
        assert_eq!(
            headers["e2b-signature"].to_str().unwrap(),
            expected_signature(secret, body)
        );
        let event: Value = serde_json::from_slice(body).unwrap();
        assert_eq!(event["type"], "sandbox.lifecycle.created");
        assert_eq!(event["sandboxId"], id.as_str());
    }
    // Pause is not subscribed: nothing is delivered for it.
    http.post(format!("{base}/sandboxes/{id}/pause"))
        .send()
        .await
        .unwrap();

    // Duplicate, then drop, then delay: the kill arrives twice, the next creation never, and a
    // delayed creation is overtaken by a later one.
    let fault = |body: Value| {
        let http = http.clone();
        let url = format!("{base}/_sim/webhooks/faults");
        async move {
            let r = http.post(url).json(&body).send().await.unwrap();
            assert_eq!(r.status(), 204);
        }
    };
    fault(json!({"duplicate": 1})).await;
    http.delete(format!("{base}/sandboxes/{id}"))
        .send()
        .await
        .unwrap();
    poll_until(PATIENCE, "the kill is delivered twice", || async {
        let kills = rx
            .bodies()
            .iter()
            .filter(|e| e["type"] == "sandbox.lifecycle.killed")
            .count();
        (kills == 2).then_some(())
    })
    .await;
    let bodies = rx.bodies();
    let kills: Vec<&Value> = bodies
        .iter()
        .filter(|e| e["type"] == "sandbox.lifecycle.killed")
        .collect();
    assert_eq!(kills[0]["id"], kills[1]["id"], "the same event, twice");

    fault(json!({"drop": 1})).await;
    let lost = create(&http, &sim, "erin").await;
    fault(json!({"delay": 1, "delay_ms": 1500})).await;
    let late = create(&http, &sim, "frank").await;
    let early = create(&http, &sim, "gus").await;
    poll_until(PATIENCE, "the delayed creation arrives last", || async {
        let ids: Vec<String> = rx
            .bodies()
            .iter()
            .filter(|e| e["type"] == "sandbox.lifecycle.created")
            .map(|e| e["sandboxId"].as_str().unwrap().to_owned())
            .collect();
        (ids.len() == 3).then_some(ids)
    })
    .await
    .iter()
    .zip([id.as_str(), early.as_str(), late.as_str()])
    .for_each(|(got, want)| assert_eq!(got, want, "out of order as asked"));
    let attempts: Value = http
        .get(format!("{base}/_sim/webhooks/deliveries"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(
        attempts["attempts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a["sandbox_id"] == lost.as_str() && a["outcome"] == "dropped"),
        "{attempts}"
    );
    let (_, logged) = events(&http, &format!("{base}/events/sandboxes/{lost}")).await;
    assert_eq!(
        types(&logged),
        ["sandbox.lifecycle.created"],
        "a dropped delivery is still in the events API, for a poller to find"
    );

    // A receiver failing gets retries, each with its own delivery id.
    fault(json!({"retry_interval_ms": 50})).await;
    *rx.status.lock().unwrap() = 500;
    let retried = create(&http, &sim, "hal").await;
    poll_until(PATIENCE, "four attempts for one event", || async {
        let n = rx
            .bodies()
            .iter()
            .filter(|e| e["sandboxId"] == retried.as_str())
            .count();
        (n == 4).then_some(())
    })
    .await;
    let delivery_ids: std::collections::HashSet<String> = rx
        .got
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, b)| String::from_utf8_lossy(b).contains(&retried))
        .map(|(h, _)| h["e2b-delivery-id"].to_str().unwrap().to_owned())
        .collect();
    assert_eq!(delivery_ids.len(), 4);

    // Disabled or deleted, nothing more is sent.
    let patched = http
        .patch(format!("{base}/events/webhooks/{hook_id}"))
        .json(&json!({"enabled": false}))
        .send()
        .await
        .unwrap();
    assert_eq!(patched.status(), 200);
    assert_eq!(
        http.delete(format!("{base}/events/webhooks/{hook_id}"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        http.get(format!("{base}/events/webhooks/{hook_id}"))
            .send()
            .await
            .unwrap()
            .status(),
        404
    );
    let bad = http
        .post(format!("{base}/events/webhooks"))
        .json(&json!({"url": "ftp://x", "signatureSecret": "s"}))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
}
