//! The values E2B's control plane sends and accepts, with the exact wire names of its OpenAPI spec.
//!
//! Fields the spec marks required are required here (a missing one is a decode error); fields it
//! allows to be absent or `null` are `Option` or default to empty. Deprecated required fields are
//! tolerated when missing, because E2B drops deprecated fields over time. Access tokens are
//! `SecretString`, are never serialized back out, and never show in `Debug`.
//!
//! This module must not perform I/O or know about retries and paging.
use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use chrono::{DateTime, Utc};
use secrecy::SecretString;
use serde::{Deserialize, Deserializer, Serialize};

use crate::ids::{BuildId, SandboxId, TemplateId};

/// The sandbox time-to-live the official SDKs send when the caller gives none. E2B's own default
/// when `timeout` is omitted is only 15 s, so the client always sends one.
pub const DEFAULT_SANDBOX_TIMEOUT: Duration = Duration::from_secs(300);

/// Reads `null` as the type's default (E2B sends `"metadata": null` for some sandboxes).
fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// `running` or `paused`. Sandboxes in the middle of pausing are reported as `paused`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SandboxState {
    Running,
    Paused,
}

impl SandboxState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Paused => "paused",
        }
    }
}

impl fmt::Display for SandboxState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `{enabled}`: whether traffic may resume a paused sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AutoResume {
    pub enabled: bool,
}

/// A volume mounted into a sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeMount {
    pub name: String,
    pub path: String,
}

/// Body of `POST /sandboxes`. Build it with [`NewSandbox::new`]; `timeout` is always sent.
#[derive(Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NewSandbox {
    #[serde(rename = "templateID")]
    pub template_id: TemplateId,
    /// Time to live; `None` sends [`DEFAULT_SANDBOX_TIMEOUT`]. Serialized by the client in seconds.
    #[serde(skip)]
    pub timeout: Option<Duration>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auto_pause: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auto_pause_memory: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auto_resume: Option<AutoResume>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secure: Option<bool>,
    /// snake_case on the wire, unlike every other field.
    #[serde(
        rename = "allow_internet_access",
        skip_serializing_if = "Option::is_none"
    )]
    pub allow_internet_access: Option<bool>,
    /// `SandboxNetworkConfig`, passed through as JSON (it can hold proxy passwords).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub env_vars: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mcp: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub iam: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub volume_mounts: Vec<VolumeMount>,
}

impl NewSandbox {
    /// A request for `template` with every option at E2B's default and a 300 s timeout.
    pub fn new(template: TemplateId) -> Self {
        Self {
            template_id: template,
            timeout: None,
            auto_pause: None,
            auto_pause_memory: None,
            auto_resume: None,
            secure: None,
            allow_internet_access: None,
            network: None,
            metadata: BTreeMap::new(),
            env_vars: BTreeMap::new(),
            mcp: None,
            iam: None,
            volume_mounts: Vec::new(),
        }
    }

    /// The timeout that will be sent.
    pub fn effective_timeout(&self) -> Duration {
        self.timeout.unwrap_or(DEFAULT_SANDBOX_TIMEOUT)
    }
}

/// Env var values, MCP and network settings can hold credentials, so `Debug` shows only their shape.
impl fmt::Debug for NewSandbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NewSandbox")
            .field("template_id", &self.template_id)
            .field("timeout", &self.effective_timeout())
            .field("auto_pause", &self.auto_pause)
            .field("auto_resume", &self.auto_resume)
            .field("metadata", &self.metadata)
            .field("env_vars", &self.env_vars.keys().collect::<Vec<_>>())
            .field("network", &self.network.as_ref().map(|_| "[set]"))
            .field("mcp", &self.mcp.as_ref().map(|_| "[set]"))
            .field("iam", &self.iam.as_ref().map(|_| "[set]"))
            .finish_non_exhaustive()
    }
}

