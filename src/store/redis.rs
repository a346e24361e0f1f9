//! The Redis backend: every command and Lua script Steward sends to Redis.
//!
//! Ordinary commands share one auto-reconnecting `ConnectionManager` with short connect and
//! response timeouts, so a dead Redis fails fast with `Unavailable` instead of hanging. Blocking
//! queue reads (`XREADGROUP BLOCK`) would stall every other command on a shared connection, so
//! they borrow a dedicated connection from a small pool instead.
//!
//! Case writes are Lua scripts over keys that share the subject's hash tag (see `keys.rs`), so
//! they are atomic on one node and on a Redis Cluster. This file must not decide which
//! transitions are legal; it only writes what `Store` hands it, if the version still matches.
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::streams::{
    StreamAutoClaimReply, StreamId, StreamPendingCountReply, StreamRangeReply, StreamReadReply,
};
use redis::{AsyncConnectionConfig, RedisError, Script};

use super::keys::{AUDIT_MAX_ENTRIES, CASE_RETENTION, JOB_GROUP, Keys};
use super::{
    AuditEvent, ClaimedJob, DecidedMark, JobId, LeftMark, Opened, StoreError, Swap, decode, encode,
    left_mark_ttl,
};
use crate::cases::{Case, CaseState, StepRecord, Subject};
use crate::ids::CaseId;
use crate::jobs::Job;

/// Longest wait for a TCP connection to Redis.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest wait for the answer to one ordinary command.
pub const RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest `claim` block; longer requests are shortened to this.
pub const MAX_CLAIM_BLOCK: Duration = Duration::from_secs(10);
/// Reconnection attempts per failure before a command reports `Unavailable`.
const RECONNECT_RETRIES: usize = 2;
/// Dedicated blocking connections kept for reuse.
const BLOCKING_POOL_SIZE: usize = 4;
/// Entries read per `XRANGE` / `XAUTOCLAIM` page.
const PAGE: usize = 500;
/// Stream ids come from the Redis server's clock and audit times from ours, so `audit_since`
/// starts reading this much earlier and then filters by the event's own time.
const AUDIT_CLOCK_SKEW_MS: i64 = 60_000;
/// Field of a queue entry that holds the job's JSON.
const JOB_FIELD: &str = "job";
/// Field of an audit entry that holds the event's JSON.
const AUDIT_FIELD: &str = "event";

/// Opens a case unless the subject has an open one.
/// KEYS: open pointer, case hash (one slot). ARGV: id, json, ttl ms.
/// Returns {1, id} when created, {0, existing id} otherwise.
static OPEN_CASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local existing = redis.call('GET', KEYS[1])
if existing then
  return {0, existing}
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
redis.call('HSET', KEYS[2], 'v', 1, 'json', ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return {1, ARGV[1]}
"#,
    )
});

/// Compare-and-swap of one case, keeping the subject's open pointer in step.
/// KEYS: case hash, open pointer. ARGV: expected version, new json, new version, id,
/// '1' if the new state is open, ttl ms.
/// Returns {1,''} written, {0,json} stale, {2,holder} subject busy, {3,''} missing.
static SWAP_CASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local v = redis.call('HGET', KEYS[1], 'v')
if not v then
  return {3, ''}
end
if v ~= ARGV[1] then
  return {0, redis.call('HGET', KEYS[1], 'json')}
end
local holder = redis.call('GET', KEYS[2])
if ARGV[5] == '1' then
  if holder and holder ~= ARGV[4] then
    return {2, holder}
  end
  redis.call('SET', KEYS[2], ARGV[4], 'PX', ARGV[6])
elseif holder == ARGV[4] then
  redis.call('DEL', KEYS[2])
end
redis.call('HSET', KEYS[1], 'v', ARGV[3], 'json', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[6])
return {1, ''}
"#,
    )
});

/// Deletes a key only if it still holds the given value: clears a dangling open pointer that
/// still names its case, and releases a lease only for its holder.
static DELETE_IF_EQUAL: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"#,
    )
});

