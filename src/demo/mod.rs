//! `steward demo`: the whole product in one process, with no account and nothing installed
//! but Rust. [`start`] brings up the E2B simulator with the story fleet (commands run on this
//! machine in scratch directories), the Slack simulator on the page's port, and Steward itself,
//! unchanged: built from [`Settings`] made here, it talks to both simulators over loopback HTTP
//! exactly as it talks to E2B and Slack in production, request signing included. The store is
//! the embedded [`Store::memory`] unless a Redis URL is given. With
//! [`DemoOptions::socket_mode`], Slack's traffic reaches Steward over Socket Mode instead: the
//! simulator accepts only a made-up app token and has no request URL, and [`start`] waits until
//! Steward is connected (`/readyz`'s `"slack_socket":"ok"`). Then [`opening`] runs one live
//! sweep, one governed run and one failing push test, so the page opens on real cases.
//!
//! Files: `mod.rs` (options, the handle, start and stop), `setup.rs` (the demo's people,
//! channels, secrets and `steward.toml`), `opening.rs` (what happens on start), `repo.rs` (the
//! local Git repository the push test clones).
//!
//! This module is a client of the simulators and of Steward's public seams
//! (`startup::Application`, `config::Settings`); nothing but `cli` may import it, and it must
//! not reach into Steward's internals to make the demo look better than production.
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use secrecy::{ExposeSecret, SecretString};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::config::Settings;
use crate::sim::e2b::{ExecMode, SimOptions, SimServer};
use crate::sim::slack::SlackSim;
use crate::startup::Application;
use crate::store::Store;

pub mod opening;
mod repo;
pub mod setup;

pub use opening::Opening;
pub use setup::{APPROVER, NON_APPROVER, PEOPLE, Person, REQUESTER};

/// The page's port when `--port` is not given.
pub const DEFAULT_PORT: u16 = 3000;
/// How long [`start`] waits for Steward's Socket Mode connection (it is opened on loopback, so
/// this is only reached when something is wrong).
const SOCKET_CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
/// How many times [`start`] tries again when the port it picked for Steward was taken between
/// picking and binding (see [`reserve_port`]).
const BIND_ATTEMPTS: usize = 3;

/// What to start.
#[derive(Clone)]
pub struct DemoOptions {
    /// The Slack simulator's port on 127.0.0.1 (its page); 0 picks a free one.
    pub port: u16,
    /// `Some`: keep Steward's state in this Redis (under a fresh key prefix) instead of the
    /// embedded in-memory store.
    pub redis_url: Option<SecretString>,
    /// Run the opening (a sweep, a governed run, a failing push test) before returning.
    pub opening: bool,
    /// Where the scratch directory is made; the system's temporary directory when `None`.
    pub scratch_in: Option<PathBuf>,
    /// Slack's traffic (the page's commands, clicks and forms) reaches Steward over the Slack
    /// simulator's Socket Mode WebSocket, opened with a made-up app token, instead of over HTTP.
    pub socket_mode: bool,
}

impl Default for DemoOptions {
    fn default() -> Self {
        Self {
            port: DEFAULT_PORT,
            redis_url: None,
            opening: true,
            scratch_in: None,
            socket_mode: false,
        }
    }
}

impl std::fmt::Debug for DemoOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DemoOptions")
            .field("port", &self.port)
            .field("redis_url", &self.redis_url.as_ref().map(|_| "[REDACTED]"))
            .field("opening", &self.opening)
            .field("scratch_in", &self.scratch_in)
            .field("socket_mode", &self.socket_mode)
            .finish()
    }
}

/// A running demo. [`DemoHandle::stop`] stops Steward (letting in-flight replies finish), both
/// simulators (with the processes the E2B simulator started) and removes the scratch directory.
pub struct DemoHandle {
    /// The Slack simulator: its page, `/api` for Steward, `/_sim/messages` for tests.
    pub slack_url: String,
    /// Steward itself (`/slack/commands`, `/api/v1`, `/github/webhook`).
    pub steward_url: String,
    /// The E2B simulator's control-plane API.
    pub e2b_url: String,
    /// The E2B simulator's envd (what `E2B_SANDBOX_URL` is set to).
    pub envd_url: String,
    /// Steward's store: `"memory"` or `"redis"`.
    pub store: &'static str,
    /// With Redis, the prefix of every key this demo wrote (a fresh one per demo; the keys are
    /// left behind when the demo stops, like any replica's).
    pub redis_prefix: Option<String>,
    /// What the opening did (empty when `DemoOptions::opening` was off).
    pub opening: Opening,
    /// Whether Slack's traffic reaches Steward over Socket Mode (then connected when [`start`]
    /// returned) rather than over HTTP.
    pub socket_mode: bool,
    secrets: setup::Secrets,
    scratch: Scratch,
    slack: Option<SlackSim>,
    e2b: Option<SimServer>,
    stop: Option<oneshot::Sender<()>>,
    steward: Option<JoinHandle<anyhow::Result<()>>>,
}

