//! Bounds on the work one Slack request may start on a replica: a per-user rate limit on
//! commands that call E2B, one dry-run sweep at a time, and a cap on follow-up tasks (replies
//! through `response_url`, clicks being handled). Each refusal is a sentence for the person.
//!
//! The state is per replica and in memory: these bounds protect this process's memory and its
//! share of E2B's rate limits, not a global quota. This module must not call Slack or E2B.
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Deserialize;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::ids::SlackUserId;

/// Default commands that call E2B one person may start per minute.
pub const DEFAULT_COMMANDS_PER_MINUTE: u32 = 20;
/// Default follow-up tasks (replies, click handling) one replica runs at once.
pub const DEFAULT_FOLLOW_UPS: usize = 256;
/// "Steward is busy" replies in flight at once, on top of `follow_ups`: short, and bounded too.
const BUSY_REPLIES_MAX: usize = 32;
/// People whose rate-limit state is kept at once; idle entries are dropped past this.
const TRACKED_USERS_MAX: usize = 10_000;

/// The `[limits]` table of `steward.toml`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// Commands that call E2B (list, get, logs, pause, kill, sweep, …) one person may start per
    /// minute on one replica.
    pub commands_per_minute: u32,
    /// Follow-up tasks one replica keeps in flight; past this, people are told Steward is busy.
    pub follow_ups: usize,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            commands_per_minute: DEFAULT_COMMANDS_PER_MINUTE,
            follow_ups: DEFAULT_FOLLOW_UPS,
        }
    }
}

/// A token bucket per person: `commands_per_minute` tokens, refilled evenly over a minute.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// The live bounds of one replica; shared behind an `Arc`.
#[derive(Debug)]
pub struct Limits {
    config: LimitsConfig,
    buckets: Mutex<HashMap<SlackUserId, Bucket>>,
    sweep: Arc<Semaphore>,
    follow_ups: Arc<Semaphore>,
    busy_replies: Arc<Semaphore>,
}

/// Why a request was not started. `Display` is the sentence for the person.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error(
        "You have started {per_minute} commands that call E2B in the last minute, the most Steward allows; try again in {wait_secs} s."
    )]
    RateLimited { per_minute: u32, wait_secs: u64 },
    #[error("A sweep is already running; try again when it has finished.")]
    SweepRunning,
    #[error("Steward is busy right now and could not take this on; try again in a minute.")]
    Busy,
}

impl Limits {
    pub fn new(config: LimitsConfig) -> Self {
        Self {
            follow_ups: Arc::new(Semaphore::new(config.follow_ups.max(1))),
            sweep: Arc::new(Semaphore::new(1)),
            busy_replies: Arc::new(Semaphore::new(BUSY_REPLIES_MAX)),
            buckets: Mutex::default(),
            config,
        }
    }

    /// Takes one of `user`'s tokens for a command that calls E2B, at `now`.
    pub fn take_command(&self, user: &SlackUserId, now: Instant) -> Result<(), Refused> {
        let per_minute = self.config.commands_per_minute;
        if per_minute == 0 {
            return Ok(());
        }
        let capacity = f64::from(per_minute);
        let per_sec = capacity / 60.0;
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        if buckets.len() >= TRACKED_USERS_MAX {
            // Anyone idle for a minute has a full bucket again: forgetting them changes nothing.
            buckets.retain(|_, b| now.duration_since(b.at) < Duration::from_secs(60));
        }
        let bucket = buckets.entry(user.clone()).or_insert(Bucket {
            tokens: capacity,
            at: now,
        });
        let elapsed = now.saturating_duration_since(bucket.at).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * per_sec).min(capacity);
        bucket.at = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            Ok(())
        } else {
            let wait_secs = ((1.0 - bucket.tokens) / per_sec).ceil() as u64;
            Err(Refused::RateLimited {
                per_minute,
                wait_secs: wait_secs.max(1),
            })
        }
    }

    /// The right to run a sweep from Slack; held until the permit is dropped.
    pub fn try_sweep(&self) -> Result<OwnedSemaphorePermit, Refused> {
        self.sweep
            .clone()
            .try_acquire_owned()
            .map_err(|_| Refused::SweepRunning)
    }

    /// A place for one follow-up task; held until the permit is dropped.
    pub fn try_follow_up(&self) -> Result<OwnedSemaphorePermit, Refused> {
        self.follow_ups
            .clone()
            .try_acquire_owned()
            .map_err(|_| Refused::Busy)
    }

    /// A place for one "Steward is busy" reply to someone whose click found no place; `None`
    /// when even those are all in flight (then the click goes unanswered; its card still
    /// shows its buttons).
    pub fn try_busy_reply(&self) -> Option<OwnedSemaphorePermit> {
        self.busy_replies.clone().try_acquire_owned().ok()
    }
}

impl Default for Limits {
    fn default() -> Self {
        Self::new(LimitsConfig::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(id: &str) -> SlackUserId {
        SlackUserId::parse(id).unwrap()
    }

    #[test]
    fn a_person_gets_their_per_minute_commands_then_waits_for_the_refill() {
        let limits = Limits::new(LimitsConfig {
            commands_per_minute: 2,
            follow_ups: 4,
        });
        let t0 = Instant::now();
        let a = user("U1");
        assert!(limits.take_command(&a, t0).is_ok());
        assert!(limits.take_command(&a, t0).is_ok());
        assert_eq!(
            limits.take_command(&a, t0),
            Err(Refused::RateLimited {
                per_minute: 2,
                wait_secs: 30
            })
        );
        // Someone else is not affected, and half a minute brings one command back.
        assert!(limits.take_command(&user("U2"), t0).is_ok());
        assert!(
            limits
                .take_command(&a, t0 + Duration::from_secs(30))
                .is_ok()
        );
    }

    #[test]
    fn one_sweep_and_a_bounded_number_of_follow_ups_at_a_time() {
        let limits = Limits::new(LimitsConfig {
            commands_per_minute: 2,
            follow_ups: 1,
        });
        let sweep = limits.try_sweep().unwrap();
        assert_eq!(limits.try_sweep().unwrap_err(), Refused::SweepRunning);
        drop(sweep);
        assert!(limits.try_sweep().is_ok());
        let task = limits.try_follow_up().unwrap();
        assert_eq!(limits.try_follow_up().unwrap_err(), Refused::Busy);
        drop(task);
        assert!(limits.try_follow_up().is_ok());
    }
}
