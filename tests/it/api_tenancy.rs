//! Tenancy of the agent API and the MCP tools, over real HTTP against the E2B simulator running
//! real commands: a token reads the runs and cases it made, a token with `read_all` reads every
//! one, and anybody else's run or case (a push test's included) is answered exactly like one that
//! does not exist. Run env values that may be secrets are scrubbed from the output, and no env
//! value or file content is ever in the run record.
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::api::{expect_error, sha256_hex};
use crate::common::{TestApp, TestAppOptions, spawn_app_with};
use crate::mcp::{call, http_client, stdio_client, text_of};

/// May run and read: tenant A.
const ALICE: &str = "stw_alice_4d8e0b1f7a2c9e63";
/// May only read: tenant B.
const BOB: &str = "stw_bob_1c7f3a9e5d0b8246";
/// May read every token's runs and cases.
const AUDITOR: &str = "stw_audit_8b2e6d0c4f1a9735";

fn policy() -> String {
    format!(
        r#"[channels]
approvals = "C0APPROVALS"

[approvals]
two_person_rule = false
[approvals.approvers]
kill = {{ users = ["U0002"] }}

[api.tokens.alice]
sha256 = "{alice}"
allow = ["run", "read", "request_kill"]
rate = "600/min"

[api.tokens.bob]
sha256 = "{bob}"
allow = ["read", "request_kill"]
rate = "600/min"

[api.tokens.auditor]
sha256 = "{auditor}"
allow = ["read", "read_all"]
rate = "600/min"
"#,
        alice = sha256_hex(ALICE),
        bob = sha256_hex(BOB),
        auditor = sha256_hex(AUDITOR),
    )
}

async fn spawn(exec_local: bool) -> TestApp {
    spawn_app_with(TestAppOptions {
        policy: Some(policy()),
        exec_local,
        ..TestAppOptions::default()
    })
    .await
}

async fn get(app: &TestApp, path: &str, token: &str) -> reqwest::Response {
    app.http
        .get(app.url(path))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
}

async fn post(app: &TestApp, path: &str, token: &str, body: &Value) -> reqwest::Response {
    app.http
        .post(app.url(path))
        .bearer_auth(token)
        .json(body)
        .send()
        .await
        .unwrap()
}

/// Alice's run, ended: its id.
async fn alices_run(app: &TestApp, request: Value) -> String {
    let resp = post(app, "/api/v1/runs", ALICE, &request).await;
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    let id = resp.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let run: Value = get(app, &format!("/api/v1/runs/{id}?wait=40s"), ALICE)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(run["status"], "finished", "{run}");
    id
}

/// The 404 a token gets for a run it may not read, checked to be word for word the one for a run
/// that does not exist (but for the id).
async fn expect_no_such_run(resp: reqwest::Response, id: &str, app: &TestApp, token: &str) {
    let hidden = expect_error(resp, StatusCode::NOT_FOUND, "not_found").await;
    let missing = get(app, "/api/v1/runs/run_doesnotexist", token).await;
    let missing = expect_error(missing, StatusCode::NOT_FOUND, "not_found").await;
    assert_eq!(
        hidden["message"].as_str().unwrap().replace(id, "ID"),
        missing["message"]
            .as_str()
            .unwrap()
            .replace("run_doesnotexist", "ID")
    );
}

