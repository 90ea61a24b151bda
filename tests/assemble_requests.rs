//! The `/responses` request body and the record of what was sent, in every situation of the
//! delta policy: golden files under `tests/golden/requests/` (`APTIX_BLESS=1` rewrites them),
//! and every body is also written to `tests/out/responses-requests/` for
//! `check-responses-request`, which `.ci/run` runs after the tests.

// Helpers outside #[test] functions unwrap too: a failed fixture should fail the test loudly.
#![allow(clippy::unwrap_used)]

use crate::assemble_support;

use aptix::assemble::{
    assemble, AnswerOutcome, AssembleInput, AssemblePolicy, Assembled, ChainStatus, ProviderAnswer,
    SessionState, TurnInput,
};
use aptix::chunk::Chunk;
use aptix::config::{ConversationContext, FunctionTool};
use aptix::contracts::{ErrorCode, Steer, ToolCall, ToolContinuation, UserTurn, ValidatedRequest};
use aptix::rules::{validate_bytes, Limits};
use assemble_support::{assert_golden, pretty, write_request_body};
use chrono::{DateTime, TimeDelta, TimeZone, Utc};
use serde_json::{json, Value};

const SID: &str = "5f0c6f7e-8a1b-4c2d-9e3f-0a1b2c3d4e5f";

fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 1, 5, 10, 0, 0).unwrap()
}

fn context() -> ConversationContext {
    let tool = |name: &str, description: &str, parameters: Value| FunctionTool {
        name: name.into(),
        description: description.into(),
        parameters,
        strict: true,
    };
    ConversationContext {
        mode: "DDR_CREATION".into(),
        mode_display_name: "DDR creation".into(),
        model: "gpt-5.1".into(),
        system_prompt:
            "You are the Aptix Reasoner. Treat each [CONTEXT] chunk as authoritative for its line span."
                .into(),
        tools: vec![
            tool(
                "read_file",
                "Read a workspace file.",
                json!({"type":"object","properties":{"path":{"type":"string"}},"required":["path"],"additionalProperties":false}),
            ),
            tool(
                "run_tests",
                "Run the test suite.",
                json!({"type":"object","properties":{"filter":{"type":["string","null"]}},"required":["filter"],"additionalProperties":false}),
            ),
        ],
        tool_choice: None,
        // Offered on every call, so the official schema check covers their definitions.
        server_tools: aptix::config::ServerTools {
            enabled: aptix::config::ServerTool::ALL.to_vec(),
            max_rounds: 4,
            ..Default::default()
        },
        temperature: Some(0.2),
        top_k: 8,
        chunk_budget_chars: 24_000,
        follow_up: Default::default(),
        follow_up_allowed: vec![aptix::config::FollowUp::Enqueue],
        // Sent as `max_output_tokens`, so the official schema check covers it.
        max_output_tokens: Some(4096),
        usd_per_day: Default::default(),
        usd_per_month: Default::default(),
    }
}

fn validated(mut v: Value) -> ValidatedRequest {
    v["SessionId"] = json!(SID);
    validate_bytes(&serde_json::to_vec(&v).unwrap(), &Limits::structural_only()).unwrap()
}

fn user_turn(v: Value) -> UserTurn {
    match validated(v) {
        ValidatedRequest::UserTurn(t) => t,
        other => panic!("not a user turn: {other:?}"),
    }
}

fn continuation(v: Value) -> ToolContinuation {
    match validated(v) {
        ValidatedRequest::ToolContinuation(c) => c,
        other => panic!("not a continuation: {other:?}"),
    }
}

fn chunk(id: &str, path: &str, lines: (u32, u32), language: &str, text: &str) -> Chunk {
    Chunk {
        id: id.into(),
        path: path.into(),
        start_line: lines.0,
        end_line: lines.1,
        language: language.into(),
        text: text.into(),
        repo: Some("billing".into()),
        score: Some(0.5),
    }
}

