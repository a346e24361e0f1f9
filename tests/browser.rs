//! The Slack simulator's page in a real browser: headless Chromium (Debian's `chromium` and
//! `chromium-driver` packages) driven over WebDriver, against Steward, the E2B simulator and the
//! Slack simulator started here. A person types commands, clicks a case card's buttons and
//! confirms, and sees what Slack would show. Screenshots go to `target/browser-screenshots/`.
//!
//! Run alone with `cargo test --test browser`. It fails (never skips) when Chromium is missing.
#[path = "it/common/mod.rs"]
mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use secrecy::SecretString;
use serde_json::json;

use common::{TestApp, TestAppOptions, spawn_app_with};

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
const APPROVALS: &str = "C0APPROVALS";
const APPROVER: &str = "U0APPROVER";
const REQUESTER: &str = "U0REQUESTER";
const BYSTANDER: &str = "U0BYSTANDER";
/// How long the page may take to show something before the test fails.
const PAGE_PATIENCE: Duration = Duration::from_secs(30);

/// Everything the page needs, running. Built by [`start_stack`] so the fixture can later be
/// `steward demo` instead.
struct Stack {
    /// The Slack simulator's page.
    page_url: String,
    /// The Slack simulator's Web API base (`…/api`), to post as Steward's bot does.
    slack_api_url: String,
    /// Sandboxes seeded for the scenario, in the E2B simulator.
    sandboxes: Vec<String>,
    /// Steward with its simulators; dropped last.
    _app: TestApp,
}

/// Steward (an approvals channel, `U0APPROVER` may kill, `U0REQUESTER` asks, `U0BYSTANDER` may
/// not kill), the E2B simulator with two running sandboxes, and the Slack simulator's page
/// pointed at Steward with its signing secret.
async fn start_stack() -> Stack {
    let app = spawn_app_with(TestAppOptions {
        sandboxes: 0,
        policy: Some(format!(
            r#"
[channels]
approvals = "{APPROVALS}"
[approvals]
two_person_rule = true
[approvals.approvers]
kill = {{ users = ["{APPROVER}"] }}
"#
        )),
        ..TestAppOptions::default()
    })
    .await;
    let sandboxes = vec!["browsersbx1".to_owned(), "browsersbx2".to_owned()];
    for id in &sandboxes {
        app.seed_sandbox(json!({"sandboxID": id, "templateID": "base", "state": "running"}))
            .await;
    }
    app.slack.add_channel(APPROVALS, "approvals");
    app.slack.add_person(APPROVER, "Ada (approver)");
    app.slack.add_person(REQUESTER, "Rex (requester)");
    app.slack.add_person(BYSTANDER, "Nia (not an approver)");
    app.slack
        .connect_steward(
            &app.address,
            Some(SecretString::from(app.signing_secret.clone())),
        )
        .expect("Steward's address is a URL");
    Stack {
        page_url: app.slack.page_url(),
        slack_api_url: app.slack.api_url(),
        sandboxes,
        _app: app,
    }
}

/// chromedriver on a free port, killed when dropped.
struct Driver {
    child: Child,
    url: String,
}

impl Driver {
    fn start() -> Self {
        for (path, package) in [(CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")] {
            assert!(
                std::path::Path::new(path).exists(),
                "{path} is missing: this test needs Debian's headless Chromium \
                 (`apt-get install -y chromium chromium-driver`; scripts/test installs it). Missing package: {package}"
            );
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts");
        let driver = Self {
            child,
            url: format!("http://127.0.0.1:{port}"),
        };
        let deadline = Instant::now() + PAGE_PATIENCE;
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "chromedriver never listened");
            std::thread::sleep(Duration::from_millis(50));
        }
        driver
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn browser(driver: &Driver) -> Client {
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        json!({
            "binary": CHROMIUM,
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1400,1000"],
        }),
    );
    ClientBuilder::new(hyper_util_connector())
        .capabilities(caps)
        .connect(&driver.url)
        .await
        .expect("a Chromium session starts")
}

/// WebDriver over plain HTTP on loopback: no TLS needed.
fn hyper_util_connector() -> hyper_util::client::legacy::connect::HttpConnector {
    hyper_util::client::legacy::connect::HttpConnector::new()
}

/// How many messages the busy channel gets.
const LOAD_MESSAGES: usize = 500;

/// Posts to the Slack simulator's Web API as Steward's bot does.
struct Api {
    url: String,
    http: reqwest::Client,
}

impl Api {
    async fn call(&self, method: &str, body: serde_json::Value) -> serde_json::Value {
        let answer: serde_json::Value = self
            .http
            .post(format!("{}/{method}", self.url))
            .bearer_auth("xoxb-browser-test")
            .json(&body)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(answer["ok"], true, "{method}: {answer}");
        answer
    }
}

/// The page as a person uses it.
struct Person<'a> {
    client: &'a Client,
    shots: std::path::PathBuf,
}

