//! A Git smart-HTTP server for tests: `git http-backend` (Git's own CGI program) behind axum on a
//! random port. It can ask for Basic credentials, and it records every request's path and
//! `Authorization`, so a test sees exactly which credential reached which host.
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::Response;
use base64::Engine;
use tokio::io::AsyncWriteExt;

/// One request the server saw: its path and its Basic credential, decoded (`user:password`).
#[derive(Debug, Clone)]
pub struct Seen {
    pub path: String,
    pub credential: Option<String>,
}

#[derive(Clone)]
struct Shared {
    root: PathBuf,
    /// `user:password` the server asks for; `None` serves everyone.
    wanted: Option<String>,
    seen: Arc<Mutex<Vec<Seen>>>,
}

pub struct GitHttp {
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    seen: Arc<Mutex<Vec<Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for GitHttp {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl GitHttp {
    /// Serves the repositories under `root` (`{base}/owner/name.git` is `root/owner/name.git`),
    /// asking for `wanted` (`user:password`) when given.
    pub async fn start(root: PathBuf, wanted: Option<String>) -> Self {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let shared = Shared {
            root,
            wanted,
            seen: seen.clone(),
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let app = axum::Router::new().fallback(serve).with_state(shared);
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Self { base, seen, task }
    }

    /// Every request so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

fn basic(headers: &HeaderMap) -> Option<String> {
    let value = headers.get("authorization")?.to_str().ok()?;
    let encoded = value.strip_prefix("Basic ")?;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    String::from_utf8(bytes).ok()
}

async fn serve(
    State(shared): State<Shared>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let credential = basic(&headers);
    shared.seen.lock().unwrap().push(Seen {
        path: uri.path().to_owned(),
        credential: credential.clone(),
    });
    if let Some(wanted) = &shared.wanted
        && credential.as_deref() != Some(wanted.as_str())
    {
        return Response::builder()
            .status(StatusCode::UNAUTHORIZED)
            .header("www-authenticate", "Basic realm=\"git\"")
            .body(Body::from("credentials, please"))
            .unwrap();
    }
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned()
    };
    let mut child = tokio::process::Command::new("git")
        .arg("http-backend")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("GIT_PROJECT_ROOT", &shared.root)
        .env("GIT_HTTP_EXPORT_ALL", "1")
        .env("PATH_INFO", uri.path())
        .env("QUERY_STRING", uri.query().unwrap_or(""))
        .env("REQUEST_METHOD", method.as_str())
        .env("CONTENT_TYPE", header("content-type"))
        .env("CONTENT_LENGTH", body.len().to_string())
        .env("HTTP_CONTENT_ENCODING", header("content-encoding"))
        .env("GIT_PROTOCOL", header("git-protocol"))
        .env("REMOTE_ADDR", "127.0.0.1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("git http-backend starts");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(&body).await.unwrap();
    drop(stdin);
    let out = child.wait_with_output().await.unwrap();
    // CGI: headers, a blank line, the body.
    let split = out
        .stdout
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| (i, 4))
        .or_else(|| {
            out.stdout
                .windows(2)
                .position(|w| w == b"\n\n")
                .map(|i| (i, 2))
        })
        .expect("http-backend wrote headers");
    let head = String::from_utf8_lossy(&out.stdout[..split.0]).into_owned();
    let mut response = Response::builder();
    for line in head.lines() {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("status") {
            let code: u16 = value[..3].parse().unwrap();
            response = response.status(code);
        } else {
            response = response.header(name.trim(), value);
        }
    }
    response
        .body(Body::from(out.stdout[split.0 + split.1..].to_vec()))
        .unwrap()
}
