//! The Slack simulator's web page: a read of the world for the page (`GET /_sim/world`), a live
//! feed of changes (`GET /_sim/events`, server-sent events), the page itself (`/`, `/app.css`,
//! `/app.js`, embedded) and the actions a person takes on it (`POST /_sim/act/command`,
//! `/_sim/act/click`, `/_sim/act/submit`, `/_sim/act/close`).
//!
//! Actions are built here the way Slack builds them (a slash-command form, a `block_actions` or
//! `view_submission` payload), signed with Slack's v0 scheme and sent to Steward; the signing
//! secret stays on this server. This module renders nothing into HTML: the page's script does,
//! and escapes every piece of text it is given. It must not import Steward's own Slack code, so
//! a bug there cannot hide behind a shared one.
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures::Stream;
use hmac::{KeyInit, Mac};
use secrecy::ExposeSecret;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::broadcast::error::RecvError;

use super::{
    Ephemeral, HookTarget, Recorded, Shared, SimState, SlackWorld, Source, StewardTarget, lock,
    str_field,
};

/// How long the page waits for Steward to answer a forwarded action (Slack gives up after 3 s;
/// a slower answer is still shown here, so a slow Steward is visible rather than lost).
pub(super) const STEWARD_TIMEOUT: Duration = Duration::from_secs(10);
/// The team every simulated user belongs to.
const TEAM_ID: &str = "T0SIM";
const TEAM_DOMAIN: &str = "sim";
/// The app id and legacy verification token Slack puts in every request.
const API_APP_ID: &str = "A0STEWARD";
const VERIFICATION_TOKEN: &str = "sim-verification-token";
/// What Slack asks for a required input left empty.
const REQUIRED_FIELD: &str = "Please complete this required field.";

const INDEX_HTML: &str = include_str!("web/index.html");
const APP_CSS: &str = include_str!("web/app.css");
const APP_JS: &str = include_str!("web/app.js");

/// The page's routes, merged into the simulator's router.
pub(super) fn routes() -> Router<Shared> {
    Router::new()
        .route("/", get(index))
        .route("/app.css", get(css))
        .route("/app.js", get(js))
        .route("/_sim/world", get(world))
        .route("/_sim/events", get(events))
        .route("/_sim/act/command", post(act_command))
        .route("/_sim/act/click", post(act_click))
        .route("/_sim/act/submit", post(act_submit))
        .route("/_sim/act/close", post(act_close))
}

async fn index() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
            // Text from Steward is escaped by the script; this stops anything that slips through.
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'",
            ),
        ],
        INDEX_HTML,
    )
        .into_response()
}

async fn css() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/css; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        APP_CSS,
    )
        .into_response()
}

async fn js() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/javascript; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        APP_JS,
    )
        .into_response()
}

#[derive(Debug, Deserialize)]
struct WorldQuery {
    /// Only this channel's messages (and ephemeral messages).
    channel: Option<String>,
}

/// `GET /_sim/world`: everything the page shows.
async fn world(State(state): State<Shared>, Query(query): Query<WorldQuery>) -> Json<Value> {
    let interactive = via(&state).is_some();
    let world = lock(&state);
    Json(page_view(&world, query.channel.as_deref(), interactive))
}

/// The world as the page reads it: channels with their messages (replies under their parent),
/// ephemeral messages with their user, open modals, people and user names.
pub(super) fn page_view(world: &SlackWorld, only: Option<&str>, interactive: bool) -> Value {
    let mut channels: BTreeMap<&str, String> = world
        .channels
        .iter()
        .map(|(id, name)| (id.as_str(), name.clone()))
        .collect();
    for (channel, _) in world.messages.keys() {
        channels
            .entry(channel.as_str())
            .or_insert_with(|| channel.clone());
    }
    for e in world.ephemeral.values() {
        channels
            .entry(e.channel.as_str())
            .or_insert_with(|| e.channel.clone());
    }
    let wanted = |channel: &str| only.is_none_or(|c| c == channel);
    // Top-level messages with their replies; a reply whose parent is gone is shown on its own.
    let mut views: BTreeMap<&str, Vec<Value>> = BTreeMap::new();
    let mut replies: BTreeMap<(String, String), Vec<Value>> = BTreeMap::new();
    for ((channel, ts), message) in &world.messages {
        if !wanted(channel) {
            continue;
        }
        match message.thread_ts.as_deref().filter(|t| *t != ts) {
            Some(parent)
                if world
                    .messages
                    .contains_key(&(channel.clone(), parent.to_owned())) =>
            {
                replies
                    .entry((channel.clone(), parent.to_owned()))
                    .or_default()
                    .push(message_view(world, message));
            }
            _ => views
                .entry(channel.as_str())
                .or_default()
                .push(message_view(world, message)),
        }
    }
    let channels: Vec<Value> = channels
        .into_iter()
        .filter(|(id, _)| wanted(id))
        .map(|(id, name)| {
            let messages: Vec<Value> = views
                .remove(id)
                .unwrap_or_default()
                .into_iter()
                .map(|mut m| {
                    let ts = m["ts"].as_str().unwrap_or_default().to_owned();
                    let thread = replies.remove(&(id.to_owned(), ts)).unwrap_or_default();
                    m["reply_count"] = json!(thread.len());
                    m["replies"] = Value::Array(thread);
                    m
                })
                .collect();
            json!({"id": id, "name": name, "messages": messages})
        })
        .collect();
    let ephemeral: Vec<Value> = world
        .ephemeral
        .values()
        .filter(|e| wanted(&e.channel))
        .map(ephemeral_view)
        .collect();
    let users: BTreeMap<&str, String> = world
        .users
        .iter()
        .map(|(id, name)| {
            (
                id.as_str(),
                name.clone().unwrap_or_else(|| id.to_lowercase()),
            )
        })
        .collect();
    json!({
        "seq": world.seq,
        "interactive": interactive,
        "team": {"id": TEAM_ID, "domain": TEAM_DOMAIN},
        "people": world.people,
        "users": users,
        "channels": channels,
        "ephemeral": ephemeral,
        "modals": world.modals.values().collect::<Vec<_>>(),
    })
}

