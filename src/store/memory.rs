//! The in-memory backend: a store for one process with no Redis, and a second implementation the
//! shared store test suite runs against.
//!
//! It mimics the Redis backend's semantics (open-case pointer per subject, versioned writes,
//! a queue with a pending-entries list and idle times, TTLs) inside one process. One mutex
//! guards everything and is never held across an `.await`. It must not be used by several
//! replicas: nothing here is shared between processes.
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::{
    AuditCursor, AuditEvent, AuditSlice, ClaimedJob, DecidedMark, FirstClick, IndexEntry, JobId,
    LeftMark, Opened, OutputCount, QueueStats, StoreError, StoredRun, Swap,
};
use super::{Job, Lane};
use crate::cases::{Case, Step, StepRecord, Subject};
use crate::ids::{CaseId, ListId, RunId};

/// A cheap-to-clone handle to one in-process state.
#[derive(Clone, Default)]
pub struct MemoryStore {
    state: Arc<Mutex<State>>,
    job_added: Arc<Notify>,
    /// Watches of runs, woken by run writes (as Redis's run-change channel does).
    run_wakers: Arc<super::wake::Wakers>,
}

#[derive(Default)]
struct State {
    cases: HashMap<CaseId, Case>,
    /// Subject key -> its open case.
    open: HashMap<String, CaseId>,
    due: HashMap<CaseId, DateTime<Utc>>,
    /// Decided-but-unfinished cases -> when they entered Decided (ms, like Redis scores).
    decided: HashMap<CaseId, DateTime<Utc>>,
    steps: HashMap<CaseId, BTreeMap<Step, StepRecord>>,
    dedupe: HashMap<String, Instant>,
    /// The size of `dedupe` at which expired marks are next swept out (amortised: a sweep on
    /// every mark made each mark cost the whole map).
    dedupe_sweep_at: usize,
    leases: HashMap<String, (String, Instant)>,
    left: HashMap<String, LeftMark>,
    last_sweep: Option<DateTime<Utc>>,
    events_watermark: Option<DateTime<Utc>>,
    sweep_digests: HashMap<DateTime<Utc>, String>,
    stale_cards: HashMap<CaseId, u32>,
    /// One queue per lane, `Lane::Decisions` first.
    queues: [Queue; 2],
    audit: Vec<AuditEvent>,
    runs: HashMap<RunId, MemoryRun>,
    push_tests: HashMap<RunId, String>,
    run_stops: HashMap<RunId, String>,
    /// `owner/name` and branch -> the latest push-test run.
    push_latest: HashMap<(String, String), RunId>,
    push_failing: HashMap<(String, String), String>,
    push_admission: Option<String>,
    restore_windows: HashMap<CaseId, DateTime<Utc>>,
    /// List id -> (version, JSON).
    lists: HashMap<ListId, (u64, String)>,
    /// Lists still in play, by creation (ms).
    active_lists: BTreeMap<(i64, String), ()>,
    /// `[[watch]]` creations per (rule, group): sandbox -> ms.
    watch_creations: HashMap<(String, String), HashMap<String, i64>>,
    /// `[[watch]]` open alerts per (rule, group) (no expiry in memory).
    watch_alerts: HashMap<(String, String), String>,
    /// Each sandbox's recent lifecycle entries (no expiry in memory).
    lifecycles: HashMap<String, Vec<String>>,
}

/// One run: its record, its kept output and its files until uploaded.
#[derive(Default)]
struct MemoryRun {
    json: String,
    version: u64,
    total: u64,
    output: Vec<u8>,
    /// The end of the output past a full head (the last `cap` bytes at least, less than twice
    /// that).
    tail: Vec<u8>,
    files: Option<String>,
}

/// Like a Redis stream with one consumer group.
#[derive(Default)]
struct Queue {
    next_seq: u64,
    /// Entries not yet acknowledged, delivered or not.
    entries: BTreeMap<u64, Job>,
    /// The highest sequence number handed out by `claim`.
    last_delivered: u64,
    /// Delivered, unacknowledged entries.
    pending: BTreeMap<u64, Delivery>,
    /// When each entry in `entries` was enqueued (a Redis stream id carries this).
    enqueued_at: BTreeMap<u64, DateTime<Utc>>,
}

struct Delivery {
    consumer: String,
    at: Instant,
    count: u64,
}

/// Truncates to whole milliseconds, as Redis keeps index scores.
fn whole_ms(at: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(at.timestamp_millis()).unwrap_or(at)
}

