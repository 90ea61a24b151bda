//! Maps a provider `Response` object to the AGN-033 outcome.
//!
//! `message` items' `output_text` parts become `PrimaryOutputText` (messages joined by a blank
//! line); `function_call` items, in output order, become `ToolCalls` of a
//! `client_tool_continuation` (any text beside them becomes the informational
//! `ToolContinuationMessage`); other item types (reasoning, hosted tools) are skipped.
//! `incomplete` is a final answer with whatever text exists plus a user warning, and its
//! function calls are dropped because their arguments may be cut off. A refusal part, or status
//! `failed`, is an error; so are two function calls sharing a `call_id` (their results and
//! approvals could not be told apart) and a NUL character in text or a call (PostgreSQL stores
//! no NUL in text).

use serde_json::Value;

use super::error::{LlmError, ProviderError};
use super::{LlmResponse, ResponseStatus};
use crate::contracts::{
    FinalOutput, Outcome, ToolCall, ToolContinuationOutput, Usage, UserWarning,
};

/// `UserWarnings[].Code` of a final answer the provider cut short.
pub const INCOMPLETE_WARNING_CODE: &str = "llm.output_incomplete";

/// What the output items hold.
#[derive(Default)]
struct Collected {
    messages: Vec<String>,
    refusals: Vec<String>,
    calls: Vec<ToolCall>,
}

/// Maps a provider response object (from a JSON body or a stream's terminal event). Also usable
/// on stored raw responses, e.g. when reprocessing. `attempts` is 1 and `request_id` `None`.
pub fn map_response(raw: Value) -> Result<LlmResponse, LlmError> {
    let response_id = raw
        .get("id")
        .and_then(Value::as_str)
        .ok_or_else(|| LlmError::InvalidResponse("the response has no `id`".into()))?
        .to_owned();
    // Some compatible servers omit `status`; an answer without one is taken as completed.
    let status = match raw.get("status").and_then(Value::as_str).unwrap_or("completed") {
        "completed" => ResponseStatus::Completed,
        "incomplete" => ResponseStatus::Incomplete {
            reason: raw
                .pointer("/incomplete_details/reason")
                .and_then(Value::as_str)
                .unwrap_or("unknown")
                .to_owned(),
        },
        "failed" => {
            let mut error = raw.get("error").map(ProviderError::from_value).unwrap_or_default();
            if error.message.is_empty() {
                error.message =
                    "the provider reported the response as failed without details".into();
            }
            return Err(LlmError::Failed {
                response_id: Some(response_id),
                error: Box::new(error),
                raw: Some(Box::new(raw)),
            });
        }
        other => {
            return Err(LlmError::InvalidResponse(format!("unexpected response status `{other}`")))
        }
    };
    let usage = raw.get("usage").and_then(map_usage);
    let items = raw
        .get("output")
        .and_then(Value::as_array)
        .ok_or_else(|| LlmError::InvalidResponse("the response has no `output` array".into()))?;
    let collected = collect(items)?;
    if !collected.refusals.is_empty() {
        let refusal = collected.refusals.join("\n\n");
        return Err(LlmError::Refused { response_id, refusal, raw: Box::new(raw) });
    }
    let text = collected.messages.join("\n\n");
    let outcome = match &status {
        ResponseStatus::Incomplete { reason } => {
            let mut out = FinalOutput::text(text);
            out.user_warnings.push(UserWarning {
                code: INCOMPLETE_WARNING_CODE.into(),
                message: format!("The answer is incomplete: the model stopped early ({reason})."),
            });
            out.usage = usage;
            Outcome::Final(out)
        }
        ResponseStatus::Completed if !collected.calls.is_empty() => {
            let message = (!text.trim().is_empty()).then_some(text);
            match ToolContinuationOutput::new(collected.calls, message) {
                Some(out) => Outcome::ClientToolContinuation(out),
                None => return Err(LlmError::InvalidResponse("no tool calls".into())),
            }
        }
        ResponseStatus::Completed if collected.messages.is_empty() => {
            return Err(LlmError::InvalidResponse(
                "the response has neither a message nor a function call".into(),
            ))
        }
        ResponseStatus::Completed => {
            let mut out = FinalOutput::text(text);
            out.usage = usage;
            Outcome::Final(out)
        }
    };
    Ok(LlmResponse { response_id, status, outcome, usage, raw, attempts: 1, request_id: None })
}

