//! The two alert messages: a test failure (`test_failure.json.j2`) and a test run that could
//! not happen (`test_failure_error.json.j2`), built from plain data.
//!
//! Every piece of text that came from a push or a CI system (repository, branch, commit message,
//! names, command) is quoted data ([`Mrkdwn::quoted`]: one line in a code span, escaped, cut),
//! the failing lines sit in a code block they cannot close, and people Slack knows are mentions,
//! so no commit message or output can break the message, pass for Steward's words or ping a
//! channel.
use serde::Serialize;

use super::failures::{self, Bounds};
use super::{Person, TestFailure, TestRunError};
use crate::slack::format;
use crate::slack::render::{Message, MessageParams, Mrkdwn, RenderError, SAMPLE_TEXT, Templates};

/// A commit message's first line is cut to this many characters.
const COMMIT_MESSAGE_MAX_CHARS: usize = 150;
/// The command is cut to this many characters.
const COMMAND_MAX_CHARS: usize = 300;
/// The failing lines, once escaped, take at most this many characters of their section (3000),
/// leaving room for the heading and the code fence.
const FAILING_MAX_CHARS: usize = 2800;
/// Repository and branch names are cut to this many characters.
const NAME_MAX_CHARS: usize = 200;
/// The reason of an error alert is cut to this many characters.
const WHY_MAX_CHARS: usize = 1500;

/// `test_failure.json.j2`.
#[derive(Debug, Clone, Serialize)]
pub struct TestFailureParams {
    pub repository: Mrkdwn,
    pub branch: Mrkdwn,
    /// Letters and digits only: a commit id, shown in a code span or as a link's label.
    pub short_sha: String,
    /// Checked by [`super::commit_url`]: `http(s)` without characters that would end the link.
    pub commit_url: Option<String>,
    /// The first line of the head commit's message, quoted.
    pub commit_message: Option<Mrkdwn>,
    pub author: Option<Mrkdwn>,
    pub pusher: Option<Mrkdwn>,
    pub command: Mrkdwn,
    pub exit_code: i32,
    pub duration: Option<String>,
    /// The failing lines, ready for a code block.
    pub failing: String,
    /// Whether failing lines were left out.
    pub cut: bool,
    /// The size of the whole output (empty when there is none).
    pub output_size: Option<String>,
    /// What the file in the thread keeps of a longer output ("its first 1.0 MiB and its last
    /// 1.0 MiB"); `None` when it holds all of it.
    pub output_kept: Option<String>,
    pub sandbox_id: Option<String>,
}

impl MessageParams for TestFailureParams {
    const TEMPLATE: &'static str = "test_failure.json.j2";
}

/// `test_failure_error.json.j2`.
#[derive(Debug, Clone, Serialize)]
pub struct TestRunErrorParams {
    pub repository: Mrkdwn,
    pub branch: Mrkdwn,
    pub short_sha: String,
    pub commit_url: Option<String>,
    /// The step that failed, as a phrase: `Cloning the commit`.
    pub step: String,
    pub why: String,
    pub sandbox_id: Option<String>,
}

impl MessageParams for TestRunErrorParams {
    const TEMPLATE: &'static str = "test_failure_error.json.j2";
}

/// The first 7 characters of a commit id, as GitHub shows it. A commit id is hexadecimal; one
/// reported by another CI system may be anything, so only letters and digits are kept.
pub fn short_sha(sha: &str) -> String {
    sha.chars()
        .filter(char::is_ascii_alphanumeric)
        .take(7)
        .collect()
}

/// A person as the alert names them: a mention when Slack knows them, else their name (or
/// login, or e-mail) as quoted data: the push chose it, not Steward.
pub fn person(person: &Person) -> Option<Mrkdwn> {
    if let Some(user) = &person.slack_user {
        return Some(Mrkdwn::user(user));
    }
    [&person.name, &person.login, &person.email]
        .into_iter()
        .flatten()
        .map(|s| s.trim())
        .find(|s| !s.is_empty())
        .map(|s| Mrkdwn::quoted(s, NAME_MAX_CHARS))
}

