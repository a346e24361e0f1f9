//! Assembly: [`Application::build`] binds the listener (port 0 picks a free one, which tests
//! use) and builds the state; [`Application::run_until_stopped`] serves HTTP and runs this
//! replica's queue worker, expiry loop and sweep scheduler until the shutdown future completes.
//! `serve_from_env` is `steward serve`.
//!
//! This module wires things together; it must not contain request handling or business rules.
use std::future::Future;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::approvals::ApprovalError;
use crate::approvals::BusyThreshold;
use crate::approvals::Services;
use crate::approvals::push_case::{PushCaseSettings, push_run_ended};
use crate::approvals::run_case::{RunCaseSettings, end_unstarted_run_sandbox, open_run_case};
use crate::approvals::worker::orphans::{ORPHAN_GRACE, ORPHANS_EVERY, OrphanSettings};
use crate::approvals::worker::{self, LoopSettings};
use crate::config::{ProcessEnv, Settings};
use crate::e2b::E2bClient;
use crate::http::{AppState, router};
use crate::hygiene::{Scheduler, SweepContext, run_scheduler, schedule};
use crate::ids::SlackChannelId;
use crate::runs::{HandOver, HandOverError, HandOverRequest, RunEngine, RunPolicy, Runner};
use crate::slack::client::SlackClient;
use crate::slack::limits::Limits;
use crate::slack::render::{RenderError, SampleCheck, Templates};
use crate::slack::socket::{OpenError, SocketClient, SocketStatus};
use crate::store::Store;

/// A bound, ready-to-run Steward server.
pub struct Application {
    listener: TcpListener,
    /// `STEWARD_METRICS_LISTEN`'s listener, when set.
    metrics: Option<TcpListener>,
    addr: SocketAddr,
    state: AppState,
    loops: LoopSettings,
    /// The scheduled sweep, when E2B and a hygiene channel are configured.
    sweep: Option<SweepContext>,
    /// How often the scheduler checks whether a sweep is due; `None` switches it off.
    sweep_every: Option<Duration>,
    /// The Socket Mode client, when `SLACK_APP_TOKEN` is set.
    socket: Option<SocketClient>,
}

/// The start checks of the messages outside `slack::render` (which checks its own while loading).
const MESSAGE_CHECKS: &[SampleCheck] = &[
    crate::approvals::card::check_templates,
    crate::approvals::push_card::check_templates,
    crate::approvals::list::view::check_templates,
    crate::hygiene::digest::check_templates,
    crate::alerts::message::check_templates,
];

/// The templates (`dir`'s files over the embedded ones), every message rendered once from
/// sample values: an override that breaks any message stops the start with the template's name.
pub fn load_templates(dir: Option<&std::path::Path>) -> Result<Templates, RenderError> {
    let templates = Templates::load(dir)?;
    for check in MESSAGE_CHECKS {
        check(&templates)?;
    }
    Ok(templates)
}

/// Builds the clients and handles of one replica from settings. Fails on broken configuration
/// (unreadable template overrides, an unusable TLS setup, a channel that is no channel id), not on
/// missing secrets: `/readyz` reports those.
pub fn build_state(settings: Settings) -> anyhow::Result<AppState> {
    use secrecy::ExposeSecret;
    let store = Store::redis_lazy(
        settings.redis.url.expose_secret(),
        &settings.redis.key_prefix,
    )?;
    build_state_with_store(settings, store)
}

