//! The idle policy: which sandboxes are idle, what to recommend for each, and what they cost.
//!
//! Everything here is pure: it takes what the sweep observed and the clock, and returns a verdict
//! with its reasons in words. It must not call E2B, Redis or Slack, so every rule is unit-tested
//! with small tables.
use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, NaiveDate, Utc};
use serde::{Deserialize, Serialize};

use crate::slack::format;

/// Thresholds for one template (or the defaults).
#[derive(Debug, Clone, PartialEq)]
pub struct Thresholds {
    /// A running sandbox is idle while its CPU stays under this share (percent).
    pub cpu_threshold_pct: f64,
    /// ...over this window.
    pub idle_window: Duration,
    /// Disk growth over the window above this many bytes counts as activity.
    pub disk_growth_bytes: u64,
    /// A paused sandbox is idle once paused longer than this.
    pub paused_threshold: Duration,
    /// Paused longer than this with little on disk: recommend a plain kill.
    pub paused_kill_after: Duration,
    /// Disk used at or above this is worth keeping in a snapshot.
    pub significant_disk_bytes: u64,
}

impl Default for Thresholds {
    fn default() -> Self {
        Self {
            cpu_threshold_pct: 2.0,
            idle_window: Duration::from_secs(3600),
            disk_growth_bytes: 16 * 1024 * 1024,
            paused_threshold: Duration::from_secs(3 * 86_400),
            paused_kill_after: Duration::from_secs(30 * 86_400),
            significant_disk_bytes: 512 * 1024 * 1024,
        }
    }
}

/// Per-template overrides: any field left out keeps the default.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ThresholdOverrides {
    pub cpu_threshold_pct: Option<f64>,
    #[serde(with = "humantime_serde_compat::option")]
    pub idle_window: Option<Duration>,
    pub disk_growth_bytes: Option<u64>,
    #[serde(with = "humantime_serde_compat::option")]
    pub paused_threshold: Option<Duration>,
    #[serde(with = "humantime_serde_compat::option")]
    pub paused_kill_after: Option<Duration>,
    pub significant_disk_bytes: Option<u64>,
}

/// Prices used for the cost estimate (US dollars).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Prices {
    pub vcpu_hour: f64,
    pub memory_gib_hour: f64,
    /// What keeping a paused sandbox's disk costs.
    pub paused_disk_gib_hour: f64,
}

impl Default for Prices {
    fn default() -> Self {
        // E2B's published usage prices: $0.000014 per vCPU-second and $0.0000045 per GiB-second.
        Self {
            vcpu_hour: 0.000014 * 3600.0,
            memory_gib_hour: 0.0000045 * 3600.0,
            paused_disk_gib_hour: 0.0,
        }
    }
}

/// The whole idle policy, as configured under `[hygiene.idle]` in `steward.toml`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct IdlePolicy {
    /// The default thresholds, written at the top of `[hygiene.idle]`.
    pub cpu_threshold_pct: f64,
    #[serde(with = "humantime_serde_compat")]
    pub idle_window: Duration,
    pub disk_growth_bytes: u64,
    #[serde(with = "humantime_serde_compat")]
    pub paused_threshold: Duration,
    #[serde(with = "humantime_serde_compat")]
    pub paused_kill_after: Duration,
    pub significant_disk_bytes: u64,
    /// Sandboxes younger than this are never raised.
    #[serde(with = "humantime_serde_compat")]
    pub grace_period: Duration,
    /// A running sandbox whose own timeout ends it sooner than this is left alone.
    #[serde(with = "humantime_serde_compat")]
    pub expires_soon: Duration,
    /// Metadata key whose value (a date, `YYYY-MM-DD`, or `forever`) exempts a sandbox.
    pub keep_key: String,
    /// Metadata keys that name the owner, in order of preference.
    pub owner_keys: Vec<String>,
    pub prices: Prices,
    pub templates: BTreeMap<String, ThresholdOverrides>,
}

impl Default for IdlePolicy {
    fn default() -> Self {
        let t = Thresholds::default();
        Self {
            cpu_threshold_pct: t.cpu_threshold_pct,
            idle_window: t.idle_window,
            disk_growth_bytes: t.disk_growth_bytes,
            paused_threshold: t.paused_threshold,
            paused_kill_after: t.paused_kill_after,
            significant_disk_bytes: t.significant_disk_bytes,
            grace_period: Duration::from_secs(30 * 60),
            expires_soon: Duration::from_secs(15 * 60),
            keep_key: "steward.keep".to_owned(),
            owner_keys: vec![
                "steward.owner".to_owned(),
                "owner".to_owned(),
                "user".to_owned(),
            ],
            prices: Prices::default(),
            templates: BTreeMap::new(),
        }
    }
}

