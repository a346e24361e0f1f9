//! Scheduled sweeps across replicas: exactly one replica runs each scheduled sweep, a sweep
//! missed while everything was down runs once on start, and a leader that dies mid-sweep is
//! replaced once its lease ends.
//!
//! Two records in the store make this work. A lease (`hygiene-sweep`, a TTL renewed while the
//! sweep runs) says who is sweeping now; whoever cannot take it does nothing. The "last
//! completed sweep" marker holds the scheduled slot of the last sweep that finished; a slot at
//! or before the marker is done. The marker is written before the lease is released, so a
//! replica that takes the lease next sees the slot as done. Only the latest slot is ever due,
//! so three missed days make one sweep, not three.
//!
//! [`scheduler_tick`] is one decision for a `now` it is given (tests call it directly);
//! [`run_scheduler`] wraps it in a small cancellable loop. Neither decides what is idle.
use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::config::HygieneConfig;
use super::context::{SweepContext, SweepError, SweepMode};
use super::report::SweepReport;
use super::sweep::{sweep_once, sweep_pass};
use crate::store::StoreError;

/// The name of the lease every replica competes for.
pub const SWEEP_LEASE: &str = "hygiene-sweep";
/// How long a lease lasts without renewal: a dead leader is replaced after at most this.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(120);
/// How often the loop checks whether a sweep is due.
pub const TICK_INTERVAL: Duration = Duration::from_secs(30);
/// After a failed sweep, the loop waits this long before trying the same slot again.
pub const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(300);

/// What one replica needs to take part in scheduled sweeps.
#[derive(Clone, Debug)]
pub struct Scheduler {
    pub sweep: SweepContext,
    /// Unique per replica (and per process start), so leases tell replicas apart.
    pub holder: String,
    pub lease_ttl: Duration,
    /// After a failed sweep, how long this replica's loop waits before trying the slot again.
    pub retry_after_failure: Duration,
}

impl Scheduler {
    /// A scheduler with a fresh holder id, the default lease and the default wait after failure.
    pub fn new(sweep: SweepContext) -> Self {
        Self {
            sweep,
            holder: format!("replica-{}", uuid::Uuid::new_v4().simple()),
            lease_ttl: DEFAULT_LEASE_TTL,
            retry_after_failure: RETRY_AFTER_FAILURE,
        }
    }
}

/// What the scheduler loop did on one tick, for [`run_scheduler_observed`].
#[derive(Debug)]
pub enum LoopEvent {
    /// It asked [`scheduler_tick`]; the store error, if any, in words.
    Ticked(Result<Tick, String>),
    /// It skipped the tick: a sweep failed and the wait after failure is not over.
    Waiting { until: DateTime<Utc> },
}

/// What a tick decided.
#[derive(Debug, Clone)]
pub enum Tick {
    /// The latest slot is done (or there is none); `next` is when the next one falls.
    NotDue { next: Option<DateTime<Utc>> },
    /// No sweep had ever completed: the latest slot is recorded as the starting point, so a
    /// fresh install waits for its first scheduled time instead of sweeping at once.
    Started { slot: DateTime<Utc> },
    /// Another replica holds the lease (it is sweeping, or died recently).
    HeldElsewhere { slot: DateTime<Utc> },
    /// This replica ran the sweep for `slot`.
    Ran {
        slot: DateTime<Utc>,
        report: Box<SweepReport>,
    },
    /// This replica tried and the sweep failed; the slot stays due.
    Failed { slot: DateTime<Utc>, error: String },
}

