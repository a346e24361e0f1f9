//! The Slack surface: `POST /slack/commands`, `/slack/interactions`, `/slack/events`, and the
//! middleware that verifies every one of them before anything is parsed.
//!
//! Handlers acknowledge within Slack's 3 s: quick answers go inline, anything that touches E2B
//! answers "Working on it…" and finishes in a spawned task whose answer, posted to the
//! `response_url`, replaces that acknowledgement.
//! Nothing here may run before [`verify_request`] has accepted the raw body (each route's handler
//! takes the [`Verified`] body only it makes); the `handle_*` entry
//! points are also called by `http::socket` for an envelope Socket Mode delivered (authenticated
//! by the app token that opened the connection).
use std::sync::Arc;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderName, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::error::ApiError;
use super::{AppState, header_str};
use crate::approvals::decide::{self, Reply, SubmissionReply};
use crate::approvals::lifetime::{self, LifetimeChange};
use crate::approvals::request::{self, CaseRequest};
use crate::approvals::{Services, card, history};
use crate::execute::{self, Context};
use crate::ids::CaseId;
use crate::slack::client::ResponsePayload;
use crate::slack::command::SandboxCommand;
use crate::slack::format;
use crate::slack::limits::Refused;
use crate::slack::payload::{self, Action, CommandForm, EventEnvelope, Interaction, SlackRetry};
use crate::slack::render::{
    FailureParams, MentionFailureParams, Message, Mrkdwn, ProblemParams, WorkingParams,
};
use crate::slack::signature::{self, SIGNATURE_HEADER, TIMESTAMP_HEADER};

/// Largest body accepted on a Slack route. Slack's own payloads are far smaller.
pub const SLACK_BODY_MAX_BYTES: usize = 64 * 1024;
/// How much of what a person typed a reply quotes back.
const ECHO_MAX_CHARS: usize = 1000;

/// Slack's retry headers, as [`HeaderName`]s like the signature's (see [`header_str`]).
const SLACK_RETRY_NUM: HeaderName = HeaderName::from_static("x-slack-retry-num");
const SLACK_RETRY_REASON: HeaderName = HeaderName::from_static("x-slack-retry-reason");

fn unix_now() -> i64 {
    chrono::Utc::now().timestamp()
}

/// A Slack request that [`verify_request`] accepted: its raw body and Slack's retry headers.
/// Every Slack route's handler takes one, and only `verify_request` makes one, so no handler
/// can see a body whose signature was not checked. (An extractor rather than a middleware: a
/// `from_fn` layer clones the route and rebuilds the request around the body it read, and the
/// handler then collected that body again, all on every request.)
pub struct Verified {
    body: Bytes,
    retry: SlackRetry,
}

impl axum::extract::FromRequest<AppState> for Verified {
    /// The answer instead of the handler's: an error, or the 200 of a bare `ssl_check` probe.
    type Rejection = Response;

    async fn from_request(request: Request, state: &AppState) -> Result<Self, Response> {
        match verify_request(state, request).await {
            Ok(Some(verified)) => Ok(verified),
            Ok(None) => Err(StatusCode::OK.into_response()),
            Err(e) => Err(e.into_response()),
        }
    }
}

/// Enforces the body limit, answers bare `ssl_check` probes (`Ok(None)`), verifies the
/// signature and records Slack's retry headers; only then does a handler see the request.
pub async fn verify_request(
    state: &AppState,
    request: Request,
) -> Result<Option<Verified>, ApiError> {
    let declared =
        header_str(request.headers(), &header::CONTENT_LENGTH).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > SLACK_BODY_MAX_BYTES as u64) {
        return Err(ApiError::TooLarge {
            limit: SLACK_BODY_MAX_BYTES,
        });
    }
    let (parts, body) = request.into_parts();
    // The limit is enforced while reading too: Content-Length may be absent (chunked) or lie.
    let bytes = read_limited(body, SLACK_BODY_MAX_BYTES).await?;
    let is_form = header_str(&parts.headers, &header::CONTENT_TYPE)
        .is_some_and(|v| v.starts_with("application/x-www-form-urlencoded"));
    if is_form && payload::is_ssl_check(&bytes) {
        return Ok(None);
    }
    let secret = state
        .settings
        .slack
        .signing_secret
        .as_ref()
        .ok_or(signature::SignatureError::NoSecret)?;
    signature::verify(
        secret,
        header_str(&parts.headers, TIMESTAMP_HEADER),
        header_str(&parts.headers, SIGNATURE_HEADER),
        &bytes,
        unix_now(),
    )?;
    Ok(Some(Verified {
        body: bytes,
        retry: SlackRetry {
            num: header_str(&parts.headers, &SLACK_RETRY_NUM).and_then(|v| v.parse().ok()),
            reason: header_str(&parts.headers, &SLACK_RETRY_REASON).map(str::to_owned),
        },
    }))
}

