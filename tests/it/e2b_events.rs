//! E2B's lifecycle webhook over real sockets: the E2B simulator delivers signed events to
//! `POST /e2b/webhook` of a running Steward, and a sandbox killed outside Steward closes its
//! waiting case within seconds, buttons gone, nothing run. Forged, unsigned, oversized,
//! malformed, replayed and late deliveries change nothing.
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::common::{
    APPROVALS, E2B_KEY, TestApp, TestAppOptions, case_id_in, hook, spawn_app_with, visible_text,
    wait_until,
};
use sandbox_steward::cases::CaseState;
use sandbox_steward::ids::CaseId;

const SECRET: &str = "whsec-steward-e2e";

fn policy() -> String {
    format!(
        r#"
[channels]
approvals = "{APPROVALS}"
[approvals.approvers]
kill = {{ users = ["U0002"] }}
leave = {{ anyone = true }}
"#
    )
}

async fn app(secret: Option<&str>) -> TestApp {
    spawn_app_with(TestAppOptions {
        sandboxes: 0,
        policy: Some(policy()),
        env: secret
            .map(|s| vec![("E2B_WEBHOOK_SECRET".to_owned(), s.to_owned())])
            .unwrap_or_default(),
        ..TestAppOptions::default()
    })
    .await
}

/// E2B's signature, computed here as E2B's docs verify it (not with Steward's code).
fn sign(secret: &str, body: &[u8]) -> String {
    let mut hash = Sha256::new();
    hash.update(secret.as_bytes());
    hash.update(body);
    URL_SAFE_NO_PAD.encode(hash.finalize())
}

async fn open_kill_case(app: &TestApp, sandbox: &str) -> CaseId {
    app.seed_sandbox(json!({"sandboxID": sandbox, "templateID": "base", "state": "running"}))
        .await;
    let name = hook();
    app.post_command_to(&format!("kill {sandbox} done with it"), &name)
        .await;
    let text = visible_text(&app.wait_for_hook(&name).await);
    assert!(text.contains("Opened case"), "{text}");
    case_id_in(&text)
}

async fn card_blocks(app: &TestApp, case: &CaseId) -> Value {
    let card = app.state.store.get_case(case).await.unwrap().card.unwrap();
    let message = app.slack.message(card.channel.as_str(), &card.ts).unwrap();
    message.blocks.unwrap_or(Value::Null)
}

fn has_buttons(blocks: &Value) -> bool {
    blocks
        .as_array()
        .is_some_and(|b| b.iter().any(|b| b["type"] == "actions"))
}

/// Steward's own E2B simulator, asked directly: what someone outside Steward does.
async fn e2b(app: &TestApp, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
    let mut req = app
        .http
        .request(method, format!("{}{path}", app.e2b.base_url()))
        .header("X-API-Key", E2B_KEY);
    if let Some(body) = body {
        req = req.json(&body);
    }
    let r = req.send().await.unwrap();
    assert!(r.status().is_success(), "{path}: {}", r.status());
    r.json().await.unwrap_or(Value::Null)
}

