//! The E2B simulator served by `steward sim e2b`: a real HTTP server on 127.0.0.1 that behaves
//! like E2B's control-plane API (`shared/e2b/openapi.yml`, `shared/notes/e2b-api.md`).
//!
//! It holds a seeded, deterministic team (templates, a fleet of N sandboxes with metric and log
//! series) and applies E2B's rules: state transitions, TTLs, 404/409 bodies, paging tokens,
//! metric batches, snapshots as templates. Test hooks live under `/_sim/` (call counters, fault
//! injection before or after handling, paging sabotage, seeding and changing one sandbox) and
//! bypass auth, latency and faults.
//!
//! It is an independent implementation: it must not use Steward's E2B client (`crate::e2b`),
//! and production code must never call it. Choices where the notes leave E2B's behaviour open:
//! - An unknown `templateID` on create is 404 `Template <ref> not found`.
//! - Deleting a template that running or paused sandboxes use is 400, as the notes report.
//! - Metric queries return at most ~360 points: the step is `max(5 s, window / 360)` rounded up
//!   to a multiple of 5 s, on a grid aligned to the Unix epoch, over the sandbox's runs only.
//! - The batch metrics map holds running sandboxes that have a sample (the latest 5 s grid
//!   point at or after their start); paused and unknown ids are left out.
//! - A snapshot of a running sandbox pauses it briefly, as E2B's does: the sandbox goes on
//!   running in a new run (`startedAt` moves to the snapshot time, `endAt` is kept).
//! - `POST /_sim/sandboxes` creates an unknown template on the fly (2 CPU, 1024 MB, 4096 MB disk
//!   unless the request gives sizes).
//!
//! A second port serves envd (`envd.rs`) the way `E2B_SANDBOX_URL` reaches it: requests name the
//! sandbox in `E2b-Sandbox-Id`/`E2b-Sandbox-Port` headers. Files live in a scratch directory per
//! sandbox; with `--exec local` commands run as processes of this machine (`exec.rs`), and a
//! sandbox that ran something shows their real CPU, memory and disk in its metrics from then on.
use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::ops::{Deref, DerefMut};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::Router;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, patch, post};
use secrecy::{ExposeSecret, SecretString};
use subtle::ConstantTimeEq;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use self::exec::Exec;
pub use self::exec::ExecMode;
pub use self::hooks::SimHooks;
use self::model::World;
use self::series::{Ms, mix, unit};
use self::wire::{ApiError, encode_token};

mod admin;
mod api;
mod envd;
mod events;
mod exec;
mod fleet;
mod hooks;
mod lifecycle;
mod model;
mod series;
mod story;
mod wire;

/// The team id the simulator answers for unless told otherwise.
pub const DEFAULT_TEAM_ID: &str = "4f1e2b5c-7a3d-4c8e-9b21-5d6f7e8a9b0c";
/// Fleet size when `--sandboxes` is not given.
pub const DEFAULT_SANDBOXES: usize = 50;

/// How to run the simulator (`steward sim e2b --help`).
#[derive(Clone, clap::Args)]
pub struct SimOptions {
    /// Port on 127.0.0.1; 0 picks a free one.
    #[arg(long, default_value_t = 0)]
    pub port: u16,
    /// Size of the seeded fleet.
    #[arg(long, default_value_t = DEFAULT_SANDBOXES)]
    pub sandboxes: usize,
    /// Seed for the fleet, its metrics and logs, and random faults.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Delay added to every API request (not to `/_sim/` admin requests).
    #[arg(long, default_value_t = 0)]
    pub latency_ms: u64,
    /// Share of API requests (0.0 to 1.0) that fail at random with 500, 502, 503 or 429.
    #[arg(long, default_value_t = 0.0)]
    pub fault_rate: f64,
    /// When set, API requests must carry this `X-API-Key`.
    #[arg(long)]
    pub api_key: Option<String>,
    /// The team id the API key belongs to (team metrics of other teams get 403).
    #[arg(long, default_value = DEFAULT_TEAM_ID)]
    pub team_id: String,
    /// Port on 127.0.0.1 for envd (`E2B_SANDBOX_URL`); 0 picks a free one.
    #[arg(long, default_value_t = 0)]
    pub envd_port: u16,
    /// `local` runs the commands sent to envd as real processes ON THIS MACHINE (in a scratch
    /// directory per sandbox, with a minimal environment); `off` refuses them.
    #[arg(long, value_enum, default_value_t = ExecMode::Off)]
    pub exec: ExecMode,
    /// Seed the demo's story fleet (40 sandboxes: busy, idle, paused for days, one kept, two
    /// templates, two snapshots) instead of `--sandboxes` random ones.
    #[arg(long)]
    pub story: bool,
    /// Play an older self-hosted E2B without the v2 routes: `POST /v2/sandboxes` and
    /// `POST /v2/sandboxes/{id}/connect` answer 404, as a server without them does.
    #[arg(long)]
    pub v1_only: bool,
    /// The `envdVersion` sandboxes announce (clients choose the upload encoding and features by
    /// it; 0.5.7 and later take `application/octet-stream` uploads).
    #[arg(long, default_value = model::DEFAULT_ENVD_VERSION)]
    pub envd_version: String,
}

