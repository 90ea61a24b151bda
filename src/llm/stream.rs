//! Reads a `text/event-stream` Responses answer: decodes events, forwards deltas, accumulates
//! output items, and returns the terminal event's `response` object.
//!
//! Function-call argument deltas carry `item_id`, not `call_id`, so calls are keyed by item id
//! and take `call_id`/`name` from `response.output_item.added`. Unknown event types are ignored.
//! The stream must end with `response.completed`, `response.incomplete`, `response.failed` or an
//! `error` event; anything else is a broken stream. Whether a broken stream may be retried
//! depends only on whether an event had arrived.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use futures_util::StreamExt as _;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::delta::{DeltaEvent, DeltaSink, StreamDelta};
use super::error::{LlmError, ProviderError, TimeoutPhase};
use super::retry::{transport_error, AttemptError, RetryCause};
use super::sse::{SseDecoder, MAX_EVENT_BYTES};

/// A function call being streamed.
#[derive(Debug)]
struct CallAcc {
    call_id: String,
    arguments: String,
}

/// Everything learnt from the events so far.
#[derive(Debug, Default)]
struct Accumulator {
    events: u64,
    response_id: Option<String>,
    items: BTreeMap<u64, Value>,
    calls: HashMap<String, CallAcc>,
    texts: HashMap<String, String>,
    /// Values of the events a stream keeps (all but deltas): its items and its terminal event,
    /// which repeats them.
    kept_nodes: usize,
}

/// The most bytes one stream may take: its deltas and its terminal event each repeat the
/// answer, which is at most [`MAX_EVENT_BYTES`], so three times that is room and a bound.
const MAX_STREAM_BYTES: usize = 3 * MAX_EVENT_BYTES;

/// Reads the stream to its terminal event. `deadline` bounds the whole attempt, `idle` each
/// silence between chunks.
pub(crate) async fn read(
    resp: reqwest::Response,
    (deadline, idle): (Instant, Duration),
    bound: &super::nodes::Bound<'_>,
    tx: Option<&mpsc::Sender<StreamDelta>>,
) -> Result<Value, AttemptError> {
    let mut body = resp.bytes_stream();
    let mut decoder = SseDecoder::default();
    let mut acc = Accumulator::default();
    let mut sink = DeltaSink::new(tx);
    let mut received = 0usize;
    loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        let (wait, phase) = if idle < remaining {
            (idle, TimeoutPhase::StreamIdle)
        } else {
            (remaining, TimeoutPhase::Request)
        };
        let chunk = match tokio::time::timeout(wait, body.next()).await {
            Err(_) => return Err(acc.broken(RetryCause::Timeout(phase))),
            Ok(None) => {
                return Err(acc.broken(RetryCause::Transport(
                    "the stream ended without a terminal event".into(),
                )))
            }
            Ok(Some(Err(e))) => return Err(acc.broken(RetryCause::Transport(transport_error(&e)))),
            Ok(Some(Ok(chunk))) => chunk,
        };
        received += chunk.len();
        if received > MAX_STREAM_BYTES {
            return Err(AttemptError::Fatal(LlmError::InvalidResponse(format!(
                "the stream passed {} MiB without ending",
                MAX_STREAM_BYTES >> 20
            ))));
        }
        let events = decoder
            .push(&chunk)
            .map_err(|e| AttemptError::Fatal(LlmError::InvalidResponse(e.to_string())))?;
        for data in events {
            let nodes = super::nodes::within(data.as_bytes(), bound)?;
            let event: Value = serde_json::from_str(&data).map_err(|e| {
                AttemptError::Fatal(LlmError::InvalidResponse(format!(
                    "a stream event is not JSON: {e}"
                )))
            })?;
            acc.keep(&event, nodes, bound)?;
            acc.events += 1;
            if let Some(done) = acc.apply(event, &mut sink).await? {
                return Ok(done);
            }
        }
    }
}

impl Accumulator {
    /// Counts `event`'s values against what one stream may keep: its items and its terminal
    /// event, which repeats them (twice what one answer may hold). Deltas are dropped once
    /// forwarded, and of the opening events only the response's id is kept.
    fn keep(
        &mut self,
        event: &Value,
        nodes: usize,
        bound: &super::nodes::Bound<'_>,
    ) -> Result<(), AttemptError> {
        let kind = event.get("type").and_then(Value::as_str).unwrap_or_default();
        let opening =
            matches!(kind, "response.created" | "response.in_progress" | "response.queued");
        if opening || kind.ends_with(".delta") {
            return Ok(());
        }
        self.kept_nodes += nodes;
        let most = 2 * super::nodes::MAX_ANSWER_NODES;
        if self.kept_nodes > most && self.kept_nodes > 2 * bound.most() {
            return Err(super::nodes::too_many(self.kept_nodes, 2 * bound.most()));
        }
        Ok(())
    }

    /// A broken stream: retryable before the first event, reported as it is after.
    fn broken(&self, cause: RetryCause) -> AttemptError {
        if self.events == 0 {
            AttemptError::retryable(cause)
        } else {
            AttemptError::Interrupted { events: self.events, cause }
        }
    }

