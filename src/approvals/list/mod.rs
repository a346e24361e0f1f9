//! A sweep's list decision, live: publishing its digest, the clicks on it (Approve group,
//! Approve all, Review individually, Exclude…, Retry failed), and the driver that carries out
//! approved groups.
//!
//! The list record (`cases::list`) says what people decided per group; every sandbox has its own
//! case (no card), and carrying out a group is deciding and executing those cases, one sandbox at
//! a time per worker, at most `concurrency` at once, through the same `execute_case` as the
//! queue. So each sandbox is re-checked right before anything happens to it (busy again: left
//! alone and counted as skipped), its steps are logged so a replica that dies mid-list is
//! replaced without acting twice (the driver holds a lease; its items hold short execution
//! leases), and E2B's 429s are waited out by the client. The digest shows each group's progress,
//! rewritten at most every `progress_every` (Slack rate-limits `chat.update`).
//! This module decides who may click what (`cases::may_decide` per option); it never calls E2B
//! itself: only `execute_case` does.
use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::StreamExt;

use super::decide::{Reply, SubmissionReply, groups_in_rule};
use super::{CardTarget, Services, audit, post_card};
use crate::cases::list::{
    GroupDecision, ListCase, ListEvent, ListGroup, ListRefusal, Progress, progress,
};
use crate::cases::{Card, Case, CaseState, DecisionOption, Event, Subject, may_decide};
use crate::ids::{ListId, SandboxId, SlackUserId};
use crate::slack::client::SlackClient;
use crate::slack::format::when;
use crate::slack::render::{Message, Mrkdwn, Templates};
use crate::store::{Actor, ListUpdated, Store, StoreError, Updated};

mod choose;
pub mod reading;
pub mod view;
pub use choose::choose_clicked;

/// Default lease of one list item's execution: short, so a dead replica's sandboxes are taken
/// over quickly (it is renewed before every step, and a list's steps are single E2B calls).
pub const DEFAULT_ITEM_LEASE: Duration = Duration::from_secs(60);
/// Default pace of the digest's progress updates.
pub const DEFAULT_PROGRESS_EVERY: Duration = Duration::from_secs(3);
/// Cards a Review individually posts at most; the rest stay in the list, undecided.
pub const MAX_REVIEW_CARDS: usize = 200;

/// How far ahead a "don't raise again" date may be when `[hygiene]` does not say: 30 days.
pub const DEFAULT_MAX_EXCLUDE_FOR: Duration = Duration::from_secs(30 * 24 * 60 * 60);

/// How lists are carried out (`[hygiene] list_*`), and how long a person may keep a sandbox out
/// of sweeps (`[hygiene] max_exclude_for`: an exclusion here, or a Leave on a single case).
#[derive(Debug, Clone, Copy)]
pub struct ListSettings {
    pub concurrency: usize,
    pub item_lease: Duration,
    pub progress_every: Duration,
    pub max_exclude_for: Duration,
}

impl Default for ListSettings {
    fn default() -> Self {
        Self {
            concurrency: 8,
            item_lease: DEFAULT_ITEM_LEASE,
            progress_every: DEFAULT_PROGRESS_EVERY,
            max_exclude_for: DEFAULT_MAX_EXCLUDE_FOR,
        }
    }
}

fn person(user: &SlackUserId) -> Actor {
    Actor::Person { user: user.clone() }
}

fn unavailable(e: &StoreError) -> String {
    match e {
        StoreError::Unavailable(_) => {
            "Steward can't reach its database (Redis), so nothing was done. Try again in a minute."
                .into()
        }
        StoreError::NotFound(_) => "This list no longer exists.".into(),
        other => format!("Steward could not record that: {other}."),
    }
}

// ----- publishing -----

/// Renders every message of `list` as it stands (progress read from its items' cases).
pub async fn render(
    store: &Store,
    templates: &Templates,
    list: &ListCase,
    now: DateTime<Utc>,
) -> Result<Vec<Message>, String> {
    let progress = progress_of(store, list).await.map_err(|e| e.to_string())?;
    view::list_messages(list, &progress, now)
        .iter()
        .map(|params| templates.render(params).map_err(|e| e.to_string()))
        .collect()
}

/// Posts a new list: the digest in `channel`, further groups in its thread. Records where.
pub async fn publish(
    store: &Store,
    slack: &SlackClient,
    templates: &Templates,
    list: &ListCase,
    channel: &crate::ids::SlackChannelId,
) -> Result<ListCase, String> {
    let messages = render(store, templates, list, Utc::now()).await?;
    let mut cards = Vec::new();
    for (i, message) in messages.into_iter().enumerate() {
        let thread = cards.first().map(|c: &Card| c.ts.clone());
        let posted = if i == 0 {
            slack.post_message(channel, message).await
        } else {
            slack
                .post_message_in_thread(channel, thread.as_deref(), message)
                .await
        };
        let (channel, ts) = posted.map_err(|e| e.to_string())?;
        cards.push(Card { channel, ts });
    }
    match store
        .update_list(&list.id, ListEvent::Posted { messages: cards }, Utc::now())
        .await
        .map_err(|e| e.to_string())?
    {
        ListUpdated::Applied(list) => Ok(list),
        ListUpdated::Refused { current, .. } => Ok(*current),
    }
}