/// Sets the sweep marker unless it already holds a later time (RFC 3339 in UTC with a fixed
/// format sorts as text). KEYS: marker. ARGV: time.
static ADVANCE_MARKER: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local current = redis.call('GET', KEYS[1])
if current and current >= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1])
return 1
"#,
    )
});

static RENEW_LEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"#,
    )
});

/// Drops an index entry only if its score is still the one read.
/// KEYS: sorted set. ARGV: member, score.
static FORGET_IF_SCORE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if score and tonumber(score) == tonumber(ARGV[2]) then
  return redis.call('ZREM', KEYS[1], ARGV[1])
end
return 0
"#,
    )
});

/// Moves an index entry to a new score only if its score is still the one read.
/// KEYS: sorted set. ARGV: member, old score, new score. Returns 1 when moved.
static MOVE_IF_SCORE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if score and tonumber(score) == tonumber(ARGV[2]) then
  redis.call('ZADD', KEYS[1], 'XX', ARGV[3], ARGV[1])
  return 1
end
return 0
"#,
    )
});

/// A cheap-to-clone handle to Redis.
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

struct Inner {
    keys: Keys,
    client: redis::Client,
    conn: ConnectionManager,
    blocking: Mutex<Vec<MultiplexedConnection>>,
}

/// Sorts Redis failures into "can't reach it" and "it said no".
fn map_err(e: RedisError) -> StoreError {
    let unreachable = e.is_io_error()
        || e.is_connection_refusal()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.kind() == redis::ErrorKind::ClusterConnectionNotFound;
    if unreachable {
        StoreError::Unavailable(e.to_string())
    } else {
        StoreError::Backend(e.to_string())
    }
}

/// Short timeouts and few reconnection attempts: a dead Redis must fail fast.
fn manager_config() -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(CONNECT_TIMEOUT))
        .set_response_timeout(Some(RESPONSE_TIMEOUT))
        .set_number_of_retries(RECONNECT_RETRIES)
        .set_max_delay(Duration::from_millis(500))
}

