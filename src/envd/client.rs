//! `EnvdClient`: one sandbox's envd, addressed the way E2B's SDKs do it.
//!
//! With `E2B_SANDBOX_URL` set, every call goes to that base URL with `E2b-Sandbox-Id` and
//! `E2b-Sandbox-Port` headers; otherwise to `https://49983-{sandboxID}.{domain}`. Process calls are
//! Connect RPCs with the JSON codec, as the SDKs make them: `Start` and `Connect` (re-attach to a
//! running process by pid) stream envelope frames (decoded by `connect`), and `SendSignal` is a
//! unary call with a plain JSON body. Files go through envd's `/files` endpoint, in the encoding
//! the sandbox's envd version reads (the SDKs' rule: `application/octet-stream` from 0.5.7 on,
//! `multipart/form-data` before). The access token travels only in a header marked sensitive and
//! is redacted from `Debug`.
use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use base64::Engine;
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderValue};
use reqwest::{Response, StatusCode};
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};

use super::connect::{self, Decoder, Frame};
use super::error::{EnvdError, snippet};
use super::version::EnvdVersion;
use crate::ids::SandboxId;

/// The port envd listens on inside every sandbox.
pub const ENVD_PORT: u16 = 49983;
/// E2B's domain when the create response names none.
pub const DEFAULT_DOMAIN: &str = "e2b.app";
/// The environment variable that routes envd traffic through one proxy URL.
pub const SANDBOX_URL_ENV: &str = "E2B_SANDBOX_URL";
/// How often envd should send keepalive events on a stream; the SDKs ask for 50 s.
pub const KEEPALIVE_PING_INTERVAL_SECS: u64 = 50;
/// Largest file [`EnvdClient::download`] holds in memory.
pub const MAX_DOWNLOAD_BYTES: usize = 64 * 1024 * 1024;
/// Largest unary answer read (SendSignal answers `{}`, upload a short list).
const MAX_UNARY_BYTES: usize = 1024 * 1024;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Unary calls and file transfers end; streams do not get a total timeout, keepalives show life.
const UNARY_TIMEOUT: Duration = Duration::from_secs(60);

/// Where one sandbox's envd is reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvdAddress {
    /// `https://49983-{sandboxID}.{domain}`.
    Direct { base_url: String },
    /// One proxy URL for every sandbox, told which one by headers.
    Proxied { base_url: String },
}

impl EnvdAddress {
    /// The SDKs' rule: `E2B_SANDBOX_URL` when set, the per-sandbox host otherwise.
    pub fn from_env(sandbox_id: &SandboxId, domain: Option<&str>) -> Self {
        let proxy = std::env::var(SANDBOX_URL_ENV).ok();
        Self::resolve(proxy.as_deref(), sandbox_id, domain)
    }

    /// [`from_env`](Self::from_env) with the variable's value passed in, so tests need not set it.
    pub fn resolve(
        sandbox_url: Option<&str>,
        sandbox_id: &SandboxId,
        domain: Option<&str>,
    ) -> Self {
        match sandbox_url.map(str::trim).filter(|u| !u.is_empty()) {
            Some(url) => EnvdAddress::Proxied {
                base_url: url.trim_end_matches('/').to_owned(),
            },
            None => {
                let domain = domain
                    .map(str::trim)
                    .filter(|d| !d.is_empty())
                    .unwrap_or(DEFAULT_DOMAIN);
                EnvdAddress::Direct {
                    base_url: format!("https://{ENVD_PORT}-{sandbox_id}.{domain}"),
                }
            }
        }
    }

    fn base_url(&self) -> &str {
        match self {
            EnvdAddress::Direct { base_url } | EnvdAddress::Proxied { base_url } => base_url,
        }
    }
}

/// The client for one sandbox's envd. Cheap to clone.
#[derive(Clone)]
pub struct EnvdClient {
    http: reqwest::Client,
    sandbox_id: SandboxId,
    address: EnvdAddress,
    access_token: Option<SecretString>,
    version: EnvdVersion,
    max_frame_bytes: usize,
}

/// Written by hand so the token can never appear, whatever fields are added later.
impl fmt::Debug for EnvdClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EnvdClient")
            .field("sandbox_id", &self.sandbox_id)
            .field("address", &self.address)
            .field(
                "access_token",
                &self.access_token.as_ref().map(|_| "[redacted]"),
            )
            .field("version", &self.version)
            .field("max_frame_bytes", &self.max_frame_bytes)
            .finish()
    }
}