/// A sandbox as returned by create, connect and resume.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Sandbox {
    #[serde(rename = "templateID")]
    pub template_id: TemplateId,
    #[serde(rename = "sandboxID")]
    pub sandbox_id: SandboxId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alias: Option<String>,
    /// Deprecated by E2B; tolerated when missing.
    #[serde(rename = "clientID", default)]
    pub client_id: String,
    pub envd_version: String,
    /// Send as `X-Access-Token` to envd. Never serialized back out.
    #[serde(default, skip_serializing)]
    pub envd_access_token: Option<SecretString>,
    /// Send as `e2b-traffic-access-token` to user ports. Never serialized back out.
    #[serde(default, skip_serializing)]
    pub traffic_access_token: Option<SecretString>,
    /// `None` means E2B's default domain.
    #[serde(default)]
    pub domain: Option<String>,
}

/// The result of `connect`: the sandbox, and whether E2B had to resume it (HTTP 201).
#[derive(Debug, Clone, Serialize)]
pub struct Connected {
    pub sandbox: Sandbox,
    pub resumed: bool,
}

/// One entry of `GET /v2/sandboxes`, and the part of [`SandboxDetail`] it shares.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListedSandbox {
    #[serde(rename = "templateID")]
    pub template_id: TemplateId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alias: Option<String>,
    #[serde(rename = "sandboxID")]
    pub sandbox_id: SandboxId,
    #[serde(rename = "clientID", default)]
    pub client_id: String,
    pub started_at: DateTime<Utc>,
    /// Expiry for running sandboxes; for paused ones, the time of the pause.
    pub end_at: DateTime<Utc>,
    pub cpu_count: u32,
    #[serde(rename = "memoryMB")]
    pub memory_mb: u32,
    #[serde(rename = "diskSizeMB")]
    pub disk_size_mb: u32,
    #[serde(default, deserialize_with = "null_as_default")]
    pub metadata: BTreeMap<String, String>,
    pub state: SandboxState,
    pub envd_version: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub volume_mounts: Vec<VolumeMount>,
}

/// What a sandbox does when its timeout passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnTimeout {
    Kill,
    Pause,
}

/// Lifecycle policy reported by `GET /sandboxes/{id}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Lifecycle {
    pub auto_resume: bool,
    pub on_timeout: OnTimeout,
}

/// `GET /sandboxes/{id}`: a running or paused sandbox in full.
///
/// E2B answers with every field of the sandbox's list entry plus a few that only the detail
/// reports, so the shared fields are a flattened [`ListedSandbox`] (the JSON read and written is
/// the same as listing each field here) and `Deref` lets readers write `detail.state` directly.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxDetail {
    #[serde(flatten)]
    pub listed: ListedSandbox,
    #[serde(default, skip_serializing)]
    pub envd_access_token: Option<SecretString>,
    #[serde(default)]
    pub allow_internet_access: Option<bool>,
    #[serde(default)]
    pub domain: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<serde_json::Value>,
    #[serde(default)]
    pub lifecycle: Option<Lifecycle>,
}

impl std::ops::Deref for SandboxDetail {
    type Target = ListedSandbox;

    fn deref(&self) -> &ListedSandbox {
        &self.listed
    }
}

/// One resource sample of a sandbox. Memory and disk are in bytes.
///
/// Integers are signed because the spec types them as plain `int32`/`int64` with no minimum
/// (unlike `cpuCount` of a sandbox, which has `minimum: 1`); a spec-driven server may send any.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxMetric {
    /// Deprecated by E2B in favour of `timestampUnix`; tolerated when missing.
    #[serde(default)]
    pub timestamp: Option<DateTime<Utc>>,
    pub timestamp_unix: i64,
    pub cpu_count: i32,
    pub cpu_used_pct: f64,
    pub mem_used: i64,
    pub mem_total: i64,
    pub mem_cache: i64,
    pub disk_used: i64,
    pub disk_total: i64,
}

/// One sample of a sandbox's metrics as a judgment of activity reads it: [`SandboxMetric`]
/// without the deprecated `timestamp` text and the fields no judgment uses. Reading a window
/// into these skips parsing a date per sample, which was most of a sweep's decoding work.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MetricPoint {
    pub timestamp_unix: i64,
    pub cpu_used_pct: f64,
    pub mem_used: i64,
    pub mem_total: i64,
    pub disk_used: i64,
    pub disk_total: i64,
}

