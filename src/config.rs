//! One `Settings` tree for the whole service.
//!
//! Secrets and endpoints come from conventional environment variables (`E2B_API_KEY`,
//! `SLACK_SIGNING_SECRET`, `REDIS_URL`, ...); policy (channels, approvers, thresholds) comes
//! from `steward.toml`. Defaults are embedded here so Steward runs with no file at all.
//! Secrets are `SecretString`, so they never reach logs or `Debug` output.
//!
//! This module reads the environment and files; it must not open network connections.
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use secrecy::SecretString;

use crate::duration::{self, InvalidDuration};
pub use crate::e2b::{DEFAULT_E2B_REQUEST_TIMEOUT_SECS, E2bSettings};
use crate::hygiene::HygieneConfig;
use crate::ids::SlackChannelId;
use crate::runs::{OnFinish, RunLimits, RunPolicy};
pub use crate::slack::SlackSettings;
pub use crate::slack::socket::SocketSettings;
pub use crate::store::RedisSettings;
use serde::Deserialize;

/// Default E2B control-plane base URL.
pub const DEFAULT_E2B_API_URL: &str = "https://api.e2b.app";
/// Default Slack Web API base URL (no trailing slash).
pub const DEFAULT_SLACK_API_URL: &str = "https://slack.com/api";
/// Default listen address for `steward serve`.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:3000";
/// Default Redis URL.
pub const DEFAULT_REDIS_URL: &str = "redis://127.0.0.1:6379";
/// Default name of this replica (`HOSTNAME`), the start of its queue consumer name.
pub const DEFAULT_REPLICA_NAME: &str = "steward";
/// Default prefix of every Redis key Steward writes.
pub const DEFAULT_REDIS_PREFIX: &str = "steward";
/// Default time a client has to send a request's headers (`STEWARD_HEADER_TIMEOUT`).
pub const DEFAULT_HEADER_TIMEOUT_SECS: u64 = 10;
/// Default time a client has to send a request's body (`STEWARD_BODY_TIMEOUT`).
pub const DEFAULT_BODY_TIMEOUT_SECS: u64 = 30;
/// Default time one request may take from its headers to its answer (`STEWARD_REQUEST_TIMEOUT`).
pub const DEFAULT_REQUEST_TIMEOUT_SECS: u64 = 60;
/// Default number of connections served at once (`STEWARD_MAX_CONNECTIONS`).
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;
/// Default bytes of API, MCP and webhook request bodies held at once (`STEWARD_BODY_BUDGET`).
pub const DEFAULT_BODY_BUDGET_BYTES: usize = 64 * 1024 * 1024;
/// The smallest `STEWARD_BODY_BUDGET`: the largest body Steward reads (a GitHub webhook, 25 MiB)
/// must fit in it, or such a request could never be served.
pub const MIN_BODY_BUDGET_BYTES: usize = 25 * 1024 * 1024;

/// Why configuration could not be loaded. Each variant displays as one sentence naming the
/// setting (and the file), with no source chain behind it, so `{:#}` never says it twice.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{name} is not valid: {reason}")]
    Invalid { name: String, reason: String },
    #[error("could not read the policy file {}: {reason}.", path.display())]
    Read { path: PathBuf, reason: String },
    /// The file is TOML but not a policy Steward knows, or not TOML at all; `detail` says which
    /// line and key, and what is allowed there.
    #[error("{}: {detail}", path.display())]
    Toml { path: PathBuf, detail: String },
}

/// Where environment values come from. Production uses the process environment; tests pass a map.
pub trait Env {
    fn var(&self, name: &str) -> Option<String>;
}

/// The real process environment.
pub struct ProcessEnv;

impl Env for ProcessEnv {
    fn var(&self, name: &str) -> Option<String> {
        std::env::var(name).ok().filter(|v| !v.trim().is_empty())
    }
}

impl Env for HashMap<String, String> {
    fn var(&self, name: &str) -> Option<String> {
        self.get(name).cloned().filter(|v| !v.trim().is_empty())
    }
}

/// Limits at the HTTP edge, so no client can hold a connection or a request open forever.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EdgeSettings {
    /// A connection that has not sent a whole request head within this is closed.
    pub header_timeout: Duration,
    /// A request whose body has not fully arrived within this is answered 408.
    pub body_timeout: Duration,
    /// A request not answered within this is answered 408.
    pub request_timeout: Duration,
    /// Connections served at once; more are answered 503 and closed.
    pub max_connections: usize,
    /// Bytes of request bodies (agent API, `/mcp`, GitHub webhook) held in memory at once, across
    /// all requests; a request whose body does not fit is answered 503 with `Retry-After`.
    pub body_budget: usize,
}

impl Default for EdgeSettings {
    fn default() -> Self {
        Self {
            header_timeout: Duration::from_secs(DEFAULT_HEADER_TIMEOUT_SECS),
            body_timeout: Duration::from_secs(DEFAULT_BODY_TIMEOUT_SECS),
            request_timeout: Duration::from_secs(DEFAULT_REQUEST_TIMEOUT_SECS),
            max_connections: DEFAULT_MAX_CONNECTIONS,
            body_budget: DEFAULT_BODY_BUDGET_BYTES,
        }
    }
}

impl EdgeSettings {
    pub fn from_env(env: &dyn Env) -> Result<Self, ConfigError> {
        let mut edge = Self::default();
        for (name, slot) in [
            ("STEWARD_HEADER_TIMEOUT", &mut edge.header_timeout),
            ("STEWARD_BODY_TIMEOUT", &mut edge.body_timeout),
            ("STEWARD_REQUEST_TIMEOUT", &mut edge.request_timeout),
        ] {
            if let Some(v) = env.var(name) {
                let d = parse_duration(name, &v)?;
                // A zero timeout would refuse every request; a huge one is no limit at all.
                if d.is_zero() || d > Duration::from_secs(24 * 3600) {
                    return Err(ConfigError::Invalid {
                        name: name.to_owned(),
                        reason: format!("{v:?} must be between 1s and 24h"),
                    });
                }
                *slot = d;
            }
        }
        if let Some(v) = env.var("STEWARD_MAX_CONNECTIONS") {
            edge.max_connections = v
                .trim()
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=1_000_000).contains(n))
                .ok_or_else(|| ConfigError::Invalid {
                    name: "STEWARD_MAX_CONNECTIONS".into(),
                    reason: format!("{v:?} is not a number of connections between 1 and 1000000"),
                })?;
        }
        if let Some(v) = env.var("STEWARD_BODY_BUDGET") {
            edge.body_budget = parse_bytes(&v)
                .filter(|n| (MIN_BODY_BUDGET_BYTES..=64 << 30).contains(n))
                .ok_or_else(|| ConfigError::Invalid {
                    name: "STEWARD_BODY_BUDGET".into(),
                    reason: format!(
                        "{v:?} is not a size between 25MiB (the largest body Steward reads) and 64GiB, like 64MiB or 67108864"
                    ),
                })?;
        }
        Ok(edge)
    }
}

