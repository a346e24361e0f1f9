//! Approval cases: one question put to people about one sandbox or one template.
//!
//! A [`Case`] records what Steward saw when it opened the question ([`Evidence`]), what it
//! recommends, which options it offers, who asked, and by when a decision is due. Its life is a
//! pure state machine ([`apply`]): `(case, event, now) -> Result<case, TransitionError>`.
//! Who may choose which option is another pure function ([`may_decide`]).
//!
//! This module does no I/O: no Redis, no Slack, no E2B, no clock reads. `store/` makes each
//! transition atomic; `jobs/` executes decided cases step by step.
use std::collections::BTreeMap;
use std::fmt;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::ids::{CaseId, RunId, SandboxId, SlackChannelId, SlackUserId, TemplateId};

pub mod list;
mod machine;
mod policy;
pub mod recheck;
mod steps;

pub use list::ListRef;
pub use machine::{Event, TransitionError, apply};
pub use policy::{
    ApprovalPolicy, ApproverRule, Approvers, Refusal, may_decide, may_restore, may_start_sweep,
};
pub use steps::{Step, StepOutcome, StepRecord, plan_for, remaining_steps};

/// Metadata keys that may name a sandbox's owner, most specific first.
pub const OWNER_METADATA_KEYS: [&str; 3] = ["steward.owner", "owner", "user"];

/// What a case is about.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", content = "id", rename_all = "snake_case")]
pub enum Subject {
    Sandbox(SandboxId),
    Template(TemplateId),
}

impl Subject {
    /// A stable text form, `sandbox:<id>` or `template:<id>`, used in keys and logs.
    pub fn key(&self) -> String {
        match self {
            Subject::Sandbox(id) => format!("sandbox:{id}"),
            Subject::Template(id) => format!("template:{id}"),
        }
    }

    /// Reads [`Subject::key`] back; `None` for anything else.
    pub fn from_key(key: &str) -> Option<Self> {
        let (kind, id) = key.split_once(':')?;
        match kind {
            "sandbox" => SandboxId::parse(id).ok().map(Subject::Sandbox),
            "template" => TemplateId::parse(id).ok().map(Subject::Template),
            _ => None,
        }
    }

    /// The options Steward offers for this kind of subject, in card order.
    pub fn default_options(&self) -> Vec<DecisionOption> {
        match self {
            Subject::Sandbox(_) => vec![
                DecisionOption::SnapshotThenKill,
                DecisionOption::Kill,
                DecisionOption::Pause,
                DecisionOption::Leave,
            ],
            Subject::Template(_) => vec![DecisionOption::DeleteTemplate, DecisionOption::Keep],
        }
    }
}

impl fmt::Display for Subject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Subject::Sandbox(id) => write!(f, "sandbox {id}"),
            Subject::Template(id) => write!(f, "template {id}"),
        }
    }
}

/// One answer a person can give to a case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DecisionOption {
    SnapshotThenKill,
    Kill,
    Pause,
    Leave,
    DeleteTemplate,
    Keep,
    /// A run's sandbox: snapshot it (a checkpoint), then pause it.
    SnapshotAndKeep,
    /// A run's sandbox: extend its E2B timeout (to the case's [`Case::keep_running_for_secs`]).
    KeepRunning,
    /// Set the sandbox's E2B timeout to the case's [`Case::shorten_to_secs`] from now, ending
    /// it sooner than it would have ended: a kill with a delay, so it follows the Kill rule.
    /// Offered by the case `/sandbox timeout` opens for someone who may not kill.
    Shorten,
}

impl DecisionOption {
    pub const ALL: [DecisionOption; 9] = [
        DecisionOption::SnapshotThenKill,
        DecisionOption::Kill,
        DecisionOption::Pause,
        DecisionOption::Leave,
        DecisionOption::DeleteTemplate,
        DecisionOption::Keep,
        DecisionOption::SnapshotAndKeep,
        DecisionOption::KeepRunning,
        DecisionOption::Shorten,
    ];

    /// The options of the case a shortening opens, in card order: what was asked, the
    /// destructive options a kill case offers (one case per subject, so this one stands for
    /// a kill case too), a pause and leaving it as it is.
    pub const SHORTEN: [DecisionOption; 5] = [
        DecisionOption::Shorten,
        DecisionOption::SnapshotThenKill,
        DecisionOption::Kill,
        DecisionOption::Pause,
        DecisionOption::Leave,
    ];

