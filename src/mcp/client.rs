//! `ApiClient`: a thin client of Steward's HTTP API (`STEWARD_URL`, `STEWARD_API_TOKEN`), used by
//! `steward mcp` (stdio) and `steward run`, so policy is enforced in one place, by the server.
//!
//! The token is a `SecretString`: it is sent as `Authorization: Bearer` and never appears in
//! logs, errors or `Debug`.
use std::time::Duration;

use futures::future::BoxFuture;
use reqwest::Method;
use secrecy::{ExposeSecret, SecretString};
use serde_json::Value;

use super::{Backend, Failure, Op};

/// Longer than any long-poll the server holds (it caps `?wait=` below its request timeout).
const CLIENT_TIMEOUT: Duration = Duration::from_secs(180);

#[derive(Clone)]
pub struct ApiClient {
    /// `…/api/v1`, no trailing slash.
    base: String,
    token: SecretString,
    http: reqwest::Client,
}

impl std::fmt::Debug for ApiClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiClient")
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

impl ApiClient {
    /// A client of the Steward at `url` (its root, e.g. `https://steward.example.com`).
    pub fn new(url: &str, token: SecretString) -> Result<Self, String> {
        let parsed = url::Url::parse(url.trim())
            .map_err(|e| format!("STEWARD_URL {url:?} is not a URL: {e}"))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(format!(
                "STEWARD_URL {url:?} must start with http:// or https://"
            ));
        }
        if token.expose_secret().trim().is_empty() {
            return Err("STEWARD_API_TOKEN is empty".into());
        }
        let http = reqwest::Client::builder()
            .timeout(CLIENT_TIMEOUT)
            .build()
            .map_err(|e| format!("could not build an HTTP client: {e}"))?;
        Ok(Self {
            base: format!("{}/api/v1", url.trim().trim_end_matches('/')),
            token,
            http,
        })
    }

    /// From `STEWARD_URL` and `STEWARD_API_TOKEN`, each named when missing.
    pub fn from_env() -> Result<Self, String> {
        let url = std::env::var("STEWARD_URL")
            .ok()
            .filter(|v| !v.trim().is_empty())
            .ok_or("STEWARD_URL is not set: give the address of your Steward, e.g. https://steward.example.com")?;
        let token = std::env::var("STEWARD_API_TOKEN")
            .ok()
            .filter(|v| !v.trim().is_empty())
            .ok_or("STEWARD_API_TOKEN is not set: give the API token from [api.tokens] in steward.toml")?;
        Self::new(&url, SecretString::from(token))
    }

    /// One API request; a refusal comes back as the server's [`Failure`].
    pub async fn request(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&Value>,
    ) -> Result<reqwest::Response, Failure> {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(self.token.expose_secret())
            .query(query);
        if let Some(body) = body {
            req = req.json(body);
        }
        let resp = req.send().await.map_err(|e| Failure {
            status: 0,
            code: "unreachable".into(),
            message: format!(
                "Could not reach Steward at {}: {}.",
                self.base.trim_end_matches("/api/v1"),
                e.without_url()
            ),
            field: None,
        })?;
        if resp.status().is_success() {
            return Ok(resp);
        }
        Err(failure_of(resp).await)
    }

    /// One API request answered with JSON.
    pub async fn json(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&Value>,
    ) -> Result<Value, Failure> {
        let resp = self.request(method, path, query, body).await?;
        resp.json().await.map_err(|e| Failure {
            status: 0,
            code: "decode".into(),
            message: format!("Steward's answer could not be read: {}.", e.without_url()),
            field: None,
        })
    }

    /// One chunk of a run's output from byte `from` (`GET /runs/{id}/output`), waiting up to
    /// `wait` (e.g. `20s`) for new bytes.
    pub async fn output(
        &self,
        run_id: &str,
        from: u64,
        wait: Option<&str>,
    ) -> Result<Chunk, Failure> {
        let mut query = vec![("from", from.to_string())];
        if let Some(wait) = wait {
            query.push(("wait", wait.to_owned()));
        }
        let path = format!("/runs/{}/output", super::segment(run_id));
        let resp = self.request(Method::GET, &path, &query, None).await?;
        let header = |name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let next = header("x-next-offset").and_then(|v| v.parse::<u64>().ok());
        let finished = header("x-run-finished").as_deref() == Some("true");
        let truncated = header("x-output-truncated").as_deref() == Some("true");
        let bytes = resp.bytes().await.map_err(|e| Failure {
            status: 0,
            code: "unreachable".into(),
            message: format!("The run's output broke off: {}.", e.without_url()),
            field: None,
        })?;
        Ok(Chunk {
            next: next.unwrap_or(from + bytes.len() as u64),
            bytes: bytes.to_vec(),
            finished,
            truncated,
        })
    }

    /// Does `op` through the API.
    pub async fn send(&self, op: &Op) -> Result<Value, Failure> {
        let (method, path, query, body) = op.request();
        self.json(method, &path, &query, body.as_ref()).await
    }
}

/// One chunk of a run's output, as `GET /runs/{id}/output` answers it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    pub bytes: Vec<u8>,
    /// Where the next read starts (`X-Next-Offset`).
    pub next: u64,
    /// The run ended and every kept byte was read (`X-Run-Finished`).
    pub finished: bool,
    /// More was produced than the run's output cap keeps (`X-Output-Truncated`).
    pub truncated: bool,
}

/// The server's JSON error, or a sentence about a status that carried none.
async fn failure_of(resp: reqwest::Response) -> Failure {
    let status = resp.status();
    let body: Option<Value> = resp.json().await.ok();
    let error = body.as_ref().map(|b| &b["error"]);
    match error.and_then(|e| e["message"].as_str()) {
        Some(message) => Failure {
            status: status.as_u16(),
            code: error
                .and_then(|e| e["code"].as_str())
                .unwrap_or("error")
                .to_owned(),
            message: message.to_owned(),
            field: error.and_then(|e| e["field"].as_str()).map(str::to_owned),
        },
        None => Failure {
            status: status.as_u16(),
            code: "error".into(),
            message: format!("Steward answered {status} without an explanation."),
            field: None,
        },
    }
}

impl Backend for ApiClient {
    fn call(
        &self,
        _request: &rmcp::model::Extensions,
        op: Op,
    ) -> BoxFuture<'static, Result<Value, Failure>> {
        let client = self.clone();
        Box::pin(async move { client.send(&op).await })
    }
}
