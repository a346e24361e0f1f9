//! The body budget: how many bytes of request bodies Steward holds in memory at once, across every
//! agent API, `/mcp` and GitHub webhook request (`STEWARD_BODY_BUDGET`, 64 MiB by default).
//!
//! Each of those routes may take a body of 16 or 25 MiB, and a parsed body costs a few times its
//! size, so a handful of large concurrent requests could take Steward's memory from tens to
//! hundreds of megabytes. [`limit_bodies`] wraps the request body so that every chunk, as it
//! arrives, takes its size from one shared semaphore; the bytes are given back when the request
//! has been answered (the handler has dropped what it parsed by then). A chunk that does not fit
//! cuts the body off and the request is answered 503 with `Retry-After`, so a request never waits
//! for the budget (two half-read bodies waiting for each other would hold it until their body
//! timeout). Bytes are counted as they arrive, not as declared, so a client that announces a large
//! body and sends it slowly holds only what it has sent. This module must not read a body itself.
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::ApiFailure;
use crate::telemetry::WarnGate;

/// How long a refused client is told to wait before asking again.
pub const RETRY_AFTER: Duration = Duration::from_secs(2);

/// Refusals for want of budget are logged at `warn` at most once every 10 s.
static OVER_BUDGET: WarnGate = WarnGate::new(Duration::from_secs(10));

/// The bytes of request bodies all requests may hold at once.
#[derive(Debug)]
pub struct BodyBudget {
    bytes: Arc<Semaphore>,
    total: usize,
}

impl BodyBudget {
    pub fn new(total: usize) -> Arc<Self> {
        let total = total.min(Semaphore::MAX_PERMITS);
        Arc::new(Self {
            bytes: Arc::new(Semaphore::new(total)),
            total,
        })
    }

    /// The whole budget, in bytes.
    pub fn total(&self) -> usize {
        self.total
    }

    /// Bytes not held by any request now.
    pub fn available(&self) -> usize {
        self.bytes.available_permits()
    }

    /// `request` with its body counted against the budget, and what its bytes are held by: the
    /// bytes go back when the returned [`Held`] is dropped.
    pub fn wrap(&self, request: Request) -> (Request, Held) {
        let held = Held::default();
        let (parts, body) = request.into_parts();
        let counted = {
            let held = held.clone();
            let bytes = self.bytes.clone();
            body.into_data_stream().map(move |chunk| {
                let chunk = chunk?;
                if held.take(&bytes, chunk.len()) {
                    Ok(chunk)
                } else {
                    Err(axum::Error::new(OverBudget))
                }
            })
        };
        (Request::from_parts(parts, Body::from_stream(counted)), held)
    }
}

/// The budget a request's body holds until the request has been answered.
#[derive(Debug, Clone, Default)]
pub struct Held(Arc<Mutex<HeldBytes>>);

#[derive(Debug, Default)]
struct HeldBytes {
    permit: Option<OwnedSemaphorePermit>,
    refused: bool,
}

impl Held {
    /// Adds `len` bytes to what this request holds; false (and the request marked refused) when
    /// the budget has not that many left.
    fn take(&self, bytes: &Arc<Semaphore>, len: usize) -> bool {
        if len == 0 {
            return true;
        }
        let mut held = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let taken = u32::try_from(len)
            .ok()
            .and_then(|n| bytes.clone().try_acquire_many_owned(n).ok());
        match (taken, held.permit.as_mut()) {
            (Some(more), Some(permit)) => {
                permit.merge(more);
                true
            }
            (Some(more), None) => {
                held.permit = Some(more);
                true
            }
            (None, _) => {
                held.refused = true;
                false
            }
        }
    }

    /// Whether the body was cut off for want of budget.
    pub fn refused(&self) -> bool {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).refused
    }
}

/// The error a body stream ends with when its next chunk does not fit in the budget.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("the request body does not fit in Steward's body budget (STEWARD_BODY_BUDGET)")]
pub struct OverBudget;

/// Logs one refusal for want of budget (rate-limited: a flood costs a line every 10 s).
pub fn log_refusal(route: &'static str, budget: &BodyBudget) {
    if let Some(quiet) = OVER_BUDGET.warn_now() {
        tracing::warn!(
            route,
            budget_bytes = budget.total(),
            refused_quietly_before = quiet,
            "request body refused: the body budget is spent (further refusals within 10 s are logged at debug)"
        );
    } else {
        tracing::debug!(route, "request body refused: the body budget is spent");
    }
}

/// What the agent API and `/mcp` answer when a body did not fit.
pub fn over_budget() -> ApiFailure {
    ApiFailure::unavailable(
        "Steward is holding as many request bodies in memory as its budget allows (STEWARD_BODY_BUDGET), so this one was not read and nothing was done. Try again in a few seconds",
    )
    .retry_after(RETRY_AFTER)
}

/// Middleware for `/api/v1` and `/mcp`: counts the body against the budget and answers 503 with
/// `Retry-After` when it did not fit (whatever the handler made of the cut-off body: it saw a
/// body that could not be read, so it did nothing).
pub async fn limit_bodies(
    State(budget): State<Arc<BodyBudget>>,
    request: Request,
    next: Next,
) -> Response {
    let (request, held) = budget.wrap(request);
    let response = next.run(request).await;
    if held.refused() {
        log_refusal("api", &budget);
        return over_budget().into_response();
    }
    // `held` is dropped here, after the handler and what it parsed: the bytes go back now.
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn read_all(request: Request) -> Result<usize, axum::Error> {
        let mut stream = request.into_body().into_data_stream();
        let mut n = 0;
        while let Some(chunk) = stream.next().await {
            n += chunk?.len();
        }
        Ok(n)
    }

    fn request(chunks: Vec<&'static [u8]>) -> Request {
        let stream = futures::stream::iter(chunks.into_iter().map(Ok::<_, std::io::Error>));
        Request::new(Body::from_stream(stream))
    }

    #[tokio::test]
    async fn bodies_hold_their_bytes_until_answered_and_one_that_does_not_fit_is_cut_off() {
        let budget = BodyBudget::new(10);
        let (first, first_held) = budget.wrap(request(vec![b"abcd", b"ef"]));
        assert_eq!(read_all(first).await.unwrap(), 6);
        assert_eq!(budget.available(), 4);
        assert!(!first_held.refused());

        let (second, second_held) = budget.wrap(request(vec![b"ghi", b"jk"]));
        let err = read_all(second).await.unwrap_err();
        assert!(err.to_string().contains("body budget"), "{err}");
        assert!(second_held.refused());
        // The cut-off request keeps what it took until it is answered, then gives all of it back.
        assert_eq!(budget.available(), 1);
        drop(second_held);
        drop(first_held);
        assert_eq!(budget.available(), 10);
    }
}