impl Person<'_> {
    /// Waits until an element matching `css` shows text containing `text`; returns that text.
    async fn see(&self, css: &str, text: &str) -> String {
        let deadline = Instant::now() + PAGE_PATIENCE;
        loop {
            for element in self.client.find_all(Locator::Css(css)).await.unwrap() {
                if let Ok(shown) = element.text().await
                    && shown.contains(text)
                {
                    return shown;
                }
            }
            if Instant::now() > deadline {
                self.screenshot("failure").await;
                panic!("the page never showed {text:?} in {css}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn act_as(&self, user: &str) {
        self.client
            .find(Locator::Css("#person"))
            .await
            .unwrap()
            .select_by_value(user)
            .await
            .unwrap();
    }

    async fn type_command(&self, text: &str) {
        let input = self.client.find(Locator::Css("#command")).await.unwrap();
        input.send_keys(&format!("{text}\n")).await.unwrap();
    }

    /// Clicks the button `action_id` on the message containing `text`.
    async fn click(&self, text: &str, action_id: &str) {
        let deadline = Instant::now() + PAGE_PATIENCE;
        loop {
            for message in self
                .client
                .find_all(Locator::Css("#messages .msg"))
                .await
                .unwrap()
            {
                if message.text().await.unwrap_or_default().contains(text)
                    && let Ok(button) = message
                        .find(Locator::Css(&format!(
                            "button[data-action-id='{action_id}']"
                        )))
                        .await
                {
                    button.click().await.unwrap();
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "no {action_id} button on a message with {text:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn click_css(&self, css: &str) {
        self.client
            .wait()
            .at_most(PAGE_PATIENCE)
            .for_element(Locator::Css(css))
            .await
            .unwrap_or_else(|_| panic!("nothing to click at {css}"))
            .click()
            .await
            .unwrap();
    }

    async fn confirm(&self) {
        self.client
            .wait()
            .at_most(PAGE_PATIENCE)
            .for_element(Locator::Css("[data-confirm='confirm']"))
            .await
            .expect("a confirm dialog")
            .click()
            .await
            .unwrap();
    }

    async fn screenshot(&self, name: &str) {
        let png = self.client.screenshot().await.unwrap();
        std::fs::write(self.shots.join(format!("{name}.png")), png).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_lists_opens_decides_and_is_refused_on_the_slack_simulators_page() {
    let started = Instant::now();
    let stack = start_stack().await;
    let driver = Driver::start();
    let client = browser(&driver).await;
    let shots = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/browser-screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    let me = Person {
        client: &client,
        shots,
    };
    client
        .goto(&format!(
            "{}#channel={APPROVALS}&as={APPROVER}",
            stack.page_url
        ))
        .await
        .unwrap();
    me.see("#connection", "live").await;
    me.see("#channel-title", "#approvals").await;

    // The approver lists the fleet and sees the table, only to them.
    me.type_command("/sandbox list").await;
    let list = me
        .see("#messages .msg.ephemeral", &stack.sandboxes[0])
        .await;
    assert!(list.contains("Only visible to you"), "{list}");
    me.see("#messages .msg.ephemeral pre", &stack.sandboxes[1])
        .await;
    me.screenshot("list").await;

    // The requester opens a case; its card shows in the channel for everyone.
    me.act_as(REQUESTER).await;
    me.type_command(&format!(
        "/sandbox kill {} finished with it",
        stack.sandboxes[0]
    ))
    .await;
    me.see(
        "#messages .msg",
        &format!("Sandbox {}: kill it?", stack.sandboxes[0]),
    )
    .await;
    me.screenshot("case-card").await;

    // The approver chooses Snapshot, then kill; the card ends with the snapshot id.
    me.act_as(APPROVER).await;
    me.click(&stack.sandboxes[0], "case_snapshot_then_kill")
        .await;
    if client
        .find(Locator::Css("[data-confirm='confirm']"))
        .await
        .is_ok()
    {
        me.confirm().await;
    }
    let done = me
        .see(
            "#messages .msg",
            &format!("Sandbox {} killed after snapshot", stack.sandboxes[0]),
        )
        .await;
    assert!(
        done.contains("(edited)"),
        "the card was updated in place: {done}"
    );
    me.screenshot("case-done").await;

    // Someone who is not an approver clicks Kill on a second case, confirms, and is refused.
    me.act_as(REQUESTER).await;
    me.type_command(&format!(
        "/sandbox kill {} finished with it",
        stack.sandboxes[1]
    ))
    .await;
    me.see(
        "#messages .msg",
        &format!("Sandbox {}: kill it?", stack.sandboxes[1]),
    )
    .await;
    me.act_as(BYSTANDER).await;
    me.click(
        &format!("Sandbox {}: kill it?", stack.sandboxes[1]),
        "case_kill",
    )
    .await;
    me.confirm().await;
    me.see("#messages .msg.ephemeral", "not an approver").await;
    me.screenshot("refusal").await;

    // A malformed command gets the help.
    me.type_command("/sandbox frobnicate").await;
    me.see("#messages .msg.ephemeral", "/sandbox help").await;
    me.screenshot("help").await;

    // Text from Steward is never HTML: markup shows as typed, mrkdwn is drawn.
    let rendered: serde_json::Value = client
        .execute(
            "const node = window.stewardSim.mrkdwn(arguments[0]); \
             return {html: node.innerHTML, text: node.textContent, imgs: node.querySelectorAll('img,script').length};",
            vec![json!(
                "<img src=x onerror=alert(1)> &lt;script&gt;x&lt;/script&gt; *bold* _it_ ~gone~ `code` <https://e2b.dev|docs> <javascript:alert(1)|bad> <@U0APPROVER> <#C0APPROVALS> <!here> ```a\nb```"
            )],
        )
        .await
        .unwrap();
    assert_eq!(rendered["imgs"], 0, "{rendered}");
    let html = rendered["html"].as_str().unwrap();
    for expected in [
        "<b>bold</b>",
        "<i>it</i>",
        "<s>gone</s>",
        "<code>code</code>",
        "href=\"https://e2b.dev/\"",
        "@Ada",
        "#approvals",
        "@here",
        "<pre>a\nb</pre>",
        "&lt;script&gt;x&lt;/script&gt;",
    ] {
        assert!(html.contains(expected), "{expected} missing from {html}");
    }
    assert!(!html.contains("javascript:"), "{html}");

    // A thread: a reply and a file under a message show as a reply count that opens the thread.
    let api = Api {
        url: stack.slack_api_url.clone(),
        http: reqwest::Client::new(),
    };
    let parent = api
        .call(
            "chat.postMessage",
            json!({"channel": APPROVALS, "text": "Weekly sweep: 2 idle"}),
        )
        .await;
    let ts = parent["ts"].as_str().unwrap();
    api.call(
        "chat.postMessage",
        json!({"channel": APPROVALS, "thread_ts": ts, "text": "first idle sandbox"}),
    )
    .await;
    let upload = api
        .call(
            "files.getUploadURLExternal",
            json!({"filename": "log.txt", "length": "5"}),
        )
        .await;
    api.http
        .post(upload["upload_url"].as_str().unwrap())
        .body("hello")
        .send()
        .await
        .unwrap();
    api.call(
        "files.completeUploadExternal",
        json!({"channel_id": APPROVALS, "thread_ts": ts,
               "files": [{"id": upload["file_id"], "title": "run log"}]}),
    )
    .await;
    me.see("#messages .msg .replies", "2 replies").await;
    me.click_css("#messages .msg .replies").await;
    me.see("#thread-messages", "first idle sandbox").await;
    let file = me.see("#thread-messages a.file", "run log").await;
    assert!(file.contains("run log"), "{file}");
    me.screenshot("thread").await;

    // 500 messages in one channel: how long until the page shows them all (reported, not asserted).
    for n in 0..LOAD_MESSAGES {
        api.call(
            "chat.postMessage",
            json!({"channel": "C0LOAD", "text": format!("message {n}"),
                   "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": format!("*message* {n} for <@{APPROVER}>")}}]}),
        )
        .await;
    }
    let shown_in = Instant::now();
    me.click_css("#channels li[data-channel='C0LOAD']").await;
    let deadline = Instant::now() + PAGE_PATIENCE;
    loop {
        let count = client
            .execute(
                "return document.querySelectorAll('#messages .msg').length;",
                vec![],
            )
            .await
            .unwrap();
        if count == json!(LOAD_MESSAGES) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the page showed {count} of {LOAD_MESSAGES} messages"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    println!(
        "browser test: {LOAD_MESSAGES} messages in one channel shown in {} ms after the click",
        shown_in.elapsed().as_millis()
    );
    me.screenshot("busy-channel").await;

    client.close().await.unwrap();
    println!(
        "browser test: {:.1} s from start to finish",
        started.elapsed().as_secs_f64()
    );
}