/// [`build_state`] over a given store instead of the Redis in `settings.redis`: `steward demo`
/// passes the embedded `Store::memory()`.
pub fn build_state_with_store(settings: Settings, store: Store) -> anyhow::Result<AppState> {
    let templates = Arc::new(load_templates(settings.slack.templates_dir.as_deref())?);
    let slack = SlackClient::new(&settings.slack)?;
    let e2b = match &settings.e2b.api_key {
        Some(_) => Some(E2bClient::new(&settings.e2b)?),
        None => None,
    };
    let policy = &settings.policy;
    let approvals_channel = policy.approvals_channel().map_err(anyhow::Error::msg)?;
    let sweep = match &e2b {
        None => None,
        Some(e2b) => {
            let (config, channel) = policy.sweep().map_err(anyhow::Error::msg)?;
            Some(SweepContext::new(
                e2b.clone(),
                store.clone(),
                slack.clone(),
                templates.clone(),
                Arc::new(config),
                channel,
            ))
        }
    };
    let idle = policy.hygiene.idle.clone();
    let run_policy = Arc::new(policy.runs().map_err(anyhow::Error::msg)?);
    let runs = e2b
        .as_ref()
        .map(|_| Runner::new(store.clone(), run_policy.clone()));
    Ok(AppState::from(crate::http::AppHandles {
        runs,
        approval_policy: Arc::new(policy.approvals.clone()),
        limits: Arc::new(Limits::new(policy.limits.clone())),
        busy_above: BusyThreshold::new(move |template| {
            idle.thresholds_for(template).cpu_threshold_pct
        }),
        sweep,
        slack,
        e2b,
        templates,
        store,
        approvals_channel,
        tasks: TaskTracker::new(),
        socket: None,
        draining: CancellationToken::new(),
        watch: Arc::new(
            policy
                .watch_rules()
                .map_err(|reason| anyhow::anyhow!(reason))?,
        ),
        settings: Arc::new(settings),
    }))
}

impl Application {
    /// Binds `settings.listen` and builds the clients.
    pub async fn build(settings: Settings) -> anyhow::Result<Application> {
        Self::bind(settings, build_state).await
    }

    /// [`Application::build`] over a given store (see [`build_state_with_store`]).
    pub async fn build_with_store(settings: Settings, store: Store) -> anyhow::Result<Application> {
        Self::bind(settings, |settings| build_state_with_store(settings, store)).await
    }

    async fn bind(
        settings: Settings,
        build: impl FnOnce(Settings) -> anyhow::Result<AppState>,
    ) -> anyhow::Result<Application> {
        let listener = TcpListener::bind(settings.listen)
            .await
            .map_err(|e| anyhow::anyhow!("could not listen on {}: {e}", settings.listen))?;
        let addr = listener.local_addr()?;
        let metrics = crate::http::metrics::bind(settings.metrics_listen).await?;
        crate::metrics::install();
        let workers = settings.policy.workers().map_err(anyhow::Error::msg)?;
        let mut loops = LoopSettings::new(&settings.replica_name).with_workers(workers);
        loops.events_poll_every = settings
            .policy
            .events_poll_every()
            .map_err(anyhow::Error::msg)?;
        let mut state = build(settings)?;
        let socket = match &state.settings.socket {
            Some(socket) => Some(SocketClient::new(socket, &state.settings.slack.api_url)?),
            None => None,
        };
        state.socket = socket.as_ref().map(SocketClient::status);
        let sweep = state.sweep.clone();
        Ok(Application {
            listener,
            metrics,
            addr,
            state,
            loops,
            sweep,
            sweep_every: Some(schedule::TICK_INTERVAL),
            socket,
        })
    }

    /// The port actually bound.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The port of the separate metrics listener, when `STEWARD_METRICS_LISTEN` is set.
    pub fn metrics_port(&self) -> Option<u16> {
        self.metrics.as_ref()?.local_addr().ok().map(|a| a.port())
    }

    /// The state handlers see (tests use it to reach the same clients).
    pub fn state(&self) -> &AppState {
        &self.state
    }

    /// Lets tests adjust handles (e.g. a faster E2B retry policy) before serving.
    pub fn state_mut(&mut self) -> &mut AppState {
        &mut self.state
    }

    /// Lets tests tune (or switch off) the worker and expiry loops before serving.
    pub fn loops_mut(&mut self) -> &mut LoopSettings {
        &mut self.loops
    }

    /// What the Socket Mode connection is doing; `None` without `SLACK_APP_TOKEN`.
    pub fn socket_status(&self) -> Option<SocketStatus> {
        self.socket.as_ref().map(SocketClient::status)
    }

