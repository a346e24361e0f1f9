//! Tracing subscriber setup. Logs go to stderr so `--json` output on stdout stays clean.
//!
//! Plain text for people (colour only on a terminal, and never with `NO_COLOR`), or one JSON object
//! a line for log shippers. This module must not log anything itself; it only decides where logs go,
//! and (with [`WarnGate`]) at which level a warning that may repeat many times a second goes.
use std::io::IsTerminal;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tracing_subscriber::EnvFilter;

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    // One plain line per event; coloured only when stderr is a terminal and `NO_COLOR` is unset.
    #[default]
    Text,
    // One JSON object per line, for log shippers.
    Json,
}

/// Installs a global plain-text subscriber filtered by `RUST_LOG` (default `default_filter`).
/// Safe to call twice: the second call is ignored, which tests rely on.
pub fn init(default_filter: &str) {
    init_as(default_filter, LogFormat::Text);
}

/// Installs a global subscriber writing `format` to stderr, filtered by `RUST_LOG` (default
/// `default_filter`). Safe to call twice: the second call is ignored.
pub fn init_as(default_filter: &str, format: LogFormat) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.with_ansi(colour_wanted()).try_init(),
        LogFormat::Json => builder
            .json()
            .with_ansi(false)
            .with_current_span(false)
            .try_init(),
    };
}

/// Colour codes only help a person at a terminal; a file, a pipe or `NO_COLOR` (any non-empty
/// value, as <https://no-color.org> says) gets plain text.
fn colour_wanted() -> bool {
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    !no_color && std::io::stderr().is_terminal()
}

/// Lets one of a kind of warning through to `warn` per `every`, so a flood (forged requests, an
/// overloaded socket) costs a log line every few seconds instead of one an event, while the first
/// one still shows at the default level. The caller logs the others at `debug`; the warning that
/// goes through says how many were kept quiet since the last. The events themselves are counted
/// in metrics, not here.
pub struct WarnGate {
    every_ms: u64,
    /// The clock reading (see [`now_ms`]) from which the next warning may go through.
    next_ms: AtomicU64,
    /// Events kept at `debug` since the last warning.
    quiet: AtomicU64,
}

impl WarnGate {
    pub const fn new(every: Duration) -> Self {
        Self {
            every_ms: every.as_millis() as u64,
            next_ms: AtomicU64::new(0),
            quiet: AtomicU64::new(0),
        }
    }

    /// `Some(events kept quiet since the last warning)` when this event is to be a warning.
    pub fn warn_now(&self) -> Option<u64> {
        self.warn_at(now_ms())
    }

    fn warn_at(&self, now_ms: u64) -> Option<u64> {
        let next = self.next_ms.load(Ordering::Relaxed);
        if now_ms >= next
            && self
                .next_ms
                .compare_exchange(
                    next,
                    now_ms + self.every_ms,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
        {
            return Some(self.quiet.swap(0, Ordering::Relaxed));
        }
        self.quiet.fetch_add(1, Ordering::Relaxed);
        None
    }
}

/// Milliseconds on a monotonic clock that starts at the first reading.
fn now_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_warning_a_period_goes_through_with_the_count_kept_quiet_before_it() {
        let gate = WarnGate::new(Duration::from_secs(10));
        assert_eq!(gate.warn_at(0), Some(0), "the first is a warning");
        for ms in [1, 500, 9_999] {
            assert_eq!(gate.warn_at(ms), None, "{ms} ms later");
        }
        assert_eq!(
            gate.warn_at(10_000),
            Some(3),
            "ten seconds on, with the three kept quiet"
        );
        assert_eq!(gate.warn_at(10_001), None);
        assert_eq!(gate.warn_at(60_000), Some(1));
    }
}
