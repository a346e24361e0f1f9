//! The simulator's Web API methods (`/api/{method}`), answered from the state the simulator
//! holds, with Slack's bodies and Slack's errors.
//!
//! A call is first authenticated as Slack does (no token: `not_authed`; a token that is neither
//! a bot token `xoxb-…` (the one `--bot-token` pins, when given) nor a user token `xoxp-…`:
//! `invalid_auth`), then held to the method's rate limit (`--rate-limit`: HTTP 429,
//! `Retry-After`, `ratelimited`), then to a programmed fault, then answered. Channels exist when
//! listed (or, unless `--only-listed-channels`, when their id is well formed); a channel may be
//! named by id or by name and the answer always carries the id. The bot posts only in channels
//! it is in (`not_in_channel`), a message needs text, blocks or attachments (`no_text`), and
//! every message comes back as Slack returns it: `type`, `user`, `bot_id`, `app_id`, `team`,
//! `ts`, `text`, `blocks` (with block ids; text alone becomes a `rich_text` block). Only
//! `mod.rs` uses this module, for its routes.
use std::collections::HashMap;
use std::time::{Duration, Instant};

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{
    APP_ID, BOT_ID, BOT_USER_ID, Ephemeral, INSTALLER_ID, Modal, Recorded, Shared, SimFile,
    SlackWorld, TEAM_ID, api_error, body_value, fault_response, lock, record, refusal, socket,
    str_field, user_json,
};

/// How many messages `conversations.history` and `conversations.replies` answer with when no
/// `limit` is given (Slack's default).
const DEFAULT_PAGE: usize = 100;
/// The most they answer with at once (Slack's cap).
const MAX_PAGE: usize = 999;

/// A rate limit of one method: at most `calls` calls every `per_secs` seconds (per channel for
/// `chat.postMessage`, as Slack limits it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RateLimit {
    pub method: String,
    pub calls: u32,
    pub per_secs: u64,
}

/// `chat.postMessage=1/1`.
pub(super) fn parse_rate_limit(text: &str) -> Result<RateLimit, String> {
    let shape = || format!("{text:?} is not METHOD=CALLS/SECS (e.g. chat.postMessage=1/1)");
    let (method, rate) = text.split_once('=').ok_or_else(shape)?;
    let (calls, per) = rate.split_once('/').ok_or_else(shape)?;
    let method = method.trim();
    let calls: u32 = calls.trim().parse().map_err(|_| shape())?;
    let per_secs: u64 = per.trim().parse().map_err(|_| shape())?;
    if method.is_empty() || !method.contains('.') {
        return Err(format!(
            "{method:?} is not a Web API method such as chat.postMessage"
        ));
    }
    if calls == 0 || per_secs == 0 {
        return Err(format!("{text:?}: CALLS and SECS must be at least 1"));
    }
    Ok(RateLimit {
        method: method.to_owned(),
        calls,
        per_secs,
    })
}

/// `--bot-token` must look like a bot token, so a typo is caught at start.
pub(super) fn check_bot_token(token: &SecretString) -> Result<(), &'static str> {
    let token = token.expose_secret();
    if token.starts_with("xoxb-") && token.len() > "xoxb-".len() {
        Ok(())
    } else {
        Err("--bot-token must be a bot token (xoxb-…)")
    }
}

/// Whose token a call carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Caller {
    /// The app's bot user, with a bot token.
    Bot,
    /// The installer, with a user token: in every channel.
    Installer,
}

impl Caller {
    fn user_id(self) -> &'static str {
        match self {
            Caller::Bot => BOT_USER_ID,
            Caller::Installer => INSTALLER_ID,
        }
    }
}

