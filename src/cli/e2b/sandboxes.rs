//! `steward e2b` actions on sandboxes: list, get, create, kill, pause, resume, connect, timeout,
//! refresh, logs, metrics and metrics-many.
//!
//! `kill` is confirmed in `super::execute` before this module is called, so it only sends.
use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::output::{Output, Subject, format_duration, print_json, time, unix_time, warn_stopped};
use super::{ago, parse_cursor, parse_dur, parse_pair};
use crate::cli::table::print_table;
use crate::e2b::{
    E2bClient, ListQuery, ListedSandbox, LogLevel, LogsDirection, LogsQuery, NewSandbox,
    SandboxMetric, SandboxState, StateFilter,
};
use crate::ids::{SandboxId, TemplateId};

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum StateArg {
    Running,
    Paused,
    All,
}

#[derive(Debug, clap::Subcommand)]
pub enum SandboxAction {
    /// List sandboxes (running and paused by default).
    List {
        #[arg(long, value_enum, default_value = "all")]
        state: StateArg,
        /// Only sandboxes of this template id or alias.
        #[arg(long)]
        template: Option<String>,
        /// Only sandboxes whose metadata has KEY=VALUE (repeat to require several).
        #[arg(long, value_name = "KEY=VALUE", value_parser = parse_pair)]
        metadata: Vec<(String, String)>,
        /// Page size, 1 to 100.
        #[arg(long)]
        limit: Option<u32>,
        /// Follow every page (`--all-pages false` fetches one page).
        #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
        all_pages: bool,
        /// Fetch the one page that starts at this token.
        #[arg(long)]
        page_token: Option<String>,
    },
    /// Show one sandbox, running or paused.
    Get { id: SandboxId },
    /// Create a sandbox from a template (or snapshot) id.
    Create {
        template: TemplateId,
        /// Time to live, e.g. 5m (default 5m).
        #[arg(long, value_parser = parse_dur)]
        timeout: Option<Duration>,
        #[arg(long, value_name = "KEY=VALUE", value_parser = parse_pair)]
        metadata: Vec<(String, String)>,
    },
    /// Kill a sandbox (running or paused). Cannot be undone.
    Kill {
        id: SandboxId,
        /// Do not ask for confirmation.
        #[arg(long)]
        yes: bool,
    },
    /// Pause a running sandbox.
    Pause { id: SandboxId },
    /// Resume a paused sandbox (E2B prefers `connect`).
    Resume {
        id: SandboxId,
        #[arg(long, value_parser = parse_dur, default_value = "5m")]
        timeout: Duration,
    },
    /// Resume a paused sandbox, or extend a running one's time to live.
    Connect {
        id: SandboxId,
        #[arg(long, value_parser = parse_dur, default_value = "5m")]
        timeout: Duration,
    },
    /// Set a sandbox's time to live, counted from now (can shorten it).
    Timeout {
        id: SandboxId,
        #[arg(value_parser = parse_dur)]
        duration: Duration,
    },
    /// Extend a sandbox's time to live (at most 1h).
    Refresh {
        id: SandboxId,
        #[arg(value_parser = parse_dur)]
        duration: Option<Duration>,
    },
    /// Show a sandbox's logs (newest first unless --forward).
    Logs {
        id: SandboxId,
        /// Minimum level: debug, info, warn, error.
        #[arg(long)]
        level: Option<LogLevel>,
        /// Case-sensitive substring of the message.
        #[arg(long)]
        search: Option<String>,
        #[arg(long)]
        limit: Option<u32>,
        /// Milliseconds since 1970 or an RFC 3339 time.
        #[arg(long, value_parser = parse_cursor)]
        cursor: Option<DateTime<Utc>>,
        /// Oldest first, starting at the cursor.
        #[arg(long)]
        forward: bool,
    },
    /// Show a sandbox's resource samples.
    Metrics {
        id: SandboxId,
        /// Only the last DURATION, e.g. 2h.
        #[arg(long, value_parser = parse_dur)]
        since: Option<Duration>,
    },
    /// Show the latest sample of many sandboxes.
    MetricsMany {
        #[arg(required_unless_present = "all")]
        ids: Vec<SandboxId>,
        /// Every running sandbox.
        #[arg(long, conflicts_with = "ids")]
        all: bool,
    },
}

const SANDBOX_HEADERS: &[&str] = &[
    "SANDBOX", "STATE", "TEMPLATE", "STARTED", "END", "CPUS", "MEMORY", "METADATA",
];
const METRIC_HEADERS: &[&str] = &["CPUS", "CPU%", "MEMORY", "DISK"];

