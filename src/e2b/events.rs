//! E2B's lifecycle events API: `GET /events/sandboxes` (the team's events), paged by `offset` and
//! `limit` (at most 100), newest first unless `orderAsc=true` (E2B docs, "Sandbox → Lifecycle
//! events API"). The list grows while it is read, so callers overlap their reads and drop repeats
//! by event id.
use super::E2bError;
use super::client::{Call, E2bClient, Op};
use crate::lifecycle::LifecycleEvent;

/// The largest page E2B serves.
pub const MAX_EVENTS_PAGE: usize = 100;

impl E2bClient {
    /// One page of the team's lifecycle events. An entry that is not an event Steward can read
    /// is skipped with a warning rather than failing the page.
    #[tracing::instrument(skip(self))]
    pub async fn sandbox_events(
        &self,
        offset: usize,
        limit: usize,
        ascending: bool,
    ) -> Result<Vec<LifecycleEvent>, E2bError> {
        let mut call = Call::new(Op::Events, "/events/sandboxes".into());
        call.query.push("offset", offset.to_string());
        call.query
            .push("limit", limit.clamp(1, MAX_EVENTS_PAGE).to_string());
        call.query.push("orderAsc", ascending.to_string());
        let reply = self.send(&call).await?;
        let entries: Vec<serde_json::Value> = self.decode(Op::Events, &reply)?;
        Ok(entries
            .into_iter()
            .filter_map(|entry| match LifecycleEvent::from_value(entry) {
                Ok(event) => Some(event),
                Err(e) => {
                    tracing::warn!(error = %e, "skipped an entry of E2B's events list");
                    None
                }
            })
            .collect())
    }
}
