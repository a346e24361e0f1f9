//! Test-failure alerts: a failed test run (from a push, or from another CI system through
//! `POST /api/v1/test-failures`) posted to Slack with the failing lines, and the whole output
//! uploaded as a file in the alert's thread; and the error alert for a test run that could not
//! happen at all (no sandbox, no clone, the sandbox died), which reads and looks different.
//!
//! A test failure's details hang under a red (`danger`) attachment bar (in its template); the error alert has no
//! colour and never the `:x:` marker, so nobody mistakes one for the other.
//!
//! Callers hand over plain data ([`TestFailure`], [`TestRunError`]); `failures` picks the failing
//! lines (pure), `message` renders the two templates. This module must never import
//! `approvals`, `runs`, `http`, `cli`, `sim` or `github`: it knows Slack and text, nothing of
//! how the run came about. Output bytes never reach a log.
use std::time::Duration;

use crate::ids::{SandboxId, SlackChannelId, SlackUserId};
use crate::slack::client::{SlackClient, SlackError};
use crate::slack::format;
use crate::slack::render::{Message, RenderError, Templates};

pub mod failures;
pub mod message;

pub use message::{render_test_failure, render_test_run_error, short_sha};

/// The most output uploaded to the thread. A longer output keeps its first and last halves,
/// and the thread says so.
pub const MAX_UPLOAD_BYTES: usize = 10 * 1024 * 1024;

/// Someone behind a commit: the push's author or pusher. Any part may be missing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Person {
    pub name: Option<String>,
    pub email: Option<String>,
    /// GitHub login (or the CI system's user name).
    pub login: Option<String>,
    /// The Slack user this person maps to; the alert mentions them when set.
    pub slack_user: Option<SlackUserId>,
}

/// A test run that finished with a non-zero exit code.
#[derive(Clone, PartialEq, Eq)]
pub struct TestFailure {
    /// `owner/name`.
    pub repository: String,
    pub branch: String,
    /// The tested commit (the full id; the alert shows 7 characters).
    pub commit_sha: String,
    /// Where the commit can be seen; the short sha links to it. Dropped unless `http(s)`.
    pub commit_url: Option<String>,
    /// The head commit's message; the alert shows its first line.
    pub commit_message: Option<String>,
    pub pusher: Option<Person>,
    pub author: Option<Person>,
    pub command: String,
    pub exit_code: i32,
    pub duration: Option<Duration>,
    /// Everything the command printed (stdout and stderr, as the runner interleaved them).
    pub output: Vec<u8>,
    pub sandbox_id: Option<SandboxId>,
}

/// The output stays out of `Debug`, so a logged value never carries it.
impl std::fmt::Debug for TestFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestFailure")
            .field("repository", &self.repository)
            .field("branch", &self.branch)
            .field("commit_sha", &self.commit_sha)
            .field("command", &self.command)
            .field("exit_code", &self.exit_code)
            .field("output_bytes", &self.output.len())
            .field("sandbox_id", &self.sandbox_id)
            .finish_non_exhaustive()
    }
}

/// The step of a test run that could not be done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Creating the sandbox: the template is missing, E2B refused or could not be reached.
    CreateSandbox,
    /// Cloning the pushed commit into the sandbox.
    Clone,
    /// Running the command: the sandbox died or stopped answering.
    Run,
}

impl Step {
    /// The step as the alert names it.
    pub fn phrase(self) -> &'static str {
        match self {
            Self::CreateSandbox => "Starting the sandbox",
            Self::Clone => "Cloning the commit",
            Self::Run => "Running the command",
        }
    }
}

/// A test run that could not happen: the alert names the step and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestRunError {
    pub repository: String,
    pub branch: String,
    pub commit_sha: String,
    pub commit_url: Option<String>,
    pub step: Step,
    /// Why, in a sentence a person can act on (no secrets: the caller scrubs them).
    pub why: String,
    pub sandbox_id: Option<SandboxId>,
}

/// Where an alert landed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostedAlert {
    pub channel: SlackChannelId,
    pub ts: String,
    /// The uploaded output's Slack file id; `None` when there was no output or the upload
    /// failed (the thread then says so).
    pub output_file: Option<String>,
}

