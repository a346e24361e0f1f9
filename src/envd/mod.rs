//! The typed client for envd, the agent inside each E2B sandbox (the data plane): start a process
//! (or re-attach to a running one) and read its output as typed events, signal it, and move files
//! in and out.
//!
//! `connect` decodes Connect's streaming envelope (pure, bounded); `version` reads the envd
//! version E2B announces and what it decides (pure); `client` addresses one sandbox and speaks
//! HTTP; `error` is the one error enum of this boundary. This module must not decide
//! policy (who may run what), must not touch Redis, Slack or the control-plane client, and must
//! never log, print or return the sandbox's access token.
pub mod client;
pub mod connect;
pub mod error;
pub mod version;

pub use client::{
    DEFAULT_DOMAIN, ENVD_PORT, EnvdAddress, EnvdClient, FileEntry, ProcessEnd, ProcessEvent,
    ProcessSpec, ProcessStream, Signal,
};
pub use error::EnvdError;
pub use version::EnvdVersion;
