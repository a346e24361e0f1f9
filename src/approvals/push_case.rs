//! What the end of a push-test run does. The run engine hands every run over; for a run that a
//! GitHub push started (it has a [`PushTest`]), startup calls [`push_run_ended`] instead of the
//! run case:
//!
//! - **failed** (non-zero exit, or stopped at its timeout): the test-failure alert, which is a
//!   case on the run's sandbox (`push_card`): Keep for debugging, Snapshot for repro, Kill;
//!   unanswered, the sandbox is left to its E2B timeout. The whole output follows in the alert's
//!   thread, and the branch remembers the alert so a later pass can say "fixed in" under it;
//! - **passed**: nothing is posted; the sandbox is killed by policy (a case decided by the push
//!   rule and executed by the worker, so the kill is audited like any other); a failing alert of
//!   the branch gets "Fixed in <sha>" in its thread;
//! - **could not run** (no sandbox, the clone failed, the sandbox died): the short error alert
//!   naming the step, never worded or coloured like a test failure; a sandbox it had is killed
//!   by policy;
//! - **superseded** by a newer push: nothing is posted; its sandbox is killed by policy.
//!
//! Killing without a person is right only here: the sandbox was created for this run and holds
//! nothing else. Every kill still goes through a case and the worker (there is no side door).
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::run_case::{PolicyChoice, RunCaseOpening, open_for_run};
use super::{ApprovalError, CardTarget, Services};
use crate::alerts::message::{short_sha, test_failure_params};
use crate::alerts::{self, PostedAlert, Step, TestFailure, TestOutput, TestRunError};
use crate::cases::{
    CaseDraft, DecisionOption, Evidence, Opener, PushPerson, PushReport, Recommendation,
    RunOutcome, RunReport, Subject,
};
use crate::github::{CLONE_FAILED_EXIT_CODE, PushTest};
use crate::ids::{CaseId, SandboxId, SlackChannelId};
use crate::slack::render::{MentionDoneParams, Mrkdwn};
use crate::store::FailingPush;

/// The most output read back from a run's head for the alert's thread (the run engine keeps
/// `[runs] output_cap_bytes` of each end, 1 MiB by default).
const OUTPUT_READ_MAX: u64 = 16 * 1024 * 1024;

/// What push-test alerts are opened with (the caller reads `[channels]` and `[runs]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushCaseSettings {
    /// Where alerts go when the `[[push_tests]]` entry names no channel (`[channels]
    /// engineering`, else the approvals channel).
    pub channel: Option<SlackChannelId>,
    /// What "Keep for debugging" extends the sandbox's E2B timeout to.
    pub keep_for: Duration,
    /// How long the alert waits for a decision; unanswered, the sandbox is left to its E2B timeout.
    pub decide_within: Duration,
}

/// How a push-test run ended, as far as its alert goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PushEnd {
    /// The suite passed.
    Passed,
    /// The suite failed (or was stopped at its timeout).
    Failed,
    /// A newer push to the branch replaced this run (why, e.g. `superseded by <sha>`).
    Superseded(String),
    /// The tests could not run: which step, and why.
    CouldNotRun { step: Step, why: String },
}

/// Sorts a push-test run's end; `stopped_because` is why a newer push asked it to stop. Pure.
pub fn classify(
    report: &RunReport,
    error: Option<&str>,
    had_sandbox: bool,
    stopped_because: Option<String>,
) -> PushEnd {
    if let Some(why) = stopped_because {
        return PushEnd::Superseded(why);
    }
    match (report.outcome, report.exit_code) {
        (RunOutcome::Succeeded, _) => PushEnd::Passed,
        (RunOutcome::ExitedNonZero, Some(CLONE_FAILED_EXIT_CODE)) => PushEnd::CouldNotRun {
            step: Step::Clone,
            why: clone_failure(&report.output_tail),
        },
        (RunOutcome::ExitedNonZero | RunOutcome::TimedOut, _) => PushEnd::Failed,
        (RunOutcome::Failed, _) => PushEnd::CouldNotRun {
            step: if had_sandbox {
                Step::Run
            } else {
                Step::CreateSandbox
            },
            why: error
                .unwrap_or("the run failed without a reason")
                .to_owned(),
        },
    }
}

