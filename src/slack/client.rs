//! The Slack Web API client: slack-morphism over a rustls connector that also speaks plain
//! HTTP, pointed at `SLACK_API_URL` so tests and demos can use the local fake Slack.
//!
//! It owns the bot token as a secret (never logged, never in `Debug`), retries 429s a bounded
//! number of times honouring `Retry-After`, and refuses to post to a `response_url` whose host
//! is neither `hooks.slack.com` nor the configured API host. It must not render messages or
//! decide what to say; callers hand it finished content.
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use secrecy::{ExposeSecret, SecretString};
use serde::Serialize;
use slack_morphism::errors::SlackClientError;
use slack_morphism::prelude::*;
use url::Url;

use super::SlackSettings;
use crate::ids::{SlackChannelId, SlackUserId};

use super::render::Message;

/// Who the bot token belongs to (`auth.test`).
#[derive(Debug, Clone)]
pub struct BotIdentity {
    /// The workspace's name.
    pub team: String,
    /// The bot's user id, e.g. `U0BOT`.
    pub user_id: String,
    /// The bot's user name, which `/invite @name` takes.
    pub user: Option<String>,
}

/// A channel as the bot sees it (`conversations.info`).
#[derive(Debug, Clone)]
pub struct ChannelInfo {
    pub name: Option<String>,
    pub is_member: bool,
    pub is_archived: bool,
}

/// A workspace member (`users.info`).
#[derive(Debug, Clone)]
pub struct UserInfo {
    pub name: Option<String>,
    /// A deactivated account: it can no longer click anything.
    pub deleted: bool,
}

/// How many times one call is retried after a 429.
pub const RATE_LIMIT_MAX_RETRIES: u32 = 3;
/// Longest `Retry-After` we wait for inside a request; longer limits surface as errors.
pub const RATE_LIMIT_MAX_WAIT_SECS: u64 = 30;
/// How many times a `chat.update` is sent again after a transient failure (a 5xx, a lost
/// connection); updates are idempotent, so a replay is harmless.
pub const UPDATE_MAX_RETRIES: u32 = 3;
/// First wait before an update is sent again; it doubles with every retry.
const UPDATE_BACKOFF_BASE: Duration = Duration::from_millis(200);
/// Timeout of one response_url POST.
const RESPOND_TIMEOUT_SECS: u64 = 10;
/// Timeout of one file upload (up to `alerts::MAX_UPLOAD_BYTES`).
const UPLOAD_TIMEOUT_SECS: u64 = 120;
/// The only public host upload URLs may point at.
const SLACK_FILES_HOST: &str = "files.slack.com";
/// The only public host `response_url`s may point at.
const SLACK_HOOKS_HOST: &str = "hooks.slack.com";
/// Most pages of `conversations.history` one metadata look-up reads (200 messages each).
pub const HISTORY_MAX_PAGES: u32 = 5;

/// Why a Slack call failed. Carries no token.
#[derive(Debug, thiserror::Error)]
pub enum SlackError {
    #[error("SLACK_BOT_TOKEN is not set")]
    NoToken,
    #[error("Slack answered with error `{code}`")]
    Api { code: String },
    #[error("Slack is rate-limiting us{}", retry_hint(*retry_after))]
    RateLimited { retry_after: Option<Duration> },
    #[error("could not reach Slack: {0}")]
    Transport(String),
    #[error("refusing to post to response_url host {host:?}: not Slack")]
    ForeignResponseUrl { host: String },
    #[error("refusing to upload to host {host:?}: not Slack")]
    ForeignUploadUrl { host: String },
    #[error("the response_url is not a URL")]
    BadResponseUrl,
    #[error("Slack refused the response_url post with HTTP {status}: {body}")]
    Respond { status: u16, body: String },
    #[error("Slack refused the file upload with HTTP {status}: {body}")]
    UploadRefused { status: u16, body: String },
    #[error("could not set up the HTTPS connector: {0}")]
    Setup(#[source] std::io::Error),
}

impl SlackError {
    /// Whether the same call may well succeed a moment later (Slack's side or the network).
    pub fn is_transient(&self) -> bool {
        match self {
            // A 429 has already been waited out by `with_retry`, honouring `Retry-After`.
            Self::Transport(_) => true,
            Self::Api { code } => matches!(
                code.as_str(),
                "fatal_error" | "internal_error" | "service_unavailable" | "request_timeout"
            ),
            _ => false,
        }
    }
}

impl From<SlackClientError> for SlackError {
    fn from(e: SlackClientError) -> Self {
        match e {
            SlackClientError::ApiError(e) => Self::Api { code: e.code },
            SlackClientError::RateLimitError(e) => Self::RateLimited {
                retry_after: e.retry_after,
            },
            other => Self::Transport(plain_transport(&other.to_string())),
        }
    }
}

/// "; try again in 30 s", or nothing when Slack did not say.
fn retry_hint(retry_after: Option<Duration>) -> String {
    retry_after
        .map(|d| format!("; try again in {} s", d.as_secs()))
        .unwrap_or_default()
}

/// A transport failure in words a reader can act on: slack-morphism's text embeds the HTTP
/// library's `Debug` output (`Some(hyper_util::…)`), which says nothing more than these.
fn plain_transport(text: &str) -> String {
    let lower = text.to_lowercase();
    if lower.contains("connection refused") {
        "connection refused".into()
    } else if lower.contains("dns error") || lower.contains("failed to lookup") {
        "the host name does not resolve".into()
    } else if lower.contains("timed out") {
        "timed out".into()
    } else {
        text.to_owned()
    }
}

/// `response_type` of a response_url post.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ResponseType {
    Ephemeral,
    InChannel,
}

