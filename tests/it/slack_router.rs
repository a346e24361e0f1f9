//! The routes that answer inline: health, readiness, events, help, parse errors, and the
//! acknowledgement of interactions.

use crate::common::{TestAppOptions, spawn_app, spawn_app_with, visible_json_text};
use serde_json::{Value, json};

#[tokio::test]
async fn healthz_says_alive() {
    let app = spawn_app().await;
    let resp = app.http.get(app.url("/healthz")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.json::<Value>().await.unwrap()["status"], "alive");
}

#[tokio::test]
async fn readyz_is_ready_when_every_secret_is_configured() {
    let app = spawn_app().await;
    let resp = app.http.get(app.url("/readyz")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["ready"], true);
    assert_eq!(body["checks"]["slack_bot_token"], "ok");
}

#[tokio::test]
async fn readyz_names_what_is_missing_with_503() {
    let app = spawn_app_with(TestAppOptions {
        with_e2b: false,
        env: vec![("SLACK_BOT_TOKEN".into(), "".into())],
        ..Default::default()
    })
    .await;
    let resp = app.http.get(app.url("/readyz")).send().await.unwrap();
    assert_eq!(resp.status(), 503);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["ready"], false);
    assert_eq!(body["missing"], json!(["SLACK_BOT_TOKEN", "E2B_API_KEY"]));
    assert_eq!(body["checks"]["slack_signing_secret"], "ok");
    // No secret value leaks into the report.
    assert!(!body.to_string().contains(crate::common::SIGNING_SECRET));
}

#[tokio::test]
async fn url_verification_is_answered_with_the_challenge() {
    let app = spawn_app().await;
    let body = json!({"token": "t", "challenge": "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P", "type": "url_verification"});
    let resp = app
        .post_signed("/slack/events", "application/json", body.to_string())
        .await;
    assert_eq!(resp.status(), 200);
    let answer: Value = resp.json().await.unwrap();
    assert_eq!(
        answer["challenge"],
        "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P"
    );
}

#[tokio::test]
async fn other_events_are_acknowledged_and_ignored() {
    let app = spawn_app().await;
    let body = json!({"type": "event_callback", "event_id": "Ev1", "event": {"type": "app_home_opened", "user": "U1"}});
    let resp = app
        .http
        .post(app.url("/slack/events"))
        .header("content-type", "application/json")
        .header("x-slack-retry-num", "1")
        .header("x-slack-retry-reason", "http_timeout")
        .header(
            "x-slack-request-timestamp",
            crate::common::unix_now().to_string(),
        )
        .header(
            "x-slack-signature",
            app.sign(crate::common::unix_now(), body.to_string().as_bytes()),
        )
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert!(app.slack.messages().is_empty());
}

#[tokio::test]
async fn a_signed_event_that_is_not_json_is_a_bad_request() {
    let app = spawn_app().await;
    let resp = app
        .post_signed("/slack/events", "application/json", "not json".into())
        .await;
    assert_eq!(resp.status(), 400);
}

#[tokio::test]
async fn help_is_answered_inline_and_lists_every_subcommand() {
    let app = spawn_app().await;
    for text in ["help", ""] {
        let resp = app.post_command(text).await;
        assert_eq!(resp.status(), 200);
        let answer: Value = resp.json().await.unwrap();
        assert_eq!(answer["response_type"], "ephemeral");
        let shown = visible_json_text(&answer);
        for sub in sandbox_steward::slack::command::SUBCOMMANDS
            .into_iter()
            .filter(|s| *s != "help")
        {
            assert!(
                shown.contains(&format!("/sandbox {sub}")),
                "help lacks {sub}"
            );
        }
        // Each subcommand sits under the heading that says what it does: history only reads,
        // and a sweep is neither a read nor an approval.
        let section = |heading: &str| -> String {
            answer["blocks"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|b| b["text"]["text"].as_str())
                .find(|t| t.starts_with(heading))
                .unwrap_or_else(|| panic!("no {heading} section"))
                .to_owned()
        };
        assert!(section("*Look*").contains("/sandbox history"));
        let approval = section("*Needs approval*");
        assert!(
            !approval.contains("history") && !approval.contains("sweep"),
            "{approval}"
        );
        assert!(section("*Find idle sandboxes*").contains("/sandbox sweep --dry-run"));
    }
    // Help needs neither Slack's API nor E2B.
    assert!(app.slack.messages().is_empty());
    assert!(app.e2b_calls().await.values().all(|n| *n == 0));
}

