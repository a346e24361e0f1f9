//! The repair pass: a case card whose last update failed for good (Slack down, a 500 after
//! every retry) would otherwise go on showing an old state, such as live buttons on a case
//! that is finished. The Slack client remembers those cards; this pass re-reads each case from
//! the store (the source of truth) and rewrites its card. It must not change a case.
use super::{Services, refresh_card};
use crate::ids::CaseId;
use crate::store::StoreError;

/// Rewrites every card the Slack client remembers as out of date. Returns how many were
/// repaired; the rest stay remembered for the next pass.
pub async fn repair_cards(svc: &Services) -> usize {
    let mut repaired = 0;
    for (tag, failures) in svc.slack.unsynced() {
        let Ok(id) = CaseId::parse(tag.as_str()) else {
            svc.slack.forget_unsynced(&tag);
            continue;
        };
        if failures >= REPAIR_MAX_FAILURES {
            // Slack keeps refusing this card (it was deleted, or the app left the channel): stop
            // asking. The case itself is recorded, and `/sandbox history` shows it.
            tracing::error!(case = %id, failures, "giving up on repairing a case card");
            svc.slack.forget_unsynced(&tag);
            continue;
        }
        if repair_one(svc, &id, &tag).await {
            tracing::info!(case = %id, "repaired an out-of-date case card");
            repaired += 1;
        }
    }
    repaired
}

/// Rewrites one card from the store. The case may change while its card is being written (a
/// worker finishing a step); reading it again afterwards makes sure the last write shows the
/// latest version, not the one read before.
async fn repair_one(svc: &Services, id: &CaseId, tag: &str) -> bool {
    let mut version = None;
    for _ in 0..REPAIR_MAX_ROUNDS {
        let case = match svc.store.get_case(id).await {
            Ok(case) => case,
            Err(StoreError::NotFound(_)) => {
                svc.slack.forget_unsynced(tag);
                return false;
            }
            // Redis is away: try again next pass.
            Err(e) => {
                tracing::warn!(case = %id, error = %e, "could not read a case to repair its card");
                return false;
            }
        };
        if version == Some(case.version) {
            return true;
        }
        if !refresh_card(&svc.slack, &svc.templates, &case).await {
            return false;
        }
        version = Some(case.version);
    }
    true
}

/// Updates of one card that may fail in a row before the repair pass stops trying (about ten
/// minutes of passes).
pub const REPAIR_MAX_FAILURES: u32 = 20;

/// How many times one repair re-reads a case that keeps changing under it.
const REPAIR_MAX_ROUNDS: usize = 3;
