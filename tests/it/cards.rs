//! Case cards that never lie and cases that are never stuck: user text is cut to Slack's
//! limits before rendering, a card Slack refused is posted when someone asks again, and reasons
//! are escaped. The fake Slack refuses oversize blocks the way Slack does.

use crate::common::{
    PATIENCE, TestApp, TestAppOptions, eventually, poll_for, spawn_app_with, visible_text,
};
use sandbox_steward::cases::{Case, Subject};
use sandbox_steward::ids::SandboxId;
use sandbox_steward::sim::slack::{Fault, Recorded};
use serde_json::{Value, json};

const APPROVALS: &str = "C0APPROVALS";

fn options() -> TestAppOptions {
    TestAppOptions {
        sandboxes: 0,
        policy: Some(format!(
            "[channels]\napprovals = \"{APPROVALS}\"\n[approvals.approvers]\nkill = {{ users = [\"U0002\"] }}\n"
        )),
        ..TestAppOptions::default()
    }
}

async fn seed(app: &TestApp, id: &str) {
    app.seed_sandbox(json!({"sandboxID": id, "templateID": "base", "state": "running"}))
        .await;
}

/// Runs `/sandbox <text>` and returns the ack and the deferred answer.
async fn command(app: &TestApp, text: &str) -> (Value, Recorded) {
    let name = format!("h{}", uuid::Uuid::new_v4().simple());
    let ack: Value = app.post_command_to(text, &name).await.json().await.unwrap();
    (ack, app.wait_for_hook(&name).await)
}

async fn case_of(app: &TestApp, id: &str) -> Option<Case> {
    let subject = Subject::Sandbox(SandboxId::parse(id).unwrap());
    app.state.store.case_for_subject(&subject).await.unwrap()
}