/// Blocks and attachments arrive as JSON or, from form-encoded calls, as a JSON string.
fn normalized(value: &Option<Value>) -> Value {
    match value {
        Some(Value::String(s)) => serde_json::from_str(s).unwrap_or(Value::Null),
        Some(v) => v.clone(),
        None => Value::Null,
    }
}

/// One channel message as the page reads it.
pub(super) fn message_view(world: &SlackWorld, message: &Recorded) -> Value {
    let channel = message.channel.clone().unwrap_or_default();
    let ts = message.ts.clone().unwrap_or_default();
    let files: Vec<Value> = message.body["files"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or(&[])
        .iter()
        .filter_map(|f| world.files.get(f["id"].as_str()?))
        .map(|f| {
            json!({"id": f.id, "name": f.filename, "title": f.title, "length": f.length,
                   "url": format!("/_sim/files/{}", f.id)})
        })
        .collect();
    let edited = world.edited.contains(&(channel.clone(), ts.clone()));
    json!({
        "channel": channel,
        "ts": ts,
        "thread_ts": message.thread_ts.clone().filter(|t| *t != ts),
        "text": message.text,
        "blocks": normalized(&message.blocks),
        "attachments": normalized(&message.attachments),
        "files": files,
        "edited": edited,
    })
}

/// One ephemeral message as the page reads it.
pub(super) fn ephemeral_view(e: &Ephemeral) -> Value {
    json!({
        "ts": e.ts,
        "channel": e.channel,
        "user": e.user,
        "thread_ts": e.thread_ts,
        "text": e.text,
        "blocks": normalized(&e.blocks),
        "attachments": normalized(&e.attachments),
    })
}

/// `GET /_sim/events`: one `change` event per change, each a JSON object with its `seq` and
/// `kind` (`message`, `deleted`, `ephemeral`, `ephemeral_deleted`, `modal`, `modal_closed`);
/// `resync` when this page fell behind and must read the world again.
async fn events(State(state): State<Shared>) -> Response {
    let Some(feed) = lock(&state).subscribe() else {
        return (StatusCode::SERVICE_UNAVAILABLE, "the simulator is stopping").into_response();
    };
    Sse::new(changes(feed))
        .keep_alive(KeepAlive::default())
        .into_response()
}

fn changes(
    feed: tokio::sync::broadcast::Receiver<std::sync::Arc<str>>,
) -> impl Stream<Item = Result<Event, Infallible>> {
    futures::stream::unfold(feed, |mut feed| async move {
        let event = match feed.recv().await {
            Ok(change) => Event::default().event("change").data(&*change),
            Err(RecvError::Lagged(_)) => Event::default().event("resync").data("{}"),
            Err(RecvError::Closed) => return None,
        };
        Some((Ok(event), feed))
    })
}

fn steward(state: &SimState) -> Option<StewardTarget> {
    state
        .steward
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
}

/// Where the page's actions go: over Socket Mode while a connection is open (Slack sends an app
/// in Socket Mode everything over its sockets, never to its request URLs), else to
/// `--steward-url` over HTTP; `None` when neither is there (the page is read-only).
enum Via {
    Socket,
    Http(StewardTarget),
}

fn via(state: &SimState) -> Option<Via> {
    if state.socket.connected() {
        return Some(Via::Socket);
    }
    steward(state).map(Via::Http)
}

/// A refusal the page shows as it is: `{"error": sentence}`.
fn refuse(status: StatusCode, sentence: impl Into<String>) -> Response {
    (status, Json(json!({"error": sentence.into()}))).into_response()
}

fn read_only() -> Response {
    refuse(
        StatusCode::CONFLICT,
        "This page is read-only: the simulator was started without --steward-url and no Steward \
         is connected over Socket Mode, so there is no Steward to send commands, clicks or forms to.",
    )
}

/// `v0=` + hex(HMAC-SHA256(secret, `v0:{timestamp}:{body}`)), as Slack signs.
pub fn slack_signature(secret: &str, timestamp: i64, body: &[u8]) -> String {
    let mut mac = <hmac::Hmac<sha2::Sha256> as KeyInit>::new_from_slice(secret.as_bytes())
        .expect("HMAC takes keys of any length");
    mac.update(format!("v0:{timestamp}:").as_bytes());
    mac.update(body);
    format!("v0={}", hex::encode(mac.finalize().into_bytes()))
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// What Steward answered a forwarded action.
struct Answer {
    status: StatusCode,
    body: String,
}

/// Sends Steward the form Slack would POST to `path` (`/slack/commands` or `/slack/interactions`):
/// over Socket Mode as an envelope of the same payload, or signed over HTTP. A refusal is turned
/// into the sentence the page shows.
async fn forward(state: &Shared, via: &Via, path: &str, body: String) -> Result<Answer, Response> {
    match via {
        Via::Socket => over_socket(state, path, &body).await,
        Via::Http(target) => over_http(state, target, path, body).await,
    }
}

/// The form as Socket Mode carries it: a slash command's fields as a JSON object of strings, an
/// interaction's `payload` field parsed. Answered with the ack's payload as the body.
async fn over_socket(state: &Shared, path: &str, body: &str) -> Result<Answer, Response> {
    let fields = form_urlencoded::parse(body.as_bytes());
    let (kind, payload) = if path == "/slack/commands" {
        let command: serde_json::Map<String, Value> = fields
            .map(|(k, v)| (k.into_owned(), Value::String(v.into_owned())))
            .collect();
        ("slash_commands", Value::Object(command))
    } else {
        let payload = fields
            .into_iter()
            .find(|(k, _)| k == "payload")
            .and_then(|(_, v)| serde_json::from_str(&v).ok())
            .unwrap_or(Value::Null);
        ("interactive", payload)
    };
    match super::socket::deliver_and_wait(state, kind, payload).await {
        Ok(reply) => Ok(Answer {
            status: StatusCode::OK,
            body: reply.map(|r| r.to_string()).unwrap_or_default(),
        }),
        Err(super::socket::PageSendError::NoConnection) => Err(refuse(
            StatusCode::BAD_GATEWAY,
            "The Socket Mode connection closed before the action could be delivered; try again.",
        )),
        Err(super::socket::PageSendError::NoAck) => Err(refuse(
            StatusCode::BAD_GATEWAY,
            "Steward did not acknowledge the Socket Mode envelope within 3 s (Slack would show \
             the person an error and deliver it again).",
        )),
    }
}

/// Signs `body` (when a secret is set) and POSTs it to Steward's `path`.
async fn over_http(
    state: &SimState,
    target: &StewardTarget,
    path: &str,
    body: String,
) -> Result<Answer, Response> {
    let url = format!("{}{path}", target.url);
    let mut request = state
        .http
        .post(&url)
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
    if let Some(secret) = &target.signing_secret {
        let ts = unix_now();
        request = request
            .header("x-slack-request-timestamp", ts.to_string())
            .header(
                "x-slack-signature",
                slack_signature(secret.expose_secret(), ts, body.as_bytes()),
            );
    }
    let response = request.body(body).send().await.map_err(|e| {
        refuse(
            StatusCode::BAD_GATEWAY,
            format!(
                "Steward did not answer at {url}: {}",
                e.without_url()
                    .to_string()
                    .trim_start_matches("error sending request: ")
            ),
        )
    })?;
    let status = response.status();
    let body = response.text().await.unwrap_or_default();
    if status == StatusCode::UNAUTHORIZED {
        let why = if target.signing_secret.is_some() {
            "the signature did not verify: is --signing-secret the SLACK_SIGNING_SECRET Steward runs with?"
        } else {
            "the request was not signed: start the simulator with --signing-secret (or SLACK_SIGNING_SECRET), the same secret Steward runs with."
        };
        return Err(refuse(
            StatusCode::BAD_GATEWAY,
            format!("Steward refused the request (401 Unauthorized): {why}"),
        ));
    }
    if !status.is_success() {
        let detail: String = body.chars().take(300).collect();
        return Err(refuse(
            StatusCode::BAD_GATEWAY,
            format!("Steward answered {status}: {detail}"),
        ));
    }
    Ok(Answer { status, body })
}

/// A user the page may act as: a person, or any seeded user.
fn known_user(world: &SlackWorld, user: &str) -> bool {
    world.people.iter().any(|p| p.id == user) || world.users.contains_key(user)
}

fn user_name(world: &SlackWorld, user: &str) -> String {
    world
        .users
        .get(user)
        .cloned()
        .flatten()
        .unwrap_or_else(|| user.to_lowercase())
}

fn channel_name(world: &SlackWorld, channel: &str) -> String {
    world
        .channels
        .get(channel)
        .cloned()
        .unwrap_or_else(|| channel.to_lowercase())
}

fn user_json(world: &SlackWorld, user: &str) -> Value {
    let name = user_name(world, user);
    json!({"id": user, "username": name, "name": name, "team_id": TEAM_ID})
}

impl SlackWorld {
    /// Hands out a response_url (on this simulator) and a trigger id for an action of `user`.
    fn new_action(
        &mut self,
        user: &str,
        channel: &str,
        source: Option<Source>,
    ) -> (String, String) {
        self.acts += 1;
        let hook = format!("sim-{}", self.acts);
        let trigger = format!("{}.{}.sim{:08}", self.ts_base_secs, self.acts, self.acts);
        self.hooks.insert(
            hook.clone(),
            HookTarget {
                user: user.to_owned(),
                channel: channel.to_owned(),
                source,
            },
        );
        self.triggers.insert(trigger.clone(), user.to_owned());
        (format!("{}/hooks/{hook}", self.base_url), trigger)
    }

    /// Applies a reply (to a response_url, or a slash command's immediate answer) as Slack does:
    /// `delete_original` deletes the source message, `replace_original` replaces it, otherwise
    /// `response_type: in_channel` posts in the channel and anything else is ephemeral.
    /// Returns where the reply went, if anywhere.
    pub(super) fn apply_reply(
        &mut self,
        target: &HookTarget,
        body: &Value,
    ) -> Option<&'static str> {
        let flag = |name: &str| match &body[name] {
            Value::Bool(b) => *b,
            Value::String(s) => s == "true",
            _ => false,
        };
        let has_content = body["text"].as_str().is_some_and(|t| !t.is_empty())
            || body["blocks"].as_array().is_some_and(|b| !b.is_empty())
            || body["attachments"]
                .as_array()
                .is_some_and(|a| !a.is_empty());
        if flag("delete_original") {
            self.delete_source(target);
            if !has_content {
                return Some("deleted");
            }
        } else if flag("replace_original") && self.replace_source(target, body) {
            return Some("replaced");
        }
        if !has_content {
            return None;
        }
        let thread_ts = str_field(body, "thread_ts");
        if body["response_type"].as_str() == Some("in_channel") {
            let ts = self.next_ts();
            let mut rec = super::record("reply", body, false);
            rec.channel = Some(target.channel.clone());
            rec.ts = Some(ts.clone());
            self.messages
                .insert((target.channel.clone(), ts.clone()), rec);
            self.publish_message(&target.channel.clone(), &ts);
            return Some("in_channel");
        }
        let ts = self.next_ts();
        self.ephemeral.insert(
            ts.clone(),
            Ephemeral {
                ts: ts.clone(),
                channel: target.channel.clone(),
                user: target.user.clone(),
                text: str_field(body, "text"),
                blocks: body.get("blocks").cloned(),
                attachments: body.get("attachments").cloned(),
                thread_ts,
            },
        );
        self.publish_ephemeral(&ts);
        Some("ephemeral")
    }

    fn delete_source(&mut self, target: &HookTarget) {
        let change = match &target.source {
            Some(Source::Message { channel, ts }) => self
                .messages
                .remove(&(channel.clone(), ts.clone()))
                .map(|_| json!({"kind": "deleted", "channel": channel, "ts": ts})),
            Some(Source::Ephemeral { ts }) => self
                .ephemeral
                .remove(ts)
                .map(|_| json!({"kind": "ephemeral_deleted", "ts": ts})),
            None => None,
        };
        if let Some(change) = change {
            self.publish(change);
        }
    }

    /// Replaces the source message's content; false when there is none to replace.
    fn replace_source(&mut self, target: &HookTarget, body: &Value) -> bool {
        let text = str_field(body, "text");
        let blocks = body.get("blocks").cloned();
        let attachments = body.get("attachments").cloned();
        match &target.source {
            Some(Source::Message { channel, ts }) => {
                let key = (channel.clone(), ts.clone());
                let Some(message) = self.messages.get_mut(&key) else {
                    return false;
                };
                message.text = text;
                message.blocks = blocks;
                message.attachments = attachments;
                self.edited.insert(key);
                self.publish_message(channel, ts);
                true
            }
            Some(Source::Ephemeral { ts }) => {
                let Some(e) = self.ephemeral.get_mut(ts) else {
                    return false;
                };
                e.text = text;
                e.blocks = blocks;
                e.attachments = attachments;
                self.publish_ephemeral(ts);
                true
            }
            None => false,
        }
    }
}

/// What the page sends to type a slash command.
#[derive(Debug, Deserialize)]
struct CommandAct {
    user: String,
    channel: String,
    /// What was typed: `/sandbox list`.
    text: String,
}

/// `POST /_sim/act/command`: sends Steward the slash-command form Slack would, and shows its
/// immediate answer.
async fn act_command(State(state): State<Shared>, Json(act): Json<CommandAct>) -> Response {
    let Some(via) = via(&state) else {
        return read_only();
    };
    let typed = act.text.trim();
    let Some(typed) = typed.strip_prefix('/') else {
        return refuse(
            StatusCode::BAD_REQUEST,
            "A slash command starts with '/', such as /sandbox list.",
        );
    };
    let (command, text) = match typed.split_once(char::is_whitespace) {
        Some((command, text)) => (command, text.trim()),
        None => (typed, ""),
    };
    if command.is_empty() || !command.bytes().all(|b| b.is_ascii_graphic()) {
        return refuse(
            StatusCode::BAD_REQUEST,
            "Type a command name after '/', such as /sandbox list.",
        );
    }
    // `/invite` is Slack's own command, not an app's: it puts the app in the channel.
    if command == "invite" {
        return invite(&state, &act, text);
    }
    let (form, hook) = {
        let mut world = lock(&state);
        if !known_user(&world, &act.user) {
            return refuse(
                StatusCode::BAD_REQUEST,
                format!("{:?} is not one of this simulator's users.", act.user),
            );
        }
        if !act.channel.starts_with(['C', 'G']) {
            return refuse(
                StatusCode::BAD_REQUEST,
                format!("{:?} is not a channel id (C… or G…).", act.channel),
            );
        }
        let (response_url, trigger) = world.new_action(&act.user, &act.channel, None);
        let form = form_urlencoded::Serializer::new(String::new())
            .append_pair("token", VERIFICATION_TOKEN)
            .append_pair("team_id", TEAM_ID)
            .append_pair("team_domain", TEAM_DOMAIN)
            .append_pair("channel_id", &act.channel)
            .append_pair("channel_name", &channel_name(&world, &act.channel))
            .append_pair("user_id", &act.user)
            .append_pair("user_name", &user_name(&world, &act.user))
            .append_pair("command", &format!("/{command}"))
            .append_pair("text", text)
            .append_pair("api_app_id", API_APP_ID)
            .append_pair("is_enterprise_install", "false")
            .append_pair("response_url", &response_url)
            .append_pair("trigger_id", &trigger)
            .finish();
        let hook = response_url
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .to_owned();
        (form, hook)
    };
    let answer = match forward(&state, &via, "/slack/commands", form).await {
        Ok(answer) => answer,
        Err(refused) => return refused,
    };
    // Slack shows a JSON answer as a message, plain text as an ephemeral message.
    let reply = match serde_json::from_str::<Value>(&answer.body) {
        Ok(v) if v.is_object() => Some(v),
        _ if !answer.body.trim().is_empty() => Some(json!({"text": answer.body})),
        _ => None,
    };
    let mut world = lock(&state);
    let mut shown = None;
    if let (Some(reply), Some(hook_target)) = (reply, world.hooks.get(&hook).cloned()) {
        shown = world.apply_reply(&hook_target, &reply);
        // Like Slack, a later `replace_original` on this command's response_url replaces the
        // answer just shown (the "Working on it…" acknowledgement).
        if shown == Some("ephemeral")
            && let Some(ts) = world.ephemeral.keys().next_back().cloned()
            && let Some(t) = world.hooks.get_mut(&hook)
        {
            t.source = Some(Source::Ephemeral { ts });
        }
    }
    Json(json!({"ok": true, "status": answer.status.as_u16(), "shown": shown})).into_response()
}

/// `/invite @Steward` typed on the page: Slack itself puts the app in the channel, and tells the
/// person who typed it. Any other user is not the simulator's to invite.
fn invite(state: &Shared, act: &CommandAct, text: &str) -> Response {
    let mut world = lock(state);
    if !known_user(&world, &act.user) {
        return refuse(
            StatusCode::BAD_REQUEST,
            format!("{:?} is not one of this simulator's users.", act.user),
        );
    }
    let whom = text.trim().trim_start_matches('@').to_lowercase();
    let app = whom == "steward" || whom == format!("<@{}>", super::BOT_USER_ID).to_lowercase();
    let said = if !app {
        "Only the Steward app can be invited in this simulator: type /invite @Steward.".to_owned()
    } else if super::api::invite_bot(&mut world, &act.channel) {
        format!(
            "Steward was added to #{}.",
            channel_name(&world, &act.channel)
        )
    } else {
        return refuse(
            StatusCode::BAD_REQUEST,
            format!("{:?} is not a channel of this simulator.", act.channel),
        );
    };
    let ts = world.next_ts();
    let shown = Ephemeral {
        ts: ts.clone(),
        channel: act.channel.clone(),
        user: act.user.clone(),
        text: Some(said),
        blocks: None,
        attachments: None,
        thread_ts: None,
    };
    world.ephemeral.insert(ts.clone(), shown);
    world.publish_ephemeral(&ts);
    Json(json!({"ok": true, "status": 200, "shown": "ephemeral"})).into_response()
}

/// What the page sends for a button click: which message and where the button is in it.
#[derive(Debug, Deserialize)]
struct ClickAct {
    user: String,
    /// The channel message's channel and ts, or the ephemeral message's ts with `ephemeral`.
    #[serde(default)]
    channel: Option<String>,
    ts: String,
    #[serde(default)]
    ephemeral: bool,
    /// Index of the attachment holding the block, when the button is inside one.
    #[serde(default)]
    attachment: Option<usize>,
    block: usize,
    /// Index of the element in an `actions` block; `None` for a section's accessory.
    #[serde(default)]
    element: Option<usize>,
}

/// Finds the clicked button in blocks (or an attachment's blocks); `(block_id, button)`.
fn find_button(
    blocks: &Value,
    attachments: &Value,
    act: &ClickAct,
) -> Result<(String, Value), String> {
    let blocks = match act.attachment {
        Some(i) => &attachments[i]["blocks"],
        None => blocks,
    };
    let block = blocks
        .get(act.block)
        .ok_or("That message has no such block (it may have changed).")?;
    let element = match act.element {
        Some(i) => block["elements"].get(i),
        None => block.get("accessory"),
    }
    .ok_or("That block has no such element (the message may have changed).")?;
    if element["type"] != "button" {
        return Err("Only buttons can be clicked here.".into());
    }
    // Slack gives a block without a block_id one of its own.
    let block_id = block["block_id"]
        .as_str()
        .map(str::to_owned)
        .unwrap_or_else(|| format!("sim-block-{}", act.block));
    Ok((block_id, element.clone()))
}

/// `POST /_sim/act/click`: sends Steward the `block_actions` payload Slack would.
async fn act_click(State(state): State<Shared>, Json(act): Json<ClickAct>) -> Response {
    let Some(via) = via(&state) else {
        return read_only();
    };
    let form = {
        let mut world = lock(&state);
        if !known_user(&world, &act.user) {
            return refuse(
                StatusCode::BAD_REQUEST,
                format!("{:?} is not one of this simulator's users.", act.user),
            );
        }
        // The clicked message as it is now, as Slack sends it.
        let (channel, message, source) = if act.ephemeral {
            let Some(e) = world.ephemeral.get(&act.ts).filter(|e| e.user == act.user) else {
                return refuse(
                    StatusCode::NOT_FOUND,
                    "No such ephemeral message for this person.",
                );
            };
            let view = ephemeral_view(e);
            (
                e.channel.clone(),
                view,
                Source::Ephemeral { ts: act.ts.clone() },
            )
        } else {
            let channel = act.channel.clone().unwrap_or_default();
            let Some(message) = world.messages.get(&(channel.clone(), act.ts.clone())) else {
                return refuse(StatusCode::NOT_FOUND, "No such message in that channel.");
            };
            let view = message_view(&world, message);
            (
                channel.clone(),
                view,
                Source::Message {
                    channel,
                    ts: act.ts.clone(),
                },
            )
        };
        let (block_id, button) =
            match find_button(&message["blocks"], &message["attachments"], &act) {
                Ok(found) => found,
                Err(why) => return refuse(StatusCode::BAD_REQUEST, why),
            };
        let (response_url, trigger) = world.new_action(&act.user, &channel, Some(source));
        let action_ts = format!("{}.{:06}", unix_now(), world.acts % 1_000_000);
        let mut action = json!({
            "action_id": button["action_id"],
            "block_id": block_id,
            "text": button["text"],
            "value": button["value"],
            "type": "button",
            "action_ts": action_ts,
        });
        if let Some(style) = button.get("style") {
            action["style"] = style.clone();
        }
        let mut payload = json!({
            "type": "block_actions",
            "user": user_json(&world, &act.user),
            "api_app_id": API_APP_ID,
            "token": VERIFICATION_TOKEN,
            "container": {"type": "message", "message_ts": act.ts, "channel_id": channel,
                          "is_ephemeral": act.ephemeral},
            "trigger_id": trigger,
            "team": {"id": TEAM_ID, "domain": TEAM_DOMAIN},
            "enterprise": null,
            "is_enterprise_install": false,
            "channel": {"id": channel, "name": channel_name(&world, &channel)},
            "state": {"values": {}},
            "response_url": response_url,
            "actions": [action],
        });
        // Slack sends the message along, except for an ephemeral one.
        if !act.ephemeral {
            let mut posted = json!({
                "type": "message",
                "user": "U0STEWARD",
                "bot_id": "B0STEWARD",
                "ts": act.ts,
                "text": message["text"].as_str().unwrap_or_default(),
                "team": TEAM_ID,
            });
            for key in ["blocks", "attachments", "thread_ts"] {
                if !message[key].is_null() {
                    posted[key] = message[key].clone();
                }
            }
            payload["message"] = posted;
        }
        form_urlencoded::Serializer::new(String::new())
            .append_pair("payload", &payload.to_string())
            .finish()
    };
    match forward(&state, &via, "/slack/interactions", form).await {
        Ok(answer) => Json(json!({"ok": true, "status": answer.status.as_u16()})).into_response(),
        Err(refused) => refused,
    }
}

/// What the page sends to submit a modal: typed values by block id, then action id.
#[derive(Debug, Deserialize)]
struct SubmitAct {
    user: String,
    view_id: String,
    #[serde(default)]
    values: BTreeMap<String, BTreeMap<String, Typed>>,
}

/// One input's value as the page sends it: the text typed (or option chosen), or the values of
/// the ticked boxes of a `checkboxes` element.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum Typed {
    Text(String),
    Ticked(Vec<String>),
}