/// What each message last showed, per process, so an unchanged message is not rewritten.
static SHOWN: LazyLock<Mutex<HashMap<(ListId, usize), u64>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

fn fingerprint(message: &Message) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    serde_json::to_string(&message.blocks)
        .unwrap_or_default()
        .hash(&mut h);
    message.text.hash(&mut h);
    h.finish()
}

/// Rewrites the list's messages that changed since this process last showed them.
pub async fn refresh(svc: &Services, list: &ListCase) {
    let messages = match render(&svc.store, &svc.templates, list, Utc::now()).await {
        Ok(messages) => messages,
        Err(e) => {
            tracing::warn!(list = %list.id, error = %e, "could not render the list");
            return;
        }
    };
    for (i, (message, card)) in messages.into_iter().zip(&list.messages).enumerate() {
        let print = fingerprint(&message);
        let key = (list.id.clone(), i);
        if lock_shown().get(&key) == Some(&print) {
            continue;
        }
        match svc
            .slack
            .update_message(&card.channel, &card.ts, message)
            .await
        {
            Ok(()) => {
                lock_shown().insert(key, print);
            }
            Err(e) => {
                tracing::warn!(list = %list.id, error = %e, "could not update the list's message")
            }
        }
    }
}

fn lock_shown() -> std::sync::MutexGuard<'static, HashMap<(ListId, usize), u64>> {
    SHOWN.lock().unwrap_or_else(|p| p.into_inner())
}

/// Each group's progress once approved (`None` for a group not approved), read in one batch.
pub async fn progress_of(
    store: &Store,
    list: &ListCase,
) -> Result<Vec<Option<Progress>>, StoreError> {
    let approved: Vec<(usize, Vec<(Subject, crate::ids::CaseId)>)> = list
        .groups
        .iter()
        .enumerate()
        .filter(|(_, g)| matches!(g.decision, GroupDecision::Approved { .. }))
        .map(|(i, g)| {
            let items = g
                .included()
                .map(|item| (Subject::Sandbox(item.sandbox.clone()), item.case.clone()))
                .collect();
            (i, items)
        })
        .collect();
    let all: Vec<(Subject, crate::ids::CaseId)> = approved
        .iter()
        .flat_map(|(_, items)| items.clone())
        .collect();
    let cases = store.cases_of(&all).await?;
    let mut out = vec![None; list.groups.len()];
    let mut at = 0;
    for (i, items) in approved {
        let states = cases[at..at + items.len()]
            .iter()
            .map(|c| c.as_ref().map(|c| &c.state));
        out[i] = Some(progress(states));
        at += items.len();
    }
    Ok(out)
}

/// Posts the card of a list item whose Snapshot, then kill finished (it offers Restore) in the
/// list's thread: the one place a list's sandbox gets a card of its own.
pub async fn post_restore_card(svc: &Services, case: &Case) {
    let Some(list_ref) = &case.list else { return };
    let target = match svc.store.get_list(&list_ref.list).await {
        Ok(list) => match list.messages.first() {
            Some(digest) => CardTarget {
                channel: digest.channel.clone(),
                thread_ts: Some(digest.ts.clone()),
            },
            None => return,
        },
        Err(e) => {
            tracing::warn!(case = %case.id, error = %e, "could not read the list of a restorable sandbox");
            return;
        }
    };
    if let Err(e) = post_card(&svc.store, &svc.slack, &svc.templates, case, &target).await {
        tracing::warn!(case = %case.id, error = %e, "could not post the restore card in the list's thread");
    }
}

// ----- clicks -----

/// A click on a list's button, as the interactions handler passes it on.
#[derive(Debug, Clone)]
pub struct ListClick<'a> {
    pub user: &'a SlackUserId,
    pub list: &'a ListId,
    pub group: Option<usize>,
    /// Identifies the click across Slack's redeliveries.
    pub dedupe: &'a str,
    /// The message the button sits on (`channel`, `ts`).
    pub clicked: (Option<&'a str>, Option<&'a str>),
}

