//! Runs a parsed `/sandbox` command against E2B and turns the outcome into a [`Message`].
//!
//! This is where E2B results become tables, sparklines and sentences, and where every
//! [`E2bError`] becomes a plain sentence a Slack user can act on (never raw JSON or debug
//! output). It must not talk to Slack: the HTTP handlers deliver what it returns.
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::e2b::{
    self, E2bClient, E2bError, ListQuery, LogsDirection, LogsQuery, SandboxState, TeamMaxMetric,
};
use crate::ids::{SandboxId, TemplateId};

use crate::slack::command::{LevelFilter, ListArgs, ListState, LogsArgs, SandboxCommand};
use crate::slack::format::{
    self, ByteUnit, SECTION_TEXT_MAX_CHARS, human_bytes, human_duration, when,
};
use crate::slack::payload::{LIST_NEXT_PAGE, ListCursor};
use crate::slack::render::*;

/// Sandboxes per `/sandbox list` page.
pub const LIST_PAGE_SIZE: u32 = 20;
/// Log lines fetched when the user gives no `limit`.
pub const DEFAULT_LOG_LIMIT: u32 = 50;
/// Code-block sections a logs message may use (each ≤ 3000 characters, far below 50 blocks).
pub const MAX_LOG_SECTIONS: usize = 5;
/// A running sandbox whose latest CPU sample is below this is shown as idle in `list`.
pub const IDLE_CPU_PCT: f64 = 5.0;
const MIB: u64 = 1024 * 1024;
/// Width of metric sparklines, in characters.
const SPARKLINE_WIDTH: usize = 40;
/// Longest table cell before it is cut.
const MAX_CELL_CHARS: usize = 28;
/// Widest cell of `/sandbox list steward`, whose run column names a run id and its requester.
const RUN_CELL_CHARS: usize = 80;

/// What a command needs to run.
pub struct Context<'a> {
    /// `None` when `E2B_API_KEY` is not set.
    pub e2b: Option<&'a E2bClient>,
    pub templates: &'a Templates,
    pub now: DateTime<Utc>,
}

impl Context<'_> {
    fn e2b(&self) -> Result<&E2bClient, E2bError> {
        self.e2b
            .ok_or(E2bError::NotConfigured("E2B_API_KEY is not set"))
    }

    fn failure(&self, sentence: String) -> Message {
        self.templates.render_or_plain(&FailureParams { sentence })
    }

    fn done(&self, headline: String, details: Option<String>) -> Message {
        self.templates
            .render_or_plain(&DoneParams { headline, details })
    }
}

/// Runs `command`; `args_text` is the text the user typed (carried in "Next page" buttons).
pub async fn run(ctx: &Context<'_>, command: &SandboxCommand, args_text: &str) -> Message {
    let result = match command {
        SandboxCommand::List(args) => list_page(ctx, args, args_text, None, 1).await,
        SandboxCommand::Get { id } => get(ctx, id).await,
        SandboxCommand::Logs(args) => logs(ctx, args).await,
        SandboxCommand::Metrics { id, since } => metrics(ctx, id, *since).await,
        SandboxCommand::Team { since } => team(ctx, *since).await,
        SandboxCommand::Pause { id } => pause(ctx, id).await,
        SandboxCommand::Snapshot { id, name } => snapshot(ctx, id, name.as_deref()).await,
        SandboxCommand::Snapshots { sandbox } => snapshots(ctx, sandbox.as_ref()).await,
        SandboxCommand::Templates => templates(ctx).await,
        SandboxCommand::Template { id } => template(ctx, id).await,
        // The HTTP handler answers these inline; reaching here is a wiring mistake, so say
        // something sensible rather than nothing.
        SandboxCommand::Help
        | SandboxCommand::Invalid { .. }
        | SandboxCommand::Kill { .. }
        | SandboxCommand::DeleteTemplate { .. }
        | SandboxCommand::History { .. }
        | SandboxCommand::Sweep { .. } => {
            return ctx.failure("That command is answered directly, not through E2B.".into());
        }
        // A timeout may end a sandbox: `approvals::lifetime` checks it against the floor and
        // calls `set_timeout` / `resume` itself. Running them here would be a side door.
        SandboxCommand::Resume { .. }
        | SandboxCommand::Timeout { .. }
        | SandboxCommand::Refresh { .. } => {
            return ctx.failure("That command goes through Steward's timeout check.".into());
        }
    };
    result.unwrap_or_else(|(subject, e)| ctx.failure(sentence(&subject, &e)))
}

