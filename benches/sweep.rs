//! Benchmark: a dry-run hygiene sweep over a simulated fleet at a simulated E2B latency, beside
//! the floor that sequential paging imposes.
//!
//! Run: `cargo bench --bench sweep` (defaults: 1,000, 10,000 and 100,000 sandboxes at 20 ms).
//! Override with `STEWARD_BENCH_SIZES=1000,10000`, `STEWARD_BENCH_LATENCY_MS` and
//! `STEWARD_BENCH_WINDOWS` (candidate windows read at once, default 64).
//!
//! The floors: each list page needs the previous page's token, so a listing costs
//! `pages × latency` however much else runs in parallel. The single-stream floor is the whole
//! fleet listed as one stream (`ceil(fleet / 100)` pages); the two-stream floor is running and
//! paused listed at once, each from one end (`max(ceil(running / 100), ceil(paused / 100))`
//! pages). The sweep now also reads each state from both ends (`hygiene/listing.rs`), so it can
//! beat the two-stream floor (`x2` below 1); `benches/sweep_rss.sh` prints that floor too. The
//! ratio `x` is against the single-stream floor; `x2` against the two-stream one. Everything else (batch metrics, store
//! look-ups, candidate windows, team metrics) can overlap with paging. The simulator runs on its own thread and runtime, as E2B
//! runs on its own machines, but shares the two cores; peak memory is the process's VmHWM, which
//! includes the simulator's world.
use std::sync::Arc;
use std::time::{Duration, Instant};

use sandbox_steward::config::{E2bSettings, SlackSettings};
use sandbox_steward::e2b::E2bClient;
use sandbox_steward::hygiene::{HygieneConfig, SweepContext, SweepMode, sweep_once};
use sandbox_steward::sim::e2b::SimOptions;
use sandbox_steward::slack::client::SlackClient;
use sandbox_steward::slack::render::Templates;
use sandbox_steward::store::Store;

mod support;
use support::{SimThread, peak_memory_mib};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let sizes: Vec<usize> = std::env::var("STEWARD_BENCH_SIZES")
        .ok()
        .map(|v| v.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1_000, 10_000, 100_000]);
    let latency_ms: u64 = std::env::var("STEWARD_BENCH_LATENCY_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let latency = Duration::from_millis(latency_ms);
    println!("sweep (dry run): {latency_ms} ms simulated E2B latency");
    println!(
        "{:>8} {:>9} {:>9} {:>9} {:>6} {:>6} {:>9} {:>9} {:>7} {:>11} {:>7} {:>12} {:>9}",
        "fleet",
        "wall",
        "1-floor",
        "2-floor",
        "x",
        "x2",
        "E2B calls",
        "windows",
        "pages",
        "calls/sbx",
        "idle",
        "1 call/sbx",
        "peak MiB"
    );
    for n in sizes {
        let sim = SimThread::start(SimOptions {
            sandboxes: n,
            latency_ms,
            ..SimOptions::default()
        })?;
        let mut e2b_settings = E2bSettings::for_url(&sim.base_url(), "e2b_bench");
        e2b_settings.team_id = Some(sim.team_id().to_owned());
        let mut ctx = SweepContext::new(
            E2bClient::new(&e2b_settings)?,
            // A dry run only reads the store; the in-memory one answers the same questions.
            Store::memory(),
            SlackClient::new(&SlackSettings {
                api_url: "http://127.0.0.1:9/api".into(),
                bot_token: None,
                signing_secret: None,
                templates_dir: None,
            })?,
            Arc::new(Templates::embedded()),
            Arc::new(HygieneConfig::default()),
            None,
        );
        if let Some(w) = std::env::var("STEWARD_BENCH_WINDOWS")
            .ok()
            .and_then(|v| v.parse().ok())
        {
            ctx.window_concurrency = w;
        }
        let started = Instant::now();
        let report = sweep_once(&ctx, chrono::Utc::now(), SweepMode::DryRun).await?;
        let wall = started.elapsed();
        let pages = report.pages;
        let pages_of = |n: usize| n.div_ceil(100) as u32;
        let floor = latency * pages_of(report.fleet.total);
        let floor2 = latency * pages_of(report.fleet.running).max(pages_of(report.fleet.paused));
        // list pages + metrics batches + 3 team calls; the rest are candidate windows.
        let windows = report.e2b_calls.saturating_sub(u64::from(pages) * 2 + 3);
        let naive = latency * pages + latency * n as u32;
        println!(
            "{:>8} {:>9.2?} {:>9.2?} {:>9.2?} {:>6.2} {:>6.2} {:>9} {:>9} {:>7} {:>11.3} {:>7} {:>12.1?} {:>9.0}",
            n,
            wall,
            floor,
            floor2,
            wall.as_secs_f64() / floor.as_secs_f64(),
            wall.as_secs_f64() / floor2.as_secs_f64(),
            report.e2b_calls,
            windows,
            pages,
            report.e2b_calls as f64 / n.max(1) as f64,
            report.counts.idle,
            naive,
            peak_memory_mib().unwrap_or(f64::NAN),
        );
        sim.stop();
    }
    println!(
        "1-floor = ceil(fleet / 100) x latency (one stream); 2-floor = max(ceil(running / 100), ceil(paused / 100)) x latency (two streams); x = wall / 1-floor, x2 = wall / 2-floor; '1 call/sbx' = paging plus one sequential metrics call per sandbox"
    );
    Ok(())
}