/// The params of a test-failure alert.
pub fn test_failure_params(failure: &TestFailure) -> TestFailureParams {
    let output = failure.output.text();
    let picked = failures::failing_lines(&output, Bounds::default());
    let text = format::defuse_code_fence(&picked.text());
    let failing = format::cut(&text, FAILING_MAX_CHARS);
    let cut = picked.cut || failing != text;
    TestFailureParams {
        repository: Mrkdwn::quoted(&failure.repository, NAME_MAX_CHARS),
        branch: Mrkdwn::quoted(&failure.branch, NAME_MAX_CHARS),
        short_sha: short_sha(&failure.commit_sha),
        commit_url: failure
            .commit_url
            .as_deref()
            .and_then(|u| super::commit_url(u).ok()),
        commit_message: failure
            .commit_message
            .as_deref()
            .and_then(|m| m.lines().map(str::trim).find(|l| !l.is_empty()))
            .map(|line| Mrkdwn::quoted(line, COMMIT_MESSAGE_MAX_CHARS)),
        author: failure.author.as_ref().and_then(person),
        pusher: failure.pusher.as_ref().and_then(person),
        command: Mrkdwn::quoted(&failure.command, COMMAND_MAX_CHARS),
        exit_code: failure.exit_code,
        duration: failure.duration.map(format::human_duration),
        failing,
        cut,
        output_size: (!failure.output.is_empty())
            .then(|| format::human_bytes(failure.output.total())),
        output_kept: super::output_kept(&failure.output),
        sandbox_id: failure.sandbox_id.as_ref().map(|id| id.to_string()),
    }
}

/// The params of an error alert.
pub fn test_run_error_params(error: &TestRunError) -> TestRunErrorParams {
    TestRunErrorParams {
        repository: Mrkdwn::quoted(&error.repository, NAME_MAX_CHARS),
        branch: Mrkdwn::quoted(&error.branch, NAME_MAX_CHARS),
        short_sha: short_sha(&error.commit_sha),
        commit_url: error
            .commit_url
            .as_deref()
            .and_then(|u| super::commit_url(u).ok()),
        step: error.step.phrase().to_owned(),
        why: format::cut(error.why.trim(), WHY_MAX_CHARS),
        sandbox_id: error.sandbox_id.as_ref().map(|id| id.to_string()),
    }
}

/// The test-failure alert.
pub fn render_test_failure(
    templates: &Templates,
    failure: &TestFailure,
) -> Result<Message, RenderError> {
    templates.render(&test_failure_params(failure))
}

/// The error alert.
pub fn render_test_run_error(
    templates: &Templates,
    error: &TestRunError,
) -> Result<Message, RenderError> {
    templates.render(&test_run_error_params(error))
}

/// An alert made of sample text, with every optional part (`full`) or none.
pub(crate) fn sample_failure(full: bool) -> TestFailureParams {
    let s = || SAMPLE_TEXT.to_owned();
    let some = |text: String| full.then_some(text);
    let person = || full.then(|| Mrkdwn::text(SAMPLE_TEXT));
    let quoted = || Mrkdwn::quoted(SAMPLE_TEXT, NAME_MAX_CHARS);
    TestFailureParams {
        repository: quoted(),
        branch: quoted(),
        short_sha: s(),
        commit_url: some(s()),
        commit_message: full.then(quoted),
        author: person(),
        pusher: person(),
        command: quoted(),
        exit_code: 1,
        duration: some(s()),
        failing: s(),
        cut: full,
        output_size: some(s()),
        output_kept: some(s()),
        sandbox_id: some(s()),
    }
}