/// An error together with what it was about ("Sandbox `i1`"), for the sentence.
pub type Reply = Result<Message, (String, E2bError)>;

fn about(subject: impl Into<String>) -> impl FnOnce(E2bError) -> (String, E2bError) {
    let subject = subject.into();
    move |e| (subject, e)
}

fn sandbox_subject(id: &SandboxId) -> String {
    format!("Sandbox `{id}`")
}

/// An [`E2bError`] as one sentence for Slack.
pub fn sentence(subject: &str, error: &E2bError) -> String {
    match error {
        E2bError::NotFound { .. } => format!("{subject} was not found."),
        E2bError::Conflict { message } => {
            format!(
                "E2B refused because of the current state of {}: {message}",
                lower_first(subject)
            )
        }
        E2bError::RateLimited {
            retry_after: Some(wait),
            ..
        } => format!(
            "E2B is rate-limiting us; try again in {} s.",
            wait.as_secs().max(1)
        ),
        E2bError::RateLimited {
            retry_after: None, ..
        } => "E2B is rate-limiting us; try again in a minute.".into(),
        E2bError::Unauthorized => {
            "E2B rejected Steward's API key; an operator needs to check E2B_API_KEY.".into()
        }
        E2bError::Forbidden { message } => format!("E2B refused access: {message}"),
        E2bError::BadRequest { message } => format!("E2B refused the request: {message}"),
        E2bError::Server { status, .. } => {
            format!("E2B had a problem on its side (HTTP {status}); try again in a minute.")
        }
        E2bError::Transport(detail) => {
            tracing::warn!(%detail, "E2B unreachable");
            "Steward could not reach E2B; try again in a minute.".into()
        }
        E2bError::Decode(detail) => {
            tracing::error!(%detail, "unreadable E2B response");
            "E2B sent an answer Steward could not read; an operator has been told in the logs."
                .into()
        }
        E2bError::NotConfigured(what) => {
            format!("Steward is not connected to E2B yet ({what}); an operator needs to set it up.")
        }
        E2bError::Incomplete(stop) => format!(
            "Steward could not read all of what E2B lists about {} ({stop}), so it changed nothing.",
            lower_first(subject)
        ),
        E2bError::TooLarge { .. } => {
            tracing::error!(error = %error, "E2B answer over the size cap");
            "E2B sent an answer too large to read; an operator has been told in the logs.".into()
        }
    }
}

fn lower_first(s: &str) -> String {
    let mut chars = s.chars();
    match chars.next() {
        Some(c) => c.to_lowercase().chain(chars).collect(),
        None => String::new(),
    }
}

fn since(now: DateTime<Utc>, t: DateTime<Utc>) -> Duration {
    (now - t).to_std().unwrap_or_default()
}