fn invoice_chunks() -> Vec<Chunk> {
    vec![
        chunk(
            "ctx_1",
            "Billing/Managers/InvoiceManager.cs",
            (40, 45),
            "csharp",
            "public class InvoiceManager\n{\n    public void SendInvoiceEmail(Invoice invoice) { }\n}\n",
        ),
        chunk(
            "ctx_2",
            "Billing/Api/InvoiceController.cs",
            (10, 12),
            "csharp",
            "[ApiController]\npublic class InvoiceController : ControllerBase { }",
        ),
    ]
}

fn artifact(path: &str, contents: &str) -> Value {
    json!({"RelativePath": path, "FileName": path.rsplit('/').next().unwrap(), "Contents": contents, "Origin": "ide"})
}

fn calls() -> Vec<ToolCall> {
    vec![
        ToolCall {
            tool_call_id: "call_1".into(),
            name: "read_file".into(),
            arguments_json: r#"{"path":"Billing/Managers/InvoiceManager.cs"}"#.into(),
        },
        ToolCall {
            tool_call_id: "call_2".into(),
            name: "run_tests".into(),
            arguments_json: r#"{"filter":null}"#.into(),
        },
    ]
}

/// A session driven through assemble and answer, as the pipeline drives it.
struct Session {
    state: SessionState,
    policy: AssemblePolicy,
    context: ConversationContext,
    answers: u32,
}

impl Session {
    fn new() -> Self {
        Session {
            state: SessionState::default(),
            policy: AssemblePolicy::default(),
            context: context(),
            answers: 0,
        }
    }

    fn user(&self, turn: &UserTurn, chunks: &[Chunk], now: DateTime<Utc>) -> Assembled {
        let input = AssembleInput {
            mcp_tools: &[],
            state: &self.state,
            context: &self.context,
            policy: &self.policy,
            now,
            turn: TurnInput::User { turn, chunks },
        };
        assemble(input).unwrap()
    }

    fn tools(&self, c: &ToolContinuation, pending: &[ToolCall], now: DateTime<Utc>) -> Assembled {
        self.steered(c, pending, &[], now)
    }

    fn steered(
        &self,
        c: &ToolContinuation,
        pending: &[ToolCall],
        steers: &[Steer],
        now: DateTime<Utc>,
    ) -> Assembled {
        let turn = TurnInput::ToolContinuation { continuation: c, pending, stream: false, steers };
        let input = AssembleInput {
            mcp_tools: &[],
            state: &self.state,
            context: &self.context,
            policy: &self.policy,
            now,
            turn,
        };
        assemble(input).unwrap()
    }

    fn answer(&mut self, a: &Assembled, at: DateTime<Utc>, outcome: AnswerOutcome) {
        self.answers += 1;
        let answer = ProviderAnswer {
            response_id: format!("resp_{:03}", self.answers),
            created_at: at,
            outcome,
        };
        self.state = self.state.apply_answer(&a.update, &answer, &self.policy);
    }

    fn final_answer(&mut self, a: &Assembled, at: DateTime<Utc>, text: &str) {
        self.answer(a, at, AnswerOutcome::Final { output_text: text.into() });
    }
}

/// Checks the golden body and record of a scenario and writes the body for the schema check.
fn golden(name: &str, a: &Assembled) {
    write_request_body(name, &a.body.to_value());
    assert_golden(&format!("requests/{name}.body.json"), &pretty(&a.body.to_value()));
    assert_golden(&format!("requests/{name}.record.json"), &pretty(&a.record));
    check_invariants(name, &a.body.to_value());
}