impl From<&SandboxMetric> for MetricPoint {
    fn from(m: &SandboxMetric) -> Self {
        Self {
            timestamp_unix: m.timestamp_unix,
            cpu_used_pct: m.cpu_used_pct,
            mem_used: m.mem_used,
            mem_total: m.mem_total,
            disk_used: m.disk_used,
            disk_total: m.disk_total,
        }
    }
}

/// One sample of team-wide metrics.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TeamMetric {
    #[serde(default)]
    pub timestamp: Option<DateTime<Utc>>,
    pub timestamp_unix: i64,
    pub concurrent_sandboxes: i32,
    /// Sandboxes started per second.
    pub sandbox_start_rate: f64,
}

/// The maximum of one team metric over an interval.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MaxTeamMetric {
    #[serde(default)]
    pub timestamp: Option<DateTime<Utc>>,
    pub timestamp_unix: i64,
    pub value: f64,
}

/// Which team metric `team_metrics_max` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TeamMaxMetric {
    ConcurrentSandboxes,
    SandboxStartRate,
}

impl TeamMaxMetric {
    /// The `metric` query value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ConcurrentSandboxes => "concurrent_sandboxes",
            Self::SandboxStartRate => "sandbox_start_rate",
        }
    }
}

/// Log levels, ordered so that a filter is a minimum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    Debug,
    Info,
    Warn,
    Error,
}

impl LogLevel {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Debug => "debug",
            Self::Info => "info",
            Self::Warn => "warn",
            Self::Error => "error",
        }
    }
}

impl std::str::FromStr for LogLevel {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "debug" => Ok(Self::Debug),
            "info" => Ok(Self::Info),
            "warn" | "warning" => Ok(Self::Warn),
            "error" => Ok(Self::Error),
            other => Err(format!(
                "{other:?} is not a log level (debug, info, warn, error)"
            )),
        }
    }
}

/// One structured sandbox log line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LogEntry {
    pub timestamp: DateTime<Utc>,
    pub level: LogLevel,
    pub message: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub fields: BTreeMap<String, String>,
}

/// Order in which logs come back. E2B's default is backward (newest first).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogsDirection {
    Forward,
    Backward,
}

impl LogsDirection {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Forward => "forward",
            Self::Backward => "backward",
        }
    }
}

/// Longest `search` string E2B accepts.
pub const MAX_LOG_SEARCH_CHARS: usize = 256;
/// Largest `limit` for logs E2B accepts.
pub const MAX_LOG_LIMIT: u32 = 1000;

/// Query of `GET /v2/sandboxes/{id}/logs`. Every field is optional.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LogsQuery {
    /// Minimum level.
    pub level: Option<LogLevel>,
    /// Case-sensitive substring, at most 256 characters.
    pub search: Option<String>,
    /// End bound when going backward, start bound when going forward (sent in ms).
    pub cursor: Option<DateTime<Utc>>,
    pub direction: Option<LogsDirection>,
    /// At most 1000.
    pub limit: Option<u32>,
}

/// A snapshot: a persistent template made from a sandbox. `snapshot_id` works as a template id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotInfo {
    #[serde(rename = "snapshotID")]
    pub snapshot_id: TemplateId,
    pub names: Vec<String>,
}

/// Build state of a template.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TemplateBuildStatus {
    Building,
    Waiting,
    Ready,
    Error,
}

impl TemplateBuildStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Building => "building",
            Self::Waiting => "waiting",
            Self::Ready => "ready",
            Self::Error => "error",
        }
    }
}

/// Who created a template.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TeamUser {
    pub id: String,
    #[serde(default)]
    pub email: Option<String>,
}

