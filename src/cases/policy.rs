//! Who may choose which option: the `[approvals]` table of `steward.toml` and one pure check.
//!
//! Approvers are listed per option as Slack user ids and/or user-group ids. With the two-person
//! rule on, whoever asked for a case may not approve its irreversible options themselves.
//! Unset destructive options have no approvers (nothing irreversible happens by default);
//! Pause, Leave and Keep default to anyone. A run case's Snapshot and keep and Keep running
//! follow the Pause rule. This file must not call Slack: the caller resolves
//! the deciding user's groups and passes them in.
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Deserializer};

use super::DecisionOption;
use crate::ids::{SlackUserGroupId, SlackUserId};

/// Default time people have to decide a case.
pub const DEFAULT_DECIDE_WITHIN_SECS: u64 = 24 * 60 * 60;
/// Default floor of a timeout set without a decision: shorter ones are kills in disguise.
pub const DEFAULT_MIN_TIMEOUT_SECS: u64 = 10 * 60;

/// The `[approvals]` table.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ApprovalPolicy {
    /// How long a case stays open for a decision, e.g. `"24h"`.
    #[serde(deserialize_with = "deserialize_decide_within")]
    pub decide_within: Duration,
    /// Forbids the requester of a case from approving its Kill / Delete Template.
    pub two_person_rule: bool,
    /// A timeout (or resume timeout) that would end a sandbox sooner than this needs a
    /// decision: a `/sandbox timeout` below it that shortens the sandbox's life opens a case
    /// even for a kill approver, and a resume below it is refused.
    #[serde(deserialize_with = "deserialize_min_timeout")]
    pub min_timeout: Duration,
    /// How long after a Snapshot, then kill its card offers Restore (the sandbox started again
    /// from the snapshot), e.g. `"7d"`. The snapshot itself stays until someone deletes it.
    #[serde(deserialize_with = "deserialize_restore_window")]
    pub restore_window: Duration,
    /// How long a sandbox restored from its snapshot runs before E2B ends it, e.g. `"1h"`
    /// (never less than the original had left when it was snapshotted), and how much longer
    /// each click on the card's Keep longer keeps it.
    #[serde(deserialize_with = "deserialize_restored_timeout")]
    pub restored_timeout: Duration,
    pub approvers: Approvers,
}

/// Default life of a restored sandbox: an hour, long enough to connect and use it.
pub const DEFAULT_RESTORED_TIMEOUT_SECS: u64 = 60 * 60;

fn deserialize_restored_timeout<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let text = String::deserialize(d)?;
    let timeout = crate::duration::parse("approvals.restored_timeout", &text)
        .map_err(serde::de::Error::custom)?;
    if timeout < Duration::from_secs(60) {
        return Err(serde::de::Error::custom(
            "approvals.restored_timeout must be at least a minute, so the restored sandbox can be used",
        ));
    }
    Ok(timeout)
}

/// Default restore window: a week.
pub const DEFAULT_RESTORE_WINDOW_SECS: u64 = 7 * 24 * 60 * 60;

fn deserialize_restore_window<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let text = String::deserialize(d)?;
    crate::duration::parse("approvals.restore_window", &text).map_err(serde::de::Error::custom)
}

impl Default for ApprovalPolicy {
    fn default() -> Self {
        Self {
            decide_within: Duration::from_secs(DEFAULT_DECIDE_WITHIN_SECS),
            two_person_rule: true,
            min_timeout: Duration::from_secs(DEFAULT_MIN_TIMEOUT_SECS),
            restore_window: Duration::from_secs(DEFAULT_RESTORE_WINDOW_SECS),
            restored_timeout: Duration::from_secs(DEFAULT_RESTORED_TIMEOUT_SECS),
            approvers: Approvers::default(),
        }
    }
}