/// Reads the list for a first click from one of its own messages.
async fn clicked_list(svc: &Services, click: &ListClick<'_>) -> Result<ListCase, Reply> {
    match svc
        .store
        .first_time(
            &format!("click:{}:{}", click.user, click.dedupe),
            super::decide::CLICK_DEDUPE_TTL,
        )
        .await
    {
        Ok(true) => {}
        Ok(false) => return Err(Reply::Nothing),
        Err(e) => return Err(Reply::Ephemeral(unavailable(&e))),
    }
    let list = svc
        .store
        .get_list(click.list)
        .await
        .map_err(|e| Reply::Ephemeral(unavailable(&e)))?;
    let on_its_message = list.messages.iter().any(|m| {
        Some(m.channel.as_str()) == click.clicked.0 && Some(m.ts.as_str()) == click.clicked.1
    });
    if !on_its_message {
        return Err(Reply::Ephemeral(
            "This button does not belong to this list's messages, so nothing was done.".into(),
        ));
    }
    if let Some(g) = click.group
        && g >= list.groups.len()
    {
        return Err(Reply::Ephemeral(ListRefusal::NoSuchGroup.to_string()));
    }
    Ok(list)
}

/// Whether `user` may choose `option` on this list (approver rule, two-person rule).
async fn allowed(
    svc: &Services,
    list: &ListCase,
    user: &SlackUserId,
    option: DecisionOption,
) -> Result<(), String> {
    let groups = groups_in_rule(svc, svc.policy.approvers.rule_for(option), user).await;
    may_decide(&svc.policy, user, &groups, option, list.requester.as_ref()).map_err(|refusal| {
        match refusal {
            // A list has no "case" its requester asked for: they started the sweep.
            crate::cases::Refusal::OwnRequest { option } => format!(
                "You are an approver, but you started this sweep, so someone else has to approve its “{option}” groups (two-person rule). Nothing was changed."
            ),
            other => other.to_string(),
        }
    })
}

/// Audits a list-level action (on the list's first item case, so `/sandbox history` of the
/// list shows it) and logs it.
async fn audit_list(
    svc: &Services,
    list: &ListCase,
    user: &SlackUserId,
    action: &str,
    outcome: &str,
) {
    tracing::info!(list = %list.id, %user, action, outcome, "list decision");
    let event = crate::store::AuditEvent {
        time: Utc::now(),
        case: None,
        subject: None,
        actor: person(user),
        action: format!("list:{action}"),
        outcome: format!("{} {outcome}", list.id),
    };
    if let Err(e) = svc.store.append_audit(&event).await {
        tracing::error!(list = %list.id, error = %e, "could not write the audit log");
    }
}

fn refused_sentence(refusal: &ListRefusal) -> Mrkdwn {
    match refusal {
        ListRefusal::AlreadyDecided(decision) => match decision.as_ref() {
            GroupDecision::Approved { by, .. } => Mrkdwn::text("Already approved by ")
                .and(Mrkdwn::user(by))
                .and(Mrkdwn::text(".")),
            GroupDecision::Reviewing { by, .. } => Mrkdwn::user(by).and(Mrkdwn::text(
                " already sent this group to review one by one.",
            )),
            GroupDecision::Open => Mrkdwn::text(&refusal.to_string()),
        },
        ListRefusal::NotInGroup(id) => Mrkdwn::text(&format!(
            "{id} is not in this group, so nothing was excluded: remove it, or paste an id \
             from this group."
        )),
        other => Mrkdwn::text(&other.to_string()),
    }
}

/// Approve group / Approve all: checks the person may choose every option involved, records
/// the approval once, and starts carrying it out.
pub async fn approve_clicked(svc: &Services, click: ListClick<'_>) -> Reply {
    let list = match clicked_list(svc, &click).await {
        Ok(list) => list,
        Err(reply) => return reply,
    };
    let (event, options) = match click.group {
        Some(g) => {
            let group = &list.groups[g];
            (
                ListEvent::Approve {
                    group: g,
                    by: click.user.clone(),
                    over_guard: true,
                },
                vec![group.option],
            )
        }
        None => (
            ListEvent::ApproveAll {
                by: click.user.clone(),
            },
            crate::cases::list::options_of_approve_all(&list)
                .into_iter()
                .collect(),
        ),
    };
    for option in options {
        if let Err(sentence) = allowed(svc, &list, click.user, option).await {
            audit_list(
                svc,
                &list,
                click.user,
                "approve",
                &format!("refused: {sentence}"),
            )
            .await;
            crate::metrics::decision(option.as_str(), "not_allowed");
            return Reply::Ephemeral(sentence);
        }
    }
    match svc.store.update_list(click.list, event, Utc::now()).await {
        Ok(ListUpdated::Applied(list)) => {
            let what = match click.group {
                Some(g) => list.groups[g].label(),
                None => "all recommendations".into(),
            };
            audit_list(svc, &list, click.user, "approve", &format!("ok: {what}")).await;
            refresh(svc, &list).await;
            kick(svc, &list.id);
            Reply::Nothing
        }
        Ok(ListUpdated::Refused { refusal, .. }) => Reply::Mentioning(refused_sentence(&refusal)),
        Err(e) => Reply::Ephemeral(unavailable(&e)),
    }
}