/// One page of `/sandbox list`, with CPU/memory/disk from one batched metrics call.
pub async fn list_page(
    ctx: &Context<'_>,
    args: &ListArgs,
    args_text: &str,
    token: Option<&str>,
    page: u32,
) -> Reply {
    let e2b = ctx.e2b().map_err(about("The sandbox list"))?;
    let mut metadata = args.metadata.clone();
    if args.steward {
        // Every sandbox Steward creates for a run (push tests included) is labelled so.
        metadata.push((
            crate::runs::engine::PURPOSE_METADATA_KEY.to_owned(),
            crate::runs::engine::RUN_PURPOSE.to_owned(),
        ));
    }
    let query = ListQuery {
        state: match args.state {
            ListState::Running => e2b::StateFilter::Running,
            ListState::Paused => e2b::StateFilter::Paused,
            ListState::All => e2b::StateFilter::Both,
        },
        metadata,
        template: args.template.clone(),
        limit: Some(LIST_PAGE_SIZE),
        ..ListQuery::default()
    };
    let listed = e2b
        .list_sandboxes_page(&query, token)
        .await
        .map_err(about("The sandbox list"))?;
    let running: Vec<SandboxId> = listed
        .items
        .iter()
        .filter(|s| s.state == SandboxState::Running)
        .map(|s| s.sandbox_id.clone())
        .collect();
    // Metrics decorate the table; without them the list is still worth showing.
    let metrics = if running.is_empty() {
        Default::default()
    } else {
        e2b.metrics_many(&running).await.unwrap_or_else(|e| {
            tracing::warn!(error = %e, "metrics for the list page failed");
            Default::default()
        })
    };
    // Every size in the table is written in one unit, named once in the header.
    let largest = listed
        .items
        .iter()
        .flat_map(|s| {
            let m = metrics.get(&s.sandbox_id);
            [
                m.map_or(0, |m| m.mem_total.max(0) as u64),
                m.map_or(0, |m| m.disk_total.max(0) as u64),
                u64::from(s.memory_mb) * MIB,
                u64::from(s.disk_size_mb) * MIB,
            ]
        })
        .max()
        .unwrap_or(0);
    let unit = ByteUnit::fitting(largest);
    let size = |bytes: i64| unit.number(bytes.max(0) as u64);
    let rows: Vec<Vec<String>> = listed
        .items
        .iter()
        .map(|s| {
            let m = metrics.get(&s.sandbox_id);
            let idle = match (s.state, m) {
                (SandboxState::Paused, _) => human_duration(since(ctx.now, s.end_at)),
                (SandboxState::Running, Some(m)) if m.cpu_used_pct < IDLE_CPU_PCT => {
                    "idle now".into()
                }
                (SandboxState::Running, Some(_)) => "busy".into(),
                (SandboxState::Running, None) => "-".into(),
            };
            let (cpu, mem, disk) = match m {
                Some(m) => (
                    format::percent(m.cpu_used_pct.round()),
                    format!("{} of {}", size(m.mem_used), size(m.mem_total)),
                    format!("{} of {}", size(m.disk_used), size(m.disk_total)),
                ),
                None => (
                    "-".into(),
                    size(i64::from(s.memory_mb) * MIB as i64),
                    size(i64::from(s.disk_size_mb) * MIB as i64),
                ),
            };
            let mut row = vec![
                s.sandbox_id.to_string(),
                s.alias.clone().unwrap_or_else(|| s.template_id.to_string()),
                s.state.to_string(),
                human_duration(since(ctx.now, s.started_at)),
                idle,
                cpu,
                mem,
                disk,
            ];
            if args.steward {
                row.push(
                    crate::runs::engine::describe_run_sandbox(&s.metadata)
                        .unwrap_or_else(|| "-".into()),
                );
            }
            row
        })
        .collect();
    let table = if rows.is_empty() {
        Vec::new()
    } else {
        let memory = format!("memory ({})", unit.name());
        let disk = format!("disk ({})", unit.name());
        let mut headers = vec![
            "id", "template", "state", "age", "idle for", "cpu", &memory, &disk,
        ];
        if args.steward {
            headers.push("run");
        }
        // A run id alone is 36 characters: Steward's own list keeps the run column whole.
        let max_cell = if args.steward {
            RUN_CELL_CHARS
        } else {
            MAX_CELL_CHARS
        };
        format::table(&headers, &rows, max_cell)
    };
    let next_page = listed.next_token.as_ref().and_then(|next| {
        ListCursor {
            args: args_text.to_owned(),
            next_token: next.clone(),
            page: page + 1,
        }
        .encode()
    });
    Ok(ctx.templates.render_or_plain(&SandboxListParams {
        filter: describe_list(args),
        shown: listed.items.len(),
        total_running: listed.total_running,
        page,
        table,
        next_page,
        next_page_action: LIST_NEXT_PAGE,
    }))
}

