//! envd as the simulator serves it on its second port, reached the way `E2B_SANDBOX_URL` reaches
//! it: every request names its sandbox in `E2b-Sandbox-Id` and the port in `E2b-Sandbox-Port`.
//!
//! The gate plays E2B's proxy (502 `The sandbox was not found` for an unknown, killed or paused
//! sandbox, 502 for a port other than envd's) and then envd's own check of `X-Access-Token`.
//! Behind it: `process.Process/Start` (Connect server streaming, JSON codec, written here frame by
//! frame and independently of Steward's decoder, so the two check each other),
//! `process.Process/SendSignal` (unary JSON) and `/files` (raw uploads and downloads in the
//! sandbox's scratch directory). Without `--exec local`, Start ends with `failed_precondition`.
//!
//! A started process is driven by its own task, which outlives the HTTP stream as envd's
//! processes outlive their callers; it writes start and end lines into the sandbox's logs.
//! Handlers never hold the world's lock across an `.await`.
use std::collections::HashMap;
use std::convert::Infallible;
use std::os::unix::process::ExitStatusExt;
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, Extension, RawQuery, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde::Deserialize;
use serde_json::{Value, json};
use subtle::ConstantTimeEq;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::mpsc;

use super::exec::{self, BASE_PATH, ExecMode, HOME, MAX_NOTES};
use super::model::SandboxState;
use super::series::LogLine;
use super::wire::Params;
use super::{Sim, now_ms};

/// The port envd listens on inside every sandbox; the proxy refuses any other.
pub(crate) const ENVD_PORT: u16 = 49983;
/// Largest upload accepted (the envd client caps downloads at 64 MiB too).
const MAX_UPLOAD_BYTES: usize = 64 * 1024 * 1024;
/// Largest Start request envelope.
const MAX_START_BYTES: usize = 1024 * 1024;
/// Output is read and sent in chunks of at most this many bytes.
const OUTPUT_CHUNK_BYTES: usize = 32 * 1024;
/// How often the sampler reads `/proc` while processes run.
const SAMPLE_EVERY: Duration = Duration::from_secs(1);
/// A paused sandbox with auto-resume that traffic wakes runs at least this long (E2B's default).
const TRAFFIC_RESUME_SECS: i64 = 300;
/// Frames queued for a slow reader before the process's task waits for it.
const FRAME_QUEUE: usize = 64;
const END_STREAM_FLAG: u8 = 0x02;
const CONNECT_JSON: &str = "application/connect+json";

/// The sandbox a request was routed to (its short id), set by the gate.
#[derive(Clone)]
struct Target(String);

pub(crate) fn router(sim: Arc<Sim>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/process.Process/Start", post(start))
        .route("/process.Process/SendSignal", post(send_signal))
        .route("/files", get(download).post(upload))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(MAX_UPLOAD_BYTES))
        .route_layer(middleware::from_fn_with_state(sim.clone(), gate))
        .with_state(sim)
}

/// envd's error body: `{"message", "code"}`.
fn envd_error(status: StatusCode, message: impl Into<String>) -> Response {
    let body = json!({ "message": message.into(), "code": status.as_u16() });
    (status, Json(body)).into_response()
}

