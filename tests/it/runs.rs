//! Governed runs through the `Runner` a replica builds: submit, the durable job, the output as
//! it streams, timeouts, takeovers and refusals. Every test talks to the E2B simulator and Redis
//! (a unique key prefix per test) over real sockets.
use std::time::Duration;

use sandbox_steward::ids::RunId;
use sandbox_steward::runs::{RunError, RunRequest, RunStatus, Runner};

use crate::common::{self, TestAppOptions, free_port, spawn_app_with};

fn request(command: &str) -> RunRequest {
    RunRequest {
        template: "base".into(),
        command: command.into(),
        files: Vec::new(),
        env: Default::default(),
        cwd: None,
        timeout: None,
        secret_env: None,
        setup: None,
    }
}

fn runner(app: &common::TestApp) -> Runner {
    app.state
        .runs
        .clone()
        .expect("E2B is configured, so the replica has a Runner")
}

#[tokio::test]
async fn a_submitted_run_is_stored_queued_and_read_back() {
    // No worker: the run stays where submit left it.
    let app = spawn_app_with(TestAppOptions {
        worker: false,
        ..TestAppOptions::default()
    })
    .await;
    let runs = runner(&app);
    let mut req = request("echo hello");
    req.files.push(sandbox_steward::runs::FileSpec {
        path: "data/in.txt".into(),
        content: b"12345".to_vec(),
    });
    req.env.insert("TOKEN".into(), "s3cret-value".into());
    let run = runs.submit("agent-a", req).await.unwrap();
    assert_eq!(run.status, RunStatus::Queued);
    assert_eq!(run.requester, "agent-a");
    assert_eq!(run.timeout_secs, 300, "the policy's default timeout");

    let read = runs.get(&run.id).await.unwrap();
    assert_eq!(read, run);
    assert_eq!(read.files, vec![("data/in.txt".to_owned(), 5)]);
    // The record never holds environment values.
    let shown = serde_json::to_string(&read).unwrap();
    assert!(!shown.contains("s3cret-value"), "{shown}");

    let waited = runs
        .wait(&run.id, Duration::from_millis(300))
        .await
        .unwrap();
    assert_eq!(waited.status, RunStatus::Queued);
    let out = runs.output(&run.id, 0).await.unwrap();
    assert!(out.bytes.is_empty() && !out.finished && !out.truncated);
    assert_eq!(out.next, 0);
}

#[tokio::test]
async fn an_unknown_run_is_not_found() {
    let app = spawn_app_with(TestAppOptions {
        worker: false,
        ..TestAppOptions::default()
    })
    .await;
    let id = RunId::parse("run_nope").unwrap();
    let err = runner(&app).get(&id).await.unwrap_err();
    assert!(matches!(err, RunError::NotFound(_)), "{err:?}");
    assert_eq!(err.to_string(), "There is no run run_nope.");
}

#[tokio::test]
async fn bad_input_is_refused_with_the_field_named_and_no_sandbox_created() {
    let app = spawn_app_with(TestAppOptions {
        policy: Some("[runs]\nmax_timeout = \"10m\"\nmax_files = 1\n".into()),
        ..TestAppOptions::default()
    })
    .await;
    let runs = runner(&app);
    let file = |path: &str| sandbox_steward::runs::FileSpec {
        path: path.into(),
        content: b"x".to_vec(),
    };
    let mut cases: Vec<(RunRequest, &str)> = Vec::new();
    cases.push((request("   "), "command"));
    let mut r = request("true");
    r.template = "no spaces allowed".into();
    cases.push((r, "template"));
    let mut r = request("true");
    r.timeout = Some("2h".into());
    cases.push((r, "timeout"));
    let mut r = request("true");
    r.files = vec![file("a"), file("b")];
    cases.push((r, "files"));
    let mut r = request("true");
    r.files = vec![file("../etc/passwd")];
    cases.push((r, "files[0].path"));
    let mut r = request("true");
    r.env.insert("1BAD".into(), "x".into());
    cases.push((r, "env.1BAD"));
    let mut r = request("true");
    r.cwd = Some("relative".into());
    cases.push((r, "cwd"));
    for (req, field) in cases {
        match runs.submit("agent-a", req).await {
            Err(RunError::Input(e)) => assert_eq!(e.field, field, "{e}"),
            other => panic!("{field}: expected a refusal, got {other:?}"),
        }
    }
    let err = runs.submit("  ", request("true")).await.unwrap_err();
    assert!(
        matches!(err, RunError::Input(ref e) if e.field == "requester"),
        "{err:?}"
    );
    assert_eq!(app.e2b.hooks().calls_of("create").await.unwrap(), 0);
}