#[tokio::test]
async fn a_token_reads_only_its_own_runs_and_read_all_reads_every_one_over_http() {
    let app = spawn(true).await;
    let id = alices_run(
        &app,
        json!({
            "template": "base",
            "command": "echo \"secret=$MYSECRET flag=$FLAG\"; cat note.txt",
            "env": {"MYSECRET": "hunter2hunter2", "FLAG": "1"},
            "files": [{"path": "note.txt", "content": "ZmlsZS1jb250ZW50LTcxOTM="}],
        }),
    )
    .await;

    // Alice reads her own run and its output; the env value she did not mark is scrubbed by
    // default (it is 8 characters or more), the short one is not.
    let resp = get(&app, &format!("/api/v1/runs/{id}"), ALICE).await;
    assert_eq!(resp.status(), 200);
    let record = resp.text().await.unwrap();
    for never in [
        "hunter2hunter2",
        "ZmlsZS1jb250ZW50LTcxOTM=",
        "file-content-7193",
    ] {
        assert!(!record.contains(never), "{never} in the record: {record}");
    }
    let resp = get(&app, &format!("/api/v1/runs/{id}/output"), ALICE).await;
    assert_eq!(resp.status(), 200);
    let output = resp.text().await.unwrap();
    assert!(
        output.contains("secret=[scrubbed] flag=1") && output.contains("file-content-7193"),
        "{output}"
    );

    // Bob may read, but not Alice's run: the record, a long-poll and the output are all a 404
    // indistinguishable from a run that does not exist.
    for path in [
        format!("/api/v1/runs/{id}"),
        format!("/api/v1/runs/{id}?wait=1s"),
        format!("/api/v1/runs/{id}/output"),
        format!("/api/v1/runs/{id}/output?from=0&wait=1s"),
    ] {
        let resp = get(&app, &path, BOB).await;
        expect_no_such_run(resp, &id, &app, BOB).await;
    }

    // The auditor's `read_all` reads it all.
    let resp = get(&app, &format!("/api/v1/runs/{id}"), AUDITOR).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.json::<Value>().await.unwrap()["requester"], "alice");
    let resp = get(&app, &format!("/api/v1/runs/{id}/output"), AUDITOR).await;
    assert_eq!(resp.status(), 200);
    assert!(resp.text().await.unwrap().contains("flag=1"));
}

#[tokio::test]
async fn named_secret_env_values_are_scrubbed_and_only_those() {
    let app = spawn(true).await;
    let id = alices_run(
        &app,
        json!({
            "template": "base",
            "command": "echo \"a=$A b=$B short=$C\"",
            "env": {"A": "abc", "B": "bbbbbbbbbbbb", "C": "xyzzy"},
            "secret_env": ["A", "C"],
        }),
    )
    .await;
    let output = get(&app, &format!("/api/v1/runs/{id}/output"), ALICE)
        .await
        .text()
        .await
        .unwrap();
    // Naming secrets replaces the default: A and C (however short) are scrubbed, B is not.
    assert!(
        output.contains("a=[scrubbed] b=bbbbbbbbbbbb short=[scrubbed]"),
        "{output}"
    );
    // An empty list says on purpose that nothing is secret.
    let id = alices_run(
        &app,
        json!({
            "template": "base",
            "command": "echo \"b=$B\"",
            "env": {"B": "bbbbbbbbbbbb"},
            "secret_env": [],
        }),
    )
    .await;
    let output = get(&app, &format!("/api/v1/runs/{id}/output"), ALICE)
        .await
        .text()
        .await
        .unwrap();
    assert!(output.contains("b=bbbbbbbbbbbb"), "{output}");
}

#[tokio::test]
async fn over_mcp_a_token_cannot_read_anothers_run_and_read_all_can() {
    let app = spawn(true).await;
    let alice = http_client(&app, ALICE).await;
    let ran = call(
        &alice,
        "run_code",
        json!({"template": "base", "command": "echo \"token=$MYSECRET\"", "env": {"MYSECRET": "hunter2hunter2"}}),
    )
    .await;
    assert_ne!(ran.is_error, Some(true), "{}", text_of(&ran));
    let ran: Value = serde_json::from_str(&text_of(&ran)).unwrap();
    assert_eq!(ran["run"]["status"], "finished", "{ran}");
    assert_eq!(ran["output"], "token=[scrubbed]\n", "{ran}");
    let id = ran["run"]["id"].as_str().unwrap().to_owned();
    alice.cancel().await.ok();

    // Over `/mcp` and over `steward mcp` (stdio, a client of the HTTP API) alike.
    for bob in [http_client(&app, BOB).await, stdio_client(&app, BOB).await] {
        for args in [
            json!({"run_id": id}),
            json!({"run_id": id, "wait_secs": 1, "output_from": 0}),
        ] {
            let refused = call(&bob, "get_run", args).await;
            assert_eq!(refused.is_error, Some(true));
            let text = text_of(&refused);
            assert!(text.contains(&format!("There is no run {id}")), "{text}");
            assert!(!text.contains("token="), "{text}");
        }
        bob.cancel().await.ok();
    }

    let auditor = http_client(&app, AUDITOR).await;
    let read = call(&auditor, "get_run", json!({"run_id": id})).await;
    assert_ne!(read.is_error, Some(true), "{}", text_of(&read));
    let read: Value = serde_json::from_str(&text_of(&read)).unwrap();
    assert_eq!(read["run"]["requester"], "alice");
    assert_eq!(read["output"], "token=[scrubbed]\n");
    auditor.cancel().await.ok();
}

