//! Steward's durable state behind one cheap-to-clone [`Store`]: cases, the job queue, step
//! logs, deduplication marks, leases and the audit log.
//!
//! Two backends answer the same methods: Redis (production, several replicas) and an in-memory
//! one (one process, no Redis). One test suite runs against
//! both. Case writes are compare-and-swap on a `version`, so of many concurrent deciders exactly
//! one wins and the others get the current case back.
//!
//! This is the only module that knows Redis keys and scripts. It must not decide policy: which
//! transition is legal is `cases::apply`'s business, passed in as a closure.
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::cases::{self, Card, Case, DecisionOption, Event, Subject, TransitionError};
use crate::ids::{CaseId, RunId, SlackUserId};

pub mod keys;
mod lists;
mod memory;
pub mod push_tests;
mod redis;
mod settings;
mod wake;
pub mod watch;
pub use lists::ListUpdated;
pub use push_tests::{FailingPush, PushTest};
pub use settings::RedisSettings;

pub use memory::MemoryStore;
pub use redis::RedisStore;
pub use wake::RunWatch;
pub use watch::TakenEvent;

/// How many times [`Store::update_case`] re-reads and re-applies after losing a race before it
/// gives up with [`StoreError::Conflict`]. Each retry means another writer made progress.
pub const MAX_UPDATE_ATTEMPTS: usize = 64;
/// How long the record of a scheduled sweep's digest is kept: well past any takeover of its slot.
pub const SWEEP_DIGEST_TTL: std::time::Duration = std::time::Duration::from_secs(7 * 24 * 3600);

/// Why a store operation failed. Callers show `Unavailable` as "Steward can't reach its
/// database" and everything else as an internal error.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    #[error("Steward can't reach its database (Redis): {0}")]
    Unavailable(String),
    #[error("conflicting update: {0}")]
    Conflict(String),
    #[error("stored data could not be decoded: {0}")]
    Corrupt(String),
    #[error("{0} was not found")]
    NotFound(String),
    #[error("the database refused a command: {0}")]
    Backend(String),
    #[error("invalid store settings: {0}")]
    Invalid(String),
    /// A write was sent but its answer was lost, and reading it back failed too: it may or may
    /// not have happened. Never reported as "nothing was done".
    #[error("Steward could not confirm the write (its database stopped answering): {0}")]
    Unconfirmed(String),
}

/// What a click finds (see [`Store::first_click`]).
#[derive(Debug, Clone, PartialEq)]
pub enum FirstClick {
    /// The same click was seen within its time to live: Slack's redelivery, not a new click.
    Repeat,
    /// A first click, on a case that does not exist (any more).
    Missing,
    /// A first click, and the case as it is now.
    Case(Box<Case>),
}

/// The result of [`Store::open_case`].
#[derive(Debug, Clone, PartialEq)]
pub enum Opened {
    /// The case was stored (with version 1).
    Created(Case),
    /// The subject already had an open case; nothing was written. This is that case.
    Existing(Case),
}

impl Opened {
    pub fn case(&self) -> &Case {
        match self {
            Opened::Created(c) | Opened::Existing(c) => c,
        }
    }
}

/// The result of [`Store::update_case`].
#[derive(Debug, Clone, PartialEq)]
pub enum Updated {
    /// The change was written; this is the stored case (version bumped).
    Applied(Case),
    /// The change did not apply to the current case (for example, someone else decided
    /// first). Nothing was written; `current` is what is stored now.
    Rejected {
        current: Case,
        error: TransitionError,
    },
}

/// One unit of queued work, stored as JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Job {
    /// Carry out a decided case. `attempt` matches the case's attempt (grows on Retry).
    RunDecision {
        case_id: CaseId,
        option: DecisionOption,
        attempt: u32,
    },
    /// Carry out a governed run (see `runs`): create its sandbox, run its command, hand over.
    Run { run_id: RunId },
    /// Start a sandbox again from the snapshot a case's Snapshot, then kill took.
    Restore { case_id: CaseId },
}

/// Which queue a job waits in. Each lane is a stream of its own with its own workers, so a
/// person's decision never waits behind runs that hold their workers for minutes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Lane {
    /// Decided cases and restores: short steps a person is waiting for.
    Decisions,
    /// Governed runs and push tests: each holds its worker for the whole run.
    Runs,
}

impl Lane {
    pub const ALL: [Lane; 2] = [Lane::Decisions, Lane::Runs];

    /// The metrics label and the name in logs and settings.
    pub fn as_str(self) -> &'static str {
        match self {
            Lane::Decisions => "decisions",
            Lane::Runs => "runs",
        }
    }
}

impl Job {
    /// The lane this job waits in.
    pub fn lane(&self) -> Lane {
        match self {
            Job::RunDecision { .. } | Job::Restore { .. } => Lane::Decisions,
            Job::Run { .. } => Lane::Runs,
        }
    }

