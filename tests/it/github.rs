//! The GitHub intake over HTTP: signed webhook deliveries to a Steward whose E2B simulator runs
//! commands locally, against a real Git repository the test makes on disk (cloned through the
//! entry's `clone_url`). Pushes run the entry's command at the pushed sha; everything else is
//! answered without running anything, and the clone token shows up nowhere.
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use reqwest::StatusCode;
use sandbox_steward::github::signature::sign;
use sandbox_steward::ids::RunId;
use sandbox_steward::runs::{RunRequest, RunStatus, Runner};
use serde_json::{Value, json};

use crate::common::{TestApp, TestAppOptions, spawn_app_with};

pub(crate) const OLD_SECRET: &str = "old-webhook-secret";
pub(crate) const NEW_SECRET: &str = "new-webhook-secret";
pub(crate) const TOKEN: &str = "ghp_NeverShowThisToken1234567890";
pub(crate) const REPO: &str = "acme/api";

/// The suite: says which commit it tests; hangs while a `slow` file exists; fails like pytest
/// (after 150 lines of noise) while a `fail` file exists.
const CHECK_SH: &str = r#"echo "tests ran at $(git rev-parse HEAD)"
if [ -f slow ]; then echo started-slow; sleep 120; fi
if [ -f fail ]; then
  i=0; while [ $i -lt 150 ]; do echo "collecting tests/test_$i.py ok"; i=$((i+1)); done
  echo "=================================== FAILURES ==================================="
  echo "______________________________ test_parse_nested ______________________________"
  echo "E   AssertionError: assert [1, [2]] == [1, [2, 3]]"
  echo "tests/test_parser.py:12: AssertionError"
  echo "=========================== short test summary info ==========================="
  echo "FAILED tests/test_parser.py::test_parse_nested - AssertionError: assert [1, [2]] == [1, [2, 3]]"
  echo "========================= 1 failed, 150 passed in 0.12s ========================="
  exit 1
fi
"#;

/// A repository with one commit; returns its path and the commit's sha.
pub(crate) fn make_repo(dir: &Path) -> (String, String) {
    let repo = dir.join("origin");
    std::fs::create_dir_all(&repo).unwrap();
    let git = |args: &[&str]| {
        let out = Command::new("git")
            .args(["-c", "user.name=Test", "-c", "user.email=test@example.com"])
            .args(args)
            .current_dir(&repo)
            .output()
            .expect("git runs");
        assert!(out.status.success(), "git {args:?}: {out:?}");
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    };
    git(&["init", "-q", "-b", "main"]);
    std::fs::write(repo.join("check.sh"), CHECK_SH).unwrap();
    git(&["add", "check.sh"]);
    git(&["commit", "-q", "-m", "Add the check"]);
    (
        repo.to_string_lossy().into_owned(),
        git(&["rev-parse", "HEAD"]),
    )
}

/// Adds a commit to the repository at `path`; returns its sha.
pub(crate) fn commit(path: &str, file: &str) -> String {
    std::fs::write(Path::new(path).join(file), file).unwrap();
    let git = |args: &[&str]| {
        let out = Command::new("git")
            .args(["-c", "user.name=Test", "-c", "user.email=test@example.com"])
            .args(args)
            .current_dir(path)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    };
    git(&["add", file]);
    git(&["commit", "-q", "-m", "More"]);
    git(&["rev-parse", "HEAD"])
}

pub(crate) fn policy(clone_url: &str) -> String {
    format!(
        r#"
[[push_tests]]
repository = "{REPO}"
branches = ["main", "release/*"]
template = "base"
command = 'echo "token: ${{STEWARD_GIT_TOKEN:-unset}}"; echo "suite=$SUITE"; sh check.sh'
env = {{ SUITE = "unit" }}
timeout = "2m"
channel = "C0ENG"
clone_url = "file://{clone_url}"
ignore_paths = ["docs/**", "*.md"]
authors = {{ "alice@example.com" = "U0ALICE", "bob-gh" = "U0BOB" }}

[[push_tests]]
repository = "{REPO}"
branches = ["legacy"]
template = "retired-template"
command = "sh check.sh"
channel = "C0ENG"
clone_url = "file://{clone_url}"

[approvals.approvers]
kill = {{ users = ["U0LEAD"] }}
pause = {{ anyone = true }}
"#
    )
}