impl Typed {
    fn text(&self) -> Option<&str> {
        match self {
            Typed::Text(text) => Some(text.trim()).filter(|t| !t.is_empty()),
            Typed::Ticked(_) => None,
        }
    }

    fn ticked(&self) -> &[String] {
        match self {
            Typed::Ticked(values) => values,
            Typed::Text(_) => &[],
        }
    }
}

/// `view.state.values` in Slack's shape for the view's input blocks, and the errors Slack itself
/// shows (a required input left empty).
fn view_state(
    view: &Value,
    typed: &BTreeMap<String, BTreeMap<String, Typed>>,
) -> (Value, BTreeMap<String, String>) {
    let mut values = serde_json::Map::new();
    let mut errors = BTreeMap::new();
    let blocks = view["blocks"].as_array().map(Vec::as_slice).unwrap_or(&[]);
    for (i, block) in blocks.iter().enumerate() {
        if block["type"] != "input" {
            continue;
        }
        let block_id = block["block_id"]
            .as_str()
            .map(str::to_owned)
            .unwrap_or_else(|| format!("sim-block-{i}"));
        let element = &block["element"];
        let action_id = element["action_id"]
            .as_str()
            .map(str::to_owned)
            .unwrap_or_else(|| format!("sim-action-{i}"));
        let input = typed.get(&block_id).and_then(|b| b.get(&action_id));
        let mut value = input.and_then(Typed::text);
        let kind = element["type"].as_str().unwrap_or("plain_text_input");
        let state = match kind {
            // Slack sends the ticked options as the view gave them, in the view's order; a value
            // the view does not offer is not an option anyone could tick, so it is dropped.
            "checkboxes" => {
                let ticked = input.map(Typed::ticked).unwrap_or(&[]);
                let selected: Vec<Value> = element["options"]
                    .as_array()
                    .map(Vec::as_slice)
                    .unwrap_or(&[])
                    .iter()
                    .filter(|o| {
                        o["value"]
                            .as_str()
                            .is_some_and(|v| ticked.iter().any(|t| t == v))
                    })
                    .cloned()
                    .collect();
                value = (!selected.is_empty()).then_some("ticked");
                json!({"type": kind, "selected_options": selected})
            }
            "datepicker" => json!({"type": kind, "selected_date": value}),
            "static_select" => {
                let option = element["options"]
                    .as_array()
                    .and_then(|o| o.iter().find(|o| o["value"].as_str() == value))
                    .cloned();
                json!({"type": kind, "selected_option": option})
            }
            _ => json!({"type": kind, "value": value}),
        };
        if value.is_none() && block["optional"] != true {
            errors.insert(block_id.clone(), REQUIRED_FIELD.to_owned());
        }
        values.insert(block_id, json!({ action_id: state }));
    }
    (Value::Object(values), errors)
}

