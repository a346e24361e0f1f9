//! What an E2B lifecycle event does to the cases: a sandbox killed outside Steward while its case
//! waits for a person closes that case (nothing is run, the buttons go, the card says who and
//! when as far as E2B says), and every event about a sandbox with a case is in the audit log.
//!
//! Events arrive late, twice and out of order (webhook retries, the poller's overlap); the
//! caller drops repeats by event id, and this module never moves a case back: a `killed` event
//! only closes a case still pending, whatever arrived before it, and an older event never reopens
//! anything.
use chrono::{DateTime, Utc};

use super::{Services, audit, refresh_card};
use crate::cases::{CaseState, Event, Subject};
use crate::lifecycle::{EventKind, LifecycleEvent};
use crate::store::{Actor, StoreError, Updated};

/// What an event did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// No case is about this sandbox.
    NoCase,
    /// The case was closed: the sandbox ended outside Steward.
    Closed,
    /// Recorded in the case's audit trail; the case itself did not change.
    Noted,
}

impl Applied {
    /// The `outcome` label of `steward_e2b_events_total`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Applied::NoCase => "no_case",
            Applied::Closed => "closed",
            Applied::Noted => "noted",
        }
    }
}

/// The sentence a case closed by `event` shows.
fn ended_sentence(event: &LifecycleEvent) -> String {
    let by = event
        .metadata
        .get("owner")
        .map(|o| format!(" (owner {o})"))
        .unwrap_or_default();
    format!(
        "E2B says the sandbox was killed outside Steward at {}{by}",
        event.at.format("%Y-%m-%d %H:%M:%S UTC")
    )
}

/// Applies one event to the case about its sandbox, if any.
pub async fn apply_event(
    svc: &Services,
    event: &LifecycleEvent,
    now: DateTime<Utc>,
) -> Result<Applied, StoreError> {
    let subject = Subject::Sandbox(event.sandbox.clone());
    let Some(case) = svc.store.case_for_subject(&subject).await? else {
        return Ok(Applied::NoCase);
    };
    let actor = || Actor::Steward {
        part: "e2b events".into(),
    };
    if event.kind == EventKind::Killed && case.state == CaseState::Pending {
        let what = ended_sentence(event);
        match svc
            .store
            .apply_event(&case.id, Event::EndedOutside { what: what.clone() }, now)
            .await?
        {
            Updated::Applied(closed) => {
                audit(&svc.store, &closed, actor(), "ended_outside", &what).await;
                refresh_card(&svc.store, &svc.slack, &svc.templates, &closed).await;
                return Ok(Applied::Closed);
            }
            // Someone decided meanwhile: the decision's own re-check finds the sandbox gone.
            Updated::Rejected { .. } => {}
        }
    }
    audit(
        &svc.store,
        &case,
        actor(),
        &format!("e2b_event:{}", event.kind.as_str()),
        &format!("{} at {} (event {})", event.type_name, event.at, event.id),
    )
    .await;
    Ok(Applied::Noted)
}