#[tokio::test]
async fn with_redis_down_a_submit_is_refused_and_no_sandbox_is_created() {
    let redis = common::ThrowawayRedis::start();
    let url = redis.url();
    let app = spawn_app_with(TestAppOptions {
        redis_url: Some(url),
        worker: false,
        ..TestAppOptions::default()
    })
    .await;
    drop(redis);
    let err = runner(&app)
        .submit("agent-a", request("echo hi"))
        .await
        .unwrap_err();
    assert!(matches!(err, RunError::StoreUnavailable(_)), "{err:?}");
    assert!(err.to_string().contains("nothing was started"), "{err}");
    assert_eq!(app.e2b.hooks().calls_of("create").await.unwrap(), 0);
}

#[tokio::test]
async fn without_e2b_a_replica_has_no_runner() {
    let app = spawn_app_with(TestAppOptions {
        with_e2b: false,
        worker: false,
        ..TestAppOptions::default()
    })
    .await;
    assert!(app.state.runs.is_none());
}

/// A base URL where nothing listens (envd unreachable).
fn dead_url() -> String {
    let port = free_port();
    format!("http://127.0.0.1:{port}")
}

fn with_sandbox_url(url: String, opts: TestAppOptions) -> TestAppOptions {
    let mut env = opts.env;
    env.push(("E2B_SANDBOX_URL".into(), url));
    TestAppOptions { env, ..opts }
}

#[tokio::test]
async fn a_run_creates_a_labelled_sandbox_and_fails_with_a_sentence_when_envd_cannot_be_reached() {
    let app = spawn_app_with(with_sandbox_url(dead_url(), TestAppOptions::default())).await;
    let runs = runner(&app);
    let mut req = request("echo hi");
    req.timeout = Some("2m".into());
    req.files.push(sandbox_steward::runs::FileSpec {
        path: "in.txt".into(),
        content: b"data".to_vec(),
    });
    let run = runs.submit("agent-a", req).await.unwrap();
    let done = runs.wait(&run.id, common::PATIENCE).await.unwrap();
    assert_eq!(done.status, RunStatus::Failed, "{done:?}");
    let error = done.error.clone().unwrap_or_default();
    assert!(error.contains("uploading in.txt failed"), "{error}");
    assert!(
        !error.contains("{") && !error.contains("Transport"),
        "{error}"
    );
    assert_eq!(
        done.outcome,
        Some(sandbox_steward::cases::RunOutcome::Failed)
    );
    assert!(done.worker.is_some());

    // The sandbox was labelled for the run and lives the run's timeout plus the margin.
    let sandbox = done.sandbox_id.clone().expect("the sandbox was recorded");
    let e2b = app.state.e2b.clone().unwrap();
    let detail = e2b.get_sandbox(&sandbox).await.unwrap();
    let meta = &detail.listed.metadata;
    assert_eq!(
        meta.get("steward.run").map(String::as_str),
        Some(run.id.as_str())
    );
    assert_eq!(
        meta.get("steward.requester").map(String::as_str),
        Some("agent-a")
    );
    assert_eq!(meta.get("steward.purpose").map(String::as_str), Some("run"));
    let life = detail.listed.end_at - detail.listed.started_at;
    assert!(
        (life.num_seconds() - (120 + 600)).abs() <= 2,
        "E2B timeout = run timeout + sandbox_margin, got {life}"
    );
    assert_eq!(app.e2b.hooks().calls_of("create").await.unwrap(), 1);

    // The sandbox was handed over and the run's end audited on it.
    common::eventually("the run's hand-over", || async {
        runs.get(&run.id).await.unwrap().handed_over
    })
    .await;
    let subject = sandbox_steward::cases::Subject::Sandbox(sandbox);
    let audit = app.state.store.audit_for_subject(&subject).await.unwrap();
    assert!(
        audit
            .iter()
            .any(|e| e.action == "run" && e.outcome.contains(run.id.as_str())),
        "{audit:?}"
    );
}

