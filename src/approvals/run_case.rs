//! The run case: after a governed run, its sandbox is put to a person (or, where `[runs]
//! on_finish` says so, decided by policy) with the run's evidence on the card.
//!
//! [`open_run_case`] reads the sandbox from E2B like a kill case does, adds the [`RunReport`],
//! recommends from how the run ended, posts the card, and for a policy decision records it and
//! queues it for the worker, which re-checks the sandbox before killing it like any other
//! decision. This file must not call a destructive E2B endpoint: only the worker does.
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::{ApprovalError, CardTarget, Services, audit, decide, evidence, post_card};
use crate::cases::{
    Case, CaseDraft, CaseState, DecisionOption, Event, Opener, Recommendation, RunOutcome,
    RunReport, Subject,
};
use crate::e2b::E2bError;
use crate::ids::{SandboxId, SlackChannelId};
use crate::runs::OnFinish;
use crate::store::{Actor, Opened, Updated};

/// What a run case is opened with (from `[runs]` and `[channels] runs`; the caller reads them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunCaseSettings {
    /// Where run cards go; the approvals channel when `None`.
    pub channel: Option<SlackChannelId>,
    /// What "Keep running for…" extends the sandbox's E2B timeout to.
    pub keep_running_for: Duration,
    /// How long the case waits for a decision; unanswered, the sandbox is left to its E2B timeout.
    pub decide_within: Duration,
}

/// The setting as the card and the audit name it.
fn policy_name(on_finish: OnFinish) -> &'static str {
    match on_finish {
        OnFinish::Ask => "[runs] on_finish = ask",
        OnFinish::KillOnSuccess => "[runs] on_finish = kill_on_success",
        OnFinish::Keep => "[runs] on_finish = keep",
    }
}

/// What Steward recommends after a run that ended so, and why (one line on the card).
pub fn run_recommendation(run: &RunReport) -> Recommendation {
    let (option, reason) = match (run.outcome, run.exit_code) {
        (RunOutcome::Succeeded, _) => (
            DecisionOption::SnapshotThenKill,
            "the run succeeded, so a snapshot keeps the environment it ran in and the sandbox stops costing".to_owned(),
        ),
        (RunOutcome::ExitedNonZero, Some(code)) => (
            DecisionOption::SnapshotAndKeep,
            format!("it exited with code {code}, so someone will want to look; paused, it keeps its state"),
        ),
        (RunOutcome::ExitedNonZero, None) => (
            DecisionOption::SnapshotAndKeep,
            "a signal stopped it, so someone will want to look; paused, it keeps its state"
                .to_owned(),
        ),
        (RunOutcome::TimedOut, _) => (
            DecisionOption::SnapshotAndKeep,
            "it timed out, so someone will want to see where it got stuck; paused, it keeps its state".to_owned(),
        ),
        (RunOutcome::Failed, _) => (
            DecisionOption::Kill,
            "the run failed before finishing, so the sandbox holds no result worth keeping"
                .to_owned(),
        ),
    };
    Recommendation { option, reason }
}

/// The option a policy chooses for this run, if it chooses one.
fn policy_decision(on_finish: OnFinish, run: &RunReport) -> Option<DecisionOption> {
    match (on_finish, run.outcome) {
        (OnFinish::Keep, _) => Some(DecisionOption::Leave),
        (OnFinish::KillOnSuccess, RunOutcome::Succeeded) => Some(DecisionOption::Kill),
        _ => None,
    }
}

/// The case Steward opens for a run's sandbox: evidence from E2B plus the run, the run options
/// (or, under `on_finish = keep`, only Leave: the card is for information).
fn run_case_draft(
    sandbox: &SandboxId,
    mut evidence: crate::cases::Evidence,
    report: RunReport,
    on_finish: OnFinish,
    settings: &RunCaseSettings,
    now: DateTime<Utc>,
) -> CaseDraft {
    let (options, recommendation) = match on_finish {
        OnFinish::Keep => (
            vec![DecisionOption::Leave],
            Recommendation {
                option: DecisionOption::Leave,
                reason: format!(
                    "run sandboxes are left to their E2B timeout ({})",
                    policy_name(on_finish)
                ),
            },
        ),
        _ => {
            // A paused sandbox has no timeout running: there is nothing to keep running.
            let paused =
                evidence.state.as_deref() == Some(crate::e2b::SandboxState::Paused.as_str());
            let options = DecisionOption::RUN
                .into_iter()
                .filter(|o| !(paused && *o == DecisionOption::KeepRunning))
                .collect();
            (options, run_recommendation(&report))
        }
    };
    let within = chrono::Duration::from_std(settings.decide_within)
        .unwrap_or_else(|_| chrono::Duration::days(3650));
    let reason = format!("run {} ended", report.run_id);
    let opener = Opener::Agent {
        name: report.requester.clone(),
    };
    evidence.run = Some(report);
    CaseDraft {
        subject: Subject::Sandbox(sandbox.clone()),
        evidence,
        recommendation,
        options: Some(options),
        opener,
        reason,
        decide_by: now
            .checked_add_signed(within)
            .unwrap_or(DateTime::<Utc>::MAX_UTC),
    }
}

