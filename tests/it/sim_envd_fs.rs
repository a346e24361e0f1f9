//! The simulator's `filesystem.Filesystem` service, its Connect errors, and the rule that no
//! request reaches the host outside a sandbox's scratch directory, over real sockets with raw
//! Connect requests (the wire is the point here; the vendor suite drives the same RPCs with the
//! official SDK). Symlinks are made by commands in the sandbox (`--exec local`), as a sandbox's
//! own processes would make them.
use std::path::PathBuf;

use sandbox_steward::envd::connect::{Decoder, Frame, encode};
use sandbox_steward::envd::{EnvdClient, ProcessEvent, ProcessSpec};
use sandbox_steward::ids::SandboxId;
use sandbox_steward::sim::e2b::{ExecMode, SimOptions, SimServer};
use serde_json::{Value, json};

use crate::common::{envd_client as client, seed_envd_sandbox as sandbox};

async fn sim(exec: ExecMode) -> SimServer {
    SimServer::start(SimOptions {
        sandboxes: 0,
        exec,
        ..SimOptions::default()
    })
    .await
    .expect("the simulator starts")
}

/// A unary Connect call with the JSON codec: the HTTP status and the JSON answer.
async fn unary(sim: &SimServer, id: &SandboxId, method: &str, message: Value) -> (u16, Value) {
    let response = reqwest::Client::new()
        .post(format!("{}/{method}", sim.envd_url()))
        .header("E2b-Sandbox-Id", id.as_str())
        .header("E2b-Sandbox-Port", "49983")
        .header("Content-Type", "application/json")
        .header("Connect-Protocol-Version", "1")
        .body(message.to_string())
        .send()
        .await
        .expect("envd answers");
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, body)
}

/// The error code of a unary answer, after checking its status is Connect's for that code.
fn code_of(answer: &(u16, Value)) -> &str {
    let code = answer.1["code"].as_str().unwrap_or("(none)");
    let expected = match code {
        "invalid_argument" | "failed_precondition" => 400,
        "not_found" => 404,
        "already_exists" => 409,
        "unimplemented" => 501,
        _ => 500,
    };
    assert_eq!(answer.0, expected, "{answer:?}");
    code
}

/// A server-streaming call, read to its end: the messages, and the end-of-stream error.
async fn stream(
    sim: &SimServer,
    id: &SandboxId,
    method: &str,
    message: Value,
    until: impl Fn(&[Value]) -> bool,
) -> (Vec<Value>, Option<(String, String)>) {
    let mut response = reqwest::Client::new()
        .post(format!("{}/{method}", sim.envd_url()))
        .header("E2b-Sandbox-Id", id.as_str())
        .header("E2b-Sandbox-Port", "49983")
        .header("Content-Type", "application/connect+json")
        .body(encode(0, message.to_string().as_bytes()))
        .send()
        .await
        .expect("envd answers");
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["content-type"],
        "application/connect+json"
    );
    let mut decoder = Decoder::default();
    let mut messages = Vec::new();
    while let Some(chunk) = response.chunk().await.unwrap() {
        decoder.push(&chunk);
        while let Some(frame) = decoder.next_frame().unwrap() {
            match frame {
                Frame::Message(body) => messages.push(serde_json::from_slice(&body).unwrap()),
                Frame::End { error } => return (messages, error.map(|e| (e.code, e.message))),
            }
        }
        if until(&messages) {
            return (messages, None);
        }
    }
    panic!("the stream stopped without its end frame: {messages:?}");
}

async fn run(envd: &EnvdClient, script: &str) -> String {
    let events = envd
        .start(&ProcessSpec::shell(script))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let out: Vec<u8> = events
        .iter()
        .filter_map(|e| match e {
            ProcessEvent::Stdout(b) | ProcessEvent::Stderr(b) => Some(b.clone()),
            _ => None,
        })
        .flatten()
        .collect();
    String::from_utf8(out).unwrap()
}

