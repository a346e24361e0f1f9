//! What E2B's lifecycle events leave in the store: each sandbox's recent lifecycle (for the
//! evidence of a case opened later), and for `[[watch]]` burst rules the recent creations of each
//! (rule, group) by time and the one alert list a burst grows while it is open, so replicas that
//! receive a burst's events count them together and never post a second alert for it.
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};

use super::{Store, StoreError};
use crate::ids::{ListId, SandboxId};

macro_rules! delegate {
    ($self:ident . $method:ident ( $($arg:expr),* )) => {
        match $self {
            Store::Redis(s) => s.$method($($arg),*).await,
            Store::Memory(s) => s.$method($($arg),*).await,
        }
    };
}

/// How long past a burst's window its creations are kept: events arrive late and out of order
/// (webhook retries, the poller's overlap), and a late one must still find its neighbours.
pub const BURST_SLACK: Duration = Duration::from_secs(15 * 60);

/// Lifecycle entries kept per sandbox (the newest).
pub const LIFECYCLE_KEPT: usize = 12;
/// How long a sandbox's lifecycle is kept after its last event: E2B keeps events 7 days.
pub const LIFECYCLE_TTL: Duration = Duration::from_secs(8 * 24 * 3600);
/// After a `killed` event: no case will be opened for it any more.
pub const LIFECYCLE_TTL_ENDED: Duration = Duration::from_secs(3600);

/// What [`Store::take_event`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TakenEvent {
    /// Taken before (a retried or late delivery, or the poller's overlap).
    Repeat,
    /// Taken now; `case_open` when the sandbox had an open case at that moment.
    New { case_open: bool },
}

impl Store {
    /// Takes E2B lifecycle event `event` (its id) about `sandbox`, by webhook or poll: the first
    /// time, marks it taken for `mark_ttl`, appends it (`created`, `paused`, ... at `at`) to the
    /// sandbox's recent history and says whether the sandbox has an open case; a repeat changes
    /// nothing. One round trip: most events are about sandboxes without a case, and for them
    /// this is all the work there is.
    pub async fn take_event(
        &self,
        sandbox: &SandboxId,
        event: &str,
        at: DateTime<Utc>,
        kind: &str,
        mark_ttl: Duration,
    ) -> Result<TakenEvent, StoreError> {
        let lifecycle_ttl = if kind == "killed" {
            LIFECYCLE_TTL_ENDED
        } else {
            LIFECYCLE_TTL
        };
        let entry = format!("{} {kind}", at.timestamp_millis());
        let taken: Option<bool> =
            delegate!(self.take_event(sandbox.as_str(), event, &entry, mark_ttl, lifecycle_ttl))?;
        Ok(match taken {
            None => TakenEvent::Repeat,
            Some(case_open) => TakenEvent::New { case_open },
        })
    }

    /// Forgets that `event` was taken (its work failed), so the next delivery or poll takes it
    /// again. Its lifecycle entry stays: taking it again does not add it twice.
    pub async fn forget_event(&self, sandbox: &SandboxId, event: &str) -> Result<(), StoreError> {
        delegate!(self.forget_event(sandbox.as_str(), event))
    }

    /// `sandbox`'s recent lifecycle, oldest first.
    pub async fn lifecycle_of(
        &self,
        sandbox: &SandboxId,
    ) -> Result<Vec<(DateTime<Utc>, String)>, StoreError> {
        let raw: Vec<String> = delegate!(self.lifecycle_of(sandbox.as_str()))?;
        let mut entries: Vec<(DateTime<Utc>, String)> = raw
            .iter()
            .filter_map(|e| {
                let (ms, kind) = e.split_once(' ')?;
                Some((
                    Utc.timestamp_millis_opt(ms.parse().ok()?).single()?,
                    kind.to_owned(),
                ))
            })
            .collect();
        // Events arrive out of order; shown by when they happened.
        entries.sort();
        entries.dedup();
        Ok(entries)
    }

    /// Records that `sandbox` was created at `at` in `group` of burst rule `rule`, and returns
    /// the creations recorded within `within` either side of `at` (this one included), by time.
    /// Recording the same sandbox twice keeps one entry.
    pub async fn record_creation(
        &self,
        rule: &str,
        group: &str,
        sandbox: &SandboxId,
        at: DateTime<Utc>,
        within: Duration,
    ) -> Result<Vec<(SandboxId, DateTime<Utc>)>, StoreError> {
        let window_ms = i64::try_from(within.as_millis()).unwrap_or(i64::MAX / 4);
        let keep_ms = window_ms.saturating_mul(2) + BURST_SLACK.as_millis() as i64;
        let at_ms = at.timestamp_millis();
        let raw: Vec<(String, i64)> = delegate!(self.record_creation(
            rule,
            group,
            sandbox.as_str(),
            at_ms,
            at_ms - window_ms,
            at_ms + window_ms,
            keep_ms
        ))?;
        Ok(raw
            .into_iter()
            .filter_map(|(id, ms)| {
                Some((
                    SandboxId::parse(&id).ok()?,
                    Utc.timestamp_millis_opt(ms).single()?,
                ))
            })
            .collect())
    }

    /// The open alert of (`rule`, `group`): the one already recorded, or `candidate`, which is
    /// then recorded for `ttl`. Two replicas asking at once get the same answer.
    pub async fn burst_alert(
        &self,
        rule: &str,
        group: &str,
        candidate: &ListId,
        ttl: Duration,
    ) -> Result<ListId, StoreError> {
        let id: String = delegate!(self.burst_alert(rule, group, candidate.as_str(), ttl))?;
        ListId::parse(&id).map_err(|_| StoreError::Corrupt(format!("burst alert id {id:?}")))
    }

    /// Replaces the alert of (`rule`, `group`) by `next` if it is still `current` (a decided
    /// alert does not grow: the burst's next creations start a new one). Returns the alert now
    /// recorded.
    pub async fn replace_burst_alert(
        &self,
        rule: &str,
        group: &str,
        current: &ListId,
        next: &ListId,
        ttl: Duration,
    ) -> Result<ListId, StoreError> {
        let id: String =
            delegate!(self.replace_burst_alert(rule, group, current.as_str(), next.as_str(), ttl))?;
        ListId::parse(&id).map_err(|_| StoreError::Corrupt(format!("burst alert id {id:?}")))
    }
}
