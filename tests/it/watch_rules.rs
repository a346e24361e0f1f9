//! `[[watch]]` rules over real sockets: sandboxes are created at the E2B simulator as an agent
//! would, the simulator delivers its signed `created` events to Steward's `/e2b/webhook`, and
//! the rules raise a case, a notice or a burst alert in the Slack simulator. The burst alert
//! grows as more arrive, and its Pause all is carried out once per sandbox by two replicas.
use serde_json::{Value, json};

use crate::common::{
    APPROVALS, E2B_KEY, TestApp, TestAppOptions, hook, spawn_app_with, visible_text, wait_until,
};
use sandbox_steward::cases::list::{GroupDecision, ListCase};
use sandbox_steward::cases::{CaseState, DecisionOption, Subject};
use sandbox_steward::ids::{ListId, SandboxId};

const SECRET: &str = "whsec-watch-e2e";
const KILLER: &str = "U0002";
const PAUSER: &str = "U0003";

fn policy(rules: &str) -> String {
    format!(
        r#"
[channels]
approvals = "{APPROVALS}"
[approvals.approvers]
kill = {{ users = ["{KILLER}"] }}
pause = {{ users = ["{PAUSER}", "{KILLER}"] }}
leave = {{ anyone = true }}
{rules}
"#
    )
}

async fn app(rules: &str) -> TestApp {
    let app = spawn_app_with(TestAppOptions {
        sandboxes: 0,
        policy: Some(policy(rules)),
        env: vec![("E2B_WEBHOOK_SECRET".to_owned(), SECRET.to_owned())],
        ..TestAppOptions::default()
    })
    .await;
    register(&app).await;
    app
}

/// Registers `app`'s webhook with the simulator, as `steward e2b webhooks register` does.
async fn register(app: &TestApp) {
    e2b(
        app,
        reqwest::Method::POST,
        "/events/webhooks",
        Some(json!({
            "name": "steward", "url": format!("{}/e2b/webhook", app.address), "enabled": true,
            "events": [
                "sandbox.lifecycle.created", "sandbox.lifecycle.paused",
                "sandbox.lifecycle.resumed", "sandbox.lifecycle.killed",
            ],
            "signatureSecret": SECRET,
        })),
    )
    .await;
}

async fn e2b(app: &TestApp, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
    let mut req = app
        .http
        .request(method, format!("{}{path}", app.e2b.base_url()))
        .header("X-API-Key", E2B_KEY);
    if let Some(body) = body {
        req = req.json(&body);
    }
    let r = req.send().await.unwrap();
    assert!(r.status().is_success(), "{path}: {}", r.status());
    r.json().await.unwrap_or(Value::Null)
}

/// Creates a sandbox at the simulator as an agent would; returns its id.
async fn create(app: &TestApp, metadata: Value, timeout_secs: u64) -> String {
    let made = e2b(
        app,
        reqwest::Method::POST,
        "/sandboxes",
        Some(json!({"templateID": "base", "metadata": metadata, "timeout": timeout_secs})),
    )
    .await;
    made["sandboxID"].as_str().unwrap().to_owned()
}

async fn case_of(app: &TestApp, sandbox: &str) -> Option<sandbox_steward::cases::Case> {
    let subject = Subject::Sandbox(SandboxId::parse(sandbox).unwrap());
    app.state.store.case_for_subject(&subject).await.unwrap()
}

