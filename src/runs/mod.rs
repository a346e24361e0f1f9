//! Governed runs: an agent's code run in a fresh sandbox through envd, its results recorded and
//! returned at once, and the sandbox's fate left to a person (a run case).
//!
//! `model` holds the pure types: what may be asked ([`RunRequest`], checked by
//! [`RunRequest::validate`] against [`RunLimits`]), what a run is ([`Run`], [`RunStatus`]) and the
//! `[runs]` policy ([`RunPolicy`]). `service` is the [`Runner`] callers use (submit, get, wait,
//! output); `engine` is the [`RunEngine`] the queue worker runs each `Job::Run` with; `record`
//! keeps a run's record in the store by compare-and-swap.
//!
//! This module never posts to Slack and never imports `approvals`, `http`, `slack` or `cli`:
//! the hand-over of a finished run's sandbox to a run case is a function startup passes in.
pub mod engine;
pub mod model;
mod record;
pub mod service;

pub use engine::{HandOver, HandOverError, HandOverRequest, RunEngine};
pub use model::{
    FileSpec, OnFinish, Run, RunInputError, RunLimits, RunPhase, RunPolicy, RunProcess, RunRequest,
    RunStatus, SCRUBBED, Scrubber, SetupStep, ValidRun,
};
pub use service::{OutputChunk, RunError, Runner};
