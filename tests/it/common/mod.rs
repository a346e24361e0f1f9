//! Test helpers shared by every test binary: `spawn_app()` starts Steward on port 0 against the
//! E2B simulator and the fake Slack (each on its own random port), and `TestApp` signs and
//! sends Slack requests the way Slack does.
#![allow(dead_code)]

pub mod scrape;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use sandbox_steward::config::Settings;
use sandbox_steward::e2b::RetryPolicy;
use sandbox_steward::envd::{EnvdAddress, EnvdClient, EnvdVersion};
use sandbox_steward::http::AppState;
use sandbox_steward::ids::SandboxId;
use sandbox_steward::sim::e2b::{SimOptions, SimServer};
use sandbox_steward::sim::slack::{Recorded, SlackSim, SlackSimOptions};
use sandbox_steward::slack::signature;
use sandbox_steward::startup::Application;
use serde_json::Value;
use tokio::sync::oneshot;

pub const SIGNING_SECRET: &str = "test-signing-secret-8f742231b10e";
pub const BOT_TOKEN: &str = "xoxb-test-bot-token";
pub const E2B_KEY: &str = "e2b_test_key_0123456789";
/// The approvals channel of [`approvals_policy`].
pub const APPROVALS: &str = "C0APPROVALS";

/// Seeds a running sandbox in `sim`; `extra` adds seed fields (`secure`, `profile`, `cpuCount`).
/// Its id and its envd access token, if it has one.
pub async fn seed_envd_sandbox(sim: &SimServer, extra: Value) -> (SandboxId, Option<String>) {
    let mut body = serde_json::json!({"templateID": "base", "state": "running"});
    if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
        body.extend(extra.clone());
    }
    let seeded = sim.hooks().seed(body).await.expect("seeded");
    let id = SandboxId::parse(seeded["sandboxID"].as_str().unwrap()).unwrap();
    let token = seeded["envdAccessToken"].as_str().map(str::to_owned);
    (id, token)
}

/// An envd client for sandbox `id` of `sim`, through the simulator's envd address, speaking
/// to a current envd (uploads as `application/octet-stream`).
pub fn envd_client(sim: &SimServer, id: &SandboxId, token: Option<&str>) -> EnvdClient {
    envd_client_for(sim, id, token, EnvdVersion::new(0, 5, 7))
}

/// [`envd_client`] for an envd of `version`.
pub fn envd_client_for(
    sim: &SimServer,
    id: &SandboxId,
    token: Option<&str>,
    version: EnvdVersion,
) -> EnvdClient {
    let address = EnvdAddress::resolve(Some(&sim.envd_url()), id, None);
    EnvdClient::new(
        id.clone(),
        address,
        token.map(|t| secrecy::SecretString::from(t.to_owned())),
        version,
    )
    .expect("a client")
}

/// A policy that posts cards to [`APPROVALS`], where only U0002 may choose Kill and anyone may
/// pause, leave or keep.
pub fn approvals_policy() -> String {
    format!(
        r#"
[channels]
approvals = "{APPROVALS}"
[approvals.approvers]
kill = {{ users = ["U0002"] }}
pause = {{ anyone = true }}
leave = {{ anyone = true }}
keep = {{ anyone = true }}
"#
    )
}
/// How long to wait for a background task to reach the fake Slack before failing a test.
const WAIT_FOR_POST: Duration = Duration::from_secs(20);

/// What to start.
pub struct TestAppOptions {
    /// Seeded sandboxes in the E2B simulator.
    pub sandboxes: usize,
    /// Whether to configure E2B at all (false leaves E2B_API_KEY unset).
    pub with_e2b: bool,
    /// Extra or overriding environment variables.
    pub env: Vec<(String, String)>,
    /// Retry policy of the app's E2B client; tests that force failures make it short.
    pub e2b_retry: RetryPolicy,
    /// Redis to use (default `REDIS_URL` or the local one).
    pub redis_url: Option<String>,
    /// Key prefix (default: a fresh one per app, so tests never share data).
    pub redis_prefix: Option<String>,
    /// The text of a steward.toml to load.
    pub policy: Option<String>,
    /// Whether the app runs its queue worker.
    pub worker: bool,
    /// How long a claimed job sits unacknowledged before this app's worker takes it over.
    pub stale_after: Duration,
    /// How often the expiry loop runs.
    pub expire_every: Duration,
    /// How often the E2B events poller runs; `None` (the default here): not at all.
    pub events_poll_every: Option<Duration>,
    /// Whether the E2B simulator runs sandbox commands as local processes (`--exec local`);
    /// Steward then reaches its envd through `E2B_SANDBOX_URL`.
    pub exec_local: bool,
}