impl IdlePolicy {
    /// The thresholds that apply to `template`.
    pub fn thresholds_for(&self, template: &str) -> Thresholds {
        let mut t = Thresholds {
            cpu_threshold_pct: self.cpu_threshold_pct,
            idle_window: self.idle_window,
            disk_growth_bytes: self.disk_growth_bytes,
            paused_threshold: self.paused_threshold,
            paused_kill_after: self.paused_kill_after,
            significant_disk_bytes: self.significant_disk_bytes,
        };
        if let Some(o) = self.templates.get(template) {
            t.cpu_threshold_pct = o.cpu_threshold_pct.unwrap_or(t.cpu_threshold_pct);
            t.idle_window = o.idle_window.unwrap_or(t.idle_window);
            t.disk_growth_bytes = o.disk_growth_bytes.unwrap_or(t.disk_growth_bytes);
            t.paused_threshold = o.paused_threshold.unwrap_or(t.paused_threshold);
            t.paused_kill_after = o.paused_kill_after.unwrap_or(t.paused_kill_after);
            t.significant_disk_bytes = o.significant_disk_bytes.unwrap_or(t.significant_disk_bytes);
        }
        t
    }

    /// The owner named by `metadata`, if any.
    pub fn owner(&self, metadata: &BTreeMap<String, String>) -> Option<String> {
        self.owner_keys
            .iter()
            .find_map(|k| metadata.get(k).filter(|v| !v.trim().is_empty()).cloned())
    }
}

/// Whether a sandbox is running or paused, as listed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunState {
    Running,
    Paused,
}

/// One metrics sample.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Sample {
    pub at: DateTime<Utc>,
    pub cpu_pct: f64,
    pub mem_used: u64,
    pub mem_total: u64,
    pub disk_used: u64,
    pub disk_total: u64,
}

/// What the sweep saw of one sandbox.
#[derive(Debug, Clone)]
pub struct Observed {
    pub id: String,
    pub template: String,
    pub state: RunState,
    pub started_at: DateTime<Utc>,
    /// For running sandboxes the expiry; for paused ones the time of the pause.
    pub end_at: DateTime<Utc>,
    pub cpu_count: u32,
    pub memory_mb: u64,
    pub disk_size_mb: u64,
    pub metadata: BTreeMap<String, String>,
}

/// Why a sandbox is not raised although it may look idle.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Exemption {
    /// The metadata says to keep it.
    KeepUntil { until: String },
    /// Someone decided to leave it, until this time.
    LeftUntil { until: Option<DateTime<Utc>> },
    /// Younger than the grace period.
    TooYoung,
}

/// What to do with an idle sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Recommendation {
    Pause,
    SnapshotThenKill,
    Kill,
    Leave,
}

impl Recommendation {
    pub fn label(self) -> &'static str {
        match self {
            Self::Pause => "Pause",
            Self::SnapshotThenKill => "Snapshot, then kill",
            Self::Kill => "Kill",
            Self::Leave => "Leave",
        }
    }

    /// Whether the recommendation destroys the sandbox.
    pub fn is_kill(self) -> bool {
        matches!(self, Self::SnapshotThenKill | Self::Kill)
    }
}

/// The figures a recommendation rests on, shown on the case card.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct IdleEvidence {
    pub window_start: Option<DateTime<Utc>>,
    pub window_end: Option<DateTime<Utc>>,
    pub samples: usize,
    pub cpu_p95_pct: Option<f64>,
    pub cpu_max_pct: Option<f64>,
    /// The newest sample's CPU.
    pub cpu_latest_pct: Option<f64>,
    pub mem_used: Option<u64>,
    pub mem_total: Option<u64>,
    pub disk_used: Option<u64>,
    pub disk_total: Option<u64>,
    pub disk_growth: Option<i64>,
    pub idle_since: Option<DateTime<Utc>>,
    pub paused_since: Option<DateTime<Utc>>,
    pub owner: Option<String>,
    pub cost_per_day_usd: f64,
}