/// A size in bytes: a plain number, or one ending in `KiB`, `MiB` or `GiB`.
fn parse_bytes(text: &str) -> Option<usize> {
    let text = text.trim();
    let (digits, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => text.split_at(at),
        None => (text, ""),
    };
    let shift = match unit.trim() {
        "" | "B" => 0,
        "KiB" => 10,
        "MiB" => 20,
        "GiB" => 30,
        _ => return None,
    };
    digits
        .parse::<usize>()
        .ok()?
        .checked_mul(1usize.checked_shl(shift)?)
}

/// [`E2bSettings`] from `E2B_API_URL`, `E2B_API_KEY`, `E2B_PROJECT_ID` (or `E2B_TEAM_ID`) and
/// `E2B_REQUEST_TIMEOUT`.
pub fn e2b_settings(env: &dyn Env) -> Result<E2bSettings, ConfigError> {
    let request_timeout = match env.var("E2B_REQUEST_TIMEOUT") {
        Some(v) => parse_duration("E2B_REQUEST_TIMEOUT", &v)?,
        None => Duration::from_secs(DEFAULT_E2B_REQUEST_TIMEOUT_SECS),
    };
    Ok(E2bSettings {
        api_url: env
            .var("E2B_API_URL")
            .unwrap_or_else(|| DEFAULT_E2B_API_URL.to_owned())
            .trim_end_matches('/')
            .to_owned(),
        api_key: env.var("E2B_API_KEY").map(SecretString::from),
        // E2B's newer name for a team is "project"; accept both, preferring the newer one.
        team_id: env.var("E2B_PROJECT_ID").or_else(|| env.var("E2B_TEAM_ID")),
        request_timeout,
    })
}

/// [`SlackSettings`] from `SLACK_API_URL`, `SLACK_BOT_TOKEN`, `SLACK_SIGNING_SECRET` and `STEWARD_TEMPLATES`.
pub fn slack_settings(env: &dyn Env) -> SlackSettings {
    SlackSettings {
        api_url: env
            .var("SLACK_API_URL")
            .unwrap_or_else(|| DEFAULT_SLACK_API_URL.to_owned())
            .trim_end_matches('/')
            .to_owned(),
        bot_token: env.var("SLACK_BOT_TOKEN").map(SecretString::from),
        signing_secret: env.var("SLACK_SIGNING_SECRET").map(SecretString::from),
        templates_dir: env.var("STEWARD_TEMPLATES").map(PathBuf::from),
    }
}

/// Socket Mode from `SLACK_APP_TOKEN`: `None` when unset (Slack then reaches Steward over
/// HTTP only). Anything but an app-level token (`xapp-…`) is refused without repeating it.
pub fn socket_settings(env: &dyn Env) -> Result<Option<SocketSettings>, ConfigError> {
    let Some(token) = env.var("SLACK_APP_TOKEN") else {
        return Ok(None);
    };
    let token = token.trim();
    if !token.starts_with("xapp-") || token.len() <= "xapp-".len() {
        return Err(ConfigError::Invalid {
            name: "SLACK_APP_TOKEN".into(),
            reason:
                "it must be the app-level token (xapp-…) from the app's Basic Information page, \
                     not the bot token (xoxb-…) or the signing secret"
                    .into(),
        });
    }
    Ok(Some(SocketSettings {
        app_token: SecretString::from(token.to_owned()),
    }))
}

/// [`RedisSettings`] from `REDIS_URL` and `STEWARD_REDIS_PREFIX`.
pub fn redis_settings(env: &dyn Env) -> RedisSettings {
    RedisSettings {
        url: SecretString::from(
            env.var("REDIS_URL")
                .unwrap_or_else(|| DEFAULT_REDIS_URL.to_owned()),
        ),
        key_prefix: env
            .var("STEWARD_REDIS_PREFIX")
            .unwrap_or_else(|| DEFAULT_REDIS_PREFIX.to_owned()),
    }
}

/// `E2B_SANDBOX_URL`, checked to be an http(s) URL (without a trailing slash).
pub fn sandbox_url(env: &dyn Env) -> Result<Option<String>, ConfigError> {
    let Some(text) = env.var(crate::envd::client::SANDBOX_URL_ENV) else {
        return Ok(None);
    };
    let text = text.trim().trim_end_matches('/').to_owned();
    match url::Url::parse(&text) {
        Ok(url) if matches!(url.scheme(), "http" | "https") => Ok(Some(text)),
        _ => Err(ConfigError::Invalid {
            name: crate::envd::client::SANDBOX_URL_ENV.into(),
            reason: "it must be an http:// or https:// URL".into(),
        }),
    }
}

/// `STEWARD_PUBLIC_URL`: the base URL Slack, GitHub and E2B reach this deployment at
/// (`https://steward.example.com`), without a trailing slash. Optional: `steward check` uses it to
/// tell whether E2B's webhook registration points here, `steward e2b webhooks register` as its
/// default `--url`.
pub fn public_url(env: &dyn Env) -> Result<Option<String>, ConfigError> {
    let Some(text) = env
        .var("STEWARD_PUBLIC_URL")
        .filter(|t| !t.trim().is_empty())
    else {
        return Ok(None);
    };
    let text = text.trim().trim_end_matches('/').to_owned();
    match url::Url::parse(&text) {
        Ok(url) if matches!(url.scheme(), "http" | "https") && url.host().is_some() => {
            Ok(Some(text))
        }
        _ => Err(ConfigError::Invalid {
            name: "STEWARD_PUBLIC_URL".into(),
            reason: "it must be an https:// URL like https://steward.example.com".into(),
        }),
    }
}

/// Policy read from `steward.toml`. Every field has a default.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Policy {
    pub channels: Channels,
    /// Who may decide which option of a case, and by when (`[approvals]`).
    pub approvals: crate::cases::ApprovalPolicy,
    /// The fleet sweep: schedule, channel, guard, owners and the idle policy (`[hygiene]`).
    pub hygiene: HygieneConfig,
    /// Per-user rate limit and follow-up bounds of the Slack surface (`[limits]`).
    pub limits: crate::slack::limits::LimitsConfig,
    /// Governed runs: bounds, timeouts, output cap and what happens after (`[runs]`).
    pub runs: RunsConfig,
    /// Who may call the agent API and the MCP server (`[api]`).
    pub api: ApiConfig,
    /// GitHub webhook secrets (`[github]`); prefer `GITHUB_WEBHOOK_SECRET`.
    pub github: GithubConfig,
    /// What a GitHub push runs, per repository (`[[push_tests]]`); checked by [`Settings::load`].
    pub push_tests: Vec<crate::github::PushTestEntry>,
    /// Queue workers per replica, per lane, and how long a stopping replica drains (`[workers]`).
    pub workers: WorkersConfig,
    /// E2B lifecycle events: how often one replica polls E2B's events API (`[events]`).
    pub events: EventsConfig,
    /// Rules on E2B's lifecycle events (`[[watch]]`); checked by [`Settings::load`].
    pub watch: Vec<crate::watch::WatchEntry>,
}