/// Review individually: the group's undecided sandboxes get their cards in the list's thread.
pub async fn review_clicked(svc: &Services, click: ListClick<'_>) -> Reply {
    let list = match clicked_list(svc, &click).await {
        Ok(list) => list,
        Err(reply) => return reply,
    };
    let Some(g) = click.group else {
        return Reply::Nothing;
    };
    // Sending a group to review takes its Approve away: only someone who could approve it may.
    if let Err(sentence) = allowed(svc, &list, click.user, list.groups[g].option).await {
        audit_list(
            svc,
            &list,
            click.user,
            "review",
            &format!("refused: {sentence}"),
        )
        .await;
        return Reply::Ephemeral(sentence);
    }
    let event = ListEvent::Review {
        group: g,
        by: click.user.clone(),
    };
    let list = match svc.store.update_list(click.list, event, Utc::now()).await {
        Ok(ListUpdated::Applied(list)) => list,
        Ok(ListUpdated::Refused { refusal, .. }) => {
            return Reply::Mentioning(refused_sentence(&refusal));
        }
        Err(e) => return Reply::Ephemeral(unavailable(&e)),
    };
    audit_list(svc, &list, click.user, "review", &list.groups[g].label()).await;
    refresh(svc, &list).await;
    let Some(digest) = list.messages.first() else {
        return Reply::Nothing;
    };
    let target = CardTarget {
        channel: digest.channel.clone(),
        thread_ts: Some(digest.ts.clone()),
    };
    let group = &list.groups[g];
    let items: Vec<_> = group
        .included()
        .map(|i| (Subject::Sandbox(i.sandbox.clone()), i.case.clone()))
        .collect();
    let cases = match svc.store.cases_of(&items).await {
        Ok(cases) => cases,
        Err(e) => return Reply::Ephemeral(unavailable(&e)),
    };
    let pending: Vec<Case> = cases
        .into_iter()
        .flatten()
        .filter(|c| c.state == CaseState::Pending && c.card.is_none())
        .collect();
    let (svc2, total) = (svc.clone(), pending.len());
    // Posting many cards takes a while (Slack paces chat.postMessage): it runs after the answer.
    svc.tasks.spawn(async move {
        for case in pending.into_iter().take(MAX_REVIEW_CARDS) {
            if let Err(e) = post_card(&svc2.store, &svc2.slack, &svc2.templates, &case, &target).await
            {
                tracing::warn!(case = %case.id, error = %e, "could not post a reviewed case's card");
            }
        }
    });
    if total > MAX_REVIEW_CARDS {
        Reply::Ephemeral(format!(
            "Posting the {MAX_REVIEW_CARDS} most expensive of {total} cards in the thread; the other {} stay undecided and the next sweep lists them again.",
            total - MAX_REVIEW_CARDS
        ))
    } else {
        Reply::Nothing
    }
}

/// Retry failed: the group's failed sandboxes are tried again (after their last finished step).
pub async fn retry_clicked(svc: &Services, click: ListClick<'_>) -> Reply {
    let list = match clicked_list(svc, &click).await {
        Ok(list) => list,
        Err(reply) => return reply,
    };
    let Some(g) = click.group else {
        return Reply::Nothing;
    };
    let group = &list.groups[g];
    if !matches!(group.decision, GroupDecision::Approved { .. }) {
        return Reply::Ephemeral(
            "This group was not approved, so there is nothing to retry.".into(),
        );
    }
    if let Err(sentence) = allowed(svc, &list, click.user, group.option).await {
        audit_list(
            svc,
            &list,
            click.user,
            "retry",
            &format!("refused: {sentence}"),
        )
        .await;
        return Reply::Ephemeral(sentence);
    }
    let items: Vec<_> = group
        .included()
        .map(|i| (Subject::Sandbox(i.sandbox.clone()), i.case.clone()))
        .collect();
    let cases = match svc.store.cases_of(&items).await {
        Ok(cases) => cases,
        Err(e) => return Reply::Ephemeral(unavailable(&e)),
    };
    let mut retried = 0;
    for case in cases.into_iter().flatten() {
        if !matches!(case.state, CaseState::Failed { .. }) {
            continue;
        }
        let event = Event::Retry {
            by: click.user.clone(),
        };
        if let Ok(Updated::Applied(case)) = svc.store.apply_event(&case.id, event, Utc::now()).await
        {
            audit(&svc.store, &case, person(click.user), "retry", "ok (list)").await;
            retried += 1;
        }
    }
    audit_list(
        svc,
        &list,
        click.user,
        "retry",
        &format!("{retried} sandbox(es)"),
    )
    .await;
    refresh(svc, &list).await;
    kick(svc, &list.id);
    if retried == 0 {
        Reply::Ephemeral("Nothing failed in this group any more.".into())
    } else {
        Reply::Nothing
    }
}