impl ApprovalPolicy {
    /// The deadline of a case opened at `now`.
    pub fn decide_by(&self, now: DateTime<Utc>) -> DateTime<Utc> {
        // Durations beyond chrono's range are clamped to a far but valid deadline.
        let within = chrono::Duration::from_std(self.decide_within)
            .unwrap_or_else(|_| chrono::Duration::days(3650));
        now.checked_add_signed(within)
            .unwrap_or(DateTime::<Utc>::MAX_UTC)
    }
}

fn deserialize_decide_within<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let text = String::deserialize(d)?;
    let within = crate::duration::parse("approvals.decide_within", &text)
        .map_err(serde::de::Error::custom)?;
    if within.is_zero() {
        return Err(serde::de::Error::custom(
            "approvals.decide_within must be longer than zero",
        ));
    }
    Ok(within)
}

fn deserialize_min_timeout<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let text = String::deserialize(d)?;
    crate::duration::parse("approvals.min_timeout", &text).map_err(serde::de::Error::custom)
}

/// The `[approvals.approvers]` table: one rule per option.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Approvers {
    /// When unset, the `kill` rule applies: this option kills too.
    pub snapshot_then_kill: Option<ApproverRule>,
    pub kill: ApproverRule,
    pub pause: ApproverRule,
    pub leave: ApproverRule,
    pub delete_template: ApproverRule,
    pub keep: ApproverRule,
    /// Who may start a live sweep from Slack; when unset, the `pause` rule applies (a sweep
    /// only opens cases, and its cases' pause options are open to the same people).
    pub sweep: Option<ApproverRule>,
    /// Who may restore a killed sandbox from its snapshot; when unset, the `pause` rule
    /// applies (a restore only starts a sandbox).
    pub restore: Option<ApproverRule>,
}

impl Default for Approvers {
    fn default() -> Self {
        Self {
            snapshot_then_kill: None,
            kill: ApproverRule::default(),
            pause: ApproverRule::anyone(),
            leave: ApproverRule::anyone(),
            delete_template: ApproverRule::default(),
            keep: ApproverRule::anyone(),
            sweep: None,
            restore: None,
        }
    }
}

impl Approvers {
    /// The rule that governs `option`.
    pub fn rule_for(&self, option: DecisionOption) -> &ApproverRule {
        match option {
            DecisionOption::SnapshotThenKill => {
                self.snapshot_then_kill.as_ref().unwrap_or(&self.kill)
            }
            DecisionOption::Kill => &self.kill,
            DecisionOption::Pause => &self.pause,
            DecisionOption::Leave => &self.leave,
            DecisionOption::DeleteTemplate => &self.delete_template,
            DecisionOption::Keep => &self.keep,
            // Neither destroys anything: a snapshot and a pause, or more time. Whoever may
            // pause may choose them.
            DecisionOption::SnapshotAndKeep | DecisionOption::KeepRunning => &self.pause,
            // A shorter life is a kill with a delay: whoever may kill may choose it.
            DecisionOption::Shorten => &self.kill,
        }
    }

    /// The rule that governs restoring a sandbox from its snapshot.
    pub fn restore_rule(&self) -> &ApproverRule {
        self.restore.as_ref().unwrap_or(&self.pause)
    }

    /// The rule that governs starting a live sweep.
    pub fn sweep_rule(&self) -> &ApproverRule {
        self.sweep.as_ref().unwrap_or(&self.pause)
    }
}

/// Who may choose one option. The default (all empty) lets nobody.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ApproverRule {
    pub anyone: bool,
    pub users: Vec<SlackUserId>,
    pub groups: Vec<SlackUserGroupId>,
}

impl ApproverRule {
    pub fn anyone() -> Self {
        Self {
            anyone: true,
            ..Self::default()
        }
    }

    fn is_empty(&self) -> bool {
        !self.anyone && self.users.is_empty() && self.groups.is_empty()
    }