/// `[events]` as written: `poll_every` (default `1m`; `off` turns the poller off), how often one
/// replica reads E2B's `/events/sandboxes` to catch what webhooks missed.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EventsConfig {
    pub poll_every: Option<String>,
}

/// The poller's interval when `[events] poll_every` is not set.
pub const DEFAULT_EVENTS_POLL_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

/// `[workers]` as written: `decisions` (default 4) and `runs` (default 4) queue workers per
/// replica, each lane its own, so decisions never wait behind runs; `shutdown_grace` (default
/// `25s`, inside Kubernetes' 30 s): how long a stopping replica may finish what it is doing
/// before it hands the rest over.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WorkersConfig {
    pub decisions: Option<usize>,
    pub runs: Option<usize>,
    pub shutdown_grace: Option<String>,
}

/// `[workers]`, checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Workers {
    pub decisions: usize,
    pub runs: usize,
    pub shutdown_grace: std::time::Duration,
}

impl Default for Workers {
    fn default() -> Self {
        Self {
            decisions: 4,
            runs: 4,
            shutdown_grace: std::time::Duration::from_secs(25),
        }
    }
}

/// `[github]`: `secrets = ["..."]`, accepted besides `GITHUB_WEBHOOK_SECRET`'s (`Debug` hides
/// them), and how many push tests run at once: `max_runs` (overall, default 8) and
/// `max_runs_per_repository` (default 2); the rest wait in order.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GithubConfig {
    pub secrets: Vec<SecretString>,
    pub max_runs: Option<usize>,
    pub max_runs_per_repository: Option<usize>,
}

/// `GITHUB_APP_ID` with `GITHUB_APP_PRIVATE_KEY` (the PEM itself) or
/// `GITHUB_APP_PRIVATE_KEY_FILE` (a path to it), and `GITHUB_API_URL` (GitHub Enterprise
/// Server; default `https://api.github.com`). One without the other is a mistake, said.
fn github_app(env: &dyn Env) -> Result<Option<crate::github::GithubApp>, ConfigError> {
    let var = |name: &str| {
        env.var(name)
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
    };
    let id = var("GITHUB_APP_ID");
    let key = match (
        var("GITHUB_APP_PRIVATE_KEY"),
        var("GITHUB_APP_PRIVATE_KEY_FILE"),
    ) {
        (Some(pem), _) => Some(SecretString::from(pem)),
        (None, Some(path)) => Some(SecretString::from(std::fs::read_to_string(&path).map_err(
            |e| ConfigError::Invalid {
                name: "GITHUB_APP_PRIVATE_KEY_FILE".into(),
                reason: format!("{path} could not be read: {e}"),
            },
        )?)),
        (None, None) => None,
    };
    let (id, key) = match (id, key) {
        (None, None) => return Ok(None),
        (Some(id), Some(key)) => (id, key),
        (Some(_), None) => {
            return Err(ConfigError::Invalid {
                name: "GITHUB_APP_ID".into(),
                reason: "it is set, but neither GITHUB_APP_PRIVATE_KEY nor GITHUB_APP_PRIVATE_KEY_FILE is".into(),
            });
        }
        (None, Some(_)) => {
            return Err(ConfigError::Invalid {
                name: "GITHUB_APP_PRIVATE_KEY".into(),
                reason: "a private key is set, but GITHUB_APP_ID is not".into(),
            });
        }
    };
    let api = var("GITHUB_API_URL").unwrap_or_else(|| crate::github::app::DEFAULT_API_URL.into());
    crate::github::GithubApp::new(&id, &key, &api)
        .map(Some)
        .map_err(|reason| ConfigError::Invalid {
            name: "GITHUB_APP_ID".into(),
            reason,
        })
}

/// `GITHUB_WEBHOOK_SECRET` (a comma-separated list, so one can be rotated), `[github] secrets`,
/// `GITHUB_TOKEN`, and the checked `[[push_tests]]` (errors name the entry and the key).
pub fn github_settings(
    env: &dyn Env,
    policy: &Policy,
) -> Result<crate::github::GithubSettings, ConfigError> {
    let mut webhook_secrets: Vec<SecretString> = env
        .var("GITHUB_WEBHOOK_SECRET")
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| SecretString::from(s.to_owned()))
        .collect();
    {
        use secrecy::ExposeSecret;
        webhook_secrets.extend(
            policy
                .github
                .secrets
                .iter()
                .filter(|s| !s.expose_secret().trim().is_empty())
                .cloned(),
        );
    }
    let token = env
        .var("GITHUB_TOKEN")
        .map(|t| t.trim().to_owned())
        .filter(|t| !t.is_empty())
        .map(SecretString::from);
    let app = github_app(env)?;
    let max_timeout = policy
        .runs()
        .map(|p| p.limits.max_timeout)
        .unwrap_or(RunLimits::default().max_timeout);
    let push_tests = policy
        .push_tests
        .iter()
        .enumerate()
        .map(|(i, entry)| entry.check(i + 1, max_timeout))
        .collect::<Result<Vec<_>, String>>()
        .map_err(|reason| ConfigError::Invalid {
            name: "steward.toml".into(),
            reason,
        })?;
    let defaults = crate::github::queue::Caps::default();
    let cap = |key: &str, value: Option<usize>, default: usize| match value {
        Some(0) => Err(ConfigError::Invalid {
            name: format!("[github] {key}"),
            reason: "it must be at least 1 (0 would never run a push test)".into(),
        }),
        Some(n) => Ok(n),
        None => Ok(default),
    };
    let caps = crate::github::queue::Caps {
        max_runs: cap("max_runs", policy.github.max_runs, defaults.max_runs)?,
        max_runs_per_repository: cap(
            "max_runs_per_repository",
            policy.github.max_runs_per_repository,
            defaults.max_runs_per_repository,
        )?,
    };
    Ok(crate::github::GithubSettings {
        webhook_secrets,
        token,
        app,
        push_tests,
        caps,
    })
}

