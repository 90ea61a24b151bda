//! The AGN-034 rules, applied to the wire request and producing validated types.
//! Every failure is collected so the client sees all of them at once. What a user turn
//! attaches (artifacts and images) is checked in `attachments`.

use std::collections::HashSet;

use super::attachments::{artifacts, images};
use super::errors::Errors;
use super::skim::Skip;
use super::{text, Limits};
use crate::contracts::ids::clip;
use crate::contracts::request::{RagScopeConditionWire, ToolResultWire};
use crate::contracts::validated::{
    ClipboardImage, InputArtifact, ScopeCondition, ScopeOperator, ToolContinuation, TurnKey, UserTurn,
};
use crate::contracts::{
    AgentExecuteRequest, ContextId, ErrorCode, SessionId, ToolOutcome, ToolResult, TurnId, ValidatedRequest,
};

/// Applies every rule to `w`, recording failures in `e`; the validated request when `e` ends up
/// empty (errors recorded before the call, such as unknown property names, count too).
pub(super) fn check(w: AgentExecuteRequest, limits: &Limits, e: &mut Errors) -> Option<ValidatedRequest> {
    text::nul_characters(&w, e);
    let session_id = parse_or(e, "SessionId", w.session_id.as_deref(), ErrorCode::SessionIdMissing, |s| {
        s.parse::<SessionId>()
    });
    let turn_id =
        parse_or(e, "TurnId", w.turn_id.as_deref(), ErrorCode::TurnIdMissing, |s| s.parse::<TurnId>());
    let result = if w.tool_results.is_some() {
        continuation(e, w, limits).map(|results| (results, None))
    } else {
        user_turn_parts(e, w, limits).map(|parts| (Vec::new(), Some(parts)))
    };
    match (session_id, turn_id, result) {
        (Some(session_id), Some(turn_id), Some((results, parts))) if e.is_empty() => {
            let key = TurnKey { session_id, turn_id };
            Some(match parts {
                Some(p) => ValidatedRequest::UserTurn(p.into_turn(key)),
                None => ValidatedRequest::ToolContinuation(ToolContinuation { key, results }),
            })
        }
        _ => None,
    }
}

fn parse_or<T>(
    e: &mut Errors,
    field: &str,
    raw: Option<&str>,
    missing: ErrorCode,
    parse: impl FnOnce(&str) -> Result<T, (ErrorCode, String)>,
) -> Option<T> {
    match raw {
        None => {
            e.at(missing, field, format!("{field} is required"));
            None
        }
        Some(s) => parse(s).map_err(|(code, msg)| e.at(code, field, msg)).ok(),
    }
}

fn continuation(e: &mut Errors, w: AgentExecuteRequest, limits: &Limits) -> Option<Vec<ToolResult>> {
    let present = [
        ("Instruction", w.instruction.is_some()),
        ("InputArtifacts", w.input_artifacts.is_some()),
        ("ClipboardImages", w.clipboard_images.is_some()),
        ("RagScope", w.rag_scope.is_some()),
        ("SolutionContextText", w.solution_context_text.is_some()),
        ("WorkspaceId", w.workspace_id.is_some()),
        ("Repo", w.repo.is_some()),
        ("Language", w.language.is_some()),
        ("Stream", w.stream.is_some()),
        ("AgentContextId", w.agent_context_id.is_some()),
        ("ConversationContextId", w.conversation_context_id.is_some()),
    ];
    for (field, _) in present.iter().filter(|(_, p)| *p) {
        e.at(
            ErrorCode::ContinuationFieldForbidden,
            *field,
            format!("a Tool Continuation Submission carries only SessionId, TurnId and ToolResults; remove `{field}`"),
        );
    }
    let wires = w.tool_results.unwrap_or_default();
    if wires.is_empty() {
        e.at(ErrorCode::ToolResultsEmpty, "ToolResults", "ToolResults is present but empty");
        return None;
    }
    e.limit("ToolResults", "results", wires.len(), "max_tool_results", limits.max_tool_results);
    let mut seen = HashSet::new();
    let results: Vec<Option<ToolResult>> =
        wires.into_iter().enumerate().map(|(i, r)| tool_result(e, i, r, &mut seen, limits)).collect();
    results.into_iter().collect()
}

