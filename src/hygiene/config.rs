//! `[hygiene]` in `steward.toml`: when the sweep runs, where it posts, how much it may raise,
//! who owns what, and the idle policy itself (`[hygiene.idle]`).
//!
//! Every value is checked while the file is read, so a bad cron expression or time zone stops
//! Steward at start-up with a sentence, not at 09:00 with a panic. This module must not read the
//! clock or talk to anything; [`Schedule`] answers "when" for a `now` it is given.
//!
//! ```toml
//! [hygiene]
//! schedule = "0 9 * * 1-5"      # cron, minute granularity
//! timezone = "Europe/Paris"
//! channel = "C0HYGIENE"          # else [channels] hygiene
//! kill_share_guard = 0.25
//! decide_within = "2d"
//! max_cases_per_sweep = 200
//! when_nothing_new = "one_line"  # or "nothing"
//! list_from = 25                 # from this many idle sandboxes, one list decision
//! list_concurrency = 8           # sandboxes an approved list acts on at once
//! max_exclude_for = "30d"        # the latest "don't raise again" date a person may set
//!
//! [hygiene.owners]
//! alice = "U0ALICE"
//!
//! [hygiene.idle]
//! cpu_threshold_pct = 2.0
//! idle_window = "1h"
//! paused_threshold = "3d"
//!
//! [hygiene.idle.templates.gpu]
//! idle_window = "30m"
//! ```
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, Utc};
use croner::Cron;
use serde::{Deserialize, Deserializer};

use super::policy::IdlePolicy;
use crate::ids::{SlackChannelId, SlackUserId};

/// The default schedule: every day at 09:00 (in [`HygieneConfig::timezone`]).
pub const DEFAULT_SCHEDULE: &str = "0 9 * * *";
/// Default share of the fleet above which kill recommendations are held back for review.
pub const DEFAULT_KILL_SHARE_GUARD: f64 = 0.25;
/// Time people get to decide a sweep's case when neither `[hygiene]` nor `[approvals]` says.
pub const DEFAULT_DECIDE_WITHIN: Duration = Duration::from_secs(2 * 86_400);
/// Default cap on cases one sweep opens; the rest wait for the next sweep.
pub const DEFAULT_MAX_CASES_PER_SWEEP: usize = 200;
/// From this many idle sandboxes to raise, a sweep posts one list decision instead of a card each.
pub const DEFAULT_LIST_FROM: usize = 25;
/// Sandboxes an approved list acts on at once (across replicas).
pub const DEFAULT_LIST_CONCURRENCY: usize = 8;
/// How far ahead a person may set a "don't raise again" date (an exclusion, a Leave): 30 days.
pub const DEFAULT_MAX_EXCLUDE_FOR: Duration = crate::approvals::list::DEFAULT_MAX_EXCLUDE_FOR;

/// Everything under `[hygiene]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HygieneConfig {
    /// When scheduled sweeps run: a five-field cron expression.
    pub schedule: Schedule,
    /// The time zone `schedule` is read in, e.g. `Europe/Paris`.
    #[serde(deserialize_with = "timezone")]
    pub timezone: chrono_tz::Tz,
    /// Where digests and cases go; falls back to `[channels] hygiene`.
    pub channel: Option<SlackChannelId>,
    /// When more than this share of the fleet would be recommended for kill, the digest asks
    /// for a review instead of opening those cases one by one.
    #[serde(deserialize_with = "share")]
    pub kill_share_guard: f64,
    /// A sweep's case is due this long after it opens; unset, `[approvals] decide_within`.
    #[serde(deserialize_with = "duration")]
    pub decide_within: Option<Duration>,
    /// Most cases one sweep opens (the most expensive idle sandboxes first).
    pub max_cases_per_sweep: usize,
    /// What a live sweep that finds nothing new to raise posts.
    pub when_nothing_new: WhenNothingNew,
    /// From this many idle sandboxes to raise, a live sweep posts one list decision (groups by
    /// owner and recommendation, approved a group at a time) instead of one card per sandbox.
    /// 0: always a list.
    pub list_from: usize,
    /// Sandboxes an approved list acts on at once.
    pub list_concurrency: usize,
    /// How long one list item's execution lease lasts (renewed before each step): how soon
    /// another replica takes over the sandboxes of one that died mid-list.
    #[serde(deserialize_with = "duration")]
    pub list_item_lease: Option<Duration>,
    /// How often an approved list's progress is rewritten on its digest (Slack paces
    /// `chat.update`).
    #[serde(deserialize_with = "duration")]
    pub list_progress_every: Option<Duration>,
    /// The longest a person may keep a sandbox out of sweeps: an exclusion from a list, or a
    /// Leave on a case, may not be dated later than this from now, and one without a date lasts
    /// this long. `steward check` lists the marks that last longer (made before the cap).
    #[serde(deserialize_with = "max_exclude_for")]
    pub max_exclude_for: Duration,
    /// Owner names found in metadata, mapped to the Slack users to mention.
    pub owners: BTreeMap<String, SlackUserId>,
    /// The idle policy: thresholds, per-template overrides, prices.
    pub idle: IdlePolicy,
}

