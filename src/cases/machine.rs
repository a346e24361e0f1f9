//! The case life cycle as one pure function: `apply(case, event, now)`.
//!
//! ```text
//! Pending ──Decide / DecideByPolicy(action)──▶ Decided ──StartExecuting──▶ Executing ──StepDone*──▶ Executing ──Finish──▶ Done
//!    │  └─Decide(Leave/Keep)─▶ Left          │                      │
//!    └──Expire (after decide_by)─▶ Expired   └──────Fail────────────┴──▶ Failed ──Retry──▶ Decided
//! Decided/Executing ──EvidenceChanged──▶ Pending (fresh evidence, a note, a new deadline);
//!    an item of a list decision (no card to ask on) is Left by Steward instead
//! Decided/Executing ──TransientFailure──▶ same state, `retrying` counts the step's failures
//! Pending ──EndedOutside (E2B: killed elsewhere)──▶ EndedOutside; Pending ──Observed──▶ Pending (a note)
//! Done (Snapshot, then kill) ──OfferRestore──▶ restore offered ──RequestRestore──▶ requested
//!    ──Restored / RestoreFailed (offered again)──▶ …; CloseRestore after its `until`
//! restored (window open) ──KeepRestoredLonger──▶ restored, with a later `ends_at`
//! ```
//! Everything else is a [`TransitionError`] and leaves the case as it was. This file must stay
//! free of I/O and clock reads: `now` is a parameter so tests fix it.
use chrono::{DateTime, Utc};

use super::steps::{Step, StepOutcome, StepRecord, remaining_steps};
use super::{
    Case, CaseState, Decider, Decision, DecisionOption, Evidence, Note, Restore, RestoreRequest,
    Retrying,
};
use crate::ids::{SandboxId, SlackUserId, TemplateId};

/// Something that happens to a case.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A person chose an option. `until` is only for Leave/Keep ("ask again after ...").
    /// Authorization ([`super::may_decide`]) is checked by the caller before this.
    Decide {
        option: DecisionOption,
        by: SlackUserId,
        reason: Option<String>,
        until: Option<DateTime<Utc>>,
    },
    /// A setting of `steward.toml` chose an option (a run's `[runs] on_finish`): recorded like a
    /// person's decision, with `policy` (e.g. `[runs] on_finish = kill_on_success`) as decider.
    /// The caller has checked the policy applies; no approver rule is involved.
    DecideByPolicy {
        option: DecisionOption,
        policy: String,
    },
    /// The deadline passed with no decision.
    Expire,
    /// The subject ended outside Steward (an E2B lifecycle event) while the case waited.
    EndedOutside { what: String },
    /// Something happened to the subject outside Steward while the case waited (an E2B
    /// lifecycle event: paused, resumed, a new timeout): the card gets `note` and, when given,
    /// the state E2B now reports. The case keeps waiting.
    Observed { note: String, state: Option<String> },
    /// A worker starts (or, after a crash, takes over) running the decision.
    StartExecuting,
    /// A worker finished one step of the plan.
    StepDone { step: Step, outcome: StepOutcome },
    /// A worker finished the whole plan.
    Finish,
    /// A step failed in a way a retry will not fix by itself.
    Fail { error: String },
    /// A person asked to try a failed case again.
    Retry { by: SlackUserId },
    /// A step failed in a way that may pass (E2B briefly unavailable): the job will be tried
    /// again. Counted per attempt and step in [`Case::retrying`].
    TransientFailure { step: Step, error: String },
    /// The worker found the subject changed since the card was posted: ask again.
    EvidenceChanged {
        evidence: Box<Evidence>,
        note: String,
        decide_by: DateTime<Utc>,
    },
    /// A Snapshot, then kill finished with `snapshot`: Restore is offered until `until`.
    OfferRestore {
        snapshot: TemplateId,
        until: DateTime<Utc>,
        /// How long the sandbox had left when it was snapshotted, in seconds, if known.
        life_left_secs: Option<u64>,
    },
    /// A person asked for the sandbox back from its snapshot.
    RequestRestore { by: SlackUserId },
    /// E2B started `sandbox` from the snapshot; it ends at `ends_at` unless kept longer.
    Restored {
        sandbox: SandboxId,
        ends_at: Option<DateTime<Utc>>,
    },
    /// `by` kept the restored sandbox longer: E2B now ends it at `until`.
    KeepRestoredLonger {
        by: SlackUserId,
        until: DateTime<Utc>,
    },
    /// Starting it failed for good; Restore is offered again while the window is open.
    RestoreFailed { error: String },
    /// The restore window passed.
    CloseRestore,
}

