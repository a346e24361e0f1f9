//! Socket Mode in the Slack simulator, over real sockets: `apps.connections.open`, the
//! WebSocket's `hello`, envelopes and their acks, redelivery of an unacked envelope, dropped
//! sockets and reconnects, and several connections sharing the deliveries; `accepts_response_payload`
//! as Slack sets it, `disconnect` reasons (a `warning` closes nothing), outages that answer as a
//! revoked token or a rate limit, and the connections and `apps.connections.open` calls counted.
use std::collections::BTreeSet;

use futures::{SinkExt, StreamExt};
use sandbox_steward::sim::slack::{SlackSim, SlackSimOptions};
use secrecy::SecretString;
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream, connect_async};

use crate::common::{PATIENCE, sim_socket_get, sim_socket_post};

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

const APP_TOKEN: &str = "xapp-1-A0SIM-socket-test";

async fn start(app_token: Option<&str>) -> SlackSim {
    SlackSim::start(SlackSimOptions {
        app_token: app_token.map(|t| SecretString::from(t.to_owned())),
        ..SlackSimOptions::default()
    })
    .await
    .unwrap()
}

/// `apps.connections.open` with `token` (none when empty): Slack's JSON answer.
async fn open(sim: &SlackSim, token: &str) -> Value {
    let mut req = reqwest::Client::new().post(format!("{}/apps.connections.open", sim.api_url()));
    if !token.is_empty() {
        req = req.bearer_auth(token);
    }
    req.send().await.unwrap().json().await.unwrap()
}

/// Opens a connection and reads its `hello`.
async fn connect(sim: &SlackSim) -> (Ws, Value) {
    let answer = open(sim, APP_TOKEN).await;
    assert_eq!(answer["ok"], true, "{answer}");
    let url = answer["url"].as_str().unwrap();
    assert!(url.starts_with("ws://127.0.0.1:"), "{url}");
    let (mut ws, _) = connect_async(url).await.unwrap();
    let hello = next_json(&mut ws).await.expect("a hello frame");
    (ws, hello)
}

/// The next text frame as JSON; `None` when the socket closed.
async fn next_json(ws: &mut Ws) -> Option<Value> {
    loop {
        let frame = tokio::time::timeout(PATIENCE, ws.next())
            .await
            .expect("a frame within PATIENCE");
        match frame {
            Some(Ok(Message::Text(text))) => return Some(serde_json::from_str(&text).unwrap()),
            Some(Ok(Message::Close(_))) | Some(Err(_)) | None => return None,
            Some(Ok(_)) => {}
        }
    }
}

async fn ack(ws: &mut Ws, ack: Value) {
    ws.send(Message::text(ack.to_string())).await.unwrap();
}

async fn send(sim: &SlackSim, kind: &str, payload: Value) -> String {
    let (status, answer) =
        sim_socket_post(sim, "send", json!({"type": kind, "payload": payload})).await;
    assert_eq!(status, 200, "{answer}");
    answer["envelope_id"].as_str().unwrap().to_owned()
}

async fn acks(sim: &SlackSim) -> Vec<Value> {
    serde_json::from_value(sim_socket_get(&sim.base_url(), "acks").await).unwrap()
}

#[tokio::test]
async fn a_connection_says_hello_and_its_url_works_once() {
    let sim = start(None).await;
    let answer = open(&sim, APP_TOKEN).await;
    let url = answer["url"].as_str().unwrap().to_owned();
    let (mut ws, _) = connect_async(&url).await.unwrap();
    let hello = next_json(&mut ws).await.unwrap();
    assert_eq!(hello["type"], "hello", "{hello}");
    assert_eq!(hello["num_connections"], 1);
    let again = connect_async(&url).await;
    assert!(again.is_err(), "a used ticket must be refused");
}

#[tokio::test]
async fn tokens_other_than_the_app_token_are_refused() {
    let sim = start(Some(APP_TOKEN)).await;
    assert_eq!(open(&sim, "").await["error"], "not_authed");
    assert_eq!(
        open(&sim, "xoxb-bot-token").await["error"],
        "not_allowed_token_type"
    );
    let wrong = open(&sim, "xapp-1-A0SIM-another").await;
    assert_eq!(wrong, json!({"ok": false, "error": "invalid_auth"}));
    assert_eq!(open(&sim, APP_TOKEN).await["ok"], true);
    // No socket open, and bad bodies: clear errors, nothing queued.
    let (status, answer) =
        sim_socket_post(&sim, "send", json!({"type": "events_api", "payload": {}})).await;
    assert_eq!(
        (status, answer["error"].as_str()),
        (409, Some("no_connection"))
    );
    let (status, _) = sim_socket_post(&sim, "send", json!({"type": "nope", "payload": {}})).await;
    assert_eq!(status, 400);
    let (status, _) =
        sim_socket_post(&sim, "send", json!({"type": "interactive", "payload": 3})).await;
    assert_eq!(status, 400);
    assert!(acks(&sim).await.is_empty());
}