    /// The case a decision job carries out; `None` for other jobs.
    pub fn case_id(&self) -> Option<&CaseId> {
        match self {
            Job::RunDecision { case_id, .. } => Some(case_id),
            Job::Run { .. } | Job::Restore { .. } => None,
        }
    }
}

/// A run's record as stored: its JSON (only `runs` reads it, so `store` need not know the
/// type), its version for compare-and-swap, and the output counters kept beside it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredRun {
    pub json: String,
    pub version: u64,
    /// Output bytes the run produced in all.
    pub output_total: u64,
    /// Output bytes kept (at most the cap given to [`Store::append_run_output`]).
    pub output_kept: u64,
}

/// What [`Store::append_run_output`] left behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutputCount {
    pub kept: u64,
    pub total: u64,
}

/// A queue entry's id: its lane and its entry there (a Redis stream id such as
/// `1700000000000-0`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct JobId {
    pub lane: Lane,
    pub entry: String,
}

impl std::fmt::Display for JobId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.lane.as_str(), self.entry)
    }
}

/// The queue at one moment: jobs not yet acknowledged (waiting or being worked on), when the
/// oldest of them was enqueued, and when the oldest job no worker has taken yet was enqueued
/// (a governed run holds its job for its whole length, so only the latter says that nobody is
/// taking jobs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueStats {
    pub depth: u64,
    pub oldest_enqueued_at: Option<DateTime<Utc>>,
    pub oldest_waiting_at: Option<DateTime<Utc>>,
}

/// A job handed to one consumer, which must [`Store::ack`] it when finished. Until then it
/// stays pending and another consumer may take it over with [`Store::reclaim_stale`].
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimedJob {
    pub id: JobId,
    pub job: Job,
    /// How many times it has been handed out, this time included.
    pub deliveries: u64,
}

/// Who did something recorded in the audit log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Actor {
    Person {
        user: SlackUserId,
    },
    /// A part of Steward acting on its own (`sweep`, `worker`, `expiry`, ...).
    Steward {
        part: String,
    },
    /// An agent or script through the API or MCP, by its token's name.
    Agent {
        name: String,
    },
}

/// One line of the append-only audit log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditEvent {
    pub time: DateTime<Utc>,
    pub case: Option<CaseId>,
    pub subject: Option<Subject>,
    pub actor: Actor,
    /// What was attempted, e.g. `decide:kill`, `step:snapshot`, `expire`.
    pub action: String,
    /// What came of it, e.g. `ok`, `refused: not an approver`, `snapshot team/x:1`.
    pub outcome: String,
}

/// A person's Leave (or Keep) decision on a subject, kept after its case closed so that sweeps
/// do not raise the subject again before `until` (`None`: no end date).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeftMark {
    pub case: CaseId,
    pub until: Option<DateTime<Utc>>,
    pub at: DateTime<Utc>,
}

/// How long a Leave mark is kept: until its end date (plus a day, so a sweep right at the end
/// still sees why it was exempt), or the case retention when it has none.
pub(crate) fn left_mark_ttl(mark: &LeftMark, now: DateTime<Utc>) -> Duration {
    match mark.until {
        Some(until) => (until - now + chrono::Duration::days(1))
            .to_std()
            .unwrap_or(Duration::from_secs(60))
            .max(Duration::from_secs(60)),
        None => keys::CASE_RETENTION,
    }
}

/// One entry of a sharded index (`due` or `decided`), as read: enough to drop or move exactly
/// this entry later (score-checked), whichever shard it lives in.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct IndexEntry {
    pub id: CaseId,
    pub at: DateTime<Utc>,
    pub shard: u16,
}

/// The Leave mark a case write records, if the case becomes Left with it.
fn left_mark_between(before: &Case, after: &Case) -> Option<LeftMark> {
    let cases::CaseState::Left { until, at, .. } = &after.state else {
        return None;
    };
    if matches!(before.state, cases::CaseState::Left { .. }) {
        return None;
    }
    Some(LeftMark {
        case: after.id.clone(),
        until: *until,
        at: *at,
    })
}

/// A bounded slice of one subject's audit events, from [`Store::recent_audit`].
#[derive(Debug, Clone, PartialEq)]
pub struct AuditSlice {
    /// The latest matching events, oldest first.
    pub events: Vec<AuditEvent>,
    /// How many matching events the store still holds (at least `events.len()`).
    pub total: usize,
}

/// Where [`Store::audit_page`] continues from (opaque).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditCursor(pub(crate) String);

/// The outcome of a backend's compare-and-swap of one case.
#[derive(Debug)]
pub(crate) enum Swap {
    Written,
    /// The stored version differs; this is the stored case.
    Stale(Box<Case>),
    /// The new state claims the subject but another case holds it.
    SubjectBusy(CaseId),
    Missing,
}

/// A case whose decided work has not finished, from [`Store::unfinished_decided`].
#[derive(Debug, Clone, PartialEq)]
pub struct Unfinished {
    pub case: Case,
    /// Its index time: when it entered Decided, or when its job was last re-queued.
    pub since: DateTime<Utc>,
}

