//! The scorers of `aptix eval`, each a number per round trip (higher is better, except
//! `latency_ms` and `cost_usd`), computed from an arm's record and its original:
//!
//! | scorer | score |
//! |---|---|
//! | `exact` | 1 when the kind and the answer (final text, tool calls or error codes) equal the original's |
//! | `regex` | 1 when the final text matches `--expect-regex` (only with it) |
//! | `tool_agreement` | 1 when the tool calls equal the original's in names, order and arguments (as JSON) |
//! | `tool_args_valid` | the share of its tool calls whose arguments are valid against the tool's JSON Schema (round trips with calls only) |
//! | `retrieval_overlap` | Jaccard overlap of the chunks this round trip sent (rehydrated history left out) with the original's (1 when both sent none) |
//! | `latency_ms` | the replayed call's duration (replays only: the original's call was timed otherwise) |
//! | `cost_usd` | its usage at the configured price (models with a price only) |
//! | `judge` | the LLM judge's score from 0 to 1 by the operator's rubric (with `--judge-rubric`; see `judge`) |

use std::collections::{BTreeMap, BTreeSet};

use regex::Regex;
use serde_json::Value;

use crate::config::ModelPrice;
use crate::contracts::Usage;
use crate::store::EvalRow;

/// Names of the scorers whose lower values are better.
pub const LOWER_IS_BETTER: [&str; 2] = ["latency_ms", "cost_usd"];

/// The scorers of one evaluation.
#[derive(Debug, Clone, Default)]
pub struct Scorers {
    /// `--expect-regex`: the final text should match it.
    pub expect: Option<Regex>,
}

/// One side of a pair, as the scorers see it.
struct Side<'a> {
    kind: &'a str,
    reply: &'a Value,
    usage: Option<&'a Value>,
    chunks: Option<&'a Value>,
    model: Option<&'a str>,
}

impl Scorers {
    /// The scores of `row`'s new record (`original: false`) or of its original (`true`, the
    /// `original` baseline arm, which agrees with itself).
    pub fn score(
        &self,
        row: &EvalRow,
        original: bool,
        prices: &[ModelPrice],
    ) -> BTreeMap<&'static str, f64> {
        let old = Side {
            kind: &row.original_kind,
            reply: &row.original_reply,
            usage: row.original_usage.as_ref(),
            chunks: row.original_chunks.as_ref(),
            model: row.original_model.as_deref(),
        };
        let new = Side {
            kind: &row.new_kind,
            reply: &row.new_reply,
            usage: row.new_usage.as_ref(),
            chunks: row.new_chunks.as_ref(),
            model: row.new_model.as_deref(),
        };
        let this = if original { &old } else { &new };
        let mut s = BTreeMap::new();
        s.insert("exact", flag(this.kind == old.kind && answer(this.reply) == answer(old.reply)));
        if let Some(re) = &self.expect {
            s.insert("regex", flag(re.is_match(&final_text(this.reply))));
        }
        s.insert("tool_agreement", flag(tool_calls(this.reply) == tool_calls(old.reply)));
        if !original {
            if let Some(valid) = args_valid(row.new_tools.as_ref(), &new) {
                s.insert("tool_args_valid", valid);
            }
        }
        s.insert("retrieval_overlap", overlap(chunk_ids(this.chunks), chunk_ids(old.chunks)));
        // Only replays are timed alike (one call, not streamed); the original's invoke stage
        // also streamed and may have retried, so it has no latency to compare with.
        if let Some(ms) = llm_ms(row.new_timings.as_ref()).filter(|_| !original) {
            s.insert("latency_ms", ms);
        }
        if let Some(cost) = cost(this, prices) {
            s.insert("cost_usd", cost);
        }
        s
    }
}

fn flag(b: bool) -> f64 {
    if b {
        1.0
    } else {
        0.0
    }
}

/// What a reply answered: its final text, its tool calls, or its error codes.
fn answer(reply: &Value) -> (String, Vec<(String, Value)>, Vec<String>) {
    let codes = reply["Errors"].as_array().map(Vec::as_slice).unwrap_or_default();
    let codes = codes.iter().filter_map(|e| e["Code"].as_str().map(str::to_owned)).collect();
    (final_text(reply), tool_calls(reply), codes)
}

pub(super) fn final_text(reply: &Value) -> String {
    reply["Result"]["PrimaryOutputText"].as_str().unwrap_or_default().to_owned()
}

/// Tool calls by name and parsed arguments (call ids are the provider's and always differ).
fn tool_calls(reply: &Value) -> Vec<(String, Value)> {
    let calls = reply["Result"]["ToolCalls"].as_array().map(Vec::as_slice).unwrap_or_default();
    calls
        .iter()
        .map(|c| {
            let args = c["ArgumentsJson"].as_str().unwrap_or_default();
            let parsed = serde_json::from_str(args).unwrap_or_else(|_| Value::String(args.into()));
            (c["Name"].as_str().unwrap_or_default().to_owned(), parsed)
        })
        .collect()
}

/// The share of `side`'s tool calls whose arguments their tool's schema accepts.
fn args_valid(tools: Option<&Value>, side: &Side<'_>) -> Option<f64> {
    let calls = tool_calls(side.reply);
    if calls.is_empty() {
        return None;
    }
    let tools = tools.and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    let valid = calls
        .iter()
        .filter(|(name, args)| {
            let schema =
                tools.iter().find(|t| t["name"] == name.as_str()).map(|t| &t["parameters"]);
            schema.and_then(|s| jsonschema::validator_for(s).ok()).is_some_and(|v| v.is_valid(args))
        })
        .count();
    Some(valid as f64 / calls.len() as f64)
}

fn chunk_ids(chunks: Option<&Value>) -> BTreeSet<String> {
    let list = chunks.and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    // Chunks of earlier turns carried into a rebuilt chain are history, not this round trip's
    // retrieval.
    list.iter()
        .filter(|c| c.get("rehydrated") != Some(&Value::Bool(true)))
        .map(|c| match c.get("chunk_id").or_else(|| c.get("id")) {
            Some(id) => id.to_string(),
            None => c.to_string(),
        })
        .collect()
}

fn overlap(a: BTreeSet<String>, b: BTreeSet<String>) -> f64 {
    let union = a.union(&b).count();
    if union == 0 {
        return 1.0;
    }
    a.intersection(&b).count() as f64 / union as f64
}

fn llm_ms(timings: Option<&Value>) -> Option<f64> {
    timings?.get("llm_ms")?.as_f64()
}

fn cost(side: &Side<'_>, prices: &[ModelPrice]) -> Option<f64> {
    let usage: Usage = serde_json::from_value(side.usage?.clone()).ok()?;
    let price = prices.iter().find(|p| Some(p.model.as_str()) == side.model)?;
    Some(price.cost_usd(&usage))
}
