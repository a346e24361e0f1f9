//! The Slack Web API client against the fake Slack, over real sockets: what it sends, what the
//! fake records, and how rate limits and errors come back.
use sandbox_steward::config::SlackSettings;
use sandbox_steward::ids::{SlackChannelId, SlackUserId};
use sandbox_steward::sim::slack::{Fault, SlackSim, SlackSimOptions};
use sandbox_steward::slack::client::{ResponsePayload, SlackClient, SlackError};
use sandbox_steward::slack::render::{DoneParams, FailureParams, Templates};
use secrecy::SecretString;
use serde_json::{Value, json};
use slack_morphism::prelude::*;

async fn setup(token: Option<&str>) -> (SlackSim, SlackClient) {
    let sim = SlackSim::start(SlackSimOptions::default()).await.unwrap();
    let client = SlackClient::new(&SlackSettings {
        api_url: sim.api_url(),
        bot_token: token.map(|t| SecretString::from(t.to_owned())),
        signing_secret: None,
        templates_dir: None,
    })
    .unwrap();
    (sim, client)
}

fn channel() -> SlackChannelId {
    SlackChannelId::parse("C0001").unwrap()
}

fn done(text: &str) -> sandbox_steward::slack::render::Message {
    Templates::embedded()
        .render(&DoneParams {
            headline: text.into(),
            details: None,
        })
        .unwrap()
}

#[tokio::test]
async fn a_posted_message_is_recorded_with_its_blocks_and_the_bot_token() {
    let (sim, client) = setup(Some("xoxb-1")).await;
    let (ch, ts) = client
        .post_message(&channel(), done("Paused `i1`."))
        .await
        .unwrap();
    assert_eq!(ch, channel());
    let calls = sim.messages();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].method, "chat.postMessage");
    assert!(calls[0].authorized);
    assert_eq!(calls[0].ts.as_deref(), Some(ts.as_str()));
    assert_eq!(calls[0].text.as_deref(), Some("Paused `i1`."));
    let blocks = calls[0].blocks.clone().unwrap();
    assert_eq!(blocks[0]["type"], "section");
}

#[tokio::test]
async fn ts_values_increase_and_chat_update_edits_the_stored_message() {
    let (sim, client) = setup(Some("xoxb-1")).await;
    let (_, ts1) = client
        .post_message(&channel(), done("first"))
        .await
        .unwrap();
    let (_, ts2) = client
        .post_message(&channel(), done("second"))
        .await
        .unwrap();
    assert!(ts2.parse::<f64>().unwrap() > ts1.parse::<f64>().unwrap());
    client
        .update_message(&channel(), &ts1, done("first, edited"))
        .await
        .unwrap();
    let stored = sim.message("C0001", &ts1).unwrap();
    assert_eq!(stored.text.as_deref(), Some("first, edited"));
    assert_eq!(
        sim.message("C0001", &ts2).unwrap().text.as_deref(),
        Some("second")
    );
    // Updating a message that does not exist is Slack's message_not_found.
    let err = client
        .update_message(&channel(), "1.000000", done("x"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, SlackError::Api { ref code } if code == "message_not_found"),
        "{err}"
    );
}

#[tokio::test]
async fn ephemeral_posts_and_views_are_answered() {
    let (sim, client) = setup(Some("xoxb-1")).await;
    let user = SlackUserId::parse("U0001").unwrap();
    client
        .post_ephemeral(&channel(), &user, done("only you"))
        .await
        .unwrap();
    let view = SlackView::Modal(SlackModalView::new(pt!("Confirm"), vec![]));
    client.open_view("123.456.abc", view).await.unwrap();
    let methods: Vec<String> = sim.messages().into_iter().map(|c| c.method).collect();
    assert_eq!(methods, ["chat.postEphemeral", "views.open"]);
    assert_eq!(sim.messages()[0].body["user"], "U0001");
}

#[tokio::test]
async fn usergroup_members_come_from_the_seeded_group() {
    let (sim, client) = setup(Some("xoxb-1")).await;
    sim.add_usergroup("S1", &["U1", "U2"]);
    let members = client.usergroup_members("S1").await.unwrap();
    assert_eq!(
        members,
        vec![
            SlackUserId::parse("U1").unwrap(),
            SlackUserId::parse("U2").unwrap()
        ]
    );
    let err = client.usergroup_members("S404").await.unwrap_err();
    assert!(
        matches!(err, SlackError::Api { ref code } if code == "no_such_subteam"),
        "{err}"
    );
}

