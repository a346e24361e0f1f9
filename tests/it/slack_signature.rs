//! Every Slack route refuses unsigned, forged, stale, future, malformed and oversized requests
//! before doing anything: nothing reaches the fake Slack and no call reaches E2B.

use crate::common::{TestApp, command_form, spawn_app, unix_now};
use sandbox_steward::slack::signature::sign;

/// A command that would call E2B and post to Slack if it were ever run.
fn pause_body(app: &TestApp) -> String {
    command_form("pause sbx1", "U0001", &app.slack.response_url("cmd"))
}

async fn send(
    app: &TestApp,
    path: &str,
    body: String,
    ts: Option<String>,
    sig: Option<String>,
) -> reqwest::Response {
    let mut req = app
        .http
        .post(app.url(path))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(body);
    if let Some(ts) = ts {
        req = req.header("x-slack-request-timestamp", ts);
    }
    if let Some(sig) = sig {
        req = req.header("x-slack-signature", sig);
    }
    req.send().await.unwrap()
}

/// Waits until no follow-up task of the app is running (a wrongly spawned one included), so
/// what it would have done is visible before the test looks.
pub(crate) async fn settled(app: &TestApp) {
    crate::common::wait_until("follow-up tasks to finish", || async {
        app.state.tasks.is_empty().then_some(())
    })
    .await
}

/// Nothing was posted to the fake Slack and E2B saw no call.
async fn assert_no_side_effects(app: &TestApp) {
    settled(app).await;
    assert!(
        app.slack.messages().is_empty(),
        "Slack saw {:?}",
        app.slack.messages()
    );
    let calls = app.e2b_calls().await;
    assert!(calls.values().all(|n| *n == 0), "E2B saw {calls:?}");
}

#[tokio::test]
async fn a_correctly_signed_command_is_accepted() {
    let app = spawn_app().await;
    let resp = app.post_command("help").await;
    assert_eq!(resp.status(), 200);
}

#[tokio::test]
async fn a_signature_in_upper_case_hex_is_accepted() {
    let app = spawn_app().await;
    let body = command_form("help", "U0001", &app.slack.response_url("cmd"));
    let ts = unix_now();
    let sig = app.sign(ts, body.as_bytes());
    let upper = format!("v0={}", sig["v0=".len()..].to_uppercase());
    let resp = send(
        &app,
        "/slack/commands",
        body,
        Some(ts.to_string()),
        Some(upper),
    )
    .await;
    assert_eq!(resp.status(), 200);
    let answer: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(answer["response_type"], "ephemeral");
}

#[tokio::test]
async fn a_request_signed_with_another_secret_is_refused_on_every_route() {
    let app = spawn_app().await;
    for path in ["/slack/commands", "/slack/interactions", "/slack/events"] {
        let body = pause_body(&app);
        let ts = unix_now();
        let forged = sign("someone-elses-secret", ts, body.as_bytes());
        let resp = send(&app, path, body, Some(ts.to_string()), Some(forged)).await;
        assert_eq!(resp.status(), 401, "{path}");
    }
    assert_no_side_effects(&app).await;
}

#[tokio::test]
async fn a_body_changed_after_signing_is_refused() {
    let app = spawn_app().await;
    let body = pause_body(&app);
    let ts = unix_now();
    let sig = app.sign(ts, body.as_bytes());
    let tampered = body.replace("pause", "resume");
    let resp = send(
        &app,
        "/slack/commands",
        tampered,
        Some(ts.to_string()),
        Some(sig),
    )
    .await;
    assert_eq!(resp.status(), 401);
    assert_no_side_effects(&app).await;
}

#[tokio::test]
async fn stale_and_future_timestamps_are_refused() {
    let app = spawn_app().await;
    for skew in [-301, -3600, 301, 3600] {
        let body = pause_body(&app);
        let ts = unix_now() + skew;
        let sig = app.sign(ts, body.as_bytes());
        let resp = send(
            &app,
            "/slack/commands",
            body,
            Some(ts.to_string()),
            Some(sig),
        )
        .await;
        assert_eq!(resp.status(), 401, "skew {skew}");
    }
    assert_no_side_effects(&app).await;
}

#[tokio::test]
async fn unsigned_and_malformed_requests_are_refused() {
    let app = spawn_app().await;
    let body = pause_body(&app);
    let ts = unix_now();
    let good = app.sign(ts, body.as_bytes());
    let cases = [
        (None, None),
        (Some(ts.to_string()), None),
        (None, Some(good.clone())),
        (Some("yesterday".to_owned()), Some(good.clone())),
        (Some(ts.to_string()), Some("v0=nothex".to_owned())),
        (Some(ts.to_string()), Some(good.replacen("v0=", "v1=", 1))),
        (
            Some(ts.to_string()),
            Some(good[..good.len() - 1].to_owned()),
        ),
        // The right length, one digit not hex.
        (
            Some(ts.to_string()),
            Some(format!("{}g", &good[..good.len() - 1])),
        ),
    ];
    for (ts, sig) in cases {
        let resp = send(
            &app,
            "/slack/commands",
            body.clone(),
            ts.clone(),
            sig.clone(),
        )
        .await;
        assert_eq!(resp.status(), 401, "ts {ts:?} sig {sig:?}");
        let json: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(json["error"], "invalid request");
    }
    assert_no_side_effects(&app).await;
}

