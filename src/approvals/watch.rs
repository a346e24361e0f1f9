//! What `[[watch]]` rules do with a `created` event (the rules themselves: [`crate::watch`]).
//!
//! - A creation rule that matches opens a case for the sandbox (Shorten timeout, Kill, Leave;
//!   the same approvers, exactly-once execution and re-check as every case), or posts a notice
//!   naming the owner, as the rule says. One case per sandbox: a second event, a second rule or
//!   a second replica finds the case already open.
//! - A burst rule records the creation under its group (owner, template, one metadata value) in
//!   the store, shared by replicas; past `more_than` within `within`, one alert list holds the
//!   group's sandboxes with **Pause all of these**, **Kill all of these** and **Leave them**, and
//!   grows (its message updated in place) as more arrive, until someone decides. A decided alert
//!   does not grow: the burst's next creations start a new one.
//! - A rule in dry run only logs what it would have raised.
//!
//! Evidence is read from E2B (the sandbox as it is now), so the re-check before acting compares
//! like with like; a sandbox already gone is not raised.
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::StreamExt;

use super::{CardTarget, Services, actor_of, audit, evidence, open_built_case};
use crate::cases::list::{BurstAlert, GroupDecision, ListCase, ListEvent, ListGroup, ListItem};
use crate::cases::{Case, CaseDraft, DecisionOption, ListRef, Opener, Recommendation, Subject};
use crate::e2b::{E2bError, SandboxDetail};
use crate::ids::{ListId, SandboxId, SlackChannelId};
use crate::lifecycle::LifecycleEvent;
use crate::slack::render::Message;
use crate::store::{ListUpdated, Opened, StoreError};
use crate::watch::{BurstRule, CreationRule, MAX_BURST_ITEMS, RuleKind, Then, WatchRule};

/// Sandboxes read from E2B at once when a burst alert opens or grows.
const READ_CONCURRENCY: usize = 8;
/// Attempts to find or make the burst's open alert when replicas race.
const ALERT_ATTEMPTS: usize = 4;
/// Rounds of compare-and-swap attempts one growth makes before it gives up (each round is the
/// store's own retries).
const GROW_ATTEMPTS: u32 = 20;
/// How long a delivery waits for an alert another replica claimed to be stored, before it
/// takes the claim over (that replica died between the two).
const CLAIMED_ALERT_PATIENCE: Duration = Duration::from_secs(3);

/// Why a rule's work could not be done; the event is then handled again later.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("E2B: {0}")]
    E2b(String),
    #[error("{0}")]
    Open(String),
}

/// What the rules did with one creation, for the metric and the log.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Raised {
    pub cases: usize,
    pub notices: usize,
    /// Burst alerts opened or grown.
    pub alerts: usize,
    pub dry_run: usize,
}

impl Raised {
    pub fn any(&self) -> bool {
        self.cases + self.notices + self.alerts + self.dry_run > 0
    }
}

/// Evaluates every rule on a `created` event.
pub async fn on_created(
    svc: &Services,
    event: &LifecycleEvent,
    now: DateTime<Utc>,
) -> Result<Raised, WatchError> {
    let mut raised = Raised::default();
    // Read at most once for all rules.
    let mut detail: Option<Option<SandboxDetail>> = None;
    for rule in svc.watch.iter() {
        match &rule.kind {
            RuleKind::Creation(c) => {
                let wants_detail = c.needs_end()
                    || (!rule.dry_run && c.then == Then::Case)
                    || !c.template_allowed_by_id(event);
                if wants_detail && detail.is_none() {
                    detail = Some(read(svc, &event.sandbox).await?);
                }
                let found = match &detail {
                    // Gone already: nothing to raise.
                    Some(None) => continue,
                    Some(Some(d)) => c.findings(event, Some(d.end_at), d.alias.as_deref()),
                    None => c.findings(event, None, None),
                };
                if found.is_empty() {
                    continue;
                }
                if rule.dry_run {
                    tracing::info!(rule = %rule.name, sandbox = %event.sandbox, findings = %found.join("; "), "watch rule (dry run): would have raised this sandbox");
                    crate::metrics::watch("creation", "dry_run");
                    raised.dry_run += 1;
                    continue;
                }
                match c.then {
                    Then::Case => {
                        let Some(Some(d)) = &detail else { continue };
                        if open_creation_case(svc, rule, c, event, d, &found, now).await? {
                            raised.cases += 1;
                        }
                    }
                    Then::Notice => {
                        post_notice(svc, rule, event, &found).await;
                        raised.notices += 1;
                    }
                }
            }
            RuleKind::Burst(b) => {
                if burst(svc, rule, b, event, now).await? {
                    if rule.dry_run {
                        raised.dry_run += 1;
                    } else {
                        raised.alerts += 1;
                    }
                }
            }
        }
    }
    Ok(raised)
}

