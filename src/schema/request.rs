//! The request schema: a User Turn Request or a Tool Continuation Submission (AGN-034 §2),
//! never both, with the field rules of `docs/contract.md` and the default `[limits]`.
//!
//! Built from the schema of the wire type ([`AgentExecuteRequest`], every property optional so
//! that validation can name what is missing) without touching that type: its property
//! descriptions are kept, and the types, required fields and bounds are stated here.

use schemars::{schema_for, Schema};
use serde_json::{json, Map, Value};

use super::{object_at, refine_property, session_id, to_value, turn_id};
use crate::contracts::AgentExecuteRequest;
use crate::rules::Limits;

/// What a context id may be (`crate::contracts::ContextId`).
const CONTEXT_ID_PATTERN: &str = "^[A-Za-z0-9._:-]{1,64}$";
/// Not absolute (`/`, `\`), no drive letter, no `..` segment, no NUL (`RelativePath`).
const RELATIVE_PATH_PATTERN: &str =
    r"^(?![/\\])(?![A-Za-z]:)(?!(?:.*[/\\])?\.\.(?:[/\\]|$))[^\u0000]+$";
/// Characters of standard base64, line breaks allowed (MIME style).
const BASE64_PATTERN: &str = r"^[A-Za-z0-9+/=\s]*$";
/// Some character that is not white space.
const NOT_BLANK: &str = r"\S";

/// The request schema.
pub(super) fn schema() -> Schema {
    let generated = to_value(schema_for!(AgentExecuteRequest));
    let limits = Limits::default();
    let mut props = object_at(&generated, "/properties");
    top_level(&mut props, &limits);
    // A continuation and an approval: the turn's ids and their one list, taken out of the user
    // turn's properties.
    let mut answer = |list: &str| -> Map<String, Value> {
        let answers = props.remove(list).unwrap_or_default();
        [
            ("SessionId", props.get("SessionId").cloned().unwrap_or_default()),
            ("TurnId", props.get("TurnId").cloned().unwrap_or_default()),
            (list, answers),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    };
    let continuation_props = answer("ToolResults");
    let approval_props = answer("ToolApprovals");
    let defs = json!({
        "UserTurnRequest": {
            "description": "AGN-034 §2.1: starts a turn. SessionId, TurnId and at least one of a non-blank \
                Instruction, a non-empty InputArtifacts or a non-empty ClipboardImages.",
            "type": "object",
            "properties": props,
            "required": ["SessionId", "TurnId"],
            "anyOf": [
                { "required": ["Instruction"], "properties": { "Instruction": { "pattern": NOT_BLANK } } },
                { "required": ["InputArtifacts"], "properties": { "InputArtifacts": { "minItems": 1 } } },
                { "required": ["ClipboardImages"], "properties": { "ClipboardImages": { "minItems": 1 } } }
            ],
            "additionalProperties": false
        },
        "ToolContinuationSubmission": {
            "description": "AGN-034 §2.2: answers the ToolCalls of a `client_tool_continuation` reply of the \
                turn SessionId + TurnId; nothing but these three properties. ToolResults match the ToolCalls \
                exactly: same count, same ToolCallIds, same order.",
            "type": "object",
            "properties": continuation_props,
            "required": ["SessionId", "TurnId", "ToolResults"],
            "additionalProperties": false
        },
        "ToolApprovalSubmission": {
            "description": "Protocol version 3 (docs/tools.md, \"Approvals\"): answers the ToolCalls of a \
                `tool_approval_required` reply of the turn SessionId + TurnId; nothing but these three \
                properties. ToolApprovals match the ToolCalls exactly: same count, same ToolCallIds, same order.",
            "type": "object",
            "properties": approval_props,
            "required": ["SessionId", "TurnId", "ToolApprovals"],
            "additionalProperties": false
        },
        "ToolApproval": tool_approval(&generated),
        "InputArtifact": input_artifact(&generated, &limits),
        "ClipboardImage": clipboard_image(&generated),
        "RagScopeCondition": rag_scope_condition(&generated),
        "ToolResult": tool_result(&generated, &limits),
    });
    super::from_value(json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "AgentExecuteRequest",
        "description": "An AgentExecuteRequest (AGN-034): a User Turn Request, a Tool Continuation \
            Submission or a Tool Approval Submission, told apart by the properties present (ToolResults makes a \
            continuation, ToolApprovals an approval). Size and \
            count bounds are the defaults of `aptix.example.toml` [limits]; a server may be configured \
            with others, and byte limits on decoded contents are checked by the server only. \
            See docs/contract.md.",
        "oneOf": [
            { "$ref": "#/$defs/UserTurnRequest" },
            { "$ref": "#/$defs/ToolContinuationSubmission" },
            { "$ref": "#/$defs/ToolApprovalSubmission" }
        ],
        "$defs": defs,
    }))
}