    /// The options of a run case, in card order: a checkpoint that keeps the sandbox, a
    /// checkpoint that ends it, the end without one, and more time.
    pub const RUN: [DecisionOption; 4] = [
        DecisionOption::SnapshotAndKeep,
        DecisionOption::SnapshotThenKill,
        DecisionOption::Kill,
        DecisionOption::KeepRunning,
    ];

    /// The snake_case name used in config, payload values and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            DecisionOption::SnapshotThenKill => "snapshot_then_kill",
            DecisionOption::Kill => "kill",
            DecisionOption::Pause => "pause",
            DecisionOption::Leave => "leave",
            DecisionOption::DeleteTemplate => "delete_template",
            DecisionOption::Keep => "keep",
            DecisionOption::SnapshotAndKeep => "snapshot_and_keep",
            DecisionOption::KeepRunning => "keep_running",
            DecisionOption::Shorten => "shorten",
        }
    }

    /// Parses [`DecisionOption::as_str`] output; `None` for anything else.
    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|o| o.as_str() == text.trim())
    }

    /// Options that destroy something that cannot be brought back. A shortening counts: E2B
    /// kills the sandbox when its shortened timeout runs out.
    pub fn is_irreversible(self) -> bool {
        matches!(
            self,
            DecisionOption::SnapshotThenKill
                | DecisionOption::Kill
                | DecisionOption::DeleteTemplate
                | DecisionOption::Shorten
        )
    }

    /// Options that mean "do nothing": they close the case as Left, with no job.
    pub fn is_leave(self) -> bool {
        matches!(self, DecisionOption::Leave | DecisionOption::Keep)
    }

    /// Whether this option makes sense for `subject`: the run options apply to any sandbox too.
    pub fn applies_to(self, subject: &Subject) -> bool {
        match subject {
            Subject::Sandbox(_) => {
                !matches!(self, DecisionOption::DeleteTemplate | DecisionOption::Keep)
            }
            Subject::Template(_) => subject.default_options().contains(&self),
        }
    }
}

impl fmt::Display for DecisionOption {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DecisionOption::SnapshotThenKill => "Snapshot, then kill",
            DecisionOption::Kill => "Kill",
            DecisionOption::Pause => "Pause",
            DecisionOption::Leave => "Leave it",
            DecisionOption::DeleteTemplate => "Delete template",
            DecisionOption::Keep => "Keep",
            DecisionOption::SnapshotAndKeep => "Snapshot and keep",
            DecisionOption::KeepRunning => "Keep running",
            DecisionOption::Shorten => "Shorten",
        })
    }
}

/// The latest resource usage sample of a sandbox. Byte counts as E2B reports them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Metrics {
    pub cpu_pct: f64,
    pub mem_used: u64,
    pub mem_total: u64,
    pub disk_used: u64,
    pub disk_total: u64,
}

/// For a template case: who still depends on it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TemplateUsage {
    /// Sandboxes currently running or paused from this template.
    pub sandboxes: Vec<SandboxId>,
    /// Snapshots made from this template.
    pub snapshots: u32,
}

/// What Steward saw about the subject when it opened (or refreshed) the case.
/// Fields are optional because templates and sandboxes report different things.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Evidence {
    /// `running`, `paused`, ... as E2B reports it.
    pub state: Option<String>,
    pub template: Option<TemplateId>,
    /// The template's alias (`base`), which people know better than its id. Cases stored
    /// before it was recorded read it as `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_alias: Option<String>,
    pub cpu_count: Option<u32>,
    pub memory_mb: Option<u64>,
    pub disk_mb: Option<u64>,
    pub started_at: Option<DateTime<Utc>>,
    pub idle_since: Option<DateTime<Utc>>,
    pub paused_since: Option<DateTime<Utc>>,
    pub metrics: Option<Metrics>,
    pub metadata: BTreeMap<String, String>,
    /// Taken from `metadata` by [`Evidence::owner_from_metadata`] when a key names one.
    pub owner: Option<String>,
    pub template_usage: Option<TemplateUsage>,
    /// What a governed run did in this sandbox, when the case is a run case.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<RunReport>,
    /// The push whose tests failed in this sandbox, when the case is a push-test alert.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub push: Option<PushReport>,
    /// The sandbox's recent lifecycle as E2B's events told it (created, paused, resumed, ...),
    /// oldest first; empty when no event was received.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lifecycle: Vec<LifecycleEntry>,
}

