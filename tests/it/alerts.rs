//! Test-failure alerts over HTTP: `POST /api/v1/test-failures` posts the alert to
//! `[channels] engineering` with the failing lines, and the whole output lands as a file in the
//! alert's thread (read back through the Slack simulator); refusals post nothing. Also the
//! simulator's own upload flow.
use reqwest::StatusCode;
use sandbox_steward::alerts::{self, Person, Step, TestFailure, TestOutput, TestRunError};
use sandbox_steward::ids::SlackChannelId;
use sandbox_steward::sim::slack::Fault;
use serde_json::{Value, json};

use crate::api::{AGENT_TOKEN, expect_error, sha256_hex};
use crate::common::{TestApp, TestAppOptions, spawn_app_with, visible_json_text, visible_text};
use sandbox_steward::sim::slack::Recorded;

/// May report test failures only.
const CI_TOKEN: &str = "stw_ci_4c0e9a7d21b64f88";

const ENGINEERING: &str = "C0ENGINEER";

fn policy(with_channel: bool) -> String {
    format!(
        r#"[channels]
approvals = "C0APPROVALS"
{channel}

[api.tokens.ci]
sha256 = "{ci}"
allow = ["report_test_failure"]

[api.tokens.agent]
sha256 = "{agent}"
allow = ["run", "read"]
"#,
        channel = if with_channel {
            format!("engineering = \"{ENGINEERING}\"")
        } else {
            String::new()
        },
        ci = sha256_hex(CI_TOKEN),
        agent = sha256_hex(AGENT_TOKEN),
    )
}

async fn spawn(with_channel: bool) -> TestApp {
    spawn_app_with(TestAppOptions {
        policy: Some(policy(with_channel)),
        with_e2b: false,
        worker: false,
        ..TestAppOptions::default()
    })
    .await
}

const PYTEST_OUTPUT: &str = "\
============================= test session starts ==============================
platform linux -- Python 3.12.3, pytest-8.2.0, pluggy-1.5.0
collected 12 items

tests/test_invoice.py ..F.                                               [ 33%]
tests/test_tax.py ........                                               [100%]

=================================== FAILURES ===================================
____________________________ test_total_with_discount ____________________________

    def test_total_with_discount():
        invoice = Invoice(lines=[Line(100), Line(50)], discount=0.1)
>       assert invoice.total() == 135
E       assert 150.0 == 135

tests/test_invoice.py:27: AssertionError
=========================== short test summary info ============================
FAILED tests/test_invoice.py::test_total_with_discount - assert 150.0 == 135
========================= 1 failed, 11 passed in 0.34s =========================
";

fn report() -> Value {
    json!({
        "repository": "acme/billing",
        "branch": "main",
        "commit": "9f3c2a1b7e4d5c6a8b9f0e1d2c3b4a5f6e7d8c9b",
        "author": {"name": "Sam Lee", "email": "sam@example.com", "slack_user": "U0SAM0001"},
        "pusher": "Dana <!here> Ops",
        "command": "pytest -q",
        "exit_code": 1,
        "output": PYTEST_OUTPUT,
        "commit_url": "https://github.com/acme/billing/commit/9f3c2a1b7e4d5c6a8b9f0e1d2c3b4a5f6e7d8c9b",
        "message": "Apply the discount once\n\nIt was applied per line.",
        "duration_secs": 75,
    })
}

/// Everything an alert shows: its blocks and those under its coloured bar.
fn alert_text(rec: &Recorded) -> String {
    let mut text = visible_text(rec);
    for attachment in rec
        .attachments
        .iter()
        .flat_map(|a| a.as_array().cloned().unwrap_or_default())
    {
        text.push_str(&visible_json_text(&attachment));
    }
    text
}

/// The colour of an alert's bar, if it has one.
fn bar(rec: &Recorded) -> Option<String> {
    rec.attachments.as_ref()?[0]["color"]
        .as_str()
        .map(str::to_owned)
}

async fn post(app: &TestApp, token: Option<&str>, body: &Value) -> reqwest::Response {
    let mut req = app.http.post(app.url("/api/v1/test-failures")).json(body);
    if let Some(token) = token {
        req = req.bearer_auth(token);
    }
    req.send().await.expect("the API answers")
}

