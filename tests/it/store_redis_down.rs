//! Sabotage: a throwaway `redis-server` is started on a free port, the store connects, the
//! server is killed, and every kind of operation must come back as `StoreError::Unavailable`
//! (and not hang: each call is bounded by the store's own short timeouts).
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use chrono::Utc;
use sandbox_steward::cases::{
    CaseDraft, DecisionOption, Evidence, Opener, Recommendation, Subject,
};
use sandbox_steward::ids::{CaseId, SandboxId};
use sandbox_steward::store::Job;
use sandbox_steward::store::{Store, StoreError};

/// Kills the server when the test ends, whatever happens.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn start_redis(port: u16) -> Server {
    let child = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server must be installed for this test");
    Server(child)
}

async fn connect_when_ready(url: &str) -> Store {
    let mut last = None;
    for _ in 0..100 {
        match Store::redis(url, "steward-down-test").await {
            Ok(store) => return store,
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("throwaway redis-server never accepted connections: {last:?}");
}

fn assert_unavailable<T: std::fmt::Debug>(what: &str, result: Result<T, StoreError>) {
    match result {
        Err(StoreError::Unavailable(message)) => {
            let shown = StoreError::Unavailable(message).to_string();
            assert!(shown.contains("can't reach its database"), "{shown}");
        }
        other => panic!("{what}: expected Unavailable, got {other:?}"),
    }
}

#[tokio::test]
async fn operations_report_unavailable_after_redis_dies() {
    let port = free_port();
    let url = format!("redis://127.0.0.1:{port}");
    let server = start_redis(port);
    let store = connect_when_ready(&url).await;
    store.ping().await.unwrap();
    assert!(
        store
            .first_time("before", Duration::from_secs(5))
            .await
            .unwrap()
    );

    drop(server);

    let case = CaseDraft {
        subject: Subject::Sandbox(SandboxId::parse("sbx-down").unwrap()),
        evidence: Evidence::default(),
        recommendation: Recommendation {
            option: DecisionOption::Kill,
            reason: "idle".into(),
        },
        options: None,
        opener: Opener::Sweep,
        reason: "idle".into(),
        decide_by: Utc::now() + chrono::Duration::hours(1),
    }
    .into_case(Utc::now())
    .unwrap();
    assert_unavailable("ping", store.ping().await);
    assert_unavailable("open_case", store.open_case(case.clone()).await);
    assert_unavailable("get_case", store.get_case(&CaseId::generate()).await);
    assert_unavailable(
        "first_time",
        store.first_time("after", Duration::from_secs(5)).await,
    );
    assert_unavailable(
        "enqueue",
        store
            .enqueue(&Job::RunDecision {
                case_id: case.id.clone(),
                option: DecisionOption::Kill,
                attempt: 1,
            })
            .await,
    );
    assert_unavailable(
        "claim",
        store.claim("worker", Duration::from_millis(100)).await,
    );
    assert_unavailable("expire_due", store.expire_due(Utc::now()).await);
    assert_unavailable(
        "acquire_lease",
        store
            .acquire_lease("sched", "me", Duration::from_secs(5))
            .await,
    );
}

#[tokio::test]
async fn connecting_to_a_port_with_no_redis_is_unavailable() {
    let url = format!("redis://127.0.0.1:{}", free_port());
    assert_unavailable("connect", Store::redis(&url, "steward-down-test").await);
}

#[tokio::test]
async fn a_malformed_url_or_prefix_is_refused_without_echoing_the_url() {
    let err = Store::redis("redis://:hunter2@[bad", "p")
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Invalid(_)), "{err:?}");
    assert!(!err.to_string().contains("hunter2"), "{err}");
    let err = Store::redis("redis://127.0.0.1:1", "bad{prefix}")
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Invalid(_)), "{err:?}");
}
