//! `steward e2b team-metrics`: the team's concurrency and start rate over a window, or their maximum.
use std::time::Duration;

use super::output::{Output, unix_time};
use super::{ago, parse_dur};
use crate::e2b::{E2bClient, TeamMaxMetric};

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum MaxArg {
    /// Most sandboxes running at once.
    Concurrent,
    /// Highest sandbox start rate (per second).
    StartRate,
}

#[derive(Debug, clap::Subcommand)]
pub enum TeamAction {
    /// Show team-wide metrics (needs E2B_PROJECT_ID).
    TeamMetrics {
        /// The window: the last DURATION, e.g. 1h or 7d.
        #[arg(long, value_name = "DURATION", value_parser = parse_dur, default_value = "24h")]
        since: Duration,
        /// Only the maximum of one metric.
        #[arg(long, value_enum)]
        max: Option<MaxArg>,
    },
}

/// Runs one team action.
pub(super) async fn run(
    action: TeamAction,
    client: &E2bClient,
    out: &Output,
) -> anyhow::Result<()> {
    let TeamAction::TeamMetrics { since, max } = action;
    let start = Some(ago(since));
    match max {
        Some(which) => {
            let metric = match which {
                MaxArg::Concurrent => TeamMaxMetric::ConcurrentSandboxes,
                MaxArg::StartRate => TeamMaxMetric::SandboxStartRate,
            };
            let m = client.team_metrics_max(metric, start, None).await?;
            out.show(&m, || {
                vec![
                    ("metric", metric.as_str().to_owned()),
                    ("maximum", format!("{}", m.value)),
                    ("at", unix_time(m.timestamp_unix)),
                ]
            })
        }
        None => {
            let samples = client.team_metrics(start, None).await?;
            out.table(&samples, &["TIME", "CONCURRENT", "STARTS/S"], |m| {
                vec![
                    unix_time(m.timestamp_unix),
                    m.concurrent_sandboxes.to_string(),
                    format!("{:.3}", m.sandbox_start_rate),
                ]
            })
        }
    }
}
