//! Slack's errors as the Slack simulator answers them from the state it holds (no programmed
//! fault anywhere in this file), and what Steward makes of them over real sockets: a card to a
//! channel Steward is not in tells the person to `/invite @Steward`, once; a refused bot token
//! is named by `steward check`; a rate limit is waited out.
use std::process::Stdio;

use crate::common::{E2B_KEY, TestApp, TestAppOptions, spawn_app_on, visible_text};
use sandbox_steward::cases::{Case, Subject};
use sandbox_steward::config::SlackSettings;
use sandbox_steward::ids::{SandboxId, SlackChannelId};
use sandbox_steward::sim::e2b::{SimOptions, SimServer};
use sandbox_steward::sim::slack::{RateLimit, Recorded, SimChannel, SlackSim, SlackSimOptions};
use sandbox_steward::slack::client::{SlackClient, SlackError};
use sandbox_steward::slack::render::Message;
use secrecy::SecretString;
use serde_json::{Value, json};
use std::sync::Arc;

const APPROVALS: &str = "C0APPROVALS";

fn channel(name: &str, id: &str) -> SimChannel {
    SimChannel {
        id: id.into(),
        name: name.into(),
    }
}

/// A simulator as strict as Slack: `#general` (the bot is in it), `#approvals` (it is not),
/// nothing else.
fn strict() -> SlackSimOptions {
    SlackSimOptions {
        channels: vec![channel("general", "C0GENERAL")],
        channels_without_bot: vec![channel("approvals", APPROVALS)],
        only_listed_channels: true,
        ..SlackSimOptions::default()
    }
}

async fn client_of(sim: &SlackSim, token: &str) -> SlackClient {
    SlackClient::new(&SlackSettings {
        api_url: sim.api_url(),
        bot_token: Some(SecretString::from(token.to_owned())),
        signing_secret: None,
        templates_dir: None,
    })
    .unwrap()
}

fn code(e: &SlackError) -> &str {
    match e {
        SlackError::Api { code } => code,
        other => panic!("not an API error: {other}"),
    }
}

fn id(text: &str) -> SlackChannelId {
    SlackChannelId::parse(text).unwrap()
}

#[tokio::test]
async fn the_simulator_refuses_what_slack_refuses_from_what_it_holds() {
    let sim = SlackSim::start(strict()).await.unwrap();
    let client = client_of(&sim, "xoxb-1").await;

    let unknown = client
        .post_message(&id("C0NOSUCH"), Message::plain("x"))
        .await
        .unwrap_err();
    assert_eq!(code(&unknown), "channel_not_found");
    let outside = client
        .post_message(&id(APPROVALS), Message::plain("x"))
        .await
        .unwrap_err();
    assert_eq!(code(&outside), "not_in_channel");
    let empty = client
        .post_message(&id("C0GENERAL"), Message::plain(String::new()))
        .await
        .unwrap_err();
    assert_eq!(code(&empty), "no_text");
    let long = client
        .post_message(&id("C0GENERAL"), Message::plain("a".repeat(40_001)))
        .await
        .unwrap_err();
    assert_eq!(code(&long), "msg_too_long");
    let no_thread = client
        .post_message_in_thread(&id("C0GENERAL"), Some("1.000001"), Message::plain("x"))
        .await
        .unwrap_err();
    assert_eq!(code(&no_thread), "thread_not_found");
    let no_message = client
        .update_message(&id("C0GENERAL"), "1.000001", Message::plain("x"))
        .await
        .unwrap_err();
    assert_eq!(code(&no_message), "message_not_found");
    assert!(sim.snapshot().messages.is_empty(), "nothing was posted");

    // Invited, the bot posts there; the answer names the channel by its id.
    assert!(sim.invite_bot(APPROVALS));
    let (posted_to, _) = client
        .post_message(&id(APPROVALS), Message::plain("x"))
        .await
        .unwrap();
    assert_eq!(posted_to.as_str(), APPROVALS);
}

