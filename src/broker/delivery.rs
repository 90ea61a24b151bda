//! A received message as the runtime hands it on: lapin's delivery detached into a [`Delivery`]
//! (headers as text, the turn it names read once), with what a client may not set dropped at
//! the ingress. Its own file so that the consume loop and the lanes both use it without using
//! each other.

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
        // Ingress messages come from clients: the runtime's own counters and marks, and the
        // broker's death records (which a dead letter is described and replayed from), are not
        // theirs to set. Dropped here, they reach no retry, dead letter or replay.
        headers.retain(|k, _| !is_pipeline_header(k));
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

/// Whether a header is the pipeline's or the broker's to set, never a client's.
pub fn is_pipeline_header(key: &str) -> bool {
    key.starts_with(headers::PREFIX)
        || key == "x-death"
        || key.starts_with("x-first-death-")
        || key.starts_with("x-last-death-")
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
