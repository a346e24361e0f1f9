//! `steward e2b` actions on sandboxes: list, get, create, kill, pause, resume, connect, timeout,
//! refresh, logs, metrics and metrics-many.
//!
//! `kill` is confirmed in `super::execute` before this module is called, so it only sends.
use std::collections::{BTreeMap, HashSet};
use std::io::IsTerminal;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::output::{Output, Subject, format_duration, print_json, time, unix_time, warn_stopped};
use super::{ago, parse_cursor, parse_dur, parse_pair};
use crate::cli::table::{LastColumn, print_table};
use crate::e2b::{
    E2bClient, ListQuery, ListedSandbox, LogLevel, LogsDirection, LogsQuery, NewSandbox,
    SandboxMetric, SandboxState, StateFilter,
};
use crate::ids::{SandboxId, TemplateId};
use crate::runs::engine::{PURPOSE_METADATA_KEY, RUN_PURPOSE, describe_run_sandbox};

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum StateArg {
    /// Only running sandboxes.
    Running,
    /// Only paused sandboxes.
    Paused,
    /// Running and paused sandboxes.
    All,
}

/// Caps a listing that might not end (help text shared by every listing action).
const MAX_PAGES_HELP: &str = "Stop the listing after N pages (default 10000)";

#[derive(Debug, clap::Subcommand)]
pub enum SandboxAction {
    /// List sandboxes (running and paused by default).
    List {
        /// Which sandboxes to list.
        #[arg(long, value_enum, default_value = "all")]
        state: StateArg,
        /// Only sandboxes of this template id or alias.
        #[arg(long)]
        template: Option<String>,
        /// Only sandboxes whose metadata has KEY=VALUE (repeat to require several).
        #[arg(long, value_name = "KEY=VALUE", value_parser = parse_pair)]
        metadata: Vec<(String, String)>,
        /// Only the sandboxes Steward created for runs and push tests, each with its run.
        #[arg(long)]
        steward: bool,
        /// Page size, 1 to 100.
        #[arg(long)]
        limit: Option<u32>,
        /// Follow every page (`--all-pages false` fetches one page).
        #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
        all_pages: bool,
        /// Fetch the one page that starts at this token.
        #[arg(long)]
        page_token: Option<String>,
        #[arg(long, value_name = "N", help = MAX_PAGES_HELP)]
        max_pages: Option<u32>,
    },
    /// Show one sandbox, running or paused.
    Get {
        /// The sandbox id.
        id: SandboxId,
    },
    /// Create a sandbox from a template (or snapshot) id.
    Create {
        /// The template id or alias (or a snapshot id) to start from.
        template: TemplateId,
        /// Time to live, e.g. 5m (default 5m).
        #[arg(long, value_parser = parse_dur)]
        timeout: Option<Duration>,
        /// Metadata to attach, KEY=VALUE (repeat for several).
        #[arg(long, value_name = "KEY=VALUE", value_parser = parse_pair)]
        metadata: Vec<(String, String)>,
    },
    /// Kill a sandbox (running or paused). Cannot be undone.
    Kill {
        /// The sandbox id.
        id: SandboxId,
        /// Do not ask for confirmation.
        #[arg(long)]
        yes: bool,
    },
    /// Pause a running sandbox.
    Pause {
        /// The sandbox id.
        id: SandboxId,
    },
    /// Resume a paused sandbox (E2B prefers `connect`).
    Resume {
        /// The sandbox id.
        id: SandboxId,
        /// Time to live from now, e.g. 10m.
        #[arg(long, value_parser = parse_dur, default_value = "5m")]
        timeout: Duration,
    },
    /// Resume a paused sandbox, or extend a running one's time to live.
    Connect {
        /// The sandbox id.
        id: SandboxId,
        /// Time to live from now, e.g. 10m.
        #[arg(long, value_parser = parse_dur, default_value = "5m")]
        timeout: Duration,
    },
    /// Set a sandbox's time to live, counted from now (can shorten it).
    Timeout {
        /// The sandbox id.
        id: SandboxId,
        /// New time to live from now, e.g. 30m.
        #[arg(value_parser = parse_dur)]
        duration: Duration,
    },
    /// Extend a sandbox's time to live (at most 1h).
    Refresh {
        /// The sandbox id.
        id: SandboxId,
        /// How much longer, e.g. 30m (E2B's default when omitted).
        #[arg(value_parser = parse_dur)]
        duration: Option<Duration>,
    },
    /// Show a sandbox's logs (newest first unless --forward).
    Logs {
        /// The sandbox id.
        id: SandboxId,
        /// Minimum level: debug, info, warn, error.
        #[arg(long)]
        level: Option<LogLevel>,
        /// Case-sensitive substring of the message.
        #[arg(long)]
        search: Option<String>,
        /// At most this many lines.
        #[arg(long)]
        limit: Option<u32>,
        /// Milliseconds since 1970 or an RFC 3339 time.
        #[arg(long, value_parser = parse_cursor)]
        cursor: Option<DateTime<Utc>>,
        /// Oldest first, starting at the cursor.
        #[arg(long)]
        forward: bool,
        /// Print the messages byte for byte, escape sequences included. By default a terminal
        /// sees their control characters made visible (`^[` for ESC, as `cat -v` shows them);
        /// output to a pipe or file is always byte for byte.
        #[arg(long)]
        raw: bool,
    },
    /// Summarise a sandbox's resource samples (min, average, max); every sample with --all.
    Metrics {
        /// The sandbox id.
        id: SandboxId,
        /// Only the last DURATION, e.g. 2h.
        #[arg(long, value_name = "DURATION", value_parser = parse_dur)]
        since: Option<Duration>,
        /// Print every sample as a row, not only the summary.
        #[arg(long)]
        all: bool,
    },
    /// Show the latest sample of many sandboxes.
    MetricsMany {
        /// The sandbox ids.
        #[arg(required_unless_present = "all")]
        ids: Vec<SandboxId>,
        /// Every running sandbox.
        #[arg(long, conflicts_with = "ids")]
        all: bool,
        #[arg(long, value_name = "N", requires = "all", help = MAX_PAGES_HELP)]
        max_pages: Option<u32>,
    },
}

