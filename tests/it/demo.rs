//! `steward demo` in-process (`demo::start` with port 0), checked over HTTP only: the Slack
//! simulator holds the opening sweep's digest with its cases, the agent's run card and the push
//! test's outcome; Steward answers a signed `/sandbox list`; stopping closes every port and
//! removes the scratch directory. Bad input (an unreachable Redis, a busy port) is a sentence
//! and leaves nothing running. With `socket_mode`, Steward is connected over the simulator's
//! Socket Mode when `start` returns, and the page's commands travel over that socket.
use std::net::SocketAddr;

use sandbox_steward::demo::setup::{
    APPROVALS_CHANNEL, ENGINEERING_CHANNEL, HYGIENE_CHANNEL, RUNS_CHANNEL,
};
use sandbox_steward::demo::{self, DemoHandle, DemoOptions, REQUESTER};
use sandbox_steward::sim::slack::Recorded;
use sandbox_steward::slack::signature;
use secrecy::SecretString;
use serde_json::{Value, json};

use crate::common::{
    PrefixCleanup, command_form, eventually, hook, redis_url, unix_now, visible_json_text,
    visible_text, wait_until,
};

async fn start(redis: Option<String>) -> DemoHandle {
    sandbox_steward::telemetry::init("error");
    demo::start(DemoOptions {
        port: 0,
        redis_url: redis.map(SecretString::from),
        ..DemoOptions::default()
    })
    .await
    .expect("the demo starts")
}

/// Every call the Slack simulator recorded, read over HTTP as a browser or a script would.
async fn slack_calls(demo: &DemoHandle) -> Vec<Recorded> {
    reqwest::get(format!("{}/_sim/messages", demo.slack_url))
        .await
        .expect("the Slack simulator answers")
        .json()
        .await
        .expect("recorded calls are JSON")
}

fn posted_in<'a>(calls: &'a [Recorded], channel: &str) -> impl Iterator<Item = &'a Recorded> {
    calls
        .iter()
        .filter(move |c| c.method == "chat.postMessage" && c.channel.as_deref() == Some(channel))
}

/// A signed `/sandbox <text>` from `user`, answered through the simulator's `hooks/<name>`.
async fn command(demo: &DemoHandle, user: &str, text: &str, hook_name: &str) -> reqwest::Response {
    let body = command_form(text, user, &format!("{}/hooks/{hook_name}", demo.slack_url));
    let ts = unix_now();
    reqwest::Client::new()
        .post(format!("{}/slack/commands", demo.steward_url))
        .header("content-type", "application/x-www-form-urlencoded")
        .header("x-slack-request-timestamp", ts.to_string())
        .header(
            "x-slack-signature",
            signature::sign(demo.signing_secret(), ts, body.as_bytes()),
        )
        .body(body)
        .send()
        .await
        .expect("Steward answers")
}

fn port_of(url: &str) -> u16 {
    url.rsplit(':').next().unwrap().parse().unwrap()
}

async fn refuses_connections(port: u16) -> bool {
    tokio::net::TcpStream::connect(SocketAddr::from(([127, 0, 0, 1], port)))
        .await
        .is_err()
}