/// `POST /_sim/act/submit`: sends Steward the `view_submission` Slack would; shows the errors it
/// answers with under the inputs, or closes the modal.
async fn act_submit(State(state): State<Shared>, Json(act): Json<SubmitAct>) -> Response {
    let Some(via) = via(&state) else {
        return read_only();
    };
    let form = {
        let mut world = lock(&state);
        let Some(modal) = world
            .modals
            .get(&act.view_id)
            .filter(|m| m.user.as_deref().is_none_or(|u| u == act.user))
            .cloned()
        else {
            return refuse(StatusCode::NOT_FOUND, "No such open modal for this person.");
        };
        if !known_user(&world, &act.user) {
            return refuse(
                StatusCode::BAD_REQUEST,
                format!("{:?} is not one of this simulator's users.", act.user),
            );
        }
        let (values, errors) = view_state(&modal.view, &act.values);
        if !errors.is_empty() {
            // Slack checks required inputs itself and sends nothing.
            let mut modal = modal;
            modal.errors = errors.clone();
            world.modals.insert(modal.id.clone(), modal.clone());
            world.publish(json!({"kind": "modal", "modal": modal}));
            return Json(json!({"ok": false, "errors": errors})).into_response();
        }
        let channel = world.channels.keys().next().cloned().unwrap_or_default();
        let (_, trigger) = world.new_action(&act.user, &channel, None);
        let mut view = modal.view.clone();
        view["state"] = json!({"values": values});
        view["app_id"] = json!(API_APP_ID);
        view["bot_id"] = json!("B0STEWARD");
        view["root_view_id"] = json!(modal.id);
        for key in ["callback_id", "private_metadata"] {
            if view[key].is_null() {
                view[key] = json!("");
            }
        }
        let payload = json!({
            "type": "view_submission",
            "team": {"id": TEAM_ID, "domain": TEAM_DOMAIN},
            "user": user_json(&world, &act.user),
            "api_app_id": API_APP_ID,
            "token": VERIFICATION_TOKEN,
            "trigger_id": trigger,
            "view": view,
            "response_urls": [],
            "enterprise": null,
            "is_enterprise_install": false,
        });
        form_urlencoded::Serializer::new(String::new())
            .append_pair("payload", &payload.to_string())
            .finish()
    };
    let answer = match forward(&state, &via, "/slack/interactions", form).await {
        Ok(answer) => answer,
        Err(refused) => return refused,
    };
    let reply: Value = serde_json::from_str(&answer.body).unwrap_or(Value::Null);
    let mut world = lock(&state);
    match reply["response_action"].as_str() {
        Some("errors") => {
            let errors: BTreeMap<String, String> = reply["errors"]
                .as_object()
                .map(|o| {
                    o.iter()
                        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                        .collect()
                })
                .unwrap_or_default();
            if let Some(modal) = world.modals.get_mut(&act.view_id) {
                modal.errors = errors.clone();
                let modal = modal.clone();
                world.publish(json!({"kind": "modal", "modal": modal}));
            }
            Json(json!({"ok": false, "errors": errors})).into_response()
        }
        Some("update") if reply["view"].is_object() => {
            if let Some(modal) = world.modals.get_mut(&act.view_id) {
                let mut view = reply["view"].clone();
                view["id"] = json!(act.view_id);
                modal.view = view;
                modal.errors.clear();
                let modal = modal.clone();
                world.publish(json!({"kind": "modal", "modal": modal}));
            }
            Json(json!({"ok": true, "status": answer.status.as_u16()})).into_response()
        }
        _ => {
            // No answer (or `clear`) closes the modal.
            close_modal(&mut world, &act.view_id);
            Json(json!({"ok": true, "status": answer.status.as_u16()})).into_response()
        }
    }
}

