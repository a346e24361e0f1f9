//! GitHub push tests, the intake half: a signed `push` webhook becomes a governed run that
//! clones the pushed commit in a fresh sandbox and runs the repository's test command.
//!
//! `signature` checks `X-Hub-Signature-256` against every configured secret (pure, constant
//! time); `event` reads the parts of a push payload we use; `rules` is the checked
//! `[[push_tests]]` configuration; `plan` decides what a push does (pure: run what, or why not)
//! and builds the run request; `queue` caps how many push tests run at once (the rest wait in
//! order); `intake` carries a decision out (audit, queue, submit, record).
//!
//! This module never posts to Slack and never imports `approvals`, `slack`, `cli` or `sim`:
//! what happens when a push-test run ends (alerts) is decided above it. The clone credential
//! (`GITHUB_TOKEN`) reaches the sandbox only as an environment value scrubbed from the run's
//! output; it is never in a command line, a record, the audit or a log.
pub mod app;
pub mod event;
pub mod intake;
pub mod plan;
pub mod queue;
pub mod rules;
pub mod signature;

pub use crate::store::PushTest;
pub use app::{AppError, GithubApp};
pub use event::{PushEvent, parse_push};
pub use intake::{IntakeError, Outcome, run_ended};
pub use plan::{CLONE_FAILED_EXIT_CODE, Decision, decide};
pub use rules::{GithubSettings, PushTestEntry, PushTestRule};
pub use signature::{SignatureError, verify};
