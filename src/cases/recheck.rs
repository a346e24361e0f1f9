//! The re-check before a destructive step: does what E2B reports now still match what people
//! decided on? A sandbox that resumed, restarted, changed metadata or became busy again, or a
//! template whose users changed, is asked about again instead of being destroyed.
//!
//! Pure: the worker reads E2B and passes both sides in; this file does no I/O and reads no clock.
use std::collections::BTreeSet;

use chrono::{DateTime, Utc};

use super::{Evidence, TemplateUsage};

/// What changed in a sandbox between `decided` (the evidence on the card people answered) and
/// `current` (read from E2B right now, with a fresh metrics sample when E2B had one), or `None`.
///
/// `own_snapshot_at` is when this decision's own snapshot step finished: E2B pauses a sandbox
/// briefly while it snapshots it, so a new run that started no later than that is Steward's
/// doing, not a restart by its user. `busiest_cpu_pct` is the highest CPU among the fresh
/// samples (since the decision), and `cpu_threshold_pct` the idle threshold: a sandbox people
/// saw idle that has used more CPU than that is busy again.
pub fn sandbox_changes(
    decided: &Evidence,
    current: &Evidence,
    own_snapshot_at: Option<DateTime<Utc>>,
    busiest_cpu_pct: Option<f64>,
    cpu_threshold_pct: f64,
) -> Option<String> {
    let mut comparable = current.clone();
    // E2B cannot say since when a sandbox is idle; the CPU check below stands in for it.
    comparable.idle_since = decided.idle_since;
    let restarted_by_our_snapshot = own_snapshot_at.is_some_and(|snapshot_at| {
        decided.state == current.state
            && current
                .started_at
                .is_some_and(|started| decided.started_at < Some(started) && started <= snapshot_at)
    });
    if restarted_by_our_snapshot {
        comparable.started_at = decided.started_at;
    }
    let mut changes: Vec<String> = decided.staleness(&comparable).into_iter().collect();
    let was_idle = decided.idle_since.is_some()
        || decided
            .metrics
            .as_ref()
            .is_some_and(|m| m.cpu_pct < cpu_threshold_pct);
    if was_idle
        && let Some(busiest) = busiest_cpu_pct
        && busiest >= cpu_threshold_pct
    {
        changes.push(format!(
            "it used {busiest:.1} % CPU, above the idle threshold of {cpu_threshold_pct} %"
        ));
    }
    (!changes.is_empty()).then(|| changes.join("; "))
}

/// What changed in who uses a template: the set of sandboxes made from it (not only their
/// number: one leaving and another arriving is a change) and the number of snapshots counted.
pub fn template_changes(decided: &TemplateUsage, current: &TemplateUsage) -> Option<String> {
    let before: BTreeSet<&str> = decided.sandboxes.iter().map(|s| s.as_str()).collect();
    let now: BTreeSet<&str> = current.sandboxes.iter().map(|s| s.as_str()).collect();
    let mut changes = Vec::new();
    let arrived: Vec<&str> = now.difference(&before).copied().collect();
    let left: Vec<&str> = before.difference(&now).copied().collect();
    if !arrived.is_empty() {
        changes.push(format!("{} now use it", listed(&arrived)));
    }
    if !left.is_empty() {
        changes.push(format!("{} no longer use it", listed(&left)));
    }
    if decided.snapshots != current.snapshots {
        changes.push(format!(
            "its sandboxes have {} snapshot(s), not {}",
            current.snapshots, decided.snapshots
        ));
    }
    (!changes.is_empty()).then(|| changes.join("; "))
}

/// `a, b and 3 more` for a note on a card.
fn listed(ids: &[&str]) -> String {
    const SHOWN: usize = 3;
    let mut text = ids
        .iter()
        .take(SHOWN)
        .map(|id| format!("`{id}`"))
        .collect::<Vec<_>>()
        .join(", ");
    if ids.len() > SHOWN {
        text.push_str(&format!(" and {} more", ids.len() - SHOWN));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cases::Metrics;
    use crate::ids::SandboxId;

    fn t(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(secs, 0).unwrap()
    }

    fn cpu(pct: f64) -> Option<Metrics> {
        Some(Metrics {
            cpu_pct: pct,
            mem_used: 1,
            mem_total: 2,
            disk_used: 1,
            disk_total: 2,
        })
    }

    fn idle_running() -> Evidence {
        Evidence {
            state: Some("running".into()),
            started_at: Some(t(100)),
            metrics: cpu(0.3),
            ..Evidence::default()
        }
    }

    fn usage(ids: &[&str], snapshots: u32) -> TemplateUsage {
        TemplateUsage {
            sandboxes: ids.iter().map(|i| SandboxId::parse(*i).unwrap()).collect(),
            snapshots,
        }
    }

    #[test]
    fn an_unchanged_idle_sandbox_passes() {
        let now = idle_running();
        assert_eq!(
            sandbox_changes(&idle_running(), &now, None, None, 2.0),
            None
        );
    }

    #[test]
    fn a_sandbox_seen_idle_that_is_busy_now_is_asked_about_again() {
        let now = idle_running();
        let change = sandbox_changes(&idle_running(), &now, None, Some(55.0), 2.0).unwrap();
        assert!(change.contains("55.0 % CPU"), "{change}");
    }

    #[test]
    fn a_sandbox_people_saw_busy_is_not_asked_again_for_being_busy() {
        let mut busy = idle_running();
        busy.metrics = cpu(70.0);
        assert_eq!(sandbox_changes(&busy, &busy, None, Some(80.0), 2.0), None);
    }

    #[test]
    fn a_restart_is_a_change_unless_our_own_snapshot_made_it() {
        let mut now = idle_running();
        now.started_at = Some(t(200));
        let change = sandbox_changes(&idle_running(), &now, None, None, 2.0).unwrap();
        assert!(change.contains("restarted"), "{change}");
        assert_eq!(
            sandbox_changes(&idle_running(), &now, Some(t(201)), Some(0.5), 2.0),
            None
        );
        let later = sandbox_changes(&idle_running(), &now, Some(t(150)), None, 2.0).unwrap();
        assert!(later.contains("restarted"), "{later}");
    }

    #[test]
    fn a_resume_or_new_metadata_is_a_change() {
        let paused = Evidence {
            state: Some("paused".into()),
            ..idle_running()
        };
        let change = sandbox_changes(&paused, &idle_running(), None, None, 2.0).unwrap();
        assert!(change.contains("from paused to running"), "{change}");
        let mut tagged = idle_running();
        tagged.metadata.insert("owner".into(), "ana".into());
        let change = sandbox_changes(&idle_running(), &tagged, None, None, 2.0).unwrap();
        assert!(change.contains("metadata"), "{change}");
    }

    #[test]
    fn template_users_are_compared_as_a_set_with_the_snapshot_count() {
        assert_eq!(
            template_changes(&usage(&["a", "b"], 1), &usage(&["b", "a"], 1)),
            None
        );
        let swapped = template_changes(&usage(&["a"], 0), &usage(&["c"], 0)).unwrap();
        assert!(swapped.contains("`c` now use it"), "{swapped}");
        assert!(swapped.contains("`a` no longer use it"), "{swapped}");
        let snap = template_changes(&usage(&["a"], 0), &usage(&["a"], 2)).unwrap();
        assert!(snap.contains("2 snapshot(s), not 0"), "{snap}");
    }
}