/// The verdict on one sandbox.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum Assessment {
    /// Working, or paused only briefly: nothing to raise.
    Active { reason: String },
    /// Idle-looking but exempt.
    Exempt { exemption: Exemption },
    /// Idle: raise a case.
    Idle {
        recommendation: Recommendation,
        reason: String,
        evidence: Box<IdleEvidence>,
    },
}

/// Whether a running sandbox's latest sample makes it worth reading a metrics window for.
/// Paused sandboxes are judged by their pause time alone.
pub fn is_candidate(
    policy: &IdlePolicy,
    seen: &Observed,
    latest: Option<&Sample>,
    now: DateTime<Utc>,
) -> bool {
    let t = policy.thresholds_for(&seen.template);
    match seen.state {
        RunState::Paused => now - seen.end_at >= chrono_duration(t.paused_threshold),
        RunState::Running => {
            now - seen.started_at >= chrono_duration(t.idle_window)
                && latest.is_some_and(|s| s.cpu_pct < t.cpu_threshold_pct)
        }
    }
}

/// The exemption that applies to `seen`, if any. `left_until` is the until-date of an
/// unexpired Leave decision (`Some(None)` for a Leave without a date).
pub fn exemption(
    policy: &IdlePolicy,
    seen: &Observed,
    left_until: Option<Option<DateTime<Utc>>>,
    now: DateTime<Utc>,
) -> Option<Exemption> {
    if let Some(value) = seen.metadata.get(&policy.keep_key) {
        let value = value.trim();
        let keep = match NaiveDate::parse_from_str(value, "%Y-%m-%d") {
            Ok(date) => date >= now.date_naive(),
            // Anything that is not a date (e.g. "forever", "true") keeps it indefinitely.
            Err(_) => !value.is_empty(),
        };
        if keep {
            return Some(Exemption::KeepUntil {
                until: value.to_owned(),
            });
        }
    }
    if let Some(until) = left_until
        && until.is_none_or(|u| u > now)
    {
        return Some(Exemption::LeftUntil { until });
    }
    if now - seen.started_at < chrono_duration(policy.grace_period) {
        return Some(Exemption::TooYoung);
    }
    None
}

/// Judges one sandbox from its metric window (oldest first; may be empty for paused ones).
pub fn assess(
    policy: &IdlePolicy,
    seen: &Observed,
    window: &[Sample],
    left_until: Option<Option<DateTime<Utc>>>,
    now: DateTime<Utc>,
) -> Assessment {
    let t = policy.thresholds_for(&seen.template);
    let mut evidence = evidence_from(policy, seen, window);
    match seen.state {
        RunState::Paused => {
            let paused_for = now - seen.end_at;
            if paused_for < chrono_duration(t.paused_threshold) {
                return Assessment::Active {
                    reason: format!("paused for {} only", human(paused_for)),
                };
            }
            if let Some(exemption) = exemption(policy, seen, left_until, now) {
                return Assessment::Exempt { exemption };
            }
            evidence.paused_since = Some(seen.end_at);
            // Paused sandboxes report no fresh samples; the disk size they hold is their allocation.
            let disk = evidence
                .disk_used
                .unwrap_or(seen.disk_size_mb * 1024 * 1024);
            let (recommendation, reason) = if paused_for >= chrono_duration(t.paused_kill_after)
                && disk < t.significant_disk_bytes
            {
                (
                    Recommendation::Kill,
                    format!(
                        "Paused for {} with only {} on disk: nothing worth a snapshot.",
                        human(paused_for),
                        bytes(disk)
                    ),
                )
            } else {
                (
                    Recommendation::SnapshotThenKill,
                    format!(
                        "Paused for {} (over {}): a snapshot keeps its state as a template, and the kill frees its disk.",
                        human(paused_for),
                        human(chrono_duration(t.paused_threshold)),
                    ),
                )
            };
            Assessment::Idle {
                recommendation,
                reason,
                evidence: Box::new(evidence),
            }
        }
        RunState::Running => {
            let window_needed = chrono_duration(t.idle_window);
            let Some(first) = window.first() else {
                return Assessment::Active {
                    reason: "no metrics yet".to_owned(),
                };
            };
            let last = window.last().unwrap_or(first);
            if last.at - first.at < window_needed - chrono::Duration::minutes(5) {
                return Assessment::Active {
                    reason: format!(
                        "only {} of metrics, {} needed",
                        human(last.at - first.at),
                        human(window_needed)
                    ),
                };
            }
            let busy = window.iter().any(|s| s.cpu_pct >= t.cpu_threshold_pct);
            let growth = last.disk_used as i64 - first.disk_used as i64;
            if busy {
                return Assessment::Active {
                    reason: format!("CPU reached {:.1} %", evidence.cpu_max_pct.unwrap_or(0.0)),
                };
            }
            if growth > t.disk_growth_bytes as i64 {
                return Assessment::Active {
                    reason: format!("disk grew by {}", bytes(growth as u64)),
                };
            }
            if let Some(exemption) = exemption(policy, seen, left_until, now) {
                return Assessment::Exempt { exemption };
            }
            evidence.idle_since = Some(idle_since(window, t.cpu_threshold_pct));
            let expires_in = seen.end_at - now;
            let (recommendation, reason) = if expires_in <= chrono_duration(policy.expires_soon) {
                (
                    Recommendation::Leave,
                    format!(
                        "Idle, but its own timeout ends it in {}.",
                        human(expires_in.max(chrono::Duration::zero()))
                    ),
                )
            } else {
                (
                    Recommendation::Pause,
                    format!(
                        "CPU under {} % for {}: pausing is reversible and keeps memory.",
                        t.cpu_threshold_pct,
                        human(last.at - first.at),
                    ),
                )
            };
            Assessment::Idle {
                recommendation,
                reason,
                evidence: Box::new(evidence),
            }
        }
    }
}