#[tokio::test]
async fn an_envelope_is_delivered_and_its_ack_recorded_with_the_payload() {
    let sim = start(None).await;
    let (mut ws, _) = connect(&sim).await;
    let payload = json!({"command": "/sandbox", "text": "help", "user_id": "U0ALICE01"});
    let id = send(&sim, "slash_commands", payload.clone()).await;
    let envelope = next_json(&mut ws).await.unwrap();
    assert_eq!(envelope["envelope_id"], id.as_str());
    assert_eq!(envelope["type"], "slash_commands");
    assert_eq!(envelope["payload"], payload);
    assert_eq!(envelope["accepts_response_payload"], true);
    assert_eq!(envelope["retry_attempt"], 0);
    let reply = json!({"response_type": "ephemeral", "text": "Usage: /sandbox …"});
    ack(&mut ws, json!({"envelope_id": id, "payload": reply})).await;
    let recorded =
        crate::common::wait_until("the ack", || async { acks(&sim).await.into_iter().next() })
            .await;
    assert_eq!(recorded["envelope_id"], id.as_str());
    assert_eq!(recorded["payload"], reply);
    assert_eq!(recorded["known"], true);
}

#[tokio::test]
async fn an_unacked_envelope_is_delivered_again_with_retry_attempt() {
    let sim = start(None).await;
    let (mut ws, _) = connect(&sim).await;
    let id = send(&sim, "interactive", json!({"type": "block_actions"})).await;
    let first = next_json(&mut ws).await.unwrap();
    assert_eq!(first["retry_attempt"], 0);
    let second = next_json(&mut ws).await.unwrap();
    assert_eq!(second["envelope_id"], id.as_str());
    assert_eq!(second["retry_attempt"], 1);
    assert_eq!(second["retry_reason"], "timeout");
    ack(&mut ws, json!({"envelope_id": id})).await;
    let recorded =
        crate::common::wait_until("the ack", || async { acks(&sim).await.into_iter().next() })
            .await;
    assert_eq!(recorded["envelope_id"], id.as_str());
    assert!(recorded.get("payload").is_none());
}

#[tokio::test]
async fn a_drop_closes_the_socket_and_a_new_connection_works() {
    let sim = start(None).await;
    let (mut ws, _) = connect(&sim).await;
    let (status, answer) = sim_socket_post(&sim, "drop", json!({"disconnect": true})).await;
    assert_eq!((status, answer["closed"].as_u64()), (200, Some(1)));
    let disconnect = next_json(&mut ws).await.unwrap();
    assert_eq!(disconnect["type"], "disconnect");
    assert_eq!(disconnect["reason"], "refresh_requested");
    assert!(next_json(&mut ws).await.is_none(), "the socket closes");

    let (mut ws, hello) = connect(&sim).await;
    assert_eq!(hello["type"], "hello");
    let id = send(
        &sim,
        "events_api",
        json!({"event": {"type": "app_mention"}}),
    )
    .await;
    assert_eq!(
        next_json(&mut ws).await.unwrap()["envelope_id"],
        id.as_str()
    );
    ack(&mut ws, json!({"envelope_id": id})).await;
    crate::common::wait_until("the ack", || async { acks(&sim).await.into_iter().next() }).await;
    // A plain drop sends no disconnect envelope first.
    sim_socket_post(&sim, "drop", json!({})).await;
    assert!(
        next_json(&mut ws).await.is_none(),
        "closed without a disconnect"
    );
}

#[tokio::test]
async fn two_connections_share_the_deliveries() {
    let sim = start(None).await;
    let (mut a, _) = connect(&sim).await;
    let (mut b, hello) = connect(&sim).await;
    assert_eq!(hello["num_connections"], 2);
    let mut sent = BTreeSet::new();
    for n in 0..4 {
        sent.insert(send(&sim, "slash_commands", json!({"text": format!("help {n}")})).await);
    }
    let mut seen = BTreeSet::new();
    for ws in [&mut a, &mut b] {
        for _ in 0..2 {
            let envelope = next_json(ws).await.unwrap();
            let id = envelope["envelope_id"].as_str().unwrap().to_owned();
            ack(ws, json!({"envelope_id": id})).await;
            seen.insert(id);
        }
    }
    assert_eq!(
        seen, sent,
        "each connection got two of the four, none twice"
    );
    let all = crate::common::wait_until("four acks", || async {
        let all = acks(&sim).await;
        (all.len() == 4).then_some(all)
    })
    .await;
    assert!(all.iter().all(|a| a["known"] == true), "{all:?}");
}

