//! `/sandbox sweep [--dry-run]`: runs a pass for a Slack user and says what came of it.
//!
//! A dry run answers with the digest itself (ephemeral, with the most expensive idle sandboxes
//! listed); a live run posts the digest and cases in the hygiene channel, under the sweep lease,
//! and answers with one line. This module turns outcomes into messages; the HTTP handler
//! acknowledges and delivers them.
use chrono::{DateTime, Utc};

use super::context::{SweepContext, SweepMode};
use super::digest::digest_params;
use super::schedule::{Scheduler, sweep_now};
use super::sweep::sweep_once;
use crate::slack::render::{FailureParams, MentionDoneParams, Message, Mrkdwn};

/// The answer to `/sandbox sweep`, for the person who asked.
pub async fn sweep_message(ctx: SweepContext, dry_run: bool, now: DateTime<Utc>) -> Message {
    let templates = ctx.templates.clone();
    let failed = |e: &dyn std::fmt::Display| {
        templates.render_or_plain(&FailureParams {
            sentence: format!("The sweep did not run: {e}."),
        })
    };
    if dry_run {
        return match sweep_once(&ctx, now, SweepMode::DryRun).await {
            Ok(report) => templates.render_or_plain(&digest_params(&report, None, true)),
            Err(e) => failed(&e),
        };
    }
    match sweep_now(&Scheduler::new(ctx), now).await {
        Ok(report) => {
            let posted = report.posted.clone().unwrap_or_default();
            let idle = report.counts.idle + report.counts.already_open;
            let whereabouts = if posted.digest_ts.is_empty() {
                Mrkdwn::text(
                    "nothing new, so no digest was posted (`when_nothing_new` in [hygiene])",
                )
            } else {
                // Steward's own channel link: it must reach Slack unescaped to render.
                Mrkdwn::markup("the digest is in ").and(Mrkdwn::channel(posted.channel.as_str()))
            };
            templates.render_or_plain(&MentionDoneParams {
                headline: Mrkdwn::text(&format!(
                    "Sweep done: {idle} idle of {} sandboxes; ",
                    report.fleet.total
                ))
                .and(whereabouts)
                .and(Mrkdwn::markup(".")),
                details: Some(format!(
                    "{} opened, {} already open, {} held for review, {} left for the next sweep.",
                    cases(posted.opened.len()),
                    posted.already_open + report.counts.already_open,
                    posted.held_for_review,
                    posted.deferred
                )),
            })
        }
        Err(e) => failed(&e),
    }
}

/// `1 case`, `3 cases`.
fn cases(n: usize) -> String {
    format!("{n} case{}", if n == 1 { "" } else { "s" })
}