fn posts(app: &TestApp) -> usize {
    app.slack
        .messages()
        .iter()
        .filter(|m| m.method == "chat.postMessage" || m.method.starts_with("files."))
        .count()
}

#[tokio::test]
async fn a_reported_failure_posts_the_failing_lines_and_the_whole_output_in_its_thread() {
    let app = spawn(true).await;
    let resp = post(&app, Some(CI_TOKEN), &report()).await;
    assert_eq!(resp.status(), StatusCode::CREATED);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["channel"], ENGINEERING);
    let ts = body["ts"].as_str().unwrap();

    let alert = app.slack.message(ENGINEERING, ts).expect("the alert");
    assert_eq!(bar(&alert).as_deref(), Some("danger"), "a red bar");
    let text = alert_text(&alert);
    assert!(
        text.contains("*Tests failed* in `acme/billing` on `main`"),
        "{text}"
    );
    assert!(
        text.contains("<https://github.com/acme/billing/commit/9f3c2a1b7e4d5c6a8b9f0e1d2c3b4a5f6e7d8c9b|9f3c2a1>"),
        "{text}"
    );
    assert!(text.contains("Apply the discount once"), "{text}");
    assert!(
        !text.contains("applied per line"),
        "first line only: {text}"
    );
    assert!(text.contains("*Author* <@U0SAM0001>"), "{text}");
    assert!(
        text.contains("*Pushed by* `Dana &lt;!here&gt; Ops`"),
        "{text}"
    );
    assert!(
        text.contains("`pytest -q`") && text.contains("*Exit code* 1"),
        "{text}"
    );
    assert!(text.contains("*Took* 1 min 15 s"), "{text}");
    // The failing lines, in a code block; the passing preamble is not there.
    let code = text
        .split("```")
        .nth(1)
        .unwrap_or_else(|| panic!("a code block: {text}"));
    assert!(code.contains("E       assert 150.0 == 135"), "{code}");
    assert!(
        code.contains("FAILED tests/test_invoice.py::test_total_with_discount"),
        "{code}"
    );
    assert!(!code.contains("platform linux"), "{code}");

    // The whole output, as a file in the alert's thread, byte for byte.
    let file_id = body["output_file"].as_str().expect("a file id");
    let shared = app
        .slack
        .messages()
        .into_iter()
        .find(|m| m.method == "files.completeUploadExternal")
        .expect("the file was shared");
    assert_eq!(shared.channel.as_deref(), Some(ENGINEERING));
    assert_eq!(shared.thread_ts.as_deref(), Some(ts));
    assert_eq!(shared.body["files"][0]["id"], file_id);
    let bytes = app
        .http
        .get(format!("{}/_sim/files/{file_id}", app.slack.base_url()))
        .send()
        .await
        .unwrap();
    assert_eq!(bytes.status(), 200);
    assert_eq!(bytes.bytes().await.unwrap(), PYTEST_OUTPUT.as_bytes());
    // `GET /_sim/messages` lists the share as a message in the thread.
    let listed: Vec<Value> = app
        .http
        .get(format!("{}/_sim/messages", app.slack.base_url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(
        listed
            .iter()
            .any(|m| m["method"] == "files.completeUploadExternal"
                && m["thread_ts"] == ts
                && m["body"]["files"][0]["id"] == file_id)
    );
}

#[tokio::test]
async fn a_missing_field_is_a_422_that_names_it_and_posts_nothing() {
    let app = spawn(true).await;
    for field in ["repository", "commit", "exit_code", "output", "author"] {
        let mut body = report();
        body.as_object_mut().unwrap().remove(field);
        let error = expect_error(
            post(&app, Some(CI_TOKEN), &body).await,
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
        )
        .await;
        assert_eq!(error["field"], field, "{error}");
    }
    let mut passed = report();
    passed["exit_code"] = json!(0);
    let error = expect_error(
        post(&app, Some(CI_TOKEN), &passed).await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid",
    )
    .await;
    assert_eq!(error["field"], "exit_code");
    let mut bad_link = report();
    bad_link["commit_url"] = json!("https://x.example/a|<!channel>");
    let error = expect_error(
        post(&app, Some(CI_TOKEN), &bad_link).await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid",
    )
    .await;
    assert_eq!(error["field"], "commit_url");
    assert_eq!(posts(&app), 0);
}

#[tokio::test]
async fn no_token_is_a_401_and_a_token_without_the_permission_is_a_403() {
    let app = spawn(true).await;
    expect_error(
        post(&app, None, &report()).await,
        StatusCode::UNAUTHORIZED,
        "unauthorized",
    )
    .await;
    let error = expect_error(
        post(&app, Some(AGENT_TOKEN), &report()).await,
        StatusCode::FORBIDDEN,
        "forbidden",
    )
    .await;
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("report_test_failure"),
        "{error}"
    );
    assert_eq!(posts(&app), 0);
}