/// `[runs]` as written in steward.toml; every key is optional (see [`RunLimits::default`] and
/// [`RunPolicy::default`] for the defaults). [`Policy::runs`] checks it and makes the
/// [`RunPolicy`].
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RunsConfig {
    pub max_files: Option<usize>,
    pub max_total_file_bytes: Option<usize>,
    pub max_command_chars: Option<usize>,
    pub max_env_vars: Option<usize>,
    pub default_timeout: Option<String>,
    pub max_timeout: Option<String>,
    pub output_cap_bytes: Option<usize>,
    pub kill_grace: Option<String>,
    pub sandbox_margin: Option<String>,
    pub on_finish: Option<OnFinish>,
    pub keep_running_for: Option<String>,
    pub decide_within: Option<String>,
    pub wake_fallback: Option<String>,
}

/// Where Steward posts.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Channels {
    /// Approval cases; when unset, the channel the command came from.
    pub approvals: Option<String>,
    /// Hygiene digests.
    pub hygiene: Option<String>,
    /// Run cases; when unset, the approvals channel.
    pub runs: Option<String>,
    /// Test-failure alerts from `POST /api/v1/test-failures`; unset, that route answers 503.
    pub engineering: Option<String>,
}

/// `[api]`: the bearer tokens agents and scripts use for `/api/v1` and `/mcp`.
///
/// ```toml
/// [api.tokens.ci-agent]
/// sha256 = "<hex SHA-256 of the token>"   # or a list, to rotate
/// allow = ["run", "read"]                  # the default
/// rate = "60/min"                          # the default
/// ```
///
/// Only hashes are stored, so the file holds no usable secret; `Debug` shows the names only.
#[derive(Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ApiConfig {
    #[serde(deserialize_with = "api_tokens")]
    pub tokens: std::collections::BTreeMap<String, ApiToken>,
}

impl std::fmt::Debug for ApiConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiConfig")
            .field("tokens", &self.tokens.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// One `[api.tokens.NAME]`: the NAME is the requester on cards and in the audit log.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiToken {
    /// SHA-256 digests of the token (several while one is rotated out).
    #[serde(deserialize_with = "token_hashes")]
    pub sha256: Vec<[u8; 32]>,
    #[serde(default = "default_api_allow")]
    pub allow: Vec<ApiAction>,
    #[serde(default)]
    pub rate: ApiRate,
}

/// What a token may do. `read` covers the read-only sandbox views and the token's own runs and
/// cases; `read_all` lets it read every token's runs and cases too (a push test's included).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApiAction {
    Run,
    Read,
    ReadAll,
    RequestKill,
    RequestDeleteTemplate,
    ReportTestFailure,
}

impl ApiAction {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Run => "run",
            Self::Read => "read",
            Self::ReadAll => "read_all",
            Self::RequestKill => "request_kill",
            Self::RequestDeleteTemplate => "request_delete_template",
            Self::ReportTestFailure => "report_test_failure",
        }
    }
}

fn default_api_allow() -> Vec<ApiAction> {
    vec![ApiAction::Run, ApiAction::Read]
}

/// A token's request budget, written `"60/min"` (also `/s`, `/h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApiRate {
    pub requests: u32,
    pub per: Duration,
}

impl Default for ApiRate {
    fn default() -> Self {
        Self {
            requests: 60,
            per: Duration::from_secs(60),
        }
    }
}

impl std::str::FromStr for ApiRate {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let wrong = || format!("rate {text:?} must look like \"60/min\" (per s, min or h)");
        let (n, unit) = text.trim().split_once('/').ok_or_else(wrong)?;
        let requests: u32 = n.trim().parse().map_err(|_| wrong())?;
        let per = match unit.trim() {
            "s" | "sec" | "second" => 1,
            "m" | "min" | "minute" => 60,
            "h" | "hour" => 3600,
            _ => return Err(wrong()),
        };
        if requests == 0 {
            return Err(format!("rate {text:?} allows no requests at all"));
        }
        Ok(Self {
            requests,
            per: Duration::from_secs(per),
        })
    }
}

impl<'de> Deserialize<'de> for ApiRate {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// Token names become requester names on cards: short and plain.
fn api_tokens<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<std::collections::BTreeMap<String, ApiToken>, D::Error> {
    let tokens = std::collections::BTreeMap::<String, ApiToken>::deserialize(d)?;
    let mut seen: Vec<(&[u8; 32], &str)> = Vec::new();
    for (name, token) in &tokens {
        let plain = !name.is_empty()
            && name.len() <= 64
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
        if !plain {
            return Err(serde::de::Error::custom(format!(
                "token name {name:?} must be 1 to 64 letters, digits, '-', '_' or '.'"
            )));
        }
        for hash in &token.sha256 {
            if let Some((_, other)) = seen.iter().find(|(h, _)| *h == hash) {
                return Err(serde::de::Error::custom(format!(
                    "tokens {other:?} and {name:?} share a sha256; each token must name one requester"
                )));
            }
            seen.push((hash, name));
        }
    }
    Ok(tokens)
}

fn token_hashes<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<[u8; 32]>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    let texts = match OneOrMany::deserialize(d)? {
        OneOrMany::One(t) => vec![t],
        OneOrMany::Many(ts) => ts,
    };
    if texts.is_empty() {
        return Err(serde::de::Error::custom(
            "sha256 needs at least one hash (the hex SHA-256 of the token)",
        ));
    }
    texts
        .iter()
        .map(|t| {
            let mut out = [0u8; 32];
            hex::decode_to_slice(t.trim(), &mut out).map_err(|_| {
                serde::de::Error::custom(
                    "sha256 must be 64 hex digits: the SHA-256 of the token (e.g. `printf %s TOKEN | sha256sum`), never the token itself",
                )
            })?;
            Ok(out)
        })
        .collect()
}