/// The sandbox as E2B reports it now; `None` when it is gone.
async fn read(svc: &Services, id: &SandboxId) -> Result<Option<SandboxDetail>, WatchError> {
    let Some(e2b) = &svc.e2b else {
        return Err(WatchError::E2b(
            "E2B is not configured, so the sandbox cannot be read".into(),
        ));
    };
    match e2b.get_sandbox(id).await {
        Ok(d) => Ok(Some(d)),
        Err(E2bError::NotFound { .. }) => Ok(None),
        Err(e) => Err(WatchError::E2b(e.to_string())),
    }
}

/// `created without …; its timeout …` as a sentence: capitalised, with a full stop.
fn sentence(text: &str) -> String {
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => format!("{}{}.", first.to_uppercase(), chars.as_str()),
        None => String::new(),
    }
}

fn channel_of(svc: &Services, rule: &WatchRule) -> Option<SlackChannelId> {
    rule.channel
        .clone()
        .or_else(|| svc.approvals_channel.clone())
}

async fn open_creation_case(
    svc: &Services,
    rule: &WatchRule,
    c: &CreationRule,
    event: &LifecycleEvent,
    detail: &SandboxDetail,
    found: &[String],
    now: DateTime<Utc>,
) -> Result<bool, WatchError> {
    let Some(channel) = channel_of(svc, rule) else {
        tracing::warn!(rule = %rule.name, sandbox = %event.sandbox, "watch rule matched, but neither the rule nor [channels] approvals names a channel; nothing was raised");
        return Ok(false);
    };
    let reason = sentence(&found.join("; "));
    let draft = CaseDraft {
        subject: Subject::Sandbox(event.sandbox.clone()),
        evidence: evidence::from_detail(detail, None),
        recommendation: Recommendation {
            option: DecisionOption::Shorten,
            reason: format!(
                "shorten its timeout to {} so it ends soon unless someone says it should stay",
                crate::slack::format::human_duration(c.shorten_to)
            ),
        },
        options: Some(vec![
            DecisionOption::Shorten,
            DecisionOption::Kill,
            DecisionOption::Leave,
        ]),
        opener: Opener::Watch {
            rule: rule.name.clone(),
        },
        reason,
        decide_by: svc
            .policy
            .decide_by(now)
            .min(detail.end_at)
            .max(now + chrono::Duration::minutes(1)),
    };
    let mut case: Case = draft
        .into_case(now)
        .map_err(|e| WatchError::Open(e.to_string()))?;
    case.shorten_to_secs = Some(c.shorten_to.as_secs());
    let opened = open_built_case(
        &svc.store,
        &svc.slack,
        &svc.templates,
        case,
        CardTarget {
            channel,
            thread_ts: None,
        },
    )
    .await
    .map_err(|e| WatchError::Open(e.to_string()))?;
    let created = matches!(opened, Opened::Created(_));
    crate::metrics::watch("creation", if created { "case" } else { "already_open" });
    Ok(created)
}

async fn post_notice(svc: &Services, rule: &WatchRule, event: &LifecycleEvent, found: &[String]) {
    let Some(channel) = channel_of(svc, rule) else {
        tracing::warn!(rule = %rule.name, sandbox = %event.sandbox, "watch rule matched, but no channel is set for its notice");
        return;
    };
    let owner = crate::cases::Evidence::owner_from_metadata(&event.metadata)
        .map(|o| format!("owner {}", crate::slack::format::cut(&o, 80)))
        .unwrap_or_else(|| "no owner in its metadata".into());
    let text = format!(
        ":eyes: Watch rule `{}`: sandbox `{}` ({owner}): {}. Nothing was done to it; `/sandbox kill {}` opens a case if it should end.",
        rule.name,
        event.sandbox,
        found.join("; "),
        event.sandbox
    );
    match svc.slack.post_message(&channel, Message::plain(text)).await {
        Ok(_) => crate::metrics::watch("creation", "notice"),
        Err(e) => {
            crate::metrics::watch("creation", "failed");
            tracing::warn!(rule = %rule.name, sandbox = %event.sandbox, error = %e, "a watch notice could not be posted");
        }
    }
}

