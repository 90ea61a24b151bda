//! Where the overhead's time goes stage by stage, from the path each record stores
//! (`response_records.stage_timings`: when each stage received the turn's message and when it
//! handed its output on, Unix milliseconds) and the two transactions' start times
//! (`turns.created_at` for admission, `response_records.created_at` for persist).
//!
//! The path's times are whole milliseconds (truncated), so only means over many turns are
//! reported: a difference of two truncated times is unbiased on average, and the database's
//! times are truncated the same way before they are compared with them. A percentile of
//! whole milliseconds would say little.

use aptix::messages::hops::{self, Hop};
use serde_json::Value;

/// A whole first round trip's stages, in order: the only paths averaged.
const STAGES: [&str; 5] = ["validate", "retrieve", "assemble", "invoke", "persist"];

/// What one turn's first round trip stored: admission's and persist's transaction starts (ms)
/// and the stored path.
pub struct StoredPath {
    pub admitted_ms: i64,
    pub persisted_ms: i64,
    pub timings: Value,
}

/// One mean of the breakdown: figure key, label, and the differences it averages.
struct Part {
    key: String,
    label: String,
    values: Vec<f64>,
}

/// The breakdown's means, as (key, label, mean in ms), in the order a turn passes them; empty
/// when no turn stored a whole path (five stages, first attempts).
pub fn breakdown(paths: &[StoredPath]) -> Vec<(String, String, f64)> {
    let mut parts: Vec<Part> = Vec::new();
    let mut push = |i: usize, key: String, label: String, v: i64| {
        if parts.len() <= i {
            parts.push(Part { key, label, values: Vec::new() });
        }
        parts[i].values.push(v as f64);
    };
    for p in paths {
        let path = hops::from_stored(&p.timings);
        let in_order = path.iter().map(|h| h.stage.as_str()).eq(STAGES);
        if !in_order || path.iter().any(|h| h.attempt > 0 || h.redelivered) {
            continue;
        }
        for (i, (key, label, v)) in
            parts_of(&path, p.admitted_ms, p.persisted_ms).into_iter().enumerate()
        {
            push(i, key, label, v);
        }
    }
    parts
        .into_iter()
        .map(|p| {
            let mean = p.values.iter().sum::<f64>() / p.values.len().max(1) as f64;
            (p.key, p.label, mean)
        })
        .collect()
}

/// One turn's parts: each stage's handling and each hop between stages, with validate and
/// persist split at their transaction's start.
fn parts_of(path: &[Hop], admitted_ms: i64, persisted_ms: i64) -> Vec<(String, String, i64)> {
    let mut out = Vec::new();
    let last = path.len() - 1;
    for (i, h) in path.iter().enumerate() {
        let stage = h.stage.as_str();
        match (i, stage) {
            (0, _) => {
                out.push(part(
                    stage,
                    "to_tx",
                    "receipt -> admission BEGIN",
                    admitted_ms - h.received_ms,
                ));
                out.push(part(
                    stage,
                    "tx",
                    "admission BEGIN -> output handed on",
                    h.sent_ms - admitted_ms,
                ));
            }
            (i, _) if i == last => {
                out.push(part(
                    stage,
                    "to_tx",
                    "receipt -> its transaction's BEGIN",
                    persisted_ms - h.received_ms,
                ));
            }
            _ => out.push(part(
                stage,
                "handled",
                "receipt -> output handed on",
                h.sent_ms - h.received_ms,
            )),
        }
        if let Some(next) = path.get(i + 1) {
            out.push((
                format!("hop_{}_{}_ms", h.stage, next.stage),
                format!("  mean {} -> {}: publish, broker, delivery", h.stage, next.stage),
                next.received_ms - h.sent_ms,
            ));
        }
    }
    out
}

fn part(stage: &str, what: &str, label: &str, ms: i64) -> (String, String, i64) {
    (format!("stage_{stage}_{what}_ms"), format!("  mean {stage}: {label}"), ms)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn hop(stage: &str, received_ms: i64, sent_ms: i64) -> Value {
        json!({"stage": stage, "received_ms": received_ms, "sent_ms": sent_ms, "attempt": 0, "redelivered": false})
    }

    #[test]
    fn splits_a_path_into_stages_and_hops_in_order() {
        let timings = json!({"v": 1, "hops": [
            hop("validate", 100, 104), hop("retrieve", 105, 106), hop("assemble", 108, 109),
            hop("invoke", 110, 112), hop("persist", 113, 113),
        ]});
        let paths = [
            StoredPath { admitted_ms: 101, persisted_ms: 114, timings: timings.clone() },
            StoredPath { admitted_ms: 102, persisted_ms: 115, timings },
        ];
        let got = breakdown(&paths);
        let keys: Vec<&str> = got.iter().map(|(k, _, _)| k.as_str()).collect();
        assert_eq!(
            keys,
            [
                "stage_validate_to_tx_ms",
                "stage_validate_tx_ms",
                "hop_validate_retrieve_ms",
                "stage_retrieve_handled_ms",
                "hop_retrieve_assemble_ms",
                "stage_assemble_handled_ms",
                "hop_assemble_invoke_ms",
                "stage_invoke_handled_ms",
                "hop_invoke_persist_ms",
                "stage_persist_to_tx_ms",
            ]
        );
        let means: Vec<f64> = got.iter().map(|(_, _, m)| *m).collect();
        assert_eq!(means, [1.5, 2.5, 1.0, 1.0, 2.0, 1.0, 1.0, 2.0, 1.0, 1.5]);
    }

    #[test]
    fn retried_or_partial_paths_are_left_out() {
        let mut retried = hop("retrieve", 105, 106);
        retried["attempt"] = json!(1);
        let paths = [
            StoredPath {
                admitted_ms: 1,
                persisted_ms: 2,
                timings: json!({"v": 1, "hops": [hop("validate", 0, 1)]}),
            },
            StoredPath {
                admitted_ms: 101,
                persisted_ms: 114,
                timings: json!({"v": 1, "hops": [
                    hop("validate", 100, 104), retried, hop("assemble", 108, 109),
                    hop("invoke", 110, 112), hop("persist", 113, 113),
                ]}),
            },
        ];
        assert!(breakdown(&paths).is_empty());
        let swapped = json!({"v": 1, "hops": [
            hop("validate", 100, 104), hop("assemble", 105, 106), hop("retrieve", 108, 109),
            hop("invoke", 110, 112), hop("persist", 113, 113),
        ]});
        assert!(breakdown(&[StoredPath { admitted_ms: 101, persisted_ms: 114, timings: swapped }])
            .is_empty());
    }
}
