//! The sweep through the running service: `/sandbox sweep [--dry-run]` signed like Slack,
//! answered through the response_url, and the scheduler started by `run_until_stopped`.

use crate::common::{TestAppOptions, spawn_app_with, visible_text};
use chrono::Utc;
use sandbox_steward::cases::Subject;
use sandbox_steward::ids::SandboxId;
use sandbox_steward::sim::slack::Recorded;
use sandbox_steward::store::Store;
use serde_json::{Value, json};

const CHANNEL: &str = "C0HYGIENE";

fn policy() -> String {
    format!("[hygiene]\nchannel = \"{CHANNEL}\"\n")
}

fn idle_body() -> Value {
    let now = Utc::now();
    json!({"templateID": "python", "state": "running",
        "startedAt": (now - chrono::Duration::hours(5)).to_rfc3339(),
        "endAt": (now + chrono::Duration::hours(10)).to_rfc3339(),
        "profile": "idle", "metadata": {"owner": "alice"}})
}

fn digests(calls: &[Recorded]) -> Vec<&Recorded> {
    calls
        .iter()
        .filter(|m| {
            m.method == "chat.postMessage"
                && m.thread_ts.is_none()
                && m.channel.as_deref() == Some(CHANNEL)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slash_sweep_dry_run_answers_with_the_digest_and_opens_nothing() {
    let app = spawn_app_with(TestAppOptions {
        sandboxes: 0,
        policy: Some(policy()),
        ..TestAppOptions::default()
    })
    .await;
    let id = app.seed_sandbox(idle_body()).await["sandboxID"]
        .as_str()
        .unwrap()
        .to_owned();

    let resp = app.post_command_to("sweep --dry-run", "dry").await;
    assert_eq!(resp.status(), 200);
    let ack: Value = resp.json().await.unwrap();
    assert!(ack["text"].as_str().unwrap().contains("dry run"), "{ack}");
    let answer = app.wait_for_hook("dry").await;

    let text = visible_text(&answer);
    assert_eq!(answer.response_type.as_deref(), Some("ephemeral"));
    assert!(text.contains("Fleet hygiene (dry run)"), "{text}");
    assert!(text.contains(&id), "the idle sandbox is listed: {text}");
    assert!(text.contains("nothing was opened or posted"), "{text}");
    assert!(digests(&app.slack.messages()).is_empty());
    let subject = Subject::Sandbox(SandboxId::parse(&id).unwrap());
    assert!(
        app.state
            .store
            .case_for_subject(&subject)
            .await
            .unwrap()
            .is_none()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slash_sweep_posts_the_digest_and_cases_in_the_hygiene_channel() {
    let app = spawn_app_with(TestAppOptions {
        sandboxes: 0,
        policy: Some(policy()),
        ..TestAppOptions::default()
    })
    .await;
    let id = app.seed_sandbox(idle_body()).await["sandboxID"]
        .as_str()
        .unwrap()
        .to_owned();

    let resp = app.post_command_to("sweep", "live").await;
    assert_eq!(resp.status(), 200);
    let answer = app.wait_for_hook("live").await;

    let text = visible_text(&answer);
    assert!(text.contains("Sweep done"), "{text}");
    assert!(text.contains("1 case opened"), "{text}");
    let calls = app.slack.messages();
    assert_eq!(digests(&calls).len(), 1, "{calls:#?}");
    let subject = Subject::Sandbox(SandboxId::parse(&id).unwrap());
    let case = app
        .state
        .store
        .case_for_subject(&subject)
        .await
        .unwrap()
        .expect("the idle sandbox has a case");
    assert_eq!(case.card.unwrap().channel.as_str(), CHANNEL);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_starting_replica_runs_the_sweep_it_missed_once() {
    let prefix = crate::common::unique_prefix();
    let store = Store::redis(&crate::common::redis_url(), &prefix)
        .await
        .unwrap();
    let config = sandbox_steward::hygiene::HygieneConfig::default();
    let latest = config.latest_slot(Utc::now()).unwrap();
    store
        .record_completed_sweep(latest - chrono::Duration::days(3))
        .await
        .unwrap();

    let app = spawn_app_with(TestAppOptions {
        sandboxes: 0,
        policy: Some(policy()),
        redis_prefix: Some(prefix),
        ..TestAppOptions::default()
    })
    .await;
    app.seed_sandbox(idle_body()).await;

    // The scheduler ticks at start; wait for the digest it posts.
    crate::common::wait_until("the missed sweep runs", || async {
        (store.last_completed_sweep().await.unwrap() == Some(latest)).then_some(())
    })
    .await;
    assert_eq!(digests(&app.slack.messages()).len(), 1);
}

/// With `[channels] approvals` and `hygiene` apart, the digest, the owner headings and the case
/// cards all go to the hygiene channel (Slack has no thread across channels), and the reply names it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_separate_approvals_and_hygiene_channels_the_whole_sweep_stays_in_the_digest_channel()
{
    const APPROVALS: &str = "C0APPROVALS";
    let app = spawn_app_with(TestAppOptions {
        sandboxes: 0,
        policy: Some(format!(
            "[channels]\napprovals = \"{APPROVALS}\"\nhygiene = \"{CHANNEL}\"\n"
        )),
        ..TestAppOptions::default()
    })
    .await;
    let id = app.seed_sandbox(idle_body()).await["sandboxID"]
        .as_str()
        .unwrap()
        .to_owned();

    let resp = app.post_command_to("sweep", "live").await;
    assert_eq!(resp.status(), 200);
    let answer = app.wait_for_hook("live").await;

    let calls = app.slack.messages();
    let posts: Vec<&Recorded> = calls
        .iter()
        .filter(|m| m.method == "chat.postMessage")
        .collect();
    let digest = digests(&calls);
    assert_eq!(digest.len(), 1, "{calls:#?}");
    let digest_ts = digest[0].ts.clone().unwrap();
    // The owner heading and the card: both in the digest's thread, in its channel, and accepted
    // (the simulator refuses a thread_ts of another channel with thread_not_found).
    let replies: Vec<&&Recorded> = posts.iter().filter(|m| m.thread_ts.is_some()).collect();
    assert_eq!(replies.len(), 2, "{posts:#?}");
    for reply in &replies {
        assert_eq!(reply.channel.as_deref(), Some(CHANNEL), "{reply:#?}");
        assert_eq!(reply.thread_ts.as_deref(), Some(digest_ts.as_str()));
        assert!(reply.ts.is_some(), "Slack accepted it: {reply:#?}");
    }
    assert!(
        calls
            .iter()
            .all(|m| m.channel.as_deref() != Some(APPROVALS)),
        "nothing of the sweep goes to the approvals channel: {calls:#?}"
    );
    let subject = Subject::Sandbox(SandboxId::parse(&id).unwrap());
    let case = app
        .state
        .store
        .case_for_subject(&subject)
        .await
        .unwrap()
        .expect("the idle sandbox has a case");
    assert_eq!(case.card.unwrap().channel.as_str(), CHANNEL);
    let text = visible_text(&answer);
    assert!(text.contains(CHANNEL), "{text}");
    assert!(!text.contains(APPROVALS), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_sweep_with_nothing_new_and_when_nothing_new_nothing_posts_nothing_and_says_so() {
    let app = spawn_app_with(TestAppOptions {
        sandboxes: 0,
        policy: Some(format!("{}when_nothing_new = \"nothing\"\n", policy())),
        ..TestAppOptions::default()
    })
    .await;

    let resp = app.post_command_to("sweep", "quiet").await;
    assert_eq!(resp.status(), 200);
    let answer = app.wait_for_hook("quiet").await;

    let text = visible_text(&answer);
    assert!(
        text.contains("Sweep done: 0 idle of 0 sandboxes; nothing new, so no digest was posted"),
        "{text}"
    );
    assert!(digests(&app.slack.messages()).is_empty());
}