#[tokio::test]
async fn tokens_are_checked_as_slack_checks_them() {
    let sim = SlackSim::start(SlackSimOptions {
        bot_token: Some(SecretString::from("xoxb-the-one".to_owned())),
        ..SlackSimOptions::default()
    })
    .await
    .unwrap();
    let http = reqwest::Client::new();
    let auth_test = |token: Option<&'static str>| {
        let request = http.post(format!("{}/auth.test", sim.api_url()));
        let request = match token {
            Some(token) => request.bearer_auth(token),
            None => request,
        };
        async move { request.send().await.unwrap().json::<Value>().await.unwrap() }
    };
    assert_eq!(
        auth_test(None).await,
        json!({"ok": false, "error": "not_authed"})
    );
    assert_eq!(
        auth_test(Some("garbage")).await,
        json!({"ok": false, "error": "invalid_auth"})
    );
    assert_eq!(
        auth_test(Some("xoxb-another")).await["error"],
        "invalid_auth"
    );
    assert_eq!(
        auth_test(Some("xoxb-the-one")).await["user_id"],
        "U0STEWARD"
    );
    // A user token is the installer's.
    let user = auth_test(Some("xoxp-1-installer")).await;
    assert_eq!(user["user_id"], "U0INSTALLER", "{user}");
    let client = client_of(&sim, "xoxb-another").await;
    let refused = client.auth_test().await.unwrap_err();
    assert_eq!(code(&refused), "invalid_auth");
}

#[tokio::test]
async fn a_posted_message_comes_back_with_the_channel_id_and_slacks_message_shape() {
    let sim = SlackSim::start(strict()).await.unwrap();
    let http = reqwest::Client::new();
    let posted: Value = http
        .post(format!("{}/chat.postMessage", sim.api_url()))
        .bearer_auth("xoxb-1")
        .form(&[
            ("channel", "#general"),
            ("text", "hello"),
            (
                "blocks",
                r#"[{"type":"section","text":{"type":"mrkdwn","text":"hello"}}]"#,
            ),
        ])
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(posted["channel"], "C0GENERAL", "{posted}");
    let message = &posted["message"];
    assert_eq!(message["type"], "message");
    assert_eq!(message["bot_id"], "B0STEWARD");
    assert_eq!(message["user"], "U0STEWARD");
    assert_eq!(message["ts"], posted["ts"]);
    // Form-encoded blocks are JSON, as Slack reads them, and get a block id.
    assert_eq!(message["blocks"][0]["type"], "section", "{message}");
    assert!(message["blocks"][0]["block_id"].is_string(), "{message}");
}

#[tokio::test]
async fn a_rate_limit_from_the_simulators_count_is_waited_out_by_steward() {
    let sim = SlackSim::start(SlackSimOptions::default()).await.unwrap();
    sim.set_rate_limit(RateLimit {
        method: "chat.postMessage".into(),
        calls: 1,
        per_secs: 1,
    });
    let client = client_of(&sim, "xoxb-1").await;
    for text in ["one", "two"] {
        client
            .post_message(&id("C0001"), Message::plain(text))
            .await
            .unwrap();
    }
    let posts: Vec<Recorded> = sim
        .messages()
        .into_iter()
        .filter(|m| m.method == "chat.postMessage")
        .collect();
    assert!(
        posts.len() >= 3,
        "the second post was refused with ratelimited, then sent again: {posts:?}"
    );
    assert_eq!(sim.snapshot().messages.len(), 2);
}

async fn app_with(sim: SlackSim, approvals: &str) -> TestApp {
    let e2b = SimServer::start(SimOptions {
        sandboxes: 0,
        api_key: Some(E2B_KEY.into()),
        ..SimOptions::default()
    })
    .await
    .unwrap();
    spawn_app_on(
        Arc::new(sim),
        Arc::new(e2b),
        TestAppOptions {
            sandboxes: 0,
            policy: Some(format!(
                "[channels]\napprovals = \"{approvals}\"\n[approvals.approvers]\nkill = {{ users = [\"U0002\"] }}\n"
            )),
            ..TestAppOptions::default()
        },
    )
    .await
}

async fn seed(app: &TestApp, id: &str) {
    app.seed_sandbox(json!({"sandboxID": id, "templateID": "base", "state": "running"}))
        .await;
}

/// `/sandbox <text>`: what Steward answered on the response_url.
async fn command(app: &TestApp, text: &str) -> String {
    let name = format!("h{}", uuid::Uuid::new_v4().simple());
    let resp = app.post_command_to(text, &name).await;
    assert_eq!(resp.status(), 200);
    let answer = app.wait_for_hook(&name).await;
    answer
        .blocks
        .clone()
        .map(|b| b.to_string())
        .unwrap_or_default()
        + &visible_text(&answer)
}