/// Exclude…: the modal's first page, after checking the person may leave sandboxes alone.
pub async fn exclude_clicked(
    svc: &Services,
    click: ListClick<'_>,
) -> Result<view::ExcludeModalParams, Reply> {
    let list = clicked_list(svc, &click).await?;
    let Some(g) = click.group else {
        return Err(Reply::Nothing);
    };
    if list.groups[g].decision != GroupDecision::Open {
        return Err(Reply::Ephemeral(
            "This group was already decided, so nothing can be excluded from it.".into(),
        ));
    }
    allowed(svc, &list, click.user, DecisionOption::Leave)
        .await
        .map_err(Reply::Ephemeral)?;
    Ok(view::exclude_modal(
        &list,
        g,
        &list.groups[g],
        0,
        None,
        svc.lists.max_exclude_for,
    ))
}

/// What an exclude modal's page submitted.
#[derive(Debug, Clone)]
pub struct ExcludeSubmission<'a> {
    pub user: &'a SlackUserId,
    pub view_id: &'a str,
    pub metadata: &'a str,
    /// The ticked checkboxes' values.
    pub ticked: Vec<String>,
    pub pasted: Option<&'a str>,
    /// `YYYY-MM-DD`.
    pub until: Option<&'a str>,
}

/// What an exclude modal's submission answers.
#[derive(Debug, Clone)]
pub enum ExcludeReply {
    Modal(SubmissionReply),
    /// Show this page next (`response_action: update`).
    NextPage(Box<view::ExcludeModalParams>),
}

/// Reads the ids pasted into the modal: separated by spaces, commas or new lines.
pub fn pasted_ids(text: &str) -> Result<Vec<SandboxId>, String> {
    text.split(|c: char| c.is_whitespace() || c == ',')
        .filter(|s| !s.is_empty())
        .map(|s| SandboxId::parse(s.trim_matches('`')).map_err(|e| e.to_string()))
        .collect()
}

/// Excludes what one page of the modal names: a Leave (with its until-date) on each sandbox's
/// case, so the next sweep does not raise it, and the list records it. Then the next page.
pub async fn exclude_submitted(
    svc: &Services,
    sub: ExcludeSubmission<'_>,
    now: DateTime<Utc>,
) -> ExcludeReply {
    use crate::slack::payload::SWEEP_LIST_PASTE_BLOCK;
    let error = |block: &'static str, message: String| {
        ExcludeReply::Modal(SubmissionReply::Error { block, message })
    };
    let Some((target, page)) = view::parse_exclude_metadata(sub.metadata) else {
        return error(
            SWEEP_LIST_PASTE_BLOCK,
            "This form is out of date; click Exclude… again.".into(),
        );
    };
    let Some(g) = target.group else {
        return error(
            SWEEP_LIST_PASTE_BLOCK,
            "This form is out of date; click Exclude… again.".into(),
        );
    };
    let mut ids = Vec::new();
    for value in &sub.ticked {
        match SandboxId::parse(value.as_str()) {
            Ok(id) => ids.push(id),
            Err(e) => return error(SWEEP_LIST_PASTE_BLOCK, e.to_string()),
        }
    }
    match sub.pasted.map(pasted_ids).transpose() {
        Ok(pasted) => ids.extend(pasted.unwrap_or_default()),
        Err(e) => return error(SWEEP_LIST_PASTE_BLOCK, e),
    }
    // Capped by `[hygiene] max_exclude_for`: no date lasts that long, a later date is refused.
    let until = match super::decide::leave_until(sub.until, now, svc.lists.max_exclude_for) {
        Ok(until) => Some(until),
        Err(message) => return error(crate::slack::payload::CASE_UNTIL_BLOCK, message),
    };
    let list = match svc.store.get_list(&target.list).await {
        Ok(list) => list,
        Err(e) => return error(SWEEP_LIST_PASTE_BLOCK, unavailable(&e)),
    };
    if g >= list.groups.len() {
        return error(SWEEP_LIST_PASTE_BLOCK, ListRefusal::NoSuchGroup.to_string());
    }
    if let Err(sentence) = allowed(svc, &list, sub.user, DecisionOption::Leave).await {
        return error(SWEEP_LIST_PASTE_BLOCK, sentence);
    }
    let event = ListEvent::Exclude {
        group: g,
        sandboxes: ids.clone(),
        until,
        by: sub.user.clone(),
    };
    // Refused before the submission is marked seen: an id that is not in the group (pasted
    // wrong, say) is named in the form, and the corrected form is then acted on, not dropped
    // as a repeat.
    if !ids.is_empty()
        && let Err(refusal) = crate::cases::list::apply_list(&list, event.clone(), now)
    {
        return error(
            refusal_block(&refusal),
            refused_sentence(&refusal).to_plain(),
        );
    }
    // What was submitted is part of the key: Slack delivering the same form twice excludes once,
    // while a different form from the same modal page is its own submission.
    let fingerprint = {
        use sha2::Digest as _;
        let mut hasher = sha2::Sha256::new();
        for id in &ids {
            hasher.update(id.as_str().as_bytes());
            hasher.update(b"\n");
        }
        hasher.update(sub.until.unwrap_or_default().as_bytes());
        hex::encode(&hasher.finalize()[..8])
    };
    let first = match svc
        .store
        .first_time(
            &format!(
                "view:{}:{}:{page}:{fingerprint}",
                sub.view_id,
                target.encode()
            ),
            super::decide::CLICK_DEDUPE_TTL,
        )
        .await
    {
        Ok(first) => first,
        Err(e) => return error(SWEEP_LIST_PASTE_BLOCK, unavailable(&e)),
    };
    let mut list = list;
    if first && !ids.is_empty() {
        list = match svc.store.update_list(&target.list, event, now).await {
            Ok(ListUpdated::Applied(list)) => list,
            Ok(ListUpdated::Refused { refusal, .. }) => {
                return error(
                    refusal_block(&refusal),
                    refused_sentence(&refusal).to_plain(),
                );
            }
            Err(e) => return error(SWEEP_LIST_PASTE_BLOCK, unavailable(&e)),
        };
        leave_excluded(svc, &list, g, &ids, sub.user, until).await;
        audit_list(
            svc,
            &list,
            sub.user,
            "exclude",
            &format!(
                "{} sandbox(es) of {}{}",
                ids.len(),
                list.groups[g].label(),
                until.map_or_else(String::new, |u| format!(" until {}", when(u)))
            ),
        )
        .await;
        refresh(svc, &list).await;
    }
    let group = &list.groups[g];
    let next = page + 1;
    if next < view::exclude_pages(group) && first {
        let note = (!ids.is_empty()).then(|| format!("Excluded {}.", ids.len()));
        ExcludeReply::NextPage(Box::new(view::exclude_modal(
            &list,
            g,
            group,
            next,
            note.as_deref(),
            svc.lists.max_exclude_for,
        )))
    } else {
        ExcludeReply::Modal(SubmissionReply::Close)
    }
}

