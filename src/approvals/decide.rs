//! Clicks on a case card and reason-modal submissions: recognise repeats, check the person may
//! choose the option, record the decision atomically, and hand the work to the queue.
//!
//! Of many concurrent clicks exactly one decision is written (the store's compare-and-swap);
//! the others are told who decided. Nothing here calls E2B: a decision only becomes E2B calls
//! in the worker. Every refused or repeated attempt is answered, and refusals are audited.
use std::time::Duration;

use chrono::{DateTime, NaiveDate, Utc};

use super::{Services, audit, refresh_card};
use crate::cases::{Case, CaseState, Decider, DecisionOption, Event, may_decide};
use crate::ids::{CaseId, SlackUserGroupId, SlackUserId};
use crate::slack::render::Mrkdwn;
use crate::store::Job;
use crate::store::{Actor, FirstClick, StoreError, Updated};

/// How long a click or submission is remembered, so Slack's redeliveries are not acted on.
pub const CLICK_DEDUPE_TTL: Duration = Duration::from_secs(60 * 60);

/// What the person who clicked should see.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// Nothing to say (a repeat of a click already handled, or the card says it all).
    Nothing,
    /// A sentence only they see.
    Ephemeral(String),
    /// A sentence only they see that names people: Steward's own mrkdwn, so mentions render.
    Mentioning(Mrkdwn),
    /// Open the reason modal for this case and option.
    AskReason {
        case: Box<Case>,
        option: DecisionOption,
    },
}

/// What a modal submission answers: close it, or show an error next to an input.
#[derive(Debug, Clone, PartialEq)]
pub enum SubmissionReply {
    Close,
    /// `(block_id, message)`: Slack shows the message under that input.
    Error {
        block: &'static str,
        message: String,
    },
}

fn person(user: &SlackUserId) -> Actor {
    Actor::Person { user: user.clone() }
}

fn unavailable(e: &StoreError) -> Option<String> {
    matches!(e, StoreError::Unavailable(_)).then(|| {
        "Steward can't reach its database (Redis), so nothing was done. Try again in a minute."
            .to_owned()
    })
}

fn store_sentence(e: StoreError) -> String {
    unavailable(&e).unwrap_or_else(|| match e {
        StoreError::NotFound(_) => "This case no longer exists.".to_owned(),
        // The write may have happened: never say "nothing was done".
        StoreError::Unconfirmed(_) => "Steward could not confirm that your decision was \
            recorded: its database stopped answering mid-write. If it was, the card will show \
            it within a minute and the work will run; if the card still asks for a decision, \
            choose again."
            .to_owned(),
        other => format!("Steward could not record that: {other}."),
    })
}

/// Says why a case no longer takes `option` from this person, naming who decided.
pub fn already_sentence(case: &Case) -> Mrkdwn {
    let decided = |by: &Decider, option: DecisionOption| {
        Mrkdwn::text("Already decided by ")
            .and(super::card::decider(by))
            .and(format!(": {option}."))
    };
    match &case.state {
        CaseState::Pending => Mrkdwn::text("This case is waiting for a decision."),
        CaseState::Decided { decision, .. }
        | CaseState::Executing { decision, .. }
        | CaseState::Done { decision, .. }
        | CaseState::Failed { decision, .. } => decided(&decision.by, decision.option),
        CaseState::Left { option, by, .. } => decided(by, *option),
        CaseState::Expired { .. } => Mrkdwn::text(
            "This case expired without a decision; nothing was done. Open a new one if needed.",
        ),
        CaseState::EndedOutside { what, .. } => Mrkdwn::text(&format!(
            "This case is closed: {what}. Steward did nothing."
        )),
    }
}

/// The user groups listed for `option` that `user` belongs to (asks Slack, one call per group,
/// only when the user is not already allowed by name).
async fn groups_of(
    svc: &Services,
    user: &SlackUserId,
    option: DecisionOption,
) -> Vec<SlackUserGroupId> {
    groups_in_rule(svc, svc.policy.approvers.rule_for(option), user).await
}

/// The user groups listed in `rule` that `user` belongs to (asks Slack, one call per group,
/// only when the user is not already allowed by name).
pub async fn groups_in_rule(
    svc: &Services,
    rule: &crate::cases::ApproverRule,
    user: &SlackUserId,
) -> Vec<SlackUserGroupId> {
    if rule.anyone || rule.users.contains(user) {
        return Vec::new();
    }
    let mut member_of = Vec::new();
    for group in &rule.groups {
        // A group Slack cannot list counts as one the user is not in: refusing is the safe
        // side, and the other groups may still let them in.
        match svc.slack.usergroup_members(group.as_str()).await {
            Ok(members) if members.contains(user) => member_of.push(group.clone()),
            Ok(_) => {}
            Err(e) => tracing::warn!(%group, error = %e, "could not list an approver group"),
        }
    }
    member_of
}