/// Why the clone failed, from the last lines git printed (the token is already scrubbed from
/// the output by the run engine).
fn clone_failure(tail: &[String]) -> String {
    let lines: Vec<&str> = tail
        .iter()
        .map(|l| l.trim())
        .filter(|l| !l.is_empty())
        .filter(|l| !l.starts_with(crate::github::plan::CLONE_FAILED_MARKER))
        .collect();
    let last: Vec<&str> = lines[lines.len().saturating_sub(3)..].to_vec();
    if last.is_empty() {
        "git could not fetch the pushed commit (it printed nothing)".to_owned()
    } else {
        format!("git could not fetch the pushed commit: {}", last.join(" "))
    }
}

fn people(test: &PushTest) -> (Option<PushPerson>, Option<PushPerson>) {
    let author = test
        .author_name
        .clone()
        .or_else(|| test.author_login.clone())
        .or_else(|| test.author_email.clone())
        .map(|name| PushPerson {
            name,
            slack_user: test.author_slack.clone(),
        });
    let pusher = test.pusher.clone().map(|name| PushPerson {
        name,
        slack_user: test.pusher_slack.clone(),
    });
    (author, pusher)
}

/// The alert channel of `test`: its entry's, else the settings', else approvals.
fn channel_of(
    svc: &Services,
    test: &PushTest,
    settings: &PushCaseSettings,
) -> Result<SlackChannelId, ApprovalError> {
    test.channel
        .as_deref()
        .and_then(|c| SlackChannelId::parse(c).ok())
        .or_else(|| settings.channel.clone())
        .or_else(|| svc.approvals_channel.clone())
        .ok_or(ApprovalError::NoChannel)
}

/// Carries out what the end of push-test run `report` means (see the module doc). `sandbox` is
/// the run's sandbox (if it got one), `error` the run's error. Safe to call again for the same
/// run: the case is found rather than opened twice, and the error alert is posted once.
pub async fn push_run_ended(
    svc: &Services,
    test: &PushTest,
    sandbox: Option<&SandboxId>,
    report: RunReport,
    error: Option<&str>,
    settings: &PushCaseSettings,
    now: DateTime<Utc>,
) -> Result<Option<CaseId>, ApprovalError> {
    // Only a newer push asks a push test to stop.
    let stopped_because = svc.store.run_stop_requested(&report.run_id).await?;
    match classify(&report, error, sandbox.is_some(), stopped_because) {
        PushEnd::Passed => {
            let case = match sandbox {
                Some(sandbox) => {
                    let why = format!("the tests passed at {}", short_sha(&test.after));
                    kill_by_rule(svc, test, sandbox, report, &why, now).await?
                }
                None => None,
            };
            say_fixed(svc, test).await;
            Ok(case)
        }
        PushEnd::Superseded(why) => match sandbox {
            Some(sandbox) => kill_by_rule(svc, test, sandbox, report, &why, now).await,
            None => Ok(None),
        },
        PushEnd::CouldNotRun { step, why } => {
            post_error_once(svc, test, sandbox, step, &why, settings).await?;
            match sandbox {
                Some(sandbox) => {
                    let why = format!("the tests could not run ({})", step.phrase().to_lowercase());
                    kill_by_rule(svc, test, sandbox, report, &why, now).await
                }
                None => Ok(None),
            }
        }
        PushEnd::Failed => match sandbox {
            Some(sandbox) => open_failure(svc, test, sandbox, report, settings, now)
                .await
                .map(Some),
            // A failed suite always had a sandbox; nothing to decide without one.
            None => Ok(None),
        },
    }
}

/// The policy a push test's own sandbox is killed under.
const PUSH_RULE: &str = "push tests: the run's own sandbox holds nothing else";

