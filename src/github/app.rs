//! GitHub App authentication for push-test clones: instead of one long-lived token that reads
//! every repository it can, each clone gets an installation token of its own, valid for an
//! hour, scoped to the one repository and to reading its contents (GitHub's recommendation for
//! bots). A token that leaks is then worth one repository's code for less than an hour.
//!
//! [`GithubApp::installation_token`] signs a JSON Web Token with the app's private key (RS256,
//! valid 9 minutes, back-dated a minute for clock drift), finds the repository's installation
//! (`GET /repos/{owner}/{repo}/installation`) and asks for a token
//! (`POST /app/installations/{id}/access_tokens` with `repositories` and `permissions`).
//! Neither the key, the JWT nor the token ever reaches a log, an error or `Debug`.
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use chrono::{DateTime, Utc};
use ring::signature::{RSA_PKCS1_SHA256, RsaKeyPair};
use secrecy::{ExposeSecret, SecretString};
use serde_json::{Value, json};

/// GitHub's API, unless `GITHUB_API_URL` names another (GitHub Enterprise Server, tests).
pub const DEFAULT_API_URL: &str = "https://api.github.com";
/// How long one call to GitHub may take: minting happens while the push-admission lease is
/// held, which lasts 15 s.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// Why no installation token could be had. `Display` is a sentence for the audit log and the
/// webhook's answer; it never holds a credential.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AppError {
    #[error(
        "GitHub did not give the app's installation token ({0}), so the push was not run; redeliver it from the webhook's Recent Deliveries"
    )]
    Unreachable(String),
    #[error("GitHub refused the app's request for an installation token: {0}")]
    Refused(String),
    #[error("the GitHub App's private key could not sign a token: {0}")]
    Key(String),
}

/// The app: its id, its private key and where GitHub's API is. Cheap to clone.
#[derive(Clone)]
pub struct GithubApp {
    id: String,
    key: Arc<RsaKeyPair>,
    api: String,
    http: reqwest::Client,
}

impl std::fmt::Debug for GithubApp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GithubApp")
            .field("id", &self.id)
            .field("api", &self.api)
            .finish_non_exhaustive()
    }
}

/// The DER bytes of a PEM block, and whether it is PKCS#1 (`RSA PRIVATE KEY`, what GitHub hands
/// out) rather than PKCS#8 (`PRIVATE KEY`).
fn pem_der(pem: &str) -> Result<(Vec<u8>, bool), String> {
    let pem = pem.trim();
    let pkcs1 = pem.starts_with("-----BEGIN RSA PRIVATE KEY-----");
    if !pkcs1 && !pem.starts_with("-----BEGIN PRIVATE KEY-----") {
        return Err(
            "it is not a PEM private key (-----BEGIN RSA PRIVATE KEY----- or -----BEGIN PRIVATE KEY-----)"
                .into(),
        );
    }
    let body: String = pem
        .lines()
        .filter(|l| !l.starts_with("-----"))
        .map(str::trim)
        .collect();
    let der = STANDARD
        .decode(body)
        .map_err(|_| "its body is not base64".to_owned())?;
    Ok((der, pkcs1))
}