/// A process to start: the command, its arguments, environment and working directory.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ProcessSpec {
    pub cmd: String,
    pub args: Vec<String>,
    pub envs: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
}

impl ProcessSpec {
    /// `/bin/bash -l -c <command>`, as the SDKs run a command line.
    pub fn shell(command: impl Into<String>) -> Self {
        Self {
            cmd: "/bin/bash".to_owned(),
            args: vec!["-l".to_owned(), "-c".to_owned(), command.into()],
            ..Self::default()
        }
    }
}

/// What happens to a running process, in order: start, output, end; keepalives in between.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProcessEvent {
    Start { pid: u32 },
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    Pty(Vec<u8>),
    End(ProcessEnd),
    Keepalive,
}

/// How a process ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessEnd {
    /// proto3 JSON omits zero, so a missing code is 0.
    pub exit_code: i32,
    pub exited: bool,
    pub status: String,
    pub error: Option<String>,
}

/// The signals envd can send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    Term,
    Kill,
}

impl Signal {
    fn wire_name(self) -> &'static str {
        match self {
            Signal::Term => "SIGNAL_SIGTERM",
            Signal::Kill => "SIGNAL_SIGKILL",
        }
    }
}

/// One entry envd reports after an upload.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct FileEntry {
    pub path: String,
    pub name: String,
    #[serde(rename = "type", default)]
    pub kind: String,
}

// Wire shapes, private to this file.
#[derive(Serialize)]
struct StartRequest<'a> {
    process: &'a ProcessSpec,
    stdin: bool,
}

#[derive(Serialize)]
struct ConnectRequest {
    process: PidSelector,
}

#[derive(Serialize)]
struct PidSelector {
    pid: u32,
}