impl Default for SimOptions {
    fn default() -> Self {
        Self {
            port: 0,
            sandboxes: DEFAULT_SANDBOXES,
            seed: 42,
            latency_ms: 0,
            fault_rate: 0.0,
            api_key: None,
            team_id: DEFAULT_TEAM_ID.to_owned(),
            envd_port: 0,
            exec: ExecMode::Off,
            story: false,
            v1_only: false,
            envd_version: model::DEFAULT_ENVD_VERSION.to_owned(),
        }
    }
}

impl fmt::Debug for SimOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimOptions")
            .field("port", &self.port)
            .field("sandboxes", &self.sandboxes)
            .field("seed", &self.seed)
            .field("latency_ms", &self.latency_ms)
            .field("fault_rate", &self.fault_rate)
            .field("api_key", &self.api_key.as_ref().map(|_| "[REDACTED]"))
            .field("team_id", &self.team_id)
            .field("envd_port", &self.envd_port)
            .field("exec", &self.exec)
            .field("story", &self.story)
            .field("v1_only", &self.v1_only)
            .field("envd_version", &self.envd_version)
            .finish()
    }
}

/// What `POST /_sim/paging` can make list endpoints do to their `X-Next-Token`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PagingMode {
    Normal,
    /// Every page hands back the token it was given: a client must notice the loop.
    Repeat,
    /// Every page hands out a fresh token forever: a client must stop on its own.
    Endless,
}

/// A queued failure from `POST /_sim/faults`.
pub(crate) struct FaultRule {
    pub op: Option<String>,
    pub status: StatusCode,
    pub remaining: u32,
    pub retry_after_secs: u64,
    pub error_code: Option<String>,
    /// The error body's `message`, instead of the status's usual one.
    pub message: Option<String>,
    /// Handle the request first (the change happens), then answer with the fault: a lost
    /// response, as when a proxy times out after E2B acted.
    pub after: bool,
}

/// Test hooks' state, apart from the world so counting never waits on a big list.
pub(crate) struct Control {
    pub calls: BTreeMap<&'static str, u64>,
    pub faults: Vec<FaultRule>,
    pub paging: PagingMode,
}

/// Everything the handlers share.
pub(crate) struct Sim {
    world: Mutex<World>,
    /// Scratch directories, local processes and their live samples.
    exec: Exec,
    control: Mutex<Control>,
    latency: Duration,
    fault_rate: f64,
    api_key: Option<SecretString>,
    seed: u64,
    fault_draws: AtomicU64,
    endless_tokens: AtomicU64,
    /// `--v1-only`: the v2 create and connect routes answer 404.
    v1_only: bool,
    /// Webhook registrations, delivery faults and the attempts made.
    hooks: Mutex<events::Hooks>,
    /// Woken when the world recorded lifecycle events, so the deliverer sends them at once.
    events_changed: tokio::sync::Notify,
}

pub(crate) fn now_ms() -> Ms {
    chrono::Utc::now().timestamp_millis()
}

/// The locked world. When it is released, sandboxes paused or killed meanwhile (by a handler,
/// a hook or TTL expiry) have their processes stopped, so no path can forget to.
pub(crate) struct WorldGuard<'a> {
    world: MutexGuard<'a, World>,
    exec: &'a Exec,
    changed: &'a tokio::sync::Notify,
    /// The last lifecycle event's sequence when the lock was taken.
    events_before: u64,
}

impl Deref for WorldGuard<'_> {
    type Target = World;

    fn deref(&self) -> &World {
        &self.world
    }
}

impl DerefMut for WorldGuard<'_> {
    fn deref_mut(&mut self) -> &mut World {
        &mut self.world
    }
}

