//! The live half of a sweep: post the digest, then one case per idle sandbox in its thread,
//! grouped by owner, then update the digest with what was done.
//!
//! Which idle sandboxes become cases is decided here, before anything is posted: every idle
//! sandbox (a Leave recommendation too: its card says why leaving it is fine, and a person may
//! still choose otherwise), except kill recommendations while the blast-radius guard holds them,
//! and no more than `max_cases_per_sweep` (most expensive first).
//! Cases are opened only through `approvals::open_case`, which neither reposts nor extends the
//! deadline of a case that is already open. This module must not call E2B.
use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, Utc};

use super::config::WhenNothingNew;
use super::context::{SweepContext, SweepError};
use super::digest::{self, OwnerParams, case_reason, digest_params, group_worth, nothing_new};
use super::policy::{Recommendation, RunState};
use super::report::{IdleSandbox, Posted, SweepReport};
use crate::approvals::{self, ApprovalError, CardTarget};
use crate::cases::{self, CaseDraft, DecisionOption, Evidence, Metrics, Opener, Subject};
use crate::ids::SlackChannelId;
use crate::store::Opened;

/// The case option that carries out a recommendation.
pub fn option_for(r: Recommendation) -> DecisionOption {
    match r {
        Recommendation::Pause => DecisionOption::Pause,
        Recommendation::SnapshotThenKill => DecisionOption::SnapshotThenKill,
        Recommendation::Kill => DecisionOption::Kill,
        Recommendation::Leave => DecisionOption::Leave,
    }
}

/// The case a sweep opens for one idle sandbox.
pub fn case_draft(ctx: &SweepContext, s: &IdleSandbox, now: DateTime<Utc>) -> CaseDraft {
    let e = &s.evidence;
    let metrics = match (e.mem_used, e.mem_total, e.disk_used, e.disk_total) {
        (Some(mem_used), Some(mem_total), Some(disk_used), Some(disk_total)) => Some(Metrics {
            cpu_pct: e.cpu_latest_pct.unwrap_or(0.0),
            mem_used,
            mem_total,
            disk_used,
            disk_total,
        }),
        _ => None,
    };
    // A paused sandbox cannot be paused again, so that button is left off its card.
    let options = match s.state {
        RunState::Running => None,
        RunState::Paused => Some(vec![
            DecisionOption::SnapshotThenKill,
            DecisionOption::Kill,
            DecisionOption::Leave,
        ]),
    };
    CaseDraft {
        subject: Subject::Sandbox(s.id.clone()),
        evidence: Evidence {
            state: Some(
                match s.state {
                    RunState::Running => "running",
                    RunState::Paused => "paused",
                }
                .to_owned(),
            ),
            template: Some(s.template_id.clone()),
            template_alias: (s.template != s.template_id.to_string()).then(|| s.template.clone()),
            cpu_count: Some(s.cpu_count),
            memory_mb: Some(s.memory_mb),
            disk_mb: Some(s.disk_size_mb),
            started_at: Some(s.started_at),
            idle_since: e.idle_since,
            paused_since: e.paused_since,
            metrics,
            metadata: s.metadata.clone(),
            owner: s.owner.clone(),
            template_usage: None,
            run: None,
            push: None,
            lifecycle: Vec::new(),
        },
        recommendation: cases::Recommendation {
            option: option_for(s.recommendation),
            reason: s.reason.clone(),
        },
        options,
        opener: Opener::Sweep,
        reason: case_reason(s, now),
        decide_by: decide_by(ctx, s, now),
    }
}

/// A sweep case's deadline: `decide_within` from now, but never after the sandbox's own end (a
/// decision after it would be about nothing). A sandbox at its very end still gets a minute.
pub fn decide_by(ctx: &SweepContext, s: &IdleSandbox, now: DateTime<Utc>) -> DateTime<Utc> {
    let within = now
        + chrono::Duration::from_std(ctx.config.decide_within())
            .unwrap_or(chrono::Duration::days(2));
    match s.ends_at {
        Some(end) => within.min(end).max(now + chrono::Duration::minutes(1)),
        None => within,
    }
}

/// Which idle sandboxes a live pass raises, and what it holds back.
pub fn plan(report: &SweepReport, max_cases: usize) -> (Vec<&IdleSandbox>, Posted) {
    let mut held = Posted::default();
    let mut raise = Vec::new();
    // `report.idle` is sorted most expensive first, so the cap keeps the costliest.
    for s in &report.idle {
        if report.guard.tripped && s.recommendation.is_kill() {
            held.held_for_review += 1;
        } else {
            raise.push(s);
        }
    }
    if raise.len() > max_cases {
        held.deferred = raise.len() - max_cases;
        raise.truncate(max_cases);
    }
    (raise, held)
}

