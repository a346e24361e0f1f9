//! The sandbox actions of [`E2bClient`]: create, list, get, kill, pause, resume, connect, set the
//! timeout, refresh and read logs.
//!
//! Each checks what E2B would refuse before sending anything, so a bad request costs no call.
use std::time::Duration;

use reqwest::StatusCode;
use serde::Deserialize;

use super::E2bError;
use super::client::{
    Call, E2bClient, MAX_PAGE_LIMIT, Op, encode_component, metadata_filter, secs_i32,
};
use super::model::*;
use super::paging::{Listing, Page};
use crate::duration::MAX_REFRESH_SECS;
use crate::ids::SandboxId;

impl E2bClient {
    /// `POST /v2/sandboxes` (`NewSandboxV2`: always secured, so without `secure`), or
    /// `POST /sandboxes` on an E2B without v2 (see [`E2bClient::send_v2_or_v1`]). Always sends
    /// `timeout` (300 s unless the request says otherwise).
    #[tracing::instrument(skip(self, req), fields(template = %req.template_id))]
    pub async fn create_sandbox(&self, req: &NewSandbox) -> Result<Sandbox, E2bError> {
        let mut v1 = serde_json::to_value(req)
            .map_err(|e| E2bError::Decode(format!("could not encode the request: {e}")))?;
        v1["timeout"] = secs_i32(req.effective_timeout()).into();
        let mut v2 = v1.clone();
        if let Some(fields) = v2.as_object_mut() {
            fields.remove("secure");
        }
        let reply = self
            .send_v2_or_v1(
                &Call::new(Op::Create, "/v2/sandboxes".into()).json(v2),
                &Call::new(Op::Create, "/sandboxes".into()).json(v1),
            )
            .await?;
        self.decode(Op::Create, &reply)
    }

    /// `GET /v2/sandboxes`, every page, under the page cap.
    #[tracing::instrument(skip(self, q), fields(state = q.state.as_query()))]
    pub async fn list_sandboxes(&self, q: &ListQuery) -> Result<Listing<ListedSandbox>, E2bError> {
        let cap = q.max_pages.unwrap_or(self.max_pages);
        self.collect_pages(Op::List, cap, |token| async move {
            self.list_sandboxes_page(q, token.as_deref()).await
        })
        .await
    }

