//! A case as Slack sees it: the card's params (built from a [`Case`]), the reason modal and the
//! history timeline, each rendered by a template in `templates/`.
//!
//! Button `action_id`s come from `slack::payload`, the same constants the click parser reads.
//! This file must not call Slack, E2B or the store: it turns values into messages.
use serde::Serialize;

use super::run_card::{self, RunCardParams};
use crate::cases::{Case, CaseState, Decider, DecisionOption, Opener, StepOutcome, Subject};
use crate::slack::format::{self, human_bytes, when};
use crate::slack::payload::{
    CASE_KEEP_LONGER, CASE_REASON_ACTION, CASE_REASON_BLOCK, CASE_REASON_MODAL, CASE_RESTORE,
    CASE_RETRY, CASE_UNTIL_ACTION, CASE_UNTIL_BLOCK, ModalMetadata, case_option_action_id,
};
use crate::slack::render::{Field, MessageParams, Mrkdwn, RenderError, SAMPLE_TEXT, Templates};
use crate::store::{Actor, AuditEvent};

/// A confirm dialog on a button.
#[derive(Debug, Clone, Serialize)]
pub struct ConfirmParams {
    pub title: String,
    pub text: String,
    pub confirm: String,
    pub deny: String,
}

/// One button on a card.
#[derive(Debug, Clone, Serialize)]
pub struct ButtonParams {
    pub action_id: String,
    pub text: String,
    pub value: String,
    pub style: Option<&'static str>,
    pub confirm: Option<ConfirmParams>,
}

/// Where a case stands, as the card shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CardStatus {
    Pending,
    Running,
    Done,
    Gone,
    Failed,
    Expired,
    Left,
    /// The subject ended outside Steward while the case waited.
    Outside,
}

/// `case_card.json.j2`.
#[derive(Debug, Clone, Serialize)]
pub struct CaseCardParams {
    pub case_id: String,
    /// `Sandbox` or `Template`.
    pub subject_kind: &'static str,
    pub subject_id: String,
    /// The header: the question while pending (`Sandbox x: kill it?`), the end state after
    /// (`Sandbox x killed after snapshot …`). Plain text.
    pub headline: String,
    /// Who asked: a mention, the sweep, or `Agent <name>`.
    pub opener: Mrkdwn,
    /// What they ask, after their name: `asks`, or for an agent `asks to kill this sandbox`.
    pub asks: String,
    /// Why: a person's or an agent's words as quoted data, the sweep's as Steward's own.
    pub reason: Mrkdwn,
    pub evidence: Vec<Field>,
    pub recommendation: String,
    pub recommendation_reason: String,
    pub notes: Vec<String>,
    pub status: CardStatus,
    /// A mention of whoever decided.
    pub actor: Option<Mrkdwn>,
    /// Set instead of the usual "X chose Y" line when a policy decided: the whole status line.
    pub policy_line: Option<String>,
    /// What happens if nobody decides by the deadline, when it is not "nothing": a run case's
    /// sandbox is left to its E2B timeout.
    pub unanswered: Option<String>,
    /// The run section of a run case's card.
    pub run: Option<RunCardParams>,
    pub option: Option<String>,
    /// The reason typed with the decision, as quoted data (a policy's as Steward's words).
    pub decision_reason: Option<Mrkdwn>,
    pub error: Option<String>,
    pub until: Option<String>,
    pub at: Option<String>,
    pub decide_by: String,
    pub results: Vec<String>,
    pub snapshot_id: Option<String>,
    /// After a Snapshot, then kill: where its restore stands (offered until when, asked by
    /// whom, the sandbox it became, why it failed, or the window closed).
    pub restore_line: Option<Mrkdwn>,
    pub buttons: Vec<ButtonParams>,
    /// Changes with every version so Slack never mixes old and new button sets.
    pub block_id: String,
}

impl MessageParams for CaseCardParams {
    const TEMPLATE: &'static str = "case_card.json.j2";
}

fn subject_parts(subject: &Subject) -> (&'static str, String) {
    match subject {
        Subject::Sandbox(id) => ("Sandbox", id.to_string()),
        Subject::Template(id) => ("Template", id.to_string()),
    }
}

/// The metadata a run puts on its sandbox, which a run case's run section already says.
const RUN_METADATA_KEYS: [&str; 3] = ["steward.run", "steward.requester", "steward.purpose"];

/// Most characters of one piece of foreign text in an evidence field (an owner, an alias).
const FIELD_QUOTE_MAX_CHARS: usize = 120;
/// Most characters of all the metadata shown, quoted pair by pair.
const METADATA_MAX_CHARS: usize = 400;

/// The sandbox's metadata as quoted `key=value` pairs, within [`METADATA_MAX_CHARS`]; the pairs
/// that do not fit are counted instead.
fn metadata_value(pairs: &[(&String, &String)]) -> Mrkdwn {
    let mut value = Mrkdwn::default();
    let mut shown = 0;
    let mut used = 0;
    for (k, v) in pairs {
        let pair = Mrkdwn::quoted(&format!("{k}={v}"), FIELD_QUOTE_MAX_CHARS);
        let len = pair.as_str().chars().count() + 2;
        if used + len > METADATA_MAX_CHARS {
            break;
        }
        if shown > 0 {
            value = value.and(Mrkdwn::markup(", "));
        }
        value = value.and(pair);
        used += len;
        shown += 1;
    }
    let left = pairs.len() - shown;
    if left > 0 {
        value = value.and(Mrkdwn::text(&format!(
            "{}and {left} more",
            if shown == 0 { "" } else { " " }
        )));
    }
    value
}

/// The evidence as card fields (at most ten: Slack's limit on section fields). Steward's own
/// figures are text; what E2B and the sandbox's creator named (the template's alias, the owner,
/// the metadata) is quoted data.
fn evidence_fields(case: &Case) -> Vec<Field> {
    let e = &case.evidence;
    let mib = |mb: u64| human_bytes(mb * 1024 * 1024);
    let mut out = Vec::new();
    let mut push = |key: &str, value: Mrkdwn| {
        out.push(Field {
            key: key.to_owned(),
            value,
        })
    };
    if let Some(state) = &e.state {
        push(
            "State",
            Mrkdwn::text(&format::cut(state, FIELD_QUOTE_MAX_CHARS)),
        );
    }
    // People know a template by its alias; the id is only shown when there is none. A run
    // case's run section already names it.
    match (&e.template_alias, &e.template) {
        _ if e.run.is_some() => {}
        (Some(alias), _) => push("Template", Mrkdwn::quoted(alias, FIELD_QUOTE_MAX_CHARS)),
        (None, Some(t)) => push(
            "Template",
            Mrkdwn::quoted(t.as_str(), FIELD_QUOTE_MAX_CHARS),
        ),
        (None, None) => {}
    }
    let mut size = Vec::new();
    if let Some(cpu) = e.cpu_count {
        size.push(format!("{cpu} vCPU"));
    }
    if let Some(mem) = e.memory_mb {
        size.push(mib(mem));
    }
    if let Some(disk) = e.disk_mb {
        size.push(format!("{} disk", mib(disk)));
    }
    if !size.is_empty() {
        push("Resources", Mrkdwn::text(&size.join(" · ")));
    }
    if let Some(t) = e.started_at {
        push("Started", Mrkdwn::text(&when(t)));
    }
    if let Some(t) = e.idle_since {
        push("Idle since", Mrkdwn::text(&when(t)));
    }
    if let Some(t) = e.paused_since {
        push("Paused since", Mrkdwn::text(&when(t)));
    }
    if !e.lifecycle.is_empty() {
        push(
            "Lifecycle (E2B)",
            Mrkdwn::text(&lifecycle_line(&e.lifecycle)),
        );
    }
    if let Some(m) = &e.metrics {
        push(
            "Latest sample",
            Mrkdwn::text(&format!(
                "CPU {} · memory {} of {} · disk {} of {}",
                format::percent(m.cpu_pct),
                human_bytes(m.mem_used),
                human_bytes(m.mem_total),
                human_bytes(m.disk_used),
                human_bytes(m.disk_total)
            )),
        );
    }
    if let Some(owner) = &e.owner {
        push("Owner", Mrkdwn::quoted(owner, FIELD_QUOTE_MAX_CHARS));
    }
    if let Some(usage) = &e.template_usage {
        push(
            "Used by",
            Mrkdwn::text(&usage_words(usage).replace(" and ", " · ")),
        );
    }
    // The owner's entry is already the `Owner` field; the rest of the metadata follows.
    // So are a run's own marks on its sandbox, for a run case.
    let metadata: Vec<(&String, &String)> = e
        .metadata
        .iter()
        .filter(|(_, v)| e.owner.as_deref() != Some(v.trim()))
        .filter(|(k, _)| e.run.is_none() || !RUN_METADATA_KEYS.contains(&k.as_str()))
        .collect();
    if !metadata.is_empty() {
        push("Metadata", metadata_value(&metadata));
    }
    if out.is_empty() {
        out.push(Field {
            key: "Evidence".into(),
            value: Mrkdwn::text("none recorded"),
        });
    }
    out.truncate(10);
    out
}

