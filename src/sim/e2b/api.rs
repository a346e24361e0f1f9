//! Handlers for E2B's control-plane routes: parse and validate like E2B's spec validator, apply
//! the change to the `World` under its lock, and render the spec's JSON.
//!
//! Handlers never `.await` while holding the world lock, and do work proportional to the page
//! they return. Authentication, latency and faults are the gate's job, not theirs.
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use super::model::{
    CLIENT_ID, DEFAULT_TIMEOUT_SECS, ListQuery, MAX_LIFETIME_MS, Sandbox, SandboxState, TeamPoint,
    Template, World, short_sandbox_id,
};
use super::series::{self, LogQuery, METRIC_GRID_SECS, Ms, Profile, Sample, SeriesKey};
use super::wire::{
    self, ApiError, Params, decode_token, encode_token, parse_body, parse_rfc3339_ms, rfc3339_ms,
    rfc3339_nano, rfc3339_secs,
};
use super::{PagingMode, Sim, now_ms};

type Reply = Result<Response, ApiError>;

const MAX_TIMEOUT_SECS: i64 = MAX_LIFETIME_MS / 1000;
/// The v2 routes' TTL when the request gives none (the v1 create's is 15 s, its connect needs one).
const V2_DEFAULT_TIMEOUT_SECS: i64 = 300;
/// Team metrics default to the last seven days.
const TEAM_METRICS_DEFAULT_SECS: i64 = 7 * 24 * 3600;
const X_NEXT_TOKEN: HeaderName = HeaderName::from_static("x-next-token");
const X_TOTAL_RUNNING: HeaderName = HeaderName::from_static("x-total-running");

fn json_with(status: StatusCode, body: Value, headers: Vec<(HeaderName, String)>) -> Response {
    let mut response = (status, Json(body)).into_response();
    for (name, value) in headers {
        if let Ok(value) = HeaderValue::from_str(&value) {
            response.headers_mut().insert(name, value);
        }
    }
    response
}

/// A TTL in seconds, checked against the 24-hour lifetime limit.
fn checked_timeout(timeout: Option<i64>) -> Result<i64, ApiError> {
    let timeout = timeout.unwrap_or(DEFAULT_TIMEOUT_SECS);
    if timeout < 0 {
        return Err(ApiError::bad_request(
            "request body has an error: timeout: number must be at least 0",
        ));
    }
    if timeout > MAX_TIMEOUT_SECS {
        return Err(ApiError::bad_request(
            "Timeout cannot be greater than 24 hours",
        ));
    }
    Ok(timeout)
}

/// Applies a change that E2B answers with 204 No Content.
fn apply(sim: &Sim, change: impl FnOnce(&mut World, Ms) -> Result<(), ApiError>) -> Reply {
    let now = now_ms();
    change(&mut sim.world(now), now)?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Applies a change that E2B answers with the sandbox (`Sandbox` JSON); `change` picks the status.
fn apply_and_show(
    sim: &Sim,
    id: &str,
    change: impl FnOnce(&mut World, Ms) -> Result<StatusCode, ApiError>,
) -> Reply {
    let now = now_ms();
    let mut world = sim.world(now);
    let status = change(&mut world, now)?;
    let s = world.live(id)?;
    Ok((status, Json(sandbox_json(&world, s))).into_response())
}

/// Where a paged list resumes: the paging mode, the token the request carried, and the cursor it
/// decodes to. Under sabotaged paging the token is not decoded and the list restarts from the top.
struct Resume<'p, T> {
    mode: PagingMode,
    incoming: Option<&'p str>,
    after: Option<T>,
}

impl<'p, T> Resume<'p, T> {
    fn read(
        sim: &Sim,
        p: &'p Params,
        decode: impl FnOnce(&str) -> Result<T, ApiError>,
    ) -> Result<Self, ApiError> {
        let mode = sim.paging();
        let incoming = p.get("nextToken").filter(|t| !t.is_empty());
        let after = match incoming {
            Some(token) if mode == PagingMode::Normal => Some(decode(token)?),
            _ => None,
        };
        Ok(Self {
            mode,
            incoming,
            after,
        })
    }

    /// The `X-Next-Token` header for the page after this one, if there is one to announce.
    fn next_token_header(
        &self,
        sim: &Sim,
        computed: Option<String>,
    ) -> Option<(HeaderName, String)> {
        sim.next_token(self.mode, self.incoming, computed)
            .map(|t| (X_NEXT_TOKEN, t))
    }
}