fn collect(items: &[Value]) -> Result<Collected, LlmError> {
    let mut c = Collected::default();
    for (i, item) in items.iter().enumerate() {
        match item.get("type").and_then(Value::as_str) {
            Some("message") => {
                let mut text = String::new();
                for part in item.get("content").and_then(Value::as_array).into_iter().flatten() {
                    match part.get("type").and_then(Value::as_str) {
                        Some("output_text") => {
                            text.push_str(part.get("text").and_then(Value::as_str).unwrap_or(""))
                        }
                        Some("refusal") => c.refusals.push(
                            part.get("refusal").and_then(Value::as_str).unwrap_or("").to_owned(),
                        ),
                        _ => {}
                    }
                }
                if text.contains('\0') {
                    return Err(nul(i));
                }
                c.messages.push(text);
            }
            Some("function_call") => {
                let field = |k: &str| item.get(k).and_then(Value::as_str).filter(|s| !s.is_empty());
                let (Some(call_id), Some(name)) = (field("call_id"), field("name")) else {
                    return Err(LlmError::InvalidResponse(format!(
                        "output[{i}] is a function_call without call_id/name"
                    )));
                };
                // `arguments` is a JSON string; a server sending an object gets it re-encoded.
                let arguments_json = match item.get("arguments") {
                    Some(Value::String(s)) => s.clone(),
                    Some(other) => other.to_string(),
                    None => "{}".to_owned(),
                };
                // Results and approvals name a call by its id: two calls sharing one could
                // never both be answered, and the turn would wait for an answer it cannot get.
                // A NUL, raw or escaped in the arguments' JSON (which a server tool's record
                // parses), is text PostgreSQL cannot store.
                let escaped = arguments_json.contains("\\u0000");
                if [call_id, name, &arguments_json].iter().any(|s| s.contains('\0')) || escaped {
                    return Err(nul(i));
                }
                if c.calls.iter().any(|c| c.tool_call_id == call_id) {
                    return Err(LlmError::InvalidResponse(format!(
                        "output[{i}] is a function_call repeating an earlier call's call_id"
                    )));
                }
                c.calls.push(ToolCall {
                    tool_call_id: call_id.to_owned(),
                    name: name.to_owned(),
                    arguments_json,
                });
            }
            _ => {}
        }
    }
    Ok(c)
}

/// The error of an output item holding a NUL character.
fn nul(i: usize) -> LlmError {
    LlmError::InvalidResponse(format!(
        "output[{i}] holds a NUL character, which no stored text may hold"
    ))
}

/// Most tokens one figure of a call's usage is read as (2³²; no call comes near). A provider
/// that reports more is believed up to it: summed over a month and priced, the figures must
/// stay far inside PostgreSQL's `bigint`, or every budget check of the tenant (and of each
/// tenant sharing its context's budget) would fail until the month ends.
pub const MAX_REPORTED_TOKENS: u64 = 1 << 32;