pub(crate) async fn spawn(clone_url: &str) -> TestApp {
    spawn_with(clone_url, "").await
}

/// [`spawn`], with more of steward.toml (a `[github]` table, say) after the usual entries.
pub(crate) async fn spawn_with(clone_url: &str, more_toml: &str) -> TestApp {
    spawn_app_with(TestAppOptions {
        exec_local: true,
        policy: Some(format!("{more_toml}\n{}", policy(clone_url))),
        env: vec![
            (
                "GITHUB_WEBHOOK_SECRET".into(),
                format!("{OLD_SECRET},{NEW_SECRET}"),
            ),
            ("GITHUB_TOKEN".into(), TOKEN.into()),
        ],
        ..TestAppOptions::default()
    })
    .await
}

pub(crate) fn push_body(git_ref: &str, sha: &str, files: &[&str]) -> Value {
    json!({
        "ref": git_ref,
        "before": "0".repeat(40),
        "after": sha,
        "deleted": false,
        "compare": format!("https://github.com/{REPO}/compare/x...{sha}"),
        "repository": {"full_name": REPO, "clone_url": format!("https://github.com/{REPO}.git")},
        "pusher": {"name": "bob-gh", "email": "bob@example.com"},
        "sender": {"login": "bob-gh"},
        "commits": [{"id": sha, "message": "Fix the parser", "modified": files}],
        "head_commit": {
            "id": sha, "message": "Fix the parser",
            "url": format!("https://github.com/{REPO}/commit/{sha}"),
            "author": {"name": "Alice", "email": "alice@example.com", "username": "alice-gh"},
            "modified": files,
        },
    })
}

pub(crate) async fn deliver(
    app: &TestApp,
    event: &str,
    delivery: &str,
    body: &[u8],
    secret: Option<&str>,
) -> reqwest::Response {
    let mut req = app
        .http
        .post(app.url("/github/webhook"))
        .header("content-type", "application/json")
        .header("x-github-event", event)
        .header("x-github-delivery", delivery)
        .body(body.to_vec());
    if let Some(secret) = secret {
        req = req.header("x-hub-signature-256", sign(secret, body));
    }
    req.send().await.unwrap()
}

pub(crate) async fn push(app: &TestApp, delivery: &str, body: &Value) -> reqwest::Response {
    deliver(
        app,
        "push",
        delivery,
        body.to_string().as_bytes(),
        Some(OLD_SECRET),
    )
    .await
}

pub(crate) fn runner(app: &TestApp) -> Runner {
    app.state.runs.clone().expect("E2B is configured")
}

pub(crate) async fn output_of(app: &TestApp, id: &RunId) -> String {
    let chunk = runner(app).output(id, 0).await.unwrap();
    String::from_utf8_lossy(&chunk.bytes).into_owned()
}

pub(crate) async fn audit_outcomes(app: &TestApp) -> Vec<String> {
    app.state
        .store
        .audit_since(chrono::Utc::now() - chrono::Duration::hours(1))
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.action == format!("push:{REPO}"))
        .map(|e| e.outcome)
        .collect()
}

pub(crate) async fn creates(app: &TestApp) -> u64 {
    app.e2b.hooks().calls_of("create").await.unwrap()
}

/// Every value under the app's Redis prefix, as text.
pub(crate) fn redis_dump(app: &TestApp) -> String {
    let client = redis::Client::open(app.redis_url.as_str()).unwrap();
    let mut conn = client.get_connection().unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{}:*", app.redis_prefix))
        .query(&mut conn)
        .unwrap();
    let mut all = String::new();
    for key in keys {
        let kind: String = redis::cmd("TYPE").arg(&key).query(&mut conn).unwrap();
        let value: redis::Value = match kind.as_str() {
            "string" => redis::cmd("GET").arg(&key).query(&mut conn).unwrap(),
            "hash" => redis::cmd("HGETALL").arg(&key).query(&mut conn).unwrap(),
            "stream" => redis::cmd("XRANGE")
                .arg(&key)
                .arg("-")
                .arg("+")
                .query(&mut conn)
                .unwrap(),
            "zset" => redis::cmd("ZRANGE")
                .arg(&key)
                .arg(0)
                .arg(-1)
                .query(&mut conn)
                .unwrap(),
            "list" => redis::cmd("LRANGE")
                .arg(&key)
                .arg(0)
                .arg(-1)
                .query(&mut conn)
                .unwrap(),
            "set" => redis::cmd("SMEMBERS").arg(&key).query(&mut conn).unwrap(),
            _ => redis::Value::Nil,
        };
        all.push_str(&format!("{key} = {}\n", text_of(&value)));
    }
    all
}