/// What every body must satisfy whatever the situation (DESIGN.md §5).
fn check_invariants(name: &str, body: &Value) {
    assert_eq!(body["model"], "gpt-5.1", "{name}");
    assert_eq!(body["store"], true, "{name}");
    assert!(body["stream"].is_boolean(), "{name}");
    let tools: Vec<&str> =
        body["tools"].as_array().into_iter().flatten().filter_map(|t| t["name"].as_str()).collect();
    assert_eq!(
        tools,
        ["read_file", "run_tests", "search_code", "write_file"],
        "{name}: tools on every call"
    );
    assert_eq!(body["temperature"], json!(0.2), "{name}");
    assert!(body.get("instructions").is_none(), "{name}: the system prompt goes in input");
    let input = body["input"].as_array().unwrap();
    let systems = input.iter().filter(|i| i["role"] == "system").count();
    let continued = body.get("previous_response_id").is_some();
    assert_eq!(
        systems,
        usize::from(!continued),
        "{name}: system message on a chain's first call only"
    );
    if !continued {
        assert_eq!(input[0]["role"], "system", "{name}");
    }
    for item in input.iter().filter(|i| i.get("role").is_some()) {
        for part in item["content"].as_array().unwrap() {
            assert!(
                matches!(part["type"].as_str(), Some("input_text" | "input_image")),
                "{name}: {part}"
            );
        }
    }
}

fn texts(message: &Value) -> Vec<&str> {
    message["content"].as_array().unwrap().iter().filter_map(|p| p["text"].as_str()).collect()
}

fn first_turn_request() -> UserTurn {
    user_turn(json!({
        "TurnId": "turn-1",
        "Instruction": "Create a DDR for the invoice e-mail flow.",
        "InputArtifacts": [artifact("Billing/Managers/InvoiceManager.cs", "public class InvoiceManager\n{\n}\n")],
        "SolutionContextText": "Solution Billing.sln; agent.aptix present; C# 12.",
        "Stream": true
    }))
}

#[test]
fn first_turn() {
    let mut s = Session::new();
    s.context.tool_choice = Some("read_file".into());
    let a = s.user(&first_turn_request(), &invoice_chunks(), t0());
    golden("first-turn", &a);
    assert_eq!(a.body.to_value()["tool_choice"], json!({"type": "function", "name": "read_file"}));
    assert_eq!(a.body.to_value()["stream"], true);
    assert_eq!(a.record.chain.status, ChainStatus::New);
    let body = a.body.to_value();
    let user = &body["input"][1];
    let parts = texts(user);
    assert!(parts[0].starts_with("[MODE: DDR_CREATION]\n\n[INSTRUCTION]\nCreate a DDR"));
    // The retrieved chunk of InvoiceManager.cs is superseded by the active file.
    assert!(parts[1].starts_with("[CONTEXT]\n\n=== CHUNK 1 ===\nId: ctx_2\n"));
    assert!(parts[2].starts_with(
        "[ACTIVE FILES]\n\n=== CHUNK 2 ===\nId: file:Billing/Managers/InvoiceManager.cs@"
    ));
    assert_eq!(a.record.chunks_superseded[0].id, "ctx_1");
    assert!(parts[3].starts_with("[SOLUTION CONTEXT]\n"));
}

fn after_first_turn() -> Session {
    let mut s = Session::new();
    let a = s.user(&first_turn_request(), &invoice_chunks(), t0());
    s.final_answer(&a, t0(), "Here is the DDR draft.");
    s
}

#[test]
fn follow_up_sends_only_new_chunks() {
    let s = after_first_turn();
    let turn = user_turn(json!({"TurnId": "turn-2", "Instruction": "Add the retry policy."}));
    let mut chunks = invoice_chunks();
    chunks.push(chunk(
        "ctx_3",
        "Billing/Mail/RetryPolicy.cs",
        (1, 2),
        "csharp",
        "class RetryPolicy { }\n",
    ));
    let a = s.user(&turn, &chunks, t0() + TimeDelta::hours(1));
    golden("follow-up", &a);
    assert_eq!(a.body.to_value()["previous_response_id"], "resp_001");
    assert_eq!(a.body.to_value()["input"].as_array().unwrap().len(), 1);
    let ids: Vec<_> = a.record.chunks.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(ids, ["ctx_3"]);
    // ctx_2 was sent; ctx_1 is of a file the chain holds whole.
    assert_eq!(a.record.chunks_already_sent.len(), 1);
    assert_eq!(a.record.chunks_superseded.len(), 1);
    assert!(!a.record.solution_context_sent, "unchanged solution context is not resent");
}

