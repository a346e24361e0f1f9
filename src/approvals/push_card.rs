//! The push-test alert as a case card (`push_case.json.j2`): the test-failure alert's headline
//! and details (from `alerts`), with the case's status line, steps and buttons below them. The
//! buttons are the run options a failing test's sandbox needs: **Keep for debugging** (the
//! timeout extended, then how to connect), **Snapshot for repro** (snapshot, then kill) and
//! **Kill**. Pure: params from a case.
use serde::Serialize;

use super::card::{self, CaseCardParams};
use crate::alerts::message::{TestFailureParams, sample_failure, test_failure_params};
use crate::alerts::{Person, TestFailure, TestOutput};
use crate::cases::{
    Case, CaseState, DecisionOption, PushPerson, PushReport, RunOutcome, RunReport, StepOutcome,
    Subject,
};
use crate::slack::format;
use crate::slack::render::{MessageParams, RenderError, Templates};

/// The exit code shown for a test run Steward stopped at its timeout (as `timeout(1)` exits).
pub const TIMED_OUT_EXIT_CODE: i32 = 124;

/// `push_case.json.j2`: the alert's fields and the case card's, side by side (no name is in
/// both).
#[derive(Debug, Clone, Serialize)]
pub struct PushCaseParams {
    #[serde(flatten)]
    pub alert: TestFailureParams,
    #[serde(flatten)]
    pub case: CaseCardParams,
}

impl MessageParams for PushCaseParams {
    const TEMPLATE: &'static str = "push_case.json.j2";
}

/// The alert's view of someone behind a push.
pub(super) fn person(who: &PushPerson) -> Person {
    Person {
        name: Some(who.name.clone()),
        email: None,
        login: None,
        slack_user: who.slack_user.clone(),
    }
}

/// The exit code a push alert shows for how the run ended.
pub fn shown_exit_code(run: &RunReport) -> i32 {
    match (run.outcome, run.exit_code) {
        (_, Some(code)) => code,
        (RunOutcome::TimedOut, None) => TIMED_OUT_EXIT_CODE,
        // Killed by a signal: the shell's convention would be 128 + signal; we do not know it.
        (_, None) => -1,
    }
}

/// The params of a push-test case's card.
pub fn push_card_params(case: &Case, push: &PushReport, run: &RunReport) -> PushCaseParams {
    let failure = TestFailure {
        repository: push.repository.clone(),
        branch: push.branch.clone(),
        commit_sha: push.commit.clone(),
        commit_url: push.commit_url.clone(),
        commit_message: push.message.clone(),
        pusher: push.pusher.as_ref().map(person),
        author: push.author.as_ref().map(person),
        command: push.command.clone(),
        exit_code: shown_exit_code(run),
        duration: Some(std::time::Duration::from_millis(run.duration_ms)),
        // The failing lines were picked when the run ended; the card does not keep the output.
        output: TestOutput::default(),
        sandbox_id: match &case.subject {
            Subject::Sandbox(id) => Some(id.clone()),
            Subject::Template(_) => None,
        },
    };
    let mut alert = test_failure_params(&failure);
    // Picked and cut when the run ended; defused again here (it changes nothing twice) so the
    // block holds whatever a stored record says.
    alert.failing = format::defuse_code_fence(&push.failing);
    alert.cut = push.failing_cut;
    alert.output_size = (run.output_bytes > 0).then(|| format::human_bytes(run.output_bytes));
    alert.output_kept = push.output_kept.clone();
    let mut params = card::card_params(case);
    // The run's own fields (command, exit code, output) are the alert's here: not twice.
    params.run = None;
    // After Keep for debugging: how to get a shell in it (E2B's own CLI opens an interactive
    // terminal; `steward e2b connect` only resumes or extends), and until when.
    if let CaseState::Done {
        decision, steps, ..
    } = &case.state
        && decision.option == DecisionOption::KeepRunning
        && let Some(until) = steps.iter().find_map(|s| match s.outcome {
            StepOutcome::KeptRunning { until, .. } => Some(until),
            _ => None,
        })
    {
        params.results.push(format!(
            "Open a shell in it: `e2b sandbox connect {}` (E2B's CLI: `npm i -g @e2b/cli`, then `e2b auth login`). E2B ends the sandbox at {} unless someone extends it.",
            params.subject_id,
            format::when(until)
        ));
    }
    PushCaseParams {
        alert,
        case: params,
    }
}

