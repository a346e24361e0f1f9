//! Issue 41's chaos test: three `steward serve` replicas on one Redis (append-only file on)
//! against the simulators, with E2B failing one call in ten (500, 502, 503 or 429). While
//! governed runs (some long), decided kill cases and a 500-sandbox list execution are in flight:
//! a rolling restart (SIGTERM each replica in turn, start its replacement), then a SIGKILL of one
//! replica, then a Redis restart. At the end, counted at the simulators and in the store:
//!
//! - every run ended by itself with its exit code (none failed because a replica stopped);
//! - every decided case was carried out exactly once (E2B killed each sandbox once);
//! - every list item was acted on once (E2B paused each sandbox once) and none failed;
//! - every sandbox a run created has its run ended and handed over;
//! - no finished case's card still shows buttons; the sweep's digest was posted once.
//!
//! It prints its figures (runs finished / failed / re-attached, decisions, duplicates, seconds to
//! recover after each fault). The faults land mid-flight by construction: each is taken while
//! the test can see work of every kind unfinished.
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use reqwest::StatusCode;
use sandbox_steward::approvals::list::progress_of;
use sandbox_steward::cases::list::ListCase;
use sandbox_steward::cases::{CaseState, DecisionOption};
use sandbox_steward::ids::CaseId;
use sandbox_steward::sim::e2b::{ExecMode, SimOptions, SimServer};
use sandbox_steward::sim::slack::{SlackSim, SlackSimOptions};
use serde_json::{Value, json};

use crate::api::{AGENT_TOKEN, AUDITOR_TOKEN, sha256_hex};

use crate::common::{
    DurableRedis, E2B_KEY, TestApp, TestAppOptions, app_env, free_port, hook, poll_for, poll_until,
    spawn_app_on, unique_prefix,
};

const APPROVALS: &str = "C0APPROVALS";
const HYGIENE: &str = "C0HYGIENE";
/// Governed runs in flight; every fourth is long enough to outlive a replica.
const RUNS: usize = 32;
/// Kill cases decided by a person, a third before each fault.
const DECISIONS: usize = 30;
/// Idle sandboxes the list decision pauses.
const LIST_ITEMS: usize = 500;
/// How long a fault may take to be absorbed before the test gives up.
const RECOVERY: Duration = Duration::from_secs(60);

fn policy() -> String {
    format!(
        r#"[channels]
approvals = "{APPROVALS}"

[approvals]
two_person_rule = false
[approvals.approvers]
kill = {{ users = ["U0002"] }}
pause = {{ anyone = true }}
leave = {{ anyone = true }}

[hygiene]
channel = "{HYGIENE}"
list_from = 0
list_concurrency = 2
list_progress_every = "1s"
list_item_lease = "3s"

# One person opens every kill case here, faster than a person would.
[limits]
commands_per_minute = 1000

[workers]
decisions = 4
runs = 4
shutdown_grace = "6s"

[api.tokens.agent]
sha256 = "{agent}"
allow = ["run", "read", "request_kill"]

[api.tokens.auditor]
sha256 = "{auditor}"
allow = ["read_all"]
"#,
        agent = sha256_hex(AGENT_TOKEN),
        auditor = sha256_hex(AUDITOR_TOKEN),
    )
}

/// One `steward serve` process; its log is kept in the test's directory.
struct Replica {
    name: String,
    child: std::process::Child,
    address: String,
    log: PathBuf,
}

impl Replica {
    fn start(env: &HashMap<String, String>, name: &str, dir: &Path) -> Self {
        let port = free_port();
        let log = dir.join(format!("{name}.log"));
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_steward"))
            .arg("serve")
            .envs(env)
            .env("STEWARD_LISTEN", format!("127.0.0.1:{port}"))
            .env("HOSTNAME", name)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Self {
            name: name.to_owned(),
            child,
            address: format!("http://127.0.0.1:{port}"),
            log,
        }
    }

    async fn ready(&self, http: &reqwest::Client) {
        poll_until(
            Duration::from_secs(30),
            &format!("{} answers /readyz", self.name),
            || async {
                http.get(format!("{}/readyz", self.address))
                    .send()
                    .await
                    .is_ok_and(|r| r.status().is_success())
                    .then_some(())
            },
        )
        .await;
    }

    fn signal(&self, signal: &str) {
        let ok = std::process::Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {signal} {}", self.name);
    }

