//! `steward e2b <action>`: every E2B control-plane action from the terminal.
//!
//! Output is an aligned table by default and the model types as JSON with `--json`. Failures print
//! as one plain sentence and exit with status 1. `kill` and `delete-template` cannot be undone, so
//! without `--yes` they make the person at the terminal type the id back; with no terminal they
//! refuse and send nothing.
//!
//! This module parses arguments and renders results; it must not talk HTTP itself (that is
//! `crate::e2b`) and must not print secrets (the model types never serialize access tokens).
use std::collections::BTreeMap;
use std::io::{BufRead, IsTerminal, Write};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::config::ProcessEnv;
use crate::duration::parse as parse_duration;
use crate::e2b::{
    E2bClient, ListQuery, Listing, LogLevel, LogsDirection, LogsQuery, NewSandbox, Page,
    SandboxMetric, StateFilter, TeamMaxMetric,
};
use crate::ids::{SandboxId, TemplateId};

#[derive(Debug, clap::Args)]
pub struct E2bArgs {
    /// Print JSON (the API's own field names) instead of tables.
    #[arg(long, global = true)]
    pub json: bool,
    /// Stop any listing after this many pages (default 10000).
    #[arg(long, global = true, value_name = "N")]
    pub max_pages: Option<u32>,
    #[command(subcommand)]
    pub action: Action,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum StateArg {
    Running,
    Paused,
    All,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum MaxArg {
    /// Most sandboxes running at once.
    Concurrent,
    /// Highest sandbox start rate (per second).
    StartRate,
}

#[derive(Debug, clap::Subcommand)]
pub enum Action {
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
    /// Show team-wide metrics (needs E2B_PROJECT_ID).
    TeamMetrics {
        #[arg(long, value_parser = parse_dur, default_value = "24h")]
        since: Duration,
        /// Only the maximum of one metric.
        #[arg(long, value_enum)]
        max: Option<MaxArg>,
    },
    /// Snapshot a sandbox into a reusable template.
    Snapshot {
        id: SandboxId,
        #[arg(long)]
        name: Option<String>,
    },
    /// List snapshots.
    Snapshots {
        /// Only snapshots of this sandbox.
        #[arg(long)]
        sandbox: Option<SandboxId>,
    },
    /// List templates.
    Templates,
    /// Show a template and its builds.
    Template { id: TemplateId },
    /// Delete a template or snapshot. Cannot be undone.
    DeleteTemplate {
        id: TemplateId,
        #[arg(long)]
        yes: bool,
    },
}

fn parse_dur(value: &str) -> Result<Duration, String> {
    parse_duration("duration", value).map_err(|e| e.to_string())
}

fn parse_pair(value: &str) -> Result<(String, String), String> {
    match value.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_owned(), v.to_owned())),
        _ => Err(format!("{value:?} is not KEY=VALUE")),
    }
}

fn parse_cursor(value: &str) -> Result<DateTime<Utc>, String> {
    if let Ok(ms) = value.trim().parse::<i64>() {
        return DateTime::from_timestamp_millis(ms).ok_or_else(|| format!("{ms} is out of range"));
    }
    DateTime::parse_from_rfc3339(value.trim())
        .map(|t| t.with_timezone(&Utc))
        .map_err(|_| format!("{value:?} is neither milliseconds since 1970 nor an RFC 3339 time"))
}

/// Runs one action. Every failure prints as a sentence on stderr and exits 1.
pub async fn run(args: E2bArgs) -> anyhow::Result<ExitCode> {
    match execute(args).await {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(e) => {
            eprintln!("{e:#}");
            Ok(ExitCode::from(1))
        }
    }
}