/// A Connect unary error: `{"code", "message"}` with the code's HTTP status.
fn connect_error(code: &str, message: impl Into<String>) -> Response {
    let status = match code {
        "invalid_argument" | "failed_precondition" => StatusCode::BAD_REQUEST,
        "not_found" => StatusCode::NOT_FOUND,
        "unimplemented" => StatusCode::NOT_IMPLEMENTED,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    (
        status,
        Json(json!({ "code": code, "message": message.into() })),
    )
        .into_response()
}

/// E2B's proxy in front of envd, then envd's access-token check (not for `/health`).
async fn gate(State(sim): State<Arc<Sim>>, mut request: Request, next: Next) -> Response {
    let (raw_id, port) = {
        let header = |name: &str| {
            request
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(|v| v.trim().to_owned())
        };
        (header("e2b-sandbox-id"), header("e2b-sandbox-port"))
    };
    let Some(raw_id) = raw_id.filter(|id| !id.is_empty()) else {
        return envd_error(
            StatusCode::BAD_REQUEST,
            "the request has no E2b-Sandbox-Id header: this URL reaches sandboxes as E2B_SANDBOX_URL does, by header",
        );
    };
    let not_found = |id: &str| {
        let body = json!({ "sandboxId": id, "message": "The sandbox was not found", "code": 502 });
        (StatusCode::BAD_GATEWAY, Json(body)).into_response()
    };
    let (id, token) = {
        let now = now_ms();
        let mut world = sim.world(now);
        let (id, paused, auto_resume) = match world.live(&raw_id) {
            Ok(s) => (s.id.clone(), s.state == SandboxState::Paused, s.auto_resume),
            Err(_) => return not_found(&raw_id),
        };
        // Traffic resumes a paused sandbox only when it asked for auto-resume, as E2B's proxy does.
        if paused && (!auto_resume || world.resume(&id, now, TRAFFIC_RESUME_SECS).is_err()) {
            return not_found(&raw_id);
        }
        let token = world
            .live(&id)
            .ok()
            .and_then(|s| s.envd_access_token.clone());
        (id, token)
    };
    if let Some(port) = port
        && port.parse::<u16>().ok() != Some(ENVD_PORT)
    {
        let body = json!({
            "sandboxId": id,
            "message": "The sandbox is running but port is not open",
            "port": port,
            "code": 502,
        });
        return (StatusCode::BAD_GATEWAY, Json(body)).into_response();
    }
    if let Some(expected) = token
        && request.uri().path() != "/health"
    {
        let given = request.headers().get("x-access-token");
        let valid = given.is_some_and(|g| bool::from(g.as_bytes().ct_eq(expected.as_bytes())));
        if !valid {
            return envd_error(
                StatusCode::UNAUTHORIZED,
                "unauthorized access, please provide a valid access token or method signing if supported",
            );
        }
    }
    request.extensions_mut().insert(Target(id));
    next.run(request).await
}

async fn health() -> StatusCode {
    StatusCode::NO_CONTENT
}

async fn not_found() -> Response {
    envd_error(StatusCode::NOT_FOUND, "not found")
}

// ---- Connect framing ----

/// One envelope: flags, big-endian length, JSON.
fn frame(flags: u8, message: &Value) -> Bytes {
    let body = serde_json::to_vec(message).unwrap_or_else(|_| b"{}".to_vec());
    let mut out = Vec::with_capacity(5 + body.len());
    out.push(flags);
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&body);
    Bytes::from(out)
}

fn event(event: Value) -> Bytes {
    frame(0, &json!({ "event": event }))
}

fn stream_response(body: Body) -> Response {
    let mut response = Response::new(body);
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, CONNECT_JSON.parse().expect("static"));
    response
}

/// A stream that ends at once with a Connect error, as envd ends a Start it cannot serve.
fn stream_error(code: &str, message: impl Into<String>) -> Response {
    let end = frame(
        END_STREAM_FLAG,
        &json!({ "error": { "code": code, "message": message.into() } }),
    );
    stream_response(Body::from(end))
}

/// The one message of a Connect streaming request.
fn read_envelope(body: &[u8]) -> Result<&[u8], String> {
    if body.len() < 5 {
        return Err("the request is not a Connect envelope".to_owned());
    }
    if body[0] & 0x01 != 0 {
        return Err("compressed requests are not supported".to_owned());
    }
    let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
    if body.len() - 5 != len {
        return Err(format!(
            "the envelope announces {len} bytes but carries {}",
            body.len() - 5
        ));
    }
    Ok(&body[5..])
}

// ---- process.Process/Start ----

#[derive(Deserialize)]
struct StartRequest {
    process: ProcessConfig,
    #[serde(default)]
    pty: Option<Value>,
}