#[tokio::test]
async fn a_user_group_is_listed_once_for_a_burst_of_lookups() {
    let (sim, client) = setup(Some("xoxb-1")).await;
    sim.add_usergroup("S1", &["U1"]);
    for _ in 0..5 {
        let members = client.usergroup_members("S1").await.unwrap();
        assert_eq!(members, vec![SlackUserId::parse("U1").unwrap()]);
    }
    let listed = sim
        .messages()
        .iter()
        .filter(|m| m.method == "usergroups.users.list")
        .count();
    assert_eq!(
        listed, 1,
        "usergroups.users.list is Tier 2: one call serves the burst"
    );
}

#[tokio::test]
async fn usergroups_can_be_seeded_and_messages_read_over_http() {
    let (sim, client) = setup(Some("xoxb-1")).await;
    let http = reqwest::Client::new();
    let resp = http
        .post(format!("{}/_sim/usergroups", sim.base_url()))
        .json(&json!({"id": "S2", "users": ["U9"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 204);
    assert_eq!(client.usergroup_members("S2").await.unwrap().len(), 1);
    let (_, ts) = client
        .post_message(&channel(), done("hello"))
        .await
        .unwrap();
    let all: Vec<Value> = http
        .get(format!("{}/_sim/messages", sim.base_url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(all.len(), 2);
    let one: Value = http
        .get(format!("{}/_sim/messages/C0001/{ts}", sim.base_url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(one["text"], "hello");
}

#[tokio::test]
async fn a_429_with_retry_after_is_waited_out_and_retried() {
    let (sim, client) = setup(Some("xoxb-1")).await;
    sim.add_fault(Fault {
        method: "chat.postMessage".into(),
        status: 429,
        retry_after_secs: Some(1),
        count: 1,
        error: None,
    });
    client
        .post_message(&channel(), done("eventually"))
        .await
        .unwrap();
    let calls: Vec<_> = sim
        .messages()
        .into_iter()
        .filter(|c| c.method == "chat.postMessage")
        .collect();
    assert_eq!(calls.len(), 2, "one refused, one accepted");
    assert!(
        sim.message("C0001", calls[1].ts.as_deref().unwrap())
            .is_some()
    );
}

#[tokio::test]
async fn a_persistent_rate_limit_surfaces_as_an_error() {
    let (sim, client) = setup(Some("xoxb-1")).await;
    // Longer than the client is willing to wait inside one request.
    sim.add_fault(Fault {
        method: "chat.update".into(),
        status: 429,
        retry_after_secs: Some(120),
        count: 1,
        error: None,
    });
    let err = client
        .update_message(&channel(), "1.0", done("x"))
        .await
        .unwrap_err();
    assert!(matches!(err, SlackError::RateLimited { .. }), "{err}");
}

#[tokio::test]
async fn faults_can_be_api_errors_and_are_programmed_over_http() {
    let (sim, client) = setup(Some("xoxb-1")).await;
    let resp = reqwest::Client::new()
        .post(format!("{}/_sim/faults", sim.base_url()))
        .json(&json!({"method": "chat.postMessage", "status": 200, "error": "channel_not_found", "count": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 204);
    let err = client
        .post_message(&channel(), done("x"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, SlackError::Api { ref code } if code == "channel_not_found"),
        "{err}"
    );
    // The fault was used up.
    client.post_message(&channel(), done("x")).await.unwrap();
}

#[tokio::test]
async fn without_a_token_nothing_is_sent_and_the_fake_refuses_unauthenticated_calls() {
    let (sim, client) = setup(None).await;
    let err = client
        .post_message(&channel(), done("x"))
        .await
        .unwrap_err();
    assert!(matches!(err, SlackError::NoToken));
    assert!(sim.messages().is_empty());
    let resp: Value = reqwest::Client::new()
        .post(format!("{}/chat.postMessage", sim.api_url()))
        .json(&json!({"channel": "C1", "text": "x"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(resp, json!({"ok": false, "error": "not_authed"}));
    assert!(!sim.messages()[0].authorized);
}

#[tokio::test]
async fn response_url_posts_carry_no_token_and_keep_response_type_and_replace_original() {
    let (sim, client) = setup(Some("xoxb-secret-value")).await;
    let templates = Templates::embedded();
    let msg = templates
        .render(&FailureParams {
            sentence: "nope".into(),
        })
        .unwrap();
    client
        .respond(
            &sim.response_url("a"),
            &ResponsePayload::ephemeral(msg.clone()),
        )
        .await
        .unwrap();
    client
        .respond(&sim.response_url("a"), &ResponsePayload::replacing(msg))
        .await
        .unwrap();
    let posts = sim.hook_posts("a");
    assert_eq!(posts.len(), 2);
    assert!(!posts[0].authorized);
    assert_eq!(posts[0].response_type.as_deref(), Some("ephemeral"));
    assert_eq!(posts[1].replace_original, Some(true));
    assert!(!posts[0].body.to_string().contains("xoxb"));
}

#[tokio::test]
async fn a_response_url_elsewhere_is_refused_before_any_request() {
    let (sim, client) = setup(Some("xoxb-1")).await;
    let other = SlackSim::start(SlackSimOptions::default()).await.unwrap();
    let msg = done("x");
    let err = client
        .respond(&other.response_url("a"), &ResponsePayload::ephemeral(msg))
        .await
        .unwrap_err();
    assert!(
        matches!(err, SlackError::ForeignResponseUrl { .. }),
        "{err}"
    );
    assert!(other.messages().is_empty());
    assert!(sim.messages().is_empty());
}

#[tokio::test]
async fn an_expired_response_url_is_an_error() {
    let (sim, client) = setup(Some("xoxb-1")).await;
    sim.add_fault(Fault {
        method: "hooks".into(),
        status: 404,
        retry_after_secs: None,
        count: 1,
        error: Some("expired_url".into()),
    });
    let err = client
        .respond(
            &sim.response_url("old"),
            &ResponsePayload::ephemeral(done("x")),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, SlackError::Respond { status: 404, .. }),
        "{err}"
    );
}

#[tokio::test]
async fn the_fake_refuses_oversize_blocks_and_text_as_slack_does() {
    let (sim, _) = setup(Some("xoxb-1")).await;
    let http = reqwest::Client::new();
    let post = |body: Value| {
        let http = http.clone();
        let url = format!("{}/chat.postMessage", sim.api_url());
        async move {
            http.post(url)
                .bearer_auth("xoxb-1")
                .json(&body)
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        }
    };
    let section =
        |n: usize| json!({"type": "section", "text": {"type": "mrkdwn", "text": "a".repeat(n)}});

    let ok = post(json!({"channel": "C0001", "text": "t", "blocks": [section(3000)]})).await;
    assert_eq!(ok["ok"], true, "{ok}");
    let long = post(json!({"channel": "C0001", "text": "t", "blocks": [section(3001)]})).await;
    assert_eq!(long["error"], "invalid_blocks", "{long}");
    let many: Vec<Value> = (0..51).map(|_| section(1)).collect();
    let many = post(json!({"channel": "C0001", "text": "t", "blocks": many})).await;
    assert_eq!(many["error"], "invalid_blocks", "{many}");
    let text = post(json!({"channel": "C0001", "text": "a".repeat(40_001)})).await;
    assert_eq!(text["error"], "msg_too_long", "{text}");
    let posted = sim
        .messages()
        .iter()
        .filter(|m| {
            sim.message("C0001", m.ts.as_deref().unwrap_or(""))
                .is_some()
        })
        .count();
    assert_eq!(posted, 1, "only the message within the limits was kept");
}

#[tokio::test]
async fn a_reply_to_a_thread_of_another_channel_is_thread_not_found() {
    let (sim, client) = setup(Some("xoxb-1")).await;
    let (_, parent) = client
        .post_message(&channel(), done("digest"))
        .await
        .unwrap();
    let elsewhere = SlackChannelId::parse("C0OTHER").unwrap();
    let err = client
        .post_message_in_thread(&elsewhere, Some(&parent), done("card"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, SlackError::Api { ref code } if code == "thread_not_found"),
        "{err}"
    );
    // A ts no message has is refused too; the parent's own channel takes the reply.
    let err = client
        .post_message_in_thread(&channel(), Some("1.000001"), done("card"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, SlackError::Api { ref code } if code == "thread_not_found"),
        "{err}"
    );
    let (ch, _) = client
        .post_message_in_thread(&channel(), Some(&parent), done("card"))
        .await
        .unwrap();
    assert_eq!(ch, channel());
    assert_eq!(sim.snapshot().messages.len(), 2);
}

#[tokio::test]
async fn seeded_users_and_groups_answer_users_info_and_usergroup_lookups() {
    let sim = SlackSim::start(SlackSimOptions {
        users: vec![("U0ALICE01".into(), Some("alice".into()))],
        groups: vec![sandbox_steward::sim::slack::UserGroup {
            id: "S0SRE".into(),
            users: vec!["U0ALICE01".into(), "U0BOB0001".into()],
        }],
        ..SlackSimOptions::default()
    })
    .await
    .unwrap();
    let client = SlackClient::new(&SlackSettings {
        api_url: sim.api_url(),
        bot_token: Some(SecretString::from("xoxb-1".to_owned())),
        signing_secret: None,
        templates_dir: None,
    })
    .unwrap();
    let members = client.usergroup_members("S0SRE").await.unwrap();
    assert_eq!(
        members,
        vec![
            SlackUserId::parse("U0ALICE01").unwrap(),
            SlackUserId::parse("U0BOB0001").unwrap()
        ]
    );
    let info = |user: &'static str| {
        let url = format!("{}/users.info", sim.api_url());
        async move {
            reqwest::Client::new()
                .post(url)
                .bearer_auth("xoxb-1")
                .form(&[("user", user)])
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        }
    };
    let alice = info("U0ALICE01").await;
    assert_eq!(alice["user"]["name"], "alice", "{alice}");
    // A group's members are users too, named after their id when seeded without a name.
    let bob = info("U0BOB0001").await;
    assert_eq!(bob["ok"], true, "{bob}");
    assert_eq!(info("U0NOBODY1").await["error"], "user_not_found");
}

#[tokio::test]
async fn steward_sim_slack_seeds_users_and_groups_from_flags_and_a_file() {
    use tokio::io::AsyncBufReadExt;
    let dir = tempfile::tempdir().unwrap();
    let seed = dir.path().join("seed.json");
    std::fs::write(
        &seed,
        r#"{"users": {"U0CAROL01": "carol"}, "groups": {"S0DBA": ["U0CAROL01"]}}"#,
    )
    .unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_steward"))
        .args(["sim", "slack", "--listen", "127.0.0.1:0"])
        .args([
            "--users",
            "U0ALICE01=alice",
            "--group",
            "S0SRE=U0ALICE01,U0BOB0001",
        ])
        .arg("--seed")
        .arg(&seed)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut said = Vec::new();
    while let Some(line) = lines.next_line().await.unwrap() {
        let done = line.contains("recorded calls");
        said.push(line);
        if done {
            break;
        }
    }
    let base = said[0]
        .strip_prefix("Fake Slack listening on ")
        .unwrap_or_else(|| panic!("{said:#?}"))
        .to_owned();
    assert!(
        said.iter().any(|l| l.trim()
            == "seeded 3 users and 2 groups: S0DBA=U0CAROL01 S0SRE=U0ALICE01,U0BOB0001"),
        "{said:#?}"
    );
    let list: Value = reqwest::Client::new()
        .post(format!("{base}/api/usergroups.users.list"))
        .bearer_auth("xoxb-1")
        .form(&[("usergroup", "S0DBA")])
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(list["users"], json!(["U0CAROL01"]), "{list}");
    child.kill().await.unwrap();

    let help = std::process::Command::new(env!("CARGO_BIN_EXE_steward"))
        .args(["sim", "slack", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    for needle in [
        "records every call in memory only",
        "GET /_sim/messages",
        "--users <ID[=NAME],...>",
        "--group <ID=USER,...>",
        "--seed <FILE>",
    ] {
        assert!(help.contains(needle), "{needle:?} missing from:\n{help}");
    }
}

/// Both simulators stop on SIGTERM, not only Ctrl-C: as a container's PID 1 nothing else stops
/// them, and `compose down` would wait out its timeout and SIGKILL them.
#[tokio::test]
async fn steward_sim_slack_and_e2b_stop_on_sigterm() {
    use tokio::io::AsyncBufReadExt;
    for args in [
        &["sim", "slack", "--listen", "127.0.0.1:0"][..],
        &["sim", "e2b", "--port", "0", "--envd-port", "0"][..],
    ] {
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_steward"))
            .args(args)
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        // Listening (and so past setting up its signal handlers) once it has said where.
        let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let first = lines.next_line().await.unwrap().unwrap_or_default();
        assert!(first.contains("listening on"), "{args:?}: {first}");
        let pid = child.id().unwrap().to_string();
        let sent = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap();
        assert!(sent.success());
        // Drain the rest of stdout so a blocked write cannot hold it up.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let status = tokio::time::timeout(std::time::Duration::from_secs(5), child.wait())
            .await
            .unwrap_or_else(|_| panic!("{args:?} still running 5 s after SIGTERM"))
            .unwrap();
        assert!(status.success(), "{args:?}: {status}");
    }
}