impl Default for TestAppOptions {
    fn default() -> Self {
        Self {
            sandboxes: 5,
            with_e2b: true,
            env: Vec::new(),
            e2b_retry: RetryPolicy {
                max_attempts: 2,
                base_delay: Duration::from_millis(10),
                max_delay: Duration::from_millis(50),
                max_retry_after: Duration::from_millis(50),
            },
            redis_url: None,
            redis_prefix: None,
            policy: None,
            worker: true,
            stale_after: Duration::from_secs(120),
            expire_every: Duration::from_millis(200),
            events_poll_every: None,
            exec_local: false,
        }
    }
}

/// The local Redis every test uses unless told otherwise.
pub fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// A port nothing listens on: bound, read, and let go (a dead Redis, E2B or proxy address).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A key prefix no other test uses.
pub fn unique_prefix() -> String {
    format!("test-{}", uuid::Uuid::new_v4().simple())
}

/// `steward serve` as a process of its own, so its metrics and its log are its own: a clean
/// environment (`PATH`, `NO_COLOR`, `STEWARD_LISTEN=127.0.0.1:0`, `REDIS_URL` and a fresh key
/// prefix, removed afterwards) plus `env`. Its log (stderr) is read up to the line saying where it
/// listens; the rest is for the test to read ([`ServeProcess::stop`]) or to drain
/// ([`ServeProcess::drain_log`]).
pub struct ServeProcess {
    pub child: tokio::process::Child,
    /// `host:port` it listens on.
    pub addr: String,
    log: Option<tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStderr>>>,
    _cleanup: PrefixCleanup,
}

pub async fn serve_process(env: &[(&str, &str)]) -> ServeProcess {
    use tokio::io::AsyncBufReadExt;
    let cleanup = PrefixCleanup {
        url: redis_url(),
        prefix: unique_prefix(),
    };
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_steward"))
        .arg("serve")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("NO_COLOR", "1")
        .env("STEWARD_LISTEN", "127.0.0.1:0")
        .env("REDIS_URL", &cleanup.url)
        .env("STEWARD_REDIS_PREFIX", &cleanup.prefix)
        .envs(env.iter().copied())
        .current_dir(std::env::temp_dir())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut log = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let addr = tokio::time::timeout(PATIENCE, async {
        while let Some(line) = log.next_line().await.unwrap() {
            if let Some(at) = line.find("Steward listening addr=") {
                let rest = &line[at + "Steward listening addr=".len()..];
                return rest.split_whitespace().next().unwrap().to_owned();
            }
        }
        panic!("steward serve ended without listening (RUST_LOG must let startup's info through)");
    })
    .await
    .expect("steward serve listens");
    ServeProcess {
        child,
        addr,
        log: Some(log),
        _cleanup: cleanup,
    }
}

impl ServeProcess {
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Keeps reading its log in the background, so it never blocks on a full pipe.
    pub fn drain_log(&mut self) {
        if let Some(mut log) = self.log.take() {
            tokio::spawn(async move { while let Ok(Some(_)) = log.next_line().await {} });
        }
    }

    /// Stops it and returns what it logged after saying where it listens.
    pub async fn stop(mut self) -> String {
        self.child.kill().await.unwrap();
        let mut rest = String::new();
        if let Some(mut log) = self.log.take() {
            while let Ok(Some(line)) = log.next_line().await {
                rest.push_str(&line);
                rest.push('\n');
            }
        }
        rest
    }
}

