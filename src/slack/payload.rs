//! What Slack sends us: slash-command forms, interaction payloads, Events API envelopes, and
//! the `action_id`s our buttons carry.
//!
//! Types here are parsed only from bodies whose signature was already verified. Only the fields
//! Steward uses are modelled; everything else is ignored. This module must not do I/O.
use serde::{Deserialize, Serialize};

use std::borrow::Cow;
use std::collections::HashMap;

use crate::cases::DecisionOption;
use crate::ids::{CaseId, ListId, SlackChannelId, SlackUserId};

/// `action_id` of the "Next page" button under `/sandbox list`.
pub const LIST_NEXT_PAGE: &str = "list_next_page";
/// Prefix of a case card's option buttons: `case_<option>`, e.g. `case_snapshot_then_kill`.
/// The button's `value` is the case id.
pub const CASE_OPTION_PREFIX: &str = "case_";
/// `action_id` of the Retry button on a failed case (value: the case id).
pub const CASE_RETRY: &str = "case_retry";
/// Restore on a card whose Snapshot, then kill finished: start the sandbox again from its snapshot.
pub const CASE_RESTORE: &str = "case_restore";
/// Keep longer under a restored sandbox: its E2B timeout again (value: the case id).
pub const CASE_KEEP_LONGER: &str = "case_keep_longer";
/// The buttons of a sweep's list decision. A group's button value is `<list id>:<group index>`;
/// Approve all's is the list id.
pub const SWEEP_LIST_APPROVE: &str = "sweep_list_approve";
pub const SWEEP_LIST_APPROVE_ALL: &str = "sweep_list_approve_all";
pub const SWEEP_LIST_REVIEW: &str = "sweep_list_review";
pub const SWEEP_LIST_EXCLUDE: &str = "sweep_list_exclude";
pub const SWEEP_LIST_RETRY: &str = "sweep_list_retry";
/// A choice on a group that offers several (a burst alert's Pause all, Kill all, Leave); its
/// value is `<list id>:<group index>:<option>`.
pub const SWEEP_LIST_CHOOSE: &str = "sweep_list_choose";
/// `callback_id` of the modal that excludes sandboxes from a list's group.
pub const SWEEP_LIST_EXCLUDE_MODAL: &str = "sweep_list_exclude";
/// `action_id` of the exclude modal's checkboxes (block ids `pick_<n>`), paste box and date.
pub const SWEEP_LIST_PICK_ACTION: &str = "pick";
pub const SWEEP_LIST_PASTE_BLOCK: &str = "paste";
pub const SWEEP_LIST_PASTE_ACTION: &str = "paste_ids";
/// `callback_id` of the modal that asks for a decision's reason.
pub const CASE_REASON_MODAL: &str = "case_reason";
/// `block_id` and `action_id` of the reason input in that modal.
pub const CASE_REASON_BLOCK: &str = "reason";
pub const CASE_REASON_ACTION: &str = "reason_text";
/// `block_id` and `action_id` of the optional "don't ask again before" date.
pub const CASE_UNTIL_BLOCK: &str = "until";
pub const CASE_UNTIL_ACTION: &str = "until_date";

/// The `action_id` of the button for `option` on a case card.
pub fn case_option_action_id(option: DecisionOption) -> String {
    format!("{CASE_OPTION_PREFIX}{}", option.as_str())
}

