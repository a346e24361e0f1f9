//! `GET /metrics` counts exactly what happened. The metrics recorder is process-wide, so in the
//! `it` binary, where tests run side by side, a test could only check that a series grew by at
//! least its own traffic, and another test's traffic could pass it. This binary holds one test
//! and nothing else runs in its process: every delta below is exact, so a series that stops
//! being counted, or is counted twice, fails it.
//!
//! It drives Slack requests (answered, forged), E2B calls (a 429 then an answer), a case opened,
//! decided and carried out, a second click refused, then, on a replica without a worker, a job
//! left waiting in the queue, a reconcile pass that queues it again, and a case expiring; then
//! envd calls inside a simulated sandbox; last, a replica whose Redis is down. Run alone with `cargo test --test metrics_exact`.
#[path = "it/common/mod.rs"]
mod common;

use std::time::Duration;

use chrono::Utc;
use common::scrape::{Sample, assert_declared_and_bounded, scrape, total};
use common::{
    APPROVALS, E2B_KEY, TestApp, TestAppOptions, approvals_policy, case_id_in, eventually,
    free_port, hook, spawn_app_with, unix_now, visible_text,
};
use sandbox_steward::approvals::worker::{expire_once, reconcile_once};
use sandbox_steward::cases::CaseState;
use sandbox_steward::envd::ProcessSpec;
use sandbox_steward::sim::e2b::{ExecMode, SimOptions, SimServer};
use sandbox_steward::sim::slack::Fault;
use serde_json::json;

fn options(worker: bool) -> TestAppOptions {
    TestAppOptions {
        sandboxes: 0,
        worker,
        policy: Some(approvals_policy()),
        ..TestAppOptions::default()
    }
}

/// How much each series moved between two scrapes.
struct Moved<'a> {
    before: &'a [Sample],
    after: &'a [Sample],
    text: &'a str,
}

impl Moved<'_> {
    fn by(&self, name: &str, with: &[(&str, &str)]) -> f64 {
        total(self.after, name, with) - total(self.before, name, with)
    }

    /// `name{with}` moved by exactly `expected`.
    fn assert(&self, name: &str, with: &[(&str, &str)], expected: f64) {
        let moved = self.by(name, with);
        assert_eq!(
            moved, expected,
            "{name}{with:?} moved by {moved}, expected {expected}; the scrape:\n{}",
            self.text
        );
    }
}

fn value(samples: &[Sample], name: &str) -> f64 {
    let mut found = samples.iter().filter(|s| s.name == name);
    let sample = found.next().unwrap_or_else(|| panic!("{name} is missing"));
    assert!(found.next().is_none(), "{name} is one series");
    sample.value
}

/// Opens a kill case on `sandbox` with `/sandbox kill`: its id.
async fn open_kill_case(app: &TestApp, sandbox: &str) -> sandbox_steward::ids::CaseId {
    let name = hook();
    app.post_command_to(&format!("kill {sandbox} done with it"), &name)
        .await;
    let reply = visible_text(&app.wait_for_hook(&name).await);
    assert!(reply.contains("Opened case"), "{reply}");
    case_id_in(&reply)
}

