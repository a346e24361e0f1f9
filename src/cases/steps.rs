//! The steps that carry out a decided option, and what each step found.
//!
//! A decision is run as a short, fixed plan (snapshot → verify → kill, say). Each finished step is
//! recorded, so a worker that takes over after a crash resumes after the last finished step and
//! never takes a second snapshot or loses a kill. This file only describes plans; it runs nothing.
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::DecisionOption;
use crate::ids::TemplateId;

/// One unit of work against E2B. The order of the variants is the order of any plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Step {
    Snapshot,
    VerifySnapshot,
    Kill,
    Pause,
    DeleteTemplate,
    /// Extend the sandbox's E2B timeout ("Keep running"); never shortens it.
    ExtendTimeout,
    /// Shorten the sandbox's E2B timeout ("Shorten"); never extends it.
    ShortenTimeout,
}

impl Step {
    pub fn as_str(self) -> &'static str {
        match self {
            Step::Snapshot => "snapshot",
            Step::VerifySnapshot => "verify_snapshot",
            Step::Kill => "kill",
            Step::Pause => "pause",
            Step::DeleteTemplate => "delete_template",
            Step::ExtendTimeout => "extend_timeout",
            Step::ShortenTimeout => "shorten_timeout",
        }
    }
}

/// What a finished step found or produced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum StepOutcome {
    SnapshotCreated {
        snapshot_id: TemplateId,
        /// How long the sandbox had left to live when the snapshot was taken, in seconds, so
        /// a restore from it gets no less. `None` when unknown (an adopted snapshot).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        life_left_secs: Option<u64>,
    },
    SnapshotVerified {
        snapshot_id: TemplateId,
    },
    Killed,
    Paused,
    AlreadyPaused,
    TemplateDeleted,
    /// The sandbox's E2B timeout now ends at `until` (or already ended later than asked, and
    /// was left alone: `extended` is false).
    KeptRunning {
        until: DateTime<Utc>,
        extended: bool,
    },
    /// The sandbox's E2B timeout now ends at `until` (or already ended sooner than asked, and
    /// was left alone: `shortened` is false).
    Shortened {
        until: DateTime<Utc>,
        shortened: bool,
    },
    /// The subject no longer exists: the remaining steps have nothing to act on.
    AlreadyGone,
}

/// A finished step, as kept in the case and in the store's step log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepRecord {
    pub step: Step,
    pub outcome: StepOutcome,
    pub at: DateTime<Utc>,
}

/// The steps that carry out `option`, in order. Leave and Keep have none.
pub fn plan_for(option: DecisionOption) -> &'static [Step] {
    match option {
        DecisionOption::SnapshotThenKill => &[Step::Snapshot, Step::VerifySnapshot, Step::Kill],
        DecisionOption::Kill => &[Step::Kill],
        DecisionOption::Pause => &[Step::Pause],
        DecisionOption::DeleteTemplate => &[Step::DeleteTemplate],
        DecisionOption::SnapshotAndKeep => &[Step::Snapshot, Step::VerifySnapshot, Step::Pause],
        DecisionOption::KeepRunning => &[Step::ExtendTimeout],
        DecisionOption::Shorten => &[Step::ShortenTimeout],
        DecisionOption::Leave | DecisionOption::Keep => &[],
    }
}

/// The steps of `option`'s plan still to run, given the ones `done`. Once any step found the
/// subject already gone, nothing remains.
pub fn remaining_steps(option: DecisionOption, done: &[StepRecord]) -> Vec<Step> {
    if done.iter().any(|r| r.outcome == StepOutcome::AlreadyGone) {
        return Vec::new();
    }
    plan_for(option)
        .iter()
        .copied()
        .filter(|step| !done.iter().any(|r| r.step == *step))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(step: Step, outcome: StepOutcome) -> StepRecord {
        StepRecord {
            step,
            outcome,
            at: DateTime::from_timestamp(0, 0).unwrap(),
        }
    }

    #[test]
    fn snapshot_then_kill_resumes_after_the_last_finished_step() {
        let snap = TemplateId::parse("team/snap:1").unwrap();
        let done = vec![rec(
            Step::Snapshot,
            StepOutcome::SnapshotCreated {
                snapshot_id: snap,
                life_left_secs: None,
            },
        )];
        assert_eq!(
            remaining_steps(DecisionOption::SnapshotThenKill, &done),
            vec![Step::VerifySnapshot, Step::Kill]
        );
    }

    #[test]
    fn nothing_remains_once_the_subject_is_already_gone() {
        let done = vec![rec(Step::Snapshot, StepOutcome::AlreadyGone)];
        assert!(remaining_steps(DecisionOption::SnapshotThenKill, &done).is_empty());
    }

    #[test]
    fn snapshot_and_keep_pauses_only_after_the_snapshot_is_verified() {
        assert_eq!(
            plan_for(DecisionOption::SnapshotAndKeep),
            &[Step::Snapshot, Step::VerifySnapshot, Step::Pause]
        );
        assert_eq!(
            plan_for(DecisionOption::KeepRunning),
            &[Step::ExtendTimeout]
        );
        assert_eq!(plan_for(DecisionOption::Shorten), &[Step::ShortenTimeout]);
    }

    #[test]
    fn leave_and_keep_have_no_steps() {
        assert!(plan_for(DecisionOption::Leave).is_empty());
        assert!(plan_for(DecisionOption::Keep).is_empty());
        assert_eq!(
            plan_for(DecisionOption::DeleteTemplate),
            &[Step::DeleteTemplate]
        );
    }
}
