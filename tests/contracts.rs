//! AGN-033 response shapes: round trips for both kinds, and the bucket rules enforced on read.

// Test helpers fail loudly by design.
#![allow(clippy::unwrap_used)]

use aptix::contracts::{
    AgentExecuteResponse, ApiError, ErrorCode, FileRef, FinalOutput, InvokeResult, Outcome, Reply,
    SessionId, ToolCall, ToolContinuationOutput, ToolOutcome, ToolResult, Usage, UserWarning,
};
use serde_json::{json, Value};

const SID: &str = "5f0c6f7e-8a1b-4c2d-9e3f-0a1b2c3d4e5f";

fn envelope(outcome: Outcome) -> AgentExecuteResponse {
    AgentExecuteResponse {
        session_id: SID.parse::<SessionId>().unwrap(),
        turn_id: "t-1".parse().unwrap(),
        mode_display_name: "DDR Creation".into(),
        outcome,
    }
}

#[test]
fn final_response_round_trips_with_all_allowed_buckets() {
    let out = FinalOutput {
        primary_output_text: "Done.\n```aptix-json\n{}\n```".into(),
        files: vec![FileRef {
            name: "plan.md".into(),
            mime_type: "text/markdown".into(),
            url: "https://files.example/plan.md".into(),
            size_bytes: 42,
            content_hash: "sha256:ab".into(),
            description: None,
            content_expires: Some("2026-12-01T00:00:00Z".into()),
        }],
        tool_results: vec![ToolResult {
            tool_call_id: "s1".into(),
            name: Some("search_code".into()),
            execution_ms: 3,
            outcome: ToolOutcome::ResultJson("{}".into()),
        }],
        user_warnings: vec![UserWarning {
            code: "files.skipped_too_large".into(),
            message: "big.cs was not sent".into(),
        }],
        usage: Some(Usage {
            input_tokens: 10,
            output_tokens: 5,
            total_tokens: 15,
            cached_input_tokens: 2,
            reasoning_tokens: 1,
        }),
    };
    let reply: Reply = InvokeResult::ok(envelope(Outcome::Final(out)));
    let v = serde_json::to_value(&reply).unwrap();
    assert_eq!(v["Successful"], true);
    assert_eq!(v["Result"]["Kind"], "final");
    assert_eq!(v["Result"]["SessionId"], SID);
    assert_eq!(v["Result"]["ToolResults"][0]["ResultJson"], "{}");
    assert!(v["Result"].get("ToolCalls").is_none());
    assert!(v["Result"]["Files"][0].get("Description").is_none());
    let back: Reply = serde_json::from_value(v).unwrap();
    assert_eq!(back, reply);
}

#[test]
fn minimal_final_omits_empty_buckets() {
    let reply: Reply = InvokeResult::ok(envelope(Outcome::Final(FinalOutput::text("hi"))));
    let v = serde_json::to_value(&reply).unwrap();
    let keys: Vec<&String> = v["Result"].as_object().unwrap().keys().collect();
    assert_eq!(keys, ["SessionId", "TurnId", "ModeDisplayName", "Kind", "PrimaryOutputText"]);
}

#[test]
fn continuation_round_trips_and_carries_no_final_buckets() {
    let calls = vec![
        ToolCall {
            tool_call_id: "call_1".into(),
            name: "read_file".into(),
            arguments_json: "{\"path\":\"a\"}".into(),
        },
        ToolCall {
            tool_call_id: "call_2".into(),
            name: "run_tests".into(),
            arguments_json: "{}".into(),
        },
    ];
    let out = ToolContinuationOutput::new(calls, Some("Reading files".into())).unwrap();
    let reply: Reply = InvokeResult::ok(envelope(Outcome::ClientToolContinuation(out)));
    let v = serde_json::to_value(&reply).unwrap();
    assert_eq!(v["Result"]["Kind"], "client_tool_continuation");
    assert_eq!(v["Result"]["ToolCalls"][1]["ToolCallId"], "call_2");
    for forbidden in ["PrimaryOutputText", "Files", "ToolResults", "UserWarnings", "Usage"] {
        assert!(v["Result"].get(forbidden).is_none(), "{forbidden} present");
    }
    let back: Reply = serde_json::from_value(v).unwrap();
    assert_eq!(back, reply);
}

#[test]
fn empty_tool_calls_cannot_be_built_or_read() {
    assert!(ToolContinuationOutput::new(vec![], None).is_none());
    let v = json!({"SessionId": SID, "TurnId": "t", "ModeDisplayName": "m", "Kind": "client_tool_continuation", "ToolCalls": []});
    assert!(serde_json::from_value::<AgentExecuteResponse>(v).is_err());
}