async fn execute(args: E2bArgs) -> anyhow::Result<()> {
    // Irreversible actions are confirmed before anything else, so a refusal sends nothing.
    match &args.action {
        Action::Kill { id, yes } => confirm("kill sandbox", id.as_str(), *yes)?,
        Action::DeleteTemplate { id, yes } => confirm("delete template", id.as_str(), *yes)?,
        _ => {}
    }
    let settings = crate::config::e2b_settings(&ProcessEnv)?;
    let mut client = E2bClient::new(&settings)?;
    if let Some(pages) = args.max_pages {
        client = client.with_max_pages(pages);
    }
    let out = Output { json: args.json };
    match args.action {
        Action::List {
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
                max_pages: args.max_pages,
                ..ListQuery::default()
            };
            if all_pages && page_token.is_none() {
                let listing = client.list_sandboxes(&query).await?;
                out.listing(&listing, sandbox_table)?;
            } else {
                let page = client
                    .list_sandboxes_page(&query, page_token.as_deref())
                    .await?;
                out.page(&page, &sandbox_table)?;
            }
        }
        Action::Get { id } => {
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
        Action::Create {
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
        Action::Kill { id, .. } => {
            client.kill_sandbox(&id).await?;
            out.done(
                "kill",
                "sandboxID",
                id.as_str(),
                &format!("Killed sandbox {id}."),
            )?;
        }
        Action::Pause { id } => {
            client.pause_sandbox(&id).await?;
            out.done(
                "pause",
                "sandboxID",
                id.as_str(),
                &format!("Paused sandbox {id}."),
            )?;
        }
        Action::Resume { id, timeout } => {
            let s = client.resume_sandbox(&id, timeout).await?;
            out.show(&s, || {
                vec![
                    ("sandbox", s.sandbox_id.to_string()),
                    ("resumed", "yes".into()),
                    ("time to live", format_duration(timeout)),
                ]
            })?;
        }
        Action::Connect { id, timeout } => {
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
        Action::Timeout { id, duration } => {
            client.set_timeout(&id, duration).await?;
            let text = format!(
                "Sandbox {id} now expires {} from now.",
                format_duration(duration)
            );
            out.done("timeout", "sandboxID", id.as_str(), &text)?;
        }
        Action::Refresh { id, duration } => {
            client.refresh_sandbox(&id, duration).await?;
            let text = match duration {
                Some(d) => format!("Refreshed sandbox {id} for {}.", format_duration(d)),
                None => format!("Refreshed sandbox {id}."),
            };
            out.done("refresh", "sandboxID", id.as_str(), &text)?;
        }
        Action::Logs {
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
        Action::Metrics { id, since } => {
            let start = since.map(ago);
            let samples = client.sandbox_metrics(&id, start, None).await?;
            out.table(&samples, &["TIME", "CPUS", "CPU%", "MEMORY", "DISK"], |m| {
                let mut row = vec![unix_time(m.timestamp_unix)];
                row.extend(metric_cells(m));
                row
            })?;
        }
        Action::MetricsMany { ids, all } => {
            let ids = if all {
                let query = ListQuery {
                    state: StateFilter::Running,
                    max_pages: args.max_pages,
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
                let mut rows = Vec::new();
                let mut seen = std::collections::HashSet::new();
                for id in ids.iter().filter(|id| seen.insert(*id)) {
                    let mut row = vec![id.to_string()];
                    match sorted.get(id) {
                        Some(m) => row.extend(metric_cells(m)),
                        None => row.extend(["-", "-", "-", "no samples yet"].map(String::from)),
                    }
                    rows.push(row);
                }
                print_table(&["SANDBOX", "CPUS", "CPU%", "MEMORY", "DISK"], rows);
            }
        }
        Action::TeamMetrics { since, max } => {
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
                    })?;
                }
                None => {
                    let samples = client.team_metrics(start, None).await?;
                    out.table(&samples, &["TIME", "CONCURRENT", "STARTS/S"], |m| {
                        vec![
                            unix_time(m.timestamp_unix),
                            m.concurrent_sandboxes.to_string(),
                            format!("{:.3}", m.sandbox_start_rate),
                        ]
                    })?;
                }
            }
        }
        Action::Snapshot { id, name } => {
            let snap = client.create_snapshot(&id, name.as_deref()).await?;
            out.show(&snap, || {
                vec![
                    ("snapshot", snap.snapshot_id.to_string()),
                    ("names", snap.names.join(", ")),
                ]
            })?;
        }
        Action::Snapshots { sandbox } => {
            let listing = client.list_snapshots(sandbox.as_ref()).await?;
            out.listing(&listing, |items| {
                let rows = items
                    .iter()
                    .map(|s| vec![s.snapshot_id.to_string(), s.names.join(", ")])
                    .collect();
                (vec!["SNAPSHOT", "NAMES"], rows)
            })?;
        }
        Action::Templates => {
            let listing = client.list_templates().await?;
            out.listing(&listing, |items| {
                let rows = items
                    .iter()
                    .map(|t| {
                        vec![
                            t.template_id.to_string(),
                            t.names.join(", "),
                            t.build_status.as_str().into(),
                            t.cpu_count.to_string(),
                            format!("{} MiB", t.memory_mb),
                            t.spawn_count.to_string(),
                            t.last_spawned_at
                                .map(time)
                                .unwrap_or_else(|| "never".into()),
                        ]
                    })
                    .collect();
                (
                    vec![
                        "TEMPLATE",
                        "NAMES",
                        "STATUS",
                        "CPUS",
                        "MEMORY",
                        "SPAWNS",
                        "LAST SPAWNED",
                    ],
                    rows,
                )
            })?;
        }
        Action::Template { id } => {
            let t = client.get_template(&id).await?;
            if out.json {
                print_json(&t)?;
            } else {
                print_pairs(&[
                    ("template", t.template_id.to_string()),
                    ("names", t.names.join(", ")),
                    ("public", t.public.to_string()),
                    ("created", time(t.created_at)),
                    ("spawns", t.spawn_count.to_string()),
                    ("builds", t.builds.len().to_string()),
                ]);
                println!();
                let rows = t
                    .builds
                    .iter()
                    .map(|b| {
                        vec![
                            b.build_id.to_string(),
                            b.status.as_str().into(),
                            time(b.created_at),
                            b.finished_at.map(time).unwrap_or_else(|| "-".into()),
                            b.cpu_count.to_string(),
                            format!("{} MiB", b.memory_mb),
                        ]
                    })
                    .collect();
                print_table(
                    &["BUILD", "STATUS", "CREATED", "FINISHED", "CPUS", "MEMORY"],
                    rows,
                );
            }
        }
        Action::DeleteTemplate { id, .. } => {
            client.delete_template(&id).await?;
            out.done(
                "delete-template",
                "templateID",
                id.as_str(),
                &format!("Deleted template {id}."),
            )?;
        }
    }
    Ok(())
}