#[tokio::test]
async fn e2b_answering_429_at_create_is_retried_by_the_queue() {
    let app = spawn_app_with(with_sandbox_url(
        dead_url(),
        TestAppOptions {
            stale_after: Duration::from_millis(300),
            ..TestAppOptions::default()
        },
    ))
    .await;
    // More 429s than the client's own retries: the job itself must come back.
    app.e2b_fault(serde_json::json!({"op": "create", "status": 429, "count": 3}))
        .await;
    let runs = runner(&app);
    let run = runs.submit("agent-a", request("true")).await.unwrap();
    let done = runs.wait(&run.id, common::PATIENCE).await.unwrap();
    assert!(done.status.is_terminal(), "{done:?}");
    assert!(done.sandbox_id.is_some(), "{done:?}");
    assert_eq!(app.e2b.hooks().calls_of("create").await.unwrap(), 4);
}

#[tokio::test]
async fn a_template_e2b_does_not_know_fails_the_run_with_e2bs_sentence_and_no_sandbox() {
    let app = spawn_app_with(with_sandbox_url(dead_url(), TestAppOptions::default())).await;
    let runs = runner(&app);
    let mut req = request("true");
    req.template = "no-such-template".into();
    let run = runs.submit("agent-a", req).await.unwrap();
    let done = runs.wait(&run.id, common::PATIENCE).await.unwrap();
    assert_eq!(done.status, RunStatus::Failed);
    assert!(done.sandbox_id.is_none());
    let error = done.error.unwrap_or_default();
    assert!(
        error.starts_with("E2B did not create the sandbox"),
        "{error}"
    );
    assert!(error.contains("no-such-template"), "{error}");
}

/// Runs jobs with `engine` until the returned task is aborted (a replica killed mid-job).
fn doomed_worker(
    store: sandbox_steward::store::Store,
    engine: sandbox_steward::runs::RunEngine,
) -> tokio::task::JoinHandle<()> {
    let mut config = sandbox_steward::jobs::WorkerConfig::for_lane(
        engine.worker().to_owned(),
        sandbox_steward::store::Lane::Runs,
    );
    config.block = Duration::from_millis(200);
    tokio::spawn(sandbox_steward::jobs::run_queue(
        store,
        config,
        move |claimed| {
            let engine = engine.clone();
            async move { engine.handle(claimed).await }
        },
        tokio_util::sync::CancellationToken::new(),
    ))
}

#[tokio::test]
async fn a_replica_killed_while_uploading_leaves_a_run_another_replica_fails_and_hands_over() {
    // envd holds every upload, so replica A is caught mid-run with its sandbox created.
    let envd = common::HoldingFront::start(&dead_url(), |_| true).await;
    let a = spawn_app_with(with_sandbox_url(
        envd.url.clone(),
        TestAppOptions {
            worker: false,
            ..TestAppOptions::default()
        },
    ))
    .await;
    let runs = runner(&a);
    let engine = sandbox_steward::runs::RunEngine::new(
        a.state.store.clone(),
        a.state.e2b.clone().unwrap(),
        std::sync::Arc::new(runs.policy().clone()),
        Some(envd.url.clone()),
        "replica-a-doomed",
        sandbox_steward::runs::HandOver::leave_to_timeout(),
    )
    .with_lease(Duration::from_secs(1));
    let doomed = doomed_worker(a.state.store.clone(), engine);
    let mut req = request("cat in.txt");
    req.files.push(sandbox_steward::runs::FileSpec {
        path: "in.txt".into(),
        content: b"data".to_vec(),
    });
    let run = runs.submit("agent-a", req).await.unwrap();
    common::eventually("replica A is uploading the run's files", || async {
        envd.arrived() > 0
    })
    .await;
    let stuck = runs.get(&run.id).await.unwrap();
    assert_eq!(stuck.status, RunStatus::UploadingFiles);
    assert_eq!(stuck.worker.as_deref(), Some("replica-a-doomed"));
    let sandbox = stuck
        .sandbox_id
        .clone()
        .expect("the sandbox was recorded at once");
    // Replica A dies: its task is gone mid-run, its lease runs out.
    doomed.abort();
    let _ = doomed.await;

    let b = a
        .spawn_peer(with_sandbox_url(
            envd.url.clone(),
            TestAppOptions {
                stale_after: Duration::from_millis(300),
                ..TestAppOptions::default()
            },
        ))
        .await;
    let runs_b = runner(&b);
    let done = runs_b.wait(&run.id, common::PATIENCE).await.unwrap();
    assert_eq!(done.status, RunStatus::Failed, "{done:?}");
    assert_eq!(
        done.error.as_deref(),
        Some(
            "replica replica-a-doomed stopped while the run was running; its output up to then is kept"
        )
    );
    assert_eq!(
        done.outcome,
        Some(sandbox_steward::cases::RunOutcome::Failed)
    );
    assert_eq!(done.sandbox_id.as_ref(), Some(&sandbox));
    common::eventually("the sandbox's hand-over", || async {
        runs_b.get(&run.id).await.unwrap().handed_over
    })
    .await;
    // The run's audit line is written after the hand-over is recorded.
    let subject = sandbox_steward::cases::Subject::Sandbox(sandbox);
    common::eventually("the run's end is audited", || async {
        b.state
            .store
            .audit_for_subject(&subject)
            .await
            .unwrap()
            .iter()
            .any(|e| e.action == "run" && e.outcome.contains("replica-a-doomed stopped"))
    })
    .await;
    // One sandbox for the run, never a second.
    assert_eq!(a.e2b.hooks().calls_of("create").await.unwrap(), 1);
}

