//! The typed client for E2B's control-plane API (`https://api.e2b.app`).
//!
//! [`E2bClient`] has one method per action in `shared/notes/e2b-api.md` §2, returns the types in
//! [`model`], fails with [`E2bError`], retries only where a replay cannot do harm ([`retry`]),
//! and pages under a guard that always terminates ([`paging`]).
//!
//! This module talks HTTP to E2B and nothing else: it must not decide who may do what, touch
//! Redis or Slack, and it must never reveal the API key.
mod client;
mod error;
mod events;
pub use events::{MAX_EVENTS_PAGE, Webhook};
mod metrics;
pub mod model;
pub mod paging;
pub mod retry;
mod sandboxes;
mod settings;
mod snapshots;
pub use settings::{DEFAULT_E2B_REQUEST_TIMEOUT_SECS, E2bSettings};

pub use client::{E2bClient, MAX_PAGE_LIMIT};
pub use error::E2bError;
pub use metrics::{DEFAULT_METRICS_CONCURRENCY, METRICS_BATCH_MAX_IDS};
pub use model::*;
pub use paging::{DEFAULT_MAX_PAGES, Listing, Page, PagingStop};
pub use retry::RetryPolicy;