/// The body of a response_url POST. slack-morphism's webhook request has no `response_type`,
/// so we send our own.
#[derive(Debug, Clone, Serialize)]
pub struct ResponsePayload {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response_type: Option<ResponseType>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replace_original: Option<bool>,
    pub text: String,
    pub blocks: Vec<SlackBlock>,
}

impl ResponsePayload {
    /// An ephemeral reply (the default visibility of a slash command's answer).
    pub fn ephemeral(message: Message) -> Self {
        Self {
            response_type: Some(ResponseType::Ephemeral),
            replace_original: None,
            text: message.text,
            blocks: message.blocks,
        }
    }

    /// A reply that replaces the message holding the clicked button.
    pub fn replacing(message: Message) -> Self {
        Self {
            response_type: None,
            replace_original: Some(true),
            text: message.text,
            blocks: message.blocks,
        }
    }
}

/// A handle to Slack; cheap to clone.
#[derive(Clone)]
pub struct SlackClient {
    api: Arc<SlackHyperClient>,
    http: reqwest::Client,
    bot_token: Option<SecretString>,
    /// Host (and port) of the configured API, the one other host response_urls may use.
    api_origin: Option<(String, String, Option<u16>)>,
    /// Recently listed user groups. `usergroups.users.list` is a Tier 2 method (about 20 calls
    /// a minute), so a burst of clicks by approver-group members must not each ask Slack.
    groups: Arc<std::sync::Mutex<GroupCache>>,
}

/// Group id -> when it was listed, and its members.
type GroupCache = HashMap<String, (Instant, Vec<SlackUserId>)>;

/// How long a user group's member list is reused. A person removed from an approvers group
/// may still decide for this long.
pub const USERGROUP_CACHE_TTL: Duration = Duration::from_secs(60);

impl std::fmt::Debug for SlackClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlackClient")
            .field("api_origin", &self.api_origin)
            .field("bot_token", &self.bot_token.as_ref().map(|_| "[redacted]"))
            .finish_non_exhaustive()
    }
}

