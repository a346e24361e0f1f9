//! A sweep's list decision: one question about many idle sandboxes, grouped by owner and
//! recommendation, answered a group at a time (or all at once).
//!
//! Every sandbox of a list has its own case (opened without a card, pointing back here through
//! [`ListRef`]), so execution keeps every guarantee single cases have: a decision written once,
//! durable steps, the re-check before acting, the restore window. This record only says what
//! people decided about each group: approved, sent to review one by one, or still open, and
//! which sandboxes they excluded (each exclusion is also a Leave on that sandbox's case).
//! How far execution got is read from the item cases ([`progress`]).
//!
//! Pure like the rest of `cases`: `(list, event, now) -> Result<list, ListRefusal>`.
use std::collections::BTreeSet;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{Card, CaseState, DecisionOption};
use crate::ids::{CaseId, ListId, SandboxId, SlackUserId};

/// Where an item case belongs: its list and the group's index in it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListRef {
    pub list: ListId,
    pub group: usize,
}

/// One sandbox of a group and the case that carries its decision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListItem {
    pub sandbox: SandboxId,
    pub case: CaseId,
}

/// What people decided about a group.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum GroupDecision {
    Open,
    /// The group's option runs on every item not excluded. `over_guard`: a kill group the
    /// blast-radius guard held, approved explicitly.
    Approved {
        by: SlackUserId,
        at: DateTime<Utc>,
        #[serde(default)]
        over_guard: bool,
    },
    /// Its items' cards were posted, to be decided one by one.
    Reviewing {
        by: SlackUserId,
        at: DateTime<Utc>,
    },
}

/// An excluded sandbox: left alone, like a Leave, until `until` (`None`: no end date).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Exclusion {
    pub sandbox: SandboxId,
    pub by: SlackUserId,
    pub until: Option<DateTime<Utc>>,
    pub at: DateTime<Utc>,
}

/// One owner's sandboxes with one recommendation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ListGroup {
    /// `None`: the sandboxes whose metadata names no owner.
    pub owner: Option<String>,
    pub owner_slack: Option<SlackUserId>,
    pub option: DecisionOption,
    /// Most expensive first.
    pub items: Vec<ListItem>,
    pub cost_per_day_usd: f64,
    pub paused_disk_bytes: u64,
    /// The most expensive few, named on the digest.
    pub top: Vec<SandboxId>,
    /// A kill group the blast-radius guard holds: only an explicit approval runs it.
    pub held_by_guard: bool,
    pub decision: GroupDecision,
    #[serde(default)]
    pub excluded: Vec<Exclusion>,
    /// Which of the list's messages shows this group (0: the digest itself).
    #[serde(default)]
    pub message: usize,
    /// A group a person answers by choosing one of these (a burst alert's Pause all, Kill all,
    /// Leave) rather than approving `option`; empty for a sweep's groups.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub choices: Vec<DecisionOption>,
}

impl ListGroup {
    /// The items the group's decision applies to: all but the excluded.
    pub fn included(&self) -> impl Iterator<Item = &ListItem> {
        let excluded: BTreeSet<&SandboxId> = self.excluded.iter().map(|e| &e.sandbox).collect();
        self.items
            .iter()
            .filter(move |i| !excluded.contains(&i.sandbox))
    }

    pub fn is_kill(&self) -> bool {
        matches!(
            self.option,
            DecisionOption::Kill | DecisionOption::SnapshotThenKill
        )
    }

    /// "alice · pause", for refusals and the audit.
    pub fn label(&self) -> String {
        format!(
            "{} · {}",
            self.owner.as_deref().unwrap_or("no owner"),
            self.option
        )
    }
}