#[tokio::test]
async fn a_replica_killed_before_its_sandbox_existed_leaves_a_run_that_is_just_failed() {
    let a = spawn_app_with(with_sandbox_url(
        dead_url(),
        TestAppOptions {
            worker: false,
            ..TestAppOptions::default()
        },
    ))
    .await;
    // Replica A's E2B calls to create a sandbox (v2, else v1) are held: it dies while asking.
    let e2b_front = common::HoldingFront::start(&a.e2b.base_url(), |path| {
        path == "/v2/sandboxes" || path == "/sandboxes"
    })
    .await;
    let e2b = sandbox_steward::e2b::E2bClient::new(&sandbox_steward::e2b::E2bSettings::for_url(
        &e2b_front.url,
        common::E2B_KEY,
    ))
    .unwrap();
    let runs = runner(&a);
    let engine = sandbox_steward::runs::RunEngine::new(
        a.state.store.clone(),
        e2b,
        std::sync::Arc::new(runs.policy().clone()),
        None,
        "replica-a-doomed",
        sandbox_steward::runs::HandOver::leave_to_timeout(),
    )
    .with_lease(Duration::from_secs(1));
    let doomed = doomed_worker(a.state.store.clone(), engine);
    let run = runs.submit("agent-a", request("true")).await.unwrap();
    common::eventually("replica A is asking E2B for the sandbox", || async {
        e2b_front.arrived() > 0
    })
    .await;
    assert_eq!(
        runs.get(&run.id).await.unwrap().status,
        RunStatus::CreatingSandbox
    );
    doomed.abort();
    let _ = doomed.await;

    let b = a
        .spawn_peer(with_sandbox_url(
            dead_url(),
            TestAppOptions {
                stale_after: Duration::from_millis(300),
                ..TestAppOptions::default()
            },
        ))
        .await;
    let done = runner(&b).wait(&run.id, common::PATIENCE).await.unwrap();
    assert_eq!(done.status, RunStatus::Failed, "{done:?}");
    assert_eq!(
        done.error.as_deref(),
        Some("replica replica-a-doomed stopped before the run's sandbox was created")
    );
    assert!(done.sandbox_id.is_none());
    assert_eq!(a.e2b.hooks().calls_of("create").await.unwrap(), 0);
}

// ----- end to end, with the simulator running commands (`--exec local`) -----

