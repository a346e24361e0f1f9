//! A fake Slack Web API on 127.0.0.1, served by `steward sim slack` and started by tests.
//!
//! It answers the Web API methods Steward calls (`chat.postMessage`, `chat.update`,
//! `chat.postEphemeral`, `views.open`, `usergroups.users.list`, `auth.test`, `users.info` /
//! `users.list` for seeded users, and the file upload: `files.getUploadURLExternal` hands out
//! an upload URL this fake serves, which stores the bytes, and `files.completeUploadExternal`
//! shares the file as a message in the channel or thread; `GET /_sim/files/{id}` reads the
//! bytes back) and `response_url`
//! hooks with minimal valid bodies, records every call, keeps the current state of each posted
//! message (so `chat.update` edits it), refuses what Slack would refuse for size
//! (`invalid_blocks`, `msg_too_long`) and replies to a `thread_ts` that is not a message of the
//! same channel (`thread_not_found`), and can be told to fail (`/_sim/faults`). All state
//! lives in one [`SlackWorld`] value so a browser view can be added later.
//!
//! It must never be used by production code paths, and it checks no real credentials: a
//! `Bearer xoxb-…` header is enough.
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::{Arc, Mutex, MutexGuard};

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

/// Options of `steward sim slack`.
#[derive(Debug, Clone, clap::Args)]
pub struct SlackSimOptions {
    /// Address to listen on; port 0 picks a free port.
    #[arg(long, default_value = "127.0.0.1:3001")]
    pub listen: SocketAddr,
    /// Users to seed, comma-separated, each an id with an optional name: `U0ALICE01=alice,U0BOB0001`.
    /// `users.info` and `users.list` answer with them.
    #[arg(long, value_name = "ID[=NAME],...", value_delimiter = ',', value_parser = parse_user)]
    pub users: Vec<SeedUser>,
    /// A user group to seed, with its members: `S0SRE=U1,U2` (repeat for more groups). Its members
    /// are seeded as users too; `usergroups.users.list` answers with them.
    #[arg(long = "group", value_name = "ID=USER,...", value_parser = parse_group)]
    pub groups: Vec<UserGroup>,
    /// A JSON file of users and groups to seed:
    /// `{"users": {"U0ALICE01": "alice"}, "groups": {"S0SRE": ["U0ALICE01"]}}`.
    #[arg(long, value_name = "FILE")]
    pub seed: Option<std::path::PathBuf>,
}

impl Default for SlackSimOptions {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            users: Vec::new(),
            groups: Vec::new(),
            seed: None,
        }
    }
}

/// A user to seed: its id and, optionally, its name.
pub type SeedUser = (String, Option<String>);

/// `U0ALICE01=alice` or `U0ALICE01`.
fn parse_user(text: &str) -> Result<SeedUser, String> {
    let (id, name) = match text.split_once('=') {
        Some((id, name)) => (id.trim(), Some(name.trim().to_owned())),
        None => (text.trim(), None),
    };
    if !id.starts_with(['U', 'W']) || id.len() < 2 {
        return Err(format!("{id:?} is not a Slack user id (U… or W…)"));
    }
    Ok((id.to_owned(), name.filter(|n| !n.is_empty())))
}

/// `S0SRE=U1,U2`.
fn parse_group(text: &str) -> Result<UserGroup, String> {
    let (id, members) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?} is not ID=USER,USER (e.g. S0SRE=U1,U2)"))?;
    let id = id.trim();
    if !id.starts_with('S') || id.len() < 2 {
        return Err(format!("{id:?} is not a Slack user group id (S…)"));
    }
    let users = members
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(|u| parse_user(u).map(|(id, _)| id))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(UserGroup {
        id: id.to_owned(),
        users,
    })
}

/// The `--seed` file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SeedFile {
    /// User id to name (empty for none).
    pub users: BTreeMap<String, String>,
    /// Group id to member ids.
    pub groups: BTreeMap<String, Vec<String>>,
}