impl Default for HygieneConfig {
    fn default() -> Self {
        Self {
            schedule: Schedule::default(),
            timezone: chrono_tz::UTC,
            channel: None,
            kill_share_guard: DEFAULT_KILL_SHARE_GUARD,
            decide_within: None,
            max_cases_per_sweep: DEFAULT_MAX_CASES_PER_SWEEP,
            when_nothing_new: WhenNothingNew::default(),
            list_from: DEFAULT_LIST_FROM,
            list_concurrency: DEFAULT_LIST_CONCURRENCY,
            list_item_lease: None,
            list_progress_every: None,
            max_exclude_for: DEFAULT_MAX_EXCLUDE_FOR,
            owners: BTreeMap::new(),
            idle: IdlePolicy::default(),
        }
    }
}

impl HygieneConfig {
    /// The hygiene channel: `[hygiene] channel`, else `[channels] hygiene` (which is checked
    /// here, since `[channels]` holds plain text).
    pub fn channel_or(&self, fallback: Option<&str>) -> Result<Option<SlackChannelId>, String> {
        if let Some(channel) = &self.channel {
            return Ok(Some(channel.clone()));
        }
        fallback
            .map(|c| {
                SlackChannelId::parse(c).map_err(|e| {
                    format!("[channels] hygiene in steward.toml is not a channel id: {e}")
                })
            })
            .transpose()
    }

    /// How approved lists are carried out.
    pub fn list_settings(&self) -> crate::approvals::list::ListSettings {
        let defaults = crate::approvals::list::ListSettings::default();
        crate::approvals::list::ListSettings {
            concurrency: self.list_concurrency.max(1),
            item_lease: self.list_item_lease.unwrap_or(defaults.item_lease),
            progress_every: self.list_progress_every.unwrap_or(defaults.progress_every),
            max_exclude_for: self.max_exclude_for,
        }
    }

    /// How long people have to decide a sweep's case.
    pub fn decide_within(&self) -> Duration {
        self.decide_within.unwrap_or(DEFAULT_DECIDE_WITHIN)
    }

    /// The Slack user to mention for an owner named in metadata: the `[hygiene.owners]` entry,
    /// or the owner itself when it already is a Slack user id.
    pub fn slack_user_for(&self, owner: &str) -> Option<SlackUserId> {
        if let Some(user) = self.owners.get(owner) {
            return Some(user.clone());
        }
        looks_like_slack_user(owner)
            .then(|| SlackUserId::parse(owner).ok())
            .flatten()
    }

    /// The latest scheduled time at or before `now`.
    pub fn latest_slot(&self, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.schedule.latest_at_or_before(now, self.timezone)
    }

    /// The first scheduled time after `now`.
    pub fn next_slot(&self, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.schedule.next_after(now, self.timezone)
    }
}

