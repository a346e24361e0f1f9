//! Steward over Socket Mode, against the Slack simulator's Socket Mode and real sockets: a slash
//! command's ack carries the same immediate reply as the HTTP body, a click delivered as an
//! `interactive` envelope decides a case once, dropped sockets (with and without `disconnect`)
//! lose no decision and double none, a refused app token stops `steward serve` with a sentence
//! that never shows the token, two replicas each hold a connection and both receive, and while
//! Slack hands out no new connection `/readyz` says `connecting` until one is open again. Slack's
//! `disconnect` reasons are followed (`warning` keeps serving, `link_disabled` stops for good and
//! `/readyz` falls back to HTTP, `too_many_websockets` backs off), a token revoked later makes
//! `/readyz` say `refused`, a 429 waits its `Retry-After`, a modal's answer travels in the ack,
//! and socket traffic is counted in the same Slack request series as HTTP traffic.
use std::collections::BTreeSet;
use std::sync::Arc;

use sandbox_steward::cases::CaseState;
use sandbox_steward::config::Settings;
use sandbox_steward::ids::CaseId;
use sandbox_steward::sim::e2b::{SimOptions, SimServer};
use sandbox_steward::sim::slack::{SlackSim, SlackSimOptions};
use sandbox_steward::slack::socket::{Envelope, Outcome, SocketStatus};
use sandbox_steward::startup::Application;
use secrecy::SecretString;
use serde_json::{Value, json};

use crate::common::{
    APPROVALS, E2B_KEY, PATIENCE, PrefixCleanup, ServeProcess, TestApp, TestAppOptions,
    ThrowawayRedis, app_env, approvals_policy, case_id_in, eventually, get_json, hook,
    reason_submission, redis_url, serve_process, sim_socket_get, sim_socket_post, spawn_app_with,
    unique_prefix, visible_json_text, visible_text, wait_until,
};

const APP_TOKEN: &str = "xapp-1-A0SIM-steward-socket-test";

/// A Steward with `SLACK_APP_TOKEN` set, so it connects to the simulator's Socket Mode.
async fn spawn_socket_app() -> TestApp {
    spawn_app_with(TestAppOptions {
        sandboxes: 0,
        policy: Some(approvals_policy()),
        env: vec![("SLACK_APP_TOKEN".into(), APP_TOKEN.into())],
        ..TestAppOptions::default()
    })
    .await
}

/// A Steward in Socket Mode with no signing secret: nothing could reach it over HTTP.
async fn spawn_socket_app_without_signing_secret() -> TestApp {
    spawn_app_with(TestAppOptions {
        sandboxes: 0,
        policy: Some(approvals_policy()),
        env: vec![
            ("SLACK_APP_TOKEN".into(), APP_TOKEN.into()),
            ("SLACK_SIGNING_SECRET".into(), String::new()),
        ],
        ..TestAppOptions::default()
    })
    .await
}

/// Delivers an envelope on the next open connection, waiting until Steward holds one (the
/// simulator answers 409 `no_connection` while none is open); its envelope id.
async fn send(sim: &SlackSim, kind: &str, payload: Value) -> String {
    send_on(sim, kind, payload).await.0
}

/// [`send`], also saying which connection (the simulator's id) the envelope went to.
async fn send_on(sim: &SlackSim, kind: &str, payload: Value) -> (String, u64) {
    let body = json!({"type": kind, "payload": payload});
    wait_until("Steward holds a Socket Mode connection", || async {
        let (status, answer) = sim_socket_post(sim, "send", body.clone()).await;
        match status {
            200 => Some((
                answer["envelope_id"].as_str().unwrap().to_owned(),
                answer["connection"].as_u64().unwrap(),
            )),
            409 => None,
            _ => panic!("the simulator refused the envelope: {answer}"),
        }
    })
    .await
}

/// The simulator's open connections (their ids) and its `apps.connections.open` calls so far.
async fn sim_connections(sim: &SlackSim) -> (Vec<u64>, u64) {
    let body = sim_socket_get(&sim.base_url(), "connections").await;
    let open = body["open"]
        .as_array()
        .unwrap()
        .iter()
        .map(|id| id.as_u64().unwrap())
        .collect();
    (open, body["opens"].as_u64().unwrap())
}

async fn acks(sim: &SlackSim) -> Vec<Value> {
    serde_json::from_value(sim_socket_get(&sim.base_url(), "acks").await).unwrap()
}

/// The first ack of `envelope_id`, once there is one.
async fn ack_of(sim: &SlackSim, envelope_id: &str) -> Value {
    wait_until(&format!("the ack of {envelope_id}"), || async {
        acks(sim)
            .await
            .into_iter()
            .find(|a| a["envelope_id"] == envelope_id)
    })
    .await
}

/// A slash command's Socket Mode payload: the HTTP form's fields as JSON.
fn command_payload(text: &str, user: &str, response_url: &str) -> Value {
    json!({
        "token": "legacy-verification-token",
        "team_id": "T0001",
        "team_domain": "example",
        "channel_id": "C0001",
        "channel_name": "ops",
        "user_id": user,
        "user_name": "someone",
        "command": "/sandbox",
        "text": text,
        "api_app_id": "A0001",
        "is_enterprise_install": "false",
        "response_url": response_url,
        "trigger_id": "13345224609.738474920.8088930838d88f008e0",
    })
}

/// A click on `case`'s card, as its `interactive` payload (from the card, as Slack sends it).
async fn click_payload(
    app: &TestApp,
    case: &CaseId,
    action_id: &str,
    user: &str,
    action_ts: &str,
) -> Value {
    let card = app.state.store.get_case(case).await.unwrap().card.unwrap();
    json!({
        "type": "block_actions",
        "user": {"id": user},
        "trigger_id": format!("trigger-{}", hook()),
        "response_url": app.slack.response_url(&hook()),
        "container": {"type": "message", "channel_id": card.channel.as_str(), "message_ts": card.ts},
        "channel": {"id": card.channel.as_str()},
        "actions": [{"action_id": action_id, "block_id": "b", "value": case.as_str(), "action_ts": action_ts}],
    })
}

