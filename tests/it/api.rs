//! The agent API over HTTP: bearer tokens, allow lists, rates, JSON errors, and the read-only
//! fleet views, against the E2B simulator.
use reqwest::StatusCode;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::common::{TestApp, TestAppOptions, spawn_app_with};

/// May run, read and ask for kills.
pub const AGENT_TOKEN: &str = "stw_agent_7a1f0c29e4b84d5f";
/// May only read, and only three requests a minute.
pub const READER_TOKEN: &str = "stw_reader_53c9e1d0aa7b4f12";
/// May only run.
pub const RUNNER_TOKEN: &str = "stw_runner_0d4be6f1c8a9427e";
/// May only read, but every token's runs and cases (`read_all`).
pub const AUDITOR_TOKEN: &str = "stw_auditor_9e2d41b7c05a6f38";
/// May only report test failures.
pub const REPORTER_TOKEN: &str = "stw_reporter_6a0c3e8f2b7d1954";

pub fn sha256_hex(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// A steward.toml with the five tokens above.
pub fn api_policy() -> String {
    format!(
        r#"[channels]
approvals = "C0APPROVALS"

[approvals]
two_person_rule = false
[approvals.approvers]
kill = {{ users = ["U0002"] }}
delete_template = {{ users = ["U0002"] }}

[api.tokens.agent]
sha256 = ["{old}", "{agent}"]
allow = ["run", "read", "request_kill", "request_delete_template"]

[api.tokens.reader]
sha256 = "{reader}"
allow = ["read"]
rate = "3/min"

[api.tokens.runner]
sha256 = "{runner}"
allow = ["run"]

[api.tokens.auditor]
sha256 = "{auditor}"
allow = ["read_all"]

[api.tokens.reporter]
sha256 = "{reporter}"
allow = ["report_test_failure"]
"#,
        old = sha256_hex("stw_agent_retired"),
        agent = sha256_hex(AGENT_TOKEN),
        reader = sha256_hex(READER_TOKEN),
        runner = sha256_hex(RUNNER_TOKEN),
        auditor = sha256_hex(AUDITOR_TOKEN),
        reporter = sha256_hex(REPORTER_TOKEN),
    )
}

pub async fn spawn_api_app() -> TestApp {
    spawn_app_with(TestAppOptions {
        policy: Some(api_policy()),
        ..TestAppOptions::default()
    })
    .await
}

/// `GET path` with `token` (or none).
pub async fn api_get(app: &TestApp, path: &str, token: Option<&str>) -> reqwest::Response {
    let mut req = app.http.get(app.url(path));
    if let Some(token) = token {
        req = req.bearer_auth(token);
    }
    req.send().await.expect("the API answers")
}

/// Checks `resp` is a JSON error with `status` and `code`, and returns the error object.
pub async fn expect_error(resp: reqwest::Response, status: StatusCode, code: &str) -> Value {
    assert_eq!(resp.status(), status);
    assert!(
        resp.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("application/json")
    );
    let body: Value = resp.json().await.unwrap();
    let error = body["error"].clone();
    assert_eq!(error["code"], code, "{body}");
    let message = error["message"].as_str().unwrap();
    assert!(message.ends_with('.'), "a sentence: {message}");
    for token in [
        AGENT_TOKEN,
        READER_TOKEN,
        RUNNER_TOKEN,
        AUDITOR_TOKEN,
        REPORTER_TOKEN,
    ] {
        assert!(!message.contains(token), "{message}");
    }
    error
}

#[tokio::test]
async fn a_missing_or_unknown_token_is_a_401_that_asks_for_a_bearer_token() {
    let app = spawn_api_app().await;
    let missing = api_get(&app, "/api/v1/sandboxes", None).await;
    assert_eq!(
        missing.headers()["www-authenticate"],
        "Bearer realm=\"steward\""
    );
    let error = expect_error(missing, StatusCode::UNAUTHORIZED, "unauthorized").await;
    assert!(error["message"].as_str().unwrap().contains("Bearer"));
    let wrong = api_get(&app, "/api/v1/sandboxes", Some("stw_agent_guess")).await;
    expect_error(wrong, StatusCode::UNAUTHORIZED, "unauthorized").await;
    let basic = app
        .http
        .get(app.url("/api/v1/sandboxes"))
        .basic_auth("agent", Some(AGENT_TOKEN))
        .send()
        .await
        .unwrap();
    expect_error(basic, StatusCode::UNAUTHORIZED, "unauthorized").await;
    assert_eq!(app.e2b.hooks().calls_of("list").await.unwrap(), 0);
}

#[tokio::test]
async fn a_token_lists_the_fleet_and_a_rotated_out_hash_still_names_the_same_agent() {
    let app = spawn_api_app().await;
    let resp = api_get(&app, "/api/v1/sandboxes?state=all", Some(AGENT_TOKEN)).await;
    assert_eq!(resp.status(), 200);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["complete"], true);
    assert_eq!(body["sandboxes"].as_array().unwrap().len(), 5, "{body}");
    let retired = api_get(&app, "/api/v1/sandboxes", Some("stw_agent_retired")).await;
    assert_eq!(retired.status(), 200);
}