fn describe_list(args: &ListArgs) -> String {
    let mut parts = vec![match args.state {
        ListState::Running => "running".to_owned(),
        ListState::Paused => "paused".to_owned(),
        ListState::All => "running and paused".to_owned(),
    }];
    if args.steward {
        parts.push("Steward's runs and push tests".to_owned());
    }
    if let Some(t) = &args.template {
        parts.push(format!("template={t}"));
    }
    parts.extend(args.metadata.iter().map(|(k, v)| format!("{k}={v}")));
    parts.join(" · ")
}

async fn get(ctx: &Context<'_>, id: &SandboxId) -> Reply {
    let e2b = ctx.e2b().map_err(about(sandbox_subject(id)))?;
    let s = e2b
        .get_sandbox(id)
        .await
        .map_err(about(sandbox_subject(id)))?;
    let lifecycle = match s.lifecycle {
        Some(l) => format!(
            "on timeout: {} · auto-resume {}",
            match l.on_timeout {
                e2b::OnTimeout::Kill => "kill",
                e2b::OnTimeout::Pause => "pause",
            },
            if l.auto_resume { "on" } else { "off" }
        ),
        None => "not reported".into(),
    };
    let ends_in = (s.state == SandboxState::Running && s.end_at > ctx.now)
        .then(|| human_duration(since(s.end_at, ctx.now)));
    // A paused sandbox's `endAt` is when its last run ended, its pause, so the card says
    // "Paused … ago" rather than an end in the past. A pause time still ahead is not one E2B
    // could have reported, so it is not shown as one.
    let end_at = match s.state {
        SandboxState::Paused if s.end_at <= ctx.now => format!(
            "{} ({} ago)",
            when(s.end_at),
            human_duration(since(ctx.now, s.end_at))
        ),
        SandboxState::Paused => "not reported by E2B".to_owned(),
        _ => when(s.end_at),
    };
    Ok(ctx.templates.render_or_plain(&SandboxParams {
        id: s.sandbox_id.to_string(),
        state: s.state.to_string(),
        template: s.template_id.to_string(),
        alias: s.alias.clone(),
        cpu_count: s.cpu_count,
        memory: human_bytes(u64::from(s.memory_mb) * MIB),
        disk: (s.disk_size_mb > 0).then(|| human_bytes(u64::from(s.disk_size_mb) * MIB)),
        started_at: when(s.started_at),
        age: human_duration(since(ctx.now, s.started_at)),
        end_at,
        ends_in,
        lifecycle,
        metadata: s
            .metadata
            .iter()
            .map(|(k, v)| KeyValue {
                key: k.clone(),
                value: v.clone(),
            })
            .collect(),
    }))
}

