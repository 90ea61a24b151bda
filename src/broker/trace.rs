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

/// The trace id (32 hex digits) for a turn without a client-supplied one.
pub fn derived_trace_id(session: &str, turn: &str) -> String {
    let digest = Sha256::digest(format!("{session}/{turn}").as_bytes());
    hex::encode(&digest[..16])
}

/// The trace id of a `traceparent` header (`00-<trace-id>-<span-id>-<flags>`), if well-formed.
pub fn parse_trace_id(traceparent: &str) -> Option<&str> {
    let mut parts = traceparent.split('-');
    let (version, trace, span) = (parts.next()?, parts.next()?, parts.next()?);
    let hex32 = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    (version == "00" && hex32(trace, 32) && hex32(span, 16) && trace != "0".repeat(32))
        .then_some(trace)
}

fn turn_of(headers: &std::collections::BTreeMap<String, String>) -> Option<(&str, &str)> {
    Some((headers.get("x-aptix-session-id")?.as_str(), headers.get("x-aptix-turn-id")?.as_str()))
}

fn turn_of_out(out: &OutMessage) -> Option<(&str, &str)> {
    let text = |k: &str| match out.headers.get(k) {
        Some(super::HeaderValue::Str(s)) => Some(s.as_str()),
        _ => None,
    };
    Some((text("x-aptix-session-id")?, text("x-aptix-turn-id")?))
}

/// The trace id a delivery belongs to.
pub fn trace_id_of(d: &Delivery) -> Option<String> {
    if let Some(id) = d.headers.get("traceparent").and_then(|t| parse_trace_id(t)) {
        return Some(id.to_owned());
    }
    if let Some((s, t)) = turn_of(&d.headers) {
        return Some(derived_trace_id(s, t));
    }
    Some(derived_trace_id(d.hint.session.as_deref()?, d.hint.turn.as_deref()?))
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

/// The span of `stage` settling `d`, not yet entered. With export on, its OpenTelemetry
/// parent is the span that published `d` (its `traceparent`, read by the W3C propagator), else
/// the turn's derived start.
pub fn hop_span(stage: &str, d: &Delivery) -> tracing::Span {
    let trace = trace_id_of(d);
    let span = tracing::info_span!(
        "stage",
        otel.name = stage,
        otel.kind = "consumer",
        stage,
        trace_id = trace.as_deref().unwrap_or("-"),
    );
    if crate::otel::enabled() {
        let _ = span.set_parent(parent_of(d, trace.as_deref()));
        let (session, turn) = match turn_of(&d.headers) {
            Some((s, t)) => (Some(s), Some(t)),
            None => (d.hint.session.as_deref(), d.hint.turn.as_deref()),
        };
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
    let turn =
        turn_of(&d.headers).or_else(|| d.hint.session.as_deref().zip(d.hint.turn.as_deref()));
    let (Some(trace), Some((session, turn))) = (trace, turn) else {
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

/// The span id that what `span` publishes names as its parent: the exported span's own, or a
/// fresh one when export is off.
pub fn span_id_of(span: &tracing::Span) -> String {
    if crate::otel::enabled() {
        let cx = span.context();
        let context = cx.span().span_context().clone();
        if context.is_valid() {
            return context.span_id().to_string();
        }
    }
    new_span_id()
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

/// Gives an outgoing message a `traceparent`: the incoming trace when it is the same turn,
/// else the turn's derived trace, with `span` (the publishing hop's span) as parent id.
pub fn stamp(out: &mut OutMessage, incoming: &Delivery, incoming_trace: Option<&str>, span: &str) {
    if out.headers.contains_key("traceparent") {
        return;
    }
    let same_turn = match (turn_of_out(out), turn_of(&incoming.headers)) {
        (Some(a), Some(b)) => a == b,
        (Some(_), None) => {
            let hint = &incoming.hint;
            turn_of_out(out) == hint.session.as_deref().zip(hint.turn.as_deref())
        }
        _ => true,
    };
    let trace = match (same_turn, incoming_trace, turn_of_out(out)) {
        (true, Some(t), _) => t.to_owned(),
        (_, _, Some((s, t))) => derived_trace_id(s, t),
        (false, Some(t), None) => t.to_owned(),
        (_, None, None) => return,
    };
    out.headers.insert("traceparent".into(), format!("00-{trace}-{span}-01").into());
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