/// A sweep's list decision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ListCase {
    pub id: ListId,
    pub version: u64,
    pub created_at: DateTime<Utc>,
    /// After this no group can be decided; undecided items expire with it.
    pub decide_by: DateTime<Utc>,
    /// The person who started the sweep (the two-person rule), `None` for a scheduled one.
    pub requester: Option<SlackUserId>,
    pub groups: Vec<ListGroup>,
    /// Where the list is shown: the digest, then one thread message per further chunk of groups.
    #[serde(default)]
    pub messages: Vec<Card>,
    /// The digest's header line (fleet, idle, cost), kept as the sweep wrote it.
    pub summary: String,
    /// The list was closed at its deadline.
    #[serde(default)]
    pub expired_at: Option<DateTime<Utc>>,
    /// Set when a `[[watch]]` burst rule raised this list rather than a sweep.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<Box<BurstAlert>>,
}

/// What a burst alert is about: the rule and the group whose creations it lists.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BurstAlert {
    pub rule: String,
    /// What the burst is counted by: `owner`, `template`, `metadata team`.
    pub by: String,
    /// The group's value: the owner, the template, the metadata value.
    pub value: String,
    pub more_than: usize,
    pub within_secs: u64,
    /// Creations counted, the listed ones and those past the list's cap.
    pub count: usize,
    pub first_at: DateTime<Utc>,
    pub last_at: DateTime<Utc>,
}

/// Something that happens to a list.
#[derive(Debug, Clone, PartialEq)]
pub enum ListEvent {
    /// Approve one group. `over_guard` must be set to approve a group the guard holds.
    Approve {
        group: usize,
        by: SlackUserId,
        over_guard: bool,
    },
    /// Approve every open group the guard does not hold.
    ApproveAll { by: SlackUserId },
    /// Send a group to review case by case.
    Review { group: usize, by: SlackUserId },
    /// Leave these sandboxes of an open group out of its decision.
    Exclude {
        group: usize,
        sandboxes: Vec<SandboxId>,
        until: Option<DateTime<Utc>>,
        by: SlackUserId,
    },
    /// The deadline passed.
    Expire,
    /// Where the list's messages were posted.
    Posted { messages: Vec<Card> },
    /// Answer a group that offers [`ListGroup::choices`] with one of them.
    Choose {
        group: usize,
        option: DecisionOption,
        by: SlackUserId,
    },
    /// More of a burst arrived: add these items to an open group (those already in it are
    /// skipped) and count the burst again.
    Grow {
        group: usize,
        items: Vec<ListItem>,
        count: usize,
        last_at: DateTime<Utc>,
    },
}

/// Why a list event was not applied. Each reads as a sentence for the person who clicked.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ListRefusal {
    #[error(
        "This list expired; nothing in it was done. The next sweep will list these sandboxes again."
    )]
    Expired,
    #[error("This list has no such group.")]
    NoSuchGroup,
    #[error("This group was already decided.")]
    AlreadyDecided(Box<GroupDecision>),
    #[error("The blast-radius guard holds this group: approve it with its own button.")]
    HeldByGuard,
    #[error("Nothing to approve: every group is decided or held by the guard.")]
    NothingOpen,
    #[error("{0} is not in this group.")]
    NotInGroup(SandboxId),
    #[error("The until-date must be in the future.")]
    UntilInPast,
    #[error("{0} is not one of this group's choices.")]
    NotAChoice(DecisionOption),
}

