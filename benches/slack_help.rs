//! Throughput and latency of signed `/sandbox help` commands: the path every Slack request
//! takes (body limit, signature check, form parsing, command parsing, template rendering).
//!
//! Starts Steward on port 0 (E2B is not needed for help) and a fake Slack, sends
//! `STEWARD_BENCH_REQUESTS` (default 5000) signed commands with `STEWARD_BENCH_CONCURRENCY`
//! (default 32) in flight, and prints throughput with p50/p99/max latency.
//! Run with `cargo bench --bench slack_help`.
use std::sync::Arc;
use std::time::Instant;

use sandbox_steward::config::Settings;
use sandbox_steward::sim::slack::{SlackSim, SlackSimOptions};
use sandbox_steward::slack::signature::sign;
use sandbox_steward::startup::Application;
use tokio::sync::Semaphore;

mod support;
use support::{env_or, percentile, steward_env};

const SECRET: &str = "bench-signing-secret";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let requests = env_or::<usize>("STEWARD_BENCH_REQUESTS", 5000);
    let concurrency = env_or::<usize>("STEWARD_BENCH_CONCURRENCY", 32);
    let slack = SlackSim::start(SlackSimOptions::default()).await?;
    let env = steward_env([
        ("SLACK_API_URL", slack.api_url()),
        ("SLACK_BOT_TOKEN", "xoxb-bench".to_owned()),
        ("SLACK_SIGNING_SECRET", SECRET.to_owned()),
    ]);
    let app = Application::build(Settings::load(&env)?).await?;
    let url = format!("http://127.0.0.1:{}/slack/commands", app.port());
    tokio::spawn(app.run_until_stopped(std::future::pending()));

    let body = form_urlencoded::Serializer::new(String::new())
        .append_pair("team_id", "T0001")
        .append_pair("channel_id", "C0001")
        .append_pair("user_id", "U0001")
        .append_pair("command", "/sandbox")
        .append_pair("text", "help")
        .append_pair("response_url", &slack.response_url("bench"))
        .append_pair("trigger_id", "1.2.3")
        .finish();
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(concurrency)
        .build()?;
    let gate = Arc::new(Semaphore::new(concurrency));

    // Warm up connections and caches outside the measurement.
    for _ in 0..concurrency.min(requests) {
        send(&client, &url, &body).await?;
    }

    let started = Instant::now();
    let mut tasks = Vec::with_capacity(requests);
    for _ in 0..requests {
        let permit = gate.clone().acquire_owned().await?;
        let (client, url, body) = (client.clone(), url.clone(), body.clone());
        tasks.push(tokio::spawn(async move {
            let t = Instant::now();
            let result = send(&client, &url, &body).await;
            drop(permit);
            result.map(|()| t.elapsed())
        }));
    }
    let mut latencies = Vec::with_capacity(requests);
    for task in tasks {
        latencies.push(task.await??);
    }
    let elapsed = started.elapsed();
    latencies.sort();
    println!("signed /sandbox help: {requests} requests, {concurrency} in flight");
    println!(
        "  throughput  {:.0} req/s ({:.2} s total)",
        requests as f64 / elapsed.as_secs_f64(),
        elapsed.as_secs_f64()
    );
    println!(
        "  latency     p50 {:.2} ms · p99 {:.2} ms · max {:.2} ms",
        percentile(&latencies, 0.50).as_secs_f64() * 1e3,
        percentile(&latencies, 0.99).as_secs_f64() * 1e3,
        latencies.last().copied().unwrap_or_default().as_secs_f64() * 1e3
    );
    anyhow::ensure!(
        slack.messages().is_empty(),
        "help must not call Slack's API"
    );
    Ok(())
}

async fn send(client: &reqwest::Client, url: &str, body: &str) -> anyhow::Result<()> {
    // Signed per request, as Slack does, with the current time.
    let ts = chrono::Utc::now().timestamp();
    let resp = client
        .post(url)
        .header("content-type", "application/x-www-form-urlencoded")
        .header("x-slack-request-timestamp", ts.to_string())
        .header("x-slack-signature", sign(SECRET, ts, body.as_bytes()))
        .body(body.to_owned())
        .send()
        .await?;
    anyhow::ensure!(resp.status() == 200, "help answered {}", resp.status());
    let text = resp.text().await?;
    anyhow::ensure!(
        text.contains("/sandbox list"),
        "help answer lacks the subcommands"
    );
    Ok(())
}
