//! Stream deltas: what a streaming call forwards while it runs, in order, so the pipeline can
//! relay partial output to the client out-of-band (AGN-033 §1.3 keeps progress streams out of
//! the response contract).

use tokio::sync::mpsc;

pub use crate::contracts::delta::{DeltaEvent, StreamDelta};

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
