//! Pushed code is hostile: a push test's suite tries every way it has to read the Git
//! credential Steward cloned its commit with, and the push's payload names another server as
//! the repository's `clone_url`. The commit is served over real HTTP by `git http-backend`,
//! which asks for the credential, so the test also proves the credential works and where it
//! went.
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use base64::Engine;
use reqwest::StatusCode;
use sandbox_steward::ids::RunId;
use serde_json::Value;

use crate::common::{TestAppOptions, eventually, spawn_app_with, wait_until};
use crate::git_http::GitHttp;
use crate::github::{OLD_SECRET, REPO, push, push_body, redis_dump, runner};

/// What an attacker's suite does, from the checkout: print every environment it can read
/// (its parent's, as in the report, and every process's), each value reversed, in base64 and
/// in hex so that no scrubber of the plain value can catch it; Git's configuration; the files
/// an askpass helper or a credential store would leave. It then fails, so its whole output is
/// posted to Slack.
const ATTACK_SH: &str = r#"echo "tests ran at $(git rev-parse HEAD)"
found=$(mktemp)
grab() { tr '\0' '\n' >>"$found"; echo >>"$found"; }
echo "== the parent's environment"
grab < /proc/$PPID/environ
echo "== every environment and command line this command can read"
for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do grab < "$f" 2>/dev/null; done
echo "== git config"
git config -l --show-origin 2>&1 | grab
cat .git/config .git/FETCH_HEAD 2>&1 | grab
echo "== askpass and credential files"
for f in ../.steward-askpass "$GIT_ASKPASS" "$HOME/.git-credentials" "$HOME/.config/git/credentials" /tmp/tmp.*; do
  [ -f "$f" ] && [ "$f" != "$found" ] && { echo "file $f"; grab < "$f"; }
done
echo "== my own environment"
env | grab
echo "== all of it, each value plain, reversed, in base64 and in hex"
sort -u "$found" | while IFS= read -r line; do
  value="${line#*=}"
  [ -n "$value" ] || continue
  printf 'plain %s\n' "$line"
  printf 'rev %s\n' "$(printf '%s' "$value" | rev)"
  printf 'b64 %s\n' "$(printf '%s' "$value" | base64 -w0)"
  printf 'hex %s\n' "$(printf '%s' "$value" | od -An -tx1 | tr -d ' \n')"
done
rm -f "$found"
exit 1
"#;

/// A bare repository `root/acme/api.git` whose one commit holds `run-tests.sh`; its sha.
fn bare_repo(root: &Path) -> String {
    let work = root.join("work");
    std::fs::create_dir_all(&work).unwrap();
    let git = |dir: &Path, args: &[&str]| {
        let out = Command::new("git")
            .args(["-c", "user.name=Mallory", "-c", "user.email=m@example.com"])
            .args(args)
            .current_dir(dir)
            .output()
            .expect("git runs");
        assert!(out.status.success(), "git {args:?}: {out:?}");
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    };
    git(&work, &["init", "-q", "-b", "main"]);
    std::fs::write(work.join("run-tests.sh"), ATTACK_SH).unwrap();
    git(&work, &["add", "run-tests.sh"]);
    git(&work, &["commit", "-q", "-m", "Faster tests"]);
    let sha = git(&work, &["rev-parse", "HEAD"]);
    let served = root.join("acme");
    std::fs::create_dir_all(&served).unwrap();
    git(
        &served,
        &["clone", "-q", "--bare", work.to_str().unwrap(), "api.git"],
    );
    git(
        &served.join("api.git"),
        &["config", "uploadpack.allowAnySHA1InWant", "true"],
    );
    sha
}

/// The token in every encoding the attack prints.
fn encodings(token: &str) -> Vec<(&'static str, String)> {
    vec![
        ("plain", token.to_owned()),
        ("reversed", token.chars().rev().collect()),
        (
            "base64",
            base64::engine::general_purpose::STANDARD.encode(token),
        ),
        ("hex", hex::encode(token)),
    ]
}

