//! The run section of a run case's card: who ran what, how it ended, what it cost, and the last
//! lines of its output, as the operator who decides the sandbox's fate reads them.
//!
//! Pure: turns a [`RunReport`] into template params. Everything in it is cut to fit Slack's
//! limits here, and it carries no links. The command and the template are the agent's text,
//! shown as quoted data; the output is the sandbox's, shown in a code block it cannot close.
use std::time::Duration;

use serde::Serialize;

use crate::cases::{Case, Opener, RunOutcome, RunReport};
use crate::slack::format::{self, human_bytes, human_duration};
use crate::slack::render::{Field, Mrkdwn, SAMPLE_TEXT};

/// How often E2B samples a sandbox's metrics.
const SAMPLE_INTERVAL_MS: u64 = 5_000;

/// The run section of `case_card.json.j2`.
#[derive(Debug, Clone, Serialize)]
pub struct RunCardParams {
    /// `Agent ci-bot ran `cmd` on template `base`.`
    pub summary: Mrkdwn,
    /// `:white_check_mark: Succeeded (exit code 0) after 2 min 5 s.`
    pub outcome: String,
    /// Run id, exit code, duration, output size, CPU, peak memory, disk growth.
    pub fields: Vec<Field>,
    /// `Last 12 lines of output (4 KiB in all)`.
    pub output_heading: String,
    /// The last lines, for a code block; `None` when the run printed nothing.
    pub output: Option<String>,
}

/// Most characters of the command shown (in a code span, on one line).
const COMMAND_MAX_CHARS: usize = 300;
/// Most characters of the template's name shown.
const TEMPLATE_MAX_CHARS: usize = 100;
/// Most characters of one output line shown.
const OUTPUT_LINE_MAX_CHARS: usize = 200;
/// Most characters (escaped) of the output block, well inside a section's 3,000.
const OUTPUT_MAX_CHARS: usize = 2200;

/// How the run ended, for the header: `Run succeeded`, `Run exited with code 1`, ...
pub fn ended(run: &RunReport) -> String {
    match (run.outcome, run.exit_code) {
        (RunOutcome::Succeeded, _) => "Run succeeded".to_owned(),
        (RunOutcome::ExitedNonZero, Some(code)) => format!("Run exited with code {code}"),
        (RunOutcome::ExitedNonZero, None) => "Run was stopped by a signal".to_owned(),
        (RunOutcome::TimedOut, _) => "Run timed out".to_owned(),
        (RunOutcome::Failed, _) => "Run failed".to_owned(),
    }
}

fn took(run: &RunReport) -> String {
    if run.duration_ms < 1000 {
        "under a second".to_owned()
    } else {
        human_duration(Duration::from_millis(run.duration_ms))
    }
}

/// The line under the summary: how it ended and after how long.
fn outcome_line(run: &RunReport) -> String {
    let took = took(run);
    match (run.outcome, run.exit_code) {
        (RunOutcome::Succeeded, _) => {
            format!(":white_check_mark: Succeeded (exit code 0) after {took}.")
        }
        (RunOutcome::ExitedNonZero, Some(code)) => {
            format!(":x: Exited with code {code} after {took}.")
        }
        (RunOutcome::ExitedNonZero, None) => {
            format!(":x: Stopped by a signal after {took}, not by Steward.")
        }
        (RunOutcome::TimedOut, _) => {
            format!(":alarm_clock: Timed out: Steward stopped it after {took}.")
        }
        (RunOutcome::Failed, _) => {
            format!(":warning: Failed before finishing, after {took}; see the output for why.")
        }
    }
}

/// Who ran it: the agent's name (its API token's name), or `steward run` at a terminal.
fn who(case: &Case, run: &RunReport) -> Mrkdwn {
    let name = match &case.opener {
        Opener::Agent { name } => name.as_str(),
        _ => run.requester.as_str(),
    };
    if name == "cli" {
        Mrkdwn::text("Someone at a terminal (`steward run`)")
    } else {
        Mrkdwn::markup("Agent *").and(name).and(Mrkdwn::markup("*"))
    }
}

