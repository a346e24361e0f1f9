//! Run changes between replicas: the run scripts (`runs.rs`) `PUBLISH` each change of a run on
//! one channel per key prefix, `P:runs-changed`, as `<origin> <run id>` (the origin names the
//! store that wrote it, which has woken its own watches already). Each store reads the channel
//! on one subscriber connection of its own, started by the first watch, and wakes the watches
//! of the run named ([`Wakers`]); never one connection per waiter.
//!
//! Pub/sub delivers at most once: while the subscriber is not connected, changes are missed.
//! Each (re)subscription therefore wakes every watch, so each reads its run again, and callers
//! wait at most their fallback interval anyway. On a Redis Cluster, `PUBLISH` reaches every
//! node, so the subscriber listens on one seed node (the next one after a failure).
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::watch;

use super::RedisStore;
use crate::ids::RunId;
use crate::store::wake::{RunWatch, Wakers};

/// How long a first watch waits for the subscriber to be listening before it reads the run
/// anyway (it then relies on its fallback interval until the subscriber is up).
const SUBSCRIBE_WAIT: Duration = Duration::from_millis(500);
/// Pause between attempts to (re)connect the subscriber.
const RESUBSCRIBE_EVERY: Duration = Duration::from_millis(500);
/// How often an idle subscriber checks that its store still exists.
const OWNER_CHECK_EVERY: Duration = Duration::from_secs(30);

/// The channel run changes are published on: `P:runs-changed`.
pub(super) fn runs_channel(prefix: &str) -> String {
    format!("{prefix}:runs-changed")
}

/// The message announcing a change of `id`, written by the store `origin`.
pub(super) fn change_message(origin: &str, id: &RunId) -> String {
    format!("{origin} {id}")
}

/// A store's subscriber: where to connect, and whether it listens now.
pub(super) struct Subscriber {
    /// One server's client, or one per cluster seed node (tried in turn).
    clients: Vec<redis::Client>,
    listening: std::sync::OnceLock<watch::Receiver<bool>>,
}

impl Subscriber {
    pub(super) fn new(clients: Vec<redis::Client>) -> Self {
        Self {
            clients,
            listening: std::sync::OnceLock::new(),
        }
    }
}

impl RedisStore {
    /// A watch on `id` (see [`RunWatch`]). The first one starts the subscriber and waits a
    /// little for it to listen, so a change published right after is not missed.
    pub(crate) async fn watch_run(&self, id: &RunId) -> RunWatch {
        let sub = &self.inner.subscriber;
        let mut listening = sub
            .listening
            .get_or_init(|| {
                let (tx, rx) = watch::channel(false);
                tokio::spawn(subscribe(
                    sub.clients.clone(),
                    runs_channel(self.keys().prefix()),
                    self.inner.origin.clone(),
                    Arc::downgrade(&self.inner.wakers),
                    tx,
                ));
                rx
            })
            .clone();
        // Waits only while the subscriber is (re)connecting; then the fallback interval covers.
        let _ = tokio::time::timeout(SUBSCRIBE_WAIT, listening.wait_for(|up| *up)).await;
        self.inner.wakers.watch(id)
    }

    /// Wakes this store's own watches of `id` at once (other replicas hear it from Redis).
    pub(super) fn wake_local(&self, id: &RunId) {
        self.inner.wakers.wake(id);
    }
}

/// The subscriber's loop: connect, subscribe, wake every watch (changes may have been missed),
/// then wake the watches of each run announced by another store. Ends when its store is gone.
async fn subscribe(
    clients: Vec<redis::Client>,
    channel: String,
    origin: String,
    wakers: Weak<Wakers>,
    listening: watch::Sender<bool>,
) {
    let mut attempt = 0usize;
    loop {
        if wakers.strong_count() == 0 || clients.is_empty() {
            return;
        }
        let client = &clients[attempt % clients.len()];
        attempt += 1;
        let pubsub = async {
            let mut pubsub = client.get_async_pubsub().await?;
            pubsub.subscribe(&channel).await?;
            redis::RedisResult::Ok(pubsub)
        };
        let mut pubsub = match tokio::time::timeout(super::CONNECT_TIMEOUT * 2, pubsub).await {
            Ok(Ok(pubsub)) => pubsub,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "the run-change subscriber could not subscribe; retrying");
                tokio::time::sleep(RESUBSCRIBE_EVERY).await;
                continue;
            }
            Err(_) => {
                tokio::time::sleep(RESUBSCRIBE_EVERY).await;
                continue;
            }
        };
        let _ = listening.send(true);
        if let Some(wakers) = wakers.upgrade() {
            wakers.wake_all();
        }
        let mut messages = pubsub.on_message();
        let mut owner_check = tokio::time::interval(OWNER_CHECK_EVERY);
        loop {
            tokio::select! {
                message = messages.next() => {
                    let Some(message) = message else { break };
                    let Some(wakers) = wakers.upgrade() else { return };
                    let Ok(text) = message.get_payload::<String>() else { continue };
                    let Some((from, run)) = text.split_once(' ') else { continue };
                    if from == origin {
                        continue;
                    }
                    if let Ok(run) = RunId::parse(run) {
                        wakers.wake(&run);
                    }
                }
                _ = owner_check.tick() => {
                    if wakers.strong_count() == 0 {
                        return;
                    }
                }
            }
        }
        let _ = listening.send(false);
        tracing::debug!("the run-change subscriber lost its connection; resubscribing");
        tokio::time::sleep(RESUBSCRIBE_EVERY).await;
    }
}