/// Estimated cost per day of keeping the sandbox as it is.
pub fn cost_per_day(prices: &Prices, seen: &Observed) -> f64 {
    let gib = |mb: u64| mb as f64 / 1024.0;
    let per_hour = match seen.state {
        RunState::Running => {
            seen.cpu_count as f64 * prices.vcpu_hour + gib(seen.memory_mb) * prices.memory_gib_hour
        }
        RunState::Paused => gib(seen.disk_size_mb) * prices.paused_disk_gib_hour,
    };
    per_hour * 24.0
}

fn evidence_from(policy: &IdlePolicy, seen: &Observed, window: &[Sample]) -> IdleEvidence {
    let mut cpu: Vec<f64> = window.iter().map(|s| s.cpu_pct).collect();
    cpu.sort_by(f64::total_cmp);
    let last = window.last();
    IdleEvidence {
        window_start: window.first().map(|s| s.at),
        window_end: last.map(|s| s.at),
        samples: window.len(),
        cpu_p95_pct: percentile(&cpu, 0.95),
        cpu_max_pct: cpu.last().copied(),
        cpu_latest_pct: last.map(|s| s.cpu_pct),
        mem_used: last.map(|s| s.mem_used),
        mem_total: last.map(|s| s.mem_total),
        disk_used: last.map(|s| s.disk_used),
        disk_total: last.map(|s| s.disk_total),
        disk_growth: window
            .first()
            .zip(last)
            .map(|(a, b)| b.disk_used as i64 - a.disk_used as i64),
        idle_since: None,
        paused_since: None,
        owner: policy.owner(&seen.metadata),
        cost_per_day_usd: cost_per_day(&policy.prices, seen),
    }
}

/// The start of the trailing run of samples under the threshold.
fn idle_since(window: &[Sample], threshold: f64) -> DateTime<Utc> {
    let mut since = window.last().map(|s| s.at).unwrap_or_default();
    for s in window.iter().rev() {
        if s.cpu_pct >= threshold {
            break;
        }
        since = s.at;
    }
    since
}

/// Nearest-rank percentile of sorted values.
fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    Some(sorted[rank - 1])
}

fn chrono_duration(d: Duration) -> chrono::Duration {
    chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX)
}

/// `3 d 4 h`, `2 h 5 min`, `45 min`, `30 s`: the one way Steward writes a duration.
pub fn human(d: chrono::Duration) -> String {
    format::human_duration(d.to_std().unwrap_or_default())
}

/// `1.5 GiB`, `300 MiB`, `12 KiB`: the one way Steward writes a size.
pub fn bytes(n: u64) -> String {
    format::human_bytes(n)
}

