//! What a run is, what may be asked for, and the `[runs]` policy. Pure: no I/O, no clock reads.
use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::cases::{RunOutcome, RunProfile};
use crate::ids::{CaseId, RunId, SandboxId};

/// One file to place in the sandbox before the command runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileSpec {
    /// Where it goes in the sandbox; relative paths are under the run's working directory.
    pub path: String,
    /// The file's bytes.
    #[serde(with = "base64_bytes")]
    pub content: Vec<u8>,
}

/// What an agent asks for: run `command` in a fresh sandbox of `template`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunRequest {
    pub template: String,
    /// A shell command line (`/bin/bash -l -c`).
    pub command: String,
    #[serde(default)]
    pub files: Vec<FileSpec>,
    /// The process's environment: only these variables (plus what the template sets).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub cwd: Option<String>,
    /// `90s`, `10m`, ... (see `duration`); the policy's default when absent.
    #[serde(default)]
    pub timeout: Option<String>,
    /// Names of `env` entries whose values are secrets: each value is replaced by
    /// [`SCRUBBED`] wherever it appears in the run's output. Absent, every value long enough to
    /// be a credential is (see `runs::service`); `[]` scrubs nothing.
    #[serde(default)]
    pub secret_env: Option<Vec<String>>,
    /// A step Steward itself puts before the command (a push test's clone). Never taken from an
    /// agent: the API refuses the field, so only Steward's own code sets it.
    #[serde(skip)]
    pub setup: Option<SetupStep>,
}

/// A step run before the command, as a process of its own that has ended before the command's
/// process is started: it alone sees `env` (a push test's Git credential), so no ancestor,
/// sibling or file of the command ever holds those values. Its output goes into the run's output
/// with the values of `secret_env` scrubbed (from the command's output too); a non-zero exit
/// ends the run with that exit code and the command never starts.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetupStep {
    /// A shell command line (`/bin/bash -l -c`), run in the run's working directory.
    pub command: String,
    /// The step's environment: only these variables (plus what the template sets).
    pub env: BTreeMap<String, String>,
    /// Names of `env` entries whose values are secrets.
    pub secret_env: Vec<String>,
}

/// The values stay out of `Debug`, so a logged request never carries a credential.
impl std::fmt::Debug for SetupStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SetupStep")
            .field("command", &self.command)
            .field("env", &self.env.keys().collect::<Vec<_>>())
            .field("secret_env", &self.secret_env)
            .finish()
    }
}

/// What a secret value in a run's output is replaced with.
pub const SCRUBBED: &str = "[scrubbed]";

/// Replaces secret values in a stream of output chunks, even when a value is split across
/// chunks: an end of a chunk that could begin a secret is held back until the next chunk (or
/// [`Scrubber::finish`]); everything else goes out at once.
#[derive(Default)]
pub struct Scrubber {
    secrets: Vec<Vec<u8>>,
    held: Vec<u8>,
}

impl std::fmt::Debug for Scrubber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scrubber")
            .field("secrets", &self.secrets.len())
            .finish_non_exhaustive()
    }
}

impl Scrubber {
    /// Scrubs `secrets` (empty values are ignored; longer ones first, so a value that contains
    /// another is replaced whole).
    pub fn new<I: IntoIterator<Item = String>>(secrets: I) -> Self {
        let mut secrets: Vec<Vec<u8>> = secrets
            .into_iter()
            .filter(|s| !s.is_empty())
            .map(String::into_bytes)
            .collect();
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        secrets.dedup();
        Self {
            secrets,
            held: Vec::new(),
        }
    }

    fn replace_all(&mut self) {
        for secret in &self.secrets {
            let mut out = Vec::with_capacity(self.held.len());
            let mut i = 0;
            while i < self.held.len() {
                if self.held[i..].starts_with(secret) {
                    out.extend_from_slice(SCRUBBED.as_bytes());
                    i += secret.len();
                } else {
                    out.push(self.held[i]);
                    i += 1;
                }
            }
            self.held = out;
        }
    }

