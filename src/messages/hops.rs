//! A turn's path through the stages: when each stage received its message and handed the
//! output on, with the delivery's attempt. Carried in the `x-aptix-hops` header of the turn's
//! stage messages and stored (versioned) with the record that ends the round trip, so the
//! console's timeline shows every stage without a database write per stage. Bounded: a header
//! over its size or count limit, or malformed, reads as no hops.

use std::collections::BTreeMap;

use crate::contracts::headers;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// The header that carries the hops so far.
pub const HOPS_HEADER: &str = headers::HOPS;
/// Version of the stored form (`{"v": 1, "hops": [...]}`).
pub const HOPS_VERSION: u32 = 1;
/// Hops kept at most: a turn's round trip has five, retries included far fewer than this.
const MAX_HOPS: usize = 32;
/// Longest header read.
const MAX_HEADER: usize = 8 * 1024;

/// One stage's handling of one of a turn's messages.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hop {
    /// The stage (`retrieve`).
    pub stage: String,
    /// When the delivery reached the stage, Unix milliseconds.
    pub received_ms: i64,
    /// When the stage handed its output to the broker, Unix milliseconds.
    pub sent_ms: i64,
    /// Retries through the delay queues before this delivery (0 the first time).
    pub attempt: u32,
    /// Whether the broker had delivered it before (a worker stopped or died on it).
    pub redelivered: bool,
}

/// The hops in `headers`; none when absent, too large or malformed.
pub fn read(headers: &BTreeMap<String, String>) -> Vec<Hop> {
    let Some(text) = headers.get(HOPS_HEADER).filter(|t| t.len() <= MAX_HEADER) else {
        return Vec::new();
    };
    match serde_json::from_str::<Vec<Hop>>(text) {
        Ok(hops) if hops.len() <= MAX_HOPS && hops.iter().all(|h| h.stage.len() <= 64) => hops,
        _ => Vec::new(),
    }
}

/// The header value for `hops` (the oldest dropped past the limit).
pub fn encode(hops: &[Hop]) -> String {
    let keep = &hops[hops.len().saturating_sub(MAX_HOPS)..];
    serde_json::to_string(keep).unwrap_or_else(|_| "[]".to_owned())
}

/// The stored form of `hops`.
pub fn stored(hops: &[Hop]) -> Value {
    json!({ "v": HOPS_VERSION, "hops": hops })
}

/// The hops of a stored form of any version so far; none for rows written before hops were.
pub fn from_stored(v: &Value) -> Vec<Hop> {
    serde_json::from_value(v["hops"].clone()).unwrap_or_default()
}

/// Now, in Unix milliseconds.
pub fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hop(stage: &str) -> Hop {
        Hop { stage: stage.into(), received_ms: 1, sent_ms: 2, attempt: 0, redelivered: false }
    }

    #[test]
    fn round_trips_and_refuses_what_is_out_of_bounds() {
        let hops = vec![hop("validate"), hop("retrieve")];
        let mut headers = BTreeMap::new();
        headers.insert(HOPS_HEADER.to_owned(), encode(&hops));
        assert_eq!(read(&headers), hops);
        assert_eq!(from_stored(&stored(&hops)), hops);
        headers.insert(HOPS_HEADER.to_owned(), "[{\"stage\":1}]".into());
        assert!(read(&headers).is_empty());
        let many: Vec<Hop> = (0..40).map(|_| hop("x")).collect();
        headers.insert(HOPS_HEADER.to_owned(), serde_json::to_string(&many).unwrap());
        assert!(read(&headers).is_empty(), "more than MAX_HOPS");
        assert_eq!(serde_json::from_str::<Vec<Hop>>(&encode(&many)).unwrap().len(), MAX_HOPS);
        headers.insert(HOPS_HEADER.to_owned(), "x".repeat(MAX_HEADER + 1));
        assert!(read(&headers).is_empty());
    }
}
