//! `GET /metrics` (Prometheus text format) and the middleware that counts Slack requests.
//!
//! `/metrics` is served by the main listener, or, with `STEWARD_METRICS_LISTEN`, by a listener of
//! its own (and then not by the main one), so the scrape port need not be reachable from where
//! Slack's requests come in. Each scrape first samples the queue from the store (depth, the
//! oldest job's age and the oldest waiting job's age), since those are facts about Redis, not
//! events of this replica.
//!
//! This module must not name series or labels itself: `crate::metrics` does. It must not log per
//! request, and a scrape must answer even when Redis is down (the queue gauges keep their last value).
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Request, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::net::TcpListener;

use super::AppState;
use crate::store::Lane;

/// The content type of Prometheus' text exposition format.
const TEXT_FORMAT: &str = "text/plain; version=0.0.4; charset=utf-8";
/// How long a scrape waits for the store's queue figures before answering without them.
const QUEUE_SAMPLE_TIMEOUT: Duration = Duration::from_secs(2);

/// Set on a response whose request was refused for its Slack signature, so the request counter
/// can tell that from other 4xx answers.
#[derive(Debug, Clone, Copy)]
pub struct SignatureRefused;

/// `GET /metrics`.
pub async fn scrape(State(state): State<AppState>) -> Response {
    let lanes = async {
        let mut stats = Vec::with_capacity(Lane::ALL.len());
        for lane in Lane::ALL {
            stats.push((lane, state.store.queue_stats(lane).await?));
        }
        Ok::<_, crate::store::StoreError>(stats)
    };
    let sampled = tokio::time::timeout(QUEUE_SAMPLE_TIMEOUT, lanes).await;
    crate::metrics::redis_reached(matches!(sampled, Ok(Ok(_))));
    match sampled {
        Ok(Ok(lanes)) => {
            let now = chrono::Utc::now();
            let age = |at: Option<chrono::DateTime<chrono::Utc>>| {
                at.and_then(|at| (now - at).to_std().ok())
                    .unwrap_or(Duration::ZERO)
            };
            for (lane, stats) in lanes {
                crate::metrics::queue_sampled(
                    lane.as_str(),
                    stats.depth,
                    age(stats.oldest_enqueued_at),
                    age(stats.oldest_waiting_at),
                );
            }
        }
        // Counted as a Redis error by the store; the gauges keep their last value.
        Ok(Err(e)) => tracing::debug!(error = %e, "queue figures unavailable for this scrape"),
        // The store's read was dropped before it could count its failure: a Redis that does
        // not answer in time is counted here, as unavailable.
        Err(_) => {
            crate::metrics::redis_error("unavailable");
            tracing::debug!("queue figures timed out for this scrape");
        }
    }
    (
        [(header::CONTENT_TYPE, TEXT_FORMAT)],
        crate::metrics::render(),
    )
        .into_response()
}

/// The route label of a Slack path, or `None` for any other path.
fn slack_route(path: &str) -> Option<&'static str> {
    match path {
        "/slack/commands" => Some("commands"),
        "/slack/interactions" => Some("interactions"),
        "/slack/events" => Some("events"),
        _ => None,
    }
}

/// Counts and times every request to a Slack route. It wraps the whole router, so answers made
/// by the outer layers (a 408 for a slow body or request) are counted too. A tower layer rather
/// than a `from_fn` middleware, which would clone the service under it on every request.
#[derive(Debug, Clone, Copy, Default)]
pub struct TrackSlackLayer;

impl<S> tower::Layer<S> for TrackSlackLayer {
    type Service = TrackSlack<S>;

    fn layer(&self, inner: S) -> TrackSlack<S> {
        TrackSlack { inner }
    }
}

/// The service [`TrackSlackLayer`] makes.
#[derive(Debug, Clone)]
pub struct TrackSlack<S> {
    inner: S,
}

impl<S, B> tower::Service<Request> for TrackSlack<S>
where
    S: tower::Service<Request, Response = axum::http::Response<B>>,
{
    type Response = axum::http::Response<B>;
    type Error = S::Error;
    type Future = Tracked<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let route = slack_route(request.uri().path()).map(|route| (route, Instant::now()));
        Tracked {
            inner: self.inner.call(request),
            route,
        }
    }
}