#[tokio::test]
async fn a_push_tests_run_is_read_only_with_read_all() {
    let app = spawn(false).await;
    // The requester a push test's run gets (`github::intake` submits it through the same Runner).
    let request =
        serde_json::from_value(json!({"template": "base", "command": "make test"})).unwrap();
    let run = app
        .state
        .runs
        .as_ref()
        .unwrap()
        .submit("github:acme/api", request)
        .await
        .unwrap();
    let id = run.id.as_str().to_owned();
    for token in [ALICE, BOB] {
        let resp = get(&app, &format!("/api/v1/runs/{id}"), token).await;
        expect_no_such_run(resp, &id, &app, token).await;
        let resp = get(&app, &format!("/api/v1/runs/{id}/output"), token).await;
        expect_no_such_run(resp, &id, &app, token).await;
    }
    let resp = get(&app, &format!("/api/v1/runs/{id}"), AUDITOR).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.json::<Value>().await.unwrap()["requester"],
        "github:acme/api"
    );
}

#[tokio::test]
async fn a_token_reads_only_the_cases_it_opened_over_http_and_mcp() {
    let app = spawn(false).await;
    for id in ["tenantbox1", "tenantbox2"] {
        app.seed_sandbox(json!({"sandboxID": id, "templateID": "base", "state": "running"}))
            .await;
    }
    let resp = post(
        &app,
        "/api/v1/cases",
        ALICE,
        &json!({"action": "kill_sandbox", "sandbox_id": "tenantbox1", "reason": "alice is done with it"}),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::CREATED);
    let case = resp.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();

    let resp = get(&app, &format!("/api/v1/cases/{case}"), ALICE).await;
    assert_eq!(resp.status(), 200);
    let resp = get(&app, &format!("/api/v1/cases/{case}?wait=1s"), BOB).await;
    let hidden = expect_error(resp, StatusCode::NOT_FOUND, "not_found").await;
    assert_eq!(hidden["message"], format!("Case {case} was not found."));
    let resp = get(&app, &format!("/api/v1/cases/{case}"), AUDITOR).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.json::<Value>().await.unwrap()["reason"],
        "alice is done with it"
    );

    // Bob asking for the same kill does not get Alice's case back either: a 409 that names
    // neither her case nor her reason, and nothing new is opened.
    let posts = app.slack.messages().len();
    let resp = post(
        &app,
        "/api/v1/cases",
        BOB,
        &json!({"action": "kill_sandbox", "sandbox_id": "tenantbox1", "reason": "bob too"}),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::CONFLICT);
    let body = resp.text().await.unwrap();
    assert!(!body.contains(&case) && !body.contains("alice"), "{body}");
    let error: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(error["error"]["code"], "conflict", "{body}");
    assert_eq!(app.slack.messages().len(), posts, "nothing was posted");
    // Alice asking again is pointed at her own case.
    let resp = post(
        &app,
        "/api/v1/cases",
        ALICE,
        &json!({"action": "kill_sandbox", "sandbox_id": "tenantbox1"}),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.json::<Value>().await.unwrap()["id"], case.as_str());

    // A case a person opened in Slack is no agent's.
    let person_case = crate::api_cases::person_opens_kill_case(&app, "tenantbox2").await;
    let resp = get(&app, &format!("/api/v1/cases/{person_case}"), ALICE).await;
    expect_error(resp, StatusCode::NOT_FOUND, "not_found").await;

    let bob = http_client(&app, BOB).await;
    let refused = call(&bob, "get_decision", json!({"case_id": case})).await;
    assert_eq!(refused.is_error, Some(true));
    assert!(
        text_of(&refused).contains("was not found"),
        "{}",
        text_of(&refused)
    );
    let refused = call(
        &bob,
        "request_kill",
        json!({"sandbox_id": "tenantbox1", "reason": "bob again"}),
    )
    .await;
    assert_eq!(refused.is_error, Some(true));
    assert!(!text_of(&refused).contains(&case), "{}", text_of(&refused));
    bob.cancel().await.ok();
    let alice = http_client(&app, ALICE).await;
    let own = call(&alice, "get_decision", json!({"case_id": case})).await;
    assert_ne!(own.is_error, Some(true), "{}", text_of(&own));
    alice.cancel().await.ok();
}
