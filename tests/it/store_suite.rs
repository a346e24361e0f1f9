//! The one store test suite, run against both backends: every scenario is an `async fn(Store)`
//! and `suite!` instantiates it for `Store::memory()`, for real Redis (REDIS_URL or
//! redis://127.0.0.1:6379) and for a 3-node Redis Cluster started by the tests, each under a
//! unique key prefix that is deleted afterwards.

use sandbox_steward::store::Lane;
use std::sync::Arc;

use crate::common::{PrefixCleanup, TestApp, eventually, redis_url};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};
use sandbox_steward::cases::{
    Card, Case, CaseDraft, CaseState, DecisionOption, Event, Evidence, Opener, Recommendation,
    Step, StepOutcome, StepRecord, Subject, TransitionError,
};
use sandbox_steward::ids::{CaseId, SandboxId, SlackChannelId, SlackUserId, TemplateId};
use sandbox_steward::jobs::{self, JobError, StepFailure, WorkOutcome};
use sandbox_steward::store::Job;
use sandbox_steward::store::{Actor, AuditEvent, Opened, Store, StoreError, Updated};

async fn redis_store() -> (Store, PrefixCleanup) {
    let prefix = format!("steward-test-{}", uuid::Uuid::new_v4().simple());
    let store = Store::redis(&redis_url(), &prefix)
        .await
        .expect("the store suite needs Redis at REDIS_URL or 127.0.0.1:6379");
    (
        store,
        PrefixCleanup {
            url: redis_url(),
            prefix,
        },
    )
}

macro_rules! suite {
    ($($name:ident),* $(,)?) => {
        mod memory {
            $(
                // Several worker threads, so the concurrency scenarios really interleave.
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::$name(sandbox_steward::store::Store::memory()).await;
                }
            )*
        }
        mod redis_backend {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let (store, _cleanup) = super::redis_store().await;
                    super::$name(store).await;
                }
            )*
        }
        // The same scenarios on a 3-node Redis Cluster the tests start (see store_cluster.rs).
        mod cluster {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let (store, _cleanup) = crate::store_cluster::cluster_store().await;
                    super::$name(store).await;
                }
            )*
        }
    };
}

suite!(
    opening_a_second_case_for_the_same_subject_returns_the_existing_one,
    fifty_concurrent_decisions_have_exactly_one_winner_and_the_losers_see_it,
    a_closed_case_frees_its_subject_for_a_new_case,
    a_retry_is_refused_while_another_case_holds_the_subject,
    the_card_is_recorded_and_unknown_cases_are_not_found,
    repeated_payloads_are_seen_only_once,
    a_job_is_claimed_once_and_gone_after_its_ack,
    a_blocked_claim_wakes_up_when_a_job_arrives,
    a_job_whose_worker_died_is_taken_over_and_resumes_after_its_finished_steps,
    a_second_worker_cannot_run_a_case_another_worker_is_running,
    a_permanent_step_failure_fails_the_case_and_a_retry_finishes_it,
    stale_evidence_sends_the_case_back_to_pending_and_forgets_its_steps,
    due_cases_are_expired_exactly_once_by_concurrent_expirers,
    the_audit_log_answers_by_case_subject_and_time,
    leases_are_exclusive_and_expire,
    decided_cases_are_indexed_until_their_work_ends_and_one_caller_postpones_each,
    the_worker_loop_runs_jobs_until_shutdown,
    a_leave_decision_outlives_its_case_for_sweeps,
    every_leave_mark_is_listed_with_its_subject_whatever_its_shard,
    the_sweep_marker_never_moves_backwards,
    history_reads_a_bounded_recent_slice_and_export_pages_through_everything,
    out_of_date_cards_are_counted_until_cleared,
    a_run_record_is_swapped_only_at_its_version_and_keeps_its_output_under_the_cap,
    queue_figures_count_unacknowledged_jobs_and_date_the_oldest,
    a_first_click_reads_its_case_and_a_repeat_or_a_missing_case_says_so,
    a_waiting_job_knows_its_place_in_its_lane_until_a_worker_takes_it,
    an_e2b_event_is_taken_once_with_its_history_and_says_whether_a_case_is_open,
);

/// A click: the first one with a mark reads the case (for subjects in every shard, since the
/// Redis script finds the case's shard itself), a repeat of the mark is told apart without
/// reading it, another mark on the same case is a first click again, and an unknown case is
/// missing (and its mark is kept, so a redelivery of that click is a repeat too).
async fn a_first_click_reads_its_case_and_a_repeat_or_a_missing_case_says_so(store: Store) {
    use sandbox_steward::store::FirstClick;
    let ttl = Duration::from_secs(60);
    let mut shards = std::collections::HashSet::new();
    for _ in 0..48 {
        let subject = new_sandbox();
        shards.insert(sandbox_steward::store::keys::shard_of(&subject.key()));
        let case = open(&store, &subject).await;
        let decided = store
            .apply_event(&case.id, decide(DecisionOption::Pause, "U1"), Utc::now())
            .await
            .unwrap();
        let Updated::Applied(now) = decided else {
            panic!("{decided:?}")
        };
        let first = store.first_click(&case.id, "U1:1.1", ttl).await.unwrap();
        assert_eq!(first, FirstClick::Case(Box::new(now.clone())));
        assert_eq!(
            store.first_click(&case.id, "U1:1.1", ttl).await.unwrap(),
            FirstClick::Repeat
        );
        assert_eq!(
            store.first_click(&case.id, "U2:1.1", ttl).await.unwrap(),
            FirstClick::Case(Box::new(now))
        );
    }
    assert!(shards.len() > 8, "only {} shards covered", shards.len());
    let unknown = CaseId::generate();
    assert_eq!(
        store.first_click(&unknown, "U1:2.2", ttl).await.unwrap(),
        FirstClick::Missing
    );
    assert_eq!(
        store.first_click(&unknown, "U1:2.2", ttl).await.unwrap(),
        FirstClick::Repeat
    );
    // A click mark and a `first_time` key of the same text do not see each other.
    assert!(store.first_time("U1:2.2", ttl).await.unwrap());
}

/// Runs: created once, compare-and-swapped by version, output counted in full but kept only up
/// to the cap, inputs deleted once uploaded.
async fn a_run_record_is_swapped_only_at_its_version_and_keeps_its_output_under_the_cap(
    store: Store,
) {
    let id = sandbox_steward::ids::RunId::parse(format!("run_{}", uuid::Uuid::new_v4().simple()))
        .unwrap();
    assert_eq!(store.load_run(&id).await.unwrap(), None);
    store.create_run(&id, "{\"a\":1}", "[files]").await.unwrap();
    assert!(matches!(
        store.create_run(&id, "{}", "[]").await,
        Err(StoreError::Conflict(_))
    ));
    let run = store.load_run(&id).await.unwrap().unwrap();
    assert_eq!((run.version, run.json.as_str()), (1, "{\"a\":1}"));
    assert!(store.swap_run(&id, 1, "{\"a\":2}").await.unwrap());
    assert!(
        !store.swap_run(&id, 1, "{\"a\":3}").await.unwrap(),
        "a stale version loses"
    );
    let run = store.load_run(&id).await.unwrap().unwrap();
    assert_eq!((run.version, run.json.as_str()), (2, "{\"a\":2}"));

    let first = store.append_run_output(&id, b"hello ", 8).await.unwrap();
    assert_eq!((first.kept, first.total), (6, 6));
    let second = store.append_run_output(&id, b"world", 8).await.unwrap();
    assert_eq!((second.kept, second.total), (8, 11));
    let run = store.load_run(&id).await.unwrap().unwrap();
    assert_eq!((run.output_kept, run.output_total), (8, 11));
    assert_eq!(
        store.run_output(&id, 0, 100).await.unwrap(),
        (b"hello wo".to_vec(), 8)
    );
    assert_eq!(
        store.run_output(&id, 6, 1).await.unwrap(),
        (b"w".to_vec(), 8)
    );
    assert_eq!(
        store.run_output(&id, 8, 100).await.unwrap(),
        (Vec::new(), 8)
    );
    assert_eq!(
        store.run_output(&id, 50, 100).await.unwrap(),
        (Vec::new(), 8)
    );
    // Past the head, the end is kept too: at most the cap's worth of the very end.
    assert_eq!(store.run_output_tail(&id, 100).await.unwrap(), b"rld");
    for chunk in [&b"0123456789"[..], b"abcdefghij", b"klm"] {
        store.append_run_output(&id, chunk, 8).await.unwrap();
    }
    assert_eq!(store.run_output_tail(&id, 8).await.unwrap(), b"fghijklm");
    assert_eq!(store.run_output_tail(&id, 3).await.unwrap(), b"klm");
    let held = store.run_output_tail(&id, 100).await.unwrap();
    assert!(
        held.len() < 16 && b"rld0123456789abcdefghijklm".ends_with(&held),
        "at most twice the cap, all of it the real end: {held:?}"
    );
    let run = store.load_run(&id).await.unwrap().unwrap();
    assert_eq!((run.output_kept, run.output_total), (8, 34));
    assert_eq!(
        store.run_output(&id, 0, 100).await.unwrap(),
        (b"hello wo".to_vec(), 8),
        "the head stays as it was"
    );

    assert_eq!(
        store.run_files(&id).await.unwrap().as_deref(),
        Some("[files]")
    );
    store.delete_run_files(&id).await.unwrap();
    assert_eq!(store.run_files(&id).await.unwrap(), None);

    // Output of a run that is not stored is not kept.
    let gone = sandbox_steward::ids::RunId::parse("run_gone").unwrap();
    let count = store.append_run_output(&gone, b"x", 8).await.unwrap();
    assert_eq!((count.kept, count.total), (0, 0));
}

