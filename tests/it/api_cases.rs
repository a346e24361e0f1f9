//! Cases through the agent API: an agent asks for a kill, a person decides in Slack, and
//! `GET /api/v1/cases/{id}?wait=` hands the agent the decision.
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::api::{AGENT_TOKEN, RUNNER_TOKEN, api_get, expect_error, spawn_api_app};
use crate::common::{TestApp, eventually, hook, visible_text};

/// The latest modal Steward opened, once there are more than `before`.
pub async fn opened_modal(app: &TestApp, before: usize) -> Value {
    let views = || -> Vec<Value> {
        app.slack
            .messages()
            .into_iter()
            .filter(|m| m.method == "views.open")
            .map(|m| m.body["view"].clone())
            .collect()
    };
    eventually("a modal opens", || async { views().len() > before }).await;
    match views().pop().unwrap() {
        Value::String(s) => serde_json::from_str(&s).unwrap(),
        v => v,
    }
}

pub fn modals(app: &TestApp) -> usize {
    app.slack
        .messages()
        .iter()
        .filter(|m| m.method == "views.open")
        .count()
}

/// A person submits the reason modal `view`.
pub async fn submit_reason(app: &TestApp, view: &Value, user: &str, reason: &str) {
    let payload = json!({
        "type": "view_submission",
        "user": {"id": user},
        "view": {
            "id": format!("V{}", hook()),
            "callback_id": view["callback_id"],
            "private_metadata": view["private_metadata"],
            "hash": "h1",
            "state": {"values": {
                "reason": {"reason_text": {"type": "plain_text_input", "value": reason}},
                "until": {"until_date": {"type": "datepicker", "selected_date": null}},
            }},
        },
    });
    let resp = app.post_interaction(&payload).await;
    assert_eq!(resp.status(), 200);
}

/// A person (U0002) chooses Kill on the case's card and gives a reason.
pub async fn person_kills(app: &TestApp, case: &str) {
    let case = sandbox_steward::ids::CaseId::parse(case).unwrap();
    let before = modals(app);
    let resp = app
        .click_case(&case, "case_kill", "U0002", &hook(), &hook())
        .await;
    assert_eq!(resp.status(), 200);
    let view = opened_modal(app, before).await;
    submit_reason(app, &view, "U0002", "the agent is right").await;
}

/// `/sandbox kill <id>` from U0001: the id of the case it opened.
pub async fn person_opens_kill_case(app: &TestApp, sandbox: &str) -> String {
    let name = hook();
    app.post_command_to(&format!("kill {sandbox} done with it"), &name)
        .await;
    let text = visible_text(&app.wait_for_hook(&name).await);
    let start = text.find("case_").unwrap_or_else(|| panic!("{text}"));
    text[start..]
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect()
}

#[tokio::test]
async fn an_agent_reads_a_case_and_a_long_poll_returns_the_decision_when_a_person_makes_it() {
    let app = spawn_api_app().await;
    app.seed_sandbox(json!({"sandboxID": "caseread1", "templateID": "base", "state": "running"}))
        .await;
    let case = person_opens_kill_case(&app, "caseread1").await;
    let resp = api_get(&app, &format!("/api/v1/cases/{case}"), Some(AGENT_TOKEN)).await;
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
                .bearer_auth(AGENT_TOKEN)
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
