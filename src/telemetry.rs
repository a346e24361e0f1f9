//! Tracing subscriber setup. Logs go to stderr so `--json` output on stdout stays clean.
//!
//! Plain text for people (colour only on a terminal, and never with `NO_COLOR`), or one JSON object
//! a line for log shippers. This module must not log anything itself; it only decides where logs go.
use std::io::IsTerminal;

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