async fn logs(ctx: &Context<'_>, args: &LogsArgs) -> Reply {
    let subject = sandbox_subject(&args.id);
    let e2b = ctx.e2b().map_err(about(subject.clone()))?;
    let query = LogsQuery {
        level: args.level.map(|l| match l {
            LevelFilter::Info => e2b::LogLevel::Info,
            LevelFilter::Warn => e2b::LogLevel::Warn,
            LevelFilter::Error => e2b::LogLevel::Error,
        }),
        search: args.search.clone(),
        direction: Some(LogsDirection::Backward),
        limit: Some(args.limit.unwrap_or(DEFAULT_LOG_LIMIT)),
        ..LogsQuery::default()
    };
    let mut entries = e2b
        .sandbox_logs(&args.id, &query)
        .await
        .map_err(about(subject))?;
    // Newest first, whatever order E2B used.
    entries.sort_by_key(|e| std::cmp::Reverse(e.timestamp));
    let lines: Vec<String> = entries
        .iter()
        .map(|e| {
            format::defuse_code_fence(&format!(
                "{} {:5} {}",
                e.timestamp.format("%m-%d %H:%M:%S"),
                e.level.as_str().to_uppercase(),
                e.message.replace('\n', " ")
            ))
        })
        .collect();
    let mut chunks = format::chunk_lines(&lines, SECTION_TEXT_MAX_CHARS - 100);
    let all_chunks = chunks.len();
    chunks.truncate(MAX_LOG_SECTIONS);
    let shown = chunks.iter().map(|c| c.lines().count()).sum();
    let mut filter = Vec::new();
    if let Some(level) = args.level {
        filter.push(format!("level ≥ {}", level.as_str()));
    }
    if let Some(search) = &args.search {
        filter.push(format!("search “{search}”"));
    }
    Ok(ctx.templates.render_or_plain(&SandboxLogsParams {
        id: args.id.to_string(),
        filter: (!filter.is_empty()).then(|| filter.join(" · ")),
        shown,
        total: entries.len(),
        truncated: all_chunks > MAX_LOG_SECTIONS || lines.iter().any(|l| l.contains('…')),
        chunks,
    }))
}

fn series(name: &str, values: &[f64], ceiling: f64, show: impl Fn(f64) -> String) -> SeriesParams {
    let (min, avg, max) = format::min_avg_max(values).unwrap_or((0.0, 0.0, 0.0));
    SeriesParams {
        name: name.into(),
        sparkline: format::sparkline(values, 0.0, ceiling, SPARKLINE_WIDTH),
        min: show(min),
        avg: show(avg),
        max: show(max),
    }
}

async fn metrics(ctx: &Context<'_>, id: &SandboxId, window: Duration) -> Reply {
    let subject = sandbox_subject(id);
    let e2b = ctx.e2b().map_err(about(subject.clone()))?;
    let start = ctx.now - chrono::Duration::from_std(window).unwrap_or_default();
    let mut points = e2b
        .sandbox_metrics(id, Some(start), Some(ctx.now))
        .await
        .map_err(about(subject))?;
    points.sort_by_key(|p| p.timestamp_unix);
    let pick = |f: &dyn Fn(&e2b::SandboxMetric) -> f64| points.iter().map(f).collect::<Vec<f64>>();
    let cpu = pick(&|p| p.cpu_used_pct);
    let mem = pick(&|p| p.mem_used as f64);
    let disk = pick(&|p| p.disk_used as f64);
    let mem_total = points.iter().map(|p| p.mem_total).max().unwrap_or(0) as f64;
    let disk_total = points.iter().map(|p| p.disk_total).max().unwrap_or(0) as f64;
    // One unit for both series and their totals, so the numbers compare at a glance.
    let unit = ByteUnit::fitting(mem_total.max(disk_total) as u64);
    let bytes = |v: f64| format!("{} {}", unit.number(v.max(0.0) as u64), unit.name());
    let series = if points.is_empty() {
        Vec::new()
    } else {
        vec![
            series("CPU", &cpu, 100.0, |v| format::percent(v.round())),
            series(
                &format!("Memory (of {})", bytes(mem_total)),
                &mem,
                mem_total,
                bytes,
            ),
            series(
                &format!("Disk (of {})", bytes(disk_total)),
                &disk,
                disk_total,
                bytes,
            ),
        ]
    };
    Ok(ctx.templates.render_or_plain(&SandboxMetricsParams {
        id: id.to_string(),
        window: human_duration(window),
        points: points.len(),
        series,
    }))
}

