//! The sweep's Slack messages as typed params: the digest (`sweep_digest.json.j2`), the owner
//! heading of each group of cases (`sweep_owner.json.j2`), and the words on each case.
//!
//! This file turns a [`SweepReport`] into values; it must not call Slack, E2B or the store.
use serde::Serialize;

use super::context::SweepMode;
use super::policy::{RunState, bytes};
use super::report::{Capacity, IdleSandbox, Posted, SweepReport};
use crate::slack::format::when;
use crate::slack::render::{
    CapacityParams, MessageParams, Mrkdwn, RenderError, SAMPLE_TEXT, Templates, sample_capacity,
};

/// Idle sandboxes listed by name in a digest.
pub const DIGEST_TOP: usize = 10;

/// US dollars, to the cent. Never `$-0.00` (an empty `f64` sum is `-0.0`).
pub fn dollars(amount: f64) -> String {
    let amount = if amount.abs() < 0.005 { 0.0 } else { amount };
    format!("${amount:.2}")
}

/// Whether an amount shows as `$0.00`.
fn is_free(amount: f64) -> bool {
    amount.abs() < 0.005
}

/// The disk a paused sandbox holds: what it last reported, else its allocation.
pub fn held_disk(s: &IdleSandbox) -> u64 {
    s.evidence.disk_used.unwrap_or(s.disk_size_mb * 1024 * 1024)
}

/// What keeping one idle sandbox costs, in words: `$1.60 a day` for a running one, `holds
/// 4.0 GiB of disk` for a paused one (its cost is often zero, which says nothing).
pub fn worth(s: &IdleSandbox) -> String {
    let cost = s.evidence.cost_per_day_usd;
    match s.state {
        RunState::Running => format!("{} a day", dollars(cost)),
        RunState::Paused if is_free(cost) => format!("holds {} of disk", bytes(held_disk(s))),
        RunState::Paused => format!(
            "holds {} of disk, {} a day",
            bytes(held_disk(s)),
            dollars(cost)
        ),
    }
}

/// What a group of idle sandboxes costs, in words: `about $3.20 a day`, `4.0 GiB of paused
/// disk`, or both.
pub fn group_worth<'a>(sandboxes: impl IntoIterator<Item = &'a IdleSandbox>) -> String {
    let (mut cost, mut disk, mut paused) = (0.0, 0u64, 0usize);
    for s in sandboxes {
        cost += s.evidence.cost_per_day_usd;
        if s.state == RunState::Paused {
            disk += held_disk(s);
            paused += 1;
        }
    }
    match (is_free(cost), paused) {
        (_, 0) => format!("about {} a day", dollars(cost)),
        (true, _) => format!("{} of paused disk", bytes(disk)),
        (false, _) => format!(
            "about {} a day and {} of paused disk",
            dollars(cost),
            bytes(disk)
        ),
    }
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
    /// The template's alias from E2B and the owner from the sandbox's metadata: quoted data.
    pub template: Mrkdwn,
    pub owner: Mrkdwn,
    pub recommendation: &'static str,
    /// `$1.60 a day`, or `holds 4.0 GiB of disk` for a paused sandbox.
    pub worth: String,
}

/// `sweep_digest.json.j2`.
#[derive(Debug, Clone, Serialize)]
pub struct DigestParams {
    pub dry_run: bool,
    pub at: String,
    /// The message's `text` (notifications and screen readers).
    pub headline: String,
    /// Set when a live sweep found nothing new: the digest is this one line.
    pub quiet: Option<String>,
    pub fleet_total: usize,
    pub running: usize,
    pub paused: usize,
    /// Every idle sandbox: new ones and those whose case is already open.
    pub idle: usize,
    /// Idle sandboxes without a case yet.
    pub idle_new: usize,
    /// What the new idle sandboxes cost (`about $1.60 a day`, paused disk).
    pub idle_worth: String,
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
    /// See [`owner_heading`].
    pub owner: Mrkdwn,
    pub slack_user: Option<String>,
    pub count: usize,
    /// What the group costs: `about $3.20 a day`, `4.0 GiB of paused disk`, or both.
    pub worth: String,
}

impl MessageParams for OwnerParams {
    const TEMPLATE: &'static str = "sweep_owner.json.j2";
}

/// Most characters of an owner's name or a template's alias shown (they come from metadata and
/// from E2B, so they are quoted data).
const NAME_MAX_CHARS: usize = 80;