/// Slack's checks of the token: the `Authorization: Bearer` header, or a `token` argument.
fn authenticate(
    world: &SlackWorld,
    headers: &HeaderMap,
    value: &Value,
) -> Result<Caller, &'static str> {
    let header_token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.strip_prefix("Bearer ").unwrap_or(v).trim().to_owned());
    let token = header_token
        .filter(|t| !t.is_empty())
        .or_else(|| str_field(value, "token").filter(|t| !t.trim().is_empty()));
    let Some(token) = token else {
        return Err("not_authed");
    };
    if let Some(rest) = token.strip_prefix("xoxb-")
        && !rest.is_empty()
    {
        return match &world.bot_token {
            Some(pinned) if pinned.expose_secret() != token => Err("invalid_auth"),
            _ => Ok(Caller::Bot),
        };
    }
    if let Some(rest) = token.strip_prefix("xoxp-")
        && !rest.is_empty()
    {
        return Ok(Caller::Installer);
    }
    if token.starts_with("xapp-") {
        // An app-level token is good for `apps.connections.open` only.
        return Err("not_allowed_token_type");
    }
    Err("invalid_auth")
}

/// A channel id as Slack makes them: `C`, `G` or `D`, then capitals and digits.
fn well_formed_channel(id: &str) -> bool {
    id.len() >= 2
        && id.starts_with(['C', 'G', 'D'])
        && id
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit())
}

/// The id of the channel `given` names (an id, `#name` or `name`), if it exists.
fn resolve_channel(world: &SlackWorld, given: &str) -> Option<String> {
    let given = given.trim();
    if world.channels.contains_key(given) {
        return Some(given.to_owned());
    }
    let name = given.trim_start_matches('#');
    if let Some((id, _)) = world.channels.iter().find(|(_, n)| n.as_str() == name) {
        return Some(id.clone());
    }
    (!world.only_listed_channels && well_formed_channel(given)).then(|| given.to_owned())
}

/// Whether `caller` is in `channel` (which exists).
fn is_member(world: &SlackWorld, caller: Caller, channel: &str) -> bool {
    caller == Caller::Installer || !world.without_bot.contains(channel)
}

/// The channel of the `key` argument: `channel_not_found` when there is none, and, when
/// `to_post`, `not_in_channel` when the caller is not in it.
fn channel_arg(
    world: &SlackWorld,
    caller: Caller,
    value: &Value,
    key: &str,
    to_post: bool,
) -> Result<String, &'static str> {
    let given = str_field(value, key).unwrap_or_default();
    let channel = resolve_channel(world, &given).ok_or("channel_not_found")?;
    if to_post && !is_member(world, caller, &channel) {
        return Err("not_in_channel");
    }
    Ok(channel)
}

/// Puts the bot in `channel` (an id or name). False when there is no such channel.
pub(super) fn invite_bot(world: &mut SlackWorld, channel: &str) -> bool {
    let Some(id) = resolve_channel(world, channel) else {
        return false;
    };
    world.without_bot.remove(&id);
    world
        .channels
        .entry(id.clone())
        .or_insert_with(|| id.to_lowercase());
    true
}

/// Whether a message has nothing to show: no text, no blocks, no attachments (`no_text`).
fn is_empty_message(value: &Value) -> bool {
    let empty = |v: &Value| match v {
        Value::Null => true,
        Value::String(s) => s.trim().is_empty(),
        Value::Array(a) => a.is_empty(),
        _ => false,
    };
    empty(&value["text"]) && empty(&value["blocks"]) && empty(&value["attachments"])
}

impl SlackWorld {
    /// `Some(wait)` when a call of `method` now would go over its limit; otherwise counts it.
    fn over_rate_limit(&mut self, method: &str, value: &Value) -> Option<Duration> {
        let limit = self.rate_limits.get(method)?.clone();
        let scope = if method == "chat.postMessage" {
            str_field(value, "channel").unwrap_or_default()
        } else {
            String::new()
        };
        let per = Duration::from_secs(limit.per_secs);
        let now = Instant::now();
        let window = self
            .rate_windows
            .entry((method.to_owned(), scope))
            .or_default();
        while window
            .front()
            .is_some_and(|t| now.duration_since(*t) >= per)
        {
            window.pop_front();
        }
        if window.len() >= limit.calls as usize {
            let oldest = *window.front()?;
            return Some(per.saturating_sub(now.duration_since(oldest)));
        }
        window.push_back(now);
        None
    }