/// The ConversationContext of the DDR example's second mode.
fn refinement() -> ConversationContext {
    ConversationContext {
        mode: "DDR_REFINEMENT".into(),
        mode_display_name: "DDR refinement".into(),
        system_prompt: "You refine an existing DDR. Change only what the user asks.".into(),
        ..context()
    }
}

#[test]
fn a_mode_change_on_a_live_chain_sends_the_new_boot_prompt_once() {
    let mut s = after_first_turn();
    s.context = refinement();
    let turn = user_turn(json!({"TurnId": "turn-2", "Instruction": "Tighten the retry section."}));
    let at = t0() + TimeDelta::hours(1);
    let a = s.user(&turn, &[], at);
    golden("mode-change", &a);
    let body = a.body.to_value();
    assert_eq!(body["previous_response_id"], "resp_001", "the chain goes on");
    let input = body["input"].as_array().unwrap();
    assert_eq!(input.len(), 2, "{body}");
    assert_eq!(input[0]["role"], "developer");
    assert!(texts(&input[0])[0].contains("You refine an existing DDR."), "{body}");
    assert!(texts(&input[1])[0].starts_with("[MODE: DDR_REFINEMENT]"), "{body}");
    assert_eq!(a.record.mode_changed_to.as_deref(), Some("DDR_REFINEMENT"));
    // Once the chain follows it, the same mode's next turn sends no prompt again.
    s.final_answer(&a, at, "Tightened.");
    let turn = user_turn(json!({"TurnId": "turn-3", "Instruction": "And the summary."}));
    let again = s.user(&turn, &[], at + TimeDelta::minutes(1));
    let body = again.body.to_value();
    assert_eq!(body["input"].as_array().unwrap().len(), 1, "{body}");
    assert_eq!(again.record.mode_changed_to, None);
    // Back to the first mode: its prompt again, as a developer message.
    s.final_answer(&again, at, "Done.");
    s.context = context();
    let turn = user_turn(json!({"TurnId": "turn-4", "Instruction": "New DDR for refunds."}));
    let back = s.user(&turn, &[], at + TimeDelta::minutes(2));
    write_request_body("mode-change-back", &back.body.to_value());
    check_invariants("mode-change-back", &back.body.to_value());
    let body = back.body.to_value();
    assert_eq!(body["input"][0]["role"], "developer", "{body}");
    assert!(texts(&body["input"][0])[0].contains("Aptix Reasoner"), "{body}");
    assert_eq!(back.record.mode_changed_to.as_deref(), Some("DDR_CREATION"));
}

#[test]
fn a_new_chain_after_a_mode_change_starts_with_that_modes_system_prompt() {
    let mut s = after_first_turn();
    s.context = refinement();
    let turn = user_turn(json!({"TurnId": "turn-2", "Instruction": "Tighten the retry section."}));
    // The chain expired: a rehydrated one starts with the new mode's prompt as its system message.
    let a = s.user(&turn, &[], t0() + TimeDelta::days(40));
    let body = a.body.to_value();
    assert!(body.get("previous_response_id").is_none());
    assert_eq!(body["input"][0]["role"], "system");
    assert!(texts(&body["input"][0])[0].contains("You refine an existing DDR."), "{body}");
    assert!(body["input"].as_array().unwrap().iter().all(|i| i["role"] != "developer"), "{body}");
    assert_eq!(a.record.mode_changed_to, None);
    write_request_body("mode-change-new-chain", &body);
}