/// How one case write moves the decided-but-unfinished index (`P:decided`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DecidedMark {
    /// The case enters Decided (a decision or a Retry): index it at this time.
    Enter(DateTime<Utc>),
    /// It stays Decided or Executing: keep its entry (re-adding it at this time if missing).
    Keep(DateTime<Utc>),
    /// It is not (or no longer) Decided or Executing: drop any entry.
    Drop,
}

impl DecidedMark {
    fn between(current: &cases::CaseState, next: &cases::CaseState, now: DateTime<Utc>) -> Self {
        match (is_unfinished(current), is_unfinished(next)) {
            (_, false) => DecidedMark::Drop,
            (false, true) => DecidedMark::Enter(now),
            (true, true) => DecidedMark::Keep(now),
        }
    }
}

/// Decided work that has not ended yet.
fn is_unfinished(state: &cases::CaseState) -> bool {
    matches!(
        state,
        cases::CaseState::Decided { .. } | cases::CaseState::Executing { .. }
    )
}

/// What Redis writes to disk, so a restart keeps cases, decisions and runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Persistence {
    /// `appendonly yes`: every write is logged (at most a second lost with `everysec`).
    AppendOnly,
    /// RDB snapshots only, on these `save` rules: a crash loses what changed since the last.
    Snapshots(String),
    /// Nothing: a restart loses everything.
    Off,
    /// Redis would not say (a managed Redis may refuse `CONFIG`), and why.
    Unknown(String),
}

/// The one handle to Steward's state. Cloning is cheap (both variants are handles).
#[derive(Clone)]
pub enum Store {
    Redis(RedisStore),
    Memory(MemoryStore),
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Store::Redis(r) => write!(f, "Store::Redis(prefix={:?})", r.keys().prefix()),
            Store::Memory(_) => f.write_str("Store::Memory"),
        }
    }
}

/// Calls the same method on whichever backend this is.
macro_rules! delegate {
    ($self:ident . $method:ident ( $($arg:expr),* )) => {
        match $self {
            Store::Redis(s) => s.$method($($arg),*).await,
            Store::Memory(s) => s.$method($($arg),*).await,
        }
    };
}

impl Store {
    /// A fresh, empty in-memory store (one process only).
    pub fn memory() -> Self {
        Store::Memory(MemoryStore::new())
    }

    /// Connects to Redis at `url` with every key under `key_prefix`. Fails fast with
    /// [`StoreError::Unavailable`] when Redis cannot be reached.
    pub async fn redis(url: &str, key_prefix: &str) -> Result<Self, StoreError> {
        Ok(Store::Redis(RedisStore::connect(url, key_prefix).await?))
    }

    /// A Redis store that connects on first use (see [`RedisStore::connect_lazy`]).
    pub fn redis_lazy(url: &str, key_prefix: &str) -> Result<Self, StoreError> {
        Ok(Store::Redis(RedisStore::connect_lazy(url, key_prefix)?))
    }

    /// Connects with the service's settings.
    pub async fn from_settings(settings: &RedisSettings) -> Result<Self, StoreError> {
        use secrecy::ExposeSecret;
        Self::redis(settings.url.expose_secret(), &settings.key_prefix).await
    }

    /// Checks the database answers (for readiness probes).
    pub async fn ping(&self) -> Result<(), StoreError> {
        delegate!(self.ping())
    }

    /// What the database keeps on disk, for `steward check`. The in-memory store keeps nothing.
    pub async fn persistence(&self) -> Result<Persistence, StoreError> {
        match self {
            Store::Redis(s) => s.persistence().await,
            Store::Memory(_) => Ok(Persistence::Off),
        }
    }

    // ----- cases -----

    /// Stores a new case unless its subject already has an open case (Pending, Decided or
    /// Executing), atomically. A created case is also indexed by its deadline.
    pub async fn open_case(&self, case: Case) -> Result<Opened, StoreError> {
        if !case.state.is_open() {
            return Err(StoreError::Conflict(format!(
                "a new case must be open, not {}",
                case.state.name()
            )));
        }
        let mut case = case;
        case.version = 1;
        delegate!(self.open_case(case))
    }

    /// The case with this id, or [`StoreError::NotFound`].
    pub async fn get_case(&self, id: &CaseId) -> Result<Case, StoreError> {
        let found: Option<Case> = delegate!(self.load_case(id))?;
        found.ok_or_else(|| StoreError::NotFound(format!("case {id}")))
    }

    /// The subject's open case (Pending, Decided or Executing), if any.
    pub async fn case_for_subject(&self, subject: &Subject) -> Result<Option<Case>, StoreError> {
        let id: Option<CaseId> = delegate!(self.open_case_id(subject))?;
        match id {
            None => Ok(None),
            Some(id) => {
                let case: Option<Case> = delegate!(self.load_case(&id))?;
                Ok(case.filter(|c| c.state.is_open()))
            }
        }
    }