/// Deletes every key under a test's prefix when dropped (even when the test panics), so tests
/// leave the shared Redis as they found it.
pub struct PrefixCleanup {
    pub url: String,
    pub prefix: String,
}

impl Drop for PrefixCleanup {
    fn drop(&mut self) {
        let Ok(client) = redis::Client::open(self.url.as_str()) else {
            return;
        };
        let Ok(mut conn) = client.get_connection() else {
            return;
        };
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{}:*", self.prefix))
            .query(&mut conn)
            .unwrap_or_default();
        if !keys.is_empty() {
            let _: Result<i64, _> = redis::cmd("DEL").arg(keys).query(&mut conn);
        }
    }
}

/// A running Steward with its fakes.
pub struct TestApp {
    /// `http://127.0.0.1:PORT` of Steward.
    pub address: String,
    pub port: u16,
    pub slack: Arc<SlackSim>,
    pub e2b: Arc<SimServer>,
    pub redis_url: String,
    pub redis_prefix: String,
    pub signing_secret: String,
    pub state: AppState,
    pub http: reqwest::Client,
    stop: Option<oneshot::Sender<()>>,
    running: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
    /// Set on the app that made up the prefix; its peers share the prefix and leave it alone.
    _cleanup: Option<PrefixCleanup>,
}

impl Drop for TestApp {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

pub async fn spawn_app() -> TestApp {
    spawn_app_with(TestAppOptions::default()).await
}

pub async fn spawn_app_with(opts: TestAppOptions) -> TestApp {
    sandbox_steward::telemetry::init("error");
    let slack = SlackSim::start(SlackSimOptions::default())
        .await
        .expect("fake Slack starts");
    let e2b = SimServer::start(SimOptions {
        sandboxes: opts.sandboxes,
        api_key: Some(E2B_KEY.into()),
        exec: if opts.exec_local {
            sandbox_steward::sim::e2b::ExecMode::Local
        } else {
            sandbox_steward::sim::e2b::ExecMode::Off
        },
        ..SimOptions::default()
    })
    .await
    .expect("E2B simulator starts");
    start_app(Arc::new(slack), Arc::new(e2b), opts).await
}

impl TestApp {
    /// Stops Steward the way SIGTERM does and waits until `run_until_stopped` has returned.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(running) = self.running.take() {
            running
                .await
                .expect("Steward's serve task did not panic")
                .expect("Steward stopped cleanly");
        }
    }

    /// A second replica: same fake Slack, same E2B simulator, same Redis and key prefix.
    pub async fn spawn_peer(&self, opts: TestAppOptions) -> TestApp {
        let opts = TestAppOptions {
            redis_url: Some(self.redis_url.clone()),
            redis_prefix: Some(self.redis_prefix.clone()),
            ..opts
        };
        start_app(self.slack.clone(), self.e2b.clone(), opts).await
    }
}

