//! The AGN-034 rules, applied to the wire request and producing validated types.
//! Every failure is collected so the client sees all of them at once. What a user turn
//! attaches (artifacts and images) is checked in `attachments`, tool results in `continuation`.

use super::attachments::{artifacts, images};
use super::continuation::continuation;
use super::errors::Errors;
use super::{text, Limits};
use crate::contracts::request::RagScopeConditionWire;
use crate::contracts::validated::{
    ClipboardImage, InputArtifact, ScopeCondition, ScopeOperator, ToolContinuation, TurnKey,
    UserTurn,
};
use crate::contracts::{
    AgentExecuteRequest, ContextId, ErrorCode, FollowUp, SessionId, TurnId, ValidatedRequest,
};

/// Applies every rule to `w`, recording failures in `e`; the validated request when `e` ends up
/// empty (errors recorded before the call, such as unknown property names, count too).
pub(super) fn check(
    w: AgentExecuteRequest,
    limits: &Limits,
    e: &mut Errors,
) -> Option<ValidatedRequest> {
    text::nul_characters(&w, e);
    let session_id =
        parse_or(e, "SessionId", w.session_id.as_deref(), ErrorCode::SessionIdMissing, |s| {
            s.parse::<SessionId>()
        });
    let turn_id = parse_or(e, "TurnId", w.turn_id.as_deref(), ErrorCode::TurnIdMissing, |s| {
        s.parse::<TurnId>()
    });
    let result = if w.tool_results.is_some() || w.tool_approvals.is_some() {
        continuation(e, w, limits).map(|answers| (answers, None))
    } else {
        user_turn_parts(e, w, limits).map(|parts| (Default::default(), Some(parts)))
    };
    match (session_id, turn_id, result) {
        (Some(session_id), Some(turn_id), Some(((results, approvals), parts))) if e.is_empty() => {
            let key = TurnKey { session_id, turn_id };
            Some(match parts {
                Some(p) => ValidatedRequest::UserTurn(p.into_turn(key)),
                None => {
                    ValidatedRequest::ToolContinuation(ToolContinuation { key, results, approvals })
                }
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

struct UserTurnParts {
    instruction: Option<String>,
    artifacts: Vec<InputArtifact>,
    images: Vec<ClipboardImage>,
    rag_scope: Vec<ScopeCondition>,
    rest: AgentExecuteRequest,
    agent_context_id: Option<ContextId>,
    conversation_context_id: Option<ContextId>,
    follow_up: Option<FollowUp>,
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
            follow_up: self.follow_up,
        }
    }
}

fn user_turn_parts(
    e: &mut Errors,
    mut w: AgentExecuteRequest,
    limits: &Limits,
) -> Option<UserTurnParts> {
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
    for (field, value) in
        [("WorkspaceId", &w.workspace_id), ("Repo", &w.repo), ("Language", &w.language)]
    {
        if let Some(v) = value {
            e.limit(
                field,
                "characters",
                v.chars().count(),
                "max_hint_chars",
                limits.max_hint_chars,
            );
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
    let conversation_context_id =
        context_id(e, "ConversationContextId", w.conversation_context_id.take());
    let follow_up = follow_up(e, w.follow_up.take());
    let extras = [
        ("InputArtifacts", artifacts.as_ref().is_some_and(|a| !a.is_empty())),
        ("ClipboardImages", images.as_ref().is_some_and(|i| !i.is_empty())),
        ("RagScope", rag_scope.as_ref().is_some_and(|r| !r.is_empty())),
        ("SolutionContextText", w.solution_context_text.is_some()),
    ];
    if let (Some(Some(FollowUp::Steer)), Some((field, _))) =
        (follow_up, extras.iter().find(|(_, present)| *present))
    {
        // Steering adds text to a running model call; what only a turn's own retrieval and
        // assembly use would be dropped, so it is refused instead.
        e.at(
            ErrorCode::FollowUpInvalid,
            "FollowUp",
            format!("a turn that steers carries only an Instruction, not {field}"),
        );
    }
    Some(UserTurnParts {
        instruction,
        artifacts: artifacts?,
        images: images?,
        rag_scope: rag_scope?,
        rest: w,
        agent_context_id: agent_context_id?,
        conversation_context_id: conversation_context_id?,
        follow_up: follow_up?,
    })
}

fn follow_up(e: &mut Errors, raw: Option<String>) -> Option<Option<FollowUp>> {
    match raw.map(|s| s.parse::<FollowUp>().map_err(|()| s)) {
        None => Some(None),
        Some(Ok(f)) => Some(Some(f)),
        Some(Err(s)) => {
            let shown: String = s.chars().take(40).collect();
            e.at(
                ErrorCode::FollowUpInvalid,
                "FollowUp",
                format!(
                    "`{shown}` is not a follow-up policy: use enqueue, reject, interrupt or steer"
                ),
            );
            None
        }
    }
}

fn context_id(e: &mut Errors, field: &str, raw: Option<String>) -> Option<Option<ContextId>> {
    match raw.map(|s| s.parse::<ContextId>()) {
        None => Some(None),
        Some(Ok(id)) => Some(Some(id)),
        Some(Err(msg)) => {
            e.at(ErrorCode::ContextIdInvalid, field, msg.to_string());
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
    ok &= !e.limit(
        &field,
        "values",
        values.len(),
        "max_rag_scope_values",
        limits.max_rag_scope_values,
    );
    let max = limits.max_rag_scope_value_chars;
    for (j, v) in values.iter().enumerate().filter(|(_, v)| v.len() > max) {
        ok &= !e.chars_limit(&format!("{field}[{j}]"), v, "max_rag_scope_value_chars", max);
    }
    ok
}
