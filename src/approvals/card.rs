//! A case as Slack sees it: the card's params (built from a [`Case`]), the reason modal and the
//! history timeline, each rendered by a template in `templates/`.
//!
//! Button `action_id`s come from `slack::payload`, the same constants the click parser reads.
//! This file must not call Slack, E2B or the store: it turns values into messages.
use serde::Serialize;

use crate::cases::{Case, CaseState, DecisionOption, Opener, StepOutcome, Subject};
use crate::slack::format::{self, human_bytes, when};
use crate::slack::payload::{
    CASE_REASON_ACTION, CASE_REASON_BLOCK, CASE_REASON_MODAL, CASE_RETRY, CASE_UNTIL_ACTION,
    CASE_UNTIL_BLOCK, ModalMetadata, case_option_action_id,
};
use crate::slack::render::{KeyValue, MessageParams};
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
}

/// `case_card.json.j2`.
#[derive(Debug, Clone, Serialize)]
pub struct CaseCardParams {
    pub case_id: String,
    /// `Sandbox` or `Template`.
    pub subject_kind: &'static str,
    pub subject_id: String,
    /// The question in the header, e.g. `kill it?`.
    pub question: String,
    pub opener_user: Option<String>,
    pub opener_text: Option<String>,
    pub reason: String,
    pub evidence: Vec<KeyValue>,
    pub recommendation: String,
    pub recommendation_reason: String,
    pub notes: Vec<String>,
    pub status: CardStatus,
    /// Plain words for the fallback text.
    pub status_text: String,
    pub actor: Option<String>,
    pub option: Option<String>,
    pub decision_reason: Option<String>,
    pub error: Option<String>,
    pub until: Option<String>,
    pub at: Option<String>,
    pub decide_by: String,
    pub results: Vec<String>,
    pub snapshot_id: Option<String>,
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

/// The evidence as card fields (at most ten: Slack's limit on section fields).
fn evidence_fields(case: &Case) -> Vec<KeyValue> {
    let e = &case.evidence;
    let mib = |mb: u64| human_bytes(mb * 1024 * 1024);
    let mut out = Vec::new();
    let mut push = |key: &str, value: String| {
        out.push(KeyValue {
            key: key.to_owned(),
            value,
        })
    };
    if let Some(state) = &e.state {
        push("State", state.clone());
    }
    if let Some(t) = &e.template {
        push("Template", format!("`{t}`"));
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
        push("Resources", size.join(" · "));
    }
    if let Some(t) = e.started_at {
        push("Started", when(t));
    }
    if let Some(t) = e.idle_since {
        push("Idle since", when(t));
    }
    if let Some(t) = e.paused_since {
        push("Paused since", when(t));
    }
    if let Some(m) = &e.metrics {
        push(
            "Latest sample",
            format!(
                "CPU {:.0}% · memory {} of {} · disk {} of {}",
                m.cpu_pct,
                human_bytes(m.mem_used),
                human_bytes(m.mem_total),
                human_bytes(m.disk_used),
                human_bytes(m.disk_total)
            ),
        );
    }
    if let Some(owner) = &e.owner {
        push("Owner", owner.clone());
    }
    if let Some(usage) = &e.template_usage {
        push(
            "Used by",
            format!(
                "{} sandbox{} · {} snapshot{}",
                usage.sandboxes.len(),
                if usage.sandboxes.len() == 1 { "" } else { "es" },
                usage.snapshots,
                if usage.snapshots == 1 { "" } else { "s" }
            ),
        );
    }
    let metadata: Vec<String> = e.metadata.iter().map(|(k, v)| format!("{k}={v}")).collect();
    if !metadata.is_empty() {
        push(
            "Metadata",
            format::truncate_escaped(&metadata.join(", "), 400),
        );
    }
    if out.is_empty() {
        out.push(KeyValue {
            key: "Evidence".into(),
            value: "none recorded".into(),
        });
    }
    out.truncate(10);
    out
}

/// The button of one option on a pending card.
fn option_button(case: &Case, option: DecisionOption) -> ButtonParams {
    let (kind, id) = subject_parts(&case.subject);
    let style = match option {
        DecisionOption::SnapshotThenKill => Some("primary"),
        DecisionOption::Kill | DecisionOption::DeleteTemplate => Some("danger"),
        _ => None,
    };
    let confirm = match option {
        DecisionOption::Kill => Some(ConfirmParams {
            title: "Kill without a snapshot?".into(),
            text: format!(
                "{kind} `{id}` will be killed and its state is lost for good. Steward will ask for a reason."
            ),
            confirm: "Kill it".into(),
            deny: "Cancel".into(),
        }),
        DecisionOption::DeleteTemplate => {
            let usage = case.evidence.template_usage.clone().unwrap_or_default();
            Some(ConfirmParams {
                title: "Delete this template?".into(),
                text: format!(
                    "Template `{id}` is used by {} sandbox(es) and {} snapshot(s). Deleting it cannot be undone.",
                    usage.sandboxes.len(),
                    usage.snapshots
                ),
                confirm: "Delete it".into(),
                deny: "Cancel".into(),
            })
        }
        _ => None,
    };
    ButtonParams {
        action_id: case_option_action_id(option),
        text: option.to_string(),
        value: case.id.to_string(),
        style,
        confirm,
    }
}

fn question(case: &Case) -> String {
    match case.recommendation.option {
        DecisionOption::SnapshotThenKill | DecisionOption::Kill => "kill it?".into(),
        DecisionOption::Pause => "pause it?".into(),
        DecisionOption::DeleteTemplate => "delete it?".into(),
        DecisionOption::Leave | DecisionOption::Keep => "what now?".into(),
    }
}

/// What the finished steps produced, one line each.
fn result_lines(steps: &[crate::cases::StepRecord]) -> (Vec<String>, Option<String>) {
    let mut lines = Vec::new();
    let mut snapshot = None;
    for record in steps {
        let line = match &record.outcome {
            StepOutcome::SnapshotCreated { snapshot_id } => {
                snapshot = Some(snapshot_id.to_string());
                format!("Snapshot `{snapshot_id}` taken.")
            }
            StepOutcome::SnapshotVerified { snapshot_id } => {
                format!("Snapshot `{snapshot_id}` confirmed in E2B's snapshot list.")
            }
            StepOutcome::Killed => "Killed.".into(),
            StepOutcome::Paused => "Paused.".into(),
            StepOutcome::AlreadyPaused => "It was already paused.".into(),
            StepOutcome::TemplateDeleted => "Template deleted.".into(),
            StepOutcome::AlreadyGone => "It was already gone.".into(),
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
    params.reason = format::cut(&params.reason, CARD_REASON_MAX_CHARS);
    params.opener_text = params.opener_text.as_deref().map(cut);
    params.recommendation_reason = cut(&params.recommendation_reason);
    let skip = params.notes.len().saturating_sub(CARD_MAX_NOTES);
    params.notes = params.notes[skip..].iter().map(|n| cut(n)).collect();
    params.decision_reason = params.decision_reason.as_deref().map(cut);
    params.error = params.error.as_deref().map(cut);
    params.status_text = cut(&params.status_text);
    params.results = params.results.iter().map(|r| cut(r)).collect();
    for field in &mut params.evidence {
        field.value = format::cut(&field.value, 400);
    }
    params
}

fn uncut_card_params(case: &Case) -> CaseCardParams {
    let (subject_kind, subject_id) = subject_parts(&case.subject);
    let (opener_user, opener_text) = match &case.opener {
        Opener::Person { user } => (Some(user.to_string()), None),
        Opener::Sweep => (None, Some("The hygiene sweep".to_owned())),
    };
    let mut params = CaseCardParams {
        case_id: case.id.to_string(),
        subject_kind,
        subject_id,
        question: question(case),
        opener_user,
        opener_text,
        reason: case.reason.clone(),
        evidence: evidence_fields(case),
        recommendation: case.recommendation.option.to_string(),
        recommendation_reason: case.recommendation.reason.clone(),
        notes: case.notes.iter().map(|n| n.text.clone()).collect(),
        status: CardStatus::Pending,
        status_text: String::new(),
        actor: None,
        option: None,
        decision_reason: None,
        error: None,
        until: None,
        at: None,
        decide_by: when(case.decide_by),
        results: Vec::new(),
        snapshot_id: None,
        buttons: Vec::new(),
        block_id: format!("case:{}:{}", case.id, case.version),
    };
    if let Some(d) = case.state.decision() {
        params.actor = Some(d.by.to_string());
        params.option = Some(d.option.to_string());
        params.decision_reason = d.reason.clone();
    }
    match &case.state {
        CaseState::Pending => {
            params.status_text = format!("waiting for a decision by {}", params.decide_by);
            params.buttons = case
                .options
                .iter()
                .map(|o| option_button(case, *o))
                .collect();
        }
        CaseState::Decided { steps, .. } | CaseState::Executing { steps, .. } => {
            params.status = CardStatus::Running;
            params.status_text = "the decision is being carried out".into();
            (params.results, params.snapshot_id) = result_lines(steps);
        }
        CaseState::Done { steps, at, .. } => {
            let gone = steps.iter().any(|r| r.outcome == StepOutcome::AlreadyGone);
            params.status = if gone {
                CardStatus::Gone
            } else {
                CardStatus::Done
            };
            params.status_text = if gone {
                "already gone; nothing was done".into()
            } else {
                "done".into()
            };
            params.at = Some(when(*at));
            (params.results, params.snapshot_id) = result_lines(steps);
        }
        CaseState::Failed { steps, error, .. } => {
            params.status = CardStatus::Failed;
            params.status_text = format!("failed: {error}");
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
            params.status_text =
                format!("no decision by {}: no action was taken", params.decide_by);
        }
        CaseState::Left {
            option,
            by,
            reason,
            until,
            at,
        } => {
            params.status = CardStatus::Left;
            params.status_text = format!("{option} chosen by {by}");
            params.actor = Some(by.to_string());
            params.option = Some(option.to_string());
            params.decision_reason = reason.clone();
            params.until = until.map(when);
            params.at = Some(when(*at));
        }
    }
    params
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
    pub chunks: Vec<String>,
}

impl MessageParams for HistoryParams {
    const TEMPLATE: &'static str = "case_history.json.j2";
}

/// Most timeline lines shown in Slack; the export has them all.
pub const HISTORY_MAX_LINES: usize = 60;
/// Longest timeline line shown in Slack.
const HISTORY_LINE_MAX_CHARS: usize = 500;

/// The timeline of `events` (oldest first), the latest [`HISTORY_MAX_LINES`] shown.
pub fn history_params(about: String, events: &[AuditEvent]) -> HistoryParams {
    let start = events.len().saturating_sub(HISTORY_MAX_LINES);
    let lines: Vec<String> = events[start..]
        .iter()
        .map(|e| {
            let who = match &e.actor {
                Actor::Person { user } => user.to_string(),
                Actor::Steward { part } => format!("steward/{part}"),
            };
            let case = e.case.as_ref().map(|c| format!(" {c}")).unwrap_or_default();
            // One line stays well inside a section, however long the reason it records.
            format::cut(
                &format::defuse_code_fence(&format!(
                    "{} {who}{case} {}: {}",
                    e.time.format("%Y-%m-%d %H:%M:%S"),
                    e.action,
                    e.outcome
                )),
                HISTORY_LINE_MAX_CHARS,
            )
        })
        .collect();
    HistoryParams {
        about,
        count: events.len(),
        shown: lines.len(),
        chunks: format::chunk_lines(&lines, format::SECTION_TEXT_MAX_CHARS - 6),
    }
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
        let mut case = CaseDraft {
            subject: Subject::Sandbox(SandboxId::parse("sbx1").unwrap()),
            evidence: Evidence {
                state: Some("running".into()),
                template: Some(TemplateId::parse("base").unwrap()),
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
            by: user("U2"),
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
        insta::assert_json_snapshot!("case_card_pending", json);
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
            text.contains("used by 2 sandbox(es) and 3 snapshot(s)"),
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
                "case_card_left",
                CaseState::Left {
                    option: DecisionOption::Leave,
                    by: user("U3"),
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
            .render(&history_params("sandbox `sbx1`".into(), &events))
            .unwrap();
        let json = serde_json::to_value(&message).unwrap();
        let text = json.to_string();
        assert!(text.find("open").unwrap() < text.find("e2b:kill_sandbox").unwrap());
        insta::assert_json_snapshot!("case_history", json);
        let empty = Templates::embedded()
            .render(&history_params("case `x`".into(), &[]))
            .unwrap();
        assert!(serde_json::to_string(&empty).unwrap().contains("no record"));
    }
}