/// A two-valued enum parameter read as a flag: its first value is true, its second false, and an
/// absent parameter is `default`; any other value is refused in the validator's words.
fn flag(p: &Params, name: &str, [yes, no]: [&str; 2], default: bool) -> Result<bool, ApiError> {
    Ok(p.one_of(name, &[yes, no])?.map_or(default, |v| v == yes))
}

// ---- rendering ----

/// `ListedSandbox`.
pub(crate) fn listed_json(world: &World, s: &Sandbox) -> Value {
    let mut v = json!({
        "templateID": s.template_id,
        "sandboxID": s.id,
        "clientID": CLIENT_ID,
        "startedAt": rfc3339_ms(s.started_at),
        "endAt": rfc3339_ms(s.end_at),
        "cpuCount": s.cpu_count,
        "memoryMB": s.memory_mb,
        "diskSizeMB": s.disk_size_mb,
        "state": s.state.as_str(),
        "envdVersion": world.envd_version,
    });
    if let Some(alias) = world.alias_of(&s.template_id) {
        v["alias"] = json!(alias);
    }
    if !s.metadata.is_empty() {
        v["metadata"] = json!(s.metadata);
    }
    v
}

/// `SandboxDetail`: the listed fields plus token, network and lifecycle.
fn detail_json(world: &World, s: &Sandbox) -> Value {
    let mut v = listed_json(world, s);
    if let Some(token) = &s.envd_access_token {
        v["envdAccessToken"] = json!(token);
    }
    v["allowInternetAccess"] = json!(s.allow_internet_access);
    v["domain"] = Value::Null;
    v["lifecycle"] = json!({
        "autoResume": s.auto_resume,
        "onTimeout": if s.auto_pause { "pause" } else { "kill" },
    });
    v
}

/// `Sandbox`, as create, resume and connect answer.
fn sandbox_json(world: &World, s: &Sandbox) -> Value {
    let mut v = json!({
        "templateID": s.template_id,
        "sandboxID": s.id,
        "clientID": CLIENT_ID,
        "envdVersion": world.envd_version,
        "trafficAccessToken": null,
        "domain": null,
    });
    if let Some(alias) = world.alias_of(&s.template_id) {
        v["alias"] = json!(alias);
    }
    if let Some(token) = &s.envd_access_token {
        v["envdAccessToken"] = json!(token);
    }
    v
}

/// One `SandboxMetric` on the wire. A typed struct rather than a `json!` value: metric windows
/// are the simulator's hottest answer (hundreds of samples each, thousands per sweep), and
/// building a map per sample cost more CPU than everything else it serves.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct MetricWire {
    timestamp: String,
    timestamp_unix: i64,
    cpu_count: u32,
    cpu_used_pct: f64,
    mem_used: i64,
    mem_total: i64,
    mem_cache: i64,
    disk_used: i64,
    disk_total: i64,
}

fn metric_wire(cpu_count: u32, m: &Sample) -> MetricWire {
    MetricWire {
        timestamp: rfc3339_secs(m.t),
        timestamp_unix: m.t,
        cpu_count,
        cpu_used_pct: m.cpu_used_pct,
        mem_used: m.mem_used,
        mem_total: m.mem_total,
        mem_cache: m.mem_cache,
        disk_used: m.disk_used,
        disk_total: m.disk_total,
    }
}

/// A sandbox's sample at second `t`: live from its processes once it has run any (`exec`),
/// generated from its series otherwise.
fn sample_at(sim: &Sim, id: &str, key: &SeriesKey, t: i64) -> Sample {
    const MIB: i64 = 1024 * 1024;
    match sim.exec().live_sample(id, t) {
        Some(live) => Sample {
            t,
            cpu_used_pct: live.cpu_used_pct,
            mem_used: live.mem_used,
            mem_cache: 0,
            mem_total: i64::from(key.memory_mb) * MIB,
            disk_used: live.disk_used,
            disk_total: i64::from(key.disk_size_mb) * MIB,
        },
        None => series::sample(key, t),
    }
}

fn aliases(t: &Template) -> Vec<String> {
    t.alias.iter().cloned().collect()
}

/// `Template` (v2 list).
fn template_json(t: &Template, envd_version: &str) -> Value {
    let build = t.current_build();
    json!({
        "templateID": t.id,
        "buildID": build.id,
        "cpuCount": t.cpu_count,
        "memoryMB": t.memory_mb,
        "diskSizeMB": t.disk_size_mb,
        "public": t.public,
        "aliases": aliases(t),
        "names": t.names,
        "createdAt": rfc3339_ms(t.created_at),
        "updatedAt": rfc3339_ms(t.updated_at),
        "createdBy": t.created_by.as_ref().map(|id| json!({"id": id, "email": null})),
        "lastSpawnedAt": t.last_spawned_at.map(rfc3339_ms),
        "spawnCount": t.spawn_count,
        "buildCount": t.builds.len(),
        "envdVersion": envd_version,
        "buildStatus": "ready",
    })
}