#[test]
fn follow_up_sends_changed_files_only() {
    let mut s = Session::new();
    let files = |b: &str| {
        json!([
            artifact("Billing/Managers/InvoiceManager.cs", "class A { }\n"),
            artifact("web/src/invoice.ts", b)
        ])
    };
    let t1 = user_turn(
        json!({"TurnId": "turn-1", "Instruction": "Review these.", "InputArtifacts": files("export {};\n")}),
    );
    let a = s.user(&t1, &[], t0());
    s.final_answer(&a, t0(), "Reviewed.");
    let t2 = user_turn(
        json!({"TurnId": "turn-2", "Instruction": "And now?", "InputArtifacts": files("export const x = 1;\n")}),
    );
    let a = s.user(&t2, &[], t0() + TimeDelta::minutes(5));
    golden("follow-up-files", &a);
    let sent: Vec<_> = a.record.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(sent, ["web/src/invoice.ts"]);
    assert_eq!(a.record.files_unchanged[0].path, "Billing/Managers/InvoiceManager.cs");
    // Sending the same versions again sends no file at all.
    s.final_answer(&a, t0() + TimeDelta::minutes(5), "Better.");
    let again = s.user(&t2, &[], t0() + TimeDelta::minutes(6));
    assert!(again.record.files.is_empty());
    assert_eq!(texts(&again.body.to_value()["input"][0]).len(), 1);
}

/// Issue 19, point 3: local edits win. A retrieved chunk of a file the turn sends whole is left
/// out of `[CONTEXT]` and recorded as superseded; so is one of a file an earlier turn sent and
/// the chain still holds. Other chunks are sent as before.
#[test]
fn chunks_of_files_the_model_has_whole_are_superseded() {
    let mut s = Session::new();
    let manager = "Billing/Managers/InvoiceManager.cs";
    let t1 = user_turn(json!({"TurnId": "turn-1", "Instruction": "Fix the mail.",
        "InputArtifacts": [artifact(manager, "class InvoiceManager { /* edited */ }\n")]}));
    let a = s.user(&t1, &invoice_chunks(), t0());
    let context = a.body.as_str().to_owned();
    assert!(!context.contains("SendInvoiceEmail"), "the stale indexed version is not sent");
    assert!(context.contains("/* edited */") && context.contains("InvoiceController"));
    let superseded: Vec<_> = a.record.chunks_superseded.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(superseded, ["ctx_1"]);
    let sent: Vec<_> = a.record.chunks.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(sent, ["ctx_2"]);
    s.final_answer(&a, t0(), "Fixed.");
    // The next turn does not send the file again, but the chain holds it.
    let t2 = user_turn(json!({"TurnId": "turn-2", "Instruction": "And the controller?"}));
    let b = s.user(&t2, &invoice_chunks(), t0() + TimeDelta::minutes(1));
    assert!(!b.body.as_str().contains("SendInvoiceEmail"));
    let superseded: Vec<_> = b.record.chunks_superseded.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(superseded, ["ctx_1"]);
}

fn awaiting_tools() -> Session {
    let mut s = Session::new();
    let a = s.user(&first_turn_request(), &invoice_chunks(), t0());
    s.answer(&a, t0(), AnswerOutcome::ToolCalls { calls: calls() });
    s
}

fn results() -> ToolContinuation {
    continuation(json!({"TurnId": "turn-1", "ToolResults": [
        {"ToolCallId": "call_1", "ExecutionMs": 4, "ResultJson": "{\"contents\":\"class InvoiceManager { }\"}"},
        {"ToolCallId": "call_2", "ExecutionMs": 900, "ErrorMessage": "cargo: command not found"}
    ]}))
}

