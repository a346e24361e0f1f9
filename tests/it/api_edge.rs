//! What a request to the agent API may cost Steward, over real TCP: a token without a route's
//! action is refused before its body is read, the bodies held at once fit a budget
//! (`STEWARD_BODY_BUDGET`), an output offset past the end is an empty answer, Redis refusing
//! Steward is a 503 with no Redis text, every error under `/api/v1` is the documented JSON (405
//! and the request timeout's 408 included), and a flood of bad tokens is one warning in the log.
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::api::{
    AGENT_TOKEN, READER_TOKEN, REPORTER_TOKEN, RUNNER_TOKEN, api_get, api_policy, expect_error,
};
use crate::common::{PATIENCE, TestApp, TestAppOptions, poll_until, spawn_app_with};

/// The most a test waits for an answer the server owes; never a timing assertion.
const DEADLINE: Duration = Duration::from_secs(20);
/// The largest body the API takes.
const MAX_BODY: usize = 16 * 1024 * 1024;

async fn app_with(env: &[(&str, &str)]) -> TestApp {
    spawn_app_with(TestAppOptions {
        policy: Some(api_policy()),
        sandboxes: 1,
        worker: false,
        env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..TestAppOptions::default()
    })
    .await
}

async fn connect(app: &TestApp) -> TcpStream {
    TcpStream::connect(("127.0.0.1", app.port)).await.unwrap()
}

/// The head of a POST with `token` that announces `length` body bytes.
fn post_head(path: &str, token: &str, length: usize) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nhost: steward\r\nauthorization: Bearer {token}\r\n\
         content-type: application/json\r\ncontent-length: {length}\r\n\r\n"
    )
}

/// Reads an answer's head and as much of its body as `content-length` says, failing the test if
/// it has not arrived by the deadline.
async fn read_answer(stream: &mut TcpStream) -> (u16, String) {
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    tokio::time::timeout(DEADLINE, async {
        loop {
            let text = String::from_utf8_lossy(&seen).into_owned();
            if let Some(end) = text.find("\r\n\r\n") {
                let length = text[..end]
                    .lines()
                    .find_map(|l| {
                        let (name, value) = l.split_once(':')?;
                        name.eq_ignore_ascii_case("content-length")
                            .then(|| value.trim().parse::<usize>().ok())?
                    })
                    .unwrap_or(0);
                if seen.len() >= end + 4 + length {
                    return;
                }
            }
            let n = stream.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed without a whole answer: {text:?}");
            seen.extend_from_slice(&buf[..n]);
        }
    })
    .await
    .expect("the server answered in time");
    let text = String::from_utf8_lossy(&seen).into_owned();
    let status = text[9..12].parse().unwrap();
    (status, text)
}

#[tokio::test]
async fn a_token_without_the_routes_action_is_refused_before_its_body_is_read() {
    // Had Steward read the body first, these requests would wait for 16 MiB that never come and
    // end as the body deadline's 408, not as the 403 the token has coming.
    let app = app_with(&[("STEWARD_BODY_TIMEOUT", "3s")]).await;
    for (path, token, action) in [
        ("/api/v1/runs", READER_TOKEN, "`run`"),
        (
            "/api/v1/test-failures",
            AGENT_TOKEN,
            "`report_test_failure`",
        ),
        ("/api/v1/cases", RUNNER_TOKEN, "`request_kill`"),
        ("/mcp", REPORTER_TOKEN, "`run`"),
    ] {
        let mut stream = connect(&app).await;
        stream
            .write_all(post_head(path, token, MAX_BODY).as_bytes())
            .await
            .unwrap();
        stream.write_all(b"{\"template\": ").await.unwrap();
        let (status, answer) = read_answer(&mut stream).await;
        assert_eq!(status, 403, "{path}: {answer}");
        assert!(
            answer.contains("\"forbidden\"") && answer.contains(action),
            "{answer}"
        );
    }
    // A token that may run is let through to the body, which then never arrives.
    let mut stream = connect(&app).await;
    stream
        .write_all(post_head("/api/v1/runs", AGENT_TOKEN, MAX_BODY).as_bytes())
        .await
        .unwrap();
    stream.write_all(b"{\"template\": ").await.unwrap();
    let (status, answer) = read_answer(&mut stream).await;
    assert_eq!(status, 408, "{answer}");
    assert!(answer.contains("\"timeout\""), "{answer}");
}

/// Sends `length` announced bytes to `path`, `sent` of them now, and leaves the connection open.
async fn hold_body(
    app: &TestApp,
    path: &str,
    token: &str,
    length: usize,
    sent: usize,
) -> TcpStream {
    let mut stream = connect(app).await;
    stream
        .write_all(post_head(path, token, length).as_bytes())
        .await
        .unwrap();
    stream.write_all(&vec![b' '; sent]).await.unwrap();
    stream
}

