//! Fleet hygiene: find idle sandboxes and put each in front of a person with its evidence.
//!
//! `policy` is pure (idle rules, recommendations, cost); `config` is `[hygiene]` in
//! `steward.toml`; `sweep` does one pass over the fleet and `post` is its live half (digest and
//! cases); `groups` is the idle list by owner and recommendation (pure); `list` opens a long idle list as one list decision; `command` answers `/sandbox sweep`; `digest` holds the messages' params; `schedule` decides which replica runs each
//! scheduled pass. Nothing here kills anything: the sweep only
//! opens approval cases.
pub mod command;
pub mod config;
pub mod context;
pub mod digest;
pub mod groups;
pub mod list;
mod listing;
pub mod policy;
pub mod post;
pub mod report;
pub mod schedule;
pub mod sweep;

pub use config::{HygieneConfig, Schedule, WhenNothingNew};
pub use context::{SweepContext, SweepError, SweepMode};
pub use report::SweepReport;
pub use schedule::{
    LoopEvent, Scheduler, Tick, run_scheduler, run_scheduler_observed, scheduler_tick, sweep_now,
};
pub use sweep::sweep_once;