/// Lifecycle entries a card shows (the newest).
const LIFECYCLE_SHOWN: usize = 5;

/// `created 12-07 02:00 · paused 12-07 18:00 · resumed 12-08 09:12 UTC`: the newest few of E2B's
/// lifecycle events, in the order they happened.
fn lifecycle_line(entries: &[crate::cases::LifecycleEntry]) -> String {
    let skip = entries.len().saturating_sub(LIFECYCLE_SHOWN);
    let mut line = entries[skip..]
        .iter()
        .map(|e| format!("{} {}", e.what, e.at.format("%m-%d %H:%M")))
        .collect::<Vec<_>>()
        .join(" · ");
    line.push_str(" UTC");
    if skip > 0 {
        line = format!("… {line}");
    }
    line
}

/// `2 sandboxes and 1 snapshot`.
fn usage_words(usage: &crate::cases::TemplateUsage) -> String {
    let sandboxes = usage.sandboxes.len();
    format!(
        "{sandboxes} sandbox{} and {} snapshot{}",
        if sandboxes == 1 { "" } else { "es" },
        usage.snapshots,
        if usage.snapshots == 1 { "" } else { "s" }
    )
}

/// The button of one option on a pending card.
fn option_button(case: &Case, option: DecisionOption) -> ButtonParams {
    let (kind, id) = subject_parts(&case.subject);
    // The highlighted button is the one Steward recommends; the destructive ones stay red
    // whatever is recommended, so a kill never looks like the safe choice.
    let style = match option {
        DecisionOption::Kill | DecisionOption::DeleteTemplate | DecisionOption::Shorten => {
            Some("danger")
        }
        _ if option == case.recommendation.option => Some("primary"),
        _ => None,
    };
    let confirm = match option {
        // A push-test alert's Snapshot for repro asks nothing: the run's own sandbox.
        DecisionOption::SnapshotThenKill if case.evidence.push.is_none() => Some(ConfirmParams {
            title: "Snapshot, then kill?".into(),
            text: format!(
                "{kind} `{id}` is snapshotted, then killed. Its card offers Restore from the snapshot for a while."
            ),
            confirm: "Snapshot and kill".into(),
            deny: "Cancel".into(),
        }),
        DecisionOption::Kill => Some(ConfirmParams {
            title: "Kill without a snapshot?".into(),
            text: format!(
                "{kind} `{id}` will be killed and its state is lost for good. Steward will ask for a reason."
            ),
            confirm: "Kill it".into(),
            deny: "Cancel".into(),
        }),
        DecisionOption::Shorten => Some(ConfirmParams {
            title: "Shorten its life?".into(),
            text: format!(
                "E2B will kill {kind} `{id}` when its shortened timeout runs out, and its state is lost unless someone extends it first."
            ),
            confirm: "Shorten it".into(),
            deny: "Cancel".into(),
        }),
        DecisionOption::DeleteTemplate => {
            let usage = case.evidence.template_usage.clone().unwrap_or_default();
            Some(ConfirmParams {
                title: "Delete this template?".into(),
                text: format!(
                    "Template `{id}` is used by {}. Deleting it cannot be undone.",
                    usage_words(&usage)
                ),
                confirm: "Delete it".into(),
                deny: "Cancel".into(),
            })
        }
        _ => None,
    };
    ButtonParams {
        action_id: case_option_action_id(option),
        text: option_label(case, option),
        value: case.id.to_string(),
        style,
        confirm,
    }
}

/// A button's words: the option's name, with the time for Keep running. A push-test alert
/// names its options for what an engineer wants from a failing test's sandbox.
pub fn option_label(case: &Case, option: DecisionOption) -> String {
    if case.evidence.push.is_some() {
        match option {
            DecisionOption::KeepRunning => return "Keep for debugging".to_owned(),
            DecisionOption::SnapshotThenKill => return "Snapshot for repro".to_owned(),
            _ => {}
        }
    }
    match (option, case.keep_running_for_secs, case.shorten_to_secs) {
        (DecisionOption::KeepRunning, Some(secs), _) => format!(
            "Keep running for {}",
            format::human_duration(std::time::Duration::from_secs(secs))
        ),
        (DecisionOption::Shorten, _, Some(secs)) => format!(
            "Shorten to {}",
            format::human_duration(std::time::Duration::from_secs(secs))
        ),
        _ => option.to_string(),
    }
}

/// Who decided, as the card and replies name them: a mention, or the policy.
pub fn decider(by: &Decider) -> Mrkdwn {
    match by {
        Decider::Person(user) => Mrkdwn::user(user),
        Decider::Policy { policy } => Mrkdwn::text(&format!("policy ({policy})")),
    }
}

/// The options as buttons, the recommended one first and the rest in the case's order.
fn option_buttons(case: &Case) -> Vec<ButtonParams> {
    let recommended = case.recommendation.option;
    let mut options: Vec<DecisionOption> = case.options.clone();
    options.sort_by_key(|o| *o != recommended);
    options.iter().map(|o| option_button(case, *o)).collect()
}

fn question(case: &Case) -> &'static str {
    match case.recommendation.option {
        DecisionOption::SnapshotThenKill | DecisionOption::Kill => "kill it?",
        DecisionOption::Pause => "pause it?",
        DecisionOption::DeleteTemplate => "delete it?",
        DecisionOption::SnapshotAndKeep => "snapshot and keep it?",
        DecisionOption::KeepRunning => "keep it running?",
        DecisionOption::Shorten => "shorten its life?",
        DecisionOption::Leave | DecisionOption::Keep => "what now?",
    }
}

/// Slack refuses a header longer than this.
const HEADER_MAX_CHARS: usize = 150;

/// The header: what is asked while the case is open, what became of the subject once it is not.
fn headline(case: &Case, snapshot: Option<&str>) -> String {
    let (kind, id) = subject_parts(&case.subject);
    let subject = format!("{kind} {id}");
    let text = match &case.state {
        CaseState::Pending => match &case.evidence.run {
            Some(run) => format!(
                "{} in {} {id}: what now?",
                run_card::ended(run),
                kind.to_lowercase()
            ),
            None => match (case.recommendation.option, case.shorten_to_secs) {
                (DecisionOption::Shorten, Some(secs)) => format!(
                    "{subject}: shorten to {}?",
                    format::human_duration(std::time::Duration::from_secs(secs))
                ),
                _ => format!("{subject}: {}", question(case)),
            },
        },
        CaseState::Decided { decision, .. } | CaseState::Executing { decision, .. } => {
            format!("{subject}: {} under way", decision.option)
        }
        CaseState::Done {
            decision, steps, ..
        } => {
            let happened = |o: StepOutcome| steps.iter().any(|r| r.outcome == o);
            if happened(StepOutcome::AlreadyGone) {
                format!("{subject} was already gone")
            } else if happened(StepOutcome::AlreadyPaused) {
                format!("{subject} was already paused")
            } else {
                match (decision.option, snapshot) {
                    // The snapshot's id (up to ~70 characters) is named once, in the line that
                    // says how to start from it; in a header it would wrap over several lines.
                    (DecisionOption::SnapshotThenKill, Some(_)) => {
                        format!("{subject} killed, snapshot kept")
                    }
                    (DecisionOption::SnapshotThenKill | DecisionOption::Kill, _) => {
                        format!("{subject} killed")
                    }
                    (DecisionOption::Pause, _) => format!("{subject} paused"),
                    (DecisionOption::DeleteTemplate, _) => format!("{subject} deleted"),
                    (DecisionOption::Leave, _) => format!("{subject} left as it is"),
                    (DecisionOption::Keep, _) => format!("{subject} kept"),
                    (DecisionOption::SnapshotAndKeep, Some(_)) => {
                        format!("{subject} paused, snapshot kept")
                    }
                    (DecisionOption::SnapshotAndKeep, None) => format!("{subject} paused"),
                    (DecisionOption::KeepRunning, _) => format!("{subject} kept running"),
                    (DecisionOption::Shorten, _) => format!("{subject}'s life shortened"),
                }
            }
        }
        CaseState::Failed { decision, .. } => format!("{subject}: {} failed", decision.option),
        CaseState::Expired { .. } if case.evidence.run.is_some() => {
            format!("{subject}: no decision, left to its E2B timeout")
        }
        CaseState::Expired { .. } => format!("{subject}: no decision, nothing done"),
        CaseState::EndedOutside { .. } => format!("{subject} ended outside Steward"),
        CaseState::Left {
            by: Decider::Policy { .. },
            ..
        } if case.evidence.run.is_some() => format!("{subject} left to its E2B timeout"),
        CaseState::Left { option, .. } => match option {
            DecisionOption::Keep => format!("{subject} kept"),
            _ => format!("{subject} left as it is"),
        },
    };
    format::cut(&text, HEADER_MAX_CHARS)
}

