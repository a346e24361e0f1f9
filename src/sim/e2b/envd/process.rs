//! `process.Process` as envd serves it: `Start` and `Connect` (server streams), `List`,
//! `SendInput`, `CloseStdin` and `SendSignal` (unary). `Update` and `StreamInput` are not served
//! and answer `unimplemented` through the router's fallback, as would any method this envd lacks.
//!
//! A started process is driven by its own task, which outlives every stream as envd's processes
//! outlive their callers: it hands each output chunk to the process's current audience (the stream
//! that started it and any that connected since; output nobody reads is dropped, as envd drops
//! it), kills the process when the `Connect-Timeout-Ms` the starter gave runs out (as envd does),
//! and ends with an `end` event worded as Go words it (`exit status 3` / `signal: killed` in both
//! `status` and `error`). Its end is kept for a while, so a late `Connect` still learns it.
//! Without `--exec local`, `Start` ends with `failed_precondition`. Handlers never hold the
//! world's lock across an `.await`.
use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::os::unix::process::ExitStatusExt;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Extension, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use super::super::exec::{
    self, Audience, BASE_PATH, ExecMode, HOME, MAX_NOTES, NewProc, Output, ProcConfig, ProcEnd,
    Selector, SharedAudience, Subscribed,
};
use super::super::model::SandboxState;
use super::super::series::LogLine;
use super::super::{Sim, now_ms};
use super::Target;
use super::rpc::{
    self, Code, Message, RpcError, answer, end_frame, field, frame, stream_request,
    stream_response, unary_request,
};

/// Largest Start request envelope.
const MAX_START_BYTES: usize = 1024 * 1024;
/// Output is read and sent in chunks of at most this many bytes (envd's `stdChunkSize`).
const OUTPUT_CHUNK_BYTES: usize = 32 * 1024;
/// Output chunks queued for a slow reader before the process's task waits for it.
const OUTPUT_QUEUE: usize = 64;
/// The sandbox's user, as envd's `USER` and `LOGNAME`.
const SANDBOX_USER: &str = "user";

fn not_found(selector: &Selector) -> RpcError {
    let message = match selector {
        Selector::Pid(pid) => format!("process with pid {pid} not found"),
        Selector::Tag(tag) => format!("process with tag {tag} not found"),
    };
    RpcError::new(Code::NotFound, message)
}

// ---- process.Process/Start ----

/// The `ProcessConfig` of a Start request, checked.
fn process_config(message: &Value) -> Result<ProcConfig, String> {
    let process = &message["process"];
    let cmd = rpc::string(&process["cmd"]).unwrap_or_default().to_owned();
    if cmd.trim().is_empty() {
        return Err("process.cmd is empty".to_owned());
    }
    let args = match &process["args"] {
        Value::Null => Vec::new(),
        Value::Array(args) => args
            .iter()
            .map(|a| a.as_str().map(str::to_owned))
            .collect::<Option<Vec<_>>>()
            .ok_or("process.args must be strings")?,
        _ => return Err("process.args must be a list".to_owned()),
    };
    let envs = match &process["envs"] {
        Value::Null => BTreeMap::new(),
        Value::Object(envs) => envs
            .iter()
            .map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_owned())))
            .collect::<Option<BTreeMap<_, _>>>()
            .ok_or("process.envs values must be strings")?,
        _ => return Err("process.envs must be a map".to_owned()),
    };
    let cwd = rpc::string(&process["cwd"]).map(str::to_owned);
    Ok(ProcConfig {
        cmd,
        args,
        envs,
        cwd,
    })
}