#[derive(Deserialize)]
struct ProcessConfig {
    cmd: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    envs: HashMap<String, String>,
    #[serde(default)]
    cwd: Option<String>,
}

/// What a log line shows of a command: the script of `sh -c script`, else the command line.
fn shown_command(config: &ProcessConfig) -> String {
    let script = config
        .args
        .iter()
        .position(|a| a == "-c")
        .and_then(|i| config.args.get(i + 1));
    let text = match script {
        Some(script) => script.clone(),
        None => std::iter::once(config.cmd.as_str())
            .chain(config.args.iter().map(String::as_str))
            .collect::<Vec<_>>()
            .join(" "),
    };
    let mut shown: String = text.chars().take(200).collect();
    if shown.len() < text.len() {
        shown.push('…');
    }
    shown
}

async fn start(
    State(sim): State<Arc<Sim>>,
    Extension(Target(id)): Extension<Target>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if !content_type.starts_with(CONNECT_JSON) {
        return (
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!("Start takes {CONNECT_JSON}, not {content_type:?}"),
        )
            .into_response();
    }
    if body.len() > MAX_START_BYTES {
        return stream_error("resource_exhausted", "the Start request is too large");
    }
    let request: StartRequest = match read_envelope(&body)
        .and_then(|m| serde_json::from_slice(m).map_err(|e| format!("bad StartRequest: {e}")))
    {
        Ok(request) => request,
        Err(message) => return stream_error("invalid_argument", message),
    };
    if sim.exec().mode == ExecMode::Off {
        return stream_error(
            "failed_precondition",
            "execution is off in this simulator; start it with --exec local",
        );
    }
    if request.pty.is_some() {
        return stream_error(
            "unimplemented",
            "this simulator runs commands without a PTY; leave pty unset",
        );
    }
    let config = request.process;
    // An empty cwd is proto3's "unset": the home directory, as envd's default.
    let wanted_cwd = config.cwd.as_deref().filter(|c| !c.trim().is_empty());
    let cwd = match exec::sandbox_path(wanted_cwd.unwrap_or(HOME)) {
        Ok(cwd) => cwd,
        Err(message) => return stream_error("invalid_argument", format!("cwd: {message}")),
    };
    let dir = match sim.exec().workspace(&id) {
        Ok(dir) => dir,
        Err(e) => return stream_error("internal", format!("no scratch directory: {e}")),
    };
    let host_cwd = exec::host_path(&dir, &cwd);
    if !tokio::fs::metadata(&host_cwd)
        .await
        .is_ok_and(|m| m.is_dir())
    {
        return stream_error(
            "invalid_argument",
            format!("cwd '{cwd}' does not exist in the sandbox"),
        );
    }
    // A command under the sandbox's home is the uploaded file, not one of the host's.
    let program = if config.cmd.starts_with(&format!("{HOME}/")) {
        match exec::sandbox_path(&config.cmd) {
            Ok(p) => exec::host_path(&dir, &p).display().to_string(),
            Err(message) => return stream_error("invalid_argument", format!("cmd: {message}")),
        }
    } else {
        config.cmd.clone()
    };
    let home = exec::host_path(&dir, HOME);
    let home_text = home.display().to_string();
    let args = config.args.iter().map(|a| exec::map_home(a, &home_text));
    let mut command = tokio::process::Command::new(&program);
    command
        .args(args)
        .env_clear()
        .env("PATH", BASE_PATH)
        .env("HOME", &home)
        .env("USER", "user")
        .envs(&config.envs)
        .current_dir(&host_cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            return stream_error(
                "internal",
                format!("error starting process '{}': {e}", config.cmd),
            );
        }
    };
    let Some(pid) = child.id() else {
        return stream_error("internal", "the process ended before it had a pid");
    };
    let now = now_ms();
    sim.exec().register(&id, pid, now);
    let still_running = {
        let mut world = sim.world(now);
        world.note(
            &id,
            process_line(
                now,
                "info",
                format!("process {pid} started: {}", shown_command(&config)),
                pid,
            ),
            MAX_NOTES,
        );
        world
            .live(&id)
            .is_ok_and(|s| s.state == SandboxState::Running)
    };
    if !still_running {
        // Paused or killed while the process was being started: it must not outlive that.
        exec::kill_group(pid, "KILL").await;
    }
    let keepalive = headers
        .get("keepalive-ping-interval")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(|secs| Duration::from_secs(secs.max(1)));
    let (tx, rx) = mpsc::channel::<Bytes>(FRAME_QUEUE);
    tokio::spawn(drive(sim, id, pid, child, tx, keepalive));
    let frames = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, Infallible>(b), rx))
    });
    stream_response(Body::from_stream(frames))
}

