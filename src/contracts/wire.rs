//! A validated request written in its AGN-034 wire form straight from the validated value, by
//! reference: the same bytes as converting it to [`AgentExecuteRequest`] and serializing that,
//! without copying the request first (a copy of a 4 MiB request is 4 MiB more at every hop) and
//! with binary artifacts base64-encoded as they are written.
//!
//! The field names, order and omissions here mirror [`AgentExecuteRequest`] exactly: the
//! fingerprint of a request is a hash of these bytes, and fingerprints are stored.

use std::fmt::Display;

use base64::display::Base64Display;
use serde::ser::{SerializeSeq, Serializer};
use serde::Serialize;

use super::approval::ToolApproval;
use super::response::{ToolOutcome, ToolResult};
use super::validated::{
    ArtifactContents, ClipboardImage, InputArtifact, ScopeCondition, ValidatedRequest,
};

#[cfg(doc)]
use super::AgentExecuteRequest;

impl Serialize for ValidatedRequest {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            ValidatedRequest::UserTurn(t) => Request {
                session_id: Text(&t.key.session_id),
                turn_id: t.key.turn_id.as_str(),
                instruction: t.instruction.as_deref(),
                input_artifacts: List::of(&t.artifacts),
                clipboard_images: List::of(&t.images),
                rag_scope: List::of(&t.rag_scope),
                solution_context_text: t.solution_context.as_deref(),
                workspace_id: t.workspace_id.as_deref(),
                repo: t.repo.as_deref(),
                language: t.language.as_deref(),
                stream: t.stream.then_some(true),
                agent_context_id: t.agent_context_id.as_ref().map(|c| c.as_str()),
                conversation_context_id: t.conversation_context_id.as_ref().map(|c| c.as_str()),
                follow_up: t.follow_up.map(super::FollowUp::as_str),
                tool_results: None,
                tool_approvals: None,
            }
            .serialize(s),
            ValidatedRequest::ToolContinuation(c) => Request {
                session_id: Text(&c.key.session_id),
                turn_id: c.key.turn_id.as_str(),
                tool_results: List::of(&c.results),
                tool_approvals: List::of(&c.approvals),
                ..Request::default()
            }
            .serialize(s),
        }
    }
}

/// [`AgentExecuteRequest`] by reference.
#[derive(Default, Serialize)]
#[serde(rename_all = "PascalCase")]
struct Request<'a> {
    session_id: Text<'a>,
    turn_id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    instruction: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    input_artifacts: Option<List<'a, InputArtifact>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    clipboard_images: Option<List<'a, ClipboardImage>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rag_scope: Option<List<'a, ScopeCondition>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    solution_context_text: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    workspace_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    repo: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    language: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stream: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    agent_context_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    conversation_context_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    follow_up: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_results: Option<List<'a, ToolResult>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_approvals: Option<List<'a, ToolApproval>>,
}

/// A value written as the string its `Display` gives (as `to_string()` would).
struct Text<'a>(&'a dyn Display);

impl Default for Text<'_> {
    fn default() -> Self {
        Text(&"")
    }
}

impl Serialize for Text<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self.0)
    }
}

/// A list written element by element through its wire form; absent when empty, as the wire
/// request never holds an empty list a validated one came from.
struct List<'a, T>(&'a [T]);

impl<'a, T> List<'a, T> {
    fn of(items: &'a [T]) -> Option<Self> {
        (!items.is_empty()).then_some(List(items))
    }
}

impl<T> Serialize for List<'_, T>
where
    for<'b> Wire<'b, T>: Serialize,
{
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.0.len()))?;
        for item in self.0 {
            seq.serialize_element(&Wire(item))?;
        }
        seq.end()
    }
}

/// One list element in its wire form.
struct Wire<'a, T>(&'a T);

impl Serialize for Wire<'_, InputArtifact> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        #[serde(rename_all = "PascalCase")]
        struct Artifact<'a> {
            relative_path: &'a str,
            file_name: &'a str,
            contents: Contents<'a>,
            origin: &'a str,
            #[serde(skip_serializing_if = "Option::is_none")]
            mime_type: Option<&'a str>,
            #[serde(skip_serializing_if = "Option::is_none")]
            language: Option<&'a str>,
            #[serde(skip_serializing_if = "Option::is_none")]
            encoding: Option<&'a str>,
        }
        let a = self.0;
        let binary = matches!(a.contents, ArtifactContents::Binary(_));
        Artifact {
            relative_path: a.path.as_str(),
            file_name: &a.file_name,
            contents: Contents(&a.contents),
            origin: a.origin.as_str(),
            mime_type: a.mime_type.as_deref(),
            language: a.language.as_deref(),
            encoding: binary.then_some("base64"),
        }
        .serialize(s)
    }
}

/// Artifact contents: text as it is, bytes as standard base64 written in place.
struct Contents<'a>(&'a ArtifactContents);

impl Serialize for Contents<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            ArtifactContents::Text(t) => s.serialize_str(t),
            ArtifactContents::Binary(b) => {
                s.collect_str(&Base64Display::new(b, &base64::engine::general_purpose::STANDARD))
            }
        }
    }
}

impl Serialize for Wire<'_, ClipboardImage> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        #[serde(rename_all = "PascalCase")]
        struct Image<'a> {
            id: &'a str,
            mime_type: &'a str,
            data_base64: &'a str,
        }
        let i = self.0;
        Image { id: &i.id, mime_type: &i.mime_type, data_base64: &i.data_base64 }.serialize(s)
    }
}

impl Serialize for Wire<'_, ScopeCondition> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        #[serde(rename_all = "PascalCase")]
        struct Condition<'a> {
            key: &'a str,
            operator: &'a str,
            values: &'a [String],
        }
        let c = self.0;
        Condition { key: &c.key, operator: c.operator.as_str(), values: &c.values }.serialize(s)
    }
}

impl Serialize for Wire<'_, ToolResult> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        #[serde(rename_all = "PascalCase")]
        struct ResultItem<'a> {
            tool_call_id: &'a str,
            execution_ms: u64,
            #[serde(skip_serializing_if = "Option::is_none")]
            result_json: Option<&'a str>,
            #[serde(skip_serializing_if = "Option::is_none")]
            error_message: Option<&'a str>,
        }
        let r = self.0;
        let (result_json, error_message) = match &r.outcome {
            ToolOutcome::ResultJson(j) => (Some(j.as_str()), None),
            ToolOutcome::ErrorMessage(m) => (None, Some(m.as_str())),
        };
        ResultItem {
            tool_call_id: &r.tool_call_id,
            execution_ms: r.execution_ms,
            result_json,
            error_message,
        }
        .serialize(s)
    }
}

impl Serialize for Wire<'_, ToolApproval> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // The validated form is the wire form (`ToolApprovalWire`'s order and omissions).
        self.0.serialize(s)
    }
}