    /// The scrubbed bytes of `chunk` that can be let out now.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<u8> {
        if self.secrets.is_empty() {
            return chunk.to_vec();
        }
        self.held.extend_from_slice(chunk);
        self.replace_all();
        // Hold back only an end that could be the start of a secret.
        let keep = self
            .secrets
            .iter()
            .filter_map(|secret| {
                (1..secret.len())
                    .rev()
                    .find(|&l| self.held.ends_with(&secret[..l]))
            })
            .max()
            .unwrap_or(0);
        let out = self.held.len() - keep;
        self.held.drain(..out).collect()
    }

    /// Whatever was held back, scrubbed.
    pub fn finish(&mut self) -> Vec<u8> {
        self.replace_all();
        std::mem::take(&mut self.held)
    }
}

/// Bounds on what a run may ask for (`[runs]` in steward.toml).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunLimits {
    pub max_files: usize,
    /// Sum of all files' sizes.
    pub max_total_file_bytes: usize,
    pub max_command_chars: usize,
    pub max_env_vars: usize,
    pub default_timeout: Duration,
    pub max_timeout: Duration,
    /// Output kept per run (stdout and stderr together); the rest is counted, not kept.
    pub output_cap_bytes: usize,
    /// Between SIGTERM and SIGKILL at the timeout.
    pub kill_grace: Duration,
    /// Added to the run's timeout for the sandbox's E2B timeout, so a run's sandbox cannot
    /// outlive a dead Steward by much.
    pub sandbox_margin: Duration,
}

impl Default for RunLimits {
    fn default() -> Self {
        Self {
            max_files: 100,
            max_total_file_bytes: 10 * 1024 * 1024,
            max_command_chars: 16 * 1024,
            max_env_vars: 100,
            default_timeout: Duration::from_secs(5 * 60),
            max_timeout: Duration::from_secs(60 * 60),
            output_cap_bytes: 1024 * 1024,
            kill_grace: Duration::from_secs(5),
            sandbox_margin: Duration::from_secs(10 * 60),
        }
    }
}

/// What happens to a run's sandbox when the run ends (`[runs] on_finish`). Policy, not the
/// agent's choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnFinish {
    /// Post a run case; a person decides (the default).
    #[default]
    Ask,
    /// A run that exited 0 has its sandbox killed by policy (audited as such); any other end
    /// is asked like `Ask`.
    KillOnSuccess,
    /// Leave the sandbox to its E2B timeout; the run card is informational.
    Keep,
}

/// `[runs]` in steward.toml.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunPolicy {
    pub limits: RunLimits,
    pub on_finish: OnFinish,
    /// Where run cases go (`[channels] runs`); the approvals channel when unset.
    pub channel: Option<String>,
    /// What "Keep running for…" extends the sandbox's E2B timeout to.
    pub keep_running_for: Duration,
    /// How long a run case waits for a decision before the sandbox is left to its E2B timeout.
    pub decide_within: Duration,
    /// The longest a waiting read of a run (`?wait=`) goes without reading it again when no
    /// change of the run wakes it (`[runs] wake_fallback`, default
    /// [`WAKE_FALLBACK`](super::service::WAKE_FALLBACK)).
    pub wake_fallback: Duration,
}

impl Default for RunPolicy {
    fn default() -> Self {
        Self {
            limits: RunLimits::default(),
            on_finish: OnFinish::Ask,
            channel: None,
            keep_running_for: Duration::from_secs(60 * 60),
            decide_within: Duration::from_secs(4 * 60 * 60),
            wake_fallback: super::service::WAKE_FALLBACK,
        }
    }
}

/// Why a request was refused; `field` names what to fix. `too_large` distinguishes 413 from 422.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct RunInputError {
    pub field: String,
    pub message: String,
    pub too_large: bool,
}

impl RunInputError {
    fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
            too_large: false,
        }
    }

    fn too_large(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
            too_large: true,
        }
    }
}

/// A request that passed [`RunRequest::validate`], with its timeout resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidRun {
    pub request: RunRequest,
    pub timeout: Duration,
}