/// One scheduling decision at `now`; runs the sweep when this replica should.
pub async fn scheduler_tick(s: &Scheduler, now: DateTime<Utc>) -> Result<Tick, StoreError> {
    let config = &s.sweep.config;
    let Some(slot) = config.latest_slot(now) else {
        return Ok(Tick::NotDue {
            next: config.next_slot(now),
        });
    };
    let store = &s.sweep.store;
    match store.last_completed_sweep().await? {
        None => {
            store.record_completed_sweep(slot).await?;
            return Ok(Tick::Started { slot });
        }
        Some(done) if done >= slot => {
            return Ok(Tick::NotDue {
                next: config.next_slot(now),
            });
        }
        Some(_) => {}
    }
    if !store
        .acquire_lease(SWEEP_LEASE, &s.holder, s.lease_ttl)
        .await?
    {
        return Ok(Tick::HeldElsewhere { slot });
    }
    // Another replica may have finished this slot between the read above and the lease.
    if store
        .last_completed_sweep()
        .await?
        .is_some_and(|done| done >= slot)
    {
        store.release_lease(SWEEP_LEASE, &s.holder).await?;
        return Ok(Tick::NotDue {
            next: config.next_slot(now),
        });
    }
    tracing::info!(%slot, holder = %s.holder, "running the scheduled sweep");
    let outcome = while_holding(s, sweep_pass(&s.sweep, now, SweepMode::Live, Some(slot))).await;
    let tick = match outcome {
        Ok(Ok(report)) => {
            // The marker goes first: once the lease is free, the slot must already read as done.
            store.record_completed_sweep(slot).await?;
            Tick::Ran {
                slot,
                report: Box::new(report),
            }
        }
        Ok(Err(e)) => Tick::Failed {
            slot,
            error: e.to_string(),
        },
        Err(lost) => Tick::Failed {
            slot,
            error: lost.to_string(),
        },
    };
    if let Err(e) = store.release_lease(SWEEP_LEASE, &s.holder).await {
        // It ends on its own at its TTL.
        tracing::warn!(error = %e, "could not release the sweep lease");
    }
    Ok(tick)
}

/// Runs `work` while renewing the lease; stops it if the lease is lost, so two replicas never
/// sweep at once for long.
///
/// Renewal happens every third of the lease. A renewal that fails (Redis did not answer) is
/// tried once more half a period later, still well inside the lease, before the lease counts
/// as lost: one dropped connection must not cost a whole sweep. A renewal that finds another
/// holder is final at once.
async fn while_holding(
    s: &Scheduler,
    work: impl Future<Output = Result<SweepReport, SweepError>>,
) -> Result<Result<SweepReport, SweepError>, SweepError> {
    let renew = async {
        let every = (s.lease_ttl / 3).max(Duration::from_millis(50));
        let mut failed_once = false;
        loop {
            tokio::time::sleep(if failed_once { every / 2 } else { every }).await;
            match s
                .sweep
                .store
                .renew_lease(SWEEP_LEASE, &s.holder, s.lease_ttl)
                .await
            {
                Ok(true) => failed_once = false,
                Ok(false) => {
                    return SweepError::LeaseLost("another replica holds it now".into());
                }
                Err(e) if !failed_once => {
                    tracing::warn!(error = %e, "could not renew the sweep lease; trying once more");
                    failed_once = true;
                }
                Err(e) => return SweepError::LeaseLost(e.to_string()),
            }
        }
    };
    tokio::select! {
        done = work => Ok(done),
        lost = renew => Err(lost),
    }
}

/// A live sweep asked for now (`steward sweep`, `/sandbox sweep`), under the same lease as
/// scheduled ones so two never overlap. It does not count as a scheduled slot.
pub async fn sweep_now(s: &Scheduler, now: DateTime<Utc>) -> Result<SweepReport, SweepError> {
    let store = &s.sweep.store;
    if !store
        .acquire_lease(SWEEP_LEASE, &s.holder, s.lease_ttl)
        .await?
    {
        return Err(SweepError::AlreadyRunning);
    }
    let outcome = while_holding(s, sweep_once(&s.sweep, now, SweepMode::Live)).await;
    if let Err(e) = store.release_lease(SWEEP_LEASE, &s.holder).await {
        tracing::warn!(error = %e, "could not release the sweep lease");
    }
    outcome?
}

/// The scheduler's start-up line: the schedule and the next sweep, which is always after `now`
/// (not the latest slot, which may be hours in the past).
pub fn started_line(config: &HygieneConfig, now: DateTime<Utc>) -> String {
    let schedule = format!(
        "sweep scheduler started: \"{}\" in {}",
        config.schedule.as_str(),
        config.timezone
    );
    match config.next_slot(now) {
        Some(next) => format!(
            "{schedule}; next sweep at {} (in {})",
            crate::slack::format::when(next),
            super::policy::human(next - now)
        ),
        None => format!("{schedule}; the schedule has no future time"),
    }
}