/// The start check of the two alerts' templates.
pub fn check_templates(templates: &Templates) -> Result<(), RenderError> {
    let s = || SAMPLE_TEXT.to_owned();
    for full in [true, false] {
        templates.render(&sample_failure(full))?;
        templates.render(&TestRunErrorParams {
            repository: Mrkdwn::quoted(SAMPLE_TEXT, NAME_MAX_CHARS),
            branch: Mrkdwn::quoted(SAMPLE_TEXT, NAME_MAX_CHARS),
            short_sha: s(),
            commit_url: full.then(s),
            step: s(),
            why: s(),
            sandbox_id: full.then(s),
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::alerts::{Step, TestOutput};
    use crate::ids::{SandboxId, SlackUserId};

    const OUTPUT: &str = "\
running 3 tests
test lexer::tests::numbers ... ok
test parser::tests::nested_lists ... FAILED
test parser::tests::empty_input ... ok

failures:

---- parser::tests::nested_lists stdout ----

thread 'parser::tests::nested_lists' panicked at src/parser.rs:212:9:
assertion `left == right` failed
  left: [Int(1), List([Int(2)])]
 right: [Int(1), List([Int(2), Int(3)])]


failures:
    parser::tests::nested_lists

test result: FAILED. 2 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.02s

error: test failed, to rerun pass `--lib`
";

    fn failure() -> TestFailure {
        TestFailure {
            repository: "acme/parser".into(),
            branch: "main".into(),
            commit_sha: "9f3c2a1b7e4d5c6a8b9f0e1d2c3b4a5f6e7d8c9b".into(),
            commit_url: Some(
                "https://github.com/acme/parser/commit/9f3c2a1b7e4d5c6a8b9f0e1d2c3b4a5f6e7d8c9b"
                    .into(),
            ),
            commit_message: Some(
                "Parse nested lists <fast> & right\n\nThe old parser recursed twice.".into(),
            ),
            pusher: Some(Person {
                name: Some("Dana Ops".into()),
                login: Some("dana".into()),
                email: None,
                slack_user: Some(SlackUserId::parse("U0DANA001").unwrap()),
            }),
            author: Some(Person {
                name: Some("Sam <@channel> Lee".into()),
                login: None,
                email: Some("sam@example.com".into()),
                slack_user: None,
            }),
            command: "cargo test --workspace".into(),
            exit_code: 101,
            duration: Some(Duration::from_secs(250)),
            output: TestOutput::whole(OUTPUT.as_bytes().to_vec()),
            sandbox_id: Some(SandboxId::parse("i7k2m9q4r1t8w3x6").unwrap()),
        }
    }

    #[test]
    fn test_failure_alert() {
        let message = render_test_failure(&Templates::embedded(), &failure()).unwrap();
        insta::assert_json_snapshot!("test_failure", message);
    }

    #[test]
    fn test_failure_alert_without_link_people_or_output() {
        let failure = TestFailure {
            commit_url: None,
            commit_message: None,
            pusher: None,
            author: None,
            duration: None,
            output: TestOutput::default(),
            sandbox_id: None,
            ..failure()
        };
        let message = render_test_failure(&Templates::embedded(), &failure).unwrap();
        insta::assert_json_snapshot!("test_failure_bare", message);
    }

    #[test]
    fn a_huge_output_is_cut_to_fit_and_says_so() {
        let mut output = String::new();
        for i in 0..3000 {
            output.push_str(&format!(
                "thread 't{i}' panicked at src/lib.rs:1:1: <&> ```\n"
            ));
        }
        let failure = TestFailure {
            output: TestOutput::whole(output.into_bytes()),
            ..failure()
        };
        let params = test_failure_params(&failure);
        assert!(params.cut);
        assert!(!params.failing.contains("```"));
        let message = render_test_failure(&Templates::embedded(), &failure).unwrap();
        let json = serde_json::to_string(&message).unwrap();
        assert!(json.contains("(cut to fit Slack)"));
    }

    #[test]
    fn user_text_cannot_ping_or_break_the_link() {
        let failure = TestFailure {
            commit_url: Some("https://evil.example/x|<!channel>".into()),
            ..failure()
        };
        let message = render_test_failure(&Templates::embedded(), &failure).unwrap();
        let json = serde_json::to_string(&message).unwrap();
        assert!(!json.contains("<@channel>"), "{json}");
        assert!(!json.contains("<!channel>"), "{json}");
        assert!(
            !json.contains("evil.example"),
            "a bad link is dropped: {json}"
        );
        assert!(json.contains("&lt;fast&gt; &amp; right"), "{json}");
    }

    #[test]
    fn error_alert() {
        let error = TestRunError {
            repository: "acme/parser".into(),
            branch: "main".into(),
            commit_sha: "9f3c2a1b7e4d5c6a8b9f0e1d2c3b4a5f6e7d8c9b".into(),
            commit_url: Some(
                "https://github.com/acme/parser/commit/9f3c2a1b7e4d5c6a8b9f0e1d2c3b4a5f6e7d8c9b"
                    .into(),
            ),
            step: Step::Clone,
            why: "git could not fetch 9f3c2a1 from https://github.com/acme/parser.git: repository not found".into(),
            sandbox_id: Some(SandboxId::parse("i7k2m9q4r1t8w3x6").unwrap()),
        };
        let message = render_test_run_error(&Templates::embedded(), &error).unwrap();
        let json = serde_json::to_string(&message).unwrap();
        assert!(!json.contains(":x:") && !json.to_lowercase().contains("tests failed"));
        insta::assert_json_snapshot!("test_run_error", message);
    }
}