    /// Records where the case's Slack card was posted. Safe to race with decisions.
    pub async fn set_card(&self, id: &CaseId, card: Card) -> Result<Case, StoreError> {
        match self
            .update_case(id, |case| {
                let mut next = case.clone();
                next.card = Some(card.clone());
                Ok(next)
            })
            .await?
        {
            Updated::Applied(case) => Ok(case),
            Updated::Rejected { error, .. } => Err(StoreError::Conflict(error.to_string())),
        }
    }

    /// Reads the case, computes the next one with `change`, and writes it only if nobody wrote
    /// in between; on a lost race it re-reads and calls `change` again on the newer case.
    /// `change` must not alter the case's id or subject.
    pub async fn update_case<F>(&self, id: &CaseId, change: F) -> Result<Updated, StoreError>
    where
        F: FnMut(&Case) -> Result<Case, TransitionError>,
    {
        self.update_case_at(id, Utc::now(), change).await
    }

    /// [`Store::update_case`] with the time a move into Decided is indexed at.
    async fn update_case_at<F>(
        &self,
        id: &CaseId,
        now: DateTime<Utc>,
        mut change: F,
    ) -> Result<Updated, StoreError>
    where
        F: FnMut(&Case) -> Result<Case, TransitionError>,
    {
        let mut current = self.get_case(id).await?;
        for _ in 0..MAX_UPDATE_ATTEMPTS {
            let mut next = match change(&current) {
                Ok(next) => next,
                Err(error) => return Ok(Updated::Rejected { current, error }),
            };
            if next.id != current.id || next.subject != current.subject {
                return Err(StoreError::Conflict(
                    "an update may not change a case's id or subject".to_owned(),
                ));
            }
            next.version = current.version + 1;
            let mark = DecidedMark::between(&current.state, &next.state, now);
            // A Leave decision is kept past its case's life (see [`LeftMark`]), written by the
            // same atomic write as the case.
            let left = left_mark_between(&current, &next);
            // Redis expires keys by the real clock, so the mark's TTL is counted from it.
            let clock = Utc::now();
            let swap: Swap =
                delegate!(self.swap_case(current.version, &next, mark, left.as_ref(), clock))?;
            match swap {
                Swap::Written => return Ok(Updated::Applied(next)),
                Swap::Stale(newer) => current = *newer,
                Swap::SubjectBusy(other) => {
                    return Err(StoreError::Conflict(format!(
                        "{} already has another open case ({other})",
                        current.subject
                    )));
                }
                Swap::Missing => return Err(StoreError::NotFound(format!("case {id}"))),
            }
        }
        Err(StoreError::Conflict(format!(
            "case {id} kept changing; gave up after {MAX_UPDATE_ATTEMPTS} attempts"
        )))
    }

    /// Applies one state-machine event atomically (see [`Store::update_case`]).
    pub async fn apply_event(
        &self,
        id: &CaseId,
        event: Event,
        now: DateTime<Utc>,
    ) -> Result<Updated, StoreError> {
        self.update_case_at(id, now, |case| cases::apply(case, event.clone(), now))
            .await
    }

    /// Remembers that `case` offers Restore until `until`, so the window can be closed then.
    pub async fn watch_restore(
        &self,
        case: &CaseId,
        until: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        delegate!(self.watch_restore(case, until))
    }

    /// Cases whose restore window ended at or before `now`, earliest first.
    pub async fn restore_due(&self, now: DateTime<Utc>) -> Result<Vec<CaseId>, StoreError> {
        let ids: Vec<String> = delegate!(self.restore_due(now))?;
        ids.into_iter()
            .map(|id| CaseId::parse(id).map_err(|e| StoreError::Corrupt(e.to_string())))
            .collect()
    }

    /// Forgets a case's restore window (closed).
    pub async fn unwatch_restore(&self, case: &CaseId) -> Result<(), StoreError> {
        delegate!(self.unwatch_restore(case))
    }

    /// Ids of open cases whose deadline is at or before `now`, earliest first. An index only:
    /// it may name cases that were decided meanwhile.
    pub async fn pending_due(&self, now: DateTime<Utc>) -> Result<Vec<CaseId>, StoreError> {
        let due: Vec<IndexEntry> = delegate!(self.due_ids(now))?;
        Ok(due.into_iter().map(|e| e.id).collect())
    }

    /// Expires every pending case past its deadline and returns the cases this call expired.
    /// Safe to run on every replica at once: each case is expired by exactly one caller.
    pub async fn expire_due(&self, now: DateTime<Utc>) -> Result<Vec<Case>, StoreError> {
        let mut expired = Vec::new();
        let due: Vec<IndexEntry> = delegate!(self.due_ids(now))?;
        for entry in due {
            match self.apply_event(&entry.id, Event::Expire, now).await {
                Ok(Updated::Applied(case)) => expired.push(case),
                // Decided meanwhile, or its deadline moved later: nothing to do here. The
                // index entry of a case that is no longer pending is dropped, only if it still
                // has the score read (a case re-opened meanwhile keeps its new entry).
                Ok(Updated::Rejected { current, .. }) => {
                    if current.state != cases::CaseState::Pending {
                        delegate!(self.forget_due(&entry))?;
                    }
                }
                Err(StoreError::NotFound(_)) => delegate!(self.forget_due(&entry))?,
                Err(e) => return Err(e),
            }
        }
        Ok(expired)
    }