fn snapshot_info_json(t: &Template) -> Value {
    json!({
        "snapshotID": t.snapshot_id,
        "names": t.names.iter().map(|n| format!("{n}:default")).collect::<Vec<_>>(),
    })
}

// ---- sandboxes ----

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct NewSandbox {
    #[serde(rename = "templateID")]
    template_id: String,
    timeout: Option<i64>,
    auto_pause: Option<bool>,
    auto_pause_memory: Option<bool>,
    auto_resume: Option<AutoResume>,
    /// v1 only: whether envd asks for an access token. A v2 sandbox always does.
    secure: Option<bool>,
    #[serde(rename = "allow_internet_access")]
    allow_internet_access: Option<bool>,
    metadata: Option<BTreeMap<String, String>>,
    env_vars: Option<BTreeMap<String, String>>,
}

#[derive(Deserialize, Default)]
struct AutoResume {
    enabled: bool,
}

/// The routes E2B serves a create or connect on: `/sandboxes…` (v1) or `/v2/sandboxes…`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Route {
    V1,
    V2,
}

/// E2B's answer for a route it does not have, as an older self-hosted E2B gives it for v2.
fn route_not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "Not found")
}

/// `POST /sandboxes` (v1; deprecated by E2B in favour of v2).
pub(crate) async fn create(State(sim): State<Arc<Sim>>, body: Bytes) -> Reply {
    create_by(&sim, &body, Route::V1)
}

/// `POST /v2/sandboxes`: as v1, but always secured (an envd access token) and a 300 s default TTL.
pub(crate) async fn create_v2(State(sim): State<Arc<Sim>>, body: Bytes) -> Reply {
    if sim.v1_only {
        return Err(route_not_found());
    }
    create_by(&sim, &body, Route::V2)
}

fn create_by(sim: &Sim, body: &[u8], route: Route) -> Reply {
    let req: NewSandbox = parse_body(body, true)?;
    let default_timeout = match route {
        Route::V1 => DEFAULT_TIMEOUT_SECS,
        Route::V2 => V2_DEFAULT_TIMEOUT_SECS,
    };
    let timeout = checked_timeout(Some(req.timeout.unwrap_or(default_timeout)))?;
    let auto_pause = req.auto_pause.unwrap_or(false);
    let auto_resume = req.auto_resume.is_some_and(|a| a.enabled);
    if auto_resume && !auto_pause {
        return Err(ApiError::bad_request(
            "autoResume can only be enabled together with autoPause",
        ));
    }
    if auto_resume && req.auto_pause_memory == Some(false) {
        return Err(ApiError::bad_request(
            "autoResume cannot be combined with autoPauseMemory false: a filesystem-only snapshot must be resumed explicitly",
        ));
    }
    let env_vars = req.env_vars.unwrap_or_default();
    if let Some(bad) = env_vars.keys().find(|k| !valid_env_name(k)) {
        return Err(ApiError::bad_request(format!(
            "request body has an error: envVars: {bad:?} is not a valid environment variable name"
        )));
    }
    let now = now_ms();
    let mut world = sim.world(now);
    let template = world
        .resolve_template(&req.template_id)
        .ok_or_else(|| ApiError::template_not_found(&req.template_id))?;
    let (template_id, cpu, mem, disk) = (
        template.id.clone(),
        template.cpu_count,
        template.memory_mb,
        template.disk_size_mb,
    );
    let id = world.fresh_sandbox_id();
    let secure = route == Route::V2 || req.secure.unwrap_or(false);
    let token = secure.then(|| world.fresh_uuid());
    world.insert_sandbox(Sandbox {
        id: id.clone(),
        template_id,
        state: SandboxState::Running,
        started_at: now,
        end_at: now + timeout * 1000,
        cpu_count: cpu,
        memory_mb: mem,
        disk_size_mb: disk,
        metadata: req.metadata.unwrap_or_default(),
        profile: Profile::Busy,
        auto_pause,
        auto_resume,
        envd_access_token: token,
        allow_internet_access: req.allow_internet_access,
        env_vars,
        past_runs: Vec::new(),
    });
    let sandbox = world.live(&id)?;
    Ok((StatusCode::CREATED, Json(sandbox_json(&world, sandbox))).into_response())
}

