//! One pass over the fleet: [`sweep_once`] lists every running and paused sandbox, judges each
//! with the idle policy, and (live) posts one digest plus one approval case per idle sandbox.
//!
//! The pass is a pipeline so that its wall time is close to the sequential paging it cannot
//! avoid: while page N+1 is being fetched, page N's latest metrics (one batch call), its store
//! look-ups (one round trip) and its candidates' metric windows (bounded, concurrent) are
//! already in flight. Only candidates (quiet latest sample, or paused long) cost a window read,
//! and never those that are exempt or already have an open case.
//!
//! The fleet is listed by [`super::listing`]: running and paused separately, each from both ends
//! (newest and oldest first) at the same time, so the listing takes about half as long as the
//! larger state's pages one after the other.
//!
//! Nothing here kills, pauses or snapshots anything: a live sweep only opens cases through
//! `approvals::open_case`, and a dry run writes nothing at all (no case, no Slack message).
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use futures::StreamExt;
use tokio::sync::Semaphore;

pub use super::context::{DEFAULT_WINDOW_CONCURRENCY, SweepContext, SweepError, SweepMode};
use super::listing::{self, Paged};
use super::policy::{self, Assessment, Exemption, Observed, RunState, Sample};
pub use super::report::*;
use crate::cases::Subject;
use crate::e2b::{
    E2bClient, E2bError, ListedSandbox, MetricPoint, SandboxMetric, SandboxState, TeamMaxMetric,
};
use crate::ids::SandboxId;

/// Pages being judged while the next one is fetched.
pub const PAGES_IN_FLIGHT: usize = 16;
/// Team capacity is shown over this look-back.
pub const CAPACITY_WINDOW_HOURS: i64 = 24;
/// Problems kept verbatim in the report (the rest are only counted).
const MAX_PROBLEMS_KEPT: usize = 20;

/// One pass. A dry run only reads; a live pass posts the digest and opens cases.
pub async fn sweep_once(
    ctx: &SweepContext,
    now: DateTime<Utc>,
    mode: SweepMode,
) -> Result<SweepReport, SweepError> {
    sweep_pass(ctx, now, mode, None).await
}

/// One pass; `slot` is the scheduled time a live pass runs for, if any. A scheduled slot's
/// digest is posted once: a replica that takes the slot over after a lost lease posts its
/// cases in the thread of the digest already there.
#[tracing::instrument(skip(ctx, now, slot), fields(%now, slot = slot.map(|s| s.to_rfc3339()).unwrap_or_default()))]
pub(super) async fn sweep_pass(
    ctx: &SweepContext,
    now: DateTime<Utc>,
    mode: SweepMode,
    slot: Option<DateTime<Utc>>,
) -> Result<SweepReport, SweepError> {
    let started = std::time::Instant::now();
    let result = pass(ctx, now, mode, slot).await;
    let figures = result.as_ref().ok().map(|r| crate::metrics::SweepFigures {
        running: r.fleet.running,
        paused: r.fleet.paused,
        idle: r.counts.idle,
        idle_cost_per_day_usd: r.idle_cost_per_day_usd,
    });
    let mode_label = match mode {
        SweepMode::Live => "live",
        SweepMode::DryRun => "dry_run",
    };
    crate::metrics::sweep(mode_label, started.elapsed(), figures);
    result
}

async fn pass(
    ctx: &SweepContext,
    now: DateTime<Utc>,
    mode: SweepMode,
    slot: Option<DateTime<Utc>>,
) -> Result<SweepReport, SweepError> {
    // Checked first: a live pass with nowhere to post must not do the reading for nothing.
    let channel = match mode {
        SweepMode::Live => Some(ctx.channel.clone().ok_or(SweepError::NoChannel)?),
        SweepMode::DryRun => None,
    };
    let calls_before = ctx.e2b.calls_made();
    let (capacity, judged) = tokio::join!(capacity(&ctx.e2b, now), judge_fleet(ctx, now));
    let judged = judged?;
    let mut report = judged.into_report(ctx, mode, now, capacity);
    if let Some(channel) = channel {
        report.posted = Some(super::post::post(ctx, &report, &channel, now, slot).await?);
    }
    report.e2b_calls = ctx.e2b.calls_made() - calls_before;
    tracing::info!(
        fleet = report.fleet.total,
        idle = report.counts.idle,
        calls = report.e2b_calls,
        ?mode,
        "sweep finished"
    );
    Ok(report)
}