/// The status line of a case a policy decided (`Killed by policy ([runs] on_finish = …)`), or
/// `None` when a person decided or nobody has yet.
fn policy_line(case: &Case) -> Option<String> {
    let (option, policy) = match &case.state {
        CaseState::Left {
            by: Decider::Policy { policy },
            option,
            ..
        } => (*option, policy),
        state => match state.decision()? {
            crate::cases::Decision {
                by: Decider::Policy { policy },
                option,
                ..
            } => (*option, policy),
            _ => return None,
        },
    };
    let done = match option {
        DecisionOption::SnapshotThenKill | DecisionOption::Kill => "Killed",
        DecisionOption::Pause | DecisionOption::SnapshotAndKeep => "Paused",
        DecisionOption::DeleteTemplate => "Deleted",
        DecisionOption::KeepRunning => "Kept running",
        DecisionOption::Shorten => "Shortened",
        DecisionOption::Leave | DecisionOption::Keep => "Left to its E2B timeout",
    };
    Some(match &case.state {
        CaseState::Decided { .. } | CaseState::Executing { .. } => {
            format!(":gear: {option} by policy ({policy}); Steward is doing it now.")
        }
        CaseState::Done { steps, at, .. } => {
            if steps.iter().any(|r| r.outcome == StepOutcome::AlreadyGone) {
                format!(
                    ":ghost: {option} by policy ({policy}), but it was already gone: nothing was done."
                )
            } else {
                format!(
                    ":white_check_mark: {done} by policy ({policy}). Done {}.",
                    when(*at)
                )
            }
        }
        CaseState::Failed { error, .. } => {
            format!(":x: {option} by policy ({policy}) failed: {error}")
        }
        _ => format!(":leaves: {done} by policy ({policy})."),
    })
}

/// What the `State` field says once the case is no longer open: the end state when Steward
/// changed it, else the state it had when people were asked (it may have changed since).
fn state_after(case: &Case, asked: &str) -> Option<String> {
    match &case.state {
        CaseState::Pending => None,
        CaseState::Done {
            decision, steps, ..
        } => {
            let end = steps.iter().rev().find_map(|r| match r.outcome {
                StepOutcome::Killed => Some("killed"),
                StepOutcome::Paused | StepOutcome::AlreadyPaused => Some("paused"),
                StepOutcome::TemplateDeleted => Some("deleted"),
                StepOutcome::AlreadyGone => Some("gone"),
                StepOutcome::KeptRunning { .. } | StepOutcome::Shortened { .. } => Some("running"),
                _ => None,
            });
            Some(match end {
                Some(end) => end.to_owned(),
                None if decision.option.is_leave() => format!("{asked} (left as it was)"),
                None => format!("{asked} when asked"),
            })
        }
        _ => Some(format!("{asked} when asked")),
    }
}

/// What the finished steps produced, one line each.
fn result_lines(steps: &[crate::cases::StepRecord]) -> (Vec<String>, Option<String>) {
    let mut lines = Vec::new();
    let mut snapshot = None;
    for record in steps {
        let line = match &record.outcome {
            // The id is named once, by the card's line on how to start from the snapshot.
            StepOutcome::SnapshotCreated { snapshot_id, .. } => {
                snapshot = Some(snapshot_id.to_string());
                "Snapshot taken.".to_owned()
            }
            StepOutcome::SnapshotVerified { .. } => {
                "Snapshot confirmed in E2B's snapshot list.".to_owned()
            }
            StepOutcome::Killed => "Killed.".into(),
            StepOutcome::Paused => "Paused.".into(),
            StepOutcome::AlreadyPaused => "It was already paused.".into(),
            StepOutcome::TemplateDeleted => "Template deleted.".into(),
            StepOutcome::AlreadyGone => "It was already gone.".into(),
            StepOutcome::KeptRunning {
                until,
                extended: true,
            } => format!("E2B timeout extended: it runs until {}.", when(*until)),
            StepOutcome::KeptRunning {
                until,
                extended: false,
            } => format!(
                "Its E2B timeout already ran until {}, later than asked, so it was left as it was.",
                when(*until)
            ),
            StepOutcome::Shortened {
                until,
                shortened: true,
            } => format!("E2B timeout shortened: E2B ends it at {}.", when(*until)),
            StepOutcome::Shortened {
                until,
                shortened: false,
            } => format!(
                "Its E2B timeout already ended at {}, sooner than asked, so it was left as it was.",
                when(*until)
            ),
        };
        lines.push(format!("{} · {line}", when(record.at)));
    }
    (lines, snapshot)
}

/// How much of each piece of user text (reasons, errors, notes) a card shows. Cut before
/// rendering so no text object passes Slack's 3,000 characters even with the words around it,
/// and the whole card stays far below Slack's message size.
const CARD_REASON_MAX_CHARS: usize = 1500;
const CARD_TEXT_MAX_CHARS: usize = 900;
/// Most notes a card shows (the latest); each is a block, and a message has at most 50.
const CARD_MAX_NOTES: usize = 8;

/// The card for `case` as it stands now.
pub fn card_params(case: &Case) -> CaseCardParams {
    let mut params = uncut_card_params(case);
    let cut = |t: &str| format::cut(t, CARD_TEXT_MAX_CHARS);
    // The reasons and the evidence were cut when they were quoted.
    params.recommendation_reason = cut(&params.recommendation_reason);
    let skip = params.notes.len().saturating_sub(CARD_MAX_NOTES);
    params.notes = params.notes[skip..].iter().map(|n| cut(n)).collect();
    params.error = params.error.as_deref().map(cut);
    params.results = params.results.iter().map(|r| cut(r)).collect();
    params
}

/// What `request` records when a person gives no reason: Steward's words, not theirs.
pub const NO_REASON: &str = "no reason given";

/// Why the case was opened, as the card shows it: a person's or an agent's words as quoted data
/// on one line (they may hold newlines and markup meant to look like card lines), the sweep's
/// (and Steward's own "no reason given") as Steward's text.
fn reason_shown(case: &Case) -> Mrkdwn {
    match &case.opener {
        Opener::Sweep | Opener::Watch { .. } => {
            Mrkdwn::text(&format::cut(&case.reason, CARD_REASON_MAX_CHARS))
        }
        _ if case.reason == NO_REASON => Mrkdwn::text(NO_REASON),
        Opener::Person { .. } | Opener::Agent { .. } => {
            Mrkdwn::quoted(&case.reason, CARD_REASON_MAX_CHARS)
        }
    }
}

/// The reason given with a decision: a person's words as quoted data, a policy's as Steward's.
fn decision_reason(by: &Decider, reason: Option<&str>) -> Option<Mrkdwn> {
    let reason = reason?;
    Some(match by {
        Decider::Person(_) => Mrkdwn::quoted(reason, CARD_TEXT_MAX_CHARS),
        Decider::Policy { .. } => Mrkdwn::text(&format::cut(reason, CARD_TEXT_MAX_CHARS)),
    })
}

