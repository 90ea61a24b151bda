//! The one `tracing` set-up every binary uses: level from `RUST_LOG` (default `info`), output
//! pretty for people (coloured only on a terminal) or JSON for log shippers, and, when an OTLP
//! endpoint is configured, the crate's spans exported through OpenTelemetry (`crate::otel`).

use std::io::IsTerminal as _;

use serde::{Deserialize, Serialize};
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer as _};

use crate::otel::Export;

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
    init_with(format, DEFAULT_FILTER, None);
}

/// Like [`init`], with `default_filter` when `RUST_LOG` is not set, and span export to
/// `export` when given. The log filter does not limit export: the crate's spans at INFO are
/// exported whatever the log level (a quiet demo still sends its traces).
pub fn init_with(format: LogFormat, default_filter: &str, export: Option<&Export>) {
    // Later calls change nothing; checked first so no exporter is built for a subscriber that
    // would never feed it.
    if tracing::dispatcher::has_been_set() {
        return;
    }
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    let fmt = match format {
        LogFormat::Pretty => fmt.compact().with_filter(filter).boxed(),
        LogFormat::Json => fmt.json().flatten_event(true).with_filter(filter).boxed(),
    };
    let otel = export.and_then(|export| match crate::otel::tracer(export) {
        Ok(tracer) => Some(tracer),
        Err(error) => {
            eprintln!("warning: trace export is off: {error}");
            None
        }
    });
    // Only this crate's spans: dependencies' spans would cost on every hot path and say little.
    let spans = Targets::new().with_target("aptix", LevelFilter::INFO);
    let otel = otel.map(|t| tracing_opentelemetry::layer().with_tracer(t).with_filter(spans));
    // An error here only means a subscriber is already installed.
    let _ = tracing_subscriber::registry().with(fmt).with(otel).try_init();
}