/// Reads a body, stopping as soon as it passes `limit` bytes.
/// A body that arrives in one chunk (the usual case) is kept as it is, not copied.
async fn read_limited(body: Body, limit: usize) -> Result<Bytes, ApiError> {
    use futures::StreamExt;
    let mut stream = body.into_data_stream();
    let mut first = Bytes::new();
    let mut rest: Option<Vec<u8>> = None;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(ApiError::body_read)?;
        let read = rest.as_ref().map_or(first.len(), Vec::len);
        if read + chunk.len() > limit {
            return Err(ApiError::TooLarge { limit });
        }
        match &mut rest {
            Some(buf) => buf.extend_from_slice(&chunk),
            None if first.is_empty() => first = chunk,
            None => {
                let mut buf = Vec::with_capacity(first.len() + chunk.len());
                buf.extend_from_slice(&first);
                buf.extend_from_slice(&chunk);
                rest = Some(buf);
            }
        }
    }
    Ok(rest.map_or(first, Bytes::from))
}

/// An immediate slash-command answer, visible to the invoker only.
fn inline(message: Message) -> Response {
    json_body(message.ephemeral_json().into())
}

/// A JSON answer already serialized (no `serde_json::Value` in between).
fn json_body(body: Bytes) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// `POST /slack/commands`.
pub async fn command(State(state): State<AppState>, slack: Verified) -> Result<Response, ApiError> {
    let form = CommandForm::parse(&slack.body)?;
    handle_command(state, form).await
}

/// A slash command from either transport (its request already verified): the immediate reply,
/// the HTTP body or the Socket Mode ack's payload.
pub async fn handle_command(state: AppState, form: CommandForm) -> Result<Response, ApiError> {
    let templates = &state.templates;
    let cmd = SandboxCommand::parse(&form.text);
    // Per request, so debug: at info it would cost more than answering the help.
    tracing::debug!(user = %form.user_id, channel = %form.channel_id, command = ?cmd, "slash command");
    // Everything that reads E2B counts toward the person's rate limit (kill and
    // delete-template read the evidence; a sweep reads the whole fleet).
    let calls_e2b = cmd.needs_e2b()
        || matches!(
            cmd,
            SandboxCommand::Kill { .. } | SandboxCommand::DeleteTemplate { .. }
        );
    if calls_e2b
        && let Err(refused) = state
            .limits
            .take_command(&form.user_id, std::time::Instant::now())
    {
        tracing::info!(user = %form.user_id, "command refused by the rate limit");
        return Ok(refuse(&state, refused));
    }
    let message = match &cmd {
        // The same bytes for every `/sandbox help`: rendered once (see `Templates::help_reply`).
        SandboxCommand::Help => {
            return Ok(json_body(
                templates.help_reply(&format::cut(&form.command, 100)),
            ));
        }
        SandboxCommand::Invalid { problem } => templates.render_or_plain(&ProblemParams {
            command: format::cut(&form.command, 100),
            // The problem quotes what was typed, which may be thousands of characters.
            problem: format::cut(problem, ECHO_MAX_CHARS),
        }),
        // Destructive commands never run directly: they open an approval case.
        SandboxCommand::Kill { .. }
        | SandboxCommand::DeleteTemplate { .. }
        | SandboxCommand::History { .. } => return Ok(defer_case_command(&state, cmd, &form)),
        SandboxCommand::Sweep { dry_run } => return Ok(defer_sweep(&state, *dry_run, &form)),
        _ => return Ok(defer(&state, cmd, &form)),
    };
    Ok(inline(message))
}

