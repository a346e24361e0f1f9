//! Block Kit messages rendered from templates in `templates/`, one file per message.
//!
//! Each message has a typed params struct implementing [`MessageParams`]; rendering fills the
//! template with minijinja and parses the output into slack-morphism's Block Kit types, so a
//! broken template fails loudly instead of reaching Slack. Every interpolated string is
//! mrkdwn-escaped (`&`, `<`, `>`) and JSON-escaped by default; `|safe` skips only the mrkdwn
//! escaping (for ids in plain_text fields and opaque button values). Text that must reach
//! Slack as markup (Steward's own mentions next to escaped user text) is a [`Mrkdwn`] value,
//! which templates print as is.
//!
//! The templates are embedded in the binary; `STEWARD_TEMPLATES` names a directory whose files
//! override embedded ones by file name. Loading renders the messages whose parameters this
//! module knows (help, problem, working, failure, done, the fleet replies) with sample values,
//! and keeps the whole `/sandbox help` answer, which depends only on the command's name, as bytes
//! ready to send. The messages of other modules (cards, digests, modals, alerts) are rendered
//! the same way by their modules' [`SampleCheck`]s, which `startup::load_templates` runs after
//! loading: a broken override stops the start instead of failing the first message that uses
//! it. This module must not call Slack or E2B.
use std::collections::HashMap;
use std::path::Path;
use std::sync::RwLock;

use bytes::Bytes;

use minijinja::value::Value;
use minijinja::{Environment, UndefinedBehavior};
use serde::{Deserialize, Serialize};
use slack_morphism::prelude::{SlackBlock, SlackMessageAttachment, SlackMessageContent, SlackView};

use super::format::{self, MESSAGE_MAX_BLOCKS, SECTION_TEXT_MAX_CHARS};
use crate::ids::SlackUserId;

/// Mrkdwn that Steward vouches for: its own mentions and markup, with every piece of user text
/// escaped on the way in. Templates print it without escaping it again, so `<@U1>` reaches
/// Slack as a mention while a user's `<!channel>` arrives as `&lt;!channel&gt;`.
///
/// The only ways in are [`Mrkdwn::text`] (escapes), [`Mrkdwn::user`] and [`Mrkdwn::channel`]
/// (mentions of ids Steward parsed) and [`Mrkdwn::markup`] (a `'static` literal in Steward's
/// source), so no user text can become markup by accident.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Mrkdwn(String);

impl Mrkdwn {
    /// User (or any untrusted) text, escaped.
    pub fn text(text: &str) -> Self {
        Self(format::escape_mrkdwn(text))
    }

    /// Text Steward did not write (a reason, metadata, a name from E2B or a commit), as quoted
    /// data: one line in a code span, at most `max_chars`, nothing in it rendered as markup
    /// (see [`format::quoted_data`]).
    pub fn quoted(text: &str, max_chars: usize) -> Self {
        Self(format::quoted_data(text, max_chars))
    }

    /// A mention of a Slack user: `<@U…>`.
    pub fn user(user: &SlackUserId) -> Self {
        Self(format!("<@{user}>"))
    }

    /// A link to a channel: `<#C…>`. Refuses anything but a channel id's characters.
    pub fn channel(channel: &str) -> Self {
        if !channel.is_empty() && channel.chars().all(|c| c.is_ascii_alphanumeric()) {
            Self(format!("<#{channel}>"))
        } else {
            Self::text(channel)
        }
    }

    /// A link: `<url|label>` when `url` is `http(s)` with nothing that would end the link
    /// early, else the label alone (escaped).
    pub fn link(url: &str, label: &str) -> Self {
        if format::is_link_target(url) {
            Self(format!("<{url}|{}>", format::escape_mrkdwn(label)))
        } else {
            Self::text(label)
        }
    }

    /// Markup written in Steward's source, e.g. `*` or `:white_check_mark: `.
    pub fn markup(markup: &'static str) -> Self {
        Self(markup.to_owned())
    }

    /// This followed by `more`.
    pub fn and(mut self, more: impl Into<Mrkdwn>) -> Self {
        self.0.push_str(&more.into().0);
        self
    }

    /// The mrkdwn as Slack receives it.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The same words for a plain_text field (a modal's error), where markup would show as is:
    /// mentions become `@U…`, escapes turn back into characters.
    pub fn to_plain(&self) -> String {
        self.0
            .replace("<@", "@")
            .replace("<#", "#")
            .replace('>', "")
            .replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&amp;", "&")
    }
}

impl std::fmt::Display for Mrkdwn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Plain text is user text until proven otherwise: it is escaped.
impl From<&str> for Mrkdwn {
    fn from(text: &str) -> Self {
        Self::text(text)
    }
}

impl From<String> for Mrkdwn {
    fn from(text: String) -> Self {
        Self::text(&text)
    }
}

impl Serialize for Mrkdwn {
    /// Templates receive it as a safe string (printed unescaped); anything else (logs, JSON)
    /// sees the plain mrkdwn string.
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        Value::from_safe_string(self.0.clone()).serialize(serializer)
    }
}

