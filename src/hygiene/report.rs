//! What a sweep pass found and did ([`SweepReport`] and its parts): plain data, read by the digest,
//! the Slack posts, the CLI and `--json`.
use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::context::SweepMode;
use super::policy::{Exemption, IdleEvidence, Recommendation, RunState};
use crate::ids::{CaseId, ListId, SandboxId, SlackUserId, TemplateId};

/// Running and paused sandboxes seen.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct FleetCounts {
    pub running: usize,
    pub paused: usize,
    pub total: usize,
}

/// Idle sandboxes by recommendation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct RecommendationCounts {
    pub pause: usize,
    pub snapshot_then_kill: usize,
    pub kill: usize,
    pub leave: usize,
}

impl RecommendationCounts {
    pub(crate) fn add(&mut self, r: Recommendation) {
        match r {
            Recommendation::Pause => self.pause += 1,
            Recommendation::SnapshotThenKill => self.snapshot_then_kill += 1,
            Recommendation::Kill => self.kill += 1,
            Recommendation::Leave => self.leave += 1,
        }
    }

    pub fn kills(&self) -> usize {
        self.snapshot_then_kill + self.kill
    }
}

/// Idle-looking sandboxes that are exempt, by reason.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ExemptCounts {
    pub keep_metadata: usize,
    pub left: usize,
    pub too_young: usize,
}

/// How every listed sandbox was judged.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    /// Working, or not idle long enough.
    pub active: usize,
    pub idle: usize,
    pub by_recommendation: RecommendationCounts,
    pub exempt: ExemptCounts,
    /// Idle-looking, but a case about them is already open: not raised again.
    pub already_open: usize,
    /// Gone between the listing and the metrics read.
    pub vanished: usize,
    /// Their metrics could not be read, so they were not judged.
    pub unreadable: usize,
}

/// The team's capacity over the last day, or why it is not shown.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Capacity {
    Available {
        concurrent_now: u64,
        concurrent_peak: u64,
        peak_at: Option<DateTime<Utc>>,
        /// Sandboxes started per minute, averaged over the window.
        start_rate_per_min: f64,
        start_rate_peak_per_min: f64,
        window_hours: i64,
    },
    Unavailable {
        reason: String,
    },
}

/// The blast-radius guard's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Guard {
    /// The configured share (0..=1).
    pub limit: f64,
    /// Sandboxes recommended for snapshot-then-kill or kill.
    pub kill_count: usize,
    /// Their share of the fleet.
    pub share: f64,
    /// True when `share > limit`: kill cases are held for review.
    pub tripped: bool,
}

/// One idle sandbox, with what Steward recommends and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct IdleSandbox {
    pub id: SandboxId,
    /// The template's alias, or its id when it has none.
    pub template: String,
    pub template_id: TemplateId,
    pub state: RunState,
    pub started_at: DateTime<Utc>,
    /// When its own timeout ends a running sandbox (`None` for a paused one, which has no end).
    pub ends_at: Option<DateTime<Utc>>,
    pub cpu_count: u32,
    pub memory_mb: u64,
    pub disk_size_mb: u64,
    pub metadata: BTreeMap<String, String>,
    pub owner: Option<String>,
    /// The Slack user to mention for `owner`, when one is known.
    pub owner_slack: Option<SlackUserId>,
    pub recommendation: Recommendation,
    pub reason: String,
    pub evidence: IdleEvidence,
}

/// An idle-looking sandbox that was not raised, and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ExemptSandbox {
    pub id: SandboxId,
    pub exemption: Exemption,
}

/// An idle-looking sandbox that already has an open case.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AlreadyOpen {
    pub id: SandboxId,
    pub case: CaseId,
}

/// What a live pass posted.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Posted {
    pub channel: String,
    pub digest_ts: String,
    /// Cases opened now.
    pub opened: Vec<CaseId>,
    /// Cases `open_case` found already open (a race with another opener).
    pub already_open: usize,
    /// Kill recommendations not opened because the blast-radius guard tripped.
    pub held_for_review: usize,
    /// Over `max_cases_per_sweep`: left for the next pass.
    pub deferred: usize,
    /// Cases that could not be opened or posted.
    pub failed: usize,
    /// The list decision the idle sandboxes were put in, when the sweep posted one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub list: Option<ListId>,
}

/// Everything one pass found (and, when live, did).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SweepReport {
    pub mode: SweepMode,
    pub at: DateTime<Utc>,
    pub fleet: FleetCounts,
    pub pages: u32,
    /// Set when paging stopped before E2B said the list was complete.
    pub listing_incomplete: Option<String>,
    pub counts: Counts,
    /// What the idle sandboxes cost per day, in US dollars.
    pub idle_cost_per_day_usd: f64,
    pub capacity: Capacity,
    pub guard: Guard,
    /// Most expensive per day first; at equal cost (paused sandboxes often cost nothing), the
    /// most disk first.
    pub idle: Vec<IdleSandbox>,
    /// The idle list as a person approves it: by owner and recommendation (`groups`).
    pub groups: Vec<super::groups::IdleGroup>,
    pub exempt: Vec<ExemptSandbox>,
    pub already_open: Vec<AlreadyOpen>,
    /// A few of the read failures, in words.
    pub problems: Vec<String>,
    /// E2B calls this pass made.
    pub e2b_calls: u64,
    pub posted: Option<Posted>,
}
