//! A sandbox restored from its snapshot is usable: it runs for `[approvals] restored_timeout`
//! (or what the original had left, if longer), the card says until when, and Keep longer gives
//! it that long again, for whoever may restore. Over real sockets: the app, the E2B simulator
//! (which ends a sandbox at the timeout it was given) and the fake Slack.

use chrono::{DateTime, Duration as Span, Utc};
use sandbox_steward::ids::{CaseId, SandboxId};
use sandbox_steward::slack::format::when;
use serde_json::json;

use crate::common::{
    TestApp, TestAppOptions, case_id_in, eventually, hook, spawn_app_with, visible_text, wait_until,
};

const APPROVALS: &str = "C0APPROVALS";

/// U0002 may kill; only U0003 may restore (and so keep a restored sandbox longer).
fn options(extra: &str) -> TestAppOptions {
    TestAppOptions {
        sandboxes: 0,
        policy: Some(format!(
            r#"
[channels]
approvals = "{APPROVALS}"
[approvals]
{extra}
[approvals.approvers]
kill = {{ users = ["U0002"] }}
restore = {{ users = ["U0003"] }}
"#
        )),
        ..TestAppOptions::default()
    }
}

/// A running sandbox that E2B ends `left` from now.
async fn seed(app: &TestApp, id: &str, left: Span) {
    let now = Utc::now();
    app.seed_sandbox(
        json!({"sandboxID": id, "templateID": "base", "state": "running",
        "startedAt": (now - Span::minutes(30)).to_rfc3339(),
        "endAt": (now + left).to_rfc3339()}),
    )
    .await;
}

async fn card_text(app: &TestApp, case: &CaseId) -> String {
    let card = app.state.store.get_case(case).await.unwrap().card.unwrap();
    let message = app.slack.message(card.channel.as_str(), &card.ts).unwrap();
    visible_text(&message)
}

async fn click(app: &TestApp, case: &CaseId, action_id: &str, user: &str, reply: &str) {
    let resp = app.click_case(case, action_id, user, reply, &hook()).await;
    assert_eq!(resp.status(), 200);
}

async fn calls(app: &TestApp, op: &str) -> u64 {
    app.e2b_calls().await.get(op).copied().unwrap_or(0)
}

/// When the simulator will end `id`.
async fn end_of(app: &TestApp, id: &SandboxId) -> DateTime<Utc> {
    let e2b = app.state.e2b.as_ref().unwrap();
    e2b.get_sandbox(id).await.unwrap().end_at
}

fn assert_near(found: DateTime<Utc>, wanted: DateTime<Utc>, what: &str) {
    let off = (found - wanted).num_seconds().abs();
    assert!(off <= 60, "{what}: ends {found}, wanted about {wanted}");
}

/// Kills `sandbox` by Snapshot, then kill, restores it as U0003 and returns the case and the
/// restored sandbox, once the card names it.
async fn snapshot_kill_and_restore(app: &TestApp, sandbox: &str) -> (CaseId, SandboxId, String) {
    let opened = hook();
    let resp = app
        .post_command_to(&format!("kill {sandbox} done with it"), &opened)
        .await;
    assert_eq!(resp.status(), 200);
    let case = case_id_in(&visible_text(&app.wait_for_hook(&opened).await));
    click(app, &case, "case_snapshot_then_kill", "U0002", &hook()).await;
    eventually("the card offers Restore", || async {
        card_text(app, &case)
            .await
            .contains("Restore starts it again")
    })
    .await;
    click(app, &case, "case_restore", "U0003", &hook()).await;
    let text = wait_until("the card names the restored sandbox", || async {
        let text = card_text(app, &case).await;
        text.contains(" restored it from ").then_some(text)
    })
    .await;
    let stored = app.state.store.get_case(&case).await.unwrap();
    let restored = stored.restore.unwrap().request.unwrap().sandbox.unwrap();
    (case, restored, text)
}