/// Opens a kill case for `sandbox` over Socket Mode; the ack says so at once.
async fn open_kill_case(app: &TestApp, sandbox: &str) -> CaseId {
    app.seed_sandbox(json!({"sandboxID": sandbox, "templateID": "base", "state": "running"}))
        .await;
    let reply = hook();
    let payload = command_payload(
        &format!("kill {sandbox} finished with it"),
        "U0001",
        &app.slack.response_url(&reply),
    );
    let id = send(&app.slack, "slash_commands", payload).await;
    let ack = ack_of(&app.slack, &id).await;
    assert!(
        visible_json_text(&ack["payload"]).contains("Opening a case"),
        "{ack}"
    );
    let text = visible_text(&app.wait_for_hook(&reply).await);
    assert!(text.contains("Opened case"), "{text}");
    case_id_in(&text)
}

async fn calls(app: &TestApp, op: &str) -> u64 {
    app.e2b.hooks().calls_of(op).await.unwrap()
}

async fn decisions(app: &TestApp, case: &CaseId) -> usize {
    app.state
        .store
        .audit_for_case(case)
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.action.starts_with("decide:"))
        .count()
}

async fn wait_done(app: &TestApp, case: &CaseId) {
    eventually("the case finishes", || async {
        matches!(
            app.state.store.get_case(case).await.unwrap().state,
            CaseState::Done { .. }
        )
    })
    .await;
}

#[tokio::test]
async fn a_slash_command_envelope_is_acked_with_the_same_reply_as_over_http() {
    let app = spawn_socket_app().await;
    let id = send(
        &app.slack,
        "slash_commands",
        command_payload("help", "U0001", &app.slack.response_url(&hook())),
    )
    .await;
    let ack = ack_of(&app.slack, &id).await;
    assert_eq!(ack["known"], true, "{ack}");
    let over_http: Value = app.post_command("help").await.json().await.unwrap();
    assert_eq!(ack["payload"], over_http, "the ack carries the HTTP body");
    assert_eq!(ack["payload"]["response_type"], "ephemeral");

    // A command that calls E2B is acknowledged with "Working on it…" and answered through the
    // response_url, exactly as over HTTP.
    let reply = hook();
    let id = send(
        &app.slack,
        "slash_commands",
        command_payload("list", "U0001", &app.slack.response_url(&reply)),
    )
    .await;
    let ack = ack_of(&app.slack, &id).await;
    assert!(
        visible_json_text(&ack["payload"]).contains("Working on it"),
        "{ack}"
    );
    let answer = app.wait_for_hook(&reply).await;
    assert!(answer.replace_original == Some(true), "{answer:?}");

    // A payload that is no slash command is acked (Slack stops delivering it) and does nothing.
    let id = send(&app.slack, "slash_commands", json!({"text": "help"})).await;
    let ack = ack_of(&app.slack, &id).await;
    assert!(ack.get("payload").is_none(), "{ack}");
    app.shutdown().await;
}

/// In Socket Mode nothing arrives over HTTP, so readiness does not ask for the signing secret:
/// it asks that the connection be up.
#[tokio::test]
async fn readiness_in_socket_mode_is_the_connection_not_the_signing_secret() {
    let app = spawn_socket_app_without_signing_secret().await;
    let ready = wait_until("/readyz says the Socket Mode connection is up", || async {
        let resp = app.http.get(app.url("/readyz")).send().await.unwrap();
        let status = resp.status().as_u16();
        let body: Value = resp.json().await.unwrap();
        (body["checks"]["slack_socket"] == "ok").then_some((status, body))
    })
    .await;
    assert_eq!(ready.0, 200, "{}", ready.1);
    assert_eq!(ready.1["ready"], true, "{}", ready.1);
    assert!(
        ready.1["checks"].get("slack_signing_secret").is_none(),
        "{}",
        ready.1
    );

    // The same app over HTTP would not be ready without the secret.
    let http_only = spawn_app_with(TestAppOptions {
        sandboxes: 0,
        env: vec![("SLACK_SIGNING_SECRET".into(), String::new())],
        ..TestAppOptions::default()
    })
    .await;
    let resp = http_only
        .http
        .get(http_only.url("/readyz"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 503);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["checks"]["slack_signing_secret"], "missing", "{body}");
    assert!(body["checks"].get("slack_socket").is_none(), "{body}");
}

async fn readiness(app: &TestApp) -> (u16, Value) {
    let resp = app.http.get(app.url("/readyz")).send().await.unwrap();
    (resp.status().as_u16(), resp.json().await.unwrap())
}

/// `/readyz`'s status and body once its `slack_socket` check says `state`.
async fn readiness_once_socket_is(app: &TestApp, state: &str) -> (u16, Value) {
    wait_until(&format!("/readyz says slack_socket {state}"), || async {
        let (status, body) = readiness(app).await;
        (body["checks"]["slack_socket"] == state).then_some((status, body))
    })
    .await
}

async fn metrics_text(app: &TestApp) -> String {
    let resp = app.http.get(app.url("/metrics")).send().await.unwrap();
    resp.text().await.unwrap()
}

/// A Socket Mode app whose first connection is up (`/readyz` says so).
async fn spawn_connected_socket_app() -> TestApp {
    let app = spawn_socket_app().await;
    readiness_once_socket_is(&app, "ok").await;
    app
}

/// `/sandbox help` sent as an envelope gets its reply in the ack (waiting for a connection).
async fn help_is_answered(app: &TestApp) {
    let id = send(
        &app.slack,
        "slash_commands",
        command_payload("help", "U0001", &app.slack.response_url(&hook())),
    )
    .await;
    assert!(ack_of(&app.slack, &id).await["payload"].is_object());
}

