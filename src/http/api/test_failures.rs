//! `POST /api/v1/test-failures`: another CI system reports a failed test run, and Steward posts
//! the same alert a failed push test gets (failing lines, the whole output in the thread) to
//! `[channels] engineering`.
//!
//! This file only checks the token, parses and words; the alert is `alerts::post_test_failure`.
//! A refused request posts nothing.
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{ApiFailure, ApiJson, Caller};
use crate::alerts::{self, AlertError, Person, TestFailure, TestOutput};
use crate::config::ApiAction;
use crate::http::AppState;
use crate::ids::{SandboxId, SlackChannelId, SlackUserId};

/// Longest repository, branch or person field.
const NAME_MAX_CHARS: usize = 255;
/// Longest command.
const COMMAND_MAX_CHARS: usize = 4000;
/// Longest commit message.
const MESSAGE_MAX_CHARS: usize = 10_000;

/// The request body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TestFailureReport {
    /// `owner/name`.
    pub repository: String,
    pub branch: String,
    /// The commit id (hex, at least 7 characters).
    pub commit: String,
    /// A name, or `{name, email, login, slack_user}`.
    pub author: Author,
    /// Who pushed, when it is not the author; the same shape as `author`.
    #[serde(default)]
    pub pusher: Option<Author>,
    pub command: String,
    /// Non-zero: a zero exit code is a pass, not a failure.
    pub exit_code: i32,
    /// Everything the command printed.
    pub output: String,
    #[serde(default)]
    pub sandbox_id: Option<String>,
    #[serde(default)]
    pub commit_url: Option<String>,
    /// The commit's message; the alert shows its first line.
    #[serde(default)]
    pub message: Option<String>,
    /// How long the tests ran, in seconds.
    #[serde(default)]
    pub duration_secs: Option<u64>,
}

/// `"Sam Lee"` or `{"name": "Sam Lee", "email": "...", "login": "sam", "slack_user": "U…"}`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Author {
    Name(String),
    Detailed {
        #[serde(default)]
        name: Option<String>,
        #[serde(default)]
        email: Option<String>,
        #[serde(default)]
        login: Option<String>,
        #[serde(default)]
        slack_user: Option<String>,
    },
}

fn required(field: &str, value: &str, max: usize) -> Result<String, ApiFailure> {
    let value = value.trim();
    if value.is_empty() {
        return Err(ApiFailure::invalid(field, format!("`{field}` is required")));
    }
    if value.chars().count() > max {
        return Err(ApiFailure::invalid(
            field,
            format!("`{field}` is longer than {max} characters"),
        ));
    }
    Ok(value.to_owned())
}

fn one_line(field: &str, value: String) -> Result<String, ApiFailure> {
    if value.contains(['\n', '\r']) {
        return Err(ApiFailure::invalid(
            field,
            format!("`{field}` must be one line"),
        ));
    }
    Ok(value)
}

fn optional(field: &str, value: Option<String>, max: usize) -> Result<Option<String>, ApiFailure> {
    match value.as_deref().map(str::trim) {
        None | Some("") => Ok(None),
        Some(v) => required(field, v, max).map(Some),
    }
}

fn person(field: &str, author: Author) -> Result<Person, ApiFailure> {
    let at = |part: &str| format!("{field}.{part}");
    let person = match author {
        Author::Name(name) => Person {
            name: Some(required(field, &name, NAME_MAX_CHARS)?),
            ..Person::default()
        },
        Author::Detailed {
            name,
            email,
            login,
            slack_user,
        } => Person {
            name: optional(&at("name"), name, NAME_MAX_CHARS)?,
            email: optional(&at("email"), email, NAME_MAX_CHARS)?,
            login: optional(&at("login"), login, NAME_MAX_CHARS)?,
            slack_user: optional(&at("slack_user"), slack_user, NAME_MAX_CHARS)?
                .map(|u| {
                    SlackUserId::parse(u)
                        .map_err(|e| ApiFailure::invalid(at("slack_user"), e.to_string()))
                })
                .transpose()?,
        },
    };
    if person == Person::default() {
        return Err(ApiFailure::invalid(
            field,
            format!("`{field}` needs a name, an email, a login or a slack_user"),
        ));
    }
    Ok(person)
}

