//! Admission of push-test runs: at most `[github] max_runs` at once overall and
//! `max_runs_per_repository` per repository; the rest wait in the order their pushes came, and
//! start as runs end. A newer push to a branch drops that branch's push still waiting (it would
//! test an outdated commit) and asks the branch's running one to stop.
//!
//! The state (who waits, who runs) is one record in the store, changed only under the
//! `push-admission` lease, so replicas never start more than the caps allow nor the same push
//! twice. [`plan`] is the pure part: given the state, what to start now.
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::event::PushEvent;
use crate::ids::RunId;
use crate::store::{Store, StoreError};

/// The lease that serialises changes to the admission state.
pub const ADMISSION_LEASE: &str = "push-admission";
/// How long one holder may keep it (a change takes milliseconds; a crashed holder loses it).
const LEASE_TTL: Duration = Duration::from_secs(15);
/// How long a caller waits for another replica's change before giving up.
const LEASE_WAIT: Duration = Duration::from_secs(5);

/// A push waiting for a slot.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Waiting {
    pub delivery: String,
    pub repository: String,
    pub branch: String,
    pub queued_at: DateTime<Utc>,
    pub event: PushEvent,
}

/// A push-test run holding a slot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Running {
    pub run: RunId,
    pub repository: String,
}

/// Who waits and who runs.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Admission {
    pub waiting: Vec<Waiting>,
    pub running: Vec<Running>,
}

/// The caps (`[github]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    pub max_runs: usize,
    pub max_runs_per_repository: usize,
}

impl Default for Caps {
    fn default() -> Self {
        Self {
            max_runs: 8,
            max_runs_per_repository: 2,
        }
    }
}

/// Where a push left its branch: what it moved the branch from and to, and when its head commit
/// was made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushPoint {
    pub before: String,
    pub after: String,
    pub committed_at: Option<DateTime<Utc>>,
}

impl PushPoint {
    pub fn of(event: &PushEvent) -> Self {
        Self {
            before: event.before.clone(),
            after: event.after.clone(),
            committed_at: event.committed_at(),
        }
    }
}

fn short(sha: &str) -> &str {
    &sha[..sha.len().min(12)]
}

/// Whether `incoming` may replace `known`, the branch's newest push Steward knows of (waiting,
/// running or tested), and if not, why: a push moves the branch on only when it starts where
/// `known` ended (`before` = its `after`, a force push included), or, when the two do not chain,
/// when its head commit is not older. A push of a commit already seen for the ref (`seen`: the
/// same body sent again under a new delivery id) and a push `known` was made on top of are
/// replays of the past. Pure.
pub fn refuse_older(incoming: &PushPoint, known: Option<&PushPoint>, seen: bool) -> Option<String> {
    let chained = known.is_some_and(|k| incoming.before.eq_ignore_ascii_case(&k.after));
    if chained {
        return None;
    }
    if seen {
        return Some(format!(
            "refused: a push of {} to this branch was already handled (a replay under a new delivery id)",
            short(&incoming.after)
        ));
    }
    let known = known?;
    if incoming.after.eq_ignore_ascii_case(&known.after) {
        return Some(format!(
            "refused: {} is already the branch's newest push",
            short(&incoming.after)
        ));
    }
    if known.before.eq_ignore_ascii_case(&incoming.after) {
        return Some(format!(
            "refused: {} is older than {}, which was pushed on top of it",
            short(&incoming.after),
            short(&known.after)
        ));
    }
    match (incoming.committed_at, known.committed_at) {
        (Some(ours), Some(theirs)) if ours < theirs => Some(format!(
            "refused: {} (committed {}) is older than the branch's newest push {} (committed {})",
            short(&incoming.after),
            ours.format("%Y-%m-%d %H:%M:%S UTC"),
            short(&known.after),
            theirs.format("%Y-%m-%d %H:%M:%S UTC")
        )),
        _ => None,
    }
}

/// Which waiting pushes (indexes into `waiting`, in order) may start now. A repository at its
/// cap does not hold up pushes of other repositories behind it. Pure.
pub fn plan(state: &Admission, caps: Caps) -> Vec<usize> {
    let mut total = state.running.len();
    let mut per_repo: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for r in &state.running {
        *per_repo.entry(r.repository.as_str()).or_default() += 1;
    }
    let mut start = Vec::new();
    for (i, w) in state.waiting.iter().enumerate() {
        if total >= caps.max_runs {
            break;
        }
        let n = per_repo.entry(w.repository.as_str()).or_default();
        if *n >= caps.max_runs_per_repository {
            continue;
        }
        *n += 1;
        total += 1;
        start.push(i);
    }
    start
}

/// Holds the admission lease for the life of the value; call [`AdmissionLock::release`].
pub struct AdmissionLock {
    holder: String,
}