/// A request Steward will not start now, answered with the sentence that says why.
fn refuse(state: &AppState, refused: Refused) -> Response {
    inline(state.templates.render_or_plain(&FailureParams {
        sentence: refused.to_string(),
    }))
}

/// A command whose response_url Steward may not post to is answered inline and does nothing.
fn unusable_reply_address(state: &AppState, response_url: &str) -> Option<Response> {
    let e = state.slack.check_response_url(response_url).err()?;
    tracing::warn!(error = %e, "slash command with an unusable response_url");
    Some(inline(state.templates.render_or_plain(&FailureParams {
        sentence: "Slack sent this command without a usable reply address, so Steward cannot answer it.".into(),
    })))
}

/// A command's result: ephemeral like the acknowledgement, and replacing it, so the person is
/// left with the answer rather than a stale "Working on it…" above it.
fn replacing_the_ack(message: Message) -> ResponsePayload {
    ResponsePayload {
        replace_original: Some(true),
        ..ResponsePayload::ephemeral(message)
    }
}

/// Runs `work` as follow-up work (tracked, so shutdown waits for it, and holding one of the bounded
/// follow-up places with `held`) and delivers its message through `response_url`. When every place
/// is taken, nothing runs and the answer is the "Steward is busy" sentence.
fn reply_later<Fut>(
    state: &AppState,
    response_url: String,
    payload: fn(Message) -> ResponsePayload,
    what: &'static str,
    held: impl Send + 'static,
    work: Fut,
) -> Result<(), Refused>
where
    Fut: std::future::Future<Output = Message> + Send + 'static,
{
    let permit = state.limits.try_follow_up()?;
    let slack = state.slack.clone();
    state.tasks.spawn(async move {
        let _held = (permit, held);
        let message = work.await;
        if let Err(e) = slack.respond(&response_url, &payload(message)).await {
            tracing::error!(error = %e, "could not deliver {what} to Slack");
        }
    });
    Ok(())
}

/// Acknowledges `kill`, `delete-template` and `history` now; a background task talks to Redis
/// (and, for a new case, E2B and Slack) and answers via the response_url.
fn defer_case_command(state: &AppState, cmd: SandboxCommand, form: &CommandForm) -> Response {
    if let Some(refused) = unusable_reply_address(state, &form.response_url) {
        return refused;
    }
    let ack = match &cmd {
        SandboxCommand::Kill { id, .. } => format!("Opening a case to kill sandbox `{id}`…"),
        SandboxCommand::DeleteTemplate { id, .. } => {
            format!("Opening a case to delete template `{id}`…")
        }
        _ => "Reading the audit log…".to_owned(),
    };
    let svc = state.services();
    let req = CaseRequest {
        user: form.user_id.clone(),
        channel: form.channel_id.clone(),
        reason: None,
    };
    let work = async move {
        let now = chrono::Utc::now();
        match cmd {
            SandboxCommand::Kill { id, reason } => {
                request::request_kill(&svc, CaseRequest { reason, ..req }, id, now).await
            }
            SandboxCommand::DeleteTemplate { id, reason } => {
                request::request_delete_template(&svc, CaseRequest { reason, ..req }, id, now).await
            }
            SandboxCommand::History { target } => {
                history::history_message(&svc.store, &svc.templates, &target).await
            }
            _ => Message::plain("Steward does not open cases for this command.".to_owned()),
        }
    };
    let url = form.response_url.clone();
    match reply_later(
        state,
        url,
        replacing_the_ack,
        "a case command result",
        (),
        work,
    ) {
        Ok(()) => inline(Message::plain(ack)),
        Err(busy) => refuse(state, busy),
    }
}

