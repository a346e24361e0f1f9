//! Benchmark: carrying out an approved list group of 1,000 pauses at a simulated E2B latency,
//! beside the floor `sandboxes × latency / concurrency`.
//!
//! Run: `cargo bench --bench list_execution` (defaults: 1,000 sandboxes, 20 ms, concurrency 8 and
//! 32). Override with `STEWARD_BENCH_SANDBOXES`, `STEWARD_BENCH_LATENCY_MS` and
//! `STEWARD_BENCH_CONCURRENCY=8,16,32`. The store is in memory unless `STEWARD_BENCH_REDIS` names
//! a Redis URL (a fresh key prefix is used and left to expire with its cases).
//!
//! What is timed: from the approval to the last item ending, through the same path a click
//! takes (`approvals::list::kick`: the list lease, decide each waiting item, `execute_case` with
//! its re-check, the digest's progress). Each item's re-check is read in batches (one listing
//! page and one batch-metrics call per 100 sandboxes, taken just before their turns), so an item
//! costs its pause plus a fiftieth of a call: the floor counts one call per sandbox, and the
//! ratio says how far above it the list runs. (Before the batching every item cost three calls:
//! read the sandbox, read its metrics, pause.)
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use sandbox_steward::approvals::list::{ListSettings, kick, progress_of};
use sandbox_steward::approvals::{BusyThreshold, Services};
use sandbox_steward::cases::list::ListEvent;
use sandbox_steward::config::{E2bSettings, SlackSettings};
use sandbox_steward::e2b::E2bClient;
use sandbox_steward::hygiene::{HygieneConfig, SweepContext, SweepMode, sweep_once};
use sandbox_steward::ids::{SlackChannelId, SlackUserId};
use sandbox_steward::sim::e2b::{SimHooks, SimOptions};
use sandbox_steward::sim::slack::{SlackSim, SlackSimOptions};
use sandbox_steward::slack::client::SlackClient;
use sandbox_steward::slack::limits::{Limits, LimitsConfig};
use sandbox_steward::slack::render::Templates;
use sandbox_steward::store::Store;

mod support;
use support::{SimThread, env_or};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let sandboxes: usize = env_or("STEWARD_BENCH_SANDBOXES", 1_000);
    let latency_ms: u64 = env_or("STEWARD_BENCH_LATENCY_MS", 20);
    let concurrencies: Vec<usize> = std::env::var("STEWARD_BENCH_CONCURRENCY")
        .ok()
        .map(|v| v.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![8, 32]);
    println!("list execution: {sandboxes} pauses at {latency_ms} ms simulated E2B latency");
    println!(
        "{:>11} {:>9} {:>9} {:>6} {:>10} {:>7} {:>8} {:>9}",
        "concurrency", "wall", "floor", "x", "E2B calls", "pauses", "done", "per sec"
    );
    for concurrency in concurrencies {
        run(sandboxes, latency_ms, concurrency).await?;
    }
    println!(
        "floor = sandboxes x latency / concurrency (one call per sandbox); the re-checks before the pauses are read 100 sandboxes a call (a listing page, a metrics batch)"
    );
    Ok(())
}

async fn run(sandboxes: usize, latency_ms: u64, concurrency: usize) -> anyhow::Result<()> {
    let sim = SimThread::start(SimOptions {
        sandboxes: 0,
        latency_ms,
        ..SimOptions::default()
    })?;
    let hooks = SimHooks::new(&sim.base_url());
    let now = Utc::now();
    for _ in 0..sandboxes {
        hooks
            .seed(serde_json::json!({"templateID": "base", "state": "running",
                "startedAt": (now - chrono::Duration::hours(5)).to_rfc3339(),
                "endAt": (now + chrono::Duration::hours(10)).to_rfc3339(),
                "profile": "idle", "metadata": {"owner": "bench"}}))
            .await?;
    }
    let slack_sim = SlackSim::start(SlackSimOptions::default()).await?;
    let mut e2b_settings = E2bSettings::for_url(&sim.base_url(), "e2b_bench");
    e2b_settings.team_id = Some(sim.team_id().to_owned());
    let e2b = E2bClient::new(&e2b_settings)?;
    let slack = SlackClient::new(&SlackSettings {
        api_url: slack_sim.api_url(),
        bot_token: Some("xoxb-bench".to_owned().into()),
        signing_secret: None,
        templates_dir: None,
    })?;
    let store = match std::env::var("STEWARD_BENCH_REDIS") {
        Ok(url) => {
            Store::redis(
                &url,
                &format!("bench-list-{}", uuid::Uuid::new_v4().simple()),
            )
            .await?
        }
        Err(_) => Store::memory(),
    };
    let templates = Arc::new(Templates::embedded());
    let config = HygieneConfig {
        list_from: 0,
        ..HygieneConfig::default()
    };
    let ctx = SweepContext::new(
        e2b.clone(),
        store.clone(),
        slack.clone(),
        templates.clone(),
        Arc::new(config),
        Some(SlackChannelId::parse("C0BENCH")?),
    );
    let report = sweep_once(&ctx, now, SweepMode::Live).await?;
    let list_id = report
        .posted
        .and_then(|p| p.list)
        .ok_or_else(|| anyhow::anyhow!("the sweep posted no list"))?;
    let list = store.get_list(&list_id).await?;
    let group = list
        .groups
        .iter()
        .position(|g| g.items.len() == sandboxes)
        .ok_or_else(|| anyhow::anyhow!("no group of {sandboxes}"))?;
    let svc = Services {
        store: store.clone(),
        slack,
        e2b: Some(e2b),
        templates,
        policy: Arc::new(Default::default()),
        busy_above: BusyThreshold::new(|_| 2.0),
        approvals_channel: None,
        tasks: tokio_util::task::TaskTracker::new(),
        limits: Arc::new(Limits::new(LimitsConfig::default())),
        lists: ListSettings {
            concurrency,
            ..ListSettings::default()
        },
        draining: tokio_util::sync::CancellationToken::new(),
        watch: Default::default(),
    };
    hooks.reset_calls().await?;
    let approve = ListEvent::Approve {
        group,
        by: SlackUserId::parse("U0BENCH")?,
        over_guard: false,
    };
    let started = Instant::now();
    store.update_list(&list_id, approve, Utc::now()).await?;
    kick(&svc, &list_id);
    let progress = loop {
        let list = store.get_list(&list_id).await?;
        let p = progress_of(&store, &list).await?[group].unwrap_or_default();
        if p.total > 0 && p.finished() {
            break p;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let wall = started.elapsed();
    let floor = Duration::from_millis(latency_ms) * sandboxes as u32 / concurrency as u32;
    let calls = hooks.calls().await?;
    // `paused` counts the pauses carried out, not a call.
    let total: u64 = calls
        .iter()
        .filter(|(op, _)| op.as_str() != "paused")
        .map(|(_, n)| n)
        .sum();
    println!(
        "{:>11} {:>9.2?} {:>9.2?} {:>6.2} {:>10} {:>7} {:>8} {:>9.0}",
        concurrency,
        wall,
        floor,
        wall.as_secs_f64() / floor.as_secs_f64(),
        total,
        calls.get("pause").copied().unwrap_or(0),
        progress.done,
        progress.done as f64 / wall.as_secs_f64(),
    );
    svc.tasks.close();
    svc.tasks.wait().await;
    sim.stop();
    Ok(())
}