/// A dropped socket whose reopening fails (Slack's `apps.connections.open` answers 503): the
/// replica says it is not ready, and why, for as long as it has no connection; the failed opens
/// are counted; nothing can be delivered meanwhile; once Slack answers again it reconnects by
/// itself, is ready again and answers commands.
#[tokio::test]
async fn while_slack_opens_no_connection_readiness_says_connecting_then_recovers() {
    let app = spawn_connected_socket_app().await;

    let (code, answer) = sim_socket_post(&app.slack, "outage", json!({"on": true})).await;
    assert_eq!((code, &answer["outage"]), (200, &json!(true)), "{answer}");
    assert_eq!(sim_socket_post(&app.slack, "drop", json!({})).await.0, 200);
    let (status, body) = readiness_once_socket_is(&app, "connecting").await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["ready"], false, "{body}");
    assert_eq!(body["missing"], json!(["SLACK_APP_TOKEN"]), "{body}");
    for check in ["slack_bot_token", "e2b_api_key", "redis"] {
        assert_eq!(body["checks"][check], "ok", "{body}");
    }
    wait_until("a failed open is counted", || async {
        metrics_text(&app)
            .await
            .lines()
            .any(|l| {
                l.starts_with("steward_slack_socket_reconnects_total")
                    && l.contains("reason=\"open_failed\"")
            })
            .then_some(())
    })
    .await;
    // Still no connection: the simulator has nobody to deliver to.
    let (code, answer) = sim_socket_post(
        &app.slack,
        "send",
        json!({"type": "slash_commands", "payload": command_payload("help", "U0001", "")}),
    )
    .await;
    assert_eq!(code, 409, "{answer}");
    assert_eq!(readiness(&app).await.0, 503);

    assert_eq!(
        sim_socket_post(&app.slack, "outage", json!({"on": false}))
            .await
            .0,
        200
    );
    let (status, body) = readiness_once_socket_is(&app, "ok").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["ready"], true, "{body}");
    help_is_answered(&app).await;
    app.shutdown().await;
}

/// The simulator's outage switch takes `{"on": bool}` and nothing else; a bad body changes
/// nothing (the connection stays up and readiness with it).
#[tokio::test]
async fn the_outage_switch_refuses_a_body_it_cannot_read_and_changes_nothing() {
    let app = spawn_connected_socket_app().await;
    for body in [
        json!({}),
        json!({"on": "yes"}),
        json!({"on": true, "for": 3}),
    ] {
        let (code, answer) = sim_socket_post(&app.slack, "outage", body.clone()).await;
        assert_eq!(code, 400, "{body}: {answer}");
    }
    // Opens still work: a dropped socket comes back.
    assert_eq!(sim_socket_post(&app.slack, "drop", json!({})).await.0, 200);
    help_is_answered(&app).await;
    assert_eq!(readiness(&app).await.0, 200);
    app.shutdown().await;
}

#[tokio::test]
async fn a_click_delivered_as_an_interactive_envelope_decides_the_case_once() {
    let app = spawn_socket_app().await;
    let case = open_kill_case(&app, "sockvictim1").await;
    let ts = "1700000001.000100";
    let click = click_payload(&app, &case, "case_pause", "U0002", ts).await;
    let id = send(&app.slack, "interactive", click.clone()).await;
    let ack = ack_of(&app.slack, &id).await;
    assert!(
        ack.get("payload").is_none(),
        "a click's ack is empty: {ack}"
    );
    wait_done(&app, &case).await;
    // The same click again (Slack's redelivery of a click carries the same action_ts).
    let again = send(&app.slack, "interactive", click).await;
    ack_of(&app.slack, &again).await;
    eventually("the card shows the decision", || async {
        let card = app.state.store.get_case(&case).await.unwrap().card.unwrap();
        app.slack
            .message(card.channel.as_str(), &card.ts)
            .is_some_and(|m| visible_text(&m).contains("<@U0002> chose *Pause*"))
    })
    .await;
    assert_eq!(decisions(&app, &case).await, 1);
    assert_eq!(calls(&app, "pause").await, 1);
    app.shutdown().await;
}

/// An envelope carries what an HTTP request would, and is held to the same 64 KiB: a larger
/// payload is acknowledged bare (Slack stops delivering it), counted as refused, and changes
/// nothing; the same click at its normal size then decides the case.
#[tokio::test]
async fn a_payload_larger_than_an_http_body_may_be_is_acked_bare_and_changes_nothing() {
    let app = spawn_socket_app().await;
    let refused = || async {
        sample(
            &metrics_text(&app).await,
            "steward_slack_socket_envelopes_total",
            &["type=\"interactive\"", "outcome=\"refused\""],
        )
        .unwrap_or(0.0)
    };
    let before = refused().await;
    let padding = "x".repeat(70 * 1024);

    let mut help = command_payload("help", "U0001", &app.slack.response_url(&hook()));
    help["padding"] = json!(padding);
    let id = send(&app.slack, "slash_commands", help).await;
    let ack = ack_of(&app.slack, &id).await;
    assert!(ack.get("payload").is_none(), "help was answered: {ack}");

    let case = open_kill_case(&app, "sockhuge1").await;
    let click = click_payload(&app, &case, "case_pause", "U0002", "1700000009.000100").await;
    let mut padded = click.clone();
    padded["padding"] = json!(padding);
    let id = send(&app.slack, "interactive", padded).await;
    ack_of(&app.slack, &id).await;
    assert!(refused().await >= before + 1.0);
    assert_eq!(decisions(&app, &case).await, 0);
    assert!(matches!(
        app.state.store.get_case(&case).await.unwrap().state,
        CaseState::Pending
    ));

    let id = send(&app.slack, "interactive", click).await;
    ack_of(&app.slack, &id).await;
    wait_done(&app, &case).await;
    assert_eq!(decisions(&app, &case).await, 1);
    assert_eq!(calls(&app, "pause").await, 1);
    app.shutdown().await;
}

#[tokio::test]
async fn a_redelivered_envelope_is_acked_and_not_handled_again() {
    let app = spawn_socket_app().await;
    app.seed_sandbox(json!({"sandboxID": "sockget1", "templateID": "base", "state": "running"}))
        .await;
    let reply = hook();
    let envelope = |retry_attempt: u32| -> Envelope {
        serde_json::from_value(json!({
            "envelope_id": "5f0c7a36-0000-4000-8000-redelivered1",
            "type": "slash_commands",
            "payload": command_payload("get sockget1", "U0001", &app.slack.response_url(&reply)),
            "accepts_response_payload": true,
            "retry_attempt": retry_attempt,
            "retry_reason": if retry_attempt > 0 { "timeout" } else { "" },
        }))
        .unwrap()
    };
    let first = sandbox_steward::http::socket::answer(&app.state, envelope(0)).await;
    assert_eq!(first.outcome, Outcome::Handled);
    assert!(first.payload.is_some());
    app.wait_for_hook(&reply).await;
    let gets = calls(&app, "get").await;
    assert!(gets >= 1, "the command read the sandbox");
    let again = sandbox_steward::http::socket::answer(&app.state, envelope(1)).await;
    assert_eq!(again.outcome, Outcome::Duplicate);
    assert!(again.payload.is_none());
    assert_eq!(calls(&app, "get").await, gets, "the command ran once");
    assert_eq!(
        app.slack.hook_posts(&reply).len(),
        1,
        "and was answered once"
    );
    app.shutdown().await;
}