/// Ticks every `every` until `shutdown` completes. A sweep in progress is dropped at shutdown;
/// its lease then ends on its own and another replica redoes the slot.
pub async fn run_scheduler(s: Scheduler, every: Duration, shutdown: impl Future<Output = ()>) {
    run_scheduler_observed(s, every, shutdown, None).await;
}

/// [`run_scheduler`], telling `events` what each tick did (tests watch the loop's own
/// decisions this way instead of guessing from the clock).
pub async fn run_scheduler_observed(
    s: Scheduler,
    every: Duration,
    shutdown: impl Future<Output = ()>,
    events: Option<tokio::sync::mpsc::Sender<LoopEvent>>,
) {
    let tell = |event: LoopEvent| {
        let events = events.clone();
        async move {
            if let Some(events) = events {
                let _ = events.send(event).await;
            }
        }
    };
    tokio::pin!(shutdown);
    let mut interval = tokio::time::interval(every);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut quiet_until: Option<DateTime<Utc>> = None;
    {
        let config = &s.sweep.config;
        let next = config.next_slot(Utc::now());
        tracing::info!(
            schedule = config.schedule.as_str(),
            timezone = %config.timezone,
            next = next.map(|t| t.to_rfc3339()).unwrap_or_default(),
            "{}",
            started_line(config, Utc::now())
        );
    }
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            _ = interval.tick() => {}
        }
        let now = Utc::now();
        if let Some(until) = quiet_until.filter(|t| now < *t) {
            tell(LoopEvent::Waiting { until }).await;
            continue;
        }
        let tick = tokio::select! {
            () = &mut shutdown => break,
            tick = scheduler_tick(&s, now) => tick,
        };
        // Cloned only when someone is watching: a report can be large.
        let seen = events.is_some().then(|| match &tick {
            Ok(t) => Ok(t.clone()),
            Err(e) => Err(e.to_string()),
        });
        match tick {
            Ok(Tick::Ran { slot, report }) => {
                tracing::info!(%slot, idle = report.counts.idle, "scheduled sweep done");
            }
            Ok(Tick::Failed { slot, error }) => {
                tracing::error!(%slot, %error, "scheduled sweep failed; will retry");
                quiet_until = Some(
                    now + chrono::Duration::from_std(s.retry_after_failure)
                        .unwrap_or(chrono::Duration::minutes(5)),
                );
            }
            Ok(Tick::Started { slot }) => {
                let next = s.sweep.config.next_slot(now);
                tracing::info!(
                    recorded_slot = %slot,
                    next = next.map(|t| t.to_rfc3339()).unwrap_or_default(),
                    "first start: the first sweep runs at {}",
                    next.map_or_else(|| "no future time".to_owned(), crate::slack::format::when)
                );
            }
            Ok(Tick::NotDue { .. } | Tick::HeldElsewhere { .. }) => {}
            Err(e) => tracing::warn!(error = %e, "the sweep scheduler cannot read its state"),
        }
        if let Some(seen) = seen {
            tell(LoopEvent::Ticked(seen)).await;
        }
    }
    tracing::info!("sweep scheduler stopped");
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;

    #[test]
    fn the_start_up_line_names_the_next_sweep_in_the_future() {
        // 21:00 UTC: the latest 09:00 slot is 12 hours past; the line names tomorrow's.
        let config = HygieneConfig::default();
        let now = Utc.with_ymd_and_hms(2026, 3, 4, 21, 0, 0).unwrap();
        assert_eq!(
            started_line(&config, now),
            "sweep scheduler started: \"0 9 * * *\" in UTC; next sweep at 2026-03-05 09:00 UTC (in 12 h)"
        );
        let paris: HygieneConfig =
            toml::from_str("schedule = \"30 8 * * 1-5\"\ntimezone = \"Europe/Paris\"").unwrap();
        // Friday 2026-03-06 08:00 UTC is 09:00 in Paris: Monday 08:30 Paris is 07:30 UTC.
        let friday = Utc.with_ymd_and_hms(2026, 3, 6, 8, 0, 0).unwrap();
        assert_eq!(
            started_line(&paris, friday),
            "sweep scheduler started: \"30 8 * * 1-5\" in Europe/Paris; next sweep at 2026-03-09 07:30 UTC (in 2 d 23 h)"
        );
    }
}