async fn team(ctx: &Context<'_>, window: Duration) -> Reply {
    let subject = "Team metrics";
    let e2b = ctx.e2b().map_err(about(subject))?;
    let start = ctx.now - chrono::Duration::from_std(window).unwrap_or_default();
    let mut points = e2b
        .team_metrics(Some(start), Some(ctx.now))
        .await
        .map_err(about(subject))?;
    points.sort_by_key(|p| p.timestamp_unix);
    let peak = e2b
        .team_metrics_max(
            TeamMaxMetric::ConcurrentSandboxes,
            Some(start),
            Some(ctx.now),
        )
        .await
        .map_err(about(subject))?;
    let peak_rate = e2b
        .team_metrics_max(TeamMaxMetric::SandboxStartRate, Some(start), Some(ctx.now))
        .await
        .map_err(about(subject))?;
    let concurrency: Vec<f64> = points
        .iter()
        .map(|p| f64::from(p.concurrent_sandboxes))
        .collect();
    // E2B averages each point over its step, and the step grows with the window (a day is
    // sampled far more coarsely than an hour), so a peak rate means nothing without its step:
    // a 1 h window can show a higher peak than the 24 h window around it. The reply names the
    // step, and gives the window's total starts, which agree across windows.
    let step_secs = match points.as_slice() {
        [a, b, ..] => (b.timestamp_unix - a.timestamp_unix).max(1) as f64,
        _ => window.as_secs().max(1) as f64,
    };
    let step = human_duration(Duration::from_secs(step_secs as u64));
    let starts: f64 = points
        .iter()
        .map(|p| p.sandbox_start_rate * step_secs)
        .sum();
    let starts = starts.round() as u64;
    // E2B reports start rates per second; people think in starts a minute, or an hour when
    // that is under one (not "0.01 a minute").
    let per_minute = |per_sec: f64| {
        if per_sec * 60.0 >= 1.0 {
            format!("{:.1} a minute", per_sec * 60.0)
        } else {
            format!("{:.1} an hour", per_sec * 3600.0)
        }
    };
    let avg_per_sec = starts as f64 / window.as_secs().max(1) as f64;
    let peak_at = peak
        .timestamp
        .or_else(|| DateTime::from_timestamp(peak.timestamp_unix, 0))
        .map(when);
    Ok(ctx.templates.render_or_plain(&TeamParams {
        capacity: CapacityParams {
            window: human_duration(window),
            concurrent_now: points
                .last()
                .map_or(0, |p| p.concurrent_sandboxes.max(0) as u64),
            concurrent_peak: peak.value.max(0.0).round() as u64,
            peak_at,
            start_rate: format!("{starts} ({} on average)", per_minute(avg_per_sec)),
            start_rate_peak: format!(
                "{} in the busiest {step} (E2B's step for this window)",
                per_minute(peak_rate.value)
            ),
        },
        sparkline: (!concurrency.is_empty())
            .then(|| format::sparkline(&concurrency, 0.0, 1.0, SPARKLINE_WIDTH)),
    }))
}

/// Fetches the sandbox to explain a 409: E2B refuses to pause a paused sandbox (and to resume
/// a running one), which for the user is simply "already done".
async fn current_state(ctx: &Context<'_>, id: &SandboxId) -> Option<SandboxState> {
    ctx.e2b
        .as_ref()?
        .get_sandbox(id)
        .await
        .ok()
        .map(|s| s.state)
}

async fn pause(ctx: &Context<'_>, id: &SandboxId) -> Reply {
    let subject = sandbox_subject(id);
    let e2b = ctx.e2b().map_err(about(subject.clone()))?;
    match e2b.pause_sandbox(id).await {
        Ok(()) => Ok(ctx.done(
            format!("Paused `{id}`."),
            Some(format!(
                "Its memory and files are kept; resume it with `/sandbox resume {id}`."
            )),
        )),
        Err(E2bError::Conflict { message }) => match current_state(ctx, id).await {
            Some(SandboxState::Paused) => Ok(ctx.done(format!("`{id}` is already paused."), None)),
            _ => Err((subject, E2bError::Conflict { message })),
        },
        Err(e) => Err((subject, e)),
    }
}