/// How many of the subject's latest audit events are searched for a run's own closed case.
const RUN_CASE_AUDIT_LOOKBACK: usize = 50;

/// The case already opened for this sandbox: the open one (whoever opened it), else a closed
/// one opened for this very run (found through the subject's latest `open` audit events), so a
/// run handed over again after its case closed (a policy decision whose card Slack refused)
/// gets its card posted rather than a second case.
async fn run_case_of(
    svc: &Services,
    subject: &Subject,
    run_id: &crate::ids::RunId,
) -> Result<Option<Case>, ApprovalError> {
    if let Some(open) = svc.store.case_for_subject(subject).await? {
        return Ok(Some(open));
    }
    let recent = svc
        .store
        .recent_audit(subject, None, RUN_CASE_AUDIT_LOOKBACK)
        .await?;
    let mut seen = Vec::new();
    for event in recent.events.iter().rev().filter(|e| e.action == "open") {
        let Some(id) = &event.case else { continue };
        if seen.contains(&id) {
            continue;
        }
        seen.push(id);
        let case = svc.store.get_case(id).await?;
        if case.evidence.run.as_ref().map(|r| &r.run_id) == Some(run_id) {
            return Ok(Some(case));
        }
    }
    Ok(None)
}

/// A decision a run case takes by policy as it opens.
#[derive(Debug, Clone)]
pub(super) struct PolicyChoice {
    pub option: DecisionOption,
    /// The setting or rule that decided, as the card and the audit name it.
    pub policy: String,
    /// The audit outcome of the decision.
    pub outcome: String,
}

/// The case [`open_for_run`] opens for a run's sandbox.
pub(super) struct RunCaseOpening<'a> {
    pub sandbox: &'a SandboxId,
    pub run_id: &'a crate::ids::RunId,
    /// What Keep running extends the sandbox's E2B timeout to.
    pub keep_running_for: Option<Duration>,
    /// A decision taken by policy as the case opens.
    pub policy: Option<PolicyChoice>,
    /// Where its card goes; `None`: no card, the case is only in the store and the audit.
    pub card: Option<&'a CardTarget>,
}

/// What [`open_for_run`] opened.
pub(super) struct RunCaseOpened {
    pub case: Case,
    /// Whether this call posted the case's card (so follow-ups in its thread are this call's).
    pub posted: bool,
}