impl GithubApp {
    /// The app `id` with its private key (PEM, as GitHub downloads it) at `api` (GitHub's API
    /// root). The error says what is wrong with the key, never what it holds.
    pub fn new(id: &str, key_pem: &SecretString, api: &str) -> Result<Self, String> {
        let id = id.trim();
        if id.is_empty() || !id.chars().all(|c| c.is_ascii_digit()) {
            return Err("GITHUB_APP_ID must be the app's numeric id".into());
        }
        let (der, pkcs1) = pem_der(key_pem.expose_secret())
            .map_err(|why| format!("GITHUB_APP_PRIVATE_KEY: {why}"))?;
        let key = if pkcs1 {
            RsaKeyPair::from_der(&der)
        } else {
            RsaKeyPair::from_pkcs8(&der)
        }
        .map_err(|e| format!("GITHUB_APP_PRIVATE_KEY is not a usable RSA key ({e})"))?;
        let api = api.trim().trim_end_matches('/');
        if !(api.starts_with("https://") || api.starts_with("http://")) {
            return Err(format!("GITHUB_API_URL {api:?} must start with https://"));
        }
        let http = reqwest::Client::builder()
            .timeout(CALL_TIMEOUT)
            .user_agent(concat!("sandbox-steward/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| format!("could not build the GitHub client: {e}"))?;
        Ok(Self {
            id: id.to_owned(),
            key: Arc::new(key),
            api: api.to_owned(),
            http,
        })
    }

    /// The app's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// A JWT identifying the app, valid from a minute ago for 9 minutes from `now`.
    fn jwt(&self, now: DateTime<Utc>) -> Result<SecretString, AppError> {
        let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"RS256","typ":"JWT"}"#);
        let claims = json!({
            "iat": now.timestamp() - 60,
            "exp": now.timestamp() + 9 * 60,
            "iss": self.id,
        });
        let claims = URL_SAFE_NO_PAD.encode(claims.to_string());
        let signed = format!("{header}.{claims}");
        let mut signature = vec![0; self.key.public().modulus_len()];
        self.key
            .sign(
                &RSA_PKCS1_SHA256,
                &ring::rand::SystemRandom::new(),
                signed.as_bytes(),
                &mut signature,
            )
            .map_err(|_| AppError::Key("signing failed".into()))?;
        Ok(SecretString::from(format!(
            "{signed}.{}",
            URL_SAFE_NO_PAD.encode(signature)
        )))
    }

    async fn call(
        &self,
        request: reqwest::RequestBuilder,
        jwt: &SecretString,
    ) -> Result<Value, AppError> {
        let response = request
            .bearer_auth(jwt.expose_secret())
            .header("accept", "application/vnd.github+json")
            .header("x-github-api-version", "2022-11-28")
            .send()
            .await
            .map_err(|e| AppError::Unreachable(e.without_url().to_string()))?;
        let status = response.status();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        if !status.is_success() {
            // GitHub's error bodies carry a `message` (never a credential).
            let message = body["message"].as_str().unwrap_or("no message");
            let message: String = message.chars().take(200).collect();
            let error = format!("{status}: {message}");
            return Err(if status.is_server_error() || status.as_u16() == 429 {
                AppError::Unreachable(error)
            } else {
                AppError::Refused(error)
            });
        }
        Ok(body)
    }

    /// An installation token for `repository` (`owner/name`) alone, allowed to read its
    /// contents and nothing else, valid about an hour.
    pub async fn installation_token(&self, repository: &str) -> Result<SecretString, AppError> {
        let Some((_, name)) = repository.split_once('/') else {
            return Err(AppError::Refused(format!(
                "{repository:?} is not owner/name"
            )));
        };
        let jwt = self.jwt(Utc::now())?;
        let installation = self
            .call(
                self.http
                    .get(format!("{}/repos/{repository}/installation", self.api)),
                &jwt,
            )
            .await?;
        let Some(id) = installation["id"].as_u64() else {
            return Err(AppError::Refused(format!(
                "GitHub named no installation of the app for {repository}"
            )));
        };
        let token = self
            .call(
                self.http
                    .post(format!("{}/app/installations/{id}/access_tokens", self.api))
                    .json(&json!({
                        "repositories": [name],
                        "permissions": {"contents": "read"},
                    })),
                &jwt,
            )
            .await?;
        token["token"]
            .as_str()
            .filter(|t| !t.is_empty())
            .map(|t| SecretString::from(t.to_owned()))
            .ok_or_else(|| AppError::Refused("GitHub's answer held no token".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_that_is_not_a_pem_rsa_key_is_refused_without_being_repeated() {
        let garbage = SecretString::from("hunter2-not-a-key".to_owned());
        let e = GithubApp::new("123", &garbage, DEFAULT_API_URL).unwrap_err();
        assert!(e.contains("not a PEM private key"), "{e}");
        assert!(!e.contains("hunter2"), "{e}");
        let bad_body = SecretString::from(
            "-----BEGIN RSA PRIVATE KEY-----\nc2VjcmV0\n-----END RSA PRIVATE KEY-----".to_owned(),
        );
        let e = GithubApp::new("123", &bad_body, DEFAULT_API_URL).unwrap_err();
        assert!(e.contains("not a usable RSA key"), "{e}");
        assert!(!e.contains("c2VjcmV0"), "{e}");
        assert!(
            GithubApp::new("app", &bad_body, DEFAULT_API_URL)
                .unwrap_err()
                .contains("numeric id")
        );
    }
}
