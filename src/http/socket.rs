//! Socket Mode's side of the Slack surface: an envelope that `slack::socket` read is handed to
//! the same handlers as `POST /slack/commands`, `/slack/interactions` and `/slack/events`, and
//! their immediate answer (the HTTP body) becomes the ack's `payload`.
//!
//! Socket Mode is authenticated by the app-level token that opened the connection, so there is
//! no signature to check; the payload is parsed into the same types the HTTP bodies are. Each
//! envelope is answered within [`ACK_DEADLINE`] whatever happens: marking it takes at most
//! [`MARK_TIMEOUT`], and a handler that has not answered by the deadline is abandoned and the
//! envelope acked without a reply (what the HTTP routes' timeout layer does for a request).
//!
//! Slack delivers again an envelope whose ack it did not see (a dropped socket, a slow answer),
//! to any replica's connection. The envelope id is marked in the store before it is handled, and
//! a delivery of a marked id is acked and not handled again: while Redis answers, an envelope
//! whose handling completed is never handled twice. A handling that did not complete (the
//! handler failed, panicked or missed the deadline) forgets its mark, so a redelivery is handled.
//! When the store cannot say (an outage, or no answer within [`MARK_TIMEOUT`]), a first delivery
//! (`retry_attempt` 0) is handled and a redelivery is not, so an outage never makes Steward act
//! twice (decisions are exactly-once in the store anyway). Nothing here may act on an envelope
//! twice.
//!
//! Two kinds of envelope are not marked, so the mark's Redis round trip is not paid for them
//! ([`Request::marks_itself`]): a command answered from its text alone that changes nothing
//! (`/sandbox help`, a command that does not parse), whose redelivery is simply answered again;
//! and a click on a case card, whose own mark (the person and Slack's `action_ts`, the same on
//! every delivery) is set in the click's one script with the case's read (`store/redis/click.rs`),
//! so a redelivered click does nothing there, and a click costs one round trip, not two.
//!
//! Every `slash_commands`, `interactive` and `events_api` envelope is also counted as a Slack
//! request (`steward_slack_requests_total` and its duration, routes `commands`, `interactions`,
//! `events`), as its HTTP twin would be, so alerts and dashboards see Socket Mode traffic.
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::value::RawValue;
use tokio::time::Instant;
use tokio_util::task::TaskTracker;

use super::AppState;
use super::slack::{SLACK_BODY_MAX_BYTES, handle_command, handle_event, handle_interaction};
use crate::slack::command::SandboxCommand;
use crate::slack::payload::{Action, CommandForm, EventEnvelope, Interaction, SlackRetry};
use crate::slack::socket::{Answer, Envelope, Handler, Outcome};
use crate::store::Store;

/// How long a handled envelope id is remembered (Slack gives up redelivering within minutes).
pub const ENVELOPE_DEDUPE_TTL: Duration = Duration::from_secs(60 * 60);
/// From the moment an envelope is taken up to its ack: Slack waits 3 s, and the ack still has to
/// be written.
pub const ACK_DEADLINE: Duration = Duration::from_millis(2700);
/// The longest the envelope's mark may take; past it the store "cannot say".
pub const MARK_TIMEOUT: Duration = Duration::from_millis(250);
/// Longest envelope id accepted (Slack's are UUIDs).
const ENVELOPE_ID_MAX_CHARS: usize = 128;

/// The handler the Socket Mode client calls for each envelope.
pub fn handler(state: AppState) -> Handler {
    Arc::new(move |envelope| {
        let state = state.clone();
        Box::pin(async move { answer(&state, envelope).await })
    })
}

/// An envelope's payload, read into what its HTTP twin's handler takes.
enum Request {
    Command(CommandForm),
    Interaction(Interaction),
    Event(EventEnvelope, SlackRetry),
}