/// Follow-ups that steer the turn follow its tool results, each a user message in the turn's
/// mode, in the order given; the record names them.
#[test]
fn steering_follow_ups_follow_the_tool_results() {
    let s = awaiting_tools();
    let steers = [
        Steer { turn_id: "turn-2".into(), instruction: "Also check the retry path.".into() },
        Steer { turn_id: "turn-3".into(), instruction: "And keep it short.".into() },
    ];
    let a = s.steered(&results(), &calls(), &steers, t0() + TimeDelta::seconds(30));
    golden("tool-continuation-steered", &a);
    let body = a.body.to_value();
    let input = body["input"].as_array().unwrap();
    let kinds: Vec<&str> =
        input.iter().map(|i| i["type"].as_str().or(i["role"].as_str()).unwrap()).collect();
    assert_eq!(kinds, ["function_call_output", "function_call_output", "user", "user"]);
    let text = |i: usize| input[i]["content"][0]["text"].as_str().unwrap().to_owned();
    assert!(text(2).starts_with("[MODE: DDR_CREATION]") && text(2).ends_with("retry path."));
    assert!(text(3).ends_with("And keep it short."), "{}", text(3));
    assert_eq!(a.record.steered_by, ["turn-2", "turn-3"]);
}

#[test]
fn tool_continuation_answers_in_call_order() {
    let s = awaiting_tools();
    let a = s.tools(&results(), &calls(), t0() + TimeDelta::seconds(30));
    golden("tool-continuation", &a);
    let body = a.body.to_value();
    let input = body["input"].as_array().unwrap();
    assert_eq!(input.len(), 2);
    assert_eq!(input[0]["type"], "function_call_output");
    assert_eq!(input[1]["call_id"], "call_2");
    assert!(input[1]["output"]
        .as_str()
        .unwrap()
        .starts_with("ERROR: the tool `run_tests` failed: cargo"));
    assert!(a.record.tool_outputs[1].failed && !a.record.tool_outputs[0].failed);
}

#[test]
fn tool_results_that_do_not_match_are_a_mismatch() {
    let s = awaiting_tools();
    let reversed = continuation(json!({"TurnId": "turn-1", "ToolResults": [
        {"ToolCallId": "call_2", "ExecutionMs": 1, "ResultJson": "{}"},
        {"ToolCallId": "call_1", "ExecutionMs": 1, "ResultJson": "{}"}
    ]}));
    let short = continuation(json!({"TurnId": "turn-1", "ToolResults": [
        {"ToolCallId": "call_1", "ExecutionMs": 1, "ResultJson": "{}"}
    ]}));
    for c in [&reversed, &short] {
        assert!(aptix::assemble::check_tool_results(&calls(), c).is_err());
        let turn = TurnInput::ToolContinuation {
            continuation: c,
            pending: &calls(),
            stream: false,
            steers: &[],
        };
        let input = AssembleInput {
            mcp_tools: &[],
            state: &s.state,
            context: &s.context,
            policy: &s.policy,
            now: t0(),
            turn,
        };
        let err = assemble(input).unwrap_err();
        assert_eq!(err.code(), ErrorCode::ToolResultsMismatch);
        assert_eq!(err.to_api_error().code, ErrorCode::ToolResultsMismatch);
    }
    assert!(aptix::assemble::check_tool_results(&calls(), &results()).is_ok());
}

#[test]
fn abandoned_tool_calls_are_answered_before_the_next_turn() {
    let s = awaiting_tools();
    let turn =
        user_turn(json!({"TurnId": "turn-2", "Instruction": "Never mind; summarise instead."}));
    let a = s.user(&turn, &[], t0() + TimeDelta::minutes(2));
    golden("abandoned-tool-calls", &a);
    let body = a.body.to_value();
    let input = body["input"].as_array().unwrap();
    assert_eq!(input[0]["call_id"], "call_1");
    assert_eq!(input[1]["call_id"], "call_2");
    assert_eq!(input[2]["role"], "user");
}

