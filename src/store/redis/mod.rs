//! The Redis backend: the connection every command and Lua script goes through, and the
//! helpers they share. What each part of the state needs lives in its own file: `cases` (case
//! writes, indexes, pointers, Leave marks), `queue` (the job stream, its consumer group, claims
//! and step logs), `audit` (the audit streams and their export), `leases` (deduplication
//! marks, leases and sweep markers), `click` (a click's mark and its case in one script) and
//! `runs` (run records, their output and files).
//!
//! One Redis server (`redis://`, `rediss://`) or a Redis Cluster (`redis+cluster://h1:p1,h2:p2`,
//! see [`cluster_nodes`]). On one server, ordinary commands share one auto-reconnecting
//! `ConnectionManager`; on a cluster, one cluster connection that follows the slot map. Both
//! have short connect and response timeouts, so a dead Redis fails fast with `Unavailable`
//! instead of hanging. Blocking queue reads (`XREADGROUP BLOCK`) would stall every other command
//! on a shared connection, so they borrow a dedicated connection from a small pool instead.
//!
//! Every script and pipeline touches keys of one hash tag (see `keys.rs`), so it stays in one
//! Cluster slot. This module must not decide which transitions are legal; it only writes what
//! `Store` hands it, if the version still matches.
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use redis::aio::{
    ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection,
};
use redis::cluster::{ClusterClient, ClusterClientBuilder, ClusterConfig};
use redis::cluster_async::ClusterConnection;
use redis::streams::StreamId;
use redis::{
    AsyncConnectionConfig, Cmd, FromRedisValue, Pipeline, RedisError, RedisFuture, Script,
    ScriptInvocation, ToRedisArgs, Value,
};

use super::StoreError;
use super::keys::Keys;
use crate::ids::CaseId;

mod audit;
mod batch;
mod cases;
mod click;
mod leases;
mod lists;
mod push_tests;
mod queue;
mod restore;
mod runs;
mod wake;
mod watch;

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
/// Keys `SCAN` looks at per call (a hint to Redis, not a bound on what one call returns).
const SCAN_COUNT: usize = 1_000;

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
    /// Clicks and E2B events on one server go to Redis in batches (see `batch.rs`).
    batcher: batch::Batcher,
    /// Watches of runs in this process, woken by this store's writes and its subscriber.
    wakers: Arc<crate::store::wake::Wakers>,
    /// The one connection that hears other replicas' run changes (see `wake.rs`).
    subscriber: wake::Subscriber,
    /// Names this store in the run changes it publishes, so its subscriber skips its own.
    origin: String,
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

/// Sorts Redis failures into "can't reach it" and "it said no". Redis refusing Steward itself
/// (no password, a wrong one, or an ACL user without the command: `NOAUTH`, `WRONGPASS`,
/// `NOPERM`) is "can't reach it" too: no command will work until the operator fixes `REDIS_URL`
/// or the ACL, so callers answer as for a Redis that is down (503), and the reason names the
/// refusal without Redis's own text.
/// The value of `field` in an `INFO` answer (`field:value` lines).
fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        (name == field).then(|| value.trim())
    })
}

fn map_err(e: RedisError) -> StoreError {
    if let Some(code) = refusal(&e) {
        crate::metrics::redis_error("unavailable");
        return StoreError::Unavailable(format!(
            "Redis refused Steward's credentials or permissions ({code}); check the user and password in REDIS_URL and the user's ACL"
        ));
    }
    let unreachable = e.is_io_error()
        || e.is_connection_refusal()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.kind() == redis::ErrorKind::ClusterConnectionNotFound;
    crate::metrics::redis_error(if unreachable {
        "unavailable"
    } else {
        "backend"
    });
    if unreachable {
        StoreError::Unavailable(e.to_string())
    } else {
        StoreError::Backend(e.to_string())
    }
}