/// What a log line shows of a command: the script of `sh -c script`, else the command line.
fn shown_command(config: &ProcConfig) -> String {
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

/// The variables the sandbox was created with (`envVars`), which every process sees under the
/// ones its own request sets, as envd's `/init` makes them.
pub(super) fn sandbox_env(sim: &Sim, id: &str) -> BTreeMap<String, String> {
    sim.world(now_ms())
        .live(id)
        .map(|s| s.env_vars.clone())
        .unwrap_or_default()
}

pub(super) async fn start(
    State(sim): State<Arc<Sim>>,
    Extension(Target(id)): Extension<Target>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if body.len() > MAX_START_BYTES {
        return RpcError::new(Code::ResourceExhausted, "the Start request is too large")
            .into_stream();
    }
    let request = match stream_request(&headers, &body, "process.StartRequest") {
        Ok(request) => request,
        Err(unreadable) => return unreadable.into_response(),
    };
    let deadline = connect_timeout(&headers).map(|t| tokio::time::Instant::now() + t);
    match spawn(&sim, &id, &request, deadline).await {
        Ok((pid, rx)) => output_stream(pid, Some(rx), super::keepalive(&headers), VecDeque::new()),
        Err(error) => error.into_stream(),
    }
}

/// Starts the request's process and its driving task; the receiver reads its output.
async fn spawn(
    sim: &Arc<Sim>,
    id: &str,
    request: &Value,
    deadline: Option<tokio::time::Instant>,
) -> Result<(u32, mpsc::Receiver<Output>), RpcError> {
    let invalid = |message: String| RpcError::new(Code::InvalidArgument, message);
    let config = process_config(request).map_err(invalid)?;
    if sim.exec().mode == ExecMode::Off {
        return Err(RpcError::new(
            Code::FailedPrecondition,
            "execution is off in this simulator; start it with --exec local",
        ));
    }
    if !request["pty"].is_null() {
        return Err(RpcError::new(
            Code::Unimplemented,
            "this simulator runs commands without a PTY; leave pty unset",
        ));
    }
    let tag = rpc::string(&request["tag"]).map(str::to_owned);
    // `stdin` is optional for older SDKs, and envd gives a process a stdin pipe unless told not to.
    let wants_stdin = request["stdin"].as_bool().unwrap_or(true);
    let dir = sim
        .exec()
        .workspace(id)
        .map_err(|e| RpcError::new(Code::Internal, format!("no scratch directory: {e}")))?;
    // An empty cwd is proto3's "unset": the home directory, as envd's default.
    let wanted_cwd = config.cwd.as_deref().filter(|c| !c.trim().is_empty());
    let cwd =
        exec::sandbox_path(wanted_cwd.unwrap_or(HOME)).map_err(|m| invalid(format!("cwd: {m}")))?;
    let host_cwd = exec::resolve(&dir, &cwd, true)
        .map_err(|e| invalid(format!("cwd '{cwd}': {e}")))?
        .host;
    if !tokio::fs::metadata(&host_cwd)
        .await
        .is_ok_and(|m| m.is_dir())
    {
        return Err(invalid(format!("cwd '{cwd}' does not exist")));
    }
    // A command under the sandbox's home is the uploaded file, not one of the host's.
    let program = if config.cmd.starts_with(&format!("{HOME}/")) {
        let path = exec::sandbox_path(&config.cmd).map_err(|m| invalid(format!("cmd: {m}")))?;
        exec::resolve(&dir, &path, true)
            .map_err(|e| invalid(format!("cmd '{path}': {e}")))?
            .host
            .display()
            .to_string()
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
        .env("USER", SANDBOX_USER)
        .env("LOGNAME", SANDBOX_USER)
        .envs(sandbox_env(sim, id))
        .envs(&config.envs)
        .current_dir(&host_cwd)
        .stdin(if wants_stdin {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = command.spawn().map_err(|e| {
        let line = std::iter::once(config.cmd.as_str())
            .chain(config.args.iter().map(String::as_str))
            .collect::<Vec<_>>()
            .join(" ");
        invalid(format!("error starting process '{line}': {e}"))
    })?;
    let Some(pid) = child.id() else {
        return Err(RpcError::new(
            Code::Internal,
            "the process ended before it had a pid",
        ));
    };
    let stdin = child
        .stdin
        .take()
        .map(|pipe| Arc::new(tokio::sync::Mutex::new(Some(pipe))));
    let (tx, rx) = mpsc::channel::<Output>(OUTPUT_QUEUE);
    let audience: SharedAudience = Arc::new(Mutex::new(Audience::default()));
    exec::add_reader(&audience, tx);
    let shown = shown_command(&config);
    let now = now_ms();
    sim.exec().register(
        id,
        pid,
        NewProc {
            config,
            tag,
            stdin,
            audience: audience.clone(),
        },
        now,
    );
    let still_running = {
        let mut world = sim.world(now);
        world.note(
            id,
            process_line(now, "info", format!("process {pid} started: {shown}"), pid),
            MAX_NOTES,
        );
        world
            .live(id)
            .is_ok_and(|s| s.state == SandboxState::Running)
    };
    if !still_running {
        // Paused or killed while the process was being started: it must not outlive that.
        exec::kill_group(pid, "KILL").await;
    }
    tokio::spawn(drive(
        sim.clone(),
        id.to_owned(),
        pid,
        child,
        audience,
        deadline,
    ));
    Ok((pid, rx))
}

/// The deadline a caller gave its call in `Connect-Timeout-Ms`; `0` or none is no deadline.
fn connect_timeout(headers: &HeaderMap) -> Option<Duration> {
    headers
        .get("connect-timeout-ms")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|ms| *ms > 0)
        .map(Duration::from_millis)
}

fn event(event: Message) -> Bytes {
    frame(0, &Message::new().message("event", event).done())
}

fn start_event(pid: u32) -> Bytes {
    event(Message::new().message("start", Message::new().uint32("pid", pid)))
}

fn end_event(end: &ProcEnd) -> Bytes {
    let written = Message::new()
        .sint32("exitCode", end.exit_code)
        .boolean("exited", end.exited)
        .string("status", &end.status)
        .optional("error", end.error.as_deref());
    event(Message::new().message("end", written))
}

fn data_event(stream: &str, chunk: &[u8]) -> Bytes {
    event(Message::new().message(
        "data",
        Message::new().value(stream, json!(STANDARD.encode(chunk))),
    ))
}

/// A process's events as a Connect stream: its start, then what `rx` brings (output, its end),
/// keepalives in between at the reader's interval, and the end-of-stream frame.
fn output_stream(
    pid: u32,
    rx: Option<mpsc::Receiver<Output>>,
    keepalive: Option<Duration>,
    then: VecDeque<Bytes>,
) -> Response {
    let mut queued = VecDeque::from([start_event(pid)]);
    queued.extend(then);
    let interval =
        keepalive.map(|every| tokio::time::interval_at(tokio::time::Instant::now() + every, every));
    let frames = futures::stream::unfold(
        (queued, rx, interval),
        |(mut queued, mut rx, mut interval)| async move {
            loop {
                if let Some(next) = queued.pop_front() {
                    return Some((Ok::<_, Infallible>(next), (queued, rx, interval)));
                }
                let receiving = rx.as_mut()?;
                tokio::select! {
                    output = receiving.recv() => match output {
                        Some(Output::Stdout(chunk)) => queued.push_back(data_event("stdout", &chunk)),
                        Some(Output::Stderr(chunk)) => queued.push_back(data_event("stderr", &chunk)),
                        Some(Output::End(end)) => {
                            queued.push_back(end_event(&end));
                            queued.push_back(end_frame(None));
                            rx = None;
                        }
                        None => {
                            queued.push_back(end_frame(Some(&RpcError::new(
                                Code::Unknown,
                                "the process's output stopped before its end event",
                            ))));
                            rx = None;
                        }
                    },
                    _ = super::tick(&mut interval) => queued.push_back(event(Message::new().message("keepalive", Message::new()))),
                }
                // envd restarts the keepalive period after each message it sends.
                if let Some(interval) = interval.as_mut() {
                    interval.reset();
                }
            }
        },
    );
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

/// Go's wording for how a process ended, as envd reports it: `ExitCode()`, `Exited()` and
/// `ProcessState.String()` (`exit status N`, `signal: killed`); the same words are `Wait`'s error
/// whenever the process did not exit with 0.
fn describe(status: ExitStatus) -> ProcEnd {
    let (exit_code, exited, text) = match (status.code(), status.signal()) {
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
    };
    let error = (!status.success()).then(|| text.clone());
    ProcEnd {
        exit_code,
        exited,
        status: text,
        error,
    }
}

/// Hands `output` to every reader of the process, forgetting those that went away.
async fn broadcast(audience: &SharedAudience, output: Output) {
    for reader in exec::readers(audience) {
        if reader.send(output.clone()).await.is_err() {
            exec::drop_reader(audience, &reader);
        }
    }
}

/// Runs one process until it has exited and both pipes are closed, then tells its readers how it
/// ended. Output nobody reads is dropped; the process runs on regardless of its readers.
async fn drive(
    sim: Arc<Sim>,
    id: String,
    pid: u32,
    mut child: tokio::process::Child,
    audience: SharedAudience,
    deadline: Option<tokio::time::Instant>,
) {
    let (mut out, mut err) = (child.stdout.take(), child.stderr.take());
    let (mut out_buf, mut err_buf) = (vec![0u8; OUTPUT_CHUNK_BYTES], vec![0u8; OUTPUT_CHUNK_BYTES]);
    let mut status = None;
    let mut timed_out = false;
    while out.is_some() || err.is_some() || status.is_none() {
        tokio::select! {
            n = read_some(&mut out, &mut out_buf) => match n {
                0 => out = None,
                n => broadcast(&audience, Output::Stdout(out_buf[..n].to_vec())).await,
            },
            n = read_some(&mut err, &mut err_buf) => match n {
                0 => err = None,
                n => broadcast(&audience, Output::Stderr(err_buf[..n].to_vec())).await,
            },
            result = child.wait(), if status.is_none() => status = Some(result),
            _ = sleep_until(deadline), if !timed_out => {
                // envd starts the process under the request's deadline and kills it at the end.
                timed_out = true;
                exec::kill_group(pid, "KILL").await;
            }
        }
    }
    let (end, message, level) = match status {
        Some(Ok(status)) => {
            let end = describe(status);
            let message = match end.exited {
                true => format!("process {pid} exited with status {}", end.exit_code),
                false => format!("process {pid} ended: {}", end.status),
            };
            let level = if end.exit_code == 0 { "info" } else { "warn" };
            (end, message, level)
        }
        Some(Err(e)) => (
            ProcEnd {
                exit_code: -1,
                exited: false,
                status: "unknown".to_owned(),
                error: Some(e.to_string()),
            },
            format!("process {pid} ended: {e}"),
            "error",
        ),
        None => (
            ProcEnd {
                exit_code: -1,
                exited: false,
                status: "unknown".to_owned(),
                error: Some("the process could not be waited for".to_owned()),
            },
            format!("process {pid} ended"),
            "error",
        ),
    };
    let now = now_ms();
    let readers = sim.exec().finish(&id, pid, &audience, end.clone(), now);
    for reader in readers {
        let _ = reader.send(Output::End(end.clone())).await;
    }
    sim.world(now)
        .note(&id, process_line(now, level, message, pid), MAX_NOTES);
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

// ---- process.Process/Connect ----

pub(super) async fn connect(
    State(sim): State<Arc<Sim>>,
    Extension(Target(id)): Extension<Target>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let request = match stream_request(&headers, &body, "process.ConnectRequest") {
        Ok(request) => request,
        Err(unreadable) => return unreadable.into_response(),
    };
    let selector = match rpc::selector(&request) {
        Ok(selector) => selector,
        Err(error) => return error.into_stream(),
    };
    let (tx, rx) = mpsc::channel::<Output>(OUTPUT_QUEUE);
    match sim.exec().subscribe(&id, &selector, tx, now_ms()) {
        Subscribed::Live { pid } => {
            output_stream(pid, Some(rx), super::keepalive(&headers), VecDeque::new())
        }
        Subscribed::Ended { pid, end } => output_stream(
            pid,
            None,
            None,
            VecDeque::from([end_event(&end), end_frame(None)]),
        ),
        Subscribed::NotFound => not_found(&selector).into_stream(),
    }
}

// ---- process.Process/List ----

pub(super) async fn list(
    State(sim): State<Arc<Sim>>,
    Extension(Target(id)): Extension<Target>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Err(unreadable) = unary_request(&headers, &body, "process.ListRequest") {
        return unreadable.into_response();
    }
    let processes: Vec<Value> = sim
        .exec()
        .processes(&id)
        .into_iter()
        .map(|p| {
            let config = Message::new()
                .string("cmd", &p.config.cmd)
                .value("args", json!(p.config.args))
                .value("envs", json!(p.config.envs))
                .optional("cwd", p.config.cwd.as_deref());
            Message::new()
                .message("config", config)
                .uint32("pid", p.pid)
                .optional("tag", p.tag.as_deref())
                .done()
        })
        .collect();
    answer(Message::new().value("processes", json!(processes)).done())
}

// ---- process.Process/SendInput and CloseStdin ----

pub(super) async fn send_input(
    State(sim): State<Arc<Sim>>,
    Extension(Target(id)): Extension<Target>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let request = match unary_request(&headers, &body, "process.SendInputRequest") {
        Ok(request) => request,
        Err(unreadable) => return unreadable.into_response(),
    };
    match write_input(&sim, &id, &request).await {
        Ok(()) => answer(json!({})),
        Err(error) => error.into_response(),
    }
}

async fn write_input(sim: &Sim, id: &str, request: &Value) -> Result<(), RpcError> {
    let selector = rpc::selector(request)?;
    let (pid, _, stdin) = sim
        .exec()
        .process(id, &selector)
        .ok_or_else(|| not_found(&selector))?;
    let input = field(request, "input", "input");
    if !input["pty"].is_null() {
        return Err(RpcError::new(
            Code::Internal,
            "error writing to tty: tty not assigned to process — input should be written to the stdin, not the tty",
        ));
    }
    if input["stdin"].is_null() {
        return Err(RpcError::new(
            Code::Unimplemented,
            "invalid input type <nil>: give input.stdin",
        ));
    }
    let data = rpc::bytes(&input["stdin"]).map_err(|m| RpcError::new(Code::InvalidArgument, m))?;
    let closed = || {
        RpcError::new(
            Code::Internal,
            "error writing to stdin: stdin not enabled or closed",
        )
    };
    let stdin = stdin.ok_or_else(closed)?;
    let mut pipe = stdin.lock().await;
    let pipe = pipe.as_mut().ok_or_else(closed)?;
    let written = match pipe.write_all(&data).await {
        Ok(()) => pipe.flush().await,
        Err(e) => Err(e),
    };
    written.map_err(|e| {
        RpcError::new(
            Code::Internal,
            format!("error writing to stdin: error writing to stdin of process '{pid}': {e}"),
        )
    })
}

pub(super) async fn close_stdin(
    State(sim): State<Arc<Sim>>,
    Extension(Target(id)): Extension<Target>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let request = match unary_request(&headers, &body, "process.CloseStdinRequest") {
        Ok(request) => request,
        Err(unreadable) => return unreadable.into_response(),
    };
    let selector = match rpc::selector(&request) {
        Ok(selector) => selector,
        Err(error) => return error.into_response(),
    };
    let Some((_, _, stdin)) = sim.exec().process(&id, &selector) else {
        return not_found(&selector).into_response();
    };
    // Dropping the pipe closes it: the process reads end-of-file. Closing twice is no error.
    if let Some(stdin) = stdin {
        stdin.lock().await.take();
    }
    answer(json!({}))
}

// ---- process.Process/SendSignal ----

pub(super) async fn send_signal(
    State(sim): State<Arc<Sim>>,
    Extension(Target(id)): Extension<Target>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let request = match unary_request(&headers, &body, "process.SendSignalRequest") {
        Ok(request) => request,
        Err(unreadable) => return unreadable.into_response(),
    };
    let selector = match rpc::selector(&request) {
        Ok(selector) => selector,
        Err(error) => return error.into_response(),
    };
    let Some((_, pgid, _)) = sim.exec().process(&id, &selector) else {
        return not_found(&selector).into_response();
    };
    let signal = match &request["signal"] {
        Value::String(s) if s == "SIGNAL_SIGTERM" => "TERM",
        Value::String(s) if s == "SIGNAL_SIGKILL" => "KILL",
        Value::Number(n) if n.as_u64() == Some(15) => "TERM",
        Value::Number(n) if n.as_u64() == Some(9) => "KILL",
        other => {
            let name = other
                .as_str()
                .map_or_else(|| other.to_string(), str::to_owned);
            let name = if other.is_null() {
                "SIGNAL_UNSPECIFIED".to_owned()
            } else {
                name
            };
            return RpcError::new(Code::Unimplemented, format!("invalid signal: {name}"))
                .into_response();
        }
    };
    if !exec::kill_group(pgid, signal).await {
        // It ended between the look-up and the signal: as good as not found.
        return not_found(&selector).into_response();
    }
    answer(json!({}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ends_are_worded_as_go_words_them() {
        assert_eq!(
            describe(ExitStatus::from_raw(3 << 8)),
            ProcEnd {
                exit_code: 3,
                exited: true,
                status: "exit status 3".into(),
                error: Some("exit status 3".into())
            }
        );
        assert_eq!(describe(ExitStatus::from_raw(0)).error, None);
        let killed = describe(ExitStatus::from_raw(9));
        assert_eq!((killed.exit_code, killed.exited), (-1, false));
        assert_eq!(killed.error.as_deref(), Some("signal: killed"));
    }

    #[test]
    fn log_lines_show_the_script_of_a_shell() {
        let config = ProcConfig {
            cmd: "/bin/bash".into(),
            args: vec!["-l".into(), "-c".into(), "python3 main.py".into()],
            envs: BTreeMap::new(),
            cwd: None,
        };
        assert_eq!(shown_command(&config), "python3 main.py");
    }

    #[test]
    fn an_end_event_writes_zero_values_as_proto3_json_leaves_them_out() {
        let frame = end_event(&ProcEnd {
            exit_code: 0,
            exited: true,
            status: "exit status 0".into(),
            error: None,
        });
        assert_eq!(
            rpc::read_envelope(&frame).unwrap(),
            br#"{"event":{"end":{"exited":true,"status":"exit status 0"}}}"#
        );
        assert_eq!(frame[0], 0);
    }
}
