//! A fake Slack Web API on 127.0.0.1, served by `steward sim slack` and started by tests.
//!
//! It answers the Web API methods Steward calls (`chat.postMessage`, `chat.update`,
//! `chat.postEphemeral`, `views.open`, `usergroups.users.list`, `auth.test`, `users.info` /
//! `users.list` for seeded users, and the file upload: `files.getUploadURLExternal` hands out
//! an upload URL this fake serves, which stores the bytes, and `files.completeUploadExternal`
//! shares the file as a message in the channel or thread; `GET /_sim/files/{id}` reads the
//! bytes back), the ones a Slack client reads back with (`conversations.history`,
//! `conversations.replies`, `conversations.info`, `chat.getPermalink`) and `response_url`
//! hooks. The methods live in `api`, which answers them from the state it holds, as Slack
//! does: which channels exist and whether the bot is in them, which messages exist, whose
//! token it is, how often a method was called, and Slack's size limits. It records every call,
//! keeps the current state of each posted message (so `chat.update` edits it), and can be told
//! to fail (`/_sim/faults`). All state lives in one [`SlackWorld`] value.
//!
//! The web page (`web`) shows that world the way Slack shows it, live, and lets a person act as
//! a Slack user: it asks this server, which signs and forwards slash commands, clicks and modal
//! submissions to Steward (`--steward-url`), so the signing secret never reaches the browser.
//! Replies to the response_urls it handed out are applied to the world as Slack applies them.
//! `/invite @Steward` typed there puts the bot in the channel, as in Slack.
//!
//! It must never be used by production code paths, and it checks no real credentials: any
//! `xoxb-…` token is the bot's unless `--bot-token` pins one.
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::{Arc, Mutex, MutexGuard};

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use axum::{Json, Router};
use secrecy::SecretString;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::{broadcast, oneshot};

mod api;
mod socket;
mod web;

pub use api::RateLimit;

/// The bot user the simulated app posts as; `auth.test` with a bot token answers it.
pub const BOT_USER_ID: &str = "U0STEWARD";
/// The simulated app's bot id, on every message it posts.
pub const BOT_ID: &str = "B0STEWARD";
/// The simulated app's id.
pub const APP_ID: &str = "A0STEWARD";
/// The simulated workspace.
pub const TEAM_ID: &str = "T0SIM";
/// The person a user token (`xoxp-…`) belongs to: the workspace's installer, who is in every
/// channel.
pub const INSTALLER_ID: &str = "U0INSTALLER";

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
    /// A channel the bot is in, which the page lists even before anything is posted there:
    /// `approvals=C0APPROVALS` (repeat for more). Without any, the page offers
    /// `general=C0GENERAL` to type commands in.
    #[arg(long = "channel", value_name = "NAME=ID", value_parser = parse_channel)]
    pub channels: Vec<SimChannel>,
    /// A channel the bot is not in (repeat for more): posting there answers `not_in_channel`
    /// until someone types `/invite @Steward` in it on the page (or `POST
    /// /_sim/channels/{id}/invite`).
    #[arg(long = "channel-without-bot", value_name = "NAME=ID", value_parser = parse_channel)]
    pub channels_without_bot: Vec<SimChannel>,
    /// Only the channels given with `--channel` and `--channel-without-bot` (or added with
    /// `POST /_sim/channels`) exist; any other channel is `channel_not_found`, as in Slack.
    /// Without it, a well-formed channel id never given (`C…`, `G…`, `D…`) is taken as a
    /// channel the bot was invited to, so Steward works with the simulator whatever channel
    /// ids its steward.toml names.
    #[arg(long)]
    pub only_listed_channels: bool,
    /// The bot token Web API calls must carry; another `xoxb-` token is `invalid_auth`.
    /// Without it any `xoxb-` token is accepted. User tokens (`xoxp-`) act as the
    /// workspace's installer.
    /// (Checked at start, not by clap, whose error would echo the token.)
    #[arg(long, value_parser = parse_app_token)]
    pub bot_token: Option<SecretString>,
    /// A rate limit, Slack's way: at most CALLS calls of METHOD every SECS seconds (per channel
    /// for `chat.postMessage`), e.g. `chat.postMessage=1/1`; the call over it is answered with
    /// HTTP 429, `Retry-After` and `ratelimited` (repeat for more methods). None by default.
    #[arg(long = "rate-limit", value_name = "METHOD=CALLS/SECS", value_parser = api::parse_rate_limit)]
    pub rate_limits: Vec<RateLimit>,
    /// A person the page can act as, with a label: `U0APPROVER=Ada (approver)` (repeat for more).
    /// Without any, the page offers the seeded users.
    #[arg(long = "person", value_name = "ID=LABEL", value_parser = parse_person)]
    pub people: Vec<Person>,
    /// Steward's base URL. The page's commands, clicks and modal submissions are signed and sent
    /// to its `/slack/commands` and `/slack/interactions`. Unset: the page is read-only.
    #[arg(long, value_name = "URL", value_parser = parse_steward_url)]
    pub steward_url: Option<String>,
    /// The signing secret of Steward's Slack app, used to sign what the page sends.
    #[arg(long, env = "SLACK_SIGNING_SECRET", hide_env_values = true, value_parser = parse_secret)]
    pub signing_secret: Option<SecretString>,
    /// The app-level token `apps.connections.open` accepts (Socket Mode); without it any
    /// `xapp-` token is accepted.
    /// (Checked at start, not by clap, whose error would echo the token.)
    #[arg(long, value_parser = parse_app_token)]
    pub app_token: Option<SecretString>,
}

