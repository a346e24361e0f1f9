//! A click on a case's card: its deduplication mark and the case it names, read together.
//!
//! A click is the Slack request people feel the most, so its first step is one round trip: a
//! Lua script sets the click's mark (`SET NX PX`), follows the case id to its subject and reads
//! the case. The mark and the case -> subject pointer share the case id's hash tag; the case
//! itself lives in its subject's shard, whose key the script builds the way
//! [`Keys::case_by_subject_key`](crate::store::keys::Keys::case_by_subject_key) does. On a Redis
//! Cluster a script may only touch its own slot, so there the script stops at the pointer and
//! the case is read with a second command. This file must not decide what a click means.
use std::sync::{LazyLock, OnceLock};
use std::time::Duration;

use redis::{Cmd, ErrorKind, RedisError, Script, ServerErrorKind, Value};
use tokio::sync::{mpsc, oneshot};

use super::{Client, Conn, RedisStore, map_err, ms};
use crate::ids::CaseId;
use crate::store::keys::INDEX_SHARDS;
use crate::store::{FirstClick, StoreError, decode};

/// KEYS: 1 the click's mark, 2 the case -> subject pointer (one slot).
/// ARGV: 1 mark ttl ms, 2 key prefix, 3 case id, 4 '1' to read the case here (one server
/// only), 5 number of index shards.
/// Returns 0 a repeat, 1 no such case (plain integers: most clicks under load are Slack's
/// redeliveries, and a table is built in Lua and read back as an array for each), {2, subject
/// key} (ARGV 4 not '1'), {3, case json}.
///
/// The shard is FNV-1a of the subject key, as `keys::shard_of` computes it; 32-bit arithmetic
/// in Lua's doubles: `h * 0x01000193 mod 2^32 = (h * 0x193 + (h << 24)) mod 2^32`.
static FIRST_CLICK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
if not redis.call('SET', KEYS[1], '1', 'NX', 'PX', ARGV[1]) then
  return 0
end
local subject = redis.call('GET', KEYS[2])
if not subject then
  return 1
end
if ARGV[4] ~= '1' then
  return {2, subject}
end
local h = 2166136261
for i = 1, #subject do
  h = bit.bxor(h, string.byte(subject, i)) % 4294967296
  h = (h * 403 + bit.lshift(h, 24)) % 4294967296
end
local shard = string.format('%02d', h % tonumber(ARGV[5]))
local key = ARGV[2] .. ':case:{s' .. shard .. '}:' .. subject .. ':' .. ARGV[3]
local json = redis.call('HGET', key, 'json')
if not json then
  return 1
end
return {3, json}
"#,
    )
});

/// The click script's invocation on a cluster, where it stops at the case -> subject pointer
/// (ARGV 4 is `0`).
fn cluster_click_script(
    mark_key: &str,
    subject_key: &str,
    ttl_ms: u64,
    prefix: &str,
    case: &CaseId,
) -> redis::ScriptInvocation<'static> {
    let mut invocation = FIRST_CLICK.key(mark_key);
    invocation
        .key(subject_key)
        .arg(ttl_ms)
        .arg(prefix)
        .arg(case.as_str())
        .arg("0")
        .arg(INDEX_SHARDS);
    invocation
}

/// The click script as one `EVALSHA` command, for a batch on one server (where the script reads
/// the case itself). Built straight into the command's buffer: a `ScriptInvocation` copies every
/// key and argument once into its own vectors and once more into the command it sends.
fn click_cmd(mark_key: &str, subject_key: &str, ttl_ms: u64, prefix: &str, case: &CaseId) -> Cmd {
    let data = FIRST_CLICK.get_hash().len()
        + mark_key.len()
        + subject_key.len()
        + prefix.len()
        + case.as_str().len()
        + 48;
    let mut cmd = Cmd::with_capacity(10, data);
    cmd.arg("EVALSHA")
        .arg(FIRST_CLICK.get_hash())
        .arg(2)
        .arg(mark_key)
        .arg(subject_key)
        .arg(ttl_ms)
        .arg(prefix)
        .arg(case.as_str())
        .arg("1")
        .arg(INDEX_SHARDS);
    cmd
}

/// What the click script found.
enum ClickAnswer {
    Repeat,
    Missing,
    /// On a cluster: the case's subject, whose slot holds the case.
    Subject(String),
    /// The case's JSON.
    Case(String),
}

/// Reads the click script's answer: 0 or 1 alone, or 2 or 3 with its text.
fn click_answer(value: Value) -> Result<ClickAnswer, StoreError> {
    let corrupt = |what: String| StoreError::Corrupt(format!("the click script answered {what}"));
    if let Value::Int(answer) = value {
        return match answer {
            0 => Ok(ClickAnswer::Repeat),
            1 => Ok(ClickAnswer::Missing),
            other => Err(corrupt(other.to_string())),
        };
    }
    let (answer, text): (i64, String) =
        redis::from_redis_value(value).map_err(|e| corrupt(e.to_string()))?;
    match answer {
        2 => Ok(ClickAnswer::Subject(text)),
        3 => Ok(ClickAnswer::Case(text)),
        other => Err(corrupt(other.to_string())),
    }
}

/// The most clicks sent in one pipeline.
const MAX_BATCH: usize = 128;

/// One click's script command, waiting for the next batch.
struct Waiting {
    cmd: Cmd,
    reply: oneshot::Sender<Result<ClickAnswer, StoreError>>,
}