/// One lifecycle event of a sandbox, as E2B reported it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LifecycleEntry {
    pub at: DateTime<Utc>,
    /// `created`, `updated`, `paused`, `resumed`, `killed`.
    pub what: String,
}

/// The push whose test run failed, as its alert shows it (the run itself is in
/// [`Evidence::run`]). Built when the run ends; pure data, already cut to fit the card.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PushReport {
    /// `owner/name`.
    pub repository: String,
    pub branch: String,
    /// The tested commit (full id).
    pub commit: String,
    /// The test command as configured (without the clone steps Steward runs first).
    pub command: String,
    pub commit_url: Option<String>,
    /// The head commit's message.
    pub message: Option<String>,
    pub author: Option<PushPerson>,
    pub pusher: Option<PushPerson>,
    /// The lines of the output that look like test failures, plus the last lines, ready for a
    /// code block.
    pub failing: String,
    /// Whether failing lines were left out.
    pub failing_cut: bool,
    /// What the output's file in the alert's thread keeps when not all of it ("its first 1.0
    /// MiB and its last 1.0 MiB").
    #[serde(default)]
    pub output_kept: Option<String>,
}

/// Someone behind a push: a name to show and the Slack user to mention, when mapped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PushPerson {
    pub name: String,
    pub slack_user: Option<SlackUserId>,
}

/// The evidence of a governed run, as its run case shows it: who ran what, how it ended, and
/// what it cost. Built by `runs` when a run finishes; pure data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunReport {
    pub run_id: RunId,
    /// The API token's name (or `cli`) that asked for the run.
    pub requester: String,
    pub command: String,
    pub template: String,
    /// `None` when the process never ended by itself (timed out, or the run failed first).
    pub exit_code: Option<i32>,
    pub duration_ms: u64,
    pub outcome: RunOutcome,
    /// The last lines of output (stdout and stderr interleaved as they came), already cut.
    pub output_tail: Vec<String>,
    /// Bytes of output the run produced in all, and whether what is kept was truncated.
    pub output_bytes: u64,
    pub output_truncated: bool,
    pub profile: Option<RunProfile>,
}

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunOutcome {
    /// The command exited with status 0.
    Succeeded,
    /// The command exited with a non-zero status (or was killed by a signal it did not get from us).
    ExitedNonZero,
    /// Steward stopped it at the run's timeout (SIGTERM, then SIGKILL).
    TimedOut,
    /// The run could not complete (sandbox gone, envd error, replica died mid-run, ...).
    Failed,
}

/// Resource use over a run, from the sandbox's metrics samples taken while it ran.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunProfile {
    pub samples: u32,
    pub cpu_p95_pct: f64,
    pub cpu_max_pct: f64,
    pub peak_memory_bytes: u64,
    /// Disk used at the end minus at the start (can be negative).
    pub disk_growth_bytes: i64,
}

impl Evidence {
    /// The owner named by the first of [`OWNER_METADATA_KEYS`] present and non-blank.
    pub fn owner_from_metadata(metadata: &BTreeMap<String, String>) -> Option<String> {
        OWNER_METADATA_KEYS.iter().find_map(|key| {
            metadata
                .get(*key)
                .map(|v| v.trim())
                .filter(|v| !v.is_empty())
                .map(str::to_owned)
        })
    }

    /// Says what changed between this (the evidence people decided on) and `current`, or
    /// `None` when nothing that matters to the decision changed. Usage metrics are left out:
    /// they move all the time and the idle/paused timestamps already capture activity.
    pub fn staleness(&self, current: &Evidence) -> Option<String> {
        let mut changes = Vec::new();
        if self.state != current.state {
            changes.push(format!(
                "state went from {} to {}",
                shown(&self.state),
                shown(&current.state)
            ));
        }
        if self.template != current.template {
            changes.push("its template changed".to_owned());
        }
        if self.started_at != current.started_at {
            changes.push("it was restarted".to_owned());
        }
        if self.idle_since != current.idle_since {
            changes.push(match current.idle_since {
                None => "it is active again".to_owned(),
                Some(t) => format!("it is idle since {t}"),
            });
        }
        if self.paused_since != current.paused_since && self.state == current.state {
            changes.push("it was paused or resumed".to_owned());
        }
        if (self.cpu_count, self.memory_mb, self.disk_mb)
            != (current.cpu_count, current.memory_mb, current.disk_mb)
        {
            changes.push("its size changed".to_owned());
        }
        if self.metadata != current.metadata {
            changes.push("its metadata changed".to_owned());
        }
        if sandboxes_using(self) != sandboxes_using(current) {
            changes.push("the sandboxes using it changed".to_owned());
        }
        (!changes.is_empty()).then(|| changes.join("; "))
    }
}