impl RunRequest {
    /// Checks the request against `limits`; the first problem found is named.
    pub fn validate(self, limits: &RunLimits) -> Result<ValidRun, RunInputError> {
        if self.template.trim().is_empty() {
            return Err(RunInputError::invalid("template", "is empty"));
        }
        if crate::ids::TemplateId::parse(self.template.trim()).is_err() {
            return Err(RunInputError::invalid(
                "template",
                "is not a template id or alias (letters, digits, '-', '_', '/', ':', '.')",
            ));
        }
        if self.command.trim().is_empty() {
            return Err(RunInputError::invalid("command", "is empty"));
        }
        let chars = self.command.chars().count();
        if chars > limits.max_command_chars {
            return Err(RunInputError::too_large(
                "command",
                format!(
                    "is {chars} characters; the limit is {}",
                    limits.max_command_chars
                ),
            ));
        }
        if self.command.contains('\0') {
            return Err(RunInputError::invalid("command", "contains a NUL byte"));
        }
        if self.files.len() > limits.max_files {
            return Err(RunInputError::too_large(
                "files",
                format!(
                    "has {} files; the limit is {}",
                    self.files.len(),
                    limits.max_files
                ),
            ));
        }
        let total: usize = self.files.iter().map(|f| f.content.len()).sum();
        if total > limits.max_total_file_bytes {
            return Err(RunInputError::too_large(
                "files",
                format!(
                    "hold {total} bytes in all; the limit is {} bytes",
                    limits.max_total_file_bytes
                ),
            ));
        }
        for (i, file) in self.files.iter().enumerate() {
            let path = file.path.trim();
            if path.is_empty() || path.len() > 4096 || path.contains('\0') {
                return Err(RunInputError::invalid(
                    format!("files[{i}].path"),
                    "must be a non-empty path without NUL bytes, at most 4096 bytes",
                ));
            }
            if path.split('/').any(|part| part == "..") {
                return Err(RunInputError::invalid(
                    format!("files[{i}].path"),
                    "must not contain '..'",
                ));
            }
        }
        if self.env.len() > limits.max_env_vars {
            return Err(RunInputError::too_large(
                "env",
                format!(
                    "has {} variables; the limit is {}",
                    self.env.len(),
                    limits.max_env_vars
                ),
            ));
        }
        for name in self.env.keys() {
            let ok = !name.is_empty()
                && !name.starts_with(|c: char| c.is_ascii_digit())
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !ok {
                return Err(RunInputError::invalid(
                    format!("env.{name}"),
                    "is not a variable name (letters, digits and '_', not starting with a digit)",
                ));
            }
        }
        if let Some(name) = self
            .secret_env
            .iter()
            .flatten()
            .find(|n| !self.env.contains_key(*n))
        {
            return Err(RunInputError::invalid(
                format!("secret_env.{name}"),
                "names no variable of env",
            ));
        }
        if let Some(cwd) = &self.cwd
            && (!cwd.starts_with('/') || cwd.contains('\0'))
        {
            return Err(RunInputError::invalid("cwd", "must be an absolute path"));
        }
        let timeout = match &self.timeout {
            None => limits.default_timeout,
            Some(text) => {
                let d = crate::duration::parse("timeout", text)
                    .map_err(|e| RunInputError::invalid("timeout", e.reason))?;
                if d.is_zero() {
                    return Err(RunInputError::invalid("timeout", "must be more than 0s"));
                }
                if d > limits.max_timeout {
                    return Err(RunInputError::invalid(
                        "timeout",
                        format!(
                            "is {}; the limit is {}",
                            humantime::format_duration(d),
                            humantime::format_duration(limits.max_timeout)
                        ),
                    ));
                }
                d
            }
        };
        Ok(ValidRun {
            request: self,
            timeout,
        })
    }
}

/// Where a run is in its life. Terminal: `Finished`, `TimedOut`, `Failed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    Queued,
    CreatingSandbox,
    UploadingFiles,
    Running,
    /// The command ended by itself (any exit code).
    Finished,
    /// Stopped by Steward at the run's timeout.
    TimedOut,
    /// Could not complete; `Run::error` says why.
    Failed,
}

impl RunStatus {
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            RunStatus::Finished | RunStatus::TimedOut | RunStatus::Failed
        )
    }
}