/// Who a group of cases belongs to, as its heading names them: `Owner `alice`` (the metadata's
/// words, quoted), or `*No owner in metadata*` for `None`.
pub fn owner_heading(owner: Option<&str>) -> Mrkdwn {
    match owner {
        Some(owner) => Mrkdwn::text("Owner ").and(Mrkdwn::quoted(owner, NAME_MAX_CHARS)),
        None => Mrkdwn::markup("*No owner in metadata*"),
    }
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
                window: format!("{window_hours} h"),
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
                template: Mrkdwn::quoted(&s.template, NAME_MAX_CHARS),
                owner: match &s.owner {
                    Some(owner) => Mrkdwn::quoted(owner, NAME_MAX_CHARS),
                    None => Mrkdwn::text("no owner"),
                },
                recommendation: s.recommendation.label(),
                worth: worth(s),
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
    let idle = c.idle + c.already_open;
    let idle_words = idle_words(report);
    let headline = format!("Fleet hygiene: {idle_words}");
    let quiet = (report.mode == SweepMode::Live && nothing_new(report)).then(|| {
        format!(
            "*Fleet hygiene* · {}: nothing new. {idle_words}.",
            when(report.at)
        )
    });
    DigestParams {
        dry_run: report.mode == SweepMode::DryRun,
        at: when(report.at),
        headline,
        quiet,
        fleet_total: report.fleet.total,
        running: report.fleet.running,
        paused: report.fleet.paused,
        idle,
        idle_new: c.idle,
        idle_worth: group_worth(&report.idle),
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

/// `12 idle of 40 sandboxes, 10 already have a case`: the idle count includes the sandboxes
/// whose case is still open, so the number matches what people see in the fleet.
fn idle_words(report: &SweepReport) -> String {
    let c = &report.counts;
    let idle = c.idle + c.already_open;
    let mut text = format!(
        "{idle} idle of {} sandbox{}",
        report.fleet.total,
        if report.fleet.total == 1 { "" } else { "es" }
    );
    if c.already_open > 0 {
        text.push_str(&format!(
            ", {} already {} a case",
            c.already_open,
            if c.already_open == 1 { "has" } else { "have" }
        ));
    }
    text
}

/// Whether a live sweep has nothing to tell beyond counts: no idle sandbox without a case, no
/// kill held for review, nothing it could not read.
pub fn nothing_new(report: &SweepReport) -> bool {
    let c = &report.counts;
    report.idle.is_empty()
        && !report.guard.tripped
        && report.problems.is_empty()
        && c.unreadable + c.vanished == 0
}

fn outcome_line(p: &Posted) -> String {
    let n = p.opened.len();
    let mut parts = vec![match n {
        0 => "Opened 0 cases".to_owned(),
        1 => "Opened 1 case in this thread".to_owned(),
        n => format!("Opened {n} cases in this thread"),
    }];
    if p.already_open > 0 {
        parts.push(format!("{} already open", p.already_open));
    }
    if p.held_for_review > 0 {
        parts.push(format!(
            "{} kill recommendation{} held for review",
            p.held_for_review,
            if p.held_for_review == 1 { "" } else { "s" }
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

/// The reason on a sweep case's card ("The hygiene sweep asks: …"): only what the card's
/// fields do not show (state, template, resources, idle or paused since, the latest sample and
/// the owner are fields), so each fact appears once.
pub fn case_reason(s: &IdleSandbox, _now: chrono::DateTime<chrono::Utc>) -> String {
    let e = &s.evidence;
    match s.state {
        RunState::Running => {
            let mut parts = Vec::new();
            if let (Some(start), Some(end)) = (e.window_start, e.window_end) {
                parts.push(format!(
                    "from {} to {} ({} samples), CPU p95 {:.1} % and max {:.1} %",
                    when(start),
                    end.format("%H:%M UTC"),
                    e.samples,
                    e.cpu_p95_pct.unwrap_or(0.0),
                    e.cpu_max_pct.unwrap_or(0.0)
                ));
            }
            parts.push(match e.disk_growth.unwrap_or(0) {
                growth if growth > 0 => format!("disk grew {}", bytes(growth as u64)),
                _ => "disk flat".to_owned(),
            });
            format!(
                "is this idle sandbox still needed? {}. It costs about {} a day as it is.",
                capitalise(&parts.join("; ")),
                dollars(e.cost_per_day_usd)
            )
        }
        RunState::Paused => format!("is this paused sandbox still needed? It {}.", worth(s)),
    }
}

fn capitalise(text: &str) -> String {
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

/// The start check of the sweep's templates: the digest with every optional part or none, the
/// digest that is one quiet line, and an owner's message.
pub fn check_templates(templates: &Templates) -> Result<(), RenderError> {
    let s = || SAMPLE_TEXT.to_owned();
    for (full, quiet) in [(true, false), (false, false), (false, true)] {
        let some = |text: String| full.then_some(text);
        let n = usize::from(full);
        templates.render(&DigestParams {
            dry_run: full,
            at: s(),
            headline: s(),
            quiet: quiet.then(s),
            // One of each (the singular wordings) with every part, none of each without.
            fleet_total: if full { 1 } else { 2 },
            running: n,
            paused: n,
            idle: n,
            idle_new: n,
            idle_worth: s(),
            pause: n,
            snapshot_then_kill: n,
            kill: n,
            leave: n,
            exempt_keep: n,
            exempt_left: n,
            exempt_young: n,
            already_open: n,
            capacity: full.then(|| sample_capacity(true)),
            capacity_unavailable: some(s()),
            guard: full.then(|| GuardParams {
                kill_count: 1,
                share: s(),
                limit: s(),
            }),
            top: if full {
                vec![TopParams {
                    id: s(),
                    template: Mrkdwn::quoted(SAMPLE_TEXT, NAME_MAX_CHARS),
                    owner: Mrkdwn::quoted(SAMPLE_TEXT, NAME_MAX_CHARS),
                    recommendation: "Pause",
                    worth: s(),
                }]
            } else {
                Vec::new()
            },
            problems: if full { vec![s(), s()] } else { Vec::new() },
            outcome: s(),
        })?;
        templates.render(&OwnerParams {
            owner: owner_heading(full.then_some(SAMPLE_TEXT)),
            slack_user: some(s()),
            count: if full { 1 } else { 2 },
            worth: s(),
        })?;
    }
    Ok(())
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
            ends_at: Some(now() + chrono::Duration::hours(10)),
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
            groups: vec![],
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
    fn the_owner_heading_mentions_a_known_slack_user_and_counts_paused_disk() {
        let r = report(SweepMode::Live, false);
        let message = Templates::embedded()
            .render(&OwnerParams {
                owner: owner_heading(Some("alice")),
                slack_user: Some("U0ALICE01".into()),
                count: 2,
                worth: group_worth(&r.idle),
            })
            .unwrap();
        insta::assert_json_snapshot!("sweep_owner", message);
    }

    #[test]
    fn a_live_sweep_with_nothing_new_posts_one_line() {
        let mut r = report(SweepMode::Live, false);
        r.idle.clear();
        r.counts.idle = 0;
        r.counts.by_recommendation = RecommendationCounts::default();
        r.idle_cost_per_day_usd = -0.0;
        assert!(nothing_new(&r));
        let message = Templates::embedded()
            .render(&digest_params(&r, Some(&Posted::default()), false))
            .unwrap();
        insta::assert_json_snapshot!("sweep_digest_nothing_new", message);
    }

    #[test]
    fn a_live_digest_that_opened_nothing_says_opened_0_cases() {
        let r = report(SweepMode::Live, true);
        let posted = Posted {
            held_for_review: 1,
            ..Posted::default()
        };
        let message = Templates::embedded()
            .render(&digest_params(&r, Some(&posted), false))
            .unwrap();
        let text = message.into_content();
        let json = serde_json::to_string(&text).unwrap();
        assert!(
            json.contains("Opened 0 cases · 1 kill recommendation held for review."),
            "{json}"
        );
        assert!(!json.contains("Opening cases"), "{json}");
    }

    #[test]
    fn no_amount_shows_as_minus_zero() {
        assert_eq!(dollars(-0.0), "$0.00");
        assert_eq!(dollars([].iter().sum::<f64>()), "$0.00");
        assert_eq!(dollars(-0.001), "$0.00");
        assert_eq!(dollars(1.6), "$1.60");
    }

    #[test]
    fn a_running_case_reason_says_only_what_the_card_fields_do_not() {
        assert_eq!(
            case_reason(&idle_running(), now()),
            "is this idle sandbox still needed? From 2026-03-04 08:00 UTC to 09:00 UTC (361 samples), \
             CPU p95 0.5 % and max 0.6 %; disk flat. It costs about $1.60 a day as it is."
        );
    }

    #[test]
    fn a_paused_case_reason_says_what_it_holds_instead_of_a_zero_cost() {
        let r = report(SweepMode::Live, false);
        let paused = &r.idle[1];
        assert_eq!(
            case_reason(paused, now()),
            "is this paused sandbox still needed? It holds 1 GiB of disk."
        );
        let mut priced = paused.clone();
        priced.evidence.cost_per_day_usd = 0.12;
        assert_eq!(worth(&priced), "holds 1 GiB of disk, $0.12 a day");
    }
}