/// The report as the alert's plain data, or the field to fix.
pub fn test_failure(report: TestFailureReport) -> Result<TestFailure, ApiFailure> {
    let repository = one_line(
        "repository",
        required("repository", &report.repository, NAME_MAX_CHARS)?,
    )?;
    let branch = one_line(
        "branch",
        required("branch", &report.branch, NAME_MAX_CHARS)?,
    )?;
    let commit = required("commit", &report.commit, 64)?;
    if commit.len() < 7 || !commit.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(ApiFailure::invalid(
            "commit",
            "`commit` must be the commit id in hex, at least 7 characters",
        ));
    }
    let command = required("command", &report.command, COMMAND_MAX_CHARS)?;
    if report.exit_code == 0 {
        return Err(ApiFailure::invalid(
            "exit_code",
            "`exit_code` 0 means the tests passed; report only failed runs",
        ));
    }
    let commit_url = optional("commit_url", report.commit_url, 2000)?
        .map(|u| {
            alerts::commit_url(&u).map_err(|e| ApiFailure::invalid("commit_url", e.to_string()))
        })
        .transpose()?;
    let sandbox_id = optional("sandbox_id", report.sandbox_id, 200)?
        .map(|id| {
            SandboxId::parse(id).map_err(|e| ApiFailure::invalid("sandbox_id", e.to_string()))
        })
        .transpose()?;
    Ok(TestFailure {
        repository,
        branch,
        commit_sha: commit.to_ascii_lowercase(),
        commit_url,
        commit_message: optional("message", report.message, MESSAGE_MAX_CHARS)?,
        pusher: report.pusher.map(|p| person("pusher", p)).transpose()?,
        author: Some(person("author", report.author)?),
        command,
        exit_code: report.exit_code,
        duration: report.duration_secs.map(Duration::from_secs),
        output: TestOutput::whole(report.output.into_bytes()),
        sandbox_id,
    })
}

/// `[channels] engineering`, or a 503 saying what to set.
fn engineering_channel(state: &AppState) -> Result<SlackChannelId, ApiFailure> {
    let channel = state
        .settings
        .policy
        .channels
        .engineering
        .as_deref()
        .ok_or_else(|| {
            ApiFailure::unavailable(
                "This Steward has no channel for test failures; set `engineering` under [channels] in steward.toml",
            )
        })?;
    SlackChannelId::parse(channel).map_err(|e| {
        ApiFailure::unavailable(format!(
            "[channels] engineering in steward.toml is not a channel id ({e}); nothing was posted"
        ))
    })
}

/// `POST /api/v1/test-failures`: posts the alert; 201 with where it landed.
pub async fn report(
    State(state): State<AppState>,
    caller: Caller,
    ApiJson(report): ApiJson<TestFailureReport>,
) -> Result<(StatusCode, Json<Value>), ApiFailure> {
    caller.require(ApiAction::ReportTestFailure)?;
    let failure = test_failure(report)?;
    let channel = engineering_channel(&state)?;
    let posted = alerts::post_test_failure(&state.slack, &state.templates, &channel, &failure)
        .await
        .map_err(|e| match e {
            AlertError::Slack(e) => ApiFailure::upstream(format!(
                "Slack did not take the alert ({e}); nothing was posted"
            )),
            e @ AlertError::Render(_) => ApiFailure::internal(e.to_string()),
        })?;
    tracing::info!(
        caller = %caller.name,
        repository = %failure.repository,
        channel = %posted.channel,
        ts = %posted.ts,
        "test failure reported"
    );
    Ok((
        StatusCode::CREATED,
        Json(json!({
            "channel": posted.channel,
            "ts": posted.ts,
            "output_file": posted.output_file,
        })),
    ))
}
