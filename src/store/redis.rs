//! The Redis backend: every command and Lua script Steward sends to Redis.
//!
//! One Redis server (`redis://`, `rediss://`) or a Redis Cluster (`redis+cluster://h1:p1,h2:p2`,
//! see [`cluster_nodes`]). On one server, ordinary commands share one auto-reconnecting
//! `ConnectionManager`; on a cluster, one cluster connection that follows the slot map. Both
//! have short connect and response timeouts, so a dead Redis fails fast with `Unavailable`
//! instead of hanging. Blocking queue reads (`XREADGROUP BLOCK`) would stall every other command
//! on a shared connection, so they borrow a dedicated connection from a small pool instead.
//!
//! Every script and pipeline touches keys of one hash tag (see `keys.rs`), so it stays in one
//! Cluster slot: a case write is one Lua script over the case, its subject's open pointer, its
//! Leave mark and its shard's two indexes. A write whose answer is lost is read back by its
//! write token and reported as written, not written, or [`StoreError::Unconfirmed`]. This file
//! must not decide which transitions are legal; it only writes what `Store` hands it, if the
//! version still matches.
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use redis::aio::{
    ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection,
};
use redis::cluster::{ClusterClient, ClusterClientBuilder, ClusterConfig};
use redis::cluster_async::ClusterConnection;
use redis::streams::{
    StreamAutoClaimReply, StreamId, StreamPendingCountReply, StreamRangeReply, StreamReadReply,
};
use redis::{AsyncConnectionConfig, Cmd, Pipeline, RedisError, RedisFuture, Script, Value};

use super::Job;
use super::keys::{
    AUDIT_MAX_ENTRIES, CASE_RETENTION, INDEX_SHARDS, JOB_GROUP, Keys, POINTER_MARGIN,
    SUBJECT_AUDIT_MAX_ENTRIES, shard_of,
};
use super::{
    AuditCursor, AuditEvent, AuditSlice, ClaimedJob, DecidedMark, IndexEntry, JobId, LeftMark,
    Opened, StoreError, Swap, decode, encode, left_mark_ttl,
};
use crate::cases::{Case, CaseState, StepRecord, Subject};
use crate::ids::CaseId;

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

/// Opens a case unless the subject has an open one, indexing it by deadline in the same step.
/// KEYS: open pointer, case hash, due index of the shard (one slot). ARGV: id, json, ttl ms,
/// deadline ms, write token. Returns {1, id} when created, {0, existing id} otherwise.
static OPEN_CASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local existing = redis.call('GET', KEYS[1])
if existing then
  return {0, existing}
end
redis.call('ZADD', KEYS[3], ARGV[4], ARGV[1])
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
redis.call('HSET', KEYS[2], 'v', 1, 'json', ARGV[2], 'w', ARGV[5])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return {1, ARGV[1]}
"#,
    )
});

/// Compare-and-swap of one case with every index that follows it, in one atomic step.
/// KEYS: case hash, open pointer, due index, decided index, Leave mark (one slot).
/// ARGV: 1 expected version, 2 new json, 3 new version, 4 id, 5 '1' if the new state is open,
/// 6 ttl ms, 7 write token, 8 deadline ms if the new state is Pending (else ''),
/// 9 decided move ('enter', 'keep' or 'leave'), 10 decided score ms, 11 Leave mark json (or ''),
/// 12 Leave mark ttl ms.
/// Returns {1, strays} written (strays: index entries that could not be removed), {0, json}
/// stale, {2, holder} subject busy, {3, ''} missing.
///
/// Redis does not roll a script back, so everything that can fail (an index of the wrong type)
/// comes before the case is written, and the removals after it use `pcall`: either nothing of
/// the case is written, or all of it is and only a harmless stray index entry may remain.
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
if ARGV[5] == '1' and holder and holder ~= ARGV[4] then
  return {2, holder}
end
if ARGV[8] ~= '' then
  redis.call('ZADD', KEYS[3], ARGV[8], ARGV[4])
end
if ARGV[9] == 'enter' then
  redis.call('ZADD', KEYS[4], ARGV[10], ARGV[4])