#[tokio::test]
async fn a_sandbox_killed_outside_steward_closes_its_waiting_case_and_the_card_loses_its_buttons() {
    // Two secrets, as while one is rotated: the registration uses the second.
    let app = app(Some(&format!("old-secret, {SECRET}"))).await;
    let case = open_kill_case(&app, "ioutside1").await;
    let card = card_blocks(&app, &case).await;
    assert!(has_buttons(&card), "a waiting case has buttons: {card}");
    e2b(
        &app,
        reqwest::Method::POST,
        "/events/webhooks",
        Some(json!({
            "name": "steward", "url": format!("{}/e2b/webhook", app.address), "enabled": true,
            "events": ["sandbox.lifecycle.killed", "sandbox.lifecycle.paused"],
            "signatureSecret": SECRET,
        })),
    )
    .await;

    let started = std::time::Instant::now();
    e2b(&app, reqwest::Method::DELETE, "/sandboxes/ioutside1", None).await;
    let closed = wait_until("the case is closed by the kill event", || async {
        let case = app.state.store.get_case(&case).await.unwrap();
        matches!(case.state, CaseState::EndedOutside { .. }).then_some(case)
    })
    .await;
    eprintln!(
        "e2b_events: kill at the simulator → case closed in {} ms",
        started.elapsed().as_millis()
    );
    let CaseState::EndedOutside { what, .. } = &closed.state else {
        unreachable!()
    };
    assert!(what.contains("killed outside Steward at"), "{what}");
    let blocks = wait_until("the card is rewritten", || async {
        let blocks = card_blocks(&app, &case).await;
        (!has_buttons(&blocks)).then_some(blocks)
    })
    .await;
    let text = blocks.to_string();
    assert!(text.contains("ended outside Steward"), "{text}");
    assert!(text.contains("Steward did nothing"), "{text}");
    let audit = app.state.store.audit_for_case(&case).await.unwrap();
    assert!(
        audit.iter().any(|a| a.action == "ended_outside"),
        "{audit:?}"
    );
    let calls = app.e2b_calls().await;
    assert_eq!(calls.get("kill").copied(), Some(1), "only the outside kill");
    let attempts =
        crate::common::get_json(&format!("{}/_sim/webhooks/deliveries", app.e2b.base_url())).await;
    assert!(
        attempts["attempts"]
            .as_array()
            .unwrap()
            .iter()
            .all(|a| a["outcome"] == "200"),
        "every delivery was accepted: {attempts}"
    );
}

fn event(id: &str, kind: &str, sandbox: &str, at: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "version": "v1", "id": id, "type": format!("sandbox.lifecycle.{kind}"),
        "eventData": {"sandbox_metadata": {"owner": "dana"}},
        "sandboxBuildId": "b", "sandboxExecutionId": "x", "sandboxId": sandbox,
        "sandboxTeamId": "t", "sandboxTemplateId": "base", "timestamp": at,
    }))
    .unwrap()
}

