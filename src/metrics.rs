//! Prometheus metrics: every series Steward exports is named here, once, with its labels, and
//! each event has one function, so an instrumented call site is one line.
//!
//! The recorder is the `metrics` crate's process-wide one, rendered by
//! `metrics-exporter-prometheus`; [`install`] sets it up once per process and `GET /metrics`
//! (`http::metrics`) renders it. Process-wide rather than per app because a process is one
//! replica in production, and because the clients that count (E2B, Slack, the store) would
//! otherwise all need a registry handle threaded through them. Tests that start several apps in
//! one process therefore share the counters: they assert that a series grew, never its exact value.
//!
//! Label values are `&'static str` everywhere in this module: a value must be one of a fixed set
//! written in the code (an E2B action name, a route, an outcome), so a sandbox id, user id, case id
//! or a path with an id in it can never become a label, and the number of series stays bounded.
//!
//! This module must not import anything of ours (it is a leaf every layer may call) and must
//! never block or fail: recording is fire-and-forget.
use std::sync::OnceLock;
use std::time::Duration;

use metrics::{counter, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Slack requests (`/slack/commands`, `/slack/interactions`, `/slack/events`) by route and outcome.
pub const SLACK_REQUESTS: &str = "steward_slack_requests_total";
/// How long Steward took to answer a Slack request, by route.
pub const SLACK_REQUEST_DURATION: &str = "steward_slack_request_duration_seconds";
/// Socket Mode envelopes read, by type and outcome.
pub const SLACK_SOCKET_ENVELOPES: &str = "steward_slack_socket_envelopes_total";
/// Socket Mode connections opened again, by why the last one ended.
pub const SLACK_SOCKET_RECONNECTS: &str = "steward_slack_socket_reconnects_total";
/// Slack Web API calls (and `response_url` posts) by method and outcome, one per attempt.
pub const SLACK_API_CALLS: &str = "steward_slack_api_calls_total";
/// Slack Web API answers that were 429s, by method.
pub const SLACK_API_RATE_LIMITED: &str = "steward_slack_api_rate_limited_total";
/// E2B control-plane requests by action and HTTP status, one per attempt.
pub const E2B_REQUESTS: &str = "steward_e2b_requests_total";
/// How long one E2B request took, by action.
pub const E2B_REQUEST_DURATION: &str = "steward_e2b_request_duration_seconds";
/// E2B requests sent again, by action and why.
pub const E2B_RETRIES: &str = "steward_e2b_retries_total";
/// How long the client waited before a retry because E2B answered 429, by action (its `_sum`
/// is the total time spent waiting, its `_count` the number of waits).
pub const E2B_RATE_LIMIT_WAIT: &str = "steward_e2b_rate_limit_wait_seconds";
/// Requests to envd, the agent inside a sandbox, by call and HTTP status.
pub const ENVD_REQUESTS: &str = "steward_envd_requests_total";
/// Time until envd answered one request (a process start: until its stream opened).
pub const ENVD_REQUEST_DURATION: &str = "steward_envd_request_duration_seconds";
/// Decisions on cases (clicks and reason submissions), by option and outcome.
pub const DECISIONS: &str = "steward_decisions_total";
/// Pending cases closed because nobody decided in time.
pub const CASES_EXPIRED: &str = "steward_cases_expired_total";
/// Decided cases whose job was lost and that the reconcile pass queued again.
pub const DECISIONS_REQUEUED: &str = "steward_decisions_requeued_total";
/// Jobs in the durable queue not yet acknowledged (waiting or being worked on), at the last scrape.
pub const QUEUE_DEPTH: &str = "steward_queue_depth";
/// Age of the oldest unacknowledged job at the last scrape (0 when the queue is empty).
pub const QUEUE_OLDEST_AGE: &str = "steward_queue_oldest_job_age_seconds";
/// Age of the oldest job no worker has taken yet, at the last scrape (0 when none waits). Unlike
/// [`QUEUE_OLDEST_AGE`] it does not grow while a long job (a governed run) is being worked on.
pub const QUEUE_OLDEST_WAITING_AGE: &str = "steward_queue_oldest_waiting_job_age_seconds";
/// Jobs a worker ran, by kind and outcome.
pub const JOBS: &str = "steward_jobs_total";
/// How long a worker spent on one job, by kind.
pub const JOB_DURATION: &str = "steward_job_duration_seconds";
/// How long one step of a decided case took, by step and outcome.
pub const JOB_STEP_DURATION: &str = "steward_job_step_duration_seconds";
/// E2B lifecycle events received, by event and what Steward did with them.
pub const E2B_EVENTS: &str = "steward_e2b_events_total";
pub const WATCH_FINDINGS: &str = "steward_watch_findings_total";
/// Fleet sweeps, by mode and outcome.
pub const SWEEPS: &str = "steward_sweeps_total";
/// How long a fleet sweep took, by mode.
pub const SWEEP_DURATION: &str = "steward_sweep_duration_seconds";
/// Sandboxes the last sweep saw, by state.
pub const FLEET_SANDBOXES: &str = "steward_fleet_sandboxes";
/// Sandboxes the last sweep judged idle.
pub const FLEET_IDLE: &str = "steward_fleet_idle_sandboxes";
/// What the idle sandboxes of the last sweep cost per day, in US dollars.
pub const FLEET_IDLE_COST: &str = "steward_fleet_idle_cost_usd_per_day";
/// When this replica's last successful sweep ended (Unix time): the fleet gauges are that
/// sweep's figures, so a dashboard takes them from the replica with the latest one.
pub const FLEET_LAST_SWEEP: &str = "steward_fleet_last_sweep_timestamp_seconds";
/// Redis commands that failed, by kind (`unavailable`: not reached; `backend`: refused).
pub const REDIS_ERRORS: &str = "steward_redis_errors_total";
/// 1 when the last scrape's queue read reached Redis, 0 when it did not.
pub const REDIS_UP: &str = "steward_redis_up";
/// Always 1; its `version` label is the running build's.
pub const BUILD_INFO: &str = "steward_build_info";

/// A Prometheus metric type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// One exported series: its name, type, label names and help text.
#[derive(Debug, Clone, Copy)]
pub struct Series {
    pub name: &'static str,
    pub kind: Kind,
    pub labels: &'static [&'static str],
    pub help: &'static str,
}

