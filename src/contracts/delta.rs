//! The body of a stream delta on a session's reply queue (`type` = `delta`): partial output of
//! one step of a streamed turn, relayed while the model writes it. Deltas are a preview outside
//! the AGN-033 contract (§1.3 serves progress out of band); the reply that ends the step is the
//! complete answer. `docs/client-protocol.md` says how clients read them.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::ids::{SessionId, TurnId};

/// Events of one step a turn's event sequence can number (`x-aptix-event-seq`).
pub const EVENTS_PER_STEP: i64 = 1_000_000;

/// The place of an event in its turn (`x-aptix-event-seq`, docs/client-protocol.md §9a): delta
/// `seq` of step `step` is `step × 1,000,000 + seq`; the reply that ends the step (`seq` `None`)
/// comes after every delta of it, at `step × 1,000,000 + 999,999`. Increasing through the turn,
/// with gaps.
pub fn event_seq(step: i32, seq: Option<u64>) -> i64 {
    let last = EVENTS_PER_STEP - 1;
    let within = seq.map_or(last, |s| i64::try_from(s).unwrap_or(last).min(last - 1));
    i64::from(step) * EVENTS_PER_STEP + within
}

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
        ReplyDelta {
            delta: true,
            session_id,
            turn_id,
            step,
            seq: delta.seq,
            event: delta.event.clone(),
        }
    }
}

/// One forwarded piece of a streaming response. `Seq` starts at 0 and increases by one per
/// delta of the call; deltas are sent only from the single attempt that delivers events (a
/// stream is never retried after its first event), so there are no gaps or repeats.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct StreamDelta {
    /// Position of this delta in the call, from 0.
    pub seq: u64,
    /// What happened.
    pub event: DeltaEvent,
}

/// The kinds of delta, told apart by `Type`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(
    tag = "Type",
    rename_all = "PascalCase",
    rename_all_fields = "PascalCase",
    deny_unknown_fields
)]
pub enum DeltaEvent {
    /// The provider accepted the request and named the response (first delta of a step).
    Started {
        /// The provider's response id.
        response_id: String,
    },
    /// More answer text; a step's `OutputText` deltas of one `OutputIndex`, in `Seq` order, add
    /// up to the text of that output item.
    OutputText {
        /// The output item it belongs to.
        output_index: u64,
        /// The new text.
        text: String,
    },
    /// The model started a function call.
    ToolCallStarted {
        /// The output item.
        output_index: u64,
        /// The call id the client will answer.
        call_id: String,
        /// The tool name.
        name: String,
    },
    /// More of a function call's arguments (JSON text, complete only once every piece of the
    /// call arrived; the reply's `ToolCalls[].ArgumentsJson` is the whole).
    ToolArguments {
        /// The call id.
        call_id: String,
        /// The new argument text.
        text: String,
    },
}