/// The ids of the sandboxes using a template, sorted, so two listings compare as sets.
fn sandboxes_using(e: &Evidence) -> Option<Vec<&str>> {
    e.template_usage.as_ref().map(|u| {
        let mut ids: Vec<&str> = u.sandboxes.iter().map(|s| s.as_str()).collect();
        ids.sort_unstable();
        ids
    })
}

fn shown(value: &Option<String>) -> &str {
    value.as_deref().unwrap_or("unknown")
}

/// What Steward suggests, and why (shown on the card).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recommendation {
    pub option: DecisionOption,
    pub reason: String,
}

/// Who or what put the question.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Opener {
    Person {
        user: SlackUserId,
    },
    Sweep,
    /// An agent or script through the API or MCP, named by its token's name in `[api.tokens]`.
    /// It is never a Slack user, so the two-person rule has no requester to exclude.
    Agent {
        name: String,
    },
    /// A `[[watch]]` rule on E2B's lifecycle events, by its name.
    Watch {
        rule: String,
    },
}

impl Opener {
    /// The person who asked, if a person did (the two-person rule needs it).
    pub fn requester(&self) -> Option<&SlackUserId> {
        match self {
            Opener::Person { user } => Some(user),
            _ => None,
        }
    }
}

/// Where the case's Slack card lives, so it can be updated in place.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Card {
    pub channel: SlackChannelId,
    pub ts: String,
}

/// Who made a decision: a person, or Steward applying a setting of `steward.toml`.
///
/// Stored untagged, so a person is the bare user id decisions have always been stored as.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Decider {
    Person(SlackUserId),
    /// The setting that decided, as people would find it: `[runs] on_finish = kill_on_success`.
    Policy {
        policy: String,
    },
}

impl Decider {
    /// The person, if a person decided.
    pub fn person(&self) -> Option<&SlackUserId> {
        match self {
            Decider::Person(user) => Some(user),
            Decider::Policy { .. } => None,
        }
    }

    /// The person's user id, or the policy setting (`[runs] on_finish = keep`).
    pub fn as_str(&self) -> &str {
        match self {
            Decider::Person(user) => user.as_str(),
            Decider::Policy { policy } => policy,
        }
    }
}

impl From<SlackUserId> for Decider {
    fn from(user: SlackUserId) -> Self {
        Decider::Person(user)
    }
}

impl PartialEq<SlackUserId> for Decider {
    fn eq(&self, other: &SlackUserId) -> bool {
        self.person() == Some(other)
    }
}

/// A user id, or `policy ([runs] on_finish = keep)`.
impl fmt::Display for Decider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Decider::Person(user) => write!(f, "{user}"),
            Decider::Policy { policy } => write!(f, "policy ({policy})"),
        }
    }
}

/// A recorded decision, by a person or by policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    pub option: DecisionOption,
    pub by: Decider,
    pub at: DateTime<Utc>,
    pub reason: Option<String>,
}

/// A remark in the case's history, e.g. why it went back to Pending.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Note {
    pub at: DateTime<Utc>,
    pub text: String,
}

/// Where a case is in its life. See [`apply`] for the allowed moves.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum CaseState {
    /// Waiting for a person.
    Pending,
    /// A person chose an action; a job will run it. `attempt` starts at 1 and grows on Retry.
    Decided {
        decision: Decision,
        attempt: u32,
        steps: Vec<StepRecord>,
    },
    /// A worker is running the steps; `steps` are the ones finished so far.
    Executing {
        decision: Decision,
        attempt: u32,
        steps: Vec<StepRecord>,
    },
    /// Every step finished (or the subject was already gone).
    Done {
        decision: Decision,
        steps: Vec<StepRecord>,
        at: DateTime<Utc>,
    },
    /// A step failed; a person may Retry, which resumes after the last finished step.
    Failed {
        decision: Decision,
        attempt: u32,
        steps: Vec<StepRecord>,
        error: String,
        at: DateTime<Utc>,
    },
    /// Nobody decided by `decide_by`: nothing is done, ever.
    Expired { at: DateTime<Utc> },
    /// The subject ended outside Steward while the case waited (E2B's lifecycle event says it was
    /// killed): nothing is done, ever. `what` is the sentence the card shows.
    EndedOutside { what: String, at: DateTime<Utc> },
    /// A person (or a policy) chose Leave or Keep. `until` says when Steward may ask again.
    Left {
        option: DecisionOption,
        by: Decider,
        reason: Option<String>,
        until: Option<DateTime<Utc>>,
        at: DateTime<Utc>,
    },
}