fn job_id(lane: Lane, seq: u64) -> JobId {
    JobId {
        lane,
        entry: format!("{seq}-0"),
    }
}

fn parse_job_id(id: &JobId) -> Option<u64> {
    id.entry.split('-').next()?.parse().ok()
}

/// The index of a lane's queue in `State::queues`.
fn lane_index(lane: Lane) -> usize {
    match lane {
        Lane::Decisions => 0,
        Lane::Runs => 1,
    }
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave a half-written case (every write is one
        // assignment), so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }

    pub(crate) async fn open_case(&self, case: Case) -> Result<Opened, StoreError> {
        let mut s = self.lock();
        let subject_key = case.subject.key();
        if let Some(existing) = s.open.get(&subject_key).and_then(|id| s.cases.get(id))
            && existing.state.is_open()
        {
            return Ok(Opened::Existing(existing.clone()));
        }
        s.open.insert(subject_key, case.id.clone());
        s.due.insert(case.id.clone(), case.decide_by);
        s.cases.insert(case.id.clone(), case.clone());
        Ok(Opened::Created(case))
    }

    pub(crate) async fn load_case(&self, id: &CaseId) -> Result<Option<Case>, StoreError> {
        Ok(self.lock().cases.get(id).cloned())
    }

    pub(crate) async fn open_case_id(
        &self,
        subject: &Subject,
    ) -> Result<Option<CaseId>, StoreError> {
        Ok(self.lock().open.get(&subject.key()).cloned())
    }

    pub(crate) async fn swap_case(
        &self,
        expected: u64,
        next: &Case,
        decided: DecidedMark,
        left: Option<&LeftMark>,
        _now: DateTime<Utc>,
    ) -> Result<Swap, StoreError> {
        let mut s = self.lock();
        let Some(current) = s.cases.get(&next.id) else {
            return Ok(Swap::Missing);
        };
        if current.version != expected {
            return Ok(Swap::Stale(Box::new(current.clone())));
        }
        let subject_key = next.subject.key();
        let holder = s.open.get(&subject_key).cloned();
        if next.state.is_open() {
            if let Some(other) = holder.filter(|h| *h != next.id) {
                return Ok(Swap::SubjectBusy(other));
            }
            s.open.insert(subject_key, next.id.clone());
        } else if holder.as_ref() == Some(&next.id) {
            s.open.remove(&subject_key);
        }
        if next.state == crate::cases::CaseState::Pending {
            s.due.insert(next.id.clone(), next.decide_by);
        } else {
            s.due.remove(&next.id);
        }
        match decided {
            DecidedMark::Enter(at) => {
                s.decided.insert(next.id.clone(), whole_ms(at));
            }
            DecidedMark::Keep(at) => {
                s.decided.entry(next.id.clone()).or_insert(whole_ms(at));
            }
            DecidedMark::Drop => {
                s.decided.remove(&next.id);
            }
        }
        if let Some(mark) = left {
            s.left.insert(next.subject.key(), mark.clone());
        }
        s.cases.insert(next.id.clone(), next.clone());
        Ok(Swap::Written)
    }

    pub(crate) async fn due_ids(&self, now: DateTime<Utc>) -> Result<Vec<IndexEntry>, StoreError> {
        Ok(entries(&self.lock().due, now))
    }

    pub(crate) async fn forget_due(&self, entry: &IndexEntry) -> Result<(), StoreError> {
        let mut s = self.lock();
        if s.due.get(&entry.id).map(|at| whole_ms(*at)) == Some(entry.at) {
            s.due.remove(&entry.id);
        }
        Ok(())
    }

    pub(crate) async fn decided_ids(
        &self,
        cutoff: DateTime<Utc>,
    ) -> Result<Vec<IndexEntry>, StoreError> {
        Ok(entries(&self.lock().decided, whole_ms(cutoff)))
    }

    pub(crate) async fn forget_decided(&self, entry: &IndexEntry) -> Result<(), StoreError> {
        let mut s = self.lock();
        if s.decided.get(&entry.id) == Some(&entry.at) {
            s.decided.remove(&entry.id);
        }
        Ok(())
    }

    pub(crate) async fn postpone_decided(
        &self,
        _subject: &Subject,
        id: &CaseId,
        since: DateTime<Utc>,
        until: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        let mut s = self.lock();
        match s.decided.get_mut(id) {
            Some(at) if *at == since => {
                *at = whole_ms(until);
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    pub(crate) async fn all_left_marks(&self) -> Result<Vec<(Subject, LeftMark)>, StoreError> {
        let s = self.lock();
        Ok(s.left
            .iter()
            .filter_map(|(key, mark)| Some((Subject::from_key(key)?, mark.clone())))
            .collect())
    }

    pub(crate) async fn left_marks(
        &self,
        subjects: &[Subject],
    ) -> Result<Vec<Option<LeftMark>>, StoreError> {
        let s = self.lock();
        Ok(subjects
            .iter()
            .map(|sub| s.left.get(&sub.key()).cloned())
            .collect())
    }

    pub(crate) async fn open_case_ids(
        &self,
        subjects: &[Subject],
    ) -> Result<Vec<Option<CaseId>>, StoreError> {
        let s = self.lock();
        Ok(subjects
            .iter()
            .map(|sub| s.open.get(&sub.key()).cloned())
            .collect())
    }

    pub(crate) async fn last_completed_sweep(&self) -> Result<Option<DateTime<Utc>>, StoreError> {
        Ok(self.lock().last_sweep)
    }

    pub(crate) async fn events_watermark(&self) -> Result<Option<DateTime<Utc>>, StoreError> {
        Ok(self.lock().events_watermark)
    }

    pub(crate) async fn advance_events_watermark(
        &self,
        at: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let mut s = self.lock();
        s.events_watermark = Some(s.events_watermark.map_or(at, |last| last.max(at)));
        Ok(())
    }

    pub(crate) async fn record_completed_sweep(
        &self,
        slot: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let mut s = self.lock();
        s.last_sweep = Some(s.last_sweep.map_or(slot, |last| last.max(slot)));
        Ok(())
    }

    pub(crate) async fn record_sweep_digest(
        &self,
        slot: DateTime<Utc>,
        posted: &str,
    ) -> Result<(), StoreError> {
        self.lock().sweep_digests.insert(slot, posted.to_owned());
        Ok(())
    }

    pub(crate) async fn mark_card_stale(&self, case: &CaseId) -> Result<u32, StoreError> {
        let mut inner = self.lock();
        let failures = inner.stale_cards.entry(case.clone()).or_default();
        *failures += 1;
        Ok(*failures)
    }

    pub(crate) async fn stale_cards(&self) -> Result<Vec<(CaseId, u32)>, StoreError> {
        Ok(self
            .lock()
            .stale_cards
            .iter()
            .map(|(id, n)| (id.clone(), *n))
            .collect())
    }

    pub(crate) async fn clear_stale_card(&self, case: &CaseId) -> Result<(), StoreError> {
        self.lock().stale_cards.remove(case);
        Ok(())
    }

    pub(crate) async fn sweep_digest(
        &self,
        slot: DateTime<Utc>,
    ) -> Result<Option<String>, StoreError> {
        Ok(self.lock().sweep_digests.get(&slot).cloned())
    }

    pub(crate) async fn first_time(&self, key: &str, ttl: Duration) -> Result<bool, StoreError> {
        let mut s = self.lock();
        let now = Instant::now();
        if s.dedupe.get(key).is_some_and(|until| *until > now) {
            return Ok(false);
        }
        s.dedupe.insert(key.to_owned(), now + ttl);
        // Keep the map from growing without bound in a long demo: sweep when it has doubled.
        if s.dedupe.len() >= s.dedupe_sweep_at {
            s.dedupe.retain(|_, until| *until > now);
            s.dedupe_sweep_at = (s.dedupe.len() * 2).max(1024);
        }
        Ok(true)
    }

    pub(crate) async fn first_click(
        &self,
        case: &CaseId,
        mark: &str,
        ttl: Duration,
    ) -> Result<FirstClick, StoreError> {
        // Its own key space, as in Redis: a click mark never collides with a `first_time` key.
        if !self
            .first_time(&format!("\0click:{case}:{mark}"), ttl)
            .await?
        {
            return Ok(FirstClick::Repeat);
        }
        Ok(match self.load_case(case).await? {
            Some(found) => FirstClick::Case(Box::new(found)),
            None => FirstClick::Missing,
        })
    }

    pub(crate) async fn forget_first_time(&self, key: &str) -> Result<(), StoreError> {
        self.lock().dedupe.remove(key);
        Ok(())
    }

    pub(crate) async fn put_push_test(&self, run: &RunId, json: &str) -> Result<(), StoreError> {
        self.lock().push_tests.insert(run.clone(), json.to_owned());
        Ok(())
    }

    pub(crate) async fn push_test_json(&self, run: &RunId) -> Result<Option<String>, StoreError> {
        Ok(self.lock().push_tests.get(run).cloned())
    }

    pub(crate) async fn swap_latest_push_run(
        &self,
        repository: &str,
        branch: &str,
        run: &RunId,
    ) -> Result<Option<String>, StoreError> {
        let key = (repository.to_owned(), branch.to_owned());
        Ok(self
            .lock()
            .push_latest
            .insert(key, run.clone())
            .map(|r| r.to_string()))
    }

    pub(crate) async fn request_run_stop(
        &self,
        run: &RunId,
        reason: &str,
    ) -> Result<(), StoreError> {
        self.lock().run_stops.insert(run.clone(), reason.to_owned());
        Ok(())
    }

    pub(crate) async fn run_stop_requested(
        &self,
        run: &RunId,
    ) -> Result<Option<String>, StoreError> {
        Ok(self.lock().run_stops.get(run).cloned())
    }

    pub(crate) async fn latest_push_run(
        &self,
        repository: &str,
        branch: &str,
    ) -> Result<Option<String>, StoreError> {
        let key = (repository.to_owned(), branch.to_owned());
        Ok(self.lock().push_latest.get(&key).map(|r| r.to_string()))
    }

    pub(crate) async fn watch_restore(
        &self,
        case: &CaseId,
        until: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        self.lock().restore_windows.insert(case.clone(), until);
        Ok(())
    }

    pub(crate) async fn restore_due(&self, now: DateTime<Utc>) -> Result<Vec<String>, StoreError> {
        let mut due: Vec<(DateTime<Utc>, String)> = self
            .lock()
            .restore_windows
            .iter()
            .filter(|(_, until)| **until <= now)
            .map(|(id, until)| (*until, id.to_string()))
            .collect();
        due.sort();
        Ok(due.into_iter().map(|(_, id)| id).collect())
    }

    pub(crate) async fn unwatch_restore(&self, case: &CaseId) -> Result<(), StoreError> {
        self.lock().restore_windows.remove(case);
        Ok(())
    }

    pub(crate) async fn create_list(
        &self,
        id: &ListId,
        json: &str,
        score_ms: i64,
    ) -> Result<bool, StoreError> {
        let mut s = self.lock();
        if s.lists.contains_key(id) {
            return Ok(false);
        }
        s.lists.insert(id.clone(), (1, json.to_owned()));
        s.active_lists.insert((score_ms, id.to_string()), ());
        Ok(true)
    }

    pub(crate) async fn load_list(&self, id: &ListId) -> Result<Option<(u64, String)>, StoreError> {
        Ok(self.lock().lists.get(id).cloned())
    }

    pub(crate) async fn swap_list(
        &self,
        id: &ListId,
        expected: u64,
        json: &str,
    ) -> Result<bool, StoreError> {
        let mut s = self.lock();
        match s.lists.get_mut(id) {
            Some(stored) if stored.0 == expected => {
                *stored = (expected + 1, json.to_owned());
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    pub(crate) async fn active_lists(&self) -> Result<Vec<String>, StoreError> {
        Ok(self
            .lock()
            .active_lists
            .keys()
            .map(|(_, id)| id.clone())
            .collect())
    }

    pub(crate) async fn retire_list(&self, id: &ListId) -> Result<(), StoreError> {
        self.lock()
            .active_lists
            .retain(|(_, listed), _| listed != id.as_str());
        Ok(())
    }

    pub(crate) async fn cases_of(
        &self,
        items: &[(Subject, CaseId)],
    ) -> Result<Vec<Option<Case>>, StoreError> {
        let s = self.lock();
        Ok(items
            .iter()
            .map(|(_, id)| s.cases.get(id).cloned())
            .collect())
    }

    pub(crate) async fn push_admission(&self) -> Result<Option<String>, StoreError> {
        Ok(self.lock().push_admission.clone())
    }

    pub(crate) async fn set_push_admission(&self, json: &str) -> Result<(), StoreError> {
        self.lock().push_admission = Some(json.to_owned());
        Ok(())
    }

    pub(crate) async fn set_push_failing(
        &self,
        repository: &str,
        branch: &str,
        json: &str,
    ) -> Result<(), StoreError> {
        let key = (repository.to_owned(), branch.to_owned());
        self.lock().push_failing.insert(key, json.to_owned());
        Ok(())
    }

    pub(crate) async fn push_failing(
        &self,
        repository: &str,
        branch: &str,
    ) -> Result<Option<String>, StoreError> {
        let key = (repository.to_owned(), branch.to_owned());
        Ok(self.lock().push_failing.get(&key).cloned())
    }

    pub(crate) async fn clear_push_failing(
        &self,
        repository: &str,
        branch: &str,
    ) -> Result<(), StoreError> {
        let key = (repository.to_owned(), branch.to_owned());
        self.lock().push_failing.remove(&key);
        Ok(())
    }

    pub(crate) async fn acquire_lease(
        &self,
        name: &str,
        holder: &str,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let mut s = self.lock();
        let now = Instant::now();
        if s.leases.get(name).is_some_and(|(_, until)| *until > now) {
            return Ok(false);
        }
        s.leases
            .insert(name.to_owned(), (holder.to_owned(), now + ttl));
        Ok(true)
    }

    pub(crate) async fn lease_held(&self, name: &str) -> Result<bool, StoreError> {
        let s = self.lock();
        Ok(s.leases
            .get(name)
            .is_some_and(|(_, until)| *until > Instant::now()))
    }

    pub(crate) async fn renew_lease(
        &self,
        name: &str,
        holder: &str,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let mut s = self.lock();
        let now = Instant::now();
        match s.leases.get_mut(name) {
            Some((h, until)) if h == holder && *until > now => {
                *until = now + ttl;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    pub(crate) async fn release_lease(&self, name: &str, holder: &str) -> Result<bool, StoreError> {
        let mut s = self.lock();
        let now = Instant::now();
        match s.leases.get(name) {
            Some((h, until)) if h == holder && *until > now => {
                s.leases.remove(name);
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    pub(crate) async fn enqueue(&self, job: &Job) -> Result<JobId, StoreError> {
        let id = self.push_job(job);
        self.job_added.notify_waiters();
        Ok(id)
    }

    /// Adds `job` to its lane; the caller wakes the waiting claims.
    fn push_job(&self, job: &Job) -> JobId {
        let lane = job.lane();
        let mut s = self.lock();
        let q = &mut s.queues[lane_index(lane)];
        q.next_seq += 1;
        let seq = q.next_seq;
        q.entries.insert(seq, job.clone());
        q.enqueued_at.insert(seq, Utc::now());
        job_id(lane, seq)
    }

    fn take_next(&self, lane: Lane, consumer: &str) -> Option<ClaimedJob> {
        let mut s = self.lock();
        let q = &mut s.queues[lane_index(lane)];
        let (seq, job) = q
            .entries
            .range(q.last_delivered + 1..)
            .next()
            .map(|(seq, job)| (*seq, job.clone()))?;
        q.last_delivered = seq;
        q.pending.insert(
            seq,
            Delivery {
                consumer: consumer.to_owned(),
                at: Instant::now(),
                count: 1,
            },
        );
        Some(ClaimedJob {
            id: job_id(lane, seq),
            job,
            deliveries: 1,
        })
    }

    pub(crate) async fn claim(
        &self,
        lane: Lane,
        consumer: &str,
        block: Duration,
    ) -> Result<Option<ClaimedJob>, StoreError> {
        let deadline = Instant::now() + block;
        loop {
            // Register interest before looking, so an enqueue in between is not missed.
            let added = self.job_added.notified();
            tokio::pin!(added);
            added.as_mut().enable();
            if let Some(job) = self.take_next(lane, consumer) {
                return Ok(Some(job));
            }
            if tokio::time::timeout_at(deadline, added).await.is_err() {
                return Ok(None);
            }
        }
    }

    pub(crate) async fn queue_stats(&self, lane: Lane) -> Result<QueueStats, StoreError> {
        let s = self.lock();
        let q = &s.queues[lane_index(lane)];
        Ok(QueueStats {
            depth: q.entries.len() as u64,
            oldest_enqueued_at: q.enqueued_at.values().next().copied(),
            oldest_waiting_at: q
                .enqueued_at
                .range(q.last_delivered + 1..)
                .next()
                .map(|(_, at)| *at),
        })
    }

    pub(crate) async fn queue_position(
        &self,
        job: &Job,
        up_to: u64,
    ) -> Result<Option<u64>, StoreError> {
        let s = self.lock();
        let q = &s.queues[lane_index(job.lane())];
        Ok(q.entries
            .range(q.last_delivered + 1..)
            .take(usize::try_from(up_to).unwrap_or(usize::MAX))
            .position(|(_, queued)| queued == job)
            .map(|n| n as u64 + 1))
    }

    pub(crate) async fn ack(&self, id: &JobId) -> Result<(), StoreError> {
        let Some(seq) = parse_job_id(id) else {
            return Ok(());
        };
        let mut s = self.lock();
        let q = &mut s.queues[lane_index(id.lane)];
        q.pending.remove(&seq);
        q.entries.remove(&seq);
        q.enqueued_at.remove(&seq);
        Ok(())
    }

    pub(crate) async fn touch_job(&self, id: &JobId, consumer: &str) -> Result<(), StoreError> {
        let Some(seq) = parse_job_id(id) else {
            return Ok(());
        };
        let mut s = self.lock();
        if let Some(delivery) = s.queues[lane_index(id.lane)].pending.get_mut(&seq) {
            delivery.consumer = consumer.to_owned();
            delivery.at = Instant::now();
        }
        Ok(())
    }

    pub(crate) async fn hand_back(&self, id: &JobId, job: &Job) -> Result<JobId, StoreError> {
        // One lock for both, as the Redis transaction is one step.
        let new = {
            let lane = job.lane();
            let mut s = self.lock();
            if let Some(seq) = parse_job_id(id) {
                let q = &mut s.queues[lane_index(id.lane)];
                q.pending.remove(&seq);
                q.entries.remove(&seq);
                q.enqueued_at.remove(&seq);
            }
            let q = &mut s.queues[lane_index(lane)];
            q.next_seq += 1;
            let seq = q.next_seq;
            q.entries.insert(seq, job.clone());
            q.enqueued_at.insert(seq, Utc::now());
            job_id(lane, seq)
        };
        self.job_added.notify_waiters();
        Ok(new)
    }

    pub(crate) async fn reclaim_stale(
        &self,
        lane: Lane,
        consumer: &str,
        min_idle: Duration,
    ) -> Result<Vec<ClaimedJob>, StoreError> {
        let mut s = self.lock();
        let now = Instant::now();
        let queue = &mut s.queues[lane_index(lane)];
        let mut taken = Vec::new();
        for (seq, delivery) in queue.pending.iter_mut() {
            if now.duration_since(delivery.at) < min_idle {
                continue;
            }
            let Some(job) = queue.entries.get(seq) else {
                continue;
            };
            delivery.consumer = consumer.to_owned();
            delivery.at = now;
            delivery.count += 1;
            taken.push(ClaimedJob {
                id: job_id(lane, *seq),
                job: job.clone(),
                deliveries: delivery.count,
            });
        }
        Ok(taken)
    }

    pub(crate) async fn mark_step_done(
        &self,
        case: &CaseId,
        record: &StepRecord,
    ) -> Result<bool, StoreError> {
        let mut s = self.lock();
        let log = s.steps.entry(case.clone()).or_default();
        if log.contains_key(&record.step) {
            return Ok(false);
        }
        log.insert(record.step, record.clone());
        Ok(true)
    }

    pub(crate) async fn steps_done(&self, case: &CaseId) -> Result<Vec<StepRecord>, StoreError> {
        Ok(self
            .lock()
            .steps
            .get(case)
            .map(|log| log.values().cloned().collect())
            .unwrap_or_default())
    }

    pub(crate) async fn clear_steps(&self, case: &CaseId) -> Result<(), StoreError> {
        self.lock().steps.remove(case);
        Ok(())
    }

    pub(crate) async fn create_run(
        &self,
        id: &RunId,
        json: &str,
        files_json: &str,
    ) -> Result<(), StoreError> {
        let mut s = self.lock();
        if s.runs.contains_key(id) {
            return Err(StoreError::Conflict(format!("run {id} already exists")));
        }
        s.runs.insert(
            id.clone(),
            MemoryRun {
                json: json.to_owned(),
                version: 1,
                files: Some(files_json.to_owned()),
                ..MemoryRun::default()
            },
        );
        Ok(())
    }

    pub(crate) async fn load_run(&self, id: &RunId) -> Result<Option<StoredRun>, StoreError> {
        Ok(self.lock().runs.get(id).map(|run| StoredRun {
            json: run.json.clone(),
            version: run.version,
            output_total: run.total,
            output_kept: run.output.len() as u64,
        }))
    }

    pub(crate) async fn swap_run(
        &self,
        id: &RunId,
        expected: u64,
        json: &str,
    ) -> Result<bool, StoreError> {
        let written = {
            let mut s = self.lock();
            match s.runs.get_mut(id) {
                Some(run) if run.version == expected => {
                    run.version += 1;
                    run.json = json.to_owned();
                    true
                }
                _ => false,
            }
        };
        if written {
            self.run_wakers.wake(id);
        }
        Ok(written)
    }

    pub(crate) async fn append_run_output(
        &self,
        id: &RunId,
        chunk: &[u8],
        cap: u64,
    ) -> Result<OutputCount, StoreError> {
        let count = self.append_output_locked(id, chunk, cap);
        if count.total > 0 {
            self.run_wakers.wake(id);
        }
        Ok(count)
    }

    /// [`MemoryStore::append_run_output`]'s bookkeeping, under the lock.
    fn append_output_locked(&self, id: &RunId, chunk: &[u8], cap: u64) -> OutputCount {
        let mut s = self.lock();
        let Some(run) = s.runs.get_mut(id) else {
            return OutputCount { kept: 0, total: 0 };
        };
        run.total += chunk.len() as u64;
        let cap = usize::try_from(cap).unwrap_or(usize::MAX);
        let room = cap.saturating_sub(run.output.len()).min(chunk.len());
        run.output.extend_from_slice(&chunk[..room]);
        let rest = &chunk[room..];
        if !rest.is_empty() && cap > 0 {
            // As the Redis script does: cut back to the last `cap` bytes at twice that.
            run.tail.extend_from_slice(rest);
            if run.tail.len() >= cap.saturating_mul(2) {
                let over = run.tail.len() - cap;
                run.tail.drain(..over);
            }
        }
        OutputCount {
            kept: run.output.len() as u64,
            total: run.total,
        }
    }

    /// A watch on the run's changes, woken by [`MemoryStore::swap_run`] and
    /// [`MemoryStore::append_run_output`].
    pub(crate) async fn watch_run(&self, id: &RunId) -> super::RunWatch {
        self.run_wakers.watch(id)
    }

    pub(crate) async fn run_output(
        &self,
        id: &RunId,
        from: u64,
        max: u64,
    ) -> Result<(Vec<u8>, u64), StoreError> {
        let s = self.lock();
        let Some(run) = s.runs.get(id) else {
            return Ok((Vec::new(), 0));
        };
        let len = run.output.len();
        let start = usize::try_from(from).unwrap_or(usize::MAX).min(len);
        let end = start
            .saturating_add(usize::try_from(max).unwrap_or(usize::MAX))
            .min(len);
        Ok((run.output[start..end].to_vec(), len as u64))
    }

    pub(crate) async fn run_output_tail(
        &self,
        id: &RunId,
        max: u64,
    ) -> Result<Vec<u8>, StoreError> {
        let s = self.lock();
        let Some(run) = s.runs.get(id) else {
            return Ok(Vec::new());
        };
        let max = usize::try_from(max).unwrap_or(usize::MAX);
        Ok(run.tail[run.tail.len().saturating_sub(max)..].to_vec())
    }

    pub(crate) async fn run_files(&self, id: &RunId) -> Result<Option<String>, StoreError> {
        Ok(self.lock().runs.get(id).and_then(|run| run.files.clone()))
    }

    pub(crate) async fn replace_run_files(&self, id: &RunId, json: &str) -> Result<(), StoreError> {
        if let Some(run) = self.lock().runs.get_mut(id)
            && run.files.is_some()
        {
            run.files = Some(json.to_owned());
        }
        Ok(())
    }

    pub(crate) async fn delete_run_files(&self, id: &RunId) -> Result<(), StoreError> {
        if let Some(run) = self.lock().runs.get_mut(id) {
            run.files = None;
        }
        Ok(())
    }

    pub(crate) async fn append_audit(&self, event: &AuditEvent) -> Result<(), StoreError> {
        self.lock().audit.push(event.clone());
        Ok(())
    }

    pub(crate) async fn subject_of(&self, id: &CaseId) -> Result<Option<Subject>, StoreError> {
        Ok(self.lock().cases.get(id).map(|c| c.subject.clone()))
    }

    pub(crate) async fn recent_audit(
        &self,
        subject: &Subject,
        case: Option<&CaseId>,
        limit: usize,
    ) -> Result<AuditSlice, StoreError> {
        let s = self.lock();
        let matching: Vec<&AuditEvent> = s
            .audit
            .iter()
            .filter(|e| e.subject.as_ref() == Some(subject))
            .filter(|e| case.is_none_or(|c| e.case.as_ref() == Some(c)))
            .collect();
        let start = matching.len().saturating_sub(limit);
        Ok(AuditSlice {
            events: matching[start..].iter().map(|e| (*e).clone()).collect(),
            total: matching.len(),
        })
    }

    /// The cursor is the index of the next entry to read.
    pub(crate) async fn audit_page(
        &self,
        since: DateTime<Utc>,
        after: Option<&AuditCursor>,
        count: usize,
    ) -> Result<(Vec<AuditEvent>, Option<AuditCursor>), StoreError> {
        let from = match after {
            Some(cursor) => cursor
                .0
                .parse::<usize>()
                .map_err(|_| StoreError::Corrupt(format!("audit cursor {:?}", cursor.0)))?,
            None => 0,
        };
        let s = self.lock();
        let end = (from + count).min(s.audit.len());
        let events = s.audit[from.min(end)..end]
            .iter()
            .filter(|e| e.time >= since)
            .cloned()
            .collect();
        let next = (end < s.audit.len()).then(|| AuditCursor(end.to_string()));
        Ok((events, next))
    }
}

impl MemoryStore {
    pub(crate) async fn take_event(
        &self,
        sandbox: &str,
        event: &str,
        entry: &str,
        mark_ttl: Duration,
        _lifecycle_ttl: Duration,
    ) -> Result<Option<bool>, StoreError> {
        // Its own key space, as in Redis: an event mark never collides with a `first_time` key.
        if !self
            .first_time(&format!("\0e2b-event:{sandbox}:{event}"), mark_ttl)
            .await?
        {
            return Ok(None);
        }
        let mut s = self.lock();
        let list = s.lifecycles.entry(sandbox.to_owned()).or_default();
        if !list.iter().any(|e| e == entry) {
            list.push(entry.to_owned());
            let kept = crate::store::watch::LIFECYCLE_KEPT;
            if list.len() > kept {
                list.drain(..list.len() - kept);
            }
        }
        Ok(Some(s.open.contains_key(&format!("sandbox:{sandbox}"))))
    }

    pub(crate) async fn forget_event(&self, sandbox: &str, event: &str) -> Result<(), StoreError> {
        self.forget_first_time(&format!("\0e2b-event:{sandbox}:{event}"))
            .await
    }

    pub(crate) async fn lifecycle_of(&self, sandbox: &str) -> Result<Vec<String>, StoreError> {
        Ok(self
            .lock()
            .lifecycles
            .get(sandbox)
            .cloned()
            .unwrap_or_default())
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn record_creation(
        &self,
        rule: &str,
        group: &str,
        sandbox: &str,
        at_ms: i64,
        from_ms: i64,
        to_ms: i64,
        keep_ms: i64,
    ) -> Result<Vec<(String, i64)>, StoreError> {
        let mut s = self.lock();
        let set = s
            .watch_creations
            .entry((rule.to_owned(), group.to_owned()))
            .or_default();
        set.insert(sandbox.to_owned(), at_ms);
        set.retain(|_, ms| *ms >= at_ms - keep_ms);
        let mut found: Vec<(String, i64)> = set
            .iter()
            .filter(|(_, ms)| (from_ms..=to_ms).contains(*ms))
            .map(|(id, ms)| (id.clone(), *ms))
            .collect();
        found.sort_by(|a, b| (a.1, &a.0).cmp(&(b.1, &b.0)));
        Ok(found)
    }

    pub(crate) async fn burst_alert(
        &self,
        rule: &str,
        group: &str,
        candidate: &str,
        _ttl: Duration,
    ) -> Result<String, StoreError> {
        let mut s = self.lock();
        Ok(s.watch_alerts
            .entry((rule.to_owned(), group.to_owned()))
            .or_insert_with(|| candidate.to_owned())
            .clone())
    }

    pub(crate) async fn replace_burst_alert(
        &self,
        rule: &str,
        group: &str,
        current: &str,
        next: &str,
        _ttl: Duration,
    ) -> Result<String, StoreError> {
        let mut s = self.lock();
        let slot = s
            .watch_alerts
            .entry((rule.to_owned(), group.to_owned()))
            .or_insert_with(|| current.to_owned());
        if slot == current {
            *slot = next.to_owned();
        }
        Ok(slot.clone())
    }
}

/// The entries of an index at or before `up_to`, earliest first (one shard in memory).
fn entries(index: &HashMap<CaseId, DateTime<Utc>>, up_to: DateTime<Utc>) -> Vec<IndexEntry> {
    let mut found: Vec<IndexEntry> = index
        .iter()
        .filter(|(_, at)| **at <= up_to)
        .map(|(id, at)| IndexEntry {
            id: id.clone(),
            at: whole_ms(*at),
            shard: 0,
        })
        .collect();
    found.sort_by(|a, b| (a.at, a.id.as_str()).cmp(&(b.at, b.id.as_str())));
    found
}