    /// The message at (`channel`, `ts`) as Slack's API returns it.
    fn api_message(&self, message: &Recorded) -> Value {
        let channel = message.channel.clone().unwrap_or_default();
        let ts = message.ts.clone().unwrap_or_default();
        let text = message.text.clone().unwrap_or_default();
        let poster = message.user.as_deref().unwrap_or(BOT_USER_ID);
        let mut out = json!({"type": "message", "user": poster, "team": TEAM_ID,
                             "ts": ts, "text": text});
        if poster == BOT_USER_ID {
            out["bot_id"] = json!(BOT_ID);
            out["app_id"] = json!(APP_ID);
            out["bot_profile"] = json!({"id": BOT_ID, "deleted": false, "name": "Steward",
                "updated": 1_700_000_000, "app_id": APP_ID, "team_id": TEAM_ID,
                "icons": {"image_36": "", "image_48": "", "image_72": ""}});
        }
        let mut blocks = match message.blocks.clone() {
            Some(Value::Array(blocks)) if !blocks.is_empty() => blocks,
            _ if !text.is_empty() => vec![json!({"type": "rich_text", "elements": [
                {"type": "rich_text_section", "elements": [{"type": "text", "text": text}]}]})],
            _ => Vec::new(),
        };
        for (index, block) in blocks.iter_mut().enumerate() {
            if let Some(obj) = block.as_object_mut() {
                obj.entry("block_id")
                    .or_insert_with(|| json!(block_id(&ts, index)));
            }
        }
        if !blocks.is_empty() {
            out["blocks"] = Value::Array(blocks);
        }
        if let Some(attachments) = message.attachments.clone().filter(|a| !a.is_null()) {
            out["attachments"] = attachments;
        }
        if let Some(files) = message.body.get("files").filter(|f| f.is_array()) {
            let files: Vec<Value> = files
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|f| self.files.get(f["id"].as_str()?))
                .map(|f| file_json(&self.base_url, f))
                .collect();
            out["files"] = json!(files);
            out["upload"] = json!(true);
        }
        let key = (channel.clone(), ts.clone());
        if self.edited.contains(&key) {
            out["edited"] = json!({"user": poster, "ts": ts});
        }
        match message.thread_ts.as_deref().filter(|t| *t != ts) {
            Some(parent) => {
                out["thread_ts"] = json!(parent);
                let parent_user = self
                    .messages
                    .get(&(channel.clone(), parent.to_owned()))
                    .and_then(|m| m.user.clone())
                    .unwrap_or_else(|| BOT_USER_ID.to_owned());
                out["parent_user_id"] = json!(parent_user);
            }
            None => {
                let replies = self.replies(&channel, &ts);
                if !replies.is_empty() {
                    let mut users: Vec<String> = replies
                        .iter()
                        .map(|m| m.user.clone().unwrap_or_else(|| BOT_USER_ID.to_owned()))
                        .collect();
                    users.dedup();
                    out["thread_ts"] = json!(ts);
                    out["reply_count"] = json!(replies.len());
                    out["reply_users_count"] = json!(users.len());
                    out["reply_users"] = json!(users);
                    out["latest_reply"] = json!(replies.last().and_then(|m| m.ts.clone()));
                }
            }
        }
        out
    }

    /// The replies in the thread of (`channel`, `ts`), oldest first.
    fn replies(&self, channel: &str, ts: &str) -> Vec<&Recorded> {
        self.messages
            .iter()
            .filter(|((c, t), m)| c == channel && t != ts && m.thread_ts.as_deref() == Some(ts))
            .map(|(_, m)| m)
            .collect()
    }
}

/// A block id for a block sent without one; Slack makes up a short one, stable per message.
fn block_id(ts: &str, index: usize) -> String {
    let digits: String = ts.chars().filter(char::is_ascii_digit).collect();
    let tail = &digits[digits.len().saturating_sub(4)..];
    format!("s{tail}{index}")
}

/// A file as Slack describes it. `url_private` is absolute, as clients parse it as a URL; a
/// simulator served without `start` does not know its own address and leaves it out.
fn file_json(base_url: &str, file: &SimFile) -> Value {
    let mut out = json!({"id": file.id, "name": file.filename, "title": file.title,
                         "size": file.length, "mimetype": "application/octet-stream",
                         "user": BOT_USER_ID});
    if !base_url.is_empty() {
        out["url_private"] = json!(format!("{base_url}/_sim/files/{}", file.id));
    }
    out
}