/// `resume`; the caller (`approvals::lifetime`) has checked the timeout against the floor.
pub async fn resume(ctx: &Context<'_>, id: &SandboxId, timeout: Option<Duration>) -> Reply {
    let subject = sandbox_subject(id);
    let e2b = ctx.e2b().map_err(about(subject.clone()))?;
    let timeout = timeout.unwrap_or(e2b::DEFAULT_SANDBOX_TIMEOUT);
    match e2b.resume_sandbox(id, timeout).await {
        Ok(_) => Ok(ctx.done(
            format!("Resumed `{id}`."),
            Some(format!(
                "It will run for {} unless refreshed.",
                human_duration(timeout)
            )),
        )),
        Err(E2bError::Conflict { message }) => match current_state(ctx, id).await {
            Some(SandboxState::Running) => {
                Ok(ctx.done(format!("`{id}` is already running."), None))
            }
            _ => Err((subject, E2bError::Conflict { message })),
        },
        Err(e) => Err((subject, e)),
    }
}

/// `timeout`; the caller (`approvals::lifetime`) has checked it against the floor.
pub async fn set_timeout(ctx: &Context<'_>, id: &SandboxId, duration: Duration) -> Reply {
    let subject = sandbox_subject(id);
    let e2b = ctx.e2b().map_err(about(subject.clone()))?;
    e2b.set_timeout(id, duration)
        .await
        .map_err(about(subject))?;
    let end = ctx.now + chrono::Duration::from_std(duration).unwrap_or_default();
    Ok(ctx.done(
        format!(
            "`{id}` will now end in {} (at {}).",
            human_duration(duration),
            when(end)
        ),
        None,
    ))
}

/// `refresh`: always allowed (it never ends a sandbox sooner); audited by `approvals::lifetime`.
pub async fn refresh(ctx: &Context<'_>, id: &SandboxId, duration: Duration) -> Reply {
    let subject = sandbox_subject(id);
    let e2b = ctx.e2b().map_err(about(subject.clone()))?;
    e2b.refresh_sandbox(id, Some(duration))
        .await
        .map_err(about(subject))?;
    Ok(ctx.done(
        format!(
            "Refreshed `{id}`: it stays alive for at least {} more.",
            human_duration(duration)
        ),
        None,
    ))
}

async fn snapshot(ctx: &Context<'_>, id: &SandboxId, name: Option<&str>) -> Reply {
    let subject = sandbox_subject(id);
    let e2b = ctx.e2b().map_err(about(subject.clone()))?;
    let snap = e2b
        .create_snapshot(id, name)
        .await
        .map_err(about(subject))?;
    let names = if snap.names.is_empty() {
        None
    } else {
        Some(format!("Names: {}", snap.names.join(", ")))
    };
    Ok(ctx.done(
        format!(
            "Snapshot `{}` of `{id}` is ready; new sandboxes can start from it.",
            snap.snapshot_id
        ),
        names,
    ))
}

async fn snapshots(ctx: &Context<'_>, sandbox: Option<&SandboxId>) -> Reply {
    let subject = sandbox.map_or_else(|| "The snapshot list".to_owned(), sandbox_subject);
    let e2b = ctx.e2b().map_err(about(subject.clone()))?;
    let listing = e2b.list_snapshots(sandbox).await.map_err(about(subject))?;
    let rows: Vec<Vec<String>> = listing
        .items
        .iter()
        .map(|s| {
            // An empty cell reads as a rendering fault; say there is no name.
            let names = if s.names.is_empty() {
                "(no name)".to_owned()
            } else {
                s.names.join(", ")
            };
            vec![s.snapshot_id.to_string(), names]
        })
        .collect();
    Ok(ctx.templates.render_or_plain(&SnapshotsParams {
        sandbox: sandbox.map(ToString::to_string),
        count: rows.len(),
        table: if rows.is_empty() {
            vec![]
        } else {
            format::table(&["snapshot", "names"], &rows, 60)
        },
    }))
}

