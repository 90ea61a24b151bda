//! Input messages in the live Responses API shape (DESIGN.md §5.1, §5.5): the system message
//! of a chain's first call, and the user message whose content parts come in a fixed order:
//! `[MODE]`/`[INSTRUCTION]`, the `[CONTEXT]` block, active files, skipped-file note, solution
//! context, then images as `input_image` data URLs.

use serde_json::{json, Value};

use super::block::{render_section, ChunkView, CONTEXT_HEADER};
use super::files::{render_files, skipped_note, ACTIVE_FILES_HEADER};
use super::record::SkippedFile;
use super::state::StoredFile;
use crate::chunk::Chunk;
use crate::contracts::ClipboardImage;

/// Header of the solution-context part.
const SOLUTION_CONTEXT_HEADER: &str = "[SOLUTION CONTEXT]";

/// Stands in for a missing instruction, so the first block keeps its shape when a turn carries
/// only files or images (AGN-034 §4.1 allows that).
const NO_INSTRUCTION: &str = "(No instruction was given. Work from the files and images below.)";

/// What goes into one user message.
#[derive(Debug, Default)]
pub(crate) struct UserContent<'a> {
    /// The conversation context's mode.
    pub mode: &'a str,
    /// The turn's instruction.
    pub instruction: Option<&'a str>,
    /// Retrieved chunks to send (already filtered against the chain).
    pub chunks: &'a [&'a Chunk],
    /// Active files to send.
    pub files: &'a [StoredFile],
    /// Files supplied but not sent.
    pub skipped: &'a [SkippedFile],
    /// The latched solution context, when it is to be sent.
    pub solution_context: Option<&'a str>,
    /// Clipboard images.
    pub images: &'a [ClipboardImage],
}

/// An `input_text` content part.
pub(crate) fn text_part(text: impl Into<String>) -> Value {
    json!({ "type": "input_text", "text": text.into() })
}

/// The system message carrying the boot prompt: first call of a chain only, in `input` (the
/// chain carries it; `instructions` would not be carried and is not used).
pub(crate) fn system_message(prompt: &str) -> Value {
    json!({ "role": "system", "content": [text_part(prompt)] })
}

/// The developer message that switches a continued chain to another mode: the new
/// ConversationContext's boot prompt, which the chain follows from this call on.
pub(crate) fn mode_change_message(mode: &str, prompt: &str) -> Value {
    let text = format!("[MODE CHANGE: {mode}]\nFrom this message on, follow these instructions instead of the earlier system instructions:\n\n{prompt}");
    json!({ "role": "developer", "content": [text_part(text)] })
}

/// A user message from text parts.
pub(crate) fn user_message_of(parts: Vec<Value>) -> Value {
    json!({ "role": "user", "content": parts })
}

/// AGN-003's first block: `[MODE: <mode>]\n\n[INSTRUCTION]\n<instruction>`.
pub(crate) fn instruction_block(mode: &str, instruction: Option<&str>) -> String {
    format!("[MODE: {mode}]\n\n[INSTRUCTION]\n{}", instruction.unwrap_or(NO_INSTRUCTION))
}

/// The solution-context part's text.
pub(crate) fn solution_context_text(text: &str) -> String {
    format!("{SOLUTION_CONTEXT_HEADER}\n{text}")
}

/// The user message of a turn.
pub(crate) fn user_message(c: &UserContent<'_>) -> Value {
    let mut parts = vec![text_part(instruction_block(c.mode, c.instruction))];
    let context =
        render_section(CONTEXT_HEADER, None, c.chunks.iter().map(|c| ChunkView::from(*c)), 1);
    // Files continue the chunk numbering, so "Chunk N" names one thing within the message.
    let files = render_files(ACTIVE_FILES_HEADER, None, c.files, c.chunks.len() + 1);
    for text in [context, files] {
        if !text.is_empty() {
            parts.push(text_part(text));
        }
    }
    if let Some(note) = skipped_note(c.skipped) {
        parts.push(text_part(note));
    }
    if let Some(solution) = c.solution_context {
        parts.push(text_part(solution_context_text(solution)));
    }
    for image in c.images {
        parts.push(
            json!({ "type": "input_image", "image_url": image.data_url(), "detail": "auto" }),
        );
    }
    user_message_of(parts)
}
