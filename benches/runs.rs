//! Benchmark: the overhead Steward adds to a governed run, against the E2B simulator running
//! commands as local processes (`--exec local`).
//!
//! Run: `cargo bench --bench runs` (needs Redis at `REDIS_URL`, default
//! `redis://127.0.0.1:6379`; everything else starts in this process). Knobs:
//! `STEWARD_BENCH_RUNS` (sequential runs per figure, default 30) and
//! `STEWARD_BENCH_CONCURRENT` (runs submitted at once, default 100).
//!
//! What it prints, every run being `echo hi`:
//! 1. **baseline**: without Steward, E2B create (`E2bClient`) then envd Start (`EnvdClient`) until
//!    the first stdout byte arrives: median and p95 over N sequential runs.
//! 2. **steward**: `POST /api/v1/runs` until the first output byte is seen by long-polling
//!    `GET /api/v1/runs/{id}/output?from=0&wait=5s` (the server answers as soon as bytes are
//!    stored: the run's write wakes the long-poll); the overhead is this minus the baseline,
//!    median and p95. Also submit → finished, read with `GET /api/v1/runs/{id}?wait=30s`
//!    (woken the same way by the run's end), and
//!    from the run records, created -> command started (Steward's own path, without either
//!    check interval; a run that found every worker busy waits here).
//! 3. **concurrent**: C runs submitted at once, then waited for: wall time from the first submit to
//!    the last finish, runs/s, p50/p95 submit → finished, and failures (anything not `finished`
//!    with exit code 0; each is printed). The run records split submit -> finished into created
//!    -> command started (waiting for a worker, creating the sandbox) and the command itself.
//!    A run holds one queue worker for its whole length, including the evidence and hand-over
//!    after its end (it no longer waits for a metrics sample a short run did not get: that wait
//!    once held each worker 5 s), so the replica's worker count (printed) bounds runs/s;
//!    `worker time per run` (wall x workers / runs) is how long each run held its worker.
//! 4. **peak RSS**: the process's VmHWM, which includes both simulators and Steward.
//! 5. **long-polls**: `STEWARD_BENCH_LONG_POLLS` (default 300) clients each long-polling
//!    `GET /api/v1/runs/{id}/output?from=0&wait=20s` on one run that prints nothing (`sleep`),
//!    against a second Steward on a Redis of its own (`redis-server --port <free> --save ''`,
//!    started here; skipped without `redis-server`), so the count is theirs alone: Redis
//!    operations per second (`total_commands_processed` from `INFO stats`, commands run by
//!    scripts included, the `INFO` calls themselves left out) over 5 s while they wait, beside
//!    the same replica's count over 5 s with no client at all.
//!
//! One unmeasured warm-up run of each kind opens the connections first. The simulators (E2B
//! with envd, and Slack, where each finished run's card is posted to `[channels] runs` with
//! `[runs] on_finish = "keep"`) run on their own thread and runtime, as they would run on other
//! machines, but share the cores. The Redis keys are written under a fresh prefix and deleted at
//! the end.
use std::time::{Duration, Instant};

use sandbox_steward::config::Settings;
use sandbox_steward::e2b::{E2bClient, E2bSettings, NewSandbox};
use sandbox_steward::envd::{EnvdAddress, EnvdClient, EnvdVersion, ProcessEvent, ProcessSpec};
use sandbox_steward::ids::TemplateId;
use sandbox_steward::sim::e2b::{ExecMode, SimOptions, SimServer};
use sandbox_steward::sim::slack::{SlackSim, SlackSimOptions};
use sandbox_steward::startup::Application;
use serde_json::{Value, json};

mod support;
use sha2::{Digest, Sha256};
use support::{OwnRedis, ms, peak_memory_mib, redis_and_prefix, steward_env};

const E2B_KEY: &str = "e2b_bench_key_0123456789";
const API_TOKEN: &str = "stw_bench_4c0f9a7e21d84b6e";
const COMMAND: &str = "echo hi";

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(default)
}

/// Where the simulators listen.
struct SimAddresses {
    e2b_url: String,
    envd_url: String,
    team_id: String,
    slack_api_url: String,
}