impl SlackSimOptions {
    /// Every user and group the options seed, the `--seed` file's first.
    pub fn seeds(&self) -> anyhow::Result<(Vec<SeedUser>, Vec<UserGroup>)> {
        let (mut users, mut groups) = (Vec::new(), Vec::new());
        if let Some(path) = &self.seed {
            let text = std::fs::read_to_string(path).map_err(|e| {
                anyhow::anyhow!("cannot read the seed file {}: {e}.", path.display())
            })?;
            let file: SeedFile = serde_json::from_str(&text).map_err(|e| {
                anyhow::anyhow!("the seed file {} is not valid: {e}.", path.display())
            })?;
            for (id, name) in file.users {
                let (id, _) =
                    parse_user(&id).map_err(|e| anyhow::anyhow!("{}: {e}.", path.display()))?;
                users.push((id, Some(name).filter(|n| !n.is_empty())));
            }
            for (id, members) in file.groups {
                let group = parse_group(&format!("{id}={}", members.join(",")))
                    .map_err(|e| anyhow::anyhow!("{}: {e}.", path.display()))?;
                groups.push(group);
            }
        }
        users.extend(self.users.iter().cloned());
        groups.extend(self.groups.iter().cloned());
        Ok((users, groups))
    }
}

/// One call the fake received.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Recorded {
    /// Web API method (`chat.postMessage`) or `hooks/<name>` for a response_url post.
    pub method: String,
    pub channel: Option<String>,
    /// The message's ts: assigned for `chat.postMessage`, sent by the caller for `chat.update`.
    pub ts: Option<String>,
    pub text: Option<String>,
    pub blocks: Option<Value>,
    /// Legacy attachments (a coloured bar with blocks), as sent.
    #[serde(default)]
    pub attachments: Option<Value>,
    pub thread_ts: Option<String>,
    pub response_type: Option<String>,
    pub replace_original: Option<bool>,
    /// Whether a `Bearer xoxb-…` Authorization header came with the call.
    pub authorized: bool,
    /// The whole request body (JSON, or form fields as a JSON object).
    pub body: Value,
}

/// A programmed failure: the next `count` calls of `method` fail.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Fault {
    /// A Web API method, or `hooks` for every response_url.
    pub method: String,
    /// HTTP status to answer with; 200 means an `{"ok":false}` API error.
    #[serde(default = "default_fault_status")]
    pub status: u16,
    #[serde(default)]
    pub retry_after_secs: Option<u64>,
    #[serde(default = "default_fault_count")]
    pub count: u32,
    /// The `error` code for API errors.
    #[serde(default)]
    pub error: Option<String>,
}

fn default_fault_status() -> u16 {
    429
}
fn default_fault_count() -> u32 {
    1
}

/// A user group seeded by tests or by `--group`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UserGroup {
    pub id: String,
    pub users: Vec<String>,
}

/// A file uploaded through `files.getUploadURLExternal`, the upload URL and
/// `files.completeUploadExternal`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SimFile {
    pub id: String,
    pub filename: String,
    /// The length announced to `files.getUploadURLExternal`.
    pub length: usize,
    /// The bytes posted to the upload URL (`None` until then); read them with `GET /_sim/files/{id}`.
    #[serde(skip)]
    pub bytes: Option<Vec<u8>>,
    /// Set by `files.completeUploadExternal`.
    pub title: Option<String>,
    pub channel: Option<String>,
    pub thread_ts: Option<String>,
    pub completed: bool,
}

/// The largest body the upload URL takes (Slack's own limit is 1 GB; tests need less).
pub const MAX_UPLOAD_BYTES: usize = 64 * 1024 * 1024;

/// Everything the fake knows. Plain data, so it can be shown or snapshotted.
#[derive(Debug, Default, Clone, Serialize)]
pub struct SlackWorld {
    /// Every call, in arrival order.
    pub calls: Vec<Recorded>,
    /// Current state of each posted message, keyed by (channel, ts).
    pub messages: BTreeMap<(String, String), Recorded>,
    pub faults: Vec<Fault>,
    pub usergroups: HashMap<String, Vec<String>>,
    /// Seeded users: id to name (`None` when seeded without one).
    pub users: BTreeMap<String, Option<String>>,
    /// Files by id, in the order their upload URLs were handed out.
    pub files: BTreeMap<String, SimFile>,
    /// `http://127.0.0.1:PORT`, for the upload URLs this fake hands out.
    base_url: String,
    /// Messages posted so far, used to make increasing ts values.
    ts_counter: u64,
    ts_base_secs: u64,
    views_opened: u64,
}