    /// Lets tests switch the sweep scheduler off, or make it check more often.
    pub fn set_sweep_every(&mut self, every: Option<Duration>) {
        self.sweep_every = every;
    }

    /// Serves until `shutdown` completes, then drains (see [`Application::run_until_drained`])
    /// for up to `[workers] shutdown_grace` and stops.
    pub async fn run_until_stopped(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        self.run_until_drained(shutdown, std::future::pending::<()>())
            .await
    }

    /// Serves until `drain` completes (the first SIGTERM), then drains: `/readyz` answers 503,
    /// the Socket Mode connection closes (Slack sends to the other replicas), no worker takes
    /// a new job (one a claim still brings is handed back unstarted), decided work finishes the
    /// step in flight and hands the rest back, a list stops starting items and releases its
    /// lease, and a run keeps streaming until the grace is nearly over, then leaves its command
    /// running and hands itself to another replica, which re-attaches to it. HTTP keeps
    /// answering meanwhile. The replica stops when that is done, when `[workers]
    /// shutdown_grace` has passed, or when `now` completes (a second signal): what is still in
    /// hand then is left as a crash would leave it, for another replica to take over after its
    /// claims and leases run out; nothing is failed on the way out.
    pub async fn run_until_drained(
        self,
        drain: impl Future<Output = ()> + Send + 'static,
        now: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        // A token Slack refuses stops the replica before it starts anything, with a sentence
        // (retrying cannot help); Slack merely unreachable or rate-limiting is retried in the
        // background by the client, which says so.
        let socket = match self.socket {
            Some(client) => match client.open().await {
                Err(e @ OpenError::Refused { .. }) => return Err(e.into()),
                first => Some((client, first)),
            },
            None => None,
        };
        tracing::info!(addr = %self.addr, consumer = %self.loops.worker.consumer, socket_mode = socket.is_some(), "Steward listening");
        let draining = self.state.draining.clone();
        let grace = self.loops.shutdown_grace;
        // Stops what serves until the very end: HTTP, the metrics listener.
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let signal = move || {
            let mut stopped = stopped.clone();
            async move {
                let _ = stopped.wait_for(|s| *s).await;
            }
        };
        let drained = || draining.clone().cancelled_owned();
        let svc = self.state.services();
        // Loops that stop taking work at the first signal and finish what they hold.
        let mut workers = Vec::new();
        // Loops that simply stop at the first signal (another replica carries on).
        let mut loops = Vec::new();
        // Cancelled near the end of the grace: runs still going then move to another replica.
        let move_runs = CancellationToken::new();
        if self.loops.worker_enabled {
            for config in self.loops.worker_configs() {
                let runs = run_engine(
                    &self.state,
                    &config.consumer,
                    self.loops.run_lease,
                    &move_runs,
                )?;
                workers.push(tokio::spawn(worker::run_worker(
                    svc.clone(),
                    runs,
                    config,
                    draining.clone(),
                )));
            }
            // Approved list decisions are carried out by whichever replica holds each list's
            // lease; this pass takes over lists whose replica died.
            let every = svc.lists.progress_every;
            workers.push(tokio::spawn(crate::approvals::list::run_lists(
                svc.clone(),
                every,
                drained(),
            )));
        }
        loops.push(tokio::spawn(worker::run_expiry(
            svc.clone(),
            self.loops.expire_every,
            drained(),
        )));
        match (&self.state.e2b, self.loops.events_poll_every) {
            (Some(e2b), Some(every)) => {
                loops.push(tokio::spawn(crate::approvals::outside::run_poller(
                    self.state.services(),
                    e2b.clone(),
                    self.loops.worker.consumer.clone(),
                    every,
                    drained(),
                )));
            }
            (Some(_), None) => {
                tracing::info!("the E2B events poller is off ([events] poll_every = \"off\")")
            }
            (None, _) => {}
        }
        // Every sandbox Steward created for a run is accounted for, by one replica at a time.
        if let (Some(runner), Some(_)) = (&self.state.runs, &self.state.e2b) {
            let settings = OrphanSettings {
                runner: runner.clone(),
                run_cases: run_case_settings(runner.policy())?,
                grace: ORPHAN_GRACE,
                holder: self.loops.worker.consumer.clone(),
            };
            loops.push(tokio::spawn(worker::orphans::run_orphans(
                svc,
                settings,
                ORPHANS_EVERY,
                drained(),
            )));
        }
        if let (Some(runner), false) = (
            &self.state.runs,
            self.state.settings.github.push_tests.is_empty(),
        ) {
            loops.push(tokio::spawn(crate::github::intake::run_catch_up(
                self.state.store.clone(),
                runner.clone(),
                Arc::new(self.state.settings.github.clone()),
                self.loops.expire_every,
                drained(),
            )));
        }
        match (self.sweep, self.sweep_every) {
            (Some(sweep), Some(every)) if sweep.channel.is_some() => {
                loops.push(tokio::spawn(run_scheduler(
                    Scheduler::new(sweep),
                    every,
                    drained(),
                )));
            }
            (Some(_), Some(_)) => tracing::warn!(
                "scheduled sweeps are off: no hygiene channel ([hygiene] channel or [channels] hygiene)"
            ),
            (None, _) => tracing::info!("scheduled sweeps are off: E2B is not configured"),
            (_, None) => {}
        }
        if let Some((client, first)) = socket {
            let handler = crate::http::socket::handler(self.state.clone());
            loops.push(tokio::spawn(client.run(handler, first, drained())));
        }
        let mut last = Vec::new();
        if let Some(listener) = self.metrics {
            let state = self.state.clone();
            last.push(tokio::spawn(crate::http::metrics::serve(
                listener,
                state,
                signal(),
            )));
        }
        let tasks = self.state.tasks.clone();
        let limits = self.state.settings.edge;
        let http = tokio::spawn(crate::http::edge::serve(
            self.listener,
            router(self.state),
            limits,
            signal(),
        ));

        drain.await;
        tracing::info!(grace = ?grace, "draining: /readyz says 503, no new jobs; work in hand is finished or handed over");
        draining.cancel();
        let deadline = tokio::time::Instant::now() + grace;
        // A run moves this long after the first signal, leaving a little of the grace for its
        // hand-over to be written.
        let move_at = tokio::time::Instant::now() + grace.saturating_sub(HAND_OVER_MARGIN);
        let mover = move_runs.clone();
        tokio::spawn(async move {
            tokio::time::sleep_until(move_at).await;
            mover.cancel();
        });
        tokio::pin!(now);
        // Each worker is awaited at most once: here, or after the abort below.
        let mut workers: Vec<Option<tokio::task::JoinHandle<()>>> =
            workers.into_iter().map(Some).collect();
        let finished = async {
            for slot in workers.iter_mut() {
                if let Some(mut handle) = slot.take() {
                    join_loop(&mut handle).await;
                }
            }
        };
        let in_time = tokio::select! {
            () = finished => true,
            () = tokio::time::sleep_until(deadline) => false,
            () = &mut now => false,
        };
        if !in_time {
            tracing::warn!(
                "stopping before every worker finished: what they hold is taken over by another replica once its claims and leases run out"
            );
            for handle in workers.iter().flatten() {
                handle.abort();
            }
        }
        for handle in loops.iter_mut() {
            join_loop(handle).await;
        }
        // Requests already answered may still owe Slack a reply or a card update: let them
        // finish (bounded, so a stuck call cannot hold a deploy forever).
        tasks.close();
        let replies = tokio::select! {
            r = tokio::time::timeout_at(deadline.max(tokio::time::Instant::now() + REPLY_GRACE_MIN), tasks.wait()) => r.is_ok(),
            () = &mut now => false,
        };
        if !replies {
            tracing::warn!(
                unfinished = tasks.len(),
                "stopping with replies still in flight after the shutdown grace period"
            );
        }
        let _ = stop.send(true);
        match http.await {
            Ok(()) => {}
            Err(e) if e.is_panic() => tracing::error!(error = %e, "the HTTP server panicked"),
            Err(e) => tracing::debug!(error = %e, "the HTTP server was cancelled"),
        }
        for mut handle in last {
            join_loop(&mut handle).await;
        }
        for mut handle in workers.into_iter().flatten() {
            join_loop(&mut handle).await;
        }
        tracing::info!("stopped");
        Ok(())
    }
}

