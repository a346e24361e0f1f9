//! Shortening a sandbox's life is a kill with a delay: `/sandbox timeout` that would end a
//! sandbox sooner needs someone allowed to kill, opens a case for anyone else (whose "Shorten"
//! sets the timeout once a kill approver chooses it), and is refused to everyone while the
//! sandbox has an open case. Extending stays free. Sent signed to a spawned app; the E2B
//! simulator counts what reached it.

use chrono::Utc;
use sandbox_steward::cases::{CaseState, DecisionOption, Subject};
use sandbox_steward::ids::SandboxId;
use sandbox_steward::sim::slack::Recorded;
use serde_json::{Value, json};

use crate::common::{
    TestApp, TestAppOptions, command_form, hook, spawn_app_with, visible_text, wait_until,
};

const APPROVALS: &str = "C0APPROVALS";
/// May choose Kill (and so Shorten).
const KILLER: &str = "U0002";
/// May run commands, pause and leave, but not kill.
const ASKER: &str = "U0001";
/// A second kill approver, for the two-person rule.
const OTHER_KILLER: &str = "U0003";

fn options() -> TestAppOptions {
    TestAppOptions {
        sandboxes: 0,
        policy: Some(format!(
            r#"
[channels]
approvals = "{APPROVALS}"
[approvals.approvers]
kill = {{ users = ["{KILLER}", "{OTHER_KILLER}"] }}
pause = {{ anyone = true }}
leave = {{ anyone = true }}
"#
        )),
        ..TestAppOptions::default()
    }
}

/// A running sandbox with ten hours to live.
fn running(id: &str) -> Value {
    let now = Utc::now();
    json!({"sandboxID": id, "templateID": "base", "state": "running",
        "startedAt": (now - chrono::Duration::hours(1)).to_rfc3339(),
        "endAt": (now + chrono::Duration::hours(10)).to_rfc3339()})
}

fn paused(id: &str) -> Value {
    let now = Utc::now();
    json!({"sandboxID": id, "templateID": "base", "state": "paused",
        "startedAt": (now - chrono::Duration::hours(3)).to_rfc3339(),
        "endAt": (now - chrono::Duration::hours(1)).to_rfc3339()})
}

/// `/sandbox <text>` from `user`, signed; returns what the command's task posted back.
async fn run_as(app: &TestApp, user: &str, text: &str) -> Recorded {
    let name = hook();
    let body = command_form(text, user, &app.slack.response_url(&name));
    let resp = app
        .post_signed("/slack/commands", "application/x-www-form-urlencoded", body)
        .await;
    assert_eq!(resp.status(), 200);
    app.wait_for_hook(&name).await
}

async fn calls(app: &TestApp, op: &str) -> u64 {
    app.e2b_calls().await.get(op).copied().unwrap_or(0)
}

fn sandbox(id: &str) -> SandboxId {
    SandboxId::parse(id).unwrap()
}

/// How long until E2B ends `id`, as E2B says now.
async fn time_left(app: &TestApp, id: &str) -> chrono::Duration {
    let e2b = app.state.e2b.as_ref().unwrap();
    let detail = e2b.get_sandbox(&sandbox(id)).await.unwrap();
    detail.end_at - Utc::now()
}

async fn open_case(app: &TestApp, id: &str) -> Option<sandbox_steward::cases::Case> {
    app.state
        .store
        .case_for_subject(&Subject::Sandbox(sandbox(id)))
        .await
        .unwrap()
}