/// Why an alert was not posted.
#[derive(Debug, thiserror::Error)]
pub enum AlertError {
    #[error("the alert could not be formatted: {0}")]
    Render(#[from] RenderError),
    #[error("Slack did not take the alert: {0}")]
    Slack(#[from] SlackError),
}

/// Why a commit URL was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the commit URL must be an http(s) URL without spaces, `|`, `<` or `>`")]
pub struct BadCommitUrl;

/// `url` if it can be a Slack link target: `http(s)://` and nothing that ends the link early.
pub fn commit_url(url: &str) -> Result<String, BadCommitUrl> {
    let url = url.trim();
    if format::is_link_target(url) && url.len() <= 2000 && url::Url::parse(url).is_ok() {
        Ok(url.to_owned())
    } else {
        Err(BadCommitUrl)
    }
}

/// Posts the test-failure alert to `channel`, then uploads the whole output as a file in its
/// thread (at most [`MAX_UPLOAD_BYTES`]). A failed upload does not undo the alert: the thread
/// says the output could not be attached, and the alert is returned without a file.
#[tracing::instrument(skip(slack, templates, failure), fields(repository = %failure.repository, commit = %short_sha(&failure.commit_sha)))]
pub async fn post_test_failure(
    slack: &SlackClient,
    templates: &Templates,
    channel: &SlackChannelId,
    failure: &TestFailure,
) -> Result<PostedAlert, AlertError> {
    let message = render_test_failure(templates, failure)?;
    let (channel, ts) = slack.post_message(channel, message).await?;
    let mut posted = PostedAlert {
        channel,
        ts,
        output_file: None,
    };
    posted.output_file = attach_output(slack, &posted, failure).await;
    Ok(posted)
}

/// Uploads the whole output of `failure` (at most [`MAX_UPLOAD_BYTES`]) as a file in the thread
/// of the alert `posted`; the file's id, or `None` when there was no output or the upload failed
/// (the thread then says so).
pub async fn attach_output(
    slack: &SlackClient,
    posted: &PostedAlert,
    failure: &TestFailure,
) -> Option<String> {
    if failure.output.is_empty() {
        return None;
    }
    let (bytes, note) = capped_output(&failure.output);
    let short = short_sha(&failure.commit_sha);
    let filename = format!("test-output-{}.txt", file_safe(&short));
    let title = format!("Output of the tests at {short}");
    match slack
        .upload_file(
            &posted.channel,
            Some(&posted.ts),
            &filename,
            &title,
            bytes,
            note.as_deref(),
        )
        .await
    {
        Ok(file) => Some(file),
        Err(e) => {
            tracing::warn!(error = %e, "the test output could not be attached to the alert");
            let sentence = format!("Steward could not attach the full output here: {e}.");
            if let Err(e) = slack
                .post_message_in_thread(&posted.channel, Some(&posted.ts), Message::plain(sentence))
                .await
            {
                tracing::warn!(error = %e, "could not say so in the alert's thread either");
            }
            None
        }
    }
}

/// Posts the error alert (a test run that could not happen) to `channel`.
#[tracing::instrument(skip(slack, templates, error), fields(repository = %error.repository, step = ?error.step))]
pub async fn post_error(
    slack: &SlackClient,
    templates: &Templates,
    channel: &SlackChannelId,
    error: &TestRunError,
) -> Result<PostedAlert, AlertError> {
    let message = render_test_run_error(templates, error)?;
    let (channel, ts) = slack.post_message(channel, message).await?;
    Ok(PostedAlert {
        channel,
        ts,
        output_file: None,
    })
}

/// The output as uploaded: whole when it fits, else its first and last halves of
/// [`MAX_UPLOAD_BYTES`] around a line saying what was left out, with a note for the thread.
pub fn capped_output(output: &[u8]) -> (Vec<u8>, Option<String>) {
    capped_to(output, MAX_UPLOAD_BYTES)
}

fn capped_to(output: &[u8], max: usize) -> (Vec<u8>, Option<String>) {
    if output.len() <= max {
        return (output.to_vec(), None);
    }
    let half = max / 2;
    let left_out = output.len() - 2 * half;
    let mut bytes = Vec::with_capacity(2 * half + 100);
    bytes.extend_from_slice(&output[..half]);
    bytes.extend_from_slice(
        format!(
            "\n\n… {} left out here by Steward …\n\n",
            format::human_bytes(left_out as u64)
        )
        .as_bytes(),
    );
    bytes.extend_from_slice(&output[output.len() - half..]);
    let note = format!(
        "The output was {}, over the {} Slack upload cap; this file keeps its first and last {}.",
        format::human_bytes(output.len() as u64),
        format::human_bytes(max as u64),
        format::human_bytes(half as u64),
    );
    (bytes, Some(note))
}

/// Keeps a file name to letters, digits, `-` and `_`.
fn file_safe(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commit_urls_must_be_links_that_cannot_break_out() {
        assert!(commit_url("https://github.com/acme/parser/commit/9f3c2a1").is_ok());
        assert!(commit_url("http://git.local/acme/commit/1").is_ok());
        assert!(commit_url("javascript:alert(1)").is_err());
        assert!(commit_url("https://x.example/a|<!channel>").is_err());
        assert!(commit_url("https://x.example/a b").is_err());
        assert!(commit_url("").is_err());
    }

    #[test]
    fn an_output_over_the_cap_keeps_its_ends_and_says_so() {
        let output: Vec<u8> = (0..100u8).collect();
        let (bytes, note) = capped_to(&output, 40);
        assert!(bytes.starts_with(&output[..20]));
        assert!(bytes.ends_with(&output[80..]));
        assert!(String::from_utf8_lossy(&bytes).contains("60 B left out"));
        assert!(note.unwrap().contains("first and last 20 B"));
        let (whole, none) = capped_to(&output, 100);
        assert_eq!((whole, none), (output, None));
    }

    #[test]
    fn the_output_stays_out_of_debug() {
        let failure = TestFailure {
            repository: "acme/x".into(),
            branch: "main".into(),
            commit_sha: "abc1234".into(),
            commit_url: None,
            commit_message: None,
            pusher: None,
            author: None,
            command: "make test".into(),
            exit_code: 2,
            duration: None,
            output: b"SECRET_TOKEN=hunter2".to_vec(),
            sandbox_id: None,
        };
        let shown = format!("{failure:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
    }
}
