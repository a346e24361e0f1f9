//! Cases an agent asks for (`approvals::request::request_by_agent`, what `POST /api/v1/cases`
//! calls): the same case and card a person's `/sandbox kill` opens, decided by a person's clicks
//! over signed HTTP, carried out by the worker against the E2B simulator. Real Redis, a fresh
//! key prefix per test.

use crate::common::{
    TestApp, TestAppOptions, ThrowawayRedis, eventually, hook, spawn_app_with, visible_text,
};
use sandbox_steward::approvals::request::{AgentAction, AgentRequestError, request_by_agent};
use sandbox_steward::cases::{CaseState, DecisionOption, Opener, Subject};
use sandbox_steward::ids::{CaseId, SandboxId, TemplateId};
use sandbox_steward::store::Actor;
use serde_json::{Value, json};

const APPROVALS: &str = "C0AGENTCASES";

/// U0002 may kill; the agent is nobody's Slack user, so the two-person rule excludes no one.
fn options() -> TestAppOptions {
    TestAppOptions {
        sandboxes: 0,
        policy: Some(format!(
            r#"
[channels]
approvals = "{APPROVALS}"
[approvals]
two_person_rule = true
[approvals.approvers]
kill = {{ users = ["U0002"] }}
delete_template = {{ users = ["U0002"] }}
pause = {{ anyone = true }}
leave = {{ anyone = true }}
keep = {{ anyone = true }}
"#
        )),
        ..TestAppOptions::default()
    }
}

fn sandbox(id: &str) -> SandboxId {
    SandboxId::parse(id).unwrap()
}

async fn card_text(app: &TestApp, case: &CaseId) -> String {
    let card = app.state.store.get_case(case).await.unwrap().card.unwrap();
    visible_text(&app.slack.message(card.channel.as_str(), &card.ts).unwrap())
}

fn posts(app: &TestApp) -> usize {
    app.slack
        .messages()
        .into_iter()
        .filter(|m| m.method == "chat.postMessage")
        .count()
}

#[tokio::test]
async fn an_agents_kill_request_posts_a_card_naming_it_and_a_persons_kill_ends_the_sandbox() {
    let app = spawn_app_with(options()).await;
    app.seed_sandbox(json!({"sandboxID": "agentbox1", "templateID": "base", "state": "running"}))
        .await;
    let svc = app.state.services();
    let asked = request_by_agent(
        &svc,
        "ci-bot",
        AgentAction::KillSandbox(sandbox("agentbox1")),
        Some("the nightly job is finished with it".into()),
        chrono::Utc::now(),
    )
    .await
    .unwrap();
    assert!(!asked.existing);
    let case = asked.case.id.clone();
    assert_eq!(
        asked.case.opener,
        Opener::Agent {
            name: "ci-bot".into()
        }
    );
    assert_eq!(
        asked.case.card.as_ref().unwrap().channel.as_str(),
        APPROVALS
    );
    // The same case a person's /sandbox kill opens: same options, same recommendation.
    assert_eq!(
        asked.case.options,
        Subject::Sandbox(sandbox("agentbox1")).default_options()
    );
    assert_eq!(
        asked.case.recommendation.option,
        DecisionOption::SnapshotThenKill
    );
    let text = card_text(&app, &case).await;
    assert!(
        text.contains(
            "Agent ci-bot asks to kill this sandbox: `the nightly job is finished with it`"
        ),
        "{text}"
    );

    // Asking again points at the same case and posts nothing new.
    let again = request_by_agent(
        &svc,
        "ci-bot",
        AgentAction::KillSandbox(sandbox("agentbox1")),
        None,
        chrono::Utc::now(),
    )
    .await
    .unwrap();
    assert!(again.existing);
    assert_eq!(again.case.id, case);
    assert_eq!(posts(&app), 1);

    // Any approver may decide: the agent is not a Slack user the two-person rule could exclude.
    let before = app
        .slack
        .messages()
        .iter()
        .filter(|m| m.method == "views.open")
        .count();
    let resp = app
        .click_case(&case, "case_kill", "U0002", &hook(), &hook())
        .await;
    assert_eq!(resp.status(), 200);
    let view = app.opened_modal(before).await;
    let answer = app
        .submit_reason(&view, "U0002", "the agent is right", None)
        .await;
    assert_eq!(answer, Value::Null, "the modal closes");

    eventually("the case is done", || async {
        matches!(
            app.state.store.get_case(&case).await.unwrap().state,
            CaseState::Done { .. }
        )
    })
    .await;
    let e2b = app.state.e2b.as_ref().unwrap();
    assert!(e2b.get_sandbox(&sandbox("agentbox1")).await.is_err());
    eventually("the card says it was killed", || async {
        card_text(&app, &case)
            .await
            .contains("<@U0002> chose *Kill*")
    })
    .await;
    let audit = app.state.store.audit_for_case(&case).await.unwrap();
    let opened = audit.iter().find(|e| e.action == "open").unwrap();
    assert_eq!(
        opened.actor,
        Actor::Agent {
            name: "ci-bot".into()
        }
    );
}