#[tokio::test]
async fn bodies_held_at_once_fit_the_budget_and_one_over_it_is_a_503_with_retry_after() {
    let app = app_with(&[
        ("STEWARD_BODY_BUDGET", "25MiB"),
        ("STEWARD_BODY_TIMEOUT", "1h"),
        ("GITHUB_WEBHOOK_SECRET", "budget-test-secret"),
    ])
    .await;
    // 15 MiB of a 16 MiB body arrive, and the rest does not: Steward holds 15 MiB of its 25.
    let held = hold_body(&app, "/api/v1/runs", AGENT_TOKEN, MAX_BODY, 15 << 20).await;
    // Once those bytes have been read, a 12 MiB body does not fit.
    let twelve = vec![b' '; 12 << 20];
    let resp = poll_until(PATIENCE, "a body over the budget is refused", || async {
        let resp = app
            .http
            .post(app.url("/api/v1/runs"))
            .bearer_auth(AGENT_TOKEN)
            .header("content-type", "application/json")
            .body(twelve.clone())
            .send()
            .await
            .unwrap();
        (resp.status() == StatusCode::SERVICE_UNAVAILABLE).then_some(resp)
    })
    .await;
    let wait: u64 = resp.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(wait >= 1, "{wait}");
    let error = expect_error(resp, StatusCode::SERVICE_UNAVAILABLE, "unavailable").await;
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("STEWARD_BODY_BUDGET"),
        "{error}"
    );
    // The same budget bounds GitHub's deliveries and `/mcp`'s bodies.
    let resp = app
        .http
        .post(app.url("/github/webhook"))
        .header("x-github-event", "push")
        .body(twelve.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(resp.headers().contains_key("retry-after"));
    let body: Value = resp.json().await.unwrap();
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("STEWARD_BODY_BUDGET"),
        "{body}"
    );
    let resp = app
        .http
        .post(app.url("/mcp"))
        .bearer_auth(AGENT_TOKEN)
        .header("accept", "application/json, text/event-stream")
        .header("content-type", "application/json")
        .body(twelve.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    expect_error(resp, StatusCode::SERVICE_UNAVAILABLE, "unavailable").await;

    // When the held request ends, its bytes are free again: the 12 MiB body is read (and
    // refused for what it is, blank JSON, not for want of room).
    drop(held);
    let resp = poll_until(PATIENCE, "the budget is free again", || async {
        let resp = app
            .http
            .post(app.url("/api/v1/runs"))
            .bearer_auth(AGENT_TOKEN)
            .header("content-type", "application/json")
            .body(twelve.clone())
            .send()
            .await
            .unwrap();
        (resp.status() != StatusCode::SERVICE_UNAVAILABLE).then_some(resp)
    })
    .await;
    expect_error(resp, StatusCode::UNPROCESSABLE_ENTITY, "invalid").await;
}

