//! The E2B client's settings, plain data: `config` reads them from the environment.
use std::time::Duration;

use secrecy::SecretString;

/// Default request timeout for E2B calls.
pub const DEFAULT_E2B_REQUEST_TIMEOUT_SECS: u64 = 60;

/// Settings for the E2B client.
#[derive(Debug, Clone)]
pub struct E2bSettings {
    /// Base URL without a trailing slash, e.g. `https://api.e2b.app`.
    pub api_url: String,
    /// `X-API-Key`. `None` when not configured (commands that need E2B then say so).
    pub api_key: Option<SecretString>,
    /// The team (E2B also calls it project) id, needed for team metrics.
    pub team_id: Option<String>,
    /// Timeout of one HTTP request.
    pub request_timeout: Duration,
}

impl E2bSettings {
    /// Settings for a local simulator at `base_url` with `api_key`.
    pub fn for_url(base_url: &str, api_key: &str) -> Self {
        Self {
            api_url: base_url.trim_end_matches('/').to_owned(),
            api_key: Some(SecretString::from(api_key.to_owned())),
            team_id: None,
            request_timeout: Duration::from_secs(DEFAULT_E2B_REQUEST_TIMEOUT_SECS),
        }
    }
}