/// Acknowledges `/sandbox sweep` now; the pass runs in a background task and its outcome
/// reaches the user through the response_url (a live pass also posts in the hygiene channel).
fn defer_sweep(state: &AppState, dry_run: bool, form: &CommandForm) -> Response {
    if let Some(refused) = unusable_reply_address(state, &form.response_url) {
        return refused;
    }
    // Built once at startup (a broken sweep configuration stops the replica from starting).
    let Some(ctx) = state.sweep.clone() else {
        return inline(state.templates.render_or_plain(&FailureParams {
            sentence: "Steward is not connected to E2B yet (E2B_API_KEY is not set); an operator needs to set it up.".into(),
        }));
    };
    // A dry run reads the whole fleet: one at a time per replica. (A live sweep takes the
    // sweep lease in Redis, which already lets only one run at a time.)
    let sweeping = if dry_run {
        match state.limits.try_sweep() {
            Ok(permit) => Some(permit),
            Err(refused) => return refuse(state, refused),
        }
    } else {
        None
    };
    let svc = state.services();
    let user = form.user_id.clone();
    let work = async move {
        // A live sweep opens cases and posts to the hygiene channel: who may start one is
        // policy (`[approvals.approvers] sweep`, by default the pause approvers).
        let allowed = dry_run || {
            let groups =
                decide::groups_in_rule(&svc, svc.policy.approvers.sweep_rule(), &user).await;
            crate::cases::may_start_sweep(&svc.policy, &user, &groups)
                .inspect_err(|_| tracing::info!(%user, "refused a live sweep"))
                .is_ok()
        };
        if !allowed {
            // A refused attempt is on the record too, like a refused click.
            let event = crate::store::AuditEvent {
                time: chrono::Utc::now(),
                case: None,
                subject: None,
                actor: crate::store::Actor::Person { user: user.clone() },
                action: "sweep:live".into(),
                outcome: "refused: not allowed to start a live sweep".into(),
            };
            if let Err(e) = svc.store.append_audit(&event).await {
                tracing::warn!(error = %e, "could not audit a refused live sweep");
            }
        }
        if allowed {
            let ctx = crate::hygiene::SweepContext {
                requester: Some(user.clone()),
                ..ctx
            };
            crate::hygiene::command::sweep_message(ctx, dry_run, chrono::Utc::now()).await
        } else {
            svc.templates.render_or_plain(&FailureParams {
                sentence: crate::cases::Refusal::NotASweeper.to_string(),
            })
        }
    };
    let url = form.response_url.clone();
    if let Err(busy) = reply_later(
        state,
        url,
        replacing_the_ack,
        "a sweep result",
        sweeping,
        work,
    ) {
        return refuse(state, busy);
    }
    inline(Message::plain(if dry_run {
        "Sweeping the fleet (dry run: nothing will be opened or posted)…"
    } else {
        "Sweeping the fleet if you may start a live sweep; the digest and cases will appear in the hygiene channel…"
    }))
}

/// Acknowledges now and finishes the command in a background task via the response_url.
fn defer(state: &AppState, cmd: SandboxCommand, form: &CommandForm) -> Response {
    if let Some(refused) = unusable_reply_address(state, &form.response_url) {
        return refused;
    }
    let working = state.templates.render_or_plain(&WorkingParams {
        command: format::cut(&form.command, 100),
        input: format::cut(form.text.trim(), ECHO_MAX_CHARS),
    });
    let task_state = state.clone();
    let text = form.text.trim().to_owned();
    let req = CaseRequest {
        user: form.user_id.clone(),
        channel: form.channel_id.clone(),
        reason: None,
    };
    let work = async move {
        let state = task_state;
        let now = chrono::Utc::now();
        let ctx = Context {
            e2b: state.e2b.as_ref(),
            templates: &state.templates,
            now,
        };
        // Timeouts can end a sandbox, so they go through the floor check (which may open a
        // kill case instead); everything else runs directly.
        let change = match &cmd {
            SandboxCommand::Timeout { id, duration } => Some(LifetimeChange::Timeout {
                id: id.clone(),
                duration: *duration,
            }),
            SandboxCommand::Resume { id, timeout } => Some(LifetimeChange::Resume {
                id: id.clone(),
                timeout: *timeout,
            }),
            SandboxCommand::Refresh { id, duration } => Some(LifetimeChange::Refresh {
                id: id.clone(),
                duration: *duration,
            }),
            _ => None,
        };
        match change {
            Some(change) => lifetime::change_lifetime(&state.services(), req, change, now).await,
            None => execute::run(&ctx, &cmd, &text).await,
        }
    };
    let url = form.response_url.clone();
    match reply_later(state, url, replacing_the_ack, "a command result", (), work) {
        Ok(()) => inline(working),
        Err(busy) => refuse(state, busy),
    }
}