impl Policy {
    /// Reads `path`. A missing file gives the defaults only when `required` is false.
    pub fn load(path: &Path, required: bool) -> Result<Self, ConfigError> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !required => {
                return Ok(Self::default());
            }
            Err(e) => {
                let reason = match e.kind() {
                    std::io::ErrorKind::NotFound => {
                        "it does not exist (STEWARD_CONFIG names it)".to_owned()
                    }
                    std::io::ErrorKind::PermissionDenied => "permission denied".to_owned(),
                    _ => e.to_string(),
                };
                return Err(ConfigError::Read {
                    path: path.to_owned(),
                    reason,
                });
            }
        };
        Self::parse(&text).map_err(|e| ConfigError::Toml {
            path: path.to_owned(),
            detail: describe_toml_error(&text, &e),
        })
    }

    pub fn parse(text: &str) -> Result<Self, toml::de::Error> {
        toml::from_str(text)
    }

    /// `[channels] approvals`, checked.
    pub fn approvals_channel(&self) -> Result<Option<SlackChannelId>, String> {
        self.channels
            .approvals
            .as_deref()
            .map(|text| {
                SlackChannelId::parse(text).map_err(|e| {
                    format!("[channels] approvals in steward.toml is not a channel id: {e}")
                })
            })
            .transpose()
    }

    /// `[workers]` checked. Errors name the key.
    pub fn workers(&self) -> Result<Workers, String> {
        let d = Workers::default();
        let count = |key: &str, value: Option<usize>, default: usize| match value {
            Some(0) => Err(format!(
                "[workers] {key} must be at least 1 (0 would never carry that work out)"
            )),
            Some(n) if n > 256 => Err(format!("[workers] {key} is {n}; at most 256")),
            Some(n) => Ok(n),
            None => Ok(default),
        };
        let shutdown_grace = match &self.workers.shutdown_grace {
            None => d.shutdown_grace,
            Some(text) => duration::parse("[workers] shutdown_grace", text)
                .map_err(|e| format!("[workers] shutdown_grace is not valid: {}", e.reason))?,
        };
        Ok(Workers {
            decisions: count("decisions", self.workers.decisions, d.decisions)?,
            runs: count("runs", self.workers.runs, d.runs)?,
            shutdown_grace,
        })
    }

    /// The checked `[[watch]]` rules.
    pub fn watch_rules(&self) -> Result<Vec<crate::watch::WatchRule>, String> {
        crate::watch::check(&self.watch)
    }

    /// `[events] poll_every` checked: `None` when it is `off`.
    pub fn events_poll_every(&self) -> Result<Option<std::time::Duration>, String> {
        match self.events.poll_every.as_deref().map(str::trim) {
            None => Ok(Some(DEFAULT_EVENTS_POLL_EVERY)),
            Some("off") => Ok(None),
            Some(text) => {
                let d = duration::parse("[events] poll_every", text)
                    .map_err(|e| format!("[events] poll_every is not valid: {}", e.reason))?;
                if d < std::time::Duration::from_secs(1) {
                    return Err("[events] poll_every must be at least 1s, or off".into());
                }
                Ok(Some(d))
            }
        }
    }

    /// `[runs]` checked, with `[channels] runs` (checked as a channel id). Errors name the key.
    pub fn runs(&self) -> Result<RunPolicy, String> {
        let c = &self.runs;
        let defaults = RunPolicy::default();
        let d = defaults.limits;
        let count = |key: &str, value: Option<usize>, default: usize| match value {
            Some(0) => Err(format!("[runs] {key} must be more than 0")),
            Some(n) => Ok(n),
            None => Ok(default),
        };
        let time = |key: &str, value: &Option<String>, default: Duration, zero_ok: bool| {
            let Some(text) = value else {
                return Ok(default);
            };
            let parsed = duration::parse(&format!("[runs] {key}"), text)
                .map_err(|e| format!("[runs] {key} is not valid: {}", e.reason))?;
            if parsed.is_zero() && !zero_ok {
                return Err(format!("[runs] {key} must be more than 0s"));
            }
            Ok(parsed)
        };
        let limits = RunLimits {
            max_files: c.max_files.unwrap_or(d.max_files),
            max_total_file_bytes: count(
                "max_total_file_bytes",
                c.max_total_file_bytes,
                d.max_total_file_bytes,
            )?,
            max_command_chars: count(
                "max_command_chars",
                c.max_command_chars,
                d.max_command_chars,
            )?,
            max_env_vars: c.max_env_vars.unwrap_or(d.max_env_vars),
            default_timeout: time(
                "default_timeout",
                &c.default_timeout,
                d.default_timeout,
                false,
            )?,
            max_timeout: time("max_timeout", &c.max_timeout, d.max_timeout, false)?,
            output_cap_bytes: count("output_cap_bytes", c.output_cap_bytes, d.output_cap_bytes)?,
            kill_grace: time("kill_grace", &c.kill_grace, d.kill_grace, true)?,
            sandbox_margin: time("sandbox_margin", &c.sandbox_margin, d.sandbox_margin, false)?,
        };
        if limits.default_timeout > limits.max_timeout {
            return Err(format!(
                "[runs] default_timeout ({}) is longer than max_timeout ({})",
                humantime::format_duration(limits.default_timeout),
                humantime::format_duration(limits.max_timeout)
            ));
        }
        let channel = match self.channels.runs.as_deref() {
            None => None,
            Some(text) => Some(
                SlackChannelId::parse(text)
                    .map_err(|e| {
                        format!("[channels] runs in steward.toml is not a channel id: {e}")
                    })?
                    .to_string(),
            ),
        };
        Ok(RunPolicy {
            limits,
            on_finish: c.on_finish.unwrap_or(defaults.on_finish),
            channel,
            keep_running_for: time(
                "keep_running_for",
                &c.keep_running_for,
                defaults.keep_running_for,
                false,
            )?,
            decide_within: time(
                "decide_within",
                &c.decide_within,
                defaults.decide_within,
                false,
            )?,
            wake_fallback: time(
                "wake_fallback",
                &c.wake_fallback,
                defaults.wake_fallback,
                false,
            )?,
        })
    }

    /// The sweep's configuration: `[hygiene]`, with `[approvals] decide_within` unless `[hygiene]`
    /// sets its own, and its channel (or `[channels] hygiene`).
    pub fn sweep(&self) -> Result<(HygieneConfig, Option<SlackChannelId>), String> {
        let mut config = self.hygiene.clone();
        config
            .decide_within
            .get_or_insert(self.approvals.decide_within);
        let channel = config.channel_or(self.channels.hygiene.as_deref())?;
        Ok((config, channel))
    }
}

/// Everything `steward serve` needs.
#[derive(Debug, Clone)]
pub struct Settings {
    pub listen: SocketAddr,
    /// `STEWARD_METRICS_LISTEN`: when set, `GET /metrics` is served on this address only (and
    /// not on `listen`), so the scrape port can stay inside the cluster.
    pub metrics_listen: Option<SocketAddr>,
    pub e2b: E2bSettings,
    pub slack: SlackSettings,
    /// `SLACK_APP_TOKEN`: when set, Slack delivers over Socket Mode (see `slack::socket`).
    pub socket: Option<SocketSettings>,
    pub redis: RedisSettings,
    /// Timeouts and the connection cap of `steward serve`'s listener.
    pub edge: EdgeSettings,
    /// This replica's name (`HOSTNAME`, default [`DEFAULT_REPLICA_NAME`]), which starts its
    /// queue consumer name so logs and Redis tell replicas apart.
    pub replica_name: String,
    /// `E2B_SANDBOX_URL`: when set, every envd call goes to this one URL with headers naming
    /// the sandbox (self-hosted E2B, or the simulator); unset, each sandbox's own host.
    pub sandbox_url: Option<String>,
    /// Webhook secrets, the clone token and the checked `[[push_tests]]`.
    pub github: crate::github::GithubSettings,
    /// `E2B_WEBHOOK_SECRET` (comma-separated, so one can be rotated): the signature secrets
    /// `POST /e2b/webhook` accepts; empty turns the route off.
    pub e2b_webhook_secrets: Vec<SecretString>,
    /// `STEWARD_PUBLIC_URL` (see [`public_url`]).
    pub public_url: Option<String>,
    pub policy: Policy,
}