#[tokio::test]
async fn dropped_sockets_mid_stream_lose_no_decision_and_double_none() {
    let app = spawn_socket_app().await;
    let mut cases = Vec::new();
    for n in 0..6 {
        cases.push(open_kill_case(&app, &format!("sockdrop{n}")).await);
    }
    let mut sent = Vec::new();
    for (n, case) in cases.iter().enumerate() {
        let click =
            click_payload(&app, case, "case_pause", "U0002", &format!("17000000{n}.1")).await;
        sent.push(send(&app.slack, "interactive", click).await);
        // Every socket is dropped while clicks are still in flight: after the second with a
        // `disconnect` envelope first, after the fourth without one (the next send waits for
        // the new connection).
        match n {
            1 => assert_eq!(
                sim_socket_post(&app.slack, "drop", json!({"disconnect": true}))
                    .await
                    .0,
                200
            ),
            3 => assert_eq!(sim_socket_post(&app.slack, "drop", json!({})).await.0, 200),
            _ => {}
        }
    }
    for case in &cases {
        wait_done(&app, case).await;
    }
    // Every envelope is acked: on its own socket, or, when its ack died with that socket, on
    // the next connection as the acked duplicate of Slack's redelivery (as in
    // `an_ack_lost_with_its_socket_is_redelivered_and_acked_as_a_duplicate`).
    let acked = wait_until("every click envelope acked", || async {
        let all = acks(&app.slack).await;
        let acked: BTreeSet<String> = all
            .iter()
            .filter(|a| a["known"] == true)
            .filter_map(|a| a["envelope_id"].as_str().map(str::to_owned))
            .collect();
        sent.iter().all(|id| acked.contains(id)).then_some(all)
    })
    .await;
    let clicks: Vec<&Value> = acked
        .iter()
        .filter(|a| sent.iter().any(|id| a["envelope_id"] == id.as_str()))
        .collect();
    assert!(
        clicks.iter().all(|a| a.get("payload").is_none()),
        "a click's ack is empty: {clicks:?}"
    );
    for case in &cases {
        assert_eq!(decisions(&app, case).await, 1, "{case}");
    }
    assert_eq!(calls(&app, "pause").await, 6, "six clicks, six pauses");
    // After the drops the connection is back: a command still gets its reply.
    help_is_answered(&app).await;
    assert_eq!(calls(&app, "pause").await, 6);
    // The reconnects and the envelopes show in the metrics.
    let metrics = metrics_text(&app).await;
    let has = |series: &str, label: &str| {
        metrics
            .lines()
            .any(|l| l.starts_with(series) && l.contains(label))
    };
    for reason in ["reason=\"disconnect\"", "reason=\"dropped\""] {
        assert!(
            has("steward_slack_socket_reconnects_total", reason),
            "{metrics}"
        );
    }
    assert!(
        has(
            "steward_slack_socket_envelopes_total",
            "type=\"interactive\""
        ),
        "{metrics}"
    );
    app.shutdown().await;
}

/// The mid-stream reconnect made certain: the simulator drops the socket a click's ack was
/// written on before reading that ack (`lose_next_ack`), so the decision was taken but Slack
/// never heard so. Slack delivers the click again on Steward's next connection; the
/// redelivery is acked as a duplicate and the case is decided, and paused, once.
#[tokio::test]
async fn an_ack_lost_with_its_socket_is_redelivered_and_acked_as_a_duplicate() {
    let app = spawn_socket_app().await;
    let case = open_kill_case(&app, "socklost1").await;
    let (status, armed) = sim_socket_post(&app.slack, "drop", json!({"lose_next_ack": true})).await;
    assert_eq!(
        (status, armed["closed"].as_u64()),
        (200, Some(0)),
        "{armed}"
    );
    let click = click_payload(&app, &case, "case_pause", "U0002", "1700000300.000100").await;
    let (sent, first_connection) = send_on(&app.slack, "interactive", click).await;
    let ack = ack_of(&app.slack, &sent).await;
    let connections = sim_socket_get(&app.slack.base_url(), "connections").await;
    assert_eq!(
        connections["lost_acks"],
        json!([sent]),
        "the first ack died with its socket"
    );
    assert_eq!(ack["known"], true, "{ack}");
    assert!(
        ack["retry_attempt"].as_u64().unwrap() >= 1,
        "acked only once delivered again: {ack}"
    );
    assert_ne!(
        ack["connection"].as_u64().unwrap(),
        first_connection,
        "acked on the new connection: {ack}"
    );
    assert!(
        ack.get("payload").is_none(),
        "a click's ack is empty: {ack}"
    );
    wait_done(&app, &case).await;
    assert_eq!(decisions(&app, &case).await, 1, "decided once");
    assert_eq!(calls(&app, "pause").await, 1, "paused once");
    let acks_of_it = acks(&app.slack)
        .await
        .into_iter()
        .filter(|a| a["envelope_id"] == sent.as_str())
        .count();
    assert_eq!(acks_of_it, 1, "one ack read; the lost one was never read");
    app.shutdown().await;
}

