//! The HTTP edge over real TCP: a client cannot hold a connection open with half a header or a
//! short body, and connections over `STEWARD_MAX_CONNECTIONS` are refused rather than served.
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::{TestApp, TestAppOptions, spawn_app_with, wait_until};

/// Deadline for the server to do what the test expects; never a timing assertion.
const DEADLINE: Duration = Duration::from_secs(20);

async fn app_with(env: &[(&str, &str)]) -> TestApp {
    spawn_app_with(TestAppOptions {
        sandboxes: 0,
        worker: false,
        env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..TestAppOptions::default()
    })
    .await
}

async fn connect(app: &TestApp) -> TcpStream {
    TcpStream::connect(("127.0.0.1", app.port))
        .await
        .expect("the app accepts TCP connections")
}

/// Reads an answer's status line and headers (the connection may stay open), failing the test if
/// they have not arrived by the deadline or the connection closes first.
async fn read_head(stream: &mut TcpStream) -> String {
    let mut seen = Vec::new();
    let mut buf = [0u8; 1024];
    tokio::time::timeout(DEADLINE, async {
        while !String::from_utf8_lossy(&seen).contains("\r\n\r\n") {
            let n = stream.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed without an answer");
            seen.extend_from_slice(&buf[..n]);
        }
    })
    .await
    .expect("the server answered in time");
    String::from_utf8_lossy(&seen).into_owned()
}