/// The templates compiled into the binary: file name and source.
pub const EMBEDDED: &[(&str, &str)] = &[
    (
        "list_digest.json.j2",
        include_str!("../../templates/list_digest.json.j2"),
    ),
    (
        "list_exclude_modal.json.j2",
        include_str!("../../templates/list_exclude_modal.json.j2"),
    ),
    ("help.json.j2", include_str!("../../templates/help.json.j2")),
    (
        "problem.json.j2",
        include_str!("../../templates/problem.json.j2"),
    ),
    (
        "working.json.j2",
        include_str!("../../templates/working.json.j2"),
    ),
    (
        "failure.json.j2",
        include_str!("../../templates/failure.json.j2"),
    ),
    ("done.json.j2", include_str!("../../templates/done.json.j2")),
    (
        "sandbox_list.json.j2",
        include_str!("../../templates/sandbox_list.json.j2"),
    ),
    (
        "sandbox.json.j2",
        include_str!("../../templates/sandbox.json.j2"),
    ),
    (
        "sandbox_logs.json.j2",
        include_str!("../../templates/sandbox_logs.json.j2"),
    ),
    (
        "sandbox_metrics.json.j2",
        include_str!("../../templates/sandbox_metrics.json.j2"),
    ),
    ("team.json.j2", include_str!("../../templates/team.json.j2")),
    (
        "snapshots.json.j2",
        include_str!("../../templates/snapshots.json.j2"),
    ),
    (
        "templates.json.j2",
        include_str!("../../templates/templates.json.j2"),
    ),
    (
        "template.json.j2",
        include_str!("../../templates/template.json.j2"),
    ),
    (
        "sweep_digest.json.j2",
        include_str!("../../templates/sweep_digest.json.j2"),
    ),
    (
        "sweep_owner.json.j2",
        include_str!("../../templates/sweep_owner.json.j2"),
    ),
    (
        "case_card.json.j2",
        include_str!("../../templates/case_card.json.j2"),
    ),
    (
        "case_modal.json.j2",
        include_str!("../../templates/case_modal.json.j2"),
    ),
    (
        "case_history.json.j2",
        include_str!("../../templates/case_history.json.j2"),
    ),
    (
        "case_opened.json.j2",
        include_str!("../../templates/case_opened.json.j2"),
    ),
    (
        "test_failure.json.j2",
        include_str!("../../templates/test_failure.json.j2"),
    ),
    (
        "test_failure_error.json.j2",
        include_str!("../../templates/test_failure_error.json.j2"),
    ),
    (
        "push_case.json.j2",
        include_str!("../../templates/push_case.json.j2"),
    ),
    // Partials, included by the templates above.
    (
        "_case_decision.json.j2",
        include_str!("../../templates/_case_decision.json.j2"),
    ),
    (
        "_test_failure_details.json.j2",
        include_str!("../../templates/_test_failure_details.json.j2"),
    ),
];

/// Why a message could not be rendered.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error("could not read template override {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("template {name} is invalid: {source}")]
    Template {
        name: &'static str,
        #[source]
        source: minijinja::Error,
    },
    #[error("template {name} did not produce a Block Kit message: {source}")]
    Shape {
        name: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error("template {name} produced block {index}, which is not valid Block Kit: {block}")]
    NotBlockKit {
        name: &'static str,
        index: usize,
        block: String,
    },
    #[error("template {name} exceeds a Slack limit: {limit}")]
    Limit { name: &'static str, limit: String },
}

/// A message ready for Slack: fallback text (notifications, screen readers) plus blocks, and
/// optionally blocks under a coloured bar (an attachment: the only way Slack colours a message).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub text: String,
    pub blocks: Vec<SlackBlock>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<Bar>,
}

/// Blocks shown under a coloured bar below the message's own blocks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Bar {
    /// `danger`, `warning`, `good` or `#rrggbb`.
    pub color: String,
    pub blocks: Vec<SlackBlock>,
}

impl Message {
    /// A message with fallback text only, used when a template itself is broken.
    pub fn plain(text: impl Into<String>) -> Self {
        Self {
            text: format::escape_mrkdwn(&text.into()),
            blocks: Vec::new(),
            attachments: Vec::new(),
        }
    }

    /// This message as the JSON body of an immediate answer only the person who asked sees
    /// (a slash command's response), serialized straight from the typed blocks.
    pub fn ephemeral_json(&self) -> Vec<u8> {
        #[derive(Serialize)]
        struct Ephemeral<'a> {
            response_type: &'static str,
            text: &'a str,
            blocks: &'a [SlackBlock],
        }
        serde_json::to_vec(&Ephemeral {
            response_type: "ephemeral",
            text: &self.text,
            blocks: &self.blocks,
        })
        .unwrap_or_default()
    }

    pub fn into_content(self) -> SlackMessageContent {
        let content = SlackMessageContent::new()
            .with_blocks(self.blocks)
            .with_text(self.text.clone());
        if self.attachments.is_empty() {
            return content;
        }
        let bars = self
            .attachments
            .into_iter()
            .map(|bar| SlackMessageAttachment {
                id: None,
                color: Some(bar.color),
                fallback: Some(self.text.clone()),
                title: None,
                fields: None,
                mrkdwn_in: None,
                text: None,
                blocks: Some(bar.blocks),
            })
            .collect();
        content.with_attachments(bars)
    }
}

