//! Socket Mode's side of the Slack surface: an envelope that `slack::socket` read is handed to
//! the same handlers as `POST /slack/commands`, `/slack/interactions` and `/slack/events`, and
//! their immediate answer (the HTTP body) becomes the ack's `payload`.
//!
//! Socket Mode is authenticated by the app-level token that opened the connection, so there is
//! no signature to check; the payload is parsed into the same types the HTTP bodies are. Slack
//! delivers again an envelope whose ack it did not see (a dropped socket, a slow answer), to any
//! replica's connection: the envelope id is marked in the store before anything is handled, and a
//! later delivery of a marked id is acked and not handled again, so a command never runs twice
//! (decisions are exactly-once in the store anyway). Nothing here may act on an envelope twice.
use std::sync::Arc;
use std::time::Duration;

use axum::response::Response;

use super::AppState;
use super::slack::{SLACK_BODY_MAX_BYTES, handle_command, handle_event, handle_interaction};
use crate::slack::payload::{CommandForm, EventEnvelope, Interaction, SlackRetry};
use crate::slack::socket::{Answer, Envelope, Handler, Outcome};

/// How long a handled envelope id is remembered (Slack gives up redelivering within minutes).
pub const ENVELOPE_DEDUPE_TTL: Duration = Duration::from_secs(60 * 60);
/// Longest envelope id accepted (Slack's are UUIDs).
const ENVELOPE_ID_MAX_CHARS: usize = 128;

/// The handler the Socket Mode client calls for each envelope.
pub fn handler(state: AppState) -> Handler {
    Arc::new(move |envelope| {
        let state = state.clone();
        Box::pin(async move { answer(&state, envelope).await })
    })
}

/// Handles one envelope: the ack's payload and what happened.
pub async fn answer(state: &AppState, envelope: Envelope) -> Answer {
    let kind = envelope.kind_label();
    if kind == "other" {
        tracing::debug!(kind = %envelope.kind, "ignoring a Socket Mode envelope");
        return Answer::bare(Outcome::Ignored);
    }
    if envelope.envelope_id.is_empty() || envelope.envelope_id.len() > ENVELOPE_ID_MAX_CHARS {
        tracing::warn!(kind, "a Socket Mode envelope without a usable envelope_id");
        return Answer::bare(Outcome::Refused);
    }
    if !first_delivery(state, &envelope).await {
        tracing::info!(
            kind,
            envelope_id = %envelope.envelope_id,
            retry_attempt = envelope.retry_attempt,
            "a Socket Mode envelope delivered again; acked, not handled again"
        );
        return Answer::bare(Outcome::Duplicate);
    }
    let answered = match kind {
        "slash_commands" => match serde_json::from_value::<CommandForm>(envelope.payload) {
            Ok(form) => handle_command(state.clone(), form).await,
            Err(e) => return refused(kind, &e),
        },
        "interactive" => match serde_json::from_value::<Interaction>(envelope.payload) {
            Ok(interaction) => Ok(handle_interaction(state.clone(), interaction).await),
            Err(e) => return refused(kind, &e),
        },
        _ => match serde_json::from_value::<EventEnvelope>(envelope.payload) {
            Ok(event) => {
                let retry = SlackRetry {
                    num: (envelope.retry_attempt > 0).then_some(envelope.retry_attempt),
                    reason: (!envelope.retry_reason.is_empty()).then_some(envelope.retry_reason),
                };
                Ok(handle_event(event, &retry))
            }
            Err(e) => return refused(kind, &e),
        },
    };
    match answered {
        Ok(response) => into_answer(kind, response).await,
        Err(e) => {
            tracing::warn!(kind, error = %e, "a Socket Mode envelope was refused");
            Answer::bare(Outcome::Refused)
        }
    }
}

fn refused(kind: &'static str, error: &serde_json::Error) -> Answer {
    tracing::warn!(kind, %error, "a Socket Mode payload could not be read");
    Answer::bare(Outcome::Refused)
}

/// Whether this is the first delivery of the envelope. When the store cannot say, a first
/// attempt is handled (its handler meets the same outage and says so) and a redelivery is not,
/// so an outage never makes Steward act twice.
async fn first_delivery(state: &AppState, envelope: &Envelope) -> bool {
    let key = format!("socket:{}", envelope.envelope_id);
    match state.store.first_time(&key, ENVELOPE_DEDUPE_TTL).await {
        Ok(first) => first,
        Err(e) => {
            tracing::warn!(error = %e, retry_attempt = envelope.retry_attempt, "could not mark a Socket Mode envelope as seen");
            envelope.retry_attempt == 0
        }
    }
}

/// The HTTP answer as an ack: its JSON body becomes the payload, an empty body a bare ack.
async fn into_answer(kind: &'static str, response: Response) -> Answer {
    let status = response.status();
    let body = match axum::body::to_bytes(response.into_body(), SLACK_BODY_MAX_BYTES).await {
        Ok(body) => body,
        Err(e) => {
            tracing::error!(kind, error = %e, "could not read a handler's answer");
            return Answer::bare(Outcome::Handled);
        }
    };
    if !status.is_success() {
        tracing::warn!(kind, %status, "a Socket Mode envelope was answered with an error");
        return Answer::bare(Outcome::Refused);
    }
    if body.is_empty() {
        return Answer::bare(Outcome::Handled);
    }
    match serde_json::from_slice(&body) {
        Ok(payload) => Answer {
            payload: Some(payload),
            outcome: Outcome::Handled,
        },
        Err(e) => {
            tracing::error!(kind, error = %e, "a handler's answer is not JSON; acked without it");
            Answer::bare(Outcome::Handled)
        }
    }
}
