//! The committed JSON Schemas under `schemas/` match the types and say what the docs say: each
//! file of `tests/schema_corpus/<schema>/valid/` passes its schema and each of `invalid/` fails
//! it; valid requests are accepted by the server's own validation and valid replies and deltas
//! are read by the Rust types; replies and deltas built by the server pass. Regenerate the
//! committed schemas with `APTIX_BLESS=1 cargo test --test testsuite -- schemas::`.

// Test helpers fail loudly by design.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

use aptix::contracts::{
    AgentExecuteResponse, ApiError, ErrorCode, FinalOutput, InvokeResult, Outcome, Reply,
    ReplyDelta, SessionId, ToolCall, ToolContinuationOutput, Usage,
};
use aptix::llm::{DeltaEvent, StreamDelta};
use serde_json::{json, Value};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

/// The committed schema `name` (`request`, `response`, `delta`), compiled.
fn validator(name: &str) -> jsonschema::Validator {
    let file = aptix::schema::named(name).unwrap();
    let text = std::fs::read_to_string(root().join("schemas").join(file.file_name)).unwrap();
    let schema: Value = serde_json::from_str(&text).unwrap();
    jsonschema::draft202012::new(&schema).unwrap()
}

/// `(file name, parsed body)` of every corpus file of `name/kind`, sorted.
fn corpus(name: &str, kind: &str) -> Vec<(String, Value)> {
    let dir = root().join("tests/schema_corpus").join(name).join(kind);
    let mut files: Vec<PathBuf> =
        std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    assert!(!files.is_empty(), "no corpus files in {}", dir.display());
    let read = |p: &PathBuf| serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
    files.iter().map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), read(p))).collect()
}

fn errors_of(v: &jsonschema::Validator, instance: &Value) -> Vec<String> {
    v.iter_errors(instance).map(|e| format!("{} at {}", e, e.instance_path())).collect()
}

#[test]
fn committed_schemas_are_current() {
    let dir = root().join("schemas");
    let bless = std::env::var_os("APTIX_BLESS").is_some();
    for file in aptix::schema::all() {
        let path = dir.join(file.file_name);
        let expected = aptix::schema::render(&file.schema);
        if bless {
            std::fs::write(&path, &expected).unwrap();
            continue;
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            committed == expected,
            "{} is stale: run APTIX_BLESS=1 cargo test --test testsuite -- schemas::",
            path.display()
        );
    }
}

#[test]
fn every_corpus_file_passes_or_fails_its_schema_as_filed() {
    for name in ["request", "response", "delta"] {
        let v = validator(name);
        for (file, body) in corpus(name, "valid") {
            let errors = errors_of(&v, &body);
            assert!(errors.is_empty(), "{name}/valid/{file} fails: {errors:?}");
        }
        for (file, body) in corpus(name, "invalid") {
            assert!(!v.is_valid(&body), "{name}/invalid/{file} passes the {name} schema");
        }
    }
}

#[test]
fn the_examples_are_what_the_request_schema_says() {
    let v = validator("request");
    for (file, valid) in
        [("user-turn.json", true), ("tool-continuation.json", true), ("invalid.json", false)]
    {
        let body: Value = serde_json::from_str(
            &std::fs::read_to_string(root().join("examples").join(file)).unwrap(),
        )
        .unwrap();
        assert_eq!(v.is_valid(&body), valid, "examples/{file}: {:?}", errors_of(&v, &body));
    }
}

#[test]
fn requests_the_schema_accepts_the_server_accepts() {
    let limits = aptix::rules::Limits::default();
    for (file, body) in corpus("request", "valid") {
        let bytes = serde_json::to_vec(&body).unwrap();
        if let Err(e) = aptix::rules::validate_bytes(&bytes, &limits) {
            panic!("request/valid/{file} is refused by the server: {e}");
        }
    }
}

#[test]
fn replies_and_deltas_the_schema_accepts_are_read_by_the_types() {
    for (file, body) in corpus("response", "valid") {
        let reply: Reply = serde_json::from_value(body.clone())
            .unwrap_or_else(|e| panic!("response/valid/{file} is not a Reply: {e}"));
        // Written back the same way: the corpus is what the server sends.
        assert_eq!(serde_json::to_value(&reply).unwrap(), body, "response/valid/{file}");
    }
    for (file, body) in corpus("delta", "valid") {
        let delta: ReplyDelta = serde_json::from_value(body.clone())
            .unwrap_or_else(|e| panic!("delta/valid/{file} is not a ReplyDelta: {e}"));
        assert_eq!(serde_json::to_value(&delta).unwrap(), body, "delta/valid/{file}");
    }
}

fn response(outcome: Outcome) -> AgentExecuteResponse {
    AgentExecuteResponse {
        session_id: SessionId::random(),
        turn_id: "turn-7".parse().unwrap(),
        mode_display_name: "DDR Creation".into(),
        outcome,
    }
}