/// Why a payload could not be understood.
#[derive(Debug, thiserror::Error)]
pub enum PayloadError {
    #[error("the slash-command form is missing or malformed: {0}")]
    Command(String),
    #[error("the interaction form has no `payload` field")]
    NoInteractionPayload,
    #[error("the interaction payload is not valid JSON: {0}")]
    Interaction(#[source] serde_json::Error),
    #[error("the interaction payload is not UTF-8 text")]
    InteractionNotUtf8,
    #[error("the event body is not valid JSON: {0}")]
    Event(#[source] serde_json::Error),
}

/// A slash-command invocation: a form over HTTP ([`CommandForm::parse`]), a JSON object in a
/// Socket Mode envelope (`Deserialize`).
#[derive(Debug, Clone, Deserialize)]
pub struct CommandForm {
    pub command: String,
    #[serde(default)]
    pub text: String,
    pub user_id: SlackUserId,
    pub channel_id: SlackChannelId,
    #[serde(default)]
    pub team_id: Option<String>,
    pub response_url: String,
    #[serde(default)]
    pub trigger_id: Option<String>,
}

impl CommandForm {
    /// The form fields Steward reads, in the order `parse` numbers them.
    const FIELDS: [&'static str; 7] = [
        "command",
        "text",
        "user_id",
        "channel_id",
        "team_id",
        "response_url",
        "trigger_id",
    ];

    /// Reads the fields Steward uses and ignores the rest. A field given twice, a missing
    /// `command`, `user_id`, `channel_id` or `response_url`, or an id that does not parse is an
    /// error. (Read by hand rather than through serde_urlencoded: this is every command's first
    /// step, and only the seven fields below are decoded.)
    pub fn parse(body: &[u8]) -> Result<Self, PayloadError> {
        let mut fields: [Option<String>; 7] = Default::default();
        for (name, value) in super::form::pairs(body) {
            let at = match super::form::decode(name).as_ref() {
                b"command" => 0,
                b"text" => 1,
                b"user_id" => 2,
                b"channel_id" => 3,
                b"team_id" => 4,
                b"response_url" => 5,
                b"trigger_id" => 6,
                _ => continue,
            };
            if fields[at].is_some() {
                return Err(PayloadError::Command(format!(
                    "duplicate field `{}`",
                    Self::FIELDS[at]
                )));
            }
            fields[at] = Some(text(super::form::decode(value)));
        }
        let [
            command,
            text,
            user_id,
            channel_id,
            team_id,
            response_url,
            trigger_id,
        ] = fields;
        let missing = |name: &str| PayloadError::Command(format!("missing field `{name}`"));
        let invalid = |e: crate::ids::IdError| PayloadError::Command(e.to_string());
        Ok(Self {
            command: command.ok_or_else(|| missing("command"))?,
            text: text.unwrap_or_default(),
            user_id: SlackUserId::parse(user_id.ok_or_else(|| missing("user_id"))?)
                .map_err(invalid)?,
            channel_id: SlackChannelId::parse(channel_id.ok_or_else(|| missing("channel_id"))?)
                .map_err(invalid)?,
            team_id,
            response_url: response_url.ok_or_else(|| missing("response_url"))?,
            trigger_id,
        })
    }
}

/// A decoded form value as text, invalid UTF-8 replaced; copied only when it was borrowed.
fn text(bytes: Cow<'_, [u8]>) -> String {
    match bytes {
        Cow::Borrowed(b) => String::from_utf8_lossy(b).into_owned(),
        Cow::Owned(v) => String::from_utf8(v)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()),
    }
}

/// Whether a form body is exactly Slack's certificate probe (`ssl_check=1`, optionally with the
/// legacy `token`) and nothing else. Those are answered without a signature check, as Bolt
/// does; any other field makes it an ordinary request that must be signed.
pub fn is_ssl_check(body: &[u8]) -> bool {
    let mut ssl_check = false;
    // Names first: an interaction's `payload` is not decoded just to learn it is no probe.
    for (key, value) in super::form::pairs(body) {
        match super::form::decode(key).as_ref() {
            b"ssl_check" if super::form::decode(value).as_ref() == b"1" && !ssl_check => {
                ssl_check = true
            }
            b"token" => {}
            _ => return false,
        }
    }
    ssl_check
}

/// An interaction (button click, ...). Only `block_actions` is acted upon today.
#[derive(Debug, Clone, Deserialize)]
pub struct Interaction {
    #[serde(rename = "type")]
    pub kind: String,
    pub user: InteractionUser,
    #[serde(default)]
    pub response_url: Option<String>,
    #[serde(default)]
    pub trigger_id: Option<String>,
    #[serde(default)]
    pub channel: Option<InteractionChannel>,
    #[serde(default)]
    pub container: Option<Container>,
    #[serde(default)]
    pub actions: Vec<BlockAction>,
    /// The submitted modal of a `view_submission`.
    #[serde(default)]
    pub view: Option<ViewPayload>,
}

/// A modal as submitted: where it came from and what was typed.
#[derive(Debug, Clone, Deserialize)]
pub struct ViewPayload {
    pub id: String,
    #[serde(default)]
    pub callback_id: String,
    #[serde(default)]
    pub private_metadata: String,
    #[serde(default)]
    pub hash: Option<String>,
    #[serde(default)]
    pub state: ViewState,
}

/// `view.state`: block id -> action id -> value.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ViewState {
    #[serde(default)]
    pub values: HashMap<String, HashMap<String, InputValue>>,
}

