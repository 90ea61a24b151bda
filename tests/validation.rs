//! Every stateless AGN-034 rule, one case per error code, plus the valid shapes.

// Test helpers fail loudly by design.
#![allow(clippy::unwrap_used)]

use std::collections::HashSet;

use aptix::contracts::{
    ArtifactContents, ErrorCode, Origin, ScopeOperator, ToolOutcome, ValidatedRequest,
};
use aptix::rules::{session_hint, validate_bytes, Limits};
use serde_json::{json, Value};

// Issue 13's rules (bounded work, NUL, clipping, capped errors, names and paths) live in their own
// file so this one stays a table of the original rules.
#[path = "validation_support/hardening.rs"]
mod hardening;

const SID: &str = "5f0c6f7e-8a1b-4c2d-9e3f-0a1b2c3d4e5f";

fn user(extra: Value) -> Value {
    let mut base =
        json!({"SessionId": SID, "TurnId": "t-1", "Instruction": "Explain the invoice flow"});
    merge(&mut base, extra);
    base
}

fn cont(extra: Value) -> Value {
    let mut base = json!({"SessionId": SID, "TurnId": "t-1",
        "ToolResults": [{"ToolCallId": "call_1", "ExecutionMs": 12, "ResultJson": "{\"ok\":true}"}]});
    merge(&mut base, extra);
    base
}

/// Merges `extra` into `base`; a `null` in `extra` removes the property.
fn merge(base: &mut Value, extra: Value) {
    if let (Value::Object(b), Value::Object(e)) = (base, extra) {
        for (k, v) in e {
            if v.is_null() {
                b.remove(&k);
            } else {
                b.insert(k, v);
            }
        }
    }
}

fn errors_of(body: &[u8], limits: &Limits) -> Vec<(ErrorCode, Option<String>)> {
    match validate_bytes(body, limits) {
        Ok(v) => panic!("expected errors, got {v:?}"),
        Err(e) => e.0.into_iter().map(|e| (e.code, e.field)).collect(),
    }
}

fn artifact(extra: Value) -> Value {
    let mut a = json!({"RelativePath": "src/lib.rs", "FileName": "lib.rs", "Contents": "fn main() {}", "Origin": "ide"});
    merge(&mut a, extra);
    a
}

fn image(extra: Value) -> Value {
    let mut a = json!({"Id": "img1", "MimeType": "image/png", "DataBase64": "iVBORw0KGgo="});
    merge(&mut a, extra);
    a
}

/// A user turn with `n` unknown properties (`Junk0`...).
fn many_unknown(n: usize) -> Value {
    let mut body = user(json!({}));
    for i in 0..n {
        body[format!("Junk{i}")] = json!(i);
    }
    body
}

