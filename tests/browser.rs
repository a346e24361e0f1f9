//! `steward demo` in a real browser: headless Chromium (Debian's `chromium` and
//! `chromium-driver` packages) driven over WebDriver against the demo started in-process
//! (`demo::start`, every port picked free, the embedded in-memory store). The demo's people use
//! its own page as the issue's scenario says: the page opens on the channel where something
//! happened last, with people named as the terminal names them and times said from now; the
//! approver lists the fleet; on the opening sweep's list decision she approves a Pause group and
//! sees it done, excludes a sandbox of another group by its checkbox (after a pasted stranger is
//! refused with a sentence), sends a Snapshot, then kill group to review and, on one of its cards
//! in the digest's thread, chooses Snapshot, then kill and sees the card end with the command
//! that starts a sandbox from its snapshot; the non-approver clicks Kill and is
//! refused; a malformed command gets the help; a text file in a thread opens in a tab.
//! Screenshots go to `target/browser-screenshots/`.
//!
//! With `STEWARD_SCREENSHOT=<path>` (what `scripts/screenshot` sets) the pending case card's
//! element screenshot is also written there: README.md's `docs/case-card.png`.
//!
//! Run alone with `cargo test --test browser`. It fails (never skips) when Chromium is missing.
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::elements::Element;
use fantoccini::{Client, ClientBuilder, Locator};
use sandbox_steward::demo::setup::{APPROVALS_CHANNEL, HYGIENE_CHANNEL};
use sandbox_steward::demo::{self, APPROVER, DemoHandle, DemoOptions, NON_APPROVER};
use serde_json::json;

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
/// How long the page may take to show something before the test fails.
const PAGE_PATIENCE: Duration = Duration::from_secs(30);
/// The README's case card is taken with the thread pane this wide (px), so the card reads as it
/// does in Slack's wider panes.
const CARD_PANE_WIDTH: u32 = 720;

/// `steward demo`, in this process: ports 0, the embedded store, the opening run.
async fn start_demo() -> DemoHandle {
    sandbox_steward::telemetry::init("error");
    let demo = demo::start(DemoOptions {
        port: 0,
        redis_url: None,
        ..DemoOptions::default()
    })
    .await
    .expect("the demo starts");
    assert_eq!(demo.store, "memory", "the browser test needs no Redis");
    assert!(
        demo.opening.problems.is_empty(),
        "the opening went wrong: {:?}",
        demo.opening.problems
    );
    demo
}

/// chromedriver on a free port, killed when dropped. It and Chromium get a temporary directory
/// of their own as `TMPDIR`, removed after them: Chromium leaves its singleton socket's directory
/// behind in the system's.
struct Driver {
    child: Child,
    url: String,
    _tmp: tempfile::TempDir,
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
        let tmp = tempfile::tempdir().expect("a temporary directory for Chromium");
        let mut child = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .env("TMPDIR", tmp.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts");
        // chromedriver says when it listens; its output is read to the end after that, so it
        // never blocks on a full pipe.
        let stdout = child.stdout.take().expect("piped stdout");
        let (listening, said) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                if line.contains("started successfully") {
                    let _ = listening.send(());
                }
            }
        });
        let driver = Self {
            child,
            url: format!("http://127.0.0.1:{port}"),
            _tmp: tmp,
        };
        said.recv_timeout(PAGE_PATIENCE)
            .expect("chromedriver never said it listens");
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

/// The longest one wait for the page to change lasts before the check runs again anyway: a
/// `MutationObserver` on the document counts changes, so this only bounds a change it could miss
/// (none known) and keeps each script under WebDriver's 30 s script timeout.
const CHANGE_WAIT_CAP: Duration = Duration::from_secs(5);