/// One input's value: text inputs fill `value`, date pickers `selected_date` (YYYY-MM-DD).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct InputValue {
    #[serde(default)]
    pub value: Option<String>,
    #[serde(default)]
    pub selected_date: Option<String>,
    /// Checkboxes: the options ticked.
    #[serde(default)]
    pub selected_options: Vec<SelectedOption>,
}

/// One ticked checkbox.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct SelectedOption {
    pub value: String,
}

impl ViewPayload {
    /// The input at `block`/`action`, if the modal had one.
    pub fn input(&self, block: &str, action: &str) -> Option<&InputValue> {
        self.state.values.get(block)?.get(action)
    }
}

/// What a reason modal carries in `private_metadata` so its submission finds the case.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModalMetadata {
    #[serde(rename = "c")]
    pub case_id: CaseId,
    #[serde(rename = "o")]
    pub option: DecisionOption,
}

impl ModalMetadata {
    pub fn encode(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    pub fn decode(text: &str) -> Option<Self> {
        serde_json::from_str(text).ok()
    }
}

impl Interaction {
    /// The channel and `ts` of the message the clicked element sits on (the container's, the
    /// channel falling back to the interaction's).
    pub fn clicked_message(&self) -> (Option<&str>, Option<&str>) {
        let container = self.container.as_ref();
        let channel = container
            .and_then(|c| c.channel_id.as_deref())
            .or_else(|| self.channel.as_ref().map(|c| c.id.as_str()));
        (channel, container.and_then(|c| c.message_ts.as_deref()))
    }

    /// Parses the `payload=<json>` form Slack posts to the interactivity URL.
    pub fn parse(body: &[u8]) -> Result<Self, PayloadError> {
        // One pass decodes the field. The whole text is checked to be UTF-8 once, here, so
        // serde_json reads it as a `str` and does not check each string it reads again.
        let payload =
            super::form::field(body, "payload").ok_or(PayloadError::NoInteractionPayload)?;
        let text = std::str::from_utf8(&payload).map_err(|_| PayloadError::InteractionNotUtf8)?;
        serde_json::from_str(text).map_err(PayloadError::Interaction)
    }
}

#[derive(Debug, Clone, Deserialize)]
pub struct InteractionUser {
    pub id: SlackUserId,
}

#[derive(Debug, Clone, Deserialize)]
pub struct InteractionChannel {
    pub id: SlackChannelId,
}

/// Where the clicked component lives.
#[derive(Debug, Clone, Deserialize)]
pub struct Container {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub message_ts: Option<String>,
    #[serde(default)]
    pub channel_id: Option<String>,
    #[serde(default)]
    pub is_ephemeral: Option<bool>,
}

/// One clicked element.
#[derive(Debug, Clone, Deserialize)]
pub struct BlockAction {
    pub action_id: String,
    #[serde(default)]
    pub block_id: Option<String>,
    #[serde(default)]
    pub value: Option<String>,
    /// When Slack saw the click; with the user it identifies one click across redeliveries.
    #[serde(default)]
    pub action_ts: Option<String>,
}

/// What a click asks for, dispatched in one `match` by the interactions handler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// "Next page" under `/sandbox list`.
    ListNextPage(ListCursor),
    /// An option button on a case card.
    CaseOption {
        case_id: CaseId,
        option: DecisionOption,
    },
    /// Retry on a failed case.
    CaseRetry { case_id: CaseId },
    /// Restore on a case whose Snapshot, then kill finished.
    CaseRestore { case_id: CaseId },
    /// Keep longer under a sandbox restored from a case's snapshot.
    CaseKeepLonger { case_id: CaseId },
    /// A button of a sweep's list decision.
    List {
        button: ListButton,
        list: ListId,
        group: Option<usize>,
    },
    /// An `action_id` we do not (yet) handle, or a value we cannot read.
    Unknown { action_id: String },
}