/// Records the creation for a burst rule and, past its threshold, opens or grows the alert.
/// True when an alert was raised (or, in dry run, would have been).
async fn burst(
    svc: &Services,
    rule: &WatchRule,
    b: &BurstRule,
    event: &LifecycleEvent,
    now: DateTime<Utc>,
) -> Result<bool, WatchError> {
    let Some((by, value)) = b.group_of(event) else {
        return Ok(false);
    };
    let group = format!("{by}={value}");
    let recent = svc
        .store
        .record_creation(&rule.name, &group, &event.sandbox, event.at, b.within)
        .await?;
    let members = densest_window(&recent, event.at, b.within);
    if members.len() <= b.more_than {
        return Ok(false);
    }
    if rule.dry_run {
        tracing::info!(rule = %rule.name, group = %group, count = members.len(), "watch rule (dry run): would have raised a burst alert");
        crate::metrics::watch("burst", "dry_run");
        return Ok(true);
    }
    let Some(channel) = channel_of(svc, rule) else {
        tracing::warn!(rule = %rule.name, group = %group, "burst, but neither the rule nor [channels] approvals names a channel");
        return Ok(false);
    };
    let ttl = svc
        .policy
        .decide_within
        .max(b.within)
        .max(Duration::from_secs(60));
    let mut candidate = ListId::generate();
    for _ in 0..ALERT_ATTEMPTS {
        let alert = svc
            .store
            .burst_alert(&rule.name, &group, &candidate, ttl)
            .await?;
        if alert == candidate {
            open_alert(svc, rule, b, (&by, &value), &alert, &members, &channel, now).await?;
            crate::metrics::watch("burst", "alert");
            return Ok(true);
        }
        // Each delivery adds its own sandbox (the one that opened the alert added those before
        // it): reading every member again on every delivery would cost a burst of N creations
        // N² reads.
        let own: Vec<(SandboxId, DateTime<Utc>)> = members
            .iter()
            .filter(|(s, _)| s == &event.sandbox)
            .cloned()
            .collect();
        let last_at = members.last().map_or(now, |m| m.1);
        match grow_alert(svc, &rule.name, &alert, &own, (members.len(), last_at), now).await? {
            true => {
                crate::metrics::watch("burst", "grown");
                return Ok(true);
            }
            // Decided, expired, or not yet stored by the replica that claimed it: start a new
            // alert in its place (the claim moves to ours only if it is still theirs).
            false => {
                candidate = ListId::generate();
                let now_recorded = svc
                    .store
                    .replace_burst_alert(&rule.name, &group, &alert, &candidate, ttl)
                    .await?;
                if now_recorded == candidate {
                    open_alert(
                        svc,
                        rule,
                        b,
                        (&by, &value),
                        &candidate,
                        &members,
                        &channel,
                        now,
                    )
                    .await?;
                    crate::metrics::watch("burst", "alert");
                    return Ok(true);
                }
            }
        }
    }
    Err(WatchError::Open(format!(
        "the burst alert of {group} kept changing while this creation was added"
    )))
}

/// How often a growing alert's message is rewritten (per replica): Slack allows about one
/// `chat.update` a second per channel, and a burst can bring hundreds of creations a second.
const ALERT_REFRESH_EVERY: Duration = Duration::from_secs(2);

/// Alerts with a rewrite scheduled on this replica.
static REFRESH_SCHEDULED: std::sync::LazyLock<std::sync::Mutex<std::collections::HashSet<ListId>>> =
    std::sync::LazyLock::new(Default::default);

/// Rewrites the alert's message within [`ALERT_REFRESH_EVERY`], once for every growth until then.
fn refresh_soon(svc: &Services, id: &ListId) {
    {
        let mut scheduled = REFRESH_SCHEDULED.lock().unwrap_or_else(|e| e.into_inner());
        if !scheduled.insert(id.clone()) {
            return;
        }
    }
    let (svc, id) = (svc.clone(), id.clone());
    let tasks = svc.tasks.clone();
    tasks.spawn(async move {
        tokio::time::sleep(ALERT_REFRESH_EVERY).await;
        REFRESH_SCHEDULED
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
        match svc.store.get_list(&id).await {
            Ok(list) => super::list::refresh(&svc, &list).await,
            Err(e) => {
                tracing::warn!(list = %id, error = %e, "a burst alert could not be rewritten")
            }
        }
    });
}