/// Posts the digest and the cases; returns what was posted.
pub(super) async fn post(
    ctx: &SweepContext,
    report: &SweepReport,
    channel: &SlackChannelId,
    now: DateTime<Utc>,
    slot: Option<DateTime<Utc>>,
) -> Result<Posted, SweepError> {
    let to_decide: usize = report.groups.iter().map(|g| g.count).sum();
    if to_decide > 0 && to_decide >= ctx.config.list_from {
        // A long idle list is one decision, a group at a time, instead of a card per sandbox.
        return super::list::post_list(ctx, report, channel, now, ctx.requester.clone()).await;
    }
    let (raise, mut posted) = plan(report, ctx.config.max_cases_per_sweep);
    if nothing_new(report) && ctx.config.when_nothing_new == WhenNothingNew::Nothing {
        // Configured to stay silent: no digest, so `digest_ts` stays empty.
        posted.channel = channel.to_string();
        return Ok(posted);
    }
    // With no case to open, the first digest already says how it ended.
    let settled = raise.is_empty();
    let earlier = match slot {
        Some(slot) => ctx.store.sweep_digest(slot).await?,
        None => None,
    };
    let (channel, ts) = match earlier.as_deref().and_then(parse_posted) {
        Some(found) => {
            // A leader that lost its lease already posted this slot's digest: reuse it, so
            // the channel sees one digest per scheduled sweep.
            tracing::info!(digest_ts = %found.1, "reusing the digest already posted for this slot");
            found
        }
        None => match adopt_posted(ctx, slot, earlier.as_deref()).await? {
            Some(found) => found,
            None => {
                let digest = ctx
                    .templates
                    .render(&digest_params(report, settled.then_some(&posted), false))
                    .map_err(|e| SweepError::Digest(e.to_string()))?;
                post_digest(ctx, channel, digest, slot, now).await?
            }
        },
    };
    posted.channel = channel.to_string();
    posted.digest_ts = ts.clone();
    let target = CardTarget {
        channel: channel.clone(),
        thread_ts: Some(ts.clone()),
    };
    // Owners with a name first (alphabetically), then the sandboxes nobody claims.
    let mut groups: BTreeMap<(bool, String), Vec<&IdleSandbox>> = BTreeMap::new();
    for s in raise {
        let key = match &s.owner {
            Some(owner) => (false, owner.clone()),
            None => (true, "No owner in metadata".to_owned()),
        };
        groups.entry(key).or_default().push(s);
    }
    let mut store_down = false;
    for ((nobody, owner), sandboxes) in groups {
        if store_down {
            posted.failed += sandboxes.len();
            continue;
        }
        let heading = OwnerParams {
            owner: super::digest::owner_heading((!nobody).then_some(owner.as_str())),
            slack_user: sandboxes[0].owner_slack.as_ref().map(|u| u.to_string()),
            count: sandboxes.len(),
            worth: group_worth(sandboxes.iter().copied()),
        };
        let heading = ctx.templates.render_or_plain(&heading);
        if let Err(e) = ctx
            .slack
            .post_message_in_thread(&channel, Some(&ts), heading)
            .await
        {
            tracing::warn!(error = %e, "could not post an owner heading in the sweep thread");
        }
        for (i, s) in sandboxes.iter().enumerate() {
            let draft = case_draft(ctx, s, now);
            match approvals::open_case(
                &ctx.store,
                &ctx.slack,
                &ctx.templates,
                draft,
                target.clone(),
                now,
            )
            .await
            {
                Ok(Opened::Created(case)) => posted.opened.push(case.id),
                Ok(Opened::Existing(_)) => posted.already_open += 1,
                Err(ApprovalError::StoreUnavailable(reason)) => {
                    // Every later case would fail the same way; count them and stop asking.
                    tracing::error!(%reason, "the store is down; the sweep stops opening cases");
                    posted.failed += sandboxes.len() - i;
                    store_down = true;
                    break;
                }
                Err(e) => {
                    tracing::warn!(sandbox = %s.id, error = %e, "a sweep case could not be opened");
                    posted.failed += 1;
                }
            }
        }
    }
    if settled {
        return Ok(posted);
    }
    // The digest's last line says what actually happened.
    let done = ctx
        .templates
        .render_or_plain(&digest::digest_params(report, Some(&posted), false));
    if let Err(e) = ctx.slack.update_message(&channel, &ts, done).await {
        tracing::warn!(error = %e, "could not update the sweep digest with its outcome");
    }
    Ok(posted)
}

/// `event_type` of the message metadata a scheduled digest is posted with; its payload's
/// `sweep_id` is the slot (Unix seconds), so a digest whose post was answered too late to be
/// recorded can be found in the channel and adopted instead of posted again.
pub const DIGEST_EVENT_TYPE: &str = "steward_digest";
/// How far before its "posting" mark a digest is looked for (replicas' and Slack's clocks
/// differ a little).
const POSTING_LOOKBACK_SECS: i64 = 60;