fn tool_result(
    e: &mut Errors,
    i: usize,
    r: ToolResultWire,
    seen: &mut HashSet<String>,
    limits: &Limits,
) -> Option<ToolResult> {
    let f = |name: &str| format!("ToolResults[{i}].{name}");
    let id = match r.tool_call_id.filter(|s| !s.is_empty()) {
        None => {
            e.at(ErrorCode::ToolCallIdMissing, f("ToolCallId"), "ToolCallId is required");
            None
        }
        Some(id) if e.chars_limit(&f("ToolCallId"), &id, "max_name_chars", limits.max_name_chars) => None,
        Some(id) if !seen.insert(id.clone()) => {
            e.at(
                ErrorCode::ToolCallIdDuplicate,
                f("ToolCallId"),
                format!("ToolCallId `{}` appears more than once", clip(&id)),
            );
            None
        }
        Some(id) => Some(id),
    };
    if r.execution_ms.is_none() {
        e.at(ErrorCode::ExecutionMsMissing, f("ExecutionMs"), "ExecutionMs is required");
    }
    let outcome = match (r.result_json, r.error_message) {
        (Some(json), None) => {
            e.limit(
                &f("ResultJson"),
                "bytes",
                json.len(),
                "max_tool_result_bytes",
                limits.max_tool_result_bytes,
            );
            // Checked without building it: a tree of a large document costs many times its size.
            match serde_json::from_str::<Skip>(&json) {
                Ok(_) => Some(ToolOutcome::ResultJson(json)),
                Err(err) => {
                    e.at(
                        ErrorCode::ToolResultJsonInvalid,
                        f("ResultJson"),
                        format!("ResultJson is not valid JSON: {err}"),
                    );
                    None
                }
            }
        }
        (None, Some(msg)) => {
            e.limit(
                &f("ErrorMessage"),
                "bytes",
                msg.len(),
                "max_tool_result_bytes",
                limits.max_tool_result_bytes,
            );
            Some(ToolOutcome::ErrorMessage(msg))
        }
        (both, _) => {
            let which = if both.is_some() { "both" } else { "neither" };
            e.at(
                ErrorCode::ToolResultOutcome,
                format!("ToolResults[{i}]"),
                format!("a tool result has exactly one of ResultJson and ErrorMessage; this one has {which}"),
            );
            None
        }
    };
    Some(ToolResult { tool_call_id: id?, execution_ms: r.execution_ms?, outcome: outcome? })
}

struct UserTurnParts {
    instruction: Option<String>,
    artifacts: Vec<InputArtifact>,
    images: Vec<ClipboardImage>,
    rag_scope: Vec<ScopeCondition>,
    rest: AgentExecuteRequest,
    agent_context_id: Option<ContextId>,
    conversation_context_id: Option<ContextId>,
}

impl UserTurnParts {
    fn into_turn(self, key: TurnKey) -> UserTurn {
        let r = self.rest;
        UserTurn {
            key,
            instruction: self.instruction,
            artifacts: self.artifacts,
            images: self.images,
            rag_scope: self.rag_scope,
            solution_context: r.solution_context_text,
            workspace_id: r.workspace_id,
            repo: r.repo,
            language: r.language,
            stream: r.stream.unwrap_or(false),
            agent_context_id: self.agent_context_id,
            conversation_context_id: self.conversation_context_id,
        }
    }
}