/// The creations of the busiest `within`-long window that holds `at`, by time.
fn densest_window(
    recent: &[(SandboxId, DateTime<Utc>)],
    at: DateTime<Utc>,
    within: Duration,
) -> Vec<(SandboxId, DateTime<Utc>)> {
    let span = chrono::Duration::from_std(within).unwrap_or(chrono::Duration::days(1));
    let mut best: &[(SandboxId, DateTime<Utc>)] = &[];
    let mut start = 0;
    for end in 0..recent.len() {
        while recent[end].1 - recent[start].1 > span {
            start += 1;
        }
        let window = &recent[start..=end];
        let holds_at = recent[start].1 <= at && at <= recent[end].1;
        if holds_at && window.len() > best.len() {
            best = window;
        }
    }
    best.to_vec()
}

/// Opens one case (without a card) per sandbox of `members` that has none yet, as items of
/// `list`'s group 0; returns the new items. A sandbox gone already is left out.
async fn open_items(
    svc: &Services,
    rule: &str,
    list: &ListId,
    reason: &str,
    members: &[(SandboxId, DateTime<Utc>)],
    now: DateTime<Utc>,
) -> Result<Vec<ListItem>, WatchError> {
    let ids: Vec<SandboxId> = members
        .iter()
        .take(MAX_BURST_ITEMS)
        .map(|(id, _)| id.clone())
        .collect();
    let reads = ids.into_iter().map(|id| async move {
        let detail = read(svc, &id).await;
        (id, detail)
    });
    let details: Vec<(SandboxId, Result<Option<SandboxDetail>, WatchError>)> =
        futures::stream::iter(reads)
            .buffered(READ_CONCURRENCY)
            .collect()
            .await;
    let mut items = Vec::new();
    for (id, detail) in details {
        let Some(detail) = detail? else { continue };
        let draft = CaseDraft {
            subject: Subject::Sandbox(id.clone()),
            evidence: evidence::from_detail(&detail, None),
            recommendation: Recommendation {
                option: DecisionOption::Pause,
                reason: "pause them until their owner says what they are for".into(),
            },
            options: Some(vec![
                DecisionOption::Pause,
                DecisionOption::Kill,
                DecisionOption::Leave,
            ]),
            opener: Opener::Watch {
                rule: rule.to_owned(),
            },
            reason: reason.to_owned(),
            decide_by: svc.policy.decide_by(now),
        };
        let mut case = draft
            .into_case(now)
            .map_err(|e| WatchError::Open(e.to_string()))?;
        case.list = Some(ListRef {
            list: list.clone(),
            group: 0,
        });
        match svc.store.open_case(case).await? {
            Opened::Created(case) => {
                audit(
                    &svc.store,
                    &case,
                    actor_of(&case.opener),
                    "open",
                    &format!("{} (in burst alert {list})", case.reason),
                )
                .await;
                items.push(ListItem {
                    sandbox: id,
                    case: case.id,
                });
            }
            // Opened for this alert by another delivery whose growth did not land: add it
            // again (growing skips what is already there).
            Opened::Existing(case) if case.list.as_ref().is_some_and(|r| &r.list == list) => {
                items.push(ListItem {
                    sandbox: id,
                    case: case.id,
                });
            }
            Opened::Existing(_) => {}
        }
    }
    Ok(items)
}

#[allow(clippy::too_many_arguments)]
async fn open_alert(
    svc: &Services,
    rule: &WatchRule,
    b: &BurstRule,
    (by, value): (&str, &str),
    id: &ListId,
    members: &[(SandboxId, DateTime<Utc>)],
    channel: &SlackChannelId,
    now: DateTime<Utc>,
) -> Result<(), WatchError> {
    let reason = format!(
        "Watch rule `{}`: more than {} sandboxes created for {by} {value} within {}.",
        rule.name,
        b.more_than,
        crate::watch::human(b.within)
    );
    // Stored before anything slow, so another delivery that finds this alert claimed finds it
    // stored too and grows it, rather than waiting on the E2B reads below.
    let list = ListCase {
        id: id.clone(),
        version: 0,
        created_at: now,
        decide_by: svc.policy.decide_by(now),
        requester: None,
        groups: vec![ListGroup {
            owner: None,
            owner_slack: None,
            option: DecisionOption::Pause,
            // A burst's sandboxes have no cost to rank them by: the alert names them instead.
            top: Vec::new(),
            items: Vec::new(),
            cost_per_day_usd: 0.0,
            paused_disk_bytes: 0,
            held_by_guard: false,
            decision: GroupDecision::Open,
            excluded: Vec::new(),
            message: 0,
            choices: vec![
                DecisionOption::Pause,
                DecisionOption::Kill,
                DecisionOption::Leave,
            ],
        }],
        messages: Vec::new(),
        summary: reason,
        expired_at: None,
        burst: Some(Box::new(BurstAlert {
            rule: rule.name.clone(),
            by: by.to_owned(),
            value: value.to_owned(),
            more_than: b.more_than,
            within_secs: b.within.as_secs(),
            count: members.len(),
            first_at: members.first().map_or(now, |m| m.1),
            last_at: members.last().map_or(now, |m| m.1),
        })),
    };
    svc.store.create_list(&list).await?;
    let last_at = members.last().map_or(now, |m| m.1);
    grow_alert(svc, &rule.name, id, members, (members.len(), last_at), now).await?;
    // Posted as it stands now (other deliveries may have grown it meanwhile); a growth that
    // lands while it is being posted updates the message after.
    let latest = svc.store.get_list(id).await?;
    let posted = super::list::publish(&svc.store, &svc.slack, &svc.templates, &latest, channel)
        .await
        .map_err(|e| WatchError::Open(format!("the burst alert could not be posted: {e}")))?;
    let latest = svc.store.get_list(id).await.unwrap_or(posted);
    super::list::refresh(svc, &latest).await;
    Ok(())
}

