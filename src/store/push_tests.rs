//! Push tests (GitHub pushes run in a sandbox): the record kept per run, which run is the latest
//! for a repository's branch, and the delivery marks that make a redelivered webhook a no-op.
//! The record type lives here so the store can hand it back typed; `github` re-exports it as
//! `github::PushTest`.
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{Store, StoreError};
use crate::ids::{RunId, SlackChannelId, SlackUserId};

/// How long a delivery id is remembered (GitHub redelivers for up to a few days; we keep 8).
pub const DELIVERY_RETENTION: Duration = Duration::from_secs(8 * 24 * 60 * 60);
/// How long the "latest run of this branch" pointer is kept after its last push.
pub const LATEST_RUN_RETENTION: Duration = Duration::from_secs(30 * 24 * 60 * 60);

/// What a push-test run was started for. Holds no secret: the clone credential never reaches it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PushTest {
    pub run_id: RunId,
    /// `owner/name`.
    pub repository: String,
    pub branch: String,
    pub before: String,
    /// The commit the run tests.
    pub after: String,
    pub compare_url: Option<String>,
    /// The head commit's URL on GitHub.
    pub commit_url: Option<String>,
    pub message: Option<String>,
    /// The pusher's GitHub login.
    pub pusher: Option<String>,
    pub author_name: Option<String>,
    pub author_email: Option<String>,
    pub author_login: Option<String>,
    /// Slack users the pusher and the author map to (`authors` in `[[push_tests]]`), no repeats.
    pub slack_users: Vec<SlackUserId>,
    /// The Slack user the head commit's author maps to (by e-mail, then login).
    #[serde(default)]
    pub author_slack: Option<SlackUserId>,
    /// The Slack user the pusher maps to (by login, then e-mail).
    #[serde(default)]
    pub pusher_slack: Option<SlackUserId>,
    /// Where alerts about this run go (`channel` in `[[push_tests]]`).
    pub channel: Option<String>,
    /// The command the entry runs (without the clone steps Steward puts before it).
    pub command: String,
    /// GitHub's `X-GitHub-Delivery` of the push.
    pub delivery: String,
    /// When the tested commit was made (the payload's `head_commit.timestamp`), to tell an older
    /// push from a newer one when their `before`/`after` do not chain.
    #[serde(default)]
    pub committed_at: Option<chrono::DateTime<chrono::Utc>>,
}

/// Where the alert of a branch's latest failed push test is, so a later passing push can say
/// "fixed in <sha>" in its thread.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailingPush {
    pub run_id: RunId,
    /// The commit whose tests failed.
    pub commit: String,
    pub channel: SlackChannelId,
    pub ts: String,
}

fn delivery_key(delivery: &str) -> String {
    format!("github-delivery:{delivery}")
}

fn commit_key(repository: &str, git_ref: &str, after: &str) -> String {
    format!(
        "github-commit:{}:{git_ref}:{}",
        repository.to_lowercase(),
        after.to_lowercase()
    )
}

impl Store {
    /// True the first time this webhook delivery id is seen within [`DELIVERY_RETENTION`].
    pub async fn first_delivery(&self, delivery: &str) -> Result<bool, StoreError> {
        self.first_time(&delivery_key(delivery), DELIVERY_RETENTION)
            .await
    }

    /// True the first time a push of commit `after` to `git_ref` of `repository` is seen within
    /// [`DELIVERY_RETENTION`], whatever its delivery id: the same signed body sent again under a
    /// new `X-GitHub-Delivery` is a replay.
    pub async fn first_push_of_commit(
        &self,
        repository: &str,
        git_ref: &str,
        after: &str,
    ) -> Result<bool, StoreError> {
        self.first_time(&commit_key(repository, git_ref, after), DELIVERY_RETENTION)
            .await
    }

    /// Forgets a commit's push mark (acting on the push failed, so a redelivery must be able to).
    pub async fn forget_push_of_commit(
        &self,
        repository: &str,
        git_ref: &str,
        after: &str,
    ) -> Result<(), StoreError> {
        self.forget_first_time(&commit_key(repository, git_ref, after))
            .await
    }

    /// Forgets a delivery mark, so GitHub's redelivery is acted on (when acting failed).
    pub async fn forget_delivery(&self, delivery: &str) -> Result<(), StoreError> {
        self.forget_first_time(&delivery_key(delivery)).await
    }

    /// Stores the push test of a run (kept as long as runs are).
    pub async fn record_push_test(&self, test: &PushTest) -> Result<(), StoreError> {
        let json = serde_json::to_string(test).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        match self {
            Store::Redis(s) => s.put_push_test(&test.run_id, &json).await,
            Store::Memory(s) => s.put_push_test(&test.run_id, &json).await,
        }
    }