/// What a live sweep posts when it has no case to open, nothing held for review and nothing
/// it could not read: the channel needs no full digest then.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WhenNothingNew {
    /// A one-line digest: the fleet and idle counts.
    #[default]
    OneLine,
    /// No message at all.
    Nothing,
}

/// Slack user ids are `U` or `W` followed by upper-case letters and digits.
fn looks_like_slack_user(text: &str) -> bool {
    let mut chars = text.chars();
    matches!(chars.next(), Some('U' | 'W'))
        && (8..=15).contains(&text.len())
        && chars.all(|c| c.is_ascii_uppercase() || c.is_ascii_digit())
}

/// A parsed cron expression that remembers how it was written.
#[derive(Clone)]
pub struct Schedule {
    text: String,
    cron: Cron,
}

impl Schedule {
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The latest matching minute at or before `now`, read in `tz`.
    pub fn latest_at_or_before(
        &self,
        now: DateTime<Utc>,
        tz: chrono_tz::Tz,
    ) -> Option<DateTime<Utc>> {
        self.cron
            .find_previous_occurrence(&now.with_timezone(&tz), true)
            .ok()
            .map(|t| t.with_timezone(&Utc))
    }

    /// The first matching minute after `now`, read in `tz`.
    pub fn next_after(&self, now: DateTime<Utc>, tz: chrono_tz::Tz) -> Option<DateTime<Utc>> {
        self.cron
            .find_next_occurrence(&now.with_timezone(&tz), false)
            .ok()
            .map(|t| t.with_timezone(&Utc))
    }
}

impl FromStr for Schedule {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let text = text.trim();
        let cron = Cron::from_str(text).map_err(|e| {
            format!("{text:?} is not a cron expression like \"0 9 * * *\" (minute hour day month weekday): {e}")
        })?;
        Ok(Self {
            text: text.to_owned(),
            cron,
        })
    }
}

impl Default for Schedule {
    fn default() -> Self {
        DEFAULT_SCHEDULE
            .parse()
            .expect("the default schedule is valid")
    }
}

impl fmt::Debug for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Schedule({:?})", self.text)
    }
}

impl<'de> Deserialize<'de> for Schedule {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

fn timezone<'de, D: Deserializer<'de>>(d: D) -> Result<chrono_tz::Tz, D::Error> {
    let text = String::deserialize(d)?;
    text.trim().parse().map_err(|_| {
        serde::de::Error::custom(format!(
            "{text:?} is not a time zone name like \"UTC\" or \"Europe/Paris\""
        ))
    })
}

fn share<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    let value = f64::deserialize(d)?;
    if !(0.0..=1.0).contains(&value) {
        return Err(serde::de::Error::custom(format!(
            "{value} is not a share between 0.0 and 1.0"
        )));
    }
    Ok(value)
}

fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    let text = String::deserialize(d)?;
    let within =
        crate::duration::parse("hygiene.decide_within", &text).map_err(serde::de::Error::custom)?;
    if within.is_zero() {
        return Err(serde::de::Error::custom(
            "hygiene.decide_within must be longer than zero",
        ));
    }
    Ok(Some(within))
}