impl CaseState {
    /// A short lowercase name for messages and errors.
    pub fn name(&self) -> &'static str {
        match self {
            CaseState::Pending => "pending",
            CaseState::Decided { .. } => "decided",
            CaseState::Executing { .. } => "executing",
            CaseState::Done { .. } => "done",
            CaseState::Failed { .. } => "failed",
            CaseState::Expired { .. } => "expired",
            CaseState::EndedOutside { .. } => "ended_outside",
            CaseState::Left { .. } => "left",
        }
    }

    /// Whether the case still claims its subject: while Pending, Decided or Executing no other
    /// case may be opened for the same sandbox or template.
    pub fn is_open(&self) -> bool {
        matches!(
            self,
            CaseState::Pending | CaseState::Decided { .. } | CaseState::Executing { .. }
        )
    }

    /// The decision, if one was made that leads to action.
    pub fn decision(&self) -> Option<&Decision> {
        match self {
            CaseState::Decided { decision, .. }
            | CaseState::Executing { decision, .. }
            | CaseState::Done { decision, .. }
            | CaseState::Failed { decision, .. } => Some(decision),
            _ => None,
        }
    }
}

/// One approval case. `version` is owned by the store: it grows by one on every write and is
/// what makes concurrent updates safe. [`apply`] never changes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Case {
    pub id: CaseId,
    pub version: u64,
    pub subject: Subject,
    pub evidence: Evidence,
    pub recommendation: Recommendation,
    pub options: Vec<DecisionOption>,
    pub opener: Opener,
    pub reason: String,
    pub decide_by: DateTime<Utc>,
    pub created_at: DateTime<Utc>,
    pub card: Option<Card>,
    pub state: CaseState,
    pub notes: Vec<Note>,
    /// For a run case: what "Keep running" extends the sandbox's E2B timeout to, in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_running_for_secs: Option<u64>,
    /// For the case of a shortening (`/sandbox timeout` by someone who may not kill): the
    /// timeout, in seconds from when the decision is carried out, that "Shorten" sets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shorten_to_secs: Option<u64>,
    /// The step of the current attempt that is waiting out a transient failure (E2B briefly
    /// unavailable), and how many times it failed so. Cleared when a step finishes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retrying: Option<Retrying>,
    /// After a Snapshot, then kill: the window in which the sandbox can be brought back from
    /// its snapshot, and what became of a request to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore: Option<Restore>,
    /// An item of a sweep's list decision: the list and group it belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub list: Option<ListRef>,
}

/// The restore window of a case whose Snapshot, then kill finished.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Restore {
    /// The snapshot a restore starts the sandbox from.
    pub snapshot: TemplateId,
    /// Restore is offered until then (`[approvals] restore_window` after the kill).
    pub until: DateTime<Utc>,
    /// The window passed (the card no longer offers it); the snapshot stays.
    #[serde(default)]
    pub closed: bool,
    /// How long the original sandbox had left to live when it was snapshotted, in seconds: a
    /// restored sandbox never gets less (`[approvals] restored_timeout` is the floor). `None`
    /// when unknown (a case restored before Steward recorded it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub life_left_secs: Option<u64>,
    /// A person asked for the sandbox back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<RestoreRequest>,
}

/// A request to restore, and how it went.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestoreRequest {
    pub by: SlackUserId,
    pub at: DateTime<Utc>,
    /// The sandbox started from the snapshot, once E2B made it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<SandboxId>,
    /// Why the last try failed; the card offers Restore again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// When E2B ends the restored sandbox (its timeout), as last set by Steward.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ends_at: Option<DateTime<Utc>>,
    /// The last person who kept the restored sandbox longer (the card's Keep longer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kept_by: Option<SlackUserId>,
}