fn process_line(t_ms: i64, level: &'static str, message: String, pid: u32) -> LogLine {
    LogLine {
        t_ms,
        level,
        message,
        fields: vec![("logger", "process".to_owned()), ("pid", pid.to_string())],
    }
}

/// Reads some bytes, or waits forever once the pipe is gone (so `select!` can skip it).
async fn read_some(pipe: &mut Option<impl AsyncRead + Unpin>, buf: &mut [u8]) -> usize {
    match pipe {
        Some(pipe) => pipe.read(buf).await.unwrap_or(0),
        None => std::future::pending().await,
    }
}

async fn tick(interval: &mut Option<tokio::time::Interval>) {
    match interval {
        Some(interval) => drop(interval.tick().await),
        None => std::future::pending().await,
    }
}

/// Go's wording for how a process ended, as envd reports it: `exit status N` or `signal: killed`.
fn describe(status: ExitStatus) -> (i32, bool, String) {
    match (status.code(), status.signal()) {
        (Some(code), _) => (code, true, format!("exit status {code}")),
        (None, Some(signal)) => {
            let name = match signal {
                1 => "hangup".to_owned(),
                2 => "interrupt".to_owned(),
                9 => "killed".to_owned(),
                15 => "terminated".to_owned(),
                n => format!("signal {n}"),
            };
            (-1, false, format!("signal: {name}"))
        }
        (None, None) => (-1, false, "unknown".to_owned()),
    }
}

/// Streams one process's output until it has exited and both pipes are closed, then its end.
/// Frames a reader no longer wants are dropped; the process runs on regardless.
async fn drive(
    sim: Arc<Sim>,
    id: String,
    pid: u32,
    mut child: tokio::process::Child,
    tx: mpsc::Sender<Bytes>,
    keepalive: Option<Duration>,
) {
    let send = |frame: Bytes| {
        let tx = tx.clone();
        async move {
            let _ = tx.send(frame).await;
        }
    };
    send(event(json!({ "start": { "pid": pid } }))).await;
    let (mut out, mut err) = (child.stdout.take(), child.stderr.take());
    let (mut out_buf, mut err_buf) = (vec![0u8; OUTPUT_CHUNK_BYTES], vec![0u8; OUTPUT_CHUNK_BYTES]);
    let mut interval =
        keepalive.map(|every| tokio::time::interval_at(tokio::time::Instant::now() + every, every));
    let mut status = None;
    while out.is_some() || err.is_some() || status.is_none() {
        tokio::select! {
            n = read_some(&mut out, &mut out_buf) => match n {
                0 => out = None,
                n => send(event(json!({ "data": { "stdout": STANDARD.encode(&out_buf[..n]) } }))).await,
            },
            n = read_some(&mut err, &mut err_buf) => match n {
                0 => err = None,
                n => send(event(json!({ "data": { "stderr": STANDARD.encode(&err_buf[..n]) } }))).await,
            },
            result = child.wait(), if status.is_none() => status = Some(result),
            _ = tick(&mut interval) => send(event(json!({ "keepalive": {} }))).await,
        }
    }
    sim.exec().unregister(&id, pid);
    let mut end = serde_json::Map::new();
    let (message, level) = match status {
        Some(Ok(status)) => {
            let (code, exited, text) = describe(status);
            // proto3 JSON leaves out zero values: no exitCode for 0, no exited for false.
            if code != 0 {
                end.insert("exitCode".into(), json!(code));
            }
            if exited {
                end.insert("exited".into(), json!(true));
            }
            end.insert("status".into(), json!(text));
            let message = match exited {
                true => format!("process {pid} exited with status {code}"),
                false => format!("process {pid} ended: {text}"),
            };
            (message, if code == 0 { "info" } else { "warn" })
        }
        Some(Err(e)) => {
            end.insert("status".into(), json!("unknown"));
            end.insert("error".into(), json!(e.to_string()));
            (format!("process {pid} ended: {e}"), "error")
        }
        None => (format!("process {pid} ended"), "error"),
    };
    send(event(json!({ "end": Value::Object(end) }))).await;
    let now = now_ms();
    sim.world(now)
        .note(&id, process_line(now, level, message, pid), MAX_NOTES);
    send(frame(END_STREAM_FLAG, &json!({}))).await;
}