/// Redis stopped under a Socket Mode replica: a click gets the same clear error as over HTTP
/// and E2B hears nothing. A help changes nothing, so it needs no exactly-once mark: its
/// redelivery is answered again, Redis or not (the rule for envelopes that are marked, a
/// redelivery acked bare while the store cannot say, is `http::socket`'s unit test).
#[tokio::test]
async fn with_redis_stopped_a_click_is_refused_clearly_and_a_help_is_answered_again() {
    let redis = ThrowawayRedis::start();
    let app = spawn_app_with(TestAppOptions {
        sandboxes: 0,
        policy: Some(approvals_policy()),
        env: vec![("SLACK_APP_TOKEN".into(), APP_TOKEN.into())],
        redis_url: Some(redis.url()),
        ..TestAppOptions::default()
    })
    .await;
    let case = open_kill_case(&app, "sockredis1").await;
    let reply = hook();
    let mut click = click_payload(&app, &case, "case_pause", "U0002", "1700000400.000100").await;
    click["response_url"] = json!(app.slack.response_url(&reply));
    drop(redis);
    app.e2b.hooks().reset_calls().await.unwrap();

    let id = send(&app.slack, "interactive", click).await;
    let ack = ack_of(&app.slack, &id).await;
    assert!(
        ack.get("payload").is_none(),
        "a click's ack is empty: {ack}"
    );
    let answer = visible_text(&app.wait_for_hook(&reply).await);
    assert!(
        answer.contains("can't reach its database (Redis)"),
        "{answer}"
    );

    // The ack of a help is lost with its socket; Slack delivers it again on the next one.
    let (status, armed) = sim_socket_post(&app.slack, "drop", json!({"lose_next_ack": true})).await;
    assert_eq!(status, 200, "{armed}");
    let help = command_payload("help", "U0001", &app.slack.response_url(&hook()));
    let id = send(&app.slack, "slash_commands", help).await;
    let ack = ack_of(&app.slack, &id).await;
    assert!(
        ack["retry_attempt"].as_u64().unwrap() >= 1,
        "acked only once delivered again: {ack}"
    );
    assert!(
        ack["payload"].to_string().contains("/sandbox"),
        "a help's redelivery is answered with the help: {ack}"
    );
    assert!(
        app.e2b_calls().await.values().all(|n| *n == 0),
        "{:?}",
        app.e2b_calls().await
    );
}

#[tokio::test]
async fn the_drop_switch_arms_a_lost_ack_only_on_its_own() {
    let app = spawn_socket_app().await;
    let (open, _) = wait_until("a connection", || async {
        let (open, opens) = sim_connections(&app.slack).await;
        (!open.is_empty()).then_some((open, opens))
    })
    .await;
    for body in [
        json!({"lose_next_ack": true, "disconnect": true}),
        json!({"lose_next_ack": true, "reason": "warning"}),
        json!({"lose_next_ack": "yes"}),
    ] {
        let (status, answer) = sim_socket_post(&app.slack, "drop", body.clone()).await;
        assert_eq!(status, 400, "{body}: {answer}");
    }
    // Nothing was armed or closed: a command is answered on the same connection.
    help_is_answered(&app).await;
    assert_eq!(sim_connections(&app.slack).await.0, open);
    let connections = sim_socket_get(&app.slack.base_url(), "connections").await;
    assert_eq!(connections["lost_acks"], json!([]));
    app.shutdown().await;
}

#[tokio::test]
async fn envelopes_a_dead_replica_never_acked_are_redelivered_and_handled_once() {
    use futures::StreamExt;
    let app = spawn_socket_app().await;
    let first = open_kill_case(&app, "sockdead0").await;
    let second = open_kill_case(&app, "sockdead1").await;
    // A second connection that reads envelopes and never acks them: a replica that dies holding
    // them. Deliveries alternate between it and Steward.
    let opened: Value = reqwest::Client::new()
        .post(format!("{}/apps.connections.open", app.slack.api_url()))
        .bearer_auth(APP_TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let (mut dead, _) = tokio_tungstenite::connect_async(opened["url"].as_str().unwrap())
        .await
        .unwrap();
    let mut sent = Vec::new();
    for (n, case) in [&first, &second].into_iter().enumerate() {
        let click =
            click_payload(&app, case, "case_pause", "U0002", &format!("17100000{n}.1")).await;
        sent.push(send(&app.slack, "interactive", click).await);
    }
    // The dead replica holds one of the two (after its hello), then goes away without an ack.
    let held = tokio::time::timeout(PATIENCE, async {
        loop {
            let frame = dead.next().await.expect("the socket stays open").unwrap();
            let Ok(text) = frame.to_text() else { continue };
            let v: Value = serde_json::from_str(text).unwrap_or_default();
            if let Some(id) = v.get("envelope_id").and_then(Value::as_str) {
                break id.to_owned();
            }
        }
    })
    .await
    .expect("the dead replica reads an envelope");
    assert!(sent.contains(&held), "{held} is one of {sent:?}");
    drop(dead);
    for case in [&first, &second] {
        wait_done(&app, case).await;
    }
    // Slack's redelivery (retry_attempt 1) reached Steward, which handled it and acked it.
    let ack = wait_until("the held envelope acked", || async {
        acks(&app.slack)
            .await
            .into_iter()
            .find(|a| a["envelope_id"] == held.as_str() && a["known"] == true)
    })
    .await;
    assert!(ack.get("payload").is_none(), "{ack}");
    assert_eq!(decisions(&app, &first).await, 1);
    assert_eq!(decisions(&app, &second).await, 1);
    assert_eq!(calls(&app, "pause").await, 2);
    app.shutdown().await;
}

/// `steward serve` with `SLACK_APP_TOKEN`: its exit status and everything it wrote.
async fn serve_with_app_token(sim: &SlackSim, token: &str) -> (Option<i32>, String) {
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_steward"))
        .arg("serve")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("RUST_LOG", "debug")
        .env("STEWARD_LISTEN", "127.0.0.1:0")
        .env("SLACK_API_URL", sim.api_url())
        .env("SLACK_BOT_TOKEN", "xoxb-test-bot-token")
        .env("SLACK_SIGNING_SECRET", "test-signing-secret")
        .env("SLACK_APP_TOKEN", token)
        .env("REDIS_URL", redis_url())
        .env("STEWARD_REDIS_PREFIX", unique_prefix())
        .current_dir(std::env::temp_dir())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(PATIENCE, child)
        .await
        .expect("steward serve stops on its own")
        .unwrap();
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), all)
}

