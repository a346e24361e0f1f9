//! The simulator's envd over real sockets, driven by Steward's own `EnvdClient` (our conformance
//! check: the client must decode exactly what the simulator sends), plus raw requests where the
//! wire itself is the point. Commands run as local processes (`--exec local`).
use std::collections::BTreeMap;

use sandbox_steward::envd::connect::{Decoder, Frame, encode};
use sandbox_steward::envd::{EnvdClient, EnvdError, ProcessEnd, ProcessEvent, ProcessSpec, Signal};
use sandbox_steward::ids::SandboxId;
use sandbox_steward::sim::e2b::{ExecMode, SimOptions, SimServer};
use serde_json::{Value, json};

use crate::common::{envd_client as client, eventually, seed_envd_sandbox as sandbox};

async fn sim(exec: ExecMode) -> SimServer {
    SimServer::start(SimOptions {
        sandboxes: 0,
        exec,
        ..SimOptions::default()
    })
    .await
    .expect("the simulator starts")
}

fn output(events: &[ProcessEvent], stderr: bool) -> String {
    let bytes: Vec<u8> = events
        .iter()
        .filter_map(|e| match (e, stderr) {
            (ProcessEvent::Stdout(b), false) | (ProcessEvent::Stderr(b), true) => Some(b.clone()),
            _ => None,
        })
        .flatten()
        .collect();
    String::from_utf8(bytes).unwrap()
}

fn end_of(events: &[ProcessEvent]) -> ProcessEnd {
    match events.last() {
        Some(ProcessEvent::End(end)) => end.clone(),
        other => panic!("the last event is not an end: {other:?} in {events:?}"),
    }
}

fn proc_alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

async fn start_and_get_pid(
    envd: &EnvdClient,
    spec: &ProcessSpec,
) -> (sandbox_steward::envd::ProcessStream, u32) {
    let mut stream = envd.start(spec).await.expect("started");
    match stream.next_event().await.expect("an event") {
        Some(ProcessEvent::Start { pid }) => (stream, pid),
        other => panic!("the first event is not a start: {other:?}"),
    }
}