/// The environment `steward serve` gets in tests: the simulators, Redis under `redis_prefix`,
/// the options' policy (written to `config_dir/steward.toml`) and extra variables.
pub fn app_env(
    slack: &SlackSim,
    e2b: &SimServer,
    redis_url: &str,
    redis_prefix: &str,
    opts: &TestAppOptions,
    config_dir: &std::path::Path,
) -> HashMap<String, String> {
    let mut env: HashMap<String, String> = [
        ("STEWARD_LISTEN", "127.0.0.1:0".to_owned()),
        ("SLACK_API_URL", slack.api_url()),
        ("SLACK_BOT_TOKEN", BOT_TOKEN.to_owned()),
        ("SLACK_SIGNING_SECRET", SIGNING_SECRET.to_owned()),
        ("E2B_API_URL", e2b.base_url()),
        ("E2B_PROJECT_ID", e2b.team_id().to_owned()),
        // envd of the simulator's sandboxes (the data plane runs use).
        ("E2B_SANDBOX_URL", e2b.envd_url()),
        ("REDIS_URL", redis_url.to_owned()),
        ("STEWARD_REDIS_PREFIX", redis_prefix.to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    if opts.with_e2b {
        env.insert("E2B_API_KEY".into(), E2B_KEY.into());
    }
    if let Some(policy) = &opts.policy {
        let path = config_dir.join("steward.toml");
        std::fs::write(&path, policy).expect("steward.toml is written");
        env.insert("STEWARD_CONFIG".into(), path.display().to_string());
    }
    env.extend(opts.env.clone());
    env
}

/// Steward against simulators the test started itself (a big fleet, latency).
pub async fn spawn_app_on(
    slack: Arc<SlackSim>,
    e2b: Arc<SimServer>,
    opts: TestAppOptions,
) -> TestApp {
    start_app(slack, e2b, opts).await
}

async fn start_app(slack: Arc<SlackSim>, e2b: Arc<SimServer>, opts: TestAppOptions) -> TestApp {
    let redis_url = opts.redis_url.clone().unwrap_or_else(redis_url);
    let cleanup = opts.redis_prefix.is_none().then(|| PrefixCleanup {
        url: redis_url.clone(),
        prefix: unique_prefix(),
    });
    let redis_prefix = match (&opts.redis_prefix, &cleanup) {
        (Some(prefix), _) => prefix.clone(),
        (None, Some(cleanup)) => cleanup.prefix.clone(),
        (None, None) => unique_prefix(),
    };
    let config_dir = tempfile::tempdir().expect("a temporary directory");
    let env = app_env(
        &slack,
        &e2b,
        &redis_url,
        &redis_prefix,
        &opts,
        config_dir.path(),
    );
    let settings = Settings::load(&env).expect("test settings load");
    let signing_secret = env.get("SLACK_SIGNING_SECRET").cloned().unwrap_or_default();
    let mut app = Application::build(settings).await.expect("app builds");
    if let Some(client) = app.state_mut().e2b.take() {
        app.state_mut().e2b = Some(client.with_retry_policy(opts.e2b_retry));
    }
    let loops = app.loops_mut();
    loops.worker_enabled = opts.worker;
    loops.worker.block = Duration::from_millis(200);
    loops.worker.reclaim_every = Duration::from_millis(200);
    loops.worker.stale_after = opts.stale_after;
    loops.expire_every = opts.expire_every;
    // The events poller reads E2B's events API; only the tests about it turn it on.
    loops.events_poll_every = opts.events_poll_every;
    let port = app.port();
    let state = app.state().clone();
    let (stop, stopped) = oneshot::channel::<()>();
    let running = tokio::spawn(app.run_until_stopped(async {
        let _ = stopped.await;
    }));
    TestApp {
        address: format!("http://127.0.0.1:{port}"),
        port,
        slack,
        e2b,
        redis_url,
        redis_prefix,
        signing_secret,
        state,
        http: reqwest::Client::new(),
        stop: Some(stop),
        running: Some(running),
        _cleanup: cleanup,
    }
}

pub fn unix_now() -> i64 {
    chrono::Utc::now().timestamp()
}

/// A slash-command form as Slack sends it.
pub fn command_form(text: &str, user: &str, response_url: &str) -> String {
    form_urlencoded::Serializer::new(String::new())
        .append_pair("token", "legacy-verification-token")
        .append_pair("team_id", "T0001")
        .append_pair("team_domain", "example")
        .append_pair("channel_id", "C0001")
        .append_pair("channel_name", "ops")
        .append_pair("user_id", user)
        .append_pair("user_name", "someone")
        .append_pair("command", "/sandbox")
        .append_pair("text", text)
        .append_pair("response_url", response_url)
        .append_pair("trigger_id", "13345224609.738474920.8088930838d88f008e0")
        .append_pair("api_app_id", "A0001")
        .finish()
}

/// An interaction form (`payload=<json>`).
pub fn interaction_form(payload: &Value) -> String {
    form_urlencoded::Serializer::new(String::new())
        .append_pair("payload", &payload.to_string())
        .finish()
}

impl TestApp {
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.address)
    }

    /// `X-Slack-Signature` for `body` at `timestamp` with the app's secret.
    pub fn sign(&self, timestamp: i64, body: &[u8]) -> String {
        signature::sign(&self.signing_secret, timestamp, body)
    }

    /// POSTs a correctly signed body (timestamp: now).
    pub async fn post_signed(
        &self,
        path: &str,
        content_type: &str,
        body: String,
    ) -> reqwest::Response {
        let ts = unix_now();
        let sig = self.sign(ts, body.as_bytes());
        self.http
            .post(self.url(path))
            .header("content-type", content_type)
            .header("x-slack-request-timestamp", ts.to_string())
            .header("x-slack-signature", sig)
            .body(body)
            .send()
            .await
            .expect("request reaches the app")
    }

    /// A signed `/sandbox <text>` from user U0001 whose response_url is the fake's
    /// `hooks/<hook>`.
    pub async fn post_command_to(&self, text: &str, hook: &str) -> reqwest::Response {
        let body = command_form(text, "U0001", &self.slack.response_url(hook));
        self.post_signed("/slack/commands", "application/x-www-form-urlencoded", body)
            .await
    }

    /// A signed `/sandbox <text>`; the response_url is `hooks/cmd`.
    pub async fn post_command(&self, text: &str) -> reqwest::Response {
        self.post_command_to(text, "cmd").await
    }

    /// Posts `/sandbox <text>`, checks the immediate answer is the "Working on it…" ack, and
    /// returns what the background task posted to the response_url.
    pub async fn run_deferred(&self, text: &str) -> Recorded {
        let hook = format!("h{}", uuid::Uuid::new_v4().simple());
        let resp = self.post_command_to(text, &hook).await;
        assert_eq!(resp.status(), 200);
        let ack: Value = resp.json().await.unwrap();
        assert!(
            ack["text"]
                .as_str()
                .unwrap_or_default()
                .contains("Working on it"),
            "{ack}"
        );
        self.wait_for_hook(&hook).await
    }

    /// A signed interaction.
    pub async fn post_interaction(&self, payload: &Value) -> reqwest::Response {
        self.post_signed(
            "/slack/interactions",
            "application/x-www-form-urlencoded",
            interaction_form(payload),
        )
        .await
    }

    /// Waits until something was posted to `hooks/<name>` and returns the first post.
    pub async fn wait_for_hook(&self, name: &str) -> Recorded {
        wait_until(&format!("a post to hooks/{name}"), || async {
            self.slack.hook_posts(name).into_iter().next()
        })
        .await
    }

    /// API calls the E2B simulator has counted, by operation.
    pub async fn e2b_calls(&self) -> HashMap<String, u64> {
        self.e2b.hooks().calls().await.unwrap()
    }

    /// Seeds one sandbox in the E2B simulator.
    pub async fn seed_sandbox(&self, body: Value) -> Value {
        self.e2b.hooks().seed(body).await.unwrap()
    }

    /// Queues a fault in the E2B simulator.
    pub async fn e2b_fault(&self, body: Value) {
        self.e2b.hooks().fault_from(body).await.unwrap()
    }
}