/// Delivers an envelope of `kind` and reads it off `ws`.
async fn delivered(sim: &SlackSim, ws: &mut Ws, kind: &str, payload: Value) -> Value {
    let id = send(sim, kind, payload).await;
    let envelope = next_json(ws).await.unwrap();
    assert_eq!(envelope["envelope_id"], id.as_str());
    ack(ws, json!({"envelope_id": id})).await;
    envelope
}

#[tokio::test]
async fn an_ack_may_carry_a_payload_only_where_slack_allows_one() {
    let sim = start(None).await;
    let (mut ws, _) = connect(&sim).await;
    let cases = [
        (
            "slash_commands",
            json!({"command": "/sandbox", "text": "help"}),
            true,
        ),
        (
            "interactive",
            json!({"type": "view_submission", "view": {}}),
            true,
        ),
        (
            "interactive",
            json!({"type": "block_suggestion", "value": "sb"}),
            true,
        ),
        (
            "interactive",
            json!({"type": "block_actions", "actions": []}),
            false,
        ),
        ("interactive", json!({"type": "view_closed"}), false),
        (
            "events_api",
            json!({"type": "event_callback", "event": {}}),
            false,
        ),
    ];
    for (kind, payload, accepts) in cases {
        let envelope = delivered(&sim, &mut ws, kind, payload.clone()).await;
        assert_eq!(
            envelope["accepts_response_payload"], accepts,
            "{kind} {payload}"
        );
    }
}

/// `GET /_sim/socket/connections`: the open connections' ids and the `apps.connections.open`
/// calls so far.
async fn connections(sim: &SlackSim) -> Value {
    sim_socket_get(&sim.base_url(), "connections").await
}