/// Sends the clicks of one server in batches. Under load many clicks become ready in the same
/// pass of the scheduler; sent one by one, each is a write to Redis (a system call and a wake-up
/// of Redis) of its own, which was the larger part of a click's cost after its HTTP answer. The
/// batching task takes the first waiting click, yields once (so every task that is ready now
/// runs, and their clicks join), and sends what has gathered as one pipeline of the same script.
/// Idle, a click waits for nothing: the yield returns at once when nothing else is ready.
/// Each click still runs as its own script, so batching changes no answer.
#[derive(Default)]
pub(super) struct ClickBatcher {
    queue: OnceLock<mpsc::UnboundedSender<Waiting>>,
}

impl ClickBatcher {
    /// Queues `waiting`, starting the batching task on first use; gives the click back when
    /// there is no task (its runtime has ended), so the caller sends it alone.
    fn send(&self, conn: &Conn, waiting: Waiting) -> Result<(), Waiting> {
        let queue = self.queue.get_or_init(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            tokio::spawn(run_batches(rx, conn.clone()));
            tx
        });
        queue.send(waiting).map_err(|e| e.0)
    }
}

async fn run_batches(mut queue: mpsc::UnboundedReceiver<Waiting>, conn: Conn) {
    while let Some(first) = queue.recv().await {
        let mut batch = vec![first];
        tokio::task::yield_now().await;
        while batch.len() < MAX_BATCH {
            match queue.try_recv() {
                Ok(waiting) => batch.push(waiting),
                Err(_) => break,
            }
        }
        // The answer is awaited in a task of its own, so the next batch need not wait for it.
        tokio::spawn(send_batch(batch, conn.clone()));
    }
}

/// Sends one batch and answers each click; clicks that met a Redis without the script (after
/// a restart or `SCRIPT FLUSH`: the script did not run) are sent again once it is loaded.
async fn send_batch(batch: Vec<Waiting>, mut conn: Conn) {
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    let mut replies = Vec::with_capacity(batch.len());
    for w in batch {
        pipe.add_command(w.cmd);
        replies.push(w.reply);
    }
    for attempt in 0..2 {
        let values: Vec<Value> = match pipe.query_async(&mut conn).await {
            Ok(values) => values,
            Err(e) => {
                let e = map_err(e);
                for reply in replies {
                    let _ = reply.send(Err(e.clone()));
                }
                return;
            }
        };
        let mut again = redis::pipe();
        again.ignore_errors();
        let mut again_replies = Vec::new();
        for ((reply, value), cmd) in replies.into_iter().zip(values).zip(pipe.cmd_iter()) {
            let answer = match value {
                Value::ServerError(e) => {
                    let e = RedisError::from(e);
                    if attempt == 0 && e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) {
                        again.add_command(cmd.clone());
                        again_replies.push(reply);
                        continue;
                    }
                    Err(map_err(e))
                }
                value => click_answer(value),
            };
            let _ = reply.send(answer);
        }
        if again_replies.is_empty() {
            return;
        }
        if let Err(e) = FIRST_CLICK.prepare_invoke().load_async(&mut conn).await {
            let e = map_err(e);
            for reply in again_replies {
                let _ = reply.send(Err(e.clone()));
            }
            return;
        }
        (pipe, replies) = (again, again_replies);
    }
}

impl RedisStore {
    pub(crate) async fn first_click(
        &self,
        case: &CaseId,
        mark: &str,
        ttl: Duration,
    ) -> Result<FirstClick, StoreError> {
        let one_server = matches!(self.inner.client, Client::Single(_));
        let keys = self.keys();
        let answer = if one_server {
            self.first_click_batched(case, mark, ttl).await?
        } else {
            click_answer(
                self.invoke::<Value>(&cluster_click_script(
                    &keys.click(case, mark),
                    &keys.case_subject(case),
                    ms(ttl),
                    keys.prefix(),
                    case,
                ))
                .await?,
            )?
        };
        let json = match answer {
            ClickAnswer::Repeat => return Ok(FirstClick::Repeat),
            ClickAnswer::Missing => return Ok(FirstClick::Missing),
            ClickAnswer::Case(json) => Some(json),
            // On a cluster: the case lives in its subject's slot.
            ClickAnswer::Subject(subject) => {
                self.query(
                    redis::cmd("HGET")
                        .arg(keys.case_by_subject_key(&subject, case))
                        .arg("json"),
                )
                .await?
            }
        };
        match json {
            None => Ok(FirstClick::Missing),
            Some(json) => Ok(FirstClick::Case(Box::new(decode(
                &format!("case {case}"),
                &json,
            )?))),
        }
    }
}

impl RedisStore {
    /// One server: the click joins the next batch ([`ClickBatcher`]).
    async fn first_click_batched(
        &self,
        case: &CaseId,
        mark: &str,
        ttl: Duration,
    ) -> Result<ClickAnswer, StoreError> {
        let keys = self.keys();
        let (reply, answer) = oneshot::channel();
        let waiting = Waiting {
            cmd: click_cmd(
                &keys.click(case, mark),
                &keys.case_subject(case),
                ms(ttl),
                keys.prefix(),
                case,
            ),
            reply,
        };
        match self.inner.clicks.send(&self.inner.conn, waiting) {
            Ok(()) => answer.await.unwrap_or_else(|_| {
                Err(StoreError::Unavailable(
                    "the click's batch was dropped unanswered".into(),
                ))
            }),
            // No batching task (its runtime has ended): the click goes alone.
            Err(w) => {
                send_batch(vec![w], self.inner.conn.clone()).await;
                answer.await.unwrap_or_else(|_| {
                    Err(StoreError::Unavailable(
                        "the click was dropped unanswered".into(),
                    ))
                })
            }
        }
    }
}