impl Event {
    /// A short verb for messages.
    pub fn name(&self) -> &'static str {
        match self {
            Event::Decide { .. } | Event::DecideByPolicy { .. } => "decide",
            Event::Expire => "expire",
            Event::EndedOutside { .. } => "close",
            Event::Observed { .. } => "note on",
            Event::StartExecuting => "start executing",
            Event::StepDone { .. } => "record a step of",
            Event::Finish => "finish",
            Event::Fail { .. } => "fail",
            Event::Retry { .. } => "retry",
            Event::EvidenceChanged { .. } => "refresh the evidence of",
            Event::TransientFailure { .. } => "count a transient failure of",
            Event::OfferRestore { .. } => "offer a restore of",
            Event::RequestRestore { .. } => "restore",
            Event::Restored { .. } | Event::RestoreFailed { .. } => "record the restore of",
            Event::KeepRestoredLonger { .. } => "keep the restored sandbox of",
            Event::CloseRestore => "close the restore window of",
        }
    }
}

/// Why an event does not apply to a case. Nothing changes when this is returned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransitionError {
    #[error("cannot {event} a case that is {state}")]
    Illegal {
        event: &'static str,
        state: &'static str,
    },
    #[error("the decision deadline ({decide_by}) has passed")]
    DeadlinePassed { decide_by: DateTime<Utc> },
    #[error("the case is not due to expire before {decide_by}")]
    NotDueYet { decide_by: DateTime<Utc> },
    #[error("{option} is not one of this case's options")]
    OptionNotOffered { option: DecisionOption },
    #[error("only Leave or Keep take an 'until' date, not {option}")]
    UntilOnlyForLeave { option: DecisionOption },
    #[error("the 'until' date {until} is not in the future")]
    UntilNotInFuture { until: DateTime<Utc> },
    #[error("step {} was already recorded", .step.as_str())]
    StepAlreadyRecorded { step: Step },
    #[error("step {} is not the next step (expected {expected:?})", .step.as_str())]
    StepNotExpected { step: Step, expected: Option<Step> },
    #[error("cannot finish: steps {remaining:?} have not run")]
    StepsRemaining { remaining: Vec<Step> },
    #[error("the new decision deadline ({decide_by}) is not in the future")]
    DeadlineNotInFuture { decide_by: DateTime<Utc> },
    #[error("the restore window closed at {until}")]
    RestoreWindowClosed { until: DateTime<Utc> },
}

/// The restore events, which never change [`Case::state`]: only a case Done by Snapshot, then
/// kill has a restore window. `Err(None)` is an illegal move.
fn apply_restore(
    case: &Case,
    event: Event,
    now: DateTime<Utc>,
) -> Result<Case, Option<TransitionError>> {
    let CaseState::Done { decision, .. } = &case.state else {
        return Err(Some(TransitionError::Illegal {
            event: event.name(),
            state: case.state.name(),
        }));
    };
    if decision.option != DecisionOption::SnapshotThenKill {
        return Err(Some(TransitionError::Illegal {
            event: event.name(),
            state: "done without a snapshot",
        }));
    }
    let illegal = || {
        Some(TransitionError::Illegal {
            event: event.name(),
            state: "in another stage of its restore",
        })
    };
    let mut next = case.clone();
    match (&case.restore, &event) {
        (
            None,
            Event::OfferRestore {
                snapshot,
                until,
                life_left_secs,
            },
        ) => {
            next.restore = Some(Restore {
                snapshot: snapshot.clone(),
                until: *until,
                closed: false,
                life_left_secs: *life_left_secs,
                request: None,
            });
        }
        (Some(r), Event::RequestRestore { by }) if r.offered() => {
            if now >= r.until {
                return Err(Some(TransitionError::RestoreWindowClosed {
                    until: r.until,
                }));
            }
            let mut r = r.clone();
            r.request = Some(RestoreRequest {
                by: by.clone(),
                at: now,
                sandbox: None,
                error: None,
                ends_at: None,
                kept_by: None,
            });
            next.restore = Some(r);
        }
        (Some(r), Event::Restored { sandbox, ends_at })
            if r.request.as_ref().is_some_and(|q| q.sandbox.is_none()) =>
        {
            let mut r = r.clone();
            if let Some(q) = r.request.as_mut() {
                q.sandbox = Some(sandbox.clone());
                q.error = None;
                q.ends_at = *ends_at;
            }
            next.restore = Some(r);
        }
        (Some(r), Event::KeepRestoredLonger { by, until }) if r.keep_longer_offered() => {
            let mut r = r.clone();
            if let Some(q) = r.request.as_mut() {
                q.ends_at = Some(*until);
                q.kept_by = Some(by.clone());
            }
            next.restore = Some(r);
        }
        (Some(r), Event::RestoreFailed { error })
            if r.request.as_ref().is_some_and(|q| q.sandbox.is_none()) =>
        {
            let mut r = r.clone();
            if let Some(q) = r.request.as_mut() {
                q.error = Some(error.clone());
            }
            next.restore = Some(r);
        }
        (Some(r), Event::CloseRestore) if !r.closed => {
            if now < r.until {
                return Err(Some(TransitionError::NotDueYet { decide_by: r.until }));
            }
            let mut r = r.clone();
            r.closed = true;
            next.restore = Some(r);
        }
        _ => return Err(illegal()),
    }
    Ok(next)
}

