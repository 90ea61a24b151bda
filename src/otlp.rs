//! Optional OTLP trace export: each message a stage settles becomes one span, sent in batches
//! as OTLP/HTTP JSON (`POST <endpoint>`, usually `http://collector:4318/v1/traces`) to any
//! OpenTelemetry collector, Jaeger or Tempo.
//!
//! A stage span's parent is the span of the hop that published the message (its id travels in
//! the message's `traceparent`, see `broker::trace`), so a turn is one trace: client (when it
//! sent a `traceparent`) → validate → retrieve → assemble → invoke → persist.
//!
//! Export never slows the pipeline: spans go through a bounded channel to one background task;
//! when the channel is full, or the collector is down, spans are dropped and counted in a log
//! line. Off unless `telemetry.otlp_endpoint` is set.

use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, warn};

/// One finished span.
#[derive(Debug, Clone)]
pub struct SpanRecord {
    /// 32 hex digits.
    pub trace_id: String,
    /// 16 hex digits.
    pub span_id: String,
    /// The publishing hop's span, if known.
    pub parent_span_id: Option<String>,
    /// Span name (the stage).
    pub name: String,
    /// Start and end.
    pub start: SystemTime,
    /// End.
    pub end: SystemTime,
    /// Whether the message's handling failed (publish failed, dead-lettered, retried).
    pub error: Option<String>,
    /// String attributes (`aptix.session_id`, `aptix.turn_id`, `aptix.outcome`, ...).
    pub attributes: Vec<(&'static str, String)>,
}

enum Command {
    Span(Box<SpanRecord>),
    Flush(oneshot::Sender<()>),
}

/// The exporter's handle.
#[derive(Debug)]
struct Exporter {
    tx: mpsc::Sender<Command>,
}

static EXPORTER: OnceLock<Exporter> = OnceLock::new();

/// Spans waiting for export at most; more are dropped rather than queued without bound.
const QUEUE: usize = 8192;
/// Spans per request at most.
const BATCH: usize = 512;
/// Longest a span waits for its batch.
const LINGER: Duration = Duration::from_secs(1);

/// Starts exporting to `endpoint` (must run inside a tokio runtime). Only the first call in a
/// process takes effect. `service` names the process (`service.name`).
pub fn install(endpoint: &str, service: &str) -> Result<(), reqwest::Error> {
    if EXPORTER.get().is_some() {
        return Ok(());
    }
    // Timeouts live here so a hung collector cannot hold batches forever.
    let client = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(5))
        .build()?;
    let (tx, rx) = mpsc::channel(QUEUE);
    if EXPORTER.set(Exporter { tx }).is_ok() {
        tokio::spawn(run(client, endpoint.to_owned(), service.to_owned(), rx));
    }
    Ok(())
}

/// Whether spans are being exported (callers skip building them otherwise).
pub fn enabled() -> bool {
    EXPORTER.get().is_some()
}

/// Hands a finished span to the exporter; dropped when export is off or its queue is full.
pub fn record(span: SpanRecord) {
    if let Some(e) = EXPORTER.get() {
        if e.tx.try_send(Command::Span(Box::new(span))).is_err() {
            debug!("otlp queue full, span dropped");
        }
    }
}

/// Sends what is queued now and waits for it (at shutdown, and in tests).
pub async fn flush() {
    let Some(e) = EXPORTER.get() else { return };
    let (done, wait) = oneshot::channel();
    if e.tx.send(Command::Flush(done)).await.is_ok() {
        let _ = tokio::time::timeout(Duration::from_secs(10), wait).await;
    }
}