// ---- process.Process/SendSignal ----

async fn send_signal(
    State(sim): State<Arc<Sim>>,
    Extension(Target(id)): Extension<Target>,
    body: Bytes,
) -> Response {
    let request: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return connect_error("invalid_argument", format!("bad SendSignalRequest: {e}")),
    };
    let Some(pid) = request["process"]["pid"]
        .as_u64()
        .and_then(|p| u32::try_from(p).ok())
    else {
        return connect_error(
            "invalid_argument",
            "SendSignalRequest needs process.pid (tags are not supported here)",
        );
    };
    let signal = match &request["signal"] {
        Value::String(s) if s == "SIGNAL_SIGTERM" => "TERM",
        Value::String(s) if s == "SIGNAL_SIGKILL" => "KILL",
        Value::Number(n) if n.as_u64() == Some(15) => "TERM",
        Value::Number(n) if n.as_u64() == Some(9) => "KILL",
        other => {
            return connect_error(
                "invalid_argument",
                format!("signal {other} is not SIGNAL_SIGTERM or SIGNAL_SIGKILL"),
            );
        }
    };
    let Some(pgid) = sim.exec().group_of(&id, pid) else {
        return connect_error("not_found", format!("process with pid {pid} not found"));
    };
    if !exec::kill_group(pgid, signal).await {
        // It ended between the look-up and the signal: as good as not found.
        return connect_error("not_found", format!("process with pid {pid} not found"));
    }
    Json(json!({})).into_response()
}

// ---- /files ----

/// The request's `path`, canonical, or why it is refused (envd answers that with a 400).
fn file_path(raw: Option<&str>) -> Result<String, String> {
    exec::sandbox_path(raw.ok_or("the path parameter is required")?)
}

async fn download(
    State(sim): State<Arc<Sim>>,
    Extension(Target(id)): Extension<Target>,
    RawQuery(raw): RawQuery,
) -> Response {
    let params = Params::parse(raw.as_deref());
    let path = match file_path(params.get("path")) {
        Ok(path) => path,
        Err(message) => return envd_error(StatusCode::BAD_REQUEST, message),
    };
    let dir = match sim.exec().workspace(&id) {
        Ok(dir) => dir,
        Err(e) => return envd_error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    let host = exec::host_path(&dir, &path);
    match tokio::fs::metadata(&host).await {
        Ok(meta) if meta.is_dir() => {
            return envd_error(
                StatusCode::BAD_REQUEST,
                format!("path '{path}' is a directory"),
            );
        }
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return envd_error(
                StatusCode::NOT_FOUND,
                format!("path '{path}' does not exist"),
            );
        }
        Err(e) => {
            return envd_error(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("error opening file '{path}': {e}"),
            );
        }
    }
    match tokio::fs::read(&host).await {
        Ok(content) => (
            [(header::CONTENT_TYPE, "application/octet-stream")],
            content,
        )
            .into_response(),
        Err(e) => envd_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("error reading file '{path}': {e}"),
        ),
    }
}