/// (name, body, expected code, expected field)
fn cases() -> Vec<(&'static str, Vec<u8>, ErrorCode, Option<&'static str>)> {
    let b = |v: Value| serde_json::to_vec(&v).unwrap();
    vec![
        ("invalid utf8", vec![b'{', 0xff, b'}'], ErrorCode::RequestInvalidUtf8, None),
        ("truncated json", br#"{"SessionId": "#.to_vec(), ErrorCode::RequestInvalidJson, None),
        (
            "duplicate key",
            format!(
                r#"{{"SessionId":"{SID}","SessionId":"{SID}","TurnId":"a","Instruction":"x"}}"#
            )
            .into_bytes(),
            ErrorCode::RequestInvalidJson,
            Some("SessionId"),
        ),
        ("array body", b"[1,2]".to_vec(), ErrorCode::RequestNotObject, None),
        ("unknown field", b(user(json!({"Foo": 1}))), ErrorCode::RequestUnknownField, Some("Foo")),
        (
            "camelCase field",
            b(user(json!({"sessionId": SID}))),
            ErrorCode::RequestUnknownField,
            Some("sessionId"),
        ),
        (
            "nested unknown field",
            b(user(json!({"InputArtifacts": [artifact(json!({"Size": 3}))]}))),
            ErrorCode::RequestUnknownField,
            Some("InputArtifacts[0].Size"),
        ),
        (
            "Mode",
            b(user(json!({"Mode": "DDR_CREATION"}))),
            ErrorCode::RequestForbiddenField,
            Some("Mode"),
        ),
        (
            "previous_response_id",
            b(user(json!({"previous_response_id": "resp_1"}))),
            ErrorCode::RequestForbiddenField,
            Some("previous_response_id"),
        ),
        (
            "ResponseContinuationId",
            b(user(json!({"ResponseContinuationId": "resp_1"}))),
            ErrorCode::RequestForbiddenField,
            Some("ResponseContinuationId"),
        ),
        (
            "ToolsJson",
            b(user(json!({"ToolsJson": "[]"}))),
            ErrorCode::RequestForbiddenField,
            Some("ToolsJson"),
        ),
        (
            "wrong type",
            b(user(json!({"Stream": "yes"}))),
            ErrorCode::RequestInvalidType,
            Some("Stream"),
        ),
        (
            "negative ExecutionMs",
            b(cont(
                json!({"ToolResults": [{"ToolCallId": "c", "ExecutionMs": -1, "ResultJson": "1"}]}),
            )),
            ErrorCode::RequestInvalidType,
            Some("ToolResults[0].ExecutionMs"),
        ),
        (
            "no SessionId",
            b(user(json!({"SessionId": null}))),
            ErrorCode::SessionIdMissing,
            Some("SessionId"),
        ),
        (
            "empty SessionId",
            b(user(json!({"SessionId": ""}))),
            ErrorCode::SessionIdMissing,
            Some("SessionId"),
        ),
        (
            "bad SessionId",
            b(user(json!({"SessionId": "not-a-uuid"}))),
            ErrorCode::SessionIdInvalid,
            Some("SessionId"),
        ),
        ("no TurnId", b(user(json!({"TurnId": null}))), ErrorCode::TurnIdMissing, Some("TurnId")),
        ("empty TurnId", b(user(json!({"TurnId": ""}))), ErrorCode::TurnIdMissing, Some("TurnId")),
        (
            "TurnId chars",
            b(user(json!({"TurnId": "a b"}))),
            ErrorCode::TurnIdInvalid,
            Some("TurnId"),
        ),
        (
            "TurnId length",
            b(user(json!({"TurnId": "a".repeat(129)}))),
            ErrorCode::TurnIdInvalid,
            Some("TurnId"),
        ),
        (
            "no input",
            b(user(json!({"Instruction": null}))),
            ErrorCode::InstructionMissing,
            Some("Instruction"),
        ),
        (
            "blank input",
            b(user(json!({"Instruction": "  \n", "InputArtifacts": [], "ClipboardImages": []}))),
            ErrorCode::InstructionMissing,
            Some("Instruction"),
        ),
        (
            "continuation with Instruction",
            b(cont(json!({"Instruction": "x"}))),
            ErrorCode::ContinuationFieldForbidden,
            Some("Instruction"),
        ),
        (
            "continuation with Stream",
            b(cont(json!({"Stream": false}))),
            ErrorCode::ContinuationFieldForbidden,
            Some("Stream"),
        ),
        (
            "continuation with artifacts",
            b(cont(json!({"InputArtifacts": [artifact(json!({}))]}))),
            ErrorCode::ContinuationFieldForbidden,
            Some("InputArtifacts"),
        ),
        (
            "continuation with RagScope",
            b(cont(json!({"RagScope": []}))),
            ErrorCode::ContinuationFieldForbidden,
            Some("RagScope"),
        ),
        (
            "continuation with SolutionContextText",
            b(cont(json!({"SolutionContextText": "x"}))),
            ErrorCode::ContinuationFieldForbidden,
            Some("SolutionContextText"),
        ),
        (
            "empty ToolResults",
            b(cont(json!({"ToolResults": []}))),
            ErrorCode::ToolResultsEmpty,
            Some("ToolResults"),
        ),
        (
            "empty ToolApprovals",
            b(cont(json!({"ToolResults": null, "ToolApprovals": []}))),
            ErrorCode::ToolApprovalsEmpty,
            Some("ToolApprovals"),
        ),
        (
            "a decision without Approved",
            b(cont(json!({"ToolResults": null, "ToolApprovals": [{"ToolCallId": "call_1"}]}))),
            ErrorCode::ToolApprovalInvalid,
            Some("ToolApprovals[0].Approved"),
        ),
        (
            "a message on an approval",
            b(cont(json!({"ToolResults": null,
                "ToolApprovals": [{"ToolCallId": "call_1", "Approved": true, "Message": "ok"}]}))),
            ErrorCode::ToolApprovalInvalid,
            Some("ToolApprovals[0].Message"),
        ),
        (
            "a decision without ToolCallId",
            b(cont(json!({"ToolResults": null, "ToolApprovals": [{"Approved": false}]}))),
            ErrorCode::ToolCallIdMissing,
            Some("ToolApprovals[0].ToolCallId"),
        ),
        (
            "two decisions on one call",
            b(cont(json!({"ToolResults": null, "ToolApprovals": [
                {"ToolCallId": "call_1", "Approved": true}, {"ToolCallId": "call_1", "Approved": false}]}))),
            ErrorCode::ToolCallIdDuplicate,
            Some("ToolApprovals[1].ToolCallId"),
        ),
        (
            "decisions and results together",
            b(cont(json!({"ToolApprovals": [{"ToolCallId": "call_1", "Approved": true}]}))),
            ErrorCode::ContinuationFieldForbidden,
            Some("ToolApprovals"),
        ),
        (
            "decisions with an instruction",
            b(cont(json!({"ToolResults": null, "Instruction": "go",
                "ToolApprovals": [{"ToolCallId": "call_1", "Approved": true}]}))),
            ErrorCode::ContinuationFieldForbidden,
            Some("Instruction"),
        ),
        (
            "no ToolCallId",
            b(cont(json!({"ToolResults": [{"ExecutionMs": 1, "ResultJson": "1"}]}))),
            ErrorCode::ToolCallIdMissing,
            Some("ToolResults[0].ToolCallId"),
        ),
        (
            "duplicate ToolCallId",
            b(cont(
                json!({"ToolResults": [{"ToolCallId": "c", "ExecutionMs": 1, "ResultJson": "1"}, {"ToolCallId": "c", "ExecutionMs": 1, "ResultJson": "2"}]}),
            )),
            ErrorCode::ToolCallIdDuplicate,
            Some("ToolResults[1].ToolCallId"),
        ),
        (
            "no ExecutionMs",
            b(cont(json!({"ToolResults": [{"ToolCallId": "c", "ResultJson": "1"}]}))),
            ErrorCode::ExecutionMsMissing,
            Some("ToolResults[0].ExecutionMs"),
        ),
        (
            "both outcomes",
            b(cont(
                json!({"ToolResults": [{"ToolCallId": "c", "ExecutionMs": 1, "ResultJson": "1", "ErrorMessage": "boom"}]}),
            )),
            ErrorCode::ToolResultOutcome,
            Some("ToolResults[0]"),
        ),
        (
            "no outcome",
            b(cont(json!({"ToolResults": [{"ToolCallId": "c", "ExecutionMs": 1}]}))),
            ErrorCode::ToolResultOutcome,
            Some("ToolResults[0]"),
        ),
        (
            "ResultJson not JSON",
            b(cont(
                json!({"ToolResults": [{"ToolCallId": "c", "ExecutionMs": 1, "ResultJson": "{oops"}]}),
            )),
            ErrorCode::ToolResultJsonInvalid,
            Some("ToolResults[0].ResultJson"),
        ),
        (
            "no path",
            b(user(json!({"InputArtifacts": [artifact(json!({"RelativePath": null}))]}))),
            ErrorCode::PathMissing,
            Some("InputArtifacts[0].RelativePath"),
        ),
        (
            "absolute path",
            b(user(json!({"InputArtifacts": [artifact(json!({"RelativePath": "/etc/passwd"}))]}))),
            ErrorCode::PathAbsolute,
            Some("InputArtifacts[0].RelativePath"),
        ),
        (
            "backslash path",
            b(user(
                json!({"InputArtifacts": [artifact(json!({"RelativePath": "\\\\server\\share"}))]}),
            )),
            ErrorCode::PathAbsolute,
            Some("InputArtifacts[0].RelativePath"),
        ),
        (
            "drive letter",
            b(user(
                json!({"InputArtifacts": [artifact(json!({"RelativePath": "C:\\src\\a.cs"}))]}),
            )),
            ErrorCode::PathDriveLetter,
            Some("InputArtifacts[0].RelativePath"),
        ),
        (
            "relative drive",
            b(user(json!({"InputArtifacts": [artifact(json!({"RelativePath": "c:a.cs"}))]}))),
            ErrorCode::PathDriveLetter,
            Some("InputArtifacts[0].RelativePath"),
        ),
        (
            "dotdot",
            b(user(
                json!({"InputArtifacts": [artifact(json!({"RelativePath": "src/../../etc"}))]}),
            )),
            ErrorCode::PathTraversal,
            Some("InputArtifacts[0].RelativePath"),
        ),
        (
            "windows dotdot",
            b(user(json!({"InputArtifacts": [artifact(json!({"RelativePath": "src\\..\\x"}))]}))),
            ErrorCode::PathTraversal,
            Some("InputArtifacts[0].RelativePath"),
        ),
        (
            "nul",
            b(user(json!({"InputArtifacts": [artifact(json!({"RelativePath": "a\u{0}b"}))]}))),
            ErrorCode::PathNul,
            Some("InputArtifacts[0].RelativePath"),
        ),
        (
            "duplicate path",
            b(user(json!({"InputArtifacts": [artifact(json!({})), artifact(json!({}))]}))),
            ErrorCode::PathDuplicate,
            Some("InputArtifacts[1].RelativePath"),
        ),
        (
            "no file name",
            b(user(json!({"InputArtifacts": [artifact(json!({"FileName": null}))]}))),
            ErrorCode::FileNameMissing,
            Some("InputArtifacts[0].FileName"),
        ),
        (
            "no contents",
            b(user(json!({"InputArtifacts": [artifact(json!({"Contents": null}))]}))),
            ErrorCode::ContentsMissing,
            Some("InputArtifacts[0].Contents"),
        ),
        (
            "bad origin",
            b(user(json!({"InputArtifacts": [artifact(json!({"Origin": "IDE"}))]}))),
            ErrorCode::OriginInvalid,
            Some("InputArtifacts[0].Origin"),
        ),
        (
            "no origin",
            b(user(json!({"InputArtifacts": [artifact(json!({"Origin": null}))]}))),
            ErrorCode::OriginInvalid,
            Some("InputArtifacts[0].Origin"),
        ),
        (
            "bad encoding",
            b(user(json!({"InputArtifacts": [artifact(json!({"Encoding": "utf16"}))]}))),
            ErrorCode::EncodingInvalid,
            Some("InputArtifacts[0].Encoding"),
        ),
        (
            "bad base64 contents",
            b(user(
                json!({"InputArtifacts": [artifact(json!({"Encoding": "base64", "Contents": "@@@"}))]}),
            )),
            ErrorCode::ContentsBase64Invalid,
            Some("InputArtifacts[0].Contents"),
        ),
        (
            "no image id",
            b(user(json!({"ClipboardImages": [image(json!({"Id": null}))]}))),
            ErrorCode::ImageIdMissing,
            Some("ClipboardImages[0].Id"),
        ),
        (
            "duplicate image id",
            b(user(json!({"ClipboardImages": [image(json!({})), image(json!({}))]}))),
            ErrorCode::ImageIdDuplicate,
            Some("ClipboardImages[1].Id"),
        ),
        (
            "non-image mime",
            b(user(json!({"ClipboardImages": [image(json!({"MimeType": "application/pdf"}))]}))),
            ErrorCode::ImageMimeInvalid,
            Some("ClipboardImages[0].MimeType"),
        ),
        (
            "bare image/ mime",
            b(user(json!({"ClipboardImages": [image(json!({"MimeType": "image/"}))]}))),
            ErrorCode::ImageMimeInvalid,
            Some("ClipboardImages[0].MimeType"),
        ),
        (
            "bad image base64",
            b(user(json!({"ClipboardImages": [image(json!({"DataBase64": "not base64!"}))]}))),
            ErrorCode::ImageBase64Invalid,
            Some("ClipboardImages[0].DataBase64"),
        ),
        (
            "empty image",
            b(user(json!({"ClipboardImages": [image(json!({"DataBase64": ""}))]}))),
            ErrorCode::ImageBase64Invalid,
            Some("ClipboardImages[0].DataBase64"),
        ),
        (
            "scope no key",
            b(user(json!({"RagScope": [{"Operator": "==", "Values": ["a"]}]}))),
            ErrorCode::RagScopeKeyMissing,
            Some("RagScope[0].Key"),
        ),
        (
            "scope bad operator",
            b(user(json!({"RagScope": [{"Key": "path", "Operator": "=", "Values": ["a"]}]}))),
            ErrorCode::RagScopeOperatorInvalid,
            Some("RagScope[0].Operator"),
        ),
        (
            "scope operator case",
            b(user(
                json!({"RagScope": [{"Key": "path", "Operator": "Contains", "Values": ["a"]}]}),
            )),
            ErrorCode::RagScopeOperatorInvalid,
            Some("RagScope[0].Operator"),
        ),
        (
            "scope no values",
            b(user(json!({"RagScope": [{"Key": "path", "Operator": "contains", "Values": []}]}))),
            ErrorCode::RagScopeValuesEmpty,
            Some("RagScope[0].Values"),
        ),
        (
            "scope empty value",
            b(user(json!({"RagScope": [{"Key": "path", "Operator": "contains", "Values": [""]}]}))),
            ErrorCode::RagScopeValuesEmpty,
            Some("RagScope[0].Values"),
        ),
        (
            "NUL in Instruction",
            b(user(json!({"Instruction": "a\u{0}b"}))),
            ErrorCode::RequestNulCharacter,
            Some("Instruction"),
        ),
        (
            "bidi override in path",
            b(user(
                json!({"InputArtifacts": [artifact(json!({"RelativePath": "src/\u{202e}sr.exe"}))]}),
            )),
            ErrorCode::PathFormatCharacter,
            Some("InputArtifacts[0].RelativePath"),
        ),
        (
            "zero-width space in file name",
            b(user(json!({"InputArtifacts": [artifact(json!({"FileName": "lib\u{200b}.rs"}))]}))),
            ErrorCode::PathFormatCharacter,
            Some("InputArtifacts[0].FileName"),
        ),
        (
            "full-width dots",
            b(user(
                json!({"InputArtifacts": [artifact(json!({"RelativePath": "\u{ff0e}\u{ff0e}/x"}))]}),
            )),
            ErrorCode::PathTraversal,
            Some("InputArtifacts[0].RelativePath"),
        ),
        ("too many errors", b(user(many_unknown(25))), ErrorCode::RequestTooManyErrors, None),
        (
            "bad context id",
            b(user(json!({"ConversationContextId": "has space"}))),
            ErrorCode::ContextIdInvalid,
            Some("ConversationContextId"),
        ),
        (
            "empty agent context id",
            b(user(json!({"AgentContextId": ""}))),
            ErrorCode::ContextIdInvalid,
            Some("AgentContextId"),
        ),
        (
            "unknown follow-up policy",
            b(user(json!({"FollowUp": "steer-later"}))),
            ErrorCode::FollowUpInvalid,
            Some("FollowUp"),
        ),
        (
            "a steer with more than an instruction",
            b(user(json!({"FollowUp": "steer", "SolutionContextText": "the whole design"}))),
            ErrorCode::FollowUpInvalid,
            Some("FollowUp"),
        ),
    ]
}

#[test]
fn every_rule_gives_its_specific_error() {
    for (name, body, code, field) in cases() {
        let errors = errors_of(&body, &Limits::default());
        assert!(
            errors.iter().any(|(c, f)| *c == code && f.as_deref() == field),
            "{name}: expected {code} at {field:?}, got {errors:?}"
        );
    }
}

#[test]
fn every_stateless_code_is_exercised() {
    let exercised: HashSet<ErrorCode> = cases()
        .into_iter()
        .map(|(_, _, code, _)| code)
        .chain(limit_cases().into_iter().map(|_| ErrorCode::LimitExceeded))
        .collect();
    // `reply_to` is an AMQP property, not part of the body: tests/instance_replies.rs.
    let elsewhere = [ErrorCode::RequestTooLarge, ErrorCode::RequestReplyToInvalid];
    let exercised = exercised.into_iter().chain(elsewhere).collect::<HashSet<_>>();
    for code in ErrorCode::ALL {
        // `limit.` codes: tests/tenancy.rs.
        let stateful = [
            "context.",
            "turn.",
            "session.",
            "tool_results.",
            "tool_approvals.",
            "tools.",
            "llm.",
            "internal.",
            "limit.",
        ];
        if stateful.iter().any(|p| code.as_str().starts_with(p)) {
            continue;
        }
        assert!(exercised.contains(code), "no test case for {code}");
    }
}

fn limit_cases() -> Vec<(Limits, Value, &'static str, &'static str)> {
    let tight = Limits {
        max_instruction_chars: 5,
        max_solution_context_chars: 3,
        max_hint_chars: 4,
        max_artifacts: 1,
        max_artifact_bytes: 4,
        max_images: 1,
        max_image_bytes: 2,
        max_tool_results: 1,
        max_tool_result_bytes: 2,
        max_rag_scope_conditions: 1,
        max_rag_scope_values: 2,
        max_rag_scope_value_chars: 3,
        max_path_chars: 6,
        max_name_chars: 5,
        ..Limits::default()
    };
    let long = "abcdef";
    let scope = json!({"Key": "path", "Operator": "==", "Values": ["a"]});
    vec![
        (
            tight.clone(),
            user(json!({"Instruction": "123456"})),
            "Instruction",
            "max_instruction_chars",
        ),
        (
            tight.clone(),
            user(json!({"SolutionContextText": "abcd"})),
            "SolutionContextText",
            "max_solution_context_chars",
        ),
        (tight.clone(), user(json!({"Repo": "abcde"})), "Repo", "max_hint_chars"),
        (
            tight.clone(),
            user(
                json!({"InputArtifacts": [artifact(json!({"Contents": "a"})), artifact(json!({"RelativePath": "b", "Contents": "b"}))]}),
            ),
            "InputArtifacts",
            "max_artifacts",
        ),
        (
            tight.clone(),
            user(json!({"InputArtifacts": [artifact(json!({"Contents": "abcde"}))]})),
            "InputArtifacts[0].Contents",
            "max_artifact_bytes",
        ),
        (
            tight.clone(),
            user(
                json!({"ClipboardImages": [image(json!({"DataBase64": "YQ=="})), image(json!({"Id": "2", "DataBase64": "YQ=="}))]}),
            ),
            "ClipboardImages",
            "max_images",
        ),
        (
            tight.clone(),
            user(json!({"ClipboardImages": [image(json!({"DataBase64": "YWJj"}))]})),
            "ClipboardImages[0].DataBase64",
            "max_image_bytes",
        ),
        (
            tight.clone(),
            cont(
                json!({"ToolResults": [{"ToolCallId": "a", "ExecutionMs": 1, "ResultJson": "1"}, {"ToolCallId": "b", "ExecutionMs": 1, "ResultJson": "1"}]}),
            ),
            "ToolResults",
            "max_tool_results",
        ),
        (
            tight.clone(),
            cont(
                json!({"ToolResults": [{"ToolCallId": "a", "ExecutionMs": 1, "ErrorMessage": "boom"}]}),
            ),
            "ToolResults[0].ErrorMessage",
            "max_tool_result_bytes",
        ),
        (
            tight.clone(),
            user(json!({"RagScope": [scope.clone(), scope]})),
            "RagScope",
            "max_rag_scope_conditions",
        ),
        (
            tight.clone(),
            user(
                json!({"RagScope": [{"Key": "path", "Operator": "==", "Values": ["a", "b", "c"]}]}),
            ),
            "RagScope[0].Values",
            "max_rag_scope_values",
        ),
        (
            tight.clone(),
            user(json!({"RagScope": [{"Key": "path", "Operator": "==", "Values": ["a", "abcd"]}]})),
            "RagScope[0].Values[1]",
            "max_rag_scope_value_chars",
        ),
        (
            tight.clone(),
            user(json!({"RagScope": [{"Key": long, "Operator": "==", "Values": ["a"]}]})),
            "RagScope[0].Key",
            "max_name_chars",
        ),
        (
            tight.clone(),
            user(json!({"InputArtifacts": [artifact(json!({"RelativePath": "src/a.rs"}))]})),
            "InputArtifacts[0].RelativePath",
            "max_path_chars",
        ),
        // Within the limit as sent, over it once NFKC-normalised (U+FDFA is 18 characters).
        (
            tight.clone(),
            user(json!({"InputArtifacts": [artifact(json!({"RelativePath": "a/\u{FDFA}"}))]})),
            "InputArtifacts[0].RelativePath",
            "max_path_chars",
        ),
        (
            tight.clone(),
            user(
                json!({"InputArtifacts": [artifact(json!({"RelativePath": "a", "FileName": "\u{FDFA}"}))]}),
            ),
            "InputArtifacts[0].FileName",
            "max_name_chars",
        ),
        (
            tight.clone(),
            user(
                json!({"InputArtifacts": [artifact(json!({"RelativePath": "a", "FileName": long}))]}),
            ),
            "InputArtifacts[0].FileName",
            "max_name_chars",
        ),
        (
            tight.clone(),
            user(
                json!({"InputArtifacts": [artifact(json!({"RelativePath": "a", "FileName": "a", "MimeType": long}))]}),
            ),
            "InputArtifacts[0].MimeType",
            "max_name_chars",
        ),
        (
            tight.clone(),
            user(
                json!({"InputArtifacts": [artifact(json!({"RelativePath": "a", "FileName": "a", "Language": long}))]}),
            ),
            "InputArtifacts[0].Language",
            "max_name_chars",
        ),
        (
            tight.clone(),
            user(json!({"ClipboardImages": [image(json!({"Id": long, "DataBase64": "YQ=="}))]})),
            "ClipboardImages[0].Id",
            "max_name_chars",
        ),
        (
            tight.clone(),
            user(
                json!({"ClipboardImages": [image(json!({"MimeType": "image/pngxx", "DataBase64": "YQ=="}))]}),
            ),
            "ClipboardImages[0].MimeType",
            "max_name_chars",
        ),
        (
            tight,
            cont(
                json!({"ToolResults": [{"ToolCallId": long, "ExecutionMs": 1, "ResultJson": "1"}]}),
            ),
            "ToolResults[0].ToolCallId",
            "max_name_chars",
        ),
    ]
}

#[test]
fn limits_are_enforced_and_named() {
    for (limits, body, field, key) in limit_cases() {
        let result = validate_bytes(&serde_json::to_vec(&body).unwrap(), &limits);
        let errors = result.expect_err(field).0;
        let hit = errors
            .iter()
            .find(|e| e.code == ErrorCode::LimitExceeded && e.field.as_deref() == Some(field));
        let hit = hit.unwrap_or_else(|| panic!("{field}: {errors:?}"));
        assert!(hit.message.contains(key), "{field}: message does not name {key}: {}", hit.message);
    }
    let small = Limits { max_request_bytes: 10, ..Limits::default() };
    let errors =
        validate_bytes(&serde_json::to_vec(&user(json!({}))).unwrap(), &small).unwrap_err().0;
    assert_eq!(errors[0].code, ErrorCode::RequestTooLarge);
    assert!(errors[0].message.contains("max_request_bytes"));
}

#[test]
fn all_problems_are_reported_at_once() {
    let body = user(
        json!({"TurnId": "bad id", "InputArtifacts": [artifact(json!({"RelativePath": "/abs", "Origin": "x"}))]}),
    );
    let codes: Vec<ErrorCode> = errors_of(&serde_json::to_vec(&body).unwrap(), &Limits::default())
        .into_iter()
        .map(|e| e.0)
        .collect();
    for code in [ErrorCode::TurnIdInvalid, ErrorCode::PathAbsolute, ErrorCode::OriginInvalid] {
        assert!(codes.contains(&code), "{code} missing from {codes:?}");
    }
}

#[test]
fn valid_user_turn_is_typed() {
    let body = user(json!({
        "InputArtifacts": [artifact(json!({})), artifact(json!({"RelativePath": "docs/a.bin", "Encoding": "base64", "Contents": "AP8=", "Origin": "user"}))],
        "ClipboardImages": [image(json!({"MimeType": "IMAGE/PNG"}))],
        "RagScope": [{"Key": "path", "Operator": "does_not_contain", "Values": ["tests/"]}],
        "Stream": true, "Repo": "acme/billing", "ConversationContextId": "default"
    }));
    let v = validate_bytes(&serde_json::to_vec(&body).unwrap(), &Limits::default()).unwrap();
    let ValidatedRequest::UserTurn(t) = &v else { panic!("not a user turn") };
    assert_eq!(t.key().turn_id.as_str(), "t-1");
    assert_eq!(t.instruction(), Some("Explain the invoice flow"));
    assert_eq!(t.artifacts()[0].contents(), &ArtifactContents::Text("fn main() {}".into()));
    assert_eq!(t.artifacts()[1].contents(), &ArtifactContents::Binary(vec![0x00, 0xff]));
    assert_eq!(t.artifacts()[1].origin(), Origin::User);
    assert_eq!(t.images()[0].mime_type(), "image/png");
    assert_eq!(t.images()[0].data_url(), "data:image/png;base64,iVBORw0KGgo=");
    assert_eq!(t.rag_scope()[0].operator(), ScopeOperator::DoesNotContain);
    assert!(t.stream());
    assert_eq!(t.conversation_context_id().map(|c| c.as_str()), Some("default"));
}

#[test]
fn files_only_turn_is_valid() {
    let body = user(json!({"Instruction": null, "InputArtifacts": [artifact(json!({}))]}));
    assert!(validate_bytes(&serde_json::to_vec(&body).unwrap(), &Limits::default()).is_ok());
}

#[test]
fn valid_continuation_is_typed_and_round_trips() {
    let body = cont(json!({"ToolResults": [
        {"ToolCallId": "call_1", "ExecutionMs": 5, "ResultJson": "[1,2]"},
        {"ToolCallId": "call_2", "ExecutionMs": 9, "ErrorMessage": "file not found"}]}));
    let v = validate_bytes(&serde_json::to_vec(&body).unwrap(), &Limits::default()).unwrap();
    let ValidatedRequest::ToolContinuation(c) = &v else { panic!("not a continuation") };
    assert_eq!(c.results().len(), 2);
    assert_eq!(c.results()[1].outcome, ToolOutcome::ErrorMessage("file not found".into()));
    let wire = serde_json::to_value(&v).unwrap();
    assert_eq!(wire, body);
    let back: ValidatedRequest = serde_json::from_value(wire).unwrap();
    assert_eq!(back, v);
}

#[test]
fn inner_messages_are_trusted_and_stored_requests_are_checked_again() {
    // Inner queue messages are written only by Aptix: decoding one runs no rule.
    let bad = json!({"SessionId": SID, "TurnId": "t", "InputArtifacts": [artifact(json!({"RelativePath": "../x"}))]});
    assert!(serde_json::from_value::<ValidatedRequest>(bad.clone()).is_ok());
    // A shape no validated request has is still refused.
    let shapeless = json!({"SessionId": SID, "TurnId": "t", "RagScope": [{"Key": "k", "Operator": "~", "Values": ["v"]}]});
    assert!(serde_json::from_value::<ValidatedRequest>(shapeless).is_err());
    // Requests read back from PostgreSQL go through the rules again.
    let err = aptix::rules::from_stored(&bad).unwrap_err().to_string();
    assert!(err.contains("validation.path_traversal"), "{err}");
    // What the pipeline writes reads back unchanged, images included.
    let good = user(
        json!({"ClipboardImages": [{"Id": "i1", "MimeType": "image/png", "DataBase64": "iVBORw0KGgo="}]}),
    );
    let v = validate_bytes(&serde_json::to_vec(&good).unwrap(), &Limits::default()).unwrap();
    let back: ValidatedRequest = serde_json::from_value(serde_json::to_value(&v).unwrap()).unwrap();
    assert_eq!(back, v, "trusted decoding gives the validated value");
}

#[test]
fn fingerprint_ignores_spelling_but_not_content() {
    let a =
        validate_bytes(&serde_json::to_vec(&user(json!({}))).unwrap(), &Limits::default()).unwrap();
    let reordered = format!(
        r#"{{"Instruction":"Explain the invoice flow","TurnId":"t-1","SessionId":"{SID}"}}"#
    );
    let b = validate_bytes(reordered.as_bytes(), &Limits::default()).unwrap();
    let c = validate_bytes(
        &serde_json::to_vec(&user(json!({"Instruction": "other"}))).unwrap(),
        &Limits::default(),
    )
    .unwrap();
    assert_eq!(a.fingerprint(), b.fingerprint());
    assert_ne!(a.fingerprint(), c.fingerprint());
}

#[test]
fn session_hint_reads_invalid_requests() {
    let body = serde_json::to_vec(&user(json!({"Mode": "X"}))).unwrap();
    assert_eq!(session_hint(&body).map(|s| s.to_string()).as_deref(), Some(SID));
    assert!(session_hint(b"{\"SessionId\": 42}").is_none());
    assert!(session_hint(b"garbage").is_none());
}

#[test]
fn forbidden_fields_do_not_hide_other_problems() {
    let body = user(json!({"Mode": "X", "TurnId": "bad id"}));
    let codes: Vec<ErrorCode> = errors_of(&serde_json::to_vec(&body).unwrap(), &Limits::default())
        .into_iter()
        .map(|e| e.0)
        .collect();
    assert_eq!(codes, [ErrorCode::RequestForbiddenField, ErrorCode::TurnIdInvalid]);
}
