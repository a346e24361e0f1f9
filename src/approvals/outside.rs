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
use crate::store::{Actor, Store, StoreError, TakenEvent, Updated};

/// What an event did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// No case is about this sandbox.
    NoCase,
    /// The case was closed: the sandbox ended outside Steward.
    Closed,
    /// Recorded in the case's audit trail; the case itself did not change.
    Noted,
    /// A `[[watch]]` rule raised it (a case, a notice, a burst alert, or a dry-run log line).
    Watched,
}

/// Why an event was not handled; the poller's next read handles it again (a webhook delivery was
/// answered already, so E2B does not deliver it again).
#[derive(Debug, thiserror::Error)]
pub enum EventError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Watch(#[from] super::watch::WatchError),
}

impl Applied {
    /// The `outcome` label of `steward_e2b_events_total`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Applied::NoCase => "no_case",
            Applied::Closed => "closed",
            Applied::Noted => "noted",
            Applied::Watched => "watched",
        }
    }
}

/// What the card of a waiting case says about `event` (and the state E2B now reports), for the
/// changes a person deciding should know of; `None` for the others.
fn observation(event: &LifecycleEvent) -> Option<(String, Option<String>)> {
    let at = event.at.format("%Y-%m-%d %H:%M UTC");
    match event.kind {
        EventKind::Paused => Some((
            format!("E2B: the sandbox was paused at {at}, outside Steward."),
            Some("paused".to_owned()),
        )),
        EventKind::Resumed => Some((
            format!(
                "E2B: the sandbox was resumed at {at}, outside Steward: someone may be using it again, so the evidence above is older than that; look again before deciding."
            ),
            Some("running".to_owned()),
        )),
        EventKind::Updated => event.set_timeout.map(|end| {
            (
                format!(
                    "E2B: its timeout was changed at {at}; E2B now ends it at {}.",
                    end.format("%Y-%m-%d %H:%M UTC")
                ),
                None,
            )
        }),
        _ => None,
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

/// What taking an event left to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Taken {
    /// Taken before: nothing to do.
    Repeat,
    /// New, and recorded as the sandbox's history; no case is about the sandbox and no
    /// `[[watch]]` rule looks at this kind of event, so that was all ([`Applied::NoCase`]).
    Recorded,
    /// New and recorded; [`apply_event`] has work to do.
    ToApply,
}

/// Takes `event` by its id (webhook and poller share the marks): the first time it is kept as
/// the sandbox's history, so a case opened for it (now, by a rule, or later) shows E2B's own
/// account of its life, and the answer says whether [`apply_event`] has anything left to do.
/// One store round trip, which for most events (sandboxes without a case) is the whole work.
/// `watching` is whether any `[[watch]]` rule is configured.
pub async fn take(
    store: &Store,
    watching: bool,
    event: &LifecycleEvent,
) -> Result<Taken, StoreError> {
    let taken = store
        .take_event(
            &event.sandbox,
            &event.id,
            event.at,
            event.kind.as_str(),
            crate::lifecycle::DEDUPE_TTL,
        )
        .await?;
    Ok(match taken {
        TakenEvent::Repeat => Taken::Repeat,
        TakenEvent::New { case_open } => {
            if case_open || (watching && event.kind == EventKind::Created) {
                Taken::ToApply
            } else {
                Taken::Recorded
            }
        }
    })
}

/// Forgets that `event` was taken: its work failed, and the poller's next read takes it again.
pub async fn forget(store: &Store, event: &LifecycleEvent) {
    if let Err(e) = store.forget_event(&event.sandbox, &event.id).await {
        tracing::warn!(event = %event.id, error = %e, "could not forget the event's mark");
    }
}

/// Applies one event, taken with [`take`], to the case about its sandbox, if any, and to the
/// `[[watch]]` rules.
pub async fn apply_event(
    svc: &Services,
    event: &LifecycleEvent,
    now: DateTime<Utc>,
) -> Result<Applied, EventError> {
    if event.kind == EventKind::Created && !svc.watch.is_empty() {
        let raised = super::watch::on_created(svc, event, now).await?;
        if raised.any() {
            return Ok(Applied::Watched);
        }
    }
    let subject = Subject::Sandbox(event.sandbox.clone());
    let Some(case) = svc.store.case_for_subject(&subject).await? else {
        return Ok(Applied::NoCase);
    };
    let actor = || Actor::Steward {
        part: "e2b events".into(),
    };
    if case.state == CaseState::Pending
        // E2B's timestamps are whole seconds: an event in the second the case was opened counts.
        && event.at + chrono::Duration::seconds(1) > case.created_at
        && let Some((note, state)) = observation(event)
    {
        let observed = Event::Observed {
            note: note.clone(),
            state,
        };
        if let Updated::Applied(noted) = svc.store.apply_event(&case.id, observed, now).await? {
            audit(&svc.store, &noted, actor(), "e2b_event", &note).await;
            refresh_card(&svc.store, &svc.slack, &svc.templates, &noted).await;
            return Ok(Applied::Noted);
        }
    }
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

/// How far back a poll reads before the watermark: events are listed by time, and one recorded
/// just before the newest seen may appear in the list after it.
pub const POLL_OVERLAP: chrono::Duration = chrono::Duration::seconds(120);
/// With no watermark yet (the first poll of a deployment), how far back the poller starts.
pub const FIRST_POLL_LOOKBACK: chrono::Duration = chrono::Duration::hours(1);
/// E2B keeps events 7 days; a poll never reads further back.
pub const RETENTION: chrono::Duration = chrono::Duration::days(7);
/// The lease that makes one replica the poller.
pub const POLL_LEASE: &str = "e2b-events-poll";

/// What one poll did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PollFigures {
    /// Events listed (repeats included).
    pub read: usize,
    /// Events not seen before (by webhook or an earlier poll), now handled.
    pub new: usize,
    /// Pages asked for.
    pub pages: usize,
}

/// One poll of E2B's `/events/sandboxes`: every event since the watermark (less
/// [`POLL_OVERLAP`]), newest first page by page (a list that grows while it is read only shifts
/// events to later pages, so nothing is skipped; repeats are dropped by event id, shared with the
/// webhook), then handled oldest first. The watermark moves only past events handled, so a
/// failure is read again next time.
pub async fn poll_once(
    svc: &Services,
    e2b: &crate::e2b::E2bClient,
    now: DateTime<Utc>,
) -> Result<PollFigures, String> {
    let watermark = svc
        .store
        .events_watermark()
        .await
        .map_err(|e| e.to_string())?;
    let since = match watermark {
        Some(w) => (w - POLL_OVERLAP).max(now - RETENTION),
        None => now - FIRST_POLL_LOOKBACK,
    };
    let mut figures = PollFigures::default();
    let mut events = Vec::new();
    let page = crate::e2b::MAX_EVENTS_PAGE;
    // 7 days of a busy team is bounded by E2B's retention; this cap only stops a server that
    // pages forever.
    for n in 0..10_000usize {
        let batch = e2b
            .sandbox_events(n * page, page, false)
            .await
            .map_err(|e| e.to_string())?;
        figures.pages += 1;
        let last_page = batch.len() < page;
        let reached = batch.iter().any(|e| e.at < since);
        figures.read += batch.len();
        events.extend(batch.into_iter().filter(|e| e.at >= since));
        if last_page || reached {
            break;
        }
    }
    events.sort_by_key(|e| e.at);
    let mut seen = std::collections::HashSet::new();
    let mut newest_handled = None;
    for event in events {
        if !seen.insert(event.id.clone()) {
            continue;
        }
        let taken = take(&svc.store, !svc.watch.is_empty(), &event)
            .await
            .map_err(|e| e.to_string())?;
        let applied = match taken {
            Taken::Repeat => {
                newest_handled = Some(event.at);
                continue;
            }
            Taken::Recorded => Ok(Applied::NoCase),
            Taken::ToApply => apply_event(svc, &event, now).await,
        };
        match applied {
            Ok(applied) => {
                crate::metrics::e2b_event(event.kind.as_str(), applied.as_str());
                figures.new += 1;
                newest_handled = Some(event.at);
            }
            Err(e) => {
                crate::metrics::e2b_event(event.kind.as_str(), "failed");
                forget(&svc.store, &event).await;
                return Err(format!("event {}: {e}", event.id));
            }
        }
    }
    let advance_to = newest_handled.unwrap_or(since + POLL_OVERLAP).min(now);
    svc.store
        .advance_events_watermark(advance_to)
        .await
        .map_err(|e| e.to_string())?;
    Ok(figures)
}

/// Polls every `every` while this replica holds [`POLL_LEASE`], until `shutdown`. Beside
/// webhooks it fills the gaps of deliveries E2B gave up on; without them (a replica E2B cannot
/// reach) it is how events arrive.
pub async fn run_poller(
    svc: Services,
    e2b: crate::e2b::E2bClient,
    holder: String,
    every: std::time::Duration,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    let lease = every
        .saturating_mul(3)
        .max(std::time::Duration::from_secs(5));
    loop {
        let held = match svc.store.acquire_lease(POLL_LEASE, &holder, lease).await {
            Ok(true) => true,
            Ok(false) => svc
                .store
                .renew_lease(POLL_LEASE, &holder, lease)
                .await
                .unwrap_or(false),
            Err(e) => {
                tracing::debug!(error = %e, "events poll: the lease could not be read");
                false
            }
        };
        if held {
            match poll_once(&svc, &e2b, Utc::now()).await {
                Ok(f) if f.new > 0 => {
                    tracing::info!(
                        read = f.read,
                        new = f.new,
                        pages = f.pages,
                        "E2B events polled"
                    )
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "E2B events poll failed; the next one reads again")
                }
            }
        }
        tokio::select! {
            () = &mut shutdown => break,
            () = tokio::time::sleep(every) => {}
        }
    }
    let _ = svc.store.release_lease(POLL_LEASE, &holder).await;
}