impl Action {
    pub fn from_block_action(action: &BlockAction) -> Self {
        let unknown = || Self::Unknown {
            action_id: action.action_id.clone(),
        };
        let case_id = || action.value.as_deref().and_then(|v| CaseId::parse(v).ok());
        match action.action_id.as_str() {
            CASE_RETRY => case_id()
                .map(|case_id| Self::CaseRetry { case_id })
                .unwrap_or_else(unknown),
            CASE_RESTORE => case_id()
                .map(|case_id| Self::CaseRestore { case_id })
                .unwrap_or_else(unknown),
            CASE_KEEP_LONGER => case_id()
                .map(|case_id| Self::CaseKeepLonger { case_id })
                .unwrap_or_else(unknown),
            id if id.starts_with(CASE_OPTION_PREFIX) => {
                match (
                    DecisionOption::parse(&id[CASE_OPTION_PREFIX.len()..]),
                    case_id(),
                ) {
                    (Some(option), Some(case_id)) => Self::CaseOption { case_id, option },
                    _ => unknown(),
                }
            }
            SWEEP_LIST_APPROVE
            | SWEEP_LIST_APPROVE_ALL
            | SWEEP_LIST_REVIEW
            | SWEEP_LIST_EXCLUDE
            | SWEEP_LIST_RETRY => {
                let button = match action.action_id.as_str() {
                    SWEEP_LIST_APPROVE => ListButton::Approve,
                    SWEEP_LIST_APPROVE_ALL => ListButton::ApproveAll,
                    SWEEP_LIST_REVIEW => ListButton::Review,
                    SWEEP_LIST_EXCLUDE => ListButton::Exclude,
                    _ => ListButton::Retry,
                };
                match action.value.as_deref().and_then(ListTarget::decode) {
                    Some(ListTarget { list, group })
                        if group.is_some() == (button != ListButton::ApproveAll) =>
                    {
                        Self::List {
                            button,
                            list,
                            group,
                        }
                    }
                    _ => unknown(),
                }
            }
            SWEEP_LIST_CHOOSE => action
                .value
                .as_deref()
                .and_then(|v| v.rsplit_once(':'))
                .and_then(|(target, option)| {
                    Some((ListTarget::decode(target)?, DecisionOption::parse(option)?))
                })
                .and_then(|(target, option)| {
                    Some(Self::List {
                        button: ListButton::Choose(option),
                        list: target.list,
                        group: Some(target.group?),
                    })
                })
                .unwrap_or_else(unknown),
            LIST_NEXT_PAGE => action
                .value
                .as_deref()
                .and_then(ListCursor::decode)
                .map(Self::ListNextPage)
                .unwrap_or_else(unknown),
            _ => unknown(),
        }
    }
}

/// Which button of a list decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListButton {
    Approve,
    ApproveAll,
    Review,
    Exclude,
    Retry,
    /// One of a group's choices (a burst alert's).
    Choose(DecisionOption),
}

/// A list (and one of its groups) as a button value or modal metadata: `list_x:3`, `list_x`,
/// and for the exclude modal `list_x:3:<page>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListTarget {
    pub list: ListId,
    pub group: Option<usize>,
}

impl ListTarget {
    pub fn encode(&self) -> String {
        match self.group {
            Some(group) => format!("{}:{group}", self.list),
            None => self.list.to_string(),
        }
    }

    pub fn decode(text: &str) -> Option<Self> {
        let mut parts = text.splitn(2, ':');
        let list = ListId::parse(parts.next()?).ok()?;
        let group = match parts.next() {
            Some(g) => Some(g.parse().ok()?),
            None => None,
        };
        Some(Self { list, group })
    }
}

