//! Every Redis key Steward writes, built in this one place, and how long each lives.
//!
//! Layout under a configurable prefix `P`:
//! - `P:case:{sandbox:<id>}:<case_id>` (hash `v`, `json`): one case, tagged by its **subject**.
//! - `P:open:{sandbox:<id>}` (string): the id of the subject's open case.
//!   The case and its subject's pointer share the `{subject}` hash tag, so the Lua scripts that
//!   open a case and move it between states touch one Redis Cluster slot.
//! - `P:case-subject:{<case_id>}` (string): which subject a case id belongs to. It is written
//!   before the case and never changes, so a crash between the two writes leaves only a pointer
//!   to nothing, which reads as "not found".
//! - `P:steps:{<case_id>}` (hash step -> record): the step log of a case's execution.
//! - `P:due` (sorted set, score = decide_by in ms): open cases by deadline; an index only,
//!   every entry is re-checked by an atomic transition before anything happens.
//! - `P:decided` (sorted set, score = ms when the case entered Decided or its job was last
//!   re-queued): decided cases whose work has not finished (Decided or Executing). Written
//!   before a case enters Decided and removed after it leaves, so it may hold strays but never
//!   misses a case; an index only.
//! - `P:jobs` (stream, group [`JOB_GROUP`]): the durable work queue.
//! - `P:audit` (stream): the append-only audit log.
//! - `P:dedupe:<key>`, `P:lease:<name>` (strings with a TTL).
//! - `P:left:{sandbox:<id>}` (string, JSON [`LeftMark`](super::LeftMark)): the subject's latest
//!   Leave decision, so sweeps do not ask again before its `until`.
//! - `P:sweep:last-completed` (string, RFC 3339): the scheduled slot of the last finished sweep.
//!
//! This file must not talk to Redis; it only names things.
use std::time::Duration;

use crate::cases::Subject;
use crate::ids::CaseId;

/// How long a case (and its pointers and step log) is kept after its last write. The audit log
/// is the long-term record; this only bounds memory.
pub const CASE_RETENTION: Duration = Duration::from_secs(90 * 24 * 60 * 60);
/// The consumer group every replica's workers join.
pub const JOB_GROUP: &str = "steward-workers";
/// The audit stream is trimmed (approximately) beyond this many entries.
pub const AUDIT_MAX_ENTRIES: u64 = 1_000_000;

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
        format!("{}:case:{{{}}}:{}", self.prefix, subject.key(), id)
    }

    /// Same as [`Keys::case`] when only the subject's key text is known.
    pub fn case_by_subject_key(&self, subject_key: &str, id: &CaseId) -> String {
        format!("{}:case:{{{}}}:{}", self.prefix, subject_key, id)
    }

    pub fn open_case(&self, subject: &Subject) -> String {
        self.open_case_by_subject_key(&subject.key())
    }

    pub fn open_case_by_subject_key(&self, subject_key: &str) -> String {
        format!("{}:open:{{{}}}", self.prefix, subject_key)
    }

    pub fn case_subject(&self, id: &CaseId) -> String {
        format!("{}:case-subject:{{{}}}", self.prefix, id)
    }

    pub fn steps(&self, id: &CaseId) -> String {
        format!("{}:steps:{{{}}}", self.prefix, id)
    }

    pub fn due(&self) -> String {
        format!("{}:due", self.prefix)
    }

    pub fn decided(&self) -> String {
        format!("{}:decided", self.prefix)
    }

    pub fn jobs(&self) -> String {
        format!("{}:jobs", self.prefix)
    }

    pub fn audit(&self) -> String {
        format!("{}:audit", self.prefix)
    }

    pub fn dedupe(&self, key: &str) -> String {
        format!("{}:dedupe:{}", self.prefix, key)
    }

    pub fn lease(&self, name: &str) -> String {
        format!("{}:lease:{}", self.prefix, name)
    }

    /// Shares the subject's hash tag, like its cases.
    pub fn left(&self, subject: &Subject) -> String {
        format!("{}:left:{{{}}}", self.prefix, subject.key())
    }

    pub fn last_sweep(&self) -> String {
        format!("{}:sweep:last-completed", self.prefix)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::SandboxId;

    #[test]
    fn a_case_and_its_subject_pointer_share_one_hash_tag() {
        let keys = Keys::new("steward").unwrap();
        let subject = Subject::Sandbox(SandboxId::parse("sbx1").unwrap());
        let id = CaseId::generate();
        let case = keys.case(&subject, &id);
        assert_eq!(hash_tag(&case), Some("sandbox:sbx1"));
        assert_eq!(hash_tag(&case), hash_tag(&keys.open_case(&subject)));
        assert!(case.starts_with("steward:case:"));
    }

    #[test]
    fn prefixes_with_braces_or_spaces_are_refused() {
        assert!(Keys::new("a{b}").is_err());
        assert!(Keys::new("a b").is_err());
        assert!(Keys::new("  ").is_err());
        assert_eq!(Keys::new(" ok ").unwrap().prefix(), "ok");
    }
}
