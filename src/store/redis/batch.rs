//! Script calls of the hot paths (a click on a card, an E2B lifecycle event), sent in batches.
//!
//! Under load many of them become ready in the same pass of the scheduler; sent one by one,
//! each is a write to Redis (a system call and a wake-up of Redis) of its own, which was the
//! larger part of a click's cost after its HTTP answer. The batching task takes the first
//! waiting call, yields once (so every task that is ready now runs, and their calls join), and
//! sends what has gathered as one pipeline. Idle, a call waits for nothing: the yield returns at
//! once when nothing else is ready. Each call still runs as its own script, so batching changes
//! no answer. Only for one server: on a Cluster a pipeline would mix slots.
use std::sync::OnceLock;

use redis::{Cmd, ErrorKind, RedisError, Script, ServerErrorKind, Value};
use tokio::sync::{mpsc, oneshot};

use super::{Conn, map_err};
use crate::store::StoreError;

/// The most calls sent in one pipeline.
const MAX_BATCH: usize = 128;

/// One script call (`EVALSHA` of `script`), waiting for the next batch.
struct Waiting {
    cmd: Cmd,
    script: &'static Script,
    reply: oneshot::Sender<Result<Value, StoreError>>,
}

/// The batching task of one connection, started on first use.
#[derive(Default)]
pub(super) struct Batcher {
    queue: OnceLock<mpsc::UnboundedSender<Waiting>>,
}

impl Batcher {
    /// Runs `cmd`, an `EVALSHA` of `script`, in the next batch and returns its answer. When there
    /// is no batching task (its runtime has ended) the call goes alone.
    pub(super) async fn call(
        &self,
        conn: &Conn,
        script: &'static Script,
        cmd: Cmd,
    ) -> Result<Value, StoreError> {
        let (reply, answer) = oneshot::channel();
        let waiting = Waiting { cmd, script, reply };
        let queue = self.queue.get_or_init(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            tokio::spawn(run_batches(rx, conn.clone()));
            tx
        });
        if let Err(e) = queue.send(waiting) {
            send_batch(vec![e.0], conn.clone()).await;
        }
        answer.await.unwrap_or_else(|_| {
            Err(StoreError::Unavailable(
                "the call's batch was dropped unanswered".into(),
            ))
        })
    }
}

/// `EVALSHA script` with capacity for `args` arguments of `data` bytes in all, to which the
/// caller adds the key count, keys and arguments. Built straight into the command's buffer: a
/// `ScriptInvocation` copies every key and argument once into its own vectors and once more into
/// the command it sends.
pub(super) fn evalsha(script: &Script, args: usize, data: usize) -> Cmd {
    let hash = script.get_hash();
    let mut cmd = Cmd::with_capacity(args + 2, data + hash.len() + 8);
    cmd.arg("EVALSHA").arg(hash);
    cmd
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

/// Sends one batch and answers each call; calls that met a Redis without their script (after
/// a restart or `SCRIPT FLUSH`: the script did not run) are sent again once it is loaded.
async fn send_batch(batch: Vec<Waiting>, mut conn: Conn) {
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    let mut waiting = Vec::with_capacity(batch.len());
    for w in batch {
        pipe.add_command(w.cmd);
        waiting.push((w.script, w.reply));
    }
    for attempt in 0..2 {
        let values: Vec<Value> = match pipe.query_async(&mut conn).await {
            Ok(values) => values,
            Err(e) => {
                let e = map_err(e);
                for (_, reply) in waiting {
                    let _ = reply.send(Err(e.clone()));
                }
                return;
            }
        };
        let mut again = redis::pipe();
        again.ignore_errors();
        let mut again_waiting = Vec::new();
        let mut to_load: Vec<&'static Script> = Vec::new();
        for (((script, reply), value), cmd) in waiting.into_iter().zip(values).zip(pipe.cmd_iter())
        {
            let answer = match value {
                Value::ServerError(e) => {
                    let e = RedisError::from(e);
                    if attempt == 0 && e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) {
                        again.add_command(cmd.clone());
                        again_waiting.push((script, reply));
                        if !to_load.iter().any(|s| s.get_hash() == script.get_hash()) {
                            to_load.push(script);
                        }
                        continue;
                    }
                    Err(map_err(e))
                }
                value => Ok(value),
            };
            let _ = reply.send(answer);
        }
        if again_waiting.is_empty() {
            return;
        }
        for script in to_load {
            if let Err(e) = script.prepare_invoke().load_async(&mut conn).await {
                let e = map_err(e);
                for (_, reply) in again_waiting {
                    let _ = reply.send(Err(e.clone()));
                }
                return;
            }
        }
        (pipe, waiting) = (again, again_waiting);
    }
}