impl AdmissionLock {
    /// Takes the lease, waiting up to a few seconds for another holder.
    pub async fn take(store: &Store) -> Result<Self, StoreError> {
        let holder = uuid::Uuid::new_v4().to_string();
        let deadline = tokio::time::Instant::now() + LEASE_WAIT;
        loop {
            if store
                .acquire_lease(ADMISSION_LEASE, &holder, LEASE_TTL)
                .await?
            {
                return Ok(Self { holder });
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(StoreError::Unavailable(
                    "another replica is holding the push-test queue".into(),
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Gives the lease back (it also runs out by itself).
    pub async fn release(self, store: &Store) {
        if let Err(e) = store.release_lease(ADMISSION_LEASE, &self.holder).await {
            tracing::warn!(error = %e, "could not release the push-test queue's lease");
        }
    }
}

/// Reads the admission state (empty when there is none).
pub async fn load(store: &Store) -> Result<Admission, StoreError> {
    match store.push_admission().await? {
        None => Ok(Admission::default()),
        Some(json) => serde_json::from_str(&json)
            .map_err(|e| StoreError::Corrupt(format!("the push-test queue: {e}"))),
    }
}

/// Writes the admission state.
pub async fn save(store: &Store, state: &Admission) -> Result<(), StoreError> {
    let json = serde_json::to_string(state).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    store.set_push_admission(&json).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiting(repo: &str) -> Waiting {
        let event: PushEvent = serde_json::from_value(serde_json::json!({
            "ref": "refs/heads/main", "after": "a".repeat(40),
            "repository": {"full_name": repo},
        }))
        .unwrap();
        Waiting {
            delivery: "d".into(),
            repository: repo.into(),
            branch: "main".into(),
            queued_at: Utc::now(),
            event,
        }
    }

    fn running(repo: &str, n: u32) -> Running {
        Running {
            run: RunId::parse(format!("run_{repo}{n}").replace('/', "_")).unwrap(),
            repository: repo.into(),
        }
    }

    fn point(before: char, after: char, at: Option<i64>) -> PushPoint {
        PushPoint {
            before: before.to_string().repeat(40),
            after: after.to_string().repeat(40),
            committed_at: at.map(|s| DateTime::from_timestamp(s, 0).unwrap()),
        }
    }

    #[test]
    fn only_a_push_that_moves_the_branch_on_replaces_the_newest_one() {
        let known = point('a', 'b', Some(2_000));
        // b -> c chains on b: newer, a force push to an older commit included.
        assert_eq!(
            refuse_older(&point('b', 'c', Some(1)), Some(&known), false),
            None
        );
        assert_eq!(
            refuse_older(&point('b', 'a', Some(1)), Some(&known), true),
            None
        );
        // The same commit again, or the one `known` was pushed on top of: the past.
        let again = refuse_older(&point('a', 'b', Some(2_000)), Some(&known), false).unwrap();
        assert!(
            again.contains("already the branch's newest push"),
            "{again}"
        );
        let older = refuse_older(&point('0', 'a', Some(1_000)), Some(&known), false).unwrap();
        assert!(older.contains("pushed on top of it"), "{older}");
        // Unchained: the head commit's time decides; without times, GitHub's order stands.
        let stale = refuse_older(&point('x', 'y', Some(1_000)), Some(&known), false).unwrap();
        assert!(
            stale.contains("older than the branch's newest push"),
            "{stale}"
        );
        assert_eq!(
            refuse_older(&point('x', 'y', Some(3_000)), Some(&known), false),
            None
        );
        assert_eq!(
            refuse_older(&point('x', 'y', None), Some(&known), false),
            None
        );
        // A commit already pushed to the ref, sent again, is a replay even with nothing known.
        let replay = refuse_older(&point('x', 'y', None), None, true).unwrap();
        assert!(replay.contains("replay"), "{replay}");
        assert_eq!(refuse_older(&point('x', 'y', None), None, false), None);
    }

    #[test]
    fn pushes_start_in_order_within_both_caps_and_a_full_repository_does_not_block_others() {
        let caps = Caps {
            max_runs: 3,
            max_runs_per_repository: 1,
        };
        let state = Admission {
            waiting: vec![
                waiting("a/x"),
                waiting("a/x"),
                waiting("b/y"),
                waiting("c/z"),
            ],
            running: vec![],
        };
        // a/x once (its second waits), then b/y and c/z: 3 in all.
        assert_eq!(plan(&state, caps), vec![0, 2, 3]);
        let busy = Admission {
            waiting: state.waiting.clone(),
            running: vec![running("a/x", 1), running("q/q", 1)],
        };
        // a/x is at its cap; one slot is left overall: b/y, the oldest that fits.
        assert_eq!(plan(&busy, caps), vec![2]);
        let full = Admission {
            waiting: state.waiting,
            running: vec![running("q/q", 1), running("r/r", 1), running("s/s", 1)],
        };
        assert!(plan(&full, caps).is_empty());
    }
}