    /// One page of `GET /v2/sandboxes`, starting at `next_token`.
    #[tracing::instrument(skip(self, q), fields(state = q.state.as_query()))]
    pub async fn list_sandboxes_page(
        &self,
        q: &ListQuery,
        next_token: Option<&str>,
    ) -> Result<Page<ListedSandbox>, E2bError> {
        let mut call = Call::new(Op::List, "/v2/sandboxes".into());
        if !q.metadata.is_empty() {
            call.query.push("metadata", metadata_filter(&q.metadata));
        }
        let states: Vec<&str> = q.state.as_query().split(',').collect();
        call.query.push_list("state", &states);
        call.query.push_opt("order", q.order.map(Order::as_str));
        call.query.push_opt(
            "startedAfter",
            q.started_after
                .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)),
        );
        call.query.push_opt("template", q.template.as_deref());
        call.query.push_opt("nextToken", next_token);
        call.query.push(
            "limit",
            check_limit(q.limit.unwrap_or(MAX_PAGE_LIMIT))?.to_string(),
        );
        let reply = self.send(&call).await?;
        let items = self.decode(Op::List, &reply)?;
        Ok(Page {
            items,
            next_token: reply.header("x-next-token").map(str::to_owned),
            total_running: reply
                .header("x-total-running")
                .and_then(|v| v.trim().parse().ok()),
        })
    }

    /// `GET /sandboxes/{id}`: a running or paused sandbox.
    #[tracing::instrument(skip(self))]
    pub async fn get_sandbox(&self, id: &SandboxId) -> Result<SandboxDetail, E2bError> {
        let reply = self
            .send(&Call::new(Op::Get, Self::sandbox_path(id, "")))
            .await?;
        self.decode(Op::Get, &reply)
    }

    /// `DELETE /sandboxes/{id}`: kills a running sandbox or deletes a paused one.
    #[tracing::instrument(skip(self))]
    pub async fn kill_sandbox(&self, id: &SandboxId) -> Result<(), E2bError> {
        self.send(&Call::new(Op::Kill, Self::sandbox_path(id, "")))
            .await?;
        Ok(())
    }

    /// `POST /sandboxes/{id}/pause`. A 409 (already paused or changing state) is returned as
    /// `Conflict`; the caller decides whether that is fine. Never replayed after delivery.
    #[tracing::instrument(skip(self))]
    pub async fn pause_sandbox(&self, id: &SandboxId) -> Result<(), E2bError> {
        let call =
            Call::new(Op::Pause, Self::sandbox_path(id, "/pause")).json(serde_json::json!({}));
        self.send(&call).await?;
        Ok(())
    }

    /// `POST /sandboxes/{id}/resume` (deprecated by E2B in favour of connect).
    #[tracing::instrument(skip(self))]
    pub async fn resume_sandbox(
        &self,
        id: &SandboxId,
        timeout: Duration,
    ) -> Result<Sandbox, E2bError> {
        let call = Call::new(Op::Resume, Self::sandbox_path(id, "/resume"))
            .json(serde_json::json!({ "timeout": secs_i32(timeout) }));
        let reply = self.send(&call).await?;
        self.decode(Op::Resume, &reply)
    }

    /// `POST /v2/sandboxes/{id}/connect` (or v1's `POST /sandboxes/{id}/connect` on an E2B
    /// without v2): resumes a paused sandbox (201) or extends a running one's time to live (200;
    /// it never shortens it).
    #[tracing::instrument(skip(self))]
    pub async fn connect_sandbox(
        &self,
        id: &SandboxId,
        timeout: Duration,
    ) -> Result<Connected, E2bError> {
        let body = serde_json::json!({ "timeout": secs_i32(timeout) });
        let v2 = Call::new(
            Op::Connect,
            format!("/v2{}", Self::sandbox_path(id, "/connect")),
        )
        .json(body.clone());
        let v1 = Call::new(Op::Connect, Self::sandbox_path(id, "/connect")).json(body);
        let reply = self.send_v2_or_v1(&v2, &v1).await?;
        Ok(Connected {
            sandbox: self.decode(Op::Connect, &reply)?,
            resumed: reply.status == StatusCode::CREATED,
        })
    }

    /// `POST /sandboxes/{id}/timeout`: sets the time to live from now (can shorten it).
    #[tracing::instrument(skip(self))]
    pub async fn set_timeout(&self, id: &SandboxId, timeout: Duration) -> Result<(), E2bError> {
        let call = Call::new(Op::Timeout, Self::sandbox_path(id, "/timeout"))
            .json(serde_json::json!({ "timeout": secs_i32(timeout) }));
        self.send(&call).await?;
        Ok(())
    }

    /// `POST /sandboxes/{id}/refreshes`: extends the time to live by `duration` (at most 1 h).
    #[tracing::instrument(skip(self))]
    pub async fn refresh_sandbox(
        &self,
        id: &SandboxId,
        duration: Option<Duration>,
    ) -> Result<(), E2bError> {
        let body = match duration {
            Some(d) if d.as_secs() > MAX_REFRESH_SECS => {
                return Err(E2bError::BadRequest {
                    message: format!(
                        "a refresh can extend a sandbox by at most {MAX_REFRESH_SECS} s, not {} s",
                        d.as_secs()
                    ),
                });
            }
            Some(d) => serde_json::json!({ "duration": d.as_secs() }),
            None => serde_json::json!({}),
        };
        let call = Call::new(Op::Refresh, Self::sandbox_path(id, "/refreshes")).json(body);
        self.send(&call).await?;
        Ok(())
    }

    /// `GET /v2/sandboxes/{id}/logs`.
    #[tracing::instrument(skip(self, q))]
    pub async fn sandbox_logs(
        &self,
        id: &SandboxId,
        q: &LogsQuery,
    ) -> Result<Vec<LogEntry>, E2bError> {
        let mut call = Call::new(
            Op::Logs,
            format!("/v2/sandboxes/{}/logs", encode_component(id.as_str())),
        );
        if let Some(cursor) = q.cursor {
            let ms = cursor.timestamp_millis();
            if ms < 0 {
                return Err(E2bError::BadRequest {
                    message: "the log cursor must not be before 1970".into(),
                });
            }
            call.query.push("cursor", ms.to_string());
        }
        if let Some(limit) = q.limit {
            if limit > MAX_LOG_LIMIT {
                return Err(E2bError::BadRequest {
                    message: format!("at most {MAX_LOG_LIMIT} log lines can be asked for at once"),
                });
            }
            call.query.push("limit", limit.to_string());
        }
        call.query
            .push_opt("direction", q.direction.map(LogsDirection::as_str));
        call.query.push_opt("level", q.level.map(LogLevel::as_str));
        if let Some(search) = &q.search {
            if search.chars().count() > MAX_LOG_SEARCH_CHARS {
                return Err(E2bError::BadRequest {
                    message: format!(
                        "a log search can be at most {MAX_LOG_SEARCH_CHARS} characters long"
                    ),
                });
            }
            call.query.push("search", search);
        }
        #[derive(Deserialize)]
        struct LogsBody {
            #[serde(default)]
            logs: Option<Vec<LogEntry>>,
        }
        let reply = self.send(&call).await?;
        let body: LogsBody = self.decode(Op::Logs, &reply)?;
        Ok(body.logs.unwrap_or_default())
    }
}

fn check_limit(limit: u32) -> Result<u32, E2bError> {
    if (1..=MAX_PAGE_LIMIT).contains(&limit) {
        Ok(limit)
    } else {
        Err(E2bError::BadRequest {
            message: format!("a page holds 1 to {MAX_PAGE_LIMIT} items, not {limit}"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_limits_outside_one_to_one_hundred_are_refused() {
        assert!(check_limit(0).is_err());
        assert!(check_limit(101).is_err());
        assert_eq!(check_limit(100).unwrap(), 100);
    }
}