#[tokio::test]
async fn a_refused_app_token_stops_serve_with_a_sentence_that_never_shows_the_token() {
    let sim = SlackSim::start(SlackSimOptions {
        app_token: Some(SecretString::from(APP_TOKEN.to_owned())),
        ..SlackSimOptions::default()
    })
    .await
    .unwrap();
    // Slack says invalid_auth: another app's token.
    let (code, out) = serve_with_app_token(&sim, "xapp-1-A0OTHER-SECRETPART").await;
    assert_eq!(code, Some(2), "{out}");
    assert!(
        out.contains("Slack refused SLACK_APP_TOKEN (invalid_auth)"),
        "{out}"
    );
    assert!(!out.contains("SECRETPART"), "the token leaked: {out}");
    // A bot token where the app token belongs is refused before anything is called.
    let (code, out) = serve_with_app_token(&sim, "xoxb-SECRETPART").await;
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("SLACK_APP_TOKEN is not valid"), "{out}");
    assert!(!out.contains("SECRETPART"), "the token leaked: {out}");
}

/// A replica started by hand, so the test can watch its Socket Mode connection.
struct Replica {
    status: SocketStatus,
    stop: tokio::sync::oneshot::Sender<()>,
    running: tokio::task::JoinHandle<anyhow::Result<()>>,
}

async fn start_replica(slack: &SlackSim, e2b: &SimServer, prefix: &str) -> Replica {
    let opts = TestAppOptions {
        env: vec![("SLACK_APP_TOKEN".into(), APP_TOKEN.into())],
        ..TestAppOptions::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let env = app_env(slack, e2b, &redis_url(), prefix, &opts, dir.path());
    let mut app = Application::build(Settings::load(&env).unwrap())
        .await
        .unwrap();
    // Only the Slack side is under test: no queue worker, no scheduled sweep.
    app.loops_mut().worker_enabled = false;
    app.set_sweep_every(None);
    let status = app.socket_status().expect("SLACK_APP_TOKEN is set");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(app.run_until_stopped(async {
        let _ = stopped.await;
    }));
    Replica {
        status,
        stop,
        running,
    }
}

#[tokio::test]
async fn two_replicas_each_hold_a_connection_and_both_receive() {
    sandbox_steward::telemetry::init("error");
    let slack = Arc::new(SlackSim::start(SlackSimOptions::default()).await.unwrap());
    let e2b = SimServer::start(SimOptions {
        api_key: Some(E2B_KEY.into()),
        ..SimOptions::default()
    })
    .await
    .unwrap();
    let cleanup = PrefixCleanup {
        url: redis_url(),
        prefix: unique_prefix(),
    };
    let a = start_replica(&slack, &e2b, &cleanup.prefix).await;
    let b = start_replica(&slack, &e2b, &cleanup.prefix).await;
    eventually("both replicas are connected", || async {
        a.status.connected() && b.status.connected()
    })
    .await;
    let mut sent = Vec::new();
    for _ in 0..4 {
        let payload = command_payload("help", "U0001", &slack.response_url(&hook()));
        sent.push(send(&slack, "slash_commands", payload).await);
    }
    for id in &sent {
        let ack = ack_of(&slack, id).await;
        assert!(ack["payload"].is_object(), "{ack}");
    }
    assert!(a.status.envelopes() >= 1, "replica A received nothing");
    assert!(b.status.envelopes() >= 1, "replica B received nothing");
    // Shutdown closes each socket cleanly: afterwards nobody is connected.
    for replica in [a, b] {
        let _ = replica.stop.send(());
        replica.running.await.unwrap().unwrap();
        assert!(!replica.status.connected());
    }
    eventually("the simulator has no connection left", || async {
        let body = json!({"type": "events_api", "payload": {"type": "event_callback"}});
        sim_socket_post(&slack, "send", body).await.0 == 409
    })
    .await;
}

#[test]
fn the_socket_mode_manifest_is_the_http_one_with_socket_mode_on_and_no_urls() {
    let read = |name: &str| {
        std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(name))
            .unwrap()
    };
    let (http, socket) = (read("manifest.yml"), read("manifest.socket.yml"));
    assert!(socket.contains("socket_mode_enabled: true"));
    assert!(http.contains("socket_mode_enabled: false"));
    assert!(
        !socket.contains("url:"),
        "Socket Mode needs no request URLs"
    );
    // Everything else the app declares is the same: command, usage hint, scopes, names.
    let declared = |text: &str| -> Vec<String> {
        text.lines()
            .map(str::trim)
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .filter(|l| !l.contains("url:") && !l.starts_with("socket_mode_enabled"))
            .filter(|l| !l.starts_with("request_url") && !l.starts_with("event_subscriptions"))
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(declared(&socket), declared(&http));
}

/// A modal's answer travels in the ack: the simulator marks `view_submission` envelopes as
/// accepting a payload (and a click's as not), so Steward's `response_action` reaches Slack.
#[tokio::test]
async fn a_reason_modal_submitted_over_socket_mode_is_answered_in_its_ack() {
    let app = spawn_socket_app().await;
    let case = open_kill_case(&app, "sockmodal1").await;
    let before = app.modals_opened().len();
    let click = click_payload(&app, &case, "case_leave", "U0005", "1700000099.000100").await;
    let clicked = send(&app.slack, "interactive", click).await;
    assert!(ack_of(&app.slack, &clicked).await.get("payload").is_none());
    let view = app.opened_modal(before).await;

    // An empty reason: the form stays open with the error under the field.
    let id = send(
        &app.slack,
        "interactive",
        reason_submission(&view, "U0005", "   ", None),
    )
    .await;
    let ack = ack_of(&app.slack, &id).await;
    assert_eq!(ack["payload"]["response_action"], "errors", "{ack}");
    assert!(ack["payload"]["errors"].is_object(), "{ack}");
    assert_eq!(
        app.state.store.get_case(&case).await.unwrap().state,
        CaseState::Pending
    );

    // A reason: the form closes (a bare ack) and the case is left.
    let id = send(
        &app.slack,
        "interactive",
        reason_submission(&view, "U0005", "demo on Friday", None),
    )
    .await;
    let ack = ack_of(&app.slack, &id).await;
    assert!(ack.get("payload").is_none(), "the modal closes: {ack}");
    eventually("the case is left", || async {
        matches!(
            app.state.store.get_case(&case).await.unwrap().state,
            CaseState::Left { .. }
        )
    })
    .await;
    assert_eq!(calls(&app, "kill").await, 0);
    app.shutdown().await;
}

/// Slack's `warning` comes seconds before it refreshes a connection: Steward keeps serving on
/// it (an envelope sent after the warning, on the same socket, is handled and acked there) and
/// opens nothing new until Slack's `refresh_requested`.
#[tokio::test]
async fn a_warning_does_not_drop_the_connection() {
    let app = spawn_connected_socket_app().await;
    let status = app.state.socket.clone().expect("Socket Mode is on");
    let (open, opens) = sim_connections(&app.slack).await;
    let [conn] = open[..] else {
        panic!("one connection: {open:?}")
    };
    let (code, answer) = sim_socket_post(&app.slack, "drop", json!({"reason": "warning"})).await;
    assert_eq!(code, 200, "{answer}");
    assert_eq!(answer["disconnects"], 1, "{answer}");

    // Written after the warning on the same socket, so Steward reads it only if it still
    // serves the connection.
    let payload = command_payload("help", "U0001", &app.slack.response_url(&hook()));
    let (id, sent_on) = send_on(&app.slack, "slash_commands", payload).await;
    assert_eq!(sent_on, conn);
    let ack = ack_of(&app.slack, &id).await;
    assert_eq!(ack["known"], true, "acked before any redelivery: {ack}");
    assert_eq!(ack["connection"], conn, "acked on its own socket: {ack}");
    assert!(ack["payload"].is_object(), "{ack}");
    assert_eq!(status.connections(), 1, "no reconnect");
    assert_eq!(sim_connections(&app.slack).await, (vec![conn], opens));

    // Then the refresh itself: a new connection, and the old one is closed.
    sim_socket_post(&app.slack, "drop", json!({"disconnect": true})).await;
    eventually("a second connection", || async {
        status.connections() == 2
    })
    .await;
    help_is_answered(&app).await;
    let (open, _) = sim_connections(&app.slack).await;
    assert!(!open.contains(&conn), "{open:?}");
    app.shutdown().await;
}

/// Slack sends `link_disabled` when Socket Mode is turned off for the app: Steward stops
/// connecting, says `disabled`, and is ready as an HTTP app is (the signing secret).
#[tokio::test]
async fn link_disabled_stops_reconnecting_and_readiness_falls_back_to_http() {
    let app = spawn_connected_socket_app().await;
    let (_, opens) = sim_connections(&app.slack).await;
    let (code, answer) =
        sim_socket_post(&app.slack, "drop", json!({"reason": "link_disabled"})).await;
    assert_eq!((code, &answer["closed"]), (200, &json!(1)), "{answer}");
    let (status, body) = readiness_once_socket_is(&app, "disabled").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["checks"]["slack_signing_secret"], "ok", "{body}");
    assert_eq!(body["ready"], true, "{body}");
    // Slack's requests come over HTTP now, and are answered.
    assert_eq!(app.post_command("help").await.status(), 200);
    let slack = app.slack.clone();
    app.shutdown().await;
    assert_eq!(
        sim_connections(&slack).await,
        (vec![], opens),
        "no apps.connections.open after link_disabled"
    );

    // Without a signing secret, nothing can take Slack's requests any more: not ready.
    let app = spawn_socket_app_without_signing_secret().await;
    readiness_once_socket_is(&app, "ok").await;
    sim_socket_post(&app.slack, "drop", json!({"reason": "link_disabled"})).await;
    let (status, body) = readiness_once_socket_is(&app, "disabled").await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["checks"]["slack_signing_secret"], "missing", "{body}");
    assert_eq!(body["missing"], json!(["SLACK_SIGNING_SECRET"]), "{body}");
    app.shutdown().await;
}

