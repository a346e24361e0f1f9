//! How long the Slack simulator's page takes to read a busy channel: posts
//! `STEWARD_BENCH_MESSAGES` (default 500) case-card-sized messages to one channel, then reads the
//! page's world JSON (`GET /_sim/world`, all channels, and `?channel=` for that one)
//! `STEWARD_BENCH_READS` times (default 50), printing its size and p50/p99/max latency.
//! Run with `cargo bench --bench slack_page`.
use std::time::Instant;

use sandbox_steward::sim::slack::{SlackSim, SlackSimOptions};
use serde_json::{Value, json};

mod support;
use support::{env_or, percentile};

/// Blocks shaped like a pending case card: header, sections with fields, context, buttons.
fn card(n: usize) -> Value {
    json!([
        {"type": "header", "text": {"type": "plain_text", "text": format!("Sandbox sbx{n}: kill it?")}},
        {"type": "section", "text": {"type": "mrkdwn", "text": "<@U0001> asks: finished with it"}},
        {"type": "section", "fields": [
            {"type": "mrkdwn", "text": "*State*\nrunning"},
            {"type": "mrkdwn", "text": "*Template*\n`base`"},
            {"type": "mrkdwn", "text": "*Resources*\n2 vCPU · 512 MiB · 1 GiB disk"},
            {"type": "mrkdwn", "text": "*Started*\n2025-12-29 07:20 UTC"},
            {"type": "mrkdwn", "text": "*Latest sample*\nCPU 1.5 % · memory 100 MiB of 512 MiB"},
        ]},
        {"type": "context", "elements": [{"type": "mrkdwn", "text": "Steward recommends *Snapshot, then kill*"}]},
        {"type": "actions", "block_id": format!("case:{n}"), "elements": [
            {"type": "button", "action_id": "case_snapshot_then_kill", "style": "primary",
             "text": {"type": "plain_text", "text": "Snapshot, then kill"}, "value": format!("case_{n}")},
            {"type": "button", "action_id": "case_kill", "style": "danger",
             "text": {"type": "plain_text", "text": "Kill"}, "value": format!("case_{n}")},
        ]},
    ])
}

async fn time_reads(http: &reqwest::Client, url: &str, reads: usize) -> anyhow::Result<()> {
    let mut took = Vec::with_capacity(reads);
    let mut bytes = 0;
    for _ in 0..reads {
        let start = Instant::now();
        let body = http
            .get(url)
            .send()
            .await?
            .error_for_status()?
            .bytes()
            .await?;
        took.push(start.elapsed());
        bytes = body.len();
    }
    took.sort();
    println!(
        "GET {url}: {} KiB, p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms over {reads} reads",
        bytes / 1024,
        percentile(&took, 0.5).as_secs_f64() * 1e3,
        percentile(&took, 0.99).as_secs_f64() * 1e3,
        took.last().unwrap().as_secs_f64() * 1e3,
    );
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let messages = env_or::<usize>("STEWARD_BENCH_MESSAGES", 500);
    let reads = env_or::<usize>("STEWARD_BENCH_READS", 50);
    let sim = SlackSim::start(SlackSimOptions::default()).await?;
    let http = reqwest::Client::new();
    let start = Instant::now();
    for n in 0..messages {
        let answer: Value = http
            .post(format!("{}/chat.postMessage", sim.api_url()))
            .bearer_auth("xoxb-bench")
            .json(&json!({"channel": "C0BUSY", "text": format!("case {n}"), "blocks": card(n)}))
            .send()
            .await?
            .json()
            .await?;
        anyhow::ensure!(answer["ok"] == true, "post {n} failed: {answer}");
    }
    println!(
        "posted {messages} case-card messages to one channel in {:.0} ms",
        start.elapsed().as_secs_f64() * 1e3
    );
    time_reads(&http, &format!("{}/_sim/world", sim.base_url()), reads).await?;
    time_reads(
        &http,
        &format!("{}/_sim/world?channel=C0BUSY", sim.base_url()),
        reads,
    )
    .await?;
    Ok(())
}
