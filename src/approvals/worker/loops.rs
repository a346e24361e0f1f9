//! The background loops of one replica that startup spawns: the queue worker running
//! [`handle_job`], and the expiry loop (expiry, reconcile and card repair passes), with the
//! settings they run under. Each loop only repeats a pass until shutdown; the work is in the passes.
use std::future::Future;
use std::time::Duration;

use chrono::Utc;

use super::{expire_once, handle_job, reconcile_once};
use crate::approvals::{Services, repair};
use crate::jobs::{self, JobError, WorkerConfig};
use crate::runs::RunEngine;
use crate::store::{ClaimedJob, Job};

/// Queue workers per replica unless told otherwise (the store keeps this many blocking
/// connections for their claims).
pub const DEFAULT_WORKERS: usize = 4;

/// How the background loops of one replica run.
#[derive(Debug, Clone)]
pub struct LoopSettings {
    /// Start the queue workers (off only in tests that play a worker by hand).
    pub worker_enabled: bool,
    /// The workers' settings; each worker's consumer name is this one's plus `-w<n>`.
    pub worker: WorkerConfig,
    /// Queue workers this replica runs at once. A run holds one worker for its whole length,
    /// so several keep decisions moving while runs are under way.
    pub workers: usize,
    /// How often to look for cases past their deadline and for decided work without a job.
    pub expire_every: Duration,
    /// How long this replica's hold on a run lasts unless renewed (see `runs::engine`).
    pub run_lease: Duration,
}

impl LoopSettings {
    /// Defaults, with a queue consumer name unique to this process: `replica_name` (see
    /// `Settings::replica_name`), the process id and a random suffix.
    pub fn new(replica_name: &str) -> Self {
        let consumer = format!(
            "{replica_name}-{}-{}",
            std::process::id(),
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        );
        Self {
            worker_enabled: true,
            worker: WorkerConfig::new(consumer),
            workers: DEFAULT_WORKERS,
            expire_every: Duration::from_secs(30),
            run_lease: crate::runs::engine::RUN_LEASE,
        }
    }
}

impl LoopSettings {
    /// The settings of worker `n` of this replica: its own consumer name.
    pub fn worker_config(&self, n: usize) -> WorkerConfig {
        let mut config = self.worker.clone();
        config.consumer = format!("{}-w{n}", self.worker.consumer);
        config
    }
}

/// Runs this replica's queue worker until `shutdown`: decisions through [`handle_job`], runs
/// through `runs` (`None` when E2B is not configured here).
pub async fn run_worker(
    svc: Services,
    runs: Option<RunEngine>,
    config: WorkerConfig,
    shutdown: impl Future<Output = ()>,
) {
    let store = svc.store.clone();
    let handler = move |claimed: ClaimedJob| {
        let svc = svc.clone();
        let runs = runs.clone();
        async move {
            match (&claimed.job, runs) {
                (Job::RunDecision { .. }, _) => handle_job(&svc, claimed).await,
                (Job::Restore { .. }, _) => super::restore::handle_restore(&svc, claimed).await,
                (Job::Run { .. }, Some(engine)) => engine.handle(claimed).await,
                // Another replica with E2B configured takes it over once it goes stale.
                (Job::Run { run_id }, None) => Err(JobError::Transient(format!(
                    "run {run_id} needs E2B, which is not configured on this replica"
                ))),
            }
        }
    };
    jobs::run_queue(store, config, handler, shutdown).await;
}

/// Runs [`expire_once`], [`reconcile_once`] and the restore-window close (and repairs cards
/// whose update failed) every
/// `every` until `shutdown`.
pub async fn run_expiry(svc: Services, every: Duration, shutdown: impl Future<Output = ()>) {
    tokio::pin!(shutdown);
    loop {
        if let Err(e) = expire_once(&svc, Utc::now()).await {
            tracing::warn!(error = %e, "expiry pass failed");
        }
        if let Err(e) = reconcile_once(&svc, Utc::now()).await {
            tracing::warn!(error = %e, "reconcile pass failed");
        }
        if let Err(e) = super::restore::close_due_windows(&svc, Utc::now()).await {
            tracing::warn!(error = %e, "closing restore windows failed");
        }
        repair::repair_cards(&svc).await;
        tokio::select! {
            () = &mut shutdown => break,
            () = tokio::time::sleep(every) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_consumer_name_starts_with_the_replica_name_and_is_unique() {
        let one = LoopSettings::new("replica-a");
        let two = LoopSettings::new("replica-a");
        assert!(
            one.worker.consumer.starts_with("replica-a-"),
            "{}",
            one.worker.consumer
        );
        assert_ne!(one.worker.consumer, two.worker.consumer);
        let names: Vec<String> = (0..3).map(|n| one.worker_config(n).consumer).collect();
        assert_eq!(names[1], format!("{}-w1", one.worker.consumer));
        assert_eq!(
            names.iter().collect::<std::collections::HashSet<_>>().len(),
            3
        );
    }
}