#[tokio::test]
async fn an_output_offset_past_the_end_is_an_empty_answer_and_a_bad_one_names_the_field() {
    let app = app_with(&[]).await;
    let resp = app
        .http
        .post(app.url("/api/v1/runs"))
        .bearer_auth(AGENT_TOKEN)
        .json(&json!({"template": "base", "command": "echo hi"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    let id = resp.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    for from in [
        "9223372036854775807",
        "18446744073709551615",
        "1099511627777",
    ] {
        let resp = api_get(
            &app,
            &format!("/api/v1/runs/{id}/output?from={from}"),
            Some(AGENT_TOKEN),
        )
        .await;
        assert_eq!(resp.status(), 200, "from={from}");
        assert_eq!(resp.headers()["x-next-offset"], "0");
        assert_eq!(resp.text().await.unwrap(), "");
    }
    for from in ["-1", "abc", "18446744073709551616"] {
        let resp = api_get(
            &app,
            &format!("/api/v1/runs/{id}/output?from={from}"),
            Some(AGENT_TOKEN),
        )
        .await;
        let error = expect_error(resp, StatusCode::UNPROCESSABLE_ENTITY, "invalid").await;
        assert_eq!(error["field"], "from", "{error}");
    }
}

/// A `redis-server` that wants a password, and an ACL user that may only `PING`.
struct LockedRedis {
    child: std::process::Child,
    port: u16,
}

impl LockedRedis {
    fn start() -> Self {
        let port = crate::common::free_port();
        let child = std::process::Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .args(["--requirepass", "the-right-password"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("redis-server must be installed for this test");
        let server = Self { child, port };
        let url = format!("redis://:the-right-password@127.0.0.1:{port}");
        let ready = crate::common::poll_for_blocking(Duration::from_secs(5), || {
            let Ok(client) = redis::Client::open(url.as_str()) else {
                return false;
            };
            let Ok(mut conn) = client.get_connection() else {
                return false;
            };
            redis::cmd("ACL")
                .arg("SETUSER")
                .arg("pinger")
                .arg("on")
                .arg(">pinger-password")
                .arg("~*")
                .arg("+ping")
                .arg("+hello")
                .arg("+client")
                .query::<String>(&mut conn)
                .is_ok()
        });
        assert!(ready, "the locked redis-server never answered");
        server
    }

    fn url(&self, userinfo: &str) -> String {
        format!("redis://{userinfo}127.0.0.1:{}", self.port)
    }
}

impl Drop for LockedRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn redis_refusing_steward_is_a_503_with_a_sentence_and_no_redis_text() {
    let redis = LockedRedis::start();
    for userinfo in [
        "",                        // NOAUTH
        ":a-wrong-password@",      // WRONGPASS
        "pinger:pinger-password@", // NOPERM
    ] {
        let app = spawn_app_with(TestAppOptions {
            policy: Some(api_policy()),
            redis_url: Some(redis.url(userinfo)),
            worker: false,
            ..TestAppOptions::default()
        })
        .await;
        let asks = [
            app.http
                .get(app.url("/api/v1/runs/run_anyrun"))
                .bearer_auth(AGENT_TOKEN),
            app.http
                .get(app.url("/api/v1/runs/run_anyrun/output?from=0"))
                .bearer_auth(AGENT_TOKEN),
            app.http
                .get(app.url("/api/v1/cases/case_anycase"))
                .bearer_auth(AGENT_TOKEN),
            app.http
                .post(app.url("/api/v1/runs"))
                .bearer_auth(AGENT_TOKEN)
                .json(&json!({"template": "base", "command": "ls"})),
        ];
        for ask in asks {
            let resp = ask.send().await.unwrap();
            let text = resp.text().await.unwrap();
            for redis_word in ["NOAUTH", "WRONGPASS", "NOPERM", "ERR", "password", "pinger"] {
                assert!(!text.contains(redis_word), "{userinfo}: {text}");
            }
            let body: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(body["error"]["code"], "unavailable", "{userinfo}: {text}");
            assert!(
                body["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("database"),
                "{text}"
            );
        }
    }
}

#[tokio::test]
async fn every_error_under_the_api_is_its_json_and_a_405_elsewhere_says_why() {
    // E2B that accepts connections and never answers: a fleet read outlives the request timeout.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_url = format!("http://{}", silent.local_addr().unwrap());
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((stream, _)) = silent.accept().await {
            open.push(stream);
        }
    });
    let app = app_with(&[
        ("STEWARD_REQUEST_TIMEOUT", "2s"),
        ("E2B_API_URL", silent_url.as_str()),
        ("E2B_REQUEST_TIMEOUT", "1h"),
    ])
    .await;

    let resp = api_get(&app, "/api/v1/test-failures", Some(AGENT_TOKEN)).await;
    assert_eq!(resp.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(resp.headers()["allow"], "POST");
    let error = expect_error(resp, StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed").await;
    assert!(
        error["message"].as_str().unwrap().contains("GET"),
        "{error}"
    );
    let resp = app
        .http
        .delete(app.url("/api/v1/runs/run_x"))
        .bearer_auth(AGENT_TOKEN)
        .send()
        .await
        .unwrap();
    expect_error(resp, StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed").await;

    let resp = api_get(&app, "/api/v1/sandboxes", Some(AGENT_TOKEN)).await;
    let error = expect_error(resp, StatusCode::REQUEST_TIMEOUT, "timeout").await;
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("STEWARD_REQUEST_TIMEOUT"),
        "{error}"
    );

    // Outside the API, a 405 is a sentence too.
    for path in ["/github/webhook", "/slack/commands"] {
        let resp = app.http.get(app.url(path)).send().await.unwrap();
        assert_eq!(resp.status(), StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(resp.headers()["allow"], "POST");
        let text = resp.text().await.unwrap();
        assert!(text.contains("does not answer GET"), "{path}: {text:?}");
    }
    held.abort();
}

/// Bad tokens cost one warning in the log, not one each (`steward serve` as a process, at the
/// default log level, so its log is its own; read from its stderr).
#[tokio::test]
async fn a_flood_of_bad_tokens_is_refused_each_time_and_logged_as_one_warning() {
    let serve = crate::common::serve_process(&[]).await;
    let http = reqwest::Client::new();
    for n in 0..100 {
        let mut ask = http.get(serve.url("/api/v1/sandboxes"));
        if n % 2 == 0 {
            ask = ask.bearer_auth(format!("stw_guess_{n}"));
        }
        let resp = ask.send().await.unwrap();
        assert_eq!(resp.status(), 401, "request {n}");
        let resp = http
            .post(serve.url("/mcp"))
            .bearer_auth(format!("stw_guess_{n}"))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 401, "mcp request {n}");
    }
    // Every refusal was logged (or not) before its answer was sent.
    let log = serve.stop().await;
    let lines: Vec<&str> = log.lines().filter(|l| l.contains("refused")).collect();
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert!(lines[0].contains("WARN"), "{}", lines[0]);
    assert!(!log.contains("stw_guess_"), "{log}");
}