impl Request {
    /// Parses the payload's JSON text straight into its type (a missing payload is `null`,
    /// which no type takes). A payload larger than an HTTP request's body may be is not read.
    fn read(envelope: Envelope) -> Result<Self, Unreadable> {
        let payload = envelope.payload.as_deref().map_or("null", RawValue::get);
        if payload.len() > SLACK_BODY_MAX_BYTES {
            return Err(Unreadable::TooLarge(payload.len()));
        }
        Ok(match envelope.kind_label() {
            "slash_commands" => Self::Command(serde_json::from_str(payload)?),
            "interactive" => Self::Interaction(serde_json::from_str(payload)?),
            _ => {
                let retry = SlackRetry {
                    num: (envelope.retry_attempt > 0).then_some(envelope.retry_attempt),
                    reason: (!envelope.retry_reason.is_empty()).then_some(envelope.retry_reason),
                };
                Self::Event(serde_json::from_str(payload)?, retry)
            }
        })
    }

    /// Whether the envelope needs no mark of its own (see the module's doc): handling a
    /// redelivery again acts on nothing twice.
    fn marks_itself(&self) -> bool {
        match self {
            Self::Command(form) => matches!(
                SandboxCommand::parse(&form.text),
                SandboxCommand::Help | SandboxCommand::Invalid { .. }
            ),
            Self::Interaction(interaction) => {
                interaction.kind == "block_actions"
                    && matches!(interaction.actions.as_slice(), [action] if action.action_ts.is_some()
                    && matches!(
                        Action::from_block_action(action),
                        Action::CaseOption { .. }
                            | Action::CaseRetry { .. }
                            | Action::CaseRestore { .. }
                            | Action::CaseKeepLonger { .. }
                    ))
            }
            Self::Event(..) => false,
        }
    }

    /// Its handler's answer, as the HTTP route would send it.
    async fn run(self, state: AppState) -> Reply {
        let response = match self {
            Self::Command(form) => handle_command(state, form)
                .await
                .unwrap_or_else(IntoResponse::into_response),
            Self::Interaction(interaction) => handle_interaction(state, interaction).await,
            Self::Event(event, retry) => handle_event(event, &retry),
        };
        Reply::read(response).await
    }
}

/// Why an envelope's payload was refused unread or unparsed.
#[derive(Debug, thiserror::Error)]
enum Unreadable {
    #[error(
        "its payload is {0} bytes, more than the {SLACK_BODY_MAX_BYTES} a request over HTTP may have"
    )]
    TooLarge(usize),
    #[error(transparent)]
    Json(#[from] serde_json::Error),
}

impl Unreadable {
    /// The status its HTTP twin would have been refused with.
    fn status(&self) -> StatusCode {
        match self {
            Self::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Self::Json(_) => StatusCode::BAD_REQUEST,
        }
    }
}

/// A handler's HTTP answer, read: its status and its JSON body, if any, checked to be JSON
/// and kept as its text (it goes into the ack as it is).
#[derive(Debug, Clone)]
pub(crate) struct Reply {
    pub status: StatusCode,
    pub payload: Option<Box<RawValue>>,
}

impl PartialEq for Reply {
    fn eq(&self, other: &Self) -> bool {
        self.status == other.status
            && self.payload.as_deref().map(RawValue::get)
                == other.payload.as_deref().map(RawValue::get)
    }
}

impl Reply {
    async fn read(response: Response) -> Self {
        let status = response.status();
        let payload = match axum::body::to_bytes(response.into_body(), SLACK_BODY_MAX_BYTES).await {
            Ok(body) if body.is_empty() => None,
            Ok(body) => serde_json::from_slice(&body)
                .inspect_err(|e| {
                    tracing::error!(error = %e, "a handler's answer is not JSON; acked without it");
                })
                .ok(),
            Err(e) => {
                tracing::error!(error = %e, "could not read a handler's answer");
                None
            }
        };
        Self { status, payload }
    }
}

/// What became of one delivery.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Handled {
    /// The handler answered (a success or not).
    Answered(Reply),
    /// The envelope was marked already (or the store could not say, on a redelivery).
    Duplicate,
    /// The handler panicked.
    Panicked,
    /// The handler had not answered by the deadline; it was abandoned.
    TimedOut,
}