impl Default for SlackSimOptions {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            users: Vec::new(),
            groups: Vec::new(),
            seed: None,
            channels: Vec::new(),
            channels_without_bot: Vec::new(),
            only_listed_channels: false,
            bot_token: None,
            rate_limits: Vec::new(),
            people: Vec::new(),
            steward_url: None,
            signing_secret: None,
            app_token: None,
        }
    }
}

/// A channel the page lists: its id and name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimChannel {
    pub id: String,
    pub name: String,
}

/// Someone the page can act as: a user id and how the menu labels them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Person {
    pub id: String,
    pub label: String,
}

/// `approvals=C0APPROVALS` (a leading `#` on the name is dropped).
fn parse_channel(text: &str) -> Result<SimChannel, String> {
    let (name, id) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?} is not NAME=ID (e.g. approvals=C0APPROVALS)"))?;
    let (name, id) = (name.trim().trim_start_matches('#'), id.trim());
    if name.is_empty() {
        return Err(format!("{text:?} has no channel name before '='"));
    }
    if !id.starts_with(['C', 'G']) || id.len() < 2 || !id.bytes().all(|b| b.is_ascii_alphanumeric())
    {
        return Err(format!("{id:?} is not a Slack channel id (C… or G…)"));
    }
    Ok(SimChannel {
        id: id.to_owned(),
        name: name.to_owned(),
    })
}

/// `U0APPROVER=Ada (approver)`.
fn parse_person(text: &str) -> Result<Person, String> {
    let (id, label) = parse_user(text)?;
    let label =
        label.ok_or_else(|| format!("{text:?} is not ID=LABEL (e.g. U0ADA=Ada (approver))"))?;
    Ok(Person { id, label })
}

/// An `http://` or `https://` base URL, kept without a trailing slash.
fn parse_steward_url(text: &str) -> Result<String, String> {
    let url = url::Url::parse(text.trim()).map_err(|e| format!("{text:?} is not a URL: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
        return Err(format!(
            "{text:?} is not an http(s) URL such as http://127.0.0.1:3000"
        ));
    }
    Ok(url.as_str().trim_end_matches('/').to_owned())
}

fn parse_app_token(text: &str) -> Result<SecretString, String> {
    Ok(SecretString::from(text.trim().to_owned()))
}

fn parse_secret(text: &str) -> Result<SecretString, String> {
    if text.trim().is_empty() {
        return Err("the signing secret is empty".into());
    }
    Ok(SecretString::from(text.trim().to_owned()))
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
    /// Whether the call carried a token the simulator accepts (a bot token, or a user token).
    pub authorized: bool,
    /// Who posted the message: the bot user, or the installer for a user token (`None`: the
    /// bot, for replies to response_urls and calls that posted nothing).
    #[serde(default)]
    pub user: Option<String>,
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

/// A message only one user sees.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Ephemeral {
    pub ts: String,
    pub channel: String,
    pub user: String,
    pub text: Option<String>,
    pub blocks: Option<Value>,
    pub attachments: Option<Value>,
    pub thread_ts: Option<String>,
}

/// A modal open for a user.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Modal {
    pub id: String,
    /// Whose action's trigger opened it (`None`: a trigger the page did not hand out).
    pub user: Option<String>,
    /// The view as Steward sent it, with the `id` Slack gives it.
    pub view: Value,
    /// Errors Steward answered a submission with, by block id.
    pub errors: BTreeMap<String, String>,
}