/// What the pipeline gathers, page by page.
#[derive(Default)]
struct Judged {
    fleet: FleetCounts,
    pages: u32,
    counts: Counts,
    idle: Vec<IdleSandbox>,
    exempt: Vec<ExemptSandbox>,
    already_open: Vec<AlreadyOpen>,
    problems: Vec<String>,
}

impl Judged {
    fn merge(mut self, other: Judged) -> Judged {
        self.fleet.running += other.fleet.running;
        self.fleet.paused += other.fleet.paused;
        self.fleet.total += other.fleet.total;
        self.pages += other.pages;
        let (a, b) = (&mut self.counts, other.counts);
        a.active += b.active;
        a.exempt.keep_metadata += b.exempt.keep_metadata;
        a.exempt.left += b.exempt.left;
        a.exempt.too_young += b.exempt.too_young;
        a.already_open += b.already_open;
        a.vanished += b.vanished;
        a.unreadable += b.unreadable;
        self.idle.extend(other.idle);
        self.exempt.extend(other.exempt);
        self.already_open.extend(other.already_open);
        for p in other.problems {
            if self.problems.len() < MAX_PROBLEMS_KEPT {
                self.problems.push(p);
            }
        }
        self
    }

    fn problem(&mut self, text: String) {
        if self.problems.len() < MAX_PROBLEMS_KEPT {
            self.problems.push(text);
        }
    }

    fn into_report(
        mut self,
        ctx: &SweepContext,
        mode: SweepMode,
        now: DateTime<Utc>,
        capacity: Capacity,
    ) -> SweepReport {
        // Most expensive first; at equal cost (paused sandboxes may cost nothing) the most disk
        // first; then by id, so reports are stable.
        self.idle.sort_by(|a, b| {
            b.evidence
                .cost_per_day_usd
                .total_cmp(&a.evidence.cost_per_day_usd)
                .then_with(|| b.disk_size_mb.cmp(&a.disk_size_mb))
                .then_with(|| a.id.cmp(&b.id))
        });
        self.exempt.sort_by(|a, b| a.id.cmp(&b.id));
        self.already_open.sort_by(|a, b| a.id.cmp(&b.id));
        let mut counts = self.counts;
        counts.idle = self.idle.len();
        for s in &self.idle {
            counts.by_recommendation.add(s.recommendation);
        }
        let kill_count = counts.by_recommendation.kills();
        let share = if self.fleet.total == 0 {
            0.0
        } else {
            kill_count as f64 / self.fleet.total as f64
        };
        let limit = ctx.config.kill_share_guard;
        let mut report = SweepReport {
            mode,
            at: now,
            fleet: self.fleet,
            pages: self.pages,
            listing_incomplete: None,
            counts,
            idle_cost_per_day_usd: self.idle.iter().map(|s| s.evidence.cost_per_day_usd).sum(),
            capacity,
            guard: Guard {
                limit,
                kill_count,
                share,
                tripped: kill_count > 0 && share > limit,
            },
            idle: self.idle,
            groups: Vec::new(),
            exempt: self.exempt,
            already_open: self.already_open,
            problems: self.problems,
            e2b_calls: 0,
            posted: None,
        };
        report.groups = super::groups::groups(&report);
        report
    }
}