/// `action outcome` of every audit event about sandbox `id`.
async fn audit_of(app: &TestApp, id: &str) -> Vec<String> {
    let subject = Subject::Sandbox(sandbox(id));
    app.state
        .store
        .audit_since(Utc::now() - chrono::Duration::hours(1))
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.subject.as_ref() == Some(&subject))
        .map(|e| format!("{} {}", e.action, e.outcome))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_approvers_ten_minute_timeout_sets_nothing_and_opens_a_case_a_kill_approver_carries_out()
 {
    let app = spawn_app_with(options()).await;
    app.seed_sandbox(running("hours1")).await;

    let reply = visible_text(&run_as(&app, ASKER, "timeout hours1 10m").await);

    assert!(reply.contains("Opened case"), "{reply}");
    assert_eq!(calls(&app, "timeout").await, 0, "E2B heard no timeout");
    assert!(time_left(&app, "hours1").await > chrono::Duration::hours(9));
    let case = open_case(&app, "hours1").await.expect("a case is open");
    assert_eq!(case.recommendation.option, DecisionOption::Shorten);
    assert_eq!(case.shorten_to_secs, Some(600));
    assert!(
        case.options.contains(&DecisionOption::Kill),
        "{:?}",
        case.options
    );
    // The card asks what was asked, and says why Steward asks.
    let card = case.card.clone().expect("the card was posted");
    assert_eq!(card.channel.as_str(), APPROVALS);
    let shown = visible_text(&app.slack.message(APPROVALS, &card.ts).unwrap());
    assert!(shown.contains("shorten to 10 min?"), "{shown}");
    assert!(shown.contains("Shorten to 10 min"), "{shown}");
    assert!(shown.contains("/sandbox timeout hours1 10m"), "{shown}");
    assert!(
        audit_of(&app, "hours1")
            .await
            .iter()
            .any(|a| a.starts_with("timeout refused: 10 min would shorten it")),
        "{:?}",
        audit_of(&app, "hours1").await
    );

    // The one who asked may not choose it; a kill approver may, and then E2B hears it.
    let refused = hook();
    app.click_case(&case.id, "case_shorten", ASKER, &refused, &hook())
        .await;
    let said = visible_text(&app.wait_for_hook(&refused).await);
    assert!(said.contains("not an approver"), "{said}");
    app.click_case(&case.id, "case_shorten", KILLER, &hook(), &hook())
        .await;
    wait_until("the shortening is done", || async {
        let case = app.state.store.get_case(&case.id).await.unwrap();
        matches!(case.state, CaseState::Done { .. }).then_some(())
    })
    .await;
    assert_eq!(calls(&app, "timeout").await, 1);
    let left = time_left(&app, "hours1").await;
    assert!(
        left <= chrono::Duration::minutes(10) && left > chrono::Duration::minutes(8),
        "{left}"
    );
    assert_eq!(
        calls(&app, "kill").await,
        0,
        "a shortening kills nothing now"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_approvers_shortening_goes_through_and_is_audited_as_theirs() {
    let app = spawn_app_with(options()).await;
    app.seed_sandbox(running("hours2")).await;

    let reply = visible_text(&run_as(&app, KILLER, "timeout hours2 10m").await);

    assert!(reply.contains("will now end in 10 min"), "{reply}");
    assert_eq!(calls(&app, "timeout").await, 1);
    assert!(time_left(&app, "hours2").await <= chrono::Duration::minutes(10));
    assert!(open_case(&app, "hours2").await.is_none(), "no case needed");
    let audit = audit_of(&app, "hours2").await;
    assert!(
        audit
            .iter()
            .any(|a| a.starts_with("timeout set to 10 min (shortened by a kill approver")),
        "{audit:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_approvers_timeout_below_the_floor_still_needs_a_second_person() {
    let app = spawn_app_with(options()).await;
    app.seed_sandbox(running("hours3")).await;

    let reply = visible_text(&run_as(&app, KILLER, "timeout hours3 5s").await);

    assert!(reply.contains("Opened case"), "{reply}");
    assert_eq!(calls(&app, "timeout").await, 0);
    let case = open_case(&app, "hours3").await.expect("a case is open");
    assert_eq!(case.shorten_to_secs, Some(5));
    let refused = hook();
    app.click_case(&case.id, "case_shorten", KILLER, &refused, &hook())
        .await;
    let said = visible_text(&app.wait_for_hook(&refused).await);
    assert!(said.contains("two-person rule"), "{said}");
    assert_eq!(calls(&app, "timeout").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_an_open_case_even_a_kill_approver_cannot_shorten_the_sandbox() {
    let app = spawn_app_with(options()).await;
    app.seed_sandbox(running("pending1")).await;
    let opened = visible_text(&run_as(&app, ASKER, "kill pending1 done with it").await);
    assert!(opened.contains("Opened case"), "{opened}");
    let case = open_case(&app, "pending1").await.expect("the kill case");

    for user in [KILLER, ASKER] {
        let reply = visible_text(&run_as(&app, user, "timeout pending1 10m").await);
        assert!(reply.contains(case.id.as_str()), "{reply}");
        assert!(
            reply.contains("only be shortened through that case"),
            "{reply}"
        );
    }

    assert_eq!(calls(&app, "timeout").await, 0, "E2B heard no timeout");
    assert!(time_left(&app, "pending1").await > chrono::Duration::hours(9));
    let still = open_case(&app, "pending1").await.unwrap();
    assert_eq!(still.id, case.id, "the same case, untouched");
    assert_eq!(still.state, CaseState::Pending);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extending_stays_free_for_anyone_even_with_an_open_case() {
    let app = spawn_app_with(options()).await;
    app.seed_sandbox(running("longer1")).await;
    run_as(&app, ASKER, "kill longer1").await;
    assert!(open_case(&app, "longer1").await.is_some());

    let reply = visible_text(&run_as(&app, ASKER, "timeout longer1 20h").await);
    assert!(reply.contains("will now end in 20 h"), "{reply}");
    let reply = visible_text(&run_as(&app, ASKER, "refresh longer1 30m").await);
    assert!(reply.contains("Refreshed `longer1`"), "{reply}");

    assert_eq!(calls(&app, "timeout").await, 1);
    assert_eq!(calls(&app, "refresh").await, 1);
    assert!(time_left(&app, "longer1").await > chrono::Duration::hours(19));
    let audit = audit_of(&app, "longer1").await;
    assert!(
        audit
            .iter()
            .any(|a| a.starts_with("timeout set to 20 h (an extension")),
        "{audit:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_sandbox_with_an_open_case_is_not_resumed_and_takes_no_timeout() {
    let app = spawn_app_with(options()).await;
    app.seed_sandbox(paused("napping1")).await;

    let reply = visible_text(&run_as(&app, KILLER, "timeout napping1 30m").await);
    assert!(reply.contains("is paused"), "{reply}");
    assert_eq!(calls(&app, "timeout").await, 0, "E2B was not asked");

    run_as(&app, ASKER, "kill napping1").await;
    let case = open_case(&app, "napping1").await.expect("the kill case");
    let reply = visible_text(&run_as(&app, KILLER, "resume napping1 timeout=1h").await);
    assert!(reply.contains(case.id.as_str()), "{reply}");
    assert_eq!(calls(&app, "resume").await, 0, "E2B was not asked");
    let e2b = app.state.e2b.as_ref().unwrap();
    let detail = e2b.get_sandbox(&sandbox("napping1")).await.unwrap();
    assert_eq!(detail.state.as_str(), "paused");
}