/// A name a process environment can hold: not empty, no `=` and no NUL.
fn valid_env_name(name: &str) -> bool {
    !name.is_empty() && !name.contains(['=', '\0'])
}

/// Decodes a sandbox-list token: `base64url("{RFC3339Nano}__{id}")`, `__asc` appended for asc.
fn sandbox_cursor(token: &str, ascending: bool) -> Result<(i64, String), ApiError> {
    let plain = decode_token(token)?;
    let (body, is_asc) = match plain.strip_suffix("__asc") {
        Some(body) => (body, true),
        None => (plain.as_str(), false),
    };
    if is_asc != ascending {
        return Err(ApiError::invalid_token());
    }
    let (time, id) = body.split_once("__").ok_or_else(ApiError::invalid_token)?;
    let ms = parse_rfc3339_ms(time).ok_or_else(ApiError::invalid_token)?;
    if id.is_empty() {
        return Err(ApiError::invalid_token());
    }
    Ok((ms, id.to_owned()))
}

pub(crate) async fn list(State(sim): State<Arc<Sim>>, RawQuery(raw): RawQuery) -> Reply {
    let p = Params::parse(raw.as_deref());
    let limit = p.page_limit()?;
    let (mut running, mut paused) = (true, true);
    if let Some(states) = p.get("state").filter(|s| !s.is_empty()) {
        (running, paused) = (false, false);
        for state in states.split(',') {
            match state.trim() {
                "running" => running = true,
                "paused" => paused = true,
                other => {
                    return Err(ApiError::not_one_of("state", other, &["running", "paused"]));
                }
            }
        }
    }
    let ascending = flag(&p, "order", ["asc", "desc"], false)?;
    let started_after = match p.get("startedAfter") {
        Some(v) => Some(parse_rfc3339_ms(v).ok_or_else(|| {
            ApiError::bad_request(format!(
                "parameter \"startedAfter\" in query has an error: {v:?} is not an RFC 3339 date-time"
            ))
        })?),
        None => None,
    };
    let metadata = match p.get("metadata") {
        Some(m) => wire::metadata_filter(m)?,
        None => Vec::new(),
    };
    let mut resume = Resume::read(&sim, &p, |token| sandbox_cursor(token, ascending))?;
    let now = now_ms();
    let world = sim.world(now);
    // An unknown template matches nothing rather than failing.
    let template = p.get("template").map(|t| {
        world
            .resolve_template(t)
            .map_or_else(|| t.to_owned(), |t| t.id.clone())
    });
    let page = world.list(&ListQuery {
        running,
        paused,
        metadata,
        template,
        started_after,
        ascending,
        limit,
        after: resume.after.take(),
    });
    let body: Vec<Value> = page.items.iter().map(|s| listed_json(&world, s)).collect();
    let computed = page.next.map(|(ms, id)| {
        let suffix = if ascending { "__asc" } else { "" };
        encode_token(&format!("{}__{id}{suffix}", rfc3339_nano(ms)))
    });
    let mut headers: Vec<_> = resume
        .next_token_header(&sim, computed)
        .into_iter()
        .collect();
    if let Some(total) = page.total_running {
        headers.push((X_TOTAL_RUNNING, total.to_string()));
    }
    drop(world);
    Ok(json_with(StatusCode::OK, Value::Array(body), headers))
}

pub(crate) async fn get_sandbox(State(sim): State<Arc<Sim>>, Path(id): Path<String>) -> Reply {
    let world = sim.world(now_ms());
    let s = world.live(&id)?;
    Ok(Json(detail_json(&world, s)).into_response())
}

pub(crate) async fn kill(State(sim): State<Arc<Sim>>, Path(id): Path<String>) -> Reply {
    let reply = apply(&sim, |world, now| world.kill(&id, now));
    if reply.is_ok() {
        // The kills E2B actually carried out (a second kill of one sandbox is a 404).
        sim.count("killed");
    }
    reply
}

#[derive(Deserialize, Default)]
struct PauseBody {
    #[serde(rename = "memory")]
    _memory: Option<bool>,
}

pub(crate) async fn pause(
    State(sim): State<Arc<Sim>>,
    Path(id): Path<String>,
    body: Bytes,
) -> Reply {
    let _: PauseBody = parse_body(&body, false)?;
    let reply = apply(&sim, |world, now| world.pause(&id, now));
    if reply.is_ok() {
        // Calls are counted as they arrive; this counts the pauses E2B actually carried out
        // (a request whose client died before it was handled pauses nothing).
        sim.count("paused");
    }
    reply
}

