//! Validated AGN-034 requests: the only request types later stages accept.
//!
//! Values are built by [`crate::rules`] from what clients send. On the wire they serialize back
//! to the AGN-034 shape; deserializing one trusts it (`trusted.rs`): only Aptix writes its inner
//! queues, and requests read back from PostgreSQL are checked again at that boundary.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::ids::{ContextId, SessionId, TurnId};
use super::request::AgentExecuteRequest;
use super::response::ToolResult;

pub use super::turn_parts::{
    ArtifactContents, ClipboardImage, InputArtifact, Origin, ScopeCondition, ScopeOperator,
};

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

/// What a user turn does when its session's active turn has not ended (docs/client-protocol.md
/// §11, "Follow-ups"): its ConversationContext's `follow_up`, or the request's `FollowUp` where
/// the context allows it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FollowUp {
    /// It waits behind the active turn (and any queued before it).
    #[default]
    Enqueue,
    /// It is refused with `session.busy`; nothing is stored against the active turn.
    Reject,
    /// The active turn is cancelled as `turn.cancel` would, keeping what it streamed, and this
    /// turn waits for it to end (behind any queued before it).
    Interrupt,
    /// Its instruction is added to the active turn at that turn's next round trip (after tool
    /// results, before the next model call), and it ends with that turn; when that turn ends
    /// first, it runs as an enqueued turn. Only a turn that carries nothing but an instruction
    /// steers.
    Steer,
}

impl FollowUp {
    /// The wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            FollowUp::Enqueue => "enqueue",
            FollowUp::Reject => "reject",
            FollowUp::Interrupt => "interrupt",
            FollowUp::Steer => "steer",
        }
    }
}

impl std::str::FromStr for FollowUp {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, ()> {
        [FollowUp::Enqueue, FollowUp::Reject, FollowUp::Interrupt, FollowUp::Steer]
            .into_iter()
            .find(|f| f.as_str() == s)
            .ok_or(())
    }
}

/// A follow-up's instruction added to the running turn it steers (`FollowUp::Steer`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct Steer {
    /// The follow-up turn.
    pub turn_id: String,
    /// Its instruction, as validated when it was admitted.
    pub instruction: String,
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
    pub(crate) follow_up: Option<FollowUp>,
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
    /// Whether the turn carries an instruction and nothing its own retrieval or assembly would
    /// use (files, images, scope, solution context): only such a turn can steer another.
    pub fn only_instruction(&self) -> bool {
        self.instruction.is_some()
            && self.artifacts.is_empty()
            && self.images.is_empty()
            && self.rag_scope.is_empty()
            && self.solution_context.is_none()
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
    /// The follow-up policy the request chose, if any.
    pub fn follow_up(&self) -> Option<FollowUp> {
        self.follow_up
    }
}

/// A validated Tool Continuation Submission: one or more results with unique call ids, or (a
/// Tool Approval Submission) one or more decisions with unique call ids; never both.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolContinuation {
    pub(crate) key: TurnKey,
    pub(crate) results: Vec<ToolResult>,
    pub(crate) approvals: Vec<super::ToolApproval>,
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
    /// The decisions of a Tool Approval Submission, in the client's order (empty otherwise).
    pub fn approvals(&self) -> &[super::ToolApproval] {
        &self.approvals
    }
    /// Whether this is a Tool Approval Submission.
    pub fn is_approval(&self) -> bool {
        !self.approvals.is_empty()
    }
    /// The call ids it answers, in the client's order (of its decisions, or of its results).
    pub fn answered_ids(&self) -> Vec<&str> {
        if self.is_approval() {
            self.approvals.iter().map(|a| a.tool_call_id.as_str()).collect()
        } else {
            self.results.iter().map(|r| r.tool_call_id.as_str()).collect()
        }
    }
}
