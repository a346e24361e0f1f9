//! The audit log: one capped stream of every event, a capped copy per subject for bounded
//! history reads, and the paged export. It must not filter or reword events, only store and
//! read them back.
use chrono::{DateTime, Utc};
use redis::streams::{StreamId, StreamRangeReply};

use super::{PAGE, RedisStore, field, ms};
use crate::cases::Subject;
use crate::ids::CaseId;
use crate::store::keys::{AUDIT_MAX_ENTRIES, CASE_RETENTION, SUBJECT_AUDIT_MAX_ENTRIES};
use crate::store::{AuditCursor, AuditEvent, AuditSlice, StoreError, decode, encode};

/// Stream ids come from the Redis server's clock and audit times from ours, so `audit_since`
/// starts reading this much earlier and then filters by the event's own time.
const AUDIT_CLOCK_SKEW_MS: i64 = 60_000;
/// Field of an audit entry that holds the event's JSON.
const AUDIT_FIELD: &str = "event";

/// The event an audit stream entry holds.
fn audit_event(entry: &StreamId) -> Result<AuditEvent, StoreError> {
    decode(
        &format!("audit entry {}", entry.id),
        &field(entry, AUDIT_FIELD)?,
    )
}

impl RedisStore {
    pub(crate) async fn append_audit(&self, event: &AuditEvent) -> Result<(), StoreError> {
        let json = encode(event)?;
        let _: String = self
            .query(
                redis::cmd("XADD")
                    .arg(self.keys().audit())
                    .arg("MAXLEN")
                    .arg("~")
                    .arg(AUDIT_MAX_ENTRIES)
                    .arg("*")
                    .arg(AUDIT_FIELD)
                    .arg(&json),
            )
            .await?;
        // The subject's own capped copy (one key, so one slot), for bounded history reads.
        if let Some(subject) = &event.subject {
            let key = self.keys().subject_audit(subject);
            self.query_pipe::<()>(
                redis::pipe()
                    .cmd("XADD")
                    .arg(&key)
                    .arg("MAXLEN")
                    .arg("~")
                    .arg(SUBJECT_AUDIT_MAX_ENTRIES)
                    .arg("*")
                    .arg(AUDIT_FIELD)
                    .arg(&json)
                    .ignore()
                    .cmd("PEXPIRE")
                    .arg(&key)
                    .arg(ms(CASE_RETENTION))
                    .ignore(),
            )
            .await?;
        }
        Ok(())
    }

    pub(crate) async fn recent_audit(
        &self,
        subject: &Subject,
        case: Option<&CaseId>,
        limit: usize,
    ) -> Result<AuditSlice, StoreError> {
        let key = self.keys().subject_audit(subject);
        // Newest first with a COUNT: at most the capped stream is read, never the whole log.
        let read = match case {
            Some(_) => SUBJECT_AUDIT_MAX_ENTRIES as usize + PAGE,
            None => limit,
        };
        let (page, length): (StreamRangeReply, usize) = self
            .query_pipe(
                redis::pipe()
                    .cmd("XREVRANGE")
                    .arg(&key)
                    .arg("+")
                    .arg("-")
                    .arg("COUNT")
                    .arg(read.max(1))
                    .cmd("XLEN")
                    .arg(&key),
            )
            .await?;
        let mut matching = Vec::new();
        for entry in &page.ids {
            let event = audit_event(entry)?;
            if case.is_none_or(|c| event.case.as_ref() == Some(c)) {
                matching.push(event);
            }
        }
        let total = if case.is_some() {
            matching.len()
        } else {
            length
        };
        matching.truncate(limit);
        matching.reverse();
        Ok(AuditSlice {
            events: matching,
            total,
        })
    }

    pub(crate) async fn audit_page(
        &self,
        since: DateTime<Utc>,
        after: Option<&AuditCursor>,
        count: usize,
    ) -> Result<(Vec<AuditEvent>, Option<AuditCursor>), StoreError> {
        let start = match after {
            // An exclusive start: continue after the last entry read.
            Some(cursor) => format!("({}", cursor.0),
            // Stream ids come from the Redis server's clock and audit times from ours: start
            // a little earlier and filter by the event's own time.
            None => format!(
                "{}",
                (since.timestamp_millis() - AUDIT_CLOCK_SKEW_MS).max(0)
            ),
        };
        let page: StreamRangeReply = self
            .query(
                redis::cmd("XRANGE")
                    .arg(self.keys().audit())
                    .arg(&start)
                    .arg("+")
                    .arg("COUNT")
                    .arg(count),
            )
            .await?;
        let mut events = Vec::with_capacity(page.ids.len());
        for entry in &page.ids {
            let event = audit_event(entry)?;
            if event.time >= since {
                events.push(event);
            }
        }
        let next = (page.ids.len() >= count)
            .then(|| page.ids.last().map(|e| AuditCursor(e.id.clone())))
            .flatten();
        Ok((events, next))
    }
}
