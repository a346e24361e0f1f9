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

/// A test run's output as kept: all of it (`left_out` 0, `tail` empty), or its first and last
/// parts and how much was counted between them but not kept (a run keeps the first and the last
/// `[runs] output_cap_bytes` of its output).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct TestOutput {
    pub head: Vec<u8>,
    /// Bytes between `head` and `tail` that were not kept.
    pub left_out: u64,
    pub tail: Vec<u8>,
}

impl TestOutput {
    /// All of an output.
    pub fn whole(bytes: Vec<u8>) -> Self {
        Self {
            head: bytes,
            left_out: 0,
            tail: Vec::new(),
        }
    }

    /// How long the whole output was.
    pub fn total(&self) -> u64 {
        self.head.len() as u64 + self.left_out + self.tail.len() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.total() == 0
    }

    /// The line that stands for what was left out between head and tail.
    fn gap_line(left_out: u64) -> String {
        format!(
            "\n\n… {} left out here by Steward …\n\n",
            format::human_bytes(left_out)
        )
    }

    /// The kept text, the gap marked by a line of its own: what failing lines are picked from,
    /// so the real end of a long output is read, not the end of its head.
    pub fn text(&self) -> std::borrow::Cow<'_, str> {
        // A whole output that is valid UTF-8 is borrowed, not copied (it can be 16 MiB).
        if self.left_out == 0 && self.tail.is_empty() {
            return String::from_utf8_lossy(&self.head);
        }
        let mut text = String::from_utf8_lossy(&self.head).into_owned();
        if self.left_out > 0 {
            text.push_str(&Self::gap_line(self.left_out));
        }
        text.push_str(&String::from_utf8_lossy(&self.tail));
        std::borrow::Cow::Owned(text)
    }
}

/// The output stays out of `Debug`, so a logged value never carries it.
impl std::fmt::Debug for TestOutput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestOutput")
            .field("head_bytes", &self.head.len())
            .field("left_out", &self.left_out)
            .field("tail_bytes", &self.tail.len())
            .finish()
    }
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
    /// What the command printed (stdout and stderr, as the runner interleaved them), as kept.
    pub output: TestOutput,
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
            .field("output", &self.output)
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

/// What the uploaded file holds of an output it cannot hold whole: the first and last bytes,
/// and why the middle is missing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cut {
    /// The whole output's size.
    pub total: u64,
    /// The bytes kept from its start and from its end.
    pub first: u64,
    pub last: u64,
    /// Over Slack's upload cap ([`MAX_UPLOAD_BYTES`]), not only over what the run kept.
    pub over_upload_cap: bool,
}

impl Cut {
    /// "its first 1.0 MiB and its last 1.0 MiB".
    pub fn kept(&self) -> String {
        format!(
            "its first {} and its last {}",
            format::human_bytes(self.first),
            format::human_bytes(self.last)
        )
    }

    /// The sentence posted with the file.
    fn note(&self, max: usize) -> String {
        let why = if self.over_upload_cap {
            format!(
                "over the {} Slack upload cap",
                format::human_bytes(max as u64)
            )
        } else {
            "more than Steward keeps of a run's output".to_owned()
        };
        format!(
            "The output was {}, {why}; this file keeps {}.",
            format::human_bytes(self.total),
            self.kept()
        )
    }
}

/// What the file for `output` leaves out, if anything (at most `max` bytes are uploaded).
fn cut_of(output: &TestOutput, max: usize) -> Option<Cut> {
    let total = output.total();
    if output.left_out == 0 && total <= max as u64 {
        return None;
    }
    let half = (max / 2) as u64;
    let (first, last) = if output.left_out == 0 {
        (half, half)
    } else {
        (
            (output.head.len() as u64).min(half),
            (output.tail.len() as u64).min(half),
        )
    };
    Some(Cut {
        total,
        first,
        last,
        over_upload_cap: total > max as u64 && output.left_out == 0,
    })
}

/// What the uploaded file keeps of `output` when not all of it, in words ("its first … and its
/// last …"); `None` when the file holds the whole output.
pub fn output_kept(output: &TestOutput) -> Option<String> {
    cut_of(output, MAX_UPLOAD_BYTES).map(|cut| cut.kept())
}

/// The output as uploaded: whole when it fits, else its first and last halves of
/// [`MAX_UPLOAD_BYTES`] around a line saying what was left out, with a note for the thread. An
/// output the run kept only the ends of is uploaded as those ends, also saying so.
pub fn capped_output(output: &TestOutput) -> (Vec<u8>, Option<String>) {
    capped_to(output, MAX_UPLOAD_BYTES)
}

fn capped_to(output: &TestOutput, max: usize) -> (Vec<u8>, Option<String>) {
    let Some(cut) = cut_of(output, max) else {
        let mut bytes = output.head.clone();
        bytes.extend_from_slice(&output.tail);
        return (bytes, None);
    };
    // Head and tail are one output when nothing was left out between them.
    let joined;
    let (start, end): (&[u8], &[u8]) = if output.left_out == 0 {
        joined = [output.head.as_slice(), output.tail.as_slice()].concat();
        (&joined, &joined)
    } else {
        (&output.head, &output.tail)
    };
    let first = &start[..cut.first as usize];
    let last = &end[end.len() - cut.last as usize..];
    let mut bytes = Vec::with_capacity(first.len() + last.len() + 100);
    bytes.extend_from_slice(first);
    bytes.extend_from_slice(TestOutput::gap_line(cut.total - cut.first - cut.last).as_bytes());
    bytes.extend_from_slice(last);
    (bytes, Some(cut.note(max)))
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
        let (bytes, note) = capped_to(&TestOutput::whole(output.clone()), 40);
        assert!(bytes.starts_with(&output[..20]));
        assert!(bytes.ends_with(&output[80..]));
        assert!(String::from_utf8_lossy(&bytes).contains("60 B left out"));
        assert!(note.unwrap().contains(
            "over the 40 B Slack upload cap; this file keeps its first 20 B and its last 20 B"
        ));
        let (whole, none) = capped_to(&TestOutput::whole(output.clone()), 100);
        assert_eq!((whole, none), (output, None));
    }

    #[test]
    fn an_output_the_run_kept_only_the_ends_of_is_uploaded_as_those_ends_and_says_so() {
        let output = TestOutput {
            head: b"collecting 150 tests\n".to_vec(),
            left_out: 40 * 1024 * 1024,
            tail: b"FAILED test_parse - AssertionError\n".to_vec(),
        };
        let (bytes, note) = capped_to(&output, 1024);
        let text = String::from_utf8_lossy(&bytes);
        assert!(text.starts_with("collecting 150 tests\n"), "{text}");
        assert!(
            text.contains("… 40 MiB left out here by Steward …"),
            "{text}"
        );
        assert!(
            text.ends_with("FAILED test_parse - AssertionError\n"),
            "{text}"
        );
        let note = note.unwrap();
        assert!(
            note.contains("more than Steward keeps of a run's output"),
            "{note}"
        );
        assert!(output.text().ends_with("AssertionError\n"));
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
            output: TestOutput::whole(b"SECRET_TOKEN=hunter2".to_vec()),
            sandbox_id: None,
        };
        let shown = format!("{failure:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
    }
}