    /// The cases still Decided or Executing whose index time is at or before `cutoff`, oldest
    /// first. Index entries of cases that have moved on are dropped here.
    pub async fn unfinished_decided(
        &self,
        cutoff: DateTime<Utc>,
    ) -> Result<Vec<Unfinished>, StoreError> {
        let mut unfinished = Vec::new();
        let indexed: Vec<IndexEntry> = delegate!(self.decided_ids(cutoff))?;
        for entry in indexed {
            let found: Option<Case> = delegate!(self.load_case(&entry.id))?;
            match found {
                Some(case) if is_unfinished(&case.state) => unfinished.push(Unfinished {
                    case,
                    since: entry.at,
                }),
                // Dropped only if still indexed at `at`: a case that is being decided again
                // right now has just been re-indexed at a later time and keeps its entry.
                _ => delegate!(self.forget_decided(&entry))?,
            }
        }
        Ok(unfinished)
    }

    /// Moves a case's entry in the decided index from `since` to `until`, if it is still at
    /// `since`. Of several callers that read the same entry, exactly one gets true: that is
    /// how one replica (not all) re-queues a case's lost job.
    pub async fn postpone_decided(
        &self,
        id: &CaseId,
        since: DateTime<Utc>,
        until: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        // The index is sharded by subject: find the case's shard through the case itself.
        let found: Option<Case> = delegate!(self.load_case(id))?;
        let Some(case) = found else {
            return Ok(false);
        };
        delegate!(self.postpone_decided(&case.subject, id, since, until))
    }

    // ----- what sweeps need -----

    /// The latest Leave decision of each subject (same order as `subjects`), in one round trip.
    pub async fn left_marks(
        &self,
        subjects: &[Subject],
    ) -> Result<Vec<Option<LeftMark>>, StoreError> {
        if subjects.is_empty() {
            return Ok(Vec::new());
        }
        delegate!(self.left_marks(subjects))
    }

    /// Every Leave mark the store holds, with its subject, in no particular order. A scan of the
    /// whole keyspace (shard by shard on a Cluster): for `steward check`, never on a request's
    /// path. A mark past its `until` may still be listed for up to a day (its key outlives it).
    pub async fn all_left_marks(&self) -> Result<Vec<(Subject, LeftMark)>, StoreError> {
        delegate!(self.all_left_marks())
    }

    /// The open case id of each subject (same order as `subjects`), in one round trip. An index
    /// read: a case may have closed since.
    pub async fn open_case_ids(
        &self,
        subjects: &[Subject],
    ) -> Result<Vec<Option<CaseId>>, StoreError> {
        if subjects.is_empty() {
            return Ok(Vec::new());
        }
        delegate!(self.open_case_ids(subjects))
    }

    /// The scheduled time of the last sweep that finished, if any.
    pub async fn last_completed_sweep(&self) -> Result<Option<DateTime<Utc>>, StoreError> {
        delegate!(self.last_completed_sweep())
    }

    /// Records that the sweep scheduled for `slot` finished. Never moves the marker backwards.
    /// The time of the newest E2B lifecycle event the poller has read, if it ever read one.
    pub async fn events_watermark(&self) -> Result<Option<DateTime<Utc>>, StoreError> {
        delegate!(self.events_watermark())
    }

    /// Moves the events watermark to `at`, unless it is already later.
    pub async fn advance_events_watermark(&self, at: DateTime<Utc>) -> Result<(), StoreError> {
        delegate!(self.advance_events_watermark(at))
    }

    pub async fn record_completed_sweep(&self, slot: DateTime<Utc>) -> Result<(), StoreError> {
        delegate!(self.record_completed_sweep(slot))
    }

    /// Records where the digest of the sweep scheduled for `slot` was posted, so a replica
    /// that takes the slot over after a lost lease reuses it rather than posting a second one.
    pub async fn record_sweep_digest(
        &self,
        slot: DateTime<Utc>,
        posted: &str,
    ) -> Result<(), StoreError> {
        delegate!(self.record_sweep_digest(slot, posted))
    }

    /// Records that `case`'s card could not be brought up to date (its update failed for good),
    /// so any replica's repair pass rewrites it, even after this one stops. Returns how many
    /// times in a row it was recorded.
    pub async fn mark_card_stale(&self, case: &CaseId) -> Result<u32, StoreError> {
        delegate!(self.mark_card_stale(case))
    }

    /// The cards recorded by [`Store::mark_card_stale`], with their count of failures in a row.
    pub async fn stale_cards(&self) -> Result<Vec<(CaseId, u32)>, StoreError> {
        delegate!(self.stale_cards())
    }