/// The slot's id in a digest's metadata.
fn sweep_id(slot: DateTime<Utc>) -> String {
    slot.timestamp().to_string()
}

/// Posts the digest and records where. For a scheduled slot it first records a "posting"
/// mark (`posting <channel> <unix secs>`) and posts with the slot in the message metadata, so
/// a replica that dies between Slack accepting the post and the store recording it leaves
/// enough for the next attempt to find the message ([`adopt_posted`]). Posting and recording
/// run on their own task: a sweep stopped mid-post (its lease lost) must not leave a posted
/// digest unrecorded, or the takeover would post again.
async fn post_digest(
    ctx: &SweepContext,
    channel: &SlackChannelId,
    digest: crate::slack::render::Message,
    slot: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> Result<(SlackChannelId, String), SweepError> {
    if let Some(slot) = slot {
        let mark = format!("{POSTING} {channel} {}", now.timestamp());
        ctx.store.record_sweep_digest(slot, &mark).await?;
    }
    let (slack, store, channel) = (ctx.slack.clone(), ctx.store.clone(), channel.clone());
    let posting = tokio::spawn(async move {
        let posted = match slot {
            Some(slot) => {
                let payload = HashMap::from([("sweep_id".to_owned(), sweep_id(slot))]);
                slack
                    .post_message_with_metadata(&channel, digest, DIGEST_EVENT_TYPE, payload)
                    .await
            }
            None => slack.post_message(&channel, digest).await,
        };
        let (channel, ts) = posted.map_err(|e| SweepError::Digest(e.to_string()))?;
        if let Some(slot) = slot {
            let record = format!("{channel} {ts}");
            if let Err(e) = store.record_sweep_digest(slot, &record).await {
                tracing::warn!(error = %e, "could not record where the sweep digest was posted");
            }
        }
        Ok::<_, SweepError>((channel, ts))
    });
    posting
        .await
        .map_err(|e| SweepError::Digest(e.to_string()))?
}

/// When an earlier attempt for this slot left a "posting" mark but no ts (it may have died
/// after Slack accepted the digest), the digest it may have posted, looked up by its metadata
/// and recorded as this slot's. `None`: nothing to adopt, post it. A look-up Slack refuses
/// (a missing `channels:history` scope) is logged and the digest posted: a second digest is
/// better than none.
async fn adopt_posted(
    ctx: &SweepContext,
    slot: Option<DateTime<Utc>>,
    earlier: Option<&str>,
) -> Result<Option<(SlackChannelId, String)>, SweepError> {
    let (Some(slot), Some((channel, since))) = (slot, earlier.and_then(parse_posting)) else {
        return Ok(None);
    };
    let oldest = (since - POSTING_LOOKBACK_SECS).max(0).to_string();
    let found = ctx
        .slack
        .find_by_metadata(
            &channel,
            &oldest,
            DIGEST_EVENT_TYPE,
            "sweep_id",
            &sweep_id(slot),
        )
        .await;
    let ts = match found {
        Ok(Some(ts)) => ts,
        Ok(None) => return Ok(None),
        Err(e) => {
            tracing::warn!(error = %e, "could not look for a digest an earlier attempt may have posted; posting it");
            return Ok(None);
        }
    };
    tracing::info!(digest_ts = %ts, "adopting the digest an earlier attempt posted for this slot");
    ctx.store
        .record_sweep_digest(slot, &format!("{channel} {ts}"))
        .await?;
    Ok(Some((channel, ts)))
}

/// The word a "posting" mark starts with.
const POSTING: &str = "posting";

/// The `"posting <channel> <unix secs>"` mark of a digest being posted.
fn parse_posting(text: &str) -> Option<(SlackChannelId, i64)> {
    let mut words = text.split(' ');
    if words.next()? != POSTING {
        return None;
    }
    let channel = SlackChannelId::parse(words.next()?).ok()?;
    Some((channel, words.next()?.parse().ok()?))
}

/// The `"<channel> <ts>"` recorded for a slot's digest.
fn parse_posted(text: &str) -> Option<(SlackChannelId, String)> {
    let (channel, ts) = text.split_once(' ')?;
    if channel == POSTING {
        return None;
    }
    Some((SlackChannelId::parse(channel).ok()?, ts.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_recommendation_maps_to_the_option_that_carries_it_out() {
        assert_eq!(option_for(Recommendation::Pause), DecisionOption::Pause);
        assert_eq!(
            option_for(Recommendation::SnapshotThenKill),
            DecisionOption::SnapshotThenKill
        );
        assert_eq!(option_for(Recommendation::Kill), DecisionOption::Kill);
        assert_eq!(option_for(Recommendation::Leave), DecisionOption::Leave);
    }
}