/// Asks the person at the terminal to type `id` back; refuses when there is no terminal.
fn confirm(what: &str, id: &str, yes: bool) -> anyhow::Result<()> {
    if yes {
        return Ok(());
    }
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        bail!(
            "Refusing to {what} {id}: it cannot be undone, there is no terminal to confirm on, and --yes was not given. Nothing was sent."
        );
    }
    let mut err = std::io::stderr();
    write!(
        err,
        "This will {what} {id} and cannot be undone. Type the id to confirm: "
    )?;
    err.flush()?;
    let mut typed = String::new();
    stdin
        .lock()
        .read_line(&mut typed)
        .context("could not read the confirmation")?;
    if typed.trim() != id {
        return Err(anyhow!(
            "Not done: what you typed does not match {id}. Nothing was sent."
        ));
    }
    Ok(())
}

/// How results are printed.
struct Output {
    json: bool,
}

type TableFn<'a, T> = &'a dyn Fn(&[T]) -> (Vec<&'static str>, Vec<Vec<String>>);

impl Output {
    fn show<T: Serialize>(
        &self,
        value: &T,
        pairs: impl FnOnce() -> Vec<(&'static str, String)>,
    ) -> anyhow::Result<()> {
        if self.json {
            print_json(value)
        } else {
            print_pairs(&pairs());
            Ok(())
        }
    }

    fn table<T: Serialize>(
        &self,
        items: &[T],
        headers: &[&str],
        row: impl Fn(&T) -> Vec<String>,
    ) -> anyhow::Result<()> {
        if self.json {
            return print_json(&items);
        }
        print_table(headers, items.iter().map(row).collect());
        Ok(())
    }

    fn listing<T: Serialize>(
        &self,
        listing: &Listing<T>,
        table: impl Fn(&[T]) -> (Vec<&'static str>, Vec<Vec<String>>),
    ) -> anyhow::Result<()> {
        warn_stopped(listing);
        if self.json {
            return print_json(listing);
        }
        let (headers, rows) = table(&listing.items);
        print_table(&headers, rows);
        println!(
            "\n{} item(s) in {} page(s).",
            listing.items.len(),
            listing.pages
        );
        Ok(())
    }

    fn page<T: Serialize>(&self, page: &Page<T>, table: TableFn<'_, T>) -> anyhow::Result<()> {
        if self.json {
            return print_json(page);
        }
        let (headers, rows) = table(&page.items);
        print_table(&headers, rows);
        if let Some(total) = page.total_running {
            println!("\n{total} running in total.");
        }
        match &page.next_token {
            Some(token) => println!("More: --page-token {token}"),
            None => println!("This is the last page."),
        }
        Ok(())
    }

    /// An action with no body in its answer.
    fn done(&self, action: &str, key: &str, id: &str, text: &str) -> anyhow::Result<()> {
        if self.json {
            let mut obj = serde_json::Map::new();
            obj.insert("action".into(), action.into());
            obj.insert(key.into(), id.into());
            obj.insert("ok".into(), true.into());
            return print_json(&obj);
        }
        println!("{text}");
        Ok(())
    }
}

/// A stopped listing is partial; say so on stderr so it shows with `--json` too.
fn warn_stopped<T>(listing: &Listing<T>) {
    if let Some(reason) = listing.stopped {
        eprintln!(
            "Warning: {reason} ({} page(s), {} item(s) read).",
            listing.pages,
            listing.items.len()
        );
    }
}

fn sandbox_table(items: &[crate::e2b::ListedSandbox]) -> (Vec<&'static str>, Vec<Vec<String>>) {
    let rows = items
        .iter()
        .map(|s| {
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
        })
        .collect();
    (
        vec![
            "SANDBOX", "STATE", "TEMPLATE", "STARTED", "END", "CPUS", "MEMORY", "METADATA",
        ],
        rows,
    )
}

fn print_json<T: Serialize + ?Sized>(value: &T) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

fn print_pairs(pairs: &[(&str, String)]) {
    let width = pairs.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    for (k, v) in pairs {
        println!("{k:<width$}  {v}");
    }
}

/// Prints columns padded to their widest cell; the last column is not padded.
fn print_table(headers: &[&str], rows: Vec<Vec<String>>) {
    print!("{}", render_table(headers, &rows));
}

fn render_table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let line = |cells: Vec<&str>| {
        let last = cells.len().saturating_sub(1);
        let mut out = String::new();
        for (i, cell) in cells.into_iter().enumerate() {
            if i == last {
                out.push_str(cell);
            } else {
                let pad = widths[i] - cell.chars().count();
                out.push_str(cell);
                out.push_str(&" ".repeat(pad + 2));
            }
        }
        out.trim_end().to_owned() + "\n"
    };
    let mut out = line(headers.to_vec());
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    if rows.is_empty() {
        out.push_str("(none)\n");
    }
    out
}

fn time(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%SZ").to_string()
}

fn unix_time(secs: i64) -> String {
    DateTime::from_timestamp(secs, 0)
        .map(time)
        .unwrap_or_else(|| secs.to_string())
}

fn ago(d: Duration) -> DateTime<Utc> {
    Utc::now() - chrono::Duration::from_std(d).unwrap_or(chrono::Duration::zero())
}

fn end_label(state: crate::e2b::SandboxState) -> &'static str {
    match state {
        crate::e2b::SandboxState::Running => "expires",
        crate::e2b::SandboxState::Paused => "paused at",
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

fn format_duration(d: Duration) -> String {
    humantime::format_duration(Duration::from_secs(d.as_secs())).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Wrapper {
        #[command(flatten)]
        args: E2bArgs,
    }

    fn parse(argv: &[&str]) -> Result<E2bArgs, clap::Error> {
        let mut full = vec!["steward"];
        full.extend_from_slice(argv);
        Wrapper::try_parse_from(full).map(|w| w.args)
    }

    #[test]
    fn tables_align_columns_and_leave_the_last_one_ragged() {
        let out = render_table(
            &["ID", "STATE", "NOTE"],
            &[
                vec!["a".into(), "running".into(), "x".into()],
                vec!["bbbb".into(), "paused".into(), "long note".into()],
            ],
        );
        assert_eq!(
            out,
            "ID    STATE    NOTE\na     running  x\nbbbb  paused   long note\n"
        );
        assert_eq!(render_table(&["ID"], &[]), "ID\n(none)\n");
    }

    #[test]
    fn list_flags_parse_with_repeated_metadata_and_global_json() {
        let args = parse(&[
            "list",
            "--state",
            "paused",
            "--metadata",
            "user=abc",
            "--metadata",
            "app=a=b",
            "--json",
            "--all-pages",
            "false",
        ])
        .unwrap();
        assert!(args.json);
        let Action::List {
            metadata,
            all_pages,
            ..
        } = args.action
        else {
            panic!("expected list");
        };
        assert_eq!(
            metadata,
            vec![("user".into(), "abc".into()), ("app".into(), "a=b".into())]
        );
        assert!(!all_pages);
    }

    #[test]
    fn bad_ids_durations_and_pairs_are_refused_by_the_parser() {
        assert!(parse(&["get", "a/b"]).is_err());
        assert!(parse(&["timeout", "sbx1", "soon"]).is_err());
        assert!(parse(&["list", "--metadata", "novalue"]).is_err());
        assert!(parse(&["metrics-many"]).is_err());
        assert!(parse(&["metrics-many", "--all"]).is_ok());
    }

    #[test]
    fn log_cursors_accept_milliseconds_or_rfc3339() {
        assert_eq!(
            parse_cursor("1700000000000").unwrap(),
            DateTime::from_timestamp(1_700_000_000, 0).unwrap()
        );
        assert_eq!(
            parse_cursor("2023-11-14T22:13:20Z").unwrap(),
            DateTime::from_timestamp(1_700_000_000, 0).unwrap()
        );
        assert!(parse_cursor("yesterday").is_err());
    }
}