/// One entry of `GET /v2/templates`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Template {
    #[serde(rename = "templateID")]
    pub template_id: TemplateId,
    #[serde(rename = "buildID")]
    pub build_id: BuildId,
    pub cpu_count: u32,
    #[serde(rename = "memoryMB")]
    pub memory_mb: u32,
    #[serde(rename = "diskSizeMB")]
    pub disk_size_mb: u32,
    pub public: bool,
    /// Deprecated in favour of `names`; tolerated when missing.
    #[serde(default, deserialize_with = "null_as_default")]
    pub aliases: Vec<String>,
    pub names: Vec<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub created_by: Option<TeamUser>,
    pub last_spawned_at: Option<DateTime<Utc>>,
    pub spawn_count: i64,
    pub build_count: i32,
    pub envd_version: String,
    pub build_status: TemplateBuildStatus,
}

/// One build of a template.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TemplateBuild {
    #[serde(rename = "buildID")]
    pub build_id: BuildId,
    pub status: TemplateBuildStatus,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    #[serde(default)]
    pub finished_at: Option<DateTime<Utc>>,
    pub cpu_count: u32,
    #[serde(rename = "memoryMB")]
    pub memory_mb: u32,
    #[serde(rename = "diskSizeMB", default)]
    pub disk_size_mb: Option<u32>,
    #[serde(default)]
    pub envd_version: Option<String>,
}

/// `GET /templates/{id}`: a template and its builds (all pages of builds, joined).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TemplateWithBuilds {
    #[serde(rename = "templateID")]
    pub template_id: TemplateId,
    pub public: bool,
    #[serde(default, deserialize_with = "null_as_default")]
    pub aliases: Vec<String>,
    pub names: Vec<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub last_spawned_at: Option<DateTime<Utc>>,
    pub spawn_count: i64,
    pub builds: Vec<TemplateBuild>,
}

/// Which states `list_sandboxes` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StateFilter {
    Running,
    Paused,
    /// Both running and paused (sent explicitly as `running,paused`).
    #[default]
    Both,
}

impl StateFilter {
    /// The comma-joined `state` query value.
    pub fn as_query(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Paused => "paused",
            Self::Both => "running,paused",
        }
    }
}

/// Sort order by start time. E2B's default is newest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    Asc,
    Desc,
}

impl Order {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Asc => "asc",
            Self::Desc => "desc",
        }
    }
}

