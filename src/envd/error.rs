//! `EnvdError`: every way a call to envd can fail, worded for the person who has to act on it.
//! No variant holds the access token, and server bodies are cut short before they are kept.
use super::connect::FrameError;
use crate::ids::SandboxId;

/// Longest piece of a server's error body kept in an error.
pub const MAX_ERROR_BODY_CHARS: usize = 300;

#[derive(Debug, thiserror::Error)]
pub enum EnvdError {
    /// E2B's proxy answers 502 when the sandbox no longer exists or is paused (without auto-resume).
    #[error(
        "sandbox {sandbox_id} cannot be reached: E2B's proxy says it is gone or paused (HTTP 502), so it was killed, timed out or is paused; resume it or start a new sandbox"
    )]
    SandboxUnavailable { sandbox_id: SandboxId },
    #[error("envd in sandbox {sandbox_id} refused the access token for {call} (HTTP {status})")]
    AccessDenied {
        sandbox_id: SandboxId,
        call: &'static str,
        status: u16,
    },
    #[error("envd answered HTTP {status} to {call}: {message}")]
    Status {
        call: &'static str,
        status: u16,
        message: String,
    },
    #[error("envd ended {call} with error {code}: {message}")]
    Rpc {
        call: &'static str,
        code: String,
        message: String,
    },
    #[error("could not reach envd for {call}: {source}")]
    Transport {
        call: &'static str,
        #[source]
        source: reqwest::Error,
    },
    #[error("envd's stream for {call} is malformed: {source}")]
    Frame {
        call: &'static str,
        #[source]
        source: FrameError,
    },
    #[error("envd sent a {call} message that cannot be read: {reason}")]
    Decode { call: &'static str, reason: String },
    #[error("envd's stream for {call} stopped before its end-of-stream frame")]
    StreamCut { call: &'static str },
    #[error("envd's answer to {call} is larger than the {cap}-byte cap")]
    TooLarge { call: &'static str, cap: usize },
    #[error("the envd address is not valid: {0}")]
    Address(String),
}

/// Keeps the start of a server body for an error sentence.
pub(super) fn snippet(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    if text.is_empty() {
        return "(empty body)".to_owned();
    }
    let mut cut: String = text.chars().take(MAX_ERROR_BODY_CHARS).collect();
    if cut.len() < text.len() {
        cut.push('…');
    }
    cut
}