/// Waits for a background loop to end, saying so when it panicked.
async fn join_loop(handle: &mut tokio::task::JoinHandle<()>) {
    match handle.await {
        Err(e) if e.is_panic() => tracing::error!(error = %e, "a background loop panicked"),
        // Cancelled: aborted at the end of the grace, or the runtime itself is going away (a
        // test ending); nothing failed.
        Err(e) => tracing::debug!(error = %e, "a background loop was cancelled"),
        Ok(()) => {}
    }
}

/// How much of the shutdown grace a run keeps for its hand-over to another replica.
const HAND_OVER_MARGIN: Duration = Duration::from_secs(3);
/// Replies in flight always get at least this long at the end, even past the grace.
const REPLY_GRACE_MIN: Duration = Duration::from_secs(2);

/// The engine this replica's worker runs `Job::Run` with, from the state as it is when serving
/// starts (tests adjust the E2B client first); `None` when E2B is not configured.
fn run_engine(
    state: &AppState,
    consumer: &str,
    lease: Duration,
    move_runs: &CancellationToken,
) -> anyhow::Result<Option<RunEngine>> {
    let (Some(e2b), Some(runner)) = (&state.e2b, &state.runs) else {
        return Ok(None);
    };
    let policy = Arc::new(runner.policy().clone());
    let hand_over = run_hand_over(state.services(), &policy, state)?;
    Ok(Some(
        RunEngine::new(
            state.store.clone(),
            e2b.clone(),
            policy,
            state.settings.sandbox_url.clone(),
            consumer,
            hand_over,
        )
        .with_lease(lease)
        .with_move_runs(move_runs.clone()),
    ))
}

