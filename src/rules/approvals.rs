//! The rules of a Tool Approval Submission's `ToolApprovals`: at least one decision, as many as
//! tool results may be, unique call ids, `Approved` given, and a `Message` only on a denial and
//! within its length. Whether the decisions answer the calls awaiting approval is decided
//! against the stored turn (`store::resume`).

use std::collections::HashSet;

use super::errors::Errors;
use super::Limits;
use crate::contracts::approval::{ToolApprovalWire, MAX_DENIAL_MESSAGE_CHARS};
use crate::contracts::ids::clip;
use crate::contracts::{ErrorCode, ToolApproval};

pub(super) fn approvals(
    e: &mut Errors,
    wires: Vec<ToolApprovalWire>,
    limits: &Limits,
) -> Option<Vec<ToolApproval>> {
    if wires.is_empty() {
        e.at(ErrorCode::ToolApprovalsEmpty, "ToolApprovals", "ToolApprovals is present but empty");
        return None;
    }
    e.limit("ToolApprovals", "decisions", wires.len(), "max_tool_results", limits.max_tool_results);
    let mut seen = HashSet::new();
    let all: Vec<Option<ToolApproval>> =
        wires.into_iter().enumerate().map(|(i, a)| approval(e, i, a, &mut seen, limits)).collect();
    all.into_iter().collect()
}

fn approval(
    e: &mut Errors,
    i: usize,
    a: ToolApprovalWire,
    seen: &mut HashSet<String>,
    limits: &Limits,
) -> Option<ToolApproval> {
    let f = |name: &str| format!("ToolApprovals[{i}].{name}");
    let id = call_id(e, &f("ToolCallId"), a.tool_call_id, seen, limits);
    let Some(approved) = a.approved else {
        e.at(ErrorCode::ToolApprovalInvalid, f("Approved"), "Approved (true or false) is required");
        return None;
    };
    if let Some(message) = &a.message {
        if approved {
            let why = "Message is only for a denial (Approved = false); remove it";
            e.at(ErrorCode::ToolApprovalInvalid, f("Message"), why);
            return None;
        }
        let field = f("Message");
        if e.chars_limit(&field, message, "max_denial_message_chars", MAX_DENIAL_MESSAGE_CHARS) {
            return None;
        }
    }
    Some(ToolApproval { tool_call_id: id?, approved, message: a.message })
}

/// A `ToolCallId` at `field` (of a result or a decision): present, within `max_name_chars`, not
/// seen before in the same submission.
pub(super) fn call_id(
    e: &mut Errors,
    field: &str,
    raw: Option<String>,
    seen: &mut HashSet<String>,
    limits: &Limits,
) -> Option<String> {
    match raw.filter(|s| !s.is_empty()) {
        None => {
            e.at(ErrorCode::ToolCallIdMissing, field, "ToolCallId is required");
            None
        }
        Some(id) if e.chars_limit(field, &id, "max_name_chars", limits.max_name_chars) => None,
        Some(id) if !seen.insert(id.clone()) => {
            let message = format!("ToolCallId `{}` appears more than once", clip(&id));
            e.at(ErrorCode::ToolCallIdDuplicate, field, message);
            None
        }
        Some(id) => Some(id),
    }
}