#[test]
fn replies_built_by_the_server_pass_the_response_schema() {
    let v = validator("response");
    let mut final_output = FinalOutput::text("done");
    final_output.usage =
        Some(Usage { input_tokens: 3, output_tokens: 2, total_tokens: 5, ..Usage::default() });
    let call = ToolCall {
        tool_call_id: "call_1".into(),
        name: "read_file".into(),
        arguments_json: "{}".into(),
    };
    let tools = ToolContinuationOutput::new(vec![call], Some("reading".into())).unwrap();
    let replies: Vec<Reply> = vec![
        InvokeResult::ok(response(Outcome::Final(FinalOutput::text("plain")))),
        InvokeResult::ok(response(Outcome::Final(final_output))),
        InvokeResult::ok(response(Outcome::ClientToolContinuation(tools))),
        InvokeResult::fail(vec![ApiError::at(ErrorCode::TurnConflict, "TurnId", "used before")]),
        InvokeResult::fail(vec![]),
        InvokeResult::fail(vec![ApiError::new(ErrorCode::LlmUnavailable, "down")])
            .about(SessionId::random(), Some("turn-7".parse().unwrap())),
        InvokeResult::fail(vec![ApiError::new(ErrorCode::SessionUnavailable, "not yours")])
            .about(SessionId::random(), None),
        InvokeResult::ok(response(Outcome::Final(FinalOutput::text("named"))))
            .about(SessionId::random(), Some("turn-7".parse().unwrap())),
    ];
    for reply in replies {
        let body = serde_json::to_value(&reply).unwrap();
        assert!(v.is_valid(&body), "{body}: {:?}", errors_of(&v, &body));
    }
}

#[test]
fn deltas_published_by_the_invoke_stage_pass_the_delta_schema() {
    let v = validator("delta");
    let topology = aptix::broker::Topology::new("t-schema");
    let key = aptix::contracts::TurnKey {
        session_id: SessionId::random(),
        turn_id: "turn-7".parse().unwrap(),
    };
    let events = [
        DeltaEvent::Started { response_id: "resp_1".into() },
        DeltaEvent::OutputText { output_index: 0, text: "Hel".into() },
        DeltaEvent::ToolCallStarted {
            output_index: 1,
            call_id: "call_1".into(),
            name: "read_file".into(),
        },
        DeltaEvent::ToolArguments { call_id: "call_1".into(), text: "{\"pa".into() },
    ];
    for (seq, event) in events.into_iter().enumerate() {
        let delta = StreamDelta { seq: seq as u64, event };
        let msg = aptix::stage::delta_message(&topology, &key, 2, &delta);
        let body: Value = serde_json::from_slice(&msg.body).unwrap();
        assert!(v.is_valid(&body), "{body}: {:?}", errors_of(&v, &body));
        let typed = ReplyDelta::new(key.session_id, key.turn_id.clone(), 2, &delta);
        assert_eq!(
            serde_json::to_value(&typed).unwrap(),
            body,
            "ReplyDelta differs from what invoke publishes"
        );
    }
}

#[test]
fn the_request_schema_names_every_field_and_keeps_the_scenarios_apart() {
    let schema = serde_json::to_value(aptix::schema::named("request").unwrap().schema).unwrap();
    let user = &schema["$defs"]["UserTurnRequest"];
    let continuation = &schema["$defs"]["ToolContinuationSubmission"];
    let approval = &schema["$defs"]["ToolApprovalSubmission"];
    for def in [user, continuation, approval] {
        assert_eq!(def["additionalProperties"], false);
    }
    let names =
        |d: &Value| d["properties"].as_object().unwrap().keys().cloned().collect::<Vec<_>>();
    let mut all = names(user);
    all.extend(names(continuation));
    all.extend(names(approval));
    for field in aptix::contracts::request::REQUEST_FIELDS {
        assert!(all.iter().any(|n| n == field), "{field} missing from the schema");
    }
    assert_eq!(names(continuation), ["SessionId", "TurnId", "ToolResults"]);
    assert_eq!(names(approval), ["SessionId", "TurnId", "ToolApprovals"]);
    assert!(!names(user).iter().any(|n| n == "ToolResults" || n == "ToolApprovals"));
    assert_eq!(continuation["required"], json!(["SessionId", "TurnId", "ToolResults"]));
    assert_eq!(approval["required"], json!(["SessionId", "TurnId", "ToolApprovals"]));
}

#[test]
fn the_schemas_take_an_approval_and_refuse_a_message_on_an_approved_call() {
    let v = validator("request");
    let s = "5f0c6f7e-8a1b-4c2d-9e3f-0a1b2c3d4e5f";
    let ok = json!({"SessionId": s, "TurnId": "t1", "ToolApprovals": [
        {"ToolCallId": "c1", "Approved": true}, {"ToolCallId": "c2", "Approved": false, "Message": "no"}]});
    assert!(v.is_valid(&ok), "{:?}", errors_of(&v, &ok));
    let message_on_approval = json!({"SessionId": s, "TurnId": "t1",
        "ToolApprovals": [{"ToolCallId": "c1", "Approved": true, "Message": "fine"}]});
    assert!(!v.is_valid(&message_on_approval));
    let both = json!({"SessionId": s, "TurnId": "t1", "ToolApprovals": [{"ToolCallId": "c1", "Approved": true}],
        "ToolResults": [{"ToolCallId": "c1", "ExecutionMs": 1, "ResultJson": "{}"}]});
    assert!(!v.is_valid(&both));
    let v = validator("response");
    let asked = json!({"Successful": true, "Errors": [], "Warnings": [], "SessionId": s, "TurnId": "t1",
        "Result": {"SessionId": s, "TurnId": "t1", "ModeDisplayName": "m", "Kind": "tool_approval_required",
            "ToolCalls": [{"ToolCallId": "c1", "Name": "write_file", "ArgumentsJson": "{}"}],
            "ApprovalExpiresAt": "2026-11-29T12:00:00Z"}});
    assert!(v.is_valid(&asked), "{:?}", errors_of(&v, &asked));
    let mut with_text = asked.clone();
    with_text["Result"]["PrimaryOutputText"] = json!("no");
    assert!(!v.is_valid(&with_text), "a forbidden bucket passed");
}