    /// Waits for the process to exit; its exit status.
    async fn exited(&mut self, patience: Duration) -> std::process::ExitStatus {
        let name = self.name.clone();
        let log = self.log.clone();
        let child = &mut self.child;
        let found = poll_for(patience, || {
            let status = child.try_wait().unwrap();
            async move { status }
        })
        .await;
        found.unwrap_or_else(|| {
            panic!(
                "{name} did not exit within {patience:?}; its log:\n{}",
                tail(&log)
            )
        })
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// What the test watches: runs, decided cases and the list's group.
struct Work<'a> {
    app: &'a TestApp,
    runs: Vec<String>,
    cases: Vec<CaseId>,
    list: ListCase,
    group: usize,
    items: u64,
}

/// How much of the work has ended (runs terminal, cases finished, list items ended).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Ended {
    runs: usize,
    cases: usize,
    items: u64,
}

impl Ended {
    fn total(self) -> u64 {
        (self.runs + self.cases) as u64 + self.items
    }
}

impl Work<'_> {
    /// The run as the API shows it (read from the store, as every replica's API does).
    async fn run(&self, id: &str) -> Result<Value, String> {
        let runner = self
            .app
            .state
            .runs
            .as_ref()
            .expect("the observer has a runner");
        let id = sandbox_steward::ids::RunId::parse(id).map_err(|e| e.to_string())?;
        let run = runner.get(&id).await.map_err(|e| e.to_string())?;
        Ok(json!(run))
    }

    async fn ended(&self) -> Result<Ended, String> {
        let mut runs = 0;
        for id in &self.runs {
            let run = self.run(id).await?;
            runs += usize::from(matches!(
                run["status"].as_str(),
                Some("finished" | "timed_out" | "failed")
            ));
        }
        let store = &self.app.state.store;
        let mut cases = 0;
        for id in &self.cases {
            let case = store.get_case(id).await.map_err(|e| e.to_string())?;
            cases += usize::from(!case.state.is_open());
        }
        let list = store
            .get_list(&self.list.id)
            .await
            .map_err(|e| e.to_string())?;
        let progress = progress_of(store, &list).await.map_err(|e| e.to_string())?[self.group]
            .unwrap_or_default();
        Ok(Ended {
            runs,
            cases,
            items: (progress.done + progress.skipped + progress.failed) as u64,
        })
    }

    /// Whether some of each kind of work is still unfinished (a fault taken now lands mid-flight).
    async fn all_kinds_in_flight(&self) -> bool {
        let Ok(ended) = self.ended().await else {
            return false;
        };
        ended.runs < self.runs.len() && ended.items < self.items
    }

    /// Seconds from `since` until more work has ended than `before` (or all of it has); on
    /// failure, what had ended and the replicas' logs.
    async fn recovered(&self, before: Ended, since: Instant, replicas: &[Replica]) -> f64 {
        let all = Ended {
            runs: self.runs.len(),
            cases: self.cases.len(),
            items: self.items,
        };
        let found = poll_for(RECOVERY, || async {
            let now = self.ended().await.ok()?;
            (now.total() > before.total() || now == all).then(|| since.elapsed().as_secs_f64())
        })
        .await;
        if let Some(seconds) = found {
            return seconds;
        }
        for replica in replicas {
            eprintln!("--- {} ---\n{}", replica.name, tail(&replica.log));
        }
        panic!(
            "no work ended for {RECOVERY:?} after the fault: before {before:?}, now {:?}",
            self.ended().await
        )
    }
}

