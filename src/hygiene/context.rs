//! What one sweep pass runs with ([`SweepContext`]), whether it may write ([`SweepMode`]) and why it
//! could not run ([`SweepError`]). Shared by the pass, its Slack posts and the scheduler.
use std::sync::Arc;

use serde::Serialize;

use super::config::HygieneConfig;
use crate::e2b::{E2bClient, E2bError};
use crate::ids::{SlackChannelId, SlackUserId};
use crate::slack::client::SlackClient;
use crate::slack::render::Templates;
use crate::store::{Store, StoreError};

/// Candidate metric windows read at once across the whole pass.
pub const DEFAULT_WINDOW_CONCURRENCY: usize = 64;

/// Whether a pass may write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SweepMode {
    /// Judge and report; open nothing, post nothing.
    DryRun,
    /// Judge, post the digest, open cases.
    Live,
}

/// Why a pass could not be done. `Display` is a sentence for Slack or a terminal.
#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    #[error("the sandbox list could not be read from E2B: {0}")]
    Listing(#[source] E2bError),
    #[error("Steward's database could not be read: {0}")]
    Store(#[from] StoreError),
    #[error(
        "no hygiene channel is configured: set `channel` under [hygiene] or `hygiene` under [channels] in steward.toml"
    )]
    NoChannel,
    #[error("the digest could not be posted to Slack: {0}")]
    Digest(String),
    #[error("another sweep is running right now; try again when it has finished")]
    AlreadyRunning,
    #[error("the sweep lease was lost mid-sweep, so the sweep was stopped: {0}")]
    LeaseLost(String),
    #[error("judging a page of sandboxes failed: {0}")]
    Judge(String),
}

/// Explicit handles for one pass, so tests and the benchmark can build it without a server.
#[derive(Clone, Debug)]
pub struct SweepContext {
    pub e2b: E2bClient,
    pub store: Store,
    pub slack: SlackClient,
    pub templates: Arc<Templates>,
    pub config: Arc<HygieneConfig>,
    /// Where the digest and cases go (live passes need one).
    pub channel: Option<SlackChannelId>,
    /// Candidate windows read at once.
    pub window_concurrency: usize,
    /// The person who started this pass (`/sandbox sweep`), for the two-person rule on its
    /// list decision; `None` for a scheduled pass.
    pub requester: Option<SlackUserId>,
}

impl SweepContext {
    pub fn new(
        e2b: E2bClient,
        store: Store,
        slack: SlackClient,
        templates: Arc<Templates>,
        config: Arc<HygieneConfig>,
        channel: Option<SlackChannelId>,
    ) -> Self {
        Self {
            e2b,
            store,
            slack,
            templates,
            config,
            channel,
            window_concurrency: DEFAULT_WINDOW_CONCURRENCY,
            requester: None,
        }
    }
}