/// Checks `user` may choose `option` on `case`; a refusal is audited and returned as a
/// sentence.
async fn authorize(
    svc: &Services,
    case: &Case,
    user: &SlackUserId,
    option: DecisionOption,
) -> Result<(), String> {
    let groups = groups_of(svc, user, option).await;
    if let Err(refusal) = may_decide(&svc.policy, user, &groups, option, case.opener.requester()) {
        let sentence = refusal.to_string();
        audit(
            &svc.store,
            case,
            person(user),
            &format!("decide:{}", option.as_str()),
            &format!("refused: {sentence}"),
        )
        .await;
        tracing::info!(case = %case.id, %user, option = option.as_str(), "refused a decision");
        // The refusal is already a whole sentence for this person; a prefix would say it twice
        // (and call a blocked requester "not an approver" when they are one).
        return Err(sentence);
    }
    Ok(())
}

/// The message a button was clicked on, as Slack says in the interaction's `container`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClickedMessage {
    pub channel: Option<String>,
    pub ts: Option<String>,
}

/// Whether a click came from `case`'s own card: a button's value names a case, but only the
/// message it sits on proves which case it belongs to (a forged or stale value could
/// otherwise decide another case).
fn on_its_card(case: &Case, clicked: &ClickedMessage) -> bool {
    match (&case.card, &clicked.channel, &clicked.ts) {
        (Some(card), Some(channel), Some(ts)) => card.channel.as_str() == channel && &card.ts == ts,
        _ => false,
    }
}

/// Refuses (and audits) a click whose case is not the one on the clicked message.
async fn check_card(
    svc: &Services,
    case: &Case,
    user: &SlackUserId,
    action: &str,
    clicked: &ClickedMessage,
) -> Result<(), String> {
    if on_its_card(case, clicked) {
        return Ok(());
    }
    audit(
        &svc.store,
        case,
        person(user),
        action,
        "refused: the button is not on this case's card",
    )
    .await;
    tracing::warn!(case = %case.id, %user, ?clicked, "a click named a case that is not on its message");
    Err("This button does not belong to this case's card, so nothing was done. Use the buttons on the case's own card.".into())
}

/// Marks a modal submission as seen. `Ok(false)` for a repeat.
async fn first_time(svc: &Services, key: &str) -> Result<bool, String> {
    svc.store
        .first_time(key, CLICK_DEDUPE_TTL)
        .await
        .map_err(store_sentence)
}

/// The case of a first click, checked to have come from its own card (`action` names the
/// attempt in the audit of a refusal), or the reply that ends the click.
async fn clicked_case(
    svc: &Services,
    case: Case,
    user: &SlackUserId,
    clicked: &ClickedMessage,
    action: &str,
) -> Result<Case, Reply> {
    check_card(svc, &case, user, action, clicked)
        .await
        .map_err(Reply::Ephemeral)?;
    Ok(case)
}

/// The start of every click on a case card: a redelivered click does nothing, else the case is
/// read (both in one store call: one Redis round trip). `Err` is the answer to give instead.
/// The rest of the click ([`option_clicked`], [`retry_clicked`], [`restore_clicked`]) takes
/// the case it returns, so a redelivery never builds the rest of the click's work.
pub async fn first_click(
    store: &crate::store::Store,
    user: &SlackUserId,
    case_id: &CaseId,
    dedupe: &str,
) -> Result<Case, Reply> {
    let mark = format!("{user}:{dedupe}");
    match store.first_click(case_id, &mark, CLICK_DEDUPE_TTL).await {
        Ok(FirstClick::Case(case)) => Ok(*case),
        Ok(FirstClick::Repeat) => Err(Reply::Nothing),
        Ok(FirstClick::Missing) => Err(Reply::Ephemeral(store_sentence(StoreError::NotFound(
            format!("case {case_id}"),
        )))),
        Err(e) => Err(Reply::Ephemeral(store_sentence(e))),
    }
}