/// Parameters of one message; `TEMPLATE` names its file in `templates/`.
pub trait MessageParams: Serialize {
    const TEMPLATE: &'static str;
}

/// What the start checks put in every text field: markup and an ampersand, to be escaped.
pub const SAMPLE_TEXT: &str = "a <sample> & more";

/// A module's messages rendered from sample values (each optional part present, then absent),
/// so that a template override which breaks one of them is found when the templates load.
pub type SampleCheck = fn(&Templates) -> Result<(), RenderError>;

/// The slash command of Steward's manifest: its help is rendered when the templates load.
pub const DEFAULT_COMMAND: &str = "/sandbox";
/// How many command names keep their rendered help. Slack sends the manifest's one; any other
/// name is rendered at each request rather than letting the map grow.
const HELP_CACHE_MAX_NAMES: usize = 4;

/// The loaded template set. Cheap to share behind an `Arc`.
pub struct Templates {
    env: Environment<'static>,
    /// The whole `/sandbox help` answer (its JSON body) by command name.
    help: RwLock<HashMap<String, Bytes>>,
}

impl std::fmt::Debug for Templates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Templates").finish_non_exhaustive()
    }
}

impl Templates {
    /// The embedded templates only.
    pub fn embedded() -> Self {
        Self::load(None).expect("embedded templates compile (checked by tests)")
    }

    /// The embedded templates, each replaced by `dir/<file name>` when that file exists.
    pub fn load(dir: Option<&Path>) -> Result<Self, RenderError> {
        let mut env = Environment::new();
        env.set_undefined_behavior(UndefinedBehavior::Strict);
        env.set_formatter(|out, _state, value| {
            if value.is_none() || value.is_undefined() {
                return Ok(());
            }
            let text = value.to_string();
            let text = if value.is_safe() {
                text
            } else {
                format::escape_mrkdwn(&text)
            };
            out.write_str(&json_string_body(&text)).map_err(|e| {
                minijinja::Error::new(minijinja::ErrorKind::WriteFailure, e.to_string())
            })
        });
        // `{{ value|quoted }}` (or `|quoted(80)`): foreign text a template prints from a plain
        // string, as quoted data. The same function as [`Mrkdwn::quoted`].
        env.add_filter("quoted", |value: String, max: Option<usize>| {
            Value::from_safe_string(format::quoted_data(&value, max.unwrap_or(QUOTED_MAX_CHARS)))
        });
        for &(name, embedded) in EMBEDDED {
            let source = match dir.map(|d| d.join(name)) {
                Some(path) if path.exists() => {
                    std::fs::read_to_string(&path).map_err(|source| RenderError::Read {
                        path: path.display().to_string(),
                        source,
                    })?
                }
                _ => embedded.to_owned(),
            };
            env.add_template_owned(name, source)
                .map_err(|source| RenderError::Template { name, source })?;
        }
        let templates = Self {
            env,
            help: RwLock::default(),
        };
        templates.check_at_start()?;
        Ok(templates)
    }

    /// Renders every message whose parameters this module knows, with sample values (and
    /// keeps the default command's help). Other modules' messages are their [`SampleCheck`]s'.
    fn check_at_start(&self) -> Result<(), RenderError> {
        self.help_body(DEFAULT_COMMAND)?;
        let sample = || SAMPLE_TEXT.to_owned();
        self.render(&ProblemParams {
            command: DEFAULT_COMMAND.into(),
            problem: sample(),
        })?;
        self.render(&WorkingParams {
            command: DEFAULT_COMMAND.into(),
            input: sample(),
        })?;
        self.render(&FailureParams { sentence: sample() })?;
        self.render(&MentionFailureParams {
            sentence: Mrkdwn::text(&sample()),
        })?;
        for details in [None, Some(sample())] {
            self.render(&DoneParams {
                headline: sample(),
                details,
            })?;
        }
        self.check_fleet_replies(&sample)
    }

    /// The replies of `/sandbox list`, `get`, `logs`, `metrics`, `team`, `snapshots`,
    /// `templates` and `template`, each with every optional part present and then absent.
    fn check_fleet_replies(&self, sample: &dyn Fn() -> String) -> Result<(), RenderError> {
        let rows = || vec![sample(), sample()];
        for full in [true, false] {
            let some = |text: String| full.then_some(text);
            self.render(&SandboxListParams {
                filter: sample(),
                shown: 2,
                total_running: full.then_some(2),
                page: 1,
                table: rows(),
                next_page: some(sample()),
                next_page_action: "list_next_page",
            })?;
            self.render(&SandboxParams {
                id: sample(),
                state: sample(),
                template: sample(),
                alias: some(sample()),
                cpu_count: 2,
                memory: sample(),
                disk: some(sample()),
                started_at: sample(),
                age: sample(),
                end_at: sample(),
                ends_in: some(sample()),
                lifecycle: sample(),
                metadata: vec![KeyValue {
                    key: sample(),
                    value: sample(),
                }],
            })?;
            self.render(&SandboxLogsParams {
                id: sample(),
                filter: some(sample()),
                shown: 2,
                total: 3,
                truncated: full,
                chunks: rows(),
            })?;
            self.render(&SandboxMetricsParams {
                id: sample(),
                window: sample(),
                points: 2,
                series: vec![SeriesParams {
                    name: sample(),
                    sparkline: sample(),
                    min: sample(),
                    avg: sample(),
                    max: sample(),
                }],
            })?;
            self.render(&TeamParams {
                capacity: sample_capacity(full),
                sparkline: some(sample()),
            })?;
            self.render(&SnapshotsParams {
                sandbox: some(sample()),
                count: 2,
                table: rows(),
            })?;
            self.render(&TemplatesParams {
                count: 2,
                table: rows(),
            })?;
            self.render(&TemplateParams {
                id: sample(),
                aliases: some(sample()),
                public: sample(),
                cpu_count: 2,
                memory: sample(),
                disk: some(sample()),
                build_status: sample(),
                created_at: sample(),
                spawn_count: 3,
                last_spawned_at: some(sample()),
            })?;
        }
        Ok(())
    }

