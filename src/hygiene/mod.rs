//! Fleet hygiene: find idle sandboxes and put each in front of a person with its evidence.
//!
//! `policy` is pure (idle rules, recommendations, cost). Nothing here kills anything: the sweep
//! only opens approval cases.
pub mod policy;