/// One run as stored and as the API returns it (the output itself is stored apart).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Run {
    pub id: RunId,
    /// The API token's name (or `cli`).
    pub requester: String,
    pub template: String,
    pub command: String,
    /// Names and sizes of the uploaded files (never their contents).
    pub files: Vec<(String, u64)>,
    pub cwd: Option<String>,
    pub timeout_secs: u64,
    pub status: RunStatus,
    pub sandbox_id: Option<SandboxId>,
    pub created_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    pub exit_code: Option<i32>,
    pub outcome: Option<RunOutcome>,
    pub duration_ms: Option<u64>,
    /// Bytes produced in all; `output_truncated` when more than the cap was produced.
    pub output_bytes: u64,
    pub output_truncated: bool,
    pub profile: Option<RunProfile>,
    /// The last lines of the sandbox's logs at the end of the run.
    pub logs_tail: Vec<String>,
    /// Why the run failed, in a sentence.
    pub error: Option<String>,
    /// The run case posted for the sandbox, once there is one.
    pub case_id: Option<CaseId>,
    /// True once the sandbox was handed over (to a run case, or to its E2B timeout when the
    /// policy keeps it), so a retried job does not hand it over twice.
    #[serde(default)]
    pub handed_over: bool,
    /// Which replica is executing it (for the takeover's message).
    pub worker: Option<String>,
    /// The process streaming now (the clone step or the command) and its pid in the sandbox, so
    /// a replica that takes the run over re-attaches to it instead of failing it.
    #[serde(default)]
    pub process: Option<RunProcess>,
    /// How many times another replica re-attached to the run's process (a deploy or a crash
    /// moved it). Output printed while it moved (well under a second) may be missing.
    #[serde(default)]
    pub reattached: u32,
}

/// Which of a run's processes is running in its sandbox, by pid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunProcess {
    pub phase: RunPhase,
    pub pid: u32,
}

/// A run's processes: Steward's setup step (a push test's clone), then the command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunPhase {
    Setup,
    Command,
}

/// One metrics sample of a run's sandbox, as [`profile`] needs it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    pub cpu_pct: f64,
    pub mem_bytes: u64,
    pub disk_bytes: u64,
}

/// The resource profile of a run from its sandbox's samples over the run (in time order):
/// p95 and max CPU, peak memory, disk at the end minus at the start. `None` without samples.
pub fn profile(samples: &[Sample]) -> Option<RunProfile> {
    let (first, last) = (samples.first()?, samples.last()?);
    let mut cpu: Vec<f64> = samples
        .iter()
        .map(|s| {
            if s.cpu_pct.is_finite() {
                s.cpu_pct
            } else {
                0.0
            }
        })
        .collect();
    cpu.sort_by(f64::total_cmp);
    // Nearest rank: the smallest sample at or above 95 % of them.
    let rank = (cpu.len() * 95).div_ceil(100).max(1);
    Some(RunProfile {
        samples: u32::try_from(samples.len()).unwrap_or(u32::MAX),
        cpu_p95_pct: cpu[rank - 1],
        cpu_max_pct: cpu[cpu.len() - 1],
        peak_memory_bytes: samples.iter().map(|s| s.mem_bytes).max().unwrap_or(0),
        disk_growth_bytes: i64::try_from(last.disk_bytes)
            .unwrap_or(i64::MAX)
            .saturating_sub(i64::try_from(first.disk_bytes).unwrap_or(i64::MAX)),
    })
}

/// How a process that ended by itself (or was stopped at the timeout) counts.
pub fn outcome_of(exit_code: Option<i32>, timed_out: bool) -> RunOutcome {
    match (timed_out, exit_code) {
        (true, _) => RunOutcome::TimedOut,
        (false, Some(0)) => RunOutcome::Succeeded,
        (false, Some(_)) => RunOutcome::ExitedNonZero,
        (false, None) => RunOutcome::Failed,
    }
}

/// The last `lines` lines of `tail` (the end of a run's output), each cut to `max_chars`,
/// lossily decoded. A partial first line (the tail began mid-line) is dropped when whole lines
/// follow it.
pub fn last_lines(tail: &[u8], lines: usize, max_chars: usize, whole: bool) -> Vec<String> {
    let text = String::from_utf8_lossy(tail);
    let mut all: Vec<&str> = text.lines().collect();
    if !whole && all.len() > 1 {
        all.remove(0);
    }
    let start = all.len().saturating_sub(lines);
    all[start..]
        .iter()
        .map(|line| {
            let mut cut: String = line.chars().take(max_chars).collect();
            if line.chars().count() > max_chars {
                cut.push('…');
            }
            cut
        })
        .collect()
}