async fn run(
    client: reqwest::Client,
    endpoint: String,
    service: String,
    mut rx: mpsc::Receiver<Command>,
) {
    let mut batch: Vec<SpanRecord> = Vec::new();
    let mut dropped = 0usize;
    loop {
        let next = if batch.is_empty() {
            rx.recv().await
        } else {
            match tokio::time::timeout(LINGER, rx.recv()).await {
                Ok(next) => next,
                Err(_) => {
                    dropped += send(&client, &endpoint, &service, std::mem::take(&mut batch)).await;
                    continue;
                }
            }
        };
        match next {
            Some(Command::Span(span)) => {
                batch.push(*span);
                if batch.len() >= BATCH {
                    dropped += send(&client, &endpoint, &service, std::mem::take(&mut batch)).await;
                }
            }
            Some(Command::Flush(done)) => {
                dropped += send(&client, &endpoint, &service, std::mem::take(&mut batch)).await;
                let _ = done.send(());
            }
            None => {
                send(&client, &endpoint, &service, batch).await;
                return;
            }
        }
        if dropped > 0 {
            warn!(dropped, endpoint = %crate::config::redact_url(&endpoint), "otlp export failed, spans dropped");
            dropped = 0;
        }
    }
}

/// Posts one batch; returns how many spans were lost.
async fn send(
    client: &reqwest::Client,
    endpoint: &str,
    service: &str,
    batch: Vec<SpanRecord>,
) -> usize {
    if batch.is_empty() {
        return 0;
    }
    let body = encode(service, &batch);
    match client.post(endpoint).json(&body).send().await.map(|r| r.error_for_status()) {
        Ok(Ok(_)) => 0,
        Ok(Err(error)) | Err(error) => {
            debug!(error = %error.without_url(), "otlp export request failed");
            batch.len()
        }
    }
}

fn nanos(t: SystemTime) -> String {
    t.duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos().to_string()
}

fn attribute(key: &str, value: &str) -> Value {
    json!({"key": key, "value": {"stringValue": value}})
}

/// The OTLP/HTTP JSON body (`ExportTraceServiceRequest`) for `spans`.
pub fn encode(service: &str, spans: &[SpanRecord]) -> Value {
    let spans: Vec<Value> = spans
        .iter()
        .map(|s| {
            let mut span = json!({
                "traceId": s.trace_id,
                "spanId": s.span_id,
                "name": s.name,
                // SPAN_KIND_CONSUMER: handling a message taken from a queue.
                "kind": 5,
                "startTimeUnixNano": nanos(s.start),
                "endTimeUnixNano": nanos(s.end),
                "attributes": s.attributes.iter().map(|(k, v)| attribute(k, v)).collect::<Vec<_>>(),
                // STATUS_CODE_OK = 1, STATUS_CODE_ERROR = 2.
                "status": match &s.error {
                    None => json!({"code": 1}),
                    Some(message) => json!({"code": 2, "message": message}),
                },
            });
            if let Some(parent) = &s.parent_span_id {
                span["parentSpanId"] = json!(parent);
            }
            span
        })
        .collect();
    json!({"resourceSpans": [{
        "resource": {"attributes": [attribute("service.name", service)]},
        "scopeSpans": [{"scope": {"name": "aptix", "version": env!("CARGO_PKG_VERSION")}, "spans": spans}],
    }]})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_ids_as_hex_and_times_as_decimal_strings() {
        let start = UNIX_EPOCH + Duration::from_nanos(1_700_000_000_123_456_789);
        let span = SpanRecord {
            trace_id: "4bf92f3577b34da6a3ce929d0e0e4736".into(),
            span_id: "00f067aa0ba902b7".into(),
            parent_span_id: None,
            name: "validate".into(),
            start,
            end: start + Duration::from_millis(3),
            error: Some("dead-lettered".into()),
            attributes: vec![("aptix.turn_id", "t1".into())],
        };
        let body = encode("aptix-validate", &[span]);
        let s = &body["resourceSpans"][0]["scopeSpans"][0]["spans"][0];
        assert_eq!(s["traceId"], "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(s["startTimeUnixNano"], "1700000000123456789");
        assert_eq!(s["endTimeUnixNano"], "1700000000126456789");
        assert_eq!(s["status"]["code"], 2);
        assert!(s.get("parentSpanId").is_none());
        assert_eq!(s["attributes"][0]["value"]["stringValue"], "t1");
        assert_eq!(
            body["resourceSpans"][0]["resource"]["attributes"][0]["value"]["stringValue"],
            "aptix-validate"
        );
    }
}