/// `POST /slack/interactions`: verified, parsed, acknowledged at once. Clicks are handled in
/// a background task; a modal submission is answered in the response (Slack shows errors next
/// to the inputs).
pub async fn interaction(
    State(state): State<AppState>,
    slack: Verified,
) -> Result<Response, ApiError> {
    let interaction = Interaction::parse(&slack.body)?;
    Ok(handle_interaction(state, interaction).await)
}

/// An interaction from either transport (its request already verified): an empty answer, or a
/// modal submission's `response_action`.
pub async fn handle_interaction(state: AppState, interaction: Interaction) -> Response {
    // Shared with the click's follow-up task rather than copied into it.
    let interaction = Arc::new(interaction);
    match interaction.kind.as_str() {
        "block_actions" => {}
        "view_submission" => return view_submission(&state, &interaction).await,
        other => {
            tracing::debug!(kind = %other, "ignoring interaction");
            return StatusCode::OK.into_response();
        }
    }
    for block_action in &interaction.actions {
        match Action::from_block_action(block_action) {
            Action::ListNextPage(cursor) => next_page(&state, &interaction, cursor),
            Action::CaseOption { case_id, option } => case_click(
                &state,
                &interaction,
                block_action,
                case_id,
                CaseButton::Option(option),
            ),
            Action::CaseRetry { case_id } => case_click(
                &state,
                &interaction,
                block_action,
                case_id,
                CaseButton::Retry,
            ),
            Action::CaseRestore { case_id } => case_click(
                &state,
                &interaction,
                block_action,
                case_id,
                CaseButton::Restore,
            ),
            Action::CaseKeepLonger { case_id } => case_click(
                &state,
                &interaction,
                block_action,
                case_id,
                CaseButton::KeepLonger,
            ),
            Action::List {
                button,
                list,
                group,
            } => list_click(&state, &interaction, block_action, button, list, group),
            Action::Unknown { action_id } => {
                tracing::info!(%action_id, user = %interaction.user.id, "no handler for this action");
            }
        }
    }
    StatusCode::OK.into_response()
}

/// What identifies one click across Slack's redeliveries: its action_ts; without one, the
/// trigger id.
fn click_id(interaction: &Interaction, action: &payload::BlockAction) -> String {
    action
        .action_ts
        .clone()
        .or_else(|| interaction.trigger_id.clone())
        .unwrap_or_else(|| uuid::Uuid::new_v4().to_string())
}

/// Which button of a case card was clicked.
#[derive(Debug, Clone, Copy)]
enum CaseButton {
    Option(crate::cases::DecisionOption),
    Retry,
    Restore,
    KeepLonger,
}

/// A click on a case card. Handled after the 200, in a task that first does the click's one
/// store round trip (dedupe mark and case, [`decide::first_click`]) and ends there for a
/// redelivery. The rest of the click (checks, the decision, card updates, replies) is a much
/// larger future, so it is boxed: spawning, and finishing, a redelivery's task then copies a
/// few hundred bytes rather than all of that.
fn case_click(
    state: &AppState,
    interaction: &Arc<Interaction>,
    action: &payload::BlockAction,
    case_id: CaseId,
    button: CaseButton,
) {
    let dedupe = click_id(interaction, action);
    let Ok(permit) = state.limits.try_follow_up() else {
        // Nothing changed: the card still shows its buttons, so the person can click again.
        tracing::warn!(%case_id, user = %interaction.user.id, "too many follow-up tasks; a click was not handled");
        if let Some(permit) = state.limits.try_busy_reply() {
            let svc = state.services();
            let interaction = interaction.clone();
            state.tasks.spawn(async move {
                let _permit = permit;
                tell(&svc, &interaction, Refused::Busy.to_string().into()).await;
            });
        }
        return;
    };
    let state = state.clone();
    let interaction = interaction.clone();
    state.tasks.clone().spawn(async move {
        let _permit = permit;
        let first =
            decide::first_click(&state.store, &interaction.user.id, &case_id, &dedupe).await;
        if matches!(first, Err(Reply::Nothing)) {
            return;
        }
        Box::pin(async move {
            let svc = state.services();
            let user = &interaction.user.id;
            let reply = match first {
                Ok(case) => {
                    // The case named by the button must be the one whose card that message is.
                    let (channel, ts) = interaction.clicked_message();
                    let clicked = decide::ClickedMessage {
                        channel: channel.map(str::to_owned),
                        ts: ts.map(str::to_owned),
                    };
                    match button {
                        CaseButton::Option(option) => {
                            decide::option_clicked(&svc, user, case, option, &clicked).await
                        }
                        CaseButton::Retry => {
                            decide::retry_clicked(&svc, user, case, &clicked).await
                        }
                        CaseButton::Restore => {
                            decide::restore_clicked(&svc, user, case, &clicked).await
                        }
                        CaseButton::KeepLonger => {
                            decide::keep_longer_clicked(&svc, user, case, &clicked).await
                        }
                    }
                }
                Err(reply) => reply,
            };
            deliver(&svc, &interaction, reply).await;
        })
        .await;
    });
}