/// The output's last lines that fit, oldest first, each cut; and how many there are.
fn output_tail(lines: &[String]) -> (Vec<String>, usize) {
    let mut kept = Vec::new();
    let mut used = 0;
    for line in lines.iter().rev() {
        // One line of the block: a carriage return inside it (a progress bar) is shown, not
        // turned into a line the tail did not count.
        let line = format::cut(
            &format::defuse_code_fence(line.trim_end()).replace('\n', "⏎"),
            OUTPUT_LINE_MAX_CHARS,
        );
        let len = format::escaped_len(&line) + 1;
        if used + len > OUTPUT_MAX_CHARS {
            break;
        }
        used += len;
        kept.push(line);
    }
    kept.reverse();
    let count = kept.len();
    (kept, count)
}

fn signed_bytes(growth: i64) -> String {
    match growth {
        0 => "none".to_owned(),
        g if g > 0 => format!("+{}", human_bytes(g.unsigned_abs())),
        g => format!("−{}", human_bytes(g.unsigned_abs())),
    }
}

/// The run section for `case`, whose evidence carries `run`.
pub fn run_params(case: &Case, run: &RunReport) -> RunCardParams {
    let summary = who(case, run)
        .and(Mrkdwn::markup(" ran "))
        .and(Mrkdwn::quoted(&run.command, COMMAND_MAX_CHARS))
        .and(Mrkdwn::markup(" on template "))
        .and(Mrkdwn::quoted(&run.template, TEMPLATE_MAX_CHARS))
        .and(Mrkdwn::markup("."));
    let mut fields = Vec::new();
    let mut push = |key: &str, value: String| {
        fields.push(Field {
            key: key.to_owned(),
            value: Mrkdwn::text(&value),
        })
    };
    push("Run", format!("`{}`", run.run_id));
    push(
        "Exit code",
        match (run.exit_code, run.outcome) {
            (Some(code), _) => code.to_string(),
            (None, RunOutcome::TimedOut) => "none: stopped at its timeout".to_owned(),
            (None, RunOutcome::ExitedNonZero) => "none: killed by a signal".to_owned(),
            (None, _) => "none: it did not finish".to_owned(),
        },
    );
    push("Duration", took(run));
    push(
        "Output",
        if run.output_truncated {
            format!(
                "{} in all, more than Steward keeps",
                human_bytes(run.output_bytes)
            )
        } else if run.output_bytes == 0 {
            "none".to_owned()
        } else {
            human_bytes(run.output_bytes)
        },
    );
    // A run shorter than E2B's sampling interval is usually missed by every sample: saying
    // "0 B peak memory" would read as a measurement.
    let unmeasured = run.duration_ms < SAMPLE_INTERVAL_MS
        && run
            .profile
            .as_ref()
            .is_none_or(|p| p.peak_memory_bytes == 0);
    match &run.profile {
        _ if unmeasured => push(
            "Resource use",
            "too short to measure (E2B samples every 5 s)".to_owned(),
        ),
        Some(p) => {
            push(
                "CPU",
                format!(
                    "p95 {} · max {} ({})",
                    format::percent(p.cpu_p95_pct),
                    format::percent(p.cpu_max_pct),
                    format::count(p.samples, "sample", "samples")
                ),
            );
            push("Peak memory", human_bytes(p.peak_memory_bytes));
            push("Disk growth", signed_bytes(p.disk_growth_bytes));
        }
        None => push(
            "Resource use",
            "no metrics samples were taken during the run".to_owned(),
        ),
    }
    let (lines, shown) = output_tail(&run.output_tail);
    let output_heading = match shown {
        0 => "No output".to_owned(),
        1 => "Last line of output".to_owned(),
        n => format!("Last {n} lines of output"),
    };
    RunCardParams {
        summary,
        outcome: outcome_line(run),
        fields,
        output_heading,
        output: (!lines.is_empty()).then(|| lines.join("\n")),
    }
}

