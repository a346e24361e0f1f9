//! Benchmark: list a simulated fleet (all pages) and read batch metrics for every sandbox,
//! at a simulated E2B latency, and compare with the floor the round trips impose.
//!
//! Run: `cargo bench --bench fleet_listing` (defaults: 10,000 sandboxes, 20 ms latency).
//! Override with `STEWARD_BENCH_SANDBOXES` and `STEWARD_BENCH_LATENCY_MS`.
//!
//! The floor: listing pages is sequential (each page needs the previous page's token), so it
//! costs `pages × latency`; batch metrics run `chunks / concurrency` rounds of `latency`.
use std::time::{Duration, Instant};

use sandbox_steward::config::E2bSettings;
use sandbox_steward::e2b::{E2bClient, ListQuery, StateFilter};
use sandbox_steward::ids::SandboxId;
use sandbox_steward::sim::e2b::{SimOptions, SimServer};

mod support;
use support::env_or;

const RUNS: usize = 3;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let sandboxes = env_or::<u64>("STEWARD_BENCH_SANDBOXES", 10_000) as usize;
    let latency = Duration::from_millis(env_or::<u64>("STEWARD_BENCH_LATENCY_MS", 20));
    let concurrency = sandbox_steward::e2b::DEFAULT_METRICS_CONCURRENCY;

    let sim = SimServer::start(SimOptions {
        sandboxes,
        latency_ms: latency.as_millis() as u64,
        api_key: Some("e2b_bench".into()),
        ..SimOptions::default()
    })
    .await?;
    let client = E2bClient::new(&E2bSettings::for_url(&sim.base_url(), "e2b_bench"))?;

    println!(
        "fleet_listing: {sandboxes} sandboxes, {} ms simulated latency, metrics concurrency {concurrency}",
        latency.as_millis()
    );
    let mut totals = Vec::new();
    for run in 1..=RUNS {
        let calls_before = client.calls_made();
        let started = Instant::now();
        let listing = client
            .list_sandboxes(&ListQuery {
                state: StateFilter::Both,
                ..ListQuery::default()
            })
            .await?;
        let listed_in = started.elapsed();
        let ids: Vec<SandboxId> = listing.items.iter().map(|s| s.sandbox_id.clone()).collect();
        let metrics = client.metrics_many(&ids).await?;
        let total = started.elapsed();
        let calls = client.calls_made() - calls_before;

        let pages = listing.pages as u32;
        let chunks = ids.len().div_ceil(100) as u32;
        let rounds = chunks.div_ceil(concurrency as u32);
        let floor = latency * (pages + rounds);
        let naive = latency * (pages + ids.len() as u32);
        println!(
            "run {run}: listed {} in {} pages ({:.2?}), metrics for {} in {chunks} calls ({:.2?}); total {:.2?}, {calls} E2B calls; floor {:.2?} (x{:.2}); one call per sandbox would need {:.1?}",
            ids.len(),
            pages,
            listed_in,
            metrics.len(),
            total - listed_in,
            total,
            floor,
            total.as_secs_f64() / floor.as_secs_f64(),
            naive,
        );
        totals.push(total);
    }
    totals.sort();
    println!("median total: {:.2?}", totals[RUNS / 2]);
    sim.shutdown().await;
    Ok(())
}