impl Drop for WorldGuard<'_> {
    fn drop(&mut self) {
        let ended = self.world.take_ended();
        if !ended.is_empty() {
            self.exec.stop(ended);
        }
        if self.world.events.last_seq() != self.events_before {
            self.changed.notify_one();
        }
    }
}

impl Sim {
    /// The world with expired TTLs already applied. Never hold it across an `.await`.
    pub(crate) fn world(&self, now: Ms) -> WorldGuard<'_> {
        let mut world = self.world.lock().unwrap_or_else(|e| e.into_inner());
        let events_before = world.events.last_seq();
        world.expire(now);
        WorldGuard {
            world,
            exec: &self.exec,
            changed: &self.events_changed,
            events_before,
        }
    }

    pub(crate) fn exec(&self) -> &Exec {
        &self.exec
    }

    pub(crate) fn hooks(&self) -> MutexGuard<'_, events::Hooks> {
        self.hooks.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn team_id(&self) -> String {
        self.world(now_ms()).team_id.clone()
    }

    pub(crate) fn control(&self) -> MutexGuard<'_, Control> {
        self.control.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn paging(&self) -> PagingMode {
        self.control().paging
    }

    /// The `X-Next-Token` a list answers with, after any paging sabotage.
    pub(crate) fn next_token(
        &self,
        mode: PagingMode,
        incoming: Option<&str>,
        computed: Option<String>,
    ) -> Option<String> {
        match mode {
            PagingMode::Normal => computed,
            PagingMode::Repeat => Some(
                incoming
                    .map(str::to_owned)
                    .unwrap_or_else(|| encode_token("repeat")),
            ),
            PagingMode::Endless => {
                let n = self.endless_tokens.fetch_add(1, Ordering::Relaxed);
                Some(encode_token(&format!("endless-{n}")))
            }
        }
    }

    fn count(&self, op: &'static str) {
        *self.control().calls.entry(op).or_default() += 1;
    }

    fn authorized(&self, request: &Request) -> bool {
        let Some(expected) = &self.api_key else {
            return true;
        };
        request.headers().get("x-api-key").is_some_and(|got| {
            bool::from(got.as_bytes().ct_eq(expected.expose_secret().as_bytes()))
        })
    }

    /// A queued fault for this op, or a random one at `--fault-rate`. The flag says whether
    /// the request is to be handled before the fault is answered.
    fn take_fault(&self, op: &str) -> Option<(ApiError, bool)> {
        {
            let mut control = self.control();
            let rule = control
                .faults
                .iter_mut()
                .find(|r| r.remaining > 0 && r.op.as_deref().is_none_or(|o| o == op));
            if let Some(rule) = rule {
                rule.remaining -= 1;
                let mut err = fault_error(rule.status, rule.retry_after_secs);
                err.error_code = rule.error_code.clone();
                if let Some(message) = &rule.message {
                    err.message = message.clone();
                }
                let after = rule.after;
                control.faults.retain(|r| r.remaining > 0);
                return Some((err, after));
            }
        }
        if self.fault_rate <= 0.0 {
            return None;
        }
        let draw = mix(self.seed ^ 0xFA17 ^ mix(self.fault_draws.fetch_add(1, Ordering::Relaxed)));
        if unit(draw) >= self.fault_rate {
            return None;
        }
        let status = [500, 502, 503, 429][(mix(draw) % 4) as usize];
        Some((
            fault_error(
                StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
                1,
            ),
            false,
        ))
    }
}

fn fault_error(status: StatusCode, retry_after_secs: u64) -> ApiError {
    let message = match status.as_u16() {
        403 => "Forbidden",
        429 => "Rate limit exceeded",
        502 => "Bad gateway",
        503 => "Service unavailable, please retry",
        504 => "Gateway timeout",
        _ => "Internal server error",
    };
    let mut err = ApiError::new(status, message);
    if status == StatusCode::TOO_MANY_REQUESTS {
        err.retry_after_secs = Some(retry_after_secs);
    }
    err
}