fn response_json(kind: &str, extra: Value) -> Value {
    let mut v = json!({"SessionId": SID, "TurnId": "t", "ModeDisplayName": "m", "Kind": kind});
    for (k, x) in extra.as_object().unwrap() {
        v[k] = x.clone();
    }
    v
}

#[test]
fn forbidden_buckets_are_rejected_on_read() {
    let call = json!([{"ToolCallId": "c", "Name": "n", "ArgumentsJson": "{}"}]);
    let bad = [
        response_json("final", json!({"PrimaryOutputText": "x", "ToolCalls": call})),
        response_json("final", json!({"PrimaryOutputText": "x", "ToolContinuationMessage": "m"})),
        response_json("final", json!({})),
        response_json(
            "client_tool_continuation",
            json!({"ToolCalls": call, "PrimaryOutputText": "x"}),
        ),
        response_json("client_tool_continuation", json!({"ToolCalls": call, "Files": []})),
        response_json("client_tool_continuation", json!({"ToolCalls": call, "Usage": null})),
        response_json("client_tool_continuation", json!({"ToolCalls": call, "UserWarnings": []})),
        response_json("streaming", json!({"PrimaryOutputText": "x"})),
    ];
    for v in bad {
        assert!(serde_json::from_value::<AgentExecuteResponse>(v.clone()).is_err(), "accepted {v}");
    }
}

#[test]
fn failed_invoke_result_has_errors_and_null_result() {
    let reply: Reply = InvokeResult::fail(vec![ApiError::at(
        ErrorCode::InstructionMissing,
        "Instruction",
        "needed",
    )]);
    let v = serde_json::to_value(&reply).unwrap();
    assert_eq!(
        v,
        json!({"Successful": false, "Result": null, "Warnings": [],
               "Errors": [{"Code": "validation.instruction_missing", "Message": "needed", "Field": "Instruction"}]})
    );
    let inconsistent = [
        json!({"Successful": true, "Result": null, "Errors": [], "Warnings": []}),
        json!({"Successful": false, "Result": null, "Errors": [], "Warnings": []}),
        json!({"Successful": false, "Result": null, "Errors": [{"Code": "no.such_code", "Message": "x"}], "Warnings": []}),
    ];
    for v in inconsistent {
        assert!(serde_json::from_value::<Reply>(v.clone()).is_err(), "accepted {v}");
    }
}

#[test]
fn a_failed_reply_names_its_session_and_turn_after_the_envelope() {
    let turn: aptix::contracts::TurnId = "t-1".parse().unwrap();
    let reply: Reply = InvokeResult::fail(vec![ApiError::new(ErrorCode::LlmUnavailable, "down")])
        .about(SID.parse().unwrap(), Some(turn.clone()));
    let v = serde_json::to_value(&reply).unwrap();
    assert_eq!(
        v,
        json!({"Successful": false, "Result": null,
               "Errors": [{"Code": "llm.unavailable", "Message": "down"}], "Warnings": [],
               "SessionId": SID, "TurnId": "t-1"})
    );
    let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
    assert_eq!(keys, ["Successful", "Result", "Errors", "Warnings", "SessionId", "TurnId"]);
    let back: Reply = serde_json::from_value(v).unwrap();
    assert_eq!(back, reply);
    assert_eq!(back.session_id().map(|s| s.to_string()).as_deref(), Some(SID));
    assert_eq!(back.turn_id(), Some(&turn));

    // A turn the request did not name validly is left out, not null.
    let refused: Reply = InvokeResult::fail(vec![ApiError::new(ErrorCode::TurnIdInvalid, "bad")])
        .about(SID.parse().unwrap(), None);
    let v = serde_json::to_value(&refused).unwrap();
    assert_eq!(v["SessionId"], SID);
    assert!(v.get("TurnId").is_none(), "{v}");

    // Bodies stored before the two properties existed still read; malformed ones do not.
    let old = json!({"Successful": false, "Result": null, "Warnings": [],
                     "Errors": [{"Code": "llm.unavailable", "Message": "down"}]});
    let read: Reply = serde_json::from_value(old).unwrap();
    assert_eq!((read.session_id(), read.turn_id()), (None, None));
    for bad in [json!({"SessionId": "not-a-uuid"}), json!({"TurnId": "has space"})] {
        let mut body = json!({"Successful": false, "Result": null, "Warnings": [],
                              "Errors": [{"Code": "llm.unavailable", "Message": "down"}]});
        for (k, x) in bad.as_object().unwrap() {
            body[k] = x.clone();
        }
        assert!(serde_json::from_value::<Reply>(body.clone()).is_err(), "accepted {body}");
    }
}