/// Opens the case of the run's sandbox (or finds it: the open case, or this run's earlier
/// one), with the draft `draft` builds from the sandbox's evidence in E2B; takes the opening's
/// policy decision if the case is this run's and still pending (and queues it for the worker,
/// which re-checks the sandbox like for any decision); posts its card if the opening names
/// where. Calling it again for the same run opens nothing new.
pub(super) async fn open_for_run(
    svc: &Services,
    opening: RunCaseOpening<'_>,
    draft: impl FnOnce(crate::cases::Evidence) -> CaseDraft,
    now: DateTime<Utc>,
) -> Result<RunCaseOpened, ApprovalError> {
    let RunCaseOpening {
        sandbox,
        run_id,
        keep_running_for,
        policy,
        card,
    } = opening;
    let subject = Subject::Sandbox(sandbox.clone());
    // Redis first: when it is down, E2B hears nothing.
    let case = match run_case_of(svc, &subject, run_id).await? {
        Some(existing) => existing,
        None => {
            let Some(e2b) = &svc.e2b else {
                return Err(ApprovalError::E2bNotConfigured);
            };
            let evidence = match evidence::sandbox(e2b, sandbox).await {
                Ok(evidence) => evidence,
                Err(E2bError::NotFound { .. }) => {
                    return Err(ApprovalError::Gone(format!("Sandbox {sandbox}")));
                }
                Err(e) => {
                    return Err(ApprovalError::E2b {
                        sentence: crate::execute::sentence(&format!("Sandbox {sandbox}"), &e),
                        transient: e.is_transient(),
                    });
                }
            };
            let mut case = draft(evidence).into_case(now)?;
            case.keep_running_for_secs = keep_running_for.map(|d| d.as_secs());
            match svc.store.open_case(case).await? {
                Opened::Created(case) => {
                    let actor = super::actor_of(&case.opener);
                    audit(&svc.store, &case, actor, "open", &case.reason.clone()).await;
                    case
                }
                Opened::Existing(case) => case,
            }
        }
    };
    // Only this run's own case takes the policy decision; a case some person opened on the
    // sandbox meanwhile stays theirs.
    let ours = case.evidence.run.as_ref().map(|r| &r.run_id) == Some(run_id);
    let mut case = case;
    let mut queue = false;
    if ours
        && case.state == CaseState::Pending
        && let Some(choice) = policy
    {
        let event = Event::DecideByPolicy {
            option: choice.option,
            policy: choice.policy.clone(),
        };
        match svc.store.apply_event(&case.id, event, now).await? {
            Updated::Applied(decided) => {
                audit(
                    &svc.store,
                    &decided,
                    Actor::Steward {
                        part: "runs policy".into(),
                    },
                    &format!("decide:{}", choice.option.as_str()),
                    &choice.outcome,
                )
                .await;
                queue = matches!(decided.state, CaseState::Decided { .. });
                case = decided;
            }
            // Someone (or a replica handing the same run over) decided first.
            Updated::Rejected { current, .. } => case = current,
        }
    }
    let posted = match (&case.card, card) {
        (None, Some(target)) => {
            post_card(&svc.store, &svc.slack, &svc.templates, &case, target).await
        }
        _ => Ok(None),
    };
    // A policy decision is queued even when its card could not be posted: it is recorded, and
    // handing the run over again posts the card.
    if queue {
        decide::queue_decision(svc, &case).await;
    }
    let posted = posted?;
    let by_us = posted.is_some();
    if let Some(posted) = posted {
        case = posted;
    }
    Ok(RunCaseOpened {
        case,
        posted: by_us,
    })
}

/// Opens the run case for `sandbox` after the run `report` describes, posts its card (to
/// `settings.channel`, else the approvals channel) and applies `on_finish`:
///
/// - `Ask` (and `KillOnSuccess` for a run that did not succeed): a person decides;
/// - `KillOnSuccess` for a run that succeeded: the case is decided Kill by policy and queued; the
///   worker re-checks the sandbox before killing it, as for a person's decision;
/// - `Keep`: the card is for information and the case closes as Left ("left to its E2B timeout by
///   policy").
///
/// Calling it again for the same run (a replica that took the run over hands it over again, or
/// the caller retries after a failed card post) returns that run's case, open or closed, and
/// posts its card if that never happened; it never opens a second case for one run.
pub async fn open_run_case(
    svc: &Services,
    sandbox: &SandboxId,
    report: RunReport,
    on_finish: OnFinish,
    settings: &RunCaseSettings,
    now: DateTime<Utc>,
) -> Result<Case, ApprovalError> {
    let policy = policy_decision(on_finish, &report).map(|option| {
        let policy = policy_name(on_finish).to_owned();
        let outcome = match option {
            DecisionOption::Leave => format!("left to its E2B timeout by policy ({policy})"),
            _ => format!("{option} by policy ({policy}): the run succeeded"),
        };
        PolicyChoice {
            option,
            policy,
            outcome,
        }
    });
    open_with_policy(svc, sandbox, report, on_finish, policy, settings, now).await
}

/// The sandbox of a run that failed before its command started holds nothing of the run's:
/// nobody is asked about it. Its run case is decided Kill by rule and queued (the worker
/// re-checks the sandbox first, as for any kill), and the card says so. Safe to call again for
/// the same run, like [`open_run_case`].
pub async fn end_unstarted_run_sandbox(
    svc: &Services,
    sandbox: &SandboxId,
    report: RunReport,
    settings: &RunCaseSettings,
    now: DateTime<Utc>,
) -> Result<Case, ApprovalError> {
    end_run_sandbox_by_rule(svc, sandbox, report, UNSTARTED_RULE, settings, now).await
}

/// The rule the orphan reconciler (`worker::orphans`) ends a run's sandbox by when nothing of
/// its run can be shown or asked about.
pub const ORPHAN_RULE: &str =
    "a run's sandbox whose run cannot be shown holds nothing anyone can decide on";