/// The op name of an API route, as `/_sim/calls` reports it (counted as requests arrive; besides,
/// `paused` counts the pauses actually carried out).
fn op_for(method: &Method, path: &str) -> &'static str {
    match (method.as_str(), path) {
        ("POST", "/sandboxes" | "/v2/sandboxes") => "create",
        ("GET", "/v2/sandboxes") => "list",
        ("GET", "/sandboxes/{sandbox_id}") => "get",
        ("DELETE", "/sandboxes/{sandbox_id}") => "kill",
        ("POST", "/sandboxes/{sandbox_id}/pause") => "pause",
        ("POST", "/sandboxes/{sandbox_id}/resume") => "resume",
        ("POST", "/sandboxes/{sandbox_id}/connect" | "/v2/sandboxes/{sandbox_id}/connect") => {
            "connect"
        }
        ("POST", "/sandboxes/{sandbox_id}/timeout") => "timeout",
        ("POST", "/sandboxes/{sandbox_id}/refreshes") => "refresh",
        ("GET", "/v2/sandboxes/{sandbox_id}/logs") => "logs",
        ("GET", "/sandboxes/{sandbox_id}/metrics") => "metrics",
        ("GET", "/sandboxes/metrics") => "metrics-many",
        ("GET", "/teams/{team_id}/metrics") => "team-metrics",
        ("GET", "/teams/{team_id}/metrics/max") => "team-metrics-max",
        ("POST", "/sandboxes/{sandbox_id}/snapshots") => "snapshot",
        ("GET", "/snapshots") => "snapshots",
        ("GET", "/v2/templates") => "templates",
        ("GET", "/templates/{template_id}") => "template",
        ("DELETE", "/templates/{template_id}") => "delete-template",
        ("GET", "/events/sandboxes" | "/events/sandboxes/{sandbox_id}") => "events",
        (_, "/events/webhooks" | "/events/webhooks/{webhook_id}") => "webhooks",
        _ => "other",
    }
}

/// Every op name, for validating `POST /_sim/faults`; the E2B client names its requests (and
/// their metrics' `action` label) the same.
pub const OPS: &[&str] = &[
    "create",
    "list",
    "get",
    "kill",
    "pause",
    "resume",
    "connect",
    "timeout",
    "refresh",
    "logs",
    "metrics",
    "metrics-many",
    "team-metrics",
    "team-metrics-max",
    "snapshot",
    "snapshots",
    "templates",
    "template",
    "delete-template",
    "events",
    "webhooks",
];

/// Counts, delays, authenticates and (maybe) fails each API request, in that order.
/// The latency sleep happens here, before any lock is taken.
async fn gate(State(sim): State<Arc<Sim>>, request: Request, next: Next) -> Response {
    let matched = request.extensions().get::<MatchedPath>();
    let op = matched.map_or("other", |m| op_for(request.method(), m.as_str()));
    sim.count(op);
    if let Some(route) = matched.and_then(|m| route_version(request.method(), m.as_str())) {
        sim.count(route);
    }
    if !sim.latency.is_zero() {
        tokio::time::sleep(sim.latency).await;
    }
    if !sim.authorized(&request) {
        return ApiError::new(StatusCode::UNAUTHORIZED, "Invalid API key").into_response();
    }
    match sim.take_fault(op) {
        Some((fault, true)) => {
            // The change is made; only its answer is lost.
            let _handled = next.run(request).await;
            fault.into_response()
        }
        Some((fault, false)) => fault.into_response(),
        None => next.run(request).await,
    }
}

async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "Not found")
}

/// Besides its op, a create or connect is counted by the route it came by (`create-v1`,
/// `create-v2`, `connect-v1`, `connect-v2`), so a test can tell which one a client used.
fn route_version(method: &Method, path: &str) -> Option<&'static str> {
    match (method.as_str(), path) {
        ("POST", "/sandboxes") => Some("create-v1"),
        ("POST", "/v2/sandboxes") => Some("create-v2"),
        ("POST", "/sandboxes/{sandbox_id}/connect") => Some("connect-v1"),
        ("POST", "/v2/sandboxes/{sandbox_id}/connect") => Some("connect-v2"),
        _ => None,
    }
}

/// `0.6.4`, `v0.5.7`: what clients parse as a version.
fn valid_envd_version(v: &str) -> bool {
    let v = v.trim();
    let v = v.strip_prefix('v').unwrap_or(v);
    !v.is_empty()
        && v.split('.').count() <= 3
        && v.split('.')
            .all(|part| !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()))
}

