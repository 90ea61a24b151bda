//! Why a stored turn cannot be run again, or why its run failed: typed where it is decided,
//! printed as the run's report says it.

use crate::assemble::AssembleError;
use crate::llm::{KeyFileError, LlmError};

/// A stored turn that cannot be replayed, or a replay that failed.
#[derive(Debug, thiserror::Error)]
pub enum Unreplayable {
    /// Its first round trip's record is missing.
    #[error("the turn has no first round trip")]
    NoFirstStep,
    /// Its saved round trip cannot be read by this build.
    #[error("the saved round trip is unreadable: {0}")]
    Unreadable(String),
    /// It ended before the model was called.
    #[error("the turn never reached the model (no saved request)")]
    NeverCalled,
    /// Its saved round trip holds no assembled user turn.
    #[error("the saved round trip has no assembled user turn")]
    NoUserTurn,
    /// The ConversationContext it names (or the run's override) is not configured.
    #[error("the conversation context `{0}` is not configured")]
    UnknownConversationContext(String),
    /// The AgentContext it names is not configured.
    #[error("the agent context `{0}` is not configured")]
    UnknownAgentContext(String),
    /// Its AgentContext's key file cannot be used.
    #[error(transparent)]
    KeyFile(#[from] KeyFileError),
    /// Its request cannot be assembled.
    #[error(transparent)]
    Assemble(#[from] AssembleError),
    /// A later round trip has no saved tool results to answer the new run's calls with.
    #[error("the original step has no saved tool results")]
    NoToolResults,
    /// The new run's model called other tools than the original's.
    #[error("the new answer calls [{new}] where the original called [{original}]")]
    OtherCalls {
        /// The new run's calls, by name.
        new: String,
        /// The original's.
        original: String,
    },
    /// The provider call failed.
    #[error(transparent)]
    Llm(#[from] LlmError),
    /// Its record could not be built.
    #[error("the record could not be built: {0}")]
    Record(#[from] serde_json::Error),
}
