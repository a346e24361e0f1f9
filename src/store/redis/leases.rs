//! Who may do something once: deduplication marks (Slack retries), leases (one replica runs a
//! sweep or a case's work) and the sweep markers that let a replica take a scheduled slot over.
//! Each is one key; none of them knows what it guards.
use std::sync::LazyLock;
use std::time::Duration;

use chrono::{DateTime, Utc};
use redis::Script;

use super::{DELETE_IF_EQUAL, RedisStore, ms};
use crate::ids::CaseId;
use crate::store::{SWEEP_DIGEST_TTL, StoreError};

/// Sets the sweep marker unless it already holds a later time (RFC 3339 in UTC with a fixed
/// format sorts as text). KEYS: marker. ARGV: time.
static ADVANCE_MARKER: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local current = redis.call('GET', KEYS[1])
if current and current >= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1])
return 1
"#,
    )
});

/// Extends a lease only for its holder. KEYS: lease. ARGV: holder, ttl ms.
static RENEW_LEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"#,
    )
});

impl RedisStore {
    pub(crate) async fn last_completed_sweep(&self) -> Result<Option<DateTime<Utc>>, StoreError> {
        let text: Option<String> = self
            .query(redis::cmd("GET").arg(self.keys().last_sweep()))
            .await?;
        text.map(|t| {
            DateTime::parse_from_rfc3339(&t)
                .map(|d| d.with_timezone(&Utc))
                .map_err(|e| StoreError::Corrupt(format!("sweep marker {t:?}: {e}")))
        })
        .transpose()
    }

    pub(crate) async fn events_watermark(&self) -> Result<Option<DateTime<Utc>>, StoreError> {
        let text: Option<String> = self
            .query(redis::cmd("GET").arg(self.keys().events_watermark()))
            .await?;
        text.map(|t| {
            DateTime::parse_from_rfc3339(&t)
                .map(|d| d.with_timezone(&Utc))
                .map_err(|e| StoreError::Corrupt(format!("events watermark {t:?}: {e}")))
        })
        .transpose()
    }

    pub(crate) async fn advance_events_watermark(
        &self,
        at: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let _: i64 = self
            .invoke(
                ADVANCE_MARKER
                    .key(self.keys().events_watermark())
                    .arg(slot_text(at)),
            )
            .await?;
        Ok(())
    }

    pub(crate) async fn record_completed_sweep(
        &self,
        slot: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let _: i64 = self
            .invoke(
                ADVANCE_MARKER
                    .key(self.keys().last_sweep())
                    .arg(slot_text(slot)),
            )
            .await?;
        Ok(())
    }

    pub(crate) async fn record_sweep_digest(
        &self,
        slot: DateTime<Utc>,
        posted: &str,
    ) -> Result<(), StoreError> {
        self.query(
            redis::cmd("SET")
                .arg(self.keys().sweep_digest(&slot_text(slot)))
                .arg(posted)
                .arg("PX")
                .arg(ms(SWEEP_DIGEST_TTL)),
        )
        .await
    }

    pub(crate) async fn mark_card_stale(&self, case: &CaseId) -> Result<u32, StoreError> {
        self.query(
            redis::cmd("HINCRBY")
                .arg(self.keys().stale_cards())
                .arg(case.as_str())
                .arg(1),
        )
        .await
    }

    pub(crate) async fn stale_cards(&self) -> Result<Vec<(CaseId, u32)>, StoreError> {
        let all: Vec<(String, u32)> = self
            .query(redis::cmd("HGETALL").arg(self.keys().stale_cards()))
            .await?;
        Ok(all
            .into_iter()
            .filter_map(|(id, n)| CaseId::parse(&id).ok().map(|id| (id, n)))
            .collect())
    }

    pub(crate) async fn clear_stale_card(&self, case: &CaseId) -> Result<(), StoreError> {
        self.query(
            redis::cmd("HDEL")
                .arg(self.keys().stale_cards())
                .arg(case.as_str()),
        )
        .await
    }

    pub(crate) async fn sweep_digest(
        &self,
        slot: DateTime<Utc>,
    ) -> Result<Option<String>, StoreError> {
        self.query(redis::cmd("GET").arg(self.keys().sweep_digest(&slot_text(slot))))
            .await
    }

    pub(crate) async fn first_time(&self, key: &str, ttl: Duration) -> Result<bool, StoreError> {
        self.set_if_absent(self.keys().dedupe(key), 1, ttl).await
    }

    pub(crate) async fn acquire_lease(
        &self,
        name: &str,
        holder: &str,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        self.set_if_absent(self.keys().lease(name), holder, ttl)
            .await
    }

    pub(crate) async fn lease_held(&self, name: &str) -> Result<bool, StoreError> {
        let held: i64 = self
            .query(redis::cmd("EXISTS").arg(self.keys().lease(name)))
            .await?;
        Ok(held == 1)
    }

    pub(crate) async fn renew_lease(
        &self,
        name: &str,
        holder: &str,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let renewed: i64 = self
            .invoke(
                RENEW_LEASE
                    .key(self.keys().lease(name))
                    .arg(holder)
                    .arg(ms(ttl)),
            )
            .await?;
        Ok(renewed == 1)
    }

    pub(crate) async fn release_lease(&self, name: &str, holder: &str) -> Result<bool, StoreError> {
        let released: i64 = self
            .invoke(DELETE_IF_EQUAL.key(self.keys().lease(name)).arg(holder))
            .await?;
        Ok(released == 1)
    }
}

/// A sweep slot as text: RFC 3339 in UTC with a fixed format, so it sorts as text.
fn slot_text(slot: DateTime<Utc>) -> String {
    slot.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}
