//! The `/_sim/` test hooks: call counters, fault injection (before or after the request is
//! handled), paging sabotage, seeding one sandbox, changing one sandbox behind Steward's back,
//! and a state summary.
//!
//! These routes never need the API key, are never delayed or faulted, and are not counted.
//! They exist for tests and demos; nothing here is part of E2B's API.
use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::json;

use super::api::listed_json;
use super::fleet;
use super::model::{Sandbox, SandboxState};
use super::series::Profile;
use super::wire::{ApiError, parse_body};
use super::{FaultRule, OPS, PagingMode, Sim, now_ms};

type Reply = Result<Response, ApiError>;

/// Sizes of a template created on the fly by `POST /_sim/sandboxes`.
const ADHOC_TEMPLATE_SIZES: (u32, u32, u32) = (2, 1024, 4096);
/// Default TTL of a seeded running sandbox.
const SEEDED_TTL_MS: i64 = 300_000;

pub(crate) async fn calls(State(sim): State<Arc<Sim>>) -> Response {
    let calls = sim.control().calls.clone();
    Json(json!({ "calls": calls })).into_response()
}

pub(crate) async fn reset_calls(State(sim): State<Arc<Sim>>) -> Response {
    sim.control().calls.clear();
    StatusCode::NO_CONTENT.into_response()
}

#[derive(Deserialize, Default)]
struct FaultRequest {
    op: Option<String>,
    status: u16,
    count: Option<u32>,
    retry_after_secs: Option<u64>,
    error_code: Option<String>,
    /// The error body's `message` instead of the status's usual one.
    message: Option<String>,
    /// `before` (default): fail instead of handling. `after`: handle, then answer the fault.
    when: Option<String>,
}

pub(crate) async fn add_fault(State(sim): State<Arc<Sim>>, body: Bytes) -> Reply {
    let req: FaultRequest = parse_body(&body, true)?;
    if let Some(op) = &req.op
        && !OPS.contains(&op.as_str())
    {
        return Err(ApiError::bad_request(format!(
            "unknown op {op:?}; expected one of {}",
            OPS.join(", ")
        )));
    }
    // 403 is E2B refusing the team (blocked, over its plan); the rest are outages.
    if ![403, 429, 500, 502, 503, 504].contains(&req.status) {
        return Err(ApiError::bad_request(
            "status must be one of 403, 429, 500, 502, 503, 504",
        ));
    }
    let count = req.count.unwrap_or(1);
    if count == 0 {
        return Err(ApiError::bad_request("count must be at least 1"));
    }
    let status = StatusCode::from_u16(req.status)
        .map_err(|_| ApiError::bad_request("status is not an HTTP status"))?;
    let after = match req.when.as_deref() {
        None | Some("before") => false,
        Some("after") => true,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "when {other:?} must be before or after"
            )));
        }
    };
    sim.control().faults.push(FaultRule {
        op: req.op.clone(),
        status,
        remaining: count,
        retry_after_secs: req.retry_after_secs.unwrap_or(1),
        error_code: req.error_code.clone(),
        message: req.message.clone(),
        after,
    });
    Ok((
        StatusCode::CREATED,
        Json(json!({ "op": req.op, "status": req.status, "count": count, "after": after })),
    )
        .into_response())
}

pub(crate) async fn clear_faults(State(sim): State<Arc<Sim>>) -> Response {
    sim.control().faults.clear();
    StatusCode::NO_CONTENT.into_response()
}

#[derive(Deserialize, Default)]
struct PagingRequest {
    mode: String,
}

pub(crate) async fn set_paging(State(sim): State<Arc<Sim>>, body: Bytes) -> Reply {
    let req: PagingRequest = parse_body(&body, true)?;
    let mode = match req.mode.as_str() {
        "normal" => PagingMode::Normal,
        "repeat" => PagingMode::Repeat,
        "endless" => PagingMode::Endless,
        other => {
            return Err(ApiError::bad_request(format!(
                "mode {other:?} is not one of normal, repeat, endless"
            )));
        }
    };
    sim.control().paging = mode;
    Ok(Json(json!({ "mode": req.mode })).into_response())
}

#[derive(Deserialize, Default)]
struct SeedRequest {
    #[serde(rename = "sandboxID")]
    sandbox_id: Option<String>,
    #[serde(rename = "templateID")]
    template_id: String,
    state: String,
    #[serde(rename = "startedAt")]
    started_at: Option<DateTime<Utc>>,
    #[serde(rename = "endAt")]
    end_at: Option<DateTime<Utc>>,
    metadata: Option<BTreeMap<String, String>>,
    #[serde(rename = "cpuCount")]
    cpu_count: Option<u32>,
    #[serde(rename = "memoryMB")]
    memory_mb: Option<u32>,
    #[serde(rename = "diskSizeMB")]
    disk_size_mb: Option<u32>,
    profile: Option<String>,
    #[serde(rename = "autoPause")]
    auto_pause: Option<bool>,
    /// As `secure` on create: the sandbox gets an `envdAccessToken` that envd then requires.
    secure: Option<bool>,
    /// As `envVars` on create: every process in the sandbox starts with them.
    #[serde(rename = "envVars")]
    env_vars: Option<BTreeMap<String, String>>,
}