async fn case_of(app: &TestApp, id: &str) -> Option<Case> {
    let subject = Subject::Sandbox(SandboxId::parse(id).unwrap());
    app.state.store.case_for_subject(&subject).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_card_to_a_channel_steward_is_not_in_says_to_invite_it_once_and_posts_after_the_invite() {
    let app = app_with(SlackSim::start(strict()).await.unwrap(), APPROVALS).await;
    seed(&app, "lonely1").await;
    seed(&app, "lonely2").await;

    let first = command(&app, "kill lonely1 done").await;
    assert!(
        first.contains("Type `/invite @Steward` in <#C0APPROVALS>"),
        "{first}"
    );
    assert!(case_of(&app, "lonely1").await.unwrap().card.is_none());

    // Another card to the same channel soon after: still refused, and the advice is not
    // repeated.
    let second = command(&app, "kill lonely2 done").await;
    assert!(second.contains("still waiting"), "{second}");
    assert!(second.contains("<#C0APPROVALS>"), "{second}");
    assert!(!second.contains("/invite"), "{second}");
    assert!(case_of(&app, "lonely2").await.unwrap().card.is_none());

    // Someone types `/invite @Steward` there: asking again posts the card.
    assert!(app.slack.invite_bot(APPROVALS));
    let third = command(&app, "kill lonely1 done").await;
    assert!(third.contains("open the card"), "{third}");
    let card = case_of(&app, "lonely1").await.unwrap().card.unwrap();
    assert_eq!(card.channel.as_str(), APPROVALS);
    let refused = app
        .slack
        .messages()
        .into_iter()
        .filter(|m| m.method == "chat.postMessage")
        .count();
    assert_eq!(refused, 3, "two refused posts and the card");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_card_to_a_channel_slack_cannot_find_says_to_invite_it_or_fix_the_setting() {
    let app = app_with(SlackSim::start(strict()).await.unwrap(), "C0GONE").await;
    seed(&app, "gone1").await;

    let said = command(&app, "kill gone1 done").await;
    assert!(
        said.contains("Slack cannot find the channel `C0GONE`"),
        "{said}"
    );
    assert!(said.contains("/invite @Steward"), "{said}");
    assert!(said.contains("[channels] approvals"), "{said}");
    assert!(case_of(&app, "gone1").await.unwrap().card.is_none());
}

/// `steward check` with a bot token Slack does not know names the token and what it must be,
/// and never prints it.
#[tokio::test]
async fn steward_check_names_a_bot_token_slack_refuses() {
    let e2b = SimServer::start(SimOptions {
        api_key: Some(E2B_KEY.into()),
        ..SimOptions::default()
    })
    .await
    .unwrap();
    let slack = SlackSim::start(SlackSimOptions {
        bot_token: Some(SecretString::from("xoxb-the-right-one".to_owned())),
        ..SlackSimOptions::default()
    })
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("steward.toml");
    std::fs::write(
        &policy,
        "[channels]\napprovals = \"C0APPROVALS\"\n[approvals.approvers]\nkill = { users = [\"U01ALICE\"] }\n",
    )
    .unwrap();
    let check = |token: &'static str| {
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_steward"));
        cmd.arg("check")
            .current_dir(dir.path())
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .envs([
                ("E2B_API_URL", e2b.base_url()),
                ("E2B_API_KEY", E2B_KEY.to_owned()),
                ("E2B_PROJECT_ID", e2b.team_id().to_owned()),
                ("SLACK_API_URL", slack.api_url()),
                ("SLACK_BOT_TOKEN", token.to_owned()),
                ("SLACK_SIGNING_SECRET", "secret".to_owned()),
                ("STEWARD_LISTEN", "127.0.0.1:3999".to_owned()),
                ("STEWARD_CONFIG", policy.display().to_string()),
                ("RUST_LOG", "off".to_owned()),
            ])
            .stdin(Stdio::null());
        async move { cmd.output().await.unwrap() }
    };
    // The right token is taken (the rest of this setup, such as an approver the simulator
    // does not know, is tests/it/check.rs's business).
    let good = check("xoxb-the-right-one").await;
    let said = String::from_utf8_lossy(&good.stdout).into_owned();
    assert!(
        said.contains("[slack] Slack accepts SLACK_BOT_TOKEN"),
        "{said}"
    );
    assert!(!said.contains("Slack refused"), "{said}");

    for token in ["xoxb-a-stale-one", "not-a-slack-token"] {
        let out = check(token).await;
        assert_eq!(out.status.code(), Some(2), "{out:?}");
        let said = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(!said.contains(token), "the token was printed: {said}");
        assert!(
            said.contains("Slack refused SLACK_BOT_TOKEN (invalid_auth). Fix: set it to the Bot User OAuth Token (xoxb-…)"),
            "{said}"
        );
    }
}