impl SlackWorld {
    fn new() -> Self {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(1_700_000_000);
        Self {
            ts_base_secs: now,
            ..Self::default()
        }
    }

    fn next_ts(&mut self) -> String {
        self.ts_counter += 1;
        let n = self.ts_counter;
        format!("{}.{:06}", self.ts_base_secs + n / 1_000_000, n % 1_000_000)
    }

    /// Takes one matching fault, if programmed.
    fn take_fault(&mut self, method: &str) -> Option<Fault> {
        let index = self.faults.iter().position(|f| {
            f.method == method || (f.method == "hooks" && method.starts_with("hooks/"))
        })?;
        let fault = self.faults[index].clone();
        self.faults[index].count -= 1;
        if self.faults[index].count == 0 {
            self.faults.remove(index);
        }
        Some(fault)
    }
}

type Shared = Arc<Mutex<SlackWorld>>;

/// A running fake Slack. Dropping it stops the server.
pub struct SlackSim {
    addr: SocketAddr,
    world: Shared,
    stop: Option<oneshot::Sender<()>>,
}

impl SlackSim {
    /// Binds `opts.listen` and serves in the background, seeded with `opts.users` and
    /// `opts.groups` (not the `--seed` file: [`run_cli`] reads it).
    pub async fn start(opts: SlackSimOptions) -> std::io::Result<SlackSim> {
        let listener = TcpListener::bind(opts.listen).await?;
        let addr = listener.local_addr()?;
        let mut seeded = SlackWorld::new();
        seeded.base_url = format!("http://{addr}");
        seed(&mut seeded, &opts.users, &opts.groups);
        let world: Shared = Arc::new(Mutex::new(seeded));
        let (stop, stopped) = oneshot::channel::<()>();
        let app = router(world.clone());
        tokio::spawn(async move {
            let shutdown = async {
                let _ = stopped.await;
            };
            if let Err(e) = axum::serve(listener, app)
                .with_graceful_shutdown(shutdown)
                .await
            {
                tracing::error!(error = %e, "fake Slack stopped");
            }
        });
        Ok(SlackSim {
            addr,
            world,
            stop: Some(stop),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The Web API base to use as `SLACK_API_URL`.
    pub fn api_url(&self) -> String {
        format!("{}/api", self.base_url())
    }

    /// A response_url served by this fake; posts to it are recorded as `hooks/<name>`.
    pub fn response_url(&self, name: &str) -> String {
        format!("{}/hooks/{name}", self.base_url())
    }

    fn world(&self) -> MutexGuard<'_, SlackWorld> {
        lock(&self.world)
    }

    /// Every call received, in order.
    pub fn messages(&self) -> Vec<Recorded> {
        self.world().calls.clone()
    }

    /// The posts made to `response_url(name)`, in order.
    pub fn hook_posts(&self, name: &str) -> Vec<Recorded> {
        let method = format!("hooks/{name}");
        self.world()
            .calls
            .iter()
            .filter(|c| c.method == method)
            .cloned()
            .collect()
    }

    /// The current state of a posted message.
    pub fn message(&self, channel: &str, ts: &str) -> Option<Recorded> {
        self.world()
            .messages
            .get(&(channel.to_owned(), ts.to_owned()))
            .cloned()
    }

    pub fn add_fault(&self, fault: Fault) {
        self.world().faults.push(fault);
    }

    /// Seeds a user (`users.info`, `users.list`).
    pub fn add_user(&self, id: &str, name: Option<&str>) {
        self.world()
            .users
            .insert(id.to_owned(), name.map(str::to_owned));
    }

    pub fn add_usergroup(&self, id: &str, users: &[&str]) {
        self.world()
            .usergroups
            .insert(id.to_owned(), users.iter().map(|u| u.to_string()).collect());
    }

    /// A file uploaded to this fake, with its bytes once posted.
    pub fn file(&self, id: &str) -> Option<SimFile> {
        self.world().files.get(id).cloned()
    }

    /// A copy of the whole state.
    pub fn snapshot(&self) -> SlackWorld {
        self.world().clone()
    }
}

impl Drop for SlackSim {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Adds users and groups to `world`; a group's members become users too.
fn seed(world: &mut SlackWorld, users: &[SeedUser], groups: &[UserGroup]) {
    for (id, name) in users {
        world.users.insert(id.clone(), name.clone());
    }
    for group in groups {
        for member in &group.users {
            world.users.entry(member.clone()).or_insert(None);
        }
        world
            .usergroups
            .insert(group.id.clone(), group.users.clone());
    }
}

fn user_json(id: &str, name: &Option<String>) -> Value {
    let name = name.clone().unwrap_or_else(|| id.to_lowercase());
    json!({"id": id, "team_id": "T0SIM", "name": name, "real_name": name,
           "profile": {"display_name": name, "real_name": name}})
}

fn lock(world: &Shared) -> MutexGuard<'_, SlackWorld> {
    // A panic while holding the lock leaves plain data behind; keep serving it.
    world.lock().unwrap_or_else(|p| p.into_inner())
}

/// The fake's routes: `/api/{method}`, `/hooks/{*name}` and the `/_sim/*` controls.
pub fn router(world: Shared) -> Router {
    Router::new()
        .route("/api/{method}", any(api))
        .route("/hooks/{*name}", post(hook))
        .route("/_sim/messages", get(list_calls))
        .route("/_sim/messages/{channel}/{ts}", get(one_message))
        .route(
            "/_sim/upload/{id}",
            post(upload).layer(axum::extract::DefaultBodyLimit::max(MAX_UPLOAD_BYTES)),
        )
        .route("/_sim/files/{id}", get(file_bytes))
        .route("/_sim/faults", post(add_fault))
        .route("/_sim/usergroups", post(add_usergroup))
        .with_state(world)
}

/// Reads a request body as JSON, or as form fields when it is not JSON, or the query string.
fn body_value(headers: &HeaderMap, query: &HashMap<String, String>, body: &[u8]) -> Value {
    let is_json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if is_json {
        return serde_json::from_slice(body).unwrap_or(Value::Null);
    }
    let mut fields: serde_json::Map<String, Value> = query
        .iter()
        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
        .collect();
    for (k, v) in form_urlencoded::parse(body) {
        fields.insert(k.into_owned(), Value::String(v.into_owned()));
    }
    Value::Object(fields)
}

fn str_field(body: &Value, key: &str) -> Option<String> {
    body.get(key).and_then(Value::as_str).map(str::to_owned)
}

fn record(method: &str, body: &Value, authorized: bool) -> Recorded {
    Recorded {
        method: method.to_owned(),
        channel: str_field(body, "channel"),
        ts: str_field(body, "ts"),
        text: str_field(body, "text"),
        blocks: body.get("blocks").cloned(),
        attachments: body.get("attachments").cloned(),
        thread_ts: str_field(body, "thread_ts"),
        response_type: str_field(body, "response_type"),
        replace_original: body.get("replace_original").and_then(Value::as_bool),
        authorized,
        body: body.clone(),
    }
}

fn fault_response(fault: Fault) -> Response {
    let status = StatusCode::from_u16(fault.status).unwrap_or(StatusCode::TOO_MANY_REQUESTS);
    let error = fault.error.unwrap_or_else(|| {
        if status == StatusCode::TOO_MANY_REQUESTS {
            "ratelimited".into()
        } else {
            "fatal_error".into()
        }
    });
    let mut resp = (status, Json(json!({"ok": false, "error": error}))).into_response();
    if let Some(secs) = fault.retry_after_secs {
        resp.headers_mut().insert(header::RETRY_AFTER, secs.into());
    }
    resp
}

/// Slack's size limits on a message, checked as Slack does: `Some(error code)` when Slack
/// would refuse it (`invalid_blocks` for a block over a limit, `msg_too_long` for the text).
pub fn refusal(body: &Value) -> Option<&'static str> {
    const TEXT_MAX: usize = 40_000;
    let chars = |v: &Value| v.as_str().map_or(0, |s| s.chars().count());
    if chars(&body["text"]) > TEXT_MAX {
        return Some("msg_too_long");
    }
    let blocks = match &body["blocks"] {
        Value::String(s) => serde_json::from_str(s).unwrap_or(Value::Null),
        other => other.clone(),
    };
    let blocks = blocks.as_array()?;
    if blocks.len() > 50 {
        return Some("invalid_blocks");
    }
    let too_long = |v: &Value, max: usize| chars(&v["text"]) > max;
    for block in blocks {
        let bad = match block["type"].as_str() {
            Some("header") => too_long(&block["text"], 150),
            Some("section") => {
                let fields = block["fields"].as_array().map(Vec::as_slice).unwrap_or(&[]);
                too_long(&block["text"], 3000)
                    || fields.len() > 10
                    || fields.iter().any(|f| too_long(f, 2000))
            }
            Some("context") => {
                let elements = block["elements"]
                    .as_array()
                    .map(Vec::as_slice)
                    .unwrap_or(&[]);
                elements.len() > 10 || elements.iter().any(|e| too_long(e, 3000))
            }
            Some("actions") => {
                let elements = block["elements"]
                    .as_array()
                    .map(Vec::as_slice)
                    .unwrap_or(&[]);
                elements.len() > 25
                    || elements
                        .iter()
                        .any(|e| too_long(&e["text"], 75) || chars(&e["value"]) > 2000)
            }
            _ => too_long(&block["text"], 3000),
        };
        if bad {
            return Some("invalid_blocks");
        }
    }
    None
}

fn api_error(code: &str) -> Response {
    Json(json!({"ok": false, "error": code})).into_response()
}

async fn api(
    State(world): State<Shared>,
    Path(method): Path<String>,
    _http_method: Method,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let authorized = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("Bearer xoxb-"));
    let value = body_value(&headers, &query, &body);
    let mut world = lock(&world);
    let mut rec = record(&method, &value, authorized);
    if !authorized {
        world.calls.push(rec);
        return api_error("not_authed");
    }
    if let Some(fault) = world.take_fault(&method) {
        world.calls.push(rec);
        return fault_response(fault);
    }
    if matches!(
        method.as_str(),
        "chat.postMessage" | "chat.update" | "chat.postEphemeral"
    ) && let Some(code) = refusal(&value)
    {
        world.calls.push(rec);
        return api_error(code);
    }
    let reply = match method.as_str() {
        "chat.postMessage" => {
            let Some(channel) = rec.channel.clone() else {
                world.calls.push(rec);
                return api_error("channel_not_found");
            };
            // Like Slack, a reply must name a message of the same channel: a `thread_ts` from
            // another channel (or none at all) is `thread_not_found`.
            if let Some(parent) = &rec.thread_ts
                && !world
                    .messages
                    .contains_key(&(channel.clone(), parent.clone()))
            {
                world.calls.push(rec);
                return api_error("thread_not_found");
            }
            let ts = world.next_ts();
            rec.ts = Some(ts.clone());
            world
                .messages
                .insert((channel.clone(), ts.clone()), rec.clone());
            json!({"ok": true, "channel": channel, "ts": ts,
                   "message": {"ts": ts, "text": rec.text.clone().unwrap_or_default()}})
        }
        "chat.update" => {
            let key = (
                rec.channel.clone().unwrap_or_default(),
                rec.ts.clone().unwrap_or_default(),
            );
            let Some(stored) = world.messages.get_mut(&key) else {
                world.calls.push(rec);
                return api_error("message_not_found");
            };
            stored.text = rec.text.clone();
            // Like Slack, omitting `blocks` keeps the old ones.
            if rec.blocks.is_some() {
                stored.blocks = rec.blocks.clone();
            }
            json!({"ok": true, "channel": key.0, "ts": key.1, "text": rec.text.clone().unwrap_or_default(),
                   "message": {"text": rec.text.clone().unwrap_or_default()}})
        }
        "chat.postEphemeral" => {
            let ts = world.next_ts();
            json!({"ok": true, "message_ts": ts})
        }
        "views.open" => {
            world.views_opened += 1;
            let mut view = value.get("view").cloned().unwrap_or(Value::Null);
            if let Some(obj) = view.as_object_mut() {
                obj.insert("id".into(), json!(format!("V{:08}", world.views_opened)));
                obj.insert("team_id".into(), json!("T0SIM"));
                obj.insert("hash".into(), json!(format!("h{}", world.views_opened)));
            }
            json!({"ok": true, "view": view})
        }
        "usergroups.users.list" => {
            let group = str_field(&value, "usergroup").unwrap_or_default();
            match world.usergroups.get(&group) {
                Some(users) => json!({"ok": true, "users": users}),
                None => {
                    world.calls.push(rec);
                    return api_error("no_such_subteam");
                }
            }
        }
        "users.info" => {
            let id = str_field(&value, "user").unwrap_or_default();
            match world.users.get(&id) {
                Some(name) => json!({"ok": true, "user": user_json(&id, name)}),
                None => {
                    world.calls.push(rec);
                    return api_error("user_not_found");
                }
            }
        }
        "users.list" => {
            let members: Vec<Value> = world
                .users
                .iter()
                .map(|(id, name)| user_json(id, name))
                .collect();
            json!({"ok": true, "members": members, "response_metadata": {"next_cursor": ""}})
        }
        "files.getUploadURLExternal" => {
            let filename = str_field(&value, "filename").unwrap_or_default();
            let length = str_field(&value, "length").and_then(|l| l.parse::<usize>().ok());
            let Some(length) = length.filter(|_| !filename.trim().is_empty()) else {
                world.calls.push(rec);
                return api_error("invalid_arguments");
            };
            let id = format!("F{:09}", world.files.len() + 1);
            let base = if world.base_url.is_empty() {
                // A router served without `start` (a test's own listener): use the Host header.
                let host = headers
                    .get(header::HOST)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("127.0.0.1");
                format!("http://{host}")
            } else {
                world.base_url.clone()
            };
            world.files.insert(
                id.clone(),
                SimFile {
                    id: id.clone(),
                    filename,
                    length,
                    bytes: None,
                    title: None,
                    channel: None,
                    thread_ts: None,
                    completed: false,
                },
            );
            json!({"ok": true, "upload_url": format!("{base}/_sim/upload/{id}"), "file_id": id})
        }
        "files.completeUploadExternal" => {
            let channel = str_field(&value, "channel_id");
            rec.channel = channel.clone();
            let files: Vec<(String, Option<String>)> = value["files"]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or(&[])
                .iter()
                .map(|f| {
                    (
                        str_field(f, "id").unwrap_or_default(),
                        str_field(f, "title"),
                    )
                })
                .collect();
            if files.is_empty() {
                world.calls.push(rec);
                return api_error("invalid_arguments");
            }
            // Like Slack: every file must have been uploaded, and a thread must exist.
            if files
                .iter()
                .any(|(id, _)| world.files.get(id).is_none_or(|f| f.bytes.is_none()))
            {
                world.calls.push(rec);
                return api_error("file_not_found");
            }
            if let (Some(channel), Some(parent)) = (&channel, &rec.thread_ts)
                && !world
                    .messages
                    .contains_key(&(channel.clone(), parent.clone()))
            {
                world.calls.push(rec);
                return api_error("thread_not_found");
            }
            let mut shared = Vec::new();
            for (id, title) in &files {
                if let Some(file) = world.files.get_mut(id) {
                    file.title = title.clone().or_else(|| Some(file.filename.clone()));
                    file.channel = channel.clone();
                    file.thread_ts = rec.thread_ts.clone();
                    file.completed = true;
                    shared.push(json!({"id": file.id, "name": file.filename, "title": file.title}));
                }
            }
            // Shared in a channel, the files appear as a message there (in the thread).
            if let Some(channel) = &channel {
                let ts = world.next_ts();
                rec.ts = Some(ts.clone());
                rec.text = str_field(&value, "initial_comment");
                world.messages.insert((channel.clone(), ts), rec.clone());
            }
            json!({"ok": true, "files": shared})
        }
        "auth.test" => json!({"ok": true, "url": "https://sim.slack.com/", "team": "Simulated",
                              "user": "steward", "team_id": "T0SIM", "user_id": "U0STEWARD",
                              "bot_id": "B0STEWARD"}),
        _ => {
            world.calls.push(rec);
            return api_error("unknown_method");
        }
    };
    world.calls.push(rec);
    Json(reply).into_response()
}