impl std::fmt::Debug for DemoHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DemoHandle")
            .field("slack_url", &self.slack_url)
            .field("steward_url", &self.steward_url)
            .field("e2b_url", &self.e2b_url)
            .field("store", &self.store)
            .field("socket_mode", &self.socket_mode)
            .finish_non_exhaustive()
    }
}

impl DemoHandle {
    /// The Slack signing secret this demo made up; people on the page (and tests) sign their
    /// commands and clicks with it, as Slack does.
    pub fn signing_secret(&self) -> &str {
        self.secrets.signing.expose_secret()
    }

    /// The demo agent's bearer token for `/api/v1` (`STEWARD_API_TOKEN` for `steward run`).
    pub fn agent_token(&self) -> &str {
        self.secrets.agent_token.expose_secret()
    }

    /// The scratch directory (the policy file and the push test's repository).
    pub fn scratch_dir(&self) -> &Path {
        &self.scratch.0
    }

    /// Stops everything and waits for it; the scratch directory is removed.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let served = match self.steward.take() {
            Some(task) => match task.await {
                Ok(result) => result,
                Err(e) => Err(anyhow::anyhow!("Steward's task ended abnormally: {e}")),
            },
            None => Ok(()),
        };
        if let Some(e2b) = self.e2b.take() {
            e2b.shutdown().await;
        }
        self.slack.take();
        served
    }
}

impl Drop for DemoHandle {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// A directory removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn create(parent: Option<&Path>) -> anyhow::Result<Scratch> {
        let parent = parent.map_or_else(std::env::temp_dir, Path::to_owned);
        let path = parent.join(format!("steward-demo-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&path)
            .with_context(|| format!("cannot create the scratch directory {}", path.display()))?;
        Ok(Scratch(path))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.0)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(error = %e, dir = %self.0.display(), "could not remove the demo's scratch directory");
        }
    }
}

/// Starts the demo: simulators, Steward, then (unless switched off) the opening.
pub async fn start(opts: DemoOptions) -> anyhow::Result<DemoHandle> {
    let scratch = Scratch::create(opts.scratch_in.as_deref())?;
    let secrets = setup::Secrets::generate();
    let e2b = SimServer::start(SimOptions {
        story: true,
        exec: ExecMode::Local,
        api_key: Some(secrets.e2b_key.expose_secret().to_owned()),
        ..SimOptions::default()
    })
    .await
    .context("the E2B simulator could not start")?;
    let repo = repo::create(&scratch.0).await;
    if let Err(e) = &repo {
        tracing::warn!(error = %e, "no push test in this demo");
    }
    let repo = repo.ok();
    let policy = setup::policy(&secrets, repo.as_ref().map(|r| r.clone_url.as_str()));
    let policy_path = scratch.0.join("steward.toml");
    std::fs::write(&policy_path, policy).context("cannot write the demo's steward.toml")?;

    let page = SocketAddr::from(([127, 0, 0, 1], opts.port));
    let (slack, app) = bind_both(page, &e2b, &secrets, &policy_path, &opts).await?;
    let steward_url = format!("http://{}", app.addr());
    let (store, redis_prefix) = match app.state().store {
        Store::Memory(_) => ("memory", None),
        Store::Redis(_) => ("redis", Some(app.state().settings.redis.key_prefix.clone())),
    };
    let sweep = app.state().sweep.clone();
    let socket = app.socket_status();
    let (stop, stopped) = oneshot::channel::<()>();
    let steward = tokio::spawn(app.run_until_stopped(async {
        let _ = stopped.await;
    }));
    let mut handle = DemoHandle {
        slack_url: slack.base_url(),
        steward_url,
        e2b_url: e2b.base_url(),
        envd_url: e2b.envd_url(),
        store,
        redis_prefix,
        opening: Opening::default(),
        socket_mode: opts.socket_mode,
        secrets,
        scratch,
        slack: Some(slack),
        e2b: Some(e2b),
        stop: Some(stop),
        steward: Some(steward),
    };
    if opts.socket_mode {
        wait_for_socket(&mut handle, || socket.as_ref().map(|s| s.state().label())).await?;
    }
    if opts.opening {
        handle.opening = opening::run(&handle, sweep, repo.as_ref()).await;
    }
    Ok(handle)
}

