//! Reading the audit log back: `/sandbox history <sandbox-id|case-id>` in Slack and
//! `steward audit export` as JSON lines.
//!
//! The audit log is append-only; this file only reads it and must never write or trim it.
use std::io::Write;

use chrono::{DateTime, Utc};

use super::card::history_params;
use crate::cases::Subject;
use crate::ids::{CaseId, SandboxId, TemplateId};
use crate::slack::render::{FailureParams, Message, Templates};
use crate::store::{Store, StoreError};

/// What `/sandbox history` was asked about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HistoryTarget {
    Case(CaseId),
    Subject(Subject),
}

impl HistoryTarget {
    /// `case_…` is a case; an id with `/` or `:` is a template (snapshots look like that);
    /// anything else a sandbox.
    pub fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        if text.starts_with("case_") {
            return CaseId::parse(text)
                .map(HistoryTarget::Case)
                .map_err(|e| format!("`{text}` is not a case id: {e}."));
        }
        if let Some(id) = text.strip_prefix("template:") {
            return TemplateId::parse(id)
                .map(|id| HistoryTarget::Subject(Subject::Template(id)))
                .map_err(|e| format!("`{id}` is not a template id: {e}."));
        }
        if let Ok(id) = SandboxId::parse(text) {
            return Ok(HistoryTarget::Subject(Subject::Sandbox(id)));
        }
        TemplateId::parse(text)
            .map(|id| HistoryTarget::Subject(Subject::Template(id)))
            .map_err(|_| format!("`{text}` is neither a case id nor a sandbox or template id."))
    }
}

/// The timeline message for `/sandbox history <text>`.
pub async fn history_message(store: &Store, templates: &Templates, text: &str) -> Message {
    let failure = |sentence: String| templates.render_or_plain(&FailureParams { sentence });
    let target = match HistoryTarget::parse(text) {
        Ok(target) => target,
        Err(sentence) => return failure(sentence),
    };
    let (about, events) = match &target {
        HistoryTarget::Case(id) => (format!("case `{id}`"), store.audit_for_case(id).await),
        HistoryTarget::Subject(subject) => {
            (format!("{subject}"), store.audit_for_subject(subject).await)
        }
    };
    match events {
        Ok(events) => templates.render_or_plain(&history_params(about, &events)),
        Err(StoreError::Unavailable(_)) => failure(
            "Steward can't reach its database (Redis), so the history cannot be shown right now."
                .into(),
        ),
        Err(e) => failure(format!("Steward could not read the audit log: {e}.")),
    }
}

/// Writes every audit event at or after `since` to `out`, one JSON object per line, oldest
/// first. Returns how many were written.
pub async fn export(
    store: &Store,
    since: DateTime<Utc>,
    out: &mut impl Write,
) -> anyhow::Result<usize> {
    let events = store.audit_since(since).await?;
    for event in &events {
        serde_json::to_writer(&mut *out, event)?;
        out.write_all(b"\n")?;
    }
    out.flush()?;
    Ok(events.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn history_targets_are_told_apart_by_shape() {
        assert!(matches!(
            HistoryTarget::parse("case_abc").unwrap(),
            HistoryTarget::Case(_)
        ));
        assert!(matches!(
            HistoryTarget::parse("i1a2b3").unwrap(),
            HistoryTarget::Subject(Subject::Sandbox(_))
        ));
        assert!(matches!(
            HistoryTarget::parse("team/snap:1").unwrap(),
            HistoryTarget::Subject(Subject::Template(_))
        ));
        assert!(matches!(
            HistoryTarget::parse("template:base").unwrap(),
            HistoryTarget::Subject(Subject::Template(_))
        ));
        assert!(HistoryTarget::parse("what?").is_err());
    }
}