/// Pages through the fleet ([`listing::start`]: running and paused, each from both ends) and
/// judges each page while the next ones are fetched.
///
/// The pagers run in tasks of their own and every page is judged in a task of its own: decoding
/// a page's metric windows is real CPU work, and if it shared a task with a pager each page
/// request would wait behind it, stretching the one part that cannot be parallel.
///
/// **A sandbox that changes state while the pass lists.** The running and the paused listings
/// pass a given sandbox at different moments, so one paused or resumed in between may be in
/// both listings, or in neither. In both, it is counted and judged once, in the state it had
/// when it was first listed: every listed id is remembered for the pass and a second sighting
/// is dropped before it is judged (as are the sandboxes both ends of one listing read around
/// where they met). In neither (paused after the running listing passed it and resumed, or
/// resumed after the paused listing passed it, before the other listing got there) it is
/// missing from this pass's counts, as a sandbox started during the pass is. Either way it was
/// paused or resumed seconds ago, so it is not idle in the state it is in; the next pass sees
/// it.
async fn judge_fleet(ctx: &SweepContext, now: DateTime<Utc>) -> Result<Judged, SweepError> {
    let windows = Arc::new(Semaphore::new(ctx.window_concurrency.max(1)));
    let (_pagers, mut rx) = listing::start(&ctx.e2b, PAGES_IN_FLIGHT);
    // Dropping the set (an error, or the sweep being cancelled) aborts every judge.
    let mut judging = tokio::task::JoinSet::new();
    let mut judged = Judged::default();
    let mut listed: HashSet<SandboxId> = HashSet::new();
    let mut listing_open = true;
    loop {
        tokio::select! {
            paged = rx.recv(), if listing_open && judging.len() < PAGES_IN_FLIGHT => match paged {
                Some(Ok(Paged::Page(mut items))) => {
                    judged.pages += 1;
                    // Listed already: by the other end of its listing, around where the two
                    // ends met, or by the other state's listing, as it changed state meanwhile.
                    items.retain(|s| listed.insert(s.sandbox_id.clone()));
                    judging.spawn(judge_page(ctx.clone(), items, now, windows.clone()));
                }
                Some(Ok(Paged::Stopped(state, reason))) => {
                    judged.problem(format!(
                        "The list of {} sandboxes may be incomplete: {reason}.",
                        state.as_query()
                    ));
                }
                Some(Err(e)) => return Err(e),
                None => listing_open = false,
            },
            Some(done) = judging.join_next() => {
                let part = done.map_err(|e| SweepError::Judge(e.to_string()))??;
                judged = judged.merge(part);
            }
            else => break,
        }
    }
    Ok(judged)
}

fn observed(s: &ListedSandbox) -> Observed {
    Observed {
        id: s.sandbox_id.to_string(),
        template: s.alias.clone().unwrap_or_else(|| s.template_id.to_string()),
        state: match s.state {
            SandboxState::Paused => RunState::Paused,
            _ => RunState::Running,
        },
        started_at: s.started_at,
        end_at: s.end_at,
        cpu_count: s.cpu_count,
        memory_mb: u64::from(s.memory_mb),
        disk_size_mb: u64::from(s.disk_size_mb),
        metadata: s.metadata.clone(),
    }
}

fn sample(m: &MetricPoint) -> Sample {
    Sample {
        at: DateTime::from_timestamp(m.timestamp_unix, 0).unwrap_or_default(),
        cpu_pct: m.cpu_used_pct,
        mem_used: m.mem_used.max(0) as u64,
        mem_total: m.mem_total.max(0) as u64,
        disk_used: m.disk_used.max(0) as u64,
        disk_total: m.disk_total.max(0) as u64,
    }
}