fn uncut_card_params(case: &Case) -> CaseCardParams {
    let (subject_kind, subject_id) = subject_parts(&case.subject);
    let opener = match &case.opener {
        Opener::Person { user } => Mrkdwn::user(user),
        Opener::Sweep => Mrkdwn::text("The hygiene sweep"),
        Opener::Agent { name } => Mrkdwn::text(&format!("Agent {name}")),
        Opener::Watch { rule } => Mrkdwn::text(&format!("Watch rule {rule}")),
    };
    // An agent is nobody people know by sight: its card says plainly what it asks for.
    let asks = match (&case.opener, &case.subject) {
        (Opener::Agent { .. }, Subject::Sandbox(_)) => "asks to kill this sandbox",
        (Opener::Agent { .. }, Subject::Template(_)) => "asks to delete this template",
        _ => "asks",
    };
    let run = case
        .evidence
        .run
        .as_ref()
        .map(|r| run_card::run_params(case, r));
    let mut params = CaseCardParams {
        case_id: case.id.to_string(),
        subject_kind,
        subject_id,
        headline: String::new(),
        opener,
        asks: asks.to_owned(),
        reason: reason_shown(case),
        evidence: evidence_fields(case),
        recommendation: option_label(case, case.recommendation.option),
        recommendation_reason: case.recommendation.reason.clone(),
        notes: case.notes.iter().map(|n| n.text.clone()).collect(),
        status: CardStatus::Pending,
        actor: None,
        policy_line: None,
        unanswered: run
            .is_some()
            .then(|| "the sandbox is left to its E2B timeout".to_owned()),
        run,
        option: None,
        decision_reason: None,
        error: None,
        until: None,
        at: None,
        decide_by: when(case.decide_by),
        results: Vec::new(),
        snapshot_id: None,
        restore_line: None,
        buttons: Vec::new(),
        block_id: format!("case:{}:{}", case.id, case.version),
    };
    if let Some(d) = case.state.decision() {
        params.actor = Some(decider(&d.by));
        params.option = Some(option_label(case, d.option));
        params.decision_reason = decision_reason(&d.by, d.reason.as_deref());
    }
    params.policy_line = policy_line(case);
    match &case.state {
        CaseState::Pending => {
            params.buttons = option_buttons(case);
        }
        CaseState::Decided { steps, .. } | CaseState::Executing { steps, .. } => {
            params.status = CardStatus::Running;
            (params.results, params.snapshot_id) = result_lines(steps);
        }
        CaseState::Done { steps, at, .. } => {
            let gone = steps.iter().any(|r| r.outcome == StepOutcome::AlreadyGone);
            params.status = if gone {
                CardStatus::Gone
            } else {
                CardStatus::Done
            };
            params.at = Some(when(*at));
            (params.results, params.snapshot_id) = result_lines(steps);
            if let Some(restore) = &case.restore {
                let named = params.snapshot_id.as_deref() == Some(restore.snapshot.as_str());
                (params.restore_line, params.buttons) = restore_parts(case, restore, named);
            }
        }
        CaseState::Failed { steps, error, .. } => {
            params.status = CardStatus::Failed;
            params.error = Some(error.clone());
            (params.results, params.snapshot_id) = result_lines(steps);
            params.buttons = vec![ButtonParams {
                action_id: CASE_RETRY.to_owned(),
                text: "Retry".into(),
                value: case.id.to_string(),
                style: Some("primary"),
                confirm: None,
            }];
        }
        CaseState::Expired { .. } => {
            params.status = CardStatus::Expired;
        }
        CaseState::EndedOutside { what, at } => {
            params.status = CardStatus::Outside;
            params.error = Some(what.clone());
            params.at = Some(when(*at));
        }
        CaseState::Left {
            option,
            by,
            reason,
            until,
            at,
        } => {
            params.status = CardStatus::Left;
            params.actor = Some(decider(by));
            params.option = Some(option_label(case, *option));
            params.decision_reason = decision_reason(by, reason.as_deref());
            params.until = until.map(when);
            params.at = Some(when(*at));
        }
    }
    params.headline = headline(case, params.snapshot_id.as_deref());
    if let Some(field) = params.evidence.iter_mut().find(|f| f.key == "State")
        && let Some(asked) = &case.evidence.state
        && let Some(after) = state_after(case, asked)
    {
        field.value = Mrkdwn::text(&after);
    }
    if case.state != CaseState::Pending
        && let Some(field) = params.evidence.iter_mut().find(|f| f.key == "Used by")
    {
        field.value = std::mem::take(&mut field.value).and(Mrkdwn::text(" when asked"));
    }
    params
}

/// The restore line of a card, and its Restore button while one is offered.
/// `named`: the card already names the snapshot (its "start a sandbox from it" line), so this
/// line says "the snapshot" instead of a long id again.
fn restore_parts(
    case: &Case,
    restore: &crate::cases::Restore,
    named: bool,
) -> (Option<Mrkdwn>, Vec<ButtonParams>) {
    let snapshot = if named {
        "the snapshot".to_owned()
    } else {
        format!("snapshot `{}`", restore.snapshot)
    };
    let line = match &restore.request {
        Some(q) if q.sandbox.is_some() => Mrkdwn::markup(":recycle: ")
            .and(Mrkdwn::user(&q.by))
            .and(format!(
                " restored it from {snapshot} as sandbox `{}` ({})",
                q.sandbox
                    .as_ref()
                    .map(|s| s.to_string())
                    .unwrap_or_default(),
                when(q.at)
            ))
            .and(restored_end(q)),
        Some(q) if q.error.is_none() => {
            Mrkdwn::markup(":gear: ")
                .and(Mrkdwn::user(&q.by))
                .and(format!(
                    " asked for it back; Steward is starting it from {snapshot}."
                ))
        }
        Some(q) if !restore.closed => Mrkdwn::text(&format!(
            "Restoring from {snapshot} failed: {}. Restore may be tried again until {}.",
            q.error.as_deref().unwrap_or("no reason recorded"),
            when(restore.until)
        )),
        _ if restore.closed => Mrkdwn::text(&format!(
            "The restore window closed {}; {snapshot} stays until someone deletes it.",
            when(restore.until)
        )),
        _ => Mrkdwn::text(&format!(
            "Restore starts it again from {snapshot}, with its metadata, until {}.",
            when(restore.until)
        )),
    };
    let buttons = if restore.offered() {
        vec![ButtonParams {
            action_id: CASE_RESTORE.to_owned(),
            text: "Restore".into(),
            value: case.id.to_string(),
            style: None,
            confirm: None,
        }]
    } else if restore.keep_longer_offered() {
        vec![ButtonParams {
            action_id: CASE_KEEP_LONGER.to_owned(),
            text: "Keep longer".into(),
            value: case.id.to_string(),
            style: None,
            confirm: None,
        }]
    } else {
        Vec::new()
    };
    (Some(line), buttons)
}

/// The end of the restore line of a restored sandbox: when E2B ends it, and how long that
/// was from the restore (or who kept it longer), so whoever needs it knows how long they have.
fn restored_end(q: &crate::cases::RestoreRequest) -> Mrkdwn {
    let Some(ends_at) = q.ends_at else {
        return Mrkdwn::text(".");
    };
    let text = Mrkdwn::text(&format!("; it runs until {}", when(ends_at)));
    match &q.kept_by {
        Some(by) => text
            .and(" (kept longer by ")
            .and(Mrkdwn::user(by))
            .and(")."),
        None => {
            // Rounded to the minute: the sandbox starts a few seconds after the request.
            let secs = (ends_at - q.at).num_seconds().max(0).unsigned_abs();
            let life = std::time::Duration::from_secs((secs + 30) / 60 * 60);
            text.and(format!(" ({}).", format::human_duration(life)))
        }
    }
}

/// `case_modal.json.j2`: asks for a reason (and for Leave, an optional until-date).
#[derive(Debug, Clone, Serialize)]
pub struct ReasonModalParams {
    pub callback_id: &'static str,
    pub metadata: String,
    pub title: String,
    pub submit: String,
    pub prompt: String,
    pub ask_until: bool,
    pub reason_block: &'static str,
    pub reason_action: &'static str,
    pub until_block: &'static str,
    pub until_action: &'static str,
}

impl MessageParams for ReasonModalParams {
    const TEMPLATE: &'static str = "case_modal.json.j2";
}