elseif ARGV[9] == 'keep' then
  redis.call('ZADD', KEYS[4], 'NX', ARGV[10], ARGV[4])
end
if ARGV[11] ~= '' then
  redis.call('SET', KEYS[5], ARGV[11], 'PX', ARGV[12])
end
if ARGV[5] == '1' then
  redis.call('SET', KEYS[2], ARGV[4], 'PX', ARGV[6])
elseif holder == ARGV[4] then
  redis.call('DEL', KEYS[2])
end
redis.call('HSET', KEYS[1], 'v', ARGV[3], 'json', ARGV[2], 'w', ARGV[7])
redis.call('PEXPIRE', KEYS[1], ARGV[6])
local strays = 0
local function drop(key)
  local r = redis.pcall('ZREM', key, ARGV[4])
  if type(r) == 'table' and r.err then
    strays = strays + 1
  end
end
if ARGV[8] == '' then
  drop(KEYS[3])
end
if ARGV[9] == 'leave' then
  drop(KEYS[4])
end
return {1, tostring(strays)}
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
    client: Client,
    conn: Conn,
    blocking: Mutex<Vec<Conn>>,
}

/// Where commands go: one server or a cluster.
enum Client {
    Single(redis::Client),
    /// The second client answers slowly enough for blocking reads.
    Cluster {
        blocking: Box<ClusterClient>,
    },
}

