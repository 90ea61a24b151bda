//! Rules about text itself. No string PostgreSQL must store may hold NUL (U+0000): jsonb and
//! text cannot, and such a request used to fail only at the database, after admission, with no
//! reply. Names shown to the model (`FileName`; `RelativePath` in [`crate::contracts::ids`]) hold
//! no control or invisible format character and are NFKC-normalised, so they cannot disguise
//! themselves.

use unicode_normalization::UnicodeNormalization as _;

use super::errors::Errors;
use super::Limits;
use crate::contracts::ids::{clip, disguising_character};
use crate::contracts::request::AgentExecuteRequest;
use crate::contracts::ErrorCode;

/// Records `request.nul_character` for every string field that holds a NUL. Fields with a
/// grammar of their own that already refuses NUL are left to it: the ids (`SessionId`, `TurnId`,
/// the context ids), `RelativePath` (`validation.path_nul`), the enumerations (`Origin`,
/// `Encoding`, `Operator`) and base64 (`DataBase64`, `Contents` with `Encoding: base64`, whose
/// decoded bytes are text only when they hold no NUL).
pub(super) fn nul_characters(w: &AgentExecuteRequest, e: &mut Errors) {
    let top = [
        ("Instruction", &w.instruction),
        ("SolutionContextText", &w.solution_context_text),
        ("WorkspaceId", &w.workspace_id),
        ("Repo", &w.repo),
        ("Language", &w.language),
    ];
    for (field, value) in top {
        nul(e, || field.to_owned(), value.as_deref());
    }
    for (i, a) in w.input_artifacts.iter().flatten().enumerate() {
        let f = |name: &'static str| move || format!("InputArtifacts[{i}].{name}");
        nul(e, f("FileName"), a.file_name.as_deref());
        if a.encoding.as_deref() != Some("base64") {
            nul(e, f("Contents"), a.contents.as_deref());
        }
        nul(e, f("MimeType"), a.mime_type.as_deref());
        nul(e, f("Language"), a.language.as_deref());
    }
    for (i, img) in w.clipboard_images.iter().flatten().enumerate() {
        nul(e, || format!("ClipboardImages[{i}].Id"), img.id.as_deref());
        nul(e, || format!("ClipboardImages[{i}].MimeType"), img.mime_type.as_deref());
    }
    for (i, c) in w.rag_scope.iter().flatten().enumerate() {
        nul(e, || format!("RagScope[{i}].Key"), c.key.as_deref());
        for (j, v) in c.values.iter().flatten().enumerate() {
            nul(e, || format!("RagScope[{i}].Values[{j}]"), Some(v));
        }
    }
    for (i, r) in w.tool_results.iter().flatten().enumerate() {
        let f = |name: &'static str| move || format!("ToolResults[{i}].{name}");
        nul(e, f("ToolCallId"), r.tool_call_id.as_deref());
        nul(e, f("ResultJson"), r.result_json.as_deref());
        nul(e, f("ErrorMessage"), r.error_message.as_deref());
    }
    for (i, a) in w.tool_approvals.iter().flatten().enumerate() {
        let f = |name: &'static str| move || format!("ToolApprovals[{i}].{name}");
        nul(e, f("ToolCallId"), a.tool_call_id.as_deref());
        nul(e, f("Message"), a.message.as_deref());
    }
}

fn nul(e: &mut Errors, field: impl FnOnce() -> String, value: Option<&str>) {
    if value.is_some_and(|v| v.contains('\0')) {
        let field = field();
        let hint = if field.ends_with(".Contents") {
            "; send a binary file with `Encoding: base64`"
        } else {
            ""
        };
        let message = format!(
            "{field} contains a NUL character (U+0000), which cannot be stored as text{hint}"
        );
        e.at(ErrorCode::RequestNulCharacter, field, message);
    }
}

/// An artifact's `FileName`: within `limits.max_name_chars`, no control or format character,
/// NFKC-normalised. `None` (with the error recorded) when refused; a NUL was already reported.
pub(super) fn file_name(
    e: &mut Errors,
    field: &str,
    raw: String,
    limits: &Limits,
) -> Option<String> {
    let too_long = e.chars_limit(field, &raw, "max_name_chars", limits.max_name_chars);
    let disguised = disguising_character(&raw);
    if let Some(c) = disguised {
        e.at(
            ErrorCode::PathFormatCharacter,
            field,
            format!(
                "FileName `{}` contains U+{:04X}, a control or invisible format character (a bidi \
                 control, a zero-width character, ...) that can disguise a name",
                clip(&raw),
                u32::from(c)
            ),
        );
    }
    if too_long || disguised.is_some() || raw.contains('\0') {
        return None;
    }
    // NFKC may lengthen a name (U+FDFA is 18 characters): the limit holds for what is kept.
    let name: String = raw.nfkc().collect();
    (!e.chars_limit(field, &name, "max_name_chars", limits.max_name_chars)).then_some(name)
}