fn card_text(app: &TestApp, case: &Case) -> String {
    let card = case.card.as_ref().expect("the case has a card");
    visible_text(
        &app.slack
            .message(card.channel.as_str(), &card.ts)
            .expect("the card is in Slack"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_with_a_five_thousand_character_reason_posts_a_card_with_the_reason_cut() {
    let app = spawn_app_with(options()).await;
    seed(&app, "wordy1").await;
    let reason = "<too much> & ".repeat(400);

    let (_, reply) = command(&app, &format!("kill wordy1 {reason}")).await;

    let text = visible_text(&reply);
    assert!(text.contains("Opened case"), "{text}");
    let case = case_of(&app, "wordy1").await.expect("a case is open");
    let shown = card_text(&app, &case);
    // Quoted data, cut: the code span ends with the mark.
    assert!(shown.contains("…`"), "{shown}");
    assert!(shown.contains("`&lt;too much&gt; &amp;"), "{shown}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_card_refused_with_not_in_channel_is_posted_when_asked_again_after_the_invite() {
    let app = spawn_app_with(options()).await;
    seed(&app, "lonely1").await;
    app.slack.add_fault(Fault {
        method: "chat.postMessage".into(),
        status: 200,
        retry_after_secs: None,
        count: 1,
        error: Some("not_in_channel".into()),
    });

    let (_, first) = command(&app, "kill lonely1 done").await;
    let text = visible_text(&first);
    assert!(text.contains("/invite @Steward"), "{text}");
    assert!(case_of(&app, "lonely1").await.unwrap().card.is_none());

    // The app is invited (no more faults); asking again posts the card and links it.
    let (_, second) = command(&app, "kill lonely1 done").await;
    let text = visible_text(&second);
    let case = case_of(&app, "lonely1").await.unwrap();
    let card = case.card.clone().expect("the card was posted this time");
    assert!(text.contains("open the card"), "{text}");
    assert_eq!(card.channel.as_str(), APPROVALS);
    assert!(card_text(&app, &case).contains("Waiting for a decision"));
    // A third ask points at that card instead of posting another.
    let (_, third) = command(&app, "kill lonely1 done").await;
    assert!(visible_text(&third).contains("already has an open case"));
    let posts = app
        .slack
        .messages()
        .into_iter()
        .filter(|m| m.method == "chat.postMessage")
        .count();
    assert_eq!(posts, 2, "one refused post and one card");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reason_with_mentions_and_markup_is_shown_escaped_on_the_card() {
    let app = spawn_app_with(options()).await;
    seed(&app, "loud1").await;

    command(
        &app,
        "kill loud1 <!channel> look <https://evil.example|here> & <@U0002>",
    )
    .await;

    let case = case_of(&app, "loud1").await.unwrap();
    let card = case.card.clone().unwrap();
    let message = app.slack.message(APPROVALS, &card.ts).unwrap();
    let blocks = message.blocks.unwrap().to_string();
    assert!(!blocks.contains("<!channel>"), "{blocks}");
    assert!(!blocks.contains("<https://evil.example"), "{blocks}");
    assert!(
        blocks.contains(
            "&lt;!channel&gt; look &lt;https://evil.example|here&gt; &amp; &lt;@U0002&gt;"
        ),
        "{blocks}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_thousand_characters_of_input_get_a_sentence_never_a_broken_template() {
    let app = spawn_app_with(options()).await;
    let long = "x".repeat(5000);

    let resp = app.post_command(&long).await;
    assert_eq!(resp.status(), 200);
    let answer: Value = resp.json().await.unwrap();
    let text = crate::common::visible_json_text(&answer);
    assert!(!text.contains("broken"), "{text}");
    assert!(text.contains("…(cut)"), "{text}");

    // A long argument to a command that runs against E2B is quoted cut in the ack too.
    let resp = app.post_command(&format!("list {long}=1")).await;
    let answer: Value = resp.json().await.unwrap();
    let text = crate::common::visible_json_text(&answer);
    assert!(!text.contains("broken"), "{text}");
    let text = visible_text(&app.wait_for_hook("cmd").await);
    assert!(!text.contains("broken"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_button_naming_another_case_than_its_card_changes_nothing() {
    use sandbox_steward::cases::{CaseState, DecisionOption};
    use sandbox_steward::slack::payload::case_option_action_id;
    let app = spawn_app_with(options()).await;
    seed(&app, "first1").await;
    seed(&app, "second1").await;
    command(&app, "kill first1 one").await;
    command(&app, "kill second1 two").await;
    let first = case_of(&app, "first1").await.unwrap();
    let second = case_of(&app, "second1").await.unwrap();
    let first_card = first.card.clone().unwrap();

    // A Pause click on the first card whose value names the second case (anyone may pause).
    let reply = format!("h{}", uuid::Uuid::new_v4().simple());
    let payload = json!({
        "type": "block_actions",
        "user": {"id": "U0003"},
        "trigger_id": "trigger-forged",
        "response_url": app.slack.response_url(&reply),
        "container": {"type": "message", "channel_id": APPROVALS, "message_ts": first_card.ts},
        "channel": {"id": APPROVALS},
        "actions": [{"action_id": case_option_action_id(DecisionOption::Pause), "block_id": "b",
                     "value": second.id.as_str(), "action_ts": "9.9"}],
    });
    assert_eq!(app.post_interaction(&payload).await.status(), 200);

    let answer = app.wait_for_hook(&reply).await;
    assert!(
        visible_text(&answer).contains("does not belong to this case's card"),
        "{answer:?}"
    );
    for case in [&first, &second] {
        let now = app.state.store.get_case(&case.id).await.unwrap();
        assert_eq!(now.state, CaseState::Pending);
    }
    let audit = app.state.store.audit_for_case(&second.id).await.unwrap();
    assert!(
        audit
            .iter()
            .any(|e| e.outcome.contains("not on this case's card")),
        "{audit:?}"
    );
    assert_eq!(app.e2b_calls().await.get("pause").copied().unwrap_or(0), 0);
}

/// A signed click on `case`'s own card by `user`.
async fn click(
    app: &TestApp,
    case: &Case,
    option: sandbox_steward::cases::DecisionOption,
    user: &str,
) {
    use sandbox_steward::slack::payload::case_option_action_id;
    let card = case.card.clone().expect("the case has a card");
    let payload = json!({
        "type": "block_actions",
        "user": {"id": user},
        "trigger_id": format!("trigger-{}", uuid::Uuid::new_v4().simple()),
        "response_url": app.slack.response_url(&format!("h{}", uuid::Uuid::new_v4().simple())),
        "container": {"type": "message", "channel_id": card.channel.as_str(), "message_ts": card.ts},
        "channel": {"id": card.channel.as_str()},
        "actions": [{"action_id": case_option_action_id(option), "block_id": "b",
                     "value": case.id.as_str(), "action_ts": uuid::Uuid::new_v4().to_string()}],
    });
    assert_eq!(app.post_interaction(&payload).await.status(), 200);
}

/// Waits until the card shows the case's end state without decision buttons.
async fn wait_for_final_card(app: &TestApp, case: &Case) {
    let card = case.card.clone().unwrap();
    let text = || visible_text(&app.slack.message(card.channel.as_str(), &card.ts).unwrap());
    let ended = poll_for(PATIENCE, || async {
        let message = app.slack.message(card.channel.as_str(), &card.ts).unwrap();
        let blocks = message.blocks.clone().unwrap_or_default().to_string();
        // Only Restore may stay (after a Snapshot, then kill).
        let buttons = blocks.matches("\"button\"").count();
        (visible_text(&message).contains(":white_check_mark:")
            && buttons == blocks.matches("case_restore").count())
        .then_some(())
    })
    .await;
    assert!(
        ended.is_some(),
        "the card never showed the end state: {}",
        text()
    );
}

async fn paused_in_e2b(app: &TestApp, id: &str) -> bool {
    let e2b = app.state.e2b.as_ref().unwrap();
    e2b.get_sandbox(&SandboxId::parse(id).unwrap())
        .await
        .is_ok_and(|s| s.state == sandbox_steward::e2b::SandboxState::Paused)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_card_update_that_fails_twice_with_a_500_is_retried_and_shows_the_end_state() {
    let app = spawn_app_with(options()).await;
    seed(&app, "flaky1").await;
    command(&app, "kill flaky1 tidy up").await;
    let case = case_of(&app, "flaky1").await.unwrap();
    app.slack.add_fault(Fault {
        method: "chat.update".into(),
        status: 500,
        retry_after_secs: None,
        count: 2,
        error: None,
    });

    click(
        &app,
        &case,
        sandbox_steward::cases::DecisionOption::Pause,
        "U0003",
    )
    .await;

    wait_for_final_card(&app, &case).await;
    assert!(paused_in_e2b(&app, "flaky1").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_card_whose_updates_failed_for_good_is_repaired_by_a_later_pass() {
    let app = spawn_app_with(options()).await;
    seed(&app, "flaky2").await;
    command(&app, "kill flaky2 tidy up").await;
    let case = case_of(&app, "flaky2").await.unwrap();
    // More failures than one update's retries: the decision's and the worker's updates both
    // fail for good, and so does the first repair.
    app.slack.add_fault(Fault {
        method: "chat.update".into(),
        status: 500,
        retry_after_secs: None,
        count: 10,
        error: None,
    });

    click(
        &app,
        &case,
        sandbox_steward::cases::DecisionOption::Pause,
        "U0003",
    )
    .await;

    wait_for_final_card(&app, &case).await;
    assert!(paused_in_e2b(&app, "flaky2").await);
    let updates = app
        .slack
        .messages()
        .into_iter()
        .filter(|m| m.method == "chat.update")
        .count();
    assert!(
        updates > 10,
        "the card was written after the faults ran out: {updates}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_click_that_finds_every_follow_up_place_taken_is_told_steward_is_busy() {
    use sandbox_steward::cases::{CaseState, DecisionOption};
    use sandbox_steward::slack::payload::case_option_action_id;
    let mut opts = options();
    opts.policy = opts
        .policy
        .map(|p| format!("{p}[limits]\nfollow_ups = 1\n"));
    let app = spawn_app_with(opts).await;
    seed(&app, "crowded1").await;
    command(&app, "kill crowded1 tidy").await;
    let case = case_of(&app, "crowded1").await.unwrap();
    let card = case.card.clone().unwrap();
    let taken = app.state.limits.try_follow_up().expect("a free place");

    let reply = format!("h{}", uuid::Uuid::new_v4().simple());
    let payload = json!({
        "type": "block_actions",
        "user": {"id": "U0003"},
        "trigger_id": "trigger-busy",
        "response_url": app.slack.response_url(&reply),
        "container": {"type": "message", "channel_id": APPROVALS, "message_ts": card.ts},
        "channel": {"id": APPROVALS},
        "actions": [{"action_id": case_option_action_id(DecisionOption::Pause), "block_id": "b",
                     "value": case.id.as_str(), "action_ts": "7.7"}],
    });
    assert_eq!(app.post_interaction(&payload).await.status(), 200);

    let answer = visible_text(&app.wait_for_hook(&reply).await);
    assert!(answer.contains("Steward is busy"), "{answer}");
    let now = app.state.store.get_case(&case.id).await.unwrap();
    assert_eq!(now.state, CaseState::Pending);
    drop(taken);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_single_follow_up_place_a_decision_still_updates_its_card_and_runs() {
    let mut opts = options();
    opts.policy = opts
        .policy
        .map(|p| format!("{p}[limits]\nfollow_ups = 1\n"));
    let app = spawn_app_with(opts).await;
    seed(&app, "narrow1").await;
    command(&app, "kill narrow1 tidy").await;
    let case = case_of(&app, "narrow1").await.unwrap();

    // The click's own task holds the only place, so the card update and the enqueue run in it.
    click(
        &app,
        &case,
        sandbox_steward::cases::DecisionOption::Pause,
        "U0003",
    )
    .await;

    wait_for_final_card(&app, &case).await;
    assert!(paused_in_e2b(&app, "narrow1").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_card_slack_keeps_refusing_is_given_up_after_a_bounded_number_of_repairs() {
    let app = spawn_app_with(options()).await;
    seed(&app, "gone1").await;
    command(&app, "kill gone1 tidy").await;
    let case = case_of(&app, "gone1").await.unwrap();
    // Someone deleted the card: every update is refused for good.
    app.slack.add_fault(Fault {
        method: "chat.update".into(),
        status: 200,
        retry_after_secs: None,
        count: 1000,
        error: Some("message_not_found".into()),
    });

    click(
        &app,
        &case,
        sandbox_steward::cases::DecisionOption::Pause,
        "U0003",
    )
    .await;

    // The out-of-date card is recorded in the store, so any replica (not only this one) repairs it.
    async fn remembered(app: &TestApp, case: &sandbox_steward::ids::CaseId) -> bool {
        app.state
            .store
            .stale_cards()
            .await
            .unwrap()
            .into_iter()
            .any(|(id, _)| &id == case)
    }
    eventually("the stale card remembered", || remembered(&app, &case.id)).await;
    eventually("the stale card given up", || async {
        !remembered(&app, &case.id).await
    })
    .await;
    let updates = app
        .slack
        .messages()
        .into_iter()
        .filter(|m| m.method == "chat.update")
        .count();
    assert!(
        updates <= sandbox_steward::approvals::repair::REPAIR_MAX_FAILURES as usize + 3,
        "{updates} updates"
    );
    assert!(
        paused_in_e2b(&app, "gone1").await,
        "the decision itself ran"
    );
}

/// The buttons of a posted card as (action_id, style), in their order.
fn buttons_of(message: &Recorded) -> Vec<(String, Option<String>)> {
    let blocks = message.blocks.clone().unwrap_or_default();
    let Some(actions) = blocks
        .as_array()
        .into_iter()
        .flatten()
        .find(|b| b["type"] == "actions")
    else {
        return Vec::new();
    };
    actions["elements"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            (
                b["action_id"].as_str().unwrap().to_owned(),
                b["style"].as_str().map(str::to_owned),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_highlighted_first_button_is_the_option_steward_recommends() {
    use sandbox_steward::approvals::{CardTarget, open_case};
    use sandbox_steward::cases::{CaseDraft, DecisionOption, Evidence, Opener, Recommendation};
    use sandbox_steward::ids::SlackChannelId;
    let app = spawn_app_with(options()).await;
    let styled = |id: &str, style: Option<&str>| (id.to_owned(), style.map(str::to_owned));
    for (sandbox, recommended, expected) in [
        (
            "rpause1",
            DecisionOption::Pause,
            vec![
                styled("case_pause", Some("primary")),
                styled("case_snapshot_then_kill", None),
                styled("case_kill", Some("danger")),
                styled("case_leave", None),
            ],
        ),
        (
            "rleave1",
            DecisionOption::Leave,
            vec![
                styled("case_leave", Some("primary")),
                styled("case_snapshot_then_kill", None),
                styled("case_kill", Some("danger")),
                styled("case_pause", None),
            ],
        ),
        (
            "rsnap1",
            DecisionOption::SnapshotThenKill,
            vec![
                styled("case_snapshot_then_kill", Some("primary")),
                styled("case_kill", Some("danger")),
                styled("case_pause", None),
                styled("case_leave", None),
            ],
        ),
    ] {
        let draft = CaseDraft {
            subject: Subject::Sandbox(SandboxId::parse(sandbox).unwrap()),
            evidence: Evidence {
                state: Some("running".into()),
                ..Evidence::default()
            },
            recommendation: Recommendation {
                option: recommended,
                reason: "idle for 3 h".into(),
            },
            options: None,
            opener: Opener::Sweep,
            reason: "idle".into(),
            decide_by: chrono::Utc::now() + chrono::Duration::hours(4),
        };
        let target = CardTarget {
            channel: SlackChannelId::parse(APPROVALS).unwrap(),
            thread_ts: None,
        };
        open_case(
            &app.state.store,
            &app.state.slack,
            &app.state.templates,
            draft,
            target,
            chrono::Utc::now(),
        )
        .await
        .unwrap();
        let case = case_of(&app, sandbox).await.unwrap();
        let card = case.card.clone().expect("the card was posted");
        let message = app.slack.message(APPROVALS, &card.ts).unwrap();
        assert_eq!(buttons_of(&message), expected, "{recommended:?}");
        let blocks = message.blocks.clone().unwrap().to_string();
        assert!(
            blocks.contains(&format!("Steward recommends *{recommended}*")),
            "{blocks}"
        );
        // Kill keeps its confirm dialog whatever is recommended.
        assert!(blocks.contains("Kill without a snapshot?"), "{blocks}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_card_says_the_sandbox_was_killed_after_its_snapshot() {
    use sandbox_steward::cases::{CaseState, DecisionOption};
    let app = spawn_app_with(options()).await;
    app.seed_sandbox(json!({"sandboxID": "endsnap1", "templateID": "python", "state": "running"}))
        .await;
    let e2b = app.state.e2b.as_ref().unwrap();
    let detail = e2b
        .get_sandbox(&SandboxId::parse("endsnap1").unwrap())
        .await
        .unwrap();
    let alias = detail
        .alias
        .clone()
        .expect("the simulator names python by alias");
    command(&app, "kill endsnap1 done with it").await;
    let case = case_of(&app, "endsnap1").await.unwrap();

    // While pending, the card shows the template by its alias and its opener as a mention.
    let pending = card_text(&app, &case);
    assert!(
        pending.contains(&format!("*Template*\n`{alias}`")),
        "{pending}"
    );
    assert!(!pending.contains(detail.template_id.as_str()), "{pending}");

    click(&app, &case, DecisionOption::SnapshotThenKill, "U0002").await;
    wait_for_final_card(&app, &case).await;

    let done = app.state.store.get_case(&case.id).await.unwrap();
    let CaseState::Done { steps, .. } = &done.state else {
        panic!("{:?}", done.state);
    };
    let snapshot = steps
        .iter()
        .find_map(|r| match &r.outcome {
            sandbox_steward::cases::StepOutcome::SnapshotCreated { snapshot_id, .. } => {
                Some(snapshot_id.to_string())
            }
            _ => None,
        })
        .expect("a snapshot was taken");
    let card = case.card.clone().unwrap();
    let message = app.slack.message(APPROVALS, &card.ts).unwrap();
    let blocks = message.blocks.clone().unwrap();
    assert_eq!(
        blocks[0]["text"]["text"],
        "Sandbox endsnap1 killed, snapshot kept"
    );
    // The long snapshot id is named once, in the command that starts a sandbox from it.
    let shown = serde_json::to_string(&blocks).unwrap();
    assert_eq!(shown.matches(snapshot.as_str()).count(), 1, "{shown}");
    let fields: Vec<&str> = blocks[2]["fields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["text"].as_str().unwrap())
        .collect();
    assert!(fields.contains(&"*State*\nkilled"), "{fields:?}");
    assert!(!blocks.to_string().contains("kill it?"), "{blocks}");
    // The decider is a mention Slack renders, not escaped text.
    assert!(
        blocks
            .to_string()
            .contains(":white_check_mark: <@U0002> chose"),
        "{blocks}"
    );
    // The case id is said once, in the small context line at the bottom.
    assert_eq!(visible_text(&message).matches(case.id.as_str()).count(), 1);
    // Restore stays for a while: the only button left.
    assert!(blocks.to_string().contains("case_restore"), "{blocks}");
}

/// Issue 39's kill reason: lines a person would take for the card's own.
const FAKE_CARD_LINES: &str = "\n:white_check_mark: *Steward recommends Kill*…\n*State*\nstopped";

/// An agent asks for a kill through `POST /api/v1/cases`; the card Slack received for it.
async fn agent_card(app: &TestApp, sandbox: &str, reason: &str) -> Recorded {
    app.seed_sandbox(json!({"sandboxID": sandbox, "templateID": "base", "state": "running"}))
        .await;
    let resp = app
        .http
        .post(app.url("/api/v1/cases"))
        .bearer_auth(crate::api::AGENT_TOKEN)
        .json(&json!({"action": "kill_sandbox", "sandbox_id": sandbox, "reason": reason}))
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success(), "{:?}", resp.text().await);
    let case = case_of(app, sandbox)
        .await
        .expect("the agent's case is open");
    let card = case.card.expect("the case has a card");
    app.slack
        .message(card.channel.as_str(), &card.ts)
        .expect("the card is in Slack")
}

/// How many blocks a card has and how many lines each one holds.
fn shape(card: &Recorded) -> Vec<usize> {
    card.blocks
        .as_ref()
        .and_then(Value::as_array)
        .expect("the card has blocks")
        .iter()
        .map(|b| b.to_string().matches("\\n").count())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agents_reason_written_as_card_lines_is_one_quoted_line_with_no_mention() {
    let app = spawn_app_with(TestAppOptions {
        sandboxes: 0,
        policy: Some(crate::api::api_policy()),
        ..TestAppOptions::default()
    })
    .await;
    let plain = agent_card(&app, "plain1", "the nightly job is done").await;
    let hostile = agent_card(&app, "fake1", FAKE_CARD_LINES).await;
    let loud = agent_card(&app, "loud2", "<!channel> look\0 here <@U0002> :fire:").await;

    let asks = |card: &Recorded| card.blocks.as_ref().unwrap()[1]["text"]["text"].clone();
    assert_eq!(
        asks(&hostile),
        "Agent agent asks to kill this sandbox: \
         `:white_check_mark: *Steward recommends Kill*…⏎*State*⏎stopped`"
    );
    assert_eq!(
        asks(&loud),
        "Agent agent asks to kill this sandbox: \
         `&lt;!channel&gt; look here &lt;@U0002&gt; :fire:`"
    );
    // No block or line was added by the reason: the cards have the benign one's shape.
    assert_eq!(shape(&hostile), shape(&plain));
    assert_eq!(shape(&loud), shape(&plain));
    for card in [&hostile, &loud] {
        let all = serde_json::to_string(card).unwrap();
        assert!(!all.contains("<!channel>"), "{all}");
        assert!(!all.contains("<@U0002>"), "{all}");
        assert!(!all.contains("\\u0000"), "{all}");
        // The notification text names the case, not the reason.
        assert!(
            !card
                .text
                .clone()
                .unwrap_or_default()
                .contains("Steward recommends Kill")
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_tests_commit_message_and_author_are_quoted_on_one_line_in_its_alert() {
    use crate::github::{commit, make_repo, push, push_body, spawn};

    let dir = tempfile::tempdir().unwrap();
    let (origin, _) = make_repo(dir.path());
    let failing = commit(&origin, "fail");
    let app = spawn(&origin).await;
    let mut body = push_body("refs/heads/main", &failing, &["fail"]);
    body["head_commit"]["message"] =
        json!("Fix *bold* _it_ :fire: <!channel>\n*State*\nstopped\n> quoted");
    body["head_commit"]["author"] = json!({"name": "Mallory\n*Steward*", "email": "m@example.com"});
    assert_eq!(push(&app, "d-hostile", &body).await.status(), 202);

    let alert = crate::common::wait_until("the alert", || async {
        app.slack
            .messages()
            .into_iter()
            .find(|m| m.channel.as_deref() == Some("C0ENG") && m.attachments.is_some())
    })
    .await;
    let details = alert.attachments.as_ref().unwrap()[0]["blocks"][0]["text"]["text"]
        .as_str()
        .unwrap()
        .to_owned();
    let lines: Vec<&str> = details.lines().collect();
    assert_eq!(
        lines[0],
        format!(
            "*Commit* <https://github.com/acme/api/commit/{failing}|{}> \
             `Fix *bold* _it_ :fire: &lt;!channel&gt;`",
            &failing[..7]
        )
    );
    assert!(
        lines[1].starts_with("*Author* `Mallory⏎*Steward*` · *Pushed by* <@U0BOB>"),
        "{details}"
    );
    assert!(lines[2].starts_with("*Command* `"), "{details}");
    assert_eq!(lines.len(), 3, "{details}");
    let all = serde_json::to_string(&alert).unwrap();
    assert!(
        !all.contains("<!channel>") && !all.contains("stopped"),
        "{all}"
    );
}