fn max_exclude_for<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let text = String::deserialize(d)?;
    let cap = crate::duration::parse("hygiene.max_exclude_for", &text)
        .map_err(serde::de::Error::custom)?;
    // Shorter than a day, no date could be picked at all (dates are whole days).
    if cap < Duration::from_secs(86_400) {
        return Err(serde::de::Error::custom(
            "hygiene.max_exclude_for must be at least a day (\"1d\"), since exclusions are dated by the day",
        ));
    }
    Ok(cap)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn parse(text: &str) -> Result<HygieneConfig, toml::de::Error> {
        toml::from_str(text)
    }

    #[test]
    fn defaults_sweep_every_day_at_nine_utc() {
        let c = HygieneConfig::default();
        let now = Utc.with_ymd_and_hms(2026, 3, 4, 8, 59, 0).unwrap();
        assert_eq!(
            c.latest_slot(now),
            Some(Utc.with_ymd_and_hms(2026, 3, 3, 9, 0, 0).unwrap())
        );
        assert_eq!(
            c.next_slot(now),
            Some(Utc.with_ymd_and_hms(2026, 3, 4, 9, 0, 0).unwrap())
        );
        let at_nine = Utc.with_ymd_and_hms(2026, 3, 4, 9, 0, 0).unwrap();
        assert_eq!(c.latest_slot(at_nine), Some(at_nine));
    }

    #[test]
    fn the_schedule_is_read_in_its_time_zone() {
        let c = parse("schedule = \"30 7 * * *\"\ntimezone = \"Europe/Paris\"\n").unwrap();
        // 07:30 in Paris in summer is 05:30 UTC.
        let now = Utc.with_ymd_and_hms(2026, 7, 1, 12, 0, 0).unwrap();
        assert_eq!(
            c.latest_slot(now),
            Some(Utc.with_ymd_and_hms(2026, 7, 1, 5, 30, 0).unwrap())
        );
    }

    #[test]
    fn bad_schedules_zones_shares_and_keys_are_refused_with_a_sentence() {
        let err = parse("schedule = \"every day\"\n").unwrap_err().to_string();
        assert!(err.contains("not a cron expression"), "{err}");
        let err = parse("timezone = \"Mars/Olympus\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("not a time zone"), "{err}");
        assert!(parse("kill_share_guard = 1.5\n").is_err());
        assert!(parse("decide_within = \"0s\"\n").is_err());
        assert_eq!(
            parse("decide_within = \"4d\"\n").unwrap().decide_within(),
            Duration::from_secs(4 * 86_400)
        );
        assert!(
            parse("cpu_threshold_pct = 3.0\n").is_err(),
            "idle knobs live in [hygiene.idle]"
        );
        assert!(parse("[idle]\ncpu_threshold = 3.0\n").is_err());
        assert!(parse("[owners]\nalice = \"not a user\"\n").is_err());
    }

    #[test]
    fn exclusions_are_capped_at_thirty_days_unless_said_otherwise_and_never_below_a_day() {
        assert_eq!(
            HygieneConfig::default().list_settings().max_exclude_for,
            Duration::from_secs(30 * 86_400)
        );
        let c = parse("max_exclude_for = \"90d\"\n").unwrap();
        assert_eq!(
            c.list_settings().max_exclude_for,
            Duration::from_secs(90 * 86_400)
        );
        let err = parse("max_exclude_for = \"2h\"\n").unwrap_err().to_string();
        assert!(err.contains("at least a day"), "{err}");
        assert!(parse("max_exclude_for = \"forever\"\n").is_err());
    }

    #[test]
    fn owners_map_to_slack_users_and_slack_ids_map_to_themselves() {
        let c =
            parse("[owners]\nalice = \"U0ALICE01\"\n[idle]\ncpu_threshold_pct = 3.0\n").unwrap();
        assert_eq!(c.idle.cpu_threshold_pct, 3.0);
        assert_eq!(c.slack_user_for("alice").unwrap().as_str(), "U0ALICE01");
        assert_eq!(c.slack_user_for("U0BOB0001").unwrap().as_str(), "U0BOB0001");
        assert_eq!(c.slack_user_for("bob"), None);
        assert_eq!(c.slack_user_for("Ubuntu"), None);
    }

    #[test]
    fn the_hygiene_channel_falls_back_to_the_channels_table() {
        let c = HygieneConfig::default();
        assert_eq!(
            c.channel_or(Some("C0HYG")).unwrap().unwrap().as_str(),
            "C0HYG"
        );
        assert!(
            c.channel_or(Some("#hygiene"))
                .unwrap_err()
                .contains("not a channel id")
        );
        let c = parse("channel = \"C0OWN\"\n").unwrap();
        assert_eq!(
            c.channel_or(Some("C0HYG")).unwrap().unwrap().as_str(),
            "C0OWN"
        );
        assert_eq!(HygieneConfig::default().channel_or(None), Ok(None));
    }
}