/// One page of `messages` (newest or oldest first as given) from the `cursor` argument, and
/// the `has_more`/`response_metadata` Slack answers with.
fn page(value: &Value, messages: Vec<Value>) -> (Vec<Value>, bool, Value) {
    let limit = number_arg(value, "limit")
        .map(|n| n as usize)
        .filter(|n| *n > 0)
        .unwrap_or(DEFAULT_PAGE)
        .min(MAX_PAGE);
    let start = str_field(value, "cursor")
        .and_then(|c| c.strip_prefix("sim_offset:")?.parse::<usize>().ok())
        .unwrap_or(0);
    let total = messages.len();
    let shown: Vec<Value> = messages.into_iter().skip(start).take(limit).collect();
    let more = start + shown.len() < total;
    let next = if more {
        format!("sim_offset:{}", start + shown.len())
    } else {
        String::new()
    };
    (shown, more, json!({"next_cursor": next}))
}

/// A number sent as JSON or as a form string.
fn number_arg(value: &Value, key: &str) -> Option<u64> {
    match &value[key] {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// A ts argument such as `oldest` as a number to compare with.
fn ts_arg(value: &Value, key: &str) -> Option<f64> {
    match &value[key] {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

fn ts_number(ts: &str) -> f64 {
    ts.parse().unwrap_or(0.0)
}

/// Whether `ts` lies within the `oldest`/`latest` arguments (`inclusive` for both ends).
fn within(value: &Value, ts: &str) -> bool {
    let inclusive = matches!(str_field(value, "inclusive").as_deref(), Some("true" | "1"))
        || value["inclusive"] == json!(true);
    let t = ts_number(ts);
    let after = ts_arg(value, "oldest").is_none_or(|o| if inclusive { t >= o } else { t > o });
    let before = ts_arg(value, "latest").is_none_or(|l| if inclusive { t <= l } else { t < l });
    after && before
}

/// The answer to a call: the body, or Slack's error code.
type Answer = Result<Value, &'static str>;

/// `/api/{method}`: every Web API method the simulator serves.
pub(super) async fn api(
    State(state): State<Shared>,
    Path(method): Path<String>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if method == "apps.connections.open" {
        return socket::open(&state, &headers);
    }
    let value = body_value(&headers, &query, &body);
    let mut guard = lock(&state);
    let world = &mut *guard;
    let mut rec = record(&method, &value, false);
    let caller = match authenticate(world, &headers, &value) {
        Ok(caller) => caller,
        Err(code) => {
            world.calls.push(rec);
            return api_error(code);
        }
    };
    rec.authorized = true;
    if let Some(wait) = world.over_rate_limit(&method, &value) {
        world.calls.push(rec);
        // Slack says how many whole seconds to wait; never 0, or a client would spin.
        let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
        return (
            StatusCode::TOO_MANY_REQUESTS,
            [(header::RETRY_AFTER, secs.max(1).to_string())],
            Json(json!({"ok": false, "error": "ratelimited"})),
        )
            .into_response();
    }
    if let Some(fault) = world.take_fault(&method) {
        world.calls.push(rec);
        return fault_response(fault);
    }
    let answer = match method.as_str() {
        "chat.postMessage" => post_message(world, caller, &value, &mut rec),
        "chat.update" => update(world, caller, &value, &mut rec),
        "chat.postEphemeral" => post_ephemeral(world, caller, &value, &mut rec),
        "chat.getPermalink" => permalink_of(world, caller, &value),
        "conversations.history" => history(world, caller, &value),
        "conversations.replies" => replies(world, caller, &value),
        "conversations.info" => info(world, caller, &value),
        "views.open" => views_open(world, &value),
        "usergroups.users.list" => {
            let group = str_field(&value, "usergroup").unwrap_or_default();
            match world.usergroups.get(&group) {
                Some(users) => Ok(json!({"ok": true, "users": users})),
                None => Err("no_such_subteam"),
            }
        }
        "users.info" => {
            let id = str_field(&value, "user").unwrap_or_default();
            match world.users.get(&id) {
                Some(name) => Ok(json!({"ok": true, "user": user_json(&id, name)})),
                None => Err("user_not_found"),
            }
        }
        "users.list" => {
            let members: Vec<Value> = world
                .users
                .iter()
                .map(|(id, name)| user_json(id, name))
                .collect();
            Ok(json!({"ok": true, "members": members, "response_metadata": {"next_cursor": ""}}))
        }
        "files.getUploadURLExternal" => upload_url(world, &value, &headers),
        "files.completeUploadExternal" => complete_upload(world, caller, &value, &mut rec),
        "auth.test" => Ok(auth_test(caller)),
        _ => Err("unknown_method"),
    };
    world.calls.push(rec);
    // Carried out, but the answer is lost (`SlackSim::add_fault_after_handling`).
    if answer.is_ok()
        && let Some(fault) = world.take_fault_after(&method)
    {
        return fault_response(fault);
    }
    match answer {
        Ok(body) => Json(body).into_response(),
        Err(code) => api_error(code),
    }
}

fn auth_test(caller: Caller) -> Value {
    let mut answer = json!({"ok": true, "url": "https://sim.slack.com/", "team": "Simulated",
                            "team_id": TEAM_ID, "is_enterprise_install": false});
    match caller {
        Caller::Bot => {
            answer["user"] = json!("steward");
            answer["user_id"] = json!(BOT_USER_ID);
            answer["bot_id"] = json!(BOT_ID);
        }
        Caller::Installer => {
            answer["user"] = json!("installer");
            answer["user_id"] = json!(INSTALLER_ID);
        }
    }
    answer
}

fn post_message(
    world: &mut SlackWorld,
    caller: Caller,
    value: &Value,
    rec: &mut Recorded,
) -> Answer {
    let channel = channel_arg(world, caller, value, "channel", true)?;
    if is_empty_message(value) {
        return Err("no_text");
    }
    if let Some(code) = refusal(value) {
        return Err(code);
    }
    // Like Slack, a reply must name a message of the same channel: a `thread_ts` from
    // another channel (or none at all) is `thread_not_found`.
    if let Some(parent) = &rec.thread_ts
        && !world
            .messages
            .contains_key(&(channel.clone(), parent.clone()))
    {
        return Err("thread_not_found");
    }
    let ts = world.next_ts();
    rec.ts = Some(ts.clone());
    rec.channel = Some(channel.clone());
    rec.user = Some(caller.user_id().to_owned());
    world
        .messages
        .insert((channel.clone(), ts.clone()), rec.clone());
    world.publish_message(&channel, &ts);
    Ok(json!({"ok": true, "channel": channel, "ts": ts, "message": world.api_message(rec)}))
}

fn update(world: &mut SlackWorld, caller: Caller, value: &Value, rec: &mut Recorded) -> Answer {
    let channel = channel_arg(world, caller, value, "channel", false)?;
    let key = (channel.clone(), rec.ts.clone().unwrap_or_default());
    rec.channel = Some(channel.clone());
    let Some(stored) = world.messages.get(&key) else {
        return Err("message_not_found");
    };
    if stored.user.as_deref().unwrap_or(BOT_USER_ID) != caller.user_id() {
        return Err("cant_update_message");
    }
    if is_empty_message(value) {
        return Err("no_text");
    }
    if let Some(code) = refusal(value) {
        return Err(code);
    }
    let Some(stored) = world.messages.get_mut(&key) else {
        return Err("message_not_found");
    };
    stored.text = rec.text.clone();
    // Like Slack, omitting `blocks` keeps the old ones.
    if rec.blocks.is_some() {
        stored.blocks = rec.blocks.clone();
    }
    // Attachments too: left out, they stay.
    if rec.attachments.is_some() {
        stored.attachments = rec.attachments.clone();
    }
    let stored = stored.clone();
    world.edited.insert(key.clone());
    world.publish_message(&key.0, &key.1);
    Ok(json!({"ok": true, "channel": key.0, "ts": key.1,
              "text": stored.text.clone().unwrap_or_default(),
              "message": world.api_message(&stored)}))
}

fn post_ephemeral(
    world: &mut SlackWorld,
    caller: Caller,
    value: &Value,
    rec: &mut Recorded,
) -> Answer {
    let channel = channel_arg(world, caller, value, "channel", true)?;
    let user = str_field(value, "user")
        .filter(|u| !u.trim().is_empty())
        .ok_or("user_not_in_channel")?;
    if is_empty_message(value) {
        return Err("no_text");
    }
    if let Some(code) = refusal(value) {
        return Err(code);
    }
    rec.channel = Some(channel.clone());
    let ts = world.next_ts();
    // Kept for the page, which shows it to its one user.
    let ephemeral = Ephemeral {
        ts: ts.clone(),
        channel,
        user,
        text: rec.text.clone(),
        blocks: rec.blocks.clone(),
        attachments: rec.attachments.clone(),
        thread_ts: rec.thread_ts.clone(),
    };
    world.ephemeral.insert(ts.clone(), ephemeral);
    world.publish_ephemeral(&ts);
    Ok(json!({"ok": true, "message_ts": ts}))
}

fn permalink_of(world: &SlackWorld, caller: Caller, value: &Value) -> Answer {
    let channel = channel_arg(world, caller, value, "channel", false)?;
    let ts = str_field(value, "message_ts").unwrap_or_default();
    let message = world
        .messages
        .get(&(channel.clone(), ts.clone()))
        .ok_or("message_not_found")?;
    let mut link = format!(
        "{}/archives/{channel}/p{}",
        world.base_url,
        ts.replace('.', "")
    );
    if let Some(parent) = message.thread_ts.as_deref().filter(|t| *t != ts) {
        link.push_str(&format!("?thread_ts={parent}&cid={channel}"));
    }
    Ok(json!({"ok": true, "channel": channel, "permalink": link}))
}

/// `GET /archives/{channel}/{p…}`: a permalink opens the page on the message's channel.
pub(super) async fn permalink(Path((channel, _message)): Path<(String, String)>) -> Redirect {
    let channel: String = channel
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .collect();
    Redirect::to(&format!("/#channel={channel}"))
}

fn history(world: &SlackWorld, caller: Caller, value: &Value) -> Answer {
    let channel = channel_arg(world, caller, value, "channel", true)?;
    // Top-level messages (a thread's parent, not its replies), newest first.
    let mut messages: Vec<&Recorded> = world
        .messages
        .iter()
        .filter(|((c, ts), m)| {
            *c == channel && m.thread_ts.as_deref().is_none_or(|t| t == ts) && within(value, ts)
        })
        .map(|(_, m)| m)
        .collect();
    messages.sort_by(|a, b| {
        ts_number(b.ts.as_deref().unwrap_or("0"))
            .total_cmp(&ts_number(a.ts.as_deref().unwrap_or("0")))
    });
    let messages: Vec<Value> = messages
        .into_iter()
        .map(|m| with_metadata(world.api_message(m), m, value))
        .collect();
    let (messages, has_more, meta) = page(value, messages);
    Ok(
        json!({"ok": true, "messages": messages, "has_more": has_more, "pin_count": 0,
              "channel_actions_ts": null, "channel_actions_count": 0,
              "response_metadata": meta}),
    )
}

/// A message's `metadata` (`event_type`, `event_payload`), as `chat.postMessage` was given it,
/// added to its history entry when the call asked for `include_all_metadata` (Slack leaves it
/// out otherwise). A form-encoded post carries it as a JSON string.
fn with_metadata(mut out: Value, message: &Recorded, value: &Value) -> Value {
    let asked = match value.get("include_all_metadata") {
        Some(Value::Bool(b)) => *b,
        Some(Value::String(s)) => s == "true" || s == "1",
        _ => false,
    };
    let metadata = match message.body.get("metadata") {
        Some(Value::String(text)) => serde_json::from_str(text).ok(),
        Some(v @ Value::Object(_)) => Some(v.clone()),
        _ => None,
    };
    if let (true, Some(metadata)) = (asked, metadata)
        && metadata.get("event_type").is_some_and(Value::is_string)
    {
        out["metadata"] = metadata;
    }
    out
}

fn replies(world: &SlackWorld, caller: Caller, value: &Value) -> Answer {
    let channel = channel_arg(world, caller, value, "channel", true)?;
    let ts = str_field(value, "ts").unwrap_or_default();
    let parent = world
        .messages
        .get(&(channel.clone(), ts.clone()))
        .ok_or("thread_not_found")?;
    let mut thread = vec![world.api_message(parent)];
    thread.extend(
        world
            .replies(&channel, &ts)
            .into_iter()
            .filter(|m| within(value, m.ts.as_deref().unwrap_or_default()))
            .map(|m| world.api_message(m)),
    );
    let (messages, has_more, meta) = page(value, thread);
    Ok(
        json!({"ok": true, "messages": messages, "has_more": has_more,
              "response_metadata": meta}),
    )
}

fn info(world: &SlackWorld, caller: Caller, value: &Value) -> Answer {
    let channel = channel_arg(world, caller, value, "channel", false)?;
    let name = world
        .channels
        .get(&channel)
        .cloned()
        .unwrap_or_else(|| channel.to_lowercase());
    let private = channel.starts_with('G');
    let dm = channel.starts_with('D');
    Ok(json!({"ok": true, "channel": {
        "id": channel, "name": name, "is_channel": !private && !dm, "is_group": private,
        "is_im": dm, "is_private": private || dm, "is_archived": false, "is_general": name == "general",
        "is_member": is_member(world, caller, &channel), "created": world.ts_base_secs,
        "creator": INSTALLER_ID, "context_team_id": TEAM_ID,
    }}))
}

fn views_open(world: &mut SlackWorld, value: &Value) -> Answer {
    if str_field(value, "trigger_id").is_none_or(|t| t.trim().is_empty()) {
        return Err("invalid_arguments");
    }
    world.views_opened += 1;
    let mut view = value.get("view").cloned().unwrap_or(Value::Null);
    if !view.is_object() {
        return Err("invalid_arguments");
    }
    let id = format!("V{:08}", world.views_opened);
    if let Some(obj) = view.as_object_mut() {
        obj.insert("id".into(), json!(id));
        obj.insert("team_id".into(), json!(TEAM_ID));
        obj.insert("app_id".into(), json!(APP_ID));
        obj.insert("bot_id".into(), json!(BOT_ID));
        obj.insert("hash".into(), json!(format!("h{}", world.views_opened)));
        obj.entry("state").or_insert_with(|| json!({"values": {}}));
    }
    let user = str_field(value, "trigger_id").and_then(|t| world.triggers.get(&t).cloned());
    let modal = Modal {
        id: id.clone(),
        user,
        view: view.clone(),
        errors: std::collections::BTreeMap::new(),
    };
    world.modals.insert(id, modal.clone());
    world.publish(json!({"kind": "modal", "modal": modal}));
    Ok(json!({"ok": true, "view": view}))
}

fn upload_url(world: &mut SlackWorld, value: &Value, headers: &HeaderMap) -> Answer {
    let filename = str_field(value, "filename").unwrap_or_default();
    let length = number_arg(value, "length");
    let Some(length) = length.filter(|_| !filename.trim().is_empty()) else {
        return Err("invalid_arguments");
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
            length: length as usize,
            bytes: None,
            title: None,
            channel: None,
            thread_ts: None,
            completed: false,
        },
    );
    Ok(json!({"ok": true, "upload_url": format!("{base}/_sim/upload/{id}"), "file_id": id}))
}

fn complete_upload(
    world: &mut SlackWorld,
    caller: Caller,
    value: &Value,
    rec: &mut Recorded,
) -> Answer {
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
        return Err("invalid_arguments");
    }
    // `channel_id`, or the older `channels` (comma-separated; the first is shared to here).
    let given = str_field(value, "channel_id")
        .filter(|c| !c.trim().is_empty())
        .or_else(|| {
            str_field(value, "channels")
                .and_then(|c| c.split(',').next().map(str::trim).map(str::to_owned))
                .filter(|c| !c.is_empty())
        });
    let channel = match given {
        Some(given) => {
            let channel = resolve_channel(world, &given).ok_or("channel_not_found")?;
            if !is_member(world, caller, &channel) {
                return Err("not_in_channel");
            }
            Some(channel)
        }
        None => None,
    };
    rec.channel = channel.clone();
    // Like Slack: every file must have been uploaded, and a thread must exist.
    if files
        .iter()
        .any(|(id, _)| world.files.get(id).is_none_or(|f| f.bytes.is_none()))
    {
        return Err("file_not_found");
    }
    if let (Some(channel), Some(parent)) = (&channel, &rec.thread_ts)
        && !world
            .messages
            .contains_key(&(channel.clone(), parent.clone()))
    {
        return Err("thread_not_found");
    }
    let mut shared = Vec::new();
    for (id, title) in &files {
        if let Some(file) = world.files.get_mut(id) {
            file.title = title.clone().or_else(|| Some(file.filename.clone()));
            file.channel = channel.clone();
            file.thread_ts = rec.thread_ts.clone();
            file.completed = true;
            shared.push(file_json(&world.base_url, file));
        }
    }
    // Shared in a channel, the files appear as a message there (in the thread).
    if let Some(channel) = &channel {
        let ts = world.next_ts();
        rec.ts = Some(ts.clone());
        rec.text = str_field(value, "initial_comment");
        rec.user = Some(caller.user_id().to_owned());
        world
            .messages
            .insert((channel.clone(), ts.clone()), rec.clone());
        world.publish_message(channel, &ts);
    }
    Ok(json!({"ok": true, "files": shared}))
}

/// What `POST /_sim/channels` takes.
#[derive(Debug, Deserialize)]
pub(super) struct NewChannel {
    id: String,
    name: String,
    /// Whether the bot is in it (default true).
    #[serde(default = "yes")]
    bot_member: bool,
}

fn yes() -> bool {
    true
}

/// `POST /_sim/channels`: adds a channel (or changes whether the bot is in it).
pub(super) async fn add_channel(
    State(state): State<Shared>,
    Json(new): Json<NewChannel>,
) -> Response {
    if !well_formed_channel(&new.id) || new.name.trim().is_empty() {
        return (
            StatusCode::BAD_REQUEST,
            Json(json!({"error": "a channel needs an id such as C0APPROVALS and a name"})),
        )
            .into_response();
    }
    let mut world = lock(&state);
    let name = new.name.trim().trim_start_matches('#').to_owned();
    world.channels.insert(new.id.clone(), name);
    if new.bot_member {
        world.without_bot.remove(&new.id);
    } else {
        world.without_bot.insert(new.id);
    }
    StatusCode::NO_CONTENT.into_response()
}

/// `POST /_sim/channels/{id}/invite`: the bot joins, as after `/invite @Steward`.
pub(super) async fn invite(State(state): State<Shared>, Path(id): Path<String>) -> Response {
    if invite_bot(&mut lock(&state), &id) {
        StatusCode::NO_CONTENT.into_response()
    } else {
        (
            StatusCode::NOT_FOUND,
            Json(json!({"error": "no such channel"})),
        )
            .into_response()
    }
}

/// `POST /_sim/rate_limits`: `{"method": "chat.postMessage", "calls": 1, "per_secs": 1}`.
pub(super) async fn add_rate_limit(
    State(state): State<Shared>,
    Json(limit): Json<RateLimit>,
) -> Response {
    let text = format!("{}={}/{}", limit.method, limit.calls, limit.per_secs);
    match parse_rate_limit(&text) {
        Ok(limit) => {
            lock(&state).rate_limits.insert(limit.method.clone(), limit);
            StatusCode::NO_CONTENT.into_response()
        }
        Err(e) => (StatusCode::BAD_REQUEST, Json(json!({"error": e}))).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_limits_parse_from_method_calls_and_seconds() {
        assert_eq!(
            parse_rate_limit("chat.postMessage=1/1").unwrap(),
            RateLimit {
                method: "chat.postMessage".into(),
                calls: 1,
                per_secs: 1
            }
        );
        assert!(parse_rate_limit("chat.postMessage=0/1").is_err());
        assert!(parse_rate_limit("chat.postMessage=1").is_err());
        assert!(parse_rate_limit("post=1/1").is_err());
    }

    #[test]
    fn channel_ids_are_well_formed_only_in_slacks_shape() {
        assert!(well_formed_channel("C0APPROVALS"));
        assert!(well_formed_channel("G01"));
        assert!(!well_formed_channel("#general"));
        assert!(!well_formed_channel("general"));
        assert!(!well_formed_channel("C"));
        assert!(!well_formed_channel("Cabc"));
    }
}