fn text_of(value: &redis::Value) -> String {
    match value {
        redis::Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        redis::Value::Array(items) | redis::Value::Set(items) => {
            items.iter().map(text_of).collect::<Vec<_>>().join(" ")
        }
        redis::Value::Map(pairs) => pairs
            .iter()
            .map(|(k, v)| format!("{} {}", text_of(k), text_of(v)))
            .collect::<Vec<_>>()
            .join(" "),
        other => format!("{other:?}"),
    }
}

#[tokio::test]
async fn a_ping_is_answered_with_githubs_zen_and_a_rotated_secret_is_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let (origin, _) = make_repo(dir.path());
    let app = spawn(&origin).await;
    let body = br#"{"zen":"Keep it logically awesome.","hook_id":1}"#;
    for secret in [OLD_SECRET, NEW_SECRET] {
        let resp = deliver(&app, "ping", "p-1", body, Some(secret)).await;
        assert_eq!(resp.status(), StatusCode::OK);
        let v: Value = resp.json().await.unwrap();
        assert_eq!(v, json!({"ok": true, "zen": "Keep it logically awesome."}));
    }
    let other = deliver(&app, "issues", "i-1", b"{}", Some(NEW_SECRET)).await;
    assert_eq!(other.status(), StatusCode::NO_CONTENT);
}

