//! The request bodies the driver publishes: real `AgentExecuteRequest` JSON whose instruction
//! starts with `bench-turn <id>:`, optionally with one active file. A session's file is built
//! once and spliced into each of its requests, so the driver's own work (counted with the
//! pipeline's process) stays small next to what it measures.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::timed_llm::MARKER;
use aptix::contracts::SessionId;

/// Questions cycled through by the turns; each retrieves different chunks from the crate's own
/// source (or few from the fixture).
const QUESTIONS: [&str; 8] = [
    "how does the broker runtime wait for publisher confirms before it acks a delivery?",
    "where are turns of one session admitted in arrival order?",
    "explain how the invoke stage saves the provider answer before forwarding it",
    "how is the AGN-002 context block rendered for retrieved chunks?",
    "what happens when the provider reports previous_response_not_found?",
    "how are retries delayed through the delay queues and dead-lettered?",
    "how does the persist stage write the record and the outbox in one transaction?",
    "which rules reject an InputArtifacts RelativePath?",
];

/// A user turn request whose instruction starts with `bench-turn <id>:`.
pub fn request(session: &SessionId, turn_id: &str) -> Vec<u8> {
    let n: usize = turn_id
        .bytes()
        .filter(u8::is_ascii_digit)
        .fold(0, |a, d| a.wrapping_mul(10).wrapping_add(usize::from(d - b'0')));
    let question = QUESTIONS[n % QUESTIONS.len()];
    let body = serde_json::json!({
        "SessionId": session,
        "TurnId": turn_id,
        "Instruction": format!("{MARKER} {turn_id}: {question}"),
    });
    serde_json::to_vec(&body).unwrap_or_default()
}

/// Request bodies with an active file of a fixed size, each session's built once.
#[derive(Debug, Default)]
pub struct Bodies {
    file_bytes: usize,
    /// Each session's `"InputArtifacts":[...]` member, serialised.
    files: Mutex<HashMap<SessionId, Arc<str>>>,
}

impl Bodies {
    /// Bodies whose requests carry a file of `bytes` bytes (none for 0).
    pub fn with_file(bytes: usize) -> Bodies {
        Bodies { file_bytes: bytes, files: Mutex::default() }
    }

    /// A request of `session` for `turn_id`, with the session's file if there is one.
    pub fn request(&self, session: &SessionId, turn_id: &str) -> Vec<u8> {
        let mut body = request(session, turn_id);
        if self.file_bytes == 0 {
            return body;
        }
        let member = self.member(session);
        // The body is a JSON object: the member goes in before its closing brace.
        body.pop();
        body.push(b',');
        body.extend_from_slice(member.as_bytes());
        body.push(b'}');
        body
    }

    fn member(&self, session: &SessionId) -> Arc<str> {
        let mut files = self.files.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let built = files.entry(*session).or_insert_with(|| member(session, self.file_bytes));
        built.clone()
    }
}

/// The `InputArtifacts` member with one file of `bytes` bytes: Rust-like lines, the session's
/// id in the first, so sessions' files differ (an editor sends its open file on every turn).
fn member(session: &SessionId, bytes: usize) -> Arc<str> {
    let mut contents = format!("// bench file of session {session}\n");
    let mut i = 0u64;
    while contents.len() < bytes {
        contents.push_str(&format!(
            "pub fn bench_step_{i}(x: u64) -> u64 {{ x.wrapping_mul({i}) + 1 }}\n"
        ));
        i += 1;
    }
    contents.truncate(bytes);
    let files = serde_json::json!([{
        "RelativePath": "src/bench_active.rs",
        "FileName": "bench_active.rs",
        "Contents": contents,
        "Origin": "ide",
    }]);
    format!("\"InputArtifacts\":{files}").into()
}