async fn deliver(app: &TestApp, body: &[u8], signature: Option<&str>) -> (u16, Value) {
    let mut req = app
        .http
        .post(format!("{}/e2b/webhook", app.address))
        .header("content-type", "application/json")
        .header("e2b-signature-version", "v1")
        .body(body.to_vec());
    if let Some(sig) = signature {
        req = req.header("e2b-signature", sig);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn forged_unsigned_oversized_malformed_replayed_and_late_deliveries_change_nothing() {
    let app = app(Some(SECRET)).await;
    let case = open_kill_case(&app, "ioutside2").await;
    let kill = event("ev-kill-1", "killed", "ioutside2", "2026-12-07T10:00:00Z");

    // Forged (another secret) and unsigned: refused before parsing, the case still waits.
    let (status, body) = deliver(&app, &kill, Some(&sign("not-the-secret", &kill))).await;
    assert_eq!(status, 401, "{body}");
    assert!(!body.to_string().contains(SECRET));
    assert_eq!(deliver(&app, &kill, None).await.0, 401);
    let tampered = event("ev-kill-1", "killed", "ioutside3", "2026-12-07T10:00:00Z");
    assert_eq!(
        deliver(&app, &tampered, Some(&sign(SECRET, &kill))).await.0,
        401,
        "a signature is for its own body only"
    );
    // Oversized and malformed (but signed).
    let huge = vec![b' '; 70 * 1024];
    assert_eq!(
        deliver(&app, &huge, Some(&sign(SECRET, &huge))).await.0,
        413
    );
    let junk = br#"{"id":"x"}"#;
    assert_eq!(deliver(&app, junk, Some(&sign(SECRET, junk))).await.0, 400);
    let state = app.state.store.get_case(&case).await.unwrap().state;
    assert_eq!(state, CaseState::Pending, "nothing above changed the case");

    // The real delivery, then the same delivery replayed: handled once.
    let (status, body) = deliver(&app, &kill, Some(&sign(SECRET, &kill))).await;
    assert_eq!((status, &body["ok"]), (200, &json!(true)), "{body}");
    wait_until("the case is closed", || async {
        let case = app.state.store.get_case(&case).await.unwrap();
        matches!(case.state, CaseState::EndedOutside { .. }).then_some(())
    })
    .await;
    let (status, body) = deliver(&app, &kill, Some(&sign(SECRET, &kill))).await;
    assert_eq!(status, 200);
    assert_eq!(body["duplicate"], true, "{body}");

    // Late: an older `resumed` event arrives after the kill: the case stays closed.
    let resumed = event(
        "ev-resume-0",
        "resumed",
        "ioutside2",
        "2026-12-07T09:00:00Z",
    );
    assert_eq!(
        deliver(&app, &resumed, Some(&sign(SECRET, &resumed)))
            .await
            .0,
        200
    );
    // The case is closed, so no case is about the sandbox any more: the event is counted as
    // such, and changes nothing.
    wait_until("the late event is handled", || async {
        let (_, samples) = crate::common::scrape::scrape(&app).await;
        let seen = crate::common::scrape::total(
            &samples,
            "steward_e2b_events_total",
            &[("event", "resumed"), ("outcome", "no_case")],
        );
        (seen >= 1.0).then_some(())
    })
    .await;
    let stored = app.state.store.get_case(&case).await.unwrap();
    assert!(
        matches!(stored.state, CaseState::EndedOutside { .. }),
        "{:?}",
        stored.state
    );
    let audit = app.state.store.audit_for_case(&case).await.unwrap();
    assert_eq!(
        audit.iter().filter(|a| a.action == "ended_outside").count(),
        1,
        "the replay did nothing: {audit:?}"
    );
    assert_eq!(app.e2b_calls().await.get("kill").copied().unwrap_or(0), 0);
}

#[tokio::test]
async fn without_a_secret_the_webhook_route_is_off() {
    let app = app(None).await;
    let kill = event("ev-1", "killed", "inone", "2026-12-07T10:00:00Z");
    let (status, body) = deliver(&app, &kill, Some(&sign("anything", &kill))).await;
    assert_eq!(status, 404, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("E2B_WEBHOOK_SECRET")
    );
}

#[tokio::test]
async fn the_poller_recovers_an_event_whose_webhook_delivery_was_dropped() {
    let app = spawn_app_with(TestAppOptions {
        sandboxes: 0,
        policy: Some(policy()),
        env: vec![("E2B_WEBHOOK_SECRET".to_owned(), SECRET.to_owned())],
        events_poll_every: Some(std::time::Duration::from_millis(300)),
        ..TestAppOptions::default()
    })
    .await;
    let case = open_kill_case(&app, "ioutside4").await;
    e2b(
        &app,
        reqwest::Method::POST,
        "/events/webhooks",
        Some(json!({
            "name": "steward", "url": format!("{}/e2b/webhook", app.address),
            "events": ["sandbox.lifecycle.killed"], "signatureSecret": SECRET,
        })),
    )
    .await;
    let r = app
        .http
        .post(format!("{}/_sim/webhooks/faults", app.e2b.base_url()))
        .json(&json!({"drop": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    e2b(&app, reqwest::Method::DELETE, "/sandboxes/ioutside4", None).await;
    wait_until("the poller closes the case", || async {
        let case = app.state.store.get_case(&case).await.unwrap();
        matches!(case.state, CaseState::EndedOutside { .. }).then_some(())
    })
    .await;
    let attempts =
        crate::common::get_json(&format!("{}/_sim/webhooks/deliveries", app.e2b.base_url())).await;
    let outcomes: Vec<&str> = attempts["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(outcomes, ["dropped"], "no delivery reached Steward");
    assert!(app.e2b_calls().await.get("events").copied().unwrap_or(0) >= 1);
}

#[tokio::test]
async fn a_replica_started_after_downtime_catches_up_from_the_events_api() {
    // No webhook and no poller while the sandbox is killed: as if Steward were down.
    let first = app(None).await;
    let case = open_kill_case(&first, "ioutside5").await;
    e2b(
        &first,
        reqwest::Method::DELETE,
        "/sandboxes/ioutside5",
        None,
    )
    .await;
    let state = first.state.store.get_case(&case).await.unwrap().state;
    assert_eq!(state, CaseState::Pending, "nobody has told Steward yet");
    // A replica that polls comes up and reads what it missed; a second one polling as well
    // changes nothing more (one lease, one handling per event id).
    let polling = || TestAppOptions {
        sandboxes: 0,
        policy: Some(policy()),
        events_poll_every: Some(std::time::Duration::from_millis(200)),
        ..TestAppOptions::default()
    };
    let second = first.spawn_peer(polling()).await;
    let third = first.spawn_peer(polling()).await;
    wait_until("the catch-up closes the case", || async {
        let case = second.state.store.get_case(&case).await.unwrap();
        matches!(case.state, CaseState::EndedOutside { .. }).then_some(())
    })
    .await;
    let audit = third.state.store.audit_for_case(&case).await.unwrap();
    assert_eq!(
        audit.iter().filter(|a| a.action == "ended_outside").count(),
        1,
        "{audit:?}"
    );
}

#[tokio::test]
async fn a_pause_or_a_new_timeout_outside_steward_is_noted_on_the_waiting_card_and_an_older_event_is_not()
 {
    let app = app(Some(SECRET)).await;
    let case = open_kill_case(&app, "ioutside6").await;
    e2b(
        &app,
        reqwest::Method::POST,
        "/events/webhooks",
        Some(json!({
            "name": "steward", "url": format!("{}/e2b/webhook", app.address),
            "events": ["sandbox.lifecycle.updated", "sandbox.lifecycle.paused"],
            "signatureSecret": SECRET,
        })),
    )
    .await;
    // An event from before the case was opened changes nothing on it.
    let old = event(
        "ev-old-pause",
        "paused",
        "ioutside6",
        "2020-01-01T00:00:00Z",
    );
    assert_eq!(deliver(&app, &old, Some(&sign(SECRET, &old))).await.0, 200);
    e2b(
        &app,
        reqwest::Method::POST,
        "/sandboxes/ioutside6/timeout",
        Some(json!({"timeout": 3600})),
    )
    .await;
    e2b(
        &app,
        reqwest::Method::POST,
        "/sandboxes/ioutside6/pause",
        None,
    )
    .await;
    let stored = wait_until("both changes are noted", || async {
        let case = app.state.store.get_case(&case).await.unwrap();
        (case.notes.len() >= 2).then_some(case)
    })
    .await;
    assert_eq!(stored.state, CaseState::Pending, "the case still waits");
    assert_eq!(stored.notes.len(), 2, "{:?}", stored.notes);
    let notes: Vec<&str> = stored.notes.iter().map(|n| n.text.as_str()).collect();
    assert!(
        notes.iter().any(|n| n.contains("timeout was changed")),
        "{notes:?}"
    );
    assert!(
        notes.iter().any(|n| n.contains("was paused at")),
        "{notes:?}"
    );
    assert!(!notes.iter().any(|n| n.contains("2020-01-01")), "{notes:?}");
    assert_eq!(stored.evidence.state.as_deref(), Some("paused"));
    let text = wait_until("the card shows the pause", || async {
        let text = card_blocks(&app, &case).await.to_string();
        text.contains("was paused at").then_some(text)
    })
    .await;
    assert!(
        has_buttons(&serde_json::from_str(&text).unwrap()),
        "still decidable"
    );
}