/// Filters and paging limits of `GET /v2/sandboxes`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ListQuery {
    pub state: StateFilter,
    /// Every pair must match.
    pub metadata: Vec<(String, String)>,
    /// Template id or alias, without a `:tag`.
    pub template: Option<String>,
    pub started_after: Option<DateTime<Utc>>,
    pub order: Option<Order>,
    /// Page size, 1..=100.
    pub limit: Option<u32>,
    /// Most pages to fetch before stopping; `None` uses the client's cap (10,000 by default).
    pub max_pages: Option<u32>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_sandbox_serializes_with_spec_names_and_skips_unset_options() {
        let mut req = NewSandbox::new(TemplateId::parse("base").unwrap());
        req.allow_internet_access = Some(false);
        req.env_vars.insert("TOKEN".into(), "hunter2".into());
        req.metadata.insert("user".into(), "abc".into());
        let json = serde_json::to_value(&req).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "templateID": "base",
                "allow_internet_access": false,
                "envVars": {"TOKEN": "hunter2"},
                "metadata": {"user": "abc"},
            })
        );
        let shown = format!("{req:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("TOKEN"), "{shown}");
    }

    #[test]
    fn listed_sandboxes_tolerate_null_metadata_and_refuse_a_missing_state() {
        let entry = serde_json::json!({
            "templateID": "base", "sandboxID": "sbx1", "clientID": "c",
            "startedAt": "2026-08-20T10:00:00Z", "endAt": "2026-08-20T10:05:00Z",
            "cpuCount": 2, "memoryMB": 512, "diskSizeMB": 1024,
            "metadata": null, "state": "paused", "envdVersion": "0.2.0"
        });
        let listed: ListedSandbox = serde_json::from_value(entry.clone()).unwrap();
        assert!(listed.metadata.is_empty());
        assert_eq!(listed.state, SandboxState::Paused);
        let mut missing = entry;
        missing.as_object_mut().unwrap().remove("state");
        assert!(serde_json::from_value::<ListedSandbox>(missing).is_err());
    }

    #[test]
    fn a_sandbox_detail_reads_and_writes_its_json_field_for_field() {
        let wire = serde_json::json!({
            "templateID": "base", "alias": "py", "sandboxID": "sbx1", "clientID": "c",
            "startedAt": "2026-08-20T10:00:00Z", "endAt": "2026-08-20T10:05:00Z",
            "envdVersion": "0.2.0", "envdAccessToken": "tok-secret",
            "allowInternetAccess": true, "domain": null,
            "cpuCount": 2, "memoryMB": 512, "diskSizeMB": 1024,
            "metadata": null, "state": "running", "network": {"allowOut": ["1.1.1.1"]},
            "lifecycle": {"autoResume": false, "onTimeout": "pause"},
            "volumeMounts": [{"name": "data", "path": "/data"}], "futureField": 1
        });
        let detail: SandboxDetail = serde_json::from_value(wire.clone()).unwrap();
        assert_eq!(detail.state, SandboxState::Running);
        assert_eq!(detail.memory_mb, 512);
        assert!(detail.envd_access_token.is_some());
        assert_eq!(
            detail.lifecycle.map(|l| l.on_timeout),
            Some(OnTimeout::Pause)
        );
        // Written back: every field but the token and the unknown one, with null metadata as {}.
        let mut expected = wire.clone();
        let fields = expected.as_object_mut().unwrap();
        fields.remove("envdAccessToken");
        fields.remove("futureField");
        fields.insert("metadata".into(), serde_json::json!({}));
        assert_eq!(serde_json::to_value(&detail).unwrap(), expected);
        for required in ["state", "memoryMB", "envdVersion", "sandboxID"] {
            let mut missing = wire.clone();
            missing.as_object_mut().unwrap().remove(required);
            assert!(
                serde_json::from_value::<SandboxDetail>(missing).is_err(),
                "{required}"
            );
        }
        let mut optional = wire;
        for key in [
            "alias",
            "clientID",
            "allowInternetAccess",
            "domain",
            "network",
            "lifecycle",
            "volumeMounts",
        ] {
            optional.as_object_mut().unwrap().remove(key);
        }
        let bare: SandboxDetail = serde_json::from_value(optional).unwrap();
        assert!(bare.alias.is_none() && bare.lifecycle.is_none() && bare.volume_mounts.is_empty());
    }

    #[test]
    fn access_tokens_are_read_but_never_written_or_shown() {
        let sandbox: Sandbox = serde_json::from_value(serde_json::json!({
            "templateID": "base", "sandboxID": "sbx1", "clientID": "c",
            "envdVersion": "0.2.0", "envdAccessToken": "tok-secret",
            "trafficAccessToken": null, "domain": null
        }))
        .unwrap();
        assert!(sandbox.envd_access_token.is_some());
        let out = serde_json::to_string(&sandbox).unwrap();
        assert!(!out.contains("tok-secret"), "{out}");
        assert!(!format!("{sandbox:?}").contains("tok-secret"));
    }

    #[test]
    fn log_levels_order_as_minimums_and_parse_loosely() {
        assert!(LogLevel::Debug < LogLevel::Error);
        assert_eq!("WARN".parse::<LogLevel>().unwrap(), LogLevel::Warn);
        assert!("loud".parse::<LogLevel>().is_err());
    }

    #[test]
    fn templates_accept_null_creators_and_spawn_times() {
        let t: Template = serde_json::from_value(serde_json::json!({
            "templateID": "tpl1", "buildID": "0b5e7a1e-0000-4000-8000-000000000000",
            "cpuCount": 2, "memoryMB": 512, "diskSizeMB": 1024, "public": false,
            "aliases": [], "names": ["team/tpl"], "createdAt": "2026-08-20T10:00:00Z",
            "updatedAt": "2026-08-20T10:00:00Z", "createdBy": null, "lastSpawnedAt": null,
            "spawnCount": 0, "buildCount": 1, "envdVersion": "0.2.0", "buildStatus": "ready"
        }))
        .unwrap();
        assert!(t.created_by.is_none());
        assert_eq!(t.build_status, TemplateBuildStatus::Ready);
    }
}