impl SlackClient {
    pub fn new(settings: &SlackSettings) -> Result<Self, SlackError> {
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_native_roots()
            .map_err(SlackError::Setup)?
            // Plain http is allowed so the client can talk to the local fake Slack; response
            // URLs are host-checked before any post.
            .https_or_http()
            .enable_http1()
            .enable_http2()
            .build();
        let connector =
            SlackClientHyperConnector::from(https).with_slack_api_url(&settings.api_url);
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(RESPOND_TIMEOUT_SECS))
            .build()
            .map_err(|e| SlackError::Transport(e.to_string()))?;
        let api_origin = Url::parse(&settings.api_url).ok().and_then(|u| {
            Some((
                u.scheme().to_owned(),
                u.host_str()?.to_owned(),
                u.port_or_known_default(),
            ))
        });
        Ok(Self {
            api: Arc::new(slack_morphism::SlackClient::new(connector)),
            http,
            bot_token: settings.bot_token.clone(),
            api_origin,
            groups: Arc::default(),
        })
    }

    fn token(&self) -> Result<SlackApiToken, SlackError> {
        let token = self.bot_token.as_ref().ok_or(SlackError::NoToken)?;
        Ok(SlackApiToken::new(token.expose_secret().to_owned().into()))
    }

    /// Runs `call` again after a 429, up to [`RATE_LIMIT_MAX_RETRIES`] times.
    async fn with_retry<T, F, Fut>(&self, method: &'static str, call: F) -> Result<T, SlackError>
    where
        F: Fn(SlackApiToken) -> Fut,
        Fut: std::future::Future<Output = Result<T, SlackClientError>>,
    {
        let token = self.token()?;
        let mut attempt = 0;
        loop {
            let result = call(token.clone()).await.map_err(SlackError::from);
            crate::metrics::slack_api_call(method, call_outcome(&result));
            match result {
                Err(SlackError::RateLimited { retry_after })
                    if attempt < RATE_LIMIT_MAX_RETRIES =>
                {
                    let wait = retry_after.unwrap_or(Duration::from_secs(1));
                    if wait.as_secs() > RATE_LIMIT_MAX_WAIT_SECS {
                        return Err(SlackError::RateLimited { retry_after });
                    }
                    attempt += 1;
                    tracing::warn!(
                        method,
                        attempt,
                        wait_secs = wait.as_secs_f64(),
                        "Slack rate limit; retrying"
                    );
                    tokio::time::sleep(wait).await;
                }
                other => return other,
            }
        }
    }

    /// `chat.postMessage`; returns where the message landed.
    #[tracing::instrument(skip(self, message))]
    pub async fn post_message(
        &self,
        channel: &SlackChannelId,
        message: Message,
    ) -> Result<(SlackChannelId, String), SlackError> {
        self.post_message_in_thread(channel, None, message).await
    }

    /// `chat.postMessage` as a reply in the thread of `thread_ts` (top level when `None`).
    #[tracing::instrument(skip(self, message))]
    pub async fn post_message_in_thread(
        &self,
        channel: &SlackChannelId,
        thread_ts: Option<&str>,
        message: Message,
    ) -> Result<(SlackChannelId, String), SlackError> {
        let content = message.into_content();
        let api = &self.api;
        let posted = self
            .with_retry("chat.postMessage", |token| {
                let mut req =
                    SlackApiChatPostMessageRequest::new(channel.as_str().into(), content.clone());
                req.thread_ts = thread_ts.map(|ts| ts.into());
                async move { api.open_session(&token).chat_post_message(&req).await }
            })
            .await?;
        let channel = SlackChannelId::parse(posted.channel.to_string())
            .map_err(|e| SlackError::Transport(format!("Slack returned a strange channel: {e}")))?;
        Ok((channel, posted.ts.to_string()))
    }

    /// `chat.postMessage` at the top level with message metadata (`event_type` and a payload
    /// of strings), so the message can be found again by [`SlackClient::find_by_metadata`]
    /// when the answer to this call is lost.
    #[tracing::instrument(skip(self, message, payload))]
    pub async fn post_message_with_metadata(
        &self,
        channel: &SlackChannelId,
        message: Message,
        event_type: &str,
        payload: HashMap<String, String>,
    ) -> Result<(SlackChannelId, String), SlackError> {
        let mut content = message.into_content();
        content.metadata = Some(SlackMessageMetadata {
            event_type: event_type.to_owned(),
            event_payload: Some(payload),
        });
        let api = &self.api;
        let posted = self
            .with_retry("chat.postMessage", |token| {
                let req =
                    SlackApiChatPostMessageRequest::new(channel.as_str().into(), content.clone());
                async move { api.open_session(&token).chat_post_message(&req).await }
            })
            .await?;
        let channel = SlackChannelId::parse(posted.channel.to_string())
            .map_err(|e| SlackError::Transport(format!("Slack returned a strange channel: {e}")))?;
        Ok((channel, posted.ts.to_string()))
    }

    /// The ts of the newest top-level message in `channel` since `oldest` (a Slack ts, or
    /// Unix seconds) whose metadata has `event_type` and `key` = `value` in its payload
    /// (`conversations.history` with `include_all_metadata`, at most [`HISTORY_MAX_PAGES`]
    /// pages). Needs `channels:history` (`groups:history` for a private channel).
    #[tracing::instrument(skip(self))]
    pub async fn find_by_metadata(
        &self,
        channel: &SlackChannelId,
        oldest: &str,
        event_type: &str,
        key: &str,
        value: &str,
    ) -> Result<Option<String>, SlackError> {
        let api = &self.api;
        let mut cursor: Option<SlackCursorId> = None;
        for _ in 0..HISTORY_MAX_PAGES {
            let mut req = SlackApiConversationsHistoryRequest::new()
                .with_channel(channel.as_str().into())
                .with_oldest(SlackTs::new(oldest.to_owned()))
                .with_include_all_metadata(true)
                .with_limit(200);
            req.cursor = cursor.clone();
            let page = self
                .with_retry("conversations.history", |token| {
                    let req = req.clone();
                    async move { api.open_session(&token).conversations_history(&req).await }
                })
                .await?;
            let found = page.messages.iter().find(|m| {
                m.content.metadata.as_ref().is_some_and(|meta| {
                    meta.event_type == event_type
                        && meta
                            .event_payload
                            .as_ref()
                            .and_then(|p| p.get(key))
                            .is_some_and(|v| v == value)
                })
            });
            if let Some(found) = found {
                return Ok(Some(found.origin.ts.to_string()));
            }
            cursor = page
                .response_metadata
                .and_then(|m| m.next_cursor)
                .filter(|c| !c.value().is_empty());
            if cursor.is_none() {
                break;
            }
        }
        Ok(None)
    }

    /// `chat.update`. The blocks are always sent, so old buttons never survive an update.
    /// Besides 429s (which wait for `Retry-After`), transient failures are retried
    /// [`UPDATE_MAX_RETRIES`] times with a doubling backoff.
    #[tracing::instrument(skip(self, message))]
    pub async fn update_message(
        &self,
        channel: &SlackChannelId,
        ts: &str,
        message: Message,
    ) -> Result<(), SlackError> {
        let content = message.into_content();
        let api = &self.api;
        let mut retry = 0;
        loop {
            let result = self
                .with_retry("chat.update", |token| {
                    let req = SlackApiChatUpdateRequest::new(
                        channel.as_str().into(),
                        content.clone(),
                        ts.into(),
                    );
                    async move { api.open_session(&token).chat_update(&req).await }
                })
                .await;
            match result {
                Ok(_) => return Ok(()),
                Err(e) if e.is_transient() && retry < UPDATE_MAX_RETRIES => {
                    let wait = UPDATE_BACKOFF_BASE * 2u32.pow(retry);
                    retry += 1;
                    tracing::warn!(error = %e, retry, wait_ms = wait.as_millis() as u64, "chat.update failed; retrying");
                    tokio::time::sleep(wait).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// `chat.postEphemeral`: visible to `user` only.
    #[tracing::instrument(skip(self, message))]
    pub async fn post_ephemeral(
        &self,
        channel: &SlackChannelId,
        user: &SlackUserId,
        message: Message,
    ) -> Result<(), SlackError> {
        let content = message.into_content();
        let api = &self.api;
        self.with_retry("chat.postEphemeral", |token| {
            let req = SlackApiChatPostEphemeralRequest::new(
                channel.as_str().into(),
                user.as_str().into(),
                content.clone(),
            );
            async move { api.open_session(&token).chat_post_ephemeral(&req).await }
        })
        .await?;
        Ok(())
    }

    /// `views.open` with a trigger from a command or click (valid for 3 s).
    #[tracing::instrument(skip(self, view))]
    pub async fn open_view(&self, trigger_id: &str, view: SlackView) -> Result<(), SlackError> {
        let api = &self.api;
        self.with_retry("views.open", |token| {
            let req = SlackApiViewsOpenRequest::new(trigger_id.into(), view.clone());
            async move { api.open_session(&token).views_open(&req).await }
        })
        .await?;
        Ok(())
    }

    /// `usergroups.users.list`: the members of a user group such as an approvers group.
    #[tracing::instrument(skip(self))]
    pub async fn usergroup_members(&self, group_id: &str) -> Result<Vec<SlackUserId>, SlackError> {
        if let Some((at, members)) = self.cached_group(group_id)
            && at.elapsed() < USERGROUP_CACHE_TTL
        {
            return Ok(members);
        }
        let members = self.list_usergroup(group_id).await?;
        self.groups
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .insert(group_id.to_owned(), (Instant::now(), members.clone()));
        Ok(members)
    }

    fn cached_group(&self, group_id: &str) -> Option<(Instant, Vec<SlackUserId>)> {
        self.groups
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get(group_id)
            .cloned()
    }

    async fn list_usergroup(&self, group_id: &str) -> Result<Vec<SlackUserId>, SlackError> {
        let api = &self.api;
        let listed = self
            .with_retry("usergroups.users.list", |token| {
                let req = SlackApiUserGroupsUsersListRequest::new(group_id.into());
                async move { api.open_session(&token).usergroups_users_list(&req).await }
            })
            .await?;
        listed
            .users
            .into_iter()
            .map(|u| {
                SlackUserId::parse(u.to_string()).map_err(|e| {
                    SlackError::Transport(format!("Slack returned a strange user id: {e}"))
                })
            })
            .collect()
    }

    /// `auth.test`: whether the token works; answers the workspace and the bot's own user.
    /// `steward check` calls it.
    #[tracing::instrument(skip(self))]
    pub async fn auth_test(&self) -> Result<BotIdentity, SlackError> {
        let api = &self.api;
        let answer = self
            .with_retry("auth.test", |token| async move {
                api.open_session(&token).auth_test().await
            })
            .await?;
        Ok(BotIdentity {
            team: answer.team,
            user_id: answer.user_id.to_string(),
            user: answer.user,
        })
    }

    /// `conversations.info`: whether a channel exists for the bot, its name, and whether the
    /// bot is in it. `steward check` calls it for every channel in `steward.toml`.
    #[tracing::instrument(skip(self))]
    pub async fn channel_info(&self, channel: &str) -> Result<ChannelInfo, SlackError> {
        let api = &self.api;
        let answer = self
            .with_retry("conversations.info", |token| {
                let req = SlackApiConversationsInfoRequest::new(channel.into());
                async move { api.open_session(&token).conversations_info(&req).await }
            })
            .await?;
        let flags = &answer.channel.flags;
        Ok(ChannelInfo {
            name: answer.channel.name.clone(),
            is_member: flags.is_member.unwrap_or(false),
            is_archived: flags.is_archived.unwrap_or(false),
        })
    }

    /// `users.info`: a user's name, and whether the account is deactivated. `steward check`
    /// calls it for every approver.
    #[tracing::instrument(skip(self))]
    pub async fn user_info(&self, user: &SlackUserId) -> Result<UserInfo, SlackError> {
        let api = &self.api;
        let answer = self
            .with_retry("users.info", |token| {
                let req = SlackApiUsersInfoRequest::new(user.as_str().into());
                async move { api.open_session(&token).users_info(&req).await }
            })
            .await?;
        Ok(UserInfo {
            name: answer.user.name.clone(),
            deleted: answer.user.deleted.unwrap_or(false),
        })
    }

    /// `files.getUploadURLExternal`: where to send a file of `length` bytes, and its id.
    #[tracing::instrument(skip(self))]
    pub async fn get_upload_url(
        &self,
        filename: &str,
        length: usize,
    ) -> Result<(Url, String), SlackError> {
        let api = &self.api;
        let answer = self
            .with_retry("files.getUploadURLExternal", |token| {
                let req =
                    SlackApiFilesGetUploadUrlExternalRequest::new(filename.to_owned(), length);
                async move { api.open_session(&token).get_upload_url_external(&req).await }
            })
            .await?;
        Ok((answer.upload_url.0, answer.file_id.0))
    }

    /// POSTs a file's bytes to the URL [`get_upload_url`](Self::get_upload_url) gave. The URL
    /// must be on `files.slack.com` (https) or the configured API's origin (the fake Slack), so
    /// a strange answer cannot make us send the bytes elsewhere. No token is sent.
    #[tracing::instrument(skip(self, upload_url, bytes), fields(bytes = bytes.len()))]
    pub async fn upload_to_url(&self, upload_url: &Url, bytes: Vec<u8>) -> Result<(), SlackError> {
        let host = upload_url.host_str().unwrap_or_default().to_owned();
        let is_slack = upload_url.scheme() == "https" && host == SLACK_FILES_HOST;
        if !is_slack && !self.is_configured_origin(upload_url) {
            return Err(SlackError::ForeignUploadUrl { host });
        }
        let resp = self
            .http
            .post(upload_url.clone())
            .timeout(Duration::from_secs(UPLOAD_TIMEOUT_SECS))
            .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
            .body(bytes)
            .send()
            .await
            .inspect_err(|_| crate::metrics::slack_api_call("upload_url", "transport"))
            .map_err(|e| SlackError::Transport(e.without_url().to_string()))?;
        let status = resp.status();
        crate::metrics::slack_api_call("upload_url", respond_outcome(status));
        if !status.is_success() {
            let body = resp.text().await.unwrap_or_default();
            return Err(SlackError::UploadRefused {
                status: status.as_u16(),
                body: body.chars().take(200).collect(),
            });
        }
        Ok(())
    }

    /// `files.completeUploadExternal`: shares an uploaded file in `channel`, in the thread of
    /// `thread_ts` when given, with `comment` as its message.
    #[tracing::instrument(skip(self, comment))]
    pub async fn complete_upload(
        &self,
        file_id: &str,
        title: &str,
        channel: &SlackChannelId,
        thread_ts: Option<&str>,
        comment: Option<&str>,
    ) -> Result<(), SlackError> {
        let api = &self.api;
        self.with_retry("files.completeUploadExternal", |token| {
            let mut req = SlackApiFilesCompleteUploadExternalRequest::new(vec![
                SlackApiFilesComplete::new(file_id.into()).with_title(title.to_owned()),
            ]);
            req.channel_id = Some(channel.as_str().into());
            req.thread_ts = thread_ts.map(|ts| ts.into());
            req.initial_comment = comment.map(str::to_owned);
            async move {
                api.open_session(&token)
                    .files_complete_upload_external(&req)
                    .await
            }
        })
        .await?;
        Ok(())
    }

    /// Uploads `bytes` as a file and shares it in `channel` (in a thread when `thread_ts` is
    /// given): the three steps of Slack's external upload. Returns the file id.
    #[tracing::instrument(skip(self, bytes, comment), fields(bytes = bytes.len()))]
    pub async fn upload_file(
        &self,
        channel: &SlackChannelId,
        thread_ts: Option<&str>,
        filename: &str,
        title: &str,
        bytes: Vec<u8>,
        comment: Option<&str>,
    ) -> Result<String, SlackError> {
        let (url, file_id) = self.get_upload_url(filename, bytes.len()).await?;
        self.upload_to_url(&url, bytes).await?;
        self.complete_upload(&file_id, title, channel, thread_ts, comment)
            .await?;
        Ok(file_id)
    }

    /// POSTs to a `response_url` (no token is sent; the URL itself is the credential).
    #[tracing::instrument(skip(self, payload, response_url))]
    pub async fn respond(
        &self,
        response_url: &str,
        payload: &ResponsePayload,
    ) -> Result<(), SlackError> {
        let url = self.check_response_url(response_url)?;
        let mut attempt = 0;
        loop {
            let resp = self
                .http
                .post(url.clone())
                .json(payload)
                .send()
                .await
                .inspect_err(|_| crate::metrics::slack_api_call("response_url", "transport"))
                .map_err(|e| SlackError::Transport(e.without_url().to_string()))?;
            let status = resp.status();
            crate::metrics::slack_api_call("response_url", respond_outcome(status));
            if status == reqwest::StatusCode::TOO_MANY_REQUESTS && attempt < RATE_LIMIT_MAX_RETRIES
            {
                let wait = retry_after(resp.headers()).unwrap_or(Duration::from_secs(1));
                if wait.as_secs() > RATE_LIMIT_MAX_WAIT_SECS {
                    return Err(SlackError::RateLimited {
                        retry_after: Some(wait),
                    });
                }
                attempt += 1;
                tokio::time::sleep(wait).await;
                continue;
            }
            let body = resp.text().await.unwrap_or_default();
            if !status.is_success() {
                return Err(SlackError::Respond {
                    status: status.as_u16(),
                    body: body.chars().take(200).collect(),
                });
            }
            // Slack answers `ok` as text or `{"ok":true}`; a JSON `ok:false` is still a failure.
            if let Ok(json) = serde_json::from_str::<serde_json::Value>(&body)
                && json["ok"] == serde_json::Value::Bool(false)
            {
                let code = json["error"].as_str().unwrap_or("unknown").to_owned();
                return Err(SlackError::Api { code });
            }
            return Ok(());
        }
    }

    /// A response_url must be `https://hooks.slack.com/...` or on the configured API's origin
    /// (the fake Slack in tests), so a forged payload cannot make us POST anywhere else.
    pub fn check_response_url(&self, response_url: &str) -> Result<Url, SlackError> {
        let url = Url::parse(response_url).map_err(|_| SlackError::BadResponseUrl)?;
        let host = url.host_str().unwrap_or_default().to_owned();
        let is_slack = url.scheme() == "https" && host == SLACK_HOOKS_HOST;
        if is_slack || self.is_configured_origin(&url) {
            Ok(url)
        } else {
            Err(SlackError::ForeignResponseUrl { host })
        }
    }
}

impl SlackClient {
    /// Whether `url` is on the configured API's scheme, host and port.
    fn is_configured_origin(&self, url: &Url) -> bool {
        let host = url.host_str().unwrap_or_default();
        self.api_origin.as_ref().is_some_and(|(scheme, h, port)| {
            scheme == url.scheme() && h == host && *port == url.port_or_known_default()
        })
    }
}

/// The `outcome` label of one Web API attempt.
fn call_outcome<T>(result: &Result<T, SlackError>) -> &'static str {
    match result {
        Ok(_) => "ok",
        Err(SlackError::RateLimited { .. }) => "rate_limited",
        Err(SlackError::Api { .. }) => "api_error",
        Err(SlackError::Transport(_)) => "transport",
        Err(_) => "refused",
    }
}

/// The `outcome` label of one `response_url` post, from its status (a JSON `ok:false` body
/// still counts as `ok` here: Slack took the request).
fn respond_outcome(status: reqwest::StatusCode) -> &'static str {
    match status.as_u16() {
        200..=299 => "ok",
        429 => "rate_limited",
        _ => "api_error",
    }
}

/// A 429's `Retry-After`, in whole seconds as Slack sends it.
pub(super) fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let secs: u64 = headers
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_secs(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(api_url: &str) -> SlackClient {
        SlackClient::new(&SlackSettings {
            api_url: api_url.into(),
            bot_token: Some(SecretString::from("xoxb-very-secret".to_owned())),
            signing_secret: None,
            templates_dir: None,
        })
        .unwrap()
    }

    #[test]
    fn slack_errors_read_as_sentences_without_debug_output() {
        let limited = SlackError::RateLimited {
            retry_after: Some(Duration::from_secs(30)),
        };
        assert_eq!(
            limited.to_string(),
            "Slack is rate-limiting us; try again in 30 s"
        );
        let refused = plain_transport(
            "Slack http protocol error: Some(hyper_util::client::legacy::Error(Connect, ConnectError(\"tcp connect error\", Os { code: 111, kind: ConnectionRefused, message: \"Connection refused\" })))",
        );
        assert_eq!(refused, "connection refused");
    }

    #[test]
    fn response_urls_must_point_at_slack_or_the_configured_api() {
        let prod = client("https://slack.com/api");
        assert!(
            prod.check_response_url("https://hooks.slack.com/commands/T1/2/3")
                .is_ok()
        );
        assert!(
            prod.check_response_url("http://hooks.slack.com/commands/T1/2/3")
                .is_err()
        );
        assert!(
            prod.check_response_url("https://evil.example.com/hooks")
                .is_err()
        );
        assert!(
            prod.check_response_url("https://hooks.slack.com.evil.com/x")
                .is_err()
        );
        assert!(prod.check_response_url("not a url").is_err());
        let fake = client("http://127.0.0.1:4000/api");
        assert!(
            fake.check_response_url("http://127.0.0.1:4000/hooks/a")
                .is_ok()
        );
        assert!(
            fake.check_response_url("http://127.0.0.1:4001/hooks/a")
                .is_err()
        );
    }

    #[test]
    fn the_token_stays_out_of_debug_output() {
        let shown = format!("{:?}", client("https://slack.com/api"));
        assert!(!shown.contains("very-secret"), "{shown}");
    }
}