/// How long [`poll_until`] waits between two checks. Not a synchronisation: the condition is
/// what ends the wait; this only keeps the loop from spinning a core the app needs.
const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// Polls `check` until it gives a value, failing the test with `what` after [`WAIT_FOR_POST`].
/// Tests wait on an observable condition this way, never with a bare sleep.
pub async fn wait_until<T, F, Fut>(what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    poll_until(WAIT_FOR_POST, what, check).await
}

/// `check` until it gives a value, failing the test with `what` once `patience` has passed.
pub async fn poll_until<T, F, Fut>(patience: Duration, what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    poll_for(patience, check)
        .await
        .unwrap_or_else(|| panic!("gave up waiting: {what}"))
}

/// The one polling loop of the tests: `check` until it gives a value, or `None` once
/// `patience` has passed (for a caller whose failure says more than [`poll_until`]'s).
pub async fn poll_for<T, F, Fut>(patience: Duration, mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + patience;
    loop {
        if let Some(value) = check().await {
            return Some(value);
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// [`poll_for`] for code that cannot await (starting a server before any runtime): whether
/// `check` held before `patience` passed.
pub fn poll_for_blocking(patience: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + patience;
    loop {
        if check() {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(POLL_INTERVAL);
    }
}

impl TestApp {
    /// Waits until the fake Slack recorded a message `matches` accepts, and returns it.
    pub async fn wait_for_message(
        &self,
        what: &str,
        matches: impl Fn(&Recorded) -> bool,
    ) -> Recorded {
        wait_until(what, || async {
            self.slack.messages().into_iter().find(|m| matches(m))
        })
        .await
    }

    /// Waits until the E2B simulator counted at least `at_least` calls of `op`.
    pub async fn wait_for_e2b_calls(&self, op: &str, at_least: u64) -> u64 {
        wait_until(&format!("{at_least} E2B {op} call(s)"), || async {
            let n = self.e2b.hooks().calls_of(op).await.unwrap_or(0);
            (n >= at_least).then_some(n)
        })
        .await
    }
}

/// A forwarding front for a simulator on a random port. Requests whose path `matches` are
/// counted (arrived, in flight, most in flight at once) and held while the front is closed;
/// everything else passes straight through. Lets a test see how many calls a client makes at
/// once, or act while a call is under way.
pub struct HoldingFront {
    pub url: String,
    state: Arc<FrontState>,
}

struct FrontState {
    target: String,
    matches: Box<dyn Fn(&str) -> bool + Send + Sync>,
    open: tokio::sync::watch::Sender<bool>,
    arrived: std::sync::atomic::AtomicUsize,
    in_flight: std::sync::atomic::AtomicUsize,
    max_in_flight: std::sync::atomic::AtomicUsize,
    http: reqwest::Client,
}

impl HoldingFront {
    /// Fronts `target` (a base URL); matching requests are held until [`HoldingFront::open`].
    pub async fn start(
        target: &str,
        matches: impl Fn(&str) -> bool + Send + Sync + 'static,
    ) -> Self {
        let state = Arc::new(FrontState {
            target: target.trim_end_matches('/').to_owned(),
            matches: Box::new(matches),
            open: tokio::sync::watch::channel(false).0,
            arrived: Default::default(),
            in_flight: Default::default(),
            max_in_flight: Default::default(),
            http: reqwest::Client::new(),
        });
        let app = axum::Router::new()
            .fallback(front_forward)
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { url, state }
    }

    /// Lets every held request (and every later one) through.
    pub fn open(&self) {
        self.state.open.send_replace(true);
    }

    pub fn arrived(&self) -> usize {
        self.state.arrived.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub fn in_flight(&self) -> usize {
        self.state
            .in_flight
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    pub fn max_in_flight(&self) -> usize {
        self.state
            .max_in_flight
            .load(std::sync::atomic::Ordering::SeqCst)
    }
}

async fn front_forward(
    axum::extract::State(front): axum::extract::State<Arc<FrontState>>,
    req: axum::extract::Request,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    use std::sync::atomic::Ordering::SeqCst;
    let (parts, body) = req.into_parts();
    let bytes = axum::body::to_bytes(body, usize::MAX).await.unwrap();
    let path = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_default();
    let counted = (front.matches)(parts.uri.path());
    if counted {
        front.arrived.fetch_add(1, SeqCst);
        let now = front.in_flight.fetch_add(1, SeqCst) + 1;
        front.max_in_flight.fetch_max(now, SeqCst);
        let mut open = front.open.subscribe();
        let _ = open.wait_for(|o| *o).await;
    }
    let mut forward = front
        .http
        .request(parts.method, format!("{}{path}", front.target))
        .body(bytes);
    for (name, value) in &parts.headers {
        if name != "host" && name != "content-length" {
            forward = forward.header(name, value);
        }
    }
    let resp = forward.send().await.unwrap();
    let status = resp.status();
    let mut headers = resp.headers().clone();
    headers.remove("content-length");
    headers.remove("transfer-encoding");
    let body = resp.bytes().await.unwrap();
    if counted {
        front.in_flight.fetch_sub(1, SeqCst);
    }
    (status, headers, body).into_response()
}

/// All the text a recorded Slack post shows: fallback text plus every block's text.
pub fn visible_text(rec: &Recorded) -> String {
    let mut out = rec.text.clone().unwrap_or_default();
    if let Some(blocks) = &rec.blocks {
        collect_text(blocks, &mut out);
    }
    out
}

/// All the text of an inline JSON answer.
pub fn visible_json_text(v: &Value) -> String {
    let mut out = v["text"].as_str().unwrap_or_default().to_owned();
    collect_text(&v["blocks"], &mut out);
    out
}

fn collect_text(v: &Value, out: &mut String) {
    match v {
        Value::Object(map) => {
            for (k, v) in map {
                if let (true, Some(s)) = (k == "text", v.as_str()) {
                    out.push('\n');
                    out.push_str(s);
                    continue;
                }
                collect_text(v, out);
            }
        }
        Value::Array(items) => items.iter().for_each(|i| collect_text(i, out)),
        _ => {}
    }
}

/// A `redis-server` of our own on a free port, killed when dropped (to sabotage Redis mid-test).
pub struct ThrowawayRedis {
    child: std::process::Child,
    port: u16,
}

impl ThrowawayRedis {
    /// Starts the server and waits until it answers.
    pub fn start() -> Self {
        let port = free_port();
        Self::start_on(port)
    }

    /// Starts the server on `port` and waits until it answers.
    pub fn start_on(port: u16) -> Self {
        let child = std::process::Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("redis-server must be installed for this test");
        let server = Self { child, port };
        let answers = || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok();
        assert!(
            poll_for_blocking(Duration::from_secs(5), answers),
            "the throwaway redis-server never answered"
        );
        server
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

/// A `redis-server` as production runs it: append-only file on (`appendfsync everysec`) in a
/// directory of its own, so it can be restarted on the same port and come back with its data.
pub struct DurableRedis {
    child: Option<std::process::Child>,
    port: u16,
    dir: tempfile::TempDir,
}

impl DurableRedis {
    pub fn start() -> Self {
        let mut redis = Self {
            child: None,
            port: free_port(),
            dir: tempfile::tempdir().unwrap(),
        };
        redis.launch();
        redis
    }

    fn launch(&mut self) {
        let child = std::process::Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args([
                "--appendonly",
                "yes",
                "--appendfsync",
                "everysec",
                "--save",
                "",
            ])
            .arg("--dir")
            .arg(self.dir.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("redis-server must be installed for this test");
        self.child = Some(child);
        let port = self.port;
        let answers = || {
            redis::Client::open(format!("redis://127.0.0.1:{port}"))
                .and_then(|c| c.get_connection())
                .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
                .is_ok()
        };
        assert!(
            poll_for_blocking(Duration::from_secs(20), answers),
            "the durable redis-server never answered"
        );
    }

    /// Stops the server as an operator's restart does (SIGTERM: it writes its file and exits),
    /// then starts it again on the same port and directory; returns once it answers.
    pub fn restart(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            let _ = child.wait();
        }
        self.launch();
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

impl Drop for DurableRedis {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for ThrowawayRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// How long a test waits for something that should happen (a job, a card update) before failing.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// Polls `check` until it holds, failing the test after [`PATIENCE`].
pub async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    poll_until(PATIENCE, what, || {
        let holds = check();
        async move { holds.await.then_some(()) }
    })
    .await
}

/// The case id named in a reply (the first `case_…` in `text`).
pub fn case_id_in(text: &str) -> sandbox_steward::ids::CaseId {
    let start = text
        .find("case_")
        .unwrap_or_else(|| panic!("no case id in {text}"));
    let id: String = text[start..]
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    sandbox_steward::ids::CaseId::parse(id).unwrap()
}

/// POSTs `body` to the Slack simulator's Socket Mode control `/_sim/socket/{path}` (`send`,
/// `drop`, `outage`): its status and JSON answer.
pub async fn sim_socket_post(sim: &SlackSim, path: &str, body: Value) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .post(format!("{}/_sim/socket/{path}", sim.base_url()))
        .json(&body)
        .send()
        .await
        .unwrap();
    (resp.status().as_u16(), resp.json().await.unwrap())
}

/// GETs the Slack simulator's Socket Mode view `/_sim/socket/{path}` (`acks`, `connections`) from
/// the simulator at `base_url`: its JSON answer.
pub async fn sim_socket_get(base_url: &str, path: &str) -> Value {
    get_json(&format!("{base_url}/_sim/socket/{path}")).await
}

/// GETs `url` and reads its answer as JSON (a simulator's view, `/readyz`, …), whatever its
/// status.
pub async fn get_json(url: &str) -> Value {
    reqwest::get(url)
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"))
        .json()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: not JSON: {e}"))
}

/// A fresh name for a response_url hook (or an action_ts).
pub fn hook() -> String {
    format!("h{}", uuid::Uuid::new_v4().simple())
}

impl TestApp {
    /// Every modal Steward opened (`views.open`), oldest first.
    pub fn modals_opened(&self) -> Vec<Value> {
        self.slack
            .messages()
            .into_iter()
            .filter(|m| m.method == "views.open")
            .map(|m| match m.body["view"].clone() {
                Value::String(s) => serde_json::from_str(&s).unwrap(),
                v => v,
            })
            .collect()
    }

    /// The latest modal Steward opened, once it has opened more than `before`.
    pub async fn opened_modal(&self, before: usize) -> Value {
        eventually("a modal opens", || async {
            self.modals_opened().len() > before
        })
        .await;
        self.modals_opened().pop().unwrap()
    }

    /// `user` submits the reason modal `view` (with an optional "keep until" date); returns
    /// Steward's answer, `Null` when the modal simply closes.
    pub async fn submit_reason(
        &self,
        view: &Value,
        user: &str,
        reason: &str,
        until: Option<&str>,
    ) -> Value {
        let payload = reason_submission(view, user, reason, until);
        let resp = self.post_interaction(&payload).await;
        assert_eq!(resp.status(), 200);
        let body = resp.text().await.unwrap();
        if body.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&body).unwrap()
        }
    }

    /// A signed click on a case card's button, sent from the case's own card as Slack does (the
    /// container names the card's channel and ts); replies go to `hooks/<reply_hook>`.
    ///
    /// A card is posted to Slack first and recorded on its case after, so a test that saw the
    /// post may be early: this waits until the case records its card (a person cannot click a
    /// card before it exists either). When the store cannot be read (a test with Redis stopped)
    /// the click names the approvals channel and no message.
    pub async fn click_case(
        &self,
        case: &sandbox_steward::ids::CaseId,
        action_id: &str,
        user: &str,
        reply_hook: &str,
        action_ts: &str,
    ) -> reqwest::Response {
        let card = wait_until(&format!("case {case} records its card"), || async {
            match self.state.store.get_case(case).await {
                Ok(c) => c.card.map(Some),
                Err(_) => Some(None),
            }
        })
        .await;
        let (channel, ts) = card
            .map(|c| (c.channel.to_string(), c.ts))
            .unwrap_or_else(|| ("C0APPROVALS".to_owned(), String::new()));
        let payload = serde_json::json!({
            "type": "block_actions",
            "user": {"id": user},
            "trigger_id": format!("trigger-{}", hook()),
            "response_url": self.slack.response_url(reply_hook),
            "container": {"type": "message", "channel_id": channel, "message_ts": ts},
            "channel": {"id": channel},
            "actions": [{"action_id": action_id, "block_id": "b", "value": case.as_str(), "action_ts": action_ts}],
        });
        self.post_interaction(&payload).await
    }
}

/// `user`'s submission of the reason modal `view` (with an optional "keep until" date), the
/// `view_submission` payload Slack sends (over HTTP as the form's `payload`, over Socket Mode as
/// the envelope's).
pub fn reason_submission(view: &Value, user: &str, reason: &str, until: Option<&str>) -> Value {
    serde_json::json!({
        "type": "view_submission",
        "user": {"id": user},
        "view": {
            "id": format!("V{}", hook()),
            "callback_id": view["callback_id"],
            "private_metadata": view["private_metadata"],
            "hash": "h1",
            "state": {"values": {
                "reason": {"reason_text": {"type": "plain_text_input", "value": reason}},
                "until": {"until_date": {"type": "datepicker", "selected_date": until}},
            }},
        },
    })
}