#[tokio::test]
async fn every_series_counts_exactly_what_the_traffic_did() {
    let app = spawn_app_with(options(true)).await;
    app.seed_sandbox(
        json!({"sandboxID": "metricsvictim1", "templateID": "base", "state": "running"}),
    )
    .await;
    let (_, before) = scrape(&app).await;

    // A signed command answered inline, and a forged one.
    assert_eq!(app.post_command("help").await.status(), 200);
    let forged = app
        .http
        .post(app.url("/slack/commands"))
        .header("content-type", "application/x-www-form-urlencoded")
        .header("x-slack-request-timestamp", unix_now().to_string())
        .header("x-slack-signature", "v0=00000000")
        .body("text=help")
        .send()
        .await
        .unwrap();
    assert_eq!(forged.status(), 401);

    // An E2B listing that E2B first refuses with a 429 (no wait asked), then answers; the
    // answer reaches Slack through the response_url.
    app.e2b_fault(json!({"op": "list", "status": 429, "count": 1, "retry_after_secs": 0}))
        .await;
    let listed = app.run_deferred("list").await;
    assert!(!visible_text(&listed).is_empty());

    // A case: opened by a command, its card posted (Slack rate-limits the first post once),
    // then decided by a click and carried out by the worker.
    app.slack.add_fault(Fault {
        method: "chat.postMessage".into(),
        status: 429,
        retry_after_secs: Some(0),
        count: 1,
        error: None,
    });
    let case = open_kill_case(&app, "metricsvictim1").await;
    let clicked = app
        .click_case(&case, "case_pause", "U0002", &hook(), &hook())
        .await;
    assert_eq!(clicked.status(), 200);
    eventually("the pause is carried out", || async {
        matches!(
            app.state.store.get_case(&case).await.unwrap().state,
            CaseState::Done { .. }
        )
    })
    .await;
    // A second click on the decided card is refused ("Already decided"), which its reply says.
    let refused_reply = hook();
    let again = app
        .click_case(&case, "case_pause", "U0002", &refused_reply, &hook())
        .await;
    assert_eq!(again.status(), 200);
    let refusal = visible_text(&app.wait_for_hook(&refused_reply).await);
    assert!(refusal.contains("Already"), "{refusal}");
    // The worker counts its job once the case is done: wait for that, then read the rest.
    let finished = [("kind", "decision"), ("outcome", "finished")];
    let (text, after) = common::wait_until("the job is counted", || async {
        let (text, after) = scrape(&app).await;
        let counted = total(&after, "steward_jobs_total", &finished)
            > total(&before, "steward_jobs_total", &finished);
        counted.then_some((text, after))
    })
    .await;
    let moved = Moved {
        before: &before,
        after: &after,
        text: &text,
    };
    let requests = "steward_slack_requests_total";
    // help, list, kill.
    moved.assert(requests, &[("route", "commands"), ("outcome", "2xx")], 3.0);
    moved.assert(
        requests,
        &[("route", "commands"), ("outcome", "signature_refused")],
        1.0,
    );
    moved.assert(requests, &[("route", "commands")], 4.0);
    moved.assert(
        requests,
        &[("route", "interactions"), ("outcome", "2xx")],
        2.0,
    );
    moved.assert(requests, &[("route", "interactions")], 2.0);
    moved.assert(requests, &[("route", "events")], 0.0);
    moved.assert(
        "steward_slack_request_duration_seconds_count",
        &[("route", "commands")],
        4.0,
    );
    moved.assert(
        "steward_slack_request_duration_seconds_bucket",
        &[("route", "commands"), ("le", "+Inf")],
        4.0,
    );
    let e2b = "steward_e2b_requests_total";
    moved.assert(e2b, &[("action", "list"), ("status", "429")], 1.0);
    moved.assert(e2b, &[("action", "list"), ("status", "200")], 1.0);
    moved.assert(e2b, &[("action", "pause")], 1.0);
    moved.assert(
        "steward_e2b_retries_total",
        &[("action", "list"), ("reason", "rate_limited")],
        1.0,
    );
    moved.assert("steward_e2b_retries_total", &[], 1.0);
    moved.assert(
        "steward_e2b_rate_limit_wait_seconds_count",
        &[("action", "list")],
        1.0,
    );
    moved.assert(
        "steward_e2b_request_duration_seconds_count",
        &[("action", "pause")],
        1.0,
    );
    let slack_api = "steward_slack_api_calls_total";
    moved.assert(
        slack_api,
        &[("method", "chat.postMessage"), ("outcome", "rate_limited")],
        1.0,
    );
    moved.assert(
        "steward_slack_api_rate_limited_total",
        &[("method", "chat.postMessage")],
        1.0,
    );
    moved.assert(
        slack_api,
        &[("method", "chat.postMessage"), ("outcome", "ok")],
        1.0,
    );
    // The list's answer, the case's "Opened case", and the refused click's "Already decided".
    moved.assert(
        slack_api,
        &[("method", "response_url"), ("outcome", "ok")],
        3.0,
    );
    let decisions = "steward_decisions_total";
    moved.assert(
        decisions,
        &[("option", "pause"), ("outcome", "recorded")],
        1.0,
    );
    moved.assert(
        decisions,
        &[("option", "pause"), ("outcome", "refused")],
        1.0,
    );
    moved.assert(decisions, &[], 2.0);
    moved.assert("steward_jobs_total", &finished, 1.0);
    moved.assert("steward_jobs_total", &[], 1.0);
    moved.assert(
        "steward_job_step_duration_seconds_count",
        &[("step", "pause"), ("outcome", "done")],
        1.0,
    );
    moved.assert("steward_cases_expired_total", &[], 0.0);
    moved.assert("steward_decisions_requeued_total", &[], 0.0);
    moved.assert("steward_redis_errors_total", &[], 0.0);
    assert_eq!(value(&after, "steward_redis_up"), 1.0);
    assert_eq!(
        total(&after, "steward_queue_depth", &[("lane", "decisions")]),
        0.0,
        "the job was taken"
    );
    assert_eq!(
        total(&after, "steward_queue_depth", &[("lane", "runs")]),
        0.0,
        "each lane is its own series"
    );
    assert!(text.contains("# TYPE steward_slack_request_duration_seconds histogram"));
    assert!(text.contains("# HELP steward_e2b_requests_total"));
    assert_declared_and_bounded(&after);
    for id in [
        "metricsvictim1",
        "U0001",
        "U0002",
        case.as_str(),
        APPROVALS,
        E2B_KEY,
    ] {
        assert!(!text.contains(id), "the scrape names {id}");
    }

    // A replica without a worker: a decision's job waits in the queue.
    let idle = spawn_app_with(options(false)).await;
    for n in 2..=3 {
        idle.seed_sandbox(json!({"sandboxID": format!("metricsvictim{n}"), "templateID": "base", "state": "running"}))
            .await;
    }
    let waiting = open_kill_case(&idle, "metricsvictim2").await;
    let clicked = idle
        .click_case(&waiting, "case_pause", "U0002", &hook(), &hook())
        .await;
    assert_eq!(clicked.status(), 200);
    // The click is answered first; its job is queued right after.
    let queued = common::wait_until("the job waits in the queue", || async {
        let (_, queued) = scrape(&idle).await;
        (total(&queued, "steward_queue_depth", &[("lane", "decisions")]) > 0.0).then_some(queued)
    })
    .await;
    assert_eq!(
        total(&queued, "steward_queue_depth", &[("lane", "decisions")]),
        1.0
    );
    assert!(
        total(
            &queued,
            "steward_queue_oldest_job_age_seconds",
            &[("lane", "decisions")]
        ) > 0.0
    );
    // Its decision's job "lost": a reconcile pass run as if the grace period had passed queues
    // it again (the worker would run it once: the case's steps are not repeated).
    let services = idle.state.services();
    let requeued = reconcile_once(&services, Utc::now() + chrono::Duration::minutes(3))
        .await
        .unwrap();
    assert_eq!(requeued, vec![waiting.clone()]);
    // A case nobody decides: an expiry pass past its deadline closes it, and only it.
    let undecided = open_kill_case(&idle, "metricsvictim3").await;
    let expired = expire_once(&services, Utc::now() + chrono::Duration::days(30))
        .await
        .unwrap();
    assert_eq!(
        expired.iter().map(|c| c.id.clone()).collect::<Vec<_>>(),
        vec![undecided]
    );
    let (text, later) = scrape(&idle).await;
    let moved = Moved {
        before: &after,
        after: &later,
        text: &text,
    };
    moved.assert("steward_decisions_requeued_total", &[], 1.0);
    moved.assert("steward_cases_expired_total", &[], 1.0);
    moved.assert(
        decisions,
        &[("option", "pause"), ("outcome", "recorded")],
        1.0,
    );
    moved.assert("steward_jobs_total", &[], 0.0);
    assert_eq!(
        total(&later, "steward_queue_depth", &[("lane", "decisions")]),
        2.0,
        "queued again"
    );

    // envd, the agent inside a sandbox (what governed runs and push tests talk to): each call
    // counted once by call and status, a missing file as the 404 it was.
    let sim = SimServer::start(SimOptions {
        sandboxes: 0,
        exec: ExecMode::Local,
        ..SimOptions::default()
    })
    .await
    .expect("the simulator starts");
    let (id, token) = common::seed_envd_sandbox(&sim, json!({})).await;
    let envd = common::envd_client(&sim, &id, token.as_deref());
    envd.upload("/home/user/x.txt", b"hi".to_vec())
        .await
        .unwrap();
    assert_eq!(envd.download("/home/user/x.txt").await.unwrap(), b"hi");
    assert!(envd.download("/home/user/missing.txt").await.is_err());
    let events = envd
        .start(&ProcessSpec::shell("cat /home/user/x.txt"))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    assert!(!events.is_empty());
    let (text, envd_after) = scrape(&idle).await;
    let moved = Moved {
        before: &later,
        after: &envd_after,
        text: &text,
    };
    let envd_requests = "steward_envd_requests_total";
    moved.assert(envd_requests, &[("call", "upload"), ("status", "200")], 1.0);
    moved.assert(
        envd_requests,
        &[("call", "download"), ("status", "200")],
        1.0,
    );
    moved.assert(
        envd_requests,
        &[("call", "download"), ("status", "404")],
        1.0,
    );
    moved.assert(
        envd_requests,
        &[("call", "process_start"), ("status", "200")],
        1.0,
    );
    moved.assert(envd_requests, &[], 4.0);
    moved.assert("steward_envd_request_duration_seconds_count", &[], 4.0);
    assert_declared_and_bounded(&envd_after);

    // A replica whose Redis is down still answers the scrape, says so, and counts the errors.
    let down = spawn_app_with(TestAppOptions {
        redis_url: Some(format!("redis://127.0.0.1:{}", free_port())),
        worker: false,
        expire_every: Duration::from_secs(3600),
        ..TestAppOptions::default()
    })
    .await;
    let (_, first) = scrape(&down).await;
    let (text, second) = scrape(&down).await;
    assert_eq!(value(&second, "steward_redis_up"), 0.0, "{text}");
    let errors = total(
        &second,
        "steward_redis_errors_total",
        &[("kind", "unavailable")],
    ) - total(
        &first,
        "steward_redis_errors_total",
        &[("kind", "unavailable")],
    );
    assert!(
        errors >= 1.0,
        "the second scrape's failed queue read is counted (refused at once, or timed out while \
         the store reconnects on a loaded machine): {errors}"
    );
    let (_, healthy) = scrape(&app).await;
    assert_eq!(value(&healthy, "steward_redis_up"), 1.0);
    down.shutdown().await;
    idle.shutdown().await;
    app.shutdown().await;
}