async fn hook(
    State(world): State<Shared>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let value = body_value(&headers, &HashMap::new(), &body);
    let authorized = headers.contains_key(header::AUTHORIZATION);
    let method = format!("hooks/{name}");
    let mut world = lock(&world);
    let rec = record(&method, &value, authorized);
    world.calls.push(rec);
    if let Some(fault) = world.take_fault(&method) {
        return fault_response(fault);
    }
    // Slack refuses an oversize reply to a response_url with a 400 and the error code.
    if let Some(code) = refusal(&value) {
        return (
            StatusCode::BAD_REQUEST,
            [(header::CONTENT_TYPE, "text/plain")],
            code,
        )
            .into_response();
    }
    // Real Slack answers a response_url post with a bare `ok`.
    (StatusCode::OK, [(header::CONTENT_TYPE, "text/plain")], "ok").into_response()
}

/// The upload URL handed out by `files.getUploadURLExternal`: stores the bytes.
async fn upload(State(world): State<Shared>, Path(id): Path<String>, body: Bytes) -> Response {
    let mut world = lock(&world);
    let Some(file) = world.files.get_mut(&id) else {
        return (StatusCode::NOT_FOUND, "no such upload").into_response();
    };
    let length = body.len();
    file.bytes = Some(body.to_vec());
    // Real Slack answers the upload URL in plain text.
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/plain")],
        format!("OK - {length}"),
    )
        .into_response()
}

