//! Validated AGN-034 requests: the only request types later stages accept.
//!
//! Values are built by [`crate::rules`] from what clients send. On the wire they serialize back
//! to the AGN-034 shape; deserializing one trusts it (`trusted.rs`): only Aptix writes its inner
//! queues, and requests read back from PostgreSQL are checked again at that boundary.

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::ids::{ContextId, RelativePath, SessionId, TurnId};
use super::request::{
    AgentExecuteRequest, ClipboardImageWire, InputArtifactWire, RagScopeConditionWire, ToolResultWire,
};
use super::response::{ToolOutcome, ToolResult};

/// The `(SessionId, TurnId)` pair that identifies a turn.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TurnKey {
    /// The session.
    pub session_id: SessionId,
    /// The turn within the session.
    pub turn_id: TurnId,
}

/// A request that passed every stateless AGN-034 rule. It serializes to its AGN-034 wire form
/// (by reference, see `wire.rs`); deserializing it is trusted (see `trusted.rs`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(try_from = "AgentExecuteRequest")]
pub enum ValidatedRequest {
    /// A User Turn Request.
    UserTurn(UserTurn),
    /// A Tool Continuation Submission.
    ToolContinuation(ToolContinuation),
}

impl ValidatedRequest {
    /// The turn this request belongs to.
    pub fn key(&self) -> &TurnKey {
        match self {
            ValidatedRequest::UserTurn(t) => &t.key,
            ValidatedRequest::ToolContinuation(c) => &c.key,
        }
    }

    /// SHA-256 (hex) of the canonical wire form: equal for the same content however it was
    /// spelled, so a re-sent turn is told apart from a conflicting one.
    pub fn fingerprint(&self) -> String {
        // Hashed as it is written: neither the request nor its JSON is copied.
        let mut hash = HashWriter(Sha256::new());
        // Writing to a hash cannot fail, and a validated request always serializes.
        let _ = serde_json::to_writer(&mut hash, self);
        hex::encode(hash.0.finalize())
    }
}

/// Feeds written bytes to SHA-256.
struct HashWriter(Sha256);

impl std::io::Write for HashWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A validated User Turn Request: at least one of instruction, artifacts or images.
#[derive(Debug, Clone, PartialEq)]
pub struct UserTurn {
    pub(crate) key: TurnKey,
    pub(crate) instruction: Option<String>,
    pub(crate) artifacts: Vec<InputArtifact>,
    pub(crate) images: Vec<ClipboardImage>,
    pub(crate) rag_scope: Vec<ScopeCondition>,
    pub(crate) solution_context: Option<String>,
    pub(crate) workspace_id: Option<String>,
    pub(crate) repo: Option<String>,
    pub(crate) language: Option<String>,
    pub(crate) stream: bool,
    pub(crate) agent_context_id: Option<ContextId>,
    pub(crate) conversation_context_id: Option<ContextId>,
}

impl UserTurn {
    /// The turn's identity.
    pub fn key(&self) -> &TurnKey {
        &self.key
    }
    /// The instruction, if any (never empty or whitespace-only).
    pub fn instruction(&self) -> Option<&str> {
        self.instruction.as_deref()
    }
    /// The files supplied with the turn, paths unique.
    pub fn artifacts(&self) -> &[InputArtifact] {
        &self.artifacts
    }
    /// The pasted images, ids unique.
    pub fn images(&self) -> &[ClipboardImage] {
        &self.images
    }
    /// Retrieval scope conditions (ANDed).
    pub fn rag_scope(&self) -> &[ScopeCondition] {
        &self.rag_scope
    }
    /// New solution context to latch on the session, if sent.
    pub fn solution_context(&self) -> Option<&str> {
        self.solution_context.as_deref()
    }
    /// Workspace identifier hint.
    pub fn workspace_id(&self) -> Option<&str> {
        self.workspace_id.as_deref()
    }
    /// Repository restriction for retrieval.
    pub fn repo(&self) -> Option<&str> {
        self.repo.as_deref()
    }
    /// Language hint.
    pub fn language(&self) -> Option<&str> {
        self.language.as_deref()
    }
    /// Whether the client wants streamed deltas.
    pub fn stream(&self) -> bool {
        self.stream
    }
    /// The requested AgentContext, if any.
    pub fn agent_context_id(&self) -> Option<&ContextId> {
        self.agent_context_id.as_ref()
    }
    /// The requested ConversationContext, if any.
    pub fn conversation_context_id(&self) -> Option<&ContextId> {
        self.conversation_context_id.as_ref()
    }
}

/// A validated Tool Continuation Submission: one or more results with unique call ids.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolContinuation {
    pub(crate) key: TurnKey,
    pub(crate) results: Vec<ToolResult>,
}

impl ToolContinuation {
    /// The turn being continued.
    pub fn key(&self) -> &TurnKey {
        &self.key
    }
    /// The results, in the client's order.
    pub fn results(&self) -> &[ToolResult] {
        &self.results
    }
}

/// Who supplied an artifact.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Origin {
    /// Reported by the IDE (open or modified file).
    Ide,
    /// Supplied explicitly by the user.
    User,
}

