//! A throwaway `redis-server` on a free port, for what the shared one must not see.
//!
//! Sabotage: the store connects, the server is killed, and every kind of operation must come
//! back as `StoreError::Unavailable` (and not hang: each call is bounded by the store's own short
//! timeouts). And click batching, whose proof reads the server's own counters and flushes its
//! scripts.
use sandbox_steward::store::Lane;
use std::time::Duration;

use chrono::Utc;
use sandbox_steward::cases::{
    Case, CaseDraft, DecisionOption, Evidence, Opener, Recommendation, Subject,
};
use sandbox_steward::ids::{CaseId, SandboxId};
use sandbox_steward::store::Job;
use sandbox_steward::store::{FirstClick, Store, StoreError};

use crate::common::{ThrowawayRedis, free_port};

/// A store on `server`, which answers by now (`ThrowawayRedis` waits for it).
async fn store_on(server: &ThrowawayRedis) -> Store {
    Store::redis(&server.url(), "steward-down-test")
        .await
        .expect("the throwaway redis-server answers")
}

/// A new kill case on sandbox `id`, not yet stored.
fn kill_case(id: &str) -> Case {
    CaseDraft {
        subject: Subject::Sandbox(SandboxId::parse(id).unwrap()),
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
    .unwrap()
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
    let server = ThrowawayRedis::start();
    let store = store_on(&server).await;
    store.ping().await.unwrap();
    assert!(
        store
            .first_time("before", Duration::from_secs(5))
            .await
            .unwrap()
    );

    drop(server);

    let case = kill_case("sbx-down");
    assert_unavailable("ping", store.ping().await);
    assert_unavailable(
        "first_click",
        store
            .first_click(&case.id, "U1:1.1", Duration::from_secs(5))
            .await,
    );
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
        store
            .claim(Lane::Decisions, "worker", Duration::from_millis(100))
            .await,
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

/// `total_reads_processed` from the server's INFO: how many reads it did from its clients.
async fn reads_processed(redis: &mut redis::aio::MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("stats")
        .query_async(redis)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("total_reads_processed:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("INFO stats has total_reads_processed")
}

/// Every click of `marks` (case, mark) sent at once, as many tasks on this one thread; the
/// answers, in order.
async fn click_all(store: &Store, marks: &[(CaseId, String)]) -> Vec<FirstClick> {
    let tasks: Vec<_> = marks
        .iter()
        .cloned()
        .map(|(case, mark)| {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .first_click(&case, &mark, Duration::from_secs(60))
                    .await
                    .unwrap()
            })
        })
        .collect();
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.unwrap());
    }
    answers
}

/// Clicks that are ready together go to Redis as one pipeline, and each is still answered as if
/// it went alone: one first click per mark (the case, or "missing"), every other one a repeat.
/// A server that lost its scripts (`SCRIPT FLUSH`, as after a restart) is given the script
/// again, and the clicks still answer. One thread, so which clicks are ready together is fixed.
#[tokio::test(flavor = "current_thread")]
async fn clicks_ready_together_share_a_round_trip_and_are_each_answered_once() {
    let server = ThrowawayRedis::start();
    let store = store_on(&server).await;
    let mut redis = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let case = store
        .open_case(kill_case("sbx-clicked"))
        .await
        .unwrap()
        .case()
        .clone();

    // The real case and 49 unknown ones, each clicked four times with the same mark (Slack's
    // redeliveries), interleaved.
    let cases: Vec<CaseId> = std::iter::once(case.id.clone())
        .chain((0..49).map(|_| CaseId::generate()))
        .collect();
    let marks: Vec<(CaseId, String)> = (0..4)
        .flat_map(|_| cases.iter().map(|c| (c.clone(), format!("U1:{c}"))))
        .collect();
    let before = reads_processed(&mut redis).await;
    let answers = click_all(&store, &marks).await;
    let reads = reads_processed(&mut redis).await - before;
    for (i, id) in cases.iter().enumerate() {
        let of_case: Vec<&FirstClick> = answers.iter().skip(i).step_by(cases.len()).collect();
        let firsts: Vec<&&FirstClick> = of_case
            .iter()
            .filter(|a| !matches!(a, FirstClick::Repeat))
            .collect();
        assert_eq!(firsts.len(), 1, "{id}: {of_case:?}");
        match firsts[0] {
            FirstClick::Case(found) => assert_eq!(found.id, case.id),
            FirstClick::Missing => assert_ne!(*id, case.id),
            FirstClick::Repeat => unreachable!(),
        }
    }
    // 200 clicks; sent one by one they would be 200 reads (and the two INFO calls).
    assert!(
        reads < 20,
        "{reads} reads for {} clicks: not batched",
        marks.len()
    );

    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut redis)
        .await
        .unwrap();
    let again: Vec<(CaseId, String)> = (0..2)
        .flat_map(|_| cases.iter().map(|c| (c.clone(), format!("U2:{c}"))))
        .collect();
    let answers = click_all(&store, &again).await;
    assert!(
        matches!(&answers[0], FirstClick::Case(found) if found.id == case.id),
        "{:?}",
        answers[0]
    );
    assert_eq!(
        answers
            .iter()
            .filter(|a| matches!(a, FirstClick::Repeat))
            .count(),
        cases.len()
    );
}

/// E2B events and clicks that are ready together share pipelines, each answered as if alone (an
/// event is new once, then a repeat). After `SCRIPT FLUSH` a batch that mixes both scripts has
/// each loaded again, and every call still answers. (On one thread the multiplexed connection
/// coalesces writes by itself, so the read count bounds round trips but does not tell the
/// batcher from it.)
#[tokio::test(flavor = "current_thread")]
async fn events_and_clicks_ready_together_share_a_round_trip_and_survive_a_script_flush() {
    use sandbox_steward::store::TakenEvent;
    let server = ThrowawayRedis::start();
    let store = store_on(&server).await;
    let mut redis = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let sandbox = SandboxId::parse("sbx-events").unwrap();
    let at = Utc::now();
    let take_all = |round: &'static str| {
        let tasks: Vec<_> = (0..60)
            .map(|i| {
                let (store, sandbox) = (store.clone(), sandbox.clone());
                tokio::spawn(async move {
                    // Every event twice: the second of each pair is a repeat.
                    let id = format!("{round}-{}", i / 2);
                    if i % 3 == 0 {
                        let clicked = store
                            .first_click(&CaseId::generate(), "U1", Duration::from_secs(60))
                            .await
                            .unwrap();
                        assert!(matches!(clicked, FirstClick::Missing), "{clicked:?}");
                    }
                    store
                        .take_event(&sandbox, &id, at, "paused", Duration::from_secs(60))
                        .await
                        .unwrap()
                })
            })
            .collect::<Vec<_>>();
        async move {
            let mut answers = Vec::new();
            for t in tasks {
                answers.push(t.await.unwrap());
            }
            answers
        }
    };
    let before = reads_processed(&mut redis).await;
    let answers = take_all("a").await;
    let reads = reads_processed(&mut redis).await - before;
    let new = answers
        .iter()
        .filter(|a| matches!(a, TakenEvent::New { case_open: false }))
        .count();
    assert_eq!(new, 30, "{answers:?}");
    assert!(reads < 20, "{reads} reads for 80 calls: one each");

    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut redis)
        .await
        .unwrap();
    let answers = take_all("b").await;
    assert_eq!(
        answers.iter().filter(|a| **a == TakenEvent::Repeat).count(),
        30
    );
    assert_eq!(store.lifecycle_of(&sandbox).await.unwrap().len(), 1);
}