/// Applies `event` to `list` at `now`.
pub fn apply_list(
    list: &ListCase,
    event: ListEvent,
    now: DateTime<Utc>,
) -> Result<ListCase, ListRefusal> {
    let mut next = list.clone();
    if let ListEvent::Posted { messages } = event {
        next.messages = messages;
        return Ok(next);
    }
    if list.expired_at.is_some() {
        return Err(ListRefusal::Expired);
    }
    if matches!(event, ListEvent::Expire) {
        next.expired_at = Some(now);
        return Ok(next);
    }
    if now >= list.decide_by {
        return Err(ListRefusal::Expired);
    }
    match event {
        ListEvent::Approve {
            group,
            by,
            over_guard,
        } => {
            let g = open_group(&mut next, group)?;
            if g.held_by_guard && !over_guard {
                return Err(ListRefusal::HeldByGuard);
            }
            g.decision = GroupDecision::Approved {
                by,
                at: now,
                over_guard: g.held_by_guard,
            };
        }
        ListEvent::ApproveAll { by } => {
            let mut any = false;
            for g in &mut next.groups {
                if g.decision == GroupDecision::Open && !g.held_by_guard {
                    g.decision = GroupDecision::Approved {
                        by: by.clone(),
                        at: now,
                        over_guard: false,
                    };
                    any = true;
                }
            }
            if !any {
                return Err(ListRefusal::NothingOpen);
            }
        }
        ListEvent::Review { group, by } => {
            open_group(&mut next, group)?.decision = GroupDecision::Reviewing { by, at: now };
        }
        ListEvent::Exclude {
            group,
            sandboxes,
            until,
            by,
        } => {
            if until.is_some_and(|u| u <= now) {
                return Err(ListRefusal::UntilInPast);
            }
            let g = open_group(&mut next, group)?;
            for sandbox in sandboxes {
                if !g.items.iter().any(|i| i.sandbox == sandbox) {
                    return Err(ListRefusal::NotInGroup(sandbox));
                }
                if !g.excluded.iter().any(|e| e.sandbox == sandbox) {
                    g.excluded.push(Exclusion {
                        sandbox,
                        by: by.clone(),
                        until,
                        at: now,
                    });
                }
            }
        }
        ListEvent::Choose { group, option, by } => {
            let g = open_group(&mut next, group)?;
            if !g.choices.contains(&option) {
                return Err(ListRefusal::NotAChoice(option));
            }
            g.option = option;
            g.decision = GroupDecision::Approved {
                by,
                at: now,
                over_guard: false,
            };
        }
        ListEvent::Grow {
            group,
            items,
            count,
            last_at,
        } => {
            let g = open_group(&mut next, group)?;
            for item in items {
                if !g.items.iter().any(|i| i.sandbox == item.sandbox) {
                    g.items.push(item);
                }
            }
            if let Some(b) = &mut next.burst {
                b.count = b.count.max(count);
                b.last_at = b.last_at.max(last_at);
            }
        }
        ListEvent::Expire | ListEvent::Posted { .. } => unreachable!("handled above"),
    }
    Ok(next)
}

fn open_group(list: &mut ListCase, index: usize) -> Result<&mut ListGroup, ListRefusal> {
    let g = list.groups.get_mut(index).ok_or(ListRefusal::NoSuchGroup)?;
    if g.decision != GroupDecision::Open {
        return Err(ListRefusal::AlreadyDecided(Box::new(g.decision.clone())));
    }
    Ok(g)
}

/// The options a person must be allowed to choose to approve every group `ApproveAll` would.
pub fn options_of_approve_all(list: &ListCase) -> BTreeSet<DecisionOption> {
    list.groups
        .iter()
        .filter(|g| g.decision == GroupDecision::Open && !g.held_by_guard)
        .map(|g| g.option)
        .collect()
}

/// How far one approved group got, counted from its items' cases.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Progress {
    /// Items the decision applies to (excluded ones are not counted).
    pub total: usize,
    pub done: usize,
    /// Busy again (or changed) when re-read before acting: left alone.
    pub skipped: usize,
    pub failed: usize,
    /// Decided and queued or under way.
    pub running: usize,
    /// Not started yet.
    pub waiting: usize,
    /// Expired before they were reached.
    pub expired: usize,
}

impl Progress {
    pub fn finished(&self) -> bool {
        self.running == 0 && self.waiting == 0
    }
}

/// Counts `states` (the included items' cases; `None`: a case that no longer exists, counted
/// as expired) into a group's progress.
pub fn progress<'a>(states: impl IntoIterator<Item = Option<&'a CaseState>>) -> Progress {
    let mut p = Progress::default();
    for state in states {
        p.total += 1;
        match state {
            Some(CaseState::Pending) => p.waiting += 1,
            Some(CaseState::Decided { .. } | CaseState::Executing { .. }) => p.running += 1,
            Some(CaseState::Done { .. }) => p.done += 1,
            Some(CaseState::Failed { .. }) => p.failed += 1,
            // Busy again when re-read (Steward left it), or decided otherwise on its own card.
            Some(CaseState::Left { .. } | CaseState::EndedOutside { .. }) => p.skipped += 1,
            Some(CaseState::Expired { .. }) | None => p.expired += 1,
        }
    }
    p
}

