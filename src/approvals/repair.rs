//! The repair pass: a case card whose last update failed for good (Slack down, a 500 after
//! every retry) would otherwise go on showing an old state, such as live buttons on a case
//! that is finished. [`refresh_card`] records such a card in the store (so any replica repairs it,
//! even after the one that failed stopped); this pass re-reads each case from the store (the
//! source of truth) and rewrites its card. It must not change a case.
use super::{Services, refresh_card};
use crate::ids::CaseId;
use crate::store::StoreError;

/// Rewrites every card recorded as out of date. Returns how many were repaired; the rest stay
/// recorded for the next pass.
pub async fn repair_cards(svc: &Services) -> usize {
    let stale = match svc.store.stale_cards().await {
        Ok(stale) => stale,
        Err(e) => {
            tracing::warn!(error = %e, "could not read the out-of-date cards; next pass tries again");
            return 0;
        }
    };
    let mut repaired = 0;
    for (id, failures) in stale {
        if failures >= REPAIR_MAX_FAILURES {
            // Slack keeps refusing this card (it was deleted, or the app left the channel): stop
            // asking. The case itself is recorded, and `/sandbox history` shows it.
            tracing::error!(case = %id, failures, "giving up on repairing a case card");
            forget(svc, &id).await;
            continue;
        }
        if repair_one(svc, &id).await {
            tracing::info!(case = %id, "repaired an out-of-date case card");
            repaired += 1;
        }
    }
    repaired
}

async fn forget(svc: &Services, id: &CaseId) {
    if let Err(e) = svc.store.clear_stale_card(id).await {
        tracing::warn!(case = %id, error = %e, "could not clear an out-of-date card record");
    }
}

/// Rewrites one card from the store. The case may change while its card is being written (a
/// worker finishing a step); reading it again afterwards makes sure the last write shows the
/// latest version, not the one read before.
async fn repair_one(svc: &Services, id: &CaseId) -> bool {
    let mut version = None;
    for _ in 0..REPAIR_MAX_ROUNDS {
        let case = match svc.store.get_case(id).await {
            Ok(case) => case,
            Err(StoreError::NotFound(_)) => {
                forget(svc, id).await;
                return false;
            }
            // Redis is away: try again next pass.
            Err(e) => {
                tracing::warn!(case = %id, error = %e, "could not read a case to repair its card");
                return false;
            }
        };
        if version == Some(case.version) {
            // Up to date: only now is the record cleared (a normal update never touches Redis
            // for it, so card updates stay one Slack call).
            forget(svc, id).await;
            return true;
        }
        if !refresh_card(&svc.store, &svc.slack, &svc.templates, &case).await {
            return false;
        }
        version = Some(case.version);
    }
    forget(svc, id).await;
    true
}

/// Updates of one card that may fail in a row before the repair pass stops trying (about ten
/// minutes of passes).
pub const REPAIR_MAX_FAILURES: u32 = 20;

/// How many times one repair re-reads a case that keeps changing under it.
const REPAIR_MAX_ROUNDS: usize = 3;