/// `changed_since`'s script: `arguments[0]` the count seen, `[1]` the cap in ms, the last the
/// callback WebDriver waits for.
const WAIT_FOR_CHANGE_JS: &str = r#"
const [seen, cap, done] = [arguments[0], arguments[1], arguments[arguments.length - 1]];
const w = window;
if (w.__stewardChanges === undefined) {
  w.__stewardChanges = 0;
  w.__stewardWaiters = [];
  new MutationObserver(() => {
    w.__stewardChanges += 1;
    const waiters = w.__stewardWaiters;
    w.__stewardWaiters = [];
    waiters.forEach((wake) => wake());
  }).observe(document, { subtree: true, childList: true, attributes: true, characterData: true });
  done();
} else if (w.__stewardChanges !== seen) {
  done();
} else {
  const timer = setTimeout(done, cap);
  w.__stewardWaiters.push(() => { clearTimeout(timer); done(); });
}
"#;

/// Finds a list group by the words of its title (`arguments[0]`) and marks its button with
/// action id `arguments[1]` as `data-test-target`: the group's blocks run from its section to
/// the next section.
const MARK_GROUP_BUTTON_JS: &str = r#"
const [words, action] = arguments;
document.querySelectorAll('[data-test-target]').forEach((n) => n.removeAttribute('data-test-target'));
for (const section of document.querySelectorAll('#messages .block-section, #thread-messages .block-section')) {
  const title = (section.querySelector('.mrkdwn') || section).textContent.split('\n')[0];
  if (!words.every((w) => title.includes(w))) continue;
  const inside = section.querySelector(`button[data-action-id="${action}"]`);
  if (inside) { inside.setAttribute('data-test-target', '1'); return true; }
  for (let n = section.nextElementSibling; n && !n.classList.contains('block-section'); n = n.nextElementSibling) {
    const button = n.querySelector(`button[data-action-id="${action}"]`);
    if (button) { button.setAttribute('data-test-target', '1'); return true; }
  }
}
return false;
"#;

/// The text a list group shows (its section and the blocks after it, up to the next group),
/// found by the words of its title (`arguments[0]`); `null` when no group matches.
const GROUP_TEXT_JS: &str = r#"
const [words] = arguments;
for (const section of document.querySelectorAll('#messages .block-section, #thread-messages .block-section')) {
  const title = (section.querySelector('.mrkdwn') || section).textContent.split('\n')[0];
  if (!words.every((w) => title.includes(w))) continue;
  let text = section.textContent;
  for (let n = section.nextElementSibling; n && !n.classList.contains('block-section'); n = n.nextElementSibling) {
    text += '\n' + n.textContent;
  }
  return text;
}
return null;
"#;

