//! Sandbox Steward puts a human in the loop of an E2B sandbox fleet.
//!
//! Agents create E2B sandboxes all day; Steward lets people see and operate that fleet from
//! Slack, and makes sure nothing irreversible (kill, delete template) happens without a
//! recorded human decision.
//!
//! # Layout
//! - [`cli`]: the `steward` command line (serve, sim, e2b, audit, ...).
//! - [`config`]: one `Settings` tree from the environment and `steward.toml`.
//! - [`telemetry`]: tracing subscriber setup.
//! - [`metrics`]: every Prometheus series, named once, with one function per event.
//! - [`ids`]: typed identifiers with parse constructors.
//! - [`startup`]: `Application::build` binds the server and runs it with its workers.
//! - [`http`]: the one route table and the HTTP error type.
//! - [`slack`]: request signatures, payloads, the Web API client, message templates.
//! - [`e2b`]: the typed client for E2B's control-plane API.
//! - [`envd`]: the typed client for envd, the agent inside a sandbox (run processes, move files).
//! - [`alerts`]: test-failure alerts (the failing lines, the message, the output in its thread).
//! - [`approvals`]: opening cases, deciding on clicks, the decision worker, expiry, audit.
//! - [`cases`]: the approval-case state machine (pure, no I/O).
//! - [`store`]: the only module that knows Redis keys and scripts.
//! - [`hygiene`]: idle detection (pure policy) and the fleet sweep.
//! - [`jobs`]: the durable work queue and its workers.
//! - [`mcp`]: the MCP tools agents use, over stdio (a client of the HTTP API) or `/mcp`.
//! - [`github`]: GitHub push webhooks become push-test runs (signature, plan, intake).
//! - [`runs`]: governed runs (an agent's code in a fresh sandbox, then a run case).
//! - [`sim`]: the E2B and Slack simulators used by tests, benchmarks and demos.
//! - [`demo`]: `steward demo`, the simulators and Steward in one process.
pub mod alerts;
pub mod approvals;
pub mod cases;
pub mod cli;
pub mod config;
pub mod demo;
pub mod duration;
pub mod e2b;
pub mod envd;
pub mod execute;
pub mod github;
pub mod http;
pub mod hygiene;
pub mod ids;
pub mod jobs;
pub mod lifecycle;
pub mod mcp;
pub mod metrics;
pub mod runs;
pub mod sim;
pub mod slack;
pub mod startup;
pub mod store;
pub mod telemetry;
pub mod watch;