/// The verb of a group's progress line: "Pausing", "Killing", ...
pub fn doing(option: DecisionOption) -> &'static str {
    match option {
        DecisionOption::Pause => "Pausing",
        DecisionOption::SnapshotThenKill => "Snapshotting, then killing",
        DecisionOption::Kill => "Killing",
        _ => "Running",
    }
}

/// "Pausing 1,892: 1,204 done, 3 skipped (active again), 2 failed"; "Finished pausing 1,892: ..."
/// when nothing is left to do.
pub fn progress_line(option: DecisionOption, p: &Progress) -> String {
    let verb = if p.finished() {
        let doing = doing(option);
        let mut lower = doing.chars();
        let first = lower
            .next()
            .map(|c| c.to_lowercase().to_string())
            .unwrap_or_default();
        format!("Finished {first}{}", lower.as_str())
    } else {
        doing(option).to_owned()
    };
    let mut parts = vec![format!("{} done", thousands(p.done))];
    if p.skipped > 0 {
        parts.push(format!("{} skipped (active again)", thousands(p.skipped)));
    }
    if p.failed > 0 {
        parts.push(format!("{} failed", thousands(p.failed)));
    }
    if p.expired > 0 {
        parts.push(format!("{} expired first", thousands(p.expired)));
    }
    format!("{verb} {}: {}", thousands(p.total), parts.join(", "))
}

