//! Push-test records and the latest run per repository branch: plain strings with a TTL.
use super::{RedisStore, ms};
use crate::ids::RunId;
use crate::store::StoreError;
use crate::store::keys::RUN_RETENTION;
use crate::store::push_tests::LATEST_RUN_RETENTION;

impl RedisStore {
    pub(crate) async fn forget_first_time(&self, key: &str) -> Result<(), StoreError> {
        let _: i64 = self
            .query(redis::cmd("DEL").arg(self.keys().dedupe(key)))
            .await?;
        Ok(())
    }

    pub(crate) async fn put_push_test(&self, run: &RunId, json: &str) -> Result<(), StoreError> {
        let _: () = self
            .query(
                redis::cmd("SET")
                    .arg(self.keys().push_test(run))
                    .arg(json)
                    .arg("PX")
                    .arg(ms(RUN_RETENTION)),
            )
            .await?;
        Ok(())
    }

    pub(crate) async fn push_test_json(&self, run: &RunId) -> Result<Option<String>, StoreError> {
        self.query(redis::cmd("GET").arg(self.keys().push_test(run)))
            .await
    }

    pub(crate) async fn swap_latest_push_run(
        &self,
        repository: &str,
        branch: &str,
        run: &RunId,
    ) -> Result<Option<String>, StoreError> {
        self.query(
            redis::cmd("SET")
                .arg(self.keys().push_latest(repository, branch))
                .arg(run.to_string())
                .arg("PX")
                .arg(ms(LATEST_RUN_RETENTION))
                .arg("GET"),
        )
        .await
    }

    pub(crate) async fn latest_push_run(
        &self,
        repository: &str,
        branch: &str,
    ) -> Result<Option<String>, StoreError> {
        self.query(redis::cmd("GET").arg(self.keys().push_latest(repository, branch)))
            .await
    }

    pub(crate) async fn request_run_stop(
        &self,
        run: &RunId,
        reason: &str,
    ) -> Result<(), StoreError> {
        let _: () = self
            .query(
                redis::cmd("SET")
                    .arg(self.keys().run_stop(run))
                    .arg(reason)
                    .arg("PX")
                    .arg(ms(RUN_RETENTION)),
            )
            .await?;
        Ok(())
    }

    pub(crate) async fn run_stop_requested(
        &self,
        run: &RunId,
    ) -> Result<Option<String>, StoreError> {
        self.query(redis::cmd("GET").arg(self.keys().run_stop(run)))
            .await
    }

    pub(crate) async fn set_push_failing(
        &self,
        repository: &str,
        branch: &str,
        json: &str,
    ) -> Result<(), StoreError> {
        let _: () = self
            .query(
                redis::cmd("SET")
                    .arg(self.keys().push_failing(repository, branch))
                    .arg(json)
                    .arg("PX")
                    .arg(ms(LATEST_RUN_RETENTION)),
            )
            .await?;
        Ok(())
    }

    pub(crate) async fn push_failing(
        &self,
        repository: &str,
        branch: &str,
    ) -> Result<Option<String>, StoreError> {
        self.query(redis::cmd("GET").arg(self.keys().push_failing(repository, branch)))
            .await
    }

    pub(crate) async fn clear_push_failing(
        &self,
        repository: &str,
        branch: &str,
    ) -> Result<(), StoreError> {
        let _: i64 = self
            .query(redis::cmd("DEL").arg(self.keys().push_failing(repository, branch)))
            .await?;
        Ok(())
    }

    pub(crate) async fn push_admission(&self) -> Result<Option<String>, StoreError> {
        self.query(redis::cmd("GET").arg(self.keys().push_admission()))
            .await
    }

    pub(crate) async fn set_push_admission(&self, json: &str) -> Result<(), StoreError> {
        let _: () = self
            .query(
                redis::cmd("SET")
                    .arg(self.keys().push_admission())
                    .arg(json),
            )
            .await?;
        Ok(())
    }
}