/// The exclude form's input a refusal is shown under: the date's, or the pasted ids'.
fn refusal_block(refusal: &ListRefusal) -> &'static str {
    match refusal {
        ListRefusal::UntilInPast => crate::slack::payload::CASE_UNTIL_BLOCK,
        _ => crate::slack::payload::SWEEP_LIST_PASTE_BLOCK,
    }
}

/// Records each excluded sandbox's Leave on its own case (the mark sweeps honour).
async fn leave_excluded(
    svc: &Services,
    list: &ListCase,
    g: usize,
    ids: &[SandboxId],
    user: &SlackUserId,
    until: Option<DateTime<Utc>>,
) {
    let group = &list.groups[g];
    for item in group.items.iter().filter(|i| ids.contains(&i.sandbox)) {
        let event = Event::Decide {
            option: DecisionOption::Leave,
            by: user.clone(),
            reason: Some("excluded from the sweep's list".into()),
            until,
        };
        match svc.store.apply_event(&item.case, event, Utc::now()).await {
            Ok(Updated::Applied(case)) => {
                let outcome = match until {
                    Some(until) => format!("ok (excluded from the list until {})", when(until)),
                    None => "ok (excluded from the list)".to_owned(),
                };
                audit(&svc.store, &case, person(user), "decide:leave", &outcome).await;
            }
            Ok(Updated::Rejected { error, .. }) => {
                tracing::info!(case = %item.case, %error, "an excluded sandbox's case was already decided");
            }
            Err(e) => {
                tracing::warn!(case = %item.case, error = %e, "could not record an exclusion's Leave")
            }
        }
    }
}

// ----- carrying out -----

/// Lists this process is driving now.
static DRIVING: LazyLock<Mutex<std::collections::HashSet<ListId>>> =
    LazyLock::new(|| Mutex::new(std::collections::HashSet::new()));

fn lease_name(id: &ListId) -> String {
    format!("list:{id}")
}

/// Starts driving `list` on this replica unless it already is (or another replica holds it).
pub fn kick(svc: &Services, id: &ListId) {
    if !DRIVING
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(id.clone())
    {
        return;
    }
    let (svc2, id2) = (svc.clone(), id.clone());
    svc.tasks.spawn(async move {
        if let Err(e) = drive(&svc2, &id2).await {
            tracing::warn!(list = %id2, error = %e, "driving the list stopped");
        }
        DRIVING
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id2);
    });
}