/// `1892` as `1,892`.
pub fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cases::{Decider, Decision};

    fn user(id: &str) -> SlackUserId {
        SlackUserId::parse(id).unwrap()
    }

    fn group(option: DecisionOption, n: usize, held: bool) -> ListGroup {
        ListGroup {
            owner: Some("bob".into()),
            owner_slack: None,
            option,
            items: (0..n)
                .map(|i| ListItem {
                    sandbox: SandboxId::parse(format!("s{i}")).unwrap(),
                    case: CaseId::parse(format!("case_{i}")).unwrap(),
                })
                .collect(),
            cost_per_day_usd: 1.0,
            paused_disk_bytes: 0,
            top: vec![],
            held_by_guard: held,
            decision: GroupDecision::Open,
            excluded: vec![],
            message: 0,
            choices: Vec::new(),
        }
    }

    fn list(groups: Vec<ListGroup>, now: DateTime<Utc>) -> ListCase {
        ListCase {
            id: ListId::parse("list_1").unwrap(),
            version: 1,
            created_at: now,
            decide_by: now + chrono::Duration::days(2),
            requester: None,
            groups,
            messages: vec![],
            summary: String::new(),
            expired_at: None,
            burst: None,
        }
    }

    #[test]
    fn a_group_is_approved_once_and_a_second_approval_is_refused() {
        let now = Utc::now();
        let l = list(vec![group(DecisionOption::Pause, 3, false)], now);
        let approve = |l: &ListCase| {
            apply_list(
                l,
                ListEvent::Approve {
                    group: 0,
                    by: user("U1"),
                    over_guard: false,
                },
                now,
            )
        };
        let l = approve(&l).unwrap();
        assert!(matches!(
            l.groups[0].decision,
            GroupDecision::Approved { .. }
        ));
        assert!(matches!(approve(&l), Err(ListRefusal::AlreadyDecided(_))));
    }

    #[test]
    fn the_guard_holds_a_kill_group_until_approved_explicitly_and_approve_all_skips_it() {
        let now = Utc::now();
        let l = list(
            vec![
                group(DecisionOption::Kill, 2, true),
                group(DecisionOption::Pause, 2, false),
            ],
            now,
        );
        let held = ListEvent::Approve {
            group: 0,
            by: user("U1"),
            over_guard: false,
        };
        assert_eq!(apply_list(&l, held, now), Err(ListRefusal::HeldByGuard));
        assert_eq!(
            options_of_approve_all(&l),
            BTreeSet::from([DecisionOption::Pause])
        );
        let all = apply_list(&l, ListEvent::ApproveAll { by: user("U1") }, now).unwrap();
        assert_eq!(all.groups[0].decision, GroupDecision::Open);
        let explicit = ListEvent::Approve {
            group: 0,
            by: user("U1"),
            over_guard: true,
        };
        let l = apply_list(&all, explicit, now).unwrap();
        assert!(matches!(
            l.groups[0].decision,
            GroupDecision::Approved {
                over_guard: true,
                ..
            }
        ));
        assert_eq!(
            apply_list(&l, ListEvent::ApproveAll { by: user("U1") }, now),
            Err(ListRefusal::NothingOpen)
        );
    }

    #[test]
    fn exclusions_leave_sandboxes_out_and_refuse_strangers_and_past_dates() {
        let now = Utc::now();
        let l = list(vec![group(DecisionOption::Pause, 3, false)], now);
        let exclude = |ids: &[&str], until| ListEvent::Exclude {
            group: 0,
            sandboxes: ids.iter().map(|s| SandboxId::parse(*s).unwrap()).collect(),
            until,
            by: user("U1"),
        };
        let l = apply_list(&l, exclude(&["s1", "s1"], None), now).unwrap();
        let included: Vec<&str> = l.groups[0].included().map(|i| i.sandbox.as_str()).collect();
        assert_eq!(included, ["s0", "s2"]);
        assert_eq!(l.groups[0].excluded.len(), 1);
        assert_eq!(
            apply_list(&l, exclude(&["zz"], None), now),
            Err(ListRefusal::NotInGroup(SandboxId::parse("zz").unwrap()))
        );
        assert_eq!(
            apply_list(
                &l,
                exclude(&["s0"], Some(now - chrono::Duration::hours(1))),
                now
            ),
            Err(ListRefusal::UntilInPast)
        );
    }

    #[test]
    fn nothing_is_decided_after_the_deadline_or_once_expired() {
        let now = Utc::now();
        let l = list(vec![group(DecisionOption::Pause, 1, false)], now);
        let late = l.decide_by + chrono::Duration::seconds(1);
        let review = ListEvent::Review {
            group: 0,
            by: user("U1"),
        };
        assert_eq!(
            apply_list(&l, review.clone(), late),
            Err(ListRefusal::Expired)
        );
        let expired = apply_list(&l, ListEvent::Expire, late).unwrap();
        assert_eq!(apply_list(&expired, review, now), Err(ListRefusal::Expired));
    }

    #[test]
    fn progress_counts_item_states_and_reads_as_the_digest_line() {
        let decision = Decision {
            option: DecisionOption::Pause,
            by: Decider::Person(user("U1")),
            reason: None,
            at: Utc::now(),
        };
        let done = CaseState::Done {
            decision: decision.clone(),
            steps: vec![],
            at: Utc::now(),
        };
        let failed = CaseState::Failed {
            decision: decision.clone(),
            attempt: 1,
            steps: vec![],
            error: "boom".into(),
            at: Utc::now(),
        };
        let skipped = CaseState::Left {
            option: DecisionOption::Leave,
            by: Decider::Policy {
                policy: "busy again".into(),
            },
            reason: None,
            until: None,
            at: Utc::now(),
        };
        let running = CaseState::Executing {
            decision,
            attempt: 1,
            steps: vec![],
        };
        let mut states = vec![Some(&done); 1204];
        states.extend([Some(&skipped); 3]);
        states.extend([Some(&failed); 2]);
        states.extend(vec![Some(&running); 683]);
        let p = progress(states);
        assert_eq!(
            progress_line(DecisionOption::Pause, &p),
            "Pausing 1,892: 1,204 done, 3 skipped (active again), 2 failed"
        );
        let p = progress([Some(&done), Some(&done)]);
        assert_eq!(
            progress_line(DecisionOption::Pause, &p),
            "Finished pausing 2: 2 done"
        );
        assert_eq!(thousands(1_000_000), "1,000,000");
        assert_eq!(thousands(999), "999");
    }
}
