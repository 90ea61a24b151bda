//! Shared helpers of the LLM client and simulator tests: a simulator on an ephemeral port,
//! client settings with short timeouts, and `/responses` bodies shaped as DESIGN.md §5 says.

#![allow(dead_code)]

use std::time::Duration;

use aptix::config::{ConnectionUrl, LlmSettings};
use aptix::sim::{self, SimConfig, SimHandle};
use serde_json::{json, Value};

/// A 1×1 PNG, base64.
pub const PNG_1X1: &str =
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==";

/// A simulator with default settings, a short hang limit, and the given key requirement.
pub async fn start_sim(api_key: Option<&str>) -> SimHandle {
    let config = SimConfig {
        api_key: api_key.map(str::to_owned),
        hang_limit: Duration::from_secs(10),
        delta_chars: 8,
        ..SimConfig::default()
    };
    sim::start(config).await.expect("simulator starts")
}

/// Client settings for tests: short timeouts and backoff, two retries.
pub fn settings(base_url: &str) -> LlmSettings {
    LlmSettings {
        base_url: ConnectionUrl::new(base_url),
        api_key: None,
        connect_timeout_ms: 300,
        request_timeout_ms: 1500,
        stream_idle_timeout_ms: 400,
        max_retries: 2,
        retry_initial_delay_ms: 10,
        retry_max_delay_ms: 40,
        retry_after_max_ms: 3000,
        call_budget_ms: 60_000,
    }
}

/// The configured tools of the example configuration, in Responses shape.
pub fn tools() -> Value {
    json!([
        {"type":"function","name":"read_file","description":"Read a file.","strict":true,
         "parameters":{"type":"object","properties":{"path":{"type":"string"}},"required":["path"],"additionalProperties":false}},
        {"type":"function","name":"run_tests","description":"Run tests.","strict":true,
         "parameters":{"type":"object","properties":{"filter":{"type":["string","null"]}},"required":["filter"],"additionalProperties":false}}
    ])
}

/// A first-turn body: system message, the AGN-003 user message with two `[CONTEXT]` chunks, tools.
pub fn first_turn(instruction: &str, stream: bool) -> Value {
    let context = "[CONTEXT]\n\n=== CHUNK 1 ===\nId: c1\nPath: src/a.rs\nLines: 1-2\nLanguage: rust\n```rust\nfn a() {}\n```\n\n\
                   === CHUNK 2 ===\nId: c2\nPath: src/b.rs\nLines: 3-4\nLanguage: rust\n```rust\nfn b() {}\n```\n";
    json!({
        "model": "gpt-sim",
        "input": [
            {"role":"system","content":[{"type":"input_text","text":"You are the Aptix Reasoner."}]},
            {"role":"user","content":[
                {"type":"input_text","text": format!("[MODE: GENERAL]\n\n[INSTRUCTION]\n{instruction}")},
                {"type":"input_text","text": context}
            ]}
        ],
        "tools": tools(),
        "store": true,
        "stream": stream,
    })
}

/// A follow-up turn in a chain: only the new user message, tools re-sent.
pub fn next_turn(previous: &str, instruction: &str, stream: bool) -> Value {
    json!({
        "model": "gpt-sim",
        "previous_response_id": previous,
        "input": [{"role":"user","content":[{"type":"input_text","text": format!("[MODE: GENERAL]\n\n[INSTRUCTION]\n{instruction}")}]}],
        "tools": tools(),
        "store": true,
        "stream": stream,
    })
}

/// A tool continuation: one `function_call_output` per `(call_id, output)`.
pub fn tool_outputs(previous: &str, outputs: &[(&str, &str)]) -> Value {
    let input: Vec<Value> = outputs
        .iter()
        .map(|(id, out)| json!({"type":"function_call_output","call_id": id, "output": out}))
        .collect();
    json!({"model":"gpt-sim","previous_response_id": previous,"input": input,"tools": tools(),"store": true})
}