#[tokio::test]
async fn a_command_streams_its_start_output_and_exit_code_in_order() {
    let sim = sim(ExecMode::Local).await;
    let (id, _) = sandbox(&sim, json!({})).await;
    let envd = client(&sim, &id, None);

    let events = envd
        .start(&ProcessSpec::shell("echo out; echo err >&2; exit 3"))
        .await
        .expect("started")
        .collect()
        .await
        .expect("the stream ends cleanly");
    assert!(
        matches!(events.first(), Some(ProcessEvent::Start { pid }) if *pid > 0),
        "{events:?}"
    );
    assert_eq!(output(&events, false), "out\n");
    assert_eq!(output(&events, true), "err\n");
    assert_eq!(
        end_of(&events),
        ProcessEnd {
            exit_code: 3,
            exited: true,
            status: "exit status 3".into(),
            // envd's end carries Go's `Wait` error for any exit but 0.
            error: Some("exit status 3".into())
        }
    );

    let ok = envd
        .start(&ProcessSpec::shell("true"))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    assert_eq!(end_of(&ok).exit_code, 0);
    assert_eq!(end_of(&ok).status, "exit status 0");
    assert_eq!(end_of(&ok).error, None);

    // On the wire, exit code 0 is left out as proto3 JSON leaves out zero values.
    let message = json!({"process": {"cmd": "/bin/true", "args": [], "envs": {}}, "stdin": false});
    let raw = reqwest::Client::new()
        .post(format!("{}/process.Process/Start", sim.envd_url()))
        .header("E2b-Sandbox-Id", id.as_str())
        .header("E2b-Sandbox-Port", "49983")
        .header("Content-Type", "application/connect+json")
        .body(encode(0, message.to_string().as_bytes()))
        .send()
        .await
        .unwrap();
    assert_eq!(raw.status(), 200);
    assert_eq!(raw.headers()["content-type"], "application/connect+json");
    let text = String::from_utf8_lossy(&raw.bytes().await.unwrap()).into_owned();
    assert!(
        text.contains(r#"{"event":{"end":{"exited":true,"status":"exit status 0"}}}"#),
        "{text}"
    );
    assert!(!text.contains("exitCode"), "{text}");
    assert!(
        text.ends_with("{}"),
        "the end-of-stream frame is last: {text}"
    );
}

#[tokio::test]
async fn an_uploaded_script_runs_in_its_cwd_with_its_env_and_nothing_of_the_host() {
    let sim = sim(ExecMode::Local).await;
    let (id, _) = sandbox(&sim, json!({})).await;
    let envd = client(&sim, &id, None);
    let script = b"echo \"$GREETING from $(pwd)\"\nenv\n".to_vec();

    let entries = envd
        .upload("work/run.sh", script.clone())
        .await
        .expect("uploaded");
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].path, "/home/user/work/run.sh");
    assert_eq!(entries[0].name, "run.sh");
    assert_eq!(entries[0].kind, "file");
    assert_eq!(
        envd.download("/home/user/work/run.sh").await.unwrap(),
        script
    );

    let spec = ProcessSpec {
        cmd: "/bin/bash".into(),
        args: vec!["run.sh".into()],
        envs: BTreeMap::from([("GREETING".to_owned(), "hi".to_owned())]),
        cwd: Some("/home/user/work".into()),
    };
    let events = envd.start(&spec).await.unwrap().collect().await.unwrap();
    let out = output(&events, false);
    assert_eq!(end_of(&events).exit_code, 0, "{out}");
    let first = out.lines().next().unwrap();
    assert!(
        first.starts_with("hi from /") && first.ends_with("/home/user/work"),
        "{out}"
    );
    let env: Vec<&str> = out.lines().skip(1).collect();
    assert!(env.contains(&"PATH=/usr/local/bin:/usr/bin:/bin"), "{out}");
    assert!(env.contains(&"USER=user"), "{out}");
    assert!(
        env.iter()
            .any(|l| l.starts_with("HOME=/") && l.ends_with("/home/user")),
        "{out}"
    );
    assert!(
        !env.iter().any(|l| l.starts_with("REDIS_URL=")),
        "the host's env leaked: {out}"
    );
    if let Ok(home) = std::env::var("HOME") {
        assert!(!env.contains(&format!("HOME={home}").as_str()), "{out}");
    }

    // A command may name the uploaded file by its sandbox path.
    let cat = envd
        .start(&ProcessSpec::shell("cat /home/user/work/run.sh"))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    assert_eq!(output(&cat, false).as_bytes(), script.as_slice());
}

