//! Runs through the agent API, the MCP tools and `steward run`, against the E2B simulator
//! executing real commands (`--exec local`): results come back, bad input is refused with the
//! field named, and no refused request creates a sandbox.
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::api::{AGENT_TOKEN, READER_TOKEN, api_policy, expect_error};
use crate::common::{TestApp, TestAppOptions, spawn_app_with};
use crate::mcp::{call, http_client, stdio_client, text_of};

async fn spawn_exec_app() -> TestApp {
    spawn_app_with(TestAppOptions {
        policy: Some(api_policy()),
        exec_local: true,
        ..TestAppOptions::default()
    })
    .await
}

async fn post_run(app: &TestApp, token: &str, body: &Value) -> reqwest::Response {
    app.http
        .post(app.url("/api/v1/runs"))
        .bearer_auth(token)
        .json(body)
        .send()
        .await
        .unwrap()
}

async fn creates(app: &TestApp) -> u64 {
    app.e2b.hooks().calls_of("create").await.unwrap()
}

#[tokio::test]
async fn a_run_through_the_api_returns_its_results_and_its_output() {
    let app = spawn_exec_app().await;
    let resp = post_run(
        &app,
        AGENT_TOKEN,
        &json!({
            "template": "base",
            "command": "cat note.txt; echo to-stderr >&2; exit 3",
            "files": [{"path": "note.txt", "content": "aGVsbG8gZnJvbSBhIGZpbGUK"}],
        }),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    let queued: Value = resp.json().await.unwrap();
    assert_eq!(queued["status"], "queued");
    assert_eq!(queued["requester"], "agent");
    let id = queued["id"].as_str().unwrap().to_owned();

    let run: Value = app
        .http
        .get(app.url(&format!("/api/v1/runs/{id}?wait=40s")))
        .bearer_auth(AGENT_TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(run["status"], "finished", "{run}");
    assert_eq!(run["exit_code"], 3);

    let resp = app
        .http
        .get(app.url(&format!("/api/v1/runs/{id}/output?from=0")))
        .bearer_auth(AGENT_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-run-finished"], "true");
    let next: u64 = resp.headers()["x-next-offset"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let text = resp.text().await.unwrap();
    assert!(
        text.contains("hello from a file") && text.contains("to-stderr"),
        "{text}"
    );
    assert_eq!(next, text.len() as u64);
}

#[tokio::test]
async fn bad_run_requests_are_refused_with_the_field_named_and_no_sandbox_is_created() {
    let app = spawn_exec_app().await;
    for (body, status, field) in [
        (
            json!({"template": "base"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "command",
        ),
        (
            json!({"template": "base", "command": "ls", "colour": "red"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "colour",
        ),
        (
            json!({"template": "base", "command": "ls", "timeout": "100h"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "timeout",
        ),
        (
            json!({"template": "base", "command": "ls", "files": [{"path": "a", "content": 5}]}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "files[0].content",
        ),
        (
            json!({"template": "base", "command": "x".repeat(20_000)}),
            StatusCode::PAYLOAD_TOO_LARGE,
            "command",
        ),
    ] {
        let resp = post_run(&app, AGENT_TOKEN, &body).await;
        let code = if status == StatusCode::PAYLOAD_TOO_LARGE {
            "too_large"
        } else {
            "invalid"
        };
        let error = expect_error(resp, status, code).await;
        assert_eq!(error["field"], field, "{error}");
    }
    let malformed = app
        .http
        .post(app.url("/api/v1/runs"))
        .bearer_auth(AGENT_TOKEN)
        .header("content-type", "application/json")
        .body("{\"template\": \"base\", ")
        .send()
        .await
        .unwrap();
    let error = expect_error(malformed, StatusCode::UNPROCESSABLE_ENTITY, "invalid").await;
    assert!(
        error["message"].as_str().unwrap().contains("line 1"),
        "{error}"
    );
    let huge = app
        .http
        .post(app.url("/api/v1/runs"))
        .bearer_auth(AGENT_TOKEN)
        .header("content-type", "application/json")
        .body(vec![b' '; 17 * 1024 * 1024])
        .send()
        .await
        .unwrap();
    expect_error(huge, StatusCode::PAYLOAD_TOO_LARGE, "too_large").await;
    let reader = post_run(
        &app,
        READER_TOKEN,
        &json!({"template": "base", "command": "ls"}),
    )
    .await;
    let error = expect_error(reader, StatusCode::FORBIDDEN, "forbidden").await;
    assert!(error["message"].as_str().unwrap().contains("`run`"));
    let unknown = app
        .http
        .get(app.url("/api/v1/runs/run_nosuchrun"))
        .bearer_auth(AGENT_TOKEN)
        .send()
        .await
        .unwrap();
    expect_error(unknown, StatusCode::NOT_FOUND, "not_found").await;
    assert_eq!(
        creates(&app).await,
        0,
        "no refused request created a sandbox"
    );
}

#[tokio::test]
async fn with_redis_down_a_run_or_a_case_is_a_503_and_nothing_is_started() {
    let redis = crate::common::ThrowawayRedis::start();
    let app = spawn_app_with(TestAppOptions {
        policy: Some(api_policy()),
        redis_url: Some(redis.url()),
        ..TestAppOptions::default()
    })
    .await;
    drop(redis);
    let resp = post_run(
        &app,
        AGENT_TOKEN,
        &json!({"template": "base", "command": "ls"}),
    )
    .await;
    let error = expect_error(resp, StatusCode::SERVICE_UNAVAILABLE, "unavailable").await;
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("nothing was started"),
        "{error}"
    );
    let resp = app
        .http
        .post(app.url("/api/v1/cases"))
        .bearer_auth(AGENT_TOKEN)
        .json(&json!({"action": "kill_sandbox", "sandbox_id": "anybox", "reason": "done"}))
        .send()
        .await
        .unwrap();
    expect_error(resp, StatusCode::SERVICE_UNAVAILABLE, "unavailable").await;
    assert_eq!(creates(&app).await, 0);
    assert_eq!(app.e2b.hooks().calls_of("kill").await.unwrap_or(0), 0);
}

#[tokio::test]
async fn run_code_over_mcp_http_and_stdio_returns_the_exit_code_and_the_output() {
    let app = spawn_exec_app().await;
    for client in [
        http_client(&app, AGENT_TOKEN).await,
        stdio_client(&app, AGENT_TOKEN).await,
    ] {
        let result = call(
            &client,
            "run_code",
            json!({
                "template": "base",
                "command": "python3 -c 'print(6*7)' 2>/dev/null || echo 42; sh script.sh",
                "files": [{"path": "script.sh", "content": "echo from-script\nexit 2\n"}],
            }),
        )
        .await;
        assert_ne!(result.is_error, Some(true), "{}", text_of(&result));
        let body: Value = serde_json::from_str(&text_of(&result)).unwrap();
        assert_eq!(body["run"]["status"], "finished", "{body}");
        assert_eq!(body["run"]["exit_code"], 2);
        let output = body["output"].as_str().unwrap();
        assert!(
            output.contains("42") && output.contains("from-script"),
            "{output}"
        );
        let again = call(&client, "get_run", json!({"run_id": body["run"]["id"]})).await;
        let again: Value = serde_json::from_str(&text_of(&again)).unwrap();
        assert_eq!(again["run"]["exit_code"], 2);
        client.cancel().await.ok();
    }
}

#[tokio::test]
async fn an_agents_kill_request_is_decided_by_a_person_and_the_long_poll_returns_the_decision() {
    let app = crate::api::spawn_api_app().await;
    app.seed_sandbox(json!({"sandboxID": "agentkill1", "templateID": "base", "state": "running"}))
        .await;
    let ask =
        json!({"action": "kill_sandbox", "sandbox_id": "agentkill1", "reason": "my job is done"});
    let post = || async {
        app.http
            .post(app.url("/api/v1/cases"))
            .bearer_auth(AGENT_TOKEN)
            .json(&ask)
            .send()
            .await
            .unwrap()
    };
    let resp = post().await;
    assert_eq!(resp.status(), StatusCode::CREATED);
    let case: Value = resp.json().await.unwrap();
    assert_eq!(case["state"], "pending");
    assert_eq!(case["existing"], false);
    assert_eq!(case["opener"], json!({"kind": "agent", "name": "agent"}));
    let id = case["id"].as_str().unwrap().to_owned();
    let again = post().await;
    assert_eq!(again.status(), StatusCode::OK);
    assert_eq!(again.json::<Value>().await.unwrap()["id"], id.as_str());

    let waiting = {
        let http = app.http.clone();
        let url = app.url(&format!("/api/v1/cases/{id}?wait=30s"));
        tokio::spawn(async move {
            http.get(url)
                .bearer_auth(AGENT_TOKEN)
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        })
    };
    crate::api_cases::person_kills(&app, &id).await;
    let decided = waiting.await.unwrap();
    assert_eq!(decided["decision"]["option"], "kill", "{decided}");
    assert_eq!(decided["decision"]["by"], "U0002");

    // No token may ask for what it is not allowed, and a bad action names the field.
    let resp = app
        .http
        .post(app.url("/api/v1/cases"))
        .bearer_auth(READER_TOKEN)
        .json(&json!({"action": "delete_template", "template_id": "base"}))
        .send()
        .await
        .unwrap();
    expect_error(resp, StatusCode::FORBIDDEN, "forbidden").await;
    let resp = app
        .http
        .post(app.url("/api/v1/cases"))
        .bearer_auth(AGENT_TOKEN)
        .json(&json!({"action": "explode", "sandbox_id": "agentkill1"}))
        .send()
        .await
        .unwrap();
    let error = expect_error(resp, StatusCode::UNPROCESSABLE_ENTITY, "invalid").await;
    assert_eq!(error["field"], "action");
    let resp = app
        .http
        .post(app.url("/api/v1/cases"))
        .bearer_auth(AGENT_TOKEN)
        .json(&json!({"action": "kill_sandbox", "sandbox_id": "nosuchbox"}))
        .send()
        .await
        .unwrap();
    expect_error(resp, StatusCode::NOT_FOUND, "not_found").await;
}

#[tokio::test]
async fn steward_run_streams_the_output_and_exits_with_the_commands_code() {
    let app = spawn_exec_app().await;
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("job.sh");
    std::fs::write(&script, "echo first line\necho second line\nexit 4\n").unwrap();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_steward"))
        .args(["run", "--template", "base", "--file"])
        .arg(&script)
        .args(["--env", "GREETING=hi", "--", "echo $GREETING; sh job.sh"])
        .env("STEWARD_URL", &app.address)
        .env("STEWARD_API_TOKEN", AGENT_TOKEN)
        .env("RUST_LOG", "error")
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stdout, "hi\nfirst line\nsecond line\n", "{stderr}");
    assert_eq!(out.status.code(), Some(4), "{stderr}");
    assert!(stderr.contains("finished: exit 4"), "{stderr}");
    // The outcome line ends with the run case's state, or says that none was opened.
    assert!(
        stderr.contains("Run case case_") || stderr.contains("No run case"),
        "{stderr}"
    );
    assert!(!stderr.contains(AGENT_TOKEN));
}

#[tokio::test]
async fn steward_run_exits_124_when_steward_stops_the_command_at_its_timeout() {
    let app = spawn_exec_app().await;
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_steward"))
        .args(["run", "--template", "base", "--timeout", "1s", "--"])
        .arg("echo started; sleep 60")
        .env("STEWARD_URL", &app.address)
        .env("STEWARD_API_TOKEN", AGENT_TOKEN)
        .env("RUST_LOG", "error")
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(124), "{stderr}");
    assert!(stderr.contains("was stopped at its timeout"), "{stderr}");
}

#[tokio::test]
async fn steward_run_without_a_token_or_with_a_bad_one_says_so_and_starts_nothing() {
    let app = spawn_exec_app().await;
    let missing = tokio::process::Command::new(env!("CARGO_BIN_EXE_steward"))
        .args(["run", "--template", "base", "--", "ls"])
        .env("STEWARD_URL", &app.address)
        .env_remove("STEWARD_API_TOKEN")
        .output()
        .await
        .unwrap();
    assert_eq!(missing.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("STEWARD_API_TOKEN is not set"));
    let wrong = tokio::process::Command::new(env!("CARGO_BIN_EXE_steward"))
        .args(["run", "--template", "base", "--", "ls"])
        .env("STEWARD_URL", &app.address)
        .env("STEWARD_API_TOKEN", "stw_not_a_token")
        .output()
        .await
        .unwrap();
    assert_eq!(wrong.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&wrong.stderr);
    assert!(stderr.contains("not one Steward knows"), "{stderr}");
    assert!(!stderr.contains("stw_not_a_token"), "{stderr}");
    assert_eq!(creates(&app).await, 0);
}

/// A command that waits until `gate` exists (the test opens it), so a run holds its worker for
/// exactly as long as the test needs.
fn held_command(gate: &std::path::Path) -> String {
    format!(
        "while [ ! -e '{}' ]; do sleep 0.05; done; echo released",
        gate.display()
    )
}

async fn run_status(app: &TestApp, id: &str) -> Value {
    app.http
        .get(app.url(&format!("/api/v1/runs/{id}")))
        .bearer_auth(AGENT_TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// Issue 41: a run waiting for a worker says so (`queued`, its position) in the API and on
/// `steward run`.
#[tokio::test]
async fn a_run_waiting_for_a_worker_says_where_it_waits_in_the_api_and_on_steward_run() {
    let app = spawn_app_with(TestAppOptions {
        policy: Some(format!("{}\n[workers]\nruns = 1\n", api_policy())),
        exec_local: true,
        ..TestAppOptions::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let gate = dir.path().join("open");
    let held = json!({"template": "base", "command": held_command(&gate), "timeout": "60s"});
    let first: Value = post_run(&app, AGENT_TOKEN, &held)
        .await
        .json()
        .await
        .unwrap();
    let first = first["id"].as_str().unwrap().to_owned();
    crate::common::eventually("the first run holds the only runs worker", || async {
        run_status(&app, &first).await["status"] == "running"
    })
    .await;

    let second = post_run(&app, AGENT_TOKEN, &held).await;
    assert_eq!(second.status(), StatusCode::ACCEPTED);
    let second: Value = second.json().await.unwrap();
    assert_eq!(second["status"], "queued");
    assert_eq!(second["queue_position"], 1, "{second}");
    let third: Value = post_run(&app, AGENT_TOKEN, &held)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(third["queue_position"], 2, "{third}");
    let shown = run_status(&app, second["id"].as_str().unwrap()).await;
    assert_eq!(shown["queue_position"], 1, "{shown}");
    assert!(
        run_status(&app, &first)
            .await
            .get("queue_position")
            .is_none(),
        "a running run has no queue position"
    );

    // `steward run` behind both says how many runs are ahead of it, then runs to its end.
    let mut cli = tokio::process::Command::new(env!("CARGO_BIN_EXE_steward"))
        .args(["run", "--template", "base", "--", "echo mine"])
        .env("STEWARD_URL", &app.address)
        .env("STEWARD_API_TOKEN", AGENT_TOKEN)
        .env("RUST_LOG", "error")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stderr = tokio::io::BufReader::new(cli.stderr.take().unwrap());
    let mut said = String::new();
    let waiting = tokio::time::timeout(crate::common::PATIENCE, async {
        use tokio::io::AsyncBufReadExt;
        loop {
            let mut line = String::new();
            if stderr.read_line(&mut line).await.unwrap() == 0 {
                return false;
            }
            said.push_str(&line);
            if line.contains("waits for a worker: 2 runs ahead of it.") {
                return true;
            }
        }
    })
    .await;
    assert_eq!(waiting, Ok(true), "steward run said: {said}");

    std::fs::write(&gate, b"").unwrap();
    let out = cli.wait_with_output().await.unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "mine\n");
    assert_eq!(out.status.code(), Some(0));
}

/// Issue 41: runs and decisions have workers of their own, so a person's decision is carried
/// out while every runs worker is held by a long run (on a shared pool it waited for them).
#[tokio::test]
async fn a_decision_is_carried_out_while_every_runs_worker_is_busy() {
    let app = spawn_exec_app().await;
    let dir = tempfile::tempdir().unwrap();
    let gate = dir.path().join("open");
    let held = json!({"template": "base", "command": held_command(&gate), "timeout": "60s"});
    // One more than the default runs workers (4), and as many as the old shared pool had.
    let mut runs = Vec::new();
    for _ in 0..5 {
        let run: Value = post_run(&app, AGENT_TOKEN, &held)
            .await
            .json()
            .await
            .unwrap();
        runs.push(run["id"].as_str().unwrap().to_owned());
    }
    crate::common::eventually("four runs hold every runs worker", || async {
        let mut running = 0;
        for id in &runs {
            running += usize::from(run_status(&app, id).await["status"] == "running");
        }
        running == 4
    })
    .await;

    app.seed_sandbox(json!({"sandboxID": "busykill1", "templateID": "base", "state": "running"}))
        .await;
    let case: Value = app
        .http
        .post(app.url("/api/v1/cases"))
        .bearer_auth(AGENT_TOKEN)
        .json(&json!({"action": "kill_sandbox", "sandbox_id": "busykill1", "reason": "done"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    crate::api_cases::person_kills(&app, case["id"].as_str().unwrap()).await;
    app.wait_for_e2b_calls("kill", 1).await;
    for id in &runs {
        let status = run_status(&app, id).await;
        assert!(
            matches!(status["status"].as_str(), Some("running" | "queued")),
            "the runs still hold their workers while the kill is carried out: {status}"
        );
    }
    std::fs::write(&gate, b"").unwrap();
}

/// `calls` of one command in `INFO commandstats` (`cmdstat_getrange:calls=12,…`).
fn command_calls(redis_url: &str, command: &str) -> u64 {
    let mut conn = redis::Client::open(redis_url)
        .unwrap()
        .get_connection()
        .unwrap();
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut conn)
        .unwrap();
    let field = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|line| line.strip_prefix(&field))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

/// Two replicas on one Redis: an output long-poll on replica B is answered with the bytes a run
/// on replica A writes while it waits. B's fallback read is an hour away (`[runs]
/// wake_fallback`) and the long-poll asks to wait 50 s, longer than the test's patience, so
/// only the run's change, published by A through Redis, can answer it in time; without it, B
/// would read again only when its wait ran out. The long-poll has read the output once (and so
/// registered its watch) before the run is let go: the Redis of this test is its own, where only
/// that read runs `GETRANGE`.
#[tokio::test]
async fn an_output_long_poll_on_one_replica_is_woken_by_a_run_on_another() {
    let redis = crate::common::ThrowawayRedis::start();
    let policy = format!("{}\n[runs]\nwake_fallback = \"1h\"\n", api_policy());
    let a = spawn_app_with(TestAppOptions {
        policy: Some(policy.clone()),
        exec_local: true,
        redis_url: Some(redis.url()),
        ..TestAppOptions::default()
    })
    .await;
    let b = a
        .spawn_peer(TestAppOptions {
            policy: Some(policy),
            worker: false,
            ..TestAppOptions::default()
        })
        .await;
    let gate_dir = tempfile::tempdir().unwrap();
    let gate = gate_dir.path().join("go");
    let command = format!(
        "echo ready; while [ ! -e '{}' ]; do sleep 0.02; done; echo woken",
        gate.display()
    );
    let queued: Value = post_run(
        &a,
        AGENT_TOKEN,
        &json!({"template": "base", "command": command}),
    )
    .await
    .json()
    .await
    .unwrap();
    let id = queued["id"].as_str().unwrap().to_owned();
    let output = |from: u64| {
        b.http
            .get(b.url(&format!("/api/v1/runs/{id}/output?from={from}&wait=50s")))
            .bearer_auth(AGENT_TOKEN)
            .send()
    };

    // B follows the output up to "ready" (each wait, too, is answered by a change from A).
    let mut from = 0;
    let mut seen = String::new();
    while !seen.contains("ready\n") {
        let resp = output(from).await.unwrap();
        assert_eq!(resp.status(), 200);
        from = resp.headers()["x-next-offset"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        seen.push_str(&resp.text().await.unwrap());
    }

    let reads = command_calls(&redis.url(), "getrange");
    let waiting = tokio::spawn(output(from));
    crate::common::poll_until(
        crate::common::PATIENCE,
        "B's long-poll reading once",
        || {
            let url = redis.url();
            async move { (command_calls(&url, "getrange") > reads).then_some(()) }
        },
    )
    .await;
    std::fs::write(&gate, b"").unwrap();
    let resp = tokio::time::timeout(crate::common::PATIENCE, waiting)
        .await
        .expect("B's long-poll was not woken by A's bytes")
        .unwrap()
        .unwrap();
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    assert!(
        text.contains("woken"),
        "B's long-poll came back without A's bytes: {text:?}"
    );
    b.shutdown().await;
    a.shutdown().await;
}
