//! Stream deltas: what a streaming call forwards while it runs, in order, so the pipeline can
//! relay partial output to the client out-of-band (AGN-033 §1.3 keeps progress streams out of
//! the response contract).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

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
#[serde(tag = "Type", rename_all = "PascalCase", rename_all_fields = "PascalCase", deny_unknown_fields)]
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

/// Numbers deltas and sends them; a closed or absent receiver only stops the forwarding.
#[derive(Debug)]
pub(crate) struct DeltaSink<'a> {
    tx: Option<&'a mpsc::Sender<StreamDelta>>,
    next: u64,
}

impl<'a> DeltaSink<'a> {
    pub(crate) fn new(tx: Option<&'a mpsc::Sender<StreamDelta>>) -> Self {
        DeltaSink { tx, next: 0 }
    }

    pub(crate) async fn send(&mut self, event: DeltaEvent) {
        let Some(tx) = self.tx else { return };
        let delta = StreamDelta { seq: self.next, event };
        self.next += 1;
        if tx.send(delta).await.is_err() {
            // The listener left (client gone); the turn itself still completes and is stored.
            self.tx = None;
        }
    }
}
