//! The snapshot and template actions of [`E2bClient`]. They share a file because E2B stores a
//! snapshot as a template: `delete_template` is also how a snapshot is deleted.
use super::E2bError;
use super::client::{Call, E2bClient, MAX_PAGE_LIMIT, Op, encode_component};
use super::model::*;
use super::paging::{Listing, PageGuard, PageStep};
use crate::ids::{SandboxId, TemplateId};

impl E2bClient {
    /// `POST /sandboxes/{id}/snapshots` with `{}` or `{"name": ..}`. E2B briefly pauses the sandbox.
    #[tracing::instrument(skip(self))]
    pub async fn create_snapshot(
        &self,
        id: &SandboxId,
        name: Option<&str>,
    ) -> Result<SnapshotInfo, E2bError> {
        let body = match name {
            Some(name) => serde_json::json!({ "name": name }),
            None => serde_json::json!({}),
        };
        let call = Call::new(Op::Snapshot, Self::sandbox_path(id, "/snapshots")).json(body);
        let reply = self.send(&call).await?;
        self.decode(Op::Snapshot, &reply)
    }

    /// `GET /snapshots`, every page, optionally only those made from `sandbox`.
    #[tracing::instrument(skip(self))]
    pub async fn list_snapshots(
        &self,
        sandbox: Option<&SandboxId>,
    ) -> Result<Listing<SnapshotInfo>, E2bError> {
        self.collect_pages(Op::Snapshots, self.max_pages, |token| {
            let mut call = Call::new(Op::Snapshots, "/snapshots".into());
            call.query
                .push_opt("sandboxID", sandbox.map(SandboxId::as_str));
            call.query.push("limit", MAX_PAGE_LIMIT.to_string());
            call.query.push_opt("nextToken", token);
            self.fetch_page(Op::Snapshots, call)
        })
        .await
    }

    /// `GET /v2/templates`, every page.
    #[tracing::instrument(skip(self))]
    pub async fn list_templates(&self) -> Result<Listing<Template>, E2bError> {
        self.collect_pages(Op::Templates, self.max_pages, |token| {
            let mut call = Call::new(Op::Templates, "/v2/templates".into());
            call.query.push("limit", MAX_PAGE_LIMIT.to_string());
            call.query.push_opt("nextToken", token);
            self.fetch_page(Op::Templates, call)
        })
        .await
    }
    /// `GET /templates/{id}`: the template and all its builds (their pages joined, under the cap).
    #[tracing::instrument(skip(self))]
    pub async fn get_template(&self, id: &TemplateId) -> Result<TemplateWithBuilds, E2bError> {
        let path = format!("/templates/{}", encode_component(id.as_str()));
        let mut guard = PageGuard::new(self.max_pages);
        let mut token: Option<String> = None;
        let mut template: Option<TemplateWithBuilds> = None;
        loop {
            let mut call = Call::new(Op::Template, path.clone());
            call.query.push("limit", MAX_PAGE_LIMIT.to_string());
            call.query.push_opt("nextToken", token.as_deref());
            let reply = self.send(&call).await?;
            let page: TemplateWithBuilds = self.decode(Op::Template, &reply)?;
            match &mut template {
                Some(t) => t.builds.extend(page.builds),
                None => template = Some(page),
            }
            match guard.after_page(reply.header("x-next-token")) {
                PageStep::Next(next) => token = Some(next),
                PageStep::Done => break,
                PageStep::Stop(reason) => {
                    tracing::warn!(template = %id, %reason, "stopped paging template builds");
                    break;
                }
            }
        }
        template.ok_or_else(|| E2bError::Decode("the template answer was empty".into()))
    }

    /// `DELETE /templates/{id}`; also how snapshots are deleted.
    #[tracing::instrument(skip(self))]
    pub async fn delete_template(&self, id: &TemplateId) -> Result<(), E2bError> {
        let path = format!("/templates/{}", encode_component(id.as_str()));
        self.send(&Call::new(Op::DeleteTemplate, path)).await?;
        Ok(())
    }
}
