//! Fleet hygiene: find idle sandboxes and put each in front of a person with its evidence.
//!
//! `policy` is pure (idle rules, recommendations, cost); `config` is `[hygiene]` in
//! `steward.toml`; `sweep` does one pass over the fleet; `schedule` decides which replica runs
//! each scheduled pass. Nothing here kills anything: the sweep only opens approval cases.
pub mod config;
pub mod policy;

pub use config::{HygieneConfig, Schedule};