    /// The JSON body of the ephemeral `/sandbox help` answer for `command` (as typed, already
    /// cut to length): rendered once per name and kept, since nothing else changes it.
    pub fn help_reply(&self, command: &str) -> Bytes {
        let cached = self
            .help
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(command)
            .cloned();
        if let Some(body) = cached {
            return body;
        }
        self.help_body(command)
            .unwrap_or_else(|e| Bytes::from(fallback(e, HelpParams::TEMPLATE).ephemeral_json()))
    }

    fn help_body(&self, command: &str) -> Result<Bytes, RenderError> {
        let message = self.render(&HelpParams {
            command: command.to_owned(),
        })?;
        let body = Bytes::from(message.ephemeral_json());
        let mut cache = self.help.write().unwrap_or_else(|e| e.into_inner());
        if cache.len() < HELP_CACHE_MAX_NAMES {
            cache.insert(command.to_owned(), body.clone());
        }
        Ok(body)
    }

    /// Renders `params` with its template and checks the result against Block Kit and
    /// Slack's size limits.
    pub fn render<P: MessageParams>(&self, params: &P) -> Result<Message, RenderError> {
        let name = P::TEMPLATE;
        let json = self.render_raw(params)?;
        // Parsed once: the typed message is read from the same tree the checks compare with.
        let raw: serde_json::Value =
            serde_json::from_str(&json).map_err(|source| RenderError::Shape { name, source })?;
        let message =
            Message::deserialize(&raw).map_err(|source| RenderError::Shape { name, source })?;
        check_limits(name, &raw, &message)?;
        Ok(message)
    }

    /// Renders a modal (or other view) template into slack-morphism's view type.
    pub fn render_view<P: MessageParams>(&self, params: &P) -> Result<SlackView, RenderError> {
        let name = P::TEMPLATE;
        let json = self.render_raw(params)?;
        let raw: serde_json::Value =
            serde_json::from_str(&json).map_err(|source| RenderError::Shape { name, source })?;
        let view =
            SlackView::deserialize(&raw).map_err(|source| RenderError::Shape { name, source })?;
        // As for messages: a block that does not survive the round trip is not Block Kit.
        let back = serde_json::to_value(&view).unwrap_or_default();
        for (index, raw_block) in raw["blocks"].as_array().into_iter().flatten().enumerate() {
            if back["blocks"].get(index) != Some(raw_block) {
                return Err(RenderError::NotBlockKit {
                    name,
                    index,
                    block: raw_block.to_string(),
                });
            }
        }
        Ok(view)
    }

    fn render_raw<P: MessageParams>(&self, params: &P) -> Result<String, RenderError> {
        let name = P::TEMPLATE;
        let template = self
            .env
            .get_template(name)
            .map_err(|source| RenderError::Template { name, source })?;
        template
            .render(Value::from(minijinja::value::Serde(params)))
            .map_err(|source| RenderError::Template { name, source })
    }

    /// Like [`render`](Self::render), but a broken template degrades to a plain sentence
    /// (and a logged error) instead of leaving the user without an answer.
    pub fn render_or_plain<P: MessageParams>(&self, params: &P) -> Message {
        self.render(params)
            .unwrap_or_else(|e| fallback(e, P::TEMPLATE))
    }
}

/// The plain sentence shown instead of a message that could not be rendered (logged).
fn fallback(e: RenderError, template: &str) -> Message {
    match e {
        // Too long for Slack is about the input or the data, not a broken template.
        RenderError::Limit { .. } => {
            tracing::warn!(error = %e, "a reply was too long for Slack");
            Message::plain(
                "That answer would be longer than Slack allows; ask for less (a shorter text, a filter or a limit).",
            )
        }
        e => {
            tracing::error!(error = %e, "message template failed");
            Message::plain(format!(
                "Steward could not format this reply (template {template} is broken); an operator has to fix it."
            ))
        }
    }
}

/// A string's JSON encoding without the surrounding quotes, so templates can interpolate
/// inside string literals.
fn json_string_body(text: &str) -> String {
    let quoted = serde_json::to_string(text).unwrap_or_default();
    quoted[1..quoted.len() - 1].to_owned()
}