    /// `case`'s card is up to date again.
    pub async fn clear_stale_card(&self, case: &CaseId) -> Result<(), StoreError> {
        delegate!(self.clear_stale_card(case))
    }

    /// What [`Store::record_sweep_digest`] recorded for `slot`, if anything.
    pub async fn sweep_digest(&self, slot: DateTime<Utc>) -> Result<Option<String>, StoreError> {
        delegate!(self.sweep_digest(slot))
    }

    // ----- deduplication and leases -----

    /// True the first time `key` is seen within `ttl`; false for repeats (Slack retries).
    pub async fn first_time(&self, key: &str, ttl: Duration) -> Result<bool, StoreError> {
        delegate!(self.first_time(key, ttl))
    }

    /// Marks a click on `case`'s card (`mark` identifies the click: the person and Slack's
    /// `action_ts`) as seen for `ttl` and, the first time, reads the case: what
    /// [`Store::first_time`] and [`Store::get_case`] do, in one Redis round trip on one server
    /// (two on a Cluster, where the case lives in its subject's slot).
    pub async fn first_click(
        &self,
        case: &CaseId,
        mark: &str,
        ttl: Duration,
    ) -> Result<FirstClick, StoreError> {
        delegate!(self.first_click(case, mark, ttl))
    }

    /// Forgets a [`Store::first_time`] mark, so the next call is the first again (the work it
    /// guarded failed and must be tried again).
    pub async fn forget_first_time(&self, key: &str) -> Result<(), StoreError> {
        delegate!(self.forget_first_time(key))
    }

    /// Takes the lease `name` for `holder` for `ttl` if nobody holds it. True when taken.
    pub async fn acquire_lease(
        &self,
        name: &str,
        holder: &str,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        delegate!(self.acquire_lease(name, holder, ttl))
    }

    /// Extends the lease by `ttl` if `holder` still holds it. False when it was lost.
    pub async fn renew_lease(
        &self,
        name: &str,
        holder: &str,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        delegate!(self.renew_lease(name, holder, ttl))
    }

    /// Whether anyone holds the lease `name` right now.
    pub async fn lease_held(&self, name: &str) -> Result<bool, StoreError> {
        delegate!(self.lease_held(name))
    }

    /// Gives the lease up if `holder` holds it. False when someone else held it.
    pub async fn release_lease(&self, name: &str, holder: &str) -> Result<bool, StoreError> {
        delegate!(self.release_lease(name, holder))
    }

    // ----- job queue and step logs -----

    /// Appends a job to its lane of the durable queue.
    pub async fn enqueue(&self, job: &Job) -> Result<JobId, StoreError> {
        delegate!(self.enqueue(job))
    }

    /// Takes the next never-delivered job of `lane` for `consumer`, waiting up to `block`
    /// (zero: no wait). Undecodable entries are acknowledged, logged and skipped so they cannot
    /// jam the queue. Don't cancel a waiting claim: on Redis, a job delivered as the claim is
    /// dropped stays pending with this consumer until [`Store::reclaim_stale`] takes it over.
    pub async fn claim(
        &self,
        lane: Lane,
        consumer: &str,
        block: Duration,
    ) -> Result<Option<ClaimedJob>, StoreError> {
        delegate!(self.claim(lane, consumer, block))
    }

    /// How many jobs of `lane` are not yet acknowledged, and when the oldest was enqueued.
    pub async fn queue_stats(&self, lane: Lane) -> Result<QueueStats, StoreError> {
        delegate!(self.queue_stats(lane))
    }

    /// Where `job` waits in its lane: 1 when it is the next a worker takes, 2 with one job
    /// ahead of it, …; `None` once a worker has taken it (or it is not queued, or it is not
    /// among the first `up_to` waiting jobs).
    pub async fn queue_position(&self, job: &Job, up_to: u64) -> Result<Option<u64>, StoreError> {
        delegate!(self.queue_position(job, up_to))
    }

    /// Marks a job finished; it will not be handed out again.
    pub async fn ack(&self, id: &JobId) -> Result<(), StoreError> {
        delegate!(self.ack(id))
    }

    /// Says that `consumer` is still working on the job it claimed, so
    /// [`Store::reclaim_stale`] does not take it over; a live worker calls it well within the
    /// lane's `stale_after`.
    pub async fn touch_job(&self, id: &JobId, consumer: &str) -> Result<(), StoreError> {
        delegate!(self.touch_job(id, consumer))
    }

    /// Gives a claimed job back: the same work is queued again as a new entry, which any
    /// worker may take at once, and the claimed entry is acknowledged, in one step. What a
    /// stopping replica does with work it will not finish.
    pub async fn hand_back(&self, id: &JobId, job: &Job) -> Result<JobId, StoreError> {
        delegate!(self.hand_back(id, job))
    }