#[derive(Deserialize, Default)]
struct TimeoutBody {
    timeout: Option<i64>,
}

pub(crate) async fn resume(
    State(sim): State<Arc<Sim>>,
    Path(id): Path<String>,
    body: Bytes,
) -> Reply {
    let req: TimeoutBody = parse_body(&body, false)?;
    let timeout = checked_timeout(req.timeout)?;
    apply_and_show(&sim, &id, |world, now| {
        world.resume(&id, now, timeout)?;
        Ok(StatusCode::CREATED)
    })
}

/// Parses a body whose `timeout` the spec requires.
fn required_timeout(body: &[u8]) -> Result<i64, ApiError> {
    let req: TimeoutBody = parse_body(body, true)?;
    let timeout = req.timeout.ok_or_else(|| {
        ApiError::bad_request("request body has an error: property \"timeout\" is missing")
    })?;
    checked_timeout(Some(timeout))
}

/// `POST /sandboxes/{id}/connect` (v1): `timeout` is required.
pub(crate) async fn connect(
    State(sim): State<Arc<Sim>>,
    Path(id): Path<String>,
    body: Bytes,
) -> Reply {
    let timeout = required_timeout(&body)?;
    connect_by(&sim, &id, timeout)
}

#[derive(Deserialize, Default)]
struct ConnectV2Body {
    timeout: Option<i64>,
    /// `false` resumes from disk only; the simulator keeps no memory, so both are the same here.
    #[serde(rename = "memory")]
    _memory: Option<bool>,
}

/// `POST /v2/sandboxes/{id}/connect`: as v1, with `timeout` optional (300 s).
pub(crate) async fn connect_v2(
    State(sim): State<Arc<Sim>>,
    Path(id): Path<String>,
    body: Bytes,
) -> Reply {
    if sim.v1_only {
        return Err(route_not_found());
    }
    let req: ConnectV2Body = parse_body(&body, false)?;
    let timeout = checked_timeout(Some(req.timeout.unwrap_or(V2_DEFAULT_TIMEOUT_SECS)))?;
    connect_by(&sim, &id, timeout)
}

/// Resumes a paused sandbox (201) or extends a running one's TTL (200), with its `Sandbox`.
fn connect_by(sim: &Sim, id: &str, timeout: i64) -> Reply {
    apply_and_show(sim, id, |world, now| {
        let resumed = world.connect(id, now, timeout)?;
        Ok(if resumed {
            StatusCode::CREATED
        } else {
            StatusCode::OK
        })
    })
}

pub(crate) async fn set_timeout(
    State(sim): State<Arc<Sim>>,
    Path(id): Path<String>,
    body: Bytes,
) -> Reply {
    let timeout = required_timeout(&body)?;
    apply(&sim, |world, now| world.set_timeout(&id, now, timeout))
}

#[derive(Deserialize, Default)]
struct RefreshBody {
    duration: Option<i64>,
}

pub(crate) async fn refresh(
    State(sim): State<Arc<Sim>>,
    Path(id): Path<String>,
    body: Bytes,
) -> Reply {
    let req: RefreshBody = parse_body(&body, false)?;
    let duration = req.duration.unwrap_or(0);
    if !(0..=3600).contains(&duration) {
        return Err(ApiError::bad_request(
            "request body has an error: duration: number must be between 0 and 3600",
        ));
    }
    apply(&sim, |world, now| world.refresh(&id, now, duration))
}

pub(crate) async fn logs(
    State(sim): State<Arc<Sim>>,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
) -> Reply {
    let p = Params::parse(raw.as_deref());
    let cursor = p.int("cursor", 0, i64::MAX)?;
    let limit = p.int("limit", 0, 1000)?.unwrap_or(1000) as usize;
    let forward = flag(&p, "direction", ["forward", "backward"], false)?;
    let min_level = match p.get("level") {
        Some(level) => series::log_level_rank(level).ok_or_else(|| {
            ApiError::not_one_of("level", level, &["debug", "info", "warn", "error"])
        })?,
        None => 0,
    };
    let search = p.get("search");
    if search.is_some_and(|s| s.chars().count() > 256) {
        return Err(ApiError::bad_request(
            "parameter \"search\" in query has an error: maximum string length is 256",
        ));
    }
    let now = now_ms();
    let world = sim.world(now);
    let s = world.live(&id)?;
    let runs = s.runs();
    let query = LogQuery {
        key: s.series_key(world.seed).key,
        profile: s.profile,
        runs: &runs,
        until: s.observed_until(now),
        cursor,
        forward,
        limit,
        min_level,
        search,
    };
    let generated = series::logs(&query);
    let lines = series::merge_logs(&query, generated, world.notes(&s.id));
    drop(world);
    let logs: Vec<Value> = lines
        .into_iter()
        .map(|l| {
            let fields: BTreeMap<&str, String> = l.fields.into_iter().collect();
            json!({
                "timestamp": rfc3339_ms(l.t_ms),
                "level": l.level,
                "message": l.message,
                "fields": fields,
            })
        })
        .collect();
    Ok(Json(json!({ "logs": logs })).into_response())
}

