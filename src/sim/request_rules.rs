//! Request validation: the checks the live API makes that DESIGN.md §5 cares about, answered
//! with the API's own 400 bodies (the first problem found, as the API reports one).
//!
//! Top-level parameters, tools and `tool_choice` are checked here; `input` items in
//! `validate_input`; tool outputs against the previous response in `tool_outputs`.

use serde_json::{Map, Value};

use super::errors::ApiFailure;
use super::state::Stored;
use super::validate_input;

/// Every `CreateResponse` property of the official spec; anything else is `unknown_parameter`.
const KNOWN: &[&str] = &[
    "background",
    "context_management",
    "conversation",
    "include",
    "input",
    "instructions",
    "max_output_tokens",
    "max_tool_calls",
    "metadata",
    "model",
    "moderation",
    "parallel_tool_calls",
    "previous_response_id",
    "prompt",
    "prompt_cache_key",
    "prompt_cache_options",
    "prompt_cache_retention",
    "reasoning",
    "safety_identifier",
    "service_tier",
    "store",
    "stream",
    "stream_options",
    "temperature",
    "text",
    "tool_choice",
    "tools",
    "top_logprobs",
    "top_p",
    "truncation",
    "user",
];

/// Checks a parsed request body.
pub(crate) fn body(body: &Value) -> Result<(), ApiFailure> {
    let Some(obj) = body.as_object() else {
        return Err(ApiFailure::invalid("The request body must be a JSON object.", None, None));
    };
    if let Some(key) = obj.keys().find(|k| !KNOWN.contains(&k.as_str())) {
        return Err(ApiFailure::invalid(
            format!("Unknown parameter: '{key}'."),
            Some(key),
            Some("unknown_parameter"),
        ));
    }
    match obj.get("model") {
        None => return Err(ApiFailure::missing("model")),
        Some(Value::String(m)) if !m.is_empty() => {}
        Some(other) => return Err(ApiFailure::invalid_type("model", "a non-empty string", other)),
    }
    scalars(obj)?;
    match obj.get("input") {
        None => return Err(ApiFailure::missing("input")),
        Some(Value::String(_)) => {}
        Some(Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                validate_input::item(i, item)?;
            }
        }
        Some(other) => {
            return Err(ApiFailure::invalid_type("input", "a string or an array", other))
        }
    }
    let names = match obj.get("tools") {
        None | Some(Value::Null) => Vec::new(),
        Some(tools) => function_names(tools)?,
    };
    match obj.get("tool_choice") {
        None | Some(Value::Null) => Ok(()),
        Some(choice) => tool_choice(choice, &names),
    }
}

fn scalars(obj: &Map<String, Value>) -> Result<(), ApiFailure> {
    for (key, max) in [("temperature", 2.0), ("top_p", 1.0)] {
        match obj.get(key) {
            None | Some(Value::Null) => {}
            Some(Value::Number(n)) => {
                let v = n.as_f64().unwrap_or(f64::NAN);
                if v > max {
                    let message =
                        format!("Invalid '{key}': decimal above maximum value. Expected a value <= {max}, but got {v} instead.");
                    return Err(ApiFailure::invalid(
                        message,
                        Some(key),
                        Some("decimal_above_max_value"),
                    ));
                }
                if v < 0.0 || v.is_nan() {
                    let message =
                        format!("Invalid '{key}': decimal below minimum value. Expected a value >= 0, but got {v} instead.");
                    return Err(ApiFailure::invalid(
                        message,
                        Some(key),
                        Some("decimal_below_min_value"),
                    ));
                }
            }
            Some(other) => return Err(ApiFailure::invalid_type(key, "a decimal", other)),
        }
    }
    match obj.get("max_output_tokens") {
        None | Some(Value::Null) => {}
        Some(Value::Number(n)) if n.as_u64().is_some_and(|v| v >= 16) => {}
        Some(Value::Number(n)) if n.is_i64() || n.is_u64() => {
            let message = format!(
                "Invalid 'max_output_tokens': integer below minimum value. Expected a value >= 16, but got {n} instead."
            );
            return Err(ApiFailure::invalid(
                message,
                Some("max_output_tokens"),
                Some("integer_below_min_value"),
            ));
        }
        Some(other) => {
            return Err(ApiFailure::invalid_type("max_output_tokens", "an integer", other))
        }
    }
    for key in ["stream", "store", "parallel_tool_calls", "background"] {
        if let Some(v) = obj.get(key).filter(|v| !v.is_null() && !v.is_boolean()) {
            return Err(ApiFailure::invalid_type(key, "a boolean", v));
        }
    }
    if let Some(v) = obj.get("instructions").filter(|v| !v.is_null() && !v.is_string()) {
        return Err(ApiFailure::invalid_type("instructions", "a string", v));
    }
    match obj.get("previous_response_id") {
        None | Some(Value::Null) => {}
        Some(Value::String(id)) => {
            if id.is_empty()
                || !id.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            {
                let message = format!(
                    "Invalid 'previous_response_id': '{id}'. Expected an ID that contains letters, numbers, \
                     underscores, or dashes, but this value contained additional characters."
                );
                return Err(ApiFailure::invalid(
                    message,
                    Some("previous_response_id"),
                    Some("invalid_value"),
                ));
            }
            if obj.get("conversation").is_some_and(|c| !c.is_null()) {
                return Err(ApiFailure::invalid(
                    "Mutually exclusive parameters: Ensure you are only providing one of: 'previous_response_id' or 'conversation'.",
                    None,
                    Some("mutually_exclusive_parameters"),
                ));
            }
        }
        Some(other) => {
            return Err(ApiFailure::invalid_type("previous_response_id", "a string", other))
        }
    }
    Ok(())
}