fn check_limits(
    name: &'static str,
    raw: &serde_json::Value,
    message: &Message,
) -> Result<(), RenderError> {
    let count = message.blocks.len()
        + message
            .attachments
            .iter()
            .map(|b| b.blocks.len())
            .sum::<usize>();
    if count > MESSAGE_MAX_BLOCKS {
        return Err(RenderError::Limit {
            name,
            limit: format!("{count} blocks (at most {MESSAGE_MAX_BLOCKS})"),
        });
    }
    let mut raw_blocks = raw["blocks"].as_array().cloned().unwrap_or_default();
    let mut typed_blocks: Vec<&SlackBlock> = message.blocks.iter().collect();
    for (index, bar) in message.attachments.iter().enumerate() {
        raw_blocks.extend(
            raw["attachments"][index]["blocks"]
                .as_array()
                .cloned()
                .unwrap_or_default(),
        );
        typed_blocks.extend(bar.blocks.iter());
    }
    // slack-morphism parses blocks leniently (unknown shapes land in `Unknown`, unknown fields
    // are dropped), so a block only counts as valid if it survives a round trip unchanged.
    for (index, (typed, raw_block)) in typed_blocks.into_iter().zip(&raw_blocks).enumerate() {
        let back = serde_json::to_value(typed).unwrap_or_default();
        if matches!(typed, SlackBlock::Unknown(_)) || &back != raw_block {
            return Err(RenderError::NotBlockKit {
                name,
                index,
                block: raw_block.to_string(),
            });
        }
    }
    // Section texts are checked on the raw JSON so every kind of block is covered alike.
    for block in &raw_blocks {
        if let Some(text) = block["text"]["text"].as_str() {
            let len = text.chars().count();
            if len > SECTION_TEXT_MAX_CHARS {
                return Err(RenderError::Limit {
                    name,
                    limit: format!("a text of {len} characters (at most {SECTION_TEXT_MAX_CHARS})"),
                });
            }
        }
    }
    Ok(())
}

/// Declares a params struct's template.
macro_rules! message {
    ($ty:ty, $file:literal) => {
        impl MessageParams for $ty {
            const TEMPLATE: &'static str = $file;
        }
    };
}

/// `/sandbox help`.
#[derive(Debug, Serialize)]
pub struct HelpParams {
    /// The slash command as the user typed it, e.g. `/sandbox`.
    pub command: String,
}
message!(HelpParams, "help.json.j2");

/// Input we could not understand.
#[derive(Debug, Serialize)]
pub struct ProblemParams {
    pub command: String,
    pub problem: String,
}
message!(ProblemParams, "problem.json.j2");

/// The immediate answer to a command that needs E2B.
#[derive(Debug, Serialize)]
pub struct WorkingParams {
    pub command: String,
    pub input: String,
}
message!(WorkingParams, "working.json.j2");

/// A command that failed, as one sentence (escaped whole: it may quote user input).
#[derive(Debug, Serialize)]
pub struct FailureParams {
    pub sentence: String,
}
message!(FailureParams, "failure.json.j2");

/// The same message for a sentence that names people ("Already decided by <@U1>"): Steward's
/// own mrkdwn, so its mentions render while the user text in it stays escaped.
#[derive(Debug, Serialize)]
pub struct MentionFailureParams {
    pub sentence: Mrkdwn,
}
message!(MentionFailureParams, "failure.json.j2");

/// A direct action that succeeded.
#[derive(Debug, Serialize)]
pub struct DoneParams {
    pub headline: String,
    pub details: Option<String>,
}
message!(DoneParams, "done.json.j2");

/// A result whose headline carries Steward's own mentions (a channel link), which must render.
#[derive(Debug, Serialize)]
pub struct MentionDoneParams {
    pub headline: Mrkdwn,
    pub details: Option<String>,
}
message!(MentionDoneParams, "done.json.j2");

/// `/sandbox list`.
#[derive(Debug, Serialize)]
pub struct SandboxListParams {
    /// What was asked for, e.g. `running · template=base`.
    pub filter: String,
    pub shown: usize,
    pub total_running: Option<u64>,
    /// 1-based page number.
    pub page: u32,
    /// Table text, one chunk per section.
    pub table: Vec<String>,
    /// The opaque button value for the next page, when there is one.
    pub next_page: Option<String>,
    pub next_page_action: &'static str,
}
message!(SandboxListParams, "sandbox_list.json.j2");

/// One metadata entry.
#[derive(Debug, Clone, Serialize)]
pub struct KeyValue {
    pub key: String,
    pub value: String,
}

/// One field of a card (`*key*` over the value): the value is mrkdwn, so Steward's own words
/// ([`Mrkdwn::text`]) and someone else's ([`Mrkdwn::quoted`]) can sit side by side.
#[derive(Debug, Clone, Serialize)]
pub struct Field {
    pub key: String,
    pub value: Mrkdwn,
}

/// How much of one piece of foreign text a template's `quoted` filter shows by default.
pub const QUOTED_MAX_CHARS: usize = 300;

/// `/sandbox get`.
#[derive(Debug, Serialize)]
pub struct SandboxParams {
    pub id: String,
    pub state: String,
    pub template: String,
    pub alias: Option<String>,
    pub cpu_count: u32,
    pub memory: String,
    pub disk: Option<String>,
    pub started_at: String,
    pub age: String,
    pub end_at: String,
    pub ends_in: Option<String>,
    pub lifecycle: String,
    pub metadata: Vec<KeyValue>,
}
message!(SandboxParams, "sandbox.json.j2");