fn user_turn_parts(e: &mut Errors, mut w: AgentExecuteRequest, limits: &Limits) -> Option<UserTurnParts> {
    let instruction = w.instruction.take().filter(|s| !s.trim().is_empty());
    if let Some(text) = &instruction {
        e.limit(
            "Instruction",
            "characters",
            text.chars().count(),
            "max_instruction_chars",
            limits.max_instruction_chars,
        );
    }
    if let Some(text) = &w.solution_context_text {
        let n = text.chars().count();
        e.limit(
            "SolutionContextText",
            "characters",
            n,
            "max_solution_context_chars",
            limits.max_solution_context_chars,
        );
    }
    for (field, value) in [("WorkspaceId", &w.workspace_id), ("Repo", &w.repo), ("Language", &w.language)] {
        if let Some(v) = value {
            e.limit(field, "characters", v.chars().count(), "max_hint_chars", limits.max_hint_chars);
        }
    }
    let artifacts = artifacts(e, w.input_artifacts.take().unwrap_or_default(), limits);
    let images = images(e, w.clipboard_images.take().unwrap_or_default(), limits);
    let rag_scope = rag_scope(e, w.rag_scope.take().unwrap_or_default(), limits);
    if instruction.is_none()
        && artifacts.as_ref().is_some_and(Vec::is_empty)
        && images.as_ref().is_some_and(Vec::is_empty)
    {
        e.at(
            ErrorCode::InstructionMissing,
            "Instruction",
            "a user turn needs at least one of Instruction, InputArtifacts or ClipboardImages",
        );
    }
    let agent_context_id = context_id(e, "AgentContextId", w.agent_context_id.take());
    let conversation_context_id = context_id(e, "ConversationContextId", w.conversation_context_id.take());
    Some(UserTurnParts {
        instruction,
        artifacts: artifacts?,
        images: images?,
        rag_scope: rag_scope?,
        rest: w,
        agent_context_id: agent_context_id?,
        conversation_context_id: conversation_context_id?,
    })
}

fn context_id(e: &mut Errors, field: &str, raw: Option<String>) -> Option<Option<ContextId>> {
    match raw.map(|s| s.parse::<ContextId>()) {
        None => Some(None),
        Some(Ok(id)) => Some(Some(id)),
        Some(Err(msg)) => {
            e.at(ErrorCode::ContextIdInvalid, field, msg);
            None
        }
    }
}

fn rag_scope(
    e: &mut Errors,
    wires: Vec<RagScopeConditionWire>,
    limits: &Limits,
) -> Option<Vec<ScopeCondition>> {
    e.limit(
        "RagScope",
        "conditions",
        wires.len(),
        "max_rag_scope_conditions",
        limits.max_rag_scope_conditions,
    );
    let parsed: Vec<Option<ScopeCondition>> = wires
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            let f = |name: &str| format!("RagScope[{i}].{name}");
            let key = c.key.filter(|k| !k.trim().is_empty());
            let key_ok = match &key {
                None => {
                    e.at(ErrorCode::RagScopeKeyMissing, f("Key"), "Key is required");
                    false
                }
                Some(k) => !e.chars_limit(&f("Key"), k, "max_name_chars", limits.max_name_chars),
            };
            let operator = c.operator.as_deref().and_then(ScopeOperator::parse);
            if operator.is_none() {
                let got = c
                    .operator
                    .as_deref()
                    .map_or("nothing".to_owned(), |o| format!("`{}`", crate::contracts::ids::clip(o)));
                e.at(
                    ErrorCode::RagScopeOperatorInvalid,
                    f("Operator"),
                    format!("Operator must be one of `==`, `!=`, `contains`, `does_not_contain`; got {got}"),
                );
            }
            let values = c.values.unwrap_or_default();
            let values_ok = scope_values(e, i, &values, limits);
            Some(ScopeCondition {
                key: key.filter(|_| key_ok)?,
                operator: operator?,
                values: values_ok.then_some(values)?,
            })
        })
        .collect();
    parsed.into_iter().collect()
}

/// One condition's `Values`: at least one, none empty, within the count and length limits.
fn scope_values(e: &mut Errors, i: usize, values: &[String], limits: &Limits) -> bool {
    let field = format!("RagScope[{i}].Values");
    let mut ok = !values.is_empty() && values.iter().all(|v| !v.is_empty());
    if !ok {
        e.at(
            ErrorCode::RagScopeValuesEmpty,
            field.as_str(),
            "Values needs at least one value, and no value may be empty",
        );
    }
    ok &= !e.limit(&field, "values", values.len(), "max_rag_scope_values", limits.max_rag_scope_values);
    let max = limits.max_rag_scope_value_chars;
    for (j, v) in values.iter().enumerate().filter(|(_, v)| v.len() > max) {
        ok &= !e.chars_limit(&format!("{field}[{j}]"), v, "max_rag_scope_value_chars", max);
    }
    ok
}