/// Applies `event` to `case` at time `now`, returning the next case. `version` is untouched.
pub fn apply(case: &Case, event: Event, now: DateTime<Utc>) -> Result<Case, TransitionError> {
    let illegal = |event: &Event| TransitionError::Illegal {
        event: event.name(),
        state: case.state.name(),
    };
    if matches!(
        event,
        Event::OfferRestore { .. }
            | Event::RequestRestore { .. }
            | Event::Restored { .. }
            | Event::KeepRestoredLonger { .. }
            | Event::RestoreFailed { .. }
            | Event::CloseRestore
    ) {
        return apply_restore(case, event, now).map_err(|e| match e {
            None => illegal(&Event::CloseRestore),
            Some(e) => e,
        });
    }
    let mut next = case.clone();
    next.state = match (&case.state, event) {
        (
            CaseState::Pending,
            Event::Decide {
                option,
                by,
                reason,
                until,
            },
        ) => decide(case, option, Decider::Person(by), reason, until, now)?,

        (CaseState::Pending, Event::DecideByPolicy { option, policy }) => {
            decide(case, option, Decider::Policy { policy }, None, None, now)?
        }

        (CaseState::Pending, Event::Expire) => {
            if now < case.decide_by {
                return Err(TransitionError::NotDueYet {
                    decide_by: case.decide_by,
                });
            }
            CaseState::Expired { at: now }
        }

        (CaseState::Pending, Event::EndedOutside { what }) => {
            CaseState::EndedOutside { what, at: now }
        }

        (CaseState::Pending, Event::Observed { note, state }) => {
            next.notes.push(Note {
                at: now,
                text: note,
            });
            if let Some(state) = state {
                next.evidence.state = Some(state);
            }
            CaseState::Pending
        }

        (
            CaseState::Decided {
                decision,
                attempt,
                steps,
            }
            | CaseState::Executing {
                decision,
                attempt,
                steps,
            },
            Event::StartExecuting,
        ) => CaseState::Executing {
            decision: decision.clone(),
            attempt: *attempt,
            steps: steps.clone(),
        },

        (
            CaseState::Executing {
                decision,
                attempt,
                steps,
            },
            Event::StepDone { step, outcome },
        ) => {
            if steps.iter().any(|r| r.step == step) {
                return Err(TransitionError::StepAlreadyRecorded { step });
            }
            let expected = remaining_steps(decision.option, steps).first().copied();
            if expected != Some(step) {
                return Err(TransitionError::StepNotExpected { step, expected });
            }
            let mut steps = steps.clone();
            steps.push(StepRecord {
                step,
                outcome,
                at: now,
            });
            next.retrying = None;
            CaseState::Executing {
                decision: decision.clone(),
                attempt: *attempt,
                steps,
            }
        }

        (
            CaseState::Executing {
                decision, steps, ..
            },
            Event::Finish,
        ) => {
            let remaining = remaining_steps(decision.option, steps);
            if !remaining.is_empty() {
                return Err(TransitionError::StepsRemaining { remaining });
            }
            next.retrying = None;
            CaseState::Done {
                decision: decision.clone(),
                steps: steps.clone(),
                at: now,
            }
        }

        (
            CaseState::Decided {
                decision,
                attempt,
                steps,
            }
            | CaseState::Executing {
                decision,
                attempt,
                steps,
            },
            Event::Fail { error },
        ) => CaseState::Failed {
            decision: decision.clone(),
            attempt: *attempt,
            steps: steps.clone(),
            error,
            at: now,
        },

        // The steps finished before the failure stay, so the retry resumes after them.
        (
            CaseState::Failed {
                decision,
                attempt,
                steps,
                ..
            },
            Event::Retry { .. },
        ) => CaseState::Decided {
            decision: decision.clone(),
            attempt: attempt + 1,
            steps: steps.clone(),
        },

        (
            CaseState::Decided { .. } | CaseState::Executing { .. },
            Event::EvidenceChanged {
                evidence,
                note,
                decide_by,
            },
        ) => {
            if decide_by <= now {
                return Err(TransitionError::DeadlineNotInFuture { decide_by });
            }
            next.evidence = *evidence;
            next.retrying = None;
            next.notes.push(Note {
                at: now,
                text: note.clone(),
            });
            if next.list.is_some() {
                // An item of a list decision has no card to ask on: it is left alone, and the
                // next sweep judges it afresh (the mark ends now, so it is not exempt).
                CaseState::Left {
                    option: DecisionOption::Leave,
                    by: Decider::Policy {
                        policy: "the list's re-check before acting".into(),
                    },
                    reason: Some(note),
                    until: Some(now),
                    at: now,
                }
            } else {
                next.decide_by = decide_by;
                CaseState::Pending
            }
        }

        (
            CaseState::Decided { attempt, .. } | CaseState::Executing { attempt, .. },
            Event::TransientFailure { step, error },
        ) => {
            let failures = match &case.retrying {
                Some(r) if r.attempt == *attempt && r.step == step => r.failures + 1,
                _ => 1,
            };
            next.retrying = Some(Retrying {
                attempt: *attempt,
                step,
                failures,
                last_error: error,
                at: now,
            });
            case.state.clone()
        }

        (_, event) => return Err(illegal(&event)),
    };
    Ok(next)
}