/// `start`/`end` (unix seconds) with `start <= end`.
fn time_range(p: &Params) -> Result<(Option<i64>, Option<i64>), ApiError> {
    let start = p.int("start", 0, i64::MAX / 1000)?;
    let end = p.int("end", 0, i64::MAX / 1000)?;
    if let (Some(s), Some(e)) = (start, end)
        && s > e
    {
        return Err(ApiError::bad_request("start time cannot be after end time"));
    }
    Ok((start, end))
}

pub(crate) async fn metrics(
    State(sim): State<Arc<Sim>>,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
) -> Reply {
    let p = Params::parse(raw.as_deref());
    let (start, end) = time_range(&p)?;
    let now = now_ms();
    let world = sim.world(now);
    let s = world.live(&id)?;
    let runs = s.runs();
    let first_ms = runs.first().map_or(s.started_at, |r| r.0);
    let until = s.observed_until(now).div_euclid(1000);
    // Default range: the current run; either way clipped to when the sandbox had samples.
    let start = start
        .unwrap_or(s.started_at.div_euclid(1000))
        .max(first_ms.div_euclid(1000));
    let end = end.unwrap_or(until).min(until);
    let key = s.series_key(world.seed);
    let cpu = s.cpu_count;
    let sid = s.id.clone();
    drop(world);
    let mut out = Vec::new();
    if start <= end {
        let step = series::metric_step_secs(end - start);
        let mut t = start.div_euclid(step) * step;
        if t < start {
            t += step;
        }
        while t <= end {
            let tm = t * 1000;
            if runs.iter().any(|&(a, b)| tm >= a && tm < b) {
                out.push(metric_wire(cpu, &sample_at(&sim, &sid, &key, t)));
            }
            t += step;
        }
    }
    Ok(Json(out).into_response())
}

pub(crate) async fn metrics_many(State(sim): State<Arc<Sim>>, RawQuery(raw): RawQuery) -> Reply {
    let p = Params::parse(raw.as_deref());
    let ids: Vec<&str> = p
        .get("sandbox_ids")
        .map(|v| v.split(',').map(str::trim).collect())
        .unwrap_or_default();
    if ids.is_empty() || ids.iter().any(|id| id.is_empty()) {
        return Err(ApiError::bad_request(
            "parameter \"sandbox_ids\" in query has an error: value is required but missing",
        ));
    }
    if ids.len() > 100 {
        return Err(ApiError::bad_request(
            "parameter \"sandbox_ids\" in query has an error: number of items must be at most 100",
        ));
    }
    let mut seen = HashSet::new();
    if !ids.iter().all(|id| seen.insert(*id)) {
        return Err(ApiError::bad_request(
            "parameter \"sandbox_ids\" in query has an error: duplicate items found",
        ));
    }
    let now = now_ms();
    let latest = now.div_euclid(1000).div_euclid(METRIC_GRID_SECS) * METRIC_GRID_SECS;
    // Only the lookups happen under the lock; samples and JSON are built after releasing it,
    // so concurrent batches do not queue behind each other.
    let wanted: Vec<(String, series::SeriesKey, u32)> = {
        let world = sim.world(now);
        ids.iter()
            .filter_map(|id| world.live(id).ok())
            .filter(|s| s.state == SandboxState::Running && latest * 1000 >= s.started_at)
            .map(|s| (s.id.clone(), s.series_key(world.seed), s.cpu_count))
            .collect()
    };
    let out: BTreeMap<String, MetricWire> = wanted
        .into_iter()
        .map(|(id, key, cpu)| {
            let sample = sample_at(&sim, &id, &key, latest);
            (id, metric_wire(cpu, &sample))
        })
        .collect();
    #[derive(serde::Serialize)]
    struct Batch {
        sandboxes: BTreeMap<String, MetricWire>,
    }
    Ok(Json(Batch { sandboxes: out }).into_response())
}

