//! E2B lifecycle webhook intake: signed deliveries to `POST /e2b/webhook` of a `steward serve`
//! in this process, each checked (signature over the body, 64 KiB cap), deduplicated by event id
//! in Redis and answered before its work (a case lookup per event) runs.
//!
//! Sends `STEWARD_BENCH_EVENTS` (default 20,000) distinct `killed` events for sandboxes without a
//! case, `STEWARD_BENCH_CONCURRENCY` (default 32) at a time over keep-alive connections, then the
//! same events again (every one a duplicate). The client runs in the same process and on the same
//! cores, so the figures are a floor for the server alone. Prints events/s and p50/p99 of the
//! answer for both rounds. Run with `cargo bench --bench e2b_webhook` (Redis at `REDIS_URL`).
use std::sync::Arc;
use std::time::{Duration, Instant};

use sandbox_steward::config::Settings;
use sandbox_steward::lifecycle::signature;
use sandbox_steward::startup::Application;
use secrecy::SecretString;
use serde_json::json;

mod support;
use support::{env_or, ms, percentile, redis_and_prefix, steward_env};

const SECRET: &str = "whsec-bench";

async fn round(
    client: &reqwest::Client,
    url: &str,
    bodies: Arc<Vec<(Vec<u8>, String)>>,
    concurrency: usize,
) -> anyhow::Result<(Duration, Vec<Duration>, usize)> {
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (client, url, bodies, next) =
            (client.clone(), url.to_owned(), bodies.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut duplicates = 0usize;
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some((body, sig)) = bodies.get(i) else {
                    break;
                };
                let sent = Instant::now();
                let r = client
                    .post(&url)
                    .header("content-type", "application/json")
                    .header("e2b-signature-version", "v1")
                    .header("e2b-signature", sig)
                    .body(body.clone())
                    .send()
                    .await?;
                anyhow::ensure!(r.status() == 200, "status {}", r.status());
                let text = r.text().await?;
                latencies.push(sent.elapsed());
                duplicates += usize::from(text.contains("duplicate"));
            }
            anyhow::Ok((latencies, duplicates))
        }));
    }
    let mut all = Vec::new();
    let mut duplicates = 0;
    for t in tasks {
        let (l, d) = t.await??;
        all.extend(l);
        duplicates += d;
    }
    let took = started.elapsed();
    all.sort();
    Ok((took, all, duplicates))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let events = env_or::<usize>("STEWARD_BENCH_EVENTS", 20_000);
    let concurrency = env_or::<usize>("STEWARD_BENCH_CONCURRENCY", 32);
    let (redis_url, prefix) = redis_and_prefix("e2b-webhook");
    let env = steward_env([
        ("REDIS_URL", redis_url.clone()),
        ("STEWARD_REDIS_PREFIX", prefix.clone()),
        ("SLACK_SIGNING_SECRET", "bench".to_owned()),
        ("E2B_WEBHOOK_SECRET", SECRET.to_owned()),
    ]);
    let app = Application::build(Settings::load(&env)?).await?;
    let url = format!("http://127.0.0.1:{}/e2b/webhook", app.port());
    tokio::spawn(app.run_until_stopped(std::future::pending()));

    let secret = SecretString::from(SECRET.to_owned());
    let bodies: Vec<(Vec<u8>, String)> = (0..events)
        .map(|i| {
            let body = serde_json::to_vec(&json!({
                "version": "v1", "id": format!("{prefix}-ev-{i}"),
                "type": "sandbox.lifecycle.killed",
                "eventData": {"sandbox_metadata": {"owner": "bench"}},
                "sandboxBuildId": "b", "sandboxExecutionId": "x",
                "sandboxId": format!("ibench{i:06}"), "sandboxTeamId": "t",
                "sandboxTemplateId": "base", "timestamp": "2026-12-07T10:00:00Z",
            }))
            .expect("json");
            let sig = signature(&secret, &body);
            (body, sig)
        })
        .collect();
    let bodies = Arc::new(bodies);
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(concurrency)
        .build()?;
    println!(
        "E2B webhook intake: {events} signed events, {concurrency} in flight, client in-process"
    );
    for (name, want_duplicates) in [("new", false), ("repeat", true)] {
        let (took, latencies, duplicates) =
            round(&client, &url, bodies.clone(), concurrency).await?;
        anyhow::ensure!(
            (duplicates == events) == want_duplicates,
            "{name}: {duplicates} of {events} answered as duplicates"
        );
        println!(
            "  {name:<6} {:>8.0} events/s · p50 {:.2} ms · p99 {:.2} ms · max {:.2} ms",
            events as f64 / took.as_secs_f64(),
            ms(percentile(&latencies, 0.50)),
            ms(percentile(&latencies, 0.99)),
            ms(latencies.last().copied().unwrap_or_default())
        );
    }
    Ok(())
}
