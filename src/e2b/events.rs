//! E2B's lifecycle events API: `GET /events/sandboxes` (the team's events), paged by `offset` and
//! `limit` (at most 100), newest first unless `orderAsc=true` (E2B docs, "Sandbox → Lifecycle
//! events API"). The list grows while it is read, so callers overlap their reads and drop repeats
//! by event id.
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};

use super::E2bError;
use super::client::{Call, E2bClient, Op, encode_component};
use crate::lifecycle::LifecycleEvent;

/// One webhook registration, as `GET /events/webhooks` lists it (the signature secret is never
/// read back).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Webhook {
    pub id: String,
    #[serde(default)]
    pub name: String,
    pub url: String,
    #[serde(default)]
    pub enabled: bool,
    #[serde(default)]
    pub events: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<String>,
}

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

    /// `GET /events/webhooks`: the team's registrations.
    #[tracing::instrument(skip(self))]
    pub async fn webhooks(&self) -> Result<Vec<Webhook>, E2bError> {
        let call = Call::new(Op::Webhooks, "/events/webhooks".into());
        let reply = self.send(&call).await?;
        self.decode(Op::Webhooks, &reply)
    }

    /// `POST /events/webhooks`: registers `url` for `events` (E2B's type names), signed with
    /// `secret`, which is sent once and never logged.
    #[tracing::instrument(skip(self, secret))]
    pub async fn register_webhook(
        &self,
        name: &str,
        url: &str,
        events: &[String],
        secret: &SecretString,
    ) -> Result<Webhook, E2bError> {
        let body = serde_json::json!({
            "name": name,
            "url": url,
            "enabled": true,
            "events": events,
            "signatureSecret": secret.expose_secret(),
        });
        let call = Call::new(Op::RegisterWebhook, "/events/webhooks".into()).json(body);
        let reply = self.send(&call).await?;
        self.decode(Op::RegisterWebhook, &reply)
    }

    /// `DELETE /events/webhooks/{id}`.
    #[tracing::instrument(skip(self))]
    pub async fn delete_webhook(&self, id: &str) -> Result<(), E2bError> {
        let call = Call::new(
            Op::DeleteWebhook,
            format!("/events/webhooks/{}", encode_component(id)),
        );
        self.send(&call).await?;
        Ok(())
    }
}
