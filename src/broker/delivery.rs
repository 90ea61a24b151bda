//! A received message as the runtime hands it on: lapin's delivery detached into a [`Delivery`]
//! (headers as text, the turn it names read once), of a client's headers only the trace context
//! kept at the ingress. Its own file so that the consume loop and the lanes both use it without
//! using each other.

use std::collections::BTreeMap;

use lapin::types::{AMQPValue, FieldTable};

use super::{Delivery, Handler, TurnHint};
use crate::contracts::headers;

/// The runtime's [`Delivery`] of `d`, its body moved out (not copied); `ingress`: a client's
/// message, whose pipeline headers are dropped.
pub(super) fn detach(
    d: &mut lapin::message::Delivery,
    ingress: bool,
    handler: &dyn Handler,
) -> Delivery {
    let mut headers = d.properties.headers().as_ref().map(headers_of).unwrap_or_default();
    if ingress {
        // Ingress messages come from clients: of their headers only the trace context is read.
        // The runtime's own counters and marks, and the broker's death records (which a dead
        // letter is described and replayed from), are not theirs to set; anything else would
        // only be carried along, into every copy (a retry, a dead letter), by the thousand.
        // Dropped here, none of it reaches a retry, dead letter or replay.
        keep_client_headers(&mut headers);
    }
    let attempt = headers.get(headers::ATTEMPT).and_then(|a| a.parse().ok()).unwrap_or(0);
    let hint = match (headers.get(headers::SESSION_ID), headers.get(headers::TURN_ID)) {
        (Some(s), Some(t)) => TurnHint { session: Some(s.clone()), turn: Some(t.clone()) },
        _ => handler.hint(&d.data),
    };
    Delivery {
        hint,
        body: bytes::Bytes::from(std::mem::take(&mut d.data)),
        message_id: d.properties.message_id().as_ref().map(|m| m.to_string()),
        reply_to: d.properties.reply_to().as_ref().map(|m| m.to_string()),
        user_id: d.properties.user_id().as_ref().map(|m| m.to_string()),
        kind: d.properties.kind().as_ref().map(|m| m.to_string()),
        redelivered: d.redelivered,
        attempt,
        headers,
    }
}

/// The headers of a client's request the pipeline reads: the W3C trace context.
const CLIENT_HEADERS: [&str; 2] = ["traceparent", "tracestate"];

/// The longest client header kept, bytes: W3C's bound on `tracestate`.
const MAX_CLIENT_HEADER: usize = 512;

/// Keeps of a client's headers those the pipeline reads, if not oversized.
fn keep_client_headers(headers: &mut BTreeMap<String, String>) {
    headers.retain(|k, v| CLIENT_HEADERS.contains(&k.as_str()) && v.len() <= MAX_CLIENT_HEADER);
}

/// One header of a received message as text (booleans and integers spelled out), for the
/// command-line clients that read reply queues.
pub fn header_text(table: Option<&FieldTable>, key: &str) -> Option<String> {
    table.and_then(|t| headers_of(t).remove(key))
}

pub(super) fn headers_of(table: &FieldTable) -> BTreeMap<String, String> {
    table
        .inner()
        .iter()
        .filter_map(|(k, v)| {
            let s = match v {
                AMQPValue::LongString(s) => s.to_string(),
                AMQPValue::ShortString(s) => s.to_string(),
                AMQPValue::LongLongInt(i) => i.to_string(),
                AMQPValue::LongInt(i) => i.to_string(),
                AMQPValue::ShortInt(i) => i.to_string(),
                AMQPValue::Boolean(b) => b.to_string(),
                _ => return None,
            };
            Some((k.to_string(), s))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_keeps_only_its_trace_context() {
        let mut h: BTreeMap<String, String> = [
            ("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".to_owned()),
            ("tracestate", "a=b".to_owned()),
            (headers::ATTEMPT, "0".to_owned()),
            (headers::REDELIVERIES, "0".to_owned()),
            ("x-death", String::new()),
            ("x-first-death-queue", "q".to_owned()),
            ("anything", "x".to_owned()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        keep_client_headers(&mut h);
        assert_eq!(h.keys().collect::<Vec<_>>(), ["traceparent", "tracestate"]);
        let mut long: BTreeMap<String, String> =
            [("tracestate".to_owned(), "x".repeat(MAX_CLIENT_HEADER + 1))].into();
        keep_client_headers(&mut long);
        assert!(long.is_empty(), "an oversized one is dropped");
    }
}