const fn series(
    name: &'static str,
    kind: Kind,
    labels: &'static [&'static str],
    help: &'static str,
) -> Series {
    Series {
        name,
        kind,
        labels,
        help,
    }
}

/// Every series, in the order docs/operations.md's table lists them.
pub const SERIES: &[Series] = &[
    series(
        SLACK_REQUESTS,
        Kind::Counter,
        &["route", "outcome"],
        "Slack requests (HTTP and Socket Mode) by route and outcome (signature_refused, 2xx, 4xx, 5xx, cancelled).",
    ),
    series(
        SLACK_REQUEST_DURATION,
        Kind::Histogram,
        &["route"],
        "Time to answer a Slack request.",
    ),
    series(
        SLACK_SOCKET_ENVELOPES,
        Kind::Counter,
        &["type", "outcome"],
        "Socket Mode envelopes by type (slash_commands, interactive, events_api, other) and outcome (handled, duplicate, refused, ignored, shed).",
    ),
    series(
        SLACK_SOCKET_RECONNECTS,
        Kind::Counter,
        &["reason"],
        "Socket Mode reconnects by why the last connection ended (disconnect, dropped, open_failed, connect_failed, refused).",
    ),
    series(
        SLACK_API_CALLS,
        Kind::Counter,
        &["method", "outcome"],
        "Slack Web API calls and response_url posts, one per attempt.",
    ),
    series(
        SLACK_API_RATE_LIMITED,
        Kind::Counter,
        &["method"],
        "Slack Web API answers that were rate limits (429).",
    ),
    series(
        E2B_REQUESTS,
        Kind::Counter,
        &["action", "status"],
        "E2B control-plane requests by action and HTTP status, one per attempt.",
    ),
    series(
        E2B_REQUEST_DURATION,
        Kind::Histogram,
        &["action"],
        "Duration of one E2B request.",
    ),
    series(
        E2B_RETRIES,
        Kind::Counter,
        &["action", "reason"],
        "E2B requests sent again.",
    ),
    series(
        E2B_RATE_LIMIT_WAIT,
        Kind::Histogram,
        &["action"],
        "Time waited before retrying after an E2B 429.",
    ),
    series(
        ENVD_REQUESTS,
        Kind::Counter,
        &["call", "status"],
        "Requests to envd inside a sandbox (governed runs, push tests) by call (process_start, process_connect, send_signal, upload, download, other) and HTTP status (transport: no answer).",
    ),
    series(
        ENVD_REQUEST_DURATION,
        Kind::Histogram,
        &["call"],
        "Time until envd answered one request (process_start: until its output stream opened).",
    ),
    series(
        DECISIONS,
        Kind::Counter,
        &["option", "outcome"],
        "Decisions on cases by option and outcome.",
    ),
    series(
        CASES_EXPIRED,
        Kind::Counter,
        &[],
        "Pending cases closed because nobody decided in time.",
    ),
    series(
        DECISIONS_REQUEUED,
        Kind::Counter,
        &[],
        "Decided cases re-queued by the reconcile pass after a lost job.",
    ),
    series(
        QUEUE_DEPTH,
        Kind::Gauge,
        &["lane"],
        "Unacknowledged jobs in the queue lane, at the last scrape.",
    ),
    series(
        QUEUE_OLDEST_AGE,
        Kind::Gauge,
        &["lane"],
        "Age of the oldest unacknowledged job of the lane, at the last scrape.",
    ),
    series(
        QUEUE_OLDEST_WAITING_AGE,
        Kind::Gauge,
        &["lane"],
        "Age of the oldest job of the lane no worker has taken yet, at the last scrape.",
    ),
    series(
        JOBS,
        Kind::Counter,
        &["kind", "outcome"],
        "Jobs run by a worker by kind and outcome.",
    ),
    series(
        JOB_DURATION,
        Kind::Histogram,
        &["kind"],
        "Time a worker spent on one job.",
    ),
    series(
        JOB_STEP_DURATION,
        Kind::Histogram,
        &["step", "outcome"],
        "Duration of one step of a decided case.",
    ),
    series(
        SWEEPS,
        Kind::Counter,
        &["mode", "outcome"],
        "Fleet sweeps by mode and outcome.",
    ),
    series(
        SWEEP_DURATION,
        Kind::Histogram,
        &["mode"],
        "Duration of a fleet sweep.",
    ),
    series(
        FLEET_SANDBOXES,
        Kind::Gauge,
        &["state"],
        "Sandboxes the last sweep saw, by state.",
    ),
    series(
        FLEET_IDLE,
        Kind::Gauge,
        &[],
        "Sandboxes the last sweep judged idle.",
    ),
    series(
        FLEET_IDLE_COST,
        Kind::Gauge,
        &[],
        "Estimated cost per day of the idle sandboxes of the last sweep, in US dollars.",
    ),
    series(
        FLEET_LAST_SWEEP,
        Kind::Gauge,
        &[],
        "When this replica's last successful sweep ended, in seconds since the Unix epoch.",
    ),
    series(
        REDIS_ERRORS,
        Kind::Counter,
        &["kind"],
        "Redis commands that failed, by kind (unavailable, backend).",
    ),
    series(
        REDIS_UP,
        Kind::Gauge,
        &[],
        "1 when the last scrape reached Redis, 0 when it did not.",
    ),
    series(
        E2B_EVENTS,
        Kind::Counter,
        &["event", "outcome"],
        "E2B lifecycle events received by webhook, by event (created, updated, paused, resumed, killed, other) and outcome (closed: a waiting case closed; watched: a [[watch]] rule raised it; noted: in a case's audit trail; no_case; duplicate; refused: mis-signed, malformed or too large; failed: retried on the next delivery).",
    ),
    series(
        WATCH_FINDINGS,
        Kind::Counter,
        &["rule_kind", "outcome"],
        "What [[watch]] rules raised, by rule kind (creation, burst) and outcome (case, already_open, notice, alert: a burst alert posted, grown: an alert updated with more sandboxes, dry_run: only logged, failed: a notice not posted).",
    ),
    series(
        BUILD_INFO,
        Kind::Gauge,
        &["version"],
        "Always 1; the version label is the running build's.",
    ),
];

