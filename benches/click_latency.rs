//! From a click on a decidable case to the first E2B call it causes: the click over HTTP, the
//! decision in Redis, the card update, the job on the queue, the worker claiming it, and the
//! worker's first request to E2B (the queue hop included).
//!
//! Starts the E2B simulator, a fake Slack and Steward in this process against Redis at
//! `REDIS_URL` (a fresh key prefix), opens `STEWARD_BENCH_CASES` (default 100) kill cases with
//! `/sandbox kill`, then clicks Pause on each, one at a time, and times the click until the
//! simulator has counted one more call (polled through `SimHooks`; each case is carried out
//! before the next click, so every call counted belongs to the click just made). Prints
//! p50/p99/max. Run with `cargo bench --bench click_latency`.
use std::time::{Duration, Instant};

use sandbox_steward::cases::CaseState;
use sandbox_steward::config::Settings;
use sandbox_steward::ids::CaseId;
use sandbox_steward::sim::e2b::{SimHooks, SimOptions, SimServer};
use sandbox_steward::sim::slack::{SlackSim, SlackSimOptions};
use sandbox_steward::slack::signature::sign;
use sandbox_steward::startup::Application;
use sandbox_steward::store::Store;
use serde_json::json;

mod support;
use support::{env_or, ms, percentile, redis_and_prefix, steward_env};

const SECRET: &str = "bench-signing-secret";
const E2B_KEY: &str = "e2b_bench";
const APPROVALS: &str = "C0APPROVALS";
/// How long one step (a case opening, a case finishing) may take before the bench gives up.
const PATIENCE: Duration = Duration::from_secs(30);

/// Everything the bench drives.
struct Bench {
    client: reqwest::Client,
    base: String,
    slack: SlackSim,
    hooks: SimHooks,
    store: Store,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cases = env_or::<usize>("STEWARD_BENCH_CASES", 100);
    let (redis_url, prefix) = redis_and_prefix("click");

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
             kill = {{ anyone = true }}\npause = {{ anyone = true }}\n"
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
        ("REDIS_URL", redis_url.clone()),
        ("STEWARD_REDIS_PREFIX", prefix.clone()),
        ("STEWARD_CONFIG", policy.display().to_string()),
    ]);
    let app = Application::build(Settings::load(&env)?).await?;
    let base = format!("http://127.0.0.1:{}", app.port());
    tokio::spawn(app.run_until_stopped(std::future::pending()));
    let bench = Bench {
        client: reqwest::Client::new(),
        base,
        slack,
        hooks: e2b.hooks(),
        store: Store::redis(&redis_url, &prefix).await?,
    };

    let mut opened = Vec::with_capacity(cases);
    for i in 0..cases {
        let sandbox = format!("bench{i:05}");
        bench
            .hooks
            .seed(json!({"sandboxID": sandbox, "templateID": "base", "state": "running"}))
            .await?;
        opened.push(bench.open_kill_case(&sandbox, i).await?);
    }

    let mut latencies = Vec::with_capacity(cases);
    for (i, case) in opened.iter().enumerate() {
        let before = bench.total_calls().await?;
        let started = Instant::now();
        bench.click_pause(case, i).await?;
        loop {
            if bench.total_calls().await? > before {
                break;
            }
            anyhow::ensure!(
                started.elapsed() < PATIENCE,
                "case {case} never reached E2B"
            );
            tokio::task::yield_now().await;
        }
        latencies.push(started.elapsed());
        bench.wait_done(case).await?;
    }
    latencies.sort();
    println!("click on a decidable case (Pause) -> first E2B call: {cases} cases, one at a time");
    println!(
        "  latency     p50 {:.2} ms · p99 {:.2} ms · max {:.2} ms",
        ms(percentile(&latencies, 0.50)),
        ms(percentile(&latencies, 0.99)),
        ms(latencies.last().copied().unwrap_or_default())
    );
    Ok(())
}

impl Bench {
    async fn post_signed(&self, path: &str, body: String) -> anyhow::Result<reqwest::Response> {
        let ts = chrono::Utc::now().timestamp();
        let resp = self
            .client
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/x-www-form-urlencoded")
            .header("x-slack-request-timestamp", ts.to_string())
            .header("x-slack-signature", sign(SECRET, ts, body.as_bytes()))
            .body(body)
            .send()
            .await?;
        anyhow::ensure!(resp.status() == 200, "{path} answered {}", resp.status());
        Ok(resp)
    }

    /// `/sandbox kill <sandbox>`, and the id of the case it opened (with its card).
    async fn open_kill_case(&self, sandbox: &str, i: usize) -> anyhow::Result<CaseId> {
        let hook = format!("open{i}");
        let body = form_urlencoded::Serializer::new(String::new())
            .append_pair("team_id", "T0001")
            .append_pair("channel_id", "C0001")
            // One requester per case: each person's commands are rate-limited.
            .append_pair("user_id", &format!("U1{i:05}"))
            .append_pair("command", "/sandbox")
            .append_pair("text", &format!("kill {sandbox} benchmark"))
            .append_pair("response_url", &self.slack.response_url(&hook))
            .finish();
        self.post_signed("/slack/commands", body).await?;
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

    /// A signed click on the case card's Pause button, by U0002.
    async fn click_pause(&self, case: &CaseId, i: usize) -> anyhow::Result<()> {
        let card = self
            .store
            .get_case(case)
            .await?
            .card
            .ok_or_else(|| anyhow::anyhow!("case {case} has no card"))?;
        let payload = json!({
            "type": "block_actions",
            "user": {"id": "U0002"},
            "trigger_id": format!("trigger-{i}"),
            "response_url": self.slack.response_url(&format!("click{i}")),
            "container": {"type": "message", "channel_id": card.channel.as_str(), "message_ts": card.ts},
            "channel": {"id": card.channel.as_str()},
            "actions": [{"action_id": "case_pause", "block_id": "b", "value": case.as_str(),
                         "action_ts": format!("1700000000.{i:06}")}],
        });
        let body = form_urlencoded::Serializer::new(String::new())
            .append_pair("payload", &payload.to_string())
            .finish();
        self.post_signed("/slack/interactions", body).await?;
        Ok(())
    }

    async fn total_calls(&self) -> anyhow::Result<u64> {
        Ok(self.hooks.calls().await?.values().sum())
    }

    /// Waits until the case's work is over, so the next click's calls are its own.
    async fn wait_done(&self, case: &CaseId) -> anyhow::Result<()> {
        let started = Instant::now();
        loop {
            let state = self.store.get_case(case).await?.state;
            match state {
                CaseState::Done { .. } => break,
                CaseState::Failed { .. } => anyhow::bail!("case {case} failed"),
                _ => {}
            }
            anyhow::ensure!(started.elapsed() < PATIENCE, "case {case} never finished");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        // Calls made after Done (a last card refresh) must not count toward the next click.
        let mut seen = self.total_calls().await?;
        loop {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let now = self.total_calls().await?;
            if now == seen {
                return Ok(());
            }
            seen = now;
        }
    }
}