/// `/sandbox logs`.
#[derive(Debug, Serialize)]
pub struct SandboxLogsParams {
    pub id: String,
    pub filter: Option<String>,
    pub shown: usize,
    pub total: usize,
    pub truncated: bool,
    pub chunks: Vec<String>,
}
message!(SandboxLogsParams, "sandbox_logs.json.j2");

/// One resource's series in `/sandbox metrics`.
#[derive(Debug, Serialize)]
pub struct SeriesParams {
    pub name: String,
    pub sparkline: String,
    pub min: String,
    pub avg: String,
    pub max: String,
}

/// `/sandbox metrics`.
#[derive(Debug, Serialize)]
pub struct SandboxMetricsParams {
    pub id: String,
    pub window: String,
    pub points: usize,
    pub series: Vec<SeriesParams>,
}
message!(SandboxMetricsParams, "sandbox_metrics.json.j2");

/// The team's capacity over a window: shown by `/sandbox team` and in the sweep's digest.
#[derive(Debug, Clone, Serialize)]
pub struct CapacityParams {
    pub window: String,
    pub concurrent_now: u64,
    pub concurrent_peak: u64,
    pub peak_at: Option<String>,
    pub start_rate: String,
    pub start_rate_peak: String,
}

/// Capacity figures made of sample text, with the peak's time (`full`) or without, for the
/// start checks of the team reply and the sweep digest.
pub fn sample_capacity(full: bool) -> CapacityParams {
    CapacityParams {
        window: SAMPLE_TEXT.to_owned(),
        concurrent_now: 1,
        concurrent_peak: 2,
        peak_at: full.then(|| SAMPLE_TEXT.to_owned()),
        start_rate: SAMPLE_TEXT.to_owned(),
        start_rate_peak: SAMPLE_TEXT.to_owned(),
    }
}

/// `/sandbox team`.
#[derive(Debug, Serialize)]
pub struct TeamParams {
    #[serde(flatten)]
    pub capacity: CapacityParams,
    pub sparkline: Option<String>,
}
message!(TeamParams, "team.json.j2");

/// `/sandbox snapshots`.
#[derive(Debug, Serialize)]
pub struct SnapshotsParams {
    pub sandbox: Option<String>,
    pub count: usize,
    pub table: Vec<String>,
}
message!(SnapshotsParams, "snapshots.json.j2");

/// `/sandbox templates`.
#[derive(Debug, Serialize)]
pub struct TemplatesParams {
    pub count: usize,
    pub table: Vec<String>,
}
message!(TemplatesParams, "templates.json.j2");

/// `/sandbox template`.
#[derive(Debug, Serialize)]
pub struct TemplateParams {
    pub id: String,
    pub aliases: Option<String>,
    pub public: String,
    pub cpu_count: u32,
    pub memory: String,
    pub disk: Option<String>,
    pub build_status: String,
    pub created_at: String,
    pub spawn_count: u64,
    pub last_spawned_at: Option<String>,
}
message!(TemplateParams, "template.json.j2");

#[cfg(test)]
mod tests {
    use super::*;

    fn render<P: MessageParams>(p: &P) -> serde_json::Value {
        let message = Templates::embedded().render(p).unwrap();
        serde_json::to_value(message).unwrap()
    }

    fn table(rows: &[&[&str]]) -> Vec<String> {
        let rows: Vec<Vec<String>> = rows
            .iter()
            .map(|r| r.iter().map(|c| c.to_string()).collect())
            .collect();
        format::table(&["id", "template", "state"], &rows, 40)
    }

    #[test]
    fn help_lists_every_subcommand() {
        let json = render(&HelpParams {
            command: "/sandbox".into(),
        });
        let text = json.to_string();
        for verb in [
            "list",
            "get",
            "logs",
            "metrics",
            "team",
            "pause",
            "resume",
            "timeout",
            "refresh",
            "snapshot ",
            "snapshots",
            "templates",
            "template <id>",
            "kill",
            "delete-template",
            "sweep",
        ] {
            assert!(
                text.contains(&format!("/sandbox {verb}")),
                "help lacks {verb}"
            );
        }
        insta::assert_json_snapshot!("help", json);
    }

    #[test]
    fn problem_and_working_and_failure_render() {
        insta::assert_json_snapshot!(
            "problem",
            render(&ProblemParams {
                command: "/sandbox".into(),
                problem: "I don't know the subcommand `destroy`.".into()
            })
        );
        insta::assert_json_snapshot!(
            "working",
            render(&WorkingParams {
                command: "/sandbox".into(),
                input: "list running".into()
            })
        );
        insta::assert_json_snapshot!(
            "failure",
            render(&FailureParams {
                sentence: "E2B is rate-limiting us; try again in 4 s.".into()
            })
        );
    }

    #[test]
    fn done_renders_with_and_without_details() {
        insta::assert_json_snapshot!(
            "done",
            render(&DoneParams {
                headline: "Paused `i1`.".into(),
                details: Some("Resume it with `/sandbox resume i1`.".into())
            })
        );
        insta::assert_json_snapshot!(
            "done_without_details",
            render(&DoneParams {
                headline: "Refreshed `i1`.".into(),
                details: None
            })
        );
    }

