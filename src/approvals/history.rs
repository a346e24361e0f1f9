//! Reading the audit log back: `/sandbox history <sandbox-id|case-id>` in Slack and
//! `steward audit export` as JSON lines.
//!
//! The audit log is append-only; this file only reads it and must never write or trim it.
//! History reads a bounded slice (the latest [`HISTORY_MAX_LINES`] events of one subject, from
//! its own capped stream); the export pages through the whole log, writing as it reads.
use std::io::Write;

use chrono::{DateTime, Utc};

use super::card::{HISTORY_MAX_LINES, history_params};
use crate::cases::{CaseState, DecisionOption, Subject};
use crate::ids::{CaseId, SandboxId, TemplateId};
use crate::slack::format::when;
use crate::slack::render::{FailureParams, Message, Mrkdwn, Templates};
use crate::store::{AuditSlice, Store, StoreError};

/// Audit events read per page by the export.
pub const EXPORT_PAGE: usize = 500;

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
    let (about, slice) = match &target {
        HistoryTarget::Case(id) => (
            format!("case `{id}`"),
            store.recent_case_audit(id, HISTORY_MAX_LINES).await,
        ),
        HistoryTarget::Subject(subject) => (
            format!("{subject}"),
            store.recent_audit(subject, None, HISTORY_MAX_LINES).await,
        ),
    };
    match slice {
        Ok(AuditSlice { events, total }) => {
            let about_case = matches!(target, HistoryTarget::Case(_));
            let mut params = history_params(about, &events, about_case);
            // Only the latest events were read; the count says how many there are.
            params.count = total.max(events.len());
            if let HistoryTarget::Subject(subject) = &target {
                params.left = left_line(store, subject, Utc::now()).await;
            }
            templates.render_or_plain(&params)
        }
        Err(StoreError::Unavailable(_)) => failure(
            "Steward can't reach its database (Redis), so the history cannot be shown right now."
                .into(),
        ),
        Err(e) => failure(format!("Steward could not read the audit log: {e}.")),
    }
}

/// Who keeps `subject` out of sweeps now, since when and until when, from its Leave mark and the
/// case that made it: `Left out of sweeps until …: <@U> chose Leave it on … (case …)`. `None`
/// when no mark holds now. A mark or case that cannot be read leaves the line out: the timeline
/// below still has every event.
async fn left_line(store: &Store, subject: &Subject, now: DateTime<Utc>) -> Option<Mrkdwn> {
    let mark = store
        .left_marks(std::slice::from_ref(subject))
        .await
        .ok()?
        .into_iter()
        .next()
        .flatten()?;
    if mark.until.is_some_and(|until| until <= now) {
        return None;
    }
    let until = match mark.until {
        Some(until) => format!("until {}", when(until)),
        None => "with no end date".to_owned(),
    };
    let line = Mrkdwn::text(&format!("Left out of sweeps {until}: "));
    let by = match store.get_case(&mark.case).await {
        Ok(case) => match &case.state {
            CaseState::Left { by, option, .. } => {
                // A list's item case has no card: its Leave is an exclusion from the list.
                let chose = if case.list.is_some() && *option == DecisionOption::Leave {
                    " excluded it from a sweep's list".to_owned()
                } else {
                    format!(" chose {option}")
                };
                super::card::decider(by).and(chose)
            }
            _ => Mrkdwn::text("a decision"),
        },
        Err(_) => Mrkdwn::text("a decision"),
    };
    Some(
        line.and(by)
            .and(format!(" on {} (case `{}`).", when(mark.at), mark.case)),
    )
}

/// Writes every audit event at or after `since` to `out`, one JSON object per line, oldest
/// first, a page at a time (memory stays one page however long the log). Returns how many were
/// written.
pub async fn export(
    store: &Store,
    since: DateTime<Utc>,
    out: &mut impl Write,
) -> anyhow::Result<usize> {
    let mut written = 0;
    let mut cursor = None;
    loop {
        let (page, next) = store
            .audit_page(since, cursor.as_ref(), EXPORT_PAGE)
            .await?;
        for event in &page {
            serde_json::to_writer(&mut *out, event)?;
            out.write_all(b"\n")?;
        }
        written += page.len();
        out.flush()?;
        match next {
            Some(next) => cursor = Some(next),
            None => return Ok(written),
        }
    }
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