#[tokio::test]
async fn a_push_runs_the_command_at_the_pushed_sha_and_the_token_shows_up_nowhere() {
    let dir = tempfile::tempdir().unwrap();
    let (origin, first) = make_repo(dir.path());
    let sha = commit(&origin, "src.txt");
    assert_ne!(first, sha);
    let app = spawn(&origin).await;

    let resp = push(
        &app,
        "d-run",
        &push_body("refs/heads/main", &sha, &["src.txt"]),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    let started: Value = resp.json().await.unwrap();
    let id = RunId::parse(started["run"].as_str().unwrap()).unwrap();

    let run = runner(&app)
        .wait(&id, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(run.status, RunStatus::Finished, "{run:?}");
    assert_eq!(run.exit_code, Some(0), "{}", output_of(&app, &id).await);
    assert_eq!(run.requester, format!("github:{REPO}"));
    let output = output_of(&app, &id).await;
    assert!(output.contains(&format!("tests ran at {sha}")), "{output}");
    assert!(
        output.contains("token: unset"),
        "the entry's command never sees the token: {output}"
    );
    assert!(output.contains("suite=unit"), "{output}");

    let test = app
        .state
        .store
        .push_test_for_run(&id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(test.repository, REPO);
    assert_eq!(test.branch, "main");
    assert_eq!(test.after, sha);
    assert_eq!(test.message.as_deref(), Some("Fix the parser"));
    assert_eq!(test.pusher.as_deref(), Some("bob-gh"));
    assert_eq!(test.author_email.as_deref(), Some("alice@example.com"));
    let users: Vec<&str> = test.slack_users.iter().map(|u| u.as_str()).collect();
    assert_eq!(users, ["U0ALICE", "U0BOB"]);
    assert_eq!(test.channel.as_deref(), Some("C0ENG"));

    let audit = audit_outcomes(&app).await;
    assert!(
        audit
            .iter()
            .any(|o| o.starts_with(&format!("started run {id}"))),
        "{audit:?}"
    );

    // Once the run has ended and been handed over, nothing stored or posted holds the token.
    crate::common::eventually("the run is handed over", || async {
        runner(&app).get(&id).await.unwrap().handed_over
    })
    .await;
    assert!(!run.command.contains(TOKEN));
    let dump = redis_dump(&app);
    assert!(dump.contains(&sha), "the dump reads the prefix's values");
    assert!(
        !dump.contains(TOKEN),
        "the token is stored in Redis:\n{dump}"
    );
    let posted = format!("{:?}", app.slack.messages());
    assert!(!posted.contains(TOKEN), "{posted}");
}

#[tokio::test]
async fn a_forged_or_missing_signature_is_refused_and_runs_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (origin, sha) = make_repo(dir.path());
    let app = spawn(&origin).await;
    let body = push_body("refs/heads/main", &sha, &["a.rs"]).to_string();
    for secret in [Some("not-the-secret"), None] {
        let resp = deliver(&app, "push", "d-forged", body.as_bytes(), secret).await;
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
        let v: Value = resp.json().await.unwrap();
        assert_eq!(v["ok"], false);
        assert!(
            v["error"].as_str().unwrap().contains("X-Hub-Signature-256"),
            "{v}"
        );
    }
    assert_eq!(creates(&app).await, 0);
    assert!(audit_outcomes(&app).await.is_empty());
    // The refused delivery id was not remembered: the genuine delivery is acted on.
    let resp = push(
        &app,
        "d-forged",
        &push_body("refs/heads/main", &sha, &["a.rs"]),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
}

/// A flood of mis-signed deliveries is refused every time and costs one warning in the log, not
/// one each (`steward serve` as a process at the default log level, so its log is its own).
#[tokio::test]
async fn a_flood_of_mis_signed_deliveries_is_refused_each_time_and_logged_as_one_warning() {
    let serve = crate::common::serve_process(&[("GITHUB_WEBHOOK_SECRET", OLD_SECRET)]).await;
    let http = reqwest::Client::new();
    let body = push_body("refs/heads/main", &"a".repeat(40), &["a.rs"]).to_string();
    for n in 0..100 {
        let resp = http
            .post(serve.url("/github/webhook"))
            .header("content-type", "application/json")
            .header("x-github-event", "push")
            .header("x-github-delivery", format!("d-flood-{n}"))
            .header(
                "x-hub-signature-256",
                sign("not-the-secret", body.as_bytes()),
            )
            .body(body.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED, "delivery {n}");
    }
    // Every refusal was logged (or not) before its answer was sent.
    let log = serve.stop().await;
    let lines: Vec<&str> = log.lines().filter(|l| l.contains("refused")).collect();
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert!(lines[0].contains("WARN"), "{}", lines[0]);
    assert!(!log.contains(OLD_SECRET), "{log}");
}

#[tokio::test]
async fn a_redelivery_is_handled_once() {
    let dir = tempfile::tempdir().unwrap();
    let (origin, sha) = make_repo(dir.path());
    let app = spawn(&origin).await;
    let body = push_body("refs/heads/main", &sha, &["a.rs"]);
    assert_eq!(
        push(&app, "d-twice", &body).await.status(),
        StatusCode::ACCEPTED
    );
    let again = push(&app, "d-twice", &body).await;
    assert_eq!(again.status(), StatusCode::OK);
    let v: Value = again.json().await.unwrap();
    assert_eq!(v["message"], "already handled");
    let audit = audit_outcomes(&app).await;
    assert_eq!(
        audit
            .iter()
            .filter(|o| o.starts_with("started run"))
            .count(),
        1,
        "{audit:?}"
    );
    assert!(
        audit.iter().any(|o| o.starts_with("already handled")),
        "{audit:?}"
    );
}

#[tokio::test]
async fn tags_deletes_other_branches_unknown_repositories_and_ignored_paths_run_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (origin, sha) = make_repo(dir.path());
    let app = spawn(&origin).await;
    let mut deleted = push_body("refs/heads/main", &"0".repeat(40), &[]);
    deleted["deleted"] = json!(true);
    let mut unknown = push_body("refs/heads/main", &sha, &["a.rs"]);
    unknown["repository"]["full_name"] = json!("acme/other");
    let cases = [
        (
            "d-tag",
            push_body("refs/tags/v1.0", &sha, &["a.rs"]),
            "tag v1.0",
        ),
        ("d-del", deleted, "was deleted"),
        (
            "d-branch",
            push_body("refs/heads/feature/x", &sha, &["a.rs"]),
            "feature/x",
        ),
        (
            "d-docs",
            push_body("refs/heads/main", &sha, &["docs/a/b.txt", "README.md"]),
            "ignore_paths",
        ),
        ("d-repo", unknown, "acme/other"),
    ];
    for (delivery, body, _) in &cases {
        let resp = push(&app, delivery, body).await;
        assert_eq!(resp.status(), StatusCode::NO_CONTENT, "{delivery}");
    }
    assert_eq!(creates(&app).await, 0);
    let audit = audit_outcomes(&app).await;
    let all_audit = app
        .state
        .store
        .audit_since(chrono::Utc::now() - chrono::Duration::hours(1))
        .await
        .unwrap();
    for (delivery, _, reason) in &cases {
        assert!(
            all_audit
                .iter()
                .any(|e| e.outcome.starts_with("ignored") && e.outcome.contains(reason)),
            "{delivery}: {audit:?}"
        );
    }
}

#[tokio::test]
async fn a_body_over_25_mib_is_refused_with_413() {
    let dir = tempfile::tempdir().unwrap();
    let (origin, _) = make_repo(dir.path());
    let app = spawn(&origin).await;
    let body = vec![b' '; 26 * 1024 * 1024];
    let resp = deliver(&app, "push", "d-big", &body, Some(OLD_SECRET)).await;
    assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(creates(&app).await, 0);
}

#[tokio::test]
async fn a_newer_push_to_the_same_branch_supersedes_and_stops_the_older_run() {
    let dir = tempfile::tempdir().unwrap();
    let (origin, quick) = make_repo(dir.path());
    // The older push's suite hangs (sleeps) until it is stopped.
    let slow = commit(&origin, "slow");
    let app = spawn(&origin).await;
    let one: Value = push(&app, "d-1", &push_body("refs/heads/main", &slow, &["slow"]))
        .await
        .json()
        .await
        .unwrap();
    let older = RunId::parse(one["run"].as_str().unwrap()).unwrap();
    crate::common::eventually("the older suite is running", || async {
        output_of(&app, &older).await.contains("started-slow")
    })
    .await;

    let two: Value = push(
        &app,
        "d-2",
        &push_body("refs/heads/main", &quick, &["check.sh"]),
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(two["supersedes"], one["run"]);
    let newer = RunId::parse(two["run"].as_str().unwrap()).unwrap();
    let store = &app.state.store;
    assert_eq!(
        store.run_stop_requested(&older).await.unwrap(),
        Some(format!("superseded by {quick}"))
    );
    assert_eq!(store.run_stop_requested(&newer).await.unwrap(), None);

    let stopped = runner(&app)
        .wait(&older, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(stopped.status, RunStatus::Failed, "{stopped:?}");
    assert_eq!(stopped.error, Some(format!("superseded by {quick}")));
    let done = runner(&app)
        .wait(&newer, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(done.exit_code, Some(0), "{done:?}");
    let audit = audit_outcomes(&app).await;
    assert!(
        audit
            .iter()
            .any(|o| o.contains(&format!("supersedes run {older}"))),
        "{audit:?}"
    );
}

/// A push body moving `main` from `before` to `after`, its head commit made at `at`.
fn moving(before: &str, after: &str, at: &str) -> Value {
    let mut body = push_body("refs/heads/main", after, &["a"]);
    body["before"] = Value::from(before);
    body["head_commit"]["timestamp"] = Value::from(at);
    body
}

#[tokio::test]
async fn a_replayed_or_older_push_is_refused_and_never_supersedes_a_newer_commits_run() {
    let dir = tempfile::tempdir().unwrap();
    let (origin, first) = make_repo(dir.path());
    // `aside` is made beside main, an hour earlier than the others; `slow` hangs until stopped.
    let git = |args: &[&str]| {
        let ok = Command::new("git")
            .args(args)
            .current_dir(&origin)
            .status()
            .unwrap();
        assert!(ok.success(), "git {args:?}");
    };
    git(&["checkout", "-q", "-b", "aside", &first]);
    let aside = commit(&origin, "b");
    git(&["checkout", "-q", "main"]);
    let slow = commit(&origin, "slow");
    let app = spawn(&origin).await;
    let zero = "0".repeat(40);

    let one_body = moving(&zero, &first, "2026-12-01T10:00:00+01:00");
    let one: Value = push(&app, "d-1", &one_body).await.json().await.unwrap();
    let one_run = RunId::parse(one["run"].as_str().unwrap()).unwrap();
    runner(&app)
        .wait(&one_run, Duration::from_secs(60))
        .await
        .unwrap();
    let two: Value = push(
        &app,
        "d-2",
        &moving(&first, &slow, "2026-12-01T11:00:00+01:00"),
    )
    .await
    .json()
    .await
    .unwrap();
    let newest = RunId::parse(two["run"].as_str().unwrap()).unwrap();
    crate::common::eventually("the newest suite is running", || async {
        output_of(&app, &newest).await.contains("started-slow")
    })
    .await;

    // The first push's signed body again, under a new delivery id: a replay.
    let replay = push(&app, "d-3", &one_body).await;
    assert_eq!(replay.status(), StatusCode::OK);
    let replay: Value = replay.json().await.unwrap();
    assert_eq!(replay["ok"], false, "{replay}");
    assert!(
        replay["refused"].as_str().unwrap().contains("replay"),
        "{replay}"
    );
    // A push that does not follow the newest and whose commit is older.
    let stale: Value = push(
        &app,
        "d-4",
        &moving(&"1".repeat(40), &aside, "2026-12-01T09:00:00Z"),
    )
    .await
    .json()
    .await
    .unwrap();
    assert!(
        stale["refused"]
            .as_str()
            .unwrap()
            .contains("older than the branch's newest push"),
        "{stale}"
    );
    // Neither stopped the newest run nor started anything.
    let store = &app.state.store;
    assert_eq!(store.run_stop_requested(&newest).await.unwrap(), None);
    assert_eq!(
        store.latest_push_run(REPO, "main").await.unwrap(),
        Some(newest.clone())
    );
    assert_eq!(creates(&app).await, 2);
    let audit = audit_outcomes(&app).await;
    assert!(
        audit
            .iter()
            .any(|o| o.starts_with("refused:") && o.contains("delivery d-3")),
        "{audit:?}"
    );
    assert!(
        audit
            .iter()
            .any(|o| o.starts_with("refused:") && o.contains("delivery d-4")),
        "{audit:?}"
    );

    // A force push back to the first commit follows the newest: it is new, and it supersedes.
    let back: Value = push(
        &app,
        "d-5",
        &moving(&slow, &first, "2026-12-01T10:00:00+01:00"),
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(back["supersedes"], two["run"], "{back}");
    assert_eq!(
        store.run_stop_requested(&newest).await.unwrap(),
        Some(format!("superseded by {first}"))
    );
}

#[tokio::test]
async fn a_commit_that_cannot_be_fetched_ends_with_the_clone_failure_code() {
    let dir = tempfile::tempdir().unwrap();
    let (origin, _) = make_repo(dir.path());
    let app = spawn(&origin).await;
    let missing = "f".repeat(40);
    let resp = push(
        &app,
        "d-missing",
        &push_body("refs/heads/main", &missing, &["a"]),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    let started: Value = resp.json().await.unwrap();
    let id = RunId::parse(started["run"].as_str().unwrap()).unwrap();
    let run = runner(&app)
        .wait(&id, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(
        run.exit_code,
        Some(sandbox_steward::github::CLONE_FAILED_EXIT_CODE),
        "{run:?}"
    );
    let output = output_of(&app, &id).await;
    assert!(
        output.contains(sandbox_steward::github::plan::CLONE_FAILED_MARKER),
        "{output}"
    );
    assert!(!output.contains("tests ran"), "{output}");
}

#[tokio::test]
async fn secret_env_values_are_scrubbed_from_a_runs_output() {
    let dir = tempfile::tempdir().unwrap();
    let (origin, _) = make_repo(dir.path());
    let app = spawn(&origin).await;
    let run = runner(&app)
        .submit(
            "test",
            RunRequest {
                template: "base".into(),
                command: "printf 'key=%s\\n' \"$KEY\"; printf '%s' \"$KEY\" | cut -c1-5".into(),
                files: Vec::new(),
                env: [("KEY".to_owned(), TOKEN.to_owned())].into(),
                cwd: None,
                timeout: None,
                secret_env: Some(vec!["KEY".into()]),
                setup: None,
            },
        )
        .await
        .unwrap();
    let done = runner(&app)
        .wait(&run.id, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(done.exit_code, Some(0), "{done:?}");
    let output = output_of(&app, &run.id).await;
    assert!(output.contains("key=[scrubbed]"), "{output}");
    assert!(!output.contains(TOKEN), "{output}");
}