/// What a run case is opened with: `[channels] runs` and `[runs]`.
fn run_case_settings(policy: &RunPolicy) -> anyhow::Result<RunCaseSettings> {
    let channel = policy
        .channel
        .as_deref()
        .map(SlackChannelId::parse)
        .transpose()
        .map_err(|e| anyhow::anyhow!("[channels] runs in steward.toml is not a channel id: {e}"))?;
    Ok(RunCaseSettings {
        channel,
        keep_running_for: policy.keep_running_for,
        decide_within: policy.decide_within,
    })
}

/// Where a finished run's sandbox goes: for a run a GitHub push started, the push-test outcome
/// (`approvals::push_case::push_run_ended`: an alert in the entry's channel or `[channels]
/// engineering`); for any other run, the run case (`approvals::run_case::open_run_case`; a run
/// that failed before its command started has its sandbox killed by rule instead) in
/// `[channels] runs` (or the approvals channel), under `[runs] on_finish`.
fn run_hand_over(svc: Services, policy: &RunPolicy, state: &AppState) -> anyhow::Result<HandOver> {
    let settings = run_case_settings(policy)?;
    let channel_setting = |name: &str, value: Option<&str>| {
        value.map(SlackChannelId::parse).transpose().map_err(|e| {
            anyhow::anyhow!("[channels] {name} in steward.toml is not a channel id: {e}")
        })
    };
    let push_settings = PushCaseSettings {
        channel: channel_setting(
            "engineering",
            state.settings.policy.channels.engineering.as_deref(),
        )?,
        keep_for: policy.keep_running_for,
        decide_within: policy.decide_within,
    };
    let runner = state.runs.clone();
    let github = Arc::new(state.settings.github.clone());
    Ok(HandOver::new(move |req: HandOverRequest| {
        let svc = svc.clone();
        let settings = settings.clone();
        let push_settings = push_settings.clone();
        let runner = runner.clone();
        let github = github.clone();
        async move {
            let retry_or_give_up = |e: ApprovalError| {
                if e.worth_retrying() {
                    // Waiting helps: Redis, Slack or E2B briefly unavailable.
                    HandOverError::Retry(e.to_string())
                } else {
                    HandOverError::GiveUp(e.to_string())
                }
            };
            let push = svc
                .store
                .push_test_for_run(&req.report.run_id)
                .await
                .map_err(|e| HandOverError::Retry(e.to_string()))?;
            if let Some(test) = push {
                let run_id = req.report.run_id.clone();
                let ended = push_run_ended(
                    &svc,
                    &test,
                    req.sandbox.as_ref(),
                    req.report,
                    req.error.as_deref(),
                    &push_settings,
                    Utc::now(),
                )
                .await
                .map_err(retry_or_give_up)?;
                // Its slot is free: the next pushes waiting start. When that cannot be recorded
                // the hand-over is tried again (the outcome above is safe to repeat), rather than
                // leaving the next push to the catch-up loop.
                if let Some(runner) = &runner
                    && let Err(e) =
                        crate::github::run_ended(&svc.store, runner, &github, &run_id).await
                {
                    return Err(HandOverError::Retry(format!(
                        "the push test's slot could not be freed for the pushes waiting: {e}"
                    )));
                }
                return Ok(ended);
            }
            // A run that never got a sandbox leaves nothing to decide.
            let Some(sandbox) = &req.sandbox else {
                return Ok(None);
            };
            let opened = if req.command_started {
                open_run_case(
                    &svc,
                    sandbox,
                    req.report,
                    req.on_finish,
                    &settings,
                    Utc::now(),
                )
                .await
            } else {
                end_unstarted_run_sandbox(&svc, sandbox, req.report, &settings, Utc::now()).await
            };
            opened.map(|case| Some(case.id)).map_err(retry_or_give_up)
        }
    }))
}