#[tokio::test]
async fn pushed_code_cannot_read_the_clone_credential_and_it_goes_only_to_the_configured_host() {
    let dir = tempfile::tempdir().unwrap();
    let sha = bare_repo(dir.path());
    // A token of this test alone, so another test's clone running beside it cannot be mistaken
    // for a leak.
    let token = format!("ghs_{}", uuid::Uuid::new_v4().simple());
    let origin = GitHttp::start(
        dir.path().to_owned(),
        Some(format!("x-access-token:{token}")),
    )
    .await;
    let elsewhere = GitHttp::start(dir.path().to_owned(), None).await;

    let policy = format!(
        r#"
[[push_tests]]
repository = "{REPO}"
branches = ["main"]
template = "base"
command = "sh run-tests.sh && echo passed"
timeout = "2m"
channel = "C0ENG"
clone_url = "{}/acme/api.git"
"#,
        origin.base
    );
    let app = spawn_app_with(TestAppOptions {
        exec_local: true,
        policy: Some(policy),
        env: vec![
            ("GITHUB_WEBHOOK_SECRET".into(), OLD_SECRET.into()),
            ("GITHUB_TOKEN".into(), token.clone()),
        ],
        ..TestAppOptions::default()
    })
    .await;

    // The payload says the repository lives elsewhere: that decides nothing.
    let mut body = push_body("refs/heads/main", &sha, &["run-tests.sh"]);
    body["repository"]["clone_url"] = Value::from(format!("{}/acme/api.git", elsewhere.base));
    let resp = push(&app, "d-attack", &body).await;
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    let started: Value = resp.json().await.unwrap();
    let id = RunId::parse(started["run"].as_str().unwrap()).unwrap();
    let run = runner(&app)
        .wait(&id, Duration::from_secs(90))
        .await
        .unwrap();
    eventually("the run is handed over", || async {
        runner(&app).get(&id).await.unwrap().handed_over
    })
    .await;

    let output = {
        let chunk = runner(&app).output(&id, 0).await.unwrap();
        String::from_utf8_lossy(&chunk.bytes).into_owned()
    };
    // The attack ran, at the pushed commit, fetched with the credential.
    assert_eq!(run.exit_code, Some(1), "{run:?}\n{output}");
    assert!(output.contains(&format!("tests ran at {sha}")), "{output}");
    assert!(output.contains("== all of it"), "{output}");
    assert!(
        !run.output_truncated,
        "every byte the attack printed is checked ({} bytes)",
        run.output_bytes
    );
    let seen = origin.seen();
    assert!(
        seen.iter()
            .any(|s| s.credential.as_deref() == Some(format!("x-access-token:{token}").as_str())),
        "the configured host got the credential: {seen:?}"
    );
    assert!(
        seen.iter().all(|s| s.path.starts_with("/acme/api.git/")),
        "only the configured repository was fetched: {seen:?}"
    );
    assert!(
        elsewhere.seen().is_empty(),
        "the payload's clone_url was never contacted: {:?}",
        elsewhere.seen()
    );

    // Its failure is posted with the whole output; nothing anywhere holds the token.
    let shared = wait_until("the output file", || async {
        app.slack
            .messages()
            .into_iter()
            .find(|m| m.method == "files.completeUploadExternal")
    })
    .await;
    let file_id = shared.body["files"][0]["id"].as_str().unwrap().to_owned();
    let file =
        String::from_utf8_lossy(&app.slack.file(&file_id).unwrap().bytes.unwrap()).into_owned();
    assert!(file.contains("== all of it"), "{file}");
    let posted = format!("{:?}", app.slack.messages());
    let stored = redis_dump(&app);
    for (how, leaked) in encodings(&token) {
        for (place, text) in [
            ("the run's output", &output),
            ("the uploaded file", &file),
            ("Slack", &posted),
            ("Redis", &stored),
        ] {
            assert!(
                !text.contains(&leaked),
                "the token, {how}, is in {place}:\n{text}"
            );
        }
    }
}