#[tokio::test]
async fn unknown_input_gets_an_explanation_that_points_to_help() {
    let app = spawn_app().await;
    let answer: Value = app
        .post_command("destroy everything")
        .await
        .json()
        .await
        .unwrap();
    let shown = visible_json_text(&answer);
    assert!(
        shown.contains("I don't know the subcommand `destroy`"),
        "{shown}"
    );
    assert!(shown.contains("/sandbox help"), "{shown}");
    let answer: Value = app
        .post_command("timeout sbx1 forever")
        .await
        .json()
        .await
        .unwrap();
    assert!(visible_json_text(&answer).contains("not a duration"));
}

#[tokio::test]
async fn a_mistyped_subcommand_is_answered_with_the_nearest_one_and_the_list() {
    let app = spawn_app().await;
    let answer: Value = app.post_command("lsit running").await.json().await.unwrap();
    let section = answer["blocks"][0]["text"]["text"].as_str().unwrap();
    insta::assert_snapshot!(section, @r"
    :thinking_face: I don't know the subcommand `lsit`. Did you mean `list`? Subcommands: `list`, `get`, `logs`, `metrics`, `team`, `snapshots`, `templates`, `template`, `history`, `pause`, `resume`, `timeout`, `refresh`, `snapshot`, `kill`, `delete-template`, `sweep`, `help`.
    Try `/sandbox help` to see every subcommand with examples.
    ");
    assert!(app.e2b_calls().await.values().all(|n| *n == 0));
}

#[tokio::test]
async fn user_text_in_replies_is_escaped_for_mrkdwn() {
    let app = spawn_app().await;
    let answer: Value = app
        .post_command("<!channel>&more")
        .await
        .json()
        .await
        .unwrap();
    let shown = visible_json_text(&answer);
    assert!(shown.contains("&lt;!channel&gt;&amp;more"), "{shown}");
    assert!(!shown.contains("<!channel>"), "{shown}");
}

#[tokio::test]
async fn a_malformed_command_form_is_a_bad_request() {
    let app = spawn_app().await;
    let resp = app
        .post_signed(
            "/slack/commands",
            "application/x-www-form-urlencoded",
            "command=%2Fsandbox&text=help".into(),
        )
        .await;
    assert_eq!(resp.status(), 400);
}

#[tokio::test]
async fn a_command_whose_response_url_is_not_slack_is_not_run() {
    let app = spawn_app().await;
    let body = crate::common::command_form("pause sbx1", "U0001", "https://evil.example.com/hook");
    let answer: Value = app
        .post_signed("/slack/commands", "application/x-www-form-urlencoded", body)
        .await
        .json()
        .await
        .unwrap();
    assert!(visible_json_text(&answer).contains("without a usable reply address"));
    crate::slack_signature::settled(&app).await;
    assert!(app.e2b_calls().await.values().all(|n| *n == 0));
}

#[tokio::test]
async fn unknown_actions_are_acknowledged_without_effect() {
    let app = spawn_app().await;
    let payload = json!({
        "type": "block_actions",
        "user": {"id": "U0001"},
        "response_url": app.slack.response_url("act"),
        "container": {"type": "message", "message_ts": "1.2", "channel_id": "C0001"},
        "actions": [{"action_id": "something_new", "value": "x"}],
    });
    let resp = app.post_interaction(&payload).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.text().await.unwrap(), "");
    crate::slack_signature::settled(&app).await;
    assert!(app.slack.messages().is_empty());
}

#[tokio::test]
async fn an_interaction_without_a_payload_is_a_bad_request() {
    let app = spawn_app().await;
    let resp = app
        .post_signed(
            "/slack/interactions",
            "application/x-www-form-urlencoded",
            "nothing=here".into(),
        )
        .await;
    assert_eq!(resp.status(), 400);
}

