//! W3C trace context across processes: every message of a turn carries a `traceparent` header
//! with the turn's trace id, and every stage handles a message inside a span that names it, so
//! one turn is one trace in the logs of all workers.
//!
//! A client's own `traceparent` on the request is kept for the turn's messages. Otherwise, and
//! for turns dispatched later from the database, the trace id is derived from
//! `(SessionId, TurnId)`, so every process computes the same one without coordination.
//!
//! Each settled message is a `tracing` span ([`hop_span`]); the `traceparent` of what it
//! publishes carries that span's id, so the next stage's span is its child. Spans are exported
//! through OpenTelemetry when export is on (`crate::otel`).

use opentelemetry::propagation::TextMapPropagator as _;
use opentelemetry::trace::{
    SpanContext, SpanId, TraceContextExt as _, TraceFlags, TraceId, TraceState,
};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use sha2::{Digest, Sha256};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use super::{Delivery, OutMessage};
use crate::contracts::headers;

/// The trace id (32 hex digits) for a turn without a client-supplied one.
pub fn derived_trace_id(session: &str, turn: &str) -> String {
    let digest = Sha256::digest(format!("{session}/{turn}").as_bytes());
    hex::encode(&digest[..16])
}

/// The trace id of a `traceparent` header (`00-<trace-id>-<span-id>-<flags>`), if it is
/// well-formed by W3C's rules (lowercase hex, neither id all zeros), as the propagator reads it.
pub fn parse_trace_id(traceparent: &str) -> Option<&str> {
    let parts: Vec<&str> = traceparent.split('-').collect();
    let [version, trace, span, flags] = parts[..] else { return None };
    let hex = |s: &str, n: usize| {
        s.len() == n && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    };
    let nonzero = |s: &str| s.bytes().any(|b| b != b'0');
    let ok = version == "00" && hex(trace, 32) && hex(span, 16) && hex(flags, 2);
    (ok && nonzero(trace) && nonzero(span)).then_some(trace)
}

/// The trace flags (two hex digits) of a well-formed `traceparent`.
fn parse_flags(traceparent: &str) -> Option<&str> {
    parse_trace_id(traceparent)?;
    traceparent.split('-').nth(3)
}

fn turn_of(headers: &std::collections::BTreeMap<String, String>) -> Option<(&str, &str)> {
    Some((headers.get(headers::SESSION_ID)?.as_str(), headers.get(headers::TURN_ID)?.as_str()))
}

/// The trace id a delivery belongs to.
pub fn trace_id_of(d: &Delivery) -> Option<String> {
    if let Some(id) = d.headers.get("traceparent").and_then(|t| parse_trace_id(t)) {
        return Some(id.to_owned());
    }
    if let Some((s, t)) = turn_of(&d.headers) {
        return Some(derived_trace_id(s, t));
    }
    let (session, turn) = d.hint.pair()?;
    Some(derived_trace_id(session, turn))
}

/// The span id (16 hex digits) of a well-formed `traceparent`.
pub fn parse_span_id(traceparent: &str) -> Option<&str> {
    parse_trace_id(traceparent)?;
    traceparent.split('-').nth(2)
}

/// A fresh span id, for hops whose span is not exported.
pub fn new_span_id() -> String {
    hex::encode(&uuid::Uuid::new_v4().as_bytes()[..8])
}

/// The span id standing for a turn's start when its request came without a `traceparent`: the
/// parent of its first stage's span, so every process builds the same one.
pub fn derived_span_id(session: &str, turn: &str) -> String {
    let digest = Sha256::digest(format!("{session}/{turn}").as_bytes());
    hex::encode(&digest[16..24])
}

/// The span of `stage` settling `d` of trace `trace` ([`trace_id_of`]), not yet entered. With
/// export on, its OpenTelemetry parent is the span that published `d` (its `traceparent`, read
/// by the W3C propagator), else the turn's derived start.
pub fn hop_span(stage: &str, d: &Delivery, trace: Option<&str>) -> tracing::Span {
    let trace_id = trace.unwrap_or("-");
    if !crate::otel::enabled() {
        return tracing::info_span!("stage", stage, trace_id);
    }
    let span =
        tracing::info_span!("stage", otel.name = stage, otel.kind = "consumer", stage, trace_id);
    let _ = span.set_parent(parent_of(d, trace));
    // The hint is the headers' turn when they name one (the runtime reads them first).
    let (session, turn) = (d.hint.session.as_deref(), d.hint.turn.as_deref());
    span.set_attribute("messaging.system", "rabbitmq");
    span.set_attribute("messaging.operation.type", "process");
    let text = [
        ("messaging.message.id", d.message_id.as_deref()),
        ("aptix.session_id", session),
        ("aptix.turn_id", turn),
    ];
    for (key, value) in text {
        if let Some(value) = value {
            span.set_attribute(key, value.to_owned());
        }
    }
    span
}