#[tokio::test]
async fn the_demo_opens_on_a_digest_a_run_card_and_a_push_test_and_stops_cleanly() {
    let demo = start(None).await;
    assert_eq!(demo.store, "memory", "no Redis unless one is given");
    assert!(
        demo.opening.problems.is_empty(),
        "{:?}",
        demo.opening.problems
    );

    // The sweep's digest leads the hygiene channel, with its cases in the digest's thread.
    let sweep = demo
        .opening
        .sweep
        .clone()
        .expect("the opening sweep posted");
    assert_eq!(sweep.channel, HYGIENE_CHANNEL);
    assert_eq!(sweep.fleet, 40);
    assert!(sweep.cases_opened >= 10, "{sweep:?}");
    // The demo's `list_from` makes the opening sweep the list decision a large fleet gets.
    assert!(sweep.list.is_some(), "a list decision: {sweep:?}");
    assert!(sweep.groups >= 4, "groups by owner and option: {sweep:?}");
    let calls = slack_calls(&demo).await;
    let digest = posted_in(&calls, HYGIENE_CHANNEL)
        .next()
        .expect("the hygiene channel has a message");
    assert!(
        digest.thread_ts.is_none(),
        "the digest is a top-level message"
    );
    assert!(
        visible_text(digest).contains("Fleet hygiene"),
        "{}",
        visible_text(digest)
    );
    // Its groups offer Approve group, Review individually and Exclude…; Pause groups and
    // Snapshot, then kill groups both.
    let list_messages: Vec<&Recorded> = posted_in(&calls, HYGIENE_CHANNEL)
        .filter(|c| {
            c.ts.as_deref() == Some(sweep.digest_ts.as_str())
                || c.thread_ts.as_deref() == Some(sweep.digest_ts.as_str())
        })
        .collect();
    let shown: String = list_messages.iter().map(|c| visible_text(c)).collect();
    for offered in [
        "Approve group",
        "Review individually",
        "Exclude…",
        "Pause",
        "Snapshot, then kill",
    ] {
        assert!(shown.contains(offered), "{offered} missing: {shown}");
    }
    assert!(
        !shown.contains("pause it?"),
        "no single cards before someone chooses to review a group: {shown}"
    );

    // The agent's run ends with a run card; the push test's run fails with the suite's code.
    assert!(demo.opening.run_id.is_some());
    assert_eq!(
        demo.opening.push_status,
        Some(202),
        "the webhook was accepted"
    );
    wait_until("the agent's run card", || async {
        posted_in(&slack_calls(&demo).await, RUNS_CHANNEL)
            .find(|c| visible_text(c).contains("Run succeeded"))
            .cloned()
    })
    .await;
    wait_until("the push test's failure", || async {
        let calls = slack_calls(&demo).await;
        calls
            .iter()
            .filter(|c| {
                c.method == "chat.postMessage"
                    && matches!(
                        c.channel.as_deref(),
                        Some(RUNS_CHANNEL | ENGINEERING_CHANNEL)
                    )
            })
            .find(|c| visible_text(c).contains("code 101"))
            .cloned()
    })
    .await;

    // A signed `/sandbox list` gets the fleet back through the response_url.
    let name = hook();
    let resp = command(&demo, REQUESTER.id, "list", &name).await;
    assert_eq!(resp.status(), 200);
    let listed = wait_until("the list in the response_url", || async {
        slack_calls(&demo)
            .await
            .into_iter()
            .find(|c| c.method == format!("hooks/{name}") && visible_text(c).contains("running"))
    })
    .await;
    let table = visible_text(&listed);
    assert!(table.contains("running in total"), "{table}");
    assert!(
        table.contains("ml-notebook"),
        "the story fleet's templates show: {table}"
    );

    // An unsigned command is refused: the demo keeps Slack's rules.
    let unsigned = reqwest::Client::new()
        .post(format!("{}/slack/commands", demo.steward_url))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(command_form(
            "list",
            REQUESTER.id,
            "http://127.0.0.1:9/hooks/x",
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(unsigned.status(), 401);

    // Stopping closes every port and removes the scratch directory.
    let ports = [
        port_of(&demo.slack_url),
        port_of(&demo.steward_url),
        port_of(&demo.e2b_url),
        port_of(&demo.envd_url),
    ];
    let scratch = demo.scratch_dir().to_owned();
    assert!(scratch.join("steward.toml").exists());
    demo.stop().await.expect("Steward stops cleanly");
    for port in ports {
        eventually(&format!("port {port} is closed"), || {
            refuses_connections(port)
        })
        .await;
    }
    assert!(!scratch.exists(), "the scratch directory is removed");
}

#[tokio::test]
async fn with_a_redis_url_the_demo_keeps_its_state_in_redis() {
    let demo = start(Some(redis_url())).await;
    assert_eq!(demo.store, "redis");
    let prefix = demo
        .redis_prefix
        .clone()
        .expect("the demo names its key prefix");
    let _cleanup = PrefixCleanup {
        url: redis_url(),
        prefix: prefix.clone(),
    };
    let mut conn = redis::Client::open(redis_url())
        .unwrap()
        .get_connection()
        .unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}:*"))
        .query(&mut conn)
        .unwrap();
    assert!(!keys.is_empty(), "the sweep's cases are in Redis");
    assert!(demo.opening.sweep.is_some(), "{:?}", demo.opening.problems);
    demo.stop().await.expect("Steward stops cleanly");
}

#[tokio::test]
async fn an_unreachable_redis_or_a_busy_port_is_a_sentence_and_leaves_nothing_running() {
    sandbox_steward::telemetry::init("error");
    let parent = tempfile::tempdir().unwrap();
    let err = demo::start(DemoOptions {
        port: 0,
        redis_url: Some(SecretString::from("redis://127.0.0.1:1".to_owned())),
        scratch_in: Some(parent.path().to_owned()),
        ..DemoOptions::default()
    })
    .await
    .expect_err("no Redis answers on port 1");
    let text = format!("{err:#}");
    assert!(text.contains("Redis does not answer"), "{text}");
    assert!(
        !text.contains("redis://"),
        "the URL may hold a password: {text}"
    );

    let busy = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = busy.local_addr().unwrap().port();
    let err = demo::start(DemoOptions {
        port,
        scratch_in: Some(parent.path().to_owned()),
        ..DemoOptions::default()
    })
    .await
    .expect_err("the page's port is taken");
    assert!(
        format!("{err:#}").contains(&format!("port {port} is in use")),
        "{err:#}"
    );
    // Neither attempt left its scratch directory behind.
    let left: Vec<_> = std::fs::read_dir(parent.path()).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
}

/// Every ack the Slack simulator read on its Socket Mode connections, oldest first.
async fn socket_acks(demo: &DemoHandle) -> Vec<Value> {
    serde_json::from_value(crate::common::sim_socket_get(&demo.slack_url, "acks").await)
        .expect("acks are a list")
}

/// `/sandbox <text>` typed on the simulator's page by `user` in `channel`.
async fn type_on_page(demo: &DemoHandle, user: &str, channel: &str, text: &str) -> Value {
    let resp = reqwest::Client::new()
        .post(format!("{}/_sim/act/command", demo.slack_url))
        .json(&json!({"user": user, "channel": channel, "text": text}))
        .send()
        .await
        .expect("the Slack simulator answers");
    let status = resp.status();
    let body: Value = resp.json().await.expect("the page's answer is JSON");
    assert_eq!(status, 200, "{body}");
    body
}

#[tokio::test]
async fn with_socket_mode_steward_is_connected_and_the_pages_commands_travel_over_the_socket() {
    sandbox_steward::telemetry::init("error");
    let demo = demo::start(DemoOptions {
        port: 0,
        socket_mode: true,
        ..DemoOptions::default()
    })
    .await
    .expect("the demo starts in Socket Mode");
    assert!(demo.socket_mode);
    assert!(
        !format!("{demo:?}").contains("xapp-"),
        "the app token is never printed: {demo:?}"
    );
    // The opening goes to Steward's own HTTP API and webhook, as without the flag.
    assert!(
        demo.opening.problems.is_empty(),
        "{:?}",
        demo.opening.problems
    );
    assert!(demo.opening.sweep.is_some());
    assert_eq!(demo.opening.push_status, Some(202));

    // Connected when `start` returned: readiness is the socket's, and the page takes actions.
    let ready = reqwest::get(format!("{}/readyz", demo.steward_url))
        .await
        .expect("Steward answers");
    assert_eq!(ready.status(), 200);
    let ready: Value = ready.json().await.unwrap();
    assert_eq!(ready["checks"]["slack_socket"], "ok", "{ready}");
    let world = crate::common::get_json(&format!("{}/_sim/world", demo.slack_url)).await;
    assert_eq!(world["interactive"], true, "the page takes actions");

    // dana types `/sandbox help` in #approvals: the help comes back as the ack's payload.
    let acked_before = socket_acks(&demo).await.len();
    let typed = type_on_page(&demo, REQUESTER.id, APPROVALS_CHANNEL, "/sandbox help").await;
    assert_eq!(typed["shown"], "ephemeral", "{typed}");
    let acks = socket_acks(&demo).await;
    let help = acks[acked_before..]
        .iter()
        .find(|a| a["payload"].is_object())
        .unwrap_or_else(|| panic!("no ack carried the help: {acks:?}"));
    assert_eq!(help["known"], true, "{help}");
    assert!(
        visible_json_text(&help["payload"]).contains("/sandbox"),
        "{help}"
    );

    // `/sandbox list` is acknowledged over the socket and answered through its response_url.
    let acked_before = socket_acks(&demo).await.len();
    type_on_page(&demo, REQUESTER.id, APPROVALS_CHANNEL, "/sandbox list").await;
    assert!(
        socket_acks(&demo).await.len() > acked_before,
        "the command came over the socket"
    );
    let listed = wait_until("the list in the response_url", || async {
        slack_calls(&demo).await.into_iter().find(|c| {
            c.method.starts_with("hooks/") && visible_text(c).contains("running in total")
        })
    })
    .await;
    assert!(visible_text(&listed).contains("ml-notebook"));

    demo.stop().await.expect("Steward stops cleanly");
}

/// The commands the demo's banner prints run as printed, from the clone, with the binary named
/// as a person's shell finds it: after `cargo build` (no `steward` on PATH) that is
/// `./target/debug/steward`, not a bare `steward` the shell would not find.
#[tokio::test]
async fn the_commands_the_demo_prints_run_as_printed_from_the_clone() {
    use sandbox_steward::cli::demo::{banner, commands, program_name};
    let clone = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let exe = std::path::Path::new(env!("CARGO_BIN_EXE_steward"));
    // The PATH of a fresh clone's shell: the system's, without any installed steward.
    let path = std::env::join_paths(["/usr/local/bin", "/usr/bin", "/bin"]).unwrap();
    let program = program_name(exe, Some(&path), clone);
    assert!(
        program.starts_with("./target/") && program.ends_with("/steward"),
        "a path the shell finds from the clone: {program}"
    );

    let demo = start(None).await;
    let printed = banner(&demo, &program);
    let commands = commands(&demo, &program);
    assert!(!commands.is_empty());
    for command in &commands {
        assert!(printed.contains(command.as_str()), "{printed}");
        let out = tokio::process::Command::new("sh")
            .arg("-c")
            .arg(command)
            .current_dir(clone)
            .env("PATH", &path)
            .output()
            .await
            .expect("sh runs");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("hi"),
            "`{command}` as printed: {:?}\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // Typed as the banner said before: a shell without an installed steward cannot run it.
    let bare = commands[0].replace(&program, "steward");
    let out = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(&bare)
        .current_dir(clone)
        .env("PATH", &path)
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(127), "command not found: {bare}");
    demo.stop().await.expect("the demo stops cleanly");
}
