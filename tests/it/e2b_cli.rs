//! The built `steward e2b` binary against the E2B simulator: tables, `--json`, plain-sentence
//! errors, and the confirmation that guards irreversible actions.
use std::process::Stdio;

use sandbox_steward::sim::e2b::{SimHooks, SimOptions, SimServer};
use serde_json::{Value, json};

const KEY: &str = "e2b_0123456789abcdef";

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}\nstderr: {}", self.stdout, self.stderr))
    }
}

struct Cli {
    sim: SimServer,
    hooks: SimHooks,
}

async fn start(sandboxes: usize) -> Cli {
    let sim = SimServer::start(SimOptions {
        sandboxes,
        api_key: Some(KEY.to_owned()),
        ..SimOptions::default()
    })
    .await
    .expect("simulator starts");
    Cli {
        hooks: sim.hooks(),
        sim,
    }
}

impl Cli {
    /// Runs `steward e2b ARGS` with no terminal on stdin and only the E2B variables we set.
    async fn run(&self, args: &[&str]) -> Run {
        self.run_with(args, &[]).await
    }

    /// [`Cli::run`] with extra environment variables.
    async fn run_with(&self, args: &[&str], env: &[(&str, &str)]) -> Run {
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_steward"))
            .arg("e2b")
            .args(args)
            .env_remove("E2B_WEBHOOK_SECRET")
            .envs(env.iter().copied())
            .env_remove("E2B_API_KEY")
            .env_remove("E2B_TEAM_ID")
            .env_remove("E2B_REQUEST_TIMEOUT")
            .env("E2B_API_URL", self.sim.base_url())
            .env("E2B_API_KEY", KEY)
            .env("E2B_PROJECT_ID", self.sim.team_id())
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .output()
            .await
            .expect("steward runs");
        Run {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// Runs `steward e2b ARGS` on a pseudo-terminal (util-linux `script`), typing `typed` and
    /// Enter at it; returns everything the terminal showed.
    async fn run_at_terminal(&self, args: &[&str], typed: &str) -> Run {
        use tokio::io::AsyncWriteExt;
        let command = std::iter::once(env!("CARGO_BIN_EXE_steward").to_owned())
            .chain(std::iter::once("e2b".to_owned()))
            .chain(args.iter().map(|a| a.to_string()))
            .map(|a| format!("'{a}'"))
            .collect::<Vec<_>>()
            .join(" ");
        let mut child = tokio::process::Command::new("script")
            .args(["-qec", &command, "/dev/null"])
            .env_remove("E2B_TEAM_ID")
            .env_remove("E2B_REQUEST_TIMEOUT")
            .env("E2B_API_URL", self.sim.base_url())
            .env("E2B_API_KEY", KEY)
            .env("E2B_PROJECT_ID", self.sim.team_id())
            .env("RUST_LOG", "warn")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("util-linux `script` is installed");
        // The terminal keeps the line until the confirmation prompt reads it.
        let mut stdin = child.stdin.take().unwrap();
        stdin
            .write_all(format!("{typed}\n").as_bytes())
            .await
            .unwrap();
        let out =
            tokio::time::timeout(std::time::Duration::from_secs(30), child.wait_with_output())
                .await
                .expect("steward answered at the terminal")
                .unwrap();
        drop(stdin);
        Run {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    async fn calls(&self, op: &str) -> u64 {
        self.hooks.calls_of(op).await.unwrap()
    }

    async fn seed(&self, state: &str) -> String {
        let v = self
            .hooks
            .seed(json!({"templateID": "base", "state": state, "metadata": {"owner": "cli-test"}}))
            .await
            .unwrap();
        v["sandboxID"].as_str().unwrap().to_owned()
    }
}

#[tokio::test]
async fn list_prints_an_aligned_table_or_json() {
    let cli = start(12).await;
    let id = cli.seed("running").await;

    let table = cli.run(&["list"]).await;
    assert_eq!(table.code, 0, "{}", table.stderr);
    let header = table.stdout.lines().next().unwrap();
    assert!(header.starts_with("SANDBOX"), "{header}");
    assert!(header.contains("STATE") && header.contains("METADATA"));
    let row = table
        .stdout
        .lines()
        .find(|l| l.starts_with(&id))
        .unwrap_or_else(|| panic!("{id} missing from\n{}", table.stdout));
    assert!(
        row.contains("running") && row.contains("owner=cli-test"),
        "{row}"
    );
    // Columns line up: STATE starts at the same place in the header and in every row.
    let col = header.find("STATE").unwrap();
    assert_eq!(&row[col..col + 7], "running");

    let json = cli
        .run(&["list", "--json", "--metadata", "owner=cli-test"])
        .await;
    assert_eq!(json.code, 0, "{}", json.stderr);
    let v = json.json();
    let items = v["items"].as_array().unwrap();
    assert_eq!(items.len(), 1);
    assert_eq!(items[0]["sandboxID"], id.as_str());
    assert_eq!(items[0]["state"], "running");
    assert!(v["stopped"].is_null());
}

#[tokio::test]
async fn kill_without_yes_and_without_a_terminal_refuses_and_sends_nothing() {
    let cli = start(0).await;
    let id = cli.seed("running").await;

    let refused = cli.run(&["kill", &id]).await;
    assert_ne!(refused.code, 0);
    assert!(refused.stderr.contains("--yes"), "{}", refused.stderr);
    assert_eq!(cli.calls("kill").await, 0);

    let refused = cli.run(&["delete-template", "base"]).await;
    assert_ne!(refused.code, 0);
    assert_eq!(cli.calls("delete-template").await, 0);

    let killed = cli.run(&["kill", &id, "--yes", "--json"]).await;
    assert_eq!(killed.code, 0, "{}", killed.stderr);
    assert_eq!(killed.json()["ok"], true);
    assert_eq!(cli.calls("kill").await, 1);
}

#[tokio::test]
async fn errors_print_as_one_plain_sentence_and_exit_1() {
    let cli = start(0).await;
    let missing = cli.run(&["get", "nosuchsandbox"]).await;
    assert_eq!(missing.code, 1);
    assert!(missing.stdout.is_empty());
    assert!(
        missing.stderr.starts_with("E2B could not find it:"),
        "{}",
        missing.stderr
    );
    assert!(!missing.stderr.contains(KEY));

    let paused = cli.seed("paused").await;
    let conflict = cli.run(&["pause", &paused]).await;
    assert_eq!(conflict.code, 1);
    assert!(
        conflict.stderr.contains("current state"),
        "{}",
        conflict.stderr
    );
}

#[tokio::test]
async fn every_sandbox_action_runs_from_the_terminal() {
    let cli = start(5).await;

    let created = cli
        .run(&[
            "create",
            "base",
            "--timeout",
            "10m",
            "--metadata",
            "owner=cli",
            "--json",
        ])
        .await;
    assert_eq!(created.code, 0, "{}", created.stderr);
    let id = created.json()["sandboxID"].as_str().unwrap().to_owned();
    assert!(!created.stdout.contains("envdAccessToken"));

    let get = cli.run(&["get", &id]).await;
    assert_eq!(get.code, 0, "{}", get.stderr);
    assert!(get.stdout.contains("owner=cli"), "{}", get.stdout);

    // Reads, and writes that can be repeated, in both output modes.
    for args in [
        vec!["timeout", id.as_str(), "15m"],
        vec!["refresh", id.as_str(), "5m"],
        vec!["refresh", id.as_str()],
        vec!["logs", id.as_str(), "--level", "info", "--limit", "50"],
        vec![
            "logs",
            id.as_str(),
            "--forward",
            "--cursor",
            "1700000000000",
        ],
        vec!["metrics", id.as_str(), "--since", "2h"],
        vec!["metrics-many", id.as_str()],
        vec!["metrics-many", "--all"],
        vec!["team-metrics", "--since", "2h"],
        vec!["team-metrics", "--max", "concurrent"],
        vec!["team-metrics", "--max", "start-rate"],
        vec!["templates"],
        vec!["template", "base"],
        vec!["snapshots"],
    ] {
        let table = cli.run(&args).await;
        assert_eq!(table.code, 0, "{args:?}: {}", table.stderr);
        assert!(!table.stdout.is_empty(), "{args:?} printed nothing");
        let mut with_json = args.clone();
        with_json.push("--json");
        let json = cli.run(&with_json).await;
        assert_eq!(json.code, 0, "{with_json:?}: {}", json.stderr);
        json.json();
    }

    // State changes, each once, alternating output modes.
    let steps: [(&[&str], bool); 6] = [
        (&["pause", &id], false),
        (&["resume", &id, "--timeout", "5m"], true),
        (&["pause", &id, "--json"], true),
        (&["connect", &id, "--timeout", "5m"], false),
        (&["pause", &id], false),
        (&["connect", &id, "--json"], true),
    ];
    for (args, json) in steps {
        let mut args = args.to_vec();
        if json && !args.contains(&"--json") {
            args.push("--json");
        }
        let run = cli.run(&args).await;
        assert_eq!(run.code, 0, "{args:?}: {}", run.stderr);
        if json {
            run.json();
        }
    }
    assert_eq!(cli.calls("pause").await, 3);

    let snap = cli
        .run(&["snapshot", &id, "--name", "cli-snap", "--json"])
        .await;
    assert_eq!(snap.code, 0, "{}", snap.stderr);
    let snapshot_id = snap.json()["snapshotID"].as_str().unwrap().to_owned();
    let listed = cli.run(&["snapshots", "--sandbox", &id, "--json"]).await;
    assert!(listed.stdout.contains(&snapshot_id), "{}", listed.stdout);
    let deleted = cli.run(&["delete-template", &snapshot_id, "--yes"]).await;
    assert_eq!(deleted.code, 0, "{}", deleted.stderr);
    assert_eq!(cli.calls("delete-template").await, 1);

    let connect = cli.run(&["connect", &id, "--json"]).await;
    assert_eq!(connect.json()["resumed"], false, "it was already running");
}

#[tokio::test]
async fn endless_paging_is_stopped_and_reported() {
    let cli = start(10).await;
    cli.hooks.paging("endless").await.unwrap();
    let run = cli
        .run(&["list", "--limit", "2", "--max-pages", "3", "--json"])
        .await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(
        run.stderr
            .contains("paging was stopped after the cap of 3 pages"),
        "{}",
        run.stderr
    );
    let v = run.json();
    assert_eq!(v["pages"], 3);
    assert_eq!(v["stopped"]["pageCap"], 3);
    assert_eq!(cli.calls("list").await, 3);

    let one = cli
        .run(&["list", "--limit", "2", "--all-pages", "false"])
        .await;
    assert_eq!(one.code, 0, "{}", one.stderr);
    assert!(one.stdout.contains("--page-token"), "{}", one.stdout);
}

#[tokio::test]
async fn a_missing_api_key_is_explained() {
    let cli = start(0).await;
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_steward"))
        .args(["e2b", "list"])
        .env_remove("E2B_API_KEY")
        .env("E2B_API_URL", cli.sim.base_url())
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("E2B_API_KEY is not set"), "{stderr}");
    assert_eq!(cli.calls("list").await, 0);
}

/// docs/operations.md: `kill` and `delete-template` "ask you to type the id back".
#[tokio::test]
async fn kill_at_a_terminal_runs_only_when_the_id_is_typed_back() {
    let cli = start(0).await;
    let id = cli.seed("running").await;

    let wrong = cli.run_at_terminal(&["kill", &id], "not-the-id").await;
    assert!(
        wrong.stdout.contains("Type the id to confirm"),
        "{}",
        wrong.stdout
    );
    assert!(wrong.stdout.contains("does not match"), "{}", wrong.stdout);
    assert_ne!(wrong.code, 0);
    assert_eq!(
        cli.calls("kill").await,
        0,
        "nothing is sent on a wrong answer"
    );

    let right = cli.run_at_terminal(&["kill", &id], &id).await;
    assert_eq!(right.code, 0, "{}", right.stdout);
    assert_eq!(cli.calls("kill").await, 1);
    let gone = cli.run(&["get", &id]).await;
    assert_ne!(gone.code, 0, "{}", gone.stdout);
}

/// `list --steward`: only the sandboxes Steward started for runs and push tests, each naming
/// its run (and a push test's repository), none of the rest of the fleet.
#[tokio::test]
async fn list_steward_shows_only_stewards_run_sandboxes_with_their_run() {
    let cli = start(6).await;
    let other = cli.seed("running").await;
    let run = cli
        .hooks
        .seed(
            json!({"templateID": "base", "state": "running", "metadata": {
            "steward.run": "run_cli1", "steward.requester": "agent-a", "steward.purpose": "run"}}),
        )
        .await
        .unwrap()["sandboxID"]
        .as_str()
        .unwrap()
        .to_owned();
    let push = cli
        .hooks
        .seed(json!({"templateID": "base", "state": "paused", "metadata": {
            "steward.run": "run_cli2", "steward.requester": "github:acme/api", "steward.purpose": "run"}}))
        .await
        .unwrap()["sandboxID"]
        .as_str()
        .unwrap()
        .to_owned();

    let table = cli.run(&["list", "--steward"]).await;
    assert_eq!(table.code, 0, "{}", table.stderr);
    let lines: Vec<&str> = table.stdout.lines().collect();
    assert!(
        lines[0].starts_with("SANDBOX") && lines[0].contains("RUN"),
        "{}",
        lines[0]
    );
    assert_eq!(
        lines.iter().filter(|l| l.contains(" run")).count(),
        2,
        "two rows:\n{}",
        table.stdout
    );
    let row_of = |id: &str| {
        *lines
            .iter()
            .find(|l| l.starts_with(id))
            .unwrap_or_else(|| panic!("{id} missing from\n{}", table.stdout))
    };
    assert!(
        row_of(&run).contains("run run_cli1 for agent-a"),
        "{}",
        table.stdout
    );
    assert!(
        row_of(&push).contains("push test of acme/api, run run_cli2"),
        "{}",
        table.stdout
    );
    assert!(!table.stdout.contains(&other));
}

#[tokio::test]
async fn webhooks_are_registered_with_the_secret_from_the_environment_listed_and_deleted() {
    let cli = start(0).await;
    let refused = cli
        .run(&[
            "webhooks",
            "register",
            "--url",
            "https://steward.example.com",
        ])
        .await;
    assert_eq!(refused.code, 1, "{}", refused.stderr);
    assert!(
        refused.stderr.contains("E2B_WEBHOOK_SECRET is not set"),
        "{}",
        refused.stderr
    );
    assert_eq!(
        cli.hooks.calls_of("webhooks").await.unwrap(),
        0,
        "nothing was sent"
    );

    let secret = "whsec-cli-test-secret";
    let env = [("E2B_WEBHOOK_SECRET", secret)];
    let made = cli
        .run_with(
            &[
                "webhooks",
                "register",
                "--url",
                "https://steward.example.com/",
            ],
            &env,
        )
        .await;
    assert_eq!(made.code, 0, "{}", made.stderr);
    assert!(
        made.stdout
            .contains("https://steward.example.com/e2b/webhook"),
        "{}",
        made.stdout
    );
    assert!(!made.stdout.contains(secret) && !made.stderr.contains(secret));
    let listed = cli.run_with(&["--json", "webhooks", "list"], &env).await;
    assert_eq!(listed.code, 0, "{}", listed.stderr);
    let hooks = listed.json();
    assert_eq!(hooks.as_array().unwrap().len(), 1, "{hooks}");
    assert_eq!(hooks[0]["url"], "https://steward.example.com/e2b/webhook");
    assert!(hooks[0]["events"].as_array().unwrap().len() == 5, "{hooks}");
    assert!(!listed.stdout.contains(secret));
    let table = cli.run(&["webhooks", "list"]).await;
    assert!(table.stdout.contains("killed"), "{}", table.stdout);
    let id = hooks[0]["id"].as_str().unwrap();
    let deleted = cli.run(&["webhooks", "delete", id]).await;
    assert_eq!(deleted.code, 0, "{}", deleted.stderr);
    assert!(
        deleted.stdout.contains("Deleted webhook"),
        "{}",
        deleted.stdout
    );
    assert_eq!(
        cli.run(&["--json", "webhooks", "list"]).await.json(),
        json!([])
    );
    let again = cli.run(&["webhooks", "delete", id]).await;
    assert_eq!(
        again.code, 1,
        "a second delete names E2B's 404: {}",
        again.stdout
    );
}
