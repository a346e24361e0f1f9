//! The Slack simulator's web page over HTTP: the page and its assets, the world it reads, the
//! live feed, and the actions a person takes on it, signed and forwarded to a real Steward
//! (`spawn_app`), whose answers land where Slack would show them.

use futures::StreamExt;
use sandbox_steward::sim::slack::{SimChannel, SlackSim, SlackSimOptions};
use secrecy::SecretString;
use serde_json::{Value, json};

use crate::common::{PATIENCE, TestApp, TestAppOptions, eventually, spawn_app_with};

const APPROVALS: &str = "C0APPROVALS";
const TOKEN: &str = "Bearer xoxb-page-test";

/// The page's side of a simulator: what a browser asks of it.
struct Page {
    base: String,
    http: reqwest::Client,
}

impl Page {
    fn of(sim: &SlackSim) -> Self {
        Self {
            base: sim.base_url(),
            http: reqwest::Client::new(),
        }
    }

    async fn world(&self) -> Value {
        self.http
            .get(format!("{}/_sim/world", self.base))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// POSTs an action; its status and JSON answer (`Null` when empty).
    async fn act(&self, path: &str, body: Value) -> (u16, Value) {
        let resp = self
            .http
            .post(format!("{}/_sim/act/{path}", self.base))
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    async fn command(&self, user: &str, channel: &str, text: &str) -> (u16, Value) {
        self.act(
            "command",
            json!({"user": user, "channel": channel, "text": text}),
        )
        .await
    }

    /// Steward's bot posting as it does in production.
    async fn post(&self, method: &str, body: Value) -> Value {
        self.http
            .post(format!("{}/api/{method}", self.base))
            .header("authorization", TOKEN)
            .json(&body)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// Waits until `find` picks something out of the world, reading it again on each change
    /// the page's own event stream (`/_sim/events`) announces.
    async fn wait_for(&self, what: &str, find: impl Fn(&Value) -> Option<Value>) -> Value {
        // Subscribed before the first read: a change between that read and the wait is sent.
        let mut changes = self
            .http
            .get(format!("{}/_sim/events", self.base))
            .send()
            .await
            .unwrap()
            .bytes_stream();
        let found = tokio::time::timeout(PATIENCE, async {
            loop {
                if let Some(found) = find(&self.world().await) {
                    return found;
                }
                // A change, a resync or a keep-alive: any of them is worth another read.
                changes
                    .next()
                    .await
                    .expect("the event stream stays open")
                    .unwrap();
            }
        })
        .await;
        match found {
            Ok(found) => found,
            Err(_) => panic!("never showed on the page: {what}\n{}", self.world().await),
        }
    }
}

/// Every top-level message of `channel` in a world read.
fn messages(world: &Value, channel: &str) -> Vec<Value> {
    world["channels"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == channel)
        .map(|c| c["messages"].as_array().unwrap().clone())
        .unwrap_or_default()
}

/// The ephemeral messages `user` sees.
fn ephemeral_of(world: &Value, user: &str) -> Vec<Value> {
    world["ephemeral"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["user"] == user)
        .cloned()
        .collect()
}

/// All the text a page message shows.
fn shown_text(message: &Value) -> String {
    let mut out = message["text"].as_str().unwrap_or_default().to_owned();
    out.push_str(&message["blocks"].to_string());
    out
}

/// Where the button with `action_id` is in a message: (block index, element index).
fn button(message: &Value, action_id: &str) -> (usize, usize) {
    for (b, block) in message["blocks"].as_array().unwrap().iter().enumerate() {
        for (e, element) in block["elements"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or(&[])
            .iter()
            .enumerate()
        {
            if element["action_id"] == action_id {
                return (b, e);
            }
        }
    }
    panic!("no {action_id} button in {message}");
}

async fn plain_sim() -> SlackSim {
    SlackSim::start(SlackSimOptions {
        channels: vec![SimChannel {
            id: APPROVALS.into(),
            name: "approvals".into(),
        }],
        ..SlackSimOptions::default()
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn the_page_its_script_and_its_styles_are_served_with_their_content_types() {
    let sim = plain_sim().await;
    let http = reqwest::Client::new();
    for (path, kind, marker) in [
        ("/", "text/html", "<script src=\"/app.js\""),
        ("/app.js", "text/javascript", "EventSource"),
        ("/app.css", "text/css", "#sidebar"),
    ] {
        let resp = http
            .get(format!("{}{path}", sim.base_url()))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "{path}");
        let content_type = resp.headers()["content-type"].to_str().unwrap().to_owned();
        assert!(content_type.starts_with(kind), "{path}: {content_type}");
        assert!(resp.text().await.unwrap().contains(marker), "{path}");
    }
    assert_eq!(sim.page_url(), format!("{}/", sim.base_url()));
}

#[tokio::test]
async fn the_world_shows_a_message_with_its_blocks_its_update_and_its_thread_reply() {
    let sim = plain_sim().await;
    let page = Page::of(&sim);
    let blocks = json!([{"type": "header", "text": {"type": "plain_text", "text": "Sandbox sbx1: kill it?"}}]);
    let posted = page
        .post(
            "chat.postMessage",
            json!({"channel": APPROVALS, "text": "kill it?", "blocks": blocks}),
        )
        .await;
    let ts = posted["ts"].as_str().unwrap().to_owned();
    let world = page.world().await;
    let shown = messages(&world, APPROVALS);
    assert_eq!(shown.len(), 1, "{world}");
    assert_eq!(shown[0]["blocks"], blocks);
    assert_eq!(shown[0]["edited"], false);
    // The configured channel is listed by name, with the default general channel gone.
    let names: Vec<&str> = world["channels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["approvals"]);

    page.post(
        "chat.update",
        json!({"channel": APPROVALS, "ts": ts, "text": "killed",
               "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": "*killed*"}}]}),
    )
    .await;
    page.post(
        "chat.postMessage",
        json!({"channel": APPROVALS, "thread_ts": ts, "text": "a reply in the thread"}),
    )
    .await;
    let world = page.world().await;
    let shown = messages(&world, APPROVALS);
    assert_eq!(
        shown.len(),
        1,
        "the reply is not a top-level message: {world}"
    );
    assert_eq!(shown[0]["text"], "killed");
    assert_eq!(shown[0]["blocks"][0]["text"]["text"], "*killed*");
    assert_eq!(shown[0]["edited"], true);
    assert_eq!(shown[0]["reply_count"], 1);
    assert_eq!(shown[0]["replies"][0]["text"], "a reply in the thread");
    assert_eq!(shown[0]["replies"][0]["thread_ts"], ts.as_str());
}

#[tokio::test]
async fn the_event_stream_sends_a_change_when_a_message_is_posted() {
    let sim = plain_sim().await;
    let page = Page::of(&sim);
    let resp = page
        .http
        .get(format!("{}/_sim/events", sim.base_url()))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert!(
        resp.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let mut stream = resp.bytes_stream();
    let posted = page
        .post(
            "chat.postMessage",
            json!({"channel": APPROVALS, "text": "live <b>news</b>"}),
        )
        .await;
    let ts = posted["ts"].as_str().unwrap();
    let mut seen = String::new();
    let read = tokio::time::timeout(PATIENCE, async {
        while let Some(chunk) = stream.next().await {
            seen.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
            if seen.contains("event: change") && seen.contains(ts) {
                return;
            }
        }
    })
    .await;
    assert!(
        read.is_ok(),
        "no change event for {ts}; the stream said: {seen}"
    );
    let data = seen.lines().find_map(|l| l.strip_prefix("data: ")).unwrap();
    let change: Value = serde_json::from_str(data).unwrap();
    assert_eq!(change["kind"], "message");
    assert_eq!(change["message"]["text"], "live <b>news</b>");
    assert_eq!(change["seq"], page.world().await["seq"]);
}

#[tokio::test]
async fn without_a_steward_url_the_page_is_read_only_and_says_so() {
    let sim = plain_sim().await;
    let page = Page::of(&sim);
    assert_eq!(page.world().await["interactive"], false);
    let person = page.world().await["people"][0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (status, answer) = page.command(&person, APPROVALS, "/sandbox list").await;
    assert_eq!(status, 409);
    assert!(
        answer["error"]
            .as_str()
            .unwrap()
            .contains("without --steward-url"),
        "{answer}"
    );
}

/// Steward with an approvals channel; U0002 may kill, U0003 may not; U0001 asks.
async fn steward() -> TestApp {
    let app = spawn_app_with(TestAppOptions {
        sandboxes: 0,
        policy: Some(format!(
            r#"
[channels]
approvals = "{APPROVALS}"
[approvals]
two_person_rule = true
[approvals.approvers]
kill = {{ users = ["U0002"] }}
"#
        )),
        ..TestAppOptions::default()
    })
    .await;
    for (id, name) in [("U0001", "ada"), ("U0002", "grace"), ("U0003", "linus")] {
        app.slack.add_user(id, Some(name));
    }
    app.slack
        .connect_steward(
            &app.address,
            Some(SecretString::from(app.signing_secret.clone())),
        )
        .unwrap();
    app
}

#[tokio::test]
async fn a_typed_command_reaches_steward_signed_and_its_answer_replaces_the_ack() {
    let app = steward().await;
    app.seed_sandbox(json!({"sandboxID": "pagelist1", "templateID": "base", "state": "running"}))
        .await;
    let page = Page::of(&app.slack);
    assert_eq!(page.world().await["interactive"], true);
    let (status, answer) = page.command("U0001", APPROVALS, "/sandbox list").await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["shown"], "ephemeral", "the ack shows at once");
    let list = page
        .wait_for("the sandbox list", |w| {
            ephemeral_of(w, "U0001")
                .into_iter()
                .find(|e| shown_text(e).contains("pagelist1"))
        })
        .await;
    assert_eq!(list["channel"], APPROVALS);
    // The answer replaced "Working on it…": one ephemeral message, seen by U0001 only.
    let world = page.world().await;
    assert_eq!(ephemeral_of(&world, "U0001").len(), 1, "{world}");
    assert!(ephemeral_of(&world, "U0002").is_empty());
    // What Steward received was the form Slack sends.
    let form = app
        .slack
        .messages()
        .into_iter()
        .find(|m| m.method.starts_with("hooks/sim-"))
        .expect("Steward answered through the page's response_url");
    assert_eq!(form.replace_original, Some(true));
}

#[tokio::test]
async fn a_malformed_command_gets_steward_s_help_and_bad_input_changes_nothing() {
    let app = steward().await;
    let page = Page::of(&app.slack);
    let (status, answer) = page
        .command("U0001", APPROVALS, "/sandbox frobnicate")
        .await;
    assert_eq!(status, 200, "{answer}");
    let world = page.world().await;
    let help = ephemeral_of(&world, "U0001");
    assert_eq!(help.len(), 1, "{world}");
    assert!(
        shown_text(&help[0]).contains("Try `/sandbox help`"),
        "{}",
        help[0]
    );

    let seq = world["seq"].clone();
    let calls = app.slack.messages().len();
    for (user, channel, text, expected) in [
        ("U0001", APPROVALS, "sandbox list", "starts with '/'"),
        ("U0001", APPROVALS, "/", "command name"),
        (
            "U9NOBODY",
            APPROVALS,
            "/sandbox list",
            "not one of this simulator's users",
        ),
        (
            "U0001",
            "not-a-channel",
            "/sandbox list",
            "not a channel id",
        ),
    ] {
        let (status, answer) = page.command(user, channel, text).await;
        assert_eq!(status, 400, "{text}: {answer}");
        assert!(
            answer["error"].as_str().unwrap().contains(expected),
            "{text}: {answer}"
        );
    }
    let (status, answer) = page
        .act(
            "click",
            json!({"user": "U0001", "channel": APPROVALS, "ts": "1.000001", "block": 0, "element": 0}),
        )
        .await;
    assert_eq!(status, 404, "{answer}");
    assert_eq!(page.world().await["seq"], seq, "nothing changed");
    assert_eq!(app.slack.messages().len(), calls, "nothing reached Steward");
}

#[tokio::test]
async fn a_wrong_or_missing_signing_secret_gets_stewards_401_and_a_clear_error() {
    let app = steward().await;
    let page = Page::of(&app.slack);
    app.slack
        .connect_steward(&app.address, Some(SecretString::from("not-the-secret")))
        .unwrap();
    let (status, answer) = page.command("U0001", APPROVALS, "/sandbox help").await;
    assert_eq!(status, 502, "{answer}");
    let error = answer["error"].as_str().unwrap();
    assert!(error.contains("401"), "{error}");
    assert!(error.contains("--signing-secret"), "{error}");
    assert!(
        !error.contains("not-the-secret"),
        "the secret is never echoed"
    );

    app.slack.connect_steward(&app.address, None).unwrap();
    let (status, answer) = page.command("U0001", APPROVALS, "/sandbox help").await;
    assert_eq!(status, 502, "{answer}");
    assert!(
        answer["error"].as_str().unwrap().contains("not signed"),
        "{answer}"
    );
    assert!(ephemeral_of(&page.world().await, "U0001").is_empty());
}

/// `/sandbox kill <sandbox>` typed by U0001: the case card once it shows on the page.
async fn open_case(page: &Page, sandbox: &str) -> Value {
    let (status, answer) = page
        .command(
            "U0001",
            APPROVALS,
            &format!("/sandbox kill {sandbox} done with it"),
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    page.wait_for("the case card", |w| {
        messages(w, APPROVALS).into_iter().find(|m| {
            shown_text(m).contains(sandbox) && shown_text(m).contains("case_snapshot_then_kill")
        })
    })
    .await
}

#[tokio::test]
async fn snapshot_then_kill_clicked_on_the_page_is_verified_by_steward_and_the_card_ends_with_the_snapshot()
 {
    let app = steward().await;
    app.seed_sandbox(json!({"sandboxID": "pagecase1", "templateID": "base", "state": "running"}))
        .await;
    let page = Page::of(&app.slack);
    let card = open_case(&page, "pagecase1").await;
    let (block, element) = button(&card, "case_snapshot_then_kill");
    let (status, answer) = page
        .act(
            "click",
            json!({"user": "U0002", "channel": APPROVALS, "ts": card["ts"], "block": block, "element": element}),
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    let ts = card["ts"].clone();
    let done = page
        .wait_for("the card's end state", |w| {
            messages(w, APPROVALS)
                .into_iter()
                .find(|m| m["ts"] == ts && shown_text(m).contains("killed, snapshot kept"))
        })
        .await;
    assert_eq!(done["edited"], true);
    // The decision buttons are gone; only Restore stays for its window.
    let blocks = done["blocks"].to_string();
    assert_eq!(
        blocks.matches("\"button\"").count(),
        blocks.matches("case_restore").count(),
        "{done}"
    );
    let e2b = app.state.e2b.as_ref().unwrap();
    eventually("the sandbox is gone from E2B", || async {
        e2b.get_sandbox(&sandbox_steward::ids::SandboxId::parse("pagecase1").unwrap())
            .await
            .is_err()
    })
    .await;
}

#[tokio::test]
async fn a_non_approvers_kill_is_refused_where_only_they_see_it_and_an_approvers_reason_form_reaches_steward()
 {
    let app = steward().await;
    app.seed_sandbox(json!({"sandboxID": "pagecase2", "templateID": "base", "state": "running"}))
        .await;
    let page = Page::of(&app.slack);
    let card = open_case(&page, "pagecase2").await;
    let (block, element) = button(&card, "case_kill");
    let click = |user: &str| json!({"user": user, "channel": APPROVALS, "ts": card["ts"], "block": block, "element": element});

    let (status, answer) = page.act("click", click("U0003")).await;
    assert_eq!(status, 200, "{answer}");
    let refusal = page
        .wait_for("the refusal", |w| {
            ephemeral_of(w, "U0003").into_iter().next()
        })
        .await;
    assert!(
        shown_text(&refusal).contains("not an approver"),
        "{refusal}"
    );
    assert!(ephemeral_of(&page.world().await, "U0002").is_empty());

    // The approver's click opens the reason form for them, as a modal on the page.
    let (status, answer) = page.act("click", click("U0002")).await;
    assert_eq!(status, 200, "{answer}");
    let modal = page
        .wait_for("the reason form", |w| {
            w["modals"].as_array().unwrap().first().cloned()
        })
        .await;
    assert_eq!(modal["user"], "U0002");
    let view_id = modal["id"].as_str().unwrap().to_owned();
    // Left empty, the required reason is refused by the page itself, as Slack does.
    let (status, answer) = page
        .act(
            "submit",
            json!({"user": "U0002", "view_id": view_id, "values": {}}),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(
        answer["errors"]["reason"],
        "Please complete this required field."
    );
    // A person who does not own the modal cannot submit it.
    let (status, _) = page
        .act(
            "submit",
            json!({"user": "U0003", "view_id": view_id, "values": {}}),
        )
        .await;
    assert_eq!(status, 404);

    let (status, answer) = page
        .act(
            "submit",
            json!({"user": "U0002", "view_id": view_id,
                   "values": {"reason": {"reason_text": "holds customer data"}}}),
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    assert!(page.world().await["modals"].as_array().unwrap().is_empty());
    let ts = card["ts"].clone();
    page.wait_for("the card's end state", |w| {
        messages(w, APPROVALS)
            .into_iter()
            .find(|m| m["ts"] == ts && !m["blocks"].to_string().contains("\"button\""))
    })
    .await;
}

#[tokio::test]
async fn replies_to_a_response_url_the_page_handed_out_land_where_slack_puts_them() {
    let app = steward().await;
    let page = Page::of(&app.slack);
    let (status, answer) = page.command("U0001", APPROVALS, "/sandbox help").await;
    assert_eq!(status, 200, "{answer}");
    let world = page.world().await;
    assert_eq!(ephemeral_of(&world, "U0001").len(), 1, "{world}");
    // The page's first action handed Steward the response_url `hooks/sim-1`.
    let hook = app.slack.response_url("sim-1");
    let post = |url: &str, body: Value| {
        let http = page.http.clone();
        let url = url.to_owned();
        async move {
            let resp = http.post(url).json(&body).send().await.unwrap();
            assert_eq!(resp.status(), 200);
        }
    };
    // `in_channel` posts for everyone in the command's channel.
    post(
        &hook,
        json!({"response_type": "in_channel", "text": "for *everyone*"}),
    )
    .await;
    let world = page.world().await;
    let shown = messages(&world, APPROVALS);
    assert_eq!(shown.len(), 1, "{world}");
    assert_eq!(shown[0]["text"], "for *everyone*");
    // `replace_original` replaces the answer the person saw; `delete_original` removes it.
    post(&hook, json!({"replace_original": true, "text": "replaced"})).await;
    let world = page.world().await;
    let seen = ephemeral_of(&world, "U0001");
    assert_eq!(seen.len(), 1, "{world}");
    assert_eq!(seen[0]["text"], "replaced");
    post(&hook, json!({"delete_original": true})).await;
    assert!(ephemeral_of(&page.world().await, "U0001").is_empty());
    // A hook the page never handed out is only recorded, as before.
    let seq = page.world().await["seq"].clone();
    post(&app.slack.response_url("elsewhere"), json!({"text": "x"})).await;
    assert_eq!(page.world().await["seq"], seq);
    assert_eq!(app.slack.hook_posts("elsewhere").len(), 1);
}

/// `/invite @Steward` typed on the page is Slack's own command: the simulator puts the bot in
/// the channel (no Steward is asked), shows who typed it that it was added, and the bot's posts
/// there, refused with `not_in_channel` before, go through.
#[tokio::test]
async fn invite_typed_on_the_page_puts_the_bot_in_the_channel() {
    let sim = SlackSim::start(SlackSimOptions {
        channels_without_bot: vec![SimChannel {
            id: "C0LONELY".into(),
            name: "lonely".into(),
        }],
        people: vec![sandbox_steward::sim::slack::Person {
            id: "U0ADA".into(),
            label: "Ada".into(),
        }],
        ..SlackSimOptions::default()
    })
    .await
    .unwrap();
    // Nothing listens there: an invite never reaches Steward.
    sim.connect_steward("http://127.0.0.1:9", None).unwrap();
    let page = Page::of(&sim);
    let refused = page
        .post(
            "chat.postMessage",
            json!({"channel": "C0LONELY", "text": "card"}),
        )
        .await;
    assert_eq!(refused["error"], "not_in_channel", "{refused}");

    let (status, answer) = page.command("U0ADA", "C0LONELY", "/invite @someone").await;
    assert_eq!(
        (status, &answer["shown"]),
        (200, &json!("ephemeral")),
        "{answer}"
    );
    let still = page
        .post(
            "chat.postMessage",
            json!({"channel": "C0LONELY", "text": "card"}),
        )
        .await;
    assert_eq!(
        still["error"], "not_in_channel",
        "only Steward can be invited: {still}"
    );

    let (status, answer) = page.command("U0ADA", "C0LONELY", "/invite @Steward").await;
    assert_eq!(status, 200, "{answer}");
    let world = page.world().await;
    let said: Vec<&str> = world["ephemeral"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["text"].as_str())
        .collect();
    assert!(said.contains(&"Steward was added to #lonely."), "{said:?}");
    let posted = page
        .post(
            "chat.postMessage",
            json!({"channel": "#lonely", "text": "card"}),
        )
        .await;
    assert_eq!(posted["channel"], "C0LONELY", "{posted}");
}
