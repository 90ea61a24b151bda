//! The reply schema: an `InvokeResult` (a success with a result and no errors, or a failure
//! with errors and a null result) whose `AgentExecuteResponse` carries exactly the buckets its
//! `Kind` allows (AGN-033 §3.4): every other bucket is refused, empty or not.
//!
//! The parts come from the schema schemars generates for [`Reply`]; the response is then
//! re-assembled as one closed object per `Kind`, because `#[serde(flatten)]` of the outcome
//! leaves the generated object open (a `final` response with `ToolCalls` would pass).

use schemars::{schema_for, Schema};
use serde_json::{json, Map, Value};

use super::{object_at, refine_property, session_id, to_value, turn_id};
use crate::contracts::Reply;

/// The reply schema.
pub(super) fn schema() -> Schema {
    let generated = to_value(schema_for!(Reply));
    let defs = object_at(&generated, "/$defs");
    let response = defs.get("AgentExecuteResponse").cloned().unwrap_or_default();
    let mut meta = object_at(&response, "/properties");
    refine_property(&mut meta, "SessionId", session_id());
    refine_property(&mut meta, "TurnId", turn_id());
    refine_property(&mut meta, "ModeDisplayName", json!({ "type": "string" }));
    let branch = |kind: &str| -> Value {
        let branches = response.get("oneOf").and_then(Value::as_array).cloned().unwrap_or_default();
        branches
            .into_iter()
            .find(|b| b.pointer("/properties/Kind/const") == Some(&json!(kind)))
            .unwrap_or_default()
    };
    let (final_branch, tools_branch) = (branch("final"), branch("client_tool_continuation"));
    let approval_branch = branch("tool_approval_required");
    let mut out = defs.clone();
    out.insert("AgentExecuteResponse".into(), agent_execute_response(&response));
    out.insert("FinalResponse".into(), final_response(&meta, &final_branch));
    out.insert(
        "ClientToolContinuationResponse".into(),
        tool_continuation_response(&meta, &tools_branch),
    );
    out.insert("ToolApprovalRequiredResponse".into(), approval_response(&meta, &approval_branch));
    out.insert("ToolResult".into(), server_tool_result(defs.get("ToolResult")));
    if let Some(api_error) = out.get_mut("ApiError").and_then(|e| e.get_mut("properties")) {
        if let Some(props) = api_error.as_object_mut() {
            refine_property(props, "Field", json!({ "type": "string" }));
        }
    }
    if let Some(props) =
        out.get_mut("FileRef").and_then(|f| f.get_mut("properties")).and_then(Value::as_object_mut)
    {
        refine_property(props, "Description", json!({ "type": "string" }));
        refine_property(props, "ContentExpires", json!({ "type": "string" }));
    }
    let mut envelope = object_at(&generated, "/properties");
    refine_property(&mut envelope, "Successful", json!({ "type": "boolean" }));
    refine_property(
        &mut envelope,
        "Result",
        json!({ "anyOf": [{ "$ref": "#/$defs/AgentExecuteResponse" }, { "type": "null" }] }),
    );
    refine_property(
        &mut envelope,
        "Errors",
        json!({ "type": "array", "items": { "$ref": "#/$defs/ApiError" } }),
    );
    refine_property(
        &mut envelope,
        "Warnings",
        json!({ "type": "array", "items": { "$ref": "#/$defs/ApiError" } }),
    );
    refine_property(&mut envelope, "SessionId", session_id());
    refine_property(&mut envelope, "TurnId", turn_id());
    super::from_value(json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "InvokeResult",
        "description": "Every reply on a session's reply queue (`type` = `reply`): an InvokeResult wrapping an \
            AgentExecuteResponse (AGN-033). Successful with a Result and no Errors, or not successful with \
            Errors and a null Result. SessionId and TurnId name the turn the reply concerns, and \
            are absent only when the request named no valid one. See docs/contract.md.",
        "type": "object",
        "properties": envelope,
        "required": ["Successful", "Result", "Errors", "Warnings"],
        "additionalProperties": false,
        "oneOf": [
            {
                "title": "success",
                "properties": {
                    "Successful": { "const": true },
                    "Result": { "$ref": "#/$defs/AgentExecuteResponse" },
                    "Errors": { "maxItems": 0 }
                }
            },
            {
                "title": "failure",
                "properties": {
                    "Successful": { "const": false },
                    "Result": { "type": "null" },
                    "Errors": { "minItems": 1 }
                }
            }
        ],
        "$defs": out,
    }))
}

fn agent_execute_response(generated: &Value) -> Value {
    json!({
        "description": super::description_of(generated),
        "oneOf": [
            { "$ref": "#/$defs/FinalResponse" },
            { "$ref": "#/$defs/ClientToolContinuationResponse" },
            { "$ref": "#/$defs/ToolApprovalRequiredResponse" }
        ]
    })
}