/// An app whose E2B simulator runs commands as local processes, with envd at the simulator's
/// data-plane URL.
async fn exec_app(opts: TestAppOptions) -> common::TestApp {
    common::spawn_app_with(TestAppOptions {
        exec_local: true,
        ..opts
    })
    .await
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Every byte of the run's kept output, read the way a client follows it.
async fn all_output(runs: &Runner, id: &RunId) -> (String, bool) {
    let mut from = 0;
    let mut out = Vec::new();
    loop {
        let chunk = runs.output(id, from).await.unwrap();
        out.extend_from_slice(&chunk.bytes);
        from = chunk.next;
        if chunk.finished {
            return (text(&out), chunk.truncated);
        }
        assert!(
            !chunk.bytes.is_empty(),
            "a read of a finished run's output made no progress"
        );
    }
}

#[tokio::test]
async fn a_passing_script_finishes_with_exit_0_its_output_and_a_profile() {
    let app = exec_app(TestAppOptions::default()).await;
    let runs = runner(&app);
    // Long enough for E2B's 5 s metrics grid to sample it: a shorter run has no profile.
    let mut req = request(
        "echo hello from the run; cat data/in.txt; echo to-stderr >&2; echo \"token=$TOKEN\"; sleep 6",
    );
    req.files.push(sandbox_steward::runs::FileSpec {
        path: "data/in.txt".into(),
        content: b"uploaded-content\n".to_vec(),
    });
    req.env.insert("TOKEN".into(), "abc123".into());
    let run = runs.submit("agent-a", req).await.unwrap();
    let done = runs.wait(&run.id, common::PATIENCE).await.unwrap();
    assert_eq!(done.status, RunStatus::Finished, "{done:?}");
    assert_eq!(done.exit_code, Some(0));
    assert_eq!(
        done.outcome,
        Some(sandbox_steward::cases::RunOutcome::Succeeded)
    );
    assert!(done.duration_ms.is_some() && done.started_at.is_some() && done.finished_at.is_some());
    assert!(done.error.is_none(), "{done:?}");
    assert!(!done.output_truncated);

    let (output, truncated) = all_output(&runs, &run.id).await;
    assert!(!truncated);
    for expected in [
        "hello from the run",
        "uploaded-content",
        "to-stderr",
        "token=abc123",
    ] {
        assert!(
            output.contains(expected),
            "{expected:?} missing from {output:?}"
        );
    }
    assert_eq!(done.output_bytes, output.len() as u64);
    // File contents and env values left Redis once they reached the sandbox.
    assert_eq!(app.state.store.run_files(&run.id).await.unwrap(), None);
    // The evidence follows the result, before the hand-over.
    common::eventually("the hand-over", || async {
        runs.get(&run.id).await.unwrap().handed_over
    })
    .await;
    let handed = runs.get(&run.id).await.unwrap();
    let profile = handed
        .profile
        .expect("a resource profile from the sandbox's metrics");
    assert!(profile.samples >= 1);
}

#[tokio::test]
async fn a_failing_script_ends_with_exit_1_and_its_stderr_lines() {
    let app = exec_app(TestAppOptions::default()).await;
    let runs = runner(&app);
    let run = runs
        .submit(
            "agent-a",
            request("echo step one; echo 'error: the widget broke' >&2; exit 1"),
        )
        .await
        .unwrap();
    let done = runs.wait(&run.id, common::PATIENCE).await.unwrap();
    assert_eq!(done.status, RunStatus::Finished, "{done:?}");
    assert_eq!(done.exit_code, Some(1));
    assert_eq!(
        done.outcome,
        Some(sandbox_steward::cases::RunOutcome::ExitedNonZero)
    );
    let (output, _) = all_output(&runs, &run.id).await;
    assert!(output.contains("error: the widget broke"), "{output}");
    assert!(output.contains("step one"), "{output}");
}

/// The pid a command printed as `pid=N`.
fn printed_pid(output: &str) -> Option<u32> {
    output
        .lines()
        .find_map(|l| l.strip_prefix("pid="))
        .and_then(|p| p.trim().parse().ok())
}

#[tokio::test]
async fn a_run_past_its_timeout_is_stopped_and_marked_timed_out() {
    let app = exec_app(TestAppOptions {
        policy: Some("[runs]\nkill_grace = \"1s\"\n".into()),
        ..TestAppOptions::default()
    })
    .await;
    let runs = runner(&app);
    let mut req = request("echo pid=$$; exec sleep 120");
    req.timeout = Some("2s".into());
    let run = runs.submit("agent-a", req).await.unwrap();
    let done = runs.wait(&run.id, common::PATIENCE).await.unwrap();
    assert_eq!(done.status, RunStatus::TimedOut, "{done:?}");
    assert_eq!(
        done.outcome,
        Some(sandbox_steward::cases::RunOutcome::TimedOut)
    );
    assert_eq!(done.exit_code, None);
    let (output, _) = all_output(&runs, &run.id).await;
    let pid = printed_pid(&output).expect("the command printed its pid");
    common::eventually("the timed-out process is gone", || async move {
        !std::path::Path::new(&format!("/proc/{pid}")).exists()
    })
    .await;
}

#[tokio::test]
async fn a_process_that_ignores_sigterm_is_killed_after_the_grace() {
    let app = exec_app(TestAppOptions {
        policy: Some("[runs]\nkill_grace = \"1s\"\n".into()),
        ..TestAppOptions::default()
    })
    .await;
    let runs = runner(&app);
    let mut req = request("trap '' TERM; echo pid=$$; while true; do sleep 1; done");
    req.timeout = Some("1s".into());
    let run = runs.submit("agent-a", req).await.unwrap();
    let done = runs.wait(&run.id, common::PATIENCE).await.unwrap();
    assert_eq!(done.status, RunStatus::TimedOut, "{done:?}");
    let (output, _) = all_output(&runs, &run.id).await;
    let pid = printed_pid(&output).expect("the command printed its pid");
    common::eventually("the process that ignored SIGTERM is gone", || async move {
        !std::path::Path::new(&format!("/proc/{pid}")).exists()
    })
    .await;
}

#[tokio::test]
async fn output_over_the_cap_is_truncated_and_counted() {
    let app = exec_app(TestAppOptions {
        policy: Some("[runs]\noutput_cap_bytes = 1000\n".into()),
        ..TestAppOptions::default()
    })
    .await;
    let runs = runner(&app);
    let run = runs
        .submit("agent-a", request("head -c 5000 /dev/zero | tr '\\0' 'a'"))
        .await
        .unwrap();
    let done = runs.wait(&run.id, common::PATIENCE).await.unwrap();
    assert_eq!(done.status, RunStatus::Finished, "{done:?}");
    assert_eq!(done.output_bytes, 5000);
    assert!(done.output_truncated);
    let (output, truncated) = all_output(&runs, &run.id).await;
    assert!(truncated);
    assert_eq!(output, "a".repeat(1000));
}

#[tokio::test]
async fn a_sandbox_killed_mid_run_fails_the_run_saying_it_is_gone() {
    let app = exec_app(TestAppOptions::default()).await;
    let runs = runner(&app);
    let run = runs
        .submit("agent-a", request("echo started; sleep 120"))
        .await
        .unwrap();
    let sandbox = common::wait_until("the run is running with output", || async {
        let run = runs.get(&run.id).await.ok()?;
        (run.status == RunStatus::Running && run.output_bytes > 0)
            .then_some(run.sandbox_id)
            .flatten()
    })
    .await;
    app.state
        .e2b
        .clone()
        .unwrap()
        .kill_sandbox(&sandbox)
        .await
        .unwrap();
    let done = runs.wait(&run.id, common::PATIENCE).await.unwrap();
    assert!(done.status.is_terminal(), "{done:?}");
    assert_eq!(done.status, RunStatus::Failed, "{done:?}");
    assert_eq!(
        done.outcome,
        Some(sandbox_steward::cases::RunOutcome::Failed)
    );
    let error = done.error.unwrap_or_default();
    assert!(
        error.starts_with("the sandbox is gone or paused"),
        "{error}"
    );
    // What it printed before is kept.
    let (output, _) = all_output(&runs, &run.id).await;
    assert!(output.contains("started"), "{output}");
}

#[tokio::test]
async fn a_replica_killed_mid_run_is_re_attached_by_another_which_collects_the_end() {
    // Replica A: no worker of its own; its engine runs by hand so the test can kill it.
    let a = exec_app(TestAppOptions {
        worker: false,
        ..TestAppOptions::default()
    })
    .await;
    let runs = runner(&a);
    let engine = sandbox_steward::runs::RunEngine::new(
        a.state.store.clone(),
        a.state.e2b.clone().unwrap(),
        std::sync::Arc::new(runs.policy().clone()),
        Some(a.e2b.envd_url()),
        "replica-a-doomed",
        sandbox_steward::runs::HandOver::leave_to_timeout(),
    )
    .with_lease(Duration::from_secs(1));
    let store = a.state.store.clone();
    let mut config = sandbox_steward::jobs::WorkerConfig::for_lane(
        "replica-a-doomed",
        sandbox_steward::store::Lane::Runs,
    );
    config.block = Duration::from_millis(200);
    let doomed = tokio::spawn(sandbox_steward::jobs::run_queue(
        store,
        config,
        move |claimed| {
            let engine = engine.clone();
            async move { engine.handle(claimed).await }
        },
        tokio_util::sync::CancellationToken::new(),
    ));
    // The command goes on until the test says so (a file it waits for), then ends with 3.
    let gate = tempfile::tempdir().unwrap();
    let go = gate.path().join("go");
    let command = format!(
        "echo started pid=$$; while [ ! -f {go} ]; do sleep 0.05; done; echo finished; exit 3",
        go = go.display()
    );
    let run = runs.submit("agent-a", request(&command)).await.unwrap();
    let sandbox = common::wait_until("replica A is running the command", || async {
        let run = runs.get(&run.id).await.ok()?;
        (run.status == RunStatus::Running && run.output_bytes > 0 && run.process.is_some())
            .then_some(run.sandbox_id)
            .flatten()
    })
    .await;
    // Replica A dies: its task is gone mid-run, its lease runs out, its job goes stale.
    doomed.abort();
    let _ = doomed.await;

    let b = a
        .spawn_peer(TestAppOptions {
            exec_local: true,
            stale_after: Duration::from_millis(300),
            ..TestAppOptions::default()
        })
        .await;
    common::wait_until("replica B re-attaches to the command", || async {
        let run = runner(&b).get(&run.id).await.ok()?;
        (run.reattached == 1).then_some(())
    })
    .await;
    std::fs::write(&go, "").unwrap();
    let done = runner(&b).wait(&run.id, common::PATIENCE).await.unwrap();
    // The command ran once, to its end: its exit code is the run's, nothing failed.
    assert_eq!(done.status, RunStatus::Finished, "{done:?}");
    assert_eq!(done.exit_code, Some(3), "{done:?}");
    assert_eq!(done.error, None, "{done:?}");
    assert_eq!(done.sandbox_id.as_ref(), Some(&sandbox));
    let (output, _) = all_output(&runner(&b), &run.id).await;
    assert_eq!(output.matches("started pid=").count(), 1, "{output}");
    assert!(output.contains("finished"), "{output}");
    common::eventually("the sandbox's hand-over", || async {
        runner(&b).get(&run.id).await.unwrap().handed_over
    })
    .await;
    assert_eq!(a.e2b.hooks().calls_of("create").await.unwrap(), 1);
}

#[tokio::test]
async fn a_finished_run_hands_its_sandbox_to_a_run_case_in_the_runs_channel() {
    let app = exec_app(TestAppOptions {
        policy: Some("[channels]\nruns = \"C0RUNS\"\n".into()),
        ..TestAppOptions::default()
    })
    .await;
    let runs = runner(&app);
    let run = runs
        .submit("agent-a", request("echo 'all tests passed'"))
        .await
        .unwrap();
    let case_id = common::wait_until("the run's case", || async {
        runs.get(&run.id).await.ok()?.case_id
    })
    .await;
    let done = runs.get(&run.id).await.unwrap();
    assert!(done.handed_over);
    let case = app.state.store.get_case(&case_id).await.unwrap();
    let sandbox = done.sandbox_id.clone().unwrap();
    assert_eq!(
        case.subject,
        sandbox_steward::cases::Subject::Sandbox(sandbox.clone())
    );
    let report = case.evidence.run.clone().expect("the run is on the case");
    assert_eq!(report.run_id, run.id);
    assert_eq!(report.exit_code, Some(0));
    assert!(
        report
            .output_tail
            .iter()
            .any(|l| l.contains("all tests passed")),
        "{report:?}"
    );
    let card = app
        .wait_for_message("the run card", |m| {
            m.channel.as_deref() == Some("C0RUNS")
                && common::visible_text(m).contains(run.id.as_str())
        })
        .await;
    assert_eq!(card.method, "chat.postMessage");
    // Steward never killed the sandbox on its own: a person decides.
    let detail = app.state.e2b.clone().unwrap().get_sandbox(&sandbox).await;
    assert!(detail.is_ok(), "{detail:?}");
}

#[tokio::test]
async fn a_replica_stopped_mid_run_leaves_the_command_running_and_another_replica_finishes_it() {
    // A short grace, so the run moves at once rather than 22 s into the stop.
    let policy =
        Some("[channels]\nruns = \"C0RUNS\"\n[workers]\nshutdown_grace = \"2s\"\n".to_owned());
    // The first replica only watches (and owns the key prefix); the second runs the job.
    let app = exec_app(TestAppOptions {
        policy: policy.clone(),
        worker: false,
        ..TestAppOptions::default()
    })
    .await;
    let replica = app
        .spawn_peer(TestAppOptions {
            policy: policy.clone(),
            ..TestAppOptions::default()
        })
        .await;
    let runs = runner(&app);
    let gate = tempfile::tempdir().unwrap();
    let go = gate.path().join("go");
    let mut req = request(&format!(
        "echo pid=$$; while [ ! -f {go} ]; do sleep 0.05; done; echo finished; exit 0",
        go = go.display()
    ));
    req.timeout = Some("1h".into());
    let run = runs.submit("agent-a", req).await.unwrap();
    common::wait_until("the run is running with output", || async {
        let run = runs.get(&run.id).await.ok()?;
        (run.status == RunStatus::Running && run.output_bytes > 0 && run.process.is_some())
            .then_some(())
    })
    .await;
    let output = runs.output(&run.id, 0).await.unwrap().bytes;
    let pid = printed_pid(&text(&output)).expect("the command printed its pid");

    // SIGTERM to the replica: it must not wait out the hour-long run, nor stop or fail it.
    tokio::time::timeout(common::PATIENCE, replica.shutdown())
        .await
        .expect("shutdown does not wait for a running command to end");
    let moved = runs.get(&run.id).await.unwrap();
    assert_eq!(moved.status, RunStatus::Running, "{moved:?}");
    assert!(
        std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "the command is still running"
    );

    // Another replica takes the run over, re-attaches and sees it to its end.
    let next = app
        .spawn_peer(TestAppOptions {
            policy,
            ..TestAppOptions::default()
        })
        .await;
    common::wait_until("the next replica re-attaches", || async {
        let run = runner(&next).get(&run.id).await.ok()?;
        (run.reattached == 1).then_some(())
    })
    .await;
    std::fs::write(&go, "").unwrap();
    let done = runs.wait(&run.id, common::PATIENCE).await.unwrap();
    assert_eq!(done.status, RunStatus::Finished, "{done:?}");
    assert_eq!(done.exit_code, Some(0), "{done:?}");
    assert_eq!(done.error, None, "{done:?}");
    let (output, _) = all_output(&runs, &run.id).await;
    assert_eq!(output.matches("pid=").count(), 1, "started once: {output}");
    assert!(output.contains("finished"), "{output}");
    common::eventually("the sandbox's hand-over", || async {
        runs.get(&run.id).await.unwrap().handed_over
    })
    .await;
}

/// Issue 41: a run that failed before its command started asks nobody about its sandbox, which
/// holds nothing of the run: the sandbox is killed by rule, through a case and the worker, and
/// the card in the runs channel says why.
#[tokio::test]
async fn a_run_that_failed_before_its_command_started_has_its_sandbox_killed_by_rule() {
    let policy = "[channels]\napprovals = \"C0APPROVALS\"\nruns = \"C0RUNS\"\n\
                  [approvals.approvers]\nkill = { users = [\"U0002\"] }\n";
    let app = spawn_app_with(with_sandbox_url(
        dead_url(),
        TestAppOptions {
            policy: Some(policy.to_owned()),
            ..TestAppOptions::default()
        },
    ))
    .await;
    let runs = runner(&app);
    let mut req = request("echo hi");
    req.files.push(sandbox_steward::runs::FileSpec {
        path: "in.txt".into(),
        content: b"data".to_vec(),
    });
    let run = runs.submit("agent-a", req).await.unwrap();
    let done = runs.wait(&run.id, common::PATIENCE).await.unwrap();
    assert_eq!(done.status, RunStatus::Failed, "{done:?}");
    let sandbox = done.sandbox_id.clone().expect("the sandbox was recorded");

    let case_id = common::wait_until("the run's case", || async {
        runs.get(&run.id).await.unwrap().case_id
    })
    .await;
    common::eventually("the sandbox is killed", || async {
        app.e2b.hooks().calls_of("kill").await.unwrap_or(0) == 1
    })
    .await;
    let e2b = app.state.e2b.clone().unwrap();
    assert!(
        e2b.get_sandbox(&sandbox).await.is_err(),
        "the sandbox is gone"
    );
    let case = app.state.store.get_case(&case_id).await.unwrap();
    assert_eq!(
        case.state.decision().unwrap().by,
        sandbox_steward::cases::Decider::Policy {
            policy: sandbox_steward::approvals::run_case::UNSTARTED_RULE.into()
        }
    );
    app.wait_for_message("the run card says why nobody was asked", |m| {
        m.channel.as_deref() == Some("C0RUNS")
            && common::visible_text(m).contains("failed before its command started")
    })
    .await;
}