impl Handled {
    /// Whether the handler did its work: anything else forgets the mark.
    fn completed(&self) -> bool {
        match self {
            Self::Answered(reply) => reply.status.is_success(),
            Self::Duplicate => true,
            Self::Panicked | Self::TimedOut => false,
        }
    }

    /// The HTTP status its twin request would be counted under.
    fn status(&self) -> StatusCode {
        match self {
            Self::Answered(reply) => reply.status,
            Self::Duplicate => StatusCode::OK,
            Self::Panicked => StatusCode::INTERNAL_SERVER_ERROR,
            Self::TimedOut => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    fn into_answer(self) -> Answer {
        match self {
            Self::Answered(Reply { status, payload }) if status.is_success() => Answer {
                payload,
                outcome: Outcome::Handled,
            },
            Self::Answered(_) | Self::Panicked | Self::TimedOut => Answer::bare(Outcome::Refused),
            Self::Duplicate => Answer::bare(Outcome::Duplicate),
        }
    }
}

/// One delivery of an envelope, as [`handle_once`] needs it.
pub(crate) struct Delivery<'a> {
    /// The envelope's type (a metrics and log label).
    pub kind: &'static str,
    pub envelope_id: &'a str,
    pub retry_attempt: u32,
    /// False when the handling dedupes itself ([`Request::marks_itself`]): no mark is set.
    pub mark: bool,
}

/// Handles one envelope: the ack's payload and what happened.
pub async fn answer(state: &AppState, envelope: Envelope) -> Answer {
    // The deadline counts from the frame's reading, whatever waited since.
    let started = envelope.read_at;
    let kind = envelope.kind_label();
    let route = match kind {
        "slash_commands" => "commands",
        "interactive" => "interactions",
        "events_api" => "events",
        _ => {
            tracing::debug!(kind = %envelope.kind, "ignoring a Socket Mode envelope");
            return Answer::bare(Outcome::Ignored);
        }
    };
    let count = |status: StatusCode| {
        let outcome = crate::metrics::slack_request_outcome(status.as_u16(), false);
        crate::metrics::slack_request(route, outcome, started.elapsed());
    };
    if envelope.envelope_id.is_empty() || envelope.envelope_id.len() > ENVELOPE_ID_MAX_CHARS {
        tracing::warn!(kind, "a Socket Mode envelope without a usable envelope_id");
        count(StatusCode::BAD_REQUEST);
        return Answer::bare(Outcome::Refused);
    }
    let envelope_id = envelope.envelope_id.clone();
    let retry_attempt = envelope.retry_attempt;
    // Read before it is marked: a payload that cannot be read is refused on every delivery.
    let request = match Request::read(envelope) {
        Ok(request) => request,
        Err(e) => {
            tracing::warn!(kind, error = %e, "a Socket Mode payload could not be read");
            count(e.status());
            return Answer::bare(Outcome::Refused);
        }
    };
    let delivery = Delivery {
        kind,
        envelope_id: &envelope_id,
        retry_attempt,
        mark: !request.marks_itself(),
    };
    let task_state = state.clone();
    let handled = handle_once(
        &state.store,
        &state.tasks,
        &delivery,
        started + ACK_DEADLINE,
        async move { request.run(task_state).await },
    )
    .await;
    count(handled.status());
    match &handled {
        Handled::Duplicate => tracing::info!(
            kind,
            %envelope_id,
            retry_attempt,
            "a Socket Mode envelope delivered again; acked, not handled again"
        ),
        Handled::Answered(reply) if !reply.status.is_success() => tracing::warn!(
            kind,
            status = %reply.status,
            "a Socket Mode envelope was answered with an error"
        ),
        _ => {}
    }
    handled.into_answer()
}

/// Marks the delivery and runs `work` (in a task of `tasks`, so a panic is caught) until
/// `deadline`; forgets the mark when the work did not complete, so Slack's redelivery is
/// handled. See the module's doc for when a delivery is a duplicate.
pub(crate) async fn handle_once<W>(
    store: &Store,
    tasks: &TaskTracker,
    delivery: &Delivery<'_>,
    deadline: Instant,
    work: W,
) -> Handled
where
    W: Future<Output = Reply> + Send + 'static,
{
    let kind = delivery.kind;
    if !delivery.mark {
        return run_until(tasks, kind, deadline, work).await;
    }
    let key = format!("socket:{}", delivery.envelope_id);
    let mark_by = (Instant::now() + MARK_TIMEOUT).min(deadline);
    let marked =
        tokio::time::timeout_at(mark_by, store.first_time(&key, ENVELOPE_DEDUPE_TTL)).await;
    let cannot_say = match marked {
        Ok(Ok(true)) => None,
        Ok(Ok(false)) => return Handled::Duplicate,
        Ok(Err(e)) => Some(e.to_string()),
        Err(_) => Some(format!(
            "the store did not answer within {} ms",
            MARK_TIMEOUT.as_millis()
        )),
    };
    if let Some(why) = cannot_say {
        tracing::warn!(kind, error = %why, retry_attempt = delivery.retry_attempt, "could not mark a Socket Mode envelope as seen");
        if delivery.retry_attempt > 0 {
            // It may have been handled already: better a lost redelivery than a double action.
            return Handled::Duplicate;
        }
    }
    let handled = run_until(tasks, kind, deadline, work).await;
    if !handled.completed() {
        // In the background: the ack must not wait for Redis.
        let store = store.clone();
        tasks.spawn(async move {
            if let Err(e) = store.forget_first_time(&key).await {
                tracing::warn!(kind, error = %e, "could not forget a Socket Mode envelope's mark; a redelivery will not be handled");
            }
        });
    }
    handled
}

/// Runs `work` in a task of `tasks` (so a panic is caught) until `deadline`.
async fn run_until<W>(tasks: &TaskTracker, kind: &str, deadline: Instant, work: W) -> Handled
where
    W: Future<Output = Reply> + Send + 'static,
{
    let mut running = tasks.spawn(work);
    match tokio::time::timeout_at(deadline, &mut running).await {
        Ok(Ok(reply)) => Handled::Answered(reply),
        Ok(Err(e)) => {
            tracing::error!(kind, error = %e, "a Socket Mode envelope's handler panicked; acked without a reply");
            Handled::Panicked
        }
        Err(_) => {
            running.abort();
            tracing::warn!(
                kind,
                deadline_ms = ACK_DEADLINE.as_millis(),
                "a Socket Mode {kind} envelope was not answered in time; acked without a reply"
            );
            Handled::TimedOut
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delivery(envelope_id: &str, retry_attempt: u32) -> Delivery<'_> {
        Delivery {
            kind: "slash_commands",
            envelope_id,
            retry_attempt,
            mark: true,
        }
    }

    fn ok() -> Reply {
        Reply {
            status: StatusCode::OK,
            payload: Some(
                serde_json::value::to_raw_value(&serde_json::json!({"text": "done"})).unwrap(),
            ),
        }
    }

    /// Handles `delivery` with `work` within `deadline`, then waits for the tracker's background
    /// work (the forget).
    async fn handle_within<W>(
        store: &Store,
        delivery: &Delivery<'_>,
        deadline: Duration,
        work: W,
    ) -> Handled
    where
        W: Future<Output = Reply> + Send + 'static,
    {
        let tasks = TaskTracker::new();
        let handled = handle_once(store, &tasks, delivery, Instant::now() + deadline, work).await;
        tasks.close();
        tasks.wait().await;
        handled
    }

    async fn handle<W>(store: &Store, delivery: &Delivery<'_>, work: W) -> Handled
    where
        W: Future<Output = Reply> + Send + 'static,
    {
        handle_within(store, delivery, ACK_DEADLINE, work).await
    }

    #[tokio::test]
    async fn a_completed_envelope_is_not_handled_again() {
        let store = Store::memory();
        let first = handle(&store, &delivery("e1", 0), async { ok() }).await;
        assert_eq!(first, Handled::Answered(ok()));
        let again = handle(&store, &delivery("e1", 1), async {
            panic!("handled twice")
        })
        .await;
        assert_eq!(again, Handled::Duplicate);
    }

    #[tokio::test]
    async fn an_envelope_whose_handler_failed_or_panicked_is_handled_when_delivered_again() {
        let store = Store::memory();
        let failed = Reply {
            status: StatusCode::SERVICE_UNAVAILABLE,
            payload: None,
        };
        let answered = handle(&store, &delivery("e2", 0), {
            let failed = failed.clone();
            async move { failed }
        })
        .await;
        assert_eq!(answered, Handled::Answered(failed));
        assert_eq!(answered.into_answer().outcome, Outcome::Refused);
        let panicked = handle(&store, &delivery("e2", 1), async {
            panic!("a handler bug")
        })
        .await;
        assert_eq!(panicked, Handled::Panicked);
        assert_eq!(panicked.status(), StatusCode::INTERNAL_SERVER_ERROR);
        // Both forgot the mark: the third delivery is handled, and then remembered.
        let third = handle(&store, &delivery("e2", 2), async { ok() }).await;
        assert_eq!(third, Handled::Answered(ok()));
        assert!(
            !store
                .first_time("socket:e2", ENVELOPE_DEDUPE_TTL)
                .await
                .unwrap()
        );
    }

    /// On the runtime's paused clock: the deadline's timer fires before the handler's 60 s.
    #[tokio::test(start_paused = true)]
    async fn a_handler_past_the_deadline_is_abandoned_and_its_mark_forgotten() {
        let store = Store::memory();
        let deadline = Duration::from_millis(200);
        let started = Instant::now();
        let late = handle_within(&store, &delivery("e3", 0), deadline, async {
            tokio::time::sleep(Duration::from_secs(60)).await;
            ok()
        })
        .await;
        assert_eq!(late, Handled::TimedOut);
        assert_eq!(late.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(late.into_answer().payload.is_none(), "a bare ack");
        let took = started.elapsed();
        assert!(took >= deadline && took < ACK_DEADLINE, "{took:?}");
        let again = handle(&store, &delivery("e3", 1), async { ok() }).await;
        assert_eq!(again, Handled::Answered(ok()));
    }

    /// A Redis that refuses connections: the store cannot say whether the envelope was seen.
    #[tokio::test]
    async fn when_the_store_cannot_say_only_a_first_delivery_is_handled() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let store = Store::redis_lazy(&format!("redis://127.0.0.1:{port}"), "nobody").unwrap();
        let first = handle(&store, &delivery("e4", 0), async { ok() }).await;
        assert_eq!(first, Handled::Answered(ok()));
        let again = handle(&store, &delivery("e4", 1), async {
            panic!("handled twice")
        })
        .await;
        assert_eq!(again, Handled::Duplicate);
    }

    /// A Redis that accepts the connection and never answers: the mark gives up after its own
    /// [`MARK_TIMEOUT`], not the store's longer one, and the first delivery is handled. The clock
    /// is the runtime's paused one, so which timer fired first is certain, not a wall-clock race.
    #[tokio::test(start_paused = true)]
    async fn a_mark_that_redis_never_answers_gives_up_after_mark_timeout() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                held.push(socket);
            }
        });
        let store = Store::redis_lazy(&format!("redis://127.0.0.1:{port}"), "nobody").unwrap();
        let started = Instant::now();
        let first = handle(&store, &delivery("e5", 0), async { ok() }).await;
        assert_eq!(first, Handled::Answered(ok()));
        let waited = started.elapsed();
        assert!(
            waited >= MARK_TIMEOUT && waited < ACK_DEADLINE,
            "the mark waited {waited:?} on the paused clock"
        );
    }
}