fn router(sim: Arc<Sim>) -> Router {
    let api = Router::new()
        .route("/sandboxes", post(api::create))
        .route("/v2/sandboxes", get(api::list).post(api::create_v2))
        .route("/sandboxes/metrics", get(api::metrics_many))
        .route(
            "/sandboxes/{sandbox_id}",
            get(api::get_sandbox).delete(api::kill),
        )
        .route("/sandboxes/{sandbox_id}/pause", post(api::pause))
        .route("/sandboxes/{sandbox_id}/resume", post(api::resume))
        .route("/sandboxes/{sandbox_id}/connect", post(api::connect))
        .route("/v2/sandboxes/{sandbox_id}/connect", post(api::connect_v2))
        .route("/sandboxes/{sandbox_id}/timeout", post(api::set_timeout))
        .route("/sandboxes/{sandbox_id}/refreshes", post(api::refresh))
        .route("/sandboxes/{sandbox_id}/metrics", get(api::metrics))
        .route("/sandboxes/{sandbox_id}/snapshots", post(api::snapshot))
        .route("/v2/sandboxes/{sandbox_id}/logs", get(api::logs))
        .route("/teams/{team_id}/metrics", get(api::team_metrics))
        .route("/teams/{team_id}/metrics/max", get(api::team_metrics_max))
        .route("/snapshots", get(api::snapshots))
        .route("/v2/templates", get(api::templates))
        .route(
            "/templates/{template_id}",
            get(api::template).delete(api::delete_template),
        )
        .route("/events/sandboxes", get(events::team_events))
        .route(
            "/events/sandboxes/{sandbox_id}",
            get(events::sandbox_events),
        )
        .route(
            "/events/webhooks",
            get(events::list_webhooks).post(events::register),
        )
        .route(
            "/events/webhooks/{webhook_id}",
            get(events::get_webhook)
                .patch(events::update_webhook)
                .delete(events::delete_webhook),
        )
        .route_layer(middleware::from_fn_with_state(sim.clone(), gate));
    let admin = Router::new()
        .route("/_sim/calls", get(admin::calls))
        .route("/_sim/calls/reset", post(admin::reset_calls))
        .route(
            "/_sim/faults",
            post(admin::add_fault).delete(admin::clear_faults),
        )
        .route("/_sim/paging", post(admin::set_paging))
        .route("/_sim/sandboxes", post(admin::seed_sandbox))
        .route("/_sim/sandboxes/{sandbox_id}", patch(admin::change_sandbox))
        .route("/_sim/state", get(admin::state))
        .route("/_sim/webhooks/faults", post(events::set_faults))
        .route("/_sim/webhooks/deliveries", get(events::deliveries));
    api.merge(admin).fallback(not_found).with_state(sim)
}

/// A running simulator. Dropping it stops accepting connections, kills the processes it
/// started and removes its scratch directories.
pub struct SimServer {
    base_url: String,
    envd_url: String,
    team_id: String,
    sandboxes: usize,
    exec: ExecMode,
    sim: Arc<Sim>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
    /// The envd listener and the sampler, stopped with the server.
    side_tasks: Vec<JoinHandle<()>>,
}