/// The parent context of a hop: the message's own `traceparent` (and `tracestate`), else a
/// remote span standing for the turn's start; empty (a new trace) when the turn is unknown.
fn parent_of(d: &Delivery, trace: Option<&str>) -> opentelemetry::Context {
    let cx = TraceContextPropagator::new().extract(&Headers(&d.headers));
    if cx.span().span_context().is_valid() {
        return cx;
    }
    let (Some(trace), Some((session, turn))) = (trace, d.hint.pair()) else {
        return opentelemetry::Context::new();
    };
    let ids =
        TraceId::from_hex(trace).ok().zip(SpanId::from_hex(&derived_span_id(session, turn)).ok());
    let Some((trace, span)) = ids else { return opentelemetry::Context::new() };
    let remote = SpanContext::new(trace, span, TraceFlags::SAMPLED, true, TraceState::NONE);
    opentelemetry::Context::new().with_remote_span_context(remote)
}

/// A delivery's headers as the propagator reads them.
struct Headers<'a>(&'a std::collections::BTreeMap<String, String>);

impl opentelemetry::propagation::Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }
    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(String::as_str).collect()
    }
}

/// What a hop's outgoing messages name as their parent.
#[derive(Debug, Clone)]
pub struct Parent {
    /// The hop's span id.
    pub span_id: String,
    /// The hop's trace: the exported span's when export is on, else the delivery's.
    pub trace_id: Option<String>,
    /// Trace flags to pass on: the sampling decision made for this trace.
    pub flags: String,
}

/// The parent that what `span`, handling `d` of trace `trace`, publishes names: the exported
/// span's ids and sampling decision, or with export off a fresh span id, `trace` and the
/// incoming flags.
pub fn parent_ids(span: &tracing::Span, d: &Delivery, trace: Option<String>) -> Parent {
    if crate::otel::enabled() {
        let cx = span.context();
        let context = cx.span().span_context().clone();
        if context.is_valid() {
            return Parent {
                span_id: context.span_id().to_string(),
                trace_id: Some(context.trace_id().to_string()),
                flags: format!("{:02x}", context.trace_flags().to_u8()),
            };
        }
    }
    let flags = d.headers.get("traceparent").and_then(|t| parse_flags(t)).unwrap_or("01");
    Parent { span_id: new_span_id(), trace_id: trace, flags: flags.to_owned() }
}

/// Ends a hop's span with the message's outcome: an error status when its handling failed or
/// it was dead-lettered.
pub fn finish(span: &tracing::Span, outcome: &str, error: Option<String>) {
    if !crate::otel::enabled() {
        return;
    }
    span.set_attribute("aptix.outcome", outcome.to_owned());
    let error = error.or_else(|| (outcome == "dead_lettered").then(|| outcome.to_owned()));
    span.set_status(match error {
        Some(message) => opentelemetry::trace::Status::error(message),
        None => opentelemetry::trace::Status::Ok,
    });
}

/// Gives an outgoing message a `traceparent`: the hop's trace when it is the same turn (with
/// its sampling decision), else the turn's derived trace (sampled), with the hop's span as
/// parent id.
pub fn stamp(out: &mut OutMessage, incoming: &Delivery, parent: &Parent) {
    if out.headers.contains_key("traceparent") {
        return;
    }
    let same_turn = match (out.turn(), turn_of(&incoming.headers)) {
        (Some(a), Some(b)) => a == b,
        (Some(a), None) => Some(a) == incoming.hint.pair(),
        _ => true,
    };
    let trace = match (same_turn, parent.trace_id.as_deref(), out.turn()) {
        (true, Some(t), _) => t.to_owned(),
        (_, _, Some((s, t))) => derived_trace_id(s, t),
        (false, Some(t), None) => t.to_owned(),
        (_, None, None) => return,
    };
    let flags = if same_turn { parent.flags.as_str() } else { "01" };
    let span = &parent.span_id;
    out.headers.insert("traceparent".into(), format!("00-{trace}-{span}-{flags}").into());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_parsing_and_derivation() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert_eq!(parse_trace_id(tp), Some("4bf92f3577b34da6a3ce929d0e0e4736"));
        assert_eq!(parse_trace_id("00-xyz-00f067aa0ba902b7-01"), None);
        assert_eq!(parse_trace_id("00-00000000000000000000000000000000-00f067aa0ba902b7-01"), None);
        assert_eq!(parse_trace_id("00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01"), None);
        assert_eq!(parse_trace_id("00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01"), None);
        assert_eq!(parse_trace_id("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7"), None);
        assert_eq!(parse_flags(tp), Some("01"));
        let a = derived_trace_id("s", "t1");
        assert_eq!(a.len(), 32);
        assert_eq!(a, derived_trace_id("s", "t1"));
        assert_ne!(a, derived_trace_id("s", "t2"));
        assert_eq!(parse_span_id(tp), Some("00f067aa0ba902b7"));
        assert_eq!(new_span_id().len(), 16);
        assert_eq!(derived_span_id("s", "t1"), derived_span_id("s", "t1"));
        assert_ne!(derived_span_id("s", "t1"), derived_span_id("s", "t2"));
        assert_eq!(derived_span_id("s", "t1").len(), 16);
    }
}