fn check_team(world: &World, team: &str, path: &str) -> Result<(), ApiError> {
    if team == world.team_id {
        return Ok(());
    }
    Err(ApiError::new(
        StatusCode::FORBIDDEN,
        format!(
            "You ({}) are not authorized to access this team's ({path}) metrics",
            world.team_id
        ),
    ))
}

/// The team series for a query (the caller's team only), with the default window of the last
/// seven days, and the window's end.
fn team_points(sim: &Sim, team: &str, p: &Params) -> Result<(Vec<TeamPoint>, i64), ApiError> {
    let now = now_ms();
    let world = sim.world(now);
    check_team(&world, team, team)?;
    let (start, end) = time_range(p)?;
    let now_s = now.div_euclid(1000);
    let end = end.unwrap_or(now_s).min(now_s);
    let start = start.unwrap_or(end - TEAM_METRICS_DEFAULT_SECS);
    if start > end {
        return Ok((Vec::new(), end));
    }
    let step = series::metric_step_secs(end - start);
    Ok((world.team_series(start, end, step), end))
}

pub(crate) async fn team_metrics(
    State(sim): State<Arc<Sim>>,
    Path(team): Path<String>,
    RawQuery(raw): RawQuery,
) -> Reply {
    let p = Params::parse(raw.as_deref());
    let (points, _) = team_points(&sim, &team, &p)?;
    let body: Vec<Value> = points
        .iter()
        .map(|pt| {
            json!({
                "timestamp": rfc3339_secs(pt.t),
                "timestampUnix": pt.t,
                "concurrentSandboxes": pt.concurrent,
                "sandboxStartRate": pt.start_rate,
            })
        })
        .collect();
    Ok(Json(Value::Array(body)).into_response())
}

pub(crate) async fn team_metrics_max(
    State(sim): State<Arc<Sim>>,
    Path(team): Path<String>,
    RawQuery(raw): RawQuery,
) -> Reply {
    let p = Params::parse(raw.as_deref());
    let metric = p.one_of("metric", &["concurrent_sandboxes", "sandbox_start_rate"])?;
    let concurrent = match metric {
        Some(metric) => metric == "concurrent_sandboxes",
        None => {
            return Err(ApiError::bad_request(
                "parameter \"metric\" in query has an error: value is required but missing",
            ));
        }
    };
    let (points, end) = team_points(&sim, &team, &p)?;
    let value = |pt: &TeamPoint| {
        if concurrent {
            pt.concurrent as f64
        } else {
            pt.start_rate
        }
    };
    // The first point holding the maximum; an empty window reports 0 at its end.
    let best = points
        .iter()
        .fold(None::<(i64, f64)>, |best, pt| match best {
            Some((_, v)) if v >= value(pt) => best,
            _ => Some((pt.t, value(pt))),
        })
        .unwrap_or((end, 0.0));
    Ok(Json(json!({
        "timestamp": rfc3339_secs(best.0),
        "timestampUnix": best.0,
        "value": best.1,
    }))
    .into_response())
}

// ---- snapshots and templates ----

#[derive(Deserialize, Default)]
struct SnapshotBody {
    name: Option<String>,
}

pub(crate) async fn snapshot(
    State(sim): State<Arc<Sim>>,
    Path(id): Path<String>,
    body: Bytes,
) -> Reply {
    let req: SnapshotBody = parse_body(&body, true)?;
    let now = now_ms();
    let (snapshot_id, names) = sim.world(now).snapshot(&id, req.name.as_deref(), now)?;
    Ok((
        StatusCode::CREATED,
        Json(json!({ "snapshotID": snapshot_id, "names": names })),
    )
        .into_response())
}

/// Decodes a `{prefix}__{value}` token of the template-like lists.
fn prefixed_cursor(token: &str, prefix: &str) -> Result<String, ApiError> {
    let plain = decode_token(token)?;
    plain
        .strip_prefix(prefix)
        .and_then(|rest| rest.strip_prefix("__"))
        .filter(|rest| !rest.is_empty())
        .map(str::to_owned)
        .ok_or_else(ApiError::invalid_token)
}

/// Does a snapshot template answer to this `name` filter (`n`, `team/n`, `n:default`, id)?
fn snapshot_matches(t: &Template, filter: &str) -> bool {
    let name = match filter.rsplit_once(':') {
        Some((name, "default")) => name,
        Some(_) => return false,
        None => filter,
    };
    t.id == name || t.alias.as_deref() == Some(name) || t.names.iter().any(|n| n == name)
}