impl Restore {
    /// The restored sandbox, once E2B started it.
    pub fn restored(&self) -> Option<&SandboxId> {
        self.request.as_ref().and_then(|q| q.sandbox.as_ref())
    }

    /// Whether the card offers Keep longer: a sandbox was restored and the window is open.
    pub fn keep_longer_offered(&self) -> bool {
        !self.closed && self.restored().is_some()
    }

    /// Whether the card offers Restore now: the window is open and no request is in flight or
    /// done (a failed one may be asked again).
    pub fn offered(&self) -> bool {
        !self.closed
            && self
                .request
                .as_ref()
                .is_none_or(|r| r.sandbox.is_none() && r.error.is_some())
    }
}

/// A step waiting for another try after transient failures; see [`Case::retrying`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Retrying {
    pub attempt: u32,
    pub step: Step,
    /// Transient failures of this step in this attempt, the last one included.
    pub failures: u32,
    pub last_error: String,
    pub at: DateTime<Utc>,
}

/// Everything needed to open a case; [`CaseDraft::into_case`] checks it.
#[derive(Debug, Clone)]
pub struct CaseDraft {
    pub subject: Subject,
    pub evidence: Evidence,
    pub recommendation: Recommendation,
    /// `None` offers [`Subject::default_options`].
    pub options: Option<Vec<DecisionOption>>,
    pub opener: Opener,
    pub reason: String,
    pub decide_by: DateTime<Utc>,
}

/// Why a draft could not become a case.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DraftError {
    #[error("{option} is not an option for a {subject}")]
    OptionDoesNotApply {
        option: DecisionOption,
        subject: &'static str,
    },
    #[error("a case must offer at least one option")]
    NoOptions,
    #[error("the recommended option ({0}) is not among the options offered")]
    RecommendationNotOffered(DecisionOption),
    #[error("the decision deadline {decide_by} is not after the opening time {now}")]
    DeadlineNotInFuture {
        decide_by: DateTime<Utc>,
        now: DateTime<Utc>,
    },
}

