//! The sweep's Slack messages as typed params: the digest (`sweep_digest.json.j2`), the owner
//! heading of each group of cases (`sweep_owner.json.j2`), and the words on each case.
//!
//! This file turns a [`SweepReport`] into values; it must not call Slack, E2B or the store.
use serde::Serialize;

use super::context::SweepMode;
use super::policy::{RunState, bytes, human};
use super::report::{Capacity, IdleSandbox, Posted, SweepReport};
use crate::slack::format::when;
use crate::slack::render::{CapacityParams, MessageParams};

/// Idle sandboxes listed by name in a digest.
pub const DIGEST_TOP: usize = 10;

/// US dollars, to the cent.
pub fn dollars(amount: f64) -> String {
    format!("${amount:.2}")
}

fn percent(share: f64) -> String {
    format!("{:.0} %", share * 100.0)
}

fn rate(per_min: f64) -> String {
    if per_min >= 10.0 {
        format!("{per_min:.0}/min")
    } else {
        format!("{per_min:.1}/min")
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct GuardParams {
    pub kill_count: usize,
    pub share: String,
    pub limit: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct TopParams {
    pub id: String,
    pub template: String,
    pub owner: String,
    pub recommendation: &'static str,
    pub cost: String,
}

/// `sweep_digest.json.j2`.
#[derive(Debug, Clone, Serialize)]
pub struct DigestParams {
    pub dry_run: bool,
    pub at: String,
    pub fleet_total: usize,
    pub running: usize,
    pub paused: usize,
    pub idle: usize,
    pub idle_cost: String,
    pub pause: usize,
    pub snapshot_then_kill: usize,
    pub kill: usize,
    pub leave: usize,
    pub exempt_keep: usize,
    pub exempt_left: usize,
    pub exempt_young: usize,
    pub already_open: usize,
    pub capacity: Option<CapacityParams>,
    pub capacity_unavailable: Option<String>,
    pub guard: Option<GuardParams>,
    pub top: Vec<TopParams>,
    pub problems: Vec<String>,
    /// The last line: what was (or will be) done.
    pub outcome: String,
}

impl MessageParams for DigestParams {
    const TEMPLATE: &'static str = "sweep_digest.json.j2";
}

/// `sweep_owner.json.j2`.
#[derive(Debug, Clone, Serialize)]
pub struct OwnerParams {
    pub owner: String,
    pub slack_user: Option<String>,
    pub count: usize,
    pub cost: String,
}

impl MessageParams for OwnerParams {
    const TEMPLATE: &'static str = "sweep_owner.json.j2";
}

/// The digest of `report`. `posted` is the live outcome so far (`None` for a dry run).
/// `show_top` lists the most expensive idle sandboxes by name (dry runs, and whenever the guard
/// holds kill cases back, since those are not posted one by one).
pub fn digest_params(
    report: &SweepReport,
    posted: Option<&Posted>,
    show_top: bool,
) -> DigestParams {
    let c = &report.counts;
    let (capacity, capacity_unavailable) = match &report.capacity {
        Capacity::Available {
            concurrent_now,
            concurrent_peak,
            peak_at,
            start_rate_per_min,
            start_rate_peak_per_min,
            window_hours,
        } => (
            Some(CapacityParams {
                window: format!("{window_hours}h"),
                concurrent_now: *concurrent_now,
                concurrent_peak: *concurrent_peak,
                peak_at: peak_at.map(when),
                start_rate: rate(*start_rate_per_min),
                start_rate_peak: rate(*start_rate_peak_per_min),
            }),
            None,
        ),
        Capacity::Unavailable { reason } => (None, Some(reason.clone())),
    };
    let guard = report.guard.tripped.then(|| GuardParams {
        kill_count: report.guard.kill_count,
        share: percent(report.guard.share),
        limit: percent(report.guard.limit),
    });
    let top = if show_top || report.guard.tripped {
        report
            .idle
            .iter()
            .take(DIGEST_TOP)
            .map(|s| TopParams {
                id: s.id.to_string(),
                template: s.template.clone(),
                owner: s.owner.clone().unwrap_or_else(|| "no owner".into()),
                recommendation: s.recommendation.label(),
                cost: dollars(s.evidence.cost_per_day_usd),
            })
            .collect()
    } else {
        Vec::new()
    };
    let mut problems = report.problems.iter().take(3).cloned().collect::<Vec<_>>();
    let unread = c.unreadable + c.vanished;
    if unread > 0 {
        problems.push(format!(
            "{unread} sandboxes could not be judged ({} gone meanwhile, {} unreadable).",
            c.vanished, c.unreadable
        ));
    }
    let outcome = match (report.mode, posted) {
        (SweepMode::DryRun, _) => "Dry run: nothing was opened or posted.".to_owned(),
        (SweepMode::Live, None) => "Opening cases in this thread…".to_owned(),
        (SweepMode::Live, Some(p)) => outcome_line(p),
    };
    DigestParams {
        dry_run: report.mode == SweepMode::DryRun,
        at: when(report.at),
        fleet_total: report.fleet.total,
        running: report.fleet.running,
        paused: report.fleet.paused,
        idle: c.idle,
        idle_cost: dollars(report.idle_cost_per_day_usd),
        pause: c.by_recommendation.pause,
        snapshot_then_kill: c.by_recommendation.snapshot_then_kill,
        kill: c.by_recommendation.kill,
        leave: c.by_recommendation.leave,
        exempt_keep: c.exempt.keep_metadata,
        exempt_left: c.exempt.left,
        exempt_young: c.exempt.too_young,
        already_open: c.already_open,
        capacity,
        capacity_unavailable,
        guard,
        top,
        problems,
        outcome,
    }
}

fn outcome_line(p: &Posted) -> String {
    let mut parts = vec![format!(
        "Opened {} case{} in this thread",
        p.opened.len(),
        if p.opened.len() == 1 { "" } else { "s" }
    )];
    if p.already_open > 0 {
        parts.push(format!("{} already open", p.already_open));
    }
    if p.held_for_review > 0 {
        parts.push(format!(
            "{} kill recommendations held for review",
            p.held_for_review
        ));
    }
    if p.deferred > 0 {
        parts.push(format!("{} left for the next sweep", p.deferred));
    }
    if p.failed > 0 {
        parts.push(format!("{} could not be opened (see the logs)", p.failed));
    }
    format!("{}.", parts.join(" · "))
}

/// The reason on a sweep case's card ("The hygiene sweep asks: …"): the evidence the
/// recommendation rests on, in one paragraph.
pub fn case_reason(s: &IdleSandbox, now: chrono::DateTime<chrono::Utc>) -> String {
    let e = &s.evidence;
    let mut parts = Vec::new();
    match s.state {
        RunState::Running => {
            parts.push("is this idle sandbox still needed?".to_owned());
            if let (Some(start), Some(end)) = (e.window_start, e.window_end) {
                parts.push(format!(
                    "Metrics from {} to {} ({} samples): CPU p95 {:.1} %, max {:.1} %",
                    when(start),
                    end.format("%H:%M UTC"),
                    e.samples,
                    e.cpu_p95_pct.unwrap_or(0.0),
                    e.cpu_max_pct.unwrap_or(0.0)
                ));
            }
            if let (Some(used), Some(total)) = (e.mem_used, e.mem_total) {
                parts.push(format!("memory {} of {}", bytes(used), bytes(total)));
            }
            if let (Some(used), Some(total)) = (e.disk_used, e.disk_total) {
                let growth = e.disk_growth.unwrap_or(0);
                let change = if growth > 0 {
                    format!("grew {}", bytes(growth as u64))
                } else {
                    "flat".to_owned()
                };
                parts.push(format!(
                    "disk {} of {}, {change}",
                    bytes(used),
                    bytes(total)
                ));
            }
            if let Some(since) = e.idle_since {
                parts.push(format!(
                    "idle since {} ({})",
                    when(since),
                    human(now - since)
                ));
            }
        }
        RunState::Paused => {
            parts.push("is this paused sandbox still needed?".to_owned());
            if let Some(since) = e.paused_since {
                parts.push(format!(
                    "Paused since {} ({})",
                    when(since),
                    human(now - since)
                ));
            }
            parts.push(format!(
                "{} of disk allocated",
                bytes(s.disk_size_mb * 1024 * 1024)
            ));
        }
    }
    parts.push(format!("template `{}`", s.template));
    parts.push(match &s.owner {
        Some(owner) => format!("owner {owner}"),
        None => "no owner in its metadata".to_owned(),
    });
    parts.push(format!(
        "costs about {} a day as it is",
        dollars(e.cost_per_day_usd)
    ));
    // The first part is the question; the evidence follows as one sentence.
    let (question, evidence) = parts.split_first().expect("parts has the question");
    format!("{question} {}.", evidence.join("; "))
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::BTreeMap;

    use chrono::{TimeZone, Utc};

    use super::*;
    use crate::hygiene::policy::{IdleEvidence, Recommendation};
    use crate::hygiene::sweep::{
        AlreadyOpen, Counts, ExemptCounts, FleetCounts, Guard, RecommendationCounts,
    };
    use crate::ids::{CaseId, SandboxId, TemplateId};
    use crate::slack::render::Templates;

    fn now() -> chrono::DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 3, 4, 9, 0, 0).unwrap()
    }

    pub(crate) fn idle_running() -> IdleSandbox {
        IdleSandbox {
            id: SandboxId::parse("iidle0001").unwrap(),
            template: "python".into(),
            template_id: TemplateId::parse("rpython01").unwrap(),
            state: RunState::Running,
            started_at: now() - chrono::Duration::hours(6),
            cpu_count: 2,
            memory_mb: 1024,
            disk_size_mb: 5120,
            metadata: BTreeMap::from([("owner".to_owned(), "alice".to_owned())]),
            owner: Some("alice".into()),
            owner_slack: None,
            recommendation: Recommendation::Pause,
            reason: "CPU under 2 % for 1h (p95 0.5 %) and disk flat: pausing is reversible and keeps memory.".into(),
            evidence: IdleEvidence {
                window_start: Some(now() - chrono::Duration::hours(1)),
                window_end: Some(now()),
                samples: 361,
                cpu_p95_pct: Some(0.5),
                cpu_max_pct: Some(0.64),
                cpu_latest_pct: Some(0.2),
                mem_used: Some(200 << 20),
                mem_total: Some(1 << 30),
                disk_used: Some(1 << 30),
                disk_total: Some(5 << 30),
                disk_growth: Some(0),
                idle_since: Some(now() - chrono::Duration::hours(1)),
                paused_since: None,
                owner: Some("alice".into()),
                cost_per_day_usd: 1.6,
            },
        }
    }

    fn report(mode: SweepMode, tripped: bool) -> SweepReport {
        let mut paused = idle_running();
        paused.id = SandboxId::parse("ipaused01").unwrap();
        paused.state = RunState::Paused;
        paused.owner = None;
        paused.recommendation = Recommendation::SnapshotThenKill;
        paused.evidence.paused_since = Some(now() - chrono::Duration::days(5));
        paused.evidence.cost_per_day_usd = 0.0;
        SweepReport {
            mode,
            at: now(),
            fleet: FleetCounts {
                running: 7,
                paused: 3,
                total: 10,
            },
            pages: 1,
            listing_incomplete: None,
            counts: Counts {
                active: 5,
                idle: 2,
                by_recommendation: RecommendationCounts {
                    pause: 1,
                    snapshot_then_kill: 1,
                    kill: 0,
                    leave: 0,
                },
                exempt: ExemptCounts {
                    keep_metadata: 1,
                    left: 1,
                    too_young: 0,
                },
                already_open: 1,
                vanished: 0,
                unreadable: 0,
            },
            idle_cost_per_day_usd: 1.6,
            capacity: Capacity::Available {
                concurrent_now: 7,
                concurrent_peak: 12,
                peak_at: Some(now() - chrono::Duration::hours(3)),
                start_rate_per_min: 0.25,
                start_rate_peak_per_min: 3.0,
                window_hours: 24,
            },
            guard: Guard {
                limit: 0.25,
                kill_count: if tripped { 3 } else { 1 },
                share: if tripped { 0.3 } else { 0.1 },
                tripped,
            },
            idle: vec![idle_running(), paused],
            exempt: Vec::new(),
            already_open: vec![AlreadyOpen {
                id: SandboxId::parse("iopen0001").unwrap(),
                case: CaseId::parse("case_1").unwrap(),
            }],
            problems: Vec::new(),
            e2b_calls: 4,
            posted: None,
        }
    }

    #[test]
    fn a_live_digest_counts_states_recommendations_cost_and_capacity() {
        let r = report(SweepMode::Live, false);
        let posted = Posted {
            opened: vec![CaseId::parse("case_a").unwrap()],
            already_open: 1,
            ..Posted::default()
        };
        let message = Templates::embedded()
            .render(&digest_params(&r, Some(&posted), false))
            .unwrap();
        insta::assert_json_snapshot!("sweep_digest_live", message);
    }

    #[test]
    fn a_tripped_guard_and_a_missing_team_say_so_in_the_digest() {
        let mut r = report(SweepMode::Live, true);
        r.capacity = Capacity::Unavailable {
            reason: "E2B_PROJECT_ID (or E2B_TEAM_ID) is not set, so team metrics are unavailable"
                .into(),
        };
        r.counts.unreadable = 2;
        let message = Templates::embedded()
            .render(&digest_params(&r, None, false))
            .unwrap();
        insta::assert_json_snapshot!("sweep_digest_guard", message);
    }

    #[test]
    fn a_dry_run_digest_lists_the_most_expensive_idle_sandboxes() {
        let r = report(SweepMode::DryRun, false);
        let message = Templates::embedded()
            .render(&digest_params(&r, None, true))
            .unwrap();
        insta::assert_json_snapshot!("sweep_digest_dry_run", message);
    }

    #[test]
    fn the_owner_heading_mentions_a_known_slack_user() {
        let message = Templates::embedded()
            .render(&OwnerParams {
                owner: "alice".into(),
                slack_user: Some("U0ALICE01".into()),
                count: 3,
                cost: dollars(4.8),
            })
            .unwrap();
        insta::assert_json_snapshot!("sweep_owner", message);
    }

    #[test]
    fn a_case_reason_carries_the_window_cpu_memory_disk_owner_and_cost() {
        let text = case_reason(&idle_running(), now());
        for needle in [
            "2026-03-04 08:00 UTC to 09:00 UTC (361 samples)",
            "CPU p95 0.5 %",
            "memory 200 MiB of 1.0 GiB",
            "disk 1.0 GiB of 5.0 GiB, flat",
            "idle since 2026-03-04 08:00 UTC (1h)",
            "template `python`",
            "owner alice",
            "$1.60 a day",
        ] {
            assert!(text.contains(needle), "{needle:?} missing from {text:?}");
        }
    }
}