/// `steward serve`: settings from the environment, runs until Ctrl-C or SIGTERM.
pub async fn serve_from_env() -> anyhow::Result<ExitCode> {
    let settings = Settings::load(&ProcessEnv)?;
    let app = Application::build(settings).await?;
    // The first signal drains, a second stops at once.
    let (first, second) = signals();
    app.run_until_drained(first, second).await?;
    Ok(ExitCode::SUCCESS)
}

/// Two futures over the same stop signals: the first completes at the first Ctrl-C or SIGTERM,
/// the second at the one after it.
pub fn signals() -> (
    impl Future<Output = ()> + Send + 'static,
    impl Future<Output = ()> + Send + 'static,
) {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<()>(2);
    tokio::spawn(async move {
        for _ in 0..2 {
            shutdown_signal().await;
            if tx.send(()).await.is_err() {
                return;
            }
        }
    });
    let (first_tx, first_rx) = tokio::sync::oneshot::channel::<()>();
    let second = async move {
        let _ = rx.recv().await;
        let _ = first_tx.send(());
        if rx.recv().await.is_none() {
            std::future::pending::<()>().await;
        }
        tracing::warn!("a second stop signal: stopping at once");
    };
    let second = tokio::spawn(second);
    let first = async move {
        let _ = first_rx.await;
    };
    let second = async move {
        let _ = second.await;
    };
    (first, second)
}

/// Completes on Ctrl-C, or SIGTERM on Unix (what container runtimes send).
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::error!(error = %e, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = terminate => {},
    }
    tracing::info!("shutting down");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slack::render::EMBEDDED;

    #[test]
    fn the_embedded_templates_pass_every_start_check() {
        load_templates(None).unwrap();
    }

    /// Every template file is rendered when the templates load: an override that is valid
    /// minijinja but not Block Kit stops the load, naming the file (a partial: the message that
    /// includes it).
    #[test]
    fn a_broken_override_of_any_template_stops_the_load() {
        for &(name, _) in EMBEDDED {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(
                dir.path().join(name),
                r#"{"text": "x", "blocks": [{"type": "section", "text": 42}]}"#,
            )
            .unwrap();
            let err = load_templates(Some(dir.path())).err().unwrap_or_else(|| {
                panic!("{name} was overridden with a broken message and loaded")
            });
            if !name.starts_with('_') {
                assert!(err.to_string().contains(name), "{name}: {err}");
            }
        }
    }
}
