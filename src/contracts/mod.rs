//! The public contracts: the AGN-034 request (wire and validated forms), the AGN-033 response
//! inside `InvokeResult<T>`, and the stable error codes. JSON spelling follows DESIGN.md §2-3.

pub mod approval;
pub mod delta;
pub mod error;
pub mod headers;
pub mod ids;
pub mod request;
pub mod response;
mod trusted;
mod turn_parts;
pub mod validated;
mod wire;

pub use approval::{ToolApproval, ToolApprovalOutput};
pub use delta::ReplyDelta;
pub use delta::{event_seq, EVENTS_PER_STEP};
pub use error::{ApiError, ErrorCode};
pub use ids::{
    ContextId, InstanceName, InvalidName, RelativePath, ReplyAddress, SessionId, TenantName, TurnId,
};
pub use request::AgentExecuteRequest;
pub use response::{
    AgentExecuteResponse, FileRef, FinalOutput, InvokeResult, Outcome, ToolCall,
    ToolContinuationOutput, ToolOutcome, ToolResult, Usage, UserWarning,
};
pub use validated::{
    ArtifactContents, ClipboardImage, FollowUp, InputArtifact, Origin, ScopeCondition,
    ScopeOperator, Steer, ToolContinuation, TurnKey, UserTurn, ValidatedRequest,
};

/// The reply every client receives.
pub type Reply = InvokeResult<AgentExecuteResponse>;
