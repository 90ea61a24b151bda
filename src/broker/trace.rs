//! W3C trace context across processes: every message of a turn carries a `traceparent` header
//! with the turn's trace id, and every stage handles a message inside a span that names it, so
//! one turn is one trace in the logs of all workers.
//!
//! A client's own `traceparent` on the request is kept for the turn's messages. Otherwise, and
//! for turns dispatched later from the database, the trace id is derived from
//! `(SessionId, TurnId)`, so every process computes the same one without coordination.
//!
//! Each settled message is a span ([`HopSpan`]); the `traceparent` of what it publishes carries
//! that span's id, so the next stage's span is its child. Spans are exported when OTLP export
//! is on (`crate::otlp`).

use sha2::{Digest, Sha256};

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

/// A fresh span id.
pub fn new_span_id() -> String {
    hex::encode(&uuid::Uuid::new_v4().as_bytes()[..8])
}

/// The span of one stage settling one message.
#[derive(Debug)]
pub struct HopSpan {
    /// This hop's span id, the parent of what it publishes.
    pub span_id: String,
    /// `None` when export is off: nothing else is collected then.
    pending: Option<crate::otlp::SpanRecord>,
}

impl HopSpan {
    /// Starts the span of `stage` handling `d`.
    pub fn start(stage: &str, d: &Delivery) -> HopSpan {
        let span_id = new_span_id();
        let pending = crate::otlp::enabled().then(|| {
            let (session, turn) = match turn_of(&d.headers) {
                Some((s, t)) => (Some(s.to_owned()), Some(t.to_owned())),
                None => (d.hint.session.clone(), d.hint.turn.clone()),
            };
            let mut attributes = vec![
                ("messaging.system", "rabbitmq".to_owned()),
                ("aptix.stage", stage.to_owned()),
            ];
            attributes.extend(session.map(|s| ("aptix.session_id", s)));
            attributes.extend(turn.map(|t| ("aptix.turn_id", t)));
            attributes.extend(d.message_id.clone().map(|m| ("messaging.message.id", m)));
            let now = std::time::SystemTime::now();
            crate::otlp::SpanRecord {
                trace_id: trace_id_of(d)
                    .unwrap_or_else(|| hex::encode(uuid::Uuid::new_v4().as_bytes())),
                span_id: span_id.clone(),
                parent_span_id: d
                    .headers
                    .get("traceparent")
                    .and_then(|t| parse_span_id(t))
                    .map(str::to_owned),
                name: stage.to_owned(),
                start: now,
                end: now,
                error: None,
                attributes,
            }
        });
        HopSpan { span_id, pending }
    }

    /// Ends the span with the message's outcome and exports it.
    pub fn finish(self, outcome: &str, error: Option<String>) {
        if let Some(mut span) = self.pending {
            span.end = std::time::SystemTime::now();
            span.attributes.push(("aptix.outcome", outcome.to_owned()));
            span.error = error.or_else(|| (outcome == "dead_lettered").then(|| outcome.to_owned()));
            crate::otlp::record(span);
        }
    }
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
    }
}
