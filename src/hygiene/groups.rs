//! The idle list as a person approves it: grouped by owner and recommendation, each group with
//! its count, what it costs a day, the disk it holds and its most expensive few by name. Pure.
//!
//! Leave recommendations form no group: there is nothing to approve for them. A kill group
//! (Snapshot, then kill or Kill) is marked held while the blast-radius guard is tripped.
use serde::Serialize;

use super::digest::held_disk;
use super::policy::{Recommendation, RunState};
use super::report::{IdleSandbox, SweepReport};
use crate::ids::SandboxId;

/// How many of a group's sandboxes are named as its most expensive.
pub const TOP_PER_GROUP: usize = 3;

/// One owner's sandboxes with one recommendation.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct IdleGroup {
    /// `None`: sandboxes whose metadata names no owner.
    pub owner: Option<String>,
    pub recommendation: Recommendation,
    pub count: usize,
    pub cost_per_day_usd: f64,
    /// Disk held by the group's paused sandboxes.
    pub paused_disk_bytes: u64,
    /// The most expensive few (by cost a day, then disk), by id.
    pub top: Vec<SandboxId>,
    /// Every sandbox in the group, most expensive first.
    pub sandboxes: Vec<SandboxId>,
    /// A kill group while the blast-radius guard holds kills for review.
    pub held_by_guard: bool,
}

fn order(r: Recommendation) -> u8 {
    match r {
        Recommendation::SnapshotThenKill => 0,
        Recommendation::Kill => 1,
        Recommendation::Pause => 2,
        Recommendation::Leave => 3,
    }
}

/// Unnamed owners last, then by owner, then by recommendation.
type GroupKey = (bool, Option<String>, u8);

/// The groups of `report`'s idle list: by owner (named owners first, alphabetically), then
/// Snapshot, then kill, Kill, Pause. Within a group, the report's order (most expensive first).
pub fn groups(report: &SweepReport) -> Vec<IdleGroup> {
    let mut keyed: Vec<(GroupKey, &IdleSandbox)> = report
        .idle
        .iter()
        .filter(|s| s.recommendation != Recommendation::Leave)
        .map(|s| {
            (
                (s.owner.is_none(), s.owner.clone(), order(s.recommendation)),
                s,
            )
        })
        .collect();
    // Stable: the report's cost order survives within a group.
    keyed.sort_by(|a, b| a.0.cmp(&b.0));
    let mut out: Vec<IdleGroup> = Vec::new();
    for (_, s) in keyed {
        let same = out
            .last()
            .is_some_and(|g| g.owner == s.owner && g.recommendation == s.recommendation);
        if !same {
            out.push(IdleGroup {
                owner: s.owner.clone(),
                recommendation: s.recommendation,
                count: 0,
                cost_per_day_usd: 0.0,
                paused_disk_bytes: 0,
                top: Vec::new(),
                sandboxes: Vec::new(),
                held_by_guard: report.guard.tripped && s.recommendation.is_kill(),
            });
        }
        let Some(group) = out.last_mut() else {
            continue;
        };
        group.count += 1;
        group.cost_per_day_usd += s.evidence.cost_per_day_usd;
        if s.state == RunState::Paused {
            group.paused_disk_bytes += held_disk(s);
        }
        if group.top.len() < TOP_PER_GROUP {
            group.top.push(s.id.clone());
        }
        group.sandboxes.push(s.id.clone());
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use chrono::Utc;

    use super::*;
    use crate::hygiene::SweepMode;
    use crate::hygiene::policy::IdleEvidence;
    use crate::hygiene::report::{Capacity, Counts, FleetCounts, Guard};
    use crate::ids::TemplateId;

    fn idle(id: &str, owner: Option<&str>, rec: Recommendation, cost: f64) -> IdleSandbox {
        IdleSandbox {
            id: SandboxId::parse(id).unwrap(),
            template: "base".into(),
            template_id: TemplateId::parse("base").unwrap(),
            state: RunState::Running,
            started_at: Utc::now(),
            ends_at: None,
            cpu_count: 2,
            memory_mb: 512,
            disk_size_mb: 1024,
            metadata: BTreeMap::new(),
            owner: owner.map(str::to_owned),
            owner_slack: None,
            recommendation: rec,
            reason: "idle".into(),
            evidence: IdleEvidence {
                cost_per_day_usd: cost,
                ..IdleEvidence::default()
            },
        }
    }

    fn report(idle: Vec<IdleSandbox>, tripped: bool) -> SweepReport {
        SweepReport {
            mode: SweepMode::DryRun,
            at: Utc::now(),
            fleet: FleetCounts::default(),
            pages: 1,
            listing_incomplete: None,
            counts: Counts::default(),
            idle_cost_per_day_usd: 0.0,
            capacity: Capacity::Unavailable {
                reason: "not read".into(),
            },
            guard: Guard {
                limit: 0.2,
                kill_count: 0,
                share: 0.0,
                tripped,
            },
            idle,
            exempt: vec![],
            already_open: vec![],
            problems: vec![],
            e2b_calls: 0,
            posted: None,
            groups: vec![],
        }
    }

    #[test]
    fn the_idle_list_groups_by_owner_then_recommendation_and_leaves_out_leave() {
        let r = report(
            vec![
                idle("s1", Some("bob"), Recommendation::Pause, 4.0),
                idle("s2", Some("alice"), Recommendation::Kill, 3.0),
                idle("s3", None, Recommendation::Pause, 2.5),
                idle("s4", Some("bob"), Recommendation::Pause, 2.0),
                idle("s5", Some("bob"), Recommendation::SnapshotThenKill, 1.0),
                idle("s6", Some("alice"), Recommendation::Leave, 0.5),
                idle("s7", Some("bob"), Recommendation::Pause, 0.2),
                idle("s8", Some("bob"), Recommendation::Pause, 0.1),
            ],
            true,
        );
        let g = groups(&r);
        let shape: Vec<(Option<&str>, Recommendation, usize)> = g
            .iter()
            .map(|g| (g.owner.as_deref(), g.recommendation, g.count))
            .collect();
        assert_eq!(
            shape,
            [
                (Some("alice"), Recommendation::Kill, 1),
                (Some("bob"), Recommendation::SnapshotThenKill, 1),
                (Some("bob"), Recommendation::Pause, 4),
                (None, Recommendation::Pause, 1),
            ]
        );
        let bob_pause = &g[2];
        let ids = |v: &[SandboxId]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            ids(&bob_pause.top),
            ["s1", "s4", "s7"],
            "the most expensive three"
        );
        assert_eq!(bob_pause.sandboxes.len(), 4);
        assert!((bob_pause.cost_per_day_usd - 6.3).abs() < 1e-9);
        // The guard holds kill groups only.
        assert!(g[0].held_by_guard && g[1].held_by_guard && !g[2].held_by_guard);
    }
}