/// How many messages the busy channel gets.
const LOAD_MESSAGES: usize = 500;
/// A channel of the test's own, for the thread-and-file check.
const THREADS: &str = "C0THREADS";

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
    /// Fails the test with a screenshot of the page as it was.
    async fn fail(&self, why: String) -> ! {
        self.screenshot("failure").await;
        panic!("{why} (see target/browser-screenshots/failure.png)");
    }

    /// Waits until an element matching `css` shows text containing `text`; returns that text.
    async fn see(&self, css: &str, text: &str) -> String {
        let what = format!("the page never showed {text:?} in {css}");
        self.until(&what, || async {
            for element in self.client.find_all(Locator::Css(css)).await.ok()? {
                if let Ok(shown) = element.text().await
                    && shown.contains(text)
                {
                    return Some(shown);
                }
            }
            None
        })
        .await
    }

    /// Polls `check` until it gives a value; past [`PAGE_PATIENCE`] the test fails, saying
    /// `what` and saving a screenshot. The one wait every page step uses.
    async fn until<T, F, Fut>(&self, what: &str, mut check: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Option<T>>,
    {
        let deadline = Instant::now() + PAGE_PATIENCE;
        loop {
            // Read before the check, so a change during the check is not waited for again.
            let seen = self.changes().await;
            if let Some(value) = check().await {
                return value;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                self.fail(what.to_owned()).await;
            }
            self.changed_since(seen, left.min(CHANGE_WAIT_CAP)).await;
        }
    }

    /// How many times the page's document changed so far (`-1` before the counter is there:
    /// a page just loaded).
    async fn changes(&self) -> i64 {
        self.client
            .execute("return window.__stewardChanges ?? -1;", vec![])
            .await
            .ok()
            .and_then(|v| v.as_i64())
            .unwrap_or(-1)
    }

    /// Returns once the page's document changed after the count `seen` (at once when it already
    /// has, or when the page has no counter yet: this puts it there), or after `cap` at most.
    async fn changed_since(&self, seen: i64, cap: Duration) {
        let _ = self
            .client
            .execute_async(
                WAIT_FOR_CHANGE_JS,
                vec![json!(seen), json!(cap.as_millis() as u64)],
            )
            .await;
    }

    /// Waits until exactly `n` elements match `css`; returns `n`.
    async fn count(&self, css: &str, n: usize) -> usize {
        let what = format!("the page never showed {n} of {css}");
        self.until(&what, || async {
            let count = self.client.find_all(Locator::Css(css)).await.ok()?.len();
            (count == n).then_some(count)
        })
        .await
    }

    /// Waits for a message in `container` that holds an element matching `inner`; returns it.
    async fn message_with(&self, container: &str, inner: &str) -> Element {
        let what = format!("no message in {container} has {inner}");
        self.until(&what, || async {
            for message in self.messages(container).await {
                if message.find(Locator::Css(inner)).await.is_ok() {
                    return Some(message);
                }
            }
            None
        })
        .await
    }

    /// The messages shown in `container` now.
    async fn messages(&self, container: &str) -> Vec<Element> {
        self.client
            .find_all(Locator::Css(&format!("{container} .msg")))
            .await
            .unwrap_or_default()
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

    /// Clicks the element `css` inside the message of `container` whose text contains `text`
    /// (found afresh each try: the page redraws messages as they change).
    async fn click_on_message(&self, container: &str, text: &str, css: &str) {
        let what = format!("no {css} on a message with {text:?} in {container}");
        self.until(&what, || async {
            for message in self.messages(container).await {
                if message.text().await.unwrap_or_default().contains(text)
                    && let Ok(target) = message.find(Locator::Css(css)).await
                    && target.click().await.is_ok()
                {
                    return Some(());
                }
            }
            None
        })
        .await
    }

    /// Clicks what `css` finds; found again when the page redrew it between the find and the
    /// click (a stale element), until [`PAGE_PATIENCE`].
    async fn click_css(&self, css: &str) {
        self.until(&format!("nothing to click at {css}"), || async {
            let target = self.client.find(Locator::Css(css)).await.ok()?;
            target.click().await.ok()
        })
        .await
    }

    /// Confirms Slack's confirm dialog when the button just clicked asked for one (the page
    /// draws it before the click returns).
    async fn confirm_if_asked(&self, shot: &str) {
        if self
            .client
            .find(Locator::Css("#overlay [data-confirm='confirm']"))
            .await
            .is_ok()
        {
            self.screenshot(shot).await;
            self.click_css("#overlay [data-confirm='confirm']").await;
        }
    }

    async fn screenshot(&self, name: &str) {
        let png = self.client.screenshot().await.unwrap();
        std::fs::write(self.shots.join(format!("{name}.png")), png).unwrap();
    }

    /// The card element alone, with the thread pane widened to [`CARD_PANE_WIDTH`]: saved as
    /// `case-card.png`, and where `STEWARD_SCREENSHOT` says (README.md's picture).
    async fn card_screenshot(&self, subject: &str) {
        self.client
            .execute(
                "document.getElementById('thread').style.width = arguments[0] + 'px';",
                vec![json!(CARD_PANE_WIDTH)],
            )
            .await
            .unwrap();
        // Found afresh: the feed may have redrawn the thread since the caller looked.
        let card = self
            .message_with_text("#thread-messages", &format!("{subject}:"))
            .await;
        self.client
            .execute(
                "arguments[0].scrollIntoView({block: 'center'});",
                vec![serde_json::to_value(&card).unwrap()],
            )
            .await
            .unwrap();
        let png = card.screenshot().await.unwrap();
        assert!(
            png.starts_with(b"\x89PNG"),
            "an element screenshot is a PNG"
        );
        std::fs::write(self.shots.join("case-card.png"), &png).unwrap();
        if let Some(path) = std::env::var_os("STEWARD_SCREENSHOT") {
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
            std::fs::write(&path, &png)
                .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
            println!(
                "browser test: the case card's screenshot is in {}",
                path.display()
            );
        }
        self.client
            .execute(
                "document.getElementById('thread').style.width = '';",
                vec![],
            )
            .await
            .unwrap();
    }

    /// Clicks the `action` button of the list group whose title has every one of `group`'s
    /// words (`["bob", "Pause"]`), in the channel or the thread: the button in the group's
    /// own blocks, up to the next group.
    async fn click_in_group(&self, group: &[&str], action: &str) {
        let what = format!("no {action} button in a group showing {group:?}");
        self.until(&what, || async {
            let marked = self
                .client
                .execute(MARK_GROUP_BUTTON_JS, vec![json!(group), json!(action)])
                .await
                .ok()?;
            if marked != json!(true) {
                return None;
            }
            let target = self
                .client
                .find(Locator::Css("[data-test-target]"))
                .await
                .ok()?;
            target.click().await.ok()
        })
        .await
    }

    /// Scrolls the group showing every word of `group` to the middle of its pane, for a
    /// screenshot that shows it.
    async fn show_group(&self, group: &[&str]) {
        self.client
            .execute(
                "const [words] = arguments; \
                 for (const s of document.querySelectorAll('#messages .block-section, #thread-messages .block-section')) { \
                   const title = (s.querySelector('.mrkdwn') || s).textContent.split('\\n')[0]; \
                   if (words.every((w) => title.includes(w))) { s.scrollIntoView({block: 'center'}); return; } }",
                vec![json!(group)],
            )
            .await
            .unwrap();
    }

    /// Waits until the group showing every word of `group` says `text` (in its title, facts or
    /// status line); returns what the group shows.
    async fn see_group(&self, group: &[&str], text: &str) -> String {
        let what = format!("the group {group:?} never showed {text:?}");
        self.until(&what, || async {
            let shown = self
                .client
                .execute(GROUP_TEXT_JS, vec![json!(group)])
                .await
                .ok()?;
            let shown = shown.as_str()?.to_owned();
            shown.contains(text).then_some(shown)
        })
        .await
    }

    /// Waits for a message in `container` whose text contains `text`; returns it.
    async fn message_with_text(&self, container: &str, text: &str) -> Element {
        let what = format!("no message in {container} shows {text:?}");
        self.until(&what, || async {
            for message in self.messages(container).await {
                if message.text().await.unwrap_or_default().contains(text) {
                    return Some(message);
                }
            }
            None
        })
        .await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demos_people_decide_a_list_exclude_review_snapshot_are_refused_and_get_help_in_chromium()
 {
    let started = Instant::now();
    let demo = start_demo().await;
    let sweep = demo
        .opening
        .sweep
        .clone()
        .expect("the opening sweep posted");
    let driver = Driver::start();
    let client = browser(&driver).await;
    let shots = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/browser-screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    let me = Person {
        client: &client,
        shots,
    };
    // The opening's run card and push alert have landed, so the page has somewhere to open.
    let api = Api {
        url: format!("{}/api", demo.slack_url),
        http: reqwest::Client::new(),
    };
    let newest = wait_for_the_opening(&api.http, &demo).await;
    assert_ne!(newest, APPROVALS_CHANNEL, "something happened elsewhere");

    // 0. The page opens where something happened last, not on an empty #approvals, and names
    //    people as the terminal does.
    client
        .goto(&format!("{}/#as={}", demo.slack_url, APPROVER.id))
        .await
        .unwrap();
    me.see("#connection", "live").await;
    let title = me.see("#channel-title", "#").await;
    let newest_now = newest_channel(&api.http, &demo).await;
    let name_of = |id: &str| {
        sandbox_steward::demo::setup::CHANNELS
            .iter()
            .find(|(_, c)| *c == id)
            .map(|(n, _)| format!("#{n}"))
            .unwrap_or_default()
    };
    assert!(
        title == name_of(&newest) || title == name_of(&newest_now),
        "the page opened on {title}, the newest message is in {}",
        name_of(&newest_now)
    );
    let people = me.see("#person", APPROVER.name).await;
    for p in demo::PEOPLE {
        assert!(
            people.contains(&format!("{} ({})", p.name, p.label)),
            "the picker names {} as the terminal does: {people}",
            p.name
        );
    }
    me.screenshot("0-opened").await;

    // Times are said from now and follow the clock: moved on ten minutes, they say so.
    let times = me.see("#messages .msg .time", "").await;
    assert!(
        times.contains("just now") || times.contains("min ago"),
        "a time said from now: {times}"
    );
    client
        .execute("window.stewardSim.skew(600);", vec![])
        .await
        .unwrap();
    me.see("#messages .msg .time", "10 min ago").await;
    client
        .execute("window.stewardSim.skew(0);", vec![])
        .await
        .unwrap();
    me.click_css(&format!("#channels li[data-channel='{APPROVALS_CHANNEL}']"))
        .await;
    me.see("#channel-title", "#approvals").await;

    // 1. The approver lists the fleet and sees the table, only to them.
    me.type_command("/sandbox list").await;
    let list = me.see("#messages .msg.ephemeral", "running in total").await;
    assert!(list.contains("Only visible to you"), "{list}");
    me.see("#messages .msg.ephemeral pre", "ml-notebook").await;
    me.screenshot("1-list").await;

    // 2. The hygiene channel opens on the sweep's list decision: groups by owner and option.
    assert!(
        sweep.list.is_some(),
        "the opening sweep is a list: {sweep:?}"
    );
    me.click_css(&format!("#channels li[data-channel='{HYGIENE_CHANNEL}']"))
        .await;
    me.see("#channel-title", "#hygiene").await;
    me.see("#messages .msg", "Fleet hygiene").await;
    me.screenshot("2-list-digest").await;

    // The approver approves one owner's Pause group and watches it carried out.
    let pause_group = ["bob", "Pause"];
    me.click_in_group(&pause_group, "sweep_list_approve").await;
    me.confirm_if_asked("2-approve-confirm").await;
    me.see_group(&pause_group, "Approved by").await;
    // The demo's E2B refuses its first pause once: the group says so and offers Retry failed.
    me.see_group(&pause_group, "1 failed").await;
    me.show_group(&pause_group).await;
    me.screenshot("3-group-one-failed").await;
    me.click_in_group(&pause_group, "sweep_list_retry").await;
    me.confirm_if_asked("3-retry-confirm").await;
    let done = me.see_group(&pause_group, "2 done").await;
    assert!(
        !done.contains(":white_check_mark:"),
        "the emoji is drawn: {done}"
    );
    me.show_group(&pause_group).await;
    me.screenshot("3-group-approved").await;

    // Exclude… on another group: a form of real checkboxes. A pasted stranger is refused with
    // a sentence under the box and nothing is excluded; without it, the ticked one is.
    let exclude_group = ["carol", "Pause"];
    me.click_in_group(&exclude_group, "sweep_list_exclude")
        .await;
    me.see("#overlay .dialog header", "Exclude").await;
    let boxes = client
        .find_all(Locator::Css("#overlay .checkboxes input[type=checkbox]"))
        .await
        .unwrap();
    assert_eq!(boxes.len(), 2, "one box per sandbox of the group");
    let ticked = boxes[0]
        .attr("value")
        .await
        .unwrap()
        .expect("a box's value");
    boxes[0].click().await.unwrap();
    let paste = client
        .find(Locator::Css("#overlay textarea"))
        .await
        .unwrap();
    paste.send_keys("sbx_stranger").await.unwrap();
    me.screenshot("4-exclude-form").await;
    me.click_css("#overlay footer button[type=submit]").await;
    let refused = me
        .see("#overlay .input-error", "sbx_stranger is not in this group")
        .await;
    assert!(refused.contains("nothing was excluded"), "{refused}");
    me.screenshot("4-exclude-refused").await;
    let still = me.see_group(&exclude_group, "Pause").await;
    assert!(!still.contains("excluded"), "nothing excluded yet: {still}");
    let paste = client
        .find(Locator::Css("#overlay textarea"))
        .await
        .unwrap();
    paste.clear().await.unwrap();
    let kept = client
        .find(Locator::Css(
            "#overlay .checkboxes input[type=checkbox]:checked",
        ))
        .await
        .unwrap();
    assert_eq!(kept.attr("value").await.unwrap(), Some(ticked.clone()));
    me.click_css("#overlay footer button[type=submit]").await;
    me.until("the exclude form closes", || async {
        let overlay = client.find(Locator::Css("#overlay")).await.ok()?;
        (!overlay.is_displayed().await.ok()?).then_some(())
    })
    .await;
    let excluded = me.see_group(&exclude_group, "1 excluded").await;
    assert!(excluded.contains("Recommended"), "{excluded}");
    me.show_group(&exclude_group).await;
    me.screenshot("5-excluded").await;

    // Review individually on a Snapshot, then kill group: its cards appear in the thread.
    let review_group = ["bob", "Snapshot, then kill"];
    me.click_in_group(&review_group, "sweep_list_review").await;
    me.see_group(&review_group, "review these one by one").await;
    me.click_on_message("#messages", "Fleet hygiene", "button.replies")
        .await;
    me.see("#thread-title", "Thread in #hygiene").await;

    // A card offering Snapshot, then kill, as its recommendation (its first button: a sandbox
    // paused for days holding disk). Its subject is the header before the question.
    let card = me
        .message_with(
            "#thread-messages",
            ".block-actions > button:first-child[data-action-id='case_snapshot_then_kill']",
        )
        .await;
    client
        .execute(
            "arguments[0].scrollIntoView({block: 'center'});",
            vec![serde_json::to_value(&card).unwrap()],
        )
        .await
        .unwrap();
    me.screenshot("6-review-thread").await;
    let header = card
        .find(Locator::Css(".block-header"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let subject = header
        .split_once(':')
        .map(|(s, _)| s.to_owned())
        .unwrap_or_else(|| panic!("a pending card's header asks a question: {header}"));
    assert!(subject.starts_with("Sandbox "), "{header}");
    let evidence = card.text().await.unwrap();
    for shown in ["Snapshot, then kill", "Kill"] {
        assert!(
            evidence.contains(shown),
            "{shown} missing from the card: {evidence}"
        );
    }
    me.card_screenshot(&subject).await;

    // The approver chooses Snapshot, then kill, confirms, and the card ends with the snapshot id.
    me.click_on_message(
        "#thread-messages",
        &header,
        "button[data-action-id='case_snapshot_then_kill']",
    )
    .await;
    me.confirm_if_asked("7-snapshot-then-kill-confirm").await;
    let done = me
        .see(
            "#thread-messages .msg .block-header",
            &format!("{subject} killed, snapshot kept"),
        )
        .await;
    let ended = me.see("#thread-messages .msg", &done).await;
    assert!(
        ended.contains("(edited)"),
        "the card was updated in place: {ended}"
    );
    // The card names the snapshot once, in the command that starts a sandbox from it.
    let snapshot = ended
        .split_once("steward e2b create ")
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .map(|id| id.trim_matches('`').to_owned())
        .unwrap_or_default();
    assert!(
        !snapshot.is_empty(),
        "the card says how to start from the snapshot: {ended}"
    );
    me.screenshot("7-snapshot-then-kill-done").await;

    // 3. The non-approver clicks Kill on another case and is refused; that card stays open.
    me.act_as(NON_APPROVER.id).await;
    let other = me
        .message_with("#thread-messages", "button[data-action-id='case_kill']")
        .await;
    let other_header = other
        .find(Locator::Css(".block-header"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        !other_header.starts_with(&format!("{subject}:")),
        "{other_header}"
    );
    me.click_on_message(
        "#thread-messages",
        &other_header,
        "button[data-action-id='case_kill']",
    )
    .await;
    me.confirm_if_asked("8-kill-confirm").await;
    let refusal = me
        .see(
            "#messages .msg.ephemeral, #thread-messages .msg.ephemeral",
            "not an approver",
        )
        .await;
    assert!(refusal.contains("nothing was changed"), "{refusal}");
    me.see("#thread-messages .msg .block-header", &other_header)
        .await;
    me.screenshot("8-refusal").await;

    // 4. A malformed command gets the help.
    me.type_command("/sandbox frobnicate").await;
    let help = me.see("#messages .msg.ephemeral", "/sandbox help").await;
    assert!(
        help.contains("frobnicate"),
        "the help names what was typed: {help}"
    );
    me.screenshot("9-help").await;

    // Text from Steward is never HTML: markup shows as typed, mrkdwn is drawn.
    let rendered: serde_json::Value = client
        .execute(
            "const node = window.stewardSim.mrkdwn(arguments[0]); \
             return {html: node.innerHTML, text: node.textContent, imgs: node.querySelectorAll('img,script').length};",
            vec![json!(format!(
                "<img src=x onerror=alert(1)> &lt;script&gt;x&lt;/script&gt; *bold* _it_ ~gone~ `code` <https://e2b.dev|docs> <javascript:alert(1)|bad> <@{}> <#{APPROVALS_CHANNEL}> <!here> ```a\nb```",
                APPROVER.id
            ))],
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
        &format!("@{}", APPROVER.name),
        "#approvals",
        "@here",
        "<pre>a\nb</pre>",
        "&lt;script&gt;x&lt;/script&gt;",
    ] {
        assert!(html.contains(expected), "{expected} missing from {html}");
    }
    assert!(!html.contains("javascript:"), "{html}");

    // Emoji shortcodes are drawn; one the page does not know stays as typed, and none is drawn
    // inside code.
    let drawn: String = client
        .execute(
            "return window.stewardSim.mrkdwn(arguments[0]).textContent;",
            vec![json!(":recycle: kept :gear: :no_such_emoji: `:fire:`")],
        )
        .await
        .unwrap()
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(drawn, "♻️ kept ⚙️ :no_such_emoji: :fire:");

    // A thread: a reply and a file under a message show as a reply count that opens the thread.
    let parent = api
        .call(
            "chat.postMessage",
            json!({"channel": THREADS, "text": "Weekly sweep: 2 idle"}),
        )
        .await;
    let ts = parent["ts"].as_str().unwrap();
    api.call(
        "chat.postMessage",
        json!({"channel": THREADS, "thread_ts": ts, "text": "first idle sandbox"}),
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
        json!({"channel_id": THREADS, "thread_ts": ts,
               "files": [{"id": upload["file_id"], "title": "run log"}]}),
    )
    .await;
    me.click_css(&format!("#channels li[data-channel='{THREADS}']"))
        .await;
    me.see("#messages .msg .replies", "2 replies").await;
    me.click_on_message("#messages", "Weekly sweep: 2 idle", "button.replies")
        .await;
    me.see("#thread-messages", "first idle sandbox").await;
    let file = me.see("#thread-messages a.file", "run log").await;
    assert!(file.contains("run log"), "{file}");
    me.screenshot("10-thread").await;

    // The file opens in the browser as text, not as a download.
    let href = client
        .find(Locator::Css("#thread-messages a.file"))
        .await
        .unwrap()
        .prop("href")
        .await
        .unwrap()
        .expect("the file link has a target");
    let head = api.http.get(&href).send().await.unwrap();
    let header = |name: &str| {
        head.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    assert_eq!(header("content-type"), "text/plain; charset=utf-8");
    assert_eq!(header("content-disposition"), "inline");
    let page = client.window().await.unwrap();
    client.new_window(true).await.unwrap();
    let tabs = client.windows().await.unwrap();
    let tab = tabs.into_iter().find(|w| *w != page).expect("a new tab");
    client.switch_to_window(tab).await.unwrap();
    client.goto(&href).await.unwrap();
    me.see("body", "hello").await;
    me.screenshot("10-file-opened").await;
    client.close_window().await.unwrap();
    client.switch_to_window(page).await.unwrap();

    // 500 messages in one channel: how long until the page shows them all (reported, not asserted).
    for n in 0..LOAD_MESSAGES {
        api.call(
            "chat.postMessage",
            json!({"channel": "C0LOAD", "text": format!("message {n}"),
                   "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": format!("*message* {n} for <@{}>", APPROVER.id)}}]}),
        )
        .await;
    }
    let shown_in = Instant::now();
    me.click_css("#channels li[data-channel='C0LOAD']").await;
    me.count("#messages .msg", LOAD_MESSAGES).await;
    println!(
        "browser test: {LOAD_MESSAGES} messages in one channel shown in {} ms after the click",
        shown_in.elapsed().as_millis()
    );
    me.screenshot("11-busy-channel").await;

    client.close().await.unwrap();
    demo.stop().await.expect("the demo stops cleanly");
    println!(
        "browser test: {:.1} s from start to finish",
        started.elapsed().as_secs_f64()
    );
}

/// Waits until the opening's governed run has its card and its push test its alert, then
/// returns the channel of the newest message (what the page should open on).
async fn wait_for_the_opening(http: &reqwest::Client, demo: &DemoHandle) -> String {
    use futures::StreamExt;
    let deadline = Instant::now() + PAGE_PATIENCE * 4;
    // Subscribed before the first read, so no change between a read and the wait is missed.
    let mut changes = http
        .get(format!("{}/_sim/events", demo.slack_url))
        .send()
        .await
        .unwrap()
        .bytes_stream();
    loop {
        let calls: serde_json::Value = http
            .get(format!("{}/_sim/messages", demo.slack_url))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let text = calls.to_string();
        if text.contains("Run succeeded") && text.contains("code 101") {
            return newest_channel(http, demo).await;
        }
        // The simulator's change feed says when there is something new to read.
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, changes.next()).await {
            Ok(Some(Ok(_))) => {}
            Ok(other) => panic!("the simulator's change feed ended: {other:?}"),
            Err(_) => panic!("the opening's run card and push alert never arrived"),
        }
    }
}

/// The channel of the newest message (a reply counts for its channel) in the Slack simulator.
async fn newest_channel(http: &reqwest::Client, demo: &DemoHandle) -> String {
    let world: serde_json::Value = http
        .get(format!("{}/_sim/world", demo.slack_url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let mut newest: Option<(String, String)> = None;
    for channel in world["channels"].as_array().unwrap() {
        let id = channel["id"].as_str().unwrap().to_owned();
        for m in channel["messages"].as_array().unwrap() {
            let replies = m["replies"].as_array().cloned().unwrap_or_default();
            for ts in std::iter::once(m)
                .chain(replies.iter())
                .map(|m| m["ts"].as_str().unwrap_or_default())
            {
                if newest.as_ref().is_none_or(|(t, _)| ts > t.as_str()) {
                    newest = Some((ts.to_owned(), id.clone()));
                }
            }
        }
    }
    newest.map(|(_, c)| c).unwrap_or_default()
}