/// Out-of-date card records live in the store, so any replica's repair pass sees them.
async fn out_of_date_cards_are_counted_until_cleared(store: Store) {
    let a = CaseId::parse(format!("case_{}", uuid::Uuid::new_v4().simple())).unwrap();
    let b = CaseId::parse(format!("case_{}", uuid::Uuid::new_v4().simple())).unwrap();
    assert_eq!(store.mark_card_stale(&a).await.unwrap(), 1);
    assert_eq!(store.mark_card_stale(&a).await.unwrap(), 2);
    assert_eq!(store.mark_card_stale(&b).await.unwrap(), 1);
    let mut stale = store.stale_cards().await.unwrap();
    stale.sort();
    let mut expected = vec![(a.clone(), 2), (b.clone(), 1)];
    expected.sort();
    assert_eq!(stale, expected);
    store.clear_stale_card(&a).await.unwrap();
    assert_eq!(store.stale_cards().await.unwrap(), vec![(b.clone(), 1)]);
    store.clear_stale_card(&b).await.unwrap();
    assert!(store.stale_cards().await.unwrap().is_empty());
}

fn t(secs: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(secs, 0).unwrap()
}

fn user(id: &str) -> SlackUserId {
    SlackUserId::parse(id).unwrap()
}

fn new_sandbox() -> Subject {
    Subject::Sandbox(SandboxId::parse(format!("sbx{}", uuid::Uuid::new_v4().simple())).unwrap())
}

/// A pending case about `subject`, due one day from now (or `decide_by`).
fn case_for(subject: &Subject, decide_by: Option<DateTime<Utc>>, opened_at: DateTime<Utc>) -> Case {
    CaseDraft {
        subject: subject.clone(),
        evidence: Evidence {
            state: Some("running".into()),
            ..Evidence::default()
        },
        recommendation: Recommendation {
            option: DecisionOption::SnapshotThenKill,
            reason: "idle for 3 days".into(),
        },
        options: None,
        opener: Opener::Person { user: user("UREQ") },
        reason: "cleanup".into(),
        decide_by: decide_by.unwrap_or(opened_at + chrono::Duration::days(1)),
    }
    .into_case(opened_at)
    .unwrap()
}

async fn open(store: &Store, subject: &Subject) -> Case {
    match store
        .open_case(case_for(subject, None, Utc::now()))
        .await
        .unwrap()
    {
        Opened::Created(case) => case,
        Opened::Existing(case) => panic!("expected a new case, got {case:?}"),
    }
}

fn decide(option: DecisionOption, by: &str) -> Event {
    Event::Decide {
        option,
        by: user(by),
        reason: None,
        until: None,
    }
}

async fn decided(store: &Store, option: DecisionOption) -> Case {
    let case = open(store, &new_sandbox()).await;
    match store
        .apply_event(&case.id, decide(option, "UAPPROVER"), Utc::now())
        .await
        .unwrap()
    {
        Updated::Applied(case) => case,
        other => panic!("{other:?}"),
    }
}

fn snap() -> TemplateId {
    TemplateId::parse("team/snap:1").unwrap()
}

/// What a fake E2B does for each step; counts calls per step.
fn outcome_of(step: Step) -> StepOutcome {
    match step {
        Step::Snapshot => StepOutcome::SnapshotCreated {
            snapshot_id: snap(),
            life_left_secs: None,
        },
        Step::VerifySnapshot => StepOutcome::SnapshotVerified {
            snapshot_id: snap(),
        },
        Step::Kill => StepOutcome::Killed,
        Step::Pause => StepOutcome::Paused,
        Step::DeleteTemplate => StepOutcome::TemplateDeleted,
        Step::ExtendTimeout => StepOutcome::KeptRunning {
            until: chrono::DateTime::from_timestamp(2_000_000_000, 0).unwrap(),
            extended: true,
        },
        Step::ShortenTimeout => StepOutcome::Shortened {
            until: chrono::DateTime::from_timestamp(2_000_000_000, 0).unwrap(),
            shortened: true,
        },
    }
}

#[derive(Default)]
struct Calls(std::sync::Mutex<Vec<Step>>);

impl Calls {
    fn push(&self, step: Step) {
        self.0.lock().unwrap().push(step);
    }
    fn all(&self) -> Vec<Step> {
        self.0.lock().unwrap().clone()
    }
}

async fn opening_a_second_case_for_the_same_subject_returns_the_existing_one(store: Store) {
    let subject = new_sandbox();
    let first = open(&store, &subject).await;
    assert_eq!(first.version, 1);
    let again = store
        .open_case(case_for(&subject, None, Utc::now()))
        .await
        .unwrap();
    assert_eq!(again, Opened::Existing(first.clone()));
    assert_eq!(store.case_for_subject(&subject).await.unwrap(), Some(first));
    assert_eq!(store.case_for_subject(&new_sandbox()).await.unwrap(), None);
}