#[tokio::test]
async fn a_stream_sends_keepalives_at_the_interval_the_client_asks_for() {
    let sim = sim(ExecMode::Local).await;
    let (id, _) = sandbox(&sim, json!({})).await;
    let message = json!({"process": {"cmd": "/bin/sleep", "args": ["3"]}, "stdin": false});
    let mut raw = reqwest::Client::new()
        .post(format!("{}/process.Process/Start", sim.envd_url()))
        .header("E2b-Sandbox-Id", id.as_str())
        .header("E2b-Sandbox-Port", "49983")
        .header("Content-Type", "application/connect+json")
        .header("Keepalive-Ping-Interval", "1")
        .body(encode(0, message.to_string().as_bytes()))
        .send()
        .await
        .unwrap();
    let mut decoder = Decoder::default();
    let mut messages = Vec::new();
    let mut ended = false;
    while let Some(chunk) = raw.chunk().await.unwrap() {
        decoder.push(&chunk);
        while let Some(frame) = decoder.next_frame().unwrap() {
            match frame {
                Frame::Message(body) => messages.push(String::from_utf8_lossy(&body).into_owned()),
                Frame::End { error } => {
                    assert_eq!(error, None);
                    ended = true;
                }
            }
        }
    }
    assert!(ended, "{messages:?}");
    assert!(
        messages.first().unwrap().contains("\"start\""),
        "{messages:?}"
    );
    assert!(messages.last().unwrap().contains("\"end\""), "{messages:?}");
    assert!(
        messages.contains(&r#"{"event":{"keepalive":{}}}"#.to_owned()),
        "{messages:?}"
    );
}

#[tokio::test]
async fn traffic_resumes_a_paused_sandbox_that_asked_for_auto_resume() {
    let sim = sim(ExecMode::Off).await;
    sandbox(&sim, json!({})).await; // creates the template
    let http = reqwest::Client::new();
    let created: Value = http
        .post(format!("{}/sandboxes", sim.base_url()))
        .json(&json!({"templateID": "base", "timeout": 600, "autoPause": true, "autoResume": {"enabled": true}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = SandboxId::parse(created["sandboxID"].as_str().unwrap()).unwrap();
    let paused = http
        .post(format!("{}/sandboxes/{id}/pause", sim.base_url()))
        .send()
        .await
        .unwrap();
    assert_eq!(paused.status(), 204);

    client(&sim, &id, None)
        .upload("a.txt", b"x".to_vec())
        .await
        .expect("traffic resumes it");
    let detail: Value = http
        .get(format!("{}/sandboxes/{id}", sim.base_url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(detail["state"], "running");
}

#[tokio::test]
async fn files_refuse_climbing_paths_and_missing_files_are_404() {
    // Files work without execution.
    let sim = sim(ExecMode::Off).await;
    let (id, _) = sandbox(&sim, json!({})).await;
    let envd = client(&sim, &id, None);

    match envd.upload("../../etc/evil", b"x".to_vec()).await {
        Err(EnvdError::Status {
            status: 400,
            message,
            ..
        }) => {
            assert!(message.contains(".."), "{message}")
        }
        other => panic!("expected a 400, got {other:?}"),
    }
    match envd.download("missing.txt").await {
        Err(EnvdError::Status {
            status: 404,
            message,
            ..
        }) => {
            assert!(
                message.contains("/home/user/missing.txt") && message.contains("does not exist"),
                "{message}"
            )
        }
        other => panic!("expected a 404, got {other:?}"),
    }
    envd.upload("notes/a.txt", b"hello".to_vec()).await.unwrap();
    assert_eq!(envd.download("notes/a.txt").await.unwrap(), b"hello");
    match envd.download("notes").await {
        Err(EnvdError::Status {
            status: 400,
            message,
            ..
        }) => {
            assert!(message.contains("is a directory"), "{message}")
        }
        other => panic!("expected a 400, got {other:?}"),
    }
}

#[tokio::test]
async fn with_execution_off_start_says_how_to_turn_it_on() {
    let sim = sim(ExecMode::Off).await;
    let (id, _) = sandbox(&sim, json!({})).await;
    let envd = client(&sim, &id, None);
    let mut stream = envd
        .start(&ProcessSpec::shell("echo hi"))
        .await
        .expect("200");
    match stream.next_event().await {
        Err(EnvdError::Rpc { code, message, .. }) => {
            assert_eq!(code, "failed_precondition");
            assert!(
                message.contains("execution is off") && message.contains("--exec local"),
                "{message}"
            );
        }
        other => panic!("expected failed_precondition, got {other:?}"),
    }
}

#[tokio::test]
async fn sigterm_stops_a_long_sleep_and_an_unknown_pid_is_not_found() {
    let sim = sim(ExecMode::Local).await;
    let (id, _) = sandbox(&sim, json!({})).await;
    let envd = client(&sim, &id, None);
    let (stream, pid) = start_and_get_pid(&envd, &ProcessSpec::shell("sleep 600")).await;

    envd.send_signal(pid, Signal::Term)
        .await
        .expect("signalled");
    let rest = stream.collect().await.expect("the stream ends cleanly");
    let end = end_of(&rest);
    assert!(!end.exited, "{end:?}");
    assert!(end.status.starts_with("signal:"), "{end:?}");
    assert_ne!(end.exit_code, 0, "{end:?}");

    match envd.send_signal(pid, Signal::Kill).await {
        Err(EnvdError::Rpc { code, .. }) => assert_eq!(code, "not_found"),
        other => panic!("expected not_found, got {other:?}"),
    }
    let logs: Value = reqwest::get(format!(
        "{}/v2/sandboxes/{id}/logs?direction=forward",
        sim.base_url()
    ))
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    let messages: Vec<&str> = logs["logs"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|l| l["message"].as_str())
        .collect();
    assert!(
        messages.contains(&format!("process {pid} started: sleep 600").as_str()),
        "{messages:?}"
    );
    assert!(
        messages.contains(&format!("process {pid} ended: signal: terminated").as_str()),
        "{messages:?}"
    );
}

#[tokio::test]
async fn unknown_killed_and_paused_sandboxes_are_502_and_other_ports_are_closed() {
    let sim = sim(ExecMode::Local).await;
    let http = reqwest::Client::new();
    let unknown = SandboxId::parse("inosuchsandbox000000").unwrap();
    match client(&sim, &unknown, None)
        .start(&ProcessSpec::shell("true"))
        .await
    {
        Err(e @ EnvdError::SandboxUnavailable { .. }) => {
            assert!(e.to_string().contains("gone or paused"), "{e}")
        }
        other => panic!("expected the proxy's 502, got {other:?}"),
    }
    let raw = http
        .get(format!("{}/health", sim.envd_url()))
        .header("E2b-Sandbox-Id", unknown.as_str())
        .header("E2b-Sandbox-Port", "49983")
        .send()
        .await
        .unwrap();
    assert_eq!(raw.status(), 502);
    let body: Value = raw.json().await.unwrap();
    assert_eq!(
        body,
        json!({"sandboxId": "inosuchsandbox000000", "message": "The sandbox was not found", "code": 502})
    );

    let (paused, _) = sandbox(&sim, json!({})).await;
    let envd = client(&sim, &paused, None);
    let (_stream, pid) = start_and_get_pid(&envd, &ProcessSpec::shell("sleep 600")).await;
    let health = http
        .get(format!("{}/health", sim.envd_url()))
        .header("E2b-Sandbox-Id", paused.as_str())
        .header("E2b-Sandbox-Port", "49983")
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 204);
    let closed = http
        .get(format!("{}/health", sim.envd_url()))
        .header("E2b-Sandbox-Id", paused.as_str())
        .header("E2b-Sandbox-Port", "8080")
        .send()
        .await
        .unwrap();
    assert_eq!(closed.status(), 502);
    assert!(closed.text().await.unwrap().contains("port is not open"));

    sim.hooks()
        .change(paused.as_str(), json!({"state": "paused"}))
        .await
        .unwrap();
    match envd.upload("a.txt", b"x".to_vec()).await {
        Err(EnvdError::SandboxUnavailable { .. }) => {}
        other => panic!("expected the proxy's 502, got {other:?}"),
    }
    eventually("pausing the sandbox kills its process", || async {
        !proc_alive(pid)
    })
    .await;

    let (killed, _) = sandbox(&sim, json!({})).await;
    let resp = http
        .delete(format!("{}/sandboxes/{killed}", sim.base_url()))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 204);
    match client(&sim, &killed, None).download("a.txt").await {
        Err(EnvdError::SandboxUnavailable { .. }) => {}
        other => panic!("expected the proxy's 502, got {other:?}"),
    }
}

#[tokio::test]
async fn a_secure_sandbox_refuses_a_missing_or_wrong_access_token() {
    let sim = sim(ExecMode::Off).await;
    let (id, token) = sandbox(&sim, json!({"secure": true})).await;
    let token = token.expect("a secure sandbox has a token");

    let wrong = "wrong-token-do-not-show";
    match client(&sim, &id, Some(wrong))
        .upload("a.txt", b"x".to_vec())
        .await
    {
        Err(e @ EnvdError::AccessDenied { status: 401, .. }) => {
            assert!(!e.to_string().contains(wrong), "{e}")
        }
        other => panic!("expected a 401, got {other:?}"),
    }
    let missing = reqwest::Client::new()
        .get(format!("{}/files?path=a.txt", sim.envd_url()))
        .header("E2b-Sandbox-Id", id.as_str())
        .header("E2b-Sandbox-Port", "49983")
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 401);
    let body: Value = missing.json().await.unwrap();
    assert_eq!(body["code"], 401);
    assert!(
        body["message"].as_str().unwrap().contains("access token"),
        "{body}"
    );

    let envd = client(&sim, &id, Some(&token));
    envd.upload("a.txt", b"x".to_vec())
        .await
        .expect("the right token works");
    assert_eq!(envd.download("a.txt").await.unwrap(), b"x");
}

#[tokio::test]
async fn a_cpu_burning_process_shows_in_metrics_and_dies_with_its_sandbox() {
    let sim = sim(ExecMode::Local).await;
    // Idle sandboxes stay under 1 % CPU in the generated series (and show gigabytes of disk), so
    // more CPU than that, and the size of the scratch directory, are measured.
    let (id, _) = sandbox(&sim, json!({"profile": "idle", "cpuCount": 1})).await;
    let envd = client(&sim, &id, None);
    let pwd = envd
        .start(&ProcessSpec::shell("pwd"))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let scratch_home = output(&pwd, false).trim().to_owned();
    envd.upload("data.bin", vec![7u8; 10_000]).await.unwrap();
    assert!(scratch_home.ends_with("/home/user"), "{scratch_home}");
    assert!(std::path::Path::new(&scratch_home).is_dir());
    let (stream, pid) = start_and_get_pid(&envd, &ProcessSpec::shell("while :; do :; done")).await;

    let http = reqwest::Client::new();
    let base = sim.base_url();
    eventually(
        "the sandbox's metrics show the burning process, its memory and its files",
        || async {
            let points: Value = http
                .get(format!("{base}/sandboxes/{id}/metrics"))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            let batch: Value = http
                .get(format!("{base}/sandboxes/metrics?sandbox_ids={id}"))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            let last = points
                .as_array()
                .and_then(|p| p.last())
                .cloned()
                .unwrap_or_default();
            last["cpuUsedPct"].as_f64().unwrap_or(0.0) > 5.0
                && last["memUsed"].as_i64().unwrap_or(0) > 0
                && (10_000..1_000_000).contains(&last["diskUsed"].as_i64().unwrap_or(0))
                && batch["sandboxes"][id.as_str()]["cpuUsedPct"]
                    .as_f64()
                    .unwrap_or(0.0)
                    > 5.0
        },
    )
    .await;

    let resp = http
        .delete(format!("{base}/sandboxes/{id}"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 204);
    eventually("killing the sandbox kills its process", || async {
        !proc_alive(pid)
    })
    .await;
    let rest = stream.collect().await.expect("the stream ends");
    assert_eq!(end_of(&rest).status, "signal: killed");
    eventually(
        "the killed sandbox's scratch directory is removed",
        || async { !std::path::Path::new(&scratch_home).exists() },
    )
    .await;
}

#[tokio::test]
async fn a_sandbox_that_times_out_takes_its_processes_with_it() {
    let sim = sim(ExecMode::Local).await;
    let end_at = chrono::Utc::now() + chrono::Duration::seconds(2);
    let (id, _) = sandbox(&sim, json!({"endAt": end_at.to_rfc3339()})).await;
    let envd = client(&sim, &id, None);
    let (_stream, pid) = start_and_get_pid(&envd, &ProcessSpec::shell("sleep 600")).await;
    // Nothing but the simulator's own clock ends it.
    eventually("the expired sandbox's process is killed", || async {
        !proc_alive(pid)
    })
    .await;
}

#[tokio::test]
async fn the_sim_help_mentions_exec() {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_steward"))
        .args(["sim", "e2b", "--help"])
        .output()
        .await
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{help}");
    assert!(help.contains("--exec"), "{help}");
    assert!(help.contains("THIS MACHINE"), "{help}");
}

/// A raw `Start` whose request Steward's client does not make (stdin on, a tag, a deadline):
/// the response, to be read as a Connect stream.
async fn start_raw(
    sim: &SimServer,
    id: &SandboxId,
    message: Value,
    timeout_ms: Option<u64>,
) -> reqwest::Response {
    let mut request = reqwest::Client::new()
        .post(format!("{}/process.Process/Start", sim.envd_url()))
        .header("E2b-Sandbox-Id", id.as_str())
        .header("E2b-Sandbox-Port", "49983")
        .header("Content-Type", "application/connect+json");
    if let Some(ms) = timeout_ms {
        request = request.header("Connect-Timeout-Ms", ms.to_string());
    }
    let response = request
        .body(encode(0, message.to_string().as_bytes()))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    response
}

/// Reads Connect frames from `response` until `until` holds for the messages so far, or the end.
async fn read_until(
    response: &mut reqwest::Response,
    decoder: &mut Decoder,
    messages: &mut Vec<Value>,
    until: impl Fn(&[Value]) -> bool,
) -> Option<Option<String>> {
    loop {
        while let Some(frame) = decoder.next_frame().unwrap() {
            match frame {
                Frame::Message(body) => messages.push(serde_json::from_slice(&body).unwrap()),
                Frame::End { error } => return Some(error.map(|e| e.code)),
            }
            if until(messages) {
                return None;
            }
        }
        match response.chunk().await.unwrap() {
            Some(chunk) => decoder.push(&chunk),
            None => panic!("the stream stopped without its end frame: {messages:?}"),
        }
    }
}

async fn unary(sim: &SimServer, id: &SandboxId, method: &str, message: Value) -> (u16, Value) {
    let response = reqwest::Client::new()
        .post(format!("{}/{method}", sim.envd_url()))
        .header("E2b-Sandbox-Id", id.as_str())
        .header("E2b-Sandbox-Port", "49983")
        .header("Content-Type", "application/json")
        .body(message.to_string())
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), response.json().await.unwrap())
}

fn stdout_of(messages: &[Value]) -> String {
    let bytes: Vec<u8> = messages
        .iter()
        .filter_map(|m| m["event"]["data"]["stdout"].as_str())
        .flat_map(|b| {
            base64::Engine::decode(&base64::engine::general_purpose::STANDARD, b).unwrap()
        })
        .collect();
    String::from_utf8(bytes).unwrap()
}

#[tokio::test]
async fn a_running_process_is_listed_fed_on_stdin_reattached_and_closed() {
    let sim = sim(ExecMode::Local).await;
    let (id, _) = sandbox(&sim, json!({})).await;
    let envd = client(&sim, &id, None);
    let message = json!({
        "process": {"cmd": "/bin/bash", "args": ["-l", "-c", "cat"], "envs": {"K": "v"}, "cwd": "/home/user"},
        "stdin": true,
        "tag": "feeder",
    });
    let mut started = start_raw(&sim, &id, message, None).await;
    let (mut decoder, mut messages) = (Decoder::default(), Vec::new());
    read_until(&mut started, &mut decoder, &mut messages, |m| !m.is_empty()).await;
    let pid = messages[0]["event"]["start"]["pid"].as_u64().unwrap() as u32;

    let listed = unary(&sim, &id, "process.Process/List", json!({})).await;
    assert_eq!(listed.0, 200);
    assert_eq!(
        listed.1,
        json!({"processes": [{
            "config": {"cmd": "/bin/bash", "args": ["-l", "-c", "cat"], "envs": {"K": "v"}, "cwd": "/home/user"},
            "pid": pid,
            "tag": "feeder",
        }]})
    );

    let fed = unary(
        &sim,
        &id,
        "process.Process/SendInput",
        json!({"process": {"pid": pid}, "input": {"stdin": "aGVsbG8K"}}),
    )
    .await;
    assert_eq!(fed, (200, json!({})));
    read_until(&mut started, &mut decoder, &mut messages, |m| {
        stdout_of(m) == "hello\n"
    })
    .await;

    // A second reader re-attaches by pid: its stream opens with the start, then gets what the
    // process writes from then on, as the first does.
    let mut attached = envd.connect(pid).await.expect("connected");
    assert_eq!(
        attached.next_event().await.unwrap(),
        Some(ProcessEvent::Start { pid })
    );
    let by_tag = unary(
        &sim,
        &id,
        "process.Process/SendInput",
        json!({"process": {"tag": "feeder"}, "input": {"stdin": "YWdhaW4K"}}),
    )
    .await;
    assert_eq!(by_tag.0, 200);
    assert_eq!(
        attached.next_event().await.unwrap(),
        Some(ProcessEvent::Stdout(b"again\n".to_vec()))
    );
    let closed = unary(
        &sim,
        &id,
        "process.Process/CloseStdin",
        json!({"process": {"pid": pid}}),
    )
    .await;
    assert_eq!(closed, (200, json!({})));
    let rest = attached
        .collect()
        .await
        .expect("the re-attached stream ends cleanly");
    assert_eq!(end_of(&rest).exit_code, 0);
    assert_eq!(
        read_until(&mut started, &mut decoder, &mut messages, |_| false).await,
        Some(None)
    );
    assert_eq!(stdout_of(&messages), "hello\nagain\n");

    // Once ended, the process is gone from the list, and a late Connect still learns its end.
    let listed = unary(&sim, &id, "process.Process/List", json!({})).await;
    assert_eq!(listed, (200, json!({})));
    let late = envd.connect(pid).await.unwrap().collect().await.unwrap();
    assert_eq!(late.first(), Some(&ProcessEvent::Start { pid }));
    assert_eq!(end_of(&late).status, "exit status 0");
    assert_eq!(late.len(), 2, "{late:?}");

    for (method, message) in [
        (
            "process.Process/SendInput",
            json!({"process": {"pid": pid}, "input": {"stdin": "eA=="}}),
        ),
        (
            "process.Process/CloseStdin",
            json!({"process": {"tag": "feeder"}}),
        ),
        (
            "process.Process/SendSignal",
            json!({"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"}),
        ),
    ] {
        let answer = unary(&sim, &id, method, message).await;
        assert_eq!(answer.0, 404, "{method} {answer:?}");
        assert_eq!(answer.1["code"], "not_found");
    }
    match envd.connect(999_999).await.unwrap().next_event().await {
        Err(EnvdError::Rpc { code, message, .. }) => {
            assert_eq!(code, "not_found");
            assert_eq!(message, "process with pid 999999 not found");
        }
        other => panic!("expected not_found, got {other:?}"),
    }
}

#[tokio::test]
async fn input_to_a_process_without_stdin_and_odd_signals_fail_as_envd_fails_them() {
    let sim = sim(ExecMode::Local).await;
    let (id, _) = sandbox(&sim, json!({})).await;
    let envd = client(&sim, &id, None);
    // Steward's client starts processes without stdin, as the SDKs do by default.
    let (stream, pid) = start_and_get_pid(&envd, &ProcessSpec::shell("sleep 600")).await;

    let fed = unary(
        &sim,
        &id,
        "process.Process/SendInput",
        json!({"process": {"pid": pid}, "input": {"stdin": "eA=="}}),
    )
    .await;
    assert_eq!(fed.0, 500, "{fed:?}");
    assert_eq!(fed.1["code"], "internal");
    assert!(
        fed.1["message"]
            .as_str()
            .unwrap()
            .contains("stdin not enabled or closed")
    );
    let unspecified = unary(
        &sim,
        &id,
        "process.Process/SendSignal",
        json!({"process": {"pid": pid}}),
    )
    .await;
    assert_eq!(unspecified.0, 501);
    assert_eq!(unspecified.1["code"], "unimplemented");
    assert_eq!(
        unspecified.1["message"],
        "invalid signal: SIGNAL_UNSPECIFIED"
    );
    let no_selector = unary(&sim, &id, "process.Process/CloseStdin", json!({})).await;
    assert_eq!(no_selector.1["code"], "unimplemented");

    let killed = unary(
        &sim,
        &id,
        "process.Process/SendSignal",
        json!({"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"}),
    )
    .await;
    assert_eq!(killed, (200, json!({})));
    let end = end_of(&stream.collect().await.unwrap());
    assert_eq!(
        end,
        ProcessEnd {
            exit_code: -1,
            exited: false,
            status: "signal: killed".into(),
            error: Some("signal: killed".into())
        }
    );
}

#[tokio::test]
async fn a_process_is_killed_when_the_deadline_its_starter_gave_runs_out() {
    let sim = sim(ExecMode::Local).await;
    let (id, _) = sandbox(&sim, json!({})).await;
    let message = json!({"process": {"cmd": "/bin/sleep", "args": ["600"]}, "stdin": false});
    let mut started = start_raw(&sim, &id, message, Some(300)).await;
    let (mut decoder, mut messages) = (Decoder::default(), Vec::new());
    let ended = read_until(&mut started, &mut decoder, &mut messages, |_| false).await;
    assert_eq!(ended, Some(None), "{messages:?}");
    let end = &messages.last().unwrap()["event"]["end"];
    assert_eq!(end["status"], "signal: killed", "{messages:?}");
    assert_eq!(end["error"], "signal: killed");
    assert_eq!(end["exitCode"], -1);
}