const SANDBOX_HEADERS: &[&str] = &[
    "SANDBOX", "STATE", "TEMPLATE", "STARTED", "END", "CPUS", "MEMORY", "METADATA",
];
/// How one listed sandbox becomes a table row.
type Row = fn(&ListedSandbox) -> Vec<String>;

/// `list --steward`: Steward's run sandboxes, each with what it is for instead of its metadata.
const STEWARD_HEADERS: &[&str] = &[
    "SANDBOX", "STATE", "TEMPLATE", "STARTED", "END", "CPUS", "MEMORY", "RUN",
];
const METRIC_HEADERS: &[&str] = &["CPUS", "CPU%", "MEMORY", "DISK"];

/// Runs one sandbox action.
pub(super) async fn run(
    action: SandboxAction,
    client: &E2bClient,
    out: &Output,
) -> anyhow::Result<()> {
    match action {
        SandboxAction::List {
            state,
            template,
            mut metadata,
            steward,
            limit,
            all_pages,
            page_token,
            max_pages,
        } => {
            let (headers, row): (&[&str], Row) = if steward {
                metadata.push((PURPOSE_METADATA_KEY.to_owned(), RUN_PURPOSE.to_owned()));
                (STEWARD_HEADERS, steward_row)
            } else {
                (SANDBOX_HEADERS, sandbox_row)
            };
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
                out.listing(&listing, headers, row)?;
            } else {
                let page = client
                    .list_sandboxes_page(&query, page_token.as_deref())
                    .await?;
                out.page(&page, headers, row)?;
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
            raw,
        } => {
            let q = LogsQuery {
                level,
                search,
                cursor,
                direction: forward.then_some(LogsDirection::Forward),
                limit,
            };
            let logs = client.sandbox_logs(&id, &q).await?;
            // A sandbox writes its own log messages: at a terminal, an escape sequence in one
            // could write the clipboard or clear the screen, so it is shown, not obeyed. A pipe
            // gets them exactly as E2B gave them, for the scripts that read them.
            let last = if raw || !std::io::stdout().is_terminal() {
                LastColumn::Raw
            } else {
                LastColumn::Visible
            };
            out.table_with(
                &logs,
                &["TIME", "LEVEL", "MESSAGE"],
                |l| {
                    vec![
                        time(l.timestamp),
                        l.level.as_str().into(),
                        l.message.clone(),
                    ]
                },
                last,
            )?;
        }
        SandboxAction::Metrics { id, since, all } => {
            let start = since.map(ago);
            let samples = client.sandbox_metrics(&id, start, None).await?;
            if out.json || all {
                let headers = [&["TIME"], METRIC_HEADERS].concat();
                out.table(&samples, &headers, |m| {
                    let mut row = vec![unix_time(m.timestamp_unix)];
                    row.extend(metric_cells(m));
                    row
                })?;
            } else {
                print_metrics_summary(&id, &samples);
            }
        }
        SandboxAction::MetricsMany {
            ids,
            all,
            max_pages,
        } => {
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
            // An id with no sample is either unknown to E2B or too new to have one; ask, so the
            // row says which.
            let mut unknown = HashSet::new();
            for id in ids.iter().filter(|id| !sorted.contains_key(*id)) {
                if let Err(crate::e2b::E2bError::NotFound { .. }) = client.get_sandbox(id).await {
                    unknown.insert(id.clone());
                }
            }
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
                            None if unknown.contains(id) => {
                                row.extend(["-", "-", "-", "not found"].map(String::from))
                            }
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

/// One line per resource: its minimum, average and maximum over the window, so an operator sees
/// at a glance whether the sandbox is busy, instead of hundreds of raw rows.
fn print_metrics_summary(id: &SandboxId, samples: &[SandboxMetric]) {
    let (Some(first), Some(last)) = (samples.first(), samples.last()) else {
        println!("No samples for {id} in this window.");
        return;
    };
    let (from, to) = (
        first.timestamp_unix.min(last.timestamp_unix),
        first.timestamp_unix.max(last.timestamp_unix),
    );
    let span = Duration::from_secs(u64::try_from(to - from).unwrap_or(0));
    if samples.len() == 1 {
        println!("1 sample, at {}.", unix_time(from));
    } else {
        println!(
            "{} samples from {} to {} ({}); --all prints every sample.",
            samples.len(),
            unix_time(from),
            unix_time(to),
            format_duration(span)
        );
    }
    let stats = |f: &dyn Fn(&SandboxMetric) -> f64| {
        let values: Vec<f64> = samples.iter().map(f).collect();
        let min = values.iter().copied().fold(f64::INFINITY, f64::min);
        let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let avg = values.iter().sum::<f64>() / values.len() as f64;
        (min, avg, max)
    };
    let (c_min, c_avg, c_max) = stats(&|m| m.cpu_used_pct);
    let (m_min, m_avg, m_max) = stats(&|m| m.mem_used as f64);
    let (d_min, d_avg, d_max) = stats(&|m| m.disk_used as f64);
    let rows = vec![
        vec![
            format!("CPU % ({} CPUs)", last.cpu_count),
            format!("{c_min:.1}"),
            format!("{c_avg:.1}"),
            format!("{c_max:.1}"),
        ],
        vec![
            format!("memory (of {})", bytes(last.mem_total)),
            bytes(m_min as i64),
            bytes(m_avg as i64),
            bytes(m_max as i64),
        ],
        vec![
            format!("disk (of {})", bytes(last.disk_total)),
            bytes(d_min as i64),
            bytes(d_avg as i64),
            bytes(d_max as i64),
        ],
    ];
    print_table(&["", "MIN", "AVG", "MAX"], rows);
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

fn steward_row(s: &ListedSandbox) -> Vec<String> {
    let mut row = sandbox_row(s);
    row.pop();
    row.push(describe_run_sandbox(&s.metadata).unwrap_or_else(|| "-".into()));
    row
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