/// GitHub's API as a GitHub App sees it: the installation of one repository, and installation
/// tokens for it, handed out only to a JWT signed by the app's key (checked with its public key).
mod fake_github {
    use std::sync::{Arc, Mutex};

    use axum::Json;
    use axum::extract::{Path, State};
    use axum::http::{HeaderMap, StatusCode};
    use base64::Engine;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use ring::signature::{RSA_PKCS1_2048_8192_SHA256, UnparsedPublicKey};
    use serde_json::{Value, json};

    #[derive(Clone)]
    pub struct Api {
        public_key: Arc<Vec<u8>>,
        app_id: String,
        /// The token handed out, and every access-token request's body.
        pub token: String,
        pub asked: Arc<Mutex<Vec<Value>>>,
    }

    impl Api {
        /// Whether `headers` carry a JWT of the app, signed by its key, valid now for at most
        /// ten minutes (as GitHub requires).
        fn signed_by_app(&self, headers: &HeaderMap) -> bool {
            let Some(jwt) = headers
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
            else {
                return false;
            };
            let mut parts = jwt.split('.');
            let (Some(header), Some(claims), Some(signature), None) =
                (parts.next(), parts.next(), parts.next(), parts.next())
            else {
                return false;
            };
            let decode = |part: &str| URL_SAFE_NO_PAD.decode(part).ok();
            let (Some(h), Some(c), Some(sig)) = (decode(header), decode(claims), decode(signature))
            else {
                return false;
            };
            let key =
                UnparsedPublicKey::new(&RSA_PKCS1_2048_8192_SHA256, self.public_key.as_slice());
            if key
                .verify(format!("{header}.{claims}").as_bytes(), &sig)
                .is_err()
            {
                return false;
            }
            let h: Value = serde_json::from_slice(&h).unwrap_or_default();
            let c: Value = serde_json::from_slice(&c).unwrap_or_default();
            let now = chrono::Utc::now().timestamp();
            let (iat, exp) = (
                c["iat"].as_i64().unwrap_or(0),
                c["exp"].as_i64().unwrap_or(0),
            );
            h["alg"] == "RS256"
                && c["iss"].as_str() == Some(self.app_id.as_str())
                && iat <= now
                && now < exp
                && exp - iat <= 600
        }
    }

    async fn installation(
        State(api): State<Api>,
        Path((owner, repo)): Path<(String, String)>,
        headers: HeaderMap,
    ) -> (StatusCode, Json<Value>) {
        if !api.signed_by_app(&headers) {
            return (
                StatusCode::UNAUTHORIZED,
                Json(json!({"message": "A JSON web token could not be decoded"})),
            );
        }
        if (owner.as_str(), repo.as_str()) != ("acme", "api") {
            return (StatusCode::NOT_FOUND, Json(json!({"message": "Not Found"})));
        }
        (StatusCode::OK, Json(json!({"id": 4242, "app_id": 12345})))
    }

    async fn access_token(
        State(api): State<Api>,
        Path(id): Path<u64>,
        headers: HeaderMap,
        Json(body): Json<Value>,
    ) -> (StatusCode, Json<Value>) {
        if !api.signed_by_app(&headers) || id != 4242 {
            return (
                StatusCode::UNAUTHORIZED,
                Json(json!({"message": "Bad credentials"})),
            );
        }
        api.asked.lock().unwrap().push(body);
        (
            StatusCode::CREATED,
            Json(json!({"token": api.token, "expires_at": "2099-01-01T00:00:00Z"})),
        )
    }

