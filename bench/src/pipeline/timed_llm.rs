//! The LLM client the benchmark stages use: the real HTTP client, timed per benchmark turn.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio::time::Instant;

use aptix::llm::{HttpLlmClient, LlmClient, LlmError, LlmRequest, LlmResponse};

/// The LLM client the stages use: the real HTTP client, timed. It records each call's wall
/// time under the benchmark turn id found in the instruction (see [`turn_marker`]) and counts
/// calls in flight.
#[derive(Debug)]
pub struct TimedLlm {
    inner: HttpLlmClient,
    calls: Mutex<HashMap<String, Duration>>,
    in_flight: AtomicUsize,
    peak: AtomicUsize,
}

impl TimedLlm {
    pub fn new(inner: HttpLlmClient) -> Self {
        TimedLlm {
            inner,
            calls: Mutex::new(HashMap::new()),
            in_flight: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
        }
    }

    /// Total LLM call time of a turn (all calls and retries), if it made any.
    pub fn call_time(&self, turn_id: &str) -> Option<Duration> {
        self.calls.lock().ok().and_then(|m| m.get(turn_id).copied())
    }

    /// Most calls in flight at once since the last [`TimedLlm::reset_peak`].
    pub fn peak_in_flight(&self) -> usize {
        self.peak.load(Ordering::Relaxed)
    }

    /// Starts a new peak measurement.
    pub fn reset_peak(&self) {
        self.peak.store(self.in_flight.load(Ordering::Relaxed), Ordering::Relaxed);
    }
}

impl LlmClient for TimedLlm {
    fn create_response<'a>(
        &'a self,
        request: LlmRequest<'a>,
    ) -> BoxFuture<'a, Result<LlmResponse, LlmError>> {
        Box::pin(async move {
            let marker = turn_marker(request.body.as_str());
            let now = self.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
            self.peak.fetch_max(now, Ordering::Relaxed);
            let started = Instant::now();
            let result = self.inner.create(request).await;
            let took = started.elapsed();
            self.in_flight.fetch_sub(1, Ordering::Relaxed);
            if let (Some(m), Ok(mut calls)) = (marker, self.calls.lock()) {
                *calls.entry(m).or_default() += took;
            }
            result
        })
    }
}

/// Word that precedes the turn id in every benchmark instruction.
pub const MARKER: &str = "bench-turn";

/// The benchmark turn id in a `/responses` body: the last user message's first part is
/// `[MODE: …]\n\n[INSTRUCTION]\n<instruction>`, and benchmark instructions start with
/// `bench-turn <id>:`. Context chunks (which may quote anything) are separate parts.
///
/// Read from the body's text, not its tree, so the benchmark adds no parse of the largest part
/// of a turn to the process it measures. The message's opening is found with its quotes
/// unescaped, which no JSON string (a chunk quoting one) can contain.
pub fn turn_marker(body: &str) -> Option<String> {
    const USER: &str = r#"{"role":"user","content":[{"type":"input_text","text":""#;
    let first = &body[body.rfind(USER)? + USER.len()..];
    let first = &first[..first.find('"')?];
    if !first.starts_with("[MODE:") {
        return None;
    }
    let (_, rest) = first.split_once(r"[INSTRUCTION]\n")?;
    let rest = rest.strip_prefix(MARKER)?.strip_prefix(' ')?;
    let id: String =
        rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_').collect();
    (!id.is_empty()).then_some(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marker_is_read_from_the_instruction_part_only() {
        let body = serde_json::json!({"input": [
            {"role": "system", "content": [{"type": "input_text", "text": "boot"}]},
            {"role": "user", "content": [
                {"type": "input_text", "text": "[MODE: GENERAL]\n\n[INSTRUCTION]\nbench-turn b000042: how?"},
                {"type": "input_text", "text": "[CONTEXT]\nbench-turn other: ..."},
                {"type": "input_text", "text": r#"{"role":"user","content":[{"type":"input_text","text":"[MODE: X]\n\n[INSTRUCTION]\nbench-turn quoted: ..."#}
            ]}
        ]});
        assert_eq!(turn_marker(&body.to_string()).as_deref(), Some("b000042"));
        let later = serde_json::json!({"input": [{"role": "user", "content": [{"type": "input_text", "text": "[MODE: X]\n\n[INSTRUCTION]\nplain"}]}]});
        assert_eq!(turn_marker(&later.to_string()), None);
    }
}
