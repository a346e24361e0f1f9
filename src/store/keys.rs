//! Every Redis key Steward writes, built in this one place, and how long each lives.
//!
//! Every key that a script or pipeline touches together shares one `{hash tag}`, so each
//! multi-key operation stays in one Redis Cluster slot. Subjects are spread over
//! [`INDEX_SHARDS`] shards by a stable hash of their key; shard `NN` has the tag `{sNN}`.
//!
//! Layout under a configurable prefix `P` (`S` is a subject key such as `sandbox:<id>`, `NN`
//! its shard):
//! - `P:case:{sNN}:S:<case_id>` (hash `v`, `json`, `w`): one case; `w` is the token of the
//!   write that stored it, so a write whose answer was lost can be read back.
//! - `P:open:{sNN}:S` (string): the id of the subject's open case.
//! - `P:left:{sNN}:S` (string, JSON [`LeftMark`](super::LeftMark)): the subject's latest
//!   Leave decision, so sweeps do not ask again before its `until`.
//! - `P:due:{sNN}` (sorted set, score = decide_by in ms): the shard's open cases by deadline;
//!   an index only, every entry is re-checked by an atomic transition before anything happens.
//! - `P:decided:{sNN}` (sorted set, score = ms when the case entered Decided or its job was last
//!   re-queued): the shard's decided cases whose work has not finished; an index only.
//! - `P:audit:{sNN}:S` (stream, capped at [`SUBJECT_AUDIT_MAX_ENTRIES`]): the subject's recent
//!   audit events, so `/sandbox history` reads a bounded slice.
//!
//! A case, its open pointer, its Leave mark and its shard's two indexes share `{sNN}`, so one
//! Lua script writes them all at once. Background passes read all shards' indexes.
//! - `P:case-subject:{<case_id>}` (string): which subject a case id belongs to. It is written
//!   before the case, never changes, and its TTL is refreshed (to a day more than the case's)
//!   before every case write, so it always outlives its case.
//! - `P:steps:{<case_id>}` (hash step -> record): the step log of a case's execution.
//! - `P:jobs` and `P:jobs:runs` (streams, group [`JOB_GROUP`]): the durable work queue's lanes
//!   (decisions and restores; runs).
//! - `P:audit` (stream): the append-only audit log.
//! - `P:dedupe:<key>`, `P:lease:<name>` (strings with a TTL).
//! - `P:click:{<case_id>}:<mark>` (string with a TTL): a click on the case's card was seen; in
//!   the case-subject pointer's slot, so one script sets it and follows the pointer.
//! - `P:sweep:last-completed` (string, RFC 3339): the scheduled slot of the last finished sweep.
//! - `P:lifecycle:{sNN}:S` (list of `"<ms> <kind>"`, capped) and `P:e2b-event:{sNN}:<event_id>`
//!   (string with a TTL): a sandbox's recent E2B lifecycle events and the marks of events taken,
//!   in the sandbox subject's shard so one script marks an event, records it and reads the open
//!   pointer.
//! - `P:run:{<run_id>}` (hash `v`, `json`, `total`): one run's record (JSON only `runs` reads),
//!   its version for compare-and-swap, and how many output bytes it produced in all.
//! - `P:run-out:{<run_id>}` (string): the run's output as kept (up to its cap).
//! - `P:run-files:{<run_id>}` (string, JSON): the files of a run not yet uploaded; deleted once
//!   they are in the sandbox.
//!
//! - `P:push-test:{<run_id>}` (string, JSON): what a push-test run was started for.
//! - `P:push-latest:<owner/name>:<branch>` (string): the latest push-test run of a branch.
//! - `P:run-stop:{<run_id>}` (string): why a run was asked to stop (a newer push superseded it).
//! - `P:restore-windows` (zset): case ids offering Restore, scored by the end of the window (ms).
//! - `P:push-admission` (string, JSON `github::queue::Admission`): the pushes waiting for a
//!   push-test slot and the runs holding one; written only under the `push-admission` lease.
//! - `P:push-failing:<owner/name>:<branch>` (string, JSON [`FailingPush`](super::FailingPush)): the
//!   alert of the branch's latest failed push test, so a later pass can say "fixed in" under it.
//!
//! - `P:list:{<list_id>}` (hash `v`, `json`): a sweep's list decision, written by compare-and-swap.
//! - `P:lists` (zset): list decisions still in play, scored by creation (ms).
//!
//! A run's three keys share the run id's hash tag, so one script or pipeline touches them all.
//!
//! This file must not talk to Redis; it only names things.
use std::time::Duration;

use super::Lane;
use crate::cases::Subject;
use crate::ids::{CaseId, ListId, RunId};