/// Everything needed to fetch the next page of a listing, carried in the button's `value`
/// (at most 2000 characters) so no server state is needed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListCursor {
    /// The `/sandbox list` arguments as typed, re-parsed on click.
    #[serde(rename = "a")]
    pub args: String,
    /// E2B's next-page token.
    #[serde(rename = "n")]
    pub next_token: String,
    /// 1-based number of the page this cursor leads to.
    #[serde(rename = "p")]
    pub page: u32,
}

/// Slack's limit on a button value.
pub const BUTTON_VALUE_MAX_CHARS: usize = 2000;

impl ListCursor {
    /// The button value, or `None` when it would not fit in a button.
    pub fn encode(&self) -> Option<String> {
        let s = serde_json::to_string(self).ok()?;
        (s.chars().count() <= BUTTON_VALUE_MAX_CHARS).then_some(s)
    }

    pub fn decode(value: &str) -> Option<Self> {
        serde_json::from_str(value).ok()
    }
}

/// An Events API request body.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum EventEnvelope {
    UrlVerification {
        challenge: String,
    },
    EventCallback {
        #[serde(default)]
        event_id: Option<String>,
    },
    #[serde(other)]
    Other,
}

impl EventEnvelope {
    pub fn parse(body: &[u8]) -> Result<Self, PayloadError> {
        serde_json::from_slice(body).map_err(PayloadError::Event)
    }
}