/// The modal for choosing `option` on `case`.
pub fn reason_modal(case: &Case, option: DecisionOption) -> ReasonModalParams {
    let (kind, id) = subject_parts(&case.subject);
    let ask_until = option.is_leave();
    let prompt = if ask_until {
        format!(
            "{kind} `{id}` stays as it is. Say why, and optionally until when Steward should not ask again."
        )
    } else {
        format!(
            "{kind} `{id}` will be killed without a snapshot: its state is lost for good. Say why."
        )
    };
    ReasonModalParams {
        callback_id: CASE_REASON_MODAL,
        metadata: ModalMetadata {
            case_id: case.id.clone(),
            option,
        }
        .encode(),
        // Modal titles are at most 24 characters.
        title: if ask_until {
            format!("{option}")
        } else {
            "Kill without snapshot".into()
        },
        submit: if ask_until {
            "Leave it".into()
        } else {
            "Kill".into()
        },
        prompt,
        ask_until,
        reason_block: CASE_REASON_BLOCK,
        reason_action: CASE_REASON_ACTION,
        until_block: CASE_UNTIL_BLOCK,
        until_action: CASE_UNTIL_ACTION,
    }
}

/// `case_opened.json.j2`: the answer to a command that opened (or found) a case.
#[derive(Debug, Clone, Serialize)]
pub struct CaseOpenedParams {
    pub existing: bool,
    pub case_id: String,
    pub subject: String,
    pub channel: Option<String>,
    pub link: Option<String>,
}

impl MessageParams for CaseOpenedParams {
    const TEMPLATE: &'static str = "case_opened.json.j2";
}

/// A link to a posted message (Slack redirects it to the workspace).
pub fn message_link(channel: &str, ts: &str) -> String {
    format!(
        "https://slack.com/archives/{channel}/p{}",
        ts.replace('.', "")
    )
}

/// `case_history.json.j2`.
#[derive(Debug, Clone, Serialize)]
pub struct HistoryParams {
    pub about: String,
    pub count: usize,
    pub shown: usize,
    /// The case (or cases) the events belong to, said once instead of on every line; `None`
    /// when the heading already names the case.
    pub cases: Option<Mrkdwn>,
    /// For a subject kept out of sweeps now: by whom, since and until when (filled by
    /// `history`, which reads the subject's Leave mark).
    pub left: Option<Mrkdwn>,
    /// The timeline, lines grouped so each group fits one section.
    pub chunks: Vec<Mrkdwn>,
}

impl MessageParams for HistoryParams {
    const TEMPLATE: &'static str = "case_history.json.j2";
}

/// Most timeline lines shown in Slack; the export has them all.
pub const HISTORY_MAX_LINES: usize = 60;
/// Most characters of one event's outcome shown in Slack (it may quote a long reason).
const HISTORY_OUTCOME_MAX_CHARS: usize = 400;

/// The timeline of `events` (oldest first), the latest [`HISTORY_MAX_LINES`] shown. People are
/// mentions; the case id is said once, in `cases`, unless `about_case` says the heading has it.
pub fn history_params(about: String, events: &[AuditEvent], about_case: bool) -> HistoryParams {
    let start = events.len().saturating_sub(HISTORY_MAX_LINES);
    let shown = &events[start..];
    let mut cases: Vec<&crate::ids::CaseId> = Vec::new();
    for case in shown.iter().filter_map(|e| e.case.as_ref()) {
        if !cases.contains(&case) {
            cases.push(case);
        }
    }
    // With several cases, each line says which by its number in the context line.
    let number = |e: &AuditEvent| -> Option<usize> {
        let case = e.case.as_ref()?;
        (cases.len() > 1).then(|| cases.iter().position(|c| *c == case).map(|i| i + 1))?
    };
    let lines: Vec<Mrkdwn> = shown
        .iter()
        .map(|e| {
            let who = match &e.actor {
                Actor::Person { user } => Mrkdwn::user(user),
                Actor::Steward { part } => Mrkdwn::text(&format!("Steward ({part})")),
                Actor::Agent { name } => Mrkdwn::text(&format!("Agent {name}")),
            };
            let mut line = Mrkdwn::markup("`")
                .and(e.time.format("%Y-%m-%d %H:%M:%S").to_string())
                .and(Mrkdwn::markup("` "))
                .and(who)
                .and(format!(" {}: ", e.action))
                // An outcome may quote a reason an agent or a person gave: their data, on one line.
                .and(Mrkdwn::quoted(&e.outcome, HISTORY_OUTCOME_MAX_CHARS));
            if let Some(n) = number(e) {
                line = line.and(format!(" (case {n})"));
            }
            line
        })
        .collect();
    let cases = match cases.as_slice() {
        [] => None,
        [_] if about_case => None,
        [one] => Some(Mrkdwn::text(&format!("Case `{one}`"))),
        many => Some(Mrkdwn::text(
            &many
                .iter()
                .enumerate()
                .map(|(i, c)| format!("Case {}: `{c}`", i + 1))
                .collect::<Vec<_>>()
                .join(" · "),
        )),
    };
    HistoryParams {
        about,
        count: events.len(),
        shown: lines.len(),
        cases,
        left: None,
        chunks: chunk_mrkdwn(lines, format::SECTION_TEXT_MAX_CHARS - 100),
    }
}

/// Joins `lines` with newlines into groups of at most `max_chars` each (a line is never split:
/// each one is far shorter than a section).
fn chunk_mrkdwn(lines: Vec<Mrkdwn>, max_chars: usize) -> Vec<Mrkdwn> {
    let mut chunks = Vec::new();
    let mut current: Option<(Mrkdwn, usize)> = None;
    for line in lines {
        let len = line.as_str().chars().count();
        current = match current.take() {
            Some((chunk, used)) if used + 1 + len <= max_chars => {
                Some((chunk.and(Mrkdwn::markup("\n")).and(line), used + 1 + len))
            }
            Some((chunk, _)) => {
                chunks.push(chunk);
                Some((line, len))
            }
            None => Some((line, len)),
        };
    }
    chunks.extend(current.map(|(chunk, _)| chunk));
    chunks
}

/// Every status a card can show.
pub(crate) const STATUSES: [CardStatus; 8] = [
    CardStatus::Pending,
    CardStatus::Running,
    CardStatus::Done,
    CardStatus::Gone,
    CardStatus::Failed,
    CardStatus::Expired,
    CardStatus::Left,
    CardStatus::Outside,
];

/// A button made of sample text, with a confirm dialog (`full`) or without.
pub(crate) fn sample_button(style: Option<&'static str>, full: bool) -> ButtonParams {
    let s = || SAMPLE_TEXT.to_owned();
    ButtonParams {
        action_id: s(),
        text: s(),
        value: s(),
        style,
        confirm: full.then(|| ConfirmParams {
            title: s(),
            text: s(),
            confirm: s(),
            deny: s(),
        }),
    }
}

/// A card in `status` made of sample text, with every optional part (`full`) or none.
pub(crate) fn sample_card(status: CardStatus, full: bool) -> CaseCardParams {
    let s = || SAMPLE_TEXT.to_owned();
    let some = |text: String| full.then_some(text);
    let mention = || full.then(|| Mrkdwn::text(SAMPLE_TEXT));
    let button = |style| sample_button(style, full);
    let quoted = || Mrkdwn::quoted(SAMPLE_TEXT, 100);
    let pair = || Field {
        key: s(),
        value: quoted(),
    };
    CaseCardParams {
        case_id: s(),
        subject_kind: "Sandbox",
        subject_id: s(),
        headline: s(),
        opener: Mrkdwn::text(SAMPLE_TEXT),
        asks: s(),
        reason: quoted(),
        evidence: if full {
            vec![pair(), pair()]
        } else {
            Vec::new()
        },
        recommendation: s(),
        recommendation_reason: s(),
        notes: if full { vec![s(), s()] } else { Vec::new() },
        status,
        actor: mention(),
        policy_line: some(s()),
        unanswered: some(s()),
        run: full.then(run_card::sample_run),
        option: some(s()),
        decision_reason: full.then(quoted),
        error: some(s()),
        until: some(s()),
        at: some(s()),
        decide_by: s(),
        results: if full { vec![s(), s()] } else { Vec::new() },
        snapshot_id: some(s()),
        restore_line: mention(),
        buttons: if full {
            vec![
                button(Some("primary")),
                button(Some("danger")),
                button(None),
            ]
        } else {
            Vec::new()
        },
        block_id: s(),
    }
}