/// How long a case (and its pointers and step log) is kept after its last write. The audit log
/// is the long-term record; this only bounds memory.
pub const CASE_RETENTION: Duration = Duration::from_secs(90 * 24 * 60 * 60);
/// The consumer group every replica's workers join.
pub const JOB_GROUP: &str = "steward-workers";
/// The audit stream is trimmed (approximately) beyond this many entries.
pub const AUDIT_MAX_ENTRIES: u64 = 1_000_000;
/// Each subject's own audit stream keeps (approximately) this many recent entries.
pub const SUBJECT_AUDIT_MAX_ENTRIES: u64 = 1_000;
/// How many shards the global indexes are split into (each its own Cluster slot).
pub const INDEX_SHARDS: u16 = 16;
/// The case-subject pointer lives this much longer than its case, so it never expires first.
pub const POINTER_MARGIN: Duration = Duration::from_secs(24 * 60 * 60);

/// How long a run's record, output and files are kept after their last write.
pub const RUN_RETENTION: Duration = Duration::from_secs(7 * 24 * 60 * 60);

/// The shard of a subject: a stable hash (FNV-1a) of its key, so every replica agrees.
pub fn shard_of(subject_key: &str) -> u16 {
    let mut hash: u32 = 0x811c_9dc5;
    for byte in subject_key.bytes() {
        hash ^= u32::from(byte);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    (hash % u32::from(INDEX_SHARDS)) as u16
}

fn tag(shard: u16) -> String {
    format!("{{s{shard:02}}}")
}

/// Builds keys under one prefix.
#[derive(Debug, Clone)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    /// Refuses prefixes that would break hash tags or key parsing.
    pub fn new(prefix: &str) -> Result<Self, String> {
        let prefix = prefix.trim();
        if prefix.is_empty() {
            return Err("the Redis key prefix is empty".to_owned());
        }
        if prefix.contains(['{', '}']) || prefix.chars().any(char::is_whitespace) {
            return Err(format!(
                "the Redis key prefix {prefix:?} may not contain braces or spaces"
            ));
        }
        Ok(Self {
            prefix: prefix.to_owned(),
        })
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    pub fn case(&self, subject: &Subject, id: &CaseId) -> String {
        self.case_by_subject_key(&subject.key(), id)
    }

    /// Same as [`Keys::case`] when only the subject's key text is known. The click script
    /// (`redis/click.rs`) builds this key the same way from the pointer it reads: change both.
    pub fn case_by_subject_key(&self, subject_key: &str, id: &CaseId) -> String {
        let tag = tag(shard_of(subject_key));
        format!("{}:case:{tag}:{subject_key}:{id}", self.prefix)
    }

    pub fn open_case(&self, subject: &Subject) -> String {
        self.open_case_by_subject_key(&subject.key())
    }

    pub fn open_case_by_subject_key(&self, subject_key: &str) -> String {
        let tag = tag(shard_of(subject_key));
        format!("{}:open:{tag}:{subject_key}", self.prefix)
    }

    pub fn case_subject(&self, id: &CaseId) -> String {
        format!("{}:case-subject:{{{}}}", self.prefix, id)
    }

    pub fn steps(&self, id: &CaseId) -> String {
        format!("{}:steps:{{{}}}", self.prefix, id)
    }

    /// The deadline index of one shard.
    pub fn due(&self, shard: u16) -> String {
        format!("{}:due:{}", self.prefix, tag(shard))
    }

    /// The decided-but-unfinished index of one shard.
    pub fn decided(&self, shard: u16) -> String {
        format!("{}:decided:{}", self.prefix, tag(shard))
    }

    /// The stream of one lane of the job queue. Decisions keep the name the queue had before
    /// lanes, so jobs queued by an older replica are still carried out.
    pub fn jobs(&self, lane: Lane) -> String {
        match lane {
            Lane::Decisions => format!("{}:jobs", self.prefix),
            Lane::Runs => format!("{}:jobs:runs", self.prefix),
        }
    }

    pub fn audit(&self) -> String {
        format!("{}:audit", self.prefix)
    }

    pub fn dedupe(&self, key: &str) -> String {
        format!("{}:dedupe:{}", self.prefix, key)
    }

    /// A click on `case`'s card, in the slot of [`Keys::case_subject`].
    pub fn click(&self, case: &CaseId, mark: &str) -> String {
        format!("{}:click:{{{}}}:{}", self.prefix, case, mark)
    }

    pub fn lease(&self, name: &str) -> String {
        format!("{}:lease:{}", self.prefix, name)
    }

    /// The subject's own (capped) audit stream.
    pub fn subject_audit(&self, subject: &Subject) -> String {
        let key = subject.key();
        format!("{}:audit:{}:{key}", self.prefix, tag(shard_of(&key)))
    }

    /// Shares the subject's hash tag, like its cases.
    pub fn left(&self, subject: &Subject) -> String {
        let key = subject.key();
        format!("{}:left:{}:{key}", self.prefix, tag(shard_of(&key)))
    }

    /// A `SCAN MATCH` pattern for the Leave marks of one shard (`Some`) or of all (`None`), the
    /// prefix escaped so none of its characters acts as a wildcard.
    pub fn left_pattern(&self, shard: Option<u16>) -> String {
        let escaped: String = self
            .prefix
            .chars()
            .flat_map(|c| {
                let special = matches!(c, '*' | '?' | '[' | ']' | '\\' | '^');
                special
                    .then_some('\\')
                    .into_iter()
                    .chain(std::iter::once(c))
            })
            .collect();
        match shard {
            Some(shard) => format!("{escaped}:left:{}:*", tag(shard)),
            None => format!("{escaped}:left:*"),
        }
    }

    /// The subject of a Leave mark's key, read back from [`Keys::left`]; `None` for a key of
    /// another layout.
    pub fn subject_of_left(&self, key: &str) -> Option<Subject> {
        let rest = key.strip_prefix(&self.prefix)?.strip_prefix(":left:{s")?;
        let (_, subject_key) = rest.split_once("}:")?;
        Subject::from_key(subject_key)
    }

    pub fn last_sweep(&self) -> String {
        format!("{}:sweep:last-completed", self.prefix)
    }

    /// A sandbox's recent lifecycle events (a capped list of `"<ms> <kind>"`), in the slot of
    /// the sandbox's open-case pointer ([`Keys::open_case`]).
    pub fn sandbox_lifecycle(&self, sandbox: &str) -> String {
        let subject_key = format!("sandbox:{sandbox}");
        let tag = tag(shard_of(&subject_key));
        format!("{}:lifecycle:{tag}:{subject_key}", self.prefix)
    }

    /// The mark that says E2B lifecycle event `event` (about `sandbox`) was taken, in the slot of
    /// the sandbox's lifecycle and open-case pointer, so one script sets it, records the event
    /// and says whether a case is open.
    pub fn e2b_event(&self, sandbox: &str, event: &str) -> String {
        let subject_key = format!("sandbox:{sandbox}");
        let tag = tag(shard_of(&subject_key));
        format!("{}:e2b-event:{tag}:{event}", self.prefix)
    }

    /// A `[[watch]]` burst rule's recent creations in one group (zset scored by ms).
    pub fn watch_creations(&self, rule: &str, group: &str) -> String {
        format!(
            "{}:watch:creations:{}",
            self.prefix,
            watch_digest(rule, group)
        )
    }

    /// The open alert list of a `[[watch]]` burst rule's group.
    pub fn watch_alert(&self, rule: &str, group: &str) -> String {
        format!("{}:watch:alert:{}", self.prefix, watch_digest(rule, group))
    }

    /// The time of the newest E2B lifecycle event the poller has read.
    pub fn events_watermark(&self) -> String {
        format!("{}:e2b-events:watermark", self.prefix)
    }

    /// One run's record (a hash).
    pub fn run(&self, id: &RunId) -> String {
        format!("{}:run:{{{}}}", self.prefix, id)
    }

    /// One run's kept output (a string), in the run's slot.
    pub fn run_output(&self, id: &RunId) -> String {
        format!("{}:run-out:{{{}}}", self.prefix, id)
    }

    /// The end of one run's output past the kept head (a string, at most twice the cap between
    /// trims), in the run's slot.
    pub fn run_output_tail(&self, id: &RunId) -> String {
        format!("{}:run-tail:{{{}}}", self.prefix, id)
    }

    /// One run's files until they are uploaded, in the run's slot.
    pub fn run_files(&self, id: &RunId) -> String {
        format!("{}:run-files:{{{}}}", self.prefix, id)
    }

    /// What a push-test run was started for, in the run's slot.
    pub fn push_test(&self, id: &RunId) -> String {
        format!("{}:push-test:{{{}}}", self.prefix, id)
    }

    /// Why a run was asked to stop, in the run's slot.
    pub fn run_stop(&self, id: &RunId) -> String {
        format!("{}:run-stop:{{{}}}", self.prefix, id)
    }

    /// The latest push-test run of a repository's branch.
    pub fn push_latest(&self, repository: &str, branch: &str) -> String {
        format!("{}:push-latest:{repository}:{branch}", self.prefix)
    }

    /// Cases offering Restore, scored by when the offer ends (ms).
    pub fn restore_windows(&self) -> String {
        format!("{}:restore-windows", self.prefix)
    }

    /// Who waits for a push-test slot and who holds one (JSON), changed under a lease.
    pub fn push_admission(&self) -> String {
        format!("{}:push-admission", self.prefix)
    }

    /// The alert of a branch's latest failed push test (JSON), until a push passes again.
    pub fn push_failing(&self, repository: &str, branch: &str) -> String {
        format!("{}:push-failing:{repository}:{branch}", self.prefix)
    }

    /// Case cards whose last update failed: case id -> failed repairs in a row (a hash).
    pub fn stale_cards(&self) -> String {
        format!("{}:cards:stale", self.prefix)
    }

    /// A sweep's list decision (hash `v`, `json`).
    pub fn list(&self, id: &ListId) -> String {
        format!("{}:list:{{{}}}", self.prefix, id.as_str())
    }

    /// List decisions still in play (zset scored by creation, ms).
    pub fn active_lists(&self) -> String {
        format!("{}:lists", self.prefix)
    }

    /// Where the digest of the scheduled sweep for `slot` (RFC 3339) was posted.
    pub fn sweep_digest(&self, slot: &str) -> String {
        format!("{}:sweep:digest:{}", self.prefix, slot)
    }
}

/// The hash tag of a key (the text between the first `{` and the next `}`), as Redis Cluster
/// computes slots. Used by tests to prove a case's keys share a slot.
pub fn hash_tag(key: &str) -> Option<&str> {
    let start = key.find('{')?;
    let len = key[start + 1..].find('}')?;
    (len > 0).then(|| &key[start + 1..start + 1 + len])
}

/// A rule name and a group (an owner, a template, any metadata value) as a short key part:
/// whatever they hold, the key stays short and printable.
fn watch_digest(rule: &str, group: &str) -> String {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    h.update(rule.as_bytes());
    h.update([0]);
    h.update(group.as_bytes());
    h.finalize()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::SandboxId;

    #[test]
    fn a_case_its_pointer_leave_mark_and_shard_indexes_share_one_hash_tag() {
        let keys = Keys::new("steward").unwrap();
        let subject = Subject::Sandbox(SandboxId::parse("sbx1").unwrap());
        let id = CaseId::generate();
        let case = keys.case(&subject, &id);
        let shard = shard_of(&subject.key());
        let tag = hash_tag(&case).unwrap().to_owned();
        assert_eq!(tag, format!("s{shard:02}"));
        for other in [
            keys.open_case(&subject),
            keys.left(&subject),
            keys.subject_audit(&subject),
            keys.due(shard),
            keys.decided(shard),
        ] {
            assert_eq!(hash_tag(&other), Some(tag.as_str()), "{other}");
        }
        assert!(case.starts_with("steward:case:"));
    }

    #[test]
    fn a_runs_record_output_and_files_share_one_hash_tag() {
        let keys = Keys::new("steward").unwrap();
        let id = RunId::parse("run_abc").unwrap();
        for key in [
            keys.run(&id),
            keys.run_output(&id),
            keys.run_output_tail(&id),
            keys.run_files(&id),
        ] {
            assert_eq!(hash_tag(&key), Some("run_abc"), "{key}");
        }
    }

    #[test]
    fn subjects_spread_over_every_shard_and_keep_theirs() {
        let shards: std::collections::HashSet<u16> = (0..500)
            .map(|n| shard_of(&format!("sandbox:sbx{n}")))
            .collect();
        assert_eq!(shards.len(), usize::from(INDEX_SHARDS));
        // Stable across processes and versions: this value is part of the key layout.
        assert_eq!(shard_of("sandbox:sbx1"), shard_of("sandbox:sbx1"));
        assert!(shard_of("") < INDEX_SHARDS);
    }

    #[test]
    fn leave_mark_keys_are_found_by_their_pattern_and_read_back() {
        let keys = Keys::new("st*e[w]").unwrap();
        let subject = Subject::Sandbox(SandboxId::parse("sbx1").unwrap());
        let key = keys.left(&subject);
        assert_eq!(keys.subject_of_left(&key), Some(subject.clone()));
        assert_eq!(keys.left_pattern(None), "st\\*e\\[w\\]:left:*");
        let shard = shard_of(&subject.key());
        assert_eq!(
            keys.left_pattern(Some(shard)),
            format!("st\\*e\\[w\\]:left:{{s{shard:02}}}:*")
        );
        assert_eq!(keys.subject_of_left(&keys.open_case(&subject)), None);
    }

    #[test]
    fn prefixes_with_braces_or_spaces_are_refused() {
        assert!(Keys::new("a{b}").is_err());
        assert!(Keys::new("a b").is_err());
        assert!(Keys::new("  ").is_err());
        assert_eq!(Keys::new(" ok ").unwrap().prefix(), "ok");
    }
}
