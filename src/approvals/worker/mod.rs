//! The E2B side of a decision, run by every replica: the job handler ([`handler`]), the expiry
//! pass that closes cases nobody decided ([`expiry`]), the reconcile pass that re-queues decided
//! work whose job was lost ([`reconcile`]), the pass that accounts for every sandbox Steward
//! created for a run ([`orphans`]), and the loops that startup spawns ([`loops`]).
//!
//! Nothing here decides who may do what: it only runs what the store says was decided.
pub mod expiry;
pub mod handler;
pub mod loops;
pub mod orphans;
pub mod reconcile;
pub mod restore;

pub use expiry::expire_once;
pub use handler::{execute_case, handle_job, snapshot_name};
pub use loops::{LoopSettings, run_expiry, run_worker};
pub use reconcile::{RECONCILE_GRACE, TRANSIENT_RETRY_WAIT, reconcile_once};