/// One pass of the lists loop: expire lists past their deadline and drive every list in play
/// (a replica that died mid-list is replaced here).
pub async fn lists_once(svc: &Services) -> Result<(), StoreError> {
    for id in svc.store.active_lists().await? {
        kick(svc, &id);
    }
    Ok(())
}

/// The lists loop of one replica: [`lists_once`] every `every` until shutdown.
pub async fn run_lists(
    svc: Services,
    every: Duration,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    loop {
        if let Err(e) = lists_once(&svc).await {
            tracing::warn!(error = %e, "the lists pass failed");
        }
        tokio::select! {
            _ = &mut shutdown => return,
            _ = tokio::time::sleep(every) => {}
        }
    }
}

/// An item that needs work: its case, its group's option, who approved it.
struct Work {
    case: Case,
    option: DecisionOption,
    approver: SlackUserId,
    /// The batched re-check readings of the item's group.
    readings: Option<Arc<reading::Readings>>,
}

/// Carries out `list`'s approved groups while holding its lease: decides each waiting item for
/// its group's approver and executes it, `concurrency` at a time; rewrites the progress every
/// `progress_every`; expires the list at its deadline; retires it when nothing is left to do.
async fn drive(svc: &Services, id: &ListId) -> Result<(), StoreError> {
    let settings = svc.lists;
    let lease = lease_name(id);
    let holder = uuid::Uuid::new_v4().to_string();
    let lease_ttl = (settings.progress_every * 4).max(Duration::from_secs(2));
    if !svc.store.acquire_lease(&lease, &holder, lease_ttl).await? {
        return Ok(());
    }
    let result = drive_holding(svc, id, &lease, &holder, lease_ttl).await;
    if let Err(e) = svc.store.release_lease(&lease, &holder).await {
        tracing::warn!(list = %id, error = %e, "could not release the list lease");
    }
    result
}

async fn drive_holding(
    svc: &Services,
    id: &ListId,
    lease: &str,
    holder: &str,
    lease_ttl: Duration,
) -> Result<(), StoreError> {
    let settings = svc.lists;
    loop {
        // A stopping replica starts no more items; releasing the lease lets another carry on.
        if svc.draining.is_cancelled() {
            return Ok(());
        }
        let mut list = svc.store.get_list(id).await?;
        let now = Utc::now();
        if list.expired_at.is_none()
            && now >= list.decide_by
            && let ListUpdated::Applied(expired) =
                svc.store.update_list(id, ListEvent::Expire, now).await?
        {
            list = expired;
        }
        let work = pending_work(&svc.store, svc.e2b.as_ref(), &list).await?;
        refresh(svc, &list).await;
        if work.is_empty() {
            let undecided = list
                .groups
                .iter()
                .any(|g| g.decision == GroupDecision::Open);
            if list.expired_at.is_some() || !undecided {
                // Approved groups are finished (or their items are being finished by others).
                let progress = progress_of(&svc.store, &list).await?;
                if progress.iter().flatten().all(|p| p.finished()) {
                    svc.store.retire_list(id).await?;
                    lock_shown().retain(|(shown, _), _| shown != id);
                }
            }
            return Ok(());
        }
        let stop = tokio_util::sync::CancellationToken::new();
        let keeper = keep_lease_and_progress(
            svc.clone(),
            id.clone(),
            lease.to_owned(),
            holder.to_owned(),
            lease_ttl,
            stop.clone(),
        );
        let before: usize = work.len();
        let acting: Vec<_> = work
            .into_iter()
            .map(|w| act(svc, w, settings.item_lease))
            .collect();
        let results: Vec<bool> = futures::stream::iter(acting)
            .buffer_unordered(settings.concurrency.max(1))
            .collect()
            .await;
        stop.cancel();
        let lease_kept = keeper.await.unwrap_or(false);
        if !lease_kept {
            return Ok(());
        }
        let finished = results.iter().filter(|ok| **ok).count();
        if svc.draining.is_cancelled() {
            return Ok(());
        }
        if finished == 0 && before > 0 {
            // Nothing moved (E2B down, items held by another replica's leases): wait a beat.
            tokio::time::sleep(settings.progress_every).await;
        }
    }
}

