//! Slack settings, plain data: `config` reads them from the environment.
use std::path::PathBuf;

use secrecy::SecretString;

/// Settings for Slack.
#[derive(Debug, Clone)]
pub struct SlackSettings {
    /// Web API base URL without a trailing slash, e.g. `https://slack.com/api`.
    pub api_url: String,
    pub bot_token: Option<SecretString>,
    pub signing_secret: Option<SecretString>,
    /// A directory whose templates override the embedded ones.
    pub templates_dir: Option<PathBuf>,
}