/// The sandbox's `/` on this machine (its home's host path, less `/home/user`).
async fn scratch_root(envd: &EnvdClient) -> PathBuf {
    let home = run(envd, "pwd").await;
    PathBuf::from(
        home.trim()
            .strip_suffix("/home/user")
            .expect("a scratch home"),
    )
}

#[tokio::test]
async fn stat_list_make_dir_move_and_remove_answer_as_envd_does() {
    // The filesystem works without execution.
    let sim = sim(ExecMode::Off).await;
    let (id, _) = sandbox(&sim, json!({})).await;
    let envd = client(&sim, &id, None);
    envd.upload("a.txt", b"hello".to_vec()).await.unwrap();
    envd.upload("dir/b.txt", b"hi".to_vec()).await.unwrap();

    let stat = unary(
        &sim,
        &id,
        "filesystem.Filesystem/Stat",
        json!({"path": "a.txt"}),
    )
    .await;
    assert_eq!(stat.0, 200, "{stat:?}");
    let entry = &stat.1["entry"];
    assert_eq!(entry["name"], "a.txt");
    assert_eq!(entry["type"], "FILE_TYPE_FILE");
    assert_eq!(entry["path"], "/home/user/a.txt");
    // proto3 JSON writes an int64 as a string.
    assert_eq!(entry["size"], "5");
    assert_eq!(entry["owner"], "user");
    assert!(
        entry["permissions"].as_str().unwrap().starts_with("-rw"),
        "{entry}"
    );
    assert!(
        entry["modifiedTime"].as_str().unwrap().ends_with('Z'),
        "{entry}"
    );
    assert!(entry.get("symlinkTarget").is_none(), "{entry}");

    let missing = unary(
        &sim,
        &id,
        "filesystem.Filesystem/Stat",
        json!({"path": "/home/user/nope"}),
    )
    .await;
    assert_eq!(code_of(&missing), "not_found");

    let listed = unary(
        &sim,
        &id,
        "filesystem.Filesystem/ListDir",
        json!({"path": "/home/user"}),
    )
    .await;
    let names: Vec<&str> = listed.1["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["/home/user/a.txt", "/home/user/dir"]);
    let deep = unary(
        &sim,
        &id,
        "filesystem.Filesystem/ListDir",
        json!({"path": "/home/user", "depth": 2}),
    )
    .await;
    let names: Vec<&str> = deep.1["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["/home/user/a.txt", "/home/user/dir", "/home/user/dir/b.txt"]
    );
    assert_eq!(deep.1["entries"][1]["type"], "FILE_TYPE_DIRECTORY");
    let not_dir = unary(
        &sim,
        &id,
        "filesystem.Filesystem/ListDir",
        json!({"path": "a.txt"}),
    )
    .await;
    assert_eq!(code_of(&not_dir), "invalid_argument");

    let made = unary(
        &sim,
        &id,
        "filesystem.Filesystem/MakeDir",
        json!({"path": "x/y"}),
    )
    .await;
    assert_eq!(made.0, 200, "{made:?}");
    assert_eq!(made.1["entry"]["type"], "FILE_TYPE_DIRECTORY");
    assert_eq!(made.1["entry"]["path"], "/home/user/x/y");
    let again = unary(
        &sim,
        &id,
        "filesystem.Filesystem/MakeDir",
        json!({"path": "x/y"}),
    )
    .await;
    assert_eq!(code_of(&again), "already_exists");
    let over_file = unary(
        &sim,
        &id,
        "filesystem.Filesystem/MakeDir",
        json!({"path": "a.txt"}),
    )
    .await;
    assert_eq!(code_of(&over_file), "invalid_argument");

    let moved = unary(
        &sim,
        &id,
        "filesystem.Filesystem/Move",
        json!({"source": "a.txt", "destination": "/home/user/x/y/z/a2.txt"}),
    )
    .await;
    assert_eq!(moved.0, 200, "{moved:?}");
    assert_eq!(moved.1["entry"]["path"], "/home/user/x/y/z/a2.txt");
    assert_eq!(envd.download("x/y/z/a2.txt").await.unwrap(), b"hello");
    let gone = unary(
        &sim,
        &id,
        "filesystem.Filesystem/Move",
        json!({"source": "a.txt", "destination": "b.txt"}),
    )
    .await;
    assert_eq!(code_of(&gone), "not_found");

    let removed = unary(
        &sim,
        &id,
        "filesystem.Filesystem/Remove",
        json!({"path": "x"}),
    )
    .await;
    assert_eq!(removed, (200, json!({})));
    let after = unary(
        &sim,
        &id,
        "filesystem.Filesystem/Stat",
        json!({"path": "x"}),
    )
    .await;
    assert_eq!(code_of(&after), "not_found");
    // Removing what is not there is no error, as with Go's os.RemoveAll.
    let twice = unary(
        &sim,
        &id,
        "filesystem.Filesystem/Remove",
        json!({"path": "x"}),
    )
    .await;
    assert_eq!(twice.0, 200);
}

#[tokio::test]
async fn no_filesystem_request_reaches_the_host_outside_the_scratch_directory() {
    let sim = sim(ExecMode::Local).await;
    let (id, _) = sandbox(&sim, json!({})).await;
    let envd = client(&sim, &id, None);
    let root = scratch_root(&envd).await;
    let marker = uuid::Uuid::new_v4().simple().to_string();
    // A file of the host's that nothing may read, change or remove through envd.
    let victim = std::env::temp_dir().join(format!("steward-victim-{marker}"));
    std::fs::write(&victim, b"host secret").unwrap();
    let victim_text = victim.display().to_string();
    let escape = std::env::temp_dir().join(format!("steward-escape-{marker}"));
    let escape_text = escape.display().to_string();
    // Symlinks pointing out, made by the sandbox's own process: absolute, to the host's root,
    // and climbing with `..`.
    run(
        &envd,
        &format!(
            "ln -s / /home/user/hostroot && ln -s {victim_text} /home/user/victim && ln -s ../../../../../../../../.. /home/user/up && ln -s /etc /home/user/etc"
        ),
    )
    .await;

    // `..` is refused by every RPC that takes a path, before anything is touched.
    for (method, message) in [
        (
            "filesystem.Filesystem/Stat",
            json!({"path": "../../etc/passwd"}),
        ),
        (
            "filesystem.Filesystem/ListDir",
            json!({"path": "/home/user/../.."}),
        ),
        (
            "filesystem.Filesystem/MakeDir",
            json!({"path": "../../escape"}),
        ),
        (
            "filesystem.Filesystem/Move",
            json!({"source": "/home/user/a", "destination": "../../../tmp/x"}),
        ),
        (
            "filesystem.Filesystem/Move",
            json!({"source": "../../../etc/hostname", "destination": "h"}),
        ),
        (
            "filesystem.Filesystem/Remove",
            json!({"path": "../../../tmp"}),
        ),
        (
            "filesystem.Filesystem/CreateWatcher",
            json!({"path": "/home/user/../../.."}),
        ),
    ] {
        let answer = unary(&sim, &id, method, message.clone()).await;
        assert_eq!(code_of(&answer), "invalid_argument", "{method} {message}");
        assert!(
            answer.1["message"].as_str().unwrap().contains(".."),
            "{answer:?}"
        );
    }
    let (_, error) = stream(
        &sim,
        &id,
        "filesystem.Filesystem/WatchDir",
        json!({"path": "../.."}),
        |_| false,
    )
    .await;
    assert_eq!(error.unwrap().0, "invalid_argument");

    // An absolute path names the sandbox's own `/`, which holds no host file.
    let passwd = unary(
        &sim,
        &id,
        "filesystem.Filesystem/Stat",
        json!({"path": "/etc/passwd"}),
    )
    .await;
    assert_eq!(code_of(&passwd), "not_found");
    let victim_stat = unary(
        &sim,
        &id,
        "filesystem.Filesystem/Stat",
        json!({"path": victim_text}),
    )
    .await;
    assert_eq!(code_of(&victim_stat), "not_found");

    // Through the links, everything lands inside the scratch directory.
    for path in [
        "/home/user/etc/passwd".to_owned(),
        "/home/user/hostroot/etc/passwd".to_owned(),
        "/home/user/up/etc/passwd".to_owned(),
        format!("/home/user/hostroot{victim_text}"),
    ] {
        let answer = unary(
            &sim,
            &id,
            "filesystem.Filesystem/Stat",
            json!({"path": path}),
        )
        .await;
        assert_eq!(code_of(&answer), "not_found", "{path}");
    }
    let listed = unary(
        &sim,
        &id,
        "filesystem.Filesystem/ListDir",
        json!({"path": "/home/user/up"}),
    )
    .await;
    assert_eq!(listed.0, 200, "{listed:?}");
    let names: Vec<&str> = listed.1["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["home"], "the sandbox's root, not the host's");
    let etc = unary(
        &sim,
        &id,
        "filesystem.Filesystem/ListDir",
        json!({"path": "/home/user/etc"}),
    )
    .await;
    assert_eq!(code_of(&etc), "not_found");

    // The link itself is reported, dangling as it is in the sandbox (envd then names the link
    // as its own target), never as the host file it would reach on the host.
    let link = unary(
        &sim,
        &id,
        "filesystem.Filesystem/Stat",
        json!({"path": "victim"}),
    )
    .await;
    assert_eq!(link.0, 200, "{link:?}");
    assert_eq!(link.1["entry"]["symlinkTarget"], "/home/user/victim");
    assert_ne!(link.1["entry"]["size"], "11", "the host file's size leaked");
    assert!(link.1["entry"].get("type").is_none(), "{link:?}");

    let made = unary(
        &sim,
        &id,
        "filesystem.Filesystem/MakeDir",
        json!({"path": format!("/home/user/hostroot{escape_text}")}),
    )
    .await;
    assert_eq!(made.0, 200, "{made:?}");
    assert!(!escape.exists(), "MakeDir reached the host");
    assert!(root.join(escape_text.trim_start_matches('/')).is_dir());

    envd.upload("m.txt", b"m".to_vec()).await.unwrap();
    let moved = unary(
        &sim,
        &id,
        "filesystem.Filesystem/Move",
        json!({"source": "m.txt", "destination": format!("/home/user/up{escape_text}.txt")}),
    )
    .await;
    assert_eq!(moved.0, 200, "{moved:?}");
    assert!(
        !PathBuf::from(format!("{escape_text}.txt")).exists(),
        "Move reached the host"
    );
    let from_host = unary(
        &sim,
        &id,
        "filesystem.Filesystem/Move",
        json!({"source": format!("/home/user/hostroot{victim_text}"), "destination": "stolen"}),
    )
    .await;
    assert_eq!(code_of(&from_host), "not_found");

    for path in [
        format!("/home/user/hostroot{victim_text}"),
        "victim".to_owned(),
    ] {
        let removed = unary(
            &sim,
            &id,
            "filesystem.Filesystem/Remove",
            json!({"path": path}),
        )
        .await;
        assert_eq!(removed.0, 200, "{removed:?}");
    }
    assert_eq!(
        std::fs::read(&victim).unwrap(),
        b"host secret",
        "Remove reached the host"
    );
    let victim_link = unary(
        &sim,
        &id,
        "filesystem.Filesystem/Stat",
        json!({"path": "victim"}),
    )
    .await;
    assert_eq!(
        code_of(&victim_link),
        "not_found",
        "the link itself was removed"
    );

    // /files and a command's cwd follow links the same way.
    run(&envd, &format!("ln -s {victim_text} /home/user/victim2")).await;
    match envd.download("victim2").await {
        Err(sandbox_steward::envd::EnvdError::Status { status: 404, .. }) => {}
        other => panic!("the download followed the link out of the sandbox: {other:?}"),
    }
    envd.upload("victim2", b"overwritten".to_vec())
        .await
        .unwrap();
    assert_eq!(
        std::fs::read(&victim).unwrap(),
        b"host secret",
        "an upload reached the host"
    );
    let mut spec = ProcessSpec::shell("pwd");
    spec.cwd = Some("/home/user/etc".into());
    let events = envd.start(&spec).await.unwrap().collect().await;
    match events {
        Err(sandbox_steward::envd::EnvdError::Rpc { code, message, .. }) => {
            assert_eq!(code, "invalid_argument");
            assert!(message.contains("does not exist"), "{message}");
        }
        other => panic!("a cwd through a link out ran on the host: {other:?}"),
    }
    let watch = unary(
        &sim,
        &id,
        "filesystem.Filesystem/CreateWatcher",
        json!({"path": "/home/user/etc"}),
    )
    .await;
    assert_eq!(code_of(&watch), "not_found");

    std::fs::remove_file(&victim).unwrap();
}

#[tokio::test]
async fn watchers_report_creates_writes_renames_and_removes() {
    let sim = sim(ExecMode::Off).await;
    let (id, _) = sandbox(&sim, json!({})).await;
    let envd = client(&sim, &id, None);
    envd.upload("w/keep.txt", b"1".to_vec()).await.unwrap();

    let created = unary(
        &sim,
        &id,
        "filesystem.Filesystem/CreateWatcher",
        json!({"path": "/home/user/w", "includeEntry": true}),
    )
    .await;
    assert_eq!(created.0, 200, "{created:?}");
    let watcher = created.1["watcherId"].as_str().unwrap().to_owned();
    let events = |answer: (u16, Value)| -> Vec<(String, String)> {
        assert_eq!(answer.0, 200, "{answer:?}");
        answer.1["events"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(|e| {
                (
                    e["name"].as_str().unwrap().to_owned(),
                    e["type"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    };
    let poll = || {
        unary(
            &sim,
            &id,
            "filesystem.Filesystem/GetWatcherEvents",
            json!({"watcherId": watcher}),
        )
    };

    assert_eq!(events(poll().await), []);
    envd.upload("w/new.txt", b"n".to_vec()).await.unwrap();
    let first = poll().await;
    assert_eq!(
        first.1["events"][0]["entry"]["path"],
        "/home/user/w/new.txt"
    );
    assert_eq!(
        events(first),
        [("new.txt".to_owned(), "EVENT_TYPE_CREATE".to_owned())]
    );
    envd.upload("w/keep.txt", b"longer".to_vec()).await.unwrap();
    unary(
        &sim,
        &id,
        "filesystem.Filesystem/Move",
        json!({"source": "w/new.txt", "destination": "w/renamed.txt"}),
    )
    .await;
    assert_eq!(
        events(poll().await),
        [
            ("new.txt".to_owned(), "EVENT_TYPE_RENAME".to_owned()),
            ("keep.txt".to_owned(), "EVENT_TYPE_WRITE".to_owned()),
            ("renamed.txt".to_owned(), "EVENT_TYPE_CREATE".to_owned()),
        ]
    );
    unary(
        &sim,
        &id,
        "filesystem.Filesystem/Remove",
        json!({"path": "w/keep.txt"}),
    )
    .await;
    assert_eq!(
        events(poll().await),
        [("keep.txt".to_owned(), "EVENT_TYPE_REMOVE".to_owned())]
    );

    let removed = unary(
        &sim,
        &id,
        "filesystem.Filesystem/RemoveWatcher",
        json!({"watcher_id": watcher}),
    )
    .await;
    assert_eq!(removed, (200, json!({})));
    assert_eq!(code_of(&poll().await), "not_found");

    // WatchDir streams the same events as they happen, after its start event.
    let watching = {
        let (sim_url, id) = (sim.envd_url(), id.clone());
        tokio::spawn(async move {
            let mut response = reqwest::Client::new()
                .post(format!("{sim_url}/filesystem.Filesystem/WatchDir"))
                .header("E2b-Sandbox-Id", id.as_str())
                .header("Content-Type", "application/connect+json")
                .body(encode(
                    0,
                    json!({"path": "/home/user/w"}).to_string().as_bytes(),
                ))
                .send()
                .await
                .unwrap();
            let mut decoder = Decoder::default();
            let mut messages: Vec<Value> = Vec::new();
            while let Some(chunk) = response.chunk().await.unwrap() {
                decoder.push(&chunk);
                while let Some(Frame::Message(body)) = decoder.next_frame().unwrap() {
                    messages.push(serde_json::from_slice(&body).unwrap());
                }
                if messages.iter().any(|m| m.get("filesystem").is_some()) {
                    return messages;
                }
            }
            messages
        })
    };
    // Each look uploads a file of a new name, so one made before the stream's first look (and
    // so in its starting picture) does not hide the event.
    let writer = client(&sim, &id, None);
    let attempt = std::sync::atomic::AtomicUsize::new(0);
    crate::common::eventually("the stream reports a new file", || {
        let writer = writer.clone();
        let done = watching.is_finished();
        let n = attempt.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        async move {
            if !done {
                let name = format!("w/streamed-{n}.txt");
                writer.upload(&name, b"s".to_vec()).await.unwrap();
            }
            done
        }
    })
    .await;
    let messages = watching.await.unwrap();
    assert_eq!(messages[0], json!({"start": {}}), "{messages:?}");
    let event = &messages[1]["filesystem"];
    assert_eq!(event["type"], "EVENT_TYPE_CREATE", "{messages:?}");
    assert!(
        event["name"].as_str().unwrap().starts_with("streamed-"),
        "{messages:?}"
    );
    assert!(
        event.get("entry").is_none(),
        "no entry unless asked: {messages:?}"
    );
}

#[tokio::test]
async fn an_rpc_this_envd_does_not_serve_is_unimplemented_never_a_plain_404() {
    let sim = sim(ExecMode::Off).await;
    let (id, _) = sandbox(&sim, json!({})).await;

    let update = unary(
        &sim,
        &id,
        "process.Process/Update",
        json!({"process": {"pid": 1}, "pty": {"size": {"cols": 80, "rows": 24}}}),
    )
    .await;
    assert_eq!(code_of(&update), "unimplemented");
    assert!(
        update.1["message"]
            .as_str()
            .unwrap()
            .contains("process.Process.Update")
    );
    let unknown = unary(&sim, &id, "filesystem.Filesystem/Compose", json!({})).await;
    assert_eq!(code_of(&unknown), "unimplemented");
    // A streaming call gets its error as a stream's end, as connect-go sends it.
    let (messages, error) = stream(
        &sim,
        &id,
        "process.Process/StreamInput",
        json!({"start": {"process": {"pid": 1}}}),
        |_| false,
    )
    .await;
    assert!(messages.is_empty());
    assert_eq!(error.unwrap().0, "unimplemented");

    // A codec this envd lacks is connect-go's 415; a path that is no RPC is envd's 404.
    let proto = reqwest::Client::new()
        .post(format!("{}/filesystem.Filesystem/Stat", sim.envd_url()))
        .header("E2b-Sandbox-Id", id.as_str())
        .header("Content-Type", "application/proto")
        .body(vec![0x0a, 0x01, b'a'])
        .send()
        .await
        .unwrap();
    assert_eq!(proto.status(), 415);
    assert_eq!(proto.headers()["accept-post"], "application/json");
    let plain = reqwest::Client::new()
        .get(format!("{}/nothing-here", sim.envd_url()))
        .header("E2b-Sandbox-Id", id.as_str())
        .send()
        .await
        .unwrap();
    assert_eq!(plain.status(), 404);
    // A body that is not JSON is invalid_argument, not a crash.
    let garbage = reqwest::Client::new()
        .post(format!("{}/filesystem.Filesystem/Stat", sim.envd_url()))
        .header("E2b-Sandbox-Id", id.as_str())
        .header("Content-Type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(garbage.status(), 400);
    let body: Value = garbage.json().await.unwrap();
    assert_eq!(body["code"], "invalid_argument");
}

#[tokio::test]
async fn uploads_come_as_multipart_form_data_or_as_raw_bytes() {
    let sim = sim(ExecMode::Off).await;
    let (id, _) = sandbox(&sim, json!({})).await;
    let envd = client(&sim, &id, None);
    let http = reqwest::Client::new();
    let post = |query: &'static str, content_type: &'static str, body: Vec<u8>| {
        http.post(format!("{}/files{query}", sim.envd_url()))
            .header("E2b-Sandbox-Id", id.as_str())
            .header("Content-Type", content_type)
            .body(body)
            .send()
    };

    // As httpx sends the SDK's multipart upload: two files, each at its part's filename.
    let body = b"--b0undary\r\nContent-Disposition: form-data; name=\"file\"; filename=\"/home/user/m/one.txt\"\r\nContent-Type: text/plain\r\n\r\nfirst\r\n--b0undary\r\nContent-Disposition: form-data; name=\"file\"; filename=\"two.bin\"\r\nContent-Type: application/octet-stream\r\n\r\n\x00\r\n--b0\r\n--b0undary--\r\n".to_vec();
    let answer = post("", "multipart/form-data; boundary=b0undary", body)
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    let written: Value = answer.json().await.unwrap();
    assert_eq!(
        written,
        json!([
            {"path": "/home/user/m/one.txt", "name": "one.txt", "type": "file"},
            {"path": "/home/user/two.bin", "name": "two.bin", "type": "file"}
        ])
    );
    assert_eq!(envd.download("m/one.txt").await.unwrap(), b"first");
    assert_eq!(envd.download("two.bin").await.unwrap(), b"\x00\r\n--b0");

    // With a path parameter, the one file goes there whatever its filename says.
    let body = b"--x\r\nContent-Disposition: form-data; name=\"file\"; filename=\"ignored\"\r\n\r\nthere\r\n--x--\r\n".to_vec();
    let answer = post(
        "?path=at%2Fpath.txt",
        "multipart/form-data; boundary=x",
        body,
    )
    .await
    .unwrap();
    assert_eq!(answer.status(), 200);
    assert_eq!(envd.download("at/path.txt").await.unwrap(), b"there");

    // Refusals are envd's 400 bodies.
    let body = b"--x\r\nContent-Disposition: form-data; name=\"file\"; filename=\"../../out\"\r\n\r\nno\r\n--x--\r\n".to_vec();
    let climbing = post("", "multipart/form-data; boundary=x", body)
        .await
        .unwrap();
    assert_eq!(climbing.status(), 400);
    let body = b"--x\r\nContent-Disposition: form-data; name=\"file\"; filename=\"d.txt\"\r\n\r\n1\r\n--x\r\nContent-Disposition: form-data; name=\"file\"; filename=\"/home/user/d.txt\"\r\n\r\n2\r\n--x--\r\n".to_vec();
    let twice = post("", "multipart/form-data; boundary=x", body)
        .await
        .unwrap();
    assert_eq!(twice.status(), 400);
    let message: Value = twice.json().await.unwrap();
    assert!(
        message["message"].as_str().unwrap().contains("same path"),
        "{message}"
    );
    let raw_without_path = post("", "application/octet-stream", b"x".to_vec())
        .await
        .unwrap();
    assert_eq!(raw_without_path.status(), 400);
    let text = post("?path=t.txt", "text/plain", b"x".to_vec())
        .await
        .unwrap();
    assert_eq!(text.status(), 400);
    let message: Value = text.json().await.unwrap();
    assert!(
        message["message"]
            .as_str()
            .unwrap()
            .contains("expected multipart/form-data or application/octet-stream"),
        "{message}"
    );
    match envd.download("t.txt").await {
        Err(sandbox_steward::envd::EnvdError::Status { status: 404, .. }) => {}
        other => panic!("a refused upload wrote a file: {other:?}"),
    }
}