/// The E2B simulator (exec local) and the Slack simulator on their own thread and runtime, as
/// they would be on their own machines: their request handling must not queue behind
/// Steward's tasks (or the other way round).
struct SimThread {
    addresses: SimAddresses,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl SimThread {
    fn start() -> anyhow::Result<SimThread> {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("the simulators' runtime starts");
            runtime.block_on(async move {
                let e2b = SimServer::start(SimOptions {
                    sandboxes: 0,
                    api_key: Some(E2B_KEY.into()),
                    exec: ExecMode::Local,
                    ..SimOptions::default()
                })
                .await;
                let slack = SlackSim::start(SlackSimOptions::default()).await;
                match (e2b, slack) {
                    (Ok(e2b), Ok(slack)) => {
                        let _ = ready_tx.send(Ok(SimAddresses {
                            e2b_url: e2b.base_url(),
                            envd_url: e2b.envd_url(),
                            team_id: e2b.team_id().to_owned(),
                            slack_api_url: slack.api_url(),
                        }));
                        let _ = stopped.await;
                        e2b.shutdown().await;
                        drop(slack);
                    }
                    (Err(e), _) => {
                        let _ = ready_tx.send(Err(format!("the E2B simulator did not start: {e}")));
                    }
                    (_, Err(e)) => {
                        let _ =
                            ready_tx.send(Err(format!("the Slack simulator did not start: {e}")));
                    }
                }
            });
        });
        let addresses = ready_rx.recv()?.map_err(anyhow::Error::msg)?;
        Ok(SimThread {
            addresses,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The nearest-rank `q` quantile (0 < q <= 1) of `samples`.
fn quantile(samples: &[Duration], q: f64) -> Duration {
    let mut sorted = samples.to_vec();
    sorted.sort();
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn median(samples: &[Duration]) -> Duration {
    quantile(samples, 0.5)
}

fn p95(samples: &[Duration]) -> Duration {
    quantile(samples, 0.95)
}

/// One run without Steward: create a sandbox, start `echo hi` through envd, time to the first
/// stdout byte. The rest of the output is drained and the sandbox killed, untimed.
async fn direct_run(e2b: &E2bClient, envd_url: &str) -> anyhow::Result<Duration> {
    let template = TemplateId::parse("base").map_err(anyhow::Error::msg)?;
    let started = Instant::now();
    let created = e2b.create_sandbox(&NewSandbox::new(template)).await?;
    let address = EnvdAddress::resolve(
        Some(envd_url),
        &created.sandbox_id,
        created.domain.as_deref(),
    );
    let envd = EnvdClient::new(
        created.sandbox_id.clone(),
        address,
        created.envd_access_token.clone(),
        EnvdVersion::announced(&created.envd_version),
    )?;
    let mut stream = envd.start(&ProcessSpec::shell(COMMAND)).await?;
    let mut first = None;
    while let Some(event) = stream.next_event().await? {
        match event {
            ProcessEvent::Stdout(bytes) if first.is_none() && !bytes.is_empty() => {
                first = Some(started.elapsed());
            }
            ProcessEvent::End(_) => break,
            _ => {}
        }
    }
    e2b.kill_sandbox(&created.sandbox_id).await?;
    first.ok_or_else(|| anyhow::anyhow!("`{COMMAND}` ended without printing"))
}

/// The agent API as a client sees it.
#[derive(Clone)]
struct Api {
    http: reqwest::Client,
    base: String,
}

/// One run through Steward, as timed from the client, and its own record's timeline.
struct Timed {
    first_byte: Option<Duration>,
    finished: Duration,
    /// `created_at` → `started_at`: waiting for a free worker, creating the sandbox, starting
    /// the command.
    queued: Option<Duration>,
    /// `started_at` → `finished_at`: the command running.
    working: Option<Duration>,
}

/// The time from `from` to `to`, both RFC 3339 timestamps of a run record.
fn between(run: &Value, from: &str, to: &str) -> Option<Duration> {
    let at = |key: &str| {
        run[key]
            .as_str()
            .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
    };
    (at(to)? - at(from)?).to_std().ok()
}

impl Api {
    async fn submit(&self) -> anyhow::Result<String> {
        let resp = self
            .http
            .post(format!("{}/api/v1/runs", self.base))
            .bearer_auth(API_TOKEN)
            .json(&json!({"template": "base", "command": COMMAND}))
            .send()
            .await?;
        let status = resp.status();
        let body: Value = resp.json().await?;
        anyhow::ensure!(status.as_u16() == 202, "submit answered {status}: {body}");
        body["id"]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| anyhow::anyhow!("submit answered without an id: {body}"))
    }

    /// Long-polls the output from byte 0 until there is some.
    async fn first_output(&self, id: &str) -> anyhow::Result<()> {
        loop {
            let resp = self
                .http
                .get(format!(
                    "{}/api/v1/runs/{id}/output?from=0&wait=5s",
                    self.base
                ))
                .bearer_auth(API_TOKEN)
                .send()
                .await?;
            let status = resp.status();
            let finished = resp
                .headers()
                .get("x-run-finished")
                .is_some_and(|v| v == "true");
            let body = resp.bytes().await?;
            anyhow::ensure!(status.is_success(), "output answered {status}");
            if !body.is_empty() {
                return Ok(());
            }
            anyhow::ensure!(!finished, "the run finished without output");
        }
    }

    /// Long-polls the run until it ends; an error unless it finished with exit code 0.
    async fn finished(&self, id: &str) -> anyhow::Result<Value> {
        loop {
            let resp = self
                .http
                .get(format!("{}/api/v1/runs/{id}?wait=30s", self.base))
                .bearer_auth(API_TOKEN)
                .send()
                .await?;
            let status = resp.status();
            let run: Value = resp.json().await?;
            anyhow::ensure!(status.is_success(), "run answered {status}: {run}");
            match run["status"].as_str() {
                Some("finished") if run["exit_code"] == 0 => return Ok(run),
                Some("finished" | "timed_out" | "failed") => {
                    anyhow::bail!(
                        "run {id} ended {}: exit code {}, error {}",
                        run["status"],
                        run["exit_code"],
                        run["error"]
                    )
                }
                _ => {}
            }
        }
    }

    /// Submit, optionally wait for the first output byte, then wait for the end.
    async fn run(&self, watch_output: bool) -> anyhow::Result<Timed> {
        let started = Instant::now();
        let id = self.submit().await?;
        let first_byte = if watch_output {
            self.first_output(&id).await?;
            Some(started.elapsed())
        } else {
            None
        };
        let run = self.finished(&id).await?;
        Ok(Timed {
            first_byte,
            finished: started.elapsed(),
            queued: between(&run, "created_at", "started_at"),
            working: between(&run, "started_at", "finished_at"),
        })
    }
}

/// Deletes every key under `prefix` (the bench's own keys only).
fn delete_keys(url: &str, prefix: &str) -> anyhow::Result<usize> {
    let client = redis::Client::open(url)?;
    let mut conn = client.get_connection()?;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}:*"))
        .query(&mut conn)?;
    for batch in keys.chunks(500) {
        let _: i64 = redis::cmd("DEL").arg(batch).query(&mut conn)?;
    }
    Ok(keys.len())
}

fn policy() -> String {
    let hash = hex::encode(Sha256::digest(API_TOKEN.as_bytes()));
    format!(
        r#"[channels]
approvals = "C0APPROVALS"
runs = "C0RUNS"

[runs]
on_finish = "keep"

[api.tokens.bench]
sha256 = "{hash}"
allow = ["run", "read"]
rate = "100000/min"
"#
    )
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    sandbox_steward::telemetry::init("error");
    let runs = env_usize("STEWARD_BENCH_RUNS", 30);
    let concurrent = env_usize("STEWARD_BENCH_CONCURRENT", 100);
    let (redis_url, prefix) = redis_and_prefix("runs");

    let sim = SimThread::start()?;
    let config_dir = tempfile::tempdir()?;
    let config = config_dir.path().join("steward.toml");
    std::fs::write(&config, policy())?;
    let a = &sim.addresses;
    let env = steward_env([
        ("STEWARD_CONFIG", config.display().to_string()),
        ("SLACK_API_URL", a.slack_api_url.clone()),
        ("SLACK_BOT_TOKEN", "xoxb-bench-bot-token".to_owned()),
        ("SLACK_SIGNING_SECRET", "bench-signing-secret".to_owned()),
        ("E2B_API_URL", a.e2b_url.clone()),
        ("E2B_API_KEY", E2B_KEY.to_owned()),
        ("E2B_PROJECT_ID", a.team_id.clone()),
        ("E2B_SANDBOX_URL", a.envd_url.clone()),
        ("REDIS_URL", redis_url.clone()),
        ("STEWARD_REDIS_PREFIX", prefix.clone()),
    ]);
    let settings = Settings::load(&env)?;
    let mut app = Application::build(settings).await?;
    let workers = app.loops_mut().run_workers.max(1);
    let api = Api {
        http: reqwest::Client::new(),
        base: format!("http://127.0.0.1:{}", app.port()),
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(app.run_until_stopped(async {
        let _ = stopped.await;
    }));

    let mut result = measure(&api, &sim.addresses, runs, concurrent, workers).await;
    if result.is_ok() {
        result = long_polls(&sim.addresses).await;
    }

    let _ = stop.send(());
    match serving.await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => eprintln!("Steward did not stop cleanly: {e}"),
        Err(e) => eprintln!("Steward's serve task failed: {e}"),
    }
    sim.stop();
    match delete_keys(&redis_url, &prefix) {
        Ok(_) => {}
        Err(e) => eprintln!("could not delete the bench's Redis keys under {prefix}: {e}"),
    }
    result
}

async fn measure(
    api: &Api,
    sim: &SimAddresses,
    runs: usize,
    concurrent: usize,
    workers: usize,
) -> anyhow::Result<()> {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "governed runs of `{COMMAND}`: {runs} sequential, {concurrent} concurrent; \
         {cores} cores; {workers} run workers per replica (one replica)"
    );

    let mut e2b_settings = E2bSettings::for_url(&sim.e2b_url, E2B_KEY);
    e2b_settings.team_id = Some(sim.team_id.clone());
    let e2b = E2bClient::new(&e2b_settings)?;
    // Warm-up, unmeasured: connections open, bash's first start.
    direct_run(&e2b, &sim.envd_url).await?;
    api.run(true).await?;

    let mut baseline = Vec::with_capacity(runs);
    for _ in 0..runs {
        baseline.push(direct_run(&e2b, &sim.envd_url).await?);
    }
    println!(
        "1. baseline (no Steward)  create -> first stdout byte   median {:>8.1} ms  p95 {:>8.1} ms",
        ms(median(&baseline)),
        ms(p95(&baseline))
    );

    let mut first = Vec::with_capacity(runs);
    let mut finished = Vec::with_capacity(runs);
    let mut to_command = Vec::with_capacity(runs);
    for _ in 0..runs {
        let timed = api.run(true).await?;
        first.extend(timed.first_byte);
        finished.push(timed.finished);
        to_command.extend(timed.queued);
    }
    println!(
        "2. through Steward        submit -> first output byte   median {:>8.1} ms  p95 {:>8.1} ms",
        ms(median(&first)),
        ms(p95(&first))
    );
    println!(
        "   overhead (Steward - baseline)                        median {:>8.1} ms  p95 {:>8.1} ms",
        ms(median(&first)) - ms(median(&baseline)),
        ms(p95(&first)) - ms(p95(&baseline))
    );
    println!(
        "   through Steward        submit -> finished            median {:>8.1} ms  p95 {:>8.1} ms",
        ms(median(&finished)),
        ms(p95(&finished))
    );

    println!(
        "   from the run records   created -> command started   median {:>8.1} ms  p95 {:>8.1} ms",
        ms(median(&to_command)),
        ms(p95(&to_command))
    );

    let started = Instant::now();
    let tasks: Vec<_> = (0..concurrent)
        .map(|_| {
            let api = api.clone();
            tokio::spawn(async move { api.run(false).await })
        })
        .collect();
    let mut latencies = Vec::with_capacity(concurrent);
    let mut queued = Vec::with_capacity(concurrent);
    let mut working = Vec::with_capacity(concurrent);
    let mut failures = Vec::new();
    for task in tasks {
        match task.await {
            Ok(Ok(timed)) => {
                latencies.push(timed.finished);
                queued.extend(timed.queued);
                working.extend(timed.working);
            }
            Ok(Err(e)) => failures.push(e.to_string()),
            Err(e) => failures.push(format!("the client task failed: {e}")),
        }
    }
    let wall = started.elapsed();
    println!(
        "3. {concurrent} concurrent runs      wall {:>8.2} s  {:>6.1} runs/s  \
         submit -> finished p50 {:>8.1} ms  p95 {:>8.1} ms  failures {}",
        wall.as_secs_f64(),
        latencies.len() as f64 / wall.as_secs_f64(),
        ms(median(&latencies)),
        ms(p95(&latencies)),
        failures.len()
    );
    println!(
        "   from the run records: created -> command started p50 {:>8.1} ms  p95 {:>8.1} ms; \
         command started -> finished p50 {:>6.1} ms",
        ms(median(&queued)),
        ms(p95(&queued)),
        ms(median(&working)),
    );
    println!(
        "   worker time per run (wall x {workers} workers / runs) {:>8.2} s",
        wall.as_secs_f64() * workers as f64 / latencies.len().max(1) as f64
    );
    for failure in &failures {
        println!("   failed: {failure}");
    }
    println!(
        "4. peak RSS (VmHWM, both simulators + Steward)  {:.0} MiB",
        peak_memory_mib().unwrap_or(f64::NAN)
    );
    anyhow::ensure!(failures.is_empty(), "{} runs failed", failures.len());
    Ok(())
}

impl OwnRedis {
    /// Commands processed so far, not counting the `INFO` calls that read it.
    fn commands(&self) -> anyhow::Result<u64> {
        let mut conn = redis::Client::open(self.url.as_str())?.get_connection()?;
        let info: String = redis::cmd("INFO").arg("all").query(&mut conn)?;
        let field = |name: &str| -> u64 {
            info.lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().split(',').next())
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        Ok(field("total_commands_processed:") - field("cmdstat_info:calls="))
    }
}

/// Redis operations per second over `window`.
async fn ops_per_sec(redis: &OwnRedis, window: Duration) -> anyhow::Result<f64> {
    let before = redis.commands()?;
    tokio::time::sleep(window).await;
    let after = redis.commands()?;
    Ok(after.saturating_sub(before) as f64 / window.as_secs_f64())
}

/// Figure 5: what waiting output long-polls cost Redis.
async fn long_polls(sim: &SimAddresses) -> anyhow::Result<()> {
    let clients = env_usize("STEWARD_BENCH_LONG_POLLS", 300);
    let window = Duration::from_secs(5);
    let redis = match OwnRedis::start() {
        Ok(redis) => redis,
        Err(e) => {
            println!("5. long-polls: skipped, no redis-server of the bench's own ({e})");
            return Ok(());
        }
    };
    let config_dir = tempfile::tempdir()?;
    let config = config_dir.path().join("steward.toml");
    std::fs::write(&config, policy())?;
    let env = steward_env([
        ("STEWARD_CONFIG", config.display().to_string()),
        ("SLACK_API_URL", sim.slack_api_url.clone()),
        ("SLACK_BOT_TOKEN", "xoxb-bench-bot-token".to_owned()),
        ("SLACK_SIGNING_SECRET", "bench-signing-secret".to_owned()),
        ("E2B_API_URL", sim.e2b_url.clone()),
        ("E2B_API_KEY", E2B_KEY.to_owned()),
        ("E2B_PROJECT_ID", sim.team_id.clone()),
        ("E2B_SANDBOX_URL", sim.envd_url.clone()),
        ("REDIS_URL", redis.url.clone()),
        ("STEWARD_REDIS_PREFIX", "bench-long-polls".to_owned()),
    ]);
    let app = Application::build(Settings::load(&env)?).await?;
    let base = format!("http://127.0.0.1:{}", app.port());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(app.run_until_stopped(async {
        let _ = stopped.await;
    }));
    let http = reqwest::Client::new();
    let submitted: Value = http
        .post(format!("{base}/api/v1/runs"))
        .bearer_auth(API_TOKEN)
        .json(&json!({"template": "base", "command": "sleep 60", "timeout": "2m"}))
        .send()
        .await?
        .json()
        .await?;
    let id = submitted["id"]
        .as_str()
        .ok_or_else(|| anyhow::anyhow!("submit answered {submitted}"))?
        .to_owned();
    let started = Instant::now();
    loop {
        let run: Value = http
            .get(format!("{base}/api/v1/runs/{id}"))
            .bearer_auth(API_TOKEN)
            .send()
            .await?
            .json()
            .await?;
        if run["status"] == "running" && !run["started_at"].is_null() {
            break;
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(30),
            "the run never started: {run}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let idle = ops_per_sec(&redis, window).await?;

    let url = format!("{base}/api/v1/runs/{id}/output?from=0&wait=20s");
    let mut polls = tokio::task::JoinSet::new();
    for _ in 0..clients {
        let (http, url) = (http.clone(), url.clone());
        polls.spawn(async move {
            loop {
                let answer = http.get(&url).bearer_auth(API_TOKEN).send().await;
                if let Ok(resp) = answer {
                    let _ = resp.bytes().await;
                }
            }
        });
    }
    // Every client's first read is done well within a second.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let waiting = ops_per_sec(&redis, window).await?;
    polls.abort_all();
    println!(
        "5. {clients} output long-polls waiting on one run (its own Redis)  \
         {waiting:>8.0} Redis ops/s  (the same replica with no client: {idle:.0} ops/s)"
    );
    let _ = stop.send(());
    let _ = serving.await;
    Ok(())
}