/// The start check of `push_case.json.j2`: the alert beside the card in every status.
pub fn check_templates(templates: &Templates) -> Result<(), RenderError> {
    for full in [true, false] {
        for status in card::STATUSES {
            templates.render(&PushCaseParams {
                alert: sample_failure(full),
                case: card::sample_card(status, full),
            })?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use chrono::{DateTime, Utc};

    use super::*;
    use crate::approvals::render_card;
    use crate::cases::{
        CaseDraft, Decider, Decision, Evidence, Opener, Recommendation, Step, StepRecord,
    };
    use crate::ids::{CaseId, RunId, SandboxId, SlackUserId};
    use crate::slack::render::Templates;

    fn t(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_767_000_000 + secs, 0).unwrap()
    }

    fn failing_case() -> Case {
        let run = RunReport {
            run_id: RunId::parse("run_7f3a9c").unwrap(),
            requester: "github:acme/parser".into(),
            command: "git init ... && pytest -q".into(),
            template: "python-ci".into(),
            exit_code: Some(1),
            duration_ms: 83_000,
            outcome: RunOutcome::ExitedNonZero,
            output_tail: vec![],
            output_bytes: 48_213,
            output_truncated: false,
            profile: None,
        };
        let push = PushReport {
            repository: "acme/parser".into(),
            branch: "main".into(),
            commit: "9f3c2a1d0e8b7c6a5f4e3d2c1b0a99887766554".into(),
            command: "pytest -q".into(),
            commit_url: Some("https://github.com/acme/parser/commit/9f3c2a1".into()),
            message: Some("Parse nested lists\n\nLonger body".into()),
            author: Some(PushPerson {
                name: "Alice".into(),
                slack_user: Some(SlackUserId::parse("U0ALICE").unwrap()),
            }),
            pusher: Some(PushPerson {
                name: "bob-gh".into(),
                slack_user: None,
            }),
            failing: "FAILED tests/test_parser.py::test_nested - AssertionError".into(),
            failing_cut: false,
            output_kept: None,
        };
        let mut case = CaseDraft {
            subject: Subject::Sandbox(SandboxId::parse("ipush1abc").unwrap()),
            evidence: Evidence {
                state: Some("running".into()),
                run: Some(run),
                push: Some(push),
                ..Evidence::default()
            },
            recommendation: Recommendation {
                option: DecisionOption::KeepRunning,
                reason: "the sandbox still holds the failing checkout".into(),
            },
            options: Some(vec![
                DecisionOption::KeepRunning,
                DecisionOption::SnapshotThenKill,
                DecisionOption::Kill,
            ]),
            opener: Opener::Agent {
                name: "github:acme/parser".into(),
            },
            reason: "the tests of acme/parser failed at 9f3c2a1".into(),
            decide_by: t(4 * 3600),
        }
        .into_case(t(0))
        .unwrap();
        case.keep_running_for_secs = Some(3600);
        case.id = CaseId::parse("case_push_fixed").unwrap();
        case.version = 1;
        case
    }

    fn render(case: &Case) -> serde_json::Value {
        serde_json::to_value(render_card(&Templates::embedded(), case).unwrap()).unwrap()
    }

    #[test]
    fn a_pending_push_alert_leads_with_keep_for_debugging_under_a_red_bar() {
        let json = render(&failing_case());
        let bar = &json["attachments"][0];
        assert_eq!(bar["color"], "danger");
        let labels: Vec<&str> = bar["blocks"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|b| b["type"] == "actions")
            .flat_map(|b| b["elements"].as_array().unwrap())
            .map(|b| b["text"]["text"].as_str().unwrap())
            .collect();
        assert_eq!(labels, ["Keep for debugging", "Snapshot for repro", "Kill"]);
        insta::assert_json_snapshot!("push_case_pending", json);
    }

    #[test]
    fn after_keep_for_debugging_the_alert_says_how_to_connect_and_until_when() {
        let mut case = failing_case();
        case.state = CaseState::Done {
            decision: Decision {
                option: DecisionOption::KeepRunning,
                by: Decider::Person(SlackUserId::parse("U0DEV").unwrap()),
                at: t(60),
                reason: None,
            },
            steps: vec![StepRecord {
                step: Step::ExtendTimeout,
                outcome: StepOutcome::KeptRunning {
                    until: t(3660),
                    extended: true,
                },
                at: t(61),
            }],
            at: t(61),
        };
        let json = render(&case);
        let text = json.to_string();
        assert!(text.contains("chose *Keep for debugging*"), "{text}");
        assert!(text.contains("`e2b sandbox connect ipush1abc`"), "{text}");
        assert!(!text.contains("steward e2b connect"), "{text}");
        assert!(
            !text.contains("\"type\":\"actions\""),
            "no buttons once decided: {text}"
        );
        insta::assert_json_snapshot!("push_case_kept_for_debugging", json);
    }
}