#[tokio::test]
async fn an_action_the_token_may_not_do_is_a_403_naming_the_action() {
    let app = spawn_api_app().await;
    let resp = api_get(&app, "/api/v1/sandboxes", Some(RUNNER_TOKEN)).await;
    let error = expect_error(resp, StatusCode::FORBIDDEN, "forbidden").await;
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains("`read`") && message.contains("runner"),
        "{message}"
    );
    assert_eq!(app.e2b.hooks().calls_of("list").await.unwrap(), 0);
}

#[tokio::test]
async fn a_token_over_its_rate_is_a_429_with_retry_after() {
    let app = spawn_api_app().await;
    for _ in 0..3 {
        let resp = api_get(&app, "/api/v1/sandboxes", Some(READER_TOKEN)).await;
        assert_eq!(resp.status(), 200);
    }
    let resp = api_get(&app, "/api/v1/sandboxes", Some(READER_TOKEN)).await;
    let wait: u64 = resp.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=20).contains(&wait), "{wait}");
    expect_error(resp, StatusCode::TOO_MANY_REQUESTS, "rate_limited").await;
    // Another token's budget is its own.
    let other = api_get(&app, "/api/v1/sandboxes", Some(AGENT_TOKEN)).await;
    assert_eq!(other.status(), 200);
    assert_eq!(app.e2b.hooks().calls_of("list").await.unwrap(), 4);
}

#[tokio::test]
async fn unknown_sandboxes_and_routes_are_404s_and_bad_queries_name_the_field() {
    let app = spawn_api_app().await;
    let resp = api_get(&app, "/api/v1/sandboxes/nosuchsandbox", Some(AGENT_TOKEN)).await;
    let error = expect_error(resp, StatusCode::NOT_FOUND, "not_found").await;
    assert!(error["message"].as_str().unwrap().contains("nosuchsandbox"));
    let resp = api_get(&app, "/api/v1/nothing-here", Some(AGENT_TOKEN)).await;
    expect_error(resp, StatusCode::NOT_FOUND, "not_found").await;
    let resp = api_get(&app, "/api/v1/sandboxes?state=sleeping", Some(AGENT_TOKEN)).await;
    let error = expect_error(resp, StatusCode::UNPROCESSABLE_ENTITY, "invalid").await;
    assert_eq!(error["field"], "state");
    let resp = api_get(&app, "/api/v1/sandboxes?colour=red", Some(AGENT_TOKEN)).await;
    let error = expect_error(resp, StatusCode::UNPROCESSABLE_ENTITY, "invalid").await;
    assert_eq!(error["field"], "colour", "{error}");
    let resp = api_get(
        &app,
        "/api/v1/sandboxes/x/logs?limit=5000",
        Some(AGENT_TOKEN),
    )
    .await;
    let error = expect_error(resp, StatusCode::UNPROCESSABLE_ENTITY, "invalid").await;
    assert_eq!(error["field"], "limit");
    assert_eq!(app.e2b.hooks().calls_of("logs").await.unwrap(), 0);
}

#[tokio::test]
async fn a_sandbox_its_logs_and_metrics_can_be_read() {
    let app = spawn_api_app().await;
    app.seed_sandbox(json!({"sandboxID": "apiread1", "templateID": "base", "state": "running"}))
        .await;
    let resp = api_get(&app, "/api/v1/sandboxes/apiread1", Some(READER_TOKEN)).await;
    assert_eq!(resp.status(), 200);
    let detail: Value = resp.json().await.unwrap();
    assert_eq!(detail["sandboxID"], "apiread1", "{detail}");
    let resp = api_get(
        &app,
        "/api/v1/sandboxes/apiread1/logs?limit=10",
        Some(READER_TOKEN),
    )
    .await;
    assert_eq!(resp.status(), 200);
    assert!(resp.json::<Value>().await.unwrap()["logs"].is_array());
    let resp = api_get(
        &app,
        "/api/v1/sandboxes/apiread1/metrics?since=10m",
        Some(READER_TOKEN),
    )
    .await;
    assert_eq!(resp.status(), 200);
    assert!(resp.json::<Value>().await.unwrap()["metrics"].is_array());
}
