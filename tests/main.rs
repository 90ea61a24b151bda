//! The integration tests as one binary (cargo's own `tests/testsuite` pattern): one link for
//! all of them instead of one per file, the shared support compiled once, each area a module
//! (`cargo test --test testsuite -- tenancy::` runs one). Four files that change or measure the
//! process itself (environment variables, the process-wide metrics, the global trace subscriber)
//! stay binaries of their own: `config`, `metrics`, `otlp` and `work_per_turn`.
#![allow(clippy::unwrap_used)]

mod assemble_support;
mod common;
mod retrieve_support;
mod sim_support;
mod store_support;
mod tenant_support;

mod admission_race;
mod approvals;
mod architecture;
mod assemble_context;
mod assemble_requests;
mod bad_input;
mod broker_cut;
mod broker_permissions;
mod budget;
mod call_claims;
mod cancel;
mod chaos;
mod cli;
mod client_queues;
mod cluster;
mod console;
mod contracts;
mod database_failures;
mod dead;
mod demo;
mod deploy;
mod error_classes;
mod eval;
mod finish_race;
mod follow_up;
mod fuzz_validate;
mod hardening;
mod hostile;
mod index_tree;
mod instance_replies;
mod listeners;
mod llm;
mod llm_compat;
mod mcp_tools;
mod modes;
mod ordered_retry;
mod outbox_sweep;
mod partition_handover;
mod partitions;
mod pipeline;
mod pipeline_kill;
mod protocol;
mod publisher;
mod quorum;
mod read_back_bounds;
mod readme;
mod reprocess;
mod rerank;
mod resume;
mod retrieve_embedded;
mod retrieve_eval;
mod retrieve_lock;
mod retrieve_server;
mod schemas;
mod server_tools;
mod session_model;
mod sim;
mod sim_throughput;
mod stage_partitions;
mod status;
mod steer;
mod stored_formats;
mod stored_json;
mod stored_queries;
mod streaming;
mod tenancy;
mod validation;
