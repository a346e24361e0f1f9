//! Tracing subscriber setup. Logs go to stderr so `--json` output on stdout stays clean.
//!
//! This module must not log anything itself; it only decides where logs go.
use tracing_subscriber::EnvFilter;

/// Installs a global subscriber filtered by `RUST_LOG` (default `info`). Safe to call twice:
/// the second call is ignored, which tests rely on.
pub fn init(default_filter: &str) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