/// Where replies to a response_url the page handed out go, as Slack routes them.
#[derive(Debug, Clone, PartialEq)]
struct HookTarget {
    user: String,
    channel: String,
    /// The message `replace_original` and `delete_original` act on: the clicked message, or a
    /// command's earlier ephemeral answer.
    source: Option<Source>,
}

#[derive(Debug, Clone, PartialEq)]
enum Source {
    Message { channel: String, ts: String },
    Ephemeral { ts: String },
}

/// How many changes a slow page may fall behind before it is told to read the world again.
const FEED_CAPACITY: usize = 1024;

/// Everything the fake knows. Plain data, so it can be shown or snapshotted.
#[derive(Debug, Default, Clone, Serialize)]
pub struct SlackWorld {
    /// Every call, in arrival order.
    pub calls: Vec<Recorded>,
    /// Current state of each posted message, keyed by (channel, ts).
    pub messages: BTreeMap<(String, String), Recorded>,
    pub faults: Vec<Fault>,
    /// Failures of the answer only: the call is carried out (a message is posted), then
    /// answered with the failure, as when the connection drops after Slack acted.
    pub faults_after: Vec<Fault>,
    pub usergroups: HashMap<String, Vec<String>>,
    /// Seeded users: id to name (`None` when seeded without one).
    pub users: BTreeMap<String, Option<String>>,
    /// Files by id, in the order their upload URLs were handed out.
    pub files: BTreeMap<String, SimFile>,
    /// Channels that exist, by id, with their names; the page lists them besides those that
    /// got messages.
    pub channels: BTreeMap<String, String>,
    /// Channels that exist but the bot is not in: posting there is `not_in_channel`.
    pub without_bot: BTreeSet<String>,
    /// Whether only `channels` exist; otherwise a well-formed id never listed is a channel the
    /// bot is in (`--only-listed-channels`).
    pub only_listed_channels: bool,
    /// Rate limits by method (`--rate-limit`, `POST /_sim/rate_limits`).
    pub rate_limits: BTreeMap<String, RateLimit>,
    /// When each method (and channel, for `chat.postMessage`) was last called, within its limit.
    #[serde(skip)]
    rate_windows: HashMap<(String, String), std::collections::VecDeque<std::time::Instant>>,
    /// The one bot token accepted (`--bot-token`); any `xoxb-` token when unset.
    #[serde(skip)]
    bot_token: Option<SecretString>,
    /// People the page can act as, in menu order.
    pub people: Vec<Person>,
    /// Ephemeral messages (`chat.postEphemeral`, ephemeral replies), by ts; each is seen by one user.
    pub ephemeral: BTreeMap<String, Ephemeral>,
    /// Modals opened with `views.open` and not yet closed, by view id.
    pub modals: BTreeMap<String, Modal>,
    /// Messages changed since they were posted (`chat.update`, `replace_original`).
    pub edited: BTreeSet<(String, String)>,
    /// Bumped by every change the page can see; each change goes out on `feed` with its number.
    pub seq: u64,
    /// The response_urls the page handed out (hook name to where replies go).
    #[serde(skip)]
    hooks: HashMap<String, HookTarget>,
    /// The trigger ids the page handed out, to the user whose action it was (for `views.open`).
    #[serde(skip)]
    triggers: HashMap<String, String>,
    /// Actions the page sent, used to name hooks and triggers.
    acts: u64,
    #[serde(skip)]
    feed: Option<broadcast::Sender<Arc<str>>>,
    /// `http://127.0.0.1:PORT`, for the upload URLs this fake hands out.
    base_url: String,
    /// The last message ts handed out, in microseconds since the epoch.
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
            feed: Some(broadcast::channel(FEED_CAPACITY).0),
            ..Self::default()
        }
    }

    /// Counts a change the page can see and sends it to every open page.
    fn publish(&mut self, mut change: Value) {
        self.seq += 1;
        if let Some(obj) = change.as_object_mut() {
            obj.insert("seq".into(), json!(self.seq));
        }
        if let Some(feed) = &self.feed {
            // No page listening is not an error.
            let _ = feed.send(Arc::from(change.to_string()));
        }
    }

    /// Publishes the current state of a channel message.
    fn publish_message(&mut self, channel: &str, ts: &str) {
        let key = (channel.to_owned(), ts.to_owned());
        if let Some(message) = self.messages.get(&key) {
            let view = web::message_view(self, message);
            self.publish(json!({"kind": "message", "message": view}));
        }
    }

    fn publish_ephemeral(&mut self, ts: &str) {
        if let Some(e) = self.ephemeral.get(ts) {
            let view = web::ephemeral_view(e);
            self.publish(json!({"kind": "ephemeral", "ephemeral": view}));
        }
    }

    fn subscribe(&self) -> Option<broadcast::Receiver<Arc<str>>> {
        self.feed.as_ref().map(broadcast::Sender::subscribe)
    }

    /// A message's `ts` as Slack makes it: the time it was posted, in seconds with six digits
    /// of microseconds, strictly increasing (a second message in the same microsecond gets the
    /// next one), so the page can say how long ago it was.
    fn next_ts(&mut self) -> String {
        let now_micros = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0);
        let floor = self.ts_base_secs * 1_000_000;
        self.ts_counter = now_micros.max(floor).max(self.ts_counter + 1);
        let n = self.ts_counter;
        format!("{}.{:06}", n / 1_000_000, n % 1_000_000)
    }

    /// Takes one matching fault, if programmed.
    /// The next failure programmed for the answer of a `method` call already carried out.
    fn take_fault_after(&mut self, method: &str) -> Option<Fault> {
        let index = self.faults_after.iter().position(|f| f.method == method)?;
        let fault = self.faults_after[index].clone();
        self.faults_after[index].count -= 1;
        if self.faults_after[index].count == 0 {
            self.faults_after.remove(index);
        }
        Some(fault)
    }

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