    /// Applies one event; returns the final response object on a terminal event.
    async fn apply(
        &mut self,
        mut event: Value,
        sink: &mut DeltaSink<'_>,
    ) -> Result<Option<Value>, AttemptError> {
        let text =
            |v: &Value, k: &str| v.get(k).and_then(Value::as_str).unwrap_or_default().to_owned();
        let index = event.get("output_index").and_then(Value::as_u64).unwrap_or(0);
        match event.get("type").and_then(Value::as_str).unwrap_or_default() {
            "response.created" | "response.in_progress" | "response.queued" => {
                let id = event.pointer("/response/id").and_then(Value::as_str);
                if let (None, Some(id)) = (&self.response_id, id) {
                    self.response_id = Some(id.to_owned());
                    sink.send(DeltaEvent::Started { response_id: id.to_owned() }).await;
                }
            }
            "response.output_item.added" => {
                let item = event.get_mut("item").map(Value::take).unwrap_or_default();
                if item.get("type").and_then(Value::as_str) == Some("function_call") {
                    let (call_id, name) = (text(&item, "call_id"), text(&item, "name"));
                    let acc =
                        CallAcc { call_id: call_id.clone(), arguments: text(&item, "arguments") };
                    self.calls.insert(text(&item, "id"), acc);
                    sink.send(DeltaEvent::ToolCallStarted { output_index: index, call_id, name })
                        .await;
                }
                self.items.insert(index, item);
            }
            "response.output_text.delta" => {
                let delta = text(&event, "delta");
                self.texts.entry(text(&event, "item_id")).or_default().push_str(&delta);
                sink.send(DeltaEvent::OutputText { output_index: index, text: delta }).await;
            }
            "response.function_call_arguments.delta" => {
                if let Some(call) = self.calls.get_mut(&text(&event, "item_id")) {
                    let delta = text(&event, "delta");
                    call.arguments.push_str(&delta);
                    sink.send(DeltaEvent::ToolArguments {
                        call_id: call.call_id.clone(),
                        text: delta,
                    })
                    .await;
                }
            }
            "response.function_call_arguments.done" => {
                if let (Some(call), Some(args)) = (
                    self.calls.get_mut(&text(&event, "item_id")),
                    event.get("arguments").and_then(Value::as_str),
                ) {
                    call.arguments = args.to_owned();
                }
            }
            "response.output_item.done" => {
                let item = event.get_mut("item").map(Value::take).unwrap_or_default();
                self.items.insert(index, item);
            }
            "response.completed" | "response.incomplete" | "response.failed" => {
                let response = event.get_mut("response").map(Value::take).unwrap_or_default();
                return Ok(Some(self.finish(response)));
            }
            "error" => {
                let error = Box::new(ProviderError::from_value(&event));
                let response_id = self.response_id.clone();
                return Err(AttemptError::Fatal(LlmError::Failed {
                    response_id,
                    error,
                    raw: None,
                }));
            }
            _ => {}
        }
        Ok(None)
    }

    /// The terminal response, with its `output` rebuilt from the streamed items when a
    /// compatible server leaves it empty.
    fn finish(&mut self, mut response: Value) -> Value {
        let has_output =
            response.get("output").and_then(Value::as_array).is_some_and(|o| !o.is_empty());
        if has_output || self.items.is_empty() {
            return response;
        }
        let items: Vec<Value> =
            std::mem::take(&mut self.items).into_values().map(|item| self.complete(item)).collect();
        if let Some(obj) = response.as_object_mut() {
            obj.insert("output".into(), Value::Array(items));
        }
        response
    }

    /// Fills an item seen only in `output_item.added` with the streamed text or arguments.
    fn complete(&self, mut item: Value) -> Value {
        let id = item.get("id").and_then(Value::as_str).unwrap_or_default().to_owned();
        match item.get("type").and_then(Value::as_str) {
            Some("function_call") => {
                if let (Some(call), Some(obj)) = (self.calls.get(&id), item.as_object_mut()) {
                    obj.insert("arguments".into(), Value::String(call.arguments.clone()));
                }
            }
            Some("message") => {
                let empty = item.get("content").and_then(Value::as_array).is_none_or(Vec::is_empty);
                if let (true, Some(text), Some(obj)) =
                    (empty, self.texts.get(&id), item.as_object_mut())
                {
                    let part = serde_json::json!([{"type": "output_text", "text": text, "annotations": []}]);
                    obj.insert("content".into(), part);
                }
            }
            _ => {}
        }
        item
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::nodes::{Bound, MAX_ANSWER_NODES};

    #[test]
    fn a_stream_keeps_count_of_its_items_not_of_its_opening_events() {
        let bound = Bound::new(b"{}");
        let mut acc = Accumulator::default();
        let event = |kind: &str| serde_json::json!({ "type": kind });
        // Each opening event repeats the request's tools: only the response's id is kept.
        for kind in ["response.created", "response.in_progress", "response.output_text.delta"] {
            assert!(acc.keep(&event(kind), MAX_ANSWER_NODES, &bound).is_ok(), "{kind}");
        }
        let done = event("response.output_item.done");
        assert!(acc.keep(&done, MAX_ANSWER_NODES, &bound).is_ok());
        assert!(acc.keep(&done, MAX_ANSWER_NODES, &bound).is_ok());
        assert!(acc.keep(&done, 10, &bound).is_err(), "past twice an answer's values");
    }
}