mod base64_bytes {
    use base64::Engine;
    use base64::engine::general_purpose::STANDARD;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        STANDARD
            .decode(text.as_bytes())
            .map_err(|_| serde::de::Error::custom("content must be base64"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> RunLimits {
        RunLimits {
            max_files: 2,
            max_total_file_bytes: 10,
            max_command_chars: 20,
            max_env_vars: 2,
            default_timeout: Duration::from_secs(60),
            max_timeout: Duration::from_secs(600),
            ..RunLimits::default()
        }
    }

    fn ok() -> RunRequest {
        RunRequest {
            template: "base".into(),
            command: "echo hi".into(),
            files: Vec::new(),
            env: BTreeMap::new(),
            cwd: None,
            timeout: None,
            secret_env: None,
            setup: None,
        }
    }

    #[test]
    fn secrets_are_scrubbed_even_across_chunks() {
        let mut s = Scrubber::new(["hunter2".to_owned(), String::new()]);
        let mut out = s.push(b"pass=hun");
        assert_eq!(out, b"pass=", "only a possible start of a secret waits");
        out.extend(s.push(b"ter2 and hunter"));
        out.extend(s.push(b"2!"));
        out.extend(s.finish());
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "pass=[scrubbed] and [scrubbed]!"
        );
        let mut none = Scrubber::new(Vec::new());
        assert_eq!(none.push(b"abc"), b"abc");
        assert!(none.finish().is_empty());
    }

    #[test]
    fn secret_env_must_name_an_env_variable() {
        check(
            |r| r.secret_env = Some(vec!["TOKEN".into()]),
            "secret_env.TOKEN",
            false,
        );
        let mut req = ok();
        req.env.insert("TOKEN".into(), "x".into());
        req.secret_env = Some(vec!["TOKEN".into()]);
        assert!(req.validate(&limits()).is_ok());
    }

    fn file(path: &str, bytes: usize) -> FileSpec {
        FileSpec {
            path: path.into(),
            content: vec![b'x'; bytes],
        }
    }

    /// The refusal of `req`: its field and whether it is a size limit (413).
    fn refused(req: RunRequest) -> (String, bool) {
        let e = req.validate(&limits()).expect_err("refused");
        assert!(!e.message.is_empty());
        (e.field, e.too_large)
    }

    fn check(change: impl FnOnce(&mut RunRequest), field: &str, too_large: bool) {
        let mut req = ok();
        change(&mut req);
        assert_eq!(refused(req), (field.to_owned(), too_large));
    }

    #[test]
    fn a_plain_request_passes_with_the_default_timeout() {
        let valid = ok().validate(&limits()).unwrap();
        assert_eq!(valid.timeout, Duration::from_secs(60));
        let mut req = ok();
        req.timeout = Some("10m".into());
        assert_eq!(
            req.validate(&limits()).unwrap().timeout,
            Duration::from_secs(600)
        );
    }

    #[test]
    fn an_empty_template_is_refused() {
        check(|r| r.template = "  ".into(), "template", false);
    }

    #[test]
    fn a_template_that_is_no_id_is_refused() {
        check(|r| r.template = "base image".into(), "template", false);
    }

    #[test]
    fn an_empty_command_is_refused() {
        check(|r| r.command = " \n".into(), "command", false);
    }

    #[test]
    fn a_command_over_the_limit_is_too_large() {
        check(|r| r.command = "x".repeat(21), "command", true);
        let mut req = ok();
        req.command = "é".repeat(20);
        assert!(req.validate(&limits()).is_ok(), "characters, not bytes");
    }

    #[test]
    fn a_command_with_a_nul_byte_is_refused() {
        check(|r| r.command = "echo \0".into(), "command", false);
    }

    #[test]
    fn too_many_files_are_too_large() {
        check(
            |r| r.files = vec![file("a", 1), file("b", 1), file("c", 1)],
            "files",
            true,
        );
    }

    #[test]
    fn files_over_the_total_size_are_too_large() {
        check(
            |r| r.files = vec![file("a", 6), file("b", 5)],
            "files",
            true,
        );
    }

    #[test]
    fn an_empty_or_nul_file_path_is_refused() {
        check(|r| r.files = vec![file(" ", 1)], "files[0].path", false);
        check(
            |r| r.files = vec![file("a", 1), file("b\0", 1)],
            "files[1].path",
            false,
        );
    }

    #[test]
    fn a_file_path_with_dot_dot_is_refused() {
        check(
            |r| r.files = vec![file("a/../../etc/x", 1)],
            "files[0].path",
            false,
        );
    }

    #[test]
    fn too_many_env_vars_are_too_large() {
        check(
            |r| {
                for name in ["A", "B", "C"] {
                    r.env.insert(name.into(), "1".into());
                }
            },
            "env",
            true,
        );
    }

    #[test]
    fn an_env_name_that_is_no_variable_name_is_refused() {
        check(
            |r| {
                r.env.insert("A-B".into(), "1".into());
            },
            "env.A-B",
            false,
        );
        check(
            |r| {
                r.env.insert("9A".into(), "1".into());
            },
            "env.9A",
            false,
        );
    }

    #[test]
    fn a_relative_cwd_is_refused() {
        check(|r| r.cwd = Some("work".into()), "cwd", false);
    }

    #[test]
    fn a_timeout_that_is_no_duration_is_refused() {
        check(|r| r.timeout = Some("soon".into()), "timeout", false);
    }

    #[test]
    fn a_zero_timeout_is_refused() {
        check(|r| r.timeout = Some("0s".into()), "timeout", false);
    }

    #[test]
    fn a_timeout_over_the_maximum_is_refused_naming_the_limit() {
        let mut req = ok();
        req.timeout = Some("11m".into());
        let e = req.validate(&limits()).unwrap_err();
        assert_eq!(e.field, "timeout");
        assert!(e.message.contains("10m"), "{e}");
    }

    #[test]
    fn unknown_request_fields_are_refused_and_content_is_base64() {
        let bad = serde_json::json!({"template": "base", "command": "x", "on_finish": "keep"});
        assert!(serde_json::from_value::<RunRequest>(bad).is_err());
        let req: RunRequest = serde_json::from_value(serde_json::json!({
            "template": "base", "command": "x",
            "files": [{"path": "a", "content": "aGk="}],
        }))
        .unwrap();
        assert_eq!(req.files[0].content, b"hi");
        let not_b64 = serde_json::json!({"template": "base", "command": "x",
            "files": [{"path": "a", "content": "%%"}]});
        assert!(serde_json::from_value::<RunRequest>(not_b64).is_err());
    }

    fn sample(cpu: f64, mem: u64, disk: u64) -> Sample {
        Sample {
            cpu_pct: cpu,
            mem_bytes: mem,
            disk_bytes: disk,
        }
    }

    #[test]
    fn the_profile_takes_p95_and_max_cpu_peak_memory_and_disk_growth() {
        assert_eq!(profile(&[]), None);
        let mut samples: Vec<Sample> = (1..=20).map(|n| sample(n as f64, n * 10, 1000)).collect();
        samples.last_mut().unwrap().disk_bytes = 1500;
        let p = profile(&samples).unwrap();
        assert_eq!(p.samples, 20);
        assert_eq!(p.cpu_p95_pct, 19.0);
        assert_eq!(p.cpu_max_pct, 20.0);
        assert_eq!(p.peak_memory_bytes, 200);
        assert_eq!(p.disk_growth_bytes, 500);
        let shrink = profile(&[sample(f64::NAN, 1, 900), sample(5.0, 1, 100)]).unwrap();
        assert_eq!(shrink.disk_growth_bytes, -800);
        assert_eq!(shrink.cpu_max_pct, 5.0);
    }

    #[test]
    fn outcomes_follow_the_exit_code_and_the_timeout() {
        assert_eq!(outcome_of(Some(0), false), RunOutcome::Succeeded);
        assert_eq!(outcome_of(Some(1), false), RunOutcome::ExitedNonZero);
        assert_eq!(outcome_of(None, true), RunOutcome::TimedOut);
        assert_eq!(outcome_of(None, false), RunOutcome::Failed);
    }

    #[test]
    fn last_lines_drop_a_partial_first_line_and_cut_long_ones() {
        assert_eq!(last_lines(b"a\nb\nc\n", 2, 10, true), ["b", "c"]);
        assert_eq!(last_lines(b"rtial\nb\n", 5, 10, false), ["b"]);
        assert_eq!(last_lines(b"only", 5, 10, false), ["only"]);
        assert_eq!(last_lines(b"abcdef", 1, 3, true), ["abc…"]);
    }
}
