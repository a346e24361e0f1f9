//! E2B lifecycle events end to end: the E2B simulator delivers its signed events to a
//! `steward serve` in this process (Redis at `REDIS_URL`, the Slack simulator beside it).
//!
//! 1. **Outside kill → card closed**: `STEWARD_BENCH_CASES` (default 50) kill cases wait for a
//!    decision; each sandbox is killed at the simulator, one at a time, and the time until its
//!    case is closed and until its card has lost its buttons is taken.
//! 2. **Burst**: a `[[watch]]` burst rule (more than 20 within 10 minutes by owner) and
//!    `STEWARD_BENCH_BURST` (default 500) sandboxes created by one owner, 16 at a time, as an agent
//!    loop would: the time from the first creation to the alert's post, and until the alert lists
//!    every one, with the Slack calls it took (one post, then updates in place).
//! 3. **Polling**: a second `steward serve` with no webhook and `[events] poll_every` of
//!    `STEWARD_BENCH_POLL_EVERY` seconds (default 5); `STEWARD_BENCH_POLLED` (default 12) of its
//!    kill cases whose sandboxes are killed at the simulator at spread moments of the interval:
//!    the time until each case is closed by a poll.
//!
//! Run with `cargo bench --bench e2b_events`. Webhook deliveries cross real sockets; everything
//! shares the machine's cores, so the figures are a ceiling for the lag.
use std::time::{Duration, Instant};

use sandbox_steward::cases::CaseState;
use sandbox_steward::config::Settings;
use sandbox_steward::ids::CaseId;
use sandbox_steward::sim::e2b::{SimOptions, SimServer};
use sandbox_steward::sim::slack::{SlackSim, SlackSimOptions};
use sandbox_steward::slack::signature::sign;
use sandbox_steward::startup::Application;
use sandbox_steward::store::Store;
use serde_json::json;

mod support;
use support::{env_or, ms, percentile, redis_and_prefix, steward_env};

const SECRET: &str = "bench-signing-secret";
const HOOK_SECRET: &str = "whsec-bench-events";
const E2B_KEY: &str = "e2b_bench_key";
const APPROVALS: &str = "C0APPROVALS";
const PATIENCE: Duration = Duration::from_secs(60);

struct Bench {
    client: reqwest::Client,
    base: String,
    e2b: String,
    slack: SlackSim,
    store: Store,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cases = env_or::<usize>("STEWARD_BENCH_CASES", 50);
    let burst = env_or::<usize>("STEWARD_BENCH_BURST", 500);
    let (redis_url, prefix) = redis_and_prefix("e2b-events");
    let e2b = SimServer::start(SimOptions {
        sandboxes: 0,
        api_key: Some(E2B_KEY.into()),
        ..SimOptions::default()
    })
    .await?;
    let slack = SlackSim::start(SlackSimOptions::default()).await?;
    let dir = tempfile::tempdir()?;
    let policy = dir.path().join("steward.toml");
    std::fs::write(
        &policy,
        format!(
            "[channels]\napprovals = \"{APPROVALS}\"\n[approvals.approvers]\n\
             kill = {{ anyone = true }}\npause = {{ anyone = true }}\n\
             [events]\npoll_every = \"off\"\n\
             [[watch]]\nname = \"agent-burst\"\n\
             burst = {{ more_than = 20, within = \"10m\", by = \"owner\" }}\n"
        ),
    )?;
    let env = steward_env([
        ("SLACK_API_URL", slack.api_url()),
        ("SLACK_BOT_TOKEN", "xoxb-bench".to_owned()),
        ("SLACK_SIGNING_SECRET", SECRET.to_owned()),
        ("E2B_API_URL", e2b.base_url()),
        ("E2B_API_KEY", E2B_KEY.to_owned()),
        ("E2B_PROJECT_ID", e2b.team_id().to_owned()),
        ("E2B_SANDBOX_URL", e2b.envd_url()),
        ("E2B_WEBHOOK_SECRET", HOOK_SECRET.to_owned()),
        ("REDIS_URL", redis_url.clone()),
        ("STEWARD_REDIS_PREFIX", prefix.clone()),
        ("STEWARD_CONFIG", policy.display().to_string()),
    ]);
    let app = Application::build(Settings::load(&env)?).await?;
    let base = format!("http://127.0.0.1:{}", app.port());
    tokio::spawn(app.run_until_stopped(std::future::pending()));
    let bench = Bench {
        client: reqwest::Client::new(),
        base: base.clone(),
        e2b: e2b.base_url(),
        slack,
        store: Store::redis(&redis_url, &prefix).await?,
    };
    bench
        .e2b_call(
            reqwest::Method::POST,
            "/events/webhooks",
            Some(json!({
                "name": "steward", "url": format!("{base}/e2b/webhook"), "enabled": true,
                "events": ["sandbox.lifecycle.created", "sandbox.lifecycle.killed"],
                "signatureSecret": HOOK_SECRET,
            })),
        )
        .await?;