/// Buckets of Slack answer times: 1 ms to 10 s (Slack gives up at 3 s).
const REQUEST_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
/// Buckets of one E2B request: 5 ms to 60 s, the client's own timeout (a snapshot or a
/// resume can take tens of seconds).
const E2B_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0,
];
/// Buckets of work that may take minutes: jobs, steps, sweeps (10 ms to 30 min).
const WORK_BUCKETS: &[f64] = &[
    0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 1800.0,
];
/// How often histogram samples are folded into their buckets between scrapes, so an unscraped
/// replica's memory stays bounded.
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Installs the process-wide recorder (once; later calls return the same handle) and starts its
/// upkeep thread. When another recorder was installed first (a program embedding the library),
/// Steward's series are rendered from a recorder of its own that nothing records into.
pub fn install() -> &'static PrometheusHandle {
    HANDLE.get_or_init(|| {
        let builder = buckets(PrometheusBuilder::new());
        let handle = match builder.install_recorder() {
            Ok(handle) => handle,
            Err(e) => {
                tracing::warn!(error = %e, "a metrics recorder was already installed; /metrics stays empty");
                buckets(PrometheusBuilder::new()).build_recorder().handle()
            }
        };
        describe();
        preregister();
        gauge!(BUILD_INFO, "version" => env!("CARGO_PKG_VERSION")).set(1.0);
        let upkeep = handle.clone();
        let spawned = std::thread::Builder::new()
            .name("metrics-upkeep".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(UPKEEP_EVERY);
                    upkeep.run_upkeep();
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "could not start the metrics upkeep thread");
        }
        handle
    })
}