async fn upload(
    State(sim): State<Arc<Sim>>,
    Extension(Target(id)): Extension<Target>,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/octet-stream");
    if !content_type.starts_with("application/octet-stream") {
        return envd_error(
            StatusCode::BAD_REQUEST,
            format!(
                "this simulator takes uploads as application/octet-stream with a path parameter, not {content_type}"
            ),
        );
    }
    let params = Params::parse(raw.as_deref());
    let path = match file_path(params.get("path")) {
        Ok(path) => path,
        Err(message) => return envd_error(StatusCode::BAD_REQUEST, message),
    };
    let dir = match sim.exec().workspace(&id) {
        Ok(dir) => dir,
        Err(e) => return envd_error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    let host = exec::host_path(&dir, &path);
    if tokio::fs::metadata(&host).await.is_ok_and(|m| m.is_dir()) {
        return envd_error(
            StatusCode::BAD_REQUEST,
            format!("path '{path}' is a directory"),
        );
    }
    if let Some(parent) = host.parent()
        && let Err(e) = tokio::fs::create_dir_all(parent).await
    {
        return envd_error(
            StatusCode::BAD_REQUEST,
            format!("cannot create the parent directories of '{path}': {e}"),
        );
    }
    if let Err(e) = tokio::fs::write(&host, &body).await {
        return envd_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("error writing file '{path}': {e}"),
        );
    }
    let size = tokio::task::spawn_blocking(move || exec::dir_size(&dir))
        .await
        .unwrap_or(0);
    sim.exec().set_disk_used(&id, size);
    let name = path.rsplit('/').next().unwrap_or_default().to_owned();
    Json(json!([{ "path": path, "name": name, "type": "file" }])).into_response()
}

// ---- live metrics ----

/// Reads `/proc` every second while any sandbox has processes, for their live metrics.
pub(crate) async fn sample_forever(sim: Arc<Sim>) {
    let mut every = tokio::time::interval(SAMPLE_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let targets = sim.exec().sample_targets();
        if targets.is_empty() {
            continue;
        }
        let Ok(measured) = tokio::task::spawn_blocking(move || exec::measure(targets)).await else {
            continue;
        };
        let now = now_ms();
        let cpus: HashMap<String, u32> = {
            let world = sim.world(now);
            measured
                .iter()
                .filter_map(|m| {
                    world
                        .live(&m.sandbox)
                        .ok()
                        .map(|s| (m.sandbox.clone(), s.cpu_count))
                })
                .collect()
        };
        sim.exec()
            .record(measured, now, |id| cpus.get(id).copied().unwrap_or(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_carry_flags_and_a_big_endian_length() {
        let f = frame(END_STREAM_FLAG, &json!({}));
        assert_eq!(&f[..], &[2, 0, 0, 0, 2, b'{', b'}']);
        assert_eq!(read_envelope(&f).unwrap(), b"{}");
        assert!(read_envelope(&f[..6]).is_err());
        assert!(read_envelope(&[1, 0, 0, 0, 0]).is_err());
    }

    #[test]
    fn ends_are_worded_as_go_words_them() {
        assert_eq!(
            describe(ExitStatus::from_raw(3 << 8)),
            (3, true, "exit status 3".to_owned())
        );
        assert_eq!(
            describe(ExitStatus::from_raw(15)),
            (-1, false, "signal: terminated".to_owned())
        );
    }

    #[test]
    fn log_lines_show_the_script_of_a_shell() {
        let config = ProcessConfig {
            cmd: "/bin/bash".into(),
            args: vec!["-l".into(), "-c".into(), "python3 main.py".into()],
            envs: HashMap::new(),
            cwd: None,
        };
        assert_eq!(shown_command(&config), "python3 main.py");
    }
}