    /// The push test a run was started for, if it was one.
    pub async fn push_test_for_run(&self, run: &RunId) -> Result<Option<PushTest>, StoreError> {
        let json = match self {
            Store::Redis(s) => s.push_test_json(run).await?,
            Store::Memory(s) => s.push_test_json(run).await?,
        };
        json.map(|text| {
            serde_json::from_str(&text)
                .map_err(|e| StoreError::Corrupt(format!("push test of run {run}: {e}")))
        })
        .transpose()
    }

    /// Makes `run` the latest push-test run of `repository`'s `branch`; returns the run it
    /// replaced, if any.
    pub async fn set_latest_push_run(
        &self,
        repository: &str,
        branch: &str,
        run: &RunId,
    ) -> Result<Option<RunId>, StoreError> {
        let previous = match self {
            Store::Redis(s) => s.swap_latest_push_run(repository, branch, run).await?,
            Store::Memory(s) => s.swap_latest_push_run(repository, branch, run).await?,
        };
        previous
            .map(|text| RunId::parse(text).map_err(|e| StoreError::Corrupt(e.to_string())))
            .transpose()
    }

    /// Asks whoever executes `run` to stop its command and fail it with `reason` (a newer push
    /// superseded it). The run engine looks for this while the command runs.
    pub async fn request_run_stop(&self, run: &RunId, reason: &str) -> Result<(), StoreError> {
        match self {
            Store::Redis(s) => s.request_run_stop(run, reason).await,
            Store::Memory(s) => s.request_run_stop(run, reason).await,
        }
    }

    /// Why `run` was asked to stop, if it was.
    pub async fn run_stop_requested(&self, run: &RunId) -> Result<Option<String>, StoreError> {
        match self {
            Store::Redis(s) => s.run_stop_requested(run).await,
            Store::Memory(s) => s.run_stop_requested(run).await,
        }
    }

    /// The latest push-test run of `repository`'s `branch`.
    pub async fn latest_push_run(
        &self,
        repository: &str,
        branch: &str,
    ) -> Result<Option<RunId>, StoreError> {
        let latest = match self {
            Store::Redis(s) => s.latest_push_run(repository, branch).await?,
            Store::Memory(s) => s.latest_push_run(repository, branch).await?,
        };
        latest
            .map(|text| RunId::parse(text).map_err(|e| StoreError::Corrupt(e.to_string())))
            .transpose()
    }

    /// Records `failing` as the alert of `repository`'s `branch` latest failed push test.
    pub async fn set_push_failing(
        &self,
        repository: &str,
        branch: &str,
        failing: &FailingPush,
    ) -> Result<(), StoreError> {
        let json =
            serde_json::to_string(failing).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        match self {
            Store::Redis(s) => s.set_push_failing(repository, branch, &json).await,
            Store::Memory(s) => s.set_push_failing(repository, branch, &json).await,
        }
    }

    /// The alert of the branch's latest failed push test, until [`Store::clear_push_failing`].
    pub async fn push_failing(
        &self,
        repository: &str,
        branch: &str,
    ) -> Result<Option<FailingPush>, StoreError> {
        let json = match self {
            Store::Redis(s) => s.push_failing(repository, branch).await?,
            Store::Memory(s) => s.push_failing(repository, branch).await?,
        };
        json.map(|text| {
            serde_json::from_str(&text).map_err(|e| {
                StoreError::Corrupt(format!("failing push of {repository} {branch}: {e}"))
            })
        })
        .transpose()
    }

    /// Forgets the branch's failed push test (a later push passed).
    pub async fn clear_push_failing(
        &self,
        repository: &str,
        branch: &str,
    ) -> Result<(), StoreError> {
        match self {
            Store::Redis(s) => s.clear_push_failing(repository, branch).await,
            Store::Memory(s) => s.clear_push_failing(repository, branch).await,
        }
    }

    /// The push-test admission state (JSON; `github::queue` reads and writes it under its lease).
    pub async fn push_admission(&self) -> Result<Option<String>, StoreError> {
        match self {
            Store::Redis(s) => s.push_admission().await,
            Store::Memory(s) => s.push_admission().await,
        }
    }

    /// Replaces the push-test admission state.
    pub async fn set_push_admission(&self, json: &str) -> Result<(), StoreError> {
        match self {
            Store::Redis(s) => s.set_push_admission(json).await,
            Store::Memory(s) => s.set_push_admission(json).await,
        }
    }
}
