//! A received message as the runtime hands it on: lapin's delivery detached into a [`Delivery`]
//! (headers as text, the turn it names read once), of a client's headers only the trace context
//! kept at the ingress. Its own file so that the consume loop and the lanes both use it without
//! using each other.

use std::collections::BTreeMap;

use lapin::types::{AMQPValue, FieldTable};

use super::{Delivery, Handler, MessageKeys, TurnHint};
use crate::contracts::headers;

/// The runtime's [`Delivery`] of `d`, its body moved out (not copied); `ingress`: a client's
/// message, whose pipeline headers are dropped unless `keys` verify them (see
/// [`ingress_count_fields`](super::ingress_count_fields)).
pub(super) fn detach(
    d: &mut lapin::message::Delivery,
    ingress: bool,
    keys: Option<&MessageKeys>,
    handler: &dyn Handler,
) -> Delivery {
    let mut headers = d.properties.headers().as_ref().map(headers_of).unwrap_or_default();
    if ingress {
        // Ingress messages come from clients: of their headers only the trace context is read.
        // The runtime's own counters and marks, and the broker's death records (which a dead
        // letter is described and replayed from), are not theirs to set; anything else would
        // only be carried along, into every copy (a retry, a dead letter), by the thousand.
        // Dropped here, none of it reaches a retry, dead letter or replay. The one exception is
        // the copy the ingress itself republished with its counts, which its MAC proves.
        keep_client_headers(&mut headers, keys, &d.data);
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

/// The runtime's counters a copy the ingress republished to itself carries, under its MAC.
const COUNTS: [&str; 3] = [headers::ATTEMPT, headers::REDELIVERIES, headers::LAST_ERROR];

/// Keeps of a client's headers those the pipeline reads, if not oversized, and the runtime's
/// counters when `keys` verify their MAC over them and `body`.
fn keep_client_headers(
    headers: &mut BTreeMap<String, String>,
    keys: Option<&MessageKeys>,
    body: &[u8],
) {
    // Only a copy with counts and a MAC of the right shape is worth hashing the body for.
    let claims = [headers::ATTEMPT, headers::REDELIVERIES].iter().any(|k| headers.contains_key(*k));
    let mac = headers.get(headers::MAC).filter(|m| m.len() == 64 && claims);
    let counted = keys.zip(mac).is_some_and(|(keys, mac)| {
        let count = |k: &str| headers.get(k).map_or("", String::as_str);
        let fields =
            super::ingress_count_fields(count(headers::ATTEMPT), count(headers::REDELIVERIES));
        keys.verify(&fields, body, mac)
    });
    headers.retain(|k, v| {
        let client = CLIENT_HEADERS.contains(&k.as_str()) && v.len() <= MAX_CLIENT_HEADER;
        client || (counted && COUNTS.contains(&k.as_str()))
    });
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
        keep_client_headers(&mut h, Some(&keys(b"0123456789abcdef")), b"{}");
        assert_eq!(h.keys().collect::<Vec<_>>(), ["traceparent", "tracestate"]);
        let mut long: BTreeMap<String, String> =
            [("tracestate".to_owned(), "x".repeat(MAX_CLIENT_HEADER + 1))].into();
        keep_client_headers(&mut long, None, b"");
        assert!(long.is_empty(), "an oversized one is dropped");
    }

    fn keys(key: &[u8]) -> MessageKeys {
        MessageKeys::new(vec![key.to_vec()]).unwrap()
    }

    /// The copy the ingress republishes to itself keeps its counts (signed); a client's forged
    /// counts, unsigned, signed over other counts or body, or with another key, are dropped.
    #[test]
    fn only_the_ingress_own_signed_counts_are_kept() {
        let ours = keys(b"0123456789abcdef");
        let counted =
            |attempt: &str, redeliveries: &str, mac: String| -> BTreeMap<String, String> {
                [
                    (headers::ATTEMPT.to_owned(), attempt.to_owned()),
                    (headers::REDELIVERIES.to_owned(), redeliveries.to_owned()),
                    (headers::LAST_ERROR.to_owned(), "database unavailable".to_owned()),
                    (headers::MAC.to_owned(), mac),
                ]
                .into()
            };
        let signed = |k: &MessageKeys, a: &str, r: &str, body: &[u8]| {
            k.sign(&crate::broker::ingress_count_fields(a, r), body)
        };
        let kept = |mut h: BTreeMap<String, String>, body: &[u8]| {
            keep_client_headers(&mut h, Some(&ours), body);
            h.into_keys().collect::<Vec<_>>()
        };
        let genuine = counted("1", "2", signed(&ours, "1", "2", b"{}"));
        let want = [headers::ATTEMPT, headers::LAST_ERROR, headers::REDELIVERIES];
        assert_eq!(kept(genuine.clone(), b"{}"), want);
        let mut without = genuine.clone();
        keep_client_headers(&mut without, None, b"{}");
        assert!(without.is_empty(), "no keys: nothing verifies");
        assert!(kept(genuine, b"{\"other\":1}").is_empty(), "another body");
        assert!(kept(counted("0", "2", signed(&ours, "1", "2", b"{}")), b"{}").is_empty());
        let theirs = keys(b"fedcba9876543210");
        assert!(kept(counted("1", "2", signed(&theirs, "1", "2", b"{}")), b"{}").is_empty());
        assert!(kept(counted("1", "2", "zz".into()), b"{}").is_empty(), "not hex");
    }
}