/// A run section made of sample text, for the card's start check (`card::check_templates`).
pub(crate) fn sample_run() -> RunCardParams {
    let s = || SAMPLE_TEXT.to_owned();
    RunCardParams {
        summary: Mrkdwn::text(SAMPLE_TEXT),
        outcome: s(),
        fields: vec![Field {
            key: s(),
            value: Mrkdwn::text(SAMPLE_TEXT),
        }],
        output_heading: s(),
        output: Some(s()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::approvals::card::card_params;
    use crate::approvals::run_case::run_recommendation;
    use crate::cases::{
        CaseDraft, CaseState, Decision, DecisionOption, Evidence, Metrics, RunProfile, Step,
        StepOutcome, StepRecord, Subject,
    };
    use crate::ids::{CaseId, RunId, SandboxId, TemplateId};
    use crate::slack::render::Templates;
    use chrono::{DateTime, Utc};
    use std::collections::BTreeMap;

    fn t(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_767_000_000 + secs, 0).unwrap()
    }

    fn report(outcome: RunOutcome, exit_code: Option<i32>, tail: &[&str]) -> RunReport {
        RunReport {
            run_id: RunId::parse("run_7f3a9c").unwrap(),
            requester: "ci-bot".into(),
            command: "python train.py --epochs 3 && ./report.sh > out.txt".into(),
            template: "python-ml".into(),
            exit_code,
            duration_ms: 125_400,
            outcome,
            output_tail: tail.iter().map(|l| (*l).to_owned()).collect(),
            output_bytes: 18_432,
            output_truncated: false,
            profile: Some(RunProfile {
                samples: 25,
                cpu_p95_pct: 87.5,
                cpu_max_pct: 99.0,
                peak_memory_bytes: 412 * 1024 * 1024,
                disk_growth_bytes: 36 * 1024 * 1024,
            }),
        }
    }

    /// A run case as `open_run_case` builds it, for a sandbox the run left running.
    fn run_case(report: RunReport) -> Case {
        let mut metadata = BTreeMap::new();
        metadata.insert("steward.purpose".to_owned(), "run".to_owned());
        metadata.insert("steward.requester".to_owned(), "ci-bot".to_owned());
        metadata.insert("steward.run".to_owned(), report.run_id.to_string());
        let mut case = CaseDraft {
            subject: Subject::Sandbox(SandboxId::parse("irun1abc").unwrap()),
            evidence: Evidence {
                state: Some("running".into()),
                template: Some(TemplateId::parse("rki5dems9wqfm4r03t7g").unwrap()),
                template_alias: Some("python-ml".into()),
                cpu_count: Some(2),
                memory_mb: Some(1024),
                disk_mb: Some(4096),
                started_at: Some(t(-130)),
                metrics: Some(Metrics {
                    cpu_pct: 2.0,
                    mem_used: 120 * 1024 * 1024,
                    mem_total: 1024 * 1024 * 1024,
                    disk_used: 900 * 1024 * 1024,
                    disk_total: 4096 * 1024 * 1024,
                }),
                metadata,
                run: None,
                ..Evidence::default()
            },
            recommendation: run_recommendation(&report),
            options: Some(DecisionOption::RUN.to_vec()),
            opener: Opener::Agent {
                name: report.requester.clone(),
            },
            reason: format!("run {} ended", report.run_id),
            decide_by: t(4 * 3600),
        }
        .into_case(t(0))
        .unwrap();
        case.evidence.run = Some(report);
        case.keep_running_for_secs = Some(3600);
        case.id = CaseId::parse("case_run_fixed").unwrap();
        case.version = 1;
        case
    }

    fn render(case: &Case) -> serde_json::Value {
        let message = Templates::embedded().render(&card_params(case)).unwrap();
        serde_json::to_value(message).unwrap()
    }

    fn buttons(json: &serde_json::Value) -> Vec<(String, String, Option<String>)> {
        json["blocks"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|b| b["type"] == "actions")
            .flat_map(|b| b["elements"].as_array().unwrap().clone())
            .map(|b| {
                (
                    b["action_id"].as_str().unwrap().to_owned(),
                    b["text"]["text"].as_str().unwrap().to_owned(),
                    b["style"].as_str().map(str::to_owned),
                )
            })
            .collect()
    }

    #[test]
    fn a_succeeded_run_card_recommends_snapshot_then_kill_first_and_shows_the_run() {
        let case = run_case(report(
            RunOutcome::Succeeded,
            Some(0),
            &["epoch 3/3: loss 0.112", "wrote out.txt (3 KiB)"],
        ));
        let json = render(&case);
        let text = json.to_string();
        assert_eq!(
            json["blocks"][0]["text"]["text"],
            "Run succeeded in sandbox irun1abc: what now?"
        );
        assert!(
            text.contains("Agent *ci-bot* ran `python train.py --epochs 3 &amp;&amp; ./report.sh &gt; out.txt` on template `python-ml`."),
            "{text}"
        );
        assert!(text.contains("p95 88 % · max 99 % (25 samples)"), "{text}");
        assert!(text.contains("+36 MiB"), "{text}");
        assert!(text.contains("2 min 5 s"), "{text}");
        assert!(
            text.contains("unanswered, the sandbox is left to its E2B timeout"),
            "{text}"
        );
        assert!(!text.contains("http"), "no links on a run card: {text}");
        assert_eq!(
            buttons(&json),
            [
                (
                    "case_snapshot_then_kill".into(),
                    "Snapshot, then kill".into(),
                    Some("primary".into())
                ),
                (
                    "case_snapshot_and_keep".into(),
                    "Snapshot and keep".into(),
                    None
                ),
                ("case_kill".into(), "Kill".into(), Some("danger".into())),
                (
                    "case_keep_running".into(),
                    "Keep running for 1 h".into(),
                    None
                ),
            ]
        );
        insta::assert_json_snapshot!("run_card_succeeded", json);
    }

    #[test]
    fn a_failed_run_card_shows_the_exit_code_and_the_failing_lines() {
        let case = run_case(report(
            RunOutcome::ExitedNonZero,
            Some(1),
            &[
                "Traceback (most recent call last):",
                "  File \"train.py\", line 42, in <module>",
                "    model.fit(data)",
                "ValueError: shapes (3,) and (4,) not aligned",
            ],
        ));
        let json = render(&case);
        let text = json.to_string();
        assert_eq!(
            json["blocks"][0]["text"]["text"],
            "Run exited with code 1 in sandbox irun1abc: what now?"
        );
        assert!(
            text.contains("ValueError: shapes (3,) and (4,) not aligned```"),
            "{text}"
        );
        assert!(text.contains("Last 4 lines of output"), "{text}");
        assert_eq!(buttons(&json)[0].0, "case_snapshot_and_keep");
        assert_eq!(buttons(&json)[0].2.as_deref(), Some("primary"));
        insta::assert_json_snapshot!("run_card_failed", json);
    }

    #[test]
    fn a_timed_out_run_card_says_steward_stopped_it() {
        let mut run = report(
            RunOutcome::TimedOut,
            None,
            &["step 118 of 500", "step 119 of 500"],
        );
        run.duration_ms = 300_000;
        run.profile = None;
        let json = render(&run_case(run));
        let text = json.to_string();
        assert_eq!(
            json["blocks"][0]["text"]["text"],
            "Run timed out in sandbox irun1abc: what now?"
        );
        assert!(
            text.contains("Timed out: Steward stopped it after 5 min."),
            "{text}"
        );
        assert!(text.contains("none: stopped at its timeout"), "{text}");
        assert!(text.contains("no metrics samples"), "{text}");
        insta::assert_json_snapshot!("run_card_timed_out", json);
    }

    #[test]
    fn a_run_shorter_than_one_metrics_sample_is_not_shown_as_using_nothing() {
        let mut run = report(RunOutcome::Succeeded, Some(0), &["ok"]);
        run.duration_ms = 900;
        if let Some(p) = run.profile.as_mut() {
            p.samples = 1;
            p.peak_memory_bytes = 0;
            p.cpu_p95_pct = 0.0;
            p.cpu_max_pct = 0.0;
        }
        let text = render(&run_case(run.clone())).to_string();
        assert!(
            text.contains("too short to measure (E2B samples every 5 s)"),
            "{text}"
        );
        assert!(!text.contains("Peak memory"), "{text}");
        // A sample that did catch the process is shown as measured.
        if let Some(p) = run.profile.as_mut() {
            p.peak_memory_bytes = 12 * 1024 * 1024;
        }
        let text = render(&run_case(run.clone())).to_string();
        assert!(text.contains("Peak memory"), "{text}");
        assert!(!text.contains("too short to measure"), "{text}");
        // No sample at all: the same words, not "no samples were taken".
        run.profile = None;
        let text = render(&run_case(run)).to_string();
        assert!(
            text.contains("too short to measure (E2B samples every 5 s)"),
            "{text}"
        );
    }

    #[test]
    fn any_amount_of_output_and_any_command_render_within_slacks_limits() {
        let long = "<&>`".repeat(3000);
        let lines: Vec<String> = (0..500).map(|i| format!("{i} {long}")).collect();
        let mut run = report(RunOutcome::Failed, None, &[]);
        run.output_tail = lines;
        run.command = format!("echo ```{long}\nrm -rf /");
        run.output_truncated = true;
        run.output_bytes = 5 * 1024 * 1024;
        // `render` checks every text against Slack's limits; it would fail on length.
        let json = render(&run_case(run));
        let text = json.to_string();
        assert!(text.contains("more than Steward keeps"), "{text}");
        assert!(text.contains("499 "), "the newest line is shown");
        assert!(!text.contains("0 <"), "the oldest are not");
    }

    #[test]
    fn a_kill_by_policy_names_the_policy_not_a_person() {
        let mut case = run_case(report(RunOutcome::Succeeded, Some(0), &["ok"]));
        let decision = Decision {
            option: DecisionOption::Kill,
            by: crate::cases::Decider::Policy {
                policy: "[runs] on_finish = kill_on_success".into(),
            },
            at: t(1),
            reason: None,
        };
        case.state = CaseState::Done {
            decision,
            steps: vec![StepRecord {
                step: Step::Kill,
                outcome: StepOutcome::Killed,
                at: t(2),
            }],
            at: t(2),
        };
        let json = render(&case);
        let text = json.to_string();
        assert!(
            text.contains("Killed by policy ([runs] on_finish = kill_on_success)."),
            "{text}"
        );
        assert_eq!(json["blocks"][0]["text"]["text"], "Sandbox irun1abc killed");
        insta::assert_json_snapshot!("run_card_killed_by_policy", json);
    }

    #[test]
    fn an_unanswered_run_card_says_the_sandbox_is_left_to_its_e2b_timeout() {
        let mut case = run_case(report(RunOutcome::Succeeded, Some(0), &["ok"]));
        case.state = CaseState::Expired { at: t(4 * 3600) };
        let json = render(&case);
        let text = json.to_string();
        assert!(
            text.contains(": the sandbox is left to its E2B timeout."),
            "{text}"
        );
        assert_eq!(
            json["blocks"][0]["text"]["text"],
            "Sandbox irun1abc: no decision, left to its E2B timeout"
        );
    }
}