/// A click on a sweep's list decision. Handled after the 200, like a case click.
fn list_click(
    state: &AppState,
    interaction: &Arc<Interaction>,
    action: &payload::BlockAction,
    button: payload::ListButton,
    list: crate::ids::ListId,
    group: Option<usize>,
) {
    use crate::approvals::list::{self as lists, ListClick};
    use payload::ListButton;
    let dedupe = click_id(interaction, action);
    let Ok(permit) = state.limits.try_follow_up() else {
        tracing::warn!(%list, user = %interaction.user.id, "too many follow-up tasks; a list click was not handled");
        return;
    };
    let svc = state.services();
    let interaction = interaction.clone();
    state.tasks.spawn(async move {
        let _permit = permit;
        let click = ListClick {
            user: &interaction.user.id,
            list: &list,
            group,
            dedupe: &dedupe,
            clicked: interaction.clicked_message(),
        };
        let reply = match button {
            ListButton::Approve | ListButton::ApproveAll => {
                lists::approve_clicked(&svc, click).await
            }
            ListButton::Review => lists::review_clicked(&svc, click).await,
            ListButton::Retry => lists::retry_clicked(&svc, click).await,
            ListButton::Choose(option) => lists::choose_clicked(&svc, click, option).await,
            ListButton::Exclude => match lists::exclude_clicked(&svc, click).await {
                Ok(modal) => open_modal(&svc, &interaction, &modal).await,
                Err(reply) => reply,
            },
        };
        deliver(&svc, &interaction, reply).await;
    });
}