impl Origin {
    /// Wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Origin::Ide => "ide",
            Origin::User => "user",
        }
    }
}

/// Decoded artifact contents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ArtifactContents {
    /// UTF-8 text (sent as `utf8`, or base64 that decoded to valid UTF-8).
    Text(String),
    /// Bytes that are not UTF-8 text.
    Binary(Vec<u8>),
}

impl ArtifactContents {
    /// The raw bytes, for hashing and size checks.
    pub fn as_bytes(&self) -> &[u8] {
        match self {
            ArtifactContents::Text(t) => t.as_bytes(),
            ArtifactContents::Binary(b) => b,
        }
    }
}

/// A validated input artifact.
#[derive(Debug, Clone, PartialEq)]
pub struct InputArtifact {
    pub(crate) path: RelativePath,
    pub(crate) file_name: String,
    pub(crate) contents: ArtifactContents,
    pub(crate) origin: Origin,
    pub(crate) mime_type: Option<String>,
    pub(crate) language: Option<String>,
}

impl InputArtifact {
    /// Workspace-relative path.
    pub fn path(&self) -> &RelativePath {
        &self.path
    }
    /// File name.
    pub fn file_name(&self) -> &str {
        &self.file_name
    }
    /// Decoded contents.
    pub fn contents(&self) -> &ArtifactContents {
        &self.contents
    }
    /// Who supplied it.
    pub fn origin(&self) -> Origin {
        self.origin
    }
    /// MIME type hint.
    pub fn mime_type(&self) -> Option<&str> {
        self.mime_type.as_deref()
    }
    /// Language hint.
    pub fn language(&self) -> Option<&str> {
        self.language.as_deref()
    }
    /// SHA-256 (hex) of the contents.
    pub fn sha256(&self) -> String {
        hex::encode(Sha256::digest(self.contents.as_bytes()))
    }
}

/// A validated clipboard image: `image/*` and base64 that decodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClipboardImage {
    pub(crate) id: String,
    pub(crate) mime_type: String,
    pub(crate) data_base64: String,
    pub(crate) byte_len: usize,
}

impl ClipboardImage {
    /// Client id.
    pub fn id(&self) -> &str {
        &self.id
    }
    /// `image/*` MIME type, lowercase.
    pub fn mime_type(&self) -> &str {
        &self.mime_type
    }
    /// Standard base64 of the image bytes.
    pub fn data_base64(&self) -> &str {
        &self.data_base64
    }
    /// Decoded size in bytes.
    pub fn byte_len(&self) -> usize {
        self.byte_len
    }
    /// `data:<mime>;base64,<data>` as the Responses API's `input_image` expects.
    pub fn data_url(&self) -> String {
        format!("data:{};base64,{}", self.mime_type, self.data_base64)
    }
}

/// A `RagScope` operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ScopeOperator {
    /// `==`: the field equals any of the values.
    #[serde(rename = "==")]
    Eq,
    /// `!=`: the field equals none of the values.
    #[serde(rename = "!=")]
    Ne,
    /// `contains`: the field contains every value.
    #[serde(rename = "contains")]
    Contains,
    /// `does_not_contain`: the field contains none of the values.
    #[serde(rename = "does_not_contain")]
    DoesNotContain,
}

impl ScopeOperator {
    /// Wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ScopeOperator::Eq => "==",
            ScopeOperator::Ne => "!=",
            ScopeOperator::Contains => "contains",
            ScopeOperator::DoesNotContain => "does_not_contain",
        }
    }

    /// Parses the wire spelling (exact, case-sensitive).
    pub fn parse(s: &str) -> Option<Self> {
        [Self::Eq, Self::Ne, Self::Contains, Self::DoesNotContain].into_iter().find(|op| op.as_str() == s)
    }
}

/// A validated `RagScope` condition with at least one value.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ScopeCondition {
    pub(crate) key: String,
    pub(crate) operator: ScopeOperator,
    pub(crate) values: Vec<String>,
}

impl ScopeCondition {
    /// A condition built by a program (a benchmark, a tool), not read from a client.
    pub fn new(key: String, operator: ScopeOperator, values: Vec<String>) -> Self {
        ScopeCondition { key, operator, values }
    }

    /// Payload key.
    pub fn key(&self) -> &str {
        &self.key
    }
    /// Operator.
    pub fn operator(&self) -> ScopeOperator {
        self.operator
    }
    /// Values (never empty).
    pub fn values(&self) -> &[String] {
        &self.values
    }
}

impl From<ValidatedRequest> for AgentExecuteRequest {
    fn from(v: ValidatedRequest) -> Self {
        match v {
            ValidatedRequest::UserTurn(t) => user_turn_to_wire(t),
            ValidatedRequest::ToolContinuation(c) => AgentExecuteRequest {
                session_id: Some(c.key.session_id.to_string()),
                turn_id: Some(c.key.turn_id.to_string()),
                tool_results: Some(c.results.into_iter().map(tool_result_to_wire).collect()),
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
        tool_results: None,
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
