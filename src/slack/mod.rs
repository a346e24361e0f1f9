//! Everything Slack-shaped: request signatures, payload types, the Web API client, the
//! `/sandbox` command language, the Block Kit message templates and the Socket Mode client.
//!
//! This module knows Slack's wire formats; it must not know HTTP routing (that is `http/`)
//! nor E2B's wire formats (that is `e2b/`).
pub mod client;
pub mod command;
pub mod form;
pub mod format;
pub mod limits;
pub mod payload;
pub mod render;
mod settings;
pub mod signature;
pub mod socket;
pub use settings::SlackSettings;
