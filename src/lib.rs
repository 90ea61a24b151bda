//! Aptix Orchestrator: turns AGN-034 agent requests into OpenAI Responses API calls enriched with
//! retrieved source code, through a RabbitMQ-linked pipeline of stage workers, and answers with
//! AGN-033 responses.
//!
//! Modules and the direction they depend in are listed in `docs/architecture.md`; bottom up:
//! [`contracts`] (wire types and error codes), [`rules`] (AGN-034 rules), [`config`] (layered
//! settings), the pure cores, [`store`] and [`broker`], the [`stage`] framework and [`balance`]
//! (ingress partition shares), the [`stages`], [`pipeline`] (wiring), [`cli`] (the `aptix`
//! command).

/// Every binary and test allocates with mimalloc: under the ceiling load glibc's `malloc`,
/// `free` and their consolidation took about 17 % of the pipeline process's CPU
/// (docs/benchmarks.md, "Profile of a turn").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

pub mod approvals;
pub mod assemble;
pub mod balance;
pub mod broker;
pub mod budgets;
pub mod chunk;
pub mod cli;
pub mod config;
pub mod console;
pub mod contracts;
pub mod dead;
pub mod eval;
pub mod files;
pub mod held;
pub mod http;
pub mod index;
pub mod lifecycle;
pub mod llm;
pub mod mcp;
pub mod messages;
pub mod metrics;
pub mod otel;
pub mod pipeline;
pub mod redeliver;
pub mod reprocess;
pub mod retrieve;
pub mod rules;
pub mod schema;
pub mod sim;
pub mod stage;
pub mod stages;
pub mod store;
pub mod telemetry;
pub mod worker;