/// The error code when Redis refused Steward itself rather than one command's arguments.
fn refusal(e: &RedisError) -> Option<&'static str> {
    const CODES: [&str; 3] = ["NOAUTH", "WRONGPASS", "NOPERM"];
    if e.kind() == redis::ErrorKind::AuthenticationFailed {
        return Some("authentication failed");
    }
    if let Some(code) = e.code()
        && let Some(known) = CODES.iter().find(|c| **c == code)
    {
        return Some(known);
    }
    // A pipeline's error keeps the server's code only in its text.
    let text = e.to_string();
    CODES.into_iter().find(|code| {
        text.split(|c: char| !c.is_ascii_alphanumeric())
            .any(|word| word == *code)
    })
}

/// One plain client per cluster seed node, for the run-change subscriber (`wake.rs`); a node
/// whose URL does not parse is left out.
fn node_clients(nodes: &[String]) -> Vec<redis::Client> {
    nodes
        .iter()
        .filter_map(|node| redis::Client::open(node.as_str()).ok())
        .collect()
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
        let (client, conn, subscribers) = match cluster_nodes(url) {
            Some(nodes) => {
                let nodes = nodes.map_err(StoreError::Invalid)?;
                let (client, blocking) = cluster_clients(&nodes)?;
                let conn = client.get_pending_async_connection_with_config(cluster_config());
                (
                    Client::Cluster {
                        blocking: Box::new(blocking),
                    },
                    Conn::Cluster(conn),
                    node_clients(&nodes),
                )
            }
            None => {
                let client = single_client(url)?;
                let conn =
                    ConnectionManager::new_lazy_with_config(client.clone(), manager_config())
                        .map_err(map_err)?;
                let subscribers = vec![client.clone()];
                (Client::Single(client), Conn::Manager(conn), subscribers)
            }
        };
        Ok(Self::assemble(keys, client, conn, subscribers))
    }

    async fn open(url: &str, key_prefix: &str) -> Result<Self, StoreError> {
        let keys = Keys::new(key_prefix).map_err(StoreError::Invalid)?;
        let (client, conn, subscribers) = match cluster_nodes(url) {
            Some(nodes) => {
                let nodes = nodes.map_err(StoreError::Invalid)?;
                let (client, blocking) = cluster_clients(&nodes)?;
                let conn = client
                    .get_async_connection_with_config(cluster_config())
                    .await
                    .map_err(map_err)?;
                (
                    Client::Cluster {
                        blocking: Box::new(blocking),
                    },
                    Conn::Cluster(conn),
                    node_clients(&nodes),
                )
            }
            None => {
                let client = single_client(url)?;
                let conn = ConnectionManager::new_with_config(client.clone(), manager_config())
                    .await
                    .map_err(map_err)?;
                let subscribers = vec![client.clone()];
                (Client::Single(client), Conn::Manager(conn), subscribers)
            }
        };
        Ok(Self::assemble(keys, client, conn, subscribers))
    }

    fn assemble(keys: Keys, client: Client, conn: Conn, subscribers: Vec<redis::Client>) -> Self {
        Self {
            inner: Arc::new(Inner {
                keys,
                client,
                conn,
                blocking: Mutex::new(Vec::new()),
                batcher: batch::Batcher::default(),
                wakers: Arc::default(),
                subscriber: wake::Subscriber::new(subscribers),
                origin: uuid::Uuid::new_v4().simple().to_string(),
            }),
        }
    }

    pub fn keys(&self) -> &Keys {
        &self.inner.keys
    }

    fn conn(&self) -> Conn {
        self.inner.conn.clone()
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

    /// Puts a healthy blocking connection back for the next blocking read.
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

    pub(crate) async fn ping(&self) -> Result<(), StoreError> {
        let _: String = self.query(&redis::cmd("PING")).await?;
        Ok(())
    }

    /// What Redis keeps on disk: `CONFIG GET appendonly` and `save`, or, where a managed Redis
    /// refuses `CONFIG`, the `aof_enabled` line of `INFO persistence`.
    pub(crate) async fn persistence(&self) -> Result<super::Persistence, StoreError> {
        use super::Persistence;
        let config = |name: &'static str| async move {
            let mut cmd = redis::cmd("CONFIG");
            cmd.arg("GET").arg(name);
            // `CONFIG GET x` answers `[x, value]` (a map under RESP3).
            let pairs: Result<Vec<(String, String)>, StoreError> = self.query(&cmd).await;
            pairs.map(|p| p.into_iter().next().map(|(_, v)| v).unwrap_or_default())
        };
        match (config("appendonly").await, config("save").await) {
            (Ok(aof), _) if aof.trim() == "yes" => Ok(Persistence::AppendOnly),
            (Ok(_), Ok(save)) if !save.trim().is_empty() => {
                Ok(Persistence::Snapshots(save.trim().to_owned()))
            }
            (Ok(_), Ok(_)) => Ok(Persistence::Off),
            _ => {
                let info: String = self.query(redis::cmd("INFO").arg("persistence")).await?;
                Ok(match info_field(&info, "aof_enabled") {
                    Some("1") => Persistence::AppendOnly,
                    Some(_) => Persistence::Unknown(
                        "Redis refused CONFIG GET, and INFO says the append-only file is off"
                            .into(),
                    ),
                    None => Persistence::Unknown(
                        "Redis refused CONFIG GET and INFO persistence did not say".into(),
                    ),
                })
            }
        }
    }

    // Every ordinary command, pipeline and script goes through one of the three below, on the
    // shared connection, so a failure is always sorted by [`map_err`] the same way.

    /// Sends one command and decodes its answer.
    async fn query<T: FromRedisValue>(&self, cmd: &Cmd) -> Result<T, StoreError> {
        cmd.query_async(&mut self.conn()).await.map_err(map_err)
    }

    /// Sends one pipeline (its keys share one slot) and decodes the answers.
    async fn query_pipe<T: FromRedisValue>(&self, pipe: &Pipeline) -> Result<T, StoreError> {
        pipe.query_async(&mut self.conn()).await.map_err(map_err)
    }

    /// Runs one Lua script and decodes its answer.
    async fn invoke<T: FromRedisValue>(
        &self,
        script: &ScriptInvocation<'_>,
    ) -> Result<T, StoreError> {
        script.invoke_async(&mut self.conn()).await.map_err(map_err)
    }

    /// Every key matching `pattern`, by `SCAN` to the end (a key may come twice; callers
    /// deduplicate). On one server, one pass over it; on a Cluster, a pass over the primary
    /// holding `slot_of`'s slot (a key or pattern with the hash tag of the keys sought), since a
    /// cluster connection would otherwise send `SCAN` to any node. Read-only, and as long as the
    /// keyspace: for offline checks, never on a request's path.
    async fn scan(&self, pattern: &str, slot_of: &str) -> Result<Vec<String>, StoreError> {
        use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
        let mut cursor: u64 = 0;
        let mut keys = Vec::new();
        loop {
            let mut cmd = redis::cmd("SCAN");
            cmd.arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(SCAN_COUNT);
            let (next, page): (u64, Vec<String>) = match self.conn() {
                Conn::Cluster(mut cluster) => {
                    let node = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(
                        Route::with_key(slot_of, SlotAddr::Master),
                    ));
                    let answer = cluster.route_command(cmd, node).await.map_err(map_err)?;
                    redis::from_redis_value(answer)
                        .map_err(|e| StoreError::Corrupt(format!("a SCAN answer: {e}")))?
                }
                _ => self.query(&cmd).await?,
            };
            keys.extend(page);
            if next == 0 {
                return Ok(keys);
            }
            cursor = next;
        }
    }

    /// Whether commands go to a Redis Cluster.
    fn is_cluster(&self) -> bool {
        matches!(self.inner.client, Client::Cluster { .. })
    }

    /// `SET key value NX PX ttl`: true when the key was absent and now holds `value`.
    async fn set_if_absent(
        &self,
        key: String,
        value: impl ToRedisArgs,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let set: Option<String> = self
            .query(
                redis::cmd("SET")
                    .arg(key)
                    .arg(value)
                    .arg("NX")
                    .arg("PX")
                    .arg(ms(ttl)),
            )
            .await?;
        Ok(set.is_some())
    }
}

/// A case id read back from Redis; one that does not parse is corrupt data, not bad input.
fn stored_case_id(text: String) -> Result<CaseId, StoreError> {
    CaseId::parse(text).map_err(|e| StoreError::Corrupt(e.to_string()))
}
