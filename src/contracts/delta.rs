//! The body of a stream delta on a session's reply queue (`type` = `delta`): partial output of
//! one step of a streamed turn, relayed while the model writes it. Deltas are a preview outside
//! the AGN-033 contract (§1.3 serves progress out of band); the reply that ends the step is the
//! complete answer. `docs/client-protocol.md` says how clients read them.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::ids::{SessionId, TurnId};
use crate::llm::{DeltaEvent, StreamDelta};

/// One delta as published to `<prefix>.session.<SessionId>`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
#[schemars(title = "ReplyDelta")]
pub struct ReplyDelta {
    /// Always `true`: tells a delta from an `InvokeResult` by its body alone.
    #[schemars(extend("const" = true))]
    pub delta: bool,
    /// The session.
    #[schemars(with = "uuid::Uuid")]
    pub session_id: SessionId,
    /// The turn.
    #[schemars(with = "String")]
    pub turn_id: TurnId,
    /// The step of the turn it belongs to, from 0 (0 = the user turn, +1 per accepted tool
    /// continuation): the same number as `x-aptix-step` and the `step-N` of the reply ending it.
    pub step: u32,
    /// Position of this delta within its step, from 0, without gaps.
    pub seq: u64,
    /// What happened.
    pub event: DeltaEvent,
}

impl ReplyDelta {
    /// The body for `delta` of step `step` of the turn `(session_id, turn_id)`.
    pub fn new(session_id: SessionId, turn_id: TurnId, step: u32, delta: &StreamDelta) -> Self {
        ReplyDelta { delta: true, session_id, turn_id, step, seq: delta.seq, event: delta.event.clone() }
    }
}