fn buckets(builder: PrometheusBuilder) -> PrometheusBuilder {
    let mut builder = builder;
    for s in SERIES.iter().filter(|s| s.kind == Kind::Histogram) {
        let values = match s.name {
            SLACK_REQUEST_DURATION => REQUEST_BUCKETS,
            E2B_REQUEST_DURATION | ENVD_REQUEST_DURATION => E2B_BUCKETS,
            _ => WORK_BUCKETS,
        };
        // Only an empty bucket list is refused, and none of ours is empty.
        builder = builder
            .set_buckets_for_metric(Matcher::Full(s.name.to_owned()), values)
            .expect("bucket lists are not empty");
    }
    builder
}

fn describe() {
    for s in SERIES {
        let unit = s
            .name
            .ends_with("_seconds")
            .then_some(metrics::Unit::Seconds);
        match (s.kind, unit) {
            (Kind::Counter, _) => metrics::describe_counter!(s.name, s.help),
            (Kind::Gauge, _) => metrics::describe_gauge!(s.name, s.help),
            (Kind::Histogram, Some(unit)) => metrics::describe_histogram!(s.name, unit, s.help),
            (Kind::Histogram, None) => metrics::describe_histogram!(s.name, s.help),
        }
    }
}

/// Exports the counters that alerts divide or take `rate()` of at 0 from the start, so the first
/// failure after a restart is an increase Prometheus sees rather than the series appearing
/// already at 1. (Plain macros, not the request handles: those call [`install`].)
fn preregister() {
    for route in SLACK_ROUTES {
        for outcome in SLACK_OUTCOMES {
            counter!(SLACK_REQUESTS, "route" => route, "outcome" => outcome).increment(0);
        }
    }
    for kind in ["unavailable", "backend"] {
        counter!(REDIS_ERRORS, "kind" => kind).increment(0);
    }
    counter!(CASES_EXPIRED).increment(0);
    counter!(DECISIONS_REQUEUED).increment(0);
}

/// The text exposition of every series (`GET /metrics`).
pub fn render() -> String {
    install().render()
}

/// The `outcome` of a Slack request: a refused signature, else the status class. (A request
/// whose client went away before it was answered is `cancelled`.)
pub fn slack_request_outcome(status: u16, signature_refused: bool) -> &'static str {
    match status {
        _ if signature_refused => "signature_refused",
        200..=299 => "2xx",
        400..=499 => "4xx",
        500..=599 => "5xx",
        _ => "other",
    }
}