fn slot_text(slot: DateTime<Utc>) -> String {
    slot.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

fn field(entry: &StreamId, name: &str) -> Result<String, StoreError> {
    entry
        .get::<String>(name)
        .ok_or_else(|| StoreError::Corrupt(format!("stream entry {} has no {name}", entry.id)))
}

impl RedisStore {
    /// Connects (failing fast when Redis is unreachable) and makes sure the job queue's
    /// consumer group exists.
    pub async fn connect(url: &str, key_prefix: &str) -> Result<Self, StoreError> {
        let keys = Keys::new(key_prefix).map_err(StoreError::Invalid)?;
        // The parse error could quote the URL, which may hold a password: say less.
        let client = redis::Client::open(url)
            .map_err(|_| StoreError::Invalid("REDIS_URL is not a valid redis:// URL".into()))?;
        let connecting = ConnectionManager::new_with_config(client.clone(), manager_config());
        let conn = tokio::time::timeout(CONNECT_TIMEOUT * 3, connecting)
            .await
            .map_err(|_| StoreError::Unavailable("timed out connecting".into()))?
            .map_err(map_err)?;
        let store = Self {
            inner: Arc::new(Inner {
                keys,
                client,
                conn,
                blocking: Mutex::new(Vec::new()),
            }),
        };
        store.ensure_group().await?;
        Ok(store)
    }

    /// Like [`RedisStore::connect`] but without connecting yet: the first command connects
    /// (and each later one reconnects if needed), so a service can start while Redis is down
    /// and report it through readiness instead of crashing. The job queue's consumer group is
    /// created by the first `claim`.
    pub fn connect_lazy(url: &str, key_prefix: &str) -> Result<Self, StoreError> {
        let keys = Keys::new(key_prefix).map_err(StoreError::Invalid)?;
        let client = redis::Client::open(url)
            .map_err(|_| StoreError::Invalid("REDIS_URL is not a valid redis:// URL".into()))?;
        let conn = ConnectionManager::new_lazy_with_config(client.clone(), manager_config())
            .map_err(map_err)?;
        Ok(Self {
            inner: Arc::new(Inner {
                keys,
                client,
                conn,
                blocking: Mutex::new(Vec::new()),
            }),
        })
    }

    pub fn keys(&self) -> &Keys {
        &self.inner.keys
    }

    fn conn(&self) -> ConnectionManager {
        self.inner.conn.clone()
    }

    /// Creates the consumer group (reading from the start, so jobs enqueued before the first
    /// worker started are not skipped). An existing group is fine.
    async fn ensure_group(&self) -> Result<(), StoreError> {
        let result: Result<(), RedisError> = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(self.keys().jobs())
            .arg(JOB_GROUP)
            .arg("0")
            .arg("MKSTREAM")
            .query_async(&mut self.conn())
            .await;
        match result {
            Ok(()) => Ok(()),
            Err(e) if e.code() == Some("BUSYGROUP") => Ok(()),
            Err(e) => Err(map_err(e)),
        }
    }

    pub(crate) async fn ping(&self) -> Result<(), StoreError> {
        let _: String = redis::cmd("PING")
            .query_async(&mut self.conn())
            .await
            .map_err(map_err)?;
        Ok(())
    }

    // ----- cases -----

    pub(crate) async fn open_case(&self, case: Case) -> Result<Opened, StoreError> {
        let keys = self.keys();
        let json = encode(&case)?;
        let ttl = ms(CASE_RETENTION);
        let mut conn = self.conn();
        // The id -> subject index and the deadline index are written first: if we crash
        // before the case itself, both point at nothing, which readers treat as absent.
        redis::pipe()
            .cmd("SET")
            .arg(keys.case_subject(&case.id))
            .arg(case.subject.key())
            .arg("PX")
            .arg(ttl)
            .ignore()
            .cmd("ZADD")
            .arg(keys.due())
            .arg(case.decide_by.timestamp_millis())
            .arg(case.id.as_str())
            .ignore()
            .query_async::<()>(&mut conn)
            .await
            .map_err(map_err)?;
        // One retry covers a pointer left dangling by a case that outlived its retention.
        for _ in 0..2 {
            let (created, id): (i64, String) = OPEN_CASE
                .key(keys.open_case(&case.subject))
                .key(keys.case(&case.subject, &case.id))
                .arg(case.id.as_str())
                .arg(&json)
                .arg(ttl)
                .invoke_async(&mut conn)
                .await
                .map_err(map_err)?;
            if created == 1 {
                return Ok(Opened::Created(case));
            }
            let existing_id = CaseId::parse(&id).map_err(|e| StoreError::Corrupt(e.to_string()))?;
            match self.load_case(&existing_id).await? {
                Some(existing) if existing.state.is_open() => {
                    self.forget_new(&case.id).await?;
                    return Ok(Opened::Existing(existing));
                }
                _ => {
                    let _: i64 = DELETE_IF_EQUAL
                        .key(keys.open_case(&case.subject))
                        .arg(existing_id.as_str())
                        .invoke_async(&mut conn)
                        .await
                        .map_err(map_err)?;
                }
            }
        }
        Err(StoreError::Conflict(format!(
            "{} keeps getting new open cases",
            case.subject
        )))
    }

    /// Removes the indexes written for a case that turned out not to be needed.
    async fn forget_new(&self, id: &CaseId) -> Result<(), StoreError> {
        redis::pipe()
            .cmd("DEL")
            .arg(self.keys().case_subject(id))
            .ignore()
            .cmd("ZREM")
            .arg(self.keys().due())
            .arg(id.as_str())
            .ignore()
            .query_async::<()>(&mut self.conn())
            .await
            .map_err(map_err)
    }

    pub(crate) async fn load_case(&self, id: &CaseId) -> Result<Option<Case>, StoreError> {
        let mut conn = self.conn();
        let subject_key: Option<String> = redis::cmd("GET")
            .arg(self.keys().case_subject(id))
            .query_async(&mut conn)
            .await
            .map_err(map_err)?;
        let Some(subject_key) = subject_key else {
            return Ok(None);
        };
        let json: Option<String> = redis::cmd("HGET")
            .arg(self.keys().case_by_subject_key(&subject_key, id))
            .arg("json")
            .query_async(&mut conn)
            .await
            .map_err(map_err)?;
        json.map(|j| decode(&format!("case {id}"), &j)).transpose()
    }

    pub(crate) async fn open_case_id(
        &self,
        subject: &Subject,
    ) -> Result<Option<CaseId>, StoreError> {
        let id: Option<String> = redis::cmd("GET")
            .arg(self.keys().open_case(subject))
            .query_async(&mut self.conn())
            .await
            .map_err(map_err)?;
        id.map(|id| CaseId::parse(id).map_err(|e| StoreError::Corrupt(e.to_string())))
            .transpose()
    }

    pub(crate) async fn swap_case(
        &self,
        expected: u64,
        next: &Case,
        decided: DecidedMark,
    ) -> Result<Swap, StoreError> {
        let keys = self.keys();
        let mut conn = self.conn();
        let pending = next.state == CaseState::Pending;
        // Indexes first (see open_case): a stray index entry is harmless, a missing one is
        // not. The indexes are global keys, outside the case's Cluster slot, so they cannot
        // join the script; every reader re-checks the case itself.
        let index_decided = match decided {
            DecidedMark::Enter(at) => Some((None, at)),
            DecidedMark::Keep(at) => Some((Some("NX"), at)),
            DecidedMark::Leave => None,
        };
        if let Some((flag, at)) = index_decided {
            let _: i64 = redis::cmd("ZADD")
                .arg(keys.decided())
                .arg(flag)
                .arg(at.timestamp_millis())
                .arg(next.id.as_str())
                .query_async(&mut conn)
                .await
                .map_err(map_err)?;
        }
        if pending {
            let _: i64 = redis::cmd("ZADD")
                .arg(keys.due())
                .arg(next.decide_by.timestamp_millis())
                .arg(next.id.as_str())
                .query_async(&mut conn)
                .await
                .map_err(map_err)?;
        }
        let (code, payload): (i64, String) = SWAP_CASE
            .key(keys.case(&next.subject, &next.id))
            .key(keys.open_case(&next.subject))
            .arg(expected)
            .arg(encode(next)?)
            .arg(next.version)
            .arg(next.id.as_str())
            .arg(if next.state.is_open() { "1" } else { "0" })
            .arg(ms(CASE_RETENTION))
            .invoke_async(&mut conn)
            .await
            .map_err(map_err)?;
        match code {
            1 => {
                if !pending {
                    self.forget_due(&next.id).await?;
                }
                if decided == DecidedMark::Leave {
                    let _: i64 = redis::cmd("ZREM")
                        .arg(keys.decided())
                        .arg(next.id.as_str())
                        .query_async(&mut conn)
                        .await
                        .map_err(map_err)?;
                }
                Ok(Swap::Written)
            }
            0 => {
                let stored: Case = decode(&format!("case {}", next.id), &payload)?;
                // The index was moved for a write that lost; put the stored deadline back.
                if pending && stored.state == CaseState::Pending {
                    let _: i64 = redis::cmd("ZADD")
                        .arg(keys.due())
                        .arg(stored.decide_by.timestamp_millis())
                        .arg(stored.id.as_str())
                        .query_async(&mut conn)
                        .await
                        .map_err(map_err)?;
                }
                Ok(Swap::Stale(Box::new(stored)))
            }
            2 => Ok(Swap::SubjectBusy(
                CaseId::parse(payload).map_err(|e| StoreError::Corrupt(e.to_string()))?,
            )),
            _ => Ok(Swap::Missing),
        }
    }

    pub(crate) async fn due_ids(&self, now: DateTime<Utc>) -> Result<Vec<CaseId>, StoreError> {
        let ids: Vec<String> = redis::cmd("ZRANGE")
            .arg(self.keys().due())
            .arg("-inf")
            .arg(now.timestamp_millis())
            .arg("BYSCORE")
            .query_async(&mut self.conn())
            .await
            .map_err(map_err)?;
        ids.into_iter()
            .map(|id| CaseId::parse(id).map_err(|e| StoreError::Corrupt(e.to_string())))
            .collect()
    }

    pub(crate) async fn forget_due(&self, id: &CaseId) -> Result<(), StoreError> {
        let _: i64 = redis::cmd("ZREM")
            .arg(self.keys().due())
            .arg(id.as_str())
            .query_async(&mut self.conn())
            .await
            .map_err(map_err)?;
        Ok(())
    }

    pub(crate) async fn decided_ids(
        &self,
        cutoff: DateTime<Utc>,
    ) -> Result<Vec<(CaseId, DateTime<Utc>)>, StoreError> {
        let flat: Vec<(String, f64)> = redis::cmd("ZRANGE")
            .arg(self.keys().decided())
            .arg("-inf")
            .arg(cutoff.timestamp_millis())
            .arg("BYSCORE")
            .arg("WITHSCORES")
            .query_async(&mut self.conn())
            .await
            .map_err(map_err)?;
        flat.into_iter()
            .map(|(id, at)| {
                let id = CaseId::parse(id).map_err(|e| StoreError::Corrupt(e.to_string()))?;
                // Scores are whole milliseconds, exact in a double.
                let at = DateTime::from_timestamp_millis(at as i64)
                    .ok_or_else(|| StoreError::Corrupt(format!("decided index score {at}")))?;
                Ok((id, at))
            })
            .collect()
    }

    pub(crate) async fn forget_decided(
        &self,
        id: &CaseId,
        at: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let _: i64 = FORGET_IF_SCORE
            .key(self.keys().decided())
            .arg(id.as_str())
            .arg(at.timestamp_millis())
            .invoke_async(&mut self.conn())
            .await
            .map_err(map_err)?;
        Ok(())
    }

    pub(crate) async fn postpone_decided(
        &self,
        id: &CaseId,
        since: DateTime<Utc>,
        until: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        let moved: i64 = MOVE_IF_SCORE
            .key(self.keys().decided())
            .arg(id.as_str())
            .arg(since.timestamp_millis())
            .arg(until.timestamp_millis())
            .invoke_async(&mut self.conn())
            .await
            .map_err(map_err)?;
        Ok(moved == 1)
    }

    // ----- what sweeps need -----

    pub(crate) async fn set_left_mark(
        &self,
        subject: &Subject,
        mark: &LeftMark,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        redis::cmd("SET")
            .arg(self.keys().left(subject))
            .arg(encode(mark)?)
            .arg("PX")
            .arg(ms(left_mark_ttl(mark, now)))
            .query_async::<()>(&mut self.conn())
            .await
            .map_err(map_err)
    }

    /// One pipeline of GETs rather than MGET: the keys live in different cluster slots.
    pub(crate) async fn left_marks(
        &self,
        subjects: &[Subject],
    ) -> Result<Vec<Option<LeftMark>>, StoreError> {
        let mut pipe = redis::pipe();
        for subject in subjects {
            pipe.get(self.keys().left(subject));
        }
        let found: Vec<Option<String>> =
            pipe.query_async(&mut self.conn()).await.map_err(map_err)?;
        found
            .into_iter()
            .map(|json| json.map(|j| decode("leave mark", &j)).transpose())
            .collect()
    }

    pub(crate) async fn open_case_ids(
        &self,
        subjects: &[Subject],
    ) -> Result<Vec<Option<CaseId>>, StoreError> {
        let mut pipe = redis::pipe();
        for subject in subjects {
            pipe.get(self.keys().open_case(subject));
        }
        let found: Vec<Option<String>> =
            pipe.query_async(&mut self.conn()).await.map_err(map_err)?;
        found
            .into_iter()
            .map(|id| {
                id.map(|id| CaseId::parse(id).map_err(|e| StoreError::Corrupt(e.to_string())))
                    .transpose()
            })
            .collect()
    }

    pub(crate) async fn last_completed_sweep(&self) -> Result<Option<DateTime<Utc>>, StoreError> {
        let text: Option<String> = redis::cmd("GET")
            .arg(self.keys().last_sweep())
            .query_async(&mut self.conn())
            .await
            .map_err(map_err)?;
        text.map(|t| {
            DateTime::parse_from_rfc3339(&t)
                .map(|d| d.with_timezone(&Utc))
                .map_err(|e| StoreError::Corrupt(format!("sweep marker {t:?}: {e}")))
        })
        .transpose()
    }

    pub(crate) async fn record_completed_sweep(
        &self,
        slot: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        ADVANCE_MARKER
            .key(self.keys().last_sweep())
            .arg(slot.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
            .invoke_async::<i64>(&mut self.conn())
            .await
            .map_err(map_err)?;
        Ok(())
    }

    pub(crate) async fn record_sweep_digest(
        &self,
        slot: DateTime<Utc>,
        posted: &str,
    ) -> Result<(), StoreError> {
        redis::cmd("SET")
            .arg(self.keys().sweep_digest(&slot_text(slot)))
            .arg(posted)
            .arg("PX")
            .arg(ms(super::SWEEP_DIGEST_TTL))
            .query_async::<()>(&mut self.conn())
            .await
            .map_err(map_err)
    }

    pub(crate) async fn sweep_digest(
        &self,
        slot: DateTime<Utc>,
    ) -> Result<Option<String>, StoreError> {
        redis::cmd("GET")
            .arg(self.keys().sweep_digest(&slot_text(slot)))
            .query_async(&mut self.conn())
            .await
            .map_err(map_err)
    }

    // ----- deduplication and leases -----

    pub(crate) async fn first_time(&self, key: &str, ttl: Duration) -> Result<bool, StoreError> {
        let set: Option<String> = redis::cmd("SET")
            .arg(self.keys().dedupe(key))
            .arg(1)
            .arg("NX")
            .arg("PX")
            .arg(ms(ttl))
            .query_async(&mut self.conn())
            .await
            .map_err(map_err)?;
        Ok(set.is_some())
    }

    pub(crate) async fn acquire_lease(
        &self,
        name: &str,
        holder: &str,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let set: Option<String> = redis::cmd("SET")
            .arg(self.keys().lease(name))
            .arg(holder)
            .arg("NX")
            .arg("PX")
            .arg(ms(ttl))
            .query_async(&mut self.conn())
            .await
            .map_err(map_err)?;
        Ok(set.is_some())
    }

    pub(crate) async fn lease_held(&self, name: &str) -> Result<bool, StoreError> {
        let held: i64 = redis::cmd("EXISTS")
            .arg(self.keys().lease(name))
            .query_async(&mut self.conn())
            .await
            .map_err(map_err)?;
        Ok(held == 1)
    }

    pub(crate) async fn renew_lease(
        &self,
        name: &str,
        holder: &str,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let renewed: i64 = RENEW_LEASE
            .key(self.keys().lease(name))
            .arg(holder)
            .arg(ms(ttl))
            .invoke_async(&mut self.conn())
            .await
            .map_err(map_err)?;
        Ok(renewed == 1)
    }

    pub(crate) async fn release_lease(&self, name: &str, holder: &str) -> Result<bool, StoreError> {
        let released: i64 = DELETE_IF_EQUAL
            .key(self.keys().lease(name))
            .arg(holder)
            .invoke_async(&mut self.conn())
            .await
            .map_err(map_err)?;
        Ok(released == 1)
    }

    // ----- job queue and step logs -----

    pub(crate) async fn enqueue(&self, job: &Job) -> Result<JobId, StoreError> {
        let id: String = redis::cmd("XADD")
            .arg(self.keys().jobs())
            .arg("*")
            .arg(JOB_FIELD)
            .arg(encode(job)?)
            .query_async(&mut self.conn())
            .await
            .map_err(map_err)?;
        Ok(JobId(id))
    }

    /// A dedicated connection for one blocking read, reused when possible.
    async fn blocking_conn(&self) -> Result<MultiplexedConnection, StoreError> {
        let pooled = self
            .inner
            .blocking
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop();
        if let Some(conn) = pooled {
            return Ok(conn);
        }
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_response_timeout(Some(MAX_CLAIM_BLOCK + RESPONSE_TIMEOUT));
        self.inner
            .client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(map_err)
    }

    fn return_blocking_conn(&self, conn: MultiplexedConnection) {
        let mut pool = self
            .inner
            .blocking
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if pool.len() < BLOCKING_POOL_SIZE {
            pool.push(conn);
        }
    }

    pub(crate) async fn claim(
        &self,
        consumer: &str,
        block: Duration,
    ) -> Result<Option<ClaimedJob>, StoreError> {
        let block = block.min(MAX_CLAIM_BLOCK);
        loop {
            let mut cmd = redis::cmd("XREADGROUP");
            cmd.arg("GROUP")
                .arg(JOB_GROUP)
                .arg(consumer)
                .arg("COUNT")
                .arg(1);
            if !block.is_zero() {
                cmd.arg("BLOCK").arg(ms(block));
            }
            cmd.arg("STREAMS").arg(self.keys().jobs()).arg(">");
            let reply: Result<Option<StreamReadReply>, RedisError> = if block.is_zero() {
                cmd.query_async(&mut self.conn()).await
            } else {
                let mut conn = self.blocking_conn().await?;
                let reply = cmd.query_async(&mut conn).await;
                // A connection that failed may be broken; only healthy ones go back.
                if reply.is_ok() {
                    self.return_blocking_conn(conn);
                }
                reply
            };
            let reply = match reply {
                Ok(reply) => reply,
                // Someone deleted the stream (and its group): recreate and read again.
                Err(e) if e.code() == Some("NOGROUP") => {
                    self.ensure_group().await?;
                    continue;
                }
                Err(e) => return Err(map_err(e)),
            };
            let Some(entry) = reply.and_then(|r| r.keys.into_iter().next()?.ids.into_iter().next())
            else {
                return Ok(None);
            };
            match self.decode_job(&entry) {
                Ok(job) => {
                    return Ok(Some(ClaimedJob {
                        id: JobId(entry.id),
                        job,
                        deliveries: 1,
                    }));
                }
                Err(e) => self.drop_poison(&entry.id, &e).await?,
            }
        }
    }

    fn decode_job(&self, entry: &StreamId) -> Result<Job, StoreError> {
        decode(&format!("job {}", entry.id), &field(entry, JOB_FIELD)?)
    }

    /// Acknowledges an entry that can never be decoded, so it does not come back forever.
    async fn drop_poison(&self, id: &str, error: &StoreError) -> Result<(), StoreError> {
        tracing::error!(job = id, %error, "dropping a queue entry that cannot be decoded");
        self.ack(&JobId(id.to_owned())).await
    }

    pub(crate) async fn ack(&self, id: &JobId) -> Result<(), StoreError> {
        // Deleting after the ack keeps the stream short; the audit log is the history.
        redis::pipe()
            .cmd("XACK")
            .arg(self.keys().jobs())
            .arg(JOB_GROUP)
            .arg(&id.0)
            .ignore()
            .cmd("XDEL")
            .arg(self.keys().jobs())
            .arg(&id.0)
            .ignore()
            .query_async::<()>(&mut self.conn())
            .await
            .map_err(map_err)
    }

    pub(crate) async fn reclaim_stale(
        &self,
        consumer: &str,
        min_idle: Duration,
    ) -> Result<Vec<ClaimedJob>, StoreError> {
        let mut conn = self.conn();
        let mut cursor = "0-0".to_owned();
        let mut taken = Vec::new();
        loop {
            let reply: Result<StreamAutoClaimReply, RedisError> = redis::cmd("XAUTOCLAIM")
                .arg(self.keys().jobs())
                .arg(JOB_GROUP)
                .arg(consumer)
                .arg(u64::try_from(min_idle.as_millis()).unwrap_or(u64::MAX))
                .arg(&cursor)
                .arg("COUNT")
                .arg(PAGE)
                .query_async(&mut conn)
                .await;
            let reply = match reply {
                Ok(reply) => reply,
                // No group yet (a lazily connected store, or the stream was deleted): nobody
                // can have claimed anything, so there is nothing to take over.
                Err(e) if e.code() == Some("NOGROUP") => {
                    self.ensure_group().await?;
                    return Ok(taken);
                }
                Err(e) => return Err(map_err(e)),
            };
            for entry in reply.claimed {
                match self.decode_job(&entry) {
                    Ok(job) => {
                        let deliveries = self.deliveries(&entry.id).await?;
                        taken.push(ClaimedJob {
                            id: JobId(entry.id),
                            job,
                            deliveries,
                        });
                    }
                    Err(e) => self.drop_poison(&entry.id, &e).await?,
                }
            }
            if reply.next_stream_id == "0-0" {
                return Ok(taken);
            }
            cursor = reply.next_stream_id;
        }
    }

    /// How many times an entry has been delivered (XAUTOCLAIM counts a takeover).
    async fn deliveries(&self, id: &str) -> Result<u64, StoreError> {
        let reply: StreamPendingCountReply = redis::cmd("XPENDING")
            .arg(self.keys().jobs())
            .arg(JOB_GROUP)
            .arg(id)
            .arg(id)
            .arg(1)
            .query_async(&mut self.conn())
            .await
            .map_err(map_err)?;
        Ok(reply
            .ids
            .first()
            .map(|p| p.times_delivered as u64)
            .unwrap_or(1))
    }

    pub(crate) async fn mark_step_done(
        &self,
        case: &CaseId,
        record: &StepRecord,
    ) -> Result<bool, StoreError> {
        let key = self.keys().steps(case);
        let (added, _): (i64, i64) = redis::pipe()
            .cmd("HSETNX")
            .arg(&key)
            .arg(record.step.as_str())
            .arg(encode(record)?)
            .cmd("PEXPIRE")
            .arg(&key)
            .arg(ms(CASE_RETENTION))
            .query_async(&mut self.conn())
            .await
            .map_err(map_err)?;
        Ok(added == 1)
    }

    pub(crate) async fn steps_done(&self, case: &CaseId) -> Result<Vec<StepRecord>, StoreError> {
        let values: Vec<String> = redis::cmd("HVALS")
            .arg(self.keys().steps(case))
            .query_async(&mut self.conn())
            .await
            .map_err(map_err)?;
        values
            .iter()
            .map(|v| decode(&format!("step log of {case}"), v))
            .collect()
    }

    pub(crate) async fn clear_steps(&self, case: &CaseId) -> Result<(), StoreError> {
        let _: i64 = redis::cmd("DEL")
            .arg(self.keys().steps(case))
            .query_async(&mut self.conn())
            .await
            .map_err(map_err)?;
        Ok(())
    }

    // ----- audit -----

    pub(crate) async fn append_audit(&self, event: &AuditEvent) -> Result<(), StoreError> {
        let _: String = redis::cmd("XADD")
            .arg(self.keys().audit())
            .arg("MAXLEN")
            .arg("~")
            .arg(AUDIT_MAX_ENTRIES)
            .arg("*")
            .arg(AUDIT_FIELD)
            .arg(encode(event)?)
            .query_async(&mut self.conn())
            .await
            .map_err(map_err)?;
        Ok(())
    }

    pub(crate) async fn audit_scan(
        &self,
        since: Option<DateTime<Utc>>,
    ) -> Result<Vec<AuditEvent>, StoreError> {
        let mut conn = self.conn();
        let mut start = match since {
            Some(t) => format!("{}", (t.timestamp_millis() - AUDIT_CLOCK_SKEW_MS).max(0)),
            None => "-".to_owned(),
        };
        let mut events = Vec::new();
        loop {
            let page: StreamRangeReply = redis::cmd("XRANGE")
                .arg(self.keys().audit())
                .arg(&start)
                .arg("+")
                .arg("COUNT")
                .arg(PAGE)
                .query_async(&mut conn)
                .await
                .map_err(map_err)?;
            let Some(last) = page.ids.last().map(|e| e.id.clone()) else {
                return Ok(events);
            };
            for entry in &page.ids {
                events.push(decode(
                    &format!("audit entry {}", entry.id),
                    &field(entry, AUDIT_FIELD)?,
                )?);
            }
            if page.ids.len() < PAGE {
                return Ok(events);
            }
            // An exclusive start: continue after the last entry read.
            start = format!("({last}");
        }
    }
}