    #[test]
    fn list_renders_a_table_and_a_next_page_button() {
        let params = SandboxListParams {
            filter: "running · template=base".into(),
            shown: 2,
            total_running: Some(7),
            page: 1,
            table: table(&[&["i1", "base", "running"], &["i2", "base", "running"]]),
            next_page: Some(r#"{"n":"tok&1","s":"running"}"#.into()),
            next_page_action: "list_next_page",
        };
        let json = render(&params);
        let button = &json["blocks"][2]["elements"][0];
        assert_eq!(button["action_id"], "list_next_page");
        assert_eq!(button["value"], r#"{"n":"tok&1","s":"running"}"#);
        insta::assert_json_snapshot!("sandbox_list", json);
        let empty = SandboxListParams {
            shown: 0,
            table: vec![],
            next_page: None,
            total_running: None,
            ..params
        };
        insta::assert_json_snapshot!("sandbox_list_empty", render(&empty));
    }

    #[test]
    fn sandbox_details_render_with_escaped_metadata() {
        let json = render(&SandboxParams {
            id: "i1".into(),
            state: "running".into(),
            template: "base".into(),
            alias: Some("python".into()),
            cpu_count: 2,
            memory: "512 MiB".into(),
            disk: Some("1 GiB".into()),
            started_at: "2025-01-01 10:00 UTC".into(),
            age: "2 h 5 min".into(),
            end_at: "2025-01-01 13:00 UTC".into(),
            ends_in: Some("55 min".into()),
            lifecycle: "pauses on timeout; auto-resume off".into(),
            metadata: vec![KeyValue {
                key: "owner".into(),
                value: "<@U1> & \"friends\"".into(),
            }],
        });
        let text = json.to_string();
        assert!(text.contains("&lt;@U1&gt; &amp; \\\"friends\\\""), "{text}");
        insta::assert_json_snapshot!("sandbox", json);
    }

    #[test]
    fn logs_metrics_and_team_render() {
        insta::assert_json_snapshot!(
            "sandbox_logs",
            render(&SandboxLogsParams {
                id: "i1".into(),
                filter: Some("level ≥ warn".into()),
                shown: 2,
                total: 2,
                truncated: false,
                chunks: vec!["10:00:02 WARN disk <90%>\n10:00:01 ERROR boom".into()],
            })
        );
        insta::assert_json_snapshot!(
            "sandbox_metrics",
            render(&SandboxMetricsParams {
                id: "i1".into(),
                window: "2 h".into(),
                points: 3,
                series: vec![SeriesParams {
                    name: "CPU".into(),
                    sparkline: format::sparkline(&[1.0, 50.0, 99.0], 0.0, 100.0, 40),
                    min: "1 %".into(),
                    avg: "50 %".into(),
                    max: "99 %".into(),
                }],
            })
        );
        insta::assert_json_snapshot!(
            "team",
            render(&TeamParams {
                capacity: CapacityParams {
                    window: "1 d".into(),
                    concurrent_now: 3,
                    concurrent_peak: 9,
                    peak_at: Some("2025-01-01 12:00 UTC".into()),
                    start_rate: "720 (30.0 an hour on average)".into(),
                    start_rate_peak:
                        "4.0 a minute in the busiest 5 min (E2B's step for this window)".into(),
                },
                sparkline: Some("▁▃█▅".into()),
            })
        );
    }

    #[test]
    fn snapshot_and_template_listings_render() {
        insta::assert_json_snapshot!(
            "snapshots",
            render(&SnapshotsParams {
                sandbox: Some("i1".into()),
                count: 1,
                table: table(&[&["team/snap:default", "i1", "ready"]])
            })
        );
        insta::assert_json_snapshot!(
            "snapshots_empty",
            render(&SnapshotsParams {
                sandbox: None,
                count: 0,
                table: vec![]
            })
        );
        insta::assert_json_snapshot!(
            "templates",
            render(&TemplatesParams {
                count: 1,
                table: table(&[&["base", "python", "ready"]])
            })
        );
        insta::assert_json_snapshot!(
            "template",
            render(&TemplateParams {
                id: "base".into(),
                aliases: Some("python, py".into()),
                public: "no".into(),
                cpu_count: 2,
                memory: "512 MiB".into(),
                disk: None,
                build_status: "ready".into(),
                created_at: "2025-01-01 10:00 UTC".into(),
                spawn_count: 12,
                last_spawned_at: None,
            })
        );
    }

    #[test]
    fn an_override_directory_replaces_a_template_by_file_name() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("failure.json.j2"),
            r#"{"text": "custom: {{ sentence }}", "blocks": []}"#,
        )
        .unwrap();
        let templates = Templates::load(Some(dir.path())).unwrap();
        let m = templates
            .render(&FailureParams {
                sentence: "a<b".into(),
            })
            .unwrap();
        assert_eq!(m.text, "custom: a&lt;b");
        // Other templates stay the embedded ones.
        assert!(
            templates
                .render(&HelpParams {
                    command: "/sandbox".into()
                })
                .is_ok()
        );
    }