#[tokio::test]
async fn an_oversized_body_is_refused_with_413_even_when_correctly_signed() {
    let app = spawn_app().await;
    let mut body = pause_body(&app);
    body.push_str(&format!("&padding={}", "x".repeat(70 * 1024)));
    let ts = unix_now();
    let sig = app.sign(ts, body.as_bytes());
    let resp = send(
        &app,
        "/slack/commands",
        body.clone(),
        Some(ts.to_string()),
        Some(sig.clone()),
    )
    .await;
    assert_eq!(resp.status(), 413);

    // Without a Content-Length (chunked), the limit is enforced while reading.
    let answer = send_chunked(&app, "/slack/commands", &body, ts, &sig, 8192).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert_no_side_effects(&app).await;
}

/// Sends a signed form body with `transfer-encoding: chunked`, `chunk` bytes per HTTP chunk, and
/// returns the whole answer. reqwest always knows the length of a buffered body, so this request
/// is written by hand.
async fn send_chunked(
    app: &TestApp,
    path: &str,
    body: &str,
    ts: i64,
    sig: &str,
    chunk: usize,
) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(("127.0.0.1", app.port))
        .await
        .unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/x-www-form-urlencoded\r\n\
         x-slack-request-timestamp: {ts}\r\nx-slack-signature: {sig}\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n"
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    for piece in body.as_bytes().chunks(chunk) {
        let framed = [format!("{:x}\r\n", piece.len()).as_bytes(), piece, b"\r\n"].concat();
        // The server may answer and close before the whole body is sent.
        if tcp.write_all(&framed).await.is_err() {
            break;
        }
    }
    let _ = tcp.write_all(b"0\r\n\r\n").await;
    let mut answer = String::new();
    let _ = tcp.read_to_string(&mut answer).await;
    answer
}

/// A body in many chunks is put back together before its signature is checked: a signed
/// `/sandbox help` sent 7 bytes per chunk is answered with the help.
#[tokio::test]
async fn a_signed_body_sent_in_many_chunks_is_read_whole() {
    let app = spawn_app().await;
    let body = command_form("help", "U0001", &app.slack.response_url("cmd"));
    let ts = unix_now();
    let sig = app.sign(ts, body.as_bytes());
    let answer = send_chunked(&app, "/slack/commands", &body, ts, &sig, 7).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("/sandbox list"), "{answer}");
}

#[tokio::test]
async fn a_bare_ssl_check_is_answered_without_a_signature() {
    let app = spawn_app().await;
    let resp = send(
        &app,
        "/slack/commands",
        "ssl_check=1&token=legacy".into(),
        None,
        None,
    )
    .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.text().await.unwrap(), "");
    assert_no_side_effects(&app).await;
}

#[tokio::test]
async fn an_ssl_check_carrying_a_command_still_needs_a_signature() {
    let app = spawn_app().await;
    let body = format!("ssl_check=1&{}", pause_body(&app));
    let resp = send(&app, "/slack/commands", body, None, None).await;
    assert_eq!(resp.status(), 401);
    assert_no_side_effects(&app).await;
}

#[tokio::test]
async fn without_a_configured_signing_secret_everything_is_refused() {
    let app = crate::common::spawn_app_with(crate::common::TestAppOptions {
        env: vec![("SLACK_SIGNING_SECRET".into(), "".into())],
        ..Default::default()
    })
    .await;
    // The test secret is empty too, so this is what a caller guessing "no secret" would send.
    let body = pause_body(&app);
    let ts = unix_now();
    let sig = sign("", ts, body.as_bytes());
    let resp = send(
        &app,
        "/slack/commands",
        body,
        Some(ts.to_string()),
        Some(sig),
    )
    .await;
    assert_eq!(resp.status(), 401);
    assert_no_side_effects(&app).await;
}

/// A flood of forged requests is refused every time, and costs one warning in the log, not one
/// each (`steward serve` as a process, so its log is its own; read from its stderr).
#[tokio::test]
async fn a_flood_of_forged_requests_is_refused_each_time_and_logged_as_one_warning() {
    let serve = crate::common::serve_process(&[
        ("RUST_LOG", "warn,sandbox_steward::startup=info"),
        ("SLACK_SIGNING_SECRET", "flood-test-signing-secret"),
    ])
    .await;
    let http = reqwest::Client::new();
    for n in 0..50 {
        let forged = http
            .post(serve.url("/slack/commands"))
            .header("content-type", "application/x-www-form-urlencoded")
            .header("x-slack-request-timestamp", unix_now().to_string())
            .header("x-slack-signature", format!("v0={n:064x}"))
            .body("command=%2Fsandbox&text=pause+sbx1")
            .send()
            .await
            .unwrap();
        assert_eq!(forged.status(), 401, "forged request {n}");
    }
    // Every refusal was logged (or not) before its answer was sent: what the log holds now is
    // all it will say about them.
    let rest = serve.stop().await;
    let warnings: Vec<&str> = rest
        .lines()
        .filter(|l| l.contains("request refused"))
        .collect();
    assert_eq!(warnings.len(), 1, "{warnings:#?}");
    assert!(warnings[0].contains("WARN"), "{}", warnings[0]);
    assert!(!rest.contains("flood-test-signing-secret"));
}