/// Judges one page: one batch metrics call, one store round trip, windows for candidates.
async fn judge_page(
    ctx: SweepContext,
    items: Vec<ListedSandbox>,
    now: DateTime<Utc>,
    windows: Arc<Semaphore>,
) -> Result<Judged, SweepError> {
    let (ctx, windows) = (&ctx, &*windows);
    let policy = &ctx.config.idle;
    let mut part = Judged::default();
    let running: Vec<SandboxId> = items
        .iter()
        .filter(|s| s.state == SandboxState::Running)
        .map(|s| s.sandbox_id.clone())
        .collect();
    part.fleet.running = running.len();
    part.fleet.paused = items
        .iter()
        .filter(|s| s.state == SandboxState::Paused)
        .count();
    part.fleet.total = part.fleet.running + part.fleet.paused;
    let mut metrics_failed = false;
    let latest: HashMap<SandboxId, SandboxMetric> = if running.is_empty() {
        HashMap::new()
    } else {
        match ctx.e2b.metrics_many(&running).await {
            Ok(m) => m,
            Err(e) => {
                metrics_failed = true;
                // Without latest samples no running sandbox of this page can be judged; say so
                // and carry on with the paused ones rather than failing the whole pass.
                part.counts.unreadable += running.len();
                part.problem(format!(
                    "Latest metrics of {} running sandboxes could not be read: {e}",
                    running.len()
                ));
                HashMap::new()
            }
        }
    };
    // Indices into `items`, so the concurrent reads below borrow nothing per element.
    let mut candidates: Vec<(usize, Observed)> = Vec::new();
    for (i, s) in items.iter().enumerate() {
        if s.state != SandboxState::Running && s.state != SandboxState::Paused {
            continue;
        }
        let seen = observed(s);
        let quiet_now = latest
            .get(&s.sandbox_id)
            .map(|m| sample(&MetricPoint::from(m)));
        if seen.state == RunState::Running && metrics_failed {
            // Counted as unreadable above.
            continue;
        }
        if policy::is_candidate(policy, &seen, quiet_now.as_ref(), now) {
            candidates.push((i, seen));
        } else {
            part.counts.active += 1;
        }
    }
    if candidates.is_empty() {
        return Ok(part);
    }
    let subjects: Vec<Subject> = candidates
        .iter()
        .map(|(i, _)| Subject::Sandbox(items[*i].sandbox_id.clone()))
        .collect();
    let (marks, open) = tokio::try_join!(
        ctx.store.left_marks(&subjects),
        ctx.store.open_case_ids(&subjects)
    )?;
    let mut to_read = Vec::new();
    for (((i, seen), mark), open) in candidates.into_iter().zip(marks).zip(open) {
        let listed = &items[i];
        if let Some(case) = open {
            part.counts.already_open += 1;
            part.already_open.push(AlreadyOpen {
                id: listed.sandbox_id.clone(),
                case,
            });
            continue;
        }
        // A person's Leave keeps a sandbox out of sweeps for at most `max_exclude_for` from when
        // it was decided, whatever date it carries: a mark made before the cap (9999-12-31, or
        // none) stops hiding the sandbox once the cap has passed.
        let left_until = mark.map(|m| {
            let cap =
                m.at + chrono::Duration::from_std(ctx.config.max_exclude_for).unwrap_or_default();
            Some(m.until.map_or(cap, |until| until.min(cap)))
        });
        // Exempt sandboxes are settled before any window is read: their activity changes nothing.
        if let Some(exemption) = policy::exemption(policy, &seen, left_until, now) {
            part.exempt(listed, exemption);
            continue;
        }
        match seen.state {
            RunState::Paused => {
                let verdict = policy::assess(policy, &seen, &[], left_until, now);
                part.record(ctx, listed, seen, verdict);
            }
            RunState::Running => to_read.push((i, seen, left_until)),
        }
    }
    let items = &items;
    let verdicts: Vec<_> = futures::stream::iter(to_read)
        .map(|(i, seen, left_until)| async move {
            let listed = &items[i];
            let window = policy.thresholds_for(&seen.template).idle_window;
            let start = now - chrono::Duration::from_std(window).unwrap_or_default();
            let read = {
                // The permit bounds window reads across all pages in flight.
                let _permit = windows.acquire().await;
                ctx.e2b
                    .sandbox_metrics_as::<MetricPoint>(&listed.sandbox_id, Some(start), Some(now))
                    .await
            };
            (i, seen, left_until, read)
        })
        .buffer_unordered(ctx.window_concurrency.max(1))
        .collect()
        .await;
    for (i, seen, left_until, read) in verdicts {
        let listed = &items[i];
        match read {
            Ok(points) => {
                let mut window: Vec<Sample> = points.iter().map(sample).collect();
                window.sort_by_key(|s| s.at);
                let verdict = policy::assess(policy, &seen, &window, left_until, now);
                part.record(ctx, listed, seen, verdict);
            }
            Err(E2bError::NotFound { .. }) => part.counts.vanished += 1,
            Err(e) => {
                part.counts.unreadable += 1;
                part.problem(format!(
                    "Metrics of `{}` could not be read: {e}",
                    listed.sandbox_id
                ));
            }
        }
    }
    Ok(part)
}