/// Starts the Slack simulator on `page` and binds Steward, each knowing the other's URL.
async fn bind_both(
    page: SocketAddr,
    e2b: &SimServer,
    secrets: &setup::Secrets,
    policy: &Path,
    opts: &DemoOptions,
) -> anyhow::Result<(SlackSim, Application)> {
    let mut last_error = None;
    for _ in 0..BIND_ATTEMPTS {
        let steward_addr = reserve_port()?;
        let steward_url = format!("http://{steward_addr}");
        let slack = SlackSim::start(setup::slack_sim_options(
            page,
            &steward_url,
            secrets,
            opts.socket_mode,
        ))
        .await
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::AddrInUse => {
                anyhow::anyhow!("port {} is in use; pick another with --port", page.port())
            }
            _ => anyhow::anyhow!("the Slack simulator could not start on {page}: {e}"),
        })?;
        let env = setup::environment(steward_addr, &slack, e2b, secrets, policy, opts);
        let settings =
            Settings::load(&env).context("the demo's own settings did not load (a bug)")?;
        let store = match &opts.redis_url {
            None => Store::memory(),
            Some(url) => {
                let store = Store::redis(url.expose_secret(), &env["STEWARD_REDIS_PREFIX"])
                    .await
                    .context(
                        "Redis does not answer at the given URL (unset REDIS_URL to use the embedded store)",
                    )?;
                store.ping().await.context("Redis does not answer")?;
                store
            }
        };
        match Application::build_with_store(settings, store).await {
            Ok(app) => return Ok((slack, app)),
            // Taken between reserving and binding: try another port.
            Err(e) => last_error = Some(e),
        }
    }
    Err(last_error.unwrap_or_else(|| anyhow::anyhow!("Steward could not bind a port")))
}

/// Waits until `socket_says` (what Steward's `/readyz` reports as `slack_socket`) is `ok`, so
/// the page takes actions before the opening runs and the terminal says what to try. It reads
/// Steward's own status handle rather than polling `/readyz`, whose 503s while connecting would
/// be logged as errors in the demo's terminal. Steward stopping first (the simulator refused its
/// token, say) is the error; so is no connection within [`SOCKET_CONNECT_TIMEOUT`].
async fn wait_for_socket(
    handle: &mut DemoHandle,
    socket_says: impl Fn() -> Option<&'static str>,
) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + SOCKET_CONNECT_TIMEOUT;
    loop {
        let says = socket_says();
        if says == Some("ok") {
            return Ok(());
        }
        if let Some(task) = handle.steward.take_if(|task| task.is_finished()) {
            let stopped =
                "Steward stopped before it connected to the Slack simulator over Socket Mode";
            return Err(match task.await {
                Ok(Ok(())) => anyhow::anyhow!(stopped),
                Ok(Err(e)) => e.context(stopped),
                Err(e) => anyhow::anyhow!("Steward's task ended abnormally: {e}"),
            });
        }
        if tokio::time::Instant::now() >= deadline {
            anyhow::bail!(
                "Steward did not connect to the Slack simulator over Socket Mode within {} s \
                 (its Socket Mode connection is {})",
                SOCKET_CONNECT_TIMEOUT.as_secs(),
                says.unwrap_or("not configured, a bug in the demo")
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A free port on 127.0.0.1 for Steward, picked before Steward binds it because the Slack
/// simulator must know Steward's URL when it starts and Steward the simulator's when it is
/// built. Another process could take the port in between; [`bind_both`] then tries again.
fn reserve_port() -> anyhow::Result<SocketAddr> {
    let probe = std::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .context("cannot find a free port on 127.0.0.1")?;
    Ok(probe.local_addr()?)
}

/// How long the opening's governed run and push test may take.
pub const OPENING_RUN_TIMEOUT: Duration = Duration::from_secs(120);
