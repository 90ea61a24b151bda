//! The LLM judge scorer of `aptix eval` (`--judge-rubric FILE --judge-model M`): each final
//! answer (the originals' and every arm's) is sent with its instruction to the Responses API
//! through the same client as the pipeline's calls, with the rubric as instructions and a
//! structured output (`judgement`: a score from 0 to 1 and a reason). The judge's own calls are
//! counted and budgeted: each reserves its worst case (request bytes as input tokens, the output
//! cap) against `--judge-budget-usd` before it is made and settles to its usage after, so the
//! judge never spends more than that; answers left unjudged are counted in the report.

use std::collections::BTreeMap;
use std::sync::Mutex;

use futures_util::StreamExt as _;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use uuid::Uuid;

use super::score::final_text;
use super::ORIGINAL;
use crate::config::ModelPrice;
use crate::contracts::Outcome;
use crate::llm::{Endpoint, LlmClient, LlmRequest, RequestBody};
use crate::store::EvalRow;

/// Output tokens a judgement may use.
const MAX_OUTPUT: u64 = 300;

/// How to judge.
#[derive(Debug, Clone)]
pub struct Judge {
    /// What a good answer is, in the operator's words (the judge's instructions).
    pub rubric: String,
    /// The judge's model.
    pub model: String,
    /// The most the judge may spend, in USD (needs the model's price).
    pub budget_usd: Option<f64>,
}

/// What the judge did.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct JudgeSpend {
    /// Answers judged.
    pub judged: usize,
    /// Final answers left unjudged: the budget would have been passed, or the judge failed or
    /// answered something that is not a judgement.
    pub unjudged: usize,
    /// What its calls cost, at the model's price (0 without one).
    pub cost_usd: f64,
}

/// An answer: the arm (or [`ORIGINAL`]) and its round trip.
pub type ArmKey = (String, (Uuid, String, i32));
/// Judged answers and their scores.
pub type Judged = BTreeMap<ArmKey, f64>;

/// Judges every final answer of `rows` (per arm) and of their originals.
pub async fn run(
    judge: &Judge,
    llm: &dyn LlmClient,
    endpoint: &Endpoint,
    price: Option<&ModelPrice>,
    rows: &BTreeMap<String, Vec<EvalRow>>,
    concurrency: usize,
) -> (Judged, JudgeSpend) {
    let work = answers(rows);
    // Micro-dollars spent (settled) and reserved (in flight) against the budget.
    let ledger = Mutex::new((0u64, 0u64));
    let budget = judge.budget_usd.map(|b| (b * 1e6) as u64);
    let results: Vec<(_, Option<f64>, u64)> = futures_util::stream::iter(work)
        .map(|(key, (instruction, answer))| {
            let ledger = &ledger;
            async move {
                let body = request(judge, &instruction, &answer);
                let worst = price
                    .map_or(0, |p| p.worst_case(body.as_str().len() as u64, MAX_OUTPUT).micros());
                {
                    let mut l = ledger.lock().unwrap_or_else(|e| e.into_inner());
                    if budget.is_some_and(|b| l.0 + l.1 + worst > b) {
                        return (key, None, 0);
                    }
                    l.1 += worst;
                }
                let request =
                    LlmRequest { endpoint, body: &body, deltas: None, once: budget.is_some() };
                let answer = llm.create_response(request).await;
                let usage = answer.as_ref().ok().and_then(|a| a.usage);
                // An error answer's cost is unknown: it stays at its worst case.
                let cost = match (price, usage) {
                    (Some(p), Some(u)) => p.cost(&u).micros(),
                    _ if answer.is_err() => worst,
                    _ => 0,
                };
                let mut l = ledger.lock().unwrap_or_else(|e| e.into_inner());
                l.1 -= worst;
                l.0 += cost;
                (key, answer.ok().and_then(|a| score(&a.outcome)), cost)
            }
        })
        .buffer_unordered(concurrency.max(1))
        .collect()
        .await;
    let mut judged = Judged::new();
    let mut spend = JudgeSpend::default();
    for (key, score, cost) in results {
        spend.cost_usd += cost as f64 / 1e6;
        match score {
            Some(s) => {
                judged.insert(key, s);
                spend.judged += 1;
            }
            None => spend.unjudged += 1,
        }
    }
    (judged, spend)
}

/// Every final answer to judge, with its instruction: each arm's and each original's once.
fn answers(rows: &BTreeMap<String, Vec<EvalRow>>) -> BTreeMap<ArmKey, (String, String)> {
    let mut work = BTreeMap::new();
    for (arm, list) in rows {
        for r in list {
            let key = (r.session_id, r.turn_id.clone(), r.step);
            let instruction = r.instruction.clone().unwrap_or_default();
            if r.new_kind == "final" {
                work.insert(
                    (arm.clone(), key.clone()),
                    (instruction.clone(), final_text(&r.new_reply)),
                );
            }
            if r.original_kind == "final" {
                work.insert(
                    (ORIGINAL.to_owned(), key),
                    (instruction, final_text(&r.original_reply)),
                );
            }
        }
    }
    work
}

/// The judgement request: the rubric as instructions, the instruction and answer as input, a
/// strict JSON Schema for the judgement, nothing stored at the provider.
pub fn request(judge: &Judge, instruction: &str, answer: &str) -> RequestBody {
    let instructions = format!(
        "{}\n\nJudge the answer to the instruction by the rubric above. Give a score from 0 (it fails the rubric) to 1 (it meets it fully) and one sentence of reason.",
        judge.rubric.trim()
    );
    let schema = json!({
        "type": "object",
        "properties": { "score": { "type": "number" }, "reason": { "type": "string" } },
        "required": ["score", "reason"],
        "additionalProperties": false,
    });
    RequestBody::new(&json!({
        "model": judge.model,
        "instructions": instructions,
        "input": [{
            "role": "user",
            "content": [{ "type": "input_text", "text": format!("[INSTRUCTION]\n{instruction}\n[ANSWER]\n{answer}") }],
        }],
        "text": { "format": { "type": "json_schema", "name": "judgement", "strict": true, "schema": schema } },
        "max_output_tokens": MAX_OUTPUT,
        "store": false,
    }))
}

/// The score of a judgement answer, clamped to 0-1; none when it is not one.
fn score(outcome: &Outcome) -> Option<f64> {
    let Outcome::Final(f) = outcome else { return None };
    let v: Value = serde_json::from_str(f.primary_output_text.trim()).ok()?;
    v["score"].as_f64().map(|s| s.clamp(0.0, 1.0))
}