#[tokio::test]
async fn without_an_engineering_channel_the_report_is_a_503_that_says_what_to_set() {
    let app = spawn(false).await;
    let error = expect_error(
        post(&app, Some(CI_TOKEN), &report()).await,
        StatusCode::SERVICE_UNAVAILABLE,
        "unavailable",
    )
    .await;
    assert!(
        error["message"].as_str().unwrap().contains("[channels]"),
        "{error}"
    );
    assert_eq!(posts(&app), 0);
}

#[tokio::test]
async fn the_slack_simulator_serves_the_external_upload_flow() {
    let app = spawn(true).await;
    let api = app.slack.api_url();
    let http = &app.http;
    let auth = format!("Bearer {}", crate::common::BOT_TOKEN);
    let parent: Value = http
        .post(format!("{api}/chat.postMessage"))
        .header("Authorization", &auth)
        .json(&json!({"channel": "C0FILES", "text": "parent"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let parent_ts = parent["ts"].as_str().unwrap();

    let got: Value = http
        .get(format!(
            "{api}/files.getUploadURLExternal?filename=out.txt&length=5"
        ))
        .header("Authorization", &auth)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(got["ok"], true, "{got}");
    let file_id = got["file_id"].as_str().unwrap();
    let upload_url = got["upload_url"].as_str().unwrap();

    // Completing before the bytes arrived is refused, like Slack.
    let early: Value = http
        .post(format!("{api}/files.completeUploadExternal"))
        .header("Authorization", &auth)
        .json(&json!({"files": [{"id": file_id}], "channel_id": "C0FILES"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(early["error"], "file_not_found");

    let uploaded = http.post(upload_url).body("hello").send().await.unwrap();
    assert_eq!(uploaded.status(), 200);
    // A thread in another channel is refused.
    let elsewhere: Value = http
        .post(format!("{api}/files.completeUploadExternal"))
        .header("Authorization", &auth)
        .json(&json!({"files": [{"id": file_id}], "channel_id": "C0OTHER", "thread_ts": parent_ts}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(elsewhere["error"], "thread_not_found");
    let done: Value = http
        .post(format!("{api}/files.completeUploadExternal"))
        .header("Authorization", &auth)
        .json(
            &json!({"files": [{"id": file_id, "title": "Output"}], "channel_id": "C0FILES",
                      "thread_ts": parent_ts, "initial_comment": "the whole output"}),
        )
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(done["ok"], true, "{done}");
    assert_eq!(done["files"][0]["title"], "Output");

    let file = app.slack.file(file_id).expect("the file");
    assert!(file.completed);
    assert_eq!(file.bytes.as_deref(), Some(&b"hello"[..]));
    assert_eq!(file.thread_ts.as_deref(), Some(parent_ts));
    let read = http
        .get(format!("{}/_sim/files/{file_id}", app.slack.base_url()))
        .send()
        .await
        .unwrap();
    assert_eq!(read.bytes().await.unwrap(), &b"hello"[..]);
    let missing = http
        .get(format!("{}/_sim/files/F404", app.slack.base_url()))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
}

fn failure(output: Vec<u8>) -> TestFailure {
    TestFailure {
        repository: "acme/parser".into(),
        branch: "main".into(),
        commit_sha: "0123456789abcdef0123456789abcdef01234567".into(),
        commit_url: None,
        commit_message: Some("Speed up the lexer".into()),
        pusher: Some(Person {
            login: Some("dana".into()),
            ..Person::default()
        }),
        author: None,
        command: "cargo test".into(),
        exit_code: 101,
        duration: None,
        output: TestOutput::whole(output),
        sandbox_id: None,
    }
}

fn channel() -> SlackChannelId {
    SlackChannelId::parse(ENGINEERING).unwrap()
}

#[tokio::test]
async fn a_failed_upload_leaves_the_alert_and_says_so_in_its_thread() {
    let app = spawn(true).await;
    app.slack.add_fault(Fault {
        method: "files.getUploadURLExternal".into(),
        status: 200,
        retry_after_secs: None,
        count: 1,
        error: Some("not_allowed_token_type".into()),
    });
    let posted = alerts::post_test_failure(
        &app.state.slack,
        &app.state.templates,
        &channel(),
        &failure(b"test a ... FAILED\n".to_vec()),
    )
    .await
    .expect("the alert is posted");
    assert_eq!(posted.output_file, None);
    assert!(app.slack.message(ENGINEERING, &posted.ts).is_some());
    let note = app
        .slack
        .messages()
        .into_iter()
        .find(|m| m.method == "chat.postMessage" && m.thread_ts.as_deref() == Some(&posted.ts))
        .expect("a note in the thread");
    let text = visible_text(&note);
    assert!(
        text.contains("could not attach the full output")
            && text.contains("not_allowed_token_type"),
        "{text}"
    );
}

#[tokio::test]
async fn an_output_over_the_upload_cap_keeps_both_ends_and_the_thread_says_so() {
    let app = spawn(true).await;
    let mut output = b"FIRST LINE\n".to_vec();
    output.resize(alerts::MAX_UPLOAD_BYTES + 4096, b'.');
    output.extend_from_slice(b"\ntest result: FAILED. 0 passed; 1 failed\n");
    let posted = alerts::post_test_failure(
        &app.state.slack,
        &app.state.templates,
        &channel(),
        &failure(output.clone()),
    )
    .await
    .unwrap();
    let file = app
        .slack
        .file(posted.output_file.as_deref().expect("uploaded"))
        .unwrap();
    let bytes = file.bytes.unwrap();
    assert!(bytes.len() < output.len());
    assert!(bytes.starts_with(b"FIRST LINE\n"));
    assert!(bytes.ends_with(b"test result: FAILED. 0 passed; 1 failed\n"));
    let share = app
        .slack
        .messages()
        .into_iter()
        .find(|m| m.method == "files.completeUploadExternal")
        .unwrap();
    let comment = share.text.unwrap_or_default();
    assert!(
        comment.contains(
            "over the 10 MiB Slack upload cap; this file keeps its first 5 MiB and its last 5 MiB"
        ),
        "{comment}"
    );
    // The alert names the pusher by login (no Slack user mapped) and keeps the summary line.
    let text = alert_text(&app.slack.message(ENGINEERING, &posted.ts).unwrap());
    assert!(text.contains("*Pushed by* `dana`"), "{text}");
    assert!(text.contains("test result: FAILED"), "{text}");
    assert!(
        text.contains("the file in the thread keeps its first 5 MiB and its last 5 MiB"),
        "{text}"
    );
}

#[tokio::test]
async fn a_run_that_could_not_happen_posts_the_error_alert_not_a_test_failure() {
    let app = spawn(true).await;
    let error = TestRunError {
        repository: "acme/parser".into(),
        branch: "release/2.0".into(),
        commit_sha: "0123456789abcdef0123456789abcdef01234567".into(),
        commit_url: None,
        step: Step::CreateSandbox,
        why: "E2B has no template `python-tests`; create it or fix `template` under [[push_tests]]"
            .into(),
        sandbox_id: None,
    };
    let posted = alerts::post_error(&app.state.slack, &app.state.templates, &channel(), &error)
        .await
        .unwrap();
    let alert = app.slack.message(ENGINEERING, &posted.ts).unwrap();
    assert_eq!(bar(&alert), None, "no test-failure colour");
    let text = alert_text(&alert);
    assert!(text.contains("*Push test could not run*"), "{text}");
    assert!(text.contains("*Step* Starting the sandbox"), "{text}");
    assert!(text.contains("no template `python-tests`"), "{text}");
    assert!(
        !text.contains(":x:") && !text.contains("Tests failed"),
        "{text}"
    );
    assert!(
        !app.slack
            .messages()
            .iter()
            .any(|m| m.method.starts_with("files.")),
        "nothing to upload"
    );
}