    /// Whether the rule lets `user` (a member of `user_groups`) in.
    pub fn admits(&self, user: &SlackUserId, user_groups: &[SlackUserGroupId]) -> bool {
        self.anyone
            || self.users.contains(user)
            || self.groups.iter().any(|g| user_groups.contains(g))
    }
}

/// Why a person may not choose an option. The text is meant for that person.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error(
        "Nobody is allowed to choose “{option}” yet: add approvers under [approvals.approvers] in steward.toml."
    )]
    NoApprovers { option: DecisionOption },
    #[error("You are not an approver for “{option}”, so nothing was changed.")]
    NotAnApprover { option: DecisionOption },
    #[error(
        "You are an approver, but you asked for this case, so someone else has to choose “{option}” (two-person rule). Nothing was changed."
    )]
    OwnRequest { option: DecisionOption },
    #[error(
        "You may not start a live sweep: ask someone listed under [approvals.approvers] sweep, or run `/sandbox sweep --dry-run`."
    )]
    NotASweeper,
    #[error(
        "You may not restore sandboxes: ask someone listed under [approvals.approvers] restore (or pause). Nothing was changed."
    )]
    NotARestorer,
}

/// Decides whether `user` (a member of `user_groups`) may start a live sweep.
pub fn may_start_sweep(
    policy: &ApprovalPolicy,
    user: &SlackUserId,
    user_groups: &[SlackUserGroupId],
) -> Result<(), Refusal> {
    if policy.approvers.sweep_rule().admits(user, user_groups) {
        Ok(())
    } else {
        Err(Refusal::NotASweeper)
    }
}

/// Decides whether `user` (a member of `user_groups`) may restore a sandbox from its snapshot.
pub fn may_restore(
    policy: &ApprovalPolicy,
    user: &SlackUserId,
    user_groups: &[SlackUserGroupId],
) -> Result<(), Refusal> {
    if policy.approvers.restore_rule().admits(user, user_groups) {
        Ok(())
    } else {
        Err(Refusal::NotARestorer)
    }
}

/// Decides whether `user` (a member of `user_groups`) may choose `option` on a case requested by
/// `requester` (`None` when Steward itself opened it).
pub fn may_decide(
    policy: &ApprovalPolicy,
    user: &SlackUserId,
    user_groups: &[SlackUserGroupId],
    option: DecisionOption,
    requester: Option<&SlackUserId>,
) -> Result<(), Refusal> {
    let rule = policy.approvers.rule_for(option);
    if rule.is_empty() {
        return Err(Refusal::NoApprovers { option });
    }
    if !rule.admits(user, user_groups) {
        return Err(Refusal::NotAnApprover { option });
    }
    if policy.two_person_rule && option.is_irreversible() && requester == Some(user) {
        return Err(Refusal::OwnRequest { option });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize)]
    struct File {
        approvals: ApprovalPolicy,
    }

    const EXAMPLE: &str = r#"