    /// Takes over jobs of `lane` that another consumer claimed and has not touched or
    /// acknowledged for at least `min_idle` (its worker died).
    pub async fn reclaim_stale(
        &self,
        lane: Lane,
        consumer: &str,
        min_idle: Duration,
    ) -> Result<Vec<ClaimedJob>, StoreError> {
        delegate!(self.reclaim_stale(lane, consumer, min_idle))
    }

    /// Records that a step of the case's execution finished. The first record of a step wins:
    /// returns false (and keeps the earlier record) if it was already there.
    pub async fn mark_step_done(
        &self,
        case: &CaseId,
        record: &cases::StepRecord,
    ) -> Result<bool, StoreError> {
        delegate!(self.mark_step_done(case, record))
    }

    /// The finished steps of the case's execution, in plan order.
    pub async fn steps_done(&self, case: &CaseId) -> Result<Vec<cases::StepRecord>, StoreError> {
        let mut steps: Vec<cases::StepRecord> = delegate!(self.steps_done(case))?;
        steps.sort_by_key(|r| r.step);
        Ok(steps)
    }

    /// Forgets the case's step log (when stale evidence sent it back to Pending).
    pub async fn clear_steps(&self, case: &CaseId) -> Result<(), StoreError> {
        delegate!(self.clear_steps(case))
    }

    // ----- runs -----

    /// Stores a new run (version 1) with the files it will upload, in one step. A run with
    /// this id already stored is a [`StoreError::Conflict`].
    pub async fn create_run(
        &self,
        id: &RunId,
        json: &str,
        files_json: &str,
    ) -> Result<(), StoreError> {
        delegate!(self.create_run(id, json, files_json))
    }

    /// The run with this id, or `None`.
    pub async fn load_run(&self, id: &RunId) -> Result<Option<StoredRun>, StoreError> {
        delegate!(self.load_run(id))
    }

    /// Replaces the run's JSON if its version is still `expected` (the version grows by one).
    /// False when someone wrote in between (or the run is gone): read it again.
    pub async fn swap_run(
        &self,
        id: &RunId,
        expected: u64,
        json: &str,
    ) -> Result<bool, StoreError> {
        delegate!(self.swap_run(id, expected, json))
    }

    /// Adds `chunk` to the run's output: all of it counts; its first `cap` bytes are kept as
    /// the head (read with [`Store::run_output`]) and its last `cap` bytes past the head as the
    /// tail ([`Store::run_output_tail`]), so a long output keeps both ends.
    pub async fn append_run_output(
        &self,
        id: &RunId,
        chunk: &[u8],
        cap: u64,
    ) -> Result<OutputCount, StoreError> {
        delegate!(self.append_run_output(id, chunk, cap))
    }

    /// Up to `max` bytes of the run's kept output from byte `from`, and how many bytes are kept
    /// in all.
    pub async fn run_output(
        &self,
        id: &RunId,
        from: u64,
        max: u64,
    ) -> Result<(Vec<u8>, u64), StoreError> {
        delegate!(self.run_output(id, from, max))
    }

    /// The last (up to) `max` bytes of the run's output past its kept head: empty while the
    /// whole output fits the head. At least the last `cap` bytes are kept (between trims, up
    /// to twice that), so a caller asking for at most `cap` bytes always gets the same answer;
    /// bytes between the head and the tail were counted, not kept.
    pub async fn run_output_tail(&self, id: &RunId, max: u64) -> Result<Vec<u8>, StoreError> {
        delegate!(self.run_output_tail(id, max))
    }

    /// Replaces a run's inputs (if they are still there), keeping their time to live.
    pub async fn replace_run_files(&self, id: &RunId, json: &str) -> Result<(), StoreError> {
        delegate!(self.replace_run_files(id, json))
    }

    /// The files of a run not uploaded yet (the JSON given to [`Store::create_run`]).
    pub async fn run_files(&self, id: &RunId) -> Result<Option<String>, StoreError> {
        delegate!(self.run_files(id))
    }

    /// Forgets a run's files (once they are in its sandbox).
    pub async fn delete_run_files(&self, id: &RunId) -> Result<(), StoreError> {
        delegate!(self.delete_run_files(id))
    }

    /// A watch on the run's changes (its record, its output), on this replica and any other:
    /// made before reading the run, then [`RunWatch::changed`] waits for the next change. A
    /// notification can be lost (Redis pub/sub while the subscriber reconnects), so a caller
    /// waits a bounded time and reads again either way.
    pub async fn watch_run(&self, id: &RunId) -> RunWatch {
        delegate!(self.watch_run(id))
    }

    // ----- audit -----

    pub async fn append_audit(&self, event: &AuditEvent) -> Result<(), StoreError> {
        delegate!(self.append_audit(event))
    }

    /// The latest `limit` audit events about `subject` (only those of `case`, if given),
    /// oldest first. Reads the subject's own capped stream, never the whole log.
    pub async fn recent_audit(
        &self,
        subject: &Subject,
        case: Option<&CaseId>,
        limit: usize,
    ) -> Result<AuditSlice, StoreError> {
        delegate!(self.recent_audit(subject, case, limit))
    }