fn top_level(props: &mut Map<String, Value>, l: &Limits) {
    let array_of = |def: &str, max: usize| json!({ "type": "array", "items": { "$ref": format!("#/$defs/{def}") }, "maxItems": max });
    let text = |max: usize| json!({ "type": "string", "maxLength": max });
    let context_id =
        json!({ "type": "string", "minLength": 1, "maxLength": 64, "pattern": CONTEXT_ID_PATTERN });
    let rules = [
        ("SessionId", session_id()),
        ("TurnId", turn_id()),
        ("Instruction", text(l.max_instruction_chars)),
        ("InputArtifacts", array_of("InputArtifact", l.max_artifacts)),
        ("ClipboardImages", array_of("ClipboardImage", l.max_images)),
        ("RagScope", array_of("RagScopeCondition", l.max_rag_scope_conditions)),
        ("SolutionContextText", text(l.max_solution_context_chars)),
        ("WorkspaceId", text(l.max_hint_chars)),
        ("Repo", text(l.max_hint_chars)),
        ("Language", text(l.max_hint_chars)),
        ("Stream", json!({ "type": "boolean", "default": false })),
        ("AgentContextId", context_id.clone()),
        ("ConversationContextId", context_id),
        (
            "FollowUp",
            json!({ "type": "string", "enum": ["enqueue", "reject", "interrupt", "steer"] }),
        ),
        ("ToolResults", {
            let mut results = array_of("ToolResult", l.max_tool_results);
            results["minItems"] = json!(1);
            results
        }),
        ("ToolApprovals", {
            let mut approvals = array_of("ToolApproval", l.max_tool_results);
            approvals["minItems"] = json!(1);
            approvals
        }),
    ];
    for (name, rule) in rules {
        refine_property(props, name, rule);
    }
}

/// A generated `$defs` entry with its properties rewritten by `rules`, closed, and `required`.
fn object_def(generated: &Value, def: &str, rules: Vec<(&str, Value)>, required: &[&str]) -> Value {
    let source = generated.pointer(&format!("/$defs/{def}")).cloned().unwrap_or_default();
    let mut props = object_at(&source, "/properties");
    for (name, rule) in rules {
        refine_property(&mut props, name, rule);
    }
    json!({
        "description": super::description_of(&source),
        "type": "object",
        "properties": props,
        "required": required,
        "additionalProperties": false
    })
}

fn input_artifact(generated: &Value, l: &Limits) -> Value {
    let mut def = object_def(
        generated,
        "InputArtifactWire",
        vec![
            (
                "RelativePath",
                json!({ "type": "string", "minLength": 1, "pattern": RELATIVE_PATH_PATTERN }),
            ),
            ("FileName", json!({ "type": "string", "pattern": NOT_BLANK })),
            ("Contents", json!({ "type": "string" })),
            ("Origin", json!({ "type": "string", "enum": ["ide", "user"] })),
            ("MimeType", json!({ "type": "string" })),
            ("Language", json!({ "type": "string" })),
            (
                "Encoding",
                json!({ "type": "string", "enum": ["utf8", "base64"], "default": "utf8" }),
            ),
        ],
        &["RelativePath", "FileName", "Contents", "Origin"],
    );
    // Base64 contents must at least be made of base64 characters; the server decodes them.
    def["if"] =
        json!({ "required": ["Encoding"], "properties": { "Encoding": { "const": "base64" } } });
    def["then"] = json!({ "properties": { "Contents": { "pattern": BASE64_PATTERN, "contentEncoding": "base64" } } });
    def["description"] = json!(format!(
        "One file of InputArtifacts. Contents is at most {} bytes once decoded (limits.max_artifact_bytes).",
        l.max_artifact_bytes
    ));
    def
}

fn clipboard_image(generated: &Value) -> Value {
    object_def(
        generated,
        "ClipboardImageWire",
        vec![
            ("Id", json!({ "type": "string", "minLength": 1 })),
            (
                "MimeType",
                json!({ "type": "string", "pattern": r"^\s*[Ii][Mm][Aa][Gg][Ee]/[^/;\s]+\s*$" }),
            ),
            (
                "DataBase64",
                json!({ "type": "string", "minLength": 1, "pattern": BASE64_PATTERN, "contentEncoding": "base64" }),
            ),
        ],
        &["Id", "MimeType", "DataBase64"],
    )
}

fn rag_scope_condition(generated: &Value) -> Value {
    object_def(
        generated,
        "RagScopeConditionWire",
        vec![
            ("Key", json!({ "type": "string", "pattern": NOT_BLANK })),
            (
                "Operator",
                json!({ "type": "string", "enum": ["==", "!=", "contains", "does_not_contain"] }),
            ),
            (
                "Values",
                json!({ "type": "array", "items": { "type": "string", "minLength": 1 }, "minItems": 1 }),
            ),
        ],
        &["Key", "Operator", "Values"],
    )
}

fn tool_result(generated: &Value, l: &Limits) -> Value {
    let mut def = object_def(
        generated,
        "ToolResultWire",
        vec![
            ("ToolCallId", json!({ "type": "string", "minLength": 1 })),
            ("ExecutionMs", json!({ "type": "integer", "minimum": 0 })),
            ("ResultJson", json!({ "type": "string", "contentMediaType": "application/json" })),
            ("ErrorMessage", json!({ "type": "string" })),
        ],
        &["ToolCallId", "ExecutionMs"],
    );
    def["oneOf"] = json!([{ "required": ["ResultJson"] }, { "required": ["ErrorMessage"] }]);
    def["description"] = json!(format!(
        "The result of one ToolCall: exactly one of ResultJson (a string holding a JSON document) and \
         ErrorMessage, each at most {} bytes (limits.max_tool_result_bytes).",
        l.max_tool_result_bytes
    ));
    def
}

/// One decision of `ToolApprovals`: a `Message` only on a denial.
fn tool_approval(generated: &Value) -> Value {
    let max = crate::contracts::approval::MAX_DENIAL_MESSAGE_CHARS;
    let mut def = object_def(
        generated,
        "ToolApprovalWire",
        vec![
            ("ToolCallId", json!({ "type": "string", "minLength": 1 })),
            ("Approved", json!({ "type": "boolean" })),
            ("Message", json!({ "type": "string", "maxLength": max })),
        ],
        &["ToolCallId", "Approved"],
    );
    def["if"] = json!({ "properties": { "Approved": { "const": true } } });
    def["then"] = json!({ "not": { "required": ["Message"] } });
    def
}
