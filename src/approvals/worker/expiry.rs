//! The expiry pass: closes every pending case past its deadline (each by exactly one replica)
//! and rewrites its card. It takes no action on the subject: an undecided case does nothing.
use chrono::{DateTime, Utc};

use crate::approvals::{Services, audit, refresh_card};
use crate::cases::Case;
use crate::store::{Actor, StoreError};

/// One expiry pass: expires every pending case past its deadline (each by exactly one
/// replica) and rewrites their cards. Returns the cases this pass expired.
pub async fn expire_once(svc: &Services, now: DateTime<Utc>) -> Result<Vec<Case>, StoreError> {
    let expired = svc.store.expire_due(now).await?;
    crate::metrics::cases_expired(expired.len());
    for case in &expired {
        audit(
            &svc.store,
            case,
            Actor::Steward {
                part: "expiry".into(),
            },
            "expire",
            &match case.evidence.run {
                // A run case's sandbox is not ended by Steward: its E2B timeout ends it.
                Some(_) => format!(
                    "no decision by {}: no action was taken; the sandbox is left to its E2B timeout",
                    case.decide_by
                ),
                None => format!("no decision by {}: no action was taken", case.decide_by),
            },
        )
        .await;
        refresh_card(&svc.store, &svc.slack, &svc.templates, case).await;
    }
    Ok(expired)
}