/// Opens a modal for the clicker; a failure is the sentence to tell them.
async fn open_modal<P: crate::slack::render::MessageParams>(
    svc: &Services,
    interaction: &Interaction,
    params: &P,
) -> Reply {
    let Some(trigger) = interaction.trigger_id.as_deref() else {
        return Reply::Ephemeral("Slack sent no trigger for the form; click again.".into());
    };
    let opened = match svc.templates.render_view(params) {
        Ok(view) => svc
            .slack
            .open_view(trigger, view)
            .await
            .map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    match opened {
        Ok(()) => Reply::Nothing,
        Err(e) => {
            tracing::error!(error = %e, "could not open a form");
            Reply::Ephemeral(format!(
                "Steward could not open the form ({e}); click again."
            ))
        }
    }
}

/// Shows a click's reply to the person who clicked.
async fn deliver(svc: &Services, interaction: &Interaction, reply: Reply) {
    let sentence = match reply {
        Reply::Nothing => return,
        Reply::Ephemeral(sentence) => Mrkdwn::text(&sentence),
        Reply::Mentioning(sentence) => sentence,
        Reply::AskReason { case, option } => {
            match open_modal(svc, interaction, &card::reason_modal(&case, option)).await {
                Reply::Ephemeral(sentence) => Mrkdwn::text(&sentence),
                _ => return,
            }
        }
    };
    tell(svc, interaction, sentence).await;
}

/// An ephemeral sentence for the clicker: through the response_url when there is one, else
/// `chat.postEphemeral` in the card's channel.
async fn tell(svc: &Services, interaction: &Interaction, sentence: Mrkdwn) {
    let message = svc
        .templates
        .render_or_plain(&MentionFailureParams { sentence });
    let result = match (&interaction.response_url, &interaction.channel) {
        (Some(url), _) => {
            let payload = ResponsePayload {
                response_type: Some(crate::slack::client::ResponseType::Ephemeral),
                replace_original: Some(false),
                text: message.text,
                blocks: message.blocks,
            };
            svc.slack.respond(url, &payload).await
        }
        (None, Some(channel)) => {
            svc.slack
                .post_ephemeral(&channel.id, &interaction.user.id, message)
                .await
        }
        (None, None) => {
            tracing::warn!("a case reply had nowhere to go");
            return;
        }
    };
    if let Err(e) = result {
        tracing::error!(error = %e, "could not tell the clicker");
    }
}

/// A submitted reason modal: decide now, answer with `response_action: errors` when the input
/// or the case says no.
async fn view_submission(state: &AppState, interaction: &Interaction) -> Response {
    use crate::slack::payload::{
        CASE_REASON_ACTION, CASE_REASON_BLOCK, CASE_REASON_MODAL, CASE_UNTIL_ACTION,
        CASE_UNTIL_BLOCK, ModalMetadata,
    };
    let Some(view) = &interaction.view else {
        return StatusCode::OK.into_response();
    };
    if view.callback_id == crate::slack::payload::SWEEP_LIST_EXCLUDE_MODAL {
        return exclude_submission(state, interaction, view).await;
    }
    if view.callback_id != CASE_REASON_MODAL {
        tracing::debug!(callback_id = %view.callback_id, "ignoring a view submission");
        return StatusCode::OK.into_response();
    }
    let Some(meta) = ModalMetadata::decode(&view.private_metadata) else {
        return modal_error(
            CASE_REASON_BLOCK,
            "This form is out of date; click the button on the card again.",
        );
    };
    let reason = view
        .input(CASE_REASON_BLOCK, CASE_REASON_ACTION)
        .and_then(|v| v.value.as_deref());
    let until = view
        .input(CASE_UNTIL_BLOCK, CASE_UNTIL_ACTION)
        .and_then(|v| v.selected_date.as_deref());
    let svc = state.services();
    let user = interaction.user.id.clone();
    let view_id = view.id.clone();
    let (reason, until) = (reason.map(str::to_owned), until.map(str::to_owned));
    let decision = state.tasks.spawn(async move {
        let submission = decide::Submission {
            user: &user,
            view_id: &view_id,
            case_id: &meta.case_id,
            option: meta.option,
            reason: reason.as_deref(),
            until: until.as_deref(),
        };
        decide::reason_submitted(&svc, submission, chrono::Utc::now()).await
    });
    // Deciding may have to ask Slack for an approver group's members, which can be slow or
    // rate-limited: past the budget the form closes and the decision finishes on its own (the
    // card shows the outcome; a refusal is audited).
    match within_modal_budget(decision, "a reason submission").await {
        Some(SubmissionReply::Error { block, message }) => modal_error(block, &message),
        Some(SubmissionReply::Close) | None => StatusCode::OK.into_response(),
    }
}

/// A modal submission's work, awaited for as long as Slack waits for the answer (3 s, less a
/// margin). `None` closes the form: the work took longer (it goes on by itself) or panicked;
/// either is logged, naming `what`.
async fn within_modal_budget<T>(work: tokio::task::JoinHandle<T>, what: &str) -> Option<T> {
    match tokio::time::timeout(MODAL_ANSWER_BUDGET, work).await {
        Ok(Ok(answer)) => Some(answer),
        Ok(Err(e)) => {
            tracing::error!(error = %e, "{what} panicked");
            None
        }
        Err(_) => {
            tracing::warn!("{what} took longer than Slack waits; closing the form");
            None
        }
    }
}

/// A page of the exclude modal submitted: exclude what it names, then show the next page.
async fn exclude_submission(
    state: &AppState,
    interaction: &Interaction,
    view: &payload::ViewPayload,
) -> Response {
    use crate::approvals::list::{self as lists, ExcludeReply, ExcludeSubmission};
    use crate::slack::payload::{
        CASE_UNTIL_ACTION, CASE_UNTIL_BLOCK, SWEEP_LIST_PASTE_ACTION, SWEEP_LIST_PASTE_BLOCK,
        SWEEP_LIST_PICK_ACTION,
    };
    let mut ticked: Vec<String> = view
        .state
        .values
        .iter()
        .filter(|(block, _)| block.starts_with("pick_"))
        .filter_map(|(_, inputs)| inputs.get(SWEEP_LIST_PICK_ACTION))
        .flat_map(|input| input.selected_options.iter().map(|o| o.value.clone()))
        .collect();
    ticked.sort();
    let pasted = view
        .input(SWEEP_LIST_PASTE_BLOCK, SWEEP_LIST_PASTE_ACTION)
        .and_then(|v| v.value.clone());
    let until = view
        .input(CASE_UNTIL_BLOCK, CASE_UNTIL_ACTION)
        .and_then(|v| v.selected_date.clone());
    let svc = state.services();
    let user = interaction.user.id.clone();
    let (view_id, metadata) = (view.id.clone(), view.private_metadata.clone());
    let work = state.tasks.spawn(async move {
        let sub = ExcludeSubmission {
            user: &user,
            view_id: &view_id,
            metadata: &metadata,
            ticked,
            pasted: pasted.as_deref(),
            until: until.as_deref(),
        };
        lists::exclude_submitted(&svc, sub, chrono::Utc::now()).await
    });
    match within_modal_budget(work, "an exclude submission").await {
        Some(ExcludeReply::Modal(SubmissionReply::Error { block, message })) => {
            modal_error(block, &message)
        }
        Some(ExcludeReply::NextPage(page)) => match state.templates.render_view(page.as_ref()) {
            Ok(view) => Json(json!({ "response_action": "update", "view": view })).into_response(),
            Err(e) => {
                tracing::error!(error = %e, "could not render the next page of the exclude form");
                StatusCode::OK.into_response()
            }
        },
        Some(ExcludeReply::Modal(SubmissionReply::Close)) | None => StatusCode::OK.into_response(),
    }
}

/// How long a modal submission may take before the form is closed without waiting for it.
const MODAL_ANSWER_BUDGET: std::time::Duration = std::time::Duration::from_millis(2500);

fn modal_error(block: &str, message: &str) -> Response {
    Json(json!({ "response_action": "errors", "errors": { block: message } })).into_response()
}

fn next_page(state: &AppState, interaction: &Interaction, cursor: payload::ListCursor) {
    let Some(response_url) = interaction.response_url.clone() else {
        tracing::warn!("next-page click without a response_url");
        return;
    };
    if let Err(e) = state.slack.check_response_url(&response_url) {
        tracing::warn!(error = %e, "next-page click with an unusable response_url");
        return;
    }
    let task_state = state.clone();
    let work = async move {
        let state = task_state;
        let ctx = Context {
            e2b: state.e2b.as_ref(),
            templates: &state.templates,
            now: chrono::Utc::now(),
        };
        // The cursor carries the original arguments, parsed again exactly as typed.
        match SandboxCommand::parse(&cursor.args) {
            SandboxCommand::List(args) => {
                match execute::list_page(
                    &ctx,
                    &args,
                    &cursor.args,
                    Some(&cursor.next_token),
                    cursor.page,
                )
                .await
                {
                    Ok(m) => m,
                    Err((subject, e)) => state.templates.render_or_plain(&FailureParams {
                        sentence: execute::sentence(&subject, &e),
                    }),
                }
            }
            _ => state.templates.render_or_plain(&FailureParams {
                sentence: "This button is out of date; run `/sandbox list` again.".into(),
            }),
        }
    };
    if reply_later(
        state,
        response_url,
        ResponsePayload::replacing,
        "the next page",
        (),
        work,
    )
    .is_err()
    {
        tracing::warn!("too many follow-up tasks; a next-page click was not handled");
    }
}

/// `POST /slack/events`: answers `url_verification`; every other event is acknowledged and
/// ignored for now.
pub async fn event(slack: Verified) -> Result<Response, ApiError> {
    Ok(handle_event(
        EventEnvelope::parse(&slack.body)?,
        &slack.retry,
    ))
}

/// An Events API delivery from either transport (its request already verified).
pub fn handle_event(envelope: EventEnvelope, retry: &SlackRetry) -> Response {
    match envelope {
        EventEnvelope::UrlVerification { challenge } => {
            Json(json!({ "challenge": challenge })).into_response()
        }
        EventEnvelope::EventCallback { event_id } => {
            tracing::debug!(?event_id, retry_num = ?retry.num, retry_reason = ?retry.reason, "event ignored");
            StatusCode::OK.into_response()
        }
        EventEnvelope::Other => StatusCode::OK.into_response(),
    }
}