/// Reads until the server closes the connection (a reset counts as closed), failing the test
/// if it is still open at the deadline.
async fn read_until_closed(stream: &mut TcpStream) -> String {
    let mut seen = Vec::new();
    let read = tokio::time::timeout(DEADLINE, async {
        let mut buf = [0u8; 4096];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    assert!(
        read.is_ok(),
        "the server kept the connection open; it sent: {:?}",
        String::from_utf8_lossy(&seen)
    );
    String::from_utf8_lossy(&seen).into_owned()
}

/// Sends `GET /healthz` on a keep-alive connection and reads the whole answer.
async fn healthz_keep_alive(stream: &mut TcpStream) -> String {
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: steward\r\n\r\n")
        .await
        .unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 1024];
    tokio::time::timeout(DEADLINE, async {
        while !String::from_utf8_lossy(&seen).contains("alive") {
            let n = stream.read(&mut buf).await.unwrap();
            assert!(
                n > 0,
                "closed before answering: {:?}",
                String::from_utf8_lossy(&seen)
            );
            seen.extend_from_slice(&buf[..n]);
        }
    })
    .await
    .expect("healthz answers");
    String::from_utf8_lossy(&seen).into_owned()
}

#[tokio::test]
async fn a_connection_that_sends_half_a_header_or_sits_idle_is_closed_by_the_server() {
    let app = app_with(&[("STEWARD_HEADER_TIMEOUT", "1s")]).await;
    let mut idle = Vec::new();
    for _ in 0..20 {
        let mut stream = connect(&app).await;
        stream
            .write_all(b"POST /slack/commands HTTP/1.1\r\nhost: steward\r\nx-slack-")
            .await
            .unwrap();
        idle.push(stream);
    }
    // ...and some that never send a byte, and one that was served and then sits idle.
    for _ in 0..5 {
        idle.push(connect(&app).await);
    }
    let mut served = connect(&app).await;
    assert!(
        healthz_keep_alive(&mut served)
            .await
            .starts_with("HTTP/1.1 200")
    );
    idle.push(served);
    for stream in &mut idle {
        let seen = read_until_closed(stream).await;
        assert!(!seen.contains("HTTP/1.1"), "{seen}");
    }
    // The replica still serves others.
    let resp = app.http.get(app.url("/healthz")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
}

#[tokio::test]
async fn a_body_shorter_than_its_content_length_is_answered_408() {
    let app = app_with(&[("STEWARD_BODY_TIMEOUT", "1s")]).await;
    let mut stream = connect(&app).await;
    stream
        .write_all(
            b"POST /slack/commands HTTP/1.1\r\nhost: steward\r\n\
              content-type: application/x-www-form-urlencoded\r\ncontent-length: 100\r\n\r\ntext=help",
        )
        .await
        .unwrap();
    let seen = read_until_closed(&mut stream).await;
    assert!(seen.starts_with("HTTP/1.1 408"), "{seen}");
    assert!(seen.contains("did not arrive in time"), "{seen}");
}

/// The Slack request counter is the outermost layer: an answer the router's own limits give (the
/// request timeout's 408, made by its layer, not by a handler) is counted on its route too.
#[tokio::test]
async fn a_408_from_the_request_timeout_is_counted_as_a_slack_request() {
    let app = app_with(&[
        ("STEWARD_REQUEST_TIMEOUT", "1s"),
        ("STEWARD_BODY_TIMEOUT", "1h"),
    ])
    .await;
    let counted = |samples: &[crate::common::scrape::Sample]| {
        crate::common::scrape::total(
            samples,
            "steward_slack_requests_total",
            &[("route", "events"), ("outcome", "4xx")],
        ) + 0.0 // an empty sum is -0
    };
    let (_, before) = crate::common::scrape::scrape(&app).await;
    let mut stream = connect(&app).await;
    stream
        .write_all(
            b"POST /slack/events HTTP/1.1\r\nhost: steward\r\n\
              content-type: application/json\r\ncontent-length: 100\r\n\r\n{\"type\"",
        )
        .await
        .unwrap();
    let seen = read_head(&mut stream).await;
    assert!(seen.starts_with("HTTP/1.1 408"), "{seen}");
    let (_, after) = crate::common::scrape::scrape(&app).await;
    assert!(
        counted(&after) >= counted(&before) + 1.0,
        "events/4xx went from {} to {}",
        counted(&before),
        counted(&after)
    );
}

#[tokio::test]
async fn connections_over_the_cap_are_answered_503_and_closed_until_one_ends() {
    let app = app_with(&[
        ("STEWARD_MAX_CONNECTIONS", "2"),
        ("STEWARD_HEADER_TIMEOUT", "60s"),
    ])
    .await;
    // Two keep-alive connections that have been served hold both places.
    let mut first = connect(&app).await;
    let mut second = connect(&app).await;
    assert!(
        healthz_keep_alive(&mut first)
            .await
            .starts_with("HTTP/1.1 200")
    );
    assert!(
        healthz_keep_alive(&mut second)
            .await
            .starts_with("HTTP/1.1 200")
    );

    let mut third = connect(&app).await;
    let seen = read_until_closed(&mut third).await;
    assert!(seen.starts_with("HTTP/1.1 503"), "{seen}");
    assert!(seen.contains("connection limit"), "{seen}");

    // Once a connection ends, its place is free again.
    drop(first);
    wait_until("a place freed up after a connection closed", || async {
        let mut next = connect(&app).await;
        next.write_all(b"GET /healthz HTTP/1.1\r\nhost: steward\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        read_until_closed(&mut next)
            .await
            .starts_with("HTTP/1.1 200")
            .then_some(())
    })
    .await;
    drop(second);
}

#[tokio::test]
async fn a_request_not_answered_within_the_request_timeout_is_answered_408() {
    // The body deadline is far off; the whole-request deadline is what ends this one.
    let app = app_with(&[
        ("STEWARD_REQUEST_TIMEOUT", "1s"),
        ("STEWARD_BODY_TIMEOUT", "1h"),
    ])
    .await;
    let mut stream = connect(&app).await;
    stream
        .write_all(
            b"POST /slack/commands HTTP/1.1\r\nhost: steward\r\n\
              content-type: application/x-www-form-urlencoded\r\ncontent-length: 100\r\n\r\ntext=",
        )
        .await
        .unwrap();
    let seen = read_head(&mut stream).await;
    assert!(seen.starts_with("HTTP/1.1 408"), "{seen}");
}

/// Load balancers and health checkers open connections they never use; closing one is routine,
/// so `steward serve` logs it at debug, not as an INFO line every few seconds. (With the edge at
/// debug the line is there, so its absence at the default level is the level, not a lost line.)
#[tokio::test]
async fn closing_a_connection_that_never_sent_a_request_is_logged_at_debug_only() {
    const LINE: &str = "closed a connection that did not send its request head in time";
    for (filter, shown) in [
        (None, false),
        (Some("info,sandbox_steward::http::edge=debug"), true),
    ] {
        let mut env = vec![("STEWARD_HEADER_TIMEOUT", "1s")];
        if let Some(filter) = filter {
            env.push(("RUST_LOG", filter));
        }
        let serve = crate::common::serve_process(&env).await;
        let mut silent = TcpStream::connect(&serve.addr).await.unwrap();
        // The server logs, then drops the connection: once it is closed, the line was written.
        let seen = read_until_closed(&mut silent).await;
        assert!(seen.is_empty(), "{seen}");
        let log = serve.stop().await;
        assert_eq!(log.contains(LINE), shown, "RUST_LOG {filter:?}:\n{log}");
        if shown {
            assert!(
                log.lines().any(|l| l.contains(LINE) && l.contains("DEBUG")),
                "{log}"
            );
        }
    }
}