impl Settings {
    /// Loads settings from `env`; `steward.toml` from `STEWARD_CONFIG` (required to exist when
    /// set) or `./steward.toml` (optional).
    pub fn load(env: &dyn Env) -> Result<Self, ConfigError> {
        let listen_text = env
            .var("STEWARD_LISTEN")
            .unwrap_or_else(|| DEFAULT_LISTEN.to_owned());
        let listen = listen_text.parse().map_err(|_| ConfigError::Invalid {
            name: "STEWARD_LISTEN".into(),
            reason: format!("{listen_text:?} is not an address like 127.0.0.1:3000"),
        })?;
        let metrics_listen = match env.var("STEWARD_METRICS_LISTEN") {
            Some(text) if !text.trim().is_empty() => {
                Some(text.trim().parse().map_err(|_| ConfigError::Invalid {
                    name: "STEWARD_METRICS_LISTEN".into(),
                    reason: format!("{text:?} is not an address like 0.0.0.0:9090"),
                })?)
            }
            _ => None,
        };
        let policy = match env.var("STEWARD_CONFIG") {
            Some(path) => Policy::load(Path::new(&path), true)?,
            None => Policy::load(Path::new("steward.toml"), false)?,
        };
        policy.workers().map_err(|reason| ConfigError::Invalid {
            name: "steward.toml".into(),
            reason,
        })?;
        policy
            .events_poll_every()
            .map_err(|reason| ConfigError::Invalid {
                name: "steward.toml".into(),
                reason,
            })?;
        policy
            .watch_rules()
            .map_err(|reason| ConfigError::Invalid {
                name: "steward.toml".into(),
                reason,
            })?;
        Ok(Self {
            listen,
            metrics_listen,
            e2b: e2b_settings(env)?,
            slack: slack_settings(env),
            socket: socket_settings(env)?,
            redis: redis_settings(env),
            edge: EdgeSettings::from_env(env)?,
            replica_name: env
                .var("HOSTNAME")
                .unwrap_or_else(|| DEFAULT_REPLICA_NAME.to_owned()),
            sandbox_url: sandbox_url(env)?,
            github: github_settings(env, &policy)?,
            e2b_webhook_secrets: env
                .var("E2B_WEBHOOK_SECRET")
                .unwrap_or_default()
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|s| SecretString::from(s.to_owned()))
                .collect(),
            public_url: public_url(env)?,
            policy,
        })
    }
}

/// One sentence for a `steward.toml` that could not be read as a policy: the line, the key (with its
/// table) and what is wrong or allowed. Valid TOML with a key Steward does not know is called an
/// unknown setting, never "not valid TOML".
fn describe_toml_error(text: &str, e: &toml::de::Error) -> String {
    let message = e.message().trim().trim_end_matches('.');
    let Some(start) = e.span().map(|s| s.start.min(text.len())) else {
        return format!("{message}.");
    };
    let line_no = text[..start].matches('\n').count() + 1;
    if text.parse::<toml::Table>().is_err() {
        return format!("line {line_no} is not valid TOML: {message}.");
    }
    let line = text.lines().nth(line_no - 1).unwrap_or("").trim();
    // The table the line belongs to: the nearest `[header]` at or above it.
    let lines: Vec<&str> = text.lines().take(line_no).collect();
    let table = lines
        .iter()
        .rev()
        .map(|l| l.trim())
        .find(|l| l.starts_with('['))
        .map(|l| l.trim_matches(|c| c == '[' || c == ']').trim().to_owned());
    let on_header = line.starts_with('[');
    let key = line.split('=').next().unwrap_or("").trim();
    let place = match &table {
        _ if on_header => line.to_owned(),
        Some(t) => format!("`{key}` in [{t}]"),
        None => format!("`{key}`"),
    };
    // serde's "unknown field `x`, expected one of `a`, `b`" becomes a sentence naming what is allowed.
    if let Some(rest) = message.strip_prefix("unknown field ") {
        let (field, allowed) = match rest.split_once(", expected ") {
            Some((field, allowed)) => (field, allowed.trim_start_matches("one of ")),
            None => (rest, ""),
        };
        let where_ = match (&table, on_header) {
            (Some(t), false) => format!("[{t}]"),
            _ => match text.lines().nth(line_no - 1).map(str::trim) {
                Some(h) if h.starts_with('[') => parent_table(h),
                _ => "the top level".to_owned(),
            },
        };
        return if allowed.is_empty() {
            format!("line {line_no}: {field} is not a setting of {where_}.")
        } else {
            format!(
                "line {line_no}: {field} is not a setting of {where_}; the settings there are {allowed}."
            )
        };
    }
    format!(
        "line {line_no}, {place}: {}.",
        plain_value_error(key, message)
    )
}

/// Settings that take a duration in quotes.
const DURATION_KEYS: &[&str] = &[
    "decide_within",
    "min_timeout",
    "idle_window",
    "paused_threshold",
    "paused_kill_after",
    "grace_period",
    "expires_soon",
    "default_timeout",
    "max_timeout",
    "kill_grace",
    "sandbox_margin",
    "keep_running_for",
    "restore_window",
    "restored_timeout",
    "timeout",
    "max_exclude_for",
    "shutdown_grace",
];

/// A value error without repeating the key the sentence already names, and serde's
/// "invalid type: X, expected Y" turned round to say what is allowed.
fn plain_value_error(key: &str, message: &str) -> String {
    if let Some(rest) = message.strip_prefix("invalid type: ")
        && let Some((found, expected)) = rest.split_once(", expected ")
    {
        return if DURATION_KEYS.contains(&key) {
            format!("it must be a duration in quotes, like \"24h\" or \"90m\", not {found}")
        } else {
            format!("it must be {expected}, not {found}")
        };
    }
    // Our own parsers start with "<setting> is not valid: "; the sentence has named the key.
    match message.split_once(" is not valid: ") {
        Some((name, reason)) if !name.contains(' ') => reason.to_owned(),
        _ => message.to_owned(),
    }
}

/// The table a `[a.b.c]` header's last key sits in (`[a.b]`), for "not a setting of …".
fn parent_table(header: &str) -> String {
    let inner = header.trim_matches(|c| c == '[' || c == ']').trim();
    match inner.rsplit_once('.') {
        Some((parent, _)) => format!("[{parent}]"),
        None => "the top level".to_owned(),
    }
}

impl From<InvalidDuration> for ConfigError {
    fn from(e: InvalidDuration) -> Self {
        ConfigError::Invalid {
            name: e.name,
            reason: e.reason,
        }
    }
}