/// Checks `tools` and returns the names of its function tools, in order.
fn function_names(tools: &Value) -> Result<Vec<&str>, ApiFailure> {
    let Some(tools) = tools.as_array() else {
        return Err(ApiFailure::invalid_type("tools", "an array", tools));
    };
    let mut names = Vec::new();
    for (k, tool) in tools.iter().enumerate() {
        let p = format!("tools[{k}]");
        let Some(obj) = tool.as_object() else {
            return Err(ApiFailure::invalid_type(&p, "an object", tool));
        };
        let Some(kind) = obj.get("type").and_then(Value::as_str) else {
            return Err(ApiFailure::missing(&format!("{p}.type")));
        };
        if kind != "function" {
            continue;
        }
        // The nested Chat Completions shape has no top-level name, and this is what the API says.
        let Some(name) = obj.get("name").and_then(Value::as_str) else {
            return Err(ApiFailure::missing(&format!("{p}.name")));
        };
        let valid = !name.is_empty()
            && name.len() <= 64
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !valid {
            let message = format!(
                "Invalid '{p}.name': string does not match pattern. Expected a string that matches the pattern '^[a-zA-Z0-9_-]+$'."
            );
            return Err(ApiFailure::invalid(
                message,
                Some(&format!("{p}.name")),
                Some("invalid_value"),
            ));
        }
        if let Some(params) = obj.get("parameters").filter(|v| !v.is_null() && !v.is_object()) {
            return Err(ApiFailure::invalid_type(&format!("{p}.parameters"), "an object", params));
        }
        names.push(name);
    }
    Ok(names)
}

fn tool_choice(choice: &Value, names: &[&str]) -> Result<(), ApiFailure> {
    match choice {
        Value::String(mode) if ["none", "auto", "required"].contains(&mode.as_str()) => Ok(()),
        Value::String(mode) => {
            Err(ApiFailure::invalid_value("tool_choice", mode, "'none', 'auto', and 'required'"))
        }
        Value::Object(obj) => match obj.get("type").and_then(Value::as_str) {
            None => Err(ApiFailure::missing("tool_choice.type")),
            Some("function") => {
                // `{"type":"function","function":{"name":…}}` (Chat Completions) lands here too.
                let Some(name) = obj.get("name").and_then(Value::as_str) else {
                    return Err(ApiFailure::missing("tool_choice.name"));
                };
                if names.contains(&name) {
                    Ok(())
                } else {
                    let message = format!("Tool choice '{name}' not found in 'tools' parameter.");
                    Err(ApiFailure::invalid(message, Some("tool_choice"), None))
                }
            }
            Some(kind @ "tool") => Err(ApiFailure::invalid_value(
                "tool_choice.type",
                kind,
                "'file_search', 'web_search_preview', 'computer_use_preview', 'code_interpreter', \
                 'image_generation', 'mcp', 'function', 'custom', and 'allowed_tools'",
            )),
            Some(_) => Ok(()),
        },
        other => Err(ApiFailure::invalid_type("tool_choice", "a string or an object", other)),
    }
}

/// Checks `function_call_output` items against the calls they answer: every call of the
/// previous response needs an output, and every output needs a call (in the previous response
/// or among this request's replayed `function_call` items).
pub(crate) fn tool_outputs(body: &Value, prev: Option<&Stored>) -> Result<(), ApiFailure> {
    let items = body.get("input").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    let ids_of = |kind: &str| -> Vec<&str> {
        items
            .iter()
            .filter(|i| i.get("type").and_then(Value::as_str) == Some(kind))
            .filter_map(|i| i.get("call_id").and_then(Value::as_str))
            .collect()
    };
    let (outputs, replayed) = (ids_of("function_call_output"), ids_of("function_call"));
    let pending = prev.map(|p| p.pending_calls.as_slice()).unwrap_or_default();
    if let Some(missing) = pending.iter().find(|c| !outputs.contains(&c.as_str())) {
        return Err(ApiFailure::invalid(
            format!("No tool output found for function call {missing}."),
            Some("input"),
            None,
        ));
    }
    if let Some(orphan) =
        outputs.iter().find(|o| !pending.iter().any(|c| c == *o) && !replayed.contains(o))
    {
        let message = format!("No tool call found for function call output with call_id {orphan}.");
        return Err(ApiFailure::invalid(message, Some("input"), None));
    }
    Ok(())
}
