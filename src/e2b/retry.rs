//! When the client may send a request again, and how long it waits first.
//!
//! The rule is "never replay a mutation E2B may have acted on". Reads and `DELETE` (idempotent: a
//! second kill of a killed sandbox is a 404) retry on 5xx and network failures. Create, connect,
//! resume and snapshot retry only on 503, which E2B uses for "no capacity, nothing happened".
//! Pause, timeout and refresh are never replayed once delivered. Every request retries on 429
//! (E2B refused it without acting) and on a connection that was never established.
//!
//! This module is pure: it decides, the client sleeps and sends.
use std::time::Duration;

/// How hard the client tries again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in total, including the first. `1` disables retries.
    pub max_attempts: u32,
    /// First backoff delay; doubles on each retry.
    pub base_delay: Duration,
    /// Ceiling of one backoff delay.
    pub max_delay: Duration,
    /// Longest `Retry-After` the client is willing to wait; beyond it the 429 is returned at once.
    pub max_retry_after: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 4,
            base_delay: Duration::from_millis(250),
            max_delay: Duration::from_secs(8),
            max_retry_after: Duration::from_secs(30),
        }
    }
}

impl RetryPolicy {
    /// A policy that never retries.
    pub fn none() -> Self {
        Self {
            max_attempts: 1,
            ..Self::default()
        }
    }

    /// Backoff before retry number `retry` (0 for the first retry), with "equal jitter": half the
    /// exponential delay is fixed, the other half random, so many clients do not retry in step.
    pub fn backoff(&self, retry: u32) -> Duration {
        let exp = self
            .base_delay
            .saturating_mul(2u32.saturating_pow(retry.min(20)))
            .min(self.max_delay);
        let half = exp / 2;
        let jitter_ms = half.as_millis() as u64;
        let jitter = if jitter_ms == 0 {
            Duration::ZERO
        } else {
            Duration::from_millis(rand::random_range(0..=jitter_ms))
        };
        half + jitter
    }
}

/// How safe it is to send a request a second time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replay {
    /// GET and DELETE: retry on 5xx, timeouts and network errors.
    Idempotent,
    /// Create, connect, resume, snapshot: retry only on 503.
    OnlyUnavailable,
    /// Pause, timeout, refresh: never replay a delivered request.
    Never,
}

/// What went wrong with one attempt, as far as retrying cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptOutcome {
    /// An HTTP status came back. `retry_after` only matters for 429.
    Status {
        status: u16,
        retry_after: Option<Duration>,
    },
    /// The connection could not be established, so the request was never delivered.
    NotConnected,
    /// The request may have been delivered (timeout, reset mid-response).
    Interrupted,
}

/// What to do after a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryDecision {
    RetryAfter(Duration),
    GiveUp,
}

/// Decides whether attempt number `attempt` (1-based) should be followed by another.
pub fn decide(
    policy: &RetryPolicy,
    replay: Replay,
    outcome: AttemptOutcome,
    attempt: u32,
) -> RetryDecision {
    if attempt >= policy.max_attempts {
        return RetryDecision::GiveUp;
    }
    let backoff = policy.backoff(attempt - 1);
    match outcome {
        AttemptOutcome::Status {
            status: 429,
            retry_after,
        } => match retry_after {
            // E2B asked for a longer pause than we are willing to hold a caller for.
            Some(wait) if wait > policy.max_retry_after => RetryDecision::GiveUp,
            Some(wait) => RetryDecision::RetryAfter(wait),
            None => RetryDecision::RetryAfter(backoff),
        },
        AttemptOutcome::Status { status, .. } => {
            let retry = match replay {
                Replay::Idempotent => status >= 500,
                Replay::OnlyUnavailable => status == 503,
                Replay::Never => false,
            };
            if retry {
                RetryDecision::RetryAfter(backoff)
            } else {
                RetryDecision::GiveUp
            }
        }
        AttemptOutcome::NotConnected => RetryDecision::RetryAfter(backoff),
        AttemptOutcome::Interrupted => match replay {
            Replay::Idempotent => RetryDecision::RetryAfter(backoff),
            Replay::OnlyUnavailable | Replay::Never => RetryDecision::GiveUp,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(status: u16) -> AttemptOutcome {
        AttemptOutcome::Status {
            status,
            retry_after: None,
        }
    }

    fn retries(replay: Replay, outcome: AttemptOutcome) -> bool {
        matches!(
            decide(&RetryPolicy::default(), replay, outcome, 1),
            RetryDecision::RetryAfter(_)
        )
    }

    #[test]
    fn reads_and_deletes_retry_on_every_server_error_and_network_failure() {
        for s in [500, 502, 503, 504] {
            assert!(retries(Replay::Idempotent, status(s)), "{s}");
        }
        assert!(retries(Replay::Idempotent, AttemptOutcome::Interrupted));
        assert!(retries(Replay::Idempotent, AttemptOutcome::NotConnected));
        assert!(!retries(Replay::Idempotent, status(404)));
        assert!(!retries(Replay::Idempotent, status(400)));
    }

    #[test]
    fn creates_retry_only_on_503_and_on_connections_never_made() {
        assert!(retries(Replay::OnlyUnavailable, status(503)));
        for s in [500, 502, 504, 409] {
            assert!(!retries(Replay::OnlyUnavailable, status(s)), "{s}");
        }
        assert!(retries(
            Replay::OnlyUnavailable,
            AttemptOutcome::NotConnected
        ));
        assert!(!retries(
            Replay::OnlyUnavailable,
            AttemptOutcome::Interrupted
        ));
    }

    #[test]
    fn pause_timeout_and_refresh_are_never_replayed_after_delivery() {
        for s in [500, 502, 503, 504] {
            assert!(!retries(Replay::Never, status(s)), "{s}");
        }
        assert!(!retries(Replay::Never, AttemptOutcome::Interrupted));
        assert!(retries(Replay::Never, AttemptOutcome::NotConnected));
    }

    #[test]
    fn rate_limits_wait_for_retry_after_unless_it_is_too_long() {
        let policy = RetryPolicy::default();
        let limited = |secs| AttemptOutcome::Status {
            status: 429,
            retry_after: Some(Duration::from_secs(secs)),
        };
        assert_eq!(
            decide(&policy, Replay::Never, limited(3), 1),
            RetryDecision::RetryAfter(Duration::from_secs(3))
        );
        assert_eq!(
            decide(&policy, Replay::Idempotent, limited(31), 1),
            RetryDecision::GiveUp
        );
    }

    #[test]
    fn the_last_attempt_always_gives_up() {
        let policy = RetryPolicy {
            max_attempts: 3,
            ..RetryPolicy::default()
        };
        assert!(matches!(
            decide(&policy, Replay::Idempotent, status(500), 2),
            RetryDecision::RetryAfter(_)
        ));
        assert_eq!(
            decide(&policy, Replay::Idempotent, status(500), 3),
            RetryDecision::GiveUp
        );
        assert_eq!(
            decide(&RetryPolicy::none(), Replay::Idempotent, status(500), 1),
            RetryDecision::GiveUp
        );
    }

    #[test]
    fn backoff_grows_stays_under_the_ceiling_and_keeps_half_fixed() {
        let policy = RetryPolicy {
            max_attempts: 10,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_millis(1000),
            max_retry_after: Duration::from_secs(1),
        };
        for _ in 0..50 {
            let first = policy.backoff(0);
            assert!(first >= Duration::from_millis(50) && first <= Duration::from_millis(100));
            let late = policy.backoff(12);
            assert!(late >= Duration::from_millis(500) && late <= Duration::from_millis(1000));
        }
    }
}