[approvals]
decide_within = "24h"
two_person_rule = true
[approvals.approvers]
kill = { users = ["U1"], groups = ["S123"] }
snapshot_then_kill = { users = ["U1","U2"] }
pause = { anyone = true }
leave = { anyone = true }
delete_template = { users = ["U1"] }
"#;

    fn example() -> ApprovalPolicy {
        toml::from_str::<File>(EXAMPLE).unwrap().approvals
    }

    fn user(id: &str) -> SlackUserId {
        SlackUserId::parse(id).unwrap()
    }

    fn group(id: &str) -> SlackUserGroupId {
        SlackUserGroupId::parse(id).unwrap()
    }

    /// `check(who, groups, option, requester, expected)` against the example policy.
    fn check(
        who: &str,
        groups: &[&str],
        option: DecisionOption,
        requester: Option<&str>,
        expected: Result<(), Refusal>,
    ) {
        let groups: Vec<_> = groups.iter().map(|g| group(g)).collect();
        let requester = requester.map(user);
        let got = may_decide(&example(), &user(who), &groups, option, requester.as_ref());
        assert_eq!(got, expected, "{who} {option:?}");
    }

    #[test]
    fn the_example_policy_parses() {
        let policy = example();
        assert_eq!(policy.decide_within, Duration::from_secs(24 * 3600));
        assert!(policy.two_person_rule);
        assert_eq!(policy.approvers.kill.groups, vec![group("S123")]);
    }

    #[test]
    fn listed_users_and_group_members_may_kill_and_others_may_not() {
        use DecisionOption::*;
        check("U1", &[], Kill, None, Ok(()));
        check("U9", &["S123"], Kill, None, Ok(()));
        check(
            "U2",
            &["S999"],
            Kill,
            None,
            Err(Refusal::NotAnApprover { option: Kill }),
        );
        check("U2", &[], SnapshotThenKill, None, Ok(()));
        check("U7", &[], Pause, None, Ok(()));
        check("U7", &[], Leave, None, Ok(()));
    }

    #[test]
    fn the_two_person_rule_stops_requesters_approving_their_own_kill_but_not_their_own_pause() {
        use DecisionOption::*;
        check(
            "U1",
            &[],
            Kill,
            Some("U1"),
            Err(Refusal::OwnRequest { option: Kill }),
        );
        check(
            "U1",
            &[],
            DeleteTemplate,
            Some("U1"),
            Err(Refusal::OwnRequest {
                option: DeleteTemplate,
            }),
        );
        check("U1", &[], Kill, Some("U2"), Ok(()));
        check("U1", &[], Pause, Some("U1"), Ok(()));
    }

    #[test]
    fn without_the_two_person_rule_requesters_may_approve_their_own_kill() {
        let mut policy = example();
        policy.two_person_rule = false;
        assert_eq!(
            may_decide(
                &policy,
                &user("U1"),
                &[],
                DecisionOption::Kill,
                Some(&user("U1"))
            ),
            Ok(())
        );
    }

    #[test]
    fn by_default_nobody_may_kill_or_delete_and_anyone_may_pause_or_keep() {
        let policy = ApprovalPolicy::default();
        let u = user("U1");
        for option in [
            DecisionOption::Kill,
            DecisionOption::SnapshotThenKill,
            DecisionOption::DeleteTemplate,
        ] {
            assert_eq!(
                may_decide(&policy, &u, &[], option, None),
                Err(Refusal::NoApprovers { option })
            );
        }
        for option in [
            DecisionOption::Pause,
            DecisionOption::Leave,
            DecisionOption::Keep,
        ] {
            assert_eq!(may_decide(&policy, &u, &[], option, None), Ok(()));
        }
    }

    #[test]
    fn snapshot_then_kill_follows_the_kill_rule_when_unset() {
        let policy: ApprovalPolicy =
            toml::from_str::<File>("[approvals.approvers]\nkill = { users = [\"U5\"] }\n")
                .unwrap()
                .approvals;
        assert_eq!(
            may_decide(
                &policy,
                &user("U5"),
                &[],
                DecisionOption::SnapshotThenKill,
                None
            ),
            Ok(())
        );
        assert_eq!(policy.decide_within, Duration::from_secs(24 * 3600));
    }

    #[test]
    fn bad_approval_tables_are_refused_with_a_reason() {
        let bad = [
            "[approvals]\ndecide_within = \"soon\"\n",
            "[approvals]\ndecide_within = \"0s\"\n",
            "[approvals.approvers]\nnuke = { anyone = true }\n",
            "[approvals.approvers]\nkill = { users = [\"not a user\"] }\n",
            "[approvals.approvers]\nkill = { people = [\"U1\"] }\n",
        ];
        for text in bad {
            assert!(toml::from_str::<File>(text).is_err(), "{text}");
        }
    }

    #[test]
    fn live_sweeps_follow_the_pause_rule_unless_a_sweep_rule_is_set() {
        let default = ApprovalPolicy::default();
        assert_eq!(default.min_timeout, Duration::from_secs(600));
        assert_eq!(may_start_sweep(&default, &user("U7"), &[]), Ok(()));
        let policy = toml::from_str::<File>(
            "[approvals]\nmin_timeout = \"5m\"\n[approvals.approvers]\nsweep = { groups = [\"S1\"] }\n",
        )
        .unwrap()
        .approvals;
        assert_eq!(policy.min_timeout, Duration::from_secs(300));
        assert_eq!(
            may_start_sweep(&policy, &user("U7"), &[]),
            Err(Refusal::NotASweeper)
        );
        assert_eq!(
            may_start_sweep(&policy, &user("U7"), &[group("S1")]),
            Ok(())
        );
    }

    #[test]
    fn restores_follow_the_pause_rule_unless_a_restore_rule_is_set_and_the_window_defaults_to_a_week()
     {
        let default = ApprovalPolicy::default();
        assert_eq!(default.restore_window, Duration::from_secs(7 * 24 * 3600));
        assert_eq!(may_restore(&default, &user("U7"), &[]), Ok(()));
        let policy = toml::from_str::<File>(
            "[approvals]\nrestore_window = \"2d\"\n[approvals.approvers]\nrestore = { users = [\"U1\"] }\n",
        )
        .unwrap()
        .approvals;
        assert_eq!(policy.restore_window, Duration::from_secs(2 * 24 * 3600));
        assert_eq!(default.restored_timeout, Duration::from_secs(3600));
        let longer = toml::from_str::<File>("[approvals]\nrestored_timeout = \"3h\"\n")
            .unwrap()
            .approvals;
        assert_eq!(longer.restored_timeout, Duration::from_secs(3 * 3600));
        assert!(toml::from_str::<File>("[approvals]\nrestored_timeout = \"10s\"\n").is_err());
        assert_eq!(
            may_restore(&policy, &user("U7"), &[]),
            Err(Refusal::NotARestorer)
        );
        assert_eq!(may_restore(&policy, &user("U1"), &[]), Ok(()));
    }

    #[test]
    fn the_deadline_is_now_plus_decide_within() {
        let now = DateTime::from_timestamp(1_000, 0).unwrap();
        let policy = example();
        assert_eq!(
            policy.decide_by(now),
            DateTime::from_timestamp(1_000 + 24 * 3600, 0).unwrap()
        );
    }

    #[test]
    fn shorten_follows_the_kill_rule_and_the_two_person_rule() {
        check("U1", &[], DecisionOption::Shorten, None, Ok(()));
        check(
            "U9",
            &[],
            DecisionOption::Shorten,
            None,
            Err(Refusal::NotAnApprover {
                option: DecisionOption::Shorten,
            }),
        );
        check(
            "U1",
            &[],
            DecisionOption::Shorten,
            Some("U1"),
            Err(Refusal::OwnRequest {
                option: DecisionOption::Shorten,
            }),
        );
    }

    #[test]
    fn snapshot_and_keep_and_keep_running_follow_the_pause_rule() {
        let mut policy = ApprovalPolicy::default();
        policy.approvers.pause = ApproverRule {
            users: vec![SlackUserId::parse("UPAUSER").unwrap()],
            ..ApproverRule::default()
        };
        let pauser = SlackUserId::parse("UPAUSER").unwrap();
        let other = SlackUserId::parse("UOTHER").unwrap();
        for option in [DecisionOption::SnapshotAndKeep, DecisionOption::KeepRunning] {
            assert!(!option.is_irreversible());
            assert_eq!(
                may_decide(&policy, &pauser, &[], option, Some(&pauser)),
                Ok(())
            );
            assert_eq!(
                may_decide(&policy, &other, &[], option, None),
                Err(Refusal::NotAnApprover { option })
            );
        }
    }
}