/// Serde helpers for durations written as `90s`, `1h`, `3d` in `steward.toml`.
mod humantime_serde_compat {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(d)?;
        crate::duration::parse("duration", &text).map_err(serde::de::Error::custom)
    }

    pub mod option {
        use super::*;

        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
            let text: Option<String> = Option::deserialize(d)?;
            text.map(|t| crate::duration::parse("duration", &t))
                .transpose()
                .map_err(serde::de::Error::custom)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn now() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 12, 2, 9, 0, 0).unwrap()
    }

    fn sandbox(state: RunState, started_h_ago: i64, end_h: i64) -> Observed {
        Observed {
            id: "sbx1".into(),
            template: "base".into(),
            state,
            started_at: now() - chrono::Duration::hours(started_h_ago),
            end_at: now() + chrono::Duration::hours(end_h),
            cpu_count: 2,
            memory_mb: 1024,
            disk_size_mb: 4096,
            metadata: BTreeMap::new(),
        }
    }

    /// Samples every 5 minutes over the last `minutes`, CPU from `cpu(i)`, disk growing by `growth` per sample.
    fn window(minutes: i64, cpu: impl Fn(usize) -> f64, growth: u64) -> Vec<Sample> {
        (0..=(minutes / 5) as usize)
            .map(|i| Sample {
                at: now() - chrono::Duration::minutes(minutes)
                    + chrono::Duration::minutes(5 * i as i64),
                cpu_pct: cpu(i),
                mem_used: 300 << 20,
                mem_total: 1 << 30,
                disk_used: (1 << 30) + growth * i as u64,
                disk_total: 4 << 30,
            })
            .collect()
    }

    fn recommendation(a: &Assessment) -> Option<Recommendation> {
        match a {
            Assessment::Idle { recommendation, .. } => Some(*recommendation),
            _ => None,
        }
    }

    #[test]
    fn a_running_sandbox_under_the_threshold_for_the_window_is_paused() {
        let p = IdlePolicy::default();
        let a = assess(
            &p,
            &sandbox(RunState::Running, 5, 10),
            &window(60, |_| 0.5, 0),
            None,
            now(),
        );
        assert_eq!(recommendation(&a), Some(Recommendation::Pause), "{a:?}");
        let Assessment::Idle { evidence, .. } = a else {
            unreachable!()
        };
        assert_eq!(evidence.samples, 13);
        assert_eq!(evidence.cpu_p95_pct, Some(0.5));
        assert_eq!(
            evidence.idle_since,
            Some(now() - chrono::Duration::minutes(60))
        );
    }

    #[test]
    fn one_busy_sample_or_growing_disk_keeps_a_sandbox_active() {
        let p = IdlePolicy::default();
        let s = sandbox(RunState::Running, 5, 10);
        let spiky = assess(
            &p,
            &s,
            &window(60, |i| if i == 6 { 40.0 } else { 0.1 }, 0),
            None,
            now(),
        );
        assert!(matches!(spiky, Assessment::Active { .. }), "{spiky:?}");
        let writing = assess(&p, &s, &window(60, |_| 0.1, 64 << 20), None, now());
        assert!(matches!(writing, Assessment::Active { .. }), "{writing:?}");
    }

    #[test]
    fn a_window_shorter_than_configured_is_not_enough_evidence() {
        let p = IdlePolicy::default();
        let a = assess(
            &p,
            &sandbox(RunState::Running, 5, 10),
            &window(20, |_| 0.1, 0),
            None,
            now(),
        );
        assert!(matches!(a, Assessment::Active { .. }), "{a:?}");
        let none = assess(&p, &sandbox(RunState::Running, 5, 10), &[], None, now());
        assert!(matches!(none, Assessment::Active { .. }), "{none:?}");
    }

    #[test]
    fn an_idle_sandbox_about_to_time_out_is_left() {
        let p = IdlePolicy::default();
        let mut s = sandbox(RunState::Running, 5, 0);
        s.end_at = now() + chrono::Duration::minutes(5);
        let a = assess(&p, &s, &window(60, |_| 0.1, 0), None, now());
        assert_eq!(recommendation(&a), Some(Recommendation::Leave), "{a:?}");
    }

    #[test]
    fn paused_sandboxes_are_judged_by_pause_age_and_disk() {
        let p = IdlePolicy::default();
        // Paused 1 day: not yet.
        let recent = sandbox(RunState::Paused, 48, -24);
        assert!(matches!(
            assess(&p, &recent, &[], None, now()),
            Assessment::Active { .. }
        ));
        // Paused 5 days holding 4 GiB: snapshot then kill.
        let long = sandbox(RunState::Paused, 200, -5 * 24);
        assert_eq!(
            recommendation(&assess(&p, &long, &[], None, now())),
            Some(Recommendation::SnapshotThenKill)
        );
        // Paused 40 days with a tiny disk: kill.
        let mut ancient = sandbox(RunState::Paused, 1200, -40 * 24);
        ancient.disk_size_mb = 100;
        assert_eq!(
            recommendation(&assess(&p, &ancient, &[], None, now())),
            Some(Recommendation::Kill)
        );
    }

    #[test]
    fn keep_metadata_leave_decisions_and_youth_exempt() {
        let p = IdlePolicy::default();
        let mut kept = sandbox(RunState::Paused, 200, -5 * 24);
        kept.metadata
            .insert("steward.keep".into(), "2026-12-31".into());
        assert!(matches!(
            assess(&p, &kept, &[], None, now()),
            Assessment::Exempt { .. }
        ));
        kept.metadata
            .insert("steward.keep".into(), "2026-01-01".into());
        assert!(
            matches!(assess(&p, &kept, &[], None, now()), Assessment::Idle { .. }),
            "an expired keep date no longer exempts"
        );
        let long = sandbox(RunState::Paused, 200, -5 * 24);
        let left = Some(Some(now() + chrono::Duration::days(1)));
        assert!(matches!(
            assess(&p, &long, &[], left, now()),
            Assessment::Exempt { .. }
        ));
        let lapsed = Some(Some(now() - chrono::Duration::days(1)));
        assert!(matches!(
            assess(&p, &long, &[], lapsed, now()),
            Assessment::Idle { .. }
        ));
        let mut young = sandbox(RunState::Running, 0, 10);
        young.started_at = now() - chrono::Duration::minutes(10);
        assert_eq!(
            exemption(&p, &young, None, now()),
            Some(Exemption::TooYoung)
        );
    }

    #[test]
    fn template_overrides_replace_only_what_they_name() {
        let p: IdlePolicy = toml::from_str(
            "cpu_threshold_pct = 5.0\n[templates.gpu]\ncpu_threshold_pct = 1.0\nidle_window = \"30m\"\n",
        )
        .unwrap();
        assert_eq!(p.thresholds_for("base").cpu_threshold_pct, 5.0);
        let gpu = p.thresholds_for("gpu");
        assert_eq!(gpu.cpu_threshold_pct, 1.0);
        assert_eq!(gpu.idle_window, Duration::from_secs(1800));
        assert_eq!(gpu.paused_threshold, Duration::from_secs(3 * 86_400));
    }

    #[test]
    fn running_cost_counts_vcpus_and_memory() {
        let prices = Prices {
            vcpu_hour: 0.05,
            memory_gib_hour: 0.01,
            paused_disk_gib_hour: 0.001,
        };
        let s = sandbox(RunState::Running, 5, 10);
        assert!((cost_per_day(&prices, &s) - (2.0 * 0.05 + 1.0 * 0.01) * 24.0).abs() < 1e-9);
        let paused = sandbox(RunState::Paused, 5, -1);
        assert!((cost_per_day(&prices, &paused) - 4.0 * 0.001 * 24.0).abs() < 1e-9);
    }

    #[test]
    fn candidates_need_a_quiet_latest_sample_or_a_long_pause() {
        let p = IdlePolicy::default();
        let s = sandbox(RunState::Running, 5, 10);
        let quiet = window(0, |_| 0.2, 0);
        let busy = window(0, |_| 50.0, 0);
        assert!(is_candidate(&p, &s, quiet.first(), now()));
        assert!(!is_candidate(&p, &s, busy.first(), now()));
        assert!(!is_candidate(&p, &s, None, now()));
        assert!(is_candidate(
            &p,
            &sandbox(RunState::Paused, 200, -5 * 24),
            None,
            now()
        ));
    }

    #[test]
    fn durations_and_sizes_read_like_a_person_wrote_them() {
        assert_eq!(human(chrono::Duration::minutes(125)), "2 h 5 min");
        assert_eq!(human(chrono::Duration::hours(76)), "3 d 4 h");
        assert_eq!(bytes(3 << 29), "1.5 GiB");
    }
}