/// One connection handle of either kind; cloning shares the connection.
#[derive(Clone)]
enum Conn {
    Manager(ConnectionManager),
    Plain(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Manager(c) => c.req_packed_command(cmd),
            Conn::Plain(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Manager(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Plain(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Manager(c) => c.get_db(),
            Conn::Plain(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// The URL scheme of a Redis Cluster: `redis+cluster://[user:password@]host:port,host:port`.
pub const CLUSTER_SCHEME: &str = "redis+cluster://";

/// The seed nodes of a cluster URL (each as a `redis://` URL carrying the credentials), or
/// `None` for an ordinary one-server URL. The error never quotes the URL (it may hold a
/// password).
pub fn cluster_nodes(url: &str) -> Option<Result<Vec<String>, String>> {
    let rest = url.trim().strip_prefix(CLUSTER_SCHEME)?;
    let (userinfo, hosts) = match rest.rsplit_once('@') {
        Some((user, hosts)) => (format!("{user}@"), hosts),
        None => (String::new(), rest),
    };
    let nodes: Vec<String> = hosts
        .trim_end_matches('/')
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .map(|h| format!("redis://{userinfo}{h}"))
        .collect();
    if nodes.is_empty() {
        return Some(Err(format!(
            "REDIS_URL names no cluster nodes; write it as {CLUSTER_SCHEME}host:port,host:port"
        )));
    }
    Some(Ok(nodes))
}

/// Cluster clients with Steward's timeouts: one for ordinary commands, one for blocking reads.
fn cluster_clients(nodes: &[String]) -> Result<(ClusterClient, ClusterClient), StoreError> {
    let build = |response: Duration| {
        ClusterClientBuilder::new(nodes.to_vec())
            .connection_timeout(CONNECT_TIMEOUT)
            .response_timeout(response)
            .retries(RECONNECT_RETRIES as u32)
            .max_retry_wait(500)
            .build()
            .map_err(|_| {
                StoreError::Invalid(format!(
                    "REDIS_URL is not a valid cluster URL ({CLUSTER_SCHEME}host:port,host:port)"
                ))
            })
    };
    Ok((
        build(RESPONSE_TIMEOUT)?,
        build(MAX_CLAIM_BLOCK + RESPONSE_TIMEOUT)?,
    ))
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

/// An ordinary one-server client. The parse error could quote the URL, which may hold a
/// password: say less.
fn single_client(url: &str) -> Result<redis::Client, StoreError> {
    redis::Client::open(url).map_err(|_| {
        StoreError::Invalid(format!(
            "REDIS_URL is not a valid redis:// URL (or {CLUSTER_SCHEME}host:port,host:port)"
        ))
    })
}

/// The cluster connection's timeouts, like [`manager_config`]'s.
fn cluster_config() -> ClusterConfig {
    ClusterConfig::new()
        .set_connection_timeout(CONNECT_TIMEOUT)
        .set_response_timeout(RESPONSE_TIMEOUT)
}

/// Short timeouts and few reconnection attempts: a dead Redis must fail fast.
fn manager_config() -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(CONNECT_TIMEOUT))
        .set_response_timeout(Some(RESPONSE_TIMEOUT))
        .set_number_of_retries(RECONNECT_RETRIES)
        .set_max_delay(Duration::from_millis(500))
}

/// Whether an error means the answer may have been lost (the command may still have run).
fn answer_lost(e: &RedisError) -> bool {
    e.is_io_error() || e.is_timeout() || e.is_connection_dropped()
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
        let store = tokio::time::timeout(CONNECT_TIMEOUT * 3, Self::open(url, key_prefix))
            .await
            .map_err(|_| StoreError::Unavailable("timed out connecting".into()))??;
        store.ensure_group().await?;
        Ok(store)
    }

    /// Like [`RedisStore::connect`] but without connecting yet: the first command connects
    /// (and each later one reconnects if needed), so a service can start while Redis is down
    /// and report it through readiness instead of crashing. The job queue's consumer group is
    /// created by the first `claim`.
    pub fn connect_lazy(url: &str, key_prefix: &str) -> Result<Self, StoreError> {
        let keys = Keys::new(key_prefix).map_err(StoreError::Invalid)?;
        let (client, conn) = match cluster_nodes(url) {
            Some(nodes) => {
                let (client, blocking) = cluster_clients(&nodes.map_err(StoreError::Invalid)?)?;
                let conn = client.get_pending_async_connection_with_config(cluster_config());
                (
                    Client::Cluster {
                        blocking: Box::new(blocking),
                    },
                    Conn::Cluster(conn),
                )
            }
            None => {
                let client = single_client(url)?;
                let conn =
                    ConnectionManager::new_lazy_with_config(client.clone(), manager_config())
                        .map_err(map_err)?;
                (Client::Single(client), Conn::Manager(conn))
            }
        };
        Ok(Self::assemble(keys, client, conn))
    }

    async fn open(url: &str, key_prefix: &str) -> Result<Self, StoreError> {
        let keys = Keys::new(key_prefix).map_err(StoreError::Invalid)?;
        let (client, conn) = match cluster_nodes(url) {
            Some(nodes) => {
                let (client, blocking) = cluster_clients(&nodes.map_err(StoreError::Invalid)?)?;
                let conn = client
                    .get_async_connection_with_config(cluster_config())
                    .await
                    .map_err(map_err)?;
                (
                    Client::Cluster {
                        blocking: Box::new(blocking),
                    },
                    Conn::Cluster(conn),
                )
            }
            None => {
                let client = single_client(url)?;
                let conn = ConnectionManager::new_with_config(client.clone(), manager_config())
                    .await
                    .map_err(map_err)?;
                (Client::Single(client), Conn::Manager(conn))
            }
        };
        Ok(Self::assemble(keys, client, conn))
    }

    fn assemble(keys: Keys, client: Client, conn: Conn) -> Self {
        Self {
            inner: Arc::new(Inner {
                keys,
                client,
                conn,
                blocking: Mutex::new(Vec::new()),
            }),
        }
    }

    pub fn keys(&self) -> &Keys {
        &self.inner.keys
    }

    fn conn(&self) -> Conn {
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
        let subject_key = case.subject.key();
        let shard = shard_of(&subject_key);
        let mut conn = self.conn();
        // The id -> subject pointer is written first (it lives in the case id's own slot): if
        // we crash before the case itself, it points at nothing, which readers treat as absent.
        redis::cmd("SET")
            .arg(keys.case_subject(&case.id))
            .arg(&subject_key)
            .arg("PX")
            .arg(ms(CASE_RETENTION + POINTER_MARGIN))
            .query_async::<()>(&mut conn)
            .await
            .map_err(map_err)?;
        // One retry covers a pointer left dangling by a case that outlived its retention.
        for _ in 0..2 {
            let (created, id): (i64, String) = OPEN_CASE
                .key(keys.open_case(&case.subject))
                .key(keys.case(&case.subject, &case.id))
                .key(keys.due(shard))
                .arg(case.id.as_str())
                .arg(&json)
                .arg(ttl)
                .arg(case.decide_by.timestamp_millis())
                .arg(write_token())
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

    /// Removes the pointer written for a case that turned out not to be needed.
    async fn forget_new(&self, id: &CaseId) -> Result<(), StoreError> {
        let _: i64 = redis::cmd("DEL")
            .arg(self.keys().case_subject(id))
            .query_async(&mut self.conn())
            .await
            .map_err(map_err)?;
        Ok(())
    }

    /// The subject key a case id belongs to, from its pointer.
    async fn subject_key_of(&self, id: &CaseId) -> Result<Option<String>, StoreError> {
        redis::cmd("GET")
            .arg(self.keys().case_subject(id))
            .query_async(&mut self.conn())
            .await
            .map_err(map_err)
    }

    pub(crate) async fn subject_of(&self, id: &CaseId) -> Result<Option<Subject>, StoreError> {
        Ok(self.load_case(id).await?.map(|case| case.subject))
    }

    pub(crate) async fn load_case(&self, id: &CaseId) -> Result<Option<Case>, StoreError> {
        let Some(subject_key) = self.subject_key_of(id).await? else {
            return Ok(None);
        };
        let json: Option<String> = redis::cmd("HGET")
            .arg(self.keys().case_by_subject_key(&subject_key, id))
            .arg("json")
            .query_async(&mut self.conn())
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
        left: Option<&LeftMark>,
        now: DateTime<Utc>,
    ) -> Result<Swap, StoreError> {
        let keys = self.keys();
        let mut conn = self.conn();
        let shard = shard_of(&next.subject.key());
        // The id -> subject pointer lives in another slot, so it cannot join the script. Its
        // TTL is refreshed first, a day longer than the case's: it always outlives the case.
        let _: i64 = redis::cmd("PEXPIRE")
            .arg(keys.case_subject(&next.id))
            .arg(ms(CASE_RETENTION + POINTER_MARGIN))
            .query_async(&mut conn)
            .await
            .map_err(map_err)?;
        let deadline = if next.state == CaseState::Pending {
            next.decide_by.timestamp_millis().to_string()
        } else {
            String::new()
        };
        let (decided_move, decided_at) = match decided {
            DecidedMark::Enter(at) => ("enter", at.timestamp_millis()),
            DecidedMark::Keep(at) => ("keep", at.timestamp_millis()),
            DecidedMark::Drop => ("leave", 0),
        };
        let (left_json, left_ttl) = match left {
            Some(mark) => (encode(mark)?, ms(left_mark_ttl(mark, now))),
            None => (String::new(), 0),
        };
        let token = write_token();
        let sent: Result<(i64, String), RedisError> = SWAP_CASE
            .key(keys.case(&next.subject, &next.id))
            .key(keys.open_case(&next.subject))
            .key(keys.due(shard))
            .key(keys.decided(shard))
            .key(keys.left(&next.subject))
            .arg(expected)
            .arg(encode(next)?)
            .arg(next.version)
            .arg(next.id.as_str())
            .arg(if next.state.is_open() { "1" } else { "0" })
            .arg(ms(CASE_RETENTION))
            .arg(&token)
            .arg(deadline)
            .arg(decided_move)
            .arg(decided_at)
            .arg(left_json)
            .arg(left_ttl)
            .invoke_async(&mut conn)
            .await;
        let (code, payload) = match sent {
            Ok(answer) => answer,
            Err(e) if answer_lost(&e) => return self.read_back(expected, next, &token, &e).await,
            Err(e) => return Err(map_err(e)),
        };
        match code {
            1 => {
                if payload != "0" {
                    tracing::warn!(case = %next.id, strays = %payload, "a case was written but an index entry could not be removed; readers skip it");
                }
                Ok(Swap::Written)
            }
            0 => Ok(Swap::Stale(Box::new(decode(
                &format!("case {}", next.id),
                &payload,
            )?))),
            2 => Ok(Swap::SubjectBusy(
                CaseId::parse(payload).map_err(|e| StoreError::Corrupt(e.to_string()))?,
            )),
            _ => Ok(Swap::Missing),
        }
    }

    /// After a case write whose answer was lost, finds out whether it happened: our token at
    /// our version means written; the expected version still there means not written (the
    /// caller re-reads and tries again); anything else, or no answer, is unconfirmed.
    async fn read_back(
        &self,
        expected: u64,
        next: &Case,
        token: &str,
        lost: &RedisError,
    ) -> Result<Swap, StoreError> {
        tracing::warn!(case = %next.id, error = %lost, "the answer to a case write was lost; reading it back");
        let key = self.keys().case(&next.subject, &next.id);
        let mut last = lost.to_string();
        for _ in 0..RECONNECT_RETRIES + 1 {
            let read: Result<StoredWrite, RedisError> = redis::cmd("HMGET")
                .arg(&key)
                .arg("v")
                .arg("w")
                .arg("json")
                .query_async(&mut self.conn())
                .await;
            let (version, stored_token, json) = match read {
                Ok(found) => found,
                Err(e) => {
                    last = e.to_string();
                    continue;
                }
            };
            let (Some(version), Some(json)) = (version, json) else {
                return Ok(Swap::Missing);
            };
            let version: u64 = version
                .parse()
                .map_err(|_| StoreError::Corrupt(format!("case {} version {version}", next.id)))?;
            if version == next.version && stored_token.as_deref() == Some(token) {
                return Ok(Swap::Written);
            }
            if version == expected || version == next.version {
                // Not ours: the caller recomputes on what is stored, as after any lost race.
                return Ok(Swap::Stale(Box::new(decode(
                    &format!("case {}", next.id),
                    &json,
                )?)));
            }
            return Err(StoreError::Unconfirmed(format!(
                "case {} moved on to version {version} before its write could be confirmed",
                next.id
            )));
        }
        Err(StoreError::Unconfirmed(format!(
            "the write of case {} could not be read back: {last}",
            next.id
        )))
    }

    /// Reads one index over all shards (each shard is its own slot), earliest first.
    async fn read_index(
        &self,
        key: impl Fn(u16) -> String,
        up_to: DateTime<Utc>,
    ) -> Result<Vec<IndexEntry>, StoreError> {
        let reads = (0..INDEX_SHARDS).map(|shard| {
            let mut conn = self.conn();
            let key = key(shard);
            async move {
                let flat: Vec<(String, f64)> = redis::cmd("ZRANGE")
                    .arg(key)
                    .arg("-inf")
                    .arg(up_to.timestamp_millis())
                    .arg("BYSCORE")
                    .arg("WITHSCORES")
                    .query_async(&mut conn)
                    .await
                    .map_err(map_err)?;
                flat.into_iter()
                    .map(|(id, at)| {
                        let id =
                            CaseId::parse(id).map_err(|e| StoreError::Corrupt(e.to_string()))?;
                        // Scores are whole milliseconds, exact in a double.
                        let at = DateTime::from_timestamp_millis(at as i64)
                            .ok_or_else(|| StoreError::Corrupt(format!("index score {at}")))?;
                        Ok(IndexEntry { id, at, shard })
                    })
                    .collect::<Result<Vec<_>, StoreError>>()
            }
        });
        let mut all = Vec::new();
        for shard in futures::future::join_all(reads).await {
            all.extend(shard?);
        }
        all.sort_by(|a, b| (a.at, a.id.as_str()).cmp(&(b.at, b.id.as_str())));
        Ok(all)
    }

    pub(crate) async fn due_ids(&self, now: DateTime<Utc>) -> Result<Vec<IndexEntry>, StoreError> {
        self.read_index(|shard| self.keys().due(shard), now).await
    }

    /// Drops a due entry only if it still has the score read.
    pub(crate) async fn forget_due(&self, entry: &IndexEntry) -> Result<(), StoreError> {
        self.forget_if_score(self.keys().due(entry.shard), entry)
            .await
    }

    pub(crate) async fn decided_ids(
        &self,
        cutoff: DateTime<Utc>,
    ) -> Result<Vec<IndexEntry>, StoreError> {
        self.read_index(|shard| self.keys().decided(shard), cutoff)
            .await
    }

    pub(crate) async fn forget_decided(&self, entry: &IndexEntry) -> Result<(), StoreError> {
        self.forget_if_score(self.keys().decided(entry.shard), entry)
            .await
    }

    async fn forget_if_score(&self, key: String, entry: &IndexEntry) -> Result<(), StoreError> {
        let _: i64 = FORGET_IF_SCORE
            .key(key)
            .arg(entry.id.as_str())
            .arg(entry.at.timestamp_millis())
            .invoke_async(&mut self.conn())
            .await
            .map_err(map_err)?;
        Ok(())
    }

    pub(crate) async fn postpone_decided(
        &self,
        subject: &Subject,
        id: &CaseId,
        since: DateTime<Utc>,
        until: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        let moved: i64 = MOVE_IF_SCORE
            .key(self.keys().decided(shard_of(&subject.key())))
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

    /// Reads many string keys, one MGET per shard (a slot each), in the order given.
    async fn get_many(&self, keys: Vec<(u16, String)>) -> Result<Vec<Option<String>>, StoreError> {
        let mut by_shard: std::collections::BTreeMap<u16, Vec<(usize, String)>> =
            std::collections::BTreeMap::new();
        for (at, (shard, key)) in keys.into_iter().enumerate() {
            by_shard.entry(shard).or_default().push((at, key));
        }
        let reads = by_shard.into_values().map(|group| {
            let mut conn = self.conn();
            async move {
                let mut cmd = redis::cmd("MGET");
                for (_, key) in &group {
                    cmd.arg(key);
                }
                let found: Vec<Option<String>> =
                    cmd.query_async(&mut conn).await.map_err(map_err)?;
                Ok::<_, StoreError>(group.into_iter().map(|(at, _)| at).zip(found))
            }
        });
        let mut all = Vec::new();
        for group in futures::future::join_all(reads).await {
            all.extend(group?);
        }
        all.sort_by_key(|(at, _)| *at);
        Ok(all.into_iter().map(|(_, value)| value).collect())
    }

    pub(crate) async fn left_marks(
        &self,
        subjects: &[Subject],
    ) -> Result<Vec<Option<LeftMark>>, StoreError> {
        let keys = subjects
            .iter()
            .map(|s| (shard_of(&s.key()), self.keys().left(s)))
            .collect();
        self.get_many(keys)
            .await?
            .into_iter()
            .map(|json| json.map(|j| decode("leave mark", &j)).transpose())
            .collect()
    }

    pub(crate) async fn open_case_ids(
        &self,
        subjects: &[Subject],
    ) -> Result<Vec<Option<CaseId>>, StoreError> {
        let keys = subjects
            .iter()
            .map(|s| (shard_of(&s.key()), self.keys().open_case(s)))
            .collect();
        self.get_many(keys)
            .await?
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
    async fn blocking_conn(&self) -> Result<Conn, StoreError> {
        let pooled = self
            .inner
            .blocking
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop();
        if let Some(conn) = pooled {
            return Ok(conn);
        }
        match &self.inner.client {
            Client::Single(client) => {
                let config = AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(CONNECT_TIMEOUT))
                    .set_response_timeout(Some(MAX_CLAIM_BLOCK + RESPONSE_TIMEOUT));
                client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await
                    .map(Conn::Plain)
                    .map_err(map_err)
            }
            Client::Cluster { blocking } => {
                let config = ClusterConfig::new()
                    .set_connection_timeout(CONNECT_TIMEOUT)
                    .set_response_timeout(MAX_CLAIM_BLOCK + RESPONSE_TIMEOUT);
                blocking
                    .get_async_connection_with_config(config)
                    .await
                    .map(Conn::Cluster)
                    .map_err(map_err)
            }
        }
    }

    fn return_blocking_conn(&self, conn: Conn) {
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
        let json = encode(event)?;
        let _: String = redis::cmd("XADD")
            .arg(self.keys().audit())
            .arg("MAXLEN")
            .arg("~")
            .arg(AUDIT_MAX_ENTRIES)
            .arg("*")
            .arg(AUDIT_FIELD)
            .arg(&json)
            .query_async(&mut self.conn())
            .await
            .map_err(map_err)?;
        // The subject's own capped copy (one key, so one slot), for bounded history reads.
        if let Some(subject) = &event.subject {
            let key = self.keys().subject_audit(subject);
            redis::pipe()
                .cmd("XADD")
                .arg(&key)
                .arg("MAXLEN")
                .arg("~")
                .arg(SUBJECT_AUDIT_MAX_ENTRIES)
                .arg("*")
                .arg(AUDIT_FIELD)
                .arg(&json)
                .ignore()
                .cmd("PEXPIRE")
                .arg(&key)
                .arg(ms(CASE_RETENTION))
                .ignore()
                .query_async::<()>(&mut self.conn())
                .await
                .map_err(map_err)?;
        }
        Ok(())
    }

    pub(crate) async fn recent_audit(
        &self,
        subject: &Subject,
        case: Option<&CaseId>,
        limit: usize,
    ) -> Result<AuditSlice, StoreError> {
        let key = self.keys().subject_audit(subject);
        // Newest first with a COUNT: at most the capped stream is read, never the whole log.
        let read = match case {
            Some(_) => SUBJECT_AUDIT_MAX_ENTRIES as usize + PAGE,
            None => limit,
        };
        let mut conn = self.conn();
        let (page, length): (StreamRangeReply, usize) = redis::pipe()
            .cmd("XREVRANGE")
            .arg(&key)
            .arg("+")
            .arg("-")
            .arg("COUNT")
            .arg(read.max(1))
            .cmd("XLEN")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .map_err(map_err)?;
        let mut matching = Vec::new();
        for entry in &page.ids {
            let event: AuditEvent = decode(
                &format!("audit entry {}", entry.id),
                &field(entry, AUDIT_FIELD)?,
            )?;
            if case.is_none_or(|c| event.case.as_ref() == Some(c)) {
                matching.push(event);
            }
        }
        let total = if case.is_some() {
            matching.len()
        } else {
            length
        };
        matching.truncate(limit);
        matching.reverse();
        Ok(AuditSlice {
            events: matching,
            total,
        })
    }

    pub(crate) async fn audit_page(
        &self,
        since: DateTime<Utc>,
        after: Option<&AuditCursor>,
        count: usize,
    ) -> Result<(Vec<AuditEvent>, Option<AuditCursor>), StoreError> {
        let start = match after {
            // An exclusive start: continue after the last entry read.
            Some(cursor) => format!("({}", cursor.0),
            // Stream ids come from the Redis server's clock and audit times from ours: start
            // a little earlier and filter by the event's own time.
            None => format!(
                "{}",
                (since.timestamp_millis() - AUDIT_CLOCK_SKEW_MS).max(0)
            ),
        };
        let page: StreamRangeReply = redis::cmd("XRANGE")
            .arg(self.keys().audit())
            .arg(&start)
            .arg("+")
            .arg("COUNT")
            .arg(count)
            .query_async(&mut self.conn())
            .await
            .map_err(map_err)?;
        let mut events = Vec::with_capacity(page.ids.len());
        for entry in &page.ids {
            let event: AuditEvent = decode(
                &format!("audit entry {}", entry.id),
                &field(entry, AUDIT_FIELD)?,
            )?;
            if event.time >= since {
                events.push(event);
            }
        }
        let next = (page.ids.len() >= count)
            .then(|| page.ids.last().map(|e| AuditCursor(e.id.clone())))
            .flatten();
        Ok((events, next))
    }
}

/// A case's version, write token and JSON, as read back.
type StoredWrite = (Option<String>, Option<String>, Option<String>);

/// A fresh token naming one case write, so its answer can be read back if lost.
fn write_token() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}
