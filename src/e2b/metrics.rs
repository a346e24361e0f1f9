//! The metrics actions of [`E2bClient`]: one sandbox's samples, the latest sample of many
//! sandboxes in bounded batches, and the team's series and maxima.
use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};
use futures::{StreamExt, TryStreamExt};
use serde::Deserialize;
use serde::de::DeserializeOwned;

use super::E2bError;
use super::client::{Call, E2bClient, Op, Query, encode_component, unix_secs};
use super::model::*;
use crate::ids::SandboxId;

/// Most sandbox ids E2B accepts in one `GET /sandboxes/metrics`.
pub const METRICS_BATCH_MAX_IDS: usize = 100;
/// Default number of metrics batches in flight at once.
pub const DEFAULT_METRICS_CONCURRENCY: usize = 8;

impl E2bClient {
    /// `GET /sandboxes/{id}/metrics` between `start` and `end` (E2B defaults to the sandbox's life).
    pub async fn sandbox_metrics(
        &self,
        id: &SandboxId,
        start: Option<DateTime<Utc>>,
        end: Option<DateTime<Utc>>,
    ) -> Result<Vec<SandboxMetric>, E2bError> {
        self.sandbox_metrics_as(id, start, end).await
    }

    /// As [`E2bClient::sandbox_metrics`], each sample read as `T`: a [`MetricPoint`] reads only
    /// what a judgment of activity uses.
    #[tracing::instrument(name = "sandbox_metrics", skip(self))]
    pub async fn sandbox_metrics_as<T: DeserializeOwned>(
        &self,
        id: &SandboxId,
        start: Option<DateTime<Utc>>,
        end: Option<DateTime<Utc>>,
    ) -> Result<Vec<T>, E2bError> {
        let mut call = Call::new(Op::Metrics, Self::sandbox_path(id, "/metrics"));
        push_range(&mut call.query, start, end)?;
        let reply = self.send(&call).await?;
        self.decode(Op::Metrics, &reply)
    }

    /// The latest metric of each sandbox in `ids`, in batches of at most 100 unique ids, with a
    /// bounded number of batches in flight. Sandboxes with no sample are absent from the map.
    #[tracing::instrument(skip(self, ids), fields(ids = ids.len()))]
    pub async fn metrics_many(
        &self,
        ids: &[SandboxId],
    ) -> Result<HashMap<SandboxId, SandboxMetric>, E2bError> {
        let batches = metric_batches(ids);
        futures::stream::iter(batches)
            .map(|batch| self.metrics_batch(batch))
            .buffer_unordered(self.metrics_concurrency)
            .try_fold(HashMap::new(), |mut all, part| async move {
                all.extend(part);
                Ok(all)
            })
            .await
    }

    async fn metrics_batch(
        &self,
        batch: Vec<SandboxId>,
    ) -> Result<HashMap<SandboxId, SandboxMetric>, E2bError> {
        #[derive(Deserialize)]
        struct Batch {
            sandboxes: HashMap<SandboxId, SandboxMetric>,
        }
        let mut call = Call::new(Op::MetricsMany, "/sandboxes/metrics".into());
        call.query.push_list("sandbox_ids", &batch);
        let reply = self.send(&call).await?;
        let body: Batch = self.decode(Op::MetricsMany, &reply)?;
        Ok(body.sandboxes)
    }

    /// `GET /teams/{teamID}/metrics`. Needs the team id (`E2B_PROJECT_ID`).
    #[tracing::instrument(skip(self))]
    pub async fn team_metrics(
        &self,
        start: Option<DateTime<Utc>>,
        end: Option<DateTime<Utc>>,
    ) -> Result<Vec<TeamMetric>, E2bError> {
        let team = self.team()?;
        let mut call = Call::new(
            Op::TeamMetrics,
            format!("/teams/{}/metrics", encode_component(team)),
        );
        push_range(&mut call.query, start, end)?;
        let reply = self.send(&call).await?;
        self.decode(Op::TeamMetrics, &reply)
    }

    /// `GET /teams/{teamID}/metrics/max` for one metric.
    #[tracing::instrument(skip(self))]
    pub async fn team_metrics_max(
        &self,
        metric: TeamMaxMetric,
        start: Option<DateTime<Utc>>,
        end: Option<DateTime<Utc>>,
    ) -> Result<MaxTeamMetric, E2bError> {
        let team = self.team()?;
        let mut call = Call::new(
            Op::TeamMetricsMax,
            format!("/teams/{}/metrics/max", encode_component(team)),
        );
        push_range(&mut call.query, start, end)?;
        call.query.push("metric", metric.as_str());
        let reply = self.send(&call).await?;
        self.decode(Op::TeamMetricsMax, &reply)
    }

    /// The team id team metrics need, or a sentence naming the missing setting.
    fn team(&self) -> Result<&str, E2bError> {
        self.team_id().ok_or(E2bError::NotConfigured(
            "E2B_PROJECT_ID (or E2B_TEAM_ID) is not set, so team metrics are unavailable",
        ))
    }
}

fn push_range(
    query: &mut Query,
    start: Option<DateTime<Utc>>,
    end: Option<DateTime<Utc>>,
) -> Result<(), E2bError> {
    if let (Some(s), Some(e)) = (start, end)
        && s > e
    {
        return Err(E2bError::BadRequest {
            message: "the start of a metrics range must not be after its end".into(),
        });
    }
    if let Some(s) = start {
        query.push("start", unix_secs("start", s)?);
    }
    if let Some(e) = end {
        query.push("end", unix_secs("end", e)?);
    }
    Ok(())
}

/// Unique ids, first-seen order kept, in batches of at most [`METRICS_BATCH_MAX_IDS`].
pub(crate) fn metric_batches(ids: &[SandboxId]) -> Vec<Vec<SandboxId>> {
    let mut seen = HashSet::new();
    let unique: Vec<SandboxId> = ids
        .iter()
        .filter(|id| seen.insert((*id).clone()))
        .cloned()
        .collect();
    unique
        .chunks(METRICS_BATCH_MAX_IDS)
        .map(<[SandboxId]>::to_vec)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::e2b::E2bSettings;

    fn id(n: usize) -> SandboxId {
        SandboxId::parse(format!("sbx{n}")).unwrap()
    }

    #[test]
    fn metric_ids_are_deduplicated_and_batched_by_one_hundred() {
        let mut ids: Vec<SandboxId> = (0..250).map(id).collect();
        ids.extend((0..50).map(id));
        let batches = metric_batches(&ids);
        assert_eq!(
            batches.iter().map(Vec::len).collect::<Vec<_>>(),
            vec![100, 100, 50]
        );
        assert_eq!(batches[0][0], id(0));
        assert_eq!(batches[2][49], id(249));
        assert!(metric_batches(&[]).is_empty());
    }

    #[tokio::test]
    async fn team_metrics_without_a_team_id_say_what_is_missing_and_send_nothing() {
        let settings = E2bSettings::for_url("http://127.0.0.1:1", "e2b_00");
        let client = E2bClient::new(&settings).unwrap();
        let err = client.team_metrics(None, None).await.unwrap_err();
        assert!(matches!(err, E2bError::NotConfigured(_)));
        assert_eq!(client.calls_made(), 0);
    }
}