#[tokio::test]
async fn a_restored_sandbox_runs_for_the_restored_timeout_and_the_card_says_until_when() {
    let app = spawn_app_with(options("")).await;
    // Ten minutes left when it is snapshotted: the default hour is longer, so it gets that.
    seed(&app, "usable1", Span::minutes(10)).await;
    let (case, restored, text) = snapshot_kill_and_restore(&app, "usable1").await;
    let restored_at = Utc::now();
    let end = end_of(&app, &restored).await;
    assert_near(end, restored_at + Span::hours(1), "the restored sandbox");
    assert!(
        text.contains(&format!("it runs until {} (1 h)", when(end))),
        "{text}"
    );
    assert!(text.contains("Keep longer"), "{text}");
    let audit: Vec<String> = app
        .state
        .store
        .audit_for_case(&case)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.outcome)
        .collect();
    assert!(
        audit
            .iter()
            .any(|o| o.contains(&format!("it runs until {} (timeout 1 h)", when(end)))),
        "{audit:?}"
    );
}

#[tokio::test]
async fn a_restored_sandbox_keeps_the_life_the_original_had_left_when_that_is_longer() {
    let app = spawn_app_with(options("restored_timeout = \"30m\"")).await;
    seed(&app, "usable2", Span::hours(3)).await;
    let before = Utc::now();
    let (_, restored, text) = snapshot_kill_and_restore(&app, "usable2").await;
    let end = end_of(&app, &restored).await;
    // Three hours left at the snapshot (a few seconds before `before` + the restore).
    assert_near(end, before + Span::hours(3), "the restored sandbox");
    assert!(
        text.contains(&format!("it runs until {}", when(end))),
        "{text}"
    );
}

#[tokio::test]
async fn keep_longer_extends_a_restored_sandbox_for_a_restorer_and_is_refused_to_anyone_else() {
    let app = spawn_app_with(options("")).await;
    seed(&app, "usable3", Span::minutes(10)).await;
    let (case, restored, _) = snapshot_kill_and_restore(&app, "usable3").await;
    let first_end = end_of(&app, &restored).await;
    let timeouts_before = calls(&app, "timeout").await;

    // U0005 may not restore, so may not keep it longer either: a sentence, nothing changed.
    let refused = hook();
    click(&app, &case, "case_keep_longer", "U0005", &refused).await;
    let answer = visible_text(&app.wait_for_hook(&refused).await);
    assert!(
        answer.contains("You may not keep a restored sandbox longer")
            && answer.contains("Nothing was changed"),
        "{answer}"
    );
    assert_eq!(end_of(&app, &restored).await, first_end);
    assert_eq!(calls(&app, "timeout").await, timeouts_before);
    let stored = app.state.store.get_case(&case).await.unwrap();
    let request = stored.restore.unwrap().request.unwrap();
    assert_eq!(request.kept_by, None);

    // U0003 may: one more hour after the end it had.
    click(&app, &case, "case_keep_longer", "U0003", &hook()).await;
    let text = wait_until("the card says who kept it longer", || async {
        let text = card_text(&app, &case).await;
        text.contains("kept longer by").then_some(text)
    })
    .await;
    let new_end = end_of(&app, &restored).await;
    assert_near(new_end, first_end + Span::hours(1), "the kept sandbox");
    assert!(
        text.contains(&format!("it runs until {}", when(new_end))),
        "{text}"
    );
    assert!(text.contains("Keep longer"), "still offered: {text}");
    assert_eq!(calls(&app, "timeout").await, timeouts_before + 1);
    let audit: Vec<String> = app
        .state
        .store
        .audit_for_case(&case)
        .await
        .unwrap()
        .into_iter()
        .map(|e| format!("{} {}", e.action, e.outcome))
        .collect();
    assert!(
        audit.iter().any(|a| a.starts_with("keep_longer refused"))
            && audit.iter().any(|a| a
                == &format!(
                    "keep_longer kept sandbox {restored} until {} (was {})",
                    when(new_end),
                    when(first_end)
                )),
        "{audit:?}"
    );
}