/// While a batch runs: renews the list lease and rewrites the progress every `progress_every`.
/// Its result says whether the lease was held throughout.
fn keep_lease_and_progress(
    svc: Services,
    id: ListId,
    lease: String,
    holder: String,
    ttl: Duration,
    stop: tokio_util::sync::CancellationToken,
) -> tokio::task::JoinHandle<bool> {
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = stop.cancelled() => return true,
                _ = tokio::time::sleep(svc.lists.progress_every) => {}
            }
            match svc.store.renew_lease(&lease, &holder, ttl).await {
                Ok(true) => {}
                Ok(false) => {
                    tracing::warn!(list = %id, "lost the list lease; another replica carries on");
                    return false;
                }
                Err(e) => tracing::warn!(list = %id, error = %e, "could not renew the list lease"),
            }
            if let Ok(list) = svc.store.get_list(&id).await {
                refresh(&svc, &list).await;
            }
        }
    })
}

/// The approved groups' items still to be decided or finished, group by group, each group's in
/// the order E2B lists them (oldest first) so its items' re-checks can be read in batches
/// ([`reading::Readings`]) just before their turns.
async fn pending_work(
    store: &Store,
    e2b: Option<&crate::e2b::E2bClient>,
    list: &ListCase,
) -> Result<Vec<Work>, StoreError> {
    let mut wanted = Vec::new();
    for (gi, g) in list.groups.iter().enumerate() {
        let GroupDecision::Approved { by, .. } = &g.decision else {
            continue;
        };
        for item in g.included() {
            wanted.push((gi, g, by, item));
        }
    }
    let keys: Vec<_> = wanted
        .iter()
        .map(|(_, _, _, i)| (Subject::Sandbox(i.sandbox.clone()), i.case.clone()))
        .collect();
    let cases = store.cases_of(&keys).await?;
    let mut work: Vec<(usize, Work)> = wanted
        .into_iter()
        .zip(cases)
        .filter_map(
            |((gi, g, by, _), case): ((usize, &ListGroup, &SlackUserId, _), Option<Case>)| {
                let case = case?;
                let todo = match &case.state {
                    CaseState::Pending => list.expired_at.is_none(),
                    CaseState::Decided { .. } | CaseState::Executing { .. } => true,
                    _ => false,
                };
                todo.then(|| {
                    (
                        gi,
                        Work {
                            case,
                            option: g.option,
                            approver: by.clone(),
                            readings: None,
                        },
                    )
                })
            },
        )
        .collect();
    fn order_key(w: &Work) -> Option<(Option<DateTime<Utc>>, &str)> {
        match &w.case.subject {
            Subject::Sandbox(id) => Some(reading::listing_order(w.case.evidence.started_at, id)),
            _ => None,
        }
    }
    work.sort_by(|(ga, a), (gb, b)| ga.cmp(gb).then_with(|| order_key(a).cmp(&order_key(b))));
    if let Some(e2b) = e2b {
        for chunk in work.chunk_by_mut(|(ga, _), (gb, _)| ga == gb) {
            let items = chunk.iter().filter_map(|(_, w)| match &w.case.subject {
                Subject::Sandbox(id) => {
                    Some((id, w.case.evidence.started_at, &w.case.evidence.metadata))
                }
                _ => None,
            });
            let readings = Arc::new(reading::Readings::new(e2b, items));
            for (_, w) in chunk.iter_mut() {
                w.readings = Some(readings.clone());
            }
        }
    }
    Ok(work.into_iter().map(|(_, w)| w).collect())
}

/// Decides (if still waiting) and executes one item. True when it ended (done, failed,
/// skipped); false when it is left for later (transient failure, held by another worker).
async fn act(svc: &Services, work: Work, item_lease: Duration) -> bool {
    let Work {
        case,
        option,
        approver,
        readings,
    } = work;
    if svc.draining.is_cancelled() {
        return false;
    }
    if case.state == CaseState::Pending {
        let event = Event::Decide {
            option,
            by: approver.clone(),
            reason: Some("approved with the sweep's list".into()),
            until: None,
        };
        let applied = svc.store.apply_event(&case.id, event, Utc::now()).await;
        crate::metrics::decision(option.as_str(), super::decide::decision_outcome(&applied));
        match applied {
            Ok(Updated::Applied(decided)) => {
                audit(
                    &svc.store,
                    &decided,
                    person(&approver),
                    &format!("decide:{}", option.as_str()),
                    "ok (list)",
                )
                .await;
            }
            // Decided meanwhile (a replica that died after deciding, or a card's click): the
            // execution below finds out which.
            Ok(Updated::Rejected { .. }) => {}
            Err(e) => {
                tracing::warn!(case = %case.id, error = %e, "could not decide a list item");
                return false;
            }
        }
    }
    match super::worker::handler::execute_case_reading(
        svc,
        &case.id,
        item_lease,
        readings.as_deref(),
    )
    .await
    {
        Ok(_) => true,
        Err(crate::jobs::JobError::Permanent(_)) => true,
        Err(crate::jobs::JobError::Transient(reason) | crate::jobs::JobError::HandBack(reason)) => {
            tracing::debug!(case = %case.id, %reason, "a list item will be tried again");
            false
        }
    }
}