    // 1. Outside kill → card closed.
    let mut opened = Vec::with_capacity(cases);
    for i in 0..cases {
        // No owner: the burst rule does not count these.
        let made = bench
            .e2b_call(
                reqwest::Method::POST,
                "/sandboxes",
                Some(json!({"templateID": "base", "timeout": 3600})),
            )
            .await?;
        let sandbox = made["sandboxID"].as_str().unwrap_or_default().to_owned();
        opened.push((sandbox.clone(), bench.open_kill_case(&sandbox, i).await?));
    }
    let (mut closed, mut rewritten) = (Vec::new(), Vec::new());
    for (sandbox, case) in &opened {
        let started = Instant::now();
        bench
            .e2b_call(
                reqwest::Method::DELETE,
                &format!("/sandboxes/{sandbox}"),
                None,
            )
            .await?;
        closed.push(bench.until_closed(case, started).await?);
        let card = bench.store.get_case(case).await?.card;
        let card = card.ok_or_else(|| anyhow::anyhow!("case {case} has no card"))?;
        loop {
            let message = bench.slack.message(card.channel.as_str(), &card.ts);
            let buttons = message
                .and_then(|m| m.blocks)
                .is_some_and(|b| b.to_string().contains("\"actions\""));
            if !buttons {
                rewritten.push(started.elapsed());
                break;
            }
            anyhow::ensure!(
                started.elapsed() < PATIENCE,
                "card of {case} kept its buttons"
            );
            tokio::task::yield_now().await;
        }
    }
    closed.sort();
    rewritten.sort();
    println!("outside kill at the simulator -> Steward: {cases} waiting cases, one at a time");
    for (what, lat) in [("case closed", &closed), ("card rewritten", &rewritten)] {
        println!(
            "  {what:<15} p50 {:.2} ms · p99 {:.2} ms · max {:.2} ms",
            ms(percentile(lat, 0.50)),
            ms(percentile(lat, 0.99)),
            ms(lat.last().copied().unwrap_or_default())
        );
    }

