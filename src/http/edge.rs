//! The accept loop of `steward serve`: bounded connections and header reads.
//!
//! `axum::serve` has no header-read timeout and no connection cap, so a client that opens many
//! connections and sends half a header would hold a file descriptor each, forever. Here every
//! connection needs a permit (at most `max_connections`; one over the cap is answered 503 and
//! closed), and hyper closes a connection whose request head has not arrived within
//! `header_timeout`. Body and whole-request timeouts are layers in [`super::router`].
//!
//! This module must not look at requests: it only accepts, limits and hands connections to hyper.
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tokio_util::task::TaskTracker;

use crate::config::EdgeSettings;

/// What a connection over the cap reads before it is closed.
const OVER_CAPACITY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain\r\n\
content-length: 45\r\nconnection: close\r\nretry-after: 1\r\n\r\nSteward is at its connection limit; try again.";

/// How long the loop backs off after a failed `accept` (e.g. out of file descriptors), so a
/// persistent error does not spin a core.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(50);

/// Serves `app` on `listener` until `shutdown` completes, then stops accepting, lets requests
/// in flight finish and returns once every connection is closed.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: EdgeSettings,
    shutdown: impl Future<Output = ()>,
) {
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let connections = TaskTracker::new();
    let (closing, closed) = watch::channel(false);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            biased;
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => stream,
                Err(e) => {
                    tracing::warn!(error = %e, "could not accept a connection");
                    tokio::time::sleep(ACCEPT_ERROR_BACKOFF).await;
                    continue;
                }
            },
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            refuse(stream, limits.max_connections);
            continue;
        };
        let service = TowerToHyperService::new(app.clone());
        let mut closed = closed.clone();
        connections.spawn(async move {
            let _permit = permit;
            let mut builder = http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout);
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            let mut conn = std::pin::pin!(conn);
            tokio::select! {
                result = conn.as_mut() => log_connection_end(result),
                () = async { let _ = closed.wait_for(|c| *c).await; } => {
                    // Finish the request in flight (bounded by the request timeout), then close.
                    conn.as_mut().graceful_shutdown();
                    log_connection_end(conn.await);
                }
            }
        });
    }
    drop(listener);
    let _ = closing.send(true);
    connections.close();
    connections.wait().await;
}

/// Answers a connection over the cap without reading from it, then closes it.
fn refuse(stream: TcpStream, cap: usize) {
    tracing::warn!(
        max_connections = cap,
        "refusing a connection: too many open"
    );
    // Best effort and never blocking: a fresh socket's send buffer takes this at once.
    let _ = stream.try_write(OVER_CAPACITY);
}

fn log_connection_end(result: Result<(), hyper::Error>) {
    match result {
        Ok(()) => {}
        // Routine: load balancers and health checkers open connections they never use, so
        // this would otherwise be an INFO line every few seconds.
        Err(e) if e.is_timeout() => {
            tracing::debug!("closed a connection that did not send its request head in time");
        }
        Err(e) => tracing::debug!(error = %e, "connection ended with an error"),
    }
}