impl Judged {
    fn exempt(&mut self, listed: &ListedSandbox, exemption: Exemption) {
        match exemption {
            Exemption::KeepUntil { .. } => self.counts.exempt.keep_metadata += 1,
            Exemption::LeftUntil { .. } => self.counts.exempt.left += 1,
            Exemption::TooYoung => self.counts.exempt.too_young += 1,
        }
        self.exempt.push(ExemptSandbox {
            id: listed.sandbox_id.clone(),
            exemption,
        });
    }

    fn record(
        &mut self,
        ctx: &SweepContext,
        listed: &ListedSandbox,
        seen: Observed,
        verdict: Assessment,
    ) {
        match verdict {
            Assessment::Active { .. } => self.counts.active += 1,
            Assessment::Exempt { exemption } => self.exempt(listed, exemption),
            Assessment::Idle {
                recommendation,
                reason,
                evidence,
            } => {
                let owner = evidence.owner.clone();
                self.idle.push(IdleSandbox {
                    id: listed.sandbox_id.clone(),
                    template: seen.template,
                    template_id: listed.template_id.clone(),
                    state: seen.state,
                    started_at: seen.started_at,
                    ends_at: (seen.state == RunState::Running).then_some(seen.end_at),
                    cpu_count: seen.cpu_count,
                    memory_mb: seen.memory_mb,
                    disk_size_mb: seen.disk_size_mb,
                    owner_slack: owner.as_deref().and_then(|o| ctx.config.slack_user_for(o)),
                    owner,
                    metadata: seen.metadata,
                    recommendation,
                    reason,
                    evidence: *evidence,
                });
            }
        }
    }
}

/// Concurrency now and at peak, and the start rate, over the last day. Never fails the pass:
/// without a team id or with E2B refusing, the digest says the view is unavailable.
async fn capacity(e2b: &E2bClient, now: DateTime<Utc>) -> Capacity {
    let start = now - chrono::Duration::hours(CAPACITY_WINDOW_HOURS);
    let read = tokio::try_join!(
        e2b.team_metrics(Some(start), Some(now)),
        e2b.team_metrics_max(TeamMaxMetric::ConcurrentSandboxes, Some(start), Some(now)),
        e2b.team_metrics_max(TeamMaxMetric::SandboxStartRate, Some(start), Some(now)),
    );
    match read {
        Ok((series, peak, rate_peak)) => {
            let latest = series.iter().max_by_key(|p| p.timestamp_unix);
            let rates: Vec<f64> = series.iter().map(|p| p.sandbox_start_rate).collect();
            let avg = if rates.is_empty() {
                0.0
            } else {
                rates.iter().sum::<f64>() / rates.len() as f64
            };
            Capacity::Available {
                concurrent_now: latest.map_or(0, |p| p.concurrent_sandboxes.max(0) as u64),
                concurrent_peak: peak.value.max(0.0) as u64,
                peak_at: DateTime::from_timestamp(peak.timestamp_unix, 0),
                start_rate_per_min: avg * 60.0,
                start_rate_peak_per_min: rate_peak.value * 60.0,
                window_hours: CAPACITY_WINDOW_HOURS,
            }
        }
        Err(E2bError::NotConfigured(what)) => Capacity::Unavailable {
            reason: what.to_owned(),
        },
        Err(e) => Capacity::Unavailable {
            reason: format!("E2B did not give team metrics: {e}"),
        },
    }
}
