//! Why a stage could not produce its output, typed: [`StageError`] says what happens to the
//! message, [`Cause`] what went wrong, so the runtime, its logs and its dead letters never
//! have to read meaning back out of text.

use crate::contracts::{ApiError, ErrorCode};
use crate::llm::{KeyFileError, LlmError};
use crate::messages::DecodeError;
use crate::retrieve::RetrieveError;
use crate::store::StoreError;

/// Why a stage could not produce its output, classified by what happens to the message.
#[derive(Debug, thiserror::Error)]
pub enum StageError {
    /// A dependency is unavailable: the message is retried later, and when attempts run out
    /// the turn fails with the stage's [`super::Stage::EXHAUSTED`] code.
    #[error("transient: {0}")]
    Transient(Cause),
    /// An expected, short wait (the session's previous reply is still being published): retried
    /// like [`StageError::Transient`], but routine under load, so not worth an operator's look.
    #[error("waiting: {0}")]
    Wait(Cause),
    /// The turn ends with these client-visible errors (recorded and replied by the last stage).
    #[error("turn failed: {}", .0.iter().map(|e| e.message.as_str()).collect::<Vec<_>>().join("; "))]
    Fail(Vec<ApiError>),
    /// The message can never be handled (corrupt data, a permanent database error): it is
    /// dead-lettered with the reason now and its turn fails with an error reply.
    #[error("permanent: {0}")]
    Permanent(Cause),
    /// The message must not be acted on (a step for a turn that is not running at that step):
    /// dead-lettered with the reason, nothing else; the turn is not this message's to end.
    #[error("refused: {0}")]
    Refused(Cause),
}

/// What went wrong.
#[derive(Debug, thiserror::Error)]
pub enum Cause {
    /// PostgreSQL, or the turn's stored state.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Stored or carried data this build cannot use.
    #[error("unusable data: {0}")]
    Unusable(String),
    /// JSON of the wrong shape.
    #[error("unusable data: {0}")]
    Json(#[from] serde_json::Error),
    /// A message this build does not read.
    #[error(transparent)]
    Decode(#[from] DecodeError),
    /// The provider call failed.
    #[error(transparent)]
    Llm(#[from] LlmError),
    /// Retrieval failed.
    #[error(transparent)]
    Retrieval(#[from] RetrieveError),
    /// The turn's AgentContext names a key file that cannot be used.
    #[error(transparent)]
    KeyFile(#[from] KeyFileError),
    /// The publisher belongs to no configured tenant, so no reply queue may be answered on.
    #[error("request.tenant_unknown: {0}")]
    UnknownPublisher(String),
    /// A submission names no session to answer.
    #[error("no usable SessionId; {0}")]
    NoSession(String),
    /// The session's rows kept changing while a turn was admitted.
    #[error("the session kept changing under admission")]
    Contended,
    /// A setting the stage needs for this input is missing.
    #[error("{0}")]
    Unconfigured(&'static str),
}

impl Cause {
    /// The client-protocol error code the cause has, where it has one
    /// (`docs/client-protocol.md` §10).
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            Cause::Llm(e) => Some(e.code()),
            _ => None,
        }
    }
}

impl StageError {
    /// Stored data that can never be used (corrupt, or from an unknown version).
    pub fn unusable(what: impl std::fmt::Display) -> Self {
        StageError::Permanent(Cause::Unusable(what.to_string()))
    }

    /// A turn that fails with one error.
    pub fn fail(error: ApiError) -> Self {
        StageError::Fail(vec![error])
    }

    /// A dependency that is down for now.
    pub fn transient(cause: impl Into<Cause>) -> Self {
        StageError::Transient(cause.into())
    }
}

impl From<serde_json::Error> for StageError {
    fn from(e: serde_json::Error) -> Self {
        StageError::Permanent(Cause::Json(e))
    }
}

impl From<StoreError> for StageError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotRunning { .. } | StoreError::Transition(_) => {
                StageError::Refused(Cause::Store(e))
            }
            StoreError::ReplyInFlight | StoreError::AdmittedMeanwhile { .. } => {
                StageError::Wait(Cause::Store(e))
            }
            e if e.is_transient() => StageError::Transient(Cause::Store(e)),
            e => StageError::Permanent(Cause::Store(e)),
        }
    }
}
