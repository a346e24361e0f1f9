//! The restore-window index: a sorted set of case ids by the end of their window.
use chrono::{DateTime, Utc};

use super::RedisStore;
use crate::ids::CaseId;
use crate::store::StoreError;

impl RedisStore {
    pub(crate) async fn watch_restore(
        &self,
        case: &CaseId,
        until: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let _: i64 = self
            .query(
                redis::cmd("ZADD")
                    .arg(self.keys().restore_windows())
                    .arg(until.timestamp_millis())
                    .arg(case.as_str()),
            )
            .await?;
        Ok(())
    }

    pub(crate) async fn restore_due(&self, now: DateTime<Utc>) -> Result<Vec<String>, StoreError> {
        self.query(
            redis::cmd("ZRANGEBYSCORE")
                .arg(self.keys().restore_windows())
                .arg("-inf")
                .arg(now.timestamp_millis()),
        )
        .await
    }

    pub(crate) async fn unwatch_restore(&self, case: &CaseId) -> Result<(), StoreError> {
        let _: i64 = self
            .query(
                redis::cmd("ZREM")
                    .arg(self.keys().restore_windows())
                    .arg(case.as_str()),
            )
            .await?;
        Ok(())
    }
}