impl CaseDraft {
    /// Builds a Pending case with a fresh id and version 0.
    pub fn into_case(self, now: DateTime<Utc>) -> Result<Case, DraftError> {
        let options = self
            .options
            .unwrap_or_else(|| self.subject.default_options());
        let kind = match self.subject {
            Subject::Sandbox(_) => "sandbox",
            Subject::Template(_) => "template",
        };
        if let Some(bad) = options.iter().find(|o| !o.applies_to(&self.subject)) {
            return Err(DraftError::OptionDoesNotApply {
                option: *bad,
                subject: kind,
            });
        }
        if options.is_empty() {
            return Err(DraftError::NoOptions);
        }
        if !options.contains(&self.recommendation.option) {
            return Err(DraftError::RecommendationNotOffered(
                self.recommendation.option,
            ));
        }
        if self.decide_by <= now {
            return Err(DraftError::DeadlineNotInFuture {
                decide_by: self.decide_by,
                now,
            });
        }
        let mut evidence = self.evidence;
        if evidence.owner.is_none() {
            evidence.owner = Evidence::owner_from_metadata(&evidence.metadata);
        }
        Ok(Case {
            id: CaseId::generate(),
            version: 0,
            subject: self.subject,
            evidence,
            recommendation: self.recommendation,
            options,
            opener: self.opener,
            reason: self.reason,
            decide_by: self.decide_by,
            created_at: now,
            card: None,
            state: CaseState::Pending,
            notes: Vec::new(),
            keep_running_for_secs: None,
            shorten_to_secs: None,
            retrying: None,
            restore: None,
            list: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sandbox() -> Subject {
        Subject::Sandbox(SandboxId::parse("sbx1").unwrap())
    }

    fn draft(subject: Subject, recommend: DecisionOption) -> CaseDraft {
        CaseDraft {
            subject,
            evidence: Evidence::default(),
            recommendation: Recommendation {
                option: recommend,
                reason: "idle".into(),
            },
            options: None,
            opener: Opener::Sweep,
            reason: "idle for 3 days".into(),
            decide_by: DateTime::from_timestamp(2_000, 0).unwrap(),
        }
    }

    #[test]
    fn a_draft_becomes_a_pending_case_with_the_subjects_options() {
        let case = draft(sandbox(), DecisionOption::Kill)
            .into_case(DateTime::from_timestamp(1_000, 0).unwrap())
            .unwrap();
        assert_eq!(case.state, CaseState::Pending);
        assert_eq!(case.version, 0);
        assert_eq!(case.options, sandbox().default_options());
    }

    #[test]
    fn a_draft_offering_a_template_option_for_a_sandbox_is_refused() {
        let mut d = draft(sandbox(), DecisionOption::Kill);
        d.options = Some(vec![DecisionOption::Kill, DecisionOption::DeleteTemplate]);
        let err = d
            .into_case(DateTime::from_timestamp(1_000, 0).unwrap())
            .unwrap_err();
        assert!(matches!(err, DraftError::OptionDoesNotApply { .. }));
    }

    #[test]
    fn a_draft_recommending_an_option_it_does_not_offer_is_refused() {
        let mut d = draft(sandbox(), DecisionOption::Kill);
        d.options = Some(vec![DecisionOption::Pause, DecisionOption::Leave]);
        let err = d
            .into_case(DateTime::from_timestamp(1_000, 0).unwrap())
            .unwrap_err();
        assert_eq!(
            err,
            DraftError::RecommendationNotOffered(DecisionOption::Kill)
        );
    }

    #[test]
    fn a_draft_whose_deadline_has_passed_is_refused() {
        let err = draft(sandbox(), DecisionOption::Kill)
            .into_case(DateTime::from_timestamp(3_000, 0).unwrap())
            .unwrap_err();
        assert!(matches!(err, DraftError::DeadlineNotInFuture { .. }));
    }

    #[test]
    fn the_owner_comes_from_the_most_specific_metadata_key() {
        let mut md = BTreeMap::new();
        md.insert("user".to_owned(), "bob".to_owned());
        assert_eq!(Evidence::owner_from_metadata(&md).as_deref(), Some("bob"));
        md.insert("steward.owner".to_owned(), "U42".to_owned());
        assert_eq!(Evidence::owner_from_metadata(&md).as_deref(), Some("U42"));
        md.insert("steward.owner".to_owned(), "  ".to_owned());
        md.remove("user");
        assert_eq!(Evidence::owner_from_metadata(&md), None);
    }

    #[test]
    fn evidence_is_stale_when_the_sandbox_became_active_but_not_when_metrics_moved() {
        let t = DateTime::from_timestamp(1_000, 0).unwrap();
        let before = Evidence {
            state: Some("running".into()),
            idle_since: Some(t),
            metrics: Some(Metrics {
                cpu_pct: 1.0,
                mem_used: 1,
                mem_total: 2,
                disk_used: 1,
                disk_total: 2,
            }),
            ..Evidence::default()
        };
        let mut metrics_moved = before.clone();
        metrics_moved.metrics.as_mut().unwrap().cpu_pct = 3.0;
        assert_eq!(before.staleness(&metrics_moved), None);
        let mut active = before.clone();
        active.idle_since = None;
        assert_eq!(
            before.staleness(&active).as_deref(),
            Some("it is active again")
        );
        let mut paused = before.clone();
        paused.state = Some("paused".into());
        assert!(
            before
                .staleness(&paused)
                .unwrap()
                .contains("from running to paused")
        );
    }

    #[test]
    fn subjects_round_trip_through_their_keys() {
        for subject in [
            sandbox(),
            Subject::Template(TemplateId::parse("team/snap:1").unwrap()),
        ] {
            assert_eq!(Subject::from_key(&subject.key()), Some(subject));
        }
        assert_eq!(Subject::from_key("run:abc"), None);
        assert_eq!(Subject::from_key("sandbox"), None);
    }

    #[test]
    fn options_round_trip_through_their_names() {
        for option in DecisionOption::ALL {
            assert_eq!(DecisionOption::parse(option.as_str()), Some(option));
            let json = serde_json::to_string(&option).unwrap();
            assert_eq!(json, format!("\"{}\"", option.as_str()));
        }
        assert_eq!(DecisionOption::parse("nuke"), None);
    }

    #[test]
    fn cases_round_trip_through_json() {
        let case = draft(sandbox(), DecisionOption::Kill)
            .into_case(DateTime::from_timestamp(1_000, 0).unwrap())
            .unwrap();
        let json = serde_json::to_string(&case).unwrap();
        let back: Case = serde_json::from_str(&json).unwrap();
        assert_eq!(back, case);
    }
}