/// Where the page's actions go: Steward's base URL and the secret to sign with.
#[derive(Debug, Clone)]
struct StewardTarget {
    url: String,
    /// `None` sends unsigned requests, which Steward refuses; the page then says why.
    signing_secret: Option<SecretString>,
}

/// What the handlers share: the world, and where the page's actions are forwarded.
struct SimState {
    world: Mutex<SlackWorld>,
    steward: Mutex<Option<StewardTarget>>,
    http: reqwest::Client,
    /// Socket Mode: tickets, connections, envelopes awaiting their ack, and the acks.
    socket: socket::Hub,
}

type Shared = Arc<SimState>;

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
        if let Some(token) = &opts.app_token {
            socket::check_app_token(token).map_err(std::io::Error::other)?;
        }
        if let Some(token) = &opts.bot_token {
            api::check_bot_token(token).map_err(std::io::Error::other)?;
        }
        let listener = TcpListener::bind(opts.listen).await?;
        let addr = listener.local_addr()?;
        let mut seeded = SlackWorld::new();
        seeded.base_url = format!("http://{addr}");
        seed(&mut seeded, &opts.users, &opts.groups);
        seed_page(
            &mut seeded,
            &opts.channels,
            &opts.channels_without_bot,
            &opts.people,
        );
        seeded.only_listed_channels = opts.only_listed_channels;
        seeded.bot_token = opts.bot_token.clone();
        for limit in &opts.rate_limits {
            seeded
                .rate_limits
                .insert(limit.method.clone(), limit.clone());
        }
        let steward = opts.steward_url.clone().map(|url| StewardTarget {
            url,
            signing_secret: opts.signing_secret.clone(),
        });
        let world: Shared = Arc::new(SimState {
            world: Mutex::new(seeded),
            steward: Mutex::new(steward),
            http: reqwest::Client::builder()
                .timeout(web::STEWARD_TIMEOUT)
                .build()
                .map_err(std::io::Error::other)?,
            socket: socket::Hub::new(addr, opts.app_token.clone()),
        });
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

    /// The next `fault.count` calls of `fault.method` are carried out (a message is posted),
    /// then answered with the fault: Slack acted, and the caller never heard.
    pub fn add_fault_after_handling(&self, fault: Fault) {
        self.world().faults_after.push(fault);
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
        let mut copy = self.world().clone();
        // A copy must not keep the live feed open after the fake stops.
        copy.feed = None;
        copy
    }

    /// Points the page's actions at Steward (`base_url` like `http://127.0.0.1:3000`), signed
    /// with `signing_secret` (`None`: unsigned, so Steward refuses them). For a Steward started
    /// after this fake, since Steward needs the fake's URL first.
    pub fn connect_steward(
        &self,
        base_url: &str,
        signing_secret: Option<SecretString>,
    ) -> Result<(), String> {
        let url = parse_steward_url(base_url)?;
        *self.world.steward.lock().unwrap_or_else(|p| p.into_inner()) = Some(StewardTarget {
            url,
            signing_secret,
        });
        Ok(())
    }

    /// Adds someone the page can act as (`--person`); pages opened from then on offer them.
    pub fn add_person(&self, id: &str, label: &str) {
        add_person(
            &mut self.world(),
            &Person {
                id: id.to_owned(),
                label: label.to_owned(),
            },
        );
    }

    /// Adds a channel the bot is in, which the page lists (`--channel`).
    pub fn add_channel(&self, id: &str, name: &str) {
        let mut world = self.world();
        world.channels.insert(id.to_owned(), name.to_owned());
        world.without_bot.remove(id);
    }

    /// Adds a channel the bot is not in (`--channel-without-bot`): posting there is
    /// `not_in_channel` until [`SlackSim::invite_bot`].
    pub fn add_channel_without_bot(&self, id: &str, name: &str) {
        let mut world = self.world();
        world.channels.insert(id.to_owned(), name.to_owned());
        world.without_bot.insert(id.to_owned());
    }

    /// Puts the bot in a channel, as `/invite @Steward` typed there does. False when no such
    /// channel exists.
    pub fn invite_bot(&self, channel: &str) -> bool {
        api::invite_bot(&mut self.world(), channel)
    }

    /// Limits `limit.method` from now on (replacing an earlier limit of that method).
    pub fn set_rate_limit(&self, limit: RateLimit) {
        self.world().rate_limits.insert(limit.method.clone(), limit);
    }

    /// The web page's address.
    pub fn page_url(&self) -> String {
        format!("{}/", self.base_url())
    }
}