/// `too_many_websockets` is answered with a backoff, never at once.
#[tokio::test]
async fn too_many_websockets_reconnects_only_after_a_backoff() {
    let app = spawn_connected_socket_app().await;
    let (_, opens) = sim_connections(&app.slack).await;
    let asked = tokio::time::Instant::now();
    sim_socket_post(&app.slack, "drop", json!({"reason": "too_many_websockets"})).await;
    wait_until("Steward opens another connection", || async {
        (sim_connections(&app.slack).await.1 > opens).then_some(())
    })
    .await;
    // The backoff's first step is 0.5 s, jittered in its upper half.
    let waited = asked.elapsed();
    assert!(
        waited >= std::time::Duration::from_millis(250),
        "{waited:?}"
    );
    help_is_answered(&app).await;
    app.shutdown().await;
}

/// A token revoked while Steward runs: `/readyz` says `refused` (not "connecting") and the
/// refusals are counted; Steward keeps trying (at the longest backoff).
#[tokio::test]
async fn a_token_refused_while_running_makes_readiness_say_refused() {
    let app = spawn_connected_socket_app().await;
    let revoked = json!({"on": true, "error": "token_revoked"});
    assert_eq!(sim_socket_post(&app.slack, "outage", revoked).await.0, 200);
    assert_eq!(sim_socket_post(&app.slack, "drop", json!({})).await.0, 200);
    let (status, body) = readiness_once_socket_is(&app, "refused").await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["missing"], json!(["SLACK_APP_TOKEN"]), "{body}");
    let metrics = metrics_text(&app).await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("steward_slack_socket_reconnects_total")
                && l.contains("reason=\"refused\"")),
        "{metrics}"
    );
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("steward_slack_api_calls_total")
                && l.contains("method=\"apps.connections.open\"")
                && l.contains("outcome=\"refused\"")),
        "{metrics}"
    );
    app.shutdown().await;
}

/// A 429 from `apps.connections.open`: the next attempt waits at least its `Retry-After`.
#[tokio::test]
async fn a_rate_limited_open_waits_for_retry_after() {
    let app = spawn_connected_socket_app().await;
    let limited = json!({"on": true, "error": "ratelimited", "retry_after": 2});
    assert_eq!(sim_socket_post(&app.slack, "outage", limited).await.0, 200);
    let (_, opens) = sim_connections(&app.slack).await;
    sim_socket_post(&app.slack, "drop", json!({})).await;
    let calls_past = |n: u64| {
        let sim = app.slack.clone();
        async move {
            wait_until(&format!("{n} apps.connections.open calls"), || async {
                (sim_connections(&sim).await.1 >= n).then_some(())
            })
            .await;
            tokio::time::Instant::now()
        }
    };
    let limited_at = calls_past(opens + 1).await;
    let next_at = calls_past(opens + 2).await;
    let waited = next_at - limited_at;
    // 2 s, less what polling for the first call may have lost.
    assert!(
        waited >= std::time::Duration::from_millis(1800),
        "{waited:?}"
    );
    sim_socket_post(&app.slack, "outage", json!({"on": false})).await;
    readiness_once_socket_is(&app, "ok").await;
    app.shutdown().await;
}