/// E2B's faults and a Redis restart reach the person as "try again", and they do.
async fn decide_kill(app: &TestApp, sandbox: &str) -> CaseId {
    let mut said = Vec::new();
    for _ in 0..10 {
        let name = hook();
        app.post_command_to(&format!("kill {sandbox} done with it"), &name)
            .await;
        let text = crate::common::visible_text(&app.wait_for_hook(&name).await);
        if text.contains("case_") {
            let id = crate::common::case_id_in(&text);
            crate::api_cases::person_kills(app, id.as_str()).await;
            return id;
        }
        assert!(text.to_lowercase().contains("try again"), "{text}");
        said.push(text);
        // The person tries again, as the reply asks, once this replica says it can serve
        // (`/readyz` pings Redis); an E2B fault is a fresh one-in-ten draw on each call.
        crate::common::eventually("the replica is ready to be asked again", || async {
            app.http
                .get(app.url("/readyz"))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success())
        })
        .await;
    }
    panic!("/sandbox kill {sandbox} never opened a case: {said:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_lose_nothing_through_a_rolling_restart_a_crash_and_a_redis_restart() {
    let started = Instant::now();
    let _ = tracing_subscriber::fmt()
        .with_env_filter("sandbox_steward=info")
        .with_test_writer()
        .with_ansi(false)
        .try_init();
    let mut redis = DurableRedis::start();
    let prefix = unique_prefix();
    let slack = Arc::new(SlackSim::start(SlackSimOptions::default()).await.unwrap());
    let e2b = Arc::new(
        SimServer::start(SimOptions {
            sandboxes: 0,
            latency_ms: 10,
            fault_rate: 0.1,
            api_key: Some(E2B_KEY.into()),
            exec: ExecMode::Local,
            ..SimOptions::default()
        })
        .await
        .unwrap(),
    );
    let options = || TestAppOptions {
        sandboxes: 0,
        policy: Some(policy()),
        redis_url: Some(redis.url()),
        redis_prefix: Some(prefix.clone()),
        ..TestAppOptions::default()
    };
    // The observer: the test's view of the store and its Slack clicks; it runs no workers.
    let app = spawn_app_on(
        slack.clone(),
        e2b.clone(),
        TestAppOptions {
            worker: false,
            ..options()
        },
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let env = app_env(&slack, &e2b, &redis.url(), &prefix, &options(), dir.path());
    let mut generation = 0;
    let mut replicas: Vec<Replica> = (0..3)
        .map(|n| Replica::start(&env, &format!("replica-{n}-g0"), dir.path()))
        .collect();
    for replica in &replicas {
        replica.ready(&app.http).await;
    }

    // The fleet: idle sandboxes for the list, busy ones for the kill cases.
    let now = Utc::now();
    for _ in 0..LIST_ITEMS {
        app.seed_sandbox(json!({"templateID": "python", "state": "running",
            "startedAt": (now - chrono::Duration::hours(5)).to_rfc3339(),
            "endAt": (now + chrono::Duration::hours(10)).to_rfc3339(),
            "profile": "idle", "metadata": {"owner": "fleet"}}))
            .await;
    }
    let mut doomed = Vec::new();
    for _ in 0..DECISIONS {
        let seeded = app
            .seed_sandbox(json!({"templateID": "python", "state": "running",
                "profile": "busy", "metadata": {"owner": "cases"}}))
            .await;
        doomed.push(seeded["sandboxID"].as_str().unwrap().to_owned());
    }
    let name = hook();
    assert_eq!(app.post_command_to("sweep", &name).await.status(), 200);
    let lists = poll_until(
        Duration::from_secs(120),
        "the sweep posts its list",
        || async {
            let lists = app.state.store.active_lists().await.ok()?;
            (!lists.is_empty()).then_some(lists)
        },
    )
    .await;
    let list = app.state.store.get_list(&lists[0]).await.unwrap();
    let group = list
        .groups
        .iter()
        .position(|g| g.owner.as_deref() == Some("fleet") && g.option == DecisionOption::Pause)
        .expect("the fleet's pause group");
    // A sandbox whose evidence E2B kept failing is left out of the sweep, as it would be.
    let list_items = list.groups[group].items.len();
    assert!(
        list_items >= LIST_ITEMS * 9 / 10,
        "{list_items} in the list"
    );

    // Runs, queued through every replica: most take 2 s, every fourth 14 s.
    let mut runs = Vec::new();
    for n in 0..RUNS {
        let seconds = if n % 4 == 0 { 14 } else { 2 };
        let replica = &replicas[n % replicas.len()];
        let resp = app
            .http
            .post(format!("{}/api/v1/runs", replica.address))
            .bearer_auth(AGENT_TOKEN)
            .json(&json!({"template": "base", "timeout": "2m",
                "command": format!("sleep {seconds}; echo run-{n} ended")}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::ACCEPTED);
        let run: Value = resp.json().await.unwrap();
        runs.push(run["id"].as_str().unwrap().to_owned());
    }
    // The list approved on one replica, a third of the cases decided.
    let approve = crate::list_cases::click_at(
        &app,
        &replicas[0].address,
        &list,
        "sweep_list_approve",
        Some(group),
        "U0003",
    );
    approve.await;
    let mut cases = Vec::new();
    for sandbox in &doomed[..DECISIONS / 3] {
        cases.push(decide_kill(&app, sandbox).await);
    }
    let mut work = Work {
        app: &app,
        runs: runs.clone(),
        cases: cases.clone(),
        list: list.clone(),
        group,
        items: list_items as u64,
    };

    // 1. A rolling restart: each replica in turn gets SIGTERM, drains and exits; its
    //    replacement starts. Each fault is taken while work of every kind is unfinished.
    let mut figures: Vec<String> = Vec::new();
    generation += 1;
    for n in 0..3 {
        let in_flight = work.all_kinds_in_flight().await;
        let before = work.ended().await.unwrap_or_default();
        let at = Instant::now();
        replicas[n].signal("-TERM");
        let status = replicas[n].exited(Duration::from_secs(20)).await;
        let drained = at.elapsed().as_secs_f64();
        assert!(
            status.success(),
            "{} exited with {status}",
            replicas[n].name
        );
        let replacement = Replica::start(&env, &format!("replica-{n}-g{generation}"), dir.path());
        replacement.ready(&app.http).await;
        let old = std::mem::replace(&mut replicas[n], replacement);
        drop(old);
        let recovered = work.recovered(before, at, &replicas).await;
        figures.push(format!(
            "SIGTERM replica-{n}: drained and exited in {drained:.1} s, work ended again {recovered:.1} s after the signal{}",
            if in_flight { "" } else { " (little was left in flight)" }
        ));
    }
    for sandbox in &doomed[DECISIONS / 3..2 * DECISIONS / 3] {
        cases.push(decide_kill(&app, sandbox).await);
    }
    work.cases = cases.clone();

    // 2. A crash: SIGKILL, then a replacement.
    let before = work.ended().await.unwrap_or_default();
    let at = Instant::now();
    replicas[1].signal("-KILL");
    replicas[1].exited(Duration::from_secs(10)).await;
    generation += 1;
    let replacement = Replica::start(&env, &format!("replica-1-g{generation}"), dir.path());
    replacement.ready(&app.http).await;
    drop(std::mem::replace(&mut replicas[1], replacement));
    let recovered = work.recovered(before, at, &replicas).await;
    figures.push(format!(
        "SIGKILL replica-1: work ended again {recovered:.1} s after the crash"
    ));

    // 3. A Redis restart, with the last third of the decisions made around it.
    for sandbox in &doomed[2 * DECISIONS / 3..5 * DECISIONS / 6] {
        cases.push(decide_kill(&app, sandbox).await);
    }
    let before = work.ended().await.unwrap_or_default();
    let at = Instant::now();
    redis.restart();
    let down = at.elapsed().as_secs_f64();
    for sandbox in &doomed[5 * DECISIONS / 6..] {
        cases.push(decide_kill(&app, sandbox).await);
    }
    work.cases = cases.clone();
    let recovered = work.recovered(before, at, &replicas).await;
    figures.push(format!(
        "Redis restart: down {down:.1} s, work ended again {recovered:.1} s after it went down"
    ));

    // Everything ends.
    let all = poll_for(Duration::from_secs(240), || async {
        let ended = work.ended().await.ok()?;
        (ended.runs == RUNS && ended.cases == DECISIONS && ended.items == list_items as u64)
            .then_some(ended)
    })
    .await;
    if all.is_none() {
        for replica in &replicas {
            eprintln!("--- {} ---\n{}", replica.name, tail(&replica.log));
        }
        panic!("not everything ended: {:?}", work.ended().await);
    }

    // Runs: each ended by itself, exit 0, its output complete; re-attached ones counted.
    let (mut finished, mut failed, mut reattached) = (0, Vec::new(), 0);
    for id in &runs {
        let run = work.run(id).await.unwrap();
        if run["status"] == "finished" && run["exit_code"] == 0 {
            finished += 1;
        } else {
            failed.push(format!("{id}: {} {}", run["status"], run["error"]));
        }
        reattached += run["reattached"].as_u64().unwrap_or(0);
    }
    // Every sandbox a run created has its run ended and handed over (a case, or a rule).
    let mut orphans = Vec::new();
    for id in &runs {
        let settled = poll_for(Duration::from_secs(60), || async {
            let run = work.run(id).await.ok()?;
            (run["handed_over"] == true || run["case_id"].is_string()).then_some(())
        })
        .await;
        if settled.is_none() {
            orphans.push(id.clone());
        }
    }

    // Decisions: each case Done, each sandbox killed once at E2B.
    let calls = app.e2b_calls().await;
    let killed = calls.get("killed").copied().unwrap_or(0);
    let mut not_done = Vec::new();
    for id in &cases {
        let case = app.state.store.get_case(id).await.unwrap();
        if !matches!(case.state, CaseState::Done { .. }) {
            not_done.push(format!("{id}: {:?}", case.state));
        }
    }
    // Cards: no finished case shows buttons.
    let mut buttons_left = Vec::new();
    for id in &cases {
        let case = app.state.store.get_case(id).await.unwrap();
        let card = case.card.as_ref().expect("a card");
        let shown = slack.message(card.channel.as_str(), &card.ts);
        let has_buttons = shown
            .and_then(|m| m.blocks)
            .and_then(|b| b.as_array().cloned())
            .is_some_and(|blocks| blocks.iter().any(|b| b["type"] == "actions"));
        if has_buttons {
            buttons_left.push(id.to_string());
        }
    }
    // The list: every item ended done or skipped, each sandbox paused once. An item whose E2B
    // calls kept failing past the client's retries is shown failed with Retry failed on the
    // digest; the person clicks it, as they would.
    let store = &app.state.store;
    let progress_now = || async {
        progress_of(store, &store.get_list(&list.id).await.unwrap())
            .await
            .unwrap()[group]
            .unwrap_or_default()
    };
    let mut progress = progress_now().await;
    let failed_first = progress.failed;
    if failed_first > 0 {
        let latest = store.get_list(&list.id).await.unwrap();
        let message = &latest.messages[sandbox_steward::approvals::list::view::message_of(group)];
        let shown = slack
            .message(message.channel.as_str(), &message.ts)
            .map(|m| crate::common::visible_text(&m))
            .unwrap_or_default();
        eprintln!("chaos: the digest shows the failed items as:\n{shown}");
        crate::list_cases::click_at(
            &app,
            &replicas[2].address,
            &list,
            "sweep_list_retry",
            Some(group),
            "U0003",
        )
        .await;
        progress = poll_until(Duration::from_secs(60), "Retry failed ends", || async {
            let p = progress_now().await;
            (p.failed == 0 && p.done + p.skipped == list_items).then_some(p)
        })
        .await;
    }
    let calls = app.e2b_calls().await;
    let paused = calls.get("paused").copied().unwrap_or(0);
    // The digest: no message of the sweep's was posted twice in the hygiene channel.
    let mut posted: HashMap<String, usize> = HashMap::new();
    for m in slack.messages() {
        if m.method == "chat.postMessage" && m.channel.as_deref() == Some(HYGIENE) {
            let text = format!("{:?} {:?}", m.text, m.blocks);
            *posted.entry(text).or_default() += 1;
        }
    }
    let digests = posted.values().filter(|n| **n > 1).count();

    eprintln!(
        "chaos: {} replicas, E2B fault rate 0.1, {:.0} s in all",
        3,
        started.elapsed().as_secs_f64()
    );
    for line in &figures {
        eprintln!("chaos: {line}");
    }
    eprintln!(
        "chaos: runs: {finished} finished with their exit code, {} failed, {reattached} re-attached to their process by another replica",
        failed.len()
    );
    eprintln!(
        "chaos: decisions: {} decided, {} carried out, E2B killed {killed} sandboxes ({} duplicates)",
        cases.len(),
        cases.len() - not_done.len(),
        killed.saturating_sub(cases.len() as u64)
    );
    eprintln!(
        "chaos: list: {} items, {} done, {} skipped, {} failed ({failed_first} failed past E2B's retries, then done on Retry failed); E2B paused {paused} ({} duplicates)",
        list_items,
        progress.done,
        progress.skipped,
        progress.failed,
        paused.saturating_sub(list_items as u64)
    );
    eprintln!(
        "chaos: sandboxes left without a run end or a case: {}; finished cards with buttons: {}; sweep messages posted twice: {digests}",
        orphans.len(),
        buttons_left.len(),
    );

    assert!(
        failed.is_empty(),
        "runs that did not end by themselves: {failed:#?}"
    );
    assert!(not_done.is_empty(), "cases not carried out: {not_done:#?}");
    assert_eq!(
        killed, DECISIONS as u64,
        "each decided sandbox killed exactly once: {calls:?}"
    );
    assert_eq!(progress.failed, 0, "{progress:?}");
    assert_eq!(progress.done + progress.skipped, list_items, "{progress:?}");
    assert!(
        paused <= list_items as u64,
        "a sandbox paused twice: {calls:?}"
    );
    assert_eq!(paused, progress.done as u64, "{calls:?}");
    assert!(
        orphans.is_empty(),
        "runs whose sandbox was never handed over: {orphans:?}"
    );
    assert!(
        buttons_left.is_empty(),
        "finished cases still showing buttons: {buttons_left:?}"
    );
    assert_eq!(digests, 0, "a sweep message was posted twice: {posted:#?}");
}