/// Maps `usage`, treating every detail as optional (providers and versions differ), each figure
/// at most [`MAX_REPORTED_TOKENS`].
pub fn map_usage(u: &Value) -> Option<Usage> {
    let n = |p: &str| u.pointer(p).and_then(Value::as_u64).map(|t| t.min(MAX_REPORTED_TOKENS));
    let input_tokens = n("/input_tokens")?;
    let output_tokens = n("/output_tokens").unwrap_or(0);
    Some(Usage {
        input_tokens,
        output_tokens,
        total_tokens: n("/total_tokens").unwrap_or(input_tokens + output_tokens),
        cached_input_tokens: n("/input_tokens_details/cached_tokens").unwrap_or(0),
        reasoning_tokens: n("/output_tokens_details/reasoning_tokens").unwrap_or(0),
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_usage_past_any_call_is_read_as_the_most_one_can_report() {
        let huge = json!({"input_tokens": u64::MAX, "output_tokens": 1_000_000_000_000_000_000u64});
        let u = map_usage(&huge).unwrap();
        assert_eq!((u.input_tokens, u.output_tokens), (MAX_REPORTED_TOKENS, MAX_REPORTED_TOKENS));
        assert_eq!(u.total_tokens, 2 * MAX_REPORTED_TOKENS, "the sum neither wraps nor panics");
    }

    fn resp(status: &str, output: Value) -> Value {
        json!({"id":"resp_1","status":status,"output":output,"incomplete_details":{"reason":"max_output_tokens"},
               "usage":{"input_tokens":10,"output_tokens":5,"total_tokens":15,
                        "input_tokens_details":{"cached_tokens":4},"output_tokens_details":{"reasoning_tokens":2}}})
    }

    #[test]
    fn text_calls_incomplete_refusal_and_failed() {
        let msg = json!({"type":"message","role":"assistant","content":[{"type":"output_text","text":"Hi","annotations":[]}]});
        let call = |id: &str| json!({"type":"function_call","id":"fc","call_id":id,"name":"t","arguments":"{}"});
        let r = map_response(resp(
            "completed",
            json!([{"type":"reasoning","id":"rs","summary":[]}, msg.clone()]),
        ))
        .unwrap();
        let Outcome::Final(f) = &r.outcome else { panic!("{r:?}") };
        assert_eq!(f.primary_output_text, "Hi");
        assert_eq!(
            f.usage,
            Some(Usage {
                input_tokens: 10,
                output_tokens: 5,
                total_tokens: 15,
                cached_input_tokens: 4,
                reasoning_tokens: 2
            })
        );

        let r =
            map_response(resp("completed", json!([msg.clone(), call("c1"), call("c2")]))).unwrap();
        let Outcome::ClientToolContinuation(t) = &r.outcome else { panic!("{r:?}") };
        let ids: Vec<_> = t.tool_calls().iter().map(|c| c.tool_call_id.as_str()).collect();
        assert_eq!((ids, t.message()), (vec!["c1", "c2"], Some("Hi")));

        let r = map_response(resp("incomplete", json!([msg, call("c1")]))).unwrap();
        let Outcome::Final(f) = &r.outcome else { panic!("{r:?}") };
        assert_eq!(f.user_warnings[0].code, INCOMPLETE_WARNING_CODE);
        assert!(f.user_warnings[0].message.contains("max_output_tokens"));

        let refusal = json!([{"type":"message","content":[{"type":"refusal","refusal":"No."}]}]);
        assert!(
            matches!(map_response(resp("completed", refusal)), Err(LlmError::Refused { refusal, .. }) if refusal == "No.")
        );
        let failed = json!({"id":"r","status":"failed","output":[],"error":{"code":"server_error","message":"boom"}});
        assert!(
            matches!(map_response(failed), Err(LlmError::Failed { error, .. }) if error.is("server_error"))
        );
        assert!(matches!(
            map_response(resp("completed", json!([]))),
            Err(LlmError::InvalidResponse(_))
        ));
    }

    #[test]
    fn a_nul_in_text_or_a_call_is_an_invalid_answer() {
        let text = json!({"type":"message","content":[{"type":"output_text","text":"a\u{0}b"}]});
        let args = json!({"type":"function_call","call_id":"c","name":"t","arguments":"{\"q\":\"\\u0000\"}"});
        for item in [text, args] {
            let r = map_response(resp("completed", json!([item])));
            assert!(matches!(&r, Err(LlmError::InvalidResponse(m)) if m.contains("NUL")), "{r:?}");
        }
    }

    #[test]
    fn a_call_id_repeated_within_one_answer_is_an_invalid_answer() {
        let call = |id: &str| json!({"type":"function_call","id":"fc","call_id":id,"name":"t","arguments":"{}"});
        let r = map_response(resp("completed", json!([call("c1"), call("c2"), call("c1")])));
        assert!(
            matches!(&r, Err(LlmError::InvalidResponse(m)) if m.starts_with("output[2] ")),
            "{r:?}"
        );
    }
}