#[test]
fn images_without_instruction() {
    let s = Session::new();
    let turn = user_turn(json!({"TurnId": "turn-1", "ClipboardImages": [
        {"Id": "img-1", "MimeType": "image/png", "DataBase64": "iVBORw0KGgo="},
        {"Id": "img-2", "MimeType": "image/jpeg", "DataBase64": "/9j/4AAQSkZJRg=="}
    ]}));
    let a = s.user(&turn, &[], t0());
    golden("images", &a);
    let body = a.body.to_value();
    let content = body["input"][1]["content"].as_array().unwrap();
    assert!(content[0]["text"]
        .as_str()
        .unwrap()
        .starts_with("[MODE: DDR_CREATION]\n\n[INSTRUCTION]\n("));
    assert_eq!(
        content[1],
        json!({"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo=", "detail": "auto"})
    );
    assert_eq!(content[2]["image_url"], "data:image/jpeg;base64,/9j/4AAQSkZJRg==");
}

#[test]
fn files_over_the_limit_are_skipped_listed_and_warned() {
    let s = Session::new();
    let big = "x".repeat(110_000);
    let turn = user_turn(
        json!({"TurnId": "turn-1", "Instruction": "Check the data files.", "InputArtifacts": [
            artifact("data/huge.json", &big),
            artifact("src/small.rs", "fn main() {}\n"),
            {"RelativePath": "assets/logo.bin", "FileName": "logo.bin", "Contents": "/wD+AQ==", "Encoding": "base64", "Origin": "user"}
        ]}),
    );
    let a = s.user(&turn, &[], t0());
    golden("files-over-limit", &a);
    let skipped: Vec<_> = a.record.skipped_files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(skipped, ["data/huge.json", "assets/logo.bin"]);
    let codes: Vec<_> = a.record.user_warnings.iter().map(|w| w.code.as_str()).collect();
    assert_eq!(codes, ["files.skipped_too_large", "files.skipped_binary"]);
    assert!(!a.body.as_str().contains(&big[..1000]));
    // The limit is a knob.
    let mut roomy = Session::new();
    roomy.policy.active_file_max_bytes = 200_000;
    assert_eq!(roomy.user(&turn, &[], t0()).record.skipped_files.len(), 1);
}

#[test]
fn expired_chain_starts_a_rehydrated_one() {
    let s = after_first_turn();
    let turn = user_turn(json!({"TurnId": "turn-2", "Instruction": "Pick this up again."}));
    let chunks = vec![invoice_chunks().remove(1)];
    let a = s.user(&turn, &chunks, t0() + TimeDelta::days(31));
    golden("expired-chain", &a);
    assert_eq!(a.record.chain.status, ChainStatus::Rehydrated);
    assert!(a.body.to_value().get("previous_response_id").is_none());
    assert!(a.record.solution_context_sent, "a new chain gets the latched solution context");
    // Within the retention the same turn continues the chain; the retention is a knob.
    assert_eq!(
        s.user(&turn, &chunks, t0() + TimeDelta::days(29)).record.chain.status,
        ChainStatus::Continued
    );
    let mut short = after_first_turn();
    short.policy.retention_days = 1;
    assert_eq!(
        short.user(&turn, &chunks, t0() + TimeDelta::days(2)).record.chain.status,
        ChainStatus::Rehydrated
    );
}

