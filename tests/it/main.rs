//! Steward's integration tests, one binary: every surface is a module here, so the crate is
//! linked once rather than once per file. Each test spawns what it needs on random ports
//! (the app, the E2B and Slack simulators) and uses its own Redis key prefix.
mod common;

mod agent_cases;
mod alerts;
mod api;
mod api_cases;
mod api_edge;
mod api_runs;
mod api_tenancy;
mod approvals;
mod cards;
mod claims;
mod cli_output;
mod demo;
mod e2b_cli;
mod e2b_client;
mod edge;
mod envd;
mod github;
mod healthcheck;
mod hygiene;
mod hygiene_slack;
mod layering;
mod list_cases;
mod mcp;
mod metrics;
mod no_side_door;
mod push_alerts;
mod recheck;
mod run_cases;
mod runs;
mod sim_e2b;
mod sim_envd;
mod sim_slack_socket;
mod sim_slack_web;
mod slack_commands;
mod slack_router;
mod slack_signature;
mod slack_sim;
mod socket_mode;
mod store_cluster;
mod store_redis_down;
mod store_suite;