/// Pages any template-like list: `keep` filters, `render` shapes, tokens carry the last id.
fn template_page(
    sim: &Sim,
    p: &Params,
    prefix: &str,
    keep: impl Fn(&Template) -> bool,
    render: impl Fn(&Template) -> Value,
) -> Reply {
    let limit = p.page_limit()?;
    let resume = Resume::read(sim, p, |token| prefixed_cursor(token, prefix))?;
    let world = sim.world(now_ms());
    let mut items: Vec<&Template> = world
        .templates_after(resume.after.as_deref())
        .filter(|t| keep(t))
        .take(limit + 1)
        .collect();
    let computed = if items.len() > limit {
        items.truncate(limit);
        items
            .last()
            .map(|t| encode_token(&format!("{prefix}__{}", t.id)))
    } else {
        None
    };
    let body: Vec<Value> = items.into_iter().map(render).collect();
    drop(world);
    let headers = resume
        .next_token_header(sim, computed)
        .into_iter()
        .collect();
    Ok(json_with(StatusCode::OK, Value::Array(body), headers))
}

pub(crate) async fn snapshots(State(sim): State<Arc<Sim>>, RawQuery(raw): RawQuery) -> Reply {
    let p = Params::parse(raw.as_deref());
    let sandbox = p.get("sandboxID").map(|s| short_sandbox_id(s).to_owned());
    let name = p.get("name").map(str::to_owned);
    template_page(
        &sim,
        &p,
        "snap",
        |t| {
            t.snapshot_id.is_some()
                && sandbox.as_ref().is_none_or(|sid| {
                    t.builds
                        .iter()
                        .any(|b| b.source_sandbox.as_ref() == Some(sid))
                })
                && name.as_deref().is_none_or(|n| snapshot_matches(t, n))
        },
        snapshot_info_json,
    )
}

pub(crate) async fn templates(State(sim): State<Arc<Sim>>, RawQuery(raw): RawQuery) -> Reply {
    let p = Params::parse(raw.as_deref());
    if let Some(team) = p.get("teamID") {
        let ours = sim.world(now_ms()).team_id.clone();
        if team != ours {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                format!("You are not allowed to access templates of team '{team}'"),
            ));
        }
    }
    let envd_version = sim.world(now_ms()).envd_version.clone();
    template_page(
        &sim,
        &p,
        "tpl",
        |_| true,
        |t| template_json(t, &envd_version),
    )
}

pub(crate) async fn template(
    State(sim): State<Arc<Sim>>,
    Path(reference): Path<String>,
    RawQuery(raw): RawQuery,
) -> Reply {
    let p = Params::parse(raw.as_deref());
    let limit = p.page_limit()?;
    // Builds are listed newest first; the token carries how many were already served.
    let resume = Resume::read(&sim, &p, |token| {
        prefixed_cursor(token, "build")?
            .parse::<usize>()
            .map_err(|_| ApiError::invalid_token())
    })?;
    let offset = resume.after.unwrap_or(0);
    let world = sim.world(now_ms());
    let t = world
        .resolve_template(&reference)
        .ok_or_else(|| ApiError::template_not_found(&reference))?;
    let builds: Vec<Value> = t
        .builds
        .iter()
        .rev()
        .skip(offset)
        .take(limit)
        .map(|b| {
            json!({
                "buildID": b.id,
                "status": "ready",
                "createdAt": rfc3339_ms(b.created_at),
                "updatedAt": rfc3339_ms(b.finished_at),
                "finishedAt": rfc3339_ms(b.finished_at),
                "cpuCount": b.cpu_count,
                "memoryMB": b.memory_mb,
                "diskSizeMB": b.disk_size_mb,
                "envdVersion": world.envd_version,
            })
        })
        .collect();
    let computed = (offset + limit < t.builds.len())
        .then(|| encode_token(&format!("build__{}", offset + limit)));
    let body = json!({
        "templateID": t.id,
        "public": t.public,
        "aliases": aliases(t),
        "names": t.names,
        "createdAt": rfc3339_ms(t.created_at),
        "updatedAt": rfc3339_ms(t.updated_at),
        "lastSpawnedAt": t.last_spawned_at.map(rfc3339_ms),
        "spawnCount": t.spawn_count,
        "builds": builds,
    });
    drop(world);
    let headers = resume
        .next_token_header(&sim, computed)
        .into_iter()
        .collect();
    Ok(json_with(StatusCode::OK, body, headers))
}

pub(crate) async fn delete_template(
    State(sim): State<Arc<Sim>>,
    Path(reference): Path<String>,
) -> Reply {
    apply(&sim, |world, _| world.delete_template(&reference))
}
