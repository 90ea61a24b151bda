//! Trace export through the OpenTelemetry SDK: every `tracing` span of the `aptix` crate becomes
//! an OpenTelemetry span (`tracing-opentelemetry`), batched by the SDK and sent as OTLP/HTTP
//! protobuf (`opentelemetry-otlp`) to any collector, Jaeger or Tempo
//! (`telemetry.otlp_endpoint`, usually `http://collector:4318/v1/traces`).
//!
//! A turn is one trace across processes: each stage's span takes the `traceparent` of the
//! message it handles as its parent (`broker::trace`), and what it publishes carries its own
//! span id. The SDK's batch processor runs on its own thread; when its queue is full, or the
//! collector is down, spans are dropped rather than slowing the pipeline. Off unless the
//! endpoint is set.

use std::sync::OnceLock;
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{Protocol, WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::trace::{SdkTracerProvider, Tracer};
use opentelemetry_sdk::Resource;

/// Where and as whom spans are exported.
#[derive(Debug, Clone)]
pub struct Export {
    /// The OTLP/HTTP traces URL.
    pub endpoint: String,
    /// `service.name` of this process (`aptix`, `aptix-invoke`, ...).
    pub service: String,
}

static PROVIDER: OnceLock<SdkTracerProvider> = OnceLock::new();

/// Builds the exporting tracer provider for `export` and returns its tracer. Only the first
/// call in a process keeps its provider (the global subscriber is set once, too).
pub fn tracer(export: &Export) -> Result<Tracer, ExportError> {
    if let Some(provider) = PROVIDER.get() {
        return Ok(provider.tracer("aptix"));
    }
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(export.endpoint.as_str())
        .with_timeout(Duration::from_secs(5))
        .with_http_client(Http::new()?)
        .build()?;
    let resource = Resource::builder().with_service_name(export.service.clone()).build();
    let provider =
        SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource).build();
    let tracer = provider.tracer("aptix");
    let _ = PROVIDER.set(provider);
    Ok(tracer)
}

/// Why trace export cannot be set up.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// The exporter refused its settings.
    #[error("the OTLP exporter: {0}")]
    Exporter(#[from] opentelemetry_otlp::ExporterBuildError),
    /// The HTTP client could not be built.
    #[error("the OTLP HTTP client: {0}")]
    Client(reqwest::Error),
    /// Building it panicked.
    #[error("the OTLP HTTP client could not be built")]
    ClientPanicked,
}

/// Whether spans are exported (callers skip work that only export needs).
pub fn enabled() -> bool {
    PROVIDER.get().is_some()
}

/// Sends every finished span now and waits for the collector (at shutdown, and in tests).
pub async fn flush() {
    let Some(provider) = PROVIDER.get() else { return };
    // force_flush blocks until the batch thread has exported.
    let provider = provider.clone();
    let flushed = tokio::task::spawn_blocking(move || provider.force_flush()).await;
    if let Ok(Err(error)) = flushed {
        tracing::warn!(%error, "otlp flush failed, spans may be lost");
    }
}

/// The exporter's HTTP client: this crate's reqwest, blocking, because the SDK's batch thread
/// runs outside any tokio runtime.
#[derive(Debug)]
struct Http(reqwest::blocking::Client);

impl Http {
    fn new() -> Result<Http, ExportError> {
        // reqwest's blocking client owns a runtime, which must not be built inside another.
        std::thread::spawn(|| {
            crate::http::blocking()
                .connect_timeout(Duration::from_secs(2))
                .timeout(Duration::from_secs(5))
                .build()
                .map(Http)
                .map_err(ExportError::Client)
        })
        .join()
        .map_err(|_| ExportError::ClientPanicked)?
    }
}

#[async_trait::async_trait]
impl HttpClient for Http {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let (parts, body) = request.into_parts();
        let response = self
            .0
            .request(parts.method, parts.uri.to_string())
            .headers(parts.headers)
            .body(body.to_vec())
            .send()?;
        let mut out = Response::builder().status(response.status());
        for (name, value) in response.headers() {
            out = out.header(name, value);
        }
        Ok(out.body(response.bytes()?)?)
    }
}
