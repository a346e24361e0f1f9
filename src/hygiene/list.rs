//! A live sweep's list decision: when the idle list is long (`[hygiene] list_from`), the sweep
//! opens one case per idle sandbox without a card, gathers them in the groups of
//! [`super::groups::groups`] (exactly what `steward sweep --dry-run --json` shows), stores the list
//! and posts it (`approvals::list::publish`). Nothing is decided here.
use chrono::{DateTime, Utc};
use futures::StreamExt;

use super::context::{SweepContext, SweepError};
use super::digest::dollars;
use super::post::{case_draft, option_for};
use super::report::{IdleSandbox, Posted, SweepReport};
use crate::approvals::{self, actor_of};
use crate::cases::list::{GroupDecision, ListCase, ListGroup, ListItem, thousands};
use crate::cases::{Case, ListRef};
use crate::ids::{ListId, SlackChannelId, SlackUserId};
use crate::store::{Opened, StoreError};

/// Item cases opened at once.
const OPEN_CONCURRENCY: usize = 32;

/// The digest's summary line.
fn summary(report: &SweepReport, decide_by: DateTime<Utc>) -> String {
    let c = &report.counts;
    format!(
        "*Fleet:* {} sandboxes ({} running · {} paused) · *Idle:* {} costing {} a day \
         ({} pause · {} snapshot, then kill · {} kill · {} ending soon, left alone) · \
         *Not raised:* {} kept by metadata, {} left by a decision, {} too young, {} already have a case. \
         Decide by {}.",
        thousands(report.fleet.total),
        thousands(report.fleet.running),
        thousands(report.fleet.paused),
        thousands(c.idle),
        dollars(report.idle_cost_per_day_usd),
        thousands(c.by_recommendation.pause),
        thousands(c.by_recommendation.snapshot_then_kill),
        thousands(c.by_recommendation.kill),
        thousands(c.by_recommendation.leave),
        thousands(c.exempt.keep_metadata),
        thousands(c.exempt.left),
        thousands(c.exempt.too_young),
        thousands(c.already_open),
        crate::slack::format::when(decide_by),
    )
}

/// Opens the item cases, stores the list and posts it.
pub(super) async fn post_list(
    ctx: &SweepContext,
    report: &SweepReport,
    channel: &SlackChannelId,
    now: DateTime<Utc>,
    requester: Option<SlackUserId>,
) -> Result<Posted, SweepError> {
    let decide_by = now
        + chrono::Duration::from_std(ctx.config.decide_within())
            .unwrap_or(chrono::Duration::days(2));
    let id = ListId::generate();
    let by_id: std::collections::HashMap<&str, &IdleSandbox> =
        report.idle.iter().map(|s| (s.id.as_str(), s)).collect();
    let mut posted = Posted {
        channel: channel.to_string(),
        list: Some(id.clone()),
        ..Posted::default()
    };
    let mut groups = Vec::new();
    for g in &report.groups {
        // The index this group gets in the list (groups that open nothing are left out).
        let index = groups.len();
        let members: Vec<&IdleSandbox> = g
            .sandboxes
            .iter()
            .filter_map(|s| by_id.get(s.as_str()).copied())
            .collect();
        let opening: Vec<_> = members
            .iter()
            .map(|s| open_item(ctx, s, &id, index, now))
            .collect();
        let opened: Vec<Result<Opened, String>> = futures::stream::iter(opening)
            .buffered(OPEN_CONCURRENCY)
            .collect()
            .await;
        let mut items = Vec::new();
        let mut kept: Vec<&IdleSandbox> = Vec::new();
        for (s, result) in members.iter().zip(opened) {
            match result {
                Ok(Opened::Created(case)) => {
                    posted.opened.push(case.id.clone());
                    items.push(ListItem {
                        sandbox: s.id.clone(),
                        case: case.id,
                    });
                    kept.push(s);
                }
                Ok(Opened::Existing(_)) => posted.already_open += 1,
                Err(e) => {
                    tracing::warn!(sandbox = %s.id, error = %e, "a list item's case could not be opened");
                    posted.failed += 1;
                }
            }
        }
        if items.is_empty() {
            continue;
        }
        if g.held_by_guard {
            posted.held_for_review += items.len();
        }
        let paused_disk = kept
            .iter()
            .filter(|s| s.state == super::policy::RunState::Paused)
            .map(|s| super::digest::held_disk(s))
            .sum();
        groups.push(ListGroup {
            owner: g.owner.clone(),
            owner_slack: kept[0].owner_slack.clone(),
            option: option_for(g.recommendation),
            cost_per_day_usd: kept.iter().map(|s| s.evidence.cost_per_day_usd).sum(),
            paused_disk_bytes: paused_disk,
            top: items
                .iter()
                .take(super::groups::TOP_PER_GROUP)
                .map(|i| i.sandbox.clone())
                .collect(),
            items,
            held_by_guard: g.held_by_guard,
            decision: GroupDecision::Open,
            excluded: Vec::new(),
            message: 0,
            choices: Vec::new(),
        });
    }
    let list = ListCase {
        id: id.clone(),
        version: 0,
        created_at: now,
        decide_by,
        requester,
        groups,
        messages: Vec::new(),
        summary: summary(report, decide_by),
        expired_at: None,
        burst: None,
    };
    if list.groups.is_empty() {
        return Ok(posted);
    }
    let list = ctx.store.create_list(&list).await?;
    let published =
        approvals::list::publish(&ctx.store, &ctx.slack, &ctx.templates, &list, channel)
            .await
            .map_err(SweepError::Digest)?;
    if let Some(digest) = published.messages.first() {
        posted.channel = digest.channel.to_string();
        posted.digest_ts = digest.ts.clone();
    }
    Ok(posted)
}

/// Opens one idle sandbox's case, without a card, as an item of group `group` of `list`.
async fn open_item(
    ctx: &SweepContext,
    s: &IdleSandbox,
    list: &ListId,
    group: usize,
    now: DateTime<Utc>,
) -> Result<Opened, String> {
    let draft = case_draft(ctx, s, now);
    let mut case: Case = draft.into_case(now).map_err(|e| e.to_string())?;
    case.list = Some(ListRef {
        list: list.clone(),
        group,
    });
    let opened = ctx
        .store
        .open_case(case)
        .await
        .map_err(|e: StoreError| e.to_string())?;
    if let Opened::Created(case) = &opened {
        approvals::audit(
            &ctx.store,
            case,
            actor_of(&case.opener),
            "open",
            &format!("{} (in list {list})", case.reason),
        )
        .await;
    }
    Ok(opened)
}