/// Every message posted to the approvals channel, as it reads now.
fn approvals_texts(app: &TestApp) -> Vec<String> {
    app.slack
        .messages()
        .iter()
        .filter(|m| m.method == "chat.postMessage" && m.channel.as_deref() == Some(APPROVALS))
        .filter_map(|m| app.slack.message(APPROVALS, m.ts.as_deref()?))
        .map(|m| visible_text(&m))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_creation_rule_opens_a_case_for_a_sandbox_created_without_an_owner_and_its_shorten_is_carried_out()
 {
    let app = app(r#"
[[watch]]
name = "needs-owner"
require_metadata = ["owner"]
max_timeout = "1h"
shorten_to = "10m"
"#)
    .await;
    // One that follows the rule, then one that breaks both conditions.
    let fine = create(&app, json!({"owner": "ann"}), 300).await;
    let stray = create(&app, json!({"purpose": "scratch"}), 7200).await;

    let case = wait_until("the stray sandbox has a case", || async {
        case_of(&app, &stray).await.filter(|c| c.card.is_some())
    })
    .await;
    assert_eq!(case.recommendation.option, DecisionOption::Shorten);
    assert_eq!(
        case.options,
        vec![
            DecisionOption::Shorten,
            DecisionOption::Kill,
            DecisionOption::Leave
        ]
    );
    assert_eq!(case.shorten_to_secs, Some(600));
    let card = case.card.clone().unwrap();
    let shown = visible_text(&app.slack.message(card.channel.as_str(), &card.ts).unwrap());
    assert!(shown.contains("Watch rule needs-owner"), "{shown}");
    assert!(
        shown.contains("Created without `owner` metadata"),
        "{shown}"
    );
    assert!(
        shown.contains("its timeout is 2h, above the limit of 1h"),
        "{shown}"
    );
    assert!(
        case_of(&app, &fine).await.is_none(),
        "the owned one is fine"
    );

    // A second delivery of the same creation (the poller, a retry) opens nothing more.
    let before = approvals_texts(&app).len();
    let audit = app.state.store.audit_for_case(&case.id).await.unwrap();
    assert_eq!(audit.iter().filter(|a| a.action == "open").count(), 1);

    // The shorten is a kill with a delay: a kill approver chooses it, and E2B hears it once.
    app.click_case(&case.id, "case_shorten", KILLER, &hook(), &hook())
        .await;
    wait_until("the shortening is done", || async {
        let case = app.state.store.get_case(&case.id).await.unwrap();
        matches!(case.state, CaseState::Done { .. }).then_some(())
    })
    .await;
    let calls = app.e2b_calls().await;
    assert_eq!(calls.get("timeout").copied(), Some(1), "{calls:?}");
    assert_eq!(calls.get("kill").copied(), None, "{calls:?}");
    assert_eq!(
        approvals_texts(&app).len(),
        before,
        "the card was updated in place"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notice_rule_posts_once_and_a_dry_run_rule_raises_nothing() {
    let app = app(r#"
[[watch]]
name = "gpu-only-in-prod"
templates = ["prod-gpu"]
then = "notice"
[[watch]]
name = "scratch-would-be-killed"
metadata = { purpose = "scratch*" }
dry_run = true
"#)
    .await;
    let id = create(&app, json!({"owner": "bo", "purpose": "scratch-7"}), 300).await;
    let notice = wait_until("the notice is posted", || async {
        approvals_texts(&app)
            .into_iter()
            .find(|t| t.contains("gpu-only-in-prod"))
    })
    .await;
    assert!(notice.contains(&id), "{notice}");
    assert!(
        notice.contains("template `base` (") && notice.contains(") is not on the allow list"),
        "{notice}"
    );
    assert!(notice.contains("owner bo"), "{notice}");
    // The dry-run rule matched too, but opened nothing: no case, and only the notice posted.
    assert!(case_of(&app, &id).await.is_none());
    assert_eq!(
        approvals_texts(&app).len(),
        1,
        "{:?}",
        approvals_texts(&app)
    );
    let metrics = app
        .http
        .get(format!("{}/metrics", app.address))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics
            .contains(r#"steward_watch_findings_total{rule_kind="creation",outcome="dry_run"} 1"#),
        "{metrics}"
    );
}

/// A click on one of a burst alert's choices, from the alert's own message, on `address`.
async fn choose(app: &TestApp, address: &str, list: &ListId, option: &str, user: &str) -> String {
    let stored = app.state.store.get_list(list).await.unwrap();
    let message = &stored.messages[0];
    let reply = hook();
    let payload = json!({
        "type": "block_actions",
        "user": {"id": user},
        "trigger_id": format!("trigger-{}", hook()),
        "response_url": app.slack.response_url(&reply),
        "container": {"type": "message", "channel_id": message.channel.as_str(), "message_ts": message.ts},
        "channel": {"id": message.channel.as_str()},
        "actions": [{"action_id": "sweep_list_choose", "block_id": "b", "value": format!("{list}:0:{option}"), "action_ts": hook()}],
    });
    let body = crate::common::interaction_form(&payload);
    let ts = crate::common::unix_now();
    let resp = app
        .http
        .post(format!("{address}/slack/interactions"))
        .header("content-type", "application/x-www-form-urlencoded")
        .header("x-slack-request-timestamp", ts.to_string())
        .header("x-slack-signature", app.sign(ts, body.as_bytes()))
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    reply
}

async fn the_alert(app: &TestApp, id: &ListId) -> ListCase {
    app.state.store.get_list(id).await.unwrap()
}

fn alert_text(app: &TestApp, list: &ListCase) -> String {
    let m = &list.messages[0];
    visible_text(&app.slack.message(m.channel.as_str(), &m.ts).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_burst_alert_grows_as_creations_arrive_and_its_pause_all_runs_once_per_sandbox_over_two_replicas()
 {
    let rules = r#"
[[watch]]
name = "agent-burst"
burst = { more_than = 3, within = "10m", by = "owner" }
"#;
    let app = app(rules).await;
    // A second replica on the same Redis and simulators: it receives the same deliveries (a
    // second registration), counts the same burst and works the same queue.
    let peer = app
        .spawn_peer(TestAppOptions {
            sandboxes: 0,
            policy: Some(policy(rules)),
            env: vec![("E2B_WEBHOOK_SECRET".to_owned(), SECRET.to_owned())],
            ..TestAppOptions::default()
        })
        .await;
    register(&peer).await;

    // Someone else's two sandboxes are not part of the burst.
    for _ in 0..2 {
        create(&app, json!({"owner": "quiet"}), 300).await;
    }
    let mut burst = Vec::new();
    for _ in 0..4 {
        burst.push(create(&app, json!({"owner": "night-agent"}), 3600).await);
    }
    let alert = wait_until("the burst alert lists four sandboxes", || async {
        let ids = app.state.store.active_lists().await.unwrap();
        let list = app.state.store.get_list(ids.first()?).await.ok()?;
        (list.groups[0].items.len() == 4 && !list.messages.is_empty()).then_some(list)
    })
    .await;
    let posted = approvals_texts(&app).len();
    let id = alert.id.clone();
    let text = alert_text(&app, &alert);
    assert!(text.contains("Burst"), "{text}");
    assert!(text.contains("created for owner `night-agent`"), "{text}");
    assert!(text.contains("more than 3 within 10 min"), "{text}");
    for button in ["Pause all of these", "Kill all of these", "Leave them"] {
        assert!(text.contains(button), "{button}: {text}");
    }

    // Two more arrive: the same alert grows, nothing new is posted.
    for _ in 0..2 {
        burst.push(create(&app, json!({"owner": "night-agent"}), 3600).await);
    }
    wait_until("the alert grows to six", || async {
        let ids = app.state.store.active_lists().await.unwrap();
        assert_eq!(ids, vec![id.clone()], "one alert");
        let list = the_alert(&app, &id).await;
        let text = alert_text(&app, &list);
        (list.groups[0].items.len() == 6 && text.contains("6 sandboxes")).then_some(())
    })
    .await;
    assert_eq!(approvals_texts(&app).len(), posted, "no second alert");
    let alert = the_alert(&app, &id).await;
    let mut listed: Vec<String> = alert.groups[0]
        .items
        .iter()
        .map(|i| i.sandbox.to_string())
        .collect();
    listed.sort();
    let mut expected = burst.clone();
    expected.sort();
    assert_eq!(listed, expected, "exactly the burst, not the quiet owner's");

    // Someone not allowed to pause is refused; a pauser's Pause all, clicked on both replicas
    // at once, is recorded once and carried out once per sandbox.
    let refused = choose(&app, &app.address, &alert.id, "pause", "U0999").await;
    let said = visible_text(&app.wait_for_hook(&refused).await);
    assert!(said.contains("not an approver"), "{said}");
    app.e2b.hooks().reset_calls().await.unwrap();
    let (a, b) = tokio::join!(
        choose(&app, &app.address, &alert.id, "pause", PAUSER),
        choose(&app, &peer.address, &alert.id, "pause", KILLER),
    );
    let _ = (a, b);
    wait_until("every sandbox of the burst is paused", || async {
        let list = the_alert(&app, &id).await;
        let cases = app
            .state
            .store
            .cases_of(
                &list.groups[0]
                    .items
                    .iter()
                    .map(|i| (Subject::Sandbox(i.sandbox.clone()), i.case.clone()))
                    .collect::<Vec<_>>(),
            )
            .await
            .unwrap();
        cases
            .iter()
            .all(|c| matches!(c.as_ref().map(|c| &c.state), Some(CaseState::Done { .. })))
            .then_some(())
    })
    .await;
    let list = the_alert(&app, &id).await;
    assert!(
        matches!(list.groups[0].decision, GroupDecision::Approved { .. }),
        "{:?}",
        list.groups[0].decision
    );
    assert_eq!(list.groups[0].option, DecisionOption::Pause);
    let calls = app.e2b_calls().await;
    assert_eq!(calls.get("pause").copied(), Some(6), "{calls:?}");
    assert_eq!(calls.get("kill").copied(), None, "{calls:?}");
    wait_until("the alert says they are paused", || async {
        let text = alert_text(&app, &the_alert(&app, &id).await);
        text.contains("6 done").then_some(())
    })
    .await;
    peer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_case_card_shows_the_sandboxs_lifecycle_as_e2b_reported_it() {
    let app = app("").await;
    let id = create(&app, json!({"owner": "ann"}), 3600).await;
    e2b(
        &app,
        reqwest::Method::POST,
        &format!("/sandboxes/{id}/pause"),
        None,
    )
    .await;
    e2b(
        &app,
        reqwest::Method::POST,
        &format!("/sandboxes/{id}/resume"),
        Some(json!({"timeout": 3600})),
    )
    .await;
    let sandbox = SandboxId::parse(&id).unwrap();
    wait_until("three lifecycle events are recorded", || async {
        let seen = app.state.store.lifecycle_of(&sandbox).await.unwrap();
        (seen.len() == 3).then_some(())
    })
    .await;

    let name = hook();
    app.post_command_to(&format!("kill {id} done with it"), &name)
        .await;
    let said = visible_text(&app.wait_for_hook(&name).await);
    assert!(said.contains("Opened case"), "{said}");
    let case = case_of(&app, &id).await.unwrap();
    let kinds: Vec<&str> = case
        .evidence
        .lifecycle
        .iter()
        .map(|e| e.what.as_str())
        .collect();
    assert_eq!(kinds, ["created", "paused", "resumed"]);
    let card = case.card.clone().unwrap();
    let shown = visible_text(&app.slack.message(card.channel.as_str(), &card.ts).unwrap());
    let line = shown
        .lines()
        .skip_while(|l| !l.contains("Lifecycle (E2B)"))
        .nth(1)
        .unwrap_or_else(|| panic!("no lifecycle on the card: {shown}"));
    assert!(
        line.starts_with("created ") && line.contains(" · paused ") && line.contains(" · resumed "),
        "{line}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_creation_whose_sandbox_is_already_gone_raises_nothing() {
    let app = app(r#"
[[watch]]
name = "needs-owner"
require_metadata = ["owner"]
"#)
    .await;
    // A signed `created` event for a sandbox E2B no longer has (killed before it was handled).
    let body = serde_json::to_vec(&json!({
        "version": "v1", "id": "ev-gone-1", "type": "sandbox.lifecycle.created",
        "eventData": {"sandbox_metadata": {}}, "sandboxBuildId": "b", "sandboxExecutionId": "x",
        "sandboxId": "igone0000000000000001", "sandboxTeamId": "t",
        "sandboxTemplateId": "base", "timestamp": "2026-12-07T10:00:00Z",
    }))
    .unwrap();
    let secret = secrecy::SecretString::from(SECRET.to_owned());
    let r = app
        .http
        .post(format!("{}/e2b/webhook", app.address))
        .header("content-type", "application/json")
        .header("e2b-signature-version", "v1")
        .header(
            "e2b-signature",
            sandbox_steward::lifecycle::signature(&secret, &body),
        )
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    wait_until("the event is handled", || async {
        let metrics = app
            .http
            .get(format!("{}/metrics", app.address))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        metrics
            .contains(r#"steward_e2b_events_total{event="created",outcome="no_case"} 1"#)
            .then_some(())
    })
    .await;
    assert!(case_of(&app, "igone0000000000000001").await.is_none());
    assert!(approvals_texts(&app).is_empty());
    let calls = app.e2b_calls().await;
    assert_eq!(calls.get("get").copied(), Some(1), "read once: {calls:?}");
}