/// The Slack request series' `route` and `outcome` values, in the order of the request handles'
/// cells (`SLACK_REQUEST_HANDLES`).
pub const SLACK_ROUTES: [&str; 3] = ["commands", "interactions", "events"];
pub const SLACK_OUTCOMES: [&str; 6] = [
    "signature_refused",
    "2xx",
    "4xx",
    "5xx",
    "other",
    "cancelled",
];

/// The Slack request series' handles, each made on first use. Every Slack request records into
/// them, so they are looked up by index rather than by building and hashing the series' key in
/// the recorder's registry each time. Made after [`install`], so never a handle of no recorder.
struct SlackRequestHandles {
    requests: [[OnceLock<metrics::Counter>; SLACK_OUTCOMES.len()]; SLACK_ROUTES.len()],
    durations: [OnceLock<metrics::Histogram>; SLACK_ROUTES.len()],
}

static SLACK_REQUEST_HANDLES: SlackRequestHandles = SlackRequestHandles {
    requests: [const { [const { OnceLock::new() }; SLACK_OUTCOMES.len()] }; SLACK_ROUTES.len()],
    durations: [const { OnceLock::new() }; SLACK_ROUTES.len()],
};

/// A Slack request answered on `route` (`commands`, `interactions`, `events`).
pub fn slack_request(route: &'static str, outcome: &'static str, took: Duration) {
    let at = |names: &[&str], name: &str| names.iter().position(|n| *n == name);
    let (Some(r), Some(o)) = (at(&SLACK_ROUTES, route), at(&SLACK_OUTCOMES, outcome)) else {
        counter!(SLACK_REQUESTS, "route" => route, "outcome" => outcome).increment(1);
        histogram!(SLACK_REQUEST_DURATION, "route" => route).record(took.as_secs_f64());
        return;
    };
    let handles = &SLACK_REQUEST_HANDLES;
    handles.requests[r][o]
        .get_or_init(|| {
            install();
            counter!(SLACK_REQUESTS, "route" => SLACK_ROUTES[r], "outcome" => SLACK_OUTCOMES[o])
        })
        .increment(1);
    handles.durations[r]
        .get_or_init(|| {
            install();
            histogram!(SLACK_REQUEST_DURATION, "route" => SLACK_ROUTES[r])
        })
        .record(took.as_secs_f64());
}

/// A Socket Mode envelope acked. `kind`: `slash_commands`, `interactive`, `events_api`, `other`;
/// `outcome`: `handled`, `duplicate`, `refused`, `ignored`, `shed` (left unacked: too many in
/// flight).
pub fn slack_socket_envelope(kind: &'static str, outcome: &'static str) {
    counter!(SLACK_SOCKET_ENVELOPES, "type" => kind, "outcome" => outcome).increment(1);
}

/// A Socket Mode connection about to be opened again. `reason`: `disconnect` (Slack asked),
/// `dropped`, `open_failed`, `connect_failed`, `refused` (the app token).
pub fn slack_socket_reconnect(reason: &'static str) {
    counter!(SLACK_SOCKET_RECONNECTS, "reason" => reason).increment(1);
}

/// One attempt of a Slack Web API call (`method` as Slack names it, or `response_url`).
/// `outcome`: `ok`, `api_error`, `rate_limited`, `transport`, `refused`.
pub fn slack_api_call(method: &'static str, outcome: &'static str) {
    counter!(SLACK_API_CALLS, "method" => method, "outcome" => outcome).increment(1);
    if outcome == "rate_limited" {
        counter!(SLACK_API_RATE_LIMITED, "method" => method).increment(1);
    }
}

/// The `status` label of an E2B attempt: the HTTP status code, or why there was none.
pub fn e2b_status(status: Option<u16>, too_large: bool) -> &'static str {
    if too_large {
        return "too_large";
    }
    match status {
        None => "transport",
        Some(code) => status_code(code),
    }
}

/// A status code as a static label (codes outside 100..=599 are `other`).
fn status_code(code: u16) -> &'static str {
    match code {
        100..=599 => STATUS_TEXT[usize::from(code - 100)],
        _ => "other",
    }
}

/// "100" to "599", built at compile time: a label borrows a `&'static str` without allocating, and
/// keeps the module's rule that every label value is a static string.
const STATUS_TEXT: [&str; 500] = status_texts();