/// Adds the members not yet in the open alert `id` and updates its message. False when the
/// alert cannot grow (decided, expired, or not stored yet).
async fn grow_alert(
    svc: &Services,
    rule: &str,
    id: &ListId,
    members: &[(SandboxId, DateTime<Utc>)],
    (count, last_at): (usize, DateTime<Utc>),
    now: DateTime<Utc>,
) -> Result<bool, WatchError> {
    // The replica that claimed it stores it one round trip after the claim.
    let mut waited = Duration::ZERO;
    let list = loop {
        match svc.store.get_list(id).await {
            Ok(list) => break list,
            Err(StoreError::NotFound(_)) if waited < CLAIMED_ALERT_PATIENCE => {
                tokio::time::sleep(Duration::from_millis(20)).await;
                waited += Duration::from_millis(20);
            }
            Err(StoreError::NotFound(_)) => return Ok(false),
            Err(e) => return Err(e.into()),
        }
    };
    let Some(g) = list.groups.first() else {
        return Ok(false);
    };
    if g.decision != GroupDecision::Open || list.expired_at.is_some() || now >= list.decide_by {
        return Ok(false);
    }
    let room = MAX_BURST_ITEMS.saturating_sub(g.items.len());
    let new: Vec<(SandboxId, DateTime<Utc>)> = members
        .iter()
        .filter(|(s, _)| !g.items.iter().any(|i| &i.sandbox == s))
        .take(room)
        .cloned()
        .collect();
    let items = open_items(svc, rule, id, &list.summary, &new, now).await?;
    let event = ListEvent::Grow {
        group: 0,
        items,
        count,
        last_at,
    };
    // A burst's deliveries all grow the same alert at once; each owns its sandbox's place in it
    // (its webhook was answered already), so a lost race is retried, not given up.
    let mut attempt = 0u32;
    let updated = loop {
        match svc.store.update_list(id, event.clone(), now).await {
            Err(StoreError::Conflict(_)) if attempt < GROW_ATTEMPTS => {
                attempt += 1;
                let jitter = u64::from(uuid::Uuid::new_v4().as_bytes()[0] % 40);
                tokio::time::sleep(Duration::from_millis(10 + jitter)).await;
            }
            other => break other?,
        }
    };
    match updated {
        ListUpdated::Applied(_) => {
            refresh_soon(svc, id);
            Ok(true)
        }
        // Decided meanwhile: the items just opened stay as cases of their own, without a card
        // (they expire with their deadline); the next creation starts a new alert.
        ListUpdated::Refused { .. } => Ok(false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + secs, 0).unwrap()
    }

    fn sbx(n: usize) -> SandboxId {
        SandboxId::parse(format!("sbx{n}")).unwrap()
    }

    #[test]
    fn the_densest_window_holding_the_creation_is_the_burst() {
        // Three at 0..2 s, a gap, five at 1000..1004 s.
        let mut recent: Vec<_> = (0..3).map(|i| (sbx(i), at(i as i64))).collect();
        recent.extend((0..5).map(|i| (sbx(10 + i), at(1000 + i as i64))));
        let ten_min = Duration::from_secs(600);
        assert_eq!(densest_window(&recent, at(1002), ten_min).len(), 5);
        assert_eq!(densest_window(&recent, at(1), ten_min).len(), 3);
        // An hour-long window holds all eight.
        assert_eq!(
            densest_window(&recent, at(1), Duration::from_secs(3600)).len(),
            8
        );
    }
}