fn close_modal(world: &mut SlackWorld, id: &str) {
    if world.modals.remove(id).is_some() {
        world.publish(json!({"kind": "modal_closed", "id": id}));
    }
}

#[derive(Debug, Deserialize)]
struct CloseAct {
    view_id: String,
}

/// `POST /_sim/act/close`: the person cancels a modal. Steward asks for no `view_closed`, so
/// nothing is sent.
async fn act_close(State(state): State<Shared>, Json(act): Json<CloseAct>) -> Response {
    let mut world = lock(&state);
    if !world.modals.contains_key(&act.view_id) {
        return refuse(StatusCode::NOT_FOUND, "No such open modal.");
    }
    close_modal(&mut world, &act.view_id);
    StatusCode::NO_CONTENT.into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_match_slacks_worked_example() {
        let body = "token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c";
        assert_eq!(
            slack_signature(
                "8f742231b10e8888abcd99yyyzzz85a5",
                1531420618,
                body.as_bytes()
            ),
            "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503"
        );
    }

    #[test]
    fn view_state_has_slacks_shape_and_flags_empty_required_inputs() {
        let view = json!({"blocks": [
            {"type": "section", "text": {"type": "mrkdwn", "text": "Say why."}},
            {"type": "input", "block_id": "reason",
             "element": {"type": "plain_text_input", "action_id": "reason_text"}},
            {"type": "input", "block_id": "until", "optional": true,
             "element": {"type": "datepicker", "action_id": "until_date"}},
            {"type": "input", "block_id": "pick", "optional": true,
             "element": {"type": "static_select", "action_id": "choice",
                         "options": [{"text": {"type": "plain_text", "text": "A"}, "value": "a"}]}},
            {"type": "input", "block_id": "boxes", "optional": true,
             "element": {"type": "checkboxes", "action_id": "ticks", "options": [
                 {"text": {"type": "mrkdwn", "text": "`x1`"}, "value": "x1"},
                 {"text": {"type": "mrkdwn", "text": "`x2`"}, "value": "x2"},
                 {"text": {"type": "mrkdwn", "text": "`x3`"}, "value": "x3"}]}},
        ]});
        let typed: BTreeMap<String, BTreeMap<String, Typed>> = serde_json::from_value(json!({
            "reason": {"reason_text": "done with it"},
            "until": {"until_date": "2030-01-02"},
            "pick": {"choice": "a"},
            "boxes": {"ticks": ["x3", "x1", "not-offered"]},
        }))
        .unwrap();
        let (values, errors) = view_state(&view, &typed);
        assert!(errors.is_empty());
        assert_eq!(
            values,
            json!({
                "reason": {"reason_text": {"type": "plain_text_input", "value": "done with it"}},
                "until": {"until_date": {"type": "datepicker", "selected_date": "2030-01-02"}},
                "pick": {"choice": {"type": "static_select", "selected_option":
                    {"text": {"type": "plain_text", "text": "A"}, "value": "a"}}},
                "boxes": {"ticks": {"type": "checkboxes", "selected_options": [
                    {"text": {"type": "mrkdwn", "text": "`x1`"}, "value": "x1"},
                    {"text": {"type": "mrkdwn", "text": "`x3`"}, "value": "x3"}]}},
            })
        );
        let (values, errors) = view_state(&view, &BTreeMap::new());
        assert_eq!(
            errors.get("reason").map(String::as_str),
            Some(REQUIRED_FIELD)
        );
        assert_eq!(
            errors.len(),
            1,
            "optional inputs may stay empty: {errors:?}"
        );
        assert_eq!(values["until"]["until_date"]["selected_date"], Value::Null);
        assert_eq!(
            values["boxes"]["ticks"],
            json!({"type": "checkboxes", "selected_options": []}),
            "nothing ticked is an empty list, as Slack sends it"
        );
    }
}