const fn status_texts() -> [&'static str; 500] {
    // Three ASCII digits per code, laid out in one static byte string.
    const DIGITS: &[u8; 1500] = &digits();
    let mut out = [""; 500];
    let mut i = 0;
    while i < 500 {
        let (_, rest) = DIGITS.split_at(i * 3);
        let (three, _) = rest.split_at(3);
        out[i] = match std::str::from_utf8(three) {
            Ok(s) => s,
            Err(_) => "other",
        };
        i += 1;
    }
    out
}

const fn digits() -> [u8; 1500] {
    let mut out = [0u8; 1500];
    let mut i = 0;
    while i < 500 {
        let code = i + 100;
        out[i * 3] = b'0' + (code / 100) as u8;
        out[i * 3 + 1] = b'0' + ((code / 10) % 10) as u8;
        out[i * 3 + 2] = b'0' + (code % 10) as u8;
        i += 1;
    }
    out
}

/// One attempt of an E2B request (`action` as the client names it).
pub fn e2b_request(action: &'static str, status: &'static str, took: Duration) {
    counter!(E2B_REQUESTS, "action" => action, "status" => status).increment(1);
    histogram!(E2B_REQUEST_DURATION, "action" => action).record(took.as_secs_f64());
}

/// One request to envd: `call` is `process_start`, `process_connect`, `send_signal`, `upload` or `download`,
/// `status` from [`e2b_status`], `took` until the answer's head.
pub fn envd_request(call: &'static str, status: &'static str, took: Duration) {
    counter!(ENVD_REQUESTS, "call" => call, "status" => status).increment(1);
    histogram!(ENVD_REQUEST_DURATION, "call" => call).record(took.as_secs_f64());
}

/// An E2B request about to be sent again after `wait`. `reason`: `rate_limited`, `status`,
/// `not_connected`, `interrupted`.
pub fn e2b_retry(action: &'static str, reason: &'static str, wait: Duration) {
    counter!(E2B_RETRIES, "action" => action, "reason" => reason).increment(1);
    if reason == "rate_limited" {
        histogram!(E2B_RATE_LIMIT_WAIT, "action" => action).record(wait.as_secs_f64());
    }
}

/// A decision on a case. `outcome`: `recorded`, `refused` (already decided, or not allowed by
/// the case), `not_allowed` (the person may not choose it), `store_error`.
pub fn decision(option: &'static str, outcome: &'static str) {
    counter!(DECISIONS, "option" => option, "outcome" => outcome).increment(1);
}

/// `n` pending cases closed by the expiry pass.
pub fn cases_expired(n: usize) {
    counter!(CASES_EXPIRED).increment(n as u64);
}

/// `n` decided cases re-queued by the reconcile pass.
pub fn decisions_requeued(n: usize) {
    counter!(DECISIONS_REQUEUED).increment(n as u64);
}

/// One lane of the queue as the store saw it at a scrape: its depth, the oldest job's age and
/// the oldest waiting (not yet taken) job's age. `lane`: `decisions`, `runs`.
pub fn queue_sampled(
    lane: &'static str,
    depth: u64,
    oldest_age: Duration,
    oldest_waiting_age: Duration,
) {
    gauge!(QUEUE_DEPTH, "lane" => lane).set(depth as f64);
    gauge!(QUEUE_OLDEST_AGE, "lane" => lane).set(oldest_age.as_secs_f64());
    gauge!(QUEUE_OLDEST_WAITING_AGE, "lane" => lane).set(oldest_waiting_age.as_secs_f64());
}

/// A job a worker finished with. `kind`: `decision`, `run`, `restore`; `outcome`: `finished`,
/// `gave_up`, `left_for_retry`, `handed_back`.
pub fn job(kind: &'static str, outcome: &'static str, took: Duration) {
    counter!(JOBS, "kind" => kind, "outcome" => outcome).increment(1);
    histogram!(JOB_DURATION, "kind" => kind).record(took.as_secs_f64());
}

/// One step of a decided case. `outcome`: `done`, `transient`, `permanent`, `evidence_changed`.
pub fn job_step(step: &'static str, outcome: &'static str, took: Duration) {
    histogram!(JOB_STEP_DURATION, "step" => step, "outcome" => outcome).record(took.as_secs_f64());
}