async fn templates(ctx: &Context<'_>) -> Reply {
    let subject = "The template list";
    let e2b = ctx.e2b().map_err(about(subject))?;
    let listing = e2b.list_templates().await.map_err(about(subject))?;
    let unit = ByteUnit::fitting(
        listing
            .items
            .iter()
            .map(|t| u64::from(t.memory_mb) * MIB)
            .max()
            .unwrap_or(0),
    );
    let rows: Vec<Vec<String>> = listing
        .items
        .iter()
        .map(|t| {
            vec![
                t.template_id.to_string(),
                if t.aliases.is_empty() {
                    "-".into()
                } else {
                    t.aliases.join(", ")
                },
                t.build_status.as_str().into(),
                format!("{} vCPU", t.cpu_count),
                unit.number(u64::from(t.memory_mb) * MIB),
                t.spawn_count.to_string(),
            ]
        })
        .collect();
    Ok(ctx.templates.render_or_plain(&TemplatesParams {
        count: rows.len(),
        table: if rows.is_empty() {
            vec![]
        } else {
            let memory = format!("memory ({})", unit.name());
            format::table(
                &["id", "aliases", "build", "cpu", &memory, "spawns"],
                &rows,
                MAX_CELL_CHARS,
            )
        },
    }))
}

async fn template(ctx: &Context<'_>, id: &TemplateId) -> Reply {
    let subject = format!("Template `{id}`");
    let e2b = ctx.e2b().map_err(about(subject.clone()))?;
    let t = e2b.get_template(id).await.map_err(about(subject))?;
    let latest = t.builds.iter().max_by_key(|b| b.created_at);
    Ok(ctx.templates.render_or_plain(&TemplateParams {
        id: t.template_id.to_string(),
        aliases: (!t.aliases.is_empty()).then(|| t.aliases.join(", ")),
        public: if t.public { "yes" } else { "no" }.into(),
        cpu_count: latest.map_or(0, |b| b.cpu_count),
        memory: latest.map_or_else(|| "-".into(), |b| human_bytes(u64::from(b.memory_mb) * MIB)),
        disk: latest
            .and_then(|b| b.disk_size_mb)
            .map(|mb| human_bytes(u64::from(mb) * MIB)),
        build_status: latest.map_or_else(
            || "no builds".into(),
            |b| {
                format!(
                    "{} ({})",
                    b.status.as_str(),
                    format::count(t.builds.len() as u64, "build", "builds")
                )
            },
        ),
        created_at: when(t.created_at),
        spawn_count: t.spawn_count.max(0) as u64,
        last_spawned_at: t.last_spawned_at.map(when),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e2b_errors_read_as_plain_sentences() {
        let s = |e: E2bError| sentence("Sandbox `i123`", &e);
        assert_eq!(
            s(E2bError::NotFound {
                message: "{\"code\":404}".into()
            }),
            "Sandbox `i123` was not found."
        );
        assert_eq!(
            s(E2bError::RateLimited {
                retry_after: Some(Duration::from_secs(4)),
                message: "slow".into()
            }),
            "E2B is rate-limiting us; try again in 4 s."
        );
        assert!(
            s(E2bError::Server {
                status: 502,
                message: "<html>".into(),
                error_code: None
            })
            .contains("HTTP 502")
        );
        assert!(!s(E2bError::Transport("tcp reset at 10.0.0.1".into())).contains("10.0.0.1"));
        assert!(s(E2bError::NotConfigured("E2B_API_KEY is not set")).contains("E2B_API_KEY"));
    }
}
