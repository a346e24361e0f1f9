//! `steward sweep [--live] [--json]`: one hygiene pass now, from the terminal.
//!
//! By default the pass is a dry run: it reads E2B and the store and prints what would be
//! raised; it opens nothing and posts nothing. Only `--live` posts the digest and opens cases in
//! the hygiene channel, under the same lease as scheduled sweeps. This module parses and prints;
//! the pass itself is `hygiene::sweep_once`.
use std::io::Write as _;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;

use super::table::render_table;
use crate::config::{ProcessEnv, Settings};
use crate::e2b::E2bClient;
use crate::hygiene::digest::dollars;
use crate::hygiene::report::{Capacity, SweepReport};
use crate::hygiene::{Scheduler, SweepContext, SweepMode, sweep_now, sweep_once};
use crate::slack::client::SlackClient;
use crate::store::Store;

#[derive(Debug, clap::Args)]
pub struct SweepArgs {
    /// Report what would be raised; open no case and post nothing (the default; kept so
    /// scripts that say it keep working).
    #[arg(long, conflicts_with = "live")]
    pub dry_run: bool,
    /// Run a live sweep: post the digest and open cases in the hygiene channel.
    #[arg(long)]
    pub live: bool,
    /// Print the whole report as JSON (every idle sandbox with its evidence).
    #[arg(long)]
    pub json: bool,
}

/// Builds a sweep context from settings: E2B must be configured, Redis reachable.
pub async fn context(settings: &Settings) -> anyhow::Result<SweepContext> {
    if settings.e2b.api_key.is_none() {
        anyhow::bail!("E2B_API_KEY is not set, so Steward cannot read the fleet");
    }
    let e2b = E2bClient::new(&settings.e2b)?;
    let store = Store::from_settings(&settings.redis)
        .await
        .context("the sweep needs Redis for Leave decisions and open cases")?;
    let slack = SlackClient::new(&settings.slack)?;
    let templates = crate::startup::load_templates(settings.slack.templates_dir.as_deref())?;
    let (config, channel) = settings.policy.sweep().map_err(anyhow::Error::msg)?;
    Ok(SweepContext::new(
        e2b,
        store,
        slack,
        Arc::new(templates),
        Arc::new(config),
        channel,
    ))
}

pub async fn run(args: SweepArgs) -> anyhow::Result<ExitCode> {
    let settings = Settings::load(&ProcessEnv)?;
    let ctx = context(&settings).await?;
    let now = chrono::Utc::now();
    let report = if args.live {
        sweep_now(&Scheduler::new(ctx), now).await?
    } else {
        sweep_once(&ctx, now, SweepMode::DryRun).await?
    };
    // Written straight to stdout through one buffer, never built whole first: on a big fleet the
    // report runs to tens of megabytes of JSON (a third of 100,000 sandboxes idle, each with its
    // evidence), which would otherwise sit in memory beside the report it was made from.
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    if args.json {
        serde_json::to_writer_pretty(&mut out, &report)?;
        writeln!(out)?;
    } else {
        out.write_all(summary(&report).as_bytes())?;
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// The report for a person at a terminal: counts, then one line per idle sandbox.
pub fn summary(r: &SweepReport) -> String {
    let c = &r.counts;
    let rec = &c.by_recommendation;
    let mut out = String::new();
    let mut line = |text: String| {
        out.push_str(&text);
        out.push('\n');
    };
    line(format!(
        "Fleet: {} sandboxes ({} running, {} paused) in {} page(s), {} E2B calls.",
        r.fleet.total, r.fleet.running, r.fleet.paused, r.pages, r.e2b_calls
    ));
    line(format!(
        "Idle: {}, about {} a day: {} pause, {} snapshot then kill, {} kill, {} leave (ending soon).",
        c.idle,
        dollars(r.idle_cost_per_day_usd),
        rec.pause,
        rec.snapshot_then_kill,
        rec.kill,
        rec.leave
    ));
    line(format!(
        "Not raised: {} kept by metadata, {} left by a decision, {} too young, {} already have a case.",
        c.exempt.keep_metadata, c.exempt.left, c.exempt.too_young, c.already_open
    ));
    if c.unreadable + c.vanished > 0 {
        line(format!(
            "Not judged: {} gone meanwhile, {} unreadable.",
            c.vanished, c.unreadable
        ));
    }
    match &r.capacity {
        Capacity::Available {
            concurrent_now,
            concurrent_peak,
            start_rate_per_min,
            start_rate_peak_per_min,
            window_hours,
            ..
        } => line(format!(
            "Capacity (last {window_hours}h): {concurrent_now} running now, peak {concurrent_peak}; {start_rate_per_min:.1} starts/min on average, {start_rate_peak_per_min:.1} at peak."
        )),
        Capacity::Unavailable { reason } => line(format!("Capacity: unavailable ({reason}).")),
    }
    if r.guard.tripped {
        line(format!(
            "Blast-radius guard: {} kill recommendations ({:.0} % of the fleet) exceed the {:.0} % limit; they are held for review.",
            r.guard.kill_count,
            r.guard.share * 100.0,
            r.guard.limit * 100.0
        ));
    }
    for p in &r.problems {
        line(format!("Problem: {p}"));
    }
    match &r.posted {
        None => line("Dry run: nothing was opened or posted.".to_owned()),
        Some(p) => line(format!(
            "Posted the digest in {} (ts {}): cases opened {}, already open {}, held for review {}, deferred {}, failed {}.",
            p.channel,
            p.digest_ts,
            p.opened.len(),
            p.already_open,
            p.held_for_review,
            p.deferred,
            p.failed
        )),
    }
    if !r.idle.is_empty() {
        line(String::new());
        let rows: Vec<Vec<String>> = r
            .idle
            .iter()
            .map(|s| {
                vec![
                    s.id.to_string(),
                    s.template.clone(),
                    format!("{:?}", s.state).to_lowercase(),
                    s.owner.clone().unwrap_or_else(|| "-".into()),
                    s.recommendation.label().to_owned(),
                    dollars(s.evidence.cost_per_day_usd),
                ]
            })
            .collect();
        let header = [
            "ID",
            "TEMPLATE",
            "STATE",
            "OWNER",
            "RECOMMENDATION",
            "COST/DAY",
        ];
        out.push_str(&render_table(&header, &rows));
    }
    out
}