/// `GET /_sim/files/{id}`: the bytes uploaded for a file.
async fn file_bytes(State(world): State<Shared>, Path(id): Path<String>) -> Response {
    match lock(&world).files.get(&id).and_then(|f| f.bytes.clone()) {
        Some(bytes) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/octet-stream")],
            bytes,
        )
            .into_response(),
        None => (
            StatusCode::NOT_FOUND,
            Json(json!({"error": "no such file, or nothing uploaded for it yet"})),
        )
            .into_response(),
    }
}

async fn list_calls(State(world): State<Shared>) -> Json<Vec<Recorded>> {
    Json(lock(&world).calls.clone())
}

async fn one_message(
    State(world): State<Shared>,
    Path((channel, ts)): Path<(String, String)>,
) -> Response {
    match lock(&world).messages.get(&(channel, ts)) {
        Some(m) => Json(m.clone()).into_response(),
        None => (
            StatusCode::NOT_FOUND,
            Json(json!({"error": "no such message"})),
        )
            .into_response(),
    }
}

async fn add_fault(State(world): State<Shared>, Json(fault): Json<Fault>) -> Response {
    if fault.count == 0 {
        return (
            StatusCode::BAD_REQUEST,
            Json(json!({"error": "count must be at least 1"})),
        )
            .into_response();
    }
    lock(&world).faults.push(fault);
    StatusCode::NO_CONTENT.into_response()
}

