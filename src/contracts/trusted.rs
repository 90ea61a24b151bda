//! A validated request and its wire form, both ways. Written: the validated value as an
//! [`AgentExecuteRequest`]. Read back (inner queue messages, which only Aptix writes): the wire
//! form maps straight onto the validated types, with no rule run and no image decoded. Only
//! Aptix writes its inner queues, and their messages are tagged with a versioned kind; requests
//! read from PostgreSQL are checked again at that boundary (`crate::rules::from_stored`).

use base64::Engine as _;

use super::ids::RelativePath;
use super::request::{
    AgentExecuteRequest, ClipboardImageWire, InputArtifactWire, RagScopeConditionWire,
    ToolResultWire,
};
use super::response::{ToolOutcome, ToolResult};
use super::validated::{
    ArtifactContents, ClipboardImage, InputArtifact, Origin, ScopeCondition, ScopeOperator,
    ToolContinuation, TurnKey, UserTurn, ValidatedRequest,
};

/// A wire request that no validated request could have been written as.
#[derive(Debug, thiserror::Error)]
pub enum NotTrusted {
    /// A field a validated request always has is missing, or holds what it never holds.
    #[error("{0}")]
    Missing(&'static str),
    /// An id that does not parse.
    #[error("{0}")]
    Id(String),
    /// Binary contents that are not base64.
    #[error(transparent)]
    Base64(#[from] base64::DecodeError),
}

impl From<&'static str> for NotTrusted {
    fn from(what: &'static str) -> Self {
        NotTrusted::Missing(what)
    }
}

impl From<super::ids::InvalidName> for NotTrusted {
    fn from(why: super::ids::InvalidName) -> Self {
        NotTrusted::Id(why.to_string())
    }
}

impl TryFrom<AgentExecuteRequest> for ValidatedRequest {
    type Error = NotTrusted;

