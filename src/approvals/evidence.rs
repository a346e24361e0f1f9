//! What Steward shows people about a subject: reads E2B and fills a case's [`Evidence`].
//!
//! Used when a case opens (the card) and again by the worker right before a destructive call,
//! to notice that the subject changed or vanished. This file only reads E2B; it must never
//! call an endpoint that changes anything.
use crate::cases::{Evidence, Metrics, TemplateUsage};
use crate::e2b::{E2bClient, E2bError, ListQuery, SandboxDetail, SandboxMetric, SandboxState};
use crate::ids::{SandboxId, TemplateId};

/// Sandboxes whose snapshots are counted for a template card; beyond this the count is partial
/// (each sandbox is one more E2B call).
pub const SNAPSHOT_COUNT_MAX_SANDBOXES: usize = 20;

/// The evidence of one sandbox as E2B reports it, with `metric` as the latest sample.
pub fn from_detail(detail: &SandboxDetail, metric: Option<&SandboxMetric>) -> Evidence {
    let metadata = detail.metadata.clone();
    Evidence {
        state: Some(detail.state.as_str().to_owned()),
        template: Some(detail.template_id.clone()),
        template_alias: detail.alias.clone(),
        cpu_count: Some(detail.cpu_count),
        memory_mb: Some(u64::from(detail.memory_mb)),
        disk_mb: Some(u64::from(detail.disk_size_mb)),
        started_at: Some(detail.started_at),
        idle_since: None,
        // For a paused sandbox E2B's `endAt` is the time of the pause.
        paused_since: (detail.state == SandboxState::Paused).then_some(detail.end_at),
        metrics: metric.map(|m| Metrics {
            cpu_pct: m.cpu_used_pct,
            mem_used: u64::try_from(m.mem_used).unwrap_or(0),
            mem_total: u64::try_from(m.mem_total).unwrap_or(0),
            disk_used: u64::try_from(m.disk_used).unwrap_or(0),
            disk_total: u64::try_from(m.disk_total).unwrap_or(0),
        }),
        owner: Evidence::owner_from_metadata(&metadata),
        metadata,
        template_usage: None,
        run: None,
        push: None,
        lifecycle: Vec::new(),
    }
}

/// Reads a sandbox and its latest metrics sample. A failed metrics read leaves the sample out
/// rather than failing: the card is still worth showing.
pub async fn sandbox(e2b: &E2bClient, id: &SandboxId) -> Result<Evidence, E2bError> {
    let detail = e2b.get_sandbox(id).await?;
    let metric = match e2b.metrics_many(std::slice::from_ref(id)).await {
        Ok(mut all) => all.remove(id),
        Err(e) => {
            tracing::warn!(sandbox = %id, error = %e, "no metrics for the case card");
            None
        }
    };
    Ok(from_detail(&detail, metric.as_ref()))
}

/// Reads who uses a template: its running and paused sandboxes, and the snapshots taken of them.
pub async fn template(e2b: &E2bClient, id: &TemplateId) -> Result<Evidence, E2bError> {
    e2b.get_template(id).await?;
    let usage = template_usage(e2b, id).await?;
    Ok(Evidence {
        template: Some(id.clone()),
        template_usage: Some(usage),
        ..Evidence::default()
    })
}

/// Who uses template `id` now. Every listing must be complete: one that stopped early is an
/// [`E2bError::Incomplete`], never a smaller count.
pub async fn template_usage(e2b: &E2bClient, id: &TemplateId) -> Result<TemplateUsage, E2bError> {
    let sandboxes = template_sandboxes(e2b, id).await?;
    let mut snapshots = 0u32;
    for sandbox in sandboxes.iter().take(SNAPSHOT_COUNT_MAX_SANDBOXES) {
        let listed = e2b
            .list_snapshots(Some(sandbox))
            .await?
            .complete()
            .map_err(E2bError::Incomplete)?;
        snapshots += u32::try_from(listed.len()).unwrap_or(u32::MAX);
    }
    Ok(TemplateUsage {
        sandboxes,
        snapshots,
    })
}

/// The running and paused sandboxes made from template `id`, from a complete listing.
pub async fn template_sandboxes(
    e2b: &E2bClient,
    id: &TemplateId,
) -> Result<Vec<SandboxId>, E2bError> {
    let query = ListQuery {
        template: Some(id.to_string()),
        ..ListQuery::default()
    };
    let listing = e2b
        .list_sandboxes(&query)
        .await?
        .complete()
        .map_err(E2bError::Incomplete)?;
    Ok(listing.into_iter().map(|s| s.sandbox_id).collect())
}