/// A first click on an option button (see [`first_click`]), with the case it read.
pub async fn option_clicked(
    svc: &Services,
    user: &SlackUserId,
    case: Case,
    option: DecisionOption,
    clicked: &ClickedMessage,
) -> Reply {
    let action = format!("decide:{}", option.as_str());
    let case = match clicked_case(svc, case, user, clicked, &action).await {
        Ok(case) => case,
        Err(reply) => return reply,
    };
    if case.state != CaseState::Pending {
        crate::metrics::decision(option.as_str(), "refused");
        return Reply::Mentioning(already_sentence(&case));
    }
    if !case.options.contains(&option) {
        crate::metrics::decision(option.as_str(), "refused");
        return Reply::Ephemeral(format!("{option} is not an option of this case."));
    }
    if let Err(sentence) = authorize(svc, &case, user, option).await {
        crate::metrics::decision(option.as_str(), "not_allowed");
        return Reply::Ephemeral(sentence);
    }
    // Leave/Keep and an unsnapshotted kill need a reason first: the modal's submission decides.
    if option.is_leave() || option == DecisionOption::Kill {
        return Reply::AskReason {
            case: Box::new(case),
            option,
        };
    }
    match decide(svc, &case.id, user, option, None, None).await {
        Ok(()) => Reply::Nothing,
        Err(sentence) => Reply::Mentioning(sentence),
    }
}

/// A form's optional "don't ask again before" date (`YYYY-MM-DD`, midnight UTC), which must be
/// in the future; `Err` is the sentence to show next to the date picker.
pub fn until_date(text: Option<&str>, now: DateTime<Utc>) -> Result<Option<DateTime<Utc>>, String> {
    let Some(text) = text.map(str::trim).filter(|d| !d.is_empty()) else {
        return Ok(None);
    };
    let date = NaiveDate::parse_from_str(text, "%Y-%m-%d")
        .map_err(|_| "That is not a date.".to_owned())?;
    match date.and_hms_opt(0, 0, 0).map(|t| t.and_utc()) {
        Some(at) if at > now => Ok(Some(at)),
        _ => Err("Pick a date in the future.".into()),
    }
}

/// A "don't raise again before" date for a Leave (on a case) or an exclusion (from a list),
/// capped by `[hygiene] max_exclude_for` (`max`): no date lasts `max` from `now`; a date must be
/// in the future and no later than `now + max`. `Err` is the sentence to show next to the date
/// picker; nothing is changed then.
pub fn leave_until(
    text: Option<&str>,
    now: DateTime<Utc>,
    max: Duration,
) -> Result<DateTime<Utc>, String> {
    let latest = chrono::Duration::from_std(max)
        .ok()
        .and_then(|d| now.checked_add_signed(d))
        .unwrap_or(DateTime::<Utc>::MAX_UTC);
    let Some(until) = until_date(text, now)? else {
        return Ok(latest);
    };
    if until > latest {
        return Err(format!(
            "The latest date allowed is {} ([hygiene] max_exclude_for is {}): pick it or an earlier one. Nothing was changed.",
            latest.format("%Y-%m-%d"),
            crate::slack::format::human_duration(max)
        ));
    }
    Ok(until)
}

/// A reason modal as submitted.
#[derive(Debug, Clone)]
pub struct Submission<'a> {
    pub user: &'a SlackUserId,
    /// The modal's id: one submission per opened modal is acted on.
    pub view_id: &'a str,
    pub case_id: &'a CaseId,
    pub option: DecisionOption,
    pub reason: Option<&'a str>,
    /// `YYYY-MM-DD` from the date picker.
    pub until: Option<&'a str>,
}

/// A submitted reason modal.
pub async fn reason_submitted(
    svc: &Services,
    sub: Submission<'_>,
    now: DateTime<Utc>,
) -> SubmissionReply {
    let Submission {
        user,
        view_id,
        case_id,
        option,
        reason,
        until,
    } = sub;
    use crate::slack::payload::{CASE_REASON_BLOCK, CASE_UNTIL_BLOCK};
    let error = |block, message: String| SubmissionReply::Error { block, message };
    let reason = reason.map(str::trim).filter(|r| !r.is_empty());
    let Some(reason) = reason else {
        return error(CASE_REASON_BLOCK, "Please say why.".into());
    };
    // Leave and Keep keep the subject out of sweeps until their date, which is capped; the
    // other options take none (the state machine refuses one).
    let until = if option.is_leave() {
        leave_until(until, now, svc.lists.max_exclude_for).map(Some)
    } else {
        until_date(until, now)
    };
    let until = match until {
        Ok(until) => until,
        Err(message) => return error(CASE_UNTIL_BLOCK, message),
    };
    match first_time(svc, &format!("view:{user}:{view_id}")).await {
        Ok(true) => {}
        Ok(false) => return SubmissionReply::Close,
        Err(sentence) => return error(CASE_REASON_BLOCK, sentence),
    }
    let case = match svc.store.get_case(case_id).await {
        Ok(case) => case,
        Err(e) => return error(CASE_REASON_BLOCK, store_sentence(e)),
    };
    if case.state != CaseState::Pending {
        return error(CASE_REASON_BLOCK, already_sentence(&case).to_plain());
    }
    if let Err(sentence) = authorize(svc, &case, user, option).await {
        crate::metrics::decision(option.as_str(), "not_allowed");
        return error(CASE_REASON_BLOCK, sentence);
    }
    match decide(svc, case_id, user, option, Some(reason.to_owned()), until).await {
        Ok(()) => SubmissionReply::Close,
        Err(sentence) => error(CASE_REASON_BLOCK, sentence.to_plain()),
    }
}