    /// Trusted: `w` was written from a validated request. A shape that cannot come from one
    /// (a missing id, an unknown operator) is reported; nothing else is checked.
    fn try_from(w: AgentExecuteRequest) -> Result<Self, NotTrusted> {
        let session_id = w
            .session_id
            .as_deref()
            .ok_or("no SessionId")?
            .parse()
            .map_err(|(_, m)| NotTrusted::Id(m))?;
        let turn_id = w
            .turn_id
            .as_deref()
            .ok_or("no TurnId")?
            .parse()
            .map_err(|(_, m): (_, String)| NotTrusted::Id(m))?;
        let key = TurnKey { session_id, turn_id };
        if w.tool_results.is_some() || w.tool_approvals.is_some() {
            let results = w.tool_results.unwrap_or_default();
            let results = results.into_iter().map(tool_result).collect::<Result<_, _>>()?;
            let approvals = w.tool_approvals.unwrap_or_default();
            let approvals = approvals.into_iter().map(approval).collect::<Result<_, _>>()?;
            return Ok(ValidatedRequest::ToolContinuation(ToolContinuation {
                key,
                results,
                approvals,
            }));
        }
        let scope = w.rag_scope.unwrap_or_default().into_iter().map(|c| {
            Ok(ScopeCondition {
                key: c.key.ok_or("a scope condition without Key")?,
                operator: c
                    .operator
                    .as_deref()
                    .and_then(ScopeOperator::parse)
                    .ok_or("an unknown Operator")?,
                values: c.values.unwrap_or_default(),
            })
        });
        let context = |id: Option<String>| id.map(|c| c.parse()).transpose();
        Ok(ValidatedRequest::UserTurn(UserTurn {
            key,
            instruction: w.instruction,
            artifacts: w
                .input_artifacts
                .unwrap_or_default()
                .into_iter()
                .map(artifact)
                .collect::<Result<_, _>>()?,
            images: w
                .clipboard_images
                .unwrap_or_default()
                .into_iter()
                .map(image)
                .collect::<Result<_, _>>()?,
            rag_scope: scope.collect::<Result<_, &str>>()?,
            solution_context: w.solution_context_text,
            workspace_id: w.workspace_id,
            repo: w.repo,
            language: w.language,
            stream: w.stream.unwrap_or(false),
            agent_context_id: context(w.agent_context_id)?,
            conversation_context_id: context(w.conversation_context_id)?,
            follow_up: w
                .follow_up
                .map(|f| f.parse())
                .transpose()
                .map_err(|()| "a FollowUp it does not know")?,
        }))
    }
}

fn approval(a: super::approval::ToolApprovalWire) -> Result<super::ToolApproval, NotTrusted> {
    Ok(super::ToolApproval {
        tool_call_id: a.tool_call_id.ok_or("an approval without ToolCallId")?,
        approved: a.approved.ok_or("an approval without Approved")?,
        message: a.message,
    })
}

fn tool_result(r: ToolResultWire) -> Result<ToolResult, NotTrusted> {
    let outcome = match (r.result_json, r.error_message) {
        (Some(json), None) => ToolOutcome::ResultJson(json),
        (None, Some(message)) => ToolOutcome::ErrorMessage(message),
        _ => return Err(NotTrusted::Missing("a tool result without exactly one outcome")),
    };
    Ok(ToolResult {
        tool_call_id: r.tool_call_id.ok_or("a tool result without ToolCallId")?,
        name: None,
        execution_ms: r.execution_ms.ok_or("a tool result without ExecutionMs")?,
        outcome,
    })
}

fn artifact(a: InputArtifactWire) -> Result<InputArtifact, NotTrusted> {
    let contents = a.contents.ok_or("an artifact without Contents")?;
    let contents = match a.encoding.as_deref() {
        Some("base64") => {
            ArtifactContents::Binary(base64::engine::general_purpose::STANDARD.decode(contents)?)
        }
        _ => ArtifactContents::Text(contents),
    };
    let origin = match a.origin.as_deref() {
        Some("ide") => Origin::Ide,
        Some("user") => Origin::User,
        _ => return Err(NotTrusted::Missing("an artifact without a known Origin")),
    };
    Ok(InputArtifact {
        path: RelativePath::trusted(a.relative_path.ok_or("an artifact without RelativePath")?),
        file_name: a.file_name.ok_or("an artifact without FileName")?,
        contents,
        origin,
        mime_type: a.mime_type,
        language: a.language,
    })
}

fn image(i: ClipboardImageWire) -> Result<ClipboardImage, NotTrusted> {
    let data_base64 = i.data_base64.ok_or("an image without DataBase64")?;
    // The decoded size from the text alone: validated base64 has no whitespace.
    let padding = data_base64.bytes().rev().take_while(|b| *b == b'=').count();
    let byte_len = (data_base64.len() / 4 * 3).saturating_sub(padding);
    Ok(ClipboardImage {
        id: i.id.ok_or("an image without Id")?,
        mime_type: i.mime_type.ok_or("an image without MimeType")?,
        data_base64,
        byte_len,
    })
}

impl From<ValidatedRequest> for AgentExecuteRequest {
    fn from(v: ValidatedRequest) -> Self {
        match v {
            ValidatedRequest::UserTurn(t) => user_turn_to_wire(t),
            ValidatedRequest::ToolContinuation(c) => AgentExecuteRequest {
                session_id: Some(c.key.session_id.to_string()),
                turn_id: Some(c.key.turn_id.to_string()),
                tool_results: (!c.results.is_empty())
                    .then(|| c.results.into_iter().map(tool_result_to_wire).collect()),
                tool_approvals: (!c.approvals.is_empty()).then(|| {
                    c.approvals
                        .into_iter()
                        .map(|a| super::approval::ToolApprovalWire {
                            tool_call_id: Some(a.tool_call_id),
                            approved: Some(a.approved),
                            message: a.message,
                        })
                        .collect()
                }),
                ..Default::default()
            },
        }
    }
}

fn user_turn_to_wire(t: UserTurn) -> AgentExecuteRequest {
    let b64 = base64::engine::general_purpose::STANDARD;
    AgentExecuteRequest {
        session_id: Some(t.key.session_id.to_string()),
        turn_id: Some(t.key.turn_id.to_string()),
        instruction: t.instruction,
        input_artifacts: non_empty(
            t.artifacts
                .into_iter()
                .map(|a| {
                    let (contents, encoding) = match a.contents {
                        ArtifactContents::Text(s) => (s, None),
                        ArtifactContents::Binary(b) => (b64.encode(b), Some("base64".to_owned())),
                    };
                    InputArtifactWire {
                        relative_path: Some(a.path.as_str().to_owned()),
                        file_name: Some(a.file_name),
                        contents: Some(contents),
                        origin: Some(a.origin.as_str().to_owned()),
                        mime_type: a.mime_type,
                        language: a.language,
                        encoding,
                    }
                })
                .collect(),
        ),
        clipboard_images: non_empty(
            t.images
                .into_iter()
                .map(|i| ClipboardImageWire {
                    id: Some(i.id),
                    mime_type: Some(i.mime_type),
                    data_base64: Some(i.data_base64),
                })
                .collect(),
        ),
        rag_scope: non_empty(
            t.rag_scope
                .into_iter()
                .map(|c| RagScopeConditionWire {
                    key: Some(c.key),
                    operator: Some(c.operator.as_str().to_owned()),
                    values: Some(c.values),
                })
                .collect(),
        ),
        solution_context_text: t.solution_context,
        workspace_id: t.workspace_id,
        repo: t.repo,
        language: t.language,
        stream: t.stream.then_some(true),
        agent_context_id: t.agent_context_id.map(|c| c.as_str().to_owned()),
        conversation_context_id: t.conversation_context_id.map(|c| c.as_str().to_owned()),
        follow_up: t.follow_up.map(|f| f.as_str().to_owned()),
        tool_results: None,
        tool_approvals: None,
    }
}

fn non_empty<T>(v: Vec<T>) -> Option<Vec<T>> {
    if v.is_empty() {
        None
    } else {
        Some(v)
    }
}

fn tool_result_to_wire(r: ToolResult) -> ToolResultWire {
    let (result_json, error_message) = match r.outcome {
        ToolOutcome::ResultJson(j) => (Some(j), None),
        ToolOutcome::ErrorMessage(e) => (None, Some(e)),
    };
    ToolResultWire {
        tool_call_id: Some(r.tool_call_id),
        execution_ms: Some(r.execution_ms),
        result_json,
        error_message,
    }
}