/// What one finished sweep found.
#[derive(Debug, Clone, Copy)]
pub struct SweepFigures {
    pub running: usize,
    pub paused: usize,
    pub idle: usize,
    pub idle_cost_per_day_usd: f64,
}

/// A sweep that ended (`mode`: `live`, `dry_run`); its figures when it succeeded.
/// One E2B lifecycle event delivery. `event`: `created`, `updated`, `paused`, `resumed`,
/// `killed`, `other` (or `unknown` before it was parsed); `outcome`: `closed`, `noted`,
/// `no_case`, `watched`, `duplicate`, `refused`, `failed`.
pub fn e2b_event(event: &'static str, outcome: &'static str) {
    counter!(E2B_EVENTS, "event" => event, "outcome" => outcome).increment(1);
}

/// What a `[[watch]]` rule raised (see [`WATCH_FINDINGS`]).
pub fn watch(rule_kind: &'static str, outcome: &'static str) {
    counter!(WATCH_FINDINGS, "rule_kind" => rule_kind, "outcome" => outcome).increment(1);
}

pub fn sweep(mode: &'static str, took: Duration, figures: Option<SweepFigures>) {
    let outcome = if figures.is_some() { "ok" } else { "failed" };
    counter!(SWEEPS, "mode" => mode, "outcome" => outcome).increment(1);
    histogram!(SWEEP_DURATION, "mode" => mode).record(took.as_secs_f64());
    if let Some(f) = figures {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        gauge!(FLEET_LAST_SWEEP).set(now.as_secs_f64());
        gauge!(FLEET_SANDBOXES, "state" => "running").set(f.running as f64);
        gauge!(FLEET_SANDBOXES, "state" => "paused").set(f.paused as f64);
        gauge!(FLEET_IDLE).set(f.idle as f64);
        gauge!(FLEET_IDLE_COST).set(f.idle_cost_per_day_usd);
    }
}

/// Whether Redis answered the scrape's queue read.
pub fn redis_reached(up: bool) {
    gauge!(REDIS_UP).set(if up { 1.0 } else { 0.0 });
}

/// A Redis command that failed (`kind`: `unavailable`, `backend`).
pub fn redis_error(kind: &'static str) {
    counter!(REDIS_ERRORS, "kind" => kind).increment(1);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_series_follows_the_naming_rules() {
        for s in SERIES {
            assert!(s.name.starts_with("steward_"), "{}", s.name);
            match s.kind {
                Kind::Counter => assert!(s.name.ends_with("_total"), "{}", s.name),
                Kind::Histogram => assert!(s.name.ends_with("_seconds"), "{}", s.name),
                Kind::Gauge => assert!(!s.name.ends_with("_total"), "{}", s.name),
            }
            for label in s.labels {
                assert!(
                    ![
                        "sandbox",
                        "sandbox_id",
                        "user",
                        "user_id",
                        "case",
                        "case_id",
                        "path",
                        "id"
                    ]
                    .contains(label),
                    "{} has an unbounded label {label}",
                    s.name
                );
            }
        }
    }

    #[test]
    fn status_labels_are_the_three_digits_or_say_why_there_is_none() {
        assert_eq!(e2b_status(Some(200), false), "200");
        assert_eq!(e2b_status(Some(429), false), "429");
        assert_eq!(e2b_status(Some(599), false), "599");
        assert_eq!(e2b_status(Some(100), false), "100");
        assert_eq!(e2b_status(Some(600), false), "other");
        assert_eq!(e2b_status(None, false), "transport");
        assert_eq!(e2b_status(Some(200), true), "too_large");
    }

    #[test]
    fn slack_outcomes_put_a_refused_signature_before_the_status_class() {
        assert_eq!(slack_request_outcome(401, true), "signature_refused");
        assert_eq!(slack_request_outcome(200, false), "2xx");
        assert_eq!(slack_request_outcome(413, false), "4xx");
        assert_eq!(slack_request_outcome(503, false), "5xx");
        assert_eq!(slack_request_outcome(302, false), "other");
    }
}