/// Records the decision; on success rewrites the card and queues the work. The loser of a race
/// gets "already decided by …".
async fn decide(
    svc: &Services,
    case_id: &CaseId,
    user: &SlackUserId,
    option: DecisionOption,
    reason: Option<String>,
    until: Option<DateTime<Utc>>,
) -> Result<(), Mrkdwn> {
    let event = Event::Decide {
        option,
        by: user.clone(),
        reason,
        until,
    };
    let action = format!("decide:{}", option.as_str());
    let applied = svc.store.apply_event(case_id, event, Utc::now()).await;
    crate::metrics::decision(option.as_str(), decision_outcome(&applied));
    let case = match applied {
        Ok(Updated::Applied(case)) => case,
        Ok(Updated::Rejected { current, error }) => {
            audit(
                &svc.store,
                &current,
                person(user),
                &action,
                &format!("refused: {error}"),
            )
            .await;
            return Err(match current.state {
                CaseState::Pending => {
                    format!("That decision could not be recorded: {error}.").into()
                }
                _ => already_sentence(&current),
            });
        }
        Err(e) => return Err(store_sentence(e).into()),
    };
    let outcome = match &case.state {
        CaseState::Left {
            until: Some(until), ..
        } => format!(
            "ok (not raised again before {})",
            crate::slack::format::when(*until)
        ),
        _ => "ok".to_owned(),
    };
    audit(&svc.store, &case, person(user), &action, &outcome).await;
    follow_up(svc, case).await;
    Ok(())
}

/// The `outcome` label of a decision the store was asked to record.
pub(super) fn decision_outcome(applied: &Result<Updated, StoreError>) -> &'static str {
    match applied {
        Ok(Updated::Applied(_)) => "recorded",
        Ok(Updated::Rejected { .. }) => "refused",
        Err(_) => "store_error",
    }
}

/// Runs [`after_decision`]: the card update and the enqueue may wait on Slack's rate limits,
/// so they get their own task, out of the request Slack wants answered within 3 s. When every
/// follow-up place is taken they run here instead, so the work stays bounded and the recorded
/// decision is still queued.
async fn follow_up(svc: &Services, case: Case) {
    match svc.limits.try_follow_up() {
        Ok(permit) => {
            let svc = svc.clone();
            svc.tasks.clone().spawn(async move {
                let _permit = permit;
                after_decision(&svc, case).await
            });
        }
        Err(_) => after_decision(svc, case).await,
    }
}

/// A click on Restore: checks the person may restore, records the request once (of many
/// clicks exactly one wins), shows it on the card and queues the job that starts the sandbox.
pub async fn restore_clicked(
    svc: &Services,
    user: &SlackUserId,
    case: Case,
    clicked: &ClickedMessage,
) -> Reply {
    let case = match clicked_case(svc, case, user, clicked, "restore").await {
        Ok(case) => case,
        Err(reply) => return reply,
    };
    let case_id = &case.id;
    let groups = groups_in_rule(svc, svc.policy.approvers.restore_rule(), user).await;
    if let Err(refusal) = crate::cases::may_restore(&svc.policy, user, &groups) {
        let sentence = refusal.to_string();
        audit(
            &svc.store,
            &case,
            person(user),
            "restore",
            &format!("refused: {sentence}"),
        )
        .await;
        return Reply::Ephemeral(sentence);
    }
    let event = Event::RequestRestore { by: user.clone() };
    match svc.store.apply_event(case_id, event, Utc::now()).await {
        Ok(Updated::Applied(case)) => {
            audit(&svc.store, &case, person(user), "restore", "asked").await;
            refresh_card(&svc.store, &svc.slack, &svc.templates, &case).await;
            let job = Job::Restore {
                case_id: case.id.clone(),
            };
            if let Err(e) = svc.store.enqueue(&job).await {
                let error = format!("Steward could not queue the restore: {e}");
                if let Ok(Updated::Applied(failed)) = svc
                    .store
                    .apply_event(
                        case_id,
                        Event::RestoreFailed {
                            error: error.clone(),
                        },
                        Utc::now(),
                    )
                    .await
                {
                    refresh_card(&svc.store, &svc.slack, &svc.templates, &failed).await;
                }
                return Reply::Ephemeral(format!("{error}. Try Restore again in a minute."));
            }
            Reply::Nothing
        }
        Ok(Updated::Rejected { current, error }) => {
            let sentence = match current.restore.as_ref().and_then(|r| r.request.as_ref()) {
                Some(q) if q.error.is_none() => "Someone already asked for it back.".to_owned(),
                _ => format!("Restore is not offered on this case: {error}."),
            };
            Reply::Ephemeral(sentence)
        }
        Err(e) => Reply::Ephemeral(store_sentence(e)),
    }
}

