//! The background loops of one replica that startup spawns: the queue worker running
//! [`handle_job`], and the expiry loop (expiry, reconcile and card repair passes), with the
//! settings they run under. Each loop only repeats a pass until shutdown; the work is in the passes.
use std::future::Future;
use std::time::Duration;

use chrono::Utc;

use super::{expire_once, handle_job, reconcile_once};
use crate::approvals::{Services, repair};
use crate::config::Workers;
use crate::jobs::{self, JobError, WorkerConfig};
use crate::runs::RunEngine;
use crate::store::{ClaimedJob, Job, Lane};
use tokio_util::sync::CancellationToken;

/// How the background loops of one replica run.
#[derive(Debug, Clone)]
pub struct LoopSettings {
    /// Start the queue workers (off only in tests that play a worker by hand).
    pub worker_enabled: bool,
    /// The workers' settings; each worker's consumer name is this one's plus its lane and
    /// number (`-d0`, `-r0`, …), and its lane is set per worker.
    pub worker: WorkerConfig,
    /// Queue workers of the decisions lane (decided cases, restores) this replica runs.
    pub decision_workers: usize,
    /// Queue workers of the runs lane: a run holds one for its whole length, so runs never
    /// hold up decisions, which have their own.
    pub run_workers: usize,
    /// How long a stopping replica may finish what it is doing before it hands the rest over
    /// (`[workers] shutdown_grace`).
    pub shutdown_grace: Duration,
    /// How often to look for cases past their deadline and for decided work without a job.
    pub expire_every: Duration,
    /// How long this replica's hold on a run lasts unless renewed (see `runs::engine`).
    pub run_lease: Duration,
    /// How often the replica holding the poll lease reads E2B's lifecycle events
    /// (`[events] poll_every`); `None`: never.
    pub events_poll_every: Option<Duration>,
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
        let workers = Workers::default();
        Self {
            worker_enabled: true,
            worker: WorkerConfig::new(consumer),
            decision_workers: workers.decisions,
            run_workers: workers.runs,
            shutdown_grace: workers.shutdown_grace,
            expire_every: Duration::from_secs(30),
            run_lease: crate::runs::engine::RUN_LEASE,
            events_poll_every: Some(crate::config::DEFAULT_EVENTS_POLL_EVERY),
        }
    }

    /// The `[workers]` counts and grace.
    pub fn with_workers(mut self, workers: Workers) -> Self {
        self.decision_workers = workers.decisions;
        self.run_workers = workers.runs;
        self.shutdown_grace = workers.shutdown_grace;
        self
    }

    /// The settings of worker `n` of `lane` on this replica: its own consumer name.
    pub fn worker_config(&self, lane: Lane, n: usize) -> WorkerConfig {
        let mut config = self.worker.clone();
        let tag = match lane {
            Lane::Decisions => 'd',
            Lane::Runs => 'r',
        };
        config.consumer = format!("{}-{tag}{n}", self.worker.consumer);
        config.lane = lane;
        config
    }

    /// Every worker this replica runs: its lane's count of each.
    pub fn worker_configs(&self) -> Vec<WorkerConfig> {
        let decisions =
            (0..self.decision_workers.max(1)).map(|n| self.worker_config(Lane::Decisions, n));
        let runs = (0..self.run_workers.max(1)).map(|n| self.worker_config(Lane::Runs, n));
        decisions.chain(runs).collect()
    }
}

/// Runs one queue worker of this replica until `draining` is cancelled: decisions through
/// [`handle_job`], runs through `runs` (`None` when E2B is not configured here). Whatever the
/// lane, a job is handled by its kind (a run left in the decisions stream by a replica from
/// before lanes is still run).
pub async fn run_worker(
    svc: Services,
    runs: Option<RunEngine>,
    config: WorkerConfig,
    draining: CancellationToken,
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
    jobs::run_queue(store, config, handler, draining).await;
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
        let configs = one.worker_configs();
        assert_eq!(configs.len(), 8, "four of each lane");
        assert_eq!(configs[1].consumer, format!("{}-d1", one.worker.consumer));
        assert_eq!(configs[4].consumer, format!("{}-r0", one.worker.consumer));
        assert_eq!(configs.iter().filter(|c| c.lane == Lane::Runs).count(), 4);
        assert_eq!(
            configs
                .iter()
                .map(|c| &c.consumer)
                .collect::<std::collections::HashSet<_>>()
                .len(),
            8
        );
    }
}