impl SimServer {
    /// Seeds the world and serves it on `127.0.0.1:port` in a background task.
    pub async fn start(opts: SimOptions) -> std::io::Result<SimServer> {
        let invalid =
            |msg: &str| std::io::Error::new(std::io::ErrorKind::InvalidInput, msg.to_owned());
        if !(0.0..=1.0).contains(&opts.fault_rate) {
            return Err(invalid("--fault-rate must be between 0.0 and 1.0"));
        }
        if opts.team_id.trim().is_empty() {
            return Err(invalid("--team-id must not be empty"));
        }
        if !valid_envd_version(&opts.envd_version) {
            return Err(invalid(
                "--envd-version must be a version such as 0.6.4 (digits and dots, optionally after a v)",
            ));
        }
        let mut world = World::new(opts.seed, opts.team_id.clone());
        world.envd_version = opts.envd_version.trim().to_owned();
        let sandboxes = if opts.story {
            story::seed(&mut world, now_ms()).len()
        } else {
            fleet::seed(&mut world, opts.sandboxes, now_ms());
            opts.sandboxes
        };
        world.start_recording();
        let sim = Arc::new(Sim {
            world: Mutex::new(world),
            exec: Exec::new(opts.exec)?,
            control: Mutex::new(Control {
                calls: BTreeMap::new(),
                faults: Vec::new(),
                paging: PagingMode::Normal,
            }),
            latency: Duration::from_millis(opts.latency_ms),
            fault_rate: opts.fault_rate,
            api_key: opts.api_key.clone().map(SecretString::from),
            seed: opts.seed,
            fault_draws: AtomicU64::new(0),
            endless_tokens: AtomicU64::new(0),
            v1_only: opts.v1_only,
            hooks: Mutex::new(events::Hooks::default()),
            events_changed: tokio::sync::Notify::new(),
        });
        let listener =
            tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], opts.port))).await?;
        let port = listener.local_addr()?.port();
        let envd_listener =
            tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], opts.envd_port)))
                .await?;
        let envd_port = envd_listener.local_addr()?.port();
        let envd_app = envd::router(sim.clone());
        let mut side_tasks = vec![tokio::spawn(async move {
            if let Err(e) = axum::serve(envd_listener, envd_app).await {
                tracing::error!(error = %e, "the simulator's envd stopped with an error");
            }
        })];
        if opts.exec == ExecMode::Local {
            side_tasks.push(tokio::spawn(envd::sample_forever(sim.clone())));
        }
        side_tasks.push(tokio::spawn(events::deliver_forever(sim.clone())));
        let (stop, stopped) = oneshot::channel::<()>();
        let app = router(sim.clone());
        let task = tokio::spawn(async move {
            let serve = axum::serve(listener, app).with_graceful_shutdown(async {
                let _ = stopped.await;
            });
            if let Err(e) = serve.await {
                tracing::error!(error = %e, "E2B simulator stopped with an error");
            }
        });
        Ok(SimServer {
            base_url: format!("http://127.0.0.1:{port}"),
            envd_url: format!("http://127.0.0.1:{envd_port}"),
            team_id: opts.team_id,
            sandboxes,
            exec: opts.exec,
            sim,
            stop: Some(stop),
            task: Some(task),
            side_tasks,
        })
    }

    /// `http://127.0.0.1:PORT`, without a trailing slash.
    pub fn base_url(&self) -> String {
        self.base_url.clone()
    }

    /// envd's base URL, `http://127.0.0.1:PORT` without a trailing slash: what
    /// `E2B_SANDBOX_URL` is set to so envd clients reach this simulator's sandboxes.
    pub fn envd_url(&self) -> String {
        self.envd_url.clone()
    }

    /// Whether envd runs commands on this machine.
    pub fn exec_mode(&self) -> ExecMode {
        self.exec
    }

    /// A client for this simulator's `/_sim/` test hooks.
    pub fn hooks(&self) -> SimHooks {
        SimHooks::new(&self.base_url())
    }

    /// The team the simulated API key belongs to.
    pub fn team_id(&self) -> &str {
        &self.team_id
    }

    /// Stops gracefully, giving open requests up to two seconds.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        for task in self.side_tasks.drain(..) {
            task.abort();
        }
        let sim = self.sim.clone();
        let _ = tokio::task::spawn_blocking(move || sim.exec().shutdown()).await;
        if let Some(mut task) = self.task.take()
            && tokio::time::timeout(Duration::from_secs(2), &mut task)
                .await
                .is_err()
        {
            task.abort();
        }
    }
}

impl Drop for SimServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.abort();
        }
        for task in self.side_tasks.drain(..) {
            task.abort();
        }
        self.sim.exec().shutdown();
    }
}

/// `steward sim e2b`: serves until Ctrl-C or SIGTERM.
pub async fn run_cli(opts: SimOptions) -> anyhow::Result<ExitCode> {
    // SIGTERM too, so processes started with --exec local and the scratch directories go; listened
    // for from the start, since as a container's PID 1 a SIGTERM it does not handle is ignored.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let server = SimServer::start(opts).await?;
    println!(
        "E2B simulator listening on {} (team {}, {} sandboxes)",
        server.base_url(),
        server.team_id(),
        server.sandboxes
    );
    println!("E2B_API_URL={}", server.base_url());
    println!("E2B_SANDBOX_URL={}", server.envd_url());
    if server.sim.v1_only {
        println!("--v1-only: the v2 create and connect routes answer 404, as an older E2B does");
    }
    match server.exec_mode() {
        ExecMode::Local => println!(
            "WARNING: --exec local: commands sent to envd run as real processes ON THIS MACHINE, as your user (scratch directory per sandbox, minimal environment). Do not expose this port."
        ),
        ExecMode::Off => println!(
            "envd runs no commands (start with --exec local to run them on this machine); files work"
        ),
    }
    tokio::select! {
        stopped = tokio::signal::ctrl_c() => stopped?,
        _ = term.recv() => {}
    }
    server.shutdown().await;
    Ok(ExitCode::SUCCESS)
}