/// Runs one sandbox action; `max_pages` caps the listings it follows.
pub(super) async fn run(
    action: SandboxAction,
    client: &E2bClient,
    out: &Output,
    max_pages: Option<u32>,
) -> anyhow::Result<()> {
    match action {
        SandboxAction::List {
            state,
            template,
            metadata,
            limit,
            all_pages,
            page_token,
        } => {
            let query = ListQuery {
                state: match state {
                    StateArg::Running => StateFilter::Running,
                    StateArg::Paused => StateFilter::Paused,
                    StateArg::All => StateFilter::Both,
                },
                metadata,
                template,
                limit,
                max_pages,
                ..ListQuery::default()
            };
            if all_pages && page_token.is_none() {
                let listing = client.list_sandboxes(&query).await?;
                out.listing(&listing, SANDBOX_HEADERS, sandbox_row)?;
            } else {
                let page = client
                    .list_sandboxes_page(&query, page_token.as_deref())
                    .await?;
                out.page(&page, SANDBOX_HEADERS, sandbox_row)?;
            }
        }
        SandboxAction::Get { id } => {
            let s = client.get_sandbox(&id).await?;
            out.show(&s, || {
                let mut rows = vec![
                    ("sandbox", s.sandbox_id.to_string()),
                    ("state", s.state.to_string()),
                    (
                        "template",
                        template_label(s.template_id.as_str(), s.alias.as_deref()),
                    ),
                    ("started", time(s.started_at)),
                    (end_label(s.state), time(s.end_at)),
                    ("cpus", s.cpu_count.to_string()),
                    ("memory", format!("{} MiB", s.memory_mb)),
                    ("disk", format!("{} MiB", s.disk_size_mb)),
                    ("envd", s.envd_version.clone()),
                    ("metadata", metadata(&s.metadata)),
                ];
                if let Some(l) = s.lifecycle {
                    rows.push((
                        "on timeout",
                        format!("{:?}, auto-resume {}", l.on_timeout, l.auto_resume).to_lowercase(),
                    ));
                }
                if let Some(net) = s.allow_internet_access {
                    rows.push(("internet", if net { "allowed" } else { "blocked" }.into()));
                }
                rows
            })?;
        }
        SandboxAction::Create {
            template,
            timeout,
            metadata: pairs,
        } => {
            let mut req = NewSandbox::new(template);
            req.timeout = timeout;
            req.metadata = pairs.into_iter().collect();
            let s = client.create_sandbox(&req).await?;
            out.show(&s, || {
                vec![
                    ("sandbox", s.sandbox_id.to_string()),
                    (
                        "template",
                        template_label(s.template_id.as_str(), s.alias.as_deref()),
                    ),
                    ("envd", s.envd_version.clone()),
                    (
                        "domain",
                        s.domain.clone().unwrap_or_else(|| "default".into()),
                    ),
                    ("time to live", format_duration(req.effective_timeout())),
                ]
            })?;
        }
        SandboxAction::Kill { id, .. } => {
            client.kill_sandbox(&id).await?;
            let text = format!("Killed sandbox {id}.");
            out.done("kill", Subject::Sandbox(&id), &text)?;
        }
        SandboxAction::Pause { id } => {
            client.pause_sandbox(&id).await?;
            let text = format!("Paused sandbox {id}.");
            out.done("pause", Subject::Sandbox(&id), &text)?;
        }
        SandboxAction::Resume { id, timeout } => {
            let s = client.resume_sandbox(&id, timeout).await?;
            out.show(&s, || {
                vec![
                    ("sandbox", s.sandbox_id.to_string()),
                    ("resumed", "yes".into()),
                    ("time to live", format_duration(timeout)),
                ]
            })?;
        }
        SandboxAction::Connect { id, timeout } => {
            let c = client.connect_sandbox(&id, timeout).await?;
            out.show(&c, || {
                vec![
                    ("sandbox", c.sandbox.sandbox_id.to_string()),
                    (
                        "resumed",
                        if c.resumed {
                            "yes (it was paused)"
                        } else {
                            "no (it was running)"
                        }
                        .into(),
                    ),
                    (
                        "time to live",
                        format!("at least {}", format_duration(timeout)),
                    ),
                ]
            })?;
        }
        SandboxAction::Timeout { id, duration } => {
            client.set_timeout(&id, duration).await?;
            let text = format!(
                "Sandbox {id} now expires {} from now.",
                format_duration(duration)
            );
            out.done("timeout", Subject::Sandbox(&id), &text)?;
        }
        SandboxAction::Refresh { id, duration } => {
            client.refresh_sandbox(&id, duration).await?;
            let text = match duration {
                Some(d) => format!("Refreshed sandbox {id} for {}.", format_duration(d)),
                None => format!("Refreshed sandbox {id}."),
            };
            out.done("refresh", Subject::Sandbox(&id), &text)?;
        }
        SandboxAction::Logs {
            id,
            level,
            search,
            limit,
            cursor,
            forward,
        } => {
            let q = LogsQuery {
                level,
                search,
                cursor,
                direction: forward.then_some(LogsDirection::Forward),
                limit,
            };
            let logs = client.sandbox_logs(&id, &q).await?;
            out.table(&logs, &["TIME", "LEVEL", "MESSAGE"], |l| {
                vec![
                    time(l.timestamp),
                    l.level.as_str().into(),
                    l.message.clone(),
                ]
            })?;
        }
        SandboxAction::Metrics { id, since } => {
            let start = since.map(ago);
            let samples = client.sandbox_metrics(&id, start, None).await?;
            let headers = [&["TIME"], METRIC_HEADERS].concat();
            out.table(&samples, &headers, |m| {
                let mut row = vec![unix_time(m.timestamp_unix)];
                row.extend(metric_cells(m));
                row
            })?;
        }
        SandboxAction::MetricsMany { ids, all } => {
            let ids = if all {
                let query = ListQuery {
                    state: StateFilter::Running,
                    max_pages,
                    ..ListQuery::default()
                };
                let listing = client.list_sandboxes(&query).await?;
                warn_stopped(&listing);
                listing.items.into_iter().map(|s| s.sandbox_id).collect()
            } else {
                ids
            };
            let found = client.metrics_many(&ids).await?;
            let sorted: BTreeMap<_, _> = found.into_iter().collect();
            if out.json {
                print_json(&sorted)?;
            } else {
                // One row per id asked for, in the order asked, including those with no sample yet.
                let mut seen = HashSet::new();
                let rows = ids
                    .iter()
                    .filter(|id| seen.insert(*id))
                    .map(|id| {
                        let mut row = vec![id.to_string()];
                        match sorted.get(id) {
                            Some(m) => row.extend(metric_cells(m)),
                            None => row.extend(["-", "-", "-", "no samples yet"].map(String::from)),
                        }
                        row
                    })
                    .collect();
                print_table(&[&["SANDBOX"], METRIC_HEADERS].concat(), rows);
            }
        }
    }
    Ok(())
}