#[tokio::test]
async fn an_agents_request_for_an_unknown_sandbox_or_template_is_not_found_and_posts_nothing() {
    let app = spawn_app_with(options()).await;
    let svc = app.state.services();
    let err = request_by_agent(
        &svc,
        "ci-bot",
        AgentAction::KillSandbox(sandbox("nosuchbox")),
        None,
        chrono::Utc::now(),
    )
    .await
    .unwrap_err();
    assert_eq!(err, AgentRequestError::NotFound("Sandbox nosuchbox".into()));
    assert_eq!(
        err.to_string(),
        "Sandbox nosuchbox was not found, so no case was opened."
    );
    let err = request_by_agent(
        &svc,
        "ci-bot",
        AgentAction::DeleteTemplate(TemplateId::parse("nosuchtpl").unwrap()),
        None,
        chrono::Utc::now(),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, AgentRequestError::NotFound(_)), "{err}");
    assert_eq!(posts(&app), 0);
    let subject = Subject::Sandbox(sandbox("nosuchbox"));
    assert!(
        app.state
            .store
            .case_for_subject(&subject)
            .await
            .unwrap()
            .is_none()
    );
}

#[tokio::test]
async fn with_redis_down_an_agents_request_is_store_unavailable_and_nothing_is_posted_or_sent_to_e2b()
 {
    let redis = ThrowawayRedis::start();
    let app = spawn_app_with(TestAppOptions {
        redis_url: Some(redis.url()),
        ..options()
    })
    .await;
    app.seed_sandbox(json!({"sandboxID": "agentbox2", "templateID": "base", "state": "running"}))
        .await;
    drop(redis);
    app.e2b.hooks().reset_calls().await.unwrap();
    let err = request_by_agent(
        &app.state.services(),
        "ci-bot",
        AgentAction::KillSandbox(sandbox("agentbox2")),
        Some("done".into()),
        chrono::Utc::now(),
    )
    .await
    .unwrap_err();
    assert_eq!(err, AgentRequestError::StoreUnavailable);
    assert!(err.to_string().contains("nothing was sent to E2B"), "{err}");
    assert_eq!(posts(&app), 0);
    assert!(
        app.e2b_calls().await.values().all(|n| *n == 0),
        "{:?}",
        app.e2b_calls().await
    );
}

#[tokio::test]
async fn without_an_approvals_channel_an_agents_request_says_so_and_touches_nothing() {
    let app = spawn_app_with(TestAppOptions {
        sandboxes: 1,
        ..TestAppOptions::default()
    })
    .await;
    app.e2b.hooks().reset_calls().await.unwrap();
    let err = request_by_agent(
        &app.state.services(),
        "ci-bot",
        AgentAction::KillSandbox(sandbox("whatever1")),
        None,
        chrono::Utc::now(),
    )
    .await
    .unwrap_err();
    assert_eq!(err, AgentRequestError::NoApprovalsChannel);
    assert_eq!(posts(&app), 0);
    assert!(app.e2b_calls().await.values().all(|n| *n == 0));
}