/// Parses a duration setting (see [`crate::duration::parse`]).
fn parse_duration(name: &str, value: &str) -> Result<Duration, ConfigError> {
    Ok(duration::parse(name, value)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use secrecy::ExposeSecret;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn defaults_apply_when_nothing_is_set() {
        let e2b = e2b_settings(&env(&[])).unwrap();
        assert_eq!(e2b.api_url, DEFAULT_E2B_API_URL);
        assert!(e2b.api_key.is_none());
        assert_eq!(e2b.request_timeout, Duration::from_secs(60));
    }

    #[test]
    fn the_replica_name_comes_from_hostname_or_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let policy = dir.path().join("steward.toml");
        std::fs::write(&policy, "").unwrap();
        let policy = policy.display().to_string();
        let named = Settings::load(&env(&[
            ("STEWARD_CONFIG", &policy),
            ("HOSTNAME", "replica-a"),
        ]));
        assert_eq!(named.unwrap().replica_name, "replica-a");
        let unnamed = Settings::load(&env(&[("STEWARD_CONFIG", &policy)])).unwrap();
        assert_eq!(unnamed.replica_name, DEFAULT_REPLICA_NAME);
    }

    #[test]
    fn project_id_is_preferred_over_team_id() {
        let e2b = e2b_settings(&env(&[("E2B_TEAM_ID", "old"), ("E2B_PROJECT_ID", "new")])).unwrap();
        assert_eq!(e2b.team_id.as_deref(), Some("new"));
        let e2b = e2b_settings(&env(&[("E2B_TEAM_ID", "old")])).unwrap();
        assert_eq!(e2b.team_id.as_deref(), Some("old"));
    }

    #[test]
    fn secrets_do_not_show_in_debug_output() {
        let e2b = e2b_settings(&env(&[("E2B_API_KEY", "e2b_deadbeef")])).unwrap();
        let slack = slack_settings(&env(&[
            ("SLACK_BOT_TOKEN", "xoxb-secret-token"),
            ("SLACK_SIGNING_SECRET", "signing-secret-value"),
        ]));
        let shown = format!("{e2b:?} {slack:?}");
        assert!(!shown.contains("deadbeef"), "{shown}");
        assert!(!shown.contains("xoxb-secret-token"), "{shown}");
        assert!(!shown.contains("signing-secret-value"), "{shown}");
        assert_eq!(e2b.api_key.unwrap().expose_secret(), "e2b_deadbeef");
    }

    #[test]
    fn the_app_token_must_be_app_level_and_is_never_repeated() {
        assert!(socket_settings(&env(&[])).unwrap().is_none());
        assert!(
            socket_settings(&env(&[("SLACK_APP_TOKEN", "  ")]))
                .unwrap()
                .is_none()
        );
        for wrong in ["xoxb-bot-SECRET", "xapp-", "SECRET"] {
            let e = socket_settings(&env(&[("SLACK_APP_TOKEN", wrong)])).unwrap_err();
            let shown = e.to_string();
            assert!(shown.starts_with("SLACK_APP_TOKEN is not valid"), "{shown}");
            assert!(!shown.contains("SECRET"), "{shown}");
        }
        let ok = socket_settings(&env(&[("SLACK_APP_TOKEN", "xapp-1-A0-SECRET")]))
            .unwrap()
            .unwrap();
        assert!(!format!("{ok:?}").contains("SECRET"));
        assert_eq!(ok.app_token.expose_secret(), "xapp-1-A0-SECRET");
    }

    #[test]
    fn github_settings_combine_env_and_file_secrets_and_check_push_tests() {
        let policy = Policy::parse(
            r#"
[github]
secrets = ["from-file"]

[[push_tests]]
repository = "acme/api"
branches = ["main"]
template = "base"
command = "cargo test"
timeout = "10m"
channel = "C0ENG"
authors = { "alice@example.com" = "U0ALICE" }
"#,
        )
        .unwrap();
        let gh = github_settings(
            &env(&[
                ("GITHUB_WEBHOOK_SECRET", " old , new ,"),
                ("GITHUB_TOKEN", "ghp_tokenvalue"),
            ]),
            &policy,
        )
        .unwrap();
        let secrets: Vec<&str> = gh
            .webhook_secrets
            .iter()
            .map(|s| s.expose_secret())
            .collect();
        assert_eq!(secrets, ["old", "new", "from-file"]);
        assert_eq!(gh.push_tests.len(), 1);
        assert_eq!(gh.push_tests[0].timeout, Duration::from_secs(600));
        let shown = format!("{gh:?} {policy:?}");
        for secret in ["old", "new", "from-file", "ghp_tokenvalue"] {
            assert!(!shown.contains(&format!("\"{secret}\"")), "{shown}");
        }
        assert!(!shown.contains("ghp_tokenvalue"));

        let bad = Policy::parse(
            "[[push_tests]]\nrepository = \"acme/api\"\ntemplate = \"base\"\ncommand = \"x\"\ntimeout = \"2h\"\n",
        )
        .unwrap();
        let err = github_settings(&env(&[]), &bad).unwrap_err().to_string();
        assert!(err.contains("[[push_tests]] acme/api: timeout"), "{err}");
    }

    #[test]
    fn edge_limits_have_defaults_and_refuse_nonsense() {
        assert_eq!(
            EdgeSettings::from_env(&env(&[])).unwrap(),
            EdgeSettings::default()
        );
        let edge = EdgeSettings::from_env(&env(&[
            ("STEWARD_HEADER_TIMEOUT", "2s"),
            ("STEWARD_MAX_CONNECTIONS", "8"),
        ]))
        .unwrap();
        assert_eq!(edge.header_timeout, Duration::from_secs(2));
        assert_eq!(edge.max_connections, 8);
        assert_eq!(edge.body_budget, DEFAULT_BODY_BUDGET_BYTES);
        for (text, bytes) in [
            ("32MiB", 32 << 20),
            ("33554432", 32 << 20),
            ("1GiB", 1 << 30),
        ] {
            let edge = EdgeSettings::from_env(&env(&[("STEWARD_BODY_BUDGET", text)])).unwrap();
            assert_eq!(edge.body_budget, bytes, "{text}");
        }
        for (name, value) in [
            ("STEWARD_BODY_TIMEOUT", "0s"),
            ("STEWARD_REQUEST_TIMEOUT", "soon"),
            ("STEWARD_MAX_CONNECTIONS", "0"),
            ("STEWARD_MAX_CONNECTIONS", "lots"),
            ("STEWARD_BODY_BUDGET", "1MiB"),
            ("STEWARD_BODY_BUDGET", "64MB"),
            ("STEWARD_BODY_BUDGET", "99999999999999999999GiB"),
        ] {
            let err = EdgeSettings::from_env(&env(&[(name, value)])).unwrap_err();
            assert!(err.to_string().contains(name), "{err}");
        }
    }

    #[test]
    fn unknown_policy_keys_are_refused() {
        assert!(Policy::parse("[channels]\napprovals = \"C1\"\n").is_ok());
        assert!(Policy::parse("[chanels]\napprovals = \"C1\"\n").is_err());
        let policy = Policy::parse(
            "[approvals]\ntwo_person_rule = false\n[approvals.approvers]\nkill = { users = [\"U1\"] }\n",
        )
        .unwrap();
        assert!(!policy.approvals.two_person_rule);
        assert!(Policy::parse("[approvals]\ntwo_person = false\n").is_err());
    }

    /// The error `Policy::load` gives for `text`, as the person reading it sees it.
    fn load_error(text: &str) -> String {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("steward.toml");
        std::fs::write(&path, text).unwrap();
        let err = Policy::load(&path, true).unwrap_err();
        format!("{err:#}").replace(&dir.path().display().to_string(), "DIR")
    }

    #[test]
    fn policy_errors_are_one_sentence_naming_the_file_the_key_and_what_is_allowed() {
        insta::assert_snapshot!(
            [
                load_error("[chanels]\napprovals = \"C1\"\n"),
                load_error("[hygiene.idle]\nfoo = 1\n"),
                load_error("[approvals]\ndecide_within = 5\n"),
                load_error("[approvals]\ndecide_within = \n"),
                load_error("[approvals]\ntwo_person_rule = \"yes\"\n"),
                load_error("[hygiene.idle]\nidle_window = \"100000y\"\n"),
            ]
            .join("\n"),
            @r#"
        DIR/steward.toml: line 1: `chanels` is not a setting of the top level; the settings there are `channels`, `approvals`, `hygiene`, `limits`, `runs`, `api`, `github`, `push_tests`, `workers`, `events`, `watch`.
        DIR/steward.toml: line 2: `foo` is not a setting of [hygiene.idle]; the settings there are `cpu_threshold_pct`, `idle_window`, `disk_growth_bytes`, `paused_threshold`, `paused_kill_after`, `significant_disk_bytes`, `grace_period`, `expires_soon`, `keep_key`, `owner_keys`, `prices`, `templates`.
        DIR/steward.toml: line 2, `decide_within` in [approvals]: it must be a duration in quotes, like "24h" or "90m", not integer `5`.
        DIR/steward.toml: line 2 is not valid TOML: string values must be quoted, expected literal string.
        DIR/steward.toml: line 2, `two_person_rule` in [approvals]: it must be a boolean, not string "yes".
        DIR/steward.toml: line 2, `idle_window` in [hygiene.idle]: "100000y" is longer than 100 years, the most Steward accepts.
        "#
        );
        let missing = Policy::load(Path::new("/nonexistent/steward.toml"), true).unwrap_err();
        assert_eq!(
            format!("{missing:#}"),
            "could not read the policy file /nonexistent/steward.toml: it does not exist (STEWARD_CONFIG names it)."
        );
    }

    #[test]
    fn runs_policy_has_defaults_and_reads_every_key() {
        let policy = Policy::parse("").unwrap().runs().unwrap();
        assert_eq!(policy, RunPolicy::default());
        let text = r#"
[channels]
runs = "C0RUNS"
[runs]
max_files = 3
max_total_file_bytes = 2048
max_command_chars = 100
max_env_vars = 4
default_timeout = "2m"
max_timeout = "20m"
output_cap_bytes = 4096
kill_grace = "0s"
sandbox_margin = "5m"
on_finish = "kill_on_success"
keep_running_for = "30m"
decide_within = "1h"
"#;
        let policy = Policy::parse(text).unwrap().runs().unwrap();
        let limits = policy.limits;
        assert_eq!(
            (
                limits.max_files,
                limits.max_total_file_bytes,
                limits.max_command_chars
            ),
            (3, 2048, 100)
        );
        assert_eq!(limits.max_env_vars, 4);
        assert_eq!(limits.default_timeout, Duration::from_secs(120));
        assert_eq!(limits.max_timeout, Duration::from_secs(1200));
        assert_eq!(limits.output_cap_bytes, 4096);
        assert_eq!(limits.kill_grace, Duration::ZERO);
        assert_eq!(limits.sandbox_margin, Duration::from_secs(300));
        assert_eq!(policy.on_finish, OnFinish::KillOnSuccess);
        assert_eq!(policy.channel.as_deref(), Some("C0RUNS"));
        assert_eq!(policy.keep_running_for, Duration::from_secs(1800));
        assert_eq!(policy.decide_within, Duration::from_secs(3600));
    }

    #[test]
    fn runs_policy_refuses_nonsense_naming_the_key() {
        for (text, key) in [
            ("[runs]\nmax_timeout = \"1m\"\n", "default_timeout"),
            ("[runs]\noutput_cap_bytes = 0\n", "output_cap_bytes"),
            ("[runs]\nsandbox_margin = \"soon\"\n", "sandbox_margin"),
            ("[runs]\nmax_timeout = \"0s\"\n", "max_timeout"),
            ("[channels]\nruns = \"#general\"\n", "[channels] runs"),
        ] {
            let err = Policy::parse(text).unwrap().runs().unwrap_err();
            assert!(err.contains(key), "{text}: {err}");
        }
        assert!(Policy::parse("[runs]\non_finish = \"sometimes\"\n").is_err());
        assert!(Policy::parse("[runs]\nmax_file = 3\n").is_err());
    }

    #[test]
    fn the_sandbox_url_must_be_http() {
        assert_eq!(sandbox_url(&env(&[])).unwrap(), None);
        assert_eq!(
            sandbox_url(&env(&[("E2B_SANDBOX_URL", "http://127.0.0.1:9/")])).unwrap(),
            Some("http://127.0.0.1:9".to_owned())
        );
        let err = sandbox_url(&env(&[("E2B_SANDBOX_URL", "ftp://x")])).unwrap_err();
        assert!(err.to_string().contains("E2B_SANDBOX_URL"), "{err}");
    }

    #[test]
    fn limits_have_defaults_and_refuse_unknown_keys() {
        let policy = Policy::parse("").unwrap();
        assert_eq!(policy.limits.commands_per_minute, 20);
        assert_eq!(policy.limits.follow_ups, 256);
        let policy = Policy::parse("[limits]\ncommands_per_minute = 5\n").unwrap();
        assert_eq!(policy.limits.commands_per_minute, 5);
        assert!(Policy::parse("[limits]\nper_minute = 5\n").is_err());
        assert!(Policy::parse("[approvals]\nmin_timeout = \"soon\"\n").is_err());
    }
}
