//! Waking whoever waits on a run: the output long-poll and `Runner::wait` hold a [`RunWatch`]
//! and sleep until the run changes, instead of reading Redis every few milliseconds.
//!
//! A store keeps one [`Wakers`] registry: a counter and a `Notify` per run somebody watches,
//! dropped with its last watch. A write to a run (its record, its output) bumps the run's
//! counter and wakes its watches: in process at once, and on other replicas through the Redis
//! backend's one subscriber connection (see `redis/wake.rs`). A watch compares the counter with
//! what it saw last, so a change between registering and waiting is never missed: register,
//! read, then wait. Notifications are a shortcut, not the truth: the caller reads the store again
//! after every wake, and waits at most a fallback interval, so a lost one costs latency only.
//!
//! This file knows nothing of Redis and decides nothing about runs.
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use crate::ids::RunId;

/// The runs somebody watches in this process.
#[derive(Default)]
pub(crate) struct Wakers {
    runs: Mutex<HashMap<RunId, Arc<Signal>>>,
}

/// One watched run: how many changes were announced, and who to wake.
#[derive(Default)]
struct Signal {
    changes: AtomicU64,
    notify: Notify,
}

impl Wakers {
    /// A watch on `id`, registered now: every change announced from here on wakes it.
    pub(crate) fn watch(self: &Arc<Self>, id: &RunId) -> RunWatch {
        let signal = self
            .runs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(id.clone())
            .or_default()
            .clone();
        let seen = signal.changes.load(Ordering::SeqCst);
        RunWatch {
            wakers: Arc::clone(self),
            id: id.clone(),
            signal,
            seen,
        }
    }

    /// Announces a change of `id` to its watches, if it has any.
    pub(crate) fn wake(&self, id: &RunId) {
        let signal = self
            .runs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .cloned();
        if let Some(signal) = signal {
            signal.announce();
        }
    }

    /// Wakes every watch (announcements may have been lost: each reads its run again).
    pub(crate) fn wake_all(&self) {
        let signals: Vec<Arc<Signal>> = self
            .runs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect();
        for signal in signals {
            signal.announce();
        }
    }

    /// How many runs are watched now.
    #[cfg(test)]
    fn watched(&self) -> usize {
        self.runs.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

impl Signal {
    fn announce(&self) {
        // The counter first: a watch that enabled its `Notified` before this reads it after.
        self.changes.fetch_add(1, Ordering::SeqCst);
        self.notify.notify_waiters();
    }
}

/// A registration for a run's changes, made before reading the run (see the module's doc).
pub struct RunWatch {
    wakers: Arc<Wakers>,
    id: RunId,
    signal: Arc<Signal>,
    seen: u64,
}

impl std::fmt::Debug for RunWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunWatch").field("run", &self.id).finish()
    }
}

impl RunWatch {
    /// Waits until a change of the run was announced since the watch was made (or since the
    /// last call), or until `up_to` has passed. True when a change woke it; either way the
    /// caller reads the run again.
    pub async fn changed(&mut self, up_to: Duration) -> bool {
        let notified = self.signal.notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let now = self.signal.changes.load(Ordering::SeqCst);
        if now != self.seen {
            self.seen = now;
            return true;
        }
        let woke = tokio::time::timeout(up_to, notified).await.is_ok();
        self.seen = self.signal.changes.load(Ordering::SeqCst);
        woke
    }
}

impl Drop for RunWatch {
    fn drop(&mut self) {
        let mut runs = self.wakers.runs.lock().unwrap_or_else(|e| e.into_inner());
        // New watches clone the signal under this lock: two holders are the map and this one.
        if Arc::strong_count(&self.signal) <= 2 {
            runs.remove(&self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(n: u32) -> RunId {
        RunId::parse(format!("run_{n:032x}")).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_between_registering_and_waiting_is_not_missed() {
        let wakers = Arc::new(Wakers::default());
        let mut watch = wakers.watch(&run(1));
        wakers.wake(&run(1));
        assert!(watch.changed(Duration::from_secs(3600)).await);
        // Seen once: the next wait waits.
        assert!(!watch.changed(Duration::from_secs(1)).await);
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_of_another_run_wakes_nobody_and_a_wake_all_wakes_everybody() {
        let wakers = Arc::new(Wakers::default());
        let mut one = wakers.watch(&run(1));
        let mut two = wakers.watch(&run(2));
        wakers.wake(&run(2));
        assert!(!one.changed(Duration::from_secs(1)).await);
        assert!(two.changed(Duration::from_secs(1)).await);
        wakers.wake_all();
        assert!(one.changed(Duration::from_secs(1)).await);
        assert!(two.changed(Duration::from_secs(1)).await);
    }

    #[tokio::test]
    async fn a_waiting_watch_is_woken_by_a_change_from_another_task() {
        let wakers = Arc::new(Wakers::default());
        let mut watch = wakers.watch(&run(3));
        let waiting = tokio::spawn(async move { watch.changed(Duration::from_secs(3600)).await });
        // Waking before the task waits or after: either way it wakes.
        wakers.wake(&run(3));
        assert!(waiting.await.unwrap());
    }

    #[test]
    fn the_last_watch_dropped_forgets_its_run() {
        let wakers = Arc::new(Wakers::default());
        let first = wakers.watch(&run(4));
        let second = wakers.watch(&run(4));
        drop(first);
        assert_eq!(wakers.watched(), 1);
        drop(second);
        assert_eq!(wakers.watched(), 0);
        // Waking a run nobody watches does nothing.
        wakers.wake(&run(4));
        assert_eq!(wakers.watched(), 0);
    }
}