fn sandbox_row(s: &ListedSandbox) -> Vec<String> {
    vec![
        s.sandbox_id.to_string(),
        s.state.to_string(),
        template_label(s.template_id.as_str(), s.alias.as_deref()),
        time(s.started_at),
        format!("{} {}", end_label(s.state), time(s.end_at)),
        s.cpu_count.to_string(),
        format!("{} MiB", s.memory_mb),
        metadata(&s.metadata),
    ]
}

/// What a sandbox's end time means: when it expires, or when it was paused.
fn end_label(state: SandboxState) -> &'static str {
    match state {
        SandboxState::Running => "expires",
        SandboxState::Paused => "paused at",
    }
}

fn template_label(id: &str, alias: Option<&str>) -> String {
    match alias {
        Some(alias) if alias != id => format!("{alias} ({id})"),
        _ => id.to_owned(),
    }
}

fn metadata(map: &BTreeMap<String, String>) -> String {
    if map.is_empty() {
        return "-".into();
    }
    map.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The cells under [`METRIC_HEADERS`].
fn metric_cells(m: &SandboxMetric) -> Vec<String> {
    vec![
        m.cpu_count.to_string(),
        format!("{:.1}", m.cpu_used_pct),
        format!("{} / {}", bytes(m.mem_used), bytes(m.mem_total)),
        format!("{} / {}", bytes(m.disk_used), bytes(m.disk_total)),
    ]
}

fn bytes(n: i64) -> String {
    const MIB: f64 = 1024.0 * 1024.0;
    let mib = n.max(0) as f64 / MIB;
    if mib >= 1024.0 {
        format!("{:.1} GiB", mib / 1024.0)
    } else {
        format!("{mib:.0} MiB")
    }
}