/// A run's sandbox ended by `rule`: its run case is decided Kill by that rule and queued (the
/// worker re-checks the sandbox first), and the card says so. Safe to call again.
pub async fn end_run_sandbox_by_rule(
    svc: &Services,
    sandbox: &SandboxId,
    report: RunReport,
    rule: &str,
    settings: &RunCaseSettings,
    now: DateTime<Utc>,
) -> Result<Case, ApprovalError> {
    let policy = rule.to_owned();
    let choice = PolicyChoice {
        option: DecisionOption::Kill,
        outcome: format!("kill by rule ({policy})"),
        policy,
    };
    open_with_policy(
        svc,
        sandbox,
        report,
        OnFinish::Ask,
        Some(choice),
        settings,
        now,
    )
    .await
}

/// The rule [`end_unstarted_run_sandbox`] applies, as the card and the audit name it.
pub const UNSTARTED_RULE: &str =
    "a run that failed before its command started leaves nothing in its sandbox";

async fn open_with_policy(
    svc: &Services,
    sandbox: &SandboxId,
    report: RunReport,
    on_finish: OnFinish,
    policy: Option<PolicyChoice>,
    settings: &RunCaseSettings,
    now: DateTime<Utc>,
) -> Result<Case, ApprovalError> {
    let Some(channel) = settings
        .channel
        .clone()
        .or_else(|| svc.approvals_channel.clone())
    else {
        return Err(ApprovalError::NoChannel);
    };
    let target = CardTarget {
        channel,
        thread_ts: None,
    };
    let run_id = report.run_id.clone();
    let opening = RunCaseOpening {
        sandbox,
        run_id: &run_id,
        keep_running_for: Some(settings.keep_running_for),
        policy,
        card: Some(&target),
    };
    let opened = open_for_run(
        svc,
        opening,
        |evidence| run_case_draft(sandbox, evidence, report, on_finish, settings, now),
        now,
    )
    .await?;
    Ok(opened.case)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::RunId;

    fn report(outcome: RunOutcome, exit_code: Option<i32>) -> RunReport {
        RunReport {
            run_id: RunId::parse("run_1").unwrap(),
            requester: "ci-bot".into(),
            command: "python main.py".into(),
            template: "base".into(),
            exit_code,
            duration_ms: 1_000,
            outcome,
            output_tail: vec![],
            output_bytes: 0,
            output_truncated: false,
            profile: None,
        }
    }

    #[test]
    fn the_recommendation_follows_how_the_run_ended() {
        let cases = [
            (
                RunOutcome::Succeeded,
                Some(0),
                DecisionOption::SnapshotThenKill,
            ),
            (
                RunOutcome::ExitedNonZero,
                Some(2),
                DecisionOption::SnapshotAndKeep,
            ),
            (RunOutcome::TimedOut, None, DecisionOption::SnapshotAndKeep),
            (RunOutcome::Failed, None, DecisionOption::Kill),
        ];
        for (outcome, code, expected) in cases {
            assert_eq!(
                run_recommendation(&report(outcome, code)).option,
                expected,
                "{outcome:?}"
            );
        }
    }

    #[test]
    fn only_a_succeeded_run_is_killed_by_kill_on_success_and_keep_always_leaves() {
        let ok = report(RunOutcome::Succeeded, Some(0));
        let failed = report(RunOutcome::ExitedNonZero, Some(1));
        assert_eq!(
            policy_decision(OnFinish::KillOnSuccess, &ok),
            Some(DecisionOption::Kill)
        );
        assert_eq!(policy_decision(OnFinish::KillOnSuccess, &failed), None);
        assert_eq!(policy_decision(OnFinish::Ask, &ok), None);
        assert_eq!(
            policy_decision(OnFinish::Keep, &failed),
            Some(DecisionOption::Leave)
        );
    }

    #[test]
    fn a_hand_over_is_retried_for_a_passing_outage_but_not_for_a_setting_or_a_gone_sandbox() {
        assert!(ApprovalError::StoreUnavailable("down".into()).worth_retrying());
        assert!(
            ApprovalError::E2b {
                sentence: "E2B had a problem on its side (HTTP 503).".into(),
                transient: true
            }
            .worth_retrying()
        );
        assert!(!ApprovalError::NoChannel.worth_retrying());
        assert!(!ApprovalError::Gone("Sandbox x".into()).worth_retrying());
        assert!(!ApprovalError::E2bNotConfigured.worth_retrying());
    }
}