#[tokio::test]
async fn sends_and_acks_name_the_connection_and_opens_are_counted() {
    let sim = start(Some(APP_TOKEN)).await;
    assert_eq!(
        connections(&sim).await,
        json!({"open": [], "opens": 0, "lost_acks": []})
    );
    open(&sim, "xapp-1-A0SIM-another").await;
    let (mut ws, _) = connect(&sim).await;
    let now = connections(&sim).await;
    assert_eq!(now["opens"], 2, "a refused call counts too: {now}");
    let conn = now["open"][0].as_u64().unwrap();
    let (status, answer) = sim_socket_post(
        &sim,
        "send",
        json!({"type": "events_api", "payload": {"type": "event_callback"}}),
    )
    .await;
    assert_eq!((status, answer["connection"].as_u64()), (200, Some(conn)));
    let envelope = next_json(&mut ws).await.unwrap();
    ack(&mut ws, json!({"envelope_id": envelope["envelope_id"]})).await;
    let recorded =
        crate::common::wait_until("the ack", || async { acks(&sim).await.into_iter().next() })
            .await;
    assert_eq!(recorded["connection"].as_u64(), Some(conn), "{recorded}");
    drop(ws);
    crate::common::wait_until("the closed socket is gone", || async {
        (connections(&sim).await["open"] == json!([])).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_warning_leaves_the_socket_open_and_other_reasons_close_it() {
    let sim = start(None).await;
    let (mut ws, _) = connect(&sim).await;
    let (status, answer) = sim_socket_post(&sim, "drop", json!({"reason": "warning"})).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        (answer["closed"].as_u64(), answer["disconnects"].as_u64()),
        (Some(0), Some(1))
    );
    let warning = next_json(&mut ws).await.unwrap();
    assert_eq!(
        (warning["type"].as_str(), warning["reason"].as_str()),
        (Some("disconnect"), Some("warning"))
    );
    // Still open: the next envelope arrives on it.
    let envelope = delivered(
        &sim,
        &mut ws,
        "events_api",
        json!({"type": "event_callback"}),
    )
    .await;
    assert_eq!(envelope["type"], "events_api");

    // Bodies the route cannot read change nothing.
    for body in [
        json!({"reason": "bored"}),
        json!({"reason": 3}),
        json!({"disconnect": true, "why": "x"}),
    ] {
        let (status, answer) = sim_socket_post(&sim, "drop", body.clone()).await;
        assert_eq!(status, 400, "{body}: {answer}");
    }
    assert_eq!(connections(&sim).await["open"].as_array().unwrap().len(), 1);

    for reason in ["link_disabled", "too_many_websockets"] {
        let (status, answer) = sim_socket_post(&sim, "drop", json!({"reason": reason})).await;
        assert_eq!(
            (status, answer["closed"].as_u64()),
            (200, Some(1)),
            "{answer}"
        );
        let disconnect = next_json(&mut ws).await.unwrap();
        assert_eq!(disconnect["reason"], reason);
        assert!(
            next_json(&mut ws).await.is_none(),
            "{reason} closes the socket"
        );
        ws = connect(&sim).await.0;
    }
}

#[tokio::test]
async fn an_outage_can_answer_as_a_revoked_token_or_a_rate_limit() {
    let sim = start(None).await;
    let (status, answer) = sim_socket_post(
        &sim,
        "outage",
        json!({"on": true, "error": "token_revoked"}),
    )
    .await;
    assert_eq!(
        (status, &answer["error"]),
        (200, &json!("token_revoked")),
        "{answer}"
    );
    assert_eq!(
        open(&sim, APP_TOKEN).await,
        json!({"ok": false, "error": "token_revoked"})
    );
    sim_socket_post(
        &sim,
        "outage",
        json!({"on": true, "error": "ratelimited", "retry_after": 7}),
    )
    .await;
    let limited = reqwest::Client::new()
        .post(format!("{}/apps.connections.open", sim.api_url()))
        .bearer_auth(APP_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(limited.status().as_u16(), 429);
    assert_eq!(limited.headers()["retry-after"], "7");
    for body in [
        json!({"on": true, "error": "Not A Code"}),
        json!({"on": true, "error": "token_revoked", "retry_after": 3}),
    ] {
        let (status, answer) = sim_socket_post(&sim, "outage", body.clone()).await;
        assert_eq!(status, 400, "{body}: {answer}");
    }
    sim_socket_post(&sim, "outage", json!({"on": false})).await;
    assert_eq!(open(&sim, APP_TOKEN).await["ok"], true);
}

/// The page's command goes over an open connection as a `slash_commands` envelope with the form's
/// fields. A client that never acks gets the page a sentence within Slack's wait (as Slack shows
/// the person an error) and nothing is shown; an ack with a payload is shown as the reply.
#[tokio::test]
async fn the_pages_command_goes_over_the_socket_and_an_unacked_one_says_so() {
    let sim = start(Some(APP_TOKEN)).await;
    sim.add_person("U0ADA", "Ada");
    let (mut ws, _) = connect(&sim).await;
    let type_help = || {
        let url = format!("{}/_sim/act/command", sim.base_url());
        async move {
            reqwest::Client::new()
                .post(url)
                .json(&json!({"user": "U0ADA", "channel": "C0GENERAL", "text": "/sandbox help"}))
                .send()
                .await
                .unwrap()
        }
    };

    let unanswered = tokio::spawn(type_help());
    let first = next_json(&mut ws).await.expect("the command's envelope");
    assert_eq!(first["type"], "slash_commands", "{first}");
    assert_eq!(first["accepts_response_payload"], true, "{first}");
    assert_eq!(first["payload"]["command"], "/sandbox", "{first}");
    assert_eq!(first["payload"]["text"], "help", "{first}");
    assert_eq!(first["payload"]["user_id"], "U0ADA", "{first}");
    let refused = unanswered.await.unwrap();
    assert_eq!(refused.status(), 502);
    let said: Value = refused.json().await.unwrap();
    assert!(
        said["error"]
            .as_str()
            .is_some_and(|s| s.contains("did not acknowledge")),
        "{said}"
    );

    let answered = tokio::spawn(type_help());
    // The first envelope is delivered again meanwhile (retry_attempt 1…): the new one is the
    // next first delivery.
    let second = loop {
        let envelope = next_json(&mut ws)
            .await
            .expect("the second command's envelope");
        if envelope["retry_attempt"] == 0 {
            break envelope;
        }
        assert_eq!(envelope["envelope_id"], first["envelope_id"], "{envelope}");
    };
    ack(
        &mut ws,
        json!({"envelope_id": second["envelope_id"], "payload": {"text": "help, from the test"}}),
    )
    .await;
    let shown = answered.await.unwrap();
    assert_eq!(shown.status(), 200);
    let shown: Value = shown.json().await.unwrap();
    assert_eq!(shown["shown"], "ephemeral", "{shown}");
}