#[test]
fn previous_response_not_found_rehydrates_within_budgets() {
    let mut s = Session::new();
    s.policy.rehydrate_transcript_chars = 220;
    s.policy.rehydrate_chunk_chars = 50;
    s.policy.rehydrate_file_chars = 60;
    let mut now = t0();
    for n in 1..=4 {
        let turn = user_turn(json!({
            "TurnId": format!("turn-{n}"),
            "Instruction": format!("Step {n}: extend the invoice mailer."),
            "InputArtifacts": [artifact(&format!("src/step{n}.rs"), &format!("// step {n}\nfn step{n}() {{}}\n"))]
        }));
        let chunks = vec![chunk(
            &format!("ctx_{n}"),
            "src/mailer.rs",
            (n * 10, n * 10 + 2),
            "rust",
            "fn mail() {}\n// …\n",
        )];
        let a = s.user(&turn, &chunks, now);
        s.final_answer(&a, now, &format!("Done with step {n}. The mailer now handles case {n}."));
        now += TimeDelta::minutes(10);
    }
    let turn = user_turn(json!({"TurnId": "turn-5", "Instruction": "Summarise the steps so far."}));
    let continued = s.user(&turn, &[], now);
    assert_eq!(continued.body.to_value()["previous_response_id"], "resp_004");
    // The provider answers previous_response_not_found: drop the chain and assemble again.
    s.state = s.state.force_new_chain();
    let a = s.user(&turn, &[], now);
    golden("rehydrated-after-not-found", &a);
    assert_eq!(a.record.chain.status, ChainStatus::Rehydrated);
    assert_eq!(
        a.record.chain.reason,
        aptix::assemble::ChainReason::PreviousResponseNotFound {
            previous_response_id: "resp_004".into()
        }
    );
    let r = a.record.rehydration.as_ref().unwrap();
    assert!(r.transcript_turns >= 1 && r.transcript_turns_cut >= 1, "{r:?}");
    assert!(r.chunks_cut >= 1 && !r.files_cut.is_empty(), "{r:?}");
    assert_eq!(a.record.user_warnings[0].code, "session.history_truncated");
    let history = texts(&a.body.to_value()["input"][1]).join("\n");
    assert!(history.contains("older turns are not shown"), "{history}");
    assert!(history.contains("older chunks are not repeated"), "{history}");
    assert!(history.contains("Step 4: extend"), "newest turn kept first: {history}");
    assert!(!history.contains("Step 1: extend"), "oldest turn cut: {history}");
    // The next answer starts the new chain; the one after continues it without resending.
    s.final_answer(&a, now, "Summary.");
    assert!(s.state.chain_reset.is_none());
    let next = s.user(&user_turn(json!({"TurnId": "turn-6", "Instruction": "Thanks."})), &[], now);
    assert_eq!(next.record.chain.status, ChainStatus::Continued);
    assert_eq!(next.body.to_value()["previous_response_id"], "resp_005");
}

#[test]
fn tool_continuation_on_a_lost_chain_replays_the_calls() {
    let mut s = awaiting_tools();
    s.state = s.state.force_new_chain();
    let a = s.tools(&results(), &calls(), t0() + TimeDelta::seconds(30));
    golden("tool-continuation-rehydrated", &a);
    let body = a.body.to_value();
    let kinds: Vec<_> = body["input"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["type"].as_str().or(i["role"].as_str()))
        .collect();
    assert_eq!(
        kinds,
        [
            Some("system"),
            Some("user"),
            Some("user"),
            Some("function_call"),
            Some("function_call"),
            Some("function_call_output"),
            Some("function_call_output")
        ]
    );
    assert!(texts(&a.body.to_value()["input"][2])[0]
        .contains("Create a DDR for the invoice e-mail flow."));
}

#[test]
fn state_round_trips_as_json_and_stays_bounded() {
    let mut s = Session::new();
    s.policy.rehydrate_transcript_chars = 500;
    for n in 0..50 {
        let turn = user_turn(json!({"TurnId": format!("t{n}"), "Instruction": "again"}));
        let chunks = vec![chunk(&format!("c{n}"), "a.rs", (1, 1), "rust", &"y".repeat(5_000))];
        let a = s.user(&turn, &chunks, t0());
        s.final_answer(&a, t0(), &"z".repeat(100));
    }
    let json = serde_json::to_string(&s.state).unwrap();
    let back: SessionState = serde_json::from_str(&json).unwrap();
    assert_eq!(back, s.state);
    assert!(json.len() < 80_000, "state is {} bytes", json.len());
    assert!(s.state.history.transcript.len() <= 5);
    assert_eq!(s.state.history.transcript_cut + s.state.history.transcript.len() as u64, 50);
    // An empty JSON object is a valid (fresh) state: the column can default to '{}'.
    assert_eq!(serde_json::from_str::<SessionState>("{}").unwrap(), SessionState::default());
}
