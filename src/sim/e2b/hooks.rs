//! `SimHooks`: an HTTP client for the simulator's `/_sim/` test hooks (call counters, faults
//! before or after handling, paging sabotage, seeding and changing sandboxes). Tests,
//! benchmarks and demos drive the simulator through it over the same socket Steward uses,
//! instead of each writing its own requests.
//!
//! It talks only to the simulator; production code must not use it.
use std::collections::HashMap;

use anyhow::{Context, ensure};
use serde_json::{Value, json};

/// The simulator's test hooks at one base URL.
#[derive(Debug, Clone)]
pub struct SimHooks {
    http: reqwest::Client,
    base_url: String,
}

impl SimHooks {
    pub fn new(base_url: &str) -> Self {
        Self {
            http: reqwest::Client::new(),
            base_url: base_url.trim_end_matches('/').to_owned(),
        }
    }

    /// API calls counted per operation (`list`, `kill`, ...); operations never called are absent.
    pub async fn calls(&self) -> anyhow::Result<HashMap<String, u64>> {
        let v = self.get("/_sim/calls").await?;
        Ok(serde_json::from_value(v["calls"].clone()).unwrap_or_default())
    }

    /// API calls counted for one operation.
    pub async fn calls_of(&self, op: &str) -> anyhow::Result<u64> {
        Ok(self.calls().await?.get(op).copied().unwrap_or(0))
    }

    pub async fn reset_calls(&self) -> anyhow::Result<()> {
        self.post("/_sim/calls/reset", Value::Null).await.map(drop)
    }

    /// Fails the next `count` calls of `op` (any operation when `None`) with `status`.
    pub async fn fault(
        &self,
        op: Option<&str>,
        status: u16,
        count: u32,
        retry_after_secs: u64,
    ) -> anyhow::Result<()> {
        self.fault_from(json!({"op": op, "status": status, "count": count, "retry_after_secs": retry_after_secs}))
            .await
    }

    /// Lets the next `count` calls of `op` happen, then answers each with `status` instead of
    /// its real answer: the action took place but the caller cannot know it.
    pub async fn fault_after(&self, op: &str, status: u16, count: u32) -> anyhow::Result<()> {
        self.fault_from(json!({"op": op, "status": status, "count": count, "when": "after"}))
            .await
    }

    /// Queues a fault described as `POST /_sim/faults` takes it (e.g. with an `error_code`).
    pub async fn fault_from(&self, body: Value) -> anyhow::Result<()> {
        self.post("/_sim/faults", body).await.map(drop)
    }

    /// Drops every queued fault.
    pub async fn clear_faults(&self) -> anyhow::Result<()> {
        let resp = self
            .http
            .delete(format!("{}/_sim/faults", self.base_url))
            .send()
            .await
            .context("DELETE /_sim/faults")?;
        ensure!(
            resp.status().is_success(),
            "DELETE /_sim/faults: {}",
            resp.status()
        );
        Ok(())
    }

    /// `normal`, `repeat` (the same next token forever) or `endless` (a fresh token forever).
    pub async fn paging(&self, mode: &str) -> anyhow::Result<()> {
        self.post("/_sim/paging", json!({ "mode": mode }))
            .await
            .map(drop)
    }

    /// Seeds one sandbox (see `POST /_sim/sandboxes`); returns it as E2B lists it.
    pub async fn seed(&self, body: Value) -> anyhow::Result<Value> {
        self.post("/_sim/sandboxes", body).await
    }

    /// Changes a live sandbox behind Steward's back (see `PATCH /_sim/sandboxes/{id}`:
    /// `metadata`, `state`, `profile`, `restart`); returns it as E2B lists it.
    pub async fn change(&self, id: &str, body: Value) -> anyhow::Result<Value> {
        let path = format!("/_sim/sandboxes/{id}");
        let resp = self
            .http
            .patch(format!("{}{path}", self.base_url))
            .json(&body)
            .send()
            .await
            .with_context(|| format!("PATCH {path}"))?;
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        ensure!(status.is_success(), "PATCH {path}: {status} {text}");
        Ok(serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// Counts of running, paused and killed sandboxes, snapshots and templates.
    pub async fn state(&self) -> anyhow::Result<Value> {
        self.get("/_sim/state").await
    }

    async fn get(&self, path: &str) -> anyhow::Result<Value> {
        let resp = self
            .http
            .get(format!("{}{path}", self.base_url))
            .send()
            .await
            .with_context(|| format!("GET {path}"))?;
        ensure!(resp.status().is_success(), "GET {path}: {}", resp.status());
        resp.json().await.with_context(|| format!("GET {path}"))
    }

    async fn post(&self, path: &str, body: Value) -> anyhow::Result<Value> {
        let mut req = self.http.post(format!("{}{path}", self.base_url));
        if !body.is_null() {
            req = req.json(&body);
        }
        let resp = req.send().await.with_context(|| format!("POST {path}"))?;
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        ensure!(status.is_success(), "POST {path}: {status} {text}");
        Ok(serde_json::from_str(&text).unwrap_or(Value::Null))
    }
}