impl Drop for SlackSim {
    fn drop(&mut self) {
        // Ends the pages' event streams, which would otherwise hold the server open.
        self.world().feed = None;
        // Upgraded sockets outlive the server's graceful shutdown: close them too.
        self.world.socket.close_all(false);
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

/// Adds the page's channels (those the bot is in, then those it is not in) and people; people
/// become users too. Without channels the page offers `#general`; without people, the seeded
/// users (or one stand-in) to act as.
fn seed_page(
    world: &mut SlackWorld,
    channels: &[SimChannel],
    without_bot: &[SimChannel],
    people: &[Person],
) {
    for channel in channels {
        world
            .channels
            .insert(channel.id.clone(), channel.name.clone());
    }
    for channel in without_bot {
        world
            .channels
            .insert(channel.id.clone(), channel.name.clone());
        world.without_bot.insert(channel.id.clone());
    }
    if world.channels.is_empty() {
        world.channels.insert("C0GENERAL".into(), "general".into());
    }
    for person in people {
        add_person(world, person);
    }
    if world.people.is_empty() {
        world.people = world
            .users
            .iter()
            .map(|(id, name)| Person {
                id: id.clone(),
                label: name.clone().unwrap_or_else(|| id.clone()),
            })
            .collect();
    }
    if world.people.is_empty() {
        world.users.insert(STAND_IN.into(), Some("you".into()));
        world.people.push(Person {
            id: STAND_IN.into(),
            label: "you".into(),
        });
    }
}

/// Adds someone the page can act as, replacing the stand-in; a user without a name takes the
/// label's first part (`Ada` of `Ada (approver)`).
fn add_person(world: &mut SlackWorld, person: &Person) {
    world
        .people
        .retain(|p| p.id != STAND_IN && p.id != person.id);
    let name = person.label.split(" (").next().unwrap_or_default().trim();
    let entry = world.users.entry(person.id.clone()).or_insert(None);
    if entry.is_none() && !name.is_empty() {
        *entry = Some(name.to_owned());
    }
    world.people.push(person.clone());
}

/// The user the page acts as when nobody else was seeded.
const STAND_IN: &str = "U0YOU";

fn user_json(id: &str, name: &Option<String>) -> Value {
    let name = name.clone().unwrap_or_else(|| id.to_lowercase());
    json!({"id": id, "team_id": "T0SIM", "name": name, "real_name": name,
           "profile": {"display_name": name, "real_name": name}})
}

fn lock(state: &Shared) -> MutexGuard<'_, SlackWorld> {
    // A panic while holding the lock leaves plain data behind; keep serving it.
    state.world.lock().unwrap_or_else(|p| p.into_inner())
}

/// The fake's routes: `/api/{method}`, `/hooks/{*name}`, the `/_sim/*` controls and the page.
fn router(world: Shared) -> Router {
    web::routes()
        .route("/api/{method}", any(api::api))
        .route("/archives/{channel}/{message}", get(api::permalink))
        .route("/_sim/channels", post(api::add_channel))
        .route("/_sim/channels/{id}/invite", post(api::invite))
        .route("/_sim/rate_limits", post(api::add_rate_limit))
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
        .merge(socket::routes())
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
    // Like Slack, a form-encoded call sends structured arguments as JSON strings (`blocks`,
    // `attachments`, `view`, and `files` of `files.completeUploadExternal`): read them as JSON.
    for key in JSON_STRING_FIELDS {
        if let Some(Value::String(text)) = fields.get(key)
            && text.trim_start().starts_with(['[', '{'])
            && let Ok(parsed) = serde_json::from_str::<Value>(text)
        {
            fields.insert(key.to_owned(), parsed);
        }
    }
    Value::Object(fields)
}

/// The arguments Slack takes as JSON strings in a form-encoded call.
const JSON_STRING_FIELDS: [&str; 5] = ["blocks", "attachments", "view", "files", "metadata"];

fn str_field(body: &Value, key: &str) -> Option<String> {
    body.get(key).and_then(Value::as_str).map(str::to_owned)
}

fn record(method: &str, body: &Value, authorized: bool) -> Recorded {
    Recorded {
        user: None,
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
    // A response_url the page handed out: the reply lands where Slack would put it.
    if let Some(target) = world.hooks.get(&name).cloned() {
        world.apply_reply(&target, &value);
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

/// `GET /_sim/files/{id}`: the bytes uploaded for a file. Text (UTF-8 without control bytes
/// other than tabs and line ends) is served as `text/plain` and inline, so a test log attached
/// to a thread opens in the browser as it does in Slack; anything else downloads.
async fn file_bytes(State(world): State<Shared>, Path(id): Path<String>) -> Response {
    match lock(&world).files.get(&id).and_then(|f| f.bytes.clone()) {
        Some(bytes) => {
            let text = std::str::from_utf8(&bytes).is_ok_and(|t| {
                !t.chars()
                    .any(|c| c.is_control() && !matches!(c, '\n' | '\r' | '\t'))
            });
            let (kind, disposition) = if text {
                ("text/plain; charset=utf-8", "inline")
            } else {
                ("application/octet-stream", "attachment")
            };
            (
                StatusCode::OK,
                [
                    (header::CONTENT_TYPE, kind),
                    (header::CONTENT_DISPOSITION, disposition),
                    (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
                ],
                bytes,
            )
                .into_response()
        }
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

/// `steward sim slack`: serves until Ctrl-C or SIGTERM.
pub async fn run_cli(opts: SlackSimOptions) -> anyhow::Result<ExitCode> {
    // SIGTERM too, and listened for from the start: as a container's PID 1 a SIGTERM it does not
    // handle is ignored, and `compose down` would wait out its timeout, then SIGKILL it.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let (users, groups) = opts.seeds()?;
    let opts_steward = opts.steward_url.clone();
    let opts_signed = opts.signing_secret.is_some();
    let sim = SlackSim::start(SlackSimOptions {
        users,
        groups,
        ..opts
    })
    .await?;
    println!("Fake Slack listening on {}", sim.base_url());
    match &opts_steward {
        Some(url) => println!(
            "  page: {} (acts on Steward at {url}{})",
            sim.page_url(),
            if opts_signed {
                ""
            } else {
                "; no --signing-secret, so Steward will refuse what it sends"
            }
        ),
        None => println!(
            "  page: {} (read-only: no --steward-url to send commands to)",
            sim.page_url()
        ),
    }
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
    tokio::select! {
        stopped = tokio::signal::ctrl_c() => stopped?,
        _ = term.recv() => {}
    }
    Ok(ExitCode::SUCCESS)
}