pin_project_lite::pin_project! {
    /// A request's answer, counted when it is ready if its route is a Slack one; a request
    /// dropped before its answer (the client went away: Slack stops waiting at 3 s) is counted
    /// as `cancelled` with the time it had taken, so the slowest requests are not the uncounted
    /// ones.
    pub struct Tracked<F> {
        #[pin]
        inner: F,
        route: Option<(&'static str, Instant)>,
    }

    impl<F> PinnedDrop for Tracked<F> {
        fn drop(this: Pin<&mut Self>) {
            if let Some((route, started)) = this.project().route.take() {
                crate::metrics::slack_request(route, "cancelled", started.elapsed());
            }
        }
    }
}

impl<F, B, E> Future for Tracked<F>
where
    F: Future<Output = Result<axum::http::Response<B>, E>>,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let result = std::task::ready!(this.inner.poll(cx));
        if let (Ok(response), Some((route, started))) = (&result, this.route.take()) {
            let refused = response.extensions().get::<SignatureRefused>().is_some();
            let outcome =
                crate::metrics::slack_request_outcome(response.status().as_u16(), refused);
            crate::metrics::slack_request(route, outcome, started.elapsed());
        }
        Poll::Ready(result)
    }
}

/// The router of the separate metrics listener: `/metrics` only.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/metrics", get(scrape))
        .with_state(state)
}

/// Binds `STEWARD_METRICS_LISTEN` when it is set.
pub async fn bind(addr: Option<SocketAddr>) -> anyhow::Result<Option<TcpListener>> {
    match addr {
        None => Ok(None),
        Some(addr) => TcpListener::bind(addr)
            .await
            .map(Some)
            .map_err(|e| anyhow::anyhow!("could not listen on {addr} for metrics: {e}")),
    }
}

/// Serves `/metrics` on its own listener until `shutdown`, with the main listener's edge limits.
pub async fn serve(
    listener: TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let limits = state.settings.edge;
    super::edge::serve(listener, router(state), limits, shutdown).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The exported count of Slack requests on `route` with `outcome`.
    fn requests(route: &str, outcome: &str) -> f64 {
        let labels = format!("{{route=\"{route}\",outcome=\"{outcome}\"}}");
        crate::metrics::render()
            .lines()
            .find_map(|line| {
                line.strip_prefix("steward_slack_requests_total")?
                    .strip_prefix(labels.as_str())?
                    .trim()
                    .parse()
                    .ok()
            })
            .unwrap_or(0.0)
    }

    #[test]
    fn a_slack_request_dropped_before_its_answer_counts_as_cancelled() {
        crate::metrics::install();
        let before = requests("interactions", "cancelled");
        let answered = requests("interactions", "2xx");
        let tracked = Tracked {
            inner: std::future::pending::<Result<axum::http::Response<()>, ()>>(),
            route: Some(("interactions", Instant::now())),
        };
        drop(tracked);
        assert!(requests("interactions", "cancelled") >= before + 1.0);

        // An answered request is counted once, by its status, not again when dropped.
        let mut done = Box::pin(Tracked {
            inner: std::future::ready(Ok::<_, ()>(axum::http::Response::new(()))),
            route: Some(("interactions", Instant::now())),
        });
        let waker = std::task::Waker::noop();
        assert!(
            done.as_mut()
                .poll(&mut Context::from_waker(waker))
                .is_ready()
        );
        let cancelled = requests("interactions", "cancelled");
        drop(done);
        assert!(requests("interactions", "2xx") >= answered + 1.0);
        assert_eq!(requests("interactions", "cancelled"), cancelled);
    }

    #[test]
    fn only_the_three_slack_paths_have_a_route_label() {
        assert_eq!(slack_route("/slack/commands"), Some("commands"));
        assert_eq!(slack_route("/slack/interactions"), Some("interactions"));
        assert_eq!(slack_route("/slack/events"), Some("events"));
        assert_eq!(slack_route("/slack/commands/x"), None);
        assert_eq!(slack_route("/api/v1/runs"), None);
    }
}