/// Slack's retry headers, recorded for handlers (Events API redeliveries carry them).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlackRetry {
    pub num: Option<u32>,
    pub reason: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slash_command_form_parses() {
        let body = b"token=x&team_id=T1&channel_id=C1&user_id=U1&user_name=bob&command=%2Fsandbox&text=list+running&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2F1&trigger_id=1.2.3";
        let form = CommandForm::parse(body).unwrap();
        assert_eq!(form.command, "/sandbox");
        assert_eq!(form.text, "list running");
        assert_eq!(form.user_id.as_str(), "U1");
        assert_eq!(form.response_url, "https://hooks.slack.com/commands/1");
        assert!(CommandForm::parse(b"command=%2Fsandbox").is_err());
        let twice = [&body[..], b"&user_id=U2"].concat();
        assert!(CommandForm::parse(&twice).is_err(), "a field given twice");
        let bad_id = b"command=%2Fsandbox&user_id=U+1&channel_id=C1&response_url=x";
        assert!(
            CommandForm::parse(bad_id).is_err(),
            "an id that does not parse"
        );
        let minimal =
            CommandForm::parse(b"command=%2Fsandbox&user_id=U1&channel_id=C1&response_url=x")
                .unwrap();
        assert_eq!(
            (minimal.text.as_str(), minimal.team_id, minimal.trigger_id),
            ("", None, None)
        );
    }

    #[test]
    fn each_field_given_twice_is_named_and_each_read_into_its_own_place() {
        let body = "command=%2Fsandbox&text=t&user_id=U1&channel_id=C1&team_id=T1&response_url=r&trigger_id=g";
        let form = CommandForm::parse(body.as_bytes()).unwrap();
        assert_eq!(
            (
                form.command.as_str(),
                form.text.as_str(),
                form.user_id.as_str(),
                form.channel_id.as_str(),
                form.team_id.as_deref(),
                form.response_url.as_str(),
                form.trigger_id.as_deref()
            ),
            ("/sandbox", "t", "U1", "C1", Some("T1"), "r", Some("g"))
        );
        for name in CommandForm::FIELDS {
            let twice = format!("{body}&{name}=x");
            let Err(PayloadError::Command(problem)) = CommandForm::parse(twice.as_bytes()) else {
                panic!("{name} given twice was accepted");
            };
            assert_eq!(problem, format!("duplicate field `{name}`"));
        }
    }

    #[test]
    fn invalid_utf8_in_a_value_is_replaced_whether_escaped_or_not() {
        let form = CommandForm::parse(
            b"command=%2Fsandbox&user_id=U1&channel_id=C1&response_url=x&text=a%FFb&trigger_id=c\xffd",
        )
        .unwrap();
        assert_eq!(form.text, "a\u{fffd}b");
        assert_eq!(form.trigger_id.as_deref(), Some("c\u{fffd}d"));
    }

    #[test]
    fn only_a_bare_ssl_check_counts_as_one() {
        assert!(is_ssl_check(b"ssl_check=1&token=abc"));
        assert!(is_ssl_check(b"ssl_check=1"));
        assert!(!is_ssl_check(b"ssl_check=0"));
        assert!(!is_ssl_check(
            b"ssl_check=1&command=%2Fsandbox&text=pause+i1"
        ));
        assert!(!is_ssl_check(b"ssl_check=1&ssl_check=1"));
        assert!(!is_ssl_check(b""));
    }

    #[test]
    fn a_payload_that_is_not_utf8_is_refused_before_json_is_read() {
        // A string of valid JSON but for one byte that is no UTF-8 (0xff).
        let body = b"payload=%7B%22type%22%3A%22block_actions%FF%22%7D";
        assert!(matches!(
            Interaction::parse(body),
            Err(PayloadError::InteractionNotUtf8)
        ));
        // Non-ASCII UTF-8 in a string is read as it is.
        let body = b"payload=%7B%22type%22%3A%22block_actions%22%2C%22user%22%3A%7B%22id%22%3A%22U1%22%7D%2C%22trigger_id%22%3A%22%C3%A9%22%7D";
        assert_eq!(
            Interaction::parse(body).unwrap().trigger_id.as_deref(),
            Some("\u{e9}")
        );
    }

    #[test]
    fn a_block_action_payload_parses_into_an_action() {
        let cursor = ListCursor {
            args: "list running".into(),
            next_token: "tok".into(),
            page: 2,
        };
        let payload = serde_json::json!({
            "type": "block_actions",
            "user": {"id": "U1"},
            "response_url": "https://hooks.slack.com/actions/1",
            "container": {"type": "message", "message_ts": "1.2", "channel_id": "C1", "is_ephemeral": true},
            "actions": [{"action_id": LIST_NEXT_PAGE, "block_id": "b", "value": cursor.encode().unwrap()}],
        });
        let body = form_urlencoded::Serializer::new(String::new())
            .append_pair("payload", &payload.to_string())
            .finish();
        let interaction = Interaction::parse(body.as_bytes()).unwrap();
        assert_eq!(interaction.kind, "block_actions");
        assert_eq!(
            Action::from_block_action(&interaction.actions[0]),
            Action::ListNextPage(cursor)
        );
        let other = BlockAction {
            action_id: "kill".into(),
            block_id: None,
            value: None,
            action_ts: None,
        };
        let kill = BlockAction {
            action_id: case_option_action_id(DecisionOption::Kill),
            block_id: None,
            value: Some("case_1".into()),
            action_ts: Some("1.2".into()),
        };
        assert_eq!(
            Action::from_block_action(&kill),
            Action::CaseOption {
                case_id: CaseId::parse("case_1").unwrap(),
                option: DecisionOption::Kill
            }
        );
        let retry = BlockAction {
            action_id: CASE_RETRY.into(),
            ..kill.clone()
        };
        assert!(matches!(
            Action::from_block_action(&retry),
            Action::CaseRetry { .. }
        ));
        let nonsense = BlockAction {
            action_id: "case_nuke".into(),
            ..kill
        };
        assert!(matches!(
            Action::from_block_action(&nonsense),
            Action::Unknown { .. }
        ));
        assert_eq!(
            Action::from_block_action(&other),
            Action::Unknown {
                action_id: "kill".into()
            }
        );
        assert!(Interaction::parse(b"nothing=1").is_err());
    }

    #[test]
    fn events_distinguish_url_verification() {
        let e =
            EventEnvelope::parse(br#"{"type":"url_verification","challenge":"abc","token":"t"}"#)
                .unwrap();
        assert!(matches!(e, EventEnvelope::UrlVerification { challenge } if challenge == "abc"));
        let e = EventEnvelope::parse(br#"{"type":"app_rate_limited"}"#).unwrap();
        assert!(matches!(e, EventEnvelope::Other));
    }
}