/// Session metadata plus `buckets`, closed: a bucket not listed is forbidden.
fn closed_response(
    description: &str,
    meta: &Map<String, Value>,
    kind: &str,
    buckets: Map<String, Value>,
    required: &[&str],
) -> Value {
    let mut props = meta.clone();
    props.insert("Kind".into(), json!({ "type": "string", "const": kind }));
    props.extend(buckets);
    let mut all_required = vec!["SessionId", "TurnId", "ModeDisplayName", "Kind"];
    all_required.extend_from_slice(required);
    json!({
        "description": description,
        "type": "object",
        "properties": props,
        "required": all_required,
        "additionalProperties": false
    })
}

fn final_response(meta: &Map<String, Value>, branch: &Value) -> Value {
    let mut b = object_at(branch, "/properties");
    let non_empty = |def: &str| json!({ "type": "array", "items": { "$ref": format!("#/$defs/{def}") }, "minItems": 1 });
    refine_property(&mut b, "PrimaryOutputText", json!({ "type": "string" }));
    refine_property(&mut b, "Files", non_empty("FileRef"));
    refine_property(&mut b, "ToolResults", non_empty("ToolResult"));
    refine_property(&mut b, "UserWarnings", non_empty("UserWarning"));
    refine_property(&mut b, "Usage", json!({ "$ref": "#/$defs/Usage" }));
    b.remove("Kind");
    closed_response(
        "Kind `final` (AGN-033 §3.4): PrimaryOutputText required; Files, ToolResults, UserWarnings and Usage \
         allowed, absent when empty; ToolCalls and ToolContinuationMessage forbidden. The turn is over.",
        meta,
        "final",
        b,
        &["PrimaryOutputText"],
    )
}

fn tool_continuation_response(meta: &Map<String, Value>, branch: &Value) -> Value {
    let mut b = object_at(branch, "/properties");
    refine_property(
        &mut b,
        "ToolCalls",
        json!({ "type": "array", "items": { "$ref": "#/$defs/ToolCall" }, "minItems": 1 }),
    );
    refine_property(&mut b, "ToolContinuationMessage", json!({ "type": "string" }));
    b.remove("Kind");
    closed_response(
        "Kind `client_tool_continuation` (AGN-033 §3.4): ToolCalls (one or more, in order) required; \
         ToolContinuationMessage allowed (informational only); PrimaryOutputText, ToolResults, Files, \
         UserWarnings and Usage forbidden. The turn waits for a Tool Continuation Submission.",
        meta,
        "client_tool_continuation",
        b,
        &["ToolCalls"],
    )
}

fn approval_response(meta: &Map<String, Value>, branch: &Value) -> Value {
    let mut b = object_at(branch, "/properties");
    refine_property(
        &mut b,
        "ToolCalls",
        json!({ "type": "array", "items": { "$ref": "#/$defs/ToolCall" }, "minItems": 1 }),
    );
    refine_property(
        &mut b,
        "ApprovalExpiresAt",
        json!({ "type": "string", "format": "date-time" }),
    );
    refine_property(&mut b, "ToolContinuationMessage", json!({ "type": "string" }));
    b.remove("Kind");
    closed_response(
        "Kind `tool_approval_required` (protocol version 3, docs/tools.md \"Approvals\"): ToolCalls (one or \
         more server tool calls, in order) and ApprovalExpiresAt required; ToolContinuationMessage allowed \
         (informational only); PrimaryOutputText, ToolResults, Files, UserWarnings and Usage forbidden. The \
         turn waits for a Tool Approval Submission, or for the expiry, which denies every call.",
        meta,
        "tool_approval_required",
        b,
        &["ToolCalls", "ApprovalExpiresAt"],
    )
}

/// A tool the server ran itself, shown on a final response: `ResultJson` or `ErrorMessage`.
fn server_tool_result(generated: Option<&Value>) -> Value {
    let generated = generated.cloned().unwrap_or_default();
    let mut props = object_at(&generated, "/properties");
    refine_property(&mut props, "ToolCallId", json!({ "type": "string" }));
    refine_property(&mut props, "ExecutionMs", json!({ "type": "integer", "minimum": 0 }));
    props.insert(
        "ResultJson".into(),
        json!({ "description": "The tool's result, a JSON document.", "type": "string" }),
    );
    props.insert(
        "ErrorMessage".into(),
        json!({ "description": "Why the tool failed.", "type": "string" }),
    );
    json!({
        "description": super::description_of(&generated),
        "type": "object",
        "properties": props,
        "required": ["ToolCallId", "ExecutionMs"],
        "oneOf": [{ "required": ["ResultJson"] }, { "required": ["ErrorMessage"] }],
        "additionalProperties": false
    })
}