async fn add_usergroup(State(world): State<Shared>, Json(group): Json<UserGroup>) -> StatusCode {
    seed(&mut lock(&world), &[], &[group]);
    StatusCode::NO_CONTENT
}

/// `steward sim slack`: serve until Ctrl-C.
pub async fn run_cli(opts: SlackSimOptions) -> anyhow::Result<ExitCode> {
    let (users, groups) = opts.seeds()?;
    let sim = SlackSim::start(SlackSimOptions {
        users,
        groups,
        ..opts
    })
    .await?;
    println!("Fake Slack listening on {}", sim.base_url());
    {
        let world = sim.world();
        if !world.users.is_empty() || !world.usergroups.is_empty() {
            let mut groups: Vec<String> = world
                .usergroups
                .iter()
                .map(|(id, users)| format!("{id}={}", users.join(",")))
                .collect();
            groups.sort();
            println!(
                "  seeded {} user{} and {} group{}{}{}",
                world.users.len(),
                if world.users.len() == 1 { "" } else { "s" },
                groups.len(),
                if groups.len() == 1 { "" } else { "s" },
                if groups.is_empty() { "" } else { ": " },
                groups.join(" ")
            );
        }
    }
    println!("  SLACK_API_URL={}", sim.api_url());
    println!("  response URLs: {}", sim.response_url("<name>"));
    println!("  recorded calls: GET {}/_sim/messages", sim.base_url());
    println!("  uploaded files: GET {}/_sim/files/<id>", sim.base_url());
    tokio::signal::ctrl_c().await?;
    Ok(ExitCode::SUCCESS)
}