async fn fifty_concurrent_decisions_have_exactly_one_winner_and_the_losers_see_it(store: Store) {
    let case = open(&store, &new_sandbox()).await;
    let mut tasks = Vec::new();
    for i in 0..50 {
        let store = store.clone();
        let id = case.id.clone();
        tasks.push(tokio::spawn(async move {
            let by = format!("U{i}");
            store
                .apply_event(&id, decide(DecisionOption::Kill, &by), Utc::now())
                .await
                .unwrap()
        }));
    }
    let mut winners = Vec::new();
    let mut losers = Vec::new();
    for task in tasks {
        match task.await.unwrap() {
            Updated::Applied(case) => winners.push(case),
            Updated::Rejected { current, error } => losers.push((current, error)),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one decision wins");
    assert_eq!(losers.len(), 49);
    let winner = winners[0].state.decision().unwrap().by.clone();
    for (current, error) in losers {
        assert_eq!(
            error,
            TransitionError::Illegal {
                event: "decide",
                state: "decided"
            }
        );
        assert_eq!(current.state.decision().unwrap().by, winner);
    }
    let stored = store.get_case(&case.id).await.unwrap();
    assert_eq!(stored.version, 2, "one write after the open");
    assert_eq!(stored.state.decision().unwrap().by, winner);
}

async fn a_closed_case_frees_its_subject_for_a_new_case(store: Store) {
    let subject = new_sandbox();
    let first = open(&store, &subject).await;
    let left = store
        .apply_event(&first.id, decide(DecisionOption::Leave, "U1"), Utc::now())
        .await
        .unwrap();
    assert!(matches!(left, Updated::Applied(ref c) if matches!(c.state, CaseState::Left { .. })));
    assert_eq!(store.case_for_subject(&subject).await.unwrap(), None);
    let second = open(&store, &subject).await;
    assert_ne!(second.id, first.id);
    assert_eq!(
        store.case_for_subject(&subject).await.unwrap().unwrap().id,
        second.id
    );
}

async fn a_retry_is_refused_while_another_case_holds_the_subject(store: Store) {
    let subject = new_sandbox();
    let first = open(&store, &subject).await;
    let now = Utc::now();
    for event in [
        decide(DecisionOption::Kill, "U1"),
        Event::StartExecuting,
        Event::Fail {
            error: "E2B said 500".into(),
        },
    ] {
        assert!(matches!(
            store.apply_event(&first.id, event, now).await.unwrap(),
            Updated::Applied(_)
        ));
    }
    let second = open(&store, &subject).await;
    let retry = store
        .apply_event(&first.id, Event::Retry { by: user("U1") }, now)
        .await;
    assert!(matches!(retry, Err(StoreError::Conflict(_))), "{retry:?}");
    let stored = store.get_case(&first.id).await.unwrap();
    assert_eq!(stored.state.name(), "failed", "nothing changed");
    assert_eq!(
        store.case_for_subject(&subject).await.unwrap().unwrap().id,
        second.id
    );
}

async fn the_card_is_recorded_and_unknown_cases_are_not_found(store: Store) {
    let case = open(&store, &new_sandbox()).await;
    let card = Card {
        channel: SlackChannelId::parse("C123").unwrap(),
        ts: "1700000000.000100".into(),
    };
    let updated = store.set_card(&case.id, card.clone()).await.unwrap();
    assert_eq!(updated.card, Some(card.clone()));
    assert_eq!(store.get_case(&case.id).await.unwrap().card, Some(card));
    let missing = store.get_case(&CaseId::generate()).await;
    assert!(
        matches!(missing, Err(StoreError::NotFound(_))),
        "{missing:?}"
    );
    let missing = store
        .apply_event(&CaseId::generate(), Event::Expire, Utc::now())
        .await;
    assert!(
        matches!(missing, Err(StoreError::NotFound(_))),
        "{missing:?}"
    );
}

async fn repeated_payloads_are_seen_only_once(store: Store) {
    let key = format!("slack-retry:{}", uuid::Uuid::new_v4());
    let ttl = Duration::from_secs(60);
    assert!(store.first_time(&key, ttl).await.unwrap());
    assert!(!store.first_time(&key, ttl).await.unwrap());
    assert!(
        store
            .first_time(&format!("{key}-other"), ttl)
            .await
            .unwrap()
    );
}

/// An E2B lifecycle event is taken once by its id (webhook and poller share the mark): the
/// first time it joins its sandbox's history and says whether the sandbox has an open case; a
/// repeat changes nothing; a forgotten event (its work failed) is taken again without a second
/// history entry. On the Cluster this also proves the mark, the history and the open pointer
/// share a slot (the script touches all three).
async fn an_e2b_event_is_taken_once_with_its_history_and_says_whether_a_case_is_open(store: Store) {
    use sandbox_steward::store::TakenEvent;
    let ttl = Duration::from_secs(60);
    let at = DateTime::parse_from_rfc3339("2026-12-07T10:00:00Z")
        .unwrap()
        .with_timezone(&Utc);
    for n in 0..8 {
        // Sandboxes in several shards.
        let sandbox = SandboxId::parse(format!(
            "itake{n}{}",
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        ))
        .unwrap();
        let event = format!("ev-{}", uuid::Uuid::new_v4());
        let take = || store.take_event(&sandbox, &event, at, "paused", ttl);
        assert_eq!(take().await.unwrap(), TakenEvent::New { case_open: false });
        assert_eq!(take().await.unwrap(), TakenEvent::Repeat);
        store.forget_event(&sandbox, &event).await.unwrap();
        assert_eq!(take().await.unwrap(), TakenEvent::New { case_open: false });
        let history = store.lifecycle_of(&sandbox).await.unwrap();
        assert_eq!(history, vec![(at, "paused".to_owned())], "kept once");

        let subject = Subject::Sandbox(sandbox.clone());
        open(&store, &subject).await;
        let later = format!("ev-{}", uuid::Uuid::new_v4());
        assert_eq!(
            store
                .take_event(
                    &sandbox,
                    &later,
                    at + chrono::Duration::seconds(5),
                    "resumed",
                    ttl
                )
                .await
                .unwrap(),
            TakenEvent::New { case_open: true }
        );
        assert_eq!(store.lifecycle_of(&sandbox).await.unwrap().len(), 2);
    }
}

fn job_for(case: &Case, option: DecisionOption) -> Job {
    Job::RunDecision {
        case_id: case.id.clone(),
        option,
        attempt: 1,
    }
}

async fn a_job_is_claimed_once_and_gone_after_its_ack(store: Store) {
    let case = open(&store, &new_sandbox()).await;
    let job = job_for(&case, DecisionOption::Kill);
    let id = store.enqueue(&job).await.unwrap();
    let claimed = store
        .claim(Lane::Decisions, "worker-a", Duration::ZERO)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(claimed.id, id);
    assert_eq!(claimed.job, job);
    assert_eq!(claimed.deliveries, 1);
    assert_eq!(
        store
            .claim(Lane::Decisions, "worker-b", Duration::ZERO)
            .await
            .unwrap(),
        None
    );
    store.ack(&claimed.id).await.unwrap();
    assert!(
        store
            .reclaim_stale(Lane::Decisions, "worker-b", Duration::ZERO)
            .await
            .unwrap()
            .is_empty()
    );
}

/// Where a run waits for a worker: its place among the waiting jobs of its own lane (decisions
/// do not count), and none once a worker took it.
async fn a_waiting_job_knows_its_place_in_its_lane_until_a_worker_takes_it(store: Store) {
    let run = |n: u32| Job::Run {
        run_id: sandbox_steward::ids::RunId::parse(format!(
            "run_{n}{}",
            uuid::Uuid::new_v4().simple()
        ))
        .unwrap(),
    };
    let (first, second, third) = (run(1), run(2), run(3));
    store.enqueue(&first).await.unwrap();
    let case = open(&store, &new_sandbox()).await;
    store
        .enqueue(&job_for(&case, DecisionOption::Kill))
        .await
        .unwrap();
    store.enqueue(&second).await.unwrap();
    store.enqueue(&third).await.unwrap();
    assert_eq!(store.queue_position(&first, 100).await.unwrap(), Some(1));
    assert_eq!(store.queue_position(&third, 100).await.unwrap(), Some(3));
    // Only the first `up_to` waiting jobs are looked at.
    assert_eq!(store.queue_position(&third, 2).await.unwrap(), None);
    let taken = store
        .claim(Lane::Runs, "worker-a", Duration::ZERO)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(taken.job, first);
    assert_eq!(store.queue_position(&first, 100).await.unwrap(), None);
    assert_eq!(store.queue_position(&second, 100).await.unwrap(), Some(1));
    assert_eq!(store.queue_position(&run(4), 100).await.unwrap(), None);
}

/// What `/metrics` reports as queue depth and the oldest job's age.
async fn queue_figures_count_unacknowledged_jobs_and_date_the_oldest(store: Store) {
    let empty = store.queue_stats(Lane::Decisions).await.unwrap();
    assert_eq!(
        (
            empty.depth,
            empty.oldest_enqueued_at,
            empty.oldest_waiting_at
        ),
        (0, None, None)
    );
    let case = open(&store, &new_sandbox()).await;
    let before = Utc::now() - chrono::Duration::seconds(1);
    let first = store
        .enqueue(&job_for(&case, DecisionOption::Kill))
        .await
        .unwrap();
    store
        .enqueue(&job_for(&case, DecisionOption::Pause))
        .await
        .unwrap();
    let after = Utc::now() + chrono::Duration::seconds(1);
    let two = store.queue_stats(Lane::Decisions).await.unwrap();
    assert_eq!(two.depth, 2);
    let oldest = two.oldest_enqueued_at.expect("the oldest job has a time");
    assert!(before <= oldest && oldest <= after, "{oldest}");
    assert_eq!(two.oldest_waiting_at, Some(oldest), "nothing was taken yet");
    // A claimed job still counts until it is acknowledged, but no longer waits: the oldest
    // waiting job is the second one.
    let claimed = store
        .claim(Lane::Decisions, "worker-a", Duration::ZERO)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(claimed.id, first);
    let taken = store.queue_stats(Lane::Decisions).await.unwrap();
    assert_eq!(taken.depth, 2);
    assert_eq!(taken.oldest_enqueued_at, Some(oldest));
    let second = taken.oldest_waiting_at.expect("the second job still waits");
    assert!(oldest <= second && second <= after, "{second}");
    store.ack(&claimed.id).await.unwrap();
    let one = store.queue_stats(Lane::Decisions).await.unwrap();
    assert_eq!(one.depth, 1);
    assert!(one.oldest_enqueued_at.unwrap() >= oldest);
    assert_eq!(one.oldest_waiting_at, Some(second));
    // Once the last one is taken too, nothing waits, though it is not done.
    let last = store
        .claim(Lane::Decisions, "worker-a", Duration::ZERO)
        .await
        .unwrap()
        .unwrap();
    let working = store.queue_stats(Lane::Decisions).await.unwrap();
    assert_eq!((working.depth, working.oldest_waiting_at), (1, None));
    store.ack(&last.id).await.unwrap();
}

async fn a_blocked_claim_wakes_up_when_a_job_arrives(store: Store) {
    let case = open(&store, &new_sandbox()).await;
    let waiting = {
        let store = store.clone();
        tokio::spawn(async move {
            store
                .claim(Lane::Decisions, "worker-a", Duration::from_secs(8))
                .await
        })
    };
    // No job exists yet, so the claim can only finish by seeing the one enqueued next
    // (whether it is already waiting or starts reading just after the enqueue).
    assert!(!waiting.is_finished(), "a claim with nothing queued waits");
    let job = job_for(&case, DecisionOption::Pause);
    store.enqueue(&job).await.unwrap();
    let claimed = waiting
        .await
        .unwrap()
        .unwrap()
        .expect("the claim sees the job");
    assert_eq!(claimed.job, job);
}

async fn a_job_whose_worker_died_is_taken_over_and_resumes_after_its_finished_steps(store: Store) {
    let case = decided(&store, DecisionOption::SnapshotThenKill).await;
    store
        .enqueue(&job_for(&case, DecisionOption::SnapshotThenKill))
        .await
        .unwrap();

    // Worker A claims, takes the snapshot, records it, and dies before the rest.
    let claimed_by_a = store
        .claim(Lane::Decisions, "worker-a", Duration::ZERO)
        .await
        .unwrap()
        .unwrap();
    let died = jobs::execute_decision(&store, &case.id, |step, _done| async move {
        match step {
            Step::Snapshot => Ok(outcome_of(step)),
            _ => Err(StepFailure::Transient("worker A's host went away".into())),
        }
    })
    .await;
    assert!(matches!(died, Err(JobError::Transient(_))), "{died:?}");

    // Worker B takes the job over and finishes it without a second snapshot.
    let taken = store
        .reclaim_stale(Lane::Decisions, "worker-b", Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(taken.len(), 1);
    assert_eq!(taken[0].id, claimed_by_a.id);
    assert_eq!(taken[0].deliveries, 2);
    let done: Vec<Step> = store
        .steps_done(&case.id)
        .await
        .unwrap()
        .iter()
        .map(|r| r.step)
        .collect();
    assert_eq!(done, vec![Step::Snapshot]);

    let calls = Arc::new(Calls::default());
    let finished = jobs::execute_decision(&store, &case.id, |step, _done| {
        let calls = calls.clone();
        async move {
            calls.push(step);
            Ok(outcome_of(step))
        }
    })
    .await
    .unwrap();
    assert_eq!(calls.all(), vec![Step::VerifySnapshot, Step::Kill]);
    let CaseState::Done { steps, .. } = &finished.state else {
        panic!("expected done, got {:?}", finished.state);
    };
    let kinds: Vec<Step> = steps.iter().map(|r| r.step).collect();
    assert_eq!(
        kinds,
        vec![Step::Snapshot, Step::VerifySnapshot, Step::Kill]
    );
    store.ack(&taken[0].id).await.unwrap();

    // A duplicate job for a finished case does nothing.
    let again = jobs::execute_decision(&store, &case.id, |step, _| async move {
        panic!("no step may run again, got {step:?}")
    })
    .await
    .unwrap();
    assert_eq!(again.state.name(), "done");
}

async fn a_second_worker_cannot_run_a_case_another_worker_is_running(store: Store) {
    let case = decided(&store, DecisionOption::Kill).await;
    let (started_tx, started_rx) = tokio::sync::oneshot::channel::<()>();
    let (release_tx, release_rx) = tokio::sync::oneshot::channel::<()>();
    let first = {
        let store = store.clone();
        let id = case.id.clone();
        let mut started = Some(started_tx);
        let release = Arc::new(tokio::sync::Mutex::new(Some(release_rx)));
        tokio::spawn(async move {
            jobs::execute_decision(&store, &id, move |step, _| {
                let started = started.take();
                let release = release.clone();
                async move {
                    if let Some(tx) = started {
                        let _ = tx.send(());
                    }
                    if let Some(rx) = release.lock().await.take() {
                        let _ = rx.await;
                    }
                    Ok(outcome_of(step))
                }
            })
            .await
        })
    };
    started_rx.await.unwrap();
    let second = jobs::execute_decision(&store, &case.id, |step, _| async move {
        panic!("the second worker must not run {step:?}")
    })
    .await;
    assert!(matches!(second, Err(JobError::Transient(_))), "{second:?}");
    release_tx.send(()).unwrap();
    let finished = first.await.unwrap().unwrap();
    assert_eq!(finished.state.name(), "done");
}

async fn a_permanent_step_failure_fails_the_case_and_a_retry_finishes_it(store: Store) {
    let case = decided(&store, DecisionOption::SnapshotThenKill).await;
    let failed = jobs::execute_decision(&store, &case.id, |step, _| async move {
        match step {
            Step::Snapshot => Ok(outcome_of(step)),
            _ => Err(StepFailure::Permanent("snapshot did not verify".into())),
        }
    })
    .await;
    assert_eq!(
        failed,
        Err(JobError::Permanent("snapshot did not verify".into()))
    );
    let stored = store.get_case(&case.id).await.unwrap();
    let CaseState::Failed { error, steps, .. } = &stored.state else {
        panic!("expected failed, got {:?}", stored.state);
    };
    assert_eq!(error, "snapshot did not verify");
    assert_eq!(steps.len(), 1);

    let retried = store
        .apply_event(&case.id, Event::Retry { by: user("U1") }, Utc::now())
        .await
        .unwrap();
    assert!(matches!(retried, Updated::Applied(_)));
    let calls = Arc::new(Calls::default());
    let done = jobs::execute_decision(&store, &case.id, |step, _| {
        let calls = calls.clone();
        async move {
            calls.push(step);
            Ok(outcome_of(step))
        }
    })
    .await
    .unwrap();
    assert_eq!(calls.all(), vec![Step::VerifySnapshot, Step::Kill]);
    assert_eq!(done.state.name(), "done");
}

async fn stale_evidence_sends_the_case_back_to_pending_and_forgets_its_steps(store: Store) {
    let case = decided(&store, DecisionOption::SnapshotThenKill).await;
    let new_deadline = Utc::now() + chrono::Duration::hours(2);
    let back = jobs::execute_decision(&store, &case.id, |_, _| async move {
        Err(StepFailure::EvidenceChanged {
            evidence: Box::new(Evidence {
                state: Some("running".into()),
                idle_since: None,
                ..Evidence::default()
            }),
            note: "it is active again".into(),
            decide_by: new_deadline,
        })
    })
    .await
    .unwrap();
    assert_eq!(back.state, CaseState::Pending);
    assert_eq!(back.notes.last().unwrap().text, "it is active again");
    assert!(store.steps_done(&case.id).await.unwrap().is_empty());
    assert_eq!(
        store
            .case_for_subject(&case.subject)
            .await
            .unwrap()
            .unwrap()
            .id,
        case.id,
        "the case still holds its subject"
    );
    let due_later = store.pending_due(new_deadline).await.unwrap();
    assert!(due_later.contains(&case.id), "back in the expiry index");
}

async fn due_cases_are_expired_exactly_once_by_concurrent_expirers(store: Store) {
    let opened = t(1_000);
    let mut due = Vec::new();
    for _ in 0..5 {
        let case = case_for(&new_sandbox(), Some(t(2_000)), opened);
        due.push(store.open_case(case).await.unwrap().case().clone());
    }
    let later = store
        .open_case(case_for(&new_sandbox(), Some(t(9_000)), opened))
        .await
        .unwrap()
        .case()
        .clone();
    // One due case is decided before the sweep: it must not expire.
    store
        .apply_event(&due[0].id, decide(DecisionOption::Kill, "U1"), t(1_500))
        .await
        .unwrap();

    let now = t(3_000);
    let listed = store.pending_due(now).await.unwrap();
    for case in &due[1..] {
        assert!(listed.contains(&case.id));
    }
    assert!(!listed.contains(&later.id));
    assert!(
        !listed.contains(&due[0].id),
        "decided cases leave the index"
    );

    let mut sweeps = Vec::new();
    for _ in 0..4 {
        let store = store.clone();
        sweeps.push(tokio::spawn(
            async move { store.expire_due(now).await.unwrap() },
        ));
    }
    let expired_count = AtomicUsize::new(0);
    let mut expired_ids = Vec::new();
    for sweep in sweeps {
        for case in sweep.await.unwrap() {
            expired_count.fetch_add(1, Ordering::SeqCst);
            expired_ids.push(case.id);
        }
    }
    assert_eq!(
        expired_count.load(Ordering::SeqCst),
        4,
        "each due case once"
    );
    expired_ids.sort();
    expired_ids.dedup();
    assert_eq!(expired_ids.len(), 4);
    assert!(store.pending_due(now).await.unwrap().is_empty());
    assert_eq!(
        store.get_case(&due[0].id).await.unwrap().state.name(),
        "decided"
    );
    assert_eq!(
        store.get_case(&later.id).await.unwrap().state,
        CaseState::Pending
    );
    // Nothing is ever done on an expired case.
    let late = store
        .apply_event(&due[1].id, decide(DecisionOption::Kill, "U1"), now)
        .await
        .unwrap();
    assert!(matches!(late, Updated::Rejected { .. }), "{late:?}");
}

async fn the_audit_log_answers_by_case_subject_and_time(store: Store) {
    let sandbox = new_sandbox();
    let case_a = open(&store, &sandbox).await.id;
    let template = Subject::Template(TemplateId::parse("tmpl-x").unwrap());
    let now = Utc::now();
    let event = |secs_ago: i64, case: Option<CaseId>, subject: Subject, action: &str| AuditEvent {
        time: now - chrono::Duration::seconds(secs_ago),
        case,
        subject: Some(subject),
        actor: Actor::Person { user: user("U1") },
        action: action.into(),
        outcome: "ok".into(),
    };
    let events = vec![
        event(30, Some(case_a.clone()), sandbox.clone(), "open"),
        event(20, Some(case_a.clone()), sandbox.clone(), "decide:kill"),
        event(10, None, template.clone(), "sweep"),
    ];
    for e in &events {
        store.append_audit(e).await.unwrap();
    }
    let mut step = event(5, Some(case_a.clone()), sandbox.clone(), "step:kill");
    step.actor = Actor::Steward {
        part: "worker".into(),
    };
    store.append_audit(&step).await.unwrap();

    let for_case = store.audit_for_case(&case_a).await.unwrap();
    assert_eq!(
        for_case
            .iter()
            .map(|e| e.action.as_str())
            .collect::<Vec<_>>(),
        vec!["open", "decide:kill", "step:kill"]
    );
    assert_eq!(
        store.audit_for_subject(&template).await.unwrap(),
        vec![events[2].clone()]
    );
    let since = store
        .audit_since(now - chrono::Duration::seconds(15))
        .await
        .unwrap();
    assert_eq!(since, vec![events[2].clone(), step]);
}

/// Applies `event` at `at`, expecting it to be accepted.
async fn apply(store: &Store, case: &CaseId, event: Event, at: DateTime<Utc>) -> Case {
    match store.apply_event(case, event, at).await.unwrap() {
        Updated::Applied(case) => case,
        other => panic!("{other:?}"),
    }
}

async fn decided_cases_are_indexed_until_their_work_ends_and_one_caller_postpones_each(
    store: Store,
) {
    let far = t(1_000_000);
    let unfinished = |cutoff: DateTime<Utc>| {
        let store = store.clone();
        async move {
            let cases = store.unfinished_decided(cutoff).await.unwrap();
            cases.into_iter().map(|u| u.case.id).collect::<Vec<_>>()
        }
    };
    let opened = |subject: Subject| {
        let store = store.clone();
        async move {
            let case = case_for(&subject, Some(t(500_000)), t(500));
            store.open_case(case).await.unwrap().case().clone()
        }
    };

    // Decided, then done.
    let done = opened(new_sandbox()).await;
    assert!(
        unfinished(far).await.is_empty(),
        "a pending case is not decided"
    );
    apply(
        &store,
        &done.id,
        decide(DecisionOption::Kill, "U1"),
        t(1_000),
    )
    .await;
    assert!(
        unfinished(t(999)).await.is_empty(),
        "indexed at its decision time"
    );
    assert_eq!(unfinished(t(1_000)).await, vec![done.id.clone()]);
    apply(&store, &done.id, Event::StartExecuting, t(5_000)).await;
    assert_eq!(
        unfinished(t(1_000)).await,
        vec![done.id.clone()],
        "executing keeps the time it was decided"
    );
    let step = Event::StepDone {
        step: Step::Kill,
        outcome: StepOutcome::Killed,
    };
    apply(&store, &done.id, step, t(5_001)).await;
    assert_eq!(unfinished(far).await, vec![done.id.clone()]);
    apply(&store, &done.id, Event::Finish, t(5_002)).await;
    assert!(
        unfinished(far).await.is_empty(),
        "done is gone from the index"
    );

    // Failed leaves the index; a retry comes back at the retry's time.
    let retried = opened(new_sandbox()).await;
    apply(
        &store,
        &retried.id,
        decide(DecisionOption::Kill, "U1"),
        t(2_000),
    )
    .await;
    let fail = Event::Fail {
        error: "E2B said no".into(),
    };
    apply(&store, &retried.id, fail, t(2_001)).await;
    assert!(
        unfinished(far).await.is_empty(),
        "failed is gone from the index"
    );
    apply(
        &store,
        &retried.id,
        Event::Retry { by: user("U1") },
        t(3_000),
    )
    .await;
    assert!(unfinished(t(2_999)).await.is_empty());
    assert_eq!(unfinished(t(3_000)).await, vec![retried.id.clone()]);

    // Of several replicas re-queueing the same entry at once, exactly one moves it.
    let movers: Vec<_> = (0..10)
        .map(|_| {
            let store = store.clone();
            let id = retried.id.clone();
            tokio::spawn(async move {
                store
                    .postpone_decided(&id, t(3_000), t(4_000))
                    .await
                    .unwrap()
            })
        })
        .collect();
    let mut moved = 0;
    for mover in movers {
        moved += usize::from(mover.await.unwrap());
    }
    assert_eq!(moved, 1);
    assert!(
        unfinished(t(3_999)).await.is_empty(),
        "postponed to its re-queue time"
    );
    assert_eq!(unfinished(t(4_000)).await, vec![retried.id.clone()]);
    let postponed = store.unfinished_decided(t(4_000)).await.unwrap();
    assert_eq!(postponed[0].since, t(4_000), "indexed at its re-queue time");

    // Stale evidence sends a decided case back to Pending: out of the index too.
    let asked_again = opened(new_sandbox()).await;
    apply(
        &store,
        &asked_again.id,
        decide(DecisionOption::Pause, "U1"),
        t(1_500),
    )
    .await;
    apply(&store, &asked_again.id, Event::StartExecuting, t(1_501)).await;
    assert_eq!(
        unfinished(far).await,
        vec![asked_again.id.clone(), retried.id.clone()],
        "oldest first"
    );
    let changed = Event::EvidenceChanged {
        evidence: Box::new(Evidence::default()),
        note: "it is active again".into(),
        decide_by: t(600_000),
    };
    apply(&store, &asked_again.id, changed, t(1_600)).await;
    assert_eq!(unfinished(far).await, vec![retried.id.clone()]);

    // Leave closes a case without any work: never indexed.
    let left = opened(new_sandbox()).await;
    apply(
        &store,
        &left.id,
        decide(DecisionOption::Leave, "U1"),
        t(1_700),
    )
    .await;
    assert_eq!(unfinished(far).await, vec![retried.id.clone()]);
}

async fn leases_are_exclusive_and_expire(store: Store) {
    let name = format!("scheduler-{}", uuid::Uuid::new_v4());
    let long = Duration::from_secs(60);
    assert!(!store.lease_held(&name).await.unwrap());
    assert!(store.acquire_lease(&name, "a", long).await.unwrap());
    assert!(store.lease_held(&name).await.unwrap());
    assert!(!store.acquire_lease(&name, "b", long).await.unwrap());
    assert!(!store.renew_lease(&name, "b", long).await.unwrap());
    assert!(!store.release_lease(&name, "b").await.unwrap());
    assert!(store.renew_lease(&name, "a", long).await.unwrap());
    assert!(store.release_lease(&name, "a").await.unwrap());
    assert!(!store.lease_held(&name).await.unwrap());
    assert!(
        store
            .acquire_lease(&name, "b", Duration::from_millis(50))
            .await
            .unwrap()
    );
    // Wait for the expiry itself, not a fixed time.
    let (held, lease) = (&store, &name);
    eventually("the 50 ms lease expires", move || async move {
        !held.lease_held(lease).await.unwrap()
    })
    .await;
    assert!(
        !store.renew_lease(&name, "b", long).await.unwrap(),
        "an expired lease cannot be renewed"
    );
    assert!(store.acquire_lease(&name, "c", long).await.unwrap());
}

async fn the_worker_loop_runs_jobs_until_shutdown(store: Store) {
    let case = decided(&store, DecisionOption::Kill).await;
    store
        .enqueue(&job_for(&case, DecisionOption::Kill))
        .await
        .unwrap();
    let handler = {
        let store = store.clone();
        move |claimed: sandbox_steward::store::ClaimedJob| {
            let store = store.clone();
            async move {
                jobs::execute_decision(
                    &store,
                    claimed.job.case_id().expect("a decision job"),
                    |step, _| async move { Ok(outcome_of(step)) },
                )
                .await
                .map(|_| ())
            }
        }
    };
    // One pass by hand first: the job runs and is acknowledged.
    let mut by_hand = jobs::WorkerConfig::new("worker-a");
    by_hand.block = Duration::ZERO;
    let draining = tokio_util::sync::CancellationToken::new();
    let outcome = jobs::work_once(&store, &by_hand, &handler, &draining)
        .await
        .unwrap();
    assert!(matches!(outcome, WorkOutcome::Finished(_)), "{outcome:?}");
    assert_eq!(store.get_case(&case.id).await.unwrap().state.name(), "done");
    assert_eq!(
        jobs::work_once(&store, &by_hand, &handler, &draining)
            .await
            .unwrap(),
        WorkOutcome::Idle
    );

    // Then the loop: it picks up a new job and stops when told.
    let second = decided(&store, DecisionOption::Kill).await;
    let stop = tokio_util::sync::CancellationToken::new();
    let mut config = jobs::WorkerConfig::new("worker-loop");
    config.block = Duration::from_millis(200);
    let worker = tokio::spawn(jobs::run_queue(
        store.clone(),
        config,
        handler,
        stop.clone(),
    ));
    store
        .enqueue(&job_for(&second, DecisionOption::Kill))
        .await
        .unwrap();
    let (cases, id) = (&store, &second.id);
    eventually("the worker loop finishes the job", move || async move {
        cases.get_case(id).await.unwrap().state.name() == "done"
    })
    .await;
    assert_eq!(
        store.get_case(&second.id).await.unwrap().state.name(),
        "done"
    );
    stop.cancel();
    worker.await.unwrap();
    let steps: Vec<StepRecord> = store.steps_done(&second.id).await.unwrap();
    assert_eq!(steps.len(), 1);
    assert_eq!(steps[0].outcome, StepOutcome::Killed);
}

/// `steward check` reads every Leave mark: one per subject (the latest), in every shard, and
/// nothing that is not a mark.
async fn every_leave_mark_is_listed_with_its_subject_whatever_its_shard(store: Store) {
    let mut expected = std::collections::HashMap::new();
    let mut shards = std::collections::HashSet::new();
    for n in 0..40_i64 {
        let subject = new_sandbox();
        shards.insert(sandbox_steward::store::keys::shard_of(&subject.key()));
        let case = open(&store, &subject).await;
        let until = (n % 3 != 0).then(|| Utc::now() + chrono::Duration::days(n + 1));
        let left = store
            .apply_event(
                &case.id,
                Event::Decide {
                    option: DecisionOption::Leave,
                    by: user("UAPPROVER"),
                    reason: Some("kept".into()),
                    until,
                },
                Utc::now(),
            )
            .await
            .unwrap();
        assert!(matches!(left, Updated::Applied(_)), "{left:?}");
        expected.insert(subject, (case.id, until));
    }
    // Open cases and closed ones that are not Leave leave no mark.
    open(&store, &new_sandbox()).await;
    let paused = open(&store, &new_sandbox()).await;
    store
        .apply_event(&paused.id, decide(DecisionOption::Pause, "U1"), Utc::now())
        .await
        .unwrap();
    assert!(shards.len() > 8, "the marks span many shards: {shards:?}");

    let listed = store.all_left_marks().await.unwrap();

    let got: std::collections::HashMap<_, _> = listed
        .into_iter()
        .map(|(subject, mark)| (subject, (mark.case, mark.until)))
        .collect();
    assert_eq!(got, expected);
}

async fn a_leave_decision_outlives_its_case_for_sweeps(store: Store) {
    let (left, open_one, untouched) = (new_sandbox(), new_sandbox(), new_sandbox());
    let case = open(&store, &left).await;
    let until = Utc::now() + chrono::Duration::days(7);
    let outcome = store
        .apply_event(
            &case.id,
            Event::Decide {
                option: DecisionOption::Leave,
                by: user("UAPPROVER"),
                reason: Some("still needed".into()),
                until: Some(until),
            },
            Utc::now(),
        )
        .await
        .unwrap();
    assert!(matches!(outcome, Updated::Applied(_)), "{outcome:?}");
    let still_open = open(&store, &open_one).await;
    let subjects = [left.clone(), open_one.clone(), untouched.clone()];
    let marks = store.left_marks(&subjects).await.unwrap();
    let mark = marks[0].as_ref().expect("the Leave decision is kept");
    assert_eq!(
        (mark.case.clone(), mark.until),
        (case.id.clone(), Some(until))
    );
    assert_eq!(marks[1..], [None, None]);
    let open_ids = store.open_case_ids(&subjects).await.unwrap();
    assert_eq!(open_ids, vec![None, Some(still_open.id), None]);
    // A later Leave decision on the same subject replaces the earlier one.
    let again = open(&store, &left).await;
    let outcome = store
        .apply_event(
            &again.id,
            Event::Decide {
                option: DecisionOption::Leave,
                by: user("UAPPROVER"),
                reason: None,
                until: None,
            },
            Utc::now(),
        )
        .await
        .unwrap();
    assert!(matches!(outcome, Updated::Applied(_)), "{outcome:?}");
    let marks = store.left_marks(&[left]).await.unwrap();
    let mark = marks[0].as_ref().expect("the later Leave decision is kept");
    assert_eq!((mark.case.clone(), mark.until), (again.id.clone(), None));
    assert!(store.left_marks(&[]).await.unwrap().is_empty());
}

async fn the_sweep_marker_never_moves_backwards(store: Store) {
    assert_eq!(store.last_completed_sweep().await.unwrap(), None);
    store
        .record_completed_sweep(t(2_000_000_000))
        .await
        .unwrap();
    store
        .record_completed_sweep(t(1_900_000_000))
        .await
        .unwrap();
    assert_eq!(
        store.last_completed_sweep().await.unwrap(),
        Some(t(2_000_000_000))
    );
    store
        .record_completed_sweep(t(2_000_086_400))
        .await
        .unwrap();
    assert_eq!(
        store.last_completed_sweep().await.unwrap(),
        Some(t(2_000_086_400))
    );
}

async fn history_reads_a_bounded_recent_slice_and_export_pages_through_everything(store: Store) {
    let busy = new_sandbox();
    let quiet = new_sandbox();
    let case = open(&store, &busy).await;
    let start = Utc::now() - chrono::Duration::minutes(30);
    let event = |n: i64, subject: &Subject| AuditEvent {
        time: start + chrono::Duration::milliseconds(n),
        case: Some(case.id.clone()),
        subject: Some(subject.clone()),
        actor: Actor::Steward {
            part: "test".into(),
        },
        action: format!("step:{n}"),
        outcome: "ok".into(),
    };
    const MANY: i64 = 1_300;
    for n in 0..MANY {
        store.append_audit(&event(n, &busy)).await.unwrap();
    }
    store.append_audit(&event(MANY, &quiet)).await.unwrap();

    // History: only the latest 60, in order, and a count that says there were more.
    let slice = store.recent_audit(&busy, None, 60).await.unwrap();
    let actions: Vec<String> = slice.events.iter().map(|e| e.action.clone()).collect();
    let expected: Vec<String> = (MANY - 60..MANY).map(|n| format!("step:{n}")).collect();
    assert_eq!(actions, expected);
    assert!(slice.total >= 1_000, "total {}", slice.total);
    let by_case = store.recent_case_audit(&case.id, 5).await.unwrap();
    assert_eq!(by_case.events.last().unwrap().action, "step:1299");
    assert_eq!(by_case.events.len(), 5);
    let other = store.recent_audit(&quiet, None, 60).await.unwrap();
    assert_eq!(other.events.len(), 1);
    assert_eq!(other.total, 1);

    // Export: every event, oldest first, written page by page.
    let mut out = Vec::new();
    let written = sandbox_steward::approvals::history::export(&store, start, &mut out)
        .await
        .unwrap();
    assert_eq!(written, MANY as usize + 1);
    let lines: Vec<AuditEvent> = String::from_utf8(out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), MANY as usize + 1);
    assert_eq!(lines[0].action, "step:0");
    assert_eq!(lines[MANY as usize].action, format!("step:{MANY}"));
}

/// A decision whose case write succeeded is never reported as failed: with a key of the wrong
/// type planted where the deadline index of the case's shard lives, the old code wrote the
/// decision, then failed to drop the index entry and told the clicker "could not record that"
/// without queueing the work. Now the case and its indexes are one script: the decision stands,
/// the work runs, and nobody is told otherwise.
#[tokio::test]
async fn a_decision_stands_and_runs_when_an_index_entry_cannot_be_removed() {
    use crate::common::{TestAppOptions, spawn_app_with, visible_text};
    use sandbox_steward::store::keys::{Keys, shard_of};
    use serde_json::json;

    let app = spawn_app_with(TestAppOptions {
        sandboxes: 0,
        policy: Some(
            r#"
[channels]
approvals = "C0APPROVALS"
[approvals.approvers]
kill = { users = ["U0002"] }
"#
            .into(),
        ),
        ..TestAppOptions::default()
    })
    .await;
    app.seed_sandbox(json!({"sandboxID": "victim8", "templateID": "base", "state": "running"}))
        .await;
    let opened = format!("h{}", uuid::Uuid::new_v4().simple());
    app.post_command_to("kill victim8 finished with it", &opened)
        .await;
    let text = visible_text(&app.wait_for_hook(&opened).await);
    let case_id = crate::common::case_id_in(&text);

    // Sabotage: the shard's deadline index becomes a string, so removing the case from it fails.
    let subject = Subject::Sandbox(SandboxId::parse("victim8").unwrap());
    let due = Keys::new(&app.redis_prefix)
        .unwrap()
        .due(shard_of(&subject.key()));
    let mut redis = redis::Client::open(app.redis_url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let _: () = redis::cmd("DEL").arg(&due).query(&mut redis).unwrap();
    let _: () = redis::cmd("SET")
        .arg(&due)
        .arg("not a sorted set")
        .query(&mut redis)
        .unwrap();

    let reply = format!("h{}", uuid::Uuid::new_v4().simple());
    let clicked = app
        .click_case(&case_id, "case_snapshot_then_kill", "U0002", &reply, &reply)
        .await;
    assert_eq!(clicked.status(), 200);

    // The decision stands and its work runs to the end (the old code never queued it).
    eventually("the decided case finishes", || async {
        is_done(&app, &case_id).await
    })
    .await;
    let told: Vec<String> = app
        .slack
        .hook_posts(&reply)
        .iter()
        .map(visible_text)
        .collect();
    assert!(
        told.iter()
            .all(|t| !t.contains("could not") && !t.contains("nothing was done")),
        "the clicker was told the decision failed: {told:?}"
    );
    let actions: Vec<String> = app
        .state
        .store
        .audit_for_case(&case_id)
        .await
        .unwrap()
        .into_iter()
        .map(|e| format!("{}: {}", e.action, e.outcome))
        .collect();
    assert!(
        actions.contains(&"decide:snapshot_then_kill: ok".to_owned()),
        "{actions:?}"
    );
}

/// A TCP proxy in front of the real Redis that, once armed, forwards the next request holding
/// `EVALSHA` and the marker, swallows Redis's answer to it and drops the connection: the write
/// happened, its answer was lost.
struct LosingProxy {
    url: String,
    armed: Arc<std::sync::Mutex<Option<String>>>,
    fired: Arc<std::sync::atomic::AtomicBool>,
}

impl LosingProxy {
    async fn start(upstream: String) -> Self {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("redis://{}", listener.local_addr().unwrap());
        let armed: Arc<std::sync::Mutex<Option<String>>> = Arc::default();
        let fired = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (armed_c, fired_c) = (armed.clone(), fired.clone());
        tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                let Ok(server) = tokio::net::TcpStream::connect(&upstream).await else {
                    return;
                };
                let (mut client_r, mut client_w) = client.into_split();
                let (mut server_r, mut server_w) = server.into_split();
                let muted = Arc::new(std::sync::atomic::AtomicBool::new(false));
                let (armed, fired, muted_up) = (armed_c.clone(), fired_c.clone(), muted.clone());
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    loop {
                        let n = match client_r.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        let chunk = String::from_utf8_lossy(&buf[..n]).into_owned();
                        let trigger = {
                            let mut armed = armed.lock().unwrap();
                            // The click's own script (its mark and the case read) names the
                            // case too; the one to lose is the case write after it.
                            let hit = armed.as_ref().is_some_and(|m| {
                                chunk.contains("EVALSHA")
                                    && chunk.contains(m)
                                    && !chunk.contains(":click:{")
                            });
                            if hit {
                                *armed = None;
                            }
                            hit
                        };
                        if trigger {
                            muted_up.store(true, Ordering::SeqCst);
                            fired.store(true, Ordering::SeqCst);
                        }
                        if server_w.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    let mut swallowed = String::new();
                    loop {
                        let n = match server_r.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        if muted.load(Ordering::SeqCst) {
                            // Swallow everything until the script's answer ({1, strays}) has
                            // come back, then hang up without passing it on.
                            swallowed.push_str(&String::from_utf8_lossy(&buf[..n]));
                            if swallowed.contains("*2\r\n:1\r\n") {
                                let _ = client_w.shutdown().await;
                                return;
                            }
                            continue;
                        }
                        if client_w.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        Self { url, armed, fired }
    }

    fn arm(&self, marker: &str) {
        *self.armed.lock().unwrap() = Some(marker.to_owned());
    }
}

/// The decision's write reached Redis but its answer was lost (the connection dropped after
/// the script ran). The old code told the clicker "Steward can't reach its database (Redis), so
/// nothing was done" and queued no work, though the decision was recorded. Now the store reads
/// the case back by its write token: the decision stands, the clicker is told nothing went
/// wrong, and the work runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_whose_answer_was_lost_is_read_back_and_runs() {
    use crate::common::{TestAppOptions, spawn_app_with, visible_text};
    use serde_json::json;

    let upstream = redis_url()
        .trim_start_matches("redis://")
        .trim_end_matches('/')
        .to_owned();
    let proxy = LosingProxy::start(upstream).await;
    let prefix = format!("steward-test-{}", uuid::Uuid::new_v4().simple());
    let _cleanup = PrefixCleanup {
        url: redis_url(),
        prefix: prefix.clone(),
    };
    let app = spawn_app_with(TestAppOptions {
        sandboxes: 0,
        redis_url: Some(proxy.url.clone()),
        redis_prefix: Some(prefix),
        policy: Some(
            r#"
[channels]
approvals = "C0APPROVALS"
[approvals.approvers]
kill = { users = ["U0002"] }
"#
            .into(),
        ),
        ..TestAppOptions::default()
    })
    .await;
    app.seed_sandbox(json!({"sandboxID": "victim9", "templateID": "base", "state": "running"}))
        .await;
    let opened = format!("h{}", uuid::Uuid::new_v4().simple());
    app.post_command_to("kill victim9 finished with it", &opened)
        .await;
    let text = visible_text(&app.wait_for_hook(&opened).await);
    let case_id = crate::common::case_id_in(&text);
    // The card is recorded by a case write too: arm only once it is there, so the next case
    // write is the decision.
    eventually("the card is recorded", || async {
        app.state
            .store
            .get_case(&case_id)
            .await
            .unwrap()
            .card
            .is_some()
    })
    .await;
    let card_ts = app
        .state
        .store
        .get_case(&case_id)
        .await
        .ok()
        .and_then(|c| c.card)
        .map(|c| c.ts)
        .unwrap_or_default();
    proxy.arm(case_id.as_str());

    let reply = format!("h{}", uuid::Uuid::new_v4().simple());
    let click = json!({
        "type": "block_actions",
        "user": {"id": "U0002"},
        "trigger_id": format!("trigger-{reply}"),
        "response_url": app.slack.response_url(&reply),
        "container": {"type": "message", "channel_id": "C0APPROVALS", "message_ts": card_ts},
        "channel": {"id": "C0APPROVALS"},
        "actions": [{"action_id": "case_snapshot_then_kill", "block_id": "b",
                     "value": case_id.as_str(), "action_ts": reply}],
    });
    assert_eq!(app.post_interaction(&click).await.status(), 200);

    eventually("the decided case finishes", || async {
        is_done(&app, &case_id).await
    })
    .await;
    assert!(
        proxy.fired.load(Ordering::SeqCst),
        "the decision's answer was never dropped"
    );
    let told: Vec<String> = app
        .slack
        .hook_posts(&reply)
        .iter()
        .map(visible_text)
        .collect();
    assert!(
        told.iter()
            .all(|t| !t.contains("nothing was done") && !t.contains("could not")),
        "the clicker was told the decision failed: {told:?}"
    );
}

/// The case-id -> subject pointer is refreshed with every case write and always outlives its
/// case: the old code set its TTL once when the case opened, so a case kept alive by later
/// writes could outlive its pointer and become unreadable ("not found").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_case_pointer_ttl_is_refreshed_with_the_case_and_outlives_it() {
    use sandbox_steward::store::keys::{CASE_RETENTION, Keys};

    let (store, cleanup) = redis_store().await;
    let subject = new_sandbox();
    let case = open(&store, &subject).await;
    let keys = Keys::new(&cleanup.prefix).unwrap();
    let pointer = keys.case_subject(&case.id);
    let case_key = keys.case(&subject, &case.id);
    let mut redis = redis::Client::open(redis_url().as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    // As if the case had been opened long ago: its pointer has little time left.
    let _: i64 = redis::cmd("PEXPIRE")
        .arg(&pointer)
        .arg(5_000)
        .query(&mut redis)
        .unwrap();

    store
        .set_card(
            &case.id,
            Card {
                channel: SlackChannelId::parse("C0APPROVALS").unwrap(),
                ts: "1.1".into(),
            },
        )
        .await
        .unwrap();

    let pttl = |key: &str, redis: &mut redis::Connection| -> i64 {
        redis::cmd("PTTL").arg(key).query(redis).unwrap()
    };
    let pointer_left = pttl(&pointer, &mut redis);
    let case_left = pttl(&case_key, &mut redis);
    assert!(
        pointer_left > CASE_RETENTION.as_millis() as i64,
        "the pointer has {pointer_left} ms left"
    );
    assert!(
        pointer_left > case_left,
        "the pointer ({pointer_left} ms) must outlive its case ({case_left} ms)"
    );
    assert_eq!(store.get_case(&case.id).await.unwrap().version, 2);
}

/// `/sandbox history` over HTTP answers from a bounded slice (the latest 60 of 1,300 events of
/// one sandbox, with the count of what is kept), and `steward audit export` writes all of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_shows_the_latest_slice_and_export_writes_every_event() {
    use crate::common::{TestAppOptions, spawn_app_with, visible_text};

    let app = spawn_app_with(TestAppOptions {
        sandboxes: 0,
        ..TestAppOptions::default()
    })
    .await;
    let subject = Subject::Sandbox(SandboxId::parse("busy1").unwrap());
    let start = Utc::now() - chrono::Duration::minutes(10);
    // An old entry no reader can decode, at the start of the whole log: a history that read the
    // whole log (as the old code did) fails on it; one that reads the sandbox's latest slice
    // never sees it.
    let mut redis = redis::Client::open(app.redis_url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let global = sandbox_steward::store::keys::Keys::new(&app.redis_prefix)
        .unwrap()
        .audit();
    let poison: String = redis::cmd("XADD")
        .arg(&global)
        .arg("*")
        .arg("event")
        .arg("not json")
        .query(&mut redis)
        .unwrap();
    const MANY: i64 = 1_300;
    for n in 0..MANY {
        app.state
            .store
            .append_audit(&AuditEvent {
                time: start + chrono::Duration::milliseconds(n),
                case: None,
                subject: Some(subject.clone()),
                actor: Actor::Steward {
                    part: "test".into(),
                },
                action: format!("probe{n:04}"),
                outcome: "ok".into(),
            })
            .await
            .unwrap();
    }

    let hook = format!("h{}", uuid::Uuid::new_v4().simple());
    app.post_command_to("history busy1", &hook).await;
    let text = visible_text(&app.wait_for_hook(&hook).await);
    assert!(text.contains("the latest 60 shown"), "{text}");
    assert!(text.contains("probe1299: `ok`"), "{text}");
    assert!(text.contains("probe1240: `ok`"), "{text}");
    assert!(!text.contains("probe1239: `ok`"), "{text}");

    // The export reads everything, so the poison goes first.
    let _: i64 = redis::cmd("XDEL")
        .arg(&global)
        .arg(&poison)
        .query(&mut redis)
        .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_steward"))
        .args(["audit", "export", "--since", "1h"])
        .env("REDIS_URL", &app.redis_url)
        .env("STEWARD_REDIS_PREFIX", &app.redis_prefix)
        .env("STEWARD_CONFIG", "/dev/null")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let actions: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<AuditEvent>(l).unwrap().action)
        .filter(|a| a.starts_with("probe"))
        .collect();
    let expected: Vec<String> = (0..MANY).map(|n| format!("probe{n:04}")).collect();
    assert_eq!(actions, expected);
}

/// Whether the case is done. A read that meets a dropped connection (the lost-answer proxy) is
/// not an answer: it counts as not done yet.
async fn is_done(app: &TestApp, case_id: &CaseId) -> bool {
    matches!(
        app.state.store.get_case(case_id).await.map(|c| c.state),
        Ok(CaseState::Done { .. })
    )
}