    #[test]
    fn a_broken_override_of_a_message_checked_at_start_stops_the_load() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("failure.json.j2"),
            r#"{"text": "x", "blocks": [{"type": "section", "text": 42}]}"#,
        )
        .unwrap();
        let err = Templates::load(Some(dir.path())).unwrap_err();
        assert!(
            matches!(
                err,
                RenderError::NotBlockKit {
                    name: "failure.json.j2",
                    ..
                }
            ),
            "{err}"
        );
        std::fs::remove_file(dir.path().join("failure.json.j2")).unwrap();
        std::fs::write(
            dir.path().join("help.json.j2"),
            r#"{"text": "x", "blocks": [{"type": "nonsense"}]}"#,
        )
        .unwrap();
        let err = Templates::load(Some(dir.path())).unwrap_err();
        assert!(
            matches!(
                err,
                RenderError::NotBlockKit {
                    name: "help.json.j2",
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn a_template_that_is_not_block_kit_fails_to_render() {
        // Another module's template (its parameters are the caller's) is checked when rendered.
        #[derive(Serialize)]
        struct Pushed {
            title: String,
        }
        impl MessageParams for Pushed {
            const TEMPLATE: &'static str = "push_case.json.j2";
        }
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("push_case.json.j2"),
            r#"{"text": "x", "blocks": [{"type": "section", "text": 42}]}"#,
        )
        .unwrap();
        let templates = Templates::load(Some(dir.path())).unwrap();
        let params = || Pushed { title: "t".into() };
        let err = templates.render(&params()).unwrap_err();
        assert!(matches!(err, RenderError::NotBlockKit { .. }), "{err}");
        let fallback = templates.render_or_plain(&params());
        assert!(fallback.text.contains("push_case.json.j2"));
    }

    #[test]
    fn a_broken_override_of_a_fleet_reply_stops_the_load() {
        // Not Block Kit, and a variable the reply's parameters do not have (strict undefined).
        for (file, text) in [
            (
                "team.json.j2",
                r#"{"text": "x", "blocks": [{"type": "section", "text": 42}]}"#,
            ),
            (
                "sandbox.json.j2",
                r#"{"text": "{{ sandbox_name }}", "blocks": []}"#,
            ),
        ] {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join(file), text).unwrap();
            let err = Templates::load(Some(dir.path()))
                .err()
                .unwrap_or_else(|| panic!("{file} loaded"));
            assert!(err.to_string().contains(file), "{file}: {err}");
        }
    }

    #[test]
    fn the_help_answer_is_the_rendered_help_as_an_ephemeral_reply_for_each_name() {
        let templates = Templates::embedded();
        for command in [DEFAULT_COMMAND, "/sbx", "/sbx"] {
            let body: serde_json::Value =
                serde_json::from_slice(&templates.help_reply(command)).unwrap();
            let message = templates
                .render(&HelpParams {
                    command: command.into(),
                })
                .unwrap();
            assert_eq!(body["response_type"], "ephemeral");
            assert_eq!(body["text"], message.text.as_str());
            assert_eq!(
                body["blocks"],
                serde_json::to_value(&message.blocks).unwrap()
            );
        }
        // Names past the cap are still answered, only not kept.
        for i in 0..HELP_CACHE_MAX_NAMES + 2 {
            let body = templates.help_reply(&format!("/s{i}"));
            assert!(String::from_utf8_lossy(&body).contains(&format!("/s{i} list")));
        }
        assert_eq!(templates.help.read().unwrap().len(), HELP_CACHE_MAX_NAMES);
    }

    #[test]
    fn trusted_mrkdwn_keeps_stewards_mentions_and_escapes_the_user_text_in_it() {
        let user = SlackUserId::parse("U01BOB").unwrap();
        let sentence = Mrkdwn::text("Already decided by ")
            .and(Mrkdwn::user(&user))
            .and(Mrkdwn::text(": <!channel> & co."))
            .and(Mrkdwn::markup(" See "))
            .and(Mrkdwn::channel("C0HYGIENE"));
        let json = render(&MentionFailureParams { sentence });
        assert_eq!(
            json["blocks"][0]["text"]["text"],
            ":warning: Already decided by <@U01BOB>: &lt;!channel&gt; &amp; co. See <#C0HYGIENE>"
        );
        // The same words as a String are user text: escaped whole.
        let json = render(&FailureParams {
            sentence: "Already decided by <@U01BOB>".to_owned(),
        });
        assert_eq!(
            json["blocks"][0]["text"]["text"],
            ":warning: Already decided by &lt;@U01BOB&gt;"
        );
        // Something that is not a channel id does not become a link.
        assert_eq!(Mrkdwn::channel("C1> <!here").as_str(), "C1&gt; &lt;!here");
        // For plain_text fields (modal errors) the mentions become readable ids.
        let plain = Mrkdwn::text("by ")
            .and(Mrkdwn::user(&user))
            .and(Mrkdwn::text(" (a<b)"));
        assert_eq!(plain.to_plain(), "by @U01BOB (a<b)");
    }

    #[test]
    fn oversized_sections_are_refused() {
        let err = Templates::embedded()
            .render(&FailureParams {
                sentence: "x".repeat(SECTION_TEXT_MAX_CHARS + 1),
            })
            .unwrap_err();
        assert!(matches!(err, RenderError::Limit { .. }), "{err}");
    }
}
