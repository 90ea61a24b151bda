//! The one `tracing` set-up every binary uses: level from `RUST_LOG` (default `info`), output
//! pretty for people (coloured only on a terminal) or JSON for log shippers.

use std::io::IsTerminal as _;

use serde::{Deserialize, Serialize};
use tracing_subscriber::EnvFilter;

/// Log output format.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable, one event per line.
    #[default]
    Pretty,
    /// One JSON object per event.
    Json,
}

/// The filter without `RUST_LOG`. qdrant-edge logs internal start-up chatter at WARN; only its
/// errors matter to an operator.
pub const DEFAULT_FILTER: &str = "info,qdrant_edge=error";

/// Installs the global subscriber. Safe to call more than once: later calls do nothing, so
/// tests and embedded runs can call it freely.
pub fn init(format: LogFormat) {
    init_with(format, DEFAULT_FILTER);
}

/// Like [`init`], with `default_filter` when `RUST_LOG` is not set.
pub fn init_with(format: LogFormat, default_filter: &str) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    // An error here only means a subscriber is already installed.
    let _ = match format {
        LogFormat::Pretty => builder.compact().try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}
