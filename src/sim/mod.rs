//! Simulators that stand in for E2B and Slack over real HTTP on 127.0.0.1.
//!
//! Tests and benchmarks talk to these servers exactly as Steward talks to the
//! real services. They must never be used by production code paths.
pub mod e2b;
pub mod slack;
