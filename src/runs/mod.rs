//! Governed runs: an agent's code run in a fresh sandbox through envd, its results recorded and
//! returned at once, and the sandbox's fate left to a person (a run case).
//!
//! `model` holds the pure types: what may be asked ([`RunRequest`], checked by
//! [`RunRequest::validate`] against [`RunLimits`]), what a run is ([`Run`], [`RunStatus`]) and the
//! `[runs]` policy ([`RunPolicy`]).
pub mod model;

pub use model::{
    FileSpec, OnFinish, Run, RunInputError, RunLimits, RunPolicy, RunRequest, RunStatus, ValidRun,
};