/// A click on Keep longer under a restored sandbox: whoever may click Restore (the `restore`
/// rule, by default the Pause rule that a run card's Keep running follows) gives it
/// `[approvals] restored_timeout` more. It only ever extends, so no case is needed; the ask and
/// what came of it are audited, and the card shows the new end.
pub async fn keep_longer_clicked(
    svc: &Services,
    user: &SlackUserId,
    case: Case,
    clicked: &ClickedMessage,
) -> Reply {
    let case = match clicked_case(svc, case, user, clicked, "keep_longer").await {
        Ok(case) => case,
        Err(reply) => return reply,
    };
    let groups = groups_in_rule(svc, svc.policy.approvers.restore_rule(), user).await;
    if crate::cases::may_restore(&svc.policy, user, &groups).is_err() {
        let sentence = "You may not keep a restored sandbox longer: ask someone listed under [approvals.approvers] restore (or pause). Nothing was changed.";
        audit(
            &svc.store,
            &case,
            person(user),
            "keep_longer",
            &format!("refused: {sentence}"),
        )
        .await;
        return Reply::Ephemeral(sentence.to_owned());
    }
    match super::worker::restore::keep_restored_longer(svc, &case, user).await {
        Ok(()) => Reply::Nothing,
        Err(sentence) => Reply::Ephemeral(sentence),
    }
}

/// Shows the decision on the card, then queues the work (in that order, so the worker's later
/// card updates always land after this one).
async fn after_decision(svc: &Services, case: Case) {
    refresh_card(&svc.store, &svc.slack, &svc.templates, &case).await;
    queue_decision(svc, &case).await;
}

/// Queues the work of a Decided case (nothing for any other state). When the queue refuses it,
/// the case fails at once with the reason, so people see it and can Retry.
pub(super) async fn queue_decision(svc: &Services, case: &Case) {
    if let CaseState::Decided {
        decision, attempt, ..
    } = &case.state
    {
        let job = Job::RunDecision {
            case_id: case.id.clone(),
            option: decision.option,
            attempt: *attempt,
        };
        if let Err(e) = svc.store.enqueue(&job).await {
            // The reconcile pass would queue it after its grace period, but failing now tells
            // people at once and lets them Retry.
            let error = format!("Steward could not queue the work ({e})");
            tracing::error!(case = %case.id, %error, "enqueue failed");
            if let Ok(Updated::Applied(failed)) = svc
                .store
                .apply_event(&case.id, Event::Fail { error }, Utc::now())
                .await
            {
                refresh_card(&svc.store, &svc.slack, &svc.templates, &failed).await;
            }
        }
    }
}

/// A click on Retry under a failed case: authorized like the original option.
pub async fn retry_clicked(
    svc: &Services,
    user: &SlackUserId,
    case: Case,
    clicked: &ClickedMessage,
) -> Reply {
    let case = match clicked_case(svc, case, user, clicked, "retry").await {
        Ok(case) => case,
        Err(reply) => return reply,
    };
    let case_id = &case.id;
    let CaseState::Failed { decision, .. } = &case.state else {
        return Reply::Ephemeral(format!(
            "This case is {}, so there is nothing to retry.",
            case.state.name()
        ));
    };
    let option = decision.option;
    if let Err(sentence) = authorize(svc, &case, user, option).await {
        return Reply::Ephemeral(sentence);
    }
    let event = Event::Retry { by: user.clone() };
    match svc.store.apply_event(case_id, event, Utc::now()).await {
        Ok(Updated::Applied(case)) => {
            audit(&svc.store, &case, person(user), "retry", "ok").await;
            follow_up(svc, case).await;
            Reply::Nothing
        }
        Ok(Updated::Rejected { current, .. }) => Reply::Ephemeral(format!(
            "Someone else already retried it; the case is {} now.",
            current.state.name()
        )),
        Err(e) => Reply::Ephemeral(store_sentence(e)),
    }
}