    /// Starts the API; returns its base URL and its state.
    pub async fn start(public_key: Vec<u8>, app_id: &str, token: &str) -> (String, Api) {
        let api = Api {
            public_key: Arc::new(public_key),
            app_id: app_id.to_owned(),
            token: token.to_owned(),
            asked: Arc::default(),
        };
        let app = axum::Router::new()
            .route(
                "/repos/{owner}/{repo}/installation",
                axum::routing::get(installation),
            )
            .route(
                "/app/installations/{id}/access_tokens",
                axum::routing::post(access_token),
            )
            .with_state(api.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (base, api)
    }
}

/// A fresh 2048-bit RSA key: its PKCS#1 PEM (as GitHub hands an app's key out) and its public
/// key as PKCS#1 DER.
fn rsa_key(dir: &Path) -> (String, Vec<u8>) {
    let pem = dir.join("app.pem");
    let der = dir.join("app.pub.der");
    let openssl = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .output()
            .expect("openssl runs");
        assert!(out.status.success(), "openssl {args:?}: {out:?}");
    };
    openssl(&[
        "genrsa",
        "-traditional",
        "-out",
        pem.to_str().unwrap(),
        "2048",
    ]);
    openssl(&[
        "rsa",
        "-in",
        pem.to_str().unwrap(),
        "-RSAPublicKey_out",
        "-outform",
        "DER",
        "-out",
        der.to_str().unwrap(),
    ]);
    (
        std::fs::read_to_string(pem).unwrap(),
        std::fs::read(der).unwrap(),
    )
}

#[tokio::test]
async fn with_a_github_app_each_clone_gets_an_installation_token_for_its_repository_alone() {
    let dir = tempfile::tempdir().unwrap();
    let sha = bare_repo(dir.path());
    let (pem, public) = rsa_key(dir.path());
    let minted = format!("ghs_{}", uuid::Uuid::new_v4().simple());
    let (api, github) = fake_github::start(public, "12345", &minted).await;
    let origin = GitHttp::start(
        dir.path().to_owned(),
        Some(format!("x-access-token:{minted}")),
    )
    .await;
    let policy = format!(
        r#"
[[push_tests]]
repository = "{REPO}"
branches = ["main"]
template = "base"
command = "git log -1 --format=%H"
timeout = "2m"
channel = "C0ENG"
clone_url = "{}/acme/api.git"
"#,
        origin.base
    );
    let app = spawn_app_with(TestAppOptions {
        exec_local: true,
        policy: Some(policy),
        env: vec![
            ("GITHUB_WEBHOOK_SECRET".into(), OLD_SECRET.into()),
            ("GITHUB_APP_ID".into(), "12345".into()),
            ("GITHUB_APP_PRIVATE_KEY".into(), pem),
            ("GITHUB_API_URL".into(), api),
        ],
        ..TestAppOptions::default()
    })
    .await;
    let resp = push(
        &app,
        "d-app",
        &push_body("refs/heads/main", &sha, &["run-tests.sh"]),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    let started: Value = resp.json().await.unwrap();
    let id = RunId::parse(started["run"].as_str().unwrap()).unwrap();
    let run = runner(&app)
        .wait(&id, Duration::from_secs(90))
        .await
        .unwrap();
    let output =
        String::from_utf8_lossy(&runner(&app).output(&id, 0).await.unwrap().bytes).into_owned();
    assert_eq!(run.exit_code, Some(0), "{run:?}\n{output}");
    assert!(output.contains(&sha), "the commit was cloned: {output}");

    // The token asked for is one repository's, read-only; the clone used it.
    let asked = github.asked.lock().unwrap().clone();
    assert_eq!(
        asked,
        vec![serde_json::json!({"repositories": ["api"], "permissions": {"contents": "read"}})]
    );
    assert!(
        origin
            .seen()
            .iter()
            .any(|s| s.credential.as_deref() == Some(format!("x-access-token:{minted}").as_str())),
        "{:?}",
        origin.seen()
    );
    for (place, text) in [
        ("the run's output", output),
        ("Redis", redis_dump(&app)),
        ("Slack", format!("{:?}", app.slack.messages())),
    ] {
        assert!(!text.contains(&minted), "the token is in {place}");
    }
}