fn decide(
    case: &Case,
    option: DecisionOption,
    by: Decider,
    reason: Option<String>,
    until: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> Result<CaseState, TransitionError> {
    // A decision that arrives after the deadline is refused even if no sweep has expired the
    // case yet: "expired" must mean "nothing is done", whatever the timing of the sweep.
    if now >= case.decide_by {
        return Err(TransitionError::DeadlinePassed {
            decide_by: case.decide_by,
        });
    }
    if !case.options.contains(&option) {
        return Err(TransitionError::OptionNotOffered { option });
    }
    let reason = reason
        .map(|r| r.trim().to_owned())
        .filter(|r| !r.is_empty());
    if option.is_leave() {
        if let Some(until) = until
            && until <= now
        {
            return Err(TransitionError::UntilNotInFuture { until });
        }
        return Ok(CaseState::Left {
            option,
            by,
            reason,
            until,
            at: now,
        });
    }
    if until.is_some() {
        return Err(TransitionError::UntilOnlyForLeave { option });
    }
    Ok(CaseState::Decided {
        decision: Decision {
            option,
            by,
            at: now,
            reason,
        },
        attempt: 1,
        steps: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cases::{CaseDraft, Opener, Recommendation, Subject};
    use crate::ids::{SandboxId, TemplateId};

    fn t(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(secs, 0).unwrap()
    }

    /// Opened at t(0), due at t(100).
    fn pending() -> Case {
        CaseDraft {
            subject: Subject::Sandbox(SandboxId::parse("sbx1").unwrap()),
            evidence: Evidence::default(),
            recommendation: Recommendation {
                option: DecisionOption::SnapshotThenKill,
                reason: "idle".into(),
            },
            options: None,
            opener: Opener::Sweep,
            reason: "idle for days".into(),
            decide_by: t(100),
        }
        .into_case(t(0))
        .unwrap()
    }

    fn alice() -> SlackUserId {
        SlackUserId::parse("UALICE").unwrap()
    }

    fn decision(option: DecisionOption) -> Decision {
        Decision {
            option,
            by: alice().into(),
            at: t(10),
            reason: None,
        }
    }

    fn snap_id() -> TemplateId {
        TemplateId::parse("team/snap:1").unwrap()
    }

    fn snapshot_done(at: i64) -> StepRecord {
        StepRecord {
            step: Step::Snapshot,
            outcome: StepOutcome::SnapshotCreated {
                snapshot_id: snap_id(),
                life_left_secs: None,
            },
            at: t(at),
        }
    }

    fn in_state(state: CaseState) -> Case {
        Case { state, ..pending() }
    }

    fn decided() -> CaseState {
        CaseState::Decided {
            decision: decision(DecisionOption::SnapshotThenKill),
            attempt: 1,
            steps: vec![],
        }
    }

    fn executing(steps: Vec<StepRecord>) -> CaseState {
        CaseState::Executing {
            decision: decision(DecisionOption::SnapshotThenKill),
            attempt: 1,
            steps,
        }
    }

    fn failed() -> CaseState {
        CaseState::Failed {
            decision: decision(DecisionOption::SnapshotThenKill),
            attempt: 1,
            steps: vec![snapshot_done(20)],
            error: "E2B said 500".into(),
            at: t(30),
        }
    }

    fn done() -> CaseState {
        CaseState::Done {
            decision: decision(DecisionOption::Kill),
            steps: vec![],
            at: t(30),
        }
    }

    fn expired() -> CaseState {
        CaseState::Expired { at: t(100) }
    }

    fn left() -> CaseState {
        CaseState::Left {
            option: DecisionOption::Leave,
            by: alice().into(),
            reason: None,
            until: None,
            at: t(10),
        }
    }

    fn decide(option: DecisionOption) -> Event {
        Event::Decide {
            option,
            by: alice(),
            reason: None,
            until: None,
        }
    }

    fn refreshed() -> Event {
        Event::EvidenceChanged {
            evidence: Box::new(Evidence {
                state: Some("running".into()),
                ..Evidence::default()
            }),
            note: "it is active again".into(),
            decide_by: t(200),
        }
    }

    /// Applies `event` to a case in `state` at `now` and compares the resulting state.
    fn check(
        state: CaseState,
        event: Event,
        now: i64,
        expected: Result<CaseState, TransitionError>,
    ) {
        let case = in_state(state);
        let got = apply(&case, event, t(now)).map(|c| c.state);
        assert_eq!(got, expected);
    }

    #[test]
    fn deciding_an_action_on_a_pending_case_records_the_decision() {
        check(
            CaseState::Pending,
            decide(DecisionOption::Kill),
            10,
            Ok(CaseState::Decided {
                decision: decision(DecisionOption::Kill),
                attempt: 1,
                steps: vec![],
            }),
        );
    }

    #[test]
    fn deciding_leave_closes_the_case_as_left_with_its_until_date() {
        check(
            CaseState::Pending,
            Event::Decide {
                option: DecisionOption::Leave,
                by: alice(),
                reason: Some("  demo tomorrow ".into()),
                until: Some(t(500)),
            },
            10,
            Ok(CaseState::Left {
                option: DecisionOption::Leave,
                by: alice().into(),
                reason: Some("demo tomorrow".into()),
                until: Some(t(500)),
                at: t(10),
            }),
        );
    }

    #[test]
    fn leave_with_an_until_date_in_the_past_is_refused() {
        check(
            CaseState::Pending,
            Event::Decide {
                option: DecisionOption::Leave,
                by: alice(),
                reason: None,
                until: Some(t(5)),
            },
            10,
            Err(TransitionError::UntilNotInFuture { until: t(5) }),
        );
    }

    #[test]
    fn an_until_date_on_a_kill_is_refused() {
        check(
            CaseState::Pending,
            Event::Decide {
                option: DecisionOption::Kill,
                by: alice(),
                reason: None,
                until: Some(t(500)),
            },
            10,
            Err(TransitionError::UntilOnlyForLeave {
                option: DecisionOption::Kill,
            }),
        );
    }

    #[test]
    fn deciding_an_option_the_case_does_not_offer_is_refused() {
        check(
            CaseState::Pending,
            decide(DecisionOption::DeleteTemplate),
            10,
            Err(TransitionError::OptionNotOffered {
                option: DecisionOption::DeleteTemplate,
            }),
        );
    }

    #[test]
    fn deciding_after_the_deadline_is_refused_even_before_the_case_is_expired() {
        check(
            CaseState::Pending,
            decide(DecisionOption::Kill),
            100,
            Err(TransitionError::DeadlinePassed { decide_by: t(100) }),
        );
    }

    #[test]
    fn a_pending_case_expires_at_its_deadline_but_not_before() {
        check(
            CaseState::Pending,
            Event::Expire,
            100,
            Ok(CaseState::Expired { at: t(100) }),
        );
        check(
            CaseState::Pending,
            Event::Expire,
            99,
            Err(TransitionError::NotDueYet { decide_by: t(100) }),
        );
    }

    #[test]
    fn a_decided_case_starts_executing_and_a_takeover_keeps_its_steps() {
        check(decided(), Event::StartExecuting, 20, Ok(executing(vec![])));
        check(
            executing(vec![snapshot_done(20)]),
            Event::StartExecuting,
            25,
            Ok(executing(vec![snapshot_done(20)])),
        );
    }

    #[test]
    fn steps_are_recorded_in_plan_order_only() {
        check(
            executing(vec![]),
            Event::StepDone {
                step: Step::Snapshot,
                outcome: StepOutcome::SnapshotCreated {
                    snapshot_id: snap_id(),
                    life_left_secs: None,
                },
            },
            20,
            Ok(executing(vec![snapshot_done(20)])),
        );
        check(
            executing(vec![]),
            Event::StepDone {
                step: Step::Kill,
                outcome: StepOutcome::Killed,
            },
            20,
            Err(TransitionError::StepNotExpected {
                step: Step::Kill,
                expected: Some(Step::Snapshot),
            }),
        );
        check(
            executing(vec![]),
            Event::StepDone {
                step: Step::Pause,
                outcome: StepOutcome::Paused,
            },
            20,
            Err(TransitionError::StepNotExpected {
                step: Step::Pause,
                expected: Some(Step::Snapshot),
            }),
        );
    }

    #[test]
    fn a_step_recorded_twice_is_refused() {
        check(
            executing(vec![snapshot_done(20)]),
            Event::StepDone {
                step: Step::Snapshot,
                outcome: StepOutcome::SnapshotCreated {
                    snapshot_id: snap_id(),
                    life_left_secs: None,
                },
            },
            21,
            Err(TransitionError::StepAlreadyRecorded {
                step: Step::Snapshot,
            }),
        );
    }

    #[test]
    fn finishing_needs_every_step_unless_the_subject_was_already_gone() {
        check(
            executing(vec![snapshot_done(20)]),
            Event::Finish,
            30,
            Err(TransitionError::StepsRemaining {
                remaining: vec![Step::VerifySnapshot, Step::Kill],
            }),
        );
        let gone = StepRecord {
            step: Step::Snapshot,
            outcome: StepOutcome::AlreadyGone,
            at: t(20),
        };
        check(
            executing(vec![gone.clone()]),
            Event::Finish,
            30,
            Ok(CaseState::Done {
                decision: decision(DecisionOption::SnapshotThenKill),
                steps: vec![gone],
                at: t(30),
            }),
        );
    }

    #[test]
    fn the_full_snapshot_then_kill_path_ends_done_with_every_result() {
        let mut case = in_state(decided());
        for event in [
            Event::StartExecuting,
            Event::StepDone {
                step: Step::Snapshot,
                outcome: StepOutcome::SnapshotCreated {
                    snapshot_id: snap_id(),
                    life_left_secs: None,
                },
            },
            Event::StepDone {
                step: Step::VerifySnapshot,
                outcome: StepOutcome::SnapshotVerified {
                    snapshot_id: snap_id(),
                },
            },
            Event::StepDone {
                step: Step::Kill,
                outcome: StepOutcome::Killed,
            },
            Event::Finish,
        ] {
            case = apply(&case, event, t(20)).unwrap();
        }
        let CaseState::Done { steps, .. } = &case.state else {
            panic!("expected done, got {:?}", case.state);
        };
        let kinds: Vec<Step> = steps.iter().map(|r| r.step).collect();
        assert_eq!(
            kinds,
            vec![Step::Snapshot, Step::VerifySnapshot, Step::Kill]
        );
    }

    #[test]
    fn a_failure_keeps_finished_steps_and_a_retry_resumes_with_them() {
        check(
            executing(vec![snapshot_done(20)]),
            Event::Fail {
                error: "E2B said 500".into(),
            },
            30,
            Ok(failed()),
        );
        check(
            failed(),
            Event::Retry { by: alice() },
            40,
            Ok(CaseState::Decided {
                decision: decision(DecisionOption::SnapshotThenKill),
                attempt: 2,
                steps: vec![snapshot_done(20)],
            }),
        );
    }

    #[test]
    fn stale_evidence_sends_a_decided_case_back_to_pending_with_a_note() {
        let case = in_state(decided());
        let next = apply(&case, refreshed(), t(50)).unwrap();
        assert_eq!(next.state, CaseState::Pending);
        assert_eq!(next.decide_by, t(200));
        assert_eq!(next.evidence.state.as_deref(), Some("running"));
        assert_eq!(next.notes.last().unwrap().text, "it is active again");
        assert_eq!(next.version, case.version, "apply never touches version");
    }

    #[test]
    fn transient_failures_count_per_attempt_and_step_and_a_finished_step_clears_them() {
        let fail = |step| Event::TransientFailure {
            step,
            error: "E2B said 502".into(),
        };
        let mut case = in_state(executing(vec![]));
        for expected in 1..=3 {
            case = apply(&case, fail(Step::Snapshot), t(20)).unwrap();
            assert_eq!(case.retrying.as_ref().unwrap().failures, expected);
        }
        assert_eq!(case.state, executing(vec![]), "the state stays as it was");
        let done = Event::StepDone {
            step: Step::Snapshot,
            outcome: StepOutcome::SnapshotCreated {
                snapshot_id: snap_id(),
                life_left_secs: None,
            },
        };
        case = apply(&case, done, t(21)).unwrap();
        assert_eq!(case.retrying, None);
        case = apply(&case, fail(Step::VerifySnapshot), t(22)).unwrap();
        let retrying = case.retrying.clone().unwrap();
        assert_eq!(
            (retrying.step, retrying.failures),
            (Step::VerifySnapshot, 1)
        );
        // A Retry starts a new attempt, whose failures are counted afresh.
        let mut retried = in_state(failed());
        retried.retrying = Some(retrying);
        let retried = apply(&retried, Event::Retry { by: alice() }, t(40)).unwrap();
        let retried = apply(&retried, fail(Step::VerifySnapshot), t(41)).unwrap();
        assert_eq!(retried.retrying.unwrap().failures, 1);
    }

    #[test]
    fn stale_evidence_with_a_deadline_in_the_past_is_refused() {
        check(
            executing(vec![]),
            Event::EvidenceChanged {
                evidence: Box::default(),
                note: "changed".into(),
                decide_by: t(40),
            },
            50,
            Err(TransitionError::DeadlineNotInFuture { decide_by: t(40) }),
        );
    }

    #[test]
    fn a_list_item_found_changed_is_left_by_steward_rather_than_asked_again() {
        let mut case = in_state(executing(vec![]));
        case.list = Some(crate::cases::ListRef {
            list: crate::ids::ListId::parse("list_1").unwrap(),
            group: 0,
        });
        let event = Event::EvidenceChanged {
            evidence: Box::default(),
            note: "it used 40 % CPU".into(),
            decide_by: t(90),
        };
        let left = apply(&case, event, t(50)).unwrap();
        match left.state {
            CaseState::Left {
                by: Decider::Policy { .. },
                until,
                reason,
                ..
            } => {
                // Its mark ends now: the next sweep judges it afresh.
                assert_eq!(until, Some(t(50)));
                assert_eq!(reason.as_deref(), Some("it used 40 % CPU"));
            }
            other => panic!("expected Left, got {other:?}"),
        }
        assert_eq!(
            left.decide_by, case.decide_by,
            "no new deadline: nobody is asked"
        );
    }

    /// Every (state, event) pair not listed as legal must be refused as Illegal.
    #[test]
    fn every_other_state_and_event_pair_is_illegal() {
        let states = [
            ("pending", CaseState::Pending),
            ("decided", decided()),
            ("executing", executing(vec![])),
            ("done", done()),
            ("failed", failed()),
            ("expired", expired()),
            ("left", left()),
        ];
        let events = [
            decide(DecisionOption::Kill),
            Event::Expire,
            Event::StartExecuting,
            Event::StepDone {
                step: Step::Snapshot,
                outcome: StepOutcome::SnapshotCreated {
                    snapshot_id: snap_id(),
                    life_left_secs: None,
                },
            },
            Event::Finish,
            Event::Fail { error: "x".into() },
            Event::Retry { by: alice() },
            refreshed(),
            Event::TransientFailure {
                step: Step::Kill,
                error: "502".into(),
            },
        ];
        let legal: &[(&str, &str)] = &[
            ("pending", "decide"),
            ("pending", "expire"),
            ("decided", "start executing"),
            ("executing", "start executing"),
            ("executing", "record a step of"),
            ("executing", "finish"),
            ("decided", "fail"),
            ("executing", "fail"),
            ("failed", "retry"),
            ("decided", "refresh the evidence of"),
            ("executing", "refresh the evidence of"),
            ("decided", "count a transient failure of"),
            ("executing", "count a transient failure of"),
        ];
        for (state_name, state) in &states {
            for event in &events {
                let case = in_state(state.clone());
                // Late enough to expire, early enough to decide is impossible: use 100 for
                // Expire and 10 for the rest, so legal pairs really succeed.
                let now = if *event == Event::Expire { 100 } else { 10 };
                let got = apply(&case, event.clone(), t(now));
                let is_legal = legal.contains(&(*state_name, event.name()));
                match (&got, is_legal) {
                    (Ok(_), true) => {}
                    // Finishing an executing case with steps left is legal in shape, refused
                    // for content; it is covered by its own test.
                    (Err(TransitionError::StepsRemaining { .. }), true) => {}
                    (Err(TransitionError::Illegal { event: e, state: s }), false) => {
                        assert_eq!((*e, *s), (event.name(), *state_name));
                    }
                    _ => panic!("{state_name} + {}: unexpected {got:?}", event.name()),
                }
            }
        }
    }

    #[test]
    fn double_decisions_expiring_decided_cases_and_deciding_expired_ones_are_refused() {
        check(
            decided(),
            decide(DecisionOption::Kill),
            10,
            Err(TransitionError::Illegal {
                event: "decide",
                state: "decided",
            }),
        );
        check(
            decided(),
            Event::Expire,
            150,
            Err(TransitionError::Illegal {
                event: "expire",
                state: "decided",
            }),
        );
        check(
            expired(),
            decide(DecisionOption::Kill),
            10,
            Err(TransitionError::Illegal {
                event: "decide",
                state: "expired",
            }),
        );
        check(
            left(),
            decide(DecisionOption::Kill),
            10,
            Err(TransitionError::Illegal {
                event: "decide",
                state: "left",
            }),
        );
    }

    #[test]
    fn a_policy_decides_like_a_person_and_is_named_as_the_decider() {
        let policy = "[runs] on_finish = kill_on_success".to_owned();
        let mut case = pending();
        case.options = DecisionOption::RUN.to_vec();
        let decided = apply(
            &case,
            Event::DecideByPolicy {
                option: DecisionOption::Kill,
                policy: policy.clone(),
            },
            t(5),
        )
        .unwrap();
        let decision = decided.state.decision().unwrap();
        assert_eq!(decision.option, DecisionOption::Kill);
        assert_eq!(decision.by, Decider::Policy { policy });
        assert_eq!(decision.by.person(), None);
        // It obeys the same rules: only offered options, only while pending, only before the deadline.
        let not_offered = apply(
            &case,
            Event::DecideByPolicy {
                option: DecisionOption::Pause,
                policy: "x".into(),
            },
            t(5),
        );
        assert!(matches!(
            not_offered,
            Err(TransitionError::OptionNotOffered { .. })
        ));
        let again = apply(
            &decided,
            Event::DecideByPolicy {
                option: DecisionOption::Kill,
                policy: "x".into(),
            },
            t(6),
        );
        assert!(matches!(again, Err(TransitionError::Illegal { .. })));
        let late = apply(
            &case,
            Event::DecideByPolicy {
                option: DecisionOption::Kill,
                policy: "x".into(),
            },
            t(100),
        );
        assert!(matches!(late, Err(TransitionError::DeadlinePassed { .. })));
    }

    #[test]
    fn a_decision_stored_before_policies_could_decide_still_reads_as_a_persons() {
        let stored = r#"{"option":"kill","by":"UALICE","at":"2025-01-01T00:00:00Z","reason":null}"#;
        let decision: Decision = serde_json::from_str(stored).unwrap();
        assert_eq!(decision.by, Decider::Person(alice()));
        assert_eq!(serde_json::to_string(&decision).unwrap(), stored);
        let by_policy = Decider::Policy {
            policy: "[runs] on_finish = keep".into(),
        };
        let json = serde_json::to_string(&by_policy).unwrap();
        assert_eq!(serde_json::from_str::<Decider>(&json).unwrap(), by_policy);
    }

    #[test]
    fn a_restore_is_offered_once_asked_once_and_closes_after_its_window() {
        let kill_done = in_state(done());
        let offer = || Event::OfferRestore {
            snapshot: snap_id(),
            until: t(1000),
            life_left_secs: Some(600),
        };
        // Only a Snapshot, then kill has a snapshot to restore from.
        assert!(apply(&kill_done, offer(), t(40)).is_err());
        let snapshot_done = in_state(CaseState::Done {
            decision: decision(DecisionOption::SnapshotThenKill),
            steps: vec![snapshot_done(20)],
            at: t(30),
        });
        let offered = apply(&snapshot_done, offer(), t(40)).unwrap();
        assert_eq!(
            offered.state, snapshot_done.state,
            "the state never changes"
        );
        assert!(offered.restore.as_ref().unwrap().offered());
        let ask = || Event::RequestRestore { by: alice() };
        let asked = apply(&offered, ask(), t(50)).unwrap();
        assert!(!asked.restore.as_ref().unwrap().offered());
        assert!(
            apply(&asked, ask(), t(51)).is_err(),
            "one request at a time"
        );
        // A failure offers it again; a success does not.
        let failed = apply(
            &asked,
            Event::RestoreFailed {
                error: "E2B said 500".into(),
            },
            t(60),
        )
        .unwrap();
        assert!(failed.restore.as_ref().unwrap().offered());
        let again = apply(&failed, ask(), t(70)).unwrap();
        let sandbox = SandboxId::parse("inew1").unwrap();
        let keep = |until| Event::KeepRestoredLonger { by: alice(), until };
        assert!(
            apply(&again, keep(t(5000)), t(75)).is_err(),
            "nothing to keep longer before it is restored"
        );
        let ends_at = Some(t(3680));
        let restored = apply(&again, Event::Restored { sandbox, ends_at }, t(80)).unwrap();
        assert!(!restored.restore.as_ref().unwrap().offered());
        let request = restored.restore.as_ref().unwrap().request.as_ref().unwrap();
        assert_eq!(request.ends_at, ends_at);
        let kept = apply(&restored, keep(t(7290)), t(90)).unwrap();
        let request = kept.restore.as_ref().unwrap().request.as_ref().unwrap();
        assert_eq!(
            (request.ends_at, request.kept_by.as_ref()),
            (Some(t(7290)), Some(&alice()))
        );
        assert_eq!(kept.restore.as_ref().unwrap().life_left_secs, Some(600));
        assert!(apply(&restored, ask(), t(90)).is_err());
        // The window: not closed early; after it, closed, and asking is refused.
        assert!(matches!(
            apply(&offered, Event::CloseRestore, t(999)),
            Err(TransitionError::NotDueYet { .. })
        ));
        let closed = apply(&offered, Event::CloseRestore, t(1000)).unwrap();
        assert!(!closed.restore.as_ref().unwrap().offered());
        assert!(apply(&closed, ask(), t(1001)).is_err());
        assert!(matches!(
            apply(&offered, ask(), t(1000)),
            Err(TransitionError::RestoreWindowClosed { .. })
        ));
    }
}
