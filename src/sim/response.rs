//! Builds the `Response` object (the non-streaming body, the stored copy, and the payload of the
//! stream's terminal event) and its output items, with the fields the real API returns.

use serde_json::{json, Value};

use super::script::{Item, Reply, Status, Tokens};

/// The `status` string of a reply.
pub(crate) fn status_str(status: Status) -> &'static str {
    match status {
        Status::Completed => "completed",
        Status::Incomplete(_) => "incomplete",
        Status::Failed => "failed",
    }
}

/// The complete response object.
pub(crate) fn build(body: &Value, id: &str, created_at: u64, reply: &Reply, store: bool) -> Value {
    let echo = |key: &str, default: Value| {
        body.get(key).filter(|v| !v.is_null()).cloned().unwrap_or(default)
    };
    let item_status =
        if matches!(reply.status, Status::Incomplete(_)) { "incomplete" } else { "completed" };
    let output: Vec<Value> = reply.items.iter().map(|i| item(i, Some(item_status))).collect();
    let error = match reply.status {
        Status::Failed => {
            json!({"code": "server_error", "message": "The simulator was asked to fail (@fail)."})
        }
        _ => Value::Null,
    };
    let incomplete = match reply.status {
        Status::Incomplete(reason) => json!({ "reason": reason }),
        _ => Value::Null,
    };
    json!({
        "id": id,
        "object": "response",
        "created_at": created_at,
        "status": status_str(reply.status),
        "background": false,
        "completed_at": if reply.status == Status::Completed { json!(created_at) } else { Value::Null },
        "error": error,
        "incomplete_details": incomplete,
        "instructions": echo("instructions", Value::Null),
        "max_output_tokens": echo("max_output_tokens", Value::Null),
        "model": echo("model", Value::Null),
        "output": output,
        "parallel_tool_calls": echo("parallel_tool_calls", json!(true)),
        "previous_response_id": echo("previous_response_id", Value::Null),
        "reasoning": echo("reasoning", json!({"effort": null, "summary": null})),
        "store": store,
        "temperature": echo("temperature", json!(1.0)),
        "text": echo("text", json!({"format": {"type": "text"}})),
        "tool_choice": echo("tool_choice", json!("auto")),
        "tools": echo("tools", json!([])),
        "top_p": echo("top_p", json!(1.0)),
        "truncation": "disabled",
        "usage": usage(&reply.tokens),
        "metadata": echo("metadata", json!({})),
    })
}

/// `usage` with the detail objects.
pub(crate) fn usage(t: &Tokens) -> Value {
    json!({
        "input_tokens": t.input,
        "input_tokens_details": { "cached_tokens": t.cached },
        "output_tokens": t.output,
        "output_tokens_details": { "reasoning_tokens": t.reasoning },
        "total_tokens": t.input + t.output,
    })
}

/// An output item: complete with the given status, or as first announced in a stream (`None`:
/// `in_progress`, no content, empty arguments).
pub(crate) fn item(item: &Item, done: Option<&str>) -> Value {
    let status = done.unwrap_or("in_progress");
    match item {
        Item::Reasoning { id } => json!({"type": "reasoning", "id": id, "summary": []}),
        Item::Message { id, text } => {
            let content = if done.is_some() { vec![text_part(text)] } else { Vec::new() };
            json!({"type": "message", "id": id, "status": status, "role": "assistant", "content": content})
        }
        Item::Refusal { id, text } => {
            let content = if done.is_some() { vec![refusal_part(text)] } else { Vec::new() };
            json!({"type": "message", "id": id, "status": status, "role": "assistant", "content": content})
        }
        Item::Call { id, call_id, name, arguments } => json!({
            "type": "function_call", "id": id, "call_id": call_id, "name": name,
            "arguments": if done.is_some() { arguments.as_str() } else { "" }, "status": status,
        }),
    }
}

/// An `output_text` content part.
pub(crate) fn text_part(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

/// A `refusal` content part.
pub(crate) fn refusal_part(text: &str) -> Value {
    json!({"type": "refusal", "refusal": text})
}
