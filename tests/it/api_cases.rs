//! Cases through the agent API: an agent asks for a kill, a person decides in Slack, and
//! `GET /api/v1/cases/{id}?wait=` hands the agent the decision.
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::api::{AGENT_TOKEN, AUDITOR_TOKEN, RUNNER_TOKEN, api_get, expect_error, spawn_api_app};
use crate::common::{TestApp, hook, visible_text};

/// A person (U0002) chooses Kill on the case's card and gives a reason.
pub async fn person_kills(app: &TestApp, case: &str) {
    let case = sandbox_steward::ids::CaseId::parse(case).unwrap();
    let before = app.modals_opened().len();
    let resp = app
        .click_case(&case, "case_kill", "U0002", &hook(), &hook())
        .await;
    assert_eq!(resp.status(), 200);
    let view = app.opened_modal(before).await;
    app.submit_reason(&view, "U0002", "the agent is right", None)
        .await;
}

/// `/sandbox kill <id>` from U0001: the id of the case it opened.
pub async fn person_opens_kill_case(app: &TestApp, sandbox: &str) -> String {
    let name = hook();
    app.post_command_to(&format!("kill {sandbox} done with it"), &name)
        .await;
    let text = visible_text(&app.wait_for_hook(&name).await);
    crate::common::case_id_in(&text).as_str().to_owned()
}

#[tokio::test]
async fn a_read_all_token_reads_a_case_and_a_long_poll_returns_the_decision_when_a_person_makes_it()
{
    let app = spawn_api_app().await;
    app.seed_sandbox(json!({"sandboxID": "caseread1", "templateID": "base", "state": "running"}))
        .await;
    let case = person_opens_kill_case(&app, "caseread1").await;
    // A person opened it: no agent's token reads it without `read_all`.
    let resp = api_get(&app, &format!("/api/v1/cases/{case}"), Some(AGENT_TOKEN)).await;
    expect_error(resp, StatusCode::NOT_FOUND, "not_found").await;
    let resp = api_get(&app, &format!("/api/v1/cases/{case}"), Some(AUDITOR_TOKEN)).await;
    assert_eq!(resp.status(), 200);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["state"], "pending", "{body}");
    assert_eq!(body["decision"], Value::Null);
    assert_eq!(
        body["subject"],
        json!({"kind": "sandbox", "id": "caseread1"})
    );

    let waiting = {
        let http = app.http.clone();
        let url = app.url(&format!("/api/v1/cases/{case}?wait=30s"));
        tokio::spawn(async move {
            http.get(url)
                .bearer_auth(AUDITOR_TOKEN)
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        })
    };
    person_kills(&app, &case).await;
    let decided = waiting.await.unwrap();
    assert_ne!(decided["state"], "pending", "{decided}");
    assert_eq!(decided["decision"]["option"], "kill", "{decided}");
    assert_eq!(decided["decision"]["by"], "U0002");
    assert_eq!(decided["decision"]["reason"], "the agent is right");
}

#[tokio::test]
async fn an_unknown_or_malformed_case_id_and_a_token_without_read_are_refused() {
    let app = spawn_api_app().await;
    let resp = api_get(&app, "/api/v1/cases/case_nosuchcase", Some(AGENT_TOKEN)).await;
    expect_error(resp, StatusCode::NOT_FOUND, "not_found").await;
    let resp = api_get(&app, "/api/v1/cases/case_x?wait=soon", Some(AGENT_TOKEN)).await;
    let error = expect_error(resp, StatusCode::UNPROCESSABLE_ENTITY, "invalid").await;
    assert_eq!(error["field"], "wait");
    let resp = api_get(&app, "/api/v1/cases/case_x", Some(RUNNER_TOKEN)).await;
    expect_error(resp, StatusCode::FORBIDDEN, "forbidden").await;
}