/// Seeds one sandbox exactly as described; answers 201 with its `ListedSandbox`.
pub(crate) async fn seed_sandbox(State(sim): State<Arc<Sim>>, body: Bytes) -> Reply {
    let req: SeedRequest = parse_body(&body, true)?;
    let now = now_ms();
    let state = parse_state(&req.state)?;
    let profile = req
        .profile
        .as_deref()
        .map(parse_profile)
        .transpose()?
        .unwrap_or(Profile::Busy);
    if req.template_id.trim().is_empty() {
        return Err(ApiError::bad_request("templateID is required"));
    }
    let started = req.started_at.map(|t| t.timestamp_millis());
    let end = req.end_at.map(|t| t.timestamp_millis());
    let (started_at, end_at) = match state {
        SandboxState::Running => {
            let started = started.unwrap_or(now);
            let end = end.unwrap_or(now.max(started) + SEEDED_TTL_MS);
            if started > now || end <= now {
                return Err(ApiError::bad_request(
                    "a running sandbox needs startedAt <= now < endAt",
                ));
            }
            (started, end)
        }
        _ => {
            let end = end.unwrap_or(now);
            let started = started.unwrap_or(end - 600_000);
            if end > now || started > end {
                return Err(ApiError::bad_request(
                    "a paused sandbox needs startedAt <= endAt (the pause time) <= now",
                ));
            }
            (started, end)
        }
    };
    let mut world = sim.world(now);
    let id = match req.sandbox_id {
        Some(id) => {
            let valid = !id.is_empty()
                && id.len() <= 64
                && id
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
            if !valid {
                return Err(ApiError::bad_request(
                    "sandboxID must be 1 to 64 lowercase letters and digits",
                ));
            }
            if world.contains_sandbox(&id) {
                return Err(ApiError::conflict(format!("sandbox {id} already exists")));
            }
            id
        }
        None => world.fresh_sandbox_id(),
    };
    let template_id = match world.resolve_template(&req.template_id) {
        Some(t) => t.id.clone(),
        None => {
            let (cpu, mem, disk) = ADHOC_TEMPLATE_SIZES;
            let sizes = (
                req.cpu_count.unwrap_or(cpu),
                req.memory_mb.unwrap_or(mem),
                req.disk_size_mb.unwrap_or(disk),
            );
            let t = fleet::template(req.template_id.clone(), None, sizes, false, now);
            world.add_template(t);
            req.template_id.clone()
        }
    };
    let token = req.secure.unwrap_or(false).then(|| world.fresh_uuid());
    let t = world
        .template(&template_id)
        .ok_or_else(|| ApiError::template_not_found(&template_id))?;
    let sandbox = Sandbox {
        id: id.clone(),
        cpu_count: req.cpu_count.unwrap_or(t.cpu_count).max(1),
        memory_mb: req.memory_mb.unwrap_or(t.memory_mb).max(128),
        disk_size_mb: req.disk_size_mb.unwrap_or(t.disk_size_mb),
        template_id,
        state,
        started_at,
        end_at,
        metadata: req.metadata.unwrap_or_default(),
        profile,
        auto_pause: req.auto_pause.unwrap_or(false),
        auto_resume: false,
        envd_access_token: token,
        allow_internet_access: None,
        env_vars: req.env_vars.unwrap_or_default(),
        past_runs: Vec::new(),
    };
    world.insert_sandbox(sandbox);
    let s = world.live(&id)?;
    let mut body = listed_json(&world, s);
    if let Some(token) = &s.envd_access_token {
        body["envdAccessToken"] = json!(token);
    }
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ChangeRequest {
    /// Replaces the metadata.
    metadata: Option<BTreeMap<String, String>>,
    /// `running` resumes a paused sandbox; `paused` pauses a running one.
    state: Option<String>,
    /// `busy`, `idle` or `disk-growing`: what its metrics show from now on.
    profile: Option<String>,
    /// Restarts it: the current run ends and a new one starts now (`startedAt` moves).
    restart: Option<bool>,
}

/// A seeded or changed sandbox's `state`: only the two a live sandbox can be in.
fn parse_state(value: &str) -> Result<SandboxState, ApiError> {
    match value {
        "running" => Ok(SandboxState::Running),
        "paused" => Ok(SandboxState::Paused),
        other => Err(ApiError::bad_request(format!(
            "state {other:?} must be running or paused"
        ))),
    }
}

/// A seeded or changed sandbox's `profile`.
fn parse_profile(value: &str) -> Result<Profile, ApiError> {
    Profile::parse(value).ok_or_else(|| {
        ApiError::bad_request(format!(
            "profile {value:?} must be busy, idle or disk-growing"
        ))
    })
}

/// `PATCH /_sim/sandboxes/{id}`: changes a live sandbox as its user would (resume, pause,
/// restart, new metadata, busy again) without counting an API call. Answers its `ListedSandbox`.
pub(crate) async fn change_sandbox(
    State(sim): State<Arc<Sim>>,
    Path(id): Path<String>,
    body: Bytes,
) -> Reply {
    let req: ChangeRequest = parse_body(&body, true)?;
    let profile = req.profile.as_deref().map(parse_profile).transpose()?;
    let target = req.state.as_deref().map(parse_state).transpose()?;
    let now = now_ms();
    let mut world = sim.world(now);
    world.live(&id)?;
    match target {
        Some(SandboxState::Running) if world.live(&id)?.state == SandboxState::Paused => {
            world.resume(&id, now, SEEDED_TTL_MS / 1000)?;
        }
        Some(SandboxState::Paused) if world.live(&id)?.state == SandboxState::Running => {
            world.pause(&id, now)?;
        }
        _ => {}
    }
    if req.restart == Some(true) {
        world.restart(&id, now)?;
    }
    world.change(&id, req.metadata, profile)?;
    let s = world.live(&id)?;
    Ok(Json(listed_json(&world, s)).into_response())
}

pub(crate) async fn state(State(sim): State<Arc<Sim>>) -> Response {
    let world = sim.world(now_ms());
    Json(json!({
        "running": world.running,
        "paused": world.paused,
        "killed": world.killed,
        "snapshots": world.snapshot_count(),
        "templates": world.template_count(),
    }))
    .into_response()
}