/// The start check of this module's templates: the card in every status, the reason modal with
/// and without its until-date, the answer to a command that opened a case, and the history.
pub fn check_templates(templates: &Templates) -> Result<(), RenderError> {
    let s = || SAMPLE_TEXT.to_owned();
    for full in [true, false] {
        for status in STATUSES {
            templates.render(&sample_card(status, full))?;
        }
        templates.render_view(&ReasonModalParams {
            callback_id: CASE_REASON_MODAL,
            metadata: s(),
            title: s(),
            submit: s(),
            prompt: s(),
            ask_until: full,
            reason_block: CASE_REASON_BLOCK,
            reason_action: CASE_REASON_ACTION,
            until_block: CASE_UNTIL_BLOCK,
            until_action: CASE_UNTIL_ACTION,
        })?;
        templates.render(&CaseOpenedParams {
            existing: full,
            case_id: s(),
            subject: s(),
            channel: full.then(s),
            link: full.then(s),
        })?;
        templates.render(&HistoryParams {
            about: s(),
            count: if full { 2 } else { 0 },
            shown: if full { 2 } else { 0 },
            cases: full.then(|| Mrkdwn::text(SAMPLE_TEXT)),
            left: full.then(|| Mrkdwn::text(SAMPLE_TEXT)),
            chunks: if full {
                vec![Mrkdwn::text(SAMPLE_TEXT), Mrkdwn::text(SAMPLE_TEXT)]
            } else {
                Vec::new()
            },
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cases::{
        CaseDraft, Decision, Evidence, Metrics, Note, Recommendation, StepRecord, TemplateUsage,
    };
    use crate::ids::{CaseId, SandboxId, SlackUserId, TemplateId};
    use crate::slack::render::Templates;
    use chrono::{DateTime, Utc};
    use std::collections::BTreeMap;

    fn t(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_767_000_000 + secs, 0).unwrap()
    }

    fn user(id: &str) -> SlackUserId {
        SlackUserId::parse(id).unwrap()
    }

    fn sandbox_case() -> Case {
        let mut metadata = BTreeMap::new();
        metadata.insert("owner".to_owned(), "ana <ana@example.com>".to_owned());
        metadata.insert("team".to_owned(), "data".to_owned());
        let mut case = CaseDraft {
            subject: Subject::Sandbox(SandboxId::parse("sbx1").unwrap()),
            evidence: Evidence {
                state: Some("running".into()),
                template: Some(TemplateId::parse("rki5dems9wqfm4r03t7g").unwrap()),
                template_alias: Some("base".into()),
                cpu_count: Some(2),
                memory_mb: Some(512),
                disk_mb: Some(1024),
                started_at: Some(t(-7200)),
                metrics: Some(Metrics {
                    cpu_pct: 1.5,
                    mem_used: 100 * 1024 * 1024,
                    mem_total: 512 * 1024 * 1024,
                    disk_used: 200 * 1024 * 1024,
                    disk_total: 1024 * 1024 * 1024,
                }),
                metadata,
                ..Evidence::default()
            },
            recommendation: Recommendation {
                option: DecisionOption::SnapshotThenKill,
                reason: "a snapshot keeps its state".into(),
            },
            options: None,
            opener: Opener::Person { user: user("U1") },
            reason: "finished with it".into(),
            decide_by: t(86_400),
        }
        .into_case(t(0))
        .unwrap();
        case.id = CaseId::parse("case_fixed").unwrap();
        case.version = 1;
        case
    }

    fn decision(option: DecisionOption) -> Decision {
        Decision {
            option,
            by: user("U2").into(),
            at: t(60),
            reason: None,
        }
    }

    fn render(case: &Case) -> serde_json::Value {
        let message = Templates::embedded().render(&card_params(case)).unwrap();
        serde_json::to_value(message).unwrap()
    }

    #[test]
    fn any_amount_of_user_text_renders_within_slacks_limits() {
        let huge = "<&> x".repeat(4000);
        let mut case = sandbox_case();
        case.reason = huge.clone();
        case.evidence.owner = Some(huge.clone());
        case.evidence.metadata.insert("note".into(), huge.clone());
        case.notes = (0..100)
            .map(|_| Note {
                at: t(1),
                text: huge.clone(),
            })
            .collect();
        let mut decision = decision(DecisionOption::Pause);
        decision.reason = Some(huge.clone());
        case.state = CaseState::Failed {
            decision,
            attempt: 1,
            steps: Vec::new(),
            error: huge.clone(),
            at: t(120),
        };
        // `render` checks every text against Slack's limits; it would fail on length.
        let json = render(&case);
        assert!(json.to_string().contains("…(cut)"));
        assert!(json["blocks"].as_array().unwrap().len() <= 50);
    }

    #[test]
    fn a_pending_sandbox_card_offers_four_buttons_with_a_confirm_on_kill() {
        let json = render(&sandbox_case());
        let actions = json["blocks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["type"] == "actions")
            .unwrap();
        let ids: Vec<&str> = actions["elements"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["action_id"].as_str().unwrap())
            .collect();
        assert_eq!(
            ids,
            [
                "case_snapshot_then_kill",
                "case_kill",
                "case_pause",
                "case_leave"
            ]
        );
        assert_eq!(actions["elements"][0]["style"], "primary");
        assert_eq!(actions["elements"][1]["style"], "danger");
        assert!(
            actions["elements"][1]["confirm"]["text"]["text"]
                .as_str()
                .unwrap()
                .contains("sbx1")
        );
        // The template shows as its alias, the name people know, not its id.
        let text = json.to_string();
        assert!(text.contains("*Template*\\n`base`"), "{text}");
        assert!(!text.contains("rki5dems9wqfm4r03t7g"), "{text}");
        insta::assert_json_snapshot!("case_card_pending", json);
    }

    /// The buttons of a rendered card: (action_id, style).
    fn buttons(json: &serde_json::Value) -> Vec<(String, Option<String>)> {
        let actions = json["blocks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["type"] == "actions")
            .expect("an actions block");
        actions["elements"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| {
                (
                    b["action_id"].as_str().unwrap().to_owned(),
                    b["style"].as_str().map(str::to_owned),
                )
            })
            .collect()
    }

    #[test]
    fn the_highlighted_button_is_the_recommended_one_and_comes_first() {
        let styled = |id: &str, style: Option<&str>| (id.to_owned(), style.map(str::to_owned));
        for (recommended, expected) in [
            (
                DecisionOption::Pause,
                vec![
                    styled("case_pause", Some("primary")),
                    styled("case_snapshot_then_kill", None),
                    styled("case_kill", Some("danger")),
                    styled("case_leave", None),
                ],
            ),
            (
                DecisionOption::Leave,
                vec![
                    styled("case_leave", Some("primary")),
                    styled("case_snapshot_then_kill", None),
                    styled("case_kill", Some("danger")),
                    styled("case_pause", None),
                ],
            ),
            (
                DecisionOption::SnapshotThenKill,
                vec![
                    styled("case_snapshot_then_kill", Some("primary")),
                    styled("case_kill", Some("danger")),
                    styled("case_pause", None),
                    styled("case_leave", None),
                ],
            ),
        ] {
            let mut case = sandbox_case();
            case.recommendation.option = recommended;
            let json = render(&case);
            assert_eq!(buttons(&json), expected, "{recommended:?}");
            // Kill keeps its confirm dialog whatever is recommended.
            let kill = json["blocks"]
                .as_array()
                .unwrap()
                .iter()
                .find(|b| b["type"] == "actions")
                .unwrap()["elements"]
                .as_array()
                .unwrap()
                .iter()
                .find(|b| b["action_id"] == "case_kill")
                .unwrap()
                .clone();
            assert_eq!(kill["confirm"]["style"], "danger");
            let recommends = format!("Steward recommends *{recommended}*");
            assert!(json.to_string().contains(&recommends), "{json}");
        }
        let mut pause = sandbox_case();
        pause.recommendation = Recommendation {
            option: DecisionOption::Pause,
            reason: "idle for 2 h; a paused sandbox keeps its state and costs nothing".into(),
        };
        insta::assert_json_snapshot!("case_card_recommends_pause", render(&pause));
    }

    /// Issue 39: a kill reason written to look like card lines, and metadata with a mention, an
    /// emoji and a NUL, all show as one quoted line each; the card has exactly the blocks and
    /// lines of any other agent's card.
    #[test]
    fn a_reason_and_metadata_written_as_card_lines_stay_one_quoted_line_each() {
        let mut case = sandbox_case();
        case.opener = Opener::Agent {
            name: "ci-bot".into(),
        };
        let plain = render(&case);
        case.reason =
            "\n:white_check_mark: *Steward recommends Kill*…\n*State*\nstopped <!channel>\0".into();
        case.evidence.owner = Some("*ana*\n> :fire: <@U0002>".into());
        case.evidence
            .metadata
            .insert("note".into(), "_x_\u{0}\u{1b}[2J ~y~ `z`".into());
        let json = render(&case);
        let asks = json["blocks"][1]["text"]["text"].as_str().unwrap();
        assert_eq!(
            asks,
            "Agent ci-bot asks to kill this sandbox: \
             `:white_check_mark: *Steward recommends Kill*…⏎*State*⏎stopped &lt;!channel&gt;`"
        );
        let fields = json["blocks"][2]["fields"].to_string();
        assert!(
            fields.contains(r"`*ana*⏎&gt; :fire: &lt;@U0002&gt;`"),
            "{fields}"
        );
        assert!(fields.contains("`note=_x_[2J ~y~ ˋzˋ`"), "{fields}");
        let text = json.to_string();
        assert!(
            !text.contains("<!channel>") && !text.contains("<@U0002>"),
            "{text}"
        );
        assert!(
            !text.contains("\\u0000") && !text.contains("\\u001b"),
            "{text}"
        );
        // Nothing was added: the same blocks, and each block the same number of lines.
        let shape = |v: &serde_json::Value| -> Vec<usize> {
            v["blocks"]
                .as_array()
                .unwrap()
                .iter()
                .map(|b| b.to_string().matches("\\n").count())
                .collect()
        };
        assert_eq!(shape(&json), shape(&plain));
        insta::assert_json_snapshot!("case_card_hostile_reason", json);
    }

    #[test]
    fn only_a_persons_or_an_agents_own_words_are_quoted() {
        let mut case = sandbox_case();
        case.reason = NO_REASON.into();
        assert_eq!(card_params(&case).reason.as_str(), "no reason given");
        case.reason = "*done*".into();
        assert_eq!(card_params(&case).reason.as_str(), "`*done*`");
        case.opener = Opener::Sweep;
        case.reason = "is this idle sandbox still needed?".into();
        assert_eq!(
            card_params(&case).reason.as_str(),
            "is this idle sandbox still needed?"
        );
        let person = Decider::Person(user("U2"));
        let policy = Decider::Policy {
            policy: "[runs] on_finish".into(),
        };
        assert_eq!(
            decision_reason(&person, Some("a\nb")).unwrap().as_str(),
            "`a⏎b`"
        );
        assert_eq!(
            decision_reason(&policy, Some("kept by policy"))
                .unwrap()
                .as_str(),
            "kept by policy"
        );
    }

    #[test]
    fn an_agents_case_card_names_the_agent_and_says_what_it_asks() {
        let mut case = sandbox_case();
        case.opener = Opener::Agent {
            name: "ci-bot <prod>".into(),
        };
        case.reason = "the nightly job is finished with it".into();
        let json = render(&case);
        assert_eq!(
            json["blocks"][1]["text"]["text"],
            "Agent ci-bot &lt;prod&gt; asks to kill this sandbox: `the nightly job is finished with it`"
        );
        insta::assert_json_snapshot!("case_card_agent", json);

        case.subject = Subject::Template(TemplateId::parse("old-tpl").unwrap());
        case.options = case.subject.default_options();
        case.recommendation.option = DecisionOption::DeleteTemplate;
        let json = render(&case);
        assert!(
            json["blocks"][1]["text"]["text"]
                .as_str()
                .unwrap()
                .contains("asks to delete this template: "),
            "{json}"
        );
    }

    #[test]
    fn a_template_card_says_how_many_use_it_in_its_confirm() {
        let mut case = sandbox_case();
        case.subject = Subject::Template(TemplateId::parse("old-tpl").unwrap());
        case.options = case.subject.default_options();
        case.recommendation.option = DecisionOption::DeleteTemplate;
        case.evidence = Evidence {
            template_usage: Some(TemplateUsage {
                sandboxes: vec![
                    SandboxId::parse("a").unwrap(),
                    SandboxId::parse("b").unwrap(),
                ],
                snapshots: 3,
            }),
            ..Evidence::default()
        };
        let json = render(&case);
        let text = json.to_string();
        assert!(
            text.contains("used by 2 sandboxes and 3 snapshots."),
            "{text}"
        );
        insta::assert_json_snapshot!("case_card_template", json);
    }

    #[test]
    fn every_later_stage_renders_without_option_buttons() {
        let base = sandbox_case();
        let snap = TemplateId::parse("team/snap:1").unwrap();
        let steps = vec![
            StepRecord {
                step: crate::cases::Step::Snapshot,
                outcome: StepOutcome::SnapshotCreated {
                    snapshot_id: snap.clone(),
                    life_left_secs: None,
                },
                at: t(61),
            },
            StepRecord {
                step: crate::cases::Step::VerifySnapshot,
                outcome: StepOutcome::SnapshotVerified { snapshot_id: snap },
                at: t(62),
            },
            StepRecord {
                step: crate::cases::Step::Kill,
                outcome: StepOutcome::Killed,
                at: t(63),
            },
        ];
        let stages = [
            (
                "case_card_running",
                CaseState::Executing {
                    decision: decision(DecisionOption::SnapshotThenKill),
                    attempt: 1,
                    steps: steps[..1].to_vec(),
                },
            ),
            (
                "case_card_done",
                CaseState::Done {
                    decision: decision(DecisionOption::SnapshotThenKill),
                    steps: steps.clone(),
                    at: t(63),
                },
            ),
            (
                "case_card_gone",
                CaseState::Done {
                    decision: decision(DecisionOption::Kill),
                    steps: vec![StepRecord {
                        step: crate::cases::Step::Kill,
                        outcome: StepOutcome::AlreadyGone,
                        at: t(61),
                    }],
                    at: t(61),
                },
            ),
            (
                "case_card_failed",
                CaseState::Failed {
                    decision: decision(DecisionOption::Pause),
                    attempt: 1,
                    steps: vec![],
                    error: "E2B had a server error (500): boom".into(),
                    at: t(61),
                },
            ),
            ("case_card_expired", CaseState::Expired { at: t(86_400) }),
            (
                "case_card_ended_outside",
                CaseState::EndedOutside {
                    what: "E2B says the sandbox was killed outside Steward at 2026-01-01 00:05:00 UTC (owner dana)".into(),
                    at: t(300),
                },
            ),
            (
                "case_card_left",
                CaseState::Left {
                    option: DecisionOption::Leave,
                    by: user("U3").into(),
                    reason: Some("demo on Friday".into()),
                    until: Some(t(7 * 86_400)),
                    at: t(61),
                },
            ),
        ];
        for (name, state) in stages {
            let mut case = base.clone();
            case.state = state;
            let json = render(&case);
            let text = json.to_string();
            let has_retry = text.contains(CASE_RETRY);
            assert_eq!(has_retry, name == "case_card_failed", "{name}");
            assert!(!text.contains("case_kill"), "{name}");
            insta::assert_json_snapshot!(name, json);
        }
    }

    /// A finished Snapshot, then kill card names E2B's long snapshot id once (the line on how
    /// to start from it), and its header fits one line on a laptop, whatever the restore line says.
    #[test]
    fn a_finished_card_names_its_snapshot_once_and_keeps_its_header_short() {
        let sandbox = "i2xk7tq9z0abcdefghij"; // E2B's sandbox ids are 20 characters
        let snap = TemplateId::parse(
            "team-4f1e2b5c7a3d4c8e/snapshot-i2xk7tq9z0abcdefghij-20261207-1203:default",
        )
        .unwrap();
        let mut case = sandbox_case();
        case.subject = Subject::Sandbox(SandboxId::parse(sandbox).unwrap());
        case.state = CaseState::Done {
            decision: decision(DecisionOption::SnapshotThenKill),
            steps: vec![
                step(
                    crate::cases::Step::Snapshot,
                    StepOutcome::SnapshotCreated {
                        snapshot_id: snap.clone(),
                        life_left_secs: None,
                    },
                ),
                step(
                    crate::cases::Step::VerifySnapshot,
                    StepOutcome::SnapshotVerified {
                        snapshot_id: snap.clone(),
                    },
                ),
                step(crate::cases::Step::Kill, StepOutcome::Killed),
            ],
            at: t(63),
        };
        for (closed, request) in [
            (false, None),
            (true, None),
            (
                false,
                Some(crate::cases::RestoreRequest {
                    by: user("U3"),
                    at: t(200),
                    sandbox: None,
                    error: Some("E2B had a server error (500)".into()),
                    ends_at: None,
                    kept_by: None,
                }),
            ),
        ] {
            case.restore = Some(crate::cases::Restore {
                snapshot: snap.clone(),
                until: t(7 * 86_400),
                closed,
                request,
                life_left_secs: None,
            });
            let json = render(&case);
            let text = json.to_string();
            assert_eq!(text.matches(snap.as_str()).count(), 1, "{text}");
            assert!(
                text.contains(&format!("`steward e2b create {snap}`")),
                "{text}"
            );
            let header = json["blocks"][0]["text"]["text"].as_str().unwrap();
            assert_eq!(header, format!("Sandbox {sandbox} killed, snapshot kept"));
            assert!(header.chars().count() <= 50, "{header}");
        }
    }

    fn step(step: crate::cases::Step, outcome: StepOutcome) -> StepRecord {
        StepRecord {
            step,
            outcome,
            at: t(62),
        }
    }

    /// The header and the `State` field of a rendered card.
    fn header_and_state(json: &serde_json::Value) -> (String, Option<String>) {
        let header = json["blocks"][0]["text"]["text"]
            .as_str()
            .unwrap()
            .to_owned();
        let state = json["blocks"][2]["fields"]
            .as_array()
            .and_then(|fields| {
                fields
                    .iter()
                    .filter_map(|f| f["text"].as_str())
                    .find_map(|f| f.strip_prefix("*State*\n"))
            })
            .map(str::to_owned);
        (header, state)
    }

    #[test]
    fn a_finished_card_says_what_became_of_the_subject() {
        use crate::cases::Step;
        let snap = TemplateId::parse("team/snap:1").unwrap();
        let done = |option, steps| CaseState::Done {
            decision: decision(option),
            steps,
            at: t(63),
        };
        let cases = [
            (
                done(
                    DecisionOption::SnapshotThenKill,
                    vec![
                        step(
                            Step::Snapshot,
                            StepOutcome::SnapshotCreated {
                                snapshot_id: snap.clone(),
                                life_left_secs: None,
                            },
                        ),
                        step(Step::Kill, StepOutcome::Killed),
                    ],
                ),
                "Sandbox sbx1 killed, snapshot kept",
                "killed",
            ),
            (
                done(
                    DecisionOption::Kill,
                    vec![step(Step::Kill, StepOutcome::Killed)],
                ),
                "Sandbox sbx1 killed",
                "killed",
            ),
            (
                done(
                    DecisionOption::Pause,
                    vec![step(Step::Pause, StepOutcome::Paused)],
                ),
                "Sandbox sbx1 paused",
                "paused",
            ),
            (
                CaseState::Left {
                    option: DecisionOption::Leave,
                    by: user("U3").into(),
                    reason: None,
                    until: None,
                    at: t(61),
                },
                "Sandbox sbx1 left as it is",
                "running when asked",
            ),
            (
                CaseState::Failed {
                    decision: decision(DecisionOption::Pause),
                    attempt: 1,
                    steps: vec![],
                    error: "E2B had a server error (500): boom".into(),
                    at: t(61),
                },
                "Sandbox sbx1: Pause failed",
                "running when asked",
            ),
            (
                CaseState::Expired { at: t(86_400) },
                "Sandbox sbx1: no decision, nothing done",
                "running when asked",
            ),
        ];
        for (state, header, state_field) in cases {
            let mut case = sandbox_case();
            case.state = state;
            let json = render(&case);
            assert_eq!(
                header_and_state(&json),
                (header.to_owned(), Some(state_field.to_owned()))
            );
            let text = json.to_string();
            assert!(!text.contains("kill it?"), "{text}");
        }

        let mut template = sandbox_case();
        template.subject = Subject::Template(TemplateId::parse("old-tpl").unwrap());
        template.options = template.subject.default_options();
        template.recommendation = Recommendation {
            option: DecisionOption::DeleteTemplate,
            reason: "no sandbox or snapshot uses it".into(),
        };
        template.evidence = Evidence {
            template_usage: Some(TemplateUsage::default()),
            ..Evidence::default()
        };
        template.state = done(
            DecisionOption::DeleteTemplate,
            vec![step(Step::DeleteTemplate, StepOutcome::TemplateDeleted)],
        );
        let json = render(&template);
        assert_eq!(header_and_state(&json).0, "Template old-tpl deleted");
        assert!(json.to_string().contains("Template deleted."), "{json}");
        insta::assert_json_snapshot!("case_card_template_deleted", json);
    }

    #[test]
    fn a_refreshed_card_shows_the_note_and_asks_again() {
        let mut case = sandbox_case();
        case.notes.push(Note {
            at: t(100),
            text: "Asked again: state went from running to paused.".into(),
        });
        let json = render(&case);
        assert!(json.to_string().contains("Asked again"));
        insta::assert_json_snapshot!("case_card_stale_refreshed", json);
    }

    #[test]
    fn the_reason_modals_render_as_slack_views() {
        let case = sandbox_case();
        let templates = Templates::embedded();
        for (name, option) in [
            ("case_modal_leave", DecisionOption::Leave),
            ("case_modal_kill", DecisionOption::Kill),
        ] {
            let view = templates.render_view(&reason_modal(&case, option)).unwrap();
            let json = serde_json::to_value(&view).unwrap();
            assert_eq!(json["type"], "modal");
            let meta = ModalMetadata::decode(json["private_metadata"].as_str().unwrap()).unwrap();
            assert_eq!(meta.option, option);
            insta::assert_json_snapshot!(name, json);
        }
    }

    #[test]
    fn history_lists_events_oldest_first() {
        let case = sandbox_case();
        let events = vec![
            AuditEvent {
                time: t(0),
                case: Some(case.id.clone()),
                subject: Some(case.subject.clone()),
                actor: Actor::Person { user: user("U1") },
                action: "open".into(),
                outcome: "ok".into(),
            },
            AuditEvent {
                time: t(60),
                case: Some(case.id.clone()),
                subject: Some(case.subject.clone()),
                actor: Actor::Steward {
                    part: "worker".into(),
                },
                action: "e2b:kill_sandbox".into(),
                outcome: "ok".into(),
            },
        ];
        let message = Templates::embedded()
            .render(&history_params("sandbox `sbx1`".into(), &events, false))
            .unwrap();
        let json = serde_json::to_value(&message).unwrap();
        let text = json.to_string();
        assert!(text.find("open").unwrap() < text.find("e2b:kill_sandbox").unwrap());
        // The person is a mention Slack renders, the case id is said once, in the context line.
        assert_eq!(
            json["blocks"][1]["elements"][0]["text"],
            "Case `case_fixed`"
        );
        assert_eq!(
            json["blocks"][2]["text"]["text"],
            "`2025-12-29 09:20:00` <@U1> open: `ok`\n`2025-12-29 09:21:00` Steward (worker) e2b:kill_sandbox: `ok`"
        );
        insta::assert_json_snapshot!("case_history", json);
        // Asked about the case itself, the heading names it and no context line repeats it.
        let about_case = Templates::embedded()
            .render(&history_params("case `case_fixed`".into(), &events, true))
            .unwrap();
        let about_case = serde_json::to_value(&about_case).unwrap();
        assert_eq!(about_case["blocks"].as_array().unwrap().len(), 2);
        assert_eq!(
            about_case.to_string().matches("case_fixed").count(),
            2,
            "{about_case}"
        );
        let empty = Templates::embedded()
            .render(&history_params("case `x`".into(), &[], true))
            .unwrap();
        assert!(serde_json::to_string(&empty).unwrap().contains("no record"));
    }
}