    // 2. A burst of creations by one owner.
    let calls_before = bench.slack.messages().len();
    let started = Instant::now();
    let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let (client, url, next) = (
            bench.client.clone(),
            format!("{}/sandboxes", bench.e2b),
            next.clone(),
        );
        tasks.push(tokio::spawn(async move {
            while next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < burst {
                let r = client
                    .post(&url)
                    .header("X-API-Key", E2B_KEY)
                    .json(&json!({"templateID": "base", "timeout": 3600,
                                  "metadata": {"owner": "night-agent"}}))
                    .send()
                    .await?;
                anyhow::ensure!(r.status().is_success(), "create: {}", r.status());
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let created = started.elapsed();
    let mut posted_at = None;
    let listed_at = loop {
        if posted_at.is_none()
            && bench.slack.messages()[calls_before..].iter().any(|m| {
                m.method == "chat.postMessage"
                    && m.text.as_deref().is_some_and(|t| t.starts_with("Burst"))
            })
        {
            posted_at = Some(started.elapsed());
        }
        let lists = bench.store.active_lists().await?;
        if let Some(id) = lists.first() {
            let list = bench.store.get_list(id).await?;
            if list.groups.first().is_some_and(|g| g.items.len() >= burst) {
                break started.elapsed();
            }
        }
        if started.elapsed() > PATIENCE * 3 {
            let mut sizes = Vec::new();
            for id in bench.store.active_lists().await? {
                let list = bench.store.get_list(&id).await?;
                sizes.push(list.groups.first().map_or(0, |g| g.items.len()));
            }
            anyhow::bail!("the alert never listed all {burst}: alerts in play list {sizes:?}");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let calls = &bench.slack.messages()[calls_before..];
    let posts = calls
        .iter()
        .filter(|m| m.method == "chat.postMessage")
        .count();
    let updates = calls.iter().filter(|m| m.method == "chat.update").count();
    println!(
        "burst: {burst} sandboxes created by one owner, 16 at a time (rule: more than 20 within 10 min)"
    );
    println!(
        "  created in {:.2} s · alert posted {:.2} s after the first · all {burst} listed after {:.2} s",
        created.as_secs_f64(),
        posted_at.unwrap_or(listed_at).as_secs_f64(),
        listed_at.as_secs_f64()
    );
    println!("  Slack: {posts} post(s), {updates} update(s) of it in place");

    // 3. Polling: a replica E2B cannot reach (no webhook) learns of the kills from the events API.
    let every = env_or::<u64>("STEWARD_BENCH_POLL_EVERY", 5);
    let polled_cases = env_or::<usize>("STEWARD_BENCH_POLLED", 12);
    let polled_prefix = format!("{prefix}-polled");
    let polled_policy = dir.path().join("polled.toml");
    std::fs::write(
        &polled_policy,
        format!(
            "[channels]\napprovals = \"{APPROVALS}\"\n[approvals.approvers]\n\
             kill = {{ anyone = true }}\n[events]\npoll_every = \"{every}s\"\n"
        ),
    )?;
    let env = steward_env([
        ("SLACK_API_URL", bench.slack.api_url()),
        ("SLACK_BOT_TOKEN", "xoxb-bench".to_owned()),
        ("SLACK_SIGNING_SECRET", SECRET.to_owned()),
        ("E2B_API_URL", e2b.base_url()),
        ("E2B_API_KEY", E2B_KEY.to_owned()),
        ("E2B_PROJECT_ID", e2b.team_id().to_owned()),
        ("E2B_SANDBOX_URL", e2b.envd_url()),
        ("REDIS_URL", redis_url.clone()),
        ("STEWARD_REDIS_PREFIX", polled_prefix.clone()),
        ("STEWARD_CONFIG", polled_policy.display().to_string()),
    ]);
    let app = Application::build(Settings::load(&env)?).await?;
    let polled = Bench {
        client: bench.client.clone(),
        base: format!("http://127.0.0.1:{}", app.port()),
        e2b: bench.e2b.clone(),
        slack: bench.slack,
        store: Store::redis(&redis_url, &polled_prefix).await?,
    };
    tokio::spawn(app.run_until_stopped(std::future::pending()));
    let mut opened = Vec::with_capacity(polled_cases);
    for i in 0..polled_cases {
        let made = polled
            .e2b_call(
                reqwest::Method::POST,
                "/sandboxes",
                Some(json!({"templateID": "base", "timeout": 3600})),
            )
            .await?;
        let sandbox = made["sandboxID"].as_str().unwrap_or_default().to_owned();
        opened.push((
            sandbox.clone(),
            polled.open_kill_case(&sandbox, 100_000 + i).await?,
        ));
    }
    let mut lags = Vec::new();
    for (i, (sandbox, case)) in opened.iter().enumerate() {
        // Each kill at another moment of the poll interval (a golden-ratio spread), as kills
        // come: one right after a poll waits the whole interval, one just before it hardly.
        let phase = (i as f64 * 0.618_034).fract();
        tokio::time::sleep(Duration::from_secs_f64(phase * every as f64)).await;
        let started = Instant::now();
        polled
            .e2b_call(
                reqwest::Method::DELETE,
                &format!("/sandboxes/{sandbox}"),
                None,
            )
            .await?;
        lags.push(polled.until_closed(case, started).await?);
    }
    lags.sort();
    println!(
        "polling, no webhook: {polled_cases} outside kills, poll every {every} s (target: within the interval + 1 s)"
    );
    println!(
        "  case closed p50 {:.2} s · max {:.2} s",
        percentile(&lags, 0.50).as_secs_f64(),
        lags.last().copied().unwrap_or_default().as_secs_f64()
    );
    Ok(())
}

impl Bench {
    /// How long after `started` the case was closed as ended outside Steward.
    async fn until_closed(&self, case: &CaseId, started: Instant) -> anyhow::Result<Duration> {
        loop {
            let c = self.store.get_case(case).await?;
            if matches!(c.state, CaseState::EndedOutside { .. }) {
                return Ok(started.elapsed());
            }
            anyhow::ensure!(started.elapsed() < PATIENCE, "case {case} never closed");
            tokio::task::yield_now().await;
        }
    }

    async fn e2b_call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> anyhow::Result<serde_json::Value> {
        let mut req = self
            .client
            .request(method, format!("{}{path}", self.e2b))
            .header("X-API-Key", E2B_KEY);
        if let Some(body) = body {
            req = req.json(&body);
        }
        let r = req.send().await?;
        anyhow::ensure!(r.status().is_success(), "{path}: {}", r.status());
        Ok(r.json().await.unwrap_or(serde_json::Value::Null))
    }

    /// `/sandbox kill <sandbox>`, and the id of the case it opened (with its card).
    async fn open_kill_case(&self, sandbox: &str, i: usize) -> anyhow::Result<CaseId> {
        let hook = format!("open{i}");
        let body = form_urlencoded::Serializer::new(String::new())
            .append_pair("team_id", "T0001")
            .append_pair("channel_id", "C0001")
            .append_pair("user_id", &format!("U1{i:05}"))
            .append_pair("command", "/sandbox")
            .append_pair("text", &format!("kill {sandbox} benchmark"))
            .append_pair("response_url", &self.slack.response_url(&hook))
            .finish();
        let ts = chrono::Utc::now().timestamp();
        let resp = self
            .client
            .post(format!("{}/slack/commands", self.base))
            .header("content-type", "application/x-www-form-urlencoded")
            .header("x-slack-request-timestamp", ts.to_string())
            .header("x-slack-signature", sign(SECRET, ts, body.as_bytes()))
            .body(body)
            .send()
            .await?;
        anyhow::ensure!(resp.status() == 200, "command answered {}", resp.status());
        let started = Instant::now();
        let text = loop {
            if let Some(post) = self.slack.hook_posts(&hook).into_iter().next() {
                break format!("{:?} {:?}", post.text, post.blocks);
            }
            anyhow::ensure!(started.elapsed() < PATIENCE, "no case opened for {sandbox}");
            tokio::time::sleep(Duration::from_millis(2)).await;
        };
        let start = text
            .find("case_")
            .ok_or_else(|| anyhow::anyhow!("no case id in {text}"))?;
        let id: String = text[start..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        let id = CaseId::parse(id)?;
        loop {
            if self.store.get_case(&id).await?.card.is_some() {
                return Ok(id);
            }
            anyhow::ensure!(started.elapsed() < PATIENCE, "case {id} got no card");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}