/// A `steward serve` of its own (a process, so its metrics count only its own traffic), with
/// Socket Mode on.
async fn serve_socket_process(sim: &SlackSim) -> ServeProcess {
    let mut serve = serve_process(&[
        ("RUST_LOG", "info"),
        ("SLACK_API_URL", &sim.api_url()),
        ("SLACK_BOT_TOKEN", "xoxb-test-bot-token"),
        ("SLACK_APP_TOKEN", APP_TOKEN),
    ])
    .await;
    serve.drain_log();
    serve
}

/// The value of the series line that starts with `name` and has every one of `labels`.
fn sample(metrics: &str, name: &str, labels: &[&str]) -> Option<f64> {
    metrics
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .find(|l| labels.iter().all(|label| l.contains(label)))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// Slack traffic over the socket is counted in the same series as over HTTP, so alerts and
/// dashboards work in Socket Mode; `apps.connections.open` is counted as a Slack API call.
#[tokio::test]
async fn socket_traffic_is_counted_as_slack_requests() {
    let sim = SlackSim::start(SlackSimOptions::default()).await.unwrap();
    let serve = serve_socket_process(&sim).await;
    let mut sent = Vec::new();
    for _ in 0..2 {
        let payload = command_payload("help", "U0001", &sim.response_url(&hook()));
        sent.push(send(&sim, "slash_commands", payload).await);
    }
    // A payload that is no slash command, and an event.
    sent.push(send(&sim, "slash_commands", json!({"text": "help"})).await);
    let event = json!({"type": "event_callback", "event_id": "Ev0SOCKET", "event": {}});
    sent.push(send(&sim, "events_api", event).await);
    for id in &sent {
        ack_of(&sim, id).await;
    }
    let metrics = wait_until("the envelopes are counted", || async {
        let text = reqwest::get(serve.url("/metrics"))
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        let events = sample(
            &text,
            "steward_slack_requests_total",
            &["route=\"events\"", "outcome=\"2xx\""],
        );
        (events >= Some(1.0)).then_some(text)
    })
    .await;
    let requests = |route: &str, outcome: &str| {
        let labels = [
            format!("route=\"{route}\""),
            format!("outcome=\"{outcome}\""),
        ];
        let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
        sample(&metrics, "steward_slack_requests_total", &labels)
    };
    assert_eq!(requests("commands", "2xx"), Some(2.0), "{metrics}");
    assert_eq!(requests("commands", "4xx"), Some(1.0), "{metrics}");
    assert_eq!(requests("events", "2xx"), Some(1.0), "{metrics}");
    assert_eq!(
        sample(
            &metrics,
            "steward_slack_request_duration_seconds_count",
            &["route=\"commands\""]
        ),
        Some(3.0),
        "{metrics}"
    );
    let opened = sample(
        &metrics,
        "steward_slack_api_calls_total",
        &["method=\"apps.connections.open\"", "outcome=\"ok\""],
    );
    assert!(opened >= Some(1.0), "{metrics}");
    // The socket's own series is as it was.
    assert_eq!(
        sample(
            &metrics,
            "steward_slack_socket_envelopes_total",
            &["type=\"slash_commands\"", "outcome=\"handled\""]
        ),
        Some(2.0),
        "{metrics}"
    );
    serve.stop().await;
}

/// The simulator's page acts over Socket Mode while Steward holds a connection, as Slack sends
/// an app in Socket Mode everything over its sockets (the simulator has no `--steward-url`
/// here, so before it connected the page was read-only): a typed command's immediate reply comes
/// back in the ack and shows to the person, and a click on a card's button decides the case.
#[tokio::test]
async fn the_simulators_page_acts_over_the_socket_while_steward_is_connected() {
    let app = spawn_connected_socket_app().await;
    app.slack.add_person("U0001", "Ada (requester)");
    app.slack.add_person("U0002", "Bo (approver)");
    let sim = app.slack.base_url();
    let world = get_json(&format!("{sim}/_sim/world")).await;
    assert_eq!(world["interactive"], true, "the page takes actions");

    let acked_before = acks(&app.slack).await.len();
    let typed = app
        .http
        .post(format!("{sim}/_sim/act/command"))
        .json(&json!({"user": "U0001", "channel": APPROVALS, "text": "/sandbox help"}))
        .send()
        .await
        .unwrap();
    assert_eq!(typed.status(), 200);
    let typed: Value = typed.json().await.unwrap();
    assert_eq!(typed["shown"], "ephemeral", "{typed}");
    let acked = acks(&app.slack).await;
    let help = acked[acked_before..]
        .iter()
        .find(|a| a["payload"].is_object())
        .unwrap_or_else(|| panic!("no ack carried the help: {acked:?}"));
    assert!(
        visible_json_text(&help["payload"]).contains("/sandbox"),
        "{help}"
    );

    // The card's Pause button, where the page shows it, clicked by the approver.
    let case = open_kill_case(&app, "pagesocket01").await;
    let card = wait_until("the case records its card", || async {
        app.state.store.get_case(&case).await.ok()?.card
    })
    .await;
    let message = app
        .slack
        .message(card.channel.as_str(), &card.ts)
        .expect("the card is in the simulator's world");
    let blocks = message.blocks.expect("the card has blocks");
    let (block, element) = blocks
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .find_map(|(b, block)| {
            let elements = block["elements"].as_array()?;
            let e = elements
                .iter()
                .position(|e| e["action_id"] == "case_pause")?;
            Some((b, e))
        })
        .expect("the card has a Pause button");
    let clicked = app
        .http
        .post(format!("{sim}/_sim/act/click"))
        .json(&json!({
            "user": "U0002",
            "channel": card.channel.as_str(),
            "ts": card.ts,
            "block": block,
            "element": element,
        }))
        .send()
        .await
        .unwrap();
    let status = clicked.status();
    assert_eq!(status, 200, "{}", clicked.text().await.unwrap());
    wait_done(&app, &case).await;
    assert_eq!(decisions(&app, &case).await, 1);
}