    /// The latest `limit` audit events about `case`, oldest first, read from its subject's
    /// capped stream. Empty when the case is unknown.
    pub async fn recent_case_audit(
        &self,
        case: &CaseId,
        limit: usize,
    ) -> Result<AuditSlice, StoreError> {
        match delegate!(self.subject_of(case))? {
            Some(subject) => self.recent_audit(&subject, Some(case), limit).await,
            None => Ok(AuditSlice {
                events: Vec::new(),
                total: 0,
            }),
        }
    }

    /// The audit events about `case` still kept for its subject (at most
    /// [`keys::SUBJECT_AUDIT_MAX_ENTRIES`] are read), oldest first. Empty when the case is
    /// unknown.
    pub async fn audit_for_case(&self, case: &CaseId) -> Result<Vec<AuditEvent>, StoreError> {
        let slice = self
            .recent_case_audit(case, keys::SUBJECT_AUDIT_MAX_ENTRIES as usize)
            .await?;
        Ok(slice.events)
    }

    /// The audit events about `subject` still kept for it, oldest first.
    pub async fn audit_for_subject(
        &self,
        subject: &Subject,
    ) -> Result<Vec<AuditEvent>, StoreError> {
        let slice = self
            .recent_audit(subject, None, keys::SUBJECT_AUDIT_MAX_ENTRIES as usize)
            .await?;
        Ok(slice.events)
    }

    /// One page of the whole audit log, oldest first: up to `count` events whose time is at or
    /// after `since`, continuing after `after`. The cursor is `None` once the log is read.
    pub async fn audit_page(
        &self,
        since: DateTime<Utc>,
        after: Option<&AuditCursor>,
        count: usize,
    ) -> Result<(Vec<AuditEvent>, Option<AuditCursor>), StoreError> {
        delegate!(self.audit_page(since, after, count.max(1)))
    }

    /// Audit events whose time is at or after `since`, oldest first, collected in memory. For
    /// small windows and tests; `steward audit export` pages through [`Store::audit_page`].
    pub async fn audit_since(&self, since: DateTime<Utc>) -> Result<Vec<AuditEvent>, StoreError> {
        let mut all = Vec::new();
        let mut cursor = None;
        loop {
            let (page, next) = self.audit_page(since, cursor.as_ref(), 500).await?;
            all.extend(page);
            match next {
                Some(next) => cursor = Some(next),
                None => return Ok(all),
            }
        }
    }
}

fn encode<T: Serialize>(value: &T) -> Result<String, StoreError> {
    serde_json::to_string(value).map_err(|e| StoreError::Corrupt(e.to_string()))
}

fn decode<T: for<'de> Deserialize<'de>>(what: &str, text: &str) -> Result<T, StoreError> {
    serde_json::from_str(text).map_err(|e| StoreError::Corrupt(format!("{what}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cases::{CaseDraft, DecisionOption, Evidence, Opener, Recommendation};
    use crate::ids::SandboxId;

    fn pending_case(decide_by: DateTime<Utc>) -> Case {
        CaseDraft {
            subject: Subject::Sandbox(SandboxId::parse("sbx1").unwrap()),
            evidence: Evidence::default(),
            recommendation: Recommendation {
                option: DecisionOption::Kill,
                reason: "idle".into(),
            },
            options: None,
            opener: Opener::Person {
                user: SlackUserId::parse("U1").unwrap(),
            },
            reason: "cleanup".into(),
            decide_by,
        }
        .into_case(decide_by - chrono::Duration::hours(1))
        .unwrap()
    }

    /// An expirer that read a due entry, then lost the race to a write that re-indexed the case
    /// at a new deadline, must not drop the new entry: removals are score-checked.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stale_due_entry_is_not_removed_once_the_case_was_re_indexed() {
        let store = MemoryStore::new();
        let first = DateTime::from_timestamp(1_000, 0).unwrap();
        let case = pending_case(first);
        store.open_case(case.clone()).await.unwrap();
        let read = store.due_ids(first).await.unwrap();
        assert_eq!(read.len(), 1);

        // Meanwhile the case is written again with a later deadline.
        let mut later = case.clone();
        later.decide_by = first + chrono::Duration::hours(1);
        later.version = case.version + 1;
        let swap = store
            .swap_case(case.version, &later, DecidedMark::Drop, None, first)
            .await
            .unwrap();
        assert!(matches!(swap, Swap::Written));

        store.forget_due(&read[0]).await.unwrap();
        let now_due = store.due_ids(later.decide_by).await.unwrap();
        assert_eq!(now_due.len(), 1, "the re-indexed entry was dropped");
        assert_eq!(now_due[0].at, later.decide_by);

        // Forgetting the entry as it is now does drop it.
        store.forget_due(&now_due[0]).await.unwrap();
        assert!(store.due_ids(later.decide_by).await.unwrap().is_empty());
    }
}