/// Kills the run's sandbox without asking: a case decided by the push rule, with no card,
/// executed by the worker (which re-checks the sandbox first). `Ok(None)` when the sandbox is
/// already gone.
async fn kill_by_rule(
    svc: &Services,
    test: &PushTest,
    sandbox: &SandboxId,
    report: RunReport,
    why: &str,
    now: DateTime<Utc>,
) -> Result<Option<CaseId>, ApprovalError> {
    let run_id = report.run_id.clone();
    let opener = Opener::Agent {
        name: report.requester.clone(),
    };
    let reason = format!("push test of {} {}: {why}", test.repository, test.branch);
    let draft = |mut evidence: Evidence| {
        evidence.run = Some(report);
        CaseDraft {
            subject: Subject::Sandbox(sandbox.clone()),
            evidence,
            recommendation: Recommendation {
                option: DecisionOption::Kill,
                reason: why.to_owned(),
            },
            options: Some(vec![DecisionOption::Kill]),
            opener,
            reason,
            decide_by: now + chrono::Duration::hours(1),
        }
    };
    let policy = PolicyChoice {
        option: DecisionOption::Kill,
        policy: PUSH_RULE.to_owned(),
        outcome: format!("kill by policy ({PUSH_RULE}): {why}"),
    };
    let opening = RunCaseOpening {
        sandbox,
        run_id: &run_id,
        keep_running_for: None,
        policy: Some(policy),
        card: None,
    };
    match open_for_run(svc, opening, draft, now).await {
        Ok(opened) => Ok(Some(opened.case.id)),
        Err(ApprovalError::Gone(_)) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The run's output as the store keeps it: all of it, or its head and its tail (the real end,
/// where a failing suite's summary is) with the size of what was counted between them.
async fn kept_output(svc: &Services, report: &RunReport) -> Result<TestOutput, ApprovalError> {
    let (head, _) = svc
        .store
        .run_output(&report.run_id, 0, OUTPUT_READ_MAX)
        .await?;
    if !report.output_truncated {
        return Ok(TestOutput::whole(head));
    }
    // The tail is kept to the head's length (both are `[runs] output_cap_bytes`).
    let tail = svc
        .store
        .run_output_tail(&report.run_id, head.len() as u64)
        .await?;
    let left_out = report
        .output_bytes
        .saturating_sub(head.len() as u64 + tail.len() as u64);
    Ok(TestOutput {
        head,
        left_out,
        tail,
    })
}

/// Opens the failure alert: a case on the run's sandbox whose card is the alert, then the whole
/// output in its thread, and remembers it as the branch's failing alert.
async fn open_failure(
    svc: &Services,
    test: &PushTest,
    sandbox: &SandboxId,
    report: RunReport,
    settings: &PushCaseSettings,
    now: DateTime<Utc>,
) -> Result<CaseId, ApprovalError> {
    let target = CardTarget {
        channel: channel_of(svc, test, settings)?,
        thread_ts: None,
    };
    let run_id = report.run_id.clone();
    let output = kept_output(svc, &report).await?;
    let (author, pusher) = people(test);
    let failure = TestFailure {
        repository: test.repository.clone(),
        branch: test.branch.clone(),
        commit_sha: test.after.clone(),
        commit_url: test.commit_url.clone(),
        commit_message: test.message.clone(),
        pusher: pusher.as_ref().map(super::push_card::person),
        author: author.as_ref().map(super::push_card::person),
        command: test.command.clone(),
        exit_code: super::push_card::shown_exit_code(&report),
        duration: Some(Duration::from_millis(report.duration_ms)),
        output,
        sandbox_id: Some(sandbox.clone()),
    };
    let picked = test_failure_params(&failure);
    let push = PushReport {
        repository: test.repository.clone(),
        branch: test.branch.clone(),
        commit: test.after.clone(),
        command: test.command.clone(),
        commit_url: test.commit_url.clone(),
        message: test.message.clone(),
        author,
        pusher,
        failing: picked.failing,
        failing_cut: picked.cut,
        output_kept: picked.output_kept,
    };
    let timed_out = report.outcome == RunOutcome::TimedOut;
    let within = chrono::Duration::from_std(settings.decide_within)
        .unwrap_or_else(|_| chrono::Duration::days(3650));
    let opener = Opener::Agent {
        name: report.requester.clone(),
    };
    let reason = format!(
        "the tests of {} failed at {}",
        test.repository,
        short_sha(&test.after)
    );
    let keep_for = crate::slack::format::human_duration(settings.keep_for);
    let draft = |mut evidence: Evidence| {
        evidence.run = Some(report);
        evidence.push = Some(push);
        CaseDraft {
            subject: Subject::Sandbox(sandbox.clone()),
            evidence,
            recommendation: Recommendation {
                option: DecisionOption::KeepRunning,
                reason: if timed_out {
                    format!(
                        "Steward stopped the tests at their timeout (exit code 124), so something hangs; kept {keep_for} more, someone can connect and see where"
                    )
                } else {
                    format!(
                        "the sandbox still holds the failing checkout; kept {keep_for} more, someone can connect and look"
                    )
                },
            },
            options: Some(vec![
                DecisionOption::KeepRunning,
                DecisionOption::SnapshotThenKill,
                DecisionOption::Kill,
            ]),
            opener,
            reason,
            decide_by: now
                .checked_add_signed(within)
                .unwrap_or(DateTime::<Utc>::MAX_UTC),
        }
    };
    let opening = RunCaseOpening {
        sandbox,
        run_id: &run_id,
        keep_running_for: Some(settings.keep_for),
        policy: None,
        card: Some(&target),
    };
    let opened = open_for_run(svc, opening, draft, now).await?;
    let case = opened.case;
    if let (true, Some(card)) = (opened.posted, &case.card) {
        let posted = PostedAlert {
            channel: card.channel.clone(),
            ts: card.ts.clone(),
            output_file: None,
        };
        alerts::attach_output(&svc.slack, &posted, &failure).await;
        let failing = FailingPush {
            run_id: run_id.clone(),
            commit: test.after.clone(),
            channel: card.channel.clone(),
            ts: card.ts.clone(),
        };
        if let Err(e) = svc
            .store
            .set_push_failing(&test.repository, &test.branch, &failing)
            .await
        {
            tracing::warn!(error = %e, "could not remember the failing alert; a later pass will not say it is fixed");
        }
    }
    Ok(case.id)
}

/// Posts the error alert of a test run that could not happen, once per run.
async fn post_error_once(
    svc: &Services,
    test: &PushTest,
    sandbox: Option<&SandboxId>,
    step: Step,
    why: &str,
    settings: &PushCaseSettings,
) -> Result<(), ApprovalError> {
    let channel = channel_of(svc, test, settings)?;
    let mark = format!("push-error-alert:{}", test.run_id);
    if !svc
        .store
        .first_time(&mark, crate::store::push_tests::DELIVERY_RETENTION)
        .await?
    {
        return Ok(());
    }
    let error = TestRunError {
        repository: test.repository.clone(),
        branch: test.branch.clone(),
        commit_sha: test.after.clone(),
        commit_url: test.commit_url.clone(),
        step,
        why: why.to_owned(),
        sandbox_id: sandbox.cloned(),
    };
    match alerts::post_error(&svc.slack, &svc.templates, &channel, &error).await {
        Ok(_) => Ok(()),
        Err(e) => {
            // Forget the mark, so the hand-over's retry posts it.
            if let Err(forget) = svc.store.forget_first_time(&mark).await {
                tracing::warn!(error = %forget, "could not forget the error alert's mark");
            }
            match e {
                alerts::AlertError::Slack(e) => Err(ApprovalError::Slack(e)),
                alerts::AlertError::Render(e) => Err(ApprovalError::Render(e.to_string())),
            }
        }
    }
}

/// After a pass: "Fixed in <sha>" in the thread of the branch's failing alert, if it has one.
/// Best effort: a failure is logged and the alert stays remembered for the next pass.
async fn say_fixed(svc: &Services, test: &PushTest) {
    let failing = match svc.store.push_failing(&test.repository, &test.branch).await {
        Ok(Some(failing)) => failing,
        Ok(None) => return,
        Err(e) => {
            tracing::warn!(error = %e, "could not read the branch's failing alert");
            return;
        }
    };
    let short = short_sha(&test.after);
    let commit = match test.commit_url.as_deref() {
        Some(url) => Mrkdwn::link(url, &short),
        None => Mrkdwn::text(&short),
    };
    let mut headline = Mrkdwn::text("Fixed in ").and(commit);
    if let Some(user) = test.author_slack.as_ref().or(test.pusher_slack.as_ref()) {
        headline = headline.and(" by ").and(Mrkdwn::user(user));
    }
    let params = MentionDoneParams {
        headline: headline.and(format!(": the tests of {} pass again.", test.branch)),
        details: Some(format!(
            "They failed at {} (the alert above).",
            short_sha(&failing.commit)
        )),
    };
    let message = match svc.templates.render(&params) {
        Ok(message) => message,
        Err(e) => {
            tracing::error!(error = %e, "could not render the fixed-in reply");
            return;
        }
    };
    match svc
        .slack
        .post_message_in_thread(&failing.channel, Some(&failing.ts), message)
        .await
    {
        Ok(_) => {
            if let Err(e) = svc
                .store
                .clear_push_failing(&test.repository, &test.branch)
                .await
            {
                tracing::warn!(error = %e, "could not forget the fixed alert");
            }
        }
        Err(e) => tracing::warn!(error = %e, "could not say the tests pass again"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::RunId;

    fn report(outcome: RunOutcome, exit_code: Option<i32>, tail: &[&str]) -> RunReport {
        RunReport {
            run_id: RunId::parse("run_1").unwrap(),
            requester: "github:acme/api".into(),
            command: "git fetch ...".into(),
            template: "base".into(),
            exit_code,
            duration_ms: 1_000,
            outcome,
            output_tail: tail.iter().map(|s| s.to_string()).collect(),
            output_bytes: 0,
            output_truncated: false,
            profile: None,
        }
    }

    #[test]
    fn a_run_ends_as_pass_failure_error_or_superseded() {
        let ok = report(RunOutcome::Succeeded, Some(0), &[]);
        assert_eq!(classify(&ok, None, true, None), PushEnd::Passed);
        let failed = report(RunOutcome::ExitedNonZero, Some(101), &[]);
        assert_eq!(classify(&failed, None, true, None), PushEnd::Failed);
        let timed_out = report(RunOutcome::TimedOut, None, &[]);
        assert_eq!(classify(&timed_out, None, true, None), PushEnd::Failed);
        assert_eq!(
            classify(&failed, None, true, Some("abc".into())),
            PushEnd::Superseded("abc".into())
        );
        let no_sandbox = report(RunOutcome::Failed, None, &[]);
        assert_eq!(
            classify(&no_sandbox, Some("template `x` not found"), false, None),
            PushEnd::CouldNotRun {
                step: Step::CreateSandbox,
                why: "template `x` not found".into()
            }
        );
        let died = classify(
            &no_sandbox,
            Some("the sandbox stopped answering"),
            true,
            None,
        );
        assert!(matches!(
            died,
            PushEnd::CouldNotRun {
                step: Step::Run,
                ..
            }
        ));
    }

    #[test]
    fn a_clone_failure_is_an_error_that_quotes_git() {
        let tail = [
            "fatal: repository 'https://github.com/acme/api.git/' not found",
            "steward: could not fetch commit 0123456789abcdef0123456789abcdef01234567",
        ];
        let clone = report(
            RunOutcome::ExitedNonZero,
            Some(CLONE_FAILED_EXIT_CODE),
            &tail,
        );
        let PushEnd::CouldNotRun { step, why } = classify(&clone, None, true, None) else {
            panic!("a clone failure is not a test failure");
        };
        assert_eq!(step, Step::Clone);
        assert!(
            why.contains("repository 'https://github.com/acme/api.git/' not found"),
            "{why}"
        );
        assert!(!why.contains("steward: could not fetch"), "{why}");
    }
}