#[tokio::test]
async fn a_payload_that_is_not_json_once_decoded_is_a_bad_request_and_changes_nothing() {
    let app = spawn_app().await;
    for body in [
        // JSON cut short
        "payload=%7B%22type%22%3A%22block_actions%22",
        // bytes that are not UTF-8
        "payload=%FF%FE%7B%7D",
        // a `%` without two hex digits stays a `%`, which is not JSON
        "payload=%zz%7B%7D",
        // a `+` is a space, so this is `{"type": "block actions"` cut short
        "payload=%7B%22type%22%3A+%22block+actions%22",
    ] {
        let resp = app
            .post_signed(
                "/slack/interactions",
                "application/x-www-form-urlencoded",
                body.into(),
            )
            .await;
        assert_eq!(resp.status(), 400, "{body}");
    }
    crate::slack_signature::settled(&app).await;
    assert!(app.slack.messages().is_empty());
    assert!(app.e2b_calls().await.values().all(|n| *n == 0));
}

#[tokio::test]
async fn the_manifest_points_at_routes_we_serve() {
    let app = spawn_app().await;
    let manifest =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/manifest.yml")).unwrap();
    for path in ["/slack/commands", "/slack/interactions", "/slack/events"] {
        assert!(
            manifest.contains(&format!("https://steward.example.com{path}")),
            "{path} missing from manifest"
        );
        // The route exists (an unsigned request is refused, not unknown).
        let resp = app
            .http
            .post(app.url(path))
            .body("x=1")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 401, "{path}");
    }
    assert!(manifest.contains("command: /sandbox"));
    assert!(manifest.contains("should_escape: true"));
}

/// Slack refuses a method whose scope the app lacks (`missing_scope`), so the manifest must ask
/// for every scope the Web API client's methods need, and for nothing more.
#[test]
fn the_manifest_asks_for_exactly_the_scopes_the_client_uses() {
    // Slack's documented scope for each method the client calls ("none" for those needing none).
    let scopes_of = |method: &str| -> &[&str] {
        match method {
            "chat.postMessage" | "chat.update" | "chat.postEphemeral" => &["chat:write"],
            "usergroups.users.list" => &["usergroups:read"],
            "files.getUploadURLExternal" | "files.completeUploadExternal" => &["files:write"],
            // A public channel needs channels:read, a private one groups:read.
            "conversations.info" => &["channels:read", "groups:read"],
            "users.info" => &["users:read"],
            // A public channel's history needs channels:history, a private one's groups:history.
            "conversations.history" => &["channels:history", "groups:history"],
            "views.open" | "auth.test" => &[],
            other => panic!("{other}: add the scope Slack documents for it to this table"),
        }
    };
    let client =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/src/slack/client.rs"))
            .unwrap();
    let called: Vec<&str> = client
        .split("with_retry(\"")
        .skip(1)
        .map(|rest| &rest[..rest.find('"').unwrap()])
        .collect();
    assert!(
        called.len() >= 8,
        "the client's methods were not found: {called:?}"
    );
    let mut needed: std::collections::BTreeSet<&str> = called
        .iter()
        .flat_map(|m| scopes_of(m).iter().copied())
        .collect();
    needed.insert("commands"); // the /sandbox slash command
    for name in ["manifest.yml", "manifest.socket.yml"] {
        let manifest =
            std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(name))
                .unwrap();
        let bot = &manifest[manifest.find("    bot:").expect("bot scopes")..];
        let declared: std::collections::BTreeSet<&str> = bot
            .lines()
            .skip(1)
            .take_while(|l| l.trim_start().starts_with("- "))
            .map(|l| l.trim_start().trim_start_matches("- ").trim())
            .collect();
        assert_eq!(declared, needed, "{name}'s bot scopes");
    }
}

#[tokio::test]
async fn a_template_in_steward_templates_overrides_the_embedded_one() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("help.json.j2"),
        r#"{"text": "Ask #ops-help", "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": "Our own help for {{ command }}"}}]}"#,
    )
    .unwrap();
    let app = spawn_app_with(TestAppOptions {
        env: vec![(
            "STEWARD_TEMPLATES".into(),
            dir.path().to_string_lossy().into_owned(),
        )],
        ..TestAppOptions::default()
    })
    .await;
    let answer: Value = app.post_command("help").await.json().await.unwrap();
    let shown = visible_json_text(&answer);
    assert!(shown.contains("Our own help for /sandbox"), "{shown}");
    // Templates that were not overridden still render from the embedded copy.
    let unknown: Value = app.post_command("frobnicate").await.json().await.unwrap();
    assert!(visible_json_text(&unknown).contains("help"));
}