#[derive(Deserialize)]
struct StartResponse {
    #[serde(default)]
    event: Option<WireEvent>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireEvent {
    start: Option<WireStart>,
    data: Option<WireData>,
    end: Option<WireEnd>,
    keepalive: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct WireStart {
    #[serde(default)]
    pid: u32,
}

#[derive(Deserialize)]
struct WireData {
    stdout: Option<String>,
    stderr: Option<String>,
    pty: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireEnd {
    #[serde(default)]
    exit_code: i32,
    #[serde(default)]
    exited: bool,
    #[serde(default)]
    status: String,
    #[serde(default)]
    error: Option<String>,
}

#[derive(Deserialize)]
struct UnaryError {
    #[serde(default)]
    code: String,
    #[serde(default)]
    message: String,
}

const START: &str = "process.Process/Start";
const CONNECT: &str = "process.Process/Connect";
const SEND_SIGNAL: &str = "process.Process/SendSignal";
const UPLOAD: &str = "files upload";
const DOWNLOAD: &str = "files download";

/// A call's `call` label in `steward_envd_requests_total` (`other` for a call added without one).
fn call_label(call: &'static str) -> &'static str {
    match call {
        START => "process_start",
        CONNECT => "process_connect",
        SEND_SIGNAL => "send_signal",
        UPLOAD => "upload",
        DOWNLOAD => "download",
        _ => "other",
    }
}

/// Sends `request` for `call`, counting it (status, or `transport` when no answer came) with the
/// time until the answer's head.
async fn send_counted(
    call: &'static str,
    request: reqwest::RequestBuilder,
) -> Result<Response, EnvdError> {
    let started = std::time::Instant::now();
    let sent = request.send().await;
    let status = sent.as_ref().ok().map(|r| r.status().as_u16());
    crate::metrics::envd_request(
        call_label(call),
        crate::metrics::e2b_status(status, false),
        started.elapsed(),
    );
    sent.map_err(|source| EnvdError::Transport { call, source })
}

impl EnvdClient {
    /// A client for `sandbox_id` at `address`; `access_token` is the create (or connect)
    /// answer's `envdAccessToken`, sent as `X-Access-Token` when present, and `version` its
    /// `envdVersion`, which decides how files are uploaded.
    pub fn new(
        sandbox_id: SandboxId,
        address: EnvdAddress,
        access_token: Option<SecretString>,
        version: EnvdVersion,
    ) -> Result<Self, EnvdError> {
        let parsed = url::Url::parse(address.base_url())
            .map_err(|e| EnvdError::Address(format!("{}: {e}", address.base_url())))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(EnvdError::Address(format!(
                "{} is not an http(s) URL",
                address.base_url()
            )));
        }
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .build()
            .map_err(|source| EnvdError::Transport {
                call: "client setup",
                source,
            })?;
        Ok(Self {
            http,
            sandbox_id,
            address,
            access_token,
            version,
            max_frame_bytes: connect::DEFAULT_MAX_FRAME_BYTES,
        })
    }

    /// The envd version this client speaks to.
    pub fn version(&self) -> EnvdVersion {
        self.version
    }

    /// Lowers the cap on one stream frame (tests use it to force the refusal).
    pub fn with_max_frame_bytes(mut self, max_frame_bytes: usize) -> Self {
        self.max_frame_bytes = max_frame_bytes;
        self
    }

    pub fn sandbox_id(&self) -> &SandboxId {
        &self.sandbox_id
    }

    /// Headers every call carries: routing for the proxy, and the access token.
    fn headers(&self) -> Result<HeaderMap, EnvdError> {
        let mut headers = HeaderMap::new();
        if let EnvdAddress::Proxied { .. } = self.address {
            let id = HeaderValue::from_str(self.sandbox_id.as_str())
                .map_err(|e| EnvdError::Address(format!("sandbox id header: {e}")))?;
            headers.insert("E2b-Sandbox-Id", id);
            headers.insert("E2b-Sandbox-Port", HeaderValue::from(ENVD_PORT));
        }
        if let Some(token) = &self.access_token {
            let mut value = HeaderValue::from_str(token.expose_secret()).map_err(|_| {
                // The value is deliberately not quoted: it is the secret.
                EnvdError::Address("the envd access token is not a valid header value".to_owned())
            })?;
            value.set_sensitive(true);
            headers.insert("X-Access-Token", value);
        }
        Ok(headers)
    }

    fn url(&self, path: &str) -> String {
        format!("{}/{path}", self.address.base_url())
    }

    /// Starts `spec` and returns its event stream; the first event is normally `Start { pid }`.
    #[tracing::instrument(skip(self, spec), fields(sandbox_id = %self.sandbox_id, cmd = %spec.cmd))]
    pub async fn start(&self, spec: &ProcessSpec) -> Result<ProcessStream, EnvdError> {
        let message = StartRequest {
            process: spec,
            stdin: false,
        };
        self.open_stream(START, &message).await
    }

    /// Re-attaches to process `pid`, started earlier (by this replica or another), as the SDKs'
    /// `commands.connect` does: the stream opens with `Start { pid }`, then carries the output
    /// the process writes from now on (what it wrote while nobody was attached is not replayed,
    /// as envd keeps none) and its `End`. A process that ended lately (envd keeps ends for about
    /// 30 s) answers with its start and end alone; an unknown pid ends the stream with
    /// [`EnvdError::Rpc`] `not_found`.
    #[tracing::instrument(skip(self), fields(sandbox_id = %self.sandbox_id))]
    pub async fn connect(&self, pid: u32) -> Result<ProcessStream, EnvdError> {
        let message = ConnectRequest {
            process: PidSelector { pid },
        };
        self.open_stream(CONNECT, &message).await
    }

    /// Opens the server stream `call` with its one request `message`.
    async fn open_stream(
        &self,
        call: &'static str,
        message: &impl Serialize,
    ) -> Result<ProcessStream, EnvdError> {
        let message = serde_json::to_vec(message).map_err(|e| EnvdError::Decode {
            call,
            reason: e.to_string(),
        })?;
        let request = self
            .http
            .post(self.url(call))
            .headers(self.headers()?)
            .header(CONTENT_TYPE, "application/connect+json")
            .header("Connect-Protocol-Version", "1")
            .header("Keepalive-Ping-Interval", KEEPALIVE_PING_INTERVAL_SECS)
            .body(connect::encode(0, &message));
        let response = send_counted(call, request).await?;
        let response = self.check_status(call, response).await?;
        Ok(ProcessStream {
            call,
            response,
            decoder: Decoder::new(self.max_frame_bytes),
            done: false,
        })
    }

    /// Sends `signal` to process `pid` (SIGTERM to ask, SIGKILL to stop a run for good).
    #[tracing::instrument(skip(self), fields(sandbox_id = %self.sandbox_id))]
    pub async fn send_signal(&self, pid: u32, signal: Signal) -> Result<(), EnvdError> {
        let body = serde_json::json!({
            "process": { "pid": pid },
            "signal": signal.wire_name(),
        });
        let request = self
            .http
            .post(self.url(SEND_SIGNAL))
            .headers(self.headers()?)
            .header("Connect-Protocol-Version", "1")
            .timeout(UNARY_TIMEOUT)
            .json(&body);
        let response = send_counted(SEND_SIGNAL, request).await?;
        let response = self.check_status(SEND_SIGNAL, response).await?;
        read_capped(SEND_SIGNAL, response, MAX_UNARY_BYTES).await?;
        Ok(())
    }

    /// Writes `content` to `path` in the sandbox (parents created, an existing file replaced),
    /// in the encoding the sandbox's envd reads: the raw bytes from envd 0.5.7 on, else one
    /// `multipart/form-data` part named `file` whose filename is the path (both as the SDKs send
    /// them; the `path` parameter goes along either way).
    #[tracing::instrument(skip(self, content), fields(sandbox_id = %self.sandbox_id, bytes = content.len()))]
    pub async fn upload(&self, path: &str, content: Vec<u8>) -> Result<Vec<FileEntry>, EnvdError> {
        let (content_type, body) = if self.version.takes_octet_stream() {
            ("application/octet-stream".to_owned(), content)
        } else {
            multipart_body(path, &content)
        };
        let request = self
            .http
            .post(self.url("files"))
            .query(&[("path", path)])
            .headers(self.headers()?)
            .header(CONTENT_TYPE, content_type)
            .timeout(UNARY_TIMEOUT)
            .body(body);
        let response = send_counted(UPLOAD, request).await?;
        let response = self.check_status(UPLOAD, response).await?;
        let body = read_capped(UPLOAD, response, MAX_UNARY_BYTES).await?;
        serde_json::from_slice(&body).map_err(|e| EnvdError::Decode {
            call: UPLOAD,
            reason: e.to_string(),
        })
    }

    /// Reads the file at `path`, refusing one larger than [`MAX_DOWNLOAD_BYTES`].
    #[tracing::instrument(skip(self), fields(sandbox_id = %self.sandbox_id))]
    pub async fn download(&self, path: &str) -> Result<Vec<u8>, EnvdError> {
        let request = self
            .http
            .get(self.url("files"))
            .query(&[("path", path)])
            .headers(self.headers()?)
            .timeout(UNARY_TIMEOUT);
        let response = send_counted(DOWNLOAD, request).await?;
        let response = self.check_status(DOWNLOAD, response).await?;
        read_capped(DOWNLOAD, response, MAX_DOWNLOAD_BYTES).await
    }

    /// Turns a non-success answer into the matching error; passes a success through.
    async fn check_status(
        &self,
        call: &'static str,
        response: Response,
    ) -> Result<Response, EnvdError> {
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        if status == StatusCode::BAD_GATEWAY {
            return Err(EnvdError::SandboxUnavailable {
                sandbox_id: self.sandbox_id.clone(),
            });
        }
        if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
            return Err(EnvdError::AccessDenied {
                sandbox_id: self.sandbox_id.clone(),
                call,
                status: status.as_u16(),
            });
        }
        let body = read_capped(call, response, MAX_UNARY_BYTES)
            .await
            .unwrap_or_default();
        // Connect unary errors are `{code, message}`; anything else is shown as its first words.
        if let Ok(error) = serde_json::from_slice::<UnaryError>(&body)
            && !error.code.is_empty()
        {
            return Err(EnvdError::Rpc {
                call,
                code: error.code,
                message: snippet(error.message.as_bytes()),
            });
        }
        Err(EnvdError::Status {
            call,
            status: status.as_u16(),
            message: snippet(&body),
        })
    }
}

/// One file as a `multipart/form-data` body, as httpx builds the SDKs' upload: a part named `file`
/// whose filename is the sandbox path. The boundary is random and checked against the content;
/// the filename is quoted as Go's `mime` package reads it, with control characters (which could
/// end the header line) replaced, since the `path` parameter is what envd writes to.
fn multipart_body(path: &str, content: &[u8]) -> (String, Vec<u8>) {
    let boundary = loop {
        let candidate = format!("steward{}", uuid::Uuid::new_v4().simple());
        if memchr::memmem::find(content, candidate.as_bytes()).is_none() {
            break candidate;
        }
    };
    let filename: String = path
        .chars()
        .map(|c| if c.is_control() { '_' } else { c })
        .flat_map(|c| match c {
            '"' | '\\' => vec!['\\', c],
            c => vec![c],
        })
        .collect();
    let mut body = Vec::with_capacity(content.len() + 256);
    body.extend_from_slice(
        format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{filename}\"\r\nContent-Type: application/octet-stream\r\n\r\n"
        )
        .as_bytes(),
    );
    body.extend_from_slice(content);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    (format!("multipart/form-data; boundary={boundary}"), body)
}

/// Reads a whole body, refusing to hold more than `cap` bytes.
async fn read_capped(
    call: &'static str,
    mut response: Response,
    cap: usize,
) -> Result<Vec<u8>, EnvdError> {
    // A declared length over the cap is refused before any of the body is read.
    if response
        .content_length()
        .is_some_and(|length| length > cap as u64)
    {
        return Err(EnvdError::TooLarge { call, cap });
    }
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|source| EnvdError::Transport { call, source })?
    {
        if body.len() + chunk.len() > cap {
            return Err(EnvdError::TooLarge { call, cap });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// The events of one started (or re-attached) process, read as they arrive.
#[derive(Debug)]
pub struct ProcessStream {
    /// `Start` or `Connect`, for errors and decoding.
    call: &'static str,
    response: Response,
    decoder: Decoder,
    done: bool,
}

impl ProcessStream {
    /// The next event, or `Ok(None)` once the stream has ended cleanly. An end-of-stream error
    /// becomes [`EnvdError::Rpc`]; a body cut mid-stream becomes [`EnvdError::StreamCut`].
    pub async fn next_event(&mut self) -> Result<Option<ProcessEvent>, EnvdError> {
        loop {
            if self.done {
                return Ok(None);
            }
            let frame = self
                .decoder
                .next_frame()
                .map_err(|source| EnvdError::Frame {
                    call: self.call,
                    source,
                })?;
            match frame {
                Some(Frame::Message(body)) => {
                    if let Some(event) = decode_event(self.call, &body)? {
                        return Ok(Some(event));
                    }
                }
                Some(Frame::End { error }) => {
                    self.done = true;
                    return match error {
                        None => Ok(None),
                        Some(error) => Err(EnvdError::Rpc {
                            call: self.call,
                            code: error.code,
                            message: snippet(error.message.as_bytes()),
                        }),
                    };
                }
                None => {
                    let chunk =
                        self.response
                            .chunk()
                            .await
                            .map_err(|source| EnvdError::Transport {
                                call: self.call,
                                source,
                            })?;
                    match chunk {
                        Some(chunk) => self.decoder.push(&chunk),
                        None => {
                            self.done = true;
                            self.decoder.finish().map_err(|source| EnvdError::Frame {
                                call: self.call,
                                source,
                            })?;
                            return Err(EnvdError::StreamCut { call: self.call });
                        }
                    }
                }
            }
        }
    }

    /// Reads to the end, collecting every event (for short commands and tests).
    pub async fn collect(mut self) -> Result<Vec<ProcessEvent>, EnvdError> {
        let mut events = Vec::new();
        while let Some(event) = self.next_event().await? {
            events.push(event);
        }
        Ok(events)
    }
}

/// One `StartResponse` (or `ConnectResponse`, the same shape) message into an event; `None` for a message with no event we know
/// (a newer envd may add kinds, and skipping them is safer than failing a run).
fn decode_event(call: &'static str, body: &[u8]) -> Result<Option<ProcessEvent>, EnvdError> {
    let bad = |reason: String| EnvdError::Decode { call, reason };
    let message: StartResponse = serde_json::from_slice(body).map_err(|e| bad(e.to_string()))?;
    let Some(event) = message.event else {
        return Ok(None);
    };
    if let Some(start) = event.start {
        return Ok(Some(ProcessEvent::Start { pid: start.pid }));
    }
    if let Some(data) = event.data {
        let decode = |text: &str| decode_bytes(text).map_err(bad);
        return Ok(match (data.stdout, data.stderr, data.pty) {
            (Some(out), _, _) => Some(ProcessEvent::Stdout(decode(&out)?)),
            (_, Some(err), _) => Some(ProcessEvent::Stderr(decode(&err)?)),
            (_, _, Some(pty)) => Some(ProcessEvent::Pty(decode(&pty)?)),
            // An empty output chunk: proto3 JSON omits the empty bytes value.
            (None, None, None) => Some(ProcessEvent::Stdout(Vec::new())),
        });
    }
    if let Some(end) = event.end {
        return Ok(Some(ProcessEvent::End(ProcessEnd {
            exit_code: end.exit_code,
            exited: end.exited,
            status: end.status,
            error: end.error.filter(|e| !e.is_empty()),
        })));
    }
    if event.keepalive.is_some() {
        return Ok(Some(ProcessEvent::Keepalive));
    }
    Ok(None)
}

/// proto3 JSON writes `bytes` as standard base64, and readers must also accept the URL-safe form.
fn decode_bytes(text: &str) -> Result<Vec<u8>, String> {
    use base64::engine::general_purpose::{STANDARD, URL_SAFE};
    STANDARD
        .decode(text)
        .or_else(|_| URL_SAFE.decode(text))
        .or_else(|_| base64::engine::general_purpose::STANDARD_NO_PAD.decode(text))
        .map_err(|e| format!("output is not base64: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id() -> SandboxId {
        SandboxId::parse("sbx1").unwrap()
    }

    #[test]
    fn without_a_sandbox_url_envd_is_addressed_by_port_and_domain() {
        assert_eq!(
            EnvdAddress::resolve(None, &id(), Some("example.dev")),
            EnvdAddress::Direct {
                base_url: "https://49983-sbx1.example.dev".into()
            }
        );
        assert_eq!(
            EnvdAddress::resolve(Some("  "), &id(), None),
            EnvdAddress::Direct {
                base_url: "https://49983-sbx1.e2b.app".into()
            }
        );
    }

    #[test]
    fn a_sandbox_url_routes_every_sandbox_through_it() {
        assert_eq!(
            EnvdAddress::resolve(Some("http://127.0.0.1:9/"), &id(), Some("example.dev")),
            EnvdAddress::Proxied {
                base_url: "http://127.0.0.1:9".into()
            }
        );
    }

    #[test]
    fn the_debug_form_never_shows_the_access_token() {
        let client = EnvdClient::new(
            id(),
            EnvdAddress::resolve(None, &id(), None),
            Some(SecretString::from("tok-very-secret".to_owned())),
            EnvdVersion::new(0, 5, 7),
        )
        .unwrap();
        let shown = format!("{client:?}");
        assert!(!shown.contains("tok-very-secret"), "{shown}");
        assert!(shown.contains("[redacted]"), "{shown}");
    }

    #[test]
    fn a_multipart_upload_is_one_file_part_named_as_the_sdks_name_it() {
        let (content_type, body) = multipart_body("/home/user/a \"q\".txt\n", b"hi --x");
        let boundary = content_type
            .strip_prefix("multipart/form-data; boundary=")
            .unwrap();
        let text = String::from_utf8(body).unwrap();
        assert_eq!(
            text,
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"/home/user/a \\\"q\\\".txt_\"\r\nContent-Type: application/octet-stream\r\n\r\nhi --x\r\n--{boundary}--\r\n"
            )
        );
    }

    #[test]
    fn events_decode_with_proto3_zero_values_omitted() {
        let event = |json: &str| decode_event(START, json.as_bytes()).unwrap();
        assert_eq!(
            event(r#"{"event":{"start":{"pid":42}}}"#),
            Some(ProcessEvent::Start { pid: 42 })
        );
        assert_eq!(
            event(r#"{"event":{"data":{"stderr":"b29wcw=="}}}"#),
            Some(ProcessEvent::Stderr(b"oops".to_vec()))
        );
        assert_eq!(
            event(r#"{"event":{"end":{"exited":true,"status":"exit status 0"}}}"#),
            Some(ProcessEvent::End(ProcessEnd {
                exit_code: 0,
                exited: true,
                status: "exit status 0".into(),
                error: None
            }))
        );
        assert_eq!(
            event(r#"{"event":{"keepalive":{}}}"#),
            Some(ProcessEvent::Keepalive)
        );
        assert_eq!(event(r#"{"event":{"somethingNew":{}}}"#), None);
        assert!(decode_event(START, br#"{"event":{"data":{"stdout":"%%%"}}}"#).is_err());
    }
}
